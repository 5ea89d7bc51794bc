/* Measurement hooks of the CUDA backend (sn_cuda.h): device and memory
 * info, the ncu profiler range, per-op event profiling, the tune keys that
 * benchmarks flip (sn_cuda_tune), the read-bandwidth probe and the graph
 * counters. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "backend/cuda/cuda_be.h"
#include "backend/cuda/cuda_gemv.h"
#include "backend/cuda/cuda_moe.h"

extern "C" sn_status sn_cuda_info(sn_backend *b, char *name, size_t name_len, size_t *dev_used, size_t *dev_total,
                                  size_t *held)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    cudaSetDevice(cb->dev);
    size_t fr = 0, tot = 0;
    CU_TRY(cudaMemGetInfo(&fr, &tot), "memory info");
    if (name && name_len)
        snprintf(name, name_len, "%s%s", cb->name, cb->di.blas ? " (+cuBLAS prefill)" : "");
    if (dev_used)
        *dev_used = tot - fr;
    if (dev_total)
        *dev_total = tot;
    if (held)
        *held = cb->held;
    return SN_OK;
}

extern "C" sn_status sn_cuda_profiler_range(sn_backend *b, int on)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    cudaSetDevice(cb->dev);
    CU_TRY(cudaStreamSynchronize(cb->st), "profiler range");
    CU_TRY(on ? cudaProfilerStart() : cudaProfilerStop(), "profiler range");
    return SN_OK;
}

extern "C" void sn_cuda_profile(sn_backend *b, int on)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    cudaStreamSynchronize(cb->st);
    for (int k = 0; k < cb->n_evs; k++) {
        cudaEventDestroy(cb->evs[k].a);
        cudaEventDestroy(cb->evs[k].b);
    }
    cb->n_evs = 0;
    cb->prof = on != 0;
}

extern "C" sn_status sn_cuda_profile_report(sn_backend *b, FILE *f)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    CU_TRY(cudaStreamSynchronize(cb->st), "profile report");
    double ms[R_COUNT] = { 0 }, total = 0;
    long calls[R_COUNT] = { 0 };
    for (int k = 0; k < cb->n_evs; k++) {
        float t = 0;
        CU_TRY(cudaEventElapsedTime(&t, cb->evs[k].a, cb->evs[k].b), "profile report");
        ms[cb->evs[k].kind] += t;
        calls[cb->evs[k].kind]++;
        total += t;
    }
    fprintf(f, "%-14s %8s %10s %6s\n", "op", "calls", "ms", "share");
    for (int k = 0; k < R_COUNT; k++)
        if (calls[k])
            fprintf(f, "%-14s %8ld %10.3f %5.1f%%\n", rec_names[k], calls[k], ms[k],
                    total > 0 ? 100.0 * ms[k] / total : 0.0);
    fprintf(f, "%-14s %8s %10.3f\n", "total", "", total);
    return SN_OK;
}

namespace {

/* The measurement knobs of sn_cuda_tune that are one int each: where the
 * value goes, what it may be (one of set[], or lo..hi when nset is 0; flags
 * take any value as value != 0), and whether captured graphs must go (they
 * hold the kernels chosen with the old value). */
struct tune_key {
    const char *key;
    int *(*field)(cuda_be *);
    bool flag, graphs;
    int nset, set[4], lo, hi;
    const char *allowed; /* for the error message */
};

