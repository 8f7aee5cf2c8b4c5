/* backend.c - wrappers over the backend table: shape checks, then dispatch; see backend.h. */
#include "tensor/backend_impl.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/meminfo.h"

#define ROWS(t) ((t)->shape[0])
#define COLS(t) ((t)->shape[1])

static int is2d_f32(const cn_tensor *t) { return t && t->ndim == 2 && t->dtype == CN_F32; }
static int is_vec_f32(const cn_tensor *t, int64_t n) {
    return t && t->dtype == CN_F32 && cn_tensor_nelem(t) == n;
}
static int same2d(const cn_tensor *a, const cn_tensor *c) {
    return ROWS(a) == ROWS(c) && COLS(a) == COLS(c);
}

/* Block-scaled weights must carry scales of their block shape (tensor.h (3)). */
static int weight_ok(const cn_tensor *w) {
    if (w->ndim != 2) return 0;
    int64_t blk = w->dtype == CN_NVFP4 ? 16 : w->dtype == CN_MXFP8 ? 32 : 0;
    if (!blk) return 1;
    const cn_tensor *s = w->block_scale;
    cn_dtype want = w->dtype == CN_NVFP4 ? CN_F8_E4M3 : CN_F8_E8M0;
    if (w->shape[1] % blk || !s || s->ndim != 2 || (s->dtype != want && s->dtype != CN_U8))
        return 0;
    return s->shape[0] == w->shape[0] && s->shape[1] == w->shape[1] / blk;
}

const char *cn_backend_name(const cn_backend *b) { return b->iface->name; }

void cn_backend_free(cn_backend *b) {
    if (b) b->iface->free(b);
}

int cn_backend_alloc(cn_backend *b, cn_tensor *t) { return b->iface->alloc(b, t); }

void cn_backend_release(cn_backend *b, cn_tensor *t) {
    if (t && t->data) b->iface->release(b, t);
    if (t) t->data = NULL;
}

int cn_backend_upload(cn_backend *b, cn_tensor *dst, uint64_t offset, const void *host, uint64_t n) {
    if (offset + n > cn_tensor_nbytes(dst)) return CN_EINVAL;
    return b->iface->upload(b, dst, offset, host, n);
}

int cn_backend_download(cn_backend *b, void *host, const cn_tensor *src) {
    return b->iface->download(b, host, src);
}

int cn_backend_copy(cn_backend *b, cn_tensor *dst, const cn_tensor *src) {
    if (dst->ndim != 2 || src->ndim != 2 || !same2d(dst, src)) return CN_EINVAL;
    return b->iface->copy(b, dst, src);
}

int cn_backend_weight(cn_backend *b, cn_tensor *w) {
    if (!b->iface->weight) return CN_OK;
    return b->iface->weight(b, w);
}

int cn_backend_sync(cn_backend *b) {
    if (!b->iface->sync) return CN_OK;
    return b->iface->sync(b);
}

int cn_backend_supports_weight(const cn_backend *b, cn_dtype dtype) {
    return b->iface->supports_weight(b, dtype);
}

int cn_backend_step_begin(cn_backend *b, int key) {
    if (!b->iface->step_begin) return CN_OK;
    return b->iface->step_begin(b, key);
}

int cn_backend_step_begin_at(cn_backend *b, int key, uint64_t tag, int pos) {
    if (pos < 0) return CN_EINVAL;
    if (!b->iface->step_begin_at) return cn_backend_step_begin(b, key);
    return b->iface->step_begin_at(b, key, tag, pos);
}

int cn_backend_step_end(cn_backend *b, int run) {
    if (!b->iface->step_end) return CN_OK;
    return b->iface->step_end(b, run);
}

int cn_backend_set_record(cn_backend *b, int on) {
    if (!b->iface->set_record) return CN_OK;
    return b->iface->set_record(b, on != 0);
}

static int lane(cn_backend *b, int what) {
    return b->iface->lane ? b->iface->lane(b, what) : CN_OK;
}
int cn_backend_fork(cn_backend *b) { return lane(b, CN_LANE_FORK); }
int cn_backend_back(cn_backend *b) { return lane(b, CN_LANE_BACK); }
int cn_backend_join(cn_backend *b) { return lane(b, CN_LANE_JOIN); }

