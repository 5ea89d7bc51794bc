/* Prefill kernels (issue 6): the chunked GatedDeltaNet delta rule and a
 * tensor-core causal flash attention. cu_gdn and cu_attention (cuda_ops.cu)
 * call in here for T >= the threshold; below it, and with
 * SANCTUM_CUDA_PREFILL=old, the kernels of cuda_ops.cu run as before.
 *
 * Chunked delta rule (chunk 64; WY/UT form, see
 * /work/shared/docs/architecture.md 2.2). Per value head and chunk of n <= 64
 * tokens (rows past n are zero: k = q = v = 0, beta = 0, decay 1), with
 * G_i = sum_{m<=i} log(decay_m) (prefix sums in double, so exp(G_i - G_j)
 * keeps fp32 accuracy for long strongly decaying chunks; log(0) clamps to
 * -200, whose exp is 0 in fp32 as the serial product would be):
 *   A_ij  = beta_i exp(G_i - G_j) k_i.k_j     (j < i)
 *   (I + A) [U | W] = [beta v | beta exp(G) k]   (forward substitution)
 *   Ai_ij = exp(G_i - G_j) q_i.k_j            (j <= i)
 * kernel A (k_pf_gdn_prep, parallel over heads x chunks) forms U (written
 * into out), W, Ai and exp(G), exp(G_last - G); kernel B (k_pf_gdn_state,
 * one block per value head and 32 state columns, chunks in order) carries
 * S [Dk, 32] in shared memory:
 *   Vn = U - W S;  O = exp(G) (Q S) + Ai Vn;  S = exp(G_last) S + (exp(G_last - G) K)^T Vn.
 * Everything is fp32 (SIMT) except the prefix sums (kernel B has a 3xTF32
 * tensor-core form for Dk % 32 == 0, Dk <= 128, Dv % 32 == 0, the default;
 * SANCTUM_CUDA_GDN_TC=0 keeps the SIMT one); tests/test_cuda_prefill.c
 * checks the same decomposition in C against the token-serial recurrence
 * (worst rel 1.3e-6) and the kernels against the CPU oracle (bound 2e-5).
 *
 * Flash attention: one block per (64 or 128 queries, query head); the
 * block's key/value head is indexed, never copied (GQA). Each warp owns 16
 * query rows; S = Q K^T and O += P V run on mma.sync m16n8k16 (fp16 in,
 * fp32 accumulate) with operands split into fp16 hi + lo parts:
 *   S = Qh.Kh + (Qh.Kl' + Ql'.Kh) / 2^11     (lo' = (x - hi) * 2^11, own accumulator)
 *   O += Ph.Vh + Ph.Vl + Pl.Vh               (P scaled by 2^15 into fp16's normal range)
 * which keeps ~22 significant bits of every operand; the online softmax
 * (max, rescale, row sums) is fp32. K and V tiles are read from the fp32
 * cache and converted in shared memory (V transposed). Limits: |q*scale|,
 * |k|, |v| < 65504 (fp16 range), head_dim <= 256. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/sn_cuda.h"

namespace {

/* ---- switches: SANCTUM_CUDA_PREFILL=old|new|gdn|attn, SANCTUM_CUDA_PREFILL_MIN_T=N ---- */
int g_mode = -1;  /* SN_CUDA_PREFILL_*; -1: not read yet */
int g_min_t = 64;
bool g_attn_ok[3]; /* per head-dim class (64, 128, 256): shared memory limit raised */
bool g_gdn_ok = true;
bool g_gdn_tc_ok = false; /* kernel B's tensor-core form: shared memory limit raised */
bool g_gdn_tc_on = true;  /* SANCTUM_CUDA_GDN_TC=0 keeps the SIMT form */

/* The three variables, each into its setting when its value is one it
 * takes (left as given otherwise); the first malformed one is the error.
 * One parser for the backend's check at creation and the lazy read. */
sn_status pf_parse_env(int *mode, int *min_t, bool *tc_on)
{
    sn_status st = SN_OK;
    const char *e = getenv("SANCTUM_CUDA_PREFILL");
    if (e) {
        if (!strcmp(e, "new")) *mode = SN_CUDA_PREFILL_NEW;
        else if (!strcmp(e, "old")) *mode = SN_CUDA_PREFILL_OLD;
        else if (!strcmp(e, "gdn")) *mode = SN_CUDA_PREFILL_GDN;
        else if (!strcmp(e, "attn")) *mode = SN_CUDA_PREFILL_ATTN;
        else
            st = SN_FAIL(SN_E_INVALID,
                         "SANCTUM_CUDA_PREFILL=%s: want new (default: chunked GatedDeltaNet and flash attention), "
                         "old, gdn or attn",
                         e);
    }
    const char *tc = getenv("SANCTUM_CUDA_GDN_TC");
    if (tc) {
        if (!strcmp(tc, "0") || !strcmp(tc, "1")) *tc_on = tc[0] == '1';
        else if (st == SN_OK) st = SN_FAIL(SN_E_INVALID, "SANCTUM_CUDA_GDN_TC=%s: want 0 or 1 (default)", tc);
    }
    const char *t = getenv("SANCTUM_CUDA_PREFILL_MIN_T");
    if (t) {
        char *end = NULL;
        const long v = strtol(t, &end, 10);
        if (end != t && !*end && v >= 1 && v <= INT_MAX) *min_t = (int)v;
        else if (st == SN_OK)
            st = SN_FAIL(SN_E_INVALID, "SANCTUM_CUDA_PREFILL_MIN_T=%s: want an integer >= 1 (default 64)", t);
    }
    return st;
}

void pf_read_env()
{
    if (g_mode >= 0)
        return;
    g_mode = SN_CUDA_PREFILL_NEW;
    if (pf_parse_env(&g_mode, &g_min_t, &g_gdn_tc_on) != SN_OK)
        sn_clear_error(); /* refused at the backend's creation (cu_pf_env_check) */
}

bool gdn_on() { pf_read_env(); return g_mode == SN_CUDA_PREFILL_NEW || g_mode == SN_CUDA_PREFILL_GDN; }
bool attn_on() { pf_read_env(); return g_mode == SN_CUDA_PREFILL_NEW || g_mode == SN_CUDA_PREFILL_ATTN; }

/* ------------------------------------------------------------------------ */
/* Chunked GatedDeltaNet                                                     */
/* ------------------------------------------------------------------------ */

constexpr int GC = 64;         /* chunk */
constexpr int GA_THREADS = 256;
constexpr int GB_NC = 32;      /* state columns per block of kernel B */
constexpr int GB_THREADS = 256;
constexpr int GDN_MAX_DK = 256, GDN_MAX_DV = 512;

/* Kernel A's shared rows: K and Q rows of prep_ldk(Dk) floats (a multiple of
 * 4, and 4 mod 32 for Dk % 32 == 0, so the 16 different rows a warp reads
 * as float4 at one d fall in distinct banks), L rows of GA_LS floats (16-byte
 * aligned for the substitution's float4 reads; 80 = 16 mod 32, so the two
 * rows a warp writes at once do not share banks). */
