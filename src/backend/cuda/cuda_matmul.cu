/* Projections on the GPU: quantized/dense GEMV for decode (T <= 7), a
 * tensor-core GEMM with fused dequantization for prefill (plus the optional
 * cuBLAS route in cuda_blas.cu), the embedding lookup, and the MoE expert
 * FFN with routing on the device (per-token GEMVs for decode, expert-grouped
 * GEMMs for prefill).
 *
 * Decode is a pure memory stream (4.5 bits per weight against 32-bit
 * activations), so the GEMV is built around the bytes: each lane streams 16
 * bytes of a row per step (512 B per warp, coalesced) through a per-warp
 * cp.async ring a few chunks deep; a warp works on 2 or 4 rows so each
 * activation read from shared memory feeds several rows; the activation
 * vector sits in shared memory in a lane-major order (no bank conflicts for
 * the 16-byte reads) next to the sum of each chunk. Q4 nibbles become floats
 * with one byte-permute each (0x3F00qq00 = 0.5 + q/256, see q4v), Q8 bytes
 * two at a time through a half2 (1 + q/256, see qpair); in both forms the
 * fp32 dot product of v and x minus the chunk sum gives sum(q*x) with ~20
 * good bits, and the affine bias costs one FMA per chunk and row. Q4 in
 * MLX's groups takes the dp4a form by default (gemv_dp; see gd_stage_x):
 * x as int8 digits, exact integer partials, fewer instructions per weight.
 *
 * Prefill: x is converted to fp16 once per call (rows scaled by a power of
 * two); by default both operands are split so the GEMM is fp32-class
 * (k_x_to_f16 explains the form), which the model fixtures need. */
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include "backend/cuda/cuda_gemv_int.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_quant.h"

namespace {

constexpr int GEMV_WARPS = 8;
constexpr int GEMM_MIN_T = 9;    /* T at which the tensor-core GEMM takes over (the GEMV does up to 8) */


/* cp.async to a 32-bit shared address, without a memory clobber: the
 * caller orders its reads of the destination around cp_async_wait (which
 * has one) and a compiler barrier before it refills a slot. 16-byte copies
 * go through L2 only (.cg), smaller ones must use .ca. */

template <int N>
__device__ __forceinline__ void cp_async_sa(uint32_t sa, const void *gmem)
{
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(sa), "l"(gmem), "n"(N));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}


