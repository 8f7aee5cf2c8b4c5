/* cuda_moe.cu - the MoE router and the weighted combination of expert rows on the GPU.
 *
 * Promises: routing follows the CPU backend (cpu_moe.c): sigmoid scores in parallel, then every
 * expert's rank by biased score at once (one thread with group limiting), ties to the lower
 * index, the order in which the CPU's argmax rounds choose; the same group limiting and
 * renormalisation. The H200 profile showed a one-thread ranking at 58 us per token and layer and
 * a warp's K rounds of argmax at 5.5 us. Only expf's last-bit differences between the two
 * libraries can change a choice, on exact near-ties. combine sums the k rows in order
 * j = 0..k-1 like the CPU. moe_route_ep does a decode token's router product and routing in one
 * launch (k_route_mm): the product and the route kernel took 5.4 and 5.5 us per MoE layer on the
 * H200, mostly each launch's fixed cost.
 */
#include <math.h>
#include <stdint.h>

#include "tensor/cuda/cuda_impl.h"

#define ROUTE_THREADS 128

typedef struct route_args {
    char *ids;
    int64_t ids_s;
    char *wt;
    int64_t wt_s;
    const char *logits;
    int64_t ls;
    const float *bias;
    int E, K, n_group, topk_group, norm_topk;
    float scaling;
} route_args;

__device__ int best_expert(const float *sel, const uint8_t *taken, const uint8_t *excluded, int E,
                           int pass) {
    int best = -1;
    for (int e = 0; e < E; e++) {
        if (taken[e] || excluded[e] != pass) continue;
        if (best < 0 || sel[e] > sel[best]) best = e;
    }
    return best;
}

/* Bytes of shared memory route_token uses. */
static size_t route_smem(int E, int n_group, int K) {
    return (size_t)(2 * E + n_group + K) * sizeof(float) + (size_t)(2 * E + n_group);
}

/* Token t's routing from its logits, by every thread of the block; sh: route_smem bytes. The
 * logits are read with __ldcg: the fused router's other blocks wrote them in this launch. */
