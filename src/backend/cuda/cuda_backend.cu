/* The CUDA backend driver: device memory, weight upload, argument checks,
 * the op table, per-op profiling events (reported by cuda_measure.cu), and
 * decode-step graphs. Its state, cuda_be, is in cuda_be.h.
 *
 * Decode-step graphs. Between begin_step and end_step, ops are not run but
 * recorded (arguments only; every check still happens at the call). At
 * end_step the record is compared with the one the cached graph was
 * captured from: when they match except for positions that all moved by the
 * same delta (and token ids, which are data), the graph is replayed with
 * that delta and the ids written into a small parameter block that the
 * graph's first node copies to the device; otherwise the record is captured
 * into a new graph (cudaGraphExecUpdate when the topology allows) and run.
 * So the model calls ops exactly as it does eagerly, the host does a
 * memcmp per op instead of a launch, and the GPU runs the step without
 * launch gaps. Anything inside a step that needs the host (to_host, sync,
 * from_host, free) first runs the pending record eagerly; that step then
 * stays eager.
 *
 * Recording ahead (step_launch, begin_ahead, step_park, step_launch_parked):
 * the generation loop records step n+1 while the GPU runs step n, with a
 * stand-in token; once token n is known, the parked record is launched with
 * it (ids are data). The op calls then no longer sit between two steps'
 * graphs on the GPU. A step begun ahead is never run: an op that would run
 * it (a host barrier) is refused and the park fails. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_be.h"
#include "sanctum/clock.h"

int cu_pdl = 0; /* see cuda_internal.h; set at backend creation */
int64_t cu_pdl_min_bytes = 0;
thread_local int cu_pdl_skip;
thread_local int cu_last_edge;
int cu_pdl_small; /* set at creation: 0 unless SANCTUM_CUDA_PDL_SMALL (no bit gained in run 39) */

namespace {

sn_status ensure_scratch(cuda_be *cb, size_t bytes)
{
    if (bytes <= cb->scratch_cap)
        return SN_OK;
    size_t want = bytes + bytes / 4 + (1u << 20);
    if (cb->scratch) {
        cudaError_t e = cudaStreamSynchronize(cb->st);
        if (e != cudaSuccess)
            return cu_err(e, "scratch sync");
        cudaFree(cb->scratch);
        cb->held -= cb->scratch_cap;
        cb->scratch = NULL;
        cb->scratch_cap = 0;
    }
    stg_forget(cb);
    cudaError_t e = cudaMalloc(&cb->scratch, want);
    if (e != cudaSuccess)
        return SN_FAIL(SN_E_NOMEM, "cuda scratch of %zu bytes: %s", want, cudaGetErrorString(e));
    cb->scratch_cap = want;
    cb->held += want;
    graphs_invalidate(cb); /* a captured graph holds the old pointer */
    return SN_OK;
}

/* ------------------------------------------------------------------------ */
/* Dispatch: run one recorded op on the stream. capture: inside a graph      */
/* capture (positions through the parameter block, ids from it).             */
/* ------------------------------------------------------------------------ */

const cu_weight *cw_of(const void *p) { return (const cu_weight *)((const sn_weight *)p)->dev; }

/* An R_MOE record's shared expert into *sh (moe_submit sets p[6..9]
 * together), or NULL for a plain moe. */
const cu_moe_sh *moe_sh_of(const rec &r, cu_moe_sh *sh)
{
    if (!r.p[6])
        return NULL;
    *sh = { cw_of(r.p[6]), cw_of(r.p[7]), cw_of(r.p[8]), (const float *)r.p[9] };
    return sh;
}

/* An eager matmul, staging x for the integer GEMM only when scratch does
 * not hold it already (see cuda_be.stg). */
sn_status eager_matmul(cuda_be *cb, const rec &r)
{
    const cu_weight *w = cw_of(r.p[0]);
    const float *x = (const float *)r.p[1];
    float *y = (float *)r.p[2];
    const int T = (int)r.i[1];
    if (!cu_matmul_gemm_i8(&cb->di, w, r.i[0], T)) {
        stg_forget(cb);
        return cu_matmul(&cb->di, cb->st, w, (int)r.i[0], x, T, y, cb->scratch, false);
    }
    const bool staged = cb->stg.valid && cb->stg.x == x && cb->stg.scratch == cb->scratch && cb->stg.T == T &&
                        cb->stg.cols == w->cols && cb->stg.group == w->group && cb->stg.digits == cb->di.gemm_i8;
    sn_status st = cu_matmul(&cb->di, cb->st, w, (int)r.i[0], x, T, y, cb->scratch, staged);
    const char *xb = (const char *)x, *yb = (const char *)y;
    const size_t nx = sizeof(float) * (size_t)T * w->cols, ny = sizeof(float) * (size_t)T * w->rows;
    const bool clobbers = yb < xb + nx && xb < yb + ny; /* y over x: x is not what was staged */
    cb->stg.valid = st == SN_OK && !clobbers;
    cb->stg.x = x;
    cb->stg.scratch = cb->scratch;
    cb->stg.T = T;
    cb->stg.cols = w->cols;
    cb->stg.group = w->group;
    cb->stg.digits = cb->di.gemm_i8;
    return st;
}

/* An R_ATTN record on the stream; gate: its output gate folded in (try_fuse_attn_gate). */
sn_status run_attention(cuda_be *cb, const rec &r, const int *d_delta, const float *gate)
{
    sn_kv_view kv = { (float *)r.p[0], (float *)r.p[1], (int)r.i[0], (int)r.i[1], (int)r.i[2] };
    return cu_attention(&cb->di, cb->st, (const float *)r.p[2], &kv, (int)r.i[3], r.pos0, d_delta, (int)r.i[4], r.f[0],
                        (float *)r.p[3], cb->scratch, gate);
}

/* An R_GDN record's dimensions (gdn() stores them in i[0..4], f[0]). */
sn_gdn_dims gdn_dims_of(const rec &r)
{
    return { (int)r.i[0], (int)r.i[1], (int)r.i[2], (int)r.i[3], (int)r.i[4], r.f[0] };
}

sn_status dispatch(cuda_be *cb, const rec &r, bool capture)
{
    cudaStream_t s = cb->st;
    const int *d_delta = capture ? &cb->d_sp->delta : cb->d_zero;
    if (capture || r.kind != R_MATMUL)
        stg_forget(cb);
    switch (r.kind) {
    case R_MATMUL:
        if (!capture)
            return eager_matmul(cb, r);
        return cu_matmul(&cb->di, s, cw_of(r.p[0]), (int)r.i[0], (const float *)r.p[1], (int)r.i[1],
                         (float *)r.p[2], cb->scratch, false);
    case R_EMBED: {
        int T = (int)r.i[0];
        const int32_t *ids;
        if (capture) {
            ids = cb->d_sp->ids + r.i[1];
        } else {
            /* eager replay of a recorded embed: the ids wait in pend_ids */
            /* a direct call carries the caller's ids (p[2]); a flushed step's
             * record finds them in pend_ids */
            const int32_t *src = r.p[2] ? (const int32_t *)r.p[2] : cb->pend_ids + r.i[1];
            CU_TRY(cudaMemcpyAsync(cb->d_ids, src, sizeof(int32_t) * T, cudaMemcpyHostToDevice, s), "embed ids");
            cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
            ids = cb->d_ids;
        }
        return cu_embed(s, cw_of(r.p[0]), ids, T, (float *)r.p[1]);
    }
    case R_RMSNORM:
        return cu_rmsnorm(s, (const float *)r.p[0], (const float *)r.p[1], (int)r.i[0], (int)r.i[1], r.f[0],
                          (float *)r.p[2]);
    case R_GRMSNORM:
        return cu_gated_rmsnorm(s, (const float *)r.p[0], (const float *)r.p[1], (const float *)r.p[2], (int)r.i[0],
                                (int)r.i[1], r.f[0], (float *)r.p[3]);
    case R_ADD: return cu_add(s, (float *)r.p[0], (const float *)r.p[1], (size_t)r.i[0]);
    case R_SWIGLU:
        return cu_swiglu(s, (const float *)r.p[0], (const float *)r.p[1], (size_t)r.i[0], (float *)r.p[2]);
    case R_MULSIG: return cu_mul_sigmoid(s, (float *)r.p[0], (const float *)r.p[1], (size_t)r.i[0]);
    case R_ROPE:
        return cu_rope(s, (float *)r.p[0], (int)r.i[0], (int)r.i[1], (int)r.i[2], (int)r.i[3], r.pos0, d_delta,
                       (const float *)r.p[1], r.f[0]);
    case R_KVWRITE: {
        sn_kv_view kv = { (float *)r.p[0], (float *)r.p[1], (int)r.i[0], (int)r.i[1], (int)r.i[2] };
        return cu_kv_write(s, &kv, (const float *)r.p[2], (const float *)r.p[3], (int)r.i[3], r.pos0, d_delta);
    }
    case R_ATTN: return run_attention(cb, r, d_delta, NULL);
    case R_GDN: {
        sn_gdn_dims d = gdn_dims_of(r);
        return cu_gdn(s, &d, (const float *)r.p[0], (const float *)r.p[1], (const float *)r.p[2],
                      (const float *)r.p[3], (const float *)r.p[4], (const float *)r.p[5], (float *)r.p[6],
                      (float *)r.p[7], (float *)r.p[9], (int)r.i[6], (int)r.i[5], (float *)r.p[8], cb->scratch,
                      cb->d_gdn_cnt);
    }
    case R_COPY:
        CU_TRY(cudaMemcpyAsync((void *)r.p[0], r.p[1], (size_t)r.i[0], cudaMemcpyDeviceToDevice, s), "copy");
        cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
        return SN_OK;
    case R_MEMSET:
        CU_TRY(cudaMemsetAsync((void *)r.p[0], 0, (size_t)r.i[0], s), "memset0");
        cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
        return SN_OK;
    case R_ARGMAX:
        return cu_argmax(s, (const float *)r.p[0], (int)r.i[0], (int)r.i[1], cb->d_outs + r.i[2], cb->scratch);
    case R_MOE: {
        cu_moe_sh sh;
        return cu_moe(&cb->di, s, cw_of(r.p[0]), cw_of(r.p[1]), cw_of(r.p[2]), (const float *)r.p[3], (int)r.i[0],
                      (int)r.i[1], (const float *)r.p[4], (int)r.i[2], (float *)r.p[5], cb->scratch,
                      moe_sh_of(r, &sh), cb->d_moe_sync);
    }
    case R_ADDGATED:
        return cu_add_gated(s, (float *)r.p[0], (const float *)r.p[1], (const float *)r.p[2], (int)r.i[0],
                            (int)r.i[1]);
    default:
        return SN_FAIL(SN_E_INVALID, "cuda: unknown record kind %d", r.kind);
    }
}

/* Run one op now (outside a step), with profiling events if on. */
sn_status run_eager(cuda_be *cb, const rec &r)
{
    prof_ev ev = { r.kind, NULL, NULL };
    if (cb->prof) {
        if (cb->n_evs == cb->cap_evs) {
            int nc = cb->cap_evs ? 2 * cb->cap_evs : 4096;
            prof_ev *ne = (prof_ev *)realloc(cb->evs, sizeof(prof_ev) * nc);
            if (!ne)
                return SN_FAIL(SN_E_NOMEM, "cuda profile events");
            cb->evs = ne;
            cb->cap_evs = nc;
        }
        CU_TRY(cudaEventCreate(&ev.a), "profile event");
        CU_TRY(cudaEventCreate(&ev.b), "profile event");
        CU_TRY(cudaEventRecord(ev.a, cb->st), "profile event");
    }
    sn_status st = dispatch(cb, r, false);
    if (cb->prof) {
        CU_TRY(cudaEventRecord(ev.b, cb->st), "profile event");
        cb->evs[cb->n_evs++] = ev;
    }
    return st;
}

/* Copy argmax results of the pending step to their host destinations
 * (after the stream has finished). */
void deliver_outs(cuda_be *cb)
{
    for (int k = 0; k < cb->n_outs; k++)
        *cb->out_ptrs[k] = cb->h_outs[k];
    cb->n_outs = 0;
}

/* The launched step (step_launch) to its end: its argmax rows delivered
 * and, when it replayed a graph with the step timing on, its times added.
 * Anything that writes h_outs first calls this. */
sn_status finish_launched(cuda_be *cb)
{
    if (!cb->launched)
        return SN_OK;
    cb->launched = false;
    CU_TRY(cudaStreamSynchronize(cb->st), "step wait");
    for (int k = 0; k < cb->l_n_outs; k++)
        *cb->l_out_ptrs[k] = cb->h_outs[k];
    cb->l_n_outs = 0;
    float ms = 0;
    if (cb->stime.on && cb->l_rep != cb->n_replayed &&
        cudaEventElapsedTime(&ms, cb->stime.a, cb->stime.b) == cudaSuccess) {
        cb->stime.gpu_ms += ms;
        cb->stime.end_s += sn_now_s() - cb->l_t_end;
        cb->stime.n++;
    }
    return SN_OK;
}

/* A step begun ahead must never run: whatever would run it spoils the
 * record instead (step_park then fails) and is refused. */
sn_status ahead_refuse(cuda_be *cb, const char *what)
{
    cb->ahead_bad = true;
    return SN_FAIL(SN_E_INVALID, "%s inside a step recorded ahead (it is parked, never run)", what);
}

/* Run the pending record eagerly and leave the step in eager mode. */
sn_status flush_step(cuda_be *cb)
{
    if (!cb->in_step || cb->broken)
        return SN_OK;
    if (cb->ahead)
        return ahead_refuse(cb, "a host barrier");
    SN_TRY(finish_launched(cb)); /* the eager argmax copies land in h_outs */
    cb->broken = true;
    cb->n_eager++;
    for (int k = 0; k < cb->n_recs; k++) {
        SN_TRY(run_eager(cb, cb->recs[k]));
        if (cb->recs[k].kind == R_ARGMAX) {
            int off = (int)cb->recs[k].i[2], rows = (int)cb->recs[k].i[0];
            CU_TRY(cudaMemcpyAsync(cb->h_outs + off, cb->d_outs + off, sizeof(int32_t) * rows,
                                   cudaMemcpyDeviceToHost, cb->st), "argmax result");
            cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
        }
    }
    CU_TRY(cudaStreamSynchronize(cb->st), "step flush");
    deliver_outs(cb);
    cb->n_recs = 0;
    return SN_OK;
}

/* Submit one op: recorded inside a step, else run now. need: scratch bytes. */
sn_status submit(cuda_be *cb, const rec &r, size_t need)
{
    /* the calling thread may not be the one that made the backend (a server
     * worker): launches and allocations go to the thread's current device.
     * A recorded op makes no CUDA call (begin_step set the device): the set
     * took about half of the host's time per op, which the GPU waits out
     * between two graph steps (s38r2) */
    const bool record = cb->in_step && !cb->broken;
    if (!record || need > cb->scratch_cap)
        cudaSetDevice(cb->dev);
    SN_TRY(ensure_scratch(cb, need));
    if (record) {
        if (cb->n_recs == cb->cap_recs) {
            int nc = cb->cap_recs ? 2 * cb->cap_recs : 1024;
            rec *nr = (rec *)realloc(cb->recs, sizeof(rec) * nc);
            if (!nr)
                return SN_FAIL(SN_E_NOMEM, "cuda step record");
            cb->recs = nr;
            cb->cap_recs = nc;
        }
        cb->recs[cb->n_recs++] = r;
        return SN_OK;
    }
    return run_eager(cb, r);
}

} // namespace

