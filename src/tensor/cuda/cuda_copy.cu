/* cuda_copy.cu - snapshot buffers and the copy stream of the CUDA backend (backend.h).
 *
 * Promises: device buffers come from the device's stream-ordered pool (cudaMallocAsync on the
 * compute stream) and go back to it after every op and copy queued before the free
 * (cudaFreeAsync on the copy stream, once it waited for the compute stream), so freeing a
 * buffer never makes the host or the compute stream wait. Host buffers are pinned; freed ones
 * are kept for reuse up to a bound, because pinning memory costs far more than copying it.
 * Copies run on one copy stream, each after an event of the compute stream (so it sees the ops
 * queued before it, and a copy into a live tensor does not race the ops that read it), and each
 * records fence n in event n % CU_FENCES.
 *
 * Never: a copy inside a step (the compute stream is being captured), or a wait of the compute
 * stream on the copy stream except through cn_backend_fence_wait(host = 0).
 *
 * Invariants:
 *  (1) fence[i] is the last fence recorded in ev[i]; fences are issued in order on one in-order
 *      stream, so ev[f % CU_FENCES] done means fence f done even after the slot was re-recorded.
 *  (2) done <= issued; every fence <= done completed.
 *  (3) A pinned buffer handed out is preceded by a 64-byte header with its capacity; free ones
 *      sit in `spare`, spare_bytes of them, at most CU_SPARE_BYTES.
 */
#include <stdlib.h>
#include <string.h>

#include "tensor/cuda/cuda_impl.h"

#define CU_FENCES 64
#define CU_SPARE 64
#define CU_SPARE_BYTES ((uint64_t)512 << 20)
#define CU_PIN_HDR 64

typedef struct cu_copy {
    cudaStream_t stream;       /* the copy stream */
    cudaEvent_t order;         /* recorded on the compute stream before each copy or free */
    cudaEvent_t ev[CU_FENCES]; /* invariant 1 */
    uint64_t fence[CU_FENCES];
    uint64_t issued, done;     /* invariant 2 */
    void *spare[CU_SPARE];     /* invariant 3: headers of free pinned buffers */
    int n_spare;
    uint64_t spare_bytes;
} cu_copy;

/* The copy state, made at first use (most backends of a test never page a snapshot). */
static cu_copy *copy_of(cu_ctx *c) {
    if (c->copy) return c->copy;
    cu_copy *k = (cu_copy *)calloc(1, sizeof *k);
    if (!k) return NULL;
    int rc = cu_check(cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking), "copy stream");
    if (!rc) rc = cu_check(cudaEventCreateWithFlags(&k->order, cudaEventDisableTiming), "copy event");
    for (int i = 0; !rc && i < CU_FENCES; i++)
        rc = cu_check(cudaEventCreateWithFlags(&k->ev[i], cudaEventDisableTiming), "fence event");
    if (!rc) {
        /* keep freed snapshot buffers in the pool: paging would otherwise return memory to the
         * driver and take it back at every sync */
        cudaMemPool_t pool;
        uint64_t keep = UINT64_MAX;
        if (cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess)
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        (void)cudaGetLastError();
    }
    if (rc) {
        for (int i = 0; i < CU_FENCES; i++)
            if (k->ev[i]) cudaEventDestroy(k->ev[i]);
        if (k->order) cudaEventDestroy(k->order);
        if (k->stream) cudaStreamDestroy(k->stream);
        free(k);
        return NULL;
    }
    c->copy = k;
    return k;
}

void cu_copy_free(cu_ctx *c) {
    cu_copy *k = c->copy;
    if (!k) return;
    cudaStreamSynchronize(k->stream);
    for (int i = 0; i < k->n_spare; i++) cudaFreeHost(k->spare[i]);
    for (int i = 0; i < CU_FENCES; i++) cudaEventDestroy(k->ev[i]);
    cudaEventDestroy(k->order);
    cudaStreamDestroy(k->stream);
    free(k);
    c->copy = NULL;
}

/* The copy stream waits for what the compute stream queued so far. */
static int after_compute(cu_ctx *c, cu_copy *k) {
    int rc = cu_check(cudaEventRecord(k->order, c->stream), "copy order");
    if (!rc) rc = cu_check(cudaStreamWaitEvent(k->stream, k->order, 0), "copy order wait");
    return rc;
}

/* Pinned capacities come in classes so that freed buffers fit later requests of similar size. */
static uint64_t pin_class(uint64_t n) {
    uint64_t need = n + CU_PIN_HDR, c = 4096;
    if (need > ((uint64_t)1 << 20)) return (need + ((uint64_t)1 << 20) - 1) & ~(((uint64_t)1 << 20) - 1);
    while (c < need) c *= 2;
    return c;
}

