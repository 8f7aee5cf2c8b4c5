/* test_parse_cli.c - `cairn parse` end to end: generated text on stdin, one JSON object out, and
 * bad input (invalid --tools JSON, invalid UTF-8, unknown renderer) refused with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <sys/wait.h>

#include "test_util.h"

static char *g_tmp;

/* Writes n bytes to g_tmp/name; the path goes to path[cap]. */
static void write_tmp(const char *name, const char *data, size_t n, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Runs `cairn parse ARGS < input`; returns the exit status, stdout in *out, stderr in *err. */
static int run_parse(const char *input, size_t n, const char *args, char **out, char **err) {
    char in[600], op[600], ep[600], cmd[4096];
    write_tmp("in.txt", input, n, in, sizeof in);
    snprintf(op, sizeof op, "%s/out.txt", g_tmp);
    snprintf(ep, sizeof ep, "%s/err.txt", g_tmp);
    snprintf(cmd, sizeof cmd, "%s parse %s <'%s' >'%s' 2>'%s'", tu_cairn_bin(), args, in, op, ep);
    int st = system(cmd);
    *out = tu_read_file(op, NULL);
    *err = tu_read_file(ep, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    assert_true(cJSON_IsString(v));
    return v->valuestring;
}

static const char OUTPUT[] =
    "The user wants the weather.\n</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>\n";

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
    "\"string\"},\"metric\":{\"type\":\"boolean\"}}}}}]";

static void test_thinking_content_and_calls(void **st) {
    (void)st;
    char *out, *err;
    assert_int_equal(run_parse(OUTPUT, strlen(OUTPUT), "--renderer nemotron3", &out, &err), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(str(j, "thinking"), "The user wants the weather.");
    assert_string_equal(str(j, "content"), "Checking.");
    const cJSON *calls = cJSON_GetObjectItem(j, "tool_calls");
    assert_int_equal(cJSON_GetArraySize(calls), 1);
    const cJSON *c0 = cJSON_GetArrayItem(calls, 0), *args = cJSON_GetObjectItem(c0, "arguments");
    assert_string_equal(str(c0, "name"), "get_weather");
    /* No --tools: JSON where it parses, strings elsewhere. */
    assert_string_equal(str(args, "city"), "Paris");
    assert_int_equal(cJSON_GetObjectItem(args, "days")->valueint, 3);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(args, "metric")));
    cJSON_Delete(j);
    free(out);
    free(err);
}

static void test_tools_type_arguments(void **st) {
    (void)st;
    char tp[600], rp[600], args[1400], *out, *err;
    write_tmp("tools.json", TOOLS, strlen(TOOLS), tp, sizeof tp);
    char req[512];
    snprintf(req, sizeof req, "{\"model\":\"x\",\"tools\":%s}", TOOLS);
    write_tmp("request.json", req, strlen(req), rp, sizeof rp);
    const char *files[] = {tp, rp}; /* a tools array, and a request carrying one */
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "--renderer nemotron3 --tools '%s' --chunk 3", files[i]);
        assert_int_equal(run_parse(OUTPUT, strlen(OUTPUT), args, &out, &err), 0);
        cJSON *j = cJSON_Parse(out);
        const cJSON *a =
            cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tool_calls"), 0),
                                "arguments");
        assert_string_equal(str(a, "days"), "3"); /* the schema says string */
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a, "metric")));
        assert_string_equal(str(j, "content"), "Checking.");
        cJSON_Delete(j);
        free(out);
        free(err);
    }
}

static void test_no_think_and_chunking(void **st) {
    (void)st;
    static const char in[] = "Sure.</think> 4 <tool_ca then 😀";
    char *out, *err, *out1, *err1;
    assert_int_equal(run_parse(in, strlen(in), "--renderer nemotron3 --no-think", &out, &err), 0);
    cJSON *j = cJSON_Parse(out);
    assert_string_equal(str(j, "thinking"), "");
    assert_string_equal(str(j, "content"), in);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tool_calls")), 0);
    cJSON_Delete(j);
    /* byte-sized pieces print the very same line */
    assert_int_equal(
        run_parse(in, strlen(in), "--renderer nemotron3 --no-think --chunk 1", &out1, &err1), 0);
    assert_string_equal(out, out1);
    free(out), free(err), free(out1), free(err1);
}

static void test_bad_input(void **st) {
    (void)st;
    char tp[600], args[800], *out, *err;
    /* invalid JSON in --tools: named with its position */
    static const char bad[] = "[{\"type\": \"function\",\n  \"function\": {\"name\": }}]";
    write_tmp("bad.json", bad, strlen(bad), tp, sizeof tp);
    snprintf(args, sizeof args, "--renderer nemotron3 --tools '%s'", tp);
    assert_int_equal(run_parse("hi", 2, args, &out, &err), 1);
    assert_non_null(strstr(err, "invalid JSON at line 2"));
    assert_non_null(strstr(err, "bad.json"));
    free(out), free(err);
    /* valid JSON, not tools */
    write_tmp("notools.json", "{\"model\": \"x\"}", strlen("{\"model\": \"x\"}"), tp, sizeof tp);
    snprintf(args, sizeof args, "--renderer nemotron3 --tools '%s'", tp);
    assert_int_equal(run_parse("hi", 2, args, &out, &err), 1);
    assert_non_null(strstr(err, "\"tools\" array"));
    free(out), free(err);
    static const char noname[] = "[{\"type\":\"function\",\"function\":{}}]";
    write_tmp("noname.json", noname, strlen(noname), tp, sizeof tp);
    snprintf(args, sizeof args, "--renderer nemotron3 --tools '%s'", tp);
    assert_int_equal(run_parse("hi", 2, args, &out, &err), 1);
    assert_non_null(strstr(err, "tools[0]"));
    free(out), free(err);
    snprintf(args, sizeof args, "--renderer nemotron3 --tools '%s/missing.json'", g_tmp);
    assert_int_equal(run_parse("hi", 2, args, &out, &err), 1);
    assert_non_null(strstr(err, "missing.json"));
    free(out), free(err);
    /* invalid UTF-8 on stdin, and a character cut by the end */
    assert_int_equal(run_parse("ok \xC3\x28", 5, "--renderer nemotron3", &out, &err), 1);
    assert_non_null(strstr(err, "invalid UTF-8"));
    assert_non_null(strstr(err, "offset 3"));
    assert_string_equal(out, "");
    free(out), free(err);
    assert_int_equal(run_parse("ok \xE2\x9C", 5, "--renderer nemotron3 --chunk 2", &out, &err), 1);
    assert_non_null(strstr(err, "ends inside a character"));
    free(out), free(err);
    assert_int_equal(run_parse("a\0b", 3, "--renderer nemotron3", &out, &err), 1);
    assert_non_null(strstr(err, "NUL byte at offset 1"));
    free(out), free(err);
    /* usage errors exit 2 */
    assert_int_equal(run_parse("hi", 2, "--renderer llama3", &out, &err), 2);
    assert_non_null(strstr(err, "llama3"));
    free(out), free(err);
    assert_int_equal(run_parse("hi", 2, "", &out, &err), 2);
    assert_non_null(strstr(err, "--renderer"));
    free(out), free(err);
}

static int setup(void **st) {
    (void)st;
    g_tmp = tu_mkdtemp("parse-cli");
    return g_tmp ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    tu_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thinking_content_and_calls),
        cmocka_unit_test(test_tools_type_arguments),
        cmocka_unit_test(test_no_think_and_chunking),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
