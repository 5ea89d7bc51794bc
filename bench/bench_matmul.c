/* bench_matmul: Q4 matrix-vector (decode) throughput of the CPU backend, in
 * GB/s of weight bytes streamed, per kernel level and thread count, against
 * this machine's measured memory read bandwidth (the bound a GEMV cannot
 * beat: every weight byte is read once per token). Goal: >= 60% of it.
 *
 *   build/bench/bench_matmul [--quick] [--no-log] [--threads N] [--T n] [--min-time s] [--isa scalar|avx2|avx512]
 *                            [--huge] [--footprint MB] [--shape RxC] [--group 32|64|128] [--q4 int|fp32|q8]
 *
 * --huge asks for transparent huge pages (MADV_HUGEPAGE) on the weights, as
 * the loader's copy does; --footprint 1 keeps one copy of each shape, which
 * is then read from cache (the kernel's compute bound, not DRAM's), e.g.
 * --footprint 1 --shape 256x2048 --threads 1 (262 KB: in a 512 KB L2).
 *
 * Shapes are Qwen3.5-27B-like decode projections (MLX 4-bit, group 64,
 * bf16 scales): 5120x17408 (up/gate), 17408x5120 (down), 248320x5120
 * (lm_head), each cycled over copies >= 1.5 GB so it streams from DRAM.
 * SANCTUM_CPU_PREFETCH=rows overrides the kernels' prefetch distance.
 * --group sets the quant group (default 64); --q4 fp32 sets
 * SANCTUM_CPU_Q4=fp32, so the AVX2 table's float Q4 kernel (and on an
 * AVX-512 VNNI host the AVX-512 table's) runs instead of its integer one
 * (an A/B in one binary; default int); --q4 q8 sets
 * SANCTUM_CPU_Q4=q8, the opt-in 8-bit activation path (AVX2, or AVX-512
 * with VNNI).
 * Results are appended to bench/results.log with the command. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "sanctum/backend.h"
#include "sanctum/cpu.h"
#include "sanctum/threadpool.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- memory bandwidth: parallel read of a buffer far larger than the LLC ---- */

typedef struct {
    const uint64_t *p;
    uint64_t sums[1024];
} rd_ctx;

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, int64_t n)
{
    /* four independent 256-bit xors: the loads, not the ALU, are the limit */
    typedef long long v4 __attribute__((vector_size(32)));
    v4 a = { 0 }, b = a, c = a, d = a;
    const v4 *v = (const v4 *)p;
    int64_t nv = n / 4, i = 0;
    for (; i + 4 <= nv; i += 4) {
        a ^= v[i];
        b ^= v[i + 1];
        c ^= v[i + 2];
        d ^= v[i + 3];
    }
    v4 s = a ^ b ^ c ^ d;
    return (uint64_t)(s[0] ^ s[1] ^ s[2] ^ s[3]);
}

static uint64_t read_scalar(const uint64_t *p, int64_t n)
{
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (int64_t i = 0; i + 4 <= n; i += 4) {
        a ^= p[i];
        b ^= p[i + 1];
        c ^= p[i + 2];
        d ^= p[i + 3];
    }
    return a ^ b ^ c ^ d;
}

static void rd_body(void *ctx, int64_t b, int64_t e, int tid)
{
    rd_ctx *c = ctx;
    /* items are 4 KiB pages (512 words), aligned for the vector loads */
    const uint64_t *p = c->p + b * 512;
    int64_t n = (e - b) * 512;
    c->sums[tid & 1023] ^= sn_cpu_isa_supported(SN_ISA_AVX2) ? read_avx2(p, n) : read_scalar(p, n);
}

