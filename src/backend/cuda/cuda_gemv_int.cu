/* The decode GEMV on the integer tensor cores (issue 6), for repacked Q4
 * weights (cu_repack_q4 at upload): x becomes three int8 digit planes per
 * (token, quant group) in k_x_digits (an RMSNorm or a swiglu folded in),
 * and k_gemv_sk (stream-K, default) or k_gemv_i8 (the ring form) run exact
 * int32 MMAs per group with fp32 scaling. cuda_matmul.cu chooses between
 * this and the SIMT GEMV (cu_gi_size_ok) and calls cu_gi_run. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <cuda_pipeline.h>

#include "backend/cuda/cuda_gemv_int.h"
#include "backend/cuda/cuda_quant.h"

namespace {

/* ---- decode GEMV on the integer tensor cores (repacked Q4) -------------- */
/*
 * Exact integer products instead of fp32 FMAs: the 4-bit weights are the A
 * operand of mma.m16n8k32 (u8 values 0..15, unpacked by one AND or a shift
 * and an AND per 4 values), and each token's x becomes three signed 8-bit
 * digit planes of integers X = round(x * 2^e), e per token and quant group
 * so that |X| <= 2^22 (x = (65536*d0 + 256*d1 + d2) * 2^-e, d* in
 * [-128, 127]). The int32 products are exact, so per group and digit plane
 * the partial is exact; it is scaled (s * 2^-e, exact) into an fp32
 * accumulator per plane (the group's bias times sum(x) rides on plane d0,
 * divided by 65536), and the planes are combined once at the end:
 * fp32-class results (x kept to 23 bits of its group's maximum, fp32
 * accumulation) for about a third of the instructions per weight of the
 * fp32 FMA kernel, which is instruction bound. A token occupies three of the eight columns of an n-tile; the
 * integer MMA is exact whatever sits in the other columns, so a token's
 * result is bitwise the same alone or among up to 8.
 *
 * Work: a block of 8 warps takes MB tiles of 16 rows; warp w takes the
 * 64-column blocks [w*KB/8, (w+1)*KB/8), and the 8 partials are added in
 * warp order. Weights stream in 16-byte loads per lane, four blocks ahead
 * of the MMAs (the first four before pdl_wait). */

__global__ void k_repack_q4(const uint32_t *__restrict__ q, int64_t rows, int64_t words, int64_t MT, int64_t KB,
                            uint4 *__restrict__ out)
{
    const size_t n = (size_t)MT * KB * 32;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int lane = (int)(i % 32), g = lane >> 2, t = lane & 3;
        const int64_t kb = (int64_t)(i / 32) % KB, mt = (int64_t)(i / 32) / KB;
        const int64_t r0 = 16 * mt + g, r1 = r0 + 8;
        uint32_t wd[4];
#pragma unroll
        for (int kt = 0; kt < 2; kt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t v = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int64_t k = kb * 64 + 32 * kt + 16 * h + 4 * t + j;
                    const uint32_t sh = 4u * (uint32_t)(k % 8);
                    uint32_t n0 = r0 < rows ? (q[r0 * words + k / 8] >> sh) & 15u : 0u;
                    uint32_t n1 = r1 < rows ? (q[r1 * words + k / 8] >> sh) & 15u : 0u;
                    v |= n0 << (8 * j);
                    v |= n1 << (8 * j + 4);
                }
                wd[2 * kt + h] = v;
            }
        out[i] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
    }
}

/* (scale, bias) pairs [rows][groups] -> [mt][groups][16] (zeros past the last row) */
__global__ void k_repack_sb(const void *__restrict__ sb, int pair_bytes, int64_t rows, int64_t groups, int64_t MT,
                            void *__restrict__ out)
{
    const size_t n = (size_t)MT * groups * 16;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int64_t r = (int64_t)(i % 16), grp = (int64_t)(i / 16) % groups, mt = (int64_t)(i / 16) / groups;
        const int64_t row = 16 * mt + r;
        if (pair_bytes == 8)
            ((float2 *)out)[i] = row < rows ? ((const float2 *)sb)[row * groups + grp] : make_float2(0.f, 0.f);
        else
            ((uint32_t *)out)[i] = row < rows ? ((const uint32_t *)sb)[row * groups + grp] : 0u;
    }
}


/* A row's digit-plane sums -> its value: x = (65536*d0 + 256*d1 + d2) * 2^-e,
 * in this fixed order (every form of the integer GEMV combines the same way). */
__device__ __forceinline__ float gi_planes(float p0, float p1, float p2) { return (65536.f * p0 + 256.f * p1) + p2; }

/* One quant group's exact partial C of a plane, scaled into acc: s * 2^-e * C,
 * then the group's bias times sum(x) (xb, nonzero on plane d0 at the group's end). */
__device__ __forceinline__ void gi_scale(float &acc, int &C, float2 sr, float es, float xb)
{
    acc = fmaf(sr.x * es, (float)C, acc);
    acc = fmaf(sr.y, xb, acc);
    C = 0;
}

/* add_to's value at output row r of segment s, token t (0 when there is
 * none or r is past the rows): the stream-K GEMV loads it before a tile's
 * last reduction, where after it (in gi_put) it was one more round trip at
 * the end of every emitting warp. Only that warp reads and writes it. */
__device__ __forceinline__ float gi_add_at(const gi_seg &g, int s, int64_t r, int t)
{
    return g.add_to[s] && r < g.rows[s] ? g.add_to[s][(size_t)t * g.rows[s] + r] : 0.f;
}

/* Output row r of segment s, token t: + the linear bias, stored, added to
 * add_to, whose value av was loaded already (gi_add_at) */
__device__ __forceinline__ void gi_put_pre(const gi_seg &g, int s, int64_t r, int t, float v, float av)
{
    const int64_t rows = g.rows[s];
    if (g.bias[s])
        v += g.bias[s][r];
    g.y[s][(size_t)t * rows + r] = v;
    if (g.add_to[s])
        g.add_to[s][(size_t)t * rows + r] = av + v;
}

/* the same, add_to loaded here */
__device__ __forceinline__ void gi_put(const gi_seg &g, int s, int64_t r, int t, float v)
{
    gi_put_pre(g, s, r, t, v, gi_add_at(g, s, r, t));
}

constexpr int GI_S = 8;          /* ring stages of the integer GEMV: 64-column blocks, GI_S - 1 in flight */

__device__ __forceinline__ void imma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* A lane's repacked uint4 -> its u8 A fragments of the block's two k-tiles
 * (low nibbles: row g, high: row g + 8; see k_repack_q4) */
__device__ __forceinline__ void unpack_a(const uint4 &w, uint32_t (&a0)[4], uint32_t (&a1)[4])
{
    a0[0] = w.x & 0x0F0F0F0Fu;
    a0[1] = (w.x >> 4) & 0x0F0F0F0Fu;
    a0[2] = w.y & 0x0F0F0F0Fu;
    a0[3] = (w.y >> 4) & 0x0F0F0F0Fu;
    a1[0] = w.z & 0x0F0F0F0Fu;
    a1[1] = (w.z >> 4) & 0x0F0F0F0Fu;
    a1[2] = w.w & 0x0F0F0F0Fu;
    a1[3] = (w.w >> 4) & 0x0F0F0F0Fu;
}

/* The digit form of T rows of x (scratch of cu_matmul for T <= 8):
 * planes [3T][cols] int8 (plane 3t+d = digit d of token t), esc [T][groups]
 * = 2^-e, xsb [T][groups] = sum(X) * 2^-e / 65536. */
struct gi_x {
    int8_t *planes;
    float *esc, *xsb;
};


__host__ __device__ __forceinline__ gi_x gi_x_at(void *scratch, int64_t cols, int64_t groups, int T)
{
    gi_x d;
    d.planes = (int8_t *)scratch;
    d.esc = (float *)((char *)scratch + ((size_t)3 * T * cols + 255) / 256 * 256);
    d.xsb = d.esc + (size_t)T * groups;
    return d;
}

/* x -> digits. Grid (column blocks of 1024, T), 256 threads of 4 values;
 * a quant group's values sit in G/4 consecutive lanes. With nw set, x is
 * RMS-normalised first, bitwise as k_rmsnorm with norm_threads threads
 * (same per-thread order, same tree), and the normalised row goes to xn. */
