/* cuda_gemv_fp4.cu - the decode GEMV of NVFP4 weights (one x row, dense or per gathered expert
 * row) as integer dot products.
 *
 * A warp takes 16 weight rows; lane (g, t) (g = lane / 4, t = lane % 4) works on 16 bytes (32
 * weights, two scale blocks) of rows g and g + 8 at chunk 4 ss + t of super-step ss, so the
 * group's 4 lanes cover 64 consecutive bytes of each row.
 *  - Weights travel by cp.async into a ring of FP4_NST stages per warp (no registers held while
 *    in flight; the first stages are queued before x is staged), the scales with them.
 *  - Nibbles become bytes 128 + twice their E2M1 value (exact) by two sign-filled permutes of a
 *    table of the 8 magnitudes and one add (fp4_u8: 9 instructions for 8 weights, no conversion
 *    and no multiply per weight); x's block correction takes the 128s out of each block's sum.
 *  - x is staged once per block as two int8 terms per value with a scale per block of 16
 *    (fp4_stage: each value within 2^-16 of the block's largest magnitude), so each block's dot
 *    product is two chains of 4 dp4a, combined exactly in one int32; the block scale (E4M3
 *    weight scale times x's block scale) then multiplies it once in fp32. The result is the
 *    product with the dequantized weights to about 2e-5 of its largest output (test_cuda_ops:
 *    6e-5 against a double reference), x's rounding far below the BF16 activations of the
 *    reference implementation; the CPU backend rounds x to one int8 term. Two terms, not three
 *    (2^-24, within 2e-5 like the fp32 products): the third cost 2.5% of whole-model decode.
 *  - The super-steps are split over S warps, partials summed in a fixed order, S the split
 *    whose busiest warp costs least in the one wave of resident blocks (its slowest block ends
 *    the launch), a tile's end counted as part of a super-step (FP4_END); a row's 4 lanes are
 *    summed by two shuffles in a fixed order.
 *  - Before cu_pdl_enter (cuda_impl.h invariant 7) a block loads its norm weights and, dense or
 *    with settled ids (outside what the kernel just before declared it writes: a MoE's down
 *    product after its up product), queues its first weight stages: both are on their way while
 *    the kernel before drains. Gathered rows whose ids may still be written queue x's loads
 *    first, the weights' behind them.
 * Rows, epilogues (g1_epi; fp4_write: one output per lane) and the one-wave grid are k_gemv1's.
 *
 * Why integers: a tensor-core form (nibbles spread to E4M3 bytes, converted to half2 by the
 * hardware, times the block scale in fp16, x as two fp16 terms into m16n8k16 products) is bound
 * by instruction issue, not by the memory (ncu: DRAM 7-19% of peak); this one issues about as
 * many instructions but stalls less (whole-model decode on the H200: 4% faster).
 * An FP8 form (tools/fp8_mma_error.c) misses 2e-5 with Hopper's truncated FP8 sums; tensor-core
 * int8 products would need an fp32 epilogue per (row, block, term) and gain nothing over dp4a.
 * Why this loop and not another: the kernel is bound by each warp's issue rate (a super-step's
 * ~110 integer-pipe instructions would allow about 4.9 TB/s on the H200, but each scheduler
 * issues every 2.2 cycles, so a launch moves about 1 TB/s), not by memory in flight. So the
 * variants that change what is in flight ran no faster or slower: loads straight into
 * registers instead of the ring, rings 6 or 8 deep instead of FP4_NST, 16-warp blocks at 64
 * registers, one or three blocks an SM, BF16 weights on this ring (docs/performance.md).
 * Never: other dtypes or shapes (cu_fp4_fits says no and k_gemv1 runs), more than one x row.
 */
#include <cuda_fp8.h>

#include "tensor/cuda/cuda_impl.h"

#define MM_FP4_MAXK 5120 /* staging: K values in registers, then 17.5 KiB of terms and scales */

/* Twice the E2M1 values of magnitude codes 0..7 as bytes (0..3 in P0, 4..7 in P1), each below
 * 128 so that a sign-filled lookup gives 0. */
#define FP4_P0 0x03020100u
#define FP4_P1 0x0C080604u

/* prmt.b32 in its default mode: byte i of the result is byte (s >> 4i) & 7 of (b:a), sign-filled
 * when bit 3 of that nibble is set. */
