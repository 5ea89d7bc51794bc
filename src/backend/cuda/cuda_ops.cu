/* Norms, elementwise ops, RoPE, the KV cache, attention (split-KV decode and
 * a tiled flash-style causal prefill, both GQA by indexing the shared KV
 * head, never by copying it), the GatedDeltaNet layer core, and argmax.
 * Semantics follow the scalar CPU oracle (src/backend/cpu/ops_ref.c). */
#include <math.h>

#include <type_traits>

#include "backend/cuda/cuda_internal.h"

namespace {

__device__ __forceinline__ float silu(float x) { return cu_silu(x); }
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

/* Sum over the block (blockDim.x a multiple of 32, at most 1024). */
__device__ float block_sum(float v, float *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* red may still be read from a previous call */
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0)
            red[32] = v;
    }
    __syncthreads();
    return red[32];
}

unsigned norm_threads(int n) { return n <= 128 ? 64u : n <= 512 ? 128u : n <= 2048 ? 256u : 512u; }

/* 1 / rms of a row of n, the sum of squares in each thread's order and
 * block_sum's tree: k_rmsnorm's and k_attn_prep's */
__device__ __forceinline__ float rms_inv_row(const float *__restrict__ xr, int n, float eps, float *red)
{
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    return cu_gnorm_rinv(ss, n, eps);
}

/* Rows of up to RMS_HELD values a thread (the decode graphs' q/k norms:
 * 2 a thread) keep x and w in registers from the start: the weights' loads
 * after the block's sum were one more round trip on the kernel's path.
 * The sum and the products are the same either way. */
constexpr int RMS_HELD = 8;

__global__ void k_rmsnorm(const float *__restrict__ x, const float *__restrict__ w, int n, float eps,
                          float *__restrict__ y)
{
    pdl_enter();
    __shared__ float red[33];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    if (n > RMS_HELD * (int)blockDim.x) {
        float inv = rms_inv_row(xr, n, eps, red);
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            yr[i] = xr[i] * inv * w[i];
        return;
    }
    float xv[RMS_HELD], wv[RMS_HELD];
#pragma unroll
    for (int j = 0; j < RMS_HELD; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        xv[j] = i < n ? xr[i] : 0.f;
        wv[j] = i < n ? w[i] : 0.f;
    }
    float ss = 0.f; /* rms_inv_row's order */
#pragma unroll
    for (int j = 0; j < RMS_HELD; j++)
        if (threadIdx.x + j * blockDim.x < (unsigned)n)
            ss += xv[j] * xv[j];
    ss = block_sum(ss, red);
    const float inv = cu_gnorm_rinv(ss, n, eps);
#pragma unroll
    for (int j = 0; j < RMS_HELD; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n)
            yr[i] = xv[j] * inv * wv[j];
    }
}

__global__ void k_gated_rmsnorm(const float *__restrict__ o, const float *__restrict__ z, const float *__restrict__ w,
                                int n, float eps, float *__restrict__ y)
{
    pdl_enter();
    __shared__ float red[33];
    size_t off = (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += o[off + i] * o[off + i];
    ss = block_sum(ss, red);
    float inv = 1.f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        y[off + i] = w[i] * (o[off + i] * inv) * silu(z[off + i]);
}

/* The same with one warp per row (n % 4 == 0, 16-byte aligned rows): the
 * prefill has T * Hv rows of 128, where a 64-thread block per row spent
 * more on scheduling and its two barriers than on the 1.5 KB it moves. */
__global__ void __launch_bounds__(256) k_gated_rmsnorm_w(const float *__restrict__ o, const float *__restrict__ z,
                                                         const float *__restrict__ w, int rows, int n, float eps,
                                                         float *__restrict__ y)
{
    pdl_enter();
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const size_t off = (size_t)row * n;
    if (n == CU_GNORM_N) {
        /* a GDN head's row, one float4 a lane: z and w loaded beside o, not
         * after the warp's sum (one more round trip on the kernel's path) */
        const float4 ov = *(const float4 *)(o + off + 4 * lane), zv = *(const float4 *)(z + off + 4 * lane);
        const float wv[4] = { w[4 * lane], w[4 * lane + 1], w[4 * lane + 2], w[4 * lane + 3] };
        const float inv = cu_gnorm_inv(cu_gnorm_ss4(0.f, ov), n, eps);
        *(float4 *)(y + off + 4 * lane) = cu_gnorm_apply4(wv, ov, zv, inv);
        return;
    }
    float ss = 0.f;
    for (int i = 4 * lane; i < n; i += 128)
        ss = cu_gnorm_ss4(ss, *(const float4 *)(o + off + i));
    const float inv = cu_gnorm_inv(ss, n, eps);
    for (int i = 4 * lane; i < n; i += 128)
        *(float4 *)(y + off + i) =
            cu_gnorm_apply4(w + i, *(const float4 *)(o + off + i), *(const float4 *)(z + off + i), inv);
}

struct copy_list {
    uint4 *dst[CU_COPY_N_MAX];
    const uint4 *src[CU_COPY_N_MAX];
    unsigned n16[CU_COPY_N_MAX];
};

/* blockIdx.y = the copy, blocks along x stride over its 16-byte words */
__global__ void k_copy_n(copy_list L)
{
    pdl_enter();
    const int i = blockIdx.y;
    uint4 *d = L.dst[i];
    const uint4 *s = L.src[i];
    for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < L.n16[i]; k += gridDim.x * blockDim.x)
        d[k] = s[k];
}

__global__ void k_add(float *__restrict__ y, const float *__restrict__ x, size_t n)
{
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void k_swiglu(const float *__restrict__ g, const float *__restrict__ u, size_t n, float *__restrict__ out)
{
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = silu(g[i]) * u[i];
}

__global__ void k_mul_sigmoid(float *__restrict__ y, const float *__restrict__ g, size_t n)
{
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] *= sigmoidf_(g[i]);
}

/* y[t, i] += sigmoid(g[t]) * x[t, i] */
__global__ void k_add_gated(float *__restrict__ y, const float *__restrict__ x, const float *__restrict__ g, int T,
                            int n)
{
    pdl_enter();
    size_t N = (size_t)T * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x)
        y[i] += sigmoidf_(g[i / n]) * x[i];
}

unsigned ew_grid(size_t n)
{
    size_t g = (n + 255) / 256;
    return (unsigned)(g > 4096 ? 4096 : g < 1 ? 1 : g);
}

/* Rotary pair (x1, x2) at position pos and frequency f: k_rope's and
 * k_attn_prep's arithmetic. The angle is formed in fp32 exactly as the CPU
 * does (fp32 position times fp32 inv_freq). */
__device__ __forceinline__ void rope_pair(float x1, float x2, int pos, float f, float mscale, float &o1, float &o2)
{
    float ang = (float)pos * f;
    float c = cosf(ang) * mscale, s = sinf(ang) * mscale;
    o1 = x1 * c - x2 * s;
    o2 = x2 * c + x1 * s;
}

/* One thread per (token, head, rotary pair). */
__global__ void k_rope(float *__restrict__ x, int T, int n_heads, int head_dim, int half, int pos0,
                       const int *__restrict__ d_delta, const float *__restrict__ inv_freq, float mscale)
{
    pdl_enter();
    size_t n = (size_t)T * n_heads * half;
    int p0 = pos0 + *d_delta;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t th = e / half;
        int t = (int)(th / n_heads);
        float *xh = x + th * head_dim;
        rope_pair(xh[i], xh[i + half], p0 + t, inv_freq[i], mscale, xh[i], xh[i + half]);
    }
}

__global__ void k_kv_write(float *__restrict__ kc, float *__restrict__ vc, const float *__restrict__ k,
                           const float *__restrict__ v, size_t n, size_t row, int pos0, const int *__restrict__ d_delta)
{
    pdl_enter();
    size_t off = (size_t)(pos0 + *d_delta) * row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        kc[off + i] = k[i];
        vc[off + i] = v[i];
    }
}

/* q and k rows (blocks [0, T*Hq) and [T*Hq, T*(Hq+Hkv))), norm_threads(D)
 * threads: k_rmsnorm's sum and scaling, then k_rope's rotation of the
 * normalised row (the same helpers), the result to qn/kn and, for a k row,
 * with its v row into the cache at position pos0 + delta + t. */
