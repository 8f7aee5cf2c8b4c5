/* test_safetensors.c - the mapped safetensors loader: valid files and shards read back exactly,
 * and every defect is its own error code with a message naming the file and the tensor.
 *
 * The files are written here by a tiny test-only writer (header JSON given as text, with ' for "
 * to keep the C literals readable), never by the production writer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"

/* ---------------------------------------------------------------------------------------------
 * Scratch directories and the test writer
 * ------------------------------------------------------------------------------------------- */

/* A fresh directory under $CAIRN_TMP (or /tmp); the caller frees it with rm_dir(). */
static char *make_dir(void) {
    const char *base = getenv("CAIRN_TMP");
    char *p = malloc(4096);
    assert_non_null(p);
    if (base && *base) {
        mkdir(base, 0777); /* ctest run without the Makefile: create it, EEXIST is fine */
        snprintf(p, 4096, "%s/st-XXXXXX", base);
        if (mkdtemp(p)) return p;
    }
    snprintf(p, 4096, "/tmp/cairn-st-XXXXXX");
    assert_non_null(mkdtemp(p));
    return p;
}

static void rm_dir(char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
    free(dir);
}

static char *join(const char *dir, const char *name) {
    static char buf[4][4096]; /* test-only: a few live paths at once */
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (na) assert_int_equal(fwrite(a, 1, na, f), na);
    if (nb) assert_int_equal(fwrite(b, 1, nb, f), nb);
    assert_int_equal(fclose(f), 0);
}

/* Copies s with every ' turned into ". */
static char *dq(const char *s) {
    char *t = strdup(s);
    assert_non_null(t);
    for (char *p = t; *p; p++)
        if (*p == '\'') *p = '"';
    return t;
}

/* Writes a safetensors file: u64 LE length, the header (quotes fixed, space-padded to a multiple
 * of 8 as real writers do), then data. */
static void write_st(const char *path, const char *header, const void *data, size_t ndata) {
    char *h = dq(header);
    size_t n = strlen(h), padded = (n + 7) & ~(size_t)7;
    uint8_t *buf = malloc(8 + padded);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, h, n);
    memset(buf + 8 + n, ' ', padded - n);
    write_bytes(path, buf, 8 + padded, data, ndata);
    free(buf);
    free(h);
}

static void write_text(const char *path, const char *text) {
    char *t = dq(text);
    write_bytes(path, t, strlen(t), NULL, 0);
    free(t);
}

/* Opens a one-file checkpoint with the given header over `ndata` zero bytes; expects code and
 * each non-NULL substring in the message. */
