/* cuda_gemm.cu - y = x W^T (dense and gathered by expert) and the embedding lookup on the GPU.
 *
 * Promises: weights are read in their stored dtype and decoded in registers (F8 and the NVFP4
 * global scaled once per output, as on the CPU; NVFP4's E4M3 scale per 16 and MXFP8's E8M0 per 32
 * applied to each weight, so the result is the fp32 product with the dequantized weights - the
 * CPU instead quantizes activations to int8 for NVFP4); activations stay fp32. Dense paths, by rows T:
 *   T <= MM_GEMV_ROWS          a warp per weight row, all T rows at once (decode: weights read once,
 *                              16 bytes per lane per load when rows are aligned)
 *   F32 weights, larger T      cublasSgemm (fp32, no TF32)
 *   BF16 weights, T >= 32      cublasGemmEx on tensor cores, once per bf16 term of x split in
 *                              two (cuda_impl.h (4))
 *   BF16, F8, NVFP4, MXFP8     the tensor-core kernels of cuda_grouped_gemm.cu when the rows
 *   weights, otherwise         and K fit them (cu_gg_fits), dense and gathered
 *   otherwise                  a tiled SIMT kernel (64x64 tiles, fp32 FMA)
 * The gathered matmul, for at most MM_GATHER_GEMV_ROWS rows (a decode token's experts), runs the
 * GEMV with each row's expert looked up by its id; for more rows it sorts them by expert on the
 * device (counting sort, one block) into tiles of
 * one expert each and runs the tiled kernel over them; every output row is computed by one thread
 * group in a fixed order, so results do not depend on the order rows land in a tile.
 * Index tensors are checked on the device before anything is written; the op then waits for the
 * verdict and returns CN_EINVAL with nothing written (cuda_impl.h (1)).
 */
#include <stdlib.h>
#include <string.h>

#include "tensor/cuda/cuda_impl.h"

#define MM_GEMV_ROWS 8 /* x rows the warp-per-weight-row kernel takes */
#define MM_TN 64       /* weight rows per tile */
#define MM_TK 16       /* k per step of the tiled kernel */
#define MM_THREADS 256
#define MM_SPLIT 2     /* bf16 terms of an fp32 activation for tensor-core GEMMs */

/* ---------------------------------------------------------------- GEMV: warp per weight row */

/* Weight values one lane loads at once: 16 bytes of the stored dtype (NVFP4: 32 nibbles, two
 * scale blocks; MXFP8: 16 values of one scale block). */
template <int DT>
struct mm_vec {
    static constexpr int n = DT == CN_F32 ? 4 : DT == CN_NVFP4 ? 32 : (DT == CN_F8_E4M3 || DT == CN_MXFP8) ? 16 : 8;
};

/* Weight i of a 16-byte chunk starting at column k0 of row n, its block scale applied. */
template <int DT>
__device__ __forceinline__ float mm_chunk_val(const char *rp, int i, const cu_wexp &w, int64_t n,
                                              int64_t k0) {
    if (DT == CN_NVFP4) {
        const unsigned p = ((const unsigned char *)rp)[i >> 1];
        return cu_e2m1((i & 1) ? p >> 4 : p & 15u) *
               cu_e4m3(w.bs[n * w.bs_stride + ((k0 + i) >> 4)]);
    }
    if (DT == CN_MXFP8)
        return cu_e4m3(((const unsigned char *)rp)[i]) * cu_e8m0(w.bs[n * w.bs_stride + (k0 >> 5)]);
    return cu_wval<DT>(rp, i);
}

/* Byte offset of column k in a row of dtype DT. */
template <int DT>
__device__ __forceinline__ int64_t mm_col_bytes(int64_t k) {
    return DT == CN_NVFP4 ? k >> 1 : k * (DT == CN_F32 ? 4 : (DT == CN_BF16 || DT == CN_F16) ? 2 : 1);
}

/* acc[t] += dot(W row n, x[t]) over k for t < T, one warp: with VEC each lane loads 16 bytes of
 * the row at a time (rows 16-byte aligned, K a multiple of the vector), else one value. The lane
 * sums are not reduced here. */
