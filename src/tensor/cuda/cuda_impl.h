/* cuda_impl.h - private to src/tensor/cuda: the CUDA backend's context, helpers shared by its .cu
 * files (error mapping, launch checks, device scratch, weight loads) and the op entry points that
 * cuda_backend.cu puts in the iface table.
 *
 * Invariants:
 *  (1) Every op queues its kernels on ctx->stream and returns without waiting, except the ops that
 *      take index tensors (get_rows, matmul_gather): they check the ids on the device, kernels that
 *      write skip all writes when a check failed, and the op waits for the 4-byte verdict so that
 *      it can return CN_EINVAL with nothing written (backend.h's contract); inside a step the
 *      verdict waits for step_end (5).
 *  (2) `scratch` is device memory owned by the context; it is only grown between ops, after the
 *      stream is idle (cudaFree synchronizes), so a queued kernel never sees it freed; inside a
 *      captured step the old buffer is retired instead (5).
 *  (3) Weights uploaded by the `weight` hook are listed in `weights` and freed with the backend.
 *  (4) Sums are fp32 (norm sums of squares in double, as on the CPU); no TF32 and no fast-math
 *      intrinsics, so results differ from the CPU backend by rounding order, except GEMMs on
 *      tensor cores: they split each fp32 activation into two bf16 terms (x = t0 + t1 up to
 *      2^-18 |x|, t1 the bf16 rounding of x - t0) and sum both products in fp32, at 2x the
 *      tensor-core work of a plain bf16 GEMM. Each product is then within 2^-18 of the fp32 one,
 *      with random signs: 7.4e-6 of max |y| at K = 2688 on the H200 (test_cuda_ops), inside the
 *      per-op tolerance 2e-5 that a third term (2^-27) was kept for before; test_forward's logits stay
 *      within 1.2e-5 of the goldens (tolerance 1e-4). Attention on tensor cores
 *      (cuda_attention_prefill.cu) splits q, the cache rows and the probabilities the same way.
 *  (5) Steps (backend.h): between step_begin and step_end `in_step` is set, the ids-check flag is
 *      reset once at the start of the step (inside it, when captured) and read once at step_end;
 *      cu_flag_reset/cu_flag_read do nothing inside a step. When `graphs` is on the stream is in
 *      relaxed capture mode for the whole step: nothing may wait for the stream or free memory
 *      the recorded work might use, so cu_scratch grows by retiring the old buffer (freed at
 *      step_end after the step ran) and host transfers are refused with CN_EBUSY.
 *      Replay (backend.h (d)): a step begun at a position writes that position to `par_host` and
 *      queues one 4-byte copy of it into `par_dev` before the step (outside any capture); its
 *      position arguments reach the kernels as `par_dev` plus the recorded delta (cu_pos), in
 *      the eager path too, so replayed and eager steps run the same kernels on the same values.
 *      Attention's split-K grid is then sized for a bucket (the chunk count rounded up to a
 *      power of two, or the most spans; each span's chunks come from the real length on the
 *      device, as the call outside a step with that length cuts them, so sums are unchanged),
 *      and the capture records the highest position its grid serves (`pos_max`).
 *      A slot replays (cudaGraphLaunch, no capture, no update) when key and tag match, the pos
 *      fits pos_max and `epoch` is unchanged since its capture: the epoch grows whenever device
 *      memory a graph may point to is freed or moved (scratch regrown, a tensor released).
 *  (6) `ep_cnt`, `am_cnt` and `rt_cnt` are zero between launches: a kernel that counts its blocks
 *      there (the combining GEMV epilogue, argmax, the fused router) has the last block merge the
 *      others' partials from
 *      scratch in a fixed order and set its counter back to 0, so graphs replay them as they are
 *      and results do not depend on which block finished last.
 *  (7) Every kernel is queued with cu_launch, as a programmatic dependent launch where the device
 *      has it (sm_90; `pdl`, off with $CAIRN_CUDA_PDL=0 at create): the stream may start a kernel
 *      while the one before it still runs, so each kernel calls cu_pdl_enter() before it reads
 *      or writes anything another kernel touches; the enter waits for the kernels before it to
 *      finish (their writes visible) and lets the next one start. Before it a kernel may only read
 *      weights (which no kernel writes): a dense decode GEMV's first weight chunks and every GEMV's
 *      norm weights are then on their way while the previous kernel drains. Since every kernel
 *      enters in every block before it returns, and so lets the next start only once the ones
 *      before it have finished, a kernel starting early overlaps only the one just before it
 *      (copies between kernels are waited for whole): if that one declared what it writes
 *      (cu_wrote), anything else is settled (cu_settled) and may be read before the enter too,
 *      through L2 (__ldcg): a MoE's down product reads its ids so, a decode step's conv and scan
 *      their states. Forks, joins and steps forget the declarations.
 *  (8) Lanes: `stream`, `blas` and the scratch buffer follow the current lane (a cuBLAS handle
 *      and a scratch buffer per lane: neither may serve two streams at once); a fork records ev_fork
 *      on the main stream and makes the side stream wait for it, a join records ev_join on the
 *      side stream and makes the main one wait; inside a captured step both streams are in the
 *      capture through those events, and step_end joins first. Only the combining epilogue's
 *      counters (`ep_cnt`) and argmax's are shared: ops that use them stay on the main lane.
 */
