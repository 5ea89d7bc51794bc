/* The SIMT decode GEMV (issue 6). Decode is a pure memory stream (4.5 bits
 * per weight against 32-bit activations), so the GEMV is built around the
 * bytes: each lane streams 16 bytes of a row per step (512 B per warp,
 * coalesced) through a per-warp cp.async ring a few chunks deep; a warp
 * works on 1, 2 or 4 rows so each activation read from shared memory feeds
 * several rows; x sits in shared memory in a lane-major order (no bank
 * conflicts for the 16-byte reads), up to 8 tokens per pass, with an
 * RMSNorm folded into its staging and the residual add into the epilogue.
 * Q4 in MLX's groups runs on x's int8 digits with dp4a by default (gemv_dp;
 * see gd_stage_x): exact integer partials, fewer instructions per weight.
 * Otherwise Q4 nibbles become floats with one byte-permute each
 * (0x3F00qq00 = 0.5 + q/256, see q4v), Q8 bytes two at a time through a
 * half2 (1 + q/256, see qpair); the fp32 dot product of v and x minus the
 * chunk sum gives sum(q*x) with ~20 good bits, and the affine bias costs
 * one FMA per chunk and row. Small 8-bit matrices (a MoE router) can take
 * k_gemv_q8s instead, where a row's chunks are split over many threads
 * (gemv_q8s_rows). cuda_matmul.cu's dispatch calls cu_gv_run when
 * the tensor-core GEMV does not take a weight (cu_gi_size_ok, cu_gi_ok). */
#include <string.h>

#include <atomic>
#include <mutex>

#include <cuda_pipeline.h>

#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_quant.h"

