/* The forward pass: one straight loop over the decoder layers, every bit of
 * arithmetic through backend ops (so the CUDA backend runs this same code).
 *
 * A step takes several sequences at once. Row-wise work (norms,
 * projections, FFN) runs over all rows of the step together; the parts with
 * per-sequence state (RoPE position, KV cache + attention, GatedDeltaNet
 * conv + recurrence) run per sequence on its slice of rows. The backend ops
 * are batch invariant, so a token's result does not depend on what else is
 * in the step: this is what lets a prefill chunk, a decode token and
 * continuous batching share one code path. */
#include "models/model_impl.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sn_seq *seq;
    const int32_t *tokens;
    int n;
    int row0;         /* first row of this item in the step */
    float *logits;    /* host destination: all rows ([n, V]) or only the last row ([V]) */
    bool all;
    int32_t *next_id; /* host destination of the last row's argmax, or of every row's (all_ids) */
    bool all_ids;
    const int32_t *banned; /* sn_batch_item.banned */
    int n_banned;
    const sn_sample_row *sample; /* sn_batch_item.sample: draws for rows of the item... */
    int n_sample;
    int row_off;                 /* ...of which this step holds rows row_off .. row_off + n - 1 */
} step_item;

typedef struct {
    step_item it[SN_MAX_BATCH];
    int n_items;
    int T;
} step;

#define OPS (m->be->ops)
#define BE (m->be)

/* ---- blocks ------------------------------------------------------------- */

/* Full attention: qwen3_5 gated (q/k RMSNorm, sigmoid output gate, partial
 * RoPE), qwen2/mistral plain (biases travel inside the weights). */
static sn_status attn_block(sn_model *m, const step *st, int l, const float *xn, float *y)
{
    const sn_layer *ly = &m->layers[l];
    sn_workspace *ws = &m->ws;
    const int T = st->T, Hq = m->Hq, Hkv = m->Hkv, D = m->D;
    const int64_t qd = (int64_t)Hq * D, kvd = (int64_t)Hkv * D;
    float *q = ws->s[0], *gate = ws->s[1], *k = ws->s[2], *v = ws->s[3];
    float *o = ws->s[4];
    SN_TRY(OPS->matmul(BE, &ly->wq, 0, xn, T, q));
    /* the output gate's rows read the same xn: issued beside q/k/v, so a
     * backend that groups consecutive matmuls of one input (CUDA) streams
     * them in one launch instead of one more after the attention */
    if (ly->wgate.data) SN_TRY(OPS->matmul(BE, &ly->wgate, 0, xn, T, gate));
    SN_TRY(OPS->matmul(BE, &ly->wk, 0, xn, T, k));
    SN_TRY(OPS->matmul(BE, &ly->wv, 0, xn, T, v));
    if (ly->q_norm) {
        float *qn = ws->s[4], *kn = ws->s[5];
        SN_TRY(OPS->rmsnorm(BE, q, ly->q_norm, T * Hq, D, m->eps, qn));
        SN_TRY(OPS->rmsnorm(BE, k, ly->k_norm, T * Hkv, D, m->eps, kn));
        /* the raw q is dead now: its slot takes the attention output */
        o = q;
        q = qn;
        k = kn;
    }
    for (int i = 0; i < st->n_items; i++) {
        const step_item *it = &st->it[i];
        sn_seq *s = it->seq;
        float *qi = q + (int64_t)it->row0 * qd, *ki = k + (int64_t)it->row0 * kvd;
        float *vi = v + (int64_t)it->row0 * kvd, *oi = o + (int64_t)it->row0 * qd;
        SN_TRY(OPS->rope(BE, qi, it->n, Hq, D, m->rot_dim, s->pos, m->inv_freq, m->rope_mscale));
        SN_TRY(OPS->rope(BE, ki, it->n, Hkv, D, m->rot_dim, s->pos, m->inv_freq, m->rope_mscale));
        if (m->cfg->ministral3 && m->cfg->rope.llama4_beta != 0) {
            /* ministral3: q *= 1 + beta*ln(1 + floor(pos / original_max_position_embeddings)) */
            double orig = (double)(m->cfg->rope.original_max_position ? m->cfg->rope.original_max_position
                                                                        : m->cfg->max_position_embeddings);
            for (int t = 0; t < it->n; t++) {
                float f = (float)(1.0 + m->cfg->rope.llama4_beta * log(1.0 + floor((double)(s->pos + t) / orig)));
                if (f != 1.0f) SN_TRY(sn_scale_row(m, qi + (int64_t)t * qd, qd, f));
            }
        }
        SN_TRY(OPS->kv_write(BE, &s->kv[l], ki, vi, it->n, s->pos));
        SN_TRY(OPS->attention(BE, qi, &s->kv[l], it->n, s->pos, Hq, m->attn_scale, oi));
    }
    if (ly->wgate.data) SN_TRY(OPS->mul_sigmoid(BE, o, gate, (size_t)T * (size_t)qd));
    return OPS->matmul(BE, &ly->wo, 0, o, T, y);
}

