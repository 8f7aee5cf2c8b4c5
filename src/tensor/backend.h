/* backend.h - the one table of operations a compute backend implements, seen through wrappers.
 *
 * The model calls only these wrappers; it never touches memory a backend owns except through
 * cn_backend_upload/download. A backend (CPU now, CUDA later) implements the table in
 * backend_impl.h. Conventions for every op:
 *  (1) Activations are F32 2D tensors [rows, cols]; rows are contiguous, the row stride may be
 *      larger than cols (column views of a wider activation, see cn_tensor_cols).
 *  (2) Weight matrices are [N, K] in any weight dtype the backend supports (F32, BF16, F16,
 *      F8_E4M3 with per-tensor scale, NVFP4 with K % 16 == 0 and block_scale [N, K/16] E4M3 (or
 *      U8), MXFP8 with K % 32 == 0 and block_scale [N, K/32] E8M0 (or U8)); y = x W^T. A backend
 *      may compute NVFP4 products from activations it quantizes itself (the CPU: int8 per 16).
 *  (3) Vectors (norm weights, biases, A_log, D, dt_bias, conv weights) are F32: the model converts
 *      them at load.
 *  (4) Index tensors are I32 and live where the backend computes.
 *  (5) Outputs never alias inputs unless the op says so.
 * Every wrapper returns 0 or a negative CN_E code (CN_EINVAL for shapes that do not fit,
 * CN_EUNSUPPORTED for a dtype the backend lacks); on error nothing was written.
 */
#ifndef CN_BACKEND_H
#define CN_BACKEND_H

#include <stdint.h>

#include "tensor/tensor.h"

typedef struct cn_backend cn_backend; /* layout: backend_impl.h */

/* Mamba2 scan parameters shared by ssm_scan and ssm_step. */
typedef struct cn_ssm_args {
    const cn_tensor *A_log;   /* [H] F32; A = -exp(A_log) */
    const cn_tensor *D;       /* [H] F32; skip connection */
    const cn_tensor *dt_bias; /* [H] F32 */
    int n_heads;              /* H */
    int head_dim;             /* P */
    int n_groups;             /* G; head h reads group h / (H / G) */
    int d_state;              /* N */
    int chunk;                /* SSD chunk length (a hint: any value gives the same result) */
    float dt_min, dt_max;     /* clamp of softplus(dt + dt_bias): time_step_limit */
} cn_ssm_args;

/* Router parameters for moe_route. */
typedef struct cn_route_args {
    int top_k;            /* experts per token */
    int n_group;          /* expert groups; 1 = no group limiting */
    int topk_group;       /* groups kept when n_group > 1 */
    int norm_topk;        /* renormalize chosen weights to sum 1 */
    float scaling;        /* routed_scaling_factor, applied after renormalization */
} cn_route_args;

const char *cn_backend_name(const cn_backend *b);
void cn_backend_free(cn_backend *b);

/* ---- memory ---- */
/* Allocates t->data for t's dtype and shape (contiguous) on the backend; sets t->where. */
int cn_backend_alloc(cn_backend *b, cn_tensor *t);
/* Frees what cn_backend_alloc gave; t->data becomes NULL. Safe on a NULL data. */
void cn_backend_release(cn_backend *b, cn_tensor *t);
/* Copies nbytes from host into dst at byte offset. */
int cn_backend_upload(cn_backend *b, cn_tensor *dst, uint64_t offset, const void *host, uint64_t nbytes);
/* Copies a (possibly row-strided) 2D tensor into host memory, rows packed. */
int cn_backend_download(cn_backend *b, void *host, const cn_tensor *src);
/* dst = src for equal shapes (2D, row strides honoured); dtypes F32 <-> F32/BF16/F16. */
int cn_backend_copy(cn_backend *b, cn_tensor *dst, const cn_tensor *src);
/* Bytes of the memory cn_backend_alloc draws from: free now and in all (a device's own memory;
 * the host's MemAvailable and MemTotal for a backend computing in host memory). 0, or
 * CN_EUNSUPPORTED with both 0 when the backend cannot tell. */
int cn_backend_memory(cn_backend *b, uint64_t *free_bytes, uint64_t *total_bytes);
/* Makes a host-mapped weight usable by the backend (CPU: nothing; CUDA: upload). */
int cn_backend_weight(cn_backend *b, cn_tensor *w);
/* Waits for queued work (no-op on CPU). */
int cn_backend_sync(cn_backend *b);
/* 1 if matmul/matmul_gather/get_rows accept weights of this dtype. */
int cn_backend_supports_weight(const cn_backend *b, cn_dtype dtype);