constexpr int GA_LS = 80;
__host__ __device__ __forceinline__ int prep_ldk(int Dk) { return ((Dk + 3) & ~3) + 4; }

size_t gdn_prep_smem(int Dk)
{
    return sizeof(double) * GC +
           sizeof(float) * (2 * (size_t)GC * prep_ldk(Dk) + (size_t)GC * GA_LS + 2 * GC);
}

__host__ __device__ __forceinline__ int round32(int x) { return (x + 31) & ~31; }

size_t gdn_state_smem(int Dk)
{
    return sizeof(float) * ((size_t)round32(Dk) * 33 + (size_t)GC * (GC + 1) + 2 * (size_t)GC * (Dk + 1) +
                            (size_t)GC * 33 + 2 * GC);
}

/* Kernel A. Block (value head hv, chunk ch), 256 threads.
 * c: conv output [T, C] (q | k | v, q/k normalised); beta, decay [T, Hv].
 * Writes U into out [T, Hv, Dv], W [T, Hv, Dk], Ai [Hv, nch, 64, 64],
 * gk [Hv, nch, 128] = (exp(G_i), exp(G_63 - G_i)). */
template <int DK> /* 128 (the models' key heads: the loops over it unroll) or 0 (Dk at run time) */
__global__ void __launch_bounds__(GA_THREADS)
k_pf_gdn_prep(const float *__restrict__ c, const float *__restrict__ beta, const float *__restrict__ decay, int Hk,
              int Hv, int dk, int Dv, int T, float *__restrict__ U, float *__restrict__ W, float *__restrict__ Ai,
              float *__restrict__ gk)
{
    const int Dk = DK ? DK : dk;
    extern __shared__ double pf_shd[];
    double *Gd = pf_shd;
    const int ldk = prep_ldk(Dk);
    float *Ks = (float *)(Gd + GC), *Qs = Ks + GC * ldk, *Lm = Qs + GC * ldk, *bt = Lm + GC * GA_LS, *gam = bt + GC;
    const int hv = blockIdx.x, ch = blockIdx.y, nch = gridDim.y, hk = hv / (Hv / Hk);
    const int t0 = ch * GC, n = min(GC, T - t0);
    const int key_dim = Hk * Dk, C = 2 * key_dim + Hv * Dv;
    const int tid = threadIdx.x;
    if (tid < GC) {
        float g = 0.f, b = 0.f;
        if (tid < n) {
            g = logf(decay[(size_t)(t0 + tid) * Hv + hv]);
            if (!(g > -200.f))
                g = -200.f;
            b = beta[(size_t)(t0 + tid) * Hv + hv];
        }
        bt[tid] = b;
        gam[tid] = g; /* the log decay until the prefix sum below */
    }
    for (int e = tid; e < GC * Dk; e += GA_THREADS) {
        int r = e / Dk, d = e - r * Dk;
        bool ok = r < n;
        const float *ct = c + (size_t)(t0 + (ok ? r : 0)) * C;
        Ks[r * ldk + d] = ok ? ct[key_dim + hk * Dk + d] : 0.f;
        Qs[r * ldk + d] = ok ? ct[hk * Dk + d] : 0.f;
    }
    __syncthreads();
    if (tid == 0) {
        double a = 0.0;
        for (int i = 0; i < GC; i++) {
            a += (double)gam[i];
            Gd[i] = a;
        }
    }
    __syncthreads();
    float *gkb = gk + ((size_t)hv * nch + ch) * 2 * GC;
    if (tid < GC) {
        float gm = expf((float)Gd[tid]);
        gam[tid] = gm;
        gkb[tid] = gm;
        gkb[GC + tid] = expf((float)(Gd[GC - 1] - Gd[tid]));
    }
    /* K K^T and Q K^T, 4x4 per thread: rows ti + 16 r, columns tj + 16 c */
    const int ti = tid >> 4, tj = tid & 15;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int cc = 0; cc < 4; cc++)
            kk[r][cc] = qk[r][cc] = 0.f;
    /* d ascending in every sum, four d per float4 load (the scalar tail for Dk % 4) */
    auto kq_step = [&](const float (&ki)[4], const float (&qi)[4], const float (&kj)[4]) {
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                kk[r][cc] = fmaf(ki[r], kj[cc], kk[r][cc]);
                qk[r][cc] = fmaf(qi[r], kj[cc], qk[r][cc]);
            }
    };
    const int Dk4 = Dk & ~3;
    for (int d = 0; d < Dk4; d += 4) {
        alignas(16) float ki4[4][4], qi4[4][4], kj4[4][4]; /* [r][d offset]; rows written as float4 */
#pragma unroll
        for (int r = 0; r < 4; r++) {
            *(float4 *)ki4[r] = *(const float4 *)&Ks[(ti + 16 * r) * ldk + d];
            *(float4 *)qi4[r] = *(const float4 *)&Qs[(ti + 16 * r) * ldk + d];
            *(float4 *)kj4[r] = *(const float4 *)&Ks[(tj + 16 * r) * ldk + d];
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float ki[4], qi[4], kj[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                ki[r] = ki4[r][e];
                qi[r] = qi4[r][e];
                kj[r] = kj4[r][e];
            }
            kq_step(ki, qi, kj);
        }
    }
    for (int d = Dk4; d < Dk; d++) {
        float ki[4], qi[4], kj[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            ki[r] = Ks[(ti + 16 * r) * ldk + d];
            qi[r] = Qs[(ti + 16 * r) * ldk + d];
            kj[r] = Ks[(tj + 16 * r) * ldk + d];
        }
        kq_step(ki, qi, kj);
    }
    float *Aib = Ai + ((size_t)hv * nch + ch) * GC * GC;
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int cc = 0; cc < 4; cc++) {
            int i = ti + 16 * r, j = tj + 16 * cc;
            float e = expf((float)(Gd[i] - Gd[j]));
            Lm[i * GA_LS + j] = j < i ? bt[i] * e * kk[r][cc] : 0.f;
            Aib[i * GC + j] = j <= i ? e * qk[r][cc] : 0.f;
        }
    __syncthreads();
    /* (I + A) X = RHS by forward substitution, one column per thread:
     * columns [0, Dv) give U (RHS beta v), [Dv, Dv + Dk) give W (beta exp(G) k). */
    for (int col = tid; col < Dv + Dk; col += GA_THREADS) {
        float x[GC];
        if (col < Dv) {
            const float *vp = c + 2 * (size_t)key_dim + (size_t)hv * Dv + col;
#pragma unroll
            for (int i = 0; i < GC; i++)
                x[i] = i < n ? bt[i] * vp[(size_t)(t0 + i) * C] : 0.f;
        } else {
            int d = col - Dv;
#pragma unroll
            for (int i = 0; i < GC; i++)
                x[i] = bt[i] * gam[i] * Ks[i * ldk + d];
        }
        /* j ascending as before; L's row read four entries at a time (the same value in every lane) */
#pragma unroll
        for (int i = 1; i < GC; i++)
#pragma unroll
            for (int j4 = 0; j4 < i; j4 += 4) {
                const float4 l = *(const float4 *)&Lm[i * GA_LS + j4];
                x[i] = fmaf(-l.x, x[j4], x[i]);
                if (j4 + 1 < i)
                    x[i] = fmaf(-l.y, x[j4 + 1], x[i]);
                if (j4 + 2 < i)
                    x[i] = fmaf(-l.z, x[j4 + 2], x[i]);
                if (j4 + 3 < i)
                    x[i] = fmaf(-l.w, x[j4 + 3], x[i]);
            }
        if (col < Dv) {
#pragma unroll
            for (int i = 0; i < GC; i++)
                if (i < n)
                    U[((size_t)(t0 + i) * Hv + hv) * Dv + col] = x[i];
        } else {
            int d = col - Dv;
#pragma unroll
            for (int i = 0; i < GC; i++)
                if (i < n)
                    W[((size_t)(t0 + i) * Hv + hv) * Dk + d] = x[i];
        }
    }
}