sn_status host_barrier(cuda_be *cb)
{
    if (cb->in_step && !cb->broken)
        return flush_step(cb);
    return SN_OK;
}

namespace {

rec rec_new(int kind)
{
    rec r;
    memset(&r, 0, sizeof r);
    r.kind = kind;
    return r;
}

/* ------------------------------------------------------------------------ */
/* Graph capture / replay                                                     */
/* ------------------------------------------------------------------------ */

/* The delta that maps a cached record onto the pending one, or false. */
bool records_match(const cuda_be *cb, const gslot *g, int *delta)
{
    if (!g->valid || g->n != cb->n_recs)
        return false;
    bool have = false;
    int dl = 0;
    /* every byte but pos0, in place: the fields before it, then from pad on */
    static_assert(offsetof(rec, pos0) + sizeof(int) == offsetof(rec, pad), "rec layout");
    constexpr size_t tail = offsetof(rec, pad);
    for (int k = 0; k < cb->n_recs; k++) {
        const rec &a = cb->recs[k], &b = g->recs[k];
        if (memcmp(&a, &b, offsetof(rec, pos0)) != 0 ||
            memcmp((const char *)&a + tail, (const char *)&b + tail, sizeof a - tail) != 0)
            return false;
        if (a.has_pos) {
            int d = a.pos0 - b.pos0;
            if (have && d != dl)
                return false;
            have = true;
            dl = d;
        } else if (a.pos0 != b.pos0) {
            return false;
        }
    }
    *delta = dl;
    return true;
}

/* Inside a capture: consecutive decode matmuls (the same T <= CU_GROUP_T_MAX
 * rows, quantized, same x, same kernel as each would get alone) become one
 * grouped launch, an RMSNorm or a swiglu of those rows right before
 * them that produces their x is done inside that launch (it still writes its
 * output, for later readers), and a residual add right after them that reads one of
 * their outputs is folded into it (the output is still written). The
 * arithmetic is unchanged (the fused norm reproduces cu_rmsnorm's sum
 * order), so a fused graph gives the same bits as the ops run one by one.
 * Returns the records consumed (0: no fusion here). */
int try_fuse(cuda_be *cb, int k, sn_status *st)
{
    if (!cb->fuse)
        return 0;
    const rec *nr = NULL, *sw = NULL, *gn = NULL;
    int k0 = k;
    if (cb->recs[k].kind == R_RMSNORM && cb->recs[k].p[0] != cb->recs[k].p[2] && k + 1 < cb->n_recs) {
        nr = &cb->recs[k];
        k0 = k + 1;
    } else if (cb->recs[k].kind == R_SWIGLU && k + 1 < cb->n_recs) {
        sw = &cb->recs[k]; /* one row's swiglu that makes the x of the matmuls after it */
        k0 = k + 1;
    } else if (cb->recs[k].kind == R_GRMSNORM && cb->fuse_gate && k + 1 < cb->n_recs && cb->recs[k].i[1] == CU_GNORM_N &&
               cb->recs[k].p[0] != cb->recs[k].p[3] && cb->recs[k].p[1] != cb->recs[k].p[3]) {
        gn = &cb->recs[k]; /* the gated norm of a GDN layer's output, the x of its out projection */
        k0 = k + 1;
    }
    const rec &r0 = cb->recs[k0];
    const int64_t T = r0.i[1];
    if (r0.kind != R_MATMUL || T < 1 || T > CU_GROUP_T_MAX)
        return 0;
    const cu_weight *w0 = cw_of(r0.p[0]);
    if (w0->fmt != CW_Q4 && w0->fmt != CW_Q8)
        return 0;
    const cu_weight *ws[CU_GROUP_MAX];
    int64_t es[CU_GROUP_MAX];
    float *ys[CU_GROUP_MAX], *adds[CU_GROUP_MAX] = { 0 };
    const void *x = r0.p[1];
    const void *raw = nr ? nr->p[0] : sw ? sw->p[0] : gn ? gn->p[0] : x; /* what the launch reads */
    const void *raw2 = sw ? sw->p[1] : gn ? gn->p[1] : raw;                /* (and swiglu's u, the gate's z) */
    if (nr && (nr->p[2] != x || nr->i[0] != T || nr->i[1] != w0->cols))
        return 0;
    if (sw && (sw->p[2] != x || sw->i[0] != T * w0->cols))
        return 0;
    /* the gated norm: only where the launch folds it (cu_matmul_folds_gnorm:
     * the integer GEMV's digits pass), the one test of it for this fuser
     * and the launch (they disagreed once: 14697fd's SIMT fold was built
     * for a launch this fuser never made) */
    if (gn && (gn->p[3] != x || r0.i[0] != 0 || gn->i[0] != T * (w0->cols / CU_GNORM_N) ||
               !cu_matmul_folds_gnorm(&cb->di, w0, (const float *)gn->p[0], (const float *)gn->p[1],
                                      (const float *)gn->p[2], (const float *)x, (int)T)))
        return 0;
    int n = 0, j = k0;
    while (j < cb->n_recs && n < CU_GROUP_MAX) {
        const rec &r = cb->recs[j];
        if (r.kind != R_MATMUL || r.i[1] != T || r.p[1] != x)
            break;
        const cu_weight *w = cw_of(r.p[0]);
        float *y = (float *)r.p[2];
        /* a matrix grouped must get the kernel it gets alone (its bits) */
        bool clash = !cu_matmul_same_kernel(&cb->di, w0, r0.i[0], w, r.i[0], (const float *)x, (int)T) || y == x ||
                     y == raw || y == raw2;
        for (int i = 0; i < n; i++)
            clash = clash || ys[i] == y;
        if (clash)
            break;
        ws[n] = w;
        es[n] = r.i[0];
        ys[n] = y;
        n++;
        j++;
    }
    if (!n)
        return 0;
    int used = (k0 - k) + n;
    if (j < cb->n_recs && cb->recs[j].kind == R_ADD) {
        const rec &a = cb->recs[j];
        float *tgt = (float *)a.p[0];
        bool ok = tgt != x && tgt != raw && tgt != raw2; /* the launch must not write what it reads */
        for (int i = 0; i < n; i++)
            ok = ok && tgt != ys[i];
        for (int i = 0; i < n && ok; i++)
            if (a.p[1] == ys[i] && a.i[0] == T * ws[i]->rows) {
                adds[i] = tgt;
                used++;
                break;
            }
    }
    /* a GDN layer right after its input projections: its conv in the qkv
     * projection's epilogue (raw qkv still written), the rest in one launch
     * after the group (fuse_conv; the same bits as the ops one by one) */
    const rec *gd = NULL;
    cu_gemv_conv conv;
    sn_gdn_dims gdd;
    memset(&conv, 0, sizeof conv);
    if (cb->fuse_conv && used == (k0 - k) + n && j < cb->n_recs && cb->recs[j].kind == R_GDN) {
        const rec &r = cb->recs[j];
        gdd = gdn_dims_of(r);
        const int64_t C = 2 * (int64_t)gdd.n_k_heads * gdd.dk + (int64_t)gdd.n_v_heads * gdd.dv;
        /* the conv's rows go to scratch (the GDN record reserved it), which
         * no recorded op's buffers point into */
        bool ok = r.p[0] == ys[0] && r.i[5] == T && ws[0]->rows == C && es[0] == 0 && r.p[6] &&
                  ((uintptr_t)r.p[3] & 15) == 0 && cu_gdn_folds_conv(&gdd, (int)T) &&
                  cu_matmul_folds_conv(&cb->di, ws[0], (const float *)x, (int)T);
        if (ok) {
            gd = &r;
            conv.w = (const float *)r.p[3];
            conv.state = (float *)r.p[6];
            conv.c = (float *)cb->scratch;
            conv.hist = (float *)r.p[9];
            conv.hstride = sn_gdn_hist_floats(&gdd);
            conv.nh = (int)r.i[6];
            used++;
        }
    }
    if (n < 2 && used == n)
        return 0;
    cu_gemv_norm norm;
    memset(&norm, 0, sizeof norm);
    if (nr) {
        norm.w = (const float *)nr->p[1];
        norm.eps = nr->f[0];
        norm.threads = cu_rmsnorm_threads((int)nr->i[1]);
        norm.xn = (float *)nr->p[2];
    } else if (sw) {
        norm.su = (const float *)sw->p[1];
        norm.xn = (float *)sw->p[2];
    } else if (gn) {
        norm.w = (const float *)gn->p[2];
        norm.gz = (const float *)gn->p[1];
        norm.eps = gn->f[0];
        norm.xn = (float *)gn->p[3];
    }
    *st = cu_matmul_group(&cb->di, cb->st, n, ws, es, ys, adds, (const float *)raw, (int)T,
                          nr || sw || gn ? &norm : NULL, gd ? &conv : NULL, cb->scratch);
    if (gd && *st == SN_OK) {
        stg_forget(cb); /* the conv's rows are in scratch now */
        *st = cu_gdn_after_conv(cb->st, &gdd, conv.c, (const float *)gd->p[1], (const float *)gd->p[2],
                                (const float *)gd->p[4], (const float *)gd->p[5], (float *)gd->p[7], conv.hist,
                                conv.nh, (int)T, (float *)gd->p[8]);
    }
    return used;
}

/* [moe] Inside a capture: an MoE of T tokens on the two-launch decode path
 * followed by add_gated into its output and/or a residual add of its
 * output (the model's y = moe; y += sigmoid(g) * sh; x += y) runs as that
 * pair with both adds in the down kernel's epilogue, with the float
 * operations of k_add_gated and k_add, so the bits equal the ops run one by
 * one. Refused when a buffer the epilogue reads overlaps one it writes
 * (only add_to[i] is read and written, by the same thread). */
bool moe_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *pa = (const char *)a, *pb = (const char *)b;
    return a && b && pa < pb + nb && pb < pa + na;
}

