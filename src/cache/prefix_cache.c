/* prefix_cache.c - the restore-point policy over the trie and the live caches; see
 * prefix_cache.h for the life cycle and invariants. */
#include "cache/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* ---- helpers: slots and bytes --------------------------------------------------------------- */

static uint64_t ram_size(const cn_snap *s) { return s && s->tier == CN_SNAP_RAM ? s->bytes : 0; }

static void slot_set(cn_prefix_cache *pc, cn_node *n, int l, cn_snap *s) {
    pc->ram_bytes -= ram_size(n->slots[l]);
    cn_snap_free(n->slots[l]);
    n->slots[l] = s;
    pc->ram_bytes += ram_size(s);
}

static void node_clear(cn_prefix_cache *pc, cn_node *n) {
    for (int l = 0; l < pc->trie.n_layers; l++) slot_set(pc, n, l, NULL);
}

static int materialize(cn_prefix_cache *pc, cn_node *n, int l) {
    cn_snap *s = n->slots[l];
    if (!s || s->tier != CN_SNAP_LIVE) return CN_OK;
    int rc = cn_snap_materialize(s, pc->live, l);
    if (!rc) pc->ram_bytes += s->bytes;
    return rc;
}

static int has_all_states(const cn_prefix_cache *pc, const cn_node *n) {
    if (pc->n_rec == 0) return 1;
    for (int l = 0; l < pc->trie.n_layers; l++)
        if (pc->kind[l] == CN_LAYER_RECURRENT &&
            (!n->slots[l] || n->slots[l]->to != n->end || n->slots[l]->tier == CN_SNAP_LIVE))
            return 0;
    return 1;
}

/* ---- init / free ------------------------------------------------------------------------------ */

int cn_pc_init(cn_prefix_cache *pc, cn_state *live, const cn_pc_opts *o) {
    memset(pc, 0, sizeof *pc);
    pc->live = live;
    if (o) pc->o = *o;
    if (pc->o.spacing <= 0) pc->o.spacing = 1024;
    if (!o) pc->o.pre_end = 4;
    if (pc->o.ram_budget == 0) pc->o.ram_budget = (uint64_t)4 << 30;
    int n = live->n_layers;
    pc->kind = calloc((size_t)(n ? n : 1), sizeof *pc->kind);
    pc->cap_live_keys = live->max_ctx;
    pc->live_keys = malloc((size_t)(pc->cap_live_keys ? pc->cap_live_keys : 1) * sizeof *pc->live_keys);
    if (!pc->kind || !pc->live_keys || cn_trie_init(&pc->trie, n)) {
        cn_pc_free(pc);
        return CN_ENOMEM;
    }
    for (int l = 0; l < n; l++) {
        cn_block t = live->layers[l].type;
        pc->kind[l] = t == CN_BLOCK_ATTN ? CN_LAYER_KV : t == CN_BLOCK_MAMBA ? CN_LAYER_RECURRENT : CN_LAYER_NONE;
        pc->n_kv += pc->kind[l] == CN_LAYER_KV;
        pc->n_rec += pc->kind[l] == CN_LAYER_RECURRENT;
    }
    pc->frontier = pc->trie.root;
    return cn_state_reset(live);
}

void cn_pc_free(cn_prefix_cache *pc) {
    if (pc->trie.root) cn_trie_free(&pc->trie);
    free(pc->kind);
    free(pc->live_keys);
    memset(pc, 0, sizeof *pc);
}

int cn_pc_reset(cn_prefix_cache *pc) {
    cn_trie_free(&pc->trie);
    pc->ram_bytes = 0;
    int rc = cn_trie_init(&pc->trie, pc->live->n_layers);
    pc->frontier = pc->trie.root;
    if (!rc) rc = cn_state_reset(pc->live);
    return rc;
}

/* ---- structural edits that keep slots aligned with edges -------------------------------------- */

