/* snapshot.c - layer snapshots moving between the live buffers and host RAM; see snapshot.h. */
#include "cache/snapshot.h"

#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static cn_backend *backend(const cn_state *s) { return cn_model_backend(s->model); }

uint64_t cn_snap_kv_row_bytes(const cn_state *s, int layer) {
    return (uint64_t)s->layers[layer].k.shape[1] * sizeof(float);
}

uint64_t cn_snap_state_bytes(const cn_state *s, int layer) {
    return cn_tensor_nbytes(&s->layers[layer].conv) + cn_tensor_nbytes(&s->layers[layer].ssm);
}

static cn_snap *snap_new(cn_snap_kind kind, cn_snap_tier tier, int from, int to, uint64_t bytes) {
    cn_snap *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = kind;
    p->tier = tier;
    p->from = from;
    p->to = to;
    p->bytes = bytes;
    return p;
}

static cn_snap *kv_ram(const cn_state *s, int layer, int from, int to) {
    uint64_t bytes = 2 * (uint64_t)(to - from) * cn_snap_kv_row_bytes(s, layer);
    cn_snap *p = snap_new(CN_SNAP_KV, CN_SNAP_RAM, from, to, bytes);
    if (!p) return NULL;
    p->ram = malloc(bytes ? bytes : 1);
    if (!p->ram) {
        free(p);
        return NULL;
    }
    return p;
}

cn_snap *cn_snap_kv_lazy(const cn_state *s, int layer, int from, int to) {
    return snap_new(CN_SNAP_KV, CN_SNAP_LIVE, from, to,
                    2 * (uint64_t)(to - from) * cn_snap_kv_row_bytes(s, layer));
}

static int download_state(const cn_state *s, const cn_tensor *conv, const cn_tensor *ssm, uint8_t *dst) {
    int rc = cn_backend_download(backend(s), dst, conv);
    if (!rc) rc = cn_backend_download(backend(s), dst + cn_tensor_nbytes(conv), ssm);
    return rc;
}

