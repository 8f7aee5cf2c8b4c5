/* test_st_writer.c - the streaming safetensors writer: layout, chunking, shards, and failures
 * (missing directory, failing producer, full disk) leaving no file under a final name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>

#include "model/st_test_util.h"
#include "model/st_writer.h"

/* Byte k of tensor i is a function of both, so misplaced data shows. */
static unsigned char pattern(int index, uint64_t k) {
    return (unsigned char)(index * 31 + k * 7 + (k >> 12));
}

typedef struct fill_state {
    int fail_index;     /* tensor whose fill fails, -1 none */
    uint64_t max_chunk; /* largest chunk seen */
    int calls;
} fill_state;

static int fill_pattern(void *ctx, int index, const char *name, uint64_t offset, void *buf,
                        uint64_t nbytes) {
    fill_state *fs = ctx;
    (void)name;
    fs->calls++;
    if (nbytes > fs->max_chunk) fs->max_chunk = nbytes;
    if (index == fs->fail_index) return CN_EINVAL;
    unsigned char *b = buf;
    for (uint64_t k = 0; k < nbytes; k++) b[k] = pattern(index, offset + k);
    return CN_OK;
}

static cn_st_writer *make_writer(void) {
    cn_st_writer *w = NULL;
    assert_int_equal(cn_st_writer_new(&w, NULL), CN_OK);
    int64_t s35[2] = {3, 5}, s7[1] = {7}, s3[1] = {3}, s2[1] = {2};
    assert_int_equal(cn_st_writer_add(w, "a.f32", CN_F32, 2, s35, NULL), CN_OK);
    assert_int_equal(cn_st_writer_add(w, "b.bf16", CN_BF16, 1, s7, NULL), CN_OK);
    assert_int_equal(cn_st_writer_add(w, "c.u8", CN_U8, 1, s3, NULL), CN_OK);
    assert_int_equal(cn_st_writer_add(w, "scalar", CN_F32, 0, NULL, NULL), CN_OK);
    assert_int_equal(cn_st_writer_add(w, "d \"quoted\"", CN_F64, 1, s2, NULL), CN_OK);
    return w;
}

/* Every tensor of the file is where its header says, aligned, contiguous and holds its pattern. */
static void check_file(const char *dir, const char *file, int expect_count) {
    tu_st s;
    tu_st_open(&s, dir, file);
    assert_int_equal(s.hlen % 8, 0);
    assert_int_equal(s.buf[8], '{');
    /* padding is spaces after the closing brace */
    size_t end = 8 + s.hlen;
    while (s.buf[end - 1] == ' ') end--;
    assert_int_equal(s.buf[end - 1], '}');
    assert_true(8 + s.hlen - end < 8);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(s.hdr, "__metadata__");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(meta, "format")->valuestring, "pt");
    assert_int_equal(cJSON_GetArraySize(s.hdr), expect_count + 1);
    uint64_t expect_off = 0;
    const char *names[] = {"a.f32", "b.bf16", "c.u8", "scalar", "d \"quoted\""};
    const char *elems[] = {"F32", "BF16", "U8", "F32", "F64"};
    const uint64_t esz[] = {4, 2, 1, 4, 8};
    cJSON *it;
    cJSON_ArrayForEach(it, s.hdr) {
        if (!strcmp(it->string, "__metadata__")) continue;
        int idx = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(it->string, names[i])) idx = i;
        assert_true(idx >= 0);
        cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        uint64_t a = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        assert_int_equal(a, expect_off); /* header order is file order, no holes */
        assert_int_equal(a % esz[idx], 0);
        assert_int_equal((8 + s.hlen + a) % esz[idx], 0);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(it, "dtype")->valuestring, elems[idx]);
        for (uint64_t k = 0; k < b - a; k++) assert_int_equal(s.data[a + k], pattern(idx, k));
        expect_off = b;
    }
    assert_int_equal(8 + s.hlen + expect_off, s.len);
    tu_st_close(&s);
}

