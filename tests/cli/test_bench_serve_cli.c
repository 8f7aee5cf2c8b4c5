/* test_bench_serve_cli.c - `cairn bench serve` as a process on the tiny preset: every level's
 * streams generate what they were asked, a shared prefix is evaluated once (the in-flight join
 * and the cache), and bad flags are usage errors. Speeds are printed, never asserted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "test_util.h"

static char g_tmp[512];
static char g_model[600];

static cJSON *bench_json(const char *extra) {
    char *out = NULL;
    int rc = tu_sh(g_tmp, 0, &out, "'%s' bench serve --model '%s' --threads 2 --json %s", tu_cairn_bin(),
                   g_model, extra);
    assert_int_equal(rc, 0);
    assert_non_null(out);
    cJSON *j = cJSON_Parse(out);
    if (!j) fprintf(stderr, "not JSON:\n%s\n", out);
    free(out);
    assert_non_null(j);
    return j;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static void test_levels(void **st) {
    (void)st;
    cJSON *j = bench_json("--concurrency 1,3 --prompt 96 --gen 6");
    const cJSON *lv = cJSON_GetObjectItemCaseSensitive(j, "levels");
    assert_int_equal(cJSON_GetArraySize(lv), 2);
    const int want[2] = {1, 3};
    int i = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, lv) {
        const int c = want[i++];
        assert_int_equal((int)num(l, "concurrency"), c);
        assert_int_equal((int)num(l, "generated"), 6 * c);
        assert_int_equal((int)num(l, "sent"), 96 * c);
        assert_true(num(l, "evaluated") <= num(l, "sent"));
        assert_true(num(l, "tok_s") > 0);
        assert_true(num(l, "ttft_median_s") <= num(l, "ttft_p99_s"));
        assert_true(num(l, "tpot_median_s") <= num(l, "tpot_p99_s"));
    }
    cJSON_Delete(j);
}

/* four streams that share 1,600 of their 2,048 tokens: the shared part is evaluated once (the
 * first stream absorbs it in chunks of 512 while the others wait at the in-flight join for the
 * restore point where they part), not four times */
static void test_shared_prefix(void **st) {
    (void)st;
    cJSON *j = bench_json("--concurrency 4 --prompt 2048 --gen 4 --shared-prefix 1600");
    const cJSON *l = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "levels"), 0);
    const double eval = num(l, "evaluated"), bound = 2048 + 3 * (448 + 8);
    if (eval > bound) fprintf(stderr, "evaluated %.0f of %.0f\n", eval, num(l, "sent"));
    assert_true(eval <= bound);
    cJSON_Delete(j);
}

static void test_usage_errors(void **st) {
    (void)st;
    const char *bad[] = {"--concurrency 0", "--concurrency 65", "--concurrency 1,x", "--prompt 0",
                         "--shared-prefix 9999", "--gen 0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' bench serve --model '%s' %s", tu_cairn_bin(), g_model, bad[i]), 2);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' bench serve", tu_cairn_bin()), 2);
}

int main(void) {
    const char *base = getenv("CAIRN_TMP");
    if (!base) base = "/tmp";
    mkdir(base, 0755);
    snprintf(g_tmp, sizeof g_tmp, "%s/bench_serve_cli", base);
    tu_rmtree(g_tmp);
    mkdir(g_tmp, 0755);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_tmp);
    if (tu_sh(g_tmp, 0, NULL, "'%s' make-model --preset tiny --out '%s'", tu_cairn_bin(), g_model) != 0) {
        fprintf(stderr, "cannot write the tiny model\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_shared_prefix),
        cmocka_unit_test(test_usage_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) tu_rmtree(g_tmp);
    return rc;
}
