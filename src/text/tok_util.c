/* tok_util.c - the tokenizer's small tools: growable buffers, UTF-8, Unicode classes, hashing,
 * the byte-level alphabet, and pattern matching with Hugging Face's split semantics.
 *
 * Written here because no library gives these exact semantics: Unicode tables come from utf8proc
 * and regexes from PCRE2, but which characters count as whitespace or word characters, how an
 * onig find_iter walks empty matches, and what each SplitDelimiterBehavior keeps are Hugging Face
 * `tokenizers` facts (src/tokenizer/pattern.rs, normalizer.rs) that we must reproduce exactly.
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/tok_impl.h"

/* ---- buffers -------------------------------------------------------------------------------- */

int tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return CN_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return CN_ENOMEM;
    b->p = p;
    b->cap = cap;
    return CN_OK;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (tok_buf_reserve(b, n + 1)) return CN_ENOMEM;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0'; /* always room for a terminator: callers may hand p out as a C string */
    return CN_OK;
}

int tok_buf_putc(tok_buf *b, char c) { return tok_buf_put(b, &c, 1); }

int tok_buf_put_cp(tok_buf *b, uint32_t cp) {
    char u[4];
    size_t k;
    if (cp < 0x80) {
        u[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        k = 3;
    } else {
        u[0] = (char)(0xf0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        k = 4;
    }
    return tok_buf_put(b, u, k);
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int tok_ids_push(tok_ids *v, int32_t id) { return tok_ids_put(v, &id, 1); }

int tok_ids_put(tok_ids *v, const int32_t *ids, size_t n) {
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 64;
        while (cap < v->n + n) cap *= 2;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    if (n) memcpy(v->p + v->n, ids, n * sizeof *ids);
    v->n += n;
    return CN_OK;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

size_t tok_utf8_clen(unsigned char c) {
    return c < 0x80 ? 1 : c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc0 && c < 0xe0 ? 2 : 1;
}

uint32_t tok_utf8_get(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = tok_utf8_clen(u[0]);
    if (k > n) k = 1;
    *adv = k;
    switch (k) {
    case 2: return (uint32_t)(u[0] & 0x1f) << 6 | (u[1] & 0x3f);
    case 3: return (uint32_t)(u[0] & 0x0f) << 12 | (uint32_t)(u[1] & 0x3f) << 6 | (u[2] & 0x3f);
    case 4:
        return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3f) << 12 |
               (uint32_t)(u[2] & 0x3f) << 6 | (u[3] & 0x3f);
    default: return u[0];
    }
}

size_t tok_utf8_check(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) k = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            k = 3;
            if (c == 0xe0) lo = 0xa0;      /* overlong */
            else if (c == 0xed) hi = 0x9f; /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 4;
            if (c == 0xf0) lo = 0x90;      /* overlong */
            else if (c == 0xf4) hi = 0x8f; /* above U+10FFFF */
        } else
            return i;
        if (i + k > n) return i;
        if (u[i + 1] < lo || u[i + 1] > hi) return i;
        for (size_t j = 2; j < k; j++)
            if ((u[i + j] & 0xc0) != 0x80) return i;
        i += k;
    }
    return n;
}

/* ---- Unicode classes ------------------------------------------------------------------------ */

int tok_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

int tok_is_word(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_';
    if (cp == 0x200c || cp == 0x200d) return 1; /* Join_Control */
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

int tok_is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* ---- hashing -------------------------------------------------------------------------------- */

uint64_t tok_hash(const void *s, size_t n) {
    const unsigned char *p = s;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
    return h;
}

void tok_byte_alphabet(uint32_t cp[256]) {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp[b] = keep ? b : 256 + extra++;
    }
}

/* ---- patterns ------------------------------------------------------------------------------- */