static void expect_file_error(const char *header, size_t ndata, int code, const char *s1,
                              const char *s2, const char *s3) {
    char *dir = make_dir();
    uint8_t *data = calloc(1, ndata + 1);
    assert_non_null(data);
    const char *path = join(dir, "bad.safetensors");
    write_st(path, header, data, ndata);
    cn_safetensors *st = (cn_safetensors *)0x1;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_st_open_file(&st, path, &err);
    if (rc != code) fprintf(stderr, "got %d (%s), want %d\n", rc, err.msg, code);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_ptr_equal(st, (cn_safetensors *)0x1); /* untouched on error */
    assert_non_null(strstr(err.msg, "bad.safetensors"));
    const char *subs[3] = {s1, s2, s3};
    for (int i = 0; i < 3; i++)
        if (subs[i] && !strstr(err.msg, subs[i])) fail_msg("'%s' not in: %s", subs[i], err.msg);
    free(data);
    rm_dir(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Valid checkpoints
 * ------------------------------------------------------------------------------------------- */

typedef struct payload {
    float a[6];      /* [0, 24)  F32 [2, 3] */
    uint16_t b[4];   /* [24, 32) BF16 [4] */
    int64_t s;       /* [32, 40) I64 scalar */
} payload;

static const char *k_single_header =
    "{'__metadata__': {'format': 'pt'},"
    " 'a': {'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [0, 24]},"
    " 's': {'dtype': 'I64', 'shape': [], 'data_offsets': [32, 40]},"
    " 'b': {'dtype': 'BF16', 'shape': [4], 'data_offsets': [24, 32]},"
    " 'empty': {'dtype': 'F32', 'shape': [0, 5], 'data_offsets': [40, 40]}}";

static void write_single(const char *path) {
    payload p;
    for (int i = 0; i < 6; i++) p.a[i] = (float)i + 0.5f;
    for (int i = 0; i < 4; i++) p.b[i] = (uint16_t)(0x3f80 + i);
    p.s = -42;
    write_st(path, k_single_header, &p, sizeof p);
}

static void check_single(const cn_safetensors *st) {
    assert_int_equal(cn_st_count(st), 4);
    const cn_st_tensor *a = cn_st_find(st, "a");
    assert_non_null(a);
    assert_string_equal(a->name, "a");
    assert_int_equal(a->dtype, CN_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->shape[2], 1); /* unused dims are 1 */
    assert_int_equal(a->nbytes, 24);
    assert_int_equal(a->file, 0);
    float f[6];
    memcpy(f, a->data, sizeof f);
    for (int i = 0; i < 6; i++) assert_true(f[i] == (float)i + 0.5f);

    const cn_st_tensor *b = cn_st_find(st, "b");
    assert_non_null(b);
    assert_int_equal(b->dtype, CN_BF16);
    assert_int_equal(b->ndim, 1);
    assert_int_equal(b->shape[0], 4);
    /* the data lies exactly after a's: pointers into one mapping, nothing copied */
    assert_ptr_equal((const uint8_t *)b->data, (const uint8_t *)a->data + 24);
    uint16_t h[4];
    memcpy(h, b->data, sizeof h);
    for (int i = 0; i < 4; i++) assert_int_equal(h[i], 0x3f80 + i);

    const cn_st_tensor *s = cn_st_find(st, "s");
    assert_non_null(s);
    assert_int_equal(s->dtype, CN_I64);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->nbytes, 8);
    int64_t v;
    memcpy(&v, s->data, sizeof v);
    assert_int_equal(v, -42);

    const cn_st_tensor *e = cn_st_find(st, "empty");
    assert_non_null(e);
    assert_int_equal(e->nbytes, 0);
    assert_int_equal(e->shape[0], 0);

    assert_null(cn_st_find(st, "__metadata__"));
    assert_null(cn_st_find(st, "nope"));
    assert_null(cn_st_at(st, 4));
    assert_null(cn_st_at(st, -1));
    for (int i = 0; i < 4; i++)
        assert_ptr_equal(cn_st_find(st, cn_st_at(st, i)->name), cn_st_at(st, i));
    assert_null(cn_st_file_path(st, 1));
}

static void test_single_file(void **state) {
    (void)state;
    char *dir = make_dir();
    const char *path = join(dir, "model.safetensors");
    write_single(path);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_OK);
    check_single(st);
    assert_string_equal(cn_st_file_path(st, 0), path);
    cn_st_close(st);

    /* the directory form finds model.safetensors without an index */
    st = NULL;
    assert_int_equal(cn_st_open_dir(&st, dir, &err), CN_OK);
    check_single(st);
    cn_st_close(st);
    rm_dir(dir);
}

static void test_many_tensors(void **state) {
    /* enough names to grow the hash table several times; every one found at its own data */
    (void)state;
    enum { N = 1000 };
    char *dir = make_dir();
    size_t cap = (size_t)N * 96 + 16;
    char *h = malloc(cap);
    assert_non_null(h);
    size_t k = (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < N; i++)
        k += (size_t)snprintf(h + k, cap - k,
                              "%s'backbone.layers.%d.mixer.D': {'dtype': 'I32', 'shape': [1], "
                              "'data_offsets': [%d, %d]}", i ? ", " : "", i, 4 * i, 4 * i + 4);
    snprintf(h + k, cap - k, "}");
    int32_t data[N];
    for (int i = 0; i < N; i++) data[i] = i * 7;
    const char *path = join(dir, "model.safetensors");
    write_st(path, h, data, sizeof data);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_dir(&st, dir, &err), CN_OK);
    assert_int_equal(cn_st_count(st), N);
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "backbone.layers.%d.mixer.D", i);
        const cn_st_tensor *t = cn_st_find(st, name);
        assert_non_null(t);
        int32_t v;
        memcpy(&v, t->data, 4);
        assert_int_equal(v, i * 7);
    }
    cn_st_close(st);
    free(h);
    rm_dir(dir);
}