/* GatedDeltaNet (architecture.md §2.2). */
static sn_status gdn_block(sn_model *m, const step *st, int l, const float *xn, float *y)
{
    const sn_layer *ly = &m->layers[l];
    sn_workspace *ws = &m->ws;
    const int T = st->T;
    const sn_gdn_dims *g = &m->gdn;
    const int64_t conv = m->dims[DIM_CONV], vd = m->dims[DIM_VD], hv = g->n_v_heads;
    float *qkv = ws->s[0], *z = ws->s[1], *a = ws->s[2], *b = ws->s[3], *o = ws->s[4], *on = ws->s[5];
    SN_TRY(OPS->matmul(BE, &ly->in_qkv, 0, xn, T, qkv));
    SN_TRY(OPS->matmul(BE, &ly->in_z, 0, xn, T, z));
    SN_TRY(OPS->matmul(BE, &ly->in_b, 0, xn, T, b));
    SN_TRY(OPS->matmul(BE, &ly->in_a, 0, xn, T, a));
    for (int i = 0; i < st->n_items; i++) {
        const step_item *it = &st->it[i];
        int64_t r = it->row0;
        SN_TRY(OPS->gdn(BE, g, qkv + r * conv, a + r * hv, b + r * hv, ly->conv_w, ly->A_log, ly->dt_bias,
                        &it->seq->gdn[l], it->n, o + r * vd));
    }
    SN_TRY(OPS->gated_rmsnorm(BE, o, z, ly->gnorm, T * (int)hv, g->dv, m->eps, on));
    return OPS->matmul(BE, &ly->out_proj, 0, on, T, y);
}

static sn_status swiglu_ffn(sn_model *m, const sn_weight *wg, const sn_weight *wu, const sn_weight *wd,
                            const float *x, int T, float *y)
{
    sn_workspace *ws = &m->ws;
    SN_TRY(OPS->matmul(BE, wg, 0, x, T, ws->s[0]));
    SN_TRY(OPS->matmul(BE, wu, 0, x, T, ws->s[1]));
    SN_TRY(OPS->swiglu(BE, ws->s[0], ws->s[1], (size_t)T * (size_t)wg->rows, ws->s[2]));
    return OPS->matmul(BE, wd, 0, ws->s[2], T, y);
}

/* ---- one step ----------------------------------------------------------- */

/* One row that needs the lm_head: its logits go to dst (host) and/or its
 * argmax to id (host). */
typedef struct {
    int row;
    float *dst;
    int32_t *id;
    const int32_t *banned; /* ids the argmax must not return (step_item.banned) */
    int n_banned;
    const sn_sample_row *smp; /* a draw on the backend instead of the argmax */
} head_row;

