/* anthropic_in.c - /v1/messages and /v1/messages/count_tokens request bodies into jobs.
 *
 * Anthropic's Messages API, as Claude Code and @anthropic-ai/sdk send it, becomes the parsed chat
 * (chat.h) that the model's renderer takes:
 *   (1) system (a string or text blocks, joined with "\n") is the system turn. Text starting with
 *       "x-anthropic-billing-header:" (Claude Code's first block, whose values change on every
 *       request) is left out, up to its first newline, so the prefix cache hits from token 0.
 *   (2) A user message's text blocks are a user turn and its tool_result blocks tool turns, in
 *       order (text before a result ends a user turn there). A result's content is a string or
 *       text blocks (and tool_reference blocks, as their tool's name), joined with "\n";
 *       is_error prefixes it with "Error: ".
 *   (3) An assistant message's text blocks are its content, its thinking blocks its reasoning and
 *       its tool_use blocks its calls (input: an object); redacted_thinking holds no text and is
 *       dropped.
 *   (4) tools {name, description, input_schema} become function tools. Server tools (a type other
 *       than "custom", e.g. web_search_20250305) are left out of the prompt with one log line.
 *       tool_choice: auto; any (one call of an offered tool); tool (one call of that name); none
 *       (no tools in the prompt); disable_parallel_tool_use is accepted.
 *   (5) thinking {type: enabled | adaptive} turns reasoning on, disabled off; absent: the
 *       template's default. budget_tokens is accepted (the model thinks as long as it needs).
 *   (6) max_tokens defaults to 4096 (llama.cpp's), and like any value is clamped to the room left;
 *       temperature in [0, 1] (default 1), top_p, top_k (default off), stop_sequences, stream.
 * Refused by name: image and document blocks (the model reads text only), block types it does
 * not know, wrong types. Fields it does not know (metadata, cache_control, context_management,
 * output_config, ...) are accepted and ignored.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "server/request.h"
#include "text/chat.h"
#include "text/pyjson.h"
#include "text/strbuf.h"

#define BILLING_HEADER "x-anthropic-billing-header:"

static const cJSON *get(const cJSON *o, const char *key) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static int oom(cn_refusal *r) { return cn_refuse(r, 500, NULL, "out of memory"); }

/* A new zeroed message at the chat's end; NULL without memory. */
static cn_chat_message *add_message(cn_chat *c, int *cap, cn_chat_role role) {
    if (c->n_messages == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        cn_chat_message *nm = realloc(c->messages, (size_t)nc * sizeof *nm);
        if (!nm) return NULL;
        c->messages = nm;
        *cap = nc;
    }
    cn_chat_message *m = &c->messages[c->n_messages++];
    memset(m, 0, sizeof *m);
    m->role = role;
    return m;
}

/* Adds a message whose content is b's text (b left empty). */
static int add_text_message(cn_chat *c, int *cap, cn_chat_role role, cn_strbuf *b, cn_refusal *r) {
    cn_chat_message *m = add_message(c, cap, role);
    if (!m || cn_strbuf_take(b, &m->content, NULL)) return oom(r);
    return CN_OK;
}

/* Text for the prompt: the billing header, which changes per request, is left out (1). */
static void put_system_text(cn_strbuf *b, const char *s, int *any) {
    if (!strncmp(s, BILLING_HEADER, strlen(BILLING_HEADER))) {
        const char *nl = strchr(s, '\n');
        if (!nl) return;
        s = nl + 1;
    }
    if (*any) cn_strbuf_putc(b, '\n');
    cn_strbuf_puts(b, s);
    *any = 1;
}

static int read_system(const cJSON *root, cn_chat *c, int *cap, cn_refusal *r) {
    const cJSON *sys = get(root, "system");
    if (!sys || cJSON_IsNull(sys)) return CN_OK;
    cn_strbuf b = CN_STRBUF_INIT;
    int any = 0;
    if (cJSON_IsString(sys)) {
        put_system_text(&b, sys->valuestring, &any);
    } else if (cJSON_IsArray(sys)) {
        int k = 0;
        for (const cJSON *blk = sys->child; blk; blk = blk->next, k++) {
            const cJSON *t = get(blk, "type"), *x = get(blk, "text");
            if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x)) {
                cn_strbuf_free(&b);
                return cn_refuse(r, 400, "system", "system[%d] must be a text block {\"type\": "
                                 "\"text\", \"text\": ...}", k);
            }
            put_system_text(&b, x->valuestring, &any);
        }
    } else {
        return cn_refuse(r, 400, "system", "system must be a string or an array of text blocks");
    }
    if (!any) {
        cn_strbuf_free(&b);
        return CN_OK;
    }
    return add_text_message(c, cap, CN_CHAT_SYSTEM, &b, r);
}

