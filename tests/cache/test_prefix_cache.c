/* test_prefix_cache.c - restore points on the real forward pass of small NemotronH checkpoints.
 *
 * Every scenario asserts what was reused (matched / restored / evaluated) and that the prompt's
 * last logits equal a cold run's within the self-consistency tolerance, and checks the cache's
 * invariants (cn_pc_check: slots aligned with edges, lazy rows live, byte accounting) after every
 * request. Models: nh-mix-f32 (Mamba + attention + MoE + MLP) and a pure-attention model made here.
 * On nh-mtp-bf16 (an MTP head: a draft cache, token-pair keys) the same scenarios also hold the
 * MTP head's logits at the prompt's last pair to a cold run, so that a restore is valid for the
 * draft as much as for the target.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "model/state.h"
#include "model/synth.h"
#include "test_util.h"

#define TOL 2e-5

typedef struct env {
    cn_backend *b;
    cn_model *m;
    cn_engine *e;
    cn_state *cold; /* for reference runs */
    cn_state *cold_draft; /* the MTP head's, on models that have one */
    int V, H;
    float *want, *got;
    float *dwant, *dgot; /* draft logits */
    int last_cached;     /* cached_tokens of the last request */
    int cancel_after; /* forwards before the cancel callback fires; <0 never */
    int ignore_eos;   /* requests decode max_tokens whatever they sample */
    int polls;
    const int *marks; /* the requests' marks (cn_request.marks), NULL for none */
    int n_marks;
    char *tmpdir;
} env;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static int32_t rnd_token(int V) { return tu_rnd_token(&g_rng, V); }

static void env_open_dir(env *v, const char *dir, int spacing, int chunk, uint64_t budget) {
    memset(v, 0, sizeof *v);
    v->b = tu_backend(2);
    assert_non_null(v->b);
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_model_open(&v->m, dir, v->b, NULL, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    if (tu_backend_declines(rc)) {
        cn_backend_free(v->b);
        tu_rmtree(dir);
        skip();
    }
    assert_int_equal(rc, 0);
    cn_engine_opts o = {.ctx = 512, .chunk = chunk,
                        .cache = {.spacing = spacing, .pre_end = 4, .ram_budget = budget}};
    assert_int_equal(cn_engine_open(&v->e, v->m, &o, &err), 0);
    assert_int_equal(cn_state_create(&v->cold, v->m, 512, 0), 0);
    v->V = cn_model_config(v->m)->vocab_size;
    v->H = cn_model_config(v->m)->hidden_size;
    v->want = malloc((size_t)v->V * sizeof(float));
    v->got = malloc((size_t)v->V * sizeof(float));
    v->dwant = malloc((size_t)v->V * sizeof(float));
    v->dgot = malloc((size_t)v->V * sizeof(float));
    if (cn_model_has_mtp(v->m)) {
        assert_non_null(v->e->spec);
        assert_int_equal(v->e->pc.lookahead, 1);
        assert_int_equal(cn_state_create(&v->cold_draft, v->m, 512, v->e->spec->draft->mtp), 0);
    }
    v->cancel_after = -1;
}

static void env_open(env *v, const char *name, int spacing, int chunk, uint64_t budget) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tu_data_dir(), name);
    env_open_dir(v, dir, spacing, chunk, budget);
}

static void env_close(env *v) {
    free(v->want);
    free(v->got);
    free(v->dwant);
    free(v->dgot);
    cn_state_free(v->cold);
    cn_state_free(v->cold_draft);
    cn_engine_close(v->e);
    cn_model_close(v->m);
    cn_backend_free(v->b);
    if (v->tmpdir) {
        tu_rmtree(v->tmpdir);
        free(v->tmpdir);
    }
}

static int cancel_cb(void *ctx) {
    env *v = ctx;
    v->polls++;
    return v->cancel_after >= 0 && v->polls > v->cancel_after;
}

/* Runs a request with greedy decoding; returns the engine's code; res filled. */
static int run(env *v, const int32_t *toks, int n, int max_tokens, cn_result *res) {
    cn_request r = {.tokens = toks, .n_tokens = n, .max_tokens = max_tokens, .cancel = cancel_cb,
                    .ctx = v, .prompt_logits = v->got, .draft_logits = v->dgot,
                    .ignore_eos = v->ignore_eos, .marks = v->marks, .n_marks = v->n_marks};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    v->polls = 0;
    int rc = cn_engine_generate(v->e, &r, res);
    assert_true(cn_pc_check(&v->e->pc));
    assert_true(cn_pc_ram_bytes_walk(&v->e->pc) == v->e->pc.ram_bytes);
    if (v->e->spec) {
        /* at rest: the draft level with the target, no capture held */
        assert_int_equal(v->e->spec->draft->offset, v->e->live->offset);
        assert_int_equal(v->e->spec->n_caps, 0);
    }
    return rc;
}