int cu_buf_alloc(cn_backend *b, int kind, uint64_t n, void **out) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step) return CN_EBUSY;
    if (kind == CN_BUF_DEVICE) {
        void *p = NULL;
        cudaError_t e = cudaMallocAsync(&p, n ? n : 256, c->stream);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError(); /* a full device is the caller's to handle (host RAM) */
            return CN_ENOMEM;
        }
        int rc = cu_check(e, "snapshot buffer");
        if (rc) return rc;
        *out = p;
        return CN_OK;
    }
    cu_copy *k = copy_of(c);
    if (!k) return CN_ENOMEM;
    uint64_t cap = pin_class(n);
    for (int i = 0; i < k->n_spare; i++) {
        uint64_t have;
        memcpy(&have, k->spare[i], sizeof have);
        if (have != cap) continue;
        char *h = (char *)k->spare[i];
        k->spare[i] = k->spare[--k->n_spare];
        k->spare_bytes -= cap;
        *out = h + CU_PIN_HDR;
        return CN_OK;
    }
    void *h = NULL;
    cudaError_t e = cudaMallocHost(&h, cap);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return CN_ENOMEM;
    }
    memcpy(h, &cap, sizeof cap);
    *out = (char *)h + CU_PIN_HDR;
    return CN_OK;
}

void cu_buf_free(cn_backend *b, int kind, void *p) {
    cu_ctx *c = cu_ctx_of(b);
    cu_copy *k = copy_of(c);
    if (kind == CN_BUF_DEVICE) {
        /* after every op and copy queued so far (backend.h (c)); without a copy stream (out of
         * memory making one) on the compute stream, which is in order with the ops */
        if (k && !after_compute(c, k)) cu_check(cudaFreeAsync(p, k->stream), "snapshot free");
        else cu_check(cudaFreeAsync(p, c->stream), "snapshot free");
        return;
    }
    char *h = (char *)p - CU_PIN_HDR;
    uint64_t cap;
    memcpy(&cap, h, sizeof cap);
    if (k && k->n_spare < CU_SPARE && k->spare_bytes + cap <= CU_SPARE_BYTES) {
        k->spare[k->n_spare++] = h;
        k->spare_bytes += cap;
        return;
    }
    cudaFreeHost(h);
}

int cu_copy_async(cn_backend *b, void *dst, const void *src, uint64_t n, int dir, uint64_t *fence) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step) return CN_EBUSY;
    cu_copy *k = copy_of(c);
    if (!k) return CN_ENOMEM;
    if (!n) return CN_OK; /* fence 0: nothing to wait for */
    int rc = after_compute(c, k);
    if (!rc)
        rc = cu_check(cudaMemcpyAsync(dst, src, n, dir == CN_COPY_D2H ? cudaMemcpyDeviceToHost
                                                                      : cudaMemcpyHostToDevice,
                                      k->stream),
                      "snapshot copy");
    if (rc) return rc;
    uint64_t f = k->issued + 1;
    int i = (int)(f % CU_FENCES);
    rc = cu_check(cudaEventRecord(k->ev[i], k->stream), "fence");
    if (rc) {
        /* the copy is queued but has no event of its own: wait for it here */
        rc = cu_check(cudaStreamSynchronize(k->stream), "copy sync");
        return rc;
    }
    k->issued = f;
    k->fence[i] = f;
    *fence = f;
    return CN_OK;
}

int cu_fence_done(cn_backend *b, uint64_t fence) {
    cu_ctx *c = (cu_ctx *)b->ctx;
    cu_copy *k = c->copy;
    if (!k || fence <= k->done || fence > k->issued) return 1;
    int i = (int)(fence % CU_FENCES);
    cudaError_t e = cudaEventQuery(k->ev[i]);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    if (e != cudaSuccess) {
        cu_check(e, "fence query"); /* a failed copy is not waited for forever */
        return 1;
    }
    if (k->fence[i] > k->done) k->done = k->fence[i];
    return 1;
}

int cu_fence_wait(cn_backend *b, uint64_t fence, int host) {
    cu_ctx *c = cu_ctx_of(b);
    cu_copy *k = c->copy;
    if (!k || fence <= k->done || fence > k->issued) return CN_OK;
    int i = (int)(fence % CU_FENCES);
    if (!host) {
        if (c->in_step) return CN_EBUSY;
        return cu_check(cudaStreamWaitEvent(c->stream, k->ev[i], 0), "fence wait");
    }
    int rc = cu_check(cudaEventSynchronize(k->ev[i]), "fence sync");
    if (!rc && k->fence[i] > k->done) k->done = k->fence[i];
    return rc;
}