/* Refuses a block the model cannot read, naming where it is. */
static int refuse_block(const char *where, int k, const char *type, cn_refusal *r) {
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return cn_refuse(r, 400, "messages", "%s.content[%d]: %s blocks are not supported: the "
                         "loaded model reads text only", where, k, type);
    return cn_refuse(r, 400, "messages", "%s.content[%d]: a block of type \"%.64s\" is not "
                     "supported here", where, k, type);
}

/* A tool_result's content: a string or text blocks, joined with "\n". */
static int result_text(const cJSON *blk, const char *where, int k, cn_strbuf *b, cn_refusal *r) {
    if (cJSON_IsTrue(get(blk, "is_error"))) cn_strbuf_puts(b, "Error: ");
    const cJSON *c = get(blk, "content");
    if (!c || cJSON_IsNull(c)) return CN_OK;
    if (cJSON_IsString(c)) {
        cn_strbuf_puts(b, c->valuestring);
        return CN_OK;
    }
    if (!cJSON_IsArray(c))
        return cn_refuse(r, 400, "messages", "%s.content[%d].content must be a string or an "
                         "array of text blocks", where, k);
    int i = 0;
    for (const cJSON *x = c->child; x; x = x->next, i++) {
        const cJSON *t = get(x, "type"), *tx = get(x, "text");
        if (!cJSON_IsString(t))
            return cn_refuse(r, 400, "messages", "%s.content[%d].content[%d].type must be a "
                             "string", where, k, i);
        if (!strcmp(t->valuestring, "tool_reference") && cJSON_IsString(get(x, "tool_name"))) {
            tx = get(x, "tool_name"); /* a tool search's answer: the tool's name */
        } else if (strcmp(t->valuestring, "text")) {
            char w[96];
            snprintf(w, sizeof w, "%s.content[%d]", where, k);
            return refuse_block(w, i, t->valuestring, r);
        } else if (!cJSON_IsString(tx)) {
            return cn_refuse(r, 400, "messages", "%s.content[%d].content[%d].text must be a "
                             "string", where, k, i);
        }
        if (i) cn_strbuf_putc(b, '\n');
        cn_strbuf_puts(b, tx->valuestring);
    }
    return CN_OK;
}

/* (2): a user (or system) message's blocks into turns of that role and tool turns. */
static int read_user(const cJSON *content, cn_chat_role role, const char *where, cn_chat *c,
                     int *cap, cn_refusal *r) {
    cn_strbuf text = CN_STRBUF_INIT, res = CN_STRBUF_INIT;
    int has_text = 0, added = 0, rc = CN_OK, k = 0;
    for (const cJSON *blk = content->child; blk; blk = blk->next, k++) {
        const cJSON *t = get(blk, "type");
        if (!cJSON_IsString(t)) {
            rc = cn_refuse(r, 400, "messages", "%s.content[%d] must be a block with a type", where, k);
            break;
        }
        if (!strcmp(t->valuestring, "text")) {
            const cJSON *x = get(blk, "text");
            if (!cJSON_IsString(x)) {
                rc = cn_refuse(r, 400, "messages", "%s.content[%d].text must be a string", where, k);
                break;
            }
            if (has_text) cn_strbuf_putc(&text, '\n');
            cn_strbuf_puts(&text, x->valuestring);
            has_text = 1;
        } else if (!strcmp(t->valuestring, "tool_result")) {
            const cJSON *id = get(blk, "tool_use_id");
            if (id && !cJSON_IsString(id)) {
                rc = cn_refuse(r, 400, "messages", "%s.content[%d].tool_use_id must be a string",
                               where, k);
                break;
            }
            if (has_text && (rc = add_text_message(c, cap, role, &text, r))) break;
            has_text = 0;
            if ((rc = result_text(blk, where, k, &res, r))) break;
            if ((rc = add_text_message(c, cap, CN_CHAT_TOOL, &res, r))) break;
            cn_chat_message *m = &c->messages[c->n_messages - 1];
            if (id && !(m->tool_call_id = strdup(id->valuestring))) {
                rc = oom(r);
                break;
            }
            added = 1;
        } else {
            rc = refuse_block(where, k, t->valuestring, r);
            break;
        }
    }
    if (!rc && (has_text || !added)) rc = add_text_message(c, cap, role, &text, r);
    cn_strbuf_free(&text);
    cn_strbuf_free(&res);
    return rc;
}

