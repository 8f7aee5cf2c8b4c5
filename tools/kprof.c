/* kprof.c - a kernel-time profile for machines without Nsight Systems: a CUPTI injection library
 * that records every kernel and memcpy of a CUDA process and prints, at exit, the time per kernel
 * name (total, share, count, mean), the busy time, and the idle gaps between consecutive device
 * activities shorter than 1 ms (the host waiting on the device or launching, inside a phase;
 * longer gaps are between phases of the run and not counted).
 *
 * Build and use (the CUDA toolkit's CUPTI; $CUPTI_LIB is where libcupti.so lives):
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include tools/kprof.c -o kprof.so -L$CUPTI_LIB -lcupti
 *   CUDA_INJECTION64_PATH=$PWD/kprof.so LD_LIBRARY_PATH=$CUPTI_LIB build-cuda/cairn bench ...
 * The profile goes to stderr, or to $KPROF_OUT when set; with $KPROF_GRID set each launch shape
 * (grid and block size) of a kernel is its own row. A development tool: never linked into
 * cairn, and it changes nothing in the profiled process but the time its tracing costs.
 */
#define _POSIX_C_SOURCE 200809L
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KP_NAMES 512
#define KP_BUF (8u << 20)

typedef struct kp_name {
    char *name;
    uint64_t ns, n;
} kp_name;

typedef struct kp_span {
    uint64_t start, end;
} kp_span;

/* CUPTI calls back with no user pointer, so the profile is one process-wide record. */
static struct {
    kp_name names[KP_NAMES];
    int n_names;
    kp_span *spans;
    size_t n_spans, cap_spans;
    uint64_t memcpy_ns, memcpy_n;
    int by_grid; /* $KPROF_GRID set: kernels keyed by grid and block size too */
} g_kp;

static void kp_add_span(uint64_t s, uint64_t e) {
    if (g_kp.n_spans == g_kp.cap_spans) {
        size_t cap = g_kp.cap_spans ? 2 * g_kp.cap_spans : 1u << 16;
        kp_span *p = realloc(g_kp.spans, cap * sizeof *p);
        if (!p) return;
        g_kp.spans = p;
        g_kp.cap_spans = cap;
    }
    g_kp.spans[g_kp.n_spans++] = (kp_span){s, e};
}

static void kp_add_kernel(const char *name, uint64_t ns) {
    for (int i = 0; i < g_kp.n_names; i++)
        if (!strcmp(g_kp.names[i].name, name)) {
            g_kp.names[i].ns += ns;
            g_kp.names[i].n++;
            return;
        }
    if (g_kp.n_names == KP_NAMES) return;
    kp_name *k = &g_kp.names[g_kp.n_names++];
    k->name = strdup(name ? name : "?");
    k->ns = ns;
    k->n = 1;
}

static void CUPTIAPI kp_buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, KP_BUF);
    *size = *buf ? KP_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kp_buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                     size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            if (g_kp.by_grid) { /* one row per kernel and launch shape */
                char key[512];
                snprintf(key, sizeof key, "(%d,%d,%d)x%d %.440s", k->gridX, k->gridY, k->gridZ,
                         k->blockX, k->name ? k->name : "?");
                kp_add_kernel(key, k->end - k->start);
            } else {
                kp_add_kernel(k->name, k->end - k->start);
            }
            kp_add_span(k->start, k->end);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            g_kp.memcpy_ns += m->end - m->start;
            g_kp.memcpy_n++;
            kp_add_span(m->start, m->end);
        }
    }
    free(buf);
}

static int kp_by_time(const void *a, const void *b) {
    const kp_name *x = a, *y = b;
    return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

static int kp_by_start(const void *a, const void *b) {
    const kp_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void kp_report(void) {
    cuptiActivityFlushAll(1);
    FILE *f = stderr;
    const char *path = getenv("KPROF_OUT");
    if (path && !(f = fopen(path, "w"))) f = stderr;
    uint64_t total = 0;
    for (int i = 0; i < g_kp.n_names; i++) total += g_kp.names[i].ns;
    qsort(g_kp.names, (size_t)g_kp.n_names, sizeof *g_kp.names, kp_by_time);
    qsort(g_kp.spans, g_kp.n_spans, sizeof *g_kp.spans, kp_by_start);
    uint64_t busy = 0, gaps = 0, n_gaps = 0, end = 0;
    for (size_t i = 0; i < g_kp.n_spans; i++) {
        const kp_span s = g_kp.spans[i];
        if (i && s.start > end) {
            const uint64_t g = s.start - end;
            if (g < 1000000) {
                gaps += g;
                n_gaps++;
            }
        }
        const uint64_t from = i && s.start < end ? end : s.start;
        if (s.end > from) busy += s.end - from;
        if (s.end > end) end = s.end;
    }
    fprintf(f, "kprof: kernels %.3f ms, memcpy %.3f ms (%llu), device busy %.3f ms, "
               "idle gaps < 1 ms: %.3f ms in %llu\n",
            total / 1e6, g_kp.memcpy_ns / 1e6, (unsigned long long)g_kp.memcpy_n, busy / 1e6,
            gaps / 1e6, (unsigned long long)n_gaps);
    fprintf(f, "%8s %6s %8s %10s  %s\n", "ms", "share", "count", "mean_us", "kernel");
    for (int i = 0; i < g_kp.n_names; i++) {
        const kp_name *k = &g_kp.names[i];
        fprintf(f, "%8.3f %6.3f %8llu %10.2f  %.150s\n", k->ns / 1e6, total ? (double)k->ns / total : 0,
                (unsigned long long)k->n, k->ns / 1e3 / (double)k->n, k->name);
    }
    if (f != stderr) fclose(f);
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void) {
    g_kp.by_grid = getenv("KPROF_GRID") != NULL;
    if (cuptiActivityRegisterCallbacks(kp_buf_request, kp_buf_complete) != CUPTI_SUCCESS) return 0;
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    atexit(kp_report);
    return 1;
}
