/* prefix_cache.c - the restore-point policy over the trie and the live caches; see
 * prefix_cache.h for the life cycle and invariants. */
#include "cache/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cache/disk.h"

/* ---- helpers: layers, slots and bytes ------------------------------------------------------- */

/* The state of lane ln holding trie layer l and its index there: the target's layers come
 * first, then the draft's. */
static cn_state *lst(const cn_pc_lane *ln, int l, int *ll) {
    if (l < ln->live->n_layers) {
        *ll = l;
        return ln->live;
    }
    *ll = l - ln->live->n_layers;
    return ln->draft;
}

/* Lane 0's state of trie layer l: the shapes every lane shares, for what only needs those. */
static cn_state *shape_st(const cn_prefix_cache *pc, int l, int *ll) { return lst(&pc->lanes[0], l, ll); }

/* Sets the offset of every live state of the lane (KV rows below stay valid). */
static void set_level(cn_pc_lane *ln, int t) {
    ln->live->offset = t;
    if (ln->draft) ln->draft->offset = t;
}

static int reset_live(cn_pc_lane *ln) {
    int rc = cn_state_reset(ln->live);
    if (!rc && ln->draft) rc = cn_state_reset(ln->draft);
    if (!rc) ln->live_stale = 0;
    return rc;
}

/* Layers whose snapshots are whole states at node ends: recurrent ones and sliding windows. */
static int whole(cn_layer_kind k) { return k == CN_LAYER_RECURRENT || k == CN_LAYER_WINDOW; }

/* 1 when the live whole-state layers are exactly at offset t for a prompt whose first lc keys the
 * live caches hold: the live offset itself, or below it while every ring is unwrapped and no
 * recurrent layer exists (state.h invariant 4). */
static int live_reaches(const cn_pc_lane *ln, int lc, int t) {
    return !ln->live_stale && t <= lc && cn_state_can_rewind(ln->live, t);
}

static uint64_t ram_size(const cn_snap *s) { return s && s->tier == CN_SNAP_RAM ? s->bytes : 0; }
static uint64_t dev_size(const cn_snap *s) { return s && s->tier == CN_SNAP_DEVICE ? s->bytes : 0; }

/* Where new copies of state go: the device tier when it has a budget (a full device gives RAM). */
static cn_snap_tier new_tier(const cn_prefix_cache *pc) {
    return pc->o.dev_budget ? CN_SNAP_DEVICE : CN_SNAP_RAM;
}

static void slot_set(cn_prefix_cache *pc, cn_node *n, int l, cn_snap *s) {
    pc->ram_bytes -= ram_size(n->slots[l]);
    pc->dev_bytes -= dev_size(n->slots[l]);
    cn_snap_free(n->slots[l]);
    n->slots[l] = s;
    pc->ram_bytes += ram_size(s);
    pc->dev_bytes += dev_size(s);
}

static void node_clear(cn_prefix_cache *pc, cn_node *n) {
    for (int l = 0; l < pc->trie.n_layers; l++) slot_set(pc, n, l, NULL);
}

static int materialize(cn_prefix_cache *pc, cn_node *n, int l) {
    cn_snap *s = n->slots[l];
    if (!s || s->tier != CN_SNAP_LIVE) return CN_OK;
    int ll;
    cn_state *st = shape_st(pc, l, &ll);
    int rc = cn_snap_materialize(s, st, ll, new_tier(pc));
    if (!rc) {
        pc->ram_bytes += ram_size(s);
        pc->dev_bytes += dev_size(s);
    }
    return rc;
}

/* DEVICE -> RAM for slot l of n: queued on the copy stream, nothing waits (snapshot.h). */
static int slot_to_host(cn_prefix_cache *pc, cn_node *n, int l) {
    cn_snap *s = n->slots[l];
    if (!s || s->tier != CN_SNAP_DEVICE) return CN_OK;
    int rc = cn_snap_to_host(s);
    if (rc) return rc;
    pc->dev_bytes -= s->bytes;
    pc->ram_bytes += s->bytes;
    return CN_OK;
}

static int has_all_states(const cn_prefix_cache *pc, const cn_node *n) {
    if (pc->n_rec == 0 && pc->n_win == 0) return 1;
    for (int l = 0; l < pc->trie.n_layers; l++)
        if (whole(pc->kind[l]) &&
            (!n->slots[l] || n->slots[l]->to != n->end || n->slots[l]->tier == CN_SNAP_LIVE))
            return 0;
    return 1;
}

/* ---- the disk tier: node files ---------------------------------------------------------------- */

/* Bytes of every slot the node holds, whatever its tier: what its file holds. */
static uint64_t slot_bytes(const cn_prefix_cache *pc, const cn_node *n) {
    uint64_t b = 0;
    for (int l = 0; l < pc->trie.n_layers; l++) b += n->slots[l] ? n->slots[l]->bytes : 0;
    return b;
}

static int has_tier(const cn_prefix_cache *pc, const cn_node *n, cn_snap_tier tier) {
    for (int l = 0; l < pc->trie.n_layers; l++)
        if (n->slots[l] && n->slots[l]->tier == tier) return 1;
    return 0;
}

static int is_empty(const cn_prefix_cache *pc, const cn_node *n) {
    for (int l = 0; l < pc->trie.n_layers; l++)
        if (n->slots[l]) return 0;
    return 1;
}

/* The header a file of node holds: edge, user flag, slot table (slots: [n_layers], caller's);
 * with keys, also the key path (malloc'd into h->keys). */
static int node_header(const cn_prefix_cache *pc, const cn_node *n, cn_disk_node *h,
                       cn_disk_slot *slots, int keys) {
    memset(h, 0, sizeof *h);
    h->start = cn_node_start(n);
    h->end = n->end;
    h->user = n->user;
    h->pairs = pc->lookahead;
    h->n_layers = pc->trie.n_layers;
    h->slots = slots;
    for (int l = 0; l < h->n_layers; l++) {
        const cn_snap *s = n->slots[l];
        slots[l] = s ? (cn_disk_slot){(int)s->kind, s->from, s->to, s->bytes} : (cn_disk_slot){0, 0, 0, 0};
    }
    if (!keys) return CN_OK;
    if (!(h->keys = malloc((size_t)n->end * sizeof *h->keys))) return CN_ENOMEM;
    for (const cn_node *x = n; x != pc->trie.root; x = x->parent)
        memcpy(h->keys + cn_node_start(x), x->keys, (size_t)x->n_keys * sizeof *x->keys);
    return CN_OK;
}

/* Takes node's file out of the accounting; with remove, queues its deletion. */
static void file_forget(cn_prefix_cache *pc, cn_node *n, int remove) {
    if (!n->disk_id) return;
    pc->disk_bytes -= slot_bytes(pc, n);
    /* A removal that cannot be queued leaves a stale file: still correct state for its key path
     * (the state after a key path depends on the model and the keys only), so it loads right. */
    if (remove) cn_disk_remove(pc->disk, n->disk_id);
    n->disk_id = 0;
}

/* Queues a file for node holding every slot it has (LIVE rows are copied out of the live buffer
 * now: the writer must not read memory a later forward overwrites). 0 also when there is nothing
 * to write; CN_EBUSY when the writer's queue is full (tried again at the next close). */
static int node_write(cn_prefix_cache *pc, cn_node *n) {
    if (!pc->disk || n->disk_id || is_empty(pc, n)) return CN_OK;
    int L = pc->trie.n_layers, rc = CN_OK;
    cn_disk_slot *slots = calloc((size_t)(L ? L : 1), sizeof *slots);
    if (!slots) return CN_ENOMEM;
    cn_disk_node h;
    node_header(pc, n, &h, slots, 0);
    cn_disk_blob *b = cn_disk_blob_new(pc->disk, &h);
    free(slots);
    if (!b) return CN_ENOMEM;
    for (const cn_node *x = n; x != pc->trie.root; x = x->parent)
        for (int k = 0; k < x->n_keys; k++) cn_disk_blob_set_key(b, cn_node_start(x) + k, x->keys[k]);
    for (int l = 0; !rc && l < L; l++) {
        int ll;
        cn_state *st = shape_st(pc, l, &ll);
        if (n->slots[l]) rc = cn_snap_read(n->slots[l], st, ll, cn_disk_blob_slot(b, l));
    }
    if (rc) {
        cn_disk_blob_free(b);
        return rc;
    }
    uint64_t id;
    if ((rc = cn_disk_submit(pc->disk, b, &id))) return rc;
    n->disk_id = id;
    pc->disk_bytes += slot_bytes(pc, n);
    return CN_OK;
}

