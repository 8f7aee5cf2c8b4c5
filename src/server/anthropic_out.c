/* anthropic_out.c - Anthropic's frames for /v1/messages.
 *
 * A whole response is one message {id, type, role, model, content, stop_reason, stop_sequence,
 * usage}, its content the blocks thinking (with a signature), text, then one tool_use per call.
 * A stream is Server-Sent Events with `event:` lines, in the order @anthropic-ai/sdk's
 * MessageStream accumulates them:
 *     message_start (usage with the input figures)
 *     per block: content_block_start, content_block_delta..., content_block_stop
 *     message_delta (stop_reason, stop_sequence, the whole usage), message_stop
 * It promises: (1) block indices run 0..n in the order the blocks start, and a block stops before
 * the next one starts (a thinking block after its signature_delta); (2) a tool_use block carries
 * its whole arguments in one input_json_delta; (3) message_start goes out at the first progress,
 * text or call, so its usage knows the cached tokens; (4) ping events are the idle bytes and the
 * prefill progress (clients skip them); (5) an error is an `error` event in a stream and
 * {type: "error", error: {type, message}} as a body. stop_reason: tool_use when calls were made,
 * stop_sequence (naming it), max_tokens, model_context_window_exceeded when max_tokens had been
 * cut to the room the context leaves, else end_turn.
 * usage: input_tokens are the prompt tokens evaluated by this request, cache_read_input_tokens
 * the ones restored from the prefix cache (together the prompt), cache_creation_input_tokens 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT };

static const char PING[] = "event: ping\ndata: {\"type\": \"ping\"}\n\n";


static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *usage(const cn_job *j) {
    cJSON *u = cJSON_CreateObject();
    int cached = j->res.cached_tokens;
    cJSON_AddNumberToObject(u, "input_tokens", j->res.prompt_tokens - cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached);
    cJSON_AddNumberToObject(u, "output_tokens", j->res.eval_count);
    return u;
}

static const char *stop_reason(const cn_job *j) {
    if (j->n_calls) return "tool_use";
    if (j->stops.matched) return "stop_sequence";
    if (j->res.stop == CN_STOP_LENGTH) /* the context, not the client's max_tokens, ended it */
        return j->room_bound ? "model_context_window_exceeded" : "max_tokens";
    return "end_turn";
}

static void add_stop(cJSON *o, const cn_job *j, int done) {
    if (!done) {
        cJSON_AddNullToObject(o, "stop_reason");
        cJSON_AddNullToObject(o, "stop_sequence");
        return;
    }
    cJSON_AddStringToObject(o, "stop_reason", stop_reason(j));
    if (j->stops.matched && !j->n_calls && j->stops.which >= 0 && j->stops.which < j->stops.n)
        cJSON_AddStringToObject(o, "stop_sequence", j->stops.s[j->stops.which]);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
}

/* The message object; content: the array to fill, owned by the message. */
static cJSON *message(const cn_job *j, int done, cJSON **content) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", j->model);
    *content = cJSON_AddArrayToObject(o, "content");
    add_stop(o, j, done);
    cJSON_AddItemToObject(o, "usage", usage(j));
    return o;
}

/* Any non-empty string: this server does not sign reasoning; clients send it back unread. */
static const char *signature(const cn_job *j) { return j->id; }

static cJSON *thinking_block(const cn_job *j, const char *text, int with_signature) {
    cJSON *b = typed("thinking");
    cJSON_AddStringToObject(b, "thinking", text);
    cJSON_AddStringToObject(b, "signature", with_signature ? signature(j) : "");
    return b;
}

static cJSON *text_block(const char *text) {
    cJSON *b = typed("text");
    cJSON_AddStringToObject(b, "text", text);
    return b;
}

/* A tool_use block; input is the parsed arguments (an object), or {} while streaming (2). */
static cJSON *tool_use_block(const cn_job *j, int i, int with_input) {
    cJSON *b = typed("tool_use");
    cJSON_AddStringToObject(b, "id", j->calls[i].id);
    cJSON_AddStringToObject(b, "name", j->calls[i].name);
    cJSON *in = with_input ? cJSON_Parse(j->calls[i].arguments) : NULL;
    if (!cJSON_IsObject(in)) { /* the parser writes objects; {} rather than a broken block */
        cJSON_Delete(in);
        in = cJSON_CreateObject();
    }
    cJSON_AddItemToObject(b, "input", in);
    return b;
}

/* ---- streaming ---------------------------------------------------------------------------- */

static int start(cn_job *j) {
    if (j->sent_role) return CN_OK;
    j->sent_role = 1;
    cJSON *content, *o = typed("message_start");
    cJSON_AddItemToObject(o, "message", message(j, 0, &content));
    return cn_api_send_event(j, "message_start", o);
}

