/* test_snapshot_paging.c - the device tier of the prefix cache: snapshots taken into device
 * buffers, paged to host RAM over the copy stream, from there to disk, and back on restore.
 *
 * Runs on $CAIRN_BACKEND: on the CPU (CI) the "device" buffers are host memory and the copy
 * stream is memcpy, which still checks the policy, the byte accounting of all three tiers and the
 * layout of every move; on the GPU the same scenarios page real device memory through pinned
 * buffers and fences. Scenarios: the snapshot module's moves one by one (device capture, split and
 * concat on the device, to_host, restore from either tier) against the live bytes; and whole
 * requests on nh-mix-f32 under budgets far below one branch, so that every node goes device ->
 * RAM -> disk, then each branch is restored from disk with the reuse expected and the prompt's
 * logits equal to a cold run's; a device tier large enough to hold everything; and snapshot
 * buffers that fail to allocate (host or device), on the CPU backend with its buffer hooks
 * replaced, where nothing may be lost or leaked and an eviction step that cannot progress says so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/prefix_cache.h"
#include "cache/snapshot.h"
#include "engine/engine.h"
#include "model/state.h"
#include "tensor/backend_impl.h"
#include "tensor/cpu/cpu_backend.h"
#include "test_util.h"

#define TOL 2e-5

static uint64_t g_rng = 0x51ed2701f3a5c7b9ull;
static int32_t rnd_token(int V) { return tu_rnd_token(&g_rng, V); }

/* nh-mix-f32 on *b, or on a new backend of $CAIRN_BACKEND when *b is NULL. */
static void open_model(cn_backend **b, cn_model **m) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/nh-mix-f32", tu_data_dir());
    if (!*b) *b = tu_backend(2);
    assert_non_null(*b);
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_model_open(m, dir, *b, NULL, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
}

/* A host copy of a snapshot's bytes (waiting for them). */
static uint8_t *bytes_of(const cn_snap *p, const cn_state *s, int layer) {
    uint8_t *h = malloc(p->bytes + 1);
    assert_non_null(h);
    assert_int_equal(cn_snap_read(p, s, layer, h), 0);
    return h;
}

static int layer_of(const cn_state *s, cn_block type) {
    for (int l = 0; l < s->n_layers; l++)
        if (s->layers[l].type == type) return l;
    return -1;
}

/* ---- the snapshot module ------------------------------------------------------------------- */

/* A recurrent state and a KV range go to the device tier, split and concatenate there, move to
 * RAM (the copy in flight), and restore into a live state from either tier: every byte as taken. */
