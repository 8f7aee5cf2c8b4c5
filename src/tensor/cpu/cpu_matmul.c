/* cpu_matmul.c - y = x W^T (dense and gathered by expert) and embedding lookup on the CPU.
 *
 * Promises: each weight block is streamed once per group of up to MM_TB x rows (dense) or once per
 * call per expert (gathered, up to MM_TB rows at a time), and each weight row once per
 * CPU_MM_ROWS x rows inside that; work is split over (weight block, row block) tasks that do not
 * depend on the thread count, so results are bit-identical for any n_threads (cpu_impl.h (3)).
 * Index tensors are checked before anything is written: an id out of range gives CN_EINVAL.
 * NVFP4 weights read activations quantized once per call into the backend's scratch (cpu_impl.h:
 * CPU_XQ layout), so the per-token path allocates nothing once the scratch has grown. Where the
 * ISA has an NVFP4 panel kernel, calls of >= CPU_PANEL_MIN_T rows (dense) and experts holding that
 * many rows (gathered) split by weight panels of CPU_PANEL_ROWS rows instead, each task decoding
 * its panel once into a panel buffer of the same scratch and running every row of x over it.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "tensor/cpu/cpu_impl.h"

#define MM_NB 16 /* weight rows per task: 16 rows of K <= 4096 bf16 stay in L2 across row groups */
#define MM_TB 64 /* x rows per task */
_Static_assert(MM_NB == CPU_PANEL_ROWS, "a gathered task is one weight panel");

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

/* ---- NVFP4 weight panels (prefill) ----
 * Each task decodes one panel of CPU_PANEL_ROWS weight rows into a panel buffer that no other
 * running task uses: buffers are claimed from `n_slots` (the pool's thread count: at most that
 * many tasks run at once) and given back when the task ends. */

typedef struct panel_slots {
    char *mem; /* [n] panels of `bytes` each, 64-byte aligned */
    size_t bytes;
    _Atomic int *busy; /* [n] */
    int n;
} panel_slots;

static size_t panel_slots_bytes(int n, int64_t K) {
    size_t b = (size_t)n * (size_t)CPU_PANEL_BYTES(K) + (size_t)n * sizeof(_Atomic int);
    return (b + 63) & ~(size_t)63; /* what follows stays 64-byte aligned */
}

/* Lays out n panels and their flags at mem (64-byte aligned, panel_slots_bytes long). */
static panel_slots panel_slots_at(char *mem, int n, int64_t K) {
    panel_slots ps = {.mem = mem, .bytes = (size_t)CPU_PANEL_BYTES(K), .n = n};
    ps.busy = (_Atomic int *)(mem + (size_t)n * ps.bytes);
    for (int i = 0; i < n; i++) atomic_init(&ps.busy[i], 0);
    return ps;
}

static int panel_take(const panel_slots *ps) {
    for (;;) /* one is free: no more than n tasks hold one */
        for (int i = 0; i < ps->n; i++)
            if (!atomic_exchange_explicit(&ps->busy[i], 1, memory_order_acquire)) return i;
}

static void panel_give(const panel_slots *ps, int i) {
    atomic_store_explicit(&ps->busy[i], 0, memory_order_release);
}