/* Brings every DISK slot of node back to RAM. Returns 0 when all of its slots are in memory, 1
 * when its file failed verification (warned; the file is moved aside and the node's DISK slots
 * are dropped: that restore point is gone), or CN_ENOMEM (nothing changed). */
static int page_in(cn_prefix_cache *pc, cn_node *n) {
    if (!pc->disk || !has_tier(pc, n, CN_SNAP_DISK)) return 0;
    int L = pc->trie.n_layers, rc;
    cn_disk_slot *slots = calloc((size_t)(L ? L : 1), sizeof *slots);
    int *want = calloc((size_t)(L ? L : 1), sizeof *want);
    uint8_t **bufs = calloc((size_t)(L ? L : 1), sizeof *bufs);
    cn_disk_node h = {0};
    if (!slots || !want || !bufs || node_header(pc, n, &h, slots, 1)) {
        rc = CN_ENOMEM;
        goto done;
    }
    for (int l = 0; l < L; l++) want[l] = n->slots[l] && n->slots[l]->tier == CN_SNAP_DISK;
    cn_err err;
    cn_err_clear(&err);
    rc = cn_disk_read(pc->disk, n->disk_id, &h, want, bufs, &err);
    if (rc == CN_OK) {
        for (int l = 0; l < L; l++)
            if (want[l]) {
                cn_snap_page_in(n->slots[l], bufs[l]);
                pc->ram_bytes += n->slots[l]->bytes;
            }
        pc->n_paged_in++;
    } else if (rc != CN_ENOMEM) {
        cn_warn("cache: %s; dropping the restore point at %d", err.msg, n->end);
        cn_disk_quarantine(pc->disk, n->disk_id);
        file_forget(pc, n, 0);
        for (int l = 0; l < L; l++)
            if (want[l]) slot_set(pc, n, l, NULL);
        pc->n_disk_failed++;
        rc = 1;
    }
done:
    free(h.keys);
    free(slots);
    free(want);
    free(bufs);
    return rc;
}

/* RAM -> DISK for every RAM slot of node, writing its file first if it has none. */
static int page_out(cn_prefix_cache *pc, cn_node *n) {
    int rc = node_write(pc, n);
    if (rc) return rc;
    if (!n->disk_id) return CN_EINVAL; /* nothing to write */
    for (int l = 0; l < pc->trie.n_layers; l++) {
        cn_snap *s = n->slots[l];
        if (!s || s->tier != CN_SNAP_RAM) continue;
        pc->ram_bytes -= s->bytes;
        cn_snap_page_out(s);
    }
    pc->n_paged_out++;
    return CN_OK;
}

/* Before node's slots change (invariant 6): every slot back in memory, its file retired. The
 * node is written again by the next persist(). Returns 0 or CN_ENOMEM (nothing changed). */
static int node_unfile(cn_prefix_cache *pc, cn_node *n) {
    if (!n->disk_id) return CN_OK;
    int rc = page_in(pc, n);
    if (rc < 0) return rc;
    file_forget(pc, n, 1);
    return CN_OK;
}

static int persist_node(cn_node *n, void *ctx) {
    /* A full queue or a failed copy leaves the node without a file; the next close tries again. */
    node_write(ctx, n);
    return 0;
}

/* Writes every node that has no file yet: the nodes this close created or changed. */
static void persist(cn_prefix_cache *pc) {
    if (pc->disk) cn_trie_walk(&pc->trie, persist_node, pc);
}

/* ---- init / free ------------------------------------------------------------------------------ */

static int lane_init(cn_pc_lane *ln, cn_state *live, cn_state *draft, cn_node *root) {
    memset(ln, 0, sizeof *ln);
    ln->live = live;
    ln->draft = draft;
    ln->cap_live_keys = live->max_ctx;
    ln->live_keys = malloc((size_t)(ln->cap_live_keys ? ln->cap_live_keys : 1) * sizeof *ln->live_keys);
    ln->frontier = root;
    return ln->live_keys ? CN_OK : CN_ENOMEM;
}

int cn_pc_init(cn_prefix_cache *pc, cn_state *live, const cn_pc_opts *o) {
    memset(pc, 0, sizeof *pc);
    if (o) pc->o = *o;
    if (pc->o.spacing <= 0) pc->o.spacing = 1024;
    if (!o) pc->o.pre_end = 4;
    if (pc->o.ram_budget == 0) pc->o.ram_budget = CN_PC_RAM_BUDGET;
    if (pc->o.evict_steps <= 0) pc->o.evict_steps = 8;
    int n = live->n_layers;
    pc->kind = calloc((size_t)(n ? n : 1), sizeof *pc->kind);
    pc->lanes = calloc(1, sizeof *pc->lanes);
    if (!pc->kind || !pc->lanes || cn_trie_init(&pc->trie, n)) {
        cn_pc_free(pc);
        return CN_ENOMEM;
    }
    pc->n_lanes = 1;
    if (lane_init(&pc->lanes[0], live, NULL, pc->trie.root)) {
        cn_pc_free(pc);
        return CN_ENOMEM;
    }
    for (int l = 0; l < n; l++) {
        cn_block t = live->layers[l].type;
        pc->kind[l] = t == CN_BLOCK_ATTN    ? CN_LAYER_KV
                      : t == CN_BLOCK_SWA   ? CN_LAYER_WINDOW
                      : t == CN_BLOCK_MAMBA ? CN_LAYER_RECURRENT
                                            : CN_LAYER_NONE;
        pc->n_kv += pc->kind[l] == CN_LAYER_KV;
        pc->n_rec += pc->kind[l] == CN_LAYER_RECURRENT;
        pc->n_win += pc->kind[l] == CN_LAYER_WINDOW;
    }
    return cn_state_reset(live);
}

int cn_pc_attach_draft(cn_prefix_cache *pc, cn_state *draft) {
    cn_pc_lane *ln = &pc->lanes[0];
    if (pc->disk || pc->trie.n_nodes || ln->draft || pc->n_lanes > 1) return CN_EBUSY;
    if (!draft || draft->max_ctx < ln->live->max_ctx) return CN_EINVAL;
    for (int l = 0; l < draft->n_layers; l++)
        if (draft->layers[l].type == CN_BLOCK_MAMBA || draft->layers[l].type == CN_BLOCK_SWA)
            return CN_EUNSUPPORTED;
    int n = ln->live->n_layers + draft->n_layers;
    cn_layer_kind *kind = realloc(pc->kind, (size_t)(n ? n : 1) * sizeof *kind);
    if (!kind) return CN_ENOMEM;
    pc->kind = kind;
    cn_trie t;
    if (cn_trie_init(&t, n)) return CN_ENOMEM;
    cn_trie_free(&pc->trie);
    pc->trie = t;
    ln->frontier = pc->trie.root;
    for (int l = 0; l < draft->n_layers; l++) {
        int kv = draft->layers[l].type == CN_BLOCK_ATTN;
        kind[ln->live->n_layers + l] = kv ? CN_LAYER_KV : CN_LAYER_NONE;
        pc->n_kv += kv;
    }
    ln->draft = draft;
    pc->lookahead = 1;
    return reset_live(ln);
}

