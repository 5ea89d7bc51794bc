/* Prefill GEMM on the integer tensor cores (issue 6): y[T, rows] = x[T, cols]
 * @ W^T for Q4 weights repacked at upload (cu_weight.qr / sr, see
 * cu_repack_q4), fp32-class with 3 digits, 16-bit x with 2.
 *
 * The 4-bit weights q are exact u8 values, so W x = sum_g s_g sum_k q_k x_k
 * + b_g sum_k x_k needs only sum_k q_k x_k per quant group exactly. Each
 * token's x is turned per (token, group) into integers X = round(x * 2^e)
 * (e from the group's max |x| so |X| < 2^23 with 3 digits, < 2^15 with 2)
 * and X is split into its two's-complement bytes: the top byte signed
 * (s8), the lower ones unsigned (u8):
 *   X = 65536 d0 + 256 d1 + d2      (3 digits: 24-bit x, fp32's mantissa)
 *   X = 256 d0 + d1                 (2 digits: 16-bit x, 5 bits more than fp16)
 * Digit planes are the B operand of mma.sync m16n8k32 (u8 x s8 for d0,
 * u8 x u8 for the others), the repacked weights the A operand; the int32
 * results are exact. Per group the partials P_d are made floats by the
 * magic-number trick: the int accumulators start at 0x4B400000 (1.5 * 2^23
 * as a float), so their bits read as the float 1.5 * 2^23 + P_d exactly
 * (|P_d| < 2^22 is checked below); with c_d = 2^-e * (65536, 256, 1) and
 * K = -1.5 * 2^23 * (c0 + c1 + c2),
 *   u = fma(F0, c0, K)  (exact)  ;  u = fma(F1, c1, u)  ;  u = fma(F2, c2, u)
 * is the group's sum_k q_k x_k (two roundings), and per group
 *   acc = fma(s, u, acc) ; acc = fma(b, 2^-e sum X, acc).
 * That is 5 FP32 instructions per (row, token, group) and 3 integer MMAs
 * (1.5 fp16-MMA equivalents) per 32 columns and 8 digit columns.
 *
 * Rows g+8 of a tile: for groups of 32 and 64 the A register of the high
 * nibbles is used in place (W & 0xF0F0F0F0 = 16 q, one AND instead of a
 * shift and an AND), so those partials are 16 q x d (still < 2^22: 64 *
 * 240 * 255 < 2^22) and their scale is s / 16 (exact).
 *
 * Determinism and batch invariance: every output (row, token) is computed
 * by the same instruction sequence whatever T, the tile or the other
 * tokens are (integer MMAs are exact, the float part is per element in
 * group order), so a token's row is bitwise the same at any T.
 *
 * Kernels: k_i8_stage (one block per token: group maxima, exponents, digit
 * planes [D][T][cols] int8, per (group, token) {2^-e, K, 2^-e sum X} as a
 * float4) and k_gemm_i8 (block 256 rows x 32 (3 digits) or 48 (2 digits)
 * tokens, 8 warps of 64 rows x 16 / 24 tokens, 4-stage cp.async pipeline of
 * 64-column blocks: A tiles 512 B per 16 rows as stored, B planes in rows of
 * 80 bytes (ldmatrix conflict-free), scale pairs and column constants of the
 * block's group(s); tall blocks because the x planes (3 bytes per value)
 * dominate the L2 -> SM traffic: 14 KB per block and 64 columns). tests/test_cuda_gemm_i8.c emulates both in C from the
 * PTX fragment layouts.
 *
 * The kernel is bound by instruction issue and latency, not by the tensor
 * cores (ncu, 17408 x 5120 at T = 4096: tensor pipe 33 % busy, 1.8
 * instructions per cycle per SM, 2 warps per scheduler; the epilogue's 5
 * FMAs per (row, token, group) are 40 % of the instructions). So each
 * thread computes its copy sources once and advances them per block, a
 * group's first MMA takes the magic constant as its C operand (no reset
 * moves), and the scale format is a template parameter: 107 -> 142
 * nominal TFLOP/s on that shape (bench/results.log 2026-12-01T15:52Z).
 *
 * Limits: activations with |x| >= 2^111 overflow K to -inf (NaN/inf
 * output); a group holding NaN/inf gives NaN for that token. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_internal.h"

namespace {

constexpr int I8_THREADS = 256;
constexpr int I8_WM = 4, I8_WN = 2;      /* warps along rows, along tokens */
constexpr int I8_MTW = 4;                /* 16-row tiles per warp */
constexpr int I8_BMT = I8_WM * I8_MTW;   /* 16-row tiles per block (256 rows) */
constexpr int I8_GT = 8;                 /* token blocks per raster group */
constexpr int I8_STAGES = 4;
constexpr int I8_BROW = 80;              /* bytes per staged plane row: 64 + 16 (rows 20 banks apart) */
constexpr uint32_t I8_MAGIC = 0x4B400000u; /* 1.5 * 2^23 */

template <int D>
struct i8cfg {
    static constexpr int TTW = D == 3 ? 2 : 3;  /* 8-token tiles per warp */
    static constexpr int NT = D * TTW;          /* n-tiles per warp, digit-major: j = d * TTW + tt */
    static constexpr int BT = I8_WN * TTW * 8;  /* tokens per block */
    static constexpr int A_BYTES = I8_BMT * 512;
    static constexpr int B_BYTES = D * BT * I8_BROW;
    static constexpr int S_BYTES = 2 * I8_BMT * 16 * 4;
    static constexpr int C_BYTES = 2 * BT * 16;
    static constexpr int STAGE = A_BYTES + B_BYTES + S_BYTES + C_BYTES;
    static constexpr int SMEM = I8_STAGES * STAGE;
};
static_assert(i8cfg<3>::NT % 2 == 0 && i8cfg<2>::NT % 2 == 0, "n-tiles go in pairs per ldmatrix.x4");
static_assert(i8cfg<3>::STAGE % 128 == 0 && i8cfg<2>::STAGE % 128 == 0, "stages stay aligned");

/* x -> digit planes, per token. G: quant group (32, 64, 128). Plane row t
 * is x row t; with su the value is silu(x) * su (k_silu_mul's expression,
 * so the same bits as that pass followed by this one). */
