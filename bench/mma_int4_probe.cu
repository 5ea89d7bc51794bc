/* Does sm_90 run 4-bit integer MMAs at speed? A decode GEMV on 4-bit
 * weights with x in 4-bit digit planes (u4 x s4, mma.m16n8k64) would feed
 * the packed weights to the tensor cores without the nibble-to-byte unpack
 * the integer GEMV spends its instructions on (docs/PERFORMANCE.md run 21);
 * that is only worth building if the instruction is not emulated.
 *
 * This probe times dependent chains of mma.sync m16n8k32 u8 x s8 (what
 * cuda_gemv_int.cu issues) and m16n8k64 u4 x s4 on every SM, and checks
 * both on constant operands (every product the same, so the fragment
 * layout does not matter): A = 3 everywhere, B = -2 everywhere, C = 5 gives
 * 5 - 6K in every element.
 *
 * Build here: nvcc -O3 -arch=sm_90 -o build/mma_int4_probe
 * bench/mma_int4_probe.cu; run it on the GPU box, and read its SASS there
 * with cuobjdump -sass (what s11r5 did: results.log 07:50Z). s11r5 ran the
 * version before this one, whose chains shared their operands, so its
 * times were not MMA rates; this form of the loop has not run yet. */
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "cuda_probe.h"

constexpr int CHAINS = 8; /* independent accumulators per warp, to cover the MMA latency */

template <bool INT4>
__global__ void k_probe(int iters, uint32_t a_word, uint32_t b_word, int c0, uint32_t zero, int *out)
{
    int acc[CHAINS][4];
    for (int c = 0; c < CHAINS; c++)
        for (int j = 0; j < 4; j++)
            acc[c][j] = c0 + c; /* distinct chains: the compiler may not merge them */
    /* the operands from a kernel argument, so the compiler cannot fold them */
    for (int i = 0; i < iters; i++) {
        /* operands ptxas cannot prove loop-invariant or shared between
         * chains (zero is 0 at run time): with one A and B for all chains it
         * formed the product once and added it to each (s11r5: 5 IMMAs for
         * 8 chains, an "int8 rate" above the hardware's) */
        const uint32_t v = (uint32_t)i & zero;
#pragma unroll
        for (int c = 0; c < CHAINS; c++) {
            const uint32_t a0 = a_word | (v >> c), a1 = a_word | (v >> (c + 8)), a2 = a_word | (v >> (c + 16)),
                           a3 = a_word | (v >> (c + 24)), b0 = b_word | (v << c), b1 = b_word | (v << (c + 8));
            if (INT4)
                asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.u4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+r"(acc[c][0]), "+r"(acc[c][1]), "+r"(acc[c][2]), "+r"(acc[c][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            else
                asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+r"(acc[c][0]), "+r"(acc[c][1]), "+r"(acc[c][2]), "+r"(acc[c][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < 32)
        for (int j = 0; j < 4; j++)
            out[threadIdx.x * 4 + j] = acc[0][j];
}

template <bool INT4>
static int run(const cudaDeviceProp &p, int khz)
{
    const int K = INT4 ? 64 : 32;
    /* A = 3 in every u8 / u4 lane, B = -2 in every s8 / s4 lane */
    const uint32_t a_word = INT4 ? 0x33333333u : 0x03030303u, b_word = INT4 ? 0xEEEEEEEEu : 0xFEFEFEFEu;
    int *d_out = nullptr, h_out[128];
    CK(cudaMalloc(&d_out, sizeof h_out));
    const int blocks = p.multiProcessorCount * 4, threads = 128, iters = 1 << 14;
    const int want_short = 5 - 6 * K; /* one step of chain 0 */
    k_probe<INT4><<<1, 32>>>(1, a_word, b_word, 5, 0u, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h_out, d_out, sizeof h_out, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 128; i++)
        bad += h_out[i] != want_short;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    k_probe<INT4><<<blocks, threads>>>(iters, a_word, b_word, 5, 0u, d_out); /* warm-up */
    CK(cudaEventRecord(e0));
    k_probe<INT4><<<blocks, threads>>>(iters, a_word, b_word, 5, 0u, d_out);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double mmas = (double)blocks * (threads / 32) * iters * CHAINS;
    const double ops = mmas * 16.0 * 8.0 * K * 2.0;
    printf("%-28s %s: %8.3f ms, %.3g MMAs/s, %7.1f TOPS, %.0f weight bytes per SM-cycle at %d MHz; check %s\n",
           INT4 ? "m16n8k64 u4 x s4" : "m16n8k32 u8 x s8", p.name, ms, mmas / (ms * 1e-3), ops / (ms * 1e-3) / 1e12,
           /* A operand bytes consumed per SM per clock: 16 x K values of 4 bits (the GEMV's weights either way) */
           mmas * 16.0 * K / 2.0 / (ms * 1e-3) / p.multiProcessorCount / (khz * 1e3), khz / 1000,
           bad ? "FAILED" : "ok");
    cudaFree(d_out);
    return bad ? 1 : 0;
}

int main(void)
{
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int khz = 0; /* the SM clock the device reports (its boost clock) */
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    int rc = run<false>(p, khz);
    rc |= run<true>(p, khz);
    return rc;
}
