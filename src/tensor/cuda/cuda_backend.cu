/* cuda_backend.cu - creation of the CUDA backend, its memory (cudaMalloc), transfers, weight
 * uploads and the iface table; the ops live in the other cuda_*.cu files.
 *
 * Promises: transfers to and from the host complete before they return (the host buffer may be
 * reused at once); copies and ops between device tensors are queued on the one stream, in order.
 * cuBLAS runs on that stream in CUBLAS_DEFAULT_MATH with TF32 refused (CUBLAS_PEDANTIC_MATH is not
 * needed: default math never uses TF32 for fp32 GEMMs unless asked), so fp32 GEMMs are fp32.
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

void *cu_scratch(cu_ctx *c, size_t bytes) {
    if (bytes <= c->scratch_cap) return c->scratch;
    size_t cap = c->scratch_cap ? c->scratch_cap : (1u << 20);
    while (cap < bytes) cap *= 2;
    void *p = NULL;
    if (cu_check(cudaStreamSynchronize(c->stream), "scratch sync")) return NULL;
    if (cu_check(cudaMalloc(&p, cap), "scratch")) return NULL;
    cudaFree(c->scratch);
    c->scratch = p;
    c->scratch_cap = cap;
    return p;
}

int cu_flag_reset(cu_ctx *c) {
    return cu_check(cudaMemsetAsync(c->flag_dev, 0, sizeof(int), c->stream), "flag reset");
}

int cu_flag_read(cu_ctx *c, int *flag) {
    int rc = cu_check(cudaMemcpyAsync(c->flag_host, c->flag_dev, sizeof(int),
                                      cudaMemcpyDeviceToHost, c->stream), "flag read");
    if (!rc) rc = cu_check(cudaStreamSynchronize(c->stream), "flag sync");
    *flag = rc ? 0 : *c->flag_host;
    return rc;
}

/* ---- iface: lifetime and memory ---- */

static void cu_free(cn_backend *b) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (int i = 0; i < c->n_weights; i++) cudaFree(c->weights[i]);
    for (int i = 0; i < c->n_tabs; i++) {
        cudaFree(c->tabs[i].dev);
        free(c->tabs[i].host_ptrs);
    }
    free(c->tabs);
    free(c->weights);
    cudaFree(c->scratch);
    cudaFree(c->flag_dev);
    if (c->flag_host) cudaFreeHost(c->flag_host);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    free(b);
}

static int cu_alloc(cn_backend *b, cn_tensor *t) {
    (void)cu_ctx_of(b); /* makes the device current */
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
    (void)cu_ctx_of(b);
    cudaFree(t->data); /* waits for work that may still read it */
    t->data = NULL;
}

static int cu_upload(cn_backend *b, cn_tensor *dst, uint64_t offset, const void *host, uint64_t n) {
    cu_ctx *c = cu_ctx_of(b);
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
        return cu_check(cudaMemcpy2DAsync(dst->data, (size_t)dst->stride[0], src->data,
                                          (size_t)src->stride[0], (size_t)C * esz, (size_t)R,
                                          cudaMemcpyDeviceToDevice, c->stream),
                        "copy");
    }
    return cu_convert(b, dst, src);
}

static int cu_supports_weight(const cn_backend *b, cn_dtype dtype) {
    (void)b;
    /* NVFP4 / MXFP8: not yet (CN_EUNSUPPORTED through the wrappers) */
    return dtype == CN_F32 || dtype == CN_BF16 || dtype == CN_F16 || dtype == CN_F8_E4M3;
}

/* Uploads a host-mapped weight once, in its stored dtype, and repoints it at the device copy. */
static int cu_weight(cn_backend *b, cn_tensor *w) {
    cu_ctx *c = cu_ctx_of(b);
    if (w->where == CN_DEVICE) return CN_OK;
    if (!cu_supports_weight(b, w->dtype) || w->block_scale) return CN_EUNSUPPORTED;
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
    return cu_check(cudaStreamSynchronize(cu_ctx_of(b)->stream), "sync");
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
    b->iface = &cu_iface;
    b->ctx = c;
    c->device = device;
    const char *step = "set device";
    e = cudaSetDevice(device);
    if (e == cudaSuccess) {
        step = "device attributes";
        e = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device);
    }
    if (e == cudaSuccess) {
        step = "stream";
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) {
        step = "flag";
        e = cudaMalloc(&c->flag_dev, sizeof(int));
    }
    if (e == cudaSuccess) e = cudaMallocHost(&c->flag_host, sizeof(int));
    if (e != cudaSuccess) {
        cn_err_set(err, e == cudaErrorMemoryAllocation ? CN_ENOMEM : CN_EIO, "CUDA device %d: %s: %s",
                   device, step, cudaGetErrorString(e));
        cu_free(b);
        return NULL;
    }
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(c->blas, c->stream);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cn_err_set(err, CN_EIO, "CUDA device %d: cuBLAS: %s", device, cublasGetStatusString(s));
        cu_free(b);
        return NULL;
    }
    return b;
}
