/* test_json_constraint.c - the JSON recogniser, the forced tool call's recogniser, and the token
 * masks built on them.
 *
 * Byte level: valid documents are taken byte by byte and end accepting, invalid ones are refused
 * at the byte that breaks them, prefixes are taken but not complete, and schemas narrow what is
 * taken. Token level: random walks over the synthetic tokenizer's vocabulary, choosing only among
 * the tokens a mask leaves, must end in text that cJSON parses and that satisfies the schema (or,
 * for a tool, that the template's parser returns as a call of an offered tool).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"
#include "text/constraint.h"
#include "text/json_constraint.h"
#include "text/parser.h"
#include "text/toolcall_constraint.h"
#include "text/token_bytes.h"
#include "text/tokenizer.h"

/* Index of the first refused byte of s (strlen(s) if all are taken); *acc gets accepting(). */
static size_t run(const cn_jc_schema *s, int node, const char *txt, size_t n, int *acc) {
    cn_jc r;
    cn_jc_init(&r, s, node);
    for (size_t i = 0; i < n; i++) {
        if (!cn_jc_feed(&r, txt + i, 1)) return i;
        /* every proper prefix of a JSON text that is not itself a number or literal is incomplete */
    }
    *acc = cn_jc_accepting(&r);
    return n;
}

static int takes(const cn_jc_schema *s, int node, const char *txt) {
    int acc = 0;
    return run(s, node, txt, strlen(txt), &acc) == strlen(txt) && acc;
}

static int refuses(const cn_jc_schema *s, int node, const char *txt) {
    int acc = 0;
    return run(s, node, txt, strlen(txt), &acc) < strlen(txt);
}

static int partial(const cn_jc_schema *s, int node, const char *txt) {
    int acc = 1;
    return run(s, node, txt, strlen(txt), &acc) == strlen(txt) && !acc;
}

static void test_valid_documents(void **state) {
    (void)state;
    cn_jc_schema *s;
    assert_int_equal(cn_jc_schema_new(&s), 0);
    static const char *const ok[] = {
        "{}", "[]", "0", "-0", "12", "-12.5E+10", "1e5", "0.25", "true", "false", "null", "\"\"",
        "{\"a\":[1,2.5e-3,-0,true,false,null,\"x\\n\\u00e9\\\"\\/\",{}]}",
        "\"h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"",
        "  {\"k\" : \"v\" ,\n  \"n\":{\"m\":[[],[{}]]}}",
        "[\"\\ud83d\\ude00\",\"tab\\there\"]",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        assert_true(takes(s, 0, ok[i]));
        cJSON *j = cJSON_Parse(ok[i]);
        assert_non_null(j); /* the list itself is valid JSON */
        cJSON_Delete(j);
    }
    /* checking never moves the committed state */
    cn_jc r;
    cn_jc_init(&r, s, 0);
    assert_true(cn_jc_check(&r, "{\"a\"", 4));
    assert_true(cn_jc_check(&r, "[", 1));
    assert_true(cn_jc_feed(&r, "[1", 2));
    assert_true(cn_jc_check(&r, "2]", 2));
    assert_false(cn_jc_check(&r, "}", 1));
    assert_true(cn_jc_feed(&r, ",2]", 3));
    assert_true(cn_jc_finished(&r));
    assert_false(cn_jc_check(&r, " ", 1)); /* nothing after the root value */
    cn_jc_schema_free(s);
}