__global__ void k_attn_prep(cu_attn_prep_args a, const int *__restrict__ d_delta)
{
    pdl_enter();
    __shared__ float red[33];
    extern __shared__ float ys[]; /* the normalised row */
    const int D = a.D, nq = a.T * a.Hq;
    const bool isq = (int)blockIdx.x < nq;
    const int row = isq ? (int)blockIdx.x : (int)blockIdx.x - nq, t = row / (isq ? a.Hq : a.Hkv);
    const float *xr = (isq ? a.q : a.k) + (size_t)row * D, *w = isq ? a.qw : a.kw;
    float inv = rms_inv_row(xr, D, isq ? a.eps_q : a.eps_k, red);
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        ys[i] = xr[i] * inv * w[i];
    __syncthreads();
    const int p0 = a.pos0 + *d_delta, half = a.rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_pair(ys[i], ys[i + half], p0 + t, a.inv_freq[i], a.mscale, ys[i], ys[i + half]);
    __syncthreads();
    float *yr = (isq ? a.qn : a.kn) + (size_t)row * D;
    const size_t crow = (size_t)(p0 + t) * a.Hkv * D + (size_t)(row % a.Hkv) * D; /* k/v rows only */
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        yr[i] = ys[i];
        if (!isq) {
            a.kc[crow + i] = ys[i];
            a.vc[crow + i] = a.v[(size_t)row * D + i];
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Attention, decode: split-KV. Grid (T*Hq, splits); each split keeps an     */
/* online-softmax partial (m, l, o[D]) that k_attn_combine merges.           */
/* ------------------------------------------------------------------------ */

/* KV splits per (token, head): gridDim.y of the decode kernels, set per
 * backend (cu_devinfo.attn_splits, 64 or 128) and never from T, so a token's
 * bits do not depend on the rows beside it */
constexpr int NSPLIT_MAX = 128;
constexpr int DEC_WARPS = 4;
constexpr int DEC_KB = 4; /* keys per warp step, reduced together */

template <int EPL>
__global__ void __launch_bounds__(DEC_WARPS * 32)
k_attn_decode(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc, int Hq, int Hkv,
              int D, int pos0, const int *__restrict__ d_delta, float scale, float *__restrict__ part)
{
    pdl_enter();
    const int th = blockIdx.x, split = blockIdx.y;
    const int t = th / Hq, h = th % Hq, kvh = h / (Hq / Hkv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int L = pos0 + *d_delta + t + 1; /* keys [0, L) */
    const int ns = (int)gridDim.y, per = (L + ns - 1) / ns;
    const int j0 = split * per, j1 = min(L, j0 + per);
    const size_t stride = (size_t)Hkv * D;
    const float *qh = q + ((size_t)t * Hq + h) * D;
    const float *kb = kc + (size_t)kvh * D, *vb = vc + (size_t)kvh * D;
    float qv[EPL], o[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        int d = lane + 32 * e;
        qv[e] = d < D ? qh[d] * scale : 0.f;
        o[e] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int jb = j0 + warp * DEC_KB; jb < j1; jb += DEC_WARPS * DEC_KB) {
        float s[DEC_KB];
#pragma unroll
        for (int kk = 0; kk < DEC_KB; kk++) {
            int j = jb + kk;
            float acc = 0.f;
            if (j < j1) {
#pragma unroll
                for (int e = 0; e < EPL; e++) {
                    int d = lane + 32 * e;
                    if (d < D)
                        acc = fmaf(qv[e], kb[(size_t)j * stride + d], acc);
                }
            }
            s[kk] = acc;
        }
#pragma unroll
        for (int o2 = 16; o2 > 0; o2 >>= 1)
#pragma unroll
            for (int kk = 0; kk < DEC_KB; kk++)
                s[kk] += __shfl_xor_sync(0xffffffffu, s[kk], o2);
        float mx = m;
#pragma unroll
        for (int kk = 0; kk < DEC_KB; kk++)
            if (jb + kk < j1)
                mx = fmaxf(mx, s[kk]);
        float corr = expf(m - mx); /* 0 when m was -inf */
        l *= corr;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            o[e] *= corr;
#pragma unroll
        for (int kk = 0; kk < DEC_KB; kk++) {
            int j = jb + kk;
            if (j < j1) {
                float p = expf(s[kk] - mx);
                l += p;
#pragma unroll
                for (int e = 0; e < EPL; e++) {
                    int d = lane + 32 * e;
                    if (d < D)
                        o[e] = fmaf(p, vb[(size_t)j * stride + d], o[e]);
                }
            }
        }
        m = mx;
    }
    /* merge the warps of the block */
    __shared__ float sm[DEC_WARPS], sl[DEC_WARPS];
    extern __shared__ float so[]; /* [DEC_WARPS][D] */
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        int d = lane + 32 * e;
        if (d < D)
            so[warp * D + d] = o[e];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DEC_WARPS; w++)
        M = fmaxf(M, sm[w]);
    float* out = part + ((size_t)th * gridDim.y + split) * (D + 2);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int w = 0; w < DEC_WARPS; w++)
            if (sm[w] != -INFINITY)
                acc += so[w * D + d] * expf(sm[w] - M);
        out[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
        float Lsum = 0.f;
        for (int w = 0; w < DEC_WARPS; w++)
            if (sm[w] != -INFINITY)
                Lsum += sl[w] * expf(sm[w] - M);
        out[0] = M;
        out[1] = Lsum;
    }
}

/* k_attn_decode_gqa's last step: the block's NW warp partials (m, l in
 * sm/sl [NW][RS], o in so [NW][RS][D], visible after a barrier) of its r
 * heads merged into part[] rows out0, out0 + ns, ... (one per head). The
 * weights expf(m_w - M) are formed once per (warp, head) into wts (every
 * thread forming all of them cost ~1500 instructions per warp, ncu);
 * an empty warp (m = -inf, o = 0) gets weight 0, which adds exactly 0, so
 * the bits are those of skipping it. */
template <int NW, int RS>
__device__ __forceinline__ void attn_warp_merge(const float *so, const float (*sm)[RS], const float (*sl)[RS],
                                                float (*wts)[RS], int r, int D, float *part, size_t out0,
                                                size_t ns)
{
    if ((int)threadIdx.x < r) {
        const int i = threadIdx.x;
        float M = -INFINITY;
        for (int w = 0; w < NW; w++)
            M = fmaxf(M, sm[w][i]);
        float Lsum = 0.f;
        for (int w = 0; w < NW; w++) {
            const float e = sm[w][i] != -INFINITY ? expf(sm[w][i] - M) : 0.f;
            wts[w][i] = e;
            if (sm[w][i] != -INFINITY)
                Lsum += sl[w][i] * e;
        }
        float *out = part + (out0 + (size_t)i * ns) * (D + 2);
        out[0] = M;
        out[1] = Lsum;
    }
    __syncthreads();
    for (int i = 0; i < r; i++) {
        float *out = part + (out0 + (size_t)i * ns) * (D + 2);
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float acc = 0.f;
#pragma unroll
            for (int w = 0; w < NW; w++)
                acc += so[(w * RS + i) * D + d] * wts[w][i];
            out[2 + d] = acc;
        }
    }
}

/* The same split-KV decode with GQA sharing: one block per (token, kv
 * head, split) serves all R = Hq/Hkv query heads of the group, so each K/V
 * row is read once per split instead of once per query head. Two keys per
 * warp step keep both rows' loads in flight. */
template <int EPL, int R, int NW>
__global__ void __launch_bounds__(NW * 32)
k_attn_decode_gqa(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc, int Hq,
                  int Hkv, int D, int pos0, const int *__restrict__ d_delta, float scale, float *__restrict__ part)
{
    pdl_enter();
    const int tg = blockIdx.x, split = blockIdx.y;
    const int t = tg / Hkv, g = tg % Hkv, r = Hq / Hkv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int L = pos0 + *d_delta + t + 1;
    const int ns = (int)gridDim.y, per = (L + ns - 1) / ns;
    const int j0 = split * per, j1 = min(L, j0 + per);
    const size_t stride = (size_t)Hkv * D;
    const float *kb = kc + (size_t)g * D, *vb = vc + (size_t)g * D;
    /* the group's q rows: every load first, from an address in range (head
     * and column clamped), then the scaling and the zeros past r and D.
     * Loaded under each head's own test they went out one head at a time,
     * R round trips: half the kernel's warp samples (ncu s23r1, 35B-A3B at
     * 4096 keys). */
    float qv[R][EPL], o[R][EPL], m[R], l[R];
    const float *qg = q + ((size_t)t * Hq + (size_t)g * r) * D;
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int e = 0; e < EPL; e++)
            qv[i][e] = __ldg(qg + (size_t)min(i, r - 1) * D + min(lane + 32 * e, D - 1));
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int d = lane + 32 * e;
            qv[i][e] = (i < r && d < D) ? qv[i][e] * scale : 0.f;
            o[i][e] = 0.f;
        }
        m[i] = -INFINITY;
        l[i] = 0.f;
    }
    /* the next step's two K and V rows are loaded before this step's
     * arithmetic, so a warp has four rows in flight, not two (the loop was
     * bound by load latency: 1.1 TB/s at 4096 keys, ncu) */
    float k0[EPL], k1[EPL], v0[EPL], v1[EPL];
    auto load_kv = [&](int jb, float *a0, float *a1, float *b0, float *b1) {
        const bool ok0 = jb < j1, ok1 = jb + 1 < j1;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int d = lane + 32 * e;
            bool in = d < D;
            a0[e] = in && ok0 ? kb[(size_t)jb * stride + d] : 0.f;
            a1[e] = in && ok1 ? kb[(size_t)(jb + 1) * stride + d] : 0.f;
            b0[e] = in && ok0 ? vb[(size_t)jb * stride + d] : 0.f;
            b1[e] = in && ok1 ? vb[(size_t)(jb + 1) * stride + d] : 0.f;
        }
    };
    load_kv(j0 + 2 * warp, k0, k1, v0, v1);
    for (int jb = j0 + 2 * warp; jb < j1; jb += 2 * NW) {
        const bool two = jb + 1 < j1;
        float nk0[EPL], nk1[EPL], nv0[EPL], nv1[EPL];
        load_kv(jb + 2 * NW, nk0, nk1, nv0, nv1);
        float s0[R], s1[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            float a = 0.f, b = 0.f;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                a = fmaf(qv[i][e], k0[e], a);
                b = fmaf(qv[i][e], k1[e], b);
            }
            s0[i] = a;
            s1[i] = b;
        }
#pragma unroll
        for (int o2 = 16; o2 > 0; o2 >>= 1)
#pragma unroll
            for (int i = 0; i < R; i++) {
                s0[i] += __shfl_xor_sync(0xffffffffu, s0[i], o2);
                s1[i] += __shfl_xor_sync(0xffffffffu, s1[i], o2);
            }
#pragma unroll
        for (int i = 0; i < R; i++) {
            float mx = fmaxf(m[i], two ? fmaxf(s0[i], s1[i]) : s0[i]);
            float corr = expf(m[i] - mx);
            float p0 = expf(s0[i] - mx), p1 = two ? expf(s1[i] - mx) : 0.f;
            l[i] = l[i] * corr + p0 + p1;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                o[i][e] = fmaf(p1, v1[e], fmaf(p0, v0[e], o[i][e] * corr));
            m[i] = mx;
        }
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            k0[e] = nk0[e];
            k1[e] = nk1[e];
            v0[e] = nv0[e];
            v1[e] = nv1[e];
        }
    }
    __shared__ float sm[NW][R], sl[NW][R];
    extern __shared__ float so[]; /* [NW][R][D] */
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < R; i++) {
            sm[warp][i] = m[i];
            sl[warp][i] = l[i];
        }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int d = lane + 32 * e;
            if (d < D)
                so[(warp * R + i) * D + d] = o[i][e];
        }
    __syncthreads();
    __shared__ float wts[NW][R];
    attn_warp_merge<NW, R>(so, sm, sl, wts, r, D, part, ((size_t)t * Hq + (size_t)g * r) * gridDim.y + split,
                           gridDim.y);
}

/* One block per (token, q head), at least ns threads. The splits' (m, l)
 * and their weights expf(m - M) are read and computed once, in parallel,
 * into shared memory (each thread walking all 64 splits twice before its
 * outputs was a chain of dependent loads: 16 us per call on the H200,
 * ncu); L and each output still sum over s = 0..ns-1 in order, skipping
 * empty splits; a thread per output (D threads), its 64 loads at once,
 * the first 64 issued beside the (m, l) loads: they do not depend on M, and
 * after it they were a second round trip on the kernel's one serial path. */
__global__ void k_attn_combine(const float *__restrict__ part, int ns, int D, float *__restrict__ out,
                               const float *__restrict__ gate)
{
    pdl_enter();
    __shared__ float ws[NSPLIT_MAX], ls[NSPLIT_MAX], wmax[NSPLIT_MAX / 32];
    __shared__ int ok[NSPLIT_MAX];
    const int th = blockIdx.x, s0 = threadIdx.x, lane = threadIdx.x & 31;
    const float *p = part + (size_t)th * ns * (D + 2);
    float v0[64]; /* output threadIdx.x's first 64 partials (blockDim.x >= D: one output a thread) */
    if ((int)threadIdx.x < D)
#pragma unroll
        for (int i = 0; i < 64; i++)
            v0[i] = i < ns ? p[(size_t)i * (D + 2) + 2 + threadIdx.x] : 0.f;
    float ms = -INFINITY;
    if (s0 < ns) {
        ms = p[(size_t)s0 * (D + 2)];
        ls[s0] = p[(size_t)s0 * (D + 2) + 1];
    }
    float m = ms;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0 && s0 < ns)
        wmax[s0 >> 5] = m;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ns / 32; w++)
        M = fmaxf(M, wmax[w]);
    if (s0 < ns) {
        ok[s0] = ms != -INFINITY;
        ws[s0] = ms != -INFINITY ? expf(ms - M) : 0.f;
    }
    __syncthreads();
    /* every thread forms L itself (shared reads, the same order): no third barrier */
    float L = 0.f;
    for (int s = 0; s < ns; s++)
        if (ok[s])
            L = fmaf(ls[s], ws[s], L);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int sb = 0; sb < ns; sb += 64) {
            float v[64];
#pragma unroll
            for (int i = 0; i < 64; i++)
                v[i] = sb == 0 && d == (int)threadIdx.x ? v0[i] : p[(size_t)(sb + i) * (D + 2) + 2 + d];
#pragma unroll
            for (int i = 0; i < 64; i++)
                if (ok[sb + i])
                    acc = fmaf(v[i], ws[sb + i], acc);
        }
        float y = acc / L;
        if (gate) /* the gated attention's output gate, as k_mul_sigmoid applies it after */
            y *= sigmoidf_(gate[(size_t)th * D + d]);
        out[(size_t)th * D + d] = y;
    }
}

