/* request.c - validation helpers shared by the dialects' request builders; see request.h. */
#include "server/request.h"

#include "text/pyjson.h"

#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int cn_refuse(cn_refusal *r, int status, const char *param, const char *fmt, ...) {
    r->status = status;
    r->type = status == 404 ? "invalid_request_error" : status >= 500 ? "server_error"
                                                                      : "invalid_request_error";
    r->param = param;
    r->code = status == 404 ? "model_not_found" : NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return CN_EINVAL;
}

int cn_req_parse_json(const char *body, size_t len, cJSON **root, cn_refusal *r) {
    *root = NULL;
    size_t bad = 0;
    if (!cn_utf8_valid(body, len, &bad))
        return cn_refuse(r, 400, NULL, "request body is not valid UTF-8 (byte %zu)", bad);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!j) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return cn_refuse(r, 400, NULL, "request body is not valid JSON (near byte %zu)", at);
    }
    for (const char *p = end; p && p < body + len; p++) /* trailing bytes: not one JSON value */
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
            cJSON_Delete(j);
            return cn_refuse(r, 400, NULL, "request body has bytes after the JSON value");
        }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return cn_refuse(r, 400, NULL, "request body must be a JSON object");
    }
    *root = j;
    return CN_OK;
}

int cn_req_model_served(const cn_api_env *env, const char *s) {
    size_t n = strlen(env->model_name);
    if (!strcmp(s, env->model_name) || (!strncmp(s, env->model_name, n) && !strcmp(s + n, ":latest")))
        return 1;
    for (int i = 0; i < env->n_aliases; i++)
        if (!fnmatch(env->aliases[i], s, 0)) return 2;
    return 0;
}

int cn_req_check_model(const cn_api_env *env, const cJSON *root, cn_refusal *r) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!m || cJSON_IsNull(m)) return cn_refuse(r, 400, "model", "model is required");
    if (!cJSON_IsString(m)) return cn_refuse(r, 400, "model", "model must be a string");
    if (cn_req_model_served(env, m->valuestring)) return CN_OK;
    char also[256] = "";
    size_t at = 0;
    for (int i = 0; i < env->n_aliases && at < sizeof also; i++) {
        int w = snprintf(also + at, sizeof also - at, "%s'%.60s'", i ? ", " : " (and names matching ",
                         env->aliases[i]);
        at += w > 0 ? (size_t)w : 0;
    }
    if (env->n_aliases && at < sizeof also) snprintf(also + at, sizeof also - at, ")");
    cn_refuse(r, 404, "model", "model '%.200s' not found; this server serves '%.200s'%s",
              m->valuestring, env->model_name, also);
    return CN_ENOENT;
}

int cn_req_set_prompt(const cn_api_env *env, cn_job *j, const char *text, size_t n,
                      cn_refusal *r) {
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_text_encode(env->text, text, n, &j->prompt, &j->n_prompt, &err);
    if (rc == CN_ENOMEM) return cn_refuse(r, 500, NULL, "out of memory tokenizing the prompt");
    if (rc) return cn_refuse(r, 400, NULL, "cannot tokenize the prompt: %s", err.msg);
    if (j->n_prompt == 0) return cn_refuse(r, 400, "prompt", "the prompt is empty");
    if (j->n_prompt >= env->ctx) {
        cn_refuse(r, 400, "messages",
                  "the prompt is %d tokens, past the context of %d tokens (leave room for at least "
                  "one generated token; cairn serve --ctx N sets the context)",
                  j->n_prompt, env->ctx);
        r->code = "context_length_exceeded"; /* OpenAI's code; Codex acts on it */
        return CN_EINVAL;
    }
    int room = env->ctx - j->n_prompt;
    if (j->max_tokens < 0 || j->max_tokens > room) j->max_tokens = room, j->room_bound = 1;
    return CN_OK;
}

int cn_req_json_constraint(const cn_api_env *env, cn_job *j, const cJSON *schema,
                           const char *param, cn_refusal *r) {
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_constraint_json(&j->constraint, cn_text_token_bytes(env->text), schema,
                                j->parse && j->thinking, &err);
    if (rc == CN_ENOMEM) return cn_refuse(r, 500, NULL, "out of memory");
    if (rc) return cn_refuse(r, 400, param, "%s: %s", param, err.msg);
    return CN_OK;
}

int cn_req_tool_constraint(const cn_api_env *env, cn_job *j, const char *only, cn_refusal *r) {
    if (!j->tools)
        return cn_refuse(r, 400, "tool_choice", "tool_choice asks for a call, but no tools are offered");
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_constraint_tool(&j->constraint, cn_text_token_bytes(env->text), j->tools, only,
                                j->parse && j->thinking, &err);
    if (rc == CN_ENOMEM) return cn_refuse(r, 500, NULL, "out of memory");
    if (rc) return cn_refuse(r, 400, "tool_choice", "tool_choice: %s", err.msg);
    return CN_OK;
}

int cn_req_number(const cJSON *o, const char *key, double lo, double hi, double *v,
                  cn_refusal *r) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return CN_OK;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
        return cn_refuse(r, 400, key, "%s must be a number", key);
    if (x->valuedouble < lo || x->valuedouble > hi)
        return cn_refuse(r, 400, key, "%s must be in [%g, %g], got %g", key, lo, hi, x->valuedouble);
    *v = x->valuedouble;
    return CN_OK;
}

int cn_req_stops(cn_job *j, const cJSON *stop, const char *param, int max, cn_refusal *r) {
    if (!stop || cJSON_IsNull(stop)) return CN_OK;
    if (cJSON_IsString(stop)) {
        if (cn_stopseq_add(&j->stops, stop->valuestring)) return cn_refuse(r, 500, NULL, "out of memory");
        return CN_OK;
    }
    if (!cJSON_IsArray(stop)) return cn_refuse(r, 400, param, "%s must be a string or an array of strings", param);
    if (cJSON_GetArraySize(stop) > max)
        return cn_refuse(r, 400, param, "%s takes at most %d strings", param, max);
    const cJSON *s;
    cJSON_ArrayForEach(s, stop) {
        if (!cJSON_IsString(s)) return cn_refuse(r, 400, param, "%s must hold only strings", param);
        if (cn_stopseq_add(&j->stops, s->valuestring)) return cn_refuse(r, 500, NULL, "out of memory");
    }
    return CN_OK;
}

cn_job *cn_req_new_job(const cn_api_env *env, const cJSON *root, cn_api api, const char *id_prefix) {
    cn_job *j = cn_job_new();
    if (!j) return NULL;
    j->api = api;
    j->text = env->text;
    j->canned = env->canned;
    j->ignore_eos = env->canned != NULL; /* the canned text, not the random model, decides the end */
    j->max_tokens = -1;
    cn_sampler_params_default(&j->sampling);
    uint64_t rnd[2] = {0, 0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) /* fall back to the clock */
        rnd[0] = (uint64_t)(cn_now_ms() * 1e3), rnd[1] = (uint64_t)(uintptr_t)j;
    j->sampling.seed = rnd[0];
    snprintf(j->id, sizeof j->id, "%s%016llx", id_prefix, (unsigned long long)rnd[1]);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    int aliased = cJSON_IsString(m) && cn_req_model_served(env, m->valuestring) == 2;
    if (!(j->model = strdup(aliased ? m->valuestring : env->model_name))) {
        cn_job_unref(j);
        return NULL;
    }
    return j;
}