/* Kernel B. Block (value head hv, columns col0 .. col0+31 of Dv), 256
 * threads, the chunks in order. out holds U on entry (kernel A) and O on
 * exit, each element read then written by the same thread. Per chunk two
 * loads: W and Q whole, then K whole (into Q's buffer, while O is formed).
 * Thread maps: (ty = tid / 8, tx = tid % 8) own rows {ty, ty+32} x columns
 * {tx + 8c} of the chunk's 64 x 32 outputs; for the state update
 * (lane, warp) own state rows db + lane x columns {warp + 8m}. */
__global__ void __launch_bounds__(GB_THREADS)
k_pf_gdn_state(const float *__restrict__ c, float *__restrict__ S, int Hk, int Hv, int Dk, int Dv, int T,
               float *__restrict__ out, const float *__restrict__ W, const float *__restrict__ Ai,
               const float *__restrict__ gk)
{
    extern __shared__ float pf_shf[];
    const int Dkp = round32(Dk), ldk = Dk + 1;
    float *Ss = pf_shf, *As = Ss + Dkp * 33, *Wf = As + GC * (GC + 1), *Qf = Wf + GC * ldk, *Vs = Qf + GC * ldk,
          *gam = Vs + GC * 33, *kdec = gam + GC;
    const int hv = blockIdx.x, col0 = blockIdx.y * GB_NC, hk = hv / (Hv / Hk);
    const int tid = threadIdx.x, ty = tid >> 3, tx = tid & 7, lane = tid & 31, wp = tid >> 5;
    const int key_dim = Hk * Dk, C = 2 * key_dim + Hv * Dv;
    const int nch = (T + GC - 1) / GC;
    float *Sh = S + (size_t)hv * Dk * Dv;
    for (int e = tid; e < Dkp * GB_NC; e += GB_THREADS) {
        int d = e >> 5, cc = e & 31;
        Ss[d * 33 + cc] = (d < Dk && col0 + cc < Dv) ? Sh[(size_t)d * Dv + col0 + cc] : 0.f;
    }
    for (int ch = 0; ch < nch; ch++) {
        const int t0 = ch * GC, n = min(GC, T - t0);
        __syncthreads(); /* the previous chunk is done with every buffer */
        const float *Aib = Ai + ((size_t)hv * nch + ch) * GC * GC;
        for (int e = tid; e < GC * GC; e += GB_THREADS)
            As[(e >> 6) * (GC + 1) + (e & 63)] = Aib[e];
        if (tid < GC) {
            gam[tid] = gk[((size_t)hv * nch + ch) * 2 * GC + tid];
            kdec[tid] = gk[((size_t)hv * nch + ch) * 2 * GC + GC + tid];
        }
        for (int e = tid; e < GC * Dk; e += GB_THREADS) {
            int i = e / Dk, x = e - i * Dk;
            bool ok = i < n;
            size_t t = (size_t)(t0 + (ok ? i : 0));
            Wf[i * ldk + x] = ok ? W[(t * Hv + hv) * Dk + x] : 0.f;
            Qf[i * ldk + x] = ok ? c[t * C + (size_t)hk * Dk + x] : 0.f;
        }
        float accV[2][4], accO[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                int row = ty + 32 * r, col = col0 + tx + 8 * cc;
                accV[r][cc] = (row < n && col < Dv) ? out[((size_t)(t0 + row) * Hv + hv) * Dv + col] : 0.f;
                accO[r][cc] = 0.f;
            }
        __syncthreads();
        /* Vn = U - W S and Q S */
#pragma unroll 4
        for (int x = 0; x < Dk; x++) {
            float w0 = Wf[ty * ldk + x], w1 = Wf[(ty + 32) * ldk + x];
            float q0 = Qf[ty * ldk + x], q1 = Qf[(ty + 32) * ldk + x];
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                float sv = Ss[x * 33 + tx + 8 * cc];
                accV[0][cc] = fmaf(-w0, sv, accV[0][cc]);
                accV[1][cc] = fmaf(-w1, sv, accV[1][cc]);
                accO[0][cc] = fmaf(q0, sv, accO[0][cc]);
                accO[1][cc] = fmaf(q1, sv, accO[1][cc]);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int cc = 0; cc < 4; cc++)
                Vs[(ty + 32 * r) * 33 + tx + 8 * cc] = accV[r][cc];
        __syncthreads(); /* Vs complete; Wf, Qf no longer read */
        /* exp(G_last - G) K into Qf for the state update */
        for (int e = tid; e < GC * Dk; e += GB_THREADS) {
            int i = e / Dk, x = e - i * Dk;
            bool ok = i < n;
            size_t t = (size_t)(t0 + (ok ? i : 0));
            Qf[i * ldk + x] = ok ? kdec[i] * c[t * C + key_dim + (size_t)hk * Dk + x] : 0.f;
        }
        /* O = exp(G) (Q S) + Ai Vn */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = ty + 32 * r;
            float o[4];
#pragma unroll
            for (int cc = 0; cc < 4; cc++)
                o[cc] = gam[row] * accO[r][cc];
            for (int j = 0; j < GC; j++) {
                float a = As[row * (GC + 1) + j];
#pragma unroll
                for (int cc = 0; cc < 4; cc++)
                    o[cc] = fmaf(a, Vs[j * 33 + tx + 8 * cc], o[cc]);
            }
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                int col = col0 + tx + 8 * cc;
                if (row < n && col < Dv)
                    out[((size_t)(t0 + row) * Hv + hv) * Dv + col] = o[cc];
            }
        }
        __syncthreads(); /* K complete */
        /* S = exp(G_last) S + (exp(G_last - G) K)^T Vn */
        const float glast = gam[GC - 1];
        for (int db = 0; db < Dkp; db += 32) {
            const int d = db + lane;
            if (d >= Dk)
                break;
            float acc[4] = { 0.f, 0.f, 0.f, 0.f };
            for (int j = 0; j < GC; j++) {
                float kv = Qf[j * ldk + d];
#pragma unroll
                for (int m = 0; m < 4; m++)
                    acc[m] = fmaf(kv, Vs[j * 33 + wp + 8 * m], acc[m]);
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                float *sp = Ss + d * 33 + wp + 8 * m;
                *sp = fmaf(glast, *sp, acc[m]);
            }
        }
    }
    __syncthreads();
    for (int e = tid; e < Dkp * GB_NC; e += GB_THREADS) {
        int d = e >> 5, cc = e & 31;
        if (d < Dk && col0 + cc < Dv)
            Sh[(size_t)d * Dv + col0 + cc] = Ss[d * 33 + cc];
    }
}


