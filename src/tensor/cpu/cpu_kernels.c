/* cpu_kernels.c - the dot-product kernels under matmul, matmul_gather and attention: a scalar
 * reference, AVX2+FMA+F16C and AVX-512, each for F32, BF16, F16 and F8_E4M3 weight rows.
 *
 * Promises: every ISA's tables are built from plain C plus per-function target attributes, so the
 * file compiles without -march and only code the CPU supports is ever called (cpu_backend.c picks
 * the table at run time). Weight values are decoded exactly (bf16/f16/e4m3 -> f32 is lossless), so
 * SIMD and scalar differ only by the order of the fp32 additions.
 *
 * Decode (one x row) is a stream of weight bytes: the AVX-512 one-row tile runs 4 weight rows side
 * by side (4 independent accumulators; 8 until 16 open streams on two cores proved slower, see
 * a5_stream). Those rows are B rows apart when the range holds 4 * B of them: each accumulator
 * walks B consecutive rows, so the tile reads long runs of memory
 * rather than short rows that restart the hardware prefetchers every tile (cpu_matmul.c gives
 * one-row matmuls ranges of hundreds of rows), and each run is prefetched a line at a time 1 KiB
 * ahead, past the row's end into the run's next row. Measured on this machine (lm_head-shaped
 * 131072 x 2688 BF16, one thread, GB of weights per CPU-second, loaded machine): 14 with 8 rows
 * side by side and no prefetch, 21 prefetching within the row, 23 (median of 8; 20.4 before,
 * alternating) with the runs, against 25-30 for the bench's streaming-read probe on one thread.
 *
 * Invariants:
 *  (1) Inside one ISA, mm_tile computes an output with one vector accumulator walking k upward,
 *      then a fixed horizontal sum, then the scalar tail k >= K - K % lanes in order, then * scale.
 *      Tile shape (R rows, NR weight rows, how far apart those rows lie) changes only how many
 *      outputs run side by side, never that order, so results are identical for any grouping of
 *      rows or threads. AVX-512's BF16 prefill panel (mm_rows) cuts k into chunks and keeps the
 *      accumulators in memory between them: the same additions in the same order.
 *  (2) E4M3 in SIMD is a bit move, exact: AVX2 goes through f16 bits (sign << 8 | (code & 0x7f) << 7
 *      is the f16 of value/256, exponent bias 15 vs 7, subnormals included); AVX-512 goes straight
 *      to fp32 bits (cpu_a5_e4m3_x2m120, value * 2^-120, 3 instructions per 16 against 6). NaN
 *      codes (0x7f, 0xff) are not preserved, weights never hold them. The scalar path and tails
 *      use the 256-entry table.
 */
#include <stdint.h>

#include "base/fp.h"
#include "tensor/cpu/cpu_impl.h"

/* ---------------------------------------------------------------- scalar */

static inline __attribute__((always_inline)) float sc_load(int dt, const char *row, int64_t k,
                                                           const float *lut) {
    switch (dt) {
    case CN_BF16: return cn_bf16_to_f32(((const uint16_t *)row)[k]);
    case CN_F16: return cn_f16_to_f32(((const uint16_t *)row)[k]);
    case CN_F8_E4M3: return lut[((const uint8_t *)row)[k]];
    default: return ((const float *)row)[k];
    }
}

float cpu_wvalue(const cpu_wmat *w, const char *row, int64_t k) {
    return sc_load(w->dtype, row, k, w->lut);
}

/* Outputs (r < R, n + j for j < NR): each weight value decoded once per k and used for all R rows;
 * R * NR independent sums keep the FPU busy. One sum per output, k upward (invariant 1). */
static inline __attribute__((always_inline)) void sc_block(int dt, int R, int NR,
                                                           const cpu_wmat *w,
                                                           const float *const *xr,
                                                           float *const *yr, int64_t n) {
    const char *wr[4];
    float acc[CPU_MM_ROWS][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wr[j] = w->data + (n + j) * w->stride;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r][j] = 0.0f;
    for (int64_t k = 0; k < w->K; k++) {
        float wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = sc_load(dt, wr[j], k, w->lut);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float xv = xr[r][k];
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[r][j] += wv[j] * xv;
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) yr[r][n + j] = acc[r][j] * w->scale;
}