/* ---- snapshot buffers and the copy stream ----
 * The prefix cache keeps layer snapshots in buffers of their own, not tensors: device buffers
 * (its DEVICE tier) and host buffers (its RAM tier; pinned where the backend has them, so that
 * copies to and from the device run at the link's speed without the host waiting). Copies
 * between a host buffer and device memory run on a copy stream beside the ops:
 *  (a) cn_backend_copy_async queues n bytes after every op queued so far (it sees their results;
 *      a copy into device memory also waits for the ops that read it before) and returns a fence;
 *      cn_backend_fence_wait makes the host (host = 1) or the ops queued after it (host = 0) wait
 *      for that copy. Fences grow: a done fence means every lower one is done; fence 0 is done.
 *  (b) A host buffer a queued copy reads or writes is not read, written or freed by the host
 *      before its fence is done (the caller keeps the fence).
 *  (c) cn_backend_buf_free of a device buffer takes effect after every op and copy queued so far,
 *      so a buffer may be freed right after queueing the copy that drains it.
 * A backend computing in host memory (the CPU) leaves the members out: both kinds of buffer are
 * malloc'd, a copy is a memcpy done when it returns (fence 0), and cn_backend_has_device_memory
 * is 0. All of these are refused inside a step (CN_EBUSY), except fence_done. */
enum { CN_BUF_DEVICE = 0, CN_BUF_HOST = 1 }; /* buffer kinds */
enum { CN_COPY_D2H = 0, CN_COPY_H2D = 1 };   /* copy directions */
/* 1 if the backend computes in memory apart from the host's (device buffers are not host memory). */
int cn_backend_has_device_memory(const cn_backend *b);
/* A buffer of n bytes (n may be 0) of `kind`. 0, CN_ENOMEM (nothing allocated) or CN_EBUSY. */
int cn_backend_buf_alloc(cn_backend *b, int kind, uint64_t n, void **out);
/* Frees what buf_alloc gave (NULL is ignored); device buffers as (c) says. */
void cn_backend_buf_free(cn_backend *b, int kind, void *p);
/* Queues dst <- src, n bytes, on the copy stream: dir CN_COPY_D2H (src device memory: a device
 * buffer or a contiguous tensor's bytes) or CN_COPY_H2D (dst device memory). *fence as (a). */
int cn_backend_copy_async(cn_backend *b, void *dst, const void *src, uint64_t n, int dir,
                          uint64_t *fence);
/* 1 once the copy of `fence` (and every earlier one) is done; never waits. */
int cn_backend_fence_done(cn_backend *b, uint64_t fence);
/* Waits for `fence`: the host (host = 1), or only the ops queued after this call (host = 0). */
int cn_backend_fence_wait(cn_backend *b, uint64_t fence, int host);

/* ---- steps ---- */
/* A step brackets the ops of one small forward the caller repeats with the same shapes (a decode
 * token): cn_backend_step_begin, the ops, cn_backend_step_end, then the downloads. Inside a step
 *  (a) no op waits for the device: the index checks of get_rows and matmul_gather are not read
 *      until step_end, which returns CN_EINVAL if one failed (that op wrote nothing, but later ops
 *      of the step ran on its output: put inside a step only ids the caller checked or the
 *      backend's own moe_route produced);
 *  (b) upload, download, sync, alloc and release are refused (CN_EBUSY), and so is a nested begin;
 *  (c) a backend may record the ops and run them at step_end as one unit (CUDA: a graph captured
 *      and updated in place of the last one recorded under the same `key`); ops return errors
 *      they can see while recording, and an op that failed means step_end runs nothing.
 * step_end must follow every successful begin: with run = 1 it runs (or lets finish) the step and
 * waits for it; with run = 0, after an op of the step failed, it discards what a recording backend
 * holds and returns CN_OK (the op's own error is the one to report; an eager backend has already
 * run the ops before the failure). Steps are optional: a backend without them runs the ops as
 * called and both calls return CN_OK.
 *  (d) A step may be begun at a position (cn_backend_step_begin_at: a decode token's cache
 *      offset). Its position arguments — cn_op_attention's n_past, cn_op_set_rows's row — are
 *      then taken relative to `pos` (value - pos is what is recorded), so a recording backend
 *      may REPLAY the step recorded under the same (key, tag) at another pos without the ops
 *      being issued again: begin_at returns 1, the caller issues no op and calls step_end(b, 1).
 *      The caller promises that under one (key, tag) it issues the same ops on the same tensors
 *      every time, only the position moving (tag names what else the ops depend on: the state,
 *      whether the head runs); the backend owns everything else a replay depends on (its scratch,
 *      a freed tensor: it records again after either changed). Returns 0 when the step is open
 *      for ops as with step_begin. */
