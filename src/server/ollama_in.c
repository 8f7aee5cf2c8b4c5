/* ollama_in.c - /api/chat and /api/generate request bodies into jobs.
 *
 * Fields follow Ollama's API: model, messages / prompt, system, raw, think, tools, format,
 * options {temperature, top_k, top_p, min_p, seed, num_predict, stop, num_ctx, repeat_penalty,
 * repeat_last_n, presence_penalty, frequency_penalty, speculate}, stream (default true), keep_alive (accepted:
 * the model stays loaded for the server's life). format "json" or a JSON schema constrains the
 * output (constraint.h); with thinking on it applies once thinking ends, as Ollama's chat does.
 * What cairn cannot honour is refused by name rather than ignored: suffix, images, template,
 * context, and a schema keyword the recogniser does not know.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/request.h"
#include "text/chat.h"

/* options {...}: sampling, length, stop strings. */
static int options(cn_job *j, const cJSON *root, cn_refusal *r) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "options");
    if (!o || cJSON_IsNull(o)) return CN_OK;
    if (!cJSON_IsObject(o)) return cn_refuse(r, 400, "options", "options must be an object");
    cn_sampler_params *s = &j->sampling;
    double v;
    int rc;
#define NUM(key, lo, hi, dst)                                                                     \
    v = (double)(dst);                                                                            \
    if ((rc = cn_req_number(o, key, lo, hi, &v, r))) return rc;                                   \
    dst = v;
    NUM("temperature", 0, 100, s->temperature)
    NUM("top_k", 0, 1e9, s->top_k)
    NUM("top_p", 0, 1, s->top_p)
    NUM("min_p", 0, 1, s->min_p)
    NUM("repeat_penalty", 1e-6, 100, s->repeat_penalty)
    NUM("presence_penalty", -100, 100, s->presence_penalty)
    NUM("frequency_penalty", -100, 100, s->frequency_penalty)
    NUM("repeat_last_n", -1, 1e9, s->penalty_last_n)
    NUM("num_predict", -2, 1e9, j->max_tokens)
#undef NUM
    if (s->top_p == 0) s->top_p = 1; /* Ollama reads 0 as "off" */
    double seed = -1;
    if ((rc = cn_req_number(o, "seed", -9.2e18, 9.2e18, &seed, r))) return rc;
    if (seed >= 0) s->seed = (uint64_t)seed; /* Ollama: a negative seed means random */
    double num_ctx = 1;
    if ((rc = cn_req_number(o, "num_ctx", 1, 1e9, &num_ctx, r))) return rc; /* the server's --ctx rules */
    /* speculate: false decodes plainly; the output is the same either way (speculate.h) */
    int spec = 1; /* speculation unless options.speculate is false */
    if ((rc = cn_req_bool(o, "speculate", &spec, r))) return rc;
    j->no_speculate = !spec;
    return cn_req_stops(j, cJSON_GetObjectItemCaseSensitive(o, "stop"), "options.stop", 64, r);
}

/* Shared tail of both endpoints: stream, format (*fmt: NULL for none), the refused extras,
 * options. */
static int common(cn_job *j, const cJSON *root, const cJSON **fmt, cn_refusal *r) {
    j->stream = 1; /* Ollama streams unless told not to */
    int rc = cn_req_bool(root, "stream", &j->stream, r);
    if (rc) return rc;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    *fmt = NULL;
    if (f && !cJSON_IsNull(f) && !(cJSON_IsString(f) && !*f->valuestring)) {
        if (!(cJSON_IsString(f) && !strcmp(f->valuestring, "json")) && !cJSON_IsObject(f))
            return cn_refuse(r, 400, "format", "format must be \"json\" or a JSON schema object");
        *fmt = f;
    }
    const cJSON *ka = cJSON_GetObjectItemCaseSensitive(root, "keep_alive");
    if (ka && !cJSON_IsNull(ka) && !cJSON_IsString(ka) && !cJSON_IsNumber(ka))
        return cn_refuse(r, 400, "keep_alive", "keep_alive must be a duration string or a number");
    return options(j, root, r);
}

/* Constrains the output as format asks; after the prompt is set. */
static int apply_format(const cn_api_env *env, cn_job *j, const cJSON *fmt, cn_refusal *r) {
    if (!fmt) return CN_OK;
    return cn_req_json_constraint(env, j, cJSON_IsObject(fmt) ? fmt : NULL, "format", r);
}

