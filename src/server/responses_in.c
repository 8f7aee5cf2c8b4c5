/* responses_in.c - /v1/responses request bodies (OpenAI's Responses API, stateless) into jobs.
 *
 * The request is mapped onto the chat request chat.h reads, then parsed and rendered as a
 * /v1/chat/completions body with the same conversation would be, so both endpoints give one
 * prompt for one conversation:
 *   instructions                  -> a first system message
 *   message (role user, assistant,
 *     system, developer = system) -> a message; content a string or input_text / output_text /
 *                                    refusal parts (joined with "\n", as chat.c joins parts)
 *   reasoning                     -> the reasoning of the assistant turn it opens (its content
 *                                    text, else its summary text; encrypted_content is ignored)
 *   function_call                 -> a tool call of the current assistant turn
 *   function_call_output          -> a tool message
 * A reasoning item, an assistant message and the function calls after them are one assistant
 * turn, as the Responses API splits a turn into items. An item without "type" but with "role"
 * is a message. tools of type "function" (the flat {type, name, description, parameters,
 * strict} shape) become chat tools {type, function: {name, description, parameters}}; other
 * types (web_search, namespace, local_shell, custom, ...) are left out with one log line,
 * since clients like Codex always send some. reasoning.effort "none"/"minimal" turns thinking
 * off, any other level on; absent, the template's default holds. An empty input renders what
 * the template gives for an empty system turn (the instructions, or nothing): a probe gets an
 * answer, not an error.
 *
 * Honoured besides: model, stream, max_output_tokens, temperature, top_p, tool_choice (auto,
 * none: no tools in the prompt, required and {type: function, name}: one call is forced),
 * parallel_tool_calls (echoed), text.format (text, json_object, json_schema: the output is
 * constrained to JSON once thinking ends). Accepted and echoed or ignored: store, include,
 * prompt_cache_key, client_metadata, metadata, truncation, service_tier, user and unknown
 * fields. Refused by name: previous_response_id and conversation (cairn stores nothing: the
 * whole input must come each time, and the prefix cache makes the repeat cheap), background,
 * item_reference items, input_image / input_file / input_audio parts (text-only model), and
 * what the chat builders refuse. A streaming request whose prompt is past the context is
 * answered as Codex expects it: response.created then response.failed with code
 * context_length_exceeded (see request.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "server/api.h"
#include "server/request.h"
#include "text/chat.h"
#include "text/pyjson.h"
#include "text/strbuf.h"

#define OOM(r) cn_refuse(r, 500, NULL, "out of memory")

static const cJSON *get(const cJSON *o, const char *key) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static int absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* ---- input items -> chat messages ------------------------------------------------------------ */

typedef struct conv {
    cJSON *msgs;      /* the chat's messages array */
    cJSON *turn;      /* the assistant message items are joining, or NULL */
    cn_refusal *r;
} conv;

/* The assistant turn an item of the given kind joins: the open one, unless the item cannot
 * follow what it holds (fresh: reasoning or a message after content or calls). */
static cJSON *turn(conv *c, int fresh) {
    if (c->turn && fresh) {
        const cJSON *content = get(c->turn, "content");
        if (get(c->turn, "tool_calls") || (cJSON_IsString(content) && *content->valuestring))
            c->turn = NULL;
    }
    if (c->turn) return c->turn;
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddItemToArray(c->msgs, m);
    if (!cJSON_AddStringToObject(m, "role", "assistant") || !cJSON_AddStringToObject(m, "content", ""))
        return NULL;
    return c->turn = m;
}

/* Joins the text parts of content (a string, or parts of the given types) into b; refuses the
 * media parts by name. where: "input[3].content". */