int try_fuse_moe(cuda_be *cb, int k, sn_status *st)
{
    const rec &r = cb->recs[k];
    if (!cb->fuse || r.kind != R_MOE)
        return 0;
    const cu_weight *g = cw_of(r.p[0]), *u = cw_of(r.p[1]), *d = cw_of(r.p[2]);
    const int top_k = (int)r.i[0], T = (int)r.i[2];
    cu_moe_sh sh;
    const cu_moe_sh *shp = moe_sh_of(r, &sh);
    if (T >= 32 && cb->di.moe_gemm)
        return 0; /* cu_moe's grouped path */
    if (shp ? !cu_moe_sh_ok(&cb->di, g, u, d, shp, T, top_k) : !cu_moe_dec_ok(g, u, d, T, top_k))
        return 0;
    float *out = (float *)r.p[5];
    const int64_t H = d->rows;
    const size_t nout = sizeof(float) * (size_t)T * (size_t)H;
    const void *scr = cb->scratch;
    const size_t nscr = cu_moe_dec_scratch_bytes(g, T, top_k + (shp ? 1 : 0));
    cu_moe_epi epi = { NULL, NULL, NULL };
    int used = 1;
    if (k + used < cb->n_recs && cb->recs[k + used].kind == R_ADDGATED) {
        const rec &a = cb->recs[k + used];
        if (a.p[0] == out && a.i[0] == T && a.i[1] == H && !moe_overlap(out, nout, a.p[1], nout) &&
            !moe_overlap(out, nout, a.p[2], sizeof(float) * T) && !moe_overlap(scr, nscr, a.p[1], nout) &&
            !moe_overlap(scr, nscr, a.p[2], sizeof(float) * T)) {
            epi.sh = (const float *)a.p[1];
            epi.sg = (const float *)a.p[2];
            used++;
        }
    }
    if (k + used < cb->n_recs && cb->recs[k + used].kind == R_ADD) {
        const rec &a = cb->recs[k + used];
        float *tgt = (float *)a.p[0];
        if (a.p[1] == out && a.i[0] == (int64_t)T * H && !moe_overlap(tgt, nout, out, nout) &&
            !moe_overlap(tgt, nout, scr, nscr) && !moe_overlap(tgt, nout, epi.sh, nout) &&
            !moe_overlap(tgt, nout, epi.sg, sizeof(float) * T) &&
            !moe_overlap(tgt, nout, shp ? shp->sg : NULL, sizeof(float) * T)) {
            epi.add_to = tgt;
            used++;
        }
    }
    if (used == 1)
        return 0;
    *st = cu_moe_dec(cb->st, g, u, d, (const float *)r.p[3], top_k, (int)r.i[1], (const float *)r.p[4], T, out,
                     cb->scratch, shp, &epi, cb->d_moe_sync);
    return used;
}
/* [moe] end */

/* Inside a capture, with cu_fuse_attn_prep: the gated attention's q/k
 * RMSNorms, their RoPEs and the KV write of one sequence (five records in
 * forward.c's order) as one launch (cu_attn_prep, the same bits). Every
 * buffer must be distinct, so no record reads what an earlier one of the
 * five wrote except as the unfused order does. Returns the records used. */
int try_fuse_attn_prep(cuda_be *cb, int k, sn_status *st)
{
    if (!cb->fuse || !cu_fuse_attn_prep || k + 5 > cb->n_recs)
        return 0;
    const rec &nq = cb->recs[k], &nk = cb->recs[k + 1], &rq = cb->recs[k + 2], &rk = cb->recs[k + 3],
              &kw = cb->recs[k + 4];
    if (nq.kind != R_RMSNORM || nk.kind != R_RMSNORM || rq.kind != R_ROPE || rk.kind != R_ROPE ||
        kw.kind != R_KVWRITE)
        return 0;
    const int64_t T = rq.i[0], Hq = rq.i[1], Hkv = rk.i[1], D = rq.i[2];
    const bool shape = rk.i[0] == T && kw.i[3] == T && rk.i[2] == D && nq.i[1] == D && nk.i[1] == D &&
                       kw.i[2] == D && nq.i[0] == T * Hq && nk.i[0] == T * Hkv && kw.i[1] == Hkv &&
                       rq.i[3] == rk.i[3] && rq.p[1] == rk.p[1] && rq.f[0] == rk.f[0] && rq.pos0 == rk.pos0 &&
                       kw.pos0 == rq.pos0 && D <= 4096;
    /* the chain: rope(qn), rope(kn), kv_write(kn, v) */
    const bool chain = rq.p[0] == nq.p[2] && rk.p[0] == nk.p[2] && kw.p[2] == nk.p[2];
    if (!shape || !chain)
        return 0;
    const void *bufs[7] = { nq.p[0], nk.p[0], kw.p[3], nq.p[2], nk.p[2], kw.p[0], kw.p[1] };
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (bufs[i] == bufs[j])
                return 0;
    cu_attn_prep_args a;
    memset(&a, 0, sizeof a);
    a.q = (const float *)nq.p[0];
    a.k = (const float *)nk.p[0];
    a.v = (const float *)kw.p[3];
    a.qw = (const float *)nq.p[1];
    a.kw = (const float *)nk.p[1];
    a.qn = (float *)nq.p[2];
    a.kn = (float *)nk.p[2];
    a.eps_q = nq.f[0];
    a.eps_k = nk.f[0];
    a.T = (int)T;
    a.Hq = (int)Hq;
    a.Hkv = (int)Hkv;
    a.D = (int)D;
    a.rot_dim = (int)rq.i[3];
    a.pos0 = rq.pos0;
    a.inv_freq = (const float *)rq.p[1];
    a.mscale = rq.f[0];
    a.kc = (float *)kw.p[0];
    a.vc = (float *)kw.p[1];
    *st = cu_attn_prep(cb->st, &a, &cb->d_sp->delta);
    return 5;
}

/* Inside a capture: an attention followed by the output gate on its
 * output (mul_sigmoid of all of it, gate elsewhere) runs as one: the
 * decode combine applies the gate as it writes (the same float
 * operations). Returns the records consumed (0: no fusion here). */
int try_fuse_attn_gate(cuda_be *cb, int k, sn_status *st)
{
    const rec &a = cb->recs[k];
    if (!cb->fuse || !cb->fuse_gate || a.kind != R_ATTN || k + 1 >= cb->n_recs)
        return 0;
    const rec &g = cb->recs[k + 1];
    const int64_t n = a.i[3] * a.i[4] * a.i[2]; /* T * q heads * head_dim */
    const char *out = (const char *)a.p[3], *gp = (const char *)g.p[1];
    if (g.kind != R_MULSIG || g.p[0] != a.p[3] || g.i[0] != n || (gp < out + 4 * n && out < gp + 4 * n))
        return 0;
    *st = run_attention(cb, a, &cb->d_sp->delta, (const float *)g.p[1]);
    return 2;
}

/* A fingerprint of a captured graph's topology for cudaGraphExecUpdate:
 * each node's type and kernel, each edge's kind (a programmatic edge or
 * not) between which kernels, in the graph's order. Two captures of one
 * node count can still differ there (another fused form, a PDL edge moved),
 * and the update then fails with an API error (which compute-sanitizer
 * reports) before the fallback instantiation; comparing this first skips
 * that attempt. 0 when a query fails (then no update is tried). */
uint64_t graph_shape(cudaGraph_t g, size_t nodes)
{
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
        for (int i = 0; i < 8; i++, v >>= 8)
            h = (h ^ (v & 255)) * 1099511628211ull;
    };
    auto node_key = [](cudaGraphNode_t n) -> uint64_t {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(n, &t) != cudaSuccess)
            return 0;
        uint64_t k = (uint64_t)t;
        cudaKernelNodeParams kp;
        if (t == cudaGraphNodeTypeKernel && cudaGraphKernelNodeGetParams(n, &kp) == cudaSuccess)
            k ^= (uint64_t)(uintptr_t)kp.func << 8;
        return k;
    };
    size_t ne = 0;
    cudaGraphNode_t *nd = (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * (nodes ? nodes : 1));
    bool ok = nd && cudaGraphGetNodes(g, nd, &nodes) == cudaSuccess && cudaGraphGetEdges(g, NULL, NULL, NULL, &ne) == cudaSuccess;
    for (size_t i = 0; ok && i < nodes; i++)
        mix(node_key(nd[i]));
    cudaGraphNode_t *from = ok ? (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * (ne ? ne : 1)) : NULL;
    cudaGraphNode_t *to = ok ? (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * (ne ? ne : 1)) : NULL;
    cudaGraphEdgeData *ed = ok ? (cudaGraphEdgeData *)malloc(sizeof(cudaGraphEdgeData) * (ne ? ne : 1)) : NULL;
    ok = ok && from && to && ed && cudaGraphGetEdges(g, from, to, ed, &ne) == cudaSuccess;
    for (size_t i = 0; ok && i < ne; i++) {
        mix(node_key(from[i]));
        mix(node_key(to[i]));
        mix((uint64_t)ed[i].type | (uint64_t)ed[i].from_port << 8 | (uint64_t)ed[i].to_port << 16);
    }
    free(nd);
    free(from);
    free(to);
    free(ed);
    if (!ok) {
        cudaGetLastError();
        return 0;
    }
    return h ? h : 1;
}

