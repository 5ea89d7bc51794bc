/* Optional prefill GEMM through cuBLAS, loaded at run time with dlopen (the
 * build links only the static CUDA runtime, so a binary still runs where no
 * cuBLAS is installed: our own tensor-core GEMM is used then).
 *
 * Why: prefill is compute bound (2 FLOP per weight per token), and cuBLAS's
 * Hopper kernels (wgmma) run fp16 at several times the rate of our mma.sync
 * kernel. The weights stay 4-bit in memory; each call dequantizes the matrix
 * to fp16 in row chunks (about 4 extra bytes per weight of traffic, small
 * next to 2*T FLOP per weight at T in the hundreds) and multiplies it with
 * the fp16 copy of x that the GEMM path already makes. */
#include <dlfcn.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_internal.h"

namespace {

struct blas_api {
    void *lib, *lt;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
};

struct blas_ctx {
    blas_api api;
    cublasHandle_t h;
};

void *try_open(const char *name)
{
    return dlopen(name, RTLD_NOW | RTLD_GLOBAL);
}

/* dequantize rows [r0, r0+n) of matrix e to fp16 rows of ld = nseg*Kp:
 * [wh | wh | wl*2^11] for nseg 3 (see k_x_to_f16), [wh] for 1; columns
 * past cols are zeroed by the caller. One thread per word. */
__global__ void k_dequant_f16(cu_weight w, const uint32_t *__restrict__ q, const void *__restrict__ sb, int64_t r0,
                              int64_t n, int64_t Kp, int nseg, __half *__restrict__ out)
{
    int per = 32 / w.bits;
    int64_t total = n * w.words;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / w.words, wi = i % w.words;
        int64_t row = r0 + r;
        uint32_t word = q[row * w.words + wi];
        int64_t c0 = wi * per;
        int64_t gi = row * w.groups + c0 / w.group;
        float s, b;
        if (w.sfmt == CS_F32) {
            float2 p = ((const float2 *)sb)[gi];
            s = p.x;
            b = p.y;
        } else {
            uint32_t v = ((const uint32_t *)sb)[gi];
            if (w.sfmt == CS_BF16) {
                s = __uint_as_float(v << 16);
                b = __uint_as_float(v & 0xffff0000u);
            } else {
                __half2 h = *reinterpret_cast<__half2 *>(&v);
                float2 f = __half22float2(h);
                s = f.x;
                b = f.y;
            }
        }
        __half *o = out + r * nseg * Kp + c0;
        uint32_t mask = (1u << w.bits) - 1u;
        for (int k = 0; k < per; k += 2) {
            float v0 = s * (float)((word >> (w.bits * k)) & mask) + b;
            float v1 = s * (float)((word >> (w.bits * (k + 1))) & mask) + b;
            __half2 h = __floats2half2_rn(v0, v1);
            *reinterpret_cast<__half2 *>(o + k) = h;
            if (nseg == 3) {
                float2 hf = __half22float2(h);
                *reinterpret_cast<__half2 *>(o + Kp + k) = h;
                *reinterpret_cast<__half2 *>(o + 2 * Kp + k) =
                    __floats2half2_rn((v0 - hf.x) * 2048.f, (v1 - hf.y) * 2048.f);
            }
        }
    }
}

/* y[t, r] = y[t, r] * sig[t] + bias[r] */
__global__ void k_epilogue(float *__restrict__ y, const float *__restrict__ sig, const float *__restrict__ bias,
                           int T, int64_t rows)
{
    size_t n = (size_t)T * rows;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int64_t t = (int64_t)(i / rows), r = (int64_t)(i % rows);
        y[i] = y[i] * sig[t] + (bias ? bias[r] : 0.f);
    }
}

constexpr size_t CHUNK_BYTES = (size_t)256 << 20; /* fp16 weights per GEMM call */

} // namespace

