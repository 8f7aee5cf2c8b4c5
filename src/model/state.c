/* state.c - per-sequence layer caches; see state.h. */
#include "model/state.h"

#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

static int zero_tensor(cn_backend *b, cn_tensor *t) {
    if (!t->data) return CN_OK;
    uint64_t n = cn_tensor_nbytes(t);
    void *z = calloc(1, (size_t)n);
    if (!z) return CN_ENOMEM;
    int rc = cn_backend_upload(b, t, 0, z, n);
    free(z);
    return rc;
}

static int alloc2d(cn_backend *b, cn_tensor *t, int64_t rows, int64_t cols) {
    *t = cn_tensor_2d(CN_F32, rows, cols, NULL);
    return cn_backend_alloc(b, t);
}

int cn_state_create(cn_state **out, cn_model *m, int max_ctx, int mtp) {
    const cn_config *c = &m->cfg;
    if (max_ctx <= 0 || mtp < 0 || mtp > 2) return CN_EINVAL;
    if (mtp && !m->w.has_mtp) return CN_EINVAL;
    cn_state *s = calloc(1, sizeof *s);
    if (!s) return CN_ENOMEM;
    s->model = m;
    s->mtp = mtp;
    s->max_ctx = max_ctx;
    s->n_layers = mtp ? c->n_mtp_layers : c->n_layers;
    const char *types = mtp ? c->mtp_layers : c->layers;
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    if (!s->layers) goto nomem;
    for (int l = 0; l < s->n_layers; l++) {
        cn_layer_state *ls = &s->layers[l];
        ls->type = (cn_block)types[l];
        int rc = CN_OK;
        if (cn_block_is_attn(ls->type)) {
            int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
            int rows = max_ctx;
            if (ls->type == CN_BLOCK_SWA) rows = ls->window = c->sliding_window;
            rc = alloc2d(m->b, &ls->k, rows, kv);
            if (!rc) rc = alloc2d(m->b, &ls->v, rows, kv);
        } else if (ls->type == CN_BLOCK_MAMBA) {
            rc = alloc2d(m->b, &ls->conv, c->conv_kernel - 1, m->conv_dim);
            if (!rc) rc = alloc2d(m->b, &ls->ssm, c->mamba_n_heads,
                                  (int64_t)c->mamba_head_dim * c->ssm_state_size);
        }
        if (rc) goto nomem;
    }
    if (cn_state_reset(s)) goto nomem;
    *out = s;
    return CN_OK;
nomem:
    cn_state_free(s);
    return CN_ENOMEM;
}

void cn_state_free(cn_state *s) {
    if (!s) return;
    cn_backend *b = s->model->b;
    for (int l = 0; s->layers && l < s->n_layers; l++) {
        cn_backend_release(b, &s->layers[l].k);
        cn_backend_release(b, &s->layers[l].v);
        cn_backend_release(b, &s->layers[l].conv);
        cn_backend_release(b, &s->layers[l].ssm);
    }
    free(s->layers);
    free(s);
}

int cn_state_reset(cn_state *s) {
    for (int l = 0; l < s->n_layers; l++) {
        int rc = zero_tensor(s->model->b, &s->layers[l].conv);
        if (!rc) rc = zero_tensor(s->model->b, &s->layers[l].ssm);
        if (rc) return rc;
    }
    s->offset = 0;
    return CN_OK;
}

/* The ring rows of positions [from, to) (to - from <= W) as at most two runs of rows. */
typedef struct ring_run {
    int row, n;
} ring_run;

static int ring_runs(int window, int from, int to, ring_run r[2]) {
    int n = to - from, row = from % window;
    if (n <= 0) return 0;
    int first = window - row < n ? window - row : n;
    r[0] = (ring_run){row, first};
    if (first == n) return 1;
    r[1] = (ring_run){0, n - first};
    return 2;
}

int cn_ring_read(cn_backend *b, cn_tensor *dst, const cn_tensor *ring, const cn_tensor *fresh,
                 int n_past, int from, int to) {
    int window = (int)ring->shape[0], rc = CN_OK;
    if (from < 0 || to < from || from < n_past - window || (to > n_past && !fresh) || to - from > dst->shape[0])
        return CN_EINVAL;
    int mid = to < n_past ? to : n_past; /* [from, mid) from the ring, [mid, to) fresh */
    ring_run r[2];
    int at = 0;
    for (int i = 0, k = from < mid ? ring_runs(window, from, mid, r) : 0; !rc && i < k; i++) {
        cn_tensor d = cn_tensor_rows(dst, at, r[i].n), sr = cn_tensor_rows(ring, r[i].row, r[i].n);
        rc = cn_backend_copy(b, &d, &sr);
        at += r[i].n;
    }
    int f0 = from > n_past ? from : n_past;
    if (!rc && to > f0) {
        cn_tensor d = cn_tensor_rows(dst, at, to - f0), sf = cn_tensor_rows(fresh, f0 - n_past, to - f0);
        rc = cn_backend_copy(b, &d, &sf);
    }
    return rc;
}

