/* Helpers the CUDA tests share: a seeded xorshift for random inputs, and
 * device buffers made from, poisoned for and read back to the host through
 * the backend table of G (each test defines TU_SEED before including this,
 * and sets G once the backend exists). */
#ifndef SANCTUM_TESTS_CUDA_TEST_UTIL_H
#define SANCTUM_TESTS_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "sanctum/backend.h"

#ifndef TU_SEED
#define TU_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t rng = TU_SEED;

static inline uint32_t rnd_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* uniform in [-a, a) */
static inline float rnd_f(float a) { return a * ((float)(rnd_u32() & 0xffffff) / 8388608.0f - 1.0f); }

static inline float *hrand(size_t n, float a)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = rnd_f(a);
    return p;
}

static sn_backend *G; /* the backend under test */

/* Device copy of a host array. */
static inline float *dcopy(const float *h, size_t n)
{
    void *d = NULL;
    if (G->ops->buf_alloc(G, sizeof(float) * (n ? n : 1), &d) != SN_OK) return NULL;
    if (n) G->ops->from_host(G, d, h, sizeof(float) * n);
    return d;
}

/* Device buffer of n floats filled with NaN, so an unwritten element fails. */
static inline float *dpoison(size_t n)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = dcopy(h, n);
    free(h);
    return d;
}

static inline float *tohost(const float *d, size_t n)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    if (G->ops->to_host(G, h, d, sizeof(float) * n) != SN_OK)
        for (size_t i = 0; i < n; i++) h[i] = NAN;
    return h;
}

static inline void dfree(void *p) { G->ops->buf_free(G, p); }

#endif
