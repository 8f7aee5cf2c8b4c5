/* cpu_test_util.h - what the CPU kernel tests (test_cpu_ops, test_quant_ops) share: a seeded
 * generator, a CPU backend pinned to one ISA tier, and F32 activations viewed inside a padded
 * buffer whose padding holds a sentinel (so a kernel that writes outside its view is caught).
 * Include after cmocka.h. */
#ifndef CAIRN_TESTS_CPU_TEST_UTIL_H
#define CAIRN_TESTS_CPU_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>

#include "tensor/backend.h"
#include "tensor/cpu/cpu_backend.h"

#define SENTINEL 12345.0f

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float rng_unif(rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * (1.0 / 16777216.0));
}

static inline int rng_int(rng *r, int n) { return (int)(rng_next(r) % (uint64_t)n); }

/* isa: 0 = the best the CPU has, 1 = forced scalar, 2 = capped at AVX2. */
enum { ISA_BEST, ISA_SCALAR, ISA_AVX2, N_ISA };

static inline cn_backend *cpu_backend_isa(int n_threads, int isa) {
    if (isa == ISA_SCALAR) setenv("CAIRN_CPU_SCALAR", "1", 1);
    if (isa == ISA_AVX2) setenv("CAIRN_CPU_ISA", "avx2", 1);
    cn_backend *b = cn_cpu_backend_create(n_threads);
    unsetenv("CAIRN_CPU_SCALAR");
    unsetenv("CAIRN_CPU_ISA");
    assert_non_null(b);
    return b;
}

/* An F32 activation [T, C] viewed inside a buffer [T, C + pad] starting at column off. */
typedef struct view {
    cn_tensor t;
    float *buf;
    int64_t T, C, W, off;
} view;

static inline view view_make(int64_t T, int64_t C, int64_t pad) {
    view v = {.T = T, .C = C, .W = C + pad, .off = pad > 0 ? 1 : 0};
    v.buf = malloc((size_t)(T * v.W + 1) * sizeof(float));
    assert_non_null(v.buf);
    for (int64_t i = 0; i < T * v.W; i++) v.buf[i] = SENTINEL;
    cn_tensor full = cn_tensor_2d(CN_F32, T, v.W, v.buf);
    v.t = cn_tensor_cols(&full, v.off, C);
    return v;
}

#endif
