/* snapshot.c - layer snapshots moving between the live buffers, device buffers and host RAM; see
 * snapshot.h. */
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

/* ---- storage: one helper per move, so that fences and buffer kinds are handled in one place ---- */

/* Waits for a copy in flight into or out of ram (snapshot.h); the bytes may then be used. */
static void ram_settle(const cn_snap *p) {
    if (p->fence && p->be) cn_backend_fence_wait(p->be, p->fence, 1);
}

static void ram_release(cn_snap *p) {
    if (!p->ram) return;
    ram_settle(p);
    if (p->ram_pinned) cn_backend_buf_free(p->be, CN_BUF_HOST, p->ram);
    else free(p->ram);
    p->ram = NULL;
    p->ram_pinned = 0;
    p->fence = 0;
}

static void dev_release(cn_snap *p) {
    if (p->dev) cn_backend_buf_free(p->be, CN_BUF_DEVICE, p->dev);
    p->dev = NULL;
}

/* Gives p the storage of `tier` (DEVICE, or RAM when asked or when the device is full). */
static int storage_new(cn_snap *p, cn_backend *be, cn_snap_tier tier) {
    p->be = be;
    if (tier == CN_SNAP_DEVICE) {
        int rc = cn_backend_buf_alloc(be, CN_BUF_DEVICE, p->bytes, &p->dev);
        if (rc != CN_ENOMEM) {
            if (!rc) p->tier = CN_SNAP_DEVICE;
            return rc;
        }
    }
    void *r;
    int rc = cn_backend_buf_alloc(be, CN_BUF_HOST, p->bytes, &r);
    if (rc) return rc;
    p->ram = r;
    p->ram_pinned = 1;
    p->tier = CN_SNAP_RAM;
    return CN_OK;
}

/* A [1, n/4] F32 view of n bytes at p: device-to-device copies go through cn_backend_copy, queued
 * with the ops (snapshot bytes are always whole floats). */
static cn_tensor flat(void *p, uint64_t n) {
    cn_tensor t = cn_tensor_2d(CN_F32, 1, (int64_t)(n / sizeof(float)), p);
    t.where = CN_DEVICE;
    return t;
}

/* Copies tensor src (2D F32 on the backend, rows possibly strided) into the snapshot's storage
 * at byte offset off, rows packed. */
static int put_bytes(cn_snap *p, uint64_t off, const cn_tensor *src) {
    if (src->shape[0] == 0 || src->shape[1] == 0) return CN_OK;
    if (p->tier == CN_SNAP_RAM) return cn_backend_download(p->be, p->ram + off, src);
    cn_tensor d = cn_tensor_2d(CN_F32, src->shape[0], src->shape[1], (char *)p->dev + off);
    d.where = CN_DEVICE;
    return cn_backend_copy(p->be, &d, src);
}

/* Writes n bytes of the snapshot's storage at off into live tensor dst (contiguous) at byte
 * offset dst_off, without the host waiting: a device copy, or an upload on the copy stream that
 * the ops queued next wait for (its fence kept on the snapshot: the bytes stay until it is done). */
static int get_bytes(cn_snap *p, cn_backend *be, uint64_t off, cn_tensor *dst, uint64_t dst_off,
                     uint64_t n) {
    if (!n) return CN_OK;
    char *to = (char *)dst->data + dst_off;
    if (p->tier == CN_SNAP_DEVICE) {
        cn_tensor d = flat(to, n), sv = flat((char *)p->dev + off, n);
        return cn_backend_copy(be, &d, &sv);
    }
    if (p->tier != CN_SNAP_RAM) return CN_EINVAL;
    ram_settle(p); /* a to_host still filling these bytes */
    uint64_t f;
    int rc = cn_backend_copy_async(be, to, p->ram + off, n, CN_COPY_H2D, &f);
    if (!rc) rc = cn_backend_fence_wait(be, f, 0);
    if (f) {
        p->be = be; /* bytes read back from a file: malloc'd, but the fence is this backend's */
        p->fence = f;
    }
    return rc;
}

/* Copies n bytes between two snapshots' storages of the same tier (DEVICE or RAM). */
static int move_bytes(cn_snap *dst, uint64_t doff, const cn_snap *src, uint64_t soff, uint64_t n) {
    if (!n) return CN_OK;
    if (dst->tier == CN_SNAP_RAM) {
        ram_settle(src);
        memcpy(dst->ram + doff, src->ram + soff, n);
        return CN_OK;
    }
    cn_tensor d = flat((char *)dst->dev + doff, n), sv = flat((char *)src->dev + soff, n);
    return cn_backend_copy(dst->be, &d, &sv);
}

