/* bench_cuda: the Qwen3.5 forward pass of a real config (27B dense,
 * 35B-A3B MoE) on the CUDA backend, with random MLX 4-bit weights
 * generated in memory (same shapes and bytes as a sanctum-synth model),
 * driven through the backend table exactly as a model file calls it:
 * per layer RMSNorm, projections, GatedDeltaNet or gated attention (q/k
 * norm, partial RoPE, KV cache), MLP or MoE (GPU routing + shared expert),
 * final norm, lm_head, argmax on the GPU.
 *
 * Prints: decode tok/s at batch 1 (CUDA graph replay, and eager), the
 * weight bytes one decode token reads and the achieved GB/s against the
 * measured device copy bandwidth, prefill tok/s and time to first token
 * for a P-token prompt, GPU memory, and the per-op time of one decode step.
 * With --ncu-decode: the graph decode step time (--vary knobs interleaved,
 * --rows for verify passes, --timeline for one step's kernels on the GPU's
 * clock through CUPTI), then one step in the profiler range for ncu.
 * Appends one line per run to --log with the command that reproduces it.
 *
 * Build (here, with nvcc present):
 *   make build/libsanctum.a && cc -std=c17 -D_GNU_SOURCE -O2 -Iinclude -Isrc -DSN_HAVE_CUDA=1 \
 *     -o build/bench_cuda bench/bench_cuda.c build/libsanctum.a -lm -lpthread -ljansson \
 *     -L/usr/local/cuda/lib64 -lcudart_static -lrt -lstdc++ -ldl
 * Run:  build/bench_cuda --config bench/configs/qwen3_5_27b.json [--prefill 4096] [--decode 128]
 *       [--layers N] [--log bench/results.log] */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sanctum/backend.h"
#include "sanctum/tensor.h"

#ifdef SN_HAVE_CUDA
#include "backend/cuda/sn_cuda.h"
#include "models/model_impl.h" /* sn_record_ahead_env: the engine's reading of SANCTUM_RECORD_AHEAD */
#include "timeline.h"

typedef struct {
    int H, L, I, Hq, Hkv, D, Hk, Hv, Dk, Dv, K, V, interval, E, topk, Im, Is, rot;
    float eps;
} cfg_t;

static sn_backend *B;
static const sn_backend_ops *O;
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double bytes_decode; /* weight bytes read per decode token */
static double bytes_total;

#define TRY(x) do { sn_status _s = (x); if (_s != SN_OK) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, sn_errmsg()); exit(1); } } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline uint64_t xs64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int jint(json_t *o, const char *k, int def)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

static void load_cfg(const char *path, cfg_t *c)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        fprintf(stderr, "%s: %s (line %d)\n", path, err.text, err.line);
        exit(1);
    }
    json_t *t = json_object_get(root, "text_config");
    if (!json_is_object(t)) t = root;
    c->H = jint(t, "hidden_size", 0);
    c->L = jint(t, "num_hidden_layers", 0);
    c->I = jint(t, "intermediate_size", 0);
    c->Hq = jint(t, "num_attention_heads", 0);
    c->Hkv = jint(t, "num_key_value_heads", 0);
    c->D = jint(t, "head_dim", c->Hq ? c->H / c->Hq : 0);
    c->Hk = jint(t, "linear_num_key_heads", 16);
    c->Hv = jint(t, "linear_num_value_heads", 32);
    c->Dk = jint(t, "linear_key_head_dim", 128);
    c->Dv = jint(t, "linear_value_head_dim", 128);
    c->K = jint(t, "linear_conv_kernel_dim", 4);
    c->V = jint(t, "vocab_size", 0);
    c->interval = jint(t, "full_attention_interval", 4);
    c->E = jint(t, "num_experts", 0);
    c->topk = jint(t, "num_experts_per_tok", 0);
    c->Im = jint(t, "moe_intermediate_size", 0);
    c->Is = jint(t, "shared_expert_intermediate_size", 0);
    double frac = 0.25;
    json_t *rp = json_object_get(t, "rope_parameters");
    if (json_is_object(rp) && json_is_number(json_object_get(rp, "partial_rotary_factor")))
        frac = json_number_value(json_object_get(rp, "partial_rotary_factor"));
    c->rot = (int)(c->D * frac);
    c->eps = 1e-6f;
    json_decref(root);
    if (c->H <= 0 || c->L <= 0 || c->Hq <= 0 || c->Hkv <= 0 || c->V <= 0 || (c->E == 0 && c->I <= 0)) {
        fprintf(stderr, "%s: missing dims\n", path);
        exit(1);
    }
}

/* A random MLX-affine weight [E, rows, cols], uploaded; host copy dropped. */
static sn_weight *mkw(int64_t rows, int64_t cols, int64_t E, int bits, int in_decode, int topk)
{
    static uint8_t dummy[16];
    sn_weight *w = calloc(1, sizeof *w);
    int64_t ne = E > 0 ? E : 1;
    size_t words = (size_t)ne * rows * cols * bits / 32, ng = (size_t)ne * rows * (cols / 64);
    uint64_t *q = malloc(words * 4 + 8);
    for (size_t i = 0; i < (words + 1) / 2; i++) q[i] = xs64();
    uint16_t *sc = malloc(2 * ng), *bi = malloc(2 * ng);
    float s0 = 1.0f / (4.0f * sqrtf((float)cols)) / (bits == 4 ? 7.5f : 127.5f);
    for (size_t i = 0; i < ng; i++) {
        float s = s0 * (0.5f + (float)(xs64() & 1023) / 1024.0f);
        sc[i] = sn_f32_to_bf16(s);
        bi[i] = sn_f32_to_bf16(-s * (bits == 4 ? 7.5f : 127.5f));
    }
    w->dtype = bits == 4 ? SN_DT_Q4 : SN_DT_Q8;
    w->rows = rows;
    w->cols = cols;
    w->n_experts = E;
    w->group = 64;
    w->data = q;
    w->scales = sc;
    w->qbiases = bi;
    w->sdtype = SN_DT_BF16;
    TRY(O->upload_weight(B, w));
    free(q);
    free(sc);
    free(bi);
    w->data = w->scales = w->qbiases = dummy; /* the backend only reads w->dev from now on */
    size_t one = sn_weight_bytes(w);
    bytes_total += (double)one * ne;
    if (in_decode) bytes_decode += (double)one * (E > 0 ? topk : 1);
    return w;
}

static float *dbuf(size_t n)
{
    void *p;
    TRY(O->buf_alloc(B, sizeof(float) * (n ? n : 1), &p));
    return p;
}

static float *drand(size_t n, float lo, float hi)
{
    float *h = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * (float)(xs64() & 0xffffff) / 16777216.0f;
    float *d = dbuf(n);
    TRY(O->from_host(B, d, h, sizeof(float) * n));
    free(h);
    return d;
}

typedef struct {
    int attn;
    float *in_norm, *post_norm;
    /* GDN */
    sn_weight *qkv, *z, *wb, *wa, *out;
    float *conv_w, *A_log, *dt_bias, *gnorm, *conv, *S;
    /* attention */
    sn_weight *wq, *wg, *wk, *wv, *wo;
    float *qn, *kn, *kc, *vc;
    /* MLP / MoE */
    sn_weight *gate, *up, *down, *router, *eg, *eu, *ed, *sg, *su, *sd, *sgw;
} layer_t;

typedef struct {
    cfg_t c;
    int T, ctx, conv_dim;
    sn_weight *emb, *lm;
    float *fnorm, *inv_freq;
    layer_t *ly;
    float *h, *xn, *qkv, *z, *a, *b, *o, *o2, *r, *q, *g, *k, *v, *qo, *ko, *att, *mg, *mu, *ma, *lg, *mo, *sgl, *logits;
} model_t;

