/* cpu_backend.c - creation of the CPU backend, its memory (64-byte aligned host buffers), transfers
 * and conversions, and the iface table; the ops live in the other cpu_*.c files.
 *
 * Promises: the SIMD level is decided once here and never changes for the backend's life: the best
 * the CPU has, capped by CAIRN_CPU_SCALAR=1 (scalar reference) or CAIRN_CPU_ISA=scalar|avx2|avx512
 * (so tests reach every path on any machine; a cap never enables what the CPU lacks). Weights are
 * used in place (weight() has nothing to do); every function leaves its outputs untouched when it
 * fails.
 */
#include "tensor/cpu/cpu_backend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/fp.h"
#include "tensor/cpu/cpu_impl.h"

#define CPU_ALIGN 64

static void *aligned_alloc64(size_t bytes) {
    size_t n = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN; /* C11 wants a multiple */
    return aligned_alloc(CPU_ALIGN, n ? n : CPU_ALIGN);
}

void *cpu_scratch(cpu_ctx *c, size_t bytes) {
    if (bytes <= c->scratch_cap) return c->scratch;
    size_t cap = c->scratch_cap ? c->scratch_cap : 4096;
    while (cap < bytes) cap *= 2;
    void *p = aligned_alloc64(cap);
    if (!p) return NULL;
    free(c->scratch);
    c->scratch = p;
    c->scratch_cap = cap;
    return p;
}

/* Below this much work a wake-up of the workers costs more than it saves. */
#define CPU_PARALLEL_MIN_WORK 32768

void cpu_parallel(cpu_ctx *c, int n, int64_t work, cn_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (c->n_threads == 1 || n == 1 || work < CPU_PARALLEL_MIN_WORK) {
        fn(arg, 0, n);
        return;
    }
    cn_pool_for(c->pool, n, 1, fn, arg);
}

/* A split costs a wake-up and the rows' cache lines moving between cores: on the 2-core VM a
 * 2-row silu or gated norm took 12-14 us split and 6-8 us on one core (work 40960-65536). */
#define CPU_ROWS_MIN_WORK 262144

void cpu_parallel_rows(cpu_ctx *c, int n, int64_t work, cn_pool_fn fn, void *arg) {
    if (n > 0 && work < CPU_ROWS_MIN_WORK) {
        fn(arg, 0, n);
        return;
    }
    cpu_parallel(c, n, work, fn, arg);
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* AVX2 also needs F16C, which __builtin_cpu_supports cannot name under clang: ask cpuid. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return (c & bit_F16C) != 0;
}

/* The AVX-512 NVFP4 kernel: vpdpbusd, vpermb and masked loads. */
static int has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vbmi");
}

static int pick_isa(void) {
    const char *env = getenv("CAIRN_CPU_SCALAR");
    if (env && env[0] && strcmp(env, "0") != 0) return CPU_ISA_SCALAR;
    int cap = CPU_ISA_AVX512;
    env = getenv("CAIRN_CPU_ISA");
    if (env && !strcmp(env, "scalar")) cap = CPU_ISA_SCALAR;
    if (env && !strcmp(env, "avx2")) cap = CPU_ISA_AVX2;
    __builtin_cpu_init();
    int isa = CPU_ISA_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
        isa = CPU_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
            isa = CPU_ISA_AVX512;
    }
    return isa < cap ? isa : cap;
}
#else
static int has_vnni(void) { return 0; }

static int pick_isa(void) { return CPU_ISA_SCALAR; }
#endif

/* ---- iface: lifetime and memory ---- */

static void cpu_free(cn_backend *b) {
    cpu_ctx *c = cpu_ctx_of(b);
    cn_pool_free(c->pool);
    free(c->scratch);
    free(c);
    free(b);
}

static int cpu_alloc(cn_backend *b, cn_tensor *t) {
    (void)b;
    if (t->ndim < 1 || t->ndim > CN_MAX_DIMS || cn_dtype_size(t->dtype) == 0) return CN_EINVAL;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0) return CN_EINVAL;
    /* The descriptor must describe what we allocate: contiguous strides. */
    cn_tensor fresh;
    cn_tensor_init(&fresh, t->dtype, t->ndim, t->shape, NULL);
    void *p = aligned_alloc64(cn_tensor_nbytes(&fresh));
    if (!p) return CN_ENOMEM;
    memcpy(t->stride, fresh.stride, sizeof t->stride);
    t->data = p;
    t->where = CN_HOST;
    return CN_OK;
}

static void cpu_release(cn_backend *b, cn_tensor *t) {
    (void)b;
    free(t->data);
    t->data = NULL;
}