int cn_pc_add_lane(cn_prefix_cache *pc, cn_state *live, cn_state *draft) {
    const cn_pc_lane *l0 = &pc->lanes[0];
    if (!live || live->model != l0->live->model || live->mtp || live->max_ctx != l0->live->max_ctx ||
        !draft != !l0->draft || (draft && (draft->model != live->model || draft->max_ctx < live->max_ctx)))
        return CN_EINVAL;
    cn_pc_lane *lanes = realloc(pc->lanes, (size_t)(pc->n_lanes + 1) * sizeof *lanes);
    if (!lanes) return CN_ENOMEM;
    pc->lanes = lanes;
    cn_pc_lane *ln = &pc->lanes[pc->n_lanes];
    int rc = lane_init(ln, live, draft, pc->trie.root);
    if (!rc) rc = reset_live(ln);
    if (rc) {
        free(ln->live_keys);
        return rc;
    }
    return pc->n_lanes++;
}

static int evict(cn_prefix_cache *pc, int ram_too);

static int sync_node(cn_node *n, void *ctx) {
    cn_prefix_cache *pc = ctx;
    if (node_write(pc, n) == CN_EBUSY) {
        cn_disk_flush(pc->disk);
        node_write(pc, n);
    }
    return 0;
}

void cn_pc_free(cn_prefix_cache *pc) {
    if (pc->disk) {
        /* Nodes a full queue turned away are written now, waiting for room (shutdown may wait
         * on the disk; requests never do), so that an exit right after a cancelled request keeps
         * everything it absorbed. */
        cn_trie_walk(&pc->trie, sync_node, pc);
        evict(pc, 0);
    }
    cn_disk_close(pc->disk); /* drains the queue: what close handed over reaches the disk */
    if (pc->trie.root) cn_trie_free(&pc->trie);
    free(pc->kind);
    for (int i = 0; i < pc->n_lanes; i++) free(pc->lanes[i].live_keys);
    free(pc->lanes);
    memset(pc, 0, sizeof *pc);
}

static int forget_node(cn_node *n, void *ctx) {
    file_forget(ctx, n, 1);
    return 0;
}

int cn_pc_reset(cn_prefix_cache *pc) {
    if (pc->disk) cn_trie_walk(&pc->trie, forget_node, pc);
    int L = pc->trie.n_layers;
    cn_trie_free(&pc->trie);
    pc->ram_bytes = 0;
    pc->dev_bytes = 0;
    int rc = cn_trie_init(&pc->trie, L);
    for (int i = 0; i < pc->n_lanes; i++) {
        pc->lanes[i].pinned = NULL;
        pc->lanes[i].frontier = pc->trie.root;
        if (!rc) rc = reset_live(&pc->lanes[i]);
    }
    return rc;
}

/* ---- structural edits that keep slots aligned with edges -------------------------------------- */

/* Splits node at `at`: KV slots split with the edge, recurrent slots stay at the end (node). */
static cn_node *split_node(cn_prefix_cache *pc, cn_node *node, int at) {
    int L = pc->trie.n_layers;
    if (node_unfile(pc, node)) return NULL;
    cn_snap **head_kv = calloc((size_t)(L ? L : 1), sizeof *head_kv);
    cn_snap **tail_kv = calloc((size_t)(L ? L : 1), sizeof *tail_kv);
    int ok = head_kv && tail_kv;
    for (int l = 0; ok && l < L; l++) {
        cn_snap *s = node->slots[l];
        if (pc->kind[l] != CN_LAYER_KV || !s) continue;
        int ll;
        cn_state *st = shape_st(pc, l, &ll);
        ok = cn_snap_kv_split(s, st, ll, at, &head_kv[l], &tail_kv[l]) == CN_OK;
    }
    cn_node *head = ok ? cn_trie_split(&pc->trie, node, at) : NULL;
    if (!head) {
        for (int l = 0; l < L && head_kv && tail_kv; l++) {
            cn_snap_free(head_kv[l]);
            cn_snap_free(tail_kv[l]);
        }
        free(head_kv);
        free(tail_kv);
        return NULL;
    }
    for (int l = 0; l < L; l++) {
        if (pc->kind[l] != CN_LAYER_KV || !node->slots[l]) continue;
        slot_set(pc, node, l, tail_kv[l]);
        slot_set(pc, head, l, head_kv[l]);
    }
    free(head_kv);
    free(tail_kv);
    return head;
}

/* Merges node's only child into node: KV slots concatenate, the child's recurrent slots win. */
static int merge_child(cn_prefix_cache *pc, cn_node *node) {
    cn_node *c = node->child[0];
    int L = pc->trie.n_layers;
    int rc = node_unfile(pc, node);
    if (!rc) rc = node_unfile(pc, c);
    if (rc) return rc;
    cn_snap **kv = calloc((size_t)(L ? L : 1), sizeof *kv);
    if (!kv) return CN_ENOMEM;
    for (int l = 0; !rc && l < L; l++) {
        if (pc->kind[l] != CN_LAYER_KV) continue;
        cn_snap *a = node->slots[l], *b = c->slots[l];
        if (!a || !b) continue; /* a gap: the merged edge has no KV for this layer */
        if (a->tier != b->tier || a->tier != CN_SNAP_LIVE || a->src != b->src) {
            rc = materialize(pc, node, l);
            if (!rc) rc = materialize(pc, c, l);
            /* one on the device, one in RAM (a full device): both in RAM */
            if (!rc && a->tier != b->tier) rc = slot_to_host(pc, node, l);
            if (!rc && a->tier != b->tier) rc = slot_to_host(pc, c, l);
        }
        int ll;
        cn_state *st = shape_st(pc, l, &ll);
        if (!rc) rc = cn_snap_kv_concat(a, b, st, ll, &kv[l]);
    }
    if (rc) {
        for (int l = 0; l < L; l++) cn_snap_free(kv[l]);
        free(kv);
        return rc;
    }
    node_clear(pc, node);
    for (int l = 0; l < L; l++)
        if (pc->kind[l] == CN_LAYER_KV) slot_set(pc, c, l, kv[l]);
    free(kv);
    /* node's slots are all NULL now; the trie moves the child's slots up. */
    return cn_trie_merge_child(&pc->trie, node);
}

/* ---- begin ----------------------------------------------------------------------------------- */

