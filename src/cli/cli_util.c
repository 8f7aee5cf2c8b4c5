/* cli_util.c - see cli_util.h. */
#include "cli/cli_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/readfile.h"
#include "cache/prefix_cache.h"
#include "tensor/backends.h"

int cn_cli_parse_tokens(const char *arg, int32_t **out, int *n) {
    int rc = CN_OK;
    char *text = NULL;
    const char *s = arg;
    if (arg[0] == '@') {
        cn_err err;
        cn_err_clear(&err);
        if ((rc = cn_read_file(arg + 1, &text, NULL, &err))) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            return rc;
        }
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

/* ---- loading progress -------------------------------------------------------------------- */

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void cn_cli_human_bytes(uint64_t bytes, char *buf, size_t n) {
    static const char *unit[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1000 && u < 4) v /= 1000, u++;
    snprintf(buf, n, u == 0 ? "%.0f %s" : v < 10 ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

void cn_cli_progress_begin(cn_cli_progress *p, const char *name, int want) {
    memset(p, 0, sizeof *p);
    p->show = want && isatty(STDERR_FILENO);
    p->name = name;
    p->t0 = mono_ms();
}

void cn_cli_progress_stage(cn_cli_progress *p, const char *fmt, ...) {
    if (!p || !p->show) return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\r\033[Kcairn: loading %s: %s...", p->name, what);
    fflush(stderr);
    p->drawn = 1;
}

void cn_cli_progress_clear(cn_cli_progress *p) {
    if (!p || !p->drawn) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->drawn = 0;
}

double cn_cli_progress_ms(const cn_cli_progress *p) { return mono_ms() - p->t0; }

void cn_cli_progress_done(cn_cli_progress *p, uint64_t params) {
    if (!p || !p->show) return;
    char size[32], np[32];
    cn_cli_human_bytes(p->bytes, size, sizeof size);
    static const char *unit[] = {"", "K", "M", "B", "T"}; /* parameter counts: 343K, 3.9B */
    double v = (double)params;
    int u = 0;
    while (v >= 1000 && u < 4) v /= 1000, u++;
    snprintf(np, sizeof np, u && v < 10 ? "%.1f%s" : "%.0f%s", v, unit[u]);
    cn_cli_progress_clear(p);
    fprintf(stderr, "cairn: loaded %s (%s, %s params) in %.2f s\n", p->name, size, np,
            cn_cli_progress_ms(p) / 1e3);
    fflush(stderr);
}

static void on_stage(void *ctx, cn_load_stage stage, uint64_t bytes) {
    cn_cli_progress *p = ctx;
    char size[32];
    switch (stage) {
    case CN_LOAD_CONFIG: cn_cli_progress_stage(p, "reading config"); break;
    case CN_LOAD_MAP: cn_cli_progress_stage(p, "mapping weights"); break;
    case CN_LOAD_BIND:
        p->bytes = bytes;
        cn_cli_human_bytes(bytes, size, sizeof size);
        cn_cli_progress_stage(p, "binding %s of weights", size);
        break;
    }
}

/* ---- models ------------------------------------------------------------------------------- */

int cn_cli_open_model_progress(const char *dir, const char *backend, int threads, int ubatch,
                               cn_cli_progress *p, cn_backend **b, cn_model **m) {
    cn_err err;
    cn_err_clear(&err);
    if (!backend) backend = cn_backend_default_name();
    *b = cn_backend_open(backend, threads, &err);
    *m = NULL;
    if (!*b) {
        cn_cli_progress_clear(p);
        fprintf(stderr, "cairn: --backend %s: %s\n", backend, err.msg);
        return err.code ? err.code : CN_EINVAL;
    }
    const char *apart = getenv("CAIRN_SHARED_APART");
    cn_model_opts o = {.ubatch = ubatch, .on_stage = p ? on_stage : NULL, .stage_ctx = p,
                       .shared_apart = apart && !strcmp(apart, "1")};
    int rc = cn_model_open(m, dir, *b, &o, &err);
    if (rc) {
        cn_cli_progress_clear(p);
        fprintf(stderr, "cairn: %s\n", err.msg[0] ? err.msg : cn_strerror(rc));
        cn_backend_free(*b);
        *b = NULL;
        *m = NULL;
    }
    return rc;
}

int cn_cli_open_model(const char *dir, const char *backend, int threads, int ubatch, cn_backend **b,
                      cn_model **m) {
    return cn_cli_open_model_progress(dir, backend, threads, ubatch, NULL, b, m);
}

void cn_cli_close_model(cn_backend *b, cn_model *m) {
    cn_model_close(m);
    cn_backend_free(b);
}

static int has_config(const char *dir) {
    char p[4096];
    struct stat sb;
    if (snprintf(p, sizeof p, "%s/config.json", dir) >= (int)sizeof p) return 0;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

int cn_cli_default_model(char *buf, size_t n) {
    const char *env = getenv("CAIRN_MODEL");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return 0;
    }
    snprintf(buf, n, "%s", CN_CLI_DEFAULT_MODEL);
    if (has_config(buf)) return 0;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0'; /* the binary's folder: <repo>/build, or PREFIX/bin once installed */
            const char *rel[] = {"..", "../share/cairn"};
            for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
                char cand[4096 + 64];
                snprintf(cand, sizeof cand, "%s/%s/%s", exe, rel[i], CN_CLI_DEFAULT_MODEL);
                if (has_config(cand) && strlen(cand) < n) {
                    snprintf(buf, n, "%s", cand);
                    return 0;
                }
            }
        }
    }
    fprintf(stderr, "cairn: no model: pass --model DIR or set CAIRN_MODEL (the default, "
                    CN_CLI_DEFAULT_MODEL ", is neither here, nor beside the cairn binary, nor in its "
                    "../share/cairn)\n");
    return CN_ENOENT;
}

uint64_t cn_cli_dev_budget(uint64_t flag, const cn_backend *b) {
    if (flag != CN_CLI_UNSET) return flag;
    return cn_backend_has_device_memory(b) ? CN_PC_DEV_BUDGET : 0;
}
