/* tok_bpe.c - the BPE model: one pre-token (word) to ids, by merge rank.
 *
 * Written by hand because BPE merging is the model itself and must follow Hugging Face's
 * `Word::merge_all` exactly (src/models/bpe/word.rs): every adjacent pair with a merge goes into a
 * priority queue ordered by (rank, position); the lowest is applied if still current, and the new
 * pairs it forms with its neighbours are queued. A merge-rank hash on (left id, right id) makes
 * each step O(log n), never a quadratic rescan. The initial symbols follow `merge_word`: one per
 * character (with continuing_subword_prefix / end_of_word_suffix), byte_fallback to <0xNN>
 * tokens, unknown characters to unk_token (fused when fuse_unk) or dropped when there is none.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tok_impl.h"

typedef struct tok_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t len;        /* bytes covered; 0 once merged into its left neighbour */
} tok_sym;

typedef struct tok_merge {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
} tok_merge;

int32_t tok_vocab_get(const cn_tokenizer *t, const char *s, size_t n) {
    size_t i = (size_t)tok_hash(s, n) & t->vmask;
    for (;;) {
        uint32_t v = t->vslot[i];
        if (!v) return -1;
        int32_t id = (int32_t)v - 1;
        if (t->len[id] == n && !memcmp(t->str[id], s, n)) return id;
        i = (i + 1) & t->vmask;
    }
}

static size_t merge_slot(const tok_bpe *b, uint64_t key) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 17) & b->mmask;
    while (b->mkey[i] && b->mkey[i] != key) i = (i + 1) & b->mmask;
    return i;
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t)((uint32_t)a + 1) << 32 | (uint32_t)(b + 1);
}

/* Looks a pair up: 1 and (rank, new id) if it merges. */
static int merge_get(const tok_bpe *b, int32_t l, int32_t r, uint32_t *rank, int32_t *new_id) {
    size_t i = merge_slot(b, pair_key(l, r));
    if (!b->mkey[i]) return 0;
    *rank = b->mrank[i];
    *new_id = b->mnew[i];
    return 1;
}

int tok_bpe_add_merge(cn_tokenizer *t, const char *a, size_t la, const char *b, size_t lb,
                      uint32_t rank, cn_err *err) {
    tok_bpe *m = &t->bpe;
    int32_t ia = tok_vocab_get(t, a, la), ib = tok_vocab_get(t, b, lb);
    if (ia < 0 || ib < 0)
        return cn_err_set(err, CN_EFORMAT, "merge %u: token '%.*s' is not in the vocabulary", rank,
                          (int)(ia < 0 ? la : lb), ia < 0 ? a : b);
    /* The merged token drops the right side's continuing_subword_prefix (model.rs, build). */
    size_t skip = m->prefix_len <= lb ? m->prefix_len : 0;
    char stack[256], *buf = la + lb <= sizeof stack ? stack : malloc(la + lb);
    if (!buf) return cn_err_set(err, CN_ENOMEM, "out of memory");
    memcpy(buf, a, la);
    memcpy(buf + la, b + skip, lb - skip);
    int32_t inew = tok_vocab_get(t, buf, la + lb - skip);
    if (inew < 0) {
        int rc = cn_err_set(err, CN_EFORMAT, "merge %u: merged token '%.*s' is not in the vocabulary", rank,
                            (int)(la + lb - skip), buf);
        if (buf != stack) free(buf);
        return rc;
    }
    if (buf != stack) free(buf);
    /* A pair listed twice keeps its last rank, as a Rust HashMap collected from the list does. */
    size_t i = merge_slot(m, pair_key(ia, ib));
    m->mkey[i] = pair_key(ia, ib);
    m->mrank[i] = rank;
    m->mnew[i] = inew;
    return CN_OK;
}

/* ---- the queue: a binary min-heap on (rank, pos) ------------------------------------------- */

