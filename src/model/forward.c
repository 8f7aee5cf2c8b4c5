/* forward.c - the NemotronH forward pass, written against the backend table only.
 *
 * Reads like reference/nemotron-architecture.md §2: embeddings, then for every block
 * h = h + MIXER(RMSNorm(h)), then norm_f and lm_head. A restore point inside a batch costs no
 * extra pass: Mamba mixers run their conv and scan once over the piece, the backend writing the
 * state at each scheduled capture offset as it passes it (cn_state_caps), or, on a backend
 * without that, in segments that end at those offsets, each followed by a state copy;
 * sliding-window layers copy their window at the same offsets. A verify with a replay (model.h
 * cn_replay) writes no SSM state per capture: its scans read the live state and write the state
 * after the piece into the replay's spare buffer, which then trades places with the live one.
 * Nothing here allocates: scratch is sized at open for `ubatch` tokens and every batch is cut into
 * pieces of at most that many. A one-token piece (decode, an MTP draft) runs as one backend step
 * (backend.h): every op between one upload and the downloads, so a GPU backend waits once per
 * token and may replay the step as a graph. A longer piece's layers are one step too, never
 * recorded (CN_STEP_EAGER): its index checks wait once, at the piece's end. In a one-token step
 * on a backend that fuses matmul epilogues (cn_backend_has_matmul_ep), each mixer adds its output
 * into the residual stream from its last product (the MoE's routed and shared experts one after
 * the other) and relu^2 rides on the up products, instead of separate elementwise ops: the same
 * sums up to rounding order.
 * A greedy pick (cn_batch.argmax) is taken on the backend after the lm_head.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"
#include "model/state.h"

#define CHECK(expr)                   \
    do {                              \
        int rc_ = (expr);             \
        if (rc_) return rc_;          \
    } while (0)

static cn_tensor rows(const cn_tensor *t, int n) { return cn_tensor_rows(t, 0, n); }

/* A sequence's rows in a piece: rows [r0, r0 + n) enter st at offset off. A forward of one
 * sequence is a piece of one, cut by its segments (captures, a replay); in a piece of several
 * (cn_model_forward_seqs) every mixer runs its products over all the piece's rows and its conv,
 * scan and attention per sequence from that sequence's own state, each cut at its own captures
 * (no replay). */
typedef struct seq {
    cn_state *st;
    int r0, n, off;
    const int *cap_at; /* [n_cap] capture offsets in (off, off + n] (several sequences only) */
    int n_cap;
    cn_rsnap *caps;
} seq;

/* ---- open / close ---------------------------------------------------------------------------- */

static int alloc_f32(cn_backend *b, cn_tensor *t, int64_t r, int64_t c) {
    *t = cn_tensor_2d(CN_F32, r, c, NULL);
    return cn_backend_alloc(b, t);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Columns k .. k + P - 1 of every row of the route scratch: the ids E .. E + P - 1 of the shared
 * expert's parts and their weights 1 (the router writes columns 0 .. k - 1 only). */
static int fill_parts(cn_backend *b, cn_scratch *s, int64_t U, int64_t k, int64_t P, int64_t E) {
    const int64_t kp = k + P;
    int32_t *ids = calloc((size_t)(U * kp), sizeof *ids);
    float *wt = calloc((size_t)(U * kp), sizeof *wt);
    int rc = ids && wt ? CN_OK : CN_ENOMEM;
    for (int64_t t = 0; !rc && t < U; t++)
        for (int64_t p = 0; p < P; p++) {
            ids[t * kp + k + p] = (int32_t)(E + p);
            wt[t * kp + k + p] = 1.0f;
        }
    if (!rc) rc = cn_backend_upload(b, &s->rids, 0, ids, (uint64_t)(U * kp) * sizeof *ids);
    if (!rc) rc = cn_backend_upload(b, &s->rw, 0, wt, (uint64_t)(U * kp) * sizeof *wt);
    free(ids);
    free(wt);
    return rc;
}

static int alloc_scratch(cn_model *m) {
    const cn_config *c = &m->cfg;
    cn_scratch *s = &m->s;
    cn_backend *b = m->b;
    int64_t U = s->ubatch, H = c->hidden_size;
    int64_t k = c->n_experts_per_tok > 0 ? c->n_experts_per_tok : 1;
    int64_t E = c->n_routed_experts > 0 ? c->n_routed_experts : 1;
    int64_t wide = max64(m->in_proj_dim, (int64_t)c->n_heads * c->head_dim);
    wide = max64(wide, c->intermediate_size);
    wide = max64(wide, c->moe_shared_intermediate_size);
    int64_t ywide = max64(m->d_inner, (int64_t)c->n_heads * c->head_dim);
    s->logit_rows = U < 16 ? (int)U : 16;
    s->ids0 = -1;
    s->ids = cn_tensor_1d(CN_I32, U, NULL);
    int rc = cn_backend_alloc(b, &s->ids);
    if (!rc) rc = alloc_f32(b, &s->x, U, H);
    if (!rc) rc = alloc_f32(b, &s->xn, U, H);
    if (!rc) rc = alloc_f32(b, &s->out, U, H);
    if (!rc) rc = alloc_f32(b, &s->tmp, U, H);
    if (!rc) rc = alloc_f32(b, &s->proj, U, max64(wide, 1));
    if (!rc) rc = alloc_f32(b, &s->conv, U, max64(m->conv_dim, 1));
    if (!rc) rc = alloc_f32(b, &s->y, U, max64(ywide, 1));
    /* routes: the router's k choices, then the shared expert's parts (cn_moe_w), always chosen
     * with weight 1: those columns are written once, here */
    const int64_t P = cn_moe_parts_of(c), kp = k + P;
    if (!rc) rc = alloc_f32(b, &s->rlogits, U, E);
    if (!rc) {
        s->rids = cn_tensor_2d(CN_I32, U, kp, NULL);
        rc = cn_backend_alloc(b, &s->rids);
    }
    if (!rc) rc = alloc_f32(b, &s->rw, U, kp);
    if (!rc && P) rc = fill_parts(b, s, U, k, P, E);
    if (!rc) rc = alloc_f32(b, &s->eh, U * kp, max64(c->moe_intermediate_size, 1));
    if (!rc) rc = alloc_f32(b, &s->eo, U * kp, H);
    if (!rc) rc = alloc_f32(b, &s->cat, U, 2 * H);
    if (!rc) rc = alloc_f32(b, &s->logits, s->logit_rows, c->vocab_size);
    if (!rc) {
        s->pick = cn_tensor_1d(CN_I32, 1, NULL);
        rc = cn_backend_alloc(b, &s->pick);
    }
    if (!rc && !(s->host_logits = malloc((size_t)c->vocab_size * sizeof(float)))) rc = CN_ENOMEM;
    if (!rc && !(s->sq = malloc((size_t)U * sizeof *s->sq))) rc = CN_ENOMEM;
    if (!rc) rc = alloc_f32(b, &s->kn, U, max64((int64_t)c->n_kv_heads * c->head_dim, 1));
    if (!rc) rc = alloc_f32(b, &s->vn, U, max64((int64_t)c->n_kv_heads * c->head_dim, 1));
    return rc;
}

static void free_scratch(cn_model *m) {
    cn_scratch *s = &m->s;
    cn_tensor *all[] = {&s->ids, &s->x,  &s->xn, &s->out, &s->tmp, &s->proj, &s->conv, &s->y,
                        &s->rlogits, &s->rids, &s->rw, &s->eh, &s->eo, &s->cat, &s->logits,
                        &s->kn, &s->vn, &s->pick};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cn_backend_release(m->b, all[i]);
    free(s->host_logits);
    s->host_logits = NULL;
    free(s->sq);
    s->sq = NULL;
}

int cn_model_open(cn_model **out, const char *dir, cn_backend *b, const cn_model_opts *opts,
                  cn_err *err) {
    cn_model *m = calloc(1, sizeof *m);
    if (!m) return cn_err_set(err, CN_ENOMEM, "out of memory");
    m->b = b;
    m->shared_apart = opts && opts->shared_apart;
    int gpu = strcmp(cn_backend_name(b), "cpu") != 0;
    m->s.ubatch = opts && opts->ubatch > 0 ? opts->ubatch
                  : gpu                   ? CN_UBATCH_DEFAULT_GPU
                                          : CN_UBATCH_DEFAULT;
    cn_load_stage_fn stage = opts ? opts->on_stage : NULL;
    if (stage) stage(opts->stage_ctx, CN_LOAD_CONFIG, 0);
    int rc = cn_config_load_dir(&m->cfg, dir, err);
    if (rc) goto fail;
    if (stage) stage(opts->stage_ctx, CN_LOAD_MAP, 0);
    if (m->cfg.sliding_window > 0 && !cn_backend_has_attention_window(b)) {
        rc = cn_err_set(err, CN_EUNSUPPORTED,
                        "%s: the model has sliding-window attention layers (sliding_window %d), "
                        "which the %s backend does not implement; use --backend cpu", dir,
                        m->cfg.sliding_window, cn_backend_name(b));
        goto fail;
    }
    rc = cn_st_open_dir(&m->st, dir, err);
    if (rc) goto fail;
    if (stage) {
        uint64_t bytes = 0;
        for (int i = 0; i < cn_st_count(m->st); i++) bytes += cn_st_at(m->st, i)->nbytes;
        stage(opts->stage_ctx, CN_LOAD_BIND, bytes);
    }
    rc = cn_model_identity_of(dir, m->st, &m->identity, err);
    if (rc) goto fail;
    rc = cn_qconfig_load_dir(&m->qc, dir, err);
    if (rc) goto fail;
    rc = cn_model_bind_weights(m, err);
    if (rc) goto fail;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        m->n_mamba += m->cfg.layers[l] == CN_BLOCK_MAMBA;
        m->n_swa += m->cfg.layers[l] == CN_BLOCK_SWA;
    }
    rc = alloc_scratch(m);
    if (rc) {
        cn_err_set(err, rc, "cannot allocate scratch for %d tokens: %s", m->s.ubatch, cn_strerror(rc));
        goto fail;
    }
    *out = m;
    return CN_OK;
fail:
    cn_model_close(m);
    return rc;
}

