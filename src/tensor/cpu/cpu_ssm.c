/* cpu_ssm.c - Mamba2's causal depthwise conv1d and selective scan on the CPU.
 *
 * Promises: the scan is the exact per-token recurrence in fp32 (no chunked SSD), so a scan over T
 * tokens, T single steps, or any split into segments give bit-identical outputs and states; the
 * `chunk` hint is ignored. conv1d likewise gives the same result for one call or any split, and
 * its fused silu is the silu op's kernel run on each finished row of sums (the same bits as the
 * op after it).
 * Parallel over heads (scan) and channel blocks (conv); each output is computed by one thread in a
 * fixed order. Never writes outside y, state and the captures' states (which get exactly what the
 * state holds after their row: the conv's raw inputs, the scan's per-head state copied as each
 * head passes the row, while it is in cache). A scan "from" another state reads its start there
 * and leaves it as it was: the same bits in `state` as copying it in first, without the pass.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "tensor/cpu/cpu_impl.h"

/* ---- conv1d ---- */

#define CONV_CB 64 /* channels per task: one cache line of each row of x, y and state */

typedef struct conv_job {
    const cn_tensor *y, *x, *w, *state;
    const cn_state_caps *caps; /* NULL: none */
    const float *bias; /* [C] or NULL */
    const cpu_kernels *silu; /* the silu op's kernels for the outputs, NULL: none */
    int64_t T, C, K;
} conv_job;

#define CONV_KMAX 8 /* taps up to which a task lays its channels' weights out tap by tap */

/* Row t of the input, t in [-(K-1), T): state rows hold t < 0, oldest first. */
static inline const float *conv_row(const conv_job *j, int64_t t) {
    return t < 0 ? cpu_row(j->state, j->K - 1 + t) : cpu_row(j->x, t);
}

static void conv_task(void *arg, int begin, int end) {
    const conv_job *j = arg;
    const int64_t K = j->K, ws = j->w->stride[0] / (int64_t)sizeof(float);
    float wt[CONV_KMAX][CONV_CB]; /* the block's weights, tap by tap: rows the loops vectorise */
    for (int blk = begin; blk < end; blk++) {
        int64_t c0 = (int64_t)blk * CONV_CB, c1 = c0 + CONV_CB < j->C ? c0 + CONV_CB : j->C;
        const int64_t n = c1 - c0;
        const int laid = K <= CONV_KMAX;
        for (int64_t k = 0; laid && k < K; k++)
            for (int64_t c = 0; c < n; c++) wt[k][c] = cpu_row(j->w, c0 + c)[k];
        /* each output summed in the order bias, tap 0, .., tap K-1 (the sums of a
         * channel-by-channel loop, bit for bit), in a register across the taps: adding tap by tap
         * into the row of y stored and reloaded it K times (6.7 ms for 1024 x 6144, 5x its
         * memory time) */
        for (int64_t t = 0; t < j->T; t++) {
            float *restrict y = cpu_row(j->y, t) + c0;
            if (laid && K == 4) { /* nano's kernel: the taps unrolled, so the loop vectorizes */
                const float *restrict x0 = conv_row(j, t - 3) + c0;
                const float *restrict x1 = conv_row(j, t - 2) + c0;
                const float *restrict x2 = conv_row(j, t - 1) + c0;
                const float *restrict x3 = conv_row(j, t) + c0;
                for (int64_t c = 0; c < n; c++) {
                    float v = j->bias ? j->bias[c0 + c] : 0.0f;
                    v += wt[0][c] * x0[c];
                    v += wt[1][c] * x1[c];
                    v += wt[2][c] * x2[c];
                    v += wt[3][c] * x3[c];
                    y[c] = v;
                }
                if (j->silu) j->silu->silu(y, y, n); /* the silu op's bits, on the finished sums */
                continue;
            }
            for (int64_t c = 0; c < n; c++) y[c] = j->bias ? j->bias[c0 + c] : 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const float *restrict in = conv_row(j, t - K + 1 + k) + c0;
                if (laid) {
                    const float *restrict w = wt[k];
                    for (int64_t c = 0; c < n; c++) y[c] += w[c] * in[c];
                } else {
                    const float *restrict w = cpu_row(j->w, c0) + k;
                    for (int64_t c = 0; c < n; c++) y[c] += w[c * ws] * in[c];
                }
            }
            if (j->silu) j->silu->silu(y, y, n);
        }
        /* a capture after r rows holds the inputs at times r - (K-1) .. r - 1, read before the
         * state below is overwritten */
        for (int ci = 0; j->caps && ci < j->caps->n; ci++) {
            const int64_t r = j->caps->rows[ci];
            for (int64_t i = 0; i < K - 1; i++)
                memcpy(cpu_row(j->caps->states[ci], i) + c0, conv_row(j, r - (K - 1) + i) + c0,
                       (size_t)n * sizeof(float));
        }
        /* new state row i = input at time T - (K-1) + i: row T + i > i of the state or a row of
         * x, read before it is overwritten, which keeps this in place */
        for (int64_t i = 0; i < K - 1; i++)
            memcpy(cpu_row(j->state, i) + c0, conv_row(j, j->T - (K - 1) + i) + c0,
                   (size_t)n * sizeof(float));
    }
}