int cn_backend_memory(cn_backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    if (!b->iface->memory) return cn_host_memory(free_bytes, total_bytes);
    int rc = b->iface->memory(b, free_bytes, total_bytes);
    if (rc) *free_bytes = *total_bytes = 0;
    return rc;
}

int cn_backend_measure(cn_backend *b, int what, cn_backend_limits *out) {
    cn_backend_limits zero = {0};
    *out = zero;
    if (!b->iface->measure) return CN_EUNSUPPORTED;
    return b->iface->measure(b, what, out);
}

/* ---- snapshot buffers and the copy stream ---- */

int cn_backend_has_device_memory(const cn_backend *b) { return b->iface->buf_alloc != NULL; }

int cn_backend_buf_alloc(cn_backend *b, int kind, uint64_t n, void **out) {
    if (kind != CN_BUF_DEVICE && kind != CN_BUF_HOST) return CN_EINVAL;
    if (b->iface->buf_alloc) return b->iface->buf_alloc(b, kind, n, out);
    void *p = malloc(n ? (size_t)n : 1);
    if (!p) return CN_ENOMEM;
    *out = p;
    return CN_OK;
}

void cn_backend_buf_free(cn_backend *b, int kind, void *p) {
    if (!p) return;
    if (b->iface->buf_free) b->iface->buf_free(b, kind, p);
    else free(p);
}

int cn_backend_copy_async(cn_backend *b, void *dst, const void *src, uint64_t n, int dir,
                          uint64_t *fence) {
    *fence = 0;
    if (dir != CN_COPY_D2H && dir != CN_COPY_H2D) return CN_EINVAL;
    if (b->iface->copy_async) return b->iface->copy_async(b, dst, src, n, dir, fence);
    if (n) memmove(dst, src, (size_t)n);
    return CN_OK;
}

int cn_backend_fence_done(cn_backend *b, uint64_t fence) {
    if (!fence || !b->iface->fence_done) return 1;
    return b->iface->fence_done(b, fence);
}

int cn_backend_fence_wait(cn_backend *b, uint64_t fence, int host) {
    if (!fence || !b->iface->fence_wait) return CN_OK;
    return b->iface->fence_wait(b, fence, host);
}

int cn_op_matmul(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    if (!is2d_f32(y) || !is2d_f32(x) || !weight_ok(w)) return CN_EINVAL;
    if (COLS(x) != w->shape[1] || ROWS(y) != ROWS(x) || COLS(y) != w->shape[0]) return CN_EINVAL;
    if (!b->iface->supports_weight(b, w->dtype)) return CN_EUNSUPPORTED;
    return b->iface->matmul(b, y, w, x);
}

int cn_op_matmul_gather(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                        const cn_tensor *x, const cn_tensor *ids) {
    if (!is2d_f32(y) || !is2d_f32(x) || n_w <= 0 || !ids || ids->dtype != CN_I32 || ids->ndim != 2)
        return CN_EINVAL;
    int64_t rows = ROWS(ids) * COLS(ids);
    if (ROWS(y) != rows || (ROWS(x) != ROWS(ids) && ROWS(x) != rows)) return CN_EINVAL;
    for (int e = 0; e < n_w; e++) {
        if (!weight_ok(w[e]) || w[e]->shape[1] != COLS(x) || w[e]->shape[0] != COLS(y))
            return CN_EINVAL;
        if (!b->iface->supports_weight(b, w[e]->dtype)) return CN_EUNSUPPORTED;
    }
    return b->iface->matmul_gather(b, y, w, n_w, x, ids);
}

/* Byte span [lo, hi) a 2D tensor's rows cover. */
static void span2d(const cn_tensor *t, const char **lo, const char **hi) {
    *lo = (const char *)t->data;
    *hi = *lo + (ROWS(t) > 0 ? (ROWS(t) - 1) * t->stride[0] : 0) +
          COLS(t) * (int64_t)cn_dtype_size(t->dtype);
}

static int overlap2d(const cn_tensor *a, const cn_tensor *c) {
    const char *a0, *a1, *c0, *c1;
    span2d(a, &a0, &a1);
    span2d(c, &c0, &c1);
    return a0 < c1 && c0 < a1;
}

