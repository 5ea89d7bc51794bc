/* MoE decode in two launches (issue 6): T tokens (decode, prompt-lookup
 * verification; cu_moe sends every T below the grouped-GEMM threshold here)
 * through
 *
 *   k_md_gate_up  routing + gate/up GEMVs + SiLU product, grid (row blocks, k, T):
 *                 every block recomputes token t's routing from the logits
 *                 (softmax, top-k by k rounds of a warp max with the lowest
 *                 index on ties, weights renormalised when asked): by
 *                 default its warps 1.. find the top k of parts of the
 *                 experts while warp 0 forms the softmax's max and sum,
 *                 then warp 0 merges (md_route_part / md_route_merge;
 *                 moe_route 0: warp 0 alone, md_route) and hands the result
 *                 to the others - the same instructions on the same data in
 *                 every block, so all agree - then block (r, j, t) computes rows r.. of
 *                 h[t, j] = w_j * silu(gate_e x_t) * (up_e x_t), e = expert j.
 *                 Block (0, j, t) stores e for the down kernel and, with
 *                 cu_moe_dec_mode 2, every block asks L2 to prefetch its share
 *                 of expert e's down matrix (a hint: no effect on results).
 *   k_md_down     grid (row blocks, T): a warp owns output rows and runs one
 *                 dot product over the concatenation of the k scaled
 *                 activations h[t, 0..k) against the rows of the k chosen
 *                 down matrices (the weighted sum over the experts is that
 *                 dot product: h is scaled by w_j already), then the optional
 *                 epilogue of the graph fuser: y = v + sigmoid(g[t]) * sh
 *                 (k_add_gated's operations) and add_to += y (k_add's).
 *                 With cu_moe_dn_early (default) it is launched with the
 *                 PDL edge and reads the expert ids by flags the gate/up
 *                 blocks set as soon as they have routed (md_publish), so
 *                 its weights are in flight before the gate/up kernel ends;
 *                 for one token at one row a warp, whose blocks fit beside
 *                 the gate/up kernel's (cu_moe_dn_rpw).
 *
 * moe_shared adds the layer's shared expert as slot k of both launches
 * (cu_moe_sh, same shape and format as the experts): blocks (r, k, t) skip
 * the routing and use its own gate/up rows with the weight
 * sigmoid(sg[t]), and its down matrix joins the one dot product, so the
 * shared expert's three GEMV launches and its swiglu disappear.
 *
 * Arithmetic per (token, row) does not depend on T, on the grid or on which
 * other tokens share the call, and every sum has a fixed order: results are
 * deterministic and a token's bits are the same alone or among others.
 * Both kernels load their activations (x, h) into registers before their
 * weights (cu_moe_pre, md_pre): loads issued after the weights' waited
 * behind them. Weight chunks (16 bytes per lane) and the staged
 * activations follow the decode GEMV of cuda_matmul.cu: x in shared memory
 * in lane-major order with per-chunk sums, Q4 nibbles to floats by a
 * byte-permute (0.5 + q/256), Q8 by half2 (1 + q/256). */
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_quant.h"

int cu_moe_dec_mode = 1; /* see cuda_moe.h */
/* see cuda_moe.h; 1: the 35B-A3B decode step 2.542-2.557 ms against 2.609-2.612 with warp 0
 * routing alone, three interleaved rounds on the H200 (results.log 2026-12-02T02:34Z) */
int cu_moe_route = 1;
/* see cuda_moe.h; 3: the 35B-A3B decode step 2.381-2.384 ms against 2.429-2.436 with 0, six-row
 * verify 6.839-6.857 against 7.029-7.062 (one binary, three interleaved rounds, H200, s13r3) */
int cu_moe_pre = 3;
/* see cuda_moe.h; 0 (by T): with the early start, one row a warp for a single token took the
 * 35B-A3B step from 2.441-2.507 ms to 2.220-2.302 (its 256-thread blocks at 64 registers fit
 * beside four gate/up blocks an SM, so they start before the gate/up kernel ends), while two
 * were faster at two rows (3.201-3.210 against 3.368-3.411) and six (6.486-6.502 against
 * 6.755-6.771; three interleaved rounds each, H100, results.log s28r3/s28r4) */
int cu_moe_dn_rpw = 0;
int cu_moe_gu_warps = 4; /* 35B-A3B decode 298.7-303.4 -> 323.3-327.4 tok/s (H200, about 18:13Z) */
int cu_moe_dn_early = 1; /* see cuda_moe.h */
/* see cuda_moe.h; 1 (one token): the 35B-A3B step 2.142-2.197 ms against 2.231-2.263 without the
 * edge, but the 6-row verify step 6.644-6.647 against 6.492-6.497 (three interleaved rounds, H100,
 * results.log s28r7) */
int cu_moe_gu_edge = 1;
int cu_moe_dp = 1; /* see cuda_moe.h */
int cu_moe_dn_u = 5; /* see cuda_moe.h (the other forms: MD_DN_U) */