/* ---- recurrent states ---- */

static int state_copy(const cn_state *s, int layer, const cn_tensor *conv, const cn_tensor *ssm,
                      int offset, cn_snap_tier tier, cn_snap **out) {
    cn_snap *p = snap_new(CN_SNAP_STATE, CN_SNAP_RAM, offset, offset, cn_snap_state_bytes(s, layer));
    if (!p) return CN_ENOMEM;
    int rc = storage_new(p, backend(s), tier);
    if (!rc) rc = put_bytes(p, 0, conv);
    if (!rc) rc = put_bytes(p, cn_tensor_nbytes(conv), ssm);
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_state_take(const cn_state *s, int layer, cn_snap_tier tier, cn_snap **out) {
    const cn_layer_state *ls = &s->layers[layer];
    return state_copy(s, layer, &ls->conv, &ls->ssm, s->offset, tier, out);
}

int cn_snap_state_from_capture(const cn_state *s, const cn_rsnap *rs, int j, cn_snap_tier tier,
                               cn_snap **out) {
    int layer = -1;
    for (int l = 0, m = 0; l < s->n_layers; l++)
        if (s->layers[l].type == CN_BLOCK_MAMBA && m++ == j) layer = l;
    if (layer < 0 || j >= rs->n_layers) return CN_EINVAL;
    return state_copy(s, layer, &rs->conv[j], &rs->ssm[j], rs->offset, tier, out);
}

int cn_snap_state_restore(cn_snap *snap, cn_state *s, int layer) {
    if (snap->kind != CN_SNAP_STATE || (snap->tier != CN_SNAP_RAM && snap->tier != CN_SNAP_DEVICE))
        return CN_EINVAL;
    cn_layer_state *ls = &s->layers[layer];
    uint64_t nc = cn_tensor_nbytes(&ls->conv);
    int rc = get_bytes(snap, backend(s), 0, &ls->conv, 0, nc);
    if (!rc) rc = get_bytes(snap, backend(s), nc, &ls->ssm, 0, cn_tensor_nbytes(&ls->ssm));
    return rc;
}

/* ---- windows ---- */

uint64_t cn_snap_window_bytes(const cn_state *s, int layer, int offset) {
    return 2 * (uint64_t)cn_window_rows(s->layers[layer].window, offset) * cn_snap_kv_row_bytes(s, layer);
}

static cn_snap *window_new(const cn_state *s, int layer, int offset, cn_snap_tier tier) {
    cn_snap *p = snap_new(CN_SNAP_WINDOW, CN_SNAP_RAM, offset, offset, cn_snap_window_bytes(s, layer, offset));
    if (p && storage_new(p, backend(s), tier)) {
        free(p);
        return NULL;
    }
    return p;
}

/* Copies positions [o - n, o) of one ring (p at row p % W), oldest first, to byte offset off. */
static int ring_put(cn_snap *p, const cn_tensor *ring, int o, int n, uint64_t off, uint64_t row) {
    int W = (int)ring->shape[0], rc = CN_OK;
    for (int q = o - n; !rc && q < o;) {
        int r = q % W, len = W - r < o - q ? W - r : o - q; /* up to the ring's end */
        cn_tensor v = cn_tensor_rows(ring, r, len);
        rc = put_bytes(p, off, &v);
        off += (uint64_t)len * row;
        q += len;
    }
    return rc;
}

int cn_snap_window_take(const cn_state *s, int layer, cn_snap_tier tier, cn_snap **out) {
    const cn_layer_state *ls = &s->layers[layer];
    if (ls->type != CN_BLOCK_SWA) return CN_EINVAL;
    cn_snap *p = window_new(s, layer, s->offset, tier);
    if (!p) return CN_ENOMEM;
    int n = cn_window_rows(ls->window, s->offset);
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    int rc = ring_put(p, &ls->k, s->offset, n, 0, row);
    if (!rc) rc = ring_put(p, &ls->v, s->offset, n, (uint64_t)n * row, row);
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_window_from_capture(const cn_state *s, const cn_rsnap *rs, int w, cn_snap_tier tier,
                                cn_snap **out) {
    int layer = -1;
    for (int l = 0, k = 0; l < s->n_layers; l++)
        if (s->layers[l].type == CN_BLOCK_SWA && k++ == w) layer = l;
    if (layer < 0 || w >= rs->n_win) return CN_EINVAL;
    cn_snap *p = window_new(s, layer, rs->offset, tier);
    if (!p) return CN_ENOMEM;
    int n = cn_window_rows(s->layers[layer].window, rs->offset);
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    int rc = CN_OK;
    if (n > 0) {
        cn_tensor k = cn_tensor_rows(&rs->win_k[w], 0, n), v = cn_tensor_rows(&rs->win_v[w], 0, n);
        rc = put_bytes(p, 0, &k);
        if (!rc) rc = put_bytes(p, (uint64_t)n * row, &v);
    }
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_window_restore(cn_snap *snap, cn_state *s, int layer) {
    cn_layer_state *ls = &s->layers[layer];
    if (snap->kind != CN_SNAP_WINDOW || (snap->tier != CN_SNAP_RAM && snap->tier != CN_SNAP_DEVICE) ||
        ls->type != CN_BLOCK_SWA)
        return CN_EINVAL;
    int W = ls->window, o = snap->to, n = cn_window_rows(W, o), rc = CN_OK;
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    if (snap->bytes != 2 * (uint64_t)n * row) return CN_EINVAL;
    for (int p = o - n; !rc && p < o;) {
        int r = p % W, len = W - r < o - p ? W - r : o - p;
        uint64_t src = (uint64_t)(p - (o - n)) * row;
        rc = get_bytes(snap, backend(s), src, &ls->k, (uint64_t)r * row, (uint64_t)len * row);
        if (!rc)
            rc = get_bytes(snap, backend(s), (uint64_t)n * row + src, &ls->v, (uint64_t)r * row,
                           (uint64_t)len * row);
        p += len;
    }
    return rc;
}

/* ---- KV row ranges ---- */

static cn_snap *kv_new(const cn_state *s, int layer, int from, int to, cn_snap_tier tier) {
    cn_snap *p = snap_new(CN_SNAP_KV, CN_SNAP_RAM, from, to,
                          2 * (uint64_t)(to - from) * cn_snap_kv_row_bytes(s, layer));
    if (p && storage_new(p, backend(s), tier)) {
        free(p);
        return NULL;
    }
    return p;
}

cn_snap *cn_snap_kv_lazy(const cn_state *s, int layer, int from, int to) {
    cn_snap *p = snap_new(CN_SNAP_KV, CN_SNAP_LIVE, from, to,
                          2 * (uint64_t)(to - from) * cn_snap_kv_row_bytes(s, layer));
    if (p) p->src = s;
    return p;
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

int cn_snap_materialize(cn_snap *snap, const cn_state *s, int layer, cn_snap_tier tier) {
    if (snap->tier == CN_SNAP_RAM || snap->tier == CN_SNAP_DEVICE) return CN_OK;
    if (snap->tier != CN_SNAP_LIVE || snap->kind != CN_SNAP_KV) return CN_EINVAL;
    cn_snap *p = kv_new(s, layer, snap->from, snap->to, tier);
    if (!p) return CN_ENOMEM;
    const cn_layer_state *ls = &snap->src->layers[layer]; /* the rows are the source state's */
    int rc = CN_OK, n = snap->to - snap->from;
    if (n > 0) {
        cn_tensor k = cn_tensor_rows(&ls->k, snap->from, n), v = cn_tensor_rows(&ls->v, snap->from, n);
        rc = put_bytes(p, 0, &k);
        if (!rc) rc = put_bytes(p, (uint64_t)n * cn_snap_kv_row_bytes(s, layer), &v);
    }
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    /* the storage moves into snap: its tier, buffers and backend */
    snap->tier = p->tier;
    snap->ram = p->ram;
    snap->dev = p->dev;
    snap->be = p->be;
    snap->ram_pinned = p->ram_pinned;
    free(p);
    return CN_OK;
}

int cn_snap_to_host(cn_snap *snap) {
    if (snap->tier != CN_SNAP_DEVICE) return CN_OK;
    void *r;
    int rc = cn_backend_buf_alloc(snap->be, CN_BUF_HOST, snap->bytes, &r);
    if (rc) return rc;
    uint64_t f;
    if ((rc = cn_backend_copy_async(snap->be, r, snap->dev, snap->bytes, CN_COPY_D2H, &f))) {
        cn_backend_buf_free(snap->be, CN_BUF_HOST, r);
        return rc;
    }
    dev_release(snap); /* after the copy that drains it (backend.h (c)) */
    snap->ram = r;
    snap->ram_pinned = 1;
    snap->fence = f;
    snap->tier = CN_SNAP_RAM;
    return CN_OK;
}

/* A device snapshot's bytes in host memory (malloc'd; caller frees), waiting for them. */
static uint8_t *host_copy(const cn_snap *p, const cn_state *s, int layer) {
    uint8_t *h = malloc(p->bytes ? p->bytes : 1);
    if (h && cn_snap_read(p, s, layer, h)) {
        free(h);
        return NULL;
    }
    return h;
}

/* Gives a new, empty DEVICE snapshot host storage instead (the device had no room for its
 * sibling, and both must share a tier). */
static int storage_to_ram(cn_snap *p) {
    if (p->tier != CN_SNAP_DEVICE) return CN_OK;
    void *r;
    int rc = cn_backend_buf_alloc(p->be, CN_BUF_HOST, p->bytes, &r);
    if (rc) return rc;
    dev_release(p);
    p->ram = r;
    p->ram_pinned = 1;
    p->tier = CN_SNAP_RAM;
    return CN_OK;
}

int cn_snap_kv_split(const cn_snap *snap, const cn_state *s, int layer, int at, cn_snap **head,
                     cn_snap **tail) {
    if (snap->kind != CN_SNAP_KV || at <= snap->from || at >= snap->to || snap->tier == CN_SNAP_DISK)
        return CN_EINVAL;
    cn_snap *h, *t;
    int rc = CN_OK;
    if (snap->tier == CN_SNAP_LIVE) {
        h = cn_snap_kv_lazy(snap->src, layer, snap->from, at);
        t = cn_snap_kv_lazy(snap->src, layer, at, snap->to);
    } else {
        h = kv_new(s, layer, snap->from, at, snap->tier);
        t = kv_new(s, layer, at, snap->to, snap->tier);
        uint64_t row = cn_snap_kv_row_bytes(s, layer);
        uint64_t hn = (uint64_t)(at - snap->from) * row, tn = (uint64_t)(snap->to - at) * row;
        uint64_t half = hn + tn;
        if (!h || !t) {
            rc = CN_ENOMEM;
        } else if (h->tier == snap->tier && t->tier == snap->tier) {
            rc = move_bytes(h, 0, snap, 0, hn);                   /* K head */
            if (!rc) rc = move_bytes(h, hn, snap, half, hn);      /* V head */
            if (!rc) rc = move_bytes(t, 0, snap, hn, tn);         /* K tail */
            if (!rc) rc = move_bytes(t, tn, snap, half + hn, tn); /* V tail */
        } else {
            /* a device snapshot without device room for its halves: both into RAM */
            uint8_t *all = NULL;
            rc = storage_to_ram(h);
            if (!rc) rc = storage_to_ram(t);
            if (!rc && !(all = host_copy(snap, s, layer))) rc = CN_ENOMEM;
            if (!rc) {
                memcpy(h->ram, all, hn);
                memcpy(h->ram + hn, all + half, hn);
                memcpy(t->ram, all + hn, tn);
                memcpy(t->ram + tn, all + half + hn, tn);
            }
            free(all);
        }
    }
    if (!h || !t || rc) {
        cn_snap_free(h);
        cn_snap_free(t);
        return rc ? rc : CN_ENOMEM;
    }
    *head = h;
    *tail = t;
    return CN_OK;
}

int cn_snap_kv_concat(const cn_snap *a, const cn_snap *b, const cn_state *s, int layer,
                      cn_snap **out) {
    if (a->kind != CN_SNAP_KV || b->kind != CN_SNAP_KV || a->to != b->from) return CN_EINVAL;
    if (a->tier == CN_SNAP_LIVE && b->tier == CN_SNAP_LIVE) {
        if (a->src != b->src) return CN_EINVAL; /* rows of two states: materialize them first */
        *out = cn_snap_kv_lazy(a->src, layer, a->from, b->to);
        return *out ? CN_OK : CN_ENOMEM;
    }
    if (a->tier != b->tier || (a->tier != CN_SNAP_RAM && a->tier != CN_SNAP_DEVICE)) return CN_EINVAL;
    cn_snap *p = kv_new(s, layer, a->from, b->to, a->tier);
    if (!p) return CN_ENOMEM;
    uint64_t row = cn_snap_kv_row_bytes(s, layer);
    uint64_t na = (uint64_t)(a->to - a->from) * row, nb = (uint64_t)(b->to - b->from) * row;
    int rc = CN_OK;
    if (p->tier == a->tier) {
        rc = move_bytes(p, 0, a, 0, na);                     /* K of a */
        if (!rc) rc = move_bytes(p, na, b, 0, nb);           /* K of b */
        if (!rc) rc = move_bytes(p, na + nb, a, na, na);     /* V of a */
        if (!rc) rc = move_bytes(p, 2 * na + nb, b, nb, nb); /* V of b */
    } else {
        /* device inputs without device room for the whole: into RAM through the host */
        uint8_t *ha = host_copy(a, s, layer), *hb = ha ? host_copy(b, s, layer) : NULL;
        if (!ha || !hb) rc = CN_ENOMEM;
        if (!rc) {
            memcpy(p->ram, ha, na);
            memcpy(p->ram + na, hb, nb);
            memcpy(p->ram + na + nb, ha + na, na);
            memcpy(p->ram + 2 * na + nb, hb + nb, nb);
        }
        free(ha);
        free(hb);
    }
    if (rc) {
        cn_snap_free(p);
        return rc;
    }
    *out = p;
    return CN_OK;
}

int cn_snap_kv_restore(cn_snap *snap, cn_state *s, int layer, int from, int to) {
    if (snap->kind != CN_SNAP_KV || from < snap->from || to > snap->to || from > to) return CN_EINVAL;
    if (from == to || (snap->tier == CN_SNAP_LIVE && snap->src == s)) return CN_OK;
    cn_layer_state *ls = &s->layers[layer];
    if (snap->tier == CN_SNAP_LIVE) { /* another state's rows: a copy between the two buffers */
        const cn_layer_state *src = &snap->src->layers[layer];
        cn_tensor dk = cn_tensor_rows(&ls->k, from, to - from), dv = cn_tensor_rows(&ls->v, from, to - from);
        cn_tensor sk = cn_tensor_rows(&src->k, from, to - from), sv = cn_tensor_rows(&src->v, from, to - from);
        int rc = cn_backend_copy(backend(s), &dk, &sk);
        return rc ? rc : cn_backend_copy(backend(s), &dv, &sv);
    }
    if (snap->tier != CN_SNAP_RAM && snap->tier != CN_SNAP_DEVICE) return CN_EINVAL;
    uint64_t row = cn_snap_kv_row_bytes(s, layer), n = (uint64_t)(to - from) * row;
    uint64_t half = (uint64_t)(snap->to - snap->from) * row, off = (uint64_t)(from - snap->from) * row;
    int rc = get_bytes(snap, backend(s), off, &ls->k, (uint64_t)from * row, n);
    if (!rc) rc = get_bytes(snap, backend(s), half + off, &ls->v, (uint64_t)from * row, n);
    return rc;
}

int cn_snap_read(const cn_snap *snap, const cn_state *s, int layer, uint8_t *dst) {
    if (snap->tier == CN_SNAP_RAM) {
        ram_settle(snap);
        memcpy(dst, snap->ram, snap->bytes);
        return CN_OK;
    }
    if (snap->tier == CN_SNAP_DEVICE) {
        uint64_t f;
        int rc = cn_backend_copy_async(snap->be, dst, snap->dev, snap->bytes, CN_COPY_D2H, &f);
        if (!rc) rc = cn_backend_fence_wait(snap->be, f, 1);
        return rc;
    }
    if (snap->tier != CN_SNAP_LIVE || snap->kind != CN_SNAP_KV) return CN_EINVAL;
    (void)s;
    return kv_download(snap->src, layer, snap->from, snap->to, dst);
}

cn_snap *cn_snap_disk(cn_snap_kind kind, int from, int to, uint64_t bytes) {
    return snap_new(kind, CN_SNAP_DISK, from, to, bytes);
}

void cn_snap_page_out(cn_snap *snap) {
    if (snap->tier != CN_SNAP_RAM) return;
    ram_release(snap);
    snap->tier = CN_SNAP_DISK;
}

void cn_snap_page_in(cn_snap *snap, uint8_t *ram) {
    ram_release(snap);
    dev_release(snap);
    snap->ram = ram;
    snap->tier = CN_SNAP_RAM;
}

void cn_snap_free(cn_snap *snap) {
    if (!snap) return;
    ram_release(snap);
    dev_release(snap);
    free(snap);
}