static inline __attribute__((always_inline)) void sc_tile_dt(int dt, const cpu_wmat *w,
                                                             const float *const *xr,
                                                             float *const *yr, int R, int64_t n0,
                                                             int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 2 <= n1; n += 2) sc_block(dt, 4, 2, w, xr, yr, n);
        break;
    case 3:
        for (; n + 2 <= n1; n += 2) sc_block(dt, 3, 2, w, xr, yr, n);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) sc_block(dt, 2, 4, w, xr, yr, n);
        break;
    default:
        for (; n + 4 <= n1; n += 4) sc_block(dt, 1, 4, w, xr, yr, n);
        break;
    }
    for (; n < n1; n++) sc_block(dt, R, 1, w, xr, yr, n);
}

static void sc_tile(const cpu_wmat *w, const float *const *xr, float *const *yr, int R, int64_t n0,
                    int64_t n1) {
    switch (w->dtype) {
    case CN_BF16: sc_tile_dt(CN_BF16, w, xr, yr, R, n0, n1); break;
    case CN_F16: sc_tile_dt(CN_F16, w, xr, yr, R, n0, n1); break;
    case CN_F8_E4M3: sc_tile_dt(CN_F8_E4M3, w, xr, yr, R, n0, n1); break;
    default: sc_tile_dt(CN_F32, w, xr, yr, R, n0, n1); break;
    }
}

static float sc_dot(const cpu_wmat *w, const char *row, const float *x) {
    float acc = 0;
    for (int64_t k = 0; k < w->K; k++) acc += sc_load(w->dtype, row, k, w->lut) * x[k];
    return acc * w->scale;
}

static void sc_axpy(const cpu_wmat *w, float a, const char *row, float *y) {
    a *= w->scale;
    for (int64_t k = 0; k < w->K; k++) y[k] += a * sc_load(w->dtype, row, k, w->lut);
}

static float sc_ssm_row(float *s, const float *B, const float *C, float dA, float dx, int64_t N) {
    float acc = 0;
    for (int64_t n = 0; n < N; n++) {
        s[n] = s[n] * dA + dx * B[n];
        acc += s[n] * C[n];
    }
    return acc;
}

void cpu_kernels_scalar(cpu_kernels *k) {
    k->mm_tile = sc_tile;
    k->dot_w = sc_dot;
    k->axpy_w = sc_axpy;
    k->ssm_row = sc_ssm_row;
    k->att_heads = NULL;
    k->att_block = cpu_att_block_scalar;
    k->att_block_lanes = CPU_ATT_LANES;
    k->mm_rows = NULL;
    k->silu = cpu_silu_scalar;
    cpu_quant_kernels_scalar(k);
}

/* ---------------------------------------------------------------- AVX2 + FMA + F16C */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define A2_FN __attribute__((target("avx2,fma,f16c")))
#define A2_IN static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* 8 weights from k on, as f32. */
A2_IN __m256 a2_load(int dt, const char *row, int64_t k) {
    switch (dt) {
    case CN_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case CN_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * k)));
    case CN_F8_E4M3: { /* invariant 2 */
        __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + k)));
        __m128i s = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8);
        __m128i m = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7f)), 7);
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(s, m)), _mm256_set1_ps(256.0f));
    }
    default: return _mm256_loadu_ps((const float *)row + k);
    }
}

A2_IN float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Outputs (r < R, n + j for j < NR); R and NR are constants after inlining, so acc stays in
 * registers (R * NR <= 8 leaves room for the loads among AVX2's 16). */
A2_IN void a2_block(int dt, int R, int NR, const cpu_wmat *w, const float *const *xr,
                    float *const *yr, int64_t n) {
    const int64_t K = w->K, K8 = K & ~(int64_t)7;
    const char *wr[4];
    __m256 acc[CPU_MM_ROWS][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wr[j] = w->data + (n + j) * w->stride;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = a2_load(dt, wr[j], k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(xr[r] + k);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[r][j] = _mm256_fmadd_ps(wv[j], xv, acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) {
            float s = a2_hsum(acc[r][j]);
            for (int64_t k = K8; k < K; k++) s += sc_load(dt, wr[j], k, w->lut) * xr[r][k];
            yr[r][n + j] = s * w->scale;
        }
}

A2_IN void a2_tile_dt(int dt, const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                      int64_t n0, int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 2 <= n1; n += 2) a2_block(dt, 4, 2, w, xr, yr, n);
        for (; n < n1; n++) a2_block(dt, 4, 1, w, xr, yr, n);
        break;
    case 3:
        for (; n + 2 <= n1; n += 2) a2_block(dt, 3, 2, w, xr, yr, n);
        for (; n < n1; n++) a2_block(dt, 3, 1, w, xr, yr, n);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) a2_block(dt, 2, 4, w, xr, yr, n);
        for (; n < n1; n++) a2_block(dt, 2, 1, w, xr, yr, n);
        break;
    default:
        for (; n + 4 <= n1; n += 4) a2_block(dt, 1, 4, w, xr, yr, n);
        for (; n < n1; n++) a2_block(dt, 1, 1, w, xr, yr, n);
        break;
    }
}