namespace {

constexpr int MD_WARPS = 8;
constexpr int MD_THREADS = MD_WARPS * 32;
constexpr int MD_RPW = 2;        /* output rows per warp: gate/up; down above one token (cu_moe_dn_rpw) */
constexpr int MD_MAX_K = 64;
constexpr int MD_MAX_E = 1024;   /* routing keeps ceil(E/32) keys per lane in registers */
constexpr size_t MD_SMEM_MAX = 47 * 1024; /* dynamic: with the static part under 48 KB, no opt-in */
constexpr int MD_GU_U = 2;       /* chunk steps loaded ahead per lane: gate/up (4 rows) */
constexpr int MD_DN_U = 4;       /* down (2 rows) */
constexpr int MD_GU_XR = 4;      /* float4s of x a thread holds across the routing (md_pre): H <= 2048 at 4 warps */
constexpr int MD_DN_XR = 5;      /* of h: (k + 1) * I <= 5120 at 8 warps (35B-A3B: 9 * 512) */

__host__ __device__ __forceinline__ int64_t md_stride4(int64_t nch, int bits)
{
    return (nch + 31) / 32 * ((128 / bits) / 4) * 32;
}

__host__ __device__ __forceinline__ size_t md_stage_bytes(int64_t n, int bits)
{
    const int64_t nch = n * bits / 128;
    return xstage_bytes(1, nch, md_stride4(nch, bits));
}

/* n values of x (n a multiple of the chunk) into xs, lane-major, then the
 * chunk sums after stride4 float4s: the SIMT GEMV's staging of one token
 * (cuda_quant.h). Whole block; ends with a barrier. */
template <int BITS>
__device__ void md_stage(float4 *xs, const float *__restrict__ x, int64_t n)
{
    stage_x<BITS>(xs, x, 1, n, md_stride4(n * BITS / 128, BITS));
}

/* one (scale, bias) pair as loaded: 4 bytes (bf16/f16) or 8 (f32) */
__device__ __forceinline__ uint2 md_ld_sb(const void *sb, int sf, int i)
{
    if (sf == CS_F32)
        return __ldg((const uint2 *)sb + i);
    return make_uint2(__ldg((const unsigned int *)sb + i), 0u);
}

/* The quant group of chunk c: c / cpg, by a shift when cpg (chunks per
 * group) is a power of two. The kernels' chunk indices are 32-bit: their
 * 64-bit divisions were a subroutine call per load (ncu). */
struct md_cdiv {
    int d, sh; /* divisor; its log2, or -1 */
};

md_cdiv md_cdiv_of(int d)
{
    int sh = 0;
    while ((1 << sh) < d)
        sh++;
    return md_cdiv{ d, (1 << sh) == d ? sh : -1 };
}

__device__ __forceinline__ int md_div(int c, md_cdiv q) { return q.sh >= 0 ? c >> q.sh : c / q.d; }

/* The staging in two halves, so that its loads leave before the weights'
 * (ncu, 35B-A3B: the staging's stores waited on loads queued behind the
 * weights', a fifth of both kernels' samples): md_pre_load issues this
 * thread's float4s q = threadIdx.x + i * blockDim.x of x into registers
 * right after pdl_wait; md_pre_store writes them where md_stage would,
 * after the weights' first loads are issued, and forms the chunk sums (the
 * same values, the same order: the same bits). NR float4s a thread at
 * most: a longer or unaligned x takes md_stage (md_pre_fits). */
template <int NR>
struct md_pre {
    float4 v[NR];
};

template <int NR>
__device__ __forceinline__ bool md_pre_fits(const float *x, int64_t n)
{
    return ((uintptr_t)x & 15) == 0 && n / 4 <= (int64_t)NR * blockDim.x;
}

template <int NR>
__device__ __forceinline__ void md_pre_load(md_pre<NR> &p, const float *__restrict__ x, int64_t n)
{
    const int n4 = (int)(n / 4);
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int q = threadIdx.x + i * blockDim.x;
        p.v[i] = q < n4 ? __ldg((const float4 *)x + q) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <int BITS, int NR>
__device__ void md_pre_store(float4 *xs, const md_pre<NR> &p, int64_t n)
{
    constexpr int NF4 = (128 / BITS) / 4;
    const int n4 = (int)(n / 4);
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int q = threadIdx.x + i * blockDim.x;
        if (q < n4)
            xs[xperm<BITS>(q / NF4, q % NF4)] = p.v[i];
    }
    __syncthreads();
    const int64_t nch = n * BITS / 128;
    chunk_sums<BITS>(xs, 1, nch, md_stride4(nch, BITS));
}

/* chunk values of token x as floats: VPC of them */
template <int BITS>
__device__ __forceinline__ void md_xload(const float4 *xs, int c, float (&xv)[128 / BITS])
{
    constexpr int NF4 = (128 / BITS) / 4;
#pragma unroll
    for (int i = 0; i < NF4; i++) {
        const float4 f = xs[xperm<BITS>(c, i)];
        xv[4 * i] = f.x;
        xv[4 * i + 1] = f.y;
        xv[4 * i + 2] = f.z;
        xv[4 * i + 3] = f.w;
    }
}

/* s * sum(q * x) + b * sum(x) over one chunk (one uint4 of words) */
template <int BITS>
__device__ __forceinline__ float md_chunk(uint4 wv, float2 sb, const float (&xv)[128 / BITS], float xsum)
{
    const uint32_t ws[4] = { wv.x, wv.y, wv.z, wv.w };
    float d = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (BITS == 4) {
            const uint32_t lo = ws[j] & 0x0F0F0F0Fu, hi = (ws[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                /* byte k of lo/hi -> the float 0.5 + q/256 */
                d = fmaf(__uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7044u | ((uint32_t)k << 8))), xv[8 * j + 2 * k], d);
                d = fmaf(__uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7044u | ((uint32_t)k << 8))), xv[8 * j + 2 * k + 1], d);
            }
        } else {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                /* bytes (k, k+2) of the word -> 1 + q/256 as a half2 */
                const uint32_t s = k == 0 ? (ws[j] << 2) : (ws[j] >> 6);
                const uint32_t h = (s & 0x03FC03FCu) | 0x3C003C00u;
                const float2 p = __half22float2(*reinterpret_cast<const __half2 *>(&h));
                d = fmaf(p.x, xv[4 * j + k], d);
                d = fmaf(p.y, xv[4 * j + k + 2], d);
            }
        }
    }
    const float qd = BITS == 4 ? 256.f * (d - 0.5f * xsum) : 256.f * (d - xsum);
    return sb.x * qd + sb.y * xsum;
}

/* Order-preserving unsigned key of a logit: larger value, larger key; -0
 * as +0 (they compare equal: the lower index wins, as with floats); NaN
 * below every number (1); 0 marks "taken / no element". */
