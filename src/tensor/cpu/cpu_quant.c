/* cpu_quant.c - matmul kernels for the block-scaled weight formats, NVFP4 and MXFP8: a scalar
 * reference, AVX2+FMA+F16C, and AVX-512 (with VNNI for NVFP4).
 *
 * NVFP4 (E2M1 pairs, low nibble = even column; E4M3 scale per 16; fp32 global g) runs as integer
 * dot products. Twice an E2M1 value is an integer in [-12, 12], so a 16-entry byte table (pshufb)
 * turns nibbles into int8 weights; activations are quantized per call to int8 per block of 16
 * (cpu_impl.h: the CPU_XQ layout), and each block's integer dot product is scaled by
 * e4m3(ws) * d(x) in fp32. VNNI's vpdpbusd multiplies unsigned by signed bytes, so the table holds
 * 2 * e2m1 + 12 (0..24) and the accumulator starts at the precomputed -12 * sum(q) of its lane.
 * Why this path and not a float one (nibbles -> fp32 via a vpermps table, times the block scale,
 * FMA with fp32 activations): it does 64 multiply-adds per vpdpbusd instead of 16 per FMA.
 * AVX-512 gives each int32 lane one whole block of 16: per 256 values and weight row, two dword
 * permutes (vpermt2d) gather each block's 8 packed bytes into one lane's pair of operands, a shift
 * and four vpermb (VBMI) look the nibbles up; the activations are laid out to match (cpu_impl.h:
 * CPU_XQ VNNI layout), so per (token, weight row) four vpdpbusd sum 16 blocks and one convert,
 * one multiply by the 16 block scales (e4m3(ws) * d(x), already one per lane: no scale permute)
 * and one FMA finish them. With a lane of half a block (8 values), every 128 values took their
 * own convert, multiply, FMA and scale permute.
 * Measured on this machine (AMD EPYC, Zen 5, one thread, thread CPU time, weight in L2, 256 x 2688):
 * decode (T=1) 57 G weights/s before (nibbles widened to 16-bit lanes, pshufb, 4 values per lane),
 * 95 after; prefill (T=64, 1856 x 2688) 85 G multiply-adds/s before, 106-116 after (half-block
 * lanes). Whole-block lanes, T=1024 on nano shapes (one thread, thread CPU time): in_proj
 * 10304 x 2688 88-104 -> 113-123 G multiply-adds/s. The int8
 * activations cost about 0.3% relative error per dot product (max-abs per 16, round to nearest).
 *
 * MXFP8 (E4M3 with an E8M0 exponent per 32) runs in fp32. AVX2: E4M3 -> fp16 bits by two shifts
 * (the sign-extended code << 7 with bit 14 cleared is the fp16 of value / 256, subnormals
 * included), vcvtph2ps, then one multiply by 256 * 2^(e - 127) per 32. AVX-512: E4M3 -> fp32 bits
 * directly (cpu_impl.h: cpu_a5_e4m3_x2m120, value * 2^-120, half the instructions; MXFP8 decode
 * was bound by this conversion), then one vscalefps by e - 7 (exponents of 16 blocks converted at
 * once, no branch for the codes whose 2^(e - 7) overflows a float). Then an FMA with the fp32
 * activations. One thread, 2688-wide rows: 27 G weights/s in L2 (the conversion's ceiling), and
 * from DRAM 19 GB/s with decode's 8-row tiles prefetching two tiles ahead (9.5 before).
 * This is exactly the math of the dequantized weights (every step is exact but the sums).
 *
 * Invariants:
 *  (1) As in cpu_kernels.c: inside one ISA an output is one vector accumulator walking k upward,
 *      a fixed horizontal sum, then * scale, whatever the tile shape; results do not depend on the
 *      row grouping or the thread count.
 *  (2) quant_nvfp4 produces the same q and d values on every ISA; AVX-512 (with VNNI and VBMI)
 *      lays them out its own way, read only by its own mm_nvfp4.
 *  (3) Weight rows are read only within their K values (masked loads for tails); activation rows
 *      are read within their padded CPU_XQ_KPAD length.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor/cpu/cpu_impl.h"

/* 2 * e2m1 of a nibble (bit 3 the sign), signed; and + 12 for the unsigned VNNI operand. */
static const int8_t k_fp4x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#define FP4_BIAS 12