template <int D, int G>
__global__ void __launch_bounds__(256) k_i8_stage(const float *__restrict__ x, int T, int64_t cols,
                                                 int8_t *__restrict__ planes, float4 *__restrict__ gc,
                                                 const float *__restrict__ su)
{
    pdl_enter();
    constexpr int L = G / 4; /* lanes per group (4 columns each) */
    constexpr int XBITS = D == 3 ? 23 : 15;
    constexpr int XMAX = (1 << XBITS) - 1;
    constexpr float KM = (float)(12582912.0 * (D == 3 ? 65793.0 : 257.0)); /* exact: 197379 * 2^22 / 771 * 2^22 */
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    const float *xr = x + (size_t)t * cols;
    const float *ur = su ? su + (size_t)t * cols : nullptr;
    const int64_t n4 = cols / 4;
    /* warp-uniform trip count (every lane takes part in the shuffles); a
     * group never straddles live and dead lanes (cols % G == 0) */
    for (int64_t q0 = 0; q0 < n4; q0 += blockDim.x) {
        const int64_t q = q0 + threadIdx.x;
        const bool live = q < n4;
        float v[4];
        float mx = 0.f;
        int bad = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[j] = live ? xr[4 * q + j] : 0.f;
            if (ur && live)
                v[j] = v[j] / (1.f + expf(-v[j])) * ur[4 * q + j];
            mx = fmaxf(mx, fabsf(v[j]));
            bad |= !isfinite(v[j]);
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            bad |= __shfl_xor_sync(0xffffffffu, bad, o);
        }
        int e2 = 0;
        if (mx > 0.f && !bad) {
            int e;
            frexpf(mx, &e); /* mx < 2^e */
            e2 = min(100, XBITS - e); /* >= -105 for finite mx */
        }
        const float sc = __int_as_float((127 + e2) << 23), es = __int_as_float((127 - e2) << 23);
        int X[4], sum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int xi = bad ? 0 : __float2int_rn(v[j] * sc); /* exact scaling by 2^e2 */
            xi = min(xi, XMAX);                            /* round may reach 2^XBITS */
            X[j] = xi;
            sum += xi;
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o); /* integers: exact in any order */
        if (live) {
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int sh = 8 * (D - 1 - d);
                uint32_t p = 0;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    p |= (uint32_t)((X[j] >> sh) & 255) << (8 * j);
                ((uint32_t *)(planes + ((size_t)d * T + t) * cols))[q] = p;
            }
            if (lane % L == 0)
                gc[(size_t)(4 * q / G) * T + t] = make_float4(es, bad ? __int_as_float(0x7fc00000) : -KM * es,
                                                              (float)sum * es, 0.f);
        }
    }
}

__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void imma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void imma_u8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the first MMA of a quant group: C is the magic constant, so the
 * accumulators need no reset between groups */
__device__ __forceinline__ void imma_s8_z(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, uint32_t z)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(z));
}
__device__ __forceinline__ void imma_u8_z(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, uint32_t z)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(z));
}

/* The grouped raster of a plain launch: I8_GT token blocks side by side,
 * row blocks in turn, so the blocks resident at once share their weight
 * tiles and x planes in L2. nrb / ntb: row / token blocks. */
__device__ __forceinline__ void i8_raster(int64_t nrb, int64_t ntb, int64_t bid, int64_t &rb, int64_t &tb)
{
    const int64_t grp = bid / (nrb * I8_GT), loc = bid - grp * nrb * I8_GT;
    const int64_t gsz = ntb - grp * I8_GT < I8_GT ? ntb - grp * I8_GT : I8_GT;
    tb = grp * I8_GT + loc % gsz;
    rb = loc / gsz;
}

/* The weight side of a block's copies, the same in both forms. Sources for
 * k-block 0: each thread's A chunks (16-byte chunk i of the block's tiles:
 * tile i / 32, lane i % 32; rows past MT read nothing) and its chunk of the
 * SUB groups' scale pairs; i8_copy_w issues them for k-block kb into a
 * stage, A at st and the pairs (once a group) at st + s_off. */
template <int NA, int THR, int SUB>
__device__ __forceinline__ void i8_w_src(const uint4 *qr, const uint32_t *sr, int64_t mt0, int64_t MT, int KB,
                                         int64_t groups, int tid, const uint4 *(&srcA)[NA], bool (&okA)[NA],
                                         bool &hasS, int &subS, bool &okS, const uint32_t *&srcS)
{
#pragma unroll
    for (int r = 0; r < NA; r++) {
        const int i = tid + r * THR;
        const int64_t mt = mt0 + (i >> 5);
        okA[r] = mt < MT;
        srcA[r] = qr + (okA[r] ? mt * KB * 32 + (i & 31) : 0);
    }
    hasS = tid < SUB * I8_BMT * 4;
    subS = tid / (I8_BMT * 4);
    okS = hasS && mt0 + (tid / 4) % I8_BMT < MT;
    srcS = sr + (okS ? (mt0 + (tid / 4) % I8_BMT) * groups * 16 + 4 * (tid & 3) : 0);
}

template <int NA, int THR, int GS>
__device__ __forceinline__ void i8_copy_w(uint32_t st, uint32_t s_off, int tid, int kb, const uint4 *const (&srcA)[NA],
                                          const bool (&okA)[NA], bool hasS, int subS, bool okS,
                                          const uint32_t *srcS)
{
#pragma unroll
    for (int r = 0; r < NA; r++)
        cp16(st + (tid + r * THR) * 16, srcA[r] + (okA[r] ? kb * 32 : 0), okA[r]);
    if ((GS < 4 || (kb & 1)) && hasS) {
        const int64_t g = (kb * 2 + subS) / GS;
        cp16(st + s_off + tid * 16, srcS + (okS ? g * 16 : 0), okS);
    }
}

/* A row's (scale, bias) pair as stored by the repack: bf16 or f16 halves */
template <bool F16>
__device__ __forceinline__ void i8_sb(uint32_t pr, float &s, float &b)
{
    if (!F16) {
        s = __uint_as_float(pr << 16);
        b = __uint_as_float(pr & 0xffff0000u);
    } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&pr));
        s = f.x;
        b = f.y;
    }
}

/* After k-tile kt (0, 1) of 64-column block kb: flush(sub) for the quant
 * group that ends there, if one does (GS = 32-column k-tiles per group;
 * groups of 32 are two a block, sub = kt) */
template <int GS, typename F>
__device__ __forceinline__ void i8_group_end(int kb, int kt, F &&flush)
{
    if (GS == 1)
        flush(kt);
    else if (GS == 2 ? kt == 1 : (kt == 1 && (kb & 1)))
        flush(0);
}

/* The 4-stage cp.async pipeline of 64-column blocks: the first stages'
 * weights before the wait (they are constant), their activations after,
 * then per block its wait, the refill of the slot freed by the block before
 * and the block's two 32-column k-tiles. */
template <typename LW, typename LX, typename KT>
__device__ __forceinline__ void i8_pipeline(int KB, LW &&load_w, LX &&load_x, KT &&ktile)
{
#pragma unroll
    for (int s = 0; s < I8_STAGES - 1; s++) {
        if (s < KB)
            load_w(s, s);
        cp_commit();
    }
    pdl_wait();
#pragma unroll
    for (int s = 0; s < I8_STAGES - 1; s++) {
        if (s < KB)
            load_x(s, s);
        cp_commit();
    }
    for (int kb = 0; kb < KB; kb++) {
        cp_wait<I8_STAGES - 2>();
        __syncthreads(); /* stage kb landed for all; the slot refilled below is free */
        {
            const int kn = kb + I8_STAGES - 1;
            if (kn < KB) {
                load_w(kn, kn % I8_STAGES);
                load_x(kn, kn % I8_STAGES);
            }
            cp_commit();
        }
        ktile(kb, 0);
        ktile(kb, 1);
    }
}

/* The expert-grouped form (MoE prefill): plane rows are token/expert pairs
 * sorted by expert, expert e's run [seg_off[e], seg_off[e] + cnt[e]);
 * blk_off[e] = token blocks before expert e's (prefix of ceil(cnt / BT)),
 * blk_off[E] = all. qr / sr hold the E experts' repacked matrices back to
 * back (rows % 16 == 0, so no 16-row tile straddles two experts). */
struct i8_seg {
    const int *cnt, *seg_off, *blk_off;
    int E;
    /* plane row of pair row t: perm[t] / k (gate and up read the tokens' x
     * staged once, not once per pair), or t when perm is NULL (down) */
    const int32_t *perm;
    int k;
};