static int merge_less(const tok_merge *a, const tok_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tok_merge *h, size_t *n, tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static tok_merge heap_pop(tok_merge *h, size_t *n) {
    tok_merge top = h[0], last = h[--*n];
    size_t i = 0, sz = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= sz) break;
        if (c + 1 < sz && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (sz) h[i] = last;
    return top;
}

/* ---- one word -------------------------------------------------------------------------------- */

static int sym_push(tok_bpe_scratch *sc, size_t *n, int32_t id, int32_t len) {
    if (*n == sc->sym_cap) {
        size_t cap = sc->sym_cap ? sc->sym_cap * 2 : 64;
        tok_sym *p = realloc(sc->sym, cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        sc->sym = p;
        sc->sym_cap = cap;
    }
    int32_t i = (int32_t)*n;
    sc->sym[*n] = (tok_sym){id, i - 1, i + 1, len};
    (*n)++;
    return CN_OK;
}

int tok_bpe_word(const cn_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *sc, tok_ids *out,
                 cn_err *err) {
    const tok_bpe *m = &t->bpe;
    if (n == 0) return CN_OK;
    if (m->ignore_merges) {
        int32_t id = tok_vocab_get(t, w, n);
        if (id >= 0) return tok_ids_push(out, id) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
    }
    size_t ns = 0;
    int32_t unk_len = 0; /* pending unk run, bytes; 0 = none */
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_clen((unsigned char)w[i]);
        if (i + k > n) k = n - i;
        const char *s = w + i;
        size_t sl = k;
        int32_t id;
        if ((i > 0 && m->prefix) || (i + k == n && m->suffix)) {
            sc->tmp.n = 0;
            if ((i > 0 && m->prefix && tok_buf_put(&sc->tmp, m->prefix, m->prefix_len)) ||
                tok_buf_put(&sc->tmp, s, k) ||
                (i + k == n && m->suffix && tok_buf_put(&sc->tmp, m->suffix, m->suffix_len)))
                goto oom;
            s = sc->tmp.p;
            sl = sc->tmp.n;
        }
        id = tok_vocab_get(t, s, sl);
        if (id >= 0) {
            if (unk_len) {
                if (sym_push(sc, &ns, m->unk_id, unk_len)) goto oom;
                unk_len = 0;
            }
            if (sym_push(sc, &ns, id, (int32_t)k)) goto oom;
        } else {
            int done = 0;
            if (m->byte_fallback) {
                size_t b = 0;
                while (b < sl && m->byte_tok[(unsigned char)s[b]] >= 0) b++;
                if (b == sl) {
                    /* HF adds the bytes before flushing a pending unk (merge_word); kept as is. */
                    for (b = 0; b < sl; b++)
                        if (sym_push(sc, &ns, m->byte_tok[(unsigned char)s[b]], 1)) goto oom;
                    done = 1;
                }
            }
            if (!done && m->unk_token) {
                if (m->unk_id < 0)
                    return cn_err_set(err, CN_EFORMAT, "unk_token '%s' is not in the vocabulary", m->unk_token);
                if (unk_len && !m->fuse_unk) {
                    if (sym_push(sc, &ns, m->unk_id, unk_len)) goto oom;
                    unk_len = 0;
                }
                unk_len += (int32_t)k;
            }
        }
        i += k;
    }
    if (unk_len && sym_push(sc, &ns, m->unk_id, unk_len)) goto oom;
    if (ns == 0) return CN_OK;
    sc->sym[ns - 1].next = -1;

    if (ns > 1) {
        if (sc->heap_cap < ns * 2) { /* each merge queues at most 2 pairs; live size stays < 2n */
            free(sc->heap);
            sc->heap_cap = ns * 2;
            if (!(sc->heap = malloc(sc->heap_cap * sizeof *sc->heap))) {
                sc->heap_cap = 0;
                goto oom;
            }
        }
        tok_sym *sy = sc->sym;
        tok_merge *h = sc->heap;
        size_t hn = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            uint32_t r;
            int32_t nid;
            if (merge_get(m, sy[i].id, sy[i + 1].id, &r, &nid))
                heap_push(h, &hn, (tok_merge){r, (int32_t)i, nid});
        }
        while (hn) {
            tok_merge top = heap_pop(h, &hn);
            tok_sym *cur = &sy[top.pos];
            if (cur->len == 0 || cur->next < 0) continue;
            int32_t np = cur->next;
            uint32_t r;
            int32_t nid;
            /* stale entry: the pair at pos changed since it was queued */
            if (!merge_get(m, cur->id, sy[np].id, &r, &nid) || nid != top.new_id) continue;
            cur->id = top.new_id;
            cur->len += sy[np].len;
            cur->next = sy[np].next;
            sy[np].len = 0;
            if (cur->next >= 0) sy[cur->next].prev = top.pos;
            if (cur->prev >= 0 && merge_get(m, sy[cur->prev].id, cur->id, &r, &nid))
                heap_push(h, &hn, (tok_merge){r, cur->prev, nid});
            if (cur->next >= 0 && merge_get(m, cur->id, sy[cur->next].id, &r, &nid))
                heap_push(h, &hn, (tok_merge){r, top.pos, nid});
        }
    }
    for (int32_t i = 0; i >= 0; i = sc->sym[i].next)
        if (tok_ids_push(out, sc->sym[i].id)) goto oom;
    return CN_OK;
oom:
    return cn_err_set(err, CN_ENOMEM, "out of memory");
}

void tok_bpe_scratch_free(tok_bpe_scratch *sc) {
    free(sc->sym);
    free(sc->heap);
    tok_buf_free(&sc->tmp);
    memset(sc, 0, sizeof *sc);
}
