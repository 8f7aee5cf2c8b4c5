/* chat.h - a chat request (OpenAI or Ollama shape), parsed and validated into plain structs.
 *
 * cn_chat_parse reads the JSON a client sends to /v1/chat/completions or /api/chat and keeps what
 * a chat renderer needs: the messages, the tools and the options that change the prompt. It
 * promises:
 *   (1) Every message has a known role and a content string (never NULL). Content given as an
 *       array of text parts is joined with "\n", as vLLM joins it; null or absent content is ""
 *       on an assistant turn and an error on the others.
 *   (2) Assistant reasoning comes from the first of reasoning_content, reasoning (vLLM) and
 *       thinking (Ollama) that is present and not null.
 *   (3) Tool-call arguments are a JSON object (given as one, or a JSON string that parses to
 *       one), or, when the string is not JSON, the raw string (renderers decide; vLLM renders
 *       such calls as {}). Arguments that are JSON but not an object are an error.
 *   (4) tools is the array as the client sent it (each entry an object with a string name,
 *       under "function" or at the top), numbers keeping their literals (see pyjson.h).
 *   (5) /think and /no_think written in a system or user turn are cairn's extension: the last one
 *       (message order, then text order) sets opts.think_toggle and every one is removed from
 *       the text, together with the whitespace run before it (or after it, at the very start).
 *       A toggle is the word alone, with whitespace or the text's ends on both sides.
 *   (6) Bad input gives CN_EFORMAT (not JSON, not UTF-8) or CN_EINVAL (wrong shape or type), with
 *       a message naming the field, e.g. "messages[2].role: unknown role \"developer\"".
 * It never renders, never looks at a model and ignores fields it does not know (model, stream,
 * options, temperature...).
 */
#ifndef CN_CHAT_H
#define CN_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "base/error.h"

typedef enum cn_chat_role {
    CN_CHAT_SYSTEM,
    CN_CHAT_USER,
    CN_CHAT_ASSISTANT,
    CN_CHAT_TOOL,
} cn_chat_role;

typedef struct cn_chat_tool_call {
    char *id;            /* OpenAI call id, NULL if absent */
    char *name;          /* function name */
    cJSON *arguments;    /* JSON object, or NULL when absent, null or arguments_raw is set */
    char *arguments_raw; /* the arguments string when it is not valid JSON, else NULL */
} cn_chat_tool_call;

typedef struct cn_chat_message {
    cn_chat_role role;
    char *content;                 /* UTF-8, never NULL */
    size_t *part_at;               /* [n_part_at] where in content each text part after the
                                    * first begins (content given as parts); NULL if none */
    int n_part_at;
    char *reasoning;               /* assistant reasoning, NULL if none given */
    cn_chat_tool_call *tool_calls; /* assistant calls, n_tool_calls of them */
    int n_tool_calls;
    char *tool_call_id; /* tool messages: OpenAI tool_call_id, NULL if absent */
    char *name;         /* OpenAI name, or Ollama tool_name; NULL if absent */
} cn_chat_message;

/* Tri-state options: -1 means the request did not say. */
typedef struct cn_chat_opts {
    int enable_thinking;           /* chat_template_kwargs.enable_thinking */
    int truncate_history_thinking; /* chat_template_kwargs.truncate_history_thinking */
    int add_generation_prompt;     /* top-level, default 1 (never -1) */
    int think;                     /* Ollama think (true/false, or a level string = 1) */
    int think_toggle;              /* last /think (1) or /no_think (0) found in the text */
} cn_chat_opts;

typedef struct cn_chat {
    cn_chat_message *messages; /* n_messages >= 1 */
    int n_messages;
    cJSON *tools; /* array of objects as given; NULL when absent or null */
    cn_chat_opts opts;
} cn_chat;

/* Parses json[0..len) into *out (zeroed first; the caller frees it with cn_chat_free whatever the
 * result). Returns 0, CN_EFORMAT, CN_EINVAL or CN_ENOMEM; see (6). */
int cn_chat_parse(cn_chat *out, const char *json, size_t len, cn_err *err);
void cn_chat_free(cn_chat *chat);

/* Whether the prompt should open a thinking block, given the template's default when nothing
 * says: the text toggle, else enable_thinking, else Ollama's think, else dflt. */
int cn_chat_thinking(const cn_chat *chat, int dflt);

#endif