static void build(model_t *m, int layers, int T, int ctx)
{
    cfg_t *c = &m->c;
    if (layers > 0 && layers < c->L) c->L = layers;
    m->T = T;
    m->ctx = ctx;
    int H = c->H, Vd = c->Hv * c->Dv, Kd = c->Hk * c->Dk;
    m->conv_dim = 2 * Kd + Vd;
    m->emb = mkw(c->V, H, 0, 4, 0, 0);
    m->lm = mkw(c->V, H, 0, 4, 1, 0);
    m->fnorm = drand(H, 0.9f, 1.1f);
    float *inv = malloc(sizeof(float) * c->rot / 2);
    for (int i = 0; i < c->rot / 2; i++) inv[i] = powf(1e7f, -2.0f * i / c->rot);
    m->inv_freq = dbuf(c->rot / 2);
    TRY(O->from_host(B, m->inv_freq, inv, sizeof(float) * c->rot / 2));
    free(inv);
    m->ly = calloc(c->L, sizeof(layer_t));
    for (int l = 0; l < c->L; l++) {
        layer_t *y = &m->ly[l];
        y->attn = (l + 1) % c->interval == 0;
        y->in_norm = drand(H, 0.9f, 1.1f);
        y->post_norm = drand(H, 0.9f, 1.1f);
        if (y->attn) {
            int qd = c->Hq * c->D, kd = c->Hkv * c->D;
            /* q_proj's rows [q_h | gate_h] per head, split at load into two views */
            y->wq = mkw(qd, H, 0, 4, 1, 0);
            y->wg = mkw(qd, H, 0, 4, 1, 0);
            y->wk = mkw(kd, H, 0, 4, 1, 0);
            y->wv = mkw(kd, H, 0, 4, 1, 0);
            y->wo = mkw(H, qd, 0, 4, 1, 0);
            y->qn = drand(c->D, 0.9f, 1.1f);
            y->kn = drand(c->D, 0.9f, 1.1f);
            y->kc = dbuf((size_t)ctx * kd);
            y->vc = dbuf((size_t)ctx * kd);
        } else {
            y->qkv = mkw(m->conv_dim, H, 0, 4, 1, 0);
            y->z = mkw(Vd, H, 0, 4, 1, 0);
            y->wb = mkw(c->Hv, H, 0, 4, 1, 0);
            y->wa = mkw(c->Hv, H, 0, 4, 1, 0);
            y->out = mkw(H, Vd, 0, 4, 1, 0);
            y->conv_w = drand((size_t)m->conv_dim * c->K, -0.5f, 0.5f);
            y->A_log = drand(c->Hv, -1.f, 1.f);
            y->dt_bias = drand(c->Hv, -1.f, 1.f);
            y->gnorm = drand(c->Dv, 0.9f, 1.1f);
            y->conv = dbuf((size_t)(c->K - 1) * m->conv_dim);
            y->S = dbuf((size_t)c->Hv * c->Dk * c->Dv);
        }
        if (c->E > 0) {
            y->router = mkw(c->E, H, 0, 8, 1, 0);
            y->eg = mkw(c->Im, H, c->E, 4, 1, c->topk);
            y->eu = mkw(c->Im, H, c->E, 4, 1, c->topk);
            y->ed = mkw(H, c->Im, c->E, 4, 1, c->topk);
            y->sg = mkw(c->Is, H, 0, 4, 1, 0);
            y->su = mkw(c->Is, H, 0, 4, 1, 0);
            y->sd = mkw(H, c->Is, 0, 4, 1, 0);
            y->sgw = mkw(1, H, 0, 8, 1, 0);
        } else {
            y->gate = mkw(c->I, H, 0, 4, 1, 0);
            y->up = mkw(c->I, H, 0, 4, 1, 0);
            y->down = mkw(H, c->I, 0, 4, 1, 0);
        }
        if ((l + 1) % 8 == 0 || l + 1 == c->L)
            fprintf(stderr, "\r  weights: layer %d/%d, %.2f GB", l + 1, c->L, bytes_total / 1e9);
    }
    fprintf(stderr, "\n");
    size_t TT = (size_t)T;
    int I = c->E > 0 ? (c->Im > c->Is ? c->Im : c->Is) : c->I;
    m->h = dbuf(TT * H); m->xn = dbuf(TT * H); m->r = dbuf(TT * H); m->mo = dbuf(TT * H);
    m->qkv = dbuf(TT * m->conv_dim); m->z = dbuf(TT * Vd); m->o = dbuf(TT * Vd); m->o2 = dbuf(TT * Vd);
    m->a = dbuf(TT * c->Hv); m->b = dbuf(TT * c->Hv);
    m->q = dbuf(TT * c->Hq * c->D); m->g = dbuf(TT * c->Hq * c->D); m->att = dbuf(TT * c->Hq * c->D);
    m->k = dbuf(TT * c->Hkv * c->D); m->v = dbuf(TT * c->Hkv * c->D);
    m->qo = dbuf(TT * c->Hq * c->D); m->ko = dbuf(TT * c->Hkv * c->D);
    m->mg = dbuf(TT * I); m->mu = dbuf(TT * I); m->ma = dbuf(TT * I);
    m->lg = dbuf(TT * (c->E > 0 ? c->E : 1)); m->sgl = dbuf(TT);
    m->logits = dbuf(c->V);
}

static void reset_state(model_t *m)
{
    cfg_t *c = &m->c;
    for (int l = 0; l < c->L; l++)
        if (!m->ly[l].attn) {
            TRY(O->memset0(B, m->ly[l].conv, sizeof(float) * (c->K - 1) * m->conv_dim));
            TRY(O->memset0(B, m->ly[l].S, sizeof(float) * c->Hv * c->Dk * c->Dv));
        }
}

static int g_moe_shared = 1; /* [moe] forward() uses moe_shared where the backend takes it */

/* One forward of T tokens at pos0; next = argmax of the last token's logits. */
static void forward(model_t *m, const int32_t *ids, int T, int pos0, int32_t *next)
{
    cfg_t *c = &m->c;
    int H = c->H, Vd = c->Hv * c->Dv;
    TRY(O->embed(B, m->emb, ids, T, m->h));
    for (int l = 0; l < c->L; l++) {
        layer_t *y = &m->ly[l];
        TRY(O->rmsnorm(B, m->h, y->in_norm, T, H, c->eps, m->xn));
        if (y->attn) {
            sn_kv_view kv = { y->kc, y->vc, m->ctx, c->Hkv, c->D };
            TRY(O->matmul(B, y->wq, 0, m->xn, T, m->q));
            TRY(O->matmul(B, y->wg, 0, m->xn, T, m->g));
            TRY(O->matmul(B, y->wk, 0, m->xn, T, m->k));
            TRY(O->matmul(B, y->wv, 0, m->xn, T, m->v));
            /* the norms into rows of their own, as forward.c does: the capture
             * fuses norms, RoPEs and the KV write (fuse_attn_prep) only then,
             * and run 36 found that the in-place norms here had kept every
             * measurement of that knob from taking it */
            TRY(O->rmsnorm(B, m->q, y->qn, T * c->Hq, c->D, c->eps, m->qo));
            TRY(O->rmsnorm(B, m->k, y->kn, T * c->Hkv, c->D, c->eps, m->ko));
            TRY(O->rope(B, m->qo, T, c->Hq, c->D, c->rot, pos0, m->inv_freq, 1.f));
            TRY(O->rope(B, m->ko, T, c->Hkv, c->D, c->rot, pos0, m->inv_freq, 1.f));
            TRY(O->kv_write(B, &kv, m->ko, m->v, T, pos0));
            TRY(O->attention(B, m->qo, &kv, T, pos0, c->Hq, 1.f / sqrtf((float)c->D), m->att));
            TRY(O->mul_sigmoid(B, m->att, m->g, (size_t)T * c->Hq * c->D));
            TRY(O->matmul(B, y->wo, 0, m->att, T, m->r));
        } else {
            sn_gdn_dims d = { c->Hk, c->Hv, c->Dk, c->Dv, c->K, 1e-6f };
            sn_gdn_view st = { y->conv, y->S, NULL, 0 };
            TRY(O->matmul(B, y->qkv, 0, m->xn, T, m->qkv));
            TRY(O->matmul(B, y->z, 0, m->xn, T, m->z));
            TRY(O->matmul(B, y->wb, 0, m->xn, T, m->b));
            TRY(O->matmul(B, y->wa, 0, m->xn, T, m->a));
            TRY(O->gdn(B, &d, m->qkv, m->a, m->b, y->conv_w, y->A_log, y->dt_bias, &st, T, m->o));
            TRY(O->gated_rmsnorm(B, m->o, m->z, y->gnorm, T * c->Hv, c->Dv, c->eps, m->o2));
            TRY(O->matmul(B, y->out, 0, m->o2, T, m->r));
        }
        (void)Vd;
        TRY(O->add(B, m->h, m->r, (size_t)T * H));
        TRY(O->rmsnorm(B, m->h, y->post_norm, T, H, c->eps, m->xn));
        if (c->E > 0) {
            /* [moe] qwen3_5_moe.c's order: router + shared gate logit, shared
             * gate + up, swiglu, shared down, moe, add_gated into its output,
             * then the residual add (forward.c) */
            TRY(O->matmul(B, y->router, 0, m->xn, T, m->lg));
            TRY(O->matmul(B, y->sgw, 0, m->xn, T, m->sgl));
            if (g_moe_shared && O->moe_shared) { /* the shared expert inside the MoE launches (decode) */
                const sn_moe_shared sh = { y->sg, y->su, y->sd, m->sgl };
                sn_status st = O->moe_shared(B, y->eg, y->eu, y->ed, m->lg, c->topk, true, &sh, m->xn, T, m->mo);
                if (st != SN_E_UNSUPPORTED) {
                    TRY(st);
                    TRY(O->add(B, m->h, m->mo, (size_t)T * H));
                    continue;
                }
            }
            TRY(O->matmul(B, y->sg, 0, m->xn, T, m->mg));
            TRY(O->matmul(B, y->su, 0, m->xn, T, m->mu));
            TRY(O->swiglu(B, m->mg, m->mu, (size_t)T * c->Is, m->ma));
            TRY(O->matmul(B, y->sd, 0, m->ma, T, m->r));
            TRY(O->moe(B, y->eg, y->eu, y->ed, m->lg, c->topk, true, m->xn, T, m->mo));
            TRY(O->add_gated(B, m->mo, m->r, m->sgl, T, H));
            TRY(O->add(B, m->h, m->mo, (size_t)T * H));
        } else {
            TRY(O->matmul(B, y->gate, 0, m->xn, T, m->mg));
            TRY(O->matmul(B, y->up, 0, m->xn, T, m->mu));
            TRY(O->swiglu(B, m->mg, m->mu, (size_t)T * c->I, m->ma));
            TRY(O->matmul(B, y->down, 0, m->ma, T, m->r));
            TRY(O->add(B, m->h, m->r, (size_t)T * H));
        }
    }
    TRY(O->rmsnorm(B, m->h + (size_t)(T - 1) * H, m->fnorm, 1, H, c->eps, m->xn));
    TRY(O->matmul(B, m->lm, 0, m->xn, 1, m->logits));
    TRY(O->argmax(B, m->logits, 1, c->V, next));
}

