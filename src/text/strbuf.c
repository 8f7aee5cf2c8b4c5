/* strbuf.c - growable byte string; see strbuf.h. */
#include "text/strbuf.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static int grow(cn_strbuf *b, size_t need) {
    if (b->oom) return 0;
    if (need < b->len || need == (size_t)-1) { /* overflow */
        b->oom = 1;
        return 0;
    }
    if (need + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need + 1) {
        if (cap > ((size_t)-1) / 2) {
            cap = need + 1;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

void cn_strbuf_put(cn_strbuf *b, const char *s, size_t n) {
    if (!grow(b, b->len + n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void cn_strbuf_puts(cn_strbuf *b, const char *s) { cn_strbuf_put(b, s, strlen(s)); }

void cn_strbuf_putc(cn_strbuf *b, char c) { cn_strbuf_put(b, &c, 1); }

void cn_strbuf_reset(cn_strbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

void cn_strbuf_free(cn_strbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

int cn_strbuf_take(cn_strbuf *b, char **out, size_t *len) {
    if (!b->oom && !b->p) cn_strbuf_put(b, "", 0); /* an empty result is "" */
    if (b->oom) {
        cn_strbuf_free(b);
        return CN_ENOMEM;
    }
    *out = b->p;
    if (len) *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return 0;
}
