/* cuda_grouped_gemm.cu - prefill GEMMs on tensor cores for weights the kernel decodes itself:
 * the gathered experts of a MoE layer (all experts in one launch) and dense BF16, F8, NVFP4 and
 * MXFP8 weights at more than a few rows.
 *
 * Promises: y = x W^T with W's values exact in bf16 (BF16 as stored; F8 E4M3 values; NVFP4 e2m1 x
 * E4M3 scale and MXFP8 e4m3 x E8M0 scale, exact products of at most 8 significant bits, except
 * an MXFP8 value below bf16's smallest subnormal 2^-133, which becomes 0) and x split into
 * CU_SPLIT bf16 terms (cuda_impl.h (4)); products summed in fp32 by mma.sync (m16n8k16). The
 * per-tensor scale (F8, NVFP4 global) multiplies each output once, as on the other paths.
 * Every output row is computed from its own x row and W alone, in a fixed order over k, so a
 * row's result does not depend on which rows share its tile or how a prompt was cut into
 * chunks. A CTA decodes each weight tile into shared memory once (16 values per thread, from
 * one 8- or 16-byte load, through a 256-entry byte table) and reuses it for all rows of its tile
 * (32, 64 or 128: the mean rows per expert, or the rows of a dense product, rounded up);
 * its 16-row blocks past the tile's last row skip their MMAs. The x
 * planes, and BF16 weights as stored, go straight to shared memory (cp.async) GG_STAGES - 1
 * k-steps ahead of the tensor cores; weights that are decoded pass through registers one k-step
 * ahead (two shared buffers).
 * Never: F32 or F16 weights, K not a multiple of GG_BK, or weight rows not 16-byte aligned
 * (cu_gg_fits says so; the caller keeps its own path for those).
 * Gathered: one block sorts the rows by expert into tiles of one expert each (counting sort,
 * ids checked on the device first: a bad id writes nothing and the op returns CN_EINVAL after
 * the verdict, cuda_impl.h (1)).
 */
#include <string.h>

#include "tensor/cuda/cuda_impl.h"

#define GG_BN 128          /* weight rows (outputs) per CTA */
#define GG_BK 32           /* k per shared-memory stage */
#define GG_LDS (GG_BK + 8) /* bf16 per shared row: 80 bytes, so ldmatrix's 8 rows hit 32 banks */
#define GG_STAGES 3        /* shared stages of x (and BF16 weights) in flight: cp.async */

typedef struct gg_args {
    const __nv_bfloat16 *xs; /* CU_SPLIT planes [xrows][K] */
    int64_t plane;           /* elements per plane */
    char *y;
    int64_t ys;
    int K, N;
    int rows;              /* dense: T */
    cu_wexp dense;         /* dense weight (table == NULL) */
    const cu_wexp *table;  /* gather: experts */
    const cu_tile *tiles;  /* gather: tiles of one expert each */
    const int *n_tiles;    /* gather: how many (device) */
    const int *order;      /* gather: output rows sorted by expert */
    int k;                 /* gather: ids per token */
    int x_per_token;       /* gather: x has T rows (x row = r / k) */
} gg_args;

bool cu_gg_fits(cn_dtype dt, const cn_tensor *const *w, int n_w, int64_t K) {
    if (dt != CN_BF16 && dt != CN_F8_E4M3 && dt != CN_NVFP4 && dt != CN_MXFP8) return false;
    if (K % GG_BK || K > INT32_MAX) return false;
    for (int e = 0; e < n_w; e++) {
        if (w[e]->dtype != dt || ((uintptr_t)w[e]->data & 15u) || w[e]->stride[0] % 16) return false;
        if (w[e]->shape[0] > INT32_MAX) return false;
        if ((dt == CN_NVFP4 || dt == CN_MXFP8) && !w[e]->block_scale) return false;
    }
    return true;
}

/* The raw bytes of 16 consecutive weights of one row (and their block scale). */
template <int DT>
struct gg_raw {
    uint4 v[DT == CN_BF16 ? 2 : 1];
    unsigned s;
};

