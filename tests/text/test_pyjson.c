/* test_pyjson.c - Python's str(), repr(), json.dumps and str.strip over parsed JSON.
 *
 * Every expectation below is what CPython 3.11 prints for json.loads of the same text (checked
 * when the table was written; the float repr was also checked against Python on 400k random and
 * power-of-two doubles).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"

enum { STR, REPR, DUMPS };

static void check(const char *json, int how, const char *want) {
    cJSON *v = NULL;
    cn_err err;
    if (cn_pyjson_parse(json, strlen(json), &v, &err)) fail_msg("%s: %s", json, err.msg);
    cn_strbuf b = CN_STRBUF_INIT;
    if (how == STR) cn_py_str(&b, v);
    else if (how == REPR) cn_py_repr(&b, v);
    else cn_py_dumps(&b, v);
    if (strcmp(b.p, want) != 0)
        fail_msg("%s %s: got [%s], want [%s]", how == STR ? "str" : how == REPR ? "repr" : "dumps",
                 json, b.p, want);
    cn_strbuf_free(&b);
    cJSON_Delete(v);
}

static void test_ints(void **state) {
    (void)state;
    check("0", STR, "0");
    check("-0", STR, "0"); /* int("-0") is 0 */
    check("42", STR, "42");
    check("-7", DUMPS, "-7");
    check("12345678901234567890123", STR, "12345678901234567890123"); /* arbitrary size */
    check("9007199254740993", DUMPS, "9007199254740993");             /* not a double */
}

static void test_floats(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"1.0", "1.0"},         {"1e-05", "1e-05"},     {"0.00001", "1e-05"},
        {"0.0001", "0.0001"},   {"0.1", "0.1"},
        {"0.30000000000000004", "0.30000000000000004"},
        {"1E2", "100.0"},       {"100.0e-2", "1.0"},    {"-0.0", "-0.0"},
        {"0.0", "0.0"},         {"1e16", "1e+16"},      {"1e15", "1000000000000000.0"},
        {"123456789012345678.0", "1.2345678901234568e+17"},
        {"2.5E-7", "2.5e-07"},  {"5e-324", "5e-324"},   {"1e-400", "0.0"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"},
        {"1e22", "1e+22"},      {"1e23", "1e+23"},      {"123456.789", "123456.789"},
        {"1.5", "1.5"},         {"3.14159", "3.14159"}, {"-2.5e3", "-2500.0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        check(cases[k][0], STR, cases[k][1]);
        check(cases[k][0], DUMPS, cases[k][1]);
    }
    /* overflow reads as inf: str() says inf, json.dumps says Infinity */
    check("1E400", STR, "inf");
    check("-1E400", STR, "-inf");
    check("[1E400, -1E400]", DUMPS, "[Infinity, -Infinity]");
    check("[1E400]", STR, "[inf]");
    char buf[40];
    cn_py_float_repr(NAN, buf);
    assert_string_equal(buf, "nan");
    cn_py_float_repr(0.1 + 0.2, buf);
    assert_string_equal(buf, "0.30000000000000004");
    cn_py_float_repr(ldexp(1.0, -1022), buf);
    assert_string_equal(buf, "2.2250738585072014e-308");
}

static void test_scalars(void **state) {
    (void)state;
    check("true", STR, "True");
    check("false", STR, "False");
    check("null", STR, "None");
    check("true", DUMPS, "true");
    check("null", DUMPS, "null");
    check("\"plain\"", STR, "plain");
    check("\"plain\"", REPR, "'plain'");
}

static void test_containers(void **state) {
    (void)state;
    const char *v = "{\"k\": [1, 2.0, true, null, \"it's\"], \"e\": {}, \"l\": []}";
    check(v, STR, "{'k': [1, 2.0, True, None, \"it's\"], 'e': {}, 'l': []}");
    check(v, DUMPS, "{\"k\": [1, 2.0, true, null, \"it's\"], \"e\": {}, \"l\": []}");
    /* a repeated key keeps its first place and takes the last value */
    check("{\"a\": 1, \"b\": 2, \"a\": 3}", DUMPS, "{\"a\": 3, \"b\": 2}");
    check("{\"a\": {\"x\": 1}, \"a\": [2]}", STR, "{'a': [2]}");
}