#define TUNE_DI(f) [](cuda_be *c) { return &c->di.f; }
#define TUNE_GLOBAL(v) [](cuda_be *) { return &v; }
const tune_key tune_keys[] = {
    { "gemv_rpw", TUNE_DI(gemv_rpw), false, true, 4, { 0, 1, 2, 4 }, 0, 0, "0, 1, 2 or 4" },
    { "gemm_i8", TUNE_DI(gemm_i8), false, false, 4, { 0, 2, 3, 4 }, 0, 0, "0 off, 2 or 3 digits, 4 fp16 hi/lo" },
    { "gemm_fast", TUNE_DI(gemm_fast), true, false, 0, {}, 0, 0, "" },
    { "gemm_hl_sub", TUNE_DI(gemm_hl_sub), true, false, 0, {}, 0, 0, "" },
    { "gemm_hl_rows", TUNE_DI(gemm_hl_rows), false, false, 2, { 32, 64 }, 0, 0, "32 or 64" },
    { "moe_dec", TUNE_GLOBAL(cu_moe_dec_mode), false, true, 0, {}, 0, 2, "0 off, 1 on, 2 on with the L2 prefetch" },
    { "fuse_attn_prep", TUNE_GLOBAL(cu_fuse_attn_prep), true, true, 0, {}, 0, 0, "" },
    { "gdn_step", TUNE_GLOBAL(cu_gdn_step_mode), false, true, 3, { 0, 1, 2 }, 0, 0,
      "0 three kernels, 1 one kernel, 2 conv with its state update, then the recurrence" },
    { "gdn_conv", TUNE_GLOBAL(cu_gdn_conv_mode), true, false, 0, {}, 0, 0, "" },
    { "moe_gu_warps", TUNE_GLOBAL(cu_moe_gu_warps), false, true, 2, { 4, 8 }, 0, 0, "4 or 8" },
    { "moe_route", TUNE_GLOBAL(cu_moe_route), true, true, 0, {}, 0, 0, "" },
    { "moe_dn_rpw", TUNE_GLOBAL(cu_moe_dn_rpw), false, true, 3, { 0, 1, 2 }, 0, 0, "0 (by T), 1 or 2" },
    { "moe_dn_early", TUNE_GLOBAL(cu_moe_dn_early), true, true, 0, {}, 0, 0, "" },
    { "moe_dp", TUNE_GLOBAL(cu_moe_dp), true, true, 0, {}, 0, 0, "" },
    { "moe_dn_u", TUNE_GLOBAL(cu_moe_dn_u), false, true, 3, { 4, 5, 6 }, 0, 0, "4, 5 or 6" },
    { "moe_gu_edge", TUNE_GLOBAL(cu_moe_gu_edge), false, true, 3, { 0, 1, 2 }, 0, 0,
      "0 never, 1 one token, 2 every T" },
    { "moe_pre", TUNE_GLOBAL(cu_moe_pre), false, true, 0, {}, 0, 3, "0 to 3 (bits: 1 down, 2 gate/up)" },
    { "moe_gemm", TUNE_DI(moe_gemm), true, false, 0, {}, 0, 0, "" },
    { "gemv_i8", TUNE_DI(gemv_i8), true, true, 0, {}, 0, 0, "" },
    { "gemv_rpw1_rows", TUNE_DI(gemv_rpw1_rows), false, true, 0, {}, 0, INT_MAX, ">= 0; 0 = never" },
    { "gemv_q8s_rows", TUNE_DI(gemv_q8s_rows), false, true, 0, {}, 0, INT_MAX, ">= 0; 0 = never" },
    { "attn_warps", TUNE_DI(attn_warps), false, true, 3, { 0, 4, 8 }, 0, 0, "0 = by shape, 4 or 8" },
    { "attn_splits", TUNE_DI(attn_splits), false, true, 2, { 64, 128 }, 0, 0, "64 or 128" },
    { "gemv_dp", TUNE_DI(gemv_dp), true, true, 0, {}, 0, 0, "" },
    { "gemv_pre", TUNE_DI(gemv_pre), false, true, 0, {}, 0, 8, "0 to 8" },
    { "gemv_sk_bps", TUNE_DI(gemv_sk_bps), false, true, 0, {}, 1, 2, "1 or 2" },
    { "gemv_sk", TUNE_DI(gemv_sk), true, true, 0, {}, 0, 0, "" },
    { "gemv_dyn", TUNE_DI(gemv_dyn), false, true, 0, {}, 0, 99, "0 off, or 1 to 99 (percent of row groups dealt)" },
    { "gemv_dyn_min", TUNE_DI(gemv_dyn_min), false, true, 0, {}, 1, 1000, "1 to 1000 (row groups a warp)" },
    { "gemv_dyn_lean", TUNE_DI(gemv_dyn_lean), true, true, 0, {}, 0, 0, "" },
    { "gemv_rl", TUNE_DI(gemv_rl), false, true, 4, { 0, 1, 2, 3 }, 0, 0,
      "0 the cp.async ring, 1 register loads (ld.global.cs), 2 register loads (nc, 256-byte L2 fetches), "
      "3 form 1 for rows of more than 4096 columns, else the ring (default)" },
    { "gemv_sk_vw", TUNE_DI(gemv_sk_vw), false, true, 0, {}, 1, 4, "1 to 4 (virtual warps a warp)" },
    { "gemv_sk_dv", TUNE_DI(gemv_sk_dv), true, true, 0, {}, 0, 0, "" },
    { "gemv_sk_minu", TUNE_DI(gemv_sk_minu), false, true, 0, {}, 0, 1024, "0 = 16 / vw, or 1 to 1024 units" },
    { "gemv_mb", TUNE_DI(gemv_mb), false, true, 0, {}, 0, 2, "0 = by shape, 1 or 2" },
    { "pdl", TUNE_GLOBAL(cu_pdl), false, true, 0, {}, 0, 2, "0 off, 1 every kernel, 2 weight-prefetching kernels" },
    { "pdl_small", TUNE_GLOBAL(cu_pdl_small), false, true, 0, {}, 0, 63,
      "0 to 63 (bits: 1 gated norm, 2 attention, 4 combine, 8 GDN step, 16 attention prep, 32 x digits)" },
    { "fuse", [](cuda_be *c) { return &c->fuse; }, true, true, 0, {}, 0, 0, "" },
    { "fuse_gate", [](cuda_be *c) { return &c->fuse_gate; }, true, true, 0, {}, 0, 0, "" },
    { "fuse_conv", [](cuda_be *c) { return &c->fuse_conv; }, true, true, 0, {}, 0, 0, "" },
};
#undef TUNE_DI
#undef TUNE_GLOBAL

} // namespace