int cpu_conv1d_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                    const cn_tensor *bias, int silu, cn_tensor *state, const cn_state_caps *caps) {
    conv_job j = {.y = y, .x = x, .w = w, .state = state, .caps = caps && caps->n ? caps : NULL,
                  .bias = bias ? (const float *)bias->data : NULL,
                  .silu = silu ? &cpu_ctx_of(b)->kern : NULL,
                  .T = x->shape[0], .C = x->shape[1], .K = w->shape[1]};
    int n_blk = (int)((j.C + CONV_CB - 1) / CONV_CB);
    cpu_parallel(cpu_ctx_of(b), n_blk, j.T * j.C * j.K * 2, conv_task, &j);
    return CN_OK;
}

int cpu_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
               const cn_tensor *bias, int silu, cn_tensor *state) {
    return cpu_conv1d_caps(b, y, x, w, bias, silu, state, NULL);
}

/* ---- selective scan ---- */

typedef struct scan_job {
    const cpu_ctx *c;
    const cn_tensor *y, *x, *dt, *B, *C, *state;
    const cn_tensor *from; /* the state read at the start (left as it is), or NULL: `state` */
    const cn_ssm_args *a;
    const cn_state_caps *caps; /* NULL: none */
    int64_t T;
} scan_job;

/* softplus(v) = log(1 + e^v), stable: e^v overflows past ~88 and log1p(e^v) == v in fp32 past 20 */
static inline float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* State of head h in s: [P][N] fp32. A state is [H, P*N] (2D, rows possibly strided) or contiguous. */
static float *head_state(const scan_job *j, const cn_tensor *s, int h) {
    if (s->ndim == 2 && s->shape[0] == j->a->n_heads) return cpu_row(s, h);
    return (float *)s->data + (int64_t)h * j->a->head_dim * j->a->d_state;
}

/* dt after dt_bias, softplus and the clamp, and the decay exp(dt A), of head h at token t. */
static void scan_dt(const scan_job *j, int h, int64_t t, float A, float dtb, float *dtv,
                    float *dA) {
    float v = softplus(cpu_row(j->dt, t)[h] + dtb);
    *dtv = fminf(fmaxf(v, j->a->dt_min), j->a->dt_max);
    *dA = expf(*dtv * A);
}

/* Tokens up to which a scan walks a head block of 8 state rows at a time through every token
 * (scan_rows) instead of token by token: a speculative verify, whose head state is then read and
 * written once, not once per token. */
#define SCAN_SHORT 8

/* Head h over T <= SCAN_SHORT tokens, from F into S (F == S: in place). Every row gets the
 * operations of the token-by-token walk (ssm_rows8 gives ssm_row's bits), so outputs and states
 * are the same bits; a capture copies the block while it is in L1. */
