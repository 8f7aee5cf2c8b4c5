/* cuda_backend.h - the CUDA backend: every op of the backend table on one NVIDIA GPU.
 *
 * Activations, caches and states live in device memory; weights are uploaded once, in their
 * stored dtype, by cn_backend_weight (the backend owns those copies until it is freed). Ops are
 * queued on one stream and run in order; upload/download/sync wait for the stream. Only built with
 * CAIRN_CUDA (see backends.h for creating it by name).
 */
#ifndef CN_CUDA_BACKEND_H
#define CN_CUDA_BACKEND_H

#include "base/error.h"
#include "tensor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a backend on CUDA device `device`. NULL on failure, err naming why (no device, driver
 * too old, out of memory). */
cn_backend *cn_cuda_backend_create(int device, cn_err *err);

#ifdef __cplusplus
}
#endif

#endif
