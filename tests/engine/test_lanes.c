/* test_lanes.c - an engine of several lanes: requests that run at once share one prefix cache,
 * each resumes from what any lane recorded, and on the CPU each one's tokens are those it gets
 * running alone (engine.h, lanes). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "model/state.h"
#include "model/synth.h"
#include "test_util.h"

#define LANES 3
#define GEN 12
#define TOL 2e-5

typedef struct env {
    cn_backend *b;
    cn_model *m;
    cn_engine *e;
    int V;
} env;

static void env_open_dir(env *v, const char *dir, int lanes) {
    memset(v, 0, sizeof *v);
    v->b = tu_backend(2);
    assert_non_null(v->b);
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_model_open(&v->m, dir, v->b, NULL, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    cn_engine_opts o = {.ctx = 256, .chunk = 16, .lanes = lanes,
                        .cache = {.spacing = 32, .pre_end = 4}};
    rc = cn_engine_open(&v->e, v->m, &o, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    v->V = cn_model_config(v->m)->vocab_size;
}

static void env_open(env *v, const char *name, int lanes) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tu_data_dir(), name);
    env_open_dir(v, dir, lanes);
}

static void env_close(env *v) {
    cn_engine_close(v->e);
    cn_model_close(v->m);
    cn_backend_free(v->b);
}

/* One request's inputs and what it gave. */
typedef struct job {
    env *v;
    int lane;
    const int32_t *prompt;
    int n;
    int32_t out[GEN];
    int n_out, cached, rc;
    float *logits; /* [V] after the prompt */
} job;

/* A barrier the concurrent requests meet at on their first token, so that all of them decode
 * together whatever the threads' timing: every later step is a batched one. */
typedef struct meet {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting, total;
} meet;

static meet g_meet = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

static int first_token(void *ctx, int32_t t) {
    (void)t;
    job *j = ctx;
    if (j->n_out++ || !g_meet.total) return 0;
    pthread_mutex_lock(&g_meet.mu);
    if (++g_meet.waiting == g_meet.total) pthread_cond_broadcast(&g_meet.cv);
    while (g_meet.waiting < g_meet.total) pthread_cond_wait(&g_meet.cv, &g_meet.mu);
    pthread_mutex_unlock(&g_meet.mu);
    return 0;
}

static void job_run(job *j) {
    cn_request r = {.tokens = j->prompt, .n_tokens = j->n, .max_tokens = GEN, .ignore_eos = 1,
                    .prompt_logits = j->logits, .on_token = first_token, .ctx = j};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    cn_result res;
    j->rc = cn_engine_generate_on(j->v->e, j->lane, &r, &res);
    j->n_out = res.eval_count;
    j->cached = res.cached_tokens;
    if (res.tokens) memcpy(j->out, res.tokens, (size_t)res.eval_count * sizeof(int32_t));
    free(res.tokens);
}

static void *job_thread(void *p) {
    job_run(p);
    return NULL;
}

static void prompts(int V, int32_t p[LANES][96], int lens[LANES]) {
    uint64_t rng = 0x243f6a8885a308d3ull;
    int32_t shared[40];
    for (int i = 0; i < 40; i++) shared[i] = tu_rnd_token(&rng, V);
    for (int k = 0; k < LANES; k++) {
        lens[k] = 60 + 13 * k;
        memcpy(p[k], shared, sizeof shared); /* one shared head, then each its own */
        for (int i = 40; i < lens[k]; i++) p[k][i] = tu_rnd_token(&rng, V);
    }
}

/* The same prompts alone on a one-lane engine, then at once on three lanes: the same greedy
 * tokens; a request that follows another on a different lane restores what that one recorded,
 * and its prompt's logits equal the ones it got alone. */
