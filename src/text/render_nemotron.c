/* render_nemotron.c - the Nemotron 3 Nano chat template, in C.
 *
 * Reproduces NVIDIA's published template (tests/data/render/nemotron3-nano-chat-template.jinja,
 * the same bytes as src/model/nano3_template.c) as jinja2 renders it with Hugging Face's
 * settings: trim_blocks, lstrip_blocks and a tojson that is json.dumps(ensure_ascii=False).
 * Each function below is one part of the template, in the template's order, and says which lines
 * it mirrors; the goldens in tests/data/render/ (rendered by tools/reference/render_goldens.py
 * with jinja2 itself) hold it to the template byte for byte.
 *
 * Why hand-written C and not a Jinja engine: there is no maintained C implementation of Jinja2
 * in Debian (the C++ ones, minja or jinja2cpp, are C++; the Rust one, minijinja, is Rust), and a
 * general engine would still need Python's str(), repr(), json.dumps and str.strip to match
 * jinja2 byte for byte. The template is small and fixed; pyjson.c carries the Python semantics.
 *
 * The template's facts, all of them visible in the goldens:
 *   (1) The system turn is always emitted, even empty ("system_message is defined" is always
 *       true: both branches set it). Only messages[0] is taken as the system message; a later
 *       system message is an ordinary turn.
 *   (2) Tools follow the system text after "\n\n" (none when the system text is empty).
 *       Every schema key the template does not handle is printed: containers with tojson,
 *       scalars with Python str() (True, None, 1e-05). <required> comes after the extras.
 *   (3) An assistant turn always carries a think block: reasoning becomes
 *       "<think>\nR\n</think>\nC"; content without any think tag gets "<think></think>".
 *   (4) With truncate_history_thinking (default on), assistant turns before the last user turn
 *       keep only what follows the last </think> (tool-call turns with an unclosed <think> keep
 *       what precedes it) behind an empty "<think></think>".
 *   (5) Consecutive tool messages share one user turn. A tool message first in the loop (right
 *       after the system message, or first of all) opens no user turn: loop.previtem is
 *       undefined there. The template does that; so do we.
 *   (6) System and user content are never trimmed; assistant content is (Python strip, Unicode
 *       whitespace).
 */
#include <string.h>

#include "text/pyjson.h"
#include "text/render_impl.h"

static const char tools_intro[] =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";

static const char tools_instructions[] =
    "\n"
    "\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n"
    "\n"
    "<tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>\n"
    "value_1\n"
    "</parameter>\n"
    "<parameter=example_parameter_2>\n"
    "This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n"
    "\n"
    "<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block "
    "must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>";

/* Appends s[0..n) without Python-whitespace at either end (jinja's `| trim`). */
static void put_trim(cn_strbuf *b, const char *s, size_t n) {
    size_t a, z;
    cn_py_strip(s, n, &a, &z);
    cn_strbuf_put(b, s + a, z - a);
}

/* str(v) | trim: the value through str(), then stripped. */
static void put_str_trim(cn_strbuf *b, const cJSON *v, cn_strbuf *tmp) {
    cn_strbuf_reset(tmp);
    cn_py_str(tmp, v);
    if (tmp->p) put_trim(b, tmp->p, tmp->len);
}

/* The value as the template prints a schema extra or a call argument: tojson for mappings and
 * non-string sequences, str() for everything else. */
static void put_value(cn_strbuf *b, const cJSON *v) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) cn_py_dumps(b, v);
    else cn_py_str(b, v);
}

static int in_list(const char *key, const char *const *list) {
    for (; *list; list++)
        if (strcmp(key, *list) == 0) return 1;
    return 0;
}

/* macro render_extra_keys(json_dict, handled_keys) */
static void render_extra_keys(cn_strbuf *b, const cJSON *d, const char *const *handled) {
    if (!cJSON_IsObject(d)) return;
    for (const cJSON *c = d->child; c; c = c->next) {
        if (in_list(c->string, handled)) continue;
        cn_strbuf_puts(b, "\n<");
        cn_strbuf_puts(b, c->string);
        cn_strbuf_putc(b, '>');
        put_value(b, c);
        cn_strbuf_puts(b, "</");
        cn_strbuf_puts(b, c->string);
        cn_strbuf_putc(b, '>');
    }
}