/* Onig (Hugging Face's regex engine) and PCRE2 disagree on two classes: onig's \s includes U+0085,
 * and its \w is Unicode's word class (Alphabetic, marks, Nd, Pc, Join_Control) while PCRE2 10.42's
 * leaves out marks, so Devanagari or Thai words would split at every vowel sign. Both are spelled
 * out here; circled letters are the Alphabetic symbols outside \p{L}. */
static const char kSpace[] = "\\s\\x{85}";
static const char kWord[] = "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}";

static int put_class(tok_buf *out, const char *body, int in_class, int negate) {
    if (in_class) return tok_buf_put(out, body, strlen(body));
    if (tok_buf_put(out, negate ? "[^" : "[", negate ? 2 : 1) || tok_buf_put(out, body, strlen(body)))
        return CN_ENOMEM;
    return tok_buf_putc(out, ']');
}

/* Rewrites \s \S \w \W to the classes above. Classes are tracked so that "[\s]" does not become a
 * nested class; \S and \W inside a class are left alone. */
static int rewrite_regex(const char *p, size_t n, tok_buf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            int rc;
            if (d == 's') rc = put_class(out, kSpace, in_class, 0);
            else if (d == 'S' && !in_class) rc = put_class(out, kSpace, 0, 1);
            else if (d == 'w') rc = put_class(out, kWord, in_class, 0);
            else if (d == 'W' && !in_class) rc = put_class(out, kWord, 0, 1);
            else rc = tok_buf_put(out, p + i, 2);
            if (rc) return rc;
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            if (tok_buf_putc(out, c)) return CN_ENOMEM;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && p[i + 1] == '^') {
                if (tok_buf_putc(out, '^')) return CN_ENOMEM;
                i++;
            }
            if (i + 1 < n && p[i + 1] == ']') {
                if (tok_buf_putc(out, ']')) return CN_ENOMEM;
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *e = memchr(p + i + 2, ']', n - i - 2);
            size_t k = e ? (size_t)(e - (p + i)) + 1 : 1;
            if (tok_buf_put(out, p + i, k)) return CN_ENOMEM;
            i += k - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        if (tok_buf_putc(out, c)) return CN_ENOMEM;
    }
    return CN_OK;
}

int tok_pattern_regex(tok_pattern *p, const char *pattern, size_t len, int literal, cn_err *err) {
    memset(p, 0, sizeof *p);
    p->kind = TOK_PAT_REGEX;
    tok_buf rw = {0};
    if (!literal && rewrite_regex(pattern, len, &rw)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL forbids UCP */
    p->re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : rw.p), literal ? len : rw.n, opts, &ecode,
                          &eoff, NULL);
    tok_buf_free(&rw);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return cn_err_set(err, CN_EFORMAT, "regex '%.*s' does not compile: %s", (int)(len > 200 ? 200 : len),
                          pattern, (const char *)msg);
    }
    p->jit = pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE) == 0;
    return CN_OK;
}

void tok_pattern_free(tok_pattern *p) {
    if (p->re) pcre2_code_free(p->re);
    p->re = NULL;
}

void tok_rx_scratch_free(tok_rx_scratch *rx) {
    if (rx->md) pcre2_match_data_free(rx->md);
    if (rx->mc) pcre2_match_context_free(rx->mc);
    if (rx->js) pcre2_jit_stack_free(rx->js);
    memset(rx, 0, sizeof *rx);
}

static int span_push(tok_spans *sp, size_t a, size_t b, int match) {
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 32;
        tok_span *p = realloc(sp->p, cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        sp->p = p;
        sp->cap = cap;
    }
    sp->p[sp->n++] = (tok_span){a, b, match};
    return CN_OK;
}

static int char_matches(const tok_pattern *p, uint32_t cp) {
    switch (p->kind) {
    case TOK_PAT_CHAR: return cp == p->cp;
    case TOK_PAT_NUMERIC: return tok_is_numeric(cp);
    case TOK_PAT_SPACE: return tok_is_space(cp);
    default: return 0;
    }
}

