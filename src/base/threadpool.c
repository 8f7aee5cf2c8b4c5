/* threadpool.c - a fixed pthread pool running one parallel loop at a time; see threadpool.h.
 *
 * Promises: no allocation after cn_pool_create; cn_pool_for returns only when every item of
 * [0, n) has been handed to fn exactly once. Never calls fn from two loops at once.
 *
 * Waiting spins briefly, then sleeps. A decode step of a small model is hundreds of loops of a few
 * microseconds each; a futex wake-up and sleep per loop costs as much as the loop itself (a third
 * of the time of a two-thread decode went into the kernel). So a worker that finished a loop, and
 * the caller waiting for the workers' last ranges, poll with a pause instruction before sleeping
 * on a condition variable. Each waiter's poll is bounded by its own budget, between
 * POOL_SPIN_MIN_NS and POOL_SPIN_MAX_NS (tens of microseconds): doubled when a poll saw what it
 * waited for, halved when it ran out. An idle pool falls asleep after one budget (the machine may
 * be shared: an idle server burns no CPU), and on an oversubscribed machine, where the thread
 * waited for is often not running at all, polls shrink to a microsecond instead of burning the
 * time slice that thread needs.
 *
 * Invariants:
 *  (1) `claim` packs (generation << 32 | next item). A worker claims a range only by a CAS that
 *      checks the generation, so a worker that wakes late for a finished loop can never run a range
 *      of the next loop with the old fn/ctx: its CAS fails and it goes back to waiting.
 *  (2) The caller waits for `done == n` (items finished), not for every worker to wake: a worker
 *      that the scheduler left asleep costs the loop nothing.
 *  (3) The job (fn, ctx, n, grain) is published as a sequence lock: the caller sets `pub` to
 *      POOL_BUSY, writes the job, then sets `pub` to the generation. A worker copies the job
 *      between two reads of `pub` and keeps the copy only if both read the same generation, so
 *      it never runs with a job mixed from two loops. The job changes only while no range is in
 *      flight (the previous loop reached done == n).
 *  (4) A worker sleeps only under mu after counting itself in `n_sleeping` and re-reading `pub`
 *      (both seq_cst); the caller reads `n_sleeping` after its seq_cst store of `pub` and then
 *      broadcasts under mu. One of the two sees the other, so no worker sleeps through a loop,
 *      and a loop whose workers all spin makes no system call.
 *  (5) The caller sleeps only with `waiting` set (seq_cst) and done < n re-read after it; the
 *      worker whose range completes the loop reads `waiting` after its seq_cst add to `done`, so
 *      one of the two sees the other (the caller never sleeps through the end, and a spinning
 *      caller is never signalled).
 */
#include "base/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define POOL_PAUSE() __asm__ __volatile__("yield")
#else
#define POOL_PAUSE() ((void)0)
#endif

/* Poll budgets: the longest is well above a decode step's gaps between loops and well below
 * anything a person or a shared machine would notice. */
#define POOL_SPIN_MAX_NS 50000
#define POOL_SPIN_MIN_NS 1000
#define POOL_SPIN_CHECK 16 /* pauses between clock reads */

#define POOL_BUSY 0xfffffffeu /* `pub` while the job is being written */
#define POOL_STOP 0xffffffffu /* `pub` once the pool is being freed */