/* Kernel B on the tensor cores (Dk % 32 == 0, Dk <= 128, Dv % 32 == 0):
 * the same block (value head, 32 state columns), chunk order and
 * decomposition, with the four products per chunk on mma.sync m16n8k8
 * tf32 in the 3xTF32 form (x = hi + lo, both tf32; a.b = al.bh + ah.bl +
 * ah.bh, fp32 accumulate: ~22 significant bits per operand, the dropped
 * al.bl is ~2^-22 relative). Per chunk:
 *   warps 0-3: Vn rows 16w.. = U - W S (into Vh/Vl, split); warps 4-7: Q S (kept);
 *   then warps 4-7: O = exp(G) (Q S) + Ai Vn, and every warp a share of
 *   S = exp(G_last) S + (exp(G_last - G) K)^T Vn (warps 0-3 take two of
 *   every three S tiles: 4-7 also form O).
 * Shared strides are chosen so fragment loads hit 32 distinct banks: rows
 * read as A (W, Q, Ai) are 4 floats past a multiple of 32, rows read as B
 * or transposed (S, Vn, K) 8 past. */
constexpr int TC_LDS = GB_NC + 8; /* S, Vn */
constexpr int TC_LDA = GC + 4;    /* Ai */

/* S as fp32 and as its tf32 hi / lo split, Ai, W, Q, K, Vn as its split, the gates */
__host__ __device__ __forceinline__ size_t gdn_state_tc_smem(int Dk)
{
    return sizeof(float) * (3 * (size_t)Dk * TC_LDS + (size_t)GC * TC_LDA + 2 * (size_t)GC * (Dk + 4) +
                            (size_t)GC * (Dk + 8) + 2 * (size_t)GC * TC_LDS + 2 * GC);
}

__device__ __forceinline__ void tf32_split(float a, uint32_t &hi, uint32_t &lo)
{
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(a));
    const float r = a - __uint_as_float(hi);
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(r));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += A B for one 16x8x8 step: A as fp32 fragment values (row g / g+8,
 * column t / t+4), B as b0 (k = t), b1 (k = t + 4) of column g */
struct tc_a {
    uint32_t h[4], l[4];
};
__device__ __forceinline__ tc_a tc_split_a(float a0, float a1, float a2, float a3)
{
    tc_a r;
    tf32_split(a0, r.h[0], r.l[0]);
    tf32_split(a1, r.h[1], r.l[1]);
    tf32_split(a2, r.h[2], r.l[2]);
    tf32_split(a3, r.h[3], r.l[3]);
    return r;
}
/* 3xTF32 with B already split (tc_put: the splits of values that several
 * warps or steps read are made once, where the value is written): the
 * hi.hi product into d, the two corrections into e (two accumulators, so
 * the three MMAs of a step are not one dependent chain; d + e is formed
 * once at the end) */
__device__ __forceinline__ void tc_mma3s(float (&d)[4], float (&e)[4], const tc_a &a, uint32_t bh0, uint32_t bl0,
                                         uint32_t bh1, uint32_t bl1)
{
    mma_tf32(e, a.l, bh0, bh1);
    mma_tf32(d, a.h, bh0, bh1);
    mma_tf32(e, a.h, bl0, bl1);
}
/* v into shared fp32 (f, when given) and its tf32 hi / lo at index i */
__device__ __forceinline__ void tc_put(float *f, uint32_t *hi, uint32_t *lo, int i, float v)
{
    if (f)
        f[i] = v;
    uint32_t h, l;
    tf32_split(v, h, l);
    hi[i] = h;
    lo[i] = l;
}

__device__ __forceinline__ void cpa16(float *dst, const float *src, bool ok)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cpa_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

/* DK (32, 64, 96 or 128) at compile time: the loops over it unroll and the
 * staging's index splits are shifts (with Dk at run time a quarter of the
 * kernel's instructions were integer multiplies, s17r2's SASS) */
