/* sn_model_load: config -> architecture -> checkpoint names bound to layer
 * fields through the architecture's table, every shape and dtype checked in
 * one loop, norms/vectors/conv converted to fp32 once, weights left as views
 * into the mmap (or quantized at load when asked), then handed to the
 * backend.
 *
 * Checkpoint names are canonicalised first so that one table serves the MLX
 * layout ("language_model.model.layers.N..."), the raw Hugging Face VL
 * layout ("model.language_model.layers.N...") and the plain causal-LM layout
 * ("model.layers.N..."). */
#include "models/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sanctum/quant.h"

/* ---- memory the model owns ------------------------------------------- */

sn_status sn_model_host_alloc(sn_model *m, size_t bytes, void **out)
{
    if (m->n_host == m->cap_host) {
        size_t nc = m->cap_host ? 2 * m->cap_host : 64;
        void **nb = realloc(m->host_blocks, nc * sizeof *nb);
        if (!nb) return SN_FAIL(SN_E_NOMEM, "model: out of memory for block list");
        m->host_blocks = nb;
        m->cap_host = nc;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return SN_FAIL(SN_E_NOMEM, "model: out of memory allocating %zu bytes", bytes);
    m->host_blocks[m->n_host++] = p;
    *out = p;
    return SN_OK;
}

/* Allocates a backend buffer, remembered for sn_model_free. */
static sn_status be_alloc(sn_model *m, size_t bytes, void **out)
{
    if (m->n_be == m->cap_be) {
        size_t nc = m->cap_be ? 2 * m->cap_be : 64;
        void **nb = realloc(m->be_blocks, nc * sizeof *nb);
        if (!nb) return SN_FAIL(SN_E_NOMEM, "model: out of memory for buffer list");
        m->be_blocks = nb;
        m->cap_be = nc;
    }
    void *p = NULL;
    SN_TRY(m->be->ops->buf_alloc(m->be, bytes ? bytes : 4, &p));
    m->be_blocks[m->n_be++] = p;
    *out = p;
    return SN_OK;
}

sn_status sn_model_be_upload(sn_model *m, const void *host, size_t bytes, float **out)
{
    void *p = NULL;
    SN_TRY(be_alloc(m, bytes, &p));
    SN_TRY(m->be->ops->from_host(m->be, p, host, bytes));
    *out = p;
    return SN_OK;
}

/* ---- canonical names --------------------------------------------------- */

typedef struct {
    char *canon;
    const sn_st_tensor *t;
} name_ent;

typedef struct {
    name_ent *e;
    size_t n;
} name_map;

static int ent_cmp(const void *a, const void *b)
{
    return strcmp(((const name_ent *)a)->canon, ((const name_ent *)b)->canon);
}

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* Tensors of parts we do not run (vision tower, MTP head, projector). */
static bool ignored_name(const char *n)
{
    static const char *const skip[] = {
        "mtp.", "model.visual.", "visual.", "vision_tower.", "model.vision_tower.",
        "multi_modal_projector.", "model.multi_modal_projector.", "language_model.mtp.",
    };
    for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
        if (has_prefix(n, skip[i])) return true;
    return false;
}

static char *canon_name(const char *n)
{
    const char *rest = n;
    const char *pre = "";
    if (has_prefix(n, "language_model.")) rest = n + strlen("language_model.");
    else if (has_prefix(n, "model.language_model.")) { pre = "model."; rest = n + strlen("model.language_model."); }
    size_t len = strlen(pre) + strlen(rest) + 1;
    char *c = malloc(len);
    if (c) snprintf(c, len, "%s%s", pre, rest);
    return c;
}

static void map_free(name_map *mp)
{
    if (!mp->e) return;
    for (size_t i = 0; i < mp->n; i++) free(mp->e[i].canon);
    free(mp->e);
    mp->e = NULL;
    mp->n = 0;
}

static sn_status map_build(const sn_st *st, name_map *mp)
{
    size_t n = sn_st_count(st);
    mp->e = calloc(n ? n : 1, sizeof *mp->e);
    mp->n = 0;
    if (!mp->e) return SN_FAIL(SN_E_NOMEM, "model: out of memory for the tensor name map");
    for (size_t i = 0; i < n; i++) {
        const sn_st_tensor *t = sn_st_at(st, i);
        if (ignored_name(t->name)) continue;
        char *c = canon_name(t->name);
        if (!c) return SN_FAIL(SN_E_NOMEM, "model: out of memory for tensor names");
        mp->e[mp->n].canon = c;
        mp->e[mp->n].t = t;
        mp->n++;
    }
    qsort(mp->e, mp->n, sizeof *mp->e, ent_cmp);
    for (size_t i = 1; i < mp->n; i++)
        if (strcmp(mp->e[i - 1].canon, mp->e[i].canon) == 0)
            return SN_FAIL(SN_E_FORMAT, "checkpoint has both %s and %s, which name the same tensor",
                           mp->e[i - 1].t->name, mp->e[i].t->name);
    return SN_OK;
}

static const sn_st_tensor *map_find(const name_map *mp, const char *canon)
{
    name_ent key = { .canon = (char *)canon };
    const name_ent *e = bsearch(&key, mp->e, mp->n, sizeof *mp->e, ent_cmp);
    return e ? e->t : NULL;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* ---- shape checks -------------------------------------------------------- */

static void fmt_shape(char *buf, size_t cap, const sn_st_tensor *t)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static sn_status shape_fail(const sn_st_tensor *t, const char *expect)
{
    char got[128];
    fmt_shape(got, sizeof got, t);
    return SN_FAIL(SN_E_SHAPE, "tensor %s: expected shape %s, found %s %s", t->name, expect, got,
                   sn_dtype_name(t->dtype));
}

static bool is_float_dt(sn_dtype d) { return d == SN_DT_F32 || d == SN_DT_F16 || d == SN_DT_BF16; }

static sn_status check_dense(const sn_st_tensor *t, int nd, const int64_t *sh)
{
    char exp[128];
    size_t o = (size_t)snprintf(exp, sizeof exp, "[");
    for (int i = 0; i < nd; i++) o += (size_t)snprintf(exp + o, sizeof exp - o, "%s%lld", i ? ", " : "", (long long)sh[i]);
    snprintf(exp + o, sizeof exp - o, "] F32/F16/BF16");
    if (!is_float_dt(t->dtype) || t->ndim != nd) return shape_fail(t, exp);
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != sh[i]) return shape_fail(t, exp);
    return SN_OK;
}

/* ---- binding ------------------------------------------------------------- */

typedef struct {
    sn_model *m;
    name_map map;
    int quantize_bits;
    /* dims some bound tensor's shape confirmed; the workspace is sized by
     * these only, so a config value no tensor checks (a MoE model's unused
     * intermediate_size, attention dims of an all-linear qwen3_5) cannot
     * ask for an absurd allocation */
    bool bound[DIM_COUNT];
} loader;

static sn_status vec_f32(loader *L, const char *name, int64_t n, bool shift, float **out)
{
    const sn_st_tensor *t = map_find(&L->map, name);
    if (!t) return SN_FAIL(SN_E_MISSING, "tensor %s is missing from the checkpoint (expected [%lld])", name, (long long)n);
    /* always 1-D [n] (norm weights, A_log, dt_bias, linear biases) */
    int64_t sh[1] = { n };
    SN_TRY(check_dense(t, 1, sh));
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return SN_FAIL(SN_E_NOMEM, "model: out of memory converting %s", name);
    for (int64_t i = 0; i < n; i++) h[i] = sn_load_f32(t->data, t->dtype, (size_t)i) + (shift ? 1.0f : 0.0f);
    sn_status s = sn_model_be_upload(L->m, h, (size_t)n * sizeof *h, out);
    free(h);
    return s;
}

static sn_status conv_f32(loader *L, const char *name, int64_t C, int64_t K, float **out)
{
    const sn_st_tensor *t = map_find(&L->map, name);
    if (!t) return SN_FAIL(SN_E_MISSING, "tensor %s is missing from the checkpoint (expected [%lld, 1, %lld])",
                           name, (long long)C, (long long)K);
    int64_t hf[3] = { C, 1, K }, mlx[3] = { C, K, 1 };
    if (check_dense(t, 3, hf) != SN_OK && check_dense(t, 3, mlx) != SN_OK) {
        char exp[96];
        snprintf(exp, sizeof exp, "[%lld, 1, %lld] or [%lld, %lld, 1]", (long long)C, (long long)K,
                 (long long)C, (long long)K);
        return shape_fail(t, exp);
    }
    sn_clear_error();
    size_t n = (size_t)(C * K);
    float *h = malloc(n * sizeof *h);
    if (!h) return SN_FAIL(SN_E_NOMEM, "model: out of memory converting %s", name);
    for (size_t i = 0; i < n; i++) h[i] = sn_load_f32(t->data, t->dtype, i);
    sn_status s = sn_model_be_upload(L->m, h, n * sizeof *h, out);
    free(h);
    return s;
}

/* Quantize a dense [E][rows, cols] weight at load (raw checkpoints with
 * --quantize): MLX's reference affine quantizer, group 64, bf16 scales. */
static sn_status quantize_weight(loader *L, sn_weight *w, const char *name)
{
    const int group = 64, bits = L->quantize_bits;
    int64_t E = w->n_experts > 0 ? w->n_experts : 1;
    if (w->cols % group) return SN_OK; /* as MLX: such a layer stays dense */
    size_t words = (size_t)(w->rows * sn_q_words(w->cols, bits));
    size_t ng = (size_t)(w->rows * (w->cols / group));
    uint32_t *packed;
    uint16_t *sc, *bi;
    SN_TRY(sn_model_host_alloc(L->m, (size_t)E * words * 4, (void **)&packed));
    SN_TRY(sn_model_host_alloc(L->m, (size_t)E * ng * 2, (void **)&sc));
    SN_TRY(sn_model_host_alloc(L->m, (size_t)E * ng * 2, (void **)&bi));
    float *tmp = malloc((size_t)(w->rows * w->cols) * sizeof *tmp);
    if (!tmp) return SN_FAIL(SN_E_NOMEM, "model: out of memory quantizing %s", name);
    sn_status s = SN_OK;
    for (int64_t e = 0; e < E && s == SN_OK; e++) {
        s = sn_weight_to_f32(w, e, tmp);
        if (s == SN_OK)
            s = sn_q_quantize(tmp, w->rows, w->cols, bits, group, SN_DT_BF16, packed + e * words,
                              sc + e * ng, bi + e * ng);
    }
    free(tmp);
    if (s != SN_OK) return SN_FAIL(s, "quantizing %s: %s", name, sn_errmsg());
    w->dtype = bits == 4 ? SN_DT_Q4 : SN_DT_Q8;
    w->group = group;
    w->data = packed;
    w->scales = sc;
    w->qbiases = bi;
    w->sdtype = SN_DT_BF16;
    return SN_OK;
}

/* Binds "<path>.weight" (+ .scales/.biases when quantized) as a [E?][rows, cols] weight.
 * E = 0 for a plain matrix. */
static sn_status bind_matrix(loader *L, const char *path, int64_t E, int64_t rows, int64_t cols,
                             bool optional, sn_weight *w, bool *found)
{
    char name[512], sname[512], bname[512];
    snprintf(name, sizeof name, "%s.weight", path);
    snprintf(sname, sizeof sname, "%s.scales", path);
    snprintf(bname, sizeof bname, "%s.biases", path);
    const sn_st_tensor *t = map_find(&L->map, name);
    *found = t != NULL;
    memset(w, 0, sizeof *w);
    if (!t) {
        if (optional) return SN_OK;
        if (E) return SN_FAIL(SN_E_MISSING, "tensor %s is missing from the checkpoint (expected [%lld, %lld, %lld])",
                              name, (long long)E, (long long)rows, (long long)cols);
        return SN_FAIL(SN_E_MISSING, "tensor %s is missing from the checkpoint (expected [%lld, %lld])",
                       name, (long long)rows, (long long)cols);
    }
    int nd = E ? 3 : 2;
    const sn_st_tensor *sc = map_find(&L->map, sname);
    w->rows = rows;
    w->cols = cols;
    w->n_experts = E;
    if (!sc) {
        int64_t sh[3] = { E, rows, cols };
        SN_TRY(check_dense(t, nd, E ? sh : sh + 1));
        w->dtype = t->dtype;
        w->data = t->data;
        if (L->quantize_bits) SN_TRY(quantize_weight(L, w, name));
        return SN_OK;
    }
    const sn_st_tensor *bi = map_find(&L->map, bname);
    if (!bi) return SN_FAIL(SN_E_MISSING, "tensor %s is missing (quantized weight %s has scales)", bname, name);
    /* Bits and group follow from the shapes; config.json's quantization
     * block must agree where it speaks for this module. */
    char exp[160];
    int64_t G = sc->ndim == nd ? sc->shape[nd - 1] : 0;
    int64_t P = t->ndim == nd ? t->shape[nd - 1] : 0;
    int group = G > 0 && cols % G == 0 ? (int)(cols / G) : 0;
    int bits = P > 0 && (P * 32) % cols == 0 ? (int)(P * 32 / cols) : 0;
    if (!sn_q_supported(bits, group)) {
        if (E) snprintf(exp, sizeof exp, "[%lld, %lld, %lld*bits/32] U32 with 4/8 bits, group 32/64/128",
                        (long long)E, (long long)rows, (long long)cols);
        else snprintf(exp, sizeof exp, "[%lld, %lld*bits/32] U32 with 4/8 bits, group 32/64/128",
                      (long long)rows, (long long)cols);
        return shape_fail(t, exp);
    }
    int64_t wsh[3] = { E, rows, sn_q_words(cols, bits) };
    int64_t ssh[3] = { E, rows, cols / group };
    const int64_t *ws = E ? wsh : wsh + 1, *ss = E ? ssh : ssh + 1;
    bool ok = t->dtype == SN_DT_U32 && t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == ws[i];
    if (!ok) {
        if (E) snprintf(exp, sizeof exp, "[%lld, %lld, %lld] U32", (long long)E, (long long)rows, (long long)ws[2]);
        else snprintf(exp, sizeof exp, "[%lld, %lld] U32", (long long)rows, (long long)ws[1]);
        return shape_fail(t, exp);
    }
    SN_TRY(check_dense(sc, nd, ss));
    SN_TRY(check_dense(bi, nd, ss));
    if (bi->dtype != sc->dtype)
        return SN_FAIL(SN_E_SHAPE, "tensor %s is %s but %s is %s", bname, sn_dtype_name(bi->dtype), sname,
                       sn_dtype_name(sc->dtype));
    if (L->m->cfg->quantized) {
        /* The override key is the module path as written in the checkpoint. */
        char mod[512];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        int cb = 0, cg = 0;
        if (sn_config_quant_for(L->m->cfg, mod, &cb, &cg) == SN_OK && cb && (cb != bits || cg != group))
            return SN_FAIL(SN_E_SHAPE, "tensor %s: shapes say %d-bit group %d, config.json quantization says %d-bit group %d",
                           name, bits, group, cb, cg);
        sn_clear_error();
    }
    w->dtype = bits == 4 ? SN_DT_Q4 : SN_DT_Q8;
    w->group = group;
    w->data = t->data;
    w->scales = sc->data;
    w->qbiases = bi->data;
    w->sdtype = sc->dtype;
    return SN_OK;
}

/* Bytes of `nrows` consecutive rows of a (plain) weight, for row copies. */
static void row_bytes(const sn_weight *w, size_t *data, size_t *scales)
{
    if (w->dtype == SN_DT_Q4 || w->dtype == SN_DT_Q8) {
        *data = (size_t)sn_q_words(w->cols, w->dtype == SN_DT_Q4 ? 4 : 8) * 4;
        *scales = (size_t)(w->cols / w->group) * sn_dtype_size(w->sdtype);
    } else {
        *data = (size_t)w->cols * sn_dtype_size(w->dtype);
        *scales = 0;
    }
}

/* New owned weight made of row blocks of src: for b in [0,nblk): rows
 * [b*stride + start, +len) of src (optionally of expert e of a stack, for
 * every expert when src is a stack and out is one too). */
static sn_status gather_rows(sn_model *m, const sn_weight *src, int64_t nblk, int64_t stride, int64_t start,
                             int64_t len, sn_weight *out)
{
    size_t rd, rs;
    row_bytes(src, &rd, &rs);
    int64_t E = src->n_experts > 0 ? src->n_experts : 1;
    int64_t nrows = nblk * len;
    *out = *src;
    out->rows = nrows;
    char *d, *s = NULL, *b = NULL;
    SN_TRY(sn_model_host_alloc(m, (size_t)(E * nrows) * rd, (void **)&d));
    if (rs) {
        SN_TRY(sn_model_host_alloc(m, (size_t)(E * nrows) * rs, (void **)&s));
        SN_TRY(sn_model_host_alloc(m, (size_t)(E * nrows) * rs, (void **)&b));
    }
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < nblk; k++) {
            int64_t from = e * src->rows + k * stride + start, to = e * nrows + k * len;
            memcpy(d + (size_t)to * rd, (const char *)src->data + (size_t)from * rd, (size_t)len * rd);
            if (rs) {
                memcpy(s + (size_t)to * rs, (const char *)src->scales + (size_t)from * rs, (size_t)len * rs);
                memcpy(b + (size_t)to * rs, (const char *)src->qbiases + (size_t)from * rs, (size_t)len * rs);
            }
        }
    out->data = d;
    out->scales = s;
    out->qbiases = b;
    return SN_OK;
}

