/* The CPU backend: validates every op's arguments, picks the kernel table
 * for the CPU (or SANCTUM_CPU), and splits work over the thread pool.
 *
 * Memory is plain host memory; weights stay views into the checkpoint mmap
 * (upload_weight only validates). One scratch buffer, grown on demand and
 * reused, holds per-call temporaries (rearranged activations, GDN conv
 * output), so steady-state decode allocates nothing. A backend is used by
 * one thread at a time (that is the engine's model: one step at a time). */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "sanctum/threadpool.h"

static cpu_be *be_of(sn_backend *b) { return (cpu_be *)b; }

sn_status cpu_scratch_get(cpu_be *be, size_t n_floats, float **out)
{
    if (n_floats > be->scratch_cap) {
        size_t bytes = (n_floats * sizeof(float) + 63) & ~(size_t)63;
        float *p = aligned_alloc(64, bytes);
        if (!p)
            return SN_FAIL(SN_E_NOMEM, "cpu backend scratch: %zu bytes", bytes);
        free(be->scratch);
        be->scratch = p;
        be->scratch_cap = bytes / sizeof(float);
    }
    *out = be->scratch;
    return SN_OK;
}

/* ---------------- memory ---------------- */

static void cpu_destroy(sn_backend *b)
{
    cpu_be *be = be_of(b);
    sn_pool_free(be->pool);
    free(be->scratch);
    free(be->moe_seg);
    free(be);
}

static sn_status cpu_buf_alloc(sn_backend *b, size_t bytes, void **out)
{
    /* 64-byte aligned so every row the kernels touch starts on a cache line
     * when the row size allows it; size rounded up as aligned_alloc needs. */
    size_t n = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    if (n < bytes)
        return SN_FAIL(SN_E_NOMEM, "cpu buffer of %zu bytes: size overflow", bytes);
    *out = aligned_alloc(64, n);
    if (!*out)
        return SN_FAIL(SN_E_NOMEM, "cpu buffer of %zu bytes", bytes);
    return SN_OK;
}

static void cpu_buf_free(sn_backend *b, void *p) { free(p); }

static sn_status cpu_copy(sn_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes && (!dst || !src))
        return SN_FAIL(SN_E_INVALID, "copy: NULL buffer");
    if (bytes)
        memmove(dst, src, bytes);
    return SN_OK;
}

static sn_status cpu_memset0(sn_backend *b, void *dst, size_t bytes)
{
    if (bytes && !dst)
        return SN_FAIL(SN_E_INVALID, "memset0: NULL buffer");
    if (bytes)
        memset(dst, 0, bytes);
    return SN_OK;
}

static sn_status cpu_sync(sn_backend *b) { return SN_OK; }

/* ---------------- weights ---------------- */

sn_status cpu_mat_resolve(const sn_weight *w, int expert, cpu_mat *m)
{
    if (!w || !w->data)
        return SN_FAIL(SN_E_INVALID, "matmul: weight without data");
    if (w->rows <= 0 || w->cols <= 0 || w->rows > INT32_MAX || w->cols > INT32_MAX)
        return SN_FAIL(SN_E_SHAPE, "weight [%lld, %lld]: rows and cols must be in [1, 2^31)",
                       (long long)w->rows, (long long)w->cols);
    if (w->n_experts < 0 || w->n_experts > (1 << 20))
        return SN_FAIL(SN_E_SHAPE, "weight: n_experts %lld out of range", (long long)w->n_experts);
    int64_t E = w->n_experts ? w->n_experts : 1;
    if (expert < 0 || expert >= E)
        return SN_FAIL(SN_E_RANGE, "weight [%lld, %lld]: expert %d out of [0, %lld)", (long long)w->rows,
                       (long long)w->cols, expert, (long long)E);
    memset(m, 0, sizeof *m);
    m->dtype = w->dtype;
    m->rows = w->rows;
    m->cols = w->cols;
    switch (w->dtype) {
    case SN_DT_F32: m->row_bytes = 4 * (size_t)w->cols; break;
    case SN_DT_F16:
    case SN_DT_BF16: m->row_bytes = 2 * (size_t)w->cols; break;
    case SN_DT_Q4:
    case SN_DT_Q8: {
        m->bits = w->dtype == SN_DT_Q4 ? 4 : 8;
        int per_word = 32 / m->bits;
        if (w->group <= 0 || w->group % per_word != 0 || w->cols % w->group != 0)
            return SN_FAIL(SN_E_SHAPE, "%s weight [%lld, %lld]: group %d must divide cols and be a multiple of %d",
                           sn_dtype_name(w->dtype), (long long)w->rows, (long long)w->cols, w->group, per_word);
        if (!w->scales || !w->qbiases)
            return SN_FAIL(SN_E_MISSING, "%s weight [%lld, %lld]: scales or biases missing",
                           sn_dtype_name(w->dtype), (long long)w->rows, (long long)w->cols);
        if (w->sdtype != SN_DT_BF16 && w->sdtype != SN_DT_F16 && w->sdtype != SN_DT_F32)
            return SN_FAIL(SN_E_UNSUPPORTED, "%s weight: scales dtype %s (need BF16, F16 or F32)",
                           sn_dtype_name(w->dtype), sn_dtype_name(w->sdtype));
        m->group = w->group;
        m->n_groups = w->cols / w->group;
        m->row_bytes = (size_t)w->cols * m->bits / 8;
        m->sdtype = w->sdtype;
        m->s_size = w->sdtype == SN_DT_F32 ? 4 : 2;
        size_t sbytes = (size_t)w->rows * m->n_groups * m->s_size;
        m->scales = (const uint8_t *)w->scales + (size_t)expert * sbytes;
        m->qbiases = (const uint8_t *)w->qbiases + (size_t)expert * sbytes;
        break;
    }
    default:
        return SN_FAIL(SN_E_UNSUPPORTED, "matmul: weight dtype %s (need F32, F16, BF16, Q4 or Q8)",
                       sn_dtype_name(w->dtype));
    }
    m->data = (const uint8_t *)w->data + (size_t)expert * (size_t)w->rows * m->row_bytes;
    return SN_OK;
}