__device__ void route_token(const route_args &a, int64_t t, float *sh) {
    const int E = a.E, n_group = a.n_group > 1 ? a.n_group : 1;
    float *s = sh, *sel = s + E, *gscore = sel + E, *wk = gscore + n_group;
    uint8_t *taken = (uint8_t *)(wk + a.K), *excluded = taken + E, *gtaken = excluded + E;
    const float *lg = (const float *)(a.logits + t * a.ls);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        s[e] = 1.0f / (1.0f + expf(-__ldcg(lg + e)));
        sel[e] = a.bias ? s[e] + a.bias[e] : s[e];
        if (n_group == 1 && sel[e] != sel[e]) sel[e] = -INFINITY; /* NaN: see the ranking */
        taken[e] = 0;
        excluded[e] = 0;
    }
    __syncthreads();
    int32_t *id = (int32_t *)(a.ids + t * a.ids_s);
    float *wt = (float *)(a.wt + t * a.wt_s);
    if (n_group == 1) {
        /* each expert's rank among the biased scores, descending, ties to the lower index: the
         * order in which the CPU's argmax rounds take them, so rank j is its choice j. Every
         * thread ranks its experts against all E at once (smem broadcasts) instead of K rounds
         * of a warp's argmax, each waiting on the one before. NaN ranks as -inf, so the ranks
         * stay a permutation and exactly K experts are written. */
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const float v = sel[e];
            int rank = 0;
            for (int f = 0; f < E; f++) rank += sel[f] > v || (sel[f] == v && f < e);
            if (rank < a.K) {
                id[rank] = e;
                wk[rank] = s[e];
            }
        }
        __syncthreads();
        if (threadIdx.x != 0) return;
        for (int j = 0; j < a.K; j++) wt[j] = wk[j];
    } else {
        if (threadIdx.x != 0) return;
        const int gs = E / n_group;
        for (int g = 0; g < n_group; g++) { /* sum of the group's top two */
            const float *v = sel + g * gs;
            int i1 = 0;
            for (int e = 1; e < gs; e++)
                if (v[e] > v[i1]) i1 = e;
            int i2 = -1;
            for (int e = 0; e < gs; e++)
                if (e != i1 && (i2 < 0 || v[e] > v[i2])) i2 = e;
            gscore[g] = i2 < 0 ? v[i1] : v[i1] + v[i2];
            gtaken[g] = 0;
        }
        for (int r = 0; r < a.topk_group; r++) {
            int best = -1;
            for (int g = 0; g < n_group; g++)
                if (!gtaken[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            gtaken[best] = 1;
        }
        for (int e = 0; e < E; e++) excluded[e] = !gtaken[e / gs];
        for (int j = 0; j < a.K; j++) {
            int e = best_expert(sel, taken, excluded, E, 0);
            if (e < 0) e = best_expert(sel, taken, excluded, E, 1);
            taken[e] = 1;
            id[j] = e;
            wt[j] = s[e];
        }
    }
    if (a.norm_topk) {
        float sum = 0;
        for (int j = 0; j < a.K; j++) sum += wt[j];
        for (int j = 0; j < a.K; j++) wt[j] /= sum + 1e-20f;
    }
    for (int j = 0; j < a.K; j++) wt[j] *= a.scaling;
}

__global__ void __launch_bounds__(ROUTE_THREADS) k_route(route_args a) {
    cu_pdl_enter();
    extern __shared__ float sh[];
    route_token(a, blockIdx.x, sh);
}

/* The fused router (moe_route_ep) for one token: block b takes gate rows RMM_ROWS b ..
 * RMM_ROWS (b + 1) - 1, each a dot product with x split over RMM_SPLIT warps (their parts summed
 * in order), x normalised as the GEMV epilogues do (the sum of squares in double, in a fixed
 * order; x * inv, then * the norm weight); the last block to finish (rt_cnt, invariant 6) routes
 * the E logits. Before cu_pdl_enter each warp loads its part of its gate row and each thread its
 * norm weights into registers (weights, invariant 7), so they arrive while the kernel before
 * drains; after it every load of x is in flight at once, and the norm is applied from registers.
 * A warp per whole row (16 blocks for nano's 128 experts) took 12.4 us a layer with PDL off: 21
 * dependent-in-practice loads per lane on 16 SMs; gate rows asked of L2 before the enter, x in
 * loops of 4 loads and the norm weights read after it, 11.1 us. */
#define RMM_ROWS 2
#define RMM_SPLIT 4
#define RMM_WARPS (RMM_ROWS * RMM_SPLIT)
#define RMM_THREADS (32 * RMM_WARPS)
/* In registers per thread: RMM_XV float4s of x and of the norm, RMM_GV of the warp's gate row
 * part; both bound K to 16 RMM_THREADS (cu_moe_route_ep refuses more). */
#define RMM_XV 4
#define RMM_GV (16 * RMM_THREADS / 4 / RMM_SPLIT / 32)

__global__ void __launch_bounds__(RMM_THREADS)
    k_route_mm(route_args a, float *lg, const float *__restrict__ gate, int64_t gs, const float *x,
               const float *__restrict__ norm, float eps, int K, int *cnt) {
    extern __shared__ float sh[]; /* x, normalised; then route_token's */
    __shared__ double wss[RMM_WARPS];
    __shared__ float part[RMM_WARPS];
    __shared__ int last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int row0 = (int)blockIdx.x * RMM_ROWS, n4 = K / 4;
    const bool vec = !(((uintptr_t)x | (uintptr_t)norm) & 15u);
    float4 nv[RMM_XV], xv[RMM_XV];
#pragma unroll
    for (int p = 0; p < RMM_XV; p++) { /* weights: loaded before cu_pdl_enter (invariant 7) */
        const int i = tid + p * RMM_THREADS;
        nv[p] = norm && i < n4 ? cu_ld4(norm + 4 * i, vec) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    }
    /* this warp's part of its gate row, also a weight: in registers before the x it meets */
    const int r = row0 + warp / RMM_SPLIT, per = (n4 + RMM_SPLIT - 1) / RMM_SPLIT;
    const int i0 = (warp % RMM_SPLIT) * per + lane, i1 = min(n4, (warp % RMM_SPLIT + 1) * per);
    float4 gv[RMM_GV];
#pragma unroll
    for (int j = 0; j < RMM_GV; j++)
        gv[j] = r < a.E && i0 + 32 * j < i1 ? ((const float4 *)(gate + r * gs))[i0 + 32 * j]
                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    cu_pdl_enter();
    double ss = 0.0;
#pragma unroll
    for (int p = 0; p < RMM_XV; p++) { /* every load in flight at once */
        const int i = tid + p * RMM_THREADS;
        xv[p] = i < n4 ? cu_ld4(x + 4 * i, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int p = 0; p < RMM_XV; p++) {
        const float4 v = xv[p];
        ss += (double)v.x * v.x;
        ss += (double)v.y * v.y;
        ss += (double)v.z * v.z;
        ss += (double)v.w * v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) wss[warp] = ss;
    __syncthreads();
    float inv = 1.0f;
    if (norm) {
        double t = 0.0;
        for (int w = 0; w < RMM_WARPS; w++) t += wss[w];
        inv = (float)(1.0 / sqrt(t / (double)K + eps));
    }
#pragma unroll
    for (int p = 0; p < RMM_XV; p++) {
        const int i = tid + p * RMM_THREADS;
        const float4 v = xv[p], n = nv[p];
        if (i < n4)
            ((float4 *)sh)[i] = norm ? make_float4(n.x * (v.x * inv), n.y * (v.y * inv),
                                                   n.z * (v.z * inv), n.w * (v.w * inv))
                                     : v;
    }
    __syncthreads();
    float acc = 0.0f;
    if (r < a.E) {
        const float4 *xs4 = (const float4 *)sh;
#pragma unroll
        for (int j = 0; j < RMM_GV; j++) {
            if (i0 + 32 * j >= i1) break;
            const float4 w4 = gv[j], x4 = xs4[i0 + 32 * j];
            acc = fmaf(w4.x, x4.x, acc);
            acc = fmaf(w4.y, x4.y, acc);
            acc = fmaf(w4.z, x4.z, acc);
            acc = fmaf(w4.w, x4.w, acc);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    }
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (tid < RMM_ROWS && row0 + tid < a.E) { /* the row's parts in order */
        float v = part[tid * RMM_SPLIT];
        for (int j = 1; j < RMM_SPLIT; j++) v += part[tid * RMM_SPLIT + j];
        lg[row0 + tid] = v;
    }
    __syncthreads();
    if (tid == 0) {
        __threadfence(); /* the block's logits are visible before the count says so */
        last = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid == 0) *cnt = 0; /* every block has arrived: ready for the next launch */
    route_token(a, 0, sh);
}

/* The kernels' view of moe_route's tensors and parameters. */
static route_args route_args_of(cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                                const cn_tensor *bias, const cn_route_args *ra) {
    route_args a;
    a.ids = (char *)ids->data;
    a.ids_s = ids->stride[0];
    a.wt = (char *)weights->data;
    a.wt_s = weights->stride[0];
    a.logits = (const char *)logits->data;
    a.ls = logits->stride[0];
    a.bias = bias ? (const float *)bias->data : NULL;
    a.E = (int)logits->shape[1];
    a.K = ra->top_k;
    a.n_group = ra->n_group;
    a.topk_group = ra->topk_group;
    a.norm_topk = ra->norm_topk;
    a.scaling = ra->scaling;
    return a;
}

int cu_moe_route(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                 const cn_tensor *bias, const cn_route_args *ra) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = logits->shape[0];
    const int E = (int)logits->shape[1];
    const int n_group = ra->n_group > 1 ? ra->n_group : 1;
    if (T == 0) return CN_OK;
    const size_t smem = route_smem(E, n_group, ra->top_k);
    if (smem > 48 * 1024) return CN_EUNSUPPORTED;
    const route_args a = route_args_of(ids, weights, logits, bias, ra);
    cu_launch(c, k_route, (unsigned)T, ROUTE_THREADS, smem, a);
    return cu_launch_check("moe_route");
}

__global__ void k_combine(char *y, int64_t ys, const char *rows, int64_t rs, const char *w,
                          int64_t ws, int64_t T, int64_t H, int k) {
    cu_pdl_enter();
    CU_FOR_ROWS(t, T) CU_FOR_COLS(h, H) {
        const float *wr = (const float *)(w + t * ws);
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += wr[j] * ((const float *)(rows + (t * k + j) * rs))[h];
        ((float *)(y + t * ys))[h] = acc;
    }
}

int cu_moe_combine(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = y->shape[0], H = y->shape[1];
    if (T == 0 || H == 0) return CN_OK;
    cu_launch(c, k_combine, cu_rows_grid(T, H, cu_rows_threads(H)), cu_rows_threads(H), 0,
        (char *)y->data, y->stride[0], (const char *)rows->data, rows->stride[0],
        (const char *)weights->data, weights->stride[0], T, H, (int)weights->shape[1]);
    return cu_launch_check("moe_combine");
}

/* See backend.h: one token, an F32 gate without group limiting; other shapes are refused. */
int cu_moe_route_ep(cn_backend *b, cn_tensor *ids, cn_tensor *weights, cn_tensor *logits,
                    const cn_tensor *gate, const cn_tensor *x, const cn_mm_ep *f,
                    const cn_tensor *bias, const cn_route_args *ra) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], K = x->shape[1], E = gate->shape[0];
    if (T != 1 || gate->dtype != CN_F32 || ra->n_group > 1 || K % 4 || K > 16 * RMM_THREADS ||
        E > INT32_MAX ||
        ((uintptr_t)gate->data & 15u) || gate->stride[0] % 16)
        return CN_EUNSUPPORTED;
    const size_t rs = route_smem((int)E, 1, ra->top_k), xs = (size_t)K * sizeof(float);
    const size_t smem = rs > xs ? rs : xs; /* x staged, then route_token's scratch */
    if (smem > 48 * 1024) return CN_EUNSUPPORTED;
    const route_args a = route_args_of(ids, weights, logits, bias, ra); /* n_group <= 1 */
    cu_launch(c, k_route_mm, (unsigned)((E + RMM_ROWS - 1) / RMM_ROWS), RMM_THREADS, smem, a,
              (float *)logits->data, (const float *)gate->data, gate->stride[0] / (int64_t)sizeof(float),
              (const float *)x->data, f->norm ? (const float *)f->norm->data : NULL, f->eps,
              (int)K, c->rt_cnt);
    return cu_launch_check("moe_route_ep");
}
