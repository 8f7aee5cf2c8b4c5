/* threadpool.h - a fixed pool of worker threads running one parallel loop at a time.
 *
 * cn_pool_for(pool, n, fn, ctx) splits [0, n) into contiguous ranges, calls fn(ctx, begin, end) on
 * the workers and the calling thread, and returns when every range is done. It never allocates
 * after creation. A NULL pool or a pool of one thread runs fn(ctx, 0, n) inline. One loop at a
 * time per pool: callers serialize (the backend that owns the pool does).
 */
#ifndef CN_THREADPOOL_H
#define CN_THREADPOOL_H

typedef struct cn_pool cn_pool;

typedef void (*cn_pool_fn)(void *ctx, int begin, int end);

/* Creates a pool of n_threads (the caller counts as one). NULL on allocation failure. */
cn_pool *cn_pool_create(int n_threads);
void cn_pool_free(cn_pool *pool);
int cn_pool_size(const cn_pool *pool);
/* Runs fn over [0, n) split in ranges of at least `grain` items, claimed in order, each a
 * 2 n_threads-th of the items left (long ranges first, the last ones `grain` long). */
void cn_pool_for(cn_pool *pool, int n, int grain, cn_pool_fn fn, void *ctx);

#endif
