/* Projections on the GPU: the dispatch of every matmul (decode GEMVs in
 * cuda_gemv.cu and cuda_gemv_int.cu, chosen by shape and format), the
 * dense-weight GEMV, a tensor-core GEMM with fused dequantization for
 * prefill (plus the optional cuBLAS route in cuda_blas.cu), the embedding
 * lookup, and the MoE expert FFN with routing on the device (per-token
 * GEMVs for decode when the two-launch kernels of cuda_moe.cu do not take
 * it, expert-grouped GEMMs for prefill).
 *
 * Prefill: x is converted to fp16 once per call (rows scaled by a power of
 * two); by default both operands are split so the GEMM is fp32-class
 * (k_x_to_f16 explains the form), which the model fixtures need. */
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_gemv_int.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_quant.h"

namespace {

constexpr int GEMV_WARPS = 8;
constexpr int GEMM_MIN_T = 9;    /* T at which the tensor-core GEMM takes over (the GEMV does up to 8) */




__device__ __forceinline__ float2 load_sb(const void *sb, int sf, int64_t i)
{
    if (sf == CS_F32)
        return __ldg((const float2 *)sb + i);
    return sb_pair(make_uint2(__ldg((const unsigned int *)sb + i), 0u), sf);
}


/* Exact float of value i (0..7 / 0..3) of a word, for the non-hot paths. */
template <int BITS>
__device__ __forceinline__ float qval(uint32_t w, int i)
{
    return (float)((w >> (BITS * i)) & ((1u << BITS) - 1u));
}

/* ------------------------------------------------------------------------ */
/* GEMV                                                                      */
/* ------------------------------------------------------------------------ */






/* Weight stream depth: each warp keeps GEMV_STAGES-1 chunks of its rows in
 * flight through cp.async into a shared-memory ring (registers would cap
 * the depth: the decode GEMV is latency bound at one chunk ahead). */
template <int RPW>
struct gemv_ring {
    static constexpr int S = RPW <= 2 ? 4 : 3;
    static constexpr size_t per_warp = (size_t)S * RPW * 32;      /* entries */
    static constexpr size_t bytes = GEMV_WARPS * per_warp * (sizeof(uint4) + sizeof(uint2));
};


template <int RPW>
__device__ __forceinline__ void ring_ptrs(void *smem, size_t xbytes, int warp, uint4 **ring, uint2 **sring)
{
    char *base = (char *)smem + xbytes;
    *ring = (uint4 *)base + (size_t)warp * gemv_ring<RPW>::per_warp;
    *sring = (uint2 *)(base + GEMV_WARPS * gemv_ring<RPW>::per_warp * sizeof(uint4)) +
             (size_t)warp * gemv_ring<RPW>::per_warp;
}

template <int BITS, int TT, int RPW>
__device__ __forceinline__ void qdot_rows(const uint32_t *W, const void *sb, int sf, int64_t words, int64_t groups,
                                          int group, int nrows, const float4 *xs, int64_t stride4,
                                          const float *xsums, float acc[RPW][TT], uint4 *ring, uint2 *sring)
{
    constexpr int VPC = 128 / BITS;
    constexpr int NF4 = VPC / 4;
    constexpr int S = gemv_ring<RPW>::S;
    const int lane = threadIdx.x & 31;
    const int64_t nch = words / 4;
    const int64_t nmy = lane < nch ? (nch - lane + 31) / 32 : 0; /* chunks lane, lane+32, ... */
    /* every lane reads back only what it copied itself: no warp barrier */
    auto issue = [&](int64_t it) {
        int64_t c = lane + 32 * it, g = c * VPC / group;
        int slot = (int)(it % S);
#pragma unroll
        for (int r = 0; r < RPW; r++)
            if (r < nrows) {
                __pipeline_memcpy_async(ring + (slot * RPW + r) * 32 + lane, (const uint4 *)(W + r * words) + c, 16);
                if (sf == CS_F32)
                    __pipeline_memcpy_async(sring + (slot * RPW + r) * 32 + lane,
                                            (const float2 *)sb + r * groups + g, 8);
                else
                    __pipeline_memcpy_async(sring + (slot * RPW + r) * 32 + lane,
                                            (const uint32_t *)sb + r * groups + g, 4);
            }
    };
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (st < nmy)
            issue(st);
        __pipeline_commit();
    }
    for (int64_t it = 0; it < nmy; it++) {
        if (it + S - 1 < nmy)
            issue(it + S - 1);
        __pipeline_commit();
        __pipeline_wait_prior(S - 1);
        const int64_t c = lane + 32 * it;
        const int slot = (int)(it % S);
        uint4 wv[RPW];
        float2 sbv[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            if (r < nrows) {
                wv[r] = ring[(slot * RPW + r) * 32 + lane];
                uint2 e = sring[(slot * RPW + r) * 32 + lane];
                sbv[r] = sb_pair(e, sf);
            } else {
                wv[r] = make_uint4(0, 0, 0, 0);
                sbv[r] = make_float2(0.f, 0.f);
            }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float xv[VPC];
#pragma unroll
            for (int i = 0; i < NF4; i++) {
                float4 f = xs[t * stride4 + xperm<BITS>(c, i)];
                xv[4 * i] = f.x; xv[4 * i + 1] = f.y; xv[4 * i + 2] = f.z; xv[4 * i + 3] = f.w;
            }
            const float xsum = xsums[t * nch + c];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float d = 0.f;
                uint32_t ws[4] = { wv[r].x, wv[r].y, wv[r].z, wv[r].w };
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (BITS == 4) {
                        uint32_t lo = ws[j] & 0x0F0F0F0Fu, hi = (ws[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            d = fmaf(q4v(lo, k), xv[8 * j + 2 * k], d);
                            d = fmaf(q4v(hi, k), xv[8 * j + 2 * k + 1], d);
                        }
                    } else {
#pragma unroll
                        for (int k = 0; k < 2; k++) {
                            float2 p = qpair<8>(ws[j], k);
                            d = fmaf(p.x, xv[4 * j + k], d);
                            d = fmaf(p.y, xv[4 * j + k + 2], d);
                        }
                    }
                }
                /* Q4: sum q*x = 256*(d - xsum/2); Q8: 256*(d - xsum) (values 1 + q/256) */
                float qd = BITS == 4 ? 256.f * (d - 0.5f * xsum) : 256.f * (d - xsum);
                acc[r][t] += sbv[r].x * qd + sbv[r].y * xsum;
            }
        }
    }
}