extern "C" sn_status sn_cuda_tune(sn_backend *b, const char *key, int value)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    stg_forget(cb);
    for (const tune_key &k : tune_keys) {
        if (strcmp(key, k.key))
            continue;
        bool in_set = false;
        for (int i = 0; i < k.nset; i++)
            in_set = in_set || value == k.set[i];
        const bool ok = k.flag || (k.nset ? in_set : value >= k.lo && value <= k.hi);
        if (!ok)
            return SN_FAIL(SN_E_INVALID, "cuda tune %s=%d (%s)", key, value, k.allowed);
        SN_TRY(host_barrier(cb));
        *k.field(cb) = k.flag ? value != 0 : value;
        if (k.graphs)
            graphs_invalidate(cb);
        return SN_OK;
    }
    if (!strcmp(key, "pdl_min_kb")) {
        if (value < 0)
            return SN_FAIL(SN_E_INVALID, "cuda tune pdl_min_kb=%d (>= 0)", value);
        SN_TRY(host_barrier(cb));
        cu_pdl_min_bytes = (int64_t)value << 10;
        graphs_invalidate(cb);
        return SN_OK;
    }
    if (!strcmp(key, "gemv_i8_min_kb")) {
        if (value < -1)
            return SN_FAIL(SN_E_INVALID, "cuda tune gemv_i8_min_kb=%d (-1 = by shape, or >= 0)", value);
        SN_TRY(host_barrier(cb));
        cb->di.gemv_i8_min = value < 0 ? -1 : (int64_t)value << 10;
        graphs_invalidate(cb);
        return SN_OK;
    }
    if (!strcmp(key, "cublas_min_t")) {
        if (value < 0)
            return SN_FAIL(SN_E_INVALID, "cuda tune cublas_min_t=%d", value);
        if (value > 0 && !cb->di.blas)
            return SN_FAIL(SN_E_UNSUPPORTED, "cuda tune: cuBLAS is not loaded");
        SN_TRY(host_barrier(cb));
        cb->di.blas_min_t = value;
        return SN_OK;
    }
    return SN_FAIL(SN_E_INVALID, "cuda tune: unknown key '%s'", key);
}

namespace {

/* Every thread sums uint4 loads of its grid-stride range, 8 in flight; the
 * sum goes to out so the loads are not dropped. WAIT says where it waits
 * for the kernel before it, as one link of a chain of launches
 * (sn_cuda_read_chain): 0 nowhere (a plain launch, the bandwidth probe);
 * 1 after each thread's first 8 loads, as a weight GEMV waits for x; 2
 * after all its loads (the next matrix's loads free to overlap this one's
 * drain: what a persistent streaming kernel could reach). With a wait,
 * the next launch is triggered first thing. */
template <int WAIT>
__global__ void k_read_probe(const uint4 *__restrict__ p, size_t n, unsigned *__restrict__ out)
{
    if constexpr (WAIT != 0)
        pdl_launch();
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    bool first = true;
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = __ldcs(p + i + k * stride);
        if constexpr (WAIT == 1)
            if (first)
                pdl_wait();
        first = false;
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n; i += stride) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if constexpr (WAIT != 0)
        pdl_wait();
    if (acc == 0x9e3779b9u)
        *out = acc;
}

} // namespace

/* The read probes' timing: a buffer of span bytes (plus 16 for the probes'
 * output word) filled with ones, the launches enqueue(stream, buffer)
 * queues captured as one graph, replayed reps times after a warm-up:
 * *us per replay. */