static sn_status cpu_upload_weight(sn_backend *b, sn_weight *w)
{
    cpu_mat m;
    return cpu_mat_resolve(w, 0, &m); /* used in place: nothing to copy */
}

/* ---------------- matmul ---------------- */

void cpu_mm_plan_for(const cpu_be *be, const cpu_mat *m, cpu_mm_plan *p)
{
    const cpu_kernels *k = be->k;
    bool quant = m->bits != 0;
    if (quant && m->group % k->min_group != 0)
        k = &cpu_kernels_ref; /* an unusual group: the oracle is still correct */
    p->fn = m->dtype == SN_DT_Q4 ? k->mm_q4 : m->dtype == SN_DT_Q8 ? k->mm_q8 : k->mm_dense;
    p->prep = !quant ? NULL : m->dtype == SN_DT_Q4 ? k->prep_q4 : k->prep_q8;
    p->gsum = quant && k->wants_gsum;
    int gi = m->group == 32 ? 0 : m->group == 64 ? 1 : m->group == 128 ? 2 : -1;
    /* the opt-in 8-bit activation kernel exists for AVX2 and AVX-512 with
     * VNNI; an AVX-512 host without VNNI (which has the AVX2 set) runs the
     * AVX2 one, so the knob means the same everywhere instead of silently
     * falling back to the default path */
    const cpu_kernels *kq8 = k->mm_q4x8 ? k : k->isa == SN_ISA_AVX512 ? &cpu_kernels_avx2 : NULL;
    if (m->dtype == SN_DT_Q4 && gi >= 0 && be->q4_mode == CPU_Q4_Q8 && kq8 && m->group % kq8->min_group == 0) {
        /* opt-in 8-bit activations: its x records carry the group sums */
        p->fn = kq8->mm_q4x8;
        p->prep = kq8->prep_q4x8[gi];
        p->gsum = 0;
    } else if (m->dtype == SN_DT_Q4 && k->mm_q4i && gi >= 0 && be->q4_mode != CPU_Q4_FP32) {
        /* exact integer Q4 path: its x records carry the group sums */
        p->fn = k->mm_q4i;
        p->prep = k->prep_q4i[gi];
        p->gsum = 0;
    }
    p->pf_off = be->pf_rows * (int64_t)m->row_bytes;
    /* Prefill row tile: ~512 KB of weights (half a Zen 4 L2, a quarter of a
     * Sapphire Rapids L2), at least 16 rows. Every tile re-reads all of x,
     * so the tile size sets x traffic: 16-row tiles made a 64-token
     * 17408-column GEMM move 4.4 MB of x per 16 rows. */
    size_t wrow = m->row_bytes + (quant ? 2 * (size_t)m->n_groups * m->s_size : 0);
    int64_t tile = (int64_t)((512u << 10) / wrow);
    p->row_tile = tile < 16 ? 16 : tile > 1024 ? 1024 : tile;
}

size_t cpu_mm_prep_floats(const cpu_mm_plan *p, const cpu_mat *m, int64_t T)
{
    return (p->prep ? (size_t)T * m->cols : 0) + (p->gsum ? (size_t)T * m->n_groups : 0);
}