/* Dense weights: 8 values per lane step. */
template <int FMT>
__device__ __forceinline__ void dense8(const void *W, int64_t i8, float v[8])
{
    if (FMT == CW_F32) {
        float4 a = __ldg((const float4 *)W + 2 * i8), b = __ldg((const float4 *)W + 2 * i8 + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        uint4 u = __ldg((const uint4 *)W + i8);
        uint32_t ws[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (FMT == CW_BF16) {
                v[2 * j] = __uint_as_float(ws[j] << 16);
                v[2 * j + 1] = __uint_as_float(ws[j] & 0xffff0000u);
            } else {
                __half2 h = *reinterpret_cast<__half2 *>(&ws[j]);
                float2 f = __half22float2(h);
                v[2 * j] = f.x;
                v[2 * j + 1] = f.y;
            }
        }
    }
}

template <int FMT>
__device__ __forceinline__ float dense1(const void *W, int64_t i)
{
    if (FMT == CW_F32)
        return ((const float *)W)[i];
    uint16_t h = ((const uint16_t *)W)[i];
    if (FMT == CW_BF16)
        return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* One warp per row; x read through L1 (every warp of the block reads it). */
template <int FMT>
__global__ void k_gemv_dense(const void *__restrict__ W, const float *__restrict__ bias, int64_t rows, int64_t cols,
                             const float *__restrict__ x, int T, float *__restrict__ y)
{
    pdl_enter();
    const int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    const char *Wr = (const char *)W + (size_t)row * cols * (FMT == CW_F32 ? 4 : 2);
    bool vec = (cols % 8) == 0 && ((uintptr_t)x & 15) == 0;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * cols;
        float acc = 0.f;
        if (vec) {
            for (int64_t i8 = lane; i8 < cols / 8; i8 += 32) {
                float v[8];
                dense8<FMT>(Wr, i8, v);
                float4 a = __ldg((const float4 *)xt + 2 * i8), b = __ldg((const float4 *)xt + 2 * i8 + 1);
                acc += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y + v[6] * b.z +
                       v[7] * b.w;
            }
        } else {
            for (int64_t i = lane; i < cols; i += 32)
                acc += dense1<FMT>(Wr, i) * xt[i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0)
            y[(size_t)t * rows + row] = acc + (bias ? bias[row] : 0.f);
    }
}

/* ------------------------------------------------------------------------ */
/* GEMM (T >= GEMM_MIN_T): fp16 tensor cores, fp32 accumulation.             */
/* ------------------------------------------------------------------------ */

/* x rows are scaled by a power of two into fp16 range (|x| < 2^15) so large
 * activations cannot overflow; y is scaled back exactly. Rows >= T and
 * columns >= cols are zero so the GEMM needs no bounds on A.
 *
 * Precise mode (nseg = 3): fp16 keeps 11 bits, too few for the fp32
 * contract of the model fixtures (their logits move by ~1 at fp16), so each
 * product is split: x = xh + xl, w = wh + wl/2^11 and
 *   x.w ~= xh.wh + xl.wh + (xh/2^11).wl          (the xl.wl term is below fp32)
 * which one GEMM computes with K tripled: row t of xh holds the segments
 * [xh | xl | xh/2^11], each Kp long, and the weight side is [wh | wh | wl]
 * (wl scaled by 2^11 keeps it out of fp16's subnormal range). */
__global__ void k_x_to_f16(const float *__restrict__ x, int T, int64_t cols, int64_t Kp, int nseg,
                           __half *__restrict__ xh, float *__restrict__ sig, const int32_t *__restrict__ rowmap,
                           int kdiv)
{
    pdl_enter();
    int t = blockIdx.x;
    /* row t of the result reads x row rowmap[t] / kdiv (a gather for MoE), else row t */
    const float *xt = x + (size_t)(rowmap && t < T ? rowmap[t] / kdiv : t) * cols;
    __shared__ float red[32];
    float m = 0.f;
    if (t < T)
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
            m = fmaxf(m, fabsf(xt[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x == 0)
            red[0] = m;
    }
    __syncthreads();
    m = red[0];
    /* scale = 2^(e-14) with m in [2^e, 2^(e+1)): scaled max lands in [2^14, 2^15) */
    float s = 1.f;
    if (m > 0.f && isfinite(m)) {
        int e;
        frexpf(m, &e); /* m = f * 2^e, f in [0.5, 1) */
        s = ldexpf(1.f, e - 15);
    }
    float inv = 1.f / s;
    __half *row = xh + (size_t)t * nseg * Kp;
    for (int64_t i = threadIdx.x; i < Kp; i += blockDim.x) {
        float v = (t < T && i < cols) ? xt[i] * inv : 0.f;
        __half h = __float2half_rn(v);
        row[i] = h;
        if (nseg == 3) {
            row[Kp + i] = __float2half_rn(v - __half2float(h));
            row[2 * Kp + i] = __float2half_rn(__half2float(h) * (1.f / 2048.f));
        }
    }
    if (threadIdx.x == 0 && t < T)
        sig[t] = s;
}

constexpr int BM = 128, BN = 128, BK = 64, LDS = BK + 8;
constexpr int GEMM_THREADS = 256;
constexpr size_t GEMM_SMEM = (size_t)2 * (BM + BN) * LDS * sizeof(__half);

/* The raw bytes one thread loads for its 32 weights of one tile (row
 * tid/2, columns 32*(tid&1) .. +31 of the tile). */
struct braw {
    uint4 u[8];
    float2 sb;
};

template <int FMT>
__device__ __forceinline__ void b_fetch(const cu_weight &w, const void *q, const void *sb, int64_t row, int64_t c0,
                                        braw &r)
{
    if (row >= w.rows || c0 >= w.cols)
        return; /* b_store writes zeros */
    if (FMT == CW_Q4 || FMT == CW_Q8) {
        constexpr int BITS = FMT == CW_Q4 ? 4 : 8;
        const uint32_t *Wr = (const uint32_t *)q + row * w.words + c0 * BITS / 32;
        r.u[0] = __ldg((const uint4 *)Wr);
        if (BITS == 8)
            r.u[1] = __ldg((const uint4 *)Wr + 1);
        r.sb = load_sb(sb, w.sfmt, row * w.groups + c0 / w.group);
    } else if (FMT == CW_F32) {
        const float *Wr = (const float *)q + row * w.cols + c0;
        if ((w.cols & 3) == 0 && c0 + 32 <= w.cols) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                r.u[i] = __ldg((const uint4 *)Wr + i);
        } else {
            float *f = (float *)r.u;
            for (int i = 0; i < 32; i++)
                f[i] = c0 + i < w.cols ? Wr[i] : 0.f;
        }
    } else {
        const uint16_t *Wr = (const uint16_t *)q + row * w.cols + c0;
        if ((w.cols & 7) == 0 && c0 + 32 <= w.cols) {
#pragma unroll
            for (int i = 0; i < 4; i++)
                r.u[i] = __ldg((const uint4 *)Wr + i);
        } else {
            uint16_t *h = (uint16_t *)r.u;
            for (int i = 0; i < 32; i++)
                h[i] = c0 + i < w.cols ? Wr[i] : (uint16_t)0;
        }
    }
}

template <int FMT>
__device__ __forceinline__ void b_store(const cu_weight &w, int64_t row, int64_t c0, const braw &r, __half *dst,
                                        bool lo)
{
    float v[32];
    if (row >= w.rows || c0 >= w.cols) {
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = 0.f;
    } else if (FMT == CW_Q4) {
        /* s*q + b with q = 16*(p-1): (16 s)*p + (b - 16 s) */
        float s16 = 16.f * r.sb.x, b2 = r.sb.y - s16;
        uint32_t ws[4] = { r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w };
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 p = qpair<4>(ws[j], k);
                v[8 * j + k] = fmaf(s16, p.x, b2);
                v[8 * j + k + 4] = fmaf(s16, p.y, b2);
            }
    } else if (FMT == CW_Q8) {
        float s256 = 256.f * r.sb.x, b2 = r.sb.y - s256;
        uint32_t ws[8] = { r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w, r.u[1].x, r.u[1].y, r.u[1].z, r.u[1].w };
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int k = 0; k < 2; k++) {
                float2 p = qpair<8>(ws[j], k);
                v[4 * j + k] = fmaf(s256, p.x, b2);
                v[4 * j + k + 2] = fmaf(s256, p.y, b2);
            }
    } else if (FMT == CW_F32) {
        const float *f = (const float *)r.u;
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = f[i];
    } else {
        const uint16_t *h = (const uint16_t *)r.u;
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = FMT == CW_BF16 ? __uint_as_float((uint32_t)h[i] << 16) : __half2float(__ushort_as_half(h[i]));
    }
    if (lo) /* the part fp16 missed, times 2^11 */
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = (v[i] - __half2float(__float2half_rn(v[i]))) * 2048.f;
    uint4 *d = (uint4 *)dst;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h0 = __floats2half2_rn(v[8 * i], v[8 * i + 1]), h1 = __floats2half2_rn(v[8 * i + 2], v[8 * i + 3]);
        __half2 h2 = __floats2half2_rn(v[8 * i + 4], v[8 * i + 5]), h3 = __floats2half2_rn(v[8 * i + 6], v[8 * i + 7]);
        uint4 o;
        o.x = *reinterpret_cast<uint32_t *>(&h0);
        o.y = *reinterpret_cast<uint32_t *>(&h1);
        o.z = *reinterpret_cast<uint32_t *>(&h2);
        o.w = *reinterpret_cast<uint32_t *>(&h3);
        d[i] = o;
    }
}

__device__ __forceinline__ void a_fetch_async(const __half *xh, int64_t ld, int64_t m0, int64_t k0, __half *As)
{
    /* 128 rows x 64 halves = 1024 chunks of 16 B, 4 per thread */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int chunk = threadIdx.x + i * GEMM_THREADS;
        int r = chunk >> 3, c8 = (chunk & 7) * 8;
        __pipeline_memcpy_async(As + r * LDS + c8, xh + (size_t)(m0 + r) * ld + k0 + c8, 16);
    }
}

