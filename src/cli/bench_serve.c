/* bench_serve.c - `cairn bench serve`: many streams at once through one engine in one process,
 * the way `cairn serve --parallel` runs them, without HTTP in the way.
 *
 * For each level of --concurrency C, an engine of max(C) lanes (opened once, one prefix cache)
 * takes C requests at once, each from a thread of its own on a lane of its own: a prompt of
 * --prompt random tokens whose first --shared-prefix are the same for every stream of the level
 * (and differ between levels, so a level does not find the previous one's prompts in the cache),
 * --gen tokens greedy with end-of-sequence ignored. Reported per level:
 *   tok_s               every stream's generated tokens over the wall time from the requests'
 *                       start to the last token;
 *   ttft_median/p99_s   time to each stream's first token;
 *   tpot_median/p99_s   the time between a stream's consecutive tokens, over every stream;
 *   evaluated, sent     prompt tokens the engine evaluated against the tokens the streams sent
 *                       (with a shared prefix, the in-flight join and the cache make the first
 *                       far smaller).
 * Never asserts a speed; exit status 0, 1 (a step failed) or 2 (usage).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/engine.h"
#include "tensor/backends.h"

#define MAX_LEVELS 16
#define MAX_STREAMS 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One stream: its request, and the clock of each token it got. */
typedef struct stream {
    cn_engine *e;
    int lane;
    int32_t *prompt;
    int n_prompt, gen;
    double t0;          /* the level's start */
    double *at;         /* [gen] seconds after t0 of each token */
    int n_at;
    cn_result res;
    int rc;
} stream;

static int on_token(void *ctx, int32_t t) {
    (void)t;
    stream *s = ctx;
    if (s->n_at < s->gen) s->at[s->n_at++] = now_s() - s->t0;
    return 0;
}