void cpu_mm_prep_rows(const cpu_mm_plan *p, const cpu_mat *m, const float *x, int64_t t0, int64_t t1, float *xp,
                      float *gsum)
{
    for (int64_t t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * m->cols;
        if (p->prep)
            p->prep(xt, m->cols, xp + (size_t)t * m->cols);
        if (p->gsum) {
            for (int64_t g = 0; g < m->n_groups; g++) {
                float s = 0.0f;
                for (int i = 0; i < m->group; i++)
                    s += xt[g * m->group + i];
                gsum[(size_t)t * m->n_groups + g] = s;
            }
        }
    }
}

void cpu_mm_run_rows(const cpu_mm_plan *p, const cpu_mm_args *a, const float *bias, int64_t r0, int64_t r1)
{
    p->fn(a, r0, r1);
    if (bias) {
        int64_t rows = a->m->rows;
        for (int t = 0; t < a->T; t++)
            for (int64_t r = r0; r < r1; r++)
                a->y[(size_t)t * rows + r] += bias[r];
    }
}

/* ---------------- matmul ---------------- */

typedef struct {
    cpu_mm_plan plan;
    cpu_mm_args a;
    const float *bias;
    float *xp, *gsum;
} mm_job;

static void mm_prep_body(void *ctx, int64_t t0, int64_t t1, int tid)
{
    mm_job *j = ctx;
    cpu_mm_prep_rows(&j->plan, j->a.m, j->a.x, t0, t1, j->xp, j->gsum);
}

static void mm_body(void *ctx, int64_t r0, int64_t r1, int tid)
{
    mm_job *j = ctx;
    cpu_mm_run_rows(&j->plan, &j->a, j->bias, r0, r1);
}

static sn_status cpu_matmul(sn_backend *b, const sn_weight *w, int expert, const float *x, int T, float *y)
{
    cpu_be *be = be_of(b);
    cpu_mat m;
    SN_TRY(cpu_mat_resolve(w, expert, &m));
    if (T < 0)
        return SN_FAIL(SN_E_INVALID, "matmul: T=%d", T);
    if (T == 0)
        return SN_OK;
    if (!x || !y)
        return SN_FAIL(SN_E_INVALID, "matmul: NULL activation");
    mm_job j = { .bias = w->bias };
    cpu_mm_plan_for(be, &m, &j.plan);
    j.a = (cpu_mm_args){ .m = &m, .x = x, .T = T, .y = y, .pf_off = j.plan.pf_off, .row_tile = j.plan.row_tile };
    size_t need = cpu_mm_prep_floats(&j.plan, &m, T);
    if (need) {
        float *s;
        SN_TRY(cpu_scratch_get(be, need, &s));
        j.xp = j.plan.prep ? s : NULL;
        j.gsum = j.plan.gsum ? s + (j.plan.prep ? (size_t)T * m.cols : 0) : NULL;
        sn_pool_for(be->pool, T, (1 << 14) / m.cols + 1, mm_prep_body, &j);
        j.a.xp = j.xp;
        j.a.gsum = j.gsum;
    }
    sn_pool_for(be->pool, m.rows, cpu_mm_grain(be, &m, T), mm_body, &j);
    return SN_OK;
}

/* Enough work per chunk (~64K multiply-adds) that scheduling is noise.
 * Prefill rows all cost the same: two chunks per thread (a late thread's
 * second chunk can still be taken by another) keep the chunks, and so the
 * row tiles inside them, large. */
int64_t cpu_mm_grain(const cpu_be *be, const cpu_mat *m, int64_t T)
{
    int64_t grain = (1 << 16) / (m->cols * T) + 1;
    if (T > 1) {
        int64_t half = (m->rows + 2 * sn_pool_size(be->pool) - 1) / (2 * sn_pool_size(be->pool));
        grain = half > grain ? half : grain;
    }
    return grain;
}

/* ---------------- embed ---------------- */

typedef struct {
    const cpu_mat *m;
    const int32_t *ids;
    float *y;
} embed_job;

static void embed_body(void *ctx, int64_t t0, int64_t t1, int tid)
{
    embed_job *j = ctx;
    for (int64_t t = t0; t < t1; t++)
        cpu_ref_dequant_row(j->m, j->ids[t], j->y + (size_t)t * j->m->cols);
}

static sn_status cpu_embed(sn_backend *b, const sn_weight *w, const int32_t *ids, int T, float *y)
{
    cpu_mat m;
    SN_TRY(cpu_mat_resolve(w, 0, &m));
    if (w->n_experts)
        return SN_FAIL(SN_E_SHAPE, "embed: weight is an expert stack");
    if (T < 0 || (T > 0 && (!ids || !y)))
        return SN_FAIL(SN_E_INVALID, "embed: bad arguments (T=%d)", T);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m.rows)
            return SN_FAIL(SN_E_RANGE, "embed: token id %d at position %d out of [0, %lld)", ids[t], t,
                           (long long)m.rows);
    embed_job j = { &m, ids, y };
    sn_pool_for(be_of(b)->pool, T, (1 << 15) / m.cols + 1, embed_body, &j);
    return SN_OK;
}