/* Raw HF fused experts: one 3-D dense tensor, no ".weight" suffix. */
static sn_status bind_fused(loader *L, const char *name, int64_t E, int64_t rows, int64_t cols, sn_weight *w)
{
    const sn_st_tensor *t = map_find(&L->map, name);
    if (!t) return SN_FAIL(SN_E_MISSING, "tensor %s is missing from the checkpoint (expected [%lld, %lld, %lld])",
                           name, (long long)E, (long long)rows, (long long)cols);
    int64_t sh[3] = { E, rows, cols };
    SN_TRY(check_dense(t, 3, sh));
    memset(w, 0, sizeof *w);
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->n_experts = E;
    w->data = t->data;
    return SN_OK;
}

static sn_status bind_one(loader *L, const sn_bind *b, int layer, char *base)
{
    sn_model *m = L->m;
    char path[400];
    snprintf(path, sizeof path, b->path, layer);
    int64_t d0 = m->dims[b->d0], d1 = m->dims[b->d1];
    void *field = base + b->off;
    bool found = false;
    switch (b->kind) {
    case BIND_LINEAR:
    case BIND_EMBED: {
        sn_weight *w = field;
        SN_TRY(bind_matrix(L, path, 0, d0, d1, b->optional, w, &found));
        if (found && b->bias) {
            char bn[420];
            snprintf(bn, sizeof bn, "%s.bias", path);
            float *bias = NULL;
            SN_TRY(vec_f32(L, bn, d0, false, &bias));
            w->bias = bias;
        }
        return SN_OK;
    }
    case BIND_LINEAR_QG: {
        /* q_proj rows per head: [query D | gate D]. Split into two matrices so
         * each projection lands contiguous, with no strided copies per step. */
        sn_weight full, *wq = field, *wg = (sn_weight *)(base + offsetof(sn_layer, wgate));
        SN_TRY(bind_matrix(L, path, 0, d0, d1, false, &full, &found));
        SN_TRY(gather_rows(m, &full, m->Hq, 2 * m->D, 0, m->D, wq));
        SN_TRY(gather_rows(m, &full, m->Hq, 2 * m->D, m->D, m->D, wg));
        return SN_OK;
    }
    case BIND_NORM:
    case BIND_GNORM: {
        char n[420];
        snprintf(n, sizeof n, "%s.weight", path);
        bool shift = b->kind == BIND_NORM && m->impl->zero_centred_norms && !m->info.mlx_layout;
        return vec_f32(L, n, d0, shift, (float **)field);
    }
    case BIND_VEC:
        return vec_f32(L, path, d0, false, (float **)field);
    case BIND_CONV: {
        char n[420];
        snprintf(n, sizeof n, "%s.weight", path);
        return conv_f32(L, n, d0, d1, (float **)field);
    }
    case BIND_EXPERTS:
        return bind_matrix(L, path, m->dims[DIM_E], d0, d1, false, (sn_weight *)field, &found);
    case BIND_FUSED_GU: {
        /* [E, 2*Im, H]: rows [0,Im) are gate, [Im,2Im) up, per expert. */
        sn_weight full;
        sn_layer *ly = (sn_layer *)base;
        SN_TRY(bind_fused(L, path, m->dims[DIM_E], d0, d1, &full));
        int64_t im = d0 / 2;
        full.rows = d0;
        SN_TRY(gather_rows(m, &full, 1, 0, 0, im, &ly->egate));
        SN_TRY(gather_rows(m, &full, 1, 0, im, im, &ly->eup));
        if (L->quantize_bits) {
            SN_TRY(quantize_weight(L, &ly->egate, path));
            SN_TRY(quantize_weight(L, &ly->eup, path));
        }
        return SN_OK;
    }
    case BIND_FUSED_DOWN: {
        sn_weight *w = field;
        SN_TRY(bind_fused(L, path, m->dims[DIM_E], d0, d1, w));
        if (L->quantize_bits) SN_TRY(quantize_weight(L, w, path));
        return SN_OK;
    }
    }
    return SN_FAIL(SN_E_INVALID, "model: bad binding kind for %s", path);
}