sn_status capture_and_run(cuda_be *cb, gslot *gsl)
{
    cudaStream_t s = cb->st;
    cb->h_sp->delta = 0;
    memcpy(cb->h_sp->ids, cb->pend_ids, sizeof(int32_t) * cb->n_ids);
    CU_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "graph capture");
    sn_status st = SN_OK;
    /* the delta and this step's ids only (the whole block is 16 KB of ids; a decode step has one) */
    const size_t sp_bytes = offsetof(step_params, ids) + sizeof(int32_t) * cb->n_ids;
    cudaError_t e = cudaMemcpyAsync(cb->d_sp, cb->h_sp, sp_bytes, cudaMemcpyHostToDevice, s);
    cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
    if (e != cudaSuccess)
        st = cu_err(e, "graph params");
    for (int k = 0; k < cb->n_recs && st == SN_OK;) {
        int used = try_fuse(cb, k, &st);
        if (!used && st == SN_OK)
            used = try_fuse_moe(cb, k, &st); /* [moe] */
        if (!used && st == SN_OK)
            used = try_fuse_attn_prep(cb, k, &st);
        if (!used && st == SN_OK)
            used = try_fuse_attn_gate(cb, k, &st);
        if (used) {
            k += used;
            continue;
        }
        st = dispatch(cb, cb->recs[k], true);
        k++;
    }
    if (st == SN_OK && cb->n_outs) {
        e = cudaMemcpyAsync(cb->h_outs, cb->d_outs, sizeof(int32_t) * cb->n_outs, cudaMemcpyDeviceToHost, s);
        cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
        if (e != cudaSuccess)
            st = cu_err(e, "graph outputs");
    }
    cudaGraph_t g = NULL;
    e = cudaStreamEndCapture(s, &g);
    if (st != SN_OK || e != cudaSuccess) {
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError();
        return st != SN_OK ? st : cu_err(e, "graph capture end");
    }
    bool updated = false;
    gsl->valid = false;
    size_t nodes = 0;
    if (cudaGraphGetNodes(g, NULL, &nodes) != cudaSuccess) {
        cudaGetLastError();
        nodes = 0;
    }
    /* an update can only work on the same topology: a different node count
     * or shape (another fusion, another GEMV form) goes straight to
     * instantiation */
    const uint64_t shape = nodes ? graph_shape(g, nodes) : 0;
    if (gsl->exec && (gsl->nodes != nodes || !shape || gsl->shape != shape)) {
        cudaGraphExecDestroy(gsl->exec);
        gsl->exec = NULL;
    }
    if (gsl->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(gsl->exec, g, &info) == cudaSuccess)
            updated = true;
        else {
            cudaGetLastError();
            cudaGraphExecDestroy(gsl->exec);
            gsl->exec = NULL;
        }
    }
    if (!updated) {
        e = cudaGraphInstantiate(&gsl->exec, g, 0);
        if (e != cudaSuccess) {
            cudaGraphDestroy(g);
            gsl->exec = NULL;
            return cu_err(e, "graph instantiate");
        }
    }
    cudaGraphDestroy(g);
    gsl->nodes = nodes;
    gsl->shape = shape;
    cb->last_nodes = (long)nodes;
    if (gsl->cap < cb->n_recs) {
        rec *nr = (rec *)realloc(gsl->recs, sizeof(rec) * cb->n_recs);
        if (!nr)
            return SN_FAIL(SN_E_NOMEM, "cuda graph record");
        gsl->recs = nr;
        gsl->cap = cb->n_recs;
    }
    memcpy(gsl->recs, cb->recs, sizeof(rec) * cb->n_recs);
    gsl->n = cb->n_recs;
    gsl->valid = true;
    gsl->gen = ++cb->g_gen;
    gsl->used = ++cb->g_clock;
    cb->n_captured++;
    CU_TRY(cudaGraphLaunch(gsl->exec, s), "graph launch");
    return SN_OK;
}

/* ------------------------------------------------------------------------ */
/* Table entries                                                              */
/* ------------------------------------------------------------------------ */

void cuda_destroy(sn_backend *b)
{
    cuda_be *cb = cb_of(b);
    if (!cb)
        return;
    cudaSetDevice(cb->dev);
    cudaStreamSynchronize(cb->st);
    for (cu_weight *w = cb->weights, *n; w; w = n) {
        n = w->next;
        cudaFree(w->q);
        cudaFree(w->sb);
        cudaFree(w->bias);
        cudaFree(w->qr);
        cudaFree(w->sr);
        free(w);
    }
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (cb->gs[i].exec)
            cudaGraphExecDestroy(cb->gs[i].exec);
        free(cb->gs[i].recs);
    }
    cu_blas_close(cb->di.blas);
    for (int k = 0; k < cb->n_evs; k++) {
        cudaEventDestroy(cb->evs[k].a);
        cudaEventDestroy(cb->evs[k].b);
    }
    if (cb->stime.a) {
        cudaEventDestroy(cb->stime.a);
        cudaEventDestroy(cb->stime.b);
    }
    free(cb->evs);
    cudaFree(cb->scratch);
    cudaFree(cb->d_zero);
    cudaFree(cb->d_gdn_cnt);
    cudaFree(cb->d_moe_sync);
    cu_matmul_buffers_free(&cb->di);
    cudaFree(cb->d_ids);
    cudaFree(cb->d_outs);
    cudaFree(cb->d_sp);
    cudaFreeHost(cb->h_outs);
    cudaFreeHost(cb->h_sp);
    cudaFree(cb->smp_d);
    cudaFreeHost(cb->smp_h);
    cudaFree(cb->smp_e);
    if (cb->st)
        cudaStreamDestroy(cb->st);
    free(cb->recs);
    free(cb->park.recs);
    free(cb);
}

sn_status cuda_buf_alloc(sn_backend *b, size_t bytes, void **out)
{
    cuda_be *cb = cb_of(b);
    *out = NULL;
    stg_forget(cb); /* a new buffer may sit where a staged x was */
    cudaSetDevice(cb->dev);
    /* never zero bytes: a distinct pointer keeps "allocated" meaningful */
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *out = NULL;
        return SN_FAIL(SN_E_NOMEM, "cuda buf_alloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return SN_OK;
}

void cuda_buf_free(sn_backend *b, void *p)
{
    cuda_be *cb = cb_of(b);
    if (!p)
        return;
    host_barrier(cb); /* a pending step may still use p */
    stg_forget(cb);
    cb->park.valid = false; /* its record may hold p */
    if (cb->in_step && cb->ahead)
        cb->ahead_bad = true; /* and so may the one being recorded */
    cudaFree(p);
}

sn_status cuda_copy(sn_backend *b, void *dst, const void *src, size_t bytes)
{
    cuda_be *cb = cb_of(b);
    if (!bytes)
        return SN_OK;
    if (!dst || !src)
        return SN_FAIL(SN_E_INVALID, "copy: NULL buffer");
    rec r = rec_new(R_COPY);
    r.p[0] = dst;
    r.p[1] = src;
    r.i[0] = (int64_t)bytes;
    return submit(cb, r, 0);
}

sn_status cuda_copy_n(sn_backend *b, int n, void *const *dst, const void *const *src, const size_t *bytes)
{
    cuda_be *cb = cb_of(b);
    if (n < 0 || (n > 0 && (!dst || !src || !bytes)))
        return SN_FAIL(SN_E_INVALID, "copy_n: %d copies", n);
    bool one_launch = !cb->in_step && !cb->prof;
    for (int i = 0; i < n; i++) {
        if (bytes[i] && (!dst[i] || !src[i]))
            return SN_FAIL(SN_E_INVALID, "copy_n: copy %d has a NULL buffer", i);
        one_launch = one_launch && ((((uintptr_t)dst[i] | (uintptr_t)src[i] | bytes[i]) & 15) == 0);
    }
    if (!one_launch) {
        /* inside a step (recorded), profiled, or not in 16-byte words: one by one */
        for (int i = 0; i < n; i++)
            SN_TRY(cuda_copy(b, dst[i], src[i], bytes[i]));
        return SN_OK;
    }
    cudaSetDevice(cb->dev);
    stg_forget(cb);
    for (int i = 0; i < n; i += CU_COPY_N_MAX)
        SN_TRY(cu_copy_n(cb->st, n - i < CU_COPY_N_MAX ? n - i : CU_COPY_N_MAX, dst + i, src + i, bytes + i));
    return SN_OK;
}

sn_status cuda_to_host(sn_backend *b, void *host_dst, const void *src, size_t bytes)
{
    cuda_be *cb = cb_of(b);
    if (!bytes)
        return SN_OK;
    if (!host_dst || !src)
        return SN_FAIL(SN_E_INVALID, "to_host: NULL buffer");
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    CU_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cb->st), "to_host");
    cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
    CU_TRY(cudaStreamSynchronize(cb->st), "to_host");
    return SN_OK;
}

sn_status cuda_from_host(sn_backend *b, void *dst, const void *host_src, size_t bytes)
{
    cuda_be *cb = cb_of(b);
    if (!bytes)
        return SN_OK;
    if (!dst || !host_src)
        return SN_FAIL(SN_E_INVALID, "from_host: NULL buffer");
    SN_TRY(host_barrier(cb));
    stg_forget(cb);
    cudaSetDevice(cb->dev);
    /* from pageable memory this returns once the bytes are staged, so the
     * caller may reuse host_src at once */
    CU_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cb->st), "from_host");
    cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
    return SN_OK;
}

sn_status cuda_memset0(sn_backend *b, void *dst, size_t bytes)
{
    if (!bytes)
        return SN_OK;
    if (!dst)
        return SN_FAIL(SN_E_INVALID, "memset0: NULL buffer");
    rec r = rec_new(R_MEMSET);
    r.p[0] = dst;
    r.i[0] = (int64_t)bytes;
    return submit(cb_of(b), r, 0);
}

sn_status cuda_sync(sn_backend *b)
{
    cuda_be *cb = cb_of(b);
    SN_TRY(host_barrier(cb));
    CU_TRY(cudaStreamSynchronize(cb->st), "sync");
    return SN_OK;
}

/* ---- weights ---- */

__global__ void k_interleave(const void *sc, const void *bi, int ssize, size_t n, void *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (ssize == 2) {
            uint32_t v = (uint32_t)((const uint16_t *)sc)[i] | ((uint32_t)((const uint16_t *)bi)[i] << 16);
            ((uint32_t *)out)[i] = v;
        } else {
            ((float2 *)out)[i] = make_float2(((const float *)sc)[i], ((const float *)bi)[i]);
        }
    }
}

sn_status weight_check(const sn_weight *w, const char *op)
{
    if (!w)
        return SN_FAIL(SN_E_INVALID, "%s: NULL weight", op);
    if (w->rows <= 0 || w->cols <= 0 || w->n_experts < 0 || w->rows > INT32_MAX || w->cols > INT32_MAX)
        return SN_FAIL(SN_E_SHAPE, "%s: weight shape [%lld, %lld] x %lld experts", op, (long long)w->rows,
                       (long long)w->cols, (long long)w->n_experts);
    if (!w->data)
        return SN_FAIL(SN_E_INVALID, "%s: weight has no data", op);
    switch (w->dtype) {
    case SN_DT_F32: case SN_DT_F16: case SN_DT_BF16: return SN_OK;
    case SN_DT_Q4: case SN_DT_Q8: break;
    default: return SN_FAIL(SN_E_UNSUPPORTED, "%s: weight dtype %s", op, sn_dtype_name(w->dtype));
    }
    /* A 16-byte step of packed words must stay inside one group: groups of
     * 32, 64, 128 (MLX's choices). */
    if (w->group <= 0 || w->group % 32 != 0 || w->cols % w->group != 0)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: quant group %d with %lld columns (need a multiple of 32 dividing cols)",
                       op, w->group, (long long)w->cols);
    if (!w->scales || !w->qbiases)
        return SN_FAIL(SN_E_MISSING, "%s: quantized weight without scales/biases", op);
    if (w->sdtype != SN_DT_BF16 && w->sdtype != SN_DT_F16 && w->sdtype != SN_DT_F32)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: scale dtype %s", op, sn_dtype_name(w->sdtype));
    return SN_OK;
}

sn_status upload_fail(cu_weight *cw, sn_status st)
{
    if (cw) {
        cudaFree(cw->q);
        cudaFree(cw->sb);
        cudaFree(cw->bias);
        cudaFree(cw->qr);
        cudaFree(cw->sr);
        free(cw);
    }
    return st;
}