static int text_parts(const cJSON *content, const char *where, int output_ok, cn_strbuf *b,
                      cn_refusal *r) {
    if (cJSON_IsString(content)) {
        cn_strbuf_puts(b, content->valuestring);
        return CN_OK;
    }
    if (!cJSON_IsArray(content))
        return cn_refuse(r, 400, "input", "%s: expected a string or an array of content parts", where);
    int k = 0;
    for (const cJSON *p = content->child; p; p = p->next, k++) {
        const cJSON *t = get(p, "type");
        if (!cJSON_IsString(t))
            return cn_refuse(r, 400, "input", "%s[%d].type: expected a string", where, k);
        const char *ty = t->valuestring, *key = "text";
        if (!strcmp(ty, "input_image") || !strcmp(ty, "input_file") || !strcmp(ty, "input_audio"))
            return cn_refuse(r, 400, "input",
                             "%s[%d]: %s parts are not supported: the loaded model reads text only",
                             where, k, ty);
        if (!strcmp(ty, "refusal") && output_ok) key = "refusal";
        else if (strcmp(ty, "input_text") && strcmp(ty, "output_text") && strcmp(ty, "text"))
            return cn_refuse(r, 400, "input", "%s[%d]: content parts of type \"%.64s\" are not supported",
                             where, k, ty);
        const cJSON *x = get(p, key);
        if (!cJSON_IsString(x))
            return cn_refuse(r, 400, "input", "%s[%d].%s: expected a string", where, k, key);
        if (k) cn_strbuf_putc(b, '\n');
        cn_strbuf_puts(b, x->valuestring);
    }
    return CN_OK;
}

static int add_string(cJSON *o, const char *key, const char *s, cn_refusal *r) {
    return cJSON_AddStringToObject(o, key, s) ? CN_OK : OOM(r);
}

static int message_item(conv *c, const cJSON *it, const char *where, cn_refusal *r) {
    const cJSON *role = get(it, "role");
    if (!cJSON_IsString(role))
        return cn_refuse(r, 400, "input", "%s.role: expected \"user\", \"assistant\", \"system\" or \"developer\"", where);
    const char *ro = role->valuestring;
    int assistant = !strcmp(ro, "assistant");
    if (!assistant && strcmp(ro, "user") && strcmp(ro, "system") && strcmp(ro, "developer"))
        return cn_refuse(r, 400, "input",
                         "%s.role: unknown role \"%.64s\" (expected user, assistant, system or developer)",
                         where, ro);
    char w[80];
    snprintf(w, sizeof w, "%s.content", where);
    cn_strbuf b = CN_STRBUF_INIT;
    int rc = text_parts(get(it, "content"), w, assistant, &b, r);
    char *text = NULL;
    if (!rc && cn_strbuf_take(&b, &text, NULL)) rc = OOM(r);
    cn_strbuf_free(&b);
    if (rc) return rc;
    if (!text && !(text = strdup(""))) return OOM(r);
    if (assistant) {
        cJSON *m = turn(c, 1);
        rc = m ? CN_OK : OOM(r);
        if (!rc) rc = cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(text))
                          ? CN_OK : OOM(r);
    } else {
        c->turn = NULL;
        cJSON *m = cJSON_CreateObject();
        if (!m) rc = OOM(r);
        else {
            cJSON_AddItemToArray(c->msgs, m);
            rc = add_string(m, "role", !strcmp(ro, "user") ? "user" : "system", r);
            if (!rc) rc = add_string(m, "content", text, r);
        }
    }
    free(text);
    return rc;
}