/* One BM x BN output tile: rows [m0, min(m0+BM, mend)) of xh times the
 * weight rows [n0, n0+BN) (q, sb: the matrix's own base), into
 * y[t * w.rows + n]. Rows of xh up to m0+BM must exist (zero padded). */
template <int FMT>
__device__ __forceinline__ void gemm_tile(const cu_weight &w, const void *__restrict__ q, const void *__restrict__ sb,
                                          const __half *__restrict__ xh, const float *__restrict__ sig, int64_t Kp,
                                          int nseg, int64_t m0, int64_t mend, int64_t n0, float *__restrict__ y)
{
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __half *As = (__half *)smem_raw;                 /* [2][BM][LDS] */
    __half *Bs = As + 2 * BM * LDS;                  /* [2][BN][LDS] */
    const int warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3; /* 2 x 4 warps, 64 x 32 each */
    const int brow = threadIdx.x >> 1, bcol = (threadIdx.x & 1) * 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.f);

    const int64_t ld = Kp * nseg, nk = ld / BK;
    braw r;
    a_fetch_async(xh, ld, m0, 0, As);
    __pipeline_commit();
    b_fetch<FMT>(w, q, sb, n0 + brow, bcol, r);
    b_store<FMT>(w, n0 + brow, bcol, r, Bs + brow * LDS + bcol, false);
    __pipeline_wait_prior(0);
    __syncthreads();

    for (int64_t kt = 0; kt < nk; kt++) {
        int cur = (int)(kt & 1), nxt = cur ^ 1;
        bool more = kt + 1 < nk;
        /* weight segment of the next tile: [wh | wh | wl] along the tripled K */
        const int64_t kn = (kt + 1) * BK, segn = kn / Kp, cn = kn - segn * Kp;
        if (more) {
            a_fetch_async(xh, ld, m0, kn, As + nxt * BM * LDS);
            __pipeline_commit();
            b_fetch<FMT>(w, q, sb, n0 + brow, cn + bcol, r);
        }
        const __half *Ac = As + cur * BM * LDS, *Bc = Bs + cur * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 4; i++)
                wmma::load_matrix_sync(fa[i], Ac + (wm * 64 + i * 16) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], Bc + (wn * 32 + j * 16) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        if (more) {
            b_store<FMT>(w, n0 + brow, cn + bcol, r, Bs + nxt * BN * LDS + brow * LDS + bcol, segn == 2);
            __pipeline_wait_prior(0);
        }
        __syncthreads();
    }

    /* Epilogue through shared memory: [BM][BN+4] floats fit in the tiles. */
    float *Cs = (float *)smem_raw;
    constexpr int LDC = BN + 4;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm * 64 + i * 16) * LDC + wn * 32 + j * 16, acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < BM * BN; e += GEMM_THREADS) {
        int i = e / BN, j = e % BN;
        int64_t t = m0 + i, n = n0 + j;
        if (t < mend && n < w.rows)
            y[(size_t)t * w.rows + n] = Cs[i * LDC + j] * sig[t] + (w.bias ? w.bias[n] : 0.f);
    }
}

template <int FMT>
__global__ void __launch_bounds__(GEMM_THREADS)
k_gemm(cu_weight w, const void *__restrict__ q, const void *__restrict__ sb, const __half *__restrict__ xh,
       const float *__restrict__ sig, int64_t Kp, int nseg, int T, float *__restrict__ y)
{
    pdl_enter();
    gemm_tile<FMT>(w, q, sb, xh, sig, Kp, nseg, (int64_t)blockIdx.y * BM, T, (int64_t)blockIdx.x * BN, y);
}

/* MoE prefill: rows of xh grouped by expert (segment e = rows
 * [seg_off[e], seg_off[e] + cnt[e])); tile_off[e] = first M tile of
 * expert e, tile_off[E] = all tiles. Block (n tile, M tile). */
template <int FMT>
__global__ void __launch_bounds__(GEMM_THREADS)
k_gemm_moe(cu_weight w, const __half *__restrict__ xh, const float *__restrict__ sig, int64_t Kp, int nseg, int E,
           const int *__restrict__ cnt, const int *__restrict__ seg_off, const int *__restrict__ tile_off,
           float *__restrict__ y)
{
    pdl_enter();
    int tile = blockIdx.y;
    if (tile >= tile_off[E])
        return;
    int lo = 0, hi = E - 1; /* the last e with tile_off[e] <= tile */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tile_off[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    int e = lo;
    int64_t m0 = seg_off[e] + (int64_t)(tile - tile_off[e]) * BM, mend = seg_off[e] + cnt[e];
    size_t sbsz = w.sfmt == CS_F32 ? 8 : 4;
    const void *q = (const uint32_t *)w.q + (size_t)e * w.rows * w.words;
    const void *sb = (const char *)w.sb + (size_t)e * w.rows * w.groups * sbsz;
    gemm_tile<FMT>(w, q, sb, xh, sig, Kp, nseg, m0, mend, (int64_t)blockIdx.x * BN, y);
}

static_assert((size_t)BM * (BN + 4) * sizeof(float) <= GEMM_SMEM, "epilogue tile fits");

/* ------------------------------------------------------------------------ */
/* Embedding                                                                  */
/* ------------------------------------------------------------------------ */

__global__ void k_embed(cu_weight w, const int32_t *__restrict__ ids, float *__restrict__ y)
{
    pdl_enter();
    int t = blockIdx.y;
    int64_t row = ids[t];
    float *yt = y + (size_t)t * w.cols;
    if (w.fmt == CW_Q4 || w.fmt == CW_Q8) {
        int bits = w.bits, per = 32 / bits;
        const uint32_t *Wr = (const uint32_t *)w.q + row * w.words;
        for (int64_t wi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; wi < w.words;
             wi += (int64_t)gridDim.x * blockDim.x) {
            uint32_t word = Wr[wi];
            int64_t c0 = wi * per;
            float2 p = load_sb(w.sb, w.sfmt, row * w.groups + c0 / w.group);
            for (int i = 0; i < per; i++) {
                float qv = bits == 4 ? qval<4>(word, i) : qval<8>(word, i);
                yt[c0 + i] = p.x * qv + p.y;
            }
        }
    } else {
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < w.cols;
             c += (int64_t)gridDim.x * blockDim.x) {
            int64_t i = row * w.cols + c;
            yt[c] = w.fmt == CW_F32 ? dense1<CW_F32>(w.q, i) : w.fmt == CW_BF16 ? dense1<CW_BF16>(w.q, i)
                                                                                 : dense1<CW_F16>(w.q, i);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* MoE                                                                        */
/* ------------------------------------------------------------------------ */

constexpr int MOE_MAX_K = 64;

/* One warp per token: softmax over E logits, top-k by k rounds of a warp
 * argmax (lowest index on ties), weights renormalised over the chosen. */
__global__ void k_moe_route(const float *__restrict__ logits, int T, int E, int k, int norm, int32_t *__restrict__ idx,
                            float *__restrict__ wts)
{
    pdl_enter();
    int t = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (t >= T)
        return;
    const float *l = logits + (size_t)t * E;
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32)
        m = fmaxf(m, l[e]);
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int e = lane; e < E; e += 32)
        sum += expf(l[e] - m);
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int chosen[MOE_MAX_K];
    float pw[MOE_MAX_K];
    float tot = 0.f;
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            bool taken = false;
            for (int jj = 0; jj < j; jj++)
                taken |= chosen[jj] == e;
            float v = l[e];
            if (!taken && (v > best || (v == best && e < bi))) {
                best = v;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) {
                best = ob;
                bi = oi;
            }
        }
        if (bi == 0x7fffffff)
            bi = 0; /* all NaN: keep the index valid */
        chosen[j] = bi;
        pw[j] = expf(best - m) / sum;
        tot += pw[j];
    }
    if (lane == 0)
        for (int j = 0; j < k; j++) {
            idx[(size_t)t * k + j] = chosen[j];
            wts[(size_t)t * k + j] = norm ? pw[j] / tot : pw[j];
        }
}

/* Rows per warp of the expert kernels: expert matrices are small (512 x
 * 2048 for the 35B-A3B), so more, shorter warps keep more loads in flight. */
constexpr int MOE_RPW = 2;

