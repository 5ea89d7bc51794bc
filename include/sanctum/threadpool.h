/* A fixed pool of worker threads running parallel-for loops.
 *
 * Decode issues hundreds of small parallel-fors per token, so a call costs
 * no allocation and, while the workers are still spinning from the previous
 * call, no system call: workers spin briefly on a generation counter before
 * they sleep on a futex. The calling thread takes part in the work.
 *
 * One parallel-for runs at a time per pool (calls from several threads are
 * serialised); a call made from inside a running body runs inline on the
 * calling worker, so nesting is safe but not parallel. */
#ifndef SANCTUM_THREADPOOL_H
#define SANCTUM_THREADPOOL_H

#include <stdint.h>

#include "sanctum/status.h"

typedef struct sn_pool sn_pool;

/* Body of a parallel-for: handle [begin, end). tid in [0, n_threads) names
 * the thread running it (the caller is 0), for per-thread scratch. */
typedef void (*sn_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads <= 0: one per CPU this process may run on. */
sn_status sn_pool_new(int n_threads, sn_pool **out);
void sn_pool_free(sn_pool *p);
int sn_pool_size(const sn_pool *p);

/* Run fn over [0, n) split into chunks of at least `grain` items (grain <= 0
 * means 1), handed out dynamically; returns when every chunk is done. */
void sn_pool_for(sn_pool *p, int64_t n, int64_t grain, sn_pool_fn fn, void *ctx);

#endif