void cn_model_close(cn_model *m) {
    if (!m) return;
    free_scratch(m);
    cn_model_unbind_weights(m);
    if (m->st) cn_st_close(m->st);
    cn_qconfig_free(&m->qc);
    cn_config_free(&m->cfg);
    free(m);
}

const cn_config *cn_model_config(const cn_model *m) { return &m->cfg; }
cn_backend *cn_model_backend(const cn_model *m) { return m->b; }
int cn_model_has_mtp(const cn_model *m) { return m->w.has_mtp; }
int cn_model_ubatch(const cn_model *m) { return m->s.ubatch; }
int cn_model_folded_moe_layers(const cn_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        n += m->w.layers[l].type == CN_BLOCK_MOE && m->w.layers[l].moe.n_parts > 0;
    return n;
}
uint64_t cn_model_identity(const cn_model *m) { return m->identity; }

/* ---- mixers ---------------------------------------------------------------------------------- */

/* A mixer's input. Plainly xn = RMSNorm(h), computed before the mixer. In a fused step
 * (run_layers: a one-token piece on a backend with cn_backend_has_matmul_ep) it is h itself with
 * the layer's norm still to apply: each product normalises h as it reads it where the backend
 * fuses that, else the norm runs once into xn. A mixer's products all read its input before any
 * of them adds into h. */
typedef struct mix_in {
    const cn_tensor *h;    /* the residual stream (fused), or xn (plain) */
    const cn_tensor *norm; /* the pre-mixer norm weight (fused), or NULL */
    cn_tensor *xn;         /* where the norm lands when it runs on its own */
    int normed;            /* xn holds RMSNorm(h) */
    int fuse;              /* products may take cn_mm_ep */
} mix_in;

/* The input as a plain op takes it: xn, normalised first if that has not happened yet. The norm
 * writes xn, which products on another lane may read: it joins an open fork first (backend.h
 * lanes), and the mixer's ops run in order from there. */
static int in_plain(cn_model *m, mix_in *in, const cn_tensor **x) {
    if (in->norm && !in->normed) {
        CHECK(cn_backend_join(m->b));
        CHECK(cn_op_rmsnorm(m->b, in->xn, in->h, in->norm, m->cfg.norm_eps));
        in->normed = 1;
    }
    *x = in->norm ? in->xn : in->h;
    return CN_OK;
}

/* What a fused product of the input does: the norm unless it already ran, and `ep`. 0 when there
 * is nothing to fuse (the plain op is as fast). */
static int in_fuse(const cn_model *m, const mix_in *in, int ep, cn_mm_ep *f, const cn_tensor **x) {
    memset(f, 0, sizeof *f);
    f->ep = ep;
    f->norm = in->norm && !in->normed ? in->norm : NULL;
    f->eps = m->cfg.norm_eps;
    *x = f->norm ? in->h : in->xn;
    return in->fuse && (f->ep || f->norm);
}

/* y = in W^T, then relu^2 when ep is CN_EP_RELU2: fused where the backend allows. */
static int mm_in(cn_model *m, mix_in *in, cn_tensor *y, const cn_tensor *w, int ep) {
    cn_mm_ep f;
    const cn_tensor *x;
    if (in_fuse(m, in, ep, &f, &x)) {
        int rc = cn_op_matmul_ep(m->b, y, w, x, &f);
        if (rc != CN_EUNSUPPORTED) return rc;
    }
    CHECK(in_plain(m, in, &x));
    CHECK(cn_op_matmul(m->b, y, w, x));
    return ep == CN_EP_RELU2 ? cn_op_relu2(m->b, y, y) : CN_OK;
}

/* The same for experts: y = in W[ids]^T per row, then relu^2 when ep is CN_EP_RELU2. */
static int mm_gather_in(cn_model *m, mix_in *in, cn_tensor *y, const cn_tensor *const *w, int n_w,
                        const cn_tensor *ids, int ep) {
    cn_mm_ep f;
    const cn_tensor *x;
    if (in_fuse(m, in, ep, &f, &x)) {
        int rc = cn_op_matmul_gather_ep(m->b, y, w, n_w, x, ids, &f);
        if (rc != CN_EUNSUPPORTED) return rc;
    }
    CHECK(in_plain(m, in, &x));
    CHECK(cn_op_matmul_gather(m->b, y, w, n_w, x, ids));
    return ep == CN_EP_RELU2 ? cn_op_relu2(m->b, y, y) : CN_OK;
}

/* A mixer's last product y = x W^T, or with acc (a fused step) h += x W^T into the residual
 * stream h = y: fused where the backend allows, else through s->out. */
static int matmul_out(cn_model *m, int acc, cn_tensor *y, const cn_tensor *w, const cn_tensor *x) {
    if (!acc) return cn_op_matmul(m->b, y, w, x);
    const cn_mm_ep f = {.ep = CN_EP_ACC};
    int rc = cn_op_matmul_ep(m->b, y, w, x, &f);
    if (rc != CN_EUNSUPPORTED) return rc;
    cn_tensor o = rows(&m->s.out, (int)y->shape[0]);
    CHECK(cn_op_matmul(m->b, &o, w, x));
    return cn_op_add(m->b, y, y, &o);
}

/* Captures a piece is cut at, at most (more shorten the piece): its segments are these and the
 * rest. */
#define PIECE_CAPS 64

/* A piece of a batch ends at `end` (tokens into the piece); capture >= 0 names the snapshot that
 * receives the recurrent state there. */
typedef struct segment {
    int end;
    int capture;
} segment;

/* Conv and scan over rows [r0, r0 + n) of the piece from the layer state ls. */
static int mamba_span(cn_model *m, const cn_mamba_w *w, const cn_ssm_args *a, cn_layer_state *ls,
                      cn_tensor *conv, cn_tensor *xbc, cn_tensor *dt, cn_tensor *y, int r0, int n) {
    cn_backend *b = m->b;
    const int64_t di = m->d_inner, gn = (int64_t)m->cfg.n_groups * m->cfg.ssm_state_size;
    cn_tensor cx = cn_tensor_rows(conv, r0, n), ix = cn_tensor_rows(xbc, r0, n);
    CHECK(cn_op_conv1d(b, &cx, &ix, &w->conv_w, w->conv_b.data ? &w->conv_b : NULL, 1,
                       &ls->conv));                                    /* xBC = silu(conv(xBC)) */
    cn_tensor xs = cn_tensor_cols(&cx, 0, di);
    cn_tensor B = cn_tensor_cols(&cx, di, gn), C = cn_tensor_cols(&cx, di + gn, gn);
    cn_tensor dts = cn_tensor_rows(dt, r0, n), ys = cn_tensor_rows(y, r0, n);
    if (n == 1) return cn_op_ssm_step(b, &ys, &xs, &dts, &B, &C, a, &ls->ssm);
    return cn_op_ssm_scan(b, &ys, &xs, &dts, &B, &C, a, &ls->ssm);      /* y = SSM + D x */
}

