/* st_test_util.h - helpers for tests that write model directories and read them back.
 *
 * Header-only (static functions), independent of the loader under test: reads whole files, parses
 * a safetensors header with cJSON and locates tensor bytes by offset. Every helper fails the
 * current cmocka test instead of returning an error.
 */
#ifndef CN_ST_TEST_UTIL_H
#define CN_ST_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

/* $CAIRN_TMP/<name>, emptied and created; CAIRN_TMP defaults to /tmp. */
static void tu_fresh_dir(const char *name, char *out, size_t n) {
    const char *base = getenv("CAIRN_TMP");
    if (!base || !*base) base = "/tmp";
    char cmd[1200];
    int w = snprintf(out, n, "%s/%s", base, name);
    assert_true(w > 0 && (size_t)w < n); /* a truncated path would name another folder */
    w = snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
    assert_true(w > 0 && (size_t)w < sizeof cmd);
    assert_int_equal(system(cmd), 0);
}

static int tu_exists(const char *dir, const char *name) {
    char p[1200];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* Whole file, NUL-terminated; *len its size. NULL if it cannot be read. */
static unsigned char *tu_read(const char *dir, const char *name, size_t *len) {
    char p[1200];
    if (name) snprintf(p, sizeof p, "%s/%s", dir, name);
    else snprintf(p, sizeof p, "%s", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

static cJSON *tu_read_json(const char *dir, const char *name) {
    unsigned char *b = tu_read(dir, name, NULL);
    assert_non_null(b);
    cJSON *j = cJSON_Parse((const char *)b);
    free(b);
    assert_non_null(j);
    return j;
}

/* A parsed safetensors file: header JSON and the start of the data section. */
typedef struct tu_st {
    unsigned char *buf;
    size_t len;
    uint64_t hlen;
    cJSON *hdr;
    const unsigned char *data;
} tu_st;

static void tu_st_open(tu_st *s, const char *dir, const char *name) {
    s->buf = tu_read(dir, name, &s->len);
    assert_non_null(s->buf);
    assert_true(s->len >= 8);
    s->hlen = 0;
    for (int i = 7; i >= 0; i--) s->hlen = s->hlen << 8 | s->buf[i];
    assert_true(8 + s->hlen <= s->len);
    char *txt = malloc(s->hlen + 1);
    assert_non_null(txt);
    memcpy(txt, s->buf + 8, s->hlen);
    txt[s->hlen] = 0;
    s->hdr = cJSON_Parse(txt);
    free(txt);
    assert_non_null(s->hdr);
    s->data = s->buf + 8 + s->hlen;
}

static void tu_st_close(tu_st *s) {
    cJSON_Delete(s->hdr);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* Bytes of tensor name (NULL if absent); *nbytes and *dtype filled when not NULL. */
static const unsigned char *tu_st_tensor(const tu_st *s, const char *name, uint64_t *nbytes,
                                         const char **dtype) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(s->hdr, name);
    if (!t) return NULL;
    cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    uint64_t a = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    assert_true(8 + s->hlen + b <= s->len);
    if (nbytes) *nbytes = b - a;
    if (dtype) *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype")->valuestring;
    return s->data + a;
}

/* Shape of tensor name as "[a,b,c]" into out. */
static const char *tu_st_shape(const tu_st *s, const char *name, char *out, size_t n) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(s->hdr, name);
    assert_non_null(t);
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < cJSON_GetArraySize(sh); i++)
        k += (size_t)snprintf(out + k, n - k, "%s%lld", i ? "," : "",
                              (long long)cJSON_GetArrayItem(sh, i)->valuedouble);
    snprintf(out + k, n - k, "]");
    return out;
}

#endif