/* ---------------- norms and elementwise ---------------- */

typedef struct {
    const cpu_kernels *k;
    const float *x, *z, *w;
    float *y;
    int n;
    float eps;
} norm_job;

static void rmsnorm_body(void *ctx, int64_t r0, int64_t r1, int tid)
{
    norm_job *j = ctx;
    cpu_op_rmsnorm_rows(j->k, j->x, j->w, r0, r1, j->n, j->eps, j->y);
}

static void gated_body(void *ctx, int64_t r0, int64_t r1, int tid)
{
    norm_job *j = ctx;
    cpu_op_gated_rmsnorm_rows(j->k, j->x, j->z, j->w, r0, r1, j->n, j->eps, j->y);
}

static sn_status norm_check(const char *op, const float *x, const float *w, int rows, int n, float eps, float *y)
{
    if (rows < 0 || n <= 0 || !(eps >= 0.0f))
        return SN_FAIL(SN_E_INVALID, "%s: rows=%d n=%d eps=%g", op, rows, n, (double)eps);
    if (rows > 0 && (!x || !w || !y))
        return SN_FAIL(SN_E_INVALID, "%s: NULL buffer", op);
    return SN_OK;
}

static sn_status cpu_rmsnorm(sn_backend *b, const float *x, const float *w, int rows, int n, float eps, float *y)
{
    SN_TRY(norm_check("rmsnorm", x, w, rows, n, eps, y));
    norm_job j = { be_of(b)->k, x, NULL, w, y, n, eps };
    sn_pool_for(be_of(b)->pool, rows, (1 << 14) / n + 1, rmsnorm_body, &j);
    return SN_OK;
}

static sn_status cpu_gated_rmsnorm(sn_backend *b, const float *o, const float *z, const float *w, int rows, int n,
                                   float eps, float *y)
{
    SN_TRY(norm_check("gated_rmsnorm", o, w, rows, n, eps, y));
    if (rows > 0 && !z)
        return SN_FAIL(SN_E_INVALID, "gated_rmsnorm: NULL gate");
    norm_job j = { be_of(b)->k, o, z, w, y, n, eps };
    sn_pool_for(be_of(b)->pool, rows, (1 << 12) / n + 1, gated_body, &j);
    return SN_OK;
}

typedef struct {
    int op; /* 0 add, 1 swiglu, 2 mul_sigmoid */
    float *y;
    const float *a, *b;
} ew_job;

static void ew_body(void *ctx, int64_t i0, int64_t i1, int tid)
{
    ew_job *j = ctx;
    switch (j->op) {
    case 0: cpu_op_add(j->y, j->a, i0, i1); break;
    case 1: cpu_op_swiglu(j->a, j->b, i0, i1, j->y); break;
    default: cpu_op_mul_sigmoid(j->y, j->a, i0, i1); break;
    }
}

/* Small vectors (decode) are not worth a wake-up of the workers. */
static void ew_run(cpu_be *be, ew_job *j, size_t n, int64_t grain)
{
    sn_pool_for(be->pool, (int64_t)n, grain, ew_body, j);
}

static sn_status cpu_add(sn_backend *b, float *y, const float *x, size_t n)
{
    if (n && (!y || !x))
        return SN_FAIL(SN_E_INVALID, "add: NULL buffer");
    ew_job j = { 0, y, x, NULL };
    ew_run(be_of(b), &j, n, 1 << 16);
    return SN_OK;
}

static sn_status cpu_swiglu(sn_backend *b, const float *gate, const float *up, size_t n, float *out)
{
    if (n && (!gate || !up || !out))
        return SN_FAIL(SN_E_INVALID, "swiglu: NULL buffer");
    ew_job j = { 1, out, gate, up };
    ew_run(be_of(b), &j, n, 1 << 13);
    return SN_OK;
}

static sn_status cpu_mul_sigmoid(sn_backend *b, float *y, const float *gate, size_t n)
{
    if (n && (!y || !gate))
        return SN_FAIL(SN_E_INVALID, "mul_sigmoid: NULL buffer");
    ew_job j = { 2, y, gate, NULL };
    ew_run(be_of(b), &j, n, 1 << 13);
    return SN_OK;
}

/* ---------------- rope ---------------- */

typedef struct {
    float *x;
    int n_heads, head_dim, rot_dim, pos0;
    const float *inv_freq;
    float mscale;
} rope_job;

static void rope_body(void *ctx, int64_t t0, int64_t t1, int tid)
{
    rope_job *j = ctx;
    cpu_op_rope_tokens(j->x, t0, t1, j->n_heads, j->head_dim, j->rot_dim, j->pos0, j->inv_freq, j->mscale);
}