static void test_string_repr(void **state) {
    (void)state;
    check("\"it's\"", REPR, "\"it's\"");
    check("\"say \\\"hi\\\"\"", REPR, "'say \"hi\"'");
    check("\"both ' and \\\"\"", REPR, "'both \\' and \"'");
    check("\"back\\\\slash\\ttab\\nnl\\rcr\"", REPR, "'back\\\\slash\\ttab\\nnl\\rcr'");
    check("\"\\u0007\\u007f\\u0085\\u00a0\\u00ad\"", REPR, "'\\x07\\x7f\\x85\\xa0\\xad'");
    check("\"\\u2028\\u200b\\ufeff\\ue000\\ufdd0\"", REPR,
          "'\\u2028\\u200b\\ufeff\\ue000\\ufdd0'");
    check("\"\\udb40\\udc01\"", REPR, "'\\U000e0001'");
    check("\"caf\\u00e9 \\ud83d\\ude00 \\u65e5\"", REPR,
          "'caf\xc3\xa9 \xf0\x9f\x98\x80 \xe6\x97\xa5'");
}

static void test_string_dumps(void **state) {
    (void)state;
    /* ensure_ascii=False: only quote, backslash and C0 controls are escaped; DEL and U+2028 not */
    check("\"q\\\" b\\\\ \\b\\f\\n\\r\\t \\u0001 \\u007f \\u2028 \\u00e9\"", DUMPS,
          "\"q\\\" b\\\\ \\b\\f\\n\\r\\t \\u0001 \x7f \xe2\x80\xa8 \xc3\xa9\"");
    check("\"a/b\"", DUMPS, "\"a/b\""); /* the solidus is not escaped */
}

static void strip_is(const char *s, const char *want) {
    size_t a, z;
    cn_py_strip(s, strlen(s), &a, &z);
    if (z - a != strlen(want) || memcmp(s + a, want, z - a) != 0)
        fail_msg("strip [%s]: got [%.*s], want [%s]", s, (int)(z - a), s + a, want);
}

static void test_strip(void **state) {
    (void)state;
    strip_is("  a b \n\t", "a b");
    strip_is("\x0b\x0c\x1c\x1d\x1e\x1fx\r", "x");
    strip_is("\xc2\x85\xc2\xa0x\xe3\x80\x80", "x");                 /* U+0085 U+00A0 .. U+3000 */
    /* U+2003, U+2028, U+2029, U+205F */
    strip_is("\xe2\x80\x83x\xe2\x80\xa8\xe2\x80\xa9\xe2\x81\x9f", "x");
    strip_is("\xe2\x80\x8bx\xe2\x80\x8b", "\xe2\x80\x8bx\xe2\x80\x8b"); /* U+200B is not space */
    strip_is("   ", "");
    strip_is("", "");
    strip_is("\xc3\xa9", "\xc3\xa9");
}

static void test_utf8(void **state) {
    (void)state;
    size_t at = 0;
    assert_true(cn_utf8_valid("a\xc3\xa9\xf0\x9f\x98\x80", 7, &at));
    assert_false(cn_utf8_valid("ab\x80", 3, &at));
    assert_int_equal(at, 2);
    assert_false(cn_utf8_valid("\xe2\x82", 2, &at)); /* truncated */
    assert_false(cn_utf8_valid("\xf4\x90\x80\x80", 4, &at)); /* above U+10FFFF */
    assert_false(cn_utf8_valid("\xe0\x80\xaf", 3, &at));     /* overlong */
    assert_false(cn_utf8_valid("\xed\xbf\xbf", 3, &at));     /* surrogate */
}

static void test_parse_errors_name_the_place(void **state) {
    (void)state;
    cJSON *v = NULL;
    cn_err err;
    const char *j = "{\n  \"a\": tru\n}";
    assert_int_equal(cn_pyjson_parse(j, strlen(j), &v, &err), CN_EFORMAT);
    assert_non_null(strstr(err.msg, "line 2, column 8"));
    assert_null(v);
    char deep[1200];
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    assert_int_equal(cn_pyjson_parse(deep, 1200, &v, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "deeper than 512"));
    memset(deep, '[', 500);
    memset(deep + 500, ']', 500);
    assert_int_equal(cn_pyjson_parse(deep, 1000, &v, &err), 0);
    cJSON_Delete(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ints),          cmocka_unit_test(test_floats),
        cmocka_unit_test(test_scalars),       cmocka_unit_test(test_containers),
        cmocka_unit_test(test_string_repr),   cmocka_unit_test(test_string_dumps),
        cmocka_unit_test(test_strip),         cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_parse_errors_name_the_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
