/* The step ops of backend.h (begin_step/end_step and recording ahead) put
 * over the CPU backend's table, so the CPU suite runs the engine's step and
 * recording-ahead paths (forward.c) without a GPU (test_pld.c). Inside a
 * step the ops a forward calls are recorded (arguments copied, embed ids by
 * value) and run in order at launch, as the CUDA backend replays a graph;
 * any other op inside a step (a host read) first runs what is recorded and
 * leaves the step eager. A step begun ahead runs nothing until it is
 * launched from the park with its ids replaced; an op that would run it
 * fails and spoils the park, and freeing a buffer drops the parked record,
 * as on CUDA. One instance per process (the tests are single-threaded). */
#ifndef SANCTUM_TEST_STEP_REF_H
#define SANCTUM_TEST_STEP_REF_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sanctum/backend.h"

enum { SR_MATMUL, SR_EMBED, SR_RMSNORM, SR_ADD, SR_SWIGLU, SR_ROPE, SR_ATTN, SR_KVWRITE, SR_GDN, SR_GNORM,
       SR_MULSIG, SR_ARGMAX, SR_MOE, SR_ADDGATED, SR_COPY, SR_MEMSET };
enum { SR_MAX_IDS = 64 };

typedef struct {
    int kind;
    const void *p[8];
    int64_t i[6];
    float f[2];
    sn_kv_view kv;
    sn_gdn_view gv;
    sn_gdn_dims gd;
    int32_t ids[SR_MAX_IDS];
} sr_rec;

static struct {
    const sn_backend_ops *base; /* the CPU table underneath */
    sn_backend_ops ops;
    int mode;                   /* 0 no step, 1 a step, 2 a step begun ahead */
    bool eager, bad;            /* the step runs op by op now; the step ahead asked for the host */
    sr_rec *recs, *park;
    int n, cap, n_park, cap_park;
    bool parked;
    const void *owner;
    long n_parked, n_launched; /* steps parked, parked steps launched */
} g_sr;

static sr_rec *sr_push(void)
{
    if (g_sr.n == g_sr.cap) {
        int nc = g_sr.cap ? 2 * g_sr.cap : 256;
        sr_rec *r = realloc(g_sr.recs, sizeof *r * (size_t)nc);
        if (!r) return NULL;
        g_sr.recs = r;
        g_sr.cap = nc;
    }
    sr_rec *r = &g_sr.recs[g_sr.n++];
    memset(r, 0, sizeof *r);
    return r;
}

static sn_status sr_run(sn_backend *b, const sr_rec *r)
{
    const sn_backend_ops *o = g_sr.base;
    switch (r->kind) {
    case SR_MATMUL: return o->matmul(b, r->p[0], (int)r->i[0], r->p[1], (int)r->i[1], (float *)r->p[2]);
    case SR_EMBED: return o->embed(b, r->p[0], r->ids, (int)r->i[0], (float *)r->p[1]);
    case SR_RMSNORM: return o->rmsnorm(b, r->p[0], r->p[1], (int)r->i[0], (int)r->i[1], r->f[0], (float *)r->p[2]);
    case SR_ADD: return o->add(b, (float *)r->p[0], r->p[1], (size_t)r->i[0]);
    case SR_SWIGLU: return o->swiglu(b, r->p[0], r->p[1], (size_t)r->i[0], (float *)r->p[2]);
    case SR_ROPE:
        return o->rope(b, (float *)r->p[0], (int)r->i[0], (int)r->i[1], (int)r->i[2], (int)r->i[3], (int)r->i[4],
                       r->p[1], r->f[0]);
    case SR_ATTN: return o->attention(b, r->p[0], &r->kv, (int)r->i[0], (int)r->i[1], (int)r->i[2], r->f[0], (float *)r->p[1]);
    case SR_KVWRITE: return o->kv_write(b, &r->kv, r->p[0], r->p[1], (int)r->i[0], (int)r->i[1]);
    case SR_GDN: {
        sn_gdn_view gv = r->gv;
        return o->gdn(b, &r->gd, r->p[0], r->p[1], r->p[2], r->p[3], r->p[4], r->p[5], &gv, (int)r->i[0],
                      (float *)r->p[6]);
    }
    case SR_GNORM:
        return o->gated_rmsnorm(b, r->p[0], r->p[1], r->p[2], (int)r->i[0], (int)r->i[1], r->f[0], (float *)r->p[3]);
    case SR_MULSIG: return o->mul_sigmoid(b, (float *)r->p[0], r->p[1], (size_t)r->i[0]);
    case SR_ARGMAX: return o->argmax(b, r->p[0], (int)r->i[0], (int)r->i[1], (int32_t *)r->p[1]);
    case SR_MOE:
        return o->moe(b, r->p[0], r->p[1], r->p[2], r->p[3], (int)r->i[0], r->i[1] != 0, r->p[4], (int)r->i[2],
                      (float *)r->p[5]);
    case SR_ADDGATED: return o->add_gated(b, (float *)r->p[0], r->p[1], r->p[2], (int)r->i[0], (int)r->i[1]);
    case SR_COPY: return o->copy(b, (void *)r->p[0], r->p[1], (size_t)r->i[0]);
    case SR_MEMSET: return o->memset0(b, (void *)r->p[0], (size_t)r->i[0]);
    }
    return SN_FAIL(SN_E_INVALID, "step_ref: record kind %d", r->kind);
}