template <int DT>
__device__ __forceinline__ void gg_load_w(const cu_wexp &w, int64_t n, int k, bool ok, gg_raw<DT> &r) {
    r.s = 0;
    if (!ok) {
#pragma unroll
        for (int i = 0; i < (DT == CN_BF16 ? 2 : 1); i++) r.v[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    const char *row = w.data + n * w.stride;
    if (DT == CN_BF16) {
        r.v[0] = *(const uint4 *)(row + 2 * (int64_t)k);
        r.v[1] = *(const uint4 *)(row + 2 * (int64_t)k + 16);
    } else if (DT == CN_NVFP4) {
        const uint2 p = *(const uint2 *)(row + (k >> 1));
        r.v[0] = make_uint4(p.x, p.y, 0, 0);
        r.s = w.bs[n * w.bs_stride + (k >> 4)];
    } else {
        r.v[0] = *(const uint4 *)(row + k);
        if (DT == CN_MXFP8) r.s = w.bs[n * w.bs_stride + (k >> 5)];
    }
}

/* The shared decode table of a CTA: NVFP4, byte -> its two e2m1 values as bf16x2 (low nibble
 * first); F8 and MXFP8, byte -> the e4m3 value as a float. One load per byte instead of the
 * selects of cu_e2m1 / cu_e4m3 per value. */
template <int DT>
__device__ __forceinline__ void gg_lut_fill(unsigned *lut, int tid, int threads) {
    for (int b = tid; b < 256; b += threads) {
        if (DT == CN_NVFP4) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(cu_e2m1(b & 15u), cu_e2m1((unsigned)b >> 4));
            lut[b] = *(const unsigned *)&v;
        } else {
            lut[b] = __float_as_uint(cu_e4m3((unsigned)b));
        }
    }
}

/* Decodes 16 weights to bf16 (block scale applied; exact, see the header) into shared memory. */
template <int DT>
__device__ __forceinline__ void gg_store_w(__nv_bfloat16 *dst, const gg_raw<DT> &r, const unsigned *lut) {
    if (DT == CN_BF16) {
        ((uint4 *)dst)[0] = r.v[0];
        ((uint4 *)dst)[1] = r.v[1];
        return;
    }
    const unsigned char *b = (const unsigned char *)r.v;
    __align__(16) unsigned o[8];
    if (DT == CN_NVFP4) { /* e2m1 x E4M3: at most 6 significant bits, so the bf16 product is exact */
        const __nv_bfloat16 sb = __float2bfloat16_rn(cu_e4m3(r.s));
        const __nv_bfloat162 s2 = __halves2bfloat162(sb, sb);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned u = lut[b[i]];
            const __nv_bfloat162 p = __hmul2(*(const __nv_bfloat162 *)&u, s2);
            o[i] = *(const unsigned *)&p;
        }
    } else {
        const float s = DT == CN_MXFP8 ? cu_e8m0(r.s) : 1.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __nv_bfloat162 p = __floats2bfloat162_rn(__uint_as_float(lut[b[2 * i]]) * s,
                                                           __uint_as_float(lut[b[2 * i + 1]]) * s);
            o[i] = *(const unsigned *)&p;
        }
    }
    ((uint4 *)dst)[0] = ((const uint4 *)o)[0];
    ((uint4 *)dst)[1] = ((const uint4 *)o)[1];
}