template <int DT, bool VEC, int R>
__device__ __forceinline__ void mm_row_dot(const cu_wexp &w, int64_t n, const char *__restrict__ x,
                                           int64_t xs, int T, int64_t K, int lane, float acc[R]) {
    const char *wr = w.data + n * w.stride;
    if (VEC) {
        constexpr int V = mm_vec<DT>::n;
        /* two loads in flight per lane: a decode GEMV is bound by memory latency otherwise; the
         * products are still summed in k order per lane */
        int64_t k0 = (int64_t)lane * V;
        for (; k0 + 32 * V < K; k0 += 64 * V) {
            const uint4 raw0 = *(const uint4 *)(wr + mm_col_bytes<DT>(k0));
            const uint4 raw1 = *(const uint4 *)(wr + mm_col_bytes<DT>(k0 + 32 * V));
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const char *rp = half ? (const char *)&raw1 : (const char *)&raw0;
                const int64_t kb = k0 + half * 32 * V;
#pragma unroll
                for (int i = 0; i < V; i++) {
                    const float wv = mm_chunk_val<DT>(rp, i, w, n, kb);
#pragma unroll
                    for (int t = 0; t < R; t++)
                        if (t < T) acc[t] = fmaf(wv, ((const float *)(x + t * xs))[kb + i], acc[t]);
                }
            }
        }
        if (k0 < K) {
            const uint4 raw = *(const uint4 *)(wr + mm_col_bytes<DT>(k0));
            const char *rp = (const char *)&raw;
#pragma unroll
            for (int i = 0; i < V; i++) {
                const float wv = mm_chunk_val<DT>(rp, i, w, n, k0);
#pragma unroll
                for (int t = 0; t < R; t++)
                    if (t < T) acc[t] = fmaf(wv, ((const float *)(x + t * xs))[k0 + i], acc[t]);
            }
        }
    } else {
        for (int64_t k = lane; k < K; k += 32) {
            const float wv = cu_wget<DT>(w, n, k);
#pragma unroll
            for (int t = 0; t < R; t++)
                if (t < T) acc[t] = fmaf(wv, ((const float *)(x + t * xs))[k], acc[t]);
        }
    }
}

/* y[t][n] = w.scale * dot(W[n], x[t]) for t < T <= R: R is T rounded up to 1, 2, 4 or 8, so a
 * decode row (T = 1) carries no predicated work for rows it does not have (the H200 profile of
 * the R = 8 kernel at T = 1: the lm_head streamed at about a quarter of the memory bandwidth). */
template <int DT, bool VEC, int R>
__global__ void __launch_bounds__(256) k_gemv(cu_wexp w, const char *__restrict__ x, int64_t xs,
                                              char *__restrict__ y, int64_t ys, int T, int64_t K,
                                              int64_t N) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[R];
#pragma unroll
    for (int t = 0; t < R; t++) acc[t] = 0.0f;
    mm_row_dot<DT, VEC, R>(w, n, x, xs, T, K, lane, acc);
#pragma unroll
    for (int t = 0; t < R; t++) {
        if (t >= T) break;
        const float s = cu_warp_sum(acc[t]);
        if (lane == 0) ((float *)(y + t * ys))[n] = s * w.scale;
    }
}

template <int DT, bool VEC>
static void launch_gemv(cu_ctx *c, const cu_wexp &we, const cn_tensor *x, cn_tensor *y, int T,
                        int64_t K, int64_t N) {
    const unsigned blocks = (unsigned)((N + 7) / 8);
    const char *xd = (const char *)x->data;
    char *yd = (char *)y->data;
    const int64_t xs = x->stride[0], ys = y->stride[0];
    if (T == 1) k_gemv<DT, VEC, 1><<<blocks, 256, 0, c->stream>>>(we, xd, xs, yd, ys, T, K, N);
    else if (T == 2) k_gemv<DT, VEC, 2><<<blocks, 256, 0, c->stream>>>(we, xd, xs, yd, ys, T, K, N);
    else if (T <= 4) k_gemv<DT, VEC, 4><<<blocks, 256, 0, c->stream>>>(we, xd, xs, yd, ys, T, K, N);
    else k_gemv<DT, VEC, MM_GEMV_ROWS><<<blocks, 256, 0, c->stream>>>(we, xd, xs, yd, ys, T, K, N);
}