#define MXFP8_NR1 8
/* Decode tiles ahead that MXFP8 prefetches (one row of K = 2688 bytes is 42 lines): 2 streamed
 * 19 GB/s from DRAM on one core, against 16 for 1 and 9.5 for a 1 KiB offset inside the row. */
#define MXFP8_PF_TILES 2

/* ---------------------------------------------------------------- scalar */

static void sc_quant_nvfp4(const float *x, int64_t K, int8_t *xq) {
    const int64_t KP = CPU_XQ_KPAD(K);
    float *d = (float *)(xq + KP);
    int32_t *c = (int32_t *)(d + KP / 4);
    memset(xq, 0, (size_t)CPU_XQ_BYTES(K));
    for (int64_t b = 0; b < K; b += 16) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        /* a non-finite block keeps q = 0 and carries the non-finite scale into the result */
        float id = amax > 0 && amax <= FLT_MAX ? 127.0f / amax : 0.0f;
        float dv = amax / 127.0f;
        for (int i = 0; i < 16; i++) {
            float v = x[b + i] * id;
            xq[b + i] = id != 0 ? (int8_t)lrintf(v) : 0;
        }
        for (int l = 0; l < 4; l++) {
            const int8_t *q = xq + b + 4 * l;
            d[b / 4 + l] = dv;
            c[b / 4 + l] = -FP4_BIAS * (q[0] + q[1] + q[2] + q[3]);
        }
    }
}

static void sc_mm_nvfp4(const cpu_wmat *w, const int8_t *const *xq, float *const *yr, int R,
                        int64_t n0, int64_t n1) {
    const int64_t K = w->K, KP = CPU_XQ_KPAD(K);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * w->stride;
        const uint8_t *bs = w->bs + n * w->bs_stride;
        for (int r = 0; r < R; r++) {
            const int8_t *q = xq[r];
            const float *d = (const float *)(q + KP);
            float acc = 0;
            for (int64_t b = 0; b < K; b += 16) {
                int32_t s = 0;
                for (int i = 0; i < 16; i += 2) {
                    uint8_t p = row[(b + i) / 2];
                    s += k_fp4x2[p & 15] * q[b + i] + k_fp4x2[p >> 4] * q[b + i + 1];
                }
                acc += (float)s * (w->lut[bs[b / 16]] * d[b / 4]);
            }
            yr[r][n] = acc * w->scale;
        }
    }
}

static void sc_mm_mxfp8(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                        int64_t n0, int64_t n1) {
    const int64_t K = w->K;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * w->stride;
        const uint8_t *bs = w->bs + n * w->bs_stride;
        for (int r = 0; r < R; r++) {
            float acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += w->lut[row[k]] * w->lut8[bs[k / 32]] * xr[r][k];
            yr[r][n] = acc;
        }
    }
}

void cpu_quant_kernels_scalar(cpu_kernels *k) {
    k->mm_nvfp4 = sc_mm_nvfp4;
    k->quant_nvfp4 = sc_quant_nvfp4;
    k->mm_mxfp8 = sc_mm_mxfp8;
}

