/* responses_out.c - OpenAI Responses API frames for /v1/responses.
 *
 * A response's output is a list of items, each with an id and an output_index 0..n in order:
 * a reasoning item (the thinking, as one reasoning_text part; summary stays empty, since the
 * model writes no summary), a message item (the content, one output_text part) and one
 * function_call item per tool call. The body of a non-streaming request is the response object,
 * its items in that order; a streaming one is Server-Sent Events, `event: TYPE` and `data: {...,
 * "type": TYPE, "sequence_number": n}` with n rising from 0:
 *     response.created, response.in_progress               (written when the job is built)
 *     per item: response.output_item.added
 *       reasoning / message: response.content_part.added, response.reasoning_text.delta or
 *         response.output_text.delta ..., their .done, response.content_part.done
 *       function call: response.function_call_arguments.delta (the whole arguments), .done
 *       response.output_item.done (the complete item)
 *     response.completed, or response.incomplete (max_output_tokens reached), or
 *     response.failed (an engine error), carrying the whole response: output[] and usage.
 * A new item starts when the text changes kind or follows a call, so a stream's items are the
 * order the model wrote them in. A response with nothing at all gets one empty message. No
 * [DONE] line: clients end at the terminal event. Prefill progress and idle bytes are SSE comment
 * lines, which every SSE parser skips.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static const char *hex_id(const cn_job *j) { return strncmp(j->id, "resp_", 5) ? j->id : j->id + 5; }

static void item_id(const cn_job *j, int k, char *buf, size_t n) {
    char kind = j->items[k].kind;
    snprintf(buf, n, "%s_%s_%d", kind == 'r' ? "rs" : kind == 'm' ? "msg" : "fc", hex_id(j), k);
}

/* Item k's text, NUL-terminated (caller frees); NULL without memory. */
static char *item_text(const cn_job *j, int k) {
    const cn_out_item *it = &j->items[k];
    const char *buf = it->kind == 'r' ? cn_job_thinking(j) : cn_job_content(j);
    return strndup(buf + it->start, it->end - it->start);
}

static size_t buf_len(const cn_job *j, char kind) { return kind == 'r' ? j->thinking_len : j->content_len; }

static int push_item(cn_job *j, char kind, size_t start, int call) {
    cn_out_item *ni = realloc(j->items, ((size_t)j->n_items + 1) * sizeof *ni);
    if (!ni) return -1;
    j->items = ni;
    ni[j->n_items] = (cn_out_item){kind, 1, start, start, call};
    return j->n_items++;
}

static cJSON *part_json(char kind, const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", kind == 'r' ? "reasoning_text" : "output_text");
    if (kind == 'm') cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddStringToObject(p, "text", text);
    return p;
}

/* Item k as JSON: done 0 is the shell output_item.added announces. */
static cJSON *item_json(const cn_job *j, int k, int done, const char *status) {
    const cn_out_item *it = &j->items[k];
    char id[96];
    item_id(j, k, id, sizeof id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    if (it->kind == 'f') {
        const cn_tool_call_out *c = &j->calls[it->call];
        cJSON_AddStringToObject(o, "type", "function_call");
        cJSON_AddStringToObject(o, "status", done ? status : "in_progress");
        cJSON_AddStringToObject(o, "arguments", done ? c->arguments : "");
        cJSON_AddStringToObject(o, "call_id", c->id);
        cJSON_AddStringToObject(o, "name", c->name);
        return o;
    }
    char *text = done ? item_text(j, k) : NULL;
    if (done && !text) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON *content;
    if (it->kind == 'r') {
        cJSON_AddStringToObject(o, "type", "reasoning");
        cJSON_AddArrayToObject(o, "summary");
        content = cJSON_AddArrayToObject(o, "content");
    } else {
        cJSON_AddStringToObject(o, "type", "message");
        cJSON_AddStringToObject(o, "status", done ? status : "in_progress");
        cJSON_AddStringToObject(o, "role", "assistant");
        content = cJSON_AddArrayToObject(o, "content");
    }
    if (done) cJSON_AddItemToArray(content, part_json(it->kind, text));
    free(text);
    return o;
}

static cJSON *usage(const cn_job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", j->res.prompt_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->res.cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", j->res.eval_count);
    d = cJSON_AddObjectToObject(u, "output_tokens_details");
    cJSON_AddNumberToObject(d, "reasoning_tokens",
                            j->thinking_tokens < j->res.eval_count ? j->thinking_tokens : j->res.eval_count);
    cJSON_AddNumberToObject(u, "total_tokens", j->res.prompt_tokens + j->res.eval_count);
    return u;
}

/* The response object; full adds output[] (item statuses: completed, the last one's as given)
 * and usage. error: {code, message} for a failed one. */