static void test_snapshot_moves(void **st) {
    (void)st;
    cn_backend *b = NULL;
    cn_model *m;
    open_model(&b, &m);
    int V = cn_model_config(m)->vocab_size;
    cn_state *s;
    assert_int_equal(cn_state_create(&s, m, 64, 0), 0);
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = rnd_token(V);
    cn_batch bt = {.tokens = toks, .n = 40};
    assert_int_equal(cn_model_forward(m, s, &bt), 0);
    int lm = layer_of(s, CN_BLOCK_MAMBA), la = layer_of(s, CN_BLOCK_ATTN);
    assert_true(lm >= 0 && la >= 0);

    /* the recurrent state: DEVICE, then RAM through the copy stream */
    cn_snap *rs;
    assert_int_equal(cn_snap_state_take(s, lm, CN_SNAP_DEVICE, &rs), 0);
    assert_int_equal(rs->tier, CN_SNAP_DEVICE);
    assert_non_null(rs->dev);
    assert_null(rs->ram);
    uint8_t *want_state = bytes_of(rs, s, lm);
    uint8_t *live_state = malloc(rs->bytes);
    cn_tensor conv = s->layers[lm].conv, ssm = s->layers[lm].ssm;
    assert_int_equal(cn_backend_download(b, live_state, &conv), 0);
    assert_int_equal(cn_backend_download(b, live_state + cn_tensor_nbytes(&conv), &ssm), 0);
    assert_memory_equal(want_state, live_state, rs->bytes);

    /* the KV rows: lazy, materialized on the device, split at 13, joined again */
    cn_snap *kv = cn_snap_kv_lazy(s, la, 0, 40);
    assert_non_null(kv);
    uint8_t *want_kv = bytes_of(kv, s, la); /* from the live buffer */
    assert_int_equal(cn_snap_materialize(kv, s, la, CN_SNAP_DEVICE), 0);
    assert_int_equal(kv->tier, CN_SNAP_DEVICE);
    uint8_t *got = bytes_of(kv, s, la);
    assert_memory_equal(got, want_kv, kv->bytes);
    free(got);
    cn_snap *h, *t, *j;
    assert_int_equal(cn_snap_kv_split(kv, s, la, 13, &h, &t), 0);
    assert_int_equal(h->tier, CN_SNAP_DEVICE);
    assert_int_equal(t->tier, CN_SNAP_DEVICE);
    assert_int_equal(cn_snap_kv_concat(h, t, s, la, &j), 0);
    assert_int_equal(j->tier, CN_SNAP_DEVICE);
    got = bytes_of(j, s, la);
    assert_memory_equal(got, want_kv, kv->bytes);
    free(got);
    cn_snap_free(j);
    /* tiers must agree before a concat */
    assert_int_equal(cn_snap_to_host(h), 0);
    assert_int_equal(h->tier, CN_SNAP_RAM);
    assert_null(h->dev);
    assert_int_equal(cn_snap_kv_concat(h, t, s, la, &j), CN_EINVAL);
    assert_int_equal(cn_snap_to_host(t), 0);
    assert_int_equal(cn_snap_kv_concat(h, t, s, la, &j), 0); /* reads bytes still in flight */
    assert_int_equal(cn_backend_fence_wait(b, t->fence, 1), 0);
    assert_true(cn_backend_fence_done(b, t->fence));
    assert_true(cn_backend_fence_done(b, h->fence)); /* an earlier fence */
    assert_int_equal(j->tier, CN_SNAP_RAM);
    got = bytes_of(j, s, la);
    assert_memory_equal(got, want_kv, kv->bytes);
    free(got);

    /* restores into a cleared state: the state from RAM (its copy may still be in flight), the
     * KV head from the device snapshot and the tail from RAM */
    assert_int_equal(cn_snap_to_host(rs), 0);
    assert_int_equal(rs->tier, CN_SNAP_RAM);
    cn_state *z;
    assert_int_equal(cn_state_create(&z, m, 64, 0), 0);
    assert_int_equal(cn_snap_state_restore(rs, z, lm), 0);
    assert_int_equal(cn_snap_kv_restore(kv, z, la, 0, 13), 0);
    assert_int_equal(cn_snap_kv_restore(t, z, la, 13, 40), 0);
    assert_int_equal(cn_backend_sync(b), 0);
    conv = z->layers[lm].conv;
    ssm = z->layers[lm].ssm;
    assert_int_equal(cn_backend_download(b, live_state, &conv), 0);
    assert_int_equal(cn_backend_download(b, live_state + cn_tensor_nbytes(&conv), &ssm), 0);
    assert_memory_equal(want_state, live_state, rs->bytes);
    z->offset = 40;
    cn_snap *back = cn_snap_kv_lazy(z, la, 0, 40);
    got = bytes_of(back, z, la);
    assert_memory_equal(got, want_kv, kv->bytes);
    free(got);
    cn_snap_free(back);

    /* RAM -> DISK -> RAM keeps the bytes (page_in hands over a malloc'd copy) */
    uint8_t *ram = bytes_of(j, s, la);
    cn_snap_page_out(j);
    assert_int_equal(j->tier, CN_SNAP_DISK);
    assert_null(j->ram);
    cn_snap_page_in(j, ram);
    got = bytes_of(j, s, la);
    assert_memory_equal(got, want_kv, kv->bytes);
    free(got);

    cn_snap_free(j);
    cn_snap_free(h);
    cn_snap_free(t);
    cn_snap_free(kv);
    cn_snap_free(rs);
    free(want_state);
    free(live_state);
    free(want_kv);
    cn_state_free(z);
    cn_state_free(s);
    cn_model_close(m);
    cn_backend_free(b);
}

/* ---- requests through the tiers ------------------------------------------------------------ */

typedef struct env {
    cn_backend *b;
    int own_b;
    cn_model *m;
    cn_engine *e;
    cn_state *cold;
    int V;
    float *want, *got;
} env;