static sn_status sr_run_all(sn_backend *b, const sr_rec *r, int n)
{
    for (int k = 0; k < n; k++) SN_TRY(sr_run(b, &r[k]));
    return SN_OK;
}

/* An op the record does not take, inside a step: what is recorded runs
 * first and the step stays eager; inside a step begun ahead it is refused. */
static sn_status sr_barrier(sn_backend *b)
{
    if (g_sr.mode == 2) {
        g_sr.bad = true;
        return SN_FAIL(SN_E_INVALID, "step_ref: a host barrier inside a step recorded ahead");
    }
    if (g_sr.mode == 1 && !g_sr.eager) {
        g_sr.eager = true;
        sn_status st = sr_run_all(b, g_sr.recs, g_sr.n);
        g_sr.n = 0;
        return st;
    }
    return SN_OK;
}

#define SR_RECORDING (g_sr.mode && !g_sr.eager)
#define SR_NEW(K)                                                                                                   \
    sr_rec *r = sr_push();                                                                                          \
    if (!r) return SN_FAIL(SN_E_NOMEM, "step_ref record");                                                          \
    r->kind = (K)

static sn_status sr_matmul(sn_backend *b, const sn_weight *w, int e, const float *x, int T, float *y)
{
    if (!SR_RECORDING) return g_sr.base->matmul(b, w, e, x, T, y);
    SR_NEW(SR_MATMUL);
    r->p[0] = w, r->i[0] = e, r->p[1] = x, r->i[1] = T, r->p[2] = y;
    return SN_OK;
}

static sn_status sr_embed(sn_backend *b, const sn_weight *w, const int32_t *ids, int T, float *y)
{
    if (!SR_RECORDING) return g_sr.base->embed(b, w, ids, T, y);
    if (T > SR_MAX_IDS) SN_TRY(sr_barrier(b)); /* too many ids to keep: run it now */
    if (!SR_RECORDING) return g_sr.base->embed(b, w, ids, T, y);
    SR_NEW(SR_EMBED);
    r->p[0] = w, r->i[0] = T, r->p[1] = y;
    memcpy(r->ids, ids, sizeof(int32_t) * (size_t)T);
    return SN_OK;
}

static sn_status sr_rmsnorm(sn_backend *b, const float *x, const float *w, int rows, int n, float eps, float *y)
{
    if (!SR_RECORDING) return g_sr.base->rmsnorm(b, x, w, rows, n, eps, y);
    SR_NEW(SR_RMSNORM);
    r->p[0] = x, r->p[1] = w, r->i[0] = rows, r->i[1] = n, r->f[0] = eps, r->p[2] = y;
    return SN_OK;
}