/* Conv and scan over rows [r0, r0 + seg[n_seg - 1].end) of the piece from ls, cut at the
 * segments' ends; a segment that names a capture leaves ls's state there in caps[capture]. */
static int mamba_segments(cn_model *m, const cn_mamba_w *w, const cn_ssm_args *a, cn_layer_state *ls,
                          cn_tensor *conv, cn_tensor *xbc, cn_tensor *dt, cn_tensor *y, int r0,
                          const segment *seg, int n_seg, cn_rsnap *caps, int mamba_idx) {
    int start = 0;
    for (int i = 0; i < n_seg; i++) {
        int n = seg[i].end - start;
        if (n > 0) CHECK(mamba_span(m, w, a, ls, conv, xbc, dt, y, r0 + start, n));
        if (seg[i].capture >= 0) {
            cn_rsnap *snap = &caps[seg[i].capture];
            CHECK(cn_backend_copy(m->b, &snap->conv[mamba_idx], &ls->conv));
            CHECK(cn_backend_copy(m->b, &snap->ssm[mamba_idx], &ls->ssm));
        }
        start = seg[i].end;
    }
    return CN_OK;
}

/* MAMBA2(in) -> out (acc: added into out), over the T rows of the piece's sequences (layer l of
 * each); one sequence's are cut in segments, and with rp (a verify, one piece) the captures get
 * their conv tails and rp the SSM's starting state and inputs. */
static int mamba_mixer(cn_model *m, const cn_mamba_w *w, const seq *sq, int nsq, int l,
                       int mamba_idx, cn_tensor *out, int acc, mix_in *in, int T,
                       const segment *seg, int n_seg, cn_rsnap *caps, cn_replay *rp) {
    const cn_config *c = &m->cfg;
    cn_backend *b = m->b;
    cn_scratch *s = &m->s;
    int64_t di = m->d_inner, gn = (int64_t)c->n_groups * c->ssm_state_size;
    const cn_ssm_args a = cn_mamba_args(m, w);
    cn_tensor zxbcdt = rows(&s->proj, T);
    zxbcdt.shape[1] = m->in_proj_dim;
    CHECK(mm_in(m, in, &zxbcdt, &w->in_proj, 0));                     /* in_proj */
    cn_tensor z = cn_tensor_cols(&zxbcdt, 0, di);                      /* gate */
    cn_tensor xbc = cn_tensor_cols(&zxbcdt, di, m->conv_dim);          /* conv input */
    cn_tensor dt = cn_tensor_cols(&zxbcdt, di + m->conv_dim, c->mamba_n_heads);
    cn_tensor conv = rows(&s->conv, T);
    conv.shape[1] = m->conv_dim;
    cn_tensor y = rows(&s->y, T);
    y.shape[1] = di;
    cn_layer_state *ls = &sq[0].st->layers[l];
    for (int i = 0; nsq > 1 && i < nsq; i++) { /* each sequence cut at its captures */
        segment cut[PIECE_CAPS + 1];
        int nc = 0;
        for (; nc < sq[i].n_cap; nc++) cut[nc] = (segment){sq[i].cap_at[nc] - sq[i].off, nc};
        cut[nc++] = (segment){sq[i].n, -1};
        CHECK(mamba_segments(m, w, &a, &sq[i].st->layers[l], &conv, &xbc, &dt, &y, sq[i].r0, cut, nc,
                             sq[i].caps, mamba_idx));
    }
    if (nsq > 1) n_seg = 0;
    /* With captures, one conv and one scan over the whole piece where the backend writes the
     * captured states as it passes them (cn_state_caps): the same states, bit for bit, without
     * the calls and the copies of the live state that cutting at each capture costs. */
    int rows_at[PIECE_CAPS], n_cap = 0;
    cn_tensor *cap_conv[PIECE_CAPS], *cap_ssm[PIECE_CAPS];
    for (int i = 0; i < n_seg; i++) {
        if (seg[i].capture < 0) continue;
        rows_at[n_cap] = seg[i].end;
        cap_conv[n_cap] = &caps[seg[i].capture].conv[mamba_idx];
        cap_ssm[n_cap++] = &caps[seg[i].capture].ssm[mamba_idx];
    }
    if (rp || (n_cap > 0 && rows_at[0] >= 1 && cn_backend_has_state_caps(b))) {
        const cn_state_caps cc = {.n = n_cap, .rows = rows_at, .states = cap_conv};
        /* xBC = silu(conv(xBC)) */
        CHECK(cn_op_conv1d_caps(b, &conv, &xbc, &w->conv_w, w->conv_b.data ? &w->conv_b : NULL,
                                1, &ls->conv, &cc));
        cn_tensor xs = cn_tensor_cols(&conv, 0, di);
        cn_tensor B = cn_tensor_cols(&conv, di, gn), C = cn_tensor_cols(&conv, di + gn, gn);
        if (rp) { /* model.h cn_replay: no SSM state written but the one after the piece */
            cn_tensor kin = rows(&rp->xbc[mamba_idx], T), kdt = rows(&rp->dt[mamba_idx], T);
            CHECK(cn_backend_copy(b, &kin, &conv));
            CHECK(cn_backend_copy(b, &kdt, &dt));
            CHECK(cn_op_ssm_scan_from(b, &y, &xs, &dt, &B, &C, &a, &rp->s0[mamba_idx], &ls->ssm));
            /* live: the state after; s0: the one before */
            cn_tensor_swap_data(&ls->ssm, &rp->s0[mamba_idx]);
        } else {
            const cn_state_caps sc = {.n = n_cap, .rows = rows_at, .states = cap_ssm};
            CHECK(cn_op_ssm_scan_caps(b, &y, &xs, &dt, &B, &C, &a, &ls->ssm, &sc)); /* y = SSM + D x */
        }
        n_seg = 0; /* done: the loop below has nothing left to cut */
    }
    CHECK(mamba_segments(m, w, &a, ls, &conv, &xbc, &dt, &y, 0, seg, n_seg, caps, mamba_idx));
    /* gate before the grouped norm: norm(y * silu(z)) * w; fused, inside out_proj's product */
    const int group = (int)(di / c->n_groups);
    if (acc) {
        const cn_mm_ep f = {.ep = CN_EP_ACC, .norm = &w->norm, .gate = &z, .group = group,
                            .eps = c->norm_eps};
        int rc = cn_op_matmul_ep(b, out, &w->out_proj, &y, &f);
        if (rc != CN_EUNSUPPORTED) return rc;
    }
    CHECK(cn_op_gated_rmsnorm(b, &y, &y, &z, &w->norm, group, c->norm_eps));
    return matmul_out(m, acc, out, &w->out_proj, &y);                 /* out_proj */
}

/* A mixer's side lane (backend.h lanes) for a decode token only: a prefill piece's products
 * fill the device on their own, and side by side they were never measured faster. */
static int fork_decode(cn_backend *b, int T) { return T == 1 ? cn_backend_fork(b) : CN_OK; }

/* Attention's products: K and V appended to the cache on a side lane beside Q (backend.h
 * lanes: they read the input and write their own rows); joined on every path, an error too. */