template <int GS>
__global__ void __launch_bounds__(256)
k_x_digits(const float *__restrict__ x, int64_t cols, int64_t groups, const float *__restrict__ nw, float eps,
           int norm_threads, float *__restrict__ xn, const float *__restrict__ su, const float *__restrict__ gz,
           gi_x d, int T, int rec)
{
    pdl_enter();
    __shared__ float red_n[32];
    __shared__ float inv_s;
    constexpr int G = 32 * GS, LPG = G / 4; /* lanes per group */
    const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *xr = x + (size_t)t * cols;
    float inv = 1.f;
    if (nw && !gz) {
        rms_partials(xr, cols, norm_threads, red_n);
        __syncthreads();
        if (warp == 0) {
            float v = rms_total(red_n, norm_threads);
            if (lane == 0)
                inv_s = 1.f / sqrtf(v / (float)cols + eps);
        }
        __syncthreads();
        inv = inv_s;
    }
    const int64_t q = (int64_t)blockIdx.x * 256 + threadIdx.x; /* float4 index */
    const bool in = 4 * q < cols;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (gz) {
        /* the gated RMSNorm: a warp's 128 columns are one of its rows, lane
         * l holding 4l..4l+3 as in k_gated_rmsnorm_w (same sum, same tree;
         * cols % 128 == 0, so a warp is all in or all out); z and the
         * weights loaded beside x, not after the warp's sum */
        float4 zv = make_float4(0.f, 0.f, 0.f, 0.f);
        float wv[4] = { 0.f, 0.f, 0.f, 0.f };
        if (in) {
            v = __ldg((const float4 *)xr + q);
            zv = __ldg((const float4 *)(gz + (size_t)t * cols) + q);
#pragma unroll
            for (int j = 0; j < 4; j++)
                wv[j] = __ldg(nw + 4 * lane + j);
        }
        const float gi = cu_gnorm_inv(cu_gnorm_ss4(0.f, v), CU_GNORM_N, eps);
        if (in) {
            v = cu_gnorm_apply4(wv, v, zv, gi);
            if (xn)
                *((float4 *)(xn + (size_t)t * cols) + q) = v;
        }
    } else if (in) {
        v = __ldg((const float4 *)xr + q);
        if (su) {
            /* k_swiglu: out = silu(g) * u */
            const float4 u4 = __ldg((const float4 *)(su + (size_t)t * cols) + q);
            v = make_float4(cu_silu(v.x) * u4.x, cu_silu(v.y) * u4.y, cu_silu(v.z) * u4.z, cu_silu(v.w) * u4.w);
            if (xn)
                *((float4 *)(xn + (size_t)t * cols) + q) = v;
        } else if (nw) {
            const float4 w4 = __ldg((const float4 *)nw + q);
            /* k_rmsnorm: y = x * inv * w, in that order */
            v = make_float4(v.x * inv * w4.x, v.y * inv * w4.y, v.z * inv * w4.z, v.w * inv * w4.w);
            if (xn)
                *((float4 *)(xn + (size_t)t * cols) + q) = v;
        }
    }
    float mx = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = LPG / 2; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const int e2 = xd_exp(mx);
    const float vv[4] = { v.x, v.y, v.z, v.w };
    uint32_t p0, p1, p2, ub[4];
    int sum = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int X = xd_int(vv[j], e2);
        sum += X;
        ub[j] = xd_biased(X);
    }
    xd_planes4(ub[0], ub[1], ub[2], ub[3], p0, p1, p2);
#pragma unroll
    for (int o = LPG / 2; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o); /* integers: exact */
    if (in && rec) {
        /* the stream-K GEMV's records: in each 64-column block the 4x4
         * words transposed, so a lane's two k-tiles of B are one 16-byte load */
        constexpr int SPK = GS == 1 ? 2 : 1;
        const int64_t kb = q / 16;
        const int ow = (int)(q & 15), np = ((ow & 3) << 2) | (ow >> 2);
        char *r = (char *)d.planes + (size_t)kb * rec;
        ((uint32_t *)(r + (3 * t) * 64))[np] = p0;
        ((uint32_t *)(r + (3 * t + 1) * 64))[np] = p1;
        ((uint32_t *)(r + (3 * t + 2) * 64))[np] = p2;
        if ((threadIdx.x % LPG) == 0) {
            const float es = xd_pow2(-e2), xb = (float)sum * es * (1.f / 65536.f);
            /* the group's slot in the record of each block it covers */
            const int k = GS == 1 ? (int)((4 * q / G) & 1) : 0;
            float *e = (float *)(r + 3 * T * 64);
            e[k * T + t] = es;
            e[SPK * T + k * T + t] = xb;
            if (GS == 4) { /* a group of 128 spans two blocks: write the other one too */
                float *e2p = (float *)((char *)d.planes + (size_t)(kb ^ 1) * rec + 3 * T * 64);
                e2p[t] = es;
                e2p[T + t] = xb;
            }
        }
    } else if (in) {
        ((uint32_t *)(d.planes + (size_t)(3 * t) * cols))[q] = p0;
        ((uint32_t *)(d.planes + (size_t)(3 * t + 1) * cols))[q] = p1;
        ((uint32_t *)(d.planes + (size_t)(3 * t + 2) * cols))[q] = p2;
        if ((threadIdx.x % LPG) == 0) {
            const int64_t grp = 4 * q / G;
            const float es = xd_pow2(-e2);
            d.esc[(size_t)t * groups + grp] = es;
            d.xsb[(size_t)t * groups + grp] = (float)sum * es * (1.f / 65536.f);
        }
    }
}

/* Dynamic shared memory of a k_gemv_i8 block: 8 warps' rings. */
__host__ __device__ __forceinline__ size_t gi_ring_bytes(int MB, int SPK)
{
    return (size_t)8 * GI_S * MB * 32 * (sizeof(uint4) + (size_t)SPK * 2 * sizeof(uint32_t));
}