static const char *k_shard1 = "model-00001-of-00002.safetensors";
static const char *k_shard2 = "model-00002-of-00002.safetensors";

/* Writes a 2-shard checkpoint: x in shard 1, y and z in shard 2. */
static void write_two_shards(const char *dir) {
    float x[4] = {1, 2, 3, 4};
    write_st(join(dir, k_shard1),
             "{'x': {'dtype': 'F32', 'shape': [2, 2], 'data_offsets': [0, 16]}}", x, sizeof x);
    uint8_t yz[3 + 2] = {7, 8, 9, 0xaa, 0xbb};
    write_st(join(dir, k_shard2),
             "{'z': {'dtype': 'U8', 'shape': [2], 'data_offsets': [3, 5]},"
             " 'y': {'dtype': 'U8', 'shape': [3], 'data_offsets': [0, 3]}}",
             yz, sizeof yz);
}

static const char *k_index =
    "{'metadata': {'total_size': 21}, 'weight_map': {"
    "'x': 'model-00001-of-00002.safetensors',"
    "'y': 'model-00002-of-00002.safetensors',"
    "'z': 'model-00002-of-00002.safetensors'}}";

static void test_two_shards(void **state) {
    (void)state;
    char *dir = make_dir();
    write_two_shards(dir);
    write_text(join(dir, "model.safetensors.index.json"), k_index);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_dir(&st, dir, &err), CN_OK);
    assert_int_equal(cn_st_count(st), 3);
    const cn_st_tensor *x = cn_st_find(st, "x"), *y = cn_st_find(st, "y"), *z = cn_st_find(st, "z");
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(z);
    assert_string_equal(cn_st_file_path(st, x->file), join(dir, k_shard1));
    assert_string_equal(cn_st_file_path(st, y->file), join(dir, k_shard2));
    assert_int_equal(y->file, z->file);
    assert_int_not_equal(x->file, y->file);
    float xv[4];
    memcpy(xv, x->data, sizeof xv);
    assert_true(xv[0] == 1 && xv[3] == 4);
    const uint8_t *yv = y->data, *zv = z->data;
    assert_int_equal(yv[0], 7);
    assert_int_equal(yv[2], 9);
    assert_int_equal(zv[0], 0xaa);
    assert_int_equal(zv[1], 0xbb);
    assert_ptr_equal(zv, yv + 3);
    cn_st_close(st);
    rm_dir(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Defects in one file
 * ------------------------------------------------------------------------------------------- */

static void test_missing_file(void **state) {
    (void)state;
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_file(&st, "/nonexistent/x.safetensors", &err), CN_ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/x.safetensors"));
    assert_null(st);
}

static void test_too_short(void **state) {
    (void)state;
    char *dir = make_dir();
    const char *path = join(dir, "short.safetensors");
    write_bytes(path, "\x10\0\0", 3, NULL, 0);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_ETRUNC);
    assert_non_null(strstr(err.msg, "short.safetensors"));
    assert_non_null(strstr(err.msg, "3 bytes"));
    /* an empty file too */
    write_bytes(path, NULL, 0, NULL, 0);
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_ETRUNC);
    rm_dir(dir);
}

static void test_header_length_past_end(void **state) {
    (void)state;
    char *dir = make_dir();
    const char *path = join(dir, "trunc.safetensors");
    uint8_t buf[8 + 10] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(path, buf, sizeof buf, NULL, 0);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_ETRUNC);
    assert_non_null(strstr(err.msg, "trunc.safetensors"));
    assert_non_null(strstr(err.msg, "header length 100"));
    assert_non_null(strstr(err.msg, "18-byte"));
    /* a length so large that 8 + N would wrap */
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    write_bytes(path, huge, sizeof huge, NULL, 0);
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_ETRUNC);
    assert_null(st);
    rm_dir(dir);
}