static sn_status cpu_rope(sn_backend *b, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                          const float *inv_freq, float mscale)
{
    if (T < 0 || n_heads <= 0 || head_dim <= 0 || rot_dim < 0 || rot_dim > head_dim || rot_dim % 2 || pos0 < 0)
        return SN_FAIL(SN_E_INVALID, "rope: T=%d heads=%d head_dim=%d rot_dim=%d pos0=%d", T, n_heads, head_dim,
                       rot_dim, pos0);
    if (T > 0 && (!x || (rot_dim > 0 && !inv_freq)))
        return SN_FAIL(SN_E_INVALID, "rope: NULL buffer");
    rope_job j = { x, n_heads, head_dim, rot_dim, pos0, inv_freq, mscale };
    sn_pool_for(be_of(b)->pool, T, (1 << 13) / ((int64_t)n_heads * rot_dim + 1) + 1, rope_body, &j);
    return SN_OK;
}

/* ---------------- attention ---------------- */

static sn_status kv_check(const char *op, const sn_kv_view *kv, int T, int pos0)
{
    if (!kv || !kv->k || !kv->v || kv->max_ctx <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0)
        return SN_FAIL(SN_E_INVALID, "%s: bad kv cache view", op);
    if (T < 0 || pos0 < 0 || (int64_t)pos0 + T > kv->max_ctx)
        return SN_FAIL(SN_E_RANGE, "%s: positions [%d, %lld) outside the cache of %d", op, pos0,
                       (long long)pos0 + T, kv->max_ctx);
    return SN_OK;
}

typedef struct {
    const cpu_kernels *k;
    const float *q;
    const sn_kv_view *kv;
    int pos0, n_q_heads, G, n_chunks;
    float scale;
    float *out;
    float *part;     /* decode: [Hkv][n_chunks] partials; prefill: one per thread */
    size_t part_sz;  /* floats per partial: G*D + 2*G */
} attn_job;

/* Prefill: item = (token, kv head), its chunks one after the other. */
static void attn_seq_body(void *ctx, int64_t i0, int64_t i1, int tid)
{
    attn_job *j = ctx;
    int Hkv = j->kv->n_kv_heads, D = j->kv->head_dim, G = j->G;
    float *o = j->part + (size_t)tid * j->part_sz, *m = o + (size_t)G * D, *l = m + G;
    for (int64_t i = i0; i < i1; i++) {
        int t = (int)(i / Hkv), kvh = (int)(i % Hkv), n = j->pos0 + t + 1;
        float *O = j->out + ((size_t)t * j->n_q_heads + (size_t)kvh * G) * D;
        float M[CPU_ATTN_MAX_GROUP], L[CPU_ATTN_MAX_GROUP];
        cpu_op_attn_init(G, D, O, M, L);
        for (int j0 = 0; j0 < n; j0 += CPU_ATTN_CHUNK) {
            int j1 = j0 + CPU_ATTN_CHUNK < n ? j0 + CPU_ATTN_CHUNK : n;
            cpu_op_attn_chunk(j->k, j->q, j->kv, t, kvh, G, j->n_q_heads, j0, j1, j->scale, o, m, l);
            cpu_op_attn_merge(j->k, G, D, o, m, l, O, M, L);
        }
        cpu_op_attn_finish(j->k, G, D, O, L);
    }
}

/* Decode (T == 1): item = chunk, every kv head's partial of it (one pass
 * over the chunk's keys, cpu_op_attn_chunk_heads) to scratch... */
static void attn_chunk_body(void *ctx, int64_t i0, int64_t i1, int tid)
{
    attn_job *j = ctx;
    int n = j->pos0 + 1;
    for (int64_t c = i0; c < i1; c++) {
        int j0 = (int)c * CPU_ATTN_CHUNK, j1 = j0 + CPU_ATTN_CHUNK < n ? j0 + CPU_ATTN_CHUNK : n;
        cpu_op_attn_chunk_heads(j->k, j->q, j->kv, 0, j->G, j->n_q_heads, j0, j1, j->scale,
                                j->part + (size_t)c * j->part_sz, (size_t)j->n_chunks * j->part_sz);
    }
}

/* ... then merged per kv head in chunk order, as the prefill path does. */
static void attn_merge_body(void *ctx, int64_t h0, int64_t h1, int tid)
{
    attn_job *j = ctx;
    int D = j->kv->head_dim, G = j->G;
    for (int64_t kvh = h0; kvh < h1; kvh++) {
        float *O = j->out + (size_t)kvh * G * D;
        float M[CPU_ATTN_MAX_GROUP], L[CPU_ATTN_MAX_GROUP];
        cpu_op_attn_init(G, D, O, M, L);
        for (int c = 0; c < j->n_chunks; c++) {
            const float *o = j->part + ((size_t)kvh * j->n_chunks + c) * j->part_sz;
            cpu_op_attn_merge(j->k, G, D, o, o + (size_t)G * D, o + (size_t)G * D + G, O, M, L);
        }
        cpu_op_attn_finish(j->k, G, D, O, L);
    }
}