static int attn_kvq(cn_model *m, const cn_attn_w *w, cn_layer_state *ls, int offset, mix_in *in,
                    int T, cn_tensor *q) {
    cn_backend *b = m->b;
    int rc = fork_decode(b, T);
    if (rc) return rc;
    if (T == 1) {
        cn_tensor kn = rows(&m->s.kn, 1), vn = rows(&m->s.vn, 1);
        rc = mm_in(m, in, &kn, &w->k, 0);
        if (!rc) rc = mm_in(m, in, &vn, &w->v, 0);
        if (!rc) rc = cn_op_set_rows(b, &ls->k, offset, &kn);        /* append to the cache */
        if (!rc) rc = cn_op_set_rows(b, &ls->v, offset, &vn);
    } else {
        cn_tensor kc = cn_tensor_rows(&ls->k, offset, T), vc = cn_tensor_rows(&ls->v, offset, T);
        rc = mm_in(m, in, &kc, &w->k, 0);                            /* append to the cache */
        if (!rc) rc = mm_in(m, in, &vc, &w->v, 0);
    }
    if (!rc) rc = cn_backend_back(b);
    if (!rc) rc = mm_in(m, in, q, &w->q, 0);
    const int j = cn_backend_join(b);
    return rc ? rc : j;
}

/* ATTN(xn) -> out: GQA over the KV cache, no positional encoding. A one-token step's K/V row
 * goes through scratch and cn_op_set_rows, whose row (like attention's n_past) follows the
 * step's position, so a backend can replay the step at the next offset (backend.h, steps (d)).
 * A piece of several sequences (layer l of each) computes K and V for all its rows into scratch,
 * then appends each sequence's rows to its own cache and attends over that cache. */
static int attn_mixer(cn_model *m, const cn_attn_w *w, const seq *sq, int nsq, int l,
                      cn_tensor *out, int acc, mix_in *in, int T) {
    const cn_config *c = &m->cfg;
    cn_backend *b = m->b;
    const float scale = 1.0f / sqrtf((float)c->head_dim);
    cn_tensor q = rows(&m->s.proj, T);
    q.shape[1] = (int64_t)c->n_heads * c->head_dim;
    cn_tensor att = rows(&m->s.y, T);
    att.shape[1] = q.shape[1];
    if (nsq == 1) {
        cn_layer_state *ls = &sq[0].st->layers[l];
        CHECK(attn_kvq(m, w, ls, sq[0].off, in, T, &q));
        CHECK(cn_op_attention(b, &att, &q, &ls->k, &ls->v, sq[0].off, c->n_heads, c->n_kv_heads,
                              scale));
        return matmul_out(m, acc, out, &w->o, &att);
    }
    cn_tensor kn = rows(&m->s.kn, T), vn = rows(&m->s.vn, T);
    CHECK(mm_in(m, in, &kn, &w->k, 0));
    CHECK(mm_in(m, in, &vn, &w->v, 0));
    CHECK(mm_in(m, in, &q, &w->q, 0));
    for (int i = 0; i < nsq; i++) {
        cn_layer_state *ls = &sq[i].st->layers[l];
        cn_tensor ki = cn_tensor_rows(&kn, sq[i].r0, sq[i].n), vi = cn_tensor_rows(&vn, sq[i].r0, sq[i].n);
        cn_tensor qi = cn_tensor_rows(&q, sq[i].r0, sq[i].n), ai = cn_tensor_rows(&att, sq[i].r0, sq[i].n);
        CHECK(cn_op_set_rows(b, &ls->k, sq[i].off, &ki));            /* append to its cache */
        CHECK(cn_op_set_rows(b, &ls->v, sq[i].off, &vi));
        CHECK(cn_op_attention(b, &ai, &qi, &ls->k, &ls->v, sq[i].off, c->n_heads, c->n_kv_heads,
                              scale));
    }
    return matmul_out(m, acc, out, &w->o, &att);
}

/* Sliding-window ATTN(xn) -> out: the new K/V rows stay in scratch while the attention reads the
 * ring and them, so no position a query of this batch needs is overwritten first; captures copy
 * their window from the same two places; then the last min(T, W) rows enter the ring. */
static int swa_mixer(cn_model *m, const cn_attn_w *w, cn_layer_state *ls, int swa_idx, int offset,
                     cn_tensor *out, int acc, mix_in *in, int T, const segment *seg, int n_seg,
                     cn_rsnap *caps) {
    const cn_config *c = &m->cfg;
    cn_backend *b = m->b;
    const int W = ls->window;
    cn_tensor q = rows(&m->s.proj, T), kn = rows(&m->s.kn, T), vn = rows(&m->s.vn, T);
    q.shape[1] = (int64_t)c->n_heads * c->head_dim;
    CHECK(mm_in(m, in, &q, &w->q, 0));
    CHECK(mm_in(m, in, &kn, &w->k, 0));
    CHECK(mm_in(m, in, &vn, &w->v, 0));
    for (int i = 0; i < n_seg; i++) {
        if (seg[i].capture < 0) continue;
        cn_rsnap *snap = &caps[seg[i].capture];
        int at = offset + seg[i].end, n = cn_window_rows(W, at);
        CHECK(cn_ring_read(b, &snap->win_k[swa_idx], &ls->k, &kn, offset, at - n, at));
        CHECK(cn_ring_read(b, &snap->win_v[swa_idx], &ls->v, &vn, offset, at - n, at));
    }
    cn_tensor att = rows(&m->s.y, T);
    att.shape[1] = q.shape[1];
    CHECK(cn_op_attention_window(b, &att, &q, &kn, &vn, &ls->k, &ls->v, offset, W, c->n_heads,
                                 c->n_kv_heads, 1.0f / sqrtf((float)c->head_dim)));
    int keep = T < W ? T : W;
    cn_tensor kt = cn_tensor_rows(&kn, T - keep, keep), vt = cn_tensor_rows(&vn, T - keep, keep);
    CHECK(cn_ring_write(b, &ls->k, &kt, offset + T - keep, offset + T));
    CHECK(cn_ring_write(b, &ls->v, &vt, offset + T - keep, offset + T));
    return matmul_out(m, acc, out, &w->o, &att);
}

/* The router's logits and routes from the input: in one op where the backend fuses them (a
 * decode token), else its product and then moe_route. */
static int route_in(cn_model *m, mix_in *in, const cn_moe_w *w, cn_tensor *ids, cn_tensor *rw,
                    cn_tensor *rl, const cn_route_args *ra) {
    const cn_tensor *bias = w->bias.data ? &w->bias : NULL;
    cn_mm_ep f;
    const cn_tensor *x;
    in_fuse(m, in, 0, &f, &x);
    if (in->fuse) {
        int rc = cn_op_moe_route_ep(m->b, ids, rw, rl, &w->gate, x, &f, bias, ra);
        if (rc != CN_EUNSUPPORTED) return rc;
    }
    CHECK(mm_in(m, in, rl, &w->gate, 0));                             /* router logits, fp32 */
    return cn_op_moe_route(m->b, ids, rw, rl, bias, ra);
}

/* MOE(in) -> out: sigmoid router with correction bias, relu² experts, unscaled shared expert.
 * With the shared expert folded into the expert tables (cn_moe_w.n_parts), each token's k routes
 * are followed by its parts, so one gathered product runs every up projection and one every down
 * projection, and the weighted sum over the k + n_parts rows is the MoE's output. Otherwise, with
 * acc, both expert sums are added into out in turn, the routed one by the down products' own
 * epilogue where the backend fuses it (moe_combine and the add in one launch); the shared
 * expert's up product reads the input before that. */
