/* quantize.h - BF16/F32 checkpoints into NVFP4, MXFP8 or FP8 ones, as modelopt exports them.
 *
 * cn_quantize_dir() streams a checkpoint directory into a new one: every Linear weight of a
 * quantized module becomes its format's tensors, everything else is copied as stored, the other
 * files (tokenizer, chat template, generation config, ...) are copied, config.json gains a
 * `quantization_config` and hf_quant_config.json is written (quant_config.h reads both back).
 * Tensors go through the streaming writer (st_writer.h): memory stays bounded by one row of the
 * largest matrix per thread plus the writer's chunk, whatever the model size. The rows of a chunk
 * are quantized on a thread pool (o->threads); every row is independent, so the files are the
 * same byte for byte whatever the thread count.
 *
 * Formats written (per module X, weight [N, K]):
 *  (1) NVFP4: X.weight U8 [N, K/2] (E2M1 pairs, low nibble = even column), X.weight_scale
 *      F8_E4M3 [N, K/16], X.weight_scale_2 F32 scalar. As modelopt: g = amax(|W|) / (6 * 448);
 *      each block of 16 gets s = e4m3(amax_block / 6 / g) (round to nearest even, <= 448), and its
 *      values e2m1(w / (s * g)) rounded to nearest, ties to the even code, saturating at 6.
 *  (2) MXFP8: X.weight F8_E4M3 [N, K], X.weight_scale U8 [N, K/32] holding E8M0 exponents
 *      e = ceil(log2(amax_block / 448)) + 127: the smallest power of two that keeps every value
 *      of the block within E4M3's 448, so nothing saturates (OCP's floor(log2(amax)) - 8 clips the
 *      block's top values to 448, up to 12.5% off); the price is that a block's smallest values
 *      reach the subnormal range one binade sooner. Values e4m3(w / 2^(e - 127)), nearest even.
 *  (3) FP8: X.weight F8_E4M3 [N, K], X.weight_scale F32 scalar amax / 448.
 * No X.input_scale is written: it needs calibration data, and cairn computes activations in
 * fp32/int8 without it (runtimes that run W4A4/W8A8 with static activation scales need it).
 *
 * Which modules stay as stored (besides every non-matrix tensor and every --keep glob): for
 * NVFP4, NVIDIA's Nano NVFP4 release: lm_head, embeddings, the router gate (*.mixer.gate),
 * conv1d, attention q/k/v/o, and in_proj/out_proj of each Mamba layer whose next mixer layer is
 * attention; for FP8 and MXFP8, the Nano FP8 release: lm_head, embeddings, router gate, conv1d.
 * A module whose K is not a multiple of the block size (16, 32) is kept too, with a warning.
 *
 * Errors leave the output directory's previous safetensors in place (st_writer.h (3)); an input
 * that is already quantized, or an output directory equal to the input, is CN_EINVAL.
 */
#ifndef CN_QUANTIZE_H
#define CN_QUANTIZE_H

#include <stdint.h>

#include "base/error.h"
#include "model/quant_config.h"

typedef struct cn_quantize_opts {
    const char *in_dir, *out_dir;
    cn_qalgo algo;             /* CN_QALGO_NVFP4, CN_QALGO_MXFP8 or CN_QALGO_FP8 */
    const char *const *keep;   /* extra module globs to keep as stored */
    int n_keep;
    uint64_t shard_bytes;      /* 0: one model.safetensors */
    int threads;               /* rows quantized in parallel; 0: every online core */
} cn_quantize_opts;

typedef struct cn_quantize_stats {
    int n_quantized, n_kept;   /* matrices quantized / kept as stored */
    uint64_t bytes_in, bytes_out;
} cn_quantize_stats;

/* Quantizes o->in_dir into o->out_dir (created if missing). stats OUT (optional). */
int cn_quantize_dir(const cn_quantize_opts *o, cn_quantize_stats *stats, cn_err *err);

/* Row encoders, exposed for tests. K a multiple of the block size. */
/* NVFP4: packed [K/2], scales [K/16] E4M3 codes, for global scale g (weight_scale_2). */
void cn_quantize_nvfp4_row(const float *w, int64_t K, float g, uint8_t *packed, uint8_t *scales);
/* MXFP8: codes [K] E4M3, exps [K/32] E8M0. */
void cn_quantize_mxfp8_row(const float *w, int64_t K, uint8_t *codes, uint8_t *exps);
/* Nearest-even E4M3 code of v (saturating at +-448); exact and fast (no table search). */
uint8_t cn_e4m3_encode(float v);

#endif
