/* Device helpers for quantized weights and staged activations, shared by
 * cuda_gemv.cu (the SIMT decode GEMV), cuda_gemv_int.cu (the tensor-core
 * GEMVs) and cuda_matmul.cu (GEMM, the per-token MoE kernels): included
 * once by each, inside an anonymous namespace, so each has its own copies. */
#ifndef SANCTUM_CUDA_QUANT_H
#define SANCTUM_CUDA_QUANT_H

#include <math.h>
#include <string.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_internal.h"

namespace {

/* 16 bytes global -> shared through L2 only (cp.async.cg): a weight
 * stream must not evict the activations a kernel keeps in L1. */
__device__ __forceinline__ void cp16_cg(void *smem, const void *gmem)
{
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* An interleaved (scale, bias) pair as floats: bf16/f16 halves in e.x
 * (scale low), or two f32 words. */
__device__ __forceinline__ float2 sb_pair(uint2 e, int sf)
{
    if (sf == CS_F32)
        return make_float2(__uint_as_float(e.x), __uint_as_float(e.y));
    if (sf == CS_BF16)
        return make_float2(__uint_as_float(e.x << 16), __uint_as_float(e.x & 0xffff0000u));
    return __half22float2(*reinterpret_cast<__half2 *>(&e.x));
}

/* RMSNorm's sum of squares for one row exactly as k_rmsnorm with nt
 * threads forms it: thread j adds x[j], x[j+nt], ... in order, then
 * block_sum's tree (xor shuffles in each warp of 32, then over the warp
 * partials). rms_partials: warp w of this block plays that block's warps
 * w, w + nwarps, ..., red[vw] gets warp vw's sum; after a barrier,
 * rms_total (by one full warp) finishes the tree. */
__device__ __forceinline__ void rms_partials(const float *xr, int64_t cols, int nt, float *red)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    for (int vw = warp; vw < nt / 32; vw += nwarps) {
        float ss = 0.f;
        for (int64_t i = vw * 32 + lane; i < cols; i += nt)
            ss += xr[i] * xr[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            red[vw] = ss;
    }
}

__device__ __forceinline__ float rms_total(const float *red, int nt)
{
    const int lane = threadIdx.x & 31;
    float v = lane < nt / 32 ? red[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The digit helpers run on the host too (sn_cuda_digits_host), so the CPU
 * suite checks the digit form without a GPU: bit casts by memcpy (one move
 * on the device), the byte permute by its host equivalent there. */
template <typename To, typename From>
__host__ __device__ __forceinline__ To xd_cast(From v)
{
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}

__host__ __device__ __forceinline__ uint32_t xd_perm(uint32_t a, uint32_t b, uint32_t sel)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, sel);
#else
    const uint64_t v = ((uint64_t)b << 32) | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7))) & 255u) << (8 * i);
    return r;
#endif
}

/* x as integers for the exact integer dot products (k_x_digits for the
 * tensor-core GEMVs, gd_stage_x for the dp4a GEMV): per token and quant
 * group, X = round(x * 2^e2) with e2 from the group's largest |x| so that
 * |X| <= 2^22, cut into three signed 8-bit digits, X = 65536*d0 + 256*d1
 * + d2. */
__host__ __device__ __forceinline__ int xd_exp(float mx)
{
    int e2 = 0;
    if (mx > 0.f && isfinite(mx)) {
        /* frexpf's exponent (mx < 2^e) from the bits: a subnormal mx reads
         * as e = -126, which the clamp below maps to 100 as frexpf's does */
        const int e = (int)((xd_cast<uint32_t>(mx) >> 23) & 255u) - 126;
        e2 = max(-100, min(100, 22 - e));
    }
    return e2;
}

/* 2^e exactly, for e in [-126, 127] (xd_exp's e2 and -e2 are in [-100, 100]) */
__host__ __device__ __forceinline__ float xd_pow2(int e) { return xd_cast<float>((uint32_t)(127 + e) << 23); }

