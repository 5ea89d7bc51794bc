/* Shared by the CPU backend tests (test_backend_cpu.c, test_cpu_q4.c):
 * random data, bf16/f16 rounding, quantized test weights (tw), the
 * double-precision matmul reference and the checks against it and the
 * scalar backend. Include after harness.h. */
#ifndef SN_TESTS_CPU_TEST_UTIL_H
#define SN_TESTS_CPU_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sanctum/backend.h"
#include "sanctum/cpu.h"


static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static inline float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xFFFFFF) / (float)0xFFFFFF; }
static inline void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = frand(lo, hi);
}

static inline uint16_t to_bf16(float f) /* round to nearest even (no NaN here) */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline double bf16_d(uint16_t h) { return (double)sn_bf16_to_f32(h); }

/* Independent f16 decoding (normal/subnormal/zero; our values are normal). */
static inline double f16_d(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}
static inline uint16_t to_f16(float f) /* values in (-8, 8), normal range: truncating is fine */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 255) - 127 + 15;
    if (e <= 0)
        return (uint16_t)s;
    return (uint16_t)(s | (uint32_t)e << 10 | ((u >> 13) & 1023));
}

static inline double load_d(const void *p, sn_dtype dt, size_t i)
{
    switch (dt) {
    case SN_DT_BF16: return bf16_d(((const uint16_t *)p)[i]);
    case SN_DT_F16: return f16_d(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* A random weight with its own storage. Quantized: random codes, scales in
 * [-0.05, 0.05] (so many are negative) and biases in [-0.2, 0.2]. */
typedef struct {
    sn_weight w;
    void *data, *scales, *biases;
} tw;

static inline size_t el_size(sn_dtype dt) { return dt == SN_DT_F32 ? 4 : 2; }

static inline void tw_make(tw *t, sn_dtype dt, int64_t rows, int64_t cols, int group, sn_dtype sdt, int64_t E)
{
    memset(t, 0, sizeof *t);
    int64_t ne = E ? E : 1;
    t->w.dtype = dt;
    t->w.rows = rows;
    t->w.cols = cols;
    t->w.n_experts = E;
    if (dt == SN_DT_Q4 || dt == SN_DT_Q8) {
        int bits = dt == SN_DT_Q4 ? 4 : 8;
        size_t words = (size_t)(ne * rows * cols * bits / 32);
        uint32_t *d = malloc(words * 4);
        for (size_t i = 0; i < words; i++)
            d[i] = rnd() ^ (rnd() << 16);
        size_t ns = (size_t)(ne * rows * (cols / group));
        void *s = malloc(ns * el_size(sdt)), *b = malloc(ns * el_size(sdt));
        for (size_t i = 0; i < ns; i++) {
            float sv = frand(-0.05f, 0.05f), bv = frand(-0.2f, 0.2f);
            if (sdt == SN_DT_BF16) { ((uint16_t *)s)[i] = to_bf16(sv); ((uint16_t *)b)[i] = to_bf16(bv); }
            else if (sdt == SN_DT_F16) { ((uint16_t *)s)[i] = to_f16(sv); ((uint16_t *)b)[i] = to_f16(bv); }
            else { ((float *)s)[i] = sv; ((float *)b)[i] = bv; }
        }
        t->w.group = group;
        t->w.sdtype = sdt;
        t->data = d; t->scales = s; t->biases = b;
    } else {
        size_t n = (size_t)(ne * rows * cols);
        void *d = malloc(n * el_size(dt));
        for (size_t i = 0; i < n; i++) {
            float v = frand(-1, 1);
            if (dt == SN_DT_BF16) ((uint16_t *)d)[i] = to_bf16(v);
            else if (dt == SN_DT_F16) ((uint16_t *)d)[i] = to_f16(v);
            else ((float *)d)[i] = v;
        }
        t->data = d;
    }
    t->w.data = t->data;
    t->w.scales = t->scales;
    t->w.qbiases = t->biases;
}

static inline void tw_free(tw *t)
{
    free(t->data);
    free(t->scales);
    free(t->biases);
}

/* w[e][r][c] in double, straight from the MLX definition. */
static inline double w_at(const sn_weight *w, int64_t e, int64_t r, int64_t c)
{
    size_t row = (size_t)(e * w->rows + r);
    if (w->dtype == SN_DT_Q4 || w->dtype == SN_DT_Q8) {
        int bits = w->dtype == SN_DT_Q4 ? 4 : 8, per = 32 / bits;
        const uint32_t *d = w->data;
        uint32_t word = d[row * (size_t)(w->cols / per) + (size_t)(c / per)];
        uint32_t q = (word >> (bits * (c % per))) & ((1u << bits) - 1);
        size_t gi = row * (size_t)(w->cols / w->group) + (size_t)(c / w->group);
        return load_d(w->scales, w->sdtype, gi) * q + load_d(w->qbiases, w->sdtype, gi);
    }
    return load_d(w->data, w->dtype, row * (size_t)w->cols + (size_t)c);
}

/* y = x W^T (+bias) in double; mag = sum |w x| per output. */
static inline void mm_ref(const sn_weight *w, int e, const float *x, int T, double *y, double *mag)
{
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < w->rows; r++) {
            double s = 0, a = 0;
            for (int64_t c = 0; c < w->cols; c++) {
                double p = w_at(w, e, r, c) * x[(size_t)t * w->cols + c];
                s += p;
                a += fabs(p);
            }
            if (w->bias) {
                s += w->bias[r];
                a += fabs(w->bias[r]);
            }
            y[(size_t)t * w->rows + r] = s;
            mag[(size_t)t * w->rows + r] = a;
        }
}

static const sn_isa isas[] = { SN_ISA_SCALAR, SN_ISA_AVX2, SN_ISA_AVX512 };

/* Backend for an ISA, made through the SANCTUM_CPU override. NULL (with a
 * visible SKIP line) when this CPU lacks it. */
static inline sn_backend *backend_for(sn_isa isa, int threads)
{
    setenv("SANCTUM_CPU", sn_isa_name(isa), 1);
    sn_backend *be = NULL;
    sn_status st = sn_backend_cpu_new(threads, &be);
    unsetenv("SANCTUM_CPU");
    if (!sn_cpu_isa_supported(isa)) {
        CHECK(st == SN_E_UNSUPPORTED);
        fprintf(stderr, "  SKIP (%s): CPU lacks %s\n", t_cur_name, sn_isa_name(isa));
        return NULL;
    }
    CHECK_OK(st);
    if (be) {
        char want[32];
        snprintf(want, sizeof want, "cpu-%s", sn_isa_name(isa));
        CHECKF(strcmp(be->ops->name, want) == 0, "name %s", be->ops->name);
    }
    return be;
}

static inline double max_rel_err(const float *y, const double *ref, const double *mag, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(y[i] - ref[i]) / (mag[i] + 1e-30);
        if (!(e <= worst)) /* NaN counts as infinitely bad */
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* Quantized magnitude: the affine split makes s*q*x and b*x separate terms. */
static inline void mm_mag_q(const sn_weight *w, int e, const float *x, int T, double *mag)
{
    int bits = w->dtype == SN_DT_Q4 ? 4 : 8, per = 32 / bits;
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < w->rows; r++) {
            double a = 0;
            size_t row = (size_t)(e * w->rows + r);
            for (int64_t c = 0; c < w->cols; c++) {
                uint32_t word = ((const uint32_t *)w->data)[row * (size_t)(w->cols / per) + (size_t)(c / per)];
                uint32_t q = (word >> (bits * (c % per))) & ((1u << bits) - 1);
                size_t gi = row * (size_t)(w->cols / w->group) + (size_t)(c / w->group);
                double xv = x[(size_t)t * w->cols + c];
                a += fabs(load_d(w->scales, w->sdtype, gi) * q * xv) + fabs(load_d(w->qbiases, w->sdtype, gi) * xv);
            }
            if (w->bias)
                a += fabs(w->bias[r]);
            mag[(size_t)t * w->rows + r] = a;
        }
}

/* Bound for matmul outputs, relative to sum_i |w_i x_i| (quantized: sum of
 * |s q x| + |b x|, the terms an affine kernel actually adds): fp32
 * accumulation over <= 640 terms stays far below it. */
#define REL_MM 3e-5

typedef struct { int64_t rows, cmul; int T; } mm_shape;

/* check_mm_case for a given x [T, cols] */
static inline void check_mm_x(sn_backend *be, sn_backend *ref_be, const tw *t, int e, const float *x, int T, double bound,
                       const char *what)
{
    const sn_weight *w = &t->w;
    size_t ny = (size_t)T * w->rows;
    float *y = malloc(ny * 4), *ys = malloc(ny * 4);
    double *yr = malloc(ny * 8), *mag = malloc(ny * 8);
    for (size_t i = 0; i < ny; i++)
        y[i] = NAN;
    CHECK_OK(be->ops->matmul(be, w, e, x, T, y));
    mm_ref(w, e, x, T, yr, mag);
    if (w->dtype == SN_DT_Q4 || w->dtype == SN_DT_Q8)
        mm_mag_q(w, e, x, T, mag);
    double err = max_rel_err(y, yr, mag, ny);
    CHECKF(err <= bound, "%s %s: [%lld x %lld] T=%d group=%d: rel err vs double %.3g > %.1g", be->ops->name, what,
           (long long)w->rows, (long long)w->cols, T, w->group, err, bound);
    if (ref_be && ref_be != be) {
        CHECK_OK(ref_be->ops->matmul(ref_be, w, e, x, T, ys));
        double *ysd = malloc(ny * 8);
        for (size_t i = 0; i < ny; i++)
            ysd[i] = ys[i];
        double e2 = max_rel_err(y, ysd, mag, ny);
        CHECKF(e2 <= bound, "%s %s: [%lld x %lld] T=%d: rel diff vs scalar %.3g", be->ops->name, what,
               (long long)w->rows, (long long)w->cols, T, e2);
        free(ysd);
    }
    free(y); free(ys); free(yr); free(mag);
}

static inline void check_mm_case(sn_backend *be, sn_backend *ref_be, const tw *t, int e, int T, const char *what)
{
    size_t nx = (size_t)T * t->w.cols;
    float *x = malloc(nx * 4);
    fill(x, nx, -1, 1);
    check_mm_x(be, ref_be, t, e, x, T, REL_MM, what);
    free(x);
}

#endif
