/* cuda_gemv_fp4.cu - the decode GEMV of NVFP4 weights (one x row, dense or per gathered expert
 * row) as m16n8k16 tensor-core products.
 *
 * k_gemv1 decodes each nibble through a shared-memory table and multiplies in fp32, ~300
 * instructions per KiB of weights. Here a warp takes 16 weight rows; lane (g, t) (g = lane / 4,
 * t = lane % 4) works on 16 bytes (32 weights, two scale blocks) of rows g and g + 8 at chunk
 * 4 ss + t of super-step ss, so the group's 4 lanes cover 64 consecutive bytes of each row. The
 * k order inside a product is free as long as both operands follow it: mma s (0..7) of a
 * super-step pairs lane t's weights 4s..4s+3 of its chunk with x at those columns.
 *  - Weights travel by cp.async into a ring of FP4_NST stages per warp (no registers held while
 *    in flight; the first stages are queued before x is staged), the scales with them.
 *  - Each nibble is spread into an E4M3 byte (value * 2^-6, exact), two at a time converted to
 *    half2 by the hardware and multiplied by the block scale * 2^6 in fp16 (E2M1 x E4M3 has at
 *    most 6 significant bits: exact).
 *  - x is staged once per block from registers (fp4_stage) as two fp16 terms (x 2^-p = hi + lo,
 *    |x 2^-p| <= 2^14, lo the rounding of the rest; cuda_impl.h (4)), fed as B's columns: hi in
 *    the even ones, lo in the odd, so one product takes both terms (the 8 columns would
 *    otherwise repeat one x) and lanes t == 0 hold each row's two sums, added at the end, with
 *    no lane reduction; four independent chains of products; the super-steps are split over S
 *    warps, partials summed in a fixed order, S the split whose busiest warp has the fewest
 *    super-steps in the one wave of resident blocks (its slowest block ends the launch).
 *  - Before cu_pdl_enter (cuda_impl.h invariant 7) a block loads its norm weights and, dense,
 *    queues its first weight stages: both are on their way while the kernel before drains.
 * Rows, epilogues (g1_epi; fp4_write: one output per lane) and the one-wave grid are k_gemv1's.
 *
 * Both terms in one product (instead of one product per term) took slice decode from 2,161 and
 * 2,130 to 2,195 and 2,176 tok/s (alternating runs, `cairn bench --backend cuda --preset
 * nano-shape --layers 6 --weights nvfp4`).
 * Measured on the H200 against k_gemv1 (nano-shape slice, one decode token, ncu): the gated
 * out_proj 23.8 -> 14.8 us, the routed down experts 26.0 -> 21.1, the routed up experts 18.7 ->
 * 21.7, the others within 1 us; slice decode unchanged (1,766 against 1,775 tok/s). It is bound
 * by instructions per byte (F2FP and HMUL2 per weight pair), not by the memory.
 * An FP8 form (e4m3 nibbles straight into m16n8k32, x as four e4m3 terms, block scales applied
 * after each product) would take about half the instructions, but tools/fp8_mma_error.c finds it
 * within test_cuda_ops' 2e-5 only if Hopper's FP8 sums keep ~24 bits, not the reported 13; an
 * int8 form (s8 m16n8k32, exact int32 sums, x as three int8 terms) stays within 1e-6 there.
 * Never: other dtypes or shapes (cu_fp4_fits says no and k_gemv1 runs), more than one x row. */
#include <cuda_fp8.h>

#include "tensor/cuda/cuda_impl.h"

#define MM_FP4_MAXK 5120 /* staging: K (hi, lo) fp16 pairs in registers, then 20 KiB */

/* Nibbles of v (weights 8q..8q+7 of a chunk) as E4M3 bytes, value * 2^-6: lo holds weights
 * 0..3 (bytes 0 and 1: w0 w1 w2 w3), hi weights 4..7. */
__device__ __forceinline__ void fp4_spread(unsigned v, unsigned &lo, unsigned &hi) {
    const unsigned e = ((v << 2) & 0x1C1C1C1Cu) | ((v << 4) & 0x80808080u); /* low nibbles */
    const unsigned o = ((v >> 2) & 0x1C1C1C1Cu) | (v & 0x80808080u);        /* high nibbles */
    lo = __byte_perm(e, o, 0x5140);
    hi = __byte_perm(e, o, 0x7362);
}

/* Two E4M3 values (the low 16 bits) as half2, times the half2 scale. */
__device__ __forceinline__ unsigned fp4_h2(unsigned e4m3x2, unsigned scale) {
    const __half2_raw r =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(e4m3x2 & 0xffffu), __NV_E4M3);
    const __half2 h = __hmul2(*(const __half2 *)&r, *(const __half2 *)&scale);
    return *(const unsigned *)&h;
}

