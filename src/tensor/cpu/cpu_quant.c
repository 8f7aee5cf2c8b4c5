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
 * FMA with fp32 activations): per 64 weights it costs about 12 instructions against 24, and it
 * does 64 multiply-adds per vpdpbusd instead of 16 per FMA. Measured on this machine (AMD EPYC,
 * AVX-512 VNNI, one thread, best of 2 s, weight 2688 x 1856): decode (T=1) 19.6 GB/s of weights
 * streamed against 10.7 for the float path, prefill (T=64) 183 GFLOP/s against 82. The int8
 * activations cost about 0.3% relative error per dot product (max-abs per 16, round to nearest).
 *
 * MXFP8 (E4M3 with an E8M0 exponent per 32) runs in fp32. AVX2: E4M3 -> fp16 bits by two shifts
 * (the sign-extended code << 7 with bit 14 cleared is the fp16 of value / 256, subnormals
 * included), vcvtph2ps, then one multiply by 256 * 2^(e - 127) per 32. AVX-512: E4M3 -> fp32 bits
 * directly (cpu_impl.h: cpu_a5_e4m3_x2m120, value * 2^-120, half the instructions; MXFP8 decode
 * was bound by this conversion), then one multiply by 2^(e - 7). Then an FMA with the fp32
 * activations.
 * This is exactly the math of the dequantized weights (every step is exact but the sums).
 *
 * AVX-512 VNNI NVFP4, two kernels with one order of additions (invariant 1 holds across them):
 * per output, the block's integer sum (exact) times e4m3(ws) * d(x) is FMAed into partial sum
 * p_{b mod 4}, then (p0 + p2) + (p1 + p3), then * scale.
 *  - the tile kernel (decode, and groups of fewer than CPU_PANEL_MIN_T x rows) puts 4 weight
 *    rows x 4 blocks of a 64-value chunk in one vector (two vpermt2w gather each block's groups
 *    of 4), so each chunk's weights unpack once per 1..4 tokens;
 *  - the panel kernel (prefill) decodes 16 weight rows x K once into a per-thread panel, lane r
 *    = row r (cpu_impl.h: CPU_PANEL), and runs every token of the call over it: per 16 inputs and
 *    token 4 vpdpbusd on broadcast activations, 1 convert, 1 multiply, 1 FMA for 16 rows.
 *
 * Invariants:
 *  (1) As in cpu_kernels.c: inside one ISA an output is one fixed order of additions walking k
 *      upward, then * scale, whatever the tile shape or kernel (AVX-512 NVFP4: the order above);
 *      results do not depend on the row grouping or the thread count.
 *  (2) quant_nvfp4 produces the same bytes on every ISA.
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

/* ---------------------------------------------------------------- scalar */

static void sc_quant_nvfp4(const float *x, int64_t K, int8_t *xq) {
    const int64_t KP = CPU_XQ_KPAD(K);
    float *d = (float *)(xq + KP);
    int32_t *c = (int32_t *)(d + KP / 4);
    int8_t *qg = (int8_t *)(c + KP / 4);
    float *db = (float *)(qg + KP);
    int32_t *cb = (int32_t *)(db + KP / 16);
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
        db[b / 16] = dv;
        cb[b / 16] = c[b / 4] + c[b / 4 + 1] + c[b / 4 + 2] + c[b / 4 + 3];
        for (int g = 0; g < 4; g++)
            memcpy(qg + (b & ~(int64_t)63) + 16 * g + (b & 63) / 4, xq + b + 4 * g, 4);
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
    k->mm_nvfp4_panel = NULL; /* sc_mm_nvfp4 is the reference, in the panel kernel's order */
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
    k->mm_nvfp4_panel = NULL;
    k->quant_nvfp4 = sc_quant_nvfp4; /* O(T K) against the matmul's O(T K N): not worth SIMD */
    k->mm_mxfp8 = a2_mm_mxfp8;
}

/* ---------------------------------------------------------------- AVX-512 (+VNNI) */

#define A5Q_ATTR "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
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

/* E4M3 codes (sign-extended 32-bit lanes) -> exact fp32 values: the bit placement of
 * cpu_a5_e4m3_x2m120, then * 2^120 (exact). Codes 0x7f / 0xff (NaN) read as 480 here, in the
 * tile and the panel kernel alike. */
A5Q_IN __m512 a5_e4m3_exact(__m512i v) {
    __m512 f = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32((int)0x87f00000u)));
    return _mm512_mul_ps(f, _mm512_set1_ps(0x1p120f));
}

