/* Token draws on the GPU (sn_backend_ops.sample): the sampler's edits,
 * softmax, top-p and the categorical draw over the vocabulary in one
 * kernel, one cluster of SMP_CL blocks per row (each block a slice of the
 * ids, partial results merged in block order through distributed shared
 * memory), so a sampled decode step moves one id to the host instead of
 * the vocabulary's logits (and the host's 1-2 ms pass over them,
 * bench_sample).
 *
 * Every sum has a fixed order or is an integer, so a draw is deterministic:
 *  - the softmax total and the survivors' weights are double sums in a
 *    fixed shape (per thread, a shuffle tree, then the blocks in order);
 *  - top-p finds the last kept token by a radix select over the bits of
 *    p = e / sum (positive floats order as their bits), 8 bits a pass,
 *    with the mass per bin in 2^-60 fixed point (integer atomics add in
 *    any order to the same value);
 *  - the draw walks the survivors in a fixed order (block by block; in a
 *    block each thread owns every 32nd id of its warp's range; block,
 *    thread, then id): an exclusive scan of the threads' weights finds the
 *    thread holding u * total, and that thread walks its ids.
 * The host sampler walks its survivors in rank order; the same u picks
 * another token here, from the same distribution. */
#include <math.h>
#include <string.h>

#include <cooperative_groups.h>

#include "backend/cuda/cuda_be.h"

namespace cg = cooperative_groups;

namespace {

constexpr int SMP_THREADS = 1024;
/* Blocks per row, one thread block cluster: a row's passes run on SMP_CL
 * SMs (one SM alone read 248320 ids at ~30 per thread per L2 round trip:
 * a top-p draw took 385.8 us in s15r1), and the blocks merge their partial
 * results through distributed shared memory in rank order. */
constexpr int SMP_CL = 8;
constexpr double SMP_FX = 0x1p60; /* fixed point of the top-p masses */

struct smp_row {
    float temperature, top_p;
    double u;
    int row;
    int e_off, ph_off, n_ph; /* edits [e_off + phase_end[k-1], e_off + phase_end[k]) per phase k */
    int b_off, n_b;          /* banned ids */
    int pad;
};

struct smp_red {
    double d[32];
    float f[32];
    int i[32];
    unsigned mlo[256], mhi[256]; /* this block's bin masses, 64 bits as two words (native 32-bit atomics) */
    unsigned c[256];
    unsigned long long mm[256]; /* the cluster's merged bins */
    unsigned cc[256];
    int kdig;
    unsigned long long above;
    /* what this block publishes to the cluster */
    double pd;
    float pf;
    int pi, pj;
};

/* Block b's share of a row of n ids: [s0, s1), 32-aligned starts */
__device__ __forceinline__ void cl_range(int n, int b, int &s0, int &s1)
{
    const int S = ((n + SMP_CL - 1) / SMP_CL + 31) & ~31;
    s0 = min(n, b * S);
    s1 = min(n, s0 + S);
}

__device__ __forceinline__ void amax_merge(float &best, int &bi, float v, int i)
{
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}

__device__ __forceinline__ unsigned long long fx_of(float q)
{
    return (unsigned long long)((double)q * SMP_FX);
}

/* m added to the 64-bit word (hi, lo) with 32-bit atomics: shared memory
 * adds 64-bit integers by a compare-and-swap loop, which spins when the
 * 1024 threads' entries share bins (1.44 ms a top-p draw at 248320 ids in
 * s14r3); a carry out of lo is seen once by the add that wrapped it, so
 * the word is the exact sum in any order */
__device__ __forceinline__ void add64(unsigned *lo, unsigned *hi, unsigned long long m)
{
    const unsigned l = (unsigned)m, h = (unsigned)(m >> 32);
    const unsigned old = atomicAdd(lo, l);
    const unsigned c = old + l < old ? 1u : 0u;
    if (h + c)
        atomicAdd(hi, h + c);
}

/* Strided passes keep SMP_U loads in flight per thread (one load at a
 * time waits out the L2 latency each time). load(i) then use(i, v), in i
 * order. */
constexpr int SMP_U = 8;
template <typename V, typename L, typename F> __device__ __forceinline__ void strided(int i0, int i1, int step, L load, F use)
{
    for (int i = i0; i < i1; i += SMP_U * step) {
        V v[SMP_U];
#pragma unroll
        for (int u = 0; u < SMP_U; u++)
            if (i + u * step < i1)
                v[u] = load(i + u * step);
#pragma unroll
        for (int u = 0; u < SMP_U; u++)
            if (i + u * step < i1)
                use(i + u * step, v[u]);
    }
}

/* block-wide sum of one double per thread, the same tree every call */
__device__ double block_sum(double v, smp_red &r)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0)
        r.d[w] = v;
    __syncthreads();
    double t = 0.0;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++)
        t += r.d[k];
    __syncthreads();
    return t;
}