A2_FN static void a2_tile_f32(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    a2_tile_dt(CN_F32, w, xr, yr, R, n0, n1);
}
A2_FN static void a2_tile_bf16(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                               int64_t n0, int64_t n1) {
    a2_tile_dt(CN_BF16, w, xr, yr, R, n0, n1);
}
A2_FN static void a2_tile_f16(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    a2_tile_dt(CN_F16, w, xr, yr, R, n0, n1);
}
A2_FN static void a2_tile_f8(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                             int64_t n0, int64_t n1) {
    a2_tile_dt(CN_F8_E4M3, w, xr, yr, R, n0, n1);
}

static void a2_tile(const cpu_wmat *w, const float *const *xr, float *const *yr, int R, int64_t n0,
                    int64_t n1) {
    switch (w->dtype) {
    case CN_BF16: a2_tile_bf16(w, xr, yr, R, n0, n1); break;
    case CN_F16: a2_tile_f16(w, xr, yr, R, n0, n1); break;
    case CN_F8_E4M3: a2_tile_f8(w, xr, yr, R, n0, n1); break;
    default: a2_tile_f32(w, xr, yr, R, n0, n1); break;
    }
}

/* Two accumulators: attention rows are short (head_dim), so latency matters more than order. */
A2_IN float a2_dot_dt(int dt, const cpu_wmat *w, const char *row, const float *x) {
    const int64_t K = w->K;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        a0 = _mm256_fmadd_ps(a2_load(dt, row, k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(a2_load(dt, row, k + 8), _mm256_loadu_ps(x + k + 8), a1);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(a2_load(dt, row, k), _mm256_loadu_ps(x + k), a0);
    float s = a2_hsum(_mm256_add_ps(a0, a1));
    for (; k < K; k++) s += sc_load(dt, row, k, w->lut) * x[k];
    return s * w->scale;
}

A2_IN void a2_axpy_dt(int dt, const cpu_wmat *w, float a, const char *row, float *y) {
    const int64_t K = w->K;
    a *= w->scale;
    __m256 av = _mm256_set1_ps(a);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        _mm256_storeu_ps(y + k, _mm256_fmadd_ps(av, a2_load(dt, row, k), _mm256_loadu_ps(y + k)));
    for (; k < K; k++) y[k] += a * sc_load(dt, row, k, w->lut);
}

A2_FN static float a2_dot(const cpu_wmat *w, const char *row, const float *x) {
    switch (w->dtype) {
    case CN_BF16: return a2_dot_dt(CN_BF16, w, row, x);
    case CN_F16: return a2_dot_dt(CN_F16, w, row, x);
    case CN_F8_E4M3: return a2_dot_dt(CN_F8_E4M3, w, row, x);
    default: return a2_dot_dt(CN_F32, w, row, x);
    }
}

A2_FN static void a2_axpy(const cpu_wmat *w, float a, const char *row, float *y) {
    switch (w->dtype) {
    case CN_BF16: a2_axpy_dt(CN_BF16, w, a, row, y); break;
    case CN_F16: a2_axpy_dt(CN_F16, w, a, row, y); break;
    case CN_F8_E4M3: a2_axpy_dt(CN_F8_E4M3, w, a, row, y); break;
    default: a2_axpy_dt(CN_F32, w, a, row, y); break;
    }
}

A2_FN static float a2_ssm_row(float *s, const float *B, const float *C, float dA, float dx,
                              int64_t N) {
    const __m256 va = _mm256_set1_ps(dA), vx = _mm256_set1_ps(dx);
    __m256 acc = _mm256_setzero_ps();
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) {
        __m256 sv = _mm256_fmadd_ps(_mm256_loadu_ps(s + n), va,
                                    _mm256_mul_ps(vx, _mm256_loadu_ps(B + n)));
        _mm256_storeu_ps(s + n, sv);
        acc = _mm256_fmadd_ps(sv, _mm256_loadu_ps(C + n), acc);
    }
    float r = a2_hsum(acc);
    for (; n < N; n++) {
        s[n] = s[n] * dA + dx * B[n];
        r += s[n] * C[n];
    }
    return r;
}

void cpu_kernels_avx2(cpu_kernels *k) {
    k->mm_tile = a2_tile;
    k->dot_w = a2_dot;
    k->axpy_w = a2_axpy;
    k->ssm_row = a2_ssm_row;
    k->att_heads = NULL;
    k->att_block = cpu_att_block_avx2;
    k->att_block_lanes = CPU_ATT_LANES;
    k->mm_rows = NULL;
    k->silu = cpu_silu_scalar;
    cpu_quant_kernels_avx2(k);
}

/* ---------------------------------------------------------------- AVX-512F/BW */

#define A5_FN __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define A5_IN static inline __attribute__((always_inline, target("avx512f,avx512bw,avx2,fma,f16c")))

/* 16 weights from k on, as f32. */
A5_IN __m512 a5_load(int dt, const char *row, int64_t k) {
    switch (dt) {
    case CN_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * k));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case CN_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * k)));
    case CN_F8_E4M3: /* invariant 2 */
        return _mm512_mul_ps(cpu_a5_e4m3_x2m120((const uint8_t *)row + k),
                             _mm512_set1_ps(0x1p120f));
    default: return _mm512_loadu_ps((const float *)row + k);
    }
}