static sn_status run_layers(sn_model *m, const step *st)
{
    sn_workspace *ws = &m->ws;
    const int T = st->T;
    const int64_t H = m->H;
    for (int i = 0; i < st->n_items; i++)
        memcpy(ws->h_ids + st->it[i].row0, st->it[i].tokens, (size_t)st->it[i].n * sizeof(int32_t));
    SN_TRY(OPS->embed(BE, &m->embed, ws->h_ids, T, ws->x));

    for (int l = 0; l < m->n_layers; l++) {
        const sn_layer *ly = &m->layers[l];
        SN_TRY(OPS->rmsnorm(BE, ws->x, ly->in_norm, T, (int)H, m->eps, ws->xn));
        if (ly->kind == SN_LAYER_LINEAR) SN_TRY(gdn_block(m, st, l, ws->xn, ws->y));
        else SN_TRY(attn_block(m, st, l, ws->xn, ws->y));
        SN_TRY(OPS->add(BE, ws->x, ws->y, (size_t)T * (size_t)H));
        SN_TRY(OPS->rmsnorm(BE, ws->x, ly->post_norm, T, (int)H, m->eps, ws->xn));
        if (m->impl->ffn) SN_TRY(m->impl->ffn(m, l, ws->xn, T, ws->y));
        else SN_TRY(swiglu_ffn(m, &ly->gate, &ly->up, &ly->down, ws->xn, T, ws->y));
        SN_TRY(OPS->add(BE, ws->x, ws->y, (size_t)T * (size_t)H));
    }
    return SN_OK;
}

/* Final norm + lm_head on up to SN_LOGIT_ROWS gathered rows, into ws->lg;
 * the argmax on the backend when it has the op and an id is wanted. */
static sn_status head_compute(sn_model *m, const head_row *rows, int nr, int32_t *ids, bool *have_ids)
{
    sn_workspace *ws = &m->ws;
    const int64_t H = m->H;
    bool want_ids = false;
    for (int r = 0; r < nr; r++) {
        SN_TRY(OPS->copy(BE, ws->lg_x + (int64_t)r * H, ws->x + (int64_t)rows[r].row * H, (size_t)H * sizeof(float)));
        want_ids = want_ids || (rows[r].id && !rows[r].smp);
    }
    SN_TRY(OPS->rmsnorm(BE, ws->lg_x, m->final_norm, nr, (int)H, m->eps, ws->xn));
    SN_TRY(OPS->matmul(BE, &m->lm_head, 0, ws->xn, nr, ws->lg));
    *have_ids = want_ids && OPS->argmax;
    if (*have_ids) SN_TRY(OPS->argmax(BE, ws->lg, nr, (int)m->V, ids));
    return SN_OK;
}

/* First maximum, NaN never wins (the backend argmax contract). */
static sn_status host_argmax(const float *x, int64_t n, int32_t *out)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    if (best < 0) return SN_FAIL(SN_E_RANGE, "forward: every logit is NaN");
    *out = (int32_t)best;
    return SN_OK;
}

static bool is_banned(const head_row *hr, int32_t id)
{
    for (int i = 0; i < hr->n_banned; i++)
        if (hr->banned[i] == id) return true;
    return false;
}

static sn_status head_finish(sn_model *m, const head_row *rows, int nr, const int32_t *ids, bool have_ids)
{
    sn_workspace *ws = &m->ws;
    const size_t vb = (size_t)m->V * sizeof(float);
    for (int r = 0, copied = 0; r < nr; r++) {
        const float *lg = ws->lg + (int64_t)r * m->V;
        if (rows[r].dst && r >= copied) {
            /* a verify pass's rows are consecutive on both sides: one copy
             * for the run (each to_host waits for the device) */
            int n = 1;
            while (r + n < nr && rows[r + n].dst == rows[r].dst + (int64_t)n * m->V) n++;
            SN_TRY(OPS->to_host(BE, rows[r].dst, lg, (size_t)n * vb));
            copied = r + n;
        }
        if (!rows[r].id || rows[r].smp) continue;
        if (have_ids && !is_banned(&rows[r], ids[r])) {
            /* not banned: the first maximum stays first once they are masked */
            *rows[r].id = ids[r];
            continue;
        }
        const float *h = rows[r].dst;
        if (rows[r].n_banned) {
            /* the masked copy, so the caller's logits stay as computed */
            if (h) memcpy(ws->h_lg, h, vb);
            else SN_TRY(OPS->to_host(BE, ws->h_lg, lg, vb));
            for (int i = 0; i < rows[r].n_banned; i++)
                if (rows[r].banned[i] >= 0 && rows[r].banned[i] < m->V) ws->h_lg[rows[r].banned[i]] = -INFINITY;
            h = ws->h_lg;
        } else if (!h) {
            SN_TRY(OPS->to_host(BE, ws->h_lg, lg, vb));
            h = ws->h_lg;
        }
        SN_TRY(host_argmax(h, m->V, rows[r].id));
    }
    return SN_OK;
}

