/* test_parser.c - the streaming thinking / content / tool-call parser.
 *
 * The property: for every real-looking output below, every way of cutting it into chunks (each
 * single cut, every double cut of the short ones, 1-byte chunks, a few hundred random cuttings)
 * gives the same events once adjacent text events of one kind are joined, and they equal the
 * events written by hand. Every text event must be non-empty, NUL-terminated and whole UTF-8
 * (cuts split characters; events must not). Unit tests then pin each rule, the schema typing,
 * the grammar of a call, UTF-8 and callback errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/parser.h"
#include "text/toolcall.h"

/* ---------- recording events ---------- */

typedef struct rev {
    int kind;
    char *text; /* THINKING/CONTENT text, joined; TOOL_CALL name */
    size_t len;
    cJSON *args;
} rev;

typedef struct recorder {
    rev v[64];
    int n;
    int bad;        /* an event broke a promise (empty, split UTF-8, JSON text != object) */
    int calls_seen; /* raw callback count, to check liveness */
    int fail_with;  /* return this from the callback (error tests) */
} recorder;

/* Whole, valid UTF-8? (a plain structural check, independent of the parser's own) */
static int whole_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = s[i] < 0x80 ? 0 : (s[i] & 0xE0) == 0xC0 ? 1 : (s[i] & 0xF0) == 0xE0 ? 2
                 : (s[i] & 0xF8) == 0xF0 ? 3 : 9;
        if (k == 9 || i + k >= n) return 0;
        for (size_t j = 1; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

static int on_event(const cn_parse_event *e, void *ctx) {
    recorder *r = ctx;
    r->calls_seen++;
    if (r->fail_with) return r->fail_with;
    if (e->kind == CN_EV_TOOL_CALL) {
        cJSON *parsed = cJSON_Parse(e->arguments_json);
        if (!cJSON_IsObject(e->arguments) || !cJSON_Compare(parsed, e->arguments, 1)) r->bad = 1;
        cJSON_Delete(parsed);
        if (r->n == 64) return CN_ERANGE;
        rev *v = &r->v[r->n++];
        v->kind = CN_EV_TOOL_CALL;
        v->text = strdup(e->name);
        v->len = strlen(e->name);
        v->args = cJSON_Duplicate(e->arguments, 1);
        return 0;
    }
    if (e->len == 0 || e->text[e->len] != '\0' ||
        !whole_utf8((const unsigned char *)e->text, e->len))
        r->bad = 1;
    rev *last = r->n ? &r->v[r->n - 1] : NULL;
    if (!last || last->kind != (int)e->kind) {
        if (r->n == 64) return CN_ERANGE;
        last = &r->v[r->n++];
        last->kind = e->kind;
        last->text = NULL;
        last->len = 0;
        last->args = NULL;
    }
    last->text = realloc(last->text, last->len + e->len + 1);
    memcpy(last->text + last->len, e->text, e->len);
    last->len += e->len;
    last->text[last->len] = '\0';
    return 0;
}

static void rec_clear(recorder *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->v[i].text);
        cJSON_Delete(r->v[i].args);
    }
    memset(r, 0, sizeof *r);
}

/* ---------- the cases ---------- */

enum { T = CN_EV_THINKING, C = CN_EV_CONTENT, K = CN_EV_TOOL_CALL };

typedef struct xev {
    int kind;
    const char *text; /* NULL ends the list; for K the function name */
    const char *args; /* K: expected arguments as JSON */
} xev;

typedef struct pcase {
    const char *name;
    int thinking;
    const char *in;
    xev ev[8];
} pcase;

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"units\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"configure\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"threshold\":{\"type\":\"number\"},\"enabled\":{\"type\":"
    "\"boolean\"},\"note\":{\"type\":[\"string\",\"null\"]},\"options\":{\"type\":\"object\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"retries\":{\"anyOf\":[{"
    "\"type\":\"integer\"},{\"type\":\"null\"}]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"path\":{\"type\":\"string\"},\"content\":{\"type\":"
    "\"string\"}}}}},"
    "{\"name\":\"list_dir\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}]";