sn_status cuda_upload_weight(sn_backend *b, sn_weight *w)
{
    cuda_be *cb = cb_of(b);
    SN_TRY(weight_check(w, "upload_weight"));
    if (w->dev)
        return SN_OK; /* uploaded already */
    SN_TRY(host_barrier(cb));
    cudaSetDevice(cb->dev);
    cu_weight *cw = (cu_weight *)calloc(1, sizeof *cw);
    if (!cw)
        return SN_FAIL(SN_E_NOMEM, "upload_weight");
    int64_t E = w->n_experts > 0 ? w->n_experts : 1;
    cw->rows = w->rows;
    cw->cols = w->cols;
    cw->n_experts = E;
    cudaError_t e;
    if (w->dtype == SN_DT_Q4 || w->dtype == SN_DT_Q8) {
        cw->fmt = w->dtype == SN_DT_Q4 ? CW_Q4 : CW_Q8;
        cw->bits = w->dtype == SN_DT_Q4 ? 4 : 8;
        cw->group = w->group;
        cw->words = w->cols * cw->bits / 32;
        cw->groups = w->cols / w->group;
        cw->sfmt = w->sdtype == SN_DT_BF16 ? CS_BF16 : w->sdtype == SN_DT_F16 ? CS_F16 : CS_F32;
        size_t qbytes = (size_t)E * w->rows * cw->words * 4;
        size_t ng = (size_t)E * w->rows * cw->groups;
        int ssize = cw->sfmt == CS_F32 ? 4 : 2;
        if ((e = cudaMalloc(&cw->q, qbytes)) != cudaSuccess ||
            (e = cudaMalloc(&cw->sb, ng * 2 * ssize)) != cudaSuccess)
            return upload_fail(cw, SN_FAIL(SN_E_NOMEM, "upload_weight: %zu bytes: %s", qbytes, cudaGetErrorString(e)));
        /* every copy on cb->st, the stream of the kernels that read them
         * (k_interleave, cu_repack_q4): a cudaMemcpy from pageable memory
         * may return before its DMA lands, and cb->st (non-blocking) does
         * not wait for the legacy stream */
        if ((e = cudaMemcpyAsync(cw->q, w->data, qbytes, cudaMemcpyDefault, cb->st)) != cudaSuccess)
            return upload_fail(cw, cu_err(e, "upload_weight data"));
        void *ts = NULL, *tb = NULL;
        if ((e = cudaMalloc(&ts, ng * ssize)) != cudaSuccess || (e = cudaMalloc(&tb, ng * ssize)) != cudaSuccess) {
            cudaFree(ts);
            return upload_fail(cw, SN_FAIL(SN_E_NOMEM, "upload_weight scales: %s", cudaGetErrorString(e)));
        }
        if ((e = cudaMemcpyAsync(ts, w->scales, ng * ssize, cudaMemcpyDefault, cb->st)) == cudaSuccess &&
            (e = cudaMemcpyAsync(tb, w->qbiases, ng * ssize, cudaMemcpyDefault, cb->st)) == cudaSuccess) {
            k_interleave<<<1024, 256, 0, cb->st>>>(ts, tb, ssize, ng, cw->sb);
            e = cudaGetLastError();
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(cb->st);
        }
        cudaFree(ts);
        cudaFree(tb);
        if (e != cudaSuccess)
            return upload_fail(cw, cu_err(e, "upload_weight scales"));
        cw->bytes = qbytes + ng * 2 * ssize;
        /* SANCTUM_CUDA_GEMV=fp32: no repacked copy, decode on the fp32 GEMV;
         * SANCTUM_CUDA_MOE_REPACK=0: none for expert stacks (their MoE
         * prefill then runs on the split fp16 GEMMs, and the stacks take
         * half the device memory) */
        const char *gv = getenv("SANCTUM_CUDA_GEMV"), *mr = getenv("SANCTUM_CUDA_MOE_REPACK");
        const bool skip_stack = E > 1 && mr && !strcmp(mr, "0");
        if (!(gv && !strcmp(gv, "fp32")) && !skip_stack) {
            sn_status rs = cu_repack_q4(cb->st, cw, &cw->bytes);
            /* the stream-K GEMV's buffers, with the first weight it can take */
            if (rs == SN_OK && cw->qr && !cb->di.gk_part)
                rs = cu_matmul_buffers(&cb->di);
            if (rs != SN_OK)
                return upload_fail(cw, rs);
        }
    } else {
        cw->fmt = w->dtype == SN_DT_F32 ? CW_F32 : w->dtype == SN_DT_F16 ? CW_F16 : CW_BF16;
        size_t bytes = (size_t)E * w->rows * w->cols * sn_dtype_size(w->dtype);
        if ((e = cudaMalloc(&cw->q, bytes)) != cudaSuccess)
            return upload_fail(cw, SN_FAIL(SN_E_NOMEM, "upload_weight: %zu bytes: %s", bytes, cudaGetErrorString(e)));
        if ((e = cudaMemcpyAsync(cw->q, w->data, bytes, cudaMemcpyDefault, cb->st)) != cudaSuccess)
            return upload_fail(cw, cu_err(e, "upload_weight data"));
        cw->bytes = bytes;
    }
    if (w->bias) {
        /* the bias may live in host or device memory: cudaMemcpyDefault reads either */
        if ((e = cudaMalloc(&cw->bias, sizeof(float) * w->rows)) != cudaSuccess)
            return upload_fail(cw, SN_FAIL(SN_E_NOMEM, "upload_weight bias: %s", cudaGetErrorString(e)));
        if ((e = cudaMemcpyAsync(cw->bias, w->bias, sizeof(float) * w->rows, cudaMemcpyDefault, cb->st)) !=
            cudaSuccess)
            return upload_fail(cw, cu_err(e, "upload_weight bias"));
        cw->bytes += sizeof(float) * w->rows;
    }
    /* the copies and the repacking done before the weight is handed out */
    if ((e = cudaStreamSynchronize(cb->st)) != cudaSuccess)
        return upload_fail(cw, cu_err(e, "upload_weight"));
    cw->next = cb->weights;
    cb->weights = cw;
    cb->held += cw->bytes;
    w->dev = cw;
    return SN_OK;
}

sn_status weight_ready(const sn_weight *w, const char *op)
{
    SN_TRY(weight_check(w, op));
    if (!w->dev)
        return SN_FAIL(SN_E_INVALID, "%s: weight [%lld, %lld] was not uploaded (upload_weight)", op,
                       (long long)w->rows, (long long)w->cols);
    return SN_OK;
}

/* ---- compute ops ---- */

sn_status cuda_matmul(sn_backend *b, const sn_weight *w, int expert, const float *x, int T, float *y)
{
    SN_TRY(weight_ready(w, "matmul"));
    int64_t E = w->n_experts > 0 ? w->n_experts : 1;
    if (expert < 0 || expert >= E)
        return SN_FAIL(SN_E_RANGE, "matmul: expert %d of %lld", expert, (long long)E);
    if (T < 0)
        return SN_FAIL(SN_E_INVALID, "matmul: T=%d", T);
    if (T == 0)
        return SN_OK;
    if (!x || !y)
        return SN_FAIL(SN_E_INVALID, "matmul: NULL activation");
    rec r = rec_new(R_MATMUL);
    r.p[0] = w;
    r.p[1] = x;
    r.p[2] = y;
    r.i[0] = expert;
    r.i[1] = T;
    return submit(cb_of(b), r, cu_matmul_scratch_bytes(&cb_of(b)->di, (const cu_weight *)w->dev, T));
}

sn_status cuda_embed(sn_backend *b, const sn_weight *w, const int32_t *ids, int T, float *y)
{
    cuda_be *cb = cb_of(b);
    SN_TRY(weight_ready(w, "embed"));
    if (w->n_experts > 0)
        return SN_FAIL(SN_E_SHAPE, "embed: stacked weight");
    if (T < 0)
        return SN_FAIL(SN_E_INVALID, "embed: T=%d", T);
    if (T == 0)
        return SN_OK;
    if (!ids || !y)
        return SN_FAIL(SN_E_INVALID, "embed: NULL buffer");
    if (T > 65535)
        return SN_FAIL(SN_E_UNSUPPORTED, "embed: %d tokens in one call (max 65535)", T);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= w->rows)
            return SN_FAIL(SN_E_RANGE, "embed: token id %d at %d outside [0, %lld)", ids[t], t, (long long)w->rows);
    rec r = rec_new(R_EMBED);
    r.p[0] = w;
    r.p[1] = y;
    r.i[0] = T;
    if (cb->in_step && !cb->broken) {
        if (cb->n_ids + T > STEP_MAX_IDS)
            SN_TRY(flush_step(cb));
        else {
            r.i[1] = cb->n_ids;
            memcpy(cb->pend_ids + cb->n_ids, ids, sizeof(int32_t) * T);
            cb->n_ids += T;
            return submit(cb, r, 0);
        }
    }
    /* eager: the ids are copied to the device by dispatch, from the caller's array */
    if ((size_t)T > cb->ids_cap) {
        CU_TRY(cudaStreamSynchronize(cb->st), "embed ids");
        cudaFree(cb->d_ids);
        cb->d_ids = NULL;
        cb->ids_cap = 0;
        CU_TRY(cudaMalloc(&cb->d_ids, sizeof(int32_t) * T), "embed ids");
        cb->ids_cap = (size_t)T;
    }
    r.p[2] = ids;
    return submit(cb, r, 0);
}

sn_status cuda_rmsnorm(sn_backend *b, const float *x, const float *w, int rows, int n, float eps, float *y)
{
    if (rows < 0 || n <= 0)
        return SN_FAIL(SN_E_INVALID, "rmsnorm: rows=%d n=%d", rows, n);
    if (rows == 0)
        return SN_OK;
    if (!x || !w || !y)
        return SN_FAIL(SN_E_INVALID, "rmsnorm: NULL buffer");
    rec r = rec_new(R_RMSNORM);
    r.p[0] = x; r.p[1] = w; r.p[2] = y;
    r.i[0] = rows; r.i[1] = n;
    r.f[0] = eps;
    return submit(cb_of(b), r, 0);
}

sn_status cuda_gated_rmsnorm(sn_backend *b, const float *o, const float *z, const float *w, int rows, int n,
                             float eps, float *y)
{
    if (rows < 0 || n <= 0)
        return SN_FAIL(SN_E_INVALID, "gated_rmsnorm: rows=%d n=%d", rows, n);
    if (rows == 0)
        return SN_OK;
    if (!o || !z || !w || !y)
        return SN_FAIL(SN_E_INVALID, "gated_rmsnorm: NULL buffer");
    rec r = rec_new(R_GRMSNORM);
    r.p[0] = o; r.p[1] = z; r.p[2] = w; r.p[3] = y;
    r.i[0] = rows; r.i[1] = n;
    r.f[0] = eps;
    return submit(cb_of(b), r, 0);
}

sn_status ew(sn_backend *b, int kind, const char *op, const void *p0, const void *p1, const void *p2, size_t n)
{
    if (!n)
        return SN_OK;
    if (!p0 || !p1 || (kind == R_SWIGLU && !p2))
        return SN_FAIL(SN_E_INVALID, "%s: NULL buffer", op);
    rec r = rec_new(kind);
    r.p[0] = p0; r.p[1] = p1; r.p[2] = p2;
    r.i[0] = (int64_t)n;
    return submit(cb_of(b), r, 0);
}

sn_status cuda_add(sn_backend *b, float *y, const float *x, size_t n) { return ew(b, R_ADD, "add", y, x, NULL, n); }
sn_status cuda_swiglu(sn_backend *b, const float *g, const float *u, size_t n, float *out)
{
    return ew(b, R_SWIGLU, "swiglu", g, u, out, n);
}
sn_status cuda_mul_sigmoid(sn_backend *b, float *y, const float *g, size_t n)
{
    return ew(b, R_MULSIG, "mul_sigmoid", y, g, NULL, n);
}

sn_status cuda_add_gated(sn_backend *b, float *y, const float *x, const float *g, int T, int n)
{
    if (T < 0 || n < 0)
        return SN_FAIL(SN_E_INVALID, "add_gated: T=%d n=%d", T, n);
    if (T == 0 || n == 0)
        return SN_OK;
    if (!y || !x || !g)
        return SN_FAIL(SN_E_INVALID, "add_gated: NULL buffer");
    rec r = rec_new(R_ADDGATED);
    r.p[0] = y; r.p[1] = x; r.p[2] = g;
    r.i[0] = T; r.i[1] = n;
    return submit(cb_of(b), r, 0);
}

