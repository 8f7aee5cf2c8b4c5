/* test_keys.c - trie keys: tokens, token pairs, media folds; and media identity through the
 * engine (two prompts whose placeholder ids are equal but whose images differ share nothing past
 * the image's start). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/keys.h"
#include "engine/engine.h"
#include "test_util.h"

static void test_token_keys(void **st) {
    (void)st;
    int32_t t[4] = {5, 6, 7, 8};
    cn_key k[4];
    assert_int_equal(cn_keys_count(4, 0), 4);
    assert_int_equal(cn_keys_build(t, 4, NULL, 0, 0, k), 0);
    for (int i = 0; i < 4; i++) assert_true(k[i] == (cn_key)t[i]);
}

static void test_pair_keys(void **st) {
    (void)st;
    int32_t t[4] = {5, 6, 7, 8};
    cn_key k[3];
    assert_int_equal(cn_keys_count(4, 1), 3);
    assert_int_equal(cn_keys_build(t, 4, NULL, 0, 1, k), 0);
    for (int i = 0; i < 3; i++) assert_true(k[i] == (((cn_key)t[i] << 32) | (cn_key)t[i + 1]));
    assert_int_equal(cn_keys_count(1, 1), 0);
}

static void test_media_fold(void **st) {
    (void)st;
    uint8_t a[16] = {1, 2, 3}, b[16] = {1, 2, 4};
    int64_t dims[2] = {4, 4}, dims2[2] = {2, 8};
    cn_media_item ma = {.pos = 2, .len = 3, .data = a, .nbytes = sizeof a, .dims = dims, .n_dims = 2};
    cn_media_item mb = ma, mc = ma;
    mb.data = b;
    mc.dims = dims2;
    uint32_t fa = cn_media_fold(&ma), fb = cn_media_fold(&mb), fc = cn_media_fold(&mc);
    assert_true(fa & CN_KEY_FOLD_BIT);
    assert_true(fa != fb && fa != fc);
    assert_true(fa == cn_media_fold(&ma));
    int32_t t[7] = {1, 2, 18, 18, 18, 3, 4};
    cn_key k[7], kp[6];
    assert_int_equal(cn_keys_build(t, 7, &ma, 1, 0, k), 0);
    assert_true(k[1] == 2 && k[2] == fa && k[3] == fa && k[4] == fa && k[5] == 3);
    /* pairs compose with folds: the divergence shows one key earlier */
    assert_int_equal(cn_keys_build(t, 7, &ma, 1, 1, kp), 0);
    assert_true(kp[1] == (((cn_key)2 << 32) | fa));
    /* bad items: outside the prompt, overlapping, empty */
    cn_media_item bad = ma;
    bad.len = 9;
    assert_int_equal(cn_keys_build(t, 7, &bad, 1, 0, k), -1);
    cn_media_item two[2] = {ma, ma};
    assert_int_equal(cn_keys_build(t, 7, two, 2, 0, k), -1);
    int32_t neg[1] = {-1};
    assert_int_equal(cn_keys_build(neg, 1, NULL, 0, 0, k), -1);
}

/* Same placeholder ids, different image bytes: the cache must not reuse past the image start. */
static void test_media_identity_in_engine(void **st) {
    (void)st;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/nh-mix-f32", tu_data_dir());
    cn_backend *b = tu_backend(2);
    cn_model *m;
    cn_err err;
    assert_int_equal(cn_model_open(&m, dir, b, NULL, &err), 0);
    cn_engine_opts o = {.ctx = 128, .chunk = 8, .cache = {.spacing = 8, .pre_end = 4}};
    cn_engine *e;
    assert_int_equal(cn_engine_open(&e, m, &o, &err), 0);
    int32_t t[40];
    for (int i = 0; i < 40; i++) t[i] = 30 + i;
    for (int i = 10; i < 26; i++) t[i] = 18; /* the image placeholder, repeated */
    uint8_t img_a[64], img_b[64];
    memset(img_a, 7, sizeof img_a);
    memset(img_b, 9, sizeof img_b);
    int64_t dims[1] = {16};
    cn_media_item ma = {.pos = 10, .len = 16, .data = img_a, .nbytes = 64, .dims = dims, .n_dims = 1};
    cn_media_item mb = ma;
    mb.data = img_b;
    cn_request r = {.tokens = t, .n_tokens = 40, .max_tokens = 1, .media = &ma, .n_media = 1};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    cn_result res;
    assert_int_equal(cn_engine_generate(e, &r, &res), 0);
    free(res.tokens);
    r.media = &mb; /* another image, same ids */
    assert_int_equal(cn_engine_generate(e, &r, &res), 0);
    assert_true(res.matched_tokens == 10 && res.cached_tokens <= 10);
    free(res.tokens);
    r.media = &ma; /* the first image again: reused well past the image */
    assert_int_equal(cn_engine_generate(e, &r, &res), 0);
    assert_true(res.cached_tokens >= 32);
    free(res.tokens);
    cn_engine_close(e);
    cn_model_close(m);
    cn_backend_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_keys),
        cmocka_unit_test(test_pair_keys),
        cmocka_unit_test(test_media_fold),
        cmocka_unit_test(test_media_identity_in_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