__device__ __forceinline__ void gg_ldsm4(unsigned r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16 bytes global -> shared without registers (both 16-byte aligned). */
__device__ __forceinline__ void gg_cp16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void gg_mma(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A BM x GG_BN tile of y on WM x WN warps, each (BM / WM) rows x (GG_BN / WN) outputs. Shared
 * memory (dynamic): two stages of the x planes [CU_SPLIT][BM][GG_LDS] and of the decoded weights
 * [GG_BN][GG_LDS]. Two CTAs an SM (at most 128 registers a thread, and gg_run's carveout): at
 * one (130 registers), ncu read 12.5% occupancy and 37% of the SMs' throughput; two took slice
 * prefill from 113.1 to 121.0 thousand tok/s on the H200 (NVFP4, 2048-token prompts). */
template <int DT, int BM, int WM, int WN>
__global__ void __launch_bounds__(WM * WN * 32, 2) k_gg(gg_args a) {
    cu_pdl_enter();
    constexpr int THREADS = WM * WN * 32;
    constexpr int TM = BM / WM, TN = GG_BN / WN; /* a warp's tile */
    constexpr int MI = TM / 16, NI = TN / 8;     /* its mma blocks */
    constexpr int AU = BM * (GG_BK / 8) / THREADS; /* 8-value x chunks per thread and plane */
    constexpr int WU = 2 * GG_BN / THREADS;        /* weight half-rows (16 values) per thread */
    static_assert(TM % 16 == 0 && TN % 16 == 0 && AU >= 1 && WU >= 1, "tile shape");
    constexpr bool WASYNC = DT == CN_BF16; /* weights copied as stored: cp.async like x */
    extern __shared__ __align__(16) unsigned char gg_smem[];
    typedef __nv_bfloat16 arow[GG_LDS];
    arow *sa_ = (arow *)gg_smem;                /* [GG_STAGES][CU_SPLIT][BM] rows */
    arow *sb_ = sa_ + GG_STAGES * CU_SPLIT * BM; /* [GG_STAGES or 2][GG_BN] rows */
#define GG_SA(buf, j, r) sa_[((buf) * CU_SPLIT + (j)) * BM + (r)]
#define GG_SB(buf, n) sb_[(buf) * GG_BN + (n)]
    __shared__ int64_t yrow_[BM];
    __shared__ int xrow_[BM];
    __shared__ unsigned lut_[DT == CN_BF16 ? 1 : 256];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / WN, wn = warp % WN;
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
        begin = (int)blockIdx.y * BM;
        end = begin + BM < a.rows ? begin + BM : a.rows;
    }
    if (DT != CN_BF16) gg_lut_fill<DT>(lut_, tid, THREADS);
    for (int i = tid; i < BM; i += THREADS) {
        int64_t xr = -1, yr = -1;
        if (i < end - begin) {
            if (a.order) {
                const int r = a.order[begin + i];
                yr = r;
                xr = a.x_per_token ? r / a.k : r;
            } else {
                xr = yr = begin + i;
            }
        }
        xrow_[i] = (int)xr;
        yrow_[i] = yr;
    }
    __syncthreads();
    const int64_t n0 = (int64_t)blockIdx.x * GG_BN;
    /* loaders: x rows 8 bf16 at a time per plane (chunk u: row u / 4, column (u % 4) * 8);
     * weights 16 values per half-row */
    const __nv_bfloat16 *ap[AU];
    bool aok[AU];
#pragma unroll
    for (int i = 0; i < AU; i++) {
        const int u = tid + i * THREADS, xr = xrow_[u >> 2];
        aok[i] = xr >= 0;
        ap[i] = a.xs + (int64_t)(xr < 0 ? 0 : xr) * a.K + (u & 3) * 8;
    }
    /* x planes: straight into shared memory (cp.async), GG_STAGES - 1 stages ahead */
    auto issue_a = [&](int k0, int st) {
#pragma unroll
        for (int i = 0; i < AU; i++) {
            const int u = tid + i * THREADS;
#pragma unroll
            for (int j = 0; j < CU_SPLIT; j++) {
                __nv_bfloat16 *dst = &GG_SA(st, j, u >> 2)[(u & 3) * 8];
                if (aok[i]) gg_cp16(dst, ap[i] + j * a.plane + k0);
                else *(uint4 *)dst = make_uint4(0, 0, 0, 0);
            }
        }
        if (WASYNC) { /* BF16 weights likewise: 16 values per half-row */
#pragma unroll
            for (int i = 0; i < WU; i++) {
                const int u = tid + i * THREADS, n = u >> 1;
                __nv_bfloat16 *dst = &GG_SB(st, n)[(u & 1) * 16];
                if (n0 + n < a.N) {
                    const char *src = w.data + (n0 + n) * w.stride + 2 * (int64_t)(k0 + (u & 1) * 16);
                    gg_cp16(dst, src);
                    gg_cp16(dst + 8, src + 16);
                } else {
                    ((uint4 *)dst)[0] = make_uint4(0, 0, 0, 0);
                    ((uint4 *)dst)[1] = make_uint4(0, 0, 0, 0);
                }
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    /* decoded weights (F8, NVFP4, MXFP8): through registers, one stage ahead */
    gg_raw<DT> rw[WASYNC ? 1 : WU];
    auto load_w = [&](int k0) {
#pragma unroll
        for (int i = 0; i < (WASYNC ? 0 : WU); i++) {
            const int u = tid + i * THREADS, n = u >> 1;
            gg_load_w<DT>(w, n0 + n, k0 + (u & 1) * 16, n0 + n < a.N, rw[i]);
        }
    };
    auto store_w = [&](int buf) {
#pragma unroll
        for (int i = 0; i < (WASYNC ? 0 : WU); i++) {
            const int u = tid + i * THREADS;
            gg_store_w<DT>(&GG_SB(buf, u >> 1)[(u & 1) * 16], rw[i], lut_);
        }
    };
    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[mi][ni][q] = 0.0f;
    /* a warp's 16-row blocks are mi * WM + wm (interleaved), so that a part-filled tile (an
     * expert's ~96 rows in 128) leaves each tensor-core pipe a like share of the blocks it skips */
    bool act[MI];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) act[mi] = (mi * WM + wm) * 16 < end - begin;
    const int nk = a.K / GG_BK;
#pragma unroll
    for (int st = 0; st < GG_STAGES - 1; st++) { /* empty groups past the end keep the count */
        if (st < nk) issue_a(st * GG_BK, st);
        else asm volatile("cp.async.commit_group;\n" ::);
    }
    load_w(0);
    store_w(0);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(GG_STAGES - 2));
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        const int sta = kt % GG_STAGES, bw = WASYNC ? sta : kt & 1;
        /* the stage the previous iteration read (all done with it: its closing barrier) */
        if (kt + GG_STAGES - 1 < nk) issue_a((kt + GG_STAGES - 1) * GG_BK, (kt + GG_STAGES - 1) % GG_STAGES);
        else asm volatile("cp.async.commit_group;\n" ::);
        if (kt + 1 < nk) load_w((kt + 1) * GG_BK); /* in flight during the MMAs below */
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            unsigned bf[NI][2];
#pragma unroll
            for (int nb = 0; nb < NI / 2; nb++) {
                unsigned r[4];
                gg_ldsm4(r, &GG_SB(bw, wn * TN + nb * 16 + (lane & 7) + ((lane >> 4) << 3))
                                [kk + ((lane >> 3) & 1) * 8]);
                bf[2 * nb][0] = r[0];
                bf[2 * nb][1] = r[1];
                bf[2 * nb + 1][0] = r[2];
                bf[2 * nb + 1][1] = r[3];
            }
#pragma unroll
            for (int j = CU_SPLIT - 1; j >= 0; j--) { /* the small term first */
                unsigned af[MI][4];
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
                    if (act[mi])
                        gg_ldsm4(af[mi], &GG_SA(sta, j, (mi * WM + wm) * 16 + (lane & 15))[kk + (lane >> 4) * 8]);
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
                    if (act[mi])
#pragma unroll
                        for (int ni = 0; ni < NI; ni++) gg_mma(acc[mi][ni], af[mi], bf[ni]);
            }
        }
        if (kt + 1 < nk) store_w(bw ^ 1);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(GG_STAGES - 2)); /* stage kt + 1 landed */
        __syncthreads();
    }
#undef GG_SA
#undef GG_SB
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t yr = yrow_[(mi * WM + wm) * 16 + g + 8 * h];
            if (yr < 0) continue;
            float *yp = (float *)(a.y + yr * a.ys);
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                const int64_t col = n0 + wn * TN + ni * 8 + 2 * t4;
                if (col < a.N) yp[col] = acc[mi][ni][2 * h] * w.scale;
                if (col + 1 < a.N) yp[col + 1] = acc[mi][ni][2 * h + 1] * w.scale;
            }
        }
}