static int cpu_upload(cn_backend *b, cn_tensor *dst, uint64_t offset, const void *host, uint64_t n) {
    (void)b;
    if (n) memmove((char *)dst->data + offset, host, n);
    return CN_OK;
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

static int cpu_download(cn_backend *b, void *host, const cn_tensor *src) {
    (void)b;
    int64_t rows, rb, stride;
    if (!as_rows(src, &rows, &rb, &stride)) return CN_EINVAL;
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)host + r * rb, (const char *)src->data + r * stride, (size_t)rb);
    return CN_OK;
}

static int cpu_copy(cn_backend *b, cn_tensor *dst, const cn_tensor *src) {
    (void)b;
    const int64_t R = dst->shape[0], C = dst->shape[1];
    cn_dtype dd = dst->dtype, sd = src->dtype;
    if (dd == sd) {
        if (cn_dtype_size(dd) == 0) return CN_EUNSUPPORTED;
        size_t rb = (size_t)C * cn_dtype_size(dd);
        for (int64_t r = 0; r < R; r++)
            memmove((char *)dst->data + r * dst->stride[0],
                    (const char *)src->data + r * src->stride[0], rb);
        return CN_OK;
    }
    int ok = (dd == CN_F32 && (sd == CN_BF16 || sd == CN_F16)) ||
             (sd == CN_F32 && (dd == CN_BF16 || dd == CN_F16));
    if (!ok) return CN_EUNSUPPORTED;
    for (int64_t r = 0; r < R; r++) {
        char *d = (char *)dst->data + r * dst->stride[0];
        const char *s = (const char *)src->data + r * src->stride[0];
        for (int64_t i = 0; i < C; i++) {
            if (dd == CN_F32) {
                uint16_t h = ((const uint16_t *)s)[i];
                ((float *)d)[i] = sd == CN_BF16 ? cn_bf16_to_f32(h) : cn_f16_to_f32(h);
            } else {
                float f = ((const float *)s)[i];
                ((uint16_t *)d)[i] = dd == CN_BF16 ? cn_f32_to_bf16(f) : cn_f32_to_f16(f);
            }
        }
    }
    return CN_OK;
}

static int cpu_supports_weight(const cn_backend *b, cn_dtype dtype) {
    (void)b;
    return dtype == CN_F32 || dtype == CN_BF16 || dtype == CN_F16 || dtype == CN_F8_E4M3 ||
           dtype == CN_NVFP4 || dtype == CN_MXFP8;
}

static const cn_backend_iface cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .weight = NULL, /* weights are used in place from their mapping */
    .sync = NULL,   /* every op is finished when it returns */
    .supports_weight = cpu_supports_weight,
    .matmul = cpu_matmul,
    .matmul_gather = cpu_matmul_gather,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .gated_rmsnorm = cpu_gated_rmsnorm,
    .conv1d = cpu_conv1d,
    .ssm_scan = cpu_ssm_scan,
    .ssm_step = NULL, /* one token is a scan of T = 1: the same per-head recurrence */
    .attention = cpu_attention,
    .moe_route = cpu_moe_route,
    .moe_combine = cpu_moe_combine,
    .add = cpu_add,
    .mul = cpu_mul,
    .silu = cpu_silu,
    .relu2 = cpu_relu2,
    .scale = cpu_scale,
    .attention_window = cpu_attention_window,
    .argmax = cpu_argmax,
    .conv1d_caps = cpu_conv1d_caps,
    .ssm_scan_caps = cpu_ssm_scan_caps,
    .ssm_scan_from = cpu_ssm_scan_from,
    /* no fused epilogues: each op streams its operands from memory anyway */
};

cn_backend *cn_cpu_backend_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    cn_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) goto err;
    c->n_threads = n_threads;
    c->pool = cn_pool_create(n_threads);
    if (!c->pool) goto err;
    c->isa = pick_isa();
    switch (c->isa) {
    case CPU_ISA_AVX512: cpu_kernels_avx512(&c->kern, has_vnni()); break;
    case CPU_ISA_AVX2: cpu_kernels_avx2(&c->kern); break;
    default: cpu_kernels_scalar(&c->kern); break;
    }
    for (int i = 0; i < 256; i++) {
        c->e4m3_lut[i] = cn_e4m3_to_f32((uint8_t)i);
        c->e8m0_lut[i] = cn_e8m0_to_f32((uint8_t)i);
    }
    b->iface = &cpu_iface;
    b->ctx = c;
    return b;
err:
    free(c);
    free(b);
    return NULL;
}
