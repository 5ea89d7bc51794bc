/* Kernel timelines through CUPTI's activity API (sn_cuda.h,
 * sn_cuda_timeline_begin / _end), for bench_cuda --timeline.
 *
 * Why: ncu times each graph node alone, so it cannot show what decides a
 * decode step on this backend, the overlap between launches (a kernel's
 * blocks resident and loading weights while the one before runs, PDL's
 * edges, the MoE early starts). CUPTI's concurrent-kernel records carry
 * every kernel's start and end on the GPU's clock inside a replayed graph,
 * so a step's critical path can be read off them (bench/timeline.h).
 *
 * libcupti is loaded with dlopen at the first call (the build links no
 * CUPTI, and a machine without it gets a clear error); built without the
 * CUPTI headers, the calls return SN_E_UNSUPPORTED. */
#include <dlfcn.h>
#include <mutex>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_be.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define SN_HAVE_CUPTI 1
#endif

#ifdef SN_HAVE_CUPTI
namespace {

struct cupti_api {
    void *lib;
    CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush)(uint32_t);
    CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*errstr)(CUptiResult, const char **);
};

cupti_api g_api;
bool g_registered;

/* The spans delivered so far; CUPTI may call back from a thread of its own. */
std::mutex g_mu;
sn_cuda_kspan *g_out;
int g_max, g_n;
long g_dropped;
bool g_on;

constexpr size_t TL_BUF = 8u << 20;

void CUPTIAPI tl_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    /* records are 8-byte aligned in the buffer CUPTI fills */
    *buf = (uint8_t *)aligned_alloc(8, TL_BUF);
    *size = *buf ? TL_BUF : 0;
    *max_records = 0;
}

void CUPTIAPI tl_buffer_completed(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid)
{
    CUpti_Activity *rec = NULL;
    std::lock_guard<std::mutex> lk(g_mu);
    while (buf && g_api.next(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        if (!g_on || g_n >= g_max) {
            g_dropped++;
            continue;
        }
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        sn_cuda_kspan *s = &g_out[g_n++];
        snprintf(s->name, sizeof s->name, "%s", k->name ? k->name : "?");
        s->start = k->start;
        s->end = k->end;
        s->corr = k->correlationId;
    }
    free(buf);
}

const char *tl_err(CUptiResult r)
{
    const char *s = NULL;
    if (g_api.errstr && g_api.errstr(r, &s) == CUPTI_SUCCESS && s)
        return s;
    return "CUPTI error";
}

sn_status tl_load(void)
{
    if (g_api.lib)
        return SN_OK;
    static const char *names[] = { "libcupti.so", "libcupti.so.13", "libcupti.so.12",
                                   "/usr/local/cuda/lib64/libcupti.so",
                                   "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so" };
    void *lib = NULL;
    for (const char *n : names)
        if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)))
            break;
    if (!lib)
        return SN_FAIL(SN_E_UNSUPPORTED, "timeline: libcupti not found (%s)", dlerror());
    cupti_api a;
    a.lib = lib;
    a.reg = (decltype(a.reg))dlsym(lib, "cuptiActivityRegisterCallbacks");
    a.enable = (decltype(a.enable))dlsym(lib, "cuptiActivityEnable");
    a.disable = (decltype(a.disable))dlsym(lib, "cuptiActivityDisable");
    a.flush = (decltype(a.flush))dlsym(lib, "cuptiActivityFlushAll");
    a.next = (decltype(a.next))dlsym(lib, "cuptiActivityGetNextRecord");
    a.errstr = (decltype(a.errstr))dlsym(lib, "cuptiGetResultString");
    if (!a.reg || !a.enable || !a.disable || !a.flush || !a.next) {
        dlclose(lib);
        return SN_FAIL(SN_E_UNSUPPORTED, "timeline: libcupti lacks the activity API");
    }
    g_api = a;
    return SN_OK;
}

} // namespace

extern "C" sn_status sn_cuda_timeline_begin(sn_backend *b, sn_cuda_kspan *out, int max)
{
    SN_ASSERT(sn_cuda_is(b));
    if (!out || max < 1)
        return SN_FAIL(SN_E_INVALID, "timeline: no room for spans (max %d)", max);
    cuda_be *cb = cb_of(b);
    cudaSetDevice(cb->dev);
    CU_TRY(cudaStreamSynchronize(cb->st), "timeline");
    SN_TRY(tl_load());
    CUptiResult r;
    if (!g_registered) {
        if ((r = g_api.reg(tl_buffer_requested, tl_buffer_completed)) != CUPTI_SUCCESS)
            return SN_FAIL(SN_E_BACKEND, "timeline: cuptiActivityRegisterCallbacks: %s", tl_err(r));
        g_registered = true;
    }
    {
        std::lock_guard<std::mutex> lk(g_mu);
        g_out = out;
        g_max = max;
        g_n = 0;
        g_dropped = 0;
        g_on = true;
    }
    if ((r = g_api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) != CUPTI_SUCCESS) {
        std::lock_guard<std::mutex> lk(g_mu);
        g_on = false;
        return SN_FAIL(SN_E_BACKEND, "timeline: cuptiActivityEnable: %s", tl_err(r));
    }
    return SN_OK;
}

extern "C" sn_status sn_cuda_timeline_end(sn_backend *b, int *n, long *dropped)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    cudaSetDevice(cb->dev);
    const cudaError_t e = cudaStreamSynchronize(cb->st);
    CUptiResult r = g_api.disable ? g_api.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) : CUPTI_SUCCESS;
    /* every buffer delivered, the part-filled ones too (forced) */
    const CUptiResult rf = g_api.flush ? g_api.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) : CUPTI_SUCCESS;
    std::lock_guard<std::mutex> lk(g_mu);
    g_on = false;
    if (n)
        *n = g_n;
    if (dropped)
        *dropped = g_dropped;
    g_out = NULL;
    if (e != cudaSuccess)
        return SN_FAIL(SN_E_BACKEND, "timeline: %s", cudaGetErrorString(e));
    if (r != CUPTI_SUCCESS)
        return SN_FAIL(SN_E_BACKEND, "timeline: cuptiActivityDisable: %s", tl_err(r));
    if (rf != CUPTI_SUCCESS)
        return SN_FAIL(SN_E_BACKEND, "timeline: cuptiActivityFlushAll: %s", tl_err(rf));
    return SN_OK;
}

#else

extern "C" sn_status sn_cuda_timeline_begin(sn_backend *b, sn_cuda_kspan *, int)
{
    SN_ASSERT(sn_cuda_is(b));
    return SN_FAIL(SN_E_UNSUPPORTED, "timeline: built without the CUPTI headers");
}

extern "C" sn_status sn_cuda_timeline_end(sn_backend *b, int *n, long *dropped)
{
    SN_ASSERT(sn_cuda_is(b));
    if (n)
        *n = 0;
    if (dropped)
        *dropped = 0;
    return SN_FAIL(SN_E_UNSUPPORTED, "timeline: built without the CUPTI headers");
}

#endif