/* A fixed pairwise order (not _mm512_reduce_add_ps, whose order is the compiler's choice). */
A5_IN float a5_hsum(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* a5_hsum of 8 vectors at once, in lanes 0..7: the same additions in the same order (lanes i and
 * i + 8, then i and i + 4, then 0 and 2 / 1 and 3, then those two), so every output is bit-identical
 * to a5_hsum's; transposed, 8 sums take 12 shuffles and 7 adds instead of 8 x 7 serial ops, which
 * at K = 256 (16 steps per output) was a fifth of a block's instructions. */
A5_IN __m256 a5_hsum8(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6,
                      __m512 a7) {
    /* h = lanes 0..7 + lanes 8..15 of each: [h0 | h1], [h2 | h3], ... (8 lanes each) */
    __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee));
    __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
    __m512 h45 = _mm512_add_ps(_mm512_shuffle_f32x4(a4, a5, 0x44), _mm512_shuffle_f32x4(a4, a5, 0xee));
    __m512 h67 = _mm512_add_ps(_mm512_shuffle_f32x4(a6, a7, 0x44), _mm512_shuffle_f32x4(a6, a7, 0xee));
    /* s = h lanes 0..3 + h lanes 4..7: [s0 | s1 | s2 | s3] (4 lanes each) */
    __m512 s03 = _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, 0x88), _mm512_shuffle_f32x4(h01, h23, 0xdd));
    __m512 s47 = _mm512_add_ps(_mm512_shuffle_f32x4(h45, h67, 0x88), _mm512_shuffle_f32x4(h45, h67, 0xdd));
    /* t = s0 + s2, s1 + s3: 128-bit lane q holds [t_q.0, t_q.1, t_(q+4).0, t_(q+4).1] */
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(s03, s47, 0x44), _mm512_shuffle_ps(s03, s47, 0xee));
    /* r = t.0 + t.1, in lanes 4q (sum q) and 4q + 2 (sum q + 4) */
    __m512 r = _mm512_add_ps(t, _mm512_movehdup_ps(t));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, r));
}

/* As a2_block with 16 lanes; 32 registers allow R * NR up to 16. The NR weight rows are n,
 * n + step, ..., n + (NR - 1) * step (outputs likewise). */
