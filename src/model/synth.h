/* synth.h - deterministic synthetic NemotronH checkpoints (`cairn make-model`).
 *
 * cn_synth_write() fills a directory with everything a loader reads from a published NemotronH
 * release: config.json (transformers' NemotronHConfig key names), generation_config.json,
 * tokenizer.json (a real byte-level BPE), tokenizer_config.json (with the Nemotron 3 Nano chat
 * template), special_tokens_map.json, and model.safetensors (or shards + index) with the tensor
 * names and shapes of the HF checkpoints. In fp8 mode it also writes hf_quant_config.json.
 *
 * Invariants:
 *  (1) Every value is a pure function of (seed, tensor name, element index): files are
 *      byte-identical for the same options, whatever the writing order or sharding.
 *  (2) Weights are scaled so activations stay O(1): projections ~ std 1/sqrt(fan_in),
 *      embeddings std 1, norms 1 +- 0.1, A_log = log(U[1,16]), softplus(dt_bias) in
 *      [0.001, 0.1] (log-uniform), D in [0.9, 1.1], e_score_correction_bias in [-0.05, 0.05].
 *  (3) Storage dtypes: projections, embeddings and lm_head in the chosen dtype (in fp8 mode every
 *      Linear is F8_E4M3 with an F32 scalar `<name>_scale`, i.e. `X.weight_scale`, while
 *      embeddings and lm_head stay BF16); router gate weight and e_score_correction_bias always
 *      F32 (as in Nano); A_log, D, dt_bias always F32 (SSM-sensitive); norm weights and conv1d
 *      weight/bias F32 in f32 mode, else BF16.
 *  (4) Nothing is written under a final name half-done (see st_writer.h); the directory is
 *      created if missing.
 */
#ifndef CN_SYNTH_H
#define CN_SYNTH_H

#include <stdint.h>

#include "base/error.h"
#include "tensor/tensor.h"

#define CN_SYNTH_PRESETS "tiny|small|nano-shape"

typedef struct cn_synth_opts {
    const char *preset;   /* "tiny", "small" or "nano-shape" */
    uint64_t seed;
    int mtp;              /* 1: one MTP block with pattern "*E"; 0: none */
    int layers;           /* 0: the preset's pattern; N: its first N layers */
    const char *pattern;  /* NULL: the preset's; else a layer pattern of M, *, S, E, - to use
                           * (S: sliding-window attention, with the weights of '*') */
    int sliding_window;   /* W of the S layers (0: 16); written only when the pattern has one */
    cn_dtype dtype;       /* CN_BF16 (default), CN_F32 or CN_F8_E4M3 */
    uint64_t shard_bytes; /* 0: one model.safetensors; else the max bytes per shard */
    int threads;          /* weights generated in parallel (same bytes for any count); 0: all cores */
} cn_synth_opts;

/* What a write produces; filled by cn_synth_describe without writing anything. */
typedef struct cn_synth_info {
    char pattern[128];     /* hybrid_override_pattern after --layers */
    int n_layers;
    int hidden_size, vocab_size;
    uint64_t params;       /* every weight element, MTP included, fp8 scales excluded */
    uint64_t mtp_params;   /* the part in mtp.* */
    uint64_t tensor_bytes; /* safetensors data bytes over all files (headers excluded) */
    int n_tensors;
    int n_files;           /* safetensors files (1: model.safetensors) */
} cn_synth_info;

/* tiny, seed 0, MTP on, all layers, BF16, one file. */
void cn_synth_opts_init(cn_synth_opts *o);

/* Validates o and describes the checkpoint. Returns 0, or CN_EINVAL naming the bad option
 * (unknown preset, layers out of range, unsupported dtype). */
int cn_synth_describe(const cn_synth_opts *o, cn_synth_info *out, cn_err *err);

/* Writes the model directory dir (created if missing). Returns 0; CN_EINVAL for bad options;
 * CN_EIO naming the path for any file that cannot be created or written; CN_ENOMEM. */
int cn_synth_write(const char *dir, const cn_synth_opts *o, cn_err *err);

/* The text of a valid Hugging Face tokenizer.json for vocab_size ids (at least 276): ids 0..19
 * Nemotron's special tokens, 20..275 the 256 byte tokens, then BPE merges trained on embedded
 * text, then `<|reserved_ID|>` fillers. *out is malloc'd; caller frees. Pure and deterministic.
 * Returns 0, CN_EINVAL (vocab too small) or CN_ENOMEM. */
int cn_synth_tokenizer_json(int vocab_size, char **out, cn_err *err);

#endif