sn_status cuda_rope(sn_backend *b, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                    const float *inv_freq, float mscale)
{
    if (T < 0 || n_heads <= 0 || head_dim <= 0 || rot_dim < 0 || rot_dim > head_dim || rot_dim % 2 || pos0 < 0)
        return SN_FAIL(SN_E_INVALID, "rope: T=%d heads=%d head_dim=%d rot_dim=%d pos0=%d", T, n_heads, head_dim,
                       rot_dim, pos0);
    if (T == 0 || rot_dim == 0)
        return SN_OK;
    if (!x || !inv_freq)
        return SN_FAIL(SN_E_INVALID, "rope: NULL buffer");
    rec r = rec_new(R_ROPE);
    r.has_pos = 1;
    r.pos0 = pos0;
    r.p[0] = x; r.p[1] = inv_freq;
    r.i[0] = T; r.i[1] = n_heads; r.i[2] = head_dim; r.i[3] = rot_dim;
    r.f[0] = mscale;
    return submit(cb_of(b), r, 0);
}

sn_status kv_check(const char *op, const sn_kv_view *kv, int T, int pos0)
{
    if (!kv || !kv->k || !kv->v || kv->max_ctx <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0)
        return SN_FAIL(SN_E_INVALID, "%s: bad kv cache view", op);
    if (T < 0 || pos0 < 0 || (int64_t)pos0 + T > kv->max_ctx)
        return SN_FAIL(SN_E_RANGE, "%s: positions [%d, %lld) outside the cache of %d", op, pos0,
                       (long long)pos0 + T, kv->max_ctx);
    return SN_OK;
}

void rec_kv(rec &r, const sn_kv_view *kv)
{
    r.p[0] = kv->k; r.p[1] = kv->v;
    r.i[0] = kv->max_ctx; r.i[1] = kv->n_kv_heads; r.i[2] = kv->head_dim;
}

sn_status cuda_kv_write(sn_backend *b, const sn_kv_view *kv, const float *k, const float *v, int T, int pos0)
{
    SN_TRY(kv_check("kv_write", kv, T, pos0));
    if (T == 0)
        return SN_OK;
    if (!k || !v)
        return SN_FAIL(SN_E_INVALID, "kv_write: NULL buffer");
    rec r = rec_new(R_KVWRITE);
    r.has_pos = 1;
    r.pos0 = pos0;
    rec_kv(r, kv);
    r.p[2] = k; r.p[3] = v;
    r.i[3] = T;
    return submit(cb_of(b), r, 0);
}

sn_status cuda_attention(sn_backend *b, const float *q, const sn_kv_view *kv, int T, int pos0, int n_q_heads,
                         float scale, float *out)
{
    SN_TRY(kv_check("attention", kv, T, pos0));
    if (n_q_heads <= 0 || n_q_heads % kv->n_kv_heads != 0)
        return SN_FAIL(SN_E_SHAPE, "attention: %d query heads not a multiple of %d kv heads", n_q_heads,
                       kv->n_kv_heads);
    if (kv->head_dim > 256)
        return SN_FAIL(SN_E_UNSUPPORTED, "attention: head_dim %d > 256", kv->head_dim);
    if (T == 0)
        return SN_OK;
    if (!q || !out)
        return SN_FAIL(SN_E_INVALID, "attention: NULL buffer");
    rec r = rec_new(R_ATTN);
    r.has_pos = 1;
    r.pos0 = pos0;
    rec_kv(r, kv);
    r.p[2] = q; r.p[3] = out;
    r.i[3] = T; r.i[4] = n_q_heads;
    r.f[0] = scale;
    return submit(cb_of(b), r, cu_attention_scratch_bytes(kv, T, n_q_heads));
}

sn_status cuda_gdn(sn_backend *b, const sn_gdn_dims *d, const float *qkv, const float *a, const float *bb,
                   const float *conv_w, const float *A_log, const float *dt_bias, sn_gdn_view *st, int T, float *out)
{
    if (!d || d->n_k_heads <= 0 || d->n_v_heads <= 0 || d->dk <= 0 || d->dv <= 0 || d->conv_k <= 0)
        return SN_FAIL(SN_E_INVALID, "gdn: bad dims");
    if (d->n_v_heads % d->n_k_heads != 0)
        return SN_FAIL(SN_E_SHAPE, "gdn: %d value heads not a multiple of %d key heads", d->n_v_heads,
                       d->n_k_heads);
    if (d->dk > 256 || d->dv > 512)
        return SN_FAIL(SN_E_UNSUPPORTED, "gdn: dk=%d (max 256) dv=%d (max 512)", d->dk, d->dv);
    if (T < 0)
        return SN_FAIL(SN_E_INVALID, "gdn: T=%d", T);
    if (!st || !st->S || (d->conv_k > 1 && !st->conv))
        return SN_FAIL(SN_E_INVALID, "gdn: missing state");
    if (T == 0)
        return SN_OK;
    if (!qkv || !a || !bb || !conv_w || !A_log || !dt_bias || !out)
        return SN_FAIL(SN_E_INVALID, "gdn: NULL buffer");
    if (T > 65535)
        return SN_FAIL(SN_E_UNSUPPORTED, "gdn: %d tokens in one call (max 65535)", T);
    if (st->hist && st->n_hist < 0)
        return SN_FAIL(SN_E_INVALID, "gdn: history of %d slots", st->n_hist);
    int nh = st->hist ? (st->n_hist < T - 1 ? st->n_hist : T - 1) : 0;
    rec r = rec_new(R_GDN);
    r.p[0] = qkv; r.p[1] = a; r.p[2] = bb; r.p[3] = conv_w; r.p[4] = A_log; r.p[5] = dt_bias;
    r.p[6] = st->conv; r.p[7] = st->S; r.p[8] = out; r.p[9] = nh ? st->hist : NULL;
    r.i[0] = d->n_k_heads; r.i[1] = d->n_v_heads; r.i[2] = d->dk; r.i[3] = d->dv; r.i[4] = d->conv_k;
    r.i[5] = T; r.i[6] = nh;
    r.f[0] = d->norm_eps;
    return submit(cb_of(b), r, cu_gdn_scratch_bytes(d, T));
}

} // namespace

/* ------------------------------------------------------------------------ */
/* Exported                                                                   */
/* ------------------------------------------------------------------------ */

extern "C" sn_status sn_cuda_argmax(sn_backend *b, const float *x, int rows, int n, int32_t *out_host)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (rows < 0 || n <= 0)
        return SN_FAIL(SN_E_INVALID, "argmax: rows=%d n=%d", rows, n);
    if (rows == 0)
        return SN_OK;
    if (!x || !out_host)
        return SN_FAIL(SN_E_INVALID, "argmax: NULL buffer");
    if (rows > STEP_MAX_OUTS)
        return SN_FAIL(SN_E_UNSUPPORTED, "argmax: %d rows (max %d per call)", rows, STEP_MAX_OUTS);
    rec r = rec_new(R_ARGMAX);
    r.p[0] = x;
    r.i[0] = rows;
    r.i[1] = n;
    if (cb->in_step && !cb->broken && cb->n_outs + rows > STEP_MAX_OUTS)
        SN_TRY(flush_step(cb));
    if (cb->in_step && !cb->broken) {
        r.i[2] = cb->n_outs;
        for (int k = 0; k < rows; k++)
            cb->out_ptrs[cb->n_outs + k] = out_host + k;
        cb->n_outs += rows;
        return submit(cb, r, cu_argmax_scratch_bytes(rows));
    }
    r.i[2] = 0;
    SN_TRY(finish_launched(cb)); /* its rows are still to come out of h_outs */
    SN_TRY(ensure_scratch(cb, cu_argmax_scratch_bytes(rows)));
    SN_TRY(run_eager(cb, r));
    CU_TRY(cudaMemcpyAsync(cb->h_outs, cb->d_outs, sizeof(int32_t) * rows, cudaMemcpyDeviceToHost, cb->st),
           "argmax result");
    cu_pdl_skip = 1; /* the next kernel follows a copy: no PDL edge */
    CU_TRY(cudaStreamSynchronize(cb->st), "argmax result");
    memcpy(out_host, cb->h_outs, sizeof(int32_t) * rows);
    return SN_OK;
}

/* moe (sh NULL) or moe_shared: the checks, then the record. With sh, a
 * shared expert the launches cannot take gives SN_E_UNSUPPORTED and no
 * record (the caller runs the shared expert's ops itself). */
static sn_status moe_submit(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                            const float *logits, int top_k, int norm_topk, const sn_moe_shared *sh, const float *x,
                            int T, float *out)
{
    SN_ASSERT(sn_cuda_is(b));
    SN_TRY(weight_ready(gate, "moe gate"));
    SN_TRY(weight_ready(up, "moe up"));
    SN_TRY(weight_ready(down, "moe down"));
    if (gate->n_experts <= 0 || up->n_experts != gate->n_experts || down->n_experts != gate->n_experts)
        return SN_FAIL(SN_E_SHAPE, "moe: expert stacks of %lld/%lld/%lld", (long long)gate->n_experts,
                       (long long)up->n_experts, (long long)down->n_experts);
    if (up->rows != gate->rows || up->cols != gate->cols || down->cols != gate->rows || down->rows != gate->cols)
        return SN_FAIL(SN_E_SHAPE, "moe: gate [%lld,%lld] up [%lld,%lld] down [%lld,%lld] do not chain",
                       (long long)gate->rows, (long long)gate->cols, (long long)up->rows, (long long)up->cols,
                       (long long)down->rows, (long long)down->cols);
    const cu_weight *g = (const cu_weight *)gate->dev, *u = (const cu_weight *)up->dev,
                    *dn = (const cu_weight *)down->dev;
    if ((g->fmt != CW_Q4 && g->fmt != CW_Q8) || u->fmt != g->fmt || u->group != g->group || u->sfmt != g->sfmt ||
        (dn->fmt != CW_Q4 && dn->fmt != CW_Q8))
        return SN_FAIL(SN_E_UNSUPPORTED, "moe: experts must be quantized (gate and up alike)");
    if (top_k <= 0 || top_k > gate->n_experts || top_k > 64)
        return SN_FAIL(SN_E_INVALID, "moe: top_k %d of %lld experts (max 64)", top_k, (long long)gate->n_experts);
    if (T < 0)
        return SN_FAIL(SN_E_INVALID, "moe: T=%d", T);
    if (T == 0)
        return SN_OK;
    if (!logits || !x || !out)
        return SN_FAIL(SN_E_INVALID, "moe: NULL buffer");
    if (T > 65535)
        return SN_FAIL(SN_E_UNSUPPORTED, "moe: %d tokens in one call (max 65535)", T);
    rec r = rec_new(R_MOE);
    r.p[0] = gate; r.p[1] = up; r.p[2] = down; r.p[3] = logits; r.p[4] = x; r.p[5] = out;
    r.i[0] = top_k; r.i[1] = norm_topk ? 1 : 0; r.i[2] = T;
    if (sh) {
        if (!sh->gate || !sh->up || !sh->down || !sh->gate_logit)
            return SN_FAIL(SN_E_INVALID, "moe_shared: NULL shared expert weight or gate logits");
        SN_TRY(weight_ready(sh->gate, "moe shared gate"));
        SN_TRY(weight_ready(sh->up, "moe shared up"));
        SN_TRY(weight_ready(sh->down, "moe shared down"));
        const cu_moe_sh cs = { (const cu_weight *)sh->gate->dev, (const cu_weight *)sh->up->dev,
                               (const cu_weight *)sh->down->dev, sh->gate_logit };
        if (!cu_moe_sh_ok(&cb_of(b)->di, g, u, dn, &cs, T, top_k))
            return SN_E_UNSUPPORTED; /* not an error: the caller's fallback (see backend.h) */
        r.p[6] = sh->gate; r.p[7] = sh->up; r.p[8] = sh->down; r.p[9] = sh->gate_logit;
    }
    return submit(cb_of(b), r, cu_moe_scratch_bytes(&cb_of(b)->di, g, u, dn, T, top_k + (sh ? 1 : 0)));
}

extern "C" sn_status sn_cuda_moe(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                                 const float *logits, int top_k, int norm_topk, const float *x, int T, float *out)
{
    return moe_submit(b, gate, up, down, logits, top_k, norm_topk, NULL, x, T, out);
}