/* Whether a weight's rows can be read 16 bytes at a time. */
static bool mm_can_vec(cn_dtype dt, const void *data, int64_t stride, int64_t K) {
    const int v = dt == CN_F32 ? 4 : dt == CN_NVFP4 ? 32 : (dt == CN_F8_E4M3 || dt == CN_MXFP8) ? 16 : 8;
    return K % v == 0 && ((uintptr_t)data & 15u) == 0 && stride % 16 == 0;
}

/* The kernels' view of a weight tensor (block scales on the device, cu_weight). */
static cu_wexp mm_wexp(const cn_tensor *w) {
    cu_wexp e;
    e.data = (const char *)w->data;
    e.stride = w->stride[0];
    e.scale = cu_wscale(w);
    e.bs = w->block_scale ? (const unsigned char *)w->block_scale->data : NULL;
    e.bs_stride = w->block_scale ? w->block_scale->stride[0] : 0;
    return e;
}

/* ---------------------------------------------------------------- tiled SIMT GEMM */

typedef struct mm_args {
    const char *x;
    int64_t xs;
    char *y;
    int64_t ys;
    int64_t K, N;
    int64_t rows;          /* dense: T */
    cu_wexp dense;         /* dense weight (table == NULL) */
    const cu_wexp *table;  /* gather: experts */
    const cu_tile *tiles;  /* gather: tiles of one expert each */
    const int *n_tiles;    /* gather: how many tiles (device) */
    const int *order;      /* gather: output rows sorted by expert */
    int k;                 /* gather: ids per token */
    int x_per_token;       /* gather: x has T rows (x row = r / k) */
} mm_args;

/* A TM x MM_TN tile of y; 256 threads, each TM/16 x 4 outputs. */
template <int DT, int TM>
__global__ void __launch_bounds__(MM_THREADS) k_mm_tiled(mm_args a) {
    __shared__ float xs_[MM_TK][TM + 4];
    __shared__ float ws_[MM_TK][MM_TN + 4];
    __shared__ int64_t xrow_[TM], yrow_[TM];
    constexpr int RI = TM / 16;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int64_t n0 = (int64_t)blockIdx.x * MM_TN;
    cu_wexp w;
    int begin, end;
    if (a.tiles) {
        if ((int)blockIdx.y >= *a.n_tiles) return;
        const cu_tile tl = a.tiles[blockIdx.y];
        w = a.table[tl.expert];
        begin = tl.begin;
        end = tl.end;
    } else {
        w = a.dense;
        begin = (int)blockIdx.y * TM;
        end = (int)(begin + TM < a.rows ? begin + TM : a.rows);
    }
    const int nr = end - begin;
    if (tid < TM) {
        int64_t xr = -1, yr = -1;
        if (tid < nr) {
            if (a.order) {
                const int r = a.order[begin + tid];
                yr = r;
                xr = a.x_per_token ? r / a.k : r;
            } else {
                xr = yr = begin + tid;
            }
        }
        xrow_[tid] = xr;
        yrow_[tid] = yr;
    }
    __syncthreads();
    float acc[RI][4];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < a.K; k0 += MM_TK) {
        for (int idx = tid; idx < TM * MM_TK; idx += MM_THREADS) {
            const int i = idx / MM_TK, kk = idx % MM_TK;
            const int64_t xr = xrow_[i], k = k0 + kk;
            xs_[kk][i] = (xr >= 0 && k < a.K) ? ((const float *)(a.x + xr * a.xs))[k] : 0.0f;
        }
        for (int idx = tid; idx < MM_TN * MM_TK; idx += MM_THREADS) {
            const int n = idx / MM_TK, kk = idx % MM_TK;
            const int64_t k = k0 + kk;
            ws_[kk][n] = (n0 + n < a.N && k < a.K) ? cu_wget<DT>(w, n0 + n, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_TK; kk++) {
            float xv[RI], wv[4];
#pragma unroll
            for (int i = 0; i < RI; i++) xv[i] = xs_[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) wv[j] = ws_[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < RI; i++) {
        const int64_t yr = yrow_[ty + 16 * i];
        if (yr < 0) continue;
        float *yp = (float *)(a.y + yr * a.ys);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t n = n0 + tx + 16 * j;
            if (n < a.N) yp[n] = acc[i][j] * w.scale;
        }
    }
}

template <int DT>
static int launch_tiled(cu_ctx *c, const mm_args &a, int tm, unsigned n_row_tiles) {
    dim3 grid((unsigned)((a.N + MM_TN - 1) / MM_TN), n_row_tiles);
    if (tm == 16) k_mm_tiled<DT, 16><<<grid, MM_THREADS, 0, c->stream>>>(a);
    else k_mm_tiled<DT, 64><<<grid, MM_THREADS, 0, c->stream>>>(a);
    return cu_launch_check("matmul (tiled)");
}

/* ---------------------------------------------------------------- dense */

/* x (fp32 rows) -> MM_SPLIT bf16 terms, [MM_SPLIT][T, K] packed: x = t0 + t1 + O(2^-18 |x|),
 * each term the bf16 rounding of what the previous ones left (cuda_impl.h (4)). */
__global__ void k_split_bf16(const char *__restrict__ x, int64_t xs, __nv_bfloat16 *__restrict__ out,
                             int64_t T, int64_t K) {
    const int64_t n = T * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / K, k = i % K;
        float v = ((const float *)(x + t * xs))[k];
#pragma unroll
        for (int j = 0; j < MM_SPLIT; j++) {
            const __nv_bfloat16 h = __float2bfloat16_rn(v);
            out[j * n + i] = h;
            v -= __bfloat162float(h);
        }
    }
}

