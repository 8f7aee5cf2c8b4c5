/* stopseq.c - stop-string matcher; see stopseq.h. */
#include "text/stopseq.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

int cn_stopseq_add(cn_stopseq *m, const char *s) {
    if (!s || !*s) return CN_OK;
    char **ns = realloc(m->s, ((size_t)m->n + 1) * sizeof *ns);
    if (!ns) return CN_ENOMEM;
    m->s = ns;
    if (!(m->s[m->n] = strdup(s))) return CN_ENOMEM;
    m->n++;
    return CN_OK;
}

void cn_stopseq_free(cn_stopseq *m) {
    for (int i = 0; i < m->n; i++) free(m->s[i]);
    free(m->s);
    free(m->held);
    free(m->out);
    memset(m, 0, sizeof *m);
}

/* Length of the longest tail of b[0, n) that is a proper prefix of some stop string. */
static size_t partial_tail(const cn_stopseq *m, const char *b, size_t n) {
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t L = strlen(m->s[i]);
        size_t k = L - 1 < n ? L - 1 : n;
        for (; k > best; k--)
            if (!memcmp(b + n - k, m->s[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

int cn_stopseq_feed(cn_stopseq *m, const char *text, size_t n, const char **out, size_t *out_len) {
    *out = "";
    *out_len = 0;
    if (m->matched) return 1;
    if (m->n == 0) { /* the common case costs nothing */
        *out = text;
        *out_len = n;
        return 0;
    }
    if (m->held_len + n + 1 > m->held_cap) {
        size_t cap = (m->held_len + n + 1) * 2;
        char *nb = realloc(m->held, cap);
        if (!nb) return CN_ENOMEM;
        m->held = nb;
        m->held_cap = cap;
    }
    memcpy(m->held + m->held_len, text, n);
    size_t len = m->held_len + n;
    /* earliest match over every stop string */
    size_t first = len;
    int which = -1;
    for (int i = 0; i < m->n; i++) {
        char *p = memmem(m->held, len, m->s[i], strlen(m->s[i]));
        if (p && (size_t)(p - m->held) < first) first = (size_t)(p - m->held), which = i;
    }
    if (first < len) {
        m->matched = 1;
        m->which = which;
        m->held_len = 0;
        *out = m->held;
        *out_len = first;
        return 1;
    }
    size_t keep = partial_tail(m, m->held, len);
    if (len - keep + 1 > m->out_cap) {
        char *nb = realloc(m->out, (len - keep + 1) * 2);
        if (!nb) return CN_ENOMEM;
        m->out = nb;
        m->out_cap = (len - keep + 1) * 2;
    }
    memcpy(m->out, m->held, len - keep);
    memmove(m->held, m->held + len - keep, keep);
    m->held_len = keep;
    *out = m->out;
    *out_len = len - keep;
    return 0;
}

void cn_stopseq_flush(cn_stopseq *m, const char **out, size_t *out_len) {
    *out = m->held ? m->held : "";
    *out_len = m->matched ? 0 : m->held_len;
    m->held_len = 0;
}
