/* routes.c - what each path does: the read-only endpoints answer at once, the generating ones
 * build a job and queue it. See server_impl.h. */
#include <stdio.h>
#include <string.h>

#include "server/info.h"
#include "server/server_impl.h"

/* Anthropic's error types by status. */
static const char *anthropic_type(int status) {
    switch (status) {
    case 400: case 405: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
    }
}

cJSON *cn_route_error(const char *url, int status, const char *msg, const char *param,
                      const char *code) {
    cJSON *o = cJSON_CreateObject();
    if (!strncmp(url, "/v1/messages", 12) && (!url[12] || url[12] == '/')) {
        cJSON_AddStringToObject(o, "type", "error");
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "type", anthropic_type(status));
        cJSON_AddStringToObject(e, "message", msg);
        return o;
    }
    if (strncmp(url, "/v1/", 4)) {
        cJSON_AddStringToObject(o, "error", msg);
        return o;
    }
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status == 401   ? "authentication_error"
                                       : status >= 500 ? "server_error"
                                                       : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return o;
}

static void answer(cn_route_answer *a, int status, cJSON *body) {
    a->status = status;
    a->body = body;
}

typedef int (*build_fn)(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                        cn_refusal *r);

static void generate(cn_server *s, const char *url, build_fn build, const char *body, size_t len,
                     cn_route_answer *a) {
    cn_refusal r = {0};
    cn_job *j = NULL;
    if (build(&s->env, body, len, &j, &r)) {
        answer(a, r.status, cn_route_error(url, r.status, r.msg, r.param, r.code));
        return;
    }
    if (cn_job_get_state(j) == CN_JOB_DONE) { /* answered by its builder (request.h) */
        a->job = j;
        a->status = 200;
        return;
    }
    int pos = 0;
    int rc = cn_worker_push(&s->worker, j, &pos);
    if (rc) {
        cn_job_unref(j);
        char msg[160];
        snprintf(msg, sizeof msg, rc == CN_EBUSY ? "server busy: %d requests are waiting; retry later"
                                                 : "server is shutting down",
                 s->o.max_queue);
        answer(a, 503, cn_route_error(url, 503, msg, NULL, NULL));
        a->retry_after = 5;
        return;
    }
    a->job = j;
    a->status = 200;
}

void cn_route(cn_server *s, const char *method, const char *url, const char *body, size_t len,
              cn_route_answer *a) {
    memset(a, 0, sizeof *a);
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    struct {
        const char *path;
        int post;
        build_fn build;
    } gen[] = {
        {"/api/chat", 1, cn_ollama_chat_request},
        {"/api/generate", 1, cn_ollama_generate_request},
        {"/v1/chat/completions", 1, cn_openai_chat_request},
        {"/v1/completions", 1, cn_openai_completions_request},
        {"/v1/responses", 1, cn_responses_request},
        {"/v1/messages", 1, cn_anthropic_messages_request},
    };
    for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++)
        if (!strcmp(url, gen[i].path)) {
            if (!post) break;
            generate(s, url, gen[i].build, body, len, a);
            return;
        }
    if (post && !strcmp(url, "/v1/messages/count_tokens")) { /* rendered and counted, no job */
        cn_refusal r = {0};
        int n = 0;
        if (cn_anthropic_count_tokens(&s->env, body, len, &n, &r)) {
            answer(a, r.status, cn_route_error(url, r.status, r.msg, r.param, r.code));
            return;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "input_tokens", n);
        answer(a, 200, o);
        return;
    }
    if (get && !strcmp(url, "/")) {
        answer(a, 200, cJSON_CreateString("cairn is running"));
        return;
    }
    if (get && !strcmp(url, "/api/version")) {
        answer(a, 200, cn_info_version());
        return;
    }
    if (get && !strcmp(url, "/api/tags")) {
        answer(a, 200, cn_info_tags(&s->card));
        return;
    }
    if (get && !strcmp(url, "/api/ps"))
        {
        answer(a, 200, cn_info_ps(&s->card, cn_worker_busy(&s->worker),
                                         cn_worker_waiting(&s->worker)));
        return;
    }
    if (get && !strcmp(url, "/v1/models")) {
        answer(a, 200, cn_info_models(&s->card));
        return;
    }
    if (get && !strncmp(url, "/v1/models/", 11)) {
        if (!strcmp(url + 11, s->card.name) || cn_req_model_served(&s->env, url + 11) == 2) {
        answer(a, 200, cn_info_model(&s->card));
        return;
    }
        char msg[300];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", url + 11);
        {
        answer(a, 404, cn_route_error(url, 404, msg, "model", "model_not_found"));
        return;
    }
    }
    if (post && !strcmp(url, "/api/show")) {
        cn_refusal r = {0};
        cJSON *root;
        if (cn_req_parse_json(body, len, &root, &r)) {
            answer(a, r.status, cn_route_error(url, r.status, r.msg, r.param, r.code));
            return;
        }
        /* Ollama's clients send "model" (older ones "name") */
        if (!cJSON_GetObjectItemCaseSensitive(root, "model") &&
            cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "name")))
            cJSON_AddItemToObject(root, "model",
                                  cJSON_CreateString(cJSON_GetObjectItem(root, "name")->valuestring));
        int rc = cn_req_check_model(&s->env, root, &r);
        cJSON_Delete(root);
        if (rc) answer(a, r.status, cn_route_error(url, r.status, r.msg, r.param, r.code));
        else answer(a, 200, cn_info_show(&s->card));
        return;
    }
    int known = 0;
    const char *paths[] = {"/", "/api/version", "/api/tags", "/api/ps", "/v1/models", "/api/show",
                           "/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions",
                           "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) known |= !strcmp(url, paths[i]);
    char msg[300];
    if (known && !strcmp(method, "OPTIONS")) {
        answer(a, 204, NULL);
        return;
    }
    if (known) {
        snprintf(msg, sizeof msg, "method %s not allowed on %.200s", method, url);
        {
        answer(a, 405, cn_route_error(url, 405, msg, NULL, NULL));
        return;
    }
    }
    snprintf(msg, sizeof msg, "no such endpoint: %s %.200s", method, url);
    answer(a, 404, cn_route_error(url, 404, msg, NULL, NULL));
}