/* The rows drawn on the backend: after the step, from the logits it left
 * in ws->lg (row r of the head is row r there). */
static sn_status head_sample(sn_model *m, const head_row *rows, int nr)
{
    sn_sample_row rr[SN_LOGIT_ROWS];
    int32_t out[SN_LOGIT_ROWS];
    int k = 0;
    for (int r = 0; r < nr; r++) {
        if (!rows[r].smp) continue;
        rr[k] = *rows[r].smp;
        rr[k++].row = r;
    }
    if (!k) return SN_OK;
    SN_TRY(OPS->sample(BE, m->ws.lg, k, (int)m->V, rr, out));
    for (int r = 0, j = 0; r < nr; r++)
        if (rows[r].smp) *rows[r].id = out[j++];
    return SN_OK;
}

/* SANCTUM_GRAPH_ROWS: the most rows per sequence a step may have to go
 * into a backend graph (1..8, default 8); anything else is refused. Read at
 * every step (a getenv is nothing next to a forward), so a bad value is an
 * error of the step that meets it, not of the whole process. */
static sn_status graph_rows(int *out)
{
    const char *e = getenv("SANCTUM_GRAPH_ROWS");
    *out = 8;
    if (!e || !*e) return SN_OK;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (*end || v < 1 || v > 8)
        return SN_FAIL(SN_E_INVALID, "SANCTUM_GRAPH_ROWS=%s: want an integer from 1 to 8", e);
    *out = (int)v;
    return SN_OK;
}

/* Ends a sequence's gdn history tracking: the step that ran from position
 * from recorded min(n_hist, rows) slots (0 when it failed or never ran). */
static void hist_disarm(sn_seq *q, int from, int rows)
{
    q->hist_armed = false;
    q->hist_from = from;
    q->hist_valid = 0;
    for (int l = 0; l < q->m->n_layers; l++) {
        if (!q->gdn[l].hist) continue;
        q->hist_valid = q->gdn[l].n_hist < rows ? q->gdn[l].n_hist : rows;
        q->gdn[l].hist = NULL;
        q->gdn[l].n_hist = 0;
    }
}

/* SANCTUM_RECORD_AHEAD (model_impl.h). Read at every step, as
 * SANCTUM_GRAPH_ROWS is. */
sn_status sn_record_ahead_env(bool *out)
{
    const char *e = getenv("SANCTUM_RECORD_AHEAD");
    *out = true;
    if (!e || !*e) return SN_OK;
    if (strcmp(e, "0") && strcmp(e, "1"))
        return SN_FAIL(SN_E_INVALID, "SANCTUM_RECORD_AHEAD=%s: want 1 (default: record the next decode step while "
                       "this one runs) or 0", e);
    *out = *e == '1';
    return SN_OK;
}

sn_status sn_forward_env_check(void)
{
    int rows;
    bool ahead;
    SN_TRY(graph_rows(&rows));
    return sn_record_ahead_env(&ahead);
}

/* Recording ahead (backend.h): a plain decode step (one sequence, one row,
 * its argmax id or its draw on the backend wanted and nothing else) is what
 * the generation loop repeats, so while the backend runs it the next one is
 * recorded with this step's token standing in for the one not yet known
 * (ids are data to a record) and parked; the next forward launches it with
 * the real token if it is that step: the same sequence at the next
 * position, made from the same views (an equal record). The op calls then
 * overlap the GPU's work instead of sitting between two steps. */
static bool ahead_fits(const sn_model *m, const step *st, const head_row *rows, int nr, bool graph)
{
    const sn_backend_ops *o = m->be->ops;
    if (!graph || !o->step_launch || !o->step_wait || !o->begin_ahead || !o->step_park || !o->step_launch_parked ||
        !o->step_drop)
        return false;
    const step_item *it = &st->it[0];
    /* a draw runs after the step (head_sample), outside its record */
    return st->n_items == 1 && it->n == 1 && nr == 1 && rows[0].id && !rows[0].dst && (rows[0].smp || o->argmax) &&
           !it->seq->hist_armed && it->seq->pos + 2 <= it->seq->max_ctx;
}