/* X = round(v * 2^e2): v * 2^e2 is ldexpf(v, e2) bitwise (one IEEE multiply
 * by an exact power of two, subnormal results rounded the same way),
 * without ldexpf's instruction sequence on every value of x (the staging is
 * arithmetic-bound). The host rounds half to even as cvt.rni does (values
 * in range: the host path is for checks, not for non-finite x). */
__host__ __device__ __forceinline__ int xd_int(float v, int e2)
{
#ifdef __CUDA_ARCH__
    return __float2int_rn(v * xd_pow2(e2));
#else
    return (int)nearbyintf(v * xd_pow2(e2));
#endif
}

/* X's three digits as the bytes of one word, biased: X + 0x808080 is the
 * base-256 number with digits d + 128 (byte 0 from d2, 1 from d1, 2 from d0),
 * and (d + 128) ^ 0x80 is d's int8 byte, so two instructions replace the
 * shifts and masks of a digit-by-digit split (the same three bytes for every
 * int32 X, checked exhaustively). The xor is left to xd_planes4, one per
 * packed word. */
__host__ __device__ __forceinline__ uint32_t xd_biased(int X) { return (uint32_t)X + 0x808080u; }

/* Four values' xd_biased words a, b, c, d -> their digit planes, value j in
 * byte j: p0 the d0s, p1 the d1s, p2 the d2s. A 4 x 4 byte transpose in
 * seven byte-permutes, then the bias off each word. */
__host__ __device__ __forceinline__ void xd_planes4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t &p0,
                                                    uint32_t &p1, uint32_t &p2)
{
    const uint32_t ab01 = xd_perm(a, b, 0x5140), ab23 = xd_perm(a, b, 0x7362);
    const uint32_t cd01 = xd_perm(c, d, 0x5140), cd23 = xd_perm(c, d, 0x7362);
    p0 = xd_perm(ab23, cd23, 0x5410) ^ 0x80808080u;
    p1 = xd_perm(ab01, cd01, 0x7632) ^ 0x80808080u;
    p2 = xd_perm(ab01, cd01, 0x5410) ^ 0x80808080u;
}

/* One thread's 8 consecutive values v of a token's row (u: its index in
 * the row in 8s) into the dp4a forms' staged digits (layout: cuda_gemv.cu,
 * gd_stage_x): the quant group's exponent over its lpg threads (aligned
 * in the warp), the three digit planes into xw (the token's units) and,
 * by the chunk's first thread, (2^-e2, 2^-e2 * sum X) into xe (the
 * token's chunks). Every lane calls it (the shuffles); in: u is in the row. */
__device__ __forceinline__ void gd_digits8(const float (&v)[8], int lpg, bool in, int u, uint32_t *xw, float2 *xe)
{
    float mx = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++)
        mx = fmaxf(mx, fabsf(v[k]));
    for (int o = lpg / 2; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const int e2 = xd_exp(mx);
    /* word h of a plane holds the digits of values h, h + 2, h + 4, h + 6 */
    uint32_t pw[3][2], ub[8];
    int S = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int X = xd_int(v[k], e2);
        S += X;
        ub[k] = xd_biased(X);
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
        xd_planes4(ub[h], ub[h + 2], ub[h + 4], ub[h + 6], pw[0][h], pw[1][h], pw[2][h]);
    S += __shfl_xor_sync(0xffffffffu, S, 1); /* the chunk's four threads; integers: exact */
    S += __shfl_xor_sync(0xffffffffu, S, 2);
    if (in) {
        const int c = u >> 2, j = u & 3, it = c >> 5, l = c & 31;
#pragma unroll
        for (int pl = 0; pl < 3; pl++) {
            const int unit = (it * 3 + pl) * 2 + (j >> 1);
            uint32_t *d = xw + ((size_t)unit * 32 + l) * 4 + (j & 1) * 2;
            d[0] = pw[pl][0];
            d[1] = pw[pl][1];
        }
        if (j == 0) {
            const float es = xd_pow2(-e2);
            xe[c] = make_float2(es, __fmul_rn((float)S, es));
        }
    }
}

/* out = a[ps] for a pass index known only at run time (ps < N), without
 * indexing the register array by it (which would put it in local memory):
 * the dp4a stagings' values loaded ahead, a pass of 8 per thread */