static void test_single_file(void **state) {
    (void)state;
    char dir[1024], shape[64];
    tu_fresh_dir("st_single", dir, sizeof dir);
    cn_st_writer *w = make_writer();
    assert_int_equal(cn_st_writer_count(w), 5);
    assert_int_equal(cn_st_writer_total_bytes(w), 60 + 14 + 3 + 4 + 16);
    fill_state fs = {-1, 0, 0};
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_st_writer_write(w, dir, 0, fill_pattern, &fs, &err), CN_OK);
    check_file(dir, "model.safetensors", 5);
    assert_false(tu_exists(dir, "model.safetensors.tmp"));
    assert_false(tu_exists(dir, "model.safetensors.index.json"));
    tu_st s;
    tu_st_open(&s, dir, "model.safetensors");
    assert_string_equal(tu_st_shape(&s, "a.f32", shape, sizeof shape), "[3,5]");
    assert_string_equal(tu_st_shape(&s, "scalar", shape, sizeof shape), "[]");
    uint64_t nb = 0;
    assert_non_null(tu_st_tensor(&s, "scalar", &nb, NULL));
    assert_int_equal(nb, 4);
    /* element size descending: the F64 tensor comes first, the U8 last */
    uint64_t nb2 = 0;
    assert_ptr_equal(tu_st_tensor(&s, "d \"quoted\"", &nb2, NULL), s.data);
    tu_st_close(&s);
    cn_st_writer_free(w);
}

static void test_chunks_cover_large_tensor(void **state) {
    (void)state;
    char dir[1024];
    tu_fresh_dir("st_chunks", dir, sizeof dir);
    cn_st_writer *w = NULL;
    assert_int_equal(cn_st_writer_new(&w, NULL), CN_OK);
    int64_t n = (int64_t)(CN_ST_CHUNK / 4) * 2 + 3; /* two full chunks and a tail */
    assert_int_equal(cn_st_writer_add(w, "big", CN_F32, 1, &n, NULL), CN_OK);
    fill_state fs = {-1, 0, 0};
    assert_int_equal(cn_st_writer_write(w, dir, 0, fill_pattern, &fs, NULL), CN_OK);
    assert_int_equal(fs.calls, 3);
    assert_int_equal(fs.max_chunk, CN_ST_CHUNK);
    tu_st s;
    tu_st_open(&s, dir, "model.safetensors");
    uint64_t nb = 0;
    const unsigned char *p = tu_st_tensor(&s, "big", &nb, NULL);
    assert_int_equal(nb, (uint64_t)n * 4);
    for (uint64_t k = 0; k < nb; k++)
        if (p[k] != pattern(0, k)) fail_msg("byte %llu differs", (unsigned long long)k);
    tu_st_close(&s);
    cn_st_writer_free(w);
}

static void test_sharded(void **state) {
    (void)state;
    char dir[1024];
    tu_fresh_dir("st_sharded", dir, sizeof dir);
    cn_st_writer *w = NULL;
    assert_int_equal(cn_st_writer_new(&w, NULL), CN_OK);
    int64_t n = 250; /* 1000 bytes of F32 each */
    char name[32];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(cn_st_writer_add(w, name, CN_F32, 1, &n, NULL), CN_OK);
    }
    fill_state fs = {-1, 0, 0};
    /* a stale single-file checkpoint must not survive next to the shards */
    assert_int_equal(cn_st_writer_write(w, dir, 0, fill_pattern, &fs, NULL), CN_OK);
    assert_true(tu_exists(dir, "model.safetensors"));
    assert_int_equal(cn_st_writer_plan(w, 2500), 3);
    assert_int_equal(cn_st_writer_write(w, dir, 2500, fill_pattern, &fs, NULL), CN_OK);
    assert_false(tu_exists(dir, "model.safetensors"));
    cJSON *idx = tu_read_json(dir, "model.safetensors.index.json");
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(idx, "metadata");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(meta, "total_size")->valuedouble, 6000);
    cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    assert_int_equal(cJSON_GetArraySize(map), 6);
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "t%d", i);
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-00003.safetensors", i / 2 + 1);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(map, name)->valuestring, file);
        tu_st s;
        tu_st_open(&s, dir, file);
        assert_int_equal(cJSON_GetArraySize(s.hdr), 3);
        uint64_t nb = 0;
        const unsigned char *p = tu_st_tensor(&s, name, &nb, NULL);
        assert_non_null(p);
        assert_int_equal(nb, 1000);
        for (uint64_t k = 0; k < nb; k++) assert_int_equal(p[k], pattern(i, k));
        tu_st_close(&s);
        snprintf(file, sizeof file, "model-%05d-of-00003.safetensors.tmp", i / 2 + 1);
        assert_false(tu_exists(dir, file));
    }
    cJSON_Delete(idx);
    /* and back to one file: the stale index goes */
    assert_int_equal(cn_st_writer_write(w, dir, 1 << 20, fill_pattern, &fs, NULL), CN_OK);
    assert_true(tu_exists(dir, "model.safetensors"));
    assert_false(tu_exists(dir, "model.safetensors.index.json"));
    cn_st_writer_free(w);
}