/* GS: 32-column k-tiles per quant group (1, 2, 4); F16: scale pairs are
 * f16 (else bf16: a template parameter, as a runtime branch in the
 * epilogue it cost 12 %); SEG: the expert-grouped form (MT = 16-row tiles
 * per expert; no bias). */
template <int D, int GS, bool F16, bool SEG>
__global__ void __launch_bounds__(I8_THREADS, 1)
k_gemm_i8(const uint4 *__restrict__ qr, const uint32_t *__restrict__ sr, const float *__restrict__ bias,
          int64_t rows, int64_t MT, int64_t cols, int64_t groups, const int8_t *__restrict__ planes,
          const float4 *__restrict__ gc, int T, float *__restrict__ y, i8_seg sg)
{
    using C = i8cfg<D>;
    constexpr bool HI16 = GS <= 2;       /* rows g+8 as 16 q (see the header) */
    constexpr int SUB = GS == 1 ? 2 : 1; /* quant groups per 64-column block */
    constexpr int TTW = C::TTW, NT = C::NT, BT = C::BT, MTW = I8_MTW;
    constexpr bool CZ = GS <= 2; /* a group's first MMA starts from the magic constant (no reset) */
    pdl_launch();
    extern __shared__ __align__(128) unsigned char i8_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(i8_smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int wm = warp / I8_WN, wn = warp % I8_WN;
    int64_t rb, tb;
    int tbase = 0, tend = T; /* the block's plane rows lie in [tbase, tend) */
    const int KB = (int)(cols / 64);
    if constexpr (SEG) {
        /* which expert: the block counts are written by an earlier kernel */
        pdl_wait();
        const int64_t nrb = (MT + I8_BMT - 1) / I8_BMT, bid = blockIdx.x;
        if (bid >= (int64_t)sg.blk_off[sg.E] * nrb)
            return;
        int lo = 0, hi = sg.E - 1; /* the last e with blk_off[e] * nrb <= bid */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if ((int64_t)sg.blk_off[mid] * nrb <= bid)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int64_t loc = bid - (int64_t)sg.blk_off[lo] * nrb;
        tb = loc / nrb;
        rb = loc - tb * nrb;
        tbase = sg.seg_off[lo];
        tend = tbase + sg.cnt[lo];
        qr += (size_t)lo * MT * KB * 32;
        sr += (size_t)lo * MT * groups * 16;
    } else {
        i8_raster((MT + I8_BMT - 1) / I8_BMT, (T + BT - 1) / BT, blockIdx.x, rb, tb);
    }
    const int64_t mt0 = rb * I8_BMT;
    const int t0 = tbase + (int)(tb * BT);

    /* each thread's copy sources for k-block 0 (advanced per block): A
     * tiles (16-byte chunk i: tile i/32, lane i%32), the D planes x BT token
     * rows of 64 bytes (tokens >= T read as zeros), the scale pairs and the
     * column constants of the block's group(s) */
    constexpr int NA = I8_BMT * 32 / I8_THREADS, NB = (D * BT * 4 + I8_THREADS - 1) / I8_THREADS;
    static_assert(I8_BMT * 32 % I8_THREADS == 0, "A chunks split evenly");
    static_assert(SUB * I8_BMT * 4 <= I8_THREADS && SUB * BT <= I8_THREADS, "one chunk per thread at most");
    const uint4 *srcA[NA];
    bool okA[NA], hasS, okS;
    int subS;
    const uint32_t *srcS;
    i8_w_src<NA, I8_THREADS, SUB>(qr, sr, mt0, MT, KB, groups, tid, srcA, okA, hasS, subS, okS, srcS);
    const int8_t *srcB[NB];
    bool okB[NB], hasB[NB];
#pragma unroll
    for (int r = 0; r < NB; r++) {
        const int i = tid + r * I8_THREADS;
        const int row = i >> 2, c = i & 3, d = row / BT, t = t0 + row % BT;
        hasB[r] = i < D * BT * 4;
        okB[r] = hasB[r] && t < tend;
        const int pr = SEG && sg.perm && okB[r] ? sg.perm[t] / sg.k : t; /* the plane row */
        srcB[r] = planes + (okB[r] ? ((size_t)d * T + pr) * cols + c * 16 : 0);
    }
    const bool hasC = tid < SUB * BT;
    const int subC = tid / BT;
    const bool okC = hasC && t0 + tid % BT < tend;
    const int pc = SEG && sg.perm && okC ? sg.perm[t0 + tid % BT] / sg.k : t0 + tid % BT;
    const float4 *srcC = gc + (okC ? pc : 0);

    auto load_w = [&](int kb, int slot) {
        i8_copy_w<NA, I8_THREADS, GS>(sbase + slot * C::STAGE, C::A_BYTES + C::B_BYTES, tid, kb, srcA, okA, hasS, subS,
                                      okS, srcS);
    };
    auto load_x = [&](int kb, int slot) {
        const uint32_t st = sbase + slot * C::STAGE;
#pragma unroll
        for (int r = 0; r < NB; r++) {
            const int i = tid + r * I8_THREADS;
            if (hasB[r])
                cp16(st + C::A_BYTES + (i >> 2) * I8_BROW + (i & 3) * 16, srcB[r] + (okB[r] ? kb * 64 : 0), okB[r]);
        }
        if ((GS < 4 || (kb & 1)) && hasC) {
            const int64_t grp = (kb * 2 + subC) / GS;
            cp16(st + C::A_BYTES + C::B_BYTES + C::S_BYTES + tid * 16, srcC + (okC ? grp * T : 0), okC);
        }
    };


    /* per lane: the plane row and 16-byte half its ldmatrix address names,
     * for each pair of n-tiles (lanes 0-7: tile 2p, k 0-15; 8-15: 2p, k
     * 16-31; 16-23: 2p+1, k 0-15; 24-31: 2p+1, k 16-31) */
    uint32_t boff[NT / 2];
#pragma unroll
    for (int p = 0; p < NT / 2; p++) {
        const int mi = lane >> 3, j = 2 * p + (mi >> 1), d = j / TTW, tt = j % TTW;
        boff[p] = C::A_BYTES + (d * BT + (wn * TTW + tt) * 8 + (lane & 7)) * I8_BROW + (mi & 1) * 16;
    }

    int acc_i[MTW][NT][4];
    float acc[MTW][TTW][4];
#pragma unroll
    for (int m = 0; m < MTW; m++) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc_i[m][j][i] = (int)I8_MAGIC;
#pragma unroll
        for (int tt = 0; tt < TTW; tt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[m][tt][i] = 0.f;
    }

    /* end of a quant group: partials -> floats, scaled, into acc */
    auto flush = [&](const unsigned char *st, int sub) {
        const uint32_t *Ss = (const uint32_t *)(st + C::A_BYTES + C::B_BYTES) + (sub * I8_BMT + wm * MTW) * 16;
        const float4 *Cs =
            (const float4 *)(st + C::A_BYTES + C::B_BYTES + C::S_BYTES) + sub * BT + wn * TTW * 8 + 2 * tq;
        float es[TTW][2], kk[TTW][2], xb[TTW][2], c0s[TTW][2], c1s[TTW][2];
#pragma unroll
        for (int tt = 0; tt < TTW; tt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float4 v = Cs[tt * 8 + c];
                es[tt][c] = v.x;
                kk[tt][c] = v.y;
                xb[tt][c] = v.z;
                c0s[tt][c] = __fmul_rn(v.x, D == 3 ? 65536.f : 256.f); /* exact: powers of two */
                c1s[tt][c] = __fmul_rn(v.x, 256.f);
            }
#pragma unroll
        for (int m = 0; m < MTW; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t pr = Ss[m * 16 + gq + 8 * h];
                float s, b;
                i8_sb<F16>(pr, s, b);
                if (HI16 && h)
                    s = __fmul_rn(s, 0.0625f);
#pragma unroll
                for (int tt = 0; tt < TTW; tt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int i = 2 * h + c;
                        float u = __fmaf_rn(__int_as_float(acc_i[m][tt][i]), c0s[tt][c], kk[tt][c]);
                        if (D == 3) {
                            u = __fmaf_rn(__int_as_float(acc_i[m][TTW + tt][i]), c1s[tt][c], u);
                            u = __fmaf_rn(__int_as_float(acc_i[m][2 * TTW + tt][i]), es[tt][c], u);
                        } else {
                            u = __fmaf_rn(__int_as_float(acc_i[m][TTW + tt][i]), es[tt][c], u);
                        }
                        acc[m][tt][i] = __fmaf_rn(s, u, acc[m][tt][i]);
                        acc[m][tt][i] = __fmaf_rn(b, xb[tt][c], acc[m][tt][i]);
                    }
            }
        if (!CZ) {
#pragma unroll
            for (int m = 0; m < MTW; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc_i[m][j][i] = (int)I8_MAGIC;
        }
    };

    /* one 32-column k-tile kt (0, 1) of k-block kb: MMAs, then the flush
     * if a quant group ends there */
    auto ktile = [&](int kb, int kt) {
        const int slot = kb % I8_STAGES;
        const unsigned char *st = i8_smem + slot * C::STAGE;
        const uint32_t stb = sbase + slot * C::STAGE;
        /* A registers (PTX m16n8k32 .u8): {row g, k 4t..}, {row g+8, k 4t..}, {row g, k 16+4t..}, {row g+8, k 16+4t..} */
        uint32_t a[MTW][4];
#pragma unroll
        for (int m = 0; m < MTW; m++) {
            const uint2 W = ((const uint2 *)st)[((wm * MTW + m) * 32 + lane) * 2 + kt];
            a[m][0] = W.x & 0x0F0F0F0Fu;
            a[m][1] = HI16 ? (W.x & 0xF0F0F0F0u) : ((W.x >> 4) & 0x0F0F0F0Fu);
            a[m][2] = W.y & 0x0F0F0F0Fu;
            a[m][3] = HI16 ? (W.y & 0xF0F0F0F0u) : ((W.y >> 4) & 0x0F0F0F0Fu);
        }
        const bool z = CZ && (GS == 1 || kt == 0); /* the group's first k-tile */
#pragma unroll
        for (int p = 0; p < NT / 2; p++) {
            uint32_t b[4];
            cu_ldsm_x4(b, stb + boff[p] + kt * 32);
#pragma unroll
            for (int m = 0; m < MTW; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int(&dj)[4] = acc_i[m][2 * p + h];
                    const uint32_t b0 = b[2 * h], b1 = b[2 * h + 1];
                    const bool sgn = (2 * p + h) / TTW == 0;
                    if (z && sgn)
                        imma_s8_z(dj, a[m], b0, b1, I8_MAGIC);
                    else if (z)
                        imma_u8_z(dj, a[m], b0, b1, I8_MAGIC);
                    else if (sgn)
                        imma_s8(dj, a[m], b0, b1);
                    else
                        imma_u8(dj, a[m], b0, b1);
                }
        }
        i8_group_end<GS>(kb, kt, [&](int sub) { flush(st, sub); });
    };

    i8_pipeline(KB, load_w, load_x, ktile);

#pragma unroll
    for (int m = 0; m < MTW; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = (mt0 + wm * MTW + m) * 16 + gq + 8 * h;
            if (r >= rows)
                continue;
            const float bv = bias ? __ldg(bias + r) : 0.f;
#pragma unroll
            for (int tt = 0; tt < TTW; tt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int t = t0 + (wn * TTW + tt) * 8 + 2 * tq + c;
                    if (t < tend) {
                        const float v = acc[m][tt][2 * h + c];
                        y[(size_t)t * rows + r] = bias ? __fadd_rn(v, bv) : v;
                    }
                }
        }
}

/* ---- The fp16 hi/lo form (gemm_i8 = 4; PERFORMANCE runs 46-47) ----
 *
 * The same repacked weights on the fp16 tensor cores. x is scaled per
 * token by a power of two 2^e (its largest |x| lands in [2^13, 2^14)) and
 * split into fp16 hi = fp16(x 2^e) and lo = fp16(x 2^e - hi): 22 bits of
 * each value. A is the weights' nibbles as fp16: 1024 + q as a normal fp16
 * less 1024 (one LOP3 and one HSUB2 a register; gemm_hl_sub=0, the
 * default), or the bits q read as the subnormal q 2^-24 (one AND;
 * gemm_hl_sub=1: 1.19x the 3-digit GEMM on the H100 against 1.11x, but its
 * results were 4e-6 off the host emulation: the tensor cores do not take
 * subnormal inputs exactly, s37r1). B is the hi and lo planes; per quant
 * group one fp32 accumulator takes hi, then lo, for each 16 columns
 * (mma.sync m16n8k16). Per (row, token, group) the epilogue is 2 FMAs
 * (acc += s u; acc += b xs, xs = 2^-24 sum x 2^e) where the digit form
 * spends 5, and 2^(24 - e) is applied once per output (the normal-fp16
 * nibbles' u is 2^24 larger: their s carries the 2^-24).
 *
 * Fragments: the repacked word W of lane (g, t) holds row g's columns
 * 4t..4t+3 in its low nibbles (bytes 0..3) and row g+8's in the high ones.
 * An m16n8k16 A register holds 2 halves; taking bytes {0, 2} for the k
 * slots 2t, 2t+1 and bytes {1, 3} for 2t+8, 2t+9 gives (before the
 * conversion above)
 *   a0 = W & 0x000F000F, a1 = W & 0x00F000F0 (row g+8, 16 q),
 *   a2 = (W >> 8) & 0x000F000F, a3 = (W >> 8) & 0x00F000F0,
 * so B must hold x at columns (4t, 4t+2) in b0 and (4t+1, 4t+3) in b1: the
 * staging stores each 16 columns as their 8 even columns, then the 8 odd
 * ones, and one ldmatrix.x4 of a token tile gives b0, b1 for both 16-column
 * halves of a 32-column k-tile.
 *
 * Block 256 rows x 64 tokens (8 warps of 64 x 32, or of 32 x 64:
 * gemm_hl_rows), the digit form's 4-stage cp.async pipeline of 64-column
 * blocks. Deterministic and batch invariant as the digit form (per output
 * the same instruction sequence at any T; a token's scale depends on its
 * own row only). Limits: |x| >= 2^114 overflows fp16 (inf/NaN out), a
 * token holding NaN/inf gives NaN for that token. */
constexpr int HL_BT = 64;                      /* tokens per block */
constexpr int HL_BROW = 144;                   /* bytes per staged x row: 64 halves + 16 (ldmatrix conflict-free) */
constexpr int HL_A = I8_BMT * 512;
constexpr int HL_B = 2 * HL_BT * HL_BROW;      /* hi then lo rows */
constexpr int HL_S = 2 * I8_BMT * 16 * 4;
constexpr int HL_C = 2 * HL_BT * 4;            /* xs per (group, token) */
constexpr int HL_STAGE = HL_A + HL_B + HL_S + HL_C;
constexpr int HL_SMEM = I8_STAGES * HL_STAGE;
constexpr int HL_XTOP = 14;                    /* a token's largest |x| 2^e lies in [2^13, 2^14) */
static_assert(HL_STAGE % 128 == 0, "stages stay aligned");

/* scratch of the hi/lo form: planes [2][T][cols] halves, xs [groups][Tp]
 * (Tp = T rounded up to 4: the GEMM copies xs in 4-token chunks), ts [T] */
struct hl_scr {
    size_t xs, ts, total;
    int64_t Tp;
};
hl_scr hl_scr_of(const cu_weight *w, int T)
{
    hl_scr m;
    m.Tp = ((int64_t)T + 3) / 4 * 4;
    m.xs = ((size_t)4 * T * w->cols + 255) / 256 * 256;
    m.ts = m.xs + ((size_t)w->groups * m.Tp * 4 + 255) / 256 * 256;
    m.total = m.ts + (size_t)T * 4 + 256;
    return m;
}

/* x -> hi/lo planes, per token (one block): the row's largest |x| sets e,
 * then each thread splits 4 columns (16 consecutive columns stored as the
 * evens, then the odds) and a group's lanes sum their x 2^e in a fixed
 * tree. G: quant group (32, 64, 128). */
template <int G>
__global__ void __launch_bounds__(256) k_hl_stage(const float *__restrict__ x, int T, int64_t cols, int64_t Tp,
                                                 __half *__restrict__ planes, float *__restrict__ xs,
                                                 float *__restrict__ ts)
{
    pdl_enter();
    constexpr int L = G / 4;
    __shared__ float red[8];
    __shared__ int redb[8];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *xr = x + (size_t)t * cols;
    const int64_t n4 = cols / 4;
    float mx = 0.f;
    int bad = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        mx = fmaxf(mx, fabsf(xr[c]));
        bad |= !isfinite(xr[c]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if (lane == 0) {
        red[warp] = mx;
        redb[warp] = bad;
    }
    __syncthreads();
    mx = 0.f;
    bad = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        mx = fmaxf(mx, red[i]);
        bad |= redb[i];
    }
    int e2 = 0;
    if (mx > 0.f && !bad) {
        int e;
        frexpf(mx, &e); /* mx < 2^e */
        e2 = max(-100, min(100, HL_XTOP - e));
    }
    const float sc = __int_as_float((127 + e2) << 23);
    if (threadIdx.x == 0)
        ts[t] = __int_as_float((127 + 24 - e2) << 23); /* 2^(24 - e), a normal float for |e| <= 100 */
    __half *hi = planes + (size_t)t * cols, *lo = planes + ((size_t)T + t) * cols;
    /* warp-uniform trip count: every lane takes part in the shuffles */
    for (int64_t q0 = 0; q0 < n4; q0 += blockDim.x) {
        const int64_t q = q0 + threadIdx.x;
        const bool live = q < n4;
        __half h[4], l[4];
        float s[4], sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            s[j] = live ? xr[4 * q + j] * sc : 0.f; /* exact: a power of two */
            h[j] = __float2half_rn(s[j]);
            l[j] = __float2half_rn(s[j] - __half2float(h[j])); /* the difference is exact */
            sum += s[j];
        }
#pragma unroll
        for (int o = 1; o < L; o <<= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (live) {
            /* columns c0..c0+3 (c0 = 4q): evens at c16 + (c0 % 16) / 2, odds 8 further */
            const int64_t c0 = 4 * q, base = c0 & ~(int64_t)15, ev = base + (c0 & 15) / 2, od = ev + 8;
            *(__half2 *)(hi + ev) = __halves2half2(h[0], h[2]);
            *(__half2 *)(hi + od) = __halves2half2(h[1], h[3]);
            *(__half2 *)(lo + ev) = __halves2half2(l[0], l[2]);
            *(__half2 *)(lo + od) = __halves2half2(l[1], l[3]);
            if (lane % L == 0)
                xs[(size_t)(c0 / G) * Tp + t] = bad ? __int_as_float(0x7fc00000) : __fmul_rn(sum, 5.9604645e-8f); /* 2^-24 */
        }
    }
}

__device__ __forceinline__ void hmma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* Two nibbles of a repacked word (mask 0x000F000F or 0x00F000F0) as an
 * fp16 pair: their bits as subnormals (q 2^-24), or 1024 + q less 1024 */
template <bool SUBN>
__device__ __forceinline__ uint32_t hl_nib(uint32_t v, uint32_t mask)
{
    if (SUBN)
        return v & mask;
    const uint32_t h = (v & mask) | 0x64006400u;
    const __half2 r = __hsub2(*reinterpret_cast<const __half2 *>(&h), __half2half2(__ushort_as_half(0x6400u)));
    return *reinterpret_cast<const uint32_t *>(&r);
}

/* a quant group's first MMA: C = 0, so the accumulators need no reset */
__device__ __forceinline__ void hmma_z(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}

/* GS: 32-column k-tiles per quant group (1, 2, 4); F16: f16 scale pairs;
 * SUBN: the nibbles as fp16 subnormals (else 1024 + q less 1024); WM: warps
 * along the rows (4: 4 x 2 warps of 64 rows x 32 tokens, each A tile
 * converted by both warps of its rows; 8: 8 x 1 warps of 32 x 64, each A
 * tile converted once, twice the B fragment loads). Either gives the same
 * bits: an output's instruction sequence does not depend on which warp runs
 * it. (A 16-warp form of 64 x 16 tiles ran slower, s37r2.) */
template <int GS, bool F16, bool SUBN, int WM>
__global__ void __launch_bounds__(I8_THREADS, 1)
k_gemm_hl(const uint4 *__restrict__ qr, const uint32_t *__restrict__ sr, const float *__restrict__ bias, int64_t rows,
          int64_t MT, int64_t cols, int64_t groups, const __half *__restrict__ planes, const float *__restrict__ xs,
          int64_t Tp, const float *__restrict__ ts, int T, float *__restrict__ y)
{
    constexpr int SUB = GS == 1 ? 2 : 1, BT = HL_BT, THR = I8_THREADS, MTW = I8_BMT / WM, WN = THR / 32 / WM,
                  NTW = BT / (8 * WN);
    static_assert(I8_BMT % WM == 0 && THR / 32 % WM == 0 && BT % (8 * WN) == 0, "warps tile the block");
    pdl_launch();
    extern __shared__ __align__(128) unsigned char hl_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(hl_smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int wm = warp / WN, wn = warp % WN;
    const int KB = (int)(cols / 64);
    int64_t rb, tb;
    i8_raster((MT + I8_BMT - 1) / I8_BMT, (T + BT - 1) / BT, blockIdx.x, rb, tb);
    const int64_t mt0 = rb * I8_BMT;
    const int t0 = (int)(tb * BT);

    /* copy sources for k-block 0: A tiles as the digit form; hi and lo rows
     * (128 bytes a token and k-block, 8 chunks); scale pairs; xs in 4-token
     * chunks (Tp covers the last chunk) */
    constexpr int NA = I8_BMT * 32 / THR, NB = 2 * BT * 8 / THR;
    static_assert(2 * BT * 8 % THR == 0, "B chunks split evenly");
    static_assert(SUB * I8_BMT * 4 <= THR && SUB * BT / 4 <= THR, "one chunk per thread at most");
    const uint4 *srcA[NA];
    bool okA[NA], hasS, okS;
    int subS;
    const uint32_t *srcS;
    i8_w_src<NA, THR, SUB>(qr, sr, mt0, MT, KB, groups, tid, srcA, okA, hasS, subS, okS, srcS);
    const __half *srcB[NB];
    bool okB[NB];
#pragma unroll
    for (int r = 0; r < NB; r++) {
        const int i = tid + r * THR, row = i >> 3, c = i & 7, p = row / BT, t = t0 + row % BT;
        okB[r] = t < T;
        srcB[r] = planes + (okB[r] ? ((size_t)p * T + t) * cols + c * 8 : 0);
    }
    const bool hasC = tid < SUB * BT / 4;
    const int subC = tid / (BT / 4);
    const bool okC = hasC && t0 + 4 * (tid % (BT / 4)) < T;
    const float *srcC = xs + (okC ? t0 + 4 * (tid % (BT / 4)) : 0);

    auto load_w = [&](int kb, int slot) {
        i8_copy_w<NA, THR, GS>(sbase + slot * HL_STAGE, HL_A + HL_B, tid, kb, srcA, okA, hasS, subS, okS, srcS);
    };
    auto load_x = [&](int kb, int slot) {
        const uint32_t st = sbase + slot * HL_STAGE;
#pragma unroll
        for (int r = 0; r < NB; r++) {
            const int i = tid + r * THR;
            cp16(st + HL_A + (i >> 3) * HL_BROW + (i & 7) * 16, srcB[r] + (okB[r] ? kb * 64 : 0), okB[r]);
        }
        if ((GS < 4 || (kb & 1)) && hasC) {
            const int64_t g = (kb * 2 + subC) / GS;
            cp16(st + HL_A + HL_B + HL_S + tid * 16, srcC + (okC ? g * Tp : 0), okC);
        }
    };


    /* per lane: its ldmatrix row address of token tile j, plane p (lanes
     * 8 i + r: token r of the tile, 16-byte chunk i of the k-tile) */
    uint32_t boff[2][NTW];
#pragma unroll
    for (int p = 0; p < 2; p++)
#pragma unroll
        for (int j = 0; j < NTW; j++)
            boff[p][j] = HL_A + (p * BT + wn * NTW * 8 + j * 8 + (lane & 7)) * HL_BROW + (lane >> 3) * 16;

    float acc_u[MTW][NTW][4], acc[MTW][NTW][4];
#pragma unroll
    for (int m = 0; m < MTW; m++)
#pragma unroll
        for (int j = 0; j < NTW; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc_u[m][j][i] = 0.f;
                acc[m][j][i] = 0.f;
            }

    /* end of a quant group: acc += s u + b xs */
    auto flush = [&](const unsigned char *st, int sub) {
        const uint32_t *Ss = (const uint32_t *)(st + HL_A + HL_B) + (sub * I8_BMT + wm * MTW) * 16;
        const float *Cs = (const float *)(st + HL_A + HL_B + HL_S) + sub * BT + wn * NTW * 8 + 2 * tq;
        float2 xv[NTW];
#pragma unroll
        for (int j = 0; j < NTW; j++)
            xv[j] = *(const float2 *)(Cs + j * 8);
#pragma unroll
        for (int m = 0; m < MTW; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t pr = Ss[m * 16 + gq + 8 * h];
                float s, b;
                i8_sb<F16>(pr, s, b);
                if (h)
                    s = __fmul_rn(s, 0.0625f); /* rows g+8 summed 16 q */
                if (!SUBN)
                    s = __fmul_rn(s, 5.9604645e-8f); /* q, not q 2^-24: 2^-24 */
#pragma unroll
                for (int j = 0; j < NTW; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int i = 2 * h + c;
                        acc[m][j][i] = __fmaf_rn(s, acc_u[m][j][i], acc[m][j][i]);
                        acc[m][j][i] = __fmaf_rn(b, c ? xv[j].y : xv[j].x, acc[m][j][i]);
                    }
            }
    };

    auto ktile = [&](int kb, int kt) {
        const int slot = kb % I8_STAGES;
        const unsigned char *st = hl_smem + slot * HL_STAGE;
        const uint32_t stb = sbase + slot * HL_STAGE;
        const bool z = GS == 1 || (GS == 2 ? kt == 0 : (kt == 0 && !(kb & 1))); /* the group's first k-tile */
        if constexpr (WN == 1) {
            /* every m-tile's A registers once, then a token tile's B at a time */
            uint32_t a[MTW][2][4];
#pragma unroll
            for (int m = 0; m < MTW; m++) {
                const uint2 W = ((const uint2 *)st)[((wm * MTW + m) * 32 + lane) * 2 + kt];
                const uint32_t xh = W.x >> 8, yh = W.y >> 8;
                a[m][0][0] = hl_nib<SUBN>(W.x, 0x000F000Fu);
                a[m][0][1] = hl_nib<SUBN>(W.x, 0x00F000F0u);
                a[m][0][2] = hl_nib<SUBN>(xh, 0x000F000Fu);
                a[m][0][3] = hl_nib<SUBN>(xh, 0x00F000F0u);
                a[m][1][0] = hl_nib<SUBN>(W.y, 0x000F000Fu);
                a[m][1][1] = hl_nib<SUBN>(W.y, 0x00F000F0u);
                a[m][1][2] = hl_nib<SUBN>(yh, 0x000F000Fu);
                a[m][1][3] = hl_nib<SUBN>(yh, 0x00F000F0u);
            }
#pragma unroll
            for (int j = 0; j < NTW; j++) {
                uint32_t bh[4], bl[4];
                cu_ldsm_x4(bh, stb + boff[0][j] + kt * 64);
                cu_ldsm_x4(bl, stb + boff[1][j] + kt * 64);
#pragma unroll
                for (int m = 0; m < MTW; m++) {
                    float(&d)[4] = acc_u[m][j];
                    if (z)
                        hmma_z(d, a[m][0][0], a[m][0][1], a[m][0][2], a[m][0][3], bh[0], bh[1]);
                    else
                        hmma(d, a[m][0][0], a[m][0][1], a[m][0][2], a[m][0][3], bh[0], bh[1]);
                    hmma(d, a[m][0][0], a[m][0][1], a[m][0][2], a[m][0][3], bl[0], bl[1]);
                    hmma(d, a[m][1][0], a[m][1][1], a[m][1][2], a[m][1][3], bh[2], bh[3]);
                    hmma(d, a[m][1][0], a[m][1][1], a[m][1][2], a[m][1][3], bl[2], bl[3]);
                }
            }
        } else {
            /* every token tile's B registers once, then an m-tile's A at a time */
            uint32_t b[2][NTW][4];
#pragma unroll
            for (int p = 0; p < 2; p++)
#pragma unroll
                for (int j = 0; j < NTW; j++)
                    cu_ldsm_x4(b[p][j], stb + boff[p][j] + kt * 64);
#pragma unroll
            for (int m = 0; m < MTW; m++) {
                const uint2 W = ((const uint2 *)st)[((wm * MTW + m) * 32 + lane) * 2 + kt];
                const uint32_t xh = W.x >> 8, yh = W.y >> 8;
                const uint32_t a[2][4] = { { hl_nib<SUBN>(W.x, 0x000F000Fu), hl_nib<SUBN>(W.x, 0x00F000F0u),
                                             hl_nib<SUBN>(xh, 0x000F000Fu), hl_nib<SUBN>(xh, 0x00F000F0u) },
                                           { hl_nib<SUBN>(W.y, 0x000F000Fu), hl_nib<SUBN>(W.y, 0x00F000F0u),
                                             hl_nib<SUBN>(yh, 0x000F000Fu), hl_nib<SUBN>(yh, 0x00F000F0u) } };
#pragma unroll
                for (int j = 0; j < NTW; j++) {
                    float(&d)[4] = acc_u[m][j];
                    /* columns 0-15 of the k-tile: hi, then lo; then 16-31 */
                    if (z)
                        hmma_z(d, a[0][0], a[0][1], a[0][2], a[0][3], b[0][j][0], b[0][j][1]);
                    else
                        hmma(d, a[0][0], a[0][1], a[0][2], a[0][3], b[0][j][0], b[0][j][1]);
                    hmma(d, a[0][0], a[0][1], a[0][2], a[0][3], b[1][j][0], b[1][j][1]);
                    hmma(d, a[1][0], a[1][1], a[1][2], a[1][3], b[0][j][2], b[0][j][3]);
                    hmma(d, a[1][0], a[1][1], a[1][2], a[1][3], b[1][j][2], b[1][j][3]);
                }
            }
        }
        i8_group_end<GS>(kb, kt, [&](int sub) { flush(st, sub); });
    };

    i8_pipeline(KB, load_w, load_x, ktile);

#pragma unroll
    for (int j = 0; j < NTW; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int t = t0 + (wn * NTW + j) * 8 + 2 * tq + c;
            if (t >= T)
                continue;
            const float tsv = __ldg(ts + t);
#pragma unroll
            for (int m = 0; m < MTW; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t r = (mt0 + wm * MTW + m) * 16 + gq + 8 * h;
                    if (r >= rows)
                        continue;
                    const float v = __fmul_rn(acc[m][j][2 * h + c], tsv);
                    y[(size_t)t * rows + r] = bias ? __fadd_rn(v, __ldg(bias + r)) : v;
                }
        }
}

template <int GS, int WM>
sn_status hl_launch(cudaStream_t s, const cu_weight *w, const float *x, int T, float *y, void *scratch, bool staged,
                    bool sub)
{
    const hl_scr m = hl_scr_of(w, T);
    __half *planes = (__half *)scratch;
    float *xs = (float *)((char *)scratch + m.xs), *ts = (float *)((char *)scratch + m.ts);
    if (!staged) {
        (void)cu_launch(k_hl_stage<32 * GS>, dim3((unsigned)T), dim3(256), 0, s, x, T, (int64_t)w->cols, m.Tp, planes,
                        xs, ts);
        CU_CHECK_LAUNCH("matmul gemm hi/lo stage");
    }
    const int64_t nblk = (w->mt + I8_BMT - 1) / I8_BMT * ((T + HL_BT - 1) / HL_BT);
    if (nblk > INT32_MAX)
        return SN_FAIL(SN_E_UNSUPPORTED, "matmul gemm hi/lo: %lld blocks", (long long)nblk);
    auto kern = w->sfmt != CS_BF16 ? (sub ? k_gemm_hl<GS, true, true, WM> : k_gemm_hl<GS, true, false, WM>)
                                   : (sub ? k_gemm_hl<GS, false, true, WM> : k_gemm_hl<GS, false, false, WM>);
    (void)cu_launch_w(w->bits, w->rows * w->words * 4, kern, dim3((unsigned)nblk), dim3(I8_THREADS), (size_t)HL_SMEM, s,
                      (const uint4 *)w->qr, (const uint32_t *)w->sr, (const float *)w->bias, (int64_t)w->rows,
                      (int64_t)w->mt, (int64_t)w->cols, (int64_t)w->groups, (const __half *)planes, (const float *)xs,
                      m.Tp, (const float *)ts, T, y);
    CU_CHECK_LAUNCH("matmul gemm hi/lo");
    return SN_OK;
}

size_t planes_bytes(const cu_weight *w, int T, int D)
{
    return ((size_t)D * T * w->cols + 255) / 256 * 256;
}

template <int D, int GS>
sn_status i8_launch(cudaStream_t s, const cu_weight *w, const float *x, int T, float *y, void *scratch, bool staged)
{
    int8_t *planes = (int8_t *)scratch;
    float4 *gc = (float4 *)((char *)scratch + planes_bytes(w, T, D));
    if (!staged) {
        (void)cu_launch(k_i8_stage<D, 32 * GS>, dim3((unsigned)T), dim3(256), 0, s, x, T, (int64_t)w->cols, planes,
                        gc, (const float *)NULL);
        CU_CHECK_LAUNCH("matmul gemm i8 stage");
    }
    const int64_t nblk = (w->mt + I8_BMT - 1) / I8_BMT * ((T + i8cfg<D>::BT - 1) / i8cfg<D>::BT);
    if (nblk > INT32_MAX)
        return SN_FAIL(SN_E_UNSUPPORTED, "matmul gemm i8: %lld blocks", (long long)nblk);
    auto kern = w->sfmt != CS_BF16 ? k_gemm_i8<D, GS, true, false> : k_gemm_i8<D, GS, false, false>;
    (void)cu_launch_w(w->bits, w->rows * w->words * 4, kern, dim3((unsigned)nblk), dim3(I8_THREADS), (size_t)i8cfg<D>::SMEM, s, (const uint4 *)w->qr, (const uint32_t *)w->sr,
                    (const float *)w->bias, (int64_t)w->rows, (int64_t)w->mt, (int64_t)w->cols, (int64_t)w->groups,
                    (const int8_t *)planes, (const float4 *)gc, T, y, i8_seg{});
    CU_CHECK_LAUNCH("matmul gemm i8");
    return SN_OK;
}

/* ---- the expert-grouped form (MoE prefill) ---- */

/* scratch of one staged input: planes [D][N][cols], column constants
 * [groups][N] */
struct moe_scr {
    size_t planes, gc, total;
};
moe_scr moe_scr_of(int64_t N, int64_t cols, int64_t groups, int D)
{
    moe_scr m;
    m.planes = 0;
    m.gc = ((size_t)D * N * cols + 255) / 256 * 256;
    m.total = m.gc + ((size_t)groups * N * sizeof(float4) + 255) / 256 * 256 + 256;
    return m;
}

template <int D, int GS>
sn_status i8_moe_stage(cudaStream_t s, const cu_weight *w, const float *x, const float *su, int64_t N, void *scratch)
{
    const moe_scr m = moe_scr_of(N, w->cols, w->groups, D);
    char *b = (char *)scratch;
    (void)cu_launch(k_i8_stage<D, 32 * GS>, dim3((unsigned)N), dim3(256), 0, s, x, (int)N, (int64_t)w->cols,
                    (int8_t *)(b + m.planes), (float4 *)(b + m.gc), su);
    CU_CHECK_LAUNCH("moe gemm i8 stage");
    return SN_OK;
}

template <int D, int GS>
sn_status i8_moe_gemm(cudaStream_t s, const cu_weight *w, int64_t N, int64_t np, const int32_t *perm, int k,
                      const int *cnt, const int *seg_off, const int *blk_off, float *y, const void *scratch)
{
    const moe_scr m = moe_scr_of(np, w->cols, w->groups, D);
    const char *b = (const char *)scratch;
    const int64_t mte = w->rows / 16, nrb = (mte + I8_BMT - 1) / I8_BMT;
    const int64_t nblk = nrb * ((N + i8cfg<D>::BT - 1) / i8cfg<D>::BT + w->n_experts); /* a bound; the rest return */
    if (nblk > INT32_MAX)
        return SN_FAIL(SN_E_UNSUPPORTED, "moe gemm i8: %lld blocks", (long long)nblk);
    i8_seg sg;
    sg.cnt = cnt;
    sg.seg_off = seg_off;
    sg.blk_off = blk_off;
    sg.E = (int)w->n_experts;
    sg.perm = perm;
    sg.k = k;
    auto kern = w->sfmt != CS_BF16 ? k_gemm_i8<D, GS, true, true> : k_gemm_i8<D, GS, false, true>;
    (void)cu_launch(kern, dim3((unsigned)nblk), dim3(I8_THREADS), (size_t)i8cfg<D>::SMEM, s, (const uint4 *)w->qr,
                    (const uint32_t *)w->sr, (const float *)NULL, (int64_t)w->rows, mte, (int64_t)w->cols,
                    (int64_t)w->groups, (const int8_t *)(b + m.planes), (const float4 *)(b + m.gc), (int)np, y, sg);
    CU_CHECK_LAUNCH("moe gemm i8");
    return SN_OK;
}

template <typename K>
sn_status i8_smem(K kern, size_t bytes, const cu_devinfo *di)
{
    if (bytes > di->smem_optin)
        return SN_FAIL(SN_E_UNSUPPORTED, "cuda: integer GEMM needs %zu B of shared memory, device has %zu", bytes,
                       di->smem_optin);
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), "gemm i8 init");
    return SN_OK;
}

/* f(D, GS) with D (digits 2 or 3) and GS (32-column k-tiles per group: 1,
 * 2, 4 for groups of 32, 64, 128) as std::integral_constant */
template <typename F>
sn_status i8_dispatch(int digits, int group, F &&f)
{
    auto by_group = [&](auto d) -> sn_status {
        switch (group) {
        case 32: return f(d, std::integral_constant<int, 1>{});
        case 64: return f(d, std::integral_constant<int, 2>{});
        default: return f(d, std::integral_constant<int, 4>{});
        }
    };
    return digits == 2 ? by_group(std::integral_constant<int, 2>{}) : by_group(std::integral_constant<int, 3>{});
}

} // namespace

