/* ollama_out.c - Ollama's NDJSON frames for /api/chat and /api/generate.
 *
 * A streaming response is one JSON object per line; the last has "done": true, the done_reason
 * and the counters. Prefill progress goes out as an ordinary chunk with empty text and an extra
 * "prefill": {"done", "total"} member: the official clients yield it like any chunk (their users
 * append "" to the answer) and it keeps proxies and client timeouts from closing a long prefill.
 * Durations are nanoseconds, as Ollama's.
 */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static cJSON *chunk(cn_job *j) {
    char ts[48];
    cn_api_rfc3339_now(ts, sizeof ts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON_AddStringToObject(o, "created_at", ts);
    return o;
}

static int is_chat(const cn_job *j) { return j->api == CN_API_OLLAMA_CHAT; }

/* The message (chat) or response fields (generate) of a chunk, with text s[0, n) of a kind. */
static void add_text(cn_job *j, cJSON *o, const char *content, const char *thinking) {
    if (is_chat(j)) {
        cJSON *m = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", content);
        if (thinking) cJSON_AddStringToObject(m, "thinking", thinking);
    } else {
        cJSON_AddStringToObject(o, "response", content);
        if (thinking) cJSON_AddStringToObject(o, "thinking", thinking);
    }
}

static int progress(cn_job *j, int done, int total) {
    cJSON *o = chunk(j);
    add_text(j, o, "", NULL);
    cJSON_AddFalseToObject(o, "done");
    cJSON *p = cJSON_AddObjectToObject(o, "prefill");
    cJSON_AddNumberToObject(p, "done", done);
    cJSON_AddNumberToObject(p, "total", total);
    return cn_api_send(j, "", o, "\n");
}

static int text(cn_job *j, int thinking, const char *s, size_t n) {
    char *t = strndup(s, n);
    if (!t) return CN_ENOMEM;
    cJSON *o = chunk(j);
    add_text(j, o, thinking ? "" : t, thinking ? t : NULL);
    cJSON_AddFalseToObject(o, "done");
    free(t);
    return cn_api_send(j, "", o, "\n");
}

static cJSON *calls_json(cn_job *j, int from, int to) {
    cJSON *a = cJSON_CreateArray();
    for (int i = from; i < to; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", j->calls[i].id);
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddNumberToObject(f, "index", i);
        cJSON_AddStringToObject(f, "name", j->calls[i].name);
        cJSON *args = cJSON_Parse(j->calls[i].arguments);
        cJSON_AddItemToObject(f, "arguments", args ? args : cJSON_CreateObject());
        cJSON_AddItemToArray(a, c);
    }
    return a;
}

static int tool_call(cn_job *j, int index) {
    cJSON *o = chunk(j);
    cJSON *m = cJSON_AddObjectToObject(o, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", "");
    cJSON_AddItemToObject(m, "tool_calls", calls_json(j, index, index + 1));
    cJSON_AddFalseToObject(o, "done");
    return cn_api_send(j, "", o, "\n");
}

static int final(cn_job *j, int rc) {
    if (rc) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", cn_strerror(rc));
        return cn_api_send(j, "", o, "\n");
    }
    cJSON *o = chunk(j);
    if (j->stream) {
        add_text(j, o, "", NULL);
    } else {
        add_text(j, o, cn_job_content(j), j->thinking_len ? cn_job_thinking(j) : NULL);
        if (j->n_calls && is_chat(j))
            cJSON_AddItemToObject(cJSON_GetObjectItem(o, "message"), "tool_calls",
                                  calls_json(j, 0, j->n_calls));
    }
    cJSON_AddTrueToObject(o, "done");
    cJSON_AddStringToObject(o, "done_reason", cn_api_finish_reason(j, 0));
    double total_ms = cn_now_ms() - j->t_arrival;
    cJSON_AddNumberToObject(o, "total_duration", (double)(long long)(total_ms * 1e6));
    cJSON_AddNumberToObject(o, "load_duration", 0);
    cJSON_AddNumberToObject(o, "prompt_eval_count", j->res.prompt_eval_count);
    cJSON_AddNumberToObject(o, "prompt_eval_duration", (double)(long long)(j->res.prompt_ms * 1e6));
    cJSON_AddNumberToObject(o, "eval_count", j->res.eval_count);
    cJSON_AddNumberToObject(o, "eval_duration", (double)(long long)(j->res.eval_ms * 1e6));
    return cn_api_send(j, "", o, "\n");
}

const cn_api_ops cn_ollama_chat_ops = {"application/x-ndjson", " ", progress, text, tool_call, final};
const cn_api_ops cn_ollama_generate_ops = {"application/x-ndjson", " ", progress, text, tool_call,
                                           final};