static void test_invalid_documents(void **state) {
    (void)state;
    cn_jc_schema *s;
    assert_int_equal(cn_jc_schema_new(&s), 0);
    static const char *const bad[] = {
        "{\"a\":}", "[1,]", "01", "{\"a\" 1}", "\"\x01\"", "\"\\x\"", "trux", "nul1",
        "\"\xc3\x28\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "\"\xf5\x80\x80\x80\"", "{} x", "1 ",
        "[1 2]", "{\"a\":1,}", "{,}", "-", "-a", "1.", "1.e3", "1e", "1e+", "+1", ".5", "[}", "{]",
        "\"\\u12g4\"", "'a'", "{a:1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int acc = 0;
        size_t at = run(s, 0, bad[i], strlen(bad[i]), &acc);
        assert_true(at < strlen(bad[i]) || !acc);
        cJSON *j = cJSON_Parse(bad[i]);
        int parsed_whole = j && !cJSON_IsInvalid(j);
        cJSON_Delete(j);
        (void)parsed_whole; /* cJSON is lenient about trailing bytes; the recogniser is not */
    }
    /* nesting is bounded: a deep array is refused before CN_JC_MAX_DEPTH */
    char deep[64];
    memset(deep, '[', 40);
    deep[40] = '\0';
    assert_true(refuses(s, 0, deep));
    /* whitespace runs are bounded, every run on its own */
    char ws[64];
    snprintf(ws, sizeof ws, "[%*s1,%*s2]", CN_JC_MAX_WS, "", CN_JC_MAX_WS, "");
    assert_true(takes(s, 0, ws));
    snprintf(ws, sizeof ws, "[%*s1]", CN_JC_MAX_WS + 1, "");
    assert_true(refuses(s, 0, ws));
    /* digits are bounded */
    assert_true(takes(s, 0, "12345678901234567890"));
    assert_true(refuses(s, 0, "123456789012345678901"));
    assert_true(takes(s, 0, "1e123"));
    assert_true(refuses(s, 0, "1e1234"));
    cn_jc_schema_free(s);
}

static void test_prefixes(void **state) {
    (void)state;
    cn_jc_schema *s;
    assert_int_equal(cn_jc_schema_new(&s), 0);
    static const char *const pre[] = {"{\"a\":1", "\"abc", "[", "-", "1.", "1e", "{\"a\"", "\"\\",
                                      "\"\\u00", "\"\xe6\x97", "t", "[1,", " "};
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++) assert_true(partial(s, 0, pre[i]));
    /* a top-level number or literal may end at any time */
    assert_true(takes(s, 0, "1"));
    assert_true(takes(s, 0, "1.5"));
    /* the any-object root of Ollama's "json" takes objects only */
    int obj;
    cn_err err;
    assert_int_equal(cn_jc_schema_add(s, NULL, &obj, &err), 0);
    assert_true(takes(s, obj, " {\"x\":[1,{\"y\":null}]}"));
    assert_true(refuses(s, obj, "[1]"));
    assert_true(refuses(s, obj, "\"s\""));
    assert_true(refuses(s, obj, "1"));
    cn_jc_schema_free(s);
}

static int compile_text(cn_jc_schema *s, const char *schema, int *node, cn_err *err) {
    cJSON *j = cJSON_Parse(schema);
    assert_non_null(j);
    cn_err_clear(err);
    int rc = cn_jc_schema_add(s, j, node, err);
    cJSON_Delete(j);
    return rc;
}