static void test_missing_dir_is_eio(void **state) {
    (void)state;
    char dir[1024], sub[1100];
    tu_fresh_dir("st_missing", dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/does/not/exist", dir);
    cn_st_writer *w = make_writer();
    fill_state fs = {-1, 0, 0};
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_st_writer_write(w, sub, 0, fill_pattern, &fs, &err), CN_EIO);
    assert_int_equal(err.code, CN_EIO);
    assert_non_null(strstr(err.msg, sub));
    assert_int_equal(cn_write_file_atomic("/nonexistent-cairn/x.json", "{}", 2, &err), CN_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent-cairn/x.json"));
    cn_st_writer_free(w);
}

static void test_fill_error_leaves_nothing(void **state) {
    (void)state;
    char dir[1024];
    tu_fresh_dir("st_fillerr", dir, sizeof dir);
    cn_st_writer *w = make_writer();
    fill_state fs = {2, 0, 0};
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_st_writer_write(w, dir, 0, fill_pattern, &fs, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "c.u8"));
    assert_false(tu_exists(dir, "model.safetensors"));
    assert_false(tu_exists(dir, "model.safetensors.tmp"));
    /* sharded: the shards already complete are removed too */
    fs.fail_index = 4;
    assert_int_equal(cn_st_writer_write(w, dir, 16, fill_pattern, &fs, &err), CN_EINVAL);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
    assert_int_equal(system(cmd), 0);
    cn_st_writer_free(w);
}

/* A file size limit makes fwrite fail with EFBIG exactly as a full disk makes it fail with ENOSPC. */
static void test_disk_full_is_eio(void **state) {
    (void)state;
    char dir[1024];
    tu_fresh_dir("st_full", dir, sizeof dir);
    cn_st_writer *w = NULL;
    assert_int_equal(cn_st_writer_new(&w, NULL), CN_OK);
    int64_t n = 1 << 20; /* 4 MiB */
    assert_int_equal(cn_st_writer_add(w, "big", CN_F32, 1, &n, NULL), CN_OK);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64 << 10;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    fill_state fs = {-1, 0, 0};
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_st_writer_write(w, dir, 0, fill_pattern, &fs, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, CN_EIO);
    assert_non_null(strstr(err.msg, "model.safetensors"));
    assert_false(tu_exists(dir, "model.safetensors"));
    assert_false(tu_exists(dir, "model.safetensors.tmp"));
    cn_st_writer_free(w);
}

static void test_bad_declarations(void **state) {
    (void)state;
    cn_st_writer *w = make_writer();
    int64_t s4[1] = {4}, neg[1] = {-1}, s5[5] = {1, 1, 1, 1, 1};
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_st_writer_add(w, "a.f32", CN_F32, 1, s4, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "a.f32"));
    assert_int_equal(cn_st_writer_add(w, "", CN_F32, 1, s4, NULL), CN_EINVAL);
    assert_int_equal(cn_st_writer_add(w, "__metadata__", CN_F32, 1, s4, NULL), CN_EINVAL);
    assert_int_equal(cn_st_writer_add(w, "x", CN_NVFP4, 1, s4, NULL), CN_EINVAL);
    assert_int_equal(cn_st_writer_add(w, "x", CN_F32, 5, s5, NULL), CN_EINVAL);
    assert_int_equal(cn_st_writer_add(w, "x", CN_F32, 1, neg, NULL), CN_EINVAL);
    assert_int_equal(cn_st_writer_count(w), 5);
    /* many names: the index grows and still finds duplicates */
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(cn_st_writer_add(w, name, CN_U8, 1, s4, NULL), CN_OK);
    }
    assert_int_equal(cn_st_writer_add(w, "n777", CN_U8, 1, s4, NULL), CN_EINVAL);
    assert_int_equal(cn_st_writer_count(w), 1005);
    cn_st_writer_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file),
        cmocka_unit_test(test_chunks_cover_large_tensor),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_missing_dir_is_eio),
        cmocka_unit_test(test_fill_error_leaves_nothing),
        cmocka_unit_test(test_disk_full_is_eio),
        cmocka_unit_test(test_bad_declarations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