A5_IN void a5_block(int dt, int R, int NR, const cpu_wmat *w, const float *const *xr,
                    float *const *yr, int64_t n, int64_t step) {
    const int64_t K = w->K, K16 = K & ~(int64_t)15;
    const int64_t esz = dt == CN_F32 ? 4 : dt == CN_F8_E4M3 ? 1 : 2;
    const char *wr[8];
    __m512 acc[CPU_MM_ROWS][8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) wr[j] = w->data + (n + j * step) * w->stride;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K16; k += 16) {
        __m512 wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            /* a line at a time; for R = 1 the next bytes of the stream run on into the row
             * that follows in memory, which is this stream's next row */
            if ((R <= 2 || step != 1) && (k * esz) % 64 == 0) _mm_prefetch(wr[j] + k * esz + 1024, _MM_HINT_T0);
            wv[j] = a5_load(dt, wr[j], k);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(xr[r] + k);
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
        }
    }
    if (K16 == K) { /* no tail: eight sums at a time while they fill a vector, then one by one */
        const __m256 sc = _mm256_set1_ps(w->scale);
        int i = 0;
        for (; i + 8 <= R * NR; i += 8) { /* 8 columns of one row (NR 8) or 4 of two (NR 4) */
            __m256 v = a5_hsum8(acc[i / NR][i % NR], acc[(i + 1) / NR][(i + 1) % NR],
                                acc[(i + 2) / NR][(i + 2) % NR], acc[(i + 3) / NR][(i + 3) % NR],
                                acc[(i + 4) / NR][(i + 4) % NR], acc[(i + 5) / NR][(i + 5) % NR],
                                acc[(i + 6) / NR][(i + 6) % NR], acc[(i + 7) / NR][(i + 7) % NR]);
            v = _mm256_mul_ps(v, sc);
            if (step != 1) { /* streams: column j of this block is output n + j * step */
                _Alignas(32) float t[8];
                _mm256_store_ps(t, v);
                for (int jj = 0; jj < 8; jj++) yr[(i + jj) / NR][n + (i + jj) % NR * step] = t[jj];
            } else if (NR == 8) {
                _mm256_storeu_ps(yr[i / NR] + n, v);
            } else { /* NR == 4 */
                _mm_storeu_ps(yr[i / NR] + n, _mm256_castps256_ps128(v));
                _mm_storeu_ps(yr[i / NR + 1] + n, _mm256_extractf128_ps(v, 1));
            }
        }
        for (; i < R * NR; i++) yr[i / NR][n + (i % NR) * step] = a5_hsum(acc[i / NR][i % NR]) * w->scale;
        return;
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) {
            float s = a5_hsum(acc[r][j]);
            for (int64_t k = K16; k < K; k++) s += sc_load(dt, wr[j], k, w->lut) * xr[r][k];
            yr[r][n + j * step] = s * w->scale;
        }
}

/* Decode's walk (header): NR streams of B consecutive weight rows each, so that the hardware
 * prefetchers keep streaming; the R x rows (1 to 4: decode, a speculative verify) share every
 * weight load, and 32 registers hold R * NR sums. One x row takes 4 streams, not 8: with 16 open
 * streams on the 2 cores the memory gave less (a 131072 x 2688 BF16 matrix, two threads, the two
 * walks taking turns every 3 products in one process: 48.0-55.6 GB/s against 38.3-43.4, 1.24-1.28x;
 * 24.3 against 21.6 with other jobs on the cores), and 4 independent sums still cover the FMA
 * latency at memory speed. */
A5_IN void a5_stream(int dt, int R, const cpu_wmat *w, const float *const *xr, float *const *yr,
                     int64_t n0, int64_t n1) {
    const int NR = R == 2 ? 8 : 4;
    const int64_t B = (n1 - n0) / NR;
    for (int64_t r = 0; r < B; r++) a5_block(dt, R, NR, w, xr, yr, n0 + r, B);
    int64_t n = n0 + NR * B;
    for (; n + 4 <= n1; n += 4) a5_block(dt, R, 4, w, xr, yr, n, 1);
    for (; n < n1; n++) a5_block(dt, R, 1, w, xr, yr, n, 1);
}

/* Every tile walks its weight rows as streams (a5_stream): a prefill task's 16 rows as 4 or 8
 * streams of a few rows, a short matmul's task (cpu_matmul.c) as runs of hundreds. */
A5_IN void a5_tile_dt(int dt, const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                      int64_t n0, int64_t n1) {
    switch (R) {
    case 4: a5_stream(dt, 4, w, xr, yr, n0, n1); break;
    case 3: a5_stream(dt, 3, w, xr, yr, n0, n1); break;
    case 2: a5_stream(dt, 2, w, xr, yr, n0, n1); break;
    default: a5_stream(dt, 1, w, xr, yr, n0, n1); break;
    }
}

