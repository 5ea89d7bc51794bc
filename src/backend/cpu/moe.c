/* CPU MoE ops (the optional moe and add_gated of backend.h).
 *
 * Why a fused op on the CPU: the model's generic path runs, per layer and
 * per routed expert, three matmuls, a swiglu and a scale-and-add per token,
 * each its own parallel-for; a decode token of Qwen3.5-35B-A3B (8 of 256
 * experts of 512 x 2048) makes ~50 tiny parallel-fors per layer. Here the
 * gate and up projections of every active expert are one parallel-for, the
 * down projections another.
 *
 * Same numbers as the model's generic path, bit for bit: routing is the
 * same fp32 softmax / first-index top-k / renormalisation in the same
 * order; an expert's rows are its tokens in token order, through the same
 * batch-invariant matmul kernels and swiglu; a token's output is
 * 0 + w_e1*o_e1 + w_e2*o_e2 + ... over its experts in ascending expert
 * index, each product rounded before its add (transformers' index_add_
 * order). Tokens are processed in blocks of MOE_TBLK to bound scratch, which
 * changes nothing per token. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "sanctum/threadpool.h"

/* Tokens a block: a block reads every selected expert's weights once, and
 * more tokens an expert give the prefill tiles (four tokens) more to do:
 * 512 against 128, 35B-A3B synth prefill of 256 tokens 19.2 / 23.7 tok/s
 * against 18.6 / 22.6 (Zen 4 VM, 2026-12-07, alternated). Its scratch then
 * is ~130 MB there (S = 4096 rows of H = 2048 gathered, prepared and
 * output, plus gate, up and act). */
#ifndef MOE_TBLK /* overridable for tuning runs */
#define MOE_TBLK 512
#endif
#define MOE_MAX_K 64

/* One matrix multiply over a run of gathered rows: expert e's matrix. */
typedef struct {
    cpu_mat m;
    cpu_mm_plan plan;
    cpu_mm_args a;
    const float *bias;
    int64_t first; /* index of its first output row in the combined item space */
} moe_seg;

typedef struct {
    moe_seg *seg;
    int n_seg;
} seg_job;

/* Items are output rows of all segments laid end to end. */
static void seg_body(void *ctx, int64_t i0, int64_t i1, int tid)
{
    seg_job *j = ctx;
    for (int s = 0; s < j->n_seg && i0 < i1; s++) {
        moe_seg *g = &j->seg[s];
        int64_t end = g->first + g->m.rows;
        if (i0 >= end)
            continue;
        int64_t e = i1 < end ? i1 : end;
        cpu_mm_run_rows(&g->plan, &g->a, g->bias, i0 - g->first, e - g->first);
        i0 = e;
    }
}

typedef struct {
    const float *logits;
    int E, k;
    bool norm;
    int32_t *sel_e; /* [n, k] */
    float *sel_w;   /* [n, k] */
} route_job;

/* Per token, exactly the model's host routing (qwen3_5_moe.c route()). */
static void route_body(void *ctx, int64_t t0, int64_t t1, int tid)
{
    route_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        const float *lg = j->logits + (size_t)t * j->E;
        int32_t *se = j->sel_e + (size_t)t * j->k;
        float *sw = j->sel_w + (size_t)t * j->k;
        float mx = lg[0];
        for (int e = 1; e < j->E; e++)
            mx = fmaxf(mx, lg[e]);
        float sum = 0;
        for (int e = 0; e < j->E; e++)
            sum += expf(lg[e] - mx);
        for (int s = 0; s < j->k; s++) {
            int best = -1;
            for (int e = 0; e < j->E; e++) {
                bool taken = false;
                for (int i = 0; i < s; i++)
                    taken = taken || se[i] == e;
                if (!taken && (best < 0 || lg[e] > lg[best]))
                    best = e; /* ties: lower index first */
            }
            se[s] = best;
            sw[s] = expf(lg[best] - mx) / sum;
        }
        float tot = 0;
        for (int s = 0; s < j->k; s++)
            tot += sw[s];
        if (j->norm)
            for (int s = 0; s < j->k; s++)
                sw[s] = sw[s] / tot;
    }
}

typedef struct {
    const float *x;   /* block input [n, H] */
    float *xg;        /* gathered [S, H] */
    const int32_t *row_tok;
    int64_t H;
    /* preparation of xg for the gate (and up, when its plan differs) */
    const cpu_mm_plan *pg, *pu;
    const cpu_mat *mg, *mu;
    float *xpg, *gsg, *xpu, *gsu;
} gather_job;