static double measure_read_bw(int threads, size_t bytes)
{
    sn_pool *pool = NULL;
    if (sn_pool_new(threads, &pool) != SN_OK)
        return 0;
    uint64_t *buf = aligned_alloc(4096, bytes);
    if (!buf) {
        sn_pool_free(pool);
        return 0;
    }
    memset(buf, 1, bytes); /* fault the pages in before timing */
    rd_ctx c = { .p = buf };
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        sn_pool_for(pool, (int64_t)(bytes / 4096), 64, rd_body, &c);
        double dt = now() - t0;
        if (bytes / dt > best)
            best = bytes / dt;
    }
    double memcpy_best = 0;
    if (threads == 1) {
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now();
            memcpy(buf, buf + bytes / 16, bytes / 2);
            double dt = now() - t0;
            if (bytes / dt > memcpy_best)
                memcpy_best = bytes / dt; /* read + write of bytes/2 each */
        }
        printf("  memcpy 1 thread: %.1f GB/s (read+write)\n", memcpy_best / 1e9);
    }
    free(buf);
    sn_pool_free(pool);
    return best;
}

/* ---- thread pool: cost of one small parallel-for (decode makes hundreds per token) ---- */

static void nop_body(void *ctx, int64_t b, int64_t e, int tid)
{
    __atomic_fetch_add((int64_t *)ctx, e - b, __ATOMIC_RELAXED);
}

static double pool_overhead_us(int threads)
{
    sn_pool *pool = NULL;
    if (sn_pool_new(threads, &pool) != SN_OK)
        return -1;
    int64_t sink = 0;
    const int iters = 20000;
    sn_pool_for(pool, threads, 1, nop_body, &sink);
    double t0 = now();
    for (int i = 0; i < iters; i++)
        sn_pool_for(pool, threads, 1, nop_body, &sink);
    double dt = now() - t0;
    sn_pool_free(pool);
    return dt / iters * 1e6;
}

/* ---- Q4 weights ---- */

/* A decode step streams every weight once, from DRAM: a matrix that fits
 * the last-level cache (300 MB on some server parts) would be measured
 * from cache if called repeatedly, so the bench cycles through enough
 * copies of each shape to exceed FOOTPRINT bytes. */
static size_t g_footprint = (size_t)1536 << 20; /* --footprint MB: small = weights stay in cache */
static int g_huge;                              /* --huge: MADV_HUGEPAGE on the weight buffers */
#define MAX_COPIES 64

typedef struct {
    sn_weight w[MAX_COPIES];
    int n_copies;
    void *data, *scales, *biases;
    size_t bytes; /* one copy: packed weights + scales + biases */
} qweight;

static int qweight_make(qweight *q, int64_t rows, int64_t cols, int group)
{
    memset(q, 0, sizeof *q);
    size_t dbytes = (size_t)rows * cols / 2, ng = (size_t)rows * (cols / group);
    q->bytes = dbytes + 2 * ng * 2;
    q->n_copies = (int)((g_footprint + q->bytes - 1) / q->bytes);
    if (q->n_copies > MAX_COPIES)
        q->n_copies = MAX_COPIES;
    size_t dstride = (dbytes + 63) & ~(size_t)63;
    size_t huge = (size_t)2 << 20;
    q->data = aligned_alloc(huge, (dstride * q->n_copies + huge - 1) / huge * huge);
    q->scales = aligned_alloc(huge, (ng * 2 * q->n_copies + huge - 1) / huge * huge);
    q->biases = aligned_alloc(huge, (ng * 2 * q->n_copies + huge - 1) / huge * huge);
    if (!q->data || !q->scales || !q->biases)
        return -1;
    if (g_huge) {
        madvise(q->data, (dstride * q->n_copies + huge - 1) / huge * huge, MADV_HUGEPAGE);
        madvise(q->scales, (ng * 2 * q->n_copies + huge - 1) / huge * huge, MADV_HUGEPAGE);
        madvise(q->biases, (ng * 2 * q->n_copies + huge - 1) / huge * huge, MADV_HUGEPAGE);
    }
    uint64_t *d = q->data;
    for (size_t i = 0; i < dstride * q->n_copies / 8; i++)
        d[i] = next64();
    uint16_t *s = q->scales, *b = q->biases;
    for (size_t i = 0; i < ng * q->n_copies; i++) {
        s[i] = 0x3C00 | (uint16_t)(next64() & 0xFF); /* bf16 ~ 0.0078.. */
        b[i] = 0xBC00 | (uint16_t)(next64() & 0xFF);
    }
    for (int c = 0; c < q->n_copies; c++)
        q->w[c] = (sn_weight){ .dtype = SN_DT_Q4, .rows = rows, .cols = cols, .group = group,
                               .data = (char *)q->data + c * dstride, .scales = s + c * ng, .qbiases = b + c * ng,
                               .sdtype = SN_DT_BF16 };
    return 0;
}