/* d += A B for one m16n8k16 product (fp16 in, fp32 sums). */
__device__ __forceinline__ void fp4_mma(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define FP4_NST 4                          /* super-steps in flight per warp (cp.async ring) */
#define FP4_STAGE (2 * 32 * 16 + 16 * 8)   /* a stage: 2 rows' chunks per lane, 16 rows' scales */
#define FP4_RING (8 * FP4_NST * FP4_STAGE) /* the block's rings, bytes */

__device__ __forceinline__ void fp4_cp16(void *dst, const void *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void fp4_cp4(void *dst, const void *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(bytes));
}

/* One output per lane (lanes 0..15: rows tile * 16 + lane) through the epilogue, as g1_write
 * does for one thread's rows; the whole warp calls it. */
__device__ __forceinline__ void fp4_write(const g1_epi &e, bool combine, char *__restrict__ y,
                                          int64_t ys, int r, int k, int64_t tile, int64_t n_tiles,
                                          int64_t N, int lane, float v) {
    const int64_t n = tile * 16 + lane;
    const bool mine = lane < 16 && n < N;
    if (!combine) {
        if (mine) g1_store(e, (float *)(y + (int64_t)r * ys), n, v);
        return;
    }
    if (mine) e.prt[(int64_t)r * N + n] = v;
    __threadfence(); /* the products are visible before the count says so */
    __syncwarp();
    const int t = r / k;
    int *cp = e.cnt + (int64_t)t * n_tiles + tile;
    int last = 0;
    if (lane == 0) last = atomicAdd(cp, 1) == k - 1;
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();
    if (mine) ((float *)(y + (int64_t)t * ys))[n] += g1_combined(e, t, k, N, n);
    __syncwarp();
    if (lane == 0) *cp = 0; /* every row of the token has arrived: ready for the next launch */
}

#define FP4_XP (MM_FP4_MAXK / 1024) /* staging passes: 256 threads x 4 values */

__device__ __forceinline__ float4 fp4_ld4(const float *p, bool vec) {
    return vec ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
}

/* The norm weights this thread's staging passes will multiply by (fp4_stage's i; zeros past K
 * or without a norm). They are weights, so a kernel may load them before cu_pdl_enter: they
 * arrive with its first weight chunks instead of one memory round after x. */
__device__ __forceinline__ void fp4_norm_load(const g1_epi &epi, int K, float4 (&nv)[FP4_XP]) {
    const bool vec = !((uintptr_t)epi.norm & 15u);
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * ((int)threadIdx.x + 256 * p);
        nv[p] = epi.norm && i < K ? fp4_ld4(epi.norm + i, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* Stages the x row xr (K values, K % 64 == 0) for k_gemv_fp4 straight from registers: each
 * thread holds 4 consecutive values per pass, normalised as epi says (k_gemv1's g1_stage, same
 * formulas), scaled by 2^-p so that the largest magnitude stays within 2^14, and stored as one
 * uint4 of (hi, lo) fp16 pairs at its swizzled place; chunks K / 32 .. n_pad - 1 are zeros, so
 * the last super-step needs no bounds. nv: fp4_norm_load's. Returns the row's norm scale (1 without) times 2^p, to
 * multiply each output. Every thread calls it; it ends with a __syncthreads. */
__device__ __forceinline__ float fp4_stage(const float *__restrict__ xr, int K, const g1_epi &epi,
                                           uint4 *xq, int n_pad, const float4 (&nv)[FP4_XP]) {
    __shared__ double gsq[FP4_XP * 8]; /* squares per (pass, warp): 128 values, one group's part */
    __shared__ double ssw[8];
    __shared__ float mw[8];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool vec = !(((uintptr_t)xr | (uintptr_t)epi.gate) & 15u);
    float4 v[FP4_XP];
    double ss = 0.0;
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * (tid + 256 * p);
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < K) {
            a = fp4_ld4(xr + i, vec);
            if (epi.gate) {
                const float4 z = fp4_ld4(epi.gate + i, vec);
                a.x *= z.x / (1.0f + expf(-z.x));
                a.y *= z.y / (1.0f + expf(-z.y));
                a.z *= z.z / (1.0f + expf(-z.z));
                a.w *= z.w / (1.0f + expf(-z.w));
            }
        }
        v[p] = a;
        double q = (double)a.x * a.x;
        q += (double)a.y * a.y;
        q += (double)a.z * a.z;
        q += (double)a.w * a.w;
        if (epi.gate && 4 * 256 * p < K) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
            if (lane == 0) gsq[p * 8 + warp] = q;
        } else {
            ss += q;
        }
    }
    if (epi.gate) __syncthreads();
    float m = 0.0f;
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * (tid + 256 * p);
        if (i >= K) break;
        float4 a = v[p];
        if (epi.gate) { /* the group's 128-value parts summed in a fixed order: replays are exact */
            const int u0 = (i / epi.group) * (epi.group / 128), nu = epi.group / 128;
            double sg = 0.0;
            for (int u = u0; u < u0 + nu; u++) sg += gsq[u];
            const float inv = (float)(1.0 / sqrt(sg / (double)epi.group + epi.eps));
            const float4 n = nv[p];
            a = make_float4(n.x * (a.x * inv), n.y * (a.y * inv), n.z * (a.z * inv),
                            n.w * (a.w * inv));
        } else if (epi.norm) {
            const float4 n = nv[p];
            a = make_float4(n.x * a.x, n.y * a.y, n.z * a.z, n.w * a.w);
        }
        v[p] = a;
        m = fmaxf(m, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    if (lane == 0) {
        ssw[warp] = ss;
        mw[warp] = m;
    }
    __syncthreads();
    double t = 0.0;
    m = 0.0f;
    for (int i = 0; i < 8; i++) {
        t += ssw[i];
        m = fmaxf(m, mw[i]);
    }
    int e = 0; /* x 2^-e within fp16's range */
    if (m > 16384.0f && m <= 3.0e38f) e = ilogbf(m) - 13;
    const float down = ldexpf(1.0f, -e);
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * (tid + 256 * p);
        if (i >= K) break;
        const float4 a = v[p];
        const __half2 h01 = __floats2half2_rn(a.x * down, a.y * down);
        const __half2 h23 = __floats2half2_rn(a.z * down, a.w * down);
        const __half2 l01 =
            __floats2half2_rn(a.x * down - __low2float(h01), a.y * down - __high2float(h01));
        const __half2 l23 =
            __floats2half2_rn(a.z * down - __low2float(h23), a.w * down - __high2float(h23));
        const int c = i >> 5, s = (i >> 2) & 7;
        xq[c * 8 + (s ^ (c & 7))] = make_uint4(*(const unsigned *)&h01, *(const unsigned *)&l01,
                                               *(const unsigned *)&h23, *(const unsigned *)&l23);
    }
    for (int i = (K / 32) * 8 + tid; i < n_pad * 8; i += blockDim.x) xq[i] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    const float rs = epi.norm && !epi.gate ? (float)(1.0 / sqrt(t / (double)K + epi.eps)) : 1.0f;
    return rs * ldexpf(1.0f, e);
}