static inline float e4m3_exact(uint8_t code) {
    uint32_t bits = ((uint32_t)(int32_t)(int8_t)code << 20) & 0x87f00000u;
    float f;
    memcpy(&f, &bits, 4);
    return f * 0x1p120f;
}

/* 32 packed bytes -> 64 unsigned weights 2 * e2m1 + 12, in order (byte i: values 2i, 2i+1). */
A5Q_IN __m512i a5_fp4_unpack_v(__m256i packed) {
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    __m512i v = _mm512_cvtepu8_epi16(packed);
    /* (v | v << 4) & 0x0f0f: nibble L in the low byte, H in the high byte (values 2i, 2i+1) */
    __m512i idx = _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(v, 4), _mm512_set1_epi16(0x0f0f),
                                            0xa8);
    return _mm512_shuffle_epi8(lut, idx);
}

/* The tile kernel's quad layout: 4 weight rows x one 64-value chunk (4 blocks) per vector,
 * lane 4r + j = row r, block j. Vector g holds inputs 4g..4g+3 of each block, which is packed
 * word 4j + g of each row's 32 bytes: two vpermt2w over rows (0,1) and (2,3) gather groups
 * (0,1) and (2,3). Rows at or past nr read row 0 again (their outputs are not stored); bytes
 * past K are masked (zero weights, zero scales). */
A5Q_IN void a5_quad_chunk(const uint8_t *const *wr, const uint8_t *const *sr, int64_t c,
                          int nv, __m512i *wv, __m512 *ws) {
    const __mmask32 wm = nv == 64 ? 0xffffffffu : (__mmask32)((1u << (nv / 2)) - 1u);
    const __m512i a = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(wm, wr[0] + 32 * c)),
        _mm256_maskz_loadu_epi8(wm, wr[1] + 32 * c), 1);
    const __m512i b = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(wm, wr[2] + 32 * c)),
        _mm256_maskz_loadu_epi8(wm, wr[3] + 32 * c), 1);
    /* output word m: group g0 + m / 16, lane l = m % 16 -> source word 4l + g (rows 2, 3 sit at
     * 32.. in b, which is exactly 16r + 4j) */
    const __m512i i01 = _mm512_set_epi16(61, 57, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 13, 9, 5,
                                         1, 60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8,
                                         4, 0);
    const __m512i i23 = _mm512_add_epi16(i01, _mm512_set1_epi16(2));
    const __m512i p01 = _mm512_permutex2var_epi16(a, i01, b);
    const __m512i p23 = _mm512_permutex2var_epi16(a, i23, b);
    wv[0] = a5_fp4_unpack_v(_mm512_castsi512_si256(p01));
    wv[1] = a5_fp4_unpack_v(_mm512_extracti64x4_epi64(p01, 1));
    wv[2] = a5_fp4_unpack_v(_mm512_castsi512_si256(p23));
    wv[3] = a5_fp4_unpack_v(_mm512_extracti64x4_epi64(p23, 1));
    uint32_t s4[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; j++) {
        if (nv == 64)
            memcpy(&s4[j], sr[j] + 4 * c, 4);
        else
            memcpy(&s4[j], sr[j] + 4 * c, (size_t)(nv / 16));
    }
    *ws = a5_e4m3_exact(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)s4)));
}

/* R tokens x 4 weight rows at n (nr of them real). Per output: 4 partial sums p_j over the
 * blocks b = j mod 4, p_j = fma(isum_b, e4m3(bs_b) * d_b, p_j), then (p0 + p2) + (p1 + p3), then
 * * scale: the panel kernel's order exactly. */
A5Q_IN void a5_nvfp4_quad(int R, const cpu_wmat *w, const int8_t *const *xq, float *const *yr,
                          int64_t n, int nr) {
    const int64_t K = w->K, KP = CPU_XQ_KPAD(K);
    const uint8_t *wr[4], *sr[4];
    const int8_t *qg[CPU_MM_ROWS];
    const float *db[CPU_MM_ROWS];
    const int32_t *cb[CPU_MM_ROWS];
    __m512 acc[CPU_MM_ROWS];
    for (int j = 0; j < 4; j++) {
        const int64_t row = n + (j < nr ? j : 0);
        wr[j] = (const uint8_t *)w->data + row * w->stride;
        sr[j] = w->bs + row * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        qg[r] = xq[r] + 3 * KP;
        db[r] = (const float *)(qg[r] + KP);
        cb[r] = (const int32_t *)(db[r] + KP / 16);
        acc[r] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; 64 * c < K; c++) {
        const int nv = K - 64 * c < 64 ? (int)(K - 64 * c) : 64;
        if (R == 1)
            for (int j = 0; j < 4; j++) _mm_prefetch((const char *)wr[j] + 32 * c + 512, _MM_HINT_T0);
        __m512i wv[4];
        __m512 ws;
        a5_quad_chunk(wr, sr, c, nv, wv, &ws);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int8_t *q = qg[r] + 64 * c;
            __m512i a = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(cb[r] + 4 * c)));
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++)
                a = _mm512_dpbusd_epi32(
                    a, wv[g], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(q + 16 * g))));
            const __m512 dv = _mm512_broadcast_f32x4(_mm_loadu_ps(db[r] + 4 * c));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(ws, dv), acc[r]);
        }
    }
    const __m512 scale = _mm512_set1_ps(w->scale);
    const __mmask16 om = (__mmask16)(0x1111u & ((1u << (4 * nr)) - 1u));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m512 t = _mm512_add_ps(acc[r], _mm512_permute_ps(acc[r], 0x4e)); /* p0+p2, p1+p3 */
        t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xb1));
        _mm512_mask_compressstoreu_ps(yr[r] + n, om, _mm512_mul_ps(t, scale));
    }
}