static const cJSON *get(const cJSON *obj, const char *key) {
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* {%- for tool in tools %} ... {%- endfor %} */
static void render_tool(cn_strbuf *b, const cJSON *tool, cn_strbuf *tmp) {
    static const char *const param_handled[] = {"name", "type", "description", "enum", NULL};
    static const char *const params_handled[] = {"type", "properties", "required", NULL};
    static const char *const tool_handled[] = {"type", "name", "description", "parameters", NULL};
    const cJSON *fn = get(tool, "function");
    if (fn) tool = fn;
    cn_strbuf_puts(b, "\n<function>\n<name>");
    cn_py_str(b, get(tool, "name"));
    cn_strbuf_puts(b, "</name>");
    const cJSON *desc = get(tool, "description");
    if (desc) {
        cn_strbuf_puts(b, "\n<description>");
        put_str_trim(b, desc, tmp);
        cn_strbuf_puts(b, "</description>");
    }
    cn_strbuf_puts(b, "\n<parameters>");
    const cJSON *params = get(tool, "parameters");
    const cJSON *props = get(params, "properties");
    if (cJSON_IsObject(props)) {
        for (const cJSON *p = props->child; p; p = p->next) {
            cn_strbuf_puts(b, "\n<parameter>\n<name>");
            cn_strbuf_puts(b, p->string);
            cn_strbuf_puts(b, "</name>");
            /* attribute lookups (param_fields.type) find keys of mappings only */
            const cJSON *v;
            if ((v = get(p, "type"))) {
                cn_strbuf_puts(b, "\n<type>");
                cn_py_str(b, v);
                cn_strbuf_puts(b, "</type>");
            }
            if ((v = get(p, "description"))) {
                cn_strbuf_puts(b, "\n<description>");
                put_str_trim(b, v, tmp);
                cn_strbuf_puts(b, "</description>");
            }
            if ((v = get(p, "enum"))) {
                cn_strbuf_puts(b, "\n<enum>");
                cn_py_dumps(b, v);
                cn_strbuf_puts(b, "</enum>");
            }
            render_extra_keys(b, p, param_handled);
            cn_strbuf_puts(b, "\n</parameter>");
        }
    }
    render_extra_keys(b, params, params_handled);
    const cJSON *req = get(params, "required");
    if (req) {
        cn_strbuf_puts(b, "\n<required>");
        cn_py_dumps(b, req);
        cn_strbuf_puts(b, "</required>");
    }
    cn_strbuf_puts(b, "\n</parameters>");
    render_extra_keys(b, tool, tool_handled);
    cn_strbuf_puts(b, "\n</function>");
}

/* The system turn and the tools block. */
static void render_system(cn_strbuf *b, const char *system_message, const cJSON *tools,
                          cn_strbuf *tmp) {
    cn_strbuf_puts(b, "<|im_start|>system\n");
    cn_strbuf_puts(b, system_message);
    if (cJSON_IsArray(tools) && tools->child) {
        if (system_message[0]) cn_strbuf_puts(b, "\n\n");
        cn_strbuf_puts(b, tools_intro);
        for (const cJSON *t = tools->child; t; t = t->next) render_tool(b, t, tmp);
        cn_strbuf_puts(b, "\n</tools>");
        cn_strbuf_puts(b, tools_instructions);
    }
    cn_strbuf_puts(b, "<|im_end|>\n");
}

/* The unified content of an assistant turn: reasoning folded in, or an empty think block added
 * when the content has no think tag at all. */
static void assistant_content(cn_strbuf *c, const cn_chat_message *m) {
    size_t a = 0, z = 0;
    if (m->reasoning) cn_py_strip(m->reasoning, strlen(m->reasoning), &a, &z);
    if (m->reasoning && z > a) {
        cn_strbuf_puts(c, "<think>\n");
        cn_strbuf_puts(c, m->reasoning);
        cn_strbuf_puts(c, "\n</think>\n");
        cn_strbuf_puts(c, m->content);
    } else {
        if (!strstr(m->content, "<think>") && !strstr(m->content, "</think>"))
            cn_strbuf_puts(c, "<think></think>");
        cn_strbuf_puts(c, m->content);
    }
}

/* The text after the last occurrence of tag, or NULL if s has none. */
static const char *after_last(const char *s, const char *tag) {
    const char *hit = NULL, *q = s;
    while ((q = strstr(q, tag))) hit = q++;
    return hit ? hit + strlen(tag) : NULL;
}

static void render_tool_call(cn_strbuf *b, const cn_chat_tool_call *tc) {
    cn_strbuf_puts(b, "<tool_call>\n<function=");
    cn_strbuf_puts(b, tc->name);
    cn_strbuf_puts(b, ">\n");
    /* arguments_raw (not JSON) renders as {}, as vLLM maps it */
    if (tc->arguments) {
        for (const cJSON *a = tc->arguments->child; a; a = a->next) {
            cn_strbuf_puts(b, "<parameter=");
            cn_strbuf_puts(b, a->string);
            cn_strbuf_puts(b, ">\n");
            put_value(b, a);
            cn_strbuf_puts(b, "\n</parameter>\n");
        }
    }
    cn_strbuf_puts(b, "</function>\n</tool_call>\n");
}

/* {%- if message.role == "assistant" %} */
static void render_assistant(cn_strbuf *b, const cn_chat_message *m, int in_history,
                             cn_strbuf *c) {
    cn_strbuf_reset(c);
    assistant_content(c, m);
    if (c->oom) return;
    const char *content = c->p;
    size_t a, z;
    if (m->n_tool_calls > 0) {
        cn_strbuf_puts(b, "<|im_start|>assistant\n");
        cn_py_strip(content, c->len, &a, &z);
        if (z > a) {
            if (!in_history) {
                cn_strbuf_put(b, content + a, z - a);
            } else {
                const char *s = content, *after = after_last(content, "</think>");
                size_t n = strlen(content);
                if (after) {
                    n -= (size_t)(after - content);
                    s = after;
                } else {
                    const char *open = strstr(content, "<think>");
                    if (open) n = (size_t)(open - content); /* unclosed: keep what precedes it */
                }
                cn_strbuf_puts(b, "<think></think>");
                put_trim(b, s, n);
            }
            cn_strbuf_putc(b, '\n');
        } else {
            cn_strbuf_puts(b, "<think></think>");
        }
        for (int k = 0; k < m->n_tool_calls; k++) render_tool_call(b, &m->tool_calls[k]);
        cn_strbuf_puts(b, "<|im_end|>\n");
        return;
    }
    cn_strbuf_puts(b, "<|im_start|>assistant\n");
    if (!in_history) {
        put_trim(b, content, c->len);
    } else if (strstr(content, "<think>") && strstr(content, "</think>")) {
        /* ("<think></think>" ~ rest) | trim: the prefix has no whitespace, so only the rest's
         * tail is trimmed, all of it when the rest is only whitespace */
        const char *after = after_last(content, "</think>");
        size_t start, end;
        cn_py_strip(after, strlen(after), &start, &end);
        cn_strbuf_puts(b, "<think></think>");
        cn_strbuf_put(b, after, end > start ? end : 0);
    } else {
        put_trim(b, content, c->len); /* empty content gives "<|im_start|>assistant\n<|im_end|>" */
    }
    cn_strbuf_puts(b, "<|im_end|>\n");
}

int cn_render_nemotron3(const cn_chat *chat, cn_strbuf *b, cn_err *err) {
    (void)err;
    const int enable_thinking = cn_chat_thinking(chat, 1);
    const int truncate = chat->opts.truncate_history_thinking >= 0
                             ? chat->opts.truncate_history_thinking
                             : 1;
    /* messages[0] is the system message when it has that role; the loop runs over the rest */
    const cn_chat_message *msgs = chat->messages;
    int n = chat->n_messages;
    const char *system_message = "";
    if (msgs[0].role == CN_CHAT_SYSTEM) {
        system_message = msgs[0].content;
        msgs++, n--;
    }
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (msgs[i].role == CN_CHAT_USER) last_user = i;

    cn_strbuf tmp = CN_STRBUF_INIT;
    render_system(b, system_message, chat->tools, &tmp);
    for (int i = 0; i < n; i++) {
        const cn_chat_message *m = &msgs[i];
        switch (m->role) {
        case CN_CHAT_ASSISTANT:
            render_assistant(b, m, truncate && i < last_user, &tmp);
            if (tmp.oom) b->oom = 1;
            break;
        case CN_CHAT_USER:
        case CN_CHAT_SYSTEM:
            cn_strbuf_puts(b, m->role == CN_CHAT_USER ? "<|im_start|>user\n"
                                                      : "<|im_start|>system\n");
            cn_strbuf_puts(b, m->content);
            cn_strbuf_puts(b, "<|im_end|>\n");
            break;
        case CN_CHAT_TOOL:
            /* loop.previtem is undefined for the first message: no user turn is opened */
            if (i > 0 && msgs[i - 1].role != CN_CHAT_TOOL) cn_strbuf_puts(b, "<|im_start|>user\n");
            cn_strbuf_puts(b, "<tool_response>\n");
            cn_strbuf_puts(b, m->content);
            cn_strbuf_puts(b, "\n</tool_response>\n");
            if (i == n - 1 || msgs[i + 1].role != CN_CHAT_TOOL) cn_strbuf_puts(b, "<|im_end|>\n");
            break;
        }
    }
    if (chat->opts.add_generation_prompt)
        cn_strbuf_puts(b, enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                          : "<|im_start|>assistant\n<think></think>");
    if (tmp.oom) b->oom = 1;
    cn_strbuf_free(&tmp);
    return 0;
}
