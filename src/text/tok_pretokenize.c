/* tok_pretokenize.c - pre-tokenizers (ByteLevel, Split, Digits, Metaspace, Whitespace,
 * WhitespaceSplit, flattened Sequences) and the hand-off of every piece to the BPE model.
 *
 * Written here because it is Hugging Face's pipeline, not a library's: each pre-tokenizer splits
 * every piece the previous one produced (src/pre_tokenizers/), empty pieces vanish, and Metaspace's
 * prepend_scheme "first" only fires on the piece that starts the text. Pieces are walked depth
 * first (level k splits one piece, level k+1 runs on each of its parts) so that memory stays
 * bounded by one piece per level instead of the whole text per level; the result is the same as
 * HF's breadth-first pass because every pre-tokenizer acts on each piece independently.
 *
 * A per-call word cache maps a final piece to its ids: real text repeats words, and BPE on a
 * word is the costly step. It lives in tok_scratch, so it is never shared between calls.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tok_impl.h"

#define CACHE_MAX_WORD 64     /* longer pieces are not cached */
#define CACHE_MAX_ENTRIES (1u << 16)

typedef struct level {
    tok_buf src;   /* the piece after this level's character transform (prefix, replacement) */
    tok_buf out;   /* the pieces this level produced, back to back */
    tok_spans sp;  /* [start, end) of each piece in out */
} level;

typedef struct cache_ent {
    uint64_t h;
    uint32_t key_off, key_len; /* in keys */
    uint32_t ids_off, ids_n;   /* in ids */
} cache_ent;

struct tok_scratch {
    tok_rx_scratch rx;
    tok_bpe_scratch bpe;
    level *lv;
    int n_lv;
    tok_spans find;
    cache_ent *ce;
    size_t cmask, cn;
    tok_buf keys;
    tok_ids ids;
};

tok_scratch *tok_scratch_new(const cn_tokenizer *t) {
    tok_scratch *sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->n_lv = t->n_pretok;
    if (sc->n_lv && !(sc->lv = calloc((size_t)sc->n_lv, sizeof *sc->lv))) {
        free(sc);
        return NULL;
    }
    return sc;
}

void tok_scratch_free(tok_scratch *sc) {
    if (!sc) return;
    tok_rx_scratch_free(&sc->rx);
    tok_bpe_scratch_free(&sc->bpe);
    for (int i = 0; i < sc->n_lv; i++) {
        tok_buf_free(&sc->lv[i].src);
        tok_buf_free(&sc->lv[i].out);
        free(sc->lv[i].sp.p);
    }
    free(sc->lv);
    free(sc->find.p);
    free(sc->ce);
    tok_buf_free(&sc->keys);
    free(sc->ids.p);
    free(sc);
}

tok_rx_scratch *tok_scratch_rx(tok_scratch *sc) { return &sc->rx; }

/* ---- BPE with the word cache ---------------------------------------------------------------- */

static int cache_grow(tok_scratch *sc) {
    size_t cap = sc->cmask ? (sc->cmask + 1) * 2 : 1024;
    cache_ent *ne = calloc(cap, sizeof *ne);
    if (!ne) return CN_ENOMEM;
    for (size_t i = 0; sc->ce && i <= sc->cmask; i++) {
        if (!sc->ce[i].key_len) continue;
        size_t j = (size_t)sc->ce[i].h & (cap - 1);
        while (ne[j].key_len) j = (j + 1) & (cap - 1);
        ne[j] = sc->ce[i];
    }
    free(sc->ce);
    sc->ce = ne;
    sc->cmask = cap - 1;
    return CN_OK;
}

