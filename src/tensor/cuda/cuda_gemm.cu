/* cuda_gemm.cu - y = x W^T (dense and gathered by expert) and the embedding lookup on the GPU.
 *
 * Promises: weights are read in their stored dtype and decoded in registers (F8 and the NVFP4
 * global scaled once per output, as on the CPU; NVFP4's E4M3 scale per 16 and MXFP8's E8M0 per 32
 * applied to each weight - the decode GEMV to each block's partial sum - so the result is the fp32
 * product with the dequantized weights up to rounding; the CPU instead quantizes activations to
 * int8 for NVFP4); activations stay fp32. Dense paths, by rows T:
 *   T = 1, NVFP4, K % 64 == 0  the integer decode GEMV (k_gemv_fp4, see there)
 *   T = 1, rows in 16 bytes    the decode GEMV (k_gemv1): x in shared memory, 2 weight rows per
 *                              warp, K split over warps when N is small (see there)
 *   T <= MM_GEMV_ROWS          a warp per weight row, all T rows at once (weights read once,
 *                              16 bytes per lane per load when rows are aligned)
 *   F32 weights, larger T      cublasSgemm (fp32, no TF32)
 *   BF16 weights, T >= 32      cublasGemmEx on tensor cores, once per bf16 term of x split in
 *                              two (cuda_impl.h (4))
 *   BF16, F8, NVFP4, MXFP8     the tensor-core kernels of cuda_grouped_gemm.cu when the rows
 *   weights, otherwise         and K fit them (cu_gg_fits), dense and gathered
 *   otherwise                  a tiled SIMT kernel (64x64 tiles, fp32 FMA)
 * The gathered matmul, for at most MM_GATHER_GEMV_ROWS rows (a decode token's experts), runs the
 * GEMV (k_gemv1 when rows load 16 bytes at a time) with each row's expert looked up by its id, all
 * rows in one launch; for more rows it sorts them by expert on the
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
    cu_pdl_enter();
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
    if (T == 1) cu_launch(c, k_gemv<DT, VEC, 1>, blocks, 256, 0, we, xd, xs, yd, ys, T, K, N);
    else if (T == 2) cu_launch(c, k_gemv<DT, VEC, 2>, blocks, 256, 0, we, xd, xs, yd, ys, T, K, N);
    else if (T <= 4) cu_launch(c, k_gemv<DT, VEC, 4>, blocks, 256, 0, we, xd, xs, yd, ys, T, K, N);
    else cu_launch(c, k_gemv<DT, VEC, MM_GEMV_ROWS>, blocks, 256, 0, we, xd, xs, yd, ys, T, K, N);
}

/* ---------------------------------------------------------------- GEMV of one x row */

/* A decode token (one x row, dense or per gathered expert row) is a pure weight stream, so its
 * kernel is built for bytes in flight and few instructions per weight byte:
 *  - x is staged once per block in shared memory (any alignment, K <= MM_G1_MAXK), so the 8x more
 *    x bytes than weight bytes of NVFP4 never go through L1 as scattered loads;
 *  - a warp takes MM_G1_RW weight rows at once, every x value read is used for all of them, and
 *    each lane keeps MM_G1_RW x U 16-byte weight loads in flight, the first ones requested before
 *    x is staged and each group's next ones before its sums are reduced;
 *  - x is stored swizzled (float4 f at f ^ (f / 8 mod Q), Q float4s per chunk), so the 8 lanes
 *    of a shared memory phase, reading the same float4 of 8 consecutive chunks, hit distinct banks;
 *  - small N splits K over S warps per row group (partials summed in a fixed order in shared
 *    memory), so a 128-row router or a 256-row projection still fills the GPU;
 *  - blocks loop over row groups in one wave (as many blocks as are resident), so x is staged
 *    once per block, not per row. Two rows per warp and registers for three blocks per SM
 *    measured 1.04-1.06x faster decode on the H200 than four rows and two blocks (nano-shape
 *    slice, NVFP4 and BF16), fewer rows or more blocks slower (spills).
 * Weights are decoded as mm_chunk_val does, but a block scale (NVFP4 per 16, MXFP8 per 32) is
 * applied to the fp32 partial sum of its block's products rather than to each weight (one multiply
 * per block instead of per weight; the same sum up to rounding); products are summed in fp32 per
 * lane, then across lanes and split warps in a fixed order. */
