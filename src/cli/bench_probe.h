/* bench_probe.h - what this machine can do, measured on the spot for `cairn bench`.
 *
 * Two probes, both on every thread of a pool:
 *  - bandwidth: a streaming read (wide loads summed into registers, nothing written) over a
 *    buffer far larger than the caches; the best of a few passes, in GB/s (1e9 bytes).
 *  - peak arithmetic: a loop of independent multiply-accumulates on cached operands, in Gop/s
 *    where one multiply-add counts as two operations:
 *      fp32 FMA  (AVX-512 vfmadd231ps: 16 lanes x 2 = 32 ops; AVX2: 16 ops; else scalar C)
 *      int8 VNNI (AVX-512 vpdpbusd: 64 u8 x s8 products summed into 16 int32 lanes = 128 ops)
 *      a matmul tile's step (AVX-512): the instructions the CPU backend's prefill tile runs per
 *      step, in its proportions, operands in L1: for BF16, per 16 columns of 6 x 4 outputs (the
 *      panel, cpu_kernels.c a5_chunk), 4 widenings (vpmovzxwd + vpslld) and 24 vfmadd; for NVFP4, per 256 columns of 4 x 2
 *      outputs, 2 weight-row unpacks (2 vpermt2d, 4 vpermb) with their 16 block scales, then
 *      8 x (4 vpdpbusd, vcvtdq2ps, vmulps, vfmadd). Only the
 *      multiply-adds count as operations, so this is the ceiling of that kernel, below the bare
 *      instruction's: the tile spends issue slots on conversions and per-block scales.
 *    The kind mirrors the kernel a forward runs: `cairn bench` sets BF16 weights against the
 *    BF16 tile, NVFP4 checkpoints (whose kept-BF16 modules run the BF16 tile) against both tiles
 *    weighted by their parameters, FP8 and MXFP8 against fp32 FMA.
 * Nothing here allocates but cn_probe_buf_alloc; every probe returns in well under a second.
 */
#ifndef CN_BENCH_PROBE_H
#define CN_BENCH_PROBE_H

#include <stddef.h>

#include "base/threadpool.h"

typedef enum cn_peak_kind {
    CN_PEAK_FP32_FMA = 0, /* vfmadd alone */
    CN_PEAK_INT8_VNNI,    /* vpdpbusd alone */
    CN_PEAK_BF16_TILE,    /* the BF16 matmul tile's step: widenings and vfmadd (AVX-512) */
    CN_PEAK_NVFP4_TILE,   /* the NVFP4 tile's step: unpacks, vpdpbusd, converts, scales, vfmadd */
} cn_peak_kind;

/* A page-aligned buffer of `bytes` (a multiple of 1 MiB), every page written once so that it is
 * resident before the first probe. NULL on allocation failure. Free with cn_probe_buf_free. */
void *cn_probe_buf_alloc(size_t bytes);
void cn_probe_buf_free(void *buf, size_t bytes);

/* Streaming-read bandwidth over buf[0, bytes) on every thread of pool: best of `passes`, GB/s. */
double cn_probe_bandwidth(cn_pool *pool, const void *buf, size_t bytes, int passes);

/* Peak Gop/s of `kind` on every thread of pool (best of 3 runs of about `seconds` / 3 each).
 * *what OUT names the instruction actually timed (e.g. "avx512 vpdpbusd"): a kind the CPU lacks
 * falls back to the widest fp32 FMA it has, and says so. */
double cn_probe_peak(cn_pool *pool, cn_peak_kind kind, double seconds, const char **what);

#endif
