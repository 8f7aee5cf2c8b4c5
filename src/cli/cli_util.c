/* cli_util.c - see cli_util.h. */
#include "cli/cli_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/backends.h"

static char *read_file(const char *path, int *rc) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *rc = errno == ENOENT ? CN_ENOENT : CN_EIO;
        fprintf(stderr, "cairn: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
        if (cap - len - 1 == 0) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        *rc = buf ? CN_EIO : CN_ENOMEM;
        fprintf(stderr, "cairn: %s: cannot read\n", path);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

int cn_cli_parse_tokens(const char *arg, int32_t **out, int *n) {
    int rc = CN_OK;
    char *text = NULL;
    const char *s = arg;
    if (arg[0] == '@') {
        text = read_file(arg + 1, &rc);
        if (!text) return rc;
        s = text;
    }
    int cap = 64, len = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) {
        free(text);
        return CN_ENOMEM;
    }
    while (*s) {
        while (*s == ',' || *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r')) {
            fprintf(stderr, "cairn: invalid token id near '%.16s'\n", s);
            rc = CN_EUSAGE;
            goto fail;
        }
        if (len == cap) {
            int32_t *p = realloc(ids, (size_t)cap * 2 * sizeof *ids);
            if (!p) {
                rc = CN_ENOMEM;
                goto fail;
            }
            ids = p;
            cap *= 2;
        }
        ids[len++] = (int32_t)v;
        s = end;
    }
    if (len == 0) {
        fprintf(stderr, "cairn: the token list is empty\n");
        rc = CN_EUSAGE;
        goto fail;
    }
    free(text);
    *out = ids;
    *n = len;
    return CN_OK;
fail:
    free(text);
    free(ids);
    return rc;
}

int cn_cli_open_model(const char *dir, const char *backend, int threads, int ubatch, cn_backend **b,
                      cn_model **m) {
    cn_err err;
    cn_err_clear(&err);
    if (!backend) backend = cn_backend_default_name();
    *b = cn_backend_open(backend, threads, &err);
    *m = NULL;
    if (!*b) {
        fprintf(stderr, "cairn: --backend %s: %s\n", backend, err.msg);
        return err.code ? err.code : CN_EINVAL;
    }
    cn_model_opts o = {.ubatch = ubatch};
    int rc = cn_model_open(m, dir, *b, &o, &err);
    if (rc) {
        fprintf(stderr, "cairn: %s\n", err.msg[0] ? err.msg : cn_strerror(rc));
        cn_backend_free(*b);
        *b = NULL;
        *m = NULL;
    }
    return rc;
}

void cn_cli_close_model(cn_backend *b, cn_model *m) {
    cn_model_close(m);
    cn_backend_free(b);
}
