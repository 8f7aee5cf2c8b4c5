/* cpu_attention.c - causal GQA attention without positional encoding on the CPU.
 *
 * Promises: a one-pass softmax over chunks of keys (flash-attention style) that subtracts the
 * running maximum before every exp, so no score overflows; the normaliser is summed in double, the
 * weighted values in fp32. Keys and values may be F32, BF16, F16 or F8_E4M3 rows (a compact KV
 * cache). Results do not depend on the thread count, and a query's output does not depend on
 * which other queries share its call: a prefill chunk of any size, a verify's few queries and a
 * decode of that one query give it the same bits.
 *
 * Three paths:
 *  - tiled (kern.att_block, every table; cpu_att_block.c): prefill. Tasks of (block of queries,
 *    kv head, sub-group of up to CPU_ATT_HB query heads): a block's queries, up to
 *    CPU_ATT_LANES / heads of them, share every K/V row read, one lane per (query, head). Each
 *    query's keys are cut in ranges of ATT_RANGE from key 0, each range's softmax pieces folded
 *    into its output in range order (att_fold). Only the steps that cross a query's causal edge
 *    take the kernel's slow path; keys past every query of the block are never read.
 *  - decode (T = 1): the keys split over threads by ranges, each range's (max, sum,
 *    unnormalised output) merged afterwards in range order by the same att_fold, so the result
 *    is the same for any thread count and the same as the query's prefill. AVX-512 runs
 *    kern.att_heads: every query head of a kv head (up to CPU_ATT_HB) in one pass over its K/V,
 *    one head per fp32 lane, ATT_VK key rows decoded to fp32 per step, the scores of a key for
 *    all heads one vector, sum over d of q^T[d] * k[d] (no horizontal sums), values accumulated
 *    with the heads' probabilities broadcast; one task steps up to CPU_ATT_NB adjacent kv heads
 *    over its range together, so the cache rows stream once, front to back, with the rows
 *    ATT_PF steps ahead prefetched a line at a time among the arithmetic. At 8k keys (nano's 2
 *    kv heads of 128, F32 cache) that took a decode's attention from 2.2-2.4 to 1.4-1.7 ms of CPU
 *    time on one thread (loaded machine), the reads having been a third of it. The scores take
 *    four d per row pointer loaded (the 16 pointers live in vector registers, each use a move):
 *    1.21 -> 1.15 ms best of 300 calls, one thread, alternating (same bits). Per lane its
 *    operations are the tiled kernel's, in the same order (cpu_att_block.c says which), so the
 *    two give a query the same bits. The other tables decode with att_block, one query a call.
 *  - generic (heads longer than CPU_ATT_DMAX, and the sliding-window form): tasks of (query,
 *    kv head, block of ATT_HB query heads) built on the kernels' dot_w / axpy_w, one key row at
 *    a time.
 *
 * The sliding-window form runs the generic path over the positions of the window, its chunks cut
 * where the rows stop being contiguous: at the ring's wrap and where the new rows (positions
 * >= n_past, passed apart from the ring) begin.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "base/fp.h"
#include "tensor/cpu/cpu_exp.h"
#include "tensor/cpu/cpu_impl.h"

#define ATT_HB 4   /* generic: query heads per task (they share a kv head) */
#define ATT_KB 128 /* generic: keys per chunk: scores of a chunk fit in L1 */
#define ATT_RANGE 1024 /* vectorised: keys per range; a query's ranges are folded in order */
#define ATT_VK 16      /* vectorised: key rows decoded to fp32 per step */
#define ATT_PF 2       /* vectorised: steps ahead whose rows are prefetched */