static cJSON *response(const cn_job *j, const char *status, int full, const char *last_status,
                       const char *code, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)j->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddBoolToObject(o, "background", 0);
    if (code) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", code);
        cJSON_AddStringToObject(e, "message", msg);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete")) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON *out = cJSON_AddArrayToObject(o, "output");
    for (int k = 0; full && k < j->n_items; k++) {
        cJSON *it = item_json(j, k, 1, k == j->n_items - 1 ? last_status : "completed");
        if (!it) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToArray(out, it);
    }
    if (full) cJSON_AddItemToObject(o, "usage", usage(j));
    else cJSON_AddNullToObject(o, "usage");
    for (const cJSON *e = j->echo ? j->echo->child : NULL; e; e = e->next)
        cJSON_AddItemToObject(o, e->string, cJSON_Duplicate(e, 1));
    return o;
}

/* ---- stream events ------------------------------------------------------------------------- */

static cJSON *event(cn_job *j, const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", j->seq++);
    return o;
}

static int send_event(cn_job *j, cJSON *o) {
    if (!o) return CN_ENOMEM;
    return cn_api_send_event(j, cJSON_GetObjectItemCaseSensitive(o, "type")->valuestring, o);
}

/* An event about item k: type, item_id, output_index (and content_index for text parts). */
static cJSON *item_event(cn_job *j, const char *type, int k, int content_index) {
    cJSON *o = event(j, type);
    char id[96];
    item_id(j, k, id, sizeof id);
    cJSON_AddStringToObject(o, "item_id", id);
    cJSON_AddNumberToObject(o, "output_index", k);
    if (content_index >= 0) cJSON_AddNumberToObject(o, "content_index", content_index);
    return o;
}

static int send_item(cn_job *j, const char *type, int k, int done, const char *status) {
    cJSON *o = event(j, type), *it = item_json(j, k, done, status);
    if (!it) {
        cJSON_Delete(o);
        return CN_ENOMEM;
    }
    cJSON_AddNumberToObject(o, "output_index", k);
    cJSON_AddItemToObject(o, "item", it);
    return send_event(j, o);
}

int cn_responses_open_stream(cn_job *j) {
    if (j->sent_role) return CN_OK;
    j->sent_role = 1;
    const char *types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        cJSON *o = event(j, types[i]), *r = response(j, "in_progress", 0, NULL, NULL, NULL);
        if (!r) {
            cJSON_Delete(o);
            return CN_ENOMEM;
        }
        cJSON_AddItemToObject(o, "response", r);
        int rc = send_event(j, o);
        if (rc) return rc;
    }
    return CN_OK;
}

/* Opens an item of kind whose text starts at start (or call for 'f'): added, and a text
 * item's empty part. Returns its index, or a negative code. */
static int start_item(cn_job *j, char kind, size_t start, int call) {
    int k = push_item(j, kind, start, call);
    if (k < 0) return CN_ENOMEM;
    int rc = send_item(j, "response.output_item.added", k, 0, NULL);
    if (!rc && kind != 'f') {
        cJSON *o = item_event(j, "response.content_part.added", k, 0);
        cJSON_AddItemToObject(o, "part", part_json(kind, ""));
        rc = send_event(j, o);
    }
    return rc ? rc : k;
}

/* Ends the open text item k: its text's done event, the part's, the item's. */
static int close_item(cn_job *j, int k, const char *status) {
    cn_out_item *it = &j->items[k];
    it->open = 0;
    it->end = buf_len(j, it->kind);
    char *text = item_text(j, k);
    if (!text) return CN_ENOMEM;
    cJSON *o = item_event(j, it->kind == 'r' ? "response.reasoning_text.done" : "response.output_text.done", k, 0);
    cJSON_AddStringToObject(o, "text", text);
    if (it->kind == 'm') cJSON_AddArrayToObject(o, "logprobs");
    int rc = send_event(j, o);
    if (!rc) {
        o = item_event(j, "response.content_part.done", k, 0);
        cJSON_AddItemToObject(o, "part", part_json(it->kind, text));
        rc = send_event(j, o);
    }
    free(text);
    return rc ? rc : send_item(j, "response.output_item.done", k, 1, status);
}

static int close_open(cn_job *j, const char *status) {
    if (j->n_items == 0 || !j->items[j->n_items - 1].open) return CN_OK;
    return close_item(j, j->n_items - 1, status);
}

static int progress(cn_job *j, int done, int total) {
    char line[96];
    snprintf(line, sizeof line, ": prefill %d/%d\n\n", done, total);
    return cn_chan_puts(&j->chan, line);
}