/* ------------------------------------------------------------------------ */
/* Attention, prefill: one block per (32 queries, q head); key tiles of 32   */
/* in shared memory; thread (qi = tid/8, lane8 = tid%8) owns 4 scores of its */
/* query row and the output columns d = lane8 + 8*i.                          */
/* ------------------------------------------------------------------------ */

constexpr int PF_BQ = 32, PF_BK = 32, PF_THREADS = 256;

size_t prefill_smem(int D)
{
    int ld = D + 1;
    return sizeof(float) * ((size_t)PF_BQ * ld + (size_t)PF_BK * ld + (size_t)PF_BK * D + (size_t)PF_BQ * (PF_BK + 1));
}

template <int MAXI>
__global__ void __launch_bounds__(PF_THREADS)
k_attn_prefill(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc, int T, int Hq,
               int Hkv, int D, int pos0, const int *__restrict__ d_delta, float scale, float *__restrict__ out)
{
    pdl_enter();
    extern __shared__ float sh[];
    const int ld = D + 1;
    float *Qs = sh, *Ks = Qs + PF_BQ * ld, *Vs = Ks + PF_BK * ld, *Ps = Vs + PF_BK * D;
    const int h = blockIdx.y, kvh = h / (Hq / Hkv);
    const int t0 = blockIdx.x * PF_BQ;
    const int p0 = pos0 + *d_delta;
    const int qi = threadIdx.x >> 3, l8 = threadIdx.x & 7;
    const size_t stride = (size_t)Hkv * D;
    for (int e = threadIdx.x; e < PF_BQ * D; e += PF_THREADS) {
        int r = e / D, d = e % D;
        int t = t0 + r;
        Qs[r * ld + d] = t < T ? q[((size_t)t * Hq + h) * D + d] * scale : 0.f;
    }
    const int my_t = t0 + qi;
    const int my_pos = p0 + my_t; /* keys [0, my_pos] */
    const int last_pos = p0 + min(T, t0 + PF_BQ) - 1;
    float o[MAXI];
#pragma unroll
    for (int i = 0; i < MAXI; i++)
        o[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int k0 = 0; k0 <= last_pos; k0 += PF_BK) {
        __syncthreads(); /* previous tile fully used */
        for (int e = threadIdx.x; e < PF_BK * D; e += PF_THREADS) {
            int r = e / D, d = e % D;
            int j = k0 + r;
            bool ok = j <= last_pos;
            Ks[r * ld + d] = ok ? kc[(size_t)j * stride + (size_t)kvh * D + d] : 0.f;
            Vs[r * D + d] = ok ? vc[(size_t)j * stride + (size_t)kvh * D + d] : 0.f;
        }
        __syncthreads();
        float s[4];
#pragma unroll
        for (int c = 0; c < 4; c++)
            s[c] = 0.f;
        const float *qr = Qs + qi * ld;
        for (int d = 0; d < D; d++) {
            float qd = qr[d];
#pragma unroll
            for (int c = 0; c < 4; c++)
                s[c] = fmaf(qd, Ks[(l8 + 8 * c) * ld + d], s[c]);
        }
        float mx = m;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int j = k0 + l8 + 8 * c;
            if (j > my_pos || my_t >= T)
                s[c] = -INFINITY;
            mx = fmaxf(mx, s[c]);
        }
#pragma unroll
        for (int o2 = 1; o2 < 8; o2 <<= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
        float corr = mx == -INFINITY ? 1.f : expf(m - mx);
        float psum = 0.f;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float p = s[c] == -INFINITY ? 0.f : expf(s[c] - mx);
            Ps[qi * (PF_BK + 1) + l8 + 8 * c] = p;
            psum += p;
        }
#pragma unroll
        for (int o2 = 1; o2 < 8; o2 <<= 1)
            psum += __shfl_xor_sync(0xffffffffu, psum, o2);
        l = l * corr + psum;
        m = mx;
        __syncwarp();
        const float *pr = Ps + qi * (PF_BK + 1);
#pragma unroll
        for (int i = 0; i < MAXI; i++) {
            int d = l8 + 8 * i;
            if (d < D) {
                float acc = o[i] * corr;
                for (int j = 0; j < PF_BK; j++)
                    acc = fmaf(pr[j], Vs[j * D + d], acc);
                o[i] = acc;
            }
        }
    }
    if (my_t < T) {
        float inv = 1.f / l;
#pragma unroll
        for (int i = 0; i < MAXI; i++) {
            int d = l8 + 8 * i;
            if (d < D)
                out[((size_t)my_t * Hq + h) * D + d] = o[i] * inv;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* GatedDeltaNet                                                               */
/* ------------------------------------------------------------------------ */

/* Channel ch of token t through the causal conv (K taps over
 * concat(state, qkv)) and SiLU: k_gdn_conv's and k_gdn_step's arithmetic. */
__device__ __forceinline__ float gdn_conv_ch(const float *__restrict__ conv_w, const float *state,
                                             const float *__restrict__ qkv, int ch, int t, int K, int C)
{
    const float *w = conv_w + (size_t)ch * K;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
        int xi = t + k; /* index into concat(state, qkv) */
        float xv = xi < K - 1 ? state[(size_t)xi * C + ch] : qkv[(size_t)(xi - (K - 1)) * C + ch];
        acc += w[k] * xv;
    }
    return silu(acc);
}

/* Channel ch's conv state after T tokens = rows T..T+K-2 of concat(state,
 * qkv), and history slot t < nh (the state after token t) = rows
 * t+1..t+K-1; ascending rows, so the in-place update never reads a row it
 * already replaced. The caller makes sure no one still reads the old rows. */
__device__ __forceinline__ void gdn_shift_ch(float *state, const float *__restrict__ qkv, float *hist, size_t hstride,
                                             int nh, int ch, int T, int K, int C)
{
    for (int t = 0; t < nh; t++)
        for (int i = 0; i < K - 1; i++) {
            int xi = t + 1 + i;
            hist[(size_t)t * hstride + (size_t)i * C + ch] =
                xi < K - 1 ? state[(size_t)xi * C + ch] : qkv[(size_t)(xi - (K - 1)) * C + ch];
        }
    for (int i = 0; i < K - 1; i++) {
        int xi = T + i;
        float v = xi < K - 1 ? state[(size_t)xi * C + ch] : qkv[(size_t)(xi - (K - 1)) * C + ch];
        state[(size_t)i * C + ch] = v;
    }
}

/* Value head hv's decay exp(-exp(A_log) softplus(a + dt_bias)) and beta
 * sigmoid(b) for token t, from its inputs as loaded (gdn_gate_vals) or
 * from memory (gdn_gates): every GDN conv kernel's gates. */
__device__ __forceinline__ void gdn_gate_vals(float A_log_h, float a_th, float dt_bias_h, float b_th, float &dec,
                                              float &bet)
{
    float A = -expf(A_log_h);
    float g = A * softplus(a_th + dt_bias_h);
    dec = expf(g);
    bet = sigmoidf_(b_th);
}

__device__ __forceinline__ void gdn_gates(int t, int hv, int Hv, const float *__restrict__ a,
                                          const float *__restrict__ b, const float *__restrict__ A_log,
                                          const float *__restrict__ dt_bias, float &dec, float &bet)
{
    gdn_gate_vals(A_log[hv], a[(size_t)t * Hv + hv], dt_bias[hv], b[(size_t)t * Hv + hv], dec, bet);
}

/* The channels [ch0, ch0 + n) of head vector hidx (q, k or v head). */
__device__ __forceinline__ void gdn_head_channels(int hidx, int Hk, int Dk, int Dv, int &ch0, int &n)
{
    if (hidx < 2 * Hk) {
        ch0 = hidx * Dk;
        n = Dk;
    } else {
        ch0 = 2 * Hk * Dk + (hidx - 2 * Hk) * Dv;
        n = Dv;
    }
}

/* Block (head vector hidx, token t): channels of one q, k or v head of
 * token t through the causal conv + SiLU; q/k heads l2-normalised (q also
 * times Dk^-0.5). Head index: [0,Hk) q, [Hk,2Hk) k, [2Hk, 2Hk+Hv) v. Block 0
 * of each token also forms beta and the decay for every value head. The
 * channels a block reads of the conv state are its own head's only. */
__device__ __forceinline__ void gdn_conv_head(int hidx, int t, const float *__restrict__ qkv,
                                              const float *__restrict__ conv_w, const float *state, int Hk, int Hv,
                                              int Dk, int Dv, int K, float l2eps, const float *__restrict__ a,
                                              const float *__restrict__ b, const float *__restrict__ A_log,
                                              const float *__restrict__ dt_bias, float *__restrict__ c,
                                              float *__restrict__ beta, float *__restrict__ decay, float *red)
{
    const int C = 2 * Hk * Dk + Hv * Dv;
    const bool is_qk = hidx < 2 * Hk;
    int ch0, n;
    gdn_head_channels(hidx, Hk, Dk, Dv, ch0, n);
    float ss = 0.f;
    float vals[4]; /* up to 4 channels per thread (head dims up to 4*blockDim) */
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int i = threadIdx.x + r * blockDim.x;
        vals[r] = 0.f;
        if (i < n) {
            float v = gdn_conv_ch(conv_w, state, qkv, ch0 + i, t, K, C);
            vals[r] = v;
            ss += v * v;
        }
    }
    if (is_qk) {
        ss = block_sum(ss, red);
        float inv = 1.f / sqrtf(ss + l2eps);
        if (hidx < Hk)
            inv *= 1.f / sqrtf((float)Dk);
#pragma unroll
        for (int r = 0; r < 4; r++)
            vals[r] *= inv;
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int i = threadIdx.x + r * blockDim.x;
        if (i < n)
            c[(size_t)t * C + ch0 + i] = vals[r];
    }
    if (hidx == 0)
        for (int hv = threadIdx.x; hv < Hv; hv += blockDim.x)
            gdn_gates(t, hv, Hv, a, b, A_log, dt_bias, decay[(size_t)t * Hv + hv], beta[(size_t)t * Hv + hv]);
}