int cn_backend_has_matmul_ep(const cn_backend *b) { return b->iface->matmul_ep != NULL; }

/* The parts of f every fused matmul checks: a known epilogue, a norm of x's width. */
static int ep_ok(const cn_mm_ep *f, const cn_tensor *x) {
    if (!f || (f->ep != 0 && f->ep != CN_EP_RELU2 && f->ep != CN_EP_ACC)) return 0;
    if (f->gate && (!f->norm || !is2d_f32(f->gate) || !same2d(f->gate, x) || f->group <= 0 ||
                    COLS(x) % f->group))
        return 0;
    return !f->norm || is_vec_f32(f->norm, COLS(x));
}

int cn_op_matmul_ep(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x,
                    const cn_mm_ep *f) {
    if (!is2d_f32(y) || !is2d_f32(x) || !weight_ok(w) || !ep_ok(f, x) || f->weights)
        return CN_EINVAL;
    if (COLS(x) != w->shape[1] || ROWS(y) != ROWS(x) || COLS(y) != w->shape[0]) return CN_EINVAL;
    if (f->ep == CN_EP_ACC && overlap2d(y, x)) return CN_EINVAL;
    if (!b->iface->supports_weight(b, w->dtype)) return CN_EUNSUPPORTED;
    if (!b->iface->matmul_ep) return CN_EUNSUPPORTED;
    return b->iface->matmul_ep(b, y, w, x, f);
}

int cn_op_matmul_gather_ep(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                           const cn_tensor *x, const cn_tensor *ids, const cn_mm_ep *f) {
    if (!is2d_f32(y) || !is2d_f32(x) || n_w <= 0 || !ids || ids->dtype != CN_I32 ||
        ids->ndim != 2 || !ep_ok(f, x) || f->gate)
        return CN_EINVAL;
    int64_t rows = ROWS(ids) * COLS(ids);
    if (ROWS(x) != ROWS(ids) && ROWS(x) != rows) return CN_EINVAL;
    if (f->ep != CN_EP_ACC) {
        if (ROWS(y) != rows || f->weights) return CN_EINVAL;
    } else {
        const cn_tensor *rw = f->weights;
        if (ROWS(y) != ROWS(ids) || !is2d_f32(rw) || ROWS(rw) != ROWS(ids) ||
            COLS(rw) != COLS(ids) || overlap2d(y, x) || overlap2d(y, rw))
            return CN_EINVAL;
    }
    for (int e = 0; e < n_w; e++) {
        if (!weight_ok(w[e]) || w[e]->shape[1] != COLS(x) || w[e]->shape[0] != COLS(y))
            return CN_EINVAL;
        if (!b->iface->supports_weight(b, w[e]->dtype)) return CN_EUNSUPPORTED;
    }
    if (!b->iface->matmul_gather_ep) return CN_EUNSUPPORTED;
    return b->iface->matmul_gather_ep(b, y, w, n_w, x, ids, f);
}

int cn_backend_has_argmax(const cn_backend *b) { return b->iface->argmax != NULL; }

int cn_op_argmax(cn_backend *b, cn_tensor *ids, const cn_tensor *x) {
    if (!is2d_f32(x) || !ids || ids->dtype != CN_I32 || COLS(x) < 1) return CN_EINVAL;
    if (cn_tensor_nelem(ids) != ROWS(x) || (ids->ndim == 2 && COLS(ids) != 1) ||
        !cn_tensor_is_contiguous(ids))
        return CN_EINVAL;
    if (!b->iface->argmax) return CN_EUNSUPPORTED;
    return b->iface->argmax(b, ids, x);
}

int cn_op_get_rows(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids) {
    if (!is2d_f32(y) || !weight_ok(table) || ids->dtype != CN_I32) return CN_EINVAL;
    if (cn_tensor_nelem(ids) != ROWS(y) || COLS(y) != table->shape[1]) return CN_EINVAL;
    if (!b->iface->supports_weight(b, table->dtype)) return CN_EUNSUPPORTED;
    return b->iface->get_rows(b, y, table, ids);
}

