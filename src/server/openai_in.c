/* openai_in.c - /v1/chat/completions and /v1/completions request bodies into jobs.
 *
 * Honoured: model, messages / prompt (a string or an array of one string), max_tokens /
 * max_completion_tokens, temperature, top_p, stop (up to 4), seed, presence_penalty,
 * frequency_penalty, n = 1, stream, stream_options.include_usage, tools, tool_choice ("auto",
 * "none": no tools in the prompt, "required" and {"type":"function","function":{"name"}}: the
 * output is constrained to one call), response_format (text, json_object, json_schema: the
 * output is constrained to JSON), chat_template_kwargs, and the common extensions top_k, min_p,
 * repeat_penalty, ignore_eos (vLLM's). Constraints apply once thinking ends.
 * Refused by name: n > 1, logprobs, echo, suffix, best_of > 1, a forced call together with a
 * JSON response_format, and schema keywords the recogniser does not know. Defaults are OpenAI's:
 * temperature 1, top_p 1, no top-k.
 */
#include <stdlib.h>
#include <string.h>

#include "server/request.h"
#include "text/chat.h"

static int sampling(cn_job *j, const cJSON *root, cn_refusal *r) {
    cn_sampler_params *s = &j->sampling;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->top_k = 0;
    double v;
    int rc;
#define NUM(key, lo, hi, dst)                                                                     \
    v = (double)(dst);                                                                            \
    if ((rc = cn_req_number(root, key, lo, hi, &v, r))) return rc;                                \
    dst = v;
    NUM("temperature", 0, 2, s->temperature)
    NUM("top_p", 1e-9, 1, s->top_p)
    NUM("top_k", 0, 1e9, s->top_k)
    NUM("min_p", 0, 1, s->min_p)
    NUM("repeat_penalty", 1e-6, 100, s->repeat_penalty)
    NUM("presence_penalty", -2, 2, s->presence_penalty)
    NUM("frequency_penalty", -2, 2, s->frequency_penalty)
#undef NUM
    double seed = -1;
    if ((rc = cn_req_number(root, "seed", -9.2e18, 9.2e18, &seed, r))) return rc;
    if (seed >= 0) s->seed = (uint64_t)seed;
    double n = 1;
    if ((rc = cn_req_number(root, "n", 1, 1e9, &n, r))) return rc;
    if (n != 1) return cn_refuse(r, 400, "n", "n must be 1: cairn returns one choice");
    double mt = -1, mct = -1;
    if ((rc = cn_req_number(root, "max_tokens", 1, 1e9, &mt, r)) ||
        (rc = cn_req_number(root, "max_completion_tokens", 1, 1e9, &mct, r)))
        return rc;
    if (mct >= 0) j->max_tokens = (int)mct;
    else if (mt >= 0) j->max_tokens = (int)mt;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp))
        return cn_refuse(r, 400, "logprobs", "logprobs is not supported");
    int ie = 0;
    if ((rc = cn_req_bool(root, "stream", &j->stream, r)) ||
        (rc = cn_req_bool(root, "ignore_eos", &ie, r)))
        return rc;
    j->ignore_eos |= ie; /* canned test output sets it already */
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return cn_refuse(r, 400, "stream_options", "stream_options must be an object");
        j->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    }
    return cn_req_stops(j, cJSON_GetObjectItemCaseSensitive(root, "stop"), "stop", 4, r);
}

/* Starts a job for either endpoint: JSON, model, sampling. */
static int begin(const cn_api_env *env, cn_api api, const char *body, size_t len, cJSON **root,
                 cn_job **j, cn_refusal *r) {
    *j = NULL;
    int rc = cn_req_parse_json(body, len, root, r);
    if (rc) return rc;
    if ((rc = cn_req_check_model(env, *root, r))) return rc;
    if (!(*j = cn_req_new_job(env, *root, api, api == CN_API_OPENAI_CHAT ? "chatcmpl-" : "cmpl-")))
        return cn_refuse(r, 500, NULL, "out of memory");
    return sampling(*j, *root, r);
}