static int moe_mixer(cn_model *m, const cn_moe_w *w, cn_tensor *out, int acc, mix_in *in, int T) {
    const cn_config *c = &m->cfg;
    cn_backend *b = m->b;
    cn_scratch *s = &m->s;
    const int64_t k = c->n_experts_per_tok, kp = k + w->n_parts;
    const int n_w = c->n_routed_experts + w->n_parts;
    cn_route_args ra = {.top_k = (int)k, .n_group = c->n_group, .topk_group = c->topk_group,
                        .norm_topk = c->norm_topk_prob, .scaling = c->routed_scaling_factor};
    cn_tensor rl = rows(&s->rlogits, T), ids_all = rows(&s->rids, T), rw_all = rows(&s->rw, T);
    cn_tensor ids = cn_tensor_cols(&ids_all, 0, kp), rw = cn_tensor_cols(&rw_all, 0, kp);
    cn_tensor rids = cn_tensor_cols(&ids_all, 0, k), rrw = cn_tensor_cols(&rw_all, 0, k);
    cn_tensor eh = rows(&s->eh, T * kp), eo = rows(&s->eo, T * kp);
    cn_tensor sh = rows(&s->proj, T), so = rows(&s->tmp, T);
    sh.shape[1] = c->moe_shared_intermediate_size;
    const int shared_apart = w->has_shared && !w->n_parts;
    /* a decode token's routing and routed up on a side lane beside the shared up (backend.h
     * lanes), joined on every path, an error too */
    int rc = shared_apart ? fork_decode(b, T) : CN_OK;
    if (rc) return rc;
    rc = route_in(m, in, w, &rids, &rrw, &rl, &ra);
    if (!rc) rc = mm_gather_in(m, in, &eh, w->up_p, n_w, &ids, CN_EP_RELU2);
    if (shared_apart) {
        if (!rc) rc = cn_backend_back(b);
        if (!rc) rc = mm_in(m, in, &sh, &w->shared_up, CN_EP_RELU2);
        const int j = cn_backend_join(b);
        if (!rc) rc = j;
    }
    CHECK(rc);
    const cn_mm_ep comb = {.ep = CN_EP_ACC, .weights = &rw};
    rc = acc ? cn_op_matmul_gather_ep(b, out, w->down_p, n_w, &eh, &ids, &comb) : CN_EUNSUPPORTED;
    if (rc == CN_EUNSUPPORTED) {
        cn_tensor o = acc ? rows(&s->out, T) : *out;
        CHECK(cn_op_matmul_gather(b, &eo, w->down_p, n_w, &eh, &ids));
        rc = cn_op_moe_combine(b, &o, &eo, &rw);                      /* sum_j w_j expert_j */
        if (!rc && acc) rc = cn_op_add(b, out, out, &o);
    }
    CHECK(rc);
    if (!shared_apart) return CN_OK;
    if (acc) return matmul_out(m, 1, out, &w->shared_down, &sh);      /* shared expert, unscaled */
    CHECK(cn_op_matmul(b, &so, &w->shared_down, &sh));
    return cn_op_add(b, out, out, &so);                               /* shared expert, unscaled */
}

/* MLP(in) -> out (acc: added into out): down(relu(up(in))^2). */
static int mlp_mixer(cn_model *m, const cn_mlp_w *w, cn_tensor *out, int acc, mix_in *in, int T) {
    cn_tensor h = rows(&m->s.proj, T);
    h.shape[1] = m->cfg.intermediate_size;
    CHECK(mm_in(m, in, &h, &w->up, CN_EP_RELU2));
    return matmul_out(m, acc, out, &w->down, &h);
}

/* 1 for a layer that keeps state per token (a KV cache or a recurrent state). */
static int keeps_state(cn_block t) { return t == CN_BLOCK_MAMBA || cn_block_is_attn(t); }

/* h = h + MIXER(RMSNorm(h)) for every layer of a stack, over the T rows of the piece's nsq
 * sequences. A one-token piece on a backend that fuses lets the mixers normalise h in their first
 * products and add into h from their last (acc; mix_in). Only rows [need_from, T) need the
 * stack's output: the others are there for the state they leave, so the layers after the last one
 * that keeps state (MoE, MLP: row-wise) skip them. Rows below need_from then hold junk in x; each
 * row computed is what it would be without the skip (every op is row-wise there). */
static int run_layers(cn_model *m, const cn_layer_w *layers, const seq *sq, int nsq, int T,
                      const segment *seg, int n_seg, cn_rsnap *caps, cn_replay *rp, int need_from) {
    cn_backend *b = m->b;
    cn_tensor x = rows(&m->s.x, T), xn = rows(&m->s.xn, T), out = rows(&m->s.out, T);
    const int acc = T == 1 && cn_backend_has_matmul_ep(b);
    cn_tensor *dst = acc ? &x : &out;
    const int n_layers = sq[0].st->n_layers;
    int mamba_idx = 0, swa_idx = 0, last_state = -1;
    for (int l = 0; l < n_layers; l++)
        if (keeps_state(layers[l].type)) last_state = l;
    for (int l = 0; l < n_layers; l++) {
        const cn_layer_w *w = &layers[l];
        if (l == last_state + 1 && need_from > 0) { /* the row-wise tail: needed rows only */
            if (need_from >= T) break;
            T -= need_from;
            x = cn_tensor_rows(&m->s.x, need_from, T);
            xn = rows(&m->s.xn, T);
            out = rows(&m->s.out, T);
        }
        mix_in in = {.h = &xn, .xn = &xn, .normed = 1};
        if (acc) in = (mix_in){.h = &x, .norm = &w->norm, .xn = &xn, .fuse = 1};
        else CHECK(cn_op_rmsnorm(b, &xn, &x, &w->norm, m->cfg.norm_eps)); /* pre-mixer norm */
        switch (w->type) {
        case CN_BLOCK_MAMBA:
            CHECK(mamba_mixer(m, &w->mamba, sq, nsq, l, mamba_idx++, dst, acc, &in, T, seg, n_seg,
                              caps, rp));
            break;
        case CN_BLOCK_ATTN: CHECK(attn_mixer(m, &w->attn, sq, nsq, l, dst, acc, &in, T)); break;
        case CN_BLOCK_SWA: /* one sequence only (cn_model_forward_seqs refuses these models) */
            CHECK(swa_mixer(m, &w->attn, &sq[0].st->layers[l], swa_idx++, sq[0].off, dst, acc, &in,
                            T, seg, n_seg, caps));
            break;
        case CN_BLOCK_MOE: CHECK(moe_mixer(m, &w->moe, dst, acc, &in, T)); break;
        case CN_BLOCK_MLP: CHECK(mlp_mixer(m, &w->mlp, dst, acc, &in, T)); break;
        }
        if (!acc) CHECK(cn_op_add(b, &x, &x, &out));                  /* residual */
    }
    return CN_OK;
}

/* The host's greedy pick of a logits row, by cn_op_argmax's rules (for a backend without it). */
static int32_t host_argmax(const float *v, int64_t n) {
    int32_t best = 0;
    float best_x = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float x = v[i];
        if (isnan(x)) continue;
        if (x > FLT_MAX) x = FLT_MAX;
        if (x > best_x) {
            best_x = x;
            best = (int32_t)i;
        }
    }
    return best;
}

/* The greedy pick of logits row lg into *pick: from `dev` when cn_op_argmax was queued on it
 * (queued), else from the row downloaded into `host` (the model's own host row when the caller
 * keeps no logits, or the caller's row already downloaded). */
static int fetch_pick(cn_model *m, int queued, const cn_tensor *dev, const cn_tensor *lg,
                      float *host, int32_t *pick) {
    if (queued) return cn_backend_download(m->b, pick, dev);
    if (!host) {
        host = m->s.host_logits;
        CHECK(cn_backend_download(m->b, host, lg));
    }
    *pick = host_argmax(host, m->cfg.vocab_size);
    return CN_OK;
}

/* Final norm and lm_head over rows [r0, r0+n) of x; logits and hidden to host (either optional),
 * and the greedy pick of the last row (optional). */
static int head(cn_model *m, const cn_tensor *norm, const cn_tensor *lm_head, int r0, int n,
                float *logits, float *hidden, int32_t *pick) {
    cn_backend *b = m->b;
    cn_scratch *s = &m->s;
    int64_t V = m->cfg.vocab_size;
    cn_tensor x = cn_tensor_rows(&s->x, r0, n), xn = cn_tensor_rows(&s->xn, r0, n);
    CHECK(cn_op_rmsnorm(b, &xn, &x, norm, m->cfg.norm_eps));
    if (hidden) CHECK(cn_backend_download(b, hidden, &xn));
    for (int i = 0; logits && i < n; i += s->logit_rows) {
        int r = n - i < s->logit_rows ? n - i : s->logit_rows;
        cn_tensor lg = rows(&s->logits, r), xr = cn_tensor_rows(&xn, i, r);
        CHECK(cn_op_matmul(b, &lg, lm_head, &xr));
        CHECK(cn_backend_download(b, logits + (size_t)i * V, &lg));
    }
    if (pick) {
        cn_tensor lg = rows(&s->logits, 1), xr = cn_tensor_rows(&xn, n - 1, 1);
        if (!logits) CHECK(cn_op_matmul(b, &lg, lm_head, &xr));
        else lg = cn_tensor_rows(&s->logits, (n - 1) % s->logit_rows, 1); /* the last row's */
        const int queued = cn_backend_has_argmax(b);
        if (queued) CHECK(cn_op_argmax(b, &s->pick, &lg));
        CHECK(fetch_pick(m, queued, &s->pick, &lg, logits ? logits + (size_t)(n - 1) * V : NULL,
                         pick));
    }
    return CN_OK;
}