__device__ __forceinline__ float2 load_sb(const void *sb, int sf, int64_t i)
{
    if (sf == CS_F32)
        return __ldg((const float2 *)sb + i);
    return sb_pair(make_uint2(__ldg((const unsigned int *)sb + i), 0u), sf);
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

/* Exact float of value i (0..7 / 0..3) of a word, for the non-hot paths. */
template <int BITS>
__device__ __forceinline__ float qval(uint32_t w, int i)
{
    return (float)((w >> (BITS * i)) & ((1u << BITS) - 1u));
}

/* ------------------------------------------------------------------------ */
/* GEMV                                                                      */
/* ------------------------------------------------------------------------ */

/* Lane-major x layout: chunk c (VPC = 128/BITS values, one uint4 of words)
 * float4 i lives at float4 index ((c >> 5) * NF4 + i) * 32 + (c & 31). */
template <int BITS>
__device__ __forceinline__ int64_t xperm(int64_t c, int i)
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
    for (int64_t tc = threadIdx.x; tc < T * nch; tc += blockDim.x) {
        int t = (int)(tc / nch);
        int64_t c = tc % nch;
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

/* Q4 values as floats without a conversion instruction: the low nibbles
 * of w (values 0,2,4,6 in bytes 0..3) and the high ones (1,3,5,7) are
 * masked into bytes, and one byte-permute per value builds the float
 * 0x3F00qq00 = 0.5 + q/256 (q in the top mantissa bits, so the fp32 sums
 * keep ~20 bits once 0.5*sum(x) is taken off). */
__device__ __forceinline__ float q4v(uint32_t bytes, int k)
{
    return __uint_as_float(__byte_perm(bytes, 0x3F000000u, 0x7044u | ((uint32_t)k << 8)));
}


/* Weight stream depth: each warp keeps GEMV_STAGES-1 chunks of its rows in
 * flight through cp.async into a shared-memory ring (registers would cap
 * the depth: the decode GEMV is latency bound at one chunk ahead). */
template <int RPW>
struct gemv_ring {
    static constexpr int S = RPW <= 2 ? 4 : 3;
    static constexpr size_t per_warp = (size_t)S * RPW * 32;      /* entries */
    static constexpr size_t bytes = GEMV_WARPS * per_warp * (sizeof(uint4) + sizeof(uint2));
};

/* Bytes of staged x (and its chunk sums) for T tokens, 16-aligned. */
__host__ __device__ __forceinline__ size_t xstage_bytes(int T, int64_t nch, int64_t stride4)
{
    return ((size_t)T * stride4 * 16 + (size_t)T * nch * 4 + 15) / 16 * 16;
}

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

/* ---- the decode GEMV: one launch over up to CU_GROUP_MAX weights ------- */
/*
 * A launch covers the segments of a gemv_seg (weights that read the same x:
 * q/k/v, gate/up, or one matmul alone) and up to GV_TMAX tokens in one pass
 * over the weights. Rows are cut into groups of RPW and the groups of all
 * segments are dealt out to the warps of a grid that is resident at once,
 * each warp a contiguous run, so a warp streams its rows back to back
 * through its cp.async ring without draining it between rows.
 *
 * Launched with PDL: before pdl_wait() a block only fills its ring with the
 * first weight chunks (constant data), so those loads overlap the tail of
 * the kernel before; x is staged after the wait. When the launch carries a
 * norm (gemv_seg.nw), x is RMS-normalised while it is staged, exactly as
 * k_rmsnorm does it (same sum order), and block 0 also writes the
 * normalised row to g.xn for later readers.
 *
 * Per (row, token) the arithmetic is the same whatever TT, RPW, the grid or
 * the segment: a token's result is bitwise identical alone or among up to
 * GV_TMAX (what prompt-lookup verification relies on). */
constexpr int GV_TMAX = 8;
/* k_gemv's static shared memory (the norm's partials) is under this; the
 * dynamic part may use the rest of the opt-in limit. */
constexpr size_t GV_STATIC_SMEM = 2048;

struct gemv_seg {
    const uint32_t *W[CU_GROUP_MAX];
    const void *sb[CU_GROUP_MAX];
    const float *bias[CU_GROUP_MAX];
    float *y[CU_GROUP_MAX];
    float *add_to[CU_GROUP_MAX];
    int64_t rows[CU_GROUP_MAX];
    int64_t g0[CU_GROUP_MAX + 1]; /* first row group of segment i; g0[n] = all groups */
    int n;
    /* optional fused RMSNorm of x (nw != NULL): x_n = x * inv_rms * nw */
    const float *nw;
    float eps;
    int norm_threads; /* the thread count whose sum order the norm reproduces */
    float *xn;        /* where block 0 writes x_n (may be NULL) */
};

template <int RPW>
struct gv_ring {
    static constexpr int S = RPW <= 2 ? 6 : 4; /* chunks in flight per row: S - 1 */
    static constexpr size_t per_warp = (size_t)S * RPW * 32 * (sizeof(uint4) + sizeof(uint2));
};

/* A warp's position: row group grp of segment seg (rows r0.., nrows of
 * them), chunk step it. */
struct gv_cur {
    int64_t grp, r0;
    int it, nrows, seg;
    const uint32_t *W;
    const char *sb;
};

__device__ __forceinline__ void gv_locate(const gemv_seg &g, int rpw, int64_t words, int64_t groups, size_t sbsz,
                                          gv_cur &c)
{
    int i = 0;
    while (i + 1 < g.n && c.grp >= g.g0[i + 1])
        i++;
    c.seg = i;
    c.r0 = (c.grp - g.g0[i]) * rpw;
    c.nrows = (int)min((int64_t)rpw, g.rows[i] - c.r0);
    c.W = g.W[i] + c.r0 * words;
    c.sb = (const char *)g.sb[i] + (size_t)c.r0 * groups * sbsz;
}

constexpr int GV_STAGE_U = 4; /* x loads in flight per thread while staging */

/* x for tokens t < TT into shared memory (lane-major, zeros for t >= T),
 * normalised when g.nw is set, then the chunk sums. Ends with a barrier. */
/* The fused RMSNorm's 1/rms per token (g.nw set) into inv[TT] (shared),
 * the sums of squares exactly as k_rmsnorm forms them. Ends with a barrier. */
template <int TT>
__device__ void gv_norm_inv(const float *x, int T, int64_t cols, const gemv_seg &g, float *inv)
{
    __shared__ float red[TT][32];
    /* the sum of x^2 exactly as k_rmsnorm forms it (rms_partials' virtual
     * warps), the tokens' virtual warps spread over the block's warps so
     * their loads are in flight together (a verify pass of 8 rows took 8
     * load latencies one after the other) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int nvw = g.norm_threads / 32, nt = T < TT ? T : TT;
    for (int p = warp; p < nt * nvw; p += nwarps) {
        const int t = p / nvw, vw = p % nvw;
        const float *xr = x + (size_t)t * cols;
        float ss = 0.f;
#pragma unroll 4
        for (int64_t i = vw * 32 + lane; i < cols; i += g.norm_threads)
            ss += xr[i] * xr[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            red[t][vw] = ss;
    }
    __syncthreads();
    /* one warp per token finishes its tree (warp 0 doing all of them
     * was a serial chain the whole block waited for) */
    for (int t = warp; t < TT; t += nwarps) {
        float v = t < T ? rms_total(red[t], g.norm_threads) : 0.f;
        if (lane == 0)
            inv[t] = 1.f / sqrtf(v / (float)cols + g.eps);
    }
    __syncthreads();
}

template <int BITS, int TT>
__device__ void gv_stage_x(float4 *xs, const float *x, int T, int64_t cols, int64_t stride4, const gemv_seg &g)
{
    constexpr int NF4 = (128 / BITS) / 4;
    __shared__ float inv[TT];
    const int64_t n4 = cols / 4, nch = n4 / NF4;
    if (g.nw)
        gv_norm_inv<TT>(x, T, cols, g, inv);
    const bool aligned = ((uintptr_t)x & 15) == 0; /* cols % 32 == 0 always */
    /* QU float4 columns of all TT tokens per thread and pass, every load
     * issued before any is used (at least GV_STAGE_U in flight): staging
     * costs about one load latency, not one per token or per pass of the
     * block over a long row; no division in the index math */
    constexpr int QU = TT >= GV_STAGE_U ? 1 : GV_STAGE_U / TT;
    const int64_t bd = blockDim.x;
    const bool w_al = g.nw && ((uintptr_t)g.nw & 15) == 0;
    for (int64_t q0 = threadIdx.x; q0 < n4; q0 += QU * bd) {
        float4 v[QU][TT];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int64_t q = q0 + u * bd;
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const float *xr = x + (size_t)t * cols;
                v[u][t] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (q < n4 && t < T)
                    v[u][t] = aligned ? __ldg((const float4 *)xr + q)
                                      : make_float4(xr[4 * q], xr[4 * q + 1], xr[4 * q + 2], xr[4 * q + 3]);
            }
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int64_t q = q0 + u * bd;
            if (q >= n4)
                break;
            float4 w4 = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g.nw)
                w4 = w_al ? __ldg((const float4 *)g.nw + q)
                          : make_float4(g.nw[4 * q], g.nw[4 * q + 1], g.nw[4 * q + 2], g.nw[4 * q + 3]);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                float4 y = v[u][t];
                if (t < T && g.nw) {
                    /* k_rmsnorm: y = x * inv * w, in that order */
                    const float iv = inv[t];
                    y = make_float4(y.x * iv * w4.x, y.y * iv * w4.y, y.z * iv * w4.z, y.w * iv * w4.w);
                    if (g.xn && blockIdx.x == 0)
                        *(float4 *)(g.xn + (size_t)t * cols + 4 * q) = y;
                }
                xs[t * stride4 + xperm<BITS>(q / NF4, (int)(q % NF4))] = y;
            }
        }
    }
    __syncthreads();
    chunk_sums<BITS>(xs, TT, nch, stride4);
}

