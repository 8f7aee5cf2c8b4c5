/* worker.c - FIFO queue and the engine thread; see worker.h. */
#include "server/worker.h"

#include <time.h>

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "server/api.h"

int cn_worker_waiting(cn_worker *w) {
    pthread_mutex_lock(&w->mu);
    int n = w->count;
    pthread_mutex_unlock(&w->mu);
    return n;
}

int cn_worker_busy(cn_worker *w) {
    pthread_mutex_lock(&w->mu);
    int b = w->running != NULL;
    pthread_mutex_unlock(&w->mu);
    return b;
}

typedef struct cancel_ctx {
    cn_worker *w;
    cn_job *j;
} cancel_ctx;

/* The policy of (4): a gone client cancels now, unless its prefill may finish in idle time. */
static int should_cancel(void *ctx) {
    cancel_ctx *c = ctx;
    if (c->w->test_delay_ms > 0) {
        struct timespec ts = {c->w->test_delay_ms / 1000, (long)(c->w->test_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&c->w->mu);
    int stopping = c->w->stopping, waiting = c->w->count;
    pthread_mutex_unlock(&c->w->mu);
    if (stopping) return 1;
    double gone = cn_job_gone_at(c->j);
    if (gone == 0) return 0;
    if (cn_job_get_state(c->j) != CN_JOB_PREFILL) return 1;
    if (waiting > 0) return 1;
    return cn_now_ms() - gone >= c->w->finish_cancelled_s * 1e3;
}

static void *worker_main(void *arg) {
    cn_worker *w = arg;
    int maintain = 0; /* 1 while the cache has eviction work left from earlier requests */
    for (;;) {
        pthread_mutex_lock(&w->mu);
        /* Idle: the cache's leftover eviction in small steps, a request arriving in between
         * waits for one step at most. */
        while (maintain && !w->count && !w->stopping) {
            pthread_mutex_unlock(&w->mu);
            maintain = cn_engine_maintain(w->engine, 2);
            pthread_mutex_lock(&w->mu);
        }
        while (!w->count && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stopping) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        cn_job *j = w->q[w->head];
        w->head = (w->head + 1) % w->max_queue;
        w->count--;
        w->running = j;
        pthread_mutex_unlock(&w->mu);

        if (cn_job_gone_at(j) > 0) { /* (3): nobody waits for it */
            cn_log(CN_LOG_INFO, "request %s: client left while queued; dropped", j->id);
            cn_job_set_state(j, CN_JOB_CANCELED);
            cn_chan_close(&j->chan);
        } else {
            cancel_ctx cc = {w, j};
            cn_job_run(j, w->engine, should_cancel, &cc);
        }
        pthread_mutex_lock(&w->mu);
        w->running = NULL;
        w->completed++;
        pthread_mutex_unlock(&w->mu);
        cn_job_unref(j);
        maintain = 1;
    }
    return NULL;
}

int cn_worker_start(cn_worker *w, cn_engine *e, int max_queue, double finish_cancelled_s) {
    memset(w, 0, sizeof *w);
    if (max_queue < 1) return CN_EINVAL;
    w->engine = e;
    w->max_queue = max_queue;
    w->finish_cancelled_s = finish_cancelled_s;
    const char *d = getenv("CAIRN_TEST_FORWARD_DELAY_MS");
    w->test_delay_ms = d ? atoi(d) : 0;
    if (w->test_delay_ms < 0 || w->test_delay_ms > 1000) w->test_delay_ms = 0;
    if (!(w->q = calloc((size_t)max_queue, sizeof *w->q))) return CN_ENOMEM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w->q);
        return CN_ENOMEM;
    }
    w->started = 1;
    return CN_OK;
}

void cn_worker_stop(cn_worker *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    /* (5): the waiting jobs never run; their connections see an error frame and the end */
    for (int i = 0; i < w->count; i++) {
        cn_job *j = w->q[(w->head + i) % w->max_queue];
        cn_api_ops_for(j->api)->final(j, CN_ECANCELED);
        cn_job_set_state(j, CN_JOB_CANCELED);
        cn_chan_close(&j->chan);
        cn_job_unref(j);
    }
    w->count = 0;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->q);
    w->started = 0;
}

int cn_worker_push(cn_worker *w, cn_job *j, int *position) {
    pthread_mutex_lock(&w->mu);
    int rc = CN_OK;
    if (w->stopping) rc = CN_ECANCELED;
    else if (w->count >= w->max_queue) rc = CN_EBUSY;
    else {
        cn_job_ref(j);
        w->q[(w->head + w->count) % w->max_queue] = j;
        w->count++;
        if (position) *position = w->count - 1 + (w->running != NULL);
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}
