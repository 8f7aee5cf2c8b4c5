/* cuda_elementwise.cu - RMSNorm, the gated grouped RMSNorm, add/mul/silu/relu^2/scale, the greedy
 * argmax of a row, the F32 <-> BF16/F16 conversions of copy and set_rows (rows into a cache at a
 * position), on the GPU.
 *
 * Promises: the same formulas as the CPU backend (silu = x / (1 + expf(-x)), sums of squares in
 * double, then fp32); y may alias an input wherever the contract allows it, because every thread
 * reads its elements before writing them and no thread reads another's outputs. Rows may be
 * strided views.
 */
#include <float.h>
#include <limits.h>

#include "tensor/cuda/cuda_impl.h"

/* ---------------------------------------------------------------- norms */

/* A norm is one row (or group) on one block of norm_threads(n): four values a thread. A
 * decode token's row is then spread wide, so the chain of dependent loads and adds per thread
 * is short; a prompt's thousands of rows fill the GPU with small blocks instead of leaving most
 * of 1024 threads idle at Mamba's groups of 512. */
#define NORM_THREADS 1024

static inline int norm_threads(int64_t n) {
    const int64_t t = (n / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : t > NORM_THREADS ? NORM_THREADS : (int)t;
}

/* Block sum of a double (blocks of whole warps, at most NORM_THREADS); all threads get the
 * total. The order depends only on the block size, which depends only on the row length: a
 * row's norm is the same however many rows share the launch. */
__device__ double block_sum_d(double v) {
    __shared__ double part[NORM_THREADS / 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (int)blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* part[] may still be read from a previous call */
    if (lane == 0) part[wid] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < nw; i++) s += part[i];
    return s;
}

__global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(char *y, int64_t ys, const char *x,
                                                          int64_t xs, const float *__restrict__ w,
                                                          int64_t C, float eps) {
    cu_pdl_enter();
    const float *xr = (const float *)(x + (int64_t)blockIdx.x * xs);
    float *yr = (float *)(y + (int64_t)blockIdx.x * ys);
    double ss = 0;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss);
    const float inv = (float)(1.0 / sqrt(ss / (double)C + eps));
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

/* One block per (row, group): g = x * silu(z), then normalised over the group. */
__global__ void __launch_bounds__(NORM_THREADS) k_gated_rmsnorm(char *y, int64_t ys, const char *x,
                                                                int64_t xs, const char *z,
                                                                int64_t zs,
                                                                const float *__restrict__ w,
                                                                int64_t group, float eps) {
    cu_pdl_enter();
    const int64_t t = blockIdx.x, g0 = (int64_t)blockIdx.y * group;
    const float *xr = (const float *)(x + t * xs) + g0;
    const float *zr = (const float *)(z + t * zs) + g0;
    float *yr = (float *)(y + t * ys) + g0;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
        const float g = xr[i] * cu_silu_f(zr[i]);
        ss += (double)g * g;
    }
    ss = block_sum_d(ss);
    const float inv = (float)(1.0 / sqrt(ss / (double)group + eps));
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
        const float g = xr[i] * cu_silu_f(zr[i]);
        yr[i] = w[g0 + i] * (g * inv);
    }
}

int cu_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0];
    if (T == 0) return CN_OK;
    cu_launch(c, k_rmsnorm, (unsigned)T, norm_threads(x->shape[1]), 0, (char *)y->data,
              y->stride[0], (const char *)x->data, x->stride[0], (const float *)w->data,
              x->shape[1], eps);
    return cu_launch_check("rmsnorm");
}

int cu_gated_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                     const cn_tensor *w, int group, float eps) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], G = x->shape[1] / group;
    if (T == 0 || G == 0) return CN_OK;
    if (G > 65535) return CN_EUNSUPPORTED;
    dim3 grid((unsigned)T, (unsigned)G);
    cu_launch(c, k_gated_rmsnorm, grid, norm_threads(group), 0,
        (char *)y->data, y->stride[0], (const char *)x->data, x->stride[0], (const char *)z->data,
        z->stride[0], (const float *)w->data, group, eps);
    return cu_launch_check("gated_rmsnorm");
}

/* ---------------------------------------------------------------- elementwise */

enum { EW_ADD, EW_MUL, EW_SILU, EW_RELU2, EW_SCALE };

template <int OP>
__global__ void k_ew(char *y, int64_t ys, const char *a, int64_t as, const char *c, int64_t cs,
                     float s, int64_t T, int64_t C) {
    cu_pdl_enter();
    CU_FOR_ROWS(t, T) CU_FOR_COLS(j, C) {
        const float av = ((const float *)(a + t * as))[j];
        float r;
        if (OP == EW_ADD) r = av + ((const float *)(c + t * cs))[j];
        else if (OP == EW_MUL) r = av * ((const float *)(c + t * cs))[j];
        else if (OP == EW_SILU) r = cu_silu_f(av);
        else if (OP == EW_RELU2) {
            const float p = av > 0.0f ? av : 0.0f;
            r = p * p;
        } else r = av * s;
        ((float *)(y + t * ys))[j] = r;
    }
}