template <typename F>
static sn_status graph_us(cuda_be *cb, size_t span, int reps, F enqueue, double *us, const char *what)
{
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    void *buf = NULL;
    CU_TRY(cudaMalloc(&buf, span + 16), what);
    sn_status st = SN_OK;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaStream_t cs = NULL;
    cudaError_t e = cudaMemsetAsync(buf, 1, span, cb->st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cb->st);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e1);
    if (e == cudaSuccess)
        e = cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        const cudaError_t el = enqueue(cs, (char *)buf);
        const cudaError_t e2 = cudaStreamEndCapture(cs, &g);
        e = el != cudaSuccess ? el : e2;
    }
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&ge, g, 0);
    if (e == cudaSuccess)
        e = cudaGraphLaunch(ge, cs); /* warm-up */
    if (e == cudaSuccess)
        e = cudaEventRecord(e0, cs);
    for (int r = 0; r < reps && e == cudaSuccess; r++)
        e = cudaGraphLaunch(ge, cs);
    if (e == cudaSuccess)
        e = cudaEventRecord(e1, cs);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(e1);
    float ms = 0;
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(&ms, e0, e1);
    if (e != cudaSuccess)
        st = cu_err(e, what);
    else
        *us = (double)ms * 1e3 / reps;
    if (ge)
        cudaGraphExecDestroy(ge);
    if (g)
        cudaGraphDestroy(g);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (cs)
        cudaStreamDestroy(cs);
    cudaFree(buf);
    return st;
}

/* k_read_probe over bytes (a multiple of 256) at a time, reps launches
 * back to back in one graph, each over the next slice of a buffer of span
 * bytes (wrapping; span >= bytes), after one warm-up replay: *us per
 * launch. Serves sn_cuda_read_bandwidth (span = bytes) and
 * sn_cuda_read_sweep. */
static sn_status read_probe_us(cuda_be *cb, size_t bytes, size_t span, int reps, double *us, const char *what)
{
    const unsigned grid = (unsigned)cb->di.n_sm * 8;
    const size_t slots = span / bytes; /* each launch over the next slice of the span, wrapping */
    double per = 0;
    SN_TRY(graph_us(
        cb, span, 1,
        [&](cudaStream_t cs, char *buf) {
            for (int r = 0; r < reps; r++)
                k_read_probe<0><<<grid, 512, 0, cs>>>((const uint4 *)(buf + (size_t)(r % slots) * bytes), bytes / 16,
                                                   (unsigned *)(buf + span));
            return cudaGetLastError();
        },
        &per, what));
    *us = per / reps;
    return SN_OK;
}

extern "C" sn_status sn_cuda_read_bandwidth(sn_backend *b, size_t bytes, int reps, double *gbs)
{
    SN_ASSERT(sn_cuda_is(b));
    bytes = bytes / 256 * 256;
    if (bytes < 256 || reps < 1 || reps > 4096)
        return SN_FAIL(SN_E_INVALID, "read bandwidth: %zu bytes, %d reps", bytes, reps);
    double us = 0;
    SN_TRY(read_probe_us(cb_of(b), bytes, bytes, reps, &us, "read bandwidth"));
    *gbs = (double)bytes / (us * 1e-6) / 1e9;
    return SN_OK;
}

/* read_chain: n launches of k_read_probe over bytes[i] each, the slices laid
 * end to end through a buffer of span bytes (wrapping), captured in one
 * graph and replayed reps times after a warm-up: *us per replay. Blocks of
 * 512 threads, two an SM, so a launch behind an edge finds room. */
extern "C" sn_status sn_cuda_read_chain(sn_backend *b, const size_t *bytes, int n, size_t span, int mode, int reps,
                                        double *us)
{
    SN_ASSERT(sn_cuda_is(b));
    if (n < 1 || n > 4096 || mode < 0 || mode > 3 || reps < 1 || reps > 100)
        return SN_FAIL(SN_E_INVALID, "read chain: %d launches, mode %d, %d reps", n, mode, reps);
    for (int i = 0; i < n; i++)
        if (bytes[i] < 256 || bytes[i] % 256 || bytes[i] > span)
            return SN_FAIL(SN_E_INVALID, "read chain: launch %d reads %zu bytes (a multiple of 256, 256..%zu)", i,
                           bytes[i], span);
    cuda_be *cb = cb_of(b);
    const unsigned grid = (unsigned)cb->di.n_sm * 2;
    /* mode 3: two blocks fill an SM's shared memory (less 1 KB a block
     * that the runtime reserves) */
    size_t smem = 0;
    if (mode == 3) {
        int sm_smem = 0;
        cudaSetDevice(cb->dev);
        CU_TRY(cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, cb->dev), "read chain");
        smem = (size_t)sm_smem / 2 - 2048;
        CU_TRY(cudaFuncSetAttribute(k_read_probe<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               "read chain");
    }
    /* mode 3 is mode 1's kernel with the SMs filled */
    const auto kern = mode == 0 ? k_read_probe<0> : mode == 2 ? k_read_probe<2> : k_read_probe<1>;
    return graph_us(
        cb, span, reps,
        [&](cudaStream_t cs, char *buf) {
            size_t off = 0;
            cudaError_t el = cudaSuccess;
            for (int i = 0; i < n && el == cudaSuccess; i++) {
                if (off + bytes[i] > span)
                    off = 0;
                el = cu_launch_pdl(mode != 0 && i > 0, kern, dim3(grid), dim3(512), smem, cs,
                                   (const uint4 *)(buf + off), bytes[i] / 16, (unsigned *)(buf + span));
                off += bytes[i];
            }
            return el;
        },
        us, "read chain");
}