__device__ __forceinline__ uint32_t md_key(float v)
{
    if (v != v)
        return 1u;
    const uint32_t u = __float_as_uint(v == 0.f ? 0.f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The softmax's max and sum over a warp's E logits, lane-major (val[i] is
 * logit lane + 32 i): md_route's, and warp 0's half of the parallel routing. */
template <int NPL>
__device__ __forceinline__ void md_softmax_stats(const float (&val)[NPL], int E, float &mx, float &sum)
{
    const int lane = threadIdx.x & 31;
    mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        mx = lane + 32 * i < E ? fmaxf(mx, val[i]) : mx;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    sum = 0.f;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i < E)
            sum += expf(val[i] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
}

/* Token routing by one warp (every lane gets the result): softmax over the
 * E logits, k rounds of "largest remaining key, lowest index on ties", and
 * the weight of choice jsel, renormalised over the k when norm. */
template <int NPL>
__device__ __forceinline__ void md_route(const float *__restrict__ l, int E, int k, int norm, int jsel, int *e_out,
                                         float *w_out)
{
    const int lane = threadIdx.x & 31;
    uint32_t key[NPL];
    float val[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        val[i] = e < E ? __ldg(l + e) : 0.f;
        key[i] = e < E ? md_key(val[i]) : 0u;
    }
    float mx, sum;
    md_softmax_stats<NPL>(val, E, mx, sum);
    float tot = 0.f, psel = 0.f;
    int esel = 0;
    for (int j = 0; j < k; j++) {
        uint32_t b = 0u;
#pragma unroll
        for (int i = 0; i < NPL; i++)
            b = max(b, key[i]);
        const uint32_t m = __reduce_max_sync(0xffffffffu, b);
        uint32_t cand = 0xffffffffu;
#pragma unroll
        for (int i = NPL - 1; i >= 0; i--)
            if (key[i] == m)
                cand = (uint32_t)(lane + 32 * i);
        uint32_t sel = __reduce_min_sync(0xffffffffu, cand);
        if (m == 0u || sel >= (uint32_t)E)
            sel = 0u; /* cannot happen for k <= E; keeps the index valid */
        float ov = 0.f;
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if ((uint32_t)(lane + 32 * i) == sel) {
                ov = val[i];
                key[i] = 0u;
            }
        const float v = __shfl_sync(0xffffffffu, ov, (int)(sel & 31u));
        const float p = expf(v - mx) / sum;
        tot += p;
        if (j == jsel) {
            esel = (int)sel;
            psel = p;
        }
    }
    *e_out = esel;
    *w_out = norm ? psel / tot : psel;
}

/* The parallel routing (cu_moe_route 1): warps 1..NW-1 each take the
 * experts lane + 32 i of the columns i = w - 1, w - 1 + (NW - 1), ... and
 * find their k best by md_route's rounds (largest key, lowest index on
 * ties), into cand (key, expert, logit) in selection order, key 0 past the
 * end; meanwhile warp 0 forms md_route's max and sum; then warp 0 merges
 * the candidates with the same rounds. The global top k of a set is among
 * the top k of the parts that hold them, and the merge picks them in the
 * same order with the same weights as md_route. */
constexpr int MD_CAND = 64; /* (NW - 1) * k candidates at most (two per lane) */
struct md_cand {
    uint32_t key[MD_CAND];
    int idx[MD_CAND];
    float val[MD_CAND];
};

template <int NPL, int NW>
__device__ __forceinline__ void md_route_part(const float *__restrict__ l, int E, int k, int w, md_cand &c)
{
    constexpr int NC = (NPL + NW - 2) / (NW - 1); /* columns of this warp, at most */
    const int lane = threadIdx.x & 31;
    uint32_t key[NC];
    float val[NC];
#pragma unroll
    for (int m = 0; m < NC; m++) {
        const int i = w - 1 + m * (NW - 1), e = lane + 32 * i;
        const bool in = i < NPL && e < E;
        val[m] = in ? __ldg(l + e) : 0.f;
        key[m] = in ? md_key(val[m]) : 0u;
    }
    for (int j = 0; j < k; j++) {
        uint32_t b = 0u;
#pragma unroll
        for (int m = 0; m < NC; m++)
            b = max(b, key[m]);
        const uint32_t mk = __reduce_max_sync(0xffffffffu, b);
        uint32_t cand = 0xffffffffu;
#pragma unroll
        for (int m = NC - 1; m >= 0; m--)
            if (mk != 0u && key[m] == mk)
                cand = (uint32_t)(lane + 32 * (w - 1 + m * (NW - 1)));
        const uint32_t sel = __reduce_min_sync(0xffffffffu, cand);
        float ov = 0.f;
#pragma unroll
        for (int m = 0; m < NC; m++)
            if ((uint32_t)(lane + 32 * (w - 1 + m * (NW - 1))) == sel) {
                ov = val[m];
                key[m] = 0u;
            }
        const float v = __shfl_sync(0xffffffffu, ov, (int)(sel & 31u));
        if (lane == 0) {
            const int slot = (w - 1) * k + j;
            c.key[slot] = mk;
            c.idx[slot] = mk ? (int)sel : 0;
            c.val[slot] = v;
        }
    }
}

/* warp 0's half before the merge: md_route's max and sum */
template <int NPL>
__device__ __forceinline__ void md_route_norm(const float *__restrict__ l, int E, float &mx, float &sum)
{
    const int lane = threadIdx.x & 31;
    float val[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int e = lane + 32 * i;
        val[i] = e < E ? __ldg(l + e) : 0.f;
    }
    md_softmax_stats<NPL>(val, E, mx, sum);
}

/* warp 0: the k best of the n candidates, md_route's rounds and weights */
__device__ __forceinline__ void md_route_merge(const md_cand &c, int n, int k, int norm, int jsel, float mx,
                                               float sum, int *e_out, float *w_out)
{
    const int lane = threadIdx.x & 31;
    uint32_t key[2];
    int idx[2];
    float val[2];
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int s = lane + 32 * m;
        key[m] = s < n ? c.key[s] : 0u;
        idx[m] = s < n ? c.idx[s] : 0;
        val[m] = s < n ? c.val[s] : 0.f;
    }
    float tot = 0.f, psel = 0.f;
    int esel = 0;
    for (int j = 0; j < k; j++) {
        const uint32_t mk = __reduce_max_sync(0xffffffffu, max(key[0], key[1]));
        uint32_t cand = 0xffffffffu;
#pragma unroll
        for (int m = 0; m < 2; m++)
            if (mk != 0u && key[m] == mk)
                cand = min(cand, (uint32_t)idx[m]);
        uint32_t sel = __reduce_min_sync(0xffffffffu, cand);
        if (mk == 0u)
            sel = 0u; /* cannot happen for k <= E (md_route's guard) */
        float ov = 0.f;
        int own = 0;
#pragma unroll
        for (int m = 0; m < 2; m++)
            if (key[m] != 0u && key[m] == mk && (uint32_t)idx[m] == sel) {
                ov = val[m];
                key[m] = 0u;
                own = 1;
            }
        const unsigned who = __ballot_sync(0xffffffffu, own);
        const float v = __shfl_sync(0xffffffffu, ov, who ? __ffs(who) - 1 : 0);
        const float p = expf(v - mx) / sum;
        tot += p;
        if (j == jsel) {
            esel = (int)sel;
            psel = p;
        }
    }
    *e_out = esel;
    *w_out = norm ? psel / tot : psel;
}

struct md_gu_args {
    const uint32_t *Wg, *Wu; /* [E, I, words] */
    const void *Sg, *Su;     /* [E, I, groups] pairs */
    int sf;
    int64_t rows, cols, words, groups; /* I, H */
    md_cdiv cpg;         /* chunks per quant group */
    const float *logits; /* [T, E] */
    int E, k, norm;
    const float *x;      /* [T, H] */
    int32_t *idx;        /* [T, k] out */
    float *h;            /* [T, k, I] out */
    const char *Wd;      /* down experts, for the L2 prefetch (NULL: none) */
    const char *Sd;
    int64_t dq_bytes, ds_bytes; /* per expert */
    /* the shared expert as slot k (Wsg NULL: none), weighted by sigmoid(sg[t]) */
    const uint32_t *Wsg, *Wsu;
    const void *Ssg, *Ssu;
    const char *Wsd, *Ssd; /* its down matrix, for the prefetch */
    const float *sg;       /* [T] */
    int ks;                /* slots per token: k, or k + 1 with the shared expert */
    int par;               /* the parallel routing (cu_moe_route 1 and (warps - 1) * k <= MD_CAND) */
    int pre;               /* cu_moe_pre */
    unsigned *flag;        /* [T, ks]: set once idx is stored (md_publish), NULL: none (cu_moe_dn_early) */
};

/* The down kernel's early start (cu_moe_dn_early): block (0, j, t) of the
 * gate/up kernel stores slot j's expert id as soon as it has routed, then
 * sets its flag with release semantics; the down kernel, launched with the
 * PDL edge, waits on the flags with acquire semantics before its own
 * pdl_wait and issues its weights' first loads while the gate/up kernel
 * still runs. The flag, not pdl_wait, orders the id: cu_moe_dec takes the
 * early start only with a launch without the edge after the previous
 * call's down kernel (the gate/up kernel or the router before it), so that
 * kernel and its clearing of the flags have finished before this down grid
 * can start; and the down grid is scheduled only once every gate/up block
 * has started, so every flag it waits on is being set. The last down
 * block to read them clears them for the next call. */
__device__ __forceinline__ void md_publish(unsigned *f)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(f), "r"(1u) : "memory");
}

