/* bench_cache.c - `cairn bench cache`: agent patterns replayed against the prefix cache, each
 * beside a cold run of the same prompts.
 *
 * What it measures. Seven patterns an agent produces (give-up and identical retry; give-up and a
 * retry whose tool output changed at its end; an old tool output compacted in the middle of the
 * history; two agents interleaved; two forks answered alternately; a 20-turn conversation; a
 * server restart with the disk tier), each driven through the real engine path:
 * cn_engine_generate with its cancel poll, on one engine per pattern with a fresh cache. Per
 * pattern it reports the prompt tokens sent, the prompt tokens the engine evaluated, the bound
 * the cache promises, the snapshot bytes per tier when the pattern ends, and the wall time in
 * units of cold prefills of the same prompts, taken in the same run on a second engine that
 * neither restores nor captures anything (the machine is shared and noisy: ratios, not
 * absolutes). Process CPU time is reported beside wall time because it moves far less when
 * other jobs take the cores. Pattern 1, whose target is a wall time, is timed --repeat times.
 *
 * The bound. An oracle independent of the cache keeps what the engine absorbed in every earlier
 * request of the pattern (its prompt up to where the live caches stopped, plus the generated
 * tokens that were forwarded). A request's new tokens are those after its longest common prefix
 * with any of them (at least 1: the last prompt token is always evaluated); for a divergence
 * these are the tokens after the divergence point. A request passes when it evaluates at most its
 * new tokens plus one restore spacing; a pattern passes when every request does.
 *
 * Token streams are synthetic but shaped like an agent's (system prompt, tool definitions, user
 * turns, assistant thinking and tool calls, tool results, role markers taken from the top of the
 * vocabulary), random ids from a seeded PRNG, never special ids 0-19 or end-of-sequence ids. The
 * assistant's generated tokens flow into the next prompt the way a chat template replays them:
 * tool-call turns drop the thinking (the first half of what was generated), plain answers are
 * replayed verbatim.
 *
 * What it never does: assert on time (tests check only the evaluated-token bound), model the
 * engine instead of running it, share a cache between patterns, or sleep. The "retry half a
 * second later" needs no sleep: one engine serves one request at a time, so the abandoned
 * request stops at its next cancellation point (a chunk or restore-point boundary) and the
 * retry finds everything it absorbed; idle time would only be added to both sides.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/engine.h"
#include "model/state.h"
#include "model/synth.h"

#define BENCH_N_PATTERNS 7
#define BENCH_WALL_SLACK 0.05 /* noise allowance on the retry's wall-time target (shared machine) */