__device__ __forceinline__ unsigned fp4_prmt(unsigned a, unsigned b, unsigned s) {
    unsigned d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
}

/* The 8 nibbles of v (weights 0..7, low nibble first) as bytes 128 + 2 * e2m1: lo holds weights
 * 0..3, hi 4..7. The table is looked up twice, once with the nibbles as they are (a set sign bit
 * sign-fills the byte: negative weights give 0) and once with the sign bits flipped (positive
 * weights give 0), and p + 0x80808080 - n is one three-input add that no byte carries out of
 * (each lands in [116, 140]): 9 instructions for 8 weights, 4 of them byte permutes, where a
 * select between a positive and a negated table took 11, 6 of them permutes. The 128 per weight
 * is taken out of each block's sum by x's block correction (fp4_stage). */
__device__ __forceinline__ void fp4_u8(unsigned v, unsigned &lo, unsigned &hi) {
    const unsigned n = v ^ 0x88888888u, vh = v >> 16, nh = n >> 16;
    lo = fp4_prmt(FP4_P0, FP4_P1, v) + 0x80808080u - fp4_prmt(FP4_P0, FP4_P1, n);
    hi = fp4_prmt(FP4_P0, FP4_P1, vh) + 0x80808080u - fp4_prmt(FP4_P0, FP4_P1, nh);
}

