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
 * AVX-512 unpacks 128 nibbles with one shift and two vpermb (VBMI) and leaves them de-interleaved
 * (even columns, odd columns); its activations are laid out to match (cpu_impl.h: CPU_XQ VNNI
 * layout), so an int32 lane sums 8 values of one block and each 128 values cost, per weight row,
 * a load, a shift, 2 vpermb, 2 vpdpbusd, a convert, a scale permute, a multiply and an FMA.
 * Measured on this machine (AMD EPYC, Zen 5, one thread, thread CPU time, weight in L2, 256 x 2688):
 * decode (T=1) 57 G weights/s before (nibbles widened to 16-bit lanes, pshufb, 4 values per lane),
 * 95 after; prefill (T=64, 1856 x 2688) 85 G multiply-adds/s before, 106-116 after. The int8
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

/* The VNNI layout of a quantized activation row (cpu_impl.h: CPU_XQ_VNNI): per chunk of 128
 * values at c0, xe[4l + m] = q[c0 + 8l + 2m] and xo[4l + m] = q[c0 + 8l + 2m + 1] (64 bytes each),
 * so that lane l of vpdpbusd(vpdpbusd(c, lo, xe), hi, xo) sums values c0 + 8l .. c0 + 8l + 7,
 * lo / hi being the low / high nibbles of the 64 packed weight bytes as they lie in memory. */

/* 128 nibbles (64 packed bytes, fewer under mask wm) -> unsigned weights 2 * e2m1 + 12: *lo the
 * even columns, *hi the odd ones. vpermb reads 6 index bits, so a table of the 16 entries repeated
 * 4 times ignores the bits above the nibble: no mask, and hi needs only a 16-bit shift. */
A5Q_IN void a5_fp4_unpack128(const uint8_t *p, __mmask64 wm, __m512i *lo, __m512i *hi) {
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i v = wm == ~(__mmask64)0 ? _mm512_loadu_si512((const void *)p)
                                          : _mm512_maskz_loadu_epi8(wm, p);
    *lo = _mm512_permutexvar_epi8(v, lut);
    *hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
}

/* One chunk of 128 values at k, half h of its 256: lane l of the dot products covers values
 * k + 8l .. k + 8l + 7, in block 8h + l / 2 of the 16 whose scales sf holds. */
A5Q_IN void a5_nvfp4_chunk(int R, int NR, const uint8_t *const *wr, const __m512 *sf,
                           const int8_t *const *xq, const float *const *xd,
                           const int32_t *const *xc, __m512 (*acc)[8], int64_t k, int h,
                           __mmask64 wm, int64_t pf) {
    const __m512i sidx = _mm512_add_epi32(
        _mm512_set1_epi32(8 * h), _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    __m512i lo[8], hi[8];
    __m512 ws[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        if (pf) _mm_prefetch((const char *)wr[j] + k / 2 + pf, _MM_HINT_T0);
        a5_fp4_unpack128(wr[j] + k / 2, wm, &lo[j], &hi[j]);
        ws[j] = _mm512_permutexvar_ps(sidx, sf[j]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512i xe = _mm512_loadu_si512((const void *)(xq[r] + k));
        const __m512i xo = _mm512_loadu_si512((const void *)(xq[r] + k + 64));
        const __m512 dv = _mm512_loadu_ps(xd[r] + k / 8);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            __m512i i = _mm512_loadu_si512((const void *)(xc[r] + k / 8));
            i = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i, lo[j], xe), hi[j], xo);
            acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(ws[j], dv), acc[r][j]);
        }
    }
}