A5Q_FN static void a5_mm_nvfp4(const cpu_wmat *w, const int8_t *const *xq, float *const *yr, int R,
                               int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n += 4) {
        const int nr = n1 - n < 4 ? (int)(n1 - n) : 4;
        switch (R) {
        case 4: a5_nvfp4_quad(4, w, xq, yr, n, nr); break;
        case 3: a5_nvfp4_quad(3, w, xq, yr, n, nr); break;
        case 2: a5_nvfp4_quad(2, w, xq, yr, n, nr); break;
        default: a5_nvfp4_quad(1, w, xq, yr, n, nr); break;
        }
    }
}

/* Same bytes as sc_quant_nvfp4 (invariant 2): the block max is order-free, then the same fp32
 * multiply and round-to-nearest-even (vcvtps2dq under the default MXCSR, as lrintf). */
A5_FN static void a5_quant_nvfp4(const float *x, int64_t K, int8_t *xq) {
    const int64_t KP = CPU_XQ_KPAD(K);
    float *d = (float *)(xq + KP);
    int32_t *c = (int32_t *)(d + KP / 4);
    int8_t *qg = (int8_t *)(c + KP / 4);
    float *db = (float *)(qg + KP);
    int32_t *cb = (int32_t *)(db + KP / 16);
    if (KP > K) memset(qg + (K & ~(int64_t)63), 0, 64); /* the last chunk's missing blocks */
    for (int64_t b = 0; b < K; b += 16) {
        __m512 v = _mm512_loadu_ps(x + b);
        float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
        if (!(amax <= FLT_MAX)) { /* NaN or inf: the scalar path's rule */
            sc_quant_nvfp4(x, K, xq);
            return;
        }
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)(xq + b), _mm512_cvtsepi32_epi8(q));
        /* lane sums of 4: q0+q1+q2+q3 of each group, by two pairwise adds over 32-bit lanes */
        int32_t qs[16];
        _mm512_storeu_si512((void *)qs, q);
        const float dv = amax / 127.0f;
        for (int l = 0; l < 4; l++) {
            d[b / 4 + l] = dv;
            c[b / 4 + l] = -FP4_BIAS * (qs[4 * l] + qs[4 * l + 1] + qs[4 * l + 2] + qs[4 * l + 3]);
        }
        db[b / 16] = dv;
        cb[b / 16] = c[b / 4] + c[b / 4 + 1] + c[b / 4 + 2] + c[b / 4 + 3];
        for (int g = 0; g < 4; g++)
            memcpy(qg + (b & ~(int64_t)63) + 16 * g + (b & 63) / 4, xq + b + 4 * g, 4);
    }
    if (KP > K) {
        memset(xq + K, 0, (size_t)(KP - K));
        memset(d + K / 4, 0, (size_t)(KP - K));
        memset(c + K / 4, 0, (size_t)(KP - K));
        memset(db + K / 16, 0, (size_t)(KP - K) / 4);
        memset(cb + K / 16, 0, (size_t)(KP - K) / 4);
    }
}