static int blas_rc(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return CN_OK;
    cn_error("cuda: %s: %s", what, cublasGetStatusString(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? CN_ENOMEM : CN_EIO;
}

static int matmul_bf16_split(cu_ctx *c, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    const int64_t T = x->shape[0], K = x->shape[1], N = w->shape[0];
    __nv_bfloat16 *terms =
        (__nv_bfloat16 *)cu_scratch(c, (size_t)(MM_SPLIT * T * K) * sizeof(__nv_bfloat16));
    if (!terms) return CN_ENOMEM;
    k_split_bf16<<<cu_blocks(T * K, 256), 256, 0, c->stream>>>((const char *)x->data, x->stride[0],
                                                               terms, T, K);
    int rc = cu_launch_check("matmul split");
    const float one = 1.0f, zero = 0.0f;
    for (int j = 0; j < MM_SPLIT && !rc; j++)
        rc = blas_rc(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one,
                                  w->data, CUDA_R_16BF, (int)(w->stride[0] / 2), terms + j * T * K,
                                  CUDA_R_16BF, (int)K, j ? &one : &zero, y->data, CUDA_R_32F,
                                  (int)(y->stride[0] / 4), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (bf16)");
    return rc;
}

int cu_matmul(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], K = x->shape[1], N = w->shape[0];
    if (T == 0 || N == 0) return CN_OK;
    const int big = K <= INT32_MAX && N <= INT32_MAX && T <= INT32_MAX;
    if (T <= MM_GEMV_ROWS) {
        const cu_wexp we = mm_wexp(w);
        if (mm_can_vec(w->dtype, w->data, w->stride[0], K)) {
            CU_DISPATCH_WQ(w->dtype, (launch_gemv<DT, true>(c, we, x, y, (int)T, K, N)));
        } else {
            CU_DISPATCH_WQ(w->dtype, (launch_gemv<DT, false>(c, we, x, y, (int)T, K, N)));
        }
        return cu_launch_check("matmul (gemv)");
    }
    if (w->dtype == CN_F32 && big) {
        const float one = 1.0f, zero = 0.0f;
        return blas_rc(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one,
                                   (const float *)w->data, (int)(w->stride[0] / 4),
                                   (const float *)x->data, (int)(x->stride[0] / 4), &zero,
                                   (float *)y->data, (int)(y->stride[0] / 4)),
                       "cublasSgemm");
    }
    if (w->dtype == CN_BF16 && T >= 32 && big) return matmul_bf16_split(c, y, w, x);
    if (cu_gg_fits(w->dtype, &w, 1, K)) return cu_gg_dense(c, y, w, x);
    mm_args a;
    memset(&a, 0, sizeof a);
    a.x = (const char *)x->data;
    a.xs = x->stride[0];
    a.y = (char *)y->data;
    a.ys = y->stride[0];
    a.K = K;
    a.N = N;
    a.rows = T;
    a.dense = mm_wexp(w);
    const int tm = T <= 16 ? 16 : 64;
    const unsigned tiles = (unsigned)((T + tm - 1) / tm);
    CU_DISPATCH_WQ(w->dtype, return launch_tiled<DT>(c, a, tm, tiles));
    return CN_OK;
}

/* ---------------------------------------------------------------- gathered by expert */

/* One block: checks ids, counts rows per expert, lays out tiles of <= tm rows of one expert and
 * the rows' order. On a bad id: *flag = 1 and no tiles (the compute kernel then writes nothing). */
__global__ void __launch_bounds__(1024) k_gather_prep(const char *__restrict__ ids, int64_t ids_stride,
                                                      int T, int k, int n_w, int tm, int *flag,
                                                      int *cnt /* [2 * n_w] */, int *order,
                                                      cu_tile *tiles, int *n_tiles) {
    int *fill = cnt + n_w;
    const int rows = T * k;
    for (int e = threadIdx.x; e < n_w; e += blockDim.x) {
        cnt[e] = 0;
        fill[e] = 0;
    }
    __syncthreads();
    int bad = 0;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const int e = ((const int32_t *)(ids + (int64_t)(r / k) * ids_stride))[r % k];
        if (e < 0 || e >= n_w) bad = 1;
        else atomicAdd(&cnt[e], 1);
    }
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) {
            *flag = 1;
            *n_tiles = 0;
        }
        return;
    }
    if (threadIdx.x == 0) { /* exclusive scan into fill (next free slot), tiles in expert order */
        int s = 0, nt = 0;
        for (int e = 0; e < n_w; e++) {
            const int ce = cnt[e];
            for (int p = s; p < s + ce; p += tm) {
                tiles[nt].expert = e;
                tiles[nt].begin = p;
                tiles[nt].end = p + tm < s + ce ? p + tm : s + ce;
                nt++;
            }
            fill[e] = s;
            s += ce;
        }
        *n_tiles = nt;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const int e = ((const int32_t *)(ids + (int64_t)(r / k) * ids_stride))[r % k];
        order[atomicAdd(&fill[e], 1)] = r;
    }
}

