/* peers.h - the server's open connections and the deadline on each request's headers.
 *
 * libmicrohttpd times a connection out only after a stretch of silence, so a client that sends its
 * headers one byte a second (or holds a keep-alive connection open and sends nothing) would keep a
 * connection thread forever. This table gives every connection a deadline instead: from the moment
 * it is ready for a request (opened, or its last response done) until that request's headers are
 * complete, at most timeout_s. A connection past it is shut down (shutdown(2), both directions),
 * which makes libmicrohttpd's own thread see the end of the stream and close it the usual way.
 * It promises:
 *   (1) A connection in the table is shut down at most once, and only while its request is still
 *       unread: never while a request is being answered or streamed.
 *   (2) cn_peers_remove takes the connection out before its socket is closed (libmicrohttpd calls
 *       it first), and the reaper holds the lock across its shutdown(2), so a socket number is
 *       never shut down after it was closed and perhaps reused.
 *   (3) cn_peers_stop joins the reaper and frees every entry still there.
 * It never reads or writes a socket's bytes and never closes one.
 */
#ifndef CN_PEERS_H
#define CN_PEERS_H

#include <pthread.h>

typedef struct cn_peer cn_peer; /* one open connection; layout: peers.c */

typedef struct cn_peers {
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* wakes the reaper early when stopping */
    cn_peer *head;        /* every open connection, under mu */
    double timeout_ms;    /* the deadline; <= 0: none (no reaper runs) */
    long reaped;          /* connections shut down for missing the deadline, for tests and logs */
    int stopping;
    int started;          /* the reaper thread runs */
    pthread_t reaper;
} cn_peers;

/* Starts the table (and the reaper when timeout_s > 0). Returns 0 or a CN_E code. */
int cn_peers_start(cn_peers *p, double timeout_s);
void cn_peers_stop(cn_peers *p);

/* A connection opened on socket fd: ready for its first request now. NULL without memory (the
 * connection then simply has no deadline). */
cn_peer *cn_peers_add(cn_peers *p, int fd);
/* Its socket is about to be closed. NULL is a no-op. */
void cn_peers_remove(cn_peers *p, cn_peer *c);
/* Its request's headers are complete (busy = 1), or its response is done and it waits for the
 * next request (busy = 0: the deadline starts again). NULL is a no-op. */
void cn_peers_busy(cn_peers *p, cn_peer *c, int busy);
/* Connections shut down so far for missing the deadline. */
long cn_peers_reaped(cn_peers *p);

#endif
