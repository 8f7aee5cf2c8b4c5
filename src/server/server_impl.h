/* server_impl.h - cn_server's layout, shared by server.c (HTTP plumbing) and routes.c (what each
 * path does). Nothing else includes it. */
#ifndef CN_SERVER_IMPL_H
#define CN_SERVER_IMPL_H

#include <microhttpd.h>

#include "server/peers.h"
#include "server/request.h"
#include "server/server.h"
#include "server/worker.h"

struct cn_server {
    cn_server_opts o;
    cn_model_card card;
    cn_api_env env;
    cn_worker worker;
    cn_peers peers; /* open connections and their header deadlines */
    struct MHD_Daemon *d;
    int port;
};

/* An answer a route gives: a job to stream, or a status with a JSON body. */
typedef struct cn_route_answer {
    int status;       /* HTTP status when job is NULL */
    cJSON *body;      /* owned; NULL with job */
    cn_job *job;      /* owned reference; queued already */
    int retry_after;  /* seconds, for 503 */
} cn_route_answer;

/* Decides what method + url + body get. Never blocks on the engine. */
void cn_route(cn_server *s, const char *method, const char *url, const char *body, size_t len,
              cn_route_answer *a);
/* The error body in the dialect of url: Anthropic's {type: "error", error: {type, message}}
 * under /v1/messages, OpenAI's shape elsewhere under /v1/, Ollama's elsewhere. */
cJSON *cn_route_error(const char *url, int status, const char *msg, const char *param,
                      const char *code);

#endif