static int block_start(cn_job *j, int kind, cJSON *block) {
    cJSON *o = typed("content_block_start");
    cJSON_AddNumberToObject(o, "index", j->n_blocks);
    cJSON_AddItemToObject(o, "content_block", block);
    j->n_blocks++;
    j->open_block = kind;
    return cn_api_send_event(j, "content_block_start", o);
}

/* A delta of the open block (the last started); deletes delta on error too. */
static int block_delta(cn_job *j, cJSON *delta) {
    cJSON *o = typed("content_block_delta");
    cJSON_AddNumberToObject(o, "index", j->n_blocks - 1);
    cJSON_AddItemToObject(o, "delta", delta);
    return cn_api_send_event(j, "content_block_delta", o);
}

static int block_stop(cn_job *j) {
    int kind = j->open_block, rc = CN_OK;
    j->open_block = BLOCK_NONE;
    if (kind == BLOCK_THINKING) { /* (1): the signature before the block stops */
        cJSON *d = typed("signature_delta");
        cJSON_AddStringToObject(d, "signature", signature(j));
        if ((rc = block_delta(j, d))) return rc;
    }
    cJSON *o = typed("content_block_stop");
    cJSON_AddNumberToObject(o, "index", j->n_blocks - 1);
    return cn_api_send_event(j, "content_block_stop", o);
}

static int progress(cn_job *j, int done, int total) {
    (void)done;
    (void)total;
    if (!j->sent_role) return start(j);
    return cn_chan_puts(&j->chan, PING);
}

static int text(cn_job *j, int thinking, const char *s, size_t n) {
    int kind = thinking ? BLOCK_THINKING : BLOCK_TEXT, rc;
    if ((rc = start(j))) return rc;
    if (j->open_block != kind) {
        if (j->open_block && (rc = block_stop(j))) return rc;
        if ((rc = block_start(j, kind, thinking ? thinking_block(j, "", 0) : text_block(""))))
            return rc;
    }
    char *t = strndup(s, n);
    if (!t) return CN_ENOMEM;
    cJSON *d = typed(thinking ? "thinking_delta" : "text_delta");
    cJSON_AddStringToObject(d, thinking ? "thinking" : "text", t);
    free(t);
    return block_delta(j, d);
}

static int tool_call(cn_job *j, int index) {
    int rc;
    if ((rc = start(j))) return rc;
    if (j->open_block && (rc = block_stop(j))) return rc;
    if ((rc = block_start(j, BLOCK_NONE, tool_use_block(j, index, 0)))) return rc;
    cJSON *d = typed("input_json_delta");
    cJSON_AddStringToObject(d, "partial_json", j->calls[index].arguments);
    if ((rc = block_delta(j, d))) return rc;
    cJSON *o = typed("content_block_stop");
    cJSON_AddNumberToObject(o, "index", j->n_blocks - 1);
    return cn_api_send_event(j, "content_block_stop", o);
}

/* ---- the end ------------------------------------------------------------------------------ */

static int error_frame(cn_job *j, int rc) {
    cJSON *o = typed("error");
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    /* a server shutting down is worth a retry elsewhere or later */
    cJSON_AddStringToObject(e, "type", rc == CN_ECANCELED ? "overloaded_error" : "api_error");
    cJSON_AddStringToObject(e, "message", cn_strerror(rc));
    return j->stream ? cn_api_send_event(j, "error", o) : cn_api_send(j, "", o, "\n");
}

static int final(cn_job *j, int rc) {
    if (rc) return error_frame(j, rc);
    int w;
    if (j->stream) {
        if ((w = start(j))) return w;
        if (j->open_block && (w = block_stop(j))) return w;
        cJSON *o = typed("message_delta");
        cJSON *d = cJSON_AddObjectToObject(o, "delta");
        add_stop(d, j, 1);
        cJSON_AddItemToObject(o, "usage", usage(j));
        if ((w = cn_api_send_event(j, "message_delta", o))) return w;
        return cn_api_send_event(j, "message_stop", typed("message_stop"));
    }
    cJSON *content, *o = message(j, 1, &content);
    if (j->thinking_len) cJSON_AddItemToArray(content, thinking_block(j, cn_job_thinking(j), 1));
    if (j->content_len) cJSON_AddItemToArray(content, text_block(cn_job_content(j)));
    for (int i = 0; i < j->n_calls; i++) cJSON_AddItemToArray(content, tool_use_block(j, i, 1));
    return cn_api_send(j, "", o, "\n");
}

/* A non-streaming body may start with whitespace (server.c sends spaces then). */
const cn_api_ops cn_anthropic_ops = {"text/event-stream", PING, progress, text, tool_call, final};