template <int DK>
__global__ void __launch_bounds__(GB_THREADS, 1)
k_pf_gdn_state_tc(const float *__restrict__ c, float *__restrict__ S, int Hk, int Hv, int Dv, int T,
                  float *__restrict__ out, const float *__restrict__ W, const float *__restrict__ Ai,
                  const float *__restrict__ gk)
{
    constexpr int Dk = DK;
    extern __shared__ __align__(16) float pf_tc[];
    constexpr int LDQ = Dk + 4, LDK = Dk + 8;
    /* S is read as the B operand of phase 1 by every warp and Vn by O and
     * the S update: both are kept split (hi Shi / Vh, lo Slo / Vl) as written */
    float *Ss = pf_tc, *As = Ss + Dk * TC_LDS, *Wf = As + GC * TC_LDA, *Qf = Wf + GC * LDQ, *Kf = Qf + GC * LDQ;
    uint32_t *Vh = (uint32_t *)(Kf + GC * LDK), *Vl = Vh + GC * TC_LDS, *Shi = Vl + GC * TC_LDS,
             *Slo = Shi + Dk * TC_LDS;
    float *gam = (float *)(Slo + Dk * TC_LDS), *kdec = gam + GC;
    const int hv = blockIdx.x, col0 = blockIdx.y * GB_NC, hk = hv / (Hv / Hk);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    const int key_dim = Hk * Dk, C = 2 * key_dim + Hv * Dv;
    const int nch = (T + GC - 1) / GC;
    constexpr int npc = Dk / 16 * 2, d4n = Dk / 4;
    float *Sh = S + (size_t)hv * Dk * Dv;
    for (int e = tid; e < Dk * GB_NC; e += GB_THREADS) {
        const int d = e / GB_NC, cc = e % GB_NC;
        tc_put(Ss, Shi, Slo, d * TC_LDS + cc, Sh[(size_t)d * Dv + col0 + cc]);
    }
    /* staging by cp.async in two groups per chunk: W and Q (needed first;
     * issued while the previous chunk finishes), then K, Ai and the gates
     * (issued at the chunk's start, landing under the first product);
     * rows past the chunk's end read as zeros */
    auto stage_wq = [&](int ch) {
        const int t0 = ch * GC, n = min(GC, T - t0);
        for (int e = tid; e < GC * d4n; e += GB_THREADS) {
            const int i = e / d4n, x = 4 * (e % d4n);
            const bool ok = i < n;
            const size_t tt = (size_t)(t0 + (ok ? i : 0));
            cpa16(Wf + i * LDQ + x, W + (tt * Hv + hv) * Dk + x, ok);
            cpa16(Qf + i * LDQ + x, c + tt * C + (size_t)hk * Dk + x, ok);
        }
        cpa_commit();
    };
    auto stage_k = [&](int ch) {
        const int t0 = ch * GC, n = min(GC, T - t0);
        for (int e = tid; e < GC * d4n; e += GB_THREADS) {
            const int i = e / d4n, x = 4 * (e % d4n);
            const bool ok = i < n;
            const size_t tt = (size_t)(t0 + (ok ? i : 0));
            cpa16(Kf + i * LDK + x, c + tt * C + key_dim + (size_t)hk * Dk + x, ok);
        }
        const float *Aib = Ai + ((size_t)hv * nch + ch) * GC * GC;
        for (int e = tid; e < GC * GC / 4; e += GB_THREADS) {
            const int i = e / (GC / 4), j4 = e % (GC / 4);
            cpa16(As + i * TC_LDA + 4 * j4, Aib + 4 * e, true);
        }
        if (tid < 2 * GC / 4) /* gam then kdec: 128 floats, contiguous in gk as in shared memory */
            cpa16(gam + 4 * tid, gk + ((size_t)hv * nch + ch) * 2 * GC + 4 * tid, true);
        cpa_commit();
    };
    const int mt = w & 3; /* phase 1 and O: rows 16 mt .. */
    const bool isq = w >= 4;
    const int r0 = 16 * mt + g, r1 = r0 + 8;
    /* phase 1's accumulators start from U (warps 0-3) or zeros (4-7), rows
     * r0, r0 + 8; the next chunk's U is loaded during this chunk's phase 2 */
    float2 un[4][2];
    auto load_u = [&](int ch) {
        const int t0 = ch * GC, n = min(GC, T - t0);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int cl = col0 + 8 * nt + 2 * t;
            un[nt][0] = un[nt][1] = make_float2(0.f, 0.f);
            if (!isq && r0 < n)
                un[nt][0] = *(const float2 *)(out + ((size_t)(t0 + r0) * Hv + hv) * Dv + cl);
            if (!isq && r1 < n)
                un[nt][1] = *(const float2 *)(out + ((size_t)(t0 + r1) * Hv + hv) * Dv + cl);
        }
    };
    stage_wq(0);
    load_u(0);
    for (int ch = 0; ch < nch; ch++) {
        const int t0 = ch * GC, n = min(GC, T - t0);
        __syncthreads(); /* the previous chunk is done with K, Ai, the gates and S */
        stage_k(ch);
        float acc[4][4], cor[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            acc[nt][0] = un[nt][0].x;
            acc[nt][1] = un[nt][0].y;
            acc[nt][2] = un[nt][1].x;
            acc[nt][3] = un[nt][1].y;
#pragma unroll
            for (int i = 0; i < 4; i++)
                cor[nt][i] = 0.f;
        }
        cpa_wait1(); /* W and Q of this chunk landed (this thread's copies) */
        __syncthreads(); /* ... and every thread's */
        {
            const float *Af = isq ? Qf : Wf;
            const float sg = isq ? 1.f : -1.f; /* Vn = U - W S */
#pragma unroll
            for (int k0 = 0; k0 < Dk; k0 += 8) {
                const tc_a a = tc_split_a(sg * Af[r0 * LDQ + k0 + t], sg * Af[r1 * LDQ + k0 + t],
                                          sg * Af[r0 * LDQ + k0 + t + 4], sg * Af[r1 * LDQ + k0 + t + 4]);
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int i0 = (k0 + t) * TC_LDS + 8 * nt + g, i1 = i0 + 4 * TC_LDS;
                    tc_mma3s(acc[nt], cor[nt], a, Shi[i0], Slo[i0], Shi[i1], Slo[i1]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[nt][i] += cor[nt][i];
        }
        if (!isq) {
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int cl = 8 * nt + 2 * t;
                tc_put(nullptr, Vh, Vl, r0 * TC_LDS + cl, acc[nt][0]);
                tc_put(nullptr, Vh, Vl, r0 * TC_LDS + cl + 1, acc[nt][1]);
                tc_put(nullptr, Vh, Vl, r1 * TC_LDS + cl, acc[nt][2]);
                tc_put(nullptr, Vh, Vl, r1 * TC_LDS + cl + 1, acc[nt][3]);
            }
        }
        __syncthreads(); /* Vn complete; W, Q and S (as an operand) free */
        if (ch + 1 < nch) {
            stage_wq(ch + 1);
            load_u(ch + 1); /* rows of the next chunk: this chunk's O does not write them */
        } else {
            cpa_commit(); /* an empty group keeps the wait counts */
        }
        cpa_wait1(); /* K, Ai and the gates of this chunk */
        __syncthreads();
        if (isq) {
            /* O = exp(G) (Q S) + Ai Vn */
            const float g0 = gam[r0], g1 = gam[r1];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                acc[nt][0] *= g0;
                acc[nt][1] *= g0;
                acc[nt][2] *= g1;
                acc[nt][3] *= g1;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    cor[nt][i] = 0.f;
            }
#pragma unroll
            for (int j0 = 0; j0 < GC; j0 += 8) {
                const tc_a a = tc_split_a(As[r0 * TC_LDA + j0 + t], As[r1 * TC_LDA + j0 + t],
                                          As[r0 * TC_LDA + j0 + t + 4], As[r1 * TC_LDA + j0 + t + 4]);
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int i0 = (j0 + t) * TC_LDS + 8 * nt + g, i1 = i0 + 4 * TC_LDS;
                    tc_mma3s(acc[nt], cor[nt], a, Vh[i0], Vl[i0], Vh[i1], Vl[i1]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int cl = col0 + 8 * nt + 2 * t;
                if (r0 < n)
                    *(float2 *)(out + ((size_t)(t0 + r0) * Hv + hv) * Dv + cl) =
                        make_float2(acc[nt][0] + cor[nt][0], acc[nt][1] + cor[nt][1]);
                if (r1 < n)
                    *(float2 *)(out + ((size_t)(t0 + r1) * Hv + hv) * Dv + cl) =
                        make_float2(acc[nt][2] + cor[nt][2], acc[nt][3] + cor[nt][3]);
            }
        }
        /* S = exp(G_last) S + (exp(G_last - G) K)^T Vn in pieces of 16 state
         * rows x 16 columns (two n-tiles sharing one A fragment); warps 0-3
         * take three of every four pieces (4-7 also form O) */
        const float glast = gam[GC - 1];
        for (int pc = 0; pc < npc; pc++) {
            const int sl = pc % 16, owner = sl < 12 ? sl / 3 : 4 + (sl - 12);
            if (owner != w)
                continue;
            const int d0 = 16 * (pc / 2) + g, d1 = d0 + 8, nb = 2 * (pc % 2);
            float sa[2][4], sc[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int cl = 8 * (nb + h) + 2 * t;
                sa[h][0] = glast * Ss[d0 * TC_LDS + cl];
                sa[h][1] = glast * Ss[d0 * TC_LDS + cl + 1];
                sa[h][2] = glast * Ss[d1 * TC_LDS + cl];
                sa[h][3] = glast * Ss[d1 * TC_LDS + cl + 1];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    sc[h][i] = 0.f;
            }
#pragma unroll
            for (int j0 = 0; j0 < GC; j0 += 8) {
                const float e0 = kdec[j0 + t], e1 = kdec[j0 + t + 4];
                const tc_a a = tc_split_a(e0 * Kf[(j0 + t) * LDK + d0], e0 * Kf[(j0 + t) * LDK + d1],
                                          e1 * Kf[(j0 + t + 4) * LDK + d0], e1 * Kf[(j0 + t + 4) * LDK + d1]);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i0 = (j0 + t) * TC_LDS + 8 * (nb + h) + g, i1 = i0 + 4 * TC_LDS;
                    tc_mma3s(sa[h], sc[h], a, Vh[i0], Vl[i0], Vh[i1], Vl[i1]);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int cl = 8 * (nb + h) + 2 * t;
                tc_put(Ss, Shi, Slo, d0 * TC_LDS + cl, sa[h][0] + sc[h][0]);
                tc_put(Ss, Shi, Slo, d0 * TC_LDS + cl + 1, sa[h][1] + sc[h][1]);
                tc_put(Ss, Shi, Slo, d1 * TC_LDS + cl, sa[h][2] + sc[h][2]);
                tc_put(Ss, Shi, Slo, d1 * TC_LDS + cl + 1, sa[h][3] + sc[h][3]);
            }
        }
    }
    __syncthreads();
    for (int e = tid; e < Dk * GB_NC; e += GB_THREADS) {
        const int d = e / GB_NC, cc = e % GB_NC;
        Sh[(size_t)d * Dv + col0 + cc] = Ss[d * TC_LDS + cc];
    }
}

