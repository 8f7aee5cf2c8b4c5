/* tok_normalize.c - normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Replace, Prepend, Strip.
 *
 * Unicode normalization and case mapping are utf8proc's; what is written here is only the
 * Hugging Face semantics around them (src/normalizers/): Prepend touches only non-empty text,
 * Replace substitutes every non-overlapping match left to right, Strip removes White_Space.
 * Offsets are not tracked: cairn never reports them.
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/tok_impl.h"

static int map_region(utf8proc_option_t opt, const char *s, size_t n, tok_buf *out, cn_err *err) {
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t rn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &r, opt);
    if (rn < 0) return cn_err_set(err, CN_EINVAL, "unicode normalization failed: %s", utf8proc_errmsg(rn));
    int rc = tok_buf_put(out, r, (size_t)rn);
    free(r);
    return rc ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
}

/* Every normalization form maps x + y to form(x) + form(y) when y starts with an ASCII character:
 * ASCII characters are starters that no canonical composition has as its second half, and marks
 * never reorder across a starter. So only the regions around non-ASCII text (with the ASCII
 * character before them, which a combining mark may compose with) go through utf8proc; ASCII runs
 * are copied. This keeps normalization off the profile of mostly-ASCII text. */
static int unicode_form(tok_norm_kind k, const char *s, size_t n, tok_buf *out, cn_err *err) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (k) {
    case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    if (tok_buf_reserve(out, n + 1)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    size_t i = 0;
    while (i < n) {
        size_t a = i;
        while (i < n && (unsigned char)s[i] < 0x80) i++;
        if (i == n) return tok_buf_put(out, s + a, i - a) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
        size_t start = i > a ? i - 1 : i; /* the ASCII character before may compose with a mark */
        if (tok_buf_put(out, s + a, start - a)) return cn_err_set(err, CN_ENOMEM, "out of memory");
        while (i < n && (unsigned char)s[i] >= 0x80) i++;
        int rc = map_region(opt, s + start, i - start, out, err);
        if (rc) return rc;
    }
    return tok_buf_put(out, "", 0) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
}

static int lowercase(const char *s, size_t n, tok_buf *out, cn_err *err) {
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = tok_utf8_get(s + i, n - i, &k);
        /* Rust's char::to_lowercase uses the full mapping; utf8proc the simple one. They differ only
         * for U+0130 (capital I with dot above), which lowercases to "i" + U+0307. */
        int rc = cp == 0x130 ? tok_buf_put(out, "i\xcc\x87", 3)
                             : tok_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        if (rc) return cn_err_set(err, CN_ENOMEM, "out of memory");
        i += k;
    }
    return CN_OK;
}

static int replace(const tok_norm *nm, const char *s, size_t n, tok_buf *out, tok_rx_scratch *rx, cn_err *err) {
    tok_spans sp = {0};
    int rc = tok_pattern_find(&nm->pat, s, n, rx, &sp, err);
    for (size_t i = 0; rc == CN_OK && i < sp.n; i++) {
        const tok_span *x = &sp.p[i];
        if (x->match ? tok_buf_put(out, nm->str, nm->str_len) : tok_buf_put(out, s + x->start, x->end - x->start))
            rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    free(sp.p);
    return rc;
}

static int strip(const tok_norm *nm, const char *s, size_t n, tok_buf *out, cn_err *err) {
    size_t a = 0, b = n;
    while (nm->left && a < b) {
        size_t k;
        if (!tok_is_space(tok_utf8_get(s + a, b - a, &k))) break;
        a += k;
    }
    while (nm->right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
        size_t k;
        if (!tok_is_space(tok_utf8_get(s + j, b - j, &k))) break;
        b = j;
    }
    return tok_buf_put(out, s + a, b - a) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
}

static int normalize_one(const tok_norm *nm, const char *s, size_t n, tok_buf *out, tok_rx_scratch *rx,
                         cn_err *err) {
    out->n = 0;
    switch (nm->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: return unicode_form(nm->kind, s, n, out, err);
    case TOK_NORM_LOWERCASE: return lowercase(s, n, out, err);
    case TOK_NORM_REPLACE: return replace(nm, s, n, out, rx, err);
    case TOK_NORM_PREPEND:
        if (n && tok_buf_put(out, nm->str, nm->str_len)) return cn_err_set(err, CN_ENOMEM, "out of memory");
        return tok_buf_put(out, s, n) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
    case TOK_NORM_STRIP: return strip(nm, s, n, out, err);
    }
    return cn_err_set(err, CN_EINVAL, "unknown normalizer");
}

int tok_normalize(const tok_norm *ns, int n_norm, const char *s, size_t n, tok_buf *out,
                  tok_rx_scratch *rx, cn_err *err) {
    out->n = 0;
    if (n_norm == 1) return normalize_one(&ns[0], s, n, out, rx, err);
    tok_buf cur = {0}, nxt = {0};
    int rc = tok_buf_put(&cur, s, n) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
    for (int i = 0; i < n_norm && rc == CN_OK; i++) {
        rc = normalize_one(&ns[i], cur.p, cur.n, &nxt, rx, err);
        tok_buf t = cur;
        cur = nxt;
        nxt = t;
    }
    if (rc == CN_OK && tok_buf_put(out, cur.p, cur.n)) rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    tok_buf_free(&cur);
    tok_buf_free(&nxt);
    return rc;
}
