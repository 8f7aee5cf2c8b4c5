/* model_impl.h - the layout of cn_model: config, weights (bound to the mapping) and scratch.
 *
 * Split by lifetime, as llama2.c does: cn_config is the blueprint, cn_weights point into the mapped
 * checkpoint (big matrices) or into backend memory the model owns (small F32 vectors), cn_scratch is
 * the activation memory of one forward, allocated once at open for `ubatch` tokens.
 */
#ifndef CN_MODEL_IMPL_H
#define CN_MODEL_IMPL_H

#include "model/config.h"
#include "model/model.h"
#include "model/quant_config.h"
#include "model/safetensors.h"
#include "tensor/backend.h"

typedef struct cn_mamba_w {
    cn_tensor in_proj;  /* [d_inner + conv_dim + n_heads, H] */
    cn_tensor conv_w;   /* [conv_dim, K] F32 (owned) */
    cn_tensor conv_b;   /* [conv_dim] F32 (owned) */
    cn_tensor dt_bias;  /* [n_heads] F32 (owned) */
    cn_tensor A_log;    /* [n_heads] F32 (owned) */
    cn_tensor D;        /* [n_heads] F32 (owned) */
    cn_tensor norm;     /* [d_inner] F32 (owned), grouped gated RMSNorm */
    cn_tensor out_proj; /* [H, d_inner] */
} cn_mamba_w;

typedef struct cn_attn_w {
    cn_tensor q, k, v; /* [n_heads*head_dim, H], [n_kv*head_dim, H] x2 */
    cn_tensor o;       /* [H, n_heads*head_dim] */
} cn_attn_w;

#define CN_MOE_MAX_PARTS 4 /* pieces of the shared expert folded into the expert tables */

typedef struct cn_moe_w {
    cn_tensor gate;            /* [E, H], router weight */
    cn_tensor bias;            /* [E] F32 (owned) e_score_correction_bias; data NULL if absent */
    cn_tensor *up, *down;      /* [E] each [I, H] and [H, I] (array owned) */
    const cn_tensor **up_p;    /* [E + CN_MOE_MAX_PARTS] pointers into up, then the parts (for
                                * matmul_gather) */
    const cn_tensor **down_p;  /* the same into down */
    int has_shared;
    cn_tensor shared_up;       /* [Is, H] */
    cn_tensor shared_down;     /* [H, Is] */
    /* The shared expert as n_parts more experts E .. E + n_parts - 1 of up_p and down_p, which
     * every token takes with weight 1 (cn_moe_fold_shared): part i is rows [i I, (i + 1) I) of
     * shared_up and those columns of shared_down, so its relu² rows are the shared expert's and
     * its down products sum to the shared expert's output. 0 when the shape or the formats do
     * not allow one table (the shared expert then runs as two products of its own). */
    int n_parts;
    cn_tensor part_up[CN_MOE_MAX_PARTS], part_down[CN_MOE_MAX_PARTS];
    cn_tensor part_up_bs[CN_MOE_MAX_PARTS], part_down_bs[CN_MOE_MAX_PARTS]; /* their scales */
} cn_moe_w;

typedef struct cn_mlp_w {
    cn_tensor up;   /* [I, H] */
    cn_tensor down; /* [H, I] */
} cn_mlp_w;

typedef struct cn_layer_w {
    cn_block type;
    cn_tensor norm; /* [H] F32 (owned), pre-mixer RMSNorm */
    cn_mamba_w mamba;
    cn_attn_w attn;
    cn_moe_w moe;
    cn_mlp_w mlp;
} cn_layer_w;

typedef struct cn_mtp_w {
    cn_tensor enorm, hnorm; /* [H] F32 (owned) */
    cn_tensor eh_proj;      /* [H, 2H] */
    cn_layer_w *layers;     /* [n_mtp_layers]; norm is mtp.layers.i.norm */
    cn_tensor final_norm;   /* [H] F32 (owned): final_layernorm of the last MTP layer */
} cn_mtp_w;

typedef struct cn_weights {
    cn_tensor embed;    /* [V, H] */
    cn_tensor norm_f;   /* [H] F32 (owned) */
    cn_tensor lm_head;  /* [V, H] (the embedding when tied) */
    cn_layer_w *layers; /* [n_layers] */
    int has_mtp;
    cn_mtp_w mtp;
    /* the head's drafting copy (mtp_draft.c), used by states made with cn_state_create(.., 2) */
    int has_mtp_draft;
    cn_mtp_w mtp_draft;        /* layers owned; matrices NVFP4/FP8 or shared with mtp */
    cn_tensor lm_head_draft;   /* NVFP4/FP8 copy of lm_head, or lm_head itself */
    cn_tensor **draft_owned;   /* [n_draft_owned] their codes and block scales (U8), released
                                * at close */
    int n_draft_owned;
} cn_weights;

