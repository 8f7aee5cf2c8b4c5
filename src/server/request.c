/* request.c - validation helpers shared by the dialects' request builders; see request.h. */
#include "server/request.h"

#include "text/chat.h"
#include "text/pyjson.h"
#include "text/render.h"
#include "text/token_bytes.h"

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

int cn_req_chat_error(int rc, const cn_err *err, cn_refusal *r) {
    if (rc == CN_ENOMEM) return cn_refuse(r, 500, NULL, "out of memory");
    return cn_refuse(r, 400, NULL, "%s", err->msg[0] ? err->msg : cn_strerror(rc));
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The job's marks (job.h): where the prompt's last turns begin (the turn token), and where each
 * text part after the first of the last user message begins, for a client that drops a part of
 * it in its next request. A part's mark is the last token boundary before the "\n" that joined
 * it, so what comes before is the same text whatever follows. Bounded work; never fails (a mark
 * it cannot place is left out). */
static void mark_turns(const cn_api_env *env, cn_job *j, const cn_chat *chat, const char *prompt,
                       size_t len) {
    int n = 0, marks[2 * CN_JOB_MARKS];
    int32_t turn = cn_text_turn_token(env->text);
    for (int i = j->n_prompt - 1; turn >= 0 && i > 0 && n < CN_JOB_MARKS / 2; i--)
        if (j->prompt[i] == turn) marks[n++] = i;
    const cn_chat_message *last = NULL;
    for (int i = chat->n_messages - 1; i >= 0 && !last; i--)
        if (chat->messages[i].role == CN_CHAT_USER) last = &chat->messages[i];
    const cn_token_bytes *tb = cn_text_token_bytes(env->text);
    size_t *end = last && last->n_part_at ? malloc((size_t)j->n_prompt * sizeof *end) : NULL;
    size_t at = 0;
    for (int i = 0; end && i < j->n_prompt; i++) { /* each token's end, in prompt bytes */
        at += j->prompt[i] >= 0 && j->prompt[i] < tb->n ? tb->len[j->prompt[i]] : 0;
        end[i] = at;
    }
    if (end && at == len) /* the tokens spell the prompt: offsets map */
        for (int p = last->n_part_at - 1, placed = 0; p >= 0 && placed < CN_JOB_MARKS / 2; p--) {
            const char *part = last->content + last->part_at[p];
            size_t pl = strnlen(part, 32), b = 0;
            for (size_t s = pl <= len ? len - pl + 1 : 0; pl && s-- > 0;) /* its last occurrence */
                if (!memcmp(prompt + s, part, pl)) {
                    b = s;
                    break;
                }
            if (b < 2) continue;
            int k = 0; /* tokens ending before the joining "\n" at b - 1 */
            while (k < j->n_prompt && end[k] <= b - 1) k++;
            if (k > 0) marks[n++] = k, placed++;
        }
    free(end);
    qsort(marks, (size_t)n, sizeof *marks, cmp_int);
    int m = 0; /* ascending and distinct */
    for (int i = 0; i < n; i++)
        if (!m || marks[i] != marks[m - 1]) marks[m++] = marks[i];
    int from = m > CN_JOB_MARKS ? m - CN_JOB_MARKS : 0; /* the last ones: nearest the end */
    j->n_marks = m - from;
    memcpy(j->marks, marks + from, (size_t)j->n_marks * sizeof *marks);
}

int cn_req_render_chat(const cn_api_env *env, cn_job *j, const cn_chat *chat, cn_refusal *r) {
    cn_err err;
    cn_err_clear(&err);
    char *prompt = NULL;
    size_t len = 0;
    int rc = cn_render(cn_text_renderer(env->text), chat, &prompt, &len, &err);
    if (rc) return cn_req_chat_error(rc, &err, r);
    j->parse = 1;
    j->thinking = cn_chat_thinking(chat, 1);
    if (env->canned_after_tool && chat->messages[chat->n_messages - 1].role == CN_CHAT_TOOL) {
        j->canned = env->canned_after_tool;
        j->ignore_eos = 1; /* as for env->canned: the canned text decides the end */
    }
    if (chat->tools && cJSON_GetArraySize(chat->tools) > 0 &&
        !(j->tools = cJSON_Duplicate(chat->tools, 1))) {
        free(prompt);
        return cn_refuse(r, 500, NULL, "out of memory");
    }
    rc = cn_req_set_prompt(env, j, prompt, len, r);
    if (!rc) mark_turns(env, j, chat, prompt, len);
    free(prompt);
    return rc;
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

int cn_req_bool(const cJSON *o, const char *key, int *v, cn_refusal *r) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return CN_OK;
    if (!cJSON_IsBool(x)) return cn_refuse(r, 400, key, "%s must be true or false", key);
    *v = cJSON_IsTrue(x);
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