/* ---- one-token steps ------------------------------------------------------------------------- */

/* Step keys (backend.h): one per op sequence, so a backend that records steps keeps each apart. */
enum { STEP_DECODE, STEP_DECODE_CAPTURE, STEP_MTP, STEP_PREFILL, STEP_SEQS };

/* The tag of a positioned step (backend.h (d)): what its ops depend on besides the position
 * (the state; whether the lm_head runs, whether the greedy pick follows it, whether the hidden
 * state is kept: without it norm_f may ride in the lm_head's product). */
static uint64_t step_tag(const cn_state *st, int head, int pick, int hidden) {
    return (uint64_t)(uintptr_t)st * 8u + (head ? 1u : 0u) + (pick ? 2u : 0u) + (hidden ? 4u : 0u);
}

/* Ends a step begun by the caller after its ops returned rc: runs it if they all succeeded.
 * Returns rc if an op failed, else step_end's verdict. */
static int step_finish(cn_backend *b, int rc) {
    int end = cn_backend_step_end(b, rc == CN_OK);
    return rc ? rc : end;
}

/* A decode token (T == 1) of the main stack as one backend step: the lookup, every layer and the
 * head's norm, lm_head and greedy pick inside it (no host transfer, so the backend may record and
 * replay it), the downloads after it. s->ids already holds the token. Without captures the step
 * is begun at its offset, tagged with the state and what the head does (all its ops depend on),
 * so a backend may replay the previous token's step instead of the ops being issued (returns 1). */
static int decode_step(cn_model *m, cn_state *st, int offset, const segment *seg, int n_seg,
                       cn_rsnap *caps, float *logits, float *hidden, int32_t *pick) {
    cn_backend *b = m->b;
    cn_scratch *s = &m->s;
    cn_tensor ids = cn_tensor_rows(&s->ids, 0, 1), x = rows(&s->x, 1), xn = rows(&s->xn, 1);
    cn_tensor lg = rows(&s->logits, 1);
    ids.ndim = 1;
    const int capture = n_seg > 1 || seg[0].capture >= 0;
    /* whether the backend picks (a replayed step did what its recording did: the same backend) */
    const int queued = pick && cn_backend_has_argmax(b);
    int rc = capture ? cn_backend_step_begin(b, STEP_DECODE_CAPTURE)
                     : cn_backend_step_begin_at(b, STEP_DECODE,
                                                step_tag(st, logits || pick, pick != NULL,
                                                         hidden != NULL),
                                                offset);
    if (rc < 0) return rc;
    if (rc == 0) {
        rc = cn_op_get_rows(b, &x, &m->w.embed, &ids);                    /* h = embed[tok] */
        const seq one = {st, 0, 1, offset, NULL, 0, NULL};
        if (!rc) rc = run_layers(m, m->w.layers, &one, 1, 1, seg, n_seg, caps, NULL, 0);
        /* norm_f inside the lm_head's product where the backend fuses it (hidden needs xn) */
        int head_done = 0;
        if (!rc && !hidden && (logits || pick) && cn_backend_has_matmul_ep(b)) {
            const cn_mm_ep f = {.norm = &m->w.norm_f, .eps = m->cfg.norm_eps};
            rc = cn_op_matmul_ep(b, &lg, &m->w.lm_head, &x, &f);
            head_done = rc == CN_OK;
            if (rc == CN_EUNSUPPORTED) rc = CN_OK;
        }
        if (!rc && !head_done) rc = cn_op_rmsnorm(b, &xn, &x, &m->w.norm_f, m->cfg.norm_eps);
        if (!rc && !head_done && (logits || pick)) rc = cn_op_matmul(b, &lg, &m->w.lm_head, &xn);
        if (!rc && queued) rc = cn_op_argmax(b, &ids, &lg);  /* greedy pick, over the token read */
    } else {
        rc = CN_OK; /* replayed */
    }
    if (queued) s->ids0 = -1; /* the pick lands in ids[0]: unknown until downloaded */
    CHECK(step_finish(b, rc));
    if (hidden) CHECK(cn_backend_download(b, hidden, &xn));
    if (logits) CHECK(cn_backend_download(b, logits, &lg));
    if (pick) CHECK(fetch_pick(m, queued, &ids, &lg, logits, pick));
    if (queued) s->ids0 = *pick;
    return CN_OK;
}

/* ---- entry points ---------------------------------------------------------------------------- */

/* n tokens of the main stack into st with captures at[0, n_cap) (into caps): ids in the
 * vocabulary, room in st, the offsets ascending within (offset, offset + n]. */
static int check_piece(const cn_model *m, const cn_state *st, const int32_t *tokens, int n, const int *at,
                       int n_cap, const cn_rsnap *caps) {
    if (!tokens || n <= 0 || st->mtp) return CN_EINVAL;
    if ((int64_t)st->offset + n > st->max_ctx) return CN_ECONTEXT;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size) return CN_EINVAL;
    if (n_cap < 0 || (n_cap > 0 && (!at || !caps))) return CN_EINVAL;
    for (int i = 0; i < n_cap; i++)
        if (at[i] <= st->offset || at[i] > st->offset + n || (i > 0 && at[i] <= at[i - 1])) return CN_EINVAL;
    return CN_OK;
}

static int check_batch(const cn_model *m, const cn_state *st, const cn_batch *bt) {
    return bt ? check_piece(m, st, bt->tokens, bt->n, bt->capture_at, bt->n_capture, bt->captures) : CN_EINVAL;
}

/* Buffers of st's shapes for captures at at[0, n) (the conv and scan fill them); on an error
 * every one is freeable. */
static int alloc_caps(cn_state *st, const int *at, int n, cn_rsnap *caps) {
    for (int i = 0; i < n; i++) memset(&caps[i], 0, sizeof caps[i]);
    for (int i = 0; i < n; i++) {
        int rc = cn_state_snapshot_alloc(st, &caps[i]);
        if (rc) return rc;
        caps[i].offset = at[i];
    }
    return CN_OK;
}

static int alloc_captures(cn_state *st, cn_batch *bt) {
    if (bt->captures_ready) {
        int n_mamba = 0;
        for (int l = 0; l < st->n_layers; l++) n_mamba += st->layers[l].type == CN_BLOCK_MAMBA;
        for (int i = 0; i < bt->n_capture; i++) {
            if (bt->captures[i].n_layers != n_mamba) return CN_EINVAL;
            bt->captures[i].offset = bt->capture_at[i];
        }
        return CN_OK;
    }
    return alloc_caps(st, bt->capture_at, bt->n_capture, bt->captures);
}

static void free_captures(cn_model *m, cn_batch *bt) {
    if (bt->captures_ready) return; /* the caller's to keep */
    for (int i = 0; i < bt->n_capture; i++) cn_rsnap_free(m, &bt->captures[i]);
}

