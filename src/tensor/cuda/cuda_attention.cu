/* cuda_attention.cu - causal GQA attention without positional encoding on the GPU.
 *
 * Promises: one warp per (query, head) walks the keys 0..n_past+t in chunks of 32 (the warp reads
 * each key row across its lanes and a transposing butterfly leaves one key's score per lane, then
 * the chunk's values are broadcast lane by lane), with a one-pass softmax
 * that subtracts the running maximum before every exp, as the CPU backend does; the accumulator
 * of head_dim values lives in registers (head_dim <= 256). Keys and values may be F32, BF16, F16
 * or F8_E4M3 rows (F8 with the tensor's scale).
 * Many queries (T * Hq >= ATT_SPLIT_MAX_ITEMS, prefill) go to the tensor-core kernel of
 * cuda_attention_prefill.cu when their shapes fit it, else to this one.
 * Split-K for few queries (decode, a speculative verify: T * Hq < ATT_SPLIT_MAX_ITEMS): the keys
 * are cut in spans of ATT_SPLIT_KEYS (doubled while that makes more than ATT_SPLIT_SPANS spans),
 * one warp per (query, head, span) writes its running max, sum and unnormalised accumulator to
 * scratch, and a second kernel merges the spans in order. A warp walks its span's chunks one
 * after the other, each a chain of dependent loads and shuffles: short spans keep that chain
 * short and spread a long cache over many blocks.
 * Those calls always take this path, with a single span too, so a decode step's graph keeps its
 * kernels as the cache grows (only the grid and the scratch change, cuda_backend.cu).
 * Inside a positioned step n_past is read on the device and the spans are the bucket's (the next
 * power of two): the spans past the real length are empty and the merge skips them, so the result
 * is the same as with the exact count, and one graph serves every position of the bucket
 * (cuda_impl.h invariant 5).
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

#define ATT_WARPS 4
#define ATT_MAX_DH 256
#define ATT_PER_LANE (ATT_MAX_DH / 32)
#define ATT_SPLIT_KEYS 64         /* keys per span of a split call, at least */
#define ATT_SPLIT_SPANS 256       /* spans of a split call, at most (longer spans beyond) */
#define ATT_SPLIT_MAX_ITEMS 2048  /* (query, head) pairs below which calls are split */

typedef struct att_args {
    char *out;
    int64_t os;
    const char *q;
    int64_t qs;
    const char *k, *v;
    int64_t ks, vs;
    float kscale, vscale, scale;
    int T, n_past, Hq, group, Dh;
    const int *pos; /* positioned step: n_past is *pos + n_past (cu_pos) */
    int spans;   /* split: spans of span_keys keys (gridDim.y); 0 when not split */
    int span_keys;
    float *part; /* split: [T*Hq][spans][Dh + 2] accumulator, then max and sum */
} att_args;

