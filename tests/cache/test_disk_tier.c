/* test_disk_tier.c - the disk tier of the prefix cache on the real forward pass of nh-mix-f32.
 *
 * Scenarios: a restart resumes where a cancelled request stopped; a tiny RAM budget pages old
 * branches out to disk and back; corrupt, truncated, foreign and mismatched files are skipped at
 * attach (and a file spoiled after attach at page-in) with the restore landing shallower; a small
 * disk budget drops the least recently used nodes. Each asserts what was reused, that the prompt
 * logits equal a cold run's, the cache's invariants, and that the byte accounting of both tiers
 * equals the sums walked in the trie and, after a flush, the files on disk.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>

#include "cache/disk.h"
#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "model/state.h"
#include "model/synth.h"
#include "tensor/cpu/cpu_backend.h"
#include "test_util.h"

#define TOL 2e-5

typedef struct env {
    cn_backend *b;
    cn_model *m;
    cn_engine *e;
    cn_state *cold;
    int V;
    float *want, *got;
    int cancel_after; /* forwards before the cancel callback fires; <0 never */
    int polls;
} env;

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static int32_t rnd_token(int V) { return tu_rnd_token(&g_rng, V); }

static char *model_path(void) {
    char *p = malloc(600);
    snprintf(p, 600, "%s/nh-mix-f32", tu_data_dir());
    return p;
}

