/* test_render_cli.c - `cairn render` as a process: stdin to stdout byte for byte, exit codes. */
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

#include "test_util.h"

static char *g_tmp; /* a scratch directory, made in main */

static void write_file(const char *name, const char *text, size_t len) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

/* Runs `cairn render ARGS < $tmp/in.json`, stdout to out.txt, stderr to err.txt; returns the
 * exit code. */
static int run(const char *args, const char *request) {
    write_file("in.json", request, strlen(request));
    const char *bin = getenv("CAIRN_BIN");
    if (!bin) bin = "build/cairn";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' render %s <'%s/in.json' >'%s/out.txt' 2>'%s/err.txt'", bin,
             args, g_tmp, g_tmp, g_tmp);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static char *slurp(const char *name, size_t *len) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    char *s = tu_read_file(p, len);
    assert_non_null(s);
    return s;
}

static void test_renders_to_stdout(void **state) {
    (void)state;
    assert_int_equal(run("--renderer nemotron3",
                         "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}"),
                     0);
    size_t n = 0;
    char *out = slurp("out.txt", &n);
    const char *want =
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n";
    assert_int_equal(n, strlen(want)); /* no newline added */
    assert_memory_equal(out, want, n);
    free(out);
    out = slurp("err.txt", &n);
    assert_int_equal(n, 0);
    free(out);
}

/* Golden assistant_reasoning_truncated, with thinking off, through the whole program. Note the
 * "\n" the template leaves between the emptied think block and the content. */
static void test_golden_end_to_end(void **state) {
    (void)state;
    const char *req =
        "{\"model\": \"x\", \"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
        " {\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\":"
        " \"4\", \"reasoning_content\": \"Simple arithmetic.\"}, {\"role\": \"user\","
        " \"content\": \"3+3?\"}], \"chat_template_kwargs\": {\"enable_thinking\": false}}";
    assert_int_equal(run("--renderer=nemotron3", req), 0);
    size_t n = 0;
    char *out = slurp("out.txt", &n);
    const char *want = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n<think></think>\n4<|im_end|>\n<|im_start|>user\n"
                       "3+3?<|im_end|>\n<|im_start|>assistant\n<think></think>";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(out, want, n);
    free(out);
}

static void test_model_dir(void **state) {
    (void)state;
    char args[1200], dir[1100];
    snprintf(dir, sizeof dir, "%s/m", g_tmp);
    mkdir(dir, 0755);
    const char *cfg =
        "{\"architectures\": [\"NemotronHForCausalLM\"], \"model_type\": \"nemotron_h\"}";
    write_file("m/config.json", cfg, strlen(cfg));
    snprintf(args, sizeof args, "--model '%s'", dir);
    assert_int_equal(run(args, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                               "\"think\": false}"),
                     0);
    size_t n = 0;
    char *out = slurp("out.txt", &n);
    assert_non_null(strstr(out, "<|im_start|>assistant\n<think></think>"));
    free(out);

    /* an unknown family is an error naming it, not a guess */
    cfg = "{\"model_type\": \"llama\"}";
    write_file("m/config.json", cfg, strlen(cfg));
    assert_int_equal(run(args, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}"), 1);
    char *err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "no chat renderer for model_type \"llama\""));
    free(err);
    out = slurp("out.txt", &n);
    assert_int_equal(n, 0);
    free(out);

    snprintf(args, sizeof args, "--model '%s/nowhere'", g_tmp);
    assert_int_equal(run(args, "{}"), 1);
    err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "config.json"));
    free(err);
}

static void test_bad_input_exit_1(void **state) {
    (void)state;
    size_t n;
    assert_int_equal(run("--renderer nemotron3", "{\"messages\": [}"), 1);
    char *err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "cairn: render: invalid JSON at byte 14"));
    free(err);
    assert_int_equal(run("--renderer nemotron3",
                         "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}"),
                     1);
    err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "unknown role \"robot\""));
    free(err);
    assert_int_equal(run("--renderer nemotron3", "{\"messages\": [{\"role\": \"user\"}]}"), 1);
    err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "missing content"));
    free(err);
    write_file("in.json", "{\"messages\": \"\xfe\"}", 17);
    char cmd[4096];
    const char *bin = getenv("CAIRN_BIN") ? getenv("CAIRN_BIN") : "build/cairn";
    snprintf(cmd, sizeof cmd,
             "'%s' render --renderer nemotron3 <'%s/in.json' 2>'%s/err.txt' >/dev/null", bin,
             g_tmp, g_tmp);
    int st = system(cmd);
    assert_int_equal(WEXITSTATUS(st), 1);
    err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "not valid UTF-8 (byte 14)"));
    free(err);
}

static void test_usage_exit_2(void **state) {
    (void)state;
    size_t n;
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    assert_int_equal(run("", req), 2);
    char *err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "exactly one of --model DIR and --renderer NAME"));
    free(err);
    assert_int_equal(run("--renderer nemotron3 --model /tmp", req), 2);
    assert_int_equal(run("--renderer chatml", req), 2);
    err = slurp("err.txt", &n);
    assert_non_null(strstr(err, "unknown renderer \"chatml\" (known: nemotron3)"));
    free(err);
    assert_int_equal(run("--bogus", req), 2);
    assert_int_equal(run("--help", req), 0);
    char *out = slurp("out.txt", &n);
    assert_non_null(strstr(out, "--renderer"));
    free(out);
}

int main(void) {
    g_tmp = tu_mkdtemp("render_cli");
    if (!g_tmp) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_renders_to_stdout), cmocka_unit_test(test_golden_end_to_end),
        cmocka_unit_test(test_model_dir),         cmocka_unit_test(test_bad_input_exit_1),
        cmocka_unit_test(test_usage_exit_2),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(g_tmp);
    free(g_tmp);
    return rc;
}
