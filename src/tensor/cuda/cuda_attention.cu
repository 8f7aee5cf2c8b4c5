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
 * values of one dtype, rows a multiple of 4 bytes): the keys are cut in chunks of ATT_CHUNK and
 * the chunks in spans that differ by one chunk at most, as many spans as chunks rounded up to a
 * power of two but no more than one wave of blocks fills the device (longer spans beyond). One
 * block per (query, kv head, span) copies its chunks' keys and values into shared memory by
 * cp.async, all its key groups' chunks in flight at once, for all the query heads of the GQA
 * group (nano's 16 read the cache once, not 16 times); it combines its groups' running maxima,
 * sums and accumulators and writes one row per head to scratch, and a second kernel merges the
 * spans, one block per (query, head), after one round of loads. Why balanced spans and every
 * chunk in flight: with a fixed 256 spans (half of them empty at 8k) and each chunk loaded after
 * the one before, the split and the merge took 14 and 15 us per attention layer on the H200;
 * these take 10.2 and about 3 (tools/kprof.c, PDL off).
 * Those calls always take this path, with a single span too, so a decode step's graph keeps its
 * kernels as the cache grows (only the grid and the scratch change, cuda_backend.cu).
 * Inside a positioned step n_past is read on the device and the spans are the bucket's (the
 * chunks' power of two, or the most spans): a span's chunks come from the real length, spans
 * without chunks weigh 0 in the merge, and the call outside a step with the same length cuts the
 * same spans, so the result is the same bit for bit and one graph serves every position of the
 * bucket (cuda_impl.h invariant 5).
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

#define ATT_WARPS 4
#define ATT_MAX_DH 256
#define ATT_PER_LANE (ATT_MAX_DH / 32)
#define ATT_SPLIT_SPANS 256       /* spans of a split call, at most (a merge thread each) */
#define ATT_SPLIT_MAX_ITEMS 2048  /* (query, head) pairs below which calls are split */
#define ATT_CHUNK 32              /* keys a key group stages at a time: one per lane */
#define ATT_HPW 4                 /* query heads per warp of a split block */
#define ATT_GW 4                  /* warps of a split block's key group */
#define ATT_GROUP_HEADS (ATT_GW * ATT_HPW) /* query heads per split block */
#define ATT_MERGE_WARPS 8         /* warps of a merge block, each summing every 8th span */
#define ATT_MERGE_ROWS 8          /* spans a merge warp loads before the max is known */
static_assert(ATT_SPLIT_SPANS == ATT_MERGE_WARPS * 32, "a merge thread per span's max and sum");
static_assert(ATT_HPW == 4, "a warp's probabilities of one key are one float4");

/* Bytes of one cache value of dtype DT (F32, BF16, F16 or F8_E4M3). */
template <int DT> __host__ __device__ constexpr int att_esize() {
    return DT == CN_F32 ? 4 : DT == CN_F8_E4M3 ? 1 : 2;
}

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
    int spans;   /* split: spans (gridDim.y); 0 when not split */
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
    const int64_t koff = (int64_t)kvh * Dh * att_esize<KD>();
    const int64_t voff = (int64_t)kvh * Dh * att_esize<VD>();
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

/* One granule of G bytes from global src to shared dst by cp.async (bytes 0: zeros, nothing
 * read); 16-byte granules bypass L1 (cp.async.cg takes only 16). */
template <int G>
__device__ __forceinline__ void att_cp(unsigned dst, const char *src, int bytes) {
    if (G == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(G),
                     "r"(bytes));
}

/* Four consecutive cache values of dtype DT at p (shared memory, 4-value aligned) as f32. */
template <int DT> __device__ __forceinline__ float4 att_ld4(const char *p) {
    if (DT == CN_F32) return *(const float4 *)p;
    if (DT == CN_F8_E4M3) {
        const unsigned u = *(const unsigned *)p;
        return make_float4(cu_e4m3(u & 0xffu), cu_e4m3((u >> 8) & 0xffu), cu_e4m3((u >> 16) & 0xffu),
                           cu_e4m3(u >> 24));
    }
    const uint2 u = *(const uint2 *)p;
    if (DT == CN_BF16)
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    const float2 lo = __half22float2(*(const __half2 *)&u.x), hi = __half22float2(*(const __half2 *)&u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

/* The shared-memory layout of a split block (bytes): the batch's queries, then per key group its
 * key tile (rows padded by 16 bytes, so the lanes' 16-byte reads of their own rows fall in
 * different banks), value tile and per warp its heads' probabilities ([key][ATT_HPW]). After the
 * keys the groups' tiles hold their (m, l, accumulator) rows for the block's combine. */
struct att_smem_plan {
    int kp, vp;       /* key and value tile row pitch, bytes */
    int group_bytes;  /* a key group's tiles and probabilities */
    int q_bytes;      /* [ATT_GROUP_HEADS][Dh4] f32 */
};
__host__ __device__ __forceinline__ att_smem_plan att_plan(int Dh4, int es) {
    att_smem_plan p;
    p.vp = (Dh4 * es + 15) & ~15;
    p.kp = p.vp + 16;
    p.group_bytes = ATT_CHUNK * (p.kp + p.vp) + ATT_GW * ATT_CHUNK * ATT_HPW * 4;
    p.q_bytes = ATT_GROUP_HEADS * Dh4 * 4;
    return p;
}
/* key groups a split block of DPL values per lane runs: its threads and shared memory */
template <int DPL> __host__ __device__ constexpr int att_groups() { return DPL > 4 ? 2 : 4; }

/* Split-K for few queries: one block per (query, kv head, batch of up to ATT_GROUP_HEADS of its
 * query heads, span). A span is chunks [y*C/S, (y+1)*C/S) of the query's C = ceil(n/ATT_CHUNK)
 * chunks of ATT_CHUNK keys (n read on the device inside a positioned step), so the spans of a
 * call differ by one chunk at most whatever n is. The block's KG key groups of ATT_GW warps take
 * its chunks in turn (group g: the span's chunks g, g + KG, ...), each staging its chunk's keys
 * and values by cp.async into its own tiles (all groups' copies in flight at once) and keeping
 * its own online softmax; warp w of a group owns heads w*ATT_HPW.. of the batch: lane j scores
 * key j for each of them, then each lane adds the chunk's value rows into its 4 consecutive
 * values per 128 (16-byte reads, the probabilities broadcast from shared memory). The groups'
 * maxima, sums and accumulators are then combined in group order and written, one row per head,
 * for k_attention_merge. G: the copy granule in bytes (16 or 4: what the rows' size, strides
 * and addresses allow, att_granule). */
template <int DT, int DPL, int G>
__global__ void __launch_bounds__(att_groups<DPL>() * ATT_GW * 32, 1) k_attention_split(att_args a) {
    constexpr int KG = att_groups<DPL>(), NT = KG * ATT_GW * 32, GT = ATT_GW * 32;
    constexpr int es = att_esize<DT>();
    extern __shared__ __align__(16) char att_sm[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = wid / ATT_GW, gw = wid % ATT_GW;
    const int gt = threadIdx.x % GT; /* thread within its group */
    const int Dh = a.Dh, Dh4 = (Dh + 3) & ~3, Hkv = a.Hq / a.group;
    const att_smem_plan pl = att_plan(Dh4, es);
    const int nbatch = (a.group + ATT_GROUP_HEADS - 1) / ATT_GROUP_HEADS;
    const int batch = blockIdx.x % nbatch, kvh = (blockIdx.x / nbatch) % Hkv;
    const int t = blockIdx.x / (nbatch * Hkv);
    const int hb = kvh * a.group + batch * ATT_GROUP_HEADS; /* the batch's first head */
    const int nh = min(ATT_GROUP_HEADS, a.group - batch * ATT_GROUP_HEADS);
    float *qs = (float *)att_sm;
    char *kt = att_sm + pl.q_bytes + g * pl.group_bytes, *vt = kt + ATT_CHUNK * pl.kp;
    float4 *pw = (float4 *)(vt + ATT_CHUNK * pl.vp) + gw * ATT_CHUNK;
    const int rb = Dh * es; /* bytes of a row a chunk copies */
    if (rb < Dh4 * es) /* the pad values of Dh4 no copy writes: zero, as the queries' are */
        for (int i = threadIdx.x; i < KG * ATT_CHUNK * 2 * (Dh4 * es - rb); i += NT) {
            const int per = Dh4 * es - rb, row = i / per, gg = row / (2 * ATT_CHUNK);
            const int r = row % (2 * ATT_CHUNK);
            char *base = att_sm + pl.q_bytes + gg * pl.group_bytes;
            base += r < ATT_CHUNK ? r * pl.kp : ATT_CHUNK * pl.kp + (r - ATT_CHUNK) * pl.vp;
            base[rb + i % per] = 0;
        }
    cu_pdl_enter();
    const int64_t n_all = (int64_t)(a.pos ? *a.pos : 0) + a.n_past + t + 1;
    const int64_t C = (n_all + ATT_CHUNK - 1) / ATT_CHUNK;
    const int64_t c0 = blockIdx.y * C / a.spans, c1 = (blockIdx.y + 1) * C / a.spans;
    const int64_t col = (int64_t)kvh * rb;
    const int gpr = rb / G; /* granules a row */
    const unsigned kt_s = (unsigned)__cvta_generic_to_shared(kt), vt_s = (unsigned)__cvta_generic_to_shared(vt);
    auto stage = [&](int64_t c) { /* chunk c's rows into the group's tiles; zeros past n_all */
        for (int i = gt; i < ATT_CHUNK * gpr; i += GT) {
            const int r = i / gpr, o = (i % gpr) * G;
            const int64_t s = c * ATT_CHUNK + r;
            const int n = s < n_all ? G : 0; /* an empty copy reads nothing: row 0 stands in */
            const int64_t sr = n ? s : 0;
            att_cp<G>(kt_s + r * pl.kp + o, a.k + sr * a.ks + col + o, n);
            att_cp<G>(vt_s + r * pl.vp + o, a.v + sr * a.vs + col + o, n);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    int64_t c = c0 + g;
    if (c < c1) stage(c);
    const float *qr = (const float *)(a.q + (int64_t)t * a.qs) + (int64_t)hb * Dh;
#pragma unroll 4
    for (int i = threadIdx.x; i < ATT_GROUP_HEADS * Dh4; i += NT) {
        const int hh = i / Dh4, d = i % Dh4;
        qs[i] = hh < nh && d < Dh ? qr[hh * Dh + d] : 0.0f;
    }
    __syncthreads();
    float acc[ATT_HPW][DPL], m[ATT_HPW], l[ATT_HPW];
#pragma unroll
    for (int hh = 0; hh < ATT_HPW; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[hh][i] = 0.0f;
    }
    const float *qw = qs + gw * ATT_HPW * Dh4;
    const float sscale = a.kscale * a.scale;
    for (; c < c1; c += KG) {
        asm volatile("cp.async.wait_all;\n" ::);
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + g), "n"(GT) : "memory"); /* the chunk landed */
        float dot[ATT_HPW];
#pragma unroll
        for (int hh = 0; hh < ATT_HPW; hh++) dot[hh] = 0.0f;
        const char *kr = kt + lane * pl.kp;
#pragma unroll 4
        for (int d = 0; d < Dh4; d += 4) {
            const float4 k4 = att_ld4<DT>(kr + d * es);
#pragma unroll
            for (int hh = 0; hh < ATT_HPW; hh++) {
                const float4 q4 = *(const float4 *)(qw + hh * Dh4 + d);
                dot[hh] = fmaf(q4.w, k4.w, fmaf(q4.z, k4.z, fmaf(q4.y, k4.y, fmaf(q4.x, k4.x, dot[hh]))));
            }
        }
        const int64_t s = c * ATT_CHUNK + lane;
        const int nk = n_all - c * ATT_CHUNK < ATT_CHUNK ? (int)(n_all - c * ATT_CHUNK) : ATT_CHUNK;
        float p[ATT_HPW];
#pragma unroll
        for (int hh = 0; hh < ATT_HPW; hh++) {
            const float sc = s < n_all ? dot[hh] * sscale : -INFINITY;
            const float mn = fmaxf(m[hh], cu_warp_max(sc)); /* finite: lane 0's key exists */
            const float corr = expf(m[hh] - mn);            /* 0 on the group's first chunk */
            p[hh] = s < n_all ? expf(sc - mn) : 0.0f;
            l[hh] = l[hh] * corr + cu_warp_sum(p[hh]);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[hh][i] *= corr;
            m[hh] = mn;
        }
        pw[lane] = make_float4(p[0] * a.vscale, p[1] * a.vscale, p[2] * a.vscale, p[3] * a.vscale);
        __syncwarp();
#pragma unroll 4
        for (int j = 0; j < nk; j++) {
            const float4 pj = pw[j];
            const char *vr = vt + j * pl.vp;
#pragma unroll
            for (int i = 0; i < DPL / 4; i++) {
                const int d = 4 * lane + 128 * i;
                const float4 v = d < Dh4 ? att_ld4<DT>(vr + d * es) : make_float4(0, 0, 0, 0);
                const float pv[ATT_HPW] = {pj.x, pj.y, pj.z, pj.w};
#pragma unroll
                for (int hh = 0; hh < ATT_HPW; hh++) {
                    acc[hh][4 * i] = fmaf(pv[hh], v.x, acc[hh][4 * i]);
                    acc[hh][4 * i + 1] = fmaf(pv[hh], v.y, acc[hh][4 * i + 1]);
                    acc[hh][4 * i + 2] = fmaf(pv[hh], v.z, acc[hh][4 * i + 2]);
                    acc[hh][4 * i + 3] = fmaf(pv[hh], v.w, acc[hh][4 * i + 3]);
                }
            }
        }
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + g), "n"(GT) : "memory"); /* tiles read */
        if (c + KG < c1) stage(c + KG);
    }
    /* the combine: group g's rows [ATT_GROUP_HEADS][Dh4 + 4] (m and l at Dh4, Dh4 + 1) over its
     * own tiles, then every thread sums (head, value) pairs over the groups in group order */
    __syncthreads();
    const int cp = Dh4 + 4;
    float *cb = (float *)(att_sm + pl.q_bytes), *mine = (float *)kt;
#pragma unroll
    for (int hh = 0; hh < ATT_HPW; hh++) {
        float *row = mine + (gw * ATT_HPW + hh) * cp;
#pragma unroll
        for (int i = 0; i < DPL / 4; i++) {
            const int d = 4 * lane + 128 * i;
            if (d < Dh4)
                *(float4 *)(row + d) = make_float4(acc[hh][4 * i], acc[hh][4 * i + 1], acc[hh][4 * i + 2],
                                                   acc[hh][4 * i + 3]);
        }
        if (lane == 0) {
            row[Dh4] = m[hh];
            row[Dh4 + 1] = l[hh];
        }
    }
    __syncthreads();
    const int gstride = pl.group_bytes / 4; /* floats from one group's rows to the next's */
    for (int i = threadIdx.x; i < nh * (Dh + 1); i += NT) {
        const int hh = i / (Dh + 1), d = i % (Dh + 1); /* d == Dh: the head's m and l */
        float M = -INFINITY;
#pragma unroll
        for (int gg = 0; gg < KG; gg++) M = fmaxf(M, cb[gg * gstride + hh * cp + Dh4]);
        float v = 0.0f, L = 0.0f;
#pragma unroll
        for (int gg = 0; gg < KG; gg++) {
            const float *row = cb + gg * gstride + hh * cp;
            const float w = row[Dh4 + 1] != 0.0f ? expf(row[Dh4] - M) : 0.0f; /* 0: no chunk */
            if (d < Dh) v = fmaf(row[d], w, v);
            else L = fmaf(row[Dh4 + 1], w, L);
        }
        const int64_t item = (int64_t)t * a.Hq + hb + hh;
        float *pr = a.part + (item * a.spans + blockIdx.y) * (int64_t)(Dh + 2);
        if (d < Dh) pr[d] = v;
        else {
            pr[Dh] = M; /* -inf and 0 for an empty span */
            pr[Dh + 1] = L;
        }
    }
}

/* Merges the spans of one (query, head) per block: the online softmax's rescaling applied across
 * spans. Every span's max and sum are read at once (a thread a span), and each warp's accumulator
 * rows (spans w, w + ATT_MERGE_WARPS, ..., ATT_MERGE_ROWS of them at a time) are loaded before the
 * overall max is known, so the block waits on one round of loads for up to ATT_MERGE_WARPS *
 * ATT_MERGE_ROWS spans; each weight exp(m - M) is computed once into shared memory and the warps'
 * sums are added in warp order. An empty span has weight 0 and a zero accumulator. */
template <int DPL>
__global__ void __launch_bounds__(ATT_MERGE_WARPS * 32) k_attention_merge(att_args a) {
    __shared__ float wsh[ATT_SPLIT_SPANS], lw[ATT_SPLIT_SPANS], wmax[ATT_MERGE_WARPS];
    __shared__ float red[ATT_MERGE_WARPS][DPL * 32 + 1];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t item = blockIdx.x; /* t * Hq + h */
    const int t = (int)(item / a.Hq), h = (int)(item % a.Hq), Dh = a.Dh, S = a.spans;
    const int64_t rs = Dh + 2;
    cu_pdl_enter();
    const float *base = a.part + item * S * rs;
    const int sp0 = threadIdx.x;
    const float m0 = sp0 < S ? base[sp0 * rs + Dh] : -INFINITY, l0 = sp0 < S ? base[sp0 * rs + Dh + 1] : 0.0f;
    float r[ATT_MERGE_ROWS][DPL];
#pragma unroll
    for (int j = 0; j < ATT_MERGE_ROWS; j++) {
        const int sp = wid + j * ATT_MERGE_WARPS;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            r[j][i] = sp < S && d < Dh ? base[sp * rs + d] : 0.0f;
        }
    }
    const float wm = cu_warp_max(m0);
    if (lane == 0) wmax[wid] = wm;
    __syncthreads();
    float M = wmax[0];
#pragma unroll
    for (int w = 1; w < ATT_MERGE_WARPS; w++) M = fmaxf(M, wmax[w]);
    if (sp0 < S) {
        const float w = l0 != 0.0f ? expf(m0 - M) : 0.0f;
        wsh[sp0] = w;
        lw[sp0] = l0 * w;
    }
    __syncthreads();
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < ATT_MERGE_ROWS; j++) {
        const int sp = wid + j * ATT_MERGE_WARPS;
        const float w = sp < S ? wsh[sp] : 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] = fmaf(r[j][i], w, acc[i]);
    }
    for (int sp = wid + ATT_MERGE_ROWS * ATT_MERGE_WARPS; sp < S; sp += ATT_MERGE_WARPS) {
        const float w = wsh[sp];
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < Dh) acc[i] = fmaf(base[sp * rs + d], w, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) red[wid][lane + 32 * i] = acc[i];
    if (wid == 0) { /* the sum of weights: lane j adds spans j, j + 32, ..., then a fixed tree */
        float L = 0.0f;
        for (int sp = lane; sp < S; sp += 32) L += lw[sp];
        L = cu_warp_sum(L);
        if (lane == 0) red[0][DPL * 32] = L;
    }
    __syncthreads();
    if (wid) return;
    const float inv = 1.0f / red[0][DPL * 32];
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