/* Grid (2Hk + Hv, T): gdn_conv_head of block (x, t); k_gdn_state updates
 * the conv state after it. */
__global__ void k_gdn_conv(const float *__restrict__ qkv, const float *__restrict__ conv_w,
                           const float *__restrict__ state, int Hk, int Hv, int Dk, int Dv, int K, float l2eps,
                           const float *__restrict__ a, const float *__restrict__ b, const float *__restrict__ A_log,
                           const float *__restrict__ dt_bias, float *__restrict__ c, float *__restrict__ beta,
                           float *__restrict__ decay)
{
    pdl_enter();
    __shared__ float red[33];
    gdn_conv_head(blockIdx.x, blockIdx.y, qkv, conv_w, state, Hk, Hv, Dk, Dv, K, l2eps, a, b, A_log, dt_bias, c, beta,
                  decay, red);
}

/* 1 / ||v|| of one q or k head that a warp holds lane-major (lane l: its
 * channels l + 32 j, n of them in nj columns j), times Dk^-0.5 for a q head: the l2 norm of
 * gdn_conv_head, bitwise. The sum of squares follows block_sum's tree for
 * 128 threads: virtual thread (warp q = j % 4, lane l) sums its r = j / 4
 * in order, each virtual warp's butterfly, then (w0 + w2) + (w1 + w3). */
template <int R>
__device__ __forceinline__ float gdn_l2_inv_warp(const float (&v)[R], int nj, int n, float l2eps, bool is_q, int Dk)
{
    const int lane = threadIdx.x & 31;
    float ss[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float sq = 0.f;
#pragma unroll
        for (int r = 0; r < R / 4; r++) {
            const int j = q + 4 * r;
            if (j < nj && lane + 32 * j < n)
                sq += v[j] * v[j];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sq += __shfl_xor_sync(0xffffffffu, sq, o);
        ss[q] = sq;
    }
    float inv = 1.f / sqrtf((ss[0] + ss[2]) + (ss[1] + ss[3]) + l2eps);
    if (is_q)
        inv *= 1.f / sqrtf((float)Dk);
    return inv;
}

/* The prefill form of k_gdn_conv (cu_gdn_conv_mode 1, T > GDN_STEP_T, the
 * conv of KT taps, heads of at most 32 * GW_R channels): one warp per
 * (head vector, GW_TPW consecutive tokens), GW_WARPS warps a block along
 * the tokens. Lane l holds channels l + 32 j of the head; the rows a
 * warp's tokens read are loaded once (a sliding window) instead of KT
 * times, and a block covers 32 tokens of a head where k_gdn_conv's 128
 * threads covered one.
 * Bitwise k_gdn_conv: each channel's taps in gdn_conv_ch's order, and the
 * q/k sum of squares in block_sum's tree for 128 threads (thread 32 w + l
 * held channels 32 w + l + 128 r, r ascending; each warp's butterfly, then
 * (w0 + w2) + (w1 + w3)). */
constexpr int GW_TPW = 8, GW_WARPS = 4;

template <int KT, int GW_R>
__global__ void __launch_bounds__(GW_WARPS * 32)
k_gdn_conv_w(const float *__restrict__ qkv, const float *__restrict__ conv_w, const float *__restrict__ state,
             int Hk, int Hv, int Dk, int Dv, int T, float l2eps, const float *__restrict__ a,
             const float *__restrict__ b, const float *__restrict__ A_log, const float *__restrict__ dt_bias,
             float *__restrict__ c, float *__restrict__ beta, float *__restrict__ decay)
{
    pdl_enter();
    const int hidx = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t0 = (blockIdx.y * GW_WARPS + warp) * GW_TPW;
    if (t0 >= T)
        return;
    const int nt = min(GW_TPW, T - t0);
    const int C = 2 * Hk * Dk + Hv * Dv;
    const bool is_qk = hidx < 2 * Hk;
    int ch0, n;
    gdn_head_channels(hidx, Hk, Dk, Dv, ch0, n);
    const int nj = (n + 31) / 32;
    float w[GW_R][KT];
#pragma unroll
    for (int j = 0; j < GW_R; j++) {
        const int i = lane + 32 * j;
#pragma unroll
        for (int k = 0; k < KT; k++)
            w[j][k] = (j < nj && i < n) ? conv_w[(size_t)(ch0 + i) * KT + k] : 0.f;
    }
    /* rows t0 .. t0 + nt + KT - 2 of concat(state, qkv) for the lane's channels */
    float x[GW_R][GW_TPW + KT - 1];
#pragma unroll
    for (int j = 0; j < GW_R; j++) {
        const int i = lane + 32 * j;
#pragma unroll
        for (int u = 0; u < GW_TPW + KT - 1; u++) {
            const int xi = t0 + u;
            float v = 0.f;
            if (j < nj && i < n && u < nt + KT - 1)
                v = xi < KT - 1 ? state[(size_t)xi * C + ch0 + i] : qkv[(size_t)(xi - (KT - 1)) * C + ch0 + i];
            x[j][u] = v;
        }
    }
#pragma unroll
    for (int u = 0; u < GW_TPW; u++) {
        if (u >= nt)
            break;
        const int t = t0 + u;
        float v[GW_R];
#pragma unroll
        for (int j = 0; j < GW_R; j++) {
            float acc = 0.f;
#pragma unroll
            for (int k = 0; k < KT; k++)
                acc += w[j][k] * x[j][u + k];
            v[j] = silu(acc);
        }
        if (is_qk) {
            const float inv = gdn_l2_inv_warp<GW_R>(v, nj, n, l2eps, hidx < Hk, Dk);
#pragma unroll
            for (int j = 0; j < GW_R; j++)
                v[j] *= inv;
        }
#pragma unroll
        for (int j = 0; j < GW_R; j++) {
            const int i = lane + 32 * j;
            if (j < nj && i < n)
                c[(size_t)t * C + ch0 + i] = v[j];
        }
        if (hidx == 0)
            for (int hv = lane; hv < Hv; hv += 32)
                gdn_gates(t, hv, Hv, a, b, A_log, dt_bias, decay[(size_t)t * Hv + hv], beta[(size_t)t * Hv + hv]);
    }
}

/* The decode form (T <= GDN_STEP_T, gdn_step 2): grid (2Hk + Hv), each
 * block walks the T tokens of its head, then, its reads done, moves that
 * head's channels of the conv state (and history) as k_gdn_state does; no
 * other block reads them. Same bits as k_gdn_conv + k_gdn_state, one
 * launch fewer. */
__global__ void k_gdn_conv_state(const float *__restrict__ qkv, const float *__restrict__ conv_w,
                                 float *__restrict__ state, int Hk, int Hv, int Dk, int Dv, int K, float l2eps,
                                 const float *__restrict__ a, const float *__restrict__ b,
                                 const float *__restrict__ A_log, const float *__restrict__ dt_bias,
                                 float *__restrict__ c, float *__restrict__ beta, float *__restrict__ decay, int T,
                                 float *__restrict__ hist, size_t hstride, int nh)
{
    pdl_enter();
    __shared__ float red[33];
    const int hidx = blockIdx.x;
    for (int t = 0; t < T; t++)
        gdn_conv_head(hidx, t, qkv, conv_w, state, Hk, Hv, Dk, Dv, K, l2eps, a, b, A_log, dt_bias, c, beta, decay,
                      red);
    if (K < 2)
        return;
    __syncthreads(); /* every read of this head's old conv state is done */
    const int C = 2 * Hk * Dk + Hv * Dv;
    int ch0, n;
    gdn_head_channels(hidx, Hk, Dk, Dv, ch0, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        gdn_shift_ch(state, qkv, hist, hstride, nh, ch0 + i, T, K, C);
}

/* New conv state = rows T..T+K-2 of concat(state, qkv); one thread per
 * channel, ascending rows, so the in-place update never reads a row it
 * already replaced. Runs after k_gdn_conv has read the old state. */
__global__ void k_gdn_state(float *__restrict__ state, const float *__restrict__ qkv, int C, int K, int T,
                            float *__restrict__ hist, size_t hstride, int nh)
{
    pdl_enter();
    for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < C; ch += gridDim.x * blockDim.x)
        gdn_shift_ch(state, qkv, hist, hstride, nh, ch, T, K, C);
}

/* A delta-rule thread's place in its block (value head, 32 columns of Dv;
 * 4 warps): lane = (column within the warp's 8, quarter of the Dk rows);
 * cl its column in the block, col in the head, rows i0.. (rows_per at
 * most), active while col < Dv. k_gdn_rec's, k_gdn_step's and
 * k_gdn_after_conv's layout. */
struct gdn_lane {
    int cl, col, part, rows_per, i0;
    bool active;
};
__device__ __forceinline__ gdn_lane gdn_lane_of(int Dk, int Dv)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    gdn_lane g;
    g.cl = warp * 8 + (lane & 7);
    g.col = blockIdx.y * 32 + g.cl;
    g.part = lane >> 3;
    g.rows_per = (Dk + 3) / 4;
    g.i0 = g.part * g.rows_per;
    g.active = g.col < Dv;
    return g;
}

/* The rows of S a thread holds, [i0, i0 + n): RPT of them but at the end of
 * Dk (or none for an inactive column). When a thread holds all RPT, its
 * loads and stores go out unpredicated on 32-bit offsets (a Dk x Dv block
 * of one head is far below 2^31 floats): per row one IMAD and the access,
 * where the per-row checks and 64-bit products were ~12 dependent
 * instructions, k_gdn_after_conv's serial stream at one warp a scheduler
 * (ncu s22r3: 2400 instructions a warp, 4.9 cycles each). */
__device__ __forceinline__ int gdn_rows_held(bool active, int i0, int rows_per, int Dk)
{
    return active ? max(0, min(rows_per, Dk - i0)) : 0;
}

/* A thread's RPT rows of S (rows i0.., column col of the head's Dk x Dv
 * block S0) into registers (0 past Dk or for an inactive column), and back. */
template <int RPT>
__device__ __forceinline__ void gdn_s_load(float (&s)[RPT], const float *S0, bool active, int i0, int rows_per, int Dk,
                                           int Dv, int col)
{
    const int n = gdn_rows_held(active, i0, rows_per, Dk);
    const float *p = S0 + (size_t)i0 * Dv + col;
    if (n == RPT) {
#pragma unroll
        for (int r = 0; r < RPT; r++)
            s[r] = p[r * Dv];
    } else {
#pragma unroll
        for (int r = 0; r < RPT; r++)
            s[r] = r < n ? p[r * Dv] : 0.f;
    }
}

template <int RPT>
__device__ __forceinline__ void gdn_s_store(const float (&s)[RPT], float *S0, bool active, int i0, int rows_per,
                                            int Dk, int Dv, int col)
{
    const int n = gdn_rows_held(active, i0, rows_per, Dk);
    float *p = S0 + (size_t)i0 * Dv + col;
    if (n == RPT) {
#pragma unroll
        for (int r = 0; r < RPT; r++)
            p[r * Dv] = s[r];
    } else {
#pragma unroll
        for (int r = 0; r < RPT; r++)
            if (r < n)
                p[r * Dv] = s[r];
    }
}