static sn_status cpu_attention(sn_backend *b, const float *q, const sn_kv_view *kv, int T, int pos0, int n_q_heads,
                               float scale, float *out)
{
    cpu_be *be = be_of(b);
    SN_TRY(kv_check("attention", kv, T, pos0));
    if (n_q_heads <= 0 || n_q_heads % kv->n_kv_heads != 0)
        return SN_FAIL(SN_E_SHAPE, "attention: %d query heads not a multiple of %d kv heads", n_q_heads,
                       kv->n_kv_heads);
    int G = n_q_heads / kv->n_kv_heads, D = kv->head_dim, Hkv = kv->n_kv_heads;
    if (G > CPU_ATTN_MAX_GROUP)
        return SN_FAIL(SN_E_UNSUPPORTED, "attention: %d query heads per kv head (max %d)", G, CPU_ATTN_MAX_GROUP);
    if (T == 0)
        return SN_OK;
    if (!q || !out)
        return SN_FAIL(SN_E_INVALID, "attention: NULL buffer");
    attn_job j = { .k = be->k, .q = q, .kv = kv, .pos0 = pos0, .n_q_heads = n_q_heads, .G = G, .scale = scale,
                   .out = out, .part_sz = (size_t)G * D + 2 * (size_t)G };
    int64_t per_key = (int64_t)G * D;
    if (T == 1) {
        j.n_chunks = (pos0 + CPU_ATTN_CHUNK) / CPU_ATTN_CHUNK; /* ceil((pos0+1)/CHUNK) */
        SN_TRY(cpu_scratch_get(be, (size_t)Hkv * j.n_chunks * j.part_sz, &j.part));
        sn_pool_for(be->pool, j.n_chunks, (1 << 14) / (per_key * Hkv * CPU_ATTN_CHUNK) + 1, attn_chunk_body, &j);
        sn_pool_for(be->pool, Hkv, 1, attn_merge_body, &j);
        return SN_OK;
    }
    SN_TRY(cpu_scratch_get(be, (size_t)sn_pool_size(be->pool) * j.part_sz, &j.part));
    /* Items cost in proportion to their position: dynamic chunks absorb that. */
    sn_pool_for(be->pool, (int64_t)T * Hkv, (1 << 14) / (per_key * ((int64_t)pos0 + 1)) + 1, attn_seq_body, &j);
    return SN_OK;
}

static sn_status cpu_kv_write(sn_backend *b, const sn_kv_view *kv, const float *k, const float *v, int T, int pos0)
{
    SN_TRY(kv_check("kv_write", kv, T, pos0));
    if (T > 0 && (!k || !v))
        return SN_FAIL(SN_E_INVALID, "kv_write: NULL buffer");
    size_t row = (size_t)kv->n_kv_heads * kv->head_dim;
    memcpy(kv->k + (size_t)pos0 * row, k, sizeof(float) * row * T);
    memcpy(kv->v + (size_t)pos0 * row, v, sizeof(float) * row * T);
    return SN_OK;
}

/* ---------------- GatedDeltaNet ---------------- */

typedef struct {
    const cpu_kernels *k;
    cpu_gdn_job g;
} gdn_ctx;

static void gdn_conv_body(void *ctx, int64_t c0, int64_t c1, int tid)
{
    cpu_op_gdn_conv(&((gdn_ctx *)ctx)->g, c0, c1);
}

static void gdn_l2_body(void *ctx, int64_t v0, int64_t v1, int tid)
{
    gdn_ctx *c = ctx;
    cpu_op_gdn_l2norm(c->k, &c->g, v0, v1);
}

static void gdn_head_body(void *ctx, int64_t h0, int64_t h1, int tid)
{
    gdn_ctx *c = ctx;
    for (int64_t h = h0; h < h1; h++)
        cpu_op_gdn_head(c->k, &c->g, (int)h);
}

