/* cpu_impl.h - private to src/tensor/cpu: the CPU backend's context, its SIMD kernel table and the
 * op entry points that cpu_backend.c puts in the iface table.
 *
 * Invariants:
 *  (1) Everything in cpu_ctx except `scratch` is written once at creation and read-only after:
 *      the SIMD choice (isa + kern), the E4M3 lookup table, the pool.
 *  (2) `scratch` is grown only by the thread that called the op (never inside a pool loop), and
 *      ops run one at a time per backend (backend.h: callers serialize), so one buffer suffices.
 *  (3) Every kernel computes each output with the same order of additions whatever the thread
 *      count or the row grouping, so results do not depend on n_threads.
 */
#ifndef CN_CPU_IMPL_H
#define CN_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "tensor/backend_impl.h"

enum cpu_isa { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2, CPU_ISA_AVX512 };

/* A weight matrix as the matmul kernels see it: rows of K values of `dtype`. */
typedef struct cpu_wmat {
    const char *data;  /* row n starts at data + n * stride */
    int64_t stride;    /* bytes */
    int64_t K;         /* values per row */
    cn_dtype dtype;    /* F32, BF16, F16, F8_E4M3, NVFP4 or MXFP8 */
    float scale;       /* multiplies every dot product: F8 per-tensor scale; NVFP4 global / 2
                        * (the kernels use 2 * e2m1, an integer); else 1 */
    const float *lut;  /* E4M3 code -> value, for the scalar path and tails */
    const uint8_t *bs; /* NVFP4: E4M3 scale per 16; MXFP8: E8M0 exponent per 32; else NULL */
    int64_t bs_stride; /* bytes between the block-scale rows of rows n and n + 1 */
    const float *lut8; /* E8M0 code -> 2^(code - 127) */
} cpu_wmat;

/* NVFP4 activations, quantized once per call (cpu_quant.c): each x row becomes, in KP = K rounded
 * up to 128 (padding zero), in the scalar and AVX2 layout:
 *   int8_t  q[KP]      round(x * 127 / amax) per block of 16 (amax of the block's |x|)
 *   float   d[KP / 4]  amax / 127 of the block holding values 4i..4i+3 (repeated per 4 values)
 *   int32_t c[KP / 4]  -12 * (q[4i] + .. + q[4i+3]): the correction that lets an unsigned weight
 *                      2 * e2m1 + 12 (0..24) multiply signed q (VNNI vpdpbusd is u8 x s8)
 * Lanes of 4 values are what one vpdpbusd int32 lane sums, at any vector width.
 * The AVX-512 VNNI layout (same q and d values; KV = K rounded up to 256, 1.5 * KV bytes, which
 * CPU_XQ_BYTES covers) gives each int32 lane one whole block of 16:
 *   int8_t  q[KV]      per 256 values at c0, four runs of 64 bytes (l < 16, m < 4):
 *                      q[c0 + 16l + 2m], q[c0 + 16l + 2m + 1], q[c0 + 16l + 8 + 2m],
 *                      q[c0 + 16l + 9 + 2m]
 *   float   d[KV / 16] amax / 127 of block i
 *   int32_t c[KV / 16] -12 * (q[16i] + .. + q[16i+15])
 * The kernel table's quant_nvfp4 writes the layout its mm_nvfp4 reads. */
#define CPU_XQ_KPAD(K) (((K) + 127) & ~(int64_t)127)
#define CPU_XQ_BYTES(K) (3 * CPU_XQ_KPAD(K))

/* Most x rows one matmul tile takes (each weight row loaded once is used for all of them). */
#define CPU_MM_ROWS 4
/* Weight rows of a prefill task run by mm_rows (the panel streams them past x rows held in L1). */
#define CPU_MM_PNB 64

/* One attention task of the vectorised path: hb query heads that share one kv head, one query,
 * keys [s0, s1). Cache row s of that kv head starts at k0 + s * k_stride (v0 likewise). Writes the
 * range's softmax pieces: per head h, m[h] = max score, l[h] = sum of exp(score - m[h]), and
 * o[h] = sum of exp(score - m[h]) * v (not normalised). */
