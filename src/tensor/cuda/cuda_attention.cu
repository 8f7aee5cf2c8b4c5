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
 * Split-K for few queries (decode, a speculative verify: T * Hq < ATT_SPLIT_MAX_ITEMS, keys and
 * values of one dtype): the keys are cut in spans of ATT_SPLIT_KEYS (doubled while that makes
 * more than ATT_SPLIT_SPANS spans). One block per (query, kv head, span) stages the span's keys
 * and values in shared memory once for all the query heads of the GQA group (nano's 16 read the
 * cache once, not 16 times), writes each head's running max, sum and unnormalised accumulator to
 * scratch, and a second kernel merges the spans, one block per (query, head), its warps summing
 * interleaved spans. Short spans keep each block's chain of loads short and spread a long cache
 * over many blocks.
 * Those calls always take this path, with a single span too, so a decode step's graph keeps its
 * kernels as the cache grows (only the grid and the scratch change, cuda_backend.cu).
 * Inside a positioned step n_past is read on the device and the spans are the bucket's (the next
 * power of two): the spans past the real length are empty and weigh 0 in the merge, so the result
 * is the same as with the exact count, and one graph serves every position of the bucket
 * (cuda_impl.h invariant 5).
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

#define ATT_WARPS 4
#define ATT_MAX_DH 256
#define ATT_PER_LANE (ATT_MAX_DH / 32)
#define ATT_SPLIT_SPANS 256       /* spans of a split call, at most (longer spans beyond) */
#define ATT_SPLIT_MAX_ITEMS 2048  /* (query, head) pairs below which calls are split */
#define ATT_CHUNK 32              /* keys a split block stages at a time: one per lane */
#define ATT_SPLIT_KEYS ATT_CHUNK  /* keys per span of a split call, at least */
#define ATT_HPW 4                 /* query heads per warp of a split block */
#define ATT_GROUP_HEADS (ATT_WARPS * ATT_HPW) /* query heads per split block */
#define ATT_MERGE_WARPS 8         /* warps of a merge block, each summing every 8th span */
/* a positioned step's bucket (spans rounded up to a power of two) stays within the merge's
 * shared arrays of ATT_SPLIT_SPANS */
static_assert((ATT_SPLIT_SPANS & (ATT_SPLIT_SPANS - 1)) == 0, "ATT_SPLIT_SPANS: a power of two");

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

/* The keys of a (query, head) walked by one warp, all of them (many queries: no split). */
template <int KD, int VD>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(att_args a) {
    cu_pdl_enter();
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
    const int64_t n_keys = (int64_t)(a.pos ? *a.pos : 0) + a.n_past + t + 1;
    const int64_t koff = (int64_t)kvh * Dh * (KD == CN_F32 ? 4 : KD == CN_F8_E4M3 ? 1 : 2);
    const int64_t voff = (int64_t)kvh * Dh * (VD == CN_F32 ? 4 : VD == CN_F8_E4M3 ? 1 : 2);
    float qv[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) qv[i] = lane + 32 * i < Dh ? qsh[wid][lane + 32 * i] : 0.0f;
    for (int64_t s0 = 0; s0 < n_keys; s0 += 32) {
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
    const float inv = 1.0f / l;
    float *orow = (float *)(a.out + (int64_t)t * a.os) + (int64_t)h * Dh;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < Dh) orow[d] = acc[i] * inv;
    }
}

/* Rows [s0, s0 + ATT_CHUNK) of a cache (F32, BF16, F16 or F8_E4M3: dt) at column offset col,
 * as f32 into tile[ATT_CHUNK][ld], zero past n_keys and past Dh (to Dh4). Warp w fills rows w,
 * w + ATT_WARPS, ...; the loads of a pass of rows are all issued before its first store. */
template <int DT, int DPL>
__device__ __forceinline__ void att_tile_load(float *tile, int ld, const char *base, int64_t rs,
                                              int64_t col, int64_t s0, int64_t n_keys, int Dh,
                                              int Dh4, int lane, int wid) {
    constexpr int R = ATT_CHUNK / ATT_WARPS, RP = DPL > 4 ? R / 2 : R; /* rows per pass */
#pragma unroll
    for (int r0 = 0; r0 < R; r0 += RP) {
        float v[RP][DPL];
#pragma unroll
        for (int r = 0; r < RP; r++) {
            const int64_t s = s0 + wid + (r0 + r) * ATT_WARPS;
            const char *row = base + s * rs;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                const int d = lane + 32 * i;
                v[r][i] = s < n_keys && d < Dh ? cu_wval<DT>(row, col + d) : 0.0f;
            }
        }
#pragma unroll
        for (int r = 0; r < RP; r++)
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                const int d = lane + 32 * i;
                if (d < Dh4) tile[(wid + (r0 + r) * ATT_WARPS) * ld + d] = v[r][i];
            }
    }
}