/* Full 256-value superchunks run unmasked; the row's tail (K % 256) is masked. */
A5Q_IN void a5_nvfp4_block(int R, int NR, const cpu_wmat *w, const int8_t *const *xq,
                           float *const *yr, int64_t n) {
    const int64_t K = w->K, KP = CPU_XQ_KPAD(K), K256 = K & ~(int64_t)255;
    /* decode prefetches the same offset of the next tile's rows: the rows of a tile lie back to
     * back, so an offset within the row would land in rows being read already */
    const int64_t pf = R == 1 ? NR * w->stride : 0;
    const uint8_t *wr[8], *sr[8];
    const float *xd[CPU_MM_ROWS];
    const int32_t *xc[CPU_MM_ROWS];
    __m512 acc[CPU_MM_ROWS][8];
    __m512 sf[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        wr[j] = (const uint8_t *)w->data + (n + j) * w->stride;
        sr[j] = w->bs + (n + j) * w->bs_stride;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        xd[r] = (const float *)(xq[r] + KP);
        xc[r] = (const int32_t *)(xd[r] + KP / 8);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[r][j] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K256; k += 256) {
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) sf[j] = a5_scales16(sr[j] + k / 16, 0xffff);
        a5_nvfp4_chunk(R, NR, wr, sf, xq, xd, xc, acc, k, 0, ~(__mmask64)0, pf);
        a5_nvfp4_chunk(R, NR, wr, sf, xq, xd, xc, acc, k + 128, 1, ~(__mmask64)0, pf);
    }
    if (K256 < K) {
        const int64_t nsc = (K - K256) / 16; /* 1..15 blocks left */
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++)
            sf[j] = a5_scales16(sr[j] + K256 / 16, (__mmask16)((1u << nsc) - 1u));
        for (int h = 0; K256 + 128 * h < K; h++) {
            const int64_t k = K256 + 128 * h, nv = K - k < 128 ? K - k : 128;
            const __mmask64 wm = nv == 128 ? ~(__mmask64)0 : (((__mmask64)1 << (nv / 2)) - 1);
            a5_nvfp4_chunk(R, NR, wr, sf, xq, xd, xc, acc, k, h, wm, 0);
        }
    }
    const float scale = w->scale * 256.0f; /* sf held e4m3 / 256 */
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) yr[r][n + j] = a5q_hsum(acc[r][j]) * scale;
}

A5Q_FN static void a5_mm_nvfp4(const cpu_wmat *w, const int8_t *const *xq, float *const *yr, int R,
                               int64_t n0, int64_t n1) {
    int64_t n = n0;
    switch (R) {
    case 4:
        for (; n + 4 <= n1; n += 4) a5_nvfp4_block(4, 4, w, xq, yr, n);
        for (; n < n1; n++) a5_nvfp4_block(4, 1, w, xq, yr, n);
        break;
    case 3:
        for (; n + 4 <= n1; n += 4) a5_nvfp4_block(3, 4, w, xq, yr, n);
        for (; n < n1; n++) a5_nvfp4_block(3, 1, w, xq, yr, n);
        break;
    case 2:
        for (; n + 4 <= n1; n += 4) a5_nvfp4_block(2, 4, w, xq, yr, n);
        for (; n < n1; n++) a5_nvfp4_block(2, 1, w, xq, yr, n);
        break;
    default:
        /* 4 rows: 8 measured 50-70 G weights/s in L2 against 85-95, and no faster from DRAM */
        for (; n + 4 <= n1; n += 4) a5_nvfp4_block(1, 4, w, xq, yr, n);
        for (; n < n1; n++) a5_nvfp4_block(1, 1, w, xq, yr, n);
        break;
    }
}

/* The same q and d as sc_quant_nvfp4 (the block max is order-free, then the same fp32 multiply and
 * round-to-nearest-even: vcvtps2dq under the default MXCSR, as lrintf), laid out for VNNI. */
A5Q_FN static void a5_quant_nvfp4(const float *x, int64_t K, int8_t *xq) {
    const int64_t KP = CPU_XQ_KPAD(K);
    float *d = (float *)(xq + KP);
    int32_t *c = (int32_t *)(d + KP / 8);
    /* evens in bytes 0..7, odds in 8..15 */
    const __m128i eo = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    memset(xq, 0, (size_t)(2 * KP));
    for (int64_t b = 0; b < K; b += 16) {
        const __m512 v = _mm512_loadu_ps(x + b);
        const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
        /* a non-finite block keeps q = 0 and carries the non-finite scale into the result */
        const int fin = amax <= FLT_MAX;
        const float id = amax > 0 && fin ? 127.0f / amax : 0.0f;
        const __m512i q = fin ? _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)))
                              : _mm512_setzero_si512();
        const __m128i qb = _mm_shuffle_epi8(_mm512_cvtsepi32_epi8(q), eo);
        const int64_t c0 = b & ~(int64_t)127, l = (b & 127) / 8; /* lanes l, l + 1 */
        _mm_storel_epi64((__m128i *)(xq + c0 + 4 * l), qb);
        _mm_storel_epi64((__m128i *)(xq + c0 + 64 + 4 * l), _mm_unpackhi_epi64(qb, qb));
        int32_t qs[16];
        _mm512_storeu_si512((void *)qs, q);
        int32_t s0 = 0, s1 = 0;
        for (int i = 0; i < 8; i++) {
            s0 += qs[i];
            s1 += qs[8 + i];
        }
        d[b / 8] = d[b / 8 + 1] = amax / 127.0f;
        c[b / 8] = -FP4_BIAS * s0;
        c[b / 8 + 1] = -FP4_BIAS * s1;
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