/* The cold run's logits after toks[0..n). */
static void cold(env *v, const int32_t *toks, int n) {
    assert_int_equal(cn_state_reset(v->cold), 0);
    cn_batch bt = {.tokens = toks, .n = n, .logits = v->want};
    assert_int_equal(cn_model_forward(v->m, v->cold, &bt), 0);
}

/* The cold run's draft logits at the prompt's last pair (slot n-2: hidden n-2, token n-1). */
static void cold_draft(env *v, const int32_t *toks, int n) {
    float *hid = malloc((size_t)n * v->H * sizeof *hid);
    assert_int_equal(cn_state_reset(v->cold), 0);
    assert_int_equal(cn_state_reset(v->cold_draft), 0);
    cn_batch bt = {.tokens = toks, .n = n, .all_hidden = 1, .hidden = hid};
    assert_int_equal(cn_model_forward(v->m, v->cold, &bt), 0);
    float *all = malloc((size_t)(n - 1) * v->V * sizeof *all);
    assert_int_equal(cn_model_mtp_forward(v->m, v->cold_draft, hid, toks + 1, n - 1, all, NULL), 0);
    memcpy(v->dwant, all + (size_t)(n - 2) * v->V, (size_t)v->V * sizeof *all);
    free(all);
    free(hid);
}

/* The live draft cache's rows [0, level) against a cold run over the tokens the request ended
 * with (prompt then generation; the level is the target's offset, every slot closed). */
static void expect_cold_draft_rows(env *v, const int32_t *toks, int n, const cn_result *res) {
    int L = v->e->live->offset;
    if (!v->e->spec || L == 0) return;
    int32_t *all = malloc((size_t)(n + res->eval_count) * sizeof *all);
    memcpy(all, toks, (size_t)n * sizeof *all);
    memcpy(all + n, res->tokens, (size_t)res->eval_count * sizeof *all);
    assert_true(L + 1 <= n + res->eval_count);
    float *hid = malloc((size_t)L * v->H * sizeof *hid);
    assert_int_equal(cn_state_reset(v->cold), 0);
    assert_int_equal(cn_state_reset(v->cold_draft), 0);
    cn_batch bt = {.tokens = all, .n = L, .all_hidden = 1, .hidden = hid};
    assert_int_equal(cn_model_forward(v->m, v->cold, &bt), 0);
    assert_int_equal(cn_model_mtp_forward(v->m, v->cold_draft, hid, all + 1, L, NULL, NULL), 0);
    const cn_state *d = v->e->spec->draft;
    for (int l = 0; l < d->n_layers; l++) {
        if (d->layers[l].type != CN_BLOCK_ATTN) continue;
        cn_backend *b = cn_model_backend(v->m);
        double ek = tu_rows_rel_err(b, &d->layers[l].k, &v->cold_draft->layers[l].k, L);
        double ev = tu_rows_rel_err(b, &d->layers[l].v, &v->cold_draft->layers[l].v, L);
        if (ek >= TOL || ev >= TOL) fprintf(stderr, "draft rows differ from a cold run: %.3g %.3g\n", ek, ev);
        assert_true(ek < TOL && ev < TOL);
    }
    free(hid);
    free(all);
}

static void expect_cold_logits(env *v, const int32_t *toks, int n) {
    cold(v, toks, n);
    double e = tu_rel_err(v->got, v->want, (size_t)v->V);
    if (e >= TOL) fprintf(stderr, "logits differ from a cold run: %.3g\n", e);
    assert_true(e < TOL);
    /* the head's logits at the last pair exist when the prefill forwarded that pair */
    if (!v->e->spec || n < 2 || v->last_cached > n - 2) return;
    cold_draft(v, toks, n);
    e = tu_rel_err(v->dgot, v->dwant, (size_t)v->V);
    if (e >= TOL) fprintf(stderr, "draft logits differ from a cold run: %.3g\n", e);
    assert_true(e < TOL);
}

/* A full request that must reuse exactly `cached` tokens and match the cold logits. */
static cn_result turn(env *v, const int32_t *toks, int n, int gen, int cached) {
    cn_result res;
    assert_int_equal(run(v, toks, n, gen, &res), 0);
    if (cached >= 0 && res.cached_tokens != cached)
        fprintf(stderr, "cached %d, expected %d (matched %d)\n", res.cached_tokens, cached, res.matched_tokens);
    if (cached >= 0) assert_int_equal(res.cached_tokens, cached);
    assert_int_equal(res.prompt_eval_count, n - res.cached_tokens);
    v->last_cached = res.cached_tokens;
    expect_cold_logits(v, toks, n);
    if (res.stop != CN_STOP_EOS) expect_cold_draft_rows(v, toks, n, &res);
    return res;
}