static void check_lanes_dir(const char *dir) {
    env one, many;
    env_open_dir(&one, dir, 1);
    env_open_dir(&many, dir, LANES);
    const int V = one.V;
    int32_t p[LANES][96];
    int lens[LANES];
    prompts(V, p, lens);
    job alone[LANES], at_once[LANES];
    for (int k = 0; k < LANES; k++) {
        alone[k] = (job){.v = &one, .lane = 0, .prompt = p[k], .n = lens[k]};
        alone[k].logits = malloc((size_t)V * sizeof(float));
        at_once[k] = (job){.v = &many, .lane = k, .prompt = p[k], .n = lens[k]};
        at_once[k].logits = malloc((size_t)V * sizeof(float));
        job_run(&alone[k]);
        assert_int_equal(alone[k].rc, 0);
        assert_int_equal(alone[k].n_out, GEN);
    }
    pthread_t th[LANES];
    g_meet.waiting = 0;
    g_meet.total = LANES;
    for (int k = 0; k < LANES; k++) assert_int_equal(pthread_create(&th[k], NULL, job_thread, &at_once[k]), 0);
    for (int k = 0; k < LANES; k++) pthread_join(th[k], NULL);
    g_meet.total = 0;
    /* after the meeting every step took all three: GEN - 1 forwards each (the last token is
     * never forwarded), at most the first of them before the others arrived */
    if (!strchr(cn_model_config(many.m)->layers, 'S')) { /* windows: each lane alone */
        assert_true(many.e->gate_steps >= GEN - 2);
        assert_true(many.e->gate_tokens >= (uint64_t)LANES * (GEN - 2));
    }
    for (int k = 0; k < LANES; k++) {
        assert_int_equal(at_once[k].rc, 0);
        assert_int_equal(at_once[k].n_out, GEN);
        assert_memory_equal(at_once[k].out, alone[k].out, sizeof alone[k].out);
        assert_true(tu_rel_err(at_once[k].logits, alone[k].logits, (size_t)V) < TOL);
    }
    assert_true(cn_pc_check(&many.e->pc));
    /* each prompt again, on the next lane over: it resumes from the other lane's restore point
     * before its end, the rows it needs read from that lane's state */
    for (int k = 0; k < LANES; k++) {
        job again = {.v = &many, .lane = (k + 1) % LANES, .prompt = p[k], .n = lens[k]};
        again.logits = malloc((size_t)V * sizeof(float));
        job_run(&again);
        assert_int_equal(again.rc, 0);
        assert_int_equal(again.cached, lens[k] - 4 - many.e->pc.lookahead); /* pairs: n - 1 keys */
        assert_memory_equal(again.out, alone[k].out, sizeof again.out);
        assert_true(tu_rel_err(again.logits, alone[k].logits, (size_t)V) < TOL);
        assert_true(cn_pc_check(&many.e->pc));
        free(again.logits);
    }
    for (int k = 0; k < LANES; k++) {
        free(alone[k].logits);
        free(at_once[k].logits);
    }
    env_close(&one);
    env_close(&many);
}

static void check_lanes(const char *name) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tu_data_dir(), name);
    check_lanes_dir(dir);
}

static void test_lanes_mix(void **st) { (void)st; check_lanes("nh-mix-f32"); }
/* sliding-window layers: the batched forward does not take them, the gate runs each lane alone */
static void test_lanes_window(void **st) {
    (void)st;
    char *dir = tu_mkdtemp("lanes-swa");
    assert_non_null(dir);
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    o.mtp = 0;
    o.dtype = CN_F32;
    o.pattern = "MSEM*E";
    o.sliding_window = 16;
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_synth_write(dir, &o, &err), 0);
    check_lanes_dir(dir);
    tu_rmtree(dir);
    free(dir);
}
/* with an MTP head: every lane has its drafter and keeps its draft cache level */
static void test_lanes_mtp(void **st) { (void)st; check_lanes("nh-mtp-bf16"); }

/* The in-flight join: lane 1's prompt shares 150 tokens with the prompt lane 0 is absorbing
 * (paced at 20 ms a chunk); it waits for lane 0 to pass the point where they part and restores
 * there, evaluating only its own 50; its answer is the one it gets alone. */
typedef struct pace {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;
} pace;

static int slow_cancel(void *ctx) {
    (void)ctx;
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    return 0;
}

