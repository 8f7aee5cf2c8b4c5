/* chan.h - a one-writer, one-reader byte channel between the engine worker and an HTTP connection.
 *
 * The worker appends response bytes (NDJSON lines, SSE events, a JSON body) as the request runs; the
 * connection's thread drains them into the socket. It promises:
 *   (1) Bytes come out in the order they went in, each exactly once.
 *   (2) The reader learns of the end (cn_chan_close) only after every byte before it was read.
 *   (3) Once the reader abandons the channel (client gone), writes are dropped and report
 *       CN_ECANCELED, so the worker notices at its next write as well as at its next cancel poll.
 * It never blocks the writer (the buffer grows; a response is at most what one request generates)
 * and never touches a socket.
 */
#ifndef CN_CHAN_H
#define CN_CHAN_H

#include <pthread.h>
#include <stddef.h>

typedef struct cn_chan {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled on every write, close and abandon */
    char *buf;         /* unread bytes are buf[head, len) */
    size_t head, len, cap;
    int closed;    /* the writer is done */
    int abandoned; /* the reader is gone */
} cn_chan;

/* Returns 0 or CN_ENOMEM (nothing held). */
int cn_chan_init(cn_chan *c);
void cn_chan_free(cn_chan *c);

/* Appends n bytes. Returns 0, CN_ECANCELED (reader gone: dropped), CN_ENOMEM (dropped). */
int cn_chan_write(cn_chan *c, const void *p, size_t n);
/* Appends a NUL-terminated string; as cn_chan_write. */
int cn_chan_puts(cn_chan *c, const char *s);
/* Marks the end of the stream; later writes are dropped with CN_EINVAL. */
void cn_chan_close(cn_chan *c);
/* Marks the reader gone; pending and later bytes are dropped. */
void cn_chan_abandon(cn_chan *c);
/* Whether cn_chan_abandon was called. */
int cn_chan_is_abandoned(cn_chan *c);

/* Waits up to timeout_ms for bytes. Returns the count copied into dst (1..max), 0 on timeout with
 * nothing to read, or -1 at the end (closed and drained). */
long cn_chan_read(cn_chan *c, char *dst, size_t max, int timeout_ms);

#endif
