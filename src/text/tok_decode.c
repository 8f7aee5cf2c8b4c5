/* tok_decode.c - the decoder chain (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
 * flattened Sequences) run as a stream, and cn_tok_decode on top of it.
 *
 * Hugging Face decodes a whole list at once (Decoder::decode_chain over Vec<String>). We run the
 * same chain as a push pipeline so that one implementation serves both the full decode and the
 * streaming one, which makes "the streamed pieces concatenate to the full decode" true by
 * construction. Each stage works in one of two modes:
 *  - per token, until a Fuse or ByteLevel joined the list into one string: each token passes
 *    through on its own, and a stage counts the tokens it has seen (Metaspace strips only token 0);
 *  - joined, after that: the stage sees chunks of one long string and keeps whatever it may still
 *    change (a Replace pattern's possible prefix, trailing characters Strip may remove).
 * ByteLevel turns tokens into bytes and then into text with Rust's from_utf8_lossy rule (each
 * maximal invalid subpart becomes one U+FFFD), which is a streaming rule: an incomplete sequence
 * is held until it completes or fails. ByteFallback holds a run of <0xNN> tokens until a token
 * that is not one ends it, because an invalid run turns every one of its bytes into U+FFFD.
 * Written by hand: no library knows these decoders.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tok_impl.h"

typedef struct stage_state {
    uint64_t count;   /* tokens seen (per-token mode) */
    tok_buf pend;     /* ByteFallback: run bytes; joined Replace: held tail; joined Strip: held spaces */
    size_t n_bytes;   /* ByteFallback: tokens in the run */
    size_t held;      /* joined Strip: characters held in pend */
    int lead_stripped; /* joined Strip: leading characters removed so far */
    int lead_done;
} stage_state;

typedef struct stream_state {
    stage_state *st; /* [n_dec] */
    unsigned char u8[4]; /* ByteLevel: incomplete UTF-8 sequence */
    size_t u8n, u8need;
    uint64_t n_pieces; /* pieces that reached the end (joined with " " when there is no decoder) */
    tok_buf out;
    tok_buf tmp;
} stream_state;

static const char kFFFD[] = "\xef\xbf\xbd";

static int stage(const cn_tokenizer *t, stream_state *ss, int i, int joined, const char *s, size_t n);

/* The end of the chain. */
static int sink(const cn_tokenizer *t, stream_state *ss, int joined, const char *s, size_t n) {
    if (!t->has_decoder && !joined && ss->n_pieces++ > 0 && tok_buf_putc(&ss->out, ' ')) return CN_ENOMEM;
    return tok_buf_put(&ss->out, s, n);
}

static int next(const cn_tokenizer *t, stream_state *ss, int i, int joined, const char *s, size_t n) {
    return i + 1 < t->n_dec ? stage(t, ss, i + 1, joined, s, n) : sink(t, ss, joined, s, n);
}

/* ByteLevel's lossy UTF-8, one byte at a time; whole characters go on to stage i + 1. */
static int lossy_byte(const cn_tokenizer *t, stream_state *ss, int i, unsigned char b) {
    for (;;) {
        if (ss->u8n == 0) {
            if (b < 0x80) return next(t, ss, i, 1, (const char *)&b, 1);
            if (b >= 0xc2 && b <= 0xf4) {
                ss->u8[0] = b;
                ss->u8n = 1;
                ss->u8need = b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
                return CN_OK;
            }
            return next(t, ss, i, 1, kFFFD, 3);
        }
        unsigned lo = 0x80, hi = 0xbf;
        if (ss->u8n == 1) {
            unsigned c = ss->u8[0];
            if (c == 0xe0) lo = 0xa0;
            else if (c == 0xed) hi = 0x9f;
            else if (c == 0xf0) lo = 0x90;
            else if (c == 0xf4) hi = 0x8f;
        }
        if (b >= lo && b <= hi) {
            ss->u8[ss->u8n++] = b;
            if (ss->u8n < ss->u8need) return CN_OK;
            size_t k = ss->u8n;
            ss->u8n = 0;
            return next(t, ss, i, 1, (const char *)ss->u8, k);
        }
        ss->u8n = 0; /* the held prefix is one maximal invalid subpart; b starts afresh */
        int rc = next(t, ss, i, 1, kFFFD, 3);
        if (rc) return rc;
    }
}

static int is_byte_token(const char *s, size_t n, unsigned char *b) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    unsigned v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + (unsigned)d;
    }
    *b = (unsigned char)v;
    return 1;
}