static double clock_ms(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

/* CPU time of every thread of the process: on a shared machine it moves far less than wall time
 * when other jobs compete for the cores, so it is reported beside it. */
static double cpu_ms(void) { return clock_ms(CLOCK_PROCESS_CPUTIME_ID); }

/* The prompt side of a request (begin, prefill, close; decode left out): wall and CPU ms. */
typedef struct cost {
    double wall, cpu;
} cost;

/* ---- token sequences ------------------------------------------------------------------------ */

/* A growable id array. A failed growth sets err and drops the push: builders stay simple and
 * bench_send refuses a sequence with err set (CN_ENOMEM), so nothing is silently lost. */
typedef struct tseq {
    int32_t *v; /* [n] */
    int n, cap;
    int err;
} tseq;

static void ts_push(tseq *s, int32_t t) {
    if (s->err) return;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        int32_t *p = realloc(s->v, (size_t)cap * sizeof *p);
        if (!p) {
            s->err = CN_ENOMEM;
            return;
        }
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = t;
}

static void ts_append(tseq *s, const int32_t *v, int n) {
    for (int i = 0; i < n; i++) ts_push(s, v[i]);
}

static void ts_copy(tseq *dst, const tseq *src) {
    dst->n = 0;
    ts_append(dst, src->v, src->n);
    if (src->err) dst->err = src->err;
}

static void ts_free(tseq *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb) {
    int k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

/* ---- synthetic agent streams ---------------------------------------------------------------- */

/* Role markers: fixed ids at the top of the vocabulary, standing in for the chat template's
 * special tokens (the real ones are among the ids 0-19 the bench never sends). */
enum { MK_SYS, MK_TOOLS, MK_USER, MK_ASSIST, MK_THINK, MK_THINK_END, MK_TOOL, MK_END, MK_COUNT };

typedef struct tokgen {
    uint64_t s;             /* splitmix64 state */
    int lo, hi;             /* content ids in [lo, hi) */
    const int32_t *eos;     /* [n_eos] never emitted */
    int n_eos;
    int32_t mk[MK_COUNT];
    int scale;              /* the long context's length: segment sizes are fractions of it */
} tokgen;

static uint64_t tg_next(tokgen *g) {
    uint64_t z = (g->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void tg_init(tokgen *g, uint64_t seed, int vocab, const int32_t *eos, int n_eos, int scale) {
    memset(g, 0, sizeof *g);
    g->s = seed;
    g->lo = 20;
    g->hi = vocab - MK_COUNT;
    g->eos = eos;
    g->n_eos = n_eos;
    g->scale = scale;
    for (int i = 0; i < MK_COUNT; i++) g->mk[i] = vocab - 1 - i;
}

static int32_t tg_token(tokgen *g) {
    for (;;) {
        int32_t t = g->lo + (int32_t)(tg_next(g) % (uint64_t)(g->hi - g->lo));
        int bad = 0;
        for (int i = 0; i < g->n_eos; i++) bad |= g->eos[i] == t;
        if (!bad) return t;
    }
}

/* A length around scale/div, jittered to [0.5, 1.5) of it, at least 1. */
static int tg_len(tokgen *g, int div) {
    int mean = g->scale / div;
    int len = mean / 2 + (mean > 0 ? (int)(tg_next(g) % (uint64_t)mean) : 0);
    return len > 0 ? len : 1;
}

static void tg_content(tokgen *g, tseq *s, int len) {
    for (int i = 0; i < len; i++) ts_push(s, tg_token(g));
}

/* marker, len content ids, end marker. Returns the offset of the content's first id. */
static int tg_seg(tokgen *g, tseq *s, int mk, int len) {
    ts_push(s, g->mk[mk]);
    int at = s->n;
    tg_content(g, s, len);
    ts_push(s, g->mk[MK_END]);
    return at;
}

/* The generation prompt: the assistant's turn opens with its thinking. */
static void tg_gen_prompt(tokgen *g, tseq *s) {
    ts_push(s, g->mk[MK_ASSIST]);
    ts_push(s, g->mk[MK_THINK]);
}

/* System prompt and tool definitions. */
static void tg_preamble(tokgen *g, tseq *s) {
    tg_seg(g, s, MK_SYS, g->scale / 16);
    tg_seg(g, s, MK_TOOLS, g->scale / 16);
}

/* Past turns (user, then tool calls with results, thinking already dropped) until s holds
 * `target` ids; the last tool output is cut to fit, as tools truncate long output. */
static void tg_history(tokgen *g, tseq *s, int target) {
    while (s->n < target) {
        tg_seg(g, s, MK_USER, tg_len(g, 64));
        int calls = 1 + (int)(tg_next(g) % 3);
        for (int c = 0; c < calls && s->n < target; c++) {
            ts_push(s, g->mk[MK_ASSIST]);
            ts_push(s, g->mk[MK_THINK_END]);
            tg_content(g, s, tg_len(g, 128));
            ts_push(s, g->mk[MK_END]);
            tg_seg(g, s, MK_TOOL, tg_len(g, 16));
        }
    }
    if (s->n > target) s->n = target;
}

/* The assistant's finished turn as the template replays it. A tool call drops the thinking (the
 * first half of what was generated); a plain answer is replayed verbatim. */
static void tg_replay(tokgen *g, tseq *s, const tseq *gen, int tool_call) {
    if (tool_call) {
        ts_push(s, g->mk[MK_THINK_END]);
        ts_append(s, gen->v + gen->n / 2, gen->n - gen->n / 2);
    } else {
        ts_append(s, gen->v, gen->n);
    }
    ts_push(s, g->mk[MK_END]);
}

/* ---- the bench -------------------------------------------------------------------------------- */

typedef struct bench_opts {
    const char *model;     /* NULL: models/small, or the small preset written to a temp dir */
    int prompt_tokens;     /* length of the long context */
    int spacing;           /* restore spacing */
    int chunk;             /* prompt tokens per forward (0: the engine's) */
    int threads;           /* 0: all cores */
    int max_tokens;        /* generated per request (greedy) */
    int repeat;            /* timed runs of pattern 1 */
    uint64_t seed;
    int json;
} bench_opts;

/* One pattern's figures. */
typedef struct pat_result {
    int id;
    const char *name;
    int ran;                /* 0: skipped (see note) */
    int requests;
    int64_t sent;           /* prompt tokens over the pattern's requests */
    int64_t evaluated;      /* prompt tokens the engine evaluated */
    int64_t fresh;          /* new tokens (the oracle's) */
    int64_t bound;          /* sum over requests of min(prompt, new + spacing) */
    int max_over;           /* worst request's evaluated - new */
    int failed;             /* requests over their bound */
    uint64_t ram_bytes;     /* RAM-tier snapshot bytes when the pattern ends */
    uint64_t dev_bytes;     /* DEVICE-tier ones (a GPU backend) */
    int nodes;              /* trie nodes then */
    int restore_points;     /* of which hold recurrent state (a prefill can resume there) */
    int64_t disk_bytes;     /* bytes in the cache directory (-1: no disk tier) */
    cost spent;             /* prompt side of every request (cancelled ones included) */
    cost cold;              /* cold prefills of every completed request's prompt */
    int64_t cold_tokens;    /* tokens in those prefills */
    /* the identical retry (pattern 1) */
    int has_retry;
    cost retry;             /* the retry alone */
    cost snap;              /* one uninterrupted prefill with restore points, fresh cache */
    int wall_pass;
    char note[320];
} pat_result;

typedef struct bench {
    bench_opts o;
    const char *model_dir;
    int model_is_temp;      /* the small preset, written for this run into model_dir */
    cn_backend *be;
    cn_model *m;
    int vocab, ctx;
    int32_t eos[CN_MAX_EOS];
    int n_eos;
    cn_engine *cold;        /* cache off and no restore points: the baseline */
    /* the pattern under way */
    cn_engine *e;
    pat_result *p;
    tseq *seen;             /* [n_seen] what the engine absorbed in each earlier request */
    int n_seen, cap_seen;
} bench;

/* A request's callbacks: the client's give-up and CPU stamps around decoding. */
typedef struct req_ctx {
    const cn_engine *e;
    int give_up_at;         /* > 0: cancel once the live caches hold this many tokens */
    int n;                  /* tokens handed out */
    double cpu_first, cpu_last;
} req_ctx;

/* The client gives up once the engine has absorbed `at` tokens of the prompt (restored or
 * evaluated); the engine polls between forwards, so it stops at the first boundary past that. */
static int give_up_poll(void *ctx) {
    const req_ctx *c = ctx;
    return c->give_up_at > 0 && c->e->live->offset >= c->give_up_at;
}

/* The first token closes the prefill, the last one the decode (it is never forwarded). */
static int on_token(void *ctx, int32_t t) {
    (void)t;
    req_ctx *c = ctx;
    double now = cpu_ms();
    if (c->n++ == 0) c->cpu_first = now;
    c->cpu_last = now;
    return 0;
}

/* One greedy request on e, timed. *spent gets its prompt side: wall time less the engine's decode
 * time; CPU time less what ran between the first and the last token. */
static int run_timed(cn_engine *e, const tseq *prompt, int max_tokens, int give_up_at,
                     cn_result *res, cost *spent) {
    req_ctx c = {e, give_up_at, 0, 0, 0};
    cn_request r = {.tokens = prompt->v, .n_tokens = prompt->n, .max_tokens = max_tokens,
                    .cancel = give_up_poll, .on_token = on_token, .ctx = &c};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    double w0 = now_ms(), c0 = cpu_ms();
    int rc = cn_engine_generate(e, &r, res);
    spent->wall = now_ms() - w0 - res->eval_ms;
    spent->cpu = cpu_ms() - c0 - (c.n ? c.cpu_last - c.cpu_first : 0);
    return rc;
}

static void cost_add(cost *a, cost b) {
    a->wall += b.wall;
    a->cpu += b.cpu;
}

static int bench_engine_open(bench *b, cn_model *m, cn_engine **out, int cold) {
    cn_engine_opts eo = {.ctx = b->ctx, .chunk = b->o.chunk,
                         .cache = {.spacing = b->o.spacing, .pre_end = 4,
                                   .dev_budget = cn_cli_dev_budget(CN_CLI_UNSET, cn_model_backend(m))}};
    if (cold) {
        /* A cold server: no restore points scheduled, nothing kept between requests. */
        eo.no_cache = 1;
        eo.cache.spacing = b->ctx + 1;
        eo.cache.pre_end = -1;
    }
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_engine_open(out, m, &eo, &err);
    if (rc) fprintf(stderr, "cairn: bench cache: %s\n", err.msg);
    return rc;
}

static void seen_clear(bench *b) {
    for (int i = 0; i < b->n_seen; i++) ts_free(&b->seen[i]);
    b->n_seen = 0;
}

/* Prefill of prompt on the cold engine. */
static int cold_prefill(bench *b, const tseq *prompt, cost *spent) {
    cn_result res;
    int rc = run_timed(b->cold, prompt, 0, 0, &res, spent);
    free(res.tokens);
    if (rc) fprintf(stderr, "cairn: bench cache: cold prefill failed: %s\n", cn_strerror(rc));
    return rc;
}

/* One request of the pattern on its engine. cancel_at > 0: the client gives up once that many
 * tokens are absorbed. Counts it (sent, evaluated, new, bound, wall), remembers what the engine
 * absorbed, and when `cold` is set prefills the same prompt on the cold engine right after.
 * gen (optional) gets the generated ids, *spent_out (optional) this request's cost. Returns 0
 * (a cancellation included), CN_ECONTEXT when the prompt does not fit, or the engine's error. */
static int bench_send(bench *b, const tseq *prompt, int cancel_at, int cold, tseq *gen,
                      cost *spent_out) {
    pat_result *p = b->p;
    if (prompt->err) return prompt->err;
    if (prompt->n + b->o.max_tokens > b->ctx) {
        fprintf(stderr, "cairn: bench cache: pattern %d: a %d-token prompt does not fit the context %d\n",
                p->id, prompt->n, b->ctx);
        return CN_ECONTEXT;
    }
    /* the oracle: the longest prefix any earlier request absorbed */
    int known = 0;
    for (int i = 0; i < b->n_seen; i++) {
        int k = lcp(prompt->v, prompt->n, b->seen[i].v, b->seen[i].n);
        if (k > known) known = k;
    }
    cn_result res;
    cost spent;
    int rc = run_timed(b->e, prompt, b->o.max_tokens, cancel_at, &res, &spent);
    int canceled = rc == CN_ECANCELED;
    if (rc && !canceled) {
        fprintf(stderr, "cairn: bench cache: pattern %d: request failed: %s\n", p->id, cn_strerror(rc));
        free(res.tokens);
        return rc;
    }
    /* What the live caches now hold: the prompt up to where they stopped, then the forwarded
     * generated tokens. */
    int off = b->e->live->offset;
    if (b->n_seen == b->cap_seen) {
        int cap = b->cap_seen ? 2 * b->cap_seen : 16;
        tseq *q = realloc(b->seen, (size_t)cap * sizeof *q);
        if (!q) {
            free(res.tokens);
            return CN_ENOMEM;
        }
        b->seen = q;
        b->cap_seen = cap;
    }
    tseq *sn = &b->seen[b->n_seen++];
    memset(sn, 0, sizeof *sn);
    ts_append(sn, prompt->v, off < prompt->n ? off : prompt->n);
    for (int i = 0; off > prompt->n && i < off - prompt->n && i < res.eval_count; i++)
        ts_push(sn, res.tokens[i]);
    if (gen) {
        gen->n = 0;
        ts_append(gen, res.tokens, res.eval_count);
    }
    free(res.tokens);
    if (sn->err || (gen && gen->err)) return CN_ENOMEM;

    int fresh = prompt->n - known;
    if (fresh < 1) fresh = 1;
    /* a cancelled request owes only what it got through */
    int reached = res.cached_tokens + res.prompt_eval_count;
    if (canceled && reached - known < fresh) fresh = reached - known > 0 ? reached - known : 0;
    int bound = fresh + b->o.spacing < prompt->n ? fresh + b->o.spacing : prompt->n;
    p->requests++;
    p->sent += prompt->n;
    p->evaluated += res.prompt_eval_count;
    p->fresh += fresh;
    p->bound += bound;
    if (res.prompt_eval_count - fresh > p->max_over) p->max_over = res.prompt_eval_count - fresh;
    if (res.prompt_eval_count > bound) {
        p->failed++;
        fprintf(stderr, "cairn: bench cache: pattern %d request %d: evaluated %d of %d tokens, "
                "bound %d (new %d, matched %d, restored %d)\n", p->id, p->requests,
                res.prompt_eval_count, prompt->n, bound, fresh, res.matched_tokens, res.cached_tokens);
    }
    cost_add(&p->spent, spent);
    if (spent_out) *spent_out = spent;
    if (cold) {
        cost cc;
        if ((rc = cold_prefill(b, prompt, &cc))) return rc;
        cost_add(&p->cold, cc);
        p->cold_tokens += prompt->n;
    }
    return CN_OK;
}

typedef struct trie_count {
    const cn_prefix_cache *pc;
    int nodes, points;
} trie_count;

static int count_node(cn_node *n, void *ctx) {
    trie_count *c = ctx;
    int has = 0;
    for (int l = 0; l < c->pc->trie.n_layers; l++)
        has |= (c->pc->kind[l] == CN_LAYER_RECURRENT || c->pc->kind[l] == CN_LAYER_WINDOW) &&
               n->slots[l] != NULL;
    c->nodes++;
    c->points += has;
    return 0;
}

/* What the pattern's cache holds when it ends. */
static void cache_figures(const cn_engine *e, pat_result *p) {
    trie_count c = {&e->pc, 0, 0};
    cn_trie_walk(&e->pc.trie, count_node, &c);
    p->ram_bytes = e->pc.ram_bytes;
    p->dev_bytes = e->pc.dev_bytes;
    p->nodes = c.nodes;
    p->restore_points = c.points;
}

/* ---- the patterns ------------------------------------------------------------------------------- */

/* (1) A long prompt whose client gives up at 30% and retries the identical prompt. Beside the
 * cold prefill, one uninterrupted prefill with restore points on a fresh cache says what the
 * snapshots themselves cost. The wall-time target makes this the one pattern timed `repeat`
 * times, each on a fresh cache; the token counts are the first repetition's (all are equal). */
static int pat_retry_identical(bench *b, tokgen *g) {
    pat_result *p = b->p, rep;
    int N = b->o.prompt_tokens, rc = CN_OK, stopped = 0;
    double lo = 0, hi = 0;
    tseq P = {0};
    tg_preamble(g, &P);
    tg_history(g, &P, N - 2);
    tg_gen_prompt(g, &P);
    if (P.err) return P.err;
    for (int r = 0; !rc && r < b->o.repeat; r++) {
        memset(&rep, 0, sizeof rep);
        rep.id = p->id;
        b->p = &rep;
        if (r > 0) {
            /* a fresh cache, and an oracle that forgets the previous repetition */
            cn_engine_close(b->e);
            seen_clear(b);
            if ((rc = bench_engine_open(b, b->m, &b->e, 0))) break;
        }
        cn_engine *fresh = NULL;
        cn_result res;
        cost snap, cold, cold2, attempt, retry;
        if ((rc = bench_engine_open(b, b->m, &fresh, 0))) break;
        rc = run_timed(fresh, &P, 0, 0, &res, &snap);
        free(res.tokens);
        cn_engine_close(fresh);
        if (rc || (rc = cold_prefill(b, &P, &cold))) break;
        if ((rc = bench_send(b, &P, (3 * P.n + 9) / 10, 0, NULL, &attempt))) break;
        stopped = b->e->live->offset;
        if ((rc = bench_send(b, &P, 0, 0, NULL, &retry))) break;
        /* the unit is the mean of a cold prefill before and one after: load drifts */
        if ((rc = cold_prefill(b, &P, &cold2))) break;
        cost unit = {(cold.wall + cold2.wall) / 2, (cold.cpu + cold2.cpu) / 2};
        double wr = rep.spent.wall / unit.wall;
        lo = r == 0 || wr < lo ? wr : lo;
        hi = r == 0 || wr > hi ? wr : hi;
        if (r == 0) {
            p->requests = rep.requests;
            p->sent = rep.sent;
            p->evaluated = rep.evaluated;
            p->fresh = rep.fresh;
            p->bound = rep.bound;
            p->max_over = rep.max_over;
            p->failed = rep.failed;
        }
        cost_add(&p->spent, rep.spent);
        cost_add(&p->cold, unit);
        cost_add(&p->snap, snap);
        cost_add(&p->retry, retry);
        p->cold_tokens += P.n;
    }
    b->p = p;
    if (!rc) {
        p->has_retry = 1;
        double wr = p->spent.wall / p->cold.wall, cr = p->spent.cpu / p->cold.cpu;
        p->wall_pass = wr <= 1.0 + BENCH_WALL_SLACK;
        snprintf(p->note, sizeof p->note,
                 "gave up at %d of %d tokens; attempt + retry %.2fx cold wall (%d runs, %.2f-%.2f; "
                 "target 1.0x, %.0f%% noise allowance: %s), %.2fx cold CPU; retry alone %.2fx wall, "
                 "%.2fx CPU; an uninterrupted prefill with restore points %.2fx wall, %.2fx CPU",
                 stopped, P.n, wr, b->o.repeat, lo, hi, BENCH_WALL_SLACK * 100,
                 p->wall_pass ? "PASS" : "FAIL", cr, p->retry.wall / p->cold.wall,
                 p->retry.cpu / p->cold.cpu, p->snap.wall / p->cold.wall, p->snap.cpu / p->cold.cpu);
    }
    ts_free(&P);
    return rc;
}

/* (2) Gives up at 60%; the retry differs only in the last tenth of its new tool output (the
 * tool was re-run). */
static int pat_retry_tool_rerun(bench *b, tokgen *g) {
    int N = b->o.prompt_tokens, rc;
    int T = N / 4 > 1 ? N / 4 : 1; /* the new tool output */
    tseq P = {0}, Q = {0};
    tg_preamble(g, &P);
    tg_history(g, &P, N - T - 4);
    int at = tg_seg(g, &P, MK_TOOL, T);
    tg_gen_prompt(g, &P);
    ts_copy(&Q, &P);
    int tenth = T / 10 > 1 ? T / 10 : 1;
    for (int i = at + T - tenth; !Q.err && i < at + T; i++) Q.v[i] = tg_token(g);
    rc = P.err ? P.err : Q.err;
    cost cold = {0, 0}, cold2 = {0, 0};
    if (!rc) rc = cold_prefill(b, &Q, &cold);
    if (!rc) rc = bench_send(b, &P, (6 * P.n + 9) / 10, 0, NULL, NULL);
    int stopped = b->e->live->offset;
    if (!rc) rc = bench_send(b, &Q, 0, 0, NULL, NULL);
    if (!rc) rc = cold_prefill(b, &Q, &cold2);
    /* as in pattern 1: the mean of a cold prefill before and one after */
    b->p->cold.wall = (cold.wall + cold2.wall) / 2;
    b->p->cold.cpu = (cold.cpu + cold2.cpu) / 2;
    b->p->cold_tokens = Q.n;
    if (!rc)
        snprintf(b->p->note, sizeof b->p->note,
                 "gave up at %d of %d tokens; the retry diverges at %d (last tenth of a %d-token tool output)",
                 stopped, P.n, lcp(P.v, P.n, Q.v, Q.n), T);
    ts_free(&P);
    ts_free(&Q);
    return rc;
}

/* (3) An old tool output in the middle of the history is compacted to one line in the next
 * turn. */
static int pat_compaction(bench *b, tokgen *g) {
    int N = b->o.prompt_tokens, rc;
    tseq H = {0}, C = {0}, gen = {0};
    tg_preamble(g, &H);
    tg_history(g, &H, (int)(0.35 * N));
    ts_push(&H, g->mk[MK_ASSIST]);
    ts_push(&H, g->mk[MK_THINK_END]);
    tg_content(g, &H, tg_len(g, 128));
    ts_push(&H, g->mk[MK_END]);
    int old_len = N / 8 > 1 ? N / 8 : 1;
    int at = tg_seg(g, &H, MK_TOOL, old_len); /* the old tool output */
    tg_history(g, &H, (int)(0.9 * N) - 2);
    tg_gen_prompt(g, &H);
    rc = H.err;
    if (!rc) rc = bench_send(b, &H, 0, 1, &gen, NULL);
    if (!rc) {
        /* the same history with the old output as one line, then the answer and a new result */
        ts_append(&C, H.v, at);
        tg_content(g, &C, 12);
        ts_append(&C, H.v + at + old_len, H.n - at - old_len);
        tg_replay(g, &C, &gen, 1);
        tg_seg(g, &C, MK_TOOL, tg_len(g, 32));
        tg_gen_prompt(g, &C);
        rc = C.err ? C.err : bench_send(b, &C, 0, 1, NULL, NULL);
    }
    if (!rc)
        snprintf(b->p->note, sizeof b->p->note,
                 "a %d-token tool output at %d of %d compacted to 12 tokens; the next turn diverges at %d",
                 old_len, at, H.n, lcp(H.v, H.n, C.v, C.n));
    ts_free(&H);
    ts_free(&C);
    ts_free(&gen);
    return rc;
}

/* The next tool-call turn of a conversation: the call (thinking dropped), its result, and the
 * generation prompt. */
static void next_tool_turn(tokgen *g, tseq *s, const tseq *gen, int result_len) {
    tg_replay(g, s, gen, 1);
    tg_seg(g, s, MK_TOOL, result_len);
    tg_gen_prompt(g, s);
}

/* (4) Two agents with their own histories interleaved on one server, four turns each. */
static int pat_two_agents(bench *b, tokgen *g) {
    int N = b->o.prompt_tokens, rc = CN_OK;
    tseq A[2] = {{0}}, gen = {0};
    tokgen ga[2];
    for (int k = 0; k < 2; k++) {
        /* distinct system prompts, tools and tasks */
        tg_init(&ga[k], tg_next(g), b->vocab, b->eos, b->n_eos, N);
        tg_preamble(&ga[k], &A[k]);
        tg_history(&ga[k], &A[k], N / 2 - 2);
        tg_gen_prompt(&ga[k], &A[k]);
    }
    for (int turn = 0; !rc && turn < 4; turn++)
        for (int k = 0; !rc && k < 2; k++) {
            if ((rc = bench_send(b, &A[k], 0, 1, &gen, NULL))) break;
            next_tool_turn(&ga[k], &A[k], &gen, tg_len(&ga[k], 32));
            rc = A[k].err;
        }
    if (!rc)
        snprintf(b->p->note, sizeof b->p->note,
                 "agents A and B, 4 turns each in the order ABABABAB, histories of %d tokens growing by tool calls and results",
                 N / 2);
    ts_free(&A[0]);
    ts_free(&A[1]);
    ts_free(&gen);
    return rc;
}

/* (5) Two forks of one long context (two questions about it) answered alternately, three rounds;
 * answers are replayed verbatim, each round adds a follow-up question. */
static int pat_two_forks(bench *b, tokgen *g) {
    int N = b->o.prompt_tokens, rc = CN_OK;
    tseq F[2] = {{0}}, gen = {0};
    tseq base = {0};
    tg_preamble(g, &base);
    tg_history(g, &base, (int)(0.7 * N));
    for (int k = 0; k < 2; k++) {
        ts_copy(&F[k], &base);
        tg_seg(g, &F[k], MK_USER, tg_len(g, 64));
        tg_gen_prompt(g, &F[k]);
    }
    for (int round = 0; !rc && round < 3; round++)
        for (int k = 0; !rc && k < 2; k++) {
            if ((rc = F[k].err) || (rc = bench_send(b, &F[k], 0, 1, &gen, NULL))) break;
            tg_replay(g, &F[k], &gen, 0);
            tg_seg(g, &F[k], MK_USER, tg_len(g, 64));
            tg_gen_prompt(g, &F[k]);
        }
    if (!rc)
        snprintf(b->p->note, sizeof b->p->note,
                 "a %d-token context forked in two, answered in the order ABABAB", base.n);
    ts_free(&F[0]);
    ts_free(&F[1]);
    ts_free(&base);
    ts_free(&gen);
    return rc;
}

/* (6) A 20-turn conversation growing to the long context: mostly tool calls (thinking dropped)
 * with their results; every fourth turn a plain answer replayed verbatim and a new user message. */
static int pat_conversation(bench *b, tokgen *g) {
    int N = b->o.prompt_tokens, rc = CN_OK, turns = 20;
    tseq S = {0}, gen = {0};
    tg_preamble(g, &S);
    tg_seg(g, &S, MK_USER, tg_len(g, 64));
    tg_gen_prompt(g, &S);
    int start = S.n;
    for (int t = 0; !rc && t < turns; t++) {
        if ((rc = S.err) || (rc = bench_send(b, &S, 0, 1, &gen, NULL))) break;
        if (t == turns - 1) break;
        /* the next prompt lands near start + (t + 1) / (turns - 1) of the way to N */
        int target = start + (int)((int64_t)(N - start) * (t + 1) / (turns - 1));
        int answer = t % 4 == 3;
        tg_replay(g, &S, &gen, !answer);
        int len = target - S.n - 4;
        if (len < 1) len = 1;
        tg_seg(g, &S, answer ? MK_USER : MK_TOOL, len);
        tg_gen_prompt(g, &S);
    }
    if (!rc)
        snprintf(b->p->note, sizeof b->p->note, "%d turns, prompts of %d to %d tokens", turns, start, S.n);
    ts_free(&S);
    ts_free(&gen);
    return rc;
}

/* ---- pattern 7: restart with the disk tier ---------------------------------------------------- */

/* Removes a directory tree the bench made. Returns 0 or CN_EIO (what could not be removed stays). */
static int bench_rmtree(const char *path) {
    struct stat st;
    if (lstat(path, &st)) return errno == ENOENT ? CN_OK : CN_EIO;
    if (!S_ISDIR(st.st_mode)) return unlink(path) ? CN_EIO : CN_OK;
    DIR *d = opendir(path);
    if (!d) return CN_EIO;
    int rc = CN_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", path, de->d_name) >= (int)sizeof sub) {
            rc = CN_EIO;
            continue;
        }
        int r = bench_rmtree(sub);
        if (r) rc = r;
    }
    closedir(d);
    if (rmdir(path) && !rc) rc = CN_EIO;
    return rc;
}

/* A fresh directory under $TMPDIR (or /tmp), written into buf. */
static int bench_mkdtemp(char *buf, size_t n, const char *tag) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    if (snprintf(buf, n, "%s/cairn-%s-XXXXXX", base, tag) >= (int)n) return CN_EINVAL;
    return mkdtemp(buf) ? CN_OK : CN_EIO;
}

/* Bytes of the regular files under path. */
static int64_t bench_du(const char *path) {
    struct stat st;
    if (lstat(path, &st)) return 0;
    if (!S_ISDIR(st.st_mode)) return S_ISREG(st.st_mode) ? (int64_t)st.st_size : 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    int64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", path, de->d_name) < (int)sizeof sub) sum += bench_du(sub);
    }
    closedir(d);
    return sum;
}