static void qweight_free(qweight *q)
{
    free(q->data);
    free(q->scales);
    free(q->biases);
}

/* "model name" from /proc/cpuinfo, so a log line says which machine it measured. */
static void cpu_model(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && c) {
            c += 1 + (c[1] == ' ');
            c[strcspn(c, "\n")] = 0;
            snprintf(out, n, "%s", c);
            break;
        }
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    int quick = 0, max_threads = sn_cpu_features_get()->n_cores, T = 1;
    double min_time = 0.5;
    int only_isa = -1, no_log = 0;
    long long shape_r = 0, shape_c = 0; /* --shape: one shape instead of the three */
    int group = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--no-log")) no_log = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) max_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--huge")) g_huge = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (sscanf(argv[++i], "%lldx%lld", &shape_r, &shape_c) != 2 || shape_r < 1 || shape_c < 64 || shape_c % 64) {
                fprintf(stderr, "bench_matmul: --shape ROWSxCOLS, COLS a multiple of 64\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--footprint") && i + 1 < argc) g_footprint = (size_t)atol(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--group") && i + 1 < argc) {
            group = atoi(argv[++i]);
            if (group != 32 && group != 64 && group != 128) {
                fprintf(stderr, "bench_matmul: --group 32, 64 or 128\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--q4") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "int") && strcmp(v, "fp32") && strcmp(v, "q8")) {
                fprintf(stderr, "bench_matmul: --q4 int, fp32 or q8\n");
                return 2;
            }
            setenv("SANCTUM_CPU_Q4", v, 1);
        }
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc) min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            sn_isa isa;
            if (sn_isa_parse(argv[++i], &isa) != SN_OK) {
                fprintf(stderr, "bench_matmul: %s\n", sn_errmsg());
                return 2;
            }
            only_isa = isa;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--no-log] [--threads N] [--T n] [--min-time s] [--isa scalar|avx2|avx512] [--huge] [--footprint MB] [--shape RxC] [--group 32|64|128] [--q4 int|fp32|q8]\n",
                    argv[0]);
            return 2;
        }
    }
    if (max_threads < 1 || T < 1 || T > 4096) {
        fprintf(stderr, "bench_matmul: bad --threads or --T\n");
        return 2;
    }
    char cmd[512] = "";
    for (int i = 0; i < argc; i++) {
        strncat(cmd, i ? " " : "", sizeof cmd - strlen(cmd) - 1);
        strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 1);
    }

    int tlist[16], nt = 0;
    for (int t = 1; t < max_threads && nt < 15; t *= 2)
        tlist[nt++] = t;
    tlist[nt++] = max_threads;

    const char *q4 = getenv("SANCTUM_CPU_Q4");
    printf("bench_matmul: Q4 group %d bf16 scales (Q4 path %s), T=%d, best ISA %s, %d cores, weights %zu MB%s\n",
           group, q4 && *q4 ? q4 : "default", T,
           sn_isa_name(sn_cpu_best_isa()), sn_cpu_features_get()->n_cores, g_footprint >> 20, g_huge ? " (huge pages)" : "");
    double bw1 = measure_read_bw(1, (size_t)1 << 30);
    double bwN = max_threads > 1 ? measure_read_bw(max_threads, (size_t)1 << 30) : bw1;
    printf("  memory read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (%d threads)  <- the bound\n", bw1 / 1e9,
           bwN / 1e9, max_threads);

    double ovh = pool_overhead_us(max_threads);
    printf("  thread pool: %.2f us per back-to-back parallel-for on %d threads\n", ovh, max_threads);

    int64_t shapes[][2] = { { 5120, 17408 }, { 17408, 5120 }, { 248320, 5120 } };
    int nshapes = quick ? 2 : 3;
    if (shape_r) {
        shapes[0][0] = shape_r;
        shapes[0][1] = shape_c;
        nshapes = 1;
    }
    FILE *log = no_log ? NULL : fopen("bench/results.log", "a");
    char stamp[64];
    time_t tt = time(NULL);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
    if (log) {
        char model[128];
        cpu_model(model, sizeof model);
        fprintf(log, "%s bench_matmul %d cpus (%s)\n  cmd: %s\n", stamp, sn_cpu_features_get()->n_cores, model, cmd);
        fprintf(log, "  memory read bandwidth %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n", bw1 / 1e9, bwN / 1e9,
                max_threads);
        fprintf(log, "  thread pool: %.2f us per back-to-back parallel-for on %d threads\n", ovh, max_threads);
    }
    int pass = 1;
    for (int s = 0; s < nshapes; s++) {
        qweight q;
        if (qweight_make(&q, shapes[s][0], shapes[s][1], group) != 0) {
            fprintf(stderr, "bench_matmul: out of memory for [%lld x %lld]\n", (long long)shapes[s][0],
                    (long long)shapes[s][1]);
            return 1;
        }
        const sn_weight *w0 = &q.w[0];
        float *x = malloc(sizeof(float) * T * w0->cols), *y = malloc(sizeof(float) * T * w0->rows);
        for (int64_t i = 0; i < T * w0->cols; i++)
            x[i] = (float)(next64() % 2001) / 1000.0f - 1.0f;
        for (int isa = 0; isa < SN_ISA_COUNT; isa++) {
            if ((only_isa >= 0 && isa != only_isa) || !sn_cpu_isa_supported((sn_isa)isa))
                continue;
            for (int ti = 0; ti < nt; ti++) {
                if (isa == SN_ISA_SCALAR && tlist[ti] != 1 && tlist[ti] != max_threads)
                    continue; /* the oracle is slow: two points are enough */
                sn_backend *be = NULL;
                if (sn_backend_cpu_new_isa(tlist[ti], (sn_isa)isa, &be) != SN_OK) {
                    fprintf(stderr, "bench_matmul: %s\n", sn_errmsg());
                    return 1;
                }
                if (be->ops->matmul(be, &q.w[q.n_copies - 1], 0, x, T, y) != SN_OK) { /* warm-up */
                    fprintf(stderr, "bench_matmul: %s\n", sn_errmsg());
                    return 1;
                }
                int reps = 0;
                double t0 = now(), dt;
                do {
                    be->ops->matmul(be, &q.w[reps % q.n_copies], 0, x, T, y);
                    reps++;
                    dt = now() - t0;
                } while (dt < min_time || reps < 2);
                double per = dt / reps, gbs = q.bytes / per / 1e9;
                double bound = (tlist[ti] == 1 ? bw1 : tlist[ti] == max_threads ? bwN : 0) / 1e9;
                char frac[64] = "";
                if (bound > 0)
                    snprintf(frac, sizeof frac, " = %3.0f%% of %.1f GB/s", 100 * gbs / bound, bound);
                char line[256];
                snprintf(line, sizeof line, "Q4 [%6lld x %5lld] %-6s %2d thr: %8.3f ms/call %6.1f GB/s%s%s",
                         (long long)w0->rows, (long long)w0->cols, sn_isa_name((sn_isa)isa), tlist[ti], per * 1e3,
                         gbs, frac, T > 1 ? "" : "");
                if (T > 1)
                    snprintf(line + strlen(line), sizeof line - strlen(line), ", %.1f GFLOP/s",
                             2.0 * w0->rows * w0->cols * T / per / 1e9);
                printf("  %s\n", line);
                if (log)
                    fprintf(log, "  %s\n", line);
                if (T == 1 && isa == (int)sn_cpu_best_isa() && tlist[ti] == max_threads && gbs < 0.6 * bwN / 1e9)
                    pass = 0;
                sn_backend_free(be);
            }
        }
        free(x);
        free(y);
        qweight_free(&q);
    }
    const char *verdict = T > 1 ? "(prefill shape: no bandwidth goal)"
                          : pass ? "goal: best ISA at all threads >= 60% of read bandwidth -> PASS"
                                 : "goal: best ISA at all threads >= 60% of read bandwidth -> MISS";
    printf("  %s\n", verdict);
    if (log) {
        fprintf(log, "  %s\n", verdict);
        fclose(log);
    }
    return 0;
}
