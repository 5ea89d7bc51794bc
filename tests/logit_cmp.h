/* Comparing logit rows in the model tests (CPU fixtures and their CUDA run). */
#ifndef SANCTUM_TEST_LOGIT_CMP_H
#define SANCTUM_TEST_LOGIT_CMP_H

#include <math.h>
#include <stddef.h>

static float max_abs(const float *a, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i]));
    return m;
}

/* Largest |a-b|; a NaN anywhere makes it infinite, so no bound can pass. */
static float max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* First maximum, as greedy decoding picks it. */
static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

#endif
