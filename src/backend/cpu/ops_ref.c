/* Scalar reference kernels: the oracle every SIMD (and CUDA) kernel is
 * tested against. Written for obviousness: dequantize one group at a time
 * (w = scale*q + bias, MLX affine, LSB-first), never a whole matrix. */
#include "backend/cpu/cpu_internal.h"

static inline uint32_t load_word(const uint8_t *p, int64_t i)
{
    uint32_t w;
    memcpy(&w, p + 4 * i, 4);
    return w;
}

/* Dequantize elements [c0, c0+n) of row r (n within one group for Q). */
static void dequant_span(const cpu_mat *m, int64_t r, int64_t c0, int64_t n, float *out)
{
    const uint8_t *row = m->data + (size_t)r * m->row_bytes;
    switch (m->dtype) {
    case SN_DT_F32:
    case SN_DT_F16:
    case SN_DT_BF16:
        for (int64_t i = 0; i < n; i++)
            out[i] = cpu_load_scale(row, m->dtype, c0 + i);
        return;
    case SN_DT_Q4:
    case SN_DT_Q8: {
        int64_t g = c0 / m->group;
        const uint8_t *sp = m->scales + (size_t)r * m->n_groups * m->s_size;
        const uint8_t *bp = m->qbiases + (size_t)r * m->n_groups * m->s_size;
        float s = cpu_load_scale(sp, m->sdtype, g), b = cpu_load_scale(bp, m->sdtype, g);
        int per = 32 / m->bits;
        uint32_t mask = (1u << m->bits) - 1;
        if (c0 % per == 0 && n % per == 0) { /* whole words: the usual case */
            for (int64_t i = 0; i < n; i += per) {
                uint32_t word = load_word(row, (c0 + i) / per);
                for (int k = 0; k < per; k++, word >>= m->bits)
                    out[i + k] = s * (float)(word & mask) + b;
            }
            return;
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t c = c0 + i;
            uint32_t q = (load_word(row, c / per) >> (m->bits * (c % per))) & mask;
            out[i] = s * (float)q + b;
        }
        return;
    }
    default:
        SN_ASSERT(!"cpu_mat dtype validated by the driver");
    }
}

void cpu_ref_dequant_row(const cpu_mat *m, int64_t r, float *out)
{
    int64_t step = m->group ? m->group : m->cols;
    for (int64_t c = 0; c < m->cols; c += step)
        dequant_span(m, r, c, step, out + c);
}

/* Row r0..r1, every token: dequantize a span of at most 128 values into a
 * stack buffer and use it for all T tokens, so the span is decoded once. */
void cpu_ref_mm(const cpu_mm_args *a, int64_t r0, int64_t r1)
{
    const cpu_mat *m = a->m;
    enum { SPAN = 128 };
    float w[SPAN];
    int64_t step = m->group ? m->group : SPAN;
    if (step > SPAN)
        step = SPAN; /* groups above 128 are split; any span inside a group works */
    for (int64_t r = r0; r < r1; r++) {
        for (int t = 0; t < a->T; t++)
            a->y[(size_t)t * m->rows + r] = 0.0f;
        for (int64_t c = 0; c < m->cols; c += step) {
            int64_t n = m->cols - c < step ? m->cols - c : step;
            dequant_span(m, r, c, n, w);
            for (int t = 0; t < a->T; t++) {
                const float *x = a->x + (size_t)t * m->cols + c;
                float acc = 0.0f;
                for (int64_t i = 0; i < n; i++)
                    acc += w[i] * x[i];
                a->y[(size_t)t * m->rows + r] += acc;
            }
        }
    }
}

static float ref_dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void ref_axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void ref_scale(float *y, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] *= a;
}

const cpu_kernels cpu_kernels_ref = {
    .isa = SN_ISA_SCALAR,
    .prep_q4 = NULL,
    .prep_q8 = NULL,
    .wants_gsum = 0,
    .min_group = 1,
    .mm_q4 = cpu_ref_mm,
    .mm_q8 = cpu_ref_mm,
    .mm_dense = cpu_ref_mm,
    .dot = ref_dot,
    .axpy = ref_axpy,
    .scale = ref_scale,
};