/* exclusive prefix of one value per thread in thread order, and the total
 * (wt: the block's per-warp totals) */
template <typename T> __device__ T block_exscan(T v, T *wt, T *total)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    T inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        T t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += t;
    }
    __syncthreads();
    if (lane == 31)
        wt[w] = inc;
    __syncthreads();
    T base = 0, tot = 0;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) {
        if (k < w)
            base += wt[k];
        tot += wt[k];
    }
    __syncthreads();
    *total = tot;
    return base + inc - v;
}

__device__ int block_min_int(int v, smp_red &r)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        r.i[w] = v;
    __syncthreads();
    int t = r.i[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); k++)
        t = min(t, r.i[k]);
    __syncthreads();
    return t;
}

/* The cluster's blocks in rank order: every block reads the same values in
 * the same order, so what it derives from them is the same everywhere. */
__device__ __forceinline__ smp_red *cl_peer(smp_red &r, int b)
{
    return cg::this_cluster().map_shared_rank(&r, (unsigned)b);
}
/* One exchange: every block has published its part in its r; the first
 * cluster barrier makes all parts visible, read() reads the peers' (through
 * cl_peer), and the second keeps every part in place, and its block
 * resident, until all blocks have read it. */
template <typename F>
__device__ __forceinline__ void cl_exchange(F &&read)
{
    cg::this_cluster().sync();
    read();
    cg::this_cluster().sync();
}

/* out[k]: the draw of row k; bad[k]: 1 when every logit is NaN. One
 * cluster of SMP_CL blocks per row; block b holds ids cl_range(b). */