int cn_backend_step_begin(cn_backend *b, int key);
/* A key with this bit set names a step that is never recorded: its ops run as called, still
 * without waiting inside the step ((a), (b)), for a forward that is not repeated (a prefill piece:
 * one wait at its end instead of one per index check). */
#define CN_STEP_EAGER (1 << 30)
int cn_backend_step_begin_at(cn_backend *b, int key, uint64_t tag, int pos);
int cn_backend_step_end(cn_backend *b, int run);

/* Whether steps may be recorded and replayed (on by default where a backend records them, see
 * cuda_backend.h); off, their ops run as called, still without waiting inside the step. Not
 * inside a step (CN_EBUSY). A backend that never records accepts either value. */
int cn_backend_set_record(cn_backend *b, int on);

/* ---- lanes ----
 * Independent ops of one forward may run side by side. cn_backend_fork sends the ops after it to
 * a side lane, which starts once everything queued before the fork is done; cn_backend_back sends
 * the ops after it to the main lane again, where they may run beside the side lane's;
 * cn_backend_join makes the main lane's later ops wait for everything on the side lane (a no-op
 * without an open fork; from the side lane it also goes back). The caller promises that what the
 * two lanes run between fork and join neither writes what the other reads or writes. One side
 * lane: fork again only after join; a step ends joined. A backend without lanes runs every op in
 * order, which is one schedule the promise allows, and these calls return CN_OK. */
enum { CN_LANE_FORK = 1, CN_LANE_BACK, CN_LANE_JOIN };
int cn_backend_fork(cn_backend *b);
int cn_backend_back(cn_backend *b);
int cn_backend_join(cn_backend *b);

/* ---- the machine ---- */
/* What the device of a backend can do, measured on the spot (bench figures set speeds against
 * these). Units: GB/s are 1e9 bytes per second; one multiply-add is two operations. */
typedef struct cn_backend_limits {
    double mem_gbs;        /* CN_LIMIT_MEM: streaming read of device memory, best of a few passes */
    double peak_gops;      /* CN_LIMIT_PEAK: the prefill GEMM's dense peak on large square inputs */
    const char *peak_what; /* what peak_gops timed (static string) */
    double h2d_gbs;        /* CN_LIMIT_LINK: pinned host memory -> device */
    double d2h_gbs;        /* CN_LIMIT_LINK: device -> pinned host memory */
} cn_backend_limits;
enum { CN_LIMIT_MEM = 1, CN_LIMIT_PEAK = 2, CN_LIMIT_LINK = 4 };
/* Measures the `what` bits into *out (other fields 0); takes a second or less and needs a few GiB
 * of free device memory. CN_EUNSUPPORTED for a backend that computes in host memory (the CPU:
 * the caller probes the host itself); CN_ENOMEM when the buffers do not fit. Not inside a step. */
int cn_backend_measure(cn_backend *b, int what, cn_backend_limits *out);

/* ---- ops ---- */
/* y[T,N] = x[T,K] W[N,K]^T */
int cn_op_matmul(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x);
/* Gathered expert matmul. ids:[T,k] I32 names experts w[0..n_w). For row r = t*k + j:
 * y[r] = xr W[ids[t,j]]^T where xr = x[t] if x has T rows, x[r] if it has T*k rows. y:[T*k, N]. */
int cn_op_matmul_gather(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                        const cn_tensor *x, const cn_tensor *ids);
/* y[T,H] = table[ids[t]] converted to F32 (embedding lookup). ids:[T] I32. */
int cn_op_get_rows(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids);
/* y = x / sqrt(mean(x^2) + eps) * w, per row. y may alias x. */
int cn_op_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps);
/* y = groupRMSNorm(x * silu(z)) * w with groups of `group` columns. y may alias x. */
int cn_op_gated_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                        const cn_tensor *w, int group, float eps);
/* Causal depthwise conv over time:
 * y[t,c] = act(bias[c] + sum_k w[c,k] * in[t-K+1+k, c]), where in[<0] comes from state and act
 * is silu when `silu` is set (the bits of cn_op_silu on the sum: Mamba's activation without a
 * second pass), else none. w:[C,K], bias:[C], state:[K-1, C] (oldest first) holds the raw inputs
 * before x[0]; on return it holds the last K-1 raw inputs (of state ++ x). */