static void gather_body(void *ctx, int64_t r0, int64_t r1, int tid)
{
    gather_job *j = ctx;
    for (int64_t r = r0; r < r1; r++)
        memcpy(j->xg + (size_t)r * j->H, j->x + (size_t)j->row_tok[r] * j->H, sizeof(float) * j->H);
    cpu_mm_prep_rows(j->pg, j->mg, j->xg, r0, r1, j->xpg, j->gsg);
    if (j->pu)
        cpu_mm_prep_rows(j->pu, j->mu, j->xg, r0, r1, j->xpu, j->gsu);
}

typedef struct {
    const float *g, *u;
    float *act;
    const cpu_mm_plan *pd;
    const cpu_mat *md;
    float *xpd, *gsd;
    int64_t I;
} act_job;

/* swiglu per gathered row, then the down projection's preparation of it. */
static void act_body(void *ctx, int64_t r0, int64_t r1, int tid)
{
    act_job *j = ctx;
    cpu_op_swiglu(j->g, j->u, r0 * j->I, r1 * j->I, j->act);
    cpu_mm_prep_rows(j->pd, j->md, j->act, r0, r1, j->xpd, j->gsd);
}

typedef struct {
    const float *o;        /* down outputs [S, H] */
    const int32_t *sel_e;  /* [n, k] */
    const float *sel_w;
    const int32_t *slot;   /* [n, k]: row of (token, selection) in o */
    int k;
    int64_t H;
    float *out;            /* [n, H] */
} combine_job;

static void combine_body(void *ctx, int64_t t0, int64_t t1, int tid)
{
    combine_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        /* this token's selections by ascending expert (k is small) */
        int ord[MOE_MAX_K];
        const int32_t *se = j->sel_e + (size_t)t * j->k;
        for (int s = 0; s < j->k; s++) {
            int p = s;
            while (p > 0 && se[ord[p - 1]] > se[s]) {
                ord[p] = ord[p - 1];
                p--;
            }
            ord[p] = s;
        }
        float *y = j->out + (size_t)t * j->H;
        memset(y, 0, sizeof(float) * j->H);
        for (int q = 0; q < j->k; q++) {
            int s = ord[q];
            float w = j->sel_w[(size_t)t * j->k + s];
            const float *o = j->o + (size_t)j->slot[(size_t)t * j->k + s] * j->H;
            for (int64_t i = 0; i < j->H; i++) {
                float p = o[i] * w; /* rounded before the add, as scale-then-add does */
                y[i] = y[i] + p;
            }
        }
    }
}

static bool same_plan(const cpu_mm_plan *a, const cpu_mat *ma, const cpu_mm_plan *b, const cpu_mat *mb)
{
    return a->prep == b->prep && a->gsum == b->gsum && (!a->gsum || ma->group == mb->group);
}