/* GS: k-tiles (32 columns) per quant group; NT: n-tiles of 8 digit planes */
template <int GS, int NT, int MB>
__global__ void __launch_bounds__(256, NT == 1 && MB == 1 ? 4 : 1)
k_gemv_i8(gi_seg g, int sf, int64_t cols, int64_t groups, gi_x xd, int T)
{
    pdl_launch();
    __shared__ float red[8 * MB * 16 * 8 * NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    int si = 0;
    while (si + 1 < g.n && (int)blockIdx.x >= g.b0[si + 1])
        si++;
    const int mt0 = ((int)blockIdx.x - g.b0[si]) * MB;
    const int KB = (int)(cols / 64), ngr = (int)groups;
    const int kb_beg = warp * KB / 8, kb_end = (warp + 1) * KB / 8;
    const int P = 3 * T;
    constexpr int SPK = GS == 1 ? 2 : 1; /* quant groups per 64-column block */
    constexpr int KPG = GS == 4 ? 2 : 1; /* 64-column blocks per group */

    bool mv[MB];
    const uint4 *Wp[MB];
    const uint32_t *Sp[MB];
#pragma unroll
    for (int m = 0; m < MB; m++) {
        mv[m] = mt0 + m < g.mt[si];
        Wp[m] = g.W[si] + (size_t)(mt0 + m) * KB * 32 + lane;
        Sp[m] = (const uint32_t *)g.S[si] + (size_t)(mt0 + m) * ngr * 16 + gq;
    }
    /* the weight stream: a per-warp ring of GI_S 64-column blocks (and
     * their scale pairs) filled by cp.async, GI_S - 1 blocks ahead; every
     * lane reads back only what it copied itself */
    extern __shared__ uint4 ring_[];
    uint4 *wr = ring_ + (size_t)warp * GI_S * MB * 32;
    uint32_t *srg = (uint32_t *)(ring_ + (size_t)8 * GI_S * MB * 32) + (size_t)warp * GI_S * MB * SPK * 2 * 32;
    auto issue = [&](int kb) {
        const int slot = (kb - kb_beg) % GI_S;
#pragma unroll
        for (int m = 0; m < MB; m++)
            if (mv[m]) {
                cp16_cg(wr + (slot * MB + m) * 32 + lane, Wp[m] + kb * 32);
#pragma unroll
                for (int kt = 0; kt < SPK; kt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        __pipeline_memcpy_async(srg + (((slot * MB + m) * SPK + kt) * 2 + h) * 32 + lane,
                                                Sp[m] + ((kb * 2 + kt) / GS) * 16 + 8 * h, 4);
            }
    };
#pragma unroll
    for (int st = 0; st < GI_S - 1; st++) {
        if (kb_beg + st < kb_end)
            issue(kb_beg + st);
        __pipeline_commit();
    }

    pdl_wait(); /* x's digits come from the kernel before */

    /* per column of this lane: the token, live or not, digit 0 or not */
    const float *escp[NT][2], *xsbp[NT][2];
    bool live[NT][2], d0[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int p = 8 * j + 2 * tq + c, tok = p / 3;
            live[j][c] = p < P;
            d0[j][c] = p < P && p % 3 == 0;
            escp[j][c] = xd.esc + (size_t)(live[j][c] ? tok : 0) * ngr;
            xsbp[j][c] = xd.xsb + (size_t)(live[j][c] ? tok : 0) * ngr;
        }
    const uint32_t *bp[NT];
    bool bl[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        bl[j] = 8 * j + gq < P;
        bp[j] = (const uint32_t *)(xd.planes + (size_t)(bl[j] ? 8 * j + gq : 0) * cols) + tq;
    }

    float acc[MB][NT][4];
    int C[MB][NT][4];
#pragma unroll
    for (int m = 0; m < MB; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[m][j][i] = 0.f;
                C[m][j][i] = 0;
            }
    /* scale the integer partials into acc; the bias term at the group's end */
    auto flush = [&](int m, uint32_t e0, uint32_t e1, int grp, bool gend) {
        const float2 s0 = sb_pair(make_uint2(e0, 0u), sf), s1 = sb_pair(make_uint2(e1, 0u), sf);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float es = live[j][c] ? __ldg(escp[j][c] + grp) : 0.f;
                const float xb = d0[j][c] && gend ? __ldg(xsbp[j][c] + grp) : 0.f;
#pragma unroll
                for (int h = 0; h < 2; h++)
                    gi_scale(acc[m][j][2 * h + c], C[m][j][2 * h + c], h == 0 ? s0 : s1, es, xb);
            }
    };
    for (int kb = kb_beg; kb < kb_end; kb++) {
        if (kb + GI_S - 1 < kb_end)
            issue(kb + GI_S - 1);
        __pipeline_commit();
        __pipeline_wait_prior(GI_S - 1);
        const int slot = (kb - kb_beg) % GI_S;
        uint32_t b0[NT][2], b1[NT][2];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int kt = 0; kt < 2; kt++) {
                const uint32_t *r = bp[j] + (kb * 64 + 32 * kt) / 4;
                b0[j][kt] = bl[j] ? __ldg(r) : 0u;
                b1[j][kt] = bl[j] ? __ldg(r + 4) : 0u;
            }
#pragma unroll
        for (int m = 0; m < MB; m++) {
            const uint4 w = wr[(slot * MB + m) * 32 + lane];
            const uint32_t *sq = srg + (slot * MB + m) * SPK * 2 * 32 + lane;
            uint32_t a0[4], a1[4];
            unpack_a(w, a0, a1);
            if (GS == 1) {
                /* a group per k-tile */
#pragma unroll
                for (int j = 0; j < NT; j++)
                    imma_u8s8(C[m][j], a0, b0[j][0], b1[j][0]);
                flush(m, sq[0], sq[32], kb * 2, true);
#pragma unroll
                for (int j = 0; j < NT; j++)
                    imma_u8s8(C[m][j], a1, b0[j][1], b1[j][1]);
                flush(m, sq[(SPK - 1) * 64], sq[(SPK - 1) * 64 + 32], kb * 2 + 1, true);
            } else {
                /* both k-tiles of the block in one group: two independent
                 * integer chains, added exactly */
                int D[NT][4];
#pragma unroll
                for (int j = 0; j < NT; j++) {
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        D[j][i] = 0;
                    imma_u8s8(C[m][j], a0, b0[j][0], b1[j][0]);
                    imma_u8s8(D[j], a1, b0[j][1], b1[j][1]);
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        C[m][j][i] += D[j][i];
                }
                const bool gend = KPG == 1 || (kb & 1) == 1;
                if (gend || kb == kb_end - 1)
                    flush(m, sq[0], sq[32], kb / KPG, gend);
            }
        }
    }

    /* ---- combine: planes -> tokens, then the warps in order ---- */
    constexpr int NP = 8 * NT;
#pragma unroll
    for (int m = 0; m < MB; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = gq + 8 * (i >> 1), p = 8 * j + 2 * tq + (i & 1);
                red[((warp * MB + m) * 16 + row) * NP + p] = acc[m][j][i];
            }
    __syncthreads();
    const int64_t rows = g.rows[si];
    for (int o = threadIdx.x; o < MB * 16 * T; o += blockDim.x) {
        const int m = o / (16 * T), rem = o % (16 * T), row = rem / T, t = rem % T;
        float v = 0.f;
        for (int w = 0; w < 8; w++) {
            const float *b = red + ((w * MB + m) * 16 + row) * NP + 3 * t;
            const float vw = gi_planes(b[0], b[1], b[2]);
            v = w == 0 ? vw : v + vw;
        }
        const int64_t r = 16 * (mt0 + m) + row;
        if (r < rows && mt0 + m < g.mt[si])
            gi_put(g, si, r, t, v);
    }
}

/* ---- the integer GEMV, stream-K form (default) ------------------------- */
/*
 * Same arithmetic per unit as k_gemv_i8 (exact int32 MMAs per quant group,
 * fp32 scaling per group and digit plane), a different division of the work:
 * the repacked weights of all segments are one stream of units (one uint4
 * per lane: 16 rows x 64 columns, 512 bytes), and warp w of a grid of NW
 * warps takes units [W*w/NW, W*(w+1)/NW): every warp streams the same number
 * of contiguous bytes, so there is no wave tail. Each warp's stream comes in
 * through a ring of GK_S stages of GK_SU units in shared memory, filled by
 * bulk asynchronous copies (cp.async.bulk, one instruction per stage for the
 * weights and one for their (scale, bias) pairs, which are contiguous too)
 * that complete on a per-stage mbarrier; the first GK_S stages are issued
 * before pdl_wait. A row tile whose units one warp covers is written by that
 * warp; a tile cut between warps leaves one partial per warp in part[], and
 * the warp that brings the tile's count to its number of pieces adds them in
 * warp order. NW depends on the shape and the device only (never on T), so
 * the order of every fp32 sum is fixed: results are deterministic and a
 * token's bits do not depend on T. x's digits come in the permuted word
 * order (k_x_digits with perm), one 16-byte load per lane and n-tile. */

constexpr int GK_BPS = 2;         /* resident blocks of 8 warps per SM at most (registers, shared memory) */
constexpr int GK_MINU = 16;       /* fewest units per warp (fewer pieces per tile of a small matrix) */
constexpr int GK_SLOT = 16 * 24;  /* floats of one partial: 16 rows x up to 24 digit planes */
constexpr int GK_TILES = 1 << 20; /* row tiles of one launch (counters) */
/* 6 units a stage in 2 stages (the same 12 units and shared memory as 4 x 3):
 * a third less of the per-stage bookkeeping per unit; s19r2 measured the
 * 27B's down 25.2 -> 23.9 us, lm_head 200.5 -> 189.7 alone */
constexpr int GK_SU = 6;          /* units per stage */
constexpr int GK_S = 2;           /* stages per warp */
constexpr int GK_SBW = (2 * GK_SU + 1) * 16; /* (scale, bias) words per stage, at most (group 32) */
constexpr int GK_XREC = gi_rec_bytes(2, 2); /* the largest x record staged (T <= 2) */
constexpr int GK_XOFF = GK_SU * 512 + GK_SBW * 4;
constexpr int GK_STAGE = GK_XOFF + GK_SU * GK_XREC;

/* the stage stride: x records staged (T <= 2) or not */
__host__ __device__ constexpr int gk_stage_bytes(bool xs) { return xs ? GK_STAGE : GK_XOFF; }
__host__ __device__ constexpr size_t gk_smem_bytes(bool xs) { return (size_t)8 * GK_S * (gk_stage_bytes(xs) + 8); }

__device__ __forceinline__ void mbar_init(uint64_t *b, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}

/* expect bytes on the barrier's current phase without arriving */
__device__ __forceinline__ void mbar_expect_only(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_expect(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t phase)
{
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok)
                     : "r"(smem_u32(b)), "r"(phase)
                     : "memory");
}

/* A tile's arrival count: an add with release and acquire semantics at gpu
 * scope, returning the old value. The warp barrier before it brings the
 * other lanes' pieces into lane 0's release, and one after it carries the
 * acquire to them, so neither side needs __threadfence (a fence.sc; ncu put
 * 7-9 % of this kernel's warp samples on its two, s25r1; 27B decode 8.20-
 * 8.24 against 8.26-8.27 ms without them, s25r2). The same in
 * k_gdn_after_conv measured slower (35B-A3B 2.550-2.555 against 2.536-2.541). */
__device__ __forceinline__ int gk_arrive(int *count)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
    return old;
}

/* Each segment is split over its own warps exactly as it would be alone,
 * so a matrix gives the same bits grouped (inside a graph) or not: segment
 * s has units [u0, u0 + W) and warps [wb, wb + NW). */
struct gk_split {
    int64_t u0, W, wb, NW;
    __host__ __device__ __forceinline__ int64_t first(int64_t w) const { return u0 + W * (w - wb) / NW; }
    /* the warp whose units include unit u */
    __host__ __device__ __forceinline__ int64_t warp_of(int64_t u) const { return wb + ((u - u0 + 1) * NW - 1) / W; }
};

/* The stream-K GEMV's integer partials start at this bit pattern, the float
 * 1.5 * 2^23: an exact int32 sum C with |C| < 2^22 leaves the bits of the
 * float 12582912 + C, so one FADD gives float(C) exactly (the conversion
 * pipe's I2F is a fraction of the FADD rate). |C| <= 128 * 15 * 128 here. */