float cpu_wvalue_scaled(const cpu_wmat *w, int64_t n, int64_t k) {
    const uint8_t *row = (const uint8_t *)w->data + n * w->stride;
    switch (w->dtype) {
    case CN_NVFP4: {
        uint8_t p = row[k / 2];
        float e = (float)k_fp4x2[k % 2 ? p >> 4 : p & 15]; /* 2 * e2m1; w->scale = g / 2 */
        return e * w->lut[w->bs[n * w->bs_stride + k / 16]] * w->scale;
    }
    case CN_MXFP8: return w->lut[row[k]] * w->lut8[w->bs[n * w->bs_stride + k / 32]];
    default: return cpu_wvalue(w, (const char *)row, k) * w->scale;
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA + F16C */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define A2_FN __attribute__((target("avx2,fma,f16c")))
#define A2_IN static inline __attribute__((always_inline, target("avx2,fma,f16c")))

A2_IN float a2q_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 nibbles (16 packed bytes, 8 when half) -> 32 unsigned weights 2 * e2m1 + 12, in order. */
A2_IN __m256i a2_fp4_unpack(const uint8_t *p, int half) {
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    __m128i pk = half ? _mm_loadl_epi64((const __m128i *)p) : _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_cvtepu8_epi16(pk); /* byte i -> 16-bit lane 0x00HL */
    /* (v | v << 4) & 0x0f0f puts L in the low byte and H in the high byte: values 2i, 2i+1 */
    __m256i idx = _mm256_and_si256(_mm256_or_si256(v, _mm256_slli_epi16(v, 4)),
                                   _mm256_set1_epi16(0x0f0f));
    return _mm256_shuffle_epi8(lut, idx);
}

A2_IN void a2_nvfp4_block(int R, int NR, const cpu_wmat *w, const int8_t *const *xq,
                          float *const *yr, int64_t n) {
    const int64_t K = w->K, KP = CPU_XQ_KPAD(K);
    const uint8_t *wr[4], *sr[4];
    const float *xd[CPU_MM_ROWS];
    const int32_t *xc[CPU_MM_ROWS];
    __m256 acc[CPU_MM_ROWS][4];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        wr[j] = (const uint8_t *)w->data + (n + j) * w->stride;
        sr[j] = w->bs + (n + j) * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        xd[r] = (const float *)(xq[r] + KP);
        xc[r] = (const int32_t *)(xd[r] + KP / 4);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r][j] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < K; k += 32) {
        const int half = K - k < 32;
        __m256i wu[4];
        __m256 ws[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            wu[j] = a2_fp4_unpack(wr[j] + k / 2, half);
            float s0 = w->lut[sr[j][k / 16]], s1 = half ? 0.0f : w->lut[sr[j][k / 16 + 1]];
            ws[j] = _mm256_setr_m128(_mm_set1_ps(s0), _mm_set1_ps(s1));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[r] + k));
            __m256i cv = _mm256_loadu_si256((const __m256i *)(xc[r] + k / 4));
            __m256 dv = _mm256_loadu_ps(xd[r] + k / 4);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu[j], xv), ones);
                __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(p, cv));
                acc[r][j] = _mm256_fmadd_ps(f, _mm256_mul_ps(ws[j], dv), acc[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) yr[r][n + j] = a2q_hsum(acc[r][j]) * w->scale;
}

A2_FN static void a2_mm_nvfp4(const cpu_wmat *w, const int8_t *const *xq, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 2 <= n1; n += 2) a2_nvfp4_block(4, 2, w, xq, yr, n);
        for (; n < n1; n++) a2_nvfp4_block(4, 1, w, xq, yr, n);
        break;
    case 3:
        for (; n + 2 <= n1; n += 2) a2_nvfp4_block(3, 2, w, xq, yr, n);
        for (; n < n1; n++) a2_nvfp4_block(3, 1, w, xq, yr, n);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) a2_nvfp4_block(2, 4, w, xq, yr, n);
        for (; n < n1; n++) a2_nvfp4_block(2, 1, w, xq, yr, n);
        break;
    default:
        for (; n + 4 <= n1; n += 4) a2_nvfp4_block(1, 4, w, xq, yr, n);
        for (; n < n1; n++) a2_nvfp4_block(1, 1, w, xq, yr, n);
        break;
    }
}

/* 8 E4M3 codes -> fp32 value / 256 (the fp16-bits trick, see the file comment). */
A2_IN __m256 a2_e4m3_div256(const uint8_t *p) {
    __m128i v = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    v = _mm_and_si128(_mm_slli_epi16(v, 7), _mm_set1_epi16((short)0xbfff));
    return _mm256_cvtph_ps(v);
}

A2_IN void a2_mxfp8_block(int R, int NR, const cpu_wmat *w, const float *const *xr,
                          float *const *yr, int64_t n) {
    const int64_t K = w->K;
    const uint8_t *wr[4], *sr[4];
    __m256 acc[CPU_MM_ROWS][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        wr[j] = (const uint8_t *)w->data + (n + j) * w->stride;
        sr[j] = w->bs + (n + j) * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++)
            wv[j] = _mm256_mul_ps(a2_e4m3_div256(wr[j] + k),
                                  _mm256_set1_ps(256.0f * w->lut8[sr[j][k / 32]]));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(xr[r] + k);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[r][j] = _mm256_fmadd_ps(wv[j], xv, acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) yr[r][n + j] = a2q_hsum(acc[r][j]);
}

