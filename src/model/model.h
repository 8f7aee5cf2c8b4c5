/* model.h - a loaded NemotronH model and its forward pass over explicit per-sequence state.
 *
 * cn_model_open() reads config.json, maps the safetensors, checks every tensor the config implies
 * (name, shape, dtype) and binds the weights to a backend; nothing is copied except the small
 * vectors (norms, conv, A_log, D, dt_bias), which are converted to F32 once. The forward pass calls
 * only the backend table (tensor/backend.h), so the same code runs on every backend.
 *
 * State lives outside the model, in a cn_state per sequence (state.h): one cache per stateful
 * layer, all at one offset. A forward absorbs n tokens at the state's offset and returns logits of
 * the last or of every position; it can also stop its recurrent scans at scheduled offsets inside
 * the batch and hand back each boundary's recurrent state (cn_rsnap), which is what restore points
 * are made of.
 *
 * Invariants:
 *  (1) A forward either absorbs all n tokens and returns 0, or returns an error with the state's
 *      offset unchanged (the contents of recurrent state are then undefined: restore before reuse).
 *  (2) Results do not depend on how a sequence is split into forwards, up to float rounding.
 *  (3) One forward at a time per model: the scratch buffers belong to the model.
 */
#ifndef CN_MODEL_H
#define CN_MODEL_H

#include <stdint.h>

#include "base/error.h"
#include "model/config.h"
#include "tensor/backend.h"

typedef struct cn_model cn_model; /* layout: model_impl.h */
typedef struct cn_state cn_state; /* layout: state.h */

/* The steps of cn_model_open, in order, for progress displays. */
typedef enum cn_load_stage {
    CN_LOAD_CONFIG, /* reading config.json */
    CN_LOAD_MAP,    /* mapping the safetensors files */
    CN_LOAD_BIND,   /* checking and binding the weights (bytes: tensor data mapped) */
} cn_load_stage;

/* Called as each stage begins; bytes is 0 until the files are mapped. */
typedef void (*cn_load_stage_fn)(void *ctx, cn_load_stage stage, uint64_t bytes);

/* Tokens per forward piece when the caller does not say. Each piece passes over every weight once,
 * and a gathered MoE runs each expert over the piece's tokens routed to it: at 256 a nano-shape
 * expert (128 experts, top 6) sees about 12 rows, so its weights come from memory for few
 * multiply-adds (and its tile runs short); at 1024 about 48, for 0.18 GB more scratch (CPU
 * prefill of the 6-layer nano-shape slice: 129 against 87 tok/s at 256). A served request's
 * forwards are at most the engine's chunk (cn_engine_opts.chunk, 512 on the CPU) anyway. On the
 * CUDA backend more rows per expert also fill the grouped GEMM's 128-row tiles, and 2048 beat
 * 1024 there, so GPU pieces take 2048 (docs/performance.md, "Figures behind defaults"). */
#define CN_UBATCH_DEFAULT 1024
#define CN_UBATCH_DEFAULT_GPU 2048

typedef struct cn_model_opts {
    int ubatch; /* tokens per internal forward chunk (scratch size); 0 = CN_UBATCH_DEFAULT, or
                 * CN_UBATCH_DEFAULT_GPU on a backend other than cpu */
    cn_load_stage_fn on_stage; /* (optional) */
    void *stage_ctx;
    int shared_apart; /* 1: a MoE's shared expert runs as two products of its own instead of as
                       * more experts of the routed ones' tables (the form before that fold,
                       * kept to compare the two; the CLI sets it from CAIRN_SHARED_APART=1) */
} cn_model_opts;

/* A whole-state snapshot at one offset: every Mamba layer's conv tail and SSM state, and every
 * sliding-window layer's window (what cannot be rewound). Tensors live on the model's backend;
 * free with cn_rsnap_free. */