/* Splits node at `at`: KV slots split with the edge, recurrent slots stay at the end (node). */
static cn_node *split_node(cn_prefix_cache *pc, cn_node *node, int at) {
    int L = pc->trie.n_layers;
    cn_snap **head_kv = calloc((size_t)(L ? L : 1), sizeof *head_kv);
    cn_snap **tail_kv = calloc((size_t)(L ? L : 1), sizeof *tail_kv);
    int ok = head_kv && tail_kv;
    for (int l = 0; ok && l < L; l++) {
        cn_snap *s = node->slots[l];
        if (pc->kind[l] != CN_LAYER_KV || !s) continue;
        ok = cn_snap_kv_split(s, pc->live, l, at, &head_kv[l], &tail_kv[l]) == CN_OK;
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
    cn_snap **kv = calloc((size_t)(L ? L : 1), sizeof *kv);
    if (!kv) return CN_ENOMEM;
    int rc = CN_OK;
    for (int l = 0; !rc && l < L; l++) {
        if (pc->kind[l] != CN_LAYER_KV) continue;
        cn_snap *a = node->slots[l], *b = c->slots[l];
        if (!a || !b) continue; /* a gap: the merged edge has no KV for this layer */
        if (a->tier != b->tier || a->tier != CN_SNAP_LIVE) {
            rc = materialize(pc, node, l);
            if (!rc) rc = materialize(pc, c, l);
        }
        if (!rc) rc = cn_snap_kv_concat(a, b, pc->live, l, &kv[l]);
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
    memcpy(s->keys + s->n_keys, k, (size_t)n * sizeof *k);
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

static int mat_lazy_above(cn_node *n, void *ctx);

typedef struct lazy_ctx {
    cn_prefix_cache *pc;
    int above;
    int rc;
} lazy_ctx;

static int mat_lazy_above(cn_node *n, void *ctx) {
    lazy_ctx *c = ctx;
    for (int l = 0; l < c->pc->trie.n_layers; l++) {
        cn_snap *s = n->slots[l];
        if (s && s->tier == CN_SNAP_LIVE && s->to > c->above) {
            c->rc = materialize(c->pc, n, l);
            if (c->rc) return 1;
        }
    }
    return 0;
}

/* Copies every LIVE snapshot whose rows reach past `above` out of the live buffers. */
static int materialize_lazy_above(cn_prefix_cache *pc, int above) {
    lazy_ctx c = {pc, above, CN_OK};
    cn_trie_walk(&pc->trie, mat_lazy_above, &c);
    return c.rc;
}

/* Restores the live caches to offset t along path[0..np) (every layer must reach t, which the
 * caller computed), starting from a live prefix of `lc` valid keys. */
static int restore_to(cn_prefix_cache *pc, cn_node **path, int np, int lc, int t) {
    cn_state *s = pc->live;
    int w = lc < t ? lc : t, rc;
    if ((rc = materialize_lazy_above(pc, w))) return rc;
    int live_ok = s->offset == t && lc >= t; /* recurrent state already exactly at t */
    if (t == 0) return cn_state_reset(s);
    for (int i = 0; i < np; i++) {
        cn_node *n = path[i];
        int a = cn_node_start(n) > w ? cn_node_start(n) : w, b = n->end < t ? n->end : t;
        if (b > a)
            for (int l = 0; l < pc->trie.n_layers; l++)
                if (pc->kind[l] == CN_LAYER_KV && (rc = cn_snap_kv_restore(n->slots[l], s, l, a, b)))
                    return rc;
        if (!live_ok && n->end == t) {
            for (int l = 0; l < pc->trie.n_layers; l++)
                if (pc->kind[l] == CN_LAYER_RECURRENT && (rc = cn_snap_state_restore(n->slots[l], s, l)))
                    return rc;
            pc->n_restored_nodes++;
        }
        if (n->end <= t) n->last_used = pc->trie.clock;
    }
    s->offset = t;
    return CN_OK;
}

int cn_pc_begin(cn_prefix_cache *pc, cn_pc_session *sess, const cn_key *keys, int n) {
    memset(sess, 0, sizeof *sess);
    if (n <= 0 || n > pc->live->max_ctx) return n <= 0 ? CN_EINVAL : CN_ECONTEXT;
    sess->n_layers = pc->trie.n_layers;
    int rc = push_keys(sess, keys, n);
    if (rc) return rc;
    sess->n_prompt = n;
    pc->trie.clock++;

    /* The deepest match, leaving at least one key to evaluate. */
    int matched;
    cn_node *m = cn_trie_match(&pc->trie, keys, n - 1, &matched);
    int np = 0;
    for (cn_node *x = m; x != pc->trie.root; x = x->parent) np++;
    cn_node **path = malloc((size_t)(np ? np : 1) * sizeof *path);
    if (!path) return CN_ENOMEM;
    int i = np;
    for (cn_node *x = m; x != pc->trie.root; x = x->parent) path[--i] = x;

    /* How far the live caches already hold this prompt. */
    int off = pc->live->offset, lc = 0;
    while (lc < off && lc < n && pc->live_keys[lc] == keys[lc]) lc++;

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
    /* Recurrent layers restore only at exact offsets: 0, the live one, or a node end with state. */
    int t = 0;
    if (pc->n_rec == 0) t = reach;
    else {
        if (off <= lc && off <= reach) t = off;
        for (int j = 0; j < np; j++)
            if (path[j]->end <= reach && path[j]->end > t && has_all_states(pc, path[j])) t = path[j]->end;
    }
    rc = restore_to(pc, path, np, lc, t);
    free(path);
    if (rc) {
        cn_log(CN_LOG_WARN, "cache: restore to %d failed (%s); starting from 0", t, cn_strerror(rc));
        materialize_lazy_above(pc, 0);
        cn_state_reset(pc->live);
        t = 0;
    }
    memcpy(pc->live_keys, keys, (size_t)t * sizeof *keys);
    sess->matched = matched;
    sess->restored = t;

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
    if (to > sess->n_keys || from != pc->live->offset - (to - from) || to > pc->cap_live_keys)
        rc = CN_EINVAL;
    else
        memcpy(pc->live_keys + from, sess->keys + from, (size_t)(to - from) * sizeof(cn_key));
    for (int c = 0; c < n_caps; c++) {
        cn_pc_capture cap = {caps[c].offset, 0, NULL};
        for (int i = 0; i < sess->n_sched; i++)
            if (sess->sched[i] == cap.offset) cap.user = sess->sched_user[i];
        if (!rc) {
            cap.slots = calloc((size_t)(pc->trie.n_layers ? pc->trie.n_layers : 1), sizeof *cap.slots);
            if (!cap.slots) rc = CN_ENOMEM;
        }
        for (int l = 0, j = 0; !rc && l < pc->trie.n_layers; l++)
            if (pc->kind[l] == CN_LAYER_RECURRENT)
                rc = cn_snap_state_from_capture(pc->live, &caps[c], j++, &cap.slots[l]);
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
        cn_rsnap_free(pc->live->model, &caps[c]);
    }
    return rc;
}

/* ---- close ------------------------------------------------------------------------------------- */

/* The node ending exactly at `target` on the live keys' path, creating or splitting as needed.
 * New edges get lazy attention snapshots (their rows are in the live buffers). */
static cn_node *advance(cn_prefix_cache *pc, int target) {
    cn_node *cur = pc->trie.root;
    while (cur->end < target) {
        int e = cur->end;
        cn_node *c = NULL;
        for (int i = 0; i < cur->n_child; i++)
            if (cur->child[i]->keys[0] == pc->live_keys[e]) c = cur->child[i];
        if (!c) {
            cn_node *nn = cn_trie_add_child(&pc->trie, cur, pc->live_keys + e, target - e);
            if (!nn) return NULL;
            for (int l = 0; l < pc->trie.n_layers; l++)
                if (pc->kind[l] == CN_LAYER_KV) {
                    cn_snap *s = cn_snap_kv_lazy(pc->live, l, e, target);
                    if (!s) return NULL;
                    slot_set(pc, nn, l, s);
                }
            return nn;
        }
        int k = 0;
        while (k < c->n_keys && e + k < target && c->keys[k] == pc->live_keys[e + k]) k++;
        if (k < c->n_keys) {
            /* The path leaves this edge (or stops) at e + k: split there. */
            cn_node *head = split_node(pc, c, e + k);
            if (!head) return NULL;
            c = head;
        }
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

int cn_pc_close(cn_prefix_cache *pc, cn_pc_session *sess) {
    int o = pc->live->offset, rc = CN_OK;
    /* 1. every capture the forwards crossed becomes a node with its recurrent state */
    for (int c = 0; c < sess->n_caps; c++) {
        cn_pc_capture *cap = &sess->caps[c];
        cn_node *n = cap->offset <= o && cap->offset > 0 ? advance(pc, cap->offset) : NULL;
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
            compact(pc, n);
        } else if (cap->offset <= o && cap->offset > 0) {
            rc = CN_ENOMEM;
        }
    }
    /* 2. the segment the caches rest at, with its own snapshots */
    cn_node *f = pc->trie.root;
    if (o > 0) {
        f = advance(pc, o);
        if (!f) rc = CN_ENOMEM;
        for (int l = 0; f && l < pc->trie.n_layers; l++) {
            if (pc->kind[l] != CN_LAYER_RECURRENT || f->slots[l]) continue;
            cn_snap *s;
            int r = cn_snap_state_take(pc->live, l, &s);
            if (r) rc = r;
            else slot_set(pc, f, l, s);
        }
    }
    if (f && f != pc->trie.root) f = compact(pc, f);
    if (!f) f = pc->trie.root;
    f->last_used = pc->trie.clock;
    pc->frontier = f;
    cn_pc_evict(pc);
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

static int on_active_path(const cn_prefix_cache *pc, const cn_node *n) {
    for (const cn_node *x = pc->frontier; x; x = x->parent)
        if (x == n) return 1;
    return 0;
}

static uint64_t node_bytes(const cn_prefix_cache *pc, const cn_node *n) {
    uint64_t b = 0;
    for (int l = 0; l < pc->trie.n_layers; l++) b += ram_size(n->slots[l]);
    return b;
}

typedef struct pick_ctx {
    const cn_prefix_cache *pc;
    cn_node *best;
} pick_ctx;

/* Oldest first, then deepest, then largest. */
static int better(const cn_prefix_cache *pc, const cn_node *a, const cn_node *b) {
    if (!b) return 1;
    if (a->last_used != b->last_used) return a->last_used < b->last_used;
    if (a->end != b->end) return a->end > b->end;
    return node_bytes(pc, a) > node_bytes(pc, b);
}

static int pick(cn_node *n, void *ctx) {
    pick_ctx *c = ctx;
    if (n->n_child > 1 || on_active_path(c->pc, n)) return 0;
    if (better(c->pc, n, c->best)) c->best = n;
    return 0;
}

int cn_pc_evict(cn_prefix_cache *pc) {
    int evicted = 0;
    while (pc->ram_bytes > pc->o.ram_budget) {
        pick_ctx c = {pc, NULL};
        cn_trie_walk(&pc->trie, pick, &c);
        if (!c.best) break;
        cn_node *n = c.best;
        if (n->n_child == 0) {
            node_clear(pc, n);
            cn_trie_remove_leaf(&pc->trie, n);
        } else {
            /* An interior node with one child: its recurrent state goes, its rows join the child. */
            for (int l = 0; l < pc->trie.n_layers; l++)
                if (pc->kind[l] == CN_LAYER_RECURRENT) slot_set(pc, n, l, NULL);
            n->user = 0;
            if (merge_child(pc, n)) break;
        }
        evicted++;
        pc->n_evicted++;
    }
    return evicted;
}

/* ---- checks ------------------------------------------------------------------------------------ */

typedef struct sum_ctx {
    const cn_prefix_cache *pc;
    uint64_t bytes;
    int ok;
} sum_ctx;

static int sum_node(cn_node *n, void *ctx) {
    sum_ctx *c = ctx;
    const cn_prefix_cache *pc = c->pc;
    c->bytes += node_bytes(pc, n);
    for (int l = 0; l < pc->trie.n_layers; l++) {
        const cn_snap *s = n->slots[l];
        if (!s) continue;
        if (pc->kind[l] == CN_LAYER_KV && (s->from != cn_node_start(n) || s->to != n->end)) c->ok = 0;
        if (pc->kind[l] == CN_LAYER_RECURRENT && (s->from != n->end || s->to != n->end)) c->ok = 0;
        if (pc->kind[l] == CN_LAYER_NONE) c->ok = 0;
        if (s->tier == CN_SNAP_LIVE) {
            /* invariant 2: within the live keys */
            if (s->to > pc->live->offset) c->ok = 0;
            const cn_node *x = n;
            int e = n->end;
            while (x && x->n_keys) {
                for (int k = 0; k < x->n_keys; k++)
                    if (e - x->n_keys + k < pc->live->offset &&
                        x->keys[k] != pc->live_keys[e - x->n_keys + k])
                        c->ok = 0;
                e -= x->n_keys;
                x = x->parent;
            }
        }
    }
    return 0;
}

uint64_t cn_pc_ram_bytes_walk(const cn_prefix_cache *pc) {
    sum_ctx c = {pc, 0, 1};
    cn_trie_walk(&pc->trie, sum_node, &c);
    return c.bytes;
}

int cn_pc_check(const cn_prefix_cache *pc) {
    if (!cn_trie_check(&pc->trie)) return 0;
    sum_ctx c = {pc, 0, 1};
    cn_trie_walk(&pc->trie, sum_node, &c);
    return c.ok && c.bytes == pc->ram_bytes;
}
