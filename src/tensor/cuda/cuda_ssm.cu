/* cuda_ssm.cu - Mamba2's causal depthwise conv1d and selective scan on the GPU.
 *
 * Promises: the scan is the exact per-token recurrence in fp32, like the CPU backend (no chunked
 * SSD yet), so a scan over T tokens, T single steps or any split give the same outputs and states
 * up to the order of the d_state sum; one warp owns one (head, p) row of the state and keeps it in
 * registers for the whole call. From SCAN_MIN_T tokens a block of 8 warps (one head), each owning
 * two (head, p) rows, stages 32 tokens of its inputs in shared memory at a time and reduces their
 * 32 y sums together (k_ssm_scan_chunked): the same recurrence, only the d_state sum in another
 * order. Its lanes hold consecutive state values (one vector load of B and C a token, shared by
 * the warp's two rows) and its 32 sums stay in registers (cu_warp_sum32), two blocks to an SM;
 * on the H200 that took nano-shape slice prefill from 107.1 to 113.1 thousand tok/s (one row a
 * warp, with cuda_elementwise.cu's row grids, same run), and the two rows a warp took the whole
 * model's scan from 767 to 393 us a layer (prefill 13,634 -> 14,479 tok/s).
 * conv1d: each output is the same sum in the same order (bias, then k ascending) whatever the
 * launch, through cu_silu_f when asked (the silu op's formula, so that a decode token's conv and
 * activation are one launch); a few tokens (with K <= 4 taps) walk time on one thread per channel,
 * which also rolls the state in place; more tokens take one thread per output, the state rolled
 * by a second launch after the first read it. Never writes outside y and state.
 * A decode step's conv and scan load their weights, and their states when settled (cuda_impl.h
 * invariant 7: the conv after an NVFP4 in_proj, the scan after the conv), before their enter.
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

/* ---------------------------------------------------------------- conv1d */

#define CONV_SEQ_MAX_T 8 /* tokens up to which one thread per channel walks time (one launch) */

/* in(t, c) for t in [-(K-1), T): the state's rows hold t < 0, oldest first. */
#define CONV_IN(t) ((t) < 0 ? ((const float *)(state + (K - 1 + (t)) * ss))[c] \
                            : ((const float *)(x + (t) * xs))[c])

/* Few tokens (decode, drafts) and K taps: one thread per channel walks them in order with the
 * last K - 1 inputs in registers and rolls the state, all in one launch. Its weights are loaded
 * before the enter (invariant 7), and its state too when settled (`early`: the kernel before
 * does not write it, cuda_impl.h invariant 7), so they are on their way while the kernel before
 * drains; the sums run in the order of k_conv1d's. */
template <int K>
__global__ void k_conv1d_seq(char *y, int64_t ys, const char *x, int64_t xs, const char *w,
                             int64_t ws, const float *bias, int silu, char *state, int64_t ss,
                             int64_t T, int64_t C, int early) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool on = c < C;
    float wk[K], win[K - 1], b = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) wk[k] = on ? ((const float *)(w + c * ws))[k] : 0.0f;
    if (on && bias) b = bias[c];
#pragma unroll
    for (int i = 0; i < K - 1; i++)
        win[i] = on && early ? __ldcg((const float *)(state + i * ss) + c) : 0.0f;
    cu_pdl_enter();
    if (!on) return;
    if (!early) {
#pragma unroll
        for (int i = 0; i < K - 1; i++) win[i] = ((const float *)(state + i * ss))[c];
    }
    for (int64_t t = 0; t < T; t++) {
        const float xt = ((const float *)(x + t * xs))[c];
        float acc = b;
#pragma unroll
        for (int k = 0; k < K - 1; k++) acc += wk[k] * win[k];
        acc += wk[K - 1] * xt;
        ((float *)(y + t * ys))[c] = silu ? cu_silu_f(acc) : acc;
#pragma unroll
        for (int i = 0; i < K - 2; i++) win[i] = win[i + 1];
        win[K - 2] = xt;
    }
#pragma unroll
    for (int i = 0; i < K - 1; i++) ((float *)(state + i * ss))[c] = win[i];
}

/* Many tokens (prefill): one thread per output (t, c). The outputs are independent, so a piece
 * fills the GPU instead of walking time on one thread per channel; the state is only read. */