constexpr int GK_MAGIC = 0x4B400000;
__device__ __forceinline__ float gk_int_value(int c) { return __int_as_float(c) - 12582912.f; }

/* unpack_a without the high nibbles' shift: row g + 8's u8 values are 16q
 * (0..240, still u8), so its partials are 16x, which flush takes out of the
 * scale (a power of two: exact). |16 C| <= 128 * 240 * 128 < 2^22 still. */
__device__ __forceinline__ void gk_unpack_a(const uint4 &w, uint32_t (&a0)[4], uint32_t (&a1)[4])
{
    a0[0] = w.x & 0x0F0F0F0Fu;
    a0[1] = w.x & 0xF0F0F0F0u;
    a0[2] = w.y & 0x0F0F0F0Fu;
    a0[3] = w.y & 0xF0F0F0F0u;
    a1[0] = w.z & 0x0F0F0F0Fu;
    a1[1] = w.z & 0xF0F0F0F0u;
    a1[2] = w.w & 0x0F0F0F0Fu;
    a1[3] = w.w & 0xF0F0F0F0u;
}

/* The pool form (DV; one token, tune gemv_sk_vw > 1): the split has vw
 * virtual warps a resident one; each resident warp runs virtual warp p (its
 * own), then takes others from the pool until none is left, so an SM that
 * streams slower runs fewer of them (s34r1, H100: the
 * 27B's 128 stream-K launches a step end 5.5 us after their first block
 * does, the same SMs late each time). A virtual warp's units, partials and
 * place in its tiles' sums do not depend on which warp runs it, so the bits
 * are those of the fixed walk of the same split (gemv_sk_dv=0). The take is
 * the producer's, at its first issue after a virtual warp's last stage and
 * never before pdl_wait (the counter the last launch zeroed is visible only
 * then): a take due in the prologue holds the rest of its stages until
 * after the wait. The virtual warps taken reach the consumer through a
 * per-warp queue, the producer being at most GK_S stages (virtual warps)
 * ahead.
 * The pool is GK_SLICES slices, each with its own counter at
 * cnt[GK_TILES + i]: a warp takes from its block's slice first, then from
 * the others, skipping a slice whose counter a plain load shows spent. One
 * counter for every warp lost 15 % of the 27B step at vw 2 (s35r1): the
 * warps' equal first virtual warps end together, and 2112 takes on one
 * address queue at L2 (then as many failed ones, then as many counts).
 * Here a slice sees a block in GK_SLICES at once, and a block's last warp
 * to find the pool spent counts for the block (cnt[GK_TILES + GK_SLICES]);
 * the grid's last block zeroes the counters for the next launch. */
constexpr int GK_VQ = 4; /* the queue: more than GK_S + 1 virtual warps */
constexpr int GK_SLICES = 8;
constexpr int GK_POOL_INTS = GK_SLICES + 1; /* after the tile counts */

/* TC: T at compile time (1 or 2, for NT == 1), or 0: the x records' offsets
 * then fold into the shared-memory loads' immediates */