int cn_model_forward(cn_model *m, cn_state *st, cn_batch *bt) {
    int rc = check_batch(m, st, bt);
    if (rc) return rc;
    /* a replay serves a batch of one piece with more than one row (a verify); its captures
     * may have no SSM buffers, so there is no falling back to them */
    cn_replay *rp = bt->replay;
    if (rp) {
        rp->rows = 0;
        if (bt->n < 2 || bt->n > rp->max_rows || bt->n > m->s.ubatch || !bt->captures_ready ||
            bt->n_capture > PIECE_CAPS || rp->n_layers != m->n_mamba || m->n_swa)
            return CN_EINVAL;
    }
    rc = alloc_captures(st, bt);
    if (rc) {
        free_captures(m, bt);
        return rc;
    }
    cn_backend *b = m->b;
    const int U = m->s.ubatch;
    const int64_t V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    segment seg[PIECE_CAPS + 1];
    int offset = st->offset, next_cap = 0;
    for (int done = 0; done < bt->n;) {
        int T = bt->n - done < U ? bt->n - done : U;
        /* Cut this piece at the captures inside it (at most PIECE_CAPS; more shorten it). */
        int n_seg = 0;
        while (next_cap < bt->n_capture && bt->capture_at[next_cap] <= offset + T &&
               n_seg < PIECE_CAPS) {
            seg[n_seg].end = bt->capture_at[next_cap] - offset;
            seg[n_seg].capture = next_cap++;
            n_seg++;
        }
        if (n_seg == PIECE_CAPS) T = seg[PIECE_CAPS - 1].end;
        if (n_seg == 0 || seg[n_seg - 1].end < T) seg[n_seg++] = (segment){T, -1};
        cn_tensor ids = cn_tensor_rows(&m->s.ids, 0, T), x = rows(&m->s.x, T);
        ids.ndim = 1;
        /* a decode token the previous step picked on the backend is there already */
        if (T > 1 || m->s.ids0 != bt->tokens[done]) {
            m->s.ids0 = -1;
            if ((rc = cn_backend_upload(b, &m->s.ids, 0, bt->tokens + done, (uint64_t)T * 4))) goto fail;
            m->s.ids0 = bt->tokens[done];
        }
        if (T == 1) { /* a decode token: one backend step; the head's rows as below */
            int last = done + 1 == bt->n;
            float *lp = NULL, *hp = NULL;
            if (bt->all_logits) {
                lp = bt->logits ? bt->logits + (size_t)done * V : NULL;
                hp = bt->hidden ? bt->hidden + (size_t)done * H : NULL;
            } else if (bt->all_hidden && bt->hidden) {
                hp = bt->hidden + (size_t)done * H;
                lp = last ? bt->logits : NULL;
            } else if (last) {
                lp = bt->logits;
                hp = bt->hidden;
            }
            int32_t *pk = last ? bt->argmax : NULL;
            if ((rc = decode_step(m, st, offset, seg, n_seg, bt->captures, lp, hp, pk))) goto fail;
            offset += T;
            done += T;
            continue;
        }
        /* rows whose output is read: every one, the batch's last, or none of this piece */
        const int last = done + T == bt->n;
        int need_from = bt->all_logits || (bt->all_hidden && bt->hidden) ? 0 : last ? T - 1 : T;
        int32_t *pk = last ? bt->argmax : NULL;
        /* the piece's layers as one step that is never recorded: no op waits for the device
         * inside it (the tokens were checked above, the routes come from moe_route) */
        if ((rc = cn_backend_step_begin(b, STEP_PREFILL | CN_STEP_EAGER))) goto fail;
        rc = cn_op_get_rows(b, &x, &m->w.embed, &ids);                      /* h = embed[tok] */
        const seq one = {st, 0, T, offset, NULL, 0, NULL};
        if (!rc)
            rc = run_layers(m, m->w.layers, &one, 1, T, seg, n_seg, bt->captures, rp, need_from);
        if ((rc = step_finish(b, rc))) goto fail;
        if (bt->all_logits) {
            rc = head(m, &m->w.norm_f, &m->w.lm_head, 0, T,
                      bt->logits ? bt->logits + (size_t)done * V : NULL,
                      bt->hidden ? bt->hidden + (size_t)done * H : NULL, pk);
        } else if (bt->all_hidden && bt->hidden) {
            /* every row's hidden; the lm_head only for the batch's last row */
            rc = head(m, &m->w.norm_f, &m->w.lm_head, 0, T, NULL, bt->hidden + (size_t)done * H,
                      NULL);
            if (!rc && last && (bt->logits || pk))
                rc = head(m, &m->w.norm_f, &m->w.lm_head, T - 1, 1, bt->logits, NULL, pk);
        } else if (last) {
            rc = head(m, &m->w.norm_f, &m->w.lm_head, T - 1, 1, bt->logits, bt->hidden, pk);
        }
        if (rc) goto fail;
        offset += T;
        done += T;
    }
    if (rp) {
        rp->rows = bt->n;
        rp->offset = st->offset;
    }
    st->offset = offset;
    return CN_OK;
fail:
    free_captures(m, bt);
    return rc;
}

int cn_model_decode(cn_model *m, cn_state *s, int32_t token, float *logits) {
    cn_batch bt = {.tokens = &token, .n = 1, .logits = logits};
    return cn_model_forward(m, s, &bt);
}

int cn_model_decode_greedy(cn_model *m, cn_state *s, int32_t token, int32_t *next) {
    cn_batch bt = {.tokens = &token, .n = 1, .argmax = next};
    return next ? cn_model_forward(m, s, &bt) : CN_EINVAL;
}

int cn_model_verify(cn_model *m, cn_state *s, const int32_t *tokens, int k, float *logits) {
    cn_batch bt = {.tokens = tokens, .n = k, .all_logits = 1, .logits = logits};
    return cn_model_forward(m, s, &bt);
}

/* Several sequences in one piece (model.h). The rows are the sequences' tokens in order; the head
 * runs over the last row of each sequence that asks for logits or a pick, gathered into the
 * front rows of tmp so that the lm_head streams once for all of them. */
int cn_model_forward_seqs(cn_model *m, cn_seq_batch *sb, int n_seqs) {
    if (!m || !sb || n_seqs <= 0) return CN_EINVAL;
    const int U = m->s.ubatch;
    int T = 0;
    for (int i = 0; i < n_seqs; i++) {
        const cn_seq_batch *q = &sb[i];
        if (!q->state || q->n > U - T || q->n_capture > PIECE_CAPS) return CN_EINVAL;
        for (int j = 0; j < i; j++)
            if (sb[j].state == q->state) return CN_EINVAL;
        int rc = check_piece(m, q->state, q->tokens, q->n, q->capture_at, q->n_capture, q->captures);
        if (rc) return rc;
        T += q->n;
    }
    if (n_seqs == 1) { /* the one-sequence forward, its decode steps recorded and replayed */
        cn_batch bt = {.tokens = sb[0].tokens, .n = sb[0].n, .logits = sb[0].logits,
                       .argmax = sb[0].argmax, .hidden = sb[0].hidden,
                       .all_hidden = sb[0].hidden && sb[0].all_hidden, .capture_at = sb[0].capture_at,
                       .n_capture = sb[0].n_capture, .captures = sb[0].captures};
        return cn_model_forward(m, sb[0].state, &bt);
    }
    if (m->n_swa) return CN_EUNSUPPORTED; /* a ring per sequence: not written yet */
    cn_backend *b = m->b;
    cn_scratch *s = &m->s;
    const int64_t V = m->cfg.vocab_size;
    seq *sq = s->sq;
    m->s.ids0 = -1;
    int rc = CN_OK, n_alloc = 0;
    for (int i = 0, r = 0; !rc && i < n_seqs; r += sb[i++].n) {
        sq[i] = (seq){sb[i].state, r, sb[i].n, sb[i].state->offset, sb[i].capture_at, sb[i].n_capture,
                      sb[i].captures};
        rc = alloc_caps(sb[i].state, sb[i].capture_at, sb[i].n_capture, sb[i].captures);
        n_alloc = i + 1;
        if (!rc) rc = cn_backend_upload(b, &s->ids, (uint64_t)r * 4, sb[i].tokens, (uint64_t)sb[i].n * 4);
    }
    if (rc) goto fail;
    cn_tensor ids = cn_tensor_rows(&s->ids, 0, T), x = rows(&s->x, T);
    ids.ndim = 1;
    const segment seg = {T, -1};
    if ((rc = cn_backend_step_begin(b, STEP_SEQS | CN_STEP_EAGER))) goto fail;
    rc = cn_op_get_rows(b, &x, &m->w.embed, &ids);                        /* h = embed[tok] */
    if (!rc) rc = run_layers(m, m->w.layers, sq, n_seqs, T, &seg, 1, NULL, NULL, 0);
    /* every row's hidden for the sequences that ask: norm_f over the piece, read after the step */
    int any_all = 0;
    for (int i = 0; i < n_seqs; i++) any_all |= sb[i].hidden && sb[i].all_hidden;
    cn_tensor xa = rows(&s->xn, T);
    if (!rc && any_all) rc = cn_op_rmsnorm(b, &xa, &x, &m->w.norm_f, m->cfg.norm_eps);
    int k = 0; /* rows gathered for the head */
    for (int i = 0; !rc && i < n_seqs; i++) {
        if (!sb[i].logits && !sb[i].argmax && !(sb[i].hidden && !sb[i].all_hidden)) continue;
        cn_tensor src = cn_tensor_rows(&s->x, sq[i].r0 + sq[i].n - 1, 1);
        cn_tensor dst = cn_tensor_rows(&s->tmp, k++, 1);
        rc = cn_backend_copy(b, &dst, &src);
    }
    if ((rc = step_finish(b, rc))) goto fail;
    for (int i = 0; any_all && i < n_seqs; i++) {
        if (!sb[i].hidden || !sb[i].all_hidden) continue;
        cn_tensor hr = cn_tensor_rows(&s->xn, sq[i].r0, sq[i].n);
        if ((rc = cn_backend_download(b, sb[i].hidden, &hr))) goto fail;
    }
    /* the head, logit_rows gathered rows at a time */
    const int queued = cn_backend_has_argmax(b);
    for (int i = 0, j0 = 0; j0 < k;) {
        const int r = k - j0 < s->logit_rows ? k - j0 : s->logit_rows;
        cn_tensor xr = cn_tensor_rows(&s->tmp, j0, r), xn = rows(&s->xn, r), lg = rows(&s->logits, r);
        cn_tensor pk = cn_tensor_rows(&s->ids, 0, r);
        pk.ndim = 1;
        if ((rc = cn_op_rmsnorm(b, &xn, &xr, &m->w.norm_f, m->cfg.norm_eps))) goto fail;
        if ((rc = cn_op_matmul(b, &lg, &m->w.lm_head, &xn))) goto fail;
        int32_t picks[16];
        if (queued && ((rc = cn_op_argmax(b, &pk, &lg)) || (rc = cn_backend_download(b, picks, &pk)))) goto fail;
        for (int j = 0; j < r; i++) {
            if (!sb[i].logits && !sb[i].argmax && !(sb[i].hidden && !sb[i].all_hidden)) continue;
            cn_tensor row = cn_tensor_rows(&lg, j, 1), hrow = cn_tensor_rows(&xn, j, 1);
            if (sb[i].hidden && !sb[i].all_hidden && (rc = cn_backend_download(b, sb[i].hidden, &hrow))) goto fail;
            float *host = sb[i].logits ? sb[i].logits : s->host_logits;
            if ((sb[i].logits || (sb[i].argmax && !queued)) && (rc = cn_backend_download(b, host, &row))) goto fail;
            if (sb[i].argmax) *sb[i].argmax = queued ? picks[j] : host_argmax(host, V);
            j++;
        }
        j0 += r;
    }
    for (int i = 0; i < n_seqs; i++) sb[i].state->offset += sb[i].n;
    return CN_OK;
fail:
    for (int i = 0; i < n_alloc; i++)
        for (int c = 0; c < sb[i].n_capture; c++) cn_rsnap_free(m, &sb[i].captures[c]);
    return rc;
}