/* Dynamic shared memory of one k_gg CTA: GG_STAGES stages of x planes, and of weights (BF16)
 * or two of decoded weights (the other formats). */
static constexpr size_t gg_smem_bytes(int dt, int bm) {
    return (size_t)(GG_STAGES * CU_SPLIT * bm + (dt == CN_BF16 ? GG_STAGES : 2) * GG_BN) * GG_LDS *
           sizeof(__nv_bfloat16);
}

template <int DT, int BM, int WM, int WN>
static int gg_run(cu_ctx *c, const gg_args &a, dim3 grid) {
    constexpr size_t smem = gg_smem_bytes(DT, BM);
    if (smem > 48 * 1024) { /* above the default: opted in per kernel (cheap, no sync), with
                             * the largest carveout so that two CTAs share an SM */
        int rc = cu_check(cudaFuncSetAttribute(k_gg<DT, BM, WM, WN>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                          "matmul (tensor cores) shared memory");
        if (!rc)
            rc = cu_check(cudaFuncSetAttribute(k_gg<DT, BM, WM, WN>,
                                               cudaFuncAttributePreferredSharedMemoryCarveout,
                                               (int)cudaSharedmemCarveoutMaxShared),
                          "matmul (tensor cores) carveout");
        if (rc) return rc;
    }
    cu_launch(c, k_gg<DT, BM, WM, WN>, grid, WM * WN * 32, smem, a);
    return cu_launch_check("matmul (tensor cores)");
}

/* Row tiles of 32 (4 warps of 32 x 32), 64 (8 warps of 32 x 32) or 128 rows (8 warps of 32 x 64:
 * each weight tile decoded once for more rows, fewer shared-memory reads per mma). */
template <int DT>
static int gg_launch(cu_ctx *c, const gg_args &a, int bm, unsigned row_tiles) {
    const dim3 grid((unsigned)((a.N + GG_BN - 1) / GG_BN), row_tiles);
    if (bm == 32) return gg_run<DT, 32, 1, 4>(c, a, grid);
    if (bm == 64) return gg_run<DT, 64, 2, 4>(c, a, grid);
    return gg_run<DT, 128, 4, 2>(c, a, grid);
}

static int gg_dispatch(cu_ctx *c, cn_dtype dt, const gg_args &a, int bm, unsigned row_tiles) {
    switch (dt) {
    case CN_BF16: return gg_launch<CN_BF16>(c, a, bm, row_tiles);
    case CN_F8_E4M3: return gg_launch<CN_F8_E4M3>(c, a, bm, row_tiles);
    case CN_NVFP4: return gg_launch<CN_NVFP4>(c, a, bm, row_tiles);
    case CN_MXFP8: return gg_launch<CN_MXFP8>(c, a, bm, row_tiles);
    default: return CN_EUNSUPPORTED;
    }
}

static cu_wexp gg_wexp(const cn_tensor *w) {
    cu_wexp e;
    e.data = (const char *)w->data;
    e.stride = w->stride[0];
    e.scale = cu_wscale(w);
    e.bs = w->block_scale ? (const unsigned char *)w->block_scale->data : NULL;
    e.bs_stride = w->block_scale ? w->block_scale->stride[0] : 0;
    return e;
}

/* The arguments every tensor-core GEMM takes: the split planes of x, y and the shape. */
static gg_args gg_io(const __nv_bfloat16 *planes, size_t plane, cn_tensor *y, int64_t K, int64_t N) {
    gg_args a;
    memset(&a, 0, sizeof a);
    a.xs = planes;
    a.plane = (int64_t)plane;
    a.y = (char *)y->data;
    a.ys = y->stride[0];
    a.K = (int)K;
    a.N = (int)N;
    return a;
}

int cu_gg_dense(cu_ctx *c, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    const int64_t T = x->shape[0], K = x->shape[1], N = w->shape[0];
    if (T > INT32_MAX / 2 || N > INT32_MAX) return CN_EUNSUPPORTED;
    const size_t plane = (size_t)(T * K);
    __nv_bfloat16 *planes = (__nv_bfloat16 *)cu_scratch(c, CU_SPLIT * plane * sizeof(__nv_bfloat16));
    if (!planes) return CN_ENOMEM;
    int rc = cu_split_bf16(c, x, planes);
    if (rc) return rc;
    gg_args a = gg_io(planes, plane, y, K, N);
    a.rows = (int)T;
    a.dense = gg_wexp(w);
    const int bm = T <= 32 ? 32 : T <= 128 ? 64 : 128;
    const int64_t tiles = (T + bm - 1) / bm;
    if (tiles > 65535) return CN_EUNSUPPORTED;
    return gg_dispatch(c, w->dtype, a, bm, (unsigned)tiles);
}

int cu_gg_gather(cu_ctx *c, cn_tensor *y, const cu_wexp *table, int n_w, cn_dtype dt,
                 const cn_tensor *x, const cn_tensor *ids) {
    const int64_t T = ids->shape[0], k = ids->shape[1], rows = T * k;
    const int64_t K = x->shape[1], N = y->shape[1], xrows = x->shape[0];
    if (N > INT32_MAX || xrows > INT32_MAX / 2) return CN_EUNSUPPORTED;
    /* rows per tile: the mean rows per expert rounded up to 32, 64 or 128 */
    const int bm = rows <= 32 * (int64_t)n_w ? 32 : rows <= 64 * (int64_t)n_w ? 64 : 128;
    const int64_t max_tiles = (rows + bm - 1) / bm + n_w;
    if (max_tiles > 65535) return CN_EUNSUPPORTED;
    /* scratch: planes [CU_SPLIT][xrows][K] bf16, then cnt [2 n_w], n_tiles, order [rows], tiles */
    const size_t plane = (size_t)(xrows * K);
    const size_t pbytes = (CU_SPLIT * plane * sizeof(__nv_bfloat16) + 255) & ~(size_t)255;
    const size_t n_int = ((size_t)(2 * n_w + 1) + (size_t)rows + 3) & ~(size_t)3;
    char *mem = (char *)cu_scratch(c, pbytes + n_int * sizeof(int) + (size_t)max_tiles * sizeof(cu_tile));
    if (!mem) return CN_ENOMEM;
    __nv_bfloat16 *planes = (__nv_bfloat16 *)mem;
    int *cnt = (int *)(mem + pbytes), *n_tiles = cnt + 2 * n_w, *order = n_tiles + 1;
    cu_tile *tiles = (cu_tile *)(mem + pbytes + n_int * sizeof(int));
    int rc = cu_flag_reset(c);
    if (rc) return rc;
    cu_launch(c, k_gather_prep, 1, 1024, 0, (const char *)ids->data, ids->stride[0], (int)T, (int)k,
                                         n_w, bm, c->flag_dev, cnt, order, tiles, n_tiles);
    if ((rc = cu_launch_check("gather prep (tensor cores)"))) return rc;
    if ((rc = cu_split_bf16(c, x, planes))) return rc;
    gg_args a = gg_io(planes, plane, y, K, N);
    a.table = table;
    a.tiles = tiles;
    a.n_tiles = n_tiles;
    a.order = order;
    a.k = (int)k;
    a.x_per_token = xrows == T;
    if ((rc = gg_dispatch(c, dt, a, bm, (unsigned)max_tiles))) return rc;
    int flag = 0;
    if ((rc = cu_flag_read(c, &flag))) return rc;
    return flag ? CN_EINVAL : CN_OK;
}
