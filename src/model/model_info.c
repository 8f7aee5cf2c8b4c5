/* model_info.c - parameter and byte accounting for `cairn info`, block indices, decode traffic. */
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

void cn_model_stats_get(const cn_model *m, cn_model_stats *st) {
    const cn_config *c = &m->cfg;
    memset(st, 0, sizeof *st);
    uint64_t routed = 0;
    for (int i = 0; i < cn_st_count(m->st); i++) {
        const cn_st_tensor *t = cn_st_at(m->st, i);
        uint64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
        if ((unsigned)t->dtype < CN_DTYPE_COUNT) st->bytes[t->dtype] += t->nbytes;
        size_t len = strlen(t->name);
        if ((len > 6 && !strcmp(t->name + len - 6, "_scale")) ||
            (len > 8 && !strcmp(t->name + len - 8, "_scale_2")))
            continue; /* quantization scales (F8, NVFP4, MXFP8) are not parameters */
        if (t->dtype == CN_U8 && strstr(t->name, ".weight")) n *= 2; /* packed fp4 pairs */
        st->params += n;
        if (!strncmp(t->name, "mtp.", 4)) st->params_mtp += n;
        else if (strstr(t->name, ".experts.")) routed += n;
    }
    uint64_t main = st->params - st->params_mtp;
    st->active_params = main - routed;
    if (c->n_routed_experts > 0) st->active_params += routed * (uint64_t)c->n_experts_per_tok / (uint64_t)c->n_routed_experts;
}

int cn_block_index(cn_block type) {
    switch (type) {
    case CN_BLOCK_MAMBA: return 0;
    case CN_BLOCK_ATTN:
    case CN_BLOCK_SWA: return 1;
    case CN_BLOCK_MOE: return 2;
    default: return 3;
    }
}

static int is_scale_name(const char *name) {
    size_t len = strlen(name);
    return (len > 6 && !strcmp(name + len - 6, "_scale")) ||
           (len > 8 && !strcmp(name + len - 8, "_scale_2"));
}

void cn_model_decode_traffic(const cn_model *m, cn_decode_traffic *out) {
    const cn_config *c = &m->cfg;
    const uint64_t k = c->n_experts_per_tok > 0 ? (uint64_t)c->n_experts_per_tok : 1;
    const uint64_t E = c->n_routed_experts > 0 ? (uint64_t)c->n_routed_experts : 1;
    static const char emb[] = "backbone.embeddings.weight", lay[] = "backbone.layers.";
    memset(out, 0, sizeof *out);
    for (int i = 0; i < c->n_layers; i++) out->n_layer[cn_block_index((cn_block)c->layers[i])]++;
    for (int i = 0; i < cn_st_count(m->st); i++) {
        const cn_st_tensor *t = cn_st_at(m->st, i);
        if (!strncmp(t->name, "mtp.", 4)) continue;
        uint64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
        const int fp4 = t->dtype == CN_U8 && strstr(t->name, ".weight") && !is_scale_name(t->name);
        if (fp4) n *= 2; /* packed E2M1 pairs */
        uint64_t bytes = t->nbytes, params = is_scale_name(t->name) ? 0 : n;
        int expert = strstr(t->name, ".experts.") != NULL;
        if (expert) {
            bytes = bytes * k / E;
            params = params * k / E;
        }
        if (!strcmp(t->name, emb)) {
            /* one row per token, unless lm_head is this table and reads all of it */
            if (!c->tie_word_embeddings && t->ndim == 2 && t->shape[0] > 0) bytes /= (uint64_t)t->shape[0];
            params = 0;
        } else if (!strcmp(t->name, "lm_head.weight")) {
            params = 0;
        }
        out->weights += bytes;
        out->prefill_params += params;
        if (fp4) out->prefill_params_nvfp4 += params;
        int layer = -1;
        if (!strncmp(t->name, lay, sizeof lay - 1)) layer = atoi(t->name + sizeof lay - 1);
        if (layer >= 0 && layer < c->n_layers)
        {
            out->weights_layer[cn_block_index((cn_block)c->layers[layer])] += bytes;
            out->prefill_params_layer[cn_block_index((cn_block)c->layers[layer])] += params;
        } else
            out->weights_outer += bytes;
    }
    int n_attn = cn_config_count(c, CN_BLOCK_ATTN), n_mamba = cn_config_count(c, CN_BLOCK_MAMBA);
    out->kv_per_ctx = (uint64_t)n_attn * 2 * c->n_kv_heads * c->head_dim * sizeof(float);
    out->state_fixed = (uint64_t)n_mamba *
        ((uint64_t)(c->conv_kernel - 1) * m->conv_dim +
         (uint64_t)c->mamba_n_heads * c->mamba_head_dim * c->ssm_state_size) * sizeof(float);
    out->state_fixed += (uint64_t)cn_config_count(c, CN_BLOCK_SWA) * (uint64_t)c->sliding_window * 2 *
                        c->n_kv_heads * c->head_dim * sizeof(float); /* a whole window, read once */
}