typedef struct cn_rsnap {
    int offset;       /* tokens absorbed when taken */
    int n_layers;     /* number of Mamba layers */
    cn_tensor *conv;  /* [n_layers] each [K-1, conv_dim] F32 raw inputs */
    cn_tensor *ssm;   /* [n_layers] each [n_heads, head_dim*d_state] F32 */
    int n_win;        /* number of sliding-window layers */
    cn_tensor *win_k; /* [n_win] each [W, n_kv_heads*head_dim] F32: rows [0, min(offset, W)) are */
    cn_tensor *win_v; /* positions offset-min(offset,W)..offset-1, oldest first; the rest junk */
} cn_rsnap;

/* A verify's recurrent states without a copy of them per position (cn_batch.replay). The
 * forward's Mamba scans read the state the batch starts from and write the state after it into
 * `s0`'s buffers, which then trade places with the live ones: s0 holds the starting state, and
 * the scans' inputs are kept beside it. A restore to a position inside the batch
 * (cn_model_replay) takes the starting state back and scans the rows up to there again: the same
 * operations on the same inputs, so the bits a capture at that position would hold. Only on a
 * backend computing in host memory (its buffers may change places) with
 * cn_backend_has_ssm_scan_from, for a model without sliding-window layers (their windows would
 * still need a copy per position): cn_replay_alloc says CN_EUNSUPPORTED otherwise. */
typedef struct cn_replay {
    int n_layers;    /* Mamba layers */
    int max_rows;    /* rows a forward that fills it may have */
    int rows;        /* rows of the forward that filled it last; 0: it holds nothing */
    int offset;      /* the state's offset before that forward */
    cn_tensor *s0;   /* [n_layers] each [n_heads, head_dim*d_state] F32 */
    cn_tensor *xbc;  /* [n_layers] each [max_rows, conv_dim] F32: the scan's x, B, C (after the
                      * conv and SiLU) */
    cn_tensor *dt;   /* [n_layers] each [max_rows, n_heads] F32: dt before dt_bias and softplus */
} cn_replay;

/* One forward call. */
typedef struct cn_batch {
    const int32_t *tokens; /* [n] token ids */
    int n;                 /* >= 1 */
    int all_logits;        /* 1: logits (and hidden) of every position; 0: of the last only */
    float *logits;         /* OUT (optional): host [all_logits ? n : 1][vocab] */
    float *hidden;         /* OUT (optional): host [all_logits || all_hidden ? n : 1][hidden],
                            * after norm_f */
    int all_hidden;        /* 1: hidden of every position even when all_logits is 0 (a drafter
                            * pairs each position's hidden with the next token) */
    int32_t *argmax;       /* OUT (optional): the greedy pick of the last position's logits
                            * (cn_op_argmax: the sampler's greedy token without penalties),
                            * taken on the backend, so that a decode brings 4 bytes to the host;
                            * logits may be NULL beside it */
    const int *capture_at; /* (optional) ascending offsets in (offset, offset+n] to capture at */
    int n_capture;
    cn_rsnap *captures;    /* OUT: [n_capture]; caller owns each, cn_rsnap_free() */
    int captures_ready;    /* 1: captures[] already hold buffers of this state's shapes
                            * (cn_state_snapshot_alloc) and are only filled: the forward neither
                            * allocates nor frees them, so a caller that captures every round
                            * (speculation) keeps its pages mapped and warm */
    cn_replay *replay;     /* (optional) with captures_ready, 2 <= n <= replay->max_rows and
                            * at most 64 captures (else CN_EINVAL): the captures get their conv
                            * tails only (their SSM tensors may hold no buffer,
                            * cn_state_snapshot_alloc_conv), the SSM states come from
                            * cn_model_replay */
} cn_batch;

/* Opens the checkpoint in dir on backend b (which the caller owns and frees after the model). */
int cn_model_open(cn_model **out, const char *dir, cn_backend *b, const cn_model_opts *opts,
                  cn_err *err);
void cn_model_close(cn_model *m);

const cn_config *cn_model_config(const cn_model *m);
cn_backend *cn_model_backend(const cn_model *m);
/* 1 if the checkpoint has an MTP head. */
int cn_model_has_mtp(const cn_model *m);
/* Tokens per internal forward piece, as resolved at open (cn_model_opts.ubatch or the backend's
 * default). */
