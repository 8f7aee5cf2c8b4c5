/* openai_out.c - OpenAI's frames for /v1/chat/completions and /v1/completions.
 *
 * Streaming is Server-Sent Events: `data: {chunk}` per piece, `data: [DONE]` at the end, and SSE
 * comment lines (`: prefill 8192/40000`) for prefill progress, which every SSE client skips.
 * Reasoning goes out as `reasoning_content` (vLLM's and DeepSeek's name), tool calls as one
 * complete delta each (id, name and the whole arguments string), and with
 * stream_options.include_usage a last chunk with empty choices carries the usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static int is_chat(const cn_job *j) { return j->api == CN_API_OPENAI_CHAT; }

static cJSON *base(cn_job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", is_chat(j) ? (j->stream ? "chat.completion.chunk"
                                                                 : "chat.completion")
                                                    : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON_AddStringToObject(o, "system_fingerprint", "cairn");
    return o;
}

static cJSON *usage(cn_job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->res.prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", j->res.eval_count);
    cJSON_AddNumberToObject(u, "total_tokens", j->res.prompt_tokens + j->res.eval_count);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->res.cached_tokens);
    return u;
}

/* A chunk with one choice; returns the choice so the caller fills delta or text. */
static cJSON *chunk(cn_job *j, cJSON **choice) {
    cJSON *o = base(j);
    cJSON *cs = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON_AddItemToArray(cs, c);
    *choice = c;
    return o;
}

static int progress(cn_job *j, int done, int total) {
    char line[96];
    snprintf(line, sizeof line, ": prefill %d/%d\n\n", done, total);
    return cn_chan_puts(&j->chan, line);
}

static int send_chunk(cn_job *j, cJSON *o) { return cn_api_send(j, "data: ", o, "\n\n"); }

/* The first delta of a chat stream names the role. */
static cJSON *delta(cn_job *j, cJSON *c) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (!j->sent_role) {
        cJSON_AddStringToObject(d, "role", "assistant");
        j->sent_role = 1;
    }
    return d;
}

static int text(cn_job *j, int thinking, const char *s, size_t n) {
    char *t = strndup(s, n);
    if (!t) return CN_ENOMEM;
    cJSON *c, *o = chunk(j, &c);
    if (is_chat(j)) {
        cJSON_AddStringToObject(delta(j, c), thinking ? "reasoning_content" : "content", t);
    } else {
        cJSON_AddStringToObject(c, "text", t);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    free(t);
    return send_chunk(j, o);
}

static cJSON *call_json(cn_job *j, int i, int with_index) {
    cJSON *t = cJSON_CreateObject();
    if (with_index) cJSON_AddNumberToObject(t, "index", i);
    cJSON_AddStringToObject(t, "id", j->calls[i].id);
    cJSON_AddStringToObject(t, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    cJSON_AddStringToObject(f, "name", j->calls[i].name);
    cJSON_AddStringToObject(f, "arguments", j->calls[i].arguments);
    return t;
}

static int tool_call(cn_job *j, int index) {
    cJSON *c, *o = chunk(j, &c);
    cJSON *a = cJSON_AddArrayToObject(delta(j, c), "tool_calls");
    cJSON_AddItemToArray(a, call_json(j, index, 1));
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    return send_chunk(j, o);
}

static int error_frame(cn_job *j, int rc) {
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", cn_strerror(rc));
    cJSON_AddStringToObject(e, "type", rc == CN_ECANCELED ? "server_shutdown" : "server_error");
    cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    return j->stream ? send_chunk(j, o) : cn_api_send(j, "", o, "\n");
}

static int final(cn_job *j, int rc) {
    if (rc) {
        int w = error_frame(j, rc);
        return w ? w : (j->stream ? cn_chan_puts(&j->chan, "data: [DONE]\n\n") : 0);
    }
    const char *reason = cn_api_finish_reason(j, 1);
    if (j->stream) {
        cJSON *c, *o = chunk(j, &c);
        if (is_chat(j)) delta(j, c);
        else cJSON_AddStringToObject(c, "text", "");
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", reason);
        int w = send_chunk(j, o);
        if (!w && j->include_usage) {
            cJSON *u = base(j);
            cJSON_AddArrayToObject(u, "choices");
            cJSON_AddItemToObject(u, "usage", usage(j));
            w = send_chunk(j, u);
        }
        return w ? w : cn_chan_puts(&j->chan, "data: [DONE]\n\n");
    }
    cJSON *c, *o = chunk(j, &c);
    if (is_chat(j)) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (j->n_calls && !j->content_len) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", cn_job_content(j));
        if (j->thinking_len) cJSON_AddStringToObject(m, "reasoning_content", cn_job_thinking(j));
        if (j->n_calls) {
            cJSON *a = cJSON_AddArrayToObject(m, "tool_calls");
            for (int i = 0; i < j->n_calls; i++) cJSON_AddItemToArray(a, call_json(j, i, 0));
        }
    } else {
        cJSON_AddStringToObject(c, "text", cn_job_content(j));
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", reason);
    cJSON_AddItemToObject(o, "usage", usage(j));
    return cn_api_send(j, "", o, "\n");
}

/* SSE comments are skipped by every client; a non-streaming body may start with whitespace. */
const cn_api_ops cn_openai_chat_ops = {"text/event-stream", ": keep-alive\n\n", progress, text,
                                       tool_call, final};
const cn_api_ops cn_openai_completions_ops = {"text/event-stream", ": keep-alive\n\n", progress,
                                              text, tool_call, final};
