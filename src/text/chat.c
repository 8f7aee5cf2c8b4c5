/* chat.c - OpenAI / Ollama chat request -> cn_chat; see chat.h for the mapping rules.
 *
 * The mapping is the one tools/reference/render_goldens.py applies before rendering with jinja2;
 * a change here needs the same change there (and the goldens re-made).
 */
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "text/strbuf.h"

static const char *type_name(const cJSON *v) {
    if (!v) return "nothing";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    return "an object";
}

static char *dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

#define OOM(err) cn_err_set(err, CN_ENOMEM, "out of memory reading the chat request")

/* An optional string field: absent or null leaves *out NULL. */
static int opt_string(const cJSON *obj, const char *key, const char *where, char **out,
                      cn_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v))
        return cn_err_set(err, CN_EINVAL, "%s.%s: expected a string, got %s", where, key,
                          type_name(v));
    return (*out = dup(v->valuestring)) ? 0 : OOM(err);
}

/* An optional boolean: absent or null leaves *out as it was. */
static int opt_bool(const cJSON *obj, const char *key, const char *where, int *out, cn_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v))
        return cn_err_set(err, CN_EINVAL, "%s%s%s: expected true or false, got %s", where,
                          *where ? "." : "", key, type_name(v));
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

/* content: a string, or an array of text parts (objects of type text/input_text/output_text, or
 * plain strings) joined with "\n". */
static int read_content(const cJSON *msg, cn_chat_role role, const char *where, char **out,
                        size_t **part_at, int *n_part_at, cn_err *err) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!c || cJSON_IsNull(c)) {
        if (role != CN_CHAT_ASSISTANT)
            return cn_err_set(err, CN_EINVAL, "%s: missing content (required for %s messages)",
                              where, role == CN_CHAT_USER ? "user"
                                     : role == CN_CHAT_SYSTEM ? "system" : "tool");
        return (*out = dup("")) ? 0 : OOM(err);
    }
    if (cJSON_IsString(c)) return (*out = dup(c->valuestring)) ? 0 : OOM(err);
    if (!cJSON_IsArray(c))
        return cn_err_set(err, CN_EINVAL,
                          "%s.content: expected a string or an array of text parts, got %s", where,
                          type_name(c));
    cn_strbuf b = CN_STRBUF_INIT;
    int k = 0;
    for (const cJSON *part = c->child; part; part = part->next, k++) {
        const char *text = NULL;
        if (cJSON_IsString(part)) {
            text = part->valuestring;
        } else if (cJSON_IsObject(part)) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(t)) {
                cn_strbuf_free(&b);
                return cn_err_set(err, CN_EINVAL, "%s.content[%d].type: expected a string, got %s",
                                  where, k, type_name(t));
            }
            if (strcmp(t->valuestring, "text") && strcmp(t->valuestring, "input_text") &&
                strcmp(t->valuestring, "output_text")) {
                cn_strbuf_free(&b);
                return cn_err_set(err, CN_EINVAL,
                                  "%s.content[%d]: content parts of type \"%s\" are not supported "
                                  "(text only)", where, k, t->valuestring);
            }
            if (!cJSON_IsString(x)) {
                cn_strbuf_free(&b);
                return cn_err_set(err, CN_EINVAL, "%s.content[%d].text: expected a string, got %s",
                                  where, k, type_name(x));
            }
            text = x->valuestring;
        } else {
            cn_strbuf_free(&b);
            return cn_err_set(err, CN_EINVAL, "%s.content[%d]: expected a text part, got %s", where,
                              k, type_name(part));
        }
        if (k) {
            cn_strbuf_putc(&b, '\n');
            size_t *pa = realloc(*part_at, ((size_t)*n_part_at + 1) * sizeof *pa);
            if (!pa) {
                cn_strbuf_free(&b);
                return OOM(err);
            }
            *part_at = pa;
            pa[(*n_part_at)++] = b.len;
        }
        cn_strbuf_puts(&b, text);
    }
    return cn_strbuf_take(&b, out, NULL) ? OOM(err) : 0;
}

static int read_tool_call(const cJSON *tc, const char *where, cn_chat_tool_call *out,
                          cn_err *err) {
    if (!cJSON_IsObject(tc))
        return cn_err_set(err, CN_EINVAL, "%s: expected an object, got %s", where, type_name(tc));
    int rc = opt_string(tc, "id", where, &out->id, err);
    if (rc) return rc;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    if (!cJSON_IsObject(fn))
        return cn_err_set(err, CN_EINVAL, "%s.function: expected an object, got %s", where,
                          type_name(fn));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(name))
        return cn_err_set(err, CN_EINVAL, "%s.function.name: expected a string, got %s", where,
                          type_name(name));
    if (!(out->name = dup(name->valuestring))) return OOM(err);
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!args || cJSON_IsNull(args)) return 0;
    if (cJSON_IsObject(args)) {
        return (out->arguments = cJSON_Duplicate(args, 1)) ? 0 : OOM(err);
    }
    if (!cJSON_IsString(args))
        return cn_err_set(err, CN_EINVAL,
                          "%s.function.arguments: expected an object or a JSON string, got %s",
                          where, type_name(args));
    cJSON *parsed = NULL;
    cn_err perr;
    rc = cn_pyjson_parse(args->valuestring, strlen(args->valuestring), &parsed, &perr);
    if (rc == CN_EFORMAT) /* not JSON: kept as given (vLLM renders {}) */
        return (out->arguments_raw = dup(args->valuestring)) ? 0 : OOM(err);
    if (rc)
        return cn_err_set(err, rc, "%s.function.arguments: %s", where, perr.msg);
    if (!cJSON_IsObject(parsed)) {
        const char *t = type_name(parsed);
        cJSON_Delete(parsed);
        return cn_err_set(err, CN_EINVAL,
                          "%s.function.arguments: the JSON string holds %s, not an object",
                          where, t);
    }
    out->arguments = parsed;
    return 0;
}