/* ------------------------------------------------------------------------ */
/* Flash attention on tensor cores                                           */
/* ------------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t pack2(__half lo, __half hi)
{
    __half2 h = __halves2half2(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint32_t ld32(const __half *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* cu_ldsm_x4 from a shared pointer */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half *p)
{
    cu_ldsm_x4(r, (uint32_t)__cvta_generic_to_shared(p));
}

/* d += a (16x16, row) * b (16x8, col), fp16 in, fp32 accumulate */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D, int BK, int NW>
struct fa_cfg {
    static constexpr int BQ = 16 * NW, LDQ = D + 8, LDK = D + 8, LDV = BK + 8;
    static constexpr size_t smem = sizeof(__half) * (2 * (size_t)BQ * LDQ + 2 * (size_t)BK * LDK + 2 * (size_t)D * LDV);
};

/* Block (query tile, query head); NW warps of 16 query rows. Heavy tiles
 * (late queries, many keys) are scheduled first. Lane (g = lane / 4,
 * tig = lane % 4) holds rows g and g + 8 of its warp's 16, columns
 * 8 n + 2 tig (+1) of each n-tile (the mma C layout). */
template <int D, int BK, int NW>
__global__ void __launch_bounds__(NW * 32, 1)
k_pf_attn(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc, int T, int Hq,
          int Hkv, int Dr, int pos0, const int *__restrict__ d_delta, float scale, float *__restrict__ out)
{
    using cfg = fa_cfg<D, BK, NW>;
    constexpr int BQ = cfg::BQ, LDQ = cfg::LDQ, LDK = cfg::LDK, LDV = cfg::LDV, NT = NW * 32;
    constexpr float LO = 2048.f, INV_LO = 1.f / 2048.f, PS = 32768.f;
    /* a K tile's elements and a V tile's pairs per thread (launched with NT threads), in batches */
    constexpr int KE = BK * D / NT, VE = (BK / 2) * D / NT;
    constexpr int KBAT = KE < 16 ? KE : 16, VBAT = VE < 8 ? VE : 8;
    static_assert(BK * D % NT == 0 && (BK / 2) * D % NT == 0 && KE % KBAT == 0 && VE % VBAT == 0,
                  "the tile loads split evenly over the threads");
    extern __shared__ __align__(16) unsigned char pf_sm[];
    __half *Qh = reinterpret_cast<__half *>(pf_sm), *Ql = Qh + BQ * LDQ, *Kh = Ql + BQ * LDQ, *Kl = Kh + BK * LDK,
           *Vh = Kl + BK * LDK, *Vl = Vh + D * LDV;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, kvh = h / (Hq / Hkv);
    const int t0 = qt * BQ, p0 = pos0 + *d_delta;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
    const size_t stride = (size_t)Hkv * Dr;
    const float *kb = kc + (size_t)kvh * Dr, *vb = vc + (size_t)kvh * Dr;

    for (int e = tid; e < BQ * D; e += NT) {
        int r = e / D, d = e % D, t = t0 + r;
        float x = (t < T && d < Dr) ? q[((size_t)t * Hq + h) * Dr + d] * scale : 0.f;
        __half hi = __float2half_rn(x);
        Qh[r * LDQ + d] = hi;
        Ql[r * LDQ + d] = __float2half_rn((x - __half2float(hi)) * LO);
    }
    const int kend = p0 + min(T, t0 + BQ);       /* keys [0, kend) for the block */
    const int wr0 = t0 + warp * 16;              /* the warp's first query */
    const bool wact = wr0 < T;
    const int wkend = p0 + min(T, wr0 + 16);     /* keys the warp needs */
    const int r_lo = wr0 + g, r_hi = wr0 + g + 8;
    const int qp_lo = r_lo < T ? p0 + r_lo : -1, qp_hi = r_hi < T ? p0 + r_hi : -1; /* -1: no key */

    float o[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
        o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* the previous tile is consumed (and Q is written) */
        /* K and V of the tile, fp32 from the cache: each thread's loads of a
         * batch are issued together, then converted (one load at a time had
         * every thread wait out ~48 L2 round trips per tile) */
#pragma unroll 1
        for (int u0 = 0; u0 < KE; u0 += KBAT) {
            float xs[KBAT];
#pragma unroll
            for (int u = 0; u < KBAT; u++) {
                const int e = tid + (u0 + u) * NT, r = e / D, d = e % D, j = k0 + r;
                xs[u] = (j < kend && d < Dr) ? kb[(size_t)j * stride + d] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < KBAT; u++) {
                const int e = tid + (u0 + u) * NT, r = e / D, d = e % D;
                const __half hi = __float2half_rn(xs[u]);
                Kh[r * LDK + d] = hi;
                Kl[r * LDK + d] = __float2half_rn((xs[u] - __half2float(hi)) * LO);
            }
        }
#pragma unroll 1
        for (int u0 = 0; u0 < VE; u0 += VBAT) {
            float xs0[VBAT], xs1[VBAT];
#pragma unroll
            for (int u = 0; u < VBAT; u++) {
                const int e = tid + (u0 + u) * NT, kp = e / D, d = e % D, j = k0 + 2 * kp;
                const bool in = d < Dr;
                xs0[u] = (in && j < kend) ? vb[(size_t)j * stride + d] : 0.f;
                xs1[u] = (in && j + 1 < kend) ? vb[(size_t)(j + 1) * stride + d] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < VBAT; u++) {
                const int e = tid + (u0 + u) * NT, kp = e / D, d = e % D;
                const float x0 = xs0[u], x1 = xs1[u];
                const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
                *reinterpret_cast<uint32_t *>(Vh + d * LDV + 2 * kp) = pack2(h0, h1);
                *reinterpret_cast<uint32_t *>(Vl + d * LDV + 2 * kp) =
                    pack2(__float2half_rn(x0 - __half2float(h0)), __float2half_rn(x1 - __half2float(h1)));
            }
        }
        __syncthreads();
        if (!wact || k0 >= wkend)
            continue;

        /* S = Q K^T, 16 rows x BK keys */
        float shh[BK / 8][4], sx[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                shh[nt][i] = sx[nt][i] = 0.f;
        /* fragments by ldmatrix: lane l names row l % 8 of matrix l / 8; for A
         * (Q) the matrices are rows +0 / +8 by k +0 / +8, for B (K rows, V^T
         * rows) n-tiles nt, nt + 1 by k +0 / +8; the same registers as the
         * per-lane 32-bit loads they replace */
        const int lm = lane >> 3, lr = lane & 7;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t ah[4], al[4];
            const int qo = (warp * 16 + (lm & 1) * 8 + lr) * LDQ + ks * 16 + (lm >> 1) * 8;
            ldsm_x4(ah, Qh + qo);
            ldsm_x4(al, Ql + qo);
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt += 2) {
                uint32_t bh[4], bl[4]; /* {b0, b1} of n-tile nt, then of nt + 1 */
                const int ko = ((nt + (lm >> 1)) * 8 + lr) * LDK + ks * 16 + (lm & 1) * 8;
                ldsm_x4(bh, Kh + ko);
                ldsm_x4(bl, Kl + ko);
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    mma16816(shh[nt + u], ah, bh[2 * u], bh[2 * u + 1]);
                    mma16816(sx[nt + u], ah, bl[2 * u], bl[2 * u + 1]);
                    mma16816(sx[nt + u], al, bh[2 * u], bh[2 * u + 1]);
                }
            }
        }
        /* mask, row max (the 4 lanes of a quad share a row) */
        float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int j = k0 + nt * 8 + 2 * tig + e;
                float s0 = fmaf(sx[nt][e], INV_LO, shh[nt][e]);
                float s1 = fmaf(sx[nt][2 + e], INV_LO, shh[nt][2 + e]);
                s0 = j <= qp_lo ? s0 : -INFINITY;
                s1 = j <= qp_hi ? s1 : -INFINITY;
                shh[nt][e] = s0;
                shh[nt][2 + e] = s1;
                mx_lo = fmaxf(mx_lo, s0);
                mx_hi = fmaxf(mx_hi, s1);
            }
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
        const float c_lo = mx_lo == -INFINITY ? 1.f : expf(m_lo - mx_lo);
        const float c_hi = mx_hi == -INFINITY ? 1.f : expf(m_hi - mx_hi);
        m_lo = mx_lo;
        m_hi = mx_hi;
        l_lo *= c_lo;
        l_hi *= c_hi;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            o[nd][0] *= c_lo;
            o[nd][1] *= c_lo;
            o[nd][2] *= c_hi;
            o[nd][3] *= c_hi;
        }
        /* P (times 2^15) as fp16 hi + lo A fragments: k-step kk = n-tiles 2kk, 2kk+1 */
        uint32_t ph[BK / 16][4], pl[BK / 16][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float s = shh[nt][i], mm = i < 2 ? m_lo : m_hi;
                p[i] = s == -INFINITY ? 0.f : expf(s - mm);
            }
            l_lo += p[0] + p[1];
            l_hi += p[2] + p[3];
            __half hh[4], hl[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float ps = p[i] * PS;
                hh[i] = __float2half_rn(ps);
                hl[i] = __float2half_rn(ps - __half2float(hh[i]));
            }
            const int kk = nt >> 1, hf = nt & 1;
            ph[kk][2 * hf] = pack2(hh[0], hh[1]);
            ph[kk][2 * hf + 1] = pack2(hh[2], hh[3]);
            pl[kk][2 * hf] = pack2(hl[0], hl[1]);
            pl[kk][2 * hf + 1] = pack2(hl[2], hl[3]);
        }
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++) {
                const __half *va = Vh + (nd * 8 + g) * LDV + kk * 16 + 2 * tig;
                const __half *vl = Vl + (nd * 8 + g) * LDV + kk * 16 + 2 * tig;
                uint32_t b0 = ld32(va), b1 = ld32(va + 8), c0 = ld32(vl), c1 = ld32(vl + 8);
                mma16816(o[nd], ph[kk], b0, b1);
                mma16816(o[nd], ph[kk], c0, c1);
                mma16816(o[nd], pl[kk], b0, b1);
            }
    }
    if (!wact)
        return;
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
    const float i_lo = 1.f / (l_lo * PS), i_hi = 1.f / (l_hi * PS);
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) {
        int d = nd * 8 + 2 * tig;
        if (r_lo < T) {
            float *op = out + ((size_t)r_lo * Hq + h) * Dr;
            if (d < Dr) op[d] = o[nd][0] * i_lo;
            if (d + 1 < Dr) op[d + 1] = o[nd][1] * i_lo;
        }
        if (r_hi < T) {
            float *op = out + ((size_t)r_hi * Hq + h) * Dr;
            if (d < Dr) op[d] = o[nd][2] * i_hi;
            if (d + 1 < Dr) op[d + 1] = o[nd][3] * i_hi;
        }
    }
}