#define MM_G1_RW 2      /* weight rows per warp */
#define MM_G1_MINB 3    /* blocks per SM the registers must allow */
#define MM_G1_MAXK 8192 /* x values staged in shared memory (32 KiB) */

template <int DT>
struct mm_g1 {
    static constexpr int V = mm_vec<DT>::n;  /* weights per 16-byte chunk */
    static constexpr int Q = V / 4;          /* float4s of x per chunk */
    static constexpr int U = (DT == CN_NVFP4 || DT == CN_MXFP8) ? 1 : 2; /* chunks in flight */
};

/* Weights 4q..4q+3 of a 16-byte chunk as stored, without block scales (q is a constant). */
template <int DT>
__device__ __forceinline__ void mm_g1_dec4(const uint4 &raw, int q, const float *lut, float w[4]) {
    if (DT == CN_F32) {
        w[0] = __uint_as_float(raw.x);
        w[1] = __uint_as_float(raw.y);
        w[2] = __uint_as_float(raw.z);
        w[3] = __uint_as_float(raw.w);
    } else if (DT == CN_BF16 || DT == CN_F16) {
        const unsigned lo = q ? raw.z : raw.x, hi = q ? raw.w : raw.y;
        if (DT == CN_BF16) {
            w[0] = __uint_as_float(lo << 16);
            w[1] = __uint_as_float(lo & 0xffff0000u);
            w[2] = __uint_as_float(hi << 16);
            w[3] = __uint_as_float(hi & 0xffff0000u);
        } else {
            w[0] = __half2float(__ushort_as_half((unsigned short)(lo & 0xffffu)));
            w[1] = __half2float(__ushort_as_half((unsigned short)(lo >> 16)));
            w[2] = __half2float(__ushort_as_half((unsigned short)(hi & 0xffffu)));
            w[3] = __half2float(__ushort_as_half((unsigned short)(hi >> 16)));
        }
    } else if (DT == CN_F8_E4M3 || DT == CN_MXFP8) {
        const unsigned v = q == 0 ? raw.x : q == 1 ? raw.y : q == 2 ? raw.z : raw.w;
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = cu_e4m3((v >> (8 * i)) & 0xffu);
    } else { /* NVFP4: 4 nibbles, half a 32-bit word */
        const int wq = q >> 1;
        const unsigned v = (wq == 0 ? raw.x : wq == 1 ? raw.y : wq == 2 ? raw.z : raw.w) >>
                           ((q & 1) * 16);
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = lut[(v >> (4 * i)) & 15u];
    }
}