sn_status cu_gemm_i8_init(const cu_devinfo *di)
{
    SN_TRY(i8_smem(k_gemm_i8<3, 1, false, false>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 1, false, true>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 1, true, false>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 1, true, true>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 2, false, false>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 2, false, true>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 2, true, false>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 2, true, true>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 4, false, false>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 4, false, true>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 4, true, false>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<3, 4, true, true>, i8cfg<3>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 1, false, false>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 1, false, true>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 1, true, false>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 1, true, true>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 2, false, false>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 2, false, true>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 2, true, false>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 2, true, true>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 4, false, false>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 4, false, true>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 4, true, false>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_i8<2, 4, true, true>, i8cfg<2>::SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, false, true, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, false, true, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, false, false, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, false, false, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, true, true, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, true, true, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, true, false, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<1, true, false, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, false, true, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, false, true, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, false, false, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, false, false, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, true, true, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, true, true, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, true, false, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<2, true, false, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, false, true, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, false, true, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, false, false, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, false, false, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, true, true, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, true, true, 8>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, true, false, 4>, HL_SMEM, di));
    SN_TRY(i8_smem(k_gemm_hl<4, true, false, 8>, HL_SMEM, di));
    return SN_OK;
}

size_t cu_gemm_i8_scratch_bytes(const cu_weight *w, int T, int digits)
{
    if (T <= 0)
        return 0;
    if (digits == 4)
        return hl_scr_of(w, T).total;
    const int D = digits == 2 ? 2 : 3;
    return planes_bytes(w, T, D) + (size_t)w->groups * T * sizeof(float4) + 256;
}