static void env_open_model(env *v, const char *model, const char *cache, int spacing, int chunk,
                           uint64_t ram, uint64_t disk) {
    memset(v, 0, sizeof *v);
    v->b = cn_cpu_backend_create(2);
    assert_non_null(v->b);
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_model_open(&v->m, model, v->b, NULL, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    cn_engine_opts o = {.ctx = 512, .chunk = chunk, .cache_dir = cache, .disk_budget = disk,
                        .cache = {.spacing = spacing, .pre_end = 4, .ram_budget = ram}};
    rc = cn_engine_open(&v->e, v->m, &o, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(cn_state_create(&v->cold, v->m, 512, 0), 0);
    v->V = cn_model_config(v->m)->vocab_size;
    v->want = malloc((size_t)v->V * sizeof(float));
    v->got = malloc((size_t)v->V * sizeof(float));
    v->cancel_after = -1;
}

static void env_open(env *v, const char *cache, int spacing, int chunk, uint64_t ram, uint64_t disk) {
    char *mp = model_path();
    env_open_model(v, mp, cache, spacing, chunk, ram, disk);
    free(mp);
}

static void env_close(env *v) {
    free(v->want);
    free(v->got);
    cn_state_free(v->cold);
    cn_engine_close(v->e); /* flushes the writer */
    cn_model_close(v->m);
    cn_backend_free(v->b);
}

static int cancel_cb(void *ctx) {
    env *v = ctx;
    v->polls++;
    return v->cancel_after >= 0 && v->polls > v->cancel_after;
}

/* ---- byte accounting: the walk and the files on disk --------------------------------------- */

typedef struct disk_sum {
    uint64_t bytes;
    int files, bad;
} disk_sum;

static void sum_file(void *ctx, const char *path, const cn_disk_node *h, int rc, const char *why) {
    (void)path;
    (void)rc;
    (void)why;
    disk_sum *s = ctx;
    if (h) {
        s->bytes += h->payload_bytes;
        s->files++;
    } else {
        s->bad++;
    }
}

static disk_sum scan_model(env *v, const char *cache) {
    char dir[800];
    cn_disk_model_dir(cache, cn_model_identity(v->m), dir, sizeof dir);
    disk_sum s = {0};
    assert_int_equal(cn_disk_scan(dir, cn_model_identity(v->m), sum_file, &s, NULL, NULL), 0);
    return s;
}

static int count_filed(cn_node *n, void *ctx) {
    *(int *)ctx += n->disk_id != 0;
    return 0;
}

/* Both tiers' accounting equals the walked sums; after a flush the files hold exactly the
 * nodes that claim one, byte for byte. */
static void check_bytes(env *v, const char *cache) {
    cn_prefix_cache *pc = &v->e->pc;
    assert_true(cn_pc_check(pc));
    assert_true(cn_pc_ram_bytes_walk(pc) == pc->ram_bytes);
    assert_true(cn_pc_disk_bytes_walk(pc) == pc->disk_bytes);
    assert_int_equal(cn_pc_flush(pc), 0);
    disk_sum s = scan_model(v, cache);
    int filed = 0;
    cn_trie_walk(&pc->trie, count_filed, &filed);
    assert_int_equal(s.bad, 0);
    assert_int_equal(s.files, filed);
    assert_true(s.bytes == pc->disk_bytes);
}

/* ---- requests -------------------------------------------------------------------------------- */

static int run(env *v, const int32_t *toks, int n, int max_tokens, cn_result *res) {
    cn_request r = {.tokens = toks, .n_tokens = n, .max_tokens = max_tokens, .cancel = cancel_cb,
                    .ctx = v, .prompt_logits = v->got};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    v->polls = 0;
    int rc = cn_engine_generate(v->e, &r, res);
    assert_true(cn_pc_check(&v->e->pc));
    assert_true(cn_pc_ram_bytes_walk(&v->e->pc) == v->e->pc.ram_bytes);
    assert_true(cn_pc_disk_bytes_walk(&v->e->pc) == v->e->pc.disk_bytes);
    return rc;
}

static void expect_cold_logits(env *v, const int32_t *toks, int n) {
    assert_int_equal(cn_state_reset(v->cold), 0);
    cn_batch bt = {.tokens = toks, .n = n, .logits = v->want};
    assert_int_equal(cn_model_forward(v->m, v->cold, &bt), 0);
    double e = tu_rel_err(v->got, v->want, (size_t)v->V);
    if (e >= TOL) fprintf(stderr, "logits differ from a cold run: %.3g\n", e);
    assert_true(e < TOL);
}

/* A full request that must restore exactly `cached` tokens (-1: any) and match the cold logits. */
static void turn(env *v, const int32_t *toks, int n, int gen, int cached) {
    cn_result res;
    assert_int_equal(run(v, toks, n, gen, &res), 0);
    if (cached >= 0 && res.cached_tokens != cached)
        fprintf(stderr, "cached %d, expected %d (matched %d)\n", res.cached_tokens, cached, res.matched_tokens);
    if (cached >= 0) assert_int_equal(res.cached_tokens, cached);
    assert_int_equal(res.prompt_eval_count, n - res.cached_tokens);
    expect_cold_logits(v, toks, n);
    free(res.tokens);
}

/* The same, handing the result back (caller frees tokens). */
static cn_result turn_res(env *v, const int32_t *toks, int n, int gen, int cached) {
    cn_result res;
    assert_int_equal(run(v, toks, n, gen, &res), 0);
    if (cached >= 0 && res.cached_tokens != cached)
        fprintf(stderr, "cached %d, expected %d (matched %d)\n", res.cached_tokens, cached, res.matched_tokens);
    if (cached >= 0) assert_int_equal(res.cached_tokens, cached);
    expect_cold_logits(v, toks, n);
    return res;
}

/* The eviction work closes left, done the way an idle server does it: steps of at most two
 * nodes (a page-out or a drop each), the invariants and byte accounting holding after every one.
 * Returns the steps taken. */
static int drain(env *v) {
    cn_prefix_cache *pc = &v->e->pc;
    int steps = 0, more;
    do {
        uint64_t before = pc->n_evicted + pc->n_paged_out;
        more = cn_engine_maintain(v->e, 2);
        assert_true(pc->n_evicted + pc->n_paged_out - before <= 2);
        assert_true(cn_pc_check(pc));
        assert_true(cn_pc_disk_bytes_walk(pc) == pc->disk_bytes);
        steps++;
    } while (more);
    return steps;
}

/* ---- file surgery ---------------------------------------------------------------------------- */

static char *file_of(env *v, const char *cache, uint64_t id) {
    char dir[800];
    cn_disk_model_dir(cache, cn_model_identity(v->m), dir, sizeof dir);
    char *p = malloc(900);
    snprintf(p, 900, "%s/%016" PRIx64 CN_DISK_EXT, dir, id);
    return p;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static void write_bytes(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* The node ending at `end` on the path of toks (the trie must hold one). */
static cn_node *node_at(env *v, const int32_t *toks, int end) {
    cn_key keys[512];
    for (int i = 0; i < end; i++) keys[i] = (cn_key)toks[i];
    int m;
    cn_node *n = cn_trie_match(&v->e->pc.trie, keys, end, &m);
    assert_int_equal(m, end);
    assert_int_equal(n->end, end);
    return n;
}

/* ---- scenarios ------------------------------------------------------------------------------- */

/* Engine A is cancelled partway and closed; engine B, a new process as far as the cache can tell
 * (new backend, model and engine over the same folder), resumes exactly where A stopped. */
static void test_restart_resumes(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-restart");
    env v;
    env_open(&v, dir, 32, 9, 1 << 30, 1 << 30);
    int32_t p[120];
    for (int i = 0; i < 120; i++) p[i] = rnd_token(v.V);
    cn_result res;
    v.cancel_after = 4; /* forwards end at 9, 18, 27, 32 (a restore point), 41: stop there */
    assert_int_equal(run(&v, p, 120, 4, &res), CN_ECANCELED);
    assert_int_equal(res.prompt_eval_count, 41);
    free(res.tokens);
    check_bytes(&v, dir);
    assert_true(v.e->pc.disk_bytes > 0);
    env_close(&v);

    env_open(&v, dir, 32, 9, 1 << 30, 1 << 30);
    assert_int_equal(v.e->pc.n_disk_skipped, 0);
    assert_int_equal(v.e->pc.n_disk_loaded, 2); /* [0, 32) and the frontier [32, 41) */
    assert_int_equal(v.e->pc.ram_bytes, 0);     /* nothing is read until a request needs it */
    turn(&v, p, 120, 3, 41);
    assert_true(v.e->pc.n_paged_in >= 2);
    check_bytes(&v, dir);
    env_close(&v);

    /* a third start finds the whole prompt: restores at its pre-end point */
    env_open(&v, dir, 32, 9, 1 << 30, 1 << 30);
    turn(&v, p, 120, 3, 116);
    check_bytes(&v, dir);
    env_close(&v);
    tu_rmtree(dir);
    free(dir);
}

/* A process killed in the middle of a prefill: engine A's cancel poll, after its fifth forward,
 * waits for the writer and opens engine B over the same folder while A is still inside the
 * request (B sees exactly the files a kill -9 would leave: A never reaches its close). B
 * resumes from the last restore point A passed, [0, 32), with the prompt's logits exact. */
typedef struct crash {
    env *a;
    const char *dir;
    const int32_t *p;
    int n;
    int forwards, checked;
} crash;

static int crash_cb(void *ctx) {
    crash *c = ctx;
    if (++c->forwards < 5) return 0; /* forwards end at 9, 18, 27, 32, 41 */
    assert_int_equal(cn_pc_flush(&c->a->e->pc), 0);
    env b;
    env_open(&b, c->dir, 32, 9, 1 << 30, 1 << 30);
    assert_int_equal(b.e->pc.n_disk_skipped, 0);
    assert_int_equal(b.e->pc.n_disk_loaded, 1); /* [0, 32): no close has run */
    turn(&b, c->p, c->n, 2, 32);
    env_close(&b);
    c->checked = 1;
    return 1;
}

static void test_killed_mid_prefill(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-killed");
    env v;
    env_open(&v, dir, 32, 9, 1 << 30, 1 << 30);
    int32_t p[120];
    for (int i = 0; i < 120; i++) p[i] = rnd_token(v.V);
    crash c = {.a = &v, .dir = dir, .p = p, .n = 120};
    cn_request r = {.tokens = p, .n_tokens = 120, .max_tokens = 2, .cancel = crash_cb, .ctx = &c};
    cn_sampler_params_default(&r.sampling);
    cn_result res;
    assert_int_equal(cn_engine_generate(v.e, &r, &res), CN_ECANCELED);
    assert_true(c.checked);
    assert_int_equal(res.prompt_eval_count, 41);
    assert_true(cn_pc_check(&v.e->pc));
    free(res.tokens);
    env_close(&v);
    tu_rmtree(dir);
    free(dir);
}

/* With a RAM budget far below one branch and a disk tier, old branches are paged out instead of
 * dropped, and each one restores from disk at its own pre-end point. */
static void test_ram_pages_to_disk(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-page");
    env v;
    const uint64_t budget = 64 * 1024;
    env_open(&v, dir, 8, 8, budget, 1 << 30);
    int32_t base[40], p[6][70];
    for (int i = 0; i < 40; i++) base[i] = rnd_token(v.V);
    for (int k = 0; k < 6; k++) {
        memcpy(p[k], base, sizeof base);
        for (int i = 40; i < 70; i++) p[k][i] = rnd_token(v.V);
        p[k][40] = 30 + k; /* distinct branches */
        uint64_t moved = v.e->pc.n_paged_out + v.e->pc.n_evicted;
        turn(&v, p[k], 70, 2, -1);
        /* a request does a bounded part of the paging: a step per chunk, a few nodes at close */
        assert_true(v.e->pc.n_paged_out + v.e->pc.n_evicted - moved <= (uint64_t)(70 / 8 + 1 + 8));
        drain(&v);
        /* every RAM copy can go to disk, the active path's too: RAM always fits */
        assert_true(v.e->pc.ram_bytes <= budget);
    }
    assert_true(v.e->pc.n_paged_out > 0);
    assert_int_equal(v.e->pc.n_evicted, 0); /* nothing dropped: the disk holds it */
    check_bytes(&v, dir);
    uint64_t in0 = v.e->pc.n_paged_in;
    for (int k = 0; k < 6; k++) {
        turn(&v, p[k], 70, 2, 66);
        check_bytes(&v, dir);
    }
    assert_true(v.e->pc.n_paged_in > in0);
    env_close(&v);
    tu_rmtree(dir);
    free(dir);
}

/* ---- sliding-window layers: whole windows in the files (slot kind 3) ------------------------ */

/* On a model with sliding-window, recurrent and full-attention layers (window 16): a cancelled
 * prompt resumes after a restart with its windows read back from disk, and a tiny RAM budget
 * pages windows out and back in. */
static void test_window_restart_and_page(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-swa"), *model = tu_mkdtemp("swa-model");
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    o.mtp = 0;
    o.dtype = CN_F32;
    o.pattern = "MS*ES";
    o.sliding_window = 16;
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_synth_write(model, &o, &err), 0);
    env v;
    env_open_model(&v, model, dir, 32, 9, 1 << 30, 1 << 30);
    assert_int_equal(v.e->pc.n_win, 2);
    int32_t p[120];
    for (int i = 0; i < 120; i++) p[i] = rnd_token(v.V);
    cn_result res;
    v.cancel_after = 4; /* forwards end at 9, 18, 27, 32, 41 */
    assert_int_equal(run(&v, p, 120, 4, &res), CN_ECANCELED);
    assert_int_equal(res.prompt_eval_count, 41);
    free(res.tokens);
    check_bytes(&v, dir);
    env_close(&v);

    env_open_model(&v, model, dir, 32, 9, 1 << 30, 1 << 30);
    assert_int_equal(v.e->pc.n_disk_skipped, 0);
    assert_int_equal(v.e->pc.n_disk_loaded, 2);
    turn(&v, p, 120, 3, 41); /* the windows at 41 came from the file */
    check_bytes(&v, dir);
    env_close(&v);

    const uint64_t budget = 48 * 1024;
    env_open_model(&v, model, dir, 8, 8, budget, 1 << 30);
    turn(&v, p, 120, 3, 116);
    int32_t q[4][70];
    for (int k = 0; k < 4; k++) {
        memcpy(q[k], p, 40 * sizeof *p);
        for (int i = 40; i < 70; i++) q[k][i] = rnd_token(v.V);
        q[k][40] = 30 + k;
        /* the first branch lands at 32 (the files' restore points are 32 apart) and captures
         * the branch point 40, where the others restore */
        turn(&v, q[k], 70, 2, k ? 40 : 32);
        drain(&v);
        assert_true(v.e->pc.ram_bytes <= budget);
    }
    assert_true(v.e->pc.n_paged_out > 0);
    for (int k = 0; k < 4; k++) turn(&v, q[k], 70, 2, 66);
    check_bytes(&v, dir);
    env_close(&v);
    tu_rmtree(dir);
    tu_rmtree(model);
    free(dir);
    free(model);
}

/* ---- a draft cache: pair keys, draft rows in the files (format version 2) -------------------- */

static void count_pairs(void *ctx, const char *path, const cn_disk_node *h, int rc, const char *why) {
    (void)path;
    (void)rc;
    (void)why;
    int *c = ctx;
    if (h) c[h->pairs ? 1 : 0]++;
}

/* The live draft cache's rows [0, offset) against the head run cold over the target's hiddens. */
static void expect_cold_draft_rows(env *v, const int32_t *all) {
    const cn_state *d = v->e->spec->draft;
    int L = v->e->live->offset, H = cn_model_config(v->m)->hidden_size;
    cn_state *ct, *cd;
    assert_int_equal(cn_state_create(&ct, v->m, 512, 0), 0);
    assert_int_equal(cn_state_create(&cd, v->m, 512, d->mtp), 0); /* the head as the drafter runs it */
    float *hid = malloc((size_t)L * H * sizeof *hid);
    cn_batch bt = {.tokens = all, .n = L, .all_hidden = 1, .hidden = hid};
    assert_int_equal(cn_model_forward(v->m, ct, &bt), 0);
    assert_int_equal(cn_model_mtp_forward(v->m, cd, hid, all + 1, L, NULL, NULL), 0);
    for (int l = 0; l < d->n_layers; l++) {
        if (d->layers[l].type != CN_BLOCK_ATTN) continue;
        size_t n = (size_t)L * (size_t)d->layers[l].k.shape[1];
        assert_true(tu_rel_err(d->layers[l].k.data, cd->layers[l].k.data, n) < TOL);
        assert_true(tu_rel_err(d->layers[l].v.data, cd->layers[l].v.data, n) < TOL);
    }
    free(hid);
    cn_state_free(ct);
    cn_state_free(cd);
}

/* On a model with an MTP head the files hold the draft's rows and pair keys (version 2); a
 * restart resumes target and draft where a cancelled prompt stopped, and RAM pages to disk. */
static void test_draft_restart_and_page(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-draft");
    char mp[600];
    snprintf(mp, sizeof mp, "%s/nh-mtp-bf16", tu_data_dir());
    env v;
    env_open_model(&v, mp, dir, 32, 9, 1 << 30, 1 << 30);
    assert_non_null(v.e->spec);
    int32_t p[120];
    for (int i = 0; i < 120; i++) p[i] = rnd_token(v.V);
    cn_result res;
    v.cancel_after = 4; /* forwards end at 9, 18, 27, 32, 41: stop there */
    assert_int_equal(run(&v, p, 120, 4, &res), CN_ECANCELED);
    assert_int_equal(res.prompt_eval_count, 41);
    free(res.tokens);
    check_bytes(&v, dir);
    env_close(&v);

    env_open_model(&v, mp, dir, 32, 9, 1 << 30, 1 << 30);
    assert_int_equal(v.e->pc.n_disk_skipped, 0);
    assert_int_equal(v.e->pc.n_disk_loaded, 2);
    int pairs[2] = {0, 0};
    char mdir[800];
    cn_disk_model_dir(dir, cn_model_identity(v.m), mdir, sizeof mdir);
    assert_int_equal(cn_disk_scan(mdir, cn_model_identity(v.m), count_pairs, pairs, NULL, NULL), 0);
    assert_int_equal(pairs[0], 0);
    assert_int_equal(pairs[1], 2);
    res = turn_res(&v, p, 120, 3, 41);
    int32_t all[130];
    memcpy(all, p, sizeof p);
    memcpy(all + 120, res.tokens, (size_t)res.eval_count * sizeof *all);
    expect_cold_draft_rows(&v, all);
    free(res.tokens);
    check_bytes(&v, dir);
    env_close(&v);

    /* a small RAM budget pages draft rows out with the rest; each branch restores from disk */
    env_open_model(&v, mp, dir, 8, 8, 32 * 1024, 1 << 30);
    int32_t q[4][70];
    for (int k = 0; k < 4; k++) {
        memcpy(q[k], p, 40 * sizeof *p);
        for (int i = 40; i < 70; i++) q[k][i] = rnd_token(v.V);
        q[k][40] = 30 + k;
        res = turn_res(&v, q[k], 70, 2, -1);
        free(res.tokens);
    }
    assert_true(v.e->pc.n_paged_out > 0);
    for (int k = 0; k < 4; k++) {
        res = turn_res(&v, q[k], 70, 2, 65); /* 69 keys: the pre-end point */
        memcpy(all, q[k], 70 * sizeof *all);
        memcpy(all + 70, res.tokens, (size_t)res.eval_count * sizeof *all);
        expect_cold_draft_rows(&v, all);
        free(res.tokens);
        check_bytes(&v, dir);
    }
    env_close(&v);
    tu_rmtree(dir);
    free(dir);
}

/* Copies nh-mix-f32 with one weight bit changed: same architecture, another identity. */
static char *foreign_model(void) {
    char *dir = tu_mkdtemp("foreign");
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp %s/nh-mix-f32/* '%s'/", tu_data_dir(), dir);
    assert_int_equal(system(cmd), 0);
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t n = 0;
    char *b = tu_read_file(path, &n);
    assert_non_null(b);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(uint8_t)b[i] << (8 * i);
    b[8 + hlen] ^= 1; /* lowest mantissa bit of the first value of the first tensor */
    write_bytes(path, b, n);
    free(b);
    return dir;
}

/* Files spoiled in four ways are each skipped with a warning at attach, moved aside, and never
 * used: the restore lands at the deepest point that verified, the logits equal a cold run's,
 * and the next request fills the gap again. A file spoiled after attach fails at page-in. */
static void test_bad_files_skipped(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-bad");
    env v;
    env_open(&v, dir, 16, 8, 1 << 30, 1 << 30);
    int32_t p[60];
    for (int i = 0; i < 60; i++) p[i] = rnd_token(v.V);
    turn(&v, p, 60, 1, 0); /* nodes end at 16, 32, 48, 56 (pre-end) and 60 (frontier) */
    char *f16 = file_of(&v, dir, node_at(&v, p, 16)->disk_id);
    char *f32 = file_of(&v, dir, node_at(&v, p, 32)->disk_id);
    char *f48 = file_of(&v, dir, node_at(&v, p, 48)->disk_id);
    char *f56 = file_of(&v, dir, node_at(&v, p, 56)->disk_id);
    char *f60 = file_of(&v, dir, node_at(&v, p, 60)->disk_id);
    check_bytes(&v, dir);
    env_close(&v);

    /* (1) a flipped payload byte, (2) a truncated file, (3) a wrong magic */
    size_t n = 0;
    char *b = tu_read_file(f32, &n);
    b[n - 100] ^= 0x40;
    write_bytes(f32, b, n);
    free(b);
    b = tu_read_file(f48, &n);
    write_bytes(f48, b, n - 9);
    free(b);
    b = tu_read_file(f56, &n);
    b[0] = 'X';
    write_bytes(f56, b, n);
    free(b);
    /* (4) the file another model (one weight bit apart) wrote for the same node */
    char *fm = foreign_model();
    env w;
    env_open_model(&w, fm, dir, 16, 8, 1 << 30, 1 << 30);
    assert_true(cn_model_identity(w.m) != 0);
    turn(&w, p, 60, 1, 0);
    char *foreign = file_of(&w, dir, node_at(&w, p, 60)->disk_id);
    uint64_t foreign_id = cn_model_identity(w.m);
    env_close(&w);
    b = tu_read_file(foreign, &n);
    write_bytes(f60, b, n); /* same node id, same name: only the model identity differs */
    free(b);

    env_open(&v, dir, 16, 8, 1 << 30, 1 << 30);
    assert_true(cn_model_identity(v.m) != foreign_id);
    assert_int_equal(v.e->pc.n_disk_skipped, 4);
    assert_int_equal(v.e->pc.n_disk_loaded, 1); /* [0, 16) */
    char bad[1000];
    const char *spoiled[] = {f32, f48, f56, f60};
    for (int i = 0; i < 4; i++) {
        snprintf(bad, sizeof bad, "%s.bad", spoiled[i]);
        assert_true(exists(bad));
        assert_false(exists(spoiled[i]));
    }
    /* only [0, 16) verified: the restore lands there */
    turn(&v, p, 60, 1, 16);
    check_bytes(&v, dir);
    /* the request filled the trie again: the pre-end point is back */
    turn(&v, p, 60, 1, 56);
    env_close(&v);

    /* a file spoiled after attach: page-in reports it, the restore lands shallower */
    env_open(&v, dir, 16, 8, 1 << 30, 1 << 30);
    assert_int_equal(v.e->pc.n_disk_skipped, 0);
    char *g56 = file_of(&v, dir, node_at(&v, p, 56)->disk_id);
    b = tu_read_file(g56, &n);
    b[n - 20] ^= 0x01;
    write_bytes(g56, b, n);
    free(b);
    turn(&v, p, 60, 1, 48);
    assert_int_equal(v.e->pc.n_disk_failed, 1);
    snprintf(bad, sizeof bad, "%s.bad", g56);
    assert_true(exists(bad));
    check_bytes(&v, dir);
    env_close(&v);

    free(g56);
    free(f16);
    free(f32);
    free(f48);
    free(f56);
    free(f60);
    free(foreign);
    tu_rmtree(fm);
    free(fm);
    tu_rmtree(dir);
    free(dir);
}

/* Over the disk budget the least recently used nodes go from every tier, files included; the
 * active path stays. */
static void test_disk_budget_drops_lru(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-budget");
    env v;
    /* one prompt of 30 tokens makes two nodes of about 110 KB together: two prompts fit */
    const uint64_t budget = 250 * 1024;
    env_open(&v, dir, 64, 8, 1 << 30, budget);
    int32_t p[4][30];
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 30; i++) p[k][i] = rnd_token(v.V);
        p[k][0] = 30 + k;
    }
    cn_node *first = NULL;
    char *first_file = NULL;
    for (int k = 0; k < 4; k++) {
        turn(&v, p[k], 30, 1, 0);
        drain(&v);
        if (k == 0) {
            first = node_at(&v, p[0], 26);
            first_file = file_of(&v, dir, first->disk_id);
            assert_int_equal(cn_pc_flush(&v.e->pc), 0);
            assert_true(exists(first_file));
        }
        assert_true(v.e->pc.disk_bytes <= budget);
        check_bytes(&v, dir);
    }
    assert_true(v.e->pc.n_evicted > 0);
    assert_false(exists(first_file));
    /* the newest prompts restore at their pre-end points; the oldest starts over */
    turn(&v, p[3], 30, 1, 26);
    turn(&v, p[0], 30, 1, 0);
    check_bytes(&v, dir);
    env_close(&v);
    /* a restart finds what the budget kept, and no more than it allows */
    env_open(&v, dir, 64, 8, 1 << 30, budget);
    assert_true(v.e->pc.disk_bytes <= budget);
    assert_true(v.e->pc.n_disk_loaded > 0);
    turn(&v, p[0], 30, 1, 26);
    env_close(&v);
    free(first_file);
    tu_rmtree(dir);
    free(dir);
}

/* The file format rejects what it must on its own: an image is read back from the queue before
 * it reaches the disk, and a folder that cannot be created is an error naming it. */
static void test_disk_module(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("disk-mod");
    cn_disk *d;
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_disk_open(&d, dir, 0x1234, 0, &err), 0);
    cn_key keys[5] = {7, 8, 9, 10, 11};
    cn_disk_slot slots[2] = {{1, 3, 5, 16}, {2, 5, 5, 8}};
    cn_disk_node h = {.start = 3, .end = 5, .user = 1, .n_layers = 2, .slots = slots, .keys = keys};
    cn_disk_blob *b = cn_disk_blob_new(d, &h);
    assert_non_null(b);
    for (int i = 0; i < 5; i++) cn_disk_blob_set_key(b, i, keys[i]);
    memset(cn_disk_blob_slot(b, 0), 0xab, 16);
    memset(cn_disk_blob_slot(b, 1), 0xcd, 8);
    uint64_t id;
    assert_int_equal(cn_disk_submit(d, b, &id), 0);
    assert_true(id == cn_disk_node_id(keys, 5));
    int want[2] = {1, 1};
    uint8_t *out[2] = {NULL, NULL};
    assert_int_equal(cn_disk_read(d, id, &h, want, out, &err), 0); /* queued or written: same bytes */
    assert_int_equal(out[0][15], 0xab);
    assert_int_equal(out[1][0], 0xcd);
    free(out[0]);
    free(out[1]);
    assert_int_equal(cn_disk_flush(d), 0);
    assert_int_equal(cn_disk_read(d, id, &h, want, out, &err), 0); /* from the file */
    free(out[0]);
    free(out[1]);
    /* the caller's view must match the file's */
    cn_key other[5] = {7, 8, 9, 10, 12};
    cn_disk_node h2 = h;
    h2.keys = other;
    assert_int_equal(cn_disk_read(d, id, &h2, want, out, &err), CN_EFORMAT);
    slots[0].to = 4;
    assert_int_equal(cn_disk_read(d, id, &h, want, out, &err), CN_EFORMAT);
    slots[0].to = 5;
    /* a removal wins over the write queued before it */
    assert_int_equal(cn_disk_remove(d, id), 0);
    assert_int_equal(cn_disk_read(d, id, &h, want, out, &err), CN_ENOENT);
    cn_disk_flush(d);
    assert_int_equal(cn_disk_read(d, id, &h, want, out, &err), CN_ENOENT);
    assert_non_null(strstr(err.msg, CN_DISK_EXT));
    cn_disk_close(d);
    /* a folder under a regular file cannot be made */
    char file[700];
    snprintf(file, sizeof file, "%s/plain", dir);
    write_bytes(file, "x", 1);
    assert_int_equal(cn_disk_open(&d, file, 1, 0, &err), CN_EIO);
    assert_non_null(strstr(err.msg, "plain"));
    tu_rmtree(dir);
    free(dir);
}