/* One token of the delta rule for a thread's RPT rows of S (column col,
 * quarter part): S = a S + k delta^T with delta = (v - a k.S) beta, out =
 * q.S, the dot products finished by two xor-shuffles; the state after the
 * token to Hh when given. k_gdn_rec's and k_gdn_step's arithmetic. */
template <int RPT>
__device__ __forceinline__ void gdn_rule_token(float (&s)[RPT], const float (&kr)[RPT], const float (&qr)[RPT], float v,
                                               float a, float bt, bool active, int part, int i0, int rows_per, int Dk,
                                               int Dv, int col, float *out_t, float *Hh)
{
    float dot = 0.f;
#pragma unroll
    for (int r = 0; r < RPT; r++)
        dot = fmaf(s[r], kr[r], dot);
    dot += __shfl_xor_sync(0xffffffffu, dot, 8);
    dot += __shfl_xor_sync(0xffffffffu, dot, 16);
    float delta = (v - a * dot) * bt;
    float od = 0.f;
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        s[r] = fmaf(kr[r], delta, a * s[r]);
        od = fmaf(s[r], qr[r], od);
    }
    od += __shfl_xor_sync(0xffffffffu, od, 8);
    od += __shfl_xor_sync(0xffffffffu, od, 16);
    if (active && part == 0)
        out_t[col] = od;
    if (Hh) /* the state after this token, for a rollback to it */
        gdn_s_store<RPT>(s, Hh, active, i0, rows_per, Dk, Dv, col);
}

constexpr int GDN_STEP_T = 8;
constexpr int GDN_STEP_DK = 256;
/* a token's q or k row in shared memory, one float of padding per 32: the
 * delta rule's four row quarters of a warp (rows 32 p + r at one time) fall
 * in four banks instead of one (ncu s22r3: a 3.9-way conflict on every
 * load of them) */
constexpr int GDN_STEP_DKP = GDN_STEP_DK + GDN_STEP_DK / 32;
__device__ __forceinline__ int gdn_kq_at(int i) { return i + (i >> 5); }

/* k_gdn_rec's delta rule over T tokens whose q, k, v (the block's 32
 * columns), decay and beta are in shared memory: k_gdn_step's and
 * k_gdn_after_conv's last phase. */
template <int RPT>
__device__ __forceinline__ void gdn_rule_tokens(float (&s)[RPT], const float (&qs)[GDN_STEP_T][GDN_STEP_DKP],
                                                const float (&ks)[GDN_STEP_T][GDN_STEP_DKP],
                                                const float (&vs)[GDN_STEP_T][32], const float *dec_s,
                                                const float *bet_s, int T, bool active, int part, int i0,
                                                int rows_per, int Dk, int Dv, int Hv, int hv, int cl, int col,
                                                float *out, float *hS, size_t hstride, int nh)
{
    /* this thread's rows of k and q: contiguous in the padded row when they
     * are all there and stay inside one 32 (RPT 8, 16, 32 at Dk = 4 RPT) */
    const int nk = gdn_rows_held(true, i0, rows_per, Dk), kb = gdn_kq_at(i0);
    const bool flat = nk == RPT && (i0 & 31) + RPT <= 32;
    for (int t = 0; t < T; t++) {
        float kr[RPT], qr[RPT];
        if (flat) {
#pragma unroll
            for (int r = 0; r < RPT; r++) {
                kr[r] = ks[t][kb + r];
                qr[r] = qs[t][kb + r];
            }
        } else {
#pragma unroll
            for (int r = 0; r < RPT; r++) {
                const int i = gdn_kq_at(i0 + r);
                kr[r] = r < nk ? ks[t][i] : 0.f;
                qr[r] = r < nk ? qs[t][i] : 0.f;
            }
        }
        gdn_rule_token<RPT>(s, kr, qr, active ? vs[t][cl] : 0.f, dec_s[t], bet_s[t], active, part, i0, rows_per, Dk,
                            Dv, col, out + ((size_t)t * Hv + hv) * Dv,
                            t < nh ? hS + (size_t)t * hstride + (size_t)hv * Dk * Dv : nullptr);
    }
}

/* The delta rule. Block (value head hv, 32 columns of Dv), 4 warps; lane =
 * (column within the warp's 8, quarter of the Dk rows). Each thread keeps
 * its RPT = Dk/4 rows of S for its column in registers across all T tokens;
 * dot products over Dk are finished with two xor-shuffles. */
template <int RPT>
__global__ void __launch_bounds__(128)
k_gdn_rec(const float *__restrict__ c, const float *__restrict__ beta, const float *__restrict__ decay,
          float *__restrict__ S, int Hk, int Hv, int Dk, int Dv, int T, float *__restrict__ out,
          float *__restrict__ hist, size_t hstride, int nh)
{
    pdl_enter();
    const int hv = blockIdx.x, hk = hv / (Hv / Hk);
    /* members, not structured bindings: the load lambda captures them */
    const gdn_lane L = gdn_lane_of(Dk, Dv);
    const int key_dim = Hk * Dk, C = 2 * key_dim + Hv * Dv;
    float *Sh = S + (size_t)hv * Dk * Dv;
    float s[RPT];
    gdn_s_load<RPT>(s, Sh, L.active, L.i0, L.rows_per, Dk, Dv, L.col);
    /* token t's k, q, v, decay and beta are loaded while token t-1 is
     * computed (they do not depend on S): a verify pass of T tokens pays
     * about one load latency instead of T. Up to 16 rows a thread; above,
     * the second set of registers would spill, so loads stay in the step. */
    constexpr bool PF = RPT <= 16;
    float kr[RPT], qr[RPT], v = 0.f, a = 0.f, bt = 0.f;
    auto load = [&](int t, float (&kk)[RPT], float (&qq)[RPT], float &vv, float &aa, float &bb) {
        const float *ct = c + (size_t)t * C;
        const float *qv = ct + (size_t)hk * Dk, *kv = ct + key_dim + (size_t)hk * Dk;
#pragma unroll
        for (int r = 0; r < RPT; r++) {
            int i = L.i0 + r;
            kk[r] = (r < L.rows_per && i < Dk) ? __ldg(kv + i) : 0.f;
            qq[r] = (r < L.rows_per && i < Dk) ? __ldg(qv + i) : 0.f;
        }
        vv = L.active ? ct[2 * key_dim + (size_t)hv * Dv + L.col] : 0.f;
        aa = decay[(size_t)t * Hv + hv];
        bb = beta[(size_t)t * Hv + hv];
    };
    if (PF && T > 0)
        load(0, kr, qr, v, a, bt);
    for (int t = 0; t < T; t++) {
        float kn[PF ? RPT : 1], qn[PF ? RPT : 1], vn = 0.f, an = 0.f, bn = 0.f;
        if constexpr (PF) {
            if (t + 1 < T)
                load(t + 1, kn, qn, vn, an, bn);
        } else {
            load(t, kr, qr, v, a, bt);
        }
        gdn_rule_token<RPT>(s, kr, qr, v, a, bt, L.active, L.part, L.i0, L.rows_per, Dk, Dv, L.col,
                            out + ((size_t)t * Hv + hv) * Dv,
                            t < nh ? hist + (size_t)t * hstride + (size_t)hv * Dk * Dv : nullptr);
        if constexpr (PF) {
#pragma unroll
            for (int r = 0; r < RPT; r++) {
                kr[r] = kn[r];
                qr[r] = qn[r];
            }
            v = vn;
            a = an;
            bt = bn;
        }
    }
    gdn_s_store<RPT>(s, Sh, L.active, L.i0, L.rows_per, Dk, Dv, L.col);
}

/* The decode step of a GatedDeltaNet layer in one kernel (T <= GDN_STEP_T
 * tokens: a decode step or a prompt-lookup verify pass): block (value head
 * hv, 32 columns of Dv) first forms, for every token, what k_gdn_conv would
 * (its key head's q and k through the causal conv + SiLU + l2 norm, its 32
 * v channels, decay and beta of hv) into shared memory, with the same
 * operations in the same order, then runs k_gdn_rec's delta rule on them;
 * the conv state (and the rollback history) is updated as k_gdn_state does
 * it: a block's own v channels by that block, a key head's q/k channels,
 * which every block of the head's group reads, by the group's last block to
 * finish reading (cnt[hk], reset by it for the next launch). Same bits as
 * the three kernels, two launches fewer per layer. */