static sn_status sr_add(sn_backend *b, float *y, const float *x, size_t n)
{
    if (!SR_RECORDING) return g_sr.base->add(b, y, x, n);
    SR_NEW(SR_ADD);
    r->p[0] = y, r->p[1] = x, r->i[0] = (int64_t)n;
    return SN_OK;
}

static sn_status sr_swiglu(sn_backend *b, const float *g, const float *u, size_t n, float *out)
{
    if (!SR_RECORDING) return g_sr.base->swiglu(b, g, u, n, out);
    SR_NEW(SR_SWIGLU);
    r->p[0] = g, r->p[1] = u, r->i[0] = (int64_t)n, r->p[2] = out;
    return SN_OK;
}

static sn_status sr_rope(sn_backend *b, float *x, int T, int nh, int hd, int rot, int pos0, const float *inv, float ms)
{
    if (!SR_RECORDING) return g_sr.base->rope(b, x, T, nh, hd, rot, pos0, inv, ms);
    SR_NEW(SR_ROPE);
    r->p[0] = x, r->i[0] = T, r->i[1] = nh, r->i[2] = hd, r->i[3] = rot, r->i[4] = pos0, r->p[1] = inv, r->f[0] = ms;
    return SN_OK;
}

static sn_status sr_attention(sn_backend *b, const float *q, const sn_kv_view *kv, int T, int pos0, int nq, float scale,
                              float *out)
{
    if (!SR_RECORDING) return g_sr.base->attention(b, q, kv, T, pos0, nq, scale, out);
    SR_NEW(SR_ATTN);
    r->p[0] = q, r->kv = *kv, r->i[0] = T, r->i[1] = pos0, r->i[2] = nq, r->f[0] = scale, r->p[1] = out;
    return SN_OK;
}

static sn_status sr_kv_write(sn_backend *b, const sn_kv_view *kv, const float *k, const float *v, int T, int pos0)
{
    if (!SR_RECORDING) return g_sr.base->kv_write(b, kv, k, v, T, pos0);
    SR_NEW(SR_KVWRITE);
    r->kv = *kv, r->p[0] = k, r->p[1] = v, r->i[0] = T, r->i[1] = pos0;
    return SN_OK;
}

static sn_status sr_gdn(sn_backend *b, const sn_gdn_dims *d, const float *qkv, const float *a, const float *bb,
                        const float *conv_w, const float *A_log, const float *dt_bias, sn_gdn_view *st, int T,
                        float *out)
{
    if (!SR_RECORDING) return g_sr.base->gdn(b, d, qkv, a, bb, conv_w, A_log, dt_bias, st, T, out);
    SR_NEW(SR_GDN);
    r->gd = *d, r->p[0] = qkv, r->p[1] = a, r->p[2] = bb, r->p[3] = conv_w, r->p[4] = A_log, r->p[5] = dt_bias;
    r->gv = *st, r->i[0] = T, r->p[6] = out;
    return SN_OK;
}

static sn_status sr_gnorm(sn_backend *b, const float *o, const float *z, const float *w, int rows, int n, float eps,
                          float *y)
{
    if (!SR_RECORDING) return g_sr.base->gated_rmsnorm(b, o, z, w, rows, n, eps, y);
    SR_NEW(SR_GNORM);
    r->p[0] = o, r->p[1] = z, r->p[2] = w, r->i[0] = rows, r->i[1] = n, r->f[0] = eps, r->p[3] = y;
    return SN_OK;
}

static sn_status sr_mulsig(sn_backend *b, float *y, const float *g, size_t n)
{
    if (!SR_RECORDING) return g_sr.base->mul_sigmoid(b, y, g, n);
    SR_NEW(SR_MULSIG);
    r->p[0] = y, r->p[1] = g, r->i[0] = (int64_t)n;
    return SN_OK;
}

