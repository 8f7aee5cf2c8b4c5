/* replay.c - a verify's recurrent states kept as the state it started from and the scans'
 * inputs (model.h cn_replay): buffers, and the restore that scans again. The forward fills them
 * (forward.c, mamba_mixer). */
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"
#include "model/state.h"

void cn_replay_free(cn_model *m, cn_replay *rp) {
    for (int j = 0; j < rp->n_layers; j++) {
        if (rp->s0) cn_backend_release(m->b, &rp->s0[j]);
        if (rp->xbc) cn_backend_release(m->b, &rp->xbc[j]);
        if (rp->dt) cn_backend_release(m->b, &rp->dt[j]);
    }
    free(rp->s0);
    free(rp->xbc);
    free(rp->dt);
    memset(rp, 0, sizeof *rp);
}

int cn_replay_alloc(cn_state *s, int max_rows, cn_replay *out) {
    cn_model *m = s->model;
    memset(out, 0, sizeof *out);
    if (max_rows < 1 || max_rows > m->s.ubatch || s->mtp) return CN_EINVAL;
    if (cn_backend_has_device_memory(m->b) || !cn_backend_has_ssm_scan_from(m->b) ||
        !cn_backend_has_state_caps(m->b) || m->n_swa)
        return CN_EUNSUPPORTED;
    const int n = m->n_mamba;
    out->max_rows = max_rows;
    if (n == 0) return CN_OK;
    out->s0 = calloc((size_t)n, sizeof *out->s0);
    out->xbc = calloc((size_t)n, sizeof *out->xbc);
    out->dt = calloc((size_t)n, sizeof *out->dt);
    if (!out->s0 || !out->xbc || !out->dt) goto fail;
    out->n_layers = n; /* cn_replay_free releases what was allocated (calloc'd: data NULL) */
    for (int l = 0, j = 0; l < s->n_layers; l++) {
        const cn_layer_state *ls = &s->layers[l];
        if (ls->type != CN_BLOCK_MAMBA) continue;
        out->s0[j] = cn_tensor_2d(CN_F32, ls->ssm.shape[0], ls->ssm.shape[1], NULL);
        out->xbc[j] = cn_tensor_2d(CN_F32, max_rows, m->conv_dim, NULL);
        out->dt[j] = cn_tensor_2d(CN_F32, max_rows, m->cfg.mamba_n_heads, NULL);
        if (cn_backend_alloc(m->b, &out->s0[j]) || cn_backend_alloc(m->b, &out->xbc[j]) ||
            cn_backend_alloc(m->b, &out->dt[j]))
            goto fail;
        j++;
    }
    return CN_OK;
fail:
    cn_replay_free(m, out);
    return CN_ENOMEM;
}

int cn_model_replay(cn_model *m, cn_state *s, cn_replay *rp, cn_rsnap *snap) {
    const int n = snap->offset - rp->offset; /* rows to scan again */
    if (rp->rows < 1 || s->offset != rp->offset + rp->rows || n < 1 || n > rp->rows ||
        snap->n_layers != rp->n_layers || snap->n_win)
        return CN_EINVAL;
    const int64_t di = m->d_inner, gn = (int64_t)m->cfg.n_groups * m->cfg.ssm_state_size;
    for (int l = 0, j = 0; l < s->n_layers; l++) {
        cn_layer_state *ls = &s->layers[l];
        if (ls->type != CN_BLOCK_MAMBA) continue;
        const cn_ssm_args a = cn_mamba_args(m, &m->w.layers[l].mamba);
        cn_tensor in = cn_tensor_rows(&rp->xbc[j], 0, n), dt = cn_tensor_rows(&rp->dt[j], 0, n);
        cn_tensor xs = cn_tensor_cols(&in, 0, di);
        cn_tensor B = cn_tensor_cols(&in, di, gn), C = cn_tensor_cols(&in, di + gn, gn);
        cn_tensor y = cn_tensor_rows(&m->s.y, 0, n); /* the outputs are the forward's already */
        y.shape[1] = di;
        cn_tensor_swap_data(&ls->ssm, &rp->s0[j]); /* the starting state back */
        int rc = cn_op_ssm_scan(m->b, &y, &xs, &dt, &B, &C, &a, &ls->ssm);
        if (rc) return rc; /* not on arguments checked at the forward */
        cn_tensor_swap_data(&ls->conv, &snap->conv[j]);
        j++;
    }
    s->offset = snap->offset;
    rp->rows = 0;
    return CN_OK;
}