/* MLX or raw HF (architecture.md §0): for the hybrid models raw iff a
 * conv1d weight has its taps last; otherwise MLX iff anything is quantized. */
static bool detect_mlx(const name_map *mp, bool gdn)
{
    if (gdn)
        for (size_t i = 0; i < mp->n; i++)
            if (ends_with(mp->e[i].canon, "conv1d.weight") && mp->e[i].t->ndim == 3)
                return mp->e[i].t->shape[2] == 1;
    for (size_t i = 0; i < mp->n; i++)
        if (ends_with(mp->e[i].canon, ".scales")) return true;
    return false;
}

/* ---- RoPE tables -------------------------------------------------------- */

static sn_status rope_setup(sn_model *m)
{
    const sn_config *c = m->cfg;
    int d = m->rot_dim;
    if (d <= 0 || d % 2 || d > m->D)
        return SN_FAIL(SN_E_FORMAT, "config: rotary dimension %d does not fit head_dim %d", d, m->D);
    float *f = malloc((size_t)(d / 2) * sizeof *f);
    if (!f) return SN_FAIL(SN_E_NOMEM, "model: out of memory for rope tables");
    double theta = c->rope_theta;
    m->rope_mscale = 1.0f;
    for (int i = 0; i < d / 2; i++) f[i] = (float)(1.0 / pow(theta, (double)(2 * i) / d));
    if (c->rope.kind == SN_ROPE_LINEAR) {
        for (int i = 0; i < d / 2; i++) f[i] = (float)(f[i] / c->rope.factor);
    } else if (c->rope.kind == SN_ROPE_YARN) {
        /* transformers _compute_yarn_parameters (truncate = true). */
        double factor = c->rope.factor;
        double orig = (double)(c->rope.original_max_position ? c->rope.original_max_position
                                                              : c->max_position_embeddings);
        double bf = c->rope.beta_fast ? c->rope.beta_fast : 32, bs = c->rope.beta_slow ? c->rope.beta_slow : 1;
#define CORR(nr) ((d * log(orig / ((nr) * 2 * M_PI))) / (2 * log(theta)))
        double low = floor(CORR(bf)), high = ceil(CORR(bs));
#undef CORR
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < d / 2; i++) {
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1.0 / pow(theta, (double)(2 * i) / d), inter = extra / factor;
            double ef = 1.0 - ramp; /* extrapolation weight */
            f[i] = (float)(inter * (1 - ef) + extra * ef);
        }
        double ms = c->rope.mscale, msa = c->rope.mscale_all_dim;
#define GETM(s, mm) ((s) <= 1 ? 1.0 : 0.1 * (mm) * log(s) + 1.0)
        m->rope_mscale = (float)(ms != 0 && msa != 0 ? GETM(factor, ms) / GETM(factor, msa) : GETM(factor, 1.0));
#undef GETM
    }
    sn_status s = sn_model_be_upload(m, f, (size_t)(d / 2) * sizeof *f, &m->inv_freq);
    free(f);
    return s;
}