__device__ __forceinline__ void md_await(const unsigned *f)
{
    for (long n = 0;; n++) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
        if (v)
            return;
        if (n > (1l << 24))
            __trap(); /* a flag never set is a bug: fail the launch rather than hang */
        __nanosleep(32);
    }
}

/* The gate/up kernel's dp4a form (cu_moe_dp): x staged as the dp4a GEMV's
 * digit planes (cuda_gemv.cu, gd_stage_x: per quant group X = round(x *
 * 2^e2) in three int8 digits, per chunk (2^-e2, 2^-e2 sum X)) and every
 * chunk by gd_chunk: exact int32 partials, one fp32 rounding per (chunk,
 * row) where the fp32 form has one per value. A thread takes 8 values a
 * pass; MD_DP_NP passes' values can be loaded into registers before the
 * routing (md_dp_pre_load), as md_pre does for the fp32 staging. */
constexpr int MD_DP_NP = 2; /* H <= 2048 at 4 warps */

__device__ __forceinline__ bool md_dp_pre_fits(const float *x, int64_t n)
{
    return ((uintptr_t)x & 15) == 0 && n / 8 <= (int64_t)MD_DP_NP * blockDim.x;
}

__device__ __forceinline__ void md_dp_pre_load(float (&pv)[MD_DP_NP][8], const float *__restrict__ x, int64_t n)
{
    const int n8 = (int)(n / 8);
#pragma unroll
    for (int ps = 0; ps < MD_DP_NP; ps++) {
        const int u = ps * blockDim.x + threadIdx.x;
        const float4 a = u < n8 ? __ldg((const float4 *)x + 2 * u) : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 b = u < n8 ? __ldg((const float4 *)x + 2 * u + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
        pv[ps][0] = a.x; pv[ps][1] = a.y; pv[ps][2] = a.z; pv[ps][3] = a.w;
        pv[ps][4] = b.x; pv[ps][5] = b.y; pv[ps][6] = b.z; pv[ps][7] = b.w;
    }
}

/* One token's x (n values, n % group == 0) into the digit planes; pre: its
 * values are in pv already. Whole block; ends with a barrier. */
__device__ void md_stage_digits(char *stage, const float *__restrict__ x, int64_t n, int nit, int group,
                                const float (&pv)[MD_DP_NP][8], bool pre)
{
    uint32_t *xw = (uint32_t *)stage;
    float2 *xe = (float2 *)(stage + (size_t)nit * 3072);
    const int n8 = (int)(n / 8);
    const int lpg = group / 8; /* threads per quant group: 4, 8 or 16, aligned in the warp */
#pragma unroll 1
    for (int p0 = 0, ps = 0; p0 < n8; p0 += blockDim.x, ps++) {
        const int u = p0 + threadIdx.x;
        const bool in = u < n8;
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = 0.f;
        if (pre) {
            gd_pick(pv, ps, v);
        } else if (in) {
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = __ldg(x + 8 * (size_t)u + k);
        }
        gd_digits8(v, lpg, in, u, xw, xe);
    }
    __syncthreads();
}

/* NW warps per block: 8, or 4 with at most 102 registers (five blocks per
 * SM), so that k + 1 slots of 32 row blocks still fit in one wave */
template <int BITS, int NPL, int NW, bool DP = false>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 5 : 1) k_md_gate_up(md_gu_args a)
{
    pdl_launch();
    extern __shared__ float4 xs[];
    constexpr int VPC = 128 / BITS;
    constexpr int NS = 2 * MD_RPW; /* streams: gate rows, then up rows */
    constexpr int U = MD_GU_U;
    const int t = blockIdx.z, j = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nch = (int)(a.words / 4);
    const int nit = (nch + 31) / 32;
    const int64_t r0 = ((int64_t)blockIdx.x * NW + warp) * MD_RPW;
    const int nrows = r0 < a.rows ? (int)min((int64_t)MD_RPW, a.rows - r0) : 0;
    const size_t sbsz = a.sf == CS_F32 ? 8 : 4;
    pdl_wait();
    const float *xt = a.x + (size_t)t * a.cols;
    static_assert(!DP || BITS == 4, "the dp4a form is for Q4");
    const bool pre = (a.pre & 2) && (DP ? md_dp_pre_fits(xt, a.cols) : md_pre_fits<MD_GU_XR>(xt, a.cols));
    md_pre<MD_GU_XR> xp;
    float pv[DP ? MD_DP_NP : 1][8];
    if (pre) { /* in flight during the routing (cu_moe_pre) */
        if constexpr (DP)
            md_dp_pre_load(pv, xt, a.cols);
        else
            md_pre_load(xp, xt, a.cols);
    }

    /* the routing, once per block, handed to every warp through shared
     * memory (every warp doing it was 40 % of the kernel's instructions,
     * ncu, 35B-A3B): by default spread over the warps (md_route_part /
     * md_route_merge), with moe_route 0 by warp 0 alone (md_route) */
    __shared__ int e_s;
    __shared__ float w_s;
    const bool shj = a.Wsg && j == a.k; /* the shared expert's slot: no routing, its own matrices */
    if (NW > 1 && a.par && !shj) {
        __shared__ md_cand cand;
        const float *lt = a.logits + (size_t)t * a.E;
        float mx = 0.f, sum = 0.f;
        if (warp == 0)
            md_route_norm<NPL>(lt, a.E, mx, sum);
        else
            md_route_part<NPL, NW>(lt, a.E, a.k, warp, cand);
        __syncthreads();
        if (warp == 0) {
            int e0;
            float w0;
            md_route_merge(cand, (NW - 1) * a.k, a.k, a.norm, j, mx, sum, &e0, &w0);
            if (lane == 0) {
                e_s = e0;
                w_s = w0;
            }
        }
    } else if (warp == 0) {
        int e0;
        float w0;
        if (shj) {
            e0 = -1;
            w0 = 1.f / (1.f + expf(-a.sg[t]));
        } else {
            md_route<NPL>(a.logits + (size_t)t * a.E, a.E, a.k, a.norm, j, &e0, &w0);
        }
        if (lane == 0) {
            e_s = e0;
            w_s = w0;
        }
    }
    __syncthreads();
    const int e = e_s;
    const float wj = w_s;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        a.idx[(size_t)t * a.ks + j] = e;
        if (a.flag)
            md_publish(a.flag + (size_t)t * a.ks + j); /* after the id: release */
    }
    if (a.Wd && threadIdx.x == 0) {
        /* this block's share of expert e's down matrix (words, then pairs), into L2 */
        const int64_t nb = gridDim.x, b = blockIdx.x;
        const int64_t q0 = a.dq_bytes * b / nb / 16 * 16, q1 = a.dq_bytes * (b + 1) / nb / 16 * 16;
        const int64_t s0 = a.ds_bytes * b / nb / 16 * 16, s1 = a.ds_bytes * (b + 1) / nb / 16 * 16;
        const char *wq = shj ? a.Wsd : a.Wd + e * a.dq_bytes, *ws = shj ? a.Ssd : a.Sd + e * a.ds_bytes;
        if (q1 > q0)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(wq + q0), "r"((uint32_t)(q1 - q0))
                         : "memory");
        if (s1 > s0)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ws + s0), "r"((uint32_t)(s1 - s0))
                         : "memory");
    }

    /* stream s < MD_RPW: gate row r0 + s; else up row r0 + s - MD_RPW */
    const uint4 *W[NS];
    const char *S[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const int rr = s % MD_RPW;
        const int64_t row = (shj ? 0 : (int64_t)e * a.rows) + r0 + rr;
        const uint32_t *wm = shj ? (s < MD_RPW ? a.Wsg : a.Wsu) : (s < MD_RPW ? a.Wg : a.Wu);
        const void *sm = shj ? (s < MD_RPW ? a.Ssg : a.Ssu) : (s < MD_RPW ? a.Sg : a.Su);
        W[s] = (const uint4 *)(wm + row * a.words);
        S[s] = (const char *)sm + (size_t)row * a.groups * sbsz;
    }
    uint4 wv[U][NS];
    uint2 sv[U][NS];
    auto load = [&](int it0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = lane + 32 * (it0 + u);
#pragma unroll
            for (int s = 0; s < NS; s++) {
                if (c < nch && s % MD_RPW < nrows) {
                    wv[u][s] = __ldcs(W[s] + c);
                    sv[u][s] = md_ld_sb(S[s], a.sf, md_div(c, a.cpg));
                } else {
                    wv[u][s] = make_uint4(0u, 0u, 0u, 0u);
                    sv[u][s] = make_uint2(0u, 0u);
                }
            }
        }
    };
    load(0); /* in flight while x is staged */
    if constexpr (DP)
        md_stage_digits((char *)xs, xt, a.cols, nit, a.cpg.d * 32, pv, pre);
    else if (pre)
        md_pre_store<BITS>(xs, xp, a.cols);
    else
        md_stage<BITS>(xs, xt, a.cols);
    if (!nrows)
        return;
    const float *xsums = (const float *)(xs + md_stride4(nch, BITS));
    float acc[NS];
