/* Device helpers of the decode GEMVs, shared by cuda_matmul.cu (the SIMT
 * GEMV) and cuda_gemv_int.cu (the tensor-core GEMVs): included once by
 * each, inside an anonymous namespace, so each file has its own copies. */
#ifndef SANCTUM_CUDA_QUANT_H
#define SANCTUM_CUDA_QUANT_H

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

/* x as integers for the exact integer dot products (k_x_digits for the
 * tensor-core GEMVs, gd_stage_x for the dp4a GEMV): per token and quant
 * group, X = round(x * 2^e2) with e2 from the group's largest |x| so that
 * |X| <= 2^22, cut into three signed 8-bit digits, X = 65536*d0 + 256*d1
 * + d2. */
__device__ __forceinline__ int xd_exp(float mx)
{
    int e2 = 0;
    if (mx > 0.f && isfinite(mx)) {
        frexpf(mx, &e2); /* mx < 2^e2 */
        e2 = max(-100, min(100, 22 - e2));
    }
    return e2;
}

__device__ __forceinline__ int xd_split(float v, int e2, int &d0, int &d1, int &d2)
{
    const int X = __float2int_rn(ldexpf(v, e2));
    d2 = ((X + 128) & 255) - 128;
    const int X1 = (X - d2) >> 8;
    d1 = ((X1 + 128) & 255) - 128;
    d0 = (X1 - d1) >> 8;
    return X;
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

} // namespace

#endif