/* The copy granule of a split call's rows (att_args k, v, ks, vs; rows of rb bytes): 16 or 4
 * bytes, or 0 when even 4 does not divide them (then the call is not split). */
static int att_granule(const att_args &a, int64_t rb) {
    for (int G = 16; G >= 4; G -= 12)
        if (rb % G == 0 && a.ks % G == 0 && a.vs % G == 0 && (uintptr_t)a.k % G == 0 &&
            (uintptr_t)a.v % G == 0)
            return G;
    return 0;
}

/* The split kernel for dtype DT, Dh4 and granule G, its shared memory raised past the 48 KiB
 * default; returns its shared bytes and threads through *smem and *threads. */
template <int DT>
static void (*split_kernel(int Dh4, int G, size_t *smem, int *threads))(att_args) {
    const att_smem_plan pl = att_plan(Dh4, att_esize<DT>());
    const bool wide = Dh4 > 128;
    const int kg = wide ? att_groups<8>() : att_groups<4>();
    *smem = (size_t)pl.q_bytes + (size_t)kg * (size_t)pl.group_bytes;
    *threads = kg * ATT_GW * 32;
    if (wide) return G == 16 ? k_attention_split<DT, 8, 16> : k_attention_split<DT, 8, 4>;
    return G == 16 ? k_attention_split<DT, 4, 16> : k_attention_split<DT, 4, 4>;
}