/* Ends a ByteFallback run: its text if valid UTF-8, else one U+FFFD token per byte. */
static int byte_run_flush(const cn_tokenizer *t, stream_state *ss, int i) {
    stage_state *st = &ss->st[i];
    if (!st->n_bytes) return CN_OK;
    tok_buf run = st->pend;
    size_t nb = st->n_bytes;
    memset(&st->pend, 0, sizeof st->pend);
    st->n_bytes = 0;
    int rc = CN_OK;
    if (tok_utf8_check(run.p, run.n) == run.n) rc = next(t, ss, i, 0, run.p, run.n);
    else
        for (size_t k = 0; k < nb && rc == CN_OK; k++) rc = next(t, ss, i, 0, kFFFD, 3);
    tok_buf_free(&run);
    return rc;
}

static int per_token_replace(const tok_dec *d, const char *s, size_t n, tok_buf *o) {
    o->n = 0;
    for (size_t j = 0; j < n;) {
        if (d->pat_len && j + d->pat_len <= n && !memcmp(s + j, d->pat, d->pat_len)) {
            if (tok_buf_put(o, d->str, d->str_len)) return CN_ENOMEM;
            j += d->pat_len;
        } else {
            if (tok_buf_putc(o, s[j])) return CN_ENOMEM;
            j++;
        }
    }
    return tok_buf_put(o, "", 0);
}

static int stage(const cn_tokenizer *t, stream_state *ss, int i, int joined, const char *s, size_t n) {
    const tok_dec *d = &t->dec[i];
    stage_state *st = &ss->st[i];
    int rc = CN_OK;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL: {
        /* A token whose every character is in the byte alphabet becomes those bytes; any other
         * token (an added token like <｜User｜>) stays as its UTF-8. */
        int all = 1;
        for (size_t j = 0; j < n && all;) {
            size_t k;
            uint32_t cp = tok_utf8_get(s + j, n - j, &k);
            if (cp >= 0x144 || t->bl_byte[cp] < 0) all = 0;
            j += k;
        }
        for (size_t j = 0; j < n && rc == CN_OK;) {
            if (all) {
                size_t k;
                uint32_t cp = tok_utf8_get(s + j, n - j, &k);
                rc = lossy_byte(t, ss, i, (unsigned char)t->bl_byte[cp]);
                j += k;
            } else {
                rc = lossy_byte(t, ss, i, (unsigned char)s[j]);
                j++;
            }
        }
        return rc;
    }
    case TOK_DEC_FUSE: return next(t, ss, i, 1, s, n);
    case TOK_DEC_BYTEFALLBACK: {
        unsigned char b;
        if (is_byte_token(s, n, &b)) {
            st->n_bytes++;
            return tok_buf_putc(&st->pend, (char)b);
        }
        if ((rc = byte_run_flush(t, ss, i))) return rc;
        return next(t, ss, i, 0, s, n);
    }
    case TOK_DEC_METASPACE: {
        int first = joined || st->count == 0;
        st->count++;
        tok_buf o = {0};
        for (size_t j = 0; j < n && rc == CN_OK;) {
            size_t k;
            uint32_t cp = tok_utf8_get(s + j, n - j, &k);
            if (cp == d->cp) {
                if (!(first && d->prepend != TOK_PREPEND_NEVER)) rc = tok_buf_putc(&o, ' ');
            } else {
                rc = tok_buf_put(&o, s + j, k);
            }
            j += k;
        }
        if (rc == CN_OK) rc = next(t, ss, i, joined, o.p ? o.p : "", o.n);
        tok_buf_free(&o);
        return rc;
    }
    case TOK_DEC_REPLACE: {
        if (!joined) {
            tok_buf o = {0};
            rc = per_token_replace(d, s, n, &o);
            if (rc == CN_OK) rc = next(t, ss, i, 0, o.p, o.n);
            tok_buf_free(&o);
            return rc;
        }
        if (tok_buf_put(&st->pend, s, n)) return CN_ENOMEM;
        /* Replace every complete match; keep the shortest tail that could still start one. */
        const char *p = st->pend.p;
        size_t pn = st->pend.n, keep = pn;
        for (size_t j = 0; j < pn; j++) {
            size_t rest = pn - j;
            if (rest < d->pat_len && !memcmp(p + j, d->pat, rest)) {
                keep = j;
                break;
            }
        }
        tok_buf o = {0};
        rc = per_token_replace(d, p, keep, &o);
        if (rc == CN_OK) rc = next(t, ss, i, 1, o.p, o.n);
        tok_buf_free(&o);
        if (rc == CN_OK) {
            memmove(st->pend.p, p + keep, pn - keep);
            st->pend.n = pn - keep;
        }
        return rc;
    }
    case TOK_DEC_STRIP: {
        tok_buf o = {0};
        if (!joined) {
            /* HF: up to `start` leading and `stop` trailing `content` characters of each token */
            size_t a = 0, b = n;
            for (int k = 0; k < d->start && a < b; k++) {
                size_t l;
                if (tok_utf8_get(s + a, b - a, &l) != d->cp) break;
                a += l;
            }
            for (int k = 0; k < d->stop && b > a; k++) {
                size_t j = b - 1, l;
                while (j > a && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
                if (tok_utf8_get(s + j, b - j, &l) != d->cp) break;
                b = j;
            }
            return next(t, ss, i, 0, s + a, b - a);
        }
        for (size_t j = 0; j < n && rc == CN_OK;) {
            size_t k;
            uint32_t cp = tok_utf8_get(s + j, n - j, &k);
            if (!st->lead_done) {
                if (cp == d->cp && st->lead_stripped < d->start) {
                    st->lead_stripped++;
                    j += k;
                    continue;
                }
                st->lead_done = 1;
            }
            if (d->stop > 0 && cp == d->cp) {
                /* maybe trailing: hold it; only `stop` of them can ever be removed */
                rc = tok_buf_put(&st->pend, s + j, k);
                if (rc == CN_OK && ++st->held > (size_t)d->stop) {
                    size_t l = tok_utf8_clen((unsigned char)st->pend.p[0]);
                    rc = tok_buf_put(&o, st->pend.p, l);
                    memmove(st->pend.p, st->pend.p + l, st->pend.n - l);
                    st->pend.n -= l;
                    st->held--;
                }
            } else {
                if (st->held) {
                    rc = tok_buf_put(&o, st->pend.p, st->pend.n);
                    st->pend.n = 0;
                    st->held = 0;
                }
                if (rc == CN_OK) rc = tok_buf_put(&o, s + j, k);
            }
            j += k;
        }
        if (rc == CN_OK && o.n) rc = next(t, ss, i, 1, o.p, o.n);
        tok_buf_free(&o);
        return rc;
    }
    }
    return CN_EINVAL;
}

