/* cpu_att_block.c - the tiled prefill attention kernel of the CPU backend: a block of queries
 * against one kv head's keys, for the scalar, AVX2+FMA+F16C and AVX-512 tables.
 *
 * Promises: one call (cpu_att_blk, cpu_impl.h) puts every (query, query head) pair of its block
 * in a lane of its own, up to CPU_ATT_LANES of them, so each K/V row read and decoded to fp32
 * once serves the whole block: for groups of 4 query heads per kv head that is 16 queries
 * sharing every row. Keys go AB_VK at a time: their scores are a register-blocked micro-kernel
 * (AB_KB keys against AB_NVG lane vectors of q transposed, one broadcast per key and d), the
 * online softmax runs on those vectors, and the values are a second micro-kernel (AB_LB lanes x
 * AB_DB column vectors of the output held in registers across the step's keys). The rows AB_PF
 * steps ahead are prefetched into L2 among the decoding. Why these sizes (64 lanes, AVX2's 6 keys
 * x 2 vectors, copied rows, the prefetch): docs/performance.md, "The CPU's prefill attention".
 *
 * Numerics: per lane, the operations of the AVX-512 decode kernel (cpu_attention.c, at_step) in
 * its order: each score one fused chain over d upward; per step of AB_VK keys from s0 the max,
 * a rescale by exp(old - new) when it rises, p = exp(score - max), their fp32 sum added to a
 * double normaliser, values added in key order with one fused multiply-add each. A lane's bits
 * therefore depend only on its query, head and [s0, s1), never on which other queries or heads
 * share its call (exp(0) is exactly 1, so a rescale the other lanes cause leaves it as it was),
 * on the block size or on the thread count. AVX2 computes each lane with the same IEEE
 * operations as AVX-512 (cpu_exp_le0_8 is cpu_exp_le0_16's twin), so the two give the same bits.
 * The scalar table's lanes are plain C: a multiply and an add where the vectors fuse, libm's expf
 * (a correctly rounded fmaf would be a libm call per product on a CPU without FMA): the same
 * order, other roundings. Keys a lane does not see (past its causal edge) are never added: they
 * leave its max and sums untouched, not multiplied by a zero.
 */
#include <math.h>
#include <string.h>

#include "base/fp.h"
#include "tensor/cpu/cpu_exp.h"
#include "tensor/cpu/cpu_impl.h"

#define AB_VK 16            /* keys per step: ATT_VK of cpu_attention.c, the decode kernel's */
/* Floats between rows of the decoded tiles and of o: a line past CPU_ATT_DMAX, so that rows fall
 * in different L1 sets (at 1 KiB apart the tiles and o of a 64-wide head crowded 16 sets of 8 ways
 * and the kernel stalled on reloads). A constant: the micro-kernels address rows as immediates. */
#define AB_KS (CPU_ATT_DMAX + 16)
/* Steps ahead whose rows are prefetched, into L2 (the block's state fills the L1). */
#define AB_PF 4
#define AB_HINT _MM_HINT_T1

typedef struct ab_state {
    _Alignas(64) float qT[CPU_ATT_DMAX * CPU_ATT_LANES]; /* [d][LP], scaled */
    _Alignas(64) float o[CPU_ATT_LANES][AB_KS];          /* unnormalised output per lane */
    _Alignas(64) float kf[AB_VK][AB_KS];                 /* the step's rows as fp32 */
    _Alignas(64) float vf[AB_VK][AB_KS];
    _Alignas(64) float s[AB_VK * CPU_ATT_LANES];         /* [i][LP]: scores, then p */
    _Alignas(64) float m[CPU_ATT_LANES];
    double l[CPU_ATT_LANES];
    int64_t lim[CPU_ATT_LANES]; /* the key each lane stops before */
} ab_state;

static float ab_value(cn_dtype dt, const char *row, int64_t d) {
    switch (dt) {
    case CN_BF16: return cn_bf16_to_f32(((const uint16_t *)row)[d]);
    case CN_F16: return cn_f16_to_f32(((const uint16_t *)row)[d]);
    case CN_F8_E4M3: return cn_e4m3_to_f32(((const uint8_t *)row)[d]);
    default: return ((const float *)row)[d];
    }
}

/* ---------------------------------------------------------------- scalar */

static inline __attribute__((always_inline)) void sc_row(cn_dtype dt, const char *row, int64_t Dh,
                                                         float s, float *dst) {
    for (int64_t d = 0; d < Dh; d++) dst[d] = ab_value(dt, row, d) * s;
}

