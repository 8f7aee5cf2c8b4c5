/* test_util.h - small helpers shared by the tests: paths from the environment, whole-file reads,
 * scratch directories. Header-only so every test stays one translation unit. */
#ifndef CN_TEST_UTIL_H
#define CN_TEST_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tensor/backends.h"

/* tests/data, from CAIRN_DATA (set by ctest) or relative to the source root. */
static inline const char *tu_data_dir(void) {
    const char *d = getenv("CAIRN_DATA");
    return d ? d : "tests/data";
}

/* A fresh directory under CAIRN_TMP (or /tmp); the caller frees the string. */
static inline char *tu_mkdtemp(const char *tag) {
    const char *base = getenv("CAIRN_TMP");
    if (!base) base = "/tmp";
    mkdir(base, 0755);
    size_t n = strlen(base) + strlen(tag) + 16;
    char *p = malloc(n);
    if (!p) return NULL;
    snprintf(p, n, "%s/%s-XXXXXX", base, tag);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

/* Whole file, NUL-terminated; *len gets the byte count. NULL if unreadable. */
static inline char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return buf;
}

/* max |a - b| / max |b|: the error relative to the largest reference value. */
static inline double tu_rel_err(const float *a, const float *b, size_t n) {
    double maxd = 0, maxb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > maxd || d != d) maxd = d != d ? INFINITY : d;
        if (fabs((double)b[i]) > maxb) maxb = fabs((double)b[i]);
    }
    return maxb > 0 ? maxd / maxb : maxd;
}

/* tu_rel_err over the first `rows` rows of two F32 2D tensors of backend b, read back through
 * cn_backend_download (their memory may be a GPU's); INFINITY if a download fails. */
static inline double tu_rows_rel_err(cn_backend *b, const cn_tensor *x, const cn_tensor *y, int rows) {
    cn_tensor xr = cn_tensor_rows(x, 0, rows), yr = cn_tensor_rows(y, 0, rows);
    size_t n = (size_t)rows * (size_t)x->shape[1];
    float *hx = malloc(n * sizeof *hx + 1), *hy = malloc(n * sizeof *hy + 1);
    double e = INFINITY;
    if (hx && hy && !cn_backend_download(b, hx, &xr) && !cn_backend_download(b, hy, &yr))
        e = tu_rel_err(hx, hy, n);
    free(hx);
    free(hy);
    return e;
}

/* A random token id clear of the special ids (below 20, EOS among them), from a xorshift64
 * state the test keeps (one fixed seed per test file, so its prompts repeat run to run). */
static inline int32_t tu_rnd_token(uint64_t *rng, int V) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    return (int32_t)(20 + *rng % (uint64_t)(V - 20));
}

/* The backend a model or cache test runs on: $CAIRN_BACKEND ("cpu" when unset; `make test-cuda`
 * sets "cuda"). NULL, with the reason on stderr, if it cannot be created. */
static inline cn_backend *tu_backend(int n_threads) {
    cn_err err;
    cn_err_clear(&err);
    cn_backend *b = cn_backend_open(cn_backend_default_name(), n_threads, &err);
    if (!b) fprintf(stderr, "backend %s: %s\n", cn_backend_default_name(), err.msg);
    return b;
}

/* Whether a model open that returned rc was a backend declining a model kind it does not implement
 * (e.g. sliding-window layers on CUDA): the caller then skips, having seen the open name the
 * problem. The CPU backend implements everything, so there it is never a reason to skip. */
static inline int tu_backend_declines(int rc) {
    return rc == CN_EUNSUPPORTED && strcmp(cn_backend_default_name(), "cpu") != 0;
}

/* The cairn binary the CLI tests run: $CAIRN_BIN, else build/cairn (ctest runs from the repo root). */
static inline const char *tu_cairn_bin(void) {
    const char *b = getenv("CAIRN_BIN");
    return b ? b : "build/cairn";
}

/* Runs a shell command made from fmt; its stdout (with stderr when merge_err, else stderr goes to
 * tmp/err.txt) lands in tmp/out.txt and in *out (caller frees). Returns the exit status, -1 if it
 * did not exit. */
static inline int tu_sh(const char *tmp, int merge_err, char **out, const char *fmt, ...) {
    char cmd[4096], path[1024], full[6400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/out.txt", tmp);
    if (merge_err)
        snprintf(full, sizeof full, "%s >'%s' 2>&1", cmd, path);
    else
        snprintf(full, sizeof full, "%s >'%s' 2>'%s/err.txt'", cmd, path, tmp);
    int st = system(full);
    if (out) *out = tu_read_file(path, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Removes a directory tree made by a test (best effort). */
static inline void tu_rmtree(const char *dir) {
    size_t n = strlen(dir) + 16;
    char *cmd = malloc(n);
    if (!cmd) return;
    snprintf(cmd, n, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* nothing to do: leftovers live in the build's tmp */ }
    free(cmd);
}

#endif