static int push_keys(cn_pc_session *s, const cn_key *k, int n) {
    if (s->n_keys + n > s->cap_keys) {
        int cap = s->cap_keys ? s->cap_keys : 64;
        while (cap < s->n_keys + n) cap *= 2;
        cn_key *p = realloc(s->keys, (size_t)cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        s->keys = p;
        s->cap_keys = cap;
    }
    if (n > 0) memcpy(s->keys + s->n_keys, k, (size_t)n * sizeof *k); /* a pair-keyed one-token prompt has none */
    s->n_keys += n;
    return CN_OK;
}

int cn_pc_push_key(cn_pc_session *sess, cn_key key) { return push_keys(sess, &key, 1); }

static int sched_add(cn_pc_session *s, int off, int user) {
    for (int i = 0; i < s->n_sched; i++)
        if (s->sched[i] == off) {
            s->sched_user[i] |= user;
            return CN_OK;
        }
    int *a = realloc(s->sched, (size_t)(s->n_sched + 1) * sizeof *a);
    if (!a) return CN_ENOMEM;
    s->sched = a;
    int *u = realloc(s->sched_user, (size_t)(s->n_sched + 1) * sizeof *u);
    if (!u) return CN_ENOMEM;
    s->sched_user = u;
    int i = s->n_sched++;
    while (i > 0 && s->sched[i - 1] > off) {
        s->sched[i] = s->sched[i - 1];
        s->sched_user[i] = s->sched_user[i - 1];
        i--;
    }
    s->sched[i] = off;
    s->sched_user[i] = user;
    return CN_OK;
}

int cn_pc_schedule(cn_pc_session *sess, int off, int user) {
    if (off <= sess->restored || off > sess->n_keys) return CN_EINVAL;
    return sched_add(sess, off, user);
}

typedef struct lazy_ctx {
    cn_prefix_cache *pc;
    const cn_pc_lane *ln;
    int above;
    int rc;
} lazy_ctx;

static int mat_lazy_above(cn_node *n, void *ctx) {
    lazy_ctx *c = ctx;
    for (int l = 0; l < c->pc->trie.n_layers; l++) {
        cn_snap *s = n->slots[l];
        int ll;
        if (s && s->tier == CN_SNAP_LIVE && s->to > c->above && s->src == lst(c->ln, l, &ll)) {
            c->rc = materialize(c->pc, n, l);
            if (c->rc) return 1;
        }
    }
    return 0;
}

/* Copies every LIVE snapshot of lane ln whose rows reach past `above` out of its buffers. */
static int materialize_lazy_above(cn_prefix_cache *pc, const cn_pc_lane *ln, int above) {
    lazy_ctx c = {pc, ln, above, CN_OK};
    cn_trie_walk(&pc->trie, mat_lazy_above, &c);
    return c.rc;
}

/* Restores the live caches to offset t along path[0..np) (every layer must reach t, which the
 * caller computed), starting from a live prefix of `lc` valid keys. */
static int restore_to(cn_prefix_cache *pc, cn_pc_lane *ln, cn_node **path, int np, int lc, int t) {
    cn_state *s = ln->live;
    int w = lc < t ? lc : t, rc;
    if ((rc = materialize_lazy_above(pc, ln, w))) return rc;
    /* whole states (recurrent, windows) already exactly at t */
    int live_ok = live_reaches(ln, lc, t);
    if (t == 0) return reset_live(ln);
    for (int i = 0; i < np; i++) {
        cn_node *n = path[i];
        int a = cn_node_start(n) > w ? cn_node_start(n) : w, b = n->end < t ? n->end : t;
        for (int l = 0; b > a && l < pc->trie.n_layers; l++) {
            int ll;
            cn_state *st = lst(ln, l, &ll);
            if (pc->kind[l] == CN_LAYER_KV && (rc = cn_snap_kv_restore(n->slots[l], st, ll, a, b)))
                return rc;
        }
        if (!live_ok && n->end == t) {
            /* whole-state layers are the target's only (cn_pc_attach_draft) */
            for (int l = 0; l < pc->trie.n_layers; l++) {
                if (pc->kind[l] == CN_LAYER_RECURRENT) rc = cn_snap_state_restore(n->slots[l], s, l);
                else if (pc->kind[l] == CN_LAYER_WINDOW) rc = cn_snap_window_restore(n->slots[l], s, l);
                if (rc) return rc;
            }
            pc->n_restored_nodes++;
        }
        if (n->end <= t) n->last_used = pc->trie.clock;
    }
    set_level(ln, t);
    ln->live_stale = 0;
    return CN_OK;
}

/* The offset the live caches can be restored to along path[0..np) for a match of `matched` keys,
 * with the live caches holding the first lc keys of the prompt. */
static int restore_target(const cn_prefix_cache *pc, const cn_pc_lane *ln, cn_node **path, int np,
                          int lc, int matched) {
    int off = ln->live->offset;
    /* Attention layers reach as far as live rows plus contiguous snapshots go. */
    int reach = matched;
    for (int l = 0; l < pc->trie.n_layers; l++) {
        if (pc->kind[l] != CN_LAYER_KV) continue;
        int r = lc;
        for (int j = 0; j < np && r < matched; j++) {
            if (path[j]->end <= r) continue;
            if (!path[j]->slots[l]) break;
            r = path[j]->end;
        }
        if (r < reach) reach = r;
    }
    /* Whole-state layers restore only at exact offsets: 0, the live one (or below it while the
     * rings have not wrapped, in a model without recurrent layers), or a node end with state. */
    int t = 0;
    if (pc->n_rec == 0 && pc->n_win == 0) t = reach;
    else {
        int below = lc < reach ? lc : reach;
        if (live_reaches(ln, lc, below)) t = below;
        else if (off <= lc && off <= reach && live_reaches(ln, lc, off)) t = off;
        for (int j = 0; j < np; j++)
            if (path[j]->end <= reach && path[j]->end > t && has_all_states(pc, path[j])) t = path[j]->end;
    }
    return t;
}

/* Pages in the nodes restore_to(t) reads: those holding rows in (min(lc, t), t), and the node
 * ending at t unless the live recurrent state is already there. Returns 0, 1 if some node's
 * file failed (its slots are gone: choose t again) or CN_ENOMEM. */
static int page_in_path(cn_prefix_cache *pc, const cn_pc_lane *ln, cn_node **path, int np, int lc,
                        int t) {
    int w = lc < t ? lc : t, failed = 0;
    int live_ok = live_reaches(ln, lc, t);
    for (int i = 0; pc->disk && i < np; i++) {
        cn_node *n = path[i];
        if (!((n->end > w && cn_node_start(n) < t) || (n->end == t && !live_ok))) continue;
        int r = page_in(pc, n);
        if (r < 0) return r;
        failed |= r;
    }
    return failed;
}

int cn_pc_begin(cn_prefix_cache *pc, cn_pc_session *sess, const cn_key *keys, int n) {
    return cn_pc_begin_on(pc, 0, sess, keys, n);
}

int cn_pc_begin_on(cn_prefix_cache *pc, int lane, cn_pc_session *sess, const cn_key *keys, int n) {
    memset(sess, 0, sizeof *sess);
    if (lane < 0 || lane >= pc->n_lanes) return CN_EINVAL;
    cn_pc_lane *ln = &pc->lanes[lane];
    sess->lane = lane;
    if (n < 1 - pc->lookahead) return CN_EINVAL; /* pairs: a one-token prompt has no key */
    if (n > ln->live->max_ctx) return CN_ECONTEXT;
    sess->n_layers = pc->trie.n_layers;
    int rc = push_keys(sess, keys, n);
    if (rc) return rc;
    sess->n_prompt = n;
    pc->trie.clock++;

    /* The deepest match, leaving at least one token to evaluate: with pair keys the n keys name
     * n + 1 tokens, so every key may match. */
    int matched;
    cn_node *m = cn_trie_match(&pc->trie, keys, pc->lookahead ? n : n - 1, &matched);
    int np = 0;
    for (cn_node *x = m; x != pc->trie.root; x = x->parent) np++;
    cn_node **path = malloc((size_t)(np ? np : 1) * sizeof *path);
    if (!path) return CN_ENOMEM;
    int i = np;
    for (cn_node *x = m; x != pc->trie.root; x = x->parent) path[--i] = x;

    /* How far the live caches already hold this prompt. */
    int off = ln->live->offset, lc = 0;
    while (lc < off && lc < n && ln->live_keys[lc] == keys[lc]) lc++;

    /* The deepest offset every layer reaches; DISK slots count as present until a page-in fails
     * (then their node lost them, and the target is chosen again, shallower). */
    int t = restore_target(pc, ln, path, np, lc, matched);
    while ((rc = page_in_path(pc, ln, path, np, lc, t)) == 1) t = restore_target(pc, ln, path, np, lc, matched);
    if (rc == CN_OK) rc = restore_to(pc, ln, path, np, lc, t);
    /* Eviction steps between this request's forwards leave its path alone (a branch point at
     * close is captured where the match ends). */
    ln->pinned = np ? path[np - 1] : NULL;
    free(path);
    if (rc) {
        cn_log(CN_LOG_WARN, "cache: restore to %d failed (%s); starting from 0", t, cn_strerror(rc));
        materialize_lazy_above(pc, ln, 0);
        reset_live(ln);
        t = 0;
    }
    memcpy(ln->live_keys, keys, (size_t)t * sizeof *keys);
    sess->matched = matched;
    sess->restored = t;
    cn_debug("cache: %s: %d keys, %d matched, restored to %d", t ? "hit" : "miss", n, matched, t);

    /* Restore points this prefill will cross. */
    if (t < matched) rc = sched_add(sess, matched, 0);                 /* the branch point */
    for (int o = (t / pc->o.spacing + 1) * pc->o.spacing; !rc && o < n; o += pc->o.spacing)
        rc = sched_add(sess, o, 1);
    if (!rc && pc->o.pre_end >= 0 && n - pc->o.pre_end > t) rc = sched_add(sess, n - pc->o.pre_end, 1);
    if (rc) cn_pc_session_free(sess);
    return rc;
}

int cn_pc_captures_in(const cn_pc_session *sess, int from, int to, int *out, int max) {
    int k = 0;
    for (int i = 0; i < sess->n_sched && k < max; i++)
        if (sess->sched[i] > from && sess->sched[i] <= to) out[k++] = sess->sched[i];
    return k;
}

int cn_pc_absorbed(cn_prefix_cache *pc, cn_pc_session *sess, int from, int to, cn_rsnap *caps,
                   int n_caps) {
    int rc = CN_OK;
    cn_pc_lane *ln = &pc->lanes[sess->lane];
    /* With pair keys the last token forwarded may still wait for the key its successor makes. */
    int kto = to < sess->n_keys ? to : sess->n_keys;
    if (to > sess->n_keys + pc->lookahead || from != ln->live->offset - (to - from) || to > ln->cap_live_keys)
        rc = CN_EINVAL;
    else if (kto > from)
        memcpy(ln->live_keys + from, sess->keys + from, (size_t)(kto - from) * sizeof(cn_key));
    for (int c = 0; c < n_caps; c++) {
        cn_pc_capture cap = {caps[c].offset, 0, NULL};
        for (int i = 0; i < sess->n_sched; i++)
            if (sess->sched[i] == cap.offset) cap.user = sess->sched_user[i];
        if (!rc) {
            cap.slots = calloc((size_t)(pc->trie.n_layers ? pc->trie.n_layers : 1), sizeof *cap.slots);
            if (!cap.slots) rc = CN_ENOMEM;
        }
        for (int l = 0, j = 0, w = 0; !rc && l < pc->trie.n_layers; l++) {
            if (pc->kind[l] == CN_LAYER_RECURRENT)
                rc = cn_snap_state_from_capture(ln->live, &caps[c], j++, new_tier(pc), &cap.slots[l]);
            else if (pc->kind[l] == CN_LAYER_WINDOW)
                rc = cn_snap_window_from_capture(ln->live, &caps[c], w++, new_tier(pc), &cap.slots[l]);
        }
        if (!rc && sess->n_caps == sess->cap_caps) {
            int cap2 = sess->cap_caps ? 2 * sess->cap_caps : 8;
            cn_pc_capture *p = realloc(sess->caps, (size_t)cap2 * sizeof *p);
            if (!p) rc = CN_ENOMEM;
            else {
                sess->caps = p;
                sess->cap_caps = cap2;
            }
        }
        if (!rc) {
            /* Held by the session until close attaches them; they join the budget then. */
            sess->caps[sess->n_caps++] = cap;
        } else if (cap.slots) {
            for (int l = 0; l < pc->trie.n_layers; l++) cn_snap_free(cap.slots[l]);
            free(cap.slots);
        }
        cn_rsnap_free(ln->live->model, &caps[c]);
    }
    return rc;
}

/* ---- close ------------------------------------------------------------------------------------- */

/* Gives node n, on the live keys' path and ending at or below the live offset, lazy attention
 * rows where it has none: an empty node rebuilt from disk without its parent's file, or a node
 * whose file failed, is filled in by the next request that crosses it instead of blocking every
 * restore below it for good. */
static int heal(cn_prefix_cache *pc, const cn_pc_lane *ln, cn_node *n) {
    int need = 0;
    for (int l = 0; l < pc->trie.n_layers; l++) need |= pc->kind[l] == CN_LAYER_KV && !n->slots[l];
    if (!need) return CN_OK;
    int rc = node_unfile(pc, n);
    for (int l = 0; !rc && l < pc->trie.n_layers; l++) {
        if (pc->kind[l] != CN_LAYER_KV || n->slots[l]) continue;
        int ll;
        cn_state *st = lst(ln, l, &ll);
        cn_snap *s = cn_snap_kv_lazy(st, ll, cn_node_start(n), n->end);
        if (!s) rc = CN_ENOMEM;
        else slot_set(pc, n, l, s);
    }
    return rc;
}

/* The node ending exactly at `target` on the live keys' path, creating or splitting as needed.
 * New edges get lazy attention snapshots (their rows are in the live buffers). */
static cn_node *advance(cn_prefix_cache *pc, const cn_pc_lane *ln, int target) {
    cn_node *cur = pc->trie.root;
    while (cur->end < target) {
        int e = cur->end;
        cn_node *c = NULL;
        for (int i = 0; i < cur->n_child; i++)
            if (cur->child[i]->keys[0] == ln->live_keys[e]) c = cur->child[i];
        if (!c) {
            cn_node *nn = cn_trie_add_child(&pc->trie, cur, ln->live_keys + e, target - e);
            if (!nn) return NULL;
            for (int l = 0; l < pc->trie.n_layers; l++)
                if (pc->kind[l] == CN_LAYER_KV) {
                    int ll;
                    cn_state *st = lst(ln, l, &ll);
                    cn_snap *s = cn_snap_kv_lazy(st, ll, e, target);
                    if (!s) return NULL;
                    slot_set(pc, nn, l, s);
                }
            return nn;
        }
        int k = 0;
        while (k < c->n_keys && e + k < target && c->keys[k] == ln->live_keys[e + k]) k++;
        if (k < c->n_keys) {
            /* The path leaves this edge (or stops) at e + k: split there. */
            cn_node *head = split_node(pc, c, e + k);
            if (!head) return NULL;
            c = head;
        }
        if (heal(pc, ln, c)) return NULL;
        cur = c;
    }
    return cur;
}

/* Merges node into its parent when the parent is an ordinary interior point with this one
 * child: a whole-state entry is released once a later request grows past it. Returns the node
 * that now ends where `node` ended. */
static cn_node *compact(cn_prefix_cache *pc, cn_node *node) {
    cn_node *p = node->parent;
    if (p && p != pc->trie.root && !p->user && p->n_child == 1 && merge_child(pc, p) == CN_OK)
        return p;
    return node;
}

/* The level the live caches can be recorded at: with a draft, the lowest of the target offset,
 * the draft offset and the keys known; everything is moved down to it. Returns 1 when the
 * target's recurrent state is past the level (it cannot be rewound: stale until restored). */
static int level_for_close(cn_pc_lane *ln, cn_pc_session *sess) {
    int o = ln->live->offset;
    if (ln->draft && ln->draft->offset < o) o = ln->draft->offset;
    if (sess->n_keys < o) o = sess->n_keys;
    int stale = !cn_state_can_rewind(ln->live, o); /* a recurrent layer, or a wrapped ring */
    if (o > sess->restored)
        memcpy(ln->live_keys + sess->restored, sess->keys + sess->restored,
               (size_t)(o - sess->restored) * sizeof(cn_key));
    set_level(ln, o);
    return stale;
}

/* Every capture the forwards crossed at or below offset o becomes a node with its recurrent
 * state; those are taken out of the session, the ones above o stay in it. *deepest: the node
 * the last one attached ended as (NULL if none). CN_ENOMEM if a capture had to be dropped. */
static int attach_caps(cn_prefix_cache *pc, cn_pc_session *sess, int o, cn_node **deepest) {
    const cn_pc_lane *ln = &pc->lanes[sess->lane];
    int rc = CN_OK, kept = 0;
    *deepest = NULL;
    for (int c = 0; c < sess->n_caps; c++) {
        cn_pc_capture *cap = &sess->caps[c];
        if (cap->offset > o || cap->offset <= 0) {
            sess->caps[kept++] = *cap;
            continue;
        }
        cn_node *n = advance(pc, ln, cap->offset);
        int adds = n && cap->user && !n->user;
        for (int l = 0; n && l < pc->trie.n_layers; l++) adds |= cap->slots[l] && !n->slots[l];
        if (adds && node_unfile(pc, n)) n = NULL; /* out of memory: the capture is dropped */
        if (n) {
            for (int l = 0; l < pc->trie.n_layers; l++) {
                if (!cap->slots[l]) continue;
                if (!n->slots[l]) {
                    slot_set(pc, n, l, cap->slots[l]);
                    cap->slots[l] = NULL;
                }
            }
            n->user |= cap->user;
            n->last_used = pc->trie.clock;
            *deepest = compact(pc, n);
        } else {
            rc = CN_ENOMEM;
        }
        for (int l = 0; l < pc->trie.n_layers; l++) cn_snap_free(cap->slots[l]);
        free(cap->slots);
    }
    sess->n_caps = kept;
    return rc;
}

int cn_pc_commit(cn_prefix_cache *pc, cn_pc_session *sess) {
    cn_pc_lane *ln = &pc->lanes[sess->lane];
    if (ln->live_stale) return CN_OK; /* a failed forward: close records nothing of it either */
    int o = ln->live->offset;
    if (ln->draft && ln->draft->offset < o) o = ln->draft->offset;
    if (sess->n_keys < o) o = sess->n_keys;
    int any = 0;
    for (int c = 0; c < sess->n_caps; c++) any |= sess->caps[c].offset <= o && sess->caps[c].offset > 0;
    if (!any) return CN_OK;
    /* attaching splits and merges nodes (the pinned one too): the deepest node attached protects
     * the request's path from here on, its ancestors being that path */
    ln->pinned = NULL;
    cn_node *deep;
    int rc = attach_caps(pc, sess, o, &deep);
    ln->pinned = deep;
    persist(pc);
    return rc;
}

int cn_pc_close(cn_prefix_cache *pc, cn_pc_session *sess) {
    cn_pc_lane *ln = &pc->lanes[sess->lane];
    ln->pinned = NULL; /* close splits and merges nodes; the frontier protects from here on */
    int stale = level_for_close(ln, sess) | ln->live_stale;
    int o = ln->live->offset;
    /* 1. every capture the forwards crossed becomes a node with its recurrent state */
    cn_node *deep;
    int rc = attach_caps(pc, sess, o, &deep);
    /* 2. the segment the caches rest at, with its own snapshots */
    cn_node *f = pc->trie.root;
    if (o > 0) {
        f = advance(pc, ln, o);
        int adds = 0;
        for (int l = 0; f && !stale && l < pc->trie.n_layers; l++)
            adds |= whole(pc->kind[l]) && !f->slots[l];
        if (!f || (adds && node_unfile(pc, f))) {
            rc = CN_ENOMEM;
            f = NULL;
        }
        for (int l = 0; f && !stale && l < pc->trie.n_layers; l++) {
            if (!whole(pc->kind[l]) || f->slots[l]) continue;
            cn_snap *s;
            int r = pc->kind[l] == CN_LAYER_RECURRENT ? cn_snap_state_take(ln->live, l, new_tier(pc), &s)
                                                       : cn_snap_window_take(ln->live, l, new_tier(pc), &s);
            if (r) rc = r;
            else slot_set(pc, f, l, s);
        }
    }
    if (f && f != pc->trie.root) f = compact(pc, f);
    if (!f) f = pc->trie.root;
    f->last_used = pc->trie.clock;
    ln->frontier = f;
    ln->live_stale = stale;
    persist(pc); /* with a disk tier: the nodes this request created or changed, cancelled or not */
    cn_pc_evict_step(pc, pc->o.evict_steps); /* the rest between later forwards or when idle */
    cn_pc_session_free(sess);
    return rc;
}

void cn_pc_session_free(cn_pc_session *sess) {
    for (int c = 0; c < sess->n_caps; c++) {
        cn_snap **slots = sess->caps[c].slots;
        /* slots has one entry per layer; unattached captures end with the session */
        for (int l = 0; slots && l < sess->n_layers; l++) cn_snap_free(slots[l]);
        free(slots);
    }
    free(sess->keys);
    free(sess->sched);
    free(sess->sched_user);
    free(sess->caps);
    memset(sess, 0, sizeof *sess);
}

/* ---- eviction ---------------------------------------------------------------------------------- */

/* On some lane's active path: its frontier's ancestors, or its running request's pinned node's. */
static int on_active_path(const cn_prefix_cache *pc, const cn_node *n) {
    for (int i = 0; i < pc->n_lanes; i++) {
        for (const cn_node *x = pc->lanes[i].frontier; x; x = x->parent)
            if (x == n) return 1;
        for (const cn_node *x = pc->lanes[i].pinned; x; x = x->parent)
            if (x == n) return 1;
    }
    return 0;
}

static uint64_t node_bytes(const cn_prefix_cache *pc, const cn_node *n) {
    uint64_t b = 0;
    for (int l = 0; l < pc->trie.n_layers; l++) b += ram_size(n->slots[l]);
    return b;
}

static uint64_t node_dev_bytes(const cn_prefix_cache *pc, const cn_node *n) {
    uint64_t b = 0;
    for (int l = 0; l < pc->trie.n_layers; l++) b += dev_size(n->slots[l]);
    return b;
}

/* What a pick looks for. */
typedef enum pick_kind {
    PICK_DROP_RAM,  /* a node to drop for RAM: any node without a disk tier, else one holding RAM */
    PICK_DROP_DISK, /* a node to drop for disk: one with a file */
    PICK_PAGE_OUT,  /* a node whose RAM can go to disk: any holding RAM, the active path and
                     * branch points included (nothing leaves the trie) */
    PICK_TO_HOST,   /* a node whose device bytes can go to RAM: any holding some (likewise) */
} pick_kind;

typedef struct pick_ctx {
    const cn_prefix_cache *pc;
    pick_kind kind;
    cn_node *best;
} pick_ctx;

/* Oldest first, then deepest, then largest. */
static int better(const cn_prefix_cache *pc, const cn_node *a, const cn_node *b) {
    if (!b) return 1;
    if (a->last_used != b->last_used) return a->last_used < b->last_used;
    if (a->end != b->end) return a->end > b->end;
    return slot_bytes(pc, a) > slot_bytes(pc, b);
}

static int pick(cn_node *n, void *ctx) {
    pick_ctx *c = ctx;
    if (c->kind == PICK_TO_HOST) {
        if (!node_dev_bytes(c->pc, n)) return 0;
    } else if (c->kind == PICK_PAGE_OUT) {
        if (!node_bytes(c->pc, n)) return 0;
    } else {
        if (n->n_child > 1 || on_active_path(c->pc, n)) return 0;
        if (c->kind == PICK_DROP_DISK && !n->disk_id) return 0;
        if (c->kind == PICK_DROP_RAM && c->pc->disk && !node_bytes(c->pc, n)) return 0;
    }
    if (better(c->pc, n, c->best)) c->best = n;
    return 0;
}

static cn_node *pick_in(const cn_prefix_cache *pc, pick_kind kind) {
    pick_ctx c = {pc, kind, NULL};
    cn_trie_walk(&pc->trie, pick, &c);
    return c.best;
}

/* Takes node out of every tier: a leaf is removed (and an empty parent left childless by it,
 * which only a vanished file had kept); an interior node with one child merges into it, its
 * recurrent state going, its rows joining the child's, the merged node written again. */
static int drop_node(cn_prefix_cache *pc, cn_node *n) {
    if (n->n_child == 0) {
        for (;;) {
            cn_node *p = n->parent;
            file_forget(pc, n, 1);
            node_clear(pc, n);
            cn_trie_remove_leaf(&pc->trie, n);
            if (p == pc->trie.root || p->n_child || !is_empty(pc, p) || on_active_path(pc, p)) break;
            n = p;
        }
        return CN_OK;
    }
    int rc = node_unfile(pc, n);
    if (rc) return rc;
    for (int l = 0; l < pc->trie.n_layers; l++)
        if (whole(pc->kind[l])) slot_set(pc, n, l, NULL);
    n->user = 0;
    if ((rc = merge_child(pc, n))) return rc;
    node_write(pc, n); /* a full queue leaves it for the next close */
    return CN_OK;
}

/* One round: pages one node out (its RAM becomes 0 and only a merge's page-in can raise it
 * again) or removes one node. Returns 1 when it did, 0 when both tiers fit or nothing can go.
 * With ram_too 0 only the disk budget counts. The work of a round is bounded by one node: a walk
 * to pick it, a copy of its bytes to the writer or a merge with its child. */
static int evict_round(cn_prefix_cache *pc, int ram_too) {
    /* the device tier first: its bytes go to RAM (copies queued, no wait), and RAM pays for them
     * in later rounds */
    cn_node *d = ram_too && pc->dev_bytes > pc->o.dev_budget ? pick_in(pc, PICK_TO_HOST) : NULL;
    if (d) {
        uint64_t before = node_dev_bytes(pc, d);
        for (int l = 0; l < pc->trie.n_layers; l++) slot_to_host(pc, d, l); /* CN_ENOMEM: stays */
        if (node_dev_bytes(pc, d) < before) {
            pc->n_to_host++;
            return 1;
        }
    }
    int ram = ram_too && pc->ram_bytes > pc->o.ram_budget;
    int disk = pc->disk && pc->disk_bytes > pc->disk_budget;
    cn_node *n = ram && pc->disk ? pick_in(pc, PICK_PAGE_OUT) : NULL;
    if (n && page_out(pc, n) == CN_OK) return 1;
    /* without a disk tier, or with its queue full, a RAM node is dropped as before */
    n = ram ? pick_in(pc, PICK_DROP_RAM) : NULL;
    if (!n && disk) n = pick_in(pc, PICK_DROP_DISK);
    if (!n || drop_node(pc, n)) return 0;
    pc->n_evicted++;
    return 1;
}

static int evict(cn_prefix_cache *pc, int ram_too) {
    uint64_t before = pc->n_evicted;
    while (evict_round(pc, ram_too)) {
    }
    return (int)(pc->n_evicted - before);
}

int cn_pc_evict(cn_prefix_cache *pc) { return evict(pc, 1); }

int cn_pc_evict_step(cn_prefix_cache *pc, int max_nodes) {
    for (int i = 0; i < max_nodes; i++)
        if (!evict_round(pc, 1)) return 0;
    return cn_pc_over_budget(pc);
}

int cn_pc_over_budget(const cn_prefix_cache *pc) {
    return pc->ram_bytes > pc->o.ram_budget || pc->dev_bytes > pc->o.dev_budget ||
           (pc->disk && pc->disk_bytes > pc->disk_budget);
}

/* ---- attaching the disk tier: the trie rebuilt from files --------------------------------------- */

typedef struct found {
    cn_disk_node h;   /* keys and slots owned */
    uint64_t rank;    /* 1 + place in file age order: the node's last_used */
} found;

typedef struct attach_ctx {
    cn_prefix_cache *pc;
    found *f;
    int n, cap;
    int rc;           /* CN_ENOMEM stops the attach */
} attach_ctx;

/* The slot table must be what this model's layers would store for the file's edge. */
static int layout_ok(const cn_prefix_cache *pc, const cn_disk_node *h) {
    if (h->n_layers != pc->trie.n_layers || h->pairs != pc->lookahead) return 0;
    for (int l = 0; l < h->n_layers; l++) {
        const cn_disk_slot *s = &h->slots[l];
        int ll;
        const cn_state *st = shape_st(pc, l, &ll);
        if (!s->kind) continue;
        if (pc->kind[l] == CN_LAYER_KV &&
            (s->kind != CN_SNAP_KV || s->from != h->start || s->to != h->end ||
             s->bytes != 2 * (uint64_t)(h->end - h->start) * cn_snap_kv_row_bytes(st, ll)))
            return 0;
        if (pc->kind[l] == CN_LAYER_RECURRENT &&
            (s->kind != CN_SNAP_STATE || s->from != h->end || s->to != h->end ||
             s->bytes != cn_snap_state_bytes(st, ll)))
            return 0;
        if (pc->kind[l] == CN_LAYER_WINDOW &&
            (s->kind != CN_SNAP_WINDOW || s->from != h->end || s->to != h->end ||
             s->bytes != cn_snap_window_bytes(st, ll, h->end)))
            return 0;
        if (pc->kind[l] == CN_LAYER_NONE) return 0;
    }
    return 1;
}

static void on_file(void *ctx, const char *path, const cn_disk_node *h, int rc, const char *why) {
    attach_ctx *a = ctx;
    cn_prefix_cache *pc = a->pc;
    if (a->rc) return;
    if (!h) {
        /* A newer format belongs to a newer cairn, an unreadable file maybe to a moment's I/O
         * trouble: both are left alone. Anything else is wrong for good. */
        int keep = rc == CN_EUNSUPPORTED || rc == CN_EIO || rc == CN_ENOMEM;
        cn_warn("cache: skipping %s%s", why, keep ? "" : " (moved aside to .bad)");
        if (!keep) cn_disk_set_aside(path);
        pc->n_disk_skipped++;
        return;
    }
    if (!layout_ok(pc, h)) {
        cn_warn("cache: skipping %s: its slots do not fit this model's layers (moved aside to .bad)", path);
        cn_disk_set_aside(path);
        pc->n_disk_skipped++;
        return;
    }
    if (h->end > pc->lanes[0].live->max_ctx) {
        cn_info("cache: leaving %s: %d tokens exceed the context of %d", path, h->end, pc->lanes[0].live->max_ctx);
        return;
    }
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 64;
        found *p = realloc(a->f, (size_t)cap * sizeof *p);
        if (!p) {
            a->rc = CN_ENOMEM;
            return;
        }
        a->f = p;
        a->cap = cap;
    }
    found *f = &a->f[a->n];
    f->h = *h;
    f->h.keys = malloc((size_t)h->end * sizeof *h->keys);
    f->h.slots = malloc((size_t)(h->n_layers ? h->n_layers : 1) * sizeof *h->slots);
    if (!f->h.keys || !f->h.slots) {
        cn_disk_node_free(&f->h);
        a->rc = CN_ENOMEM;
        return;
    }
    memcpy(f->h.keys, h->keys, (size_t)h->end * sizeof *h->keys);
    memcpy(f->h.slots, h->slots, (size_t)h->n_layers * sizeof *h->slots);
    a->n++;
}

