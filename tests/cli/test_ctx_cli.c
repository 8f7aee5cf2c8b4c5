/* test_ctx_cli.c - the context `cairn info` and `cairn serve` plan on the default model: one line
 * naming the length, why, the bytes of state a token and in all; cobble's max_position_embeddings
 * when memory holds it, lowered when the cache budget leaves no room, --ctx as given. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/meminfo.h"
#include "test_util.h"

static char g_tmp[512];
static char g_cobble[700];

static int setup(void **st) {
    (void)st;
    char *d = tu_mkdtemp("ctx-cli");
    if (!d) return -1;
    snprintf(g_tmp, sizeof g_tmp, "%s", d);
    free(d);
    snprintf(g_cobble, sizeof g_cobble, "%s/../../models/cobble", tu_data_dir());
    return 0;
}

static int teardown(void **st) {
    (void)st;
    tu_rmtree(g_tmp);
    return 0;
}

/* 1 when the host clearly holds cobble's whole context beside a small RAM tier: its 771 MiB of
 * state and 47 MiB of weights, past the sixteenth kept for scratch. */
static int memory_allows(void) {
    uint64_t avail, total;
    if (cn_host_memory(&avail, &total)) return 0;
    return avail > total / 16 + ((uint64_t)1 << 30);
}

static void test_info_prints_the_plan(void **st) {
    (void)st;
    char *o = NULL;
    assert_int_equal(tu_sh(g_tmp, 1, &o, "%s info --model %s --backend cpu --cache-ram 1M", tu_cairn_bin(), g_cobble), 0);
    assert_non_null(strstr(o, "plan:        context "));
    assert_non_null(strstr(o, "KiB of state a token, "));
    if (memory_allows()) {
        assert_non_null(strstr(o, "plan:        context 262144 tokens (max_position_embeddings), 3.0 KiB of state a token, 771.1 MiB"));
        assert_non_null(strstr(o, "at 262144 tokens"));
    } else {
        assert_non_null(strstr(o, "(lowered from max_position_embeddings 262144"));
    }
    free(o);
}

/* A RAM tier larger than any host leaves no room: the floor, and the line says why. */
static void test_info_lowers_when_memory_is_scarce(void **st) {
    (void)st;
    char *o = NULL;
    assert_int_equal(tu_sh(g_tmp, 1, &o, "%s info --model %s --backend cpu --cache-ram 64T", tu_cairn_bin(), g_cobble), 0);
    assert_non_null(strstr(o, "plan:        context 512 tokens (lowered from max_position_embeddings 262144 to fit 0 B"));
    assert_non_null(strstr(o, "--ctx N sets it"));
    assert_non_null(strstr(o, "at 512 tokens"));
    free(o);
    assert_int_equal(tu_sh(g_tmp, 1, &o, "%s info --model %s --backend cpu --cache-ram 64T --ctx 20000", tu_cairn_bin(), g_cobble), 0);
    assert_non_null(strstr(o, "plan:        context 20000 tokens (--ctx)"));
    free(o);
    assert_int_equal(tu_sh(g_tmp, 1, &o, "%s info --model %s --ctx 0", tu_cairn_bin(), g_cobble), 2);
    assert_non_null(strstr(o, "--ctx must be positive"));
    free(o);
}

/* serve says the plan in one startup line before it listens. */
static void test_serve_says_the_plan(void **st) {
    (void)st;
    char *o = NULL;
    int rc = tu_sh(g_tmp, 0, &o,
                   "{ E='%s/serve.err'; %s serve --model %s --backend cpu --port 0 --cache-ram 64T --threads 1 2>\"$E\" & p=$!; "
                   "i=0; while [ $i -lt 300 ] && ! grep -q 'serving' \"$E\"; do sleep 0.1; i=$((i+1)); done; "
                   "kill $p; wait $p; s=$?; cat \"$E\"; exit $s; }",
                   g_tmp, tu_cairn_bin(), g_cobble);
    assert_int_equal(rc, 0);
    const char *line = strstr(o, "cairn: context 512 tokens (lowered from max_position_embeddings 262144");
    assert_non_null(line);
    assert_true(line < strstr(o, "cairn: serving cobble on http://127.0.0.1:"));
    free(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_prints_the_plan),
        cmocka_unit_test(test_info_lowers_when_memory_is_scarce),
        cmocka_unit_test(test_serve_says_the_plan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