int cn_op_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                 const cn_tensor *bias, int silu, cn_tensor *state);
/* Mamba2 selective scan over T >= 1 tokens from `state` ([H, P*N] F32), which is updated to the
 * state after the last token. x:[T,H*P], dt:[T,H] raw (before dt_bias/softplus), B,C:[T,G*N].
 * y:[T,H*P] = scan output + D * x. */
int cn_op_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                   const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state);
/* Recurrent-state captures inside one conv1d or scan call (cn_op_conv1d_caps,
 * cn_op_ssm_scan_caps): states[i], shaped like the op's state, receives the state after the
 * call's first rows[i] rows, 0 < rows[0] < rows[1] < ... <= T. A restore point inside a verify or
 * a prefill piece then costs no second call over the rows after it and no copy of the live state. */
typedef struct cn_state_caps {
    int n;                    /* captures; 0 is the plain op */
    const int *rows;          /* [n] */
    cn_tensor *const *states; /* [n] */
} cn_state_caps;
/* cn_op_conv1d, also writing each capture's conv state (its last K-1 raw inputs). (optional in a
 * backend, with cn_op_ssm_scan_caps: CN_EUNSUPPORTED where it lacks them, see
 * cn_backend_has_state_caps; the caller then cuts the call at the captures.) */
int cn_op_conv1d_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                      const cn_tensor *bias, int silu, cn_tensor *state, const cn_state_caps *caps);
/* cn_op_ssm_scan, also writing each capture's SSM state; the same outputs, bit for bit, as the
 * scan cut into calls that end at the captures. (optional, as cn_op_conv1d_caps) */
int cn_op_ssm_scan_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                        const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                        cn_tensor *state, const cn_state_caps *caps);
/* 1 if the backend implements cn_op_conv1d_caps and cn_op_ssm_scan_caps. */
int cn_backend_has_state_caps(const cn_backend *b);
/* cn_op_ssm_scan starting from `from` (shaped like state, another buffer), which is left as it
 * was; `state` receives the state after the last token, the same bits as copying `from` into it
 * and scanning there. A verify then keeps the state it started from without a copy of it
 * (model.h cn_replay). (optional: CN_EUNSUPPORTED where cn_backend_has_ssm_scan_from is 0) */
int cn_op_ssm_scan_from(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                        const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                        cn_tensor *state, const cn_tensor *from);
int cn_backend_has_ssm_scan_from(const cn_backend *b);
/* Same contract for exactly one token (a decode step); backends may specialise it. */
int cn_op_ssm_step(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                   const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state);
/* Causal GQA attention, no positional encoding. q:[T, Hq*Dh]; kc, vc:[S, Hkv*Dh] hold the keys and
 * values of positions 0..n_past+T-1 (the caller wrote rows n_past.. first). Query t sits at
 * position n_past+t and attends positions 0..n_past+t; query head h reads kv head h/(Hq/Hkv).
 * out:[T, Hq*Dh]. scale is usually 1/sqrt(Dh). */
int cn_op_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                    const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale);
/* (n_past is a position argument: steps, (d).) */
/* Sliding-window causal GQA attention over a ring of the last W positions. ring_k, ring_v:[W,
 * Hkv*Dh] hold position p < n_past at row p % W (positions n_past-W..n_past-1 must be there);
 * k_new, v_new:[T, Hkv*Dh] hold positions n_past..n_past+T-1. Query t sits at position
 * p = n_past+t and attends positions max(0, p-W+1)..p (W keys, itself included). The ring is
 * only read: the caller writes the new rows into it afterwards. Other conventions as
 * cn_op_attention. (optional in a backend: CN_EUNSUPPORTED where it lacks the op, see
 * cn_backend_has_attention_window.) */
int cn_op_attention_window(cn_backend *b, cn_tensor *out, const cn_tensor *q,
                           const cn_tensor *k_new, const cn_tensor *v_new, const cn_tensor *ring_k,
                           const cn_tensor *ring_v, int n_past, int window, int n_heads,
                           int n_kv_heads, float scale);
/* 1 if the backend implements cn_op_attention_window. */
int cn_backend_has_attention_window(const cn_backend *b);
/* Router: s = sigmoid(logits[T,E]); choose top_k of s + bias (bias may be NULL; group-limited
 * when n_group > 1: keep the topk_group groups with the best sum of their top-2 biased scores);
 * weights are the unbiased s of the chosen, renormalised when norm_topk, times scaling.
 * ids:[T,k] I32, weights:[T,k] F32, ordered by descending biased score. */