static int by_age(const void *x, const void *y) {
    const found *a = x, *b = y;
    if (a->h.mtime != b->h.mtime) return a->h.mtime < b->h.mtime ? -1 : 1;
    return a->h.end > b->h.end ? -1 : a->h.end < b->h.end; /* deeper ones written first */
}

static int by_end(const void *x, const void *y) {
    const found *a = x, *b = y;
    if (a->h.end != b->h.end) return a->h.end < b->h.end ? -1 : 1;
    return a->h.id < b->h.id ? -1 : a->h.id > b->h.id;
}

static cn_node *child_with(const cn_node *n, cn_key first) {
    for (int i = 0; i < n->n_child; i++)
        if (n->child[i]->keys[0] == first) return n->child[i];
    return NULL;
}

/* Inserts one file's node, parents first (files come sorted by end). Returns 0, 1 when the file
 * conflicts with a node already rebuilt (its edge would split a stored node, or a sibling starts
 * with its first key: left from an interrupted rewrite), or CN_ENOMEM. */
static int insert_file(cn_prefix_cache *pc, const found *f) {
    const cn_disk_node *h = &f->h;
    cn_trie *t = &pc->trie;
    cn_node *cur = t->root;
    while (cur->end < h->start) {
        int pos = cur->end;
        cn_node *c = child_with(cur, h->keys[pos]);
        if (!c) {
            /* The parent's file is missing: an empty node spans the gap. */
            c = cn_trie_add_child(t, cur, h->keys + pos, h->start - pos);
            if (!c) return CN_ENOMEM;
            c->last_used = 0;
        } else {
            int k = 0;
            while (k < c->n_keys && pos + k < h->start && c->keys[k] == h->keys[pos + k]) k++;
            if (k < c->n_keys) {
                if (!is_empty(pc, c)) return 1;
                if (!(c = cn_trie_split(t, c, pos + k))) return CN_ENOMEM; /* empty: no rows to cut */
            }
        }
        cur = c;
    }
    if (child_with(cur, h->keys[h->start])) return 1;
    cn_node *n = cn_trie_add_child(t, cur, h->keys + h->start, h->end - h->start);
    if (!n) return CN_ENOMEM;
    for (int l = 0; l < h->n_layers; l++) {
        const cn_disk_slot *s = &h->slots[l];
        if (!s->kind) continue;
        n->slots[l] = cn_snap_disk((cn_snap_kind)s->kind, s->from, s->to, s->bytes); /* layout_ok checked it */
        if (!n->slots[l]) {
            cn_trie_remove_leaf(t, n);
            return CN_ENOMEM;
        }
    }
    n->user = h->user;
    n->disk_id = h->id;
    n->last_used = f->rank;
    pc->disk_bytes += h->payload_bytes;
    return CN_OK;
}