/* Few rows (a decode token's k experts): a warp per (row, weight row), the expert read from the
 * table by the row's id, no sorting. Every block checks all ids first; if one is bad, block (0,0)
 * sets *flag and no block writes anything, as on the sorted path. `vec`: every expert's rows can
 * be read 16 bytes at a time. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(256) k_gather_gemv(const cu_wexp *__restrict__ table, int n_w,
                                                     const char *__restrict__ ids, int64_t ids_s,
                                                     int k, const char *__restrict__ x, int64_t xs,
                                                     int x_per_token, char *__restrict__ y,
                                                     int64_t ys, int64_t K, int64_t N, int rows,
                                                     int *flag) {
    int bad = 0;
    if (threadIdx.x < (unsigned)rows) { /* rows <= MM_GATHER_GEMV_ROWS < blockDim.x */
        const int e = ((const int32_t *)(ids + (int64_t)(threadIdx.x / k) * ids_s))[threadIdx.x % k];
        bad = e < 0 || e >= n_w;
    }
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) *flag = 1;
        return;
    }
    const int lane = threadIdx.x & 31, r = (int)blockIdx.y;
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int e = ((const int32_t *)(ids + (int64_t)(r / k) * ids_s))[r % k];
    const cu_wexp w = table[e];
    float acc[1] = {0.0f};
    mm_row_dot<DT, VEC, 1>(w, n, x + (int64_t)(x_per_token ? r / k : r) * xs, xs, 1, K, lane, acc);
    const float s = cu_warp_sum(acc[0]);
    if (lane == 0) ((float *)(y + (int64_t)r * ys))[n] = s * w.scale;
}

#define MM_GATHER_GEMV_ROWS 32 /* T*k up to this: k_gather_gemv (one block checks all ids) */