struct cn_pool {
    int n_threads;      /* caller included */
    int n_started;      /* worker threads actually created (n_threads - 1 on success) */
    pthread_t *workers; /* [n_threads - 1] */
    uint32_t gen;       /* the caller's generation counter (callers serialize) */
    int64_t spin_ns;    /* the caller's poll budget (callers serialize) */
    pthread_mutex_t mu;      /* only for sleeping and waking */
    pthread_cond_t cv_start; /* a new generation (or stop) was published */
    pthread_cond_t cv_done;  /* done reached n */
    /* the current job (invariant 3) */
    _Atomic(cn_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int n, grain;
    _Atomic uint32_t pub;     /* generation of the job; 0 before any, POOL_BUSY, POOL_STOP */
    _Atomic int n_sleeping;   /* workers asleep or about to sleep on cv_start (invariant 4) */
    _Atomic int waiting;      /* the caller sleeps (or is about to) on cv_done (invariant 5) */
    _Atomic uint64_t claim;   /* invariant 1 */
    _Atomic int done;         /* items finished in the current generation */
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls until pred(p, arg) holds or *budget ns pass; returns whether it holds, and adapts the
 * budget (doubled on success, halved on timeout, within the bounds). */
static int spin_until(cn_pool *p, int (*pred)(cn_pool *, uint32_t), uint32_t arg, int64_t *budget) {
    int64_t t0 = now_ns();
    for (int i = 1;; i++) {
        if (pred(p, arg)) {
            *budget = *budget * 2 < POOL_SPIN_MAX_NS ? *budget * 2 : POOL_SPIN_MAX_NS;
            return 1;
        }
        POOL_PAUSE();
        if (i % POOL_SPIN_CHECK == 0 && now_ns() - t0 > *budget) {
            *budget = *budget / 2 > POOL_SPIN_MIN_NS ? *budget / 2 : POOL_SPIN_MIN_NS;
            return pred(p, arg);
        }
    }
}

/* A job other than `seen` is published (or the pool stops). */
static int fresh(cn_pool *p, uint32_t seen) {
    uint32_t g = atomic_load(&p->pub); /* seq_cst: invariant 4 */
    return g != seen && g != POOL_BUSY;
}

static int loop_done(cn_pool *p, uint32_t n) {
    return atomic_load_explicit(&p->done, memory_order_acquire) >= (int)n;
}

/* Items in a claim that starts at `begin`: a 2 n_threads-th of what is left, at least `grain`.
 * Early claims are long (few claims; a matmul's consecutive tasks share cached weights), the last
 * ones a grain each, so the threads finish within about a grain of each other. With fixed ranges
 * of n / (4 n_threads) the loop's last range ran alone: on the 2-core VM the worker sat idle
 * 9-11% of a BF16 prefill's matmul time (2048-token bench, one busy clock per thread). */
static int claim_size(int n_threads, int n, int begin, int grain) {
    int size = (n - begin) / (2 * n_threads);
    return size > grain ? size : grain;
}

/* Claims and runs ranges of generation `gen` until none is left. */
static void run_ranges(cn_pool *p, uint32_t gen, cn_pool_fn fn, void *ctx, int n, int grain) {
    for (;;) {
        uint64_t cur = atomic_load_explicit(&p->claim, memory_order_relaxed);
        int begin, chunk;
        for (;;) {
            if ((uint32_t)(cur >> 32) != gen) return;
            begin = (int)(uint32_t)cur;
            if (begin >= n) return;
            chunk = claim_size(p->n_threads, n, begin, grain);
            uint64_t want = ((uint64_t)gen << 32) | (uint32_t)(begin + chunk);
            if (atomic_compare_exchange_weak_explicit(&p->claim, &cur, want, memory_order_acq_rel,
                                                      memory_order_relaxed))
                break;
        }
        int end = n - begin < chunk ? n : begin + chunk;
        fn(ctx, begin, end);
        int cnt = end - begin;
        /* seq_cst, then `waiting`: invariant 5 */
        if (atomic_fetch_add(&p->done, cnt) + cnt == n && atomic_load(&p->waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *arg) {
    cn_pool *p = arg;
    uint32_t seen = 0;
    int64_t budget = POOL_SPIN_MAX_NS;
    for (;;) {
        if (!spin_until(p, fresh, seen, &budget)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1); /* seq_cst, then `pub`: invariant 4 */
            while (!fresh(p, seen)) pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        uint32_t g = atomic_load_explicit(&p->pub, memory_order_acquire);
        if (g == POOL_STOP) break;
        if (g == POOL_BUSY || g == seen) continue;
        cn_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        int n = atomic_load_explicit(&p->n, memory_order_relaxed);
        int grain = atomic_load_explicit(&p->grain, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->pub, memory_order_relaxed) != g) continue; /* invariant 3 */
        seen = g;
        run_ranges(p, g, fn, ctx, n, grain);
    }
    return NULL;
}

cn_pool *cn_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    cn_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    p->spin_ns = POOL_SPIN_MAX_NS;
    if (pthread_mutex_init(&p->mu, NULL)) goto err_free;
    if (pthread_cond_init(&p->cv_start, NULL)) goto err_mu;
    if (pthread_cond_init(&p->cv_done, NULL)) goto err_start;
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->n, 0);
    atomic_init(&p->grain, 1);
    atomic_init(&p->pub, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->waiting, 0);
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
    atomic_store(&p->pub, POOL_STOP);
    pthread_mutex_lock(&p->mu); /* a worker checks `pub` under mu before sleeping */
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
    if (++p->gen >= POOL_BUSY) p->gen = 1; /* 0: every worker's initial `seen` */
    uint32_t gen = p->gen;
    atomic_store_explicit(&p->pub, POOL_BUSY, memory_order_relaxed); /* invariant 3 */
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n, n, memory_order_relaxed);
    atomic_store_explicit(&p->grain, grain, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32, memory_order_relaxed);
    atomic_store(&p->pub, gen); /* seq_cst, then `n_sleeping`: invariant 4 */
    if (atomic_load(&p->n_sleeping)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }

    run_ranges(p, gen, fn, ctx, n, grain);

    if (spin_until(p, loop_done, (uint32_t)n, &p->spin_ns)) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->waiting, 1); /* seq_cst, then `done`: invariant 5 */
    while (atomic_load(&p->done) < n) pthread_cond_wait(&p->cv_done, &p->mu);
    atomic_store_explicit(&p->waiting, 0, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
}