int cn_pc_attach_disk(cn_prefix_cache *pc, const char *dir, uint64_t model_id, uint64_t budget,
                      cn_err *err) {
    if (pc->disk || pc->trie.n_nodes) return cn_err_set(err, CN_EBUSY, "the cache already holds restore points");
    attach_ctx a = {pc, NULL, 0, 0, CN_OK};
    int rc = cn_disk_open(&pc->disk, dir, model_id, 0, err);
    if (rc) {
        pc->disk = NULL;
        return rc;
    }
    pc->disk_budget = budget ? budget : (uint64_t)16 << 30;
    pc->n_disk_loaded = pc->n_disk_skipped = 0;
    rc = cn_disk_scan(cn_disk_dir(pc->disk), model_id, on_file, &a, NULL, err);
    if (!rc && a.rc) rc = cn_err_set(err, a.rc, "out of memory reading %s", cn_disk_dir(pc->disk));
    if (rc) goto fail;
    /* LRU order survives the restart: older files get smaller last_used than newer ones, all
     * smaller than any request of this process. */
    if (a.n) qsort(a.f, (size_t)a.n, sizeof *a.f, by_age);
    for (int i = 0; i < a.n; i++) a.f[i].rank = (uint64_t)i + 1;
    if (a.n) qsort(a.f, (size_t)a.n, sizeof *a.f, by_end);
    for (int i = 0; i < a.n; i++) {
        int r = insert_file(pc, &a.f[i]);
        if (r < 0) {
            rc = cn_err_set(err, r, "out of memory rebuilding the cache from %s", cn_disk_dir(pc->disk));
            goto fail;
        }
        if (r) {
            /* Left by a rewrite a crash interrupted: the other file holds the current shape. */
            cn_warn("cache: skipping %s/%016llx%s: it overlaps a node rebuilt from another file "
                    "(removed)", cn_disk_dir(pc->disk), (unsigned long long)a.f[i].h.id, CN_DISK_EXT);
            cn_disk_remove(pc->disk, a.f[i].h.id);
            pc->n_disk_skipped++;
        } else {
            pc->n_disk_loaded++;
        }
    }
    pc->trie.clock = (uint64_t)a.n;
    for (int i = 0; i < a.n; i++) cn_disk_node_free(&a.f[i].h);
    free(a.f);
    if (pc->n_disk_loaded || pc->n_disk_skipped)
        cn_info("cache: %s: %llu restore points (%llu bytes), %llu files skipped", cn_disk_dir(pc->disk),
                (unsigned long long)pc->n_disk_loaded, (unsigned long long)pc->disk_bytes,
                (unsigned long long)pc->n_disk_skipped);
    cn_pc_evict(pc); /* the budget may be smaller than last time */
    return CN_OK;
fail:
    for (int i = 0; i < a.n; i++) cn_disk_node_free(&a.f[i].h);
    free(a.f);
    /* Back to an empty trie with no tier (nothing of it was used yet). */
    int L = pc->trie.n_layers;
    cn_trie_free(&pc->trie);
    cn_trie_init(&pc->trie, L);
    for (int i = 0; i < pc->n_lanes; i++) pc->lanes[i].frontier = pc->trie.root;
    cn_disk_close(pc->disk);
    pc->disk = NULL;
    pc->disk_bytes = 0;
    return rc;
}

