/* parser.h - streaming split of generated text into thinking, content and tool calls.
 *
 * The server feeds the text of each generated token as it arrives; the parser calls back with
 * THINKING and CONTENT pieces as soon as they are certain, and with one TOOL_CALL event per
 * complete call. Family "nemotron3" is Nemotron 3 Nano: optional `<think>…</think>` reasoning, then
 * content and Qwen3-coder XML calls, exactly as the chat template writes them:
 *     <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>
 *
 * It promises:
 *   (1) Chunking never changes the result: after joining adjacent text events of one kind, any cut
 *       of the same bytes into feeds gives the same events (tests/text/test_parser.c cuts real-
 *       looking outputs at every byte).
 *   (2) Streaming stays live: it holds back only a proper prefix of a tag (10 bytes at most), the
 *       whitespace run directly before it or at the end (a trim rule may still drop it), an
 *       incomplete UTF-8 character, and the body of an open tool call (announced whole). Ordinary
 *       text is never buffered.
 *   (3) Nothing generated is lost: a partial tag that turns out to be text is emitted with the
 *       whitespace before it; a malformed or unterminated tool call comes back verbatim as content.
 *   (4) Text events are non-empty, NUL-terminated, valid UTF-8, and never split a character.
 * It never validates calls against the tools list (an unknown function is still returned: the
 * server decides), never rewrites content, never allocates per ordinary text byte, and never exits.
 *
 * Rules, in the order the stream meets them:
 *   - thinking on (the generation prompt opened `<think>`): leading whitespace and one leading
 *     `<think>` are dropped (the template writes `<think>\n`); thinking ends at `</think>` (dropped)
 *     or at `<tool_call>` (which starts a call); it is trimmed of trailing whitespace; with no end
 *     the whole output is thinking. A `<think>` later on is thinking text.
 *   - thinking off: everything is content; `<think>` and `</think>` are ordinary text.
 *   - content: leading whitespace is trimmed (after `</think>`, at the start, after each call).
 *     Whitespace directly before `<tool_call>` and after a call's `</tool_call>` is formatting and
 *     dropped, so whitespace-only content between calls vanishes and text after the last call is
 *     content. Trailing whitespace at the end of the stream is kept.
 *   - a call is `<tool_call>` … the first `</tool_call>`. Its body must be, whitespace aside,
 *     `<function=NAME>` (<parameter=K>VALUE</parameter>)* `</function>`. A value ends at the first
 *     `</parameter>` followed (after whitespace) by `<parameter=` or `</function>`, so XML-like text
 *     inside values survives; one leading and one trailing newline of a value are stripped. Anything
 *     else (no `</function>`, text outside a parameter, empty name) is malformed: the call, the
 *     whitespace before it and its tags are emitted as content, byte for byte. A call still open at
 *     cn_parser_finish() is content too.
 *   - values are typed by the tool's JSON schema (toolcall.h lists the rules); without a schema
 *     a value that is valid JSON is that JSON, else a string.
 *   - whitespace is ASCII whitespace (space, \t, \n, \v, \f, \r).
 *
 * States (transitions happen inside cn_parser_feed/finish once the deciding bytes have arrived):
 *
 *     init(thinking=1)                                          init(thinking=0)
 *          |                                                          |
 *          v                                                          v
 *     THINK_START --[not ws, not <think>]--> THINK --[</think>]--> CONTENT <-------------+
 *       |     ^                                |                      |                   |
 *       +-----+ [<think> once: dropped]        |                 [<tool_call>]     [</tool_call>]
 *                                              |                      v                   |
 *                                              +----[<tool_call>]--> CALL ----------------+
 *     CALL at </tool_call>: well formed -> TOOL_CALL event, CONTENT at start (whitespace dropped);
 *                           malformed -> its raw bytes as content, CONTENT not at start
 *     THINK_START, THINK, CONTENT, CALL --[cn_parser_finish]--> DONE (held bytes flushed by the
 *                                                               rules; an open CALL is content)
 *     any --[callback error, or out of memory building a call]--> FAILED (sticky)
 */
#ifndef CN_TEXT_PARSER_H
#define CN_TEXT_PARSER_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/error.h"

typedef enum cn_parse_event_kind {
    CN_EV_THINKING, /* a piece of reasoning text */
    CN_EV_CONTENT,  /* a piece of answer text */
    CN_EV_TOOL_CALL /* one complete, well-formed call */
} cn_parse_event_kind;

