/* test_bench_cache_cli.c - `cairn bench cache` as a process on the tiny preset: every pattern
 * reports and evaluates no more than its bound (new tokens + one restore spacing per request),
 * the figures are deterministic, and bad flags are usage errors. Wall-time ratios are printed by
 * the bench but never asserted here: timing on a shared machine is noise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <sys/wait.h>

#include "test_util.h"

static char g_tmp[512];
static char g_model[600];
static const char *g_cmd; /* "bench cache" once the dispatcher has it, else "bench-cache" */

static cJSON *bench_json(const char *extra) {
    char *out = NULL;
    int rc = tu_sh(g_tmp, 0, &out, "'%s' %s --model '%s' --prompt-tokens 300 --spacing 32 --threads 2 --repeat 1 --json %s",
                 tu_cairn_bin(), g_cmd, g_model, extra);
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

static void test_every_pattern_within_bound(void **st) {
    (void)st;
    cJSON *j = bench_json("");
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(j, "patterns");
    assert_true(cJSON_IsArray(pats));
    assert_int_equal(cJSON_GetArraySize(pats), 7);
    int id = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, pats) {
        id++;
        assert_int_equal((int)num(p, "id"), id);
        /* every pattern runs, the restart through the disk tier included */
        assert_null(cJSON_GetObjectItemCaseSensitive(p, "skipped"));
        double sent = num(p, "sent"), eval = num(p, "evaluated"), fresh = num(p, "new"),
               bound = num(p, "bound");
        if (eval > bound)
            fprintf(stderr, "pattern %d: evaluated %.0f > bound %.0f (new %.0f)\n", id, eval, bound, fresh);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "pass")));
        assert_true(eval <= bound);
        assert_true(fresh <= eval);
        assert_true(eval <= sent);
        assert_true(num(p, "requests") >= 2);
        /* every pattern but the first (all new, split by a give-up) reuses something */
        if (id > 2) assert_true(eval < sent);
        const cJSON *snap = cJSON_GetObjectItemCaseSensitive(p, "snapshot_bytes");
        assert_true(cJSON_IsObject(snap));
        assert_true(num(snap, "ram") > 0);
        assert_true(num(p, "wall_ms") > 0);
        assert_true(num(p, "cold_ms") > 0);
    }
    /* the identical retry resumes where the give-up stopped: nothing is evaluated twice */
    const cJSON *p1 = cJSON_GetArrayItem(pats, 0);
    assert_true(num(p1, "evaluated") == num(p1, "new"));
    assert_true(num(p1, "sent") == 2 * num(p1, "new"));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pass")));
    cJSON_Delete(j);
}

/* Same seed, same token streams, same counts; a subset runs only what it names. */
static void test_deterministic_subset(void **st) {
    (void)st;
    cJSON *a = bench_json("--patterns 2,3");
    cJSON *b = bench_json("--patterns 3,2");
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "patterns");
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(b, "patterns");
    assert_int_equal(cJSON_GetArraySize(pa), 2);
    assert_int_equal(cJSON_GetArraySize(pb), 2);
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(pa, i), *y = cJSON_GetArrayItem(pb, i);
        assert_int_equal((int)num(x, "id"), i == 0 ? 2 : 3);
        assert_true(num(x, "sent") == num(y, "sent"));
        assert_true(num(x, "evaluated") == num(y, "evaluated"));
        assert_true(num(x, "new") == num(y, "new"));
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void test_text_report(void **st) {
    (void)st;
    char *out = NULL;
    assert_int_equal(tu_sh(g_tmp, 0, &out, "'%s' %s --model '%s' --prompt-tokens 200 --spacing 16 --repeat 1 --patterns 1,7",
                         tu_cairn_bin(), g_cmd, g_model), 0);
    assert_non_null(out);
    assert_non_null(strstr(out, "(1) give-up at 30%, identical retry: 2 requests"));
    assert_non_null(strstr(out, "PASS"));
    assert_non_null(strstr(out, "x cold"));
    assert_non_null(strstr(out, "(7) server restarted"));
    free(out);
}

static void test_usage_errors(void **st) {
    (void)st;
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' %s --patterns 8", tu_cairn_bin(), g_cmd), 2);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' %s --patterns 1,x", tu_cairn_bin(), g_cmd), 2);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' %s --prompt-tokens 10", tu_cairn_bin(), g_cmd), 2);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' %s --spacing 0", tu_cairn_bin(), g_cmd), 2);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' %s --bogus", tu_cairn_bin(), g_cmd), 2);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' %s --model /nonexistent/model --patterns 1", tu_cairn_bin(), g_cmd), 1);
    char *out = NULL;
    assert_int_equal(tu_sh(g_tmp, 0, &out, "'%s' %s --help", tu_cairn_bin(), g_cmd), 0);
    assert_non_null(out);
    assert_non_null(strstr(out, "--prompt-tokens"));
    free(out);
}

int main(void) {
    const char *base = getenv("CAIRN_TMP");
    if (!base) base = "/tmp";
    mkdir(base, 0755);
    snprintf(g_tmp, sizeof g_tmp, "%s/bench_cache_cli", base);
    tu_rmtree(g_tmp);
    mkdir(g_tmp, 0755);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_tmp);
    if (tu_sh(g_tmp, 0, NULL, "'%s' make-model --preset tiny --out '%s'", tu_cairn_bin(), g_model) != 0) {
        fprintf(stderr, "cannot write the tiny model\n");
        return 1;
    }
    /* the lead wires the command as `cairn bench cache`; until then it is `cairn bench-cache` */
    g_cmd = tu_sh(g_tmp, 0, NULL, "'%s' bench cache --help", tu_cairn_bin()) == 0 ? "bench cache" : "bench-cache";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_pattern_within_bound),
        cmocka_unit_test(test_deterministic_subset),
        cmocka_unit_test(test_text_report),
        cmocka_unit_test(test_usage_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) tu_rmtree(g_tmp);
    return rc;
}
