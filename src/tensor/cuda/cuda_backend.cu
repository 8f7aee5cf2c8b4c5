/* cuda_backend.cu - creation of the CUDA backend, its memory (cudaMalloc), transfers, weight
 * uploads and the iface table; the ops live in the other cuda_*.cu files.
 *
 * Promises: transfers to and from the host complete before they return (the host buffer may be
 * reused at once); copies and ops between device tensors are queued on the one stream, in order.
 * cuBLAS runs on that stream in CUBLAS_DEFAULT_MATH with TF32 refused (CUBLAS_PEDANTIC_MATH is not
 * needed: default math never uses TF32 for fp32 GEMMs unless asked), so fp32 GEMMs are fp32.
 * Steps (backend.h) are captured from that stream into a CUDA graph per step key; each capture
 * updates the key's executable graph in place (cudaGraphExecUpdate: same kernels, new arguments
 * such as the KV row of this token) and instantiates anew only when the topology changed. A step begun at a position whose graph
 * still fits (same key and tag, the position inside its attention bucket, no memory it uses
 * freed since) is not captured at all: one 4-byte copy of the position and one cudaGraphLaunch,
 * so a decode token costs that and one wait (cuda_impl.h invariant 5).
 */
#include <stdlib.h>
#include <string.h>

#include "tensor/cuda/cuda_impl.h"

int cu_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return CN_OK;
    cn_error("cuda: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? CN_ENOMEM : CN_EIO;
}

int cu_launch_check(const char *what) { return cu_check(cudaGetLastError(), what); }

void cu_free_later(cu_ctx *c, void *p) {
    if (!p) return;
    if (!c->in_step) {
        cudaFree(p); /* waits for work that may still read it */
        return;
    }
    if (c->n_retired == c->cap_retired) {
        int cap = c->cap_retired ? 2 * c->cap_retired : 8;
        void **q = (void **)realloc(c->retired, (size_t)cap * sizeof *q);
        if (!q) { /* leaking beats freeing under recorded work; logged so it is seen */
            cn_error("cuda: out of memory retiring a device buffer inside a step (leaked)");
            return;
        }
        c->retired = q;
        c->cap_retired = cap;
    }
    c->retired[c->n_retired++] = p;
}

/* Frees the retired buffers; the stream must be idle or the step's work queued before a wait. */
static void free_retired(cu_ctx *c) {
    for (int i = 0; i < c->n_retired; i++) cudaFree(c->retired[i]);
    c->n_retired = 0;
}

void *cu_scratch(cu_ctx *c, size_t bytes) {
    const int l = c->lane;
    if (bytes <= c->scratch_cap[l]) return c->scratch[l];
    size_t cap = c->scratch_cap[l] ? c->scratch_cap[l] : (1u << 20);
    while (cap < bytes) cap *= 2;
    void *p = NULL;
    /* a capturing stream cannot be waited on: the old buffer is retired instead (invariant 5) */
    if (!c->capturing && cu_check(cudaStreamSynchronize(c->stream), "scratch sync")) return NULL;
    if (cu_check(cudaMalloc(&p, cap), "scratch")) return NULL;
    cu_free_later(c, c->scratch[l]);
    c->epoch++; /* graphs that read the old buffer are stale (invariant 5) */
    c->scratch[l] = p;
    c->scratch_cap[l] = cap;
    return p;
}

int cu_flag_reset(cu_ctx *c) {
    if (c->in_step) return CN_OK; /* reset once by step_begin (invariant 5) */
    return cu_check(cudaMemsetAsync(c->flag_dev, 0, sizeof(int), c->stream), "flag reset");
}

int cu_flag_read(cu_ctx *c, int *flag) {
    if (c->in_step) { /* read once by step_end */
        *flag = 0;
        return CN_OK;
    }
    int rc = cu_check(cudaMemcpyAsync(c->flag_host, c->flag_dev, sizeof(int),
                                      cudaMemcpyDeviceToHost, c->stream), "flag read");
    if (!rc) rc = cu_check(cudaStreamSynchronize(c->stream), "flag sync");
    *flag = rc ? 0 : *c->flag_host;
    return rc;
}