/* h[t, j, r] = silu(gate_e[r] . x_t) * (up_e[r] . x_t) for e = idx[t, j].
 * grid (row blocks, k, T); x_t staged once per block. */
template <int BITS>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_moe_gate_up(const uint32_t *__restrict__ Wg, const void *__restrict__ sbg, const uint32_t *__restrict__ Wu,
              const void *__restrict__ sbu, int sf, int64_t rows, int64_t cols, int64_t words, int64_t groups,
              int group, const int32_t *__restrict__ idx, int k, const float *__restrict__ x, float *__restrict__ h)
{
    pdl_enter();
    extern __shared__ float4 xs[];
    constexpr int NF4 = (128 / BITS) / 4;
    int t = blockIdx.z, j = blockIdx.y;
    int64_t e = idx[(size_t)t * k + j];
    int64_t nch = words / 4;
    int64_t stride4 = ((nch + 31) / 32) * NF4 * 32;
    stage_x<BITS>(xs, x + (size_t)t * cols, 1, cols, stride4);
    const float *xsums = (const float *)(xs + stride4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t sbsz = sf == CS_F32 ? 8 : 4;
    uint4 *ring;
    uint2 *sring;
    ring_ptrs<MOE_RPW>(xs, xstage_bytes(1, nch, stride4), warp, &ring, &sring);
    for (int64_t rb = blockIdx.x; rb * GEMV_WARPS * MOE_RPW < rows; rb += gridDim.x) {
        int64_t r0 = rb * GEMV_WARPS * MOE_RPW + (int64_t)warp * MOE_RPW;
        if (r0 >= rows)
            continue;
        int nrows = (int)min((int64_t)MOE_RPW, rows - r0);
        float ag[MOE_RPW][1] = {}, au[MOE_RPW][1] = {};
        int64_t base = e * rows + r0;
        qdot_rows<BITS, 1, MOE_RPW>(Wg + base * words, (const char *)sbg + base * groups * sbsz, sf, words, groups,
                                    group, nrows, xs, stride4, xsums, ag, ring, sring);
        qdot_rows<BITS, 1, MOE_RPW>(Wu + base * words, (const char *)sbu + base * groups * sbsz, sf, words, groups,
                                    group, nrows, xs, stride4, xsums, au, ring, sring);
#pragma unroll
        for (int r = 0; r < MOE_RPW; r++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                ag[r][0] += __shfl_xor_sync(0xffffffffu, ag[r][0], o);
                au[r][0] += __shfl_xor_sync(0xffffffffu, au[r][0], o);
            }
        if (lane < nrows) {
            float g = 0.f, u = 0.f;
#pragma unroll
            for (int r = 0; r < MOE_RPW; r++)
                if (r == lane) {
                    g = ag[r][0];
                    u = au[r][0];
                }
            h[((size_t)t * k + j) * rows + r0 + lane] = g / (1.f + expf(-g)) * u;
        }
    }
}

/* part[t, j, r] = down_e(j)[r] . h[t, j]; grid (row blocks, k, T): one
 * block per expert slice, so all k experts stream at once. */
template <int BITS>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_moe_down(const uint32_t *__restrict__ Wd, const void *__restrict__ sbd, int sf, int64_t rows, int64_t cols,
           int64_t words, int64_t groups, int group, const int32_t *__restrict__ idx, int k,
           const float *__restrict__ h, float *__restrict__ part)
{
    pdl_enter();
    extern __shared__ float4 xs[];
    constexpr int NF4 = (128 / BITS) / 4;
    int t = blockIdx.z, j = blockIdx.y;
    int64_t e = idx[(size_t)t * k + j];
    int64_t nch = words / 4;
    int64_t stride4 = ((nch + 31) / 32) * NF4 * 32;
    stage_x<BITS>(xs, h + ((size_t)t * k + j) * cols, 1, cols, stride4);
    const float *xsums = (const float *)(xs + stride4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t sbsz = sf == CS_F32 ? 8 : 4;
    uint4 *ring;
    uint2 *sring;
    ring_ptrs<MOE_RPW>(xs, xstage_bytes(1, nch, stride4), warp, &ring, &sring);
    for (int64_t rb = blockIdx.x; rb * GEMV_WARPS * MOE_RPW < rows; rb += gridDim.x) {
        int64_t r0 = rb * GEMV_WARPS * MOE_RPW + (int64_t)warp * MOE_RPW;
        if (r0 >= rows)
            continue;
        int nrows = (int)min((int64_t)MOE_RPW, rows - r0);
        float a[MOE_RPW][1] = {};
        int64_t base = e * rows + r0;
        qdot_rows<BITS, 1, MOE_RPW>(Wd + base * words, (const char *)sbd + base * groups * sbsz, sf, words, groups,
                                    group, nrows, xs, stride4, xsums, a, ring, sring);
#pragma unroll
        for (int r = 0; r < MOE_RPW; r++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                a[r][0] += __shfl_xor_sync(0xffffffffu, a[r][0], o);
        if (lane < nrows) {
            float v = 0.f;
#pragma unroll
            for (int r = 0; r < MOE_RPW; r++)
                if (r == lane)
                    v = a[r][0];
            part[((size_t)t * k + j) * rows + r0 + lane] = v;
        }
    }
}

/* out[t, r] = sum_j w[t, j] * part[t, j, r], j ascending */
__global__ void k_moe_sum(const float *__restrict__ part, const float *__restrict__ wts, int k, int T, int64_t H,
                          float *__restrict__ out)
{
    pdl_enter();
    size_t n = (size_t)T * H;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / H, r = i % H;
        float v = 0.f;
        for (int j = 0; j < k; j++)
            v += wts[t * k + j] * part[(t * k + j) * H + r];
        out[i] = v;
    }
}

/* ---- MoE prefill: token/expert pairs grouped by expert, then GEMMs ---- */

constexpr int MOE_GEMM_MIN_T = 32;

/* Pairs grouped by expert in three small launches over tiles of MOE_TILE
 * pairs (the old form, one block per expert reading all N pairs, was
 * ~140 us per 35B-A3B prefill layer): per-tile counts, one block that
 * turns them into offsets, then one warp per tile placing its pairs. The
 * rows of an expert keep increasing pair order, so perm and pos are what
 * a serial pass over the pairs would give. */
constexpr int MOE_TILE = 512;
constexpr int MOE_SCAN_THREADS = 1024;
constexpr int MOE_MAX_E = 8192; /* the per-expert shared counters of a tile */

/* tcnt[b][e] = pairs of tile b routed to expert e (grid NB, 256 threads, E ints of shared memory) */
__global__ void k_moe_hist(const int32_t *__restrict__ idx, int N, int E, int *__restrict__ tcnt)
{
    pdl_enter();
    extern __shared__ int mh_cnt[];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        mh_cnt[e] = 0;
    __syncthreads();
    const int p0 = blockIdx.x * MOE_TILE, p1 = min(N, p0 + MOE_TILE);
    for (int p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
        const int v = idx[p];
        if (v >= 0 && v < E)
            atomicAdd(&mh_cnt[v], 1); /* integer counts: order does not matter */
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        tcnt[(size_t)blockIdx.x * E + e] = mh_cnt[e];
}

/* One block of MOE_SCAN_THREADS: toff[b][e] = pairs of expert e in tiles
 * before b, cnt[e], and the exclusive prefix sums over experts of rows
 * (seg_off) and of tiles of tile_rows rows (tile_off; BM for the fp16
 * GEMMs, the integer GEMM's token block), each with the total at [E]. */
__global__ void __launch_bounds__(MOE_SCAN_THREADS)
k_moe_offsets(const int *__restrict__ tcnt, int NB, int E, int tile_rows, int *__restrict__ toff,
              int *__restrict__ cnt, int *__restrict__ seg_off, int *__restrict__ tile_off)
{
    pdl_enter();
    __shared__ int wr[32], wt[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ept = (E + MOE_SCAN_THREADS - 1) / MOE_SCAN_THREADS;
    const int e0 = min(E, tid * ept), e1 = min(E, e0 + ept);
    int rows = 0, tiles = 0;
    for (int e = e0; e < e1; e++) {
        int run = 0;
#pragma unroll 8
        for (int b = 0; b < NB; b++) {
            toff[(size_t)b * E + e] = run;
            run += tcnt[(size_t)b * E + e];
        }
        cnt[e] = run;
        rows += run;
        tiles += (run + tile_rows - 1) / tile_rows;
    }
    /* exclusive scan of (rows, tiles) over the threads: warps, then their totals */
    int ir = rows, it = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int r = __shfl_up_sync(0xffffffffu, ir, o), t = __shfl_up_sync(0xffffffffu, it, o);
        if (lane >= o) {
            ir += r;
            it += t;
        }
    }
    if (lane == 31) {
        wr[warp] = ir;
        wt[warp] = it;
    }
    __syncthreads();
    int br = 0, bt = 0, tr = 0, tt = 0;
    for (int w = 0; w < MOE_SCAN_THREADS / 32; w++) {
        br += w < warp ? wr[w] : 0;
        bt += w < warp ? wt[w] : 0;
        tr += wr[w];
        tt += wt[w];
    }
    int r = br + ir - rows, t = bt + it - tiles;
    for (int e = e0; e < e1; e++) {
        seg_off[e] = r;
        tile_off[e] = t;
        const int c = cnt[e];
        r += c;
        t += (c + tile_rows - 1) / tile_rows;
    }
    if (tid == 0) {
        seg_off[E] = tr;
        tile_off[E] = tt;
    }
}

/* One warp per tile (E ints of shared memory): its pairs in increasing
 * order, each expert's next row kept in shared memory; lanes with the same
 * expert (match_any) take consecutive rows in lane order. perm[row] = pair,
 * pos[pair] = row. */
__global__ void k_moe_place(const int32_t *__restrict__ idx, int N, int E, const int *__restrict__ seg_off,
                            const int *__restrict__ toff, int32_t *__restrict__ perm, int32_t *__restrict__ pos)
{
    pdl_enter();
    extern __shared__ int mp_next[];
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32)
        mp_next[e] = seg_off[e] + toff[(size_t)blockIdx.x * E + e];
    __syncwarp();
    const int p0 = blockIdx.x * MOE_TILE, p1 = min(N, p0 + MOE_TILE);
    for (int q = p0; q < p1; q += 32) {
        const int p = q + lane;
        const int v = p < p1 ? idx[p] : -1;
        const bool in = v >= 0 && v < E;
        const unsigned peers = __match_any_sync(0xffffffffu, in ? v : -1);
        int row = 0;
        if (in)
            row = mp_next[v] + __popc(peers & ((1u << lane) - 1u));
        __syncwarp();
        if (in && (__ffs(peers) - 1) == lane)
            mp_next[v] += __popc(peers);
        __syncwarp();
        if (in) {
            perm[row] = p;
            pos[p] = row;
        }
    }
}

__global__ void k_silu_mul(float *__restrict__ g, const float *__restrict__ u, size_t n)
{
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

/* out[t, h] = sum_j w[t, j] * Y[pos[t*k+j], h], j ascending */
__global__ void k_moe_combine(const float *__restrict__ Y, const float *__restrict__ wts,
                              const int32_t *__restrict__ pos, int T, int k, int64_t H, float *__restrict__ out)
{
    pdl_enter();
    size_t n = (size_t)T * H;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / H, h = i % H;
        float v = 0.f;
        for (int j = 0; j < k; j++)
            v += wts[t * k + j] * Y[(size_t)pos[t * k + j] * H + h];
        out[i] = v;
    }
}

/* Dynamic shared memory of a GEMV-family block: staged x for tt tokens
 * and the weight ring of RPW rows per warp. */
size_t gemv_smem(const cu_weight *w, int tt, int rpw)
{
    int vpc = 128 / w->bits;
    int64_t nch = w->words / 4, stride4 = ((nch + 31) / 32) * (vpc / 4) * 32;
    size_t ring = rpw <= 1 ? gemv_ring<1>::bytes : rpw == 2 ? gemv_ring<2>::bytes : gemv_ring<4>::bytes;
    return xstage_bytes(tt, nch, stride4) + ring;
}


template <typename K>
sn_status max_smem(K kern, const cu_devinfo *di, const char *what)
{
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)di->smem_optin), what);
    return SN_OK;
}