A2_FN static void a2_mm_mxfp8(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 2 <= n1; n += 2) a2_mxfp8_block(4, 2, w, xr, yr, n);
        for (; n < n1; n++) a2_mxfp8_block(4, 1, w, xr, yr, n);
        break;
    case 3:
        for (; n + 2 <= n1; n += 2) a2_mxfp8_block(3, 2, w, xr, yr, n);
        for (; n < n1; n++) a2_mxfp8_block(3, 1, w, xr, yr, n);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) a2_mxfp8_block(2, 4, w, xr, yr, n);
        for (; n < n1; n++) a2_mxfp8_block(2, 1, w, xr, yr, n);
        break;
    default:
        for (; n + 4 <= n1; n += 4) a2_mxfp8_block(1, 4, w, xr, yr, n);
        for (; n < n1; n++) a2_mxfp8_block(1, 1, w, xr, yr, n);
        break;
    }
}

void cpu_quant_kernels_avx2(cpu_kernels *k) {
    k->mm_nvfp4 = a2_mm_nvfp4;
    k->quant_nvfp4 = sc_quant_nvfp4; /* O(T K) against the matmul's O(T K N): not worth SIMD */
    k->mm_mxfp8 = a2_mm_mxfp8;
}

/* ---------------------------------------------------------------- AVX-512 (+VNNI) */

#define A5Q_ATTR "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c"
#define A5Q_FN __attribute__((target(A5Q_ATTR)))
#define A5Q_IN static inline __attribute__((always_inline, target(A5Q_ATTR)))
#define A5_ATTR "avx512f,avx512bw,avx2,fma,f16c"
#define A5_FN __attribute__((target(A5_ATTR)))
#define A5_IN static inline __attribute__((always_inline, target(A5_ATTR)))

/* A fixed pairwise order, as cpu_kernels.c's a5_hsum. */
A5_IN float a5q_hsum(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 16 E4M3 block scales of 256 values (fewer under mask sm) as fp32 / 256. */
A5Q_IN __m512 a5_scales16(const uint8_t *p, __mmask16 sm) {
    __m256i h = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(sm, p));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xbfff));
    return _mm512_cvtph_ps(h);
}

/* Most weight rows of one AVX-512 NVFP4 block; activation rows padded to whole superchunks. */
#define A5Q_NR 4
#define A5Q_KPAD(K) (((K) + 255) & ~(int64_t)255)

/* The VNNI layout of a quantized activation row (cpu_impl.h: CPU_XQ VNNI layout): per superchunk
 * of 256 values at c0, four 64-byte operands whose int32 lane l holds 4 values of block l only
 * (values c0 + 16l .. c0 + 16l + 15):
 *   x0[4l + m] = q[c0 + 16l + 2m]        x1[4l + m] = q[c0 + 16l + 2m + 1]
 *   x2[4l + m] = q[c0 + 16l + 8 + 2m]    x3[4l + m] = q[c0 + 16l + 9 + 2m]      (m < 4)
 * so that lane l of four vpdpbusd sums one whole block, and one convert, one multiply by the
 * block scales and one FMA serve 256 values (they served 128 when a lane held half a block). */

/* 256 nibbles (128 packed bytes, fewer under masks m0 and m1) -> the four unsigned weight
 * operands 2 * e2m1 + 12 that pair with x0..x3: two dword permutes gather each block's first and
 * last 4 bytes into lane l, then vpermb looks the nibbles up. vpermb reads 6 index bits, so a
 * table of the 16 entries repeated 4 times ignores the bits above the nibble: no mask, and the
 * high nibbles need only a 16-bit shift. */
A5Q_IN void a5_fp4_unpack256(const uint8_t *p, __mmask64 m0, __mmask64 m1, __m512i *wv) {
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i v0 = m0 == ~(__mmask64)0 ? _mm512_loadu_si512((const void *)p)
                                           : _mm512_maskz_loadu_epi8(m0, p);
    const __m512i v1 = m1 == ~(__mmask64)0 ? _mm512_loadu_si512((const void *)(p + 64))
                                           : _mm512_maskz_loadu_epi8(m1, p + 64);
    const __m512i a = _mm512_permutex2var_epi32(v0, ie, v1); /* bytes 0..3 of each block */
    const __m512i b = _mm512_permutex2var_epi32(v0, io, v1); /* bytes 4..7 */
    wv[0] = _mm512_permutexvar_epi8(a, lut);
    wv[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(a, 4), lut);
    wv[2] = _mm512_permutexvar_epi8(b, lut);
    wv[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(b, 4), lut);
}