template <int RPT>
__global__ void __launch_bounds__(128)
k_gdn_step(const float *__restrict__ qkv, const float *__restrict__ conv_w, float *__restrict__ state, int Hk,
           int Hv, int Dk, int Dv, int K, float l2eps, const float *__restrict__ a, const float *__restrict__ b,
           const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *__restrict__ S, int T,
           float *__restrict__ out, float *__restrict__ hist, size_t hstride, size_t hconv, int nh,
           int *__restrict__ cnt)
{
    pdl_enter();
    __shared__ float red[33];
    __shared__ float qs[GDN_STEP_T][GDN_STEP_DKP], ks[GDN_STEP_T][GDN_STEP_DKP], vs[GDN_STEP_T][32];
    __shared__ float dec_s[GDN_STEP_T], bet_s[GDN_STEP_T];
    __shared__ int last_s;
    const int hv = blockIdx.x, hk = hv / (Hv / Hk);
    const int key_dim = Hk * Dk, C = 2 * key_dim + Hv * Dv;
    const int vc0 = 2 * key_dim + hv * Dv + blockIdx.y * 32; /* this block's first v channel */
    const int nv = min(32, Dv - (int)blockIdx.y * 32);
    auto conv = [&](int ch, int t) { return gdn_conv_ch(conv_w, state, qkv, ch, t, K, C); };
    for (int t = 0; t < T; t++) {
        /* q (hq 0) and k (hq 1) of key head hk: k_gdn_conv's blocks hk and Hk + hk */
        for (int hq = 0; hq < 2; hq++) {
            const int ch0 = hq * key_dim + hk * Dk;
            float ss = 0.f, vals[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int i = threadIdx.x + r * blockDim.x;
                vals[r] = 0.f;
                if (i < Dk) {
                    float v = conv(ch0 + i, t);
                    vals[r] = v;
                    ss += v * v;
                }
            }
            ss = block_sum(ss, red);
            float inv = 1.f / sqrtf(ss + l2eps);
            if (hq == 0)
                inv *= 1.f / sqrtf((float)Dk);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int i = threadIdx.x + r * blockDim.x;
                if (i < Dk)
                    (hq == 0 ? qs : ks)[t][gdn_kq_at(i)] = vals[r] * inv;
            }
        }
        if ((int)threadIdx.x < nv)
            vs[t][threadIdx.x] = conv(vc0 + threadIdx.x, t);
        if (threadIdx.x == 0)
            gdn_gates(t, hv, Hv, a, b, A_log, dt_bias, dec_s[t], bet_s[t]);
    }
    __syncthreads(); /* every read of the old conv state by this block is done */

    /* conv state and history, as k_gdn_state */
    auto shift = [&](int ch) { gdn_shift_ch(state, qkv, hist, hstride, nh, ch, T, K, C); };
    if (K > 1) {
        if ((int)threadIdx.x < nv)
            shift(vc0 + threadIdx.x); /* only this block reads these */
        if (threadIdx.x == 0) {
            __threadfence();
            const int group = (Hv / Hk) * (int)gridDim.y;
            last_s = atomicAdd(cnt + hk, 1) == group - 1;
        }
        __syncthreads();
        if (last_s) {
            __threadfence();
            for (int i = threadIdx.x; i < 2 * Dk; i += blockDim.x)
                shift(i < Dk ? hk * Dk + i : key_dim + hk * Dk + (i - Dk));
            if (threadIdx.x == 0)
                cnt[hk] = 0; /* ready for the next launch */
        }
    }

    /* the delta rule: k_gdn_rec with q, k, v, decay and beta from shared memory */
    float *hS = nh ? hist + hconv : nullptr;
    /* gdn_lane_of's layout, spelled out: through the helper ptxas gave this
     * kernel 216 registers instead of 168 at RPT 32 and spills at 16 and 64 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cl = warp * 8 + (lane & 7), col = blockIdx.y * 32 + cl;
    const int part = lane >> 3;
    const int rows_per = (Dk + 3) / 4;
    const int i0 = part * rows_per;
    const bool active = col < Dv;
    float *Sh = S + (size_t)hv * Dk * Dv;
    float s[RPT];
    gdn_s_load<RPT>(s, Sh, active, i0, rows_per, Dk, Dv, col);
    gdn_rule_tokens<RPT>(s, qs, ks, vs, dec_s, bet_s, T, active, part, i0, rows_per, Dk, Dv, Hv, hv, cl, col, out,
                         hS, hstride, nh);
    gdn_s_store<RPT>(s, Sh, active, i0, rows_per, Dk, Dv, col);
}

/* The rest of a GDN decode / verify step whose conv a GEMV epilogue did
 * (cu_gemv_conv: c holds silu(conv) of every channel, the conv state and
 * the history's conv part are already moved): block (value head hv, 32
 * columns of Dv) l2-normalises its key head's q and k and forms its gates,
 * then runs k_gdn_rec's delta rule from shared memory, as k_gdn_step does.
 * The norms take one warp per (token, q or k): lane l holds channels
 * l + 32 j, and the sum of squares follows block_sum's tree for 128
 * threads (thread 32 q + l held channels 32 q + l + 128 r, r ascending;
 * each warp's butterfly, then (w0 + w2) + (w1 + w3)), as k_gdn_conv_w does:
 * k_gdn_conv_state's bits without its barriers per token. */
template <int RPT>
__global__ void __launch_bounds__(128)
k_gdn_after_conv(const float *__restrict__ c, int Hk, int Hv, int Dk, int Dv, float l2eps,
                 const float *__restrict__ a, const float *__restrict__ b, const float *__restrict__ A_log,
                 const float *__restrict__ dt_bias, float *__restrict__ S, int T, float *__restrict__ out,
                 float *__restrict__ hS, size_t hstride, int nh)
{
    pdl_enter();
    __shared__ float qs[GDN_STEP_T][GDN_STEP_DKP], ks[GDN_STEP_T][GDN_STEP_DKP], vs[GDN_STEP_T][32];
    __shared__ float dec_s[GDN_STEP_T], bet_s[GDN_STEP_T];
    const int hv = blockIdx.x, hk = hv / (Hv / Hk);
    const int key_dim = Hk * Dk, C = 2 * key_dim + Hv * Dv;
    const int vc0 = 2 * key_dim + hv * Dv + blockIdx.y * 32;
    const int nv = min(32, Dv - (int)blockIdx.y * 32);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const auto [cl, col, part, rows_per, i0, active] = gdn_lane_of(Dk, Dv);
    float *Sh = S + (size_t)hv * Dk * Dv;
    float s[RPT];
    gdn_s_load<RPT>(s, Sh, active, i0, rows_per, Dk, Dv, col); /* first: the norms do not need it */
    /* v's values and the gates' inputs next: loaded after the norms, as
     * before, they were two more round trips on warp 0's path, which the
     * barrier below waits for */
    float vv[GDN_STEP_T];
#pragma unroll
    for (int t = 0; t < GDN_STEP_T; t++)
        vv[t] = t < T && (int)threadIdx.x < nv ? c[(size_t)t * C + vc0 + threadIdx.x] : 0.f;
    float g_al = 0.f, g_a = 0.f, g_dt = 0.f, g_b = 0.f;
    if ((int)threadIdx.x < T) {
        g_al = A_log[hv];
        g_a = a[(size_t)threadIdx.x * Hv + hv];
        g_dt = dt_bias[hv];
        g_b = b[(size_t)threadIdx.x * Hv + hv];
    }
    constexpr int NJ = GDN_STEP_DK / 32;
    for (int p = warp; p < 2 * T; p += 4) {
        const int t = p >> 1, hq = p & 1;
        const float *src = c + (size_t)t * C + hq * key_dim + hk * Dk;
        float v[NJ];
#pragma unroll
        for (int j = 0; j < NJ; j++)
            v[j] = lane + 32 * j < Dk ? src[lane + 32 * j] : 0.f;
        const float inv = gdn_l2_inv_warp<NJ>(v, NJ, Dk, l2eps, hq == 0, Dk);
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (lane + 32 * j < Dk)
                (hq == 0 ? qs : ks)[t][gdn_kq_at(lane + 32 * j)] = v[j] * inv;
    }
#pragma unroll
    for (int t = 0; t < GDN_STEP_T; t++)
        if (t < T && (int)threadIdx.x < nv)
            vs[t][threadIdx.x] = vv[t];
    if ((int)threadIdx.x < T)
        gdn_gate_vals(g_al, g_a, g_dt, g_b, dec_s[threadIdx.x], bet_s[threadIdx.x]);
    __syncthreads();
    gdn_rule_tokens<RPT>(s, qs, ks, vs, dec_s, bet_s, T, active, part, i0, rows_per, Dk, Dv, Hv, hv, cl, col, out,
                         hS, hstride, nh);
    gdn_s_store<RPT>(s, Sh, active, i0, rows_per, Dk, Dv, col);
}

/* ------------------------------------------------------------------------ */

/* Argmax in two passes so a 248k vocabulary row is read by many blocks:
 * slices of ARGMAX_SLICE values (one per block, at most ARGMAX_MAX_SPLIT a
 * row) -> (value, index) partials -> one warp per row. A thread's
 * ARGMAX_LOADS loads are issued together, so a slice costs one round
 * trip to L2 (64 slices of 3880 values looped through one load at a time
 * took 8.6 us of a 35B-A3B step, run 49). Ties keep the lower index; NaN
 * never wins. */
constexpr int ARGMAX_SLICE = 2048, ARGMAX_MAX_SPLIT = 512, ARGMAX_THREADS = 256,
              ARGMAX_LOADS = ARGMAX_SLICE / ARGMAX_THREADS; /* a thread's loads issued together */

__host__ __device__ __forceinline__ int argmax_split(int n)
{
    const int k = (n + ARGMAX_SLICE - 1) / ARGMAX_SLICE;
    return k < 1 ? 1 : k > ARGMAX_MAX_SPLIT ? ARGMAX_MAX_SPLIT : k;
}

__device__ __forceinline__ void amax_merge(float &best, int &bi, float v, int i)
{
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}

__global__ void __launch_bounds__(ARGMAX_THREADS)
k_argmax_part(const float *__restrict__ x, int n, float2 *__restrict__ part)
{
    pdl_enter();
    const float *xr = x + (size_t)blockIdx.x * n;
    const int split = argmax_split(n), per = (n + split - 1) / split;
    const int i0 = blockIdx.y * per, i1 = min(n, i0 + per);
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += ARGMAX_SLICE) {
        float v[ARGMAX_LOADS];
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; u++)
            v[u] = i + ARGMAX_THREADS * u < i1 ? __ldg(xr + i + ARGMAX_THREADS * u) : -INFINITY;
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; u++)
            if (i + ARGMAX_THREADS * u < i1)
                amax_merge(best, bi, v[u], i + ARGMAX_THREADS * u);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        amax_merge(best, bi, ob, oi);
    }
    __shared__ float sb[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    if ((threadIdx.x & 31) == 0) {
        sb[threadIdx.x >> 5] = best;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        best = sb[0];
        bi = si[0];
        for (int w = 1; w < ARGMAX_THREADS / 32; w++)
            amax_merge(best, bi, sb[w], si[w]);
        part[(size_t)blockIdx.x * ARGMAX_MAX_SPLIT + blockIdx.y] = make_float2(best, __int_as_float(bi));
    }
}

__global__ void k_argmax_final(const float2 *__restrict__ part, int split, int32_t *__restrict__ out)
{
    pdl_enter();
    const int lane = threadIdx.x;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    /* every lane's partials loaded at once, then merged in index order */
    constexpr int PL = ARGMAX_MAX_SPLIT / 32;
    float2 p[PL];
#pragma unroll
    for (int u = 0; u < PL; u++)
        p[u] = lane + 32 * u < split ? part[(size_t)blockIdx.x * ARGMAX_MAX_SPLIT + lane + 32 * u]
                                     : make_float2(-INFINITY, __int_as_float(0x7fffffff));
#pragma unroll
    for (int u = 0; u < PL; u++)
        amax_merge(best, bi, p[u].x, __float_as_int(p[u].y));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        amax_merge(best, bi, ob, oi);
    }
    if (lane == 0)
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
}

} // namespace

sn_status cu_ops_init(const cu_devinfo *di)
{
    int v = (int)di->smem_optin;
    SN_TRY(cu_pf_init(di)); /* [prefill] cuda_prefill.cu */
    /* the 8-warp GQA decode keeps 8 x R x D floats of partials (64 KB at R = 8, D = 256) */
#define GQA8_SMEM(E, R)                                                                                              \
    CU_TRY(cudaFuncSetAttribute(k_attn_decode_gqa<E, R, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,              \
                                (int)(8 * R * 256 * sizeof(float))),                                                 \
           "attention init");
    GQA8_SMEM(1, 2) GQA8_SMEM(1, 4) GQA8_SMEM(1, 6) GQA8_SMEM(1, 8)
    GQA8_SMEM(2, 2) GQA8_SMEM(2, 4) GQA8_SMEM(2, 6) GQA8_SMEM(2, 8)
    GQA8_SMEM(4, 2) GQA8_SMEM(4, 4) GQA8_SMEM(4, 6) GQA8_SMEM(4, 8)
    GQA8_SMEM(8, 2) GQA8_SMEM(8, 4) GQA8_SMEM(8, 6) GQA8_SMEM(8, 8)
#undef GQA8_SMEM
    CU_TRY(cudaFuncSetAttribute(k_attn_prefill<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, v), "attention init");
    CU_TRY(cudaFuncSetAttribute(k_attn_prefill<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, v), "attention init");
    CU_TRY(cudaFuncSetAttribute(k_attn_prefill<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, v), "attention init");
    CU_TRY(cudaFuncSetAttribute(k_attn_prefill<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, v), "attention init");
    return SN_OK;
}