static const pcase CASES[] = {
    {"thinking then content", 1,
     "The user greets me.\nI should answer politely.  \n</think>\n\nHello! How can I help you "
     "today?",
     {{T, "The user greets me.\nI should answer politely.", 0},
      {C, "Hello! How can I help you today?", 0}}},
    {"leading <think> dropped", 1, "<think>\nLet me see: 2+2.\n</think>\n4",
     {{T, "Let me see: 2+2.", 0}, {C, "4", 0}}},
    {"thinking ended by two typed calls", 1,
     "I need the weather, then to configure.\n\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "<parameter=units>\nc\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=configure>\n<parameter=threshold>\n0.75\n</parameter>\n<parameter=enabled>\n"
     "True\n</parameter>\n<parameter=note>\nnull\n</parameter>\n<parameter=options>\n"
     "{\"depth\": 2, \"mode\": \"fast\"}\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n"
     "</parameter>\n<parameter=retries>\n5\n</parameter>\n</function>\n</tool_call>\n",
     {{T, "I need the weather, then to configure.", 0},
      {K, "get_weather", "{\"city\":\"San Francisco\",\"days\":3,\"units\":\"c\"}"},
      {K, "configure",
       "{\"threshold\":0.75,\"enabled\":true,\"note\":null,\"options\":{\"depth\":2,\"mode\":"
       "\"fast\"},\"tags\":[\"a\",\"b\"],\"retries\":5}"}}},
    {"multi-line value with XML-like text", 1,
     "Write the config file.</think>\n\nI'll write it now.\n<tool_call>\n<function=write_file>\n"
     "<parameter=path>\n/etc/app.xml\n</parameter>\n<parameter=content>\n<config>\n"
     "  <parameter=x>1</parameter>\n  <function=y/>\n</config>\n\n</parameter>\n</function>\n"
     "</tool_call>",
     {{T, "Write the config file.", 0},
      {C, "I'll write it now.", 0},
      {K, "write_file",
       "{\"path\":\"/etc/app.xml\",\"content\":\"<config>\\n  <parameter=x>1</parameter>\\n  "
       "<function=y/>\\n</config>\\n\"}"}}},
    {"no thinking", 0, "  \nJust a plain answer, no reasoning.\n",
     {{C, "Just a plain answer, no reasoning.\n", 0}}},
    {"thinking off: stray </think> is content", 0, "Sure.</think>\nThe answer is 4.",
     {{C, "Sure.</think>\nThe answer is 4.", 0}}},
    {"partial-tag fakeouts keep their whitespace", 1,
     "I wonder about <thinking> and </thin ice, <tool_cabinet> and </think >.  \n </think>\n "
     "Done <tool_ca fake and <tool_call  no.",
     {{T, "I wonder about <thinking> and </thin ice, <tool_cabinet> and </think >.", 0},
      {C, "Done <tool_ca fake and <tool_call  no.", 0}}},
    {"leading <think fakeout", 1, "<thinker> is a word.\n</think>ok",
     {{T, "<thinker> is a word.", 0}, {C, "ok", 0}}},
    {"thinking ends mid-tag", 1, "thinking ends mid tag </thi",
     {{T, "thinking ends mid tag </thi", 0}}},
    {"content ends mid-tag after spaces", 0, "spaced   <tool_ca",
     {{C, "spaced   <tool_ca", 0}}},
    {"malformed: no </function>", 0,
     "Calling it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
     "</tool_call>\nAfter.",
     {{C,
       "Calling it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
       "</tool_call>\nAfter.",
       0}}},
    {"malformed: garbage inside", 1,
     "plan\n</think>\n<tool_call>\n<function=list_dir>\nrandom garbage\n</function>\n"
     "</tool_call>\nthen text",
     {{T, "plan", 0},
      {C, "<tool_call>\n<function=list_dir>\nrandom garbage\n</function>\n</tool_call>\nthen text",
       0}}},
    {"unterminated call", 1,
     "Let me call.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRo",
     {{T, "Let me call.", 0},
      {C, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo", 0}}},
    {"unicode and emoji", 1,
     "Réflexion 🤔 über 日本語 — ok\n</think>\nRésultat : ✅ 🎉 naïve café",
     {{T, "Réflexion 🤔 über 日本語 — ok", 0}, {C, "Résultat : ✅ 🎉 naïve café", 0}}},
    {"empty thinking", 1, "<think></think>Hi there", {{C, "Hi there", 0}}},
    {"thinking closed at once", 1, "</think>\n\nHi", {{C, "Hi", 0}}},
    {"calls, whitespace between, text after", 0,
     "<tool_call>\n<function=list_dir>\n</function>\n</tool_call>\n\n  <tool_call>\n"
     "<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call>\n"
     "I called both.",
     {{K, "list_dir", "{}"}, {K, "get_weather", "{\"city\":\"Lima\"}"}, {C, "I called both.", 0}}},
    {"thinking truncated", 1, "Still thinking about 🐙   \n",
     {{T, "Still thinking about 🐙", 0}}},
    {"whitespace only", 1, "  \n\n ", {{0}}},
    {"unknown tool: JSON else string", 0,
     "<tool_call>\n<function=mystery>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello "
     "world\n</parameter>\n<parameter=j>\n{\"k\": [true, null]}\n</parameter>\n</function>\n"
     "</tool_call>",
     {{K, "mystery", "{\"n\":42,\"s\":\"hello world\",\"j\":{\"k\":[true,null]}}"}}},
    {"python literals and failed typing", 0,
     "<tool_call>\n<function=configure>\n<parameter=options>\n{'depth': 3, 'verbose': True, "
     "'extra': None,}\n</parameter>\n<parameter=tags>\n['x', \"y\"]\n</parameter>\n"
     "<parameter=threshold>\nabc\n</parameter>\n<parameter=enabled>\nmaybe\n</parameter>\n"
     "</function>\n</tool_call>",
     {{K, "configure",
       "{\"options\":{\"depth\":3,\"verbose\":true,\"extra\":null},\"tags\":[\"x\",\"y\"],"
       "\"threshold\":\"abc\",\"enabled\":\"maybe\"}"}}},
    {"tags inside content after thinking", 1, "ok</think>Use <think> tags like </think> this.",
     {{T, "ok", 0}, {C, "Use <think> tags like </think> this.", 0}}},
    {"content, malformed call, call, content", 0,
     "First.  \n<tool_call>\n<function=>\n</function>\n</tool_call>  mid\n<tool_call>\n"
     "<function=list_dir>\n</function>\n</tool_call>\n\nlast 😀",
     {{C, "First.  \n<tool_call>\n<function=>\n</function>\n</tool_call>  mid", 0},
      {K, "list_dir", "{}"},
      {C, "last 😀", 0}}},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static cJSON *g_tools;

/* Feeds c->in cut at cuts[0..ncut) (non-decreasing; equal cuts feed empty chunks). */
static int run_cuts(const pcase *c, const size_t *cuts, int ncut, recorder *r) {
    cn_parser p;
    cn_err err;
    if (cn_parser_init(&p, "nemotron3", c->thinking, g_tools, &err)) return -100;
    size_t n = strlen(c->in), at = 0;
    int rc = 0;
    for (int i = 0; i <= ncut && !rc; i++) {
        size_t to = i < ncut ? cuts[i] : n;
        rc = cn_parser_feed(&p, c->in + at, to - at, on_event, r);
        at = to;
    }
    if (!rc) rc = cn_parser_finish(&p, on_event, r);
    cn_parser_free(&p);
    return rc;
}

/* 0 if r holds exactly the expected events; else prints the first difference. */
static int check(const pcase *c, const recorder *r, const size_t *cuts, int ncut) {
    int nx = 0;
    while (nx < 8 && c->ev[nx].text) nx++;
    const char *why = NULL;
    int at = 0;
    if (r->bad) why = "an event broke a promise (empty, split UTF-8 or bad JSON)";
    else if (r->n != nx) why = "event count";
    for (; !why && at < nx; at++) {
        const rev *g = &r->v[at];
        const xev *x = &c->ev[at];
        if (g->kind != x->kind || strlen(x->text) != g->len || memcmp(g->text, x->text, g->len)) {
            why = "kind or text";
            break;
        }
        if (x->kind == K) {
            cJSON *want = cJSON_Parse(x->args);
            int same = cJSON_Compare(want, g->args, 1);
            cJSON_Delete(want);
            if (!same) {
                why = "arguments";
                break;
            }
        }
    }
    if (!why) return 0;
    fprintf(stderr, "case '%s': %s differs (event %d) with cuts [", c->name, why, at);
    for (int i = 0; i < ncut; i++) fprintf(stderr, "%s%zu", i ? "," : "", cuts[i]);
    fprintf(stderr, "]\n got:\n");
    for (int i = 0; i < r->n; i++) {
        char *a = r->v[i].args ? cJSON_PrintUnformatted(r->v[i].args) : NULL;
        fprintf(stderr, "  %d [%s] %s\n", r->v[i].kind, r->v[i].text, a ? a : "");
        free(a);
    }
    return 1;
}

static long g_runs; /* cuttings tried, reported so a silently short loop shows */

static int run_and_check(const pcase *c, const size_t *cuts, int ncut) {
    recorder r;
    g_runs++;
    memset(&r, 0, sizeof r);
    int rc = run_cuts(c, cuts, ncut, &r);
    int bad = rc != 0 || check(c, &r, cuts, ncut);
    if (rc) fprintf(stderr, "case '%s': parser returned %d\n", c->name, rc);
    rec_clear(&r);
    return bad;
}

static uint64_t rng(uint64_t *s) { /* xorshift64*: a fixed sequence, so failures replay */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static void test_every_chunking_gives_the_same_events(void **st) {
    (void)st;
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    int failures = 0;
    size_t *cuts = malloc(4096 * sizeof *cuts);
    for (int ci = 0; ci < NCASES && failures < 5; ci++) {
        const pcase *c = &CASES[ci];
        size_t n = strlen(c->in);
        failures += run_and_check(c, NULL, 0); /* whole */
        for (size_t i = 0; i <= n && failures < 5; i++) { /* every 2-chunk cut */
            cuts[0] = i;
            failures += run_and_check(c, cuts, 1);
        }
        if (n <= 160) /* every 3-chunk cut of the short ones */
            for (size_t i = 0; i <= n && failures < 5; i++)
                for (size_t j = i; j <= n && failures < 5; j++) {
                    cuts[0] = i, cuts[1] = j;
                    failures += run_and_check(c, cuts, 2);
                }
        for (size_t i = 0; i < n; i++) cuts[i] = i + 1; /* 1-byte chunks */
        failures += run_and_check(c, cuts, (int)n - 1);
        for (int k = 0; k < 300 && failures < 5; k++) { /* random cuttings */
            int ncut = (int)(rng(&seed) % (n < 24 ? n + 1 : 24));
            for (int i = 0; i < ncut; i++) cuts[i] = (size_t)(rng(&seed) % (n + 1));
            qsort(cuts, (size_t)ncut, sizeof *cuts, cmp_size);
            failures += run_and_check(c, cuts, ncut);
        }
    }
    free(cuts);
    fprintf(stderr, "%d cases, %ld cuttings\n", NCASES, g_runs);
    assert_int_equal(failures, 0);
    assert_true(g_runs > 50000);
}

/* ---------- unit tests of the rules ---------- */

typedef struct stream {
    cn_parser p;
    recorder r;
} stream;

static void open_stream(stream *s, int thinking) {
    memset(&s->r, 0, sizeof s->r);
    cn_err err;
    assert_int_equal(cn_parser_init(&s->p, "nemotron3", thinking, g_tools, &err), 0);
}

static void feed(stream *s, const char *t) {
    assert_int_equal(cn_parser_feed(&s->p, t, strlen(t), on_event, &s->r), 0);
}

/* Joined text of kind so far. */
static const char *joined(const stream *s, int kind) {
    for (int i = 0; i < s->r.n; i++)
        if (s->r.v[i].kind == kind) return s->r.v[i].text;
    return "";
}

static void close_stream(stream *s) {
    cn_parser_free(&s->p);
    rec_clear(&s->r);
}

/* Ordinary text goes out at once; only a possible tag and the whitespace before it wait. */
static void test_streaming_is_live(void **st) {
    (void)st;
    stream s;
    open_stream(&s, 0);
    feed(&s, "Hello wor");
    assert_string_equal(joined(&s, C), "Hello wor");
    feed(&s, "ld  ");
    assert_string_equal(joined(&s, C), "Hello world");
    feed(&s, "<tool_c");
    assert_string_equal(joined(&s, C), "Hello world");
    feed(&s, "x");
    assert_string_equal(joined(&s, C), "Hello world  <tool_cx");
    feed(&s, " caf\xC3");
    assert_string_equal(joined(&s, C), "Hello world  <tool_cx caf"); /* half an é waits */
    feed(&s, "\xA9");
    assert_string_equal(joined(&s, C), "Hello world  <tool_cx café");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_int_equal(s.r.bad, 0);
    close_stream(&s);
}

/* The seed's bug: whitespace before a partial </think>, <think> or <tool_call> in thinking that
 * turns out to be text must come back. */
static void test_thinking_keeps_whitespace_before_fakeouts(void **st) {
    (void)st;
    static const char *const fakes[][2] = {{"</thin", "king"}, {"<tool_ca", "lls"}};
    for (int i = 0; i < 2; i++) {
        stream s;
        open_stream(&s, 1);
        feed(&s, "step one \n ");
        assert_string_equal(joined(&s, T), "step one");
        feed(&s, fakes[i][0]);
        assert_string_equal(joined(&s, T), "step one");
        feed(&s, fakes[i][1]);
        feed(&s, " two</think>x");
        char want[64];
        snprintf(want, sizeof want, "step one \n %s%s two", fakes[i][0], fakes[i][1]);
        assert_string_equal(joined(&s, T), want);
        assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
        assert_string_equal(joined(&s, C), "x");
        close_stream(&s);
    }
    /* At the start a partial <think> waits too; leading whitespace of thinking is dropped. */
    stream s;
    open_stream(&s, 1);
    feed(&s, " \n<thi");
    assert_int_equal(s.r.calls_seen, 0);
    feed(&s, "nking aloud</think>");
    assert_string_equal(joined(&s, T), "<thinking aloud");
    close_stream(&s);
}

/* A leading <think> is dropped across a split; only one; not with thinking off. */
static void test_leading_think_tag(void **st) {
    (void)st;
    stream s;
    open_stream(&s, 1);
    feed(&s, " <th");
    assert_int_equal(s.r.calls_seen, 0);
    feed(&s, "ink>\n<think>a</think>b");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_string_equal(joined(&s, T), "<think>a");
    assert_string_equal(joined(&s, C), "b");
    close_stream(&s);

    open_stream(&s, 0);
    feed(&s, "<think>x</think>y");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_string_equal(joined(&s, C), "<think>x</think>y");
    assert_string_equal(joined(&s, T), "");
    close_stream(&s);
}

/* Trailing whitespace of thinking goes even when it arrived before </think> in another chunk;
 * leading whitespace of content goes across chunks; trailing content whitespace stays. */
static void test_whitespace_trims_across_chunks(void **st) {
    (void)st;
    stream s;
    open_stream(&s, 1);
    feed(&s, "idea \n\n");
    feed(&s, "  ");
    assert_string_equal(joined(&s, T), "idea");
    feed(&s, "</think>");
    feed(&s, "\n");
    feed(&s, "  \n");
    assert_string_equal(joined(&s, C), "");
    feed(&s, " answer \n");
    assert_string_equal(joined(&s, C), "answer");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_string_equal(joined(&s, T), "idea");
    assert_string_equal(joined(&s, C), "answer \n");
    close_stream(&s);
}

/* A call is announced only when complete; the whitespace before it is dropped when it is well
 * formed and kept when it comes back as content. */
static void test_call_events(void **st) {
    (void)st;
    stream s;
    open_stream(&s, 0);
    feed(&s, "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=days>\n");
    assert_int_equal(s.r.n, 1);
    feed(&s, "7\n</parameter>\n</function>\n</tool_");
    assert_int_equal(s.r.n, 1);
    feed(&s, "call>");
    assert_int_equal(s.r.n, 2);
    assert_int_equal(s.r.v[1].kind, K);
    assert_string_equal(s.r.v[1].text, "get_weather");
    assert_int_equal(cJSON_GetObjectItem(s.r.v[1].args, "days")->valueint, 7);
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_string_equal(joined(&s, C), "Checking.");
    close_stream(&s);
}

/* Invalid UTF-8 is refused with its offset, nothing called back, the parser unchanged. */
static void test_invalid_utf8(void **st) {
    (void)st;
    static const char *const bad[] = {"\xFF", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                                      "\xC3\x28", "\x80"};
    for (int i = 0; i < 6; i++) {
        stream s;
        open_stream(&s, 0);
        feed(&s, "ok ");
        int calls = s.r.calls_seen;
        assert_int_equal(cn_parser_feed(&s.p, bad[i], strlen(bad[i]), on_event, &s.r), CN_EFORMAT);
        assert_non_null(strstr(s.p.err.msg, "invalid UTF-8"));
        assert_non_null(strstr(s.p.err.msg, "offset 3"));
        assert_int_equal(s.r.calls_seen, calls);
        feed(&s, "fine"); /* still usable: the bad chunk left no trace */
        assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
        assert_string_equal(joined(&s, C), "ok fine");
        close_stream(&s);
    }
    /* A character cut by the end of the input. */
    stream s;
    open_stream(&s, 0);
    feed(&s, "caf\xC3");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), CN_EFORMAT);
    assert_non_null(strstr(s.p.err.msg, "ends inside a character at offset 3"));
    feed(&s, "\xA9");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_string_equal(joined(&s, C), "café");
    close_stream(&s);
}

static void test_errors_and_lifecycle(void **st) {
    (void)st;
    cn_parser p;
    cn_err err;
    assert_int_equal(cn_parser_init(&p, "llama3", 1, NULL, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "llama3"));
    cn_parser_free(&p);
    cJSON *obj = cJSON_Parse("{\"a\":1}"), *noname = cJSON_Parse("[{\"function\":{}}]");
    assert_int_equal(cn_parser_init(&p, "nemotron3", 1, obj, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "array"));
    assert_int_equal(cn_parser_init(&p, "nemotron3", 1, noname, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "tools[0]"));
    assert_int_equal(cn_parser_feed(&p, "x", 1, on_event, NULL), CN_EINVAL); /* failed init */
    cn_parser_free(&p);
    cJSON_Delete(obj);
    cJSON_Delete(noname);

    /* A callback error stops the parser for good. */
    stream s;
    open_stream(&s, 0);
    s.r.fail_with = CN_ECANCELED;
    assert_int_equal(cn_parser_feed(&s.p, "hi", 2, on_event, &s.r), CN_ECANCELED);
    assert_int_equal(cn_parser_feed(&s.p, "x", 1, on_event, &s.r), CN_ECANCELED);
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), CN_ECANCELED);
    close_stream(&s);

    open_stream(&s, 0);
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), CN_EINVAL);
    assert_int_equal(cn_parser_feed(&s.p, "x", 1, on_event, &s.r), CN_EINVAL);
    assert_int_equal(s.r.n, 0);
    close_stream(&s);
}

