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
    if (max_ctx <= 0) return CN_EINVAL;
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
        if (ls->type == CN_BLOCK_ATTN) {
            int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
            rc = alloc2d(m->b, &ls->k, max_ctx, kv);
            if (!rc) rc = alloc2d(m->b, &ls->v, max_ctx, kv);
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

int cn_state_restore(cn_state *s, const cn_rsnap *snap) {
    if (snap->offset < 0 || snap->offset > s->offset) return CN_EINVAL;
    int j = 0;
    for (int l = 0; l < s->n_layers; l++) {
        cn_layer_state *ls = &s->layers[l];
        if (ls->type != CN_BLOCK_MAMBA) continue;
        if (j >= snap->n_layers) return CN_EINVAL;
        int rc = cn_backend_copy(s->model->b, &ls->conv, &snap->conv[j]);
        if (!rc) rc = cn_backend_copy(s->model->b, &ls->ssm, &snap->ssm[j]);
        if (rc) return rc;
        j++;
    }
    if (j != snap->n_layers) return CN_EINVAL;
    s->offset = snap->offset;
    return CN_OK;
}

int cn_state_rewind(cn_state *s, int offset) {
    if (offset < 0 || offset > s->offset) return CN_EINVAL;
    for (int l = 0; l < s->n_layers; l++)
        if (s->layers[l].type == CN_BLOCK_MAMBA) return CN_EINVAL;
    s->offset = offset;
    return CN_OK;
}

/* Allocates a snapshot shaped like s's recurrent layers; copies their state when `copy`. */
static int rsnap_make(cn_state *s, cn_rsnap *out, int copy) {
    memset(out, 0, sizeof *out);
    int n = 0;
    for (int l = 0; l < s->n_layers; l++) n += s->layers[l].type == CN_BLOCK_MAMBA;
    out->offset = s->offset;
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
        if (cn_backend_alloc(s->model->b, &out->conv[j]) || cn_backend_alloc(s->model->b, &out->ssm[j]))
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

int cn_state_snapshot(cn_state *s, cn_rsnap *out) { return rsnap_make(s, out, 1); }

int cn_state_snapshot_alloc(cn_state *s, cn_rsnap *out) { return rsnap_make(s, out, 0); }

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
    free(snap->conv);
    free(snap->ssm);
    memset(snap, 0, sizeof *snap);
}
