/* cuda_probe.cu - what the GPU can do, measured on the spot: the measure hook of the backend
 * table (backend.h cn_backend_limits), for `cairn bench --backend cuda`.
 *
 * Promises: every figure is the best of a few timed repetitions after a warm-up, timed with CUDA
 * events on the backend's stream; buffers are allocated for the probe and freed before it
 * returns, and the stream is idle before and after. Never runs inside a step.
 *   mem   a streaming read kernel (16-byte loads summed per thread, one word written per block)
 *         over 2 GiB, far above the 60 MB L2: what a decode's weight stream does.
 *   peak  cublasGemmEx BF16 x BF16 -> FP32 with FP32 accumulation, 8192^3, on random data: the
 *         type of product the prefill GEMMs run (cuda_gemm.cu) at its best shape.
 *   link  cudaMemcpyAsync of 256 MiB between pinned host memory and the device, each way.
 */
#include <stdint.h>
#include <string.h>

#include "tensor/cuda/cuda_impl.h"

#define PROBE_MEM_BYTES ((size_t)2 << 30)
#define PROBE_GEMM_N 8192
#define PROBE_LINK_BYTES ((size_t)256 << 20)
#define PROBE_REPS 5

__global__ void k_probe_read(const uint4 *__restrict__ p, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    /* one word per block, so the loads cannot be dropped */
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(&out[blockIdx.x], acc);
}

__global__ void k_probe_fill(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t z = (uint32_t)i * 2654435761u ^ seed;
        z ^= z >> 15;
        z *= 2246822519u;
        z ^= z >> 13;
        p[i] = __float2bfloat16_rn((float)(z & 0xffff) / 65536.0f - 0.5f);
    }
}

/* Seconds of the fastest of PROBE_REPS runs of `body` after one warm-up; < 0 on error. */
template <typename F>
static double best_time(cu_ctx *c, F body) {
    cudaEvent_t a = NULL, z = NULL;
    double best = -1;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&z) != cudaSuccess) goto out;
    if (!body()) goto out;
    for (int r = 0; r < PROBE_REPS; r++) {
        cudaEventRecord(a, c->stream);
        if (!body()) {
            best = -1;
            goto out;
        }
        cudaEventRecord(z, c->stream);
        if (cudaEventSynchronize(z) != cudaSuccess) {
            best = -1;
            goto out;
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, a, z);
        if (best < 0 || ms * 1e-3 < best) best = ms * 1e-3;
    }
out:
    if (a) cudaEventDestroy(a);
    if (z) cudaEventDestroy(z);
    (void)cudaGetLastError();
    return best;
}

static int probe_mem(cu_ctx *c, double *gbs) {
    void *buf = NULL;
    unsigned *out = NULL;
    const unsigned blocks = (unsigned)c->n_sm * 8;
    int rc = cu_check(cudaMalloc(&buf, PROBE_MEM_BYTES), "probe buffer");
    if (!rc) rc = cu_check(cudaMalloc(&out, blocks * sizeof *out), "probe out");
    if (!rc) rc = cu_check(cudaMemsetAsync(buf, 1, PROBE_MEM_BYTES, c->stream), "probe fill");
    if (!rc) {
        const size_t n = PROBE_MEM_BYTES / sizeof(uint4);
        double t = best_time(c, [&] {
            k_probe_read<<<blocks, 512, 0, c->stream>>>((const uint4 *)buf, n, out);
            return cudaGetLastError() == cudaSuccess;
        });
        if (t > 0) *gbs = (double)PROBE_MEM_BYTES / t / 1e9;
        else rc = CN_EIO;
    }
    cudaStreamSynchronize(c->stream);
    cudaFree(buf);
    cudaFree(out);
    return rc;
}

static int probe_peak(cu_ctx *c, double *gops) {
    const size_t n = (size_t)PROBE_GEMM_N * PROBE_GEMM_N;
    __nv_bfloat16 *A = NULL, *B = NULL;
    float *C = NULL;
    int rc = cu_check(cudaMalloc(&A, n * sizeof *A), "probe A");
    if (!rc) rc = cu_check(cudaMalloc(&B, n * sizeof *B), "probe B");
    if (!rc) rc = cu_check(cudaMalloc(&C, n * sizeof *C), "probe C");
    if (!rc) {
        k_probe_fill<<<cu_blocks((int64_t)n, 256), 256, 0, c->stream>>>(A, n, 1u);
        k_probe_fill<<<cu_blocks((int64_t)n, 256), 256, 0, c->stream>>>(B, n, 2u);
        rc = cu_launch_check("probe fill");
    }
    if (!rc) {
        const float one = 1.0f, zero = 0.0f;
        const int N = PROBE_GEMM_N;
        double t = best_time(c, [&] {
            return cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N,
                                B, CUDA_R_16BF, N, &zero, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        });
        if (t > 0) *gops = 2.0 * N * (double)N * N / t / 1e9;
        else rc = CN_EIO;
    }
    cudaStreamSynchronize(c->stream);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    return rc;
}

static int probe_link(cu_ctx *c, double *h2d, double *d2h) {
    void *host = NULL, *dev = NULL;
    int rc = cu_check(cudaMallocHost(&host, PROBE_LINK_BYTES), "probe pinned buffer");
    if (!rc) rc = cu_check(cudaMalloc(&dev, PROBE_LINK_BYTES), "probe buffer");
    if (!rc) {
        memset(host, 3, PROBE_LINK_BYTES);
        double t = best_time(c, [&] {
            return cudaMemcpyAsync(dev, host, PROBE_LINK_BYTES, cudaMemcpyHostToDevice,
                                   c->stream) == cudaSuccess;
        });
        double u = best_time(c, [&] {
            return cudaMemcpyAsync(host, dev, PROBE_LINK_BYTES, cudaMemcpyDeviceToHost,
                                   c->stream) == cudaSuccess;
        });
        if (t > 0 && u > 0) {
            *h2d = (double)PROBE_LINK_BYTES / t / 1e9;
            *d2h = (double)PROBE_LINK_BYTES / u / 1e9;
        } else {
            rc = CN_EIO;
        }
    }
    cudaStreamSynchronize(c->stream);
    cudaFree(dev);
    if (host) cudaFreeHost(host);
    return rc;
}

int cu_measure(cn_backend *b, int what, cn_backend_limits *out) {
    cu_ctx *c = cu_ctx_of(b);
    if (c->in_step) return CN_EBUSY;
    int rc = cu_check(cudaStreamSynchronize(c->stream), "measure");
    if (!rc && (what & CN_LIMIT_MEM)) rc = probe_mem(c, &out->mem_gbs);
    if (!rc && (what & CN_LIMIT_PEAK)) {
        out->peak_what = "cuBLAS bf16 GEMM, fp32 accumulate and output";
        rc = probe_peak(c, &out->peak_gops);
    }
    if (!rc && (what & CN_LIMIT_LINK)) rc = probe_link(c, &out->h2d_gbs, &out->d2h_gbs);
    return rc;
}