/* ---------------- op bodies ---------------- */

#include <math.h>

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* torch.nn.functional.softplus (beta 1, threshold 20). */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void cpu_op_rmsnorm_rows(const cpu_kernels *k, const float *x, const float *w, int64_t r0, int64_t r1,
                         int n, float eps, float *y)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        float inv = 1.0f / sqrtf(k->dot(xr, xr, n) / (float)n + eps);
        for (int i = 0; i < n; i++)
            yr[i] = xr[i] * inv * w[i];
    }
}

void cpu_op_gated_rmsnorm_rows(const cpu_kernels *k, const float *o, const float *z, const float *w,
                               int64_t r0, int64_t r1, int n, float eps, float *y)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *or_ = o + (size_t)r * n, *zr = z + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        float inv = 1.0f / sqrtf(k->dot(or_, or_, n) / (float)n + eps);
        for (int i = 0; i < n; i++)
            yr[i] = w[i] * (or_[i] * inv) * silu(zr[i]);
    }
}

void cpu_op_add(float *y, const float *x, int64_t i0, int64_t i1)
{
    for (int64_t i = i0; i < i1; i++)
        y[i] += x[i];
}

void cpu_op_swiglu(const float *g, const float *u, int64_t i0, int64_t i1, float *out)
{
    for (int64_t i = i0; i < i1; i++)
        out[i] = silu(g[i]) * u[i];
}

void cpu_op_mul_sigmoid(float *y, const float *g, int64_t i0, int64_t i1)
{
    for (int64_t i = i0; i < i1; i++)
        y[i] *= sigmoid(g[i]);
}