static sn_status cpu_gdn(sn_backend *b, const sn_gdn_dims *d, const float *qkv, const float *a, const float *bb,
                         const float *conv_w, const float *A_log, const float *dt_bias, sn_gdn_view *st, int T,
                         float *out)
{
    cpu_be *be = be_of(b);
    if (!d || d->n_k_heads <= 0 || d->n_v_heads <= 0 || d->dk <= 0 || d->dv <= 0 || d->conv_k <= 0)
        return SN_FAIL(SN_E_INVALID, "gdn: bad dims");
    if (d->n_v_heads % d->n_k_heads != 0)
        return SN_FAIL(SN_E_SHAPE, "gdn: %d value heads not a multiple of %d key heads", d->n_v_heads,
                       d->n_k_heads);
    if (d->dv > CPU_GDN_MAX_DV || d->conv_k > CPU_GDN_MAX_CONV_K)
        return SN_FAIL(SN_E_UNSUPPORTED, "gdn: dv=%d (max %d) conv_k=%d (max %d)", d->dv, CPU_GDN_MAX_DV,
                       d->conv_k, CPU_GDN_MAX_CONV_K);
    if (T < 0)
        return SN_FAIL(SN_E_INVALID, "gdn: T=%d", T);
    if (!st || !st->S || (d->conv_k > 1 && !st->conv))
        return SN_FAIL(SN_E_INVALID, "gdn: missing state");
    if (st->hist && st->n_hist < 0)
        return SN_FAIL(SN_E_INVALID, "gdn: history of %d slots", st->n_hist);
    if (T == 0)
        return SN_OK;
    if (!qkv || !a || !bb || !conv_w || !A_log || !dt_bias || !out)
        return SN_FAIL(SN_E_INVALID, "gdn: NULL buffer");
    int64_t key_dim = (int64_t)d->n_k_heads * d->dk;
    int64_t conv_dim = 2 * key_dim + (int64_t)d->n_v_heads * d->dv;
    if (conv_dim > INT32_MAX)
        return SN_FAIL(SN_E_SHAPE, "gdn: conv_dim %lld too large", (long long)conv_dim);
    gdn_ctx c = { .k = be->k };
    c.g = (cpu_gdn_job){ .d = d, .conv_dim = (int)conv_dim, .key_dim = (int)key_dim, .T = T,
                         .l2_eps = d->norm_eps > 0.0f ? d->norm_eps : 1e-6f, .qkv = qkv, .a = a, .b = bb,
                         .conv_w = conv_w, .A_log = A_log, .dt_bias = dt_bias, .st = st, .out = out };
    SN_TRY(cpu_scratch_get(be, (size_t)T * conv_dim, &c.g.c));
    sn_pool_for(be->pool, conv_dim, (1 << 13) / ((int64_t)T * d->conv_k) + 16, gdn_conv_body, &c);
    sn_pool_for(be->pool, 2 * (int64_t)T * d->n_k_heads, (1 << 12) / d->dk + 1, gdn_l2_body, &c);
    sn_pool_for(be->pool, d->n_v_heads, 1, gdn_head_body, &c);
    return SN_OK;
}

/* ---------------- copy_n (optional op) ---------------- */

static sn_status cpu_copy_n(sn_backend *b, int n, void *const *dst, const void *const *src, const size_t *bytes)
{
    (void)b;
    if (n < 0 || (n > 0 && (!dst || !src || !bytes)))
        return SN_FAIL(SN_E_INVALID, "copy_n: %d copies", n);
    for (int i = 0; i < n; i++) {
        if (!bytes[i]) continue;
        if (!dst[i] || !src[i]) return SN_FAIL(SN_E_INVALID, "copy_n: copy %d has a NULL buffer", i);
        memmove(dst[i], src[i], bytes[i]);
    }
    return SN_OK;
}

/* ---------------- argmax (optional op) ---------------- */

typedef struct {
    const float *x;
    int n;
    int32_t *out;
    int all_nan; /* set (racy but idempotent) when some row has no number */
} argmax_job;

static void argmax_body(void *ctx, int64_t r0, int64_t r1, int tid)
{
    argmax_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * j->n;
        int best = -1;
        for (int i = 0; i < j->n; i++)
            if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
                best = i; /* strict >: the first maximum wins ties */
        j->out[r] = best;
        if (best < 0)
            __atomic_store_n(&j->all_nan, 1, __ATOMIC_RELAXED);
    }
}

static sn_status cpu_argmax(sn_backend *b, const float *x, int rows, int n, int32_t *out)
{
    if (rows < 0 || n <= 0 || (rows > 0 && (!x || !out)))
        return SN_FAIL(SN_E_INVALID, "argmax: rows=%d n=%d", rows, n);
    argmax_job j = { x, n, out, 0 };
    sn_pool_for(be_of(b)->pool, rows, 1, argmax_body, &j);
    if (j.all_nan)
        return SN_FAIL(SN_E_RANGE, "argmax: a row of %d values is all NaN", n);
    return SN_OK;
}

/* ---------------- construction ---------------- */

/* --precision fast: the 8-bit activation kernels for Q4 weights (the table
 * falls back to the exact ones where it has none) */
static sn_status cpu_set_fast(sn_backend *b)
{
    ((cpu_be *)b)->q4_mode = CPU_Q4_Q8;
    return SN_OK;
}