/* One chunk (one uint4 of words per row) of RPW rows against TT tokens.
 * Each word's values are turned into floats once and used for every token;
 * per (row, token) the FMA sequence is word by word, value by value. c and
 * the x offsets are 32-bit: shared memory and a row's chunks fit. */
template <int BITS, int TT, int RPW>
__device__ __forceinline__ void gv_chunk(const uint4 *wv, const float2 *sbv, const float4 *xs, int stride4,
                                         const float *xsums, int nch, int c, float acc[RPW][TT], int T)
{
    constexpr int NF4 = (128 / BITS) / 4;
    const int xb = (c >> 5) * NF4 * 32 + (c & 31); /* xperm(c, 0) */
    /* token slots past T (a pass of 6 tokens in 8 slots) are skipped: the
     * branch is uniform over the warp and a real token's FMAs are unchanged */
    float d[RPW][TT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            d[r][t] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (BITS == 4) {
            float lo[RPW][4], hi[RPW][4];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                uint32_t w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                uint32_t bl = w & 0x0F0F0F0Fu, bh = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    lo[r][k] = q4v(bl, k);
                    hi[r][k] = q4v(bh, k);
                }
            }
#pragma unroll
            for (int t = 0; t < TT; t++) {
                if (TT > 1 && t >= T)
                    break;
                const float4 a = xs[t * stride4 + xb + 32 * (2 * j)];
                const float4 b = xs[t * stride4 + xb + 32 * (2 * j + 1)];
                const float xv[8] = { a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w };
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    float dd = d[r][t];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        dd = fmaf(lo[r][k], xv[2 * k], dd);
                        dd = fmaf(hi[r][k], xv[2 * k + 1], dd);
                    }
                    d[r][t] = dd;
                }
            }
        } else {
            float2 p0[RPW], p1[RPW];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                uint32_t w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                p0[r] = qpair<8>(w, 0);
                p1[r] = qpair<8>(w, 1);
            }
#pragma unroll
            for (int t = 0; t < TT; t++) {
                if (TT > 1 && t >= T)
                    break;
                const float4 a = xs[t * stride4 + xb + 32 * j];
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    float dd = d[r][t];
                    dd = fmaf(p0[r].x, a.x, dd);
                    dd = fmaf(p0[r].y, a.z, dd);
                    dd = fmaf(p1[r].x, a.y, dd);
                    dd = fmaf(p1[r].y, a.w, dd);
                    d[r][t] = dd;
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (TT > 1 && t >= T)
            break;
        const float xsum = xsums[t * nch + c];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            /* Q4: sum q*x = 256*(d - xsum/2); Q8: 256*(d - xsum) (values 1 + q/256).
             * Rounding spelled out (no contraction left to the compiler), so
             * every TT / RPW instantiation gives a token the same bits. */
            float qd = __fmul_rn(256.f, __fsub_rn(d[r][t], BITS == 4 ? __fmul_rn(0.5f, xsum) : xsum));
            acc[r][t] = __fadd_rn(acc[r][t], fmaf(sbv[r].x, qd, __fmul_rn(sbv[r].y, xsum)));
        }
    }
}

/* ---- the dp4a form (Q4, groups of 32/64/128): x as integer digits ----- */
/*
 * The fp32 GEMV above spends about 1.4 integer-pipe instructions per weight
 * (a byte-permute per value plus the nibble masks) and its integer pipe
 * runs at half the FMA rate: ncu puts it at 60 % issue with "math pipe
 * throttle" on the permutes. Here x comes in as k_x_digits' three signed
 * 8-bit digits per (token, quant group), and a word of 8 nibbles against
 * them is two masks and 3 x 2 dp4a: about 0.9 instructions per weight and
 * exact int32 partials per 32-value chunk and digit plane (|D| <= 61440),
 * combined as 65536*D0 + (256*D1 + D2) in one fp32 rounding and scaled by
 * the group's 2^-e2 (exact), so the result is fp32-class like the
 * tensor-core paths. Per (row, token) the arithmetic does not depend on TT,
 * RPW, the grid or the grouping.
 *
 * Staged per token, chunk c = 32*it + l (l the lane that reads it): for
 * each digit plane two uint4s at [((t*nit + it)*3 + plane)*2 + half][l],
 * word 2j of a chunk's 8 the digits of values 8j, 8j+2, 8j+4, 8j+6 (the
 * low nibbles of weight word j), word 2j+1 those of 8j+1, ... (the high
 * ones); then per (token, chunk) (2^-e2, 2^-e2 * sum X). */