#pragma unroll
    for (int s = 0; s < NS; s++)
        acc[s] = 0.f;
    for (int it0 = 0; it0 < nit; it0 += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = lane + 32 * (it0 + u);
            if (c < nch) {
                if constexpr (DP) {
                    float2 sbf[NS];
                    float ad[NS][1];
#pragma unroll
                    for (int s = 0; s < NS; s++) {
                        sbf[s] = sb_pair(sv[u][s], a.sf);
                        ad[s][0] = acc[s];
                    }
                    gd_chunk<1, NS>(wv[u], sbf, (const char *)xs, nit, nch, c, ad, 1);
#pragma unroll
                    for (int s = 0; s < NS; s++)
                        acc[s] = ad[s][0];
                } else {
                    float xv[VPC];
                    md_xload<BITS>(xs, c, xv);
                    const float xsum = xsums[c];
#pragma unroll
                    for (int s = 0; s < NS; s++)
                        acc[s] += md_chunk<BITS>(wv[u][s], sb_pair(sv[u][s], a.sf), xv, xsum);
                }
            }
        }
        if (it0 + U < nit)
            load(it0 + U);
    }
#pragma unroll
    for (int s = 0; s < NS; s++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            acc[s] += __shfl_xor_sync(0xffffffffu, acc[s], o);
    if (lane < nrows) {
        float g = 0.f, u = 0.f;
#pragma unroll
        for (int s = 0; s < MD_RPW; s++)
            if (s == lane) {
                g = acc[s];
                u = acc[MD_RPW + s];
            }
        a.h[((size_t)t * a.ks + j) * a.rows + r0 + lane] = wj * (g / (1.f + expf(-g)) * u);
    }
}