/* A reasoning item's text: its reasoning_text content, else its summary. */
static int reasoning_item(conv *c, const cJSON *it, const char *where, cn_refusal *r) {
    cn_strbuf b = CN_STRBUF_INIT;
    const char *keys[2] = {"content", "summary"};
    for (int pass = 0; pass < 2 && !b.len; pass++) {
        const cJSON *parts = get(it, keys[pass]);
        if (absent(parts)) continue;
        if (!cJSON_IsArray(parts)) {
            cn_strbuf_free(&b);
            return cn_refuse(r, 400, "input", "%s.%s: expected an array of text parts", where, keys[pass]);
        }
        int k = 0;
        for (const cJSON *p = parts->child; p; p = p->next, k++) {
            const cJSON *x = get(p, "text");
            if (!cJSON_IsString(x)) {
                cn_strbuf_free(&b);
                return cn_refuse(r, 400, "input", "%s.%s[%d].text: expected a string", where, keys[pass], k);
            }
            if (b.len) cn_strbuf_putc(&b, '\n');
            cn_strbuf_puts(&b, x->valuestring);
        }
    }
    char *text = NULL;
    if (cn_strbuf_take(&b, &text, NULL)) return OOM(r);
    if (!text) return CN_OK; /* only encrypted content: nothing cairn can read */
    int rc = CN_OK;
    cJSON *m = turn(c, 1);
    if (!m) rc = OOM(r);
    else {
        const cJSON *prev = get(m, "reasoning_content");
        if (cJSON_IsString(prev)) { /* several reasoning items in a row: one reasoning */
            cn_strbuf j = CN_STRBUF_INIT;
            cn_strbuf_puts(&j, prev->valuestring);
            cn_strbuf_putc(&j, '\n');
            cn_strbuf_puts(&j, text);
            free(text);
            text = NULL;
            if (cn_strbuf_take(&j, &text, NULL)) rc = OOM(r);
            cJSON_DeleteItemFromObjectCaseSensitive(m, "reasoning_content");
        }
        if (!rc) rc = add_string(m, "reasoning_content", text, r);
    }
    free(text);
    return rc;
}

static int call_item(conv *c, const cJSON *it, const char *where, cn_refusal *r) {
    const cJSON *name = get(it, "name"), *args = get(it, "arguments"), *id = get(it, "call_id");
    if (!cJSON_IsString(name)) return cn_refuse(r, 400, "input", "%s.name: expected a string", where);
    if (!cJSON_IsString(args)) return cn_refuse(r, 400, "input", "%s.arguments: expected a JSON string", where);
    if (!absent(id) && !cJSON_IsString(id))
        return cn_refuse(r, 400, "input", "%s.call_id: expected a string", where);
    cJSON *m = turn(c, 0);
    if (!m) return OOM(r);
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(m, "tool_calls"))) return OOM(r);
    cJSON *tc = cJSON_CreateObject(), *fn;
    if (!tc) return OOM(r);
    cJSON_AddItemToArray(calls, tc);
    if (cJSON_IsString(id) && !cJSON_AddStringToObject(tc, "id", id->valuestring)) return OOM(r);
    if (!cJSON_AddStringToObject(tc, "type", "function") || !(fn = cJSON_AddObjectToObject(tc, "function")) ||
        !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
        !cJSON_AddStringToObject(fn, "arguments", args->valuestring))
        return OOM(r);
    return CN_OK;
}

static int output_item(conv *c, const cJSON *it, const char *where, cn_refusal *r) {
    const cJSON *id = get(it, "call_id"), *out = get(it, "output");
    if (!absent(id) && !cJSON_IsString(id))
        return cn_refuse(r, 400, "input", "%s.call_id: expected a string", where);
    char w[80];
    snprintf(w, sizeof w, "%s.output", where);
    cn_strbuf b = CN_STRBUF_INIT;
    int rc = text_parts(out, w, 0, &b, r);
    char *text = NULL;
    if (!rc && cn_strbuf_take(&b, &text, NULL)) rc = OOM(r);
    cn_strbuf_free(&b);
    if (rc) return rc;
    c->turn = NULL;
    cJSON *m = cJSON_CreateObject();
    if (!m) rc = OOM(r);
    else {
        cJSON_AddItemToArray(c->msgs, m);
        rc = add_string(m, "role", "tool", r);
        if (!rc) rc = add_string(m, "content", text ? text : "", r);
        if (!rc && cJSON_IsString(id)) rc = add_string(m, "tool_call_id", id->valuestring, r);
    }
    free(text);
    return rc;
}