/* A long call body fed a byte at a time is scanned once, not once per byte. */
static void test_long_call_body(void **st) {
    (void)st;
    size_t n = 200000;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
    big[n] = '\0';
    stream s;
    open_stream(&s, 0);
    feed(&s, "<tool_call>\n<function=write_file>\n<parameter=content>\n");
    for (size_t i = 0; i < n; i++) assert_int_equal(cn_parser_feed(&s.p, big + i, 1, on_event, &s.r), 0);
    feed(&s, "\n</parameter>\n</function>\n</tool_call>");
    assert_int_equal(cn_parser_finish(&s.p, on_event, &s.r), 0);
    assert_int_equal(s.r.n, 1);
    assert_string_equal(cJSON_GetObjectItem(s.r.v[0].args, "content")->valuestring, big);
    close_stream(&s);
    free(big);
}

/* ---------- schema typing ---------- */

/* Types v under schema (JSON text or NULL) and compares with want (JSON text). */
static void typed(const char *schema, const char *v, const char *want) {
    cJSON *sch = schema ? cJSON_Parse(schema) : NULL, *w = cJSON_Parse(want);
    assert_true(!schema || sch);
    assert_non_null(w);
    cJSON *got = cn_toolcall_type_value(v, strlen(v), sch);
    assert_non_null(got);
    char *g = cJSON_PrintUnformatted(got);
    /* Raw big integers compare by their text: a double would round the expectation too. */
    if (!cJSON_Compare(got, w, 1) && strcmp(g, want)) fail_msg("schema %s, value '%s': got %s, want %s", schema, v, g, want);
    free(g);
    cJSON_Delete(got);
    cJSON_Delete(w);
    cJSON_Delete(sch);
}