struct md_dn_args {
    const uint32_t *Wd; /* [E, H, words] */
    const void *Sd;
    int sf;
    int64_t rows, cols, words, groups; /* H, I */
    int k;              /* slots per token (the shared expert's included) */
    md_cdiv cpg, nce;   /* chunks per quant group, per expert row */
    const uint32_t *Wsd; /* the shared expert's down matrix (slot index -1) */
    const void *Ssd;
    const int32_t *idx; /* [T, k] */
    const float *h;     /* [T, k, I] */
    float *out;         /* [T, H] */
    const float *sh;    /* epilogue (all NULL: none): y = v + sigmoid(sg[t]) * sh[t, r] */
    const float *sg;
    float *add_to;      /* add_to[t, r] += y */
    int pre;            /* cu_moe_pre */
    unsigned *flag;     /* [T, k] the gate/up kernel's flags (the early start), NULL: ids after pdl_wait */
    unsigned *done;     /* blocks that have read them */
};

/* U: chunk steps loaded ahead per lane (cu_moe_dn_u) */
template <int BITS, int RPW, int U = MD_DN_U>
__global__ void __launch_bounds__(MD_THREADS) k_md_down(md_dn_args a)
{
    pdl_launch();
    extern __shared__ float4 xs[];
    /* each slot's down matrix (words, pairs): a routed expert's, or the shared one's */
    __shared__ const uint32_t *wsl[MD_MAX_K + 1];
    __shared__ const char *ssl[MD_MAX_K + 1];
    constexpr int VPC = 128 / BITS;
    const int t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nce = a.nce.d;      /* chunks per expert row */
    const int F = a.k * nce;      /* chunks of the concatenated row */
    const int nit = (F + 31) / 32;
    const int64_t r0 = ((int64_t)blockIdx.x * MD_WARPS + warp) * RPW;
    const int nrows = r0 < a.rows ? (int)min((int64_t)RPW, a.rows - r0) : 0;
    const size_t sbsz = a.sf == CS_F32 ? 8 : 4;
    const float *ht = a.h + (size_t)t * a.k * a.cols;
    const int64_t hn = (int64_t)a.k * a.cols;
    const bool pre = (a.pre & 1) && md_pre_fits<MD_DN_XR>(ht, hn); /* cu_moe_pre */
    md_pre<MD_DN_XR> hp;
    auto slots = [&] {
        for (int i = threadIdx.x; i < a.k; i += blockDim.x) {
            if (a.flag)
                md_await(a.flag + (size_t)t * a.k + i);
            const int e = __ldcg(a.idx + (size_t)t * a.k + i);
            wsl[i] = e >= 0 ? a.Wd + (size_t)e * a.rows * a.words : a.Wsd;
            ssl[i] = e >= 0 ? (const char *)a.Sd + (size_t)e * a.rows * a.groups * sbsz : (const char *)a.Ssd;
        }
        __syncthreads();
    };
    if (a.flag) {
        slots(); /* the early start: the ids by their flags, before pdl_wait */
        if (threadIdx.x == 0) {
            /* every block has read its flags once the count is full: the last clears them */
            __threadfence();
            if (atomicAdd(a.done, 1u) == gridDim.x * gridDim.y - 1) {
                __threadfence(); /* the clearing after every block's count, not by the branch alone */
                for (int i = 0; i < (int)gridDim.y * a.k; i++)
                    a.flag[i] = 0u;
                *a.done = 0u;
            }
        }
    } else {
        pdl_wait();
        if (pre)
            md_pre_load(hp, ht, hn); /* beside the slots' expert ids */
        slots();
    }

    uint4 wv[U][RPW];
    uint2 sv[U][RPW];
    auto load = [&](int it0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int f = lane + 32 * (it0 + u);
            const int jj = f < F ? md_div(f, a.nce) : 0;
            const int c = f - jj * nce;
            const uint32_t *wm = wsl[jj];
            const char *sm = ssl[jj];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                if (f < F && r < nrows) {
                    wv[u][r] = __ldcs((const uint4 *)(wm + (r0 + r) * a.words) + c);
                    sv[u][r] = md_ld_sb(sm + (size_t)(r0 + r) * a.groups * sbsz, a.sf, md_div(c, a.cpg));
                } else {
                    wv[u][r] = make_uint4(0u, 0u, 0u, 0u);
                    sv[u][r] = make_uint2(0u, 0u);
                }
            }
        }
    };
    load(0); /* in flight while h is staged (the early start: before pdl_wait) */
    if (a.flag) {
        pdl_wait();
        if (pre)
            md_pre_load(hp, ht, hn);
    }
    if (pre)
        md_pre_store<BITS>(xs, hp, hn);
    else
        md_stage<BITS>(xs, ht, hn);
    if (!nrows)
        return;
    const float *xsums = (const float *)(xs + md_stride4(F, BITS));
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++)
        acc[r] = 0.f;
    for (int it0 = 0; it0 < nit; it0 += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int f = lane + 32 * (it0 + u);
            if (f < F) {
                float xv[VPC];
                md_xload<BITS>(xs, f, xv);
                const float xsum = xsums[f];
#pragma unroll
                for (int r = 0; r < RPW; r++)
                    acc[r] += md_chunk<BITS>(wv[u][r], sb_pair(sv[u][r], a.sf), xv, xsum);
            }
        }
        if (it0 + U < nit)
            load(it0 + U);
    }
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane < nrows) {
        float v = 0.f;
#pragma unroll
        for (int r = 0; r < RPW; r++)
            if (r == lane)
                v = acc[r];
        const size_t i = (size_t)t * a.rows + r0 + lane;
        if (a.sh) {
            /* k_add_gated: y += sigmoid(g) * x, as it compiles (one FMA) */
            const float sig = 1.f / (1.f + expf(-a.sg[t]));
            v = fmaf(sig, a.sh[i], v);
        }
        a.out[i] = v;
        if (a.add_to)
            a.add_to[i] = a.add_to[i] + v; /* k_add: y[i] += x[i] */
    }
}