static int text(cn_job *j, int thinking, const char *s, size_t n) {
    int rc = cn_responses_open_stream(j);
    if (rc) return rc;
    char kind = thinking ? 'r' : 'm';
    int k = j->n_items - 1;
    if (k < 0 || !j->items[k].open || j->items[k].kind != kind) {
        if ((rc = close_open(j, "completed"))) return rc;
        if ((k = start_item(j, kind, buf_len(j, kind) - n, -1)) < 0) return k;
    }
    char *d = strndup(s, n);
    if (!d) return CN_ENOMEM;
    cJSON *o = item_event(j, thinking ? "response.reasoning_text.delta" : "response.output_text.delta", k, 0);
    cJSON_AddStringToObject(o, "delta", d);
    if (!thinking) cJSON_AddArrayToObject(o, "logprobs");
    free(d);
    return send_event(j, o);
}

static int tool_call(cn_job *j, int index) {
    int rc = cn_responses_open_stream(j);
    if (!rc) rc = close_open(j, "completed");
    if (rc) return rc;
    int k = start_item(j, 'f', 0, index);
    if (k < 0) return k;
    j->items[k].open = 0;
    const cn_tool_call_out *c = &j->calls[index];
    cJSON *o = item_event(j, "response.function_call_arguments.delta", k, -1);
    cJSON_AddStringToObject(o, "delta", c->arguments);
    if ((rc = send_event(j, o))) return rc;
    o = item_event(j, "response.function_call_arguments.done", k, -1);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "arguments", c->arguments);
    if ((rc = send_event(j, o))) return rc;
    return send_item(j, "response.output_item.done", k, 1, "completed");
}

/* The terminal event: type and the whole response. */
static int send_terminal(cn_job *j, const char *type, cJSON *resp) {
    cJSON *o = event(j, type);
    if (!resp) {
        cJSON_Delete(o);
        return CN_ENOMEM;
    }
    cJSON_AddItemToObject(o, "response", resp);
    return send_event(j, o);
}

int cn_responses_fail_stream(cn_job *j, const char *code, const char *msg) {
    int rc = cn_responses_open_stream(j);
    if (!rc) rc = send_terminal(j, "response.failed", response(j, "failed", 1, "incomplete", code, msg));
    cn_job_set_state(j, CN_JOB_DONE); /* before the close: a reader that sees the end sees DONE */
    cn_chan_close(&j->chan);
    return rc;
}

/* A non-streaming response's items: reasoning, message, calls, as accumulated. */
static int whole_items(cn_job *j) {
    if (j->thinking_len && push_item(j, 'r', 0, -1) < 0) return CN_ENOMEM;
    if ((j->content_len || (!j->n_calls && !j->thinking_len)) && push_item(j, 'm', 0, -1) < 0) return CN_ENOMEM;
    for (int i = 0; i < j->n_calls; i++)
        if (push_item(j, 'f', 0, i) < 0) return CN_ENOMEM;
    for (int k = 0; k < j->n_items; k++) {
        j->items[k].open = 0;
        j->items[k].end = j->items[k].kind == 'f' ? 0 : buf_len(j, j->items[k].kind);
    }
    return CN_OK;
}

static int final(cn_job *j, int rc) {
    const char *status = j->res.stop == CN_STOP_LENGTH ? "incomplete" : "completed";
    if (rc) {
        const char *code = rc == CN_ECANCELED ? "server_shutdown" : "server_error";
        if (j->stream) {
            int w = close_open(j, "incomplete");
            return w ? w : send_terminal(j, "response.failed",
                                         response(j, "failed", 1, "incomplete", code, cn_strerror(rc)));
        }
        cJSON *o = cJSON_CreateObject();
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", cn_strerror(rc));
        cJSON_AddStringToObject(e, "type", "server_error");
        cJSON_AddNullToObject(e, "param");
        cJSON_AddStringToObject(e, "code", code);
        return cn_api_send(j, "", o, "\n");
    }
    if (!j->stream) {
        if (whole_items(j)) return CN_ENOMEM;
        return cn_api_send(j, "", response(j, status, 1, status, NULL, NULL), "\n");
    }
    int w = cn_responses_open_stream(j);
    if (!w) w = close_open(j, status);
    if (!w && j->n_items == 0) { /* nothing at all: one empty message, as the whole body has */
        int k = start_item(j, 'm', j->content_len, -1);
        w = k < 0 ? k : close_item(j, k, status);
    }
    if (w) return w;
    return send_terminal(j, strcmp(status, "completed") ? "response.incomplete" : "response.completed",
                         response(j, status, 1, status, NULL, NULL));
}

/* SSE comments are skipped by every client; a non-streaming body may start with whitespace. */
const cn_api_ops cn_responses_ops = {"text/event-stream", ": keep-alive\n\n", progress, text,
                                     tool_call, final};
