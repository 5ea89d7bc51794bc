/* A host model of three ways to form one quant group's sum(q * x), q the
 * 4-bit weights (exact), x fp32 activations, against a long double
 * reference: the prefill GEMM's 3 int8 digits (x as a 23-bit integer per
 * group), fp16 x alone, and x split into fp16 hi + lo parts summed in IEEE
 * fp32 (the fp16 MMA candidate of PERFORMANCE run 46), the last also with
 * the hi and lo planes as two m16n8k16 MMAs per 16 columns under a
 * block-truncation model of the tensor cores' fp32 accumulation (an
 * assumption, not a measurement: each MMA aligns its 16 products and the
 * accumulator to the largest exponent, keeps 24 bits below it toward zero,
 * adds exactly and truncates the sum to fp32, as published for earlier
 * NVIDIA tensor cores).
 *
 * Standalone: cc -O2 -std=c17 -o /tmp/prec_hilo bench/prec_hilo.c -lm &&
 * /tmp/prec_hilo [GROUPS] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "prec_model.h"

int main(int argc, char **argv)
{
    char *end = NULL;
    const long ng = argc > 1 ? strtol(argv[1], &end, 10) : 200000;
    if (argc > 2 || (argc > 1 && (end == argv[1] || *end)) || ng < 1 || ng > 100000000) {
        fprintf(stderr, "usage: %s [GROUPS]: GROUPS is a whole number from 1 to 100000000 (default 200000)%s%s\n",
                argv[0], argc > 1 ? ", not " : "", argc > 1 ? argv[1] : "");
        return 2;
    }
    const int NG = (int)ng, G = 64;
    double worst[4] = { 0 }, mean[4] = { 0 };
    for (int gi = 0; gi < NG; gi++) {
        float x[64];
        int q[64];
        const double scale = pow(2.0, (int)(urand() * 40) - 20); /* groups from 2^-20 to 2^20 */
        for (int i = 0; i < G; i++) {
            double v = nrand() * scale;
            if (urand() < 0.01)
                v *= 100; /* outliers */
            x[i] = (float)v;
            q[i] = (int)(urand() * 16);
        }
        long double ref = 0, mag = 0;
        float mx = 0;
        for (int i = 0; i < G; i++) {
            ref += (long double)q[i] * x[i];
            mag += fabsl((long double)q[i] * x[i]);
            mx = fmaxf(mx, fabsf(x[i]));
        }
        if (mag == 0)
            continue;
        /* int8, 3 digits: X = rint(x * 2^e), |X| < 2^22 */
        int e2;
        frexpf(mx, &e2);
        const int e = 22 - e2;
        int64_t P = 0;
        for (int i = 0; i < G; i++)
            P += (int64_t)q[i] * (int64_t)rint(ldexp(x[i], e));
        const float r_i8 = (float)ldexp((double)P, -e); /* one rounding (the kernel has two) */
        /* fp16 alone and hi + lo, x pre-scaled per group so max |x'| is about 1 */
        const int es = -e2;
        float s16 = 0, shl = 0;
        for (int i = 0; i < G; i++) {
            const float xs = ldexpf(x[i], es);
            const _Float16 h = (_Float16)xs;
            const _Float16 l = (_Float16)(xs - (float)h);
            s16 = fmaf((float)q[i], (float)h, s16);
            shl = fmaf((float)q[i], (float)h, shl);
            shl = fmaf((float)q[i], (float)l, shl);
        }
        /* the same split as two MMAs per 16 columns: hi, then lo, into one accumulator */
        float acc = 0.f;
        for (int k0 = 0; k0 < G; k0 += 16) {
            float ph[16], pl[16];
            for (int i = 0; i < 16; i++) {
                const float xs = ldexpf(x[k0 + i], es);
                const _Float16 h = (_Float16)xs;
                const _Float16 l = (_Float16)(xs - (float)h);
                ph[i] = (float)q[k0 + i] * (float)h; /* exact: 4 x 11 bits */
                pl[i] = (float)q[k0 + i] * (float)l;
            }
            acc = mma16(acc, ph);
            acc = mma16(acc, pl);
        }
        const float r_16 = ldexpf(s16, -es), r_hl = ldexpf(shl, -es), r_tc = ldexpf(acc, -es);
        const float r[4] = { r_i8, r_16, r_hl, r_tc };
        for (int k = 0; k < 4; k++) {
            const double err = (double)(fabsl((long double)r[k] - ref) / mag);
            if (err > worst[k])
                worst[k] = err;
            mean[k] += err / NG;
        }
    }
    const char *name[4] = { "int8 x 3 digits (today)", "fp16 x", "fp16 hi + lo, fp32 sums",
                            "fp16 hi + lo, MMA model" };
    printf("%d groups of 64: |result - exact| / sum|q x|, mean and worst\n", NG);
    for (int k = 0; k < 4; k++)
        printf("  %-26s %.3e  %.3e  (2^%.1f worst)\n", name[k], mean[k], worst[k], log2(worst[k]));
    return 0;
}