/* ---- scenarios --------------------------------------------------------------------------------- */

/* A repeat restores at the pre-end point; an extension with the generation reuses everything. */
static void test_repeat_and_extend(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 16, 7, 1 << 30);
    int32_t p[200];
    for (int i = 0; i < 200; i++) p[i] = rnd_token(v.V);
    cn_result r1 = turn(&v, p, 50, 6, 0);
    /* identical retry: restores at the deepest restore point below the end (48: spacing 16) */
    cn_result r2 = turn(&v, p, 50, 6, 48);
    assert_memory_equal(r1.tokens, r2.tokens, (size_t)r1.eval_count * 4);
    /* the next turn keeps the whole generation: resumes at the frontier (50 + 5 forwarded) */
    int n = 50;
    for (int i = 0; i < r2.eval_count; i++) p[n++] = r2.tokens[i];
    int frontier = n - 1; /* the last generated token was never forwarded */
    for (int i = 0; i < 20; i++) p[n++] = rnd_token(v.V);
    cn_result r3 = turn(&v, p, n, 4, frontier);
    free(r1.tokens);
    free(r2.tokens);
    free(r3.tokens);
    env_close(&v);
}

/* Turns that keep all, part or none of the previous generation, with another conversation
 * interleaved. Partial keeps restore at the deepest restore point at or below the divergence. */
static void test_conversation_turns(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 8, 5, 1 << 30);
    int32_t a[400], b[400];
    int na = 30, nb = 25;
    for (int i = 0; i < 400; i++) {
        a[i] = rnd_token(v.V);
        b[i] = rnd_token(v.V);
    }
    cn_result r = turn(&v, a, na, 5, 0);
    for (int t = 0; t < 6; t++) {
        /* keep all (t even) or drop the last two generated tokens (t odd) */
        int keep = t % 2 ? r.eval_count - 2 : r.eval_count;
        for (int i = 0; i < keep; i++) a[na++] = r.tokens[i];
        for (int i = 0; i < 6; i++) a[na++] = rnd_token(v.V);
        free(r.tokens);
        /* the other conversation in between */
        cn_result rb = turn(&v, b, nb, 3, -1);
        for (int i = 0; i < rb.eval_count; i++) b[nb++] = rb.tokens[i];
        free(rb.tokens);
        r = turn(&v, a, na, 5, -1);
        /* never more than the new tokens plus the spacing (and the pre-end margin) */
        int new_tokens = 6 + (r.eval_count - keep);
        assert_true(r.prompt_eval_count <= new_tokens + 8 + 4 + 6);
    }
    free(r.tokens);
    /* a conversation that shares nothing */
    int32_t c[20];
    for (int i = 0; i < 20; i++) c[i] = rnd_token(v.V);
    c[0] = a[0] == 21 ? 22 : 21;
    r = turn(&v, c, 20, 2, 0);
    free(r.tokens);
    env_close(&v);
}

/* A prompt cancelled after k forwards, retried: resumes exactly where it stopped. */
static void test_cancel_and_retry(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 16, 9, 1 << 30);
    int32_t p[47];
    for (int i = 0; i < 47; i++) p[i] = rnd_token(v.V);
    cn_result res;
    v.cancel_after = 2; /* forwards end at 9, 16 (a restore point), 25: stop after 25 */
    assert_int_equal(run(&v, p, 47, 4, &res), CN_ECANCELED);
    assert_int_equal(res.prompt_eval_count, 25);
    int stopped = res.prompt_eval_count;
    free(res.tokens);
    /* a probe that diverges at token 12 restores at the deepest restore point at or below 12 */
    int32_t probe[47];
    memcpy(probe, p, sizeof probe);
    probe[12] = probe[12] == 30 ? 31 : 30;
    v.cancel_after = -1;
    cn_result r = turn(&v, probe, 30, 2, 0); /* nothing but 0 lies at or below 12 here */
    free(r.tokens);
    /* retry: the cancelled attempt's frontier (25) survived the probe; cancel again at 41 */
    v.cancel_after = 1;
    assert_int_equal(run(&v, p, 47, 4, &res), CN_ECANCELED);
    assert_int_equal(res.cached_tokens, stopped);
    int second = res.cached_tokens + res.prompt_eval_count;
    assert_int_equal(second, 41);
    free(res.tokens);
    v.cancel_after = -1;
    r = turn(&v, p, 47, 3, second);
    free(r.tokens);
    env_close(&v);
}