template <int GS, int NT, int SF, int TC, bool DV = false>
__global__ void __launch_bounds__(256, GK_BPS)
k_gemv_sk(gi_seg g, int64_t cols, gi_x xd, int T_, int rec_, float *__restrict__ part, int *__restrict__ cnt)
{
    static_assert(!DV || TC == 1, "the pool form is for one token");
    const int T = TC ? TC : T_;
    const int rec = TC ? gi_rec_bytes(TC, GS == 1 ? 2 : 1) : rec_;
    pdl_launch();
    constexpr int NP = 8 * NT;
    /* T <= 2: the stage's x records come into shared memory with its weights */
    constexpr bool XS = NT == 1;
    constexpr int STG = gk_stage_bytes(XS);
    constexpr int SPK = GS == 1 ? 2 : 1; /* groups per unit */
    __shared__ float red[8][16 * NP];
    extern __shared__ __align__(128) unsigned char gk_ring[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    /* this warp walks the virtual warps v = p, p + NWP, ... of the split */
    const int64_t p0 = (int64_t)blockIdx.x * 8 + warp, NWP = (int64_t)gridDim.x * 8, NV = g.wb[g.n];
    const int KB = (int)(cols / 64), P = 3 * T;
    auto split_of = [&](int s) {
        return gk_split{ g.u0[s], g.u0[s + 1] - g.u0[s], g.wb[s], g.wb[s + 1] - g.wb[s] };
    };

    unsigned char *ring = gk_ring + (size_t)warp * GK_S * STG;
    uint64_t *bar = (uint64_t *)(gk_ring + (size_t)8 * GK_S * STG) + warp * GK_S;

    /* A stage: up to GK_SU units of one row tile of one virtual warp's
     * range. The producer and the consumer walk the same sequence with
     * their own cursors. */
    struct cursor {
        int s, mt, kb;
        int64_t v, ua, ub, u; /* virtual warp, its units [ua, ub), the next unit */
        int n;                /* units of the stage at this cursor */
    };
    /* c's segment and units from c.v; whether it has any */
    auto locate = [&](cursor &c) {
        c.s = 0;
        while (c.s + 1 < g.n && c.v >= g.wb[c.s + 1])
            c.s++;
        const gk_split sp = split_of(c.s);
        c.ua = sp.first(c.v);
        c.ub = sp.first(c.v + 1);
        return c.ua < c.ub;
    };
    __shared__ int vq[DV ? 8 : 1][GK_VQ];
    __shared__ int vdone; /* DV: the block's warps done taking */
    if constexpr (DV) {
        if (threadIdx.x == 0)
            vdone = 0;
        __syncthreads();
    }
    int qin = 0, qout = 0; /* virtual warps taken by the producer, and popped by the consumer */
    /* c's first unit, tile and k-block, once c.v (< NV) is located */
    auto begin = [&](cursor &c) {
        c.u = c.ua;
        c.mt = (int)((c.ua - g.u0[c.s]) / KB);
        c.kb = (int)((c.ua - g.u0[c.s]) % KB);
    };
    /* DV: the producer's take, due at its next issue (c.v == -1): the next
     * virtual warp from the pool, handed to the consumer; none left (c.v =
     * NV): this warp's count towards the pair's reset */
    auto take = [&](cursor &c) {
        int64_t v = NV;
        if (lane == 0) {
            const int64_t P = NV - NWP;
            for (int j = 0; j < GK_SLICES && v == NV; j++) {
                const int i = (int)((blockIdx.x + j) % GK_SLICES);
                const int64_t s0 = P * i / GK_SLICES, n = P * (i + 1) / GK_SLICES - s0;
                int *ci = cnt + GK_TILES + i;
                if (__ldcg(ci) >= n) /* spent (the count only grows until the reset) */
                    continue;
                const int id = atomicAdd(ci, 1);
                if (id < n)
                    v = NWP + s0 + id;
            }
        }
        c.v = __shfl_sync(0xffffffffu, v, 0);
        if (c.v < NV) {
            vq[warp][qin++ % GK_VQ] = (int)c.v; /* every lane: each reads its own */
            locate(c); /* (gk_plan: every virtual warp has units) */
            begin(c);
        } else if (lane == 0) {
            /* this warp takes no more; the block's last such warp counts
             * the block, and the grid's last block zeroes the pool */
            __threadfence();
            if (atomicAdd_block(&vdone, 1) == (int)(blockDim.x >> 5) - 1 &&
                atomicAdd(cnt + GK_TILES + GK_SLICES, 1) == (int)gridDim.x - 1)
                for (int i = 0; i < GK_POOL_INTS; i++)
                    atomicExch(cnt + GK_TILES + i, 0);
        }
    };
    /* move c to the next virtual warp with units (c.v >= NV: none left):
     * the fixed walk, or (DV) the producer's take made due / the
     * consumer's pop */
    auto range = [&](cursor &c, bool prod) {
        if constexpr (DV) {
            if (prod) {
                c.v = -1; /* taken at the next issue: never before pdl_wait */
                return;
            }
            c.v = qout < qin ? vq[warp][qout++ % GK_VQ] : NV;
            if (c.v < NV) {
                locate(c);
                begin(c);
            }
        } else {
            for (c.v += NWP; c.v < NV; c.v += NWP)
                if (locate(c))
                    break;
            if (c.v < NV)
                begin(c);
        }
    };
    auto start = [&](cursor &c) {
        if constexpr (DV) {
            /* p0 < NV for every warp (gk_plan's pool: NV > NWP) */
            c.v = p0;
            locate(c);
            begin(c);
        } else {
            c.v = p0 - NWP;
            range(c, false);
        }
    };
    auto size = [&](cursor &c) {
        int n = GK_SU;
        if (KB - c.kb < n)
            n = KB - c.kb;
        if (c.ub - c.u < n)
            n = (int)(c.ub - c.u);
        c.n = n;
    };
    auto next = [&](cursor &c, bool prod) {
        c.u += c.n;
        c.kb += c.n;
        if (c.kb == KB) {
            c.kb = 0;
            c.mt++;
        }
        if (c.u == c.ub)
            range(c, prod);
    };
    cursor pc;
    start(pc);
    /* weights and pairs of the stage at pc into slot k; the x records go
     * with them (xnow) or, for the stages issued before pdl_wait, after it */
    int xkb[GK_S], xn[GK_S];
    auto issue = [&](int k, bool xnow) {
        if constexpr (DV)
            if (pc.v < 0)
                take(pc);
        if (pc.v >= NV)
            return;
        size(pc);
        if (lane == 0) {
            const int64_t lu0 = (int64_t)pc.mt * KB + pc.kb;
            const int64_t gf = GS == 4 ? lu0 / 2 : lu0 * SPK, gl = GS == 4 ? (lu0 + pc.n - 1) / 2 : (lu0 + pc.n) * SPK - 1;
            unsigned char *d = ring + (size_t)k * STG;
            const uint32_t bw = (uint32_t)pc.n * 512u, bs = (uint32_t)(gl - gf + 1) * 64u;
            const uint32_t bx = XS && xnow ? (uint32_t)(pc.n * rec) : 0u;
            if (xnow)
                mbar_expect(bar + k, bw + bs + bx);
            else
                mbar_expect_only(bar + k, bw + bs);
            bulk_g2s(d, g.W[pc.s] + (size_t)lu0 * 32, bw, bar + k);
            bulk_g2s(d + GK_SU * 512, (const uint32_t *)g.S[pc.s] + (size_t)gf * 16, bs, bar + k);
            if (bx)
                bulk_g2s(d + GK_XOFF, (const char *)xd.planes + (size_t)pc.kb * rec, bx, bar + k);
        }
        if (!xnow) {
            xkb[k] = pc.kb;
            xn[k] = pc.n;
        }
        next(pc, true);
    };
    if (lane == 0) {
        for (int k = 0; k < GK_S; k++)
            mbar_init(bar + k, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    int pro = 0; /* stages issued before pdl_wait */
#pragma unroll
    for (int k = 0; k < GK_S; k++) {
        if (DV && pc.v < 0) /* a take is due: after pdl_wait */
            break;
        const bool any = pc.v < NV;
        issue(k, false);
        pro += any;
    }

    pdl_wait(); /* x's digits come from the kernel before */
    if (lane == 0)
        for (int k = 0; k < pro; k++) {
            const uint32_t bx = XS ? (uint32_t)(xn[k] * rec) : 0u;
            mbar_expect(bar + k, bx);
            if (bx)
                bulk_g2s(ring + (size_t)k * STG + GK_XOFF, (const char *)xd.planes + (size_t)xkb[k] * rec, bx,
                         bar + k);
        }
    if constexpr (DV)
        for (int k = pro; k < GK_S; k++)
            issue(k, true); /* the stages a due take held back */
    /* this lane's pieces of an x record: its B words per n-tile, and per
     * column the offset of the token's esc (xsb follows SPK * T floats on) */
    int boff[NT], eoff[NT][2];
    bool bl[NT], live[NT][2], d0[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        bl[j] = 8 * j + gq < P;
        boff[j] = (bl[j] ? 8 * j + gq : 0) * 64 + tq * 16;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int p = 8 * j + 2 * tq + c;
            live[j][c] = p < P;
            d0[j][c] = p < P && p % 3 == 0;
            eoff[j][c] = 3 * T * 64 + (live[j][c] ? p / 3 : 0) * 4;
        }
    }
    const int xbo = SPK * T * 4;

    float acc[NT][4];
    int C[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[j][i] = 0.f;
            C[j][i] = GK_MAGIC;
        }
    /* scale the integer partials into acc (r: the x record, k: the group's
     * slot): gi_scale's arithmetic, the value from the magic start */
    auto flush = [&](uint32_t e0, uint32_t e1, const char *r, int k, bool gend) {
        const float2 s0 = sb_pair(make_uint2(e0, 0u), SF);
        float2 s1 = sb_pair(make_uint2(e1, 0u), SF);
        s1.x *= 0.0625f; /* row g + 8's partials are 16x (gk_unpack_a); exact */
        if constexpr (TC == 1) {
            /* one token: every live column is its plane, the bias rides on
             * column 0 only (lane tq 0), and the dead columns (p >= 3) are
             * never read, so they need no zeros */
            const float *ep = (const float *)(r + 3 * 64) + k;
            const float es = *ep, xb = tq == 0 && gend ? ep[SPK] : 0.f;
            const float x0 = s0.x * es, x1 = s1.x * es;
#pragma unroll
            for (int c = 0; c < 2; c++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float &a = acc[0][2 * h + c];
                    int &ci = C[0][2 * h + c];
                    a = fmaf(h == 0 ? x0 : x1, gk_int_value(ci), a);
                    if (c == 0)
                        a = fmaf(h == 0 ? s0.y : s1.y, xb, a);
                    ci = GK_MAGIC;
                }
        } else {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float *ep = (const float *)(r + eoff[j][c]) + k * T;
                    const float *xp = (const float *)((const char *)ep + xbo);
                    const float es = live[j][c] ? (XS ? *ep : __ldg(ep)) : 0.f;
                    const float xb = d0[j][c] && gend ? (XS ? *xp : __ldg(xp)) : 0.f;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float2 sr = h == 0 ? s0 : s1;
                        float &a = acc[j][2 * h + c];
                        int &ci = C[j][2 * h + c];
                        a = fmaf(sr.x * es, gk_int_value(ci), a);
                        a = fmaf(sr.y, xb, a);
                        ci = GK_MAGIC;
                    }
                }
        }
    };
    auto put = [&](int s, int mt, int row, int t, float v, float av) {
        const int64_t r = 16 * (int64_t)mt + row;
        if (r < g.rows[s])
            gi_put_pre(g, s, r, t, v, av);
    };
    constexpr int GK_PUT = 4; /* a lane's outputs of a tile: 16 T / 32 at T <= 8 */
    static_assert(16 * GI_TMAX <= 32 * GK_PUT, "a tile's outputs per lane");
    /* a row tile ends in this virtual warp: write it, or leave a partial */
    auto emit = [&](const cursor &c) {
        const int s = c.s, mt = c.mt;
        const int64_t ua = c.ua, ub = c.ub, wid = c.v;
        const gk_split sp = split_of(s);
        const int64_t ts = g.u0[s] + (int64_t)mt * KB, te = ts + KB;
        if (ts >= ua && te <= ub) {
            float av[GK_PUT]; /* gi_add_at, ahead of the warp's combine */
#pragma unroll
            for (int k = 0; k < GK_PUT; k++) {
                const int o = lane + 32 * k;
                av[k] = o < 16 * T ? gi_add_at(g, s, 16 * (int64_t)mt + o / T, o % T) : 0.f;
            }
            float *r = red[warp];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    r[(gq + 8 * (i >> 1)) * NP + 8 * j + 2 * tq + (i & 1)] = acc[j][i];
            __syncwarp();
#pragma unroll
            for (int k = 0; k < GK_PUT; k++) {
                const int o = lane + 32 * k;
                if (o < 16 * T) {
                    const int row = o / T, t = o % T;
                    const float *b = r + row * NP + 3 * t;
                    put(s, mt, row, t, gi_planes(b[0], b[1], b[2]), av[k]);
                }
            }
            __syncwarp();
            return;
        }
        float *dst = part + ((size_t)wid * 2 + (ua >= ts ? 0 : 1)) * GK_SLOT;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                dst[(gq + 8 * (i >> 1)) * 24 + 8 * j + 2 * tq + (i & 1)] = acc[j][i];
        __syncwarp(); /* the lanes' pieces into lane 0's release */
        const int64_t wf = sp.warp_of(ts), wl = sp.warp_of(te - 1);
        const int tile = g.t0[s] + mt;
        int last = 0;
        if (lane == 0)
            last = gk_arrive(cnt + tile) == (int)(wl - wf);
        if (!__shfl_sync(0xffffffffu, last, 0))
            return;
        __syncwarp(); /* lane 0's acquire before every lane's reads of the pieces */
        /* a piece's slot: 1 only for the first warp, when it began before
         * the tile (every later warp of the tile begins inside it, so its
         * piece is its first tile's): one division, not one per piece */
        const int slot_f = sp.first(wf) >= ts ? 0 : 1;
        for (int o = lane; o < 16 * T; o += 32) {
            const int row = o / T, t = o % T;
            const float av = gi_add_at(g, s, 16 * (int64_t)mt + row, t); /* beside the pieces' loads */
            float p0 = 0.f, p1 = 0.f, p2 = 0.f;
            /* the pieces in warp order, loaded 8 at a time so their
             * latencies overlap (a small matrix has many pieces per tile) */
            for (int64_t w0 = wf; w0 <= wl; w0 += 8) {
                float v[8][3];
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    const int64_t w2 = w0 + q;
                    if (w2 <= wl) {
                        const float *src = part + ((size_t)w2 * 2 + (w2 == wf ? slot_f : 0)) * GK_SLOT + row * 24 + 3 * t;
                        v[q][0] = __ldcg(src);
                        v[q][1] = __ldcg(src + 1);
                        v[q][2] = __ldcg(src + 2);
                    }
                }
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (w0 + q <= wl) {
                        p0 = w0 + q == wf ? v[q][0] : p0 + v[q][0];
                        p1 = w0 + q == wf ? v[q][1] : p1 + v[q][1];
                        p2 = w0 + q == wf ? v[q][2] : p2 + v[q][2];
                    }
            }
            put(s, mt, row, t, gi_planes(p0, p1, p2), av);
        }
        if (lane == 0)
            cnt[tile] = 0; /* ready for the next launch */
    };

    cursor cc;
    start(cc);
    for (int c = 0; cc.v < NV; c++) {
        const int k = c % GK_S;
        size(cc);
        mbar_wait(bar + k, (uint32_t)(c / GK_S) & 1u);
        const uint4 *ws = (const uint4 *)(ring + (size_t)k * STG) + lane;
        const uint32_t *ss = (const uint32_t *)(ring + (size_t)k * STG + GK_SU * 512) + gq;
        const char *xr = XS ? (const char *)(ring + (size_t)k * STG + GK_XOFF)
                            : (const char *)xd.planes + (size_t)cc.kb * rec;
        const int odd = GS == 4 ? (cc.kb & 1) : 0; /* group 128: the stage may start mid-group */
        auto unit = [&](int i) {
            const uint4 w = ws[i * 32];
            const char *r = xr + i * rec;
            uint4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint4 *bq = (const uint4 *)(r + boff[j]);
                /* one token: the dead columns' lanes read plane 0 (boff), whose
                 * products land in columns never read */
                b[j] = TC == 1 ? *bq : bl[j] ? (XS ? *bq : __ldg(bq)) : make_uint4(0u, 0u, 0u, 0u);
            }
            uint32_t a0[4], a1[4];
            gk_unpack_a(w, a0, a1);
            if (GS == 1) {
                /* a group per k-tile */
#pragma unroll
                for (int j = 0; j < NT; j++)
                    imma_u8s8(C[j], a0, b[j].x, b[j].y);
                flush(ss[i * 32], ss[i * 32 + 8], r, 0, true);
#pragma unroll
                for (int j = 0; j < NT; j++)
                    imma_u8s8(C[j], a1, b[j].z, b[j].w);
                flush(ss[i * 32 + 16], ss[i * 32 + 24], r, 1, true);
            } else {
                /* both k-tiles in one group: one exact integer chain */
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    imma_u8s8(C[j], a0, b[j].x, b[j].y);
                    imma_u8s8(C[j], a1, b[j].z, b[j].w);
                }
                if (GS == 2) {
                    flush(ss[i * 16], ss[i * 16 + 8], r, 0, true);
                } else {
                    /* the group ends at an odd block; a warp's range may end mid-group */
                    const int gi = (i + odd) >> 1;
                    const bool gend = ((i + odd) & 1) == 1;
                    if (gend || cc.u + i + 1 == cc.ub)
                        flush(ss[gi * 16], ss[gi * 16 + 8], r, 0, gend);
                }
            }
        };
        if (NT == 1 && cc.n == GK_SU) {
            /* a full stage, straight-line: the units' loads and MMAs can
             * run ahead of the earlier units' scaling (for one n-tile: with
             * more, the registers would spill) */
#pragma unroll
            for (int i = 0; i < GK_SU; i++)
                unit(i);
        } else {
#pragma unroll
            for (int i = 0; i < GK_SU; i++) {
                if (i >= cc.n)
                    break;
                unit(i);
            }
        }
        __syncwarp(); /* every lane is done with stage k: refill it */
        issue(k, true);
        if (cc.kb + cc.n == KB || cc.u + cc.n == cc.ub) {
            emit(cc);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    acc[j][q] = 0.f;
        }
        next(cc, false);
    }
}