int cn_op_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps) {
    if (!is2d_f32(y) || !is2d_f32(x) || !same2d(y, x) || !is_vec_f32(w, COLS(x))) return CN_EINVAL;
    return b->iface->rmsnorm(b, y, x, w, eps);
}

int cn_op_gated_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                        const cn_tensor *w, int group, float eps) {
    if (!is2d_f32(y) || !is2d_f32(x) || !is2d_f32(z) || !same2d(y, x) || !same2d(x, z))
        return CN_EINVAL;
    if (!is_vec_f32(w, COLS(x)) || group <= 0 || COLS(x) % group) return CN_EINVAL;
    return b->iface->gated_rmsnorm(b, y, x, z, w, group, eps);
}

int cn_op_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                 const cn_tensor *bias, int silu, cn_tensor *state) {
    if (!is2d_f32(y) || !is2d_f32(x) || !same2d(y, x) || !is2d_f32(w) || !is2d_f32(state))
        return CN_EINVAL;
    int64_t C = COLS(x), K = COLS(w);
    if (ROWS(w) != C || ROWS(state) != K - 1 || COLS(state) != C) return CN_EINVAL;
    if (bias && !is_vec_f32(bias, C)) return CN_EINVAL;
    return b->iface->conv1d(b, y, x, w, bias, silu != 0, state);
}

static int check_ssm(const cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                     const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                     const cn_tensor *state) {
    if (!is2d_f32(y) || !is2d_f32(x) || !is2d_f32(dt) || !is2d_f32(B) || !is2d_f32(C))
        return CN_EINVAL;
    int64_t T = ROWS(x), H = a->n_heads, P = a->head_dim, G = a->n_groups, N = a->d_state;
    if (H <= 0 || G <= 0 || H % G) return CN_EINVAL;
    if (!same2d(y, x) || COLS(x) != H * P || ROWS(dt) != T || COLS(dt) != H) return CN_EINVAL;
    if (ROWS(B) != T || ROWS(C) != T || COLS(B) != G * N || COLS(C) != G * N) return CN_EINVAL;
    if (!is_vec_f32(a->A_log, H) || !is_vec_f32(a->D, H) || !is_vec_f32(a->dt_bias, H))
        return CN_EINVAL;
    if (!state || state->dtype != CN_F32 || cn_tensor_nelem(state) != H * P * N) return CN_EINVAL;
    return CN_OK;
}

int cn_op_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                   const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state) {
    int rc = check_ssm(y, x, dt, B, C, a, state);
    if (rc) return rc;
    return b->iface->ssm_scan(b, y, x, dt, B, C, a, state);
}

/* The captures fit an op over T rows whose state is `state`: rows increasing in [1, T], each
 * capture state shaped like it. */
static int check_caps(const cn_state_caps *caps, int64_t T, const cn_tensor *state) {
    if (!caps || caps->n < 0 || (caps->n > 0 && (!caps->rows || !caps->states))) return CN_EINVAL;
    for (int i = 0; i < caps->n; i++) {
        const cn_tensor *s = caps->states[i];
        if (caps->rows[i] < 1 || caps->rows[i] > T || (i > 0 && caps->rows[i] <= caps->rows[i - 1]))
            return CN_EINVAL;
        if (!s || s->dtype != CN_F32 || s->ndim != state->ndim || !s->data) return CN_EINVAL;
        for (int d = 0; d < s->ndim; d++)
            if (s->shape[d] != state->shape[d]) return CN_EINVAL;
    }
    return CN_OK;
}

int cn_backend_has_state_caps(const cn_backend *b) {
    return b->iface->conv1d_caps != NULL && b->iface->ssm_scan_caps != NULL;
}

int cn_op_conv1d_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                      const cn_tensor *bias, int silu, cn_tensor *state,
                      const cn_state_caps *caps) {
    if (!is2d_f32(y) || !is2d_f32(x) || !same2d(y, x) || !is2d_f32(w) || !is2d_f32(state))
        return CN_EINVAL;
    int64_t C = COLS(x), K = COLS(w);
    if (ROWS(w) != C || ROWS(state) != K - 1 || COLS(state) != C) return CN_EINVAL;
    if (bias && !is_vec_f32(bias, C)) return CN_EINVAL;
    int rc = check_caps(caps, ROWS(x), state);
    if (rc) return rc;
    if (!cn_backend_has_state_caps(b)) return CN_EUNSUPPORTED;
    return b->iface->conv1d_caps(b, y, x, w, bias, silu != 0, state, caps);
}

