/* test_make_model_cli.c - `cairn make-model` as a process: exit codes 0 / 1 / 2 and its output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char g_tmp[1024]; /* set once in main: $CAIRN_TMP/make_model_cli */

/* Runs `$CAIRN_BIN make-model ARGS`, stdout+stderr to $tmp/out.txt; returns the exit code. */
static int run(const char *args) {
    const char *bin = getenv("CAIRN_BIN");
    if (!bin) bin = "build/cairn";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' make-model %s >'%s/out.txt' 2>&1", bin, args, g_tmp);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static char *output(void) {
    char p[1200];
    snprintf(p, sizeof p, "%s/out.txt", g_tmp);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static int exists(const char *rel) {
    char p[1200];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", g_tmp, rel);
    return stat(p, &st) == 0;
}

static void test_success(void **state) {
    (void)state;
    char args[1200];
    snprintf(args, sizeof args, "--preset tiny --out '%s/m1' --seed 7 --dtype f32", g_tmp);
    assert_int_equal(run(args), 0);
    assert_true(exists("m1/config.json"));
    assert_true(exists("m1/model.safetensors"));
    assert_true(exists("m1/tokenizer.json"));
    char *out = output();
    assert_non_null(strstr(out, "8 layers"));
    assert_non_null(strstr(out, "343200 parameters"));
    assert_non_null(strstr(out, "bytes"));

    snprintf(args, sizeof args, "--preset=tiny --out='%s/m2' --no-mtp --layers 2 --dtype fp8", g_tmp);
    assert_int_equal(run(args), 0);
    assert_true(exists("m2/hf_quant_config.json"));
    assert_non_null(strstr(output(), "2 layers \"M*\""));

    /* sliding-window attention layers: 'S' with the window in config.json */
    snprintf(args, sizeof args, "--preset tiny --out '%s/m3' --no-mtp --pattern 'MS*E' --window 8", g_tmp);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(output(), "4 layers \"MS*E\""));
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/m3/config.json", g_tmp);
    FILE *f = fopen(cfg, "rb");
    assert_non_null(f);
    static char text[16384];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    char *sw = strstr(text, "\"sliding_window\"");
    assert_non_null(sw);
    assert_int_equal(atoi(sw + strcspn(sw, "0123456789")), 8);
    assert_null(strstr(sw + 1, "\"sliding_window\"")); /* once */

    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(output(), "--preset"));
}

static void test_usage_errors(void **state) {
    (void)state;
    char args[1200];
    snprintf(args, sizeof args, "--preset huge --out '%s/bad'", g_tmp);
    assert_int_equal(run(args), 2);
    assert_non_null(strstr(output(), "huge"));
    assert_int_equal(run("--preset tiny"), 2);
    assert_non_null(strstr(output(), "--out"));
    snprintf(args, sizeof args, "--preset tiny --out '%s/bad' --dtype f16", g_tmp);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof args, "--preset tiny --out '%s/bad' --layers 99", g_tmp);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof args, "--preset tiny --out '%s/bad' --layers 0", g_tmp);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof args, "--preset tiny --out '%s/bad' --pattern 'MX'", g_tmp);
    assert_int_equal(run(args), 2);
    assert_non_null(strstr(output(), "M, *, S, E, -"));
    snprintf(args, sizeof args, "--preset tiny --out '%s/bad' --pattern 'MS' --window -3", g_tmp);
    assert_int_equal(run(args), 2);
    assert_non_null(strstr(output(), "--window"));
    snprintf(args, sizeof args, "--preset tiny --out '%s/bad' --bogus", g_tmp);
    assert_int_equal(run(args), 2);
    assert_false(exists("bad"));
}

static void test_runtime_error(void **state) {
    (void)state;
    char args[1200], p[1100];
    snprintf(p, sizeof p, "%s/plainfile", g_tmp);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(args, sizeof args, "--preset tiny --out '%s/plainfile/model'", g_tmp);
    assert_int_equal(run(args), 1);
    assert_non_null(strstr(output(), "plainfile"));
}

int main(void) {
    const char *base = getenv("CAIRN_TMP");
    snprintf(g_tmp, sizeof g_tmp, "%s/make_model_cli", base && *base ? base : "/tmp");
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_tmp, g_tmp);
    if (system(cmd) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_success),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_runtime_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
