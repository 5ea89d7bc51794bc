/* The integer tensor-core decode GEMVs of cuda_gemv_int.cu (issue 6), as
 * cuda_matmul.cu's dispatch uses them: repacked Q4 weights (cu_repack_q4),
 * x as three int8 digit planes per (token, quant group), exact int32 MMAs. */
#ifndef SANCTUM_CUDA_GEMV_INT_H
#define SANCTUM_CUDA_GEMV_INT_H

#include "backend/cuda/cuda_internal.h"

constexpr int GI_TMAX = 8; /* tokens per pass */

/* The segments of one launch (matrices that read the same x), filled by the
 * caller (W, S, bias, y, add_to, rows, mt, n); the rest by cu_gi_run. */
struct gi_seg {
    const uint4 *W[CU_GROUP_MAX];
    const void *S[CU_GROUP_MAX];
    const float *bias[CU_GROUP_MAX];
    float *y[CU_GROUP_MAX];
    float *add_to[CU_GROUP_MAX];
    int64_t rows[CU_GROUP_MAX], mt[CU_GROUP_MAX];
    int b0[CU_GROUP_MAX + 1]; /* ring kernel: first block of segment i; b0[n] = the grid */
    /* stream-K kernel: first unit (16 rows x 64 columns) and first row tile of
     * segment i over the concatenated segments; u0[n] = all units */
    int64_t u0[CU_GROUP_MAX + 1];
    int t0[CU_GROUP_MAX + 1];
    int wb[CU_GROUP_MAX + 1]; /* first warp of segment i (a multiple of 8); wb[n] = all warps */
    int n;
};

/* The stream-K GEMV's form of the digits: one record per 64-column block,
 * [planes 3T x 64 bytes (words permuted) | esc [SPK][T] | xsb [SPK][T]],
 * rounded to 16 bytes (SPK: quant groups per block, 2 for group 32). */
__host__ __device__ constexpr int gi_rec_bytes(int T, int spk) { return (3 * T * 64 + 2 * spk * T * 4 + 15) / 16 * 16; }

__host__ __device__ __forceinline__ size_t gi_x_bytes(int64_t cols, int64_t groups, int T)
{
    const size_t planar = ((size_t)3 * T * cols + 255) / 256 * 256 + (size_t)2 * T * groups * 4;
    const size_t rec = (size_t)(cols / 64) * gi_rec_bytes(T, 2);
    return (planar > rec ? planar : rec) + 256;
}

/* Whether a matrix (or group) of qbytes 4-bit bytes over cols columns takes
 * the integer GEMV by shape, and whether this weight / x / T can at all. */
bool cu_gi_size_ok(const cu_devinfo *di, int64_t qbytes, int64_t cols);
bool cu_gi_ok(const cu_devinfo *di, const cu_weight *w, const float *x, int T);
/* T <= GI_TMAX rows through g's segments (norm folded into the digits pass
 * when given); scratch of gi_x_bytes. */
sn_status cu_gi_run(const cu_devinfo *di, cudaStream_t s, gi_seg g, const cu_weight *w0, const float *x, int T,
                    const cu_gemv_norm *norm, void *scratch);
/* From cu_matmul_init: the kernels' shared memory limits. */
sn_status cu_gemv_int_init(const cu_devinfo *di);

#endif