template <int KD, int VD>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(att_args a) {
    cu_pdl_enter();
    /* split: this block's span of keys; a span past a query's last key leaves an empty partial */
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
    const int64_t n_all = (int64_t)(a.pos ? *a.pos : 0) + a.n_past + t + 1;
    const int64_t s_lo = a.spans ? (int64_t)blockIdx.y * a.span_keys : 0;
    const int64_t n_keys = a.spans ? (s_lo + a.span_keys < n_all ? s_lo + a.span_keys : n_all)
                                   : n_all;
    const int64_t koff = (int64_t)kvh * Dh * (KD == CN_F32 ? 4 : KD == CN_F8_E4M3 ? 1 : 2);
    const int64_t voff = (int64_t)kvh * Dh * (VD == CN_F32 ? 4 : VD == CN_F8_E4M3 ? 1 : 2);
    float qv[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) qv[i] = lane + 32 * i < Dh ? qsh[wid][lane + 32 * i] : 0.0f;
    for (int64_t s0 = s_lo; s0 < n_keys; s0 += 32) {
        /* the chunk's 32 scores: the warp reads each key row coalesced (lane d, d + 32, ...), then
         * a transposing butterfly (31 shuffles) leaves key s0 + lane's dot product on this lane */
        float part[32];
#pragma unroll
        for (int j = 0; j < 32; j++) {
            float dj = 0.0f;
            if (s0 + j < n_keys) {
                const char *kr = a.k + (s0 + j) * a.ks + koff;
#pragma unroll
                for (int i = 0; i < ATT_PER_LANE; i++)
                    if (lane + 32 * i < Dh) dj = fmaf(cu_wval<KD>(kr, lane + 32 * i), qv[i], dj);
            }
            part[j] = dj;
        }
        const float dot = cu_warp_sum32(part, lane); /* key `lane`'s score */
        const int64_t s = s0 + lane;
        const float sc = s < n_keys ? dot * a.kscale * a.scale : -INFINITY;
        const float cm = cu_warp_max(sc); /* finite: lane 0's key exists */
        const float mn = fmaxf(m, cm);
        const float corr = expf(m - mn); /* 0 on the first chunk */
        const float p = s < n_keys ? expf(sc - mn) : 0.0f;
        l = l * corr + cu_warp_sum(p);
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) acc[i] *= corr;
        const int nk = n_keys - s0 < 32 ? (int)(n_keys - s0) : 32;
#pragma unroll 8 /* the value rows of 8 keys in flight: the loop is bound by their latency */
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
    if (a.spans) { /* m = -inf and l = 0 for an empty span */
        float *pr = a.part + (item * a.spans + blockIdx.y) * (int64_t)(Dh + 2);
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < Dh) pr[d] = acc[i];
        }
        if (lane == 0) {
            pr[Dh] = m;
            pr[Dh + 1] = l;
        }
        return;
    }
    const float inv = 1.0f / l;
    float *orow = (float *)(a.out + (int64_t)t * a.os) + (int64_t)h * Dh;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < Dh) orow[d] = acc[i] * inv;
    }
}

/* Merges the spans of one (query, head) per warp, in span order: the online softmax's rescaling
 * applied across spans. Span 0 always holds key 0, so the overall max is finite. The spans' max
 * and sum are read 32 at a time, one per lane, and their weights broadcast from there: the
 * accumulator rows' loads then depend on nothing loaded, so they stream instead of waiting one
 * span at a time on a loaded sum (at 8k keys, 256 spans, that chain was most of a decode step's
 * attention). The sums run in span order as before, so the result is the same. */
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention_merge(att_args a) {
    cu_pdl_enter();
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t item = (int64_t)blockIdx.x * ATT_WARPS + wid;
    if (item >= (int64_t)a.T * a.Hq) return;
    const int t = (int)(item / a.Hq), h = (int)(item % a.Hq), Dh = a.Dh;
    const int64_t rs = Dh + 2;
    const float *base = a.part + item * a.spans * rs;
    float M = -INFINITY;
    for (int sp = lane; sp < a.spans; sp += 32) M = fmaxf(M, base[sp * rs + Dh]);
    M = cu_warp_max(M);
    float acc[ATT_PER_LANE], L = 0.0f;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) acc[i] = 0.0f;
    for (int s0 = 0; s0 < a.spans; s0 += 32) {
        const int sp = s0 + lane;
        const float ml = sp < a.spans ? base[sp * rs + Dh + 1] : 0.0f;
        const float mw = ml != 0.0f ? expf(base[sp * rs + Dh] - M) : 0.0f;
        const int n = a.spans - s0 < 32 ? a.spans - s0 : 32;
#pragma unroll 4
        for (int j = 0; j < n; j++) {
            const float l = __shfl_sync(0xffffffffu, ml, j), w = __shfl_sync(0xffffffffu, mw, j);
            if (l == 0.0f) continue; /* an empty span */
            const float *pr = base + (s0 + j) * rs;
            L = fmaf(l, w, L);
#pragma unroll
            for (int i = 0; i < ATT_PER_LANE; i++) {
                const int d = lane + 32 * i;
                if (d < Dh) acc[i] = fmaf(pr[d], w, acc[i]);
            }
        }
    }
    const float inv = 1.0f / L;
    float *orow = (float *)(a.out + (int64_t)t * a.os) + (int64_t)h * Dh;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < Dh) orow[d] = acc[i] * inv;
    }
}