template <int GS, int NT>
sn_status gi_launch_nt(const cu_devinfo *di, cudaStream_t s, const gi_seg &g, const cu_weight *w0, gi_x xd, int T,
                       int MB)
{
    unsigned grid = (unsigned)g.b0[g.n];
    const size_t smem = gi_ring_bytes(MB, GS == 1 ? 2 : 1);
    if (MB == 2)
        (void)cu_launch_w(w0->bits, cu_seg_weight_bytes(g, w0), k_gemv_i8<GS, NT, 2>, dim3(grid), dim3(256), smem, s, g, w0->sfmt, (int64_t)w0->cols,
                        (int64_t)w0->groups, xd, T);
    else
        (void)cu_launch_w(w0->bits, cu_seg_weight_bytes(g, w0), k_gemv_i8<GS, NT, 1>, dim3(grid), dim3(256), smem, s, g, w0->sfmt, (int64_t)w0->cols,
                        (int64_t)w0->groups, xd, T);
    CU_CHECK_LAUNCH("matmul gemv i8");
    return SN_OK;
}

long gk_pool_n; /* pool-form launches (sn_cuda_gemv_pool), host side */

template <int GS, int NT, int TC>
sn_status gk_launch_nt(const cu_devinfo *di, cudaStream_t s, const gi_seg &g, const cu_weight *w0, gi_x xd, int T,
                       unsigned grid, bool pool)
{
    const int rec = gi_rec_bytes(T, GS == 1 ? 2 : 1);
    const size_t smem = gk_smem_bytes(NT == 1);
    const int64_t cols = (int64_t)w0->cols;
    const bool bf16 = w0->sfmt == CS_BF16;
    auto kern = bf16 ? k_gemv_sk<GS, NT, CS_BF16, TC> : k_gemv_sk<GS, NT, CS_F16, TC>;
    if constexpr (TC == 1)
        if (pool && di->gemv_sk_dv) {
            __atomic_fetch_add(&gk_pool_n, 1, __ATOMIC_RELAXED);
            kern = bf16 ? k_gemv_sk<GS, NT, CS_BF16, TC, true> : k_gemv_sk<GS, NT, CS_F16, TC, true>;
        }
    (void)cu_launch_w(w0->bits, cu_seg_weight_bytes(g, w0), kern, dim3(grid), dim3(256), smem, s, g, cols, xd, T, rec,
                      di->gk_part, di->gk_cnt);
    CU_CHECK_LAUNCH("matmul gemv i8 stream-K");
    return SN_OK;
}

/* blocks per SM the split assumes (tune gemv_sk_bps): fewer leave room for
 * the next kernel's blocks to start while this one runs */
int gk_bps(const cu_devinfo *di)
{
    return di->gemv_sk_bps >= 1 && di->gemv_sk_bps <= GK_BPS ? di->gemv_sk_bps : GK_BPS;
}

/* The stream-K split of g (sets u0/t0) with vw virtual warps a resident
 * one (gemv_sk_vw; 1: one each): the grid, or 0 when the kernel cannot take
 * it (too many row tiles for the counters, or virtual warps for the
 * partials). A virtual warp has GK_MINU / vw units or more, or gemv_sk_minu
 * when that is set (the split's own cost at vw > 1, run 45). *pool (may be
 * NULL): whether the split suits the pool form: vw > 1 and more virtual
 * warps than resident ones. */
unsigned gk_plan(const cu_devinfo *di, gi_seg &g, int64_t KB, int vw, bool *pool)
{
    g.u0[0] = 0;
    g.t0[0] = 0;
    g.wb[0] = 0;
    const int bps = gk_bps(di);
    for (int i = 0; i < g.n; i++) {
        const int64_t W = g.mt[i] * KB;
        g.u0[i + 1] = g.u0[i] + W;
        g.t0[i + 1] = g.t0[i] + (int)g.mt[i];
        /* the segment's warps as if it were launched alone */
        int64_t nw = (int64_t)di->n_sm * bps * 8 * vw;
        const int64_t cap = di->gemv_sk_minu > 0 ? W / di->gemv_sk_minu : W * vw / GK_MINU;
        if (nw > cap)
            nw = cap;
        nw = nw < 8 ? 8 : nw / 8 * 8;
        /* never more warps than units: an empty warp inside a row tile's
         * span would leave the tile one piece short, never written (a
         * 16 x 256 matrix, 4 units over 8 warps, did that) */
        if (nw > W)
            nw = W;
        g.wb[i + 1] = g.wb[i] + (int)nw;
    }
    if (!di->gk_part || g.t0[g.n] > GK_TILES || g.wb[g.n] > di->gk_warps || g.u0[g.n] < 1)
        return 0;
    /* resident warps walk the virtual ones (a group of big matrices has
     * more than one wave of them) */
    int64_t blocks = (g.wb[g.n] + 7) / 8;
    if (blocks > (int64_t)di->n_sm * bps)
        blocks = (int64_t)di->n_sm * bps;
    if (pool)
        *pool = vw > 1 && g.wb[g.n] > blocks * 8;
    return (unsigned)blocks;
}