/* End of stream: every stage releases what it held, in chain order. */
static int flush_chain(const cn_tokenizer *t, stream_state *ss) {
    int rc = CN_OK;
    for (int i = 0; i < t->n_dec && rc == CN_OK; i++) {
        const tok_dec *d = &t->dec[i];
        stage_state *st = &ss->st[i];
        switch (d->kind) {
        case TOK_DEC_BYTELEVEL:
            if (ss->u8n) {
                ss->u8n = 0;
                rc = next(t, ss, i, 1, kFFFD, 3);
            }
            break;
        case TOK_DEC_BYTEFALLBACK: rc = byte_run_flush(t, ss, i); break;
        case TOK_DEC_REPLACE:
            if (st->pend.n) {
                tok_buf o = {0};
                rc = per_token_replace(d, st->pend.p, st->pend.n, &o);
                st->pend.n = 0;
                if (rc == CN_OK) rc = next(t, ss, i, 1, o.p, o.n);
                tok_buf_free(&o);
            }
            break;
        case TOK_DEC_STRIP:
            st->pend.n = 0; /* held trailing characters: at most `stop`, all removed */
            st->held = 0;
            break;
        default: break;
        }
    }
    /* a fresh sequence may follow */
    for (int i = 0; i < t->n_dec; i++) {
        stage_state *st = &ss->st[i];
        tok_buf keep = st->pend;
        memset(st, 0, sizeof *st);
        st->pend = keep;
        st->pend.n = 0;
    }
    ss->n_pieces = 0;
    return rc;
}

int cn_tok_stream_init(cn_tok_stream *s, const cn_tokenizer *t, int flags) {
    memset(s, 0, sizeof *s);
    stream_state *ss = calloc(1, sizeof *ss);
    if (!ss) return CN_ENOMEM;
    if (t->n_dec && !(ss->st = calloc((size_t)t->n_dec, sizeof *ss->st))) {
        free(ss);
        return CN_ENOMEM;
    }
    s->tok = t;
    s->flags = flags;
    s->state = ss;
    return CN_OK;
}

void cn_tok_stream_free(cn_tok_stream *s) {
    stream_state *ss = s->state;
    if (!ss) return;
    for (int i = 0; s->tok && i < s->tok->n_dec; i++) tok_buf_free(&ss->st[i].pend);
    free(ss->st);
    tok_buf_free(&ss->out);
    tok_buf_free(&ss->tmp);
    free(ss);
    s->state = NULL;
}