static void started(void *ctx, int done, int total) {
    (void)done;
    (void)total;
    pace *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->started = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

typedef struct slow_job {
    env *v;
    const int32_t *prompt;
    int n;
    pace *p;
    cn_result res;
    int rc;
} slow_job;

static void *slow_thread(void *arg) {
    slow_job *j = arg;
    cn_request r = {.tokens = j->prompt, .n_tokens = j->n, .max_tokens = 2, .cancel = slow_cancel,
                    .on_progress = started, .ctx = j->p};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    j->rc = cn_engine_generate_on(j->v->e, 0, &r, &j->res);
    return NULL;
}

static void check_join(const char *name) {
    env one, many;
    env_open(&one, name, 1);
    env_open(&many, name, 2);
    const int V = one.V;
    uint64_t rng = 0x13198a2e03707344ull;
    int32_t a[200], b[200];
    for (int i = 0; i < 200; i++) a[i] = b[i] = tu_rnd_token(&rng, V);
    for (int i = 150; i < 200; i++) b[i] = tu_rnd_token(&rng, V);
    job alone = {.v = &one, .lane = 0, .prompt = b, .n = 200};
    alone.logits = malloc((size_t)V * sizeof(float));
    job_run(&alone);
    assert_int_equal(alone.rc, 0);
    pace p = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    slow_job sj = {.v = &many, .prompt = a, .n = 200, .p = &p};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_thread, &sj), 0);
    pthread_mutex_lock(&p.mu);
    while (!p.started) pthread_cond_wait(&p.cv, &p.mu);
    pthread_mutex_unlock(&p.mu);
    job joined = {.v = &many, .lane = 1, .prompt = b, .n = 200};
    joined.logits = malloc((size_t)V * sizeof(float));
    job_run(&joined);
    pthread_join(th, NULL);
    assert_int_equal(sj.rc, 0);
    free(sj.res.tokens);
    assert_int_equal(joined.rc, 0);
    const int part = 150 - many.e->pc.lookahead; /* pair keys: key 149 names tokens 149 and 150 */
    assert_int_equal(joined.cached, part);
    assert_memory_equal(joined.out, alone.out, sizeof alone.out);
    assert_true(tu_rel_err(joined.logits, alone.logits, (size_t)V) < TOL);
    assert_true(cn_pc_check(&many.e->pc));
    free(alone.logits);
    free(joined.logits);
    env_close(&one);
    env_close(&many);
}

static void test_join_mix(void **st) { (void)st; check_join("nh-mix-f32"); }
static void test_join_mtp(void **st) { (void)st; check_join("nh-mtp-bf16"); }

static void test_lane_bounds(void **st) {
    (void)st;
    env v;
    env_open(&v, "nh-mix-f32", 2);
    int32_t t[4] = {1, 2, 3, 4};
    cn_request r = {.tokens = t, .n_tokens = 4, .max_tokens = 1};
    cn_sampler_params_default(&r.sampling);
    cn_result res;
    assert_int_equal(cn_engine_generate_on(v.e, 2, &r, &res), CN_EINVAL);
    assert_int_equal(cn_engine_generate_on(v.e, -1, &r, &res), CN_EINVAL);
    env_close(&v);
    /* a cold-run engine resets its one cache before every request: one lane only */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/nh-mix-f32", tu_data_dir());
    cn_backend *b = tu_backend(1);
    cn_model *m;
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_model_open(&m, dir, b, NULL, &err), 0);
    cn_engine_opts o = {.ctx = 64, .lanes = 2, .no_cache = 1};
    cn_engine *e = NULL;
    assert_int_equal(cn_engine_open(&e, m, &o, &err), CN_EINVAL);
    cn_model_close(m);
    cn_backend_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lanes_mix),
        cmocka_unit_test(test_lanes_window),
        cmocka_unit_test(test_lanes_mtp),
        cmocka_unit_test(test_join_mix),
        cmocka_unit_test(test_join_mtp),
        cmocka_unit_test(test_lane_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
