/* backends.h - creating a backend by name, so commands and tests pick one with a string.
 *
 * Names: "cpu" always; "cuda" (device 0) and "cuda:N" when the build has the CUDA backend
 * (CAIRN_CUDA). A name this build lacks fails with a message that says so; nothing else here
 * knows which backends exist.
 */
#ifndef CN_BACKENDS_H
#define CN_BACKENDS_H

#include "base/error.h"
#include "tensor/backend.h"

/* Creates the backend `name` (NULL or "" = "cpu"); n_threads is the CPU backend's worker count
 * (<= 0: one per core). NULL on failure with err naming why (CN_EINVAL for an unknown name,
 * CN_EUNSUPPORTED for "cuda" in a build without it, CN_EIO when no device answers). */
cn_backend *cn_backend_open(const char *name, int n_threads, cn_err *err);

/* The backend the tests run on: $CAIRN_BACKEND, or "cpu" when unset. */
const char *cn_backend_default_name(void);

#endif