int cn_ring_write(cn_backend *b, cn_tensor *ring, const cn_tensor *src, int from, int to) {
    int window = (int)ring->shape[0], rc = CN_OK, at = 0;
    if (from < 0 || to < from || to - from > window) return CN_EINVAL;
    ring_run r[2];
    for (int i = 0, k = ring_runs(window, from, to, r); !rc && i < k; i++) {
        cn_tensor d = cn_tensor_rows(ring, r[i].row, r[i].n), sr = cn_tensor_rows(src, at, r[i].n);
        rc = cn_backend_copy(b, &d, &sr);
        at += r[i].n;
    }
    return rc;
}

int cn_state_restore(cn_state *s, const cn_rsnap *snap) {
    if (snap->offset < 0 || snap->offset > s->offset) return CN_EINVAL;
    int j = 0, w = 0;
    for (int l = 0; l < s->n_layers; l++) {
        cn_layer_state *ls = &s->layers[l];
        int rc = CN_OK;
        if (ls->type == CN_BLOCK_MAMBA) {
            if (j >= snap->n_layers) return CN_EINVAL;
            rc = cn_backend_copy(s->model->b, &ls->conv, &snap->conv[j]);
            if (!rc) rc = cn_backend_copy(s->model->b, &ls->ssm, &snap->ssm[j]);
            j++;
        } else if (ls->type == CN_BLOCK_SWA) {
            if (w >= snap->n_win) return CN_EINVAL;
            int o = snap->offset, n = cn_window_rows(ls->window, o);
            rc = cn_ring_write(s->model->b, &ls->k, &snap->win_k[w], o - n, o);
            if (!rc) rc = cn_ring_write(s->model->b, &ls->v, &snap->win_v[w], o - n, o);
            w++;
        }
        if (rc) return rc;
    }
    if (j != snap->n_layers || w != snap->n_win) return CN_EINVAL;
    s->offset = snap->offset;
    return CN_OK;
}

/* 1 when a and b describe buffers of one dtype, shape and layout. */
static int same_layout(const cn_tensor *a, const cn_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || !a->data || !b->data) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d]) return 0;
    return 1;
}

int cn_state_restore_take(cn_state *s, cn_rsnap *snap) {
    if (cn_backend_has_device_memory(s->model->b) || snap->n_win) return cn_state_restore(s, snap);
    if (snap->offset < 0 || snap->offset > s->offset) return CN_EINVAL;
    int j = 0;
    for (int l = 0; l < s->n_layers; l++) { /* everything checked before anything moves */
        cn_layer_state *ls = &s->layers[l];
        if (ls->type != CN_BLOCK_MAMBA) continue;
        if (j >= snap->n_layers) return CN_EINVAL;
        if (!same_layout(&ls->conv, &snap->conv[j]) || !same_layout(&ls->ssm, &snap->ssm[j]))
            return cn_state_restore(s, snap);
        j++;
    }
    if (j != snap->n_layers) return CN_EINVAL;
    for (int l = 0, i = 0; l < s->n_layers; l++) {
        cn_layer_state *ls = &s->layers[l];
        if (ls->type != CN_BLOCK_MAMBA) continue;
        cn_tensor_swap_data(&ls->conv, &snap->conv[i]);
        cn_tensor_swap_data(&ls->ssm, &snap->ssm[i]);
        i++;
    }
    s->offset = snap->offset;
    return CN_OK;
}

int cn_state_can_rewind(const cn_state *s, int offset) {
    if (offset < 0 || offset > s->offset) return 0;
    if (offset == s->offset) return 1;
    for (int l = 0; l < s->n_layers; l++) {
        const cn_layer_state *ls = &s->layers[l];
        if (ls->type == CN_BLOCK_MAMBA) return 0;
        if (ls->type == CN_BLOCK_SWA && s->offset > ls->window) return 0; /* wrapped */
    }
    return 1;
}

int cn_state_rewind(cn_state *s, int offset) {
    if (!cn_state_can_rewind(s, offset)) return CN_EINVAL;
    s->offset = offset;
    return CN_OK;
}