/* The head over n positions; last_only: logits and hidden_out hold the last position's only. */
static int mtp_forward(cn_model *m, cn_state *st, const float *hidden, const int32_t *next, int n,
                       float *logits, float *hidden_out, int last_only) {
    if (!st->mtp || !m->w.has_mtp || n <= 0 || !hidden || !next) return CN_EINVAL;
    if ((int64_t)st->offset + n > st->max_ctx) return CN_ECONTEXT;
    for (int i = 0; i < n; i++)
        if (next[i] < 0 || next[i] >= m->cfg.vocab_size) return CN_EINVAL;
    cn_backend *b = m->b;
    /* a drafting state runs on the head's NVFP4 (or FP8) copy once it is built (mtp_draft.c) */
    const int draft = st->mtp == 2 && m->w.has_mtp_draft;
    const cn_mtp_w *w = draft ? &m->w.mtp_draft : &m->w.mtp;
    const cn_tensor *lm_head = draft ? &m->w.lm_head_draft : &m->w.lm_head;
    const int64_t V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    const float eps = m->cfg.norm_eps;
    segment seg[1];
    for (int done = 0; done < n;) {
        int T = n - done < m->s.ubatch ? n - done : m->s.ubatch;
        seg[0] = (segment){T, -1};
        cn_tensor ids = cn_tensor_rows(&m->s.ids, 0, T), x = rows(&m->s.x, T), e = rows(&m->s.tmp, T);
        cn_tensor cat = rows(&m->s.cat, T);
        cn_tensor ce = cn_tensor_cols(&cat, 0, H), ch = cn_tensor_cols(&cat, H, H);
        ids.ndim = 1;
        m->s.ids0 = -1;
        CHECK(cn_backend_upload(b, &m->s.ids, 0, next + done, (uint64_t)T * 4));
        m->s.ids0 = next[done];
        CHECK(cn_backend_upload(b, &m->s.x, 0, hidden + (size_t)done * H, (uint64_t)T * H * 4));
        /* one draft token is one backend step (uploads before it, downloads after it) */
        const int step = T == 1, last = done + T == n;
        float *lp = logits ? logits + (size_t)done * V : NULL;
        float *hp = hidden_out ? hidden_out + (size_t)done * H : NULL;
        if (last_only) {
            lp = last ? logits : NULL;
            hp = last ? hidden_out : NULL;
        }
        int rc = 0; /* a draft token's step may be replayed at the next offset (decode_step) */
        if (step) rc = cn_backend_step_begin_at(b, STEP_MTP, step_tag(st, lp != NULL, 0, 0), st->offset);
        if (rc < 0) return rc;
        const int replayed = rc == 1;
        rc = replayed ? CN_OK : cn_op_get_rows(b, &e, &m->w.embed, &ids);  /* e = embed(t_{i+1}) */
        if (!rc && !replayed) rc = cn_op_rmsnorm(b, &ce, &e, &w->enorm, eps); /* enorm(e) first */
        if (!rc && !replayed) rc = cn_op_rmsnorm(b, &ch, &x, &w->hnorm, eps); /* then hnorm(h) */
        if (!rc && !replayed) rc = cn_op_matmul(b, &x, &w->eh_proj, &cat);  /* eh_proj */
        /* last_only: the other rows are forwarded for their KV rows alone */
        const int need_from = !last_only ? 0 : last ? T - 1 : T;
        const seq one = {st, 0, T, st->offset, NULL, 0, NULL};
        if (!rc && !replayed) rc = run_layers(m, w->layers, &one, 1, T, seg, 1, NULL, NULL, need_from);
        if (step) {
            cn_tensor xn = rows(&m->s.xn, 1), lg = rows(&m->s.logits, 1);
            if (!rc && !replayed) rc = cn_op_rmsnorm(b, &xn, &x, &w->final_norm, eps);
            if (!rc && !replayed && lp) rc = cn_op_matmul(b, &lg, lm_head, &xn);
            CHECK(step_finish(b, rc));
            if (hp) CHECK(cn_backend_download(b, hp, &x));
            if (lp) CHECK(cn_backend_download(b, lp, &lg));
        } else if (last_only) {
            CHECK(rc);
            cn_tensor xl = cn_tensor_rows(&x, T - 1, 1);
            if (hp) CHECK(cn_backend_download(b, hp, &xl));
            if (lp) /* the lm_head for one row */
                CHECK(head(m, &w->final_norm, lm_head, T - 1, 1, lp, NULL, NULL));
        } else {
            CHECK(rc);
            if (hp) CHECK(cn_backend_download(b, hp, &x));
            CHECK(head(m, &w->final_norm, lm_head, 0, T, lp, NULL, NULL));
        }
        st->offset += T;
        done += T;
    }
    return CN_OK;
}

int cn_model_mtp_forward(cn_model *m, cn_state *st, const float *hidden, const int32_t *next,
                         int n, float *logits, float *hidden_out) {
    return mtp_forward(m, st, hidden, next, n, logits, hidden_out, 0);
}

int cn_model_mtp_forward_last(cn_model *m, cn_state *st, const float *hidden, const int32_t *next,
                              int n, float *logits, float *hidden_out) {
    return mtp_forward(m, st, hidden, next, n, logits, hidden_out, 1);
}
