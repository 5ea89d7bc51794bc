/* How do the H200's fp16 tensor cores add in fp32? The fp16 hi/lo prefill
 * candidate (docs/PERFORMANCE.md run 46) would form a quant group's
 * sum(q x) as two mma.sync m16n8k16 per 16 columns (q exact in fp16 as A,
 * x split per (token, group) into fp16 hi and lo parts as B, one fp32
 * accumulator), and bench/prec_hilo.c only models the accumulation. This
 * probe runs that chain on the GPU for random groups (the same data model
 * as prec_hilo: groups scaled 2^-20..2^20, 1 % outliers) and compares each
 * result with the exact sum, with IEEE fp32 sums in the same order, and
 * bitwise with the block-truncation model of bench/prec_model.h (each
 * MMA: the products and the accumulator kept to 24 bits below the largest,
 * toward zero, the sum truncated to fp32).
 *
 * First a layout check: small integers, whose every sum is exact in any
 * order, must come back exactly (else the fragment layout below is wrong
 * and nothing after it means anything).
 *
 * Last, whether the weights can be fp16 subnormals (q's bits as they are
 * in the packed word, see the end of main).
 *
 * Build here: nvcc -O3 -std=c++17 -arch=sm_90 -o build/mma_f16_probe
 * bench/mma_f16_probe.cu; run it on the GPU box (a second at most). Built
 * in run 46, not yet run. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_probe.h"
#include "prec_model.h"

constexpr int G = 64;     /* a quant group's columns */
constexpr int TR = 16;    /* rows a tile (the MMA's M) */
constexpr int TN = 8;     /* tokens a tile (N) */
constexpr int TILES = 4096;

/* Per tile: A q[16][64] as fp16 (row-major), B hi and lo [8][64] (token
 * major: the "col" operand), out [16][8]. One warp a tile. Fragments of
 * m16n8k16 .row.col f16 -> f32 (g = lane / 4, c = lane % 4):
 *   A: a0 (g, 2c..2c+1), a1 (g + 8, 2c..), a2 (g, 2c + 8..), a3 (g + 8, 2c + 8..)
 *   B: b0 (k 2c..2c+1, n g), b1 (k 2c + 8.., n g)
 *   D: d0 (g, 2c), d1 (g, 2c + 1), d2 (g + 8, 2c), d3 (g + 8, 2c + 1) */
