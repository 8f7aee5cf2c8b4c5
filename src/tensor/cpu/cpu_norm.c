/* cpu_norm.c - RMSNorm and the Mamba2 gated, grouped RMSNorm on the CPU.
 *
 * Promises: the sum of squares is accumulated in double (rows are a few thousand wide and fp32
 * sums lose digits there), the rest in fp32; y may alias x (each value is read before its own slot
 * is written); rows run in parallel and never depend on each other.
 */
#include <math.h>

#include "base/error.h"
#include "tensor/cpu/cpu_impl.h"

#define NORM_GB 256 /* gate values a row takes through the kernel table's silu at a time */

typedef struct norm_job {
    const cpu_kernels *k;
    const cn_tensor *y, *x, *z; /* z: gate, NULL for plain rmsnorm */
    const float *w;             /* [C] */
    int64_t C, group;
    float eps;
} norm_job;

static void rmsnorm_rows(void *arg, int begin, int end) {
    const norm_job *j = arg;
    for (int t = begin; t < end; t++) {
        const float *x = cpu_row(j->x, t);
        float *y = cpu_row(j->y, t);
        double ss = 0;
        for (int64_t i = 0; i < j->C; i++) ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / (double)j->C + j->eps));
        for (int64_t i = 0; i < j->C; i++) y[i] = j->w[i] * (x[i] * inv);
    }
}

int cpu_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps) {
    norm_job j = {.y = y, .x = x, .w = (const float *)w->data, .C = x->shape[1], .eps = eps};
    cpu_parallel_rows(cpu_ctx_of(b), (int)x->shape[0], x->shape[0] * x->shape[1] * 4, rmsnorm_rows,
                 &j);
    return CN_OK;
}

/* Per row: g = x * silu(z) written into y first, then each group of `group` columns normalised
 * in place (norm_before_gate = False in the reference). */
static void gated_rows(void *arg, int begin, int end) {
    const norm_job *j = arg;
    for (int t = begin; t < end; t++) {
        const float *x = cpu_row(j->x, t), *z = cpu_row(j->z, t);
        float *y = cpu_row(j->y, t);
        for (int64_t i0 = 0; i0 < j->C; i0 += NORM_GB) { /* silu(z) a block at a time */
            const int64_t n = j->C - i0 < NORM_GB ? j->C - i0 : NORM_GB;
            float g[NORM_GB];
            j->k->silu(g, z + i0, n);
            for (int64_t i = 0; i < n; i++) y[i0 + i] = x[i0 + i] * g[i];
        }
        for (int64_t g0 = 0; g0 < j->C; g0 += j->group) {
            double ss = 0;
            for (int64_t i = g0; i < g0 + j->group; i++) ss += (double)y[i] * y[i];
            float inv = (float)(1.0 / sqrt(ss / (double)j->group + j->eps));
            for (int64_t i = g0; i < g0 + j->group; i++) y[i] = j->w[i] * (y[i] * inv);
        }
    }
}

int cpu_gated_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                      const cn_tensor *w, int group, float eps) {
    cpu_ctx *c = cpu_ctx_of(b);
    norm_job j = {.k = &c->kern, .y = y, .x = x, .z = z, .w = (const float *)w->data,
                  .C = x->shape[1], .group = group, .eps = eps};
    cpu_parallel_rows(c, (int)x->shape[0], x->shape[0] * x->shape[1] * 16, gated_rows, &j);
    return CN_OK;
}