/* Is the parked record the one this step would record? */
static bool ahead_matches(const sn_model *m, const sn_seq *q, const head_row *row)
{
    const size_t nl = (size_t)m->n_layers;
    return m->ahead.valid && m->ahead.seq == q && m->ahead.pos == q->pos && m->ahead.draw == (row->smp != NULL) &&
           !memcmp(m->ahead.kv, q->kv, nl * sizeof *q->kv) && !memcmp(m->ahead.gdn, q->gdn, nl * sizeof *q->gdn) &&
           !memcmp(&m->ahead.ws, &m->ws, offsetof(sn_workspace, head_ids));
}

/* Records and parks the step after st (the same sequence one position on,
 * st's token standing in). A failure only means nothing is parked. */
static void record_ahead(sn_model *m, const step *st, const head_row *rows, int nr)
{
    sn_seq *q = st->it[0].seq;
    const size_t nl = (size_t)m->n_layers;
    if (!m->ahead.kv) m->ahead.kv = malloc(nl * sizeof *m->ahead.kv);
    if (!m->ahead.gdn) m->ahead.gdn = malloc(nl * sizeof *m->ahead.gdn);
    if (!m->ahead.kv || !m->ahead.gdn) return;
    q->pos++; /* the next step's position: the ops read it from the sequence */
    sn_status s = OPS->begin_ahead(BE);
    if (s == SN_OK) {
        bool have_ids;
        s = run_layers(m, st);
        if (s == SN_OK) s = head_compute(m, rows, nr, m->ws.head_ids, &have_ids);
        sn_status e = OPS->step_park(BE, m);
        if (s == SN_OK) s = e;
    }
    q->pos--;
    if (s != SN_OK) {
        sn_clear_error();
        return;
    }
    m->ahead.seq = q;
    m->ahead.pos = q->pos + 1;
    m->ahead.draw = rows[0].smp != NULL;
    memcpy(m->ahead.kv, q->kv, nl * sizeof *q->kv);
    memcpy(m->ahead.gdn, q->gdn, nl * sizeof *q->gdn);
    memcpy(&m->ahead.ws, &m->ws, offsetof(sn_workspace, head_ids));
    m->ahead.valid = true;
}

/* A decode step (one token per sequence) runs inside begin_step/end_step
 * when the backend has them, so CUDA can replay it as one graph; logits and
 * ids reach the host only after end_step. */