int md_npl(int E)
{
    int n = (E + 31) / 32, p = 1;
    while (p < n)
        p *= 2;
    return p;
}

int64_t md_round256(int64_t v) { return (v + 255) / 256 * 256; }

template <int BITS, int W, bool DP = false>
sn_status md_launch_gu(bool edge, cudaStream_t s, int npl, dim3 grid, size_t smem, const md_gu_args &a)
{
    switch (npl) {
    case 1: (void)cu_launch_pdl(edge, k_md_gate_up<BITS, 1, W, DP>, grid, W * 32, smem, s, a); break;
    case 2: (void)cu_launch_pdl(edge, k_md_gate_up<BITS, 2, W, DP>, grid, W * 32, smem, s, a); break;
    case 4: (void)cu_launch_pdl(edge, k_md_gate_up<BITS, 4, W, DP>, grid, W * 32, smem, s, a); break;
    case 8: (void)cu_launch_pdl(edge, k_md_gate_up<BITS, 8, W, DP>, grid, W * 32, smem, s, a); break;
    case 16: (void)cu_launch_pdl(edge, k_md_gate_up<BITS, 16, W, DP>, grid, W * 32, smem, s, a); break;
    default: (void)cu_launch_pdl(edge, k_md_gate_up<BITS, 32, W, DP>, grid, W * 32, smem, s, a); break;
    }
    CU_CHECK_LAUNCH("moe decode gate/up");
    return SN_OK;
}

} // namespace

bool cu_moe_dec_ok(const cu_weight *gate, const cu_weight *up, const cu_weight *down, int T, int top_k)
{
    if (!cu_moe_dec_mode || T < 1 || T > 65535)
        return false;
    auto quant = [](const cu_weight *w) { return w->fmt == CW_Q4 || w->fmt == CW_Q8; };
    if (!quant(gate) || !quant(up) || !quant(down) || up->fmt != gate->fmt || up->sfmt != gate->sfmt ||
        up->group != gate->group || up->rows != gate->rows || up->cols != gate->cols)
        return false;
    const int64_t E = gate->n_experts, I = gate->rows, H = gate->cols;
    if (E < 1 || E > MD_MAX_E || top_k < 1 || top_k > MD_MAX_K || top_k > E || up->n_experts != E ||
        down->n_experts != E || down->rows != H || down->cols != I)
        return false;
    /* chunks stay inside a quant group (weight_check: group % 32 == 0, cols % group == 0) */
    if (gate->group % 32 || H % gate->group || down->group % 32 || I % down->group)
        return false;
    return md_stage_bytes(H, gate->bits) <= MD_SMEM_MAX &&
           md_stage_bytes((int64_t)top_k * I, down->bits) <= MD_SMEM_MAX;
}

bool cu_moe_dec_sh_ok(const cu_weight *gate, const cu_weight *up, const cu_weight *down, const cu_moe_sh *sh, int T,
                      int top_k)
{
    if (!cu_moe_dec_ok(gate, up, down, T, top_k) || !sh || !sh->gate || !sh->up || !sh->down || !sh->sg)
        return false;
    /* the shared expert must be one more expert of the stacks' shape and format */
    auto like = [](const cu_weight *w, const cu_weight *st) {
        /* (fmt, group and cols fix bits, words and groups) */
        return w->n_experts == 1 && w->fmt == st->fmt && w->sfmt == st->sfmt && w->group == st->group &&
               w->rows == st->rows && w->cols == st->cols && !w->bias;
    };
    return like(sh->gate, gate) && like(sh->up, up) && like(sh->down, down) &&
           md_stage_bytes((int64_t)(top_k + 1) * gate->rows, down->bits) <= MD_SMEM_MAX;
}

size_t cu_moe_dec_scratch_bytes(const cu_weight *gate, int T, int top_k)
{
    return (size_t)md_round256((int64_t)T * top_k * 4) + (size_t)T * top_k * gate->rows * sizeof(float);
}