/* Allocates a snapshot shaped like s's recurrent layers; copies their state when `copy`. */
/* A snapshot of s's shapes: with copy, of its contents; without ssm, its SSM tensors hold no
 * buffer (shapes only). */
static int rsnap_make(cn_state *s, cn_rsnap *out, int copy, int ssm) {
    memset(out, 0, sizeof *out);
    int n = 0, nw = 0;
    for (int l = 0; l < s->n_layers; l++) {
        n += s->layers[l].type == CN_BLOCK_MAMBA;
        nw += s->layers[l].type == CN_BLOCK_SWA;
    }
    out->offset = s->offset;
    if (nw) {
        out->win_k = calloc((size_t)nw, sizeof *out->win_k);
        out->win_v = calloc((size_t)nw, sizeof *out->win_v);
        if (!out->win_k || !out->win_v) goto fail;
        out->n_win = nw;
        for (int l = 0, w = 0; l < s->n_layers; l++) {
            cn_layer_state *ls = &s->layers[l];
            if (ls->type != CN_BLOCK_SWA) continue;
            out->win_k[w] = cn_tensor_2d(CN_F32, ls->k.shape[0], ls->k.shape[1], NULL);
            out->win_v[w] = cn_tensor_2d(CN_F32, ls->v.shape[0], ls->v.shape[1], NULL);
            if (cn_backend_alloc(s->model->b, &out->win_k[w]) || cn_backend_alloc(s->model->b, &out->win_v[w]))
                goto fail;
            int o = s->offset, r = cn_window_rows(ls->window, o);
            if (copy && (cn_ring_read(s->model->b, &out->win_k[w], &ls->k, NULL, o, o - r, o) ||
                         cn_ring_read(s->model->b, &out->win_v[w], &ls->v, NULL, o, o - r, o)))
                goto fail;
            w++;
        }
    }
    out->n_layers = n;
    if (n == 0) return CN_OK;
    out->conv = calloc((size_t)n, sizeof *out->conv);
    out->ssm = calloc((size_t)n, sizeof *out->ssm);
    if (!out->conv || !out->ssm) goto fail;
    int j = 0;
    for (int l = 0; l < s->n_layers; l++) {
        cn_layer_state *ls = &s->layers[l];
        if (ls->type != CN_BLOCK_MAMBA) continue;
        out->conv[j] = cn_tensor_2d(CN_F32, ls->conv.shape[0], ls->conv.shape[1], NULL);
        out->ssm[j] = cn_tensor_2d(CN_F32, ls->ssm.shape[0], ls->ssm.shape[1], NULL);
        if (cn_backend_alloc(s->model->b, &out->conv[j]) ||
            (ssm && cn_backend_alloc(s->model->b, &out->ssm[j])))
            goto fail;
        if (copy && (cn_backend_copy(s->model->b, &out->conv[j], &ls->conv) ||
                     cn_backend_copy(s->model->b, &out->ssm[j], &ls->ssm)))
            goto fail;
        j++;
    }
    return CN_OK;
fail:
    cn_rsnap_free(s->model, out);
    return CN_ENOMEM;
}

int cn_state_snapshot(cn_state *s, cn_rsnap *out) { return rsnap_make(s, out, 1, 1); }

int cn_state_snapshot_alloc(cn_state *s, cn_rsnap *out) { return rsnap_make(s, out, 0, 1); }

int cn_state_snapshot_alloc_conv(cn_state *s, cn_rsnap *out) { return rsnap_make(s, out, 0, 0); }

uint64_t cn_state_bytes(const cn_state *s) {
    uint64_t n = 0;
    for (int l = 0; l < s->n_layers; l++) {
        const cn_layer_state *ls = &s->layers[l];
        if (ls->k.data) n += cn_tensor_nbytes(&ls->k) + cn_tensor_nbytes(&ls->v);
        if (ls->conv.data) n += cn_tensor_nbytes(&ls->conv) + cn_tensor_nbytes(&ls->ssm);
    }
    return n;
}

void cn_rsnap_free(cn_model *m, cn_rsnap *snap) {
    for (int j = 0; j < snap->n_layers; j++) {
        if (snap->conv) cn_backend_release(m->b, &snap->conv[j]);
        if (snap->ssm) cn_backend_release(m->b, &snap->ssm[j]);
    }
    for (int w = 0; w < snap->n_win; w++) {
        if (snap->win_k) cn_backend_release(m->b, &snap->win_k[w]);
        if (snap->win_v) cn_backend_release(m->b, &snap->win_v[w]);
    }
    free(snap->win_k);
    free(snap->win_v);
    free(snap->conv);
    free(snap->ssm);
    memset(snap, 0, sizeof *snap);
}
