/* cuda_backend.h - the CUDA backend: every op of the backend table on one NVIDIA GPU.
 *
 * Activations, caches and states live in device memory; weights are uploaded once, in their
 * stored dtype, by cn_backend_weight (the backend owns those copies until it is freed). Ops are
 * queued on one stream and run in order; upload/download/sync wait for the stream. Only built with
 * CAIRN_CUDA (see backends.h for creating it by name).
 */
#ifndef CN_CUDA_BACKEND_H
#define CN_CUDA_BACKEND_H

#include <stdint.h>

#include "base/error.h"
#include "tensor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a backend on CUDA device `device`. NULL on failure, err naming why (no device, driver
 * too old, out of memory). Steps (backend.h) are recorded as CUDA graphs unless the environment
 * has CAIRN_CUDA_GRAPHS=0 at creation or cn_backend_set_record turns it off; then their ops are
 * launched as called, still without a wait per op. A step begun at a position (backend.h (d)) is
 * replayed from its graph, not captured again, while its key, tag and attention bucket hold.
 * The fused decode ops (argmax, matmul_ep, matmul_gather_ep: backend.h) are offered unless the
 * environment has CAIRN_CUDA_FUSED=0 at creation (then the model runs the plain op sequence,
 * downloading logits: the A/B for their speed). */
cn_backend *cn_cuda_backend_create(int device, cn_err *err);

/* What the steps of a CUDA backend did since creation. */
typedef struct cn_cuda_stats {
    uint64_t steps;        /* step_end with run = 1 */
    uint64_t instantiated; /* graphs instantiated (first step of a key, or a changed shape) */
    uint64_t updated;      /* graphs updated in place (same shape, new parameters) */
    uint64_t update_failed; /* updates the driver refused though the shapes matched (then
                             * instantiated): 0 unless the shape test misses a constraint */
    uint64_t discarded;    /* steps ended with run = 0 */
    uint64_t replayed;     /* positioned steps launched from their graph without a capture */
} cn_cuda_stats;

/* Fills *out; 0, or CN_EINVAL if b is not a CUDA backend. */
int cn_cuda_backend_stats(const cn_backend *b, cn_cuda_stats *out);

#ifdef __cplusplus
}
#endif

#endif
