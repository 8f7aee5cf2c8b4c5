/* job.h - one HTTP request's generation: what to run, its state, and the bytes it streams back.
 *
 * A handler builds a job (cn_job_new), fills its spec, and enqueues it; the engine worker runs it
 * (worker.h); the connection drains its channel. Neither side frees it: the last cn_job_unref does.
 *
 *     QUEUED --[worker picks it, client still there]--> PREFILL   [cn_engine_generate]
 *     QUEUED --[worker picks it, client gone]---------> CANCELED  (never runs)
 *     PREFILL --[prompt absorbed]--> DECODE            (on_token: first token)
 *     PREFILL/DECODE --[engine returns]--> DONE        (final frame written, channel closed)
 *     PREFILL/DECODE --[cancel poll true]--> CANCELED  (cache closed by the engine)
 *
 * Guarantees, by state:
 *   QUEUED    the spec is complete and immutable; nothing has touched the engine.
 *   PREFILL   progress frames may be written; no text yet.
 *   DECODE    every generated token has gone through detok -> stop strings -> parser -> frames.
 *   DONE      the channel holds the final frame (or an error frame) and is closed.
 *   CANCELED  the channel is closed; whatever the prefill absorbed stays in the prefix cache.
 *
 * Text flows one way: token ids -> bytes (the tokenizer's streaming decoder) -> stop-string
 * matcher (holds back a possible partial stop) -> reasoning/tool-call parser (chat endpoints) ->
 * events -> the API's frames. Every piece of text is accumulated too, so a non-streaming response
 * is the same text the streaming one sends, by construction.
 */
#ifndef CN_JOB_H
#define CN_JOB_H

#include <pthread.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "server/chan.h"
#include "text/constraint.h"
#include "text/stopseq.h"
#include "text/text.h"
#include "text/parser.h"
#include "text/reply.h"

typedef enum cn_api {
    CN_API_OLLAMA_CHAT,
    CN_API_OLLAMA_GENERATE,
    CN_API_OPENAI_CHAT,
    CN_API_OPENAI_COMPLETIONS,
    CN_API_RESPONSES,
    CN_API_ANTHROPIC, /* /v1/messages */
} cn_api;

/* Restore points a chat request marks: the last few turn starts and part starts, where the next
 * request of a conversation differs (a client that edits its last user message, or moves a
 * reminder out of it into the new one). */
#define CN_JOB_MARKS 8

typedef enum cn_job_state {
    CN_JOB_QUEUED,
    CN_JOB_PREFILL,
    CN_JOB_DECODE,
    CN_JOB_DONE,
    CN_JOB_CANCELED,
} cn_job_state;

typedef struct cn_tool_call_out {
    char *id;        /* "call_..." ("toolu_..." for Anthropic) */
    char *name;
    char *arguments; /* compact JSON object text */
} cn_tool_call_out;

/* One item of a Responses API output, in output order (responses_out.c). */
typedef struct cn_out_item {
    char kind;         /* 'r' reasoning, 'm' message, 'f' function call */
    int open;          /* stream: more text may join it */
    size_t start, end; /* 'r', 'm': its text is [start, end) of the accumulated thinking or content */
    int call;          /* 'f': index into calls */
} cn_out_item;

typedef struct cn_job {
    /* spec: written by the handler before enqueue, read-only afterwards */
    cn_api api;
    int stream;        /* 1: frames as text arrives; 0: one JSON body at the end */
    int include_usage; /* OpenAI stream_options.include_usage */
    char *model;       /* served name, echoed in every frame */
    char id[48];       /* "chatcmpl-…" / "cmpl-…" / "msg_…" */
    int64_t created;   /* unix seconds at arrival */
    double t_arrival;  /* monotonic ms at arrival, for total_duration */
    int32_t *prompt;   /* [n_prompt] token ids */
    int n_prompt;
    int marks[CN_JOB_MARKS]; /* where the prompt's last turns begin (chat requests): restore
                              * points, so the next turn of the conversation resumes there */
    int n_marks;
    int max_tokens;
    int room_bound; /* max_tokens was cut to the room the context leaves (cn_req_set_prompt) */
    int ignore_eos; /* OpenAI extension (vLLM): generate max_tokens whatever the model says */
    int no_speculate; /* Ollama options.speculate = false: decode plainly (same output) */
    cn_sampler_params sampling;
    cn_stopseq stops;
    int parse;      /* 1: run the reasoning/tool-call parser (chat endpoints) */
    int thinking;   /* parse: the prompt opened <think> */
    cJSON *tools;   /* parse: OpenAI tools array, owned; NULL if none */
    cn_constraint *constraint; /* (optional) owned: JSON output or a forced tool call; its state is
                                * the worker's while the job runs */
    const cn_text *text; /* tokenizer for decoding; not owned, outlives every job */
    const char *canned;  /* TESTS ONLY (CAIRN_TEST_CANNED_OUTPUT): text that replaces the decoded
                          * output, a few bytes per generated token; not owned */
    cJSON *echo;    /* Responses API: the request's fields its response object repeats, owned */

    /* shared between the worker and the connection, under mu */
    pthread_mutex_t mu;
    int refs;
    cn_job_state state;
    double gone_at; /* monotonic ms the client left, 0 while connected */
    cn_chan chan;   /* response bytes; has its own lock */

    /* worker-private while running */
    cn_reply reply;  /* detok -> stop strings -> parser (reply.h) */
    int reply_ready;
    char *content, *thinking_text; /* accumulated text, NUL-terminated */
    size_t content_len, content_cap, thinking_len, thinking_cap;
    cn_tool_call_out *calls;
    int n_calls;
    size_t canned_pos; /* bytes of canned already handed out */
    int sent_role;   /* stream: the opening frame went out (OpenAI chat: the role delta;
                      * Responses: response.created; Anthropic: message_start) */
    int seq;         /* Responses stream: the next event's sequence_number */
    cn_out_item *items; /* Responses: the output items so far */
    int n_items;
    int n_generated;     /* tokens generated so far */
    int thinking_tokens; /* tokens generated up to the last piece of reasoning text */
    int n_blocks;    /* Anthropic stream: content blocks started */
    int open_block;  /* Anthropic stream: the open block (0 none, 1 thinking, 2 text) */
    int stopped;     /* a stop string matched, or the canned text ran out */
    int failed;      /* out of memory or a write error while building frames */
    cn_result res;
} cn_job;

/* A job with refs = 1, state QUEUED, an open channel and zeroed spec. Returns NULL without memory. */
cn_job *cn_job_new(void);
void cn_job_ref(cn_job *j);
/* Drops a reference; the last one frees the job and everything it owns. */
void cn_job_unref(cn_job *j);

cn_job_state cn_job_get_state(cn_job *j);
void cn_job_set_state(cn_job *j, cn_job_state s);
/* The connection calls this when its client went away (or the response was torn down). */
void cn_job_abandon(cn_job *j);
/* Monotonic ms the client left, or 0. */
double cn_job_gone_at(cn_job *j);

/* Runs the job on e in lane `lane` (that lane's worker thread only). cancel/ctx are the worker's
 * policy, polled between forwards. Writes every frame, closes the channel and sets the final
 * state; returns the engine's code. */
int cn_job_run(cn_job *j, cn_engine *e, int lane, cn_cancel_fn cancel, void *cancel_ctx);

/* Accumulated text and calls, for the API's final frame. */
const char *cn_job_content(const cn_job *j);
const char *cn_job_thinking(const cn_job *j);

double cn_now_ms(void);

#endif