/* instructions and input into chat messages (at least one). */
static int messages(const cJSON *root, cJSON *msgs, cn_refusal *r) {
    conv c = {msgs, NULL, r};
    const cJSON *ins = get(root, "instructions"), *in = get(root, "input");
    if (!absent(ins) && !cJSON_IsString(ins))
        return cn_refuse(r, 400, "instructions", "instructions must be a string");
    if (!absent(ins)) {
        cJSON *m = cJSON_CreateObject();
        if (!m) return OOM(r);
        cJSON_AddItemToArray(msgs, m);
        int rc;
        if ((rc = add_string(m, "role", "system", r)) || (rc = add_string(m, "content", ins->valuestring, r)))
            return rc;
    }
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        if (!m) return OOM(r);
        cJSON_AddItemToArray(msgs, m);
        int rc;
        if ((rc = add_string(m, "role", "user", r)) || (rc = add_string(m, "content", in->valuestring, r)))
            return rc;
    } else if (cJSON_IsArray(in)) {
        int k = 0;
        for (const cJSON *it = in->child; it; it = it->next, k++) {
            char where[32];
            snprintf(where, sizeof where, "input[%d]", k);
            if (!cJSON_IsObject(it)) return cn_refuse(r, 400, "input", "%s: expected an object", where);
            const cJSON *t = get(it, "type");
            const char *ty = cJSON_IsString(t) ? t->valuestring : absent(t) && get(it, "role") ? "message" : NULL;
            if (!ty) return cn_refuse(r, 400, "input", "%s.type: expected a string", where);
            int rc;
            if (!strcmp(ty, "message")) rc = message_item(&c, it, where, r);
            else if (!strcmp(ty, "reasoning")) rc = reasoning_item(&c, it, where, r);
            else if (!strcmp(ty, "function_call")) rc = call_item(&c, it, where, r);
            else if (!strcmp(ty, "function_call_output")) rc = output_item(&c, it, where, r);
            else if (!strcmp(ty, "item_reference"))
                rc = cn_refuse(r, 400, "input", "%s: item_reference is not supported: cairn stores no "
                               "items; send the item itself", where);
            else
                rc = cn_refuse(r, 400, "input", "%s: items of type \"%.64s\" are not supported", where, ty);
            if (rc) return rc;
        }
    } else if (!absent(in)) {
        return cn_refuse(r, 400, "input", "input must be a string or an array of items");
    }
    if (!msgs->child) { /* an empty probe: the template's empty system turn, then the answer */
        cJSON *m = cJSON_CreateObject();
        if (!m) return OOM(r);
        cJSON_AddItemToArray(msgs, m);
        int rc;
        if ((rc = add_string(m, "role", "system", r)) || (rc = add_string(m, "content", "", r))) return rc;
    }
    return CN_OK;
}

/* ---- tools --------------------------------------------------------------------------------- */

