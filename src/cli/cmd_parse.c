/* cmd_parse.c - `cairn parse`: split generated text on stdin into thinking, content and tool calls.
 *
 * Prints one line of JSON: {"thinking": "...", "content": "...", "tool_calls": [{"name": ...,
 * "arguments": {...}}]}, strings empty when there is none. The text goes through the same streaming
 * parser the server drives (text/parser.h), fed whole or in --chunk pieces. Bad input (invalid JSON
 * or tools in --tools, invalid UTF-8 or a NUL byte on stdin) exits 1 with a message naming it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/mapfile.h"
#include "cli/cli.h"
#include "cli/flags.h"
#include "text/parser.h"

/* A growable byte string. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static int sbuf_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return CN_ENOMEM;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 0;
}

typedef struct collected {
    sbuf thinking, content;
    cJSON *calls; /* array of {"name", "arguments"} */
} collected;

static int on_event(const cn_parse_event *ev, void *ctx) {
    collected *c = ctx;
    if (ev->kind == CN_EV_THINKING) return sbuf_add(&c->thinking, ev->text, ev->len);
    if (ev->kind == CN_EV_CONTENT) return sbuf_add(&c->content, ev->text, ev->len);
    cJSON *call = cJSON_CreateObject();
    if (!call || !cJSON_AddItemToArray(c->calls, call)) {
        cJSON_Delete(call);
        return CN_ENOMEM;
    }
    cJSON *args = cJSON_Duplicate(ev->arguments, 1);
    if (!cJSON_AddStringToObject(call, "name", ev->name) || !args ||
        !cJSON_AddItemToObject(call, "arguments", args)) {
        cJSON_Delete(args);
        return CN_ENOMEM;
    }
    return 0;
}

/* Reads all of f; NUL-terminated. */
static int read_all(FILE *f, sbuf *b) {
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (sbuf_add(b, chunk, got)) return CN_ENOMEM;
    if (ferror(f)) return CN_EIO;
    return sbuf_add(b, "", 0);
}

/* Loads --tools: an OpenAI tools array, or a request object with a "tools" array. On error
 * prints the message and returns NULL with *bad set. */
static cJSON *load_tools(const char *path, const cJSON **tools) {
    cn_err err;
    cn_mapfile m;
    if (cn_mapfile_open(&m, path, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        return NULL;
    }
    const char *text = (const char *)m.data, *end = NULL;
    cJSON *root = m.size ? cJSON_ParseWithLengthOpts(text, (size_t)m.size, &end, 0) : NULL;
    if (root) { /* anything but whitespace after the value is an error too */
        const char *p = end;
        while (p < text + m.size && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p != text + m.size) {
            cJSON_Delete(root);
            root = NULL;
            end = p;
        }
    }
    if (!root) {
        int line = 1, col = 1;
        for (const char *p = text; end && p < end; p++)
            if (*p == '\n') line++, col = 1;
            else col++;
        if (!m.size) fprintf(stderr, "cairn: %s: --tools file is empty, not JSON\n", path);
        else fprintf(stderr, "cairn: %s: invalid JSON at line %d, column %d\n", path, line, col);
        cn_mapfile_close(&m);
        return NULL;
    }
    cn_mapfile_close(&m);
    const cJSON *t = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "tools") : root;
    if (!cJSON_IsArray(t)) {
        fprintf(stderr,
                "cairn: %s: expected an array of tools or an object with a \"tools\" array\n",
                path);
        cJSON_Delete(root);
        return NULL;
    }
    *tools = t;
    return root;
}

int cn_cmd_parse(int argc, char **argv) {
    const char *renderer = NULL, *tools_path = NULL;
    int no_think = 0, chunk = 0;
    cn_flag flags[] = {
        {"renderer", CN_FLAG_STR, &renderer, "NAME", "output format of the model: nemotron3", 1, 0},
        {"no-think", CN_FLAG_BOOL, &no_think, NULL,
         "the prompt closed thinking (enable_thinking=false)", 0, 0},
        {"tools", CN_FLAG_STR, &tools_path, "FILE",
         "OpenAI tools array (or a request with \"tools\") to type arguments", 0, 0},
        {"chunk", CN_FLAG_INT, &chunk, "N", "feed stdin in N-byte pieces (default: all at once)", 0,
         0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv,
                            "parse --renderer nemotron3 [--no-think] [--tools FILE] < TEXT");
    if (rc) return rc > 0 ? 0 : 2;
    if (chunk < 0) {
        fprintf(stderr, "cairn: --chunk must be positive\n");
        return 2;
    }
    int status = 1;
    cJSON *tools_root = NULL, *out = NULL;
    const cJSON *tools = NULL;
    sbuf in = {0};
    collected c = {{0}, {0}, cJSON_CreateArray()};
    cn_parser p = {0};
    cn_err err;
    char *json = NULL;
    if (!c.calls) goto oom;
    if (cn_parser_init(&p, renderer, 1, NULL, &err)) { /* an unknown --renderer is a usage error */
        fprintf(stderr, "cairn: --renderer: %s\n", err.msg);
        status = 2;
        goto done;
    }
    cn_parser_free(&p);
    if (tools_path && !(tools_root = load_tools(tools_path, &tools))) goto done;
    if ((rc = read_all(stdin, &in))) {
        fprintf(stderr, "cairn: reading stdin: %s\n", cn_strerror(rc));
        goto done;
    }
    const char *nul = memchr(in.s, '\0', in.n);
    if (nul) { /* JSON strings here are C strings: refuse rather than cut the text short */
        fprintf(stderr, "cairn: stdin: NUL byte at offset %zu\n", (size_t)(nul - in.s));
        goto done;
    }
    if (cn_parser_init(&p, renderer, !no_think, tools, &err)) {
        int about_tools = tools_path && !strncmp(err.msg, "tools", 5);
        fprintf(stderr, "cairn: %s%s%s\n", about_tools ? tools_path : "", about_tools ? ": " : "",
                err.msg);
        goto done;
    }
    size_t step = chunk > 0 ? (size_t)chunk : in.n;
    for (size_t off = 0; off < in.n && !rc; off += step)
        rc = cn_parser_feed(&p, in.s + off, in.n - off < step ? in.n - off : step, on_event, &c);
    if (!rc) rc = cn_parser_finish(&p, on_event, &c);
    if (rc) {
        fprintf(stderr, "cairn: stdin: %s\n", p.err.msg);
        goto done;
    }
    if (!(out = cJSON_CreateObject()) ||
        !cJSON_AddStringToObject(out, "thinking", c.thinking.s ? c.thinking.s : "") ||
        !cJSON_AddStringToObject(out, "content", c.content.s ? c.content.s : "") ||
        !cJSON_AddItemToObject(out, "tool_calls", c.calls))
        goto oom;
    c.calls = NULL; /* owned by out now */
    if (!(json = cJSON_PrintUnformatted(out))) goto oom;
    if (printf("%s\n", json) < 0 || fflush(stdout) != 0) {
        fprintf(stderr, "cairn: writing stdout failed\n");
        goto done;
    }
    status = 0;
    goto done;
oom:
    fprintf(stderr, "cairn: out of memory\n");
done:
    free(json);
    cJSON_Delete(out);
    cJSON_Delete(c.calls);
    free(c.thinking.s);
    free(c.content.s);
    free(in.s);
    cn_parser_free(&p);
    cJSON_Delete(tools_root);
    return status;
}