__global__ void __cluster_dims__(SMP_CL, 1, 1) __launch_bounds__(SMP_THREADS)
    k_sample(float *__restrict__ X, int n, const smp_row *__restrict__ rows, const sn_logit_edit *__restrict__ edits,
             const int32_t *__restrict__ phase_end, const int32_t *__restrict__ banned, float *__restrict__ E,
             int32_t *__restrict__ out, int32_t *__restrict__ bad)
{
    __shared__ smp_red r;
    const int rk = (int)blockIdx.x / SMP_CL, cb = (int)cg::this_cluster().block_rank();
    const smp_row R = rows[rk];
    float *x = X + (size_t)R.row * n;
    float *e = E + (size_t)rk * n;
    const int tid = threadIdx.x, nt = blockDim.x;
    int s0, s1;
    cl_range(n, cb, s0, s1);

    /* the edits of this block's ids, phase by phase (ids distinct within
     * one), then the bans */
    for (int ph = 0; ph < R.n_ph; ph++) {
        const int a = R.e_off + (ph ? phase_end[R.ph_off + ph - 1] : 0), b = R.e_off + phase_end[R.ph_off + ph];
        for (int k = a + tid; k < b; k += nt) {
            const sn_logit_edit ed = edits[k];
            if (ed.id < s0 || ed.id >= s1)
                continue;
            float l = x[ed.id];
            if (ed.kind == SN_EDIT_ADD) {
                l = __fadd_rn(l, ed.a);
            } else {
                if (ed.a != 0.0f)
                    l = l < 0.0f ? __fmul_rn(l, ed.a) : __fdiv_rn(l, ed.a);
                l = __fsub_rn(l, ed.b);
                l = __fsub_rn(l, ed.c);
            }
            x[ed.id] = l;
        }
        __syncthreads();
    }
    for (int k = tid; k < R.n_b; k += nt) {
        const int id = banned[R.b_off + k];
        if (id >= s0 && id < s1)
            x[id] = -INFINITY;
    }
    __syncthreads();

    /* the argmax: first maximum, NaN never wins */
    float best = -INFINITY;
    int bi = 0x7fffffff;
    strided<float>(s0 + tid, s1, nt, [&](int i) { return x[i]; }, [&](int i, float v) { amax_merge(best, bi, v, i); });
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        amax_merge(best, bi, ob, oi);
    }
    if ((tid & 31) == 0) {
        r.f[tid >> 5] = best;
        r.i[tid >> 5] = bi;
    }
    __syncthreads();
    if (tid == 0) {
        best = r.f[0];
        bi = r.i[0];
        for (int k = 1; k < nt / 32; k++)
            amax_merge(best, bi, r.f[k], r.i[k]);
        r.pf = best;
        r.pi = bi;
    }
    cl_exchange([&] {
        best = -INFINITY;
        bi = 0x7fffffff;
        for (int b = 0; b < SMP_CL; b++) {
            const smp_red *q = cl_peer(r, b);
            amax_merge(best, bi, q->pf, q->pi);
        }
    });
    const bool lead = cb == 0 && tid == 0;
    if (bi == 0x7fffffff) {
        if (lead) {
            out[rk] = 0;
            bad[rk] = 1;
        }
        return;
    }
    const int top = bi;
    const float mx = best;
    if (R.temperature == 0.0f || isinf(mx)) { /* greedy, or +inf decides the draw */
        if (lead) {
            out[rk] = top;
            bad[rk] = 0;
        }
        return;
    }

    /* the softmax's numerators and their total (blocks in rank order) */
    double sum = 0.0;
    strided<float>(s0 + tid, s1, nt, [&](int i) { return x[i]; }, [&](int i, float l) {
        const float v = isnan(l) ? 0.0f : expf(l - mx);
        e[i] = v;
        sum += v;
    });
    sum = block_sum(sum, r); /* its barriers also order e[] before any thread reads another's entries */
    if (tid == 0)
        r.pd = sum;
    cl_exchange([&] {
        sum = 0.0;
        for (int b = 0; b < SMP_CL; b++)
            sum += cl_peer(r, b)->pd;
    });
    const float inv = (float)(1.0 / sum);
    const float p = R.top_p;
    const float floor_p = p < 1.0f ? (1.0f - p) / (float)n : 0.0f;

    /* top-p: the key (bits of q) and the count of ties at that key that stay */
    unsigned kkey = 0u; /* candidates with key > kkey stay... */
    int kties = 0;      /* ...and the first kties with key == kkey, in the draw order */
    if (p < 1.0f) {
        const unsigned long long P = (unsigned long long)((double)p * SMP_FX);
        unsigned prefix = 0u, mask = 0u;
        unsigned long long above = 0ull;
        bool found = true;
        unsigned cnt_k = 0u;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int k = tid; k < 256; k += nt) {
                r.mlo[k] = r.mhi[k] = 0u;
                r.c[k] = 0u;
            }
            __syncthreads();
            /* a thread's entries mostly share a bin (the leading bits of
             * p): each run of one bin goes to shared memory as one add */
            int cd = -1;
            unsigned long long cm = 0ull;
            unsigned cc = 0u;
            strided<float>(s0 + tid, s1, nt, [&](int i) { return e[i]; }, [&](int, float ev) {
                const float q = ev * inv;
                if (!(q >= floor_p && q > 0.0f))
                    return;
                const unsigned key = __float_as_uint(q);
                if ((key & mask) != prefix)
                    return;
                const int d = (int)((key >> shift) & 255u);
                if (d != cd) {
                    if (cd >= 0) {
                        add64(&r.mlo[cd], &r.mhi[cd], cm);
                        atomicAdd(&r.c[cd], cc);
                    }
                    cd = d;
                    cm = 0ull;
                    cc = 0u;
                }
                cm += fx_of(q);
                cc++;
            });
            if (cd >= 0) {
                add64(&r.mlo[cd], &r.mhi[cd], cm);
                atomicAdd(&r.c[cd], cc);
            }
            /* every block's bins, summed in rank order; the next pass
             * clears them only after all blocks have read them */
            cl_exchange([&] {
                for (int k = tid; k < 256; k += nt) {
                    unsigned long long m = 0ull;
                    unsigned c = 0u;
                    for (int b = 0; b < SMP_CL; b++) {
                        const smp_red *q = cl_peer(r, b);
                        m += (unsigned long long)q->mhi[k] << 32 | q->mlo[k];
                        c += q->c[k];
                    }
                    r.mm[k] = m;
                    r.cc[k] = c;
                }
                __syncthreads();
                if (tid == 0) {
                    int d = 255;
                    unsigned long long ab = above;
                    for (; d >= 0; d--) {
                        if (ab + r.mm[d] >= P)
                            break;
                        ab += r.mm[d];
                    }
                    r.kdig = d;
                    r.above = ab;
                }
            });
            const int d = r.kdig;
            if (d < 0) { /* the candidates hold less than p: all stay */
                found = false;
                break;
            }
            above = r.above;
            cnt_k = r.cc[d];
            prefix |= (unsigned)d << shift;
            mask |= 255u << shift;
        }
        if (found) {
            kkey = prefix;
            const unsigned long long qk = fx_of(__uint_as_float(prefix));
            const unsigned long long need = P - above; /* > 0: above < P */
            unsigned long long j = qk ? (need + qk - 1) / qk : (unsigned long long)cnt_k;
            kties = (int)(j < cnt_k ? j : cnt_k);
        }
    }

    /* the draw over the survivors in a fixed order: block by block; in a
     * block warp w holds ids [s0 + w * C, s0 + (w + 1) * C), its lane l
     * every 32nd from there (coalesced loads); the order is (block,
     * thread, then id), the tie rank of top-p too */
    const int lane = tid & 31, nw = nt >> 5, len = s1 - s0;
    const int C = ((len + nw - 1) / nw + 31) & ~31;
    const int c0 = s0 + min(len, (tid >> 5) * C) + lane, c1 = s0 + min(len, ((tid >> 5) + 1) * C);
    auto cand_key = [&](float ev, unsigned *key) -> bool {
        const float q = ev * inv;
        if (!(q >= floor_p && q > 0.0f))
            return false;
        *key = __float_as_uint(q);
        return true;
    };
    int tie0 = 0;
    if (p < 1.0f) {
        int ties = 0, tot;
        strided<float>(c0, c1, 32, [&](int i) { return e[i]; }, [&](int, float ev) {
            unsigned key;
            if (cand_key(ev, &key) && key == kkey)
                ties++;
        });
        tie0 = block_exscan(ties, r.i, &tot);
        if (tid == 0)
            r.pj = tot;
        cl_exchange([&] {
            for (int b = 0; b < cb; b++)
                tie0 += cl_peer(r, b)->pj;
        });
    }
    const float invT = 1.0f / R.temperature;
    const bool reuse = invT == 1.0f && p >= 1.0f;
    /* (e[i], x[i]); x only where the weight is not e's */
    auto load_ex = [&](int i) -> float2 { return make_float2(e[i], reuse ? 0.0f : x[i]); };
    auto weight = [&](float2 ex, int *tie) -> float { /* 0 for a token that does not stay */
        unsigned key;
        if (!cand_key(ex.x, &key))
            return 0.0f;
        if (p < 1.0f) {
            if (key < kkey)
                return 0.0f;
            if (key == kkey && (*tie)++ >= kties)
                return 0.0f;
        }
        return reuse ? ex.x : expf((ex.y - mx) * invT);
    };
    double wsum = 0.0;
    int last = -1, tie = tie0;
    strided<float2>(c0, c1, 32, load_ex, [&](int i, float2 ex) {
        const float w = weight(ex, &tie);
        if (w > 0.0f) {
            wsum += w;
            last = i;
        }
    });
    double btot;
    double pre = block_exscan(wsum, r.d, &btot);
    if (tid == 0)
        r.pd = btot;
    double total = 0.0;
    cl_exchange([&] {
        for (int b = 0; b < SMP_CL; b++) {
            const double t = cl_peer(r, b)->pd;
            if (b < cb)
                pre += t; /* (the same sum of the earlier blocks, in order, as total's first terms) */
            total += t;
        }
    });
    if (!(total > 0.0)) {
        if (lead) {
            out[rk] = top;
            bad[rk] = 0;
        }
        return;
    }
    const double local = R.u * total - pre;
    const bool mine = local >= 0.0 && local < wsum;
    const int who = block_min_int(mine ? tid : 0x7fffffff, r);
    /* and the block's last survivor, for u * total rounded past the end */
    const int lt = -block_min_int(last >= 0 ? -tid : 1, r);
    if (tid == 0) {
        r.pi = who;
        r.pj = lt;
    }
    int wb = -1, lb = -1; /* the first block that holds u * total; the last with a survivor */
    cl_exchange([&] {
        for (int b = 0; b < SMP_CL; b++) {
            const smp_red *q = cl_peer(r, b);
            if (wb < 0 && q->pi != 0x7fffffff)
                wb = b;
            if (q->pj >= 0)
                lb = b;
        }
    });
    if (wb < 0) {
        if (lb < 0) {
            if (lead) {
                out[rk] = top;
                bad[rk] = 0;
            }
        } else if (cb == lb && tid == lt) {
            out[rk] = last;
            bad[rk] = 0;
        }
        return;
    }
    if (cb == wb && tid == who) {
        /* the walk: eight entries' loads at a time, then their sums in order */
        double acc = 0.0;
        int pick = last; /* the sums repeat the pass above's, so one is found */
        bool found = false;
        tie = tie0;
        for (int i = c0; i < c1 && !found; i += 8 * 32) {
            float2 ex[8];
            float w[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i + 32 * u < c1)
                    ex[u] = load_ex(i + 32 * u);
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = i + 32 * u < c1 ? weight(ex[u], &tie) : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (w[u] > 0.0f) {
                    acc += w[u];
                    if (local < acc) {
                        pick = i + 32 * u;
                        found = true;
                        break;
                    }
                }
        }
        out[rk] = pick;
        bad[rk] = 0;
    }
}