/* The function tools as chat tools; the others are named in one log line. */
static int tools(const cJSON *root, const char *id, cJSON *out, cn_refusal *r) {
    const cJSON *ts = get(root, "tools");
    if (absent(ts)) return CN_OK;
    if (!cJSON_IsArray(ts)) return cn_refuse(r, 400, "tools", "tools must be an array");
    char skipped[256] = "";
    size_t sl = 0;
    int k = 0;
    for (const cJSON *t = ts->child; t; t = t->next, k++) {
        const cJSON *ty = get(t, "type");
        if (!cJSON_IsString(ty)) return cn_refuse(r, 400, "tools", "tools[%d].type: expected a string", k);
        if (strcmp(ty->valuestring, "function")) {
            if (sl < sizeof skipped - 1)
                sl += (size_t)snprintf(skipped + sl, sizeof skipped - sl, "%s%s", sl ? ", " : "", ty->valuestring);
            continue;
        }
        const cJSON *name = get(t, "name"), *desc = get(t, "description"), *params = get(t, "parameters");
        if (!cJSON_IsString(name)) return cn_refuse(r, 400, "tools", "tools[%d].name: expected a string", k);
        if (!absent(desc) && !cJSON_IsString(desc))
            return cn_refuse(r, 400, "tools", "tools[%d].description: expected a string", k);
        if (!absent(params) && !cJSON_IsObject(params))
            return cn_refuse(r, 400, "tools", "tools[%d].parameters: expected a JSON schema object", k);
        /* strict is the API's promise about arguments, not part of what the model reads */
        cJSON *ct = cJSON_CreateObject(), *fn;
        if (!ct) return OOM(r);
        cJSON_AddItemToArray(out, ct);
        if (!cJSON_AddStringToObject(ct, "type", "function") || !(fn = cJSON_AddObjectToObject(ct, "function")) ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
            (!absent(desc) && !cJSON_AddStringToObject(fn, "description", desc->valuestring)))
            return OOM(r);
        cJSON *p = absent(params) ? NULL : cJSON_Duplicate(params, 1);
        if (!absent(params) && !p) return OOM(r);
        if (p) cJSON_AddItemToObject(fn, "parameters", p);
    }
    if (sl) cn_log(CN_LOG_INFO, "request %s: tools of type %s left out (cairn serves function tools)", id, skipped);
    return CN_OK;
}

/* ---- the rest of the body ------------------------------------------------------------------ */

/* The echo member key: the request's value, or dflt (owned) when absent. */
static int echo(cJSON *e, const cJSON *root, const char *key, cJSON *dflt, cn_refusal *r) {
    const cJSON *v = get(root, key);
    cJSON *x = absent(v) ? dflt : cJSON_Duplicate(v, 1);
    if (!absent(v)) cJSON_Delete(dflt);
    if (!x) return OOM(r);
    cJSON_AddItemToObject(e, key, x);
    return CN_OK;
}

/* Everything but the prompt: refusals of what cairn cannot do, sampling, length, stream, the
 * thinking switch (*think: -1 template default) and the fields the response echoes. */
