/* stride_read: the read rate of two threads streaming 1 KB rows that are
 * contiguous against rows laid out as a KV cache with two kv heads keeps
 * them (each thread reads one head's rows: 1 KB, then the other head's 1 KB
 * skipped). The CPU attention read its cache that way, a kv head a work
 * item (decode until 82c2f52; prefill still does; docs/PERFORMANCE.md,
 * "This VM since 2026-12-07 (evening)"); this says what the layout alone
 * costs, without the attention's arithmetic.
 *
 *   cc -O2 -mavx512f -pthread -o /tmp/stride_read bench/stride_read.c && /tmp/stride_read
 *
 * Prints useful bytes per second (each byte read once), three runs a layout. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROW = 1024, THREADS = 2 };
static const size_t TOTAL = (size_t)512 << 20;
static char *buf;
static int interleaved;

typedef struct {
    int tid;
    float sink;
} arg;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *reader(void *p)
{
    arg *a = p;
    __m512 acc = _mm512_setzero_ps();
    const size_t rows = TOTAL / ((size_t)THREADS * ROW); /* rows a thread */
    for (size_t r = 0; r < rows; r++) {
        /* contiguous: thread t reads its half in order; interleaved: row r of
         * head t sits at (r * THREADS + t) * ROW */
        const size_t off = interleaved ? (r * THREADS + (size_t)a->tid) * ROW : ((size_t)a->tid * rows + r) * ROW;
        const float *x = (const float *)(buf + off);
        for (int i = 0; i < ROW / 4; i += 16)
            acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
    }
    a->sink = _mm512_reduce_add_ps(acc);
    return NULL;
}

int main(void)
{
    buf = aligned_alloc(4096, TOTAL);
    if (!buf) {
        fprintf(stderr, "stride_read: cannot allocate %zu MB\n", TOTAL >> 20);
        return 1;
    }
    memset(buf, 1, TOTAL);
    for (interleaved = 0; interleaved < 2; interleaved++)
        for (int rep = 0; rep < 3; rep++) {
            pthread_t th[THREADS];
            arg a[THREADS];
            const double t0 = now();
            for (int i = 0; i < THREADS; i++) {
                a[i].tid = i;
                pthread_create(&th[i], NULL, reader, &a[i]);
            }
            for (int i = 0; i < THREADS; i++)
                pthread_join(th[i], NULL);
            printf("%s: %.1f GB/s\n", interleaved ? "1 KB rows of two heads interleaved, a thread per head"
                                                  : "contiguous, a half per thread",
                   (double)TOTAL / (now() - t0) / 1e9);
        }
    free(buf);
    return 0;
}