sn_status cpu_moe(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                  const float *logits, int top_k, bool norm_topk, const float *x, int T, float *out)
{
    cpu_be *be = (cpu_be *)b;
    sn_status st = SN_OK;
    moe_seg *seg = NULL;
    if (!gate || !up || !down)
        return SN_FAIL(SN_E_INVALID, "moe: NULL expert weight");
    int64_t E = gate->n_experts, I = gate->rows, H = gate->cols;
    if (E < 1 || up->n_experts != E || down->n_experts != E)
        return SN_FAIL(SN_E_SHAPE, "moe: expert stacks of %lld / %lld / %lld experts", (long long)gate->n_experts,
                       (long long)up->n_experts, (long long)down->n_experts);
    if (up->rows != I || up->cols != H || down->rows != H || down->cols != I)
        return SN_FAIL(SN_E_SHAPE, "moe: gate [%lld, %lld], up [%lld, %lld], down [%lld, %lld] do not chain",
                       (long long)I, (long long)H, (long long)up->rows, (long long)up->cols, (long long)down->rows,
                       (long long)down->cols);
    if (top_k < 1 || top_k > MOE_MAX_K || top_k > E)
        return SN_FAIL(SN_E_INVALID, "moe: top_k %d (experts %lld, max %d)", top_k, (long long)E, MOE_MAX_K);
    if (T < 0 || (T > 0 && (!logits || !x || !out)))
        return SN_FAIL(SN_E_INVALID, "moe: bad arguments (T=%d)", T);
    cpu_mat mg, mu, md;
    SN_TRY(cpu_mat_resolve(gate, 0, &mg));
    SN_TRY(cpu_mat_resolve(up, 0, &mu));
    SN_TRY(cpu_mat_resolve(down, 0, &md));
    cpu_mm_plan pg, pu, pd;
    cpu_mm_plan_for(be, &mg, &pg);
    cpu_mm_plan_for(be, &mu, &pu);
    cpu_mm_plan_for(be, &md, &pd);
    bool up_own = !same_plan(&pg, &mg, &pu, &mu);
    size_t seg_bytes = sizeof *seg * 2 * (size_t)E;
    if (seg_bytes > be->moe_seg_cap) { /* once per model: decode allocates nothing */
        void *ns = realloc(be->moe_seg, seg_bytes);
        if (!ns)
            return SN_FAIL(SN_E_NOMEM, "moe: %lld segments", (long long)(2 * E));
        be->moe_seg = ns;
        be->moe_seg_cap = seg_bytes;
    }
    seg = be->moe_seg;

    /* scratch layout for a block of n <= MOE_TBLK tokens, S = n*k rows */
    const int64_t Smax = (int64_t)MOE_TBLK * top_k;
    size_t ints = (size_t)Smax * 3 + 2 * ((size_t)E + 1); /* sel_e, slot, row_tok, start, cur */
    size_t fl = (size_t)Smax                         /* sel_w */
                + (size_t)Smax * H * 2                /* xg, o */
                + (size_t)Smax * I * 3                /* g, u, act */
                + cpu_mm_prep_floats(&pg, &mg, Smax) + (up_own ? cpu_mm_prep_floats(&pu, &mu, Smax) : 0) +
                cpu_mm_prep_floats(&pd, &md, Smax) + 17 * 16; /* 17 regions, each padded to 16 floats */
    float *base;
    if ((st = cpu_scratch_get(be, fl + ints, &base)) != SN_OK)
        goto out;
    float *p = base;
#define TAKE(n) (p += (((n) + 15) & ~(size_t)15), p - (((n) + 15) & ~(size_t)15))
    int32_t *sel_e = (int32_t *)TAKE((size_t)Smax), *slot = (int32_t *)TAKE((size_t)Smax);
    int32_t *row_tok = (int32_t *)TAKE((size_t)Smax), *start = (int32_t *)TAKE((size_t)E + 1);
    int32_t *cur = (int32_t *)TAKE((size_t)E + 1);
    float *sel_w = TAKE((size_t)Smax), *xg = TAKE((size_t)Smax * H), *o = TAKE((size_t)Smax * H);
    float *g = TAKE((size_t)Smax * I), *u = TAKE((size_t)Smax * I), *act = TAKE((size_t)Smax * I);
    float *xpg = pg.prep ? TAKE((size_t)Smax * H) : NULL, *gsg = pg.gsum ? TAKE((size_t)Smax * mg.n_groups) : NULL;
    /* up shares the gate's preparation unless its plan differs; a kernel
     * given an xp reads it instead of x, so "none" must stay NULL */
    float *xpu = !up_own ? xpg : pu.prep ? TAKE((size_t)Smax * H) : NULL;
    float *gsu = !up_own ? gsg : pu.gsum ? TAKE((size_t)Smax * mu.n_groups) : NULL;
    float *xpd = pd.prep ? TAKE((size_t)Smax * I) : NULL, *gsd = pd.gsum ? TAKE((size_t)Smax * md.n_groups) : NULL;
#undef TAKE

    for (int t0 = 0; t0 < T; t0 += MOE_TBLK) {
        int n = T - t0 < MOE_TBLK ? T - t0 : MOE_TBLK;
        const float *xb = x + (size_t)t0 * H;
        route_job rj = { logits + (size_t)t0 * E, (int)E, top_k, norm_topk, sel_e, sel_w };
        sn_pool_for(be->pool, n, 8, route_body, &rj);

        /* rows grouped by expert, tokens ascending inside each group */
        memset(start, 0, sizeof(int32_t) * ((size_t)E + 1));
        for (int64_t i = 0; i < (int64_t)n * top_k; i++)
            start[sel_e[i] + 1]++;
        for (int64_t e = 0; e < E; e++)
            start[e + 1] += start[e];
        memcpy(cur, start, sizeof(int32_t) * (size_t)E);
        for (int t = 0; t < n; t++) /* t ascending: each group fills in token order */
            for (int s = 0; s < top_k; s++) {
                int32_t at = cur[sel_e[(size_t)t * top_k + s]]++;
                row_tok[at] = t;
                slot[(size_t)t * top_k + s] = at;
            }
        int64_t S = (int64_t)n * top_k;

        gather_job gj = { xb, xg, row_tok, H, &pg, up_own ? &pu : NULL, &mg, &mu, xpg, gsg, xpu, gsu };
        sn_pool_for(be->pool, S, (1 << 13) / H + 1, gather_body, &gj);

        /* gate and up of every active expert: one parallel-for */
        int ns = 0;
        int64_t items = 0;
        for (int64_t e = 0; e < E; e++) {
            int32_t a = start[e], cnt = start[e + 1] - start[e];
            if (!cnt)
                continue;
            for (int which = 0; which < 2; which++) {
                moe_seg *sg = &seg[ns++];
                const sn_weight *w = which ? up : gate;
                if ((st = cpu_mat_resolve(w, (int)e, &sg->m)) != SN_OK)
                    goto out;
                sg->plan = which ? pu : pg;
                float *xp = which ? xpu : xpg, *gs = which ? gsu : gsg;
                sg->a = (cpu_mm_args){ .x = xg + (size_t)a * H, .xp = xp ? xp + (size_t)a * H : NULL,
                                       .gsum = gs ? gs + (size_t)a * sg->m.n_groups : NULL, .T = cnt,
                                       .y = (which ? u : g) + (size_t)a * I, .pf_off = sg->plan.pf_off,
                                       .row_tile = sg->plan.row_tile };
                sg->bias = w->bias;
                sg->first = items;
                items += sg->m.rows;
            }
        }
        for (int s = 0; s < ns; s++)
            seg[s].a.m = &seg[s].m; /* after the array is final */
        seg_job sj = { seg, ns };
        sn_pool_for(be->pool, items, cpu_mm_grain(be, &mg, S / (ns / 2 > 0 ? ns / 2 : 1)), seg_body, &sj);

        act_job aj = { g, u, act, &pd, &md, xpd, gsd, I };
        sn_pool_for(be->pool, S, (1 << 13) / I + 1, act_body, &aj);

        /* down of every active expert: another */
        ns = 0;
        items = 0;
        for (int64_t e = 0; e < E; e++) {
            int32_t a = start[e], cnt = start[e + 1] - start[e];
            if (!cnt)
                continue;
            moe_seg *sg = &seg[ns++];
            if ((st = cpu_mat_resolve(down, (int)e, &sg->m)) != SN_OK)
                goto out;
            sg->plan = pd;
            sg->a = (cpu_mm_args){ .x = act + (size_t)a * I, .xp = xpd ? xpd + (size_t)a * I : NULL,
                                   .gsum = gsd ? gsd + (size_t)a * sg->m.n_groups : NULL, .T = cnt,
                                   .y = o + (size_t)a * H, .pf_off = pd.pf_off, .row_tile = pd.row_tile };
            sg->bias = down->bias;
            sg->first = items;
            items += sg->m.rows;
        }
        for (int s = 0; s < ns; s++)
            seg[s].a.m = &seg[s].m;
        sj.n_seg = ns;
        sn_pool_for(be->pool, items, cpu_mm_grain(be, &md, S / (ns > 0 ? ns : 1)), seg_body, &sj);

        combine_job cj = { o, sel_e, sel_w, slot, top_k, H, out + (size_t)t0 * H };
        sn_pool_for(be->pool, n, (1 << 12) / H + 1, combine_body, &cj);
    }
out:
    return st;
}

typedef struct {
    float *y;
    const float *x, *g;
    int n;
} gated_job;

static void gated_body(void *ctx, int64_t t0, int64_t t1, int tid)
{
    gated_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        /* the model's host expression, then scale-then-add */
        float s = 1.0f / (1.0f + expf(-j->g[t]));
        float *y = j->y + (size_t)t * j->n;
        const float *x = j->x + (size_t)t * j->n;
        for (int i = 0; i < j->n; i++) {
            float p = x[i] * s;
            y[i] = y[i] + p;
        }
    }
}

sn_status cpu_add_gated(sn_backend *b, float *y, const float *x, const float *g, int T, int n)
{
    if (T < 0 || n <= 0 || (T > 0 && (!y || !x || !g)))
        return SN_FAIL(SN_E_INVALID, "add_gated: T=%d n=%d", T, n);
    gated_job j = { y, x, g, n };
    sn_pool_for(((cpu_be *)b)->pool, T, (1 << 14) / n + 1, gated_body, &j);
    return SN_OK;
}