template <int FMT>
sn_status launch_gemm(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, int64_t e, const __half *xh,
                      const float *sig, int64_t Kp, int nseg, int T, float *y)
{
    const void *q, *sb = w->sb;
    if (FMT == CW_Q4 || FMT == CW_Q8) {
        q = (const uint32_t *)w->q + (size_t)e * w->rows * w->words;
        sb = (const char *)w->sb + (size_t)e * w->rows * w->groups * (w->sfmt == CS_F32 ? 8 : 4);
    } else {
        q = (const char *)w->q + (size_t)e * w->rows * w->cols * (FMT == CW_F32 ? 4 : 2);
    }
    dim3 grid((unsigned)((w->rows + BN - 1) / BN), (unsigned)((T + BM - 1) / BM));
    (void)cu_launch(k_gemm<FMT>, grid, GEMM_THREADS, GEMM_SMEM, s, *w, q, sb, xh, sig, Kp, nseg, T, y);
    CU_CHECK_LAUNCH("matmul gemm");
    return SN_OK;
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

} // namespace

sn_status cu_matmul_init(const cu_devinfo *di)
{
    SN_TRY(cu_gemv_init(di));
    SN_TRY(cu_gemv_int_init(di));
    SN_TRY(cu_gemm_i8_init(di)); /* [gemm_i8] */
    SN_TRY(max_smem(k_gemm<CW_Q4>, di, "gemm init"));
    SN_TRY(max_smem(k_gemm<CW_Q8>, di, "gemm init"));
    SN_TRY(max_smem(k_gemm<CW_F32>, di, "gemm init"));
    SN_TRY(max_smem(k_gemm<CW_F16>, di, "gemm init"));
    SN_TRY(max_smem(k_gemm<CW_BF16>, di, "gemm init"));
    SN_TRY(max_smem(k_gemm_moe<CW_Q4>, di, "gemm init"));
    SN_TRY(max_smem(k_gemm_moe<CW_Q8>, di, "gemm init"));
    SN_TRY(max_smem(k_moe_gate_up<4>, di, "moe init"));
    SN_TRY(max_smem(k_moe_gate_up<8>, di, "moe init"));
    SN_TRY(max_smem(k_moe_down<4>, di, "moe init"));
    SN_TRY(max_smem(k_moe_down<8>, di, "moe init"));
    if (GEMM_SMEM > di->smem_optin)
        return SN_FAIL(SN_E_UNSUPPORTED, "cuda: GEMM needs %zu B of shared memory, device has %zu", GEMM_SMEM,
                       di->smem_optin);
    return SN_OK;
}

static bool use_blas(const cu_devinfo *di, const cu_weight *w, int T)
{
    return di->blas && di->blas_min_t > 0 && T >= di->blas_min_t && (w->fmt == CW_Q4 || w->fmt == CW_Q8) &&
           w->rows <= INT32_MAX && w->cols <= INT32_MAX;
}

size_t cu_matmul_scratch_bytes(const cu_devinfo *di, const cu_weight *w, int T)
{
    if (T < GEMM_MIN_T)
        return cu_repacked_plain(w) && T <= GI_TMAX ? gi_x_bytes(w->cols, w->groups, T) : 0;
    if (cu_repacked_plain(w) && di->gemm_i8) /* [gemm_i8] */
        return cu_gemm_i8_scratch_bytes(w, T, di->gemm_i8);
    int64_t Tp = round_up(T, BM), Kp = round_up(w->cols, BK), nseg = di->gemm_fast ? 1 : 3;
    size_t a = (size_t)round_up((int64_t)(Tp * nseg * Kp * sizeof(__half)), 256) + (size_t)round_up(Tp * 4, 256);
    return a + (use_blas(di, w, T) ? cu_blas_scratch_bytes(w, (int)nseg) : 0) + 256;
}

bool cu_matmul_gemm_i8(const cu_devinfo *di, const cu_weight *w, int64_t e, int T)
{
    return T >= GEMM_MIN_T && e == 0 && cu_repacked_plain(w) && di->gemm_i8;
}