static void *stream_main(void *arg) {
    stream *s = arg;
    cn_request r = {.tokens = s->prompt, .n_tokens = s->n_prompt, .max_tokens = s->gen,
                    .ignore_eos = 1, .on_token = on_token, .ctx = s};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    s->rc = cn_engine_generate_on(s->e, s->lane, &r, &s->res);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of v[0, n) (sorted in place), nearest rank; 0 for n == 0. */
static double quantile(double *v, int n, double q) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(q * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

typedef struct level {
    int c;
    double tok_s, wall_s, ttft_med, ttft_p99, tpot_med, tpot_p99;
    long generated, evaluated, sent, restored;
} level;

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* Runs one level: c streams at once. */
static int run_level(cn_engine *e, int c, int n_prompt, int shared, int gen, int vocab, int index, level *out) {
    stream *st = calloc((size_t)c, sizeof *st);
    pthread_t *th = calloc((size_t)c, sizeof *th);
    double *ttft = calloc((size_t)c, sizeof *ttft), *tpot = calloc((size_t)c * gen + 1, sizeof *tpot);
    int rc = st && th && ttft && tpot ? 0 : CN_ENOMEM;
    uint64_t head = 0x9e3779b97f4a7c15ull ^ (uint64_t)(index + 1) * 0x2545f4914f6cdd1dull;
    const int lo = vocab > 40 ? 20 : 0; /* ids below are the special tokens */
    for (int i = 0; !rc && i < c; i++) {
        stream *s = &st[i];
        s->e = e;
        s->lane = i;
        s->n_prompt = n_prompt;
        s->gen = gen;
        s->prompt = malloc((size_t)n_prompt * sizeof *s->prompt);
        s->at = malloc((size_t)gen * sizeof *s->at);
        if (!s->prompt || !s->at) {
            rc = CN_ENOMEM;
            break;
        }
        uint64_t h = head, tail = head ^ (uint64_t)(i + 1) * 0xbf58476d1ce4e5b9ull;
        for (int k = 0; k < n_prompt; k++)
            s->prompt[k] = lo + (int32_t)(rng_next(k < shared ? &h : &tail) % (uint64_t)(vocab - lo));
    }
    double t0 = now_s();
    int started = 0;
    for (int i = 0; !rc && i < c; i++) {
        st[i].t0 = t0;
        if (pthread_create(&th[i], NULL, stream_main, &st[i])) rc = CN_ENOMEM;
        else started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double wall = now_s() - t0;
    memset(out, 0, sizeof *out);
    out->c = c;
    int n_tpot = 0;
    for (int i = 0; i < started; i++) {
        stream *s = &st[i];
        if (!rc && s->rc) rc = s->rc;
        out->generated += s->res.eval_count;
        out->evaluated += s->res.prompt_eval_count;
        out->restored += s->res.cached_tokens;
        out->sent += s->n_prompt;
        ttft[i] = s->n_at ? s->at[0] : wall;
        for (int k = 1; k < s->n_at; k++) tpot[n_tpot++] = s->at[k] - s->at[k - 1];
        free(s->res.tokens);
    }
    out->wall_s = wall;
    out->tok_s = wall > 0 ? out->generated / wall : 0;
    out->ttft_med = quantile(ttft, started, 0.5);
    out->ttft_p99 = quantile(ttft, started, 0.99);
    out->tpot_med = quantile(tpot, n_tpot, 0.5);
    out->tpot_p99 = quantile(tpot, n_tpot, 0.99);
    for (int i = 0; st && i < c; i++) {
        free(st[i].prompt);
        free(st[i].at);
    }
    free(st);
    free(th);
    free(ttft);
    free(tpot);
    return rc;
}

int cn_bench_serve(int argc, char **argv) {
    const char *model = NULL, *backend = NULL, *levels_arg = "1,4,16";
    int n_prompt = 512, gen = 64, shared = 0, threads = 0, ubatch = 0, json = 0;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (required)", 0, 0},
        {"concurrency", CN_FLAG_STR, &levels_arg, "LIST", "streams at once, each level in turn (default 1,4,16; at most 64)", 0, 0},
        {"prompt", CN_FLAG_INT, &n_prompt, "N", "prompt tokens per stream (default 512)", 0, 0},
        {"gen", CN_FLAG_INT, &gen, "N", "tokens each stream generates (default 64)", 0, 0},
        {"shared-prefix", CN_FLAG_INT, &shared, "N", "leading prompt tokens every stream of a level shares (default 0)", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"backend", CN_FLAG_STR, &backend, "NAME", "cpu, cuda or cuda:N (default: $CAIRN_BACKEND or cpu)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk of scratch (default: the backend's)", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "bench serve --model DIR [--concurrency 1,4,16,64] [--prompt N] [--gen N] "
                      "[--shared-prefix N] [--json]";
    int rc = cn_flags_parse(flags, argc, argv, syn);
    if (rc) return rc > 0 ? 0 : 2;
    int lv[MAX_LEVELS], n_lv = 0, most = 0;
    const char *bad = NULL;
    for (const char *p = levels_arg; *p && !bad;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_STREAMS || n_lv == MAX_LEVELS) bad = "--concurrency: a list of 1..64, at most 16 levels";
        else lv[n_lv++] = (int)v, most = v > most ? (int)v : most;
        p = *end == ',' ? end + 1 : end;
        if (!bad && *end && *end != ',') bad = "--concurrency: a list of 1..64, at most 16 levels";
    }
    if (!model) bad = "--model is required";
    else if (n_prompt < 1 || gen < 1) bad = "--prompt and --gen must be at least 1";
    else if (shared < 0 || shared > n_prompt) bad = "--shared-prefix must be in 0..--prompt";
    if (bad) {
        fprintf(stderr, "cairn: %s\n", bad);
        cn_flags_usage(flags, syn, stderr);
        return 2;
    }
    cn_backend *be = NULL;
    cn_model *m = NULL;
    cn_engine *e = NULL;
    cJSON *out = NULL;
    int status = 1;
    level res[MAX_LEVELS];
    if (cn_cli_open_model(model, backend, threads, ubatch, &be, &m)) return 1;
    cn_engine_opts eo = {.ctx = ((n_prompt + gen + 1) + 255) / 256 * 256, .lanes = most,
                         .cache = {.pre_end = 4}};
    eo.cache.dev_budget = cn_cli_dev_budget(CN_CLI_UNSET, be);
    cn_err err;
    cn_err_clear(&err);
    if ((rc = cn_engine_open(&e, m, &eo, &err))) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    const int vocab = cn_model_config(m)->vocab_size;
    /* a warm-up of one stream: kernels, scratch and page tables never land in a timed level */
    level warm;
    if ((rc = run_level(e, 1, n_prompt < 64 ? n_prompt : 64, 0, 4, vocab, 99, &warm))) {
        fprintf(stderr, "cairn: warm-up: %s\n", cn_strerror(rc));
        goto done;
    }
    for (int i = 0; i < n_lv; i++) {
        uint64_t steps0 = e->gate_steps;
        if ((rc = run_level(e, lv[i], n_prompt, shared, gen, vocab, i, &res[i]))) {
            fprintf(stderr, "cairn: %d streams: %s\n", lv[i], cn_strerror(rc));
            goto done;
        }
        fprintf(stderr, "cairn: %2d streams: %8.1f tok/s in all; first token median %.3f s, p99 %.3f s; "
                        "per token median %.4f s, p99 %.4f s; %ld of %ld prompt tokens evaluated; "
                        "%llu batched steps\n",
                lv[i], res[i].tok_s, res[i].ttft_med, res[i].ttft_p99, res[i].tpot_med, res[i].tpot_p99,
                res[i].evaluated, res[i].sent, (unsigned long long)(e->gate_steps - steps0));
    }
    if (json) {
        out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "model", model);
        cJSON_AddStringToObject(out, "backend", backend ? backend : cn_backend_default_name());
        cJSON_AddNumberToObject(out, "prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(out, "gen_tokens", gen);
        cJSON_AddNumberToObject(out, "shared_prefix_tokens", shared);
        cJSON *arr = cJSON_AddArrayToObject(out, "levels");
        for (int i = 0; i < n_lv; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "concurrency", res[i].c);
            cJSON_AddNumberToObject(o, "tok_s", res[i].tok_s);
            cJSON_AddNumberToObject(o, "wall_s", res[i].wall_s);
            cJSON_AddNumberToObject(o, "ttft_median_s", res[i].ttft_med);
            cJSON_AddNumberToObject(o, "ttft_p99_s", res[i].ttft_p99);
            cJSON_AddNumberToObject(o, "tpot_median_s", res[i].tpot_med);
            cJSON_AddNumberToObject(o, "tpot_p99_s", res[i].tpot_p99);
            cJSON_AddNumberToObject(o, "generated", (double)res[i].generated);
            cJSON_AddNumberToObject(o, "evaluated", (double)res[i].evaluated);
            cJSON_AddNumberToObject(o, "sent", (double)res[i].sent);
            cJSON_AddItemToArray(arr, o);
        }
        char *txt = cJSON_PrintUnformatted(out);
        if (txt) puts(txt);
        free(txt);
    } else {
        printf("streams   tok/s in all   over 1 stream   first token median / p99   per token median / p99   evaluated / sent\n");
        for (int i = 0; i < n_lv; i++)
            printf("%7d   %12.1f   %13.2f   %10.3f / %.3f s   %10.4f / %.4f s   %ld / %ld\n", res[i].c, res[i].tok_s,
                   res[0].c == 1 && res[0].tok_s > 0 ? res[i].tok_s / res[0].tok_s : 0, res[i].ttft_med,
                   res[i].ttft_p99, res[i].tpot_med, res[i].tpot_p99, res[i].evaluated, res[i].sent);
    }
    status = 0;
done:
    cJSON_Delete(out);
    cn_engine_close(e);
    cn_cli_close_model(be, m);
    return status;
}