static void test_header_not_json(void **state) {
    (void)state;
    expect_file_error("{'a': {'dtype': 'F32',", 0, CN_EFORMAT, "not JSON", NULL, NULL);
    expect_file_error("[1, 2, 3]", 0, CN_EFORMAT, "not a JSON object", NULL, NULL);
    expect_file_error("{} trailing", 0, CN_EFORMAT, "junk after", NULL, NULL);
    expect_file_error("{'w': 5}", 0, CN_EFORMAT, "'w'", "not an object", NULL);
}

static void test_empty_header_ok(void **state) {
    (void)state;
    char *dir = make_dir();
    const char *path = join(dir, "e.safetensors");
    write_st(path, "{'__metadata__': {}}", NULL, 0);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_OK);
    assert_int_equal(cn_st_count(st), 0);
    assert_null(cn_st_find(st, "x"));
    cn_st_close(st);
    rm_dir(dir);
}

static void test_bad_fields(void **state) {
    (void)state;
    /* dtype */
    expect_file_error("{'w.weight': {'shape': [2], 'data_offsets': [0, 8]}}", 8, CN_EFORMAT,
                      "'w.weight'", "dtype is missing", NULL);
    expect_file_error("{'w.weight': {'dtype': 4, 'shape': [2], 'data_offsets': [0, 8]}}", 8,
                      CN_EFORMAT, "'w.weight'", "dtype is not a string", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F4X', 'shape': [2], 'data_offsets': [0, 8]}}", 8,
                      CN_EDTYPE, "'w.weight'", "'F4X'", NULL);
    /* shape */
    expect_file_error("{'w.weight': {'dtype': 'F32', 'data_offsets': [0, 8]}}", 8, CN_EFORMAT,
                      "'w.weight'", "shape is missing", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': 2, 'data_offsets': [0, 8]}}", 8,
                      CN_EFORMAT, "'w.weight'", "shape is not a list", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [-2], 'data_offsets': [0, 8]}}", 8,
                      CN_EFORMAT, "'w.weight'", "shape[0] = -2", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [1, 1.5], 'data_offsets': [0, 8]}}",
                      8, CN_EFORMAT, "'w.weight'", "shape[1] = 1.5", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': ['2'], 'data_offsets': [0, 8]}}", 8,
                      CN_EFORMAT, "'w.weight'", "shape[0] is not a number", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [1,1,1,1,2],"
                      " 'data_offsets': [0, 8]}}",
                      8, CN_EFORMAT, "'w.weight'", "5 dimensions", NULL);
    /* data_offsets */
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [2]}}", 8, CN_EFORMAT, "'w.weight'",
                      "data_offsets is missing", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0]}}", 8,
                      CN_EFORMAT, "'w.weight'", "data_offsets", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [2], 'data_offsets': [-8, 0]}}", 8,
                      CN_EFORMAT, "'w.weight'", "non-negative", NULL);
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [2], 'data_offsets': {'a': 1}}}", 8,
                      CN_EFORMAT, "'w.weight'", "data_offsets", NULL);
}

static void test_bad_offsets(void **state) {
    (void)state;
    /* end before begin */
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [0], 'data_offsets': [8, 4]}}", 8,
                      CN_EFORMAT, "'w.weight'", "end 4 is before begin 8", NULL);
    /* end past the data buffer: names the tensor and both sizes */
    expect_file_error("{'w.weight': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]}}", 12,
                      CN_ETRUNC, "'w.weight'", "end 16", "12 bytes");
    /* size does not match shape x dtype */
    expect_file_error("{'w.weight': {'dtype': 'BF16', 'shape': [2, 3], 'data_offsets': [0, 8]}}",
                      16, CN_EFORMAT, "'w.weight'", "span 8 bytes", "[2, 3] of BF16 needs 12");
    /* overlapping tensors name both */
    expect_file_error("{'p': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
                      " 'q': {'dtype': 'F32', 'shape': [2], 'data_offsets': [4, 12]}}",
                      12, CN_EFORMAT, "'q'", "overlaps", "'p'");
    /* an empty tensor inside another's bytes is fine, a duplicate of it is not */
    char *dir = make_dir();
    const char *path = join(dir, "ok.safetensors");
    uint8_t d[8] = {0};
    write_st(path,
             "{'p': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},"
             " 'z': {'dtype': 'F32', 'shape': [0], 'data_offsets': [4, 4]}}",
             d, sizeof d);
    cn_err err;
    cn_safetensors *st = NULL;
    assert_int_equal(cn_st_open_file(&st, path, &err), CN_OK);
    cn_st_close(st);
    rm_dir(dir);
}

