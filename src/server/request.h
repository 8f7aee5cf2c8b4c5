/* request.h - the request side of each HTTP dialect: a JSON body in, a ready job or a refusal out.
 *
 * Every builder validates the whole body before it returns a job, so a refused request has
 * changed nothing: no job, no engine call, no cache entry. A refusal carries the HTTP status and
 * a message that names the field (and for a prompt past the context, both numbers and the code
 * "context_length_exceeded"). One exception: cn_responses_request answers a streaming request
 * whose prompt is past the context itself, since Codex reads that only as a response.failed
 * event; it returns 0 with a job already DONE, its channel holding the whole answer, which the
 * route streams without queueing. Builders run on connection threads, any number at once; they
 * read env and never write it.
 */
#ifndef CN_REQUEST_H
#define CN_REQUEST_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/job.h"
#include "text/text.h"

typedef struct cn_api_env {
    const char *model_name; /* served name */
    const char *const *aliases; /* [n_aliases] glob patterns ('*' matches any run) of other names
                                 * the served model answers to, e.g. "claude-*" */
    int n_aliases;
    const cn_text *text;
    int ctx;                /* the engine's context, tokens */
    const char *canned;     /* TESTS ONLY: see cn_server_opts.test_canned_output */
    const char *canned_after_tool; /* TESTS ONLY: see cn_server_opts.test_canned_after_tool */
} cn_api_env;

typedef struct cn_refusal {
    int status;          /* 400, 404, 500, ... */
    const char *type;    /* OpenAI error type: "invalid_request_error", ... */
    const char *param;   /* OpenAI param naming the field, or NULL */
    const char *code;    /* OpenAI code ("model_not_found", ...) or NULL */
    char msg[512];
} cn_refusal;

/* Each returns 0 with *out a QUEUED job (caller owns one reference), or a negative code with r
 * filled and *out NULL. */
int cn_ollama_chat_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                           cn_refusal *r);
int cn_ollama_generate_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                               cn_refusal *r);
int cn_openai_chat_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                           cn_refusal *r);
int cn_openai_completions_request(const cn_api_env *env, const char *body, size_t len,
                                  cn_job **out, cn_refusal *r);
int cn_responses_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                         cn_refusal *r);
int cn_anthropic_messages_request(const cn_api_env *env, const char *body, size_t len,
                                  cn_job **out, cn_refusal *r);
/* /v1/messages/count_tokens: the same body (max_tokens not needed) rendered and tokenized, no job;
 * *n_tokens: the prompt's length, even past the context. Returns 0 or a refusal as above. */
int cn_anthropic_count_tokens(const cn_api_env *env, const char *body, size_t len, int *n_tokens,
                              cn_refusal *r);

/* ---- shared by the builders (request.c) ---- */

/* Fills r and returns CN_EINVAL (status 400 unless given). */
int cn_refuse(cn_refusal *r, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Parses body as a JSON object; refuses invalid UTF-8 and invalid JSON. Caller deletes *root. */
int cn_req_parse_json(const char *body, size_t len, cJSON **root, cn_refusal *r);
/* Whether name is served: 1 as the served name ("NAME" or "NAME:latest"), 2 through an alias,
 * 0 not at all. */
int cn_req_model_served(const cn_api_env *env, const char *name);
/* Checks the "model" member against the served name and the aliases; 400 when absent or not a
 * string, 404 (naming what is served) when another model. */
int cn_req_check_model(const cn_api_env *env, const cJSON *root, cn_refusal *r);
/* Tokenizes prompt text into j->prompt, checks it fits (400 naming both numbers, code
 * "context_length_exceeded"), and clamps j->max_tokens (negative: as many as fit) to the room left
 * (then j->room_bound = 1). */
int cn_req_set_prompt(const cn_api_env *env, cn_job *j, const char *text, size_t n,
                      cn_refusal *r);
/* A chat parser's or renderer's error as a refusal: 500 without memory, else 400 with its message. */
int cn_req_chat_error(int rc, const cn_err *err, cn_refusal *r);
/* Renders a parsed chat into the job's prompt (then as cn_req_set_prompt); turns the parser on
 * with the chat's thinking mode and a copy of its tools. A chat ending in a tool result gets
 * env->canned_after_tool as its canned text when that is set (tests only). */
struct cn_chat;
int cn_req_render_chat(const cn_api_env *env, cn_job *j, const struct cn_chat *chat,
                       cn_refusal *r);
/* Constrains the job's output to JSON (schema NULL: any object) or to one call of the job's tools
 * (only NULL: any of them). Call after the prompt is set: with thinking on, the constraint starts
 * once thinking ends. A schema cairn cannot hold to is refused (400) naming param and the keyword. */
int cn_req_json_constraint(const cn_api_env *env, cn_job *j, const cJSON *schema,
                           const char *param, cn_refusal *r);
int cn_req_tool_constraint(const cn_api_env *env, cn_job *j, const char *only, cn_refusal *r);
/* Reads a number member: absent/null leaves *v; a non-number or outside [lo, hi] refuses. */
int cn_req_number(const cJSON *o, const char *key, double lo, double hi, double *v,
                  cn_refusal *r);
/* Reads a boolean member: absent/null leaves *v; anything but true/false refuses. */
int cn_req_bool(const cJSON *o, const char *key, int *v, cn_refusal *r);
/* Adds stop strings from a string or an array of strings (at most max); refuses other types. */
int cn_req_stops(cn_job *j, const cJSON *stop, const char *param, int max, cn_refusal *r);
/* A fresh job with model name, id (prefix + random hex) and a random seed. Call after
 * cn_req_check_model: a request that named the model through an alias gets that name in its
 * responses (j->model), as the client asked; otherwise the served name. NULL: out of memory. */
cn_job *cn_req_new_job(const cn_api_env *env, const cJSON *root, cn_api api, const char *id_prefix);

#endif