/* One superchunk at k of an R x NR block: lane l of the accumulators gets block k / 16 + l.
 * m0, m1 mask the weight bytes and sm the block scales of a short last superchunk; activations
 * are read whole (padded with zeros, and c = d = 0 there). */
A5Q_IN void a5_nvfp4_super(int R, int NR, const uint8_t *const *wr, const uint8_t *const *sr,
                           const int8_t *const *xq, const float *const *xd,
                           const int32_t *const *xc, __m512 (*acc)[A5Q_NR], int64_t k,
                           __mmask64 m0, __mmask64 m1, __mmask16 sm, int64_t pf) {
    __m512i wv[A5Q_NR][4];
    __m512 sf[A5Q_NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        if (pf) {
            _mm_prefetch((const char *)wr[j] + k / 2 + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)wr[j] + k / 2 + 64 + pf, _MM_HINT_T0);
        }
        a5_fp4_unpack256(wr[j] + k / 2, m0, m1, wv[j]);
        sf[j] = a5_scales16(sr[j] + k / 16, sm);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const int8_t *x = xq[r] + k;
        const __m512i x0 = _mm512_loadu_si512((const void *)x);
        const __m512i x1 = _mm512_loadu_si512((const void *)(x + 64));
        const __m512i x2 = _mm512_loadu_si512((const void *)(x + 128));
        const __m512i x3 = _mm512_loadu_si512((const void *)(x + 192));
        const __m512 dv = _mm512_loadu_ps(xd[r] + k / 16);
        const __m512i cv = _mm512_loadu_si512((const void *)(xc[r] + k / 16));
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            __m512i i = _mm512_dpbusd_epi32(cv, wv[j][0], x0);
            i = _mm512_dpbusd_epi32(i, wv[j][1], x1);
            i = _mm512_dpbusd_epi32(i, wv[j][2], x2);
            i = _mm512_dpbusd_epi32(i, wv[j][3], x3);
            acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(sf[j], dv), acc[r][j]);
        }
    }
}

/* Full 256-value superchunks run unmasked; the row's tail (K % 256) is masked. The NR weight rows
 * are n, n + step, ..., n + (NR - 1) step (outputs likewise). */
A5Q_IN void a5_nvfp4_block(int R, int NR, const cpu_wmat *w, const int8_t *const *xq,
                           float *const *yr, int64_t n, int64_t step) {
    const int64_t K = w->K, KV = A5Q_KPAD(K), K256 = K & ~(int64_t)255;
    /* decode prefetches the same offset of the next block's rows: the next row of each stream,
     * or past the tile when its rows lie back to back (an offset within the row would land in
     * rows being read already) */
    const int64_t pf = R == 1 ? (step == 1 ? NR : 1) * w->stride : 0;
    const uint8_t *wr[A5Q_NR], *sr[A5Q_NR];
    const float *xd[CPU_MM_ROWS];
    const int32_t *xc[CPU_MM_ROWS];
    __m512 acc[CPU_MM_ROWS][A5Q_NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        wr[j] = (const uint8_t *)w->data + (n + j * step) * w->stride;
        sr[j] = w->bs + (n + j * step) * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        xd[r] = (const float *)(xq[r] + KV);
        xc[r] = (const int32_t *)(xd[r] + KV / 16);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r][j] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K256; k += 256)
        a5_nvfp4_super(R, NR, wr, sr, xq, xd, xc, acc, k, ~(__mmask64)0, ~(__mmask64)0,
                       (__mmask16)0xffff, pf);
    if (K256 < K) {
        const int64_t nb = (K - K256) / 2; /* 8..120 weight bytes left */
        const __mmask64 m0 = nb >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << nb) - 1);
        const __mmask64 m1 = nb > 64 ? (((__mmask64)1 << (nb - 64)) - 1) : 0;
        const __mmask16 sm = (__mmask16)((1u << ((K - K256) / 16)) - 1u);
        a5_nvfp4_super(R, NR, wr, sr, xq, xd, xc, acc, K256, m0, m1, sm, 0);
    }
    const float scale = w->scale * 256.0f; /* sf held e4m3 / 256 */
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) yr[r][n + j * step] = a5q_hsum(acc[r][j]) * scale;
}