__global__ void k_conv1d(char *y, int64_t ys, const char *x, int64_t xs, const char *w, int64_t ws,
                         const float *bias, int silu, const char *state, int64_t ss, int64_t t0,
                         int64_t C, int64_t K) {
    cu_pdl_enter();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t t = t0 + blockIdx.y;
    if (c >= C) return;
    const float *wr = (const float *)(w + c * ws);
    float acc = bias ? bias[c] : 0.0f;
    for (int64_t k = 0; k < K; k++) acc += wr[k] * CONV_IN(t - K + 1 + k);
    ((float *)(y + t * ys))[c] = silu ? cu_silu_f(acc) : acc;
}

/* The state rolled to the last K-1 inputs, after k_conv1d (stream order) read the old one. One
 * thread per channel, in place: row i + T >= i is read before it is overwritten. */
__global__ void k_conv1d_state(const char *x, int64_t xs, char *state, int64_t ss, int64_t T, int64_t C,
                               int64_t K) {
    cu_pdl_enter();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int64_t i = 0; i < K - 1; i++) {
        const float v = CONV_IN(T - (K - 1) + i);
        ((float *)(state + i * ss))[c] = v;
    }
}
#undef CONV_IN

int cu_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
              const cn_tensor *bias, int silu, cn_tensor *state) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], C = x->shape[1], K = w->shape[1];
    if (C == 0 || T == 0) return CN_OK;
    const unsigned cb = (unsigned)((C + 127) / 128);
    void (*seq)(char *, int64_t, const char *, int64_t, const char *, int64_t, const float *, int,
                char *, int64_t, int64_t, int64_t, int) = K == 2   ? k_conv1d_seq<2>
                                                          : K == 3 ? k_conv1d_seq<3>
                                                          : K == 4 ? k_conv1d_seq<4>
                                                                   : NULL;
    if (T <= CONV_SEQ_MAX_T && seq) {
        const int early = cu_settled(c, state->data, cu_extent(state));
        cu_launch(c, seq, cb, 128, 0, (char *)y->data, y->stride[0], (const char *)x->data,
                  x->stride[0], (const char *)w->data, w->stride[0],
                  bias ? (const float *)bias->data : NULL, silu, (char *)state->data,
                  state->stride[0], T, C, early);
        cu_wrote(c, {{y->data, cu_extent(y)}, {state->data, cu_extent(state)}});
        return cu_launch_check("conv1d");
    }
    for (int64_t t0 = 0; t0 < T; t0 += 65535) { /* grid.y is at most 65535 */
        const int64_t n = T - t0 < 65535 ? T - t0 : 65535;
        cu_launch(c, k_conv1d, dim3(cb, (unsigned)n), 128, 0,
            (char *)y->data, y->stride[0], (const char *)x->data, x->stride[0], (const char *)w->data,
            w->stride[0], bias ? (const float *)bias->data : NULL, silu,
            (const char *)state->data, state->stride[0], t0, C, K);
        int rc = cu_launch_check("conv1d");
        if (rc) return rc;
    }
    cu_launch(c, k_conv1d_state, cb, 128, 0, (const char *)x->data, x->stride[0], (char *)state->data,
                                             state->stride[0], T, C, K);
    return cu_launch_check("conv1d state");
}

/* ---------------------------------------------------------------- selective scan */

#define SSM_MAX_PER_LANE 8 /* d_state <= 256 */

typedef struct scan_args {
    char *y;
    int64_t ys;
    const char *x, *dt, *B, *C;
    int64_t xs, dts, Bs, Cs;
    const float *A_log, *D, *dt_bias;
    char *state;
    int64_t state_row; /* bytes between heads' states */
    int64_t T;
    int H, P, G, N;
    float dt_min, dt_max;
    int vec4; /* B and C rows 16-byte aligned and N % 4 == 0: the chunked scan copies 4 floats at once */
    int early; /* the state is settled (invariant 7): k_ssm_scan loads it before its enter */
} scan_args;

__device__ __forceinline__ float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* One warp per (h, p): s[n] = s[n] dA + dt x B[n]; y = sum s[n] C[n] + D x, token by token. The
 * head's weights, and the state row when settled (a.early), are loaded before the enter. */