size_t align16(size_t b) { return (b + 15) & ~(size_t)15; }

} // namespace

extern "C" sn_status sn_cuda_sample(sn_backend *b, float *x, int rows, int n, const sn_sample_row *rr,
                                    int32_t *out_host)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (rows < 0 || n <= 0)
        return SN_FAIL(SN_E_INVALID, "sample: rows=%d n=%d", rows, n);
    if (rows == 0)
        return SN_OK;
    if (!x || !rr || !out_host)
        return SN_FAIL(SN_E_INVALID, "sample: NULL buffer");
    if (rows > STEP_MAX_OUTS / 2)
        return SN_FAIL(SN_E_UNSUPPORTED, "sample: %d rows (max %d per call)", rows, STEP_MAX_OUTS / 2);
    size_t n_e = 0, n_ph = 0, n_b = 0;
    for (int k = 0; k < rows; k++) {
        const sn_sample_row *s = &rr[k];
        if (s->row < 0)
            return SN_FAIL(SN_E_INVALID, "sample: row %d of draw %d", s->row, k);
        if (!(s->temperature >= 0.0f) || !(s->top_p > 0.0f && s->top_p <= 1.0f) || !(s->u >= 0.0 && s->u < 1.0))
            return SN_FAIL(SN_E_INVALID, "sample: draw %d has temperature %g, top_p %g, u %g", k, s->temperature,
                           s->top_p, s->u);
        if (s->n_phases < 0 || s->n_banned < 0 || (s->n_phases && (!s->edits || !s->phase_end)) ||
            (s->n_banned && !s->banned))
            return SN_FAIL(SN_E_INVALID, "sample: draw %d has %d edit phases and %d banned ids without their lists", k,
                           s->n_phases, s->n_banned);
        int prev = 0;
        for (int p = 0; p < s->n_phases; p++) {
            if (s->phase_end[p] < prev)
                return SN_FAIL(SN_E_INVALID, "sample: draw %d: phase %d ends at %d before %d", k, p, s->phase_end[p],
                               prev);
            prev = s->phase_end[p];
        }
        n_e += (size_t)prev;
        n_ph += (size_t)s->n_phases;
        n_b += (size_t)s->n_banned;
    }
    /* the rows' banned lists are usually one list: upload it once */
    bool same_ban = true;
    for (int k = 1; k < rows; k++)
        same_ban = same_ban && rr[k].banned == rr[0].banned && rr[k].n_banned == rr[0].n_banned;
    if (same_ban)
        n_b = (size_t)rr[0].n_banned;
    const size_t o_rows = 0, o_e = align16(o_rows + sizeof(smp_row) * rows),
                 o_ph = align16(o_e + sizeof(sn_logit_edit) * n_e), o_b = align16(o_ph + sizeof(int32_t) * n_ph),
                 o_out = align16(o_b + sizeof(int32_t) * n_b), need = align16(o_out + sizeof(int32_t) * 2 * rows);
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    if (need > cb->smp_cap) {
        size_t want = need + need / 2 + 4096;
        CU_TRY(cudaStreamSynchronize(cb->st), "sample buffers");
        cudaFree(cb->smp_d);
        cudaFreeHost(cb->smp_h);
        cb->smp_d = cb->smp_h = NULL;
        cb->held -= cb->smp_cap;
        cb->smp_cap = 0;
        cudaError_t e1 = cudaMalloc(&cb->smp_d, want), e2 = cudaMallocHost(&cb->smp_h, want);
        if (e1 != cudaSuccess || e2 != cudaSuccess)
            return SN_FAIL(SN_E_NOMEM, "sample: %zu bytes of draw parameters", want);
        cb->smp_cap = want;
        cb->held += want;
    }
    const size_t e_need = sizeof(float) * (size_t)rows * (size_t)n;
    if (e_need > cb->smp_e_cap) {
        CU_TRY(cudaStreamSynchronize(cb->st), "sample scratch");
        cudaFree(cb->smp_e);
        cb->held -= cb->smp_e_cap;
        cb->smp_e = NULL;
        cb->smp_e_cap = 0;
        if (cudaMalloc(&cb->smp_e, e_need) != cudaSuccess)
            return SN_FAIL(SN_E_NOMEM, "sample: %zu bytes of scratch", e_need);
        cb->smp_e_cap = e_need;
        cb->held += e_need;
    }
    /* the previous draw's copy-back has finished (it synchronised), so the
     * pinned staging is free to refill */
    char *h = (char *)cb->smp_h;
    smp_row *hr = (smp_row *)(h + o_rows);
    sn_logit_edit *he = (sn_logit_edit *)(h + o_e);
    int32_t *hp = (int32_t *)(h + o_ph), *hb = (int32_t *)(h + o_b);
    size_t ae = 0, ap = 0, ab = 0;
    for (int k = 0; k < rows; k++) {
        const sn_sample_row *s = &rr[k];
        const int ne = s->n_phases ? s->phase_end[s->n_phases - 1] : 0;
        hr[k] = smp_row{ s->temperature, s->top_p, s->u, s->row, (int)ae, (int)ap, s->n_phases, 0, s->n_banned, 0 };
        if (ne)
            memcpy(he + ae, s->edits, sizeof(sn_logit_edit) * ne);
        if (s->n_phases)
            memcpy(hp + ap, s->phase_end, sizeof(int32_t) * s->n_phases);
        ae += (size_t)ne;
        ap += (size_t)s->n_phases;
        if (!same_ban || k == 0) {
            if (s->n_banned)
                memcpy(hb + ab, s->banned, sizeof(int32_t) * s->n_banned);
            hr[k].b_off = (int)ab;
            ab += (size_t)s->n_banned;
        } else {
            hr[k].b_off = 0;
        }
    }
    char *d = (char *)cb->smp_d;
    CU_TRY(cudaMemcpyAsync(d, h, o_out, cudaMemcpyHostToDevice, cb->st), "sample parameters");
    int32_t *d_out = (int32_t *)(d + o_out);
    k_sample<<<rows * SMP_CL, SMP_THREADS, 0, cb->st>>>(x, n, (const smp_row *)(d + o_rows), (const sn_logit_edit *)(d + o_e),
                                               (const int32_t *)(d + o_ph), (const int32_t *)(d + o_b),
                                               (float *)cb->smp_e, d_out, d_out + rows);
    CU_CHECK_LAUNCH("sample");
    CU_TRY(cudaMemcpyAsync(h + o_out, d_out, sizeof(int32_t) * 2 * rows, cudaMemcpyDeviceToHost, cb->st),
           "sample result");
    cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
    CU_TRY(cudaStreamSynchronize(cb->st), "sample result");
    stg_forget(cb); /* x was written */
    const int32_t *ho = (const int32_t *)(h + o_out);
    for (int k = 0; k < rows; k++) {
        if (ho[rows + k])
            return SN_FAIL(SN_E_RANGE, "sample: every logit of row %d is NaN", rr[k].row);
        out_host[k] = ho[k];
    }
    return SN_OK;
}
