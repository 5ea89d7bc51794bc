/* The draw of sn_backend_ops.sample (backend.h) written plainly on the
 * host: the oracle of the CUDA kernel (test_cuda_sample.c) and, as a
 * stand-in op on the CPU backend, what lets the CPU suite run the
 * generation loop's device-draw path (test_model_load.c). Edits and bans,
 * argmax (first maximum, NaN never wins), e = expf(x - max), top-p by a
 * full sort (p descending, then the draw order below; a token stays while
 * the mass ranked before it is below top_p; p < (1 - top_p) / n never
 * stays), then the survivors in the CUDA kernel's draw order weighted
 * expf((x - max) / T) (e itself at T = 1 without top-p) and the first whose
 * running total passes u * total (past the end: the last survivor). The
 * draw order (cuda_sample.cu): 32 warps of 32 threads, warp w owns ids
 * [w C, (w + 1) C) with C = ceil(n / 32) rounded up to 32, its lane l
 * every 32nd id from w C + l; thread by thread, ids ascending. */
#ifndef SANCTUM_TEST_SAMPLE_REF_H
#define SANCTUM_TEST_SAMPLE_REF_H

#include <math.h>
#include <stdlib.h>

#include "sanctum/backend.h"

typedef struct {
    int32_t id;     /* the draw */
    double total;   /* the survivors' weight */
    double *cum_lo; /* [n] (optional): each survivor's running total before it, / total; -1: not a survivor */
    double *cum_hi; /* [n] (optional): and after it */
    float q_last;   /* the smallest kept p under top-p (0 without) */
} ref_draw;

static const float *g_ref_q; /* the sort's keys */
static const int32_t *g_ref_pos; /* each id's place in the draw order */

static inline int ref_rank_cmp(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_ref_q[i] != g_ref_q[j]) return g_ref_q[i] > g_ref_q[j] ? -1 : 1;
    return g_ref_pos[i] < g_ref_pos[j] ? -1 : g_ref_pos[i] > g_ref_pos[j];
}

/* ord[k] = the k-th id of the draw order, pos its inverse: the CUDA
 * kernel's (cuda_sample.cu): 8 blocks of 1024 threads, block b holding
 * [b * S, (b + 1) * S) (S = n / 8 rounded up to 32), within it warp w the
 * range [w * C, (w + 1) * C) (C = len / 32 rounded up to 32), lane l every
 * 32nd id of it; block, then thread, then id */
static inline void ref_draw_order(int n, int32_t *ord, int32_t *pos)
{
    const int S = ((n + 7) / 8 + 31) & ~31;
    int k = 0;
    for (int b = 0; b < 8; b++) {
        const int s0 = b * S < n ? b * S : n, s1 = s0 + S < n ? s0 + S : n, len = s1 - s0;
        const int C = ((len + 31) / 32 + 31) & ~31;
        for (int t = 0; t < 1024; t++) {
            int w = t >> 5, l = t & 31, c0 = s0 + (w * C < len ? w * C : len) + l,
                c1 = s0 + ((w + 1) * C < len ? (w + 1) * C : len);
            for (int i = c0; i < c1; i += 32) ord[k++] = i;
        }
    }
    for (k = 0; k < n; k++) pos[ord[k]] = k;
}

static inline void ref_apply_edits(float *x, int n, const sn_sample_row *r)
{
    for (int ph = 0, k = 0; ph < r->n_phases; ph++)
        for (; k < r->phase_end[ph]; k++) {
            const sn_logit_edit *e = &r->edits[k];
            if (e->id < 0 || e->id >= n) continue;
            float l = x[e->id];
            if (e->kind == SN_EDIT_ADD) {
                l += e->a;
            } else {
                if (e->a != 0.0f) l = l < 0.0f ? l * e->a : l / e->a;
                l -= e->b;
                l -= e->c;
            }
            x[e->id] = l;
        }
    for (int k = 0; k < r->n_banned; k++)
        if (r->banned[k] >= 0 && r->banned[k] < n) x[r->banned[k]] = -INFINITY;
}