/* The device table of an expert list, built once per list (weights never move after load). */
static const cu_wexp *expert_table(cu_ctx *c, const cn_tensor *const *w, int n_w, int *rc) {
    for (int i = 0; i < c->n_tabs; i++) {
        cu_wtab *t = &c->tabs[i];
        if (t->key != w || t->n_w != n_w) continue;
        int same = 1;
        for (int e = 0; e < n_w && same; e++) same = t->host_ptrs[e] == w[e]->data;
        if (same) return (const cu_wexp *)t->dev;
    }
    if (c->n_tabs == c->cap_tabs) {
        int cap = c->cap_tabs ? 2 * c->cap_tabs : 16;
        cu_wtab *p = (cu_wtab *)realloc(c->tabs, (size_t)cap * sizeof *p);
        if (!p) {
            *rc = CN_ENOMEM;
            return NULL;
        }
        c->tabs = p;
        c->cap_tabs = cap;
    }
    cu_wexp *host = (cu_wexp *)malloc((size_t)n_w * sizeof *host);
    const void **ptrs = (const void **)malloc((size_t)n_w * sizeof *ptrs);
    void *dev = NULL;
    if (!host || !ptrs) {
        free(host);
        free(ptrs);
        *rc = CN_ENOMEM;
        return NULL;
    }
    for (int e = 0; e < n_w; e++) {
        host[e] = mm_wexp(w[e]);
        ptrs[e] = w[e]->data;
    }
    *rc = cu_check(cudaMalloc(&dev, (size_t)n_w * sizeof *host), "expert table");
    if (!*rc)
        *rc = cu_check(cudaMemcpy(dev, host, (size_t)n_w * sizeof *host, cudaMemcpyHostToDevice),
                       "expert table upload");
    free(host);
    if (*rc) {
        cudaFree(dev);
        free(ptrs);
        return NULL;
    }
    cu_wtab *t = &c->tabs[c->n_tabs++];
    t->key = w;
    t->n_w = n_w;
    t->host_ptrs = ptrs;
    t->dev = dev;
    return (const cu_wexp *)dev;
}