/* ---- workspace ---------------------------------------------------------- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static sn_status workspace_alloc(sn_model *m, const bool *bound)
{
    sn_workspace *ws = &m->ws;
    int64_t D[DIM_COUNT];
    for (int i = 0; i < DIM_COUNT; i++) D[i] = bound[i] ? m->dims[i] : 0;
    int64_t T = SN_STEP_TOKENS;
    /* slot use: attention q,gate,k,v,o | gdn qkv,z,a,b,out,gated | mlp g,u,act | moe see blocks */
    int64_t w[6] = {
        max64(max64(D[DIM_QD], D[DIM_CONV]), max64(D[DIM_I], max64(D[DIM_IM], D[DIM_IS]))),
        max64(max64(D[DIM_QD], D[DIM_VD]), max64(D[DIM_I], max64(D[DIM_IM], D[DIM_IS]))),
        max64(max64(D[DIM_KVD], D[DIM_HV]), max64(D[DIM_I], max64(D[DIM_IM], D[DIM_IS]))),
        max64(max64(D[DIM_KVD], D[DIM_HV]), max64(D[DIM_H], D[DIM_E])),
        max64(max64(D[DIM_QD], D[DIM_VD]), D[DIM_H]),
        max64(max64(D[DIM_VD], D[DIM_H]), D[DIM_KVD]),
    };
    SN_TRY(be_alloc(m, (size_t)(T * m->H) * 4, (void **)&ws->x));
    SN_TRY(be_alloc(m, (size_t)(T * m->H) * 4, (void **)&ws->xn));
    SN_TRY(be_alloc(m, (size_t)(T * m->H) * 4, (void **)&ws->y));
    for (int i = 0; i < 6; i++) {
        ws->w[i] = w[i] > 0 ? w[i] : 1;
        SN_TRY(be_alloc(m, (size_t)(T * ws->w[i]) * 4, (void **)&ws->s[i]));
    }
    SN_TRY(be_alloc(m, (size_t)(SN_LOGIT_ROWS * m->H) * 4, (void **)&ws->lg_x));
    SN_TRY(be_alloc(m, (size_t)(SN_LOGIT_ROWS * m->V) * 4, (void **)&ws->lg));
    SN_TRY(sn_model_host_alloc(m, (size_t)T * sizeof(int32_t), (void **)&ws->h_ids));
    SN_TRY(sn_model_host_alloc(m, (size_t)m->V * sizeof(float), (void **)&ws->h_lg));
    if (D[DIM_E] > 0) {
        int64_t k = m->cfg->n_experts_per_tok;
        SN_TRY(sn_model_host_alloc(m, (size_t)(T * D[DIM_E]) * sizeof(float), (void **)&ws->h_router));
        SN_TRY(sn_model_host_alloc(m, (size_t)T * sizeof(float), (void **)&ws->h_sgate));
        SN_TRY(sn_model_host_alloc(m, (size_t)(T * k) * sizeof(int32_t), (void **)&ws->h_sel));
        SN_TRY(sn_model_host_alloc(m, (size_t)(T * k) * sizeof(float), (void **)&ws->h_selw));
        SN_TRY(sn_model_host_alloc(m, (size_t)(D[DIM_E] + 1) * sizeof(int32_t), (void **)&ws->h_count));
    }
    size_t nz = (size_t)(max64(m->H, D[DIM_QD]) / 2 + 1);
    float *z = NULL;
    SN_TRY(sn_model_host_alloc(m, nz * sizeof(float), (void **)&z));
    SN_TRY(sn_model_be_upload(m, z, nz * sizeof(float), &ws->zero_freq));
    return SN_OK;
}