template <int N>
__device__ __forceinline__ void gd_pick(const float (&a)[N][8], int ps, float (&out)[8])
{
#pragma unroll
    for (int q = 0; q < N; q++)
        if (q == ps)
#pragma unroll
            for (int k = 0; k < 8; k++)
                out[k] = a[q][k];
}

/* Bytes of the dp4a forms' staged digits: TT tokens, nit chunk steps, nch
 * chunks (layout: cuda_gemv.cu, gd_stage_x) */
__host__ __device__ __forceinline__ size_t gd_stage_bytes(int TT, int nit, int64_t nch)
{
    return ((size_t)TT * nit * 3072 + (size_t)TT * nch * 8 + 15) / 16 * 16;
}

/* One chunk of RPW rows against TT tokens on the digits staged as
 * cuda_gemv.cu's gd_stage_x lays them out (its comment): the dp4a GEMV's
 * and the MoE gate/up kernel's dp4a form (cuda_moe.cu). */
template <int TT, int RPW>
__device__ __forceinline__ void gd_chunk(const uint4 *wv, const float2 *sbv, const char *stage, int nit, int nch, int c,
                                         float acc[RPW][TT], int T)
{
    const int it = c >> 5, l = c & 31;
    const uint4 *xw = (const uint4 *)stage;
    const float2 *xe = (const float2 *)(stage + (size_t)TT * nit * 3072);
    int lo[RPW][4], hi[RPW][4];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
            lo[r][j] = (int)(w & 0x0F0F0F0Fu);
            hi[r][j] = (int)((w >> 4) & 0x0F0F0F0Fu);
        }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (TT > 1 && t >= T)
            break;
        const uint4 *xp = xw + (size_t)(t * nit + it) * 6 * 32 + l;
        uint4 a[3][2];
#pragma unroll
        for (int pl = 0; pl < 3; pl++) {
            a[pl][0] = xp[(2 * pl) * 32];
            a[pl][1] = xp[(2 * pl + 1) * 32];
        }
        const float2 e = xe[(size_t)t * nch + c];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            int D[3];
#pragma unroll
            for (int pl = 0; pl < 3; pl++) {
                int d = __dp4a(lo[r][0], (int)a[pl][0].x, 0);
                d = __dp4a(hi[r][0], (int)a[pl][0].y, d);
                d = __dp4a(lo[r][1], (int)a[pl][0].z, d);
                d = __dp4a(hi[r][1], (int)a[pl][0].w, d);
                d = __dp4a(lo[r][2], (int)a[pl][1].x, d);
                d = __dp4a(hi[r][2], (int)a[pl][1].y, d);
                d = __dp4a(lo[r][3], (int)a[pl][1].z, d);
                d = __dp4a(hi[r][3], (int)a[pl][1].w, d);
                D[pl] = d;
            }
            /* 256*D1 + D2 and D0 are exact in fp32; one rounding for the sum */
            const float qx = __fmul_rn(fmaf(65536.f, (float)D[0], (float)(D[1] * 256 + D[2])), e.x);
            acc[r][t] = __fadd_rn(acc[r][t], fmaf(sbv[r].x, qx, __fmul_rn(sbv[r].y, e.y)));
        }
    }
}

/* The opt-in limit less the kernel's static shared memory. */
template <typename K>
sn_status max_smem_dyn(K kern, const cu_devinfo *di, const char *what)
{
    cudaFuncAttributes fa;
    CU_TRY(cudaFuncGetAttributes(&fa, kern), what);
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(di->smem_optin - fa.sharedSizeBytes)),
           what);
    /* all of L1 as shared memory, so several rings fit per SM */
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100), what);
    return SN_OK;
}

/* Two quantized values of word w as floats 1 + q/2^bits: pair k of a Q4 word
 * is nibbles (k, k+4); of a Q8 word bytes (k, k+2). */
