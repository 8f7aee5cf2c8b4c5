/* cuda_ssm.cu - Mamba2's causal depthwise conv1d and selective scan on the GPU.
 *
 * Promises: the scan is the exact per-token recurrence in fp32, like the CPU backend (no chunked
 * SSD yet), so a scan over T tokens, T single steps or any split give the same outputs and states
 * up to the order of the d_state sum; one warp owns one (head, p) row of the state and keeps it in
 * registers for the whole call. conv1d: one thread per channel walks time in order (the state is
 * rolled in place by the same thread). Never writes outside y and state.
 */
#include <math.h>

#include "tensor/cuda/cuda_impl.h"

/* ---------------------------------------------------------------- conv1d */

__global__ void k_conv1d(char *y, int64_t ys, const char *x, int64_t xs, const char *w, int64_t ws,
                         const float *bias, char *state, int64_t ss, int64_t T, int64_t C,
                         int64_t K) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float *wr = (const float *)(w + c * ws);
#define CONV_IN(t) ((t) < 0 ? ((const float *)(state + (K - 1 + (t)) * ss))[c] \
                            : ((const float *)(x + (t) * xs))[c])
    for (int64_t t = 0; t < T; t++) {
        float acc = bias ? bias[c] : 0.0f;
        for (int64_t k = 0; k < K; k++) acc += wr[k] * CONV_IN(t - K + 1 + k);
        ((float *)(y + t * ys))[c] = acc;
    }
    for (int64_t i = 0; i < K - 1; i++) { /* row i + T >= i is read before it is overwritten */
        const float v = CONV_IN(T - (K - 1) + i);
        ((float *)(state + i * ss))[c] = v;
    }
#undef CONV_IN
}

int cu_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
              const cn_tensor *bias, cn_tensor *state) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t T = x->shape[0], C = x->shape[1], K = w->shape[1];
    if (C == 0) return CN_OK;
    k_conv1d<<<(unsigned)((C + 127) / 128), 128, 0, c->stream>>>(
        (char *)y->data, y->stride[0], (const char *)x->data, x->stride[0], (const char *)w->data,
        w->stride[0], bias ? (const float *)bias->data : NULL, (char *)state->data,
        state->stride[0], T, C, K);
    return cu_launch_check("conv1d");
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
} scan_args;

__device__ __forceinline__ float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* One warp per (h, p): s[n] = s[n] dA + dt x B[n]; y = sum s[n] C[n] + D x, token by token. */
__global__ void __launch_bounds__(128) k_ssm_scan(scan_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (int64_t)a.H * a.P) return;
    const int h = (int)(row / a.P), p = (int)(row % a.P);
    const int g = h / (a.H / a.G);
    const float A = -expf(a.A_log[h]), Dh = a.D[h], dtb = a.dt_bias[h];
    float *S = (float *)(a.state + h * a.state_row) + (int64_t)p * a.N;
    float s[SSM_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < SSM_MAX_PER_LANE; i++) {
        const int n = lane + 32 * i;
        s[i] = n < a.N ? S[n] : 0.0f;
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

int cu_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state) {
    cu_ctx *c = cu_ctx_of(b);
    if (a->d_state > 32 * SSM_MAX_PER_LANE) return CN_EUNSUPPORTED;
    const int64_t rows = (int64_t)a->n_heads * a->head_dim;
    if (rows == 0) return CN_OK;
    scan_args s;
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
    k_ssm_scan<<<(unsigned)((rows + 3) / 4), 128, 0, c->stream>>>(s);
    return cu_launch_check("ssm_scan");
}