sn_status cu_matmul(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, int expert, const float *x, int T,
                    float *y, void *scratch, bool x_staged)
{
    if (T <= 0)
        return SN_OK;
    int64_t e = expert;
    if (T >= GEMM_MIN_T) {
        if (cu_matmul_gemm_i8(di, w, e, T)) /* [gemm_i8] */
            return cu_gemm_i8(di, s, w, x, T, y, scratch, di->gemm_i8, x_staged);
        int64_t Tp = round_up(T, BM), Kp = round_up(w->cols, BK);
        int nseg = di->gemm_fast ? 1 : 3;
        __half *xh = (__half *)scratch;
        float *sig = (float *)((char *)scratch + round_up((int64_t)(Tp * nseg * Kp * sizeof(__half)), 256));
        (void)cu_launch(k_x_to_f16, (unsigned)Tp, 256, 0, s, x, T, w->cols, Kp, nseg, xh, sig,
                        (const int32_t *)NULL, 1);
        CU_CHECK_LAUNCH("matmul x->f16");
        if (use_blas(di, w, T)) {
            void *ws = (char *)sig + round_up(Tp * 4, 256);
            return cu_blas_matmul(di->blas, s, w, e, xh, Kp, nseg, sig, T, y, ws);
        }
        switch (w->fmt) {
        case CW_Q4: return launch_gemm<CW_Q4>(di, s, w, e, xh, sig, Kp, nseg, T, y);
        case CW_Q8: return launch_gemm<CW_Q8>(di, s, w, e, xh, sig, Kp, nseg, T, y);
        case CW_F32: return launch_gemm<CW_F32>(di, s, w, e, xh, sig, Kp, nseg, T, y);
        case CW_F16: return launch_gemm<CW_F16>(di, s, w, e, xh, sig, Kp, nseg, T, y);
        default: return launch_gemm<CW_BF16>(di, s, w, e, xh, sig, Kp, nseg, T, y);
        }
    }
    if (cu_matmul_int_path(di, w, e, x, T)) {
        gi_seg g;
        memset(&g, 0, sizeof g);
        g.n = 1;
        g.W[0] = w->qr;
        g.S[0] = w->sr;
        g.bias[0] = w->bias;
        g.y[0] = y;
        g.rows[0] = w->rows;
        g.mt[0] = w->mt;
        return cu_gi_run(di, s, g, w, x, T, NULL, scratch);
    }
    if (w->fmt == CW_Q4 || w->fmt == CW_Q8) {
        gemv_seg g;
        memset(&g, 0, sizeof g);
        g.n = 1;
        g.W[0] = (const uint32_t *)w->q + (size_t)e * w->rows * w->words;
        g.sb[0] = (const char *)w->sb + (size_t)e * w->rows * w->groups * (w->sfmt == CS_F32 ? 8 : 4);
        g.bias[0] = w->bias;
        g.y[0] = y;
        g.rows[0] = w->rows;
        return cu_gv_run(di, s, g, w, x, T);
    }
    int64_t grid = (w->rows + 7) / 8;
    const void *q = (const char *)w->q + (size_t)e * w->rows * w->cols * (w->fmt == CW_F32 ? 4 : 2);
    switch (w->fmt) {
    case CW_F32: (void)cu_launch(k_gemv_dense<CW_F32>, (unsigned)grid, 256, 0, s, q, w->bias, w->rows, w->cols, x, T, y); break;
    case CW_F16: (void)cu_launch(k_gemv_dense<CW_F16>, (unsigned)grid, 256, 0, s, q, w->bias, w->rows, w->cols, x, T, y); break;
    default: (void)cu_launch(k_gemv_dense<CW_BF16>, (unsigned)grid, 256, 0, s, q, w->bias, w->rows, w->cols, x, T, y); break;
    }
    CU_CHECK_LAUNCH("matmul gemv dense");
    return SN_OK;
}

sn_status cu_embed(cudaStream_t s, const cu_weight *w, const int32_t *d_ids, int T, float *y)
{
    if (T <= 0)
        return SN_OK;
    int64_t per_thread = (w->fmt == CW_Q4 || w->fmt == CW_Q8) ? w->words : w->cols;
    unsigned gx = (unsigned)((per_thread + 255) / 256);
    if (gx > 64)
        gx = 64;
    (void)cu_launch(k_embed, dim3(gx, (unsigned)T), 256, 0, s, *w, d_ids, y);
    CU_CHECK_LAUNCH("embed");
    return SN_OK;
}

/* Scratch of the grouped (prefill) path; the layout is walked the same way in cu_moe. */
struct moe_layout {
    size_t idx, wts, cnt, seg, tile, tcnt, toff, perm, pos, sig, xh, g, u, sig2, ah, yd, i8, total;
    bool int8; /* [gemm_i8] the integer GEMMs (all three stacks repacked) */
};

static moe_layout moe_plan(const cu_devinfo *di, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                           int T, int k)
{
    moe_layout L;
    L.int8 = cu_gemm_i8_moe_ok(di, gate) && cu_gemm_i8_moe_ok(di, up) && cu_gemm_i8_moe_ok(di, down);
    int64_t N = (int64_t)T * k, E = gate->n_experts, I = gate->rows, H = gate->cols;
    int64_t nseg = di->gemm_fast ? 1 : 3, KpH = round_up(H, BK), KpI = round_up(I, BK), Np = N + BM;
    size_t o = 0;
    auto take = [&](size_t bytes) { size_t at = o; o += (size_t)round_up((int64_t)bytes, 256); return at; };
    L.idx = take(4 * N);
    L.wts = take(4 * N);
    L.cnt = take(4 * (E + 1));
    L.seg = take(4 * (E + 1));
    L.tile = take(4 * (E + 1));
    const int64_t NB = (N + MOE_TILE - 1) / MOE_TILE;
    L.tcnt = take(4 * NB * E);
    L.toff = take(4 * NB * E);
    L.perm = take(4 * N);
    L.pos = take(4 * N);
    /* the fp16 GEMMs' inputs (not needed by the integer ones) */
    const int64_t f16 = L.int8 ? 0 : 1;
    L.sig = take(f16 * 4 * Np);
    L.xh = take(f16 * 2 * Np * nseg * KpH);
    L.g = take(4 * N * I);
    L.u = take(4 * N * I);
    L.sig2 = take(f16 * 4 * Np);
    L.ah = take(f16 * 2 * Np * nseg * KpI);
    L.yd = take(4 * N * H);
    /* one staged input at a time: x for gate/up, then the activation for down */
    L.i8 = L.int8 ? take(std::max(cu_gemm_i8_moe_scratch_bytes(gate, N, di->gemm_i8),
                                  cu_gemm_i8_moe_scratch_bytes(down, N, di->gemm_i8)))
                  : o;
    L.total = o + 256;
    return L;
}

bool cu_moe_sh_ok(const cu_devinfo *di, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                  const cu_moe_sh *sh, int T, int top_k)
{
    /* the T cu_moe sends to the two-launch decode path */
    return !(T >= MOE_GEMM_MIN_T && di->moe_gemm) && top_k <= MOE_MAX_K && cu_moe_dec_sh_ok(gate, up, down, sh, T, top_k);
}

size_t cu_moe_scratch_bytes(const cu_devinfo *di, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                            int T, int top_k)
{
    if (T >= MOE_GEMM_MIN_T)
        return moe_plan(di, gate, up, down, T, top_k).total;
    return (size_t)T * top_k * (sizeof(int32_t) + sizeof(float)) + 1024 +
           (size_t)T * top_k * (gate->rows + gate->cols) * sizeof(float);
}

template <int FMT>
static sn_status moe_gemm(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, const __half *xh,
                          const float *sig, int64_t Kp, int nseg, int64_t N, const int *cnt, const int *seg,
                          const int *tile, float *y)
{
    dim3 grid((unsigned)((w->rows + BN - 1) / BN), (unsigned)(N / BM + w->n_experts + 1));
    (void)cu_launch(k_gemm_moe<FMT>, grid, GEMM_THREADS, GEMM_SMEM, s, *w, xh, sig, Kp, nseg, (int)w->n_experts, cnt, seg, tile,
                                                          y);
    CU_CHECK_LAUNCH("moe gemm");
    return SN_OK;
}

/* The prefill path: route, group the T*k pairs by expert, gate/up and down
 * as tensor-core GEMMs over each expert's rows (every expert's weights read
 * once per call, not once per token), weighted sum back per token. */