static const char *kPerson =
    "{\"type\":\"object\",\"title\":\"P\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":3,\"description\":\"d\"},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2},"
    "\"ok\":{\"type\":\"boolean\"},\"n\":{\"type\":\"null\"},\"w\":{\"type\":[\"number\",\"null\"]},"
    "\"c\":{\"const\":\"x\"},\"e\":{\"enum\":[1,12,\"z\",null]}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static void test_schema(void **state) {
    (void)state;
    cn_jc_schema *s;
    cn_err err;
    int p;
    assert_int_equal(cn_jc_schema_new(&s), 0);
    assert_int_equal(compile_text(s, kPerson, &p, &err), 0);
    static const char *const ok[] = {
        "{\"name\":\"abc\",\"age\":3}",
        "{\"age\":-1,\"tags\":[\"a\",\"b\"],\"name\":\"\"}",
        "{\"name\":\"\xc3\xa9\xc3\xa9\xc3\xa9\",\"age\":0,\"ok\":true,\"n\":null,\"w\":1.5e3}",
        "{ \"name\" : \"a\\n\" , \"age\" : 1 , \"w\" : null, \"c\":\"x\", \"e\":12 }",
        "{\"name\":\"a\",\"age\":1,\"e\":1,\"tags\":[]}",
        "{\"name\":\"a\",\"age\":1,\"e\":null,\"tags\":[\"b\"]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) assert_true(takes(s, p, ok[i]));
    static const char *const bad[] = {
        "{\"name\":\"abcd\"",             /* maxLength counts characters */
        "{\"x\":1}",                       /* not a property */
        "{\"name\":\"a\"}",                /* age is required */
        "{\"name\":\"a\",\"name\":\"b\"}", /* each key once */
        "{\"age\":1.5}",                   /* integer */
        "{\"age\":1e3}",
        "{\"tags\":[\"a\",\"a\",\"a\"]}",  /* maxItems */
        "{\"tags\":[\"c\"]}",              /* enum */
        "{\"ok\":1}", "{\"n\":false}", "{\"w\":\"1\"}", "{\"c\":\"y\"}", "{\"e\":123}", "{\"e\":2}",
        "[]", "{\"name\":1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_true(refuses(s, p, bad[i]));
    assert_true(partial(s, p, "{\"name\":\"a\",\"age\":1,\"e\":1")); /* 1 or 12: not yet decided */
    /* once every key is in, only the end may follow */
    int q;
    assert_int_equal(compile_text(s, "{\"properties\":{\"a\":{\"type\":\"boolean\"}}}", &q, &err), 0);
    assert_true(takes(s, q, "{\"a\":true}"));
    assert_true(takes(s, q, "{}"));
    assert_true(refuses(s, q, "{\"a\":true,"));
    /* anyOf / oneOf with branches of different types: the first byte picks one */
    assert_int_equal(compile_text(s, "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"null\"},"
                                     "{\"oneOf\":[{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},{\"enum\":[1,true]}]}]}",
                                  &q, &err), 0);
    static const char *const any_ok[] = {"\"ab\"", "null", "[1,2]", "1", "true", " \"\""};
    for (size_t i = 0; i < sizeof any_ok / sizeof *any_ok; i++) assert_true(takes(s, q, any_ok[i]));
    static const char *const any_bad[] = {"\"abc\"", "2", "false", "{}", "[1.5]", "nul1"};
    for (size_t i = 0; i < sizeof any_bad / sizeof *any_bad; i++) assert_true(refuses(s, q, any_bad[i]));
    /* $ref into $defs, as pydantic writes nested models; a cycle is refused, not followed */
    assert_int_equal(compile_text(s, "{\"$defs\":{\"Pet\":{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"cat\",\"dog\"]}},"
                                     "\"required\":[\"k\"]}},\"type\":\"object\",\"properties\":{\"pets\":{\"type\":\"array\","
                                     "\"items\":{\"$ref\":\"#/$defs/Pet\"}},\"best\":{\"anyOf\":[{\"$ref\":\"#/$defs/Pet\"},{\"type\":\"null\"}]}},"
                                     "\"required\":[\"pets\"]}", &q, &err), 0);
    assert_true(takes(s, q, "{\"pets\":[{\"k\":\"cat\"},{\"k\":\"dog\"}],\"best\":null}"));
    assert_true(refuses(s, q, "{\"pets\":[{\"k\":\"cow\"}]}"));
    assert_true(refuses(s, q, "{\"pets\":[{}]}"));
    assert_int_equal(compile_text(s, "{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/N\"}}}},"
                                     "\"$ref\":\"#/$defs/N\"}", &q, &err), CN_EUNSUPPORTED);
    if (!strstr(err.msg, "refer to itself")) fail_msg("%s", err.msg);
    assert_int_equal(compile_text(s, "{\"$ref\":\"http://example.com/s.json\"}", &q, &err), CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "$ref"));
    /* minLength / minItems */
    assert_int_equal(compile_text(s, "{\"type\":\"array\",\"minItems\":2,\"items\":{\"type\":\"string\",\"minLength\":2}}", &q, &err), 0);
    assert_true(takes(s, q, "[\"ab\",\"cd\"]"));
    assert_true(refuses(s, q, "[\"ab\"]"));
    assert_true(refuses(s, q, "[\"a\""));
    cn_jc_schema_free(s);
}