__host__ __device__ __forceinline__ size_t gd_stage_bytes(int TT, int nit, int64_t nch)
{
    return ((size_t)TT * nit * 3072 + (size_t)TT * nch * 8 + 15) / 16 * 16;
}

/* 8 consecutive floats: two 16-byte loads when p is 16-aligned */
__device__ __forceinline__ void ld8(const float *p, bool al, float (&v)[8])
{
    if (al) {
        const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = p[k];
    }
}

template <int TT>
__device__ void gd_stage_x(char *stage, const float *x, int T, int64_t cols, int nit, int group, const gemv_seg &g)
{
    __shared__ float inv[TT];
    if (g.nw)
        gv_norm_inv<TT>(x, T, cols, g, inv);
    uint32_t *xw = (uint32_t *)stage;
    float2 *xe = (float2 *)(stage + (size_t)TT * nit * 3072);
    const int nch = (int)(cols / 32), n8 = (int)(cols / 8), nt = T < TT ? T : TT;
    const int lpg = group / 8; /* threads per quant group: 4, 8 or 16, aligned in the warp */
    const bool aligned = ((uintptr_t)x & 15) == 0;
    const bool w_al = g.nw && ((uintptr_t)g.nw & 15) == 0;
    const int total = nt * n8; /* a multiple of lpg and of 4: whole groups and chunks per warp */
    for (int p0 = 0; p0 < total; p0 += blockDim.x) {
        const int p = p0 + threadIdx.x;
        const bool in = p < total;
        const int t = in ? p / n8 : 0, u = in ? p - t * n8 : 0;
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = 0.f;
        if (in) {
            ld8(x + (size_t)t * cols + 8 * (size_t)u, aligned, v);
            if (g.nw) {
                float w8[8];
                ld8(g.nw + 8 * (size_t)u, w_al, w8);
                const float iv = inv[t];
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[k] = v[k] * iv * w8[k]; /* k_rmsnorm: y = x * inv * w, in that order */
                if (g.xn && blockIdx.x == 0)
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        g.xn[(size_t)t * cols + 8 * (size_t)u + k] = v[k];
            }
        }
        float mx = 0.f;
#pragma unroll
        for (int k = 0; k < 8; k++)
            mx = fmaxf(mx, fabsf(v[k]));
        for (int o = lpg / 2; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const int e2 = xd_exp(mx);
        uint32_t pw[3][2] = { { 0u, 0u }, { 0u, 0u }, { 0u, 0u } };
        int S = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int d0, d1, d2;
            S += xd_split(v[k], e2, d0, d1, d2);
            const int h = k & 1, sh = 8 * (k >> 1);
            pw[0][h] |= (uint32_t)(d0 & 255) << sh;
            pw[1][h] |= (uint32_t)(d1 & 255) << sh;
            pw[2][h] |= (uint32_t)(d2 & 255) << sh;
        }
        S += __shfl_xor_sync(0xffffffffu, S, 1); /* the chunk's four threads; integers: exact */
        S += __shfl_xor_sync(0xffffffffu, S, 2);
        if (in) {
            const int c = u >> 2, j = u & 3, it = c >> 5, l = c & 31;
#pragma unroll
            for (int pl = 0; pl < 3; pl++) {
                const int unit = ((t * nit + it) * 3 + pl) * 2 + (j >> 1);
                uint32_t *d = xw + ((size_t)unit * 32 + l) * 4 + (j & 1) * 2;
                d[0] = pw[pl][0];
                d[1] = pw[pl][1];
            }
            if (j == 0) {
                const float es = ldexpf(1.f, -e2);
                xe[(size_t)t * nch + c] = make_float2(es, __fmul_rn((float)S, es));
            }
        }
    }
    __syncthreads();
}

/* One chunk of RPW rows against TT tokens on the digits (see above). */
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

/* The main loop keeps its bookkeeping off the per-chunk path (it was about
 * 60 % of the instructions at T = 1, per ncu: 715 warp instructions per
 * chunk of 4 rows against 288 for the arithmetic): 32-bit chunk indices,
 * ring slots that wrap instead of 64-bit remainders, per-lane row pointers
 * set once per row group, and the chunk's quant group by a multiply-high
 * instead of a 64-bit division. */