typedef struct att_job {
    const cpu_ctx *c;
    const cn_tensor *out, *q, *kc, *vc;
    cpu_wmat km, vm; /* row views of the caches, K = head_dim */
    cpu_wmat nkm, nvm; /* window form: views of the new rows (positions n_past..) */
    int window;        /* 0: plain causal attention over km/vm; W: the ring form */
    int n_past, n_kv, group, n_sub;
    int64_t Dh;
    float scale;
    int nq, n_qb;    /* tiled prefill: queries per block, blocks */
    int64_t T;
    /* vectorised decode split over ranges: piece of (kv head, sub, range) at index
     * (kvh * n_sub + sub) * n_range + range */
    int n_range;
    float *piece_o;  /* [CPU_ATT_HB * Dh] per piece */
    float *piece_m;  /* [CPU_ATT_HB] per piece */
    double *piece_l; /* [CPU_ATT_HB] per piece */
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

/* ---- vectorised path ---- */

/* Folds one key range's pieces (o, m, l of hb heads) into the running (O, M, L) of a query; with
 * first set, the range starts them. The same function folds a prefill query's ranges in its task
 * and a decode query's ranges after their parallel tasks, so both give the same bits. */
static void att_fold(float *O, float *M, double *L, const float *o, const float *m,
                     const double *l, int hb, int64_t Dh, int first) {
    for (int h = 0; h < hb; h++) {
        float *Oh = O + h * Dh;
        const float *oh = o + h * Dh;
        if (first) {
            if (Oh != oh) memcpy(Oh, oh, (size_t)Dh * sizeof(float));
            M[h] = m[h];
            L[h] = l[h];
            continue;
        }
        float nm = m[h] > M[h] ? m[h] : M[h];
        double a = exp((double)M[h] - nm), b = exp((double)m[h] - nm);
        L[h] = L[h] * a + l[h] * b;
        for (int64_t d = 0; d < Dh; d++) Oh[d] = (float)(Oh[d] * a + oh[d] * b);
        M[h] = nm;
    }
}

static void att_normalise(float *O, const double *L, int hb, int64_t Dh) {
    for (int h = 0; h < hb; h++) {
        float inv = (float)(1.0 / L[h]);
        for (int64_t d = 0; d < Dh; d++) O[h * Dh + d] *= inv;
    }
}

/* Fills the kernel's arguments for query t, heads [h0, h0 + hb) of kv head kvh, keys [s0, s1). */
static cpu_att_args att_args_of(const att_job *j, int t, int kvh, int h0, int hb, int64_t s0,
                                int64_t s1) {
    const int64_t Dh = j->Dh;
    cpu_att_args a = {
        .q = cpu_row(j->q, t) + h0 * Dh, .hb = hb, .Dh = Dh, .s0 = s0, .s1 = s1,
        .k0 = j->km.data + kvh * Dh * (int64_t)cn_dtype_size(j->km.dtype),
        .v0 = j->vm.data + kvh * Dh * (int64_t)cn_dtype_size(j->vm.dtype),
        .k_stride = j->km.stride, .v_stride = j->vm.stride, .kdt = j->km.dtype,
        .vdt = j->vm.dtype, .kscale = j->km.scale, .vscale = j->vm.scale, .scale = j->scale};
    return a;
}

/* The tiled kernel's arguments for nq queries from t0, heads [h0, h0 + hb) of kv head kvh. */
static cpu_att_blk att_blk_of(const att_job *j, int64_t t0, int nq, int kvh, int h0, int hb) {
    const int64_t Dh = j->Dh;
    cpu_att_blk a = {
        .q = (const char *)(cpu_row(j->q, t0) + h0 * Dh), .q_stride = j->q->stride[0],
        .nq = nq, .hb = hb, .Dh = Dh, .pos0 = j->n_past + t0,
        .k0 = j->km.data + kvh * Dh * (int64_t)cn_dtype_size(j->km.dtype),
        .v0 = j->vm.data + kvh * Dh * (int64_t)cn_dtype_size(j->vm.dtype),
        .k_stride = j->km.stride, .v_stride = j->vm.stride, .kdt = j->km.dtype,
        .vdt = j->vm.dtype, .kscale = j->km.scale, .vscale = j->vm.scale, .scale = j->scale};
    return a;
}

/* Prefill: task (query block, kv head, sub) runs the block's key ranges in order, one kernel call
 * each, folding every query's piece into its output row (a query whose keys end before a range
 * takes nothing from it). The last blocks come first: they see the most keys, and the pool's
 * ranges shrink toward the end of the loop. */
static void att_blk_task(void *arg, int begin, int end) {
    const att_job *j = arg;
    const int64_t Dh = j->Dh;
    float piece[CPU_ATT_LANES * CPU_ATT_DMAX];
    float pm[CPU_ATT_LANES], M[CPU_ATT_LANES];
    double pl[CPU_ATT_LANES], L[CPU_ATT_LANES];
    const int per_b = j->n_kv * j->n_sub;
    for (int i = begin; i < end; i++) {
        const int qb = j->n_qb - 1 - i / per_b, kvh = (i % per_b) / j->n_sub, sub = i % j->n_sub;
        const int h0 = kvh * j->group + sub * CPU_ATT_HB;
        const int hb = j->group - sub * CPU_ATT_HB < CPU_ATT_HB ? j->group - sub * CPU_ATT_HB
                                                                : CPU_ATT_HB;
        const int64_t t0 = (int64_t)qb * j->nq;
        const int nq = j->T - t0 < j->nq ? (int)(j->T - t0) : j->nq;
        cpu_att_blk a = att_blk_of(j, t0, nq, kvh, h0, hb);
        a.o = piece;
        a.m = pm;
        a.l = pl;
        const int64_t last = a.pos0 + nq - 1; /* the block's last query sees keys 0..last */
        for (int64_t r0 = 0; r0 <= last; r0 += ATT_RANGE) {
            a.s0 = r0;
            a.s1 = last + 1 - r0 < ATT_RANGE ? last + 1 : r0 + ATT_RANGE;
            j->c->kern.att_block(&a);
            for (int qi = 0; qi < nq; qi++) {
                if (a.pos0 + qi < r0) continue;
                att_fold(cpu_row(j->out, t0 + qi) + h0 * Dh, M + qi * hb, L + qi * hb,
                         piece + qi * hb * Dh, pm + qi * hb, pl + qi * hb, hb, Dh, r0 == 0);
            }
        }
        for (int qi = 0; qi < nq; qi++)
            att_normalise(cpu_row(j->out, t0 + qi) + h0 * Dh, L + qi * hb, hb, Dh);
    }
}

/* Decode: task (group of up to CPU_ATT_NB (kv head, sub) pairs, range) writes the range's pieces
 * of those pairs; att_vec folds them. One task reads a range of rows across the group's adjacent
 * kv heads as one stream (a kv head alone is a strided read of part of each row). */
static void att_range_task(void *arg, int begin, int end) {
    const att_job *j = arg;
    const int64_t n_keys = (int64_t)j->n_past + 1;
    const int n_ks = j->n_kv * j->n_sub;
    for (int i = begin; i < end; i++) {
        int range = i % j->n_range, ks0 = (i / j->n_range) * CPU_ATT_NB;
        int n = n_ks - ks0 < CPU_ATT_NB ? n_ks - ks0 : CPU_ATT_NB;
        int64_t s0 = (int64_t)range * ATT_RANGE;
        int64_t s1 = n_keys - s0 < ATT_RANGE ? n_keys : s0 + ATT_RANGE;
        cpu_att_args a[CPU_ATT_NB];
        for (int g = 0; g < n; g++) {
            int ks = ks0 + g, kvh = ks / j->n_sub, sub = ks % j->n_sub;
            int h0 = kvh * j->group + sub * CPU_ATT_HB;
            int hb = j->group - sub * CPU_ATT_HB < CPU_ATT_HB ? j->group - sub * CPU_ATT_HB
                                                              : CPU_ATT_HB;
            size_t piece = (size_t)ks * j->n_range + range;
            float *o = j->piece_o + piece * CPU_ATT_HB * j->Dh, *m = j->piece_m + piece * CPU_ATT_HB;
            double *l = j->piece_l + piece * CPU_ATT_HB;
            if (!j->c->kern.att_heads) { /* the tiled kernel, one query */
                cpu_att_blk b = att_blk_of(j, 0, 1, kvh, h0, hb);
                b.o = o, b.m = m, b.l = l, b.s0 = s0, b.s1 = s1;
                j->c->kern.att_block(&b);
                continue;
            }
            a[g] = att_args_of(j, 0, kvh, h0, hb, s0, s1);
            a[g].o = o, a[g].m = m, a[g].l = l;
        }
        if (j->c->kern.att_heads) j->c->kern.att_heads(a, n);
    }
}

/* The vectorised attention: prefill by blocks of queries, decode (T = 1) by key ranges. */
static int att_vec(cpu_ctx *c, att_job *j, int64_t T, int n_heads) {
    j->n_sub = (j->group + CPU_ATT_HB - 1) / CPU_ATT_HB;
    const int64_t Dh = j->Dh;
    int64_t work = T * n_heads * (j->n_past + T) * Dh * 4;
    if (T > 1) {
        /* as many queries a block as the lanes take, fewer when that would leave threads idle
         * (a verify's few queries): a query's bits do not depend on its block */
        const int hb = j->group < CPU_ATT_HB ? j->group : CPU_ATT_HB;
        j->T = T;
        j->nq = c->kern.att_block_lanes / hb;
        while (j->nq > 1 && (T + j->nq - 1) / j->nq * j->n_kv * j->n_sub < 2 * c->n_threads)
            j->nq = (j->nq + 1) / 2;
        j->n_qb = (int)((T + j->nq - 1) / j->nq);
        cpu_parallel(c, j->n_qb * j->n_kv * j->n_sub, work, att_blk_task, j);
        return CN_OK;
    }
    const int64_t n_keys = (int64_t)j->n_past + 1;
    j->n_range = (int)((n_keys + ATT_RANGE - 1) / ATT_RANGE);
    const int n_pieces = j->n_kv * j->n_sub * j->n_range;
    size_t bo = (size_t)n_pieces * CPU_ATT_HB * (size_t)Dh * sizeof(float);
    size_t bm = (size_t)n_pieces * CPU_ATT_HB * sizeof(float);
    size_t bl = (size_t)n_pieces * CPU_ATT_HB * sizeof(double);
    char *mem = cpu_scratch(c, bl + bo + bm);
    if (!mem) return CN_ENOMEM;
    j->piece_l = (double *)mem;
    j->piece_o = (float *)(mem + bl);
    j->piece_m = (float *)(mem + bl + bo);
    const int n_groups = (j->n_kv * j->n_sub + CPU_ATT_NB - 1) / CPU_ATT_NB;
    cpu_parallel(c, n_groups * j->n_range, work, att_range_task, j);
    float M[CPU_ATT_HB];
    double L[CPU_ATT_HB];
    for (int ks = 0; ks < j->n_kv * j->n_sub; ks++) {
        int kvh = ks / j->n_sub, sub = ks % j->n_sub;
        int h0 = kvh * j->group + sub * CPU_ATT_HB;
        int hb = j->group - sub * CPU_ATT_HB < CPU_ATT_HB ? j->group - sub * CPU_ATT_HB : CPU_ATT_HB;
        float *orow = cpu_row(j->out, 0) + h0 * Dh;
        for (int r = 0; r < j->n_range; r++) {
            size_t i = (size_t)ks * j->n_range + r;
            att_fold(orow, M, L, j->piece_o + i * CPU_ATT_HB * Dh, j->piece_m + i * CPU_ATT_HB,
                     j->piece_l + i * CPU_ATT_HB, hb, Dh, r == 0);
        }
        att_normalise(orow, L, hb, Dh);
    }
    return CN_OK;
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
    j.km = cache_view(c, kc, Dh);
    j.vm = cache_view(c, vc, Dh);
    if (c->kern.att_block && Dh <= CPU_ATT_DMAX) return att_vec(c, &j, T, n_heads);
    j.n_sub = (j.group + ATT_HB - 1) / ATT_HB;
    int64_t work = T * n_heads * (n_past + T) * Dh * 4;
    cpu_parallel(c, (int)T * n_kv_heads * j.n_sub, work, att_task, &j);
    return CN_OK;
}

/* ---- the AVX-512 kernel ---- */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AT_ATTR "avx512f,avx512bw,avx2,fma,f16c"
#define AT_FN __attribute__((target(AT_ATTR)))
#define AT_IN static inline __attribute__((always_inline, target(AT_ATTR)))

static float att_value(cn_dtype dt, const char *row, int64_t d) {
    switch (dt) {
    case CN_BF16: return cn_bf16_to_f32(((const uint16_t *)row)[d]);
    case CN_F16: return cn_f16_to_f32(((const uint16_t *)row)[d]);
    case CN_F8_E4M3: return cn_e4m3_to_f32(((const uint8_t *)row)[d]);
    default: return ((const float *)row)[d];
    }
}

/* 16 values of a cache row from d on, as fp32 (E4M3 by the fp16-bits identity of cpu_kernels.c,
 * invariant 2, exact). */
AT_IN __m512 at_load16(cn_dtype dt, const char *row, int64_t d) {
    switch (dt) {
    case CN_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * d));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case CN_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * d)));
    case CN_F8_E4M3: {
        __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + d)));
        __m256i sg = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8);
        __m256i mg = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f)), 7);
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(sg, mg)), _mm512_set1_ps(256.0f));
    }
    default: return _mm512_loadu_ps((const float *)row + d);
    }
}

