/* server.h - `cairn serve`: the Ollama, OpenAI and Anthropic HTTP APIs over one loaded model.
 *
 * libmicrohttpd accepts connections, one thread each; a handler reads the body, validates it into
 * a job (request.h), queues it (worker.h) and returns; the job streams its frames through a
 * channel that the connection's thread drains (server.c). The one engine worker runs jobs in
 * arrival order. A client that disconnects cancels its job (queued: dropped unrun; running: at the
 * next forward, or after its prefill when the server is otherwise idle, see worker.h).
 * The server never exits the process and keeps no global state; cn_server_close stops accepting,
 * finishes or cancels every job, and joins every thread.
 */
#ifndef CN_SERVER_H
#define CN_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/engine.h"
#include "text/text.h"

/* What /api/tags, /api/show, /api/ps and /v1/models say about the served model. */
typedef struct cn_model_card {
    const char *name;        /* served name */
    const char *family;      /* config model_type, "nemotron_h" */
    uint64_t size_bytes;     /* checkpoint bytes */
    uint64_t params;         /* parameter count */
    const char *quantization;/* "BF16", "F32", "NVFP4", ... */
    int64_t modified;        /* unix seconds of the checkpoint */
    int ctx;                 /* the served context, tokens */
    int max_ctx;             /* the model's max_position_embeddings */
} cn_model_card;

typedef struct cn_server_opts {
    const char *host;          /* bind address, "127.0.0.1" by default */
    int port;                  /* 0: any free port (cn_server_port says which) */
    const char *api_key;       /* NULL: no auth; else every API request needs Bearer KEY (or
                                * x-api-key: KEY) */
    const char *const *aliases; /* [n_aliases] glob patterns of other model names served by the
                                 * loaded model (request.h); not copied, must outlive the server */
    int n_aliases;
    size_t max_body;           /* request bodies above this get 413 (0: 32 MiB) */
    int max_queue;             /* waiting requests before 503 (0: 64) */
    double finish_cancelled_s; /* see worker.h (4); negative: default 120 */
    double keepalive_s;        /* idle seconds before a connection sends keep-alive bytes (0: 5) */
    double header_timeout_s;   /* a connection must complete a request's headers within this many
                                * seconds of being ready for it, or it is closed (0: 30) */
    const char *test_canned_output; /* TESTS ONLY: every response's text is this string, a few
                                     * bytes per generated token, instead of the decoded tokens:
                                     * how tests get tool calls out of a random model */
    const char *test_canned_after_tool; /* TESTS ONLY: the same for a chat whose last message is a
                                         * tool result (CAIRN_TEST_CANNED_AFTER_TOOL), so a tool
                                         * round trip ends in a final text; NULL: as above */
} cn_server_opts;

typedef struct cn_server cn_server; /* layout: server.c */

/* Starts listening and the worker. engine and text must outlive the server. Returns 0, or a
 * CN_E code with err naming the problem (address in use, bad host). */
int cn_server_open(cn_server **out, const cn_server_opts *o, cn_engine *e, const cn_text *t,
                   const cn_model_card *card, cn_err *err);
/* The bound port. */
int cn_server_port(const cn_server *s);
void cn_server_close(cn_server *s);

#endif