/* ---- iface: lifetime and memory ---- */

static void cu_free(cn_backend *b) {
    cu_ctx *c = cu_ctx_of(b);
    c->stream = c->lanes[0]; /* left on the side lane: back to the stream a capture began on */
    if (c->lanes[1]) cudaStreamSynchronize(c->lanes[1]);
    if (c->capturing) { /* a step left open: end the capture so the stream can be destroyed */
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        c->capturing = 0;
    }
    c->in_step = 0;
    if (c->stream) cudaStreamSynchronize(c->stream);
    cu_copy_free(c); /* after the ops: a queued free of a snapshot buffer may wait on them */
    free_retired(c);
    free(c->retired);
    for (int i = 0; i < CU_GRAPH_SLOTS; i++) {
        if (c->slots[i].exec) cudaGraphExecDestroy(c->slots[i].exec);
        free(c->slots[i].shape);
    }
    for (int i = 0; i < c->n_weights; i++) cudaFree(c->weights[i]);
    for (int i = 0; i < c->n_tabs; i++) {
        cudaFree(c->tabs[i].dev);
        free(c->tabs[i].host_ptrs);
    }
    free(c->tabs);
    free(c->weights);
    cudaFree(c->scratch[0]);
    cudaFree(c->scratch[1]);
    if (c->ev_fork) cudaEventDestroy(c->ev_fork);
    if (c->ev_join) cudaEventDestroy(c->ev_join);
    if (c->lanes[1]) cudaStreamDestroy(c->lanes[1]);
    cudaFree(c->flag_dev);
    if (c->flag_host) cudaFreeHost(c->flag_host);
    cudaFree(c->par_dev);
    cudaFree(c->ep_cnt);
    cudaFree(c->am_cnt);
    cudaFree(c->rt_cnt);
    if (c->par_host) cudaFreeHost(c->par_host);
    for (int l = 0; l < 2; l++)
        if (c->lane_blas[l]) cublasDestroy(c->lane_blas[l]);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    free(b);
}

static int cu_alloc(cn_backend *b, cn_tensor *t) {
    if (cu_ctx_of(b)->in_step) return CN_EBUSY; /* makes the device current; backend.h (b) */
    if (t->ndim < 1 || t->ndim > CN_MAX_DIMS || cn_dtype_size(t->dtype) == 0) return CN_EINVAL;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0) return CN_EINVAL;
    cn_tensor fresh;
    cn_tensor_init(&fresh, t->dtype, t->ndim, t->shape, NULL);
    uint64_t n = cn_tensor_nbytes(&fresh);
    void *p = NULL;
    int rc = cu_check(cudaMalloc(&p, n ? n : 256), "alloc");
    if (rc) return rc;
    memcpy(t->stride, fresh.stride, sizeof t->stride);
    t->data = p;
    t->where = CN_DEVICE;
    return CN_OK;
}

static void cu_release(cn_backend *b, cn_tensor *t) {
    cu_ctx *c = cu_ctx_of(b);
    if (t->data) c->epoch++; /* a graph may point into it (invariant 5) */
    cu_free_later(c, t->data); /* inside a step (a misuse): at step_end */
    t->data = NULL;
}

/* What cudaMalloc can still give on this device, beside what this process and others hold. */
static int cu_memory(cn_backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    if (cu_ctx_of(b)->in_step) return CN_EBUSY;
    size_t f = 0, t = 0;
    int rc = cu_check(cudaMemGetInfo(&f, &t), "memory query");
    if (rc) return rc;
    *free_bytes = f;
    *total_bytes = t;
    return CN_OK;
}

static int cu_upload(cn_backend *b, cn_tensor *dst, uint64_t offset, const void *host, uint64_t n) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step) return CN_EBUSY;
    if (!n) return CN_OK;
    int rc = cu_check(cudaMemcpyAsync((char *)dst->data + offset, host, n, cudaMemcpyHostToDevice,
                                      c->stream), "upload");
    if (!rc) rc = cu_check(cudaStreamSynchronize(c->stream), "upload sync");
    return rc;
}