__global__ void __launch_bounds__(128) k_ssm_scan(scan_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool on = row < (int64_t)a.H * a.P;
    const int h = on ? (int)(row / a.P) : 0, p = on ? (int)(row % a.P) : 0;
    const int g = h / (a.H / a.G);
    const float A = on ? -expf(a.A_log[h]) : 0.0f, Dh = on ? a.D[h] : 0.0f;
    const float dtb = on ? a.dt_bias[h] : 0.0f;
    float *S = (float *)(a.state + h * a.state_row) + (int64_t)p * a.N;
    float s[SSM_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < SSM_MAX_PER_LANE; i++) {
        const int n = lane + 32 * i;
        s[i] = on && a.early && n < a.N ? __ldcg(S + n) : 0.0f;
    }
    cu_pdl_enter();
    if (!on) return;
#pragma unroll
    for (int i = 0; i < SSM_MAX_PER_LANE; i++) {
        const int n = lane + 32 * i;
        if (!a.early) s[i] = n < a.N ? S[n] : 0.0f;
    }
    for (int64_t t = 0; t < a.T; t++) {
        float dtv = softplus_f(((const float *)(a.dt + t * a.dts))[h] + dtb);
        dtv = fminf(fmaxf(dtv, a.dt_min), a.dt_max);
        const float dA = expf(dtv * A);
        const float xv = ((const float *)(a.x + t * a.xs))[(int64_t)h * a.P + p];
        const float dx = dtv * xv;
        const float *Bg = (const float *)(a.B + t * a.Bs) + (int64_t)g * a.N;
        const float *Cg = (const float *)(a.C + t * a.Cs) + (int64_t)g * a.N;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < SSM_MAX_PER_LANE; i++) {
            const int n = lane + 32 * i;
            if (n < a.N) {
                s[i] = s[i] * dA + dx * Bg[n];
                acc += s[i] * Cg[n];
            }
        }
        acc = cu_warp_sum(acc);
        if (lane == 0) ((float *)(a.y + t * a.ys))[(int64_t)h * a.P + p] = acc + Dh * xv;
    }
#pragma unroll
    for (int i = 0; i < SSM_MAX_PER_LANE; i++) {
        const int n = lane + 32 * i;
        if (n < a.N) S[n] = s[i];
    }
}

/* ---------------------------------------------------------------- selective scan, prefill */

#define SCAN_L 32     /* tokens per chunk staged in shared memory: one per lane at the reduction */
#define SCAN_WARPS 8  /* warps per block, all of one head */
#define SCAN_PW 2     /* (h, p) rows per warp: they share each token's B and C loads */
#define SCAN_MIN_T 32 /* tokens from which a scan takes k_ssm_scan_chunked */