template <int BITS, int TT, int RPW, bool DP>
__global__ void __launch_bounds__(512)
k_gemv(gemv_seg g, int sf, int64_t cols, int64_t words, int64_t groups, int group, const float *__restrict__ x, int T)
{
    static_assert(!DP || BITS == 4, "the dp4a form is for Q4");
    pdl_launch();
    extern __shared__ float4 xs[];
    constexpr int VPC = 128 / BITS, NF4 = VPC / 4, S = gv_ring<RPW>::S;
    const int nch = (int)(words / 4); /* cols <= INT32_MAX */
    const int nit = (nch + 31) / 32;
    const int stride4 = nit * NF4 * 32;
    const int nwarps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t sbsz = sf == CS_F32 ? 8 : 4;
    const bool f32s = sf == CS_F32;
    /* c * VPC / group as a multiply-high by ceil(2^32 / group): exact while
     * c * VPC * group < 2^32 (gv_run checks cols * group) */
    const uint32_t gmag = 0xffffffffu / (uint32_t)group + 1u;
    char *rbase = (char *)xs + (DP ? gd_stage_bytes(TT, nit, nch) : xstage_bytes(TT, nch, stride4));
    uint4 *ring = (uint4 *)rbase + (size_t)warp * S * RPW * 32 + lane;
    uint2 *sring = (uint2 *)(rbase + (size_t)nwarps * S * RPW * 32 * sizeof(uint4)) + (size_t)warp * S * RPW * 32 + lane;
    const int64_t G = g.g0[g.n];
    const int64_t NW = (int64_t)gridDim.x * nwarps, wid = (int64_t)blockIdx.x * nwarps + warp;
    const int64_t gb = wid * G / NW, ge = (wid + 1) * G / NW;
    const int nf = (int)((ge - gb) * nit);

    /* issue side of the ring: chunk ic.it of row group ic.grp. Everything
     * the copies need is in registers (32-bit shared addresses, byte
     * strides), and the copies carry no memory clobber, so nothing is
     * recomputed per row: the one compiler barrier per chunk is the wait
     * before the ring is read (and the barrier at the top of issue, which
     * keeps the reads of the slot being refilled before its copies). */
    const uint32_t ring_sa = smem_u32(ring), sring_sa = smem_u32(sring);
    const int sbs = f32s ? 3 : 2;                        /* log2 of an entry's bytes */
    const uint32_t rwb = (uint32_t)nch * 16u;            /* weight bytes per row */
    const uint32_t rsb = (uint32_t)groups << sbs;        /* (scale, bias) bytes per row */
    gv_cur ic;
    ic.grp = gb;
    ic.it = 0;
    const char *iw = nullptr; /* this lane's first chunk of the group's first row */
    if (gb < ge) {
        gv_locate(g, RPW, words, groups, sbsz, ic);
        iw = (const char *)ic.W + 16 * lane;
    }
    int fi = 0, islot = 0;
    auto issue = [&]() {
        asm volatile("" ::: "memory");
        const int c = lane + 32 * ic.it;
        if (c < nch) {
            const uint32_t gi = __umulhi((uint32_t)c * VPC, gmag);
            const char *ws = iw + (size_t)ic.it * 512;
            const char *ss = ic.sb + ((size_t)gi << sbs);
            const uint32_t wd = ring_sa + (uint32_t)islot * (RPW * 512), sd = sring_sa + (uint32_t)islot * (RPW * 256);
            /* a group's rows past the matrix's end (nrows < RPW) copy its
             * last row again: no branch per row, and their sums are never
             * stored */
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint32_t rr = (uint32_t)min(r, ic.nrows - 1);
                cp_async_sa<16>(wd + r * 512, ws + (size_t)(rr * rwb));
                if (f32s)
                    cp_async_sa<8>(sd + r * 256, ss + (size_t)(rr * rsb));
                else
                    cp_async_sa<4>(sd + r * 256, ss + (size_t)(rr * rsb));
            }
        }
        fi++;
        islot = islot + 1 == S ? 0 : islot + 1;
        if (++ic.it == nit) {
            ic.it = 0;
            if (++ic.grp < ge) {
                gv_locate(g, RPW, words, groups, sbsz, ic);
                iw = (const char *)ic.W + 16 * lane;
            }
        }
    };
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (fi < nf)
            issue();
        cp_async_commit();
    }
    pdl_wait();
    if constexpr (DP)
        gd_stage_x<TT>((char *)xs, x, T, cols, nit, group, g);
    else
        gv_stage_x<BITS, TT>(xs, x, T, cols, stride4, g);
    const float *xsums = (const float *)(xs + (size_t)TT * stride4);

    gv_cur cc;
    cc.grp = gb;
    cc.it = 0;
    if (gb < ge)
        gv_locate(g, RPW, words, groups, sbsz, cc);
    float acc[RPW][TT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[r][t] = 0.f;
    int cslot = 0;
    for (int f = 0; f < nf; f++) {
        if (fi < nf)
            issue();
        cp_async_commit();
        cp_async_wait<S - 1>();
        const int c = lane + 32 * cc.it;
        if (c < nch) {
            const uint4 *wsrc = ring + cslot * RPW * 32;
            const uint2 *ssrc = sring + cslot * RPW * 32;
            uint4 wv[RPW];
            float2 sbv[RPW];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                wv[r] = wsrc[r * 32];
                sbv[r] = sb_pair(ssrc[r * 32], sf);
            }
            if constexpr (DP)
                gd_chunk<TT, RPW>(wv, sbv, (const char *)xs, nit, nch, c, acc, T);
            else
                gv_chunk<BITS, TT, RPW>(wv, sbv, xs, stride4, xsums, nch, c, acc, T);
        }
        cslot = cslot + 1 == S ? 0 : cslot + 1;
        if (++cc.it == nit) {
            /* the row group is complete: reduce over the lanes and store */
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    if (TT > 1 && t >= T)
                        break;
                    float v = acc[r][t];
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1)
                        v += __shfl_xor_sync(0xffffffffu, v, o);
                    acc[r][t] = v;
                }
            if (lane < cc.nrows * TT) {
                const int r = lane / TT, t = lane % TT;
                float v = 0.f;
#pragma unroll
                for (int rr = 0; rr < RPW; rr++)
#pragma unroll
                    for (int tt = 0; tt < TT; tt++)
                        if (rr == r && tt == t)
                            v = acc[rr][tt];
                if (t < T) {
                    const int i = cc.seg;
                    const int64_t row = cc.r0 + r, rows = g.rows[i];
                    if (g.bias[i])
                        v += g.bias[i][row];
                    g.y[i][(size_t)t * rows + row] = v;
                    if (g.add_to[i])
                        g.add_to[i][(size_t)t * rows + row] += v;
                }
            }
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int t = 0; t < TT; t++)
                    acc[r][t] = 0.f;
            cc.it = 0;
            if (++cc.grp < ge)
                gv_locate(g, RPW, words, groups, sbsz, cc);
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

