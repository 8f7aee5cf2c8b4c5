/* cpu_matmul.c - y = x W^T (dense and gathered by expert) and embedding lookup on the CPU.
 *
 * Promises: each weight block is streamed once per group of up to MM_TB x rows (dense) or once per
 * call per expert (gathered, up to MM_TB rows at a time), and each weight row once per
 * CPU_MM_ROWS x rows inside that; work is split over (weight block, row block) tasks, and every
 * output is computed the same way whatever task holds it, so results are bit-identical for any
 * n_threads (cpu_impl.h (3)). Up to 2 CPU_MM_ROWS x rows (decode, a speculative verify) take
 * weight blocks of about an eighth of a thread's share (rows_per_task): their tile streams 4
 * (2 x rows: 8) runs of consecutive rows at once, and runs of a few hundred rows keep the hardware
 * prefetchers streaming where 16-row blocks restarted them every 2 rows: a verify of two rows
 * reads its weights at decode's rate instead of at half of it.
 * BF16 prefill on AVX-512 (more than 2 CPU_MM_ROWS x rows) takes tasks of MM_PTB x rows by CPU_MM_PNB
 * weight rows through the kernel table's mm_rows (cpu_kernels.c: a panel that holds a chunk of x
 * in L1 while the block's weight rows stream past it), which reads x a quarter as often as 16-row
 * blocks did; its outputs are mm_tile's bits, so decode and verify rows still equal prefill's.
 * Dense panel tasks have it fetch each next tile of x rows into L2 (fetch_x); gathered ones fetch
 * the next weight block instead, for short segments (MM_PF_ROWS).
 * Index tensors are checked before anything is written: an id out of range gives CN_EINVAL.
 * NVFP4 weights read activations quantized once per call into the backend's scratch (cpu_impl.h:
 * CPU_XQ layout), so the per-token path allocates nothing once the scratch has grown.
 */
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "tensor/cpu/cpu_impl.h"

#define MM_TB 64  /* x rows per task */
#define MM_NB 16  /* weight rows per prefill task (16 of K <= 4096 bf16 stay in L2) */
#define MM_PTB 96 /* x rows per task of the kernel table's mm_rows (16 of its 6-row tiles) */
#define MM_NB_SHORT 1024 /* up to 2 CPU_MM_ROWS x rows: weight rows per task at most */
#define MM_SHORT_L2 (384 << 10) /* 5-8 x rows: bytes of a task's weight block at most */
/* Gathered panel tasks of at most this many x rows fetch the next task's weight block (mm_rows'
 * pf). A task's first tile waits on memory, so it weighs most in short segments: one thread,
 * 12 rows 95 -> 133-135 GFLOP/s per CPU second, 24 rows 124-137 -> 138-152, 48 within noise. In
 * the bench (quiet machine, 2048-token prompts) fetching for every task, and for the last dense
 * task on a block, measured 1.5-2.5% slower: with 48-96 rows the segment's x rows (up to 1 MiB)
 * and two weight blocks overfill the 1 MiB L2. */
#define MM_PF_ROWS 24

static cpu_wmat wmat_of(const cpu_ctx *c, const cn_tensor *w) {
    cpu_wmat m;
    m.data = (const char *)w->data;
    m.stride = w->stride[0];
    m.K = w->shape[1];
    m.dtype = w->dtype;
    m.scale = w->dtype == CN_F8_E4M3 ? w->scale : 1.0f; /* tensor.h (3): others carry 1 */
    if (w->dtype == CN_NVFP4) m.scale = w->scale * 0.5f; /* kernels use 2 * e2m1 */
    m.lut = c->e4m3_lut;
    m.lut8 = c->e8m0_lut;
    m.bs = NULL;
    m.bs_stride = 0;
    if (w->block_scale) {
        m.bs = (const uint8_t *)w->block_scale->data;
        m.bs_stride = w->block_scale->stride[0];
    }
    return m;
}

/* Weight rows per task: CPU_MM_PNB on the panel; MM_NB; or for up to 2 CPU_MM_ROWS x rows
 * (decode, a speculative verify of up to 7 drafts) the call's weight rows (`rows`: N, or N per
 * expert segment when gathered) / (8 n_threads) rounded down to a multiple of 8, within
 * [MM_NB, MM_NB_SHORT]: 8 tasks a thread (the pool's claims even them out) and the longest runs
 * that allows. A decode token's 6 experts of 1856 rows took 17 tasks each when counted by N
 * alone, each starting its streams cold: counted by all 11136 rows they take 3, and the call
 * read 1.07x faster (two threads, alternating in one process, median of 10). Past
 * CPU_MM_ROWS x rows a block is walked twice, the second time from L2: it is kept within
 * MM_SHORT_L2 bytes. */