int cn_tok_stream_feed(cn_tok_stream *s, int32_t id, const char **out, size_t *out_len, cn_err *err) {
    const cn_tokenizer *t = s->tok;
    stream_state *ss = s->state;
    ss->out.n = 0;
    if (tok_buf_put(&ss->out, "", 0)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    *out = ss->out.p;
    *out_len = 0;
    if (id < 0 || id >= t->n_ids || !t->str[id])
        return cn_err_set(err, CN_ERANGE, "token id %d is not in the vocabulary (size %d)", id, t->n_ids);
    if ((s->flags & CN_TOK_SKIP_SPECIAL) && cn_tok_is_special(t, id)) return CN_OK;
    int rc = t->n_dec ? stage(t, ss, 0, 0, t->str[id], t->len[id]) : sink(t, ss, 0, t->str[id], t->len[id]);
    if (rc) return cn_err_set(err, rc, "decode: out of memory");
    *out = ss->out.p;
    *out_len = ss->out.n;
    return CN_OK;
}

int cn_tok_stream_flush(cn_tok_stream *s, const char **out, size_t *out_len, cn_err *err) {
    stream_state *ss = s->state;
    ss->out.n = 0;
    int rc = tok_buf_put(&ss->out, "", 0);
    if (rc == CN_OK) rc = flush_chain(s->tok, ss);
    if (rc) return cn_err_set(err, rc, "decode: out of memory");
    *out = ss->out.p;
    *out_len = ss->out.n;
    return CN_OK;
}

int cn_tok_decode(const cn_tokenizer *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len,
                  cn_err *err) {
    *text = NULL;
    *len = 0;
    cn_tok_stream s;
    if (cn_tok_stream_init(&s, t, flags)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    tok_buf all = {0};
    const char *p;
    size_t pn;
    int rc = tok_buf_put(&all, "", 0) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
    for (size_t i = 0; i < n && rc == CN_OK; i++) {
        rc = cn_tok_stream_feed(&s, ids[i], &p, &pn, err);
        if (rc == CN_OK && tok_buf_put(&all, p, pn)) rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    if (rc == CN_OK) rc = cn_tok_stream_flush(&s, &p, &pn, err);
    if (rc == CN_OK && tok_buf_put(&all, p, pn)) rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    cn_tok_stream_free(&s);
    if (rc) {
        tok_buf_free(&all);
        return rc;
    }
    *text = all.p;
    *len = all.n;
    return CN_OK;
}

/* One token's own bytes, as the chain would emit them mid-stream: each stage's per-token rule
 * (ByteLevel's alphabet, a <0xNN> byte, Metaspace's marker as a space, Replace's literal), and
 * nothing that depends on neighbours (Metaspace's first-token strip, Strip, lossy UTF-8). */
int cn_tok_token_bytes(const cn_tokenizer *t, int32_t id, char **bytes, size_t *n) {
    *bytes = NULL;
    *n = 0;
    if (id < 0 || id >= t->n_ids || !t->str[id]) return CN_ERANGE;
    tok_buf cur = {0}, nxt = {0};
    if (tok_buf_put(&cur, t->str[id], t->len[id])) return CN_ENOMEM;
    int rc = CN_OK;
    for (int i = 0; i < t->n_dec && rc == CN_OK; i++) {
        const tok_dec *d = &t->dec[i];
        const char *s = cur.p ? cur.p : "";
        size_t len = cur.n;
        nxt.n = 0;
        unsigned char b;
        switch (d->kind) {
        case TOK_DEC_BYTELEVEL: {
            int all = 1;
            for (size_t j = 0; j < len && all;) {
                size_t k;
                uint32_t cp = tok_utf8_get(s + j, len - j, &k);
                if (cp >= 0x144 || t->bl_byte[cp] < 0) all = 0;
                j += k;
            }
            for (size_t j = 0; j < len && rc == CN_OK;) {
                size_t k = 1;
                if (all) {
                    uint32_t cp = tok_utf8_get(s + j, len - j, &k);
                    rc = tok_buf_putc(&nxt, (char)t->bl_byte[cp]);
                } else {
                    rc = tok_buf_putc(&nxt, s[j]);
                }
                j += k;
            }
            break;
        }
        case TOK_DEC_BYTEFALLBACK:
            rc = is_byte_token(s, len, &b) ? tok_buf_putc(&nxt, (char)b) : tok_buf_put(&nxt, s, len);
            break;
        case TOK_DEC_METASPACE:
            for (size_t j = 0; j < len && rc == CN_OK;) {
                size_t k;
                uint32_t cp = tok_utf8_get(s + j, len - j, &k);
                rc = cp == d->cp ? tok_buf_putc(&nxt, ' ') : tok_buf_put(&nxt, s + j, k);
                j += k;
            }
            break;
        case TOK_DEC_REPLACE: rc = per_token_replace(d, s, len, &nxt); break;
        default: rc = tok_buf_put(&nxt, s, len); break; /* Fuse, Strip: nothing per token */
        }
        tok_buf sw = cur;
        cur = nxt;
        nxt = sw;
    }
    tok_buf_free(&nxt);
    if (rc) {
        tok_buf_free(&cur);
        return rc;
    }
    if (!cur.p && tok_buf_put(&cur, "", 0)) return CN_ENOMEM;
    *bytes = cur.p;
    *n = cur.n;
    return CN_OK;
}