/* BF16 prefill (cpu_impl.h: mm_rows): a5_block's tile grown to 6 x rows by 4 weight rows (24 sums
 * in registers), with k cut into chunks of A5_KC values. The chunk of the 6 x rows (24 KiB of fp32)
 * stays in L1 while all the task's weight rows (CPU_MM_PNB) stream past it from L2, so each weight
 * byte loaded serves 6 x rows and each x byte 64 weight rows. a5_block over the whole of K keeps
 * neither operand in L1 (4 rows of x and 4 of w at K = 2688 are 64 KiB) and widens each weight
 * for 4 rows. The sums wait in acc between chunks as whole vectors, so each lane still adds its
 * products in k order and they are finished as a5_block finishes them: its bits (invariant 1).
 * Measured on this machine (one thread, 512 x 3712 x 2688, alternating in one process): 1.09-1.16x
 * the GFLOP/s of the 4 x 4 a5_block walk. */
#define A5_KC 1024
#define A5_PR 6 /* x rows of the panel's tile */

/* The next task's weight block, fetched into L2 a line per step of a5_chunk (cpu_impl.h: mm_rows'
 * pf). A task's first 6-row tile reads its 64 weight rows from memory, the later ones from L2:
 * alone the first ran at about a third of the FMA peak (one core pulls ~11 GB/s through 4 short
 * row streams), so an expert of 12 rows (2 tiles) ran at 95 GFLOP/s per CPU second, 133-135 with
 * the next block fetched during the current one (one thread, 1856 x 2688 experts). */
typedef struct a5_pf {
    const char *p, *end;    /* the next task's weight block, from p on */
    const char *xp, *xe;    /* the x row being fetched, from xp on */
    const float *const *xr; /* the next tile's x rows still to fetch, xn of them */
    int xn;
    int64_t xbytes; /* bytes of an x row */
} a5_pf;

/* The x rows of the next tile, fetched into L2 a line per step of a5_chunk alongside the weights
 * (mm_rows' fetch_x). A tile's first pass over each k chunk read its 6 x rows (24 KiB) from L3
 * while 4 weight rows streamed from L2; fetched during the tile before, they wait in L2. One
 * thread, a dense 1024 x 10304 x 2688 product alternating in one process: 163.8 -> 171.8 GFLOP/s
 * (two threads 308 -> 331); gathered experts lost 1-1.5% (their x rows, up to 96 of them, and the
 * next weight block already crowd L2), so only the dense product asks for it. */
A5_IN void a5_pf_next_x(a5_pf *pf) {
    if (pf->xp < pf->xe || pf->xn == 0) return;
    pf->xp = (const char *)pf->xr[0];
    pf->xe = pf->xp + pf->xbytes;
    pf->xr++;
    pf->xn--;
}

/* acc[r * CPU_MM_PNB + j] += the chunk [k0, k1) of weight row n + j against x row r, r < R,
 * j < NR (the first chunk, k0 == 0, starts from zero instead). */
A5_IN void a5_chunk(int dt, int R, int NR, const cpu_wmat *w, const float *const *xr, __m512 *acc,
                    int64_t n, int64_t k0, int64_t k1, a5_pf *pf) {
    const char *pp = pf->p, *pe = pf->end, *xp = pf->xp, *xe = pf->xe;
    const char *wr[4];
    __m512 a[A5_PR][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wr[j] = w->data + (n + j) * w->stride;
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) a[r][j] = k0 ? acc[r * CPU_MM_PNB + j] : _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 16) {
        __m512 wv[4];
        if (pp < pe) {
            _mm_prefetch(pp, _MM_HINT_T1);
            pp += 64;
        }
        if (xp < xe) {
            _mm_prefetch(xp, _MM_HINT_T1);
            xp += 64;
        }
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = a5_load(dt, wr[j], k);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(xr[r] + k);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) a[r][j] = _mm512_fmadd_ps(wv[j], xv, a[r][j]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r * CPU_MM_PNB + j] = a[r][j];
    pf->p = pp;
    pf->xp = xp;
    a5_pf_next_x(pf);
}

/* R (1..A5_PR) x rows against weight rows [n0, n1) (at most CPU_MM_PNB), chunk by chunk, then the
 * sums finished as a5_block's: transposed eight at a time when K has no tail, else one by one with
 * the tail added in k order; then * scale. acc: scratch of A5_PR * CPU_MM_PNB vectors. */