#define AB_V float
#define AB_VW 1
#define AB_IN static inline __attribute__((always_inline))
#define AB_SFX _sc
#define AB_LOAD(p) (*(p))
#define AB_STORE(p, v) (*(p) = (v))
#define AB_SET1(x) (x)
#define AB_ZERO 0.0f
#define AB_FMA(a, b, c) ((a) * (b) + (c))
#define AB_MAX(a, b) ((b) > (a) ? (b) : (a))
#define AB_SUB(a, b) ((a) - (b))
#define AB_MUL(a, b) ((a) * (b))
#define AB_ADD(a, b) ((a) + (b))
#define AB_EXP(x) expf(x)
#define AB_ANY_GT(a, b) ((a) > (b))
#define AB_ROW(dt, row, Dh, s, dst) sc_row(dt, row, Dh, s, dst)
#define AB_NVG 32
#define AB_KB(NV) ((NV) >= 32 ? 2 : (NV) <= 8 ? 8 : 64 / (NV))
#define AB_KBMAX 8
#define AB_LB 2
#define AB_DB 8
#define AB_PREFETCH(p) __builtin_prefetch(p, 0, 2)
#include "tensor/cpu/cpu_att_block_body.h"

void cpu_att_block_scalar(const cpu_att_blk *a) {
    ab_state st;
    const int L = a->nq * a->hb;
    if (L <= 4) ab_block_sc(a, &st, 4, AB_KB(4)); /* a decode's one query of up to 4 heads */
    else if (L <= 8) ab_block_sc(a, &st, 8, AB_KB(8));
    else if (L <= 16) ab_block_sc(a, &st, 16, AB_KB(16));
    else if (L <= 32) ab_block_sc(a, &st, 32, AB_KB(32));
    else ab_block_sc(a, &st, 64, AB_KB(64));
}

#undef AB_V
#undef AB_VW
#undef AB_IN
#undef AB_SFX
#undef AB_LOAD
#undef AB_STORE
#undef AB_SET1
#undef AB_ZERO
#undef AB_FMA
#undef AB_MAX
#undef AB_SUB
#undef AB_MUL
#undef AB_ADD
#undef AB_EXP
#undef AB_ANY_GT
#undef AB_ROW
#undef AB_KB
#undef AB_KBMAX
#undef AB_NVG
#undef AB_LB
#undef AB_DB
#undef AB_PREFETCH

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* ---------------------------------------------------------------- AVX2 + FMA + F16C */

#define A2_ATTR "avx2,fma,f16c"
#define A2_IN static inline __attribute__((always_inline, target(A2_ATTR)))

/* 8 values of a cache row from d on, as fp32, exactly (E4M3 through the f16 of value / 256:
 * cpu_kernels.c, invariant 2). */
A2_IN __m256 a2_load8(cn_dtype dt, const char *row, int64_t d) {
    switch (dt) {
    case CN_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * d));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case CN_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * d)));
    case CN_F8_E4M3: {
        __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + d)));
        __m128i sg = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8);
        __m128i mg = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7f)), 7);
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(sg, mg)), _mm256_set1_ps(256.0f));
    }
    default: return _mm256_loadu_ps((const float *)row + d);
    }
}

A2_IN void a2_row(cn_dtype dt, const char *row, int64_t Dh, float s, float *dst) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t d = 0;
    if (dt == CN_F32 && s == 1.0f) /* a copy: no multiply on the FMA ports */
        for (; d + 8 <= Dh; d += 8) _mm256_store_ps(dst + d, _mm256_loadu_ps((const float *)row + d));
    for (; d + 8 <= Dh; d += 8) _mm256_store_ps(dst + d, _mm256_mul_ps(a2_load8(dt, row, d), vs));
    for (; d < Dh; d++) dst[d] = ab_value(dt, row, d) * s;
    for (; d % 8; d++) dst[d] = 0;
}

#define AB_V __m256
#define AB_VW 8
#define AB_IN A2_IN
#define AB_SFX _a2
#define AB_LOAD(p) _mm256_load_ps(p)
#define AB_STORE(p, v) _mm256_store_ps(p, v)
#define AB_SET1(x) _mm256_set1_ps(x)
#define AB_ZERO _mm256_setzero_ps()
#define AB_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define AB_MAX(a, b) _mm256_max_ps(a, b)
#define AB_SUB(a, b) _mm256_sub_ps(a, b)
#define AB_MUL(a, b) _mm256_mul_ps(a, b)
#define AB_ADD(a, b) _mm256_add_ps(a, b)
#define AB_EXP(x) cpu_exp_le0_8(x)
#define AB_ANY_GT(a, b) _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ))
#define AB_ROW(dt, row, Dh, s, dst) a2_row(dt, row, Dh, s, dst)
#define AB_NVG 2
#define AB_KB(NV) ((NV) >= 2 ? 6 : 8)
#define AB_KBMAX 8
#define AB_LB 2
#define AB_DB 4
#define AB_PREFETCH(p) _mm_prefetch((const char *)(p), AB_HINT)
#include "tensor/cpu/cpu_att_block_body.h"