/* (3): an assistant message's blocks into one assistant turn. */
static int read_assistant(const cJSON *content, const char *where, cn_chat *c, int *cap,
                          cn_refusal *r) {
    int n_calls = 0, k = 0;
    for (const cJSON *blk = content->child; blk; blk = blk->next)
        n_calls += cJSON_IsString(get(blk, "type")) &&
                   !strcmp(get(blk, "type")->valuestring, "tool_use");
    cn_chat_message *m = add_message(c, cap, CN_CHAT_ASSISTANT);
    if (!m) return oom(r);
    if (n_calls && !(m->tool_calls = calloc((size_t)n_calls, sizeof *m->tool_calls))) return oom(r);
    cn_strbuf text = CN_STRBUF_INIT, think = CN_STRBUF_INIT;
    int has_text = 0, has_think = 0, rc = CN_OK;
    for (const cJSON *blk = content->child; blk; blk = blk->next, k++) {
        const cJSON *t = get(blk, "type");
        if (!cJSON_IsString(t)) {
            rc = cn_refuse(r, 400, "messages", "%s.content[%d] must be a block with a type", where, k);
            break;
        }
        const char *type = t->valuestring;
        if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            int th = !strcmp(type, "thinking");
            const cJSON *x = get(blk, th ? "thinking" : "text");
            if (!cJSON_IsString(x)) {
                rc = cn_refuse(r, 400, "messages", "%s.content[%d].%s must be a string", where, k,
                               th ? "thinking" : "text");
                break;
            }
            if (th ? has_think : has_text) cn_strbuf_putc(th ? &think : &text, '\n');
            cn_strbuf_puts(th ? &think : &text, x->valuestring);
            *(th ? &has_think : &has_text) = 1;
        } else if (!strcmp(type, "redacted_thinking")) {
            continue; /* encrypted by Anthropic: nothing this model can read */
        } else if (!strcmp(type, "tool_use")) {
            const cJSON *id = get(blk, "id"), *name = get(blk, "name"), *in = get(blk, "input");
            if (!cJSON_IsString(name) || (id && !cJSON_IsString(id)) ||
                (in && !cJSON_IsNull(in) && !cJSON_IsObject(in))) {
                rc = cn_refuse(r, 400, "messages", "%s.content[%d] must be a tool_use block with a "
                               "string name and id and an object input", where, k);
                break;
            }
            cn_chat_tool_call *tc = &m->tool_calls[m->n_tool_calls++];
            if (!(tc->name = strdup(name->valuestring)) ||
                (id && !(tc->id = strdup(id->valuestring))) ||
                !(tc->arguments = cJSON_IsObject(in) ? cJSON_Duplicate(in, 1) : cJSON_CreateObject())) {
                rc = oom(r);
                break;
            }
        } else {
            rc = refuse_block(where, k, type, r);
            break;
        }
    }
    if (!rc && cn_strbuf_take(&text, &m->content, NULL)) rc = oom(r);
    if (!rc && has_think && cn_strbuf_take(&think, &m->reasoning, NULL)) rc = oom(r);
    if (!m->content && !(m->content = strdup(""))) rc = rc ? rc : oom(r); /* cn_chat_free's rules */
    cn_strbuf_free(&text);
    cn_strbuf_free(&think);
    return rc;
}

static int read_messages(const cJSON *root, cn_chat *c, int *cap, cn_refusal *r) {
    const cJSON *msgs = get(root, "messages");
    if (!msgs || cJSON_IsNull(msgs)) return cn_refuse(r, 400, "messages", "messages is required");
    if (!cJSON_IsArray(msgs)) return cn_refuse(r, 400, "messages", "messages must be an array");
    if (!msgs->child) return cn_refuse(r, 400, "messages", "messages must hold at least one message");
    int i = 0, rc;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        char where[32];
        snprintf(where, sizeof where, "messages[%d]", i);
        const cJSON *role = get(m, "role"), *content = get(m, "content");
        if (!cJSON_IsString(role))
            return cn_refuse(r, 400, "messages", "%s must be an object with a string role", where);
        int user = !strcmp(role->valuestring, "user"), asst = !strcmp(role->valuestring, "assistant");
        int sys = !strcmp(role->valuestring, "system"); /* mid-conversation system turns */
        if (!user && !asst && !sys)
            return cn_refuse(r, 400, "messages", "%s.role must be \"user\" or \"assistant\", got "
                             "\"%.64s\"", where, role->valuestring);
        cn_chat_role cr = user ? CN_CHAT_USER : asst ? CN_CHAT_ASSISTANT : CN_CHAT_SYSTEM;
        if (cJSON_IsString(content)) {
            cn_strbuf b = CN_STRBUF_INIT;
            cn_strbuf_puts(&b, content->valuestring);
            if ((rc = add_text_message(c, cap, cr, &b, r))) return rc;
            continue;
        }
        if (!cJSON_IsArray(content))
            return cn_refuse(r, 400, "messages", "%s.content must be a string or an array of "
                             "content blocks", where);
        rc = asst ? read_assistant(content, where, c, cap, r)
                  : read_user(content, cr, where, c, cap, r);
        if (rc) return rc;
    }
    return CN_OK;
}

