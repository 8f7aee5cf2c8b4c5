/* test_model_load.c - every checkpoint defect is rejected at open with its own clear message.
 *
 * Each case copies a good golden checkpoint into a scratch directory, rewrites it with one defect
 * (through the real safetensors writer), and expects cn_model_open to fail with the right code and
 * a message naming the tensor or field, without leaking (the suite also runs under ASan/LSan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "model/model.h"
#include "model/safetensors.h"
#include "model/st_writer.h"
#include "tensor/cpu/cpu_backend.h"
#include "test_util.h"

typedef enum { MUT_NONE, MUT_DROP, MUT_RESHAPE, MUT_RETYPE } mutation;

typedef struct rewrite {
    const cn_safetensors *src;
    const char *target; /* tensor the mutation applies to */
    mutation mut;
} rewrite;

static int fill(void *ctx, int index, const char *name, uint64_t offset, void *buf, uint64_t n) {
    (void)index;
    const rewrite *r = ctx;
    const cn_st_tensor *t = cn_st_find(r->src, name);
    /* A reshaped tensor keeps the source bytes it still has room for, then zeros. */
    uint64_t have = t->nbytes > offset ? t->nbytes - offset : 0;
    if (have > n) have = n;
    memcpy(buf, (const char *)t->data + offset, have);
    memset((char *)buf + have, 0, n - have);
    return 0;
}

static void copy_file(const char *from_dir, const char *to_dir, const char *name) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/%s", from_dir, name);
    snprintf(b, sizeof b, "%s/%s", to_dir, name);
    size_t n = 0;
    char *data = tu_read_file(a, &n);
    if (!data) return;
    FILE *f = fopen(b, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
    free(data);
}

/* A copy of tests/data/<model> with one tensor mutated; returns the new directory (free it). */
static char *make_variant(const char *model, const char *target, mutation mut) {
    char src_dir[600];
    snprintf(src_dir, sizeof src_dir, "%s/%s", tu_data_dir(), model);
    char *dir = tu_mkdtemp("ckpt");
    assert_non_null(dir);
    copy_file(src_dir, dir, "config.json");
    copy_file(src_dir, dir, "generation_config.json");
    cn_safetensors *st;
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_st_open_dir(&st, src_dir, &err), 0);
    cn_st_writer *w;
    assert_int_equal(cn_st_writer_new(&w, &err), 0);
    int found = target == NULL;
    for (int i = 0; i < cn_st_count(st); i++) {
        const cn_st_tensor *t = cn_st_at(st, i);
        int hit = target && !strcmp(t->name, target);
        found |= hit;
        int64_t shape[CN_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        cn_dtype dt = t->dtype;
        if (hit && mut == MUT_DROP) continue;
        if (hit && mut == MUT_RESHAPE) shape[0] += 1;
        if (hit && mut == MUT_RETYPE) dt = cn_dtype_size(t->dtype) == 4 ? CN_I32 : CN_I16;
        assert_int_equal(cn_st_writer_add(w, t->name, dt, t->ndim, shape, &err), 0);
    }
    assert_true(found);
    rewrite r = {st, target, mut};
    assert_int_equal(cn_st_writer_write(w, dir, 0, fill, &r, &err), 0);
    cn_st_writer_free(w);
    cn_st_close(st);
    return dir;
}

/* Opens dir and expects code with each non-NULL needle in the message. */
static void expect_open_error(const char *dir, int code, const char *n1, const char *n2) {
    cn_backend *b = cn_cpu_backend_create(1);
    assert_non_null(b);
    cn_model *m = NULL;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_model_open(&m, dir, b, NULL, &err);
    if (rc != code || (n1 && !strstr(err.msg, n1)) || (n2 && !strstr(err.msg, n2)))
        fprintf(stderr, "got %d '%s', want %d with '%s' '%s'\n", rc, err.msg, code, n1 ? n1 : "",
                n2 ? n2 : "");
    assert_int_equal(rc, code);
    if (n1) assert_non_null(strstr(err.msg, n1));
    if (n2) assert_non_null(strstr(err.msg, n2));
    assert_null(m);
    cn_backend_free(b);
}

static void test_good_copy_opens(void **st) {
    (void)st;
    char *dir = make_variant("nh-mix-f32", NULL, MUT_NONE);
    cn_backend *b = cn_cpu_backend_create(1);
    cn_model *m;
    cn_err err;
    assert_int_equal(cn_model_open(&m, dir, b, NULL, &err), 0);
    cn_model_close(m);
    cn_backend_free(b);
    tu_rmtree(dir);
    free(dir);
}

static void test_missing_tensor(void **st) {
    (void)st;
    const char *name = "backbone.layers.1.mixer.k_proj.weight";
    char *dir = make_variant("nh-mix-f32", name, MUT_DROP);
    expect_open_error(dir, CN_ENOTENSOR, "missing tensor", name);
    tu_rmtree(dir);
    free(dir);
}

