/* The monotonic clock in seconds: what every timing in sanctum (request
 * latencies, cache ages, step splits) is read from. */
#ifndef SANCTUM_CLOCK_H
#define SANCTUM_CLOCK_H

#include <time.h>

static inline double sn_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