/* Rows and row length in bytes of a tensor seen as 2D; 0 if it cannot be (strided above 2D). */
static int as_rows(const cn_tensor *t, int64_t *rows, int64_t *row_bytes, int64_t *stride) {
    int64_t esz = (int64_t)cn_dtype_size(t->dtype);
    if (esz == 0) return 0;
    if (t->ndim == 2) {
        *rows = t->shape[0];
        *row_bytes = t->shape[1] * esz;
        *stride = t->stride[0];
        return 1;
    }
    if (!cn_tensor_is_contiguous(t)) return 0;
    *rows = 1;
    *row_bytes = (int64_t)cn_tensor_nbytes(t);
    *stride = *row_bytes;
    return 1;
}

static int cu_download(cn_backend *b, void *host, const cn_tensor *src) {
    cu_ctx *c = cu_ctx_of(b);
    int64_t rows, rb, stride;
    if (c->in_step) return CN_EBUSY;
    if (!as_rows(src, &rows, &rb, &stride)) return CN_EINVAL;
    if (rows == 0 || rb == 0) return CN_OK;
    int rc = cu_check(cudaMemcpy2DAsync(host, (size_t)rb, src->data, (size_t)stride, (size_t)rb,
                                        (size_t)rows, cudaMemcpyDeviceToHost, c->stream),
                      "download");
    if (!rc) rc = cu_check(cudaStreamSynchronize(c->stream), "download sync");
    return rc;
}

static int cu_copy(cn_backend *b, cn_tensor *dst, const cn_tensor *src) {
    cu_ctx *c = cu_ctx_of(b);
    const int64_t R = dst->shape[0], C = dst->shape[1];
    if (R == 0 || C == 0) return CN_OK;
    if (dst->dtype == src->dtype) {
        size_t esz = cn_dtype_size(dst->dtype);
        if (esz == 0) return CN_EUNSUPPORTED;
        const size_t rb = (size_t)C * esz;
        /* contiguous rows as one 1D copy: a graph update may change a 1D copy, never a 2D one */
        if (R == 1 || ((size_t)dst->stride[0] == rb && (size_t)src->stride[0] == rb))
            return cu_check(cudaMemcpyAsync(dst->data, src->data, (size_t)R * rb,
                                            cudaMemcpyDeviceToDevice, c->stream),
                            "copy");
        return cu_check(cudaMemcpy2DAsync(dst->data, (size_t)dst->stride[0], src->data,
                                          (size_t)src->stride[0], rb, (size_t)R,
                                          cudaMemcpyDeviceToDevice, c->stream),
                        "copy");
    }
    return cu_convert(b, dst, src);
}

/* NVFP4 and MXFP8 only in the GEMM paths (matmul, matmul_gather); get_rows of a block-scaled
 * table gives CN_EUNSUPPORTED (checkpoints keep embeddings in BF16). */
static int cu_supports_weight(const cn_backend *b, cn_dtype dtype) {
    (void)b;
    return dtype == CN_F32 || dtype == CN_BF16 || dtype == CN_F16 || dtype == CN_F8_E4M3 ||
           dtype == CN_NVFP4 || dtype == CN_MXFP8;
}

/* Uploads a host-mapped tensor once, in its stored dtype, and repoints it at the device copy:
 * weights, and the block scales of NVFP4/MXFP8 ones (uploaded first, by the loader). */
