/* Shared by bench/prec_hilo.c (C) and bench/mma_f16_probe.cu (CUDA C++):
 * their random data (one xorshift stream, the same seed in both) and the
 * block-truncation model of one fp16 m16n8k16 MMA's fp32 accumulation. */
#ifndef SANCTUM_BENCH_PREC_MODEL_H
#define SANCTUM_BENCH_PREC_MODEL_H

#include <math.h>
#include <stdint.h>

static uint64_t prec_state = 88172645463325252ull;

/* uniform in [0, 1) */
static double urand(void)
{
    prec_state ^= prec_state << 13;
    prec_state ^= prec_state >> 7;
    prec_state ^= prec_state << 17;
    return (double)(prec_state >> 11) / 9007199254740992.0;
}

/* standard normal (Box-Muller) */
static double nrand(void)
{
    const double u = urand() + 1e-300, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* v toward zero to a multiple of 2^q */
static long double trunc_to(long double v, int q) { return truncl(ldexpl(v, -q)) * ldexpl(1.0L, q); }

/* One MMA's dot of 16 exact products p plus the accumulator c, under the
 * model (an assumption, not a measurement): every term kept to 24 bits
 * below the largest one's exponent, toward zero, added exactly, and the
 * sum truncated to fp32. */
static float mma16(float c, const float *p)
{
    int emax = -1000, e;
    if (c != 0.f) {
        frexpf(c, &e);
        emax = e;
    }
    for (int i = 0; i < 16; i++)
        if (p[i] != 0.f) {
            frexpf(p[i], &e);
            emax = e > emax ? e : emax;
        }
    if (emax == -1000)
        return 0.f;
    long double sum = trunc_to(c, emax - 24);
    for (int i = 0; i < 16; i++)
        sum += trunc_to(p[i], emax - 24);
    float r = (float)sum;
    if (fabsl((long double)r) > fabsl(sum))
        r = nextafterf(r, 0.f);
    return r;
}

#endif