/* cnt[e] = pairs routed to expert e (grid E) */
__global__ void k_moe_count(const int32_t *__restrict__ idx, int N, int *__restrict__ cnt)
{
    pdl_enter();
    __shared__ int tot;
    if (threadIdx.x == 0)
        tot = 0;
    __syncthreads();
    int c = 0;
    for (int p = threadIdx.x; p < N; p += blockDim.x)
        c += idx[p] == (int)blockIdx.x;
    atomicAdd(&tot, c); /* integer sum: order does not matter */
    __syncthreads();
    if (threadIdx.x == 0)
        cnt[blockIdx.x] = tot;
}

/* exclusive prefix sums of rows and of tiles of tile_rows rows (BM for the
 * fp16 GEMMs, the integer GEMM's token block) (one thread; E is small) */
__global__ void k_moe_scan(const int *__restrict__ cnt, int E, int tile_rows, int *__restrict__ seg_off,
                           int *__restrict__ tile_off)
{
    pdl_enter();
    if (threadIdx.x || blockIdx.x)
        return;
    int r = 0, t = 0;
    for (int e = 0; e < E; e++) {
        seg_off[e] = r;
        tile_off[e] = t;
        r += cnt[e];
        t += (cnt[e] + tile_rows - 1) / tile_rows;
    }
    seg_off[E] = r;
    tile_off[E] = t;
}

/* Expert e's pairs in increasing pair order (grid E, 256 threads):
 * perm[row] = pair, pos[pair] = row. Deterministic: ballot + block scan. */
__global__ void k_moe_fill(const int32_t *__restrict__ idx, int N, const int *__restrict__ seg_off,
                           int32_t *__restrict__ perm, int32_t *__restrict__ pos)
{
    pdl_enter();
    __shared__ int wsum[8];
    const int e = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int base = seg_off[e];
    for (int p0 = 0; p0 < N; p0 += 256) {
        int p = p0 + threadIdx.x;
        bool f = p < N && idx[p] == e;
        unsigned b = __ballot_sync(0xffffffffu, f);
        if (lane == 0)
            wsum[warp] = __popc(b);
        __syncthreads();
        int before = 0, all = 0;
        for (int w = 0; w < 8; w++) {
            before += w < warp ? wsum[w] : 0;
            all += wsum[w];
        }
        if (f) {
            int row = base + before + __popc(b & ((1u << lane) - 1u));
            perm[row] = p;
            pos[p] = row;
        }
        base += all;
        __syncthreads();
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

/* Blocks per SM of a kernel at a block size and dynamic shared memory,
 * remembered per kernel (the query costs microseconds per call). */
template <typename K>
int occupancy(K kern, int threads, size_t smem)
{
    static uint64_t cache[8];
    static int next;
    const uint64_t key = ((uint64_t)smem << 11) | (uint64_t)threads;
    for (int i = 0; i < 8; i++) {
        uint64_t e = __atomic_load_n(&cache[i], __ATOMIC_RELAXED);
        if (e && (e >> 16) == key)
            return (int)(e & 0xffff);
    }
    int per = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, threads, smem) != cudaSuccess) {
        cudaGetLastError(); /* a failed query must not look like a failed launch */
        per = 0;
    }
    int slot = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) & 7;
    __atomic_store_n(&cache[slot], (key << 16) | (uint64_t)(per & 0xffff), __ATOMIC_RELAXED);
    return per;
}

/* Dynamic shared memory of a k_gemv block: staged x for tt tokens and
 * nwarps rings. */
size_t gv_smem(const cu_weight *w, int tt, int rpw, int nwarps, bool dp)
{
    int vpc = 128 / w->bits;
    int64_t nch = w->words / 4, stride4 = ((nch + 31) / 32) * (vpc / 4) * 32;
    size_t ring = rpw <= 2 ? gv_ring<2>::per_warp : gv_ring<4>::per_warp;
    size_t stage = dp ? gd_stage_bytes(tt, (int)((nch + 31) / 32), nch) : xstage_bytes(tt, nch, stride4);
    return stage + (size_t)nwarps * ring;
}

/* One pass: the block size (8 or 16 warps) that keeps the most warps per
 * SM resident, and a grid no larger than what is resident at once. */
template <typename K>
sn_status gv_max_smem(K kern, const cu_devinfo *di)
{
    cudaFuncAttributes fa;
    CU_TRY(cudaFuncGetAttributes(&fa, kern), "gemv init");
    if (fa.sharedSizeBytes > GV_STATIC_SMEM)
        return SN_FAIL(SN_E_BACKEND, "gemv init: %zu B of static shared memory", (size_t)fa.sharedSizeBytes);
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(di->smem_optin - GV_STATIC_SMEM)),
           "gemv init");
    /* all of L1 as shared memory: the grid is sized for as many blocks per SM
     * as the occupancy query says, which assumes the largest carveout */
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100), "gemv init");
    return SN_OK;
}