/* dp4a of unsigned bytes a with signed bytes b, plus c, in wrapping 32-bit arithmetic. */
__device__ __forceinline__ unsigned fp4_dp4a(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
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

/* The norm weights this thread's staging passes will multiply by (fp4_stage's i; zeros past K
 * or without a norm). They are weights, so a kernel may load them before cu_pdl_enter: they
 * arrive with its first weight chunks instead of one memory round after x. */
__device__ __forceinline__ void fp4_norm_load(const g1_epi &epi, int K, float4 (&nv)[FP4_XP]) {
    const bool vec = !((uintptr_t)epi.norm & 15u);
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * ((int)threadIdx.x + 256 * p);
        nv[p] = epi.norm && i < K ? cu_ld4(epi.norm + i, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* x as k_gemv_fp4 reads it: per 32-value chunk c, FP4_XT int8 terms of 32 bytes each (xq + c *
 * FP4_XCH), and per chunk one float4 at xd + 4c: its two blocks' scales, then as bits their
 * corrections, -128 X for the block's X = sum of q0 254 + q1 (the weights come as 128 + w:
 * fp4_u8), in wrapping 32-bit arithmetic. With d = amax / 127 for the block, x = d (q0 + q1 /
 * 254) to within d / 2 / 254 (2^-16 of the block's largest magnitude): q0 = rint(x / d), q1 the
 * rounding of 254 times the rest, both in [-127, 127]. A block's two integer dot products then
 * combine exactly in one int32 (at most 16 * 12 * 127 * 255 < 2^31, so the wrapped sum with the
 * 128s and the correction is that int32 exactly), and the scale is d / 254 / 2 (the weights are
 * twice their E2M1 values). */
#define FP4_XT 2
#define FP4_XCH (FP4_XT * 32)
#define FP4_XD 16 /* bytes of scales and corrections per chunk */
#define FP4_R 254

/* max(a, b), NaN when either is (fmaxf would drop a NaN value from its block's scale). */
__device__ __forceinline__ float fp4_max(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

/* The loads of fp4_stage: this thread's 4 values a pass of the x row xr and, gated, of the gate
 * (zeros past K), issued right after the enter, so that a launch whose weights wait for the enter
 * does not queue x's requests behind its first weight stages. */
__device__ __forceinline__ void fp4_x_load(const float *__restrict__ xr, int K, const g1_epi &epi,
                                           float4 (&v)[FP4_XP], float4 (&z)[FP4_XP]) {
    const int tid = threadIdx.x;
    const bool vec = !(((uintptr_t)xr | (uintptr_t)epi.gate) & 15u);
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * (tid + 256 * p);
        v[p] = z[p] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < K) {
            v[p] = cu_ld4(xr + i, vec);
            if (epi.gate) z[p] = cu_ld4(epi.gate + i, vec);
        }
    }
}

/* Stages the x row (fp4_x_load's v and z: K values, K % 64 == 0) for k_gemv_fp4 from registers:
 * each thread holds 4 consecutive values per pass (a quarter of a block), normalised as epi says
 * (k_gemv1's g1_stage, same formulas), and stores their two int8 terms; its block's 4 threads
 * agree on the scale by two shuffles. Chunks K / 32 .. n_pad - 1 are zeros, so the last
 * super-step needs no bounds. nv: fp4_norm_load's. Returns the row's norm scale (1 without), to
 * multiply each output. Every thread calls it; it ends with a __syncthreads. */
__device__ __forceinline__ float fp4_stage(float4 (&v)[FP4_XP], const float4 (&z)[FP4_XP], int K,
                                           const g1_epi &epi, char *xq, float *xd, int n_pad,
                                           const float4 (&nv)[FP4_XP]) {
    __shared__ double gsq[FP4_XP * 8]; /* squares per (pass, warp): 128 values, one group's part */
    __shared__ double ssw[8];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    double ss = 0.0;
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * (tid + 256 * p);
        float4 a = v[p];
        if (i < K && epi.gate) {
            a.x *= cu_silu_f(z[p].x);
            a.y *= cu_silu_f(z[p].y);
            a.z *= cu_silu_f(z[p].z);
            a.w *= cu_silu_f(z[p].w);
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) ssw[warp] = ss;
#pragma unroll
    for (int p = 0; p < FP4_XP; p++) {
        const int i = 4 * (tid + 256 * p);
        if (4 * 256 * p >= K) break; /* the same for the whole block */
        float4 a = v[p];
        if (i < K && epi.gate) { /* the group's 128-value parts summed in a fixed order */
            const int u0 = (i / epi.group) * (epi.group / 128), nu = epi.group / 128;
            double sg = 0.0;
            for (int u = u0; u < u0 + nu; u++) sg += gsq[u];
            const float inv = (float)(1.0 / sqrt(sg / (double)epi.group + epi.eps));
            const float4 n = nv[p];
            a = make_float4(n.x * (a.x * inv), n.y * (a.y * inv), n.z * (a.z * inv),
                            n.w * (a.w * inv));
        } else if (i < K && epi.norm) {
            const float4 n = nv[p];
            a = make_float4(n.x * a.x, n.y * a.y, n.z * a.z, n.w * a.w);
        }
        /* the block's largest magnitude: its 4 threads are lanes 4j..4j+3 (K % 16 == 0: all in
         * or all out) */
        float m = fp4_max(fp4_max(fabsf(a.x), fabsf(a.y)), fp4_max(fabsf(a.z), fabsf(a.w)));
        m = fp4_max(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fp4_max(m, __shfl_xor_sync(0xffffffffu, m, 2));
        /* a non-finite block (NaN included: fp4_max keeps it) keeps q = 0 and carries the
         * non-finite scale into the result; past K, a = 0 and q = 0 */
        const float id = m > 0.0f && m <= 3.4028235e38f ? 127.0f / m : 0.0f;
        const float f[4] = {a.x * id, a.y * id, a.z * id, a.w * id};
        unsigned wq[FP4_XT] = {};
        int X = 0; /* at most 16 * 127 * 255 in magnitude */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float r = f[j];
            int xj = 0; /* q0 254 + q1 */
#pragma unroll
            for (int u = 0; u < FP4_XT; u++) {
                const int q = __float2int_rn(r);
                wq[u] |= (unsigned)(q & 0xff) << (8 * j);
                xj = xj * FP4_R + q;
                r = (r - (float)q) * (float)FP4_R; /* r - q: exact */
            }
            X += xj;
        }
        X += __shfl_xor_sync(0xffffffffu, X, 1);
        X += __shfl_xor_sync(0xffffffffu, X, 2);
        if (i >= K) continue;
        char *cq = xq + (i >> 5) * FP4_XCH + (i & 31);
#pragma unroll
        for (int u = 0; u < FP4_XT; u++) *(unsigned *)(cq + 32 * u) = wq[u];
        if ((i & 15) == 0) {
            float *dc = xd + 4 * (i >> 5) + ((i >> 4) & 1);
            dc[0] = m / 127.0f / (float)(2 * FP4_R);
            dc[2] = __uint_as_float(0u - 128u * (unsigned)X);
        }
    }
    for (int i = (K / 32) * (FP4_XCH / 4) + tid; i < n_pad * (FP4_XCH / 4); i += blockDim.x)
        ((unsigned *)xq)[i] = 0;
    for (int i = 4 * (K / 32) + tid; i < 4 * n_pad; i += blockDim.x) xd[i] = 0.0f;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < 8; i++) t += ssw[i];
    return epi.norm && !epi.gate ? (float)(1.0 / sqrt(t / (double)K + epi.eps)) : 1.0f;
}

__global__ void __launch_bounds__(256, 2)
    k_gemv_fp4(cu_wexp dense, const cu_wexp *__restrict__ table, int n_w,
               const char *__restrict__ ids, int64_t ids_s, int k, const char *__restrict__ x,
               int64_t xs, int x_per_token, char *__restrict__ y, int64_t ys, int K, int N, int S,
               int rows, int *flag, int settled, g1_epi epi) {
    /* [FP4_RING] the warps' rings, then x's int8 terms (4 n_ss chunks of FP4_XCH bytes) and its
     * block scales and corrections (FP4_XD bytes a chunk): fp4_stage */
    extern __shared__ float4 g1_x[];
    __shared__ float part[2][8][16]; /* by tile parity: no barrier before a part is reused */
    const int tid = threadIdx.x, r = (int)blockIdx.y;
    cu_wexp w = dense;
    int64_t xrow = 0;
    float4 nv[FP4_XP];
    fp4_norm_load(epi, K, nv);
    /* weights may be asked for before the enter (invariant 7): dense ones always, an expert's
     * once its id is read, which is before the enter only when the ids are settled (no kernel
     * that may still run writes them: cu_gemv_fp4) */
    const bool early = !table || settled;
    if (!early) cu_pdl_enter(); /* the ids may come from the kernel before */
    if (!g1_expert(table, n_w, ids, ids_s, k, x_per_token, rows, flag, &w, &xrow, early)) return;
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
     * items run through (it, q): tile first + gi + it * gstep, super-step si + q * S. The source
     * pointers are set once per tile and step on by S super-steps (64-bit row offsets per item
     * were a sixth of the loop's instructions). */
    int it_i = 0, q_i = 0, slot_i = 0;
    bool tile_ok = false;
    const char *pa = NULL, *pb = NULL;
    const unsigned char *ps = NULL;
    auto set_tile = [&]() {
        const int tile = first + gi + it_i * gstep;
        tile_ok = it_i < n_iter && tile < n_tiles;
        if (!tile_ok) return;
        const int na = min(tile * 16 + g, N - 1), nb = min(tile * 16 + g + 8, N - 1);
        const int ns = min(tile * 16 + (lane >> 1), N - 1); /* lane's scales: row lane / 2 */
        pa = w.data + (int64_t)na * w.stride + (4 * si + t) * 16;
        pb = w.data + (int64_t)nb * w.stride + (4 * si + t) * 16;
        ps = w.bs + (int64_t)ns * w.bs_stride + 8 * si + 4 * (lane & 1);
    };
    set_tile();
    auto issue = [&]() {
        if (tile_ok) {
            char *st = ring + slot_i * FP4_STAGE;
            const int ss = si + q_i * S, ok = 4 * ss + t < nu;
            fp4_cp16(st + lane * 16, ok ? pa : w.data, ok ? 16 : 0);
            fp4_cp16(st + 512 + lane * 16, ok ? pb : w.data, ok ? 16 : 0);
            /* chunks c0, c0 + 1 (K % 64 == 0: nu is even, so c0 + 1 < nu with c0) */
            const int sok = 4 * ss + 2 * (lane & 1) < nu;
            fp4_cp4(st + 1024 + lane * 4, sok ? ps : w.bs, sok ? 4 : 0);
            pa += 64 * S;
            pb += 64 * S;
            ps += 8 * S;
        }
        asm volatile("cp.async.commit_group;\n" ::);
        if (++q_i == per) {
            q_i = 0;
            it_i++;
            set_tile();
        }
        slot_i = slot_i == FP4_NST - 1 ? 0 : slot_i + 1;
    };
    /* Early, the first stages are queued before the enter, so they arrive while the kernel
     * before drains, and x's loads follow the enter. Otherwise x's loads go first: behind a
     * block's first three stages (a gathered launch asks 7.3 MB at once) they waited, and
     * issued first they took the MoE's products from 470.7 / 472.0 to 482.2 / 488.5 tok/s
     * (whole-model decode on the H200, two rounds in one run). */
    int j = 0;
    for (; early && j < FP4_NST - 1 && per; j++) issue();
    if (early) cu_pdl_enter();
    float4 xv0[FP4_XP], zv0[FP4_XP];
    fp4_x_load((const float *)(x + xrow * xs), K, epi, xv0, zv0);
    asm volatile("" ::: "memory"); /* x's loads are issued before the stages below */
    for (; j < FP4_NST - 1 && per; j++) issue();
    char *xq = (char *)g1_x + FP4_RING;
    float *xd = (float *)(xq + (size_t)4 * n_ss * FP4_XCH);
    const float post = fp4_stage(xv0, zv0, K, epi, xq, xd, 4 * n_ss, nv);
    const bool combine = g1_combines(table, epi);
    int slot = 0;
    for (int it = 0; it < n_iter; it++) {
        const int tile = first + gi + it * gstep;
        float acc[2] = {0.0f, 0.0f}; /* rows g and g + 8, over this lane's chunks */
        for (int q8 = 0; q8 < per; q8++) {
            issue();
            asm volatile("cp.async.wait_group %0;\n" ::"n"(FP4_NST - 1));
            __syncwarp();
            if (tile < n_tiles) {
                const char *st = ring + slot * FP4_STAGE;
                const int c = 4 * (si + q8 * S) + t; /* past K: zero weights and zero x */
                const uint4 *xc = (const uint4 *)(xq + c * FP4_XCH);
                uint4 xv[2 * FP4_XT];
#pragma unroll
                for (int u = 0; u < 2 * FP4_XT; u++) xv[u] = xc[u];
                const float4 dd = ((const float4 *)xd)[c]; /* scales, corrections */
#pragma unroll
                for (int h = 0; h < 2; h++) { /* row g, then g + 8 */
                    const uint4 cw = ((const uint4 *)(st + 512 * h))[lane];
                    const unsigned cs = *(const unsigned short *)(st + 1024 + (g + 8 * h) * 8 + 2 * t);
                    const __half2_raw sr =
                        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)cs, __NV_E4M3);
                    const float2 sc = __half22float2(*(const __half2 *)&sr);
                    const unsigned wv[4] = {cw.x, cw.y, cw.z, cw.w};
#pragma unroll
                    for (int b = 0; b < 2; b++) { /* the chunk's two blocks of 16 */
                        unsigned w8[4];
                        fp4_u8(wv[2 * b], w8[0], w8[1]);
                        fp4_u8(wv[2 * b + 1], w8[2], w8[3]);
                        unsigned sum = 0;
#pragma unroll
                        for (int u = 0; u < FP4_XT; u++) { /* the last chain starts at -128 X */
                            const uint4 xa = xv[2 * u + b];
                            unsigned d = u < FP4_XT - 1 ? 0u : __float_as_uint(b ? dd.w : dd.z);
                            d = fp4_dp4a(w8[0], xa.x, d);
                            d = fp4_dp4a(w8[1], xa.y, d);
                            d = fp4_dp4a(w8[2], xa.z, d);
                            d = fp4_dp4a(w8[3], xa.w, d);
                            sum = sum * FP4_R + d;
                        }
                        const float bsc = (b ? sc.y : sc.x) * (b ? dd.y : dd.x);
                        acc[h] = fmaf((float)(int)sum, bsc, acc[h]);
                    }
                }
            }
            __syncwarp(); /* every lane has read the stage before it is queued again */
            slot = slot == FP4_NST - 1 ? 0 : slot + 1;
        }
        /* each row's four lanes summed in a fixed order: (t0 + t1) + (t2 + t3) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
            acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
        }
        float(*pt)[16] = part[it & 1];
        if (t == 0) {
            pt[warp][g] = acc[0];
            pt[warp][g + 8] = acc[1];
        }
        __syncthreads();
        if (si == 0 && tile < n_tiles) {
            float v = 0.0f;
            if (lane < 16) {
                v = pt[warp][lane];
                for (int jj = 1; jj < S; jj++) v += pt[warp + jj][lane];
                v = v * post * w.scale;
            }
            fp4_write(epi, combine, y, ys, r, k, tile, n_tiles, N, lane, v);
        }
    }
    asm volatile("cp.async.wait_all;\n" ::);
}

/* A tile's end in quarter super-steps, for the split (cu_gemv_fp4). On the H200 (whole-model
 * decode, two rounds in one run, builds that also held a BF16 GEMV candidate not kept) these
 * took the MoE down projections (8 gathered rows, N 2688, K 1856) from S = 4 (three tiles a
 * warp, 12 super-steps) to S = 1 (one tile, 15 super-steps): 454.1 -> 461.1 tok/s; a whole
 * super-step a tile's end, which also moves the Mamba in_proj from S = 8 (three tiles of 3) to
 * S = 2 (one of 11), ran 455.4. */
#define FP4_END 2
#define FP4_END_COMBINE 4


/* See cuda_impl.h: k_gemv_fp4 launched as launch_gemv1 launches k_gemv1 (S over 16-row tiles). */
void cu_gemv_fp4(cu_ctx *c, const cu_wexp &dense, const cu_wexp *table, int n_w,
                 const cn_tensor *ids, int k, const cn_tensor *x, int x_per_token, cn_tensor *y,
                 int64_t K, int64_t N, int rows, const g1_epi &epi) {
    int &per_sm = c->fp4_blocks; /* resident blocks per SM, asked once (largest staging) */
    const int most = FP4_RING + MM_FP4_MAXK / 32 * (FP4_XCH + FP4_XD);
    if (!per_sm &&
        (cudaFuncSetAttribute(k_gemv_fp4, cudaFuncAttributeMaxDynamicSharedMemorySize, most) !=
             cudaSuccess ||
         cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_gemv_fp4, 256, most) !=
             cudaSuccess))
        per_sm = 1;
    if (per_sm < 1) per_sm = 1;
    const int64_t n_tiles = (N + 15) / 16, n_ss = (K / 32 + 3) / 4;
    /* S: the split whose busiest warp costs least in the one wave of resident blocks (the smaller
     * S on a tie: fewer partials to add), in quarter super-steps, a tile's end (its partials
     * through shared memory and a barrier) counting FP4_END and with combine FP4_END_COMBINE
     * more (a fence and a count per tile) */
    const bool combine = g1_combines(table, epi);
    const int64_t ecost = FP4_END + (combine ? FP4_END_COMBINE : 0);
    const int64_t cap = ((int64_t)c->n_sm * per_sm + rows - 1) / rows;
    int S = 1;
    int64_t best = INT64_MAX;
    for (int s = 1; s <= 8 && (s == 1 || s <= n_ss); s *= 2) {
        const int64_t gx = (n_tiles + 8 / s - 1) / (8 / s);
        const int64_t per_wave = (gx > cap ? cap : gx) * (8 / s);
        const int64_t iters = (n_tiles + per_wave - 1) / per_wave;
        const int64_t cost = iters * (4 * ((n_ss + s - 1) / s) + ecost);
        if (cost < best) best = cost, S = s;
    }
    const int64_t bx = (n_tiles + 8 / S - 1) / (8 / S);
    /* Settled ids (invariant 7: the kernel just before declared writes that miss them), as a
     * MoE's down product has after its up product: its experts' first weights are on their way
     * while the up product drains, 489.1 / 489.4 -> 498.2 / 492.3 tok/s (whole-model decode on
     * the H200, two rounds in one run). */
    const int settled = table && cu_settled(c, ids->data, cu_extent(ids));
    const dim3 grid((unsigned)(bx > cap ? cap : bx), (unsigned)rows);
    cu_launch(c, k_gemv_fp4, grid, 256, (size_t)FP4_RING + (size_t)n_ss * 4 * (FP4_XCH + FP4_XD),
        dense, table, n_w, ids ? (const char *)ids->data : NULL, ids ? ids->stride[0] : 0, k,
        (const char *)x->data, x->stride[0], x_per_token, (char *)y->data, y->stride[0], (int)K,
        (int)N, S, rows, c->flag_dev, settled, epi);
    /* y, the ids' verdict, and combining, the partial rows and the counters */
    cu_wrote(c, {{y->data, cu_extent(y)}, {c->flag_dev, sizeof(int)},
                 {epi.prt, (size_t)rows * (size_t)N * sizeof(float)},
                 {epi.cnt, CU_EP_COUNTERS * sizeof(int)}});
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