static int64_t rows_per_task(const cpu_ctx *c, int64_t T, int64_t rows, int64_t row_bytes,
                             int panel) {
    if (panel) return CPU_MM_PNB;
    if (T > 2 * CPU_MM_ROWS) return MM_NB;
    int64_t nb = rows / (8 * (int64_t)c->n_threads);
    if (nb > MM_NB_SHORT) nb = MM_NB_SHORT;
    if (T > CPU_MM_ROWS && row_bytes > 0 && nb > MM_SHORT_L2 / row_bytes) nb = MM_SHORT_L2 / row_bytes;
    nb &= ~(int64_t)7;
    return nb > MM_NB ? nb : MM_NB;
}

/* ---- NVFP4 activations ---- */

typedef struct quant_job {
    const cpu_kernels *kern;
    const cn_tensor *x;
    int8_t *xq;
    int64_t K, row_bytes;
} quant_job;

static void quant_task(void *arg, int begin, int end) {
    const quant_job *j = arg;
    for (int r = begin; r < end; r++)
        j->kern->quant_nvfp4(cpu_row(j->x, r), j->K, j->xq + r * j->row_bytes);
}

/* Quantizes every row of x into xq (rows of CPU_XQ_BYTES(K), 64-byte aligned). */
static void quantize_rows(cpu_ctx *c, const cn_tensor *x, int8_t *xq) {
    quant_job j = {.kern = &c->kern, .x = x, .xq = xq, .K = x->shape[1]};
    j.row_bytes = CPU_XQ_BYTES(j.K);
    cpu_parallel(c, (int)x->shape[0], x->shape[0] * j.K * 4, quant_task, &j);
}

/* One tile of any weight format: x rows are float rows, or quantized rows when w is NVFP4. */
static void tile(const cpu_kernels *kern, const cpu_wmat *w, const float *const *xr,
                 const int8_t *const *xq, float *const *yr, int R, int64_t n0, int64_t n1) {
    switch (w->dtype) {
    case CN_NVFP4: kern->mm_nvfp4(w, xq, yr, R, n0, n1); break;
    case CN_MXFP8: kern->mm_mxfp8(w, xr, yr, R, n0, n1); break;
    default: kern->mm_tile(w, xr, yr, R, n0, n1); break;
    }
}

/* Whether a call of T x rows runs on the kernel table's mm_rows panel: prefill (more than
 * 2 CPU_MM_ROWS rows: fewer stream like decode, rows_per_task) of BF16 weights where the ISA has
 * one. */
static int use_panel(const cpu_ctx *c, int64_t T, cn_dtype dt) {
    return c->kern.mm_rows && T > 2 * CPU_MM_ROWS && dt == CN_BF16;
}

/* ---- dense ---- */

typedef struct mm_job {
    const cpu_kernels *kern;
    cpu_wmat w;
    const cn_tensor *x, *y;
    const int8_t *xq; /* quantized x rows (NVFP4), else NULL */
    int64_t xq_bytes; /* bytes per quantized row */
    int64_t T, N;
    int64_t nb; /* weight rows per task */
    int n_tb;   /* row blocks */
    int panel;  /* use_panel */
} mm_job;

static void mm_task(void *arg, int begin, int end) {
    const mm_job *j = arg;
    for (int i = begin; i < end; i++) {
        /* consecutive tasks share a weight block, so a thread's range reuses it from cache */
        int64_t nb = i / j->n_tb, tb = i % j->n_tb;
        int64_t n0 = nb * j->nb, n1 = n0 + j->nb < j->N ? n0 + j->nb : j->N;
        const int64_t tbr = j->panel ? MM_PTB : MM_TB;
        int64_t t0 = tb * tbr, t1 = t0 + tbr < j->T ? t0 + tbr : j->T;
        if (j->panel) {
            const float *xr[MM_PTB];
            float *yr[MM_PTB];
            for (int64_t t = t0; t < t1; t++) {
                xr[t - t0] = cpu_row(j->x, t);
                yr[t - t0] = cpu_row(j->y, t);
            }
            j->kern->mm_rows(&j->w, xr, yr, (int)(t1 - t0), n0, n1, NULL, 0, 1);
            continue;
        }
        for (int64_t t = t0; t < t1; t += CPU_MM_ROWS) {
            const float *xr[CPU_MM_ROWS];
            const int8_t *xq[CPU_MM_ROWS] = {NULL};
            float *yr[CPU_MM_ROWS];
            int R = t1 - t < CPU_MM_ROWS ? (int)(t1 - t) : CPU_MM_ROWS;
            for (int r = 0; r < R; r++) {
                xr[r] = cpu_row(j->x, t + r);
                if (j->xq) xq[r] = j->xq + (t + r) * j->xq_bytes;
                yr[r] = cpu_row(j->y, t + r);
            }
            tile(j->kern, &j->w, xr, xq, yr, R, n0, n1);
        }
    }
}