int cn_ollama_chat_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                           cn_refusal *r) {
    *out = NULL;
    cJSON *root;
    int rc = cn_req_parse_json(body, len, &root, r);
    if (rc) return rc;
    cn_chat chat;
    memset(&chat, 0, sizeof chat);
    cn_job *j = NULL;
    if ((rc = cn_req_check_model(env, root, r))) goto out;
    if (!(j = cn_req_new_job(env, root, CN_API_OLLAMA_CHAT, "chat-"))) {
        rc = cn_refuse(r, 500, NULL, "out of memory");
        goto out;
    }
    const cJSON *fmt;
    if ((rc = common(j, root, &fmt, r))) goto out;
    cn_err err;
    cn_err_clear(&err);
    if ((rc = cn_chat_parse(&chat, body, len, &err))) {
        rc = cn_req_chat_error(rc, &err, r);
        goto out;
    }
    if (!(rc = cn_req_render_chat(env, j, &chat, r))) rc = apply_format(env, j, fmt, r);
out:
    cn_chat_free(&chat);
    cJSON_Delete(root);
    if (rc) cn_job_unref(j);
    else *out = j;
    return rc;
}

/* A refused extra: present and not empty. */
static int refuse_nonempty(const cJSON *root, const char *key, const char *why, cn_refusal *r) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!x || cJSON_IsNull(x)) return CN_OK;
    if (cJSON_IsString(x) && !*x->valuestring) return CN_OK;
    if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 0) return CN_OK;
    return cn_refuse(r, 400, key, "%s is not supported: %s", key, why);
}

int cn_ollama_generate_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                               cn_refusal *r) {
    *out = NULL;
    cJSON *root;
    int rc = cn_req_parse_json(body, len, &root, r);
    if (rc) return rc;
    cn_chat chat;
    memset(&chat, 0, sizeof chat);
    cn_job *j = NULL;
    cJSON *msgs = NULL;
    char *cj = NULL;
    if ((rc = cn_req_check_model(env, root, r))) goto out;
    if ((rc = refuse_nonempty(root, "suffix", "fill-in-the-middle needs a model trained for it", r)) ||
        (rc = refuse_nonempty(root, "images", "this model reads text only", r)) ||
        (rc = refuse_nonempty(root, "template", "the chat template is the model's own", r)) ||
        (rc = refuse_nonempty(root, "context", "send the conversation again; the prefix cache "
                                               "makes that cheap", r)))
        goto out;
    if (!(j = cn_req_new_job(env, root, CN_API_OLLAMA_GENERATE, "gen-"))) {
        rc = cn_refuse(r, 500, NULL, "out of memory");
        goto out;
    }
    const cJSON *fmt;
    if ((rc = common(j, root, &fmt, r))) goto out;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (p && !cJSON_IsNull(p) && !cJSON_IsString(p)) {
        rc = cn_refuse(r, 400, "prompt", "prompt must be a string");
        goto out;
    }
    if (sys && !cJSON_IsNull(sys) && !cJSON_IsString(sys)) {
        rc = cn_refuse(r, 400, "system", "system must be a string");
        goto out;
    }
    const char *prompt = p && cJSON_IsString(p) ? p->valuestring : "";
    int raw = 0;
    if ((rc = cn_req_bool(root, "raw", &raw, r))) goto out;
    if (raw) { /* the prompt is the model's input, byte for byte; output is not split */
        if (sys && cJSON_IsString(sys) && *sys->valuestring) {
            rc = cn_refuse(r, 400, "system", "system cannot be combined with raw");
            goto out;
        }
        if (!(rc = cn_req_set_prompt(env, j, prompt, strlen(prompt), r))) rc = apply_format(env, j, fmt, r);
        goto out;
    }
    /* Not raw: a one-turn chat through the model's template, as Ollama does. */
    cJSON *c = cJSON_CreateObject();
    msgs = c;
    cJSON *arr = cJSON_AddArrayToObject(c, "messages");
    if (sys && cJSON_IsString(sys) && *sys->valuestring) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", sys->valuestring);
        cJSON_AddItemToArray(arr, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt);
    cJSON_AddItemToArray(arr, m);
    const cJSON *think = cJSON_GetObjectItemCaseSensitive(root, "think");
    if (think) cJSON_AddItemToObject(c, "think", cJSON_Duplicate(think, 1));
    if (!(cj = cJSON_PrintUnformatted(c))) {
        rc = cn_refuse(r, 500, NULL, "out of memory");
        goto out;
    }
    cn_err err;
    cn_err_clear(&err);
    if ((rc = cn_chat_parse(&chat, cj, strlen(cj), &err))) {
        rc = cn_req_chat_error(rc, &err, r);
        goto out;
    }
    if (!(rc = cn_req_render_chat(env, j, &chat, r))) rc = apply_format(env, j, fmt, r);
out:
    free(cj);
    cJSON_Delete(msgs);
    cn_chat_free(&chat);
    cJSON_Delete(root);
    if (rc) cn_job_unref(j);
    else *out = j;
    return rc;
}