static sn_status sr_argmax(sn_backend *b, const float *x, int rows, int n, int32_t *out)
{
    if (!SR_RECORDING) return g_sr.base->argmax(b, x, rows, n, out);
    SR_NEW(SR_ARGMAX);
    r->p[0] = x, r->i[0] = rows, r->i[1] = n, r->p[1] = out;
    return SN_OK;
}

static sn_status sr_moe(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                        const float *logits, int top_k, bool norm, const float *x, int T, float *out)
{
    if (!SR_RECORDING) return g_sr.base->moe(b, gate, up, down, logits, top_k, norm, x, T, out);
    SR_NEW(SR_MOE);
    r->p[0] = gate, r->p[1] = up, r->p[2] = down, r->p[3] = logits, r->i[0] = top_k, r->i[1] = norm, r->p[4] = x;
    r->i[2] = T, r->p[5] = out;
    return SN_OK;
}

static sn_status sr_add_gated(sn_backend *b, float *y, const float *x, const float *g, int T, int n)
{
    if (!SR_RECORDING) return g_sr.base->add_gated(b, y, x, g, T, n);
    SR_NEW(SR_ADDGATED);
    r->p[0] = y, r->p[1] = x, r->p[2] = g, r->i[0] = T, r->i[1] = n;
    return SN_OK;
}

static sn_status sr_copy(sn_backend *b, void *dst, const void *src, size_t bytes)
{
    if (!SR_RECORDING) return g_sr.base->copy(b, dst, src, bytes);
    SR_NEW(SR_COPY);
    r->p[0] = dst, r->p[1] = src, r->i[0] = (int64_t)bytes;
    return SN_OK;
}

static sn_status sr_memset0(sn_backend *b, void *dst, size_t bytes)
{
    if (!SR_RECORDING) return g_sr.base->memset0(b, dst, bytes);
    SR_NEW(SR_MEMSET);
    r->p[0] = dst, r->i[0] = (int64_t)bytes;
    return SN_OK;
}

/* the ops that need the host, or copy many at once: a barrier first */
static sn_status sr_to_host(sn_backend *b, void *dst, const void *src, size_t bytes)
{
    SN_TRY(sr_barrier(b));
    return g_sr.base->to_host(b, dst, src, bytes);
}

static sn_status sr_from_host(sn_backend *b, void *dst, const void *src, size_t bytes)
{
    SN_TRY(sr_barrier(b));
    return g_sr.base->from_host(b, dst, src, bytes);
}

static sn_status sr_sync(sn_backend *b)
{
    SN_TRY(sr_barrier(b));
    return g_sr.base->sync(b);
}

static sn_status sr_copy_n(sn_backend *b, int n, void *const *dst, const void *const *src, const size_t *bytes)
{
    SN_TRY(sr_barrier(b));
    return g_sr.base->copy_n(b, n, dst, src, bytes);
}

static sn_status sr_buf_alloc(sn_backend *b, size_t bytes, void **out)
{
    SN_TRY(sr_barrier(b));
    return g_sr.base->buf_alloc(b, bytes, out);
}

static void sr_buf_free(sn_backend *b, void *p)
{
    (void)sr_barrier(b);
    g_sr.parked = false; /* the parked record may hold p */
    g_sr.base->buf_free(b, p);
}

static sn_status sr_begin(sn_backend *b, int mode)
{
    (void)b;
    if (g_sr.mode) return SN_FAIL(SN_E_INVALID, "step_ref: a step is already open");
    g_sr.mode = mode;
    g_sr.eager = g_sr.bad = false;
    g_sr.n = 0;
    return SN_OK;
}

static sn_status sr_begin_step(sn_backend *b) { return sr_begin(b, 1); }
static sn_status sr_begin_ahead(sn_backend *b) { return sr_begin(b, 2); }

static sn_status sr_step_launch(sn_backend *b)
{
    if (g_sr.mode != 1) {
        g_sr.mode = 0;
        return SN_FAIL(SN_E_INVALID, "step_ref: no step to run is open");
    }
    g_sr.mode = 0;
    sn_status st = g_sr.eager ? SN_OK : sr_run_all(b, g_sr.recs, g_sr.n);
    g_sr.n = 0;
    return st;
}