static sn_status run_step(sn_model *m, const step *st)
{
    head_row rows[SN_STEP_TOKENS];
    int nr = 0;
    for (int i = 0; i < st->n_items; i++) {
        const step_item *it = &st->it[i];
        if (it->sample) {
            for (int k = 0; k < it->n_sample; k++) {
                int r = it->sample[k].row - it->row_off;
                if (r >= 0 && r < it->n) rows[nr++] = (head_row){ it->row0 + r, NULL, it->next_id + k, NULL, 0, &it->sample[k] };
            }
            continue;
        }
        int first = (it->logits && it->all) || (it->next_id && it->all_ids) ? 0 : it->n - 1;
        if (!it->logits && !it->next_id) continue;
        for (int r = first; r < it->n; r++) {
            bool last = r == it->n - 1;
            float *dst = !it->logits ? NULL : it->all ? it->logits + (int64_t)r * m->V : last ? it->logits : NULL;
            int32_t *id = !it->next_id ? NULL : it->all_ids ? it->next_id + r : last ? it->next_id : NULL;
            rows[nr++] = (head_row){ it->row0 + r, dst, id, it->banned, it->n_banned, NULL };
        }
    }
    int32_t *ids = m->ws.head_ids;
    bool have_ids = false, one_head = nr <= SN_LOGIT_ROWS, decode = true, ahead_on;
    int grows;
    SN_TRY(graph_rows(&grows));
    SN_TRY(sn_record_ahead_env(&ahead_on));
    for (int i = 0; i < st->n_items; i++) decode = decode && st->it[i].n <= grows;
    /* only decode steps: they repeat with positions shifted, which is what
     * a recorded graph can replay; a prefill chunk would be captured once
     * and never replayed. A PLD verify pass (2..8 rows) repeats too: the
     * CUDA backend keeps a graph per step shape, so steps of up to
     * SANCTUM_GRAPH_ROWS rows per sequence (default 8; 1 = one-row steps
     * only) go into graphs. */
    bool graph = decode && one_head && OPS->begin_step && OPS->end_step;
    const bool ahead = ahead_on && ahead_fits(m, st, rows, nr, graph);
    /* the step parked ahead, launched with its real token; whatever else
     * runs, a parked record is stale from here on */
    bool launched = false, match = ahead && ahead_matches(m, st->it[0].seq, &rows[0]);
    if (m->ahead.valid && !match && OPS->step_drop) OPS->step_drop(BE);
    m->ahead.valid = false;
    if (match) {
        sn_status e = OPS->step_launch_parked(BE, m, st->it[0].tokens, 1);
        if (e == SN_OK) launched = true, have_ids = !rows[0].smp; /* a draw's record has no argmax */
        else if (e == SN_E_MISSING) sn_clear_error(); /* dropped by the backend (a buffer freed): record anew */
        else return e;
    }
    sn_status s = SN_OK;
    if (!launched) {
        if (graph) SN_TRY(OPS->begin_step(BE));
        s = run_layers(m, st);
        if (s == SN_OK && one_head && nr) s = head_compute(m, rows, nr, ids, &have_ids);
        if (graph) {
            /* close the step even after a failure, or the next begin_step refuses */
            sn_status e = ahead ? OPS->step_launch(BE) : OPS->end_step(BE);
            if (s == SN_OK) s = e;
        }
    }
    if (ahead) {
        if (s == SN_OK) record_ahead(m, st, rows, nr);
        sn_status e = OPS->step_wait(BE);
        if (s == SN_OK) s = e;
        if (s != SN_OK && m->ahead.valid) {
            OPS->step_drop(BE);
            m->ahead.valid = false;
        }
    }
    /* a tracked forward records the gdn history once (sn_rewind_track) */
    for (int i = 0; i < st->n_items; i++)
        if (st->it[i].seq->hist_armed) hist_disarm(st->it[i].seq, st->it[i].seq->pos, s == SN_OK ? st->it[i].n - 1 : 0);
    if (s != SN_OK) return s;
    for (int i = 0; i < st->n_items; i++) st->it[i].seq->pos += st->it[i].n;
    if (one_head) {
        if (!nr) return SN_OK;
        SN_TRY(head_finish(m, rows, nr, ids, have_ids));
        return head_sample(m, rows, nr);
    }
    for (int at = 0; at < nr; at += SN_LOGIT_ROWS) {
        int k = nr - at < SN_LOGIT_ROWS ? nr - at : SN_LOGIT_ROWS;
        SN_TRY(head_compute(m, rows + at, k, ids, &have_ids));
        SN_TRY(head_finish(m, rows + at, k, ids, have_ids));
        SN_TRY(head_sample(m, rows + at, k));
    }
    return SN_OK;
}

/* ---- public entry points ------------------------------------------------ */

int sn_model_step_tokens(const sn_model *m) { (void)m; return SN_STEP_TOKENS; }

bool sn_model_can_sample(const sn_model *m) { return m && m->be->ops->sample; }

static sn_status forward_batch(sn_model *m, const sn_batch_item *items, int n_items);

sn_status sn_forward_batch(sn_model *m, const sn_batch_item *items, int n_items)
{
    sn_status s = forward_batch(m, items, n_items);
    /* a tracked sequence whose forward was refused or never reached its
     * step records nothing: the next forward must not record either */
    for (int i = 0; s != SN_OK && m && items && i < n_items && i < SN_MAX_BATCH; i++)
        if (items[i].seq && items[i].seq->m == m && items[i].seq->hist_armed) hist_disarm(items[i].seq, -1, 0);
    return s;
}