#ifndef CN_CUDA_IMPL_H
#define CN_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <initializer_list>
#include <utility>

extern "C" {
#include "base/error.h"
#include "base/log.h"
#include "tensor/backend_impl.h"
#include "tensor/cuda/cuda_backend.h"
}

/* A device table of the experts of one matmul_gather weight list, cached by the host array. */
typedef struct cu_wtab {
    const cn_tensor *const *key; /* the caller's array (weights never move after load) */
    int n_w;
    const void **host_ptrs;      /* data pointers when built, to notice a changed array */
    void *dev;                   /* cu_wexp[n_w] on the device */
} cu_wtab;

/* One weight matrix (an expert, or a dense weight) as the GEMM kernels see it. */
typedef struct cu_wexp {
    const char *data;
    int64_t stride;          /* bytes per row */
    float scale;             /* applied to each output: F8 per tensor, NVFP4 global; else 1 */
    const unsigned char *bs; /* NVFP4 (E4M3 per 16) / MXFP8 (E8M0 per 32) block scales, or NULL */
    int64_t bs_stride;       /* bytes per row of bs */
} cu_wexp;

/* The executable graph last instantiated for one step key (invariant 5). */
typedef struct cu_graph {
    int key;
    cudaGraphExec_t exec; /* NULL when the slot is free */
    uint32_t *shape;      /* of the graph it was instantiated from (graph_shape): another, no update */
    size_t n_shape;
    uint64_t last_use;    /* step counter, to reuse the least recently used slot */
    int replayable;       /* captured as a positioned step (invariant 5) */
    uint64_t tag;         /* its tag */
    uint64_t epoch;       /* cu_ctx.epoch when it was captured */
    int64_t pos_max;      /* highest position its attention grids serve */
} cu_graph;

#define CU_GRAPH_SLOTS 4
#define CU_EP_COUNTERS 65536 /* tokens x output groups a combining epilogue may count */
#define CU_ARGMAX_ROWS 256   /* rows one argmax call takes (cuda_elementwise.cu) */

#define CU_WROTE_MAX 4
/* The byte ranges a kernel writes, declared after its launch (cu_wrote); n = 0: undeclared. */
typedef struct cu_wrote_t {
    int n;
    const char *p[CU_WROTE_MAX];
    size_t len[CU_WROTE_MAX];
} cu_wrote_t;