A5_IN void a5_mxfp8_block(int R, int NR, const cpu_wmat *w, const float *const *xr,
                          float *const *yr, int64_t n) {
    const int64_t K = w->K;
    const uint8_t *wr[4], *sr[4];
    __m512 acc[CPU_MM_ROWS][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        wr[j] = (const uint8_t *)w->data + (n + j) * w->stride;
        sr[j] = w->bs + (n + j) * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        __m512 wv[4][2];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            if (R == 1) _mm_prefetch((const char *)wr[j] + k + 1024, _MM_HINT_T0);
            const uint8_t e = sr[j][k / 32];
            __m512 w0 = cpu_a5_e4m3_x2m120(wr[j] + k), w1 = cpu_a5_e4m3_x2m120(wr[j] + k + 16);
            if (e > 134) { /* 2^(e - 7) would overflow: undo the 2^-120 first (both exact) */
                w0 = _mm512_mul_ps(w0, _mm512_set1_ps(0x1p120f));
                w1 = _mm512_mul_ps(w1, _mm512_set1_ps(0x1p120f));
            }
            const __m512 s = _mm512_set1_ps(e > 134 ? w->lut8[e] : w->lut8[e] * 0x1p120f);
            wv[j][0] = _mm512_mul_ps(w0, s);
            wv[j][1] = _mm512_mul_ps(w1, s);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 x0 = _mm512_loadu_ps(xr[r] + k), x1 = _mm512_loadu_ps(xr[r] + k + 16);
#pragma GCC unroll 4
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
        for (; n + 4 <= n1; n += 4) a5_mxfp8_block(1, 4, w, xr, yr, n);
        for (; n < n1; n++) a5_mxfp8_block(1, 1, w, xr, yr, n);
        break;
    }
}

/* In place: lane r of v[q] becomes lane q of v[r] (16 x 16 dwords; 64 shuffles). */
A5Q_IN void a5_transpose16(__m512i *v) {
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) { /* u[4k + m], 128-bit lane L: dword 4L + m of rows 4k..4k+3 */
        u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        __m512i a = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88);  /* lanes 0, 2 */
        __m512i a2 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xdd); /* lanes 1, 3 */
        __m512i b = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
        __m512i b2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xdd);
        v[m] = _mm512_shuffle_i32x4(a, b, 0x88);
        v[8 + m] = _mm512_shuffle_i32x4(a, b, 0xdd);
        v[4 + m] = _mm512_shuffle_i32x4(a2, b2, 0x88);
        v[12 + m] = _mm512_shuffle_i32x4(a2, b2, 0xdd);
    }
}

/* Decodes rows n0..n1-1 into the CPU_PANEL layout (rows past them, and blocks past K up to the
 * panel's multiple of 4, read as zero weights with scale 0). Per 64-value chunk: each row's
 * values unpack in order (dword q = group q % 4 of block q / 4), one 16 x 16 transpose puts row r
 * in lane r. Scales: 16 blocks of each row convert to fp32, then the same transpose. */
A5Q_IN void a5_panel_build(const cpu_wmat *w, int64_t n0, int64_t n1, uint8_t *P) {
    const int64_t K = w->K, nbp = CPU_PANEL_BYTES(K) / CPU_PANEL_BLOCK_BYTES, nb = K / 16;
    const int nr = (int)(n1 - n0);
    const uint8_t *row[CPU_PANEL_ROWS], *bs[CPU_PANEL_ROWS];
    for (int r = 0; r < CPU_PANEL_ROWS; r++) {
        row[r] = r < nr ? (const uint8_t *)w->data + (n0 + r) * w->stride : NULL;
        bs[r] = r < nr ? w->bs + (n0 + r) * w->bs_stride : NULL;
    }
    __m512i v[16];
    for (int64_t k = 0; k < 16 * nbp; k += 64) {
        const int64_t nv = K - k < 64 ? K - k : 64; /* a multiple of 16, or <= 0 past K */
        const __mmask32 wm = nv >= 64 ? 0xffffffffu : nv <= 0 ? 0 : (__mmask32)((1u << (nv / 2)) - 1u);
#pragma GCC unroll 16
        for (int r = 0; r < CPU_PANEL_ROWS; r++) /* masked-off bytes unpack to 12, zero */
            v[r] = a5_fp4_unpack_v(r < nr ? _mm256_maskz_loadu_epi8(wm, row[r] + k / 2)
                                          : _mm256_setzero_si256());
        a5_transpose16(v);
        uint8_t *pb = P + k / 16 * CPU_PANEL_BLOCK_BYTES;
#pragma GCC unroll 16
        for (int q = 0; q < 16; q++)
            _mm512_store_si512((void *)(pb + (q / 4) * CPU_PANEL_BLOCK_BYTES + 64 * (q % 4)), v[q]);
    }
    for (int64_t b = 0; b < nbp; b += 16) {
        const int64_t ns = nb - b < 16 ? (nb - b > 0 ? nb - b : 0) : 16;
        const __mmask16 sm = (__mmask16)((1u << ns) - 1u);
#pragma GCC unroll 16
        for (int r = 0; r < CPU_PANEL_ROWS; r++)
            v[r] = _mm512_castps_si512(a5_e4m3_exact(_mm512_cvtepi8_epi32(
                r < nr ? _mm_maskz_loadu_epi8(sm, bs[r] + b) : _mm_setzero_si128())));
        a5_transpose16(v);
        for (int q = 0; q < 16 && b + q < nbp; q++)
            _mm512_store_si512((void *)(P + (b + q) * CPU_PANEL_BLOCK_BYTES + 256), v[q]);
    }
}