A5_IN void a5_panel(int dt, int R, const cpu_wmat *w, const float *const *xr, float *const *yr,
                    int64_t n0, int64_t n1, __m512 *acc, a5_pf *pf) {
    const int64_t K = w->K, K16 = K & ~(int64_t)15, nn = n1 - n0;
    if (K16 == 0)
        for (int r = 0; r < R; r++)
            for (int64_t j = 0; j < nn; j++) acc[r * CPU_MM_PNB + j] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K16; k0 += A5_KC) {
        const int64_t k1 = k0 + A5_KC < K16 ? k0 + A5_KC : K16;
        int64_t j = 0;
        for (; j + 4 <= nn; j += 4) a5_chunk(dt, R, 4, w, xr, acc + j, n0 + j, k0, k1, pf);
        for (; j < nn; j++) a5_chunk(dt, R, 1, w, xr, acc + j, n0 + j, k0, k1, pf);
    }
    const __m256 sc = _mm256_set1_ps(w->scale);
    for (int r = 0; r < R; r++) {
        const __m512 *a = acc + r * CPU_MM_PNB;
        int64_t j = 0;
        if (K16 == K)
            for (; j + 8 <= nn; j += 8)
                _mm256_storeu_ps(yr[r] + n0 + j,
                                 _mm256_mul_ps(a5_hsum8(a[j], a[j + 1], a[j + 2], a[j + 3], a[j + 4],
                                                        a[j + 5], a[j + 6], a[j + 7]),
                                               sc));
        for (; j < nn; j++) {
            float s = a5_hsum(a[j]);
            const char *row = w->data + (n0 + j) * w->stride;
            for (int64_t k = K16; k < K; k++) s += sc_load(dt, row, k, w->lut) * xr[r][k];
            yr[r][n0 + j] = s * w->scale;
        }
    }
}

A5_FN static void a5_rows_bf16(const cpu_wmat *w, const float *const *xr, float *const *yr, int T,
                               int64_t n0, int64_t n1, const char *pf, int64_t pf_bytes,
                               int fetch_x) {
    __m512 acc[A5_PR * CPU_MM_PNB];
    a5_pf f = {pf, pf ? pf + pf_bytes : NULL, NULL, NULL, NULL, 0, w->K * (int64_t)sizeof(float)};
    for (int t = 0; t < T; t += A5_PR) {
        if (fetch_x && t + A5_PR < T) { /* the next tile's rows */
            f.xr = xr + t + A5_PR;
            f.xn = T - t - A5_PR < A5_PR ? T - t - A5_PR : A5_PR;
            f.xp = f.xe = NULL;
            a5_pf_next_x(&f);
        }
        switch (T - t) { /* constant R, so that a5_chunk's sums stay in registers */
        case 1: a5_panel(CN_BF16, 1, w, xr + t, yr + t, n0, n1, acc, &f); break;
        case 2: a5_panel(CN_BF16, 2, w, xr + t, yr + t, n0, n1, acc, &f); break;
        case 3: a5_panel(CN_BF16, 3, w, xr + t, yr + t, n0, n1, acc, &f); break;
        case 4: a5_panel(CN_BF16, 4, w, xr + t, yr + t, n0, n1, acc, &f); break;
        case 5: a5_panel(CN_BF16, 5, w, xr + t, yr + t, n0, n1, acc, &f); break;
        default: a5_panel(CN_BF16, A5_PR, w, xr + t, yr + t, n0, n1, acc, &f); break;
        }
    }
}

A5_FN static void a5_tile_f32(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    a5_tile_dt(CN_F32, w, xr, yr, R, n0, n1);
}
A5_FN static void a5_tile_bf16(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                               int64_t n0, int64_t n1) {
    a5_tile_dt(CN_BF16, w, xr, yr, R, n0, n1);
}
A5_FN static void a5_tile_f16(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    a5_tile_dt(CN_F16, w, xr, yr, R, n0, n1);
}
A5_FN static void a5_tile_f8(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                             int64_t n0, int64_t n1) {
    a5_tile_dt(CN_F8_E4M3, w, xr, yr, R, n0, n1);
}