static void test_schema_refusals(void **state) {
    (void)state;
    cn_jc_schema *s;
    cn_err err;
    int p;
    assert_int_equal(cn_jc_schema_new(&s), 0);
    assert_int_equal(compile_text(s, "{\"type\":\"string\",\"pattern\":\"x\"}", &p, &err), CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "pattern"));
    assert_int_equal(compile_text(s, "{\"type\":\"object\",\"properties\":{\"a\":{\"format\":\"date\"}}}", &p, &err),
                     CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "$.properties.a"));
    assert_non_null(strstr(err.msg, "format"));
    assert_int_equal(compile_text(s, "{\"type\":\"strin\"}", &p, &err), CN_EUNSUPPORTED);
    assert_int_equal(compile_text(s, "{\"properties\":{},\"required\":[\"z\"]}", &p, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "z"));
    assert_int_equal(compile_text(s, "{\"type\":\"object\",\"additionalProperties\":true}", &p, &err), CN_EUNSUPPORTED);
    assert_int_equal(compile_text(s, "{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"a\",2]}]}", &p, &err), CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "branches 0 and 1"));
    assert_int_equal(compile_text(s, "{\"type\":\"string\",\"oneOf\":[{\"maxLength\":2}]}", &p, &err), CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "oneOf"));
    assert_int_equal(compile_text(s, "{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", &p, &err), CN_EINVAL);
    assert_int_equal(compile_text(s, "{\"enum\":[]}", &p, &err), CN_EINVAL);
    assert_int_equal(compile_text(s, "[1]", &p, &err), CN_EINVAL);
    cn_jc_schema_free(s);
}

/* ---- the forced tool call ------------------------------------------------------------------ */

static const char *kTools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},\"opts\":{\"type\":\"object\",\"properties\":"
    "{\"x\":{\"type\":\"boolean\"}}}},\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";

static int tcc_takes(const cn_tcc_spec *sp, const char *txt, int *finished) {
    cn_tcc r;
    cn_tcc_init(&r, sp);
    for (size_t i = 0; txt[i]; i++)
        if (!cn_tcc_feed(&r, txt + i, 1)) return 0;
    *finished = cn_tcc_finished(&r);
    return 1;
}