/* R tokens against the whole panel: per block, 4 vpdpbusd per token (lane r = weight row r)
 * from the block correction, then one convert, one scale and one FMA for 16 rows, into the
 * token's partial sum of blocks b mod 4 (the tile kernel's order, a5_nvfp4_quad). */
A5Q_IN void a5_panel_rows(int R, const cpu_wmat *w, const uint8_t *P, const int8_t *const *xq,
                          float *const *yr, int64_t n0, __mmask16 om) {
    const int64_t KP = CPU_XQ_KPAD(w->K), nbp = CPU_PANEL_BYTES(w->K) / CPU_PANEL_BLOCK_BYTES;
    const float *db[4];
    const int32_t *cb[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        db[r] = (const float *)(xq[r] + 4 * KP);
        cb[r] = (const int32_t *)(db[r] + KP / 16);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    }
    for (int64_t b0 = 0; b0 < nbp; b0 += 4) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const int64_t b = b0 + j;
            const uint8_t *pb = P + b * CPU_PANEL_BLOCK_BYTES;
            const __m512i w0 = _mm512_load_si512((const void *)pb);
            const __m512i w1 = _mm512_load_si512((const void *)(pb + 64));
            const __m512i w2 = _mm512_load_si512((const void *)(pb + 128));
            const __m512i w3 = _mm512_load_si512((const void *)(pb + 192));
            const __m512 s = _mm512_load_ps((const float *)(pb + 256));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                int32_t x4[4];
                memcpy(x4, xq[r] + 16 * b, 16);
                __m512i a = _mm512_set1_epi32(cb[r][b]);
                a = _mm512_dpbusd_epi32(a, w0, _mm512_set1_epi32(x4[0]));
                a = _mm512_dpbusd_epi32(a, w1, _mm512_set1_epi32(x4[1]));
                a = _mm512_dpbusd_epi32(a, w2, _mm512_set1_epi32(x4[2]));
                a = _mm512_dpbusd_epi32(a, w3, _mm512_set1_epi32(x4[3]));
                acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a),
                                            _mm512_mul_ps(s, _mm512_set1_ps(db[r][b])), acc[r][j]);
            }
        }
    }
    const __m512 scale = _mm512_set1_ps(w->scale);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m512 t = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][2]),
                                 _mm512_add_ps(acc[r][1], acc[r][3]));
        _mm512_mask_storeu_ps(yr[r] + n0, om, _mm512_mul_ps(t, scale));
    }
}

A5Q_FN static void a5_mm_nvfp4_panel(const cpu_wmat *w, const int8_t *const *xq,
                                     float *const *yr, int T, int64_t n0, int64_t n1,
                                     void *panel) {
    uint8_t *P = panel;
    a5_panel_build(w, n0, n1, P);
    const __mmask16 om = (__mmask16)((1u << (n1 - n0)) - 1u);
    int t = 0;
    for (; t + 4 <= T; t += 4) a5_panel_rows(4, w, P, xq + t, yr + t, n0, om);
    switch (T - t) {
    case 3: a5_panel_rows(3, w, P, xq + t, yr + t, n0, om); break;
    case 2: a5_panel_rows(2, w, P, xq + t, yr + t, n0, om); break;
    case 1: a5_panel_rows(1, w, P, xq + t, yr + t, n0, om); break;
    default: break;
    }
}

void cpu_quant_kernels_avx512(cpu_kernels *k, int vnni) {
    cpu_quant_kernels_avx2(k);
    if (vnni) {
        k->mm_nvfp4 = a5_mm_nvfp4;
        k->mm_nvfp4_panel = a5_mm_nvfp4_panel;
    }
    k->quant_nvfp4 = a5_quant_nvfp4;
    k->mm_mxfp8 = a5_mm_mxfp8;
}

#else

void cpu_quant_kernels_avx2(cpu_kernels *k) { cpu_quant_kernels_scalar(k); }
void cpu_quant_kernels_avx512(cpu_kernels *k, int vnni) {
    (void)vnni;
    cpu_quant_kernels_scalar(k);
}

#endif
