/* Memory read bandwidth, the bound for decode (each token streams every
 * active weight once): N threads xor-read disjoint slices of a buffer far
 * larger than the last-level cache; best of several passes, in GB/s.
 * Built and run by bench_decode.sh: membw [MB] [threads]. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t out;
} job;

static void *reader(void *arg)
{
    job *j = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        a ^= j->p[i];
        b ^= j->p[i + 1];
        c ^= j->p[i + 2];
        d ^= j->p[i + 3];
    }
    j->out = a ^ b ^ c ^ d;
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t mb = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    int nt = argc > 2 ? atoi(argv[2]) : 2;
    if (mb < 64 || nt < 1 || nt > 256) {
        fprintf(stderr, "usage: membw [MB >= 64] [threads 1..256]\n");
        return 2;
    }
    size_t n = mb * 1024 * 1024 / 8;
    uint64_t *buf = malloc(n * 8);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %zu MB\n", mb);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        pthread_t th[256];
        job jobs[256];
        double t0 = now();
        for (int t = 0; t < nt; t++) {
            jobs[t] = (job){ buf + n / nt * t, n / nt, 0 };
            pthread_create(&th[t], NULL, reader, &jobs[t]);
        }
        for (int t = 0; t < nt; t++) {
            pthread_join(th[t], NULL);
            sink ^= jobs[t].out;
        }
        double gbs = (double)(n / nt * nt * 8) / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.2f\n", best);
    fprintf(stderr, "membw: %zu MB, %d threads, best of 5: %.2f GB/s (checksum %llx)\n", mb, nt, best,
            (unsigned long long)sink);
    free(buf);
    return 0;
}