__attribute__((target(A2_ATTR))) void cpu_att_block_avx2(const cpu_att_blk *a) {
    ab_state st;
    const int L = a->nq * a->hb;
    if (L <= 8) ab_block_a2(a, &st, 1, AB_KB(1));
    else if (L <= 16) ab_block_a2(a, &st, 2, AB_KB(2));
    else if (L <= 32) ab_block_a2(a, &st, 4, AB_KB(4));
    else ab_block_a2(a, &st, 8, AB_KB(8));
}

#undef AB_V
#undef AB_VW
#undef AB_IN
#undef AB_SFX
#undef AB_LOAD
#undef AB_STORE
#undef AB_SET1
#undef AB_ZERO
#undef AB_FMA
#undef AB_MAX
#undef AB_SUB
#undef AB_MUL
#undef AB_ADD
#undef AB_EXP
#undef AB_ANY_GT
#undef AB_ROW
#undef AB_KB
#undef AB_KBMAX
#undef AB_NVG
#undef AB_LB
#undef AB_DB
#undef AB_PREFETCH

/* ---------------------------------------------------------------- AVX-512 */

#define A5_ATTR "avx512f,avx512bw,avx2,fma,f16c"
#define A5_IN static inline __attribute__((always_inline, target(A5_ATTR)))

/* 16 values of a cache row from d on, as fp32, exactly. */
A5_IN __m512 a5_load16(cn_dtype dt, const char *row, int64_t d) {
    switch (dt) {
    case CN_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * d));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case CN_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * d)));
    case CN_F8_E4M3:
        return _mm512_mul_ps(cpu_a5_e4m3_x2m120((const uint8_t *)row + d),
                             _mm512_set1_ps(0x1p120f));
    default: return _mm512_loadu_ps((const float *)row + d);
    }
}

A5_IN void a5_row(cn_dtype dt, const char *row, int64_t Dh, float s, float *dst) {
    const __m512 vs = _mm512_set1_ps(s);
    int64_t d = 0;
    if (dt == CN_F32 && s == 1.0f) /* a copy: no multiply on the FMA ports */
        for (; d + 16 <= Dh; d += 16) _mm512_store_ps(dst + d, _mm512_loadu_ps((const float *)row + d));
    for (; d + 16 <= Dh; d += 16)
        _mm512_store_ps(dst + d, _mm512_mul_ps(a5_load16(dt, row, d), vs));
    for (; d < Dh; d++) dst[d] = ab_value(dt, row, d) * s;
    for (; d % 16; d++) dst[d] = 0;
}

#define AB_V __m512
#define AB_VW 16
#define AB_IN A5_IN
#define AB_SFX _a5
#define AB_LOAD(p) _mm512_load_ps(p)
#define AB_STORE(p, v) _mm512_store_ps(p, v)
#define AB_SET1(x) _mm512_set1_ps(x)
#define AB_ZERO _mm512_setzero_ps()
#define AB_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define AB_MAX(a, b) _mm512_max_ps(a, b)
#define AB_SUB(a, b) _mm512_sub_ps(a, b)
#define AB_MUL(a, b) _mm512_mul_ps(a, b)
#define AB_ADD(a, b) _mm512_add_ps(a, b)
#define AB_EXP(x) cpu_exp_le0_16(x)
#define AB_ANY_GT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define AB_ROW(dt, row, Dh, s, dst) a5_row(dt, row, Dh, s, dst)
#define AB_NVG 2
#define AB_KB(NV) ((NV) >= 2 ? 8 : 16)
#define AB_KBMAX 16
#define AB_LB 4
#define AB_DB 4
#define AB_PREFETCH(p) _mm_prefetch((const char *)(p), AB_HINT)
#include "tensor/cpu/cpu_att_block_body.h"

__attribute__((target(A5_ATTR))) void cpu_att_block_avx512(const cpu_att_blk *a) {
    ab_state st;
    const int L = a->nq * a->hb;
    if (L <= 16) ab_block_a5(a, &st, 1, AB_KB(1));
    else if (L <= 32) ab_block_a5(a, &st, 2, AB_KB(2));
    else ab_block_a5(a, &st, 4, AB_KB(4));
}

#else /* not x86: never picked (cpu_backend.c), the scalar kernel stands in */

void cpu_att_block_avx2(const cpu_att_blk *a) { cpu_att_block_scalar(a); }
void cpu_att_block_avx512(const cpu_att_blk *a) { cpu_att_block_scalar(a); }

#endif