/* (7) A turn, the server restarted with --cache-dir (model and engine closed and opened again),
 * then the next turn. The engine's RAM tier starts empty after the restart: what the second
 * turn restores comes from disk. */
static int pat_restart(bench *b, tokgen *g) {
    int N = b->o.prompt_tokens, rc;
    char dir[PATH_MAX];
    if ((rc = bench_mkdtemp(dir, sizeof dir, "bench-cache-dir"))) return rc;
    tseq S = {0}, gen = {0};
    cn_backend *be = NULL;
    cn_model *m = NULL;
    cn_engine *pattern_engine = b->e;
    tg_preamble(g, &S);
    tg_history(g, &S, (int)(0.9 * N) - 2);
    tg_gen_prompt(g, &S);
    for (int life = 0; life < 2; life++) {
        /* one server life: open the model and an engine on the cache directory, serve one turn */
        if ((rc = cn_cli_open_model(b->model_dir, NULL, b->o.threads, 0, &be, &m))) break;
        cn_engine_opts eo = {.ctx = b->ctx, .chunk = b->o.chunk,
                             .cache = {.spacing = b->o.spacing, .pre_end = 4,
                                       .dev_budget = cn_cli_dev_budget(CN_CLI_UNSET, be)},
                             .cache_dir = dir, .disk_budget = 0};
        cn_err err;
        cn_err_clear(&err);
        cn_engine *e = NULL;
        if ((rc = cn_engine_open(&e, m, &eo, &err))) {
            fprintf(stderr, "cairn: bench cache: %s\n", err.msg);
            break;
        }
        b->e = e;
        if (!(rc = S.err)) rc = bench_send(b, &S, 0, 1, &gen, NULL);
        if (!rc) {
            cache_figures(e, b->p);
            next_tool_turn(g, &S, &gen, tg_len(g, 32));
        }
        b->e = pattern_engine;
        cn_engine_close(e);
        cn_cli_close_model(be, m);
        be = NULL;
        m = NULL;
        if (rc) break;
        b->p->disk_bytes = bench_du(dir);
    }
    if (!rc)
        snprintf(b->p->note, sizeof b->p->note,
                 "model and engine closed and opened again on the same --cache-dir between the turns");
    bench_rmtree(dir);
    ts_free(&S);
    ts_free(&gen);
    return rc;
}