__global__ void __launch_bounds__(256, 2)
    k_gemv_fp4(cu_wexp dense, const cu_wexp *__restrict__ table, int n_w,
               const char *__restrict__ ids, int64_t ids_s, int k, const char *__restrict__ x,
               int64_t xs, int x_per_token, char *__restrict__ y, int64_t ys, int K, int N, int S,
               int rows, int *flag, g1_epi epi) {
    /* [FP4_RING] the warps' rings, then [4 n_ss][8] uint4 of x's (hi, lo) pairs (fp4_stage) */
    extern __shared__ float4 g1_x[];
    __shared__ float part[8][16];
    const int tid = threadIdx.x, r = (int)blockIdx.y;
    cu_wexp w = dense;
    int64_t xrow = 0;
    float4 nv[FP4_XP];
    fp4_norm_load(epi, K, nv);
    if (table) cu_pdl_enter(); /* the ids come from the kernel before */
    if (!g1_expert(table, n_w, ids, ids_s, k, x_per_token, rows, flag, &w, &xrow)) return;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int G = 8 / S, gi = warp / S, si = warp - gi * S;
    const int n_tiles = (N + 15) / 16, nu = K / 32, n_ss = (nu + 3) / 4;
    const int gstep = (int)gridDim.x * G, first = (int)blockIdx.x * G;
    /* the warp's work, in order: per tile of the block's loop, super-steps si, si + S, ... */
    const int per = si < n_ss ? (n_ss - si + S - 1) / S : 0;
    const int n_iter = first < n_tiles ? (n_tiles - first + gstep - 1) / gstep : 0;
    char *ring = (char *)g1_x + (size_t)warp * FP4_NST * FP4_STAGE;
    /* Queues the next item's copies (chunk 4 ss + t of rows g and g + 8, 8 scale bytes of each
     * of the tile's 16 rows) into stage `slot`, zero-filled past K; always one commit group. The
     * items run through (it, q): tile first + gi + it * gstep, super-step si + q * S. */
    int it_i = 0, q_i = 0, slot_i = 0;
    auto issue = [&]() {
        const int tile = first + gi + it_i * gstep, ss = si + q_i * S;
        if (it_i < n_iter && tile < n_tiles) {
            char *st = ring + slot_i * FP4_STAGE;
            const int c = 4 * ss + t, ok = c < nu, cc = ok ? c : 0;
            const int na = min(tile * 16 + g, N - 1), nb = min(tile * 16 + g + 8, N - 1);
            fp4_cp16(st + lane * 16, w.data + (int64_t)na * w.stride + cc * 16, ok ? 16 : 0);
            fp4_cp16(st + 512 + lane * 16, w.data + (int64_t)nb * w.stride + cc * 16, ok ? 16 : 0);
            /* lane's scales: chunks c0, c0 + 1 of row rr (K % 64 == 0: nu is even, so c0 + 1 < nu
             * with c0) */
            const int rr = lane >> 1, c0 = 4 * ss + 2 * (lane & 1), ns = min(tile * 16 + rr, N - 1);
            fp4_cp4(st + 1024 + lane * 4, w.bs + (int64_t)ns * w.bs_stride + (c0 < nu ? 2 * c0 : 0),
                    c0 < nu ? 4 : 0);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        if (++q_i == per) {
            q_i = 0;
            it_i++;
        }
        slot_i = slot_i == FP4_NST - 1 ? 0 : slot_i + 1;
    };
    for (int j = 0; j < FP4_NST - 1 && per; j++) issue();
    if (!table) cu_pdl_enter(); /* dense: the weights were on their way before (invariant 7) */
    uint4 *xq = (uint4 *)((char *)g1_x + FP4_RING);
    const float post = fp4_stage((const float *)(x + xrow * xs), K, epi, xq, 4 * n_ss, nv);
    const bool combine = table && epi.ep == CN_EP_ACC;
    const unsigned s64 = 0x54005400u; /* half2 (64, 64) */
    int slot = 0;
    for (int it = 0; it < n_iter; it++) {
        const int tile = first + gi + it * gstep;
        /* four accumulators: the tensor-core products of one chain wait for each other */
        float d[4][4] = {};
        for (int q8 = 0; q8 < per; q8++) {
            issue();
            asm volatile("cp.async.wait_group %0;\n" ::"n"(FP4_NST - 1));
            __syncwarp();
            if (tile < n_tiles) {
                const char *st = ring + slot * FP4_STAGE;
                const uint4 ca = ((const uint4 *)st)[lane], cb = ((const uint4 *)(st + 512))[lane];
                const unsigned csa = *(const unsigned short *)(st + 1024 + g * 8 + 2 * t);
                const unsigned csb = *(const unsigned short *)(st + 1024 + (g + 8) * 8 + 2 * t);
                const int c = 4 * (si + q8 * S) + t; /* past K: zero weights and zero x */
                unsigned sca, scb; /* half2 (s0, s1) * 64 */
                {
                    const __half2_raw ha =
                        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)csa, __NV_E4M3);
                    const __half2_raw hb =
                        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)csb, __NV_E4M3);
                    const __half2 a2 = __hmul2(*(const __half2 *)&ha, *(const __half2 *)&s64);
                    const __half2 b2 = __hmul2(*(const __half2 *)&hb, *(const __half2 *)&s64);
                    sca = *(const unsigned *)&a2;
                    scb = *(const unsigned *)&b2;
                }
                const unsigned sa0 = __byte_perm(sca, 0, 0x1010), sa1 = __byte_perm(sca, 0, 0x3232);
                const unsigned sb0 = __byte_perm(scb, 0, 0x1010), sb1 = __byte_perm(scb, 0, 0x3232);
                const unsigned wa[4] = {ca.x, ca.y, ca.z, ca.w}, wb[4] = {cb.x, cb.y, cb.z, cb.w};
                const uint4 *xc = xq + c * 8;
                const int sw = c & 7, lo = g & 1; /* B's even columns x's hi terms, odd lo */
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    unsigned la, ha, lb, hb;
                    fp4_spread(wa[q], la, ha);
                    fp4_spread(wb[q], lb, hb);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int s = 2 * q + h;
                        const unsigned pa = h ? ha : la, pb = h ? hb : lb;
                        const unsigned ka = s < 4 ? sa0 : sa1, kb = s < 4 ? sb0 : sb1;
                        const unsigned a[4] = {fp4_h2(pa, ka), fp4_h2(pb, kb), fp4_h2(pa >> 16, ka),
                                               fp4_h2(pb >> 16, kb)};
                        const uint4 xv = xc[s ^ sw];
                        fp4_mma(d[s & 3], a, lo ? xv.y : xv.x, lo ? xv.w : xv.z);
                    }
                }
            }
            __syncwarp(); /* every lane has read the stage before it is queued again */
            slot = slot == FP4_NST - 1 ? 0 : slot + 1;
        }
        /* the four chains summed in a fixed order, each row's hi terms (column 0) then its lo
         * terms (column 1) */
        d[0][0] = ((d[0][0] + d[1][0]) + (d[2][0] + d[3][0])) +
                  ((d[0][1] + d[1][1]) + (d[2][1] + d[3][1]));
        d[0][2] = ((d[0][2] + d[1][2]) + (d[2][2] + d[3][2])) +
                  ((d[0][3] + d[1][3]) + (d[2][3] + d[3][3]));
        if (t == 0) {
            part[warp][g] = d[0][0];
            part[warp][g + 8] = d[0][2];
        }
        __syncthreads();
        if (si == 0 && tile < n_tiles) {
            float v = 0.0f;
            if (lane < 16) {
                v = part[warp][lane];
                for (int jj = 1; jj < S; jj++) v += part[warp + jj][lane];
                v = v * post * w.scale;
            }
            fp4_write(epi, combine, y, ys, r, k, tile, n_tiles, N, lane, v);
        }
        __syncthreads();
    }
    asm volatile("cp.async.wait_all;\n" ::);
}