int cu_rmsnorm_threads(int n) { return (int)norm_threads(n); }

sn_status cu_rmsnorm(cudaStream_t s, const float *x, const float *w, int rows, int n, float eps, float *y)
{
    if (rows <= 0)
        return SN_OK;
    (void)cu_launch(k_rmsnorm, (unsigned)rows, norm_threads(n), 0, s, x, w, n, eps, y);
    CU_CHECK_LAUNCH("rmsnorm");
    return SN_OK;
}

sn_status cu_gated_rmsnorm(cudaStream_t s, const float *o, const float *z, const float *w, int rows, int n,
                           float eps, float *y)
{
    if (rows <= 0)
        return SN_OK;
    if (n % 4 == 0 && n <= 4096 && (((uintptr_t)o | (uintptr_t)z | (uintptr_t)y) & 15) == 0)
        (void)cu_launch_small(PDL_GATED_NORM, k_gated_rmsnorm_w, (unsigned)((rows + 7) / 8), 256, 0, s, o, z, w, rows,
                              n, eps, y);
    else
        (void)cu_launch(k_gated_rmsnorm, (unsigned)rows, norm_threads(n), 0, s, o, z, w, n, eps, y);
    CU_CHECK_LAUNCH("gated_rmsnorm");
    return SN_OK;
}

sn_status cu_copy_n(cudaStream_t s, int n, void *const *dst, const void *const *src, const size_t *bytes)
{
    if (n <= 0)
        return SN_OK;
    if (n > CU_COPY_N_MAX)
        return SN_FAIL(SN_E_INVALID, "copy_n: %d copies in one launch (max %d)", n, CU_COPY_N_MAX);
    copy_list L;
    size_t most = 0;
    for (int i = 0; i < n; i++) {
        if ((((uintptr_t)dst[i] | (uintptr_t)src[i] | bytes[i]) & 15) != 0 || bytes[i] / 16 > 0xffffffffu)
            return SN_FAIL(SN_E_INVALID, "copy_n: copy %d is not in whole 16-byte words", i);
        L.dst[i] = (uint4 *)dst[i];
        L.src[i] = (const uint4 *)src[i];
        L.n16[i] = (unsigned)(bytes[i] / 16);
        most = bytes[i] / 16 > most ? bytes[i] / 16 : most;
    }
    unsigned bx = (unsigned)((most + 255) / 256);
    bx = bx < 1 ? 1 : bx > 64 ? 64 : bx;
    (void)cu_launch(k_copy_n, dim3(bx, (unsigned)n), 256, 0, s, L);
    CU_CHECK_LAUNCH("copy_n");
    return SN_OK;
}

sn_status cu_add(cudaStream_t s, float *y, const float *x, size_t n)
{
    if (!n)
        return SN_OK;
    (void)cu_launch(k_add, ew_grid(n), 256, 0, s, y, x, n);
    CU_CHECK_LAUNCH("add");
    return SN_OK;
}

sn_status cu_swiglu(cudaStream_t s, const float *g, const float *u, size_t n, float *out)
{
    if (!n)
        return SN_OK;
    (void)cu_launch(k_swiglu, ew_grid(n), 256, 0, s, g, u, n, out);
    CU_CHECK_LAUNCH("swiglu");
    return SN_OK;
}

sn_status cu_mul_sigmoid(cudaStream_t s, float *y, const float *g, size_t n)
{
    if (!n)
        return SN_OK;
    (void)cu_launch(k_mul_sigmoid, ew_grid(n), 256, 0, s, y, g, n);
    CU_CHECK_LAUNCH("mul_sigmoid");
    return SN_OK;
}

sn_status cu_add_gated(cudaStream_t s, float *y, const float *x, const float *g, int T, int n)
{
    size_t N = (size_t)T * n;
    if (!N)
        return SN_OK;
    (void)cu_launch(k_add_gated, ew_grid(N), 256, 0, s, y, x, g, T, n);
    CU_CHECK_LAUNCH("add_gated");
    return SN_OK;
}

sn_status cu_rope(cudaStream_t s, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                  const int *d_delta, const float *inv_freq, float mscale)
{
    size_t n = (size_t)T * n_heads * (rot_dim / 2);
    if (!n)
        return SN_OK;
    (void)cu_launch(k_rope, ew_grid(n), 256, 0, s, x, T, n_heads, head_dim, rot_dim / 2, pos0, d_delta, inv_freq, mscale);
    CU_CHECK_LAUNCH("rope");
    return SN_OK;
}

sn_status cu_kv_write(cudaStream_t s, const sn_kv_view *kv, const float *k, const float *v, int T, int pos0,
                      const int *d_delta)
{
    size_t row = (size_t)kv->n_kv_heads * kv->head_dim, n = row * T;
    if (!n)
        return SN_OK;
    (void)cu_launch(k_kv_write, ew_grid(n), 256, 0, s, kv->k, kv->v, k, v, n, row, pos0, d_delta);
    CU_CHECK_LAUNCH("kv_write");
    return SN_OK;
}

/* on by default: written in run 18, first truly timed in run 37 (H100, three rounds, ms per step):
 * 35B-A3B 2.311-2.337 against 2.324-2.381, 27B 8.147-8.160 against 8.217-8.223, the default model
 * 0.223 against 0.231-0.233 (results.log s27r1) */
int cu_fuse_attn_prep = 1;

sn_status cu_attn_prep(cudaStream_t s, const cu_attn_prep_args *a, const int *d_delta)
{
    const unsigned nb = (unsigned)(a->T * (a->Hq + a->Hkv));
    if (!nb)
        return SN_OK;
    (void)cu_launch_small(PDL_ATTN_PREP, k_attn_prep, nb, norm_threads(a->D), (size_t)a->D * sizeof(float), s, *a,
                          d_delta);
    CU_CHECK_LAUNCH("attention prep");
    return SN_OK;
}

/* Decode (split-KV) for up to this many new tokens; the tiled kernel above. */
#define DECODE_MAX_T 8

size_t cu_attention_scratch_bytes(const sn_kv_view *kv, int T, int n_q_heads)
{
    if (T > DECODE_MAX_T)
        return 0;
    return (size_t)T * n_q_heads * NSPLIT_MAX * (kv->head_dim + 2) * sizeof(float);
}

sn_status cu_attention(const cu_devinfo *di, cudaStream_t s, const float *q, const sn_kv_view *kv, int T,
                       int pos0, const int *d_delta, int n_q_heads, float scale, float *out, void *scratch,
                       const float *gate)
{
    if (T <= 0)
        return SN_OK;
    if (gate && T > DECODE_MAX_T) {
        /* only the decode combine takes the gate: here it is its own pass */
        SN_TRY(cu_attention(di, s, q, kv, T, pos0, d_delta, n_q_heads, scale, out, scratch, NULL));
        return cu_mul_sigmoid(s, out, gate, (size_t)T * n_q_heads * kv->head_dim);
    }
    int D = kv->head_dim, Hkv = kv->n_kv_heads;
    if (D > 256)
        return SN_FAIL(SN_E_UNSUPPORTED, "attention: head_dim %d > 256", D);
    if (T <= DECODE_MAX_T) {
        float *part = (float *)scratch;
        const int ns = di->attn_splits == 128 ? 128 : 64;
        /* warps per (kv head, split) block of the GQA kernel: 8 (one
         * 256-thread block per SM, registers) when one token's blocks fit
         * one wave at that, else 4 (two per SM); attn_warps 4 or 8 forces
         * one. Never chosen from T: the warps' merge order is part of a
         * token's bits, which must not depend on the rows beside it. */
        const int nw = di->attn_warps == 8 || (di->attn_warps == 0 && Hkv * ns <= di->n_sm) ? 8 : DEC_WARPS;
        int epl = (D + 31) / 32, r = n_q_heads / Hkv;
        if (r >= 2 && r <= 8) {
            dim3 grid((unsigned)(T * Hkv), (unsigned)ns);
#define GQA_LAUNCH(E, R)                                                                                             \
    do {                                                                                                             \
        if (nw == 8)                                                                                                 \
            (void)cu_launch_small(PDL_ATTN, k_attn_decode_gqa<E, R, 8>, grid, 8 * 32,                                \
                                  (size_t)8 * R * D * sizeof(float), s, q, kv->k, kv->v, n_q_heads, Hkv, D, pos0,    \
                                  d_delta, scale, part);                                                             \
        else                                                                                                         \
            (void)cu_launch_small(PDL_ATTN, k_attn_decode_gqa<E, R, DEC_WARPS>, grid, DEC_WARPS * 32,                \
                                  (size_t)DEC_WARPS * R * D * sizeof(float), s, q, kv->k, kv->v, n_q_heads, Hkv, D,  \
                                  pos0, d_delta, scale, part);                                                       \
    } while (0)
#define GQA_R(E)                                                                                                     \
    do {                                                                                                             \
        if (r <= 2) GQA_LAUNCH(E, 2);                                                                                \
        else if (r <= 4) GQA_LAUNCH(E, 4);                                                                           \
        else if (r <= 6) GQA_LAUNCH(E, 6);                                                                           \
        else GQA_LAUNCH(E, 8);                                                                                       \
    } while (0)
            if (epl <= 1) GQA_R(1);
            else if (epl <= 2) GQA_R(2);
            else if (epl <= 4) GQA_R(4);
            else GQA_R(8);
#undef GQA_R
#undef GQA_LAUNCH
        } else {
        dim3 grid((unsigned)(T * n_q_heads), (unsigned)ns);
        size_t smem = (size_t)DEC_WARPS * D * sizeof(float);
        if (epl <= 1)
            (void)cu_launch_small(PDL_ATTN, k_attn_decode<1>, grid, DEC_WARPS * 32, smem, s, q, kv->k, kv->v, n_q_heads,
                                  Hkv, D, pos0, d_delta, scale, part);
        else if (epl <= 2)
            (void)cu_launch_small(PDL_ATTN, k_attn_decode<2>, grid, DEC_WARPS * 32, smem, s, q, kv->k, kv->v, n_q_heads,
                                  Hkv, D, pos0, d_delta, scale, part);
        else if (epl <= 4)
            (void)cu_launch_small(PDL_ATTN, k_attn_decode<4>, grid, DEC_WARPS * 32, smem, s, q, kv->k, kv->v, n_q_heads,
                                  Hkv, D, pos0, d_delta, scale, part);
        else
            (void)cu_launch_small(PDL_ATTN, k_attn_decode<8>, grid, DEC_WARPS * 32, smem, s, q, kv->k, kv->v, n_q_heads,
                                  Hkv, D, pos0, d_delta, scale, part);
        }
        CU_CHECK_LAUNCH("attention decode");
        const int cth = ((D > ns ? D : ns) + 31) / 32 * 32; /* D <= 256 */
        (void)cu_launch_small(PDL_COMBINE, k_attn_combine, (unsigned)(T * n_q_heads), cth, 0, s, part, ns, D, out,
                              gate);
        CU_CHECK_LAUNCH("attention combine");
        return SN_OK;
    }
    /* [prefill] tensor-core flash attention for long T (cuda_prefill.cu) */
    if (cu_pf_attn_use(kv, T, n_q_heads))
        return cu_pf_attention(s, q, kv, T, pos0, d_delta, n_q_heads, scale, out);
    size_t smem = prefill_smem(D);
    if (smem > di->smem_optin)
        return SN_FAIL(SN_E_UNSUPPORTED, "attention: head_dim %d needs %zu B of shared memory", D, smem);
    dim3 grid((unsigned)((T + PF_BQ - 1) / PF_BQ), (unsigned)n_q_heads);
    int mi = (D + 7) / 8;
#define PF_LAUNCH(MI)                                                                                             \
    do {                                                                                                          \
        (void)cu_launch(k_attn_prefill<MI>, grid, PF_THREADS, smem, s, q, kv->k, kv->v, T, n_q_heads, Hkv, D, pos0, d_delta,  \
                                                          scale, out);                                           \
    } while (0)
    if (mi <= 4)
        PF_LAUNCH(4);
    else if (mi <= 8)
        PF_LAUNCH(8);
    else if (mi <= 16)
        PF_LAUNCH(16);
    else
        PF_LAUNCH(32);
#undef PF_LAUNCH
    CU_CHECK_LAUNCH("attention prefill");
    return SN_OK;
}