template <int KD>
static int launch_v(cu_ctx *c, const att_args &a, cn_dtype vd, unsigned blocks) {
    const dim3 grid(blocks, a.spans ? (unsigned)a.spans : 1u);
    switch (vd) {
    case CN_F32: cu_launch(c, k_attention<KD, CN_F32>, grid, ATT_WARPS * 32, 0, a); break;
    case CN_BF16: cu_launch(c, k_attention<KD, CN_BF16>, grid, ATT_WARPS * 32, 0, a); break;
    case CN_F16: cu_launch(c, k_attention<KD, CN_F16>, grid, ATT_WARPS * 32, 0, a); break;
    case CN_F8_E4M3:
        cu_launch(c, k_attention<KD, CN_F8_E4M3>, grid, ATT_WARPS * 32, 0, a);
        break;
    default: return CN_EUNSUPPORTED;
    }
    int rc = cu_launch_check("attention");
    if (rc || !a.spans) return rc;
    cu_launch(c, k_attention_merge, blocks, ATT_WARPS * 32, 0, a);
    return cu_launch_check("attention merge");
}

int cu_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                 const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = q->shape[0], Dh = q->shape[1] / n_heads;
    if (Dh > ATT_MAX_DH) return CN_EUNSUPPORTED;
    if (T == 0) return CN_OK;
    /* prefill: on tensor cores where it fits (not in a positioned step: its n_past is a value) */
    if (T * n_heads >= ATT_SPLIT_MAX_ITEMS && !c->positioned) {
        const int rc = cu_fa_attention(c, out, q, kc, vc, n_past, n_heads, n_kv_heads, scale);
        if (rc != CN_EUNSUPPORTED) return rc;
    }
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
    a.pos = cu_pos(c, n_past, &a.n_past);
    a.Hq = n_heads;
    a.group = n_heads / n_kv_heads;
    a.Dh = (int)Dh;
    a.spans = 0;
    a.span_keys = 0;
    a.part = NULL;
    if (T * n_heads < ATT_SPLIT_MAX_ITEMS) {
        int64_t keys = ATT_SPLIT_KEYS;
        while (((int64_t)n_past + T + keys - 1) / keys > ATT_SPLIT_SPANS) keys *= 2;
        int64_t spans = ((int64_t)n_past + T + keys - 1) / keys;
        if (a.pos) { /* the bucket, and the highest position it serves */
            int64_t p2 = 1;
            while (p2 < spans) p2 *= 2;
            spans = p2;
            const int64_t top = spans * keys - T - a.n_past;
            if (top < c->pos_max) c->pos_max = top;
        }
        if (spans > 65535) return CN_EUNSUPPORTED;
        a.spans = (int)spans;
        a.span_keys = (int)keys;
        a.part = (float *)cu_scratch(c, (size_t)(T * n_heads * spans * (Dh + 2)) * sizeof(float));
        if (!a.part) return CN_ENOMEM;
    }
    const unsigned blocks = (unsigned)((T * n_heads + ATT_WARPS - 1) / ATT_WARPS);
    switch (kc->dtype) {
    case CN_F32: return launch_v<CN_F32>(c, a, vc->dtype, blocks);
    case CN_BF16: return launch_v<CN_BF16>(c, a, vc->dtype, blocks);
    case CN_F16: return launch_v<CN_F16>(c, a, vc->dtype, blocks);
    case CN_F8_E4M3: return launch_v<CN_F8_E4M3>(c, a, vc->dtype, blocks);
    default: return CN_EUNSUPPORTED;
    }
}