template <int GS>
sn_status gi_launch(const cu_devinfo *di, cudaStream_t s, gi_seg &g, const cu_weight *w0, const float *x,
                    int T, int MB, const cu_gemv_norm *norm, void *scratch)
{
    gi_x xd = gi_x_at(scratch, w0->cols, w0->groups, T);
    /* virtual warps (gemv_sk_vw) at one token only; a split that does not
     * fit the partials at vw falls back to one virtual warp a warp */
    const int vw = T == 1 && di->gemv_sk_vw > 1 ? di->gemv_sk_vw : 1;
    bool pool = false;
    unsigned gk = di->gemv_sk ? gk_plan(di, g, w0->cols / 64, vw, &pool) : 0;
    if (!gk && di->gemv_sk && vw > 1)
        gk = gk_plan(di, g, w0->cols / 64, 1, &pool); /* (pool false at vw 1) */
    dim3 qg((unsigned)((w0->cols + 1023) / 1024), (unsigned)T);
    (void)cu_launch_small(PDL_X_DIGITS, k_x_digits<GS>, qg, dim3(256), 0, s, x, (int64_t)w0->cols, (int64_t)w0->groups,
                    norm ? norm->w : (const float *)NULL, norm ? norm->eps : 0.f, norm ? norm->threads : 0,
                    norm ? norm->xn : (float *)NULL, norm ? norm->su : (const float *)NULL,
                    norm ? norm->gz : (const float *)NULL, xd, T,
                    gk ? gi_rec_bytes(T, GS == 1 ? 2 : 1) : 0);
    CU_CHECK_LAUNCH("matmul gemv digits");
    if (gk) {
        if (T == 1)
            return gk_launch_nt<GS, 1, 1>(di, s, g, w0, xd, T, gk, pool);
        if (T == 2)
            return gk_launch_nt<GS, 1, 2>(di, s, g, w0, xd, T, gk, false);
        if (T <= 5)
            return gk_launch_nt<GS, 2, 0>(di, s, g, w0, xd, T, gk, false);
        return gk_launch_nt<GS, 3, 0>(di, s, g, w0, xd, T, gk, false);
    }
    if (T <= 2)
        return gi_launch_nt<GS, 1>(di, s, g, w0, xd, T, MB);
    if (T <= 5)
        return gi_launch_nt<GS, 2>(di, s, g, w0, xd, T, MB);
    return gi_launch_nt<GS, 3>(di, s, g, w0, xd, T, MB);
}

} // namespace

/* Whether a decode launch of qbytes of 4-bit weights over cols columns
 * takes the integer GEMV rather than the fp32 one. By shape (gemv_i8_min
 * < 0), from the H200 benches (docs/PERFORMANCE.md): the integer stream-K
 * GEMV wins on long rows (27B down 17408 columns: 24 vs 34 us; o/out 6144:
 * 12.3 vs 15.1 us) and on the lm_head (214 vs 254 us), ties or loses at
 * 5120 columns and below (a digits pass and a few us more per launch; 27B
 * gate 28 vs 26.5 us), and groups split per matrix (so that a matrix's bits
 * do not depend on its grouping) lost 27B decode 108 -> 96 tok/s. The
 * lm_head of 2048 columns (35B-A3B, 286 MB) is the SIMT GEMV's: 81.8
 * against 117.6 us (s19r3), where the 27B's of 5120 is stream-K's (190
 * against 197). */
bool cu_gi_size_ok(const cu_devinfo *di, int64_t qbytes, int64_t cols)
{
    if (di->gemv_i8_min >= 0)
        return qbytes >= di->gemv_i8_min;
    return (cols >= 6144 && qbytes >= ((int64_t)12 << 20)) || (cols >= 4096 && qbytes >= ((int64_t)256 << 20));
}

bool cu_gi_ok(const cu_devinfo *di, const cu_weight *w, const float *x, int T)
{
    return di->gemv_i8 && cu_repacked_plain(w) && T >= 1 && T <= GI_TMAX && ((uintptr_t)x & 15) == 0;
}

/* k_x_digits' digits of one row of x (no norm, no records) on the host,
 * from the same helpers (cuda_quant.h): planes [3][cols] int8 (plane d =
 * digit d), e2 [cols / group]. For the CPU suite (test_quant), which checks
 * the digit form without a GPU; cols % group == 0, group % 4 == 0. */
extern "C" void sn_cuda_digits_host(const float *x, int64_t cols, int group, int8_t *planes, int *e2)
{
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
        float mx = 0.f;
        for (int i = 0; i < group; i++)
            mx = fmaxf(mx, fabsf(x[g0 + i]));
        const int e = xd_exp(mx);
        e2[g0 / group] = e;
        for (int i = 0; i < group; i += 4) {
            uint32_t ub[4], p[3];
            for (int j = 0; j < 4; j++)
                ub[j] = xd_biased(xd_int(x[g0 + i + j], e));
            xd_planes4(ub[0], ub[1], ub[2], ub[3], p[0], p[1], p[2]);
            for (int d = 0; d < 3; d++)
                memcpy(planes + (size_t)d * cols + g0 + i, &p[d], 4);
        }
    }
}

/* The stream-K GEMV's split (gk_plan, gk_split) of one launch over
 * segments of rows[i] rows and cols columns, on a device of n_sm SMs with
 * bps blocks an SM, checked on the host against what k_gemv_sk relies on;
 * for the CPU suite (test_quant), which has no GPU. 0 when it holds, else
 * 1 with what does not in why. */
extern "C" int sn_cuda_sk_split_check(const int64_t *rows, int n, int64_t cols, int n_sm, int bps, int vw,
                                      char *why, size_t why_len)
{
    cu_devinfo di;
    memset(&di, 0, sizeof di);
    di.n_sm = n_sm;
    di.gemv_sk_bps = bps;
    di.gk_part = (float *)&di; /* gk_plan only asks whether the buffers exist */
    di.gk_warps = INT_MAX;
    gi_seg g;
    memset(&g, 0, sizeof g);
    g.n = n;
    for (int i = 0; i < n; i++) {
        g.rows[i] = rows[i];
        g.mt[i] = (rows[i] + 15) / 16;
    }
    const int64_t KB = cols / 64;
#define SK_FAIL(...) return snprintf(why, why_len, __VA_ARGS__), 1
    bool pool = false;
    const unsigned grid = gk_plan(&di, g, KB, vw, &pool);
    if (!grid)
        SK_FAIL("no plan (%d row tiles)", g.t0[n]);
    /* the pool form: every resident warp has a virtual warp of its own */
    if (pool && (vw < 2 || g.wb[n] <= (int64_t)grid * 8))
        SK_FAIL("pool form at vw %d with %d virtual warps for %u x 8 warps", vw, g.wb[n], grid);
    if (grid > (unsigned)(n_sm * gk_bps(&di)))
        SK_FAIL("grid %u over %d SMs x %d blocks", grid, n_sm, bps);
    for (int s = 0; s < n; s++) {
        const gk_split sp{ g.u0[s], g.u0[s + 1] - g.u0[s], g.wb[s], g.wb[s + 1] - g.wb[s] };
        if (sp.W != g.mt[s] * KB || g.t0[s + 1] - g.t0[s] != g.mt[s])
            SK_FAIL("segment %d: %lld units, %d tiles", s, (long long)sp.W, g.t0[s + 1] - g.t0[s]);
        /* every warp of the segment has units: an empty one inside a tile's
         * span would leave the tile a piece short, never written */
        if (sp.NW < 1 || sp.NW > sp.W || sp.first(sp.wb) != sp.u0 || sp.first(sp.wb + sp.NW) != sp.u0 + sp.W)
            SK_FAIL("segment %d: %lld warps over %lld units", s, (long long)sp.NW, (long long)sp.W);
        for (int64_t w = sp.wb; w < sp.wb + sp.NW; w++) {
            const int64_t ua = sp.first(w), ub = sp.first(w + 1);
            if (ua >= ub)
                SK_FAIL("segment %d: warp %lld has no units", s, (long long)w);
            for (int64_t u = ua; u < ub; u++)
                if (sp.warp_of(u) != w)
                    SK_FAIL("segment %d: unit %lld of warp %lld is warp_of %lld", s, (long long)u, (long long)w,
                            (long long)sp.warp_of(u));
        }
        /* a tile's pieces: the warps from warp_of(its first unit) to
         * warp_of(its last) each leave one (the count the last one waits
         * for), the first in slot 1 only if it began before the tile, every
         * later one in slot 0 (it began inside the tile) */
        for (int64_t mt = 0; mt < g.mt[s]; mt++) {
            const int64_t ts = sp.u0 + mt * KB, te = ts + KB;
            const int64_t wf = sp.warp_of(ts), wl = sp.warp_of(te - 1);
            for (int64_t w = wf + 1; w <= wl; w++)
                if (sp.first(w) <= ts || sp.first(w) >= te)
                    SK_FAIL("segment %d tile %lld: warp %lld begins at %lld, outside [%lld, %lld)", s,
                            (long long)mt, (long long)w, (long long)sp.first(w), (long long)ts, (long long)te);
            if (g.t0[s] + mt >= GK_TILES)
                SK_FAIL("tile counter %lld past %d", (long long)(g.t0[s] + mt), GK_TILES);
        }
    }
#undef SK_FAIL
    return 0;
}