/* The instantiations: head_dim class 64, 128, 256 (D padded up to it). */
#define FA64 64, 64, 4
#define FA128 128, 64, 4
#define FA256 256, 32, 8

int attn_class(int D) { return D <= 64 ? 0 : D <= 128 ? 1 : D <= 256 ? 2 : -1; }

size_t attn_smem(int cls)
{
    return cls == 0 ? fa_cfg<FA64>::smem : cls == 1 ? fa_cfg<FA128>::smem : fa_cfg<FA256>::smem;
}

template <int D, int BK, int NW>
sn_status fa_launch(cudaStream_t s, const float *q, const sn_kv_view *kv, int T, int pos0, const int *d_delta,
                    int Hq, float scale, float *out)
{
    using cfg = fa_cfg<D, BK, NW>;
    dim3 grid((unsigned)((T + cfg::BQ - 1) / cfg::BQ), (unsigned)Hq);
    k_pf_attn<D, BK, NW><<<grid, NW * 32, cfg::smem, s>>>(q, kv->k, kv->v, T, Hq, kv->n_kv_heads, kv->head_dim,
                                                           pos0, d_delta, scale, out);
    CU_CHECK_LAUNCH("attention prefill (flash)");
    return SN_OK;
}

/* f(DK) for the state kernel's instantiations (Dk % 32 == 0, Dk <= 128) */
template <typename F>
void tc_by_dk(int Dk, F &&f)
{
    switch (Dk) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 96: f(std::integral_constant<int, 96>{}); break;
    default: f(std::integral_constant<int, 128>{}); break;
    }
}

} // namespace