#define CPU_OPS(NAME)                                                                                       \
    {                                                                                                        \
        .name = NAME, .destroy = cpu_destroy, .buf_alloc = cpu_buf_alloc, .buf_free = cpu_buf_free,         \
        .copy = cpu_copy, .to_host = cpu_copy, .from_host = cpu_copy, .memset0 = cpu_memset0,               \
        .upload_weight = cpu_upload_weight, .sync = cpu_sync, .matmul = cpu_matmul, .embed = cpu_embed,     \
        .rmsnorm = cpu_rmsnorm, .add = cpu_add, .swiglu = cpu_swiglu, .rope = cpu_rope,                     \
        .attention = cpu_attention, .kv_write = cpu_kv_write, .gdn = cpu_gdn,                               \
        .gated_rmsnorm = cpu_gated_rmsnorm, .mul_sigmoid = cpu_mul_sigmoid, .argmax = cpu_argmax,           \
        .moe = cpu_moe, .add_gated = cpu_add_gated, .copy_n = cpu_copy_n, .set_fast = cpu_set_fast,         \
    }

static const sn_backend_ops g_ops[SN_ISA_COUNT] = {
    [SN_ISA_SCALAR] = CPU_OPS("cpu-scalar"),
    [SN_ISA_AVX2] = CPU_OPS("cpu-avx2"),
    [SN_ISA_AVX512] = CPU_OPS("cpu-avx512"),
};

sn_status sn_backend_cpu_new_isa(int n_threads, sn_isa isa, sn_backend **out)
{
    *out = NULL;
    if (isa < 0 || isa >= SN_ISA_COUNT || !sn_cpu_isa_supported(isa))
        return SN_FAIL(SN_E_UNSUPPORTED, "cpu backend: %s kernels not supported by this CPU", sn_isa_name(isa));
    cpu_be *be = calloc(1, sizeof *be);
    if (!be)
        return SN_FAIL(SN_E_NOMEM, "cpu backend");
    sn_status st = sn_pool_new(n_threads, &be->pool);
    if (st != SN_OK) {
        free(be);
        return st;
    }
    /* AVX-512 with VNNI: the table with the integer Q4 paths (exact and q8) */
    be->k = isa == SN_ISA_AVX512 ? (sn_cpu_features_get()->avx512vnni ? cpu_kernels_avx512_vnni_get()
                                                                       : &cpu_kernels_avx512)
            : isa == SN_ISA_AVX2 ? &cpu_kernels_avx2
                                 : &cpu_kernels_ref;
    /* GEMV software prefetch, 8 rows ahead. Measured with bench_matmul:
     * AMD EPYC (Zen 4), 1 thread, 44 MB Q4 matrix from DRAM: ~9 -> ~15 GB/s.
     * Intel Xeon (H200 host, 300 MB L3), 16 threads: the 716 MB lm_head
     * (DRAM-streaming, as every matrix is in a real decode step) 46 -> 65
     * GB/s; only matrices small enough to stay in that L3 between calls ran
     * faster without it (102 vs 83 GB/s), which a decode step never sees. */
    be->pf_rows = 8;
    const char *pf = getenv("SANCTUM_CPU_PREFETCH"); /* tuning knob: rows ahead, 0 = off */
    if (pf && *pf) {
        char *end;
        long v = strtol(pf, &end, 10);
        if (*end || v < 0 || v > 64) {
            sn_pool_free(be->pool);
            free(be);
            return SN_FAIL(SN_E_INVALID, "SANCTUM_CPU_PREFETCH=%s: expected rows ahead in [0, 64]", pf);
        }
        be->pf_rows = (int)v;
    }
    /* Q4 kernel knob: SANCTUM_CPU_Q4=fp32 keeps Q4 on the float kernel even
     * where the table has the integer one (int, the default, uses it); q8
     * opts in to 8-bit activations (approximate, faster) on AVX2 and AVX-512
     * hosts (AVX-512 without VNNI: the AVX2 kernel), else it is int. */
    const char *q4 = getenv("SANCTUM_CPU_Q4");
    if (q4 && *q4 && strcmp(q4, "int") != 0 && strcmp(q4, "fp32") != 0 && strcmp(q4, "q8") != 0) {
        sn_pool_free(be->pool);
        free(be);
        return SN_FAIL(SN_E_INVALID, "SANCTUM_CPU_Q4=%s: expected int, fp32 or q8", q4);
    }
    be->q4_mode = !q4 || !*q4 || !strcmp(q4, "int") ? CPU_Q4_INT : !strcmp(q4, "fp32") ? CPU_Q4_FP32 : CPU_Q4_Q8;
    be->base.ops = &g_ops[isa];
    be->base.n_threads = sn_pool_size(be->pool);
    *out = &be->base;
    return SN_OK;
}

sn_status sn_backend_cpu_new(int n_threads, sn_backend **out)
{
    sn_isa isa;
    *out = NULL;
    SN_TRY(sn_cpu_select_isa(&isa));
    return sn_backend_cpu_new_isa(n_threads, isa, out);
}