/* dst[d] = row value d * s for d < Dh, then zeros up to DP (a multiple of 16). */
AT_IN void at_row(cn_dtype dt, const char *row, int64_t Dh, int64_t DP, float s, float *dst) {
    const __m512 vs = _mm512_set1_ps(s);
    int64_t d = 0;
    for (; d + 16 <= Dh; d += 16) _mm512_store_ps(dst + d, _mm512_mul_ps(at_load16(dt, row, d), vs));
    for (; d < Dh; d++) dst[d] = att_value(dt, row, d) * s;
    for (; d < DP; d++) dst[d] = 0;
}

/* One head group's softmax over the keys stepped so far: q transposed with the scale folded in,
 * the unnormalised output, and per lane (query head) the running max and normaliser. */
typedef struct at_state {
    _Alignas(64) float qT[CPU_ATT_DMAX][CPU_ATT_HB];
    _Alignas(64) float o[CPU_ATT_HB][CPU_ATT_DMAX];
    _Alignas(64) float m[CPU_ATT_HB];
    _Alignas(64) double l[CPU_ATT_HB];
} at_state;

AT_IN void at_init(const cpu_att_args *a, at_state *st, int HB) {
    const int64_t Dh = a->Dh, DP = (Dh + 15) & ~(int64_t)15;
    for (int64_t d = 0; d < Dh; d++)
        for (int h = 0; h < CPU_ATT_HB; h++)
            st->qT[d][h] = h < a->hb ? a->q[h * Dh + d] * a->scale : 0;
    for (int h = 0; h < HB; h++)
        for (int64_t d = 0; d < DP; d++) st->o[h][d] = 0;
    _mm512_store_ps(st->m, _mm512_set1_ps(-INFINITY));
    _mm512_store_pd(st->l, _mm512_setzero_pd());
    _mm512_store_pd(st->l + 8, _mm512_setzero_pd());
}