static int cu_weight(cn_backend *b, cn_tensor *w) {
    cu_ctx *c = cu_ctx_of(b);
    if (w->where == CN_DEVICE) return CN_OK;
    if (c->in_step) return CN_EBUSY;
    if (cn_dtype_size(w->dtype) == 0 && w->dtype != CN_NVFP4) return CN_EUNSUPPORTED;
    if (w->block_scale && w->block_scale->where != CN_DEVICE) return CN_EINVAL;
    if (!cn_tensor_is_contiguous(w)) return CN_EINVAL;
    if (c->n_weights == c->cap_weights) {
        int cap = c->cap_weights ? 2 * c->cap_weights : 256;
        void **p = (void **)realloc(c->weights, (size_t)cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        c->weights = p;
        c->cap_weights = cap;
    }
    uint64_t n = cn_tensor_nbytes(w);
    void *d = NULL;
    int rc = cu_check(cudaMalloc(&d, n ? n : 256), "weight alloc");
    if (rc) return rc;
    rc = cu_check(cudaMemcpy(d, w->data, n, cudaMemcpyHostToDevice), "weight upload");
    if (rc) {
        cudaFree(d);
        return rc;
    }
    c->weights[c->n_weights++] = d;
    w->data = d;
    w->where = CN_DEVICE;
    return CN_OK;
}

static int cu_sync(cn_backend *b) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step) return CN_EBUSY;
    int rc = cu_check(cudaStreamSynchronize(c->lanes[1]), "sync side");
    return rc ? rc : cu_check(cudaStreamSynchronize(c->stream), "sync");
}

/* ---- iface: steps (backend.h; cuda_impl.h invariant 5) ---- */

static int cu_step_begin(cn_backend *b, int key) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step || c->forked) return CN_EBUSY;
    if (c->graphs && !(key & CN_STEP_EAGER)) {
        int rc = cu_check(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed),
                          "step capture");
        if (rc) return rc;
        c->capturing = 1;
    }
    /* inside the capture, so that every replay starts with a clean verdict */
    int rc = cu_check(cudaMemsetAsync(c->flag_dev, 0, sizeof(int), c->stream), "step flag");
    if (rc && c->capturing) {
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        c->capturing = 0;
    }
    if (rc) return rc;
    c->in_step = 1;
    c->wrote[0].n = c->wrote[1].n = 0;
    c->step_key = key;
    c->positioned = 0;
    return CN_OK;
}

/* A positioned step (backend.h (d)): the position reaches the device first (the previous step's
 * end waited for the stream, so par_host is free); then the key's graph replays when it fits,
 * else the step opens for ops as step_begin does, recording relative to pos. */
static int cu_step_begin_at(cn_backend *b, int key, uint64_t tag, int pos) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step || c->forked) return CN_EBUSY;
    *c->par_host = pos;
    int rc = cu_check(cudaMemcpyAsync(c->par_dev, c->par_host, sizeof(int),
                                      cudaMemcpyHostToDevice, c->stream), "step position");
    if (rc) return rc;
    if (c->graphs) {
        for (int i = 0; i < CU_GRAPH_SLOTS; i++) {
            cu_graph *s = &c->slots[i];
            if (!s->exec || s->key != key || !s->replayable || s->tag != tag ||
                s->epoch != c->epoch || pos > s->pos_max)
                continue;
            rc = cu_check(cudaGraphLaunch(s->exec, c->stream), "step replay");
            if (rc) return rc;
            s->last_use = c->stats.steps;
            c->stats.replayed++;
            c->in_step = 1;
            c->step_key = key;
            c->positioned = 0; /* nothing is recorded: step_end only waits */
            return 1;
        }
    }
    rc = cu_step_begin(b, key);
    if (rc) return rc;
    c->positioned = 1;
    c->step_pos = pos;
    c->step_tag = tag;
    c->pos_max = INT64_MAX;
    return 0;
}

static int cu_set_record(cn_backend *b, int on) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step) return CN_EBUSY;
    c->graphs = on;
    return CN_OK;
}

/* The slot of `key`, or the least recently used one (its graph destroyed) for a new key. */
static cu_graph *graph_slot(cu_ctx *c, int key) {
    cu_graph *lru = &c->slots[0];
    for (int i = 0; i < CU_GRAPH_SLOTS; i++) {
        cu_graph *s = &c->slots[i];
        if (s->exec && s->key == key) return s;
        if (!s->exec) {
            if (lru->exec) lru = s;
        } else if (lru->exec && s->last_use < lru->last_use) {
            lru = s;
        }
    }
    if (lru->exec) cudaGraphExecDestroy(lru->exec);
    lru->exec = NULL;
    lru->key = key;
    return lru;
}