A5Q_FN static void a5_mm_nvfp4(const cpu_wmat *w, const int8_t *const *xq, float *const *yr, int R,
                               int64_t n0, int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 2 <= n1; n += 2) a5_nvfp4_block(4, 2, w, xq, yr, n, 1);
        for (; n < n1; n++) a5_nvfp4_block(4, 1, w, xq, yr, n, 1);
        break;
    case 3:
        for (; n + 2 <= n1; n += 2) a5_nvfp4_block(3, 2, w, xq, yr, n, 1);
        for (; n < n1; n++) a5_nvfp4_block(3, 1, w, xq, yr, n, 1);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) a5_nvfp4_block(2, 4, w, xq, yr, n, 1);
        for (; n < n1; n++) a5_nvfp4_block(2, 1, w, xq, yr, n, 1);
        break;
    default: {
        /* 4 streams of B consecutive rows each, as cpu_kernels.c's a5_stream walks BF16: one
         * region of 4 rows at a time kept fewer lines in flight (6 of nano's 1856 x 2688 experts
         * per call, two threads, alternating in one process: 1.05x, median of 10; 8 rows
         * measured 50-70 G weights/s in L2 against 85-95, and no faster from DRAM) */
        const int64_t B = (n1 - n0) / 4;
        for (int64_t r = 0; r < B; r++) a5_nvfp4_block(1, 4, w, xq, yr, n0 + r, B);
        for (n = n0 + 4 * B; n < n1; n++) a5_nvfp4_block(1, 1, w, xq, yr, n, 1);
        break;
    }
    }
}

/* The same q and d as sc_quant_nvfp4 (the block max is order-free, then the same fp32 multiply and
 * round-to-nearest-even: vcvtps2dq under the default MXCSR, as lrintf), laid out for VNNI. */
A5Q_FN static void a5_quant_nvfp4(const float *x, int64_t K, int8_t *xq) {
    const int64_t KV = A5Q_KPAD(K), K256 = K & ~(int64_t)255;
    float *d = (float *)(xq + KV);
    int32_t *c = (int32_t *)(d + KV / 16);
    /* a block's 16 bytes as x0, x1, x2, x3 take them: 0 2 4 6 | 1 3 5 7 | 8 .. 14 | 9 .. 15 */
    const __m128i perm = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    if (K256 < K) { /* the last superchunk's missing blocks: q, d and c zero */
        memset(xq + K256, 0, 256);
        for (int64_t b = K / 16; b < KV / 16; b++) {
            d[b] = 0;
            c[b] = 0;
        }
    }
    for (int64_t b = 0; b < K; b += 16) {
        const __m512 v = _mm512_loadu_ps(x + b);
        const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
        /* a non-finite block keeps q = 0 and carries the non-finite scale into the result */
        const int fin = amax <= FLT_MAX;
        const float id = amax > 0 && fin ? 127.0f / amax : 0.0f;
        const __m512i q = fin ? _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)))
                              : _mm512_setzero_si512();
        const __m128i qb = _mm_shuffle_epi8(_mm512_cvtsepi32_epi8(q), perm);
        int8_t *o = xq + (b & ~(int64_t)255) + 4 * ((b & 255) / 16);
        const int32_t part[4] = {_mm_cvtsi128_si32(qb), _mm_extract_epi32(qb, 1),
                                 _mm_extract_epi32(qb, 2), _mm_extract_epi32(qb, 3)};
        for (int i = 0; i < 4; i++) memcpy(o + 64 * i, &part[i], 4);
        d[b / 16] = amax / 127.0f;
        c[b / 16] = -FP4_BIAS * _mm512_reduce_add_epi32(q);
    }
}

/* The E8M0 codes of 16 blocks (fewer under mask sm) as the vscalefps exponents that take
 * cpu_a5_e4m3_x2m120's value * 2^-120 to value * 2^(e - 127): e - 7; NaN for the NaN code 255. */