extern "C" int sn_cuda_gemm_i8_of(const char *env)
{
    if (!env || !strcmp(env, "hilo"))
        return 4;
    if (!strcmp(env, "i8"))
        return 3;
    if (!strcmp(env, "i8fast"))
        return 2;
    return !strcmp(env, "split") || !strcmp(env, "fast") ? 0 : -1;
}

extern "C" sn_status sn_cuda_step_timing(sn_backend *b, int on)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (on && !cb->stime.a) {
        CU_TRY(cudaEventCreate(&cb->stime.a), "step timing event");
        CU_TRY(cudaEventCreate(&cb->stime.b), "step timing event");
    }
    cb->stime.on = on != 0;
    if (on) {
        cb->stime.n = 0;
        cb->stime.match_s = cb->stime.launch_s = cb->stime.end_s = cb->stime.gpu_ms = 0;
    }
    return SN_OK;
}

extern "C" void sn_cuda_step_times(sn_backend *b, sn_cuda_step_time *out)
{
    SN_ASSERT(sn_cuda_is(b));
    const cuda_be *cb = cb_of(b);
    const double n = cb->stime.n ? (double)cb->stime.n : 1.0;
    out->steps = cb->stime.n;
    out->match_us = cb->stime.match_s / n * 1e6;
    out->launch_us = cb->stime.launch_s / n * 1e6;
    out->end_us = cb->stime.end_s / n * 1e6;
    out->gpu_us = cb->stime.gpu_ms / n * 1e3;
}

namespace {

sn_status open_step(cuda_be *cb, bool ahead)
{
    if (cb->in_step)
        return SN_FAIL(SN_E_INVALID, "begin_step: a step is already open");
    cudaSetDevice(cb->dev);
    stg_forget(cb); /* a step's kernels use scratch too */
    cb->in_step = true;
    cb->ahead = ahead;
    cb->ahead_bad = false;
    cb->broken = !ahead && cb->prof; /* profiling times ops one by one: no graph */
    if (cb->broken)
        cb->n_eager++;
    cb->n_recs = 0;
    cb->n_ids = 0;
    cb->n_outs = 0;
    return SN_OK;
}

void close_step(cuda_be *cb)
{
    cb->in_step = false;
    cb->broken = false;
    cb->ahead = false;
    cb->n_recs = 0;
    cb->n_ids = 0;
    cb->n_outs = 0;
}

/* The open step queued: its graph replayed (or captured and run, or, when
 * that fails, the step run eagerly); its argmax rows become the launched
 * step's, delivered by finish_launched. */
sn_status launch_step(cuda_be *cb)
{
    stg_forget(cb);
    const int hs = cb->hint_slot; /* whatever happens below, a hint is used once */
    cb->hint_slot = -1;
    /* the step before must have delivered its rows: this one's copy lands in h_outs too */
    sn_status st = finish_launched(cb);
    const double t_end = cb->stime.on ? sn_now_s() : 0;
    const long n_rep = cb->n_replayed;
    if (st == SN_OK && !cb->broken) {
        int delta;
        /* the previous replay may still be reading h_sp */
        cudaError_t e = cudaStreamSynchronize(cb->st);
        if (e != cudaSuccess)
            st = cu_err(e, "end_step");
        else {
            gslot *hit = NULL;
            if (hs >= 0 && cb->gs[hs].valid && cb->gs[hs].gen == cb->hint_gen) {
                hit = &cb->gs[hs]; /* matched when the record was parked, not recaptured since */
                delta = cb->hint_delta;
            }
            for (int i = 0; i < GRAPH_SLOTS && !hit; i++)
                if (records_match(cb, &cb->gs[i], &delta))
                    hit = &cb->gs[i];
            const double t_match = cb->stime.on ? sn_now_s() : 0;
            if (hit) {
                cb->h_sp->delta = delta;
                memcpy(cb->h_sp->ids, cb->pend_ids, sizeof(int32_t) * cb->n_ids);
                if (cb->stime.on)
                    cudaEventRecord(cb->stime.a, cb->st);
                e = cudaGraphLaunch(hit->exec, cb->st);
                if (cb->stime.on) {
                    cudaEventRecord(cb->stime.b, cb->st);
                    cb->stime.launch_s += sn_now_s() - t_match;
                    cb->stime.match_s += t_match - t_end;
                }
                if (e != cudaSuccess)
                    st = cu_err(e, "graph replay");
                hit->used = ++cb->g_clock;
                cb->n_replayed++;
            } else {
                /* a new shape: an empty slot, else the least recently used */
                gslot *v = &cb->gs[0];
                for (int i = 0; i < GRAPH_SLOTS; i++) {
                    gslot *c = &cb->gs[i];
                    if (!c->valid) {
                        v = c;
                        break;
                    }
                    if (c->used < v->used)
                        v = c;
                }
                st = capture_and_run(cb, v);
                if (st != SN_OK) {
                    /* capture failed: run the step eagerly so it still happens */
                    v->valid = false;
                    sn_status st2 = flush_step(cb);
                    if (st2 == SN_OK)
                        st = SN_OK;
                }
            }
        }
        if (st == SN_OK && !cb->broken) {
            memcpy(cb->l_out_ptrs, cb->out_ptrs, sizeof(int32_t *) * cb->n_outs);
            cb->l_n_outs = cb->n_outs;
            cb->l_rep = n_rep;
            cb->l_t_end = t_end;
            cb->launched = true;
        }
    }
    close_step(cb);
    return st;
}

/* The step's record and the parked one change places (buffers, not
 * copies): parking hands the record over and takes the old parked buffer
 * to record into next; launching from the park takes it back. */
void swap_park_recs(cuda_be *cb)
{
    rec *r = cb->park.recs;
    int cap = cb->park.cap, n = cb->park.n_recs;
    cb->park.recs = cb->recs;
    cb->park.cap = cb->cap_recs;
    cb->park.n_recs = cb->n_recs;
    cb->recs = r;
    cb->cap_recs = cap;
    cb->n_recs = n;
}

} // namespace

extern "C" sn_status sn_cuda_begin_step(sn_backend *b)
{
    SN_ASSERT(sn_cuda_is(b));
    return open_step(cb_of(b), false);
}

extern "C" sn_status sn_cuda_step_launch(sn_backend *b)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (!cb->in_step)
        return SN_FAIL(SN_E_INVALID, "end_step: no step is open");
    if (cb->ahead) {
        close_step(cb);
        return SN_FAIL(SN_E_INVALID, "end_step: the step open was begun ahead: park it, do not run it");
    }
    return launch_step(cb);
}

extern "C" sn_status sn_cuda_step_wait(sn_backend *b)
{
    SN_ASSERT(sn_cuda_is(b));
    return finish_launched(cb_of(b));
}

extern "C" sn_status sn_cuda_end_step(sn_backend *b)
{
    sn_status st = sn_cuda_step_launch(b);
    sn_status st2 = sn_cuda_step_wait(b);
    return st != SN_OK ? st : st2;
}

extern "C" sn_status sn_cuda_begin_ahead(sn_backend *b)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (cb->prof)
        return SN_FAIL(SN_E_UNSUPPORTED, "begin_ahead: profiling runs every op as it is called");
    return open_step(cb, true);
}

extern "C" sn_status sn_cuda_step_park(sn_backend *b, const void *owner)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (!cb->in_step || !cb->ahead)
        return SN_FAIL(SN_E_INVALID, "step_park: no step begun ahead is open");
    cb->park.valid = false;
    if (cb->ahead_bad) {
        close_step(cb);
        return SN_FAIL(SN_E_INVALID, "step_park: the step recorded ahead asked for the host; nothing parked");
    }
    /* the graph match too, while the GPU still runs the step before */
    cb->park.slot = -1;
    for (int i = 0; i < GRAPH_SLOTS && cb->park.slot < 0; i++)
        if (records_match(cb, &cb->gs[i], &cb->park.delta)) {
            cb->park.slot = i;
            cb->park.gen = cb->gs[i].gen;
        }
    swap_park_recs(cb);
    memcpy(cb->park.ids, cb->pend_ids, sizeof(int32_t) * cb->n_ids);
    cb->park.n_ids = cb->n_ids;
    memcpy(cb->park.out_ptrs, cb->out_ptrs, sizeof(int32_t *) * cb->n_outs);
    cb->park.n_outs = cb->n_outs;
    cb->park.owner = owner;
    cb->park.valid = true;
    cb->n_parked++;
    close_step(cb);
    return SN_OK;
}

extern "C" sn_status sn_cuda_step_launch_parked(sn_backend *b, const void *owner, const int32_t *ids, int n)
{
    SN_ASSERT(sn_cuda_is(b));
    cuda_be *cb = cb_of(b);
    if (cb->in_step)
        return SN_FAIL(SN_E_INVALID, "step_launch_parked: a step is open");
    if (!cb->park.valid || cb->park.owner != owner)
        return SN_FAIL(SN_E_MISSING, "step_launch_parked: no step is parked for this caller");
    if (n < 0 || n > cb->park.n_ids || (n && !ids)) {
        cb->park.valid = false;
        return SN_FAIL(SN_E_INVALID, "step_launch_parked: %d ids for a step of %d", n, cb->park.n_ids);
    }
    SN_TRY(open_step(cb, false));
    const bool eager = cb->broken; /* profiling turned on since the park: run the record op by op */
    cb->broken = false;
    swap_park_recs(cb);
    cb->park.valid = false;
    memcpy(cb->pend_ids, cb->park.ids, sizeof(int32_t) * cb->park.n_ids);
    memcpy(cb->pend_ids, ids, sizeof(int32_t) * n);
    cb->n_ids = cb->park.n_ids;
    memcpy(cb->out_ptrs, cb->park.out_ptrs, sizeof(int32_t *) * cb->park.n_outs);
    cb->n_outs = cb->park.n_outs;
    cb->hint_slot = cb->park.slot;
    cb->hint_gen = cb->park.gen;
    cb->hint_delta = cb->park.delta;
    cb->n_parked_launched++;
    if (eager) {
        cb->n_eager--; /* flush_step counts it */
        sn_status st = flush_step(cb);
        if (st != SN_OK) {
            close_step(cb);
            return st;
        }
    }
    return launch_step(cb);
}

extern "C" void sn_cuda_step_drop(sn_backend *b)
{
    SN_ASSERT(sn_cuda_is(b));
    cb_of(b)->park.valid = false;
}

namespace {

sn_status tbl_moe(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                  const float *logits, int top_k, bool norm_topk, const float *x, int T, float *out)
{
    return sn_cuda_moe(b, gate, up, down, logits, top_k, norm_topk ? 1 : 0, x, T, out);
}

sn_status tbl_moe_shared(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                         const float *logits, int top_k, bool norm_topk, const sn_moe_shared *sh, const float *x, int T,
                         float *out)
{
    if (!sh)
        return SN_FAIL(SN_E_INVALID, "moe_shared: no shared expert");
    return moe_submit(b, gate, up, down, logits, top_k, norm_topk ? 1 : 0, sh, x, T, out);
}

/* The prefill GEMM a SANCTUM_CUDA_GEMM value names (NULL: the default; a
 * value sn_cuda_gemm_i8_of refuses was refused at creation): "fast" the
 * single-pass fp16 GEMM (see k_x_to_f16), else gemm_i8's form */
void gemm_mode_set(cu_devinfo *di, const char *g)
{
    di->gemm_fast = g && !strcmp(g, "fast");
    di->gemm_i8 = sn_cuda_gemm_i8_of(g);
}

/* --precision fast: what SANCTUM_CUDA_GEMM=fast selects at creation, the
 * prefill GEMMs in one fp16 pass (x rounded to fp16; test_cuda_ops bounds
 * them at 2e-3 against the CPU) instead of the hi/lo form */
sn_status cuda_set_fast(sn_backend *b)
{
    gemm_mode_set(&cb_of(b)->di, "fast");
    return SN_OK;
}

const sn_backend_ops g_cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .copy = cuda_copy,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .memset0 = cuda_memset0,
    .upload_weight = cuda_upload_weight,
    .sync = cuda_sync,
    .matmul = cuda_matmul,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .add = cuda_add,
    .swiglu = cuda_swiglu,
    .rope = cuda_rope,
    .attention = cuda_attention,
    .kv_write = cuda_kv_write,
    .gdn = cuda_gdn,
    .gated_rmsnorm = cuda_gated_rmsnorm,
    .mul_sigmoid = cuda_mul_sigmoid,
    .argmax = sn_cuda_argmax,
    .sample = sn_cuda_sample,
    .moe = tbl_moe,
    .moe_shared = tbl_moe_shared,
    .add_gated = cuda_add_gated,
    .copy_n = cuda_copy_n,
    .begin_step = sn_cuda_begin_step,
    .end_step = sn_cuda_end_step,
    .step_launch = sn_cuda_step_launch,
    .step_wait = sn_cuda_step_wait,
    .begin_ahead = sn_cuda_begin_ahead,
    .step_park = sn_cuda_step_park,
    .step_launch_parked = sn_cuda_step_launch_parked,
    .step_drop = sn_cuda_step_drop,
    .set_fast = cuda_set_fast,
};

} // namespace