static int read_message(const cJSON *m, int idx, cn_chat_message *out, cn_err *err) {
    char where[48];
    snprintf(where, sizeof where, "messages[%d]", idx);
    if (!cJSON_IsObject(m))
        return cn_err_set(err, CN_EINVAL, "%s: expected an object, got %s", where, type_name(m));
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!role) return cn_err_set(err, CN_EINVAL, "%s: missing role", where);
    if (!cJSON_IsString(role))
        return cn_err_set(err, CN_EINVAL, "%s.role: expected a string, got %s", where,
                          type_name(role));
    static const char *names[] = {"system", "user", "assistant", "tool"};
    int r = -1;
    for (int k = 0; k < 4; k++)
        if (strcmp(role->valuestring, names[k]) == 0) r = k;
    if (r < 0)
        return cn_err_set(err, CN_EINVAL,
                          "%s.role: unknown role \"%.64s\" (expected system, user, assistant or "
                          "tool)", where, role->valuestring);
    out->role = (cn_chat_role)r;
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(m, "images");
    if (images && !cJSON_IsNull(images) && !(cJSON_IsArray(images) && !images->child))
        return cn_err_set(err, CN_EINVAL, "%s.images: images are not supported (text only)", where);
    int rc = read_content(m, out->role, where, &out->content, &out->part_at, &out->n_part_at, err);
    if (rc) return rc;
    if ((rc = opt_string(m, "name", where, &out->name, err))) return rc;
    if (out->role == CN_CHAT_TOOL) {
        if ((rc = opt_string(m, "tool_call_id", where, &out->tool_call_id, err))) return rc;
        if (!out->name && (rc = opt_string(m, "tool_name", where, &out->name, err))) return rc;
    }
    if (out->role != CN_CHAT_ASSISTANT) return 0;
    static const char *reasoning_keys[] = {"reasoning_content", "reasoning", "thinking"};
    for (int k = 0; k < 3 && !out->reasoning; k++)
        if ((rc = opt_string(m, reasoning_keys[k], where, &out->reasoning, err))) return rc;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls || cJSON_IsNull(calls)) return 0;
    if (!cJSON_IsArray(calls))
        return cn_err_set(err, CN_EINVAL, "%s.tool_calls: expected an array, got %s", where,
                          type_name(calls));
    int n = cJSON_GetArraySize(calls);
    if (n == 0) return 0;
    if (!(out->tool_calls = calloc((size_t)n, sizeof *out->tool_calls))) return OOM(err);
    out->n_tool_calls = n;
    int k = 0;
    for (const cJSON *tc = calls->child; tc; tc = tc->next, k++) {
        char w[80];
        snprintf(w, sizeof w, "%s.tool_calls[%d]", where, k);
        if ((rc = read_tool_call(tc, w, &out->tool_calls[k], err))) return rc;
    }
    return 0;
}

static int read_tools(const cJSON *tools, cJSON **out, cn_err *err) {
    if (!tools || cJSON_IsNull(tools)) return 0;
    if (!cJSON_IsArray(tools))
        return cn_err_set(err, CN_EINVAL, "tools: expected an array, got %s", type_name(tools));
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        if (!cJSON_IsObject(t))
            return cn_err_set(err, CN_EINVAL, "tools[%d]: expected an object, got %s", k,
                              type_name(t));
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *path = "function.name";
        if (fn) {
            if (!cJSON_IsObject(fn))
                return cn_err_set(err, CN_EINVAL, "tools[%d].function: expected an object, got %s",
                                  k, type_name(fn));
        } else {
            fn = t; /* a bare function definition; the template accepts it */
            path = "name";
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name))
            return cn_err_set(err, CN_EINVAL, "tools[%d].%s: expected a string, got %s", k, path,
                              type_name(name));
    }
    return (*out = cJSON_Duplicate(tools, 1)) ? 0 : OOM(err);
}

/* ---------------------------------------------------------------- /think, /no_think */

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Removes every delimited /think and /no_think from s (in place); returns the last one's value
 * (1 or 0), or -1 if there was none. */