static void test_huge_dims(void **state) {
    (void)state;
    /* 2^40 * 2^40 elements overflows 64 bits */
    expect_file_error("{'big': {'dtype': 'F32', 'shape': [1099511627776, 1099511627776],"
                      " 'data_offsets': [0, 8]}}",
                      8, CN_EFORMAT, "'big'", "too large", NULL);
    /* 2^62 elements fits, times 4 bytes does not */
    expect_file_error("{'big': {'dtype': 'F32', 'shape': [4294967296, 1073741824],"
                      " 'data_offsets': [0, 8]}}",
                      8, CN_EFORMAT, "'big'", "too large", NULL);
    /* past 2^53 a double cannot hold the value exactly: refused rather than rounded */
    expect_file_error("{'big': {'dtype': 'U8', 'shape': [1e300], 'data_offsets': [0, 8]}}", 8,
                      CN_EFORMAT, "'big'", "shape[0]", NULL);
    /* a zero dim makes any other dim harmless */
    expect_file_error("{'big': {'dtype': 'F32', 'shape': [0, 1099511627776, 1099511627776],"
                      " 'data_offsets': [0, 8]}}",
                      8, CN_EFORMAT, "'big'", "span 8 bytes", "needs 0");
    /* offsets past the data buffer, as large as a double keeps exactly */
    expect_file_error("{'w': {'dtype': 'U8', 'shape': [8], 'data_offsets': [9007199254740984,"
                      " 9007199254740992]}}",
                      8, CN_ETRUNC, "'w'", "9007199254740992", NULL);
}

