/* cuda_attention_prefill.cu - causal GQA attention for many queries (prefill) on tensor cores.
 *
 * Promises: the same function as cuda_attention.cu's kernel (scores q.k * kscale * scale, keys
 * 0..n_past+t, one-pass softmax subtracting the running maximum before every exp, V with its
 * scale), computed flash-attention style: a CTA takes 64 queries of one head, walks the keys in
 * tiles of 32 held in shared memory as bf16 terms, and keeps scores, probabilities and the output
 * accumulator in registers (mma.sync m16n8k16). fp32 inputs (q, the cache values, the
 * probabilities) are split in two bf16 terms each (cuda_impl.h (4)); a product a.b is summed as
 * a1.b0 + a0.b1 + a0.b0 in fp32 (a1.b1, at most 2^-18 of a.b, is left out: the order of the
 * split's own error). Measured against the CPU backend in test_cuda_ops (2e-5).
 * Never: head_dim other than 64 or 128, or K and V caches of different dtypes (cu_fa_attention
 * returns CN_EUNSUPPORTED and the caller keeps its own kernel).
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

#define FA_BQ 64 /* queries per CTA: 4 warps x 16 rows */
#define FA_BK 32 /* keys per shared tile */

typedef struct fa_args {
    char *out;
    int64_t os;
    const char *q;
    int64_t qs;
    const char *k, *v;
    int64_t ks, vs;
    float kscale, vscale, scale;
    int T, n_past, group;
} fa_args;

__device__ __forceinline__ unsigned fa_u32(__nv_bfloat162 h) { return *(const unsigned *)&h; }

/* (x, y) -> bf16x2 terms hi, lo: x = hi.x + lo.x up to 2^-18 |x|, same for y. */
__device__ __forceinline__ void fa_split(float x, float y, unsigned &hi, unsigned &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    hi = fa_u32(h);
    lo = fa_u32(__floats2bfloat162_rn(x - hf.x, y - hf.y));
}

