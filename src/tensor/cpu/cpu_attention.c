/* cpu_attention.c - causal GQA attention without positional encoding on the CPU.
 *
 * Promises: a one-pass softmax over chunks of ATT_KB keys (flash-attention style) that subtracts the
 * running maximum before every exp, so no score overflows; the normaliser is summed in double, the
 * weighted values in fp32 straight into out (scores of one chunk live on the stack). Keys and values may be F32, BF16, F16 or F8_E4M3 rows (a compact KV cache).
 * Work is split over (query, kv head, block of query heads): the heads of one block share each
 * key/value row while it is in cache. Results do not depend on the thread count.
 * The sliding-window form runs the same loop over the positions of the window, its chunks also
 * cut where the rows stop being contiguous: at the ring's wrap and where the new rows (positions
 * >= n_past, passed apart from the ring) begin.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "tensor/cpu/cpu_impl.h"

#define ATT_HB 4   /* query heads per task (they share a kv head) */
#define ATT_KB 128 /* keys per chunk: scores of a chunk fit in L1 */

typedef struct att_job {
    const cpu_ctx *c;
    const cn_tensor *out, *q, *kc, *vc;
    cpu_wmat km, vm; /* row views of the caches, K = head_dim */
    cpu_wmat nkm, nvm; /* window form: views of the new rows (positions n_past..) */
    int window;        /* 0: plain causal attention over km/vm; W: the ring form */
    int n_past, n_kv, group, n_sub;
    int64_t Dh;
    float scale;
} att_job;

/* The run of keys from position s0 (at most max of them) that sits in one contiguous stretch of
 * rows: the cache rows from s0, or in the ring form ring rows up to the wrap or to n_past, or the
 * new rows. Sets the matrices and the first rows; returns the run's length. */
static inline int att_run(const att_job *j, int64_t s0, int max, const cpu_wmat **km,
                          const cpu_wmat **vm, const char **k0, const char **v0) {
    int64_t r = s0, n = max;
    *km = &j->km;
    *vm = &j->vm;
    if (j->window && s0 >= j->n_past) {
        *km = &j->nkm;
        *vm = &j->nvm;
        r = s0 - j->n_past;
    } else if (j->window) {
        r = s0 % j->window;
        if (n > j->n_past - s0) n = j->n_past - s0;
        if (n > j->window - r) n = j->window - r;
    }
    *k0 = (*km)->data + r * (*km)->stride;
    *v0 = (*vm)->data + r * (*vm)->stride;
    return (int)n;
}

static void att_task(void *arg, int begin, int end) {
    const att_job *j = arg;
    const cpu_kernels *kern = &j->c->kern;
    const int64_t Dh = j->Dh;
    float p[ATT_HB][ATT_KB]; /* scores, then probabilities, of one chunk of keys */
    for (int i = begin; i < end; i++) {
        int per_t = j->n_kv * j->n_sub;
        int t = i / per_t, kvh = (i % per_t) / j->n_sub, sub = i % j->n_sub;
        int h0 = kvh * j->group + sub * ATT_HB;
        int hb = j->group - sub * ATT_HB < ATT_HB ? j->group - sub * ATT_HB : ATT_HB;
        const float *qrow = cpu_row(j->q, t) + h0 * Dh;
        float *orow = cpu_row(j->out, t) + h0 * Dh; /* the hb heads are adjacent */
        float m[ATT_HB];
        double l[ATT_HB];
        for (int h = 0; h < hb; h++) {
            m[h] = -INFINITY;
            l[h] = 0;
        }
        memset(orow, 0, (size_t)(hb * Dh) * sizeof(float));
        const int64_t n_keys = (int64_t)j->n_past + t + 1; /* causal: positions 0..n_past+t */
        const int64_t first = j->window && n_keys > j->window ? n_keys - j->window : 0;
        for (int64_t s0 = first; s0 < n_keys;) {
            const cpu_wmat *km, *vm;
            const char *k0, *v0;
            const int nk = att_run(j, s0, n_keys - s0 < ATT_KB ? (int)(n_keys - s0) : ATT_KB, &km,
                                   &vm, &k0, &v0);
            const int64_t kw = Dh * (int64_t)cn_dtype_size(km->dtype); /* bytes of one kv head */
            const int64_t vw = Dh * (int64_t)cn_dtype_size(vm->dtype);
            for (int s = 0; s < nk; s++) {
                const char *krow = k0 + s * km->stride + kvh * kw;
                for (int h = 0; h < hb; h++)
                    p[h][s] = kern->dot_w(km, krow, qrow + h * Dh) * j->scale;
            }
            for (int h = 0; h < hb; h++) {
                float cm = m[h];
                for (int s = 0; s < nk; s++) cm = p[h][s] > cm ? p[h][s] : cm;
                if (cm > m[h]) { /* new maximum: rescale what was summed so far */
                    float corr = expf(m[h] - cm); /* 0 on the first chunk */
                    l[h] *= corr;
                    for (int64_t d = 0; d < Dh; d++) orow[h * Dh + d] *= corr;
                    m[h] = cm;
                }
                double sum = 0;
                for (int s = 0; s < nk; s++) sum += (p[h][s] = expf(p[h][s] - m[h]));
                l[h] += sum;
            }
            for (int s = 0; s < nk; s++) {
                const char *vrow = v0 + s * vm->stride + kvh * vw;
                for (int h = 0; h < hb; h++) kern->axpy_w(vm, p[h][s], vrow, orow + h * Dh);
            }
            s0 += nk;
        }
        for (int h = 0; h < hb; h++) {
            float inv = (float)(1.0 / l[h]);
            for (int64_t d = 0; d < Dh; d++) orow[h * Dh + d] *= inv;
        }
    }
}