/* T <= GI_TMAX tokens in one pass through the repacked segments of g: x to
 * digits (norm folded in when given), then the tensor-core GEMV. */
sn_status cu_gi_run(const cu_devinfo *di, cudaStream_t s, gi_seg g, const cu_weight *w0, const float *x, int T,
                 const cu_gemv_norm *norm, void *scratch)
{
    /* two row tiles per block for matrices of at most 6144 rows (measured on
     * the H200: 10-30% faster there, slower above); the tile count does not
     * change a row's arithmetic, so results do not depend on it */
    int64_t maxr = 0;
    for (int i = 0; i < g.n; i++)
        maxr = g.rows[i] > maxr ? g.rows[i] : maxr;
    const int MB = di->gemv_mb ? di->gemv_mb : maxr <= 6144 ? 2 : 1;
    g.b0[0] = 0;
    for (int i = 0; i < g.n; i++)
        g.b0[i + 1] = g.b0[i] + (int)((g.mt[i] + MB - 1) / MB);
    switch (w0->group) {
    case 32: return gi_launch<1>(di, s, g, w0, x, T, MB, norm, scratch);
    case 64: return gi_launch<2>(di, s, g, w0, x, T, MB, norm, scratch);
    default: return gi_launch<4>(di, s, g, w0, x, T, MB, norm, scratch);
    }
}

sn_status cu_matmul_buffers(cu_devinfo *di)
{
    /* partials for every segment of a full group split as if alone (a
     * split of more virtual warps than this, gemv_sk_vw > 1 on a group of
     * several large matrices, takes one a warp instead: gi_launch) */
    di->gk_warps = di->n_sm * GK_BPS * 8 * CU_GROUP_MAX;
    const size_t pb = (size_t)di->gk_warps * 2 * GK_SLOT * sizeof(float);
    cudaError_t e;
    /* the tile counts, then the pool form's slice counters and block count (k_gemv_sk<DV>) */
    if ((e = cudaMalloc(&di->gk_part, pb)) != cudaSuccess ||
        (e = cudaMalloc(&di->gk_cnt, (GK_TILES + GK_POOL_INTS) * sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(di->gk_cnt, 0, (GK_TILES + GK_POOL_INTS) * sizeof(int))) != cudaSuccess ||
        (e = cudaMalloc(&di->gv_pool, 2 * sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(di->gv_pool, 0, 2 * sizeof(int))) != cudaSuccess) {
        cu_matmul_buffers_free(di);
        return SN_FAIL(SN_E_NOMEM, "cuda: GEMV buffers (%zu bytes): %s", pb + (GK_TILES + GK_POOL_INTS) * sizeof(int),
                       cudaGetErrorString(e));
    }
    /* the memset (legacy stream) done before any kernel of the backend's
     * non-blocking stream reads the counts */
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) {
        cu_matmul_buffers_free(di);
        return SN_FAIL(SN_E_BACKEND, "cuda: GEMV buffers: %s", cudaGetErrorString(e));
    }
    return SN_OK;
}

long cu_gk_pool_launches(void) { return __atomic_load_n(&gk_pool_n, __ATOMIC_RELAXED); }

sn_status cu_gk_pool_counters(const cu_devinfo *di, int out[2])
{
    int c[GK_POOL_INTS];
    CU_TRY(cudaMemcpy(c, di->gk_cnt + GK_TILES, sizeof c, cudaMemcpyDeviceToHost), "gemv pool");
    out[0] = 0;
    for (int i = 0; i < GK_SLICES; i++)
        out[0] += c[i];
    out[1] = c[GK_SLICES];
    return SN_OK;
}

void cu_matmul_buffers_free(cu_devinfo *di)
{
    cudaFree(di->gk_part);
    cudaFree(di->gk_cnt);
    cudaFree(di->gv_pool);
    di->gk_part = NULL;
    di->gk_cnt = NULL;
    di->gv_pool = NULL;
}

sn_status cu_gemv_int_init(const cu_devinfo *di)
{
#define GI_INIT(GS)                                                                                               \
    SN_TRY(max_smem_dyn(k_gemv_i8<GS, 1, 1>, di, "gemv init"));                                                    \
    SN_TRY(max_smem_dyn(k_gemv_i8<GS, 2, 1>, di, "gemv init"));                                                    \
    SN_TRY(max_smem_dyn(k_gemv_i8<GS, 3, 1>, di, "gemv init"));                                                    \
    SN_TRY(max_smem_dyn(k_gemv_i8<GS, 1, 2>, di, "gemv init"));                                                    \
    SN_TRY(max_smem_dyn(k_gemv_i8<GS, 2, 2>, di, "gemv init"));                                                    \
    SN_TRY(max_smem_dyn(k_gemv_i8<GS, 3, 2>, di, "gemv init"));
    GI_INIT(1)
    GI_INIT(2)
    GI_INIT(4)
#undef GI_INIT
#define GK_INIT(GS, SF)                                                                                           \
    SN_TRY(max_smem_dyn(k_gemv_sk<GS, 1, SF, 1>, di, "gemv init"));                                                \
    SN_TRY(max_smem_dyn(k_gemv_sk<GS, 1, SF, 1, true>, di, "gemv init"));                                          \
    SN_TRY(max_smem_dyn(k_gemv_sk<GS, 1, SF, 2>, di, "gemv init"));                                                \
    SN_TRY(max_smem_dyn(k_gemv_sk<GS, 2, SF, 0>, di, "gemv init"));                                                \
    SN_TRY(max_smem_dyn(k_gemv_sk<GS, 3, SF, 0>, di, "gemv init"));
    GK_INIT(1, CS_BF16)
    GK_INIT(2, CS_BF16)
    GK_INIT(4, CS_BF16)
    GK_INIT(1, CS_F16)
    GK_INIT(2, CS_F16)
    GK_INIT(4, CS_F16)
#undef GK_INIT
    return SN_OK;
}

bool cu_repack_q4_ok(const cu_weight *w)
{
    /* bf16/f16 scale pairs (4 bytes): what MLX checkpoints carry; an expert
     * stack is repacked as one tall matrix, so its experts' rows must fill
     * whole 16-row tiles */
    return w->fmt == CW_Q4 && w->sfmt != CS_F32 && (w->n_experts == 1 || w->rows % 16 == 0) &&
           (w->group == 32 || w->group == 64 || w->group == 128) && w->cols % 64 == 0 && w->rows > 0 && w->cols > 0;
}

sn_status cu_repack_q4(cudaStream_t s, cu_weight *w, size_t *bytes)
{
    if (!cu_repack_q4_ok(w))
        return SN_OK;
    const int64_t rows = w->rows * w->n_experts, MT = (rows + 15) / 16, KB = w->cols / 64;
    const size_t pb = w->sfmt == CS_F32 ? 8 : 4;
    const size_t qb = (size_t)MT * KB * 32 * sizeof(uint4), sbb = (size_t)MT * w->groups * 16 * pb;
    uint4 *qr = NULL;
    void *sr = NULL;
    cudaError_t e;
    if ((e = cudaMalloc(&qr, qb)) != cudaSuccess || (e = cudaMalloc(&sr, sbb)) != cudaSuccess) {
        cudaFree(qr);
        if (e == cudaErrorMemoryAllocation) {
            /* the copy only speeds things up: without it the weight takes
             * the fp32 GEMV / fp16 GEMMs (same results class), so a device
             * too small for both copies still loads the model */
            (void)cudaGetLastError();
            return SN_OK;
        }
        return SN_FAIL(SN_E_BACKEND, "upload_weight: repacked copy of %zu bytes: %s", qb + sbb, cudaGetErrorString(e));
    }
    k_repack_q4<<<2048, 256, 0, s>>>((const uint32_t *)w->q, rows, w->words, MT, KB, qr);
    k_repack_sb<<<1024, 256, 0, s>>>(w->sb, (int)pb, rows, w->groups, MT, sr);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        cudaFree(qr);
        cudaFree(sr);
        return SN_FAIL(SN_E_BACKEND, "upload_weight: repack: %s", cudaGetErrorString(e));
    }
    w->qr = qr;
    w->sr = sr;
    w->mt = MT;
    *bytes += qb + sbb;
    return SN_OK;
}