/* A graph node and its index in cudaGraphGetNodes's order, sorted by handle (graph_shape). */
typedef struct node_at {
    cudaGraphNode_t node;
    uint32_t index;
} node_at;

static int node_at_cmp(const void *x, const void *y) {
    const uintptr_t a = (uintptr_t)((const node_at *)x)->node;
    const uintptr_t b = (uintptr_t)((const node_at *)y)->node;
    return a < b ? -1 : a > b;
}

/* The index of node v in the sorted by[n] (n if absent: never for an edge of the graph). */
static uint32_t node_index(const node_at *by, size_t n, cudaGraphNode_t v) {
    const node_at key = {v, 0};
    const node_at *f = (const node_at *)bsearch(&key, by, n, sizeof *by, node_at_cmp);
    return f ? f->index : (uint32_t)n;
}

/* A graph's shape as cudaGraphExecUpdate judges it: the node count, each node's type (and a copy
 * node's direction and whether it is 1D) and every edge with its type, nodes named by their index
 * in cudaGraphGetNodes's order. Graphs of one shape differ only in what an update takes (kernel
 * arguments, addresses), unless they hold a 2D or 3D copy, which no update may change: then
 * *updatable is 0. An update that fails is an API error compute-sanitizer reports, so a slot
 * attempts none it can tell will fail. *out is malloc'd. */
static int graph_shape(cudaGraph_t g, uint32_t **out, size_t *n_out, int *updatable) {
    size_t n = 0, m = 0;
    int rc = cu_check(cudaGraphGetNodes(g, NULL, &n), "step nodes");
    if (!rc) rc = cu_check(cudaGraphGetEdges(g, NULL, NULL, NULL, &m), "step edges");
    if (rc) return rc;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc((n + 2 * m + 1) * sizeof *nodes);
    cudaGraphEdgeData *data = (cudaGraphEdgeData *)malloc((m + 1) * sizeof *data);
    node_at *by = (node_at *)malloc((n + 1) * sizeof *by);
    uint32_t *sh = (uint32_t *)malloc((2 + n + 4 * m) * sizeof *sh);
    if (!nodes || !data || !by || !sh) {
        free(nodes), free(data), free(by), free(sh);
        return CN_ENOMEM;
    }
    cudaGraphNode_t *from = nodes + n, *to = from + m;
    rc = cu_check(cudaGraphGetNodes(g, nodes, &n), "step nodes");
    if (!rc) rc = cu_check(cudaGraphGetEdges(g, from, to, data, &m), "step edges");
    size_t k = 0;
    *updatable = 1;
    sh[k++] = (uint32_t)n;
    sh[k++] = (uint32_t)m;
    for (size_t i = 0; i < n && !rc; i++) {
        cudaGraphNodeType t;
        rc = cu_check(cudaGraphNodeGetType(nodes[i], &t), "step node type");
        uint32_t v = (uint32_t)t;
        if (!rc && t == cudaGraphNodeTypeMemcpy) {
            cudaMemcpy3DParms p = {};
            rc = cu_check(cudaGraphMemcpyNodeGetParams(nodes[i], &p), "step copy node");
            const int flat = p.extent.height <= 1 && p.extent.depth <= 1;
            v |= (uint32_t)p.kind << 8 | (uint32_t)!flat << 16;
            if (!flat) *updatable = 0;
        }
        sh[k++] = v;
        by[i].node = nodes[i];
        by[i].index = (uint32_t)i;
    }
    if (!rc) qsort(by, n, sizeof *by, node_at_cmp); /* edges name nodes by handle */
    for (size_t e = 0; e < m && !rc; e++) {
        sh[k++] = node_index(by, n, from[e]);
        sh[k++] = node_index(by, n, to[e]);
        sh[k++] = (uint32_t)data[e].type;
        sh[k++] = (uint32_t)data[e].from_port | (uint32_t)data[e].to_port << 8;
    }
    free(nodes);
    free(data);
    free(by);
    if (rc) {
        free(sh);
        return rc;
    }
    *out = sh;
    *n_out = k;
    return CN_OK;
}