typedef struct cu_ctx {
    cn_backend_iface iface; /* the table this backend answers with (fused ops per `fused`) */
    int device;
    int n_sm;
    int g1_blocks[CN_DTYPE_COUNT]; /* k_gemv1's resident blocks per SM by weight dtype; 0 until asked */
    int fp4_blocks;                /* k_gemv_fp4's (cuda_gemv_fp4.cu), 0 until asked */
    cudaStream_t stream;
    cublasHandle_t blas;
    int *flag_dev;  /* device-side verdict of an ids check (invariant 1) */
    int *flag_host; /* pinned copy */
    void *scratch[2]; /* invariant 2, one buffer per lane (invariant 8), `lane` the current one */
    size_t scratch_cap[2];
    void **weights; /* invariant 3 */
    int n_weights, cap_weights;
    cu_wtab *tabs;
    int n_tabs, cap_tabs;
    /* steps (invariant 5) */
    int graphs;       /* record steps as CUDA graphs ($CAIRN_CUDA_GRAPHS=0 at create: eager) */
    int in_step;
    int capturing;
    int step_key;
    cu_graph slots[CU_GRAPH_SLOTS];
    int positioned;   /* the open step was begun at a position (invariant 5) */
    int step_pos;     /* its position */
    uint64_t step_tag;
    int64_t pos_max;  /* of the step being recorded: min over its attention calls */
    int *par_dev;     /* the position as kernels read it */
    int *par_host;    /* pinned source of its copy */
    uint64_t epoch;   /* grows when device memory a graph may use is freed or moved */
    void **retired;   /* device buffers to free once the step ran */
    int n_retired, cap_retired;
    cn_cuda_stats stats;
    int fused;        /* offer the fused decode ops ($CAIRN_CUDA_FUSED=0 at create: not) */
    int *ep_cnt;      /* [CU_EP_COUNTERS] zeroed, for combining epilogues (cuda_gemm.cu) */
    int *am_cnt;      /* [CU_ARGMAX_ROWS] zeroed, blocks done per row of argmax */
    int *rt_cnt;      /* [1] zeroed, blocks done of the fused router (cuda_moe.cu); one launch uses
                       * it at a time, on either lane: a layer routes once */
    struct cu_copy *copy; /* the copy stream and its fences (cuda_copy.cu); made at first use */
    int pdl;          /* invariant 7 */
    cu_wrote_t wrote[2]; /* per lane: what the last kernel queued there writes (invariant 7) */
    int settle;          /* read settled data early ($CAIRN_CUDA_SETTLED=0 at create: never) */
    /* lanes (backend.h; invariant 8) */
    cudaStream_t lanes[2]; /* main, side; `stream` is the current one */
    int use_lanes;         /* $CAIRN_CUDA_LANES=0 at create: forks run in order */
    int lane;              /* 0 or 1: which one `stream` is */
    int forked;            /* a fork is open (not joined) */
    cudaEvent_t ev_fork, ev_join;
    cublasHandle_t lane_blas[2]; /* one per lane, bound to its stream; `blas` is the current one */
} cu_ctx;

/* The context, with the backend's device made current for the calling thread (cheap when it
 * already is), so a backend on cuda:N works from any thread. */
static inline cu_ctx *cu_ctx_of(cn_backend *b) {
    cu_ctx *c = (cu_ctx *)b->ctx;
    cudaSetDevice(c->device);
    return c;
}

/* Queues kernel k on c->stream (invariant 7); the launch status is cu_launch_check's. */
template <typename... P, typename... A>
static inline void cu_launch(cu_ctx *c, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                             A... args) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = &at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, k, args...); /* the error stays for cu_launch_check */
    c->wrote[c->lane].n = 0; /* undeclared until cu_wrote says */
}

/* Declares, right after a cu_launch, the byte ranges [p, p + len) its kernel may write (at most
 * CU_WROTE_MAX; a NULL p is skipped): invariant 7. */
static inline void cu_wrote(cu_ctx *c, std::initializer_list<std::pair<const void *, size_t>> r) {
    cu_wrote_t &w = c->wrote[c->lane];
    w.n = 0;
    if (r.size() > CU_WROTE_MAX) return; /* undeclared */
    for (const auto &e : r) {
        w.p[w.n] = (const char *)e.first;
        w.len[w.n] = e.first ? e.second : 0;
        w.n++;
    }
}

/* Whether [p, p + len) is settled for the next kernel on the current lane: the last kernel queued
 * there declared its writes and none of them overlaps (invariant 7). */
static inline bool cu_settled(const cu_ctx *c, const void *p, size_t len) {
    const cu_wrote_t &w = c->wrote[c->lane];
    if (!c->settle || !w.n || !p) return false;
    const char *a = (const char *)p;
    for (int i = 0; i < w.n; i++)
        if (w.len[i] && a < w.p[i] + w.len[i] && w.p[i] < a + len) return false;
    return true;
}