static void test_duplicate_in_file(void **state) {
    (void)state;
    expect_file_error("{'w': {'dtype': 'U8', 'shape': [1], 'data_offsets': [0, 1]},"
                      " 'w': {'dtype': 'U8', 'shape': [1], 'data_offsets': [1, 2]}}",
                      2, CN_EFORMAT, "'w'", "twice", NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Directories and indexes
 * ------------------------------------------------------------------------------------------- */

/* Opens dir and expects code and each non-NULL substring. */
static void expect_dir_error(const char *dir, int code, const char *s1, const char *s2,
                             const char *s3) {
    cn_err err;
    cn_err_clear(&err);
    cn_safetensors *st = NULL;
    int rc = cn_st_open_dir(&st, dir, &err);
    if (rc != code) fprintf(stderr, "got %d (%s), want %d\n", rc, err.msg, code);
    assert_int_equal(rc, code);
    assert_null(st);
    const char *subs[3] = {s1, s2, s3};
    for (int i = 0; i < 3; i++)
        if (subs[i] && !strstr(err.msg, subs[i])) fail_msg("'%s' not in: %s", subs[i], err.msg);
}

static void test_dir_empty(void **state) {
    (void)state;
    char *dir = make_dir();
    expect_dir_error(dir, CN_ENOENT, dir, "neither model.safetensors.index.json nor "
                     "model.safetensors exists", NULL);
    rm_dir(dir);
}

static void test_index_missing_shard(void **state) {
    (void)state;
    char *dir = make_dir();
    write_two_shards(dir);
    unlink(join(dir, k_shard2));
    write_text(join(dir, "model.safetensors.index.json"), k_index);
    expect_dir_error(dir, CN_ENOENT, "model.safetensors.index.json", k_shard2, "does not exist");
    rm_dir(dir);
}

static void test_index_tensor_not_in_shard(void **state) {
    (void)state;
    char *dir = make_dir();
    write_two_shards(dir);
    write_text(join(dir, "model.safetensors.index.json"),
               "{'weight_map': {'x': 'model-00001-of-00002.safetensors',"
               " 'y': 'model-00002-of-00002.safetensors',"
               " 'ghost.weight': 'model-00002-of-00002.safetensors'}}");
    expect_dir_error(dir, CN_EFORMAT, "'ghost.weight'", k_shard2, "no such tensor");
    /* listed in the wrong shard */
    write_text(join(dir, "model.safetensors.index.json"),
               "{'weight_map': {'x': 'model-00002-of-00002.safetensors',"
               " 'y': 'model-00002-of-00002.safetensors',"
               " 'z': 'model-00001-of-00002.safetensors'}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", "but it is in", k_shard1);
    rm_dir(dir);
}

static void test_index_duplicate_across_shards(void **state) {
    (void)state;
    char *dir = make_dir();
    write_two_shards(dir);
    uint8_t d[4] = {1, 2, 3, 4};
    /* shard 2 also carries x */
    write_st(join(dir, k_shard2),
             "{'y': {'dtype': 'U8', 'shape': [3], 'data_offsets': [0, 3]},"
             " 'x': {'dtype': 'U8', 'shape': [1], 'data_offsets': [3, 4]}}",
             d, sizeof d);
    write_text(join(dir, "model.safetensors.index.json"),
               "{'weight_map': {'x': 'model-00001-of-00002.safetensors',"
               " 'y': 'model-00002-of-00002.safetensors'}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", k_shard1, k_shard2);
    rm_dir(dir);
}

static void test_index_escaping_names(void **state) {
    (void)state;
    char *dir = make_dir();
    write_two_shards(dir);
    const char *idx = join(dir, "model.safetensors.index.json");
    write_text(idx, "{'weight_map': {'x': '../model-00001-of-00002.safetensors'}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", "'../model-00001-of-00002.safetensors'",
                     "not a plain file name");
    write_text(idx, "{'weight_map': {'x': '/etc/passwd'}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", "'/etc/passwd'", NULL);
    write_text(idx, "{'weight_map': {'x': '..'}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", "'..'", NULL);
    write_text(idx, "{'weight_map': {'x': ''}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", NULL, NULL);
    rm_dir(dir);
}

static void test_index_malformed(void **state) {
    (void)state;
    char *dir = make_dir();
    write_two_shards(dir);
    const char *idx = join(dir, "model.safetensors.index.json");
    write_text(idx, "{'weight_map': ");
    expect_dir_error(dir, CN_EFORMAT, "model.safetensors.index.json", "not a JSON object", NULL);
    write_text(idx, "{'metadata': {}}");
    expect_dir_error(dir, CN_EFORMAT, "model.safetensors.index.json", "weight_map is missing",
                     NULL);
    write_text(idx, "{'weight_map': []}");
    expect_dir_error(dir, CN_EFORMAT, "weight_map is not an object", NULL, NULL);
    write_text(idx, "{'weight_map': {}}");
    expect_dir_error(dir, CN_EFORMAT, "weight_map is empty", NULL, NULL);
    write_text(idx, "{'weight_map': {'x': 3}}");
    expect_dir_error(dir, CN_EFORMAT, "'x'", "does not map to a file name", NULL);
    /* a bad shard is reported under its own name */
    write_text(idx, k_index);
    write_bytes(join(dir, k_shard2), "\x01", 1, NULL, 0);
    expect_dir_error(dir, CN_ETRUNC, k_shard2, NULL, NULL);
    rm_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file),
        cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_two_shards),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_too_short),
        cmocka_unit_test(test_header_length_past_end),
        cmocka_unit_test(test_header_not_json),
        cmocka_unit_test(test_empty_header_ok),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_huge_dims),
        cmocka_unit_test(test_duplicate_in_file),
        cmocka_unit_test(test_dir_empty),
        cmocka_unit_test(test_index_missing_shard),
        cmocka_unit_test(test_index_tensor_not_in_shard),
        cmocka_unit_test(test_index_duplicate_across_shards),
        cmocka_unit_test(test_index_escaping_names),
        cmocka_unit_test(test_index_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