static void scan_rows(const scan_job *j, int h, float A, float Dh, float dtb, int64_t g,
                      const float *F, float *S) {
    const cn_ssm_args *a = j->a;
    const int64_t P = a->head_dim, N = a->d_state, T = j->T;
    float dtv[SCAN_SHORT], dA[SCAN_SHORT];
    float *cap[SCAN_SHORT] = {NULL}; /* the capture taken after token t, if any */
    for (int64_t t = 0; t < T; t++) scan_dt(j, h, t, A, dtb, &dtv[t], &dA[t]);
    for (int ci = 0; j->caps && ci < j->caps->n; ci++)
        cap[j->caps->rows[ci] - 1] = head_state(j, j->caps->states[ci], h);
    const int rows8 = j->c->kern.ssm_rows8 && N % 16 == 0;
    for (int64_t p = 0; p < P;) {
        const int64_t n = rows8 && p + 8 <= P ? 8 : 1;
        if (F != S) memcpy(S + p * N, F + p * N, (size_t)(n * N) * sizeof(float));
        for (int64_t t = 0; t < T; t++) {
            const float *xh = cpu_row(j->x, t) + h * P + p;
            const float *Bg = cpu_row(j->B, t) + g * N, *Cg = cpu_row(j->C, t) + g * N;
            float *yh = cpu_row(j->y, t) + h * P + p;
            float dx[8], r[8];
            for (int64_t i = 0; i < n; i++) dx[i] = dtv[t] * xh[i];
            if (n == 8) j->c->kern.ssm_rows8(S + p * N, Bg, Cg, dA[t], dx, N, r);
            else r[0] = j->c->kern.ssm_row(S + p * N, Bg, Cg, dA[t], dx[0], N);
            for (int64_t i = 0; i < n; i++) yh[i] = r[i] + Dh * xh[i];
            if (cap[t]) memcpy(cap[t] + p * N, S + p * N, (size_t)(n * N) * sizeof(float));
        }
        p += n;
    }
}

/* Token t of head h in S: S = S*dA + dt*x B^T; y = S C + D x. The first token streams the
 * head's state from memory row by row, in the order the prefetchers follow; later tokens find it
 * in cache, where 8 rows side by side beat one latency chain after another. */
static void scan_token(const scan_job *j, int h, float A, float Dh, float dtb, int64_t g, float *S,
                       int64_t t) {
    const int64_t P = j->a->head_dim, N = j->a->d_state;
    float dtv, dA;
    scan_dt(j, h, t, A, dtb, &dtv, &dA);
    const float *xh = cpu_row(j->x, t) + h * P;
    const float *Bg = cpu_row(j->B, t) + g * N;
    const float *Cg = cpu_row(j->C, t) + g * N;
    float *yh = cpu_row(j->y, t) + h * P;
    int64_t p = 0;
    for (; t > 0 && j->c->kern.ssm_rows8 && N % 16 == 0 && p + 8 <= P; p += 8) {
        float dx[8], r[8];
        for (int i = 0; i < 8; i++) dx[i] = dtv * xh[p + i];
        j->c->kern.ssm_rows8(S + p * N, Bg, Cg, dA, dx, N, r);
        for (int i = 0; i < 8; i++) yh[p + i] = r[i] + Dh * xh[p + i];
    }
    for (; p < P; p++) {
        const float xv = xh[p];
        yh[p] = j->c->kern.ssm_row(S + p * N, Bg, Cg, dA, dtv * xv, N) + Dh * xv;
    }
}

/* Tokens t..t+3 of head h in S, 4 rows at a time through ssm_rows4x4: each row's state is read
 * and written once for the 4 tokens instead of once per token (prefill's scan was bound by those
 * stores). The operations, and so the bits, are the token-by-token walk's. */
