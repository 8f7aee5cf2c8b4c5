/* cuda_attention.cu - causal GQA attention without positional encoding on the GPU.
 *
 * Promises: one warp per (query, head) walks the keys 0..n_past+t in chunks of 32 (one key per
 * lane for the scores, then the chunk's values broadcast lane by lane), with a one-pass softmax
 * that subtracts the running maximum before every exp, as the CPU backend does; the accumulator
 * of head_dim values lives in registers (head_dim <= 256). Keys and values may be F32, BF16, F16
 * or F8_E4M3 rows (F8 with the tensor's scale). Split-K over long caches is a later increment.
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

#define ATT_WARPS 4
#define ATT_MAX_DH 256
#define ATT_PER_LANE (ATT_MAX_DH / 32)

typedef struct att_args {
    char *out;
    int64_t os;
    const char *q;
    int64_t qs;
    const char *k, *v;
    int64_t ks, vs;
    float kscale, vscale, scale;
    int T, n_past, Hq, group, Dh;
} att_args;

template <int KD, int VD>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(att_args a) {
    __shared__ float qsh[ATT_WARPS][ATT_MAX_DH];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t item = (int64_t)blockIdx.x * ATT_WARPS + wid; /* t * Hq + h */
    const bool active = item < (int64_t)a.T * a.Hq;
    const int t = active ? (int)(item / a.Hq) : 0, h = active ? (int)(item % a.Hq) : 0;
    const int kvh = h / a.group, Dh = a.Dh;
    if (active) {
        const float *qr = (const float *)(a.q + (int64_t)t * a.qs) + (int64_t)h * Dh;
        for (int d = lane; d < Dh; d += 32) qsh[wid][d] = qr[d];
    }
    __syncwarp();
    if (!active) return;
    float acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int64_t n_keys = (int64_t)a.n_past + t + 1;
    const int64_t koff = (int64_t)kvh * Dh * (KD == CN_F32 ? 4 : KD == CN_F8_E4M3 ? 1 : 2);
    const int64_t voff = (int64_t)kvh * Dh * (VD == CN_F32 ? 4 : VD == CN_F8_E4M3 ? 1 : 2);
    for (int64_t s0 = 0; s0 < n_keys; s0 += 32) {
        const int64_t s = s0 + lane;
        float sc = -INFINITY;
        if (s < n_keys) {
            const char *kr = a.k + s * a.ks + koff;
            float dot = 0.0f;
            for (int d = 0; d < Dh; d++) dot = fmaf(cu_wval<KD>(kr, d), qsh[wid][d], dot);
            sc = dot * a.kscale * a.scale;
        }
        const float cm = cu_warp_max(sc); /* finite: lane 0's key exists */
        const float mn = fmaxf(m, cm);
        const float corr = expf(m - mn); /* 0 on the first chunk */
        const float p = s < n_keys ? expf(sc - mn) : 0.0f;
        l = l * corr + cu_warp_sum(p);
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) acc[i] *= corr;
        const int nk = n_keys - s0 < 32 ? (int)(n_keys - s0) : 32;
        for (int j = 0; j < nk; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j) * a.vscale;
            const char *vr = a.v + (s0 + j) * a.vs + voff;
#pragma unroll
            for (int i = 0; i < ATT_PER_LANE; i++) {
                const int d = lane + 32 * i;
                if (d < Dh) acc[i] = fmaf(pj, cu_wval<VD>(vr, d), acc[i]);
            }
        }
        m = mn;
    }
    const float inv = 1.0f / l;
    float *orow = (float *)(a.out + (int64_t)t * a.os) + (int64_t)h * Dh;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < Dh) orow[d] = acc[i] * inv;
    }
}

template <int KD>
static int launch_v(cu_ctx *c, const att_args &a, cn_dtype vd, unsigned blocks) {
    switch (vd) {
    case CN_F32: k_attention<KD, CN_F32><<<blocks, ATT_WARPS * 32, 0, c->stream>>>(a); break;
    case CN_BF16: k_attention<KD, CN_BF16><<<blocks, ATT_WARPS * 32, 0, c->stream>>>(a); break;
    case CN_F16: k_attention<KD, CN_F16><<<blocks, ATT_WARPS * 32, 0, c->stream>>>(a); break;
    case CN_F8_E4M3:
        k_attention<KD, CN_F8_E4M3><<<blocks, ATT_WARPS * 32, 0, c->stream>>>(a);
        break;
    default: return CN_EUNSUPPORTED;
    }
    return cu_launch_check("attention");
}

int cu_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                 const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = q->shape[0], Dh = q->shape[1] / n_heads;
    if (Dh > ATT_MAX_DH) return CN_EUNSUPPORTED;
    if (T == 0) return CN_OK;
    att_args a;
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
    a.Hq = n_heads;
    a.group = n_heads / n_kv_heads;
    a.Dh = (int)Dh;
    const unsigned blocks = (unsigned)((T * n_heads + ATT_WARPS - 1) / ATT_WARPS);
    switch (kc->dtype) {
    case CN_F32: return launch_v<CN_F32>(c, a, vc->dtype, blocks);
    case CN_BF16: return launch_v<CN_BF16>(c, a, vc->dtype, blocks);
    case CN_F16: return launch_v<CN_F16>(c, a, vc->dtype, blocks);
    case CN_F8_E4M3: return launch_v<CN_F8_E4M3>(c, a, vc->dtype, blocks);
    default: return CN_EUNSUPPORTED;
    }
}