/* Runs a captured step: the slot's graph updated in place when the shape is the same and
 * updatable (only kernel arguments and 1D copies' addresses changed: cache rows, positions,
 * scratch), else instantiated anew. */
static int launch_graph(cu_ctx *c, cudaGraph_t g) {
    cu_graph *s = graph_slot(c, c->step_key);
    uint32_t *shape = NULL;
    size_t n_shape = 0;
    int updatable = 0;
    int rc = graph_shape(g, &shape, &n_shape, &updatable);
    if (rc) return rc;
    if (s->exec && (!updatable || s->n_shape != n_shape ||
                    memcmp(s->shape, shape, n_shape * sizeof *shape))) {
        cudaGraphExecDestroy(s->exec); /* no update to attempt */
        s->exec = NULL;
    }
    if (s->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(s->exec, g, &info) == cudaSuccess) {
            c->stats.updated++;
        } else { /* a difference graph_shape missed: instantiate below, and say which */
            (void)cudaGetLastError();
            cudaGraphNodeType t = cudaGraphNodeTypeCount;
            if (info.errorNode) (void)cudaGraphNodeGetType(info.errorNode, &t);
            cn_debug("cuda: step graph update failed (result %d, node type %d); instantiating",
                     (int)info.result, (int)t);
            c->stats.update_failed++;
            cudaGraphExecDestroy(s->exec);
            s->exec = NULL;
        }
    }
    free(s->shape);
    s->shape = shape;
    s->n_shape = n_shape;
    if (!s->exec) {
        rc = cu_check(cudaGraphInstantiate(&s->exec, g, 0), "step instantiate");
        if (rc) {
            s->exec = NULL;
            return rc;
        }
        c->stats.instantiated++;
    }
    s->last_use = c->stats.steps;
    s->replayable = c->positioned;
    s->tag = c->step_tag;
    s->epoch = c->epoch; /* after the capture: a scratch regrown inside it is the one recorded */
    s->pos_max = c->pos_max;
    return cu_check(cudaGraphLaunch(s->exec, c->stream), "step launch");
}

static int cu_lane(cn_backend *b, int what);

static int cu_step_end(cn_backend *b, int run) {
    cu_ctx *c = cu_ctx_of(b);
    if (!c->in_step) return CN_EINVAL;
    int rc = cu_lane(b, CN_LANE_JOIN); /* a capture ends on the stream it began on, joined */
    if (rc) run = 0;
    if (c->capturing) {
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &g);
        c->capturing = 0;
        if (e != cudaSuccess) (void)cudaGetLastError();
        if (run) rc = cu_check(e, "step capture");
        if (run && !rc) rc = launch_graph(c, g);
        if (g) cudaGraphDestroy(g);
    }
    c->in_step = 0;
    c->positioned = 0;
    if (!run) {
        c->stats.discarded++;
        cudaStreamSynchronize(c->stream); /* eager ops already queued may use retired buffers */
        free_retired(c);
        return CN_OK;
    }
    c->stats.steps++;
    int flag = 0;
    if (!rc) rc = cu_flag_read(c, &flag); /* waits for the step */
    else cudaStreamSynchronize(c->stream);
    free_retired(c);
    if (rc) return rc;
    return flag ? CN_EINVAL : CN_OK;
}

/* ---- iface: lanes (backend.h; cuda_impl.h invariant 8) ---- */

/* Makes lane l current: its stream and cuBLAS handle (cu_scratch follows `lane`). */
static void lane_switch(cu_ctx *c, int l) {
    c->wrote[0].n = c->wrote[1].n = 0;
    c->lane = l;
    c->stream = c->lanes[l];
    c->blas = c->lane_blas[l];
}