/* Activations of one forward of up to `ubatch` tokens; all F32 unless noted. */
typedef struct cn_scratch {
    int ubatch;      /* U */
    int logit_rows;  /* rows of logits computed per lm_head call */
    cn_tensor ids;   /* [U] I32 token ids */
    cn_tensor x;     /* [U, H] residual stream */
    cn_tensor xn;    /* [U, H] normed input of the current block */
    cn_tensor out;   /* [U, H] mixer output */
    cn_tensor tmp;   /* [U, H] */
    cn_tensor proj;  /* [U, max(in_proj rows, q rows, I_mlp, Is)] wide projections */
    cn_tensor conv;  /* [U, conv_dim] conv + SiLU output */
    cn_tensor y;     /* [U, max(d_inner, n_heads*head_dim)] scan / attention output */
    cn_tensor rlogits; /* [U, E] router logits */
    cn_tensor rids;    /* [U, k] I32 chosen experts */
    cn_tensor rw;      /* [U, k] routing weights */
    cn_tensor eh;      /* [U*k, I] expert hidden */
    cn_tensor eo;      /* [U*k, H] expert outputs */
    cn_tensor cat;     /* [U, 2H] MTP concat(enorm(e), hnorm(h)) */
    cn_tensor kn, vn;  /* [U, n_kv*head_dim] new K/V rows of a sliding-window layer (only when
                        * the model has one; they reach the ring after the attention) */
    cn_tensor logits;  /* [logit_rows, V] */
    cn_tensor pick;    /* [1] I32 greedy pick of the last logits row (cn_batch.argmax) */
    int64_t ids0;      /* the token ids[0] is known to hold on the backend, or -1: a decode step
                        * writes its greedy pick there, so the next token's upload is skipped */
    float *host_logits; /* [V] host row for a backend without cn_op_argmax (malloc'd) */
    struct seq *sq;     /* [U] the sequences of a piece of several (forward.c; malloc'd) */
} cn_scratch;

struct cn_model {
    cn_config cfg;
    cn_backend *b;         /* not owned */
    cn_safetensors *st;    /* the mapped checkpoint */
    cn_weights w;
    cn_scratch s;
    int n_owned;           /* small F32 tensors the model allocated on the backend */
    int cap_owned;
    cn_tensor **owned;     /* [n_owned] pointers to release at close */
    cn_qconfig qc;         /* which format each module has (quant_config.h) */
    int n_descs;           /* block-scale descriptors the model allocated (data in the mapping) */
    int cap_descs;
    cn_tensor **descs;     /* [n_descs] freed at close; weights' block_scale point at them */
    int n_mamba;           /* Mamba layers among cfg.layers */
    int n_swa;             /* sliding-window attention layers among cfg.layers */
    int d_inner, conv_dim, in_proj_dim;
    uint64_t identity;     /* cn_model_identity */
    int shared_apart;      /* cn_model_opts.shared_apart: no MoE folds its shared expert */
};

/* The scan parameters of a Mamba layer's weights. */
static inline cn_ssm_args cn_mamba_args(const cn_model *m, const cn_mamba_w *w) {
    const cn_config *c = &m->cfg;
    cn_ssm_args a = {
        .A_log = &w->A_log, .D = &w->D, .dt_bias = &w->dt_bias,
        .n_heads = c->mamba_n_heads, .head_dim = c->mamba_head_dim, .n_groups = c->n_groups,
        .d_state = c->ssm_state_size, .chunk = c->chunk_size, .dt_min = c->dt_min, .dt_max = c->dt_max,
    };
    return a;
}

/* model_load.c: binds weights (called by cn_model_open). */
int cn_model_bind_weights(cn_model *m, cn_err *err);
void cn_model_unbind_weights(cn_model *m);
/* The arrays a layer's weights own (a MoE's expert tables); the tensors are not touched. */
void cn_model_free_layer(cn_layer_w *l);
/* How many parts the config's shared expert folds into (cn_moe_w.n_parts when the formats allow
 * it): moe_shared_intermediate_size / moe_intermediate_size when that divides evenly into at
 * most CN_MOE_MAX_PARTS, else 0. */
int cn_moe_parts_of(const cn_config *c);
/* Sets w->n_parts and the parts (cn_moe_w) from w's shared and routed experts, whose tables must
 * hold E + CN_MOE_MAX_PARTS entries; call again after w's tensors move (a copied layer). */
void cn_moe_fold_shared(const cn_model *m, cn_moe_w *w);
/* mtp_draft.c: releases the drafting copy (safe when there is none). */
void cn_model_mtp_draft_free(cn_model *m);
/* identity.c: the identity of the checkpoint in dir whose tensors st maps. */
int cn_model_identity_of(const char *dir, const cn_safetensors *st, uint64_t *out, cn_err *err);

#endif