/* On backend b (NULL: a new one of $CAIRN_BACKEND, owned). */
static void env_open_on(env *v, cn_backend *b, const char *cache, uint64_t dev, uint64_t ram) {
    memset(v, 0, sizeof *v);
    v->b = b;
    v->own_b = !b;
    open_model(&v->b, &v->m);
    cn_err err;
    cn_err_clear(&err);
    cn_engine_opts o = {.ctx = 512, .chunk = 8, .cache_dir = cache, .disk_budget = 1 << 30,
                        .cache = {.spacing = 8, .pre_end = 4, .ram_budget = ram, .dev_budget = dev}};
    int rc = cn_engine_open(&v->e, v->m, &o, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(cn_state_create(&v->cold, v->m, 512, 0), 0);
    v->V = cn_model_config(v->m)->vocab_size;
    v->want = malloc((size_t)v->V * sizeof(float));
    v->got = malloc((size_t)v->V * sizeof(float));
}

static void env_open(env *v, const char *cache, uint64_t dev, uint64_t ram) {
    env_open_on(v, NULL, cache, dev, ram);
}

static void env_close(env *v) {
    free(v->want);
    free(v->got);
    cn_state_free(v->cold);
    cn_engine_close(v->e);
    cn_model_close(v->m);
    if (v->own_b) cn_backend_free(v->b);
}

static void check(const cn_prefix_cache *pc) {
    assert_true(cn_pc_check(pc));
    assert_true(cn_pc_ram_bytes_walk(pc) == pc->ram_bytes);
    assert_true(cn_pc_dev_bytes_walk(pc) == pc->dev_bytes);
    assert_true(cn_pc_disk_bytes_walk(pc) == pc->disk_bytes);
}

/* A greedy request that must restore exactly `cached` tokens (-1: any) and match a cold run. */
static void turn(env *v, const int32_t *toks, int n, int cached) {
    cn_request r = {.tokens = toks, .n_tokens = n, .max_tokens = 2, .prompt_logits = v->got};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    cn_result res;
    assert_int_equal(cn_engine_generate(v->e, &r, &res), 0);
    check(&v->e->pc);
    if (cached >= 0 && res.cached_tokens != cached)
        fprintf(stderr, "cached %d, expected %d (matched %d)\n", res.cached_tokens, cached, res.matched_tokens);
    if (cached >= 0) assert_int_equal(res.cached_tokens, cached);
    assert_int_equal(res.prompt_eval_count, n - res.cached_tokens);
    free(res.tokens);
    assert_int_equal(cn_state_reset(v->cold), 0);
    cn_batch bt = {.tokens = toks, .n = n, .logits = v->want};
    assert_int_equal(cn_model_forward(v->m, v->cold, &bt), 0);
    double e = tu_rel_err(v->got, v->want, (size_t)v->V);
    if (e >= TOL) fprintf(stderr, "logits differ from a cold run: %.3g\n", e);
    assert_true(e < TOL);
}

/* Eviction left by the close, in steps of at most two nodes, checked after each. */
static void drain(env *v) {
    cn_prefix_cache *pc = &v->e->pc;
    int more;
    do {
        uint64_t before = pc->n_evicted + pc->n_paged_out + pc->n_to_host;
        more = cn_engine_maintain(v->e, 2);
        assert_true(pc->n_evicted + pc->n_paged_out + pc->n_to_host - before <= 2);
        check(pc);
    } while (more);
}

/* Budgets far below one branch: new state lands on the device, moves to RAM, then to disk, and
 * each branch comes back from disk at its pre-end point with cold logits. */
static void test_device_ram_disk_and_back(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("snap-paging");
    env v;
    const uint64_t dev = 48 * 1024, ram = 64 * 1024;
    env_open(&v, dir, dev, ram);
    cn_prefix_cache *pc = &v.e->pc;
    assert_true(pc->o.dev_budget == dev);
    int32_t base[40], p[5][70];
    for (int i = 0; i < 40; i++) base[i] = rnd_token(v.V);
    uint64_t dev_seen = 0;
    for (int k = 0; k < 5; k++) {
        memcpy(p[k], base, sizeof base);
        for (int i = 40; i < 70; i++) p[k][i] = rnd_token(v.V);
        p[k][40] = 30 + k; /* distinct branches */
        turn(&v, p[k], 70, k ? 40 : 0);
        if (pc->dev_bytes > dev_seen) dev_seen = pc->dev_bytes;
        drain(&v);
        /* every device copy can go to RAM and every RAM copy to disk, the active path's too */
        assert_true(pc->dev_bytes <= dev);
        assert_true(pc->ram_bytes <= ram);
    }
    assert_true(dev_seen > 0);       /* state was taken on the device */
    assert_true(pc->n_to_host > 0);  /* and moved to RAM */
    assert_true(pc->n_paged_out > 0); /* and on to disk */
    assert_int_equal(pc->n_evicted, 0);
    uint64_t in0 = pc->n_paged_in;
    for (int k = 0; k < 5; k++) {
        turn(&v, p[k], 70, 66);
        drain(&v);
    }
    assert_true(pc->n_paged_in > in0);
    env_close(&v);

    /* a restart finds every branch on disk; its restores land on the device tier again */
    env_open(&v, dir, dev, ram);
    for (int k = 4; k >= 0; k--) turn(&v, p[k], 70, 66);
    assert_true(v.e->pc.n_paged_in > 0);
    env_close(&v);
    tu_rmtree(dir);
    free(dir);
}

/* Without a disk tier the device tier drains into RAM (which holds it all here: nothing is
 * dropped), and every prompt restores at its pre-end point from RAM with cold logits. */
static void test_device_ram_without_disk(void **st) {
    (void)st;
    env v;
    const uint64_t dev = 32 * 1024, ram = 64 << 20;
    env_open(&v, NULL, dev, ram);
    cn_prefix_cache *pc = &v.e->pc;
    int32_t p[3][60];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 60; i++) p[k][i] = rnd_token(v.V);
    for (int k = 0; k < 3; k++) {
        turn(&v, p[k], 60, 0);
        drain(&v);
        assert_true(pc->dev_bytes <= dev);
    }
    assert_true(pc->n_to_host > 0);
    assert_int_equal(pc->n_evicted, 0);
    for (int k = 0; k < 3; k++) turn(&v, p[k], 60, 56);
    env_close(&v);
}