/* Decode GEMV alone, per weight shape, both row-per-warp variants: the
 * kernel's own bandwidth, without the step around it. */
static void gemv_one(const char *name, const sn_weight *w, float *x, float *y)
{
    /* SN_BENCH_GEMV="gate lm_head": only those matrices; SN_BENCH_GEMV_REPS: timed launches (for ncu runs) */
    const char *only = getenv("SN_BENCH_GEMV"), *rs = getenv("SN_BENCH_GEMV_REPS");
    if (only) {
        char want[256], key[64];
        snprintf(want, sizeof want, " %s ", only);
        snprintf(key, sizeof key, " %s ", name);
        if (!strstr(want, key)) return;
    }
    int reps = rs && atoi(rs) > 0 ? atoi(rs) : 100;
    double bytes = (double)sn_weight_bytes(w);
    printf("  gemv %-10s [%6lld x %6lld] %5.1f MB:", name, (long long)w->rows, (long long)w->cols, bytes / 1e6);
    /* the integer tensor-core GEMV in its stream-K form, in its ring form with 1
     * and 2 row tiles per block, then the fp32 GEMV */
    static const char *const lbl[4] = { "sk", "i8", "i8mb2", "fp32" };
    TRY(sn_cuda_tune(B, "gemv_i8_min_kb", 0)); /* every size on the kernel asked for */
    for (int v = 0; v < 4; v++) {
        TRY(sn_cuda_tune(B, "gemv_i8", v < 3));
        TRY(sn_cuda_tune(B, "gemv_sk", v == 0));
        TRY(sn_cuda_tune(B, "gemv_mb", v == 2 ? 2 : 1));
        for (int i = 0; i < 3; i++) TRY(O->matmul(B, w, 0, x, 1, y));
        TRY(O->sync(B));
        double t0 = now();
        for (int i = 0; i < reps; i++) TRY(O->matmul(B, w, 0, x, 1, y));
        TRY(O->sync(B));
        double dt = (now() - t0) / reps;
        printf("  %s %7.1f us %5.0f GB/s", lbl[v], dt * 1e6, bytes / dt / 1e9);
    }
    printf("\n");
    TRY(sn_cuda_tune(B, "gemv_i8", 1));
    TRY(sn_cuda_tune(B, "gemv_sk", 1));
    TRY(sn_cuda_tune(B, "gemv_mb", 0));
    TRY(sn_cuda_tune(B, "gemv_i8_min_kb", -1));
}

