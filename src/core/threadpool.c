/* Thread pool: spin-then-futex workers, dynamic chunking, completion by
 * chunk count.
 *
 * Protocol. A job's claim word `next` packs [seq:24 | n_chunks:20 | idx:20].
 * The caller writes the job fields (fn, ctx, chunking), resets `done`,
 * stores the claim word with the new seq and idx 0, then bumps `gen` (the
 * futex word workers sleep on). Anyone (workers and the caller) claims a
 * chunk by CAS on `next`, which only succeeds while the word still carries
 * the seq it read and idx < n_chunks; after a successful claim the job
 * fields are stable until that chunk is counted in `done`. The caller
 * returns when `done` reaches n_chunks. So the caller never waits for a
 * worker that has not woken up yet (on an oversubscribed machine that
 * wait is a scheduler quantum), and a worker that wakes late for a finished
 * job fails its CAS without ever reading the fields being rewritten.
 *
 * Workers spin briefly before they sleep; futex wakes are only issued when
 * somebody announced it is about to sleep, so a busy decode loop makes no
 * system calls. All shared fields are seq_cst atomics: the sleeper-count
 * handshakes rely on that ordering. */
#include "sanctum/threadpool.h"
#include "sanctum/cpu.h"

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

#define SEQ_BITS 24
#define CNT_BITS 20
#define MAX_CHUNKS ((1 << CNT_BITS) - 1)
#define SEQ_MASK ((1u << SEQ_BITS) - 1)

typedef struct {
    sn_pool *pool;
    int tid;
    pthread_t th;
} worker;

struct sn_pool {
    int n;                    /* threads including the caller */
    worker *w;                /* n-1 workers */
    pthread_mutex_t call_lock;

    /* current job: written before its claim word is published */
    sn_pool_fn fn;
    void *ctx;
    int64_t total, chunk;

    _Atomic uint64_t next;    /* claim word [seq | n_chunks | idx] */
    _Atomic uint32_t done;    /* futex word: chunks finished in this job */
    _Atomic uint32_t gen;     /* futex word: bumped once per job */
    _Atomic int32_t sleepers; /* workers inside FUTEX_WAIT on gen (or about to be) */
    _Atomic int32_t caller_sleeping;
    _Atomic int32_t stop;
};

static _Thread_local sn_pool *t_inside; /* pool whose body this thread is running */
static _Thread_local int t_tid;          /* its tid in that pool */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

static inline uint64_t claim_word(uint32_t seq, uint32_t n_chunks, uint32_t idx)
{
    return ((uint64_t)(seq & SEQ_MASK) << (2 * CNT_BITS)) | ((uint64_t)n_chunks << CNT_BITS) | idx;
}

/* Claim and run chunks of job `seq` until none are left. */
static void run_chunks(sn_pool *p, uint32_t seq, int tid)
{
    uint64_t cur = atomic_load(&p->next);
    for (;;) {
        if ((uint32_t)(cur >> (2 * CNT_BITS)) != (seq & SEQ_MASK))
            return; /* a later (or earlier) job: not ours */
        uint32_t n_chunks = (uint32_t)(cur >> CNT_BITS) & MAX_CHUNKS, idx = (uint32_t)cur & MAX_CHUNKS;
        if (idx >= n_chunks)
            return;
        if (!atomic_compare_exchange_weak(&p->next, &cur, cur + 1))
            continue; /* cur was reloaded */
        int64_t b = (int64_t)idx * p->chunk;
        int64_t e = b + p->chunk < p->total ? b + p->chunk : p->total;
        p->fn(p->ctx, b, e, tid);
        if (atomic_fetch_add(&p->done, 1) + 1 == n_chunks && atomic_load(&p->caller_sleeping))
            futex(&p->done, FUTEX_WAKE_PRIVATE, 1);
        cur = atomic_load(&p->next);
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
        run_chunks(p, g, me->tid); /* gen == seq of the newest job */
    }
    return NULL;
}

static void wake_workers(sn_pool *p)
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
    atomic_store(&p->next, claim_word(0, 0, 0));
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
        wake_workers(p);
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
     * claim word a hot spot; never more chunks than the word can count.
     * 16 made the 1B synth's decode 11 % slower on 2 vCPUs (each chunk of a
     * GEMV restarts its weight streams), 2 was the same as 4 (2026-12-07,
     * docs/PERFORMANCE.md). */
    int64_t chunk = p ? (n + (int64_t)p->n * 4 - 1) / ((int64_t)p->n * 4) : n;
    if (chunk < grain)
        chunk = grain;
    if ((n + chunk - 1) / chunk > MAX_CHUNKS)
        chunk = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
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
    atomic_store(&p->done, 0);
    /* gen is bumped exactly once per job, so the job's seq is gen's next
     * value: a woken worker runs seq == the gen it saw. */
    uint32_t seq = atomic_load(&p->gen) + 1;
    atomic_store(&p->next, claim_word(seq, (uint32_t)n_chunks, 0));
    wake_workers(p);

    t_inside = p;
    t_tid = 0;
    run_chunks(p, seq, 0);
    t_inside = NULL;

    uint32_t d;
    int spins = 0;
    while ((d = atomic_load(&p->done)) != (uint32_t)n_chunks) {
        if (++spins < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        atomic_store(&p->caller_sleeping, 1);
        futex(&p->done, FUTEX_WAIT_PRIVATE, d);
        atomic_store(&p->caller_sleeping, 0);
        spins = 0;
    }
    pthread_mutex_unlock(&p->call_lock);
}