/* (4): client tools as function tools; *skipped lists the server tools left out. */
static int read_tools(const cJSON *root, cn_chat *c, cn_strbuf *skipped, cn_refusal *r) {
    const cJSON *tools = get(root, "tools");
    if (!tools || cJSON_IsNull(tools)) return CN_OK;
    if (!cJSON_IsArray(tools)) return cn_refuse(r, 400, "tools", "tools must be an array");
    cJSON *out = cJSON_CreateArray();
    if (!out) return oom(r);
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        const cJSON *type = get(t, "type"), *name = get(t, "name"), *desc = get(t, "description");
        const cJSON *schema = get(t, "input_schema");
        if (!cJSON_IsObject(t) || (type && !cJSON_IsNull(type) && !cJSON_IsString(type)) ||
            !cJSON_IsString(name)) {
            cJSON_Delete(out);
            return cn_refuse(r, 400, "tools", "tools[%d] must be an object with a string name", k);
        }
        if (cJSON_IsString(type) && strcmp(type->valuestring, "custom")) {
            if (skipped->len) cn_strbuf_puts(skipped, ", ");
            cn_strbuf_puts(skipped, name->valuestring);
            cn_strbuf_putc(skipped, ' ');
            cn_strbuf_puts(skipped, type->valuestring);
            continue; /* run by Anthropic's servers, which are not here */
        }
        if ((desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc)) ||
            (schema && !cJSON_IsNull(schema) && !cJSON_IsObject(schema))) {
            cJSON_Delete(out);
            return cn_refuse(r, 400, "tools", "tools[%d]: description must be a string and "
                             "input_schema an object", k);
        }
        cJSON *ft = cJSON_CreateObject(), *fn = ft ? cJSON_AddObjectToObject(ft, "function") : NULL;
        int ok = fn && cJSON_AddItemToArray(out, ft);
        if (!ok) cJSON_Delete(ft);
        ok = ok && cJSON_AddStringToObject(ft, "type", "function") &&
             cJSON_AddStringToObject(fn, "name", name->valuestring) &&
             (!cJSON_IsString(desc) ||
              cJSON_AddItemToObject(fn, "description", cJSON_Duplicate(desc, 1))) &&
             (!cJSON_IsObject(schema) ||
              cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1)));
        if (!ok) {
            cJSON_Delete(out);
            return oom(r);
        }
    }
    if (out->child) c->tools = out;
    else cJSON_Delete(out);
    return CN_OK;
}

/* tool_choice: *no_tools for none, *force for any / tool (*only: the name, or NULL). */
static int read_tool_choice(const cJSON *root, int *no_tools, int *force, const char **only,
                            cn_refusal *r) {
    *no_tools = *force = 0;
    *only = NULL;
    const cJSON *tc = get(root, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) return CN_OK;
    const cJSON *t = get(tc, "type"), *name = get(tc, "name");
    const char *s = cJSON_IsString(t) ? t->valuestring : "";
    if (!strcmp(s, "auto")) return CN_OK;
    if (!strcmp(s, "none")) *no_tools = 1;
    else if (!strcmp(s, "any")) *force = 1;
    else if (!strcmp(s, "tool") && cJSON_IsString(name)) *force = 1, *only = name->valuestring;
    else
        return cn_refuse(r, 400, "tool_choice", "tool_choice must be {\"type\": \"auto\"}, "
                         "{\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", "
                         "\"name\": ...}");
    return CN_OK;
}

/* (5): 1 on, 0 off, -1 the template's default. */
static int read_thinking(const cJSON *root, int *on, cn_refusal *r) {
    *on = -1;
    const cJSON *th = get(root, "thinking");
    if (!th || cJSON_IsNull(th)) return CN_OK;
    const cJSON *t = get(th, "type");
    const char *s = cJSON_IsString(t) ? t->valuestring : "";
    if (!strcmp(s, "enabled") || !strcmp(s, "adaptive")) *on = 1;
    else if (!strcmp(s, "disabled")) *on = 0;
    else
        return cn_refuse(r, 400, "thinking", "thinking must be {\"type\": \"enabled\"}, "
                         "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}");
    return CN_OK;
}