template <int OP>
static int ew_run(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c, float s) {
    cu_ctx *ctx = cu_ctx_of(b);
    const int64_t T = y->shape[0], C = y->shape[1];
    if (T == 0 || C == 0) return CN_OK;
    const int nt = cu_rows_threads(C);
    cu_launch(ctx, k_ew<OP>, cu_rows_grid(T, C, nt), nt, 0,
        (char *)y->data, y->stride[0], (const char *)a->data, a->stride[0],
        c ? (const char *)c->data : NULL, c ? c->stride[0] : 0, s, T, C);
    return cu_launch_check("elementwise");
}

int cu_add(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c) {
    return ew_run<EW_ADD>(b, y, a, c, 0.0f);
}
int cu_mul(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c) {
    return ew_run<EW_MUL>(b, y, a, c, 0.0f);
}
int cu_silu(cn_backend *b, cn_tensor *y, const cn_tensor *x) {
    return ew_run<EW_SILU>(b, y, x, NULL, 0.0f);
}
int cu_relu2(cn_backend *b, cn_tensor *y, const cn_tensor *x) {
    return ew_run<EW_RELU2>(b, y, x, NULL, 0.0f);
}
int cu_scale(cn_backend *b, cn_tensor *y, const cn_tensor *x, float s) {
    return ew_run<EW_SCALE>(b, y, x, NULL, s);
}

/* ---------------------------------------------------------------- argmax */

#define ARGMAX_THREADS 256
#define ARGMAX_PER_BLOCK 2048 /* values a block scans at least: a vocabulary row spreads over
                               * ~64 blocks, a row of more than ARGMAX_MAX_BLOCKS such spans
                               * over that many blocks */
#define ARGMAX_MAX_BLOCKS 256

/* (v, i) beats (bv, bi): larger value, or the same value at a lower index. The order of merging
 * never matters: the best pair is unique. */
__device__ __forceinline__ void am_take(float v, int i, float &bv, int &bi) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

/* The block's best pair, in every thread. */
__device__ void am_block(float &bv, int &bi) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        am_take(ov, oi, bv, bi);
    }
    __syncthreads(); /* sv/si may still be read by a previous call */
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = bv;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    for (int w = 0; w < ARGMAX_THREADS / 32; w++) am_take(sv[w], si[w], bv, bi);
}

/* Row blockIdx.y over gridDim.x blocks: each finds its span's best pair, the last block to finish
 * (cnt[row] counts them; it sets it back to 0) merges the spans' pairs. Values not above -inf
 * (NaN, -inf) are never candidates and +inf counts as FLT_MAX, so a row without candidates ends
 * at index INT_MAX and gives 0 (backend.h). */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax(int32_t *__restrict__ ids, const char *__restrict__ x, int64_t xs, int64_t N,
             int64_t per, float *part_v, int *part_i, int *cnt) {
    cu_pdl_enter();
    __shared__ int last;
    const int row = (int)blockIdx.y, nb = (int)gridDim.x;
    const float *xr = (const float *)(x + (int64_t)row * xs);
    const int64_t lo = (int64_t)blockIdx.x * per, hi = lo + per < N ? lo + per : N;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int64_t i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) {
        const float v = xr[i];
        if (!(v > -INFINITY)) continue;
        am_take(fminf(v, FLT_MAX), (int)i, bv, bi);
    }
    am_block(bv, bi);
    if (threadIdx.x == 0) {
        part_v[row * nb + blockIdx.x] = bv;
        part_i[row * nb + blockIdx.x] = bi;
        __threadfence(); /* the pair is visible before the count says so */
        last = atomicAdd(&cnt[row], 1) == nb - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = -INFINITY;
    bi = INT_MAX;
    for (int b = threadIdx.x; b < nb; b += ARGMAX_THREADS)
        am_take(__ldcg(part_v + row * nb + b), __ldcg(part_i + row * nb + b), bv, bi);
    am_block(bv, bi);
    if (threadIdx.x == 0) {
        ids[row] = bi == INT_MAX ? 0 : bi;
        cnt[row] = 0; /* every span has arrived: ready for the next launch */
    }
}

int cu_argmax(cn_backend *b, cn_tensor *ids, const cn_tensor *x) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], N = x->shape[1];
    if (T == 0) return CN_OK;
    if (N > INT32_MAX) return CN_EINVAL;
    int64_t per = ARGMAX_PER_BLOCK;
    if ((N + per - 1) / per > ARGMAX_MAX_BLOCKS) per = (N + ARGMAX_MAX_BLOCKS - 1) / ARGMAX_MAX_BLOCKS;
    const int64_t nb = (N + per - 1) / per, R = T < CU_ARGMAX_ROWS ? T : CU_ARGMAX_ROWS;
    char *mem = (char *)cu_scratch(c, (size_t)(R * nb) * (sizeof(float) + sizeof(int)));
    if (!mem) return CN_ENOMEM;
    float *pv = (float *)mem;
    int *pi = (int *)(mem + (size_t)(R * nb) * sizeof(float));
    for (int64_t t0 = 0; t0 < T; t0 += R) { /* CU_ARGMAX_ROWS rows per launch: one counter each */
        const int64_t r = T - t0 < R ? T - t0 : R;
        const dim3 grid((unsigned)nb, (unsigned)r);
        cu_launch(c, k_argmax, grid, ARGMAX_THREADS, 0,
            (int32_t *)ids->data + t0, (const char *)x->data + t0 * x->stride[0], x->stride[0], N,
            per, pv, pi, c->am_cnt);
        const int rc = cu_launch_check("argmax");
        if (rc) return rc;
    }
    return CN_OK;
}

