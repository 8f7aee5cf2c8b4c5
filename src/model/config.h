/* config.h - a NemotronH config.json (and generation_config.json) parsed into a plain struct.
 *
 * Accepts both layer-pattern forms: the `hybrid_override_pattern` string (M, *, S, E, -) and the
 * newer `layers_block_type` list (mamba|linear_attention, attention|full_attention,
 * sliding_attention, moe, mlp; `layer_types` is read when it is absent); likewise
 * `mtp_hybrid_override_pattern` / `mtp_layers_block_type` with `num_nextn_predict_layers`.
 * Sliding-window attention, which NemotronH itself never uses, is declared the way Hugging Face
 * configs (Mistral, Gemma 2/3, gpt-oss) do: a `sliding_window` W and the layers marked
 * "sliding_attention" in the list ('S' in the string). Such a layer is an ordinary attention
 * block (same weights, same names) whose query at position p attends positions p-W+1..p only.
 * `sliding_window` is required (>= 1) when an 'S' layer exists and ignored otherwise (it may be
 * null, as Mistral's configs often have it).
 * Every missing or invalid required field is reported by name (CN_ECONFIG); optional fields take
 * the transformers defaults. The parser never reads weights.
 */
#ifndef CN_CONFIG_H
#define CN_CONFIG_H

#include "base/error.h"

/* One mixer per block; the values are the hybrid_override_pattern characters. */
typedef enum cn_block {
    CN_BLOCK_MAMBA = 'M',
    CN_BLOCK_ATTN = '*',
    CN_BLOCK_SWA = 'S', /* sliding-window attention: attention weights, a ring of W KV rows */
    CN_BLOCK_MOE = 'E',
    CN_BLOCK_MLP = '-',
} cn_block;

#define CN_MAX_EOS 8

typedef struct cn_config {
    char model_type[32];     /* "nemotron_h" */
    int hidden_size;         /* H */
    int vocab_size;          /* V */
    int n_layers;            /* length of the layer pattern */
    char *layers;            /* [n_layers] cn_block chars, NUL-terminated; owned */
    float norm_eps;          /* layer_norm_epsilon (norm_eps), default 1e-5 */
    int tie_word_embeddings; /* default 0 */
    int max_position_embeddings;

    /* attention ('*') */
    int n_heads;    /* num_attention_heads */
    int n_kv_heads; /* num_key_value_heads */
    int head_dim;   /* head_dim, default hidden_size / n_heads */
    int attention_bias;
    int sliding_window; /* W of the 'S' layers (they share the '*' fields); 0 when none */

    /* Mamba2 ('M') */
    int mamba_n_heads;   /* mamba_num_heads */
    int mamba_head_dim;  /* mamba_head_dim */
    int n_groups;        /* n_groups */
    int ssm_state_size;  /* ssm_state_size (d_state) */
    int conv_kernel;     /* conv_kernel */
    int chunk_size;      /* chunk_size, default 128 */
    int use_conv_bias;   /* default 1 */
    int mamba_proj_bias; /* mamba_proj_bias (use_bias), default 0 */
    float dt_min, dt_max;/* time_step_limit, default (0, inf) */

    /* dense MLP ('-') */
    int intermediate_size;

    /* MoE ('E') */
    int n_routed_experts;
    int n_experts_per_tok;
    int moe_intermediate_size;
    int n_shared_experts;
    int moe_shared_intermediate_size; /* moe_shared_expert_intermediate_size */
    int n_group, topk_group;          /* default 1, 1 */
    int norm_topk_prob;               /* default 1 */
    float routed_scaling_factor;      /* default 1.0 */
    int mlp_bias;

    /* multi-token prediction */
    int n_mtp;          /* num_nextn_predict_layers, default 0 */
    int n_mtp_layers;   /* length of the MTP pattern */
    char *mtp_layers;   /* [n_mtp_layers] cn_block chars, NUL-terminated; owned; NULL when none */

    /* tokens (config.json, overridden by generation_config.json where present) */
    int bos_token_id;         /* -1 if unknown */
    int pad_token_id;         /* -1 if unknown */
    int n_eos;
    int eos_token_ids[CN_MAX_EOS];
    /* generation defaults from generation_config.json; negative when absent */
    float gen_temperature, gen_top_p;
    int gen_top_k;
} cn_config;

/* Parses dir/config.json and, if present, dir/generation_config.json. On error c is left zeroed
 * (nothing to free) and err names the file and field. */
int cn_config_load_dir(cn_config *c, const char *dir, cn_err *err);
/* Parses a config.json text (for tests); generation fields keep their defaults. */
int cn_config_parse(cn_config *c, const char *json, const char *what, cn_err *err);
/* Frees what the config owns; safe on a zeroed config. */
void cn_config_free(cn_config *c);
/* 1 for the attention blocks, full ('*') or sliding-window ('S'). */
static inline int cn_block_is_attn(cn_block b) { return b == CN_BLOCK_ATTN || b == CN_BLOCK_SWA; }
/* 1 when layer l of a pattern of n cn_block chars is Mamba and the next Mamba or attention layer
 * after it is attention (NVIDIA's NVFP4 release keeps such a layer's in_proj and out_proj BF16). */
static inline int cn_mamba_feeds_attn(const char *layers, int n, int l) {
    if (layers[l] != CN_BLOCK_MAMBA) return 0;
    for (int j = l + 1; j < n; j++) {
        if (layers[j] == CN_BLOCK_MAMBA) return 0;
        if (cn_block_is_attn((cn_block)layers[j])) return 1;
    }
    return 0;
}
/* Number of layers of a type. */
int cn_config_count(const cn_config *c, cn_block type);

#endif