/* ------------------------------------------------------------------------ */

extern "C" void sn_cuda_prefill_mode(int mode, int min_t)
{
    pf_read_env();
    if (mode >= SN_CUDA_PREFILL_OLD && mode <= SN_CUDA_PREFILL_ATTN)
        g_mode = mode;
    if (min_t >= 1)
        g_min_t = min_t;
}

sn_status cu_pf_env_check()
{
    int mode = SN_CUDA_PREFILL_NEW, min_t = 64;
    bool tc = true;
    return pf_parse_env(&mode, &min_t, &tc);
}

sn_status cu_pf_init(const cu_devinfo *di)
{
    pf_read_env();
    /* a limit that cannot be raised turns that path off (the old kernels run) */
    for (int cls = 0; cls < 3; cls++) {
        size_t need = attn_smem(cls);
        cudaError_t e = cudaErrorInvalidValue;
        if (need <= di->smem_optin)
            e = cls == 0   ? cudaFuncSetAttribute(k_pf_attn<FA64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)need)
                : cls == 1 ? cudaFuncSetAttribute(k_pf_attn<FA128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)need)
                           : cudaFuncSetAttribute(k_pf_attn<FA256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)need);
        g_attn_ok[cls] = e == cudaSuccess;
    }
    size_t ga = gdn_prep_smem(GDN_MAX_DK), gb = gdn_state_smem(GDN_MAX_DK);
    g_gdn_ok = ga <= di->smem_optin && gb <= di->smem_optin &&
               cudaFuncSetAttribute(k_pf_gdn_prep<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ga) ==
                   cudaSuccess &&
               cudaFuncSetAttribute(k_pf_gdn_prep<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ga) ==
                   cudaSuccess &&
               cudaFuncSetAttribute(k_pf_gdn_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb) ==
                   cudaSuccess;
    const size_t gt = gdn_state_tc_smem(128);
    g_gdn_tc_ok = gt <= di->smem_optin;
    for (int dk = 32; dk <= 128; dk += 32)
        tc_by_dk(dk, [&](auto D) {
            constexpr int d = decltype(D)::value;
            g_gdn_tc_ok = g_gdn_tc_ok && cudaFuncSetAttribute(k_pf_gdn_state_tc<d>,
                                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                              (int)gdn_state_tc_smem(d)) == cudaSuccess;
        });
    (void)cudaGetLastError();
    return SN_OK;
}

bool cu_pf_gdn_use(const sn_gdn_dims *d, int T)
{
    return gdn_on() && g_gdn_ok && T >= g_min_t && d->dk <= GDN_MAX_DK && d->dv <= GDN_MAX_DV && d->dk >= 1 &&
           d->dv >= 1 && d->n_k_heads >= 1 && d->n_v_heads % d->n_k_heads == 0;
}

size_t cu_pf_gdn_scratch_bytes(const sn_gdn_dims *d, int T)
{
    if (!cu_pf_gdn_use(d, T))
        return 0;
    size_t nch = ((size_t)T + GC - 1) / GC, Hv = (size_t)d->n_v_heads;
    return sizeof(float) * ((size_t)T * Hv * d->dk + Hv * nch * GC * GC + Hv * nch * 2 * GC) + 256;
}

sn_status cu_pf_gdn(cudaStream_t s, const sn_gdn_dims *d, const float *c, const float *beta, const float *decay,
                    float *S, int T, float *out, void *scratch)
{
    int Hk = d->n_k_heads, Hv = d->n_v_heads, Dk = d->dk, Dv = d->dv;
    int nch = (T + GC - 1) / GC;
    float *W = (float *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    float *Ai = W + (size_t)T * Hv * Dk, *gk = Ai + (size_t)Hv * nch * GC * GC;
    const dim3 ga((unsigned)Hv, (unsigned)nch);
    if (Dk == 128)
        k_pf_gdn_prep<128><<<ga, GA_THREADS, gdn_prep_smem(Dk), s>>>(c, beta, decay, Hk, Hv, Dk, Dv, T, out, W, Ai, gk);
    else
        k_pf_gdn_prep<0><<<ga, GA_THREADS, gdn_prep_smem(Dk), s>>>(c, beta, decay, Hk, Hv, Dk, Dv, T, out, W, Ai, gk);
    CU_CHECK_LAUNCH("gdn chunked prep");
    const dim3 gb((unsigned)Hv, (unsigned)((Dv + GB_NC - 1) / GB_NC));
    if (g_gdn_tc_on && g_gdn_tc_ok && Dk % 32 == 0 && Dk <= 128 && Dv % GB_NC == 0 &&
        (((uintptr_t)c | (uintptr_t)out) & 15) == 0) /* its float4 / float2 accesses */
        tc_by_dk(Dk, [&](auto D) {
            constexpr int dk = decltype(D)::value;
            k_pf_gdn_state_tc<dk><<<gb, GB_THREADS, gdn_state_tc_smem(dk), s>>>(c, S, Hk, Hv, Dv, T, out, W, Ai, gk);
        });
    else
        k_pf_gdn_state<<<gb, GB_THREADS, gdn_state_smem(Dk), s>>>(c, S, Hk, Hv, Dk, Dv, T, out, W, Ai, gk);
    CU_CHECK_LAUNCH("gdn chunked state");
    return SN_OK;
}

bool cu_pf_attn_use(const sn_kv_view *kv, int T, int n_q_heads)
{
    int cls = attn_class(kv->head_dim);
    return attn_on() && T >= g_min_t && cls >= 0 && g_attn_ok[cls] && kv->n_kv_heads >= 1 &&
           n_q_heads % kv->n_kv_heads == 0;
}

sn_status cu_pf_attention(cudaStream_t s, const float *q, const sn_kv_view *kv, int T, int pos0, const int *d_delta,
                          int n_q_heads, float scale, float *out)
{
    switch (attn_class(kv->head_dim)) {
    case 0: return fa_launch<FA64>(s, q, kv, T, pos0, d_delta, n_q_heads, scale, out);
    case 1: return fa_launch<FA128>(s, q, kv, T, pos0, d_delta, n_q_heads, scale, out);
    case 2: return fa_launch<FA256>(s, q, kv, T, pos0, d_delta, n_q_heads, scale, out);
    default: return SN_FAIL(SN_E_UNSUPPORTED, "attention prefill: head_dim %d", kv->head_dim);
    }
}
