/* worker.c - FIFO queue and the engine threads, one per lane; see worker.h. */
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

/* Jobs running (caller holds mu). */
static int running(const cn_worker *w) {
    int n = 0;
    for (int k = 0; k < w->lanes; k++) n += w->running[k] != NULL;
    return n;
}

int cn_worker_busy(cn_worker *w) {
    pthread_mutex_lock(&w->mu);
    int b = running(w);
    pthread_mutex_unlock(&w->mu);
    return b;
}

/* A running job whose client left while it absorbs its prompt (caller holds mu): what policy (4)
 * lets a newly arrived job wait for. */
static int abandoned_prefill(const cn_worker *w) {
    for (int k = 0; k < w->lanes; k++)
        if (w->running[k] && cn_job_gone_at(w->running[k]) > 0 &&
            cn_job_get_state(w->running[k]) == CN_JOB_PREFILL)
            return 1;
    return 0;
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
    int stopping = c->w->stopping, waiting = c->w->count + c->w->held;
    pthread_mutex_unlock(&c->w->mu);
    if (stopping) return 1;
    double gone = cn_job_gone_at(c->j);
    if (gone == 0) return 0;
    if (cn_job_get_state(c->j) != CN_JOB_PREFILL) return 1;
    if (waiting > 0) return 1;
    return cn_now_ms() - gone >= c->w->finish_cancelled_s * 1e3;
}

/* (5): a job that will never run: its connection gets an error frame and the end; the queue's
 * reference goes. */
static void drop_unrun(cn_job *j) {
    cn_api_ops_for(j->api)->final(j, CN_ECANCELED);
    cn_job_set_state(j, CN_JOB_CANCELED);
    cn_chan_close(&j->chan);
    cn_job_unref(j);
}

typedef struct lane_arg {
    cn_worker *w;
    int lane;
} lane_arg;

static void *worker_main(void *arg) {
    cn_worker *w = ((lane_arg *)arg)->w;
    const int lane = ((lane_arg *)arg)->lane;
    free(arg);
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
        /* (4): an abandoned prompt stops at its next chunk and closes into the cache first */
        w->held++;
        while (abandoned_prefill(w) && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        w->held--;
        if (w->stopping) { /* (5), as for the jobs still queued */
            pthread_mutex_unlock(&w->mu);
            drop_unrun(j);
            break;
        }
        w->running[lane] = j;
        pthread_mutex_unlock(&w->mu);

        if (cn_job_gone_at(j) > 0) { /* (3): nobody waits for it */
            cn_log(CN_LOG_INFO, "request %s: client left while queued; dropped", j->id);
            cn_job_set_state(j, CN_JOB_CANCELED);
            cn_chan_close(&j->chan);
        } else {
            cancel_ctx cc = {w, j};
            cn_job_run(j, w->engine, lane, should_cancel, &cc);
        }
        pthread_mutex_lock(&w->mu);
        w->running[lane] = NULL;
        w->completed++;
        pthread_cond_broadcast(&w->cv); /* a held job may start */
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
    w->lanes = e->o.lanes > 0 ? e->o.lanes : 1;
    w->q = calloc((size_t)max_queue, sizeof *w->q);
    w->running = calloc((size_t)w->lanes, sizeof *w->running);
    w->threads = calloc((size_t)w->lanes, sizeof *w->threads);
    if (!w->q || !w->running || !w->threads) {
        free(w->q);
        free(w->running);
        free(w->threads);
        return CN_ENOMEM;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->started = 1;
    for (int k = 0; k < w->lanes; k++) {
        lane_arg *a = malloc(sizeof *a);
        if (a) *a = (lane_arg){w, k};
        if (!a || pthread_create(&w->threads[k], NULL, worker_main, a)) {
            free(a);
            cn_worker_stop(w);
            return CN_ENOMEM;
        }
        w->n_started++;
    }
    return CN_OK;
}

void cn_worker_stop(cn_worker *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (int k = 0; k < w->n_started; k++) pthread_join(w->threads[k], NULL);
    /* (5): the waiting jobs never run; their connections see an error frame and the end */
    for (int i = 0; i < w->count; i++) drop_unrun(w->q[(w->head + i) % w->max_queue]);
    w->count = 0;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->q);
    free(w->running);
    free(w->threads);
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
        if (position) *position = w->count - 1 + running(w);
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}