template <int BITS, int TT, int RPW, bool DP>
sn_status gv_launch(const cu_devinfo *di, cudaStream_t s, const gemv_seg &g, const cu_weight *w0, const float *x,
                    int T)
{
    auto kern = k_gemv<BITS, TT, RPW, DP>;
    int best_w = 0, best_per = 0;
    const int cand[2] = { 8, 16 };
    for (int ci = 0; ci < 2; ci++) {
        int nw = cand[ci];
        size_t smem = gv_smem(w0, TT, RPW, nw, DP);
        if (smem + GV_STATIC_SMEM > di->smem_optin)
            continue;
        int per = occupancy(kern, nw * 32, smem);
        if (per > 0 && per * nw > best_per * best_w) {
            best_per = per;
            best_w = nw;
        }
    }
    if (!best_w)
        return SN_FAIL(SN_E_UNSUPPORTED, "matmul: %lld columns exceed the GEMV's shared memory",
                       (long long)w0->cols);
    const int64_t G = g.g0[g.n];
    int64_t grid = (G + best_w - 1) / best_w;
    if (grid > (int64_t)di->n_sm * best_per)
        grid = (int64_t)di->n_sm * best_per;
    if (grid < 1)
        grid = 1;
    (void)cu_launch(kern, dim3((unsigned)grid), dim3((unsigned)(best_w * 32)), gv_smem(w0, TT, RPW, best_w, DP), s, g,
                    w0->sfmt, (int64_t)w0->cols, (int64_t)w0->words, (int64_t)w0->groups, w0->group, x, T);
    CU_CHECK_LAUNCH("matmul gemv");
    return SN_OK;
}

template <int BITS, int RPW, bool DP>
sn_status gv_pass(const cu_devinfo *di, cudaStream_t s, const gemv_seg &g, const cu_weight *w0, const float *x,
                  int T, int tt)
{
    switch (tt) {
    case 1: return gv_launch<BITS, 1, RPW, DP>(di, s, g, w0, x, T);
    case 2: return gv_launch<BITS, 2, RPW, DP>(di, s, g, w0, x, T);
    case 4: return gv_launch<BITS, 4, RPW, DP>(di, s, g, w0, x, T);
    default: return gv_launch<BITS, 8, RPW, DP>(di, s, g, w0, x, T);
    }
}

/* T <= GV_TMAX tokens (more in passes) through the segments of g, whose
 * rows, pointers, norm and add_to are set; g0 is filled here. */