static void test_tool_call(void **state) {
    (void)state;
    cJSON *tools = cJSON_Parse(kTools);
    cn_tcc_spec *sp;
    cn_err err;
    assert_int_equal(cn_tcc_spec_new(&sp, tools, NULL, &err), 0);
    int fin = 0;
    const char *call = "\n<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n"
                       "<parameter=city>\nSt <Malo>\n</parameter>\n<parameter=unit>\nf\n</parameter>\n"
                       "<parameter=opts>\n{\"x\": true}\n</parameter>\n</function>\n</tool_call>";
    assert_true(tcc_takes(sp, call, &fin));
    assert_true(fin);
    assert_true(tcc_takes(sp, "<tool_call>\n<function=noop>\n</function>\n</tool_call>", &fin) && fin);
    static const char *const bad[] = {
        "<tool_call>\n<function=other>",
        "<tool_call>\n<function=get_weather>\n</function>", /* city and days are required */
        "<tool_call>\n<function=get_weather>\n<parameter=city>\na</b\n",  /* "</" in a raw value */
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n01234567890",  /* maxLength */
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3.5",
        "<tool_call>\n<function=get_weather>\n<parameter=unit>\nk",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=days>",
        "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n",
        "      <tool_call>", "text",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_false(tcc_takes(sp, bad[i], &fin));
    cn_tcc_spec_free(sp);
    /* one tool by name; an unknown name is refused */
    assert_int_equal(cn_tcc_spec_new(&sp, tools, "noop", &err), 0);
    assert_false(tcc_takes(sp, "<tool_call>\n<function=get_weather>", &fin));
    cn_tcc_spec_free(sp);
    assert_int_equal(cn_tcc_spec_new(&sp, tools, "nope", &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "nope"));
    cJSON_Delete(tools);
}

/* ---- token masks: random walks over the synthetic vocabulary ------------------------------- */

typedef struct walk {
    cn_tokenizer *tok;
    cn_token_bytes *tb;
    int V;
    float *logits;
} walk;

static walk g;

static int setup(void **state) {
    (void)state;
    char *json = NULL;
    cn_err err;
    g.V = 2048;
    if (cn_synth_tokenizer_json(g.V, &json, &err)) return -1;
    int rc = cn_tok_load_json(&g.tok, json, strlen(json), &err);
    free(json);
    if (rc || cn_token_bytes_build(&g.tb, g.tok, &err)) return -1;
    g.logits = malloc((size_t)g.V * sizeof *g.logits);
    return g.logits ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cn_token_bytes_free(g.tb);
    cn_tok_free(g.tok);
    free(g.logits);
    return 0;
}

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* Walks at most max_steps tokens under c; chosen among the unmasked tokens with random logits.
 * Returns 1 when the constraint ended the output (text in *out), 0 at the budget. */
static int walk_once(cn_constraint *c, uint64_t seed, int max_steps, char *out, size_t cap, int greedy) {
    size_t n = 0;
    uint64_t s = seed * 2654435761u + 1;
    for (int step = 0; step < max_steps; step++) {
        for (int i = 0; i < g.V; i++) g.logits[i] = (float)(rng(&s) % 1000) / 100.0f;
        int fl = cn_constraint_apply(c, g.logits, g.V);
        if (fl & CN_CONSTRAINT_ONLY_EOS) break;
        if ((fl & CN_CONSTRAINT_EOS_OK) && rng(&s) % 4 == 0) break; /* end-of-sequence drawn */
        int best = -1, cnt = 0;
        for (int i = 0; i < g.V; i++) {
            if (isinf(g.logits[i])) continue;
            cnt++;
            if (greedy ? (best < 0 || g.logits[i] > g.logits[best]) : rng(&s) % (uint64_t)cnt == 0) best = i;
        }
        assert_true(best >= 0); /* a mask never leaves nothing without ending */
        assert_int_equal(cn_constraint_accept(c, best), 0);
        uint32_t len = g.tb->len[best];
        assert_true(n + len < cap);
        memcpy(out + n, g.tb->pool + g.tb->off[best], len);
        n += len;
        out[n] = '\0';
    }
    out[n] = '\0';
    return cn_constraint_complete(c);
}

static void check_person(const cJSON *j) {
    assert_true(cJSON_IsObject(j));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(j, "age");
    assert_true(cJSON_IsString(name));
    assert_true(cJSON_IsNumber(age));
    assert_true(age->valuedouble == floor(age->valuedouble));
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        static const char *const keys[] = {"name", "age", "tags", "ok", "n", "w", "c", "e"};
        int known = 0;
        for (int i = 0; i < 8; i++) known |= !strcmp(k->string, keys[i]);
        assert_true(known);
    }
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(j, "tags");
    if (tags) assert_true(cJSON_IsArray(tags) && cJSON_GetArraySize(tags) <= 2);
}

static void test_mask_json_schema_walks(void **state) {
    (void)state;
    cJSON *schema = cJSON_Parse(kPerson);
    char out[65536];
    int ended = 0;
    for (uint64_t seed = 1; seed <= 60; seed++) {
        cn_constraint *c;
        cn_err err;
        assert_int_equal(cn_constraint_json(&c, g.tb, schema, 0, &err), 0);
        if (walk_once(c, seed, 3000, out, sizeof out, seed % 3 == 0)) {
            cJSON *j = cJSON_Parse(out);
            if (!j) fail_msg("not JSON: %s", out);
            check_person(j);
            cJSON_Delete(j);
            ended++;
        }
        cn_constraint_free(c);
    }
    assert_true(ended >= 30); /* bounded strings and keys: most walks close */
    cJSON_Delete(schema);
}