/* ---- driver and report ------------------------------------------------------------------------- */

typedef int (*pat_fn)(bench *b, tokgen *g);

typedef struct pat_def {
    const char *name;
    pat_fn run; /* NULL: not in this build */
} pat_def;

static const pat_def kPatterns[BENCH_N_PATTERNS] = {
    {"give-up at 30%, identical retry", pat_retry_identical},
    {"give-up at 60%, retry with the tool output's last tenth changed", pat_retry_tool_rerun},
    {"old tool output compacted to one line", pat_compaction},
    {"two agents interleaved", pat_two_agents},
    {"two forks answered alternately", pat_two_forks},
    {"20-turn conversation with tools and thinking", pat_conversation},
    {"server restarted with --cache-dir between two turns", pat_restart},
};

static int run_pattern(bench *b, pat_result *p) {
    const pat_def *d = &kPatterns[p->id - 1];
    p->name = d->name;
    p->disk_bytes = -1;
    if (!d->run) {
        snprintf(p->note, sizeof p->note, "skipped: no disk tier in this build");
        return CN_OK;
    }
    /* A fresh cache per pattern: no pattern profits from another's restore points. */
    int rc = bench_engine_open(b, b->m, &b->e, 0);
    if (rc) return rc;
    b->p = p;
    tokgen g;
    tg_init(&g, b->o.seed * 1000003u + (uint64_t)p->id, b->vocab, b->eos, b->n_eos, b->o.prompt_tokens);
    rc = d->run(b, &g);
    if (!rc) {
        p->ran = 1;
        if (p->id != 7) cache_figures(b->e, p);
    }
    cn_engine_close(b->e);
    b->e = NULL;
    b->p = NULL;
    seen_clear(b);
    return rc;
}