static int encode_word(const cn_tokenizer *t, const char *w, size_t n, tok_scratch *sc, tok_ids *out,
                       cn_err *err) {
    if (n == 0) return CN_OK;
    if (n > CACHE_MAX_WORD) return tok_bpe_word(t, w, n, &sc->bpe, out, err);
    uint64_t h = tok_hash(w, n);
    if (sc->ce) {
        for (size_t j = (size_t)h & sc->cmask; sc->ce[j].key_len; j = (j + 1) & sc->cmask) {
            cache_ent *e = &sc->ce[j];
            if (e->h == h && e->key_len == n && !memcmp(sc->keys.p + e->key_off, w, n))
                return tok_ids_put(out, sc->ids.p + e->ids_off, e->ids_n)
                           ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
        }
    }
    size_t before = out->n;
    int rc = tok_bpe_word(t, w, n, &sc->bpe, out, err);
    if (rc || sc->cn >= CACHE_MAX_ENTRIES) return rc;
    if ((sc->cn + 1) * 2 > (sc->ce ? sc->cmask + 1 : 0) && cache_grow(sc)) return CN_OK; /* cache is optional */
    size_t key_off = sc->keys.n, ids_off = sc->ids.n;
    if (tok_buf_put(&sc->keys, w, n) || tok_ids_put(&sc->ids, out->p + before, out->n - before)) return CN_OK;
    size_t j = (size_t)h & sc->cmask;
    while (sc->ce[j].key_len) j = (j + 1) & sc->cmask;
    sc->ce[j] = (cache_ent){h, (uint32_t)key_off, (uint32_t)n, (uint32_t)ids_off, (uint32_t)(out->n - before)};
    sc->cn++;
    return CN_OK;
}

/* ---- the levels ------------------------------------------------------------------------------ */

static int starts_with(const char *s, size_t n, const char *p, size_t pn) {
    return n >= pn && !memcmp(s, p, pn);
}