void cpu_op_rope_tokens(float *x, int64_t t0, int64_t t1, int n_heads, int head_dim, int rot_dim, int pos0,
                        const float *inv_freq, float mscale)
{
    int half = rot_dim / 2;
    for (int64_t t = t0; t < t1; t++) {
        /* The angle is formed in fp32 like HF (inv_freq @ positions in fp32). */
        float pos = (float)(pos0 + t);
        float *xt = x + (size_t)t * n_heads * head_dim;
        for (int i = 0; i < half; i++) {
            float ang = pos * inv_freq[i];
            /* Angle 0 (the model's exact row scale: zero frequencies) skips
             * the libm calls; cos 0 = 1 and sin 0 = 0 exactly anyway. */
            float c = ang == 0.0f ? mscale : cosf(ang) * mscale, s = ang == 0.0f ? 0.0f : sinf(ang) * mscale;
            for (int h = 0; h < n_heads; h++) {
                float *xh = xt + (size_t)h * head_dim;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * s;
                xh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

/* One cached key j (row kj, value vj) into the partial (o, m, l) of the
 * G query heads at qg: online softmax (running max, rescaled accumulator),
 * straight from the cache, with no score buffer. first: j is the chunk's
 * first key (o still zero). */
static inline void attn_key(const cpu_kernels *k, const float *qg, const float *kj, const float *vj, int G, int D,
                            float scale, bool first, float *o, float *m, float *l)
{
    for (int g = 0; g < G; g++) {
        float s = k->dot(qg + (size_t)g * D, kj, D) * scale;
        float *og = o + (size_t)g * D;
        if (s > m[g]) {
            float corr = expf(m[g] - s); /* 0 on the chunk's first key */
            if (!first)
                k->scale(og, corr, D);
            l[g] *= corr;
            m[g] = s;
        }
        float p = expf(s - m[g]);
        l[g] += p;
        k->axpy(og, p, vj, D);
    }
}

void cpu_op_attn_init(int G, int D, float *o, float *m, float *l)
{
    memset(o, 0, sizeof(float) * G * D);
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
}

void cpu_op_attn_chunk(const cpu_kernels *k, const float *q, const sn_kv_view *kv, int t, int kvh, int G,
                       int n_q_heads, int j0, int j1, float scale, float *o, float *m, float *l)
{
    int D = kv->head_dim;
    size_t stride = (size_t)kv->n_kv_heads * D;
    const float *qg = q + ((size_t)t * n_q_heads + (size_t)kvh * G) * D;
    const float *kp = kv->k + (size_t)kvh * D, *vp = kv->v + (size_t)kvh * D;
    cpu_op_attn_init(G, D, o, m, l);
    for (int j = j0; j < j1; j++)
        attn_key(k, qg, kp + j * stride, vp + j * stride, G, D, scale, j == j0, o, m, l);
}

/* The same partials for every kv head at once, key by key: each key's rows
 * of all heads are one contiguous run of the cache, where a head alone reads
 * 1 KB rows between the other heads' (two threads read that layout at about
 * half the contiguous rate on the Zen 4 VM: bench/stride_read.c). Each
 * head's arithmetic is cpu_op_attn_chunk's, key for key, so the bits are. */
void cpu_op_attn_chunk_heads(const cpu_kernels *k, const float *q, const sn_kv_view *kv, int t, int G, int n_q_heads,
                             int j0, int j1, float scale, float *part, size_t part_stride)
{
    int D = kv->head_dim, Hkv = kv->n_kv_heads;
    size_t stride = (size_t)Hkv * D;
    for (int h = 0; h < Hkv; h++) {
        float *o = part + (size_t)h * part_stride;
        cpu_op_attn_init(G, D, o, o + (size_t)G * D, o + (size_t)G * D + G);
    }
    for (int j = j0; j < j1; j++)
        for (int h = 0; h < Hkv; h++) {
            float *o = part + (size_t)h * part_stride;
            attn_key(k, q + ((size_t)t * n_q_heads + (size_t)h * G) * D, kv->k + j * stride + (size_t)h * D,
                     kv->v + j * stride + (size_t)h * D, G, D, scale, j == j0, o, o + (size_t)G * D,
                     o + (size_t)G * D + G);
        }
}

void cpu_op_attn_merge(const cpu_kernels *k, int G, int D, const float *o, const float *m, const float *l, float *O,
                       float *M, float *L)
{
    for (int g = 0; g < G; g++) {
        float *Og = O + (size_t)g * D;
        if (m[g] > M[g]) {
            float c = expf(M[g] - m[g]); /* 0 for the first chunk */
            k->scale(Og, c, D);
            L[g] *= c;
            M[g] = m[g];
        }
        float w = expf(m[g] - M[g]);
        k->axpy(Og, w, o + (size_t)g * D, D);
        L[g] += w * l[g];
    }
}

void cpu_op_attn_finish(const cpu_kernels *k, int G, int D, float *O, const float *L)
{
    for (int g = 0; g < G; g++)
        k->scale(O + (size_t)g * D, 1.0f / L[g], D);
}

void cpu_op_gdn_conv(const cpu_gdn_job *j, int64_t c0, int64_t c1)
{
    int K = j->d->conv_k, C = j->conv_dim, T = j->T;
    float *state = j->st->conv; /* [K-1, C] */
    /* X(i) = concat(state, qkv) along time; c[t] uses X(t .. t+K-1), the
     * last tap multiplying the current token (cross-correlation). */
#define X(i, ch) ((i) < K - 1 ? state[(size_t)(i) * C + (ch)] : j->qkv[(size_t)((i) - (K - 1)) * C + (ch)])
    for (int t = 0; t < T; t++) {
        for (int64_t ch = c0; ch < c1; ch++) {
            const float *w = j->conv_w + (size_t)ch * K;
            float acc = 0.0f;
            for (int i = 0; i < K; i++)
                acc += w[i] * X(t + i, ch);
            j->c[(size_t)t * C + ch] = silu(acc);
        }
    }
    /* History slot t (the state after token t) = X(t+1 .. t+K-1), taken
     * before the in-place update below. */
    int nh = j->st->hist ? (j->st->n_hist < T - 1 ? j->st->n_hist : T - 1) : 0;
    for (int t = 0; t < nh; t++) {
        float *hs = j->st->hist + (size_t)t * sn_gdn_hist_floats(j->d);
        for (int i = 0; i < K - 1; i++)
            for (int64_t ch = c0; ch < c1; ch++)
                hs[(size_t)i * C + ch] = X(t + 1 + i, ch);
    }
    /* New state = X(T .. T+K-2). Reading index T+i >= i, ascending i, so
     * the in-place update never reads a row it already replaced. */
    for (int i = 0; i < K - 1; i++)
        for (int64_t ch = c0; ch < c1; ch++)
            state[(size_t)i * C + ch] = X(T + i, ch);
#undef X
}

void cpu_op_gdn_l2norm(const cpu_kernels *k, const cpu_gdn_job *j, int64_t v0, int64_t v1)
{
    int Hk = j->d->n_k_heads, Dk = j->d->dk;
    float qscale = 1.0f / sqrtf((float)Dk);
    for (int64_t v = v0; v < v1; v++) {
        int64_t t = v / (2 * Hk), rest = v % (2 * Hk);
        int is_k = rest >= Hk;
        int64_t hk = is_k ? rest - Hk : rest;
        float *x = j->c + (size_t)t * j->conv_dim + (is_k ? j->key_dim : 0) + (size_t)hk * Dk;
        float inv = 1.0f / sqrtf(k->dot(x, x, Dk) + j->l2_eps);
        k->scale(x, is_k ? inv : inv * qscale, Dk);
    }
}

void cpu_op_gdn_head(const cpu_kernels *k, const cpu_gdn_job *j, int hv)
{
    const sn_gdn_dims *d = j->d;
    int Dk = d->dk, Dv = d->dv, Hv = d->n_v_heads;
    int hk = hv / (Hv / d->n_k_heads);
    float *S = j->st->S + (size_t)hv * Dk * Dv;  /* [Dk, Dv] */
    float A = -expf(j->A_log[hv]);
    float kv_mem[CPU_GDN_MAX_DV];
    for (int t = 0; t < j->T; t++) {
        const float *ct = j->c + (size_t)t * j->conv_dim;
        const float *q = ct + (size_t)hk * Dk;
        const float *kk = ct + j->key_dim + (size_t)hk * Dk;
        const float *v = ct + 2 * (size_t)j->key_dim + (size_t)hv * Dv;
        float g = A * softplus(j->a[(size_t)t * Hv + hv] + j->dt_bias[hv]);
        float beta = sigmoid(j->b[(size_t)t * Hv + hv]);
        float decay = expf(g);
        float *o = j->out + ((size_t)t * Hv + hv) * Dv;

        /* S *= exp(g); kv_mem = S^T k */
        memset(kv_mem, 0, sizeof(float) * Dv);
        for (int i = 0; i < Dk; i++) {
            float *Si = S + (size_t)i * Dv;
            k->scale(Si, decay, Dv);
            k->axpy(kv_mem, kk[i], Si, Dv);
        }
        /* delta = (v - kv_mem) * beta, kept in kv_mem */
        for (int x = 0; x < Dv; x++)
            kv_mem[x] = (v[x] - kv_mem[x]) * beta;
        /* S += k (x) delta; o = S^T q */
        memset(o, 0, sizeof(float) * Dv);
        for (int i = 0; i < Dk; i++) {
            float *Si = S + (size_t)i * Dv;
            k->axpy(Si, kk[i], kv_mem, Dv);
            k->axpy(o, q[i], Si, Dv);
        }
        if (j->st->hist && t < j->st->n_hist && t < j->T - 1) {
            float *hs = j->st->hist + (size_t)t * sn_gdn_hist_floats(d) + (size_t)(d->conv_k - 1) * j->conv_dim;
            memcpy(hs + (size_t)hv * Dk * Dv, S, sizeof(float) * Dk * Dv);
        }
    }
}
