/* state.h - the per-sequence state of a NemotronH model: one cache per stateful layer.
 *
 * Attention layers keep an append-only KV buffer of max_ctx rows; sliding-window attention layers
 * a ring of W rows (position p at row p % W, the last W positions); Mamba layers keep the conv tail
 * (the last K-1 raw inputs) and the fp32 SSM state; MoE and MLP layers keep nothing. All layers sit
 * at one offset, the number of tokens absorbed. The prefix cache (src/cache) builds snapshots and
 * the trie on top of these buffers; this module only owns and moves them.
 *
 * Invariants:
 *  (1) KV rows [0, offset) hold the keys/values of the tokens absorbed; rows past offset are junk.
 *  (2) A Mamba layer's state is exactly the state after `offset` tokens.
 *  (3) Rewinding is possible only to an offset whose recurrent state is supplied (cn_rsnap) or for
 *      models without recurrent layers; anything else would be a guess.
 *  (4) A ring holds positions [max(0, offset-W), offset). Before it wraps (offset <= W) rows
 *      [0, offset) are positions 0..offset-1 and any lower offset is a valid rewind; after, only a
 *      restore (whole window, cn_rsnap or a snapshot) moves it.
 */
#ifndef CN_STATE_H
#define CN_STATE_H

#include "model/config.h"
#include "model/model.h"
#include "tensor/tensor.h"

typedef struct cn_layer_state {
    cn_block type;
    cn_tensor k, v;     /* attention: [max_ctx, n_kv_heads*head_dim] F32; window: [W, same] ring */
    int window;         /* W of a sliding-window layer (ring rows); 0 otherwise */
    cn_tensor conv;     /* Mamba: [K-1, conv_dim] F32, oldest first */
    cn_tensor ssm;      /* Mamba: [n_heads, head_dim*d_state] F32 */
} cn_layer_state;

struct cn_state {
    cn_model *model;         /* not owned */
    int mtp;                 /* 1: state of the MTP head's layers; 2: the same, run on the
                              * head's drafting copy where the model built one (model.h) */
    int n_layers;
    cn_layer_state *layers;  /* [n_layers] */
    int max_ctx;             /* KV rows per attention layer */
    int offset;              /* tokens absorbed, shared by every layer */
};

/* Allocates a zeroed state (offset 0) for the main layers (mtp = 0) or the MTP head (mtp = 1, or
 * 2: drafts from cn_model_mtp_draft_build's copy once it exists, the stored head before). */
int cn_state_create(cn_state **out, cn_model *m, int max_ctx, int mtp);
void cn_state_free(cn_state *s);
/* Back to offset 0 with zero recurrent state. */
int cn_state_reset(cn_state *s);
/* Rewinds to snap->offset (<= offset) and loads its recurrent state. KV rows below stay valid. */
int cn_state_restore(cn_state *s, const cn_rsnap *snap);
/* cn_state_restore that may take the snapshot's recurrent buffers in exchange for the live ones
 * instead of copying them: on a backend computing in host memory (no device memory, so no step
 * recorded with a buffer's address), with every buffer of one layout. The snapshot then holds
 * the replaced state: fit only to be written again (a capture buffer), never to be restored. */
int cn_state_restore_take(cn_state *s, cn_rsnap *snap);
/* Rewinds to offset when the state has no recurrent layers (else CN_EINVAL). */
int cn_state_rewind(cn_state *s, int offset);
/* Takes a snapshot of the current recurrent state (caller owns, cn_rsnap_free). */
int cn_state_snapshot(cn_state *s, cn_rsnap *out);
/* A snapshot with the right shapes and undefined contents (a forward's captures fill it). */
int cn_state_snapshot_alloc(cn_state *s, cn_rsnap *out);
/* The same without buffers for the SSM states (their tensors hold shapes only): the captures of
 * a forward that keeps those states as a replay (model.h cn_replay). */
int cn_state_snapshot_alloc_conv(cn_state *s, cn_rsnap *out);
/* Rows a whole-window snapshot at offset o holds: positions [o - n, o), oldest first. */
static inline int cn_window_rows(int window, int o) { return o < window ? o : window; }
/* 1 when the live rings allow rewinding to `offset` (no ring has wrapped past it). */
int cn_state_can_rewind(const cn_state *s, int offset);
/* Copies positions [from, to) into dst's rows [0, to - from), reading position p < n_past from the
 * ring's row p % W and p >= n_past from fresh's row p - n_past (fresh may be NULL when to <=
 * n_past). The positions must be held: from >= n_past - W. */
int cn_ring_read(cn_backend *b, cn_tensor *dst, const cn_tensor *ring, const cn_tensor *fresh,
                 int n_past, int from, int to);
/* Writes src's rows [0, to - from) as positions [from, to) (to - from <= W) into the ring. */
int cn_ring_write(cn_backend *b, cn_tensor *ring, const cn_tensor *src, int from, int to);
/* Bytes held by the state's buffers. */
uint64_t cn_state_bytes(const cn_state *s);

#endif
