/* cpu_backend.h - the CPU backend: scalar reference kernels, AVX2/AVX-512 where it matters, and a
 * thread pool. Memory is ordinary host memory (64-byte aligned); weights are used in place from
 * their mapping. Selected SIMD paths are chosen at run time from the CPU's features.
 */
#ifndef CN_CPU_BACKEND_H
#define CN_CPU_BACKEND_H

#include "tensor/backend.h"

/* Creates a CPU backend with n_threads workers (<= 0: one per online core). NULL on ENOMEM. */
cn_backend *cn_cpu_backend_create(int n_threads);

#endif
