/* chan.c - the worker-to-connection byte channel; see chan.h. */
#include "server/chan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

int cn_chan_init(cn_chan *c) {
    memset(c, 0, sizeof *c);
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca)) return CN_ENOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* timeouts immune to clock changes */
    int bad = pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (bad) return CN_ENOMEM;
    if (pthread_mutex_init(&c->mu, NULL)) {
        pthread_cond_destroy(&c->cv);
        return CN_ENOMEM;
    }
    return CN_OK;
}

void cn_chan_free(cn_chan *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->buf);
    c->buf = NULL;
}

int cn_chan_write(cn_chan *c, const void *p, size_t n) {
    int rc = CN_OK;
    pthread_mutex_lock(&c->mu);
    if (c->abandoned) {
        rc = CN_ECANCELED;
        goto out;
    }
    if (c->closed) {
        rc = CN_EINVAL;
        goto out;
    }
    if (c->head == c->len) c->head = c->len = 0; /* drained: reuse from the start */
    if (c->len + n > c->cap) {
        if (c->head > 0) { /* compact before growing */
            memmove(c->buf, c->buf + c->head, c->len - c->head);
            c->len -= c->head;
            c->head = 0;
        }
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < c->len + n) cap *= 2;
        if (cap != c->cap) {
            char *nb = realloc(c->buf, cap);
            if (!nb) {
                rc = CN_ENOMEM;
                goto out;
            }
            c->buf = nb;
            c->cap = cap;
        }
    }
    memcpy(c->buf + c->len, p, n);
    c->len += n;
    pthread_cond_broadcast(&c->cv);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int cn_chan_puts(cn_chan *c, const char *s) { return cn_chan_write(c, s, strlen(s)); }

void cn_chan_close(cn_chan *c) {
    pthread_mutex_lock(&c->mu);
    c->closed = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void cn_chan_abandon(cn_chan *c) {
    pthread_mutex_lock(&c->mu);
    c->abandoned = 1;
    c->head = c->len = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

int cn_chan_is_abandoned(cn_chan *c) {
    pthread_mutex_lock(&c->mu);
    int a = c->abandoned;
    pthread_mutex_unlock(&c->mu);
    return a;
}

long cn_chan_read(cn_chan *c, char *dst, size_t max, int timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    long got = 0;
    pthread_mutex_lock(&c->mu);
    while (c->head == c->len && !c->closed && !c->abandoned) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT) break;
    }
    if (c->head < c->len) {
        size_t n = c->len - c->head < max ? c->len - c->head : max;
        memcpy(dst, c->buf + c->head, n);
        c->head += n;
        got = (long)n;
    } else if (c->closed || c->abandoned) {
        got = -1;
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}