typedef struct cn_parse_event {
    cn_parse_event_kind kind;
    const char *text;           /* THINKING, CONTENT: UTF-8, NUL-terminated; NULL for calls */
    size_t len;                 /* bytes in text (text may hold U+0000; len is the truth) */
    const char *name;           /* TOOL_CALL: function name as generated */
    const cJSON *arguments;     /* TOOL_CALL: JSON object of typed arguments */
    const char *arguments_json; /* TOOL_CALL: the same object as compact JSON text */
} cn_parse_event;

/* Called once per event. Everything the event points to is owned by the parser and valid only
 * during the call (cJSON_Duplicate / strdup to keep it). It must not call back into the same
 * parser. Returns 0 to go on; a negative CN_E code stops the parser, which returns that code. */
typedef int (*cn_parse_event_fn)(const cn_parse_event *ev, void *ctx);

enum cn_parser_state {
    CN_PS_THINK_START, /* thinking, nothing but whitespace (and maybe `<think>`) seen yet */
    CN_PS_THINK,       /* collecting thinking */
    CN_PS_CONTENT,     /* collecting content; at_start says leading whitespace is still dropped */
    CN_PS_CALL,        /* inside <tool_call>, buffering the body */
    CN_PS_DONE,        /* cn_parser_finish has run */
    CN_PS_FAILED,      /* a callback or an allocation failed; every call returns fail_code */
};

/* Caller-allocated; fill with cn_parser_init, release with cn_parser_free. */
typedef struct cn_parser {
    /* read-only */
    cn_err err; /* why the last feed/finish failed, naming the problem */

    /* private */
    enum cn_parser_state state;
    int thinking;       /* the generation prompt opened <think> */
    int think_tag_seen; /* the one droppable leading <think> has been dropped */
    int at_start;       /* CONTENT: no content emitted since the start, </think> or a call */
    int fail_code;      /* FAILED: the code every later call returns */
    const cJSON *tools; /* OpenAI tools array or NULL; not owned */
    char *buf;          /* unconsumed bytes are buf[pos, len); cap > len always (room for NUL) */
    size_t pos, len, cap;
    size_t u8_tail;  /* bytes of an incomplete UTF-8 character at the end of buf */
    size_t call_ws;  /* CALL: whitespace bytes before `<tool_call>` at buf[pos] */
    size_t scan;     /* CALL: offset from pos where the search for `</tool_call>` resumes */
    uint64_t fed;    /* bytes accepted so far, for error offsets */
} cn_parser;

/* Prepares p for one generation. family: "nemotron3". thinking: the prompt ended in an open
 * `<think>` (enable_thinking). tools: an OpenAI tools array (elements {"type":"function",
 * "function":{...}} or bare {"name":...,"parameters":...}) or NULL; it is read, not copied, and
 * must outlive p. Returns 0, or CN_EINVAL (unknown family, tools not an array of named functions;
 * err names which) with p safe to cn_parser_free. Never calls back. */
int cn_parser_init(cn_parser *p, const char *family, int thinking, const cJSON *tools,
                   cn_err *err);

/* Feeds len bytes (any cut: mid-tag, mid-character). Calls cb for every event that became
 * certain. Returns 0; CN_EFORMAT for invalid UTF-8 or CN_ENOMEM growing the buffer, in which case
 * the chunk is rejected, nothing was called back and p is unchanged (p->err names the byte
 * offset); the callback's code or CN_ENOMEM while building a call (p is then FAILED); CN_EINVAL
 * after cn_parser_finish. */
int cn_parser_feed(cn_parser *p, const char *text, size_t len, cn_parse_event_fn cb, void *ctx);

/* Ends the stream: held-back partial tags and whitespace are flushed by the rules above, an open
 * call becomes content. Returns 0; CN_EFORMAT if the input stopped inside a UTF-8 character
 * (nothing called back, p unchanged, so the caller may still feed the rest); the callback's code;
 * CN_EINVAL if called twice. */
int cn_parser_finish(cn_parser *p, cn_parse_event_fn cb, void *ctx);

/* Releases the buffer. Safe on a zeroed, failed or finished parser; p may be re-initialized. */
void cn_parser_free(cn_parser *p);

#endif