int cn_op_ssm_scan_caps(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                        const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                        cn_tensor *state, const cn_state_caps *caps) {
    int rc = check_ssm(y, x, dt, B, C, a, state);
    if (!rc) rc = check_caps(caps, ROWS(x), state);
    if (rc) return rc;
    if (!cn_backend_has_state_caps(b)) return CN_EUNSUPPORTED;
    return b->iface->ssm_scan_caps(b, y, x, dt, B, C, a, state, caps);
}

int cn_backend_has_ssm_scan_from(const cn_backend *b) { return b->iface->ssm_scan_from != NULL; }

int cn_op_ssm_scan_from(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                        const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                        cn_tensor *state, const cn_tensor *from) {
    int rc = check_ssm(y, x, dt, B, C, a, state);
    if (rc) return rc;
    if (!from || from->dtype != state->dtype || from->ndim != state->ndim || !from->data ||
        from->data == state->data)
        return CN_EINVAL;
    for (int d = 0; d < from->ndim; d++)
        if (from->shape[d] != state->shape[d]) return CN_EINVAL;
    if (!b->iface->ssm_scan_from) return CN_EUNSUPPORTED;
    return b->iface->ssm_scan_from(b, y, x, dt, B, C, a, state, from);
}

int cn_op_ssm_step(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                   const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state) {
    int rc = check_ssm(y, x, dt, B, C, a, state);
    if (rc) return rc;
    if (ROWS(x) != 1) return CN_EINVAL;
    if (!b->iface->ssm_step) return b->iface->ssm_scan(b, y, x, dt, B, C, a, state);
    return b->iface->ssm_step(b, y, x, dt, B, C, a, state);
}

int cn_op_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                    const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale) {
    if (!is2d_f32(out) || !is2d_f32(q) || !same2d(out, q) || kc->ndim != 2 || vc->ndim != 2)
        return CN_EINVAL;
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || COLS(q) % n_heads)
        return CN_EINVAL;
    int64_t dh = COLS(q) / n_heads;
    if (COLS(kc) != n_kv_heads * dh || !same2d(kc, vc) || n_past < 0) return CN_EINVAL;
    if (n_past + ROWS(q) > ROWS(kc)) return CN_EINVAL;
    return b->iface->attention(b, out, q, kc, vc, n_past, n_heads, n_kv_heads, scale);
}

int cn_op_set_rows(cn_backend *b, cn_tensor *dst, int row, const cn_tensor *src) {
    if (dst->ndim != 2 || src->ndim != 2 || dst->dtype != src->dtype || COLS(dst) != COLS(src))
        return CN_EINVAL;
    if (row < 0 || row + ROWS(src) > ROWS(dst)) return CN_EINVAL;
    if (b->iface->set_rows) return b->iface->set_rows(b, dst, row, src);
    cn_tensor view = cn_tensor_rows(dst, row, ROWS(src));
    return b->iface->copy(b, &view, src);
}

int cn_op_attention_window(cn_backend *b, cn_tensor *out, const cn_tensor *q,
                           const cn_tensor *k_new, const cn_tensor *v_new, const cn_tensor *ring_k,
                           const cn_tensor *ring_v, int n_past, int window, int n_heads,
                           int n_kv_heads, float scale) {
    if (!is2d_f32(out) || !is2d_f32(q) || !same2d(out, q) || !is2d_f32(k_new) || !is2d_f32(v_new) ||
        ring_k->ndim != 2 || ring_v->ndim != 2)
        return CN_EINVAL;
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || COLS(q) % n_heads)
        return CN_EINVAL;
    int64_t dh = COLS(q) / n_heads;
    if (COLS(k_new) != n_kv_heads * dh || !same2d(k_new, v_new) || ROWS(k_new) != ROWS(q))
        return CN_EINVAL;
    if (COLS(ring_k) != n_kv_heads * dh || !same2d(ring_k, ring_v) || ROWS(ring_k) != window ||
        window <= 0 || n_past < 0)
        return CN_EINVAL;
    if (!b->iface->attention_window) return CN_EUNSUPPORTED;
    return b->iface->attention_window(b, out, q, k_new, v_new, ring_k, ring_v, n_past, window,
                                      n_heads, n_kv_heads, scale);
}