/* x is edited in place, as the op does. SN_E_RANGE when every logit is NaN. */
static inline sn_status ref_draw_row(float *x, int n, const sn_sample_row *r, ref_draw *d)
{
    ref_apply_edits(x, n, r);
    d->total = 0.0;
    d->q_last = 0.0f;
    if (d->cum_lo)
        for (int i = 0; i < n; i++) d->cum_lo[i] = d->cum_hi[i] = -1.0;
    int top = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (top < 0 || x[i] > x[top])) top = i;
    if (top < 0) return SN_E_RANGE;
    d->id = top;
    const float mx = x[top];
    if (r->temperature == 0.0f || isinf(mx)) return SN_OK;
    float *e = malloc(sizeof(float) * (size_t)n), *q = malloc(sizeof(float) * (size_t)n);
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)n), *ord = malloc(sizeof(int32_t) * (size_t)n),
            *pos = malloc(sizeof(int32_t) * (size_t)n);
    unsigned char *keep = calloc((size_t)n, 1);
    if (!e || !q || !cand || !keep || !ord || !pos) abort();
    ref_draw_order(n, ord, pos);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        e[i] = isnan(x[i]) ? 0.0f : expf(x[i] - mx);
        sum += e[i];
    }
    const float inv = (float)(1.0 / sum), p = r->top_p;
    const float floor_p = p < 1.0f ? (1.0f - p) / (float)n : 0.0f;
    int nc = 0;
    for (int i = 0; i < n; i++) {
        q[i] = e[i] * inv;
        if (q[i] >= floor_p && q[i] > 0.0f) cand[nc++] = i;
    }
    if (p < 1.0f) {
        g_ref_q = q;
        g_ref_pos = pos;
        qsort(cand, (size_t)nc, sizeof *cand, ref_rank_cmp);
        double above = 0.0;
        for (int k = 0; k < nc && above < p; k++) {
            keep[cand[k]] = 1;
            above += q[cand[k]];
            d->q_last = q[cand[k]];
        }
    } else {
        for (int k = 0; k < nc; k++) keep[cand[k]] = 1;
    }
    const float invT = 1.0f / r->temperature;
    const int reuse = invT == 1.0f && p >= 1.0f;
    double total = 0.0;
    int last = -1;
    for (int k = 0; k < n; k++)
        if (keep[ord[k]]) {
            total += reuse ? e[ord[k]] : expf((x[ord[k]] - mx) * invT);
            last = ord[k];
        }
    d->total = total;
    if (total > 0.0) {
        const double target = r->u * total;
        double acc = 0.0;
        int pick = -1;
        for (int k = 0; k < n; k++) {
            const int i = ord[k];
            if (!keep[i]) continue;
            const double w = reuse ? e[i] : expf((x[i] - mx) * invT);
            if (d->cum_lo) d->cum_lo[i] = acc / total;
            acc += w;
            if (d->cum_lo) d->cum_hi[i] = acc / total;
            if (pick < 0 && target < acc) pick = i;
        }
        d->id = pick >= 0 ? pick : last;
    }
    free(e);
    free(q);
    free(cand);
    free(ord);
    free(pos);
    free(keep);
    return SN_OK;
}

/* As an op: rows over host x (the CPU backend's memory). */
static inline sn_status ref_sample_op(sn_backend *be, float *x, int rows, int n, const sn_sample_row *rr, int32_t *out)
{
    (void)be;
    for (int k = 0; k < rows; k++) {
        ref_draw d = { 0 };
        if (ref_draw_row(x + (size_t)rr[k].row * (size_t)n, n, &rr[k], &d) != SN_OK)
            return SN_FAIL(SN_E_RANGE, "sample: every logit of row %d is NaN", rr[k].row);
        out[k] = d.id;
    }
    return SN_OK;
}

#endif
