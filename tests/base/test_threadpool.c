/* test_threadpool.c - cn_pool_for hands every item to fn exactly once, for any pool size, grain
 * and n, across many back-to-back loops (the case where a late worker could touch the next loop),
 * and across the pool's waits: loops published to workers that stopped spinning and fell asleep,
 * loops whose ranges outlast the caller's spin (it sleeps and must be woken), and a pool freed
 * while its workers sleep or spin. A lost wake-up hangs: an alarm turns a hang into a failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/threadpool.h"

typedef struct count_ctx {
    _Atomic int *hits; /* [n] */
    _Atomic int calls;
    int n;
    int bad_range; /* set if a range was empty or out of [0, n) */
} count_ctx;

static void count_fn(void *arg, int begin, int end) {
    count_ctx *c = arg;
    if (begin >= end || begin < 0 || end > c->n) c->bad_range = 1;
    for (int i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->calls, 1);
}

/* Runs one loop and checks every item was hit exactly once; returns the number of fn calls. */
static int run_and_check(cn_pool *p, int n, int grain) {
    count_ctx c = {.n = n};
    c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
    assert_non_null(c.hits);
    atomic_init(&c.calls, 0);
    cn_pool_for(p, n, grain, count_fn, &c);
    for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&c.hits[i]), 1);
    assert_int_equal(c.bad_range, 0);
    free(c.hits);
    return atomic_load(&c.calls);
}

static void test_null_and_single_pool_run_inline(void **state) {
    (void)state;
    assert_int_equal(run_and_check(NULL, 10, 1), 1);
    assert_int_equal(cn_pool_size(NULL), 1);
    cn_pool *p = cn_pool_create(1);
    assert_non_null(p);
    assert_int_equal(cn_pool_size(p), 1);
    assert_int_equal(run_and_check(p, 17, 1), 1);
    cn_pool_free(p);
    cn_pool_free(NULL);
}

static void test_every_item_once(void **state) {
    (void)state;
    for (int nt = 2; nt <= 5; nt++) {
        cn_pool *p = cn_pool_create(nt);
        assert_non_null(p);
        assert_int_equal(cn_pool_size(p), nt);
        int sizes[] = {0, 1, 2, 3, 7, 64, 1000, 4097};
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            run_and_check(p, sizes[s], 1);
            run_and_check(p, sizes[s], 5);
        }
        cn_pool_free(p);
    }
}

static void test_grain_larger_than_n_is_one_call(void **state) {
    (void)state;
    cn_pool *p = cn_pool_create(3);
    assert_non_null(p);
    assert_int_equal(run_and_check(p, 10, 10), 1);
    assert_int_equal(run_and_check(p, 10, 100), 1);
    cn_pool_free(p);
}

typedef struct sum_ctx {
    const int *v;
    _Atomic long long sum;
} sum_ctx;

static void sum_fn(void *arg, int begin, int end) {
    sum_ctx *c = arg;
    long long s = 0;
    for (int i = begin; i < end; i++) s += c->v[i];
    atomic_fetch_add(&c->sum, s);
}

static void test_many_back_to_back_loops(void **state) {
    (void)state;
    enum { N = 257, LOOPS = 2000 };
    int v[N];
    for (int i = 0; i < N; i++) v[i] = i * 3 + 1;
    cn_pool *p = cn_pool_create(3);
    assert_non_null(p);
    for (int l = 0; l < LOOPS; l++) {
        sum_ctx c = {.v = v};
        atomic_init(&c.sum, 0);
        int n = 1 + l % N; /* varying n: a stale worker would over- or under-count */
        long long w = 0;
        for (int i = 0; i < n; i++) w += v[i];
        cn_pool_for(p, n, 1, sum_fn, &c);
        assert_int_equal(atomic_load(&c.sum), w);
    }
    cn_pool_free(p);
}

typedef struct range_ctx {
    _Atomic int n_ranges;
    int begin[64], end[64];
} range_ctx;

static void range_fn(void *arg, int begin, int end) {
    range_ctx *c = arg;
    int i = atomic_fetch_add(&c->n_ranges, 1);
    if (i < 64) {
        c->begin[i] = begin;
        c->end[i] = end;
    }
}

/* Ranges shrink as the loop drains, so that threads finish together: none is longer than a
 * 2 n_threads-th of the items, and the range that ends the loop is one grain (a fixed range of
 * n / 8 left one thread alone on it). Which thread runs a range does not matter here. */
static void test_ranges_shrink_to_the_grain(void **state) {
    (void)state;
    for (int nt = 2; nt <= 3; nt++) {
        cn_pool *p = cn_pool_create(nt);
        assert_non_null(p);
        int grains[] = {1, 3};
        for (int g = 0; g < 2; g++) {
            range_ctx c;
            memset(&c, 0, sizeof c);
            atomic_init(&c.n_ranges, 0);
            cn_pool_for(p, 1000, grains[g], range_fn, &c);
            int nr = atomic_load(&c.n_ranges);
            assert_true(nr <= 64);
            int last = -1;
            for (int i = 0; i < nr; i++) {
                assert_true(c.end[i] - c.begin[i] <= 1000 / (2 * nt));
                if (c.end[i] == 1000) last = i;
            }
            assert_true(last >= 0);
            assert_true(c.end[last] - c.begin[last] <= grains[g]);
        }
        cn_pool_free(p);
    }
}

/* Sleeps for ms milliseconds: far longer than the pool's spin (tens of microseconds). */
static void nap(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts)) {
    }
}

static void slow_fn(void *arg, int begin, int end) {
    nap(2);
    count_fn(arg, begin, end);
}

static void test_loops_after_workers_sleep(void **state) {
    (void)state;
    for (int nt = 2; nt <= 4; nt++) {
        cn_pool *p = cn_pool_create(nt);
        assert_non_null(p);
        for (int l = 0; l < 20; l++) {
            nap(l % 2 ? 1 : 3); /* workers give up spinning and sleep */
            run_and_check(p, 64 + l, 1);
        }
        nap(3);
        cn_pool_free(p); /* frees sleeping workers */
    }
}

static void test_caller_waits_out_slow_ranges(void **state) {
    (void)state;
    cn_pool *p = cn_pool_create(3);
    assert_non_null(p);
    for (int l = 0; l < 10; l++) {
        count_ctx c = {.n = 12};
        c.hits = calloc(12, sizeof *c.hits);
        assert_non_null(c.hits);
        atomic_init(&c.calls, 0);
        cn_pool_for(p, 12, 1, slow_fn, &c); /* ranges of 2 ms: the caller sleeps, then is woken */
        for (int i = 0; i < 12; i++) assert_int_equal(atomic_load(&c.hits[i]), 1);
        assert_int_equal(c.bad_range, 0);
        free(c.hits);
        run_and_check(p, 100, 1); /* and the next loop starts from that state */
    }
    cn_pool_free(p); /* frees spinning workers */
}

int main(void) {
    alarm(120); /* a lost wake-up hangs: fail instead of waiting for ctest's timeout */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_and_single_pool_run_inline),
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_grain_larger_than_n_is_one_call),
        cmocka_unit_test(test_ranges_shrink_to_the_grain),
        cmocka_unit_test(test_many_back_to_back_loops),
        cmocka_unit_test(test_loops_after_workers_sleep),
        cmocka_unit_test(test_caller_waits_out_slow_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