/* The stamp records' device buffer: one for the process (a measurement
 * hook; the stamped kernel writes through one device pointer). */
static sn_gemv_stamp *g_stamps;
static int g_stamps_cap;

extern "C" sn_status sn_cuda_gemv_stamps(sn_backend *b, int cap)
{
    SN_ASSERT(sn_cuda_is(b));
    if (cap < 0 || cap > (1 << 24))
        return SN_FAIL(SN_E_INVALID, "gemv stamps: room for %d records (0 to 2^24)", cap);
    cuda_be *cb = cb_of(b);
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    if (cap > g_stamps_cap) {
        cudaFree(g_stamps);
        g_stamps = NULL;
        g_stamps_cap = 0;
        CU_TRY(cudaMalloc(&g_stamps, sizeof(sn_gemv_stamp) * (size_t)cap), "gemv stamps");
        g_stamps_cap = cap;
    }
    bool changed = false;
    SN_TRY(cu_gv_stamps(cap ? g_stamps : NULL, cap, &changed));
    if (changed)
        graphs_invalidate(cb); /* the captured launches name the other instance */
    return SN_OK;
}

extern "C" sn_status sn_cuda_gemv_stamps_read(sn_backend *b, sn_gemv_stamp *out, int cap, int *n)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    int have = 0;
    SN_TRY(cu_gv_stamps_count(&have));
    *n = have;
    int k = have < cap ? have : cap;
    if (k > g_stamps_cap)
        k = g_stamps_cap;
    if (k > 0)
        CU_TRY(cudaMemcpy(out, g_stamps, sizeof(sn_gemv_stamp) * (size_t)k, cudaMemcpyDeviceToHost), "gemv stamps");
    return SN_OK;
}

extern "C" sn_status sn_cuda_gemv_pool(sn_backend *b, long launches[2], int counters[4])
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    launches[0] = cu_gv_pool_launches();
    launches[1] = cu_gk_pool_launches();
    for (int i = 0; i < 4; i++)
        counters[i] = 0;
    if (cb->di.gv_pool)
        CU_TRY(cudaMemcpy(counters, cb->di.gv_pool, 2 * sizeof(int), cudaMemcpyDeviceToHost), "gemv pool");
    if (cb->di.gk_cnt)
        SN_TRY(cu_gk_pool_counters(&cb->di, counters + 2));
    return SN_OK;
}

extern "C" sn_status sn_cuda_read_sweep(sn_backend *b, size_t bytes, size_t span, int reps, double *us)
{
    SN_ASSERT(sn_cuda_is(b));
    bytes = bytes / 256 * 256;
    if (bytes < 256 || span < 2 * bytes || reps < 1 || reps > 4096)
        return SN_FAIL(SN_E_INVALID, "read sweep: %zu bytes in a span of %zu, %d reps", bytes, span, reps);
    return read_probe_us(cb_of(b), bytes, span, reps, us, "read sweep");
}

extern "C" void sn_cuda_graph_stats(sn_backend *b, long *replayed, long *captured, long *eager)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (replayed)
        *replayed = cb->n_replayed;
    if (captured)
        *captured = cb->n_captured;
    if (eager)
        *eager = cb->n_eager;
}

extern "C" void sn_cuda_ahead_stats(sn_backend *b, long *parked, long *launched)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (parked)
        *parked = cb->n_parked;
    if (launched)
        *launched = cb->n_parked_launched;
}

extern "C" long sn_cuda_graph_nodes(sn_backend *b)
{
    SN_ASSERT(sn_cuda_is(b));
    return cb_of(b)->last_nodes;
}