static cpu_wmat cache_view(const cpu_ctx *c, const cn_tensor *t, int64_t Dh) {
    cpu_wmat m = {.data = (const char *)t->data, .stride = t->stride[0], .K = Dh,
                  .dtype = t->dtype, .scale = t->dtype == CN_F8_E4M3 ? t->scale : 1.0f,
                  .lut = c->e4m3_lut};
    return m;
}

static int cache_dtype_ok(cn_dtype d) {
    return d == CN_F32 || d == CN_BF16 || d == CN_F16 || d == CN_F8_E4M3;
}

int cpu_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                  const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale) {
    cpu_ctx *c = cpu_ctx_of(b);
    if (!cache_dtype_ok(kc->dtype) || !cache_dtype_ok(vc->dtype)) return CN_EUNSUPPORTED;
    const int64_t T = q->shape[0], Dh = q->shape[1] / n_heads;
    att_job j = {.c = c, .out = out, .q = q, .kc = kc, .vc = vc, .n_past = n_past,
                 .n_kv = n_kv_heads, .group = n_heads / n_kv_heads, .Dh = Dh, .scale = scale};
    j.n_sub = (j.group + ATT_HB - 1) / ATT_HB;
    j.km = cache_view(c, kc, Dh);
    j.vm = cache_view(c, vc, Dh);
    int64_t work = T * n_heads * (n_past + T) * Dh * 4;
    cpu_parallel(c, (int)T * n_kv_heads * j.n_sub, work, att_task, &j);
    return CN_OK;
}

int cpu_attention_window(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *k_new,
                         const cn_tensor *v_new, const cn_tensor *ring_k, const cn_tensor *ring_v,
                         int n_past, int window, int n_heads, int n_kv_heads, float scale) {
    cpu_ctx *c = cpu_ctx_of(b);
    if (!cache_dtype_ok(ring_k->dtype) || !cache_dtype_ok(ring_v->dtype)) return CN_EUNSUPPORTED;
    const int64_t T = q->shape[0], Dh = q->shape[1] / n_heads;
    att_job j = {.c = c, .out = out, .q = q, .kc = ring_k, .vc = ring_v, .n_past = n_past,
                 .window = window, .n_kv = n_kv_heads, .group = n_heads / n_kv_heads, .Dh = Dh,
                 .scale = scale};
    j.n_sub = (j.group + ATT_HB - 1) / ATT_HB;
    j.km = cache_view(c, ring_k, Dh);
    j.vm = cache_view(c, ring_v, Dh);
    j.nkm = cache_view(c, k_new, Dh);
    j.nvm = cache_view(c, v_new, Dh);
    int64_t keys = n_past + T < window ? n_past + T : window;
    int64_t work = T * n_heads * keys * Dh * 4;
    cpu_parallel(c, (int)T * n_kv_heads * j.n_sub, work, att_task, &j);
    return CN_OK;
}