int cn_backend_has_attention_window(const cn_backend *b) { return b->iface->attention_window != NULL; }

/* moe_route's arguments (and moe_route_ep's after its product). */
static int route_ok(const cn_tensor *ids, const cn_tensor *weights, const cn_tensor *logits,
                    const cn_tensor *bias, const cn_route_args *a) {
    if (!is2d_f32(logits) || !is2d_f32(weights) || ids->dtype != CN_I32 || ids->ndim != 2)
        return 0;
    int64_t T = ROWS(logits), E = COLS(logits);
    if (a->top_k <= 0 || a->top_k > E || ROWS(ids) != T || COLS(ids) != a->top_k ||
        !same2d(ids, weights))
        return 0;
    if (a->n_group > 1 && (E % a->n_group || a->topk_group <= 0 || a->topk_group > a->n_group))
        return 0;
    return !bias || is_vec_f32(bias, E);
}

int cn_op_moe_route(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                    const cn_tensor *bias, const cn_route_args *a) {
    if (!route_ok(ids, weights, logits, bias, a)) return CN_EINVAL;
    return b->iface->moe_route(b, ids, weights, logits, bias, a);
}

int cn_op_moe_route_ep(cn_backend *b, cn_tensor *ids, cn_tensor *weights, cn_tensor *logits,
                       const cn_tensor *gate, const cn_tensor *x, const cn_mm_ep *f,
                       const cn_tensor *bias, const cn_route_args *a) {
    if (!route_ok(ids, weights, logits, bias, a) || !is2d_f32(x) || !weight_ok(gate) ||
        !ep_ok(f, x) || f->ep || f->gate || f->weights)
        return CN_EINVAL;
    if (COLS(x) != gate->shape[1] || ROWS(logits) != ROWS(x) || COLS(logits) != gate->shape[0] ||
        overlap2d(logits, x))
        return CN_EINVAL;
    if (!b->iface->supports_weight(b, gate->dtype) || !b->iface->moe_route_ep)
        return CN_EUNSUPPORTED;
    return b->iface->moe_route_ep(b, ids, weights, logits, gate, x, f, bias, a);
}

int cn_op_moe_combine(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights) {
    if (!is2d_f32(y) || !is2d_f32(rows) || !is2d_f32(weights)) return CN_EINVAL;
    if (ROWS(weights) != ROWS(y) || ROWS(rows) != ROWS(y) * COLS(weights) || COLS(rows) != COLS(y))
        return CN_EINVAL;
    return b->iface->moe_combine(b, y, rows, weights);
}

int cn_op_add(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c) {
    if (!is2d_f32(y) || !is2d_f32(a) || !is2d_f32(c) || !same2d(y, a) || !same2d(a, c))
        return CN_EINVAL;
    return b->iface->add(b, y, a, c);
}

int cn_op_mul(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c) {
    if (!is2d_f32(y) || !is2d_f32(a) || !is2d_f32(c) || !same2d(y, a) || !same2d(a, c))
        return CN_EINVAL;
    return b->iface->mul(b, y, a, c);
}

int cn_op_silu(cn_backend *b, cn_tensor *y, const cn_tensor *x) {
    if (!is2d_f32(y) || !is2d_f32(x) || !same2d(y, x)) return CN_EINVAL;
    return b->iface->silu(b, y, x);
}

int cn_op_relu2(cn_backend *b, cn_tensor *y, const cn_tensor *x) {
    if (!is2d_f32(y) || !is2d_f32(x) || !same2d(y, x)) return CN_EINVAL;
    return b->iface->relu2(b, y, x);
}

int cn_op_scale(cn_backend *b, cn_tensor *y, const cn_tensor *x, float s) {
    if (!is2d_f32(y) || !is2d_f32(x) || !same2d(y, x)) return CN_EINVAL;
    return b->iface->scale(b, y, x, s);
}
