/* threadpool.c - a fixed pthread pool running one parallel loop at a time; see threadpool.h.
 *
 * Promises: no allocation after cn_pool_create; cn_pool_for returns only when every item of
 * [0, n) has been handed to fn exactly once; idle workers sleep on a condition variable (they never
 * spin, the machine may be shared). Never calls fn from two loops at once.
 *
 * Invariants:
 *  (1) `claim` packs (generation << 32 | next item). A worker claims a range only by a CAS that
 *      checks the generation, so a worker that wakes late for a finished loop can never run a range
 *      of the next loop with the old fn/ctx: its CAS fails and it goes back to waiting.
 *  (2) The caller waits for `done == n` (items finished), not for every worker to wake: a worker
 *      that the scheduler left asleep costs the loop nothing.
 *  (3) job fields (fn, ctx, n, chunk, gen) change only under `mu` while no range is in flight
 *      (the previous loop reached done == n), and workers copy them under `mu`.
 */
#include "base/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct cn_pool {
    int n_threads;      /* caller included */
    int n_started;      /* worker threads actually created (n_threads - 1 on success) */
    pthread_t *workers; /* [n_threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_start; /* a new generation (or stop) was published */
    pthread_cond_t cv_done;  /* done reached n */
    /* current job; under mu (invariant 3) */
    cn_pool_fn fn;
    void *ctx;
    int n, chunk;
    uint32_t gen;
    int stop;
    _Atomic uint64_t claim; /* invariant 1 */
    _Atomic int done;       /* items finished in the current generation */
};

/* Claims and runs ranges of generation `gen` until none is left. */
static void run_ranges(cn_pool *p, uint32_t gen, cn_pool_fn fn, void *ctx, int n, int chunk) {
    for (;;) {
        uint64_t cur = atomic_load_explicit(&p->claim, memory_order_relaxed);
        int begin;
        for (;;) {
            if ((uint32_t)(cur >> 32) != gen) return;
            begin = (int)(uint32_t)cur;
            if (begin >= n) return;
            uint64_t want = ((uint64_t)gen << 32) | (uint32_t)(begin + chunk);
            if (atomic_compare_exchange_weak_explicit(&p->claim, &cur, want, memory_order_acq_rel,
                                                      memory_order_relaxed))
                break;
        }
        int end = n - begin < chunk ? n : begin + chunk;
        fn(ctx, begin, end);
        int cnt = end - begin;
        if (atomic_fetch_add_explicit(&p->done, cnt, memory_order_acq_rel) + cnt == n) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *arg) {
    cn_pool *p = arg;
    uint32_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        cn_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        int n = p->n, chunk = p->chunk;
        pthread_mutex_unlock(&p->mu);
        run_ranges(p, seen, fn, ctx, n, chunk);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

cn_pool *cn_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    cn_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    if (pthread_mutex_init(&p->mu, NULL)) goto err_free;
    if (pthread_cond_init(&p->cv_start, NULL)) goto err_mu;
    if (pthread_cond_init(&p->cv_done, NULL)) goto err_start;
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) goto err_done;
        for (int i = 0; i < n_threads - 1; i++) {
            if (pthread_create(&p->workers[i], NULL, worker_main, p)) {
                cn_pool_free(p); /* joins the ones started */
                return NULL;
            }
            p->n_started++;
        }
    }
    return p;

err_done:
    pthread_cond_destroy(&p->cv_done);
err_start:
    pthread_cond_destroy(&p->cv_start);
err_mu:
    pthread_mutex_destroy(&p->mu);
err_free:
    free(p);
    return NULL;
}

void cn_pool_free(cn_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_start);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int cn_pool_size(const cn_pool *p) { return p ? p->n_threads : 1; }

void cn_pool_for(cn_pool *p, int n, int grain, cn_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    /* About four ranges per thread: small enough to even out threads the OS delays, large
     * enough that claiming stays rare. */
    int chunk = (int)(((int64_t)n + 4 * p->n_threads - 1) / (4 * p->n_threads));
    if (chunk < grain) chunk = grain;

    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    p->gen++;
    if (p->gen == 0) p->gen = 1; /* 0 is every worker's initial `seen` */
    uint32_t gen = p->gen;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    run_ranges(p, gen, fn, ctx, n, chunk);

    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
