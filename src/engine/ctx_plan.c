/* ctx_plan.c - the default context length from the config and the memory left; see ctx_plan.h. */
#include "engine/ctx_plan.h"

#include <stdio.h>

#include "cache/keys.h"
#include "tensor/backend.h"

/* Adds one stack of layers (the main ones or the MTP head's) to the two counts. */
static void add_layers(const cn_config *c, const char *types, int n, uint64_t *per_token,
                       uint64_t *fixed) {
    uint64_t kv_row = 2 * (uint64_t)c->n_kv_heads * c->head_dim * sizeof(float); /* K and V, F32 */
    uint64_t conv_dim = (uint64_t)c->mamba_n_heads * c->mamba_head_dim +
                        2 * (uint64_t)c->n_groups * c->ssm_state_size;
    for (int l = 0; l < n; l++) {
        switch ((cn_block)types[l]) {
        case CN_BLOCK_ATTN: *per_token += kv_row; break;
        case CN_BLOCK_SWA: *fixed += (uint64_t)c->sliding_window * kv_row; break;
        case CN_BLOCK_MAMBA:
            *fixed += ((uint64_t)(c->conv_kernel - 1) * conv_dim +
                       (uint64_t)c->mamba_n_heads * c->mamba_head_dim * c->ssm_state_size) *
                      sizeof(float);
            break;
        default: break; /* MoE and MLP layers keep nothing */
        }
    }
}

void cn_ctx_state_bytes(const cn_config *c, uint64_t *per_token, uint64_t *fixed) {
    *per_token = sizeof(cn_key); /* the prefix cache's key of each live token */
    *fixed = 0;
    add_layers(c, c->layers, c->n_layers, per_token, fixed);
    /* the engine keeps a draft cache as long as the live one when the head can be rewound */
    int draft = c->n_mtp > 0 && c->n_mtp_layers > 0;
    for (int l = 0; draft && l < c->n_mtp_layers; l++)
        if (c->mtp_layers[l] == CN_BLOCK_MAMBA) draft = 0;
    if (draft) add_layers(c, c->mtp_layers, c->n_mtp_layers, per_token, fixed);
}

int cn_ctx_plan_make(const cn_config *c, int asked, uint64_t budget, cn_ctx_plan *out) {
    if (asked < 0) return CN_EINVAL;
    cn_ctx_plan p = {.max_pos = c->max_position_embeddings, .budget = budget};
    cn_ctx_state_bytes(c, &p.per_token, &p.fixed);
    p.ctx = asked ? asked : p.max_pos;
    p.why = asked ? CN_CTX_ASKED : CN_CTX_MAX_POS;
    if (!asked && budget != CN_CTX_UNKNOWN && cn_ctx_plan_bytes(&p) > budget) {
        uint64_t fit = budget > p.fixed ? (budget - p.fixed) / p.per_token : 0;
        fit -= fit % CN_CTX_ROUND;
        if (fit < CN_CTX_MIN) fit = CN_CTX_MIN;
        if (fit < (uint64_t)p.max_pos) { /* invariant 2: a tiny maximum stays the maximum */
            p.ctx = (int)fit;
            p.why = CN_CTX_MEMORY;
        }
    }
    *out = p;
    return CN_OK;
}

uint64_t cn_ctx_plan_bytes(const cn_ctx_plan *p) { return p->fixed + p->per_token * (uint64_t)p->ctx; }

uint64_t cn_ctx_budget(const cn_model *m, const cn_pc_opts *cache) {
    cn_backend *b = cn_model_backend(m);
    uint64_t free_b = 0, total = 0;
    if (cn_backend_memory(b, &free_b, &total) || total == 0) return CN_CTX_UNKNOWN;
    uint64_t spend = total / 16; /* forward scratch, the tokenizer, the server, the allocator */
    if (cn_backend_has_device_memory(b)) {
        spend += cache ? cache->dev_budget : 0; /* the weights already sit in device memory */
    } else {
        cn_model_stats st;
        cn_model_stats_get(m, &st);
        for (int d = 0; d < CN_DTYPE_COUNT; d++) spend += st.bytes[d];
        spend += cache && cache->ram_budget ? cache->ram_budget : CN_PC_RAM_BUDGET;
    }
    return free_b > spend ? free_b - spend : 0;
}

/* "3.0 KiB": binary units, one decimal. */
static void human(uint64_t bytes, char *buf, size_t n) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

char *cn_ctx_plan_line(const cn_ctx_plan *p, char *buf, size_t n) {
    char tok[32], all[32], bud[32], why[160];
    human(p->per_token, tok, sizeof tok);
    human(cn_ctx_plan_bytes(p), all, sizeof all);
    if (p->why == CN_CTX_ASKED) {
        snprintf(why, sizeof why, "--ctx");
    } else if (p->why == CN_CTX_MAX_POS) {
        snprintf(why, sizeof why, "max_position_embeddings");
    } else {
        human(p->budget, bud, sizeof bud);
        snprintf(why, sizeof why, "lowered from max_position_embeddings %d to fit %s of free memory "
                 "beside the weights and caches; --ctx N sets it", p->max_pos, bud);
    }
    snprintf(buf, n, "context %d tokens (%s), %s of state a token, %s", p->ctx, why, tok, all);
    return buf;
}