A5_IN __m512 a5_e8m0_exps16(const uint8_t *p, __mmask16 sm) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(_mm512_maskz_loadu_epi8(sm, p)));
    const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(7)));
    return _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                              _mm512_set1_ps(NAN));
}

/* Each weight is scaled exactly to its dequantized fp32 value (vscalefps by a power of two is
 * one rounding of the exact product, as the dequantized table's), then one FMA per 16 values. */
A5_IN void a5_mxfp8_block(int R, int NR, const cpu_wmat *w, const float *const *xr,
                          float *const *yr, int64_t n) {
    const int64_t K = w->K;
    const int64_t pf = MXFP8_PF_TILES * NR * w->stride; /* as a5_nvfp4_block */
    const uint8_t *wr[8], *sr[8];
    __m512 acc[CPU_MM_ROWS][8], se[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        wr[j] = (const uint8_t *)w->data + (n + j) * w->stride;
        sr[j] = w->bs + (n + j) * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) se[j] = _mm512_setzero_ps(); /* set at k = 0 */
    for (int64_t k = 0; k < K; k += 32) {
        const int64_t b = k / 32;
        if (b % 16 == 0) {
            const int64_t nb = (K - k) / 32;
            const __mmask16 sm = nb >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nb) - 1u);
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) se[j] = a5_e8m0_exps16(sr[j] + b, sm);
        }
        const __m512i bi = _mm512_set1_epi32((int)(b % 16));
        __m512 wv[8][2];
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            if (R == 1 && k % 64 == 0) _mm_prefetch((const char *)wr[j] + k + pf, _MM_HINT_T0);
            const __m512 e = _mm512_permutexvar_ps(bi, se[j]);
            wv[j][0] = _mm512_scalef_ps(cpu_a5_e4m3_x2m120(wr[j] + k), e);
            wv[j][1] = _mm512_scalef_ps(cpu_a5_e4m3_x2m120(wr[j] + k + 16), e);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 x0 = _mm512_loadu_ps(xr[r] + k), x1 = _mm512_loadu_ps(xr[r] + k + 16);
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) {
                acc[r][j] = _mm512_fmadd_ps(wv[j][0], x0, acc[r][j]);
                acc[r][j] = _mm512_fmadd_ps(wv[j][1], x1, acc[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) yr[r][n + j] = a5q_hsum(acc[r][j]);
}

A5_FN static void a5_mm_mxfp8(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                              int64_t n0, int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 4 <= n1; n += 4) a5_mxfp8_block(4, 4, w, xr, yr, n);
        for (; n < n1; n++) a5_mxfp8_block(4, 1, w, xr, yr, n);
        break;
    case 3:
        for (; n + 4 <= n1; n += 4) a5_mxfp8_block(3, 4, w, xr, yr, n);
        for (; n < n1; n++) a5_mxfp8_block(3, 1, w, xr, yr, n);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) a5_mxfp8_block(2, 4, w, xr, yr, n);
        for (; n < n1; n++) a5_mxfp8_block(2, 1, w, xr, yr, n);
        break;
    default:
        for (; n + MXFP8_NR1 <= n1; n += MXFP8_NR1) a5_mxfp8_block(1, MXFP8_NR1, w, xr, yr, n);
        for (; n + 4 <= n1; n += 4) a5_mxfp8_block(1, 4, w, xr, yr, n);
        for (; n < n1; n++) a5_mxfp8_block(1, 1, w, xr, yr, n);
        break;
    }
}

void cpu_quant_kernels_avx512(cpu_kernels *k, int vnni) {
    cpu_quant_kernels_avx2(k);
    if (vnni) { /* a kernel and the activation layout it reads go together */
        k->mm_nvfp4 = a5_mm_nvfp4;
        k->quant_nvfp4 = a5_quant_nvfp4;
    }
    k->mm_mxfp8 = a5_mm_mxfp8;
}

#else

void cpu_quant_kernels_avx2(cpu_kernels *k) { cpu_quant_kernels_scalar(k); }
void cpu_quant_kernels_avx512(cpu_kernels *k, int vnni) {
    (void)vnni;
    cpu_quant_kernels_scalar(k);
}

#endif
