/* stopseq.h - stop strings over streamed text: cuts the output at the first match.
 *
 * Text arrives in arbitrary pieces; a stop string may straddle them. The matcher passes text on
 * as soon as it cannot be the start of a stop string and holds back only the longest tail that
 * is a prefix of one (so at most the longest stop string minus one byte). It promises:
 *   (1) The text passed on is exactly the input up to (not including) the earliest match, or all
 *       of it when nothing matched, however the input was cut.
 *   (2) After a match, everything is dropped, and `which` names the stop string that matched
 *       (APIs that report it, as Anthropic's stop_sequence does).
 * It never allocates after init except to grow the held tail, and never exits.
 */
#ifndef CN_TEXT_STOPSEQ_H
#define CN_TEXT_STOPSEQ_H

#include <stddef.h>

typedef struct cn_stopseq {
    char **s;    /* [n] stop strings, each non-empty, owned */
    int n;
    char *held;  /* bytes held back (a possible partial match) + room for one feed */
    size_t held_len, held_cap;
    char *out;   /* the bytes handed out by the last feed */
    size_t out_cap;
    int matched; /* 1 once a stop string matched */
    int which;   /* after a match: the index in s of the stop string that matched (the earliest
                  * match; at one position, the first added) */
} cn_stopseq;

/* Adds a copy of stop string s (empty strings are ignored). Returns 0 or CN_ENOMEM. */
int cn_stopseq_add(cn_stopseq *m, const char *s);
void cn_stopseq_free(cn_stopseq *m);

/* Feeds text[0, n). *out and *out_len receive the bytes now certain (valid until the next call).
 * Returns 1 when a stop string matched (out holds the text before it), 0 otherwise, CN_ENOMEM. */
int cn_stopseq_feed(cn_stopseq *m, const char *text, size_t n, const char **out, size_t *out_len);
/* The held tail, at the end of the stream (never a match: it was only a prefix). */
void cn_stopseq_flush(cn_stopseq *m, const char **out, size_t *out_len);

#endif