static void gemv_micro(model_t *m)
{
    cfg_t *c = &m->c;
    for (int l = 0; l < c->L && l < c->interval; l++) {
        layer_t *y = &m->ly[l];
        if (y->attn) {
            gemv_one("q", y->wq, m->mg, m->ma);
            gemv_one("k", y->wk, m->mg, m->ma);
            gemv_one("o", y->wo, m->mg, m->ma);
        } else if (l == 0) {
            gemv_one("qkv", y->qkv, m->mg, m->ma);
            gemv_one("z", y->z, m->mg, m->ma);
            gemv_one("b", y->wb, m->mg, m->ma);
            gemv_one("out", y->out, m->mg, m->ma);
            if (c->E > 0) {
                gemv_one("router", y->router, m->mg, m->ma);
                gemv_one("shared_up", y->su, m->mg, m->ma);
                gemv_one("shared_dn", y->sd, m->mg, m->ma);
            } else {
                gemv_one("gate", y->gate, m->mg, m->ma);
                gemv_one("down", y->down, m->mg, m->ma);
            }
        }
    }
    gemv_one("lm_head", m->lm, m->mg, m->ma);
    if (c->E > 0) {
        layer_t *y = &m->ly[0];
        int reps = 100;
        for (int md = 2; md >= 0; md--) { /* [moe] the two-launch path (+/- L2 prefetch), then the old kernels */
            TRY(sn_cuda_tune(B, "moe_dec", md));
            for (int i = 0; i < 3; i++) TRY(O->moe(B, y->eg, y->eu, y->ed, m->lg, c->topk, true, m->xn, 1, m->mo));
            TRY(O->sync(B));
            double t0 = now();
            for (int i = 0; i < reps; i++) TRY(O->moe(B, y->eg, y->eu, y->ed, m->lg, c->topk, true, m->xn, 1, m->mo));
            TRY(O->sync(B));
            double dt = (now() - t0) / reps, bytes = 3.0 * c->topk * sn_weight_bytes(y->eg);
            printf("  moe (route + %d experts x 3, moe_dec=%d) %.1f us, %.0f GB/s\n", c->topk, md, dt * 1e6,
                   bytes / dt / 1e9);
        }
        TRY(sn_cuda_tune(B, "moe_dec", 1));
    }
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* a launch of the stamped step: its first weight matrix, rows, and when its
 * first block's wait returned (launches compare by that: stream order) */
typedef struct {
    uint64_t w0, wait0;
    int64_t rows;
} stamp_launch;

static int cmp_launch(const void *a, const void *b)
{
    return cmp_u64(&((const stamp_launch *)a)->wait0, &((const stamp_launch *)b)->wait0);
}

/* --stamps: one graph step with the stamped one-token SIMT GEMV
 * (sn_cuda_gemv_stamps). Per launch, from the moment its first block's
 * wait returned (the kernel before it done): x staged (the blocks'
 * median, and the last block's), the first and the last block done; then
 * the same summed by matrix (rows). */
static void stamps_report(model_t *m, int pos0, int32_t *tok)
{
    enum { CAP = 1 << 17, MAXL = 1024 };
    TRY(sn_cuda_gemv_stamps(B, CAP));
    for (int i = 0; i < 4; i++) { /* capture and replay the stamped graph */
        TRY(O->begin_step(B));
        forward(m, tok, 1, pos0 + i, tok);
        TRY(O->end_step(B));
    }
    TRY(O->sync(B));
    TRY(sn_cuda_gemv_stamps(B, CAP)); /* cleared, still on */
    TRY(O->begin_step(B));
    forward(m, tok, 1, pos0 + 4, tok);
    TRY(O->end_step(B));
    TRY(O->sync(B));
    sn_gemv_stamp *r = malloc(sizeof *r * CAP);
    int n = 0;
    TRY(sn_cuda_gemv_stamps_read(B, r, CAP, &n));
    TRY(sn_cuda_gemv_stamps(B, 0));
    if (n > CAP) {
        printf("  stamps: %d records, room for %d\n", n, CAP);
        n = CAP;
    }
    /* the launches (each names its w0 once a step), in stream order */
    stamp_launch ln[MAXL];
    int nl = 0;
    for (int i = 0; i < n; i++) {
        int l = 0;
        while (l < nl && ln[l].w0 != r[i].w0) l++;
        if (l == nl) {
            if (nl == MAXL) continue;
            ln[nl++] = (stamp_launch){ .w0 = r[i].w0, .wait0 = r[i].t[1], .rows = r[i].rows };
        } else if (r[i].t[1] < ln[l].wait0) ln[l].wait0 = r[i].t[1];
    }
    qsort(ln, nl, sizeof *ln, cmp_launch);
    printf("  k_gemv phase stamps (one step, %d launches, %d blocks; us from each launch's first wait return):\n", nl, n);
    printf("  %4s %7s %6s %9s %9s %9s %9s %9s\n", "", "rows", "blocks", "resident", "staged", "staged<=", "1st done",
           "last done");
    uint64_t *st = malloc(sizeof *st * CAP);
    int64_t krow[16];
    double ks[16][4] = { { 0 } };
    int kn[16] = { 0 }, nk = 0;
    for (int l = 0; l < nl; l++) {
        int nb = 0;
        uint64_t t0min = UINT64_MAX, t2max = 0, t4min = UINT64_MAX, t4max = 0;
        for (int i = 0; i < n; i++) {
            if (r[i].w0 != ln[l].w0) continue;
            st[nb++] = r[i].t[2] - r[i].t[1];
            if (r[i].t[0] < t0min) t0min = r[i].t[0];
            if (r[i].t[2] > t2max) t2max = r[i].t[2];
            if (r[i].t[4] < t4min) t4min = r[i].t[4];
            if (r[i].t[4] > t4max) t4max = r[i].t[4];
        }
        qsort(st, nb, sizeof *st, cmp_u64);
        const double res = (double)(ln[l].wait0 - t0min) / 1e3, med = st[nb / 2] / 1e3,
                     smax = (double)(t2max - ln[l].wait0) / 1e3, d1 = (double)(t4min - ln[l].wait0) / 1e3,
                     dn = (double)(t4max - ln[l].wait0) / 1e3;
        if (l < 12)
            printf("  %4d %7lld %6d %9.2f %9.2f %9.2f %9.2f %9.2f\n", l, (long long)ln[l].rows, nb, res, med, smax, d1, dn);
        int k = 0;
        while (k < nk && krow[k] != ln[l].rows) k++;
        if (k == nk && nk < 16) krow[nk++] = ln[l].rows;
        if (k < nk) {
            ks[k][0] += med, ks[k][1] += smax, ks[k][2] += d1, ks[k][3] += dn;
            kn[k]++;
        }
    }
    printf("  by matrix (means over its launches; sum of last done):\n");
    for (int k = 0; k < nk; k++)
        printf("  %7lld rows x %3d: staged %.2f (last %.2f), first done %.2f, last done %.2f us; %.1f us summed\n",
               (long long)krow[k], kn[k], ks[k][0] / kn[k], ks[k][1] / kn[k], ks[k][2] / kn[k], ks[k][3] / kn[k],
               ks[k][3]);
    free(st);
    free(r);
}

/* One graph decode step at pos from *tok (its argmax into *tok), as the
 * engine's forward takes a plain greedy step (forward.c): with recording
 * ahead (g_ahead, SANCTUM_RECORD_AHEAD unset or 1) the step parked by the
 * one before is launched with the real token, and the next step is recorded
 * (this token standing in) and parked while this one runs; without, the
 * step is recorded, then run. */
static int g_ahead = 1, g_parked_pos = -1;

static void decode_step(model_t *m, int pos, int32_t *tok)
{
    if (!g_ahead) {
        TRY(O->begin_step(B));
        forward(m, tok, 1, pos, tok);
        TRY(O->end_step(B));
        return;
    }
    sn_status e = SN_E_MISSING;
    if (g_parked_pos == pos) {
        e = O->step_launch_parked(B, m, tok, 1);
        if (e == SN_E_MISSING) sn_clear_error();
        else TRY(e);
    }
    if (e != SN_OK) {
        TRY(O->begin_step(B));
        forward(m, tok, 1, pos, tok);
        TRY(O->step_launch(B));
    }
    const int32_t stand_in = *tok;
    TRY(O->begin_ahead(B));
    forward(m, &stand_in, 1, pos + 1, tok);
    TRY(O->step_park(B, m));
    g_parked_pos = pos + 1;
    TRY(O->step_wait(B));
}

/* Decode tok/s through graphs with one tuning knob set (restored after):
 * n steps from position pos0, the first (capture) not timed. */
/* --rows N: the --ncu-decode steps carry N rows (a prompt-lookup verify
 * pass of N - 1 drafts), at positions pos0 + i .. pos0 + i + N - 1 */
static int g_rows = 1;

static double decode_with(model_t *m, const char *key, int val, int restore, int pos0, int n, int32_t *tok)
{
    if (key) TRY(sn_cuda_tune(B, key, val));
    double t = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now();
        if (g_rows == 1) {
            decode_step(m, pos0 + i, tok);
        } else {
            int32_t ids[8];
            for (int r = 0; r < g_rows; r++) ids[r] = *tok;
            TRY(O->begin_step(B));
            forward(m, ids, g_rows, pos0 + i, tok);
            TRY(O->end_step(B));
        }
        if (i) t += now() - t0;
    }
    if (key) TRY(sn_cuda_tune(B, key, restore));
    return (n - 1) / t;
}

/* n graph decode steps from pos0, split: the host's op calls (begin_step and the model's ops,
 * recorded not run), end_step's record match and graph launch, and the graph on the GPU (events
 * around its launch); wall less GPU is what the host adds to a step */
static void step_split(model_t *m, int pos0, int n, int32_t *tok)
{
    double rec_s = 0, wall_s = 0;
    TRY(sn_cuda_step_timing(B, 1));
    for (int i = 0; i < n; i++) {
        double t0 = now();
        TRY(O->begin_step(B));
        forward(m, tok, 1, pos0 + i, tok);
        double t1 = now();
        TRY(O->end_step(B));
        rec_s += t1 - t0;
        wall_s += now() - t0;
    }
    sn_cuda_step_time stt;
    sn_cuda_step_times(B, &stt);
    TRY(sn_cuda_step_timing(B, 0));
    printf("  decode step split (graph, recorded in turn, %d steps, us a step): wall %.1f = the model's op calls %.1f "
           "+ end_step %.1f (record match %.1f, graph launch %.1f); the graph on the GPU %.1f, so the host adds %.1f\n",
           n, wall_s / n * 1e6, rec_s / n * 1e6, stt.end_us, stt.match_us, stt.launch_us, stt.gpu_us,
           wall_s / n * 1e6 - stt.gpu_us);
    /* the same steps as the engine takes them, the next recorded while one runs: only the match and the
     * launch (and the wait's return) are left between two graphs */
    wall_s = 0;
    TRY(sn_cuda_step_timing(B, 1));
    const int keep = g_ahead;
    g_ahead = 1;
    for (int i = 0; i < n; i++) {
        double t0 = now();
        decode_step(m, pos0 + i, tok);
        wall_s += now() - t0;
    }
    g_ahead = keep;
    sn_cuda_step_times(B, &stt);
    TRY(sn_cuda_step_timing(B, 0));
    printf("  decode step split (graph, recorded ahead, %d steps, us a step): wall %.1f (record match %.1f, graph "
           "launch %.1f); the graph on the GPU %.1f, so the host adds %.1f\n", n, wall_s / n * 1e6, stt.match_us,
           stt.launch_us, stt.gpu_us, wall_s / n * 1e6 - stt.gpu_us);
}

/* --timeline (with --ncu-decode): TL_STEPS graph steps with CUPTI's kernel
 * records on, and the last one read through bench/timeline.h: per kernel
 * name its launches, busy and exposed microseconds (the exposed ones sum to
 * the step's span), then every kernel of the step in stream order with its
 * start, end and the gap after the kernels before it (negative: it started
 * while they ran). The same steps untraced first, for tracing's cost. A
 * machine without libcupti gets one line saying so. */
enum { TL_STEPS = 4, TL_MAX = 1 << 15, TL_NAMES = 64 };