static void test_schema_typing(void **st) {
    (void)st;
    typed("{\"type\":\"string\"}", "42", "\"42\"");
    typed("{\"type\":\"string\"}", "null", "\"null\"");
    typed("{\"type\":\"string\"}", " spaced ", "\" spaced \"");
    typed("{\"type\":\"integer\"}", "42", "42");
    typed("{\"type\":\"integer\"}", " -7 ", "-7");
    typed("{\"type\":\"integer\"}", "+007", "7");
    typed("{\"type\":\"integer\"}", "3.5", "\"3.5\"");
    typed("{\"type\":\"integer\"}", "12345678901234567890", "12345678901234567890");
    typed("{\"type\":\"integer\"}", "null", "null");
    typed("{\"type\":\"integer\"}", "many", "\"many\"");
    typed("{\"type\":\"number\"}", "1e3", "1000");
    typed("{\"type\":\"number\"}", "-0.25", "-0.25");
    typed("{\"type\":\"number\"}", "0x10", "\"0x10\"");
    typed("{\"type\":\"number\"}", "nan", "\"nan\"");
    typed("{\"type\":\"number\"}", "inf", "\"inf\"");
    typed("{\"type\":\"boolean\"}", "TRUE", "true");
    typed("{\"type\":\"boolean\"}", "false", "false");
    typed("{\"type\":\"boolean\"}", "yes", "\"yes\"");
    typed("{\"type\":\"null\"}", "None", "null");
    typed("{\"type\":\"object\"}", "{\"a\": [1, {\"b\": null}]}", "{\"a\":[1,{\"b\":null}]}");
    typed("{\"type\":\"object\"}", "[1]", "\"[1]\"");
    typed("{\"type\":\"object\"}", "{'a': 'it\\'s', \"b\": False}", "{\"a\":\"it's\",\"b\":false}");
    typed("{\"type\":\"object\"}", "{broken", "\"{broken\"");
    typed("{\"type\":\"array\"}", "[1, 2.5, \"x\"]", "[1,2.5,\"x\"]");
    typed("{\"type\":\"array\"}", "(1, 2)", "\"(1, 2)\"");
    typed("{\"type\":[\"integer\",\"string\"]}", "7", "7");
    typed("{\"type\":[\"integer\",\"string\"]}", "seven", "\"seven\"");
    typed("{\"type\":[\"string\",\"null\"]}", "null", "null");
    typed("{\"anyOf\":[{\"type\":\"array\"},{\"type\":\"boolean\"}]}", "true", "true");
    typed("{\"anyOf\":[{\"type\":\"array\"},{\"type\":\"boolean\"}]}", "[true]", "[true]");
    typed("{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"string\"}]}", "2.5", "2.5");
    typed("{\"enum\":[1,2,3]}", "2", "2");
    typed("{\"enum\":[\"1\",\"2\"]}", "2", "\"2\"");
    typed("{\"type\":\"int\"}", "5", "5");
    typed("{\"type\":\"float\"}", "5.5", "5.5");
    typed("{\"type\":\"bool\"}", "False", "false");
    typed("{\"type\":\"dict\"}", "{}", "{}");
    typed("{\"type\":\"list\"}", "[]", "[]");
    typed("{\"type\":\"whatever\"}", "[1]", "[1]");
    typed("{\"type\":\"whatever\"}", "plain", "\"plain\"");
    typed("{\"description\":\"no type\"}", "12", "12");
    typed(NULL, "true", "true");
    typed(NULL, "hello", "\"hello\"");
    typed(NULL, "{\"x\":1} trailing", "\"{\\\"x\\\":1} trailing\"");
}