sn_status cu_gemm_i8(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, const float *x, int T, float *y,
                     void *scratch, int digits, bool staged)
{
    if (T <= 0)
        return SN_OK;
    if (!cu_repacked_plain(w) || w->cols % 64 || (w->group != 32 && w->group != 64 && w->group != 128) ||
        w->sfmt == CS_F32)
        return SN_FAIL(SN_E_INVALID, "matmul gemm i8: weight is not a repacked Q4 matrix");
    if (digits == 4) {
        const bool sub = di->gemm_hl_sub != 0, r32 = di->gemm_hl_rows == 32;
        switch (w->group) {
        case 32: return (r32 ? hl_launch<1, 8> : hl_launch<1, 4>)(s, w, x, T, y, scratch, staged, sub);
        case 64: return (r32 ? hl_launch<2, 8> : hl_launch<2, 4>)(s, w, x, T, y, scratch, staged, sub);
        default: return (r32 ? hl_launch<4, 8> : hl_launch<4, 4>)(s, w, x, T, y, scratch, staged, sub);
        }
    }
    return i8_dispatch(digits, w->group, [&](auto D, auto GS) {
        return i8_launch<decltype(D)::value, decltype(GS)::value>(s, w, x, T, y, scratch, staged);
    });
}

bool cu_gemm_i8_moe_ok(const cu_devinfo *di, const cu_weight *w)
{
    return di->gemm_i8 && w->qr && w->sr && w->n_experts >= 1 && w->rows % 16 == 0 && w->cols % 64 == 0 &&
           (w->group == 32 || w->group == 64 || w->group == 128) && w->sfmt != CS_F32;
}