static void fmt_bytes(char *buf, size_t n, int64_t v) {
    if (v < 0) snprintf(buf, n, "-");
    else if (v < 1024 * 1024) snprintf(buf, n, "%.1f KiB", v / 1024.0);
    else snprintf(buf, n, "%.1f MiB", v / (1024.0 * 1024.0));
}

static double ratio(const pat_result *p) { return p->cold.wall > 0 ? p->spent.wall / p->cold.wall : 0; }
static double cpu_ratio(const pat_result *p) { return p->cold.cpu > 0 ? p->spent.cpu / p->cold.cpu : 0; }

static void print_text(const bench *b, const pat_result *r, int n) {
    char threads[32];
    if (b->o.threads) snprintf(threads, sizeof threads, "%d", b->o.threads);
    else snprintf(threads, sizeof threads, "all cores");
    printf("cairn bench cache: %s%s, long context %d tokens, restore spacing %d, chunk %d, "
           "max-tokens %d, threads %s, seed %llu, repeat %d\n",
           b->model_dir, b->model_is_temp ? " (the small preset, written for this run)" : "",
           b->o.prompt_tokens, b->o.spacing, b->cold->o.chunk, b->o.max_tokens, threads,
           (unsigned long long)b->o.seed, b->o.repeat);
    double cms = 0;
    int64_t ctok = 0;
    for (int i = 0; i < n; i++) {
        cms += r[i].cold.wall;
        ctok += r[i].cold_tokens;
    }
    if (cms > 0) printf("cold prefill: %.0f tokens/s over this run's %lld cold prompt tokens\n",
                        ctok * 1e3 / cms, (long long)ctok);
    printf("bound: per request, new tokens (after the longest prefix an earlier request absorbed) "
           "+ %d; wall: prompt time / cold prefills of the same prompts\n\n", b->o.spacing);
    printf("%-3s %4s %8s %9s %8s %8s %-6s %11s %11s %8s %7s %7s\n", "pat", "reqs", "sent", "evaluated",
           "new", "bound", "result", "RAM snaps", "disk snaps", "wall s", "x cold", "cpu x");
    for (int i = 0; i < n; i++) {
        const pat_result *p = &r[i];
        if (!p->ran) {
            printf("(%d) %s\n", p->id, p->note);
            continue;
        }
        char ram[32], disk[32];
        fmt_bytes(ram, sizeof ram, (int64_t)p->ram_bytes);
        fmt_bytes(disk, sizeof disk, p->disk_bytes);
        printf("(%d) %4d %8lld %9lld %8lld %8lld %-6s %11s %11s %8.2f %6.2fx %6.2fx\n", p->id,
               p->requests, (long long)p->sent, (long long)p->evaluated, (long long)p->fresh,
               (long long)p->bound, p->failed ? "FAIL" : "PASS", ram, disk, p->spent.wall / 1e3,
               ratio(p), cpu_ratio(p));
    }
    printf("\n");
    for (int i = 0; i < n; i++) {
        const pat_result *p = &r[i];
        if (!p->ran) {
            printf("(%d) %s: %s\n", p->id, p->name, p->note);
            continue;
        }
        char ram[32], disk[32], disk_part[48] = "";
        fmt_bytes(ram, sizeof ram, (int64_t)p->ram_bytes);
        fmt_bytes(disk, sizeof disk, p->disk_bytes);
        if (p->disk_bytes >= 0) snprintf(disk_part, sizeof disk_part, ", %s disk", disk);
        char dev[32], dev_part[48] = "";
        fmt_bytes(dev, sizeof dev, (int64_t)p->dev_bytes);
        if (p->dev_bytes) snprintf(dev_part, sizeof dev_part, ", %s device", dev);
        printf("(%d) %s: %d requests, %lld prompt tokens sent, %lld evaluated (new %lld, bound %lld, "
               "worst request +%d over new): %s; snapshots %s RAM%s%s (%d restore points in %d trie nodes); wall %.2fx cold (%.1f s vs %.1f s), CPU %.2fx%s%s\n",
               p->id, p->name, p->requests, (long long)p->sent, (long long)p->evaluated,
               (long long)p->fresh, (long long)p->bound, p->max_over, p->failed ? "FAIL" : "PASS", ram,
               dev_part, disk_part, p->restore_points, p->nodes, ratio(p),
               p->spent.wall / 1e3, p->cold.wall / 1e3, cpu_ratio(p), p->note[0] ? ". " : "", p->note);
    }
}

