/* cmd_render.c - `cairn render`: a chat request (JSON) on stdin, the prompt text on stdout.
 *
 * The renderer comes from --renderer NAME or from --model DIR's config.json model_type; exactly
 * one of them. The prompt goes out byte for byte, with no newline added. Exit 0 on success,
 * 1 when the request or the model directory is bad (message on stderr), 2 on usage errors.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/flags.h"
#include "text/chat.h"
#include "text/render.h"

static const char synopsis[] = "render (--model DIR | --renderer NAME) < request.json";

/* All of f into a malloc'd buffer; NULL on a read error or out of memory. */
static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf || ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The renderer named by DIR/config.json's model_type. Reads only that field: rendering needs
 * no weights and no full config validation. Prints the problem and returns NULL on failure. */
static const cn_renderer *renderer_for_dir(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cairn: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t len = 0;
    char *text = read_all(f, &len);
    fclose(f);
    if (!text) {
        fprintf(stderr, "cairn: %s: cannot read\n", path);
        return NULL;
    }
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    free(text);
    const cn_renderer *r = NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (!cfg) {
        fprintf(stderr, "cairn: %s: not valid JSON\n", path);
    } else if (!cJSON_IsString(mt)) {
        fprintf(stderr, "cairn: %s: model_type is missing or not a string\n", path);
    } else if (!(r = cn_renderer_for_model_type(mt->valuestring))) {
        fprintf(stderr,
                "cairn: %s: no chat renderer for model_type \"%s\" (cairn renders nemotron_h "
                "checkpoints; use --renderer to pick one: %s)\n",
                path, mt->valuestring, cn_renderer_names());
    }
    cJSON_Delete(cfg);
    return r;
}

int cn_cmd_render(int argc, char **argv) {
    const char *model = NULL, *name = NULL;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "pick the renderer from DIR/config.json", 0, 0},
        {"renderer", CN_FLAG_STR, &name, "NAME", "pick the renderer by name (nemotron3)", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, synopsis);
    if (rc) return rc > 0 ? 0 : 2;
    if (!model == !name) {
        fprintf(stderr, "cairn: render: give exactly one of --model DIR and --renderer NAME\n");
        cn_flags_usage(flags, synopsis, stderr);
        return 2;
    }
    const cn_renderer *r;
    if (name) {
        if (!(r = cn_renderer_find(name))) {
            fprintf(stderr, "cairn: render: unknown renderer \"%s\" (known: %s)\n", name,
                    cn_renderer_names());
            return 2;
        }
    } else if (!(r = renderer_for_dir(model))) {
        return 1;
    }

    size_t len = 0;
    char *req = read_all(stdin, &len);
    if (!req) {
        fprintf(stderr, "cairn: render: cannot read the request from standard input\n");
        return 1;
    }
    cn_chat chat;
    cn_err err;
    cn_err_clear(&err);
    char *prompt = NULL;
    size_t plen = 0;
    int status = 1;
    if ((rc = cn_chat_parse(&chat, req, len, &err)) ||
        (rc = cn_render(r, &chat, &prompt, &plen, &err))) {
        fprintf(stderr, "cairn: render: %s\n", err.msg[0] ? err.msg : cn_strerror(rc));
    } else if (fwrite(prompt, 1, plen, stdout) != plen || fflush(stdout) != 0) {
        fprintf(stderr, "cairn: render: cannot write the prompt: %s\n", strerror(errno));
    } else {
        status = 0;
    }
    free(prompt);
    cn_chat_free(&chat);
    free(req);
    return status;
}