/* See cuda_impl.h: k_gemv_fp4 launched as launch_gemv1 launches k_gemv1 (S over 16-row tiles). */
void cu_gemv_fp4(cu_ctx *c, const cu_wexp &dense, const cu_wexp *table, int n_w,
                 const cn_tensor *ids, int k, const cn_tensor *x, int x_per_token, cn_tensor *y,
                 int64_t K, int64_t N, int rows, const g1_epi &epi) {
    int &per_sm = c->fp4_blocks; /* resident blocks per SM, asked once (largest staging) */
    const int most = FP4_RING + MM_FP4_MAXK * 4;
    if (!per_sm &&
        (cudaFuncSetAttribute(k_gemv_fp4, cudaFuncAttributeMaxDynamicSharedMemorySize, most) !=
             cudaSuccess ||
         cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_gemv_fp4, 256, most) !=
             cudaSuccess))
        per_sm = 1;
    if (per_sm < 1) per_sm = 1;
    const int64_t n_tiles = (N + 15) / 16, n_ss = (K / 32 + 3) / 4;
    /* S: the split whose busiest warp has the fewest super-steps, in the one wave of resident
     * blocks (the smaller S on a tie: fewer partials to add) */
    const int64_t cap = ((int64_t)c->n_sm * per_sm + rows - 1) / rows;
    int S = 1;
    int64_t best = INT64_MAX;
    for (int s = 1; s <= 8 && (s == 1 || s <= n_ss); s *= 2) {
        const int64_t gx = (n_tiles + 8 / s - 1) / (8 / s);
        const int64_t per_wave = (gx > cap ? cap : gx) * (8 / s);
        const int64_t steps = (n_tiles + per_wave - 1) / per_wave * ((n_ss + s - 1) / s);
        if (steps < best) best = steps, S = s;
    }
    const int64_t bx = (n_tiles + 8 / S - 1) / (8 / S);
    const dim3 grid((unsigned)(bx > cap ? cap : bx), (unsigned)rows);
    cu_launch(c, k_gemv_fp4, grid, 256, (size_t)FP4_RING + (size_t)n_ss * 4 * 128,
        dense, table, n_w, ids ? (const char *)ids->data : NULL, ids ? ids->stride[0] : 0, k,
        (const char *)x->data, x->stride[0], x_per_token, (char *)y->data, y->stride[0], (int)K,
        (int)N, S, rows, c->flag_dev, epi);
}

/* See cuda_impl.h. */
bool cu_fp4_fits(const cn_tensor *const *w, int n_w, int64_t K) {
    if (K % 64 || K > MM_FP4_MAXK) return false;
    for (int e = 0; e < n_w; e++) {
        const cn_tensor *t = w[e];
        if (t->dtype != CN_NVFP4 || !t->block_scale || t->shape[0] > INT32_MAX / 16 ||
            ((uintptr_t)t->data & 15u) || t->stride[0] % 16 ||
            ((uintptr_t)t->block_scale->data & 3u) || t->block_scale->stride[0] % 4)
            return false;
    }
    return true;
}