int cn_pc_flush(cn_prefix_cache *pc) { return pc->disk ? cn_disk_flush(pc->disk) : 0; }

/* ---- checks ------------------------------------------------------------------------------------ */

typedef struct sum_ctx {
    const cn_prefix_cache *pc;
    uint64_t bytes, disk, dev;
    int ok;
} sum_ctx;

static int sum_node(cn_node *n, void *ctx) {
    sum_ctx *c = ctx;
    const cn_prefix_cache *pc = c->pc;
    c->bytes += node_bytes(pc, n);
    c->dev += node_dev_bytes(pc, n);
    if (n->disk_id) {
        c->disk += slot_bytes(pc, n);
        if (!pc->disk) c->ok = 0;
    }
    for (int l = 0; l < pc->trie.n_layers; l++) {
        const cn_snap *s = n->slots[l];
        if (!s) continue;
        if (s->tier == CN_SNAP_DISK && (!n->disk_id || s->ram)) c->ok = 0; /* invariant 5 */
        if ((s->tier == CN_SNAP_DEVICE) != (s->dev != NULL) || (s->tier == CN_SNAP_RAM) != (s->ram != NULL))
            c->ok = 0; /* snapshot.h invariant 4 */
        if (pc->kind[l] == CN_LAYER_KV && (s->from != cn_node_start(n) || s->to != n->end)) c->ok = 0;
        if (whole(pc->kind[l]) && (s->from != n->end || s->to != n->end)) c->ok = 0;
        if (pc->kind[l] == CN_LAYER_WINDOW && (s->kind != CN_SNAP_WINDOW || s->tier == CN_SNAP_LIVE)) c->ok = 0;
        if (pc->kind[l] == CN_LAYER_NONE) c->ok = 0;
        if (s->tier == CN_SNAP_LIVE) {
            /* invariant 2: within the live keys of the lane whose state holds the rows */
            const cn_pc_lane *ln = NULL;
            for (int i = 0; i < pc->n_lanes; i++) {
                int ll;
                if (lst(&pc->lanes[i], l, &ll) == s->src) ln = &pc->lanes[i];
            }
            if (!ln || s->to > ln->live->offset) {
                c->ok = 0;
                continue;
            }
            const cn_node *x = n;
            int e = n->end;
            while (x && x->n_keys) {
                for (int k = 0; k < x->n_keys; k++)
                    if (e - x->n_keys + k < ln->live->offset &&
                        x->keys[k] != ln->live_keys[e - x->n_keys + k])
                        c->ok = 0;
                e -= x->n_keys;
                x = x->parent;
            }
        }
    }
    return 0;
}

uint64_t cn_pc_ram_bytes_walk(const cn_prefix_cache *pc) {
    sum_ctx c = {pc, 0, 0, 0, 1};
    cn_trie_walk(&pc->trie, sum_node, &c);
    return c.bytes;
}

uint64_t cn_pc_dev_bytes_walk(const cn_prefix_cache *pc) {
    sum_ctx c = {pc, 0, 0, 0, 1};
    cn_trie_walk(&pc->trie, sum_node, &c);
    return c.dev;
}

uint64_t cn_pc_disk_bytes_walk(const cn_prefix_cache *pc) {
    sum_ctx c = {pc, 0, 0, 0, 1};
    cn_trie_walk(&pc->trie, sum_node, &c);
    return c.disk;
}

int cn_pc_check(const cn_prefix_cache *pc) {
    if (!cn_trie_check(&pc->trie)) return 0;
    sum_ctx c = {pc, 0, 0, 0, 1};
    cn_trie_walk(&pc->trie, sum_node, &c);
    return c.ok && c.bytes == pc->ram_bytes && c.disk == pc->disk_bytes && c.dev == pc->dev_bytes;
}