/* ---- load ----------------------------------------------------------------- */

static void fill_dims(sn_model *m)
{
    const sn_config *c = m->cfg;
    int64_t *D = m->dims;
    int64_t Kd = (int64_t)c->linear_num_key_heads * c->linear_key_head_dim;
    int64_t Vd = (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
    D[DIM_1] = 1;
    D[DIM_H] = c->hidden_size;
    D[DIM_V] = c->vocab_size;
    D[DIM_I] = c->intermediate_size;
    D[DIM_QD] = (int64_t)c->n_heads * c->head_dim;
    D[DIM_QGD] = 2 * D[DIM_QD];
    D[DIM_KVD] = (int64_t)c->n_kv_heads * c->head_dim;
    D[DIM_D] = c->head_dim;
    D[DIM_CONV] = 2 * Kd + Vd;
    D[DIM_VD] = Vd;
    D[DIM_HV] = c->linear_num_value_heads;
    D[DIM_DV] = c->linear_value_head_dim;
    D[DIM_K] = c->linear_conv_kernel_dim;
    D[DIM_E] = c->n_experts;
    D[DIM_IM] = c->moe_intermediate_size;
    D[DIM_IM2] = 2 * c->moe_intermediate_size;
    D[DIM_IS] = c->shared_expert_intermediate_size;
}

static sn_status upload_all(sn_model *m)
{
    sn_backend *be = m->be;
    if (!be->ops->upload_weight) return SN_OK;
    SN_TRY(be->ops->upload_weight(be, &m->embed));
    if (m->lm_head.data != m->embed.data) SN_TRY(be->ops->upload_weight(be, &m->lm_head));
    else m->lm_head.dev = m->embed.dev;
    for (int l = 0; l < m->n_layers; l++) {
        sn_layer *ly = &m->layers[l];
        sn_weight *ws[] = { &ly->wq, &ly->wgate, &ly->wk, &ly->wv, &ly->wo, &ly->in_qkv, &ly->in_z, &ly->in_b,
                            &ly->in_a, &ly->out_proj, &ly->gate, &ly->up, &ly->down, &ly->router, &ly->egate,
                            &ly->eup, &ly->edown, &ly->sgate, &ly->sup, &ly->sdown, &ly->sgate_w };
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
            if (ws[i]->data) SN_TRY(be->ops->upload_weight(be, ws[i]));
    }
    return SN_OK;
}

static void base_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    snprintf(out, cap, "%.*s", (int)(n - s), dir + s);
}