/* The bytes from t->data its elements span (strides in bytes, none negative); SIZE_MAX less the
 * address for a dtype without an element size (all of memory from there: never settled). */
static inline size_t cu_extent(const cn_tensor *t) {
    const size_t e = cn_dtype_size(t->dtype);
    if (!e) return SIZE_MAX - (uintptr_t)t->data;
    size_t end = e;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return 0;
        end += (size_t)(t->shape[d] - 1) * (size_t)t->stride[d];
    }
    return end;
}

/* A kernel's entry into what other kernels touch (invariant 7): waits for the kernels queued
 * before it, then lets the next one launch. Every thread that reads or writes such memory
 * calls it first; without PDL both instructions return at once. */
__device__ __forceinline__ void cu_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Maps a CUDA error to a CN code and logs it (with `what`); cudaSuccess -> CN_OK. */
int cu_check(cudaError_t e, const char *what);
/* bf16 terms of an fp32 activation entering tensor cores (invariant 4). */
#define CU_SPLIT 2
/* Queues x (fp32 rows [T, K], any stride) -> CU_SPLIT bf16 planes [CU_SPLIT][T][K] packed: x =
 * t0 + t1 + O(2^-18 |x|), each term the bf16 rounding of what the previous ones left
 * (cuda_gemm.cu); returns the launch status. */
int cu_split_bf16(cu_ctx *c, const cn_tensor *x, __nv_bfloat16 *planes);

/* The launch status of the last kernel (cudaGetLastError), mapped as cu_check. */
int cu_launch_check(const char *what);
/* Device scratch of at least `bytes` (256-byte aligned), or NULL (invariant 2). */
void *cu_scratch(cu_ctx *c, size_t bytes);
/* Frees device memory now, or at step_end if a step is being recorded (invariant 5). */
void cu_free_later(cu_ctx *c, void *p);
/* A position argument of an op (backend.h (d)): inside a positioned step the device pointer to
 * the step's position, with *delta = value - pos; else NULL, with *delta = value. Kernels use
 * (p ? *p : 0) + delta. */
static inline const int *cu_pos(const cu_ctx *c, int value, int *delta) {
    if (!c->positioned) {
        *delta = value;
        return NULL;
    }
    *delta = value - c->step_pos;
    return c->par_dev;
}

/* Resets the ids-check flag (queued), and reads it back after the queued work (waits); inside a
 * step both do nothing and the flag reads 0 (the verdict comes from step_end, invariant 5). */
int cu_flag_reset(cu_ctx *c);
int cu_flag_read(cu_ctx *c, int *flag);

/* Row r of a 2D tensor. */
static inline float *cu_row(const cn_tensor *t, int64_t r) {
    return (float *)((char *)t->data + r * t->stride[0]);
}

/* Grid size for n items at `per` items per block, capped: only for grid-stride loops. */
static inline unsigned cu_blocks(int64_t n, int per) {
    int64_t b = (n + per - 1) / per;
    if (b < 1) b = 1;
    return b > 65535 * 16 ? 65535u * 16u : (unsigned)b;
}

/* Row-wise elementwise kernels: R rows of C columns, a row per blockIdx.y (strided by gridDim.y
 * past 65535 rows), its columns over blockIdx.x and the threads. A thread finds its (row,
 * column) without dividing a flat index (a 64-bit / and % are tens of instructions an element).
 * With the norms' block sizes (cuda_elementwise.cu), nano-shape slice prefill on the H200 went
 * from 106.9 to 108.8 thousand tok/s. */
static inline dim3 cu_rows_grid(int64_t R, int64_t C, int threads) {
    int64_t x = (C + threads - 1) / threads, y = R;
    if (x < 1) x = 1;
    if (x > 65535) x = 65535;
    if (y < 1) y = 1;
    if (y > 65535) y = 65535;
    return dim3((unsigned)x, (unsigned)y);
}
/* Threads a block for rows of C columns: 256, or C rounded up to a warp when smaller. */
static inline int cu_rows_threads(int64_t C) {
    return C >= 256 ? 256 : C <= 32 ? 32 : (int)((C + 31) / 32 * 32);
}
#define CU_FOR_ROWS(r, R) for (int64_t r = blockIdx.y; r < (R); r += gridDim.y)
#define CU_FOR_COLS(j, C)                                                                        \
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < (C);                    \
         j += (int64_t)gridDim.x * blockDim.x)