int cpu_matmul(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    cpu_ctx *c = cpu_ctx_of(b);
    mm_job j = {.kern = &c->kern, .w = wmat_of(c, w), .x = x, .y = y};
    j.T = x->shape[0];
    j.N = w->shape[0];
    if (j.T == 0 || j.N == 0) return CN_OK;
    if (w->dtype == CN_NVFP4) {
        j.xq_bytes = CPU_XQ_BYTES(j.w.K);
        int8_t *xq = cpu_scratch(c, (size_t)(j.T * j.xq_bytes));
        if (!xq) return CN_ENOMEM;
        quantize_rows(c, x, xq);
        j.xq = xq;
    }
    j.panel = use_panel(c, j.T, w->dtype);
    const int64_t tbr = j.panel ? MM_PTB : MM_TB;
    j.n_tb = (int)((j.T + tbr - 1) / tbr);
    j.nb = rows_per_task(c, j.T, j.N, j.w.stride, j.panel);
    int n_nb = (int)((j.N + j.nb - 1) / j.nb);
    cpu_parallel(c, n_nb * j.n_tb, j.T * j.N * j.w.K, mm_task, &j);
    return CN_OK;
}

/* ---- gathered by expert ---- */

typedef struct gather_seg {
    int expert;
    int begin, end; /* positions in `order` */
} gather_seg;

typedef struct gather_job {
    const cpu_ctx *c;
    const cn_tensor *const *w;
    const cn_tensor *x, *y;
    int k;           /* ids per token */
    int x_per_token; /* x has T rows (1) or T*k rows (0) */
    int64_t N;
    int64_t nb; /* weight rows per task */
    int n_nb;
    const int *order; /* output rows sorted by expert, stable */
    const gather_seg *segs;
    const int8_t *xq; /* x rows quantized when some expert is NVFP4, else NULL */
    int64_t xq_bytes;
    int panel; /* every expert runs on mm_rows (use_panel) */
} gather_job;

static void gather_task(void *arg, int begin, int end) {
    const gather_job *j = arg;
    for (int i = begin; i < end; i++) {
        const gather_seg *s = &j->segs[i / j->n_nb];
        int64_t n0 = (int64_t)(i % j->n_nb) * j->nb;
        int64_t n1 = n0 + j->nb < j->N ? n0 + j->nb : j->N;
        cpu_wmat w = wmat_of(j->c, j->w[s->expert]);
        if (j->panel) {
            const float *xr[MM_PTB];
            float *yr[MM_PTB];
            for (int p = s->begin; p < s->end; p++) {
                int row = j->order[p];
                xr[p - s->begin] = cpu_row(j->x, j->x_per_token ? row / j->k : row);
                yr[p - s->begin] = cpu_row(j->y, row);
            }
            /* each task has its own weight block: a short segment fetches the next task's
             * while it computes, instead of that task stalling on memory in its first tile
             * (MM_PF_ROWS) */
            const char *pf = NULL;
            int64_t pf_bytes = 0;
            if (i + 1 < end && s->end - s->begin <= MM_PF_ROWS) {
                const cn_tensor *wn = j->w[j->segs[(i + 1) / j->n_nb].expert];
                int64_t m0 = (int64_t)((i + 1) % j->n_nb) * j->nb;
                int64_t m1 = m0 + j->nb < j->N ? m0 + j->nb : j->N;
                pf = (const char *)wn->data + m0 * wn->stride[0];
                pf_bytes = (m1 - m0) * wn->stride[0];
            }
            j->c->kern.mm_rows(&w, xr, yr, s->end - s->begin, n0, n1, pf, pf_bytes, 0);
            continue;
        }
        for (int p = s->begin; p < s->end; p += CPU_MM_ROWS) {
            const float *xr[CPU_MM_ROWS];
            const int8_t *xq[CPU_MM_ROWS] = {NULL};
            float *yr[CPU_MM_ROWS];
            int R = s->end - p < CPU_MM_ROWS ? s->end - p : CPU_MM_ROWS;
            for (int r = 0; r < R; r++) {
                int row = j->order[p + r];
                int64_t xrow = j->x_per_token ? row / j->k : row;
                xr[r] = cpu_row(j->x, xrow);
                if (j->xq) xq[r] = j->xq + xrow * j->xq_bytes;
                yr[r] = cpu_row(j->y, row);
            }
            tile(&j->c->kern, &w, xr, xq, yr, R, n0, n1);
        }
    }
}