__device__ __forceinline__ void fa_ldsm4(unsigned r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void fa_ldsm4t(unsigned r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void fa_mma(float c[4], const unsigned a[4], const unsigned *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* c += a.b for split a (a[0] hi, a[1] lo) and b (b0 hi, b1 lo): small terms first. */
__device__ __forceinline__ void fa_mma3(float c[4], const unsigned a[2][4], const unsigned *b0,
                                        const unsigned *b1) {
    fa_mma(c, a[1], b0);
    fa_mma(c, a[0], b1);
    fa_mma(c, a[0], b0);
}

/* Eight cache values (scaled) of one row as two bf16 terms, 16 bytes each, into shared memory. */
template <int D>
__device__ __forceinline__ void fa_put8(const char *row, int d, float scale, bool ok,
                                        __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    __align__(16) unsigned h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float x = ok ? cu_wval<D>(row, d + 2 * i) * scale : 0.0f;
        const float y = ok ? cu_wval<D>(row, d + 2 * i + 1) * scale : 0.0f;
        fa_split(x, y, h[i], l[i]);
    }
    *(uint4 *)hi = *(const uint4 *)h;
    *(uint4 *)lo = *(const uint4 *)l;
}

template <int D, int DH>
__global__ void __launch_bounds__(128) k_fa(fa_args a) {
    cu_pdl_enter();
    constexpr int LD = DH + 8; /* bf16 per shared row: 8 ldmatrix rows hit distinct banks */
    constexpr int KC = DH / 16; /* k16 chunks of a head */
    constexpr int ESZ = D == CN_F32 ? 4 : D == CN_F8_E4M3 ? 1 : 2;
    __shared__ __align__(16) __nv_bfloat16 sk[2][FA_BK][LD];
    __shared__ __align__(16) __nv_bfloat16 sv[2][FA_BK][LD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, kvh = h / a.group;
    const int q0 = (int)blockIdx.x * FA_BQ;
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8; /* this thread's two query rows */
    /* the last key each row sees; rows past T (padding) see what the last query sees */
    const int64_t lim0 = (int64_t)a.n_past + (r0 < a.T ? r0 : a.T - 1);
    const int64_t lim1 = (int64_t)a.n_past + (r1 < a.T ? r1 : a.T - 1);
    const int q_last = q0 + FA_BQ < a.T ? q0 + FA_BQ - 1 : a.T - 1;
    const int64_t n_keys = (int64_t)a.n_past + q_last + 1;
    unsigned qa[KC][2][4]; /* A fragments of q: [k chunk][hi, lo][reg] */
#pragma unroll
    for (int c = 0; c < KC; c++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = (i & 1) ? r1 : r0, col = c * 16 + 2 * t4 + ((i & 2) ? 8 : 0);
            float x = 0.0f, y = 0.0f;
            if (row < a.T) {
                const float *qp = (const float *)(a.q + (int64_t)row * a.qs) + (int64_t)h * DH + col;
                x = qp[0];
                y = qp[1];
            }
            fa_split(x, y, qa[c][0][i], qa[c][1][i]);
        }
    float o[DH / 8][4];
#pragma unroll
    for (int nb = 0; nb < DH / 8; nb++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[nb][i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int64_t hoff = (int64_t)kvh * DH * ESZ;
    for (int64_t s0 = 0; s0 < n_keys; s0 += FA_BK) {
        for (int u = tid; u < FA_BK * DH / 8; u += 128) {
            const int kr = u / (DH / 8), d = (u % (DH / 8)) * 8;
            const int64_t key = s0 + kr;
            const bool ok = key < n_keys;
            fa_put8<D>(a.k + key * a.ks + hoff, d, a.kscale, ok, &sk[0][kr][d], &sk[1][kr][d]);
            fa_put8<D>(a.v + key * a.vs + hoff, d, a.vscale, ok, &sv[0][kr][d], &sv[1][kr][d]);
        }
        __syncthreads();
        /* scores: 16 rows x 32 keys per warp, four n8 blocks */
        float s[4][4];
#pragma unroll
        for (int nb = 0; nb < 4; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[nb][i] = 0.0f;
#pragma unroll
        for (int c = 0; c < KC; c++)
#pragma unroll
            for (int nb = 0; nb < 2; nb++) {
                unsigned b0[4], b1[4];
                const int kr = nb * 16 + (lane & 7) + ((lane >> 4) << 3), d = c * 16 + ((lane >> 3) & 1) * 8;
                fa_ldsm4(b0, &sk[0][kr][d]);
                fa_ldsm4(b1, &sk[1][kr][d]);
                fa_mma3(s[2 * nb], qa[c], b0, b1);
                fa_mma3(s[2 * nb + 1], qa[c], b0 + 2, b1 + 2);
            }
        /* causal mask and scale, then the running max of each row (over its quad) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < 4; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t key = s0 + nb * 8 + 2 * t4 + (i & 1);
                const float v = key <= (i < 2 ? lim0 : lim1) ? s[nb][i] * a.scale : -INFINITY;
                s[nb][i] = v;
                if (i < 2) mx0 = fmaxf(mx0, v);
                else mx1 = fmaxf(mx1, v);
            }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        /* finite: key 0 is in the first tile and every row sees it */
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = expf(m0 - mn0), c1 = expf(m1 - mn1); /* 0 on the first tile */
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int nb = 0; nb < 4; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = expf(s[nb][i] - (i < 2 ? mn0 : mn1)); /* masked: 0 */
                s[nb][i] = p;
                if (i < 2) ps0 += p;
                else ps1 += p;
            }
        l0 = l0 * c0 + ps0; /* this thread's columns; the quad's sum at the end */
        l1 = l1 * c1 + ps1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int nb = 0; nb < DH / 8; nb++) {
            o[nb][0] *= c0;
            o[nb][1] *= c0;
            o[nb][2] *= c1;
            o[nb][3] *= c1;
        }
        /* o += p V: p's accumulator layout is the A fragment of two adjacent key blocks */
#pragma unroll
        for (int c2 = 0; c2 < 2; c2++) {
            unsigned pa[2][4];
            fa_split(s[2 * c2][0], s[2 * c2][1], pa[0][0], pa[1][0]);
            fa_split(s[2 * c2][2], s[2 * c2][3], pa[0][1], pa[1][1]);
            fa_split(s[2 * c2 + 1][0], s[2 * c2 + 1][1], pa[0][2], pa[1][2]);
            fa_split(s[2 * c2 + 1][2], s[2 * c2 + 1][3], pa[0][3], pa[1][3]);
#pragma unroll
            for (int db = 0; db < DH / 16; db++) {
                unsigned b0[4], b1[4];
                const int kr = c2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, d = db * 16 + (lane >> 4) * 8;
                fa_ldsm4t(b0, &sv[0][kr][d]);
                fa_ldsm4t(b1, &sv[1][kr][d]);
                fa_mma3(o[2 * db], pa, b0, b1);
                fa_mma3(o[2 * db + 1], pa, b0 + 2, b1 + 2);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = hr ? r1 : r0;
        if (row >= a.T) continue;
        float *orow = (float *)(a.out + (int64_t)row * a.os) + (int64_t)h * DH;
        const float inv = hr ? inv1 : inv0;
#pragma unroll
        for (int nb = 0; nb < DH / 8; nb++) {
            orow[nb * 8 + 2 * t4] = o[nb][2 * hr] * inv;
            orow[nb * 8 + 2 * t4 + 1] = o[nb][2 * hr + 1] * inv;
        }
    }
}

template <int DH>
static int fa_launch(cu_ctx *c, const fa_args &a, cn_dtype d, dim3 grid) {
    switch (d) {
    case CN_F32: cu_launch(c, k_fa<CN_F32, DH>, grid, 128, 0, a); break;
    case CN_BF16: cu_launch(c, k_fa<CN_BF16, DH>, grid, 128, 0, a); break;
    case CN_F16: cu_launch(c, k_fa<CN_F16, DH>, grid, 128, 0, a); break;
    case CN_F8_E4M3: cu_launch(c, k_fa<CN_F8_E4M3, DH>, grid, 128, 0, a); break;
    default: return CN_EUNSUPPORTED;
    }
    return cu_launch_check("attention (tensor cores)");
}

int cu_fa_attention(cu_ctx *c, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                    const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale) {
    const int64_t T = q->shape[0], Dh = q->shape[1] / n_heads;
    if ((Dh != 64 && Dh != 128) || kc->dtype != vc->dtype || T > INT32_MAX - n_past) return CN_EUNSUPPORTED;
    if (n_heads > 65535 || n_kv_heads <= 0 || n_heads % n_kv_heads) return CN_EUNSUPPORTED;
    fa_args a;
    a.out = (char *)out->data;
    a.os = out->stride[0];
    a.q = (const char *)q->data;
    a.qs = q->stride[0];
    a.k = (const char *)kc->data;
    a.v = (const char *)vc->data;
    a.ks = kc->stride[0];
    a.vs = vc->stride[0];
    a.kscale = kc->dtype == CN_F8_E4M3 ? kc->scale : 1.0f;
    a.vscale = vc->dtype == CN_F8_E4M3 ? vc->scale : 1.0f;
    a.scale = scale;
    a.T = (int)T;
    a.n_past = n_past;
    a.group = n_heads / n_kv_heads;
    const dim3 grid((unsigned)((T + FA_BQ - 1) / FA_BQ), (unsigned)n_heads);
    return Dh == 64 ? fa_launch<64>(c, a, kc->dtype, grid) : fa_launch<128>(c, a, kc->dtype, grid);
}