static sn_status forward_batch(sn_model *m, const sn_batch_item *items, int n_items)
{
    if (!m || (!items && n_items)) return SN_FAIL(SN_E_INVALID, "forward: NULL model or items");
    if (n_items < 0 || n_items > SN_MAX_BATCH)
        return SN_FAIL(SN_E_INVALID, "forward: %d sequences in one batch (1..%d)", n_items, SN_MAX_BATCH);
    for (int i = 0; i < n_items; i++) {
        const sn_batch_item *b = &items[i];
        if (!b->seq || b->seq->m != m) return SN_FAIL(SN_E_INVALID, "forward: item %d has no sequence of this model", i);
        if (b->n < 1 || !b->tokens) return SN_FAIL(SN_E_INVALID, "forward: item %d has no tokens", i);
        if (b->n_banned < 0 || (b->n_banned && !b->banned))
            return SN_FAIL(SN_E_INVALID, "forward: item %d has %d banned ids but no list of them", i, b->n_banned);
        if (b->sample || b->n_sample) {
            if (!OPS->sample) return SN_FAIL(SN_E_UNSUPPORTED, "forward: backend %s does not draw tokens", OPS->name);
            if (!b->sample || !b->next_id || b->all_ids || b->n_sample < 1 || b->n_sample > b->n)
                return SN_FAIL(SN_E_INVALID, "forward: item %d asks for %d draws of its %d rows (with next_id, "
                               "without all_ids)", i, b->n_sample, b->n);
            for (int k = 0; k < b->n_sample; k++)
                if (b->sample[k].row < 0 || b->sample[k].row >= b->n)
                    return SN_FAIL(SN_E_RANGE, "forward: item %d draw %d reads row %d of %d", i, k, b->sample[k].row, b->n);
        }
        if (b->n > b->seq->max_ctx - b->seq->pos)
            return SN_FAIL(SN_E_RANGE, "forward: context full: position %d + %d tokens exceeds %d",
                           b->seq->pos, b->n, b->seq->max_ctx);
        for (int t = 0; t < b->n; t++)
            if (b->tokens[t] < 0 || b->tokens[t] >= m->V)
                return SN_FAIL(SN_E_RANGE, "forward: token id %d at index %d is outside the vocabulary [0, %lld)",
                               b->tokens[t], t, (long long)m->V);
        for (int j = 0; j < i; j++)
            if (items[j].seq == b->seq) return SN_FAIL(SN_E_INVALID, "forward: sequence appears twice in one batch");
    }
    int done[SN_MAX_BATCH] = { 0 };
    sn_status s = SN_OK;
    pthread_mutex_lock(&m->lock);
    for (;;) {
        step st = { .n_items = 0, .T = 0 };
        for (int i = 0; i < n_items && st.T < SN_STEP_TOKENS; i++) {
            const sn_batch_item *b = &items[i];
            int left = b->n - done[i];
            if (left <= 0) continue;
            int take = left < SN_STEP_TOKENS - st.T ? left : SN_STEP_TOKENS - st.T;
            step_item *it = &st.it[st.n_items++];
            it->seq = b->seq;
            it->tokens = b->tokens + done[i];
            it->n = take;
            it->row0 = st.T;
            it->all = b->all_logits;
            it->logits = NULL;
            it->all_ids = b->all_ids;
            it->next_id = !b->next_id ? NULL : b->all_ids ? b->next_id + done[i] : done[i] + take == b->n ? b->next_id : NULL;
            it->banned = b->banned;
            it->n_banned = b->n_banned;
            it->sample = b->sample;
            it->n_sample = b->n_sample;
            it->row_off = done[i];
            if (b->sample) it->next_id = b->next_id;
            if (b->logits && b->all_logits) it->logits = b->logits + (int64_t)done[i] * m->V;
            else if (b->logits && done[i] + take == b->n) it->logits = b->logits;
            st.T += take;
        }
        if (!st.n_items) break;
        if ((s = run_step(m, &st)) != SN_OK) break;
        for (int i = 0, k = 0; i < n_items && k < st.n_items; i++)
            if (st.it[k].seq == items[i].seq) done[i] += st.it[k++].n;
    }
    pthread_mutex_unlock(&m->lock);
    return s;
}

sn_status sn_forward(sn_model *m, sn_seq *s, const int32_t *tokens, int n, float *logits, bool all_logits)
{
    sn_batch_item b = { .seq = s, .tokens = tokens, .n = n, .logits = logits, .all_logits = all_logits };
    return sn_forward_batch(m, &b, 1);
}

sn_status sn_forward_greedy(sn_model *m, sn_seq *s, const int32_t *tokens, int n, int32_t *next_id)
{
    if (!next_id) return SN_FAIL(SN_E_INVALID, "forward: NULL next_id");
    sn_batch_item b = { .seq = s, .tokens = tokens, .n = n, .next_id = next_id };
    return sn_forward_batch(m, &b, 1);
}