sn_status cu_blas_open(cudaStream_t s, void **out)
{
    *out = NULL;
    blas_ctx *c = (blas_ctx *)calloc(1, sizeof *c);
    if (!c)
        return SN_FAIL(SN_E_NOMEM, "cublas");
    const char *dirs[] = { "", "/usr/local/cuda/lib64/", "/usr/local/cuda/targets/x86_64-linux/lib/" };
    for (int i = 0; i < 3 && !c->api.lib; i++) {
        char p[256];
        snprintf(p, sizeof p, "%slibcublasLt.so.13", dirs[i]);
        void *lt = try_open(p);
        snprintf(p, sizeof p, "%slibcublas.so.13", dirs[i]);
        c->api.lib = try_open(p);
        if (c->api.lib)
            c->api.lt = lt;
        else if (lt)
            dlclose(lt);
    }
    if (!c->api.lib) {
        free(c);
        return SN_FAIL(SN_E_UNSUPPORTED, "cublas: libcublas.so.13 not found");
    }
    c->api.create = (decltype(c->api.create))dlsym(c->api.lib, "cublasCreate_v2");
    c->api.destroy = (decltype(c->api.destroy))dlsym(c->api.lib, "cublasDestroy_v2");
    c->api.set_stream = (decltype(c->api.set_stream))dlsym(c->api.lib, "cublasSetStream_v2");
    c->api.gemm = (decltype(c->api.gemm))dlsym(c->api.lib, "cublasGemmEx");
    if (!c->api.create || !c->api.destroy || !c->api.set_stream || !c->api.gemm ||
        c->api.create(&c->h) != CUBLAS_STATUS_SUCCESS) {
        dlclose(c->api.lib);
        if (c->api.lt)
            dlclose(c->api.lt);
        free(c);
        return SN_FAIL(SN_E_UNSUPPORTED, "cublas: symbols or handle unavailable");
    }
    if (c->api.set_stream(c->h, s) != CUBLAS_STATUS_SUCCESS) {
        c->api.destroy(c->h);
        free(c);
        return SN_FAIL(SN_E_UNSUPPORTED, "cublas: set stream");
    }
    *out = c;
    return SN_OK;
}

void cu_blas_close(void *h)
{
    blas_ctx *c = (blas_ctx *)h;
    if (!c)
        return;
    c->api.destroy(c->h);
    /* the libraries stay loaded: unloading under a live CUDA context is not worth the risk */
    free(c);
}

static int64_t kpad(const cu_weight *w) { return (w->cols + 63) / 64 * 64; }

size_t cu_blas_scratch_bytes(const cu_weight *w, int nseg)
{
    size_t per_row = 2 * (size_t)nseg * kpad(w);
    int64_t rows = (int64_t)(CHUNK_BYTES / per_row);
    rows = rows < 256 ? 256 : rows;
    if (rows > w->rows)
        rows = w->rows;
    return (size_t)rows * per_row + 256;
}

sn_status cu_blas_matmul(void *h, cudaStream_t s, const cu_weight *w, int64_t e, const __half *xh, int64_t Kp,
                         int nseg, const float *sig, int T, float *y, void *wscratch)
{
    blas_ctx *c = (blas_ctx *)h;
    const int64_t ld = nseg * Kp;
    int64_t chunk = (int64_t)((cu_blas_scratch_bytes(w, nseg) - 256) / (2 * (size_t)ld));
    size_t sbsz = w->sfmt == CS_F32 ? 8 : 4;
    const uint32_t *q = (const uint32_t *)w->q + (size_t)e * w->rows * w->words;
    const void *sb = (const char *)w->sb + (size_t)e * w->rows * w->groups * sbsz;
    __half *wh = (__half *)wscratch;
    const float one = 1.f, zero = 0.f;
    for (int64_t r0 = 0; r0 < w->rows; r0 += chunk) {
        int64_t n = w->rows - r0 < chunk ? w->rows - r0 : chunk;
        int64_t words = n * w->words;
        unsigned grid = (unsigned)((words + 255) / 256 > 8192 ? 8192 : (words + 255) / 256);
        /* the kernel indexes rows from r0 of this matrix: pass the matrix base */
        if (Kp != w->cols)
            CU_TRY(cudaMemsetAsync(wh, 0, sizeof(__half) * n * ld, s), "cublas pad");
        k_dequant_f16<<<grid, 256, 0, s>>>(*w, q, sb, r0, n, Kp, nseg, wh);
        CU_CHECK_LAUNCH("cublas dequant");
        /* column-major: C[n, T] (= y^T rows r0..) = W_chunk (op T of [ld, n]) x xh^T [ld, T] */
        cublasStatus_t st = c->api.gemm(c->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, T, (int)ld, &one, wh, CUDA_R_16F,
                                        (int)ld, xh, CUDA_R_16F, (int)ld, &zero, y + r0, CUDA_R_32F, (int)w->rows,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return SN_FAIL(SN_E_BACKEND, "cublasGemmEx [%lld x %d x %lld]: status %d", (long long)n, T,
                           (long long)w->cols, (int)st);
    }
    size_t tot = (size_t)T * w->rows;
    unsigned g = (unsigned)((tot + 255) / 256 > 8192 ? 8192 : (tot + 255) / 256);
    k_epilogue<<<g, 256, 0, s>>>(y, sig, w->bias, T, w->rows);
    CU_CHECK_LAUNCH("cublas epilogue");
    return SN_OK;
}