static int cu_lane(cn_backend *b, int what) {
    cu_ctx *c = cu_ctx_of(b);
    if (what < CN_LANE_FORK || what > CN_LANE_JOIN) return CN_EINVAL;
    if (!c->use_lanes) return CN_OK;
    int rc = CN_OK;
    switch (what) {
    case CN_LANE_FORK:
        if (c->forked) return CN_EBUSY;
        rc = cu_check(cudaEventRecord(c->ev_fork, c->lanes[0]), "fork");
        if (!rc) rc = cu_check(cudaStreamWaitEvent(c->lanes[1], c->ev_fork, 0), "fork wait");
        if (rc) return rc;
        c->forked = 1;
        lane_switch(c, 1);
        return CN_OK;
    case CN_LANE_BACK:
        if (c->forked) lane_switch(c, 0);
        return CN_OK;
    default: /* CN_LANE_JOIN */
        if (!c->forked) return CN_OK;
        rc = cu_check(cudaEventRecord(c->ev_join, c->lanes[1]), "join");
        if (!rc) rc = cu_check(cudaStreamWaitEvent(c->lanes[0], c->ev_join, 0), "join wait");
        c->forked = 0;
        lane_switch(c, 0);
        return rc;
    }
}

static const cn_backend_iface cu_iface = {
    /* .name = */ "cuda",
    /* .free = */ cu_free,
    /* .alloc = */ cu_alloc,
    /* .release = */ cu_release,
    /* .upload = */ cu_upload,
    /* .download = */ cu_download,
    /* .copy = */ cu_copy,
    /* .weight = */ cu_weight,
    /* .sync = */ cu_sync,
    /* .supports_weight = */ cu_supports_weight,
    /* .step_begin = */ cu_step_begin,
    /* .step_end = */ cu_step_end,
    /* .set_record = */ cu_set_record,
    /* .measure = */ cu_measure,
    /* .matmul = */ cu_matmul,
    /* .matmul_gather = */ cu_matmul_gather,
    /* .get_rows = */ cu_get_rows,
    /* .rmsnorm = */ cu_rmsnorm,
    /* .gated_rmsnorm = */ cu_gated_rmsnorm,
    /* .conv1d = */ cu_conv1d,
    /* .ssm_scan = */ cu_ssm_scan,
    /* .ssm_step = */ NULL, /* one token is a scan of T = 1: the same warp-per-row recurrence */
    /* .attention = */ cu_attention,
    /* .moe_route = */ cu_moe_route,
    /* .moe_combine = */ cu_moe_combine,
    /* .add = */ cu_add,
    /* .mul = */ cu_mul,
    /* .silu = */ cu_silu,
    /* .relu2 = */ cu_relu2,
    /* .scale = */ cu_scale,
    /* .attention_window = */ NULL, /* not here yet: models with sliding-window layers are refused
                                     * at load (cn_model_open) */
    /* .buf_alloc = */ cu_buf_alloc,
    /* .buf_free = */ cu_buf_free,
    /* .copy_async = */ cu_copy_async,
    /* .fence_done = */ cu_fence_done,
    /* .fence_wait = */ cu_fence_wait,
    /* .step_begin_at = */ cu_step_begin_at,
    /* .set_rows = */ cu_set_rows,
    /* .argmax = */ cu_argmax,
    /* .matmul_ep = */ cu_matmul_ep,
    /* .matmul_gather_ep = */ cu_matmul_gather_ep,
    /* .moe_route_ep = */ cu_moe_route_ep,
    /* not here: the model cuts the conv and the scan at the captures, as before */
    /* .conv1d_caps = */ NULL,
    /* .ssm_scan_caps = */ NULL,
    /* not here: a verify's buffers are recorded in its steps; the captures hold the states */
    /* .ssm_scan_from = */ NULL,
    /* .lane = */ cu_lane,
    /* .memory = */ cu_memory,
};

