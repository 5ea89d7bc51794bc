/* Pieces every model benchmark needs (bench_pcache, bench_pld, bench_tok):
 * a wall clock, a sort order for medians, and the one-line record appended
 * to bench/results.log, so the log format is defined in one place. */
#ifndef SN_BENCH_COMMON_H
#define SN_BENCH_COMMON_H

#include <stdio.h>
#include <time.h>

/* Monotonic wall-clock seconds. */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* qsort order for doubles (ascending). */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Appends "<UTC minute> <line> | cmd: <argv...>" to log_path; a NULL or
 * empty path, or a log that cannot be opened, records nothing (the result
 * was already printed). */
static inline void bench_log_line(const char *log_path, const char *line, int argc, char **argv)
{
    if (!log_path || !*log_path) return;
    FILE *f = fopen(log_path, "a");
    if (!f) return;
    char ts[32];
    time_t t = time(NULL);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%MZ", gmtime(&t));
    fprintf(f, "%s %s | cmd:", ts, line);
    for (int i = 0; i < argc; i++) fprintf(f, " %s", argv[i]);
    fputc('\n', f);
    fclose(f);
}

#endif