/* Alternating between two branches of one prefix restores the right state each time. */
static void test_branches_alternate(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 8, 6, 1 << 30);
    int32_t x[60], y[60];
    for (int i = 0; i < 60; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    for (int i = 33; i < 60; i++) y[i] = rnd_token(v.V);
    y[33] = x[33] == 40 ? 41 : 40;
    cn_result r = turn(&v, x, 60, 2, 0);
    free(r.tokens);
    /* first visit of y lands below the branch point (33): deepest restore point is 32 */
    r = turn(&v, y, 60, 2, 32);
    free(r.tokens);
    for (int k = 0; k < 3; k++) {
        r = turn(&v, x, 60, 2, 56); /* x's pre-end point */
        free(r.tokens);
        r = turn(&v, y, 60, 2, 56);
        free(r.tokens);
    }
    /* a third branch at the captured branch point 33 restores exactly there */
    int32_t z[50];
    memcpy(z, x, sizeof z);
    for (int i = 33; i < 50; i++) z[i] = rnd_token(v.V);
    z[33] = (x[33] == 50 || y[33] == 50) ? 51 : 50;
    r = turn(&v, z, 50, 2, 33);
    free(r.tokens);
    env_close(&v);
}

/* 1 for a node eviction could take: off the active path, at most one child, holding bytes. */
static int evictable(cn_node *n, void *ctx) {
    env *v = ctx;
    for (cn_node *x = v->e->pc.lanes[0].frontier; x; x = x->parent)
        if (x == n) return 0;
    return n->n_child <= 1;
}

/* The eviction work closes left, in the idle server's steps of at most two nodes, the invariants
 * and byte accounting holding after each. Returns the steps taken. */
static int drain(env *v) {
    cn_prefix_cache *pc = &v->e->pc;
    int steps = 0, more;
    do {
        uint64_t before = pc->n_evicted + pc->n_paged_out;
        more = cn_engine_maintain(v->e, 2);
        assert_true(pc->n_evicted + pc->n_paged_out - before <= 2);
        assert_true(cn_pc_check(pc));
        assert_true(cn_pc_ram_bytes_walk(pc) == pc->ram_bytes);
        steps++;
    } while (more);
    return steps;
}

/* rounds branches of one 40-token base, each run then retried, under a RAM budget: after each
 * the cache is over budget only if nothing evictable is left, and the active path is intact (an
 * identical retry restores at its pre-end point). Closes v. */
static void eviction_rounds(env *v, int rounds, uint64_t budget) {
    int32_t base[40];
    for (int i = 0; i < 40; i++) base[i] = rnd_token(v->V);
    for (int k = 0; k < rounds; k++) {
        int32_t p[70];
        memcpy(p, base, sizeof base);
        for (int i = 40; i < 70; i++) p[i] = rnd_token(v->V);
        cn_result r = turn(v, p, 70, 2, -1);
        free(r.tokens);
        drain(v);
        if (v->e->pc.ram_bytes > budget) assert_int_equal(cn_trie_walk(&v->e->pc.trie, evictable, v), 0);
        r = turn(v, p, 70, 2, 66);
        free(r.tokens);
    }
    assert_true(v->e->pc.n_evicted > 0);
    env_close(v);
}

/* Under a tiny budget the active path and branch points survive, bytes stay exact. */
static void test_eviction(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 8, 8, 64 * 1024);
    eviction_rounds(&v, 6, 64 * 1024);
}

/* A budget cut far below what the trie holds: no close does more than its step (o.evict_steps
 * nodes, plus one between each of its forwards); the rest goes in idle steps, and what stays is
 * the active path and branch points, each still a valid restore point. */
static void test_eviction_in_steps(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 4, 8, 1 << 30);
    int32_t p[8][60];
    for (int k = 0; k < 8; k++) {
        for (int i = 0; i < 60; i++) p[k][i] = rnd_token(v.V);
        p[k][0] = 30 + k; /* separate trees: every node evictable but the last prompt's */
        cn_result r = turn(&v, p[k], 60, 1, 0);
        free(r.tokens);
    }
    assert_true(v.e->pc.trie.n_nodes > 40);
    assert_int_equal(v.e->pc.n_evicted, 0);
    v.e->pc.o.ram_budget = 1; /* everything off the active path must go */
    uint64_t before = v.e->pc.n_evicted;
    /* two forwards (56..59, where the match ends, then 59..60): one step between them */
    cn_result r = turn(&v, p[7], 60, 1, 56);
    free(r.tokens);
    assert_true(v.e->pc.n_evicted - before <= (uint64_t)v.e->pc.o.evict_steps + 1);
    assert_true(cn_pc_over_budget(&v.e->pc));
    int steps = drain(&v);
    assert_true(steps > 5);
    assert_int_equal(cn_trie_walk(&v.e->pc.trie, evictable, &v), 0);
    /* the active path still restores at its pre-end point, the others start over */
    r = turn(&v, p[7], 60, 1, 56);
    free(r.tokens);
    r = turn(&v, p[2], 60, 1, 0);
    free(r.tokens);
    env_close(&v);
}