static void timeline_report(model_t *m, int pos0, int32_t *tok)
{
    const double plain_ms = 1e3 / decode_with(m, NULL, 0, 0, pos0, TL_STEPS + 1, tok);
    sn_cuda_kspan *sp = calloc(TL_MAX, sizeof *sp);
    if (!sp) {
        printf("  timeline: out of memory\n");
        return;
    }
    if (sn_cuda_timeline_begin(B, sp, TL_MAX) != SN_OK) {
        printf("  timeline: %s\n", sn_errmsg());
        free(sp);
        return;
    }
    const double traced_ms = 1e3 / decode_with(m, NULL, 0, 0, pos0, TL_STEPS + 1, tok);
    int n = 0;
    long dropped = 0;
    if (sn_cuda_timeline_end(B, &n, &dropped) != SN_OK) {
        printf("  timeline: %s\n", sn_errmsg());
        free(sp);
        return;
    }
    /* the last step: the kernels of the graph launch that ends last, or,
     * where the records do not share their launch's id, those after the
     * last gap of over 10 us (the host's round trip between steps) */
    uint64_t *st = malloc(sizeof(uint64_t) * (n + 1)), *en = malloc(sizeof(uint64_t) * (n + 1));
    uint64_t *ex = malloc(sizeof(uint64_t) * (n + 1));
    int64_t *gap = malloc(sizeof(int64_t) * (n + 1));
    int *ix = malloc(sizeof(int) * (n + 1)), *ord = malloc(sizeof(int) * (n + 1));
    if (!st || !en || !ex || !gap || !ix || !ord || n < 1) {
        printf("  timeline: %d kernel records, none to read (%ld dropped)\n", n, dropped);
        goto done;
    }
    int li = 0;
    for (int i = 0; i < n; i++)
        if (sp[i].end > sp[li].end) li = i;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (sp[i].corr == sp[li].corr) ix[k++] = i;
    const char *grouped = "one graph launch";
    if (k < 10) {
        for (int i = 0; i < n; i++) {
            st[i] = sp[i].start;
            en[i] = sp[i].end;
        }
        k = tl_last_step_by_gap(st, en, n, 10000, ix, ord);
        grouped = "the kernels after the last gap of over 10 us";
    }
    for (int j = 0; j < k; j++) {
        st[j] = sp[ix[j]].start;
        en[j] = sp[ix[j]].end;
    }
    const uint64_t span = tl_exposed(st, en, k, ex, gap, ord);
    if (!span) {
        printf("  timeline: %d kernels in the last step (%s), but a record ends before it starts or the step "
               "has no length\n", k, grouped);
        goto done;
    }
    printf("  timeline (CUPTI kernel records, the last of %d traced graph steps, grouped as %s): %d kernels, "
           "span %.3f ms; a step %.3f ms traced, %.3f ms not\n",
           TL_STEPS, grouped, k, span * 1e-6, traced_ms, plain_ms);
    if (dropped) printf("  timeline: %ld kernel records dropped (over %d)\n", dropped, TL_MAX);
    /* per kernel name, by exposed time */
    char names[TL_NAMES][48];
    int cnt[TL_NAMES] = { 0 }, nn = 0, other = 0;
    double busy[TL_NAMES] = { 0 }, expo[TL_NAMES] = { 0 };
    for (int j = 0; j < k; j++) {
        char nm[48];
        tl_short_name(sp[ix[j]].name, nm, sizeof nm);
        int g = 0;
        while (g < nn && strcmp(names[g], nm)) g++;
        if (g == nn) {
            if (nn == TL_NAMES) { other++; g = TL_NAMES - 1; }
            else { snprintf(names[nn], sizeof names[nn], "%s", nm); nn++; }
        }
        cnt[g]++;
        busy[g] += (en[j] - st[j]) * 1e-3;
        expo[g] += ex[j] * 1e-3;
    }
    int by[TL_NAMES];
    for (int g = 0; g < nn; g++) by[g] = g;
    for (int a = 1; a < nn; a++)
        for (int b2 = a; b2 > 0 && expo[by[b2]] > expo[by[b2 - 1]]; b2--) {
            const int t = by[b2]; by[b2] = by[b2 - 1]; by[b2 - 1] = t;
        }
    printf("  %-28s %8s %10s %10s %6s\n", "kernel", "launches", "busy us", "exposed us", "share");
    for (int a = 0; a < nn; a++) {
        const int g = by[a];
        printf("  %-28s %8d %10.1f %10.1f %5.1f%%\n", names[g], cnt[g], busy[g], expo[g],
               100.0 * expo[g] * 1e3 / (double)span);
    }
    if (other) printf("  (%d launches of further names counted under the last)\n", other);
    printf("  the step's kernels in stream order, us from its start: start end busy exposed gap\n");
    for (int j = 0; j < k; j++) {
        const int i = ord[j];
        char nm[48];
        tl_short_name(sp[ix[i]].name, nm, sizeof nm);
        printf("  %4d %-28s %9.2f %9.2f %7.2f %7.2f %8.2f\n", j, nm, (st[i] - st[ord[0]]) * 1e-3,
               (en[i] - st[ord[0]]) * 1e-3, (en[i] - st[i]) * 1e-3, ex[i] * 1e-3, gap[i] * 1e-3);
    }
done:
    free(st); free(en); free(ex); free(gap); free(ix); free(ord); free(sp);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *cfgp = NULL, *logp = NULL;
    int prefill = 4096, ndec = 128, layers = 0, profile = 1;
    int breakdown = 0; /* [prefill-breakdown] */
    int gemv_only = 0; /* only the decode GEMV alone per matrix (gemv_micro) */
    /* --read-sweep: after the bandwidth lines, the plain read kernel's time
     * per launch at the decode GEMVs' sizes (cold in L2), then exit */
    int read_sweep = 0;
    int stamps = 0; /* --stamps: k_gemv's phases in one step (with --ncu-decode) */
    /* --ncu-decode: prefill, the decode graph timed, then one replayed step
     * inside sn_cuda_profiler_range (for ncu --profile-from-start off
     * --graph-profiling node: every kernel of one step, alone) */
    int ncu_decode = 0;
    int timeline = 0; /* --timeline (with --ncu-decode): timeline_report before the profiled step */
    const char *tunes[8]; /* --tune key=value: sn_cuda_tune before the run (measurements) */
    int n_tunes = 0;
    /* --vary key=value:restore[,key=value:restore]... (with --ncu-decode): the graph decode timed
     * again with that knob, interleaved with the default, 3 rounds */
    const char *vary[16];
    int n_vary = 0;
    bool ahead_on;
    if (sn_record_ahead_env(&ahead_on) != SN_OK) {
        fprintf(stderr, "bench_cuda: %s\n", sn_errmsg());
        return 2;
    }
    g_ahead = ahead_on;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfgp = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) prefill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) ndec = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--log") && i + 1 < argc) logp = argv[++i];
        else if (!strcmp(argv[i], "--no-profile")) profile = 0;
        else if (!strcmp(argv[i], "--prefill-breakdown")) breakdown = 1; /* [prefill-breakdown] */
        else if (!strcmp(argv[i], "--gemv-only")) gemv_only = 1;
        else if (!strcmp(argv[i], "--read-sweep")) read_sweep = 1;
        else if (!strcmp(argv[i], "--stamps")) stamps = 1;
        else if (!strcmp(argv[i], "--ncu-decode")) ncu_decode = 1;
        else if (!strcmp(argv[i], "--timeline")) timeline = 1;
        else if (!strcmp(argv[i], "--tune") && i + 1 < argc && n_tunes < 8) tunes[n_tunes++] = argv[++i];
        else if (!strcmp(argv[i], "--vary") && i + 1 < argc && n_vary < 16) vary[n_vary++] = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) g_rows = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s --config config.json [--prefill P] [--decode N] [--layers L] [--log F] "
                            "[--no-profile] [--prefill-breakdown] [--gemv-only] [--read-sweep] [--ncu-decode [--rows 1..8] [--timeline] [--stamps] [--vary key=value:restore[,...]]...] "
                            "[--tune key=value]...\n", argv[0]);
            return 2;
        }
    }
    if (!cfgp || prefill < 1 || ndec < 2 || g_rows < 1 || g_rows > 8 || g_rows > prefill ||
        ((g_rows > 1 || timeline) && !ncu_decode)) {
        fprintf(stderr, "bench_cuda: --config needed; prefill >= 1, decode >= 2; --rows 1..8 (at most the "
                        "prefill) and --timeline with --ncu-decode\n");
        return 2;
    }
    model_t m;
    memset(&m, 0, sizeof m);
    load_cfg(cfgp, &m.c);
    TRY(sn_backend_cuda_new(0, &B));
    O = B->ops;
    for (int i = 0; i < n_tunes; i++) {
        char key[64];
        int val;
        if (sscanf(tunes[i], "%63[^=]=%d", key, &val) != 2) {
            fprintf(stderr, "bench_cuda: --tune %s: want key=value\n", tunes[i]);
            return 2;
        }
        TRY(sn_cuda_tune(B, key, val));
    }
    char dev[128];
    size_t used0, total;
    TRY(sn_cuda_info(B, dev, sizeof dev, &used0, &total, NULL));

    /* the copy ceiling: device-to-device, bytes read + written */
    size_t cb = (size_t)2 << 30;
    float *c0 = dbuf(cb / 4), *c1 = dbuf(cb / 4);
    TRY(O->copy(B, c1, c0, cb));
    TRY(O->sync(B));
    double tc = now();
    for (int i = 0; i < 10; i++) TRY(O->copy(B, c1, c0, cb));
    TRY(O->sync(B));
    double copy_gbs = 2.0 * cb * 10 / (now() - tc) / 1e9;
    double read_gbs = 0;
    TRY(sn_cuda_read_bandwidth(B, (size_t)4 << 30, 10, &read_gbs));
    O->buf_free(B, c0);
    O->buf_free(B, c1);
    if (read_sweep) {
        /* the 35B-A3B's router / out / gate+up / qkvzba and the 27B's out /
         * attention q+k+v / qkvzba / down / gate+up launches, in MB */
        const double mb[] = { 0.6, 1.8, 4.7, 10.6, 17.7, 20.0, 23.6, 29.5, 48.4, 50.1, 100.2, 400.0 };
        printf("bench_cuda --read-sweep: copy %.0f GB/s, read %.0f GB/s\n", copy_gbs, read_gbs);
        for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++) {
            double us = 0;
            const size_t bytes = (size_t)(mb[i] * 1e6);
            TRY(sn_cuda_read_sweep(B, bytes, (size_t)3 << 30, mb[i] > 100 ? 20 : 200, &us));
            printf("  read %7.1f MB: %8.2f us per launch, %6.0f GB/s\n", mb[i], us, bytes / (us * 1e-6) / 1e9);
        }
        /* the 27B step's 257 weight reads as a chain of launches: 16 times
         * three GDN layers (qkv/z/b/a, out, gate+up, down) and one attention
         * layer (q+gate/k/v, o, gate+up, down), then lm_head; plain, with
         * the GEMVs' edges (wait after the first loads) and with the wait
         * after all loads (the launch structure's own cost, no arithmetic) */
        const double gdn[] = { 47.46, 17.70, 100.27, 50.14 }, att[] = { 41.29, 17.70, 100.27, 50.14 };
        size_t chain[257], n = 0, total = 0;
        for (int l = 0; l < 64; l++)
            for (int j = 0; j < 4; j++)
                chain[n++] = (size_t)(((l % 4 == 3) ? att[j] : gdn[j]) * 1e6) / 256 * 256;
        chain[n++] = (size_t)(715.1e6) / 256 * 256;
        for (size_t i = 0; i < n; i++)
            total += chain[i];
        const char *how[] = { "plain launches", "edges, wait after first loads", "edges, wait after all loads",
                              "edges, first loads, SMs filled" };
        printf("  27B step's reads as %zu launches (%.2f GB; %.3f ms at the read rate):\n", n, total / 1e9,
               total / read_gbs / 1e6);
        for (int round = 0; round < 2; round++)
            for (int mode = 0; mode < 4; mode++) {
                double us = 0;
                TRY(sn_cuda_read_chain(B, chain, (int)n, (size_t)4 << 30, mode, 5, &us));
                printf("    round %d %-30s %7.3f ms, %5.2f us a launch above the read rate\n", round + 1, how[mode],
                       us / 1e3, (us - total / read_gbs / 1e3) / n);
            }
        return 0;
    }

    double tb = now();
    build(&m, layers, prefill, prefill + ndec + 8);
    double t_build = now() - tb;
    cfg_t *c = &m.c;
    size_t used, held;
    TRY(sn_cuda_info(B, NULL, 0, &used, NULL, &held));
    if (gemv_only) {
        printf("bench_cuda %s: decode GEMV alone (read-only bound %.0f GB/s)\n", cfgp, read_gbs);
        gemv_micro(&m);
        return 0;
    }

    /* prefill: P random tokens at position 0 (one warm-up run first) */
    int32_t *ids = malloc(sizeof(int32_t) * prefill), tok = 0;
    for (int i = 0; i < prefill; i++) ids[i] = (int32_t)(xs64() % (uint64_t)c->V);
    reset_state(&m);
    forward(&m, ids, prefill, 0, &tok);
    TRY(O->sync(B));
    if (ncu_decode) {
        const double tps = decode_with(&m, NULL, 0, 0, prefill, ndec, &tok);
        int pos = prefill + ndec;
        printf("bench_cuda %s --ncu-decode: decode (graph) %.3f ms per step of %d row%s over %d steps; profiled step next\n",
               cfgp, 1e3 / tps, g_rows, g_rows > 1 ? "s" : "", ndec - 1);
        if (g_rows == 1) step_split(&m, prefill, ndec, &tok);
        for (int round = 0; round < 3 && n_vary; round++)
            for (int v = -1; v < n_vary; v++) {
                /* key=value:restore, or several joined by commas (set in
                 * order, restored in reverse) */
                enum { VK = 4 };
                char key[VK][64];
                int val[VK], restore[VK], nk = 0;
                for (const char *q = v >= 0 ? vary[v] : ""; *q && nk < VK;) {
                    int used = 0;
                    if (sscanf(q, "%63[^=,]=%d:%d%n", key[nk], &val[nk], &restore[nk], &used) != 3 ||
                        (q[used] && q[used] != ',')) {
                        fprintf(stderr, "bench_cuda: --vary %s: want key=value:restore[,key=value:restore]...\n",
                                vary[v]);
                        return 2;
                    }
                    nk++;
                    q += used + (q[used] == ',');
                }
                for (int k = 0; k < nk; k++) TRY(sn_cuda_tune(B, key[k], val[k]));
                /* the same positions each time (as the variants below do) */
                double ms = 1e3 / decode_with(&m, NULL, 0, 0, prefill, ndec, &tok);
                for (int k = nk - 1; k >= 0; k--) TRY(sn_cuda_tune(B, key[k], restore[k]));
                printf("  round %d %-20s decode (graph) %.3f ms per step = %.1f tok/s\n", round,
                       v >= 0 ? vary[v] : "default", ms, 1e3 / ms);
            }
        if (timeline) timeline_report(&m, prefill, &tok);
        if (stamps) stamps_report(&m, prefill, &tok);
        TRY(sn_cuda_profiler_range(B, 1));
        TRY(O->begin_step(B));
        forward(&m, &tok, 1, pos++, &tok);
        TRY(O->end_step(B));
        TRY(sn_cuda_profiler_range(B, 0));
        return 0;
    }
    reset_state(&m);
    TRY(O->sync(B));
    double tp = now();
    forward(&m, ids, prefill, 0, &tok);
    double ttft = now() - tp; /* argmax returned the first token: the GPU is done */
    /* the same prefill with our own tensor-core GEMM instead of cuBLAS, and
     * both in the single-pass fp16 form */
    double ttft_own = 0, ttft_fast = 0, ttft_fast_own = 0;
    int have_blas = strstr(dev, "cuBLAS") != NULL;
    TRY(sn_cuda_tune(B, "gemm_i8", 0)); /* [gemm_i8] the fp16 GEMMs for the variants below */
    for (int v = 0; v < 3; v++) {
        if (v == 0 && !have_blas) continue;
        TRY(sn_cuda_tune(B, "cublas_min_t", v == 1 && have_blas ? 64 : 0));
        TRY(sn_cuda_tune(B, "gemm_fast", v >= 1));
        reset_state(&m);
        TRY(O->sync(B));
        double t1 = now();
        forward(&m, ids, prefill, 0, &tok);
        double dt = now() - t1;
        if (v == 0) ttft_own = dt;
        else if (v == 1) ttft_fast = dt;
        else ttft_fast_own = dt;
    }
    TRY(sn_cuda_tune(B, "gemm_fast", 0));
    if (have_blas) TRY(sn_cuda_tune(B, "cublas_min_t", 64));
    /* [gemm_i8] the integer tensor-core GEMM (3 digits, 2 digits), then the split fp16x3 GEMM with
     * cuBLAS as it loaded; the creation default (SANCTUM_CUDA_GEMM) is restored */
    const char *gemm_env = getenv("SANCTUM_CUDA_GEMM");
    /* v 3: x as fp16 hi + lo on the fp16 tensor cores (gemm_i8 = 4); each form's last-token logits
     * against the 3-digit form's: max |difference| over max |logit| */
    static const int i8_modes[4] = { 3, 2, 0, 4 };
    double ttft_i8[4], dlog[4] = { 0, 0, 0, 0 };
    float *lg0 = malloc(sizeof(float) * c->V), *lgv = malloc(sizeof(float) * c->V);
    if (!lg0 || !lgv) {
        fprintf(stderr, "bench_cuda: out of host memory for the logits\n");
        return 1;
    }
    /* SANCTUM_BENCH_HILO=0 leaves the hi/lo form out (bench/gpu_call.sh: when its GEMM test failed, so a
     * fault there cannot take the record's lines with it) */
    const char *hl_env = getenv("SANCTUM_BENCH_HILO");
    const int with_hl = !hl_env || strcmp(hl_env, "0");
    for (int v = 0; v < 4; v++) {
        if (v == 3 && !with_hl) {
            ttft_i8[3] = NAN;
            continue;
        }
        TRY(sn_cuda_tune(B, "gemm_i8", i8_modes[v]));
        reset_state(&m);
        TRY(O->sync(B));
        double t1 = now();
        forward(&m, ids, prefill, 0, &tok);
        ttft_i8[v] = now() - t1;
        TRY(O->to_host(B, v ? lgv : lg0, m.logits, sizeof(float) * c->V));
        if (v) {
            double mx = 0, md = 0;
            for (int i = 0; i < c->V; i++) {
                mx = fmax(mx, fabs(lg0[i]));
                md = fmax(md, fabs((double)lgv[i] - lg0[i]));
            }
            dlog[v] = mx > 0 ? md / mx : md;
        }
    }
    free(lg0);
    free(lgv);
    TRY(sn_cuda_tune(B, "gemm_i8", sn_cuda_gemm_i8_of(gemm_env)));
    /* [gemm_i8] end */
    reset_state(&m);
    forward(&m, ids, prefill, 0, &tok);
    float probe[8];
    TRY(O->to_host(B, probe, m.logits, sizeof probe));
    int finite = 1;
    for (int i = 0; i < 8; i++) finite &= isfinite(probe[i]) != 0;

    /* decode: graph replay, then eager, each ndec steps after the prompt */
    double *lat = malloc(sizeof(double) * ndec);
    int pos = prefill;
    for (int i = 0; i < ndec; i++) {
        double t0 = now();
        decode_step(&m, pos++, &tok);
        lat[i] = now() - t0;
    }
    double tot = 0;
    for (int i = 1; i < ndec; i++) tot += lat[i]; /* step 0 captured the graph */
    double dec_graph = (ndec - 1) / tot;
    qsort(lat + 1, ndec - 1, sizeof(double), cmp_d);
    double med = lat[1 + (ndec - 1) / 2];
    /* the same steps recorded in turn (SANCTUM_RECORD_AHEAD=0), from the same positions */
    const int keep_ahead = g_ahead;
    g_ahead = !keep_ahead;
    pos = prefill;
    double t_other = 0;
    for (int i = 0; i < ndec; i++) {
        double t0 = now();
        decode_step(&m, pos++, &tok);
        if (i) t_other += now() - t0;
    }
    g_ahead = keep_ahead;
    const double dec_other = (ndec - 1) / t_other;
    long rep, cap, eag;
    sn_cuda_graph_stats(B, &rep, &cap, &eag);
    /* graph without the GEMV grouping / add folding */
    TRY(sn_cuda_tune(B, "fuse", 0));
    int nnf = ndec / 2 < 8 ? 8 : ndec / 2;
    pos = prefill;
    double tn = 0;
    for (int i = 0; i < nnf; i++) {
        double t0 = now();
        TRY(O->begin_step(B));
        forward(&m, &tok, 1, pos++, &tok);
        TRY(O->end_step(B));
        if (i) tn += now() - t0;
    }
    double dec_nofuse = (nnf - 1) / tn;
    TRY(sn_cuda_tune(B, "fuse", 1));
    /* decode variants (graph): PDL for every kernel and off (default: the weight kernels), the fp32 GEMV, the integer GEMV's ring form */
    int nv = ndec / 2 < 8 ? 8 : ndec / 2;
    double dec_pdl = decode_with(&m, "pdl", 1, 2, prefill, nv, &tok);
    double dec_nopdl = decode_with(&m, "pdl", 0, 2, prefill, nv, &tok);
    double dec_fp32 = decode_with(&m, "gemv_i8", 0, 1, prefill, nv, &tok);
    double dec_ring = decode_with(&m, "gemv_sk", 0, 1, prefill, nv, &tok);
    double dec_bps1 = decode_with(&m, "gemv_sk_bps", 1, 2, prefill, nv, &tok);
    /* the fp32 GEMV below a size, the integer one above (gemv_i8_min_kb; the default, restored after, picks by shape) */
    const int min_kb_def = -1, min_kbs[4] = { 0, 4096, 12288, 24576 };
    double dec_min[4];
    for (int i = 0; i < 4; i++)
        dec_min[i] = decode_with(&m, "gemv_i8_min_kb", min_kbs[i], min_kb_def, prefill, nv, &tok);
    double dec_nosh = 0; /* [moe] the shared expert as its own three GEMVs and swiglu */
    if (c->E > 0) {
        g_moe_shared = 0;
        dec_nosh = decode_with(&m, NULL, 0, 0, prefill, nv, &tok);
        g_moe_shared = 1;
    }
    double dec_moe0 = c->E > 0 ? decode_with(&m, "moe_dec", 0, 1, prefill, nv, &tok) : 0; /* [moe] */
    double dec_moe2 = c->E > 0 ? decode_with(&m, "moe_dec", 2, 1, prefill, nv, &tok) : 0; /* [moe] */
    double dec_gu8 = c->E > 0 ? decode_with(&m, "moe_gu_warps", 8, 4, prefill, nv, &tok) : 0; /* [moe] */
    double dec_rt0 = c->E > 0 ? decode_with(&m, "moe_route", 0, 1, prefill, nv, &tok) : 0;    /* [moe] */
    double dec_dn0 = c->E > 0 ? decode_with(&m, "moe_dn_early", 0, 1, prefill, nv, &tok) : 0; /* [moe] */
    double dec_ge0 = c->E > 0 ? decode_with(&m, "moe_gu_edge", 0, 1, prefill, nv, &tok) : 0;  /* [moe] */
    double dec_dp0 = c->E > 0 ? decode_with(&m, "moe_dp", 0, 1, prefill, nv, &tok) : 0;       /* [moe] */
    /* the one-kernel GDN step (slower), and the three kernels (the two-kernel step is the default) */
    double dec_gdn1 = decode_with(&m, "gdn_step", 1, 2, prefill, nv, &tok);
    double dec_gdn0 = decode_with(&m, "gdn_step", 0, 2, prefill, nv, &tok);
    /* the gated attention's q/k norms, RoPEs and KV write as four launches (one by default: run 37) */
    double dec_prep = decode_with(&m, "fuse_attn_prep", 0, 1, prefill, nv, &tok);
    double dec_small = decode_with(&m, "pdl_small", 31, 0, prefill, nv, &tok);
    /* eager: fewer steps (same positions range) */
    int neager = ndec / 4 < 8 ? 8 : ndec / 4;
    pos = prefill;
    double te = now();
    for (int i = 0; i < neager; i++) forward(&m, &tok, 1, pos++, &tok);
    double dec_eager = neager / (now() - te);
    double gbs = bytes_decode * dec_graph / 1e9;

    printf("bench_cuda %s on %s: %d layers (%s), H=%d, V=%d\n", cfgp, dev, c->L,
           c->E > 0 ? "MoE" : "dense", c->H, c->V);
    printf("  weights %.2f GB (Q4 g64, router/shared gate Q8), %.2f GB read per decode token; built in %.1f s\n",
           bytes_total / 1e9, bytes_decode / 1e9, t_build);
    printf("  GPU memory: %.2f GB in use (%.2f GB held by the backend) of %.1f GB\n", used / 1e9, held / 1e9,
           total / 1e9);
    printf("  copy bandwidth (d2d, read+write): %.0f GB/s; read-only streaming kernel: %.0f GB/s\n", copy_gbs,
           read_gbs);
    printf("  prefill %d tokens (default GEMM, SANCTUM_CUDA_GEMM=%s): %.3f s = %.0f tok/s (TTFT %.1f ms)%s\n", /* [gemm_i8] */
           prefill, gemm_env ? gemm_env : "hilo (unset)", ttft, prefill / ttft, ttft * 1e3, finite ? "" : "  [non-finite logits!]");
    if (have_blas)
        printf("  prefill %d tokens, fp32-class GEMM, own kernel (no cuBLAS): %.3f s = %.0f tok/s\n", prefill,
               ttft_own, prefill / ttft_own);
    if (have_blas)
        printf("  prefill %d tokens, single-pass fp16 GEMM via cuBLAS: %.3f s = %.0f tok/s\n", prefill, ttft_fast,
               prefill / ttft_fast);
    printf("  prefill %d tokens, single-pass fp16 GEMM, own kernel: %.3f s = %.0f tok/s\n", prefill, ttft_fast_own,
           prefill / ttft_fast_own);
    /* [gemm_i8] */
    printf("  prefill %d tokens, integer tensor-core GEMM (repacked Q4), 3 digits (fp32-class, i8): %.3f s = %.0f tok/s\n",
           prefill, ttft_i8[0], prefill / ttft_i8[0]);
    printf("  prefill %d tokens, integer tensor-core GEMM, 2 digits (16-bit x, i8fast): %.3f s = %.0f tok/s "
           "(logits off the 3 digits' by %.2e of their largest)\n", prefill, ttft_i8[1], prefill / ttft_i8[1], dlog[1]);
    printf("  prefill %d tokens, fp16 hi/lo GEMM (22-bit x, hilo): %.3f s = %.0f tok/s (logits off the 3 digits' by "
           "%.2e of their largest)\n", prefill, ttft_i8[3], prefill / ttft_i8[3], dlog[3]);
    printf("  prefill %d tokens, fp32-class split fp16x3 GEMM%s (split): %.3f s = %.0f tok/s (logits off the 3 digits' "
           "by %.2e of their largest)\n", prefill, have_blas ? " via cuBLAS" : ", own kernel", ttft_i8[2],
           prefill / ttft_i8[2], dlog[2]);
    printf("  decode (graph): %.1f tok/s (median step %.3f ms), %.0f GB/s = %.0f%% of copy bandwidth, %.0f%% of "
           "read-only (%s)\n", dec_graph, med * 1e3, gbs, 100.0 * gbs / copy_gbs, 100.0 * gbs / read_gbs,
           g_ahead ? "each step recorded while the one before runs" : "SANCTUM_RECORD_AHEAD=0: steps recorded in turn");
    printf("  decode (graph), %s: %.1f tok/s\n",
           g_ahead ? "steps recorded in turn (SANCTUM_RECORD_AHEAD=0)" : "each step recorded ahead (the default)",
           dec_other);
    step_split(&m, prefill, ndec, &tok);
    printf("  decode (graph, no GEMV grouping): %.1f tok/s; (eager): %.1f tok/s; graphs captured %ld, replayed %ld, "
           "eager steps %ld\n", dec_nofuse, dec_eager, cap, rep, eag);
    printf("  decode (graph) variants: PDL for every kernel %.1f tok/s, PDL off %.1f; fp32 GEMV "
           "%.1f; integer GEMV in its ring form %.1f\n",
           dec_pdl, dec_nopdl, dec_fp32, dec_ring);
    printf("  decode (graph), stream-K GEMV split for 1 block per SM: %.1f tok/s\n", dec_bps1);
    printf("  decode (graph), fp32 GEMV for launches under N MB of 4-bit weights: N=0 %.1f, 4 %.1f, 12 %.1f, 24 %.1f tok/s\n",
           dec_min[0], dec_min[1], dec_min[2], dec_min[3]);
    if (c->E > 0) /* [moe] */
        printf("  decode (graph), shared expert as its own GEMVs (no moe_shared): %.1f tok/s\n", dec_nosh);
    if (c->E > 0) /* [moe] */
        printf("  decode (graph) MoE variants: old route/gate_up/down/sum kernels %.1f tok/s; two-launch MoE with "
               "the L2 prefetch (moe_dec=2) %.1f; gate/up in 8-warp blocks (moe_gu_warps=8) %.1f; routing by warp 0 "
               "alone (moe_route=0) %.1f; down kernel after the gate/up kernel (moe_dn_early=0) %.1f; gate/up kernel "
               "after the router (moe_gu_edge=0) %.1f; gate/up on fp32 FMAs, not dp4a (moe_dp=0) %.1f\n", dec_moe0,
               dec_moe2, dec_gu8, dec_rt0, dec_dn0, dec_ge0, dec_dp0);
    printf("  decode (graph), the one-kernel GDN step (gdn_step=1): %.1f tok/s; conv, conv state and recurrence as "
           "three kernels (gdn_step=0): %.1f\n", dec_gdn1, dec_gdn0);
    printf("  decode (graph), q/k norms, RoPEs, KV write as four launches (fuse_attn_prep=0): %.1f tok/s\n", dec_prep);
    printf("  decode (graph), the small kernels on the PDL edge too (pdl_small=31): %.1f tok/s\n", dec_small);
    gemv_micro(&m);
    /* [prefill-breakdown] one prefill per setting of the prefill kernels
     * (cuda_prefill.cu: chunked GDN + flash attention, or the old ones),
     * timed whole and then per op with CUDA events; leaves the new ones on */
    if (breakdown) {
        for (int nw = 1; nw >= 0; nw--) {
            sn_cuda_prefill_mode(nw ? SN_CUDA_PREFILL_NEW : SN_CUDA_PREFILL_OLD, 0);
            reset_state(&m);
            TRY(O->sync(B));
            double t1 = now();
            forward(&m, ids, prefill, 0, &tok);
            double dt = now() - t1;
            reset_state(&m);
            TRY(O->sync(B));
            sn_cuda_profile(B, 1);
            forward(&m, ids, prefill, 0, &tok);
            printf("  prefill %d tokens, %s prefill kernels: %.3f s = %.0f tok/s; per op (eager, CUDA events):\n",
                   prefill, nw ? "new (chunked GDN, flash attention)" : "old (serial GDN, SIMT attention)", dt,
                   prefill / dt);
            TRY(sn_cuda_profile_report(B, stdout));
            sn_cuda_profile(B, 0);
        }
        sn_cuda_prefill_mode(SN_CUDA_PREFILL_NEW, 0);
    }
    if (profile) {
        sn_cuda_profile(B, 1);
        forward(&m, &tok, 1, pos++, &tok);
        printf("  one decode step, per op (eager, CUDA events):\n");
        TRY(sn_cuda_profile_report(B, stdout));
        sn_cuda_profile(B, 0);
    }
    if (logp) {
        FILE *f = fopen(logp, "a");
        if (f) {
            time_t tt = time(NULL);
            char ts[32];
            strftime(ts, sizeof ts, "%Y-%m-%dT%H:%MZ", gmtime(&tt));
            fprintf(f, "%s bench_cuda %s on %s: %d layers; decode %.1f tok/s (graph, %s; %s %.1f; eager %.1f), "
                       "%.0f GB/s of %.0f GB/s copy (%.0f%%); prefill %d: %.0f tok/s, TTFT %.0f ms; GPU mem %.1f GB | "
                       "cmd: %sbuild/bench_cuda --config %s --prefill %d --decode %d%s\n",
                    ts, cfgp, dev, c->L, dec_graph, g_ahead ? "recorded ahead" : "recorded in turn",
                    g_ahead ? "in turn" : "ahead", dec_other, dec_eager, gbs, copy_gbs, 100.0 * gbs / copy_gbs,
                    prefill, prefill / ttft, ttft * 1e3, used / 1e9, g_ahead ? "" : "SANCTUM_RECORD_AHEAD=0 ", cfgp,
                    prefill, ndec, layers ? " --layers N" : "");
            fclose(f);
        }
    }
    free(ids);
    free(lat);
    sn_backend_free(B);
    return finite ? 0 : 1;
}

#else
int main(void)
{
    fprintf(stderr, "bench_cuda: built without CUDA\n");
    return 1;
}
#endif