/* A walk over the cache rows ATT_PF steps ahead, a line at a time: row p (NULL once past end),
 * byte b within its `bytes`, rows `stride` apart. */
typedef struct at_pf {
    const char *p;
    int64_t b, bytes, stride;
    const char *end;
} at_pf;

/* Prefetches the walk's next line and moves past it. */
AT_IN void at_pf_line(at_pf *w) {
    if (!w->p) return;
    _mm_prefetch(w->p + w->b, _MM_HINT_T0);
    if ((w->b += 64) >= w->bytes) {
        w->b = 0;
        w->p = w->p + w->stride < w->end ? w->p + w->stride : NULL;
    }
}

/* Keys [s, min(s + ATT_VK, s1)) of one head group. HB (4, 8 or 16, >= a->hb) is a constant after
 * inlining: the value accumulators stay in registers. Lane h of every vector below is query head
 * h; lanes >= hb see q = 0. kf, vf: scratch for the decoded rows. */
AT_IN void at_step(const cpu_att_args *a, at_state *st, int64_t s, int HB,
                   float (*kf)[CPU_ATT_DMAX], float (*vf)[CPU_ATT_DMAX]) {
    const int64_t Dh = a->Dh, DP = (Dh + 15) & ~(int64_t)15;
    const int64_t rk = Dh * (int64_t)cn_dtype_size(a->kdt), rv = Dh * (int64_t)cn_dtype_size(a->vdt);
    _Alignas(64) float p[ATT_VK][CPU_ATT_HB];
    __m512 m = _mm512_load_ps(st->m);
    __m512d l0 = _mm512_load_pd(st->l), l1 = _mm512_load_pd(st->l + 8);
    const int nk = a->s1 - s < ATT_VK ? (int)(a->s1 - s) : ATT_VK;
    /* fp32 rows of whole vectors with scale 1 are read where they lie (the same values a
     * decoded copy would hold); others are decoded into kf, vf */
    const int k_direct = a->kdt == CN_F32 && a->kscale == 1.0f && DP == Dh;
    const int v_direct = a->vdt == CN_F32 && a->vscale == 1.0f && DP == Dh;
    const float *kr[ATT_VK], *vr[ATT_VK];
    for (int i = 0; i < nk; i++) {
        const char *krow = a->k0 + (s + i) * a->k_stride, *vrow = a->v0 + (s + i) * a->v_stride;
        if (k_direct) kr[i] = (const float *)krow;
        else at_row(a->kdt, krow, Dh, DP, a->kscale, kf[i]), kr[i] = kf[i];
        if (v_direct) vr[i] = (const float *)vrow;
        else at_row(a->vdt, vrow, Dh, DP, a->vscale, vf[i]), vr[i] = vf[i];
    }
    for (int i = nk; i < ATT_VK; i++) {
        memset(kf[i], 0, (size_t)DP * sizeof(float));
        kr[i] = kf[i];
    }
    /* scores of the ATT_VK keys, each a vector over the heads */
    __m512 sc[ATT_VK];
#pragma GCC unroll 16
    for (int i = 0; i < ATT_VK; i++) sc[i] = _mm512_setzero_ps();
    /* The rows ATT_PF steps ahead are prefetched a line of K and one of V per d below, spread
     * over the step's arithmetic: issued in a burst they overflowed the miss buffers and the
     * rows' decoding above stalled on memory (a third of the time at 8k keys). */
    const int pf_on = s + (ATT_PF + 1) * ATT_VK <= a->s1;
    at_pf pk = {a->k0 + (s + ATT_PF * ATT_VK) * a->k_stride, 0, rk, a->k_stride,
                a->k0 + (s + (ATT_PF + 1) * ATT_VK) * a->k_stride};
    at_pf pv = {a->v0 + (s + ATT_PF * ATT_VK) * a->v_stride, 0, rv, a->v_stride,
                a->v0 + (s + (ATT_PF + 1) * ATT_VK) * a->v_stride};
    /* Four d at a time: the 16 row pointers do not fit in the integer registers beside the
     * prefetch walk, so each costs a register move per use; four uses per move instead of one
     * (each score still adds its products in d order). */
    for (int64_t d = 0; d < Dh; d += 4) {
        const int nd = Dh - d < 4 ? (int)(Dh - d) : 4;
        for (int u = 0; pf_on && u < nd; u++) {
            at_pf_line(&pk);
            at_pf_line(&pv);
        }
        if (nd == 4) {
            const __m512 q0 = _mm512_load_ps(st->qT[d]), q1 = _mm512_load_ps(st->qT[d + 1]);
            const __m512 q2 = _mm512_load_ps(st->qT[d + 2]), q3 = _mm512_load_ps(st->qT[d + 3]);
#pragma GCC unroll 16
            for (int i = 0; i < ATT_VK; i++) {
                const float *k = kr[i] + d;
                __m512 v = _mm512_fmadd_ps(q0, _mm512_set1_ps(k[0]), sc[i]);
                v = _mm512_fmadd_ps(q1, _mm512_set1_ps(k[1]), v);
                v = _mm512_fmadd_ps(q2, _mm512_set1_ps(k[2]), v);
                sc[i] = _mm512_fmadd_ps(q3, _mm512_set1_ps(k[3]), v);
            }
            continue;
        }
        for (int u = 0; u < nd; u++) {
            const __m512 qv = _mm512_load_ps(st->qT[d + u]);
#pragma GCC unroll 16
            for (int i = 0; i < ATT_VK; i++)
                sc[i] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kr[i][d + u]), sc[i]);
        }
    }
    __m512 cm = m;
    for (int i = 0; i < nk; i++) cm = _mm512_max_ps(cm, sc[i]);
    if (_mm512_cmp_ps_mask(cm, m, _CMP_GT_OQ)) { /* a new maximum: rescale what was summed */
        const __m512 corr = cpu_exp_le0_16(_mm512_sub_ps(m, cm)); /* 0 on the first step */
        l0 = _mm512_mul_pd(l0, _mm512_cvtps_pd(_mm512_castps512_ps256(corr)));
        l1 = _mm512_mul_pd(l1, _mm512_cvtps_pd(_mm256_castpd_ps(
                                   _mm512_extractf64x4_pd(_mm512_castps_pd(corr), 1))));
        _Alignas(64) float cf[CPU_ATT_HB];
        _mm512_store_ps(cf, corr);
        for (int h = 0; h < HB; h++) {
            const __m512 ch = _mm512_set1_ps(cf[h]);
            for (int64_t d = 0; d < DP; d += 16)
                _mm512_store_ps(st->o[h] + d, _mm512_mul_ps(_mm512_load_ps(st->o[h] + d), ch));
        }
        m = cm;
    }
    __m512 ls = _mm512_setzero_ps();
    for (int i = 0; i < nk; i++) {
        const __m512 pi = cpu_exp_le0_16(_mm512_sub_ps(sc[i], m));
        _mm512_store_ps(p[i], pi);
        ls = _mm512_add_ps(ls, pi);
    }
    l0 = _mm512_add_pd(l0, _mm512_cvtps_pd(_mm512_castps512_ps256(ls)));
    l1 = _mm512_add_pd(l1, _mm512_cvtps_pd(_mm256_castpd_ps(
                               _mm512_extractf64x4_pd(_mm512_castps_pd(ls), 1))));
    /* values: o[h] += p[i][h] * v[i], 16 columns at a time over every head */
    for (int64_t d = 0; d < DP; d += 16) {
        __m512 acc[CPU_ATT_HB];
#pragma GCC unroll 16
        for (int h = 0; h < HB; h++) acc[h] = _mm512_load_ps(st->o[h] + d);
        for (int i = 0; i < nk; i++) {
            const __m512 vv = _mm512_loadu_ps(vr[i] + d);
#pragma GCC unroll 16
            for (int h = 0; h < HB; h++)
                acc[h] = _mm512_fmadd_ps(vv, _mm512_set1_ps(p[i][h]), acc[h]);
        }
#pragma GCC unroll 16
        for (int h = 0; h < HB; h++) _mm512_store_ps(st->o[h] + d, acc[h]);
    }
    _mm512_store_ps(st->m, m);
    _mm512_store_pd(st->l, l0);
    _mm512_store_pd(st->l + 8, l1);
}

