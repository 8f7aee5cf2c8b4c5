/* test_ctx_plan.c - the default context: the config's max_position_embeddings when the budget
 * holds it, lowered (rounded, never below CN_CTX_MIN) when it does not, the user's --ctx as given;
 * the bytes it counts are the bytes the engine's states allocate; the line names why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/ctx_plan.h"
#include "model/state.h"
#include "test_util.h"

static cn_config g_cobble; /* models/cobble's config */

static int setup(void **st) {
    (void)st;
    cn_err err;
    cn_err_clear(&err);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/../../models/cobble", tu_data_dir());
    if (cn_config_load_dir(&g_cobble, dir, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

/* cobble: 2 attention layers and an attention-only MTP head, 2 KV heads of 64; 4 Mamba layers. */
static void test_bytes_from_config(void **st) {
    (void)st;
    uint64_t per_token, fixed;
    cn_ctx_state_bytes(&g_cobble, &per_token, &fixed);
    uint64_t kv_row = 2 * 2 * 64 * sizeof(float);
    assert_int_equal(per_token, 3 * kv_row + sizeof(uint64_t));
    uint64_t conv_dim = 16 * 64 + 2 * 2 * 64;
    assert_int_equal(fixed, 4 * (3 * conv_dim + 16 * 64 * 64) * sizeof(float));
    cn_config c = g_cobble; /* without a head, no draft cache */
    c.n_mtp = 0;
    cn_ctx_state_bytes(&c, &per_token, &fixed);
    assert_int_equal(per_token, 2 * kv_row + sizeof(uint64_t));
}

static void test_default_is_max_position_embeddings(void **st) {
    (void)st;
    assert_int_equal(g_cobble.max_position_embeddings, 262144); /* Nemotron 3 Nano's */
    cn_ctx_plan p;
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 0, CN_CTX_UNKNOWN, &p), CN_OK);
    assert_int_equal(p.ctx, 262144);
    assert_int_equal(p.why, CN_CTX_MAX_POS);
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 0, (uint64_t)64 << 30, &p), CN_OK);
    assert_int_equal(p.ctx, 262144);
    assert_int_equal(p.why, CN_CTX_MAX_POS);
    /* exactly enough is enough */
    uint64_t need = cn_ctx_plan_bytes(&p);
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 0, need, &p), CN_OK);
    assert_int_equal(p.why, CN_CTX_MAX_POS);
    char line[400];
    cn_ctx_plan_line(&p, line, sizeof line);
    assert_string_equal(line, "context 262144 tokens (max_position_embeddings), 3.0 KiB of state a token, 771.1 MiB");
}

static void test_scarce_memory_lowers(void **st) {
    (void)st;
    cn_ctx_plan p;
    uint64_t per_token, fixed;
    cn_ctx_state_bytes(&g_cobble, &per_token, &fixed);
    uint64_t budget = fixed + per_token * 10000 + per_token / 2;
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 0, budget, &p), CN_OK);
    assert_int_equal(p.why, CN_CTX_MEMORY);
    assert_int_equal(p.ctx, 10000 / CN_CTX_ROUND * CN_CTX_ROUND);
    assert_true(cn_ctx_plan_bytes(&p) <= budget);
    assert_int_equal(p.budget, budget);
    char line[400];
    cn_ctx_plan_line(&p, line, sizeof line);
    assert_non_null(strstr(line, "context 9984 tokens (lowered from max_position_embeddings 262144"));
    assert_non_null(strstr(line, "--ctx N"));
    /* one byte short of the maximum lowers it */
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 0, fixed + per_token * 262144 - 1, &p), CN_OK);
    assert_int_equal(p.why, CN_CTX_MEMORY);
    assert_int_equal(p.ctx, 262144 - CN_CTX_ROUND);
    /* nothing left: the floor */
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 0, 0, &p), CN_OK);
    assert_int_equal(p.ctx, CN_CTX_MIN);
    assert_int_equal(p.why, CN_CTX_MEMORY);
    /* a maximum under the floor stays the maximum */
    cn_config c = g_cobble;
    c.max_position_embeddings = 300;
    assert_int_equal(cn_ctx_plan_make(&c, 0, 0, &p), CN_OK);
    assert_int_equal(p.ctx, 300);
    assert_int_equal(p.why, CN_CTX_MAX_POS);
}

static void test_asked_is_kept(void **st) {
    (void)st;
    cn_ctx_plan p;
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 1000, 0, &p), CN_OK);
    assert_int_equal(p.ctx, 1000);
    assert_int_equal(p.why, CN_CTX_ASKED);
    assert_int_equal(cn_ctx_plan_make(&g_cobble, 1 << 20, CN_CTX_UNKNOWN, &p), CN_OK);
    assert_int_equal(p.ctx, 1 << 20); /* past the maximum too: the user's word */
    char line[400];
    assert_non_null(strstr(cn_ctx_plan_line(&p, line, sizeof line), "(--ctx)"));
    p.ctx = 7;
    assert_int_equal(cn_ctx_plan_make(&g_cobble, -1, 0, &p), CN_EINVAL);
    assert_int_equal(p.ctx, 7);
}

/* The plan counts what cn_state_create allocates: the live state and the MTP head's draft cache
 * (the engine's), less the prefix cache's keys, which are not a state buffer. */
static void test_counts_what_the_states_hold(void **st) {
    (void)st;
    cn_backend *b = tu_backend(1);
    assert_non_null(b);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/nh-mtp-bf16", tu_data_dir());
    cn_err err;
    cn_err_clear(&err);
    cn_model *m = NULL;
    int rc = cn_model_open(&m, dir, b, NULL, &err);
    if (rc) fail_msg("%s", err.msg);
    cn_ctx_plan p;
    assert_int_equal(cn_ctx_plan_make(cn_model_config(m), 1000, CN_CTX_UNKNOWN, &p), CN_OK);
    cn_state *live = NULL, *draft = NULL;
    assert_int_equal(cn_state_create(&live, m, p.ctx, 0), CN_OK);
    assert_int_equal(cn_state_create(&draft, m, p.ctx, 2), CN_OK);
    uint64_t held = cn_state_bytes(live) + cn_state_bytes(draft);
    assert_int_equal(held, cn_ctx_plan_bytes(&p) - (uint64_t)p.ctx * sizeof(uint64_t));
    /* a budget measured on the backend is finite here (the CPU reads /proc/meminfo) */
    if (!cn_backend_has_device_memory(b)) {
        cn_pc_opts o = {.ram_budget = 1 << 20};
        assert_true(cn_ctx_budget(m, &o) != CN_CTX_UNKNOWN);
    }
    cn_state_free(draft);
    cn_state_free(live);
    cn_model_close(m);
    cn_backend_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_from_config),
        cmocka_unit_test(test_default_is_max_position_embeddings),
        cmocka_unit_test(test_scarce_memory_lowers),
        cmocka_unit_test(test_asked_is_kept),
        cmocka_unit_test(test_counts_what_the_states_hold),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