/* Split-K for few queries: one block per (query, kv head, batch of up to ATT_GROUP_HEADS of its
 * query heads, span). The block stages each chunk of ATT_CHUNK keys and values once in shared
 * memory as f32 and every query head of the batch reads it there, so a GQA group reads the cache
 * once instead of once per head. Keys and values share the dtype DT (a cache of mixed dtypes takes
 * k_attention). Warp w owns heads w*ATT_HPW.. of the batch: lane j scores key j
 * for each of them (the key tile padded to Dh4 + 1 floats a row, so the lanes' rows fall in
 * different banks), then the online softmax and the value rows as in k_attention. Writes each
 * head's running max, sum and unnormalised accumulator for k_attention_merge. */
template <int DT, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention_split(att_args a) {
    cu_pdl_enter();
    extern __shared__ float att_smem[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int Dh = a.Dh, Dh4 = (Dh + 3) & ~3, Hkv = a.Hq / a.group;
    const int nbatch = (a.group + ATT_GROUP_HEADS - 1) / ATT_GROUP_HEADS;
    const int batch = blockIdx.x % nbatch, kvh = (blockIdx.x / nbatch) % Hkv;
    const int t = blockIdx.x / (nbatch * Hkv);
    const int hb = kvh * a.group + batch * ATT_GROUP_HEADS; /* the batch's first head */
    const int nh = min(ATT_GROUP_HEADS, a.group - batch * ATT_GROUP_HEADS);
    float *qs = att_smem;                          /* [ATT_GROUP_HEADS][Dh4] */
    float *ks = qs + ATT_GROUP_HEADS * Dh4;        /* [ATT_CHUNK][Dh4 + 1] */
    float *vs = ks + ATT_CHUNK * (Dh4 + 1);        /* [ATT_CHUNK][Dh4] */
    const float *qr = (const float *)(a.q + (int64_t)t * a.qs) + (int64_t)hb * Dh;
    for (int i = threadIdx.x; i < ATT_GROUP_HEADS * Dh4; i += ATT_WARPS * 32) {
        const int hh = i / Dh4, d = i % Dh4;
        qs[i] = hh < nh && d < Dh ? qr[hh * Dh + d] : 0.0f;
    }
    const int64_t n_all = (int64_t)(a.pos ? *a.pos : 0) + a.n_past + t + 1;
    const int64_t s_lo = (int64_t)blockIdx.y * a.span_keys;
    const int64_t n_keys = s_lo + a.span_keys < n_all ? s_lo + a.span_keys : n_all;
    const int64_t col = (int64_t)kvh * Dh;
    float acc[ATT_HPW][DPL], m[ATT_HPW], l[ATT_HPW];
#pragma unroll
    for (int hh = 0; hh < ATT_HPW; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[hh][i] = 0.0f;
    }
    const float *qw = qs + wid * ATT_HPW * Dh4;
    for (int64_t s0 = s_lo; s0 < n_keys; s0 += ATT_CHUNK) {
        __syncthreads(); /* the previous chunk's tiles are read */
        att_tile_load<DT, DPL>(ks, Dh4 + 1, a.k, a.ks, col, s0, n_keys, Dh, Dh4, lane, wid);
        att_tile_load<DT, DPL>(vs, Dh4, a.v, a.vs, col, s0, n_keys, Dh, Dh4, lane, wid);
        __syncthreads();
        float dot[ATT_HPW];
#pragma unroll
        for (int hh = 0; hh < ATT_HPW; hh++) dot[hh] = 0.0f;
        const float *kr = ks + lane * (Dh4 + 1);
#pragma unroll 2
        for (int d = 0; d < Dh4; d += 4) {
            const float k0 = kr[d], k1 = kr[d + 1], k2 = kr[d + 2], k3 = kr[d + 3];
#pragma unroll
            for (int hh = 0; hh < ATT_HPW; hh++) {
                const float4 q4 = *(const float4 *)(qw + hh * Dh4 + d);
                dot[hh] = fmaf(q4.x, k0, fmaf(q4.y, k1, fmaf(q4.z, k2, fmaf(q4.w, k3, dot[hh]))));
            }
        }
        const int64_t s = s0 + lane;
        const int nk = n_keys - s0 < ATT_CHUNK ? (int)(n_keys - s0) : ATT_CHUNK;
        float p[ATT_HPW];
#pragma unroll
        for (int hh = 0; hh < ATT_HPW; hh++) {
            const float sc = s < n_keys ? dot[hh] * a.kscale * a.scale : -INFINITY;
            const float mn = fmaxf(m[hh], cu_warp_max(sc)); /* finite: lane 0's key exists */
            const float corr = expf(m[hh] - mn);            /* 0 on the first chunk */
            p[hh] = s < n_keys ? expf(sc - mn) : 0.0f;
            l[hh] = l[hh] * corr + cu_warp_sum(p[hh]);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[hh][i] *= corr;
            m[hh] = mn;
        }
#pragma unroll 4
        for (int j = 0; j < nk; j++) {
            const float *vr = vs + j * Dh4;
            float vv[DPL];
#pragma unroll
            for (int i = 0; i < DPL; i++) vv[i] = lane + 32 * i < Dh4 ? vr[lane + 32 * i] : 0.0f;
#pragma unroll
            for (int hh = 0; hh < ATT_HPW; hh++) {
                const float pj = __shfl_sync(0xffffffffu, p[hh], j) * a.vscale;
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[hh][i] = fmaf(pj, vv[i], acc[hh][i]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < ATT_HPW; hh++) { /* m = -inf and l = 0 for an empty span */
        const int hl = wid * ATT_HPW + hh;
        if (hl >= nh) break;
        const int64_t item = (int64_t)t * a.Hq + hb + hl;
        float *pr = a.part + (item * a.spans + blockIdx.y) * (int64_t)(Dh + 2);
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < Dh) pr[d] = acc[hh][i];
        }
        if (lane == 0) {
            pr[Dh] = m[hh];
            pr[Dh + 1] = l[hh];
        }
    }
}

/* Merges the spans of one (query, head) per block: the online softmax's rescaling applied across
 * spans. Span 0 always holds key 0, so the overall max is finite. Each span's weight exp(m - M)
 * is computed once into shared memory; then warp w sums the accumulator rows of spans w,
 * w + ATT_MERGE_WARPS, ..., whose loads depend on nothing loaded and so stream, and the warps'
 * sums are added in warp order. An empty span has weight 0 and a zero accumulator. */
__global__ void __launch_bounds__(ATT_MERGE_WARPS * 32) k_attention_merge(att_args a) {
    cu_pdl_enter();
    __shared__ float wsh[ATT_SPLIT_SPANS], lw[ATT_SPLIT_SPANS];
    __shared__ float red[ATT_MERGE_WARPS][ATT_MAX_DH + 1];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t item = blockIdx.x; /* t * Hq + h */
    const int t = (int)(item / a.Hq), h = (int)(item % a.Hq), Dh = a.Dh;
    const int64_t rs = Dh + 2;
    const float *base = a.part + item * a.spans * rs;
    float M = -INFINITY;
    for (int sp = lane; sp < a.spans; sp += 32) M = fmaxf(M, base[sp * rs + Dh]);
    M = cu_warp_max(M); /* every warp finds the same max */
    for (int sp = threadIdx.x; sp < a.spans; sp += ATT_MERGE_WARPS * 32) {
        const float l = base[sp * rs + Dh + 1], w = l != 0.0f ? expf(base[sp * rs + Dh] - M) : 0.0f;
        wsh[sp] = w;
        lw[sp] = l * w;
    }
    __syncthreads();
    float acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) acc[i] = 0.0f;
#pragma unroll 4
    for (int sp = wid; sp < a.spans; sp += ATT_MERGE_WARPS) {
        const float w = wsh[sp];
        const float *pr = base + sp * rs;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < Dh) acc[i] = fmaf(pr[d], w, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < Dh) red[wid][d] = acc[i];
    }
    if (wid == 0) { /* the sum of weights: lane j adds spans j, j + 32, ..., then a fixed tree */
        float L = 0.0f;
        for (int sp = lane; sp < a.spans; sp += 32) L += lw[sp];
        L = cu_warp_sum(L);
        if (lane == 0) red[0][ATT_MAX_DH] = L;
    }
    __syncthreads();
    if (wid) return;
    const float inv = 1.0f / red[0][ATT_MAX_DH];
    float *orow = (float *)(a.out + (int64_t)t * a.os) + (int64_t)h * Dh;
    for (int d = lane; d < Dh; d += 32) {
        float v = 0.0f;
        for (int w = 0; w < ATT_MERGE_WARPS; w++) v += red[w][d];
        orow[d] = v * inv;
    }
}