static sn_status moe_grouped(const cu_devinfo *di, cudaStream_t s, const cu_weight *gate, const cu_weight *up,
                             const cu_weight *down, const float *logits, int k, int norm_topk, const float *x, int T,
                             float *out, void *scratch)
{
    moe_layout L = moe_plan(di, gate, up, down, T, k);
    char *b = (char *)scratch;
    int32_t *idx = (int32_t *)(b + L.idx), *perm = (int32_t *)(b + L.perm), *pos = (int32_t *)(b + L.pos);
    float *wts = (float *)(b + L.wts), *sig = (float *)(b + L.sig), *g = (float *)(b + L.g), *u = (float *)(b + L.u);
    float *sig2 = (float *)(b + L.sig2), *yd = (float *)(b + L.yd);
    int *cnt = (int *)(b + L.cnt), *seg = (int *)(b + L.seg), *tile = (int *)(b + L.tile);
    __half *xh = (__half *)(b + L.xh), *ah = (__half *)(b + L.ah);
    int E = (int)gate->n_experts, nseg = di->gemm_fast ? 1 : 3;
    int64_t N = (int64_t)T * k, I = gate->rows, H = gate->cols, KpH = round_up(H, BK), KpI = round_up(I, BK);
    if (E > MOE_MAX_E)
        return SN_FAIL(SN_E_UNSUPPORTED, "moe: %d experts (at most %d on the grouped path)", E, MOE_MAX_E);
    (void)cu_launch(k_moe_route, (unsigned)((T + 3) / 4), 128, 0, s, logits, T, E, k, norm_topk, idx, wts);
    CU_CHECK_LAUNCH("moe route");
    int *tcnt = (int *)(b + L.tcnt), *toff = (int *)(b + L.toff);
    const unsigned NB = (unsigned)((N + MOE_TILE - 1) / MOE_TILE);
    const int tile_rows = L.int8 ? cu_gemm_i8_moe_block_tokens(di->gemm_i8) : BM;
    (void)cu_launch(k_moe_hist, NB, 256, sizeof(int) * (size_t)E, s, idx, (int)N, E, tcnt);
    CU_CHECK_LAUNCH("moe count");
    (void)cu_launch(k_moe_offsets, 1, MOE_SCAN_THREADS, 0, s, tcnt, (int)NB, E, tile_rows, toff, cnt, seg, tile);
    CU_CHECK_LAUNCH("moe offsets");
    (void)cu_launch(k_moe_place, NB, 32, sizeof(int) * (size_t)E, s, idx, (int)N, E, seg, toff, perm, pos);
    CU_CHECK_LAUNCH("moe place");
    if (L.int8) { /* [gemm_i8] the tokens' x staged once; gate and up read a pair's token row through perm */
        void *i8 = b + L.i8;
        SN_TRY(cu_gemm_i8_moe_stage(di, s, gate, x, (const float *)NULL, T, i8));
        SN_TRY(cu_gemm_i8_moe(di, s, gate, N, T, perm, k, cnt, seg, tile, g, i8));
        SN_TRY(cu_gemm_i8_moe(di, s, up, N, T, perm, k, cnt, seg, tile, u, i8));
        /* the swiglu inside the down input's staging (one pass over g and u fewer) */
        SN_TRY(cu_gemm_i8_moe_stage(di, s, down, g, u, N, i8));
        SN_TRY(cu_gemm_i8_moe(di, s, down, N, N, (const int32_t *)NULL, 1, cnt, seg, tile, yd, i8));
    } else {
        /* gathered rows of x (row r = token perm[r] / k), fp16 with padding rows */
        (void)cu_launch(k_x_to_f16, (unsigned)(N + BM), 256, 0, s, x, (int)N, H, KpH, nseg, xh, sig, perm, k);
        CU_CHECK_LAUNCH("moe gather");
        if (gate->fmt == CW_Q4) {
            SN_TRY(moe_gemm<CW_Q4>(di, s, gate, xh, sig, KpH, nseg, N, cnt, seg, tile, g));
            SN_TRY(moe_gemm<CW_Q4>(di, s, up, xh, sig, KpH, nseg, N, cnt, seg, tile, u));
        } else {
            SN_TRY(moe_gemm<CW_Q8>(di, s, gate, xh, sig, KpH, nseg, N, cnt, seg, tile, g));
            SN_TRY(moe_gemm<CW_Q8>(di, s, up, xh, sig, KpH, nseg, N, cnt, seg, tile, u));
        }
        const size_t ni = (size_t)N * I;
        (void)cu_launch(k_silu_mul, (unsigned)((ni + 255) / 256 > 8192 ? 8192 : (ni + 255) / 256), 256, 0, s, g, u, ni);
        CU_CHECK_LAUNCH("moe swiglu");
        (void)cu_launch(k_x_to_f16, (unsigned)(N + BM), 256, 0, s, g, (int)N, I, KpI, nseg, ah, sig2,
                        (const int32_t *)NULL, 1);
        CU_CHECK_LAUNCH("moe act->f16");
        if (down->fmt == CW_Q4)
            SN_TRY(moe_gemm<CW_Q4>(di, s, down, ah, sig2, KpI, nseg, N, cnt, seg, tile, yd));
        else
            SN_TRY(moe_gemm<CW_Q8>(di, s, down, ah, sig2, KpI, nseg, N, cnt, seg, tile, yd));
    }
    size_t nt = (size_t)T * H;
    (void)cu_launch(k_moe_combine, (unsigned)((nt + 255) / 256 > 8192 ? 8192 : (nt + 255) / 256), 256, 0, s, yd, wts, pos, T, k,
                                                                                               H, out);
    CU_CHECK_LAUNCH("moe combine");
    return SN_OK;
}

sn_status cu_moe(const cu_devinfo *di, cudaStream_t s, const cu_weight *gate, const cu_weight *up,
                 const cu_weight *down, const float *logits, int top_k, int norm_topk, const float *x, int T,
                 float *out, void *scratch, const cu_moe_sh *sh, unsigned *moe_sync)
{
    if (T <= 0)
        return SN_OK;
    if (sh) {
        if (!cu_moe_sh_ok(di, gate, up, down, sh, T, top_k))
            return SN_FAIL(SN_E_INVALID, "moe: this shared expert cannot run inside the MoE launches here");
        return cu_moe_dec(s, gate, up, down, logits, top_k, norm_topk, x, T, out, scratch, sh, NULL, moe_sync);
    }
    if (top_k > MOE_MAX_K)
        return SN_FAIL(SN_E_UNSUPPORTED, "moe: top_k %d > %d", top_k, MOE_MAX_K);
    if (T >= MOE_GEMM_MIN_T && di->moe_gemm)
        return moe_grouped(di, s, gate, up, down, logits, top_k, norm_topk, x, T, out, scratch);
    /* [moe] decode: routing + gate/up, then down + weighted sum (cuda_moe.cu) */
    if (cu_moe_dec_ok(gate, up, down, T, top_k))
        return cu_moe_dec(s, gate, up, down, logits, top_k, norm_topk, x, T, out, scratch, NULL, NULL, moe_sync);
    int E = (int)gate->n_experts;
    int32_t *idx = (int32_t *)scratch;
    float *wts = (float *)((char *)scratch + round_up((int64_t)T * top_k * 4, 256));
    float *h = (float *)((char *)wts + round_up((int64_t)T * top_k * 4, 256));
    (void)cu_launch(k_moe_route, (unsigned)((T + 3) / 4), 128, 0, s, logits, T, E, top_k, norm_topk, idx, wts);
    CU_CHECK_LAUNCH("moe route");
    int64_t I = gate->rows, H = gate->cols;
    float *part = (float *)((char *)h + round_up((int64_t)T * top_k * I * 4, 256));
    int64_t nrb = (I + GEMV_WARPS * MOE_RPW - 1) / (GEMV_WARPS * MOE_RPW);
    size_t smem1 = gemv_smem(gate, 1, MOE_RPW);
    dim3 g1((unsigned)nrb, (unsigned)top_k, (unsigned)T);
    if (gate->bits == 4)
        (void)cu_launch(k_moe_gate_up<4>, g1, GEMV_WARPS * 32, smem1, s, (const uint32_t *)gate->q, gate->sb,
                                                             (const uint32_t *)up->q, up->sb, gate->sfmt, I, H,
                                                             gate->words, gate->groups, gate->group, idx, top_k, x, h);
    else
        (void)cu_launch(k_moe_gate_up<8>, g1, GEMV_WARPS * 32, smem1, s, (const uint32_t *)gate->q, gate->sb,
                                                             (const uint32_t *)up->q, up->sb, gate->sfmt, I, H,
                                                             gate->words, gate->groups, gate->group, idx, top_k, x, h);
    CU_CHECK_LAUNCH("moe gate/up");
    int64_t nrb2 = (H + GEMV_WARPS * MOE_RPW - 1) / (GEMV_WARPS * MOE_RPW);
    size_t smem2 = gemv_smem(down, 1, MOE_RPW);
    dim3 g2((unsigned)nrb2, (unsigned)top_k, (unsigned)T);
    if (down->bits == 4)
        (void)cu_launch(k_moe_down<4>, g2, GEMV_WARPS * 32, smem2, s, (const uint32_t *)down->q, down->sb, down->sfmt, H, I,
                                                         down->words, down->groups, down->group, idx, top_k, h, part);
    else
        (void)cu_launch(k_moe_down<8>, g2, GEMV_WARPS * 32, smem2, s, (const uint32_t *)down->q, down->sb, down->sfmt, H, I,
                                                         down->words, down->groups, down->group, idx, top_k, h, part);
    CU_CHECK_LAUNCH("moe down");
    size_t tot = (size_t)T * H;
    (void)cu_launch(k_moe_sum, (unsigned)((tot + 255) / 256 > 4096 ? 4096 : (tot + 255) / 256), 256, 0, s, part, wts, top_k, T, H,
                                                                                              out);
    CU_CHECK_LAUNCH("moe sum");
    return SN_OK;
}