int cn_openai_chat_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                           cn_refusal *r) {
    *out = NULL;
    cJSON *root = NULL;
    cn_job *j = NULL;
    cn_chat chat;
    memset(&chat, 0, sizeof chat);
    int rc = begin(env, CN_API_OPENAI_CHAT, body, len, &root, &j, r);
    if (rc) goto out;
    int json = 0; /* response_format asks for JSON: 1, with schema (NULL: any object) */
    const cJSON *schema = NULL;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(t)) {
            rc = cn_refuse(r, 400, "response_format", "response_format must be an object with a type");
            goto out;
        }
        if (!strcmp(t->valuestring, "json_object")) {
            json = 1;
        } else if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            schema = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            if (!cJSON_IsObject(schema)) {
                rc = cn_refuse(r, 400, "response_format",
                               "response_format.json_schema.schema must be a JSON schema object");
                goto out;
            }
            json = 1;
        } else if (strcmp(t->valuestring, "text")) {
            rc = cn_refuse(r, 400, "response_format",
                           "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
            goto out;
        }
    }
    int no_tools = 0, force = 0;
    const char *only = NULL; /* the one function a call is forced to */
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *fn = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "function") : NULL;
        const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) no_tools = 1;
        else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) force = 1;
        else if (cJSON_IsString(nm)) force = 1, only = nm->valuestring;
        else if (!cJSON_IsString(tc) || strcmp(tc->valuestring, "auto")) {
            rc = cn_refuse(r, 400, "tool_choice",
                           "tool_choice must be \"auto\", \"none\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            goto out;
        }
    }
    if (force && json) {
        rc = cn_refuse(r, 400, "tool_choice", "a forced tool call cannot also be JSON output (response_format)");
        goto out;
    }
    cn_err err;
    cn_err_clear(&err);
    if ((rc = cn_chat_parse(&chat, body, len, &err))) {
        rc = rc == CN_ENOMEM ? cn_refuse(r, 500, NULL, "out of memory")
                             : cn_refuse(r, 400, "messages", "%s", err.msg);
        goto out;
    }
    if (no_tools) { /* "none": the model is not told about them, so it cannot call them */
        cJSON_Delete(chat.tools);
        chat.tools = NULL;
    }
    if ((rc = cn_req_render_chat(env, j, &chat, r))) goto out;
    if (json) rc = cn_req_json_constraint(env, j, schema, "response_format", r);
    else if (force) rc = cn_req_tool_constraint(env, j, only, r);
out:
    cn_chat_free(&chat);
    cJSON_Delete(root);
    if (rc) cn_job_unref(j);
    else *out = j;
    return rc;
}

int cn_openai_completions_request(const cn_api_env *env, const char *body, size_t len,
                                  cn_job **out, cn_refusal *r) {
    *out = NULL;
    cJSON *root = NULL;
    cn_job *j = NULL;
    int rc = begin(env, CN_API_OPENAI_COMPLETIONS, body, len, &root, &j, r);
    if (rc) goto out;
    if (j->max_tokens < 0) j->max_tokens = 16; /* OpenAI's default for completions */
    const cJSON *echo = cJSON_GetObjectItemCaseSensitive(root, "echo");
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    double best_of = 1;
    if (cJSON_IsTrue(echo)) {
        rc = cn_refuse(r, 400, "echo", "echo is not supported");
        goto out;
    }
    if (suffix && !cJSON_IsNull(suffix) && !(cJSON_IsString(suffix) && !*suffix->valuestring)) {
        rc = cn_refuse(r, 400, "suffix", "suffix is not supported");
        goto out;
    }
    if ((rc = cn_req_number(root, "best_of", 1, 1, &best_of, r))) goto out;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (!cJSON_IsString(p)) {
        rc = cn_refuse(r, 400, "prompt", "prompt must be a string (or an array of one string)");
        goto out;
    }
    rc = cn_req_set_prompt(env, j, p->valuestring, strlen(p->valuestring), r);
out:
    cJSON_Delete(root);
    if (rc) cn_job_unref(j);
    else *out = j;
    return rc;
}