int cn_model_ubatch(const cn_model *m);
/* The checkpoint's identity: xxh64 of config.json and of every tensor's name, dtype, shape and
 * first and last 64 bytes (identity.c), computed once at open. Cached state carries it so that it
 * is never loaded into another model, including another seed of the same preset. */
uint64_t cn_model_identity(const cn_model *m);
/* The same identity from a directory, without loading the model (maps the safetensors only). */
int cn_model_identity_dir(const char *dir, uint64_t *out, cn_err *err);
/* How many MoE layers run their shared expert as more experts of the routed ones' tables
 * (cn_model_opts.shared_apart; a layer whose formats differ keeps it apart). */
int cn_model_folded_moe_layers(const cn_model *m);

/* Parameter and byte counts by dtype, for `cairn info`. bytes[] is indexed by cn_dtype. (A
 * sequence's state: engine/ctx_plan.h.) */
typedef struct cn_model_stats {
    uint64_t params;                 /* every weight element, MTP included */
    uint64_t params_mtp;             /* of which in the MTP head */
    uint64_t active_params;          /* used per token: experts counted top-k + shared only */
    uint64_t bytes[CN_DTYPE_COUNT];  /* checkpoint bytes per stored dtype */
} cn_model_stats;
void cn_model_stats_get(const cn_model *m, cn_model_stats *st);

/* What one decoded token streams from memory, from the checkpoint's tensors and the config (for
 * `cairn bench`). Weight bytes are as stored (block scales included): every tensor of the main
 * model once, except that the embedding counts one row (the whole table when it is tied to
 * lm_head, which reads it all) and the routed experts of each MoE layer count k of E (every expert
 * of a layer has the same size, so that is exactly the bytes of the k chosen ones); MTP tensors
 * are left out. State bytes are reads of the sequence's caches: each Mamba layer's conv tail and
 * SSM state (F32), and each attention layer's K and V rows (F32) per token of context. */
typedef struct cn_decode_traffic {
    uint64_t weights;          /* weight bytes per decoded token, all of the below */
    uint64_t weights_outer;    /* outside backbone.layers.*: embedding row, norm_f, lm_head */
    uint64_t weights_layer[4]; /* summed over the layers of each type: [0] M, [1] *, [2] E, [3] - */
    int n_layer[4];            /* layers of each type, same index */
    uint64_t state_fixed;      /* recurrent state read per token (independent of context) */
    uint64_t kv_per_ctx;       /* KV bytes read per token of context */
    uint64_t prefill_params;   /* matrix parameters one prefill token goes through: active
                                * params less the embedding and lm_head (computed for the last
                                * position only) */
    uint64_t prefill_params_layer[4]; /* the part of prefill_params in each layer type */
    uint64_t prefill_params_nvfp4;    /* the part of prefill_params stored NVFP4 */
} cn_decode_traffic;
/* Index into weights_layer / n_layer for a block type (M 0, * 1, E 2, - 3). */
int cn_block_index(cn_block type);
void cn_model_decode_traffic(const cn_model *m, cn_decode_traffic *out);

/* Absorbs b->n tokens into s at its offset. CN_ECONTEXT if they do not fit, CN_EINVAL for a token
 * id outside the vocabulary or capture offsets out of range (state unchanged in both cases). */
int cn_model_forward(cn_model *m, cn_state *s, cn_batch *b);
/* Buffers for replays of up to max_rows rows of s's shapes (undefined contents, rows 0).
 * Returns 0, CN_EUNSUPPORTED (see cn_replay), CN_EINVAL (max_rows outside 1..ubatch, or the MTP
 * head's state) or CN_ENOMEM, with *out then holding nothing. */
int cn_replay_alloc(cn_state *s, int max_rows, cn_replay *out);
void cn_replay_free(cn_model *m, cn_replay *rp);
/* Restores s, which the forward that filled rp left at rp->offset + rp->rows, to snap->offset
 * inside that forward (snap: its capture there): attention rewinds, each Mamba layer takes the
 * capture's conv tail (the capture gets the replaced one, fit only to be written again, as
 * cn_state_restore_take) and rp's starting state, scanned again up to the offset. Then rp holds
 * nothing. Returns 0, or CN_EINVAL (offsets that do not fit) with nothing changed. */