bool sn_weights_mode_parse(const char *s, sn_weights_mode *out)
{
    static const struct { const char *name; sn_weights_mode mode; } modes[] = {
        { "auto", SN_WEIGHTS_AUTO }, { "mmap", SN_WEIGHTS_MMAP }, { "copy", SN_WEIGHTS_COPY } };
    for (size_t i = 0; s && i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(s, modes[i].name)) { *out = modes[i].mode; return true; }
    return false;
}

static const char *const precision_names[] = { [SN_PRECISION_EXACT] = "exact", [SN_PRECISION_FAST] = "fast" };

bool sn_precision_parse(const char *s, sn_precision *out)
{
    for (size_t i = 0; s && i < sizeof precision_names / sizeof precision_names[0]; i++)
        if (!strcmp(s, precision_names[i])) { *out = (sn_precision)i; return true; }
    return false;
}

const char *sn_precision_name(sn_precision p)
{
    return p == SN_PRECISION_FAST ? precision_names[SN_PRECISION_FAST] : precision_names[SN_PRECISION_EXACT];
}

bool sn_weights_copy_wanted(sn_weights_mode mode, sn_backend_kind backend, size_t data_bytes, size_t avail_bytes)
{
    if (mode != SN_WEIGHTS_AUTO) return mode == SN_WEIGHTS_COPY;
    /* the CUDA backend reads the host bytes once, for the upload: a copy would only cost time */
    if (backend != SN_BACKEND_CPU || avail_bytes == 0) return false;
    const size_t spare = (size_t)SN_WEIGHTS_COPY_SPARE_MB << 20;
    return avail_bytes > spare && data_bytes <= avail_bytes - spare;
}