__device__ __forceinline__ uint32_t pair(const __half *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

__global__ void k_chain(const __half *__restrict__ A, const __half *__restrict__ Bh, const __half *__restrict__ Bl,
                        float *__restrict__ out)
{
    const int tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (tile >= TILES)
        return;
    const int g = lane >> 2, c = lane & 3;
    const __half *a = A + (size_t)tile * TR * G, *bh = Bh + (size_t)tile * TN * G, *bl = Bl + (size_t)tile * TN * G;
    float d[4] = { 0.f, 0.f, 0.f, 0.f };
    for (int k0 = 0; k0 < G; k0 += 16) {
        const uint32_t a0 = pair(a + g * G + k0 + 2 * c), a1 = pair(a + (g + 8) * G + k0 + 2 * c),
                       a2 = pair(a + g * G + k0 + 2 * c + 8), a3 = pair(a + (g + 8) * G + k0 + 2 * c + 8);
        for (int part = 0; part < 2; part++) {
            const __half *b = part ? bl : bh;
            const uint32_t b0 = pair(b + g * G + k0 + 2 * c), b1 = pair(b + g * G + k0 + 2 * c + 8);
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                         "{%8, %9}, {%0, %1, %2, %3};"
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    float *o = out + (size_t)tile * TR * TN;
    o[g * TN + 2 * c] = d[0];
    o[g * TN + 2 * c + 1] = d[1];
    o[(g + 8) * TN + 2 * c] = d[2];
    o[(g + 8) * TN + 2 * c + 1] = d[3];
}

int main(void)
{
    const size_t na = (size_t)TILES * TR * G, nb = (size_t)TILES * TN * G, no = (size_t)TILES * TR * TN;
    __half *hA = (__half *)malloc(na * sizeof(__half)), *hBh = (__half *)malloc(nb * sizeof(__half)),
           *hBl = (__half *)malloc(nb * sizeof(__half));
    float *x = (float *)malloc(nb * sizeof(float)), *hO = (float *)malloc(no * sizeof(float));
    int *q = (int *)malloc(na * sizeof(int)), *es = (int *)malloc((size_t)TILES * TN * sizeof(int));
    if (!hA || !hBh || !hBl || !x || !hO || !q || !es)
        return 1;
    __half *dA, *dBh, *dBl;
    float *dO;
    CK(cudaMalloc(&dA, na * sizeof(__half)));
    CK(cudaMalloc(&dBh, nb * sizeof(__half)));
    CK(cudaMalloc(&dBl, nb * sizeof(__half)));
    CK(cudaMalloc(&dO, no * sizeof(float)));
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: the layout check (x small integers, lo 0); pass 1: the data model */
        for (size_t i = 0; i < na; i++) {
            q[i] = (int)(urand() * 16);
            hA[i] = __float2half_rn((float)q[i]);
        }
        for (size_t t = 0; t < (size_t)TILES * TN; t++) {
            float *xr = x + t * G;
            const double scale = pow(2.0, (int)(urand() * 40) - 20);
            float mx = 0.f;
            for (int i = 0; i < G; i++) {
                double v = pass ? nrand() * scale : (double)((int)(urand() * 33) - 16);
                if (pass && urand() < 0.01)
                    v *= 100;
                xr[i] = (float)v;
                mx = fmaxf(mx, fabsf(xr[i]));
            }
            int e2 = 0;
            if (mx > 0.f)
                frexpf(mx, &e2);
            es[t] = pass ? -e2 : 0;
            for (int i = 0; i < G; i++) {
                const float xs = ldexpf(xr[i], es[t]);
                const __half h = __float2half_rn(xs);
                hBh[t * G + i] = h;
                hBl[t * G + i] = __float2half_rn(xs - __half2float(h));
            }
        }
        CK(cudaMemcpy(dA, hA, na * sizeof(__half), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dBh, hBh, nb * sizeof(__half), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dBl, hBl, nb * sizeof(__half), cudaMemcpyHostToDevice));
        k_chain<<<TILES / 8, 256>>>(dA, dBh, dBl, dO);
        CK(cudaGetLastError());
        CK(cudaMemcpy(hO, dO, no * sizeof(float), cudaMemcpyDeviceToHost));
        long n = 0, model_same = 0, ieee_same = 0, exact_same = 0;
        double err_hw = 0, worst_hw = 0, err_ieee = 0;
        for (int tile = 0; tile < TILES; tile++)
            for (int r = 0; r < TR; r++)
                for (int t = 0; t < TN; t++) {
                    const size_t tt = (size_t)tile * TN + t;
                    const int *qr = q + ((size_t)tile * TR + r) * G;
                    const float *xr = x + tt * G;
                    long double ref = 0, mag = 0;
                    float ieee = 0.f, model = 0.f;
                    for (int k0 = 0; k0 < G; k0 += 16) {
                        float ph[16], pl[16];
                        for (int i = 0; i < 16; i++) {
                            const int k = k0 + i;
                            ref += (long double)qr[k] * xr[k];
                            mag += fabsl((long double)qr[k] * xr[k]);
                            ph[i] = (float)qr[k] * __half2float(hBh[tt * G + k]);
                            pl[i] = (float)qr[k] * __half2float(hBl[tt * G + k]);
                        }
                        for (int i = 0; i < 16; i++)
                            ieee = fmaf((float)qr[k0 + i], __half2float(hBh[tt * G + k0 + i]), ieee);
                        for (int i = 0; i < 16; i++)
                            ieee = fmaf((float)qr[k0 + i], __half2float(hBl[tt * G + k0 + i]), ieee);
                        model = mma16(model, ph);
                        model = mma16(model, pl);
                    }
                    const float hw = hO[(size_t)tile * TR * TN + r * TN + t];
                    const float refs = (float)(ref * ldexpl(1.0L, es[tt])); /* in the probe's scaled units */
                    n++;
                    model_same += hw == model;
                    ieee_same += hw == ieee;
                    exact_same += hw == refs;
                    if (mag > 0) {
                        const long double hv = ldexpl((long double)hw, -es[tt]), iv = ldexpl((long double)ieee, -es[tt]);
                        const double e = (double)(fabsl(hv - ref) / mag), ei = (double)(fabsl(iv - ref) / mag);
                        err_hw += e;
                        err_ieee += ei;
                        if (e > worst_hw)
                            worst_hw = e;
                    }
                }
        if (pass == 0) {
            printf("layout check (integer sums, exact in any order): %ld of %ld exact%s\n", exact_same, n,
                   exact_same == n ? "" : "  <- the fragment layout is wrong: the rest means nothing");
            if (exact_same != n)
                return 2;
            continue;
        }
        printf("%ld groups of 64 on the GPU (mma.sync m16n8k16 f16 -> f32, hi then lo per 16 columns):\n", n);
        printf("  bitwise as the block-truncation model: %ld (%.2f %%); as IEEE fp32 sums: %ld (%.2f %%)\n",
               model_same, 100.0 * model_same / n, ieee_same, 100.0 * ieee_same / n);
        printf("  |result - exact| / sum|q x|: GPU mean %.3e worst %.3e; IEEE sums mean %.3e\n", err_hw / n, worst_hw,
               err_ieee / n);
    }
    /* The weights as fp16 subnormals: a nibble's bits q (or 16 q for the
     * high nibble) read as the fp16 value q * 2^-24, so A is one AND of the
     * packed word, with no magic-number subtraction. Exact only if the
     * tensor cores take subnormal inputs as they are (no flush to zero):
     * then every result is the normal-A result times 2^-24, bitwise (the
     * products and sums scale by a power of two, fp32 stays normal here). */
    float *hO2 = (float *)malloc(no * sizeof(float));
    if (!hO2)
        return 1;
    for (int sub = 0; sub < 2; sub++) {
        for (size_t i = 0; i < na; i++) {
            const int row = (int)(i / G % TR), v = row < 8 ? q[i] : 16 * q[i];
            uint16_t bits = (uint16_t)v;
            if (!sub) {
                const __half h = __float2half_rn((float)v);
                memcpy(&bits, &h, 2);
            }
            memcpy(hA + i, &bits, 2);
        }
        CK(cudaMemcpy(dA, hA, na * sizeof(__half), cudaMemcpyHostToDevice));
        k_chain<<<TILES / 8, 256>>>(dA, dBh, dBl, dO);
        CK(cudaGetLastError());
        CK(cudaMemcpy(sub ? hO2 : hO, dO, no * sizeof(float), cudaMemcpyDeviceToHost));
    }
    long same = 0, zero = 0;
    for (size_t i = 0; i < no; i++) {
        same += hO2[i] == ldexpf(hO[i], -24);
        zero += hO2[i] == 0.f && hO[i] != 0.f;
    }
    printf("subnormal weights (bits q, 16 q as fp16): %ld of %zu results bitwise 2^-24 x the normal ones, %ld "
           "flushed to 0%s\n",
           same, no, zero, same == (long)no ? "" : "  <- subnormal A is not exact here");
    return 0;
}
