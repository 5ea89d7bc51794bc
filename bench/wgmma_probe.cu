/* Do the wgmma operand layouts k_gemm_wg assumed hold on the H200? (k_gemm_wg,
 * the prefill GEMM on wgmma, commit e433e44: bitwise right, slower than
 * k_gemm_i8's mma.sync, taken out; docs/PERFORMANCE.md run 26.) They do
 * (bench/results.log s16r1, s16r2). One warpgroup multiplies a 64 x 32
 * u8 A (from registers) by an N x 32 B (s8 for N = 64, u8 for N = 128, from shared memory, K-major, no
 * swizzle) and the host checks every int32 of D against its own product:
 *
 * - A in registers as mma.m16n8k32's A per warp: warp w holds rows 16w..16w+15;
 *   lane l = 4g + t: a0 = row g, k 4t..4t+3 (a byte each, k ascending),
 *   a1 = row g + 8, same k, a2 = row g, k 16 + 4t.., a3 = row g + 8, k 16 + 4t..
 * - B: core matrices of 8 rows x 16 bytes (row r at +16 r); the one of rows
 *   8i.. and bytes 16c.. at 512 i + 128 c, so LBO (K-adjacent) = 128 and
 *   SBO (N-adjacent) = 512. The probe also runs them swapped, to tell a
 *   wrong assignment from a wrong layout.
 * - D: register 4j + 2h + c of lane 4g + t in warp w = row 16w + g + 8h,
 *   column 8j + 2t + c.
 *
 * Build here: nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o build/wgmma_probe bench/wgmma_probe.cu
 * and run it on the GPU box; it prints one line per case and exits 1 on a
 * mismatch of the assumed layout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "cuda_probe.h"

#define R8(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), "+r"(d[i + 6]), "+r"(d[i + 7])

__device__ __forceinline__ uint64_t desc_of(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

/* N = 64, u8 x s8 */
__device__ __forceinline__ void wg_s8_n64(int (&d)[64], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p;\n}\n"
                 : R8(0), R8(8), R8(16), R8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
/* N = 128, u8 x u8 */
__device__ __forceinline__ void wg_u8_n128(int (&d)[64], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.u8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p;\n}\n"
                 : R8(0), R8(8), R8(16), R8(24), R8(32), R8(40), R8(48), R8(56)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

/* A [64][32] u8, B [N][32] bytes, D [64][N] int32 (starting from 7 everywhere, so the accumulate is checked too) */
__global__ void k_probe(const uint8_t *A, const uint8_t *B, int N, int sgn, uint32_t lbo, uint32_t sbo, int *D)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(128) uint8_t sB[16 * 512]; /* N / 8 core-matrix rows 512 B apart */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* B: byte k of row n at core matrix (n / 8, k / 16) */
    for (int i = tid; i < N * 32; i += 128) {
        const int n = i / 32, k = i % 32;
        const uint32_t off = (uint32_t)((n >> 3) * 512 + (k >> 4) * 128 + (n & 7) * 16 + (k & 15));
        sB[off] = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* generic-proxy writes, async-proxy reads */
    __syncthreads();
    uint32_t a[4];
    for (int r = 0; r < 4; r++) {
        const int row = 16 * warp + g + 8 * (r & 1), k0 = 16 * (r >> 1) + 4 * t;
        uint32_t v = 0;
        for (int j = 0; j < 4; j++)
            v |= (uint32_t)A[row * 32 + k0 + j] << (8 * j);
        a[r] = v;
    }
    int d[64];
    for (int i = 0; i < 64; i++)
        d[i] = 7;
    const uint64_t desc = desc_of((uint32_t)__cvta_generic_to_shared(sB), lbo, sbo);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if (sgn)
        wg_s8_n64(d, a, desc);
    else
        wg_u8_n128(d, a, desc);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const int nreg = N / 2;
    for (int i = 0; i < nreg; i++) {
        const int j = i / 4, h = (i / 2) & 1, c = i & 1;
        D[(16 * warp + g + 8 * h) * N + 8 * j + 2 * t + c] = d[i];
    }
#else
    (void)A; (void)B; (void)N; (void)sgn; (void)lbo; (void)sbo; (void)D;
    __trap();
#endif
}

int main(void)
{
    int bad_assumed = 0;
    uint8_t *hA = (uint8_t *)malloc(64 * 32), *hB = (uint8_t *)malloc(128 * 32);
    int *hD = (int *)malloc(sizeof(int) * 64 * 128);
    srand(12345);
    for (int i = 0; i < 64 * 32; i++) hA[i] = (uint8_t)(rand() & 255);
    for (int i = 0; i < 128 * 32; i++) hB[i] = (uint8_t)(rand() & 255);
    uint8_t *dA, *dB;
    int *dD;
    CK(cudaMalloc(&dA, 64 * 32));
    CK(cudaMalloc(&dB, 128 * 32));
    CK(cudaMalloc(&dD, sizeof(int) * 64 * 128));
    CK(cudaMemcpy(dA, hA, 64 * 32, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hB, 128 * 32, cudaMemcpyHostToDevice));
    for (int sgn = 1; sgn >= 0; sgn--)
        for (int swap = 0; swap < 2; swap++) {
            const int N = sgn ? 64 : 128;
            CK(cudaMemset(dD, 0, sizeof(int) * 64 * 128));
            k_probe<<<1, 128>>>(dA, dB, N, sgn, swap ? 512 : 128, swap ? 128 : 512, dD);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hD, dD, sizeof(int) * 64 * N, cudaMemcpyDeviceToHost));
            int bad = 0, first = -1;
            for (int m = 0; m < 64; m++)
                for (int n = 0; n < N; n++) {
                    int ref = 7;
                    for (int k = 0; k < 32; k++)
                        ref += (int)hA[m * 32 + k] * (sgn ? (int)(int8_t)hB[n * 32 + k] : (int)hB[n * 32 + k]);
                    if (hD[m * N + n] != ref) {
                        if (first < 0) first = m * N + n;
                        bad++;
                    }
                }
            printf("wgmma %s N=%d LBO=%d SBO=%d: %d of %d differ%s", sgn ? "u8 x s8" : "u8 x u8", N, swap ? 512 : 128,
                   swap ? 128 : 512, bad, 64 * N, bad ? "" : " (layout as assumed)");
            if (bad) printf(" (first: row %d col %d)", first / N, first % N);
            printf("\n");
            if (!swap && bad) bad_assumed = 1;
        }
    return bad_assumed;
}
