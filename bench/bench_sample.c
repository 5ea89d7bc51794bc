/* The host's share of a sampled decode step: sn_sampler_sample on one row
 * of logits at a real vocabulary size, per sampling setting. A greedy step
 * through sn_generate moves only ids since e1ae6f3; a sampled one still
 * copies the row to the host and runs this, so this time (plus the copy)
 * sits on every sampled token's critical path, beside the GPU step
 * (35B-A3B: ~2.4 ms).
 *
 *   bench_sample [--vocab N] [--reps R] [--flat S] [--log PATH]
 *
 * Logits: 3 * a standard normal per id (Box-Muller on the sampler's own
 * PRNG), plus 12 on 20 ids, so a few tokens carry most of the mass as in a
 * trained model's step; --flat S: S * a standard normal and no peaks (a
 * random-weight model's row: top-p keeps most of the vocabulary). Each call gets a fresh copy of the same row (the
 * sampler modifies it in place); the copy is not timed. Prints the median
 * microseconds per call of each setting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "sanctum/sample.h"

typedef struct {
    const char *name;
    float temperature, top_p, repetition_penalty;
} setting;

int main(int argc, char **argv)
{
    int vocab = 248320, reps = 200;
    const char *log = NULL;
    double flat = 0.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--log") && i + 1 < argc) log = argv[++i];
        else if (!strcmp(argv[i], "--flat") && i + 1 < argc) flat = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--vocab N] [--reps R] [--flat S] [--log PATH]\n", argv[0]);
            return 2;
        }
    }
    if (vocab < 64 || reps < 1 || !(flat >= 0.0)) {
        fprintf(stderr, "bench_sample: --vocab must be >= 64, --reps >= 1 and --flat >= 0\n");
        return 2;
    }
    float *row = malloc(sizeof(float) * (size_t)vocab), *work = malloc(sizeof(float) * (size_t)vocab);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!row || !work || !t) {
        fprintf(stderr, "bench_sample: out of memory\n");
        return 1;
    }
    sn_rng g;
    sn_rng_seed(&g, 7);
    for (int i = 0; i < vocab; i++) {
        double u1 = sn_rng_uniform(&g), u2 = sn_rng_uniform(&g);
        row[i] = (float)((flat > 0.0 ? flat : 3.0) * sqrt(-2.0 * log1p(-u1)) * cos(6.283185307179586 * u2));
    }
    if (flat == 0.0)
        for (int k = 0; k < 20; k++) row[sn_rng_next(&g) % (uint64_t)vocab] += 12.f;

    const setting set[] = {
        { "greedy", 0.f, 1.f, 1.f },
        { "t0.7_p0.9", 0.7f, 0.9f, 1.f },
        { "t1_p1", 1.f, 1.f, 1.f },
        { "t0.7_p0.9_rp1.1", 0.7f, 0.9f, 1.1f },
    };
    char line[1024];
    char shape[64] = "";
    if (flat > 0.0) snprintf(shape, sizeof shape, " (flat logits, %g * normal)", flat);
    int len = snprintf(line, sizeof line, "bench_sample vocab %d%s, median us per sn_sampler_sample over %d calls:", vocab,
                       shape, reps);
    for (size_t c = 0; c < sizeof set / sizeof *set; c++) {
        sn_sample_params p;
        sn_sample_params_default(&p);
        p.temperature = set[c].temperature;
        p.top_p = set[c].top_p;
        p.repetition_penalty = set[c].repetition_penalty;
        p.repetition_window = 64;
        p.has_seed = true;
        p.seed = 1;
        sn_sampler *s = NULL;
        if (sn_sampler_new(&p, vocab, &s) != SN_OK) {
            fprintf(stderr, "bench_sample: sampler for %s refused\n", set[c].name);
            return 1;
        }
        for (int i = 0; i < 64; i++) sn_sampler_accept(s, (int32_t)(sn_rng_next(&g) % (uint64_t)vocab));
        int32_t id = -1;
        for (int r = 0; r < reps; r++) {
            memcpy(work, row, sizeof(float) * (size_t)vocab);
            double t0 = bench_now();
            if (sn_sampler_sample(s, work, &id) != SN_OK) {
                fprintf(stderr, "bench_sample: sampling failed (%s)\n", set[c].name);
                return 1;
            }
            t[r] = bench_now() - t0;
        }
        sn_sampler_free(s);
        qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
        double us = 1e6 * t[reps / 2];
        printf("%-18s %9.1f us per call (last id %d)\n", set[c].name, us, id);
        if (len < (int)sizeof line)
            len += snprintf(line + len, sizeof line - (size_t)len, "%s %s %.1f", c ? "," : "", set[c].name, us);
    }
    bench_log_line(log, line, argc, argv);
    free(row);
    free(work);
    free(t);
    return 0;
}