static void test_mask_json_any_and_thinking(void **state) {
    (void)state;
    char out[65536];
    int ended = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        cn_constraint *c;
        cn_err err;
        assert_int_equal(cn_constraint_json(&c, g.tb, NULL, 0, &err), 0);
        if (walk_once(c, seed, 400, out, sizeof out, 0)) {
            cJSON *j = cJSON_Parse(out);
            if (!j) fail_msg("not JSON: %s", out);
            assert_true(cJSON_IsObject(j));
            cJSON_Delete(j);
            ended++;
        } else {
            cn_jc_schema *s; /* cut at the budget: still a prefix of some object */
            int obj;
            assert_int_equal(cn_jc_schema_new(&s), 0);
            assert_int_equal(cn_jc_schema_add(s, NULL, &obj, &err), 0);
            cn_jc r;
            cn_jc_init(&r, s, obj);
            assert_true(cn_jc_feed(&r, out, strlen(out)));
            cn_jc_schema_free(s);
        }
        cn_constraint_free(c);
    }
    (void)ended;
    /* after_think: free text until </think>, then the value */
    cn_constraint *c;
    cn_err err;
    assert_int_equal(cn_constraint_json(&c, g.tb, NULL, 1, &err), 0);
    int32_t open_brace = -1, think_end = cn_tok_token_to_id(g.tok, "</think>");
    for (int i = 0; i < g.tb->n; i++)
        if (g.tb->len[i] == 1 && g.tb->pool[g.tb->off[i]] == '{') open_brace = i;
    assert_true(open_brace >= 0 && think_end >= 0);
    for (int i = 0; i < g.V; i++) g.logits[i] = 1.0f;
    assert_int_equal(cn_constraint_apply(c, g.logits, g.V), 0); /* no end before the value */
    assert_false(isinf(g.logits[5])); /* nothing masked while thinking */
    assert_int_equal(cn_constraint_accept(c, 300), 0);
    assert_int_equal(cn_constraint_accept(c, think_end), 0);
    cn_constraint_apply(c, g.logits, g.V);
    assert_true(isinf(g.logits[300]) || g.tb->pool[g.tb->off[300]] == '{' || g.tb->pool[g.tb->off[300]] == ' ');
    assert_false(isinf(g.logits[open_brace]));
    assert_true(isinf(g.logits[think_end])); /* markup is not JSON */
    assert_int_equal(cn_constraint_accept(c, think_end), CN_EINVAL);
    cn_constraint_free(c);
}

typedef struct calls {
    int n;
    char name[64];
    cJSON *args;
} calls;

static int on_ev(const cn_parse_event *ev, void *ctx) {
    calls *k = ctx;
    if (ev->kind != CN_EV_TOOL_CALL) return 0;
    k->n++;
    snprintf(k->name, sizeof k->name, "%s", ev->name);
    cJSON_Delete(k->args);
    k->args = cJSON_Duplicate(ev->arguments, 1);
    return 0;
}

static void test_mask_tool_walks(void **state) {
    (void)state;
    cJSON *tools = cJSON_Parse(kTools);
    char out[65536];
    int ended = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        cn_constraint *c;
        cn_err err;
        assert_int_equal(cn_constraint_tool(&c, g.tb, tools, seed % 2 ? "get_weather" : NULL, 0, &err), 0);
        if (walk_once(c, seed, 4000, out, sizeof out, 0)) {
            cn_parser p;
            calls k = {0, "", NULL};
            assert_int_equal(cn_parser_init(&p, "nemotron3", 0, tools, &err), 0);
            assert_int_equal(cn_parser_feed(&p, out, strlen(out), on_ev, &k), 0);
            assert_int_equal(cn_parser_finish(&p, on_ev, &k), 0);
            cn_parser_free(&p);
            if (k.n != 1) fail_msg("not one call: %s", out);
            if (seed % 2) assert_string_equal(k.name, "get_weather");
            if (!strcmp(k.name, "get_weather")) {
                assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(k.args, "city")));
                const cJSON *days = cJSON_GetObjectItemCaseSensitive(k.args, "days");
                if (!cJSON_IsNumber(days) && !cJSON_IsRaw(days)) fail_msg("days: %s", out);
            }
            cJSON_Delete(k.args);
            ended++;
        }
        cn_constraint_free(c);
    }
    assert_true(ended >= 20);
    cJSON_Delete(tools);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_documents),
        cmocka_unit_test(test_invalid_documents),
        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_schema),
        cmocka_unit_test(test_schema_refusals),
        cmocka_unit_test(test_tool_call),
        cmocka_unit_test(test_mask_json_schema_walks),
        cmocka_unit_test(test_mask_json_any_and_thinking),
        cmocka_unit_test(test_mask_tool_walks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