AT_IN void at_finish(const cpu_att_args *a, const at_state *st) {
    for (int h = 0; h < a->hb; h++) {
        a->m[h] = st->m[h];
        a->l[h] = st->l[h];
        memcpy(a->o + h * a->Dh, st->o[h], (size_t)a->Dh * sizeof(float));
    }
}

/* n head groups over the same keys, stepped together: ATT_VK rows of every group before the next
 * rows, so groups that lie side by side in the cache rows (adjacent kv heads) read them as one
 * stream. Each group's arithmetic is what it runs alone. */
AT_IN void at_heads(const cpu_att_args *a, int n, int HB) {
    at_state st[CPU_ATT_NB];
    _Alignas(64) float kf[ATT_VK][CPU_ATT_DMAX];
    _Alignas(64) float vf[ATT_VK][CPU_ATT_DMAX];
    for (int t = 0; t < n; t++) at_init(&a[t], &st[t], HB);
    for (int64_t s = a->s0; s < a->s1; s += ATT_VK)
        for (int t = 0; t < n; t++) at_step(&a[t], &st[t], s, HB, kf, vf);
    for (int t = 0; t < n; t++) at_finish(&a[t], &st[t]);
}

AT_FN static void at_heads4(const cpu_att_args *a, int n) { at_heads(a, n, 4); }
AT_FN static void at_heads8(const cpu_att_args *a, int n) { at_heads(a, n, 8); }
AT_FN static void at_heads16(const cpu_att_args *a, int n) { at_heads(a, n, 16); }

void cpu_att_heads_avx512(const cpu_att_args *a, int n) {
    int hb = 0;
    for (int t = 0; t < n; t++) hb = a[t].hb > hb ? a[t].hb : hb;
    if (hb <= 4) at_heads4(a, n);
    else if (hb <= 8) at_heads8(a, n);
    else at_heads16(a, n);
}
#endif

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