/* One panel of rows [n0, n1) of w against T quantized x rows. */
static void panel_run(const cpu_kernels *kern, const panel_slots *ps, const cpu_wmat *w,
                      const int8_t *const *xq, float *const *yr, int T, int64_t n0, int64_t n1) {
    int slot = panel_take(ps);
    kern->mm_nvfp4_panel(w, xq, yr, T, n0, n1, ps->mem + (size_t)slot * ps->bytes);
    panel_give(ps, slot);
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

/* ---- dense ---- */

typedef struct mm_job {
    const cpu_kernels *kern;
    cpu_wmat w;
    const cn_tensor *x, *y;
    const int8_t *xq; /* quantized x rows (NVFP4), else NULL */
    int64_t xq_bytes; /* bytes per quantized row */
    int64_t T, N;
    int n_tb; /* row blocks */
    /* NVFP4 panel path (panel kernel present and T >= CPU_PANEL_MIN_T), else xp == NULL: */
    const int8_t *const *xp; /* [T] quantized rows */
    float *const *yp;        /* [T] output rows */
    panel_slots ps;
} mm_job;

static void mm_panel_task(void *arg, int begin, int end) {
    const mm_job *j = arg;
    for (int i = begin; i < end; i++) {
        int64_t n0 = (int64_t)i * CPU_PANEL_ROWS;
        int64_t n1 = n0 + CPU_PANEL_ROWS < j->N ? n0 + CPU_PANEL_ROWS : j->N;
        panel_run(j->kern, &j->ps, &j->w, j->xp, j->yp, (int)j->T, n0, n1);
    }
}

static void mm_task(void *arg, int begin, int end) {
    const mm_job *j = arg;
    for (int i = begin; i < end; i++) {
        /* consecutive tasks share a weight block, so a thread's range reuses it from cache */
        int64_t nb = i / j->n_tb, tb = i % j->n_tb;
        int64_t n0 = nb * MM_NB, n1 = n0 + MM_NB < j->N ? n0 + MM_NB : j->N;
        int64_t t0 = tb * MM_TB, t1 = t0 + MM_TB < j->T ? t0 + MM_TB : j->T;
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
        const size_t xq_total = (size_t)(j.T * j.xq_bytes); /* a multiple of 64 */
        const int panels = c->kern.mm_nvfp4_panel && j.T >= CPU_PANEL_MIN_T && j.T <= INT32_MAX;
        /* scratch: xq [T rows], then for panels: panel slots, row pointers xp [T], yp [T] */
        size_t slots_bytes = panels ? panel_slots_bytes(c->n_threads, j.w.K) : 0;
        size_t bytes = xq_total + slots_bytes + (panels ? (size_t)j.T * 2 * sizeof(void *) : 0);
        char *mem = cpu_scratch(c, bytes);
        if (!mem) return CN_ENOMEM;
        int8_t *xq = (int8_t *)mem;
        quantize_rows(c, x, xq);
        j.xq = xq;
        if (panels) {
            j.ps = panel_slots_at(mem + xq_total, c->n_threads, j.w.K);
            const int8_t **xp = (const int8_t **)(mem + xq_total + slots_bytes);
            float **yp = (float **)(xp + j.T);
            for (int64_t t = 0; t < j.T; t++) {
                xp[t] = xq + t * j.xq_bytes;
                yp[t] = cpu_row(y, t);
            }
            j.xp = xp;
            j.yp = yp;
            int n_pb = (int)((j.N + CPU_PANEL_ROWS - 1) / CPU_PANEL_ROWS);
            cpu_parallel(c, n_pb, j.T * j.N * j.w.K, mm_panel_task, &j);
            return CN_OK;
        }
    }
    j.n_tb = (int)((j.T + MM_TB - 1) / MM_TB);
    int n_nb = (int)((j.N + MM_NB - 1) / MM_NB);
    cpu_parallel(c, n_nb * j.n_tb, j.T * j.N * j.w.K, mm_task, &j);
    return CN_OK;
}

/* ---- gathered by expert ---- */

typedef struct gather_seg {
    int expert;
    int begin, end; /* positions in `order` */
    int panel;      /* all of the expert's rows, through the NVFP4 panel kernel */
} gather_seg;

typedef struct gather_job {
    const cpu_ctx *c;
    const cn_tensor *const *w;
    const cn_tensor *x, *y;
    int k;           /* ids per token */
    int x_per_token; /* x has T rows (1) or T*k rows (0) */
    int64_t N;
    int n_nb;
    const int *order; /* output rows sorted by expert, stable */
    const gather_seg *segs;
    const int8_t *xq; /* x rows quantized when some expert is NVFP4, else NULL */
    int64_t xq_bytes;
    const int8_t *const *xp; /* [rows] in `order`: quantized x rows, when some segment is a panel */
    float *const *yp;        /* [rows] in `order`: output rows */
    panel_slots ps;
} gather_job;

static void gather_task(void *arg, int begin, int end) {
    const gather_job *j = arg;
    for (int i = begin; i < end; i++) {
        const gather_seg *s = &j->segs[i / j->n_nb];
        int64_t n0 = (int64_t)(i % j->n_nb) * MM_NB;
        int64_t n1 = n0 + MM_NB < j->N ? n0 + MM_NB : j->N;
        cpu_wmat w = wmat_of(j->c, j->w[s->expert]);
        if (s->panel) { /* MM_NB == CPU_PANEL_ROWS */
            panel_run(&j->c->kern, &j->ps, &w, j->xp + s->begin, j->yp + s->begin,
                      s->end - s->begin, n0, n1);
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
    /* panels for NVFP4 experts with at least CPU_PANEL_MIN_T rows: slots, xp [rows], yp [rows] */
    const int panels = any_fp4 && c->kern.mm_nvfp4_panel && rows >= CPU_PANEL_MIN_T;
    const size_t slots_bytes = panels ? panel_slots_bytes(c->n_threads, x->shape[1]) : 0;
    const size_t ptr_bytes = panels ? (size_t)rows * 2 * sizeof(void *) : 0;
    size_t n_segs_max = (size_t)rows + (size_t)n_w;
    size_t bytes = xq_total + slots_bytes + ptr_bytes +
                   ((size_t)n_w + 1 + (size_t)rows) * sizeof(int) + 8 +
                   n_segs_max * sizeof(gather_seg);
    char *mem = cpu_scratch(c, bytes);
    if (!mem) return CN_ENOMEM;
    int8_t *xq = any_fp4 ? (int8_t *)mem : NULL;
    mem += xq_total; /* a multiple of 64 */
    char *slots_mem = mem;
    mem += slots_bytes; /* a multiple of 8 */
    const int8_t **xp = (const int8_t **)mem;
    float **yp = (float **)(xp + (panels ? rows : 0));
    mem += ptr_bytes;
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
    int n_segs = 0;
    for (int e = 0; e < n_w; e++) { /* in expert order: one panel segment, or <= MM_TB rows each */
        if (panels && w[e]->dtype == CN_NVFP4 && start[e + 1] - start[e] >= CPU_PANEL_MIN_T) {
            segs[n_segs++] = (gather_seg){.expert = e, .begin = start[e], .end = start[e + 1],
                                          .panel = 1};
            continue;
        }
        for (int p = start[e]; p < start[e + 1]; p += MM_TB) {
            segs[n_segs].expert = e;
            segs[n_segs].begin = p;
            segs[n_segs].end = start[e + 1] - p < MM_TB ? start[e + 1] : p + MM_TB;
            segs[n_segs].panel = 0;
            n_segs++;
        }
    }
    for (int64_t t = 0; t < T; t++) { /* start[e] becomes the next free slot of expert e */
        const int32_t *id = (const int32_t *)((const char *)ids->data + t * ids->stride[0]);
        for (int64_t jj = 0; jj < k; jj++) order[start[id[jj]]++] = (int)(t * k + jj);
    }

    if (xq) quantize_rows(c, x, xq); /* after the id check: on error nothing was computed */
    gather_job j = {.c = c, .w = w, .x = x, .y = y, .k = (int)k, .order = order, .segs = segs,
                    .xq = xq, .xq_bytes = xq_bytes};
    j.x_per_token = x->shape[0] == T; /* with k == 1 both readings agree */
    if (panels) {
        for (int64_t p = 0; p < rows; p++) {
            int row = order[p];
            xp[p] = xq + (j.x_per_token ? row / k : row) * xq_bytes;
            yp[p] = cpu_row(y, row);
        }
        j.xp = xp;
        j.yp = yp;
        j.ps = panel_slots_at(slots_mem, c->n_threads, x->shape[1]);
    }
    j.N = y->shape[1];
    j.n_nb = (int)((j.N + MM_NB - 1) / MM_NB);
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