template <int KD>
static int launch_v(cu_ctx *c, const att_args &a, cn_dtype vd, unsigned blocks) {
    switch (vd) {
    case CN_F32: cu_launch(c, k_attention<KD, CN_F32>, blocks, ATT_WARPS * 32, 0, a); break;
    case CN_BF16: cu_launch(c, k_attention<KD, CN_BF16>, blocks, ATT_WARPS * 32, 0, a); break;
    case CN_F16: cu_launch(c, k_attention<KD, CN_F16>, blocks, ATT_WARPS * 32, 0, a); break;
    case CN_F8_E4M3:
        cu_launch(c, k_attention<KD, CN_F8_E4M3>, blocks, ATT_WARPS * 32, 0, a);
        break;
    default: return CN_EUNSUPPORTED;
    }
    return cu_launch_check("attention");
}

/* The split kernel of dtype DT for heads of Dh4 values: 4 or 8 of them per lane. */
template <int DT> static void (*split_kernel(int Dh4))(att_args) {
    return Dh4 <= 128 ? k_attention_split<DT, 4> : k_attention_split<DT, 8>;
}

/* The split kernel for the cache's dtype and a.Dh, its shared memory raised past the 48 KiB
 * default where it needs more, then the merge. */
static int launch_split(cu_ctx *c, const att_args &a, cn_dtype dt) {
    const int Dh4 = (a.Dh + 3) & ~3, Hkv = a.Hq / a.group;
    const int nbatch = (a.group + ATT_GROUP_HEADS - 1) / ATT_GROUP_HEADS;
    const size_t smem =
        (size_t)(ATT_GROUP_HEADS * Dh4 + ATT_CHUNK * (Dh4 + 1) + ATT_CHUNK * Dh4) * sizeof(float);
    const dim3 grid((unsigned)(a.T * Hkv * nbatch), (unsigned)a.spans);
    void (*k)(att_args) = NULL;
    switch (dt) {
    case CN_F32: k = split_kernel<CN_F32>(Dh4); break;
    case CN_BF16: k = split_kernel<CN_BF16>(Dh4); break;
    case CN_F16: k = split_kernel<CN_F16>(Dh4); break;
    case CN_F8_E4M3: k = split_kernel<CN_F8_E4M3>(Dh4); break;
    default: return CN_EUNSUPPORTED;
    }
    if (smem > 48 * 1024) {
        const int rc = cu_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)smem),
                                "attention shared memory");
        if (rc) return rc;
    }
    cu_launch(c, k, grid, ATT_WARPS * 32, smem, a);
    int rc = cu_launch_check("attention");
    if (rc) return rc;
    cu_launch(c, k_attention_merge, (unsigned)(a.T * a.Hq), ATT_MERGE_WARPS * 32, 0, a);
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
    if (T * n_heads < ATT_SPLIT_MAX_ITEMS && kc->dtype == vc->dtype) {
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
        a.spans = (int)spans; /* <= ATT_SPLIT_SPANS, the bucket too */
        a.span_keys = (int)keys;
        a.part = (float *)cu_scratch(c, (size_t)(T * n_heads * spans * (Dh + 2)) * sizeof(float));
        if (!a.part) return CN_ENOMEM;
    }
    if (a.spans) return launch_split(c, a, kc->dtype);
    const unsigned blocks = (unsigned)((T * n_heads + ATT_WARPS - 1) / ATT_WARPS);
    switch (kc->dtype) {
    case CN_F32: return launch_v<CN_F32>(c, a, vc->dtype, blocks);
    case CN_BF16: return launch_v<CN_BF16>(c, a, vc->dtype, blocks);
    case CN_F16: return launch_v<CN_F16>(c, a, vc->dtype, blocks);
    case CN_F8_E4M3: return launch_v<CN_F8_E4M3>(c, a, vc->dtype, blocks);
    default: return CN_EUNSUPPORTED;
    }
}