static void scan_tokens4(const scan_job *j, int h, float A, float Dh, float dtb, int64_t g,
                         float *S, int64_t t) {
    const int64_t P = j->a->head_dim, N = j->a->d_state;
    float dtv[4], dA[4];
    const float *xh[4], *Bg[4], *Cg[4];
    float *yh[4];
    for (int u = 0; u < 4; u++) {
        scan_dt(j, h, t + u, A, dtb, &dtv[u], &dA[u]);
        xh[u] = cpu_row(j->x, t + u) + h * P;
        Bg[u] = cpu_row(j->B, t + u) + g * N;
        Cg[u] = cpu_row(j->C, t + u) + g * N;
        yh[u] = cpu_row(j->y, t + u) + h * P;
    }
    for (int64_t p = 0; p < P; p += 4) {
        float dx[16], r[16];
        for (int u = 0; u < 4; u++)
            for (int i = 0; i < 4; i++) dx[4 * u + i] = dtv[u] * xh[u][p + i];
        j->c->kern.ssm_rows4x4(S + p * N, Bg, Cg, dA, dx, N, r);
        for (int u = 0; u < 4; u++)
            for (int i = 0; i < 4; i++) yh[u][p + i] = r[4 * u + i] + Dh * xh[u][p + i];
    }
}

static void scan_heads(void *arg, int begin, int end) {
    const scan_job *j = arg;
    const cn_ssm_args *a = j->a;
    const int64_t P = a->head_dim, N = a->d_state;
    const int heads_per_group = a->n_heads / a->n_groups;
    for (int h = begin; h < end; h++) {
        const float A = -expf(((const float *)a->A_log->data)[h]);
        const float Dh = ((const float *)a->D->data)[h];
        const float dtb = ((const float *)a->dt_bias->data)[h];
        const int64_t g = h / heads_per_group;
        float *S = head_state(j, j->state, h);
        const float *F = j->from ? head_state(j, j->from, h) : S;
        if (j->T > 1 && j->T <= SCAN_SHORT) {
            scan_rows(j, h, A, Dh, dtb, g, F, S);
            continue;
        }
        if (F != S) memcpy(S, F, (size_t)(P * N) * sizeof(float));
        int next = 0; /* the next capture */
        const int x4 = j->c->kern.ssm_rows4x4 && N % 16 == 0 && P % 4 == 0;
        for (int64_t t = 0; t < j->T;) {
            const int64_t cap = j->caps && next < j->caps->n ? j->caps->rows[next] : j->T + 1;
            if (t > 0 && x4 && t + 4 <= j->T && cap >= t + 4) { /* no capture inside the block */
                scan_tokens4(j, h, A, Dh, dtb, g, S, t);
                t += 4;
            } else {
                scan_token(j, h, A, Dh, dtb, g, S, t);
                t += 1;
            }
            if (cap == t)
                memcpy(head_state(j, j->caps->states[next++], h), S,
                       (size_t)(P * N) * sizeof(float));
        }
    }
}

static int scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state,
                const cn_tensor *from, const cn_state_caps *caps) {
    cpu_ctx *c = cpu_ctx_of(b);
    scan_job j = {.c = c, .y = y, .x = x, .dt = dt, .B = B, .C = C, .state = state, .from = from,
                  .a = a, .caps = caps && caps->n ? caps : NULL, .T = x->shape[0]};
    int64_t work = j.T * a->n_heads * a->head_dim * a->d_state * 4;
    cpu_parallel(c, a->n_heads, work, scan_heads, &j);
    return CN_OK;
}

int cpu_ssm_scan_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                      const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                      cn_tensor *state, const cn_state_caps *caps) {
    return scan(b, y, x, dt, B, C, a, state, NULL, caps);
}

int cpu_ssm_scan_from(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                      const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                      cn_tensor *state, const cn_tensor *from) {
    return scan(b, y, x, dt, B, C, a, state, from, NULL);
}

int cpu_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                 const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state) {
    return scan(b, y, x, dt, B, C, a, state, NULL, NULL);
}