typedef struct cpu_att_args {
    const float *q;      /* [hb][Dh], adjacent heads */
    float *o;            /* OUT: [hb][Dh], adjacent heads */
    float *m;            /* OUT: [hb] */
    double *l;           /* OUT: [hb] */
    int hb;              /* 1..CPU_ATT_HB */
    int64_t Dh;          /* 1..CPU_ATT_DMAX */
    int64_t s0, s1;      /* s0 < s1 */
    const char *k0, *v0; /* dtype F32, BF16, F16 or F8_E4M3 */
    int64_t k_stride, v_stride;
    cn_dtype kdt, vdt;
    float kscale, vscale; /* F8 per-tensor scales, else 1 */
    float scale;          /* of the scores */
} cpu_att_args;

/* One call of the tiled prefill kernel (cpu_att_block.c): nq consecutive queries at positions
 * pos0 .. pos0 + nq - 1, each over the same hb query heads of one kv head, against keys [s0, s1),
 * query i seeing those below pos0 + i + 1. Lane x = i * hb + h of the outputs is (query i, head
 * h): per lane the softmax pieces of cpu_att_args (o not normalised, m, l), over the keys that
 * lane sees; a query none of whose keys lies in [s0, s1) gets a lane of no meaning. */
typedef struct cpu_att_blk {
    const char *q;       /* query i's hb heads (adjacent, fp32) at q + i * q_stride */
    int64_t q_stride;    /* bytes */
    float *o;            /* OUT: [nq * hb][Dh] */
    float *m;            /* OUT: [nq * hb] */
    double *l;           /* OUT: [nq * hb] */
    int nq, hb;          /* nq * hb <= the table's att_block_lanes */
    int64_t Dh;          /* 1..CPU_ATT_DMAX */
    int64_t s0, s1;      /* s0 < s1 <= pos0 + nq */
    int64_t pos0;
    const char *k0, *v0; /* as cpu_att_args */
    int64_t k_stride, v_stride;
    cn_dtype kdt, vdt;
    float kscale, vscale;
    float scale;
} cpu_att_blk;

#define CPU_ATT_HB 16    /* query heads of one vectorised task: one per fp32 lane of a zmm */
#define CPU_ATT_DMAX 256 /* longest head the vectorised path takes (its scratch is on the stack) */
#define CPU_ATT_NB 4     /* argument sets one att_heads call steps together */