/* ---- device helpers ---- */

/* silu(v) = v / (1 + e^-v), the CPU backend's formula (the op, the gated norm, the GEMVs' gate). */
__device__ __forceinline__ float cu_silu_f(float v) { return v / (1.0f + expf(-v)); }

/* Four floats from p: one 16-byte load when vec (p 16-byte aligned), else four. */
__device__ __forceinline__ float4 cu_ld4(const float *p, bool vec) {
    return vec ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
}

/* e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7f/0xff NaN. */
__device__ __forceinline__ float cu_e4m3(unsigned v) {
    unsigned e = (v >> 3) & 0xfu, m = v & 0x7u;
    float r;
    if (e == 0xf && m == 0x7) r = __int_as_float(0x7fc00000);
    else if (e == 0) r = (float)m * 0.001953125f; /* m * 2^-9 */
    else r = __int_as_float((int)(((e + 120u) << 23) | (m << 20)));
    return (v & 0x80u) ? -r : r;
}

/* One weight value of dtype DT as f32 (not scaled). DT is a cn_dtype without block scales. */
template <int DT>
__device__ __forceinline__ float cu_wval(const char *row, int64_t k) {
    if (DT == CN_BF16) return __bfloat162float(((const __nv_bfloat16 *)row)[k]);
    if (DT == CN_F16) return __half2float(((const __half *)row)[k]);
    if (DT == CN_F8_E4M3) return cu_e4m3(((const unsigned char *)row)[k]);
    return ((const float *)row)[k];
}

__device__ __forceinline__ float cu_e2m1(unsigned nib) {
    const float m = (nib & 4u) ? ((nib & 2u) ? ((nib & 1u) ? 6.0f : 4.0f) : ((nib & 1u) ? 3.0f : 2.0f))
                               : (float)(nib & 3u) * 0.5f;
    return (nib & 8u) ? -m : m;
}

__device__ __forceinline__ float cu_e8m0(unsigned v) {
    /* 2^(v - 127): v << 23 is that float for v >= 1; v = 0 is the subnormal 2^-127 */
    return v == 0xffu ? __int_as_float(0x7fc00000)
                      : __int_as_float(v ? (int)(v << 23) : 0x00400000);
}

/* Weight (n, k) of w with its block scale applied, not w.scale (applied once per output). */
template <int DT>
__device__ __forceinline__ float cu_wget(const cu_wexp &w, int64_t n, int64_t k) {
    const char *row = w.data + n * w.stride;
    if (DT == CN_NVFP4) {
        const unsigned p = ((const unsigned char *)row)[k >> 1];
        return cu_e2m1((k & 1) ? p >> 4 : p & 15u) * cu_e4m3(w.bs[n * w.bs_stride + (k >> 4)]);
    }
    if (DT == CN_MXFP8)
        return cu_wval<CN_F8_E4M3>(row, k) * cu_e8m0(w.bs[n * w.bs_stride + (k >> 5)]);
    return cu_wval<DT>(row, k);
}

/* The per-output scale of a weight tensor (cu_wexp.scale). */
static inline float cu_wscale(const cn_tensor *w) {
    return w->dtype == CN_F8_E4M3 || w->dtype == CN_NVFP4 ? w->scale : 1.0f;
}

__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* 32 per-lane partial sums v[j] (j = 0..31) reduced across the warp at once: each level halves
 * the values a lane holds, keeping the half its lane bit selects and adding the partner lane's
 * copy of it; 31 shuffles for all 32 sums instead of 5 per sum. Returns the warp's total of
 * index `lane` (the order of additions is fixed, so callers get the same bits everywhere). */
