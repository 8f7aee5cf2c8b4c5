/* model_info.c - parameter, byte and state-size accounting for `cairn info`. */
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
    int n_attn = cn_config_count(c, CN_BLOCK_ATTN), n_mamba = cn_config_count(c, CN_BLOCK_MAMBA);
    st->state_bytes_per_token = (uint64_t)n_attn * 2 * c->n_kv_heads * c->head_dim * sizeof(float);
    st->state_bytes_fixed = (uint64_t)n_mamba *
        ((uint64_t)(c->conv_kernel - 1) * m->conv_dim +
         (uint64_t)c->mamba_n_heads * c->mamba_head_dim * c->ssm_state_size) * sizeof(float);
}