typedef struct cpu_kernels {
    /* yr[r][n] = scale * dot(w row n, xr[r]) for r < R (1..CPU_MM_ROWS), n in [n0, n1). */
    void (*mm_tile)(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                    int64_t n0, int64_t n1);
    /* BF16 prefill: mm_tile's outputs, bit for bit, for any number T of x rows and n1 - n0 <=
     * CPU_MM_PNB weight rows (NULL: cpu_matmul runs mm_tile over groups of CPU_MM_ROWS).
     * [pf, pf + pf_bytes) (pf NULL: none) is what the caller's next task reads: it is fetched
     * into L2 a line at a time while this call computes, so that the next task's first tile
     * does not wait on memory. With fetch_x, each tile of x rows is fetched into L2 while the
     * tile before it computes. Hints only: they never change a result. */
    void (*mm_rows)(const cpu_wmat *w, const float *const *xr, float *const *yr, int T,
                    int64_t n0, int64_t n1, const char *pf, int64_t pf_bytes, int fetch_x);
    /* scale * dot(row, x) over K values (row: one weight/cache row of w's dtype). */
    float (*dot_w)(const cpu_wmat *w, const char *row, const float *x);
    /* y[k] += a * scale * row[k] over K values. */
    void (*axpy_w)(const cpu_wmat *w, float a, const char *row, float *y);
    /* NVFP4: yr[r][n] = scale * sum over blocks b of (sum 2*e2m1 * q) * e4m3(bs[b]) * d[b],
     * xq[r] a quantized row (CPU_XQ_BYTES layout), r < R (1..CPU_MM_ROWS), n in [n0, n1). */
    void (*mm_nvfp4)(const cpu_wmat *w, const int8_t *const *xq, float *const *yr, int R,
                     int64_t n0, int64_t n1);
    /* Quantizes one activation row of K values (K % 16 == 0) into CPU_XQ_BYTES, in the layout
     * this table's mm_nvfp4 reads. The same q and d on every ISA (the same fp32 operations, max
     * is order-free). */
    void (*quant_nvfp4)(const float *x, int64_t K, int8_t *xq);
    /* MXFP8: as mm_tile, value = e4m3 * 2^(e8m0 - 127) per block of 32 (K % 32 == 0). */
    void (*mm_mxfp8)(const cpu_wmat *w, const float *const *xr, float *const *yr, int R,
                     int64_t n0, int64_t n1);
    /* Attention of one query over hb heads of one kv head, for n (1..CPU_ATT_NB) argument sets
     * over the same keys [s0, s1) stepped together, so that sets whose rows lie side by side
     * (adjacent kv heads) stream them once; each set gets the bits it gets alone (NULL:
     * cpu_attention's generic path, built on dot_w / axpy_w, is the one this ISA runs). */
    void (*att_heads)(const cpu_att_args *a, int n);
    /* The tiled prefill attention of one block (cpu_att_block.c); att_block_lanes is the most
     * nq * hb it takes (at least CPU_ATT_HB). NULL: the generic path. */
    void (*att_block)(const cpu_att_blk *a);
    int att_block_lanes;
    /* One row of a Mamba2 state: s[n] = s[n] * dA + dx * B[n] for n < N; returns sum s[n] * C[n]. */
    float (*ssm_row)(float *s, const float *B, const float *C, float dA, float dx, int64_t N);
    /* ssm_row for 8 consecutive rows s + i N, with dx[i], into out[i] (i < 8), N % 16 == 0: each
     * row gets the bits ssm_row gives it; the 8 run side by side instead of one latency chain
     * after another. (NULL: ssm_row row by row) */
    void (*ssm_rows8)(float *s, const float *B, const float *C, float dA, const float *dx,
                      int64_t N, float *out);
    /* ssm_row for 4 consecutive rows s + i N over 4 consecutive tokens u: B[u], C[u], dA[u],
     * dx[4 u + i] into out[4 u + i], N % 16 == 0. Token u's row i gets the bits ssm_row gives it
     * after tokens 0..u-1; the rows' state stays in registers across the 4 tokens, read and
     * written once instead of 4 times. (NULL: token by token) */
    void (*ssm_rows4x4)(float *s, const float *const *B, const float *const *C, const float *dA,
                        const float *dx, int64_t N, float *out);
    /* y[i] = silu(x[i]) = x[i] sigmoid(x[i]) for i < n, y may be x: the same bits on every ISA
     * (cpu_elementwise.c, cpu_exp.h). */
    void (*silu)(float *y, const float *x, int64_t n);
} cpu_kernels;

typedef struct cpu_ctx {
    cn_pool *pool;
    int n_threads;
    int isa;            /* enum cpu_isa actually used (CAIRN_CPU_SCALAR=1 forces scalar) */
    cpu_kernels kern;   /* kernels of `isa` */
    float e4m3_lut[256];
    float e8m0_lut[256]; /* 2^(code - 127); code 0 is the subnormal 2^-127; 255 is NaN */
    void *scratch;      /* invariant 2 */
    size_t scratch_cap; /* bytes */
} cpu_ctx;

static inline cpu_ctx *cpu_ctx_of(cn_backend *b) { return (cpu_ctx *)b->ctx; }

/* Returns scratch of at least `bytes` (64-byte aligned, contents undefined), or NULL on ENOMEM.
 * Valid until the next call. */
void *cpu_scratch(cpu_ctx *c, size_t bytes);

/* Runs fn over [0, n) on the pool, or inline when the total work is small. `work` is a rough
 * count of flops or bytes for the whole loop. */
void cpu_parallel(cpu_ctx *c, int n, int64_t work, cn_pool_fn fn, void *arg);
/* cpu_parallel for a row-wise op over activations a product just wrote (elementwise, norms,
 * expert combine): split only when there is far more work, since the rows the workers would take
 * must first travel to their cores; a speculative verify's few rows stay on the caller's. */