/* (6) */
static int sampling(cn_job *j, const cJSON *root, cn_refusal *r) {
    cn_sampler_params *s = &j->sampling;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->top_k = 0;
    double t = s->temperature, p = s->top_p, k = 0, mt = 4096;
    int rc;
    if ((rc = cn_req_number(root, "temperature", 0, 1, &t, r)) ||
        (rc = cn_req_number(root, "top_p", 1e-9, 1, &p, r)) ||
        (rc = cn_req_number(root, "top_k", 0, 1e9, &k, r)) ||
        (rc = cn_req_number(root, "max_tokens", 1, 1e9, &mt, r)))
        return rc;
    s->temperature = (float)t;
    s->top_p = (float)p;
    s->top_k = (int)k;
    j->max_tokens = (int)mt;
    if ((rc = cn_req_bool(root, "stream", &j->stream, r))) return rc;
    const cJSON *stops = get(root, "stop_sequences");
    if (stops && !cJSON_IsNull(stops) && !cJSON_IsArray(stops))
        return cn_refuse(r, 400, "stop_sequences", "stop_sequences must be an array of strings");
    return cn_req_stops(j, stops, "stop_sequences", 64, r);
}

/* Both endpoints: the whole body into a job with its prompt set (count: no constraint, no log,
 * the prompt may be past the context). */
static int build(const cn_api_env *env, const char *body, size_t len, int count, cn_job **out,
                 cn_refusal *r) {
    *out = NULL;
    cJSON *root = NULL;
    int rc = cn_req_parse_json(body, len, &root, r); /* the shared refusals for broken bodies */
    cJSON_Delete(root);
    root = NULL;
    if (rc) return rc;
    cn_err err;
    cn_err_clear(&err);
    /* parsed again keeping number literals, which tool schemas and inputs render with */
    if ((rc = cn_pyjson_parse(body, len, &root, &err)))
        return rc == CN_ENOMEM ? oom(r) : cn_refuse(r, 400, NULL, "request body: %s", err.msg);
    cn_chat chat;
    memset(&chat, 0, sizeof chat);
    chat.opts = (cn_chat_opts){-1, -1, 1, -1, -1};
    int cap = 0, no_tools = 0, force = 0, think = -1; /* set by the readers below */
    const char *only = NULL;
    cn_strbuf skipped = CN_STRBUF_INIT;
    cn_job *j = NULL;
    cn_api_env counting;
    if ((rc = cn_req_check_model(env, root, r))) goto out;
    if (!(j = cn_req_new_job(env, root, CN_API_ANTHROPIC, "msg_"))) {
        rc = oom(r);
        goto out;
    }
    if ((rc = sampling(j, root, r)) ||
        (rc = read_tool_choice(root, &no_tools, &force, &only, r)) ||
        (rc = read_thinking(root, &think, r)) || (rc = read_system(root, &chat, &cap, r)) ||
        (rc = read_messages(root, &chat, &cap, r)) || (rc = read_tools(root, &chat, &skipped, r)))
        goto out;
    if (skipped.oom) {
        rc = oom(r);
        goto out;
    }
    if (skipped.len && !count)
        cn_log(CN_LOG_INFO, "request %s: server tools left out of the prompt: %s", j->id, skipped.p);
    if (no_tools) { /* none: the model is not told about them, so it cannot call them */
        cJSON_Delete(chat.tools);
        chat.tools = NULL;
    }
    chat.opts.enable_thinking = think;
    counting = *env;
    if (count) counting.ctx = INT_MAX; /* a count is an answer even past the context */
    if ((rc = cn_req_render_chat(&counting, j, &chat, r))) goto out;
    if (force && !count) rc = cn_req_tool_constraint(env, j, only, r);
out:
    cn_strbuf_free(&skipped);
    cn_chat_free(&chat);
    cJSON_Delete(root);
    if (rc) cn_job_unref(j);
    else *out = j;
    return rc;
}

int cn_anthropic_messages_request(const cn_api_env *env, const char *body, size_t len,
                                  cn_job **out, cn_refusal *r) {
    return build(env, body, len, 0, out, r);
}

int cn_anthropic_count_tokens(const cn_api_env *env, const char *body, size_t len, int *n_tokens,
                              cn_refusal *r) {
    cn_job *j = NULL;
    int rc = build(env, body, len, 1, &j, r);
    if (rc) return rc;
    *n_tokens = j->n_prompt;
    cn_job_unref(j);
    return CN_OK;
}