/* ---------------------------------------------------------------- conversions */

/* SD -> DD, each a cn_dtype among F32, BF16, F16; rounding to nearest even. */
template <int DD, int SD>
__global__ void k_convert(char *d, int64_t ds, const char *s, int64_t ss, int64_t R, int64_t C) {
    cu_pdl_enter();
    CU_FOR_ROWS(r, R) CU_FOR_COLS(j, C) {
        const float v = cu_wval<SD>(s + r * ss, j);
        char *dr = d + r * ds;
        if (DD == CN_F32) ((float *)dr)[j] = v;
        else if (DD == CN_BF16) ((__nv_bfloat16 *)dr)[j] = __float2bfloat16_rn(v);
        else ((__half *)dr)[j] = __float2half_rn(v);
    }
}

int cu_convert(cn_backend *b, cn_tensor *dst, const cn_tensor *src) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t R = dst->shape[0], C = dst->shape[1];
    const int nt = cu_rows_threads(C);
    const dim3 blocks = cu_rows_grid(R, C, nt);
    char *d = (char *)dst->data;
    const char *s = (const char *)src->data;
    const int64_t ds = dst->stride[0], ss = src->stride[0];
    const cn_dtype dd = dst->dtype, sd = src->dtype;
    if (dd == CN_F32 && sd == CN_BF16)
        cu_launch(c, k_convert<CN_F32, CN_BF16>, blocks, nt, 0, d, ds, s, ss, R, C);
    else if (dd == CN_F32 && sd == CN_F16)
        cu_launch(c, k_convert<CN_F32, CN_F16>, blocks, nt, 0, d, ds, s, ss, R, C);
    else if (dd == CN_BF16 && sd == CN_F32)
        cu_launch(c, k_convert<CN_BF16, CN_F32>, blocks, nt, 0, d, ds, s, ss, R, C);
    else if (dd == CN_F16 && sd == CN_F32)
        cu_launch(c, k_convert<CN_F16, CN_F32>, blocks, nt, 0, d, ds, s, ss, R, C);
    else return CN_EUNSUPPORTED;
    return cu_launch_check("convert");
}

/* ---------------------------------------------------------------- set_rows */

/* Rows of n bytes, copied as 4-byte words when every row and stride allows it. The first row is
 * (pos ? *pos : 0) + delta, read on the device so that a replayed step writes where its
 * position says (cuda_impl.h invariant 5); a range past dst_rows writes nothing. */
template <typename W>
__global__ void k_set_rows(char *dst, int64_t ds, int64_t dst_rows, const int *pos, int delta,
                           const char *src, int64_t ss, int64_t R, int64_t n) {
    cu_pdl_enter();
    const int64_t row = (int64_t)(pos ? *pos : 0) + delta;
    if (row < 0 || row + R > dst_rows) return;
    const int64_t per = n / (int64_t)sizeof(W);
    CU_FOR_ROWS(r, R) CU_FOR_COLS(j, per) {
        ((W *)(dst + (row + r) * ds))[j] = ((const W *)(src + r * ss))[j];
    }
}

int cu_set_rows(cn_backend *b, cn_tensor *dst, int row, const cn_tensor *src) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t R = src->shape[0], esz = (int64_t)cn_dtype_size(src->dtype);
    const int64_t n = src->shape[1] * esz;
    if (esz == 0) return CN_EUNSUPPORTED;
    if (R == 0 || n == 0) return CN_OK;
    int delta;
    const int *pos = cu_pos(c, row, &delta);
    char *d = (char *)dst->data;
    const char *s = (const char *)src->data;
    const int64_t ds = dst->stride[0], ss = src->stride[0];
    if (n % 4 == 0 && ds % 4 == 0 && ss % 4 == 0 && (uintptr_t)d % 4 == 0 && (uintptr_t)s % 4 == 0) {
        const int nt = cu_rows_threads(n / 4);
        cu_launch(c, k_set_rows<uint32_t>, cu_rows_grid(R, n / 4, nt), nt, 0,
            d, ds, dst->shape[0], pos, delta, s, ss, R, n);
    } else {
        const int nt = cu_rows_threads(n);
        cu_launch(c, k_set_rows<unsigned char>, cu_rows_grid(R, n, nt), nt, 0,
            d, ds, dst->shape[0], pos, delta, s, ss, R, n);
    }
    return cu_launch_check("set_rows");
}