extern "C" cn_backend *cn_cuda_backend_create(int device, cn_err *err) {
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        cn_err_set(err, CN_EIO, "no CUDA device: %s",
                   e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return NULL;
    }
    if (device < 0 || device >= n_dev) {
        cn_err_set(err, CN_EINVAL, "CUDA device %d does not exist (%d found)", device, n_dev);
        return NULL;
    }
    cn_backend *b = (cn_backend *)calloc(1, sizeof *b);
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        cn_err_set(err, CN_ENOMEM, "out of memory");
        return NULL;
    }
    b->ctx = c;
    c->device = device;
    const char *g = getenv("CAIRN_CUDA_GRAPHS");
    c->graphs = !(g && !strcmp(g, "0"));
    /* the fused decode ops are left out of this backend's table with $CAIRN_CUDA_FUSED=0, so a
     * run can time the plain op sequence against them */
    const char *f = getenv("CAIRN_CUDA_FUSED");
    c->fused = !(f && !strcmp(f, "0"));
    c->iface = cu_iface;
    if (!c->fused) {
        c->iface.argmax = NULL;
        c->iface.matmul_ep = NULL;
        c->iface.matmul_gather_ep = NULL;
        c->iface.moe_route_ep = NULL;
    }
    b->iface = &c->iface;
    const char *step = "set device";
    e = cudaSetDevice(device);
    if (e == cudaSuccess) {
        step = "device attributes";
        e = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device);
    }
    int major = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    /* programmatic dependent launches (cuda_impl.h invariant 7) need sm_90; $CAIRN_CUDA_PDL=0
     * queues every kernel plainly, so a run can time one against the other */
    const char *pdl = getenv("CAIRN_CUDA_PDL");
    c->pdl = major >= 9 && !(pdl && !strcmp(pdl, "0"));
    const char *se = getenv("CAIRN_CUDA_SETTLED"); /* 0: no early reads of settled data */
    c->settle = !(se && !strcmp(se, "0"));
    const char *ln = getenv("CAIRN_CUDA_LANES"); /* 0: every op in order, to time the lanes */
    c->use_lanes = !(ln && !strcmp(ln, "0"));
    if (e == cudaSuccess) {
        step = "stream";
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        c->lanes[0] = c->stream;
    }
    if (e == cudaSuccess) {
        step = "lanes";
        e = cudaStreamCreateWithFlags(&c->lanes[1], cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ev_join, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        step = "flag";
        e = cudaMalloc(&c->flag_dev, sizeof(int));
    }
    if (e == cudaSuccess) e = cudaMallocHost(&c->flag_host, sizeof(int));
    if (e == cudaSuccess) {
        step = "step parameters";
        e = cudaMalloc(&c->par_dev, sizeof(int));
    }
    if (e == cudaSuccess) e = cudaMallocHost(&c->par_host, sizeof(int));
    if (e == cudaSuccess) {
        step = "epilogue counters";
        e = cudaMalloc(&c->ep_cnt, CU_EP_COUNTERS * sizeof(int));
    }
    if (e == cudaSuccess) e = cudaMemset(c->ep_cnt, 0, CU_EP_COUNTERS * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc(&c->am_cnt, CU_ARGMAX_ROWS * sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(c->am_cnt, 0, CU_ARGMAX_ROWS * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc(&c->rt_cnt, sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(c->rt_cnt, 0, sizeof(int));
    if (e != cudaSuccess) {
        cn_err_set(err, e == cudaErrorMemoryAllocation ? CN_ENOMEM : CN_EIO, "CUDA device %d: %s: %s",
                   device, step, cudaGetErrorString(e));
        cu_free(b);
        return NULL;
    }
    /* a handle per lane: one handle's workspace must not serve two streams at once */
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    for (int l = 0; l < 2 && s == CUBLAS_STATUS_SUCCESS; l++) {
        s = cublasCreate(&c->lane_blas[l]);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(c->lane_blas[l], c->lanes[l]);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(c->lane_blas[l], CUBLAS_DEFAULT_MATH);
    }
    c->blas = c->lane_blas[0];
    if (s != CUBLAS_STATUS_SUCCESS) {
        cn_err_set(err, CN_EIO, "CUDA device %d: cuBLAS: %s", device, cublasGetStatusString(s));
        cu_free(b);
        return NULL;
    }
    return b;
}

extern "C" int cn_cuda_backend_stats(const cn_backend *b, cn_cuda_stats *out) {
    if (!b || b->iface->free != cu_free) return CN_EINVAL;
    *out = ((const cu_ctx *)b->ctx)->stats;
    return CN_OK;
}