static int options(cn_job *j, const cJSON *root, int *think, cn_refusal *r) {
    const char *stateful[] = {"previous_response_id", "conversation"};
    for (int i = 0; i < 2; i++)
        if (!absent(get(root, stateful[i])))
            return cn_refuse(r, 400, stateful[i],
                             "%s is not supported: cairn stores no responses; send the whole "
                             "conversation in input each time (the prefix cache makes the "
                             "repeated part cheap)", stateful[i]);
    const cJSON *bg = get(root, "background");
    if (cJSON_IsTrue(bg)) return cn_refuse(r, 400, "background", "background responses are not supported");
    int rc = cn_req_bool(root, "stream", &j->stream, r);
    if (rc) return rc;
    int parallel = 1;
    if ((rc = cn_req_bool(root, "parallel_tool_calls", &parallel, r))) return rc;
    cn_sampler_params *s = &j->sampling;
    s->temperature = 1.0f; /* OpenAI's defaults */
    s->top_p = 1.0f;
    s->top_k = 0;
    double t = s->temperature, p = s->top_p, mt = -1;
    if ((rc = cn_req_number(root, "temperature", 0, 2, &t, r)) ||
        (rc = cn_req_number(root, "top_p", 1e-9, 1, &p, r)) ||
        (rc = cn_req_number(root, "max_output_tokens", 1, 1e9, &mt, r)))
        return rc;
    s->temperature = (float)t;
    s->top_p = (float)p;
    if (mt >= 0) j->max_tokens = (int)mt;
    *think = -1;
    const cJSON *rs = get(root, "reasoning"), *eff = get(rs, "effort");
    if (!absent(rs) && !cJSON_IsObject(rs)) return cn_refuse(r, 400, "reasoning", "reasoning must be an object");
    if (!absent(eff)) {
        const char *levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        int lv = -1;
        for (int i = 0; i < 6 && cJSON_IsString(eff); i++)
            if (!strcmp(eff->valuestring, levels[i])) lv = i;
        if (lv < 0)
            return cn_refuse(r, 400, "reasoning.effort",
                             "reasoning.effort must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
        *think = lv >= 2;
    }
    /* the response object repeats these */
    cJSON *e = j->echo = cJSON_CreateObject(), *fmt;
    if (!e) return OOM(r);
    cJSON *text_d = cJSON_CreateObject(), *reason_d = cJSON_CreateObject();
    if (text_d && (fmt = cJSON_AddObjectToObject(text_d, "format"))) cJSON_AddStringToObject(fmt, "type", "text");
    if (reason_d) cJSON_AddNullToObject(reason_d, "effort"), cJSON_AddNullToObject(reason_d, "summary");
    if ((rc = echo(e, root, "instructions", cJSON_CreateNull(), r)) ||
        (rc = echo(e, root, "max_output_tokens", cJSON_CreateNull(), r)) ||
        (rc = echo(e, root, "metadata", cJSON_CreateObject(), r)) ||
        (rc = echo(e, root, "parallel_tool_calls", cJSON_CreateBool(parallel), r)) ||
        (rc = echo(e, root, "reasoning", reason_d, r)) ||
        (rc = echo(e, root, "temperature", cJSON_CreateNumber(t), r)) ||
        (rc = echo(e, root, "text", text_d, r)) ||
        (rc = echo(e, root, "tool_choice", cJSON_CreateString("auto"), r)) ||
        (rc = echo(e, root, "tools", cJSON_CreateArray(), r)) ||
        (rc = echo(e, root, "top_p", cJSON_CreateNumber(p), r)) ||
        (rc = echo(e, root, "truncation", cJSON_CreateString("disabled"), r)))
        return rc;
    if (!cJSON_AddFalseToObject(e, "store") || !cJSON_AddNullToObject(e, "previous_response_id"))
        return OOM(r);
    return CN_OK;
}

/* text.format: *json 1 for JSON output, *schema its schema (NULL: any object). */
static int text_format(const cJSON *root, int *json, const cJSON **schema, cn_refusal *r) {
    *json = 0;
    *schema = NULL;
    const cJSON *tx = get(root, "text"), *f = get(tx, "format");
    if (!absent(tx) && !cJSON_IsObject(tx)) return cn_refuse(r, 400, "text", "text must be an object");
    if (absent(f)) return CN_OK;
    const cJSON *t = get(f, "type");
    if (!cJSON_IsString(t)) return cn_refuse(r, 400, "text.format", "text.format must be an object with a type");
    if (!strcmp(t->valuestring, "json_object")) {
        *json = 1;
    } else if (!strcmp(t->valuestring, "json_schema")) {
        *schema = get(f, "schema");
        if (!cJSON_IsObject(*schema))
            return cn_refuse(r, 400, "text.format", "text.format.schema must be a JSON schema object");
        *json = 1;
    } else if (strcmp(t->valuestring, "text")) {
        return cn_refuse(r, 400, "text.format",
                         "text.format.type must be \"text\", \"json_object\" or \"json_schema\"");
    }
    return CN_OK;
}

/* tool_choice: *no_tools for "none", *force for a required call, *only its one function. */
static int tool_choice(const cJSON *root, int *no_tools, int *force, const char **only, cn_refusal *r) {
    *no_tools = *force = 0;
    *only = NULL;
    const cJSON *tc = get(root, "tool_choice");
    if (absent(tc) || (cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto"))) return CN_OK;
    const cJSON *ty = get(tc, "type"), *nm = get(tc, "name");
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) *no_tools = 1;
    else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) *force = 1;
    else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "function") && cJSON_IsString(nm))
        *force = 1, *only = nm->valuestring;
    else
        return cn_refuse(r, 400, "tool_choice",
                         "tool_choice must be \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"name\": ...}");
    return CN_OK;
}

/* The chat request text chat.h reads: messages, tools and the thinking switch, printed with
 * Python's number rules so the tools' schemas reach the template as the client wrote them. */