int tok_pattern_find(const tok_pattern *p, const char *s, size_t n, tok_rx_scratch *rx,
                     tok_spans *out, cn_err *err) {
    out->n = 0;
    if (n == 0) return span_push(out, 0, 0, 0) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
    size_t prev = 0;
    if (p->kind != TOK_PAT_REGEX) {
        for (size_t i = 0; i < n;) {
            size_t k;
            uint32_t cp = tok_utf8_get(s + i, n - i, &k);
            if (char_matches(p, cp)) {
                if ((prev < i && span_push(out, prev, i, 0)) || span_push(out, i, i + k, 1))
                    return cn_err_set(err, CN_ENOMEM, "out of memory");
                prev = i + k;
            }
            i += k;
        }
    } else {
        if (!rx->md && !(rx->md = pcre2_match_data_create(32, NULL))) goto oom;
        if (!rx->mc) {
            /* The default 32 KiB JIT stack overflows on long whitespace runs under \s+(?!\S). */
            if (!(rx->mc = pcre2_match_context_create(NULL))) goto oom;
            if (!(rx->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL))) goto oom;
            pcre2_jit_stack_assign(rx->mc, NULL, rx->js);
        }
        size_t pos = 0, last_end = (size_t)-1;
        while (pos <= n) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, rx->md, rx->mc);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return cn_err_set(err, CN_EINVAL, "regex match failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(rx->md);
            size_t ms = ov[0], me = ov[1];
            if (ms == me && last_end == me) { /* onig: no empty match right after a match */
                if (pos >= n) break;
                pos += tok_utf8_clen((unsigned char)s[pos]);
                continue;
            }
            if ((prev != ms && span_push(out, prev, ms, 0)) || span_push(out, ms, me, 1)) goto oom;
            prev = me;
            pos = me;
            last_end = me;
        }
    }
    if (prev != n && span_push(out, prev, n, 0)) goto oom;
    return CN_OK;
oom:
    return cn_err_set(err, CN_ENOMEM, "out of memory");
}

void tok_apply_behavior(tok_spans *sp, tok_behavior b, int invert) {
    tok_span *v = sp->p;
    size_t n = sp->n, o = 0;
    if (invert)
        for (size_t i = 0; i < n; i++) v[i].match = !v[i].match;
    switch (b) {
    case TOK_ISOLATED:
        for (size_t i = 0; i < n; i++) v[i].match = 0;
        return;
    case TOK_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].match) v[o++] = v[i];
        sp->n = o;
        return;
    case TOK_MERGED_PREV: {
        int prev_match = 0;
        for (size_t i = 0; i < n; i++) {
            int m = v[i].match;
            if (m && !prev_match && o > 0) v[o - 1].end = v[i].end;
            else v[o++] = (tok_span){v[i].start, v[i].end, 0};
            prev_match = m;
        }
        sp->n = o;
        return;
    }
    case TOK_MERGED_NEXT: {
        /* Right to left: a match glues onto the piece after it. Built reversed, then flipped. */
        int prev_match = 0;
        for (size_t k = n; k-- > 0;) {
            int m = v[k].match;
            tok_span cur = v[k];
            if (m && !prev_match && o > 0) v[n - o].start = cur.start;
            else {
                o++;
                v[n - o] = (tok_span){cur.start, cur.end, 0};
            }
            prev_match = m;
        }
        memmove(v, v + (n - o), o * sizeof *v);
        sp->n = o;
        return;
    }
    case TOK_CONTIGUOUS: {
        int prev_match = 0;
        for (size_t i = 0; i < n; i++) {
            int m = v[i].match;
            if (m == prev_match && o > 0) v[o - 1].end = v[i].end;
            else v[o++] = (tok_span){v[i].start, v[i].end, 0};
            prev_match = m;
        }
        sp->n = o;
        return;
    }
    }
}