int cn_model_replay(cn_model *m, cn_state *s, cn_replay *rp, cn_rsnap *snap);
/* One sequence's part of cn_model_forward_seqs. */
typedef struct cn_seq_batch {
    cn_state *state;       /* absorbs tokens at its own offset */
    const int32_t *tokens; /* [n] token ids, n >= 1 */
    int n;
    float *logits;         /* OUT (optional): host [vocab] after the last token */
    int32_t *argmax;       /* OUT (optional): the greedy pick after the last token */
    float *hidden;         /* OUT (optional): host [hidden] of the last token, after norm_f;
                            * with all_hidden [n][hidden], every token's */
    int all_hidden;
    const int *capture_at; /* (optional) ascending offsets in (offset, offset + n] where the
                            * recurrent state is kept, as cn_batch's */
    int n_capture;
    cn_rsnap *captures;    /* OUT: [n_capture]; caller owns each, cn_rsnap_free() */
} cn_seq_batch;

/* Absorbs the tokens of several sequences in one forward, each into its own state: every product
 * runs once over all their rows (each weight streamed once for the step, the experts gathered
 * over every row), the conv, the scan and the attention per sequence from its own state. A
 * sequence's results are the ones cn_model_forward gives it alone, on the CPU bit for bit (its
 * products are row-wise with one addition order whatever the rows: cpu_matmul.c); a device's
 * products over more rows may round differently. The states must be distinct states of the main
 * stack, the tokens at most cn_model_ubatch in all. A sequence's captures hold the state
 * cn_model_forward's would (its conv and scan cut there). Returns 0, CN_EINVAL, CN_ECONTEXT (a sequence past its state's max_ctx),
 * CN_EUNSUPPORTED (a model with sliding-window layers, unless n_seqs is 1) — with nothing
 * changed — or a backend error, after which the states are undefined. */
int cn_model_forward_seqs(cn_model *m, cn_seq_batch *seqs, int n_seqs);
/* One token; logits [vocab] of it. */
int cn_model_decode(cn_model *m, cn_state *s, int32_t token, float *logits);
/* One token; *next gets its greedy pick (cn_batch.argmax), its logits never reach the host. */
int cn_model_decode_greedy(cn_model *m, cn_state *s, int32_t token, int32_t *next);
/* k tokens; logits [k][vocab] of every one (speculative verification). */
int cn_model_verify(cn_model *m, cn_state *s, const int32_t *tokens, int k, float *logits);

/* Builds the MTP head's drafting copy once: its matrices and the lm_head as NVFP4 (FP8 where K
 * is not a multiple of 16), about a quarter of the bytes of a BF16 head to stream per draft.
 * States made with cn_state_create(..., 2) use it from then on; the stored head and the main
 * stack are never changed, and drafts only propose, so outputs stay exact and acceptance alone
 * may move. 0 (also when built already); CN_EINVAL without a head; CN_EUNSUPPORTED on a backend
 * with device memory (kept as stored there); CN_ENOMEM with nothing kept. Callers serialize
 * (like a forward). */
int cn_model_mtp_draft_build(cn_model *m);

/* MTP head over n positions of its own state s (made with cn_state_create(..., 1 or 2)): position i
 * combines hidden[i] (the target's post-norm_f hidden state) with the embedding of next[i];
 * logits OUT (optional) [n][vocab] are the draft logits; hidden_out OUT (optional) [n][H] the head's
 * own output before its final norm, for drafting further ahead. */
int cn_model_mtp_forward(cn_model *m, cn_state *s, const float *hidden, const int32_t *next,
                         int n, float *logits, float *hidden_out);
/* The same over n positions in one batch, with logits OUT [vocab] and hidden_out OUT [H] of the
 * last position only (the drafter's flush: the other rows only write their KV). */
int cn_model_mtp_forward_last(cn_model *m, cn_state *s, const float *hidden, const int32_t *next,
                              int n, float *logits, float *hidden_out);

void cn_rsnap_free(cn_model *m, cn_rsnap *snap);

#endif