/* The identity files are keyed by: the same from a directory as from the opened model, and
 * different for two seeds of one synthetic preset (same config, other weights). */
static void test_model_identity(void **st) {
    (void)st;
    env v;
    env_open(&v, NULL, 16, 8, 1 << 30, 1 << 30);
    char *mp = model_path();
    uint64_t id = 0;
    assert_int_equal(cn_model_identity_dir(mp, &id, NULL), 0);
    assert_true(id == cn_model_identity(v.m));
    assert_null(v.e->pc.disk); /* no --cache-dir: no disk tier */
    env_close(&v);
    free(mp);
    uint64_t ids[2];
    for (int seed = 1; seed <= 2; seed++) {
        char *dir = tu_mkdtemp("seed");
        cn_synth_opts o;
        cn_synth_opts_init(&o);
        o.seed = (uint64_t)seed;
        assert_int_equal(cn_synth_write(dir, &o, NULL), 0);
        assert_int_equal(cn_model_identity_dir(dir, &ids[seed - 1], NULL), 0);
        tu_rmtree(dir);
        free(dir);
    }
    assert_true(ids[0] != ids[1]);
    assert_true(ids[0] != id);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk_module),
        cmocka_unit_test(test_model_identity),
        cmocka_unit_test(test_restart_resumes),
        cmocka_unit_test(test_killed_mid_prefill),
        cmocka_unit_test(test_ram_pages_to_disk),
        cmocka_unit_test(test_draft_restart_and_page),
        cmocka_unit_test(test_window_restart_and_page),
        cmocka_unit_test(test_bad_files_skipped),
        cmocka_unit_test(test_disk_budget_drops_lru),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
