/* Thread pool: spin-then-futex workers, dynamic chunking via one atomic.
 *
 * Protocol. The caller publishes a job (fn, ctx, chunking), sets `pending`
 * to the number of workers, then bumps `gen`. Workers wait for `gen` to
 * change (spinning, then FUTEX_WAIT on it), grab chunks from `next` until
 * none are left, and decrement `pending`; the caller grabs chunks too, then
 * waits for `pending` to reach 0 (spinning, then FUTEX_WAIT on it). futex
 * wakes are only issued when somebody announced it is about to sleep, so a
 * busy decode loop makes no system calls at all. All shared fields are
 * seq_cst atomics: the sleeper-count handshake relies on that ordering. */
#include "sanctum/threadpool.h"
#include "sanctum/cpu.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* ~50-200 us of pause instructions: longer than the gap between two ops of
 * a decode step, short enough not to burn a shared core while idle. */
#define SPIN_ITERS 4096

typedef struct {
    sn_pool *pool;
    int tid;
    pthread_t th;
} worker;

struct sn_pool {
    int n;                    /* threads including the caller */
    worker *w;                /* n-1 workers */
    pthread_mutex_t call_lock;

    /* current job */
    sn_pool_fn fn;
    void *ctx;
    int64_t total, chunk, n_chunks;

    _Atomic uint32_t gen;     /* futex word: job generation */
    _Atomic int32_t sleepers; /* workers inside FUTEX_WAIT on gen (or about to be) */
    _Atomic int64_t next;     /* next chunk index */
    _Atomic int32_t pending;  /* futex word: workers not done with this job */
    _Atomic int32_t caller_sleeping;
    _Atomic int32_t stop;
};

static _Thread_local sn_pool *t_inside; /* pool whose body this thread is running */
static _Thread_local int t_tid;          /* its tid in that pool */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

static void run_chunks(sn_pool *p, int tid)
{
    for (;;) {
        int64_t c = atomic_fetch_add(&p->next, 1);
        if (c >= p->n_chunks)
            break;
        int64_t b = c * p->chunk;
        int64_t e = b + p->chunk < p->total ? b + p->chunk : p->total;
        p->fn(p->ctx, b, e, tid);
    }
}

static void *worker_main(void *arg)
{
    worker *me = arg;
    sn_pool *p = me->pool;
    t_inside = p;
    t_tid = me->tid;
    /* Not a load of gen: a worker that starts late must still see the
     * first job, which may already be published. gen starts at 0. */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load(&p->gen)) == seen) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            futex(&p->gen, FUTEX_WAIT_PRIVATE, seen); /* returns at once if gen moved */
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop))
            break;
        run_chunks(p, me->tid);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping))
            futex((_Atomic uint32_t *)&p->pending, FUTEX_WAKE_PRIVATE, 1);
    }
    return NULL;
}

static void publish(sn_pool *p)
{
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0)
        futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
}

sn_status sn_pool_new(int n_threads, sn_pool **out)
{
    *out = NULL;
    if (n_threads <= 0)
        n_threads = sn_cpu_features_get()->n_cores;
    if (n_threads > 1024)
        return SN_FAIL(SN_E_INVALID, "threads=%d: at most 1024", n_threads);
    sn_pool *p = calloc(1, sizeof *p);
    if (!p)
        return SN_FAIL(SN_E_NOMEM, "thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->call_lock, NULL);
    if (n_threads > 1) {
        p->w = calloc((size_t)n_threads - 1, sizeof *p->w);
        if (!p->w) {
            sn_pool_free(p);
            return SN_FAIL(SN_E_NOMEM, "thread pool workers");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->w[i].pool = p;
        p->w[i].tid = i + 1;
        int rc = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
        if (rc != 0) {
            p->n = i + 1; /* only join what was started */
            sn_pool_free(p);
            return SN_FAIL(SN_E_NOMEM, "thread pool: starting thread %d of %d: %s", i + 1, n_threads,
                           strerror(rc));
        }
    }
    *out = p;
    return SN_OK;
}

void sn_pool_free(sn_pool *p)
{
    if (!p)
        return;
    if (p->w) {
        atomic_store(&p->stop, 1);
        publish(p);
        for (int i = 0; i < p->n - 1; i++)
            pthread_join(p->w[i].th, NULL);
        free(p->w);
    }
    pthread_mutex_destroy(&p->call_lock);
    free(p);
}

int sn_pool_size(const sn_pool *p) { return p ? p->n : 1; }

void sn_pool_for(sn_pool *p, int64_t n, int64_t grain, sn_pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain <= 0)
        grain = 1;
    /* About 4 chunks per thread balances uneven cores without making the
     * atomic counter a hot spot. */
    int64_t chunk = p ? (n + (int64_t)p->n * 4 - 1) / ((int64_t)p->n * 4) : n;
    if (chunk < grain)
        chunk = grain;
    int64_t n_chunks = (n + chunk - 1) / chunk;
    if (!p || p->n == 1 || n_chunks == 1 || t_inside == p) {
        fn(ctx, 0, n, p && t_inside == p ? t_tid : 0);
        return;
    }
    pthread_mutex_lock(&p->call_lock);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->chunk = chunk;
    p->n_chunks = n_chunks;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n - 1);
    publish(p);

    t_inside = p;
    t_tid = 0;
    run_chunks(p, 0);
    t_inside = NULL;

    int32_t left;
    int spins = 0;
    while ((left = atomic_load(&p->pending)) != 0) {
        if (++spins < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        atomic_store(&p->caller_sleeping, 1);
        futex((_Atomic uint32_t *)&p->pending, FUTEX_WAIT_PRIVATE, (uint32_t)left);
        atomic_store(&p->caller_sleeping, 0);
        spins = 0;
    }
    pthread_mutex_unlock(&p->call_lock);
}