void cpu_parallel_rows(cpu_ctx *c, int n, int64_t work, cn_pool_fn fn, void *arg);

/* Pointer to the F32 value at (row r, col 0) of a 2D activation. */
static inline float *cpu_row(const cn_tensor *t, int64_t r) {
    return (float *)((char *)t->data + r * t->stride[0]);
}

/* Kernel tables, one per ISA (cpu_kernels.c); each ends by adding the block formats of that ISA
 * (cpu_quant.c). vnni: the CPU has AVX512_VNNI (the AVX-512 NVFP4 kernel needs it, else AVX2's). */
void cpu_kernels_scalar(cpu_kernels *k);
void cpu_kernels_avx2(cpu_kernels *k);
void cpu_kernels_avx512(cpu_kernels *k, int vnni);
void cpu_att_heads_avx512(const cpu_att_args *a, int n); /* cpu_attention.c */
void cpu_att_block_scalar(const cpu_att_blk *a);         /* cpu_att_block.c */
void cpu_att_block_avx2(const cpu_att_blk *a);           /* cpu_att_block.c */
void cpu_att_block_avx512(const cpu_att_blk *a);         /* cpu_att_block.c */
#define CPU_ATT_LANES 64 /* att_block_lanes of every table */
void cpu_silu_scalar(float *y, const float *x, int64_t n);  /* cpu_elementwise.c */
void cpu_silu_avx512(float *y, const float *x, int64_t n);  /* cpu_elementwise.c */
void cpu_quant_kernels_scalar(cpu_kernels *k);
void cpu_quant_kernels_avx2(cpu_kernels *k);
void cpu_quant_kernels_avx512(cpu_kernels *k, int vnni);

/* Decodes one weight value of the dense dtypes (F32, BF16, F16, F8_E4M3; not scaled). */
float cpu_wvalue(const cpu_wmat *w, const char *row, int64_t k);
/* Value n, k of a weight of any supported dtype, every scale applied. */
float cpu_wvalue_scaled(const cpu_wmat *w, int64_t n, int64_t k);

/* ---- ops (iface members) ---- */
int cpu_matmul(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x);
int cpu_matmul_gather(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                      const cn_tensor *x, const cn_tensor *ids);
int cpu_get_rows(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids);
int cpu_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps);
int cpu_gated_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                      const cn_tensor *w, int group, float eps);
int cpu_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
               const cn_tensor *bias, int silu, cn_tensor *state);
int cpu_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                 const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state);
int cpu_conv1d_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                    const cn_tensor *bias, int silu, cn_tensor *state, const cn_state_caps *caps);
int cpu_ssm_scan_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                      const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                      cn_tensor *state, const cn_state_caps *caps);
int cpu_ssm_scan_from(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                      const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                      cn_tensor *state, const cn_tensor *from);
int cpu_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                  const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale);
int cpu_attention_window(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *k_new,
                         const cn_tensor *v_new, const cn_tensor *ring_k, const cn_tensor *ring_v,
                         int n_past, int window, int n_heads, int n_kv_heads, float scale);
int cpu_moe_route(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                  const cn_tensor *bias, const cn_route_args *a);
int cpu_moe_combine(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights);
int cpu_add(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
int cpu_mul(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
int cpu_silu(cn_backend *b, cn_tensor *y, const cn_tensor *x);
int cpu_relu2(cn_backend *b, cn_tensor *y, const cn_tensor *x);
int cpu_scale(cn_backend *b, cn_tensor *y, const cn_tensor *x, float s);
int cpu_argmax(cn_backend *b, cn_tensor *ids, const cn_tensor *x);

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* 16 E4M3 codes -> fp32 of value * 2^-120, exactly: the sign-extended code << 20 puts the sign in
 * bit 31 and E4M3's exponent and mantissa in the low bits of fp32's (same field order; the bias
 * 127 against 7 is the 2^-120, and E4M3 subnormals land on fp32 subnormals of the same ratio);
 * the mask clears bits 27..30. */
static inline __attribute__((always_inline, target("avx512f"))) __m512
cpu_a5_e4m3_x2m120(const uint8_t *p) {
    __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32((int)0x87f00000u)));
}
#endif

#endif
