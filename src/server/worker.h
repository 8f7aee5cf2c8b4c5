/* worker.h - the request queue and the engine threads that drain it in arrival order, one per
 * engine lane (cn_engine_opts.lanes, `--parallel`).
 *
 * Every HTTP connection hands its job here and waits on the job's channel. It promises:
 *   (1) Jobs start in the order they were pushed, each exactly once, as many at a time as the
 *       engine has lanes (each lane's thread runs one job at a time).
 *   (2) At most max_queue jobs wait (the running ones not counted); a push beyond that fails with
 *       CN_EBUSY and the job is untouched (the handler answers 503).
 *   (3) A job whose client left while it waited is dropped without touching the engine.
 *   (4) Cancel policy of a running job whose client left: during decode, at once; during prefill,
 *       it keeps absorbing the prompt into the prefix cache while no other job waits and for at
 *       most finish_cancelled_s seconds after the client left (0: at once), so a retry finds the
 *       prompt done; a job that arrives meanwhile makes it stop at its next chunk boundary, and
 *       does not start until it has closed into the cache (even with a lane free), so a retry
 *       resumes from exactly there.
 *   (5) cn_worker_stop cancels the running jobs, drops the waiting ones (their clients get an
 *       error frame) and joins the threads; no job is left referenced.
 * It never parses, never formats and never touches a socket.
 */
#ifndef CN_WORKER_H
#define CN_WORKER_H

#include <pthread.h>

#include "engine/engine.h"
#include "server/job.h"

typedef struct cn_worker {
    cn_engine *engine; /* not owned */
    int max_queue;
    double finish_cancelled_s;
    int test_delay_ms;        /* TESTS ONLY (CAIRN_TEST_FORWARD_DELAY_MS): a pause between forwards,
                               * so queueing tests do not depend on how fast the machine is */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cn_job **q;      /* ring of waiting jobs, [max_queue] */
    int head, count;
    int lanes;       /* the engine's: threads, and running slots */
    cn_job **running; /* [lanes] referenced while it runs in that lane, else NULL */
    int held;        /* jobs taken from the queue that wait for an abandoned prefill to close (4) */
    int stopping;
    pthread_t *threads; /* [lanes] */
    int n_started;
    int started;
    long completed;  /* jobs finished (any way), for /api/ps and tests */
} cn_worker;

/* Starts one thread per engine lane. Returns 0, CN_ENOMEM, or CN_EINVAL (max_queue < 1). */
int cn_worker_start(cn_worker *w, cn_engine *e, int max_queue, double finish_cancelled_s);
void cn_worker_stop(cn_worker *w);

/* Queues j (takes a reference of its own on success). Returns 0, CN_EBUSY (queue full) or
 * CN_ECANCELED (stopping). *position: jobs ahead of it, the running ones included. */
int cn_worker_push(cn_worker *w, cn_job *j, int *position);

/* Jobs waiting (not the running ones). */
int cn_worker_waiting(cn_worker *w);
/* Jobs running (0 when idle). */
int cn_worker_busy(cn_worker *w);

#endif