namespace {

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

/* ---- the decode GEMV: one launch over up to CU_GROUP_MAX weights ------- */
/*
 * A launch covers the segments of a gemv_seg (weights that read the same x:
 * q/k/v, gate/up, or one matmul alone) and up to GV_TMAX tokens in one pass
 * over the weights. Rows are cut into groups of RPW and the groups of all
 * segments are dealt out to the warps of a grid that is resident at once,
 * each warp a contiguous run, so a warp streams its rows back to back
 * through its cp.async ring without draining it between rows.
 *
 * Launched with PDL: before pdl_wait() a block only puts the first weight
 * chunks into its ring (constant data; gemv_pre of them, default one per
 * warp), so those loads overlap the tail of the kernel before; x is staged
 * after the wait, the ring's other first chunks going out once x's loads
 * have (a full ring ahead of them queued x behind ~100 KB of weights per
 * SM: 35B-A3B 2.50-2.57 against 2.55-2.62 ms per step, s11r1/s11r3). Two
 * other ways to fill the ring were slower: one lane's bulk copies per
 * chunk (1213598, s11r2) and x staged once per launch by a block of its own
 * (ad779ab, s11r3; docs/PERFORMANCE.md run 21). When the launch carries a
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

/* the segment whose row groups hold group grp */
__device__ __forceinline__ int gv_seg_of(const gemv_seg &g, int64_t grp)
{
    int i = 0;
    while (i + 1 < g.n && grp >= g.g0[i + 1])
        i++;
    return i;
}

__device__ __forceinline__ void gv_locate(const gemv_seg &g, int rpw, int64_t words, int64_t groups, size_t sbsz,
                                          gv_cur &c)
{
    const int i = gv_seg_of(g, c.grp);
    c.seg = i;
    c.r0 = (c.grp - g.g0[i]) * rpw;
    c.nrows = (int)min((int64_t)rpw, g.rows[i] - c.r0);
    c.W = g.W[i] + c.r0 * words;
    c.sb = (const char *)g.sb[i] + (size_t)c.r0 * groups * sbsz;
}

/* This lane's add_to value for the row group at c (0 when none), loaded
 * at the group's end, after the reduction. Loading it (and the conv's
 * inputs) when the group starts instead cost the 35B-A3B 0.8 % of a step
 * (s26r1: 2.407 against 2.388 ms), and the same pattern cost k_md_down
 * 4-7 % (run 35): the registers held across the loop cost more than the
 * round trip they hide. Only this lane reads and writes that
 * element (each output row has one warp), and the fuser does not let y be
 * add_to. */
template <int TT>
__device__ __forceinline__ float gv_add_load(const gemv_seg &g, const gv_cur &c, int lane, int T)
{
    const int r = lane / TT, t = lane % TT;
    if (!g.add_to[c.seg] || lane >= c.nrows * TT || t >= T)
        return 0.f;
    return g.add_to[c.seg][(size_t)t * g.rows[c.seg] + c.r0 + r];
}

constexpr int GV_STAGE_U = 4; /* x loads in flight per thread while staging */

/* p / n for 0 <= p < TT * n (a token's index from a work item's), by TT - 1
 * compares instead of an integer division: ~25 instructions each, and the
 * staging had two to three of them on every warp's path before its first
 * chunk (ncu SASS, s11r4); at TT = 1 none */
template <int TT>
__device__ __forceinline__ int gv_div_tt(int p, int n)
{
    int t = 0;
#pragma unroll
    for (int q = 1; q < TT; q++)
        t += p >= q * n;
    return t;
}

constexpr int GV_NORM_LD = 16; /* the fused norm's loads per lane issued together, at most */

/* The fused RMSNorm's 1/rms per token (g.nw set) into inv[TT] (shared),
 * the sums of squares exactly as k_rmsnorm forms them. Ends with a barrier. */
template <int TT, typename H>
__device__ void gv_norm_inv(const float *x, int T, int64_t cols, const gemv_seg &g, float *inv, H &&after_loads)
{
    __shared__ float red[TT][32];
    /* the sum of x^2 exactly as k_rmsnorm forms it (rms_partials' virtual
     * warps), the tokens' virtual warps spread over the block's warps so
     * their loads are in flight together (a verify pass of 8 rows took 8
     * load latencies one after the other) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int nvw = g.norm_threads / 32, nt = T < TT ? T : TT;
    /* a row of at most GV_NORM_LD values per lane: all its loads at once,
     * then the sum in the same order (the unrolled loop kept 4 in flight:
     * 3 dependent L2 round trips for the 27B's 5120) */
    const bool batch = cols <= (int64_t)GV_NORM_LD * g.norm_threads;
    bool hooked = false;
    for (int p = warp; p < nt * nvw; p += nwarps) {
        const int t = gv_div_tt<TT>(p, nvw), vw = p - t * nvw; /* p < nt * nvw */
        const float *xr = x + (size_t)t * cols;
        float ss = 0.f;
        if (batch) {
            float v[GV_NORM_LD];
            const int i0 = vw * 32 + lane, nc = (int)cols; /* cols <= INT32_MAX */
#pragma unroll
            for (int k = 0; k < GV_NORM_LD; k++) {
                const int i = i0 + k * g.norm_threads;
                v[k] = i < nc ? xr[i] : 0.f;
            }
            if (!hooked) {
                after_loads();
                hooked = true;
            }
            /* the values past the row are +0: adding their squares leaves
             * ss (a sum of squares from +0) bitwise as it was */
#pragma unroll
            for (int k = 0; k < GV_NORM_LD; k++)
                ss += v[k] * v[k];
        } else {
#pragma unroll 4
            for (int64_t i = vw * 32 + lane; i < cols; i += g.norm_threads)
                ss += xr[i] * xr[i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            red[t][vw] = ss;
    }
    if (!hooked)
        after_loads();
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

/* x for tokens t < TT into shared memory (lane-major, zeros for t >= T),
 * normalised when g.nw is set, then the chunk sums. Ends with a barrier. */
template <int BITS, int TT, typename H>
__device__ void gv_stage_x(float4 *xs, const float *x, int T, int64_t cols, int64_t stride4, const gemv_seg &g,
                           H &&after_loads)
{
    constexpr int NF4 = (128 / BITS) / 4;
    __shared__ float inv[TT];
    const int64_t n4 = cols / 4, nch = n4 / NF4;
    if (g.nw)
        gv_norm_inv<TT>(x, T, cols, g, inv, after_loads);
    else
        after_loads();
    const bool aligned = ((uintptr_t)x & 15) == 0; /* cols % 32 == 0 always */
    /* QU float4 columns of all TT tokens per thread and pass, every load
     * issued before any is used (at least GV_STAGE_U in flight): staging
     * costs about one load latency, not one per token or per pass of the
     * block over a long row; no division in the index math */
    constexpr int QU = TT >= GV_STAGE_U ? 1 : GV_STAGE_U / TT;
    /* 32-bit indices: cols <= INT32_MAX (64-bit ones cost pairs of
     * instructions for every address and compare of the staging) */
    const int bd = blockDim.x, n4i = (int)n4, s4 = (int)stride4;
    const bool w_al = g.nw && ((uintptr_t)g.nw & 15) == 0;
    for (int q0 = threadIdx.x; q0 < n4i; q0 += QU * bd) {
        float4 v[QU][TT];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int q = q0 + u * bd;
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const float *xr = x + (size_t)t * cols;
                v[u][t] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (q < n4i && t < T)
                    v[u][t] = aligned ? __ldg((const float4 *)xr + q)
                                      : make_float4(xr[4 * q], xr[4 * q + 1], xr[4 * q + 2], xr[4 * q + 3]);
            }
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int q = q0 + u * bd;
            if (q >= n4i)
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
                xs[t * s4 + xperm<BITS>(q / NF4, q % NF4)] = y;
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

constexpr int GD_PRE = 2; /* passes of the dp4a staging whose loads are issued together */


template <int TT, typename H>
__device__ void gd_stage_x(char *stage, const float *x, int T, int64_t cols, int nit, int group, const gemv_seg &g,
                           H &&after_loads)
{
    __shared__ float inv[TT];
    uint32_t *xw = (uint32_t *)stage;
    float2 *xe = (float2 *)(stage + (size_t)TT * nit * 3072);
    const int nch = (int)(cols / 32), n8 = (int)(cols / 8), nt = T < TT ? T : TT;
    const int lpg = group / 8; /* threads per quant group: 4, 8 or 16, aligned in the warp */
    const bool aligned = ((uintptr_t)x & 15) == 0;
    const bool w_al = g.nw && ((uintptr_t)g.nw & 15) == 0;
    const int total = nt * n8; /* a multiple of lpg and of 4: whole groups and chunks per warp */
    /* up to GD_PRE passes: their x (and norm weight) loads go out before
     * the norm's, so the prologue waits for about one L2 round trip, not
     * one per pass plus the norm's (s10r4: the whole staging was 10-12 %
     * of a decode step, ~2-6 us per launch) */
    const bool pre = total <= GD_PRE * (int)blockDim.x;
    float pv[GD_PRE][8], pw[GD_PRE][8];
    if (pre) {
#pragma unroll
        for (int ps = 0; ps < GD_PRE; ps++) {
            const int p = ps * (int)blockDim.x + threadIdx.x;
            const int t = p < total ? gv_div_tt<TT>(p, n8) : 0, u = p < total ? p - t * n8 : 0;
#pragma unroll
            for (int k = 0; k < 8; k++)
                pv[ps][k] = pw[ps][k] = 0.f;
            if (p < total) {
                ld8(x + (size_t)t * cols + 8 * (size_t)u, aligned, pv[ps]);
                if (g.nw)
                    ld8(g.nw + 8 * (size_t)u, w_al, pw[ps]);
            }
        }
    }
    if (g.nw)
        gv_norm_inv<TT>(x, T, cols, g, inv, after_loads);
    else
        after_loads();
#pragma unroll 1
    for (int p0 = 0, ps = 0; p0 < total; p0 += blockDim.x, ps++) {
        const int p = p0 + threadIdx.x;
        const bool in = p < total;
        const int t = in ? gv_div_tt<TT>(p, n8) : 0, u = in ? p - t * n8 : 0;
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = 0.f;
        if (pre)
            gd_pick(pv, ps, v); /* the pass's values from the registers loaded above */
        if (in) {
            if (!pre)
                ld8(x + (size_t)t * cols + 8 * (size_t)u, aligned, v);
            if (g.nw) {
                float w8[8];
                if (pre)
                    gd_pick(pw, ps, w8);
                else
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
        gd_digits8(v, lpg, in, u, xw + (size_t)t * nit * 768, xe + (size_t)t * nch);
    }
    __syncthreads();
}

/* a[i] for a run-time i without a local-memory array */
template <int N>
__device__ __forceinline__ float gv_pick(const float (&a)[N], int i)
{
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < N; k++)
        if (k == i)
            v = a[k];
    return v;
}

/* acc[r][t] for a lane's run-time (r, t) without a local-memory array */
template <int RPW, int TT>
__device__ __forceinline__ float gv_lane_acc(const float (&acc)[RPW][TT], int r, int t)
{
    float v = 0.f;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            if (rr == r && tt == t)
                v = acc[rr][tt];
    return v;
}

/* A lane's inputs of the folded GDN conv besides its row's results: the
 * row's conv state and its conv weights (zeros when not mine), loaded at
 * the row group's end like gv_add_load's value. */
struct gv_conv_in {
    float st[CU_CONV_K - 1], w[CU_CONV_K];
};

template <int TT>
__device__ __forceinline__ gv_conv_in gv_conv_load(const gemv_seg &g, const gv_cur &c, int lane, int T)
{
    gv_conv_in in = {};
    const int r = lane / TT, t = lane % TT;
    if (c.seg != 0 || lane >= c.nrows * TT || t >= T)
        return in;
    const int64_t C = g.rows[0], row = c.r0 + r;
#pragma unroll
    for (int i = 0; i < CU_CONV_K - 1; i++)
        in.st[i] = g.cv.state[(size_t)i * C + row];
    const float4 wv = *(const float4 *)(g.cv.w + (size_t)row * CU_CONV_K);
    in.w[0] = wv.x; in.w[1] = wv.y; in.w[2] = wv.z; in.w[3] = wv.w;
    return in;
}

/* The folded GDN conv (cu_gemv_conv) of a completed row group of segment
 * 0: lane r * TT + t holds row r's raw result v for token t (mine: a real
 * row and token). The row's inputs concat(state, tokens) come from the
 * state (in) and the row's other lanes; the conv, the new conv state and
 * the history slots follow k_gdn_conv_state's arithmetic and rows. */
template <int TT>
__device__ __forceinline__ void gv_conv_epi(const gemv_seg &g, float v, bool mine, int r, int t, int64_t row, int T,
                                            const gv_conv_in &in)
{
    const int64_t C = g.rows[0];
    float X[CU_CONV_K - 1 + TT];
#pragma unroll
    for (int i = 0; i < CU_CONV_K - 1; i++)
        X[i] = in.st[i];
#pragma unroll
    for (int u = 0; u < TT; u++)
        X[CU_CONV_K - 1 + u] = __shfl_sync(0xffffffffu, v, (r * TT + u) & 31);
    float cv = 0.f;
#pragma unroll
    for (int u = 0; u < TT; u++)
        if (u == t)
            cv = cu_gdn_conv4(in.w, X[u], X[u + 1], X[u + 2], X[u + 3]);
    __syncwarp(); /* every lane of the row has read its old conv state */
    if (!mine)
        return;
    g.y[0][(size_t)t * C + row] = v;
    g.cv.c[(size_t)t * C + row] = cv;
    if (t < g.cv.nh)
#pragma unroll
        for (int i = 0; i < CU_CONV_K - 1; i++)
            g.cv.hist[(size_t)t * g.cv.hstride + (size_t)i * C + row] = gv_pick(X, t + 1 + i);
    if (t == 0)
#pragma unroll
        for (int i = 0; i < CU_CONV_K - 1; i++)
            g.cv.state[(size_t)i * C + row] = gv_pick(X, T + i);
}

/* The main loop keeps its bookkeeping off the per-chunk path (it was about
 * 60 % of the instructions at T = 1, per ncu: 715 warp instructions per
 * chunk of 4 rows against 288 for the arithmetic): 32-bit chunk indices,
 * ring slots that wrap instead of 64-bit remainders, per-lane row pointers
 * set once per row group, and the chunk's quant group by a multiply-high
 * instead of a 64-bit division. */
/* The phase stamps (ST, measurement only; sn_cuda_gemv_stamps): each block
 * of a stamped launch appends its start, the return of pdl_wait, the end
 * of x's staging, warp 0's last chunk and its own end (all warps done), on
 * the GPU's global timer, to gv_stamp_buf. A separate instance, so the
 * unstamped kernel's code is what it was. */
__device__ sn_gemv_stamp *gv_stamp_buf;
__device__ unsigned gv_stamp_n, gv_stamp_cap;
bool gv_stamping; /* host side: launch the stamped instance */

__device__ __forceinline__ uint64_t gv_now()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The pool form (DY; one token, no conv fold, gv_launch decides): a warp
 * runs its share of the first g.gst row groups as above, then takes the
 * others one at a time from g.pool[0] until none is left, so the warps of
 * an SM that runs late take fewer (s34r1, H100: the same SMs are late in
 * every launch of the 27B's gate/up, by up to 8 us of ~40). The take is in
 * issue(), as the ring reaches the next group, and always after pdl_wait
 * (gv_launch deals every warp more than a ring's worth of chunks, so the
 * copies issued before it are all dealt ones): the counter the last
 * launch zeroed is then visible. The group ids taken wait in a per-warp
 * queue for the compute side, which runs at most S - 1 chunks behind. A
 * row group is one warp's work either way, so the bits do not change. */
constexpr int GV_POOL_Q = 8; /* the queue: more than S groups of >= 1 chunk */
/* DY 2 (tune gemv_dyn_lean, built after s35r1, not yet run): a take that a
 * plain load shows would fail is not made, and a block's last warp done
 * taking counts the block, not each warp: fewer atomics on the two hot
 * addresses as the launch ends. */

/* RL (tune gemv_rl; one token, dp4a): no cp.async ring. Each lane loads
 * its rows' weight words and (scale, bias) entries for the next chunk
 * straight into registers (two slots, compile-time: the loop runs two
 * chunks an iteration) while it computes the current one; the loads are
 * streaming (RL 1: ld.global.cs, read once a step, evict first; RL 2:
 * ld.global.nc with no L1 allocation and L2 fetches of 256 bytes). The
 * cursor, the pool takes, x's staging and the epilogue are the ring
 * form's, so a row's bits are too. The ring's shared memory is still
 * allocated (the occupancy is set by registers either way). */
/* one register-load form's load of a uint4, uint2 or 32-bit word */
template <int RL, typename E>
__device__ __forceinline__ E rl_ld(const E *p)
{
    if constexpr (RL == 1)
        return __ldcs(p);
    if constexpr (sizeof(E) == 16) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return *reinterpret_cast<E *>(&v);
    } else if constexpr (sizeof(E) == 8) {
        uint2 v;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
        return *reinterpret_cast<E *>(&v);
    } else {
        unsigned v;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
        return *reinterpret_cast<E *>(&v);
    }
}

template <int BITS, int TT, int RPW, bool DP, bool CV = false, bool ST = false, int DY = 0, int RL = 0>
__global__ void __launch_bounds__(512)
k_gemv(gemv_seg g, int sf, int64_t cols, int64_t words, int64_t groups, int group, const float *__restrict__ x, int T)
{
    static_assert(!RL || (TT == 1 && DP && !ST), "the register-load form is for one token, dp4a, unstamped");
    static_assert(!DP || BITS == 4, "the dp4a form is for Q4");
    static_assert(!CV || DP, "the conv fold is for the dp4a form");
    static_assert(!DY || (TT == 1 && !CV && !ST), "the pool form is for one token, no fold, unstamped");
    static_assert(GV_POOL_Q > gv_ring<RPW>::S, "the pool queue holds the groups the ring runs ahead");
    uint64_t ts[5] = { 0, 0, 0, 0, 0 };
    if constexpr (ST)
        ts[0] = gv_now();
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
     * c * VPC * group < 2^32 (gv_run checks cols * group); the host forms
     * it (a division here was ~15 instructions on every warp's path) */
    const uint32_t gmag = g.gmag;
    char *rbase = (char *)xs + (DP ? gd_stage_bytes(TT, nit, nch) : xstage_bytes(TT, nch, stride4));
    uint4 *ring = (uint4 *)rbase + (size_t)warp * S * RPW * 32 + lane;
    uint2 *sring = (uint2 *)(rbase + (size_t)nwarps * S * RPW * 32 * sizeof(uint4)) + (size_t)warp * S * RPW * 32 + lane;
    const int64_t G = g.g0[g.n];
    const int64_t NW = (int64_t)gridDim.x * nwarps, wid = (int64_t)blockIdx.x * nwarps + warp;
    const int64_t GD = DY ? g.gst : G; /* the groups dealt */
    const int64_t gb = wid * GD / NW, ge = (wid + 1) * GD / NW;
    int nf = (int)((ge - gb) * nit); /* DY: grows by nit with each group taken */
    __shared__ int pool_q[DY ? 16 : 1][GV_POOL_Q];
    __shared__ int pool_done; /* DY 2: the block's warps done taking (zeroed here, used after x's staging barrier) */
    if (DY == 2 && threadIdx.x == 0)
        pool_done = 0;
    int qin = 0, qout = 0; /* groups taken, and consumed */

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
    auto advance = [&]() { /* the issue side's cursor past the chunk just issued or loaded */
        fi++;
        islot = islot + 1 == S ? 0 : islot + 1;
        if (++ic.it == nit) {
            ic.it = 0;
            bool more = ++ic.grp < ge;
            if constexpr (DY)
                if (!more && fi == nf) { /* the dealt groups (or the last taken) are all issued */
                    int id = 0;
                    if (lane == 0)
                        id = DY == 2 && __ldcg(g.pool) >= G - GD ? (int)(G - GD) : atomicAdd(g.pool, 1);
                    id = __shfl_sync(0xffffffffu, id, 0);
                    if (GD + id < G) {
                        ic.grp = GD + id;
                        pool_q[warp][qin++ % GV_POOL_Q] = (int)ic.grp; /* every lane: each reads its own */
                        nf += nit;
                        more = true;
                    } else if (lane == 0) {
                        /* none left: this warp takes no more. The last warp
                         * to find that zeroes the pair for the next launch
                         * (whose takes wait behind this grid's end) */
                        __threadfence();
                        const bool last = DY == 2 ? atomicAdd_block(&pool_done, 1) == nwarps - 1 &&
                                                       atomicAdd(g.pool + 1, 1) == (int)gridDim.x - 1
                                                 : atomicAdd(g.pool + 1, 1) == (int)NW - 1;
                        if (last) {
                            atomicExch(g.pool, 0);
                            atomicExch(g.pool + 1, 0);
                        }
                    }
                }
            if (more) {
                gv_locate(g, RPW, words, groups, sbsz, ic);
                iw = (const char *)ic.W + 16 * lane;
            }
        }
    };
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
        advance();
    };
    /* RL: chunk ic.it of the row group into registers (rows past the
     * matrix's end load its last row again, as issue() copies it) */
    auto rl_load = [&](uint4 (&wv)[RPW], uint2 (&sr)[RPW]) {
        const int c = lane + 32 * ic.it;
        if (c < nch) {
            const uint32_t gi = __umulhi((uint32_t)c * VPC, gmag);
            const char *ws = iw + (size_t)ic.it * 512;
            const char *ss = ic.sb + ((size_t)gi << sbs);
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint32_t rr = (uint32_t)min(r, ic.nrows - 1);
                wv[r] = rl_ld<RL>((const uint4 *)(ws + (size_t)(rr * rwb)));
                if (f32s)
                    sr[r] = rl_ld<RL>((const uint2 *)(ss + (size_t)(rr * rsb)));
                else
                    sr[r] = make_uint2(rl_ld<RL>((const unsigned *)(ss + (size_t)(rr * rsb))), 0u);
            }
        }
        advance();
    };
    /* g.npre of the ring's S - 1 first chunks go out before x can be read;
     * the others once x's loads are issued (after the norm's first batch),
     * so that those are not queued behind a ring's worth of weights */
    const int npre = min(g.npre, S - 1);
    uint4 wa[RPW], wb[RPW]; /* RL: the two register slots */
    uint2 sa[RPW], sb[RPW];
    if constexpr (RL) {
        if (fi < nf) /* constant data: the first chunk before the wait too */
            rl_load(wa, sa);
    } else {
#pragma unroll
        for (int st = 0; st < S - 1; st++)
            if (st < npre) {
                if (fi < nf)
                    issue();
                cp_async_commit();
            }
    }
    if constexpr (CV) {
        /* the conv state and taps of this warp's first rows of segment 0
         * toward L2, for the epilogue (a hint: no ordering needed) */
        const int64_t row = gb * RPW + lane, end = min(ge, g.g0[1]) * RPW;
        if (row < end && row < g.rows[0]) {
#pragma unroll
            for (int i = 0; i < CU_CONV_K - 1; i++)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(g.cv.state + (size_t)i * g.rows[0] + row));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(g.cv.w + (size_t)row * CU_CONV_K));
        }
    }
    pdl_wait();
    if constexpr (ST)
        ts[1] = gv_now();
    auto rest = [&]() { /* called at up to three places: one copy of issue() each */
        if constexpr (!RL) {
#pragma unroll 1
            for (int st = npre; st < S - 1; st++) {
                if (fi < nf)
                    issue();
                cp_async_commit();
            }
        }
    };
    if constexpr (DP)
        gd_stage_x<TT>((char *)xs, x, T, cols, nit, group, g, rest);
    else
        gv_stage_x<BITS, TT>(xs, x, T, cols, stride4, g, rest);
    if constexpr (ST)
        ts[2] = gv_now();
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
    /* the row group at cc is complete: reduce over the lanes, store, move on */
    auto finish = [&]() {
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
        /* the epilogue's loads for the warp's row group */
        const float addv = gv_add_load<TT>(g, cc, lane, T);
        gv_conv_in cin = {};
        if (CV)
            cin = gv_conv_load<TT>(g, cc, lane, T);
        if (CV && cc.seg == 0) {
            const int r = lane / TT, t = lane % TT;
            float v = gv_lane_acc<RPW, TT>(acc, r, t);
            const bool mine = lane < cc.nrows * TT && t < T;
            const int64_t row = cc.r0 + r;
            if (mine && g.bias[0])
                v += g.bias[0][row];
            gv_conv_epi<TT>(g, v, mine, r, t, row, T, cin);
        } else if (lane < cc.nrows * TT) {
            const int r = lane / TT, t = lane % TT;
            float v = gv_lane_acc<RPW, TT>(acc, r, t);
            if (t < T) {
                const int i = cc.seg;
                const int64_t row = cc.r0 + r, rows = g.rows[i];
                if (g.bias[i])
                    v += g.bias[i][row];
                g.y[i][(size_t)t * rows + row] = v;
                if (g.add_to[i])
                    g.add_to[i][(size_t)t * rows + row] = addv + v;
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
        else if (DY && qout < qin) {
            cc.grp = pool_q[warp][qout++ % GV_POOL_Q];
            gv_locate(g, RPW, words, groups, sbsz, cc);
        }
    };
    if constexpr (RL) {
        /* two chunks an iteration, so each slot is a compile-time one: the
         * next chunk's loads go out before this one's arithmetic */
        auto rl_chunk = [&](const uint4 (&wr)[RPW], const uint2 (&sr)[RPW]) {
            const int c = lane + 32 * cc.it;
            if (c < nch) {
                float2 sbv[RPW];
#pragma unroll
                for (int r = 0; r < RPW; r++)
                    sbv[r] = sb_pair(sr[r], sf);
                gd_chunk<TT, RPW>(wr, sbv, (const char *)xs, nit, nch, c, acc, T);
            }
            if (++cc.it == nit)
                finish();
        };
        for (int f = 0; f < nf; f += 2) {
            if (fi < nf)
                rl_load(wb, sb);
            rl_chunk(wa, sa);
            if (f + 1 >= nf)
                break;
            if (fi < nf)
                rl_load(wa, sa);
            rl_chunk(wb, sb);
        }
    } else {
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
            if (++cc.it == nit)
                finish();
        }
    }
    if constexpr (ST) {
        ts[3] = gv_now();
        __syncthreads();
        if (threadIdx.x == 0) {
            ts[4] = gv_now();
            const unsigned i = atomicAdd(&gv_stamp_n, 1u);
            if (i < gv_stamp_cap) {
                sn_gemv_stamp *r = gv_stamp_buf + i;
                r->w0 = (uint64_t)(uintptr_t)g.W[0];
                for (int k = 0; k < 5; k++)
                    r->t[k] = ts[k];
                r->block = (int32_t)blockIdx.x;
                r->grid = (int32_t)gridDim.x;
                r->rows = g.rows[0];
            }
        }
    }
}

/* Blocks per SM of a kernel at a block size and dynamic shared memory,
 * remembered per (kernel, size) (the query costs microseconds per call;
 * the instances of k_gemv share a type, so the kernel is in the key). */
template <typename K>
int occupancy(K kern, int threads, size_t smem)
{
    struct entry {
        const void *k;
        size_t smem;
        int threads, per;
    };
    static entry cache[16];
    static int next;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    for (const entry &e : cache)
        if (e.k == (const void *)kern && e.smem == smem && e.threads == threads)
            return e.per;
    int per = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, threads, smem) != cudaSuccess) {
        cudaGetLastError(); /* a failed query must not look like a failed launch */
        per = 0;
    }
    cache[next] = { (const void *)kern, smem, threads, per };
    next = (next + 1) % 16;
    return per;
}

/* Dynamic shared memory of a k_gemv block: staged x for tt tokens and
 * nwarps rings. */
size_t gv_smem(const cu_weight *w, int tt, int rpw, int nwarps, bool dp)
{
    int vpc = 128 / w->bits;
    int64_t nch = w->words / 4, stride4 = ((nch + 31) / 32) * (vpc / 4) * 32;
    /* a warp's ring as k_gemv<RPW> lays it out: one row a warp uses half of
     * two rows' ring (allocating two rows' kept e.g. the 35B-A3B's out
     * projection at 8 rows to blocks of 8 warps, 245 KB for 16) */
    size_t ring = rpw == 1 ? gv_ring<1>::per_warp : rpw == 2 ? gv_ring<2>::per_warp : gv_ring<4>::per_warp;
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

/* Whether a one-token launch of G row groups on nw resident warps takes
 * the pool form, and how many groups it deals (*gst): gemv_dyn percent,
 * when the launch has gemv_dyn_min groups a warp and every warp's dealt
 * share is more than the S - 1 ring chunks it may issue before pdl_wait
 * (a take must come after it). The 35B-A3B's launches, about one group a
 * warp, stay on the dealt form: with every launch pooled its step was
 * 14.6 % slower (s34r1), each warp taking from the one counter. */
std::atomic<long> gv_pool_n; /* pool-form launches (sn_cuda_gemv_pool) */

bool gv_pool_form(const cu_devinfo *di, int64_t G, int64_t nw, int nit, int S, int64_t *gst)
{
    if (di->gemv_dyn <= 0 || !di->gv_pool || nw <= 0 || G < (int64_t)di->gemv_dyn_min * nw || G >= INT32_MAX)
        return false;
    const int64_t d = G * di->gemv_dyn / 100;
    if ((d / nw) * nit <= S || d >= G)
        return false;
    *gst = d;
    return true;
}

/* gemv_rl = 3 (the default) takes the register-load form (1) for rows of
 * more than this many columns and the ring for the others. On an H100
 * (s45r1, three interleaved rounds at 4096 context) the 27B's step, whose
 * one-token dp4a GEMVs all have 5120 columns, took 7.763-7.771 ms with
 * form 1 against 7.838-7.874 with the ring (-1.1 %), and the 35B-A3B's,
 * all 2048 columns, 2.055-2.057 against 2.027-2.042 (+0.8 %; ncu: its
 * launches 7-9 % longer). Form 2 lost on both. */
#define GV_RL_MIN_COLS 4096

template <int BITS, int TT, int RPW, bool DP, bool CV>
sn_status gv_launch(const cu_devinfo *di, cudaStream_t s, const gemv_seg &gin, const cu_weight *w0, const float *x,
                    int T)
{
    gemv_seg g = gin;
    auto kern = k_gemv<BITS, TT, RPW, DP, CV>;
    if constexpr (TT == 1)
        if (gv_stamping)
            kern = k_gemv<BITS, 1, RPW, DP, CV, true>;
    /* the register-load form (tune gemv_rl: 1 or 2) where it has instances */
    constexpr bool RLF = TT == 1 && DP;
    int rl = RLF && !gv_stamping ? di->gemv_rl : 0;
    if (rl == 3) /* by shape: register loads for rows longer than GV_RL_MIN_COLS */
        rl = w0->cols > GV_RL_MIN_COLS ? 1 : 0;
    if constexpr (RLF) {
        if (rl == 1)
            kern = k_gemv<BITS, 1, RPW, DP, CV, false, 0, 1>;
        else if (rl == 2)
            kern = k_gemv<BITS, 1, RPW, DP, CV, false, 0, 2>;
    }
    /* the pool form exists for the shapes that have enough groups for it:
     * the dp4a form at 4 rows a warp (T <= 2, at least 8192 rows) */
    constexpr bool POOL = TT == 1 && RPW == 4 && DP && !CV;
    const int nit = (int)((w0->words / 4 + 31) / 32);
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
    if constexpr (POOL) {
        /* the pool instance keeps the plain one's grid when as many of
         * its blocks are resident (more registers) */
        auto pk = di->gemv_dyn_lean ? k_gemv<BITS, 1, RPW, DP, CV, false, 2> : k_gemv<BITS, 1, RPW, DP, CV, false, 1>;
        if (rl == 1)
            pk = di->gemv_dyn_lean ? k_gemv<BITS, 1, RPW, DP, CV, false, 2, 1> : k_gemv<BITS, 1, RPW, DP, CV, false, 1, 1>;
        else if (rl == 2)
            pk = di->gemv_dyn_lean ? k_gemv<BITS, 1, RPW, DP, CV, false, 2, 2> : k_gemv<BITS, 1, RPW, DP, CV, false, 1, 2>;
        if (!gv_stamping && gv_pool_form(di, G, grid * best_w, nit, gv_ring<RPW>::S, &g.gst) &&
            occupancy(pk, best_w * 32, gv_smem(w0, TT, RPW, best_w, DP)) == best_per) {
            g.pool = di->gv_pool;
            kern = pk;
            gv_pool_n.fetch_add(1, std::memory_order_relaxed);
        }
    }
    /* every resident block, though a warp may take one row group more than
     * another (the 27B's gate/up: 8704 groups over 2112 warps, 4 or 5):
     * the fewest blocks that give no warp more groups (218) made that
     * launch 4-5 % slower alone and the 27B step 1.6-1.8 % (run 42), so the
     * warps share the SM's pace and the uneven last group is not the cost */
    (void)cu_launch_w(w0->bits, cu_seg_weight_bytes(g, w0), kern, dim3((unsigned)grid), dim3((unsigned)(best_w * 32)), gv_smem(w0, TT, RPW, best_w, DP), s, g,
                      w0->sfmt, (int64_t)w0->cols, (int64_t)w0->words, (int64_t)w0->groups, w0->group, x, T);
    CU_CHECK_LAUNCH("matmul gemv");
    return SN_OK;
}

template <int BITS, int RPW, bool DP, bool CV = false>
sn_status gv_pass(const cu_devinfo *di, cudaStream_t s, const gemv_seg &g, const cu_weight *w0, const float *x,
                  int T, int tt)
{
    switch (tt) {
    case 1: return gv_launch<BITS, 1, RPW, DP, CV>(di, s, g, w0, x, T);
    case 2: return gv_launch<BITS, 2, RPW, DP, CV>(di, s, g, w0, x, T);
    case 4: return gv_launch<BITS, 4, RPW, DP, CV>(di, s, g, w0, x, T);
    default: return gv_launch<BITS, 8, RPW, DP, CV>(di, s, g, w0, x, T);
    }
}

/* the passes cu_gv_run cuts T tokens into start with this many */
int gv_first_tt(const cu_devinfo *di, const cu_weight *w0, int T, int rpw, bool dp)
{
    int tt = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : GV_TMAX;
    while (tt > 1 && gv_smem(w0, tt, rpw, 8, dp) + GV_STATIC_SMEM > di->smem_optin)
        tt /= 2;
    return tt;
}

/* The small-matrix GEMV for 8-bit weights (cu_gv_small): a MoE router
 * with its shared-expert gate logit is 257 rows of 2048 columns, which
 * k_gemv ran as 17 blocks whose warps each issued 1728 instructions in
 * one chain (7.2 us for 0.5 MB, s27r5). Here the CT threads of a row
 * split its 16-value chunks (P = 256 / CT rows at once, GS_SR rows a
 * thread), the weights are loaded before x, x comes from global memory
 * and is normalised in registers, and a row's sum is a fixed tree (lanes,
 * then the row's warps in order): per (row, token) the same order for any
 * T, so a verify pass gives a decode step's bits. q is exact as a float
 * (not k_gemv's 1 + q/256): the two kernels agree to rounding only, so a
 * matrix takes one of them by its own shape, alone or grouped. */
constexpr int GS_THREADS = 256, GS_SR = 2;

/* 16 consecutive floats (two ld8) */
__device__ __forceinline__ void ld16(const float *p, bool al, float (&v)[16])
{
    float a[8], b[8];
    ld8(p, al, a);
    ld8(p + 8, al, b);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        v[k] = a[k];
        v[8 + k] = b[k];
    }
}

/* TT = 1 at two blocks an SM (126 registers, the form timed in s27r7); the
 * 8-token form at one, which keeps its registers unspilled */
template <int TT>
__global__ void __launch_bounds__(GS_THREADS, TT == 1 ? 2 : 1)
    k_gemv_q8s(gemv_seg g, int sf, int64_t cols, int64_t words, int64_t groups, int group, int ct,
               const float *__restrict__ x, int T)
{
    pdl_launch();
    __shared__ float inv[TT];
    __shared__ float part[GS_THREADS / 32][GS_SR][TT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int p = GS_THREADS / ct, sub = tid / ct, ci = tid % ct;
    const int nch = (int)(cols / 16);
    const bool f32s = sf == CS_F32;
    /* 16-byte accesses where the rows allow them (cols % 16 == 0: every row alike) */
    const bool xal = ((uintptr_t)x & 15) == 0, nal = ((uintptr_t)g.nw & 15) == 0, oal = ((uintptr_t)g.xn & 15) == 0;
    int64_t tot = 0;
    for (int i = 0; i < g.n; i++)
        tot += g.rows[i];
    /* this thread's rows: segment, row within it, weights and (scale, bias) rows */
    int seg[GS_SR];
    int64_t rr[GS_SR];
    const uint4 *wr[GS_SR];
    const char *sr[GS_SR];
#pragma unroll
    for (int k = 0; k < GS_SR; k++) {
        const int64_t r = ((int64_t)blockIdx.x * GS_SR + k) * p + sub;
        int i = 0;
        int64_t base = 0;
        while (i < g.n - 1 && r >= base + g.rows[i])
            base += g.rows[i++];
        seg[k] = r < tot ? i : -1;
        rr[k] = r - base;
        const int64_t rc = r < tot ? rr[k] : 0; /* a row past the end reads row 0 of its segment, never stored */
        wr[k] = (const uint4 *)(g.W[i] + rc * words);
        sr[k] = (const char *)g.sb[i] + (size_t)(rc * groups) * (f32s ? 8 : 4);
    }
    auto load_w = [&](int c, uint4 (&w)[GS_SR], float2 (&sb)[GS_SR]) {
        const int64_t gi = (int64_t)c * 16 / group;
#pragma unroll
        for (int k = 0; k < GS_SR; k++) {
            w[k] = __ldcs(wr[k] + c);
            const uint2 e = f32s ? *(const uint2 *)(sr[k] + gi * 8) : make_uint2(*(const uint32_t *)(sr[k] + gi * 4), 0u);
            sb[k] = sb_pair(e, sf);
        }
    };
    uint4 w[GS_SR];
    float2 sb[GS_SR];
    if (ci < nch)
        load_w(ci, w, sb); /* weights need no wait: in flight through the norm */
    pdl_wait();
    /* one token: its first chunk of x and of the norm's weights in flight
     * through the norm's loads and barriers too (each was one more L2
     * round trip after them) */
    float xpre[16], nwpre[16];
    if (TT == 1 && ci < nch) {
        ld16(x + (size_t)ci * 16, xal, xpre);
        if (g.nw)
            ld16(g.nw + (size_t)ci * 16, nal, nwpre);
    }
    if (g.nw)
        gv_norm_inv<TT>(x, T, cols, g, inv, [] {});
    /* block 0's first row of threads covers every chunk: it writes x_n */
    const bool wxn = g.xn && g.nw && blockIdx.x == 0 && sub == 0;
    float acc[GS_SR][TT];
#pragma unroll
    for (int k = 0; k < GS_SR; k++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[k][t] = 0.f;
    for (int c = ci; c < nch; c += ct) {
        const bool pre = TT == 1 && c == ci; /* x and nw of this chunk in registers already */
        if (c != ci)
            load_w(c, w, sb); /* the first chunk's weights came before pdl_wait */
        float nw[16];
        if (g.nw) {
            if (pre) {
#pragma unroll
                for (int v = 0; v < 16; v++)
                    nw[v] = nwpre[v];
            } else {
                ld16(g.nw + (size_t)c * 16, nal, nw);
            }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (TT > 1 && t >= T)
                break;
            float xv[16];
            if (pre) {
#pragma unroll
                for (int v = 0; v < 16; v++)
                    xv[v] = xpre[v];
            } else {
                ld16(x + (size_t)t * cols + (size_t)c * 16, xal, xv);
            }
            if (g.nw) {
                const float iv = inv[t];
#pragma unroll
                for (int v = 0; v < 16; v++)
                    xv[v] = __fmul_rn(__fmul_rn(xv[v], iv), nw[v]); /* k_rmsnorm's x * inv * w; _rn: never
                                                                       contracted into the sums below */
                if (wxn) {
                    float *o = g.xn + (size_t)t * cols + (size_t)c * 16;
#pragma unroll
                    for (int f = 0; f < 4; f++)
                        if (oal)
                            ((float4 *)o)[f] = make_float4(xv[4 * f], xv[4 * f + 1], xv[4 * f + 2], xv[4 * f + 3]);
                        else
                            o[4 * f] = xv[4 * f], o[4 * f + 1] = xv[4 * f + 1], o[4 * f + 2] = xv[4 * f + 2],
                            o[4 * f + 3] = xv[4 * f + 3];
                }
            }
            float xs = 0.f;
#pragma unroll
            for (int v = 0; v < 16; v++)
                xs += xv[v];
#pragma unroll
            for (int k = 0; k < GS_SR; k++) {
                const uint32_t ws[4] = { w[k].x, w[k].y, w[k].z, w[k].w };
                float d = 0.f;
#pragma unroll
                for (int v = 0; v < 16; v++)
                    d = fmaf((float)((ws[v >> 2] >> (8 * (v & 3))) & 0xffu), xv[v], d);
                acc[k][t] = fmaf(sb[k].x, d, fmaf(sb[k].y, xs, acc[k][t]));
            }
        }
    }
    /* a row's CT threads are whole warps: lanes by xor, then its warps in order */
#pragma unroll
    for (int k = 0; k < GS_SR; k++)
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float v = acc[k][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0)
                part[warp][k][t] = v;
        }
    __syncthreads();
    const int wpr = ct / 32;
    if (ci < GS_SR * TT) {
        const int k = ci / TT, t = ci % TT;
        static_assert(GS_SR == 2, "the row picks below");
        const int i = k ? seg[1] : seg[0]; /* selects: a runtime index would put the arrays in local memory */
        const int64_t row = k ? rr[1] : rr[0];
        if (t < T && i >= 0) {
            float v = 0.f;
            for (int q = 0; q < wpr; q++)
                v += part[sub * wpr + q][k][t];
            if (g.bias[i])
                v += g.bias[i][row];
            const size_t o = (size_t)t * g.rows[i] + row;
            g.y[i][o] = v;
            if (g.add_to[i])
                g.add_to[i][o] = g.add_to[i][o] + v; /* the residual add's order, as k_gemv's epilogue */
        }
    }
}

/* g for a pass starting at token t0: its outputs (y, add_to, x_n) moved
 * to that token's rows */
gemv_seg gv_seg_from(const gemv_seg &g, int t0, int64_t cols)
{
    gemv_seg p = g;
    for (int i = 0; i < g.n; i++) {
        p.y[i] = g.y[i] + (size_t)t0 * g.rows[i];
        if (g.add_to[i])
            p.add_to[i] = g.add_to[i] + (size_t)t0 * g.rows[i];
    }
    if (g.xn)
        p.xn = g.xn + (size_t)t0 * cols;
    return p;
}

sn_status gs_run(const cu_devinfo *di, cudaStream_t s, const gemv_seg &g, const cu_weight *w0, const float *x, int T)
{
    const int nch = (int)(w0->cols / 16);
    int ct = 32;
    while (ct < nch && ct < GS_THREADS)
        ct *= 2;
    int64_t tot = 0;
    for (int i = 0; i < g.n; i++)
        tot += g.rows[i];
    const int64_t per = (int64_t)(GS_THREADS / ct) * GS_SR;
    const unsigned grid = (unsigned)((tot + per - 1) / per);
    for (int t0 = 0; t0 < T; t0 += GV_TMAX) {
        const int nt = T - t0 < GV_TMAX ? T - t0 : GV_TMAX;
        const gemv_seg p = gv_seg_from(g, t0, w0->cols);
        const float *xp = x + (size_t)t0 * w0->cols;
        auto kern = nt == 1 ? k_gemv_q8s<1> : k_gemv_q8s<GV_TMAX>;
        (void)cu_launch_w(w0->bits, cu_seg_weight_bytes(g, w0), kern, dim3(grid), dim3(GS_THREADS), 0, s, p, w0->sfmt,
                          (int64_t)w0->cols, (int64_t)w0->words, (int64_t)w0->groups, w0->group, ct, xp, nt);
        CU_CHECK_LAUNCH("matmul gemv q8 small");
    }
    return SN_OK;
}
} // namespace

/* the dp4a form for Q4 in MLX's groups (its staging needs whole groups of
 * 4, 8 or 16 threads): chosen by format only, so a matrix takes the same
 * kernel alone or grouped */
static bool gv_dp(const cu_devinfo *di, const cu_weight *w0)
{
    return di->gemv_dp && w0->fmt == CW_Q4 && (w0->group == 32 || w0->group == 64 || w0->group == 128);
}

static bool gs_shape(const cu_devinfo *di, const cu_weight *w, int64_t rows)
{
    return w->fmt == CW_Q8 && rows < di->gemv_q8s_rows && w->cols % 16 == 0 && w->group > 0 && w->group % 16 == 0 &&
           w->cols <= INT32_MAX;
}

bool cu_gv_small(const cu_devinfo *di, const cu_weight *w) { return gs_shape(di, w, w->rows); }

bool cu_gv_folds_conv(const cu_devinfo *di, const cu_weight *w0, int T)
{
    /* one pass at the largest ring (4 rows a warp): the epilogue sees every token */
    return gv_dp(di, w0) && T >= 1 && T <= GV_TMAX && gv_first_tt(di, w0, T, 4, true) >= T;
}

/* T <= GV_TMAX tokens (more in passes) through the segments of g, whose
 * rows, pointers, norm and add_to are set; g0 is filled here. */
sn_status cu_gv_run(const cu_devinfo *di, cudaStream_t s, gemv_seg g, const cu_weight *w0, const float *x, int T)
{
    int64_t tot = 0;
    for (int i = 0; i < g.n; i++)
        tot += g.rows[i];
    /* a group's matrices take the kernel each takes alone (the graph fuser and
     * cu_matmul_group check cu_gv_small per matrix) */
    const bool small = gs_shape(di, w0, g.rows[0]);
    for (int i = 1; i < g.n; i++)
        if (gs_shape(di, w0, g.rows[i]) != small)
            return SN_FAIL(SN_E_INVALID, "matmul group: matrix %d (%lld rows) is not the GEMV kind of matrix 0", i,
                           (long long)g.rows[i]);
    if (small) {
        if (g.cv.w || (g.nw && g.norm_threads > 1024))
            return SN_FAIL(SN_E_INVALID, "matmul: a fold the small 8-bit GEMV has no form for");
        return gs_run(di, s, g, w0, x, T);
    }
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
    const bool dp = gv_dp(di, w0);
    if (g.cv.w && (!cu_gv_folds_conv(di, w0, T) || gv_first_tt(di, w0, T, rpw, dp) < T || g.add_to[0] ||
                   ((uintptr_t)g.cv.w & 15) != 0))
        return SN_FAIL(SN_E_INVALID, "matmul: a GDN conv this GEMV cannot fold (%d tokens)", T);
    g.npre = di->gemv_pre;
    if (w0->group <= 0)
        return SN_FAIL(SN_E_INVALID, "matmul: quant group of %d", w0->group);
    g.gmag = 0xffffffffu / (uint32_t)w0->group + 1u;
    g.g0[0] = 0;
    for (int i = 0; i < g.n; i++)
        g.g0[i + 1] = g.g0[i] + (g.rows[i] + rpw - 1) / rpw;
    for (int t0 = 0; t0 < T;) {
        int left = T - t0;
        int tt = gv_first_tt(di, w0, left, rpw, dp);
        if (gv_smem(w0, 1, rpw, 8, dp) + GV_STATIC_SMEM > di->smem_optin)
            return SN_FAIL(SN_E_UNSUPPORTED, "matmul: %lld columns exceed the GEMV's shared memory",
                           (long long)w0->cols);
        int nt = left < tt ? left : tt;
        const gemv_seg p = gv_seg_from(g, t0, w0->cols);
        const float *xp = x + (size_t)t0 * w0->cols;
        sn_status st;
        if (g.cv.w) /* a GDN conv folded (cu_gv_folds_conv: dp, one pass) */
            st = rpw == 4   ? gv_pass<4, 4, true, true>(di, s, p, w0, xp, nt, tt)
                 : rpw == 1 ? gv_pass<4, 1, true, true>(di, s, p, w0, xp, nt, tt)
                            : gv_pass<4, 2, true, true>(di, s, p, w0, xp, nt, tt);
        else if (dp)
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

sn_status cu_gv_stamps(sn_gemv_stamp *buf, int cap, bool *changed)
{
    const unsigned zero = 0, c = cap > 0 ? (unsigned)cap : 0u;
    CU_TRY(cudaMemcpyToSymbol(gv_stamp_buf, &buf, sizeof buf), "gemv stamps");
    CU_TRY(cudaMemcpyToSymbol(gv_stamp_cap, &c, sizeof c), "gemv stamps");
    CU_TRY(cudaMemcpyToSymbol(gv_stamp_n, &zero, sizeof zero), "gemv stamps");
    if (changed)
        *changed = gv_stamping != (cap > 0);
    gv_stamping = cap > 0;
    return SN_OK;
}

long cu_gv_pool_launches(void) { return gv_pool_n.load(std::memory_order_relaxed); }

sn_status cu_gv_stamps_count(int *n)
{
    unsigned v = 0;
    CU_TRY(cudaMemcpyFromSymbol(&v, gv_stamp_n, sizeof v), "gemv stamps");
    *n = (int)v;
    return SN_OK;
}

sn_status cu_gemv_init(const cu_devinfo *di)
{
#define GEMV_INIT(B, R, DP, CV)                                                                                   \
    SN_TRY(gv_max_smem(k_gemv<B, 1, R, DP, CV>, di));                                                              \
    SN_TRY(gv_max_smem(k_gemv<B, 1, R, DP, CV, true>, di));                                                        \
    SN_TRY(gv_max_smem(k_gemv<B, 2, R, DP, CV>, di));                                                              \
    SN_TRY(gv_max_smem(k_gemv<B, 4, R, DP, CV>, di));                                                              \
    SN_TRY(gv_max_smem(k_gemv<B, 8, R, DP, CV>, di));
    SN_TRY(gv_max_smem(k_gemv<4, 1, 4, true, false, false, 1>, di));
    SN_TRY(gv_max_smem(k_gemv<4, 1, 4, true, false, false, 2>, di));
    /* the register-load forms (gemv_rl 1 and 2): dealt, pooled, conv-folded */
#define GEMV_INIT_RL(L)                                                                                           \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 4, true, false, false, 1, L>, di));                                            \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 4, true, false, false, 2, L>, di));                                            \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 1, true, false, false, 0, L>, di));                                            \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 2, true, false, false, 0, L>, di));                                            \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 4, true, false, false, 0, L>, di));                                            \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 1, true, true, false, 0, L>, di));                                             \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 2, true, true, false, 0, L>, di));                                             \
    SN_TRY(gv_max_smem(k_gemv<4, 1, 4, true, true, false, 0, L>, di));
    GEMV_INIT_RL(1)
    GEMV_INIT_RL(2)
#undef GEMV_INIT_RL
    GEMV_INIT(4, 1, false, false)
    GEMV_INIT(4, 2, false, false)
    GEMV_INIT(4, 4, false, false)
    GEMV_INIT(4, 1, true, false)
    GEMV_INIT(4, 2, true, false)
    GEMV_INIT(4, 4, true, false)
    GEMV_INIT(4, 1, true, true)
    GEMV_INIT(4, 2, true, true)
    GEMV_INIT(4, 4, true, true)
    GEMV_INIT(8, 1, false, false)
    GEMV_INIT(8, 2, false, false)
    GEMV_INIT(8, 4, false, false)
#undef GEMV_INIT
    return SN_OK;
}