/* Forwards end at chunk boundaries and at the spacing's restore points only (the cancellation
 * points, where the cancel callback is polled); the branch point and the point before the
 * prompt's end are captured inside a forward, and still restore exactly. */
static void test_captures_inside_forwards(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 16, 100, 1 << 30);
    int32_t x[50], y[50], z[50];
    for (int i = 0; i < 50; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    for (int i = 21; i < 50; i++) y[i] = rnd_token(v.V);
    y[21] = x[21] == 60 ? 61 : 60;
    memcpy(z, y, sizeof z);
    for (int i = 30; i < 50; i++) z[i] = rnd_token(v.V);
    z[30] = y[30] == 70 ? 71 : 70;
    cn_result r = turn(&v, x, 50, 1, 0);
    free(r.tokens);
    /* polled after 16, 32, 48, not at 46 (the pre-end point); then once for the token */
    assert_int_equal(v.polls, 3 + 1);
    r = turn(&v, y, 45, 1, 16);   /* diverges at 21: the branch point is captured at 21 */
    free(r.tokens);
    assert_int_equal(v.polls, 1 + 1); /* after 32; not at 41 (y's pre-end point) */
    r = turn(&v, z, 50, 1, 21);   /* shares y's first 30: restores at the branch point */
    free(r.tokens);
    r = turn(&v, y, 45, 1, 41);   /* y's pre-end point, captured inside its last forward */
    free(r.tokens);
    env_close(&v);
}

/* A request's marks (where its chat turns begin) become restore points: the next request,
 * which diverges a few tokens past one, resumes there instead of at the spacing's point below;
 * and a mark survives a later request that runs past it (marks resist merging). */
static void test_marks(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 16, 100, 1 << 30);
    int32_t x[60], y[60];
    for (int i = 0; i < 60; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    y[41] = x[41] == 60 ? 61 : 60; /* diverges at 41 */
    static const int marks[] = {5, 37};
    v.marks = marks, v.n_marks = 2;
    cn_result r = turn(&v, x, 50, 1, 0);
    free(r.tokens);
    v.marks = NULL, v.n_marks = 0;
    r = turn(&v, y, 50, 1, 37); /* without the mark: 32 */
    free(r.tokens);
    r = turn(&v, x, 60, 1, 50); /* x again and further: from where its first request rested */
    free(r.tokens);
    memcpy(y, x, sizeof y);
    y[39] = x[39] == 60 ? 61 : 60; /* a new branch, at 39 */
    r = turn(&v, y, 45, 1, 37); /* the mark at 37 is still there */
    free(r.tokens);
    env_close(&v);
}

/* LRU: a request touches only the nodes it used. */
static void test_lru_touches_used_only(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 8, 8, 1 << 30);
    int32_t a[30], b[30];
    for (int i = 0; i < 30; i++) {
        a[i] = rnd_token(v.V);
        b[i] = rnd_token(v.V);
    }
    b[0] = a[0] == 25 ? 26 : 25;
    cn_result r = turn(&v, a, 30, 1, 0);
    free(r.tokens);
    int m;
    cn_node *na = cn_trie_match(&v.e->pc.trie, (const cn_key[]){(cn_key)a[0]}, 1, &m);
    uint64_t before = na->last_used;
    r = turn(&v, b, 30, 1, 0);
    free(r.tokens);
    assert_int_equal(na->last_used, before);
    env_close(&v);
}

/* ---- pair keys: the same scenarios with a draft cache ----------------------------------------- */

/* With pair keys a repeat matches every key (they name every token) and restores at the deepest
 * restore point below them; an extension resumes at the frontier, closed by the final sampled
 * token that was never forwarded. */