__device__ __forceinline__ void scan_cp4(float *dst, const float *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void scan_cp16(float *dst, const float *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}

/* NPL consecutive floats of shared memory (16-, 8- or 4-byte aligned as NPL says): one load. */
template <int NPL>
__device__ __forceinline__ void scan_ld(const float *p, float (&v)[NPL]) {
    if (NPL == 4) {
        const float4 q = *(const float4 *)p;
        v[0] = q.x, v[1] = q.y, v[2 % NPL] = q.z, v[3 % NPL] = q.w;
    } else if (NPL == 2) {
        const float2 q = *(const float2 *)p;
        v[0] = q.x, v[1 % NPL] = q.y;
    } else {
        v[0] = *p;
    }
}

/* One block per (head, SCAN_WARPS x SCAN_PW rows of p); each warp owns SCAN_PW (h, p) state
 * rows in registers (NPL consecutive values per lane, n = NPL lane + i, so a token's B and C
 * reach a lane in one vector load each, used for every row of the warp: ncu found the warps
 * waiting mostly on the shared-memory pipe, first with a scalar load per value, then with one
 * row a warp), walking the same recurrence token by token. B and C of the head's group come
 * through shared memory, SCAN_L tokens at a time, the next chunk copied in (cp.async) while the
 * current one is used; lane j holds token j's x and dt factors (also fetched a chunk ahead) and
 * hands them to the warp by shuffle; the chunk's y sums of a row are reduced together
 * (cu_warp_sum32). Tokens past T enter as dA = 1 and dt x B = 0 (B zero): the state passes them
 * unchanged. A row's arithmetic does not depend on which rows share its warp. */
template <int NPL>
__global__ void __launch_bounds__(SCAN_WARPS * 32, 2) k_ssm_scan_chunked(scan_args a) {
    cu_pdl_enter();
    constexpr int NP = NPL * 32, THREADS = SCAN_WARPS * 32, PW = SCAN_PW;
    extern __shared__ float sm[]; /* [2 buffers][B, C][SCAN_L][NP] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int h = blockIdx.y, p0 = (blockIdx.x * SCAN_WARPS + warp) * PW;
    const int g = h / (a.H / a.G);
    const float A = -expf(a.A_log[h]), Dh = a.D[h], dtb = a.dt_bias[h];
    bool live[PW];
    float *S[PW];
    float s[PW][NPL];
#pragma unroll
    for (int q = 0; q < PW; q++) {
        live[q] = p0 + q < a.P;
        S[q] = (float *)(a.state + h * a.state_row) + (int64_t)(live[q] ? p0 + q : 0) * a.N;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int n = NPL * lane + i;
            s[q][i] = live[q] && n < a.N ? S[q][n] : 0.0f;
        }
    }
    /* B and C of tokens [t0, t0 + SCAN_L) into buffer buf, zeros past T and N */
    auto issue = [&](int64_t t0, int buf) {
        float *dst = sm + buf * 2 * SCAN_L * NP;
        const int step = a.vec4 ? 4 : 1; /* floats a copy moves */
        for (int e = tid * step; e < 2 * SCAN_L * NP; e += THREADS * step) {
            const int m = e / (SCAN_L * NP), j = (e / NP) % SCAN_L, n = e % NP;
            if (t0 + j < a.T && n < a.N) {
                const char *row = (m ? a.C + (t0 + j) * a.Cs : a.B + (t0 + j) * a.Bs);
                const float *src = (const float *)row + (int64_t)g * a.N + n;
                if (a.vec4) scan_cp16(dst + e, src);
                else scan_cp4(dst + e, src);
            } else {
                for (int i = 0; i < step; i++) dst[e + i] = 0.0f;
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    /* this lane's token of the chunk at t0: x of the warp's rows and the raw dt */
    auto fetch = [&](int64_t t0, float (&xv)[PW], float &dtr) {
        const bool ok = t0 + lane < a.T;
        const float *xr = (const float *)(a.x + (t0 + lane) * a.xs) + (int64_t)h * a.P + p0;
#pragma unroll
        for (int q = 0; q < PW; q++) xv[q] = ok && live[q] ? xr[q] : 0.0f;
        dtr = ok ? ((const float *)(a.dt + (t0 + lane) * a.dts))[h] : 0.0f;
    };
    float xv[PW], dtr;
    issue(0, 0);
    fetch(0, xv, dtr);
    int buf = 0;
    for (int64_t t0 = 0; t0 < a.T; t0 += SCAN_L, buf ^= 1) {
        const bool more = t0 + SCAN_L < a.T;
        float xn[PW], dtn = 0.0f;
#pragma unroll
        for (int q = 0; q < PW; q++) xn[q] = 0.0f;
        if (more) {
            issue(t0 + SCAN_L, buf ^ 1); /* the buffer the previous chunk read: all done with it */
            fetch(t0 + SCAN_L, xn, dtn);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        float dtv = 0.0f, dA = 1.0f;
        if (t0 + lane < a.T) {
            dtv = softplus_f(dtr + dtb);
            dtv = fminf(fmaxf(dtv, a.dt_min), a.dt_max);
            dA = expf(dtv * A);
        }
        float dx[PW];
#pragma unroll
        for (int q = 0; q < PW; q++) dx[q] = dtv * xv[q];
        const float *sB = sm + buf * 2 * SCAN_L * NP, *sC = sB + SCAN_L * NP;
        float v[PW][SCAN_L];
#pragma unroll 32
        for (int j = 0; j < SCAN_L; j++) {
            const float dAj = __shfl_sync(0xffffffffu, dA, j);
            float bv[NPL], cv[NPL];
            scan_ld<NPL>(sB + j * NP + NPL * lane, bv);
            scan_ld<NPL>(sC + j * NP + NPL * lane, cv);
#pragma unroll
            for (int q = 0; q < PW; q++) {
                const float dxj = __shfl_sync(0xffffffffu, dx[q], j);
                v[q][j] = 0.0f;
#pragma unroll
                for (int i = 0; i < NPL; i++) {
                    s[q][i] = s[q][i] * dAj + dxj * bv[i];
                    v[q][j] += s[q][i] * cv[i];
                }
            }
        }
#pragma unroll
        for (int q = 0; q < PW; q++) {
            const float yv = cu_warp_sum32(v[q], lane);
            if (live[q] && t0 + lane < a.T)
                ((float *)(a.y + (t0 + lane) * a.ys))[(int64_t)h * a.P + p0 + q] = yv + Dh * xv[q];
            xv[q] = xn[q];
        }
        dtr = dtn;
        __syncthreads(); /* every warp is done with buf before the next chunk refills it */
    }
#pragma unroll
    for (int q = 0; q < PW; q++) {
        if (!live[q]) continue;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int n = NPL * lane + i;
            if (n < a.N) S[q][n] = s[q][i];
        }
    }
}

/* Launches the chunked scan with NPL state values per lane (opting in to its shared memory). */
template <int NPL>
static int scan_chunked(cu_ctx *c, const scan_args &s) {
    const size_t smem = (size_t)2 * 2 * SCAN_L * NPL * 32 * sizeof(float);
    if (smem > 48 * 1024) {
        int rc = cu_check(cudaFuncSetAttribute(k_ssm_scan_chunked<NPL>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                          "ssm_scan shared memory");
        if (rc) return rc;
    }
    const int pb = SCAN_WARPS * SCAN_PW;
    const dim3 grid((unsigned)((s.P + pb - 1) / pb), (unsigned)s.H);
    cu_launch(c, k_ssm_scan_chunked<NPL>, grid, SCAN_WARPS * 32, smem, s);
    return cu_launch_check("ssm_scan (chunked)");
}

int cu_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state) {
    cu_ctx *c = cu_ctx_of(b);
    if (a->d_state > 32 * SSM_MAX_PER_LANE) return CN_EUNSUPPORTED;
    const int64_t rows = (int64_t)a->n_heads * a->head_dim;
    if (rows == 0) return CN_OK;
    scan_args s;
    s.early = 0;
    s.y = (char *)y->data;
    s.ys = y->stride[0];
    s.x = (const char *)x->data;
    s.xs = x->stride[0];
    s.dt = (const char *)dt->data;
    s.dts = dt->stride[0];
    s.B = (const char *)B->data;
    s.Bs = B->stride[0];
    s.C = (const char *)C->data;
    s.Cs = C->stride[0];
    s.A_log = (const float *)a->A_log->data;
    s.D = (const float *)a->D->data;
    s.dt_bias = (const float *)a->dt_bias->data;
    s.state = (char *)state->data;
    /* [H, P*N] 2D (rows possibly strided) or contiguous, as on the CPU */
    s.state_row = (state->ndim == 2 && state->shape[0] == a->n_heads)
                      ? state->stride[0]
                      : (int64_t)a->head_dim * a->d_state * (int64_t)sizeof(float);
    s.T = x->shape[0];
    s.H = a->n_heads;
    s.P = a->head_dim;
    s.G = a->n_groups;
    s.N = a->d_state;
    s.dt_min = a->dt_min;
    s.dt_max = a->dt_max;
    s.vec4 = ((uintptr_t)s.B | (uintptr_t)s.C | (uintptr_t)s.Bs | (uintptr_t)s.Cs) % 16 == 0 && s.N % 4 == 0;
    if (s.T >= SCAN_MIN_T && s.N <= 128 && s.H <= 65535) {
        const int npl = (s.N + 31) / 32;
        return npl == 1 ? scan_chunked<1>(c, s) : npl == 2 ? scan_chunked<2>(c, s) : scan_chunked<4>(c, s);
    }
    s.early = cu_settled(c, state->data, cu_extent(state));
    cu_launch(c, k_ssm_scan, (unsigned)((rows + 3) / 4), 128, 0, s);
    cu_wrote(c, {{y->data, cu_extent(y)}, {state->data, cu_extent(state)}});
    return cu_launch_check("ssm_scan");
}