sn_status cu_moe_dec(cudaStream_t s, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                     const float *logits, int top_k, int norm_topk, const float *x, int T, float *out, void *scratch,
                     const cu_moe_sh *sh, const cu_moe_epi *epi, unsigned *sync)
{
    if (T <= 0)
        return SN_OK;
    const int64_t E = gate->n_experts, I = gate->rows, H = gate->cols;
    const int ks = top_k + (sh ? 1 : 0); /* slots per token */
    int32_t *idx = (int32_t *)scratch;
    float *h = (float *)((char *)scratch + md_round256((int64_t)T * ks * 4));

    md_gu_args g;
    memset(&g, 0, sizeof g);
    g.Wg = (const uint32_t *)gate->q;
    g.Wu = (const uint32_t *)up->q;
    g.Sg = gate->sb;
    g.Su = up->sb;
    g.sf = gate->sfmt;
    g.rows = I;
    g.cols = H;
    g.words = gate->words;
    g.groups = gate->groups;
    g.cpg = md_cdiv_of(gate->group / (128 / gate->bits));
    g.logits = logits;
    g.E = (int)E;
    g.k = top_k;
    g.norm = norm_topk;
    g.x = x;
    g.idx = idx;
    g.h = h;
    g.ks = ks;
    if (sh) {
        g.Wsg = (const uint32_t *)sh->gate->q;
        g.Wsu = (const uint32_t *)sh->up->q;
        g.Ssg = sh->gate->sb;
        g.Ssu = sh->up->sb;
        g.Wsd = (const char *)sh->down->q;
        g.Ssd = (const char *)sh->down->sb;
        g.sg = sh->sg;
    }
    if (cu_moe_dec_mode >= 2) {
        g.Wd = (const char *)down->q;
        g.Sd = (const char *)down->sb;
        g.dq_bytes = H * down->words * 4;
        g.ds_bytes = H * down->groups * (down->sfmt == CS_F32 ? 8 : 4);
    }
    const int npl = md_npl((int)E);
    const int W = cu_moe_gu_warps == 4 ? 4 : 8;
    g.par = cu_moe_route && (W - 1) * top_k <= MD_CAND;
    g.pre = cu_moe_pre;
    /* The down kernel's early start (md_publish) needs cu_pdl 2 and a launch
     * without the PDL edge between the previous call's down kernel and this
     * one's: the gate/up kernel, or the launch before it (the router) when
     * the gate/up kernel takes the edge (cu_moe_gu_edge), so its blocks sit
     * resident before the router ends. */
    const bool early = sync && cu_moe_dn_early && cu_pdl == 2 && (size_t)T * ks < CU_MOE_SYNC;
    /* cu_last_edge is per thread: a backend's stream is fed by one thread at a time */
    const bool gu_edge =
        cu_pdl == 1 || (cu_pdl == 2 && (cu_moe_gu_edge == 2 || (cu_moe_gu_edge == 1 && T == 1)) && !cu_last_edge);
    g.flag = early ? sync + 1 : NULL;
    dim3 g1((unsigned)((I + W * MD_RPW - 1) / (W * MD_RPW)), (unsigned)ks, (unsigned)T);
    /* the dp4a form: Q4 in groups of 32, 64 or 128 (whole groups of 4, 8 or
     * 16 staging threads) */
    const bool dp = cu_moe_dp && W == 4 && gate->bits == 4 &&
                    (gate->group == 32 || gate->group == 64 || gate->group == 128);
    const size_t smem1 = dp ? gd_stage_bytes(1, (int)((H / 32 + 31) / 32), H / 32) : md_stage_bytes(H, gate->bits);
    sn_status gs;
    if (dp)
        gs = md_launch_gu<4, 4, true>(gu_edge, s, npl, g1, smem1, g);
    else if (W == 4)
        gs = gate->bits == 4 ? md_launch_gu<4, 4>(gu_edge, s, npl, g1, smem1, g)
                             : md_launch_gu<8, 4>(gu_edge, s, npl, g1, smem1, g);
    else
        gs = gate->bits == 4 ? md_launch_gu<4, 8>(gu_edge, s, npl, g1, smem1, g)
                             : md_launch_gu<8, 8>(gu_edge, s, npl, g1, smem1, g);
    SN_TRY(gs);

    md_dn_args d;
    memset(&d, 0, sizeof d);
    d.Wd = (const uint32_t *)down->q;
    d.Sd = down->sb;
    d.sf = down->sfmt;
    d.rows = H;
    d.cols = I;
    d.words = down->words;
    d.groups = down->groups;
    d.cpg = md_cdiv_of(down->group / (128 / down->bits));
    d.nce = md_cdiv_of((int)(down->words / 4));
    d.k = ks;
    if (sh) {
        d.Wsd = (const uint32_t *)sh->down->q;
        d.Ssd = sh->down->sb;
    }
    d.idx = idx;
    d.h = h;
    d.pre = cu_moe_pre;
    d.flag = g.flag;
    d.done = early ? sync : NULL;
    d.out = out;
    if (epi) {
        d.sh = epi->sh;
        d.sg = epi->sg;
        d.add_to = epi->add_to;
    }
    const int rpw = cu_moe_dn_rpw ? cu_moe_dn_rpw : T == 1 ? 1 : 2;
    dim3 g2((unsigned)((H + MD_WARPS * rpw - 1) / (MD_WARPS * rpw)), (unsigned)T);
    const size_t smem2 = md_stage_bytes((int64_t)ks * I, down->bits);
    const bool edge = early || cu_pdl == 1; /* cu_launch's edge, and the early start's */
    if (down->bits == 4)
        (void)(rpw == 1 ? (cu_moe_dn_u == 5 ? cu_launch_pdl(edge, k_md_down<4, 1, 5>, g2, MD_THREADS, smem2, s, d)
                           : cu_moe_dn_u == 6 ? cu_launch_pdl(edge, k_md_down<4, 1, 6>, g2, MD_THREADS, smem2, s, d)
                                              : cu_launch_pdl(edge, k_md_down<4, 1>, g2, MD_THREADS, smem2, s, d))
                        : cu_launch_pdl(edge, k_md_down<4, 2>, g2, MD_THREADS, smem2, s, d));
    else
        (void)(rpw == 1 ? cu_launch_pdl(edge, k_md_down<8, 1>, g2, MD_THREADS, smem2, s, d)
                        : cu_launch_pdl(edge, k_md_down<8, 2>, g2, MD_THREADS, smem2, s, d));
    const cudaError_t le = cudaGetLastError();
    if (le != cudaSuccess) {
        if (early) /* the gate/up kernel set flags no down kernel will clear */
            (void)cudaMemsetAsync(sync, 0, sizeof(unsigned) * (1 + (size_t)T * ks), s);
        return SN_FAIL(SN_E_BACKEND, "moe decode down: %s", cudaGetErrorString(le));
    }
    return SN_OK;
}