static void test_pairs_repeat_and_extend(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mtp-bf16", 16, 7, 1 << 30);
    int32_t p[200];
    for (int i = 0; i < 200; i++) p[i] = rnd_token(v.V);
    cn_result r1 = turn(&v, p, 50, 6, 0);
    cn_result r2 = turn(&v, p, 50, 6, 48); /* 49 keys; restore points at 16, 32, 45, 48 */
    assert_int_equal(r2.matched_tokens, 49);
    assert_memory_equal(r1.tokens, r2.tokens, (size_t)r1.eval_count * 4);
    int n = 50;
    for (int i = 0; i < r2.eval_count; i++) p[n++] = r2.tokens[i];
    int frontier = n - 1; /* the last generated token closed the last pair, never forwarded */
    for (int i = 0; i < 20; i++) p[n++] = rnd_token(v.V);
    /* exactly the previous exchange, nothing added: its n keys match and restore the frontier
     * (the last token is evaluated again, as every prompt's last token is) */
    cn_result r4 = turn(&v, p, frontier + 1, 3, frontier);
    assert_int_equal(r4.matched_tokens, frontier);
    /* the extension diverges from r4's generation right after the frontier: the frontier's
     * whole state was released when r4 grew past it, the deepest restore point below serves */
    cn_result r3 = turn(&v, p, n, 4, 48);
    free(r1.tokens);
    free(r2.tokens);
    free(r3.tokens);
    free(r4.tokens);
    env_close(&v);
}

/* A cancelled prefill leaves its draft level at the point reached; the retry resumes there for
 * target and draft alike. */
static void test_pairs_cancel_and_retry(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mtp-bf16", 16, 9, 1 << 30);
    int32_t p[47];
    for (int i = 0; i < 47; i++) p[i] = rnd_token(v.V);
    cn_result res;
    v.cancel_after = 2; /* forwards end at 9, 16, 25: stop after 25 */
    assert_int_equal(run(&v, p, 47, 4, &res), CN_ECANCELED);
    assert_int_equal(res.prompt_eval_count, 25);
    free(res.tokens);
    /* a probe diverging at token 12 diverges at key 11 (the pair (11, 12)) */
    int32_t probe[47];
    memcpy(probe, p, sizeof probe);
    probe[12] = probe[12] == 30 ? 31 : 30;
    v.cancel_after = -1;
    cn_result r = turn(&v, probe, 30, 2, 0);
    assert_int_equal(r.matched_tokens, 11);
    free(r.tokens);
    v.cancel_after = 1; /* forwards end at 32, 41 */
    assert_int_equal(run(&v, p, 47, 4, &res), CN_ECANCELED);
    assert_int_equal(res.cached_tokens, 25);
    assert_int_equal(res.cached_tokens + res.prompt_eval_count, 41);
    free(res.tokens);
    v.cancel_after = -1;
    r = turn(&v, p, 47, 3, 41);
    free(r.tokens);
    env_close(&v);
}

/* Branches: a divergence at token k is a divergence at key k-1; switching back and forth restores
 * both target and draft rows of each branch. */