extern "C" int sn_cuda_is(const sn_backend *b) { return b && b->ops == &g_cuda_ops; }

extern "C" sn_status sn_backend_cuda_new(int gpu, sn_backend **out)
{
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return SN_FAIL(SN_E_UNSUPPORTED, "CUDA backend: no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    }
    if (gpu < 0 || gpu >= n)
        return SN_FAIL(SN_E_RANGE, "CUDA backend: gpu %d of %d devices", gpu, n);
    if ((e = cudaSetDevice(gpu)) != cudaSuccess)
        return cu_err(e, "set device");
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, gpu)) != cudaSuccess)
        return cu_err(e, "device properties");
    if (prop.major < 8)
        return SN_FAIL(SN_E_UNSUPPORTED, "CUDA backend: %s is sm_%d%d; sm_80 or newer needed", prop.name, prop.major,
                       prop.minor);
    const char *pdl = getenv("SANCTUM_CUDA_PDL");
    if (pdl && strcmp(pdl, "0") && strcmp(pdl, "1") && strcmp(pdl, "2"))
        return SN_FAIL(SN_E_INVALID,
                       "SANCTUM_CUDA_PDL=%s: want 0 (no programmatic dependent launch), 1 (for every kernel) or 2 "
                       "(default: for the kernels that prefetch weights)",
                       pdl);
    const char *pdls = getenv("SANCTUM_CUDA_PDL_SMALL");
    long pdl_small = 0;
    if (pdls) {
        char *end = NULL;
        pdl_small = strtol(pdls, &end, 10);
        if (end == pdls || *end || pdl_small < 0 || pdl_small > 63)
            return SN_FAIL(SN_E_INVALID,
                           "SANCTUM_CUDA_PDL_SMALL=%s: want 0 to 63 (bits: 1 gated norm, 2 attention, 4 combine, 8 "
                           "GDN step, 16 attention prep, 32 x digits)",
                           pdls);
    }
    const char *gmm = getenv("SANCTUM_CUDA_GEMM"), *gmv = getenv("SANCTUM_CUDA_GEMV");
    if (sn_cuda_gemm_i8_of(gmm) < 0)
        return SN_FAIL(SN_E_INVALID,
                       "SANCTUM_CUDA_GEMM=%s: want hilo (default: x as fp16 hi + lo), i8 (integer tensor cores on 3 "
                       "digits of x), i8fast (2 digits), split (fp16 split GEMM) or fast (single-pass fp16)",
                       gmm);
    if (gmv && strcmp(gmv, "fp32"))
        return SN_FAIL(SN_E_INVALID,
                       "SANCTUM_CUDA_GEMV=%s: want fp32 (no repacked copies: decode on the fp32 GEMV), or leave it "
                       "unset",
                       gmv);
    /* the prefill kernels' knobs (their parser, read where they act) and the
     * uploads' and cuBLAS's: a value set is one they take, not a silent default */
    SN_TRY(cu_pf_env_check());
    static const char *const onoff[] = { "SANCTUM_CUDA_CUBLAS", "SANCTUM_CUDA_MOE_REPACK" };
    for (size_t i = 0; i < sizeof onoff / sizeof *onoff; i++) {
        const char *v = getenv(onoff[i]);
        if (v && strcmp(v, "0") && strcmp(v, "1"))
            return SN_FAIL(SN_E_INVALID, "%s=%s: want 0 or 1 (default)", onoff[i], v);
    }
    cuda_be *cb = (cuda_be *)calloc(1, sizeof *cb);
    if (!cb)
        return SN_FAIL(SN_E_NOMEM, "CUDA backend");
    cb->hint_slot = -1;
    cb->park.slot = -1;
    cb->base.ops = &g_cuda_ops;
    cb->base.n_threads = 1;
    cb->dev = gpu;
    cb->fuse = true;
    cb->fuse_gate = 1;
    cb->fuse_conv = 1;
    cb->di.moe_gemm = 1;
    cb->di.gemv_i8 = 1;
    cb->di.gemv_mb = 0; /* by shape */
    cb->di.gemv_sk = 1;
    cb->di.gemv_sk_bps = 2;
    /* the SIMT GEMV's pool form for launches of >= 2 row groups a warp (the
     * 27B's gate/up, the 35B-A3B's lm_head): half dealt, half taken. 27B
     * decode 8.144 against 8.262 ms a step off, median of six interleaved
     * rounds (won five), H100, s35r2 (docs/PERFORMANCE.md run 45) */
    cb->di.gemv_dyn = 50;
    cb->di.gemv_dyn_min = 2;
    cb->di.gemv_dyn_lean = 0; /* built after s35r1, not yet run */
    cb->di.gemv_rl = 3;       /* register loads for rows over 4096 columns, the ring below (gv_launch) */
    /* the stream-K GEMV's pool: off (27B decode 9.43-9.60 ms a step at
     * gemv_sk_vw=2, 12.07-12.26 at 4, against 8.10-8.41 off, s35r1) */
    cb->di.gemv_sk_vw = 1;
    cb->di.gemv_sk_dv = 1;
    cb->di.gemv_sk_minu = 0; /* GK_MINU / vw units a virtual warp */
    cb->di.gemv_i8_min = -1; /* by shape */
    cb->di.gemv_dp = 1;
    cb->di.gemv_pre = 1; /* 35B-A3B 2.50-2.54 against 2.58-2.60 ms per step with 8 (results.log 07:05Z) */
    cb->di.attn_splits = 64;
    cb->di.attn_warps = 0; /* by shape */
    /* the MoE router (257 rows) through k_gemv_q8s: 2.229-2.346 ms a 35B-A3B step against
     * 2.296-2.385 with k_gemv (six interleaved rounds, H100, results.log s28r1) */
    cb->di.gemv_q8s_rows = 1024;
    cb->di.gemv_rpw1_rows = 0; /* off: 35B-A3B 339-349 vs 347-355 tok/s, not separable from noise (results.log 20:19Z) */
    {
        /* SANCTUM_CUDA_GEMM=fast: single-pass fp16 prefill GEMM (see k_x_to_f16);
         * [gemm_i8] SANCTUM_CUDA_GEMM=hilo (default: x as fp16 hi + lo on the fp16 tensor cores,
         * dense weights; MoE experts take 3 digits) | i8 (3 digits) | i8fast (2 digits) | split |
         * fast: the tensor-core GEMM for repacked Q4 weights, or the fp16 GEMMs above for every
         * weight. hi/lo is the default since s38r1: the model and prefill tests pass with it, its
         * GEMM is 1.16x the 3 digits' (H100, warps of 32 rows) and 5.6e-7 off the CPU (6.7e-7) */
        gemm_mode_set(&cb->di, getenv("SANCTUM_CUDA_GEMM"));
        /* the hi/lo form's nibbles by the magic number: as subnormals its results were 1.19x the
         * 3-digit GEMM's speed against 1.11x, but 4e-6 off its host emulation (s37r1, H100) */
        cb->di.gemm_hl_sub = 0;
        /* warps of 32 rows x 64 tokens convert each A tile once: 165 against 159 TFLOP/s for warps
         * of 64 x 32 on 17408 x 5120 at T = 4096 (s38r1, H100), the same bits */
        cb->di.gemm_hl_rows = 32;
        /* SANCTUM_CUDA_PDL=0|1|2 (checked above): which kernels may start before the previous
         * one ends; by default (2) those that prefetch weights (cuda_internal.h) */
        const char *p = getenv("SANCTUM_CUDA_PDL");
        cu_pdl = p ? atoi(p) : 2;
        /* and of those, all but 8-bit ones reading under 2 MB: s26r4, --vary, three rounds on an
         * H100, 35B-A3B 2.368-2.394 ms per step against 2.398-2.451 with every one (the one launch
         * under 2 MB is its Q8 router), 27B 8.287-8.315 against 8.276-8.304 (results.log 06:08Z);
         * s27r1: the default model (all 4-bit, all under 2 MB) 0.190 ms with every edge, 0.231 with
         * none, so the threshold holds for 8-bit weights only */
        cu_pdl_min_bytes = (int64_t)2 << 20;
        /* SANCTUM_CUDA_PDL_SMALL (parsed above): the small kernels on the edge too (tune pdl_small) */
        cu_pdl_small = (int)pdl_small;
    }
    cb->di.n_sm = prop.multiProcessorCount;
    cb->di.smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(cb->name, sizeof cb->name, "%s", prop.name);
    sn_status st = SN_OK;
    if ((e = cudaStreamCreateWithFlags(&cb->st, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc(&cb->d_zero, sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(cb->d_zero, 0, sizeof(int))) != cudaSuccess ||
        (e = cudaMalloc(&cb->d_gdn_cnt, sizeof(int) * CU_GDN_CNT)) != cudaSuccess ||
        (e = cudaMemset(cb->d_gdn_cnt, 0, sizeof(int) * CU_GDN_CNT)) != cudaSuccess ||
        (e = cudaMalloc(&cb->d_moe_sync, sizeof(unsigned) * CU_MOE_SYNC)) != cudaSuccess ||
        (e = cudaMemset(cb->d_moe_sync, 0, sizeof(unsigned) * CU_MOE_SYNC)) != cudaSuccess ||
        (e = cudaMalloc(&cb->d_outs, sizeof(int32_t) * STEP_MAX_OUTS)) != cudaSuccess ||
        (e = cudaMallocHost(&cb->h_outs, sizeof(int32_t) * STEP_MAX_OUTS)) != cudaSuccess ||
        (e = cudaMalloc(&cb->d_sp, sizeof(step_params))) != cudaSuccess ||
        (e = cudaMallocHost(&cb->h_sp, sizeof(step_params))) != cudaSuccess ||
        (e = cudaMalloc(&cb->d_ids, sizeof(int32_t) * STEP_MAX_IDS)) != cudaSuccess)
        st = cu_err(e, "backend setup");
    if (st == SN_OK) {
        cb->ids_cap = STEP_MAX_IDS;
        memset(cb->h_sp, 0, sizeof(step_params));
        st = ensure_scratch(cb, 64u << 20);
    }
    if (st == SN_OK)
        st = cu_matmul_init(&cb->di);
    if (st == SN_OK) {
        /* cuBLAS for long prefill GEMMs when it can be loaded; SANCTUM_CUDA_CUBLAS=0 turns it off */
        const char *env = getenv("SANCTUM_CUDA_CUBLAS");
        if (!(env && !strcmp(env, "0")) && cu_blas_open(cb->st, &cb->di.blas) == SN_OK)
            cb->di.blas_min_t = 64;
        else
            sn_clear_error();
    }
    if (st == SN_OK)
        st = cu_ops_init(&cb->di);
    /* the zeroing memsets above ran on the legacy stream, which cb->st
     * (non-blocking) does not wait for */
    if (st == SN_OK && (e = cudaDeviceSynchronize()) != cudaSuccess)
        st = cu_err(e, "backend setup");
    if (st != SN_OK) {
        cuda_destroy(&cb->base);
        return st;
    }
    *out = &cb->base;
    return SN_OK;
}