template <int BITS>
__device__ __forceinline__ float2 qpair(uint32_t w, int k)
{
    uint32_t h;
    if (BITS == 4) {
        uint32_t s = k == 0 ? (w << 6) : k == 1 ? (w << 2) : k == 2 ? (w >> 2) : (w >> 6);
        h = (s & 0x03C003C0u) | 0x3C003C00u;
    } else {
        uint32_t s = k == 0 ? (w << 2) : (w >> 6);
        h = (s & 0x03FC03FCu) | 0x3C003C00u;
    }
    return __half22float2(*reinterpret_cast<__half2 *>(&h));
}

/* Lane-major x layout: chunk c (VPC = 128/BITS values, one uint4 of words)
 * float4 i lives at float4 index ((c >> 5) * NF4 + i) * 32 + (c & 31), in
 * the width of c (the MoE kernels' 32-bit chunk indices). */
template <int BITS, typename I>
__device__ __forceinline__ I xperm(I c, int i)
{
    constexpr int NF4 = (128 / BITS) / 4;
    return ((c >> 5) * NF4 + i) * 32 + (c & 31);
}

/* After the staged x of T tokens ([T][stride4] float4s, lane-major), the
 * sum of each chunk's values ([T][nch] floats), in value order; so the
 * affine bias costs one FMA per chunk and row. Ends with a barrier. */
template <int BITS>
__device__ void chunk_sums(float4 *xs, int T, int64_t nch, int64_t stride4)
{
    constexpr int NF4 = (128 / BITS) / 4;
    float *sums = (float *)(xs + (size_t)T * stride4);
    /* 32-bit indices (T * nch is small): a 64-bit division is a subroutine call */
    const unsigned n = (unsigned)nch;
    for (unsigned tc = threadIdx.x; tc < (unsigned)T * n; tc += blockDim.x) {
        const int t = T == 1 ? 0 : (int)(tc / n); /* one row (decode): no division */
        const int64_t c = tc - (unsigned)t * n;
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < NF4; i++) {
            float4 f = xs[t * stride4 + xperm<BITS>(c, i)];
            a += f.x;
            a += f.y;
            a += f.z;
            a += f.w;
        }
        sums[tc] = a;
    }
    __syncthreads();
}

/* x_t for t < T into shared memory in the lane-major order, followed by
 * the sum of each chunk's values ([T][nch] floats after the T*stride4
 * float4s), so the affine bias costs one FMA per chunk and row. Ends with
 * a barrier. */

/* Q4 values as floats without a conversion instruction: the low nibbles
 * of w (values 0,2,4,6 in bytes 0..3) and the high ones (1,3,5,7) are
 * masked into bytes, and one byte-permute per value builds the float
 * 0x3F00qq00 = 0.5 + q/256 (q in the top mantissa bits, so the fp32 sums
 * keep ~20 bits once 0.5*sum(x) is taken off). */
__device__ __forceinline__ float q4v(uint32_t bytes, int k)
{
    return __uint_as_float(__byte_perm(bytes, 0x3F000000u, 0x7044u | ((uint32_t)k << 8)));
}

/* Bytes of staged x (and its chunk sums) for T tokens, 16-aligned. */
__host__ __device__ __forceinline__ size_t xstage_bytes(int T, int64_t nch, int64_t stride4)
{
    return ((size_t)T * stride4 * 16 + (size_t)T * nch * 4 + 15) / 16 * 16;
}

template <int BITS>
__device__ void stage_x(float4 *xs, const float *x, int T, int64_t cols, int64_t stride4)
{
    constexpr int NF4 = (128 / BITS) / 4;
    int64_t n4 = cols / 4, nch = n4 / NF4;
    bool aligned = ((uintptr_t)x & 15) == 0; /* cols % 4 == 0 always (cols % 32 == 0) */
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * cols;
        for (int64_t q = threadIdx.x; q < n4; q += blockDim.x) {
            int64_t c = q / NF4;
            float4 v = aligned ? __ldg((const float4 *)xr + q)
                               : make_float4(xr[4 * q], xr[4 * q + 1], xr[4 * q + 2], xr[4 * q + 3]);
            xs[t * stride4 + xperm<BITS>(c, (int)(q % NF4))] = v;
        }
    }
    __syncthreads();
    chunk_sums<BITS>(xs, T, nch, stride4);
}

} // namespace

#endif