static int print_json(const bench *b, const pat_result *r, int n) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return CN_ENOMEM;
    cJSON_AddStringToObject(root, "model", b->model_dir);
    cJSON_AddNumberToObject(root, "prompt_tokens", b->o.prompt_tokens);
    cJSON_AddNumberToObject(root, "spacing", b->o.spacing);
    cJSON_AddNumberToObject(root, "chunk", b->cold->o.chunk);
    cJSON_AddNumberToObject(root, "max_tokens", b->o.max_tokens);
    cJSON_AddNumberToObject(root, "threads", b->o.threads);
    cJSON_AddNumberToObject(root, "seed", (double)b->o.seed);
    cJSON_AddNumberToObject(root, "repeat", b->o.repeat);
    cJSON *arr = cJSON_AddArrayToObject(root, "patterns");
    int all = 1;
    for (int i = 0; arr && i < n; i++) {
        const pat_result *p = &r[i];
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(arr, o);
        cJSON_AddNumberToObject(o, "id", p->id);
        cJSON_AddStringToObject(o, "name", p->name);
        if (!p->ran) {
            cJSON_AddStringToObject(o, "skipped", p->note);
            continue;
        }
        cJSON_AddNumberToObject(o, "requests", p->requests);
        cJSON_AddNumberToObject(o, "sent", (double)p->sent);
        cJSON_AddNumberToObject(o, "evaluated", (double)p->evaluated);
        cJSON_AddNumberToObject(o, "new", (double)p->fresh);
        cJSON_AddNumberToObject(o, "bound", (double)p->bound);
        cJSON_AddNumberToObject(o, "max_over_new", p->max_over);
        cJSON_AddBoolToObject(o, "pass", !p->failed);
        cJSON *snap = cJSON_AddObjectToObject(o, "snapshot_bytes");
        if (snap) {
            cJSON_AddNumberToObject(snap, "ram", (double)p->ram_bytes);
            cJSON_AddNumberToObject(snap, "device", (double)p->dev_bytes);
            if (p->disk_bytes >= 0) cJSON_AddNumberToObject(snap, "disk", (double)p->disk_bytes);
            else cJSON_AddNullToObject(snap, "disk");
        }
        cJSON_AddNumberToObject(o, "trie_nodes", p->nodes);
        cJSON_AddNumberToObject(o, "restore_points", p->restore_points);
        cJSON_AddNumberToObject(o, "wall_ms", p->spent.wall);
        cJSON_AddNumberToObject(o, "cold_ms", p->cold.wall);
        cJSON_AddNumberToObject(o, "wall_vs_cold", ratio(p));
        cJSON_AddNumberToObject(o, "cpu_ms", p->spent.cpu);
        cJSON_AddNumberToObject(o, "cold_cpu_ms", p->cold.cpu);
        cJSON_AddNumberToObject(o, "cpu_vs_cold", cpu_ratio(p));
        if (p->has_retry) {
            cJSON_AddNumberToObject(o, "retry_vs_cold", p->retry.wall / p->cold.wall);
            cJSON_AddNumberToObject(o, "retry_cpu_vs_cold", p->retry.cpu / p->cold.cpu);
            cJSON_AddNumberToObject(o, "snapshots_vs_cold", p->snap.wall / p->cold.wall);
            cJSON_AddNumberToObject(o, "snapshots_cpu_vs_cold", p->snap.cpu / p->cold.cpu);
            cJSON_AddBoolToObject(o, "wall_pass", p->wall_pass);
        }
        cJSON_AddStringToObject(o, "note", p->note);
        all &= !p->failed;
    }
    cJSON_AddBoolToObject(root, "pass", all);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s) return CN_ENOMEM;
    printf("%s\n", s);
    free(s);
    return CN_OK;
}