static int state_copy(const cn_state *s, int layer, const cn_tensor *conv, const cn_tensor *ssm,
                      int offset, cn_snap **out) {
    uint64_t bytes = cn_snap_state_bytes(s, layer);
    cn_snap *p = snap_new(CN_SNAP_STATE, CN_SNAP_RAM, offset, offset, bytes);
    if (!p || !(p->ram = malloc(bytes))) {
        free(p);
        return CN_ENOMEM;
    }
    int rc = download_state(s, conv, ssm, p->ram);
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_state_take(const cn_state *s, int layer, cn_snap **out) {
    const cn_layer_state *ls = &s->layers[layer];
    return state_copy(s, layer, &ls->conv, &ls->ssm, s->offset, out);
}

int cn_snap_state_from_capture(const cn_state *s, const cn_rsnap *rs, int j, cn_snap **out) {
    int layer = -1;
    for (int l = 0, m = 0; l < s->n_layers; l++)
        if (s->layers[l].type == CN_BLOCK_MAMBA && m++ == j) layer = l;
    if (layer < 0 || j >= rs->n_layers) return CN_EINVAL;
    return state_copy(s, layer, &rs->conv[j], &rs->ssm[j], rs->offset, out);
}

/* ---- windows ---- */

uint64_t cn_snap_window_bytes(const cn_state *s, int layer, int offset) {
    return 2 * (uint64_t)cn_window_rows(s->layers[layer].window, offset) * cn_snap_kv_row_bytes(s, layer);
}

static cn_snap *window_new(const cn_state *s, int layer, int offset) {
    uint64_t bytes = cn_snap_window_bytes(s, layer, offset);
    cn_snap *p = snap_new(CN_SNAP_WINDOW, CN_SNAP_RAM, offset, offset, bytes);
    if (!p) return NULL;
    if (!(p->ram = malloc(bytes ? bytes : 1))) {
        free(p);
        return NULL;
    }
    return p;
}

/* Host copies of positions [o - n, o) of one ring (p at row p % W), oldest first. */
static int ring_download(const cn_state *s, const cn_tensor *ring, int o, int n, uint8_t *dst,
                         uint64_t row) {
    int W = (int)ring->shape[0], rc = CN_OK;
    for (int p = o - n; !rc && p < o;) {
        int r = p % W, len = W - r < o - p ? W - r : o - p; /* up to the ring's end */
        cn_tensor v = cn_tensor_rows(ring, r, len);
        rc = cn_backend_download(backend(s), dst, &v);
        dst += (uint64_t)len * row;
        p += len;
    }
    return rc;
}

int cn_snap_window_take(const cn_state *s, int layer, cn_snap **out) {
    const cn_layer_state *ls = &s->layers[layer];
    if (ls->type != CN_BLOCK_SWA) return CN_EINVAL;
    cn_snap *p = window_new(s, layer, s->offset);
    if (!p) return CN_ENOMEM;
    int n = cn_window_rows(ls->window, s->offset);
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    int rc = ring_download(s, &ls->k, s->offset, n, p->ram, row);
    if (!rc) rc = ring_download(s, &ls->v, s->offset, n, p->ram + (uint64_t)n * row, row);
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_window_from_capture(const cn_state *s, const cn_rsnap *rs, int w, cn_snap **out) {
    int layer = -1;
    for (int l = 0, k = 0; l < s->n_layers; l++)
        if (s->layers[l].type == CN_BLOCK_SWA && k++ == w) layer = l;
    if (layer < 0 || w >= rs->n_win) return CN_EINVAL;
    cn_snap *p = window_new(s, layer, rs->offset);
    if (!p) return CN_ENOMEM;
    int n = cn_window_rows(s->layers[layer].window, rs->offset);
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    int rc = CN_OK;
    if (n > 0) {
        cn_tensor k = cn_tensor_rows(&rs->win_k[w], 0, n), v = cn_tensor_rows(&rs->win_v[w], 0, n);
        rc = cn_backend_download(backend(s), p->ram, &k);
        if (!rc) rc = cn_backend_download(backend(s), p->ram + (uint64_t)n * row, &v);
    }
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_window_restore(const cn_snap *snap, cn_state *s, int layer) {
    cn_layer_state *ls = &s->layers[layer];
    if (snap->kind != CN_SNAP_WINDOW || snap->tier != CN_SNAP_RAM || ls->type != CN_BLOCK_SWA) return CN_EINVAL;
    int W = ls->window, o = snap->to, n = cn_window_rows(W, o), rc = CN_OK;
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    if (snap->bytes != 2 * (uint64_t)n * row) return CN_EINVAL;
    for (int p = o - n; !rc && p < o;) {
        int r = p % W, len = W - r < o - p ? W - r : o - p;
        uint64_t src = (uint64_t)(p - (o - n)) * row;
        rc = cn_backend_upload(backend(s), &ls->k, (uint64_t)r * row, snap->ram + src, (uint64_t)len * row);
        if (!rc)
            rc = cn_backend_upload(backend(s), &ls->v, (uint64_t)r * row, snap->ram + (uint64_t)n * row + src,
                                   (uint64_t)len * row);
        p += len;
    }
    return rc;
}

static int kv_download(const cn_state *s, int layer, int from, int to, uint8_t *dst) {
    const cn_layer_state *ls = &s->layers[layer];
    if (to == from) return CN_OK;
    cn_tensor k = cn_tensor_rows(&ls->k, from, to - from), v = cn_tensor_rows(&ls->v, from, to - from);
    uint64_t half = (uint64_t)(to - from) * cn_snap_kv_row_bytes(s, layer);
    int rc = cn_backend_download(backend(s), dst, &k);
    if (!rc) rc = cn_backend_download(backend(s), dst + half, &v);
    return rc;
}

int cn_snap_materialize(cn_snap *snap, const cn_state *s, int layer) {
    if (snap->tier == CN_SNAP_RAM) return CN_OK;
    if (snap->tier != CN_SNAP_LIVE || snap->kind != CN_SNAP_KV) return CN_EINVAL;
    uint8_t *ram = malloc(snap->bytes ? snap->bytes : 1);
    if (!ram) return CN_ENOMEM;
    int rc = kv_download(s, layer, snap->from, snap->to, ram);
    if (rc) {
        free(ram);
        return rc;
    }
    snap->ram = ram;
    snap->tier = CN_SNAP_RAM;
    return CN_OK;
}

/* Copies rows [from, to) of a RAM KV snapshot into dst laid out as K rows then V rows. */
static void kv_copy_rows(const cn_snap *src, uint64_t row, int from, int to, uint8_t *dst) {
    uint64_t n = (uint64_t)(to - from) * row, src_half = (uint64_t)(src->to - src->from) * row;
    uint64_t off = (uint64_t)(from - src->from) * row;
    memcpy(dst, src->ram + off, n);
    memcpy(dst + n, src->ram + src_half + off, n);
}

int cn_snap_kv_split(const cn_snap *snap, const cn_state *s, int layer, int at, cn_snap **head,
                     cn_snap **tail) {
    if (snap->kind != CN_SNAP_KV || at <= snap->from || at >= snap->to || snap->tier == CN_SNAP_DISK)
        return CN_EINVAL;
    cn_snap *h, *t;
    if (snap->tier == CN_SNAP_LIVE) {
        h = cn_snap_kv_lazy(s, layer, snap->from, at);
        t = cn_snap_kv_lazy(s, layer, at, snap->to);
    } else {
        h = kv_ram(s, layer, snap->from, at);
        t = kv_ram(s, layer, at, snap->to);
        uint64_t row = cn_snap_kv_row_bytes(s, layer);
        if (h) kv_copy_rows(snap, row, snap->from, at, h->ram);
        if (t) kv_copy_rows(snap, row, at, snap->to, t->ram);
    }
    if (!h || !t) {
        cn_snap_free(h);
        cn_snap_free(t);
        return CN_ENOMEM;
    }
    *head = h;
    *tail = t;
    return CN_OK;
}

int cn_snap_kv_concat(const cn_snap *a, const cn_snap *b, const cn_state *s, int layer,
                      cn_snap **out) {
    if (a->kind != CN_SNAP_KV || b->kind != CN_SNAP_KV || a->to != b->from) return CN_EINVAL;
    if (a->tier == CN_SNAP_LIVE && b->tier == CN_SNAP_LIVE) {
        *out = cn_snap_kv_lazy(s, layer, a->from, b->to);
        return *out ? CN_OK : CN_ENOMEM;
    }
    if (a->tier != CN_SNAP_RAM || b->tier != CN_SNAP_RAM) return CN_EINVAL;
    cn_snap *p = kv_ram(s, layer, a->from, b->to);
    if (!p) return CN_ENOMEM;
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    uint64_t na = (uint64_t)(a->to - a->from) * row, nb = (uint64_t)(b->to - b->from) * row;
    memcpy(p->ram, a->ram, na);                     /* K of a */
    memcpy(p->ram + na, b->ram, nb);                /* K of b */
    memcpy(p->ram + na + nb, a->ram + na, na);      /* V of a */
    memcpy(p->ram + 2 * na + nb, b->ram + nb, nb);  /* V of b */
    *out = p;
    return CN_OK;
}

int cn_snap_kv_restore(const cn_snap *snap, cn_state *s, int layer, int from, int to) {
    if (snap->kind != CN_SNAP_KV || from < snap->from || to > snap->to || from > to) return CN_EINVAL;
    if (snap->tier == CN_SNAP_LIVE || from == to) return CN_OK;
    if (snap->tier != CN_SNAP_RAM) return CN_EINVAL;
    cn_layer_state *ls = &s->layers[layer];
    uint64_t row = cn_snap_kv_row_bytes(s, layer), n = (uint64_t)(to - from) * row;
    uint64_t half = (uint64_t)(snap->to - snap->from) * row, off = (uint64_t)(from - snap->from) * row;
    int rc = cn_backend_upload(backend(s), &ls->k, (uint64_t)from * row, snap->ram + off, n);
    if (!rc) rc = cn_backend_upload(backend(s), &ls->v, (uint64_t)from * row, snap->ram + half + off, n);
    return rc;
}

int cn_snap_state_restore(const cn_snap *snap, cn_state *s, int layer) {
    if (snap->kind != CN_SNAP_STATE || snap->tier != CN_SNAP_RAM) return CN_EINVAL;
    cn_layer_state *ls = &s->layers[layer];
    uint64_t nc = cn_tensor_nbytes(&ls->conv);
    int rc = cn_backend_upload(backend(s), &ls->conv, 0, snap->ram, nc);
    if (!rc) rc = cn_backend_upload(backend(s), &ls->ssm, 0, snap->ram + nc, cn_tensor_nbytes(&ls->ssm));
    return rc;
}

int cn_snap_read(const cn_snap *snap, const cn_state *s, int layer, uint8_t *dst) {
    if (snap->tier == CN_SNAP_RAM) {
        memcpy(dst, snap->ram, snap->bytes);
        return CN_OK;
    }
    if (snap->tier != CN_SNAP_LIVE || snap->kind != CN_SNAP_KV) return CN_EINVAL;
    return kv_download(s, layer, snap->from, snap->to, dst);
}

cn_snap *cn_snap_disk(cn_snap_kind kind, int from, int to, uint64_t bytes) {
    return snap_new(kind, CN_SNAP_DISK, from, to, bytes);
}

void cn_snap_page_out(cn_snap *snap) {
    if (snap->tier != CN_SNAP_RAM) return;
    free(snap->ram);
    snap->ram = NULL;
    snap->tier = CN_SNAP_DISK;
}

void cn_snap_page_in(cn_snap *snap, uint8_t *ram) {
    free(snap->ram);
    snap->ram = ram;
    snap->tier = CN_SNAP_RAM;
}

void cn_snap_free(cn_snap *snap) {
    if (!snap) return;
    free(snap->ram);
    free(snap);
}