sn_status gv_run(const cu_devinfo *di, cudaStream_t s, gemv_seg g, const cu_weight *w0, const float *x, int T)
{
    int64_t tot = 0;
    for (int i = 0; i < g.n; i++)
        tot += g.rows[i];
    if ((uint64_t)w0->cols * (uint64_t)w0->group >= (1ull << 32)) /* k_gemv's quant-group multiply-high */
        return SN_FAIL(SN_E_UNSUPPORTED, "matmul: %lld columns in groups of %d exceed the GEMV's index range",
                       (long long)w0->cols, w0->group);
    /* rows per warp: a verify pass (T > 2) through a small matrix leaves
     * most resident warps idle while each busy one runs every token of its
     * rows in series, so there one row a warp halves that chain (the 8-layer
     * default model's 6-row step: see docs/PERFORMANCE.md) */
    /* at T <= 2, a launch of fewer than gemv_rpw1_rows rows (35B-A3B: the
     * out projection's 2048, the router's 256) takes one row a warp, so
     * that its row groups cover the resident warps */
    int rpw = di->gemv_rpw ? di->gemv_rpw
              : T <= 2          ? (tot >= 8192 ? 4 : tot < di->gemv_rpw1_rows ? 1 : 2)
              : (tot + 1) / 2 < (int64_t)di->n_sm * 8 ? 1 : 2;
    /* the dp4a form for Q4 in MLX's groups (its staging needs whole groups
     * of 4, 8 or 16 threads): chosen by format only, so a matrix takes the
     * same kernel alone or grouped */
    const bool dp = di->gemv_dp && w0->fmt == CW_Q4 && (w0->group == 32 || w0->group == 64 || w0->group == 128);
    g.g0[0] = 0;
    for (int i = 0; i < g.n; i++)
        g.g0[i + 1] = g.g0[i] + (g.rows[i] + rpw - 1) / rpw;
    for (int t0 = 0; t0 < T;) {
        int left = T - t0;
        int tt = left <= 1 ? 1 : left <= 2 ? 2 : left <= 4 ? 4 : GV_TMAX;
        while (tt > 1 && gv_smem(w0, tt, rpw, 8, dp) + GV_STATIC_SMEM > di->smem_optin)
            tt /= 2;
        if (gv_smem(w0, 1, rpw, 8, dp) + GV_STATIC_SMEM > di->smem_optin)
            return SN_FAIL(SN_E_UNSUPPORTED, "matmul: %lld columns exceed the GEMV's shared memory",
                           (long long)w0->cols);
        int nt = left < tt ? left : tt;
        gemv_seg p = g;
        for (int i = 0; i < g.n; i++) {
            p.y[i] = g.y[i] + (size_t)t0 * g.rows[i];
            if (g.add_to[i])
                p.add_to[i] = g.add_to[i] + (size_t)t0 * g.rows[i];
        }
        if (g.xn)
            p.xn = g.xn + (size_t)t0 * w0->cols;
        const float *xp = x + (size_t)t0 * w0->cols;
        sn_status st;
        if (dp)
            st = rpw == 4   ? gv_pass<4, 4, true>(di, s, p, w0, xp, nt, tt)
                 : rpw == 1 ? gv_pass<4, 1, true>(di, s, p, w0, xp, nt, tt)
                            : gv_pass<4, 2, true>(di, s, p, w0, xp, nt, tt);
        else if (w0->fmt == CW_Q4)
            st = rpw == 4   ? gv_pass<4, 4, false>(di, s, p, w0, xp, nt, tt)
                 : rpw == 1 ? gv_pass<4, 1, false>(di, s, p, w0, xp, nt, tt)
                            : gv_pass<4, 2, false>(di, s, p, w0, xp, nt, tt);
        else
            st = rpw == 4   ? gv_pass<8, 4, false>(di, s, p, w0, xp, nt, tt)
                 : rpw == 1 ? gv_pass<8, 1, false>(di, s, p, w0, xp, nt, tt)
                            : gv_pass<8, 2, false>(di, s, p, w0, xp, nt, tt);
        SN_TRY(st);
        t0 += nt;
    }
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
#define GEMV_INIT(B, R, DP)                                                                                       \
    SN_TRY(gv_max_smem(k_gemv<B, 1, R, DP>, di));                                                                  \
    SN_TRY(gv_max_smem(k_gemv<B, 2, R, DP>, di));                                                                  \
    SN_TRY(gv_max_smem(k_gemv<B, 4, R, DP>, di));                                                                  \
    SN_TRY(gv_max_smem(k_gemv<B, 8, R, DP>, di));
    GEMV_INIT(4, 1, false)
    GEMV_INIT(4, 2, false)
    GEMV_INIT(4, 4, false)
    GEMV_INIT(4, 1, true)
    GEMV_INIT(4, 2, true)
    GEMV_INIT(4, 4, true)
    GEMV_INIT(8, 1, false)
    GEMV_INIT(8, 2, false)
    GEMV_INIT(8, 4, false)
#undef GEMV_INIT
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
        return gv_run(di, s, g, w, x, T);
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
    size_t idx, wts, cnt, seg, tile, perm, pos, sig, xh, g, u, sig2, ah, yd, i8, total;
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
    (void)cu_launch(k_moe_route, (unsigned)((T + 3) / 4), 128, 0, s, logits, T, E, k, norm_topk, idx, wts);
    CU_CHECK_LAUNCH("moe route");
    (void)cu_launch(k_moe_count, (unsigned)E, 256, 0, s, idx, (int)N, cnt);
    CU_CHECK_LAUNCH("moe count");
    const int tile_rows = L.int8 ? cu_gemm_i8_moe_block_tokens(di->gemm_i8) : BM;
    (void)cu_launch(k_moe_scan, 1, 32, 0, s, cnt, E, tile_rows, seg, tile);
    CU_CHECK_LAUNCH("moe scan");
    (void)cu_launch(k_moe_fill, (unsigned)E, 256, 0, s, idx, (int)N, seg, perm, pos);
    CU_CHECK_LAUNCH("moe fill");
    if (L.int8) { /* [gemm_i8] x gathered into digit planes, gate and up from one staging */
        void *i8 = b + L.i8;
        SN_TRY(cu_gemm_i8_moe_stage(di, s, gate, x, perm, k, (const float *)NULL, N, i8));
        SN_TRY(cu_gemm_i8_moe(di, s, gate, N, cnt, seg, tile, g, i8));
        SN_TRY(cu_gemm_i8_moe(di, s, up, N, cnt, seg, tile, u, i8));
        /* the swiglu inside the down input's staging (one pass over g and u fewer) */
        SN_TRY(cu_gemm_i8_moe_stage(di, s, down, g, (const int32_t *)NULL, 1, u, N, i8));
        SN_TRY(cu_gemm_i8_moe(di, s, down, N, cnt, seg, tile, yd, i8));
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
                 float *out, void *scratch, const cu_moe_sh *sh)
{
    if (T <= 0)
        return SN_OK;
    if (sh) {
        if (!cu_moe_sh_ok(di, gate, up, down, sh, T, top_k))
            return SN_FAIL(SN_E_INVALID, "moe: this shared expert cannot run inside the MoE launches here");
        return cu_moe_dec(s, gate, up, down, logits, top_k, norm_topk, x, T, out, scratch, sh, NULL);
    }
    if (top_k > MOE_MAX_K)
        return SN_FAIL(SN_E_UNSUPPORTED, "moe: top_k %d > %d", top_k, MOE_MAX_K);
    if (T >= MOE_GEMM_MIN_T && di->moe_gemm)
        return moe_grouped(di, s, gate, up, down, logits, top_k, norm_topk, x, T, out, scratch);
    /* [moe] decode: routing + gate/up, then down + weighted sum (cuda_moe.cu) */
    if (cu_moe_dec_ok(gate, up, down, T, top_k))
        return cu_moe_dec(s, gate, up, down, logits, top_k, norm_topk, x, T, out, scratch, NULL, NULL);
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

sn_status cu_matmul_group(const cu_devinfo *di, cudaStream_t s, int n, const cu_weight *const *w, const int64_t *e,
                          float *const *y, float *const *add_to, const float *x, int T, const cu_gemv_norm *norm,
                          void *scratch)
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
        if (cu_matmul_int_path(di, w[i], e[i], in, T) != i8 || !cu_matmul_groupable(w[0], w[i]))
            return SN_FAIL(SN_E_INVALID, "matmul group: weight %d takes another kernel than weight 0", i);
    const size_t cols = (size_t)w[0]->cols;
    if (norm) {
        /* a folded stage the kernel has no form for (the fp32 GEMV has no
         * swiglu; the digits pass reads and writes whole float4s) runs
         * first as its own op, with the same arithmetic */
        const uintptr_t al = (uintptr_t)x | (uintptr_t)norm->w | (uintptr_t)norm->su | (uintptr_t)norm->xn;
        bool apart = (norm->su && !i8) || (i8 && (al & 15) != 0);
        if (apart && !norm->xn)
            return SN_FAIL(SN_E_INVALID, "matmul group: a folded op without an output row");
        if (apart) {
            if (norm->su)
                SN_TRY(cu_swiglu(s, x, norm->su, (size_t)T * cols, norm->xn));
            else
                SN_TRY(cu_rmsnorm(s, x, norm->w, T, (int)cols, norm->eps, norm->xn));
            x = norm->xn;
            norm = NULL;
        }
    }
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
    return gv_run(di, s, g, w[0], x, T);
}