size_t cu_gemm_i8_moe_scratch_bytes(const cu_weight *w, int64_t N, int digits)
{
    return moe_scr_of(N, w->cols, w->groups, digits == 2 ? 2 : 3).total;
}

int cu_gemm_i8_moe_block_tokens(int digits)
{
    return digits == 2 ? i8cfg<2>::BT : i8cfg<3>::BT;
}

sn_status cu_gemm_i8_moe_stage(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, const float *x,
                               const float *su, int64_t N, void *scratch)
{
    if (!cu_gemm_i8_moe_ok(di, w))
        return SN_FAIL(SN_E_INVALID, "moe gemm i8: expert stack is not repacked Q4");
    if (N <= 0)
        return SN_OK;
    return i8_dispatch(di->gemm_i8, w->group, [&](auto D, auto GS) {
        return i8_moe_stage<decltype(D)::value, decltype(GS)::value>(s, w, x, su, N, scratch);
    });
}

sn_status cu_gemm_i8_moe(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, int64_t N, int64_t np,
                         const int32_t *perm, int k, const int *cnt, const int *seg_off, const int *blk_off, float *y,
                         const void *scratch)
{
    if (!cu_gemm_i8_moe_ok(di, w))
        return SN_FAIL(SN_E_INVALID, "moe gemm i8: expert stack is not repacked Q4");
    if (N <= 0)
        return SN_OK;
    return i8_dispatch(di->gemm_i8, w->group, [&](auto D, auto GS) {
        return i8_moe_gemm<decltype(D)::value, decltype(GS)::value>(s, w, N, np, perm, k, cnt, seg_off, blk_off, y,
                                                                    scratch);
    });
}