/* The split kernel for the cache's dtype, then the merge. */
static int launch_split(cu_ctx *c, const att_args &a, cn_dtype dt, int G) {
    const int Dh4 = (a.Dh + 3) & ~3, Hkv = a.Hq / a.group;
    const int nbatch = (a.group + ATT_GROUP_HEADS - 1) / ATT_GROUP_HEADS;
    const dim3 grid((unsigned)(a.T * Hkv * nbatch), (unsigned)a.spans);
    void (*k)(att_args) = NULL;
    size_t smem = 0;
    int threads = 0;
    switch (dt) {
    case CN_F32: k = split_kernel<CN_F32>(Dh4, G, &smem, &threads); break;
    case CN_BF16: k = split_kernel<CN_BF16>(Dh4, G, &smem, &threads); break;
    case CN_F16: k = split_kernel<CN_F16>(Dh4, G, &smem, &threads); break;
    case CN_F8_E4M3: k = split_kernel<CN_F8_E4M3>(Dh4, G, &smem, &threads); break;
    default: return CN_EUNSUPPORTED;
    }
    int rc = cu_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                      "attention shared memory");
    if (rc) return rc;
    cu_launch(c, k, grid, threads, smem, a);
    rc = cu_launch_check("attention");
    if (rc) return rc;
    void (*mk)(att_args) = a.Dh > 128 ? k_attention_merge<8> : k_attention_merge<4>;
    cu_launch(c, mk, (unsigned)(a.T * a.Hq), ATT_MERGE_WARPS * 32, 0, a);
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
    a.part = NULL;
    const int64_t rb = Dh * (int64_t)cn_dtype_size(kc->dtype);
    const int G = att_granule(a, rb);
    if (T * n_heads < ATT_SPLIT_MAX_ITEMS && kc->dtype == vc->dtype && G) {
        /* spans: the chunks' count rounded up to a power of two, at most the blocks that fill
         * the device once (all of them in one wave); past that the spans lengthen instead */
        const int nbatch = (a.group + ATT_GROUP_HEADS - 1) / ATT_GROUP_HEADS;
        int64_t smax = c->n_sm / (T * n_kv_heads * nbatch);
        smax = smax < 1 ? 1 : smax > ATT_SPLIT_SPANS ? ATT_SPLIT_SPANS : smax;
        const int64_t chunks = ((int64_t)n_past + T + ATT_CHUNK - 1) / ATT_CHUNK;
        int64_t spans = 1;
        while (spans < chunks && spans < smax) spans *= 2;
        if (spans > smax) spans = smax;
        if (a.pos && spans < smax) { /* the bucket's highest position: its chunks fill it */
            const int64_t top = spans * ATT_CHUNK - T - a.n_past;
            if (top < c->pos_max) c->pos_max = top;
        }
        a.spans = (int)spans;
        a.part = (float *)cu_scratch(c, (size_t)(T * n_heads * spans * (Dh + 2)) * sizeof(float));
        if (!a.part) return CN_ENOMEM;
        return launch_split(c, a, kc->dtype, G);
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
