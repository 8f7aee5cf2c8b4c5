/* backend_impl.h - the backend table; only backends and backend.c include this.
 *
 * A backend is {iface, ctx}. Members marked (optional) may be NULL; the wrapper in backend.c then
 * supplies the default named in the comment. Wrappers check shapes before calling, so a member may
 * assume shapes fit and only reject dtypes it lacks (CN_EUNSUPPORTED).
 */
#ifndef CN_BACKEND_IMPL_H
#define CN_BACKEND_IMPL_H

#include "tensor/backend.h"

typedef struct cn_backend_iface {
    const char *name;
    void (*free)(cn_backend *b); /* frees ctx and b */

    int (*alloc)(cn_backend *b, cn_tensor *t);
    void (*release)(cn_backend *b, cn_tensor *t);
    int (*upload)(cn_backend *b, cn_tensor *dst, uint64_t offset, const void *host, uint64_t n);
    int (*download)(cn_backend *b, void *host, const cn_tensor *src);
    int (*copy)(cn_backend *b, cn_tensor *dst, const cn_tensor *src);
    int (*weight)(cn_backend *b, cn_tensor *w);        /* (optional) default: nothing to do */
    int (*sync)(cn_backend *b);                        /* (optional) default: no-op */
    int (*supports_weight)(const cn_backend *b, cn_dtype dtype);
    int (*step_begin)(cn_backend *b, int key);         /* (optional) default: no-op */
    int (*step_end)(cn_backend *b, int run);           /* (optional) default: no-op */
    int (*set_record)(cn_backend *b, int on);          /* (optional) default: accepted, no-op */
    int (*measure)(cn_backend *b, int what, cn_backend_limits *out); /* (optional) default:
                                                                       CN_EUNSUPPORTED */

    int (*matmul)(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x);
    int (*matmul_gather)(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                         const cn_tensor *x, const cn_tensor *ids);
    int (*get_rows)(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids);
    int (*rmsnorm)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps);
    int (*gated_rmsnorm)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                         const cn_tensor *w, int group, float eps);
    int (*conv1d)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                  const cn_tensor *bias, int silu, cn_tensor *state);
    int (*ssm_scan)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                    const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state);
    int (*ssm_step)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                    const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                    cn_tensor *state); /* (optional) default: ssm_scan */
    int (*attention)(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                     const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale);
    int (*moe_route)(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                     const cn_tensor *bias, const cn_route_args *a);
    int (*moe_combine)(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights);
    int (*add)(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
    int (*mul)(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
    int (*silu)(cn_backend *b, cn_tensor *y, const cn_tensor *x);
    int (*relu2)(cn_backend *b, cn_tensor *y, const cn_tensor *x);
    int (*scale)(cn_backend *b, cn_tensor *y, const cn_tensor *x, float s);
    /* Members added later sit here, after every member a positional initializer names. */
    int (*attention_window)(cn_backend *b, cn_tensor *out, const cn_tensor *q,
                            const cn_tensor *k_new, const cn_tensor *v_new,
                            const cn_tensor *ring_k, const cn_tensor *ring_v, int n_past,
                            int window, int n_heads, int n_kv_heads,
                            float scale); /* (optional) default: CN_EUNSUPPORTED */
    /* Snapshot buffers and the copy stream (backend.h). All (optional), and given together or
     * not at all; the defaults are those of a backend computing in host memory. */
    int (*buf_alloc)(cn_backend *b, int kind, uint64_t n, void **out); /* default: malloc */
    void (*buf_free)(cn_backend *b, int kind, void *p);                 /* default: free */
    int (*copy_async)(cn_backend *b, void *dst, const void *src, uint64_t n, int dir,
                      uint64_t *fence);               /* default: memcpy, fence 0 */
    int (*fence_done)(cn_backend *b, uint64_t fence); /* default: 1 */
    int (*fence_wait)(cn_backend *b, uint64_t fence, int host); /* default: CN_OK */
    /* Positioned steps (backend.h (d)), (optional): default begin_at is step_begin returning 0
     * (the ops are always issued), default set_rows is copy into the rows' view. */
    int (*step_begin_at)(cn_backend *b, int key, uint64_t tag, int pos);
    int (*set_rows)(cn_backend *b, cn_tensor *dst, int row, const cn_tensor *src);
    int (*argmax)(cn_backend *b, cn_tensor *ids, const cn_tensor *x);
    /* Fused epilogues (backend.h), (optional: matmul_ep and matmul_gather_ep together or not at
     * all, moe_route_ep with them or not): default CN_EUNSUPPORTED. */
    int (*matmul_ep)(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x,
                     const cn_mm_ep *f);
    int (*matmul_gather_ep)(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                            const cn_tensor *x, const cn_tensor *ids, const cn_mm_ep *f);
    int (*moe_route_ep)(cn_backend *b, cn_tensor *ids, cn_tensor *weights, cn_tensor *logits,
                        const cn_tensor *gate, const cn_tensor *x, const cn_mm_ep *f,
                        const cn_tensor *bias, const cn_route_args *a);
    /* Captures inside one call (backend.h cn_state_caps), (optional, together or not at all):
     * default CN_EUNSUPPORTED. */
    int (*conv1d_caps)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
                       const cn_tensor *bias, int silu, cn_tensor *state,
                       const cn_state_caps *caps);
    int (*ssm_scan_caps)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                         const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                         cn_tensor *state, const cn_state_caps *caps);
    /* The scan starting from another state (backend.h cn_op_ssm_scan_from), (optional):
     * default CN_EUNSUPPORTED. */
    int (*ssm_scan_from)(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                         const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a,
                         cn_tensor *state, const cn_tensor *from);
    /* Lanes (backend.h): CN_LANE_FORK, CN_LANE_BACK or CN_LANE_JOIN, (optional): default
     * CN_OK, every op in order. */
    int (*lane)(cn_backend *b, int what);
    /* Bytes free and in all of the memory alloc draws from (backend.h cn_backend_memory),
     * (optional): default the host's (base/meminfo.h). */
    int (*memory)(cn_backend *b, uint64_t *free_bytes, uint64_t *total_bytes);
} cn_backend_iface;

struct cn_backend {
    const cn_backend_iface *iface;
    void *ctx; /* the backend's own state */
};

#endif