int cu_matmul_gather(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                     const cn_tensor *x, const cn_tensor *ids) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = ids->shape[0], k = ids->shape[1], rows = T * k;
    if (rows == 0 || y->shape[1] == 0) return CN_OK;
    if (rows > INT32_MAX / 4 || n_w > (1 << 20)) return CN_EINVAL;
    const cn_dtype dt = w[0]->dtype;
    for (int e = 1; e < n_w; e++)
        if (w[e]->dtype != dt) return CN_EUNSUPPORTED; /* one kernel per call: one dtype */
    int rc = CN_OK;
    const cu_wexp *table = expert_table(c, w, n_w, &rc);
    if (!table) return rc;
    if (rows <= MM_GATHER_GEMV_ROWS) {
        const int64_t K = x->shape[1], N = y->shape[1];
        bool vec = true;
        for (int e = 0; e < n_w && vec; e++) vec = mm_can_vec(dt, w[e]->data, w[e]->stride[0], K);
        if ((rc = cu_flag_reset(c))) return rc;
        const dim3 grid((unsigned)((N + 7) / 8), (unsigned)rows);
        if (vec) {
            CU_DISPATCH_WQ(dt, (k_gather_gemv<DT, true><<<grid, 256, 0, c->stream>>>(
                                  table, n_w, (const char *)ids->data, ids->stride[0], (int)k,
                                  (const char *)x->data, x->stride[0], x->shape[0] == T,
                                  (char *)y->data, y->stride[0], K, N, (int)rows, c->flag_dev)));
        } else {
            CU_DISPATCH_WQ(dt, (k_gather_gemv<DT, false><<<grid, 256, 0, c->stream>>>(
                                  table, n_w, (const char *)ids->data, ids->stride[0], (int)k,
                                  (const char *)x->data, x->stride[0], x->shape[0] == T,
                                  (char *)y->data, y->stride[0], K, N, (int)rows, c->flag_dev)));
        }
        if ((rc = cu_launch_check("matmul_gather (gemv)"))) return rc;
        int flag = 0;
        if ((rc = cu_flag_read(c, &flag))) return rc;
        return flag ? CN_EINVAL : CN_OK;
    }
    if (cu_gg_fits(dt, w, n_w, x->shape[1])) return cu_gg_gather(c, y, table, n_w, dt, x, ids);
    const int tm = rows <= 2 * (int64_t)n_w ? 16 : 64;
    const int64_t max_tiles = (rows + tm - 1) / tm + n_w;
    if (max_tiles > 65535) return CN_EUNSUPPORTED;
    /* scratch: cnt [2 n_w], n_tiles [1], order [rows], tiles [max_tiles] */
    size_t n_int = (size_t)(2 * n_w + 1) + (size_t)rows;
    n_int = (n_int + 3) & ~(size_t)3;
    char *mem = (char *)cu_scratch(c, n_int * sizeof(int) + (size_t)max_tiles * sizeof(cu_tile));
    if (!mem) return CN_ENOMEM;
    int *cnt = (int *)mem, *n_tiles = cnt + 2 * n_w, *order = n_tiles + 1;
    cu_tile *tiles = (cu_tile *)(mem + n_int * sizeof(int));
    if ((rc = cu_flag_reset(c))) return rc;
    k_gather_prep<<<1, 1024, 0, c->stream>>>((const char *)ids->data, ids->stride[0], (int)T, (int)k,
                                             n_w, tm, c->flag_dev, cnt, order, tiles, n_tiles);
    if ((rc = cu_launch_check("gather prep"))) return rc;
    mm_args a;
    memset(&a, 0, sizeof a);
    a.x = (const char *)x->data;
    a.xs = x->stride[0];
    a.y = (char *)y->data;
    a.ys = y->stride[0];
    a.K = x->shape[1];
    a.N = y->shape[1];
    a.table = table;
    a.tiles = tiles;
    a.n_tiles = n_tiles;
    a.order = order;
    a.k = (int)k;
    a.x_per_token = x->shape[0] == T;
    CU_DISPATCH_WQ(dt, rc = launch_tiled<DT>(c, a, tm, (unsigned)max_tiles));
    if (rc) return rc;
    int flag = 0;
    if ((rc = cu_flag_read(c, &flag))) return rc;
    return flag ? CN_EINVAL : CN_OK;
}

/* ---------------------------------------------------------------- embedding lookup */

__global__ void k_ids_check(const int32_t *__restrict__ ids, int64_t n, int64_t limit, int *flag) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        if (ids[i] < 0 || ids[i] >= limit) *flag = 1;
}

template <int DT>
__global__ void k_get_rows(const char *__restrict__ table, int64_t ts, float scale,
                           const int32_t *__restrict__ ids, char *__restrict__ y, int64_t ys,
                           int64_t H, const int *flag) {
    if (*flag) return;
    const int64_t t = blockIdx.x;
    const char *src = table + (int64_t)ids[t] * ts;
    float *dst = (float *)(y + t * ys);
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
        dst[i] = DT == CN_F32 ? cu_wval<DT>(src, i) : cu_wval<DT>(src, i) * scale;
}

int cu_get_rows(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = y->shape[0], H = y->shape[1], V = table->shape[0];
    if (T == 0) return CN_OK;
    if (T > INT32_MAX) return CN_EINVAL;
    const float scale = table->dtype == CN_F8_E4M3 ? table->scale : 1.0f;
    int rc = cu_flag_reset(c);
    if (rc) return rc;
    k_ids_check<<<cu_blocks(T, 256), 256, 0, c->stream>>>((const int32_t *)ids->data, T, V,
                                                          c->flag_dev);
    if ((rc = cu_launch_check("get_rows check"))) return rc;
    CU_DISPATCH_W(table->dtype,
                  (k_get_rows<DT><<<(unsigned)T, 256, 0, c->stream>>>(
                      (const char *)table->data, table->stride[0], scale,
                      (const int32_t *)ids->data, (char *)y->data, y->stride[0], H, c->flag_dev)));
    if ((rc = cu_launch_check("get_rows"))) return rc;
    int flag = 0;
    if ((rc = cu_flag_read(c, &flag))) return rc;
    return flag ? CN_EINVAL : CN_OK;
}