size_t cu_gdn_scratch_bytes(const sn_gdn_dims *d, int T)
{
    size_t C = 2 * (size_t)d->n_k_heads * d->dk + (size_t)d->n_v_heads * d->dv;
    return sizeof(float) * ((size_t)T * C + 2 * (size_t)T * d->n_v_heads) + 512 +
           cu_pf_gdn_scratch_bytes(d, T); /* [prefill] chunked delta rule (cuda_prefill.cu) */
}

/* 2 by default: the two-kernel form, three interleaved rounds against the three kernels (0) on the
 * H200 (2026-12-02 01:31Z): 35B-A3B 2.586-2.640 against 2.630-2.648 ms per step, 27B 8.178-8.304
 * against 8.242-8.381. The one-kernel step (1) was measured slower than 0 (2026-12-01 18:07Z: 35B-A3B
 * decode 313.5-321.2 vs 325.3-325.7 tok/s, 27B 105.9-106.8 vs 106.8-107.5). */
int cu_gdn_step_mode = 2;

/* 1 (default): the prefill conv (T > 8) by k_gdn_conv_w where it applies; 0: k_gdn_conv. Same bits. */
int cu_gdn_conv_mode = 1;

/* f(RPT) for the delta-rule kernels (k_gdn_rec, k_gdn_step): Dk / 4 rows
 * of S per thread, as the 8, 16, 32 or 64 of an instantiation */
template <typename F>
static void gdn_by_rpt(int Dk, F &&f)
{
    const int rpt = (Dk + 3) / 4;
    if (rpt <= 8)
        f(std::integral_constant<int, 8>{});
    else if (rpt <= 16)
        f(std::integral_constant<int, 16>{});
    else if (rpt <= 32)
        f(std::integral_constant<int, 32>{});
    else
        f(std::integral_constant<int, 64>{});
}

sn_status cu_gdn(cudaStream_t s, const sn_gdn_dims *d, const float *qkv, const float *a, const float *b,
                 const float *conv_w, const float *A_log, const float *dt_bias, float *conv_state, float *S,
                 float *hist, int n_hist, int T, float *out, void *scratch, int *cnt)
{
    if (T <= 0)
        return SN_OK;
    const int nh = hist ? min(n_hist, T - 1) : 0;
    const size_t hstride = sn_gdn_hist_floats(d), hconv = hstride - (size_t)d->n_v_heads * d->dk * d->dv;
    float *hS = nh ? hist + hconv : nullptr; /* the S part of slot 0 */
    int Hk = d->n_k_heads, Hv = d->n_v_heads, Dk = d->dk, Dv = d->dv, K = d->conv_k;
    if (Dk > 256 || Dv > 512)
        return SN_FAIL(SN_E_UNSUPPORTED, "gdn: dk %d (max 256) dv %d (max 512)", Dk, Dv);
    size_t C = 2 * (size_t)Hk * Dk + (size_t)Hv * Dv;
    float *c = (float *)scratch;
    float *beta = c + (size_t)T * C, *decay = beta + (size_t)T * Hv;
    float l2eps = d->norm_eps > 0.f ? d->norm_eps : 1e-6f;
    const dim3 rgrid((unsigned)Hv, (unsigned)((Dv + 31) / 32)); /* the delta rule's blocks */
    if (cu_gdn_step_mode == 1 && cnt && T <= GDN_STEP_T && Dk <= GDN_STEP_DK && Hk <= CU_GDN_CNT && Hv % Hk == 0) {
        /* decode / verify: the whole step in one kernel (k_gdn_step) */
        gdn_by_rpt(Dk, [&](auto R) {
            (void)cu_launch(k_gdn_step<decltype(R)::value>, rgrid, 128, 0, s, qkv, conv_w, conv_state, Hk, Hv, Dk, Dv,
                            K, l2eps, a, b, A_log, dt_bias, S, T, out, hist, hstride, hconv, nh, cnt);
        });
        CU_CHECK_LAUNCH("gdn step");
        return SN_OK;
    }
    unsigned th = 128; /* k_gdn_conv covers up to 4*128 channels per head */
    const bool two = cu_gdn_step_mode == 2 && T <= GDN_STEP_T;
    if (two) {
        /* decode / verify: conv and conv state in one launch, then the recurrence */
        (void)cu_launch(k_gdn_conv_state, (unsigned)(2 * Hk + Hv), th, 0, s, qkv, conv_w, conv_state, Hk, Hv, Dk, Dv,
                        K, l2eps, a, b, A_log, dt_bias, c, beta, decay, T, hist, hstride, nh);
        CU_CHECK_LAUNCH("gdn conv + state");
    } else if (cu_gdn_conv_mode == 1 && K == 4 && Dk <= 256 && Dv <= 256) {
        /* [prefill] one warp per (head, 8 tokens) */
        const dim3 grid((unsigned)(2 * Hk + Hv), (unsigned)((T + GW_TPW * GW_WARPS - 1) / (GW_TPW * GW_WARPS)));
        if (Dk <= 128 && Dv <= 128)
            (void)cu_launch(k_gdn_conv_w<4, 4>, grid, GW_WARPS * 32, 0, s, qkv, conv_w, conv_state, Hk, Hv, Dk, Dv,
                            T, l2eps, a, b, A_log, dt_bias, c, beta, decay);
        else
            (void)cu_launch(k_gdn_conv_w<4, 8>, grid, GW_WARPS * 32, 0, s, qkv, conv_w, conv_state, Hk, Hv, Dk, Dv,
                            T, l2eps, a, b, A_log, dt_bias, c, beta, decay);
        CU_CHECK_LAUNCH("gdn conv");
    } else {
        (void)cu_launch(k_gdn_conv, dim3((unsigned)(2 * Hk + Hv), (unsigned)T), th, 0, s, qkv, conv_w, conv_state, Hk,
                        Hv, Dk, Dv, K, l2eps, a, b, A_log, dt_bias, c, beta, decay);
        CU_CHECK_LAUNCH("gdn conv");
    }
    if (K > 1 && !two) {
        (void)cu_launch(k_gdn_state, (unsigned)((C + 255) / 256), 256, 0, s, conv_state, qkv, (int)C, K, T, hist,
                        hstride, nh);
        CU_CHECK_LAUNCH("gdn conv state");
    }
    /* [prefill] chunked delta rule for long T (cuda_prefill.cu); its scratch follows decay */
    if (!nh && cu_pf_gdn_use(d, T))
        return cu_pf_gdn(s, d, c, beta, decay, S, T, out, decay + (size_t)T * Hv);
    gdn_by_rpt(Dk, [&](auto R) {
        (void)cu_launch(k_gdn_rec<decltype(R)::value>, rgrid, 128, 0, s, c, beta, decay, S, Hk, Hv, Dk, Dv, T, out, hS,
                        hstride, nh);
    });
    CU_CHECK_LAUNCH("gdn recurrence");
    return SN_OK;
}

bool cu_gdn_folds_conv(const sn_gdn_dims *d, int T)
{
    return T >= 1 && T <= GDN_STEP_T && d->conv_k == CU_CONV_K && d->dk <= GDN_STEP_DK && d->dv <= 512 &&
           d->n_k_heads > 0 && d->n_v_heads % d->n_k_heads == 0;
}

sn_status cu_gdn_after_conv(cudaStream_t s, const sn_gdn_dims *d, const float *c, const float *a, const float *b,
                            const float *A_log, const float *dt_bias, float *S, float *hist, int n_hist, int T,
                            float *out)
{
    if (!cu_gdn_folds_conv(d, T))
        return SN_FAIL(SN_E_INVALID, "gdn: the conv of Dk %d, K %d, T %d is not folded", d->dk, d->conv_k, T);
    const int nh = hist ? min(n_hist, T - 1) : 0;
    const size_t hstride = sn_gdn_hist_floats(d), hconv = hstride - (size_t)d->n_v_heads * d->dk * d->dv;
    float *hS = nh ? hist + hconv : nullptr; /* the S part of slot 0 */
    const float l2eps = d->norm_eps > 0.f ? d->norm_eps : 1e-6f;
    const dim3 rgrid((unsigned)d->n_v_heads, (unsigned)((d->dv + 31) / 32));
    gdn_by_rpt(d->dk, [&](auto R) {
        (void)cu_launch_small(PDL_GDN, k_gdn_after_conv<decltype(R)::value>, rgrid, 128, 0, s, c, d->n_k_heads,
                              d->n_v_heads, d->dk, d->dv, l2eps, a, b, A_log, dt_bias, S, T, out, hS, hstride, nh);
    });
    CU_CHECK_LAUNCH("gdn after the folded conv");
    return SN_OK;
}

size_t cu_argmax_scratch_bytes(int rows) { return (size_t)rows * ARGMAX_MAX_SPLIT * sizeof(float2) + 256; }

sn_status cu_argmax(cudaStream_t s, const float *x, int rows, int n, int32_t *d_out, void *scratch)
{
    if (rows <= 0)
        return SN_OK;
    float2 *part = (float2 *)scratch;
    const int split = argmax_split(n);
    (void)cu_launch(k_argmax_part, dim3((unsigned)rows, (unsigned)split), ARGMAX_THREADS, 0, s, x, n, part);
    CU_CHECK_LAUNCH("argmax");
    (void)cu_launch(k_argmax_final, (unsigned)rows, 32, 0, s, part, split, d_out);
    CU_CHECK_LAUNCH("argmax final");
    return SN_OK;
}