static int strip_toggles(char *s) {
    int last = -1;
    size_t n = strlen(s), i = 0;
    while (i < n) {
        size_t tl = 0;
        int val = -1;
        if (s[i] == '/' && (i == 0 || is_ws(s[i - 1]))) {
            if (strncmp(s + i, "/think", 6) == 0) tl = 6, val = 1;
            else if (strncmp(s + i, "/no_think", 9) == 0) tl = 9, val = 0;
            if (tl && i + tl < n && !is_ws(s[i + tl])) tl = 0;
        }
        if (!tl) {
            i++;
            continue;
        }
        last = val;
        size_t from = i, to = i + tl;
        while (from > 0 && is_ws(s[from - 1])) from--;
        if (from == 0) /* at the very start: take the whitespace after it instead */
            while (to < n && is_ws(s[to])) to++;
        memmove(s + from, s + to, n - to + 1);
        n -= to - from;
        i = from;
    }
    return last;
}

/* ---------------------------------------------------------------- request */

int cn_chat_parse(cn_chat *out, const char *json, size_t len, cn_err *err) {
    memset(out, 0, sizeof *out);
    out->opts = (cn_chat_opts){-1, -1, 1, -1, -1};
    cJSON *root = NULL;
    int rc = cn_pyjson_parse(json, len, &root, err);
    if (rc) return rc;
    if (!cJSON_IsObject(root)) {
        rc = cn_err_set(err, CN_EINVAL, "the chat request must be a JSON object, got %s",
                        type_name(root));
        goto done;
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) {
        rc = cn_err_set(err, CN_EINVAL, "messages: missing");
        goto done;
    }
    if (!cJSON_IsArray(msgs)) {
        rc = cn_err_set(err, CN_EINVAL, "messages: expected an array, got %s", type_name(msgs));
        goto done;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) {
        rc = cn_err_set(err, CN_EINVAL, "messages: empty (at least one message is needed)");
        goto done;
    }
    if (!(out->messages = calloc((size_t)n, sizeof *out->messages))) {
        rc = OOM(err);
        goto done;
    }
    out->n_messages = n;
    int k = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, k++)
        if ((rc = read_message(m, k, &out->messages[k], err))) goto done;
    if ((rc = read_tools(cJSON_GetObjectItemCaseSensitive(root, "tools"), &out->tools, err)))
        goto done;

    cn_chat_opts *o = &out->opts;
    if ((rc = opt_bool(root, "add_generation_prompt", "", &o->add_generation_prompt, err)))
        goto done;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw)) {
            rc = cn_err_set(err, CN_EINVAL, "chat_template_kwargs: expected an object, got %s",
                            type_name(kw));
            goto done;
        }
        if ((rc = opt_bool(kw, "enable_thinking", "chat_template_kwargs", &o->enable_thinking,
                           err)) ||
            (rc = opt_bool(kw, "truncate_history_thinking", "chat_template_kwargs",
                           &o->truncate_history_thinking, err)))
            goto done;
    }
    const cJSON *think = cJSON_GetObjectItemCaseSensitive(root, "think");
    if (cJSON_IsBool(think)) {
        o->think = cJSON_IsTrue(think);
    } else if (cJSON_IsString(think) && (!strcmp(think->valuestring, "high") ||
                                         !strcmp(think->valuestring, "medium") ||
                                         !strcmp(think->valuestring, "low"))) {
        o->think = 1; /* Ollama's levels are for gpt-oss; for Nemotron any level means on */
    } else if (think && !cJSON_IsNull(think)) {
        rc = cn_err_set(err, CN_EINVAL,
                        "think: expected true, false, \"high\", \"medium\" or \"low\", got %s",
                        type_name(think));
        goto done;
    }
    for (k = 0; k < n; k++) {
        cn_chat_message *m = &out->messages[k];
        if (m->role != CN_CHAT_SYSTEM && m->role != CN_CHAT_USER) continue;
        int t = strip_toggles(m->content);
        if (t >= 0) o->think_toggle = t;
    }
done:
    cJSON_Delete(root);
    return rc;
}

void cn_chat_free(cn_chat *chat) {
    if (!chat) return;
    for (int k = 0; k < chat->n_messages; k++) {
        cn_chat_message *m = &chat->messages[k];
        free(m->content);
        free(m->part_at);
        free(m->reasoning);
        free(m->tool_call_id);
        free(m->name);
        for (int j = 0; j < m->n_tool_calls; j++) {
            cn_chat_tool_call *tc = &m->tool_calls[j];
            free(tc->id);
            free(tc->name);
            free(tc->arguments_raw);
            cJSON_Delete(tc->arguments);
        }
        free(m->tool_calls);
    }
    free(chat->messages);
    cJSON_Delete(chat->tools);
    memset(chat, 0, sizeof *chat);
}

int cn_chat_thinking(const cn_chat *chat, int dflt) {
    const cn_chat_opts *o = &chat->opts;
    if (o->think_toggle >= 0) return o->think_toggle;
    if (o->enable_thinking >= 0) return o->enable_thinking;
    if (o->think >= 0) return o->think;
    return dflt;
}
