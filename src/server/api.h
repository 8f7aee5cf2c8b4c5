/* api.h - the response side of each HTTP dialect: the frames a job writes into its channel.
 *
 * One table per dialect (Ollama chat, Ollama generate, OpenAI chat, OpenAI completions, OpenAI
 * responses, Anthropic messages). The job calls progress/text/tool_call only for streaming
 * requests and final for every request: a non-streaming request gets its whole body from final,
 * built from the text the job accumulated, so both forms carry the same text. Each member returns
 * 0 or the channel's error (CN_ECANCELED
 * when the client left), never blocks, and never reads the engine.
 */
#ifndef CN_API_H
#define CN_API_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/job.h"

typedef struct cn_api_ops {
    const char *stream_type; /* Content-Type of a streaming response */
    const char *idle;        /* bytes a connection may send when nothing went out for a while:
                              * harmless to every client of the dialect */
    /* prefill progress: SSE comment or an empty NDJSON chunk carrying "prefill" */
    int (*progress)(cn_job *j, int done, int total);
    /* a piece of answer (thinking = 0) or reasoning (thinking = 1) text */
    int (*text)(cn_job *j, int thinking, const char *s, size_t n);
    /* one complete tool call, index = its position in the response */
    int (*tool_call)(cn_job *j, int index);
    /* the last frames (stream) or the whole body; rc is the engine's code (0: ok) */
    int (*final)(cn_job *j, int rc);
} cn_api_ops;

const cn_api_ops *cn_api_ops_for(cn_api api);

extern const cn_api_ops cn_ollama_chat_ops, cn_ollama_generate_ops;
extern const cn_api_ops cn_openai_chat_ops, cn_openai_completions_ops;
extern const cn_api_ops cn_anthropic_ops;
extern const cn_api_ops cn_responses_ops;

/* Responses API streams (responses_out.c). open_stream writes response.created and
 * response.in_progress (once); fail_stream answers a refused streaming request without the
 * engine: the opening events, response.failed with error {code, message}, the channel closed and
 * the job DONE. Both return 0 or the channel's code. */
int cn_responses_open_stream(cn_job *j);
int cn_responses_fail_stream(cn_job *j, const char *code, const char *msg);

/* Helpers shared by the dialects. */
/* Writes cJSON o compactly followed by suffix ("\n" for NDJSON, "\n\n" for SSE) after prefix
 * ("data: " for SSE, "" otherwise); deletes o. Returns 0, CN_ENOMEM or the channel's code. */
int cn_api_send(cn_job *j, const char *prefix, cJSON *o, const char *suffix);
/* An SSE event with its name: `event: NAME\ndata: {o}\n\n` (as cn_api_send; deletes o). */
int cn_api_send_event(cn_job *j, const char *name, cJSON *o);
/* "stop", "length" (or "tool_calls" when asked and the job made calls). */
const char *cn_api_finish_reason(const cn_job *j, int openai);
/* An ISO 8601 UTC time with nanoseconds, as Ollama's created_at. buf: at least 40 bytes. */
void cn_api_rfc3339_now(char *buf, size_t n);

#endif