static void a5_tile(const cpu_wmat *w, const float *const *xr, float *const *yr, int R, int64_t n0,
                    int64_t n1) {
    switch (w->dtype) {
    case CN_BF16: a5_tile_bf16(w, xr, yr, R, n0, n1); break;
    case CN_F16: a5_tile_f16(w, xr, yr, R, n0, n1); break;
    case CN_F8_E4M3: a5_tile_f8(w, xr, yr, R, n0, n1); break;
    default: a5_tile_f32(w, xr, yr, R, n0, n1); break;
    }
}

A5_FN static float a5_ssm_row(float *s, const float *B, const float *C, float dA, float dx,
                              int64_t N) {
    const __m512 va = _mm512_set1_ps(dA), vx = _mm512_set1_ps(dx);
    __m512 acc = _mm512_setzero_ps();
    int64_t n = 0;
    for (; n + 16 <= N; n += 16) {
        __m512 sv = _mm512_fmadd_ps(_mm512_loadu_ps(s + n), va,
                                    _mm512_mul_ps(vx, _mm512_loadu_ps(B + n)));
        _mm512_storeu_ps(s + n, sv);
        acc = _mm512_fmadd_ps(sv, _mm512_loadu_ps(C + n), acc);
    }
    float r = a5_hsum(acc);
    for (; n < N; n++) {
        s[n] = s[n] * dA + dx * B[n];
        r += s[n] * C[n];
    }
    return r;
}

A5_FN static void a5_ssm_rows8(float *s, const float *B, const float *C, float dA, const float *dx,
                               int64_t N, float *out) {
    const __m512 va = _mm512_set1_ps(dA);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t n = 0; n < N; n += 16) {
        const __m512 b = _mm512_loadu_ps(B + n), c = _mm512_loadu_ps(C + n);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) { /* a5_ssm_row's operations, row i */
            float *si = s + i * N + n;
            __m512 sv = _mm512_fmadd_ps(_mm512_loadu_ps(si), va,
                                        _mm512_mul_ps(_mm512_set1_ps(dx[i]), b));
            _mm512_storeu_ps(si, sv);
            acc[i] = _mm512_fmadd_ps(sv, c, acc[i]);
        }
    }
    _mm256_storeu_ps(out, a5_hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
}

A5_FN static void a5_ssm_rows4x4(float *s, const float *const *B, const float *const *C,
                                 const float *dA, const float *dx, int64_t N, float *out) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) acc[u][i] = _mm512_setzero_ps();
    for (int64_t n = 0; n < N; n += 16) {
        __m512 sv[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) sv[i] = _mm512_loadu_ps(s + i * N + n);
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) { /* a5_ssm_row's operations, token u */
            const __m512 b = _mm512_loadu_ps(B[u] + n), c = _mm512_loadu_ps(C[u] + n);
            const __m512 va = _mm512_set1_ps(dA[u]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                sv[i] = _mm512_fmadd_ps(sv[i], va, _mm512_mul_ps(_mm512_set1_ps(dx[4 * u + i]), b));
                acc[u][i] = _mm512_fmadd_ps(sv[i], c, acc[u][i]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(s + i * N + n, sv[i]);
    }
    _mm256_storeu_ps(out, a5_hsum8(acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1],
                                   acc[1][2], acc[1][3]));
    _mm256_storeu_ps(out + 8, a5_hsum8(acc[2][0], acc[2][1], acc[2][2], acc[2][3], acc[3][0],
                                       acc[3][1], acc[3][2], acc[3][3]));
}

void cpu_kernels_avx512(cpu_kernels *k, int vnni) {
    /* Short rows (attention's head_dim) gain little from 16 lanes: keep the AVX2 dot/axpy. */
    cpu_kernels_avx2(k);
    k->mm_tile = a5_tile;
    k->mm_rows = a5_rows_bf16;
    k->ssm_row = a5_ssm_row;
    k->ssm_rows8 = a5_ssm_rows8;
    k->ssm_rows4x4 = a5_ssm_rows4x4;
    k->att_heads = cpu_att_heads_avx512;
    k->att_block = cpu_att_block_avx512;
    k->silu = cpu_silu_avx512;
    cpu_quant_kernels_avx512(k, vnni);
}

#else /* not x86: the SIMD tables are the scalar one (cpu_backend.c never picks them anyway) */

void cpu_kernels_avx2(cpu_kernels *k) { cpu_kernels_scalar(k); }
void cpu_kernels_avx512(cpu_kernels *k, int vnni) {
    (void)vnni;
    cpu_kernels_scalar(k);
}

#endif
