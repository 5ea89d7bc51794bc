/* Minimal test harness: CHECK records a failure and keeps going; the run
 * ends with the line "N passed, N failed" that CI counts. Each test binary
 * lists its tests in main() with RUN(fn). */
#ifndef SANCTUM_TEST_HARNESS_H
#define SANCTUM_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_passed __attribute__((unused)), t_failed __attribute__((unused)), t_cur_failed __attribute__((unused));
static const char *t_cur_name __attribute__((unused));

#define CHECK(cond) do { if (!(cond)) { t_cur_failed++; \
    fprintf(stderr, "  FAIL %s:%d (%s): %s\n", __FILE__, __LINE__, t_cur_name, #cond); } } while (0)
#define CHECKF(cond, ...) do { if (!(cond)) { t_cur_failed++; \
    fprintf(stderr, "  FAIL %s:%d (%s): %s: ", __FILE__, __LINE__, t_cur_name, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_OK(expr) do { sn_status _s = (expr); if (_s != SN_OK) { t_cur_failed++; \
    fprintf(stderr, "  FAIL %s:%d (%s): %s -> %s: %s\n", __FILE__, __LINE__, t_cur_name, #expr, \
            sn_status_name(_s), sn_errmsg()); } } while (0)

#define RUN(fn) do { t_cur_name = #fn; t_cur_failed = 0; fn(); \
    if (t_cur_failed) { t_failed++; fprintf(stderr, "not ok %s\n", #fn); } \
    else { t_passed++; fprintf(stderr, "ok %s\n", #fn); } } while (0)
/* A test that cannot run here (no GPU, no fixture) says so visibly and counts as neither. */
#define SKIP(why) do { fprintf(stderr, "  SKIP (%s): %s\n", t_cur_name, why); return; } while (0)

#define TEST_END() (printf("%d passed, %d failed\n", t_passed, t_failed), t_failed ? 1 : 0)

#endif