/* Splits s by pattern and behaviour into lv->out / lv->sp (empty pieces dropped). */
static int split_into(const tok_pattern *pat, tok_behavior beh, int invert, const char *s, size_t n,
                      tok_scratch *sc, level *lv, cn_err *err) {
    int rc = tok_pattern_find(pat, s, n, &sc->rx, &sc->find, err);
    if (rc) return rc;
    tok_apply_behavior(&sc->find, beh, invert);
    lv->out.n = 0;
    lv->sp.n = 0;
    for (size_t i = 0; i < sc->find.n; i++) {
        tok_span x = sc->find.p[i];
        if (x.end == x.start) continue;
        if (lv->sp.n == lv->sp.cap) {
            size_t cap = lv->sp.cap ? lv->sp.cap * 2 : 16;
            tok_span *p = realloc(lv->sp.p, cap * sizeof *p);
            if (!p) return cn_err_set(err, CN_ENOMEM, "out of memory");
            lv->sp.p = p;
            lv->sp.cap = cap;
        }
        /* pieces keep their offsets in s: out holds a copy of s, so [start, end) stay valid */
        lv->sp.p[lv->sp.n++] = (tok_span){x.start, x.end, 0};
    }
    if (tok_buf_put(&lv->out, s, n)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    return CN_OK;
}

static int one_piece(const char *s, size_t n, level *lv, cn_err *err) {
    lv->out.n = 0;
    lv->sp.n = 0;
    if (tok_buf_put(&lv->out, s, n)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    if (n == 0) return CN_OK;
    if (!lv->sp.cap) {
        if (!(lv->sp.p = malloc(16 * sizeof *lv->sp.p))) return cn_err_set(err, CN_ENOMEM, "out of memory");
        lv->sp.cap = 16;
    }
    lv->sp.p[0] = (tok_span){0, n, 0};
    lv->sp.n = 1;
    return CN_OK;
}

static int run_level(const cn_tokenizer *t, int k, const char *s, size_t n, int orig0, tok_scratch *sc,
                     tok_ids *out, cn_err *err);

/* Sends every piece of level k on to level k + 1 (or to BPE after the last level). ByteLevel
 * maps each piece's bytes to its alphabet on the way. */
static int forward(const cn_tokenizer *t, int k, int orig0, int byte_map, tok_scratch *sc, tok_ids *out,
                   cn_err *err) {
    level *lv = &sc->lv[k];
    for (size_t i = 0; i < lv->sp.n; i++) {
        tok_span x = lv->sp.p[i];
        const char *p = lv->out.p + x.start;
        size_t pn = x.end - x.start;
        int po = orig0 && x.start == 0;
        int rc;
        if (byte_map) {
            tok_buf *m = &lv->src; /* free again: src was consumed by the split */
            m->n = 0;
            if (tok_buf_reserve(m, pn * 2 + 1)) return cn_err_set(err, CN_ENOMEM, "out of memory");
            for (size_t j = 0; j < pn; j++) {
                unsigned char b = (unsigned char)p[j];
                memcpy(m->p + m->n, t->bl_str[b], t->bl_len[b]);
                m->n += t->bl_len[b];
            }
            /* the next level may reuse nothing of this one, so handing m on is safe */
            rc = k + 1 < t->n_pretok ? run_level(t, k + 1, m->p, m->n, po, sc, out, err)
                                     : encode_word(t, m->p, m->n, sc, out, err);
        } else {
            rc = k + 1 < t->n_pretok ? run_level(t, k + 1, p, pn, po, sc, out, err)
                                     : encode_word(t, p, pn, sc, out, err);
        }
        if (rc) return rc;
    }
    return CN_OK;
}

static int run_level(const cn_tokenizer *t, int k, const char *s, size_t n, int orig0, tok_scratch *sc,
                     tok_ids *out, cn_err *err) {
    const tok_pretok *pt = &t->pretok[k];
    level *lv = &sc->lv[k];
    int rc = CN_OK, byte_map = 0;
    switch (pt->kind) {
    case TOK_PT_SPLIT:
        rc = split_into(&pt->pat, pt->behavior, pt->invert, s, n, sc, lv, err);
        break;
    case TOK_PT_DIGITS: {
        tok_pattern num = {.kind = TOK_PAT_NUMERIC};
        rc = split_into(&num, pt->individual ? TOK_ISOLATED : TOK_CONTIGUOUS, 0, s, n, sc, lv, err);
        break;
    }
    case TOK_PT_WHITESPACE:
        rc = split_into(&pt->pat, TOK_REMOVED, 1, s, n, sc, lv, err);
        break;
    case TOK_PT_WHITESPACE_SPLIT: {
        tok_pattern sp = {.kind = TOK_PAT_SPACE};
        rc = split_into(&sp, TOK_REMOVED, 0, s, n, sc, lv, err);
        break;
    }
    case TOK_PT_METASPACE: {
        tok_buf *m = &lv->src;
        m->n = 0;
        for (size_t i = 0; i < n && rc == CN_OK; i++)
            rc = s[i] == ' ' ? tok_buf_put(m, pt->repl, pt->repl_len) : tok_buf_putc(m, s[i]);
        if (rc == CN_OK && !m->p) rc = tok_buf_put(m, "", 0);
        if (rc) return cn_err_set(err, CN_ENOMEM, "out of memory");
        /* HF prepends to any non-empty piece (NormalizedString::prepend is a no-op on "") */
        int pre = m->n && !starts_with(m->p, m->n, pt->repl, pt->repl_len) &&
                  (pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && orig0));
        if (pre) {
            tok_buf tmp = {0};
            if (tok_buf_put(&tmp, pt->repl, pt->repl_len) || tok_buf_put(&tmp, m->p, m->n)) {
                tok_buf_free(&tmp);
                return cn_err_set(err, CN_ENOMEM, "out of memory");
            }
            tok_buf_free(m);
            *m = tmp;
        }
        if (pt->split) {
            tok_pattern ch = {.kind = TOK_PAT_CHAR, .cp = pt->repl_cp};
            rc = split_into(&ch, TOK_MERGED_NEXT, 0, m->p, m->n, sc, lv, err);
        } else {
            rc = one_piece(m->p, m->n, lv, err);
        }
        break;
    }
    case TOK_PT_BYTELEVEL: {
        const char *src = s;
        size_t sn = n;
        if (pt->add_prefix_space && n && s[0] != ' ') {
            tok_buf *m = &lv->src;
            m->n = 0;
            if (tok_buf_putc(m, ' ') || tok_buf_put(m, s, n)) return cn_err_set(err, CN_ENOMEM, "out of memory");
            src = m->p;
            sn = m->n;
        }
        rc = pt->use_regex ? split_into(&pt->pat, TOK_ISOLATED, 0, src, sn, sc, lv, err)
                           : one_piece(src, sn, lv, err);
        byte_map = 1;
        break;
    }
    }
    if (rc) return rc;
    return forward(t, k, orig0, byte_map, sc, out, err);
}

int tok_pretokenize_encode(const cn_tokenizer *t, const char *s, size_t n, int orig0, tok_scratch *sc,
                           tok_ids *out, cn_err *err) {
    if (n == 0) return CN_OK;
    if (t->n_pretok == 0) return encode_word(t, s, n, sc, out, err);
    return run_level(t, 0, s, n, orig0, sc, out, err);
}