static void test_wrong_shape(void **st) {
    (void)st;
    const char *name = "backbone.layers.0.mixer.in_proj.weight";
    char *dir = make_variant("nh-mix-f32", name, MUT_RESHAPE);
    expect_open_error(dir, CN_ESHAPE, name, "expected [");
    tu_rmtree(dir);
    free(dir);
    /* a small vector is checked too */
    dir = make_variant("nh-mix-f32", "backbone.layers.0.mixer.A_log", MUT_RESHAPE);
    expect_open_error(dir, CN_ESHAPE, "backbone.layers.0.mixer.A_log", "expected [");
    tu_rmtree(dir);
    free(dir);
}

static void test_unsupported_dtype(void **st) {
    (void)st;
    const char *name = "backbone.layers.2.mixer.experts.3.up_proj.weight";
    char *dir = make_variant("nh-mix-f32", name, MUT_RETYPE);
    expect_open_error(dir, CN_EDTYPE, name, "I32");
    tu_rmtree(dir);
    free(dir);
    dir = make_variant("nh-mix-f32", "backbone.norm_f.weight", MUT_RETYPE);
    expect_open_error(dir, CN_EDTYPE, "backbone.norm_f.weight", "I32");
    tu_rmtree(dir);
    free(dir);
}

static void test_fp8_without_scale(void **st) {
    (void)st;
    const char *name = "backbone.layers.0.mixer.in_proj.weight_scale";
    char *dir = make_variant("nh-fp8", name, MUT_DROP);
    expect_open_error(dir, CN_ENOTENSOR, name, "F8");
    tu_rmtree(dir);
    free(dir);
}

static void test_mtp_promised_but_missing(void **st) {
    (void)st;
    char *dir = make_variant("nh-mtp-bf16", "mtp.layers.0.eh_proj.weight", MUT_DROP);
    expect_open_error(dir, CN_ENOTENSOR, "mtp.layers.0.eh_proj.weight", NULL);
    tu_rmtree(dir);
    free(dir);
}

static void test_truncated_file(void **st) {
    (void)st;
    char *dir = make_variant("nh-mix-f32", NULL, MUT_NONE);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 100), 0);
    expect_open_error(dir, CN_ETRUNC, "model.safetensors", NULL);
    assert_int_equal(truncate(path, 4), 0);
    expect_open_error(dir, CN_ETRUNC, "model.safetensors", NULL);
    tu_rmtree(dir);
    free(dir);
}

static void test_malformed_header(void **st) {
    (void)st;
    char *dir = make_variant("nh-mix-f32", NULL, MUT_NONE);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 8, SEEK_SET), 0);
    fputs("{not json", f);
    fclose(f);
    expect_open_error(dir, CN_EFORMAT, "model.safetensors", NULL);
    tu_rmtree(dir);
    free(dir);
}

/* config.json with one field changed (value NULL removes it). */
static char *config_variant(const char *field, const char *json_value) {
    char *dir = make_variant("nh-mix-f32", NULL, MUT_NONE);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = tu_read_file(path, NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON_DeleteItemFromObject(j, field);
    if (json_value) cJSON_AddItemToObject(j, field, cJSON_Parse(json_value));
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    FILE *f = fopen(path, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    return dir;
}

static void test_config_defects(void **st) {
    (void)st;
    char *dir = config_variant("hidden_size", NULL);
    expect_open_error(dir, CN_ECONFIG, "hidden_size", "config.json");
    tu_rmtree(dir);
    free(dir);
    dir = config_variant("mamba_num_heads", "\"twelve\"");
    expect_open_error(dir, CN_ECONFIG, "mamba_num_heads", NULL);
    tu_rmtree(dir);
    free(dir);
    /* A config that disagrees with the weights is a shape error on the first tensor it breaks. */
    dir = config_variant("vocab_size", "1000");
    expect_open_error(dir, CN_ESHAPE, "backbone.embeddings.weight", "expected [1000");
    tu_rmtree(dir);
    free(dir);
    dir = config_variant("hybrid_override_pattern", "\"M*EM-E*MM\"");
    cn_backend *b = cn_cpu_backend_create(1);
    cn_model *m = NULL;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_model_open(&m, dir, b, NULL, &err);
    assert_true(rc == CN_ECONFIG || rc == CN_ENOTENSOR); /* layer count or layer 8's tensors */
    assert_null(m);
    cn_backend_free(b);
    tu_rmtree(dir);
    free(dir);
}

static void test_missing_files(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("empty");
    expect_open_error(dir, CN_ENOENT, "config.json", NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char src[600];
    snprintf(src, sizeof src, "%s/nh-mix-f32", tu_data_dir());
    copy_file(src, dir, "config.json");
    expect_open_error(dir, CN_ENOENT, "model.safetensors", NULL);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_copy_opens),   cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_wrong_shape),       cmocka_unit_test(test_unsupported_dtype),
        cmocka_unit_test(test_fp8_without_scale), cmocka_unit_test(test_mtp_promised_but_missing),
        cmocka_unit_test(test_truncated_file),    cmocka_unit_test(test_malformed_header),
        cmocka_unit_test(test_config_defects),    cmocka_unit_test(test_missing_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