/* "1,3,7" -> want[1..7]. Returns 0 or CN_EUSAGE. */
static int parse_patterns(const char *arg, int *want) {
    if (!arg) {
        for (int i = 1; i <= BENCH_N_PATTERNS; i++) want[i] = 1;
        return CN_OK;
    }
    const char *s = arg;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > BENCH_N_PATTERNS || (*end && *end != ',')) return CN_EUSAGE;
        want[v] = 1;
        s = *end ? end + 1 : end;
    }
    return CN_OK;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int cn_bench_cache(int argc, char **argv) {
    bench b;
    memset(&b, 0, sizeof b);
    b.o.prompt_tokens = 4096;
    b.o.spacing = 512;
    b.o.max_tokens = 16;
    b.o.repeat = 3;
    const char *patterns = NULL;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &b.o.model, "DIR", "model directory (default: models/small, else the small preset written to a temp dir)", 0, 0},
        {"prompt-tokens", CN_FLAG_INT, &b.o.prompt_tokens, "N", "length of the long context (default 4096)", 0, 0},
        {"spacing", CN_FLAG_INT, &b.o.spacing, "N", "restore spacing (default 512)", 0, 0},
        {"chunk", CN_FLAG_INT, &b.o.chunk, "N", "prompt tokens per forward (default 512 on the CPU, --ubatch on a GPU)", 0, 0},
        {"threads", CN_FLAG_INT, &b.o.threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"max-tokens", CN_FLAG_INT, &b.o.max_tokens, "N", "tokens generated per request, greedy (default 16)", 0, 0},
        {"seed", CN_FLAG_U64, &b.o.seed, "S", "token-stream seed (default 0)", 0, 0},
        {"repeat", CN_FLAG_INT, &b.o.repeat, "N", "timed runs of pattern 1, the one with a wall-time target (default 3)", 0, 0},
        {"patterns", CN_FLAG_STR, &patterns, "LIST", "patterns to run, e.g. 1,2,7 (default: all)", 0, 0},
        {"json", CN_FLAG_BOOL, &b.o.json, NULL, "print one JSON object", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "bench cache [--model DIR] [--prompt-tokens N] [--spacing N] [--chunk N] "
                      "[--threads N] [--max-tokens N] [--seed S] [--repeat N] [--patterns 1,2,...] [--json]";
    int rc = cn_flags_parse(flags, argc, argv, syn);
    if (rc) return rc > 0 ? 0 : 2;
    int want[BENCH_N_PATTERNS + 1] = {0};
    if (parse_patterns(patterns, want)) {
        fprintf(stderr, "cairn: invalid value '%s' for --patterns (numbers 1-%d, comma-separated)\n",
                patterns, BENCH_N_PATTERNS);
        return 2;
    }
    if (b.o.prompt_tokens < 64 || b.o.spacing < 1 || b.o.chunk < 0 || b.o.threads < 0 ||
        b.o.max_tokens < 1 || b.o.max_tokens > 1024 || b.o.repeat < 1 || b.o.repeat > 100) {
        fprintf(stderr, "cairn: --prompt-tokens must be >= 64, --spacing >= 1, --max-tokens 1-1024, "
                        "--repeat 1-100, --chunk and --threads >= 0\n");
        return 2;
    }

    /* The model: given, models/small, or the small preset written now (about a second). */
    char tmp_model[PATH_MAX] = "";
    b.model_dir = b.o.model;
    if (!b.model_dir && exists("models/small/config.json")) b.model_dir = "models/small";
    if (!b.model_dir) {
        cn_synth_opts so;
        cn_synth_opts_init(&so);
        so.preset = "small";
        cn_err err;
        cn_err_clear(&err);
        if (bench_mkdtemp(tmp_model, sizeof tmp_model, "bench-small")) {
            fprintf(stderr, "cairn: bench cache: cannot make a temporary directory\n");
            return 1;
        }
        if (cn_synth_write(tmp_model, &so, &err)) {
            fprintf(stderr, "cairn: bench cache: %s\n", err.msg);
            bench_rmtree(tmp_model);
            return 1;
        }
        b.model_dir = tmp_model;
        b.model_is_temp = 1;
    }
    int status = 1;
    pat_result res[BENCH_N_PATTERNS];
    int n_res = 0;
    if (cn_cli_open_model(b.model_dir, NULL, b.o.threads, 0, &b.be, &b.m)) goto done;
    const cn_config *c = cn_model_config(b.m);
    b.vocab = c->vocab_size;
    b.n_eos = c->n_eos < CN_MAX_EOS ? c->n_eos : CN_MAX_EOS;
    for (int i = 0; i < b.n_eos; i++) b.eos[i] = c->eos_token_ids[i];
    if (b.vocab < 20 + MK_COUNT + 16) {
        fprintf(stderr, "cairn: bench cache: the vocabulary (%d) is too small\n", b.vocab);
        goto done;
    }
    /* Every pattern's prompts stay within 1.1x the long context; generation adds max-tokens. */
    b.ctx = b.o.prompt_tokens + b.o.prompt_tokens / 4 + 2 * b.o.max_tokens + 64;
    if (bench_engine_open(&b, b.m, &b.cold, 1)) goto done;

    for (int id = 1; id <= BENCH_N_PATTERNS; id++) {
        if (!want[id]) continue;
        pat_result *p = &res[n_res++];
        memset(p, 0, sizeof *p);
        p->id = id;
        double t0 = now_ms();
        if ((rc = run_pattern(&b, p))) {
            fprintf(stderr, "cairn: bench cache: pattern %d failed: %s\n", id, cn_strerror(rc));
            goto done;
        }
        /* progress on stderr: the whole bench takes minutes on a small machine */
        fprintf(stderr, "cairn: bench cache: (%d) %s: %s in %.1f s\n", id, p->name,
                !p->ran ? "skipped" : p->failed ? "FAIL" : "PASS", (now_ms() - t0) / 1e3);
    }
    if (b.o.json) {
        if ((rc = print_json(&b, res, n_res))) {
            fprintf(stderr, "cairn: bench cache: %s\n", cn_strerror(rc));
            goto done;
        }
    } else {
        print_text(&b, res, n_res);
    }
    status = 0;
done:
    seen_clear(&b);
    free(b.seen);
    cn_engine_close(b.e);
    cn_engine_close(b.cold);
    if (b.m) cn_cli_close_model(b.be, b.m);
    if (tmp_model[0]) bench_rmtree(tmp_model);
    return status;
}
