/* Per-sequence state: a KV cache per attention layer, a conv window and a
 * recurrent matrix per GatedDeltaNet layer, all in backend memory and all
 * allocated when the sequence is made (nothing on the decode path).
 *
 * Recurrent state cannot be truncated back to an earlier position, so the
 * prompt cache and speculative decoding go back in time by snapshot and
 * restore instead. A snapshot is a host copy holding only the live part of
 * each KV cache (positions [0, pos)), which keeps it proportional to the
 * tokens consumed rather than to max_ctx. */
#include "models/model_impl.h"
#include "sanctum/prompt_cache.h"

#include <stdlib.h>
#include <string.h>

struct sn_snapshot {
    const sn_model *m;
    int pos;
    size_t bytes;
    unsigned char *data;
};

#define SEQ_DEFAULT_CTX_CAP 32768

/* Every function here that touches backend memory holds the model lock:
 * a backend (CUDA recording a decode step) serves one caller at a time,
 * and sn_forward_batch holds the same lock for its whole run. */
static void reset_locked(sn_seq *s);

sn_status sn_seq_new(sn_model *m, int max_ctx, sn_seq **out)
{
    *out = NULL;
    if (!m) return SN_FAIL(SN_E_INVALID, "seq: NULL model");
    if (max_ctx <= 0) {
        max_ctx = m->info.max_ctx > 0 ? m->info.max_ctx : SEQ_DEFAULT_CTX_CAP;
        if (max_ctx > SEQ_DEFAULT_CTX_CAP) max_ctx = SEQ_DEFAULT_CTX_CAP;
        if (m->cfg->arch == SN_ARCH_MISTRAL && m->cfg->sliding_window > 0 && max_ctx > m->cfg->sliding_window)
            max_ctx = m->cfg->sliding_window;
    }
    int win = m->cfg->arch == SN_ARCH_MISTRAL ? m->cfg->sliding_window : 0;
    if (win > 0 && max_ctx > win) {
        /* HF Mistral applies sliding_window whenever it is set; within the
         * window full attention is the same function, beyond it we have no
         * windowed kernel, so the context stops at the window. */
        return SN_FAIL(SN_E_RANGE, "seq: context %d exceeds the model's sliding_window %d (windowed attention is "
                       "not implemented)", max_ctx, win);
    }
    sn_seq *s = calloc(1, sizeof *s);
    if (!s) return SN_FAIL(SN_E_NOMEM, "seq: out of memory");
    s->m = m;
    s->max_ctx = max_ctx;
    const sn_gdn_dims *g = &m->gdn;
    s->conv_floats = (size_t)(g->conv_k > 0 ? g->conv_k - 1 : 0) * (size_t)m->dims[DIM_CONV];
    s->S_floats = (size_t)g->n_v_heads * (size_t)g->dk * (size_t)g->dv;
    s->kv_row_floats = (size_t)m->Hkv * (size_t)m->D;
    s->kv = calloc((size_t)m->n_layers, sizeof *s->kv);
    s->gdn = calloc((size_t)m->n_layers, sizeof *s->gdn);
    if (!s->kv || !s->gdn) {
        sn_seq_free(s);
        return SN_FAIL(SN_E_NOMEM, "seq: out of memory");
    }
    sn_backend *be = m->be;
    sn_status st = SN_OK;
    pthread_mutex_lock(&m->lock);
    for (int l = 0; l < m->n_layers && st == SN_OK; l++) {
        if (m->layers[l].kind == SN_LAYER_LINEAR) {
            size_t cb = s->conv_floats * sizeof(float), sb = s->S_floats * sizeof(float);
            if ((st = be->ops->buf_alloc(be, cb ? cb : 4, (void **)&s->gdn[l].conv)) != SN_OK) break;
            if ((st = be->ops->buf_alloc(be, sb, (void **)&s->gdn[l].S)) != SN_OK) break;
        } else {
            size_t kb = (size_t)max_ctx * s->kv_row_floats * sizeof(float);
            sn_kv_view *kv = &s->kv[l];
            kv->max_ctx = max_ctx;
            kv->n_kv_heads = m->Hkv;
            kv->head_dim = m->D;
            if ((st = be->ops->buf_alloc(be, kb, (void **)&kv->k)) != SN_OK) break;
            if ((st = be->ops->buf_alloc(be, kb, (void **)&kv->v)) != SN_OK) break;
        }
    }
    if (st == SN_OK) reset_locked(s);
    pthread_mutex_unlock(&m->lock);
    if (st != SN_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sn_errmsg());
        sn_seq_free(s);
        return SN_FAIL(st, "seq: allocating state for %d positions: %s", max_ctx, msg);
    }
    *out = s;
    return SN_OK;
}

void sn_seq_free(sn_seq *s)
{
    if (!s) return;
    sn_rewind_free(s->rw); /* takes the model lock itself */
    sn_backend *be = s->m->be;
    pthread_mutex_lock(&s->m->lock);
    for (int l = 0; s->kv && s->gdn && l < s->m->n_layers; l++) {
        if (s->kv[l].k) be->ops->buf_free(be, s->kv[l].k);
        if (s->kv[l].v) be->ops->buf_free(be, s->kv[l].v);
        if (s->gdn[l].conv) be->ops->buf_free(be, s->gdn[l].conv);
        if (s->gdn[l].S) be->ops->buf_free(be, s->gdn[l].S);
    }
    pthread_mutex_unlock(&s->m->lock);
    free(s->kv);
    free(s->gdn);
    free(s);
}