int cn_op_moe_route(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                    const cn_tensor *bias, const cn_route_args *a);
/* y[t] = sum_j weights[t,j] * rows[t*k + j]. y:[T,H], rows:[T*k,H], weights:[T,k]. */
int cn_op_moe_combine(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights);
/* dst rows [row, row + src rows) = src (equal dtype and columns): a decode token's K/V row into
 * the cache. Inside a positioned step, row is relative to its position (steps, (d)). */
int cn_op_set_rows(cn_backend *b, cn_tensor *dst, int row, const cn_tensor *src);
/* Greedy pick per row: ids[t] = the column of the largest x[t, :], ties to the lowest column.
 * NaN counts as -inf and +inf as FLT_MAX (the sampler's invariant (1), so the pick equals greedy
 * sampling without penalties); a row with nothing above -inf gives 0. ids:[T] (or [T, 1]) I32,
 * x:[T, N] with N >= 1. Lets a decode bring 4 bytes per token to the host instead of its logits. */
int cn_op_argmax(cn_backend *b, cn_tensor *ids, const cn_tensor *x);
/* 1 if the backend implements cn_op_argmax (optional in a backend: CN_EUNSUPPORTED). */
int cn_backend_has_argmax(const cn_backend *b);
/* What a backend may fuse around a matmul's product, so that a decode token's small products do
 * not each need an elementwise op before or after them (cn_op_matmul_ep, cn_op_matmul_gather_ep):
 * the input normalised on its way in, an epilogue on the output. */
enum {
    CN_EP_RELU2 = 1, /* y = relu(product)^2 */
    CN_EP_ACC = 2,   /* y += product (the residual add); y must not overlap x */
};
typedef struct cn_mm_ep {
    int ep;                   /* CN_EP_*, or 0: y = product */
    const cn_tensor *norm;    /* (optional) [K] F32: x enters as cn_op_rmsnorm(x, norm, eps) */
    const cn_tensor *gate;    /* (optional, with norm; cn_op_matmul_ep only) x's shape: x enters
                               * as cn_op_gated_rmsnorm(x, gate, norm, group, eps) instead */
    int group;                /* with gate: columns per normalised group, dividing K */
    float eps;
    const cn_tensor *weights; /* gather with CN_EP_ACC: routing weights [T, k] F32, else NULL */
} cn_mm_ep;
/* 1 if the backend fuses at all (the two ops below). A backend that does may still refuse a shape
 * it does not fuse (CN_EUNSUPPORTED, nothing written): the caller then runs the plain ops, which
 * give the same result up to rounding order. */
int cn_backend_has_matmul_ep(const cn_backend *b);
/* cn_op_matmul with f applied (f->weights NULL). (optional in a backend: CN_EUNSUPPORTED) */
int cn_op_matmul_ep(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x,
                    const cn_mm_ep *f);
/* cn_op_matmul_gather with f applied. CN_EP_RELU2 (or 0): on each row of y:[T*k, N]. CN_EP_ACC:
 * moe_combine and the residual add fused in, y:[T, N] += sum_j weights[t, j] *
 * (xr W[ids[t, j]]^T), j = 0..k-1 in order. The ids contract of matmul_gather holds (a bad id:
 * CN_EINVAL, nothing written). (optional: CN_EUNSUPPORTED) */
int cn_op_matmul_gather_ep(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                           const cn_tensor *x, const cn_tensor *ids, const cn_mm_ep *f);
/* The router's product and its routing in one: logits = x gate^T with f applied (f->ep 0, and
 * no gate or weights: f->norm only), then cn_op_moe_route of those logits into ids and weights
 * (logits is written too). (optional, and a backend may refuse a shape: CN_EUNSUPPORTED, nothing
 * written; the caller then runs cn_op_matmul_ep and cn_op_moe_route) */
int cn_op_moe_route_ep(cn_backend *b, cn_tensor *ids, cn_tensor *weights, cn_tensor *logits,
                       const cn_tensor *gate, const cn_tensor *x, const cn_mm_ep *f,
                       const cn_tensor *bias, const cn_route_args *a);
/* Elementwise on equal shapes; y may alias an input. */
int cn_op_add(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
int cn_op_mul(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
int cn_op_silu(cn_backend *b, cn_tensor *y, const cn_tensor *x);
int cn_op_relu2(cn_backend *b, cn_tensor *y, const cn_tensor *x); /* relu(x)^2 */
int cn_op_scale(cn_backend *b, cn_tensor *y, const cn_tensor *x, float s);

#endif