bool cu_matmul_groupable(const cu_weight *a, const cu_weight *b)
{
    return (a->fmt == CW_Q4 || a->fmt == CW_Q8) && b->fmt == a->fmt && b->sfmt == a->sfmt && b->group == a->group &&
           b->cols == a->cols;
}

bool cu_matmul_int_path(const cu_devinfo *di, const cu_weight *w, int64_t e, const float *x, int T)
{
    return T < GEMM_MIN_T && e == 0 && cu_gi_ok(di, w, x, T) && cu_gi_size_ok(di, w->rows * w->cols / 2, w->cols);
}

bool cu_matmul_same_kernel(const cu_devinfo *di, const cu_weight *a, int64_t ea, const cu_weight *b, int64_t eb,
                           const float *x, int T)
{
    return cu_matmul_groupable(a, b) && cu_matmul_int_path(di, a, ea, x, T) == cu_matmul_int_path(di, b, eb, x, T) &&
           cu_gv_small(di, a) == cu_gv_small(di, b);
}

bool cu_matmul_folds_conv(const cu_devinfo *di, const cu_weight *w0, const float *x, int T)
{
    return T < GEMM_MIN_T && !cu_matmul_int_path(di, w0, 0, x, T) && cu_gv_folds_conv(di, w0, T);
}

bool cu_matmul_folds_gnorm(const cu_devinfo *di, const cu_weight *w0, const float *x, const float *gz, const float *nw,
                           const float *xn, int T)
{
    /* only the integer GEMV's digits pass folds it (rows of 128, whole
     * 16-byte loads): it runs once per launch, where in the SIMT GEMV every
     * block would form it again, which measured slower twice (35B-A3B:
     * s10r2, 2.58 against 2.54-2.55 ms a step; s22r2, a fold bitwise as
     * k_gated_rmsnorm_w, 2.396 against 2.364-2.374) */
    const uintptr_t al = (uintptr_t)x | (uintptr_t)gz | (uintptr_t)nw | (uintptr_t)xn;
    return gz && xn && cu_matmul_int_path(di, w0, 0, xn, T) && w0->cols % CU_GNORM_N == 0 && (al & 15) == 0;
}

sn_status cu_matmul_group(const cu_devinfo *di, cudaStream_t s, int n, const cu_weight *const *w, const int64_t *e,
                          float *const *y, float *const *add_to, const float *x, int T, const cu_gemv_norm *norm,
                          const cu_gemv_conv *conv, void *scratch)
{
    if (n < 1 || n > CU_GROUP_MAX)
        return SN_FAIL(SN_E_INVALID, "matmul group of %d", n);
    if (T < 1 || T > CU_GROUP_T_MAX)
        return SN_FAIL(SN_E_INVALID, "matmul group of %d rows (1..%d)", T, CU_GROUP_T_MAX);
    /* each matrix takes the kernel it would take alone, on its own input
     * (the folded op's output row): its bits do not depend on the grouping,
     * which is what prompt-lookup verification relies on */
    const float *in = norm && norm->xn ? norm->xn : x;
    const bool i8 = cu_matmul_int_path(di, w[0], e[0], in, T);
    for (int i = 1; i < n; i++)
        if (!cu_matmul_same_kernel(di, w[0], e[0], w[i], e[i], in, T))
            return SN_FAIL(SN_E_INVALID, "matmul group: weight %d takes another kernel than weight 0", i);
    const size_t cols = (size_t)w[0]->cols;
    if (norm) {
        /* a folded stage the kernel has no form for (the fp32 GEMV has no
         * swiglu; the digits pass reads and writes whole float4s) runs
         * first as its own op, with the same arithmetic */
        const uintptr_t al = (uintptr_t)x | (uintptr_t)norm->w | (uintptr_t)norm->su | (uintptr_t)norm->xn |
                             (uintptr_t)norm->gz;
        const bool gz_ok = e[0] == 0 && cu_matmul_folds_gnorm(di, w[0], x, norm->gz, norm->w, norm->xn, T);
        bool apart = (norm->su && !i8) || (i8 && (al & 15) != 0) || (norm->gz && !gz_ok);
        if (apart && !norm->xn)
            return SN_FAIL(SN_E_INVALID, "matmul group: a folded op without an output row");
        if (apart) {
            if (norm->su)
                SN_TRY(cu_swiglu(s, x, norm->su, (size_t)T * cols, norm->xn));
            else if (norm->gz)
                SN_TRY(cu_gated_rmsnorm(s, x, norm->gz, norm->w, (int)((size_t)T * cols / CU_GNORM_N), CU_GNORM_N,
                                        norm->eps, norm->xn));
            else
                SN_TRY(cu_rmsnorm(s, x, norm->w, T, (int)cols, norm->eps, norm->xn));
            x = norm->xn;
            norm = NULL;
        }
    }
    if (conv && (!cu_matmul_folds_conv(di, w[0], in, T) || e[0] != 0 || w[0]->rows > INT32_MAX))
        return SN_FAIL(SN_E_INVALID, "matmul group: a GDN conv folded into a launch that cannot take it");
    if (i8) {
        gi_seg g;
        memset(&g, 0, sizeof g);
        g.n = n;
        for (int i = 0; i < n; i++) {
            g.W[i] = w[i]->qr;
            g.S[i] = w[i]->sr;
            g.bias[i] = w[i]->bias;
            g.y[i] = y[i];
            g.add_to[i] = add_to ? add_to[i] : NULL;
            g.rows[i] = w[i]->rows;
            g.mt[i] = w[i]->mt;
        }
        return cu_gi_run(di, s, g, w[0], x, T, norm, scratch);
    }
    gemv_seg g;
    memset(&g, 0, sizeof g);
    g.n = n;
    size_t sbsz = w[0]->sfmt == CS_F32 ? 8 : 4;
    for (int i = 0; i < n; i++) {
        g.W[i] = (const uint32_t *)w[i]->q + (size_t)e[i] * w[i]->rows * w[i]->words;
        g.sb[i] = (const char *)w[i]->sb + (size_t)e[i] * w[i]->rows * w[i]->groups * sbsz;
        g.bias[i] = w[i]->bias;
        g.y[i] = y[i];
        g.add_to[i] = add_to ? add_to[i] : NULL;
        g.rows[i] = w[i]->rows;
    }
    if (norm) {
        g.nw = norm->w;
        g.eps = norm->eps;
        g.norm_threads = norm->threads;
        g.xn = norm->xn;
    }
    if (conv)
        g.cv = *conv;
    return cu_gv_run(di, s, g, w[0], x, T);
}