__device__ __forceinline__ float cu_warp_sum32(float (&v)[32], int lane) {
    /* Constant loop bounds, so that every index of v is a constant once unrolled: with a
     * bound of `off` nvcc kept the inner loops, v went to local memory, and its loads and
     * stores joined a prefill scan's shared-memory traffic. */
#pragma unroll
    for (int lv = 0; lv < 5; lv++) { /* a counted loop, so that off and j are constants */
        const int off = 16 >> lv;
        const unsigned up = (lane & off) ? 0xffffffffu : 0u;
#pragma unroll
        for (int j = 0; j < 16; j++) { /* constant bounds for the unroller; j < off folds away */
            if (j >= off) break;
            const unsigned a = __float_as_uint(v[j]), b = __float_as_uint(v[j + off]);
            const float send = __uint_as_float((a & up) | (b & ~up));
            const float keep = __uint_as_float((b & up) | (a & ~up));
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
    return v[0];
}

/* Calls F.template operator()<DT>() for a weight dtype; returns CN_EUNSUPPORTED for others. */
#define CU_DISPATCH_W(dtype, CALL)                                  \
    switch (dtype) {                                                \
    case CN_F32: { constexpr int DT = CN_F32; CALL; } break;        \
    case CN_BF16: { constexpr int DT = CN_BF16; CALL; } break;      \
    case CN_F16: { constexpr int DT = CN_F16; CALL; } break;        \
    case CN_F8_E4M3: { constexpr int DT = CN_F8_E4M3; CALL; } break; \
    default: return CN_EUNSUPPORTED;                                \
    }

/* CU_DISPATCH_W plus the block-scaled formats, for the GEMM paths (cu_wget). */
#define CU_DISPATCH_WQ(dtype, CALL)                                 \
    switch (dtype) {                                                \
    case CN_F32: { constexpr int DT = CN_F32; CALL; } break;        \
    case CN_BF16: { constexpr int DT = CN_BF16; CALL; } break;      \
    case CN_F16: { constexpr int DT = CN_F16; CALL; } break;        \
    case CN_F8_E4M3: { constexpr int DT = CN_F8_E4M3; CALL; } break; \
    case CN_NVFP4: { constexpr int DT = CN_NVFP4; CALL; } break;    \
    case CN_MXFP8: { constexpr int DT = CN_MXFP8; CALL; } break;    \
    default: return CN_EUNSUPPORTED;                                \
    }

/* ---- ops (iface members) ---- */
int cu_matmul(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x);
int cu_matmul_gather(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                     const cn_tensor *x, const cn_tensor *ids);
int cu_get_rows(cn_backend *b, cn_tensor *y, const cn_tensor *table, const cn_tensor *ids);
int cu_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w, float eps);
int cu_gated_rmsnorm(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *z,
                     const cn_tensor *w, int group, float eps);
int cu_conv1d(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *w,
              const cn_tensor *bias, int silu, cn_tensor *state);
int cu_ssm_scan(cn_backend *b, cn_tensor *y, const cn_tensor *x, const cn_tensor *dt,
                const cn_tensor *B, const cn_tensor *C, const cn_ssm_args *a, cn_tensor *state);
int cu_attention(cn_backend *b, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                 const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale);
int cu_set_rows(cn_backend *b, cn_tensor *dst, int row, const cn_tensor *src);
int cu_moe_route(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                 const cn_tensor *bias, const cn_route_args *a);
int cu_moe_combine(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights);
int cu_moe_route_ep(cn_backend *b, cn_tensor *ids, cn_tensor *weights, cn_tensor *logits,
                    const cn_tensor *gate, const cn_tensor *x, const cn_mm_ep *f,
                    const cn_tensor *bias, const cn_route_args *a);
int cu_add(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
int cu_mul(cn_backend *b, cn_tensor *y, const cn_tensor *a, const cn_tensor *c);
int cu_silu(cn_backend *b, cn_tensor *y, const cn_tensor *x);
int cu_relu2(cn_backend *b, cn_tensor *y, const cn_tensor *x);
int cu_scale(cn_backend *b, cn_tensor *y, const cn_tensor *x, float s);
int cu_argmax(cn_backend *b, cn_tensor *ids, const cn_tensor *x);
/* Fused epilogues (cuda_gemm.cu): the decode GEMV's shapes only, else CN_EUNSUPPORTED. */
int cu_matmul_ep(cn_backend *b, cn_tensor *y, const cn_tensor *w, const cn_tensor *x,
                 const cn_mm_ep *f);
int cu_matmul_gather_ep(cn_backend *b, cn_tensor *y, const cn_tensor *const *w, int n_w,
                        const cn_tensor *x, const cn_tensor *ids, const cn_mm_ep *f);
/* The measure hook (cuda_probe.cu). */
int cu_measure(cn_backend *b, int what, cn_backend_limits *out);
/* Snapshot buffers and the copy stream (cuda_copy.cu; backend.h), and their teardown at free. */
int cu_buf_alloc(cn_backend *b, int kind, uint64_t n, void **out);
void cu_buf_free(cn_backend *b, int kind, void *p);
int cu_copy_async(cn_backend *b, void *dst, const void *src, uint64_t n, int dir, uint64_t *fence);
int cu_fence_done(cn_backend *b, uint64_t fence);
int cu_fence_wait(cn_backend *b, uint64_t fence, int host);
void cu_copy_free(cu_ctx *c);
/* dst = src converted, 2D with row strides: F32 <-> BF16/F16 (cuda_elementwise.cu). */
int cu_convert(cn_backend *b, cn_tensor *dst, const cn_tensor *src);

/* Shared by matmul and matmul_gather (cuda_gemm.cu): the tiled SIMT GEMM over a list of tiles. */
typedef struct cu_tile {
    int expert; /* index into the expert table (0 for a dense matmul) */
    int begin, end; /* positions in `order` (gather) or rows (dense) */
} cu_tile;

/* One block of 1024 threads (cuda_gemm.cu), shared by the SIMT and the tensor-core gathers: checks
 * the ids, counts rows per expert, lays out tiles of <= tm rows of one expert and the rows' order.
 * On a bad id: *flag = 1 and no tiles, so the GEMM that follows writes nothing. */
__global__ void __launch_bounds__(1024)
    k_gather_prep(const char *__restrict__ ids, int64_t ids_stride, int T, int k, int n_w, int tm,
                  int *flag, int *cnt /* [2 * n_w] */, int *order, cu_tile *tiles, int *n_tiles);

/* What the decode GEMVs (cuda_gemm.cu's k_gemv1, cuda_gemv_fp4.cu's k_gemv_fp4) fuse (backend.h's
 * cn_mm_ep): x normalised on its way in (norm: norm * x is staged while every block sums the
 * squares of its row in double, as k_rmsnorm does, and the row's scale multiplies each output;
 * the gated norm's scale changes every group, so its staging applies it), and an epilogue
 * (CN_EP_*; 0: none). Combining (ep CN_EP_ACC with an expert table) writes each row's products
 * to `prt` ([rows, N], fp32) instead; the block that completes an output group last (`cnt`, one
 * counter per token and group, zero between launches: that block sets it back) sums the k rows
 * of its token in order j = 0..k-1, as moe_combine does, and adds the sum into y's row t, so the
 * result does not depend on which block came last. */
typedef struct g1_epi {
    const float *norm; /* [K] or NULL */
    const float *gate; /* [K] (one row) or NULL: the gated grouped norm, groups of `group` */
    int group;         /* a multiple of the block's 256 threads (cu_matmul_ep checks) */
    float eps;
    int ep;
    const char *cw; /* routing weights [T, k] F32 (combining) */
    int64_t cws;    /* their row stride, bytes */
    float *prt;     /* [rows, N] */
    int *cnt;       /* [T, n_groups] */
} g1_epi;

/* Whether a decode GEMV's rows are combined into y (gathered rows with an accumulating
 * epilogue) rather than stored one by one: the kernels' epilogue and the split's cost. */
__host__ __device__ __forceinline__ bool g1_combines(const void *table, const g1_epi &epi) {
    return table && epi.ep == CN_EP_ACC;
}

/* A decode GEMV's row r = blockIdx.y: with an expert table, every block first checks all `rows`
 * ids (rows <= blockDim.x); on a bad one block (0,0) sets *flag and false comes back, and the
 * block must write nothing; else *w and *xrow become row r's expert and x row. Without a table
 * (dense) it returns true with both untouched. Every thread of the block calls it. early: called
 * before cu_pdl_enter (the ids settled, cu_gemv_fp4): the ids are read through L2, and a bad
 * one's flag is set after the enter (invariant 7). */
__device__ __forceinline__ bool g1_expert(const cu_wexp *__restrict__ table, int n_w,
                                          const char *__restrict__ ids, int64_t ids_s, int k,
                                          int x_per_token, int rows, int *flag, cu_wexp *w,
                                          int64_t *xrow, bool early = false) {
    if (!table) return true;
    const int tid = threadIdx.x, r = (int)blockIdx.y;
    int bad = 0;
    if (tid < rows) {
        const int32_t *p = (const int32_t *)(ids + (int64_t)(tid / k) * ids_s) + tid % k;
        const int e = early ? __ldcg(p) : *p;
        bad = e < 0 || e >= n_w;
    }
    if (__syncthreads_or(bad)) {
        if (early) cu_pdl_enter();
        if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0) *flag = 1;
        return false;
    }
    const int32_t *p = (const int32_t *)(ids + (int64_t)(r / k) * ids_s) + r % k;
    *w = table[early ? __ldcg(p) : *p];
    *xrow = x_per_token ? r / k : r;
    return true;
}

/* Output n of a row, v its product, stored through the plain epilogue (relu2, add or none). */
__device__ __forceinline__ void g1_store(const g1_epi &e, float *yr, int64_t n, float v) {
    if (e.ep == CN_EP_RELU2) {
        const float q = v > 0.0f ? v : 0.0f;
        yr[n] = q * q;
    } else if (e.ep == CN_EP_ACC) {
        yr[n] += v;
    } else {
        yr[n] = v;
    }
}

/* Output n of token t combined: sum over j < k, in order, of its routing weight times expert
 * row t * k + j's product in e.prt (moe_combine's sum). */
__device__ __forceinline__ float g1_combined(const g1_epi &e, int t, int k, int64_t N, int64_t n) {
    const float *wr = (const float *)(e.cw + (int64_t)t * e.cws);
    float a = 0.0f;
    for (int j = 0; j < k; j++) a += wr[j] * __ldcg(e.prt + (int64_t)(t * k + j) * N + n);
    return a;
}

/* The NVFP4 decode GEMV as int8 dot products (cuda_gemv_fp4.cu): whether it takes these weights
 * (every expert of a list), and the launch, with k_gemv1's arguments: y[r] = epilogue(W_r x_r)
 * for the dense weight (table NULL, one row) or the `rows` gathered rows of a decode token. */
bool cu_fp4_fits(const cn_tensor *const *w, int n_w, int64_t K);
void cu_gemv_fp4(cu_ctx *c, const cu_wexp &dense, const cu_wexp *table, int n_w,
                 const cn_tensor *ids, int k, const cn_tensor *x, int x_per_token, cn_tensor *y,
                 int64_t K, int64_t N, int rows, const g1_epi &epi);

/* Tensor-core GEMMs for prefill (cuda_grouped_gemm.cu). cu_gg_fits: whether the weights (all of
 * dtype dt) can take them; then cu_gg_dense is matmul, cu_gg_gather matmul_gather with the
 * expert table already built (same contract, including the ids verdict). */
bool cu_gg_fits(cn_dtype dt, const cn_tensor *const *w, int n_w, int64_t K);
int cu_gg_dense(cu_ctx *c, cn_tensor *y, const cn_tensor *w, const cn_tensor *x);
/* Attention for many queries on tensor cores (cuda_attention_prefill.cu): cu_attention's
 * contract, or CN_EUNSUPPORTED (nothing queued) for shapes it does not take. */
int cu_fa_attention(cu_ctx *c, cn_tensor *out, const cn_tensor *q, const cn_tensor *kc,
                    const cn_tensor *vc, int n_past, int n_heads, int n_kv_heads, float scale);
int cu_gg_gather(cu_ctx *c, cn_tensor *y, const cu_wexp *table, int n_w, cn_dtype dt,
                 const cn_tensor *x, const cn_tensor *ids);

#endif