static void test_pairs_branches(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mtp-bf16", 8, 6, 1 << 30);
    int32_t x[60], y[60];
    for (int i = 0; i < 60; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    for (int i = 33; i < 60; i++) y[i] = rnd_token(v.V);
    y[33] = x[33] == 40 ? 41 : 40;
    cn_result r = turn(&v, x, 60, 2, 0);
    free(r.tokens);
    r = turn(&v, y, 60, 2, 32); /* matched 32 keys: the restore point at 32 */
    assert_int_equal(r.matched_tokens, 32);
    free(r.tokens);
    for (int k = 0; k < 3; k++) {
        r = turn(&v, x, 60, 2, 56);
        free(r.tokens);
        r = turn(&v, y, 60, 2, 56);
        free(r.tokens);
    }
    int32_t z[50];
    memcpy(z, x, sizeof z);
    for (int i = 33; i < 50; i++) z[i] = rnd_token(v.V);
    z[33] = (x[33] == 50 || y[33] == 50) ? 51 : 50;
    r = turn(&v, z, 50, 2, 32);
    free(r.tokens);
    /* eviction under a small budget keeps target and draft rows aligned */
    env_close(&v);
    env_open(&v, "nh-mtp-bf16", 8, 8, 48 * 1024);
    for (int k = 0; k < 4; k++) {
        int32_t q[70];
        memcpy(q, x, 40 * sizeof *q);
        for (int i = 40; i < 70; i++) q[i] = rnd_token(v.V);
        r = turn(&v, q, 70, 2, -1);
        free(r.tokens);
        r = turn(&v, q, 70, 2, 65); /* 69 keys: the pre-end point 65 */
        free(r.tokens);
    }
    assert_true(v.e->pc.n_evicted > 0);
    env_close(&v);
}

/* Models made here with one layer kind each (plus stateless MoE/MLP blocks); window: W of the
 * sliding-window layers ('S'); mtp: with an MTP head (a draft cache, pair keys). */
static void open_pattern_opts(env *v, const char *pattern, int window, int mtp, int spacing, int chunk,
                              uint64_t budget) {
    char *dir = tu_mkdtemp("pat");
    assert_non_null(dir);
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    o.mtp = mtp;
    o.dtype = CN_F32;
    o.pattern = pattern;
    o.sliding_window = window;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_synth_write(dir, &o, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    env_open_dir(v, dir, spacing, chunk, budget);
    v->tmpdir = dir;
}

static void open_pattern(env *v, const char *pattern, int spacing, int chunk) {
    char *dir = tu_mkdtemp("pat");
    assert_non_null(dir);
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    o.mtp = 0;
    o.dtype = CN_F32;
    o.pattern = pattern;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_synth_write(dir, &o, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    env_open_dir(v, dir, spacing, chunk, 1 << 30);
    v->tmpdir = dir;
}

/* Every layer kind: attention only (any offset restores), recurrent only (node ends only),
 * mixed; each with cancel/retry, branch and repeat. */
static void kinds_scenario(const char *pattern, int attention_only) {
    env v;
    open_pattern(&v, pattern, 8, 5);
    int32_t x[50], y[50];
    for (int i = 0; i < 50; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    for (int i = 21; i < 50; i++) y[i] = rnd_token(v.V);
    y[21] = x[21] == 60 ? 61 : 60;
    cn_result res;
    v.cancel_after = 3;
    assert_int_equal(run(&v, x, 50, 2, &res), CN_ECANCELED);
    int stopped = res.prompt_eval_count;
    free(res.tokens);
    v.cancel_after = -1;
    cn_result r = turn(&v, x, 50, 3, stopped);
    free(r.tokens);
    /* y diverges at 21: attention rewinds exactly there, recurrent layers to the restore point 16 */
    r = turn(&v, y, 50, 3, attention_only ? 21 : 16);
    free(r.tokens);
    r = turn(&v, x, 50, 3, attention_only ? 49 : 48);
    free(r.tokens);
    env_close(&v);
}

/* ---- sliding-window layers -------------------------------------------------------------------- */

/* kinds_scenario on a model with sliding-window layers of window W. The window rows behave like
 * full attention while the ring has not wrapped (rewind to any offset) and like recurrent state
 * after (whole-window snapshots at node ends only): with the prompts here (50 tokens plus the
 * generation) a window of 64 never wraps, one of 16 always does. */
static void swa_scenario(const char *pattern, int window, int rewinds) {
    env v;
    open_pattern_opts(&v, pattern, window, 0, 8, 5, 1 << 30);
    int n_s = 0;
    for (const char *c = pattern; *c; c++) n_s += *c == 'S';
    assert_int_equal(v.e->pc.n_win, n_s);
    int32_t x[50], y[50];
    for (int i = 0; i < 50; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    for (int i = 21; i < 50; i++) y[i] = rnd_token(v.V);
    y[21] = x[21] == 60 ? 61 : 60;
    cn_result res;
    v.cancel_after = 5;
    assert_int_equal(run(&v, x, 50, 2, &res), CN_ECANCELED);
    int stopped = res.prompt_eval_count;
    assert_true(stopped > window || window > 50); /* the cancelled prefill crossed the wrap */
    free(res.tokens);
    v.cancel_after = -1;
    cn_result r = turn(&v, x, 50, 3, stopped);
    free(r.tokens);
    /* y diverges at 21: an unwrapped ring rewinds exactly there, a wrapped one restores the
     * window snapshot at the restore point 16 */
    r = turn(&v, y, 50, 3, rewinds ? 21 : 16);
    free(r.tokens);
    /* back to x: y's rows now fill the ring past 21, so x's window comes from its snapshot at
     * the deepest restore point (48; full attention alone would reach 49) */
    r = turn(&v, x, 50, 3, 48);
    free(r.tokens);
    /* decode far past the window, then extend with the whole generation: resumes at the frontier
     * (the live ring, wrapped many times), logits equal to a cold run; the repeat decodes the
     * same tokens as the first time */
    int32_t z[200];
    for (int i = 0; i < 6; i++) z[i] = rnd_token(v.V);
    z[0] = x[0] == 70 ? 71 : 70;
    v.ignore_eos = 1;
    cn_result d1 = turn(&v, z, 6, 40, 0);
    cn_result d2 = turn(&v, z, 6, 40, -1);
    v.ignore_eos = 0;
    assert_int_equal(d1.eval_count, 40);
    assert_int_equal(d2.eval_count, 40);
    assert_memory_equal(d1.tokens, d2.tokens, (size_t)d1.eval_count * 4);
    int n = 6;
    for (int i = 0; i < d2.eval_count; i++) z[n++] = d2.tokens[i];
    int frontier = n - 1;
    for (int i = 0; i < 9; i++) z[n++] = rnd_token(v.V);
    r = turn(&v, z, n, 3, frontier);
    free(r.tokens);
    free(d1.tokens);
    free(d2.tokens);
    env_close(&v);
}

static void test_kind_window_wraps(void **st) { (void)st; swa_scenario("S-ES", 16, 0); }
static void test_kind_window_unwrapped(void **st) { (void)st; swa_scenario("S-ES", 64, 1); }
/* windows with recurrent layers: a rewind is never possible, the window rides with the state */
static void test_kind_window_recurrent(void **st) { (void)st; swa_scenario("MSEM", 64, 0); }
/* all three: sliding window, recurrent and full attention */
static void test_kind_window_mixed(void **st) { (void)st; swa_scenario("MS*E-M*S", 16, 0); }

/* Eviction under a tiny budget keeps the active path and branch points with their windows, and
 * the byte accounting counts every window snapshot. */
static void test_window_eviction(void **st) {
    (void)st;
    env v;
    open_pattern_opts(&v, "MS*E", 16, 0, 8, 8, 48 * 1024);
    eviction_rounds(&v, 5, 48 * 1024);
}

/* Pair keys on a target with sliding-window layers (the MTP head's own layers are full attention):
 * cancel, retry, branch and repeat hold target and draft logits to a cold run. */
static void test_pairs_window(void **st) {
    (void)st;
    env v;
    open_pattern_opts(&v, "MS*E", 16, 1, 8, 5, 1 << 30);
    assert_int_equal(v.e->pc.lookahead, 1);
    int32_t x[50], y[50];
    for (int i = 0; i < 50; i++) x[i] = rnd_token(v.V);
    memcpy(y, x, sizeof y);
    for (int i = 21; i < 50; i++) y[i] = rnd_token(v.V);
    y[21] = x[21] == 60 ? 61 : 60;
    cn_result res;
    v.cancel_after = 3;
    assert_int_equal(run(&v, x, 50, 2, &res), CN_ECANCELED);
    int stopped = res.prompt_eval_count;
    free(res.tokens);
    v.cancel_after = -1;
    cn_result r = turn(&v, x, 50, 3, stopped);
    free(r.tokens);
    r = turn(&v, y, 50, 3, 16); /* diverges at key 20: the restore point 16 */
    free(r.tokens);
    r = turn(&v, x, 50, 3, 48);
    free(r.tokens);
    /* speculative decoding far past the window (verify rounds restore windows from captures)
     * gives the tokens plain decoding gives */
    v.ignore_eos = 1;
    cn_result spec = turn(&v, y, 50, 40, -1);
    cn_request pr = {.tokens = y, .n_tokens = 50, .max_tokens = 40, .ignore_eos = 1, .no_speculate = 1};
    cn_sampler_params_default(&pr.sampling);
    pr.sampling.temperature = 0;
    cn_result plain;
    assert_int_equal(cn_engine_generate(v.e, &pr, &plain), 0);
    assert_true(spec.draft_proposed > 0);
    assert_int_equal(plain.eval_count, 40);
    assert_memory_equal(spec.tokens, plain.tokens, 40 * sizeof(int32_t));
    free(spec.tokens);
    free(plain.tokens);
    env_close(&v);
}

static void test_kind_attention_only(void **st) { (void)st; kinds_scenario("**E*-E**", 1); }
static void test_kind_recurrent_only(void **st) { (void)st; kinds_scenario("MEM-M", 0); }
static void test_kind_mixed(void **st) { (void)st; kinds_scenario("M*E-M*", 0); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeat_and_extend),  cmocka_unit_test(test_conversation_turns),
        cmocka_unit_test(test_cancel_and_retry),   cmocka_unit_test(test_branches_alternate),
        cmocka_unit_test(test_eviction),           cmocka_unit_test(test_lru_touches_used_only),
        cmocka_unit_test(test_eviction_in_steps),
        cmocka_unit_test(test_captures_inside_forwards),
        cmocka_unit_test(test_marks),
        cmocka_unit_test(test_kind_attention_only), cmocka_unit_test(test_kind_recurrent_only),
        cmocka_unit_test(test_kind_mixed),
        cmocka_unit_test(test_kind_window_wraps),
        cmocka_unit_test(test_kind_window_unwrapped),
        cmocka_unit_test(test_kind_window_recurrent),
        cmocka_unit_test(test_kind_window_mixed),
        cmocka_unit_test(test_window_eviction),
        cmocka_unit_test(test_pairs_window),
        cmocka_unit_test(test_pairs_repeat_and_extend),
        cmocka_unit_test(test_pairs_cancel_and_retry),
        cmocka_unit_test(test_pairs_branches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