int sn_seq_pos(const sn_seq *s) { return s->pos; }
int sn_seq_max_ctx(const sn_seq *s) { return s->max_ctx; }

/* KV rows past pos are never read (attention stops at pos + T), so only the
 * recurrent state needs zeroing. */
void sn_seq_reset(sn_seq *s)
{
    pthread_mutex_lock(&s->m->lock);
    reset_locked(s);
    pthread_mutex_unlock(&s->m->lock);
}

static void reset_locked(sn_seq *s)
{
    sn_backend *be = s->m->be;
    s->pos = 0;
    for (int l = 0; l < s->m->n_layers; l++) {
        if (s->gdn[l].conv && s->conv_floats) be->ops->memset0(be, s->gdn[l].conv, s->conv_floats * sizeof(float));
        if (s->gdn[l].S) be->ops->memset0(be, s->gdn[l].S, s->S_floats * sizeof(float));
    }
}

static size_t state_bytes_at(const sn_seq *s, int pos)
{
    size_t n = 0;
    for (int l = 0; l < s->m->n_layers; l++) {
        if (s->gdn[l].S) n += (s->conv_floats + s->S_floats) * sizeof(float);
        if (s->kv[l].k) n += 2 * (size_t)pos * s->kv_row_floats * sizeof(float);
    }
    return n;
}

size_t sn_seq_state_bytes(const sn_seq *s) { return state_bytes_at(s, s->pos); }

sn_status sn_seq_snapshot(const sn_seq *s, sn_snapshot **out)
{
    *out = NULL;
    sn_snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) return SN_FAIL(SN_E_NOMEM, "snapshot: out of memory");
    sn->m = s->m;
    sn->pos = s->pos;
    sn->bytes = state_bytes_at(s, s->pos);
    sn->data = malloc(sn->bytes ? sn->bytes : 1);
    if (!sn->data) {
        free(sn);
        return SN_FAIL(SN_E_NOMEM, "snapshot: out of memory for %zu bytes of state", state_bytes_at(s, s->pos));
    }
    sn_backend *be = s->m->be;
    unsigned char *p = sn->data;
    sn_status st = SN_OK;
    pthread_mutex_lock(&s->m->lock);
    size_t cb = s->conv_floats * sizeof(float), sb = s->S_floats * sizeof(float);
    size_t kb = (size_t)s->pos * s->kv_row_floats * sizeof(float);
    for (int l = 0; l < s->m->n_layers && st == SN_OK; l++) {
        if (s->gdn[l].S) {
            if (cb && (st = be->ops->to_host(be, p, s->gdn[l].conv, cb)) != SN_OK) break;
            p += cb;
            if ((st = be->ops->to_host(be, p, s->gdn[l].S, sb)) != SN_OK) break;
            p += sb;
        }
        if (s->kv[l].k && kb) {
            if ((st = be->ops->to_host(be, p, s->kv[l].k, kb)) != SN_OK) break;
            p += kb;
            if ((st = be->ops->to_host(be, p, s->kv[l].v, kb)) != SN_OK) break;
            p += kb;
        }
    }
    pthread_mutex_unlock(&s->m->lock);
    if (st != SN_OK) {
        sn_snapshot_free(sn);
        return st;
    }
    *out = sn;
    return SN_OK;
}

sn_status sn_seq_restore(sn_seq *s, const sn_snapshot *sn)
{
    if (!s || !sn) return SN_FAIL(SN_E_INVALID, "restore: NULL sequence or snapshot");
    if (sn->m != s->m) return SN_FAIL(SN_E_INVALID, "restore: snapshot belongs to another model");
    if (sn->pos > s->max_ctx)
        return SN_FAIL(SN_E_RANGE, "restore: snapshot at position %d does not fit a context of %d", sn->pos, s->max_ctx);
    sn_backend *be = s->m->be;
    const unsigned char *p = sn->data;
    size_t cb = s->conv_floats * sizeof(float), sb = s->S_floats * sizeof(float);
    size_t kb = (size_t)sn->pos * s->kv_row_floats * sizeof(float);
    sn_status st = SN_OK;
    pthread_mutex_lock(&s->m->lock);
    for (int l = 0; l < s->m->n_layers && st == SN_OK; l++) {
        if (s->gdn[l].S) {
            if (cb && (st = be->ops->from_host(be, s->gdn[l].conv, p, cb)) != SN_OK) break;
            p += cb;
            if ((st = be->ops->from_host(be, s->gdn[l].S, p, sb)) != SN_OK) break;
            p += sb;
        }
        if (s->kv[l].k && kb) {
            if ((st = be->ops->from_host(be, s->kv[l].k, p, kb)) != SN_OK) break;
            p += kb;
            if ((st = be->ops->from_host(be, s->kv[l].v, p, kb)) != SN_OK) break;
            p += kb;
        }
    }
    if (st == SN_OK) s->pos = sn->pos;
    pthread_mutex_unlock(&s->m->lock);
    return st;
}

int sn_snapshot_pos(const sn_snapshot *sn) { return sn->pos; }
size_t sn_snapshot_bytes(const sn_snapshot *sn) { return sn->bytes; }

void sn_snapshot_free(sn_snapshot *sn)
{
    if (!sn) return;
    free(sn->data);
    free(sn);
}