int cpu_matmul_gather(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                      const cn_tensor *x, const cn_tensor *ids) {
    cpu_ctx *c = cpu_ctx_of(b);
    const int64_t T = ids->shape[0], k = ids->shape[1], rows = T * k;
    if (rows == 0 || y->shape[1] == 0) return CN_OK;
    if (rows > INT32_MAX / 4) return CN_EINVAL;
    /* scratch: quantized x [x rows] (when an expert is NVFP4), count/start [n_w + 1],
     * order [rows], segs [<= rows + n_w] */
    int any_fp4 = 0;
    for (int e = 0; e < n_w; e++) any_fp4 |= w[e]->dtype == CN_NVFP4;
    const int64_t xq_bytes = any_fp4 ? CPU_XQ_BYTES(x->shape[1]) : 0;
    const size_t xq_total = (size_t)(x->shape[0] * xq_bytes);
    size_t n_segs_max = (size_t)rows + (size_t)n_w;
    size_t bytes = xq_total + ((size_t)n_w + 1 + (size_t)rows) * sizeof(int) + 8 +
                   n_segs_max * sizeof(gather_seg);
    char *mem = cpu_scratch(c, bytes);
    if (!mem) return CN_ENOMEM;
    int8_t *xq = any_fp4 ? (int8_t *)mem : NULL;
    mem += xq_total; /* a multiple of 64 */
    int *start = (int *)mem;
    int *order = start + n_w + 1;
    gather_seg *segs = (gather_seg *)(((uintptr_t)(order + rows) + 7) & ~(uintptr_t)7);

    /* counting sort of output rows by expert; ids are read row by row (ids may be a view) */
    memset(start, 0, ((size_t)n_w + 1) * sizeof(int));
    for (int64_t t = 0; t < T; t++) {
        const int32_t *id = (const int32_t *)((const char *)ids->data + t * ids->stride[0]);
        for (int64_t jj = 0; jj < k; jj++) {
            if (id[jj] < 0 || id[jj] >= n_w) return CN_EINVAL;
            start[id[jj] + 1]++;
        }
    }
    for (int e = 0; e < n_w; e++) start[e + 1] += start[e];
    int panel = 1;
    for (int e = 0; e < n_w; e++) panel &= use_panel(c, T, w[e]->dtype);
    const int seg = panel ? MM_PTB : MM_TB;
    int n_segs = 0;
    for (int e = 0; e < n_w; e++) /* segments of <= seg rows, in expert order */
        for (int p = start[e]; p < start[e + 1]; p += seg) {
            segs[n_segs].expert = e;
            segs[n_segs].begin = p;
            segs[n_segs].end = start[e + 1] - p < seg ? start[e + 1] : p + seg;
            n_segs++;
        }
    for (int64_t t = 0; t < T; t++) { /* start[e] becomes the next free slot of expert e */
        const int32_t *id = (const int32_t *)((const char *)ids->data + t * ids->stride[0]);
        for (int64_t jj = 0; jj < k; jj++) order[start[id[jj]]++] = (int)(t * k + jj);
    }

    if (xq) quantize_rows(c, x, xq); /* after the id check: on error nothing was computed */
    gather_job j = {.c = c, .w = w, .x = x, .y = y, .k = (int)k, .order = order, .segs = segs,
                    .xq = xq, .xq_bytes = xq_bytes};
    j.x_per_token = x->shape[0] == T; /* with k == 1 both readings agree */
    j.N = y->shape[1];
    j.panel = panel;
    j.nb = rows_per_task(c, T, j.N * n_segs, w[0]->stride[0], j.panel);
    j.n_nb = (int)((j.N + j.nb - 1) / j.nb);
    cpu_parallel(c, n_segs * j.n_nb, rows * j.N * x->shape[1], gather_task, &j);
    return CN_OK;
}

/* ---- embedding lookup ---- */

int cpu_get_rows(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids) {
    cpu_ctx *c = cpu_ctx_of(b);
    const int64_t T = y->shape[0], H = y->shape[1], V = table->shape[0];
    const int32_t *id = (const int32_t *)ids->data; /* [T], contiguous */
    for (int64_t t = 0; t < T; t++)
        if (id[t] < 0 || id[t] >= V) return CN_EINVAL;
    cpu_wmat w = wmat_of(c, table);
    for (int64_t t = 0; t < T; t++) {
        const char *src = w.data + (int64_t)id[t] * w.stride;
        float *dst = cpu_row(y, t);
        if (table->dtype == CN_F32) {
            memcpy(dst, src, (size_t)H * sizeof(float));
            continue;
        }
        if (table->dtype == CN_NVFP4 || table->dtype == CN_MXFP8) {
            for (int64_t i = 0; i < H; i++) dst[i] = cpu_wvalue_scaled(&w, id[t], i);
            continue;
        }
        for (int64_t i = 0; i < H; i++) dst[i] = cpu_wvalue(&w, src, i) * w.scale;
    }
    return CN_OK;
}