/* 16 bytes of a weight row that is read once per token: not kept in L1. */
__device__ __forceinline__ uint4 mm_g1_load(const char *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Stores the RW outputs v of group grp of row r (those below N) through the epilogue. */
template <int RW>
__device__ __forceinline__ void g1_write(const g1_epi &e, bool combine, char *__restrict__ y,
                                         int64_t ys, int r, int k, int64_t grp, int64_t n_groups,
                                         int64_t N, const float *v) {
    const int64_t n0 = grp * RW;
    if (!combine) {
        float *yr = (float *)(y + (int64_t)r * ys);
#pragma unroll
        for (int i = 0; i < RW; i++)
            if (n0 + i < N) g1_store(e, yr, n0 + i, v[i]);
        return;
    }
    float *pr = e.prt + (int64_t)r * N;
#pragma unroll
    for (int i = 0; i < RW; i++)
        if (n0 + i < N) pr[n0 + i] = v[i];
    __threadfence(); /* the products are visible before the count says so */
    const int t = r / k;
    int *cp = e.cnt + (int64_t)t * n_groups + grp;
    if (atomicAdd(cp, 1) != k - 1) return;
    __threadfence();
    float *yr = (float *)(y + (int64_t)t * ys);
#pragma unroll
    for (int i = 0; i < RW; i++)
        if (n0 + i < N) yr[n0 + i] += g1_combined(e, t, k, N, n0 + i);
    *cp = 0; /* every row of the token has arrived: ready for the next launch */
}

/* Stages the x row xr (K values) in shared memory xsm for k_gemv1: float4 f at
 * f ^ ((f / 8) mod Q) (Q = 1: in order), normalised as epi says; returns the row's norm scale (1
 * without), which multiplies each output. Each thread takes float4s tid + 256 p, with G1_SP
 * passes' loads in flight at once (a pass at a time, each waiting for its own memory round, the
 * gated out_proj's 16 passes took 34.6 us against 13-14 for plain GEMVs of its size). K % 4
 * == 0 (every caller's rows load 16 bytes at a time); x may sit at any alignment. Every thread
 * of the block (256) calls it; it ends with a __syncthreads. */
#define G1_SP 2
template <int Q>
__device__ __forceinline__ float g1_stage(const float *__restrict__ xr, float *xsm, int64_t K,
                                          const g1_epi &epi) {
    __shared__ double gsq[MM_G1_MAXK / 128]; /* gated: squares per 128 values (a warp's pass) */
    __shared__ float ginv[MM_G1_MAXK / 256];
    __shared__ double ssw[8];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nf = (int)(K >> 2);
    const bool vec = !(((uintptr_t)xr | (uintptr_t)epi.gate | (uintptr_t)epi.norm) & 15u);
    float4 *x4 = (float4 *)xsm;
    double ss = 0.0;
    for (int p0 = 0; p0 * 256 < nf; p0 += G1_SP) {
        float4 v[G1_SP];
#pragma unroll
        for (int b = 0; b < G1_SP; b++) {
            const int f = tid + 256 * (p0 + b);
            v[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (f < nf) {
                v[b] = cu_ld4(xr + 4 * f, vec);
                if (epi.gate) { /* g = x silu(z) */
                    const float4 z = cu_ld4(epi.gate + 4 * f, vec);
                    v[b].x *= cu_silu_f(z.x);
                    v[b].y *= cu_silu_f(z.y);
                    v[b].z *= cu_silu_f(z.z);
                    v[b].w *= cu_silu_f(z.w);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < G1_SP; b++) {
            const int p = p0 + b, f = tid + 256 * p;
            double q = (double)v[b].x * v[b].x;
            q += (double)v[b].y * v[b].y;
            q += (double)v[b].z * v[b].z;
            q += (double)v[b].w * v[b].w;
            if (!epi.gate) {
                ss += q;
            } else if (256 * p < nf) { /* K % 256 == 0 here: whole warps in or out */
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
                if (lane == 0) gsq[p * 8 + warp] = q;
            }
            if (f < nf) {
                float4 o = v[b];
                if (epi.norm && !epi.gate) {
                    const float4 n = cu_ld4(epi.norm + 4 * f, vec);
                    o = make_float4(n.x * o.x, n.y * o.y, n.z * o.z, n.w * o.w);
                }
                x4[f ^ ((f >> 3) & (Q - 1))] = o;
            }
        }
    }
    if (epi.gate) {
        __syncthreads();
        if (tid < (int)(K / epi.group)) { /* group sums in a fixed order: replays are exact */
            const int nu = epi.group / 128;
            double sg = 0.0;
            for (int u = tid * nu; u < (tid + 1) * nu; u++) sg += gsq[u];
            ginv[tid] = (float)(1.0 / sqrt(sg / (double)epi.group + epi.eps));
        }
        __syncthreads();
        for (int f = tid; f < nf; f += blockDim.x) {
            const float inv = ginv[4 * f / epi.group];
            const float4 n = cu_ld4(epi.norm + 4 * f, vec);
            float4 &o = x4[f ^ ((f >> 3) & (Q - 1))];
            o = make_float4(n.x * (o.x * inv), n.y * (o.y * inv), n.z * (o.z * inv),
                            n.w * (o.w * inv));
        }
    }
    if (epi.norm && !epi.gate) { /* the sum of squares waits for the sync the staging needs */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) ssw[warp] = ss;
    }
    __syncthreads();
    float rs = 1.0f; /* the row's norm scale, 1 without (x * 1.0f is exact) */
    if (epi.norm && !epi.gate) {
        double t = 0.0;
        for (int i = 0; i < 8; i++) t += ssw[i];
        rs = (float)(1.0 / sqrt(t / (double)K + epi.eps));
    }
    return rs;
}

/* y[r][n] = w.scale * dot(W_r[n], x_r) for blockIdx.y = r: dense (table NULL, one row) or the
 * gathered rows of a decode token (W_r = table[ids[r]], rows <= MM_GATHER_GEMV_ROWS; every block
 * checks all ids first and on a bad one block (0,0) sets *flag and nothing is written). */
template <int DT>
__global__ void __launch_bounds__(256, MM_G1_MINB)
    k_gemv1(cu_wexp dense, const cu_wexp *__restrict__ table, int n_w, const char *__restrict__ ids,
            int64_t ids_s, int k, const char *__restrict__ x, int64_t xs, int x_per_token,
            char *__restrict__ y, int64_t ys, int64_t K, int64_t N, int S, int rows, int *flag,
            g1_epi epi) {
    constexpr int V = mm_g1<DT>::V, Q = mm_g1<DT>::Q, U = mm_g1<DT>::U, RW = MM_G1_RW;
    /* BS: block-scaled; BQ: float4s of a chunk per block scale (NVFP4 4, MXFP8 the whole chunk) */
    constexpr bool BS = DT == CN_NVFP4 || DT == CN_MXFP8;
    constexpr int BQ = DT == CN_NVFP4 ? 4 : Q;
    extern __shared__ float4 g1_x[]; /* [K / 4] */
    __shared__ float lut[16];
    __shared__ float part[8][RW];
    const int tid = threadIdx.x, r = (int)blockIdx.y;
    cu_wexp w = dense;
    int64_t xrow = 0;
    if (table) cu_pdl_enter(); /* the ids come from the kernel before */
    if (!g1_expert(table, n_w, ids, ids_s, k, x_per_token, rows, flag, &w, &xrow)) return;
    /* The warp's first weight chunks are requested before x is staged (and, dense, before the
     * kernel before has finished: invariant 7): their memory latency runs under the staging and
     * its syncs instead of after them. */
    const int warp = tid >> 5, lane = tid & 31, G = 8 / S, g = warp / S, s = warp - g * S;
    const int64_t n_groups = (N + RW - 1) / RW, nu = K / V, step = (int64_t)S * 32;
    const int64_t u0 = (int64_t)s * 32 + lane, gstep = (int64_t)gridDim.x * G;
    const char *wr[RW];
    const unsigned char *br[RW];
    uint4 raw[U][RW];
    float s0[U][RW], s1[U][RW];
    auto rows_of = [&](int64_t grp) {
#pragma unroll
        for (int i = 0; i < RW; i++) { /* rows past N repeat row N - 1 and are not written */
            const int64_t n = grp * RW + i < N ? grp * RW + i : N - 1;
            wr[i] = w.data + n * w.stride;
            br[i] = (DT == CN_NVFP4 || DT == CN_MXFP8) ? w.bs + n * w.bs_stride : NULL;
        }
    };
    auto fetch = [&](int64_t u) { /* chunks u + j step, j < U, of the group's rows */
#pragma unroll
        for (int j = 0; j < U; j++) {
            const int64_t uj = u + j * step;
            if (uj >= nu) break;
#pragma unroll
            for (int i = 0; i < RW; i++) {
                raw[j][i] = mm_g1_load(wr[i] + uj * 16);
                s0[j][i] = s1[j][i] = 1.0f;
                if (DT == CN_NVFP4) {
                    s0[j][i] = cu_e4m3(br[i][2 * uj]);
                    s1[j][i] = cu_e4m3(br[i][2 * uj + 1]);
                } else if (DT == CN_MXFP8) {
                    s0[j][i] = cu_e8m0(br[i][uj >> 1]);
                }
            }
        }
    };
    if ((int64_t)blockIdx.x * G + g < n_groups) {
        rows_of((int64_t)blockIdx.x * G + g);
        fetch(u0);
    }
    if (DT == CN_NVFP4 && tid < 16) lut[tid] = cu_e2m1((unsigned)tid); /* g1_stage syncs */
    if (!table) cu_pdl_enter();
    const float rs = g1_stage<Q>((const float *)(x + xrow * xs), (float *)g1_x, K, epi);
    const bool combine = g1_combines(table, epi);
    for (int64_t base = (int64_t)blockIdx.x * G; base < n_groups; base += gstep) {
        const int64_t grp = base + g;
        float acc[RW];
#pragma unroll
        for (int i = 0; i < RW; i++) acc[i] = 0.0f;
        if (grp < n_groups) {
            for (int64_t u = u0; u < nu;) {
#pragma unroll
                for (int j = 0; j < U; j++) {
                    const int64_t uj = u + j * step;
                    if (j && uj >= nu) break;
                    const float4 *xu = g1_x + uj * Q;
                    const int sw = (int)((uj * Q) >> 3) & (Q - 1); /* the staging's swizzle */
                    float tb[RW]; /* a scale block's partial sums */
#pragma unroll
                    for (int q = 0; q < Q; q++) {
                        const float4 xv = xu[q ^ sw];
#pragma unroll
                        for (int i = 0; i < RW; i++) {
                            float wv[4];
                            mm_g1_dec4<DT>(raw[j][i], q, lut, wv);
                            if (BS) {
                                if (q % BQ == 0) tb[i] = 0.0f;
                                tb[i] = fmaf(wv[0], xv.x, tb[i]);
                                tb[i] = fmaf(wv[1], xv.y, tb[i]);
                                tb[i] = fmaf(wv[2], xv.z, tb[i]);
                                tb[i] = fmaf(wv[3], xv.w, tb[i]);
                                if (q % BQ == BQ - 1)
                                    acc[i] = fmaf(tb[i], q < BQ ? s0[j][i] : s1[j][i], acc[i]);
                            } else {
                                acc[i] = fmaf(wv[0], xv.x, acc[i]);
                                acc[i] = fmaf(wv[1], xv.y, acc[i]);
                                acc[i] = fmaf(wv[2], xv.z, acc[i]);
                                acc[i] = fmaf(wv[3], xv.w, acc[i]);
                            }
                        }
                    }
                }
                u += step * U;
                if (u < nu) fetch(u);
            }
        }
        /* the next group's first chunks, in flight while this one's sums are reduced */
        if (grp + gstep < n_groups) {
            rows_of(grp + gstep);
            fetch(u0);
        }
#pragma unroll
        for (int i = 0; i < RW; i++) acc[i] = cu_warp_sum(acc[i]);
        if (S == 1) {
            if (lane == 0 && grp < n_groups) {
                float v[RW];
#pragma unroll
                for (int i = 0; i < RW; i++) v[i] = acc[i] * rs * w.scale;
                g1_write<RW>(epi, combine, y, ys, r, k, grp, n_groups, N, v);
            }
        } else {
            if (lane == 0)
#pragma unroll
                for (int i = 0; i < RW; i++) part[warp][i] = acc[i];
            __syncthreads();
            if (s == 0 && lane == 0 && grp < n_groups) {
                float v[RW];
#pragma unroll
                for (int i = 0; i < RW; i++) {
                    float sum = part[warp][i];
                    for (int j = 1; j < S; j++) sum += part[warp + j][i];
                    v[i] = sum * rs * w.scale;
                }
                g1_write<RW>(epi, combine, y, ys, r, k, grp, n_groups, N, v);
            }
            __syncthreads();
        }
    }
}

/* The decode GEMVs' arguments for a plain product (no norm in, no epilogue), and the dense weight
 * of a gathered launch (none: every row's weight comes from the expert table). */
static const g1_epi g1_plain = {NULL, NULL, 0, 0.0f, 0, NULL, 0, NULL, NULL};
static const cu_wexp g1_no_dense = {NULL, 0, 1.0f, NULL, 0};

/* Launches k_gemv1 over `rows` rows of y (grid.y) with the split and grid sized for the GPU. */
template <int DT>
static void launch_gemv1(cu_ctx *c, const cu_wexp &dense, const cu_wexp *table, int n_w,
                         const cn_tensor *ids, int k, const cn_tensor *x, int x_per_token,
                         cn_tensor *y, int64_t K, int64_t N, int rows, const g1_epi &epi) {
    const int64_t n_groups = (N + MM_G1_RW - 1) / MM_G1_RW, want = (int64_t)c->n_sm * 32;
    int S = 1;
    while (S < 8 && rows * n_groups * S < want) S *= 2;
    int64_t bx = (n_groups + 8 / S - 1) / (8 / S);
    int &per_sm = c->g1_blocks[DT]; /* resident blocks per SM, asked once (largest staging) */
    if (!per_sm &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_gemv1<DT>, 256,
                                                      (size_t)MM_G1_MAXK * sizeof(float)) != cudaSuccess)
        per_sm = 1;
    if (per_sm < 1) per_sm = 1;
    /* one wave: every block stages x once, so a second wave would pay for it again */
    const int64_t cap = ((int64_t)c->n_sm * per_sm + rows - 1) / rows;
    const dim3 grid((unsigned)(bx > cap ? cap : bx), (unsigned)rows);
    cu_launch(c, k_gemv1<DT>, grid, 256, (size_t)K * sizeof(float),
        dense, table, n_w, ids ? (const char *)ids->data : NULL, ids ? ids->stride[0] : 0, k,
        (const char *)x->data, x->stride[0], x_per_token, (char *)y->data, y->stride[0], K, N, S,
        rows, c->flag_dev, epi);
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
    cu_pdl_enter();
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
    if (tm == 16) cu_launch(c, k_mm_tiled<DT, 16>, grid, MM_THREADS, 0, a);
    else cu_launch(c, k_mm_tiled<DT, 64>, grid, MM_THREADS, 0, a);
    return cu_launch_check("matmul (tiled)");
}

/* ---------------------------------------------------------------- dense */

/* The grouped GEMM and cuBLAS's dense path split the same way (cu_split_bf16). */
static __global__ void k_split_bf16(const char *__restrict__ x, int64_t xs,
                                    __nv_bfloat16 *__restrict__ out, int64_t T, int64_t K) {
    cu_pdl_enter();
    const int64_t n = T * K;
    CU_FOR_ROWS(t, T) CU_FOR_COLS(k, K) {
        const int64_t i = t * K + k;
        float v = ((const float *)(x + t * xs))[k];
#pragma unroll
        for (int j = 0; j < CU_SPLIT; j++) {
            const __nv_bfloat16 h = __float2bfloat16_rn(v);
            out[j * n + i] = h;
            v -= __bfloat162float(h);
        }
    }
}

/* See cuda_impl.h. */
int cu_split_bf16(cu_ctx *c, const cn_tensor *x, __nv_bfloat16 *planes) {
    const int64_t T = x->shape[0], K = x->shape[1];
    const int nt = cu_rows_threads(K);
    cu_launch(c, k_split_bf16, cu_rows_grid(T, K, nt), nt, 0, (const char *)x->data, x->stride[0],
              planes, T, K);
    return cu_launch_check("matmul split");
}

static int blas_rc(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return CN_OK;
    cn_error("cuda: %s: %s", what, cublasGetStatusString(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? CN_ENOMEM : CN_EIO;
}

static int matmul_bf16_split(cu_ctx *c, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    const int64_t T = x->shape[0], K = x->shape[1], N = w->shape[0];
    __nv_bfloat16 *terms =
        (__nv_bfloat16 *)cu_scratch(c, (size_t)(CU_SPLIT * T * K) * sizeof(__nv_bfloat16));
    if (!terms) return CN_ENOMEM;
    int rc = cu_split_bf16(c, x, terms);
    const float one = 1.0f, zero = 0.0f;
    for (int j = 0; j < CU_SPLIT && !rc; j++)
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
        const bool vec = mm_can_vec(w->dtype, w->data, w->stride[0], K);
        if (T == 1 && cu_fp4_fits(&w, 1, K)) {
            cu_gemv_fp4(c, we, NULL, 0, NULL, 1, x, 0, y, K, N, 1, g1_plain);
            return cu_launch_check("matmul (gemv fp4)");
        }
        if (T == 1 && vec && K <= MM_G1_MAXK) {
            CU_DISPATCH_WQ(w->dtype,
                           (launch_gemv1<DT>(c, we, NULL, 0, NULL, 1, x, 0, y, K, N, 1, g1_plain)));
            return cu_launch_check("matmul (gemv1)");
        }
        if (vec) {
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

/* See cuda_impl.h. */
__global__ void __launch_bounds__(1024) k_gather_prep(const char *__restrict__ ids, int64_t ids_stride,
                                                      int T, int k, int n_w, int tm, int *flag,
                                                      int *cnt /* [2 * n_w] */, int *order,
                                                      cu_tile *tiles, int *n_tiles) {
    cu_pdl_enter();
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
    cu_pdl_enter();
    cu_wexp w;
    int64_t xrow;
    if (!g1_expert(table, n_w, ids, ids_s, k, x_per_token, rows, flag, &w, &xrow)) return;
    const int lane = threadIdx.x & 31, r = (int)blockIdx.y;
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[1] = {0.0f};
    mm_row_dot<DT, VEC, 1>(w, n, x + xrow * xs, xs, 1, K, lane, acc);
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
        if (cu_fp4_fits(w, n_w, K)) {
            cu_gemv_fp4(c, g1_no_dense, table, n_w, ids, (int)k, x, x->shape[0] == T, y, K, N,
                        (int)rows, g1_plain);
        } else if (vec && K <= MM_G1_MAXK) {
            CU_DISPATCH_WQ(dt, (launch_gemv1<DT>(c, g1_no_dense, table, n_w, ids, (int)k, x,
                                                 x->shape[0] == T, y, K, N, (int)rows, g1_plain)));
        } else if (vec) {
            CU_DISPATCH_WQ(dt, (cu_launch(c, k_gather_gemv<DT, true>, grid, 256, 0,
                                  table, n_w, (const char *)ids->data, ids->stride[0], (int)k,
                                  (const char *)x->data, x->stride[0], x->shape[0] == T,
                                  (char *)y->data, y->stride[0], K, N, (int)rows, c->flag_dev)));
        } else {
            CU_DISPATCH_WQ(dt, (cu_launch(c, k_gather_gemv<DT, false>, grid, 256, 0,
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
    cu_launch(c, k_gather_prep, 1, 1024, 0, (const char *)ids->data, ids->stride[0], (int)T, (int)k,
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

/* ---------------------------------------------------------------- fused epilogues */

/* matmul_ep (backend.h): the one-row GEMV with its epilogue; other shapes are refused
 * (CN_EUNSUPPORTED, nothing queued) and the caller runs the plain ops. */
int cu_matmul_ep(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x,
                 const cn_mm_ep *f) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], K = x->shape[1], N = w->shape[0];
    if (T != 1 || K > MM_G1_MAXK || !mm_can_vec(w->dtype, w->data, w->stride[0], K))
        return CN_EUNSUPPORTED;
    if (f->gate && (K % 256 || f->group % 256)) return CN_EUNSUPPORTED; /* k_gemv1's staging */
    if (N == 0) return CN_OK;
    const cu_wexp we = mm_wexp(w);
    const g1_epi epi = {f->norm ? (const float *)f->norm->data : NULL,
                        f->gate ? (const float *)f->gate->data : NULL, f->group, f->eps, f->ep,
                        NULL, 0, NULL, NULL};
    if (cu_fp4_fits(&w, 1, K)) cu_gemv_fp4(c, we, NULL, 0, NULL, 1, x, 0, y, K, N, 1, epi);
    else CU_DISPATCH_WQ(w->dtype, (launch_gemv1<DT>(c, we, NULL, 0, NULL, 1, x, 0, y, K, N, 1, epi)));
    return cu_launch_check("matmul_ep (gemv1)");
}

/* matmul_gather_ep (backend.h): a decode token's experts in one GEMV launch with the epilogue
 * (combining through the scratch rows and the context's counters, g1_epi); other shapes are
 * refused as above. */
int cu_matmul_gather_ep(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                        const cn_tensor *x, const cn_tensor *ids, const cn_mm_ep *f) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = ids->shape[0], k = ids->shape[1], rows = T * k;
    const int64_t K = x->shape[1], N = y->shape[1];
    if (rows > MM_GATHER_GEMV_ROWS || K > MM_G1_MAXK || n_w > (1 << 20)) return CN_EUNSUPPORTED;
    const cn_dtype dt = w[0]->dtype;
    for (int e = 0; e < n_w; e++)
        if (w[e]->dtype != dt || !mm_can_vec(dt, w[e]->data, w[e]->stride[0], K))
            return CN_EUNSUPPORTED;
    const int64_t n_groups = (N + MM_G1_RW - 1) / MM_G1_RW;
    if (f->ep == CN_EP_ACC && (T * n_groups > CU_EP_COUNTERS || c->lane))
        return CN_EUNSUPPORTED; /* the counters belong to the main lane (invariant 8) */
    if (rows == 0 || N == 0) return CN_OK;
    int rc = CN_OK;
    const cu_wexp *table = expert_table(c, w, n_w, &rc);
    if (!table) return rc;
    g1_epi epi = {f->norm ? (const float *)f->norm->data : NULL, NULL, 0, f->eps, f->ep, NULL, 0,
                  NULL, NULL};
    if (f->ep == CN_EP_ACC) {
        epi.prt = (float *)cu_scratch(c, (size_t)(rows * N) * sizeof(float));
        if (!epi.prt) return CN_ENOMEM;
        epi.cw = (const char *)f->weights->data;
        epi.cws = f->weights->stride[0];
        epi.cnt = c->ep_cnt;
    }
    if ((rc = cu_flag_reset(c))) return rc;
    if (cu_fp4_fits(w, n_w, K))
        cu_gemv_fp4(c, g1_no_dense, table, n_w, ids, (int)k, x, x->shape[0] == T, y, K, N,
                    (int)rows, epi);
    else
        CU_DISPATCH_WQ(dt, (launch_gemv1<DT>(c, g1_no_dense, table, n_w, ids, (int)k, x,
                                             x->shape[0] == T, y, K, N, (int)rows, epi)));
    if ((rc = cu_launch_check("matmul_gather_ep (gemv1)"))) return rc;
    int flag = 0;
    if ((rc = cu_flag_read(c, &flag))) return rc;
    return flag ? CN_EINVAL : CN_OK;
}

/* ---------------------------------------------------------------- embedding lookup */

__global__ void k_ids_check(const int32_t *__restrict__ ids, int64_t n, int64_t limit, int *flag) {
    cu_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        if (ids[i] < 0 || ids[i] >= limit) *flag = 1;
}

template <int DT>
__global__ void k_get_rows(const char *__restrict__ table, int64_t ts, float scale,
                           const int32_t *__restrict__ ids, char *__restrict__ y, int64_t ys,
                           int64_t H, const int *flag) {
    cu_pdl_enter();
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
    cu_launch(c, k_ids_check, cu_blocks(T, 256), 256, 0, (const int32_t *)ids->data, T, V,
                                                          c->flag_dev);
    if ((rc = cu_launch_check("get_rows check"))) return rc;
    CU_DISPATCH_W(table->dtype,
                  (cu_launch(c, k_get_rows<DT>, (unsigned)T, 256, 0,
                      (const char *)table->data, table->stride[0], scale,
                      (const int32_t *)ids->data, (char *)y->data, y->stride[0], H, c->flag_dev)));
    if ((rc = cu_launch_check("get_rows"))) return rc;
    int flag = 0;
    if ((rc = cu_flag_read(c, &flag))) return rc;
    return flag ? CN_EINVAL : CN_OK;
}
