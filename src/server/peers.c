/* peers.c - open connections and their header deadlines; see peers.h. */
#include "server/peers.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "base/error.h"
#include "base/log.h"

struct cn_peer {
    int fd;
    double ready_at; /* monotonic ms it began waiting for a request's headers; 0: busy */
    int shut;        /* shut down already: (1) */
    cn_peer *prev, *next;
};

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Wakes four times a deadline (at most every 250 ms), so a connection is shut within a quarter of
 * the timeout past it. */
static void *reaper(void *arg) {
    cn_peers *p = arg;
    double tick = p->timeout_ms / 4 < 250 ? p->timeout_ms / 4 : 250;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long ns = ts.tv_nsec + (long)(tick * 1e6);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        int rc = pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (rc && rc != ETIMEDOUT) break;
        double now = mono_ms();
        for (cn_peer *c = p->head; c; c = c->next)
            if (!c->shut && c->ready_at > 0 && now - c->ready_at > p->timeout_ms) {
                c->shut = 1;
                p->reaped++;
                shutdown(c->fd, SHUT_RDWR); /* under mu: (2) */
                cn_log(CN_LOG_INFO, "connection closed: no complete request headers within %.0f s",
                       p->timeout_ms / 1e3);
            }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int cn_peers_start(cn_peers *p, double timeout_s) {
    p->head = NULL;
    p->timeout_ms = timeout_s * 1e3;
    p->reaped = 0;
    p->stopping = 0;
    p->started = 0;
    if (pthread_mutex_init(&p->mu, NULL)) return CN_ENOMEM;
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (!rc) rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc) {
        pthread_mutex_destroy(&p->mu);
        return CN_ENOMEM;
    }
    if (p->timeout_ms > 0) {
        if (pthread_create(&p->reaper, NULL, reaper, p)) {
            pthread_cond_destroy(&p->cv);
            pthread_mutex_destroy(&p->mu);
            return CN_ENOMEM;
        }
        p->started = 1;
    }
    return CN_OK;
}

void cn_peers_stop(cn_peers *p) {
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->started) pthread_join(p->reaper, NULL);
    p->started = 0;
    while (p->head) {
        cn_peer *c = p->head;
        p->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

cn_peer *cn_peers_add(cn_peers *p, int fd) {
    cn_peer *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    c->ready_at = mono_ms();
    pthread_mutex_lock(&p->mu);
    c->next = p->head;
    if (p->head) p->head->prev = c;
    p->head = c;
    pthread_mutex_unlock(&p->mu);
    return c;
}

void cn_peers_remove(cn_peers *p, cn_peer *c) {
    if (!c) return;
    pthread_mutex_lock(&p->mu);
    if (c->prev) c->prev->next = c->next;
    else p->head = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&p->mu);
    free(c);
}

void cn_peers_busy(cn_peers *p, cn_peer *c, int busy) {
    if (!c) return;
    pthread_mutex_lock(&p->mu);
    c->ready_at = busy ? 0 : mono_ms();
    pthread_mutex_unlock(&p->mu);
}

long cn_peers_reaped(cn_peers *p) {
    pthread_mutex_lock(&p->mu);
    long n = p->reaped;
    pthread_mutex_unlock(&p->mu);
    return n;
}
