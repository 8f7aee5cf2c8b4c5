/* backends.c - backend creation by name; see backends.h. */
#include "tensor/backends.h"

#include <stdlib.h>
#include <string.h>

#include "tensor/cpu/cpu_backend.h"
#ifdef CAIRN_HAVE_CUDA
#include "tensor/cuda/cuda_backend.h"
#endif

const char *cn_backend_default_name(void) {
    const char *e = getenv("CAIRN_BACKEND");
    return e && e[0] ? e : "cpu";
}

cn_backend *cn_backend_open(const char *name, int n_threads, cn_err *err) {
    if (!name || !name[0] || !strcmp(name, "cpu")) {
        cn_backend *b = cn_cpu_backend_create(n_threads);
        if (!b) cn_err_set(err, CN_ENOMEM, "cannot create the CPU backend: out of memory");
        return b;
    }
    if (!strncmp(name, "cuda", 4) && (name[4] == '\0' || name[4] == ':')) {
        int device = 0;
        if (name[4] == ':') {
            char *end;
            long d = strtol(name + 5, &end, 10);
            if (end == name + 5 || *end || d < 0 || d > 1024) {
                cn_err_set(err, CN_EINVAL, "backend '%s': expected cuda or cuda:N", name);
                return NULL;
            }
            device = (int)d;
        }
#ifdef CAIRN_HAVE_CUDA
        return cn_cuda_backend_create(device, err);
#else
        (void)device;
        cn_err_set(err, CN_EUNSUPPORTED,
                   "this build has no CUDA backend (rebuild with -DCAIRN_CUDA=ON where nvcc is installed)");
        return NULL;
#endif
    }
    cn_err_set(err, CN_EINVAL, "unknown backend '%s' (expected cpu or cuda)", name);
    return NULL;
}