/* A device tier with room for everything: restore points live on the device alone (no RAM is
 * used, however small its budget) and restore from there, on a branch and on a retry. */
static void test_device_only(void **st) {
    (void)st;
    env v;
    env_open(&v, NULL, 64 << 20, 1);
    cn_prefix_cache *pc = &v.e->pc;
    int32_t p[2][50];
    for (int i = 0; i < 50; i++) p[0][i] = p[1][i] = rnd_token(v.V);
    p[1][30] = p[0][30] + 1; /* a branch at 30 */
    turn(&v, p[0], 50, 0);
    drain(&v);
    assert_true(pc->dev_bytes > 0);
    assert_true(pc->ram_bytes == 0);
    turn(&v, p[1], 50, 24); /* the restore point at spacing 8 below the branch: from the device */
    turn(&v, p[0], 50, 48);
    drain(&v);
    assert_true(pc->ram_bytes == 0);
    assert_int_equal(pc->n_to_host, 0);
    assert_int_equal(pc->n_evicted, 0);
    env_close(&v);
}

/* ---- allocation failures ------------------------------------------------------------------- */

/* A CPU backend whose snapshot buffers fail on demand, counting the device ones it has out. */
static int g_fail_host, g_fail_dev, g_dev_out;

static int flaky_alloc(cn_backend *b, int kind, uint64_t n, void **out) {
    (void)b;
    if ((kind == CN_BUF_HOST && g_fail_host) || (kind == CN_BUF_DEVICE && g_fail_dev)) return CN_ENOMEM;
    void *p = malloc(n ? (size_t)n : 1);
    if (!p) return CN_ENOMEM;
    g_dev_out += kind == CN_BUF_DEVICE;
    *out = p;
    return CN_OK;
}

static void flaky_free(cn_backend *b, int kind, void *p) {
    (void)b;
    g_dev_out -= kind == CN_BUF_DEVICE;
    free(p);
}

/* Host buffers failing: device bytes stay on the device over their budget (nothing is lost, the
 * eviction step says it cannot go on), restores still come from there; once host buffers come
 * back the device drains. Device buffers failing: new state goes to RAM instead. Every restore
 * matches a cold run, and no device buffer is left at the end. */
static void test_allocation_failures(void **st) {
    (void)st;
    cn_backend *cpu = cn_cpu_backend_create(2);
    assert_non_null(cpu);
    cn_backend_iface fi = *cpu->iface;
    fi.buf_alloc = flaky_alloc;
    fi.buf_free = flaky_free;
    cn_backend fb = {&fi, cpu->ctx};
    g_fail_host = g_fail_dev = g_dev_out = 0;
    env v;
    const uint64_t dev = 32 * 1024;
    env_open_on(&v, &fb, NULL, dev, 64 << 20);
    cn_prefix_cache *pc = &v.e->pc;
    int32_t p[2][60];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 60; i++) p[k][i] = rnd_token(v.V);

    g_fail_host = 1;
    turn(&v, p[0], 60, 0);
    drain(&v);
    assert_true(pc->dev_bytes > dev); /* nowhere to go */
    assert_int_equal(pc->n_to_host, 0);
    assert_true(cn_pc_over_budget(pc));
    assert_int_equal(cn_pc_evict_step(pc, 4), 0); /* no progress possible: the step says so */
    turn(&v, p[0], 60, 56);
    g_fail_host = 0;
    drain(&v);
    assert_true(pc->dev_bytes <= dev);
    assert_true(pc->n_to_host > 0);

    g_fail_dev = 1;
    uint64_t dev_before = pc->dev_bytes, ram_before = pc->ram_bytes;
    turn(&v, p[1], 60, 0);
    assert_true(pc->dev_bytes <= dev_before);
    assert_true(pc->ram_bytes > ram_before);
    turn(&v, p[1], 60, 56);
    g_fail_dev = 0;
    turn(&v, p[0], 60, 56);
    assert_int_equal(pc->n_evicted, 0);
    env_close(&v);
    assert_int_equal(g_dev_out, 0);
    cn_backend_free(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_moves),
        cmocka_unit_test(test_device_ram_disk_and_back),
        cmocka_unit_test(test_device_ram_without_disk),
        cmocka_unit_test(test_device_only),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