static sn_status sr_step_wait(sn_backend *b)
{
    (void)b;
    return SN_OK; /* a CPU step has run by the time it is launched */
}

static sn_status sr_end_step(sn_backend *b) { return sr_step_launch(b); }

static sn_status sr_step_park(sn_backend *b, const void *owner)
{
    (void)b;
    if (g_sr.mode != 2) return SN_FAIL(SN_E_INVALID, "step_ref: no step begun ahead is open");
    g_sr.mode = 0;
    g_sr.parked = false;
    if (g_sr.bad) return SN_FAIL(SN_E_INVALID, "step_ref: the step recorded ahead asked for the host");
    sr_rec *t = g_sr.park;
    int tc = g_sr.cap_park;
    g_sr.park = g_sr.recs, g_sr.cap_park = g_sr.cap, g_sr.n_park = g_sr.n;
    g_sr.recs = t, g_sr.cap = tc, g_sr.n = 0;
    g_sr.parked = true;
    g_sr.owner = owner;
    g_sr.n_parked++;
    return SN_OK;
}

static sn_status sr_step_launch_parked(sn_backend *b, const void *owner, const int32_t *ids, int n)
{
    if (g_sr.mode) return SN_FAIL(SN_E_INVALID, "step_ref: a step is open");
    if (!g_sr.parked || g_sr.owner != owner) return SN_FAIL(SN_E_MISSING, "step_ref: nothing parked");
    g_sr.parked = false;
    for (int k = 0; k < g_sr.n_park; k++)
        if (g_sr.park[k].kind == SR_EMBED) {
            if (n > g_sr.park[k].i[0]) return SN_FAIL(SN_E_INVALID, "step_ref: %d ids for a step of fewer", n);
            memcpy(g_sr.park[k].ids, ids, sizeof(int32_t) * (size_t)n);
            break;
        }
    g_sr.n_launched++;
    return sr_run_all(b, g_sr.park, g_sr.n_park);
}

static void sr_step_drop(sn_backend *b)
{
    (void)b;
    g_sr.parked = false;
}

/* The table to install on be (be->ops = sr_install(be->ops)); the CPU
 * table underneath is kept for sr_uninstall's return. */
static const sn_backend_ops *sr_install(const sn_backend_ops *base)
{
    g_sr.base = base;
    g_sr.ops = *base;
    sn_backend_ops *o = &g_sr.ops;
    o->matmul = sr_matmul, o->embed = sr_embed, o->rmsnorm = sr_rmsnorm, o->add = sr_add, o->swiglu = sr_swiglu;
    o->rope = sr_rope, o->attention = sr_attention, o->kv_write = sr_kv_write, o->gdn = sr_gdn;
    o->gated_rmsnorm = sr_gnorm, o->mul_sigmoid = sr_mulsig, o->copy = sr_copy, o->memset0 = sr_memset0;
    o->to_host = sr_to_host, o->from_host = sr_from_host, o->sync = sr_sync, o->buf_alloc = sr_buf_alloc;
    o->buf_free = sr_buf_free;
    o->argmax = base->argmax ? sr_argmax : NULL;
    o->moe = base->moe ? sr_moe : NULL;
    o->add_gated = base->add_gated ? sr_add_gated : NULL;
    o->copy_n = base->copy_n ? sr_copy_n : NULL;
    o->moe_shared = NULL; /* the CPU has none: the model runs moe and the shared expert's ops */
    o->begin_step = sr_begin_step, o->end_step = sr_end_step, o->step_launch = sr_step_launch;
    o->step_wait = sr_step_wait, o->begin_ahead = sr_begin_ahead, o->step_park = sr_step_park;
    o->step_launch_parked = sr_step_launch_parked, o->step_drop = sr_step_drop;
    g_sr.mode = 0;
    g_sr.parked = false;
    return o;
}

#endif
