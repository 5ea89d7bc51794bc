/* Helpers the CUDA tests share: a seeded xorshift for random inputs,
 * device buffers made from, poisoned for and read back to the host through
 * the backend table of G, and random weights (tw) on both sides (each test
 * includes harness.h first, defines TU_SEED before including this, and sets
 * G once the backend exists). */
#ifndef SANCTUM_TESTS_CUDA_TEST_UTIL_H
#define SANCTUM_TESTS_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sanctum/backend.h"
#include "sanctum/tensor.h"

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

/* A random weight (quantized with random scales and biases, or dense),
 * its host view w for the CPU oracle and wg uploaded to G; bias adds a
 * random linear bias. */
typedef struct {
    sn_weight w;       /* host view (CPU) */
    sn_weight wg;      /* same, uploaded to the GPU */
    void *data, *sc, *bi;
    float *bias;
} tw;

static inline uint16_t to_sdt(float v, sn_dtype dt)
{
    return dt == SN_DT_BF16 ? sn_f32_to_bf16(v) : sn_f32_to_f16(v);
}

static inline void tw_make(tw *t, sn_dtype dt, int64_t rows, int64_t cols, int group, sn_dtype sdt, int64_t E, int bias)
{
    memset(t, 0, sizeof *t);
    int64_t ne = E > 0 ? E : 1;
    t->w.dtype = dt;
    t->w.rows = rows;
    t->w.cols = cols;
    t->w.n_experts = E;
    if (dt == SN_DT_Q4 || dt == SN_DT_Q8) {
        int bits = dt == SN_DT_Q4 ? 4 : 8;
        size_t words = (size_t)ne * rows * cols * bits / 32, ng = (size_t)ne * rows * (cols / group);
        uint32_t *q = malloc(4 * words);
        for (size_t i = 0; i < words; i++) q[i] = rnd_u32() ^ (rnd_u32() << 16);
        size_t ss = sdt == SN_DT_F32 ? 4 : 2;
        uint8_t *sc = malloc(ss * ng), *bi = malloc(ss * ng);
        float smax = bits == 4 ? 0.02f : 0.002f;
        for (size_t i = 0; i < ng; i++) {
            float s = rnd_f(smax), b = rnd_f(0.1f);
            if (sdt == SN_DT_F32) {
                memcpy(sc + 4 * i, &s, 4);
                memcpy(bi + 4 * i, &b, 4);
            } else {
                uint16_t hs = to_sdt(s, sdt), hb = to_sdt(b, sdt);
                memcpy(sc + 2 * i, &hs, 2);
                memcpy(bi + 2 * i, &hb, 2);
            }
        }
        t->w.group = group;
        t->w.data = t->data = q;
        t->w.scales = t->sc = sc;
        t->w.qbiases = t->bi = bi;
        t->w.sdtype = sdt;
    } else {
        size_t n = (size_t)ne * rows * cols;
        size_t es = sn_dtype_size(dt);
        uint8_t *d = malloc(es * n);
        for (size_t i = 0; i < n; i++) {
            float v = rnd_f(0.1f);
            if (dt == SN_DT_F32) memcpy(d + 4 * i, &v, 4);
            else {
                uint16_t h = to_sdt(v, dt);
                memcpy(d + 2 * i, &h, 2);
            }
        }
        t->w.data = t->data = d;
    }
    if (bias) t->w.bias = t->bias = hrand((size_t)rows, 0.5f);
    t->wg = t->w;
    CHECK_OK(G->ops->upload_weight(G, &t->wg));
    CHECK(t->wg.dev != NULL);
}

static inline void tw_free(tw *t)
{
    free(t->data);
    free(t->sc);
    free(t->bi);
    free(t->bias);
}

#endif