bool sn_weights_copy_drops_cache(size_t data_bytes, size_t avail_bytes)
{
    const size_t spare = (size_t)SN_WEIGHTS_COPY_SPARE_MB << 20;
    /* page cache + copy + spare; the halves are compared so nothing overflows */
    return data_bytes > avail_bytes / 2 || avail_bytes - 2 * data_bytes < spare;
}

/* /proc/meminfo's MemAvailable in bytes (free memory plus the page cache the
 * kernel can drop); 0 when it cannot be read */
static size_t mem_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb << 10;
}

sn_status sn_model_load(const char *dir, const sn_load_opts *opts, sn_model **out)
{
    *out = NULL;
    sn_load_opts defaults = { 0 };
    if (!opts) opts = &defaults;
    if (opts->quantize_bits != 0 && opts->quantize_bits != 4 && opts->quantize_bits != 8)
        return SN_FAIL(SN_E_INVALID, "quantize_bits must be 0, 4 or 8 (got %d)", opts->quantize_bits);
    if (opts->precision != SN_PRECISION_EXACT && opts->precision != SN_PRECISION_FAST)
        return SN_FAIL(SN_E_INVALID, "precision must be exact or fast (got %d)", (int)opts->precision);
    sn_model *m = calloc(1, sizeof *m);
    if (!m) return SN_FAIL(SN_E_NOMEM, "model: out of memory");
    pthread_mutex_init(&m->lock, NULL);
    loader L = { .m = m, .quantize_bits = opts->quantize_bits };
    sn_status s = sn_config_load_pinned(dir, opts->pins, &m->cfg);
    if (s != SN_OK) goto out;
    const sn_config *c = m->cfg;
    m->impl = sn_arch_find(c->arch);
    if (!m->impl) {
        s = SN_FAIL(SN_E_UNSUPPORTED, "%s: model_type %s is not supported", dir, c->model_type);
        goto out;
    }
    if (m->impl->check && (s = m->impl->check(c)) != SN_OK) goto out;
    /* The CUDA attention kernels hold a head in shared memory (head_dim <=
     * 256): refuse here rather than load and then fail every forward. */
    if (opts->backend == SN_BACKEND_CUDA && c->head_dim > 256) {
        s = SN_FAIL(SN_E_UNSUPPORTED, "%s: head_dim %d: the CUDA backend's attention supports at most 256", dir,
                    c->head_dim);
        goto out;
    }
    if ((s = sn_st_open_pinned(dir, opts->pins, &m->st)) != SN_OK) goto out;
    if (opts->memory_limit_mb > 0 && sn_st_data_bytes(m->st) > (size_t)opts->memory_limit_mb << 20) {
        s = SN_FAIL(SN_E_RANGE, "%s: weights take %zu MB, above the memory limit of %lld MB", dir,
                    sn_st_data_bytes(m->st) >> 20, (long long)opts->memory_limit_mb);
        goto out;
    }
    if (opts->weights != SN_WEIGHTS_AUTO && opts->weights != SN_WEIGHTS_MMAP && opts->weights != SN_WEIGHTS_COPY) {
        s = SN_FAIL(SN_E_INVALID, "weights mode %d is not AUTO, MMAP or COPY", (int)opts->weights);
        goto out;
    }
    /* before map_build: the copy moves every tensor's bytes */
    const size_t data_bytes = sn_st_data_bytes(m->st), avail = mem_available_bytes();
    if (sn_weights_copy_wanted(opts->weights, opts->backend, data_bytes, avail)) {
        s = sn_st_copy_to_memory(m->st, sn_weights_copy_drops_cache(data_bytes, avail));
        /* AUTO falls back to the mappings for what could not be copied */
        if (s != SN_OK && opts->weights == SN_WEIGHTS_COPY) goto out;
        m->info.weights_copied = s == SN_OK;
        if (s != SN_OK) sn_clear_error();
    }
    if ((s = map_build(m->st, &L.map)) != SN_OK) goto out;

    if (opts->backend == SN_BACKEND_CUDA) s = sn_backend_cuda_new(opts->gpu, &m->be);
    else s = sn_backend_cpu_new(opts->n_threads, &m->be);
    if (s != SN_OK) goto out;
    m->own_be = true;
    if (opts->precision == SN_PRECISION_FAST) {
        /* before any upload: the CUDA backend's choice decides what it repacks */
        if (!m->be->ops->set_fast) {
            s = SN_FAIL(SN_E_UNSUPPORTED, "precision fast: the %s backend has only exact products", m->be->ops->name);
            goto out;
        }
        if ((s = m->be->ops->set_fast(m->be)) != SN_OK) goto out;
    }
    m->info.precision = opts->precision;

    fill_dims(m);
    m->H = c->hidden_size;
    m->V = c->vocab_size;
    m->n_layers = c->n_layers;
    m->Hq = c->n_heads;
    m->Hkv = c->n_kv_heads;
    m->D = c->head_dim;
    m->eps = (float)c->rms_norm_eps;
    m->rot_dim = c->rotary_dim;
    m->attn_scale = (float)(1.0 / sqrt((double)m->D));
    m->gdn = (sn_gdn_dims){ c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                            c->linear_value_head_dim, c->linear_conv_kernel_dim, 1e-6f /* HF l2norm eps */ };
    m->info.mlx_layout = detect_mlx(&L.map, m->impl->gdn);
    if (L.quantize_bits && m->info.mlx_layout) L.quantize_bits = 0; /* already quantized */

    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) { s = SN_FAIL(SN_E_NOMEM, "model: out of memory for layers"); goto out; }
    for (int l = 0; l < m->n_layers; l++) m->layers[l].kind = c->layer_kind[l];
    if ((s = rope_setup(m)) != SN_OK) goto out;

    for (size_t i = 0; i < m->impl->n_binds; i++) {
        const sn_bind *b = &m->impl->binds[i];
        if (b->layout == LAYOUT_MLX && !m->info.mlx_layout) continue;
        if (b->layout == LAYOUT_HF && m->info.mlx_layout) continue;
        if (b->on == ON_GLOBAL) {
            if ((s = bind_one(&L, b, 0, (char *)m)) != SN_OK) goto out;
            L.bound[b->d0] = L.bound[b->d1] = true;
            continue;
        }
        for (int l = 0; l < m->n_layers; l++) {
            int k = m->layers[l].kind == SN_LAYER_LINEAR ? ON_LINEAR : ON_ATTN;
            if (!(b->on & k)) continue;
            if ((s = bind_one(&L, b, l, (char *)&m->layers[l])) != SN_OK) goto out;
            L.bound[b->d0] = L.bound[b->d1] = true;
            if (opts->progress)
                opts->progress(opts->progress_ud, 0.9 * (double)(i * (size_t)m->n_layers + (size_t)l + 1) /
                                                      (double)(m->impl->n_binds * (size_t)m->n_layers));
        }
    }
    if (!m->lm_head.data) m->lm_head = m->embed; /* tied embeddings */
    if ((s = upload_all(m)) != SN_OK) goto out;
    /* The binds read (quantized, repacked) and the upload copied bytes from
     * the maps: a shard written to during that would not show at open time. */
    if (opts->pins && (s = sn_st_recheck_pins(m->st, opts->pins)) != SN_OK) goto out;
    /* QGD = 2*QD and IM2 = 2*IM: a bound one confirms the other */
    L.bound[DIM_QD] |= L.bound[DIM_QGD];
    L.bound[DIM_IM] |= L.bound[DIM_IM2];
    if ((s = workspace_alloc(m, L.bound)) != SN_OK) goto out;

    if (opts->progress) opts->progress(opts->progress_ud, 1.0);
    base_name(dir, m->name, sizeof m->name);
    snprintf(m->model_type, sizeof m->model_type, "%s", sn_arch_name(c->arch));
    sn_model_info *in = &m->info;
    in->model_type = m->model_type;
    in->name = m->name;
    in->vocab_size = (int)m->V;
    in->hidden_size = (int)m->H;
    in->n_layers = m->n_layers;
    in->max_ctx = (int)(c->max_position_embeddings > 0x7fffffff ? 0x7fffffff : c->max_position_embeddings);
    in->n_eos = c->n_eos < 8 ? c->n_eos : 8;
    for (int i = 0; i < in->n_eos; i++) in->eos_ids[i] = c->eos_ids[i];
    in->bos_id = c->bos_token_id;
    in->weight_bytes = (int64_t)sn_st_data_bytes(m->st);
    s = SN_OK;
out:
    map_free(&L.map);
    if (s != SN_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sn_errmsg());
        sn_model_free(m);
        sn_fail_at(s, __FILE__, __LINE__, "%s", msg);
        return s;
    }
    *out = m;
    return SN_OK;
}

void sn_model_free(sn_model *m)
{
    if (!m) return;
    if (m->be) {
        for (size_t i = 0; i < m->n_be; i++) m->be->ops->buf_free(m->be, m->be_blocks[i]);
        if (m->own_be) sn_backend_free(m->be);
    }
    free(m->be_blocks);
    free(m->ahead.kv);
    free(m->ahead.gdn);
    for (size_t i = 0; i < m->n_host; i++) free(m->host_blocks[i]);
    free(m->host_blocks);
    free(m->layers);
    sn_st_close(m->st);
    sn_config_free(m->cfg);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

const sn_model_info *sn_model_get_info(const sn_model *m) { return &m->info; }