static int chat_json(const cJSON *root, const char *id, int think, int no_tools, char **out,
                     size_t *len, cn_refusal *r) {
    cJSON *doc = cJSON_CreateObject(), *msgs, *ts;
    if (!doc || !(msgs = cJSON_AddArrayToObject(doc, "messages")) || !(ts = cJSON_AddArrayToObject(doc, "tools"))) {
        cJSON_Delete(doc);
        return OOM(r);
    }
    int rc = messages(root, msgs, r);
    if (!rc) rc = tools(root, id, ts, r);
    if (!rc && no_tools) cJSON_DeleteItemFromObjectCaseSensitive(doc, "tools"); /* "none": not told of them */
    if (!rc && think >= 0) {
        cJSON *kw = cJSON_AddObjectToObject(doc, "chat_template_kwargs");
        if (!kw || !cJSON_AddBoolToObject(kw, "enable_thinking", think)) rc = OOM(r);
    }
    if (!rc) {
        cn_strbuf b = CN_STRBUF_INIT;
        cn_py_dumps(&b, doc);
        if (cn_strbuf_take(&b, out, len)) rc = OOM(r);
    }
    cJSON_Delete(doc);
    return rc;
}

int cn_responses_request(const cn_api_env *env, const char *body, size_t len, cn_job **out,
                         cn_refusal *r) {
    *out = NULL;
    cJSON *root = NULL;
    int rc = cn_req_parse_json(body, len, &root, r); /* the checks with their messages */
    if (rc) return rc;
    cJSON_Delete(root);
    root = NULL;
    cn_err err;
    cn_err_clear(&err);
    if ((rc = cn_pyjson_parse(body, len, &root, &err))) /* numbers keep their literals */
        return rc == CN_ENOMEM ? OOM(r) : cn_refuse(r, 400, NULL, "%s", err.msg);
    cn_job *j = NULL;
    cn_chat chat;
    memset(&chat, 0, sizeof chat);
    char *text = NULL;
    size_t tlen = 0;
    if ((rc = cn_req_check_model(env, root, r))) goto out;
    if (!(j = cn_req_new_job(env, root, CN_API_RESPONSES, "resp_"))) {
        rc = OOM(r);
        goto out;
    }
    int think = -1, json = 0, no_tools = 0, force = 0;
    const cJSON *schema = NULL;
    const char *only = NULL;
    if ((rc = options(j, root, &think, r)) || (rc = text_format(root, &json, &schema, r)) ||
        (rc = tool_choice(root, &no_tools, &force, &only, r)))
        goto out;
    if (force && json) {
        rc = cn_refuse(r, 400, "tool_choice", "a forced tool call cannot also be JSON output (text.format)");
        goto out;
    }
    if ((rc = chat_json(root, j->id, think, no_tools, &text, &tlen, r))) goto out;
    if ((rc = cn_chat_parse(&chat, text, tlen, &err))) {
        rc = rc == CN_ENOMEM ? OOM(r) : cn_refuse(r, 400, "input", "%s", err.msg);
        goto out;
    }
    if ((rc = cn_req_render_chat(env, j, &chat, r))) {
        if (r->param && !strcmp(r->param, "messages")) r->param = "input";
        if (j->stream && r->code && !strcmp(r->code, "context_length_exceeded")) {
            /* Codex reads this only as a stream event: answer it so, without the engine */
            rc = cn_responses_fail_stream(j, r->code, r->msg);
            if (rc) rc = OOM(r);
        }
        goto out;
    }
    if (json) rc = cn_req_json_constraint(env, j, schema, "text.format", r);
    else if (force) rc = cn_req_tool_constraint(env, j, only, r);
    if (!rc && j->stream && cn_responses_open_stream(j)) rc = OOM(r); /* before queueing: a queued
                                                                         * request shows it began */
out:
    free(text);
    cn_chat_free(&chat);
    cJSON_Delete(root);
    if (rc) cn_job_unref(j);
    else *out = j;
    return rc;
}
