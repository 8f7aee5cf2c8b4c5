/* strbuf.h - a growable byte string with a sticky out-of-memory flag.
 *
 * Renderers append hundreds of small pieces; checking every append would bury the template's
 * structure under error handling. Instead a failed growth sets `oom`, every later append is a
 * no-op, and the owner checks once at the end (cn_strbuf_take reports CN_ENOMEM). The bytes are
 * always NUL-terminated when p is not NULL. Nothing here exits or logs.
 */
#ifndef CN_STRBUF_H
#define CN_STRBUF_H

#include <stddef.h>

typedef struct cn_strbuf {
    char *p;    /* malloc'd, NUL-terminated; NULL until the first append */
    size_t len; /* bytes, without the NUL */
    size_t cap; /* bytes allocated */
    int oom;    /* set once an allocation failed; appends are then ignored */
} cn_strbuf;

#define CN_STRBUF_INIT {NULL, 0, 0, 0}

void cn_strbuf_put(cn_strbuf *b, const char *s, size_t n);
void cn_strbuf_puts(cn_strbuf *b, const char *s);
void cn_strbuf_putc(cn_strbuf *b, char c);
/* Drops the contents, keeps the allocation (and the oom flag). */
void cn_strbuf_reset(cn_strbuf *b);
void cn_strbuf_free(cn_strbuf *b);
/* Moves the string to the caller (*out, *len; never NULL on success, "" when empty) and leaves b
 * empty. Returns 0, or CN_ENOMEM if any append failed (b is freed, *out untouched). */
int cn_strbuf_take(cn_strbuf *b, char **out, size_t *len);

#endif