/* ---------- the grammar of one call ---------- */

static int parse_body(const char *body, const char *want_name, const char *want_args) {
    char *name = NULL;
    cJSON *args = NULL;
    int rc = cn_toolcall_parse(body, strlen(body), g_tools, &name, &args);
    if (rc == 1) {
        cJSON *w = cJSON_Parse(want_args);
        int same = !strcmp(name, want_name) && cJSON_Compare(w, args, 1);
        if (!same) {
            char *g = cJSON_PrintUnformatted(args);
            fprintf(stderr, "body %s: got %s %s\n", body, name, g);
            free(g);
        }
        cJSON_Delete(w);
        free(name);
        cJSON_Delete(args);
        return same ? 1 : -1;
    }
    return rc;
}

static void test_call_grammar(void **st) {
    (void)st;
    assert_int_equal(parse_body("\n<function=list_dir>\n</function>\n", "list_dir", "{}"), 1);
    assert_int_equal(parse_body("<function=f><parameter=a>x</parameter></function>", "f",
                                "{\"a\":\"x\"}"), 1);
    /* one newline is stripped at each end, no more */
    assert_int_equal(parse_body("<function=f>\n<parameter=a>\n\n x \n\n</parameter>\n</function>",
                                "f", "{\"a\":\"\\n x \\n\"}"), 1);
    assert_int_equal(parse_body("<function=f>\n<parameter=a>\n</parameter>\n</function>", "f",
                                "{\"a\":\"\"}"), 1);
    /* a repeated key keeps the last value */
    assert_int_equal(parse_body("<function=get_weather>\n<parameter=days>\n1\n</parameter>\n"
                                "<parameter=days>\n2\n</parameter>\n</function>",
                                "get_weather", "{\"days\":2}"), 1);
    /* </parameter> inside a value when no tag follows it */
    assert_int_equal(parse_body("<function=write_file>\n<parameter=content>\na</parameter>b\n"
                                "</parameter>\n</function>",
                                "write_file", "{\"content\":\"a</parameter>b\"}"), 1);
    assert_int_equal(parse_body("<function=>\n</function>", NULL, NULL), 0);            /* no name */
    assert_int_equal(parse_body("<function=f\n>\n</function>", NULL, NULL), 0);         /* newline */
    assert_int_equal(parse_body("<function=f>\n</function>\ntrailing", NULL, NULL), 0); /* after */
    assert_int_equal(parse_body("text <function=f>\n</function>", NULL, NULL), 0);      /* before */
    assert_int_equal(parse_body("<function=f>\n<parameter=a>\n1\n</function>", NULL, NULL), 0);
    assert_int_equal(parse_body("<function=f>\n<parameter=a>\n1\n</parameter>\n", NULL, NULL), 0);
    assert_int_equal(parse_body("<function=f>\nloose\n<parameter=a>\n1\n</parameter>\n</function>",
                                NULL, NULL), 0);
    assert_int_equal(parse_body("<function=f>\n<parameter=>\n1\n</parameter>\n</function>", NULL,
                                NULL), 0);
    assert_int_equal(parse_body("", NULL, NULL), 0);
}

static int setup(void **st) {
    (void)st;
    g_tools = cJSON_Parse(TOOLS);
    return g_tools ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    cJSON_Delete(g_tools);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunking_gives_the_same_events),
        cmocka_unit_test(test_streaming_is_live),
        cmocka_unit_test(test_thinking_keeps_whitespace_before_fakeouts),
        cmocka_unit_test(test_leading_think_tag),
        cmocka_unit_test(test_whitespace_trims_across_chunks),
        cmocka_unit_test(test_call_events),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_errors_and_lifecycle),
        cmocka_unit_test(test_long_call_body),
        cmocka_unit_test(test_schema_typing),
        cmocka_unit_test(test_call_grammar),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
