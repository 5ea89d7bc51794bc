/* The prefill kernels of src/backend/cuda/cuda_prefill.cu (issue 6): the
 * chunked GatedDeltaNet delta rule (chunk 64) and the tensor-core causal
 * flash attention.
 *
 * Part 1 runs everywhere (plain C, no GPU): the chunked algorithm exactly
 * as the two GDN kernels decompose it (per chunk: log-decay prefix sums in
 * double, the strictly lower A = beta_i k_i.k_j exp(G_i - G_j), forward
 * substitution of (I + A) X = [beta v | beta exp(G) k] for U and W, then
 * per chunk Vn = U - W S, O = exp(G) (Q S) + (Q K^T o Gamma) Vn,
 * S = exp(G_last) S + (K exp(G_last - G))^T Vn) against the token-serial
 * recurrence of the scalar CPU oracle (ops_ref.c cpu_op_gdn_head, same
 * fp32 operation order), on random inputs with decays near 0 (and exactly
 * 0), near 1, mixed, beta in [0, 1] incl. exact 0 and 1, T = 1..200 and
 * 1000 (not multiples of 64), a random initial state.
 *   Bound: rel L2 error of out and of the final S <= 2e-5 (the bound
 *   test_cuda_ops uses for every fp32 path); measured values are printed.
 *
 * Part 1b (no GPU): tests/cuda_prefill_emu.h runs the flash attention
 * kernel's index math on the host (mma.sync emulated from the PTX fragment
 * layout) against an fp64 attention: rel <= 2e-5 (measured ~1e-7).
 *
 * Part 2 (GPU): the backend's gdn and attention ops with the new kernels
 * (sn_cuda_prefill_mode(1, ...)) against the scalar CPU backend, and
 * against the old kernels (mode 0), on odd T (1, 63, 64, 65, 200, 1000),
 * GQA ratios 1..8, head_dim 64/96/128/256, T past a cached prefix (pos0 >
 * 0), prefill(L) vs prefill(L-1) + decode of token L, and the GDN state
 * and conv state after the call.
 *   Bounds: GDN out and S rel <= 2e-5; attention rel <= 2e-5 (split
 *   fp16 hi/lo operands, fp32 accumulation and softmax).
 * Without a GPU part 2 says SKIP. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sanctum/backend.h"
#include "sanctum/cpu.h"

#define TU_SEED 0x243f6a8885a308d3ull
#include "cuda_test_util.h"

static float rnd_u(void) { return (float)(rnd_u32() & 0xffffff) / 16777216.0f; } /* [0, 1) */

static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i]) || isinf(a[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------------ */
/* Part 1: the chunked delta rule in C                                 */
/* ------------------------------------------------------------------ */

/* One value head, token-serial, in cpu_op_gdn_head's operation order.
 * q, k [T, Dk] (already normalised), v [T, Dv], S [Dk, Dv]. */
static void serial_head(int T, int Dk, int Dv, const float *q, const float *k, const float *v, const float *beta,
                        const float *decay, float *S, float *out)
{
    float *kv = malloc(sizeof(float) * Dv);
    for (int t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * Dk, *kt = k + (size_t)t * Dk, *vt = v + (size_t)t * Dv;
        memset(kv, 0, sizeof(float) * Dv);
        for (int i = 0; i < Dk; i++)
            for (int x = 0; x < Dv; x++) {
                S[(size_t)i * Dv + x] *= decay[t];
                kv[x] += kt[i] * S[(size_t)i * Dv + x];
            }
        for (int x = 0; x < Dv; x++) kv[x] = (v[(size_t)t * Dv + x] - kv[x]) * beta[t];
        float *o = out + (size_t)t * Dv;
        memset(o, 0, sizeof(float) * Dv);
        for (int i = 0; i < Dk; i++)
            for (int x = 0; x < Dv; x++) {
                S[(size_t)i * Dv + x] += kt[i] * kv[x];
                o[x] += qt[i] * S[(size_t)i * Dv + x];
            }
        (void)vt;
    }
    free(kv);
}

#define CH 64

/* The chunked form, step for step as cuda_prefill.cu computes it (fp32
 * except the log-decay prefix sums, which are double there too). */
static void chunked_head(int T, int Dk, int Dv, const float *q, const float *k, const float *v, const float *beta,
                         const float *decay, float *S, float *out)
{
    static float L[CH][CH], Ai[CH][CH];
    float *U = malloc(sizeof(float) * CH * Dv), *W = malloc(sizeof(float) * CH * Dk);
    float *Vn = malloc(sizeof(float) * CH * Dv), *x = malloc(sizeof(float) * CH);
    for (int c0 = 0; c0 < T; c0 += CH) {
        int n = T - c0 < CH ? T - c0 : CH;
        double G[CH], acc = 0;
        float bt[CH], gam[CH], kdec[CH];
        for (int i = 0; i < CH; i++) {
            float g = 0.f;
            if (i < n) {
                g = logf(decay[c0 + i]);
                if (!(g > -200.f)) g = -200.f; /* decay 0 (or denormal): exp(-200) is 0 in fp32 */
            }
            acc += g;
            G[i] = acc;
            bt[i] = i < n ? beta[c0 + i] : 0.f;
        }
        for (int i = 0; i < CH; i++) {
            gam[i] = expf((float)G[i]);
            kdec[i] = expf((float)(G[CH - 1] - G[i]));
        }
#define KR(i, d) ((i) < n ? k[(size_t)(c0 + (i)) * Dk + (d)] : 0.f)
#define QR(i, d) ((i) < n ? q[(size_t)(c0 + (i)) * Dk + (d)] : 0.f)
        /* kernel A: A and Ai, then the forward substitution per column */
        for (int i = 0; i < CH; i++)
            for (int j = 0; j < CH; j++) {
                float kk = 0.f, qk = 0.f;
                for (int d = 0; d < Dk; d++) {
                    kk = fmaf(KR(i, d), KR(j, d), kk);
                    qk = fmaf(QR(i, d), KR(j, d), qk);
                }
                float e = expf((float)(G[i] - G[j]));
                L[i][j] = j < i ? bt[i] * e * kk : 0.f;
                Ai[i][j] = j <= i ? e * qk : 0.f;
            }
        for (int col = 0; col < Dv + Dk; col++) {
            for (int i = 0; i < CH; i++) {
                if (col < Dv)
                    x[i] = i < n ? bt[i] * v[(size_t)(c0 + i) * Dv + col] : 0.f;
                else
                    x[i] = bt[i] * gam[i] * KR(i, col - Dv);
            }
            for (int i = 1; i < CH; i++)
                for (int j = 0; j < i; j++)
                    x[i] = fmaf(-L[i][j], x[j], x[i]);
            for (int i = 0; i < CH; i++) {
                if (col < Dv) U[i * Dv + col] = x[i];
                else W[i * Dk + col - Dv] = x[i];
            }
        }
        /* kernel B: the state pass */
        for (int i = 0; i < CH; i++)
            for (int col = 0; col < Dv; col++) {
                float a = U[i * Dv + col], o = 0.f;
                for (int d = 0; d < Dk; d++) {
                    a = fmaf(-W[i * Dk + d], S[(size_t)d * Dv + col], a);
                    o = fmaf(QR(i, d), S[(size_t)d * Dv + col], o);
                }
                Vn[i * Dv + col] = a;
                U[i * Dv + col] = o; /* U is dead once Vn is formed: reuse it for Q S */
            }
        for (int i = 0; i < n; i++)
            for (int col = 0; col < Dv; col++) {
                float o = gam[i] * U[i * Dv + col];
                for (int j = 0; j < CH; j++)
                    o = fmaf(Ai[i][j], Vn[j * Dv + col], o);
                out[(size_t)(c0 + i) * Dv + col] = o;
            }
        for (int d = 0; d < Dk; d++)
            for (int col = 0; col < Dv; col++) {
                float a = 0.f;
                for (int j = 0; j < CH; j++)
                    a = fmaf(kdec[j] * KR(j, d), Vn[j * Dv + col], a);
                S[(size_t)d * Dv + col] = fmaf(gam[CH - 1], S[(size_t)d * Dv + col], a);
            }
#undef KR
#undef QR
    }
    free(U); free(W); free(Vn); free(x);
}

static void l2rows(float *x, int T, int D, float extra)
{
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)x[(size_t)t * D + d] * x[(size_t)t * D + d];
        float inv = (float)(1.0 / sqrt(ss + 1e-6)) * extra;
        for (int d = 0; d < D; d++) x[(size_t)t * D + d] *= inv;
    }
}

/* decay kinds: 0 mixed exp(-U(0,8)), 1 near 1, 2 near 0 (some exactly 0), 3 alternating 1 and tiny,
 * 4 near 1 with nearly parallel keys and beta mostly 1 */
static double g_worst_o, g_worst_s;
static void math_case(int T, int Dk, int Dv, int kind)
{
    float *q = hrand((size_t)T * Dk, 1.f), *k = hrand((size_t)T * Dk, 1.f), *v = hrand((size_t)T * Dv, 1.f);
    if (kind == 4) /* nearly parallel keys: the worst conditioning of I + A */
        for (int t = 1; t < T; t++)
            for (int d = 0; d < Dk; d++) k[(size_t)t * Dk + d] = k[d] + 0.05f * k[(size_t)t * Dk + d];
    l2rows(q, T, Dk, 1.f / sqrtf((float)Dk));
    l2rows(k, T, Dk, 1.f);
    float *beta = malloc(sizeof(float) * T), *decay = malloc(sizeof(float) * T);
    for (int t = 0; t < T; t++) {
        float u = rnd_u();
        beta[t] = kind == 4 ? (t % 3 ? 1.f : u) : t % 17 == 3 ? 0.f : t % 13 == 5 ? 1.f : u;
        float r = rnd_u();
        switch (kind) {
        case 0: decay[t] = expf(-8.f * r); break;
        case 1: decay[t] = expf(-1e-3f * r); break;
        case 2: decay[t] = t % 7 == 2 ? 0.f : expf(-60.f - 40.f * r); break;
        case 4: decay[t] = expf(-0.01f * r); break;
        default: decay[t] = t % 2 ? 1.f : expf(-30.f * r); break;
        }
    }
    size_t ns = (size_t)Dk * Dv;
    float *S0 = hrand(ns, 0.3f), *S1 = malloc(sizeof(float) * ns), *S2 = malloc(sizeof(float) * ns);
    memcpy(S1, S0, sizeof(float) * ns);
    memcpy(S2, S0, sizeof(float) * ns);
    float *o1 = malloc(sizeof(float) * T * Dv), *o2 = malloc(sizeof(float) * T * Dv);
    serial_head(T, Dk, Dv, q, k, v, beta, decay, S1, o1);
    chunked_head(T, Dk, Dv, q, k, v, beta, decay, S2, o2);
    double eo = rel_err(o2, o1, (size_t)T * Dv), es = rel_err(S2, S1, ns);
    if (eo > g_worst_o) g_worst_o = eo;
    if (es > g_worst_s) g_worst_s = es;
    CHECKF(eo <= 2e-5 && es <= 2e-5, "chunked vs serial T=%d Dk=%d Dv=%d decay kind %d: out %.3g S %.3g", T, Dk, Dv,
           kind, eo, es);
    free(q); free(k); free(v); free(beta); free(decay); free(S0); free(S1); free(S2); free(o1); free(o2);
}

static void test_chunked_math(void)
{
    static const int Ts[] = { 1, 2, 5, 31, 63, 64, 65, 100, 127, 128, 129, 200 };
    g_worst_o = g_worst_s = 0;
    for (int kind = 0; kind < 5; kind++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
            math_case(Ts[i], 32, 24, kind);
    for (int kind = 0; kind < 5; kind++) math_case(200, 128, 128, kind);
    math_case(1000, 64, 64, 0);
    math_case(1000, 64, 64, 1);
    fprintf(stderr, "  chunked vs serial (C): worst rel out %.3g, S %.3g\n", g_worst_o, g_worst_s);
}

/* Part 1b: the flash attention kernel's index math, emulated on the host */
#include "cuda_prefill_emu.h"

static void test_flash_emulated(void)
{
    emu_worst = 0;
    emu_run(65, 0, 4, 2, 128, 1.f);
    emu_run(200, 0, 6, 2, 256, 1.f);
    emu_run(70, 50, 4, 4, 64, 1.f);
    emu_run(90, 5, 3, 3, 96, 1.f);
    emu_run(130, 70, 4, 1, 256, 1.f);
    emu_run(128, 0, 2, 2, 128, 4.f);
    emu_run(128, 0, 2, 2, 128, 0.05f);
    emu_run(1, 0, 2, 1, 128, 1.f);
    fprintf(stderr, "  emulated flash kernel vs fp64 attention: worst rel %.3g\n", emu_worst);
}

/* ------------------------------------------------------------------ */
/* Part 2: the kernels on the GPU                                      */
/* ------------------------------------------------------------------ */

#ifdef SN_HAVE_CUDA
#include "backend/cuda/sn_cuda.h"

static sn_backend *C;

static int g_min_t = 64;
static void set_mode(int on) { sn_cuda_prefill_mode(on ? SN_CUDA_PREFILL_NEW : SN_CUDA_PREFILL_OLD, g_min_t); }

static double w_gdn_o, w_gdn_s, w_att;

/* The backend's gdn op: CPU oracle vs GPU new vs GPU old. */
static void gdn_case(int Hk, int Hv, int Dk, int Dv, int K, int T, int kind)
{
    sn_gdn_dims d = { Hk, Hv, Dk, Dv, K, 1e-6f };
    size_t Cd = 2 * (size_t)Hk * Dk + (size_t)Hv * Dv, ns = (size_t)Hv * Dk * Dv, nc = (size_t)(K - 1) * Cd;
    float *qkv = hrand((size_t)T * Cd, 2.f), *a = hrand((size_t)T * Hv, 3.f), *b = hrand((size_t)T * Hv, 3.f);
    float *cw = hrand(Cd * K, 0.7f), *Al = hrand((size_t)Hv, 1.f), *dtb = hrand((size_t)Hv, 1.f);
    if (kind == 1) /* slow decays: A small, a + dt_bias very negative */
        for (int i = 0; i < Hv; i++) { Al[i] = -6.f + rnd_f(1.f); dtb[i] = -4.f; }
    if (kind == 2) /* fast decays (down to exactly 0 in fp32) */
        for (int i = 0; i < Hv; i++) { Al[i] = 3.f + rnd_f(1.f); dtb[i] = 4.f; }
    float *conv = hrand(nc, 1.f), *S = hrand(ns, 0.3f);
    float *conv_c = malloc(sizeof(float) * nc + 4), *S_c = malloc(sizeof(float) * ns);
    memcpy(conv_c, conv, sizeof(float) * nc);
    memcpy(S_c, S, sizeof(float) * ns);
    float *ref = malloc(sizeof(float) * T * Hv * Dv);
    sn_gdn_view hst = { conv_c, S_c, NULL, 0 };
    CHECK_OK(C->ops->gdn(C, &d, qkv, a, b, cw, Al, dtb, &hst, T, ref));
    float *dqkv = dcopy(qkv, (size_t)T * Cd), *da = dcopy(a, (size_t)T * Hv), *db = dcopy(b, (size_t)T * Hv);
    float *dcw = dcopy(cw, Cd * K), *dAl = dcopy(Al, Hv), *ddt = dcopy(dtb, Hv);
    for (int mode = 1; mode >= 0; mode--) {
        set_mode(mode);
        float *dconv = dcopy(conv, nc), *dS = dcopy(S, ns), *dout = dpoison((size_t)T * Hv * Dv);
        sn_gdn_view gst = { dconv, dS, NULL, 0 };
        CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &gst, T, dout));
        float *out = tohost(dout, (size_t)T * Hv * Dv), *Sg = tohost(dS, ns), *cg = tohost(dconv, nc);
        double e1 = rel_err(out, ref, (size_t)T * Hv * Dv), e2 = rel_err(Sg, S_c, ns), e3 = rel_err(cg, conv_c, nc);
        if (mode && e1 > w_gdn_o) w_gdn_o = e1;
        if (mode && e2 > w_gdn_s) w_gdn_s = e2;
        CHECKF(e1 <= 2e-5 && e2 <= 2e-5 && e3 == 0.0,
               "gdn %s Hk=%d Hv=%d Dk=%d Dv=%d K=%d T=%d kind %d: out %.3g S %.3g conv %.3g", mode ? "new" : "old",
               Hk, Hv, Dk, Dv, K, T, kind, e1, e2, e3);
        free(out); free(Sg); free(cg);
        dfree(dconv); dfree(dS); dfree(dout);
    }
    set_mode(1);
    free(qkv); free(a); free(b); free(cw); free(Al); free(dtb); free(conv); free(S); free(conv_c); free(S_c);
    free(ref);
    dfree(dqkv); dfree(da); dfree(db); dfree(dcw); dfree(dAl); dfree(ddt);
}

static void test_gdn_chunked(void)
{
    static const int Ts[] = { 1, 63, 64, 65, 200, 1000 };
    w_gdn_o = w_gdn_s = 0;
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) gdn_case(2, 4, 128, 128, 4, Ts[i], 0);
    gdn_case(1, 3, 48, 40, 4, 130, 0);   /* Dk, Dv not multiples of 32 */
    gdn_case(3, 3, 32, 64, 2, 97, 0);
    gdn_case(2, 2, 256, 96, 4, 150, 0);  /* the widest Dk */
    gdn_case(2, 4, 128, 128, 4, 300, 1); /* decays near 1 */
    gdn_case(2, 4, 128, 128, 4, 300, 2); /* decays near 0 */
    gdn_case(16, 48, 128, 128, 4, 256, 0); /* the 27B layer */
    fprintf(stderr, "  gdn new vs CPU: worst rel out %.3g, S %.3g\n", w_gdn_o, w_gdn_s);
}

/* prefill(L) == prefill(L-1) + one decode token, state and outputs */
static void test_gdn_split(void)
{
    int Hk = 2, Hv = 6, Dk = 128, Dv = 128, K = 4, T = 150;
    sn_gdn_dims d = { Hk, Hv, Dk, Dv, K, 1e-6f };
    size_t Cd = 2 * (size_t)Hk * Dk + (size_t)Hv * Dv, ns = (size_t)Hv * Dk * Dv, nc = (size_t)(K - 1) * Cd;
    float *qkv = hrand((size_t)T * Cd, 2.f), *a = hrand((size_t)T * Hv, 3.f), *b = hrand((size_t)T * Hv, 3.f);
    float *cw = hrand(Cd * K, 0.7f), *Al = hrand((size_t)Hv, 1.f), *dtb = hrand((size_t)Hv, 1.f);
    float *dqkv = dcopy(qkv, (size_t)T * Cd), *da = dcopy(a, (size_t)T * Hv), *db = dcopy(b, (size_t)T * Hv);
    float *dcw = dcopy(cw, Cd * K), *dAl = dcopy(Al, Hv), *ddt = dcopy(dtb, Hv);
    float *z = calloc(ns, sizeof(float));
    float *c1 = dcopy(z, nc), *S1 = dcopy(z, ns), *c2 = dcopy(z, nc), *S2 = dcopy(z, ns);
    float *o1 = dpoison((size_t)T * Hv * Dv), *o2 = dpoison((size_t)T * Hv * Dv);
    sn_gdn_view v1 = { c1, S1, NULL, 0 }, v2 = { c2, S2, NULL, 0 };
    set_mode(1);
    CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &v1, T, o1));
    CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &v2, T - 1, o2));
    CHECK_OK(G->ops->gdn(G, &d, dqkv + (size_t)(T - 1) * Cd, da + (T - 1) * Hv, db + (T - 1) * Hv, dcw, dAl, ddt,
                         &v2, 1, o2 + (size_t)(T - 1) * Hv * Dv));
    float *h1 = tohost(o1, (size_t)T * Hv * Dv), *h2 = tohost(o2, (size_t)T * Hv * Dv);
    float *s1 = tohost(S1, ns), *s2 = tohost(S2, ns), *k1 = tohost(c1, nc), *k2 = tohost(c2, nc);
    double eo = rel_err(h2, h1, (size_t)T * Hv * Dv), es = rel_err(s2, s1, ns), ec = rel_err(k2, k1, nc);
    CHECKF(eo <= 2e-5 && es <= 2e-5 && ec == 0.0, "gdn prefill(%d) vs prefill(%d)+decode: out %.3g S %.3g conv %.3g",
           T, T - 1, eo, es, ec);
    free(qkv); free(a); free(b); free(cw); free(Al); free(dtb); free(z);
    free(h1); free(h2); free(s1); free(s2); free(k1); free(k2);
    dfree(dqkv); dfree(da); dfree(db); dfree(dcw); dfree(dAl); dfree(ddt);
    dfree(c1); dfree(S1); dfree(c2); dfree(S2); dfree(o1); dfree(o2);
}

/* Cache [ctx, Hkv, D]: random rows below pos0, then T new rows; the rows
 * at and past pos0 + T are NaN on the device (must never be read into a
 * sum). Attention of T queries: CPU oracle, GPU new, GPU old. */
static void attn_case(int T, int pos0, int Hq, int Hkv, int D, float amp)
{
    int ctx = pos0 + T + 5;
    size_t row = (size_t)Hkv * D;
    float *kc = hrand((size_t)ctx * row, amp), *vc = hrand((size_t)ctx * row, 1.0f);
    float *q = hrand((size_t)T * Hq * D, amp);
    float scale = 1.0f / sqrtf((float)D);
    sn_kv_view hv = { kc, vc, ctx, Hkv, D };
    float *ref = malloc(sizeof(float) * T * Hq * D);
    CHECK_OK(C->ops->attention(C, q, &hv, T, pos0, Hq, scale, ref));
    float *dk = dcopy(kc, (size_t)ctx * row), *dv = dcopy(vc, (size_t)ctx * row), *dq = dcopy(q, (size_t)T * Hq * D);
    float *nanrows = dpoison(5 * row);
    CHECK_OK(G->ops->copy(G, dk + (size_t)(pos0 + T) * row, nanrows, sizeof(float) * 5 * row));
    CHECK_OK(G->ops->copy(G, dv + (size_t)(pos0 + T) * row, nanrows, sizeof(float) * 5 * row));
    sn_kv_view gv = { dk, dv, ctx, Hkv, D };
    for (int mode = 1; mode >= 0; mode--) {
        set_mode(mode);
        float *dout = dpoison((size_t)T * Hq * D);
        CHECK_OK(G->ops->attention(G, dq, &gv, T, pos0, Hq, scale, dout));
        float *out = tohost(dout, (size_t)T * Hq * D);
        double err = rel_err(out, ref, (size_t)T * Hq * D);
        if (mode && err > w_att) w_att = err;
        CHECKF(err <= 2e-5, "attention %s T=%d pos0=%d Hq=%d Hkv=%d D=%d amp %g: rel %.3g", mode ? "new" : "old", T,
               pos0, Hq, Hkv, D, amp, err);
        free(out);
        dfree(dout);
    }
    set_mode(1);
    free(kc); free(vc); free(q); free(ref);
    dfree(dk); dfree(dv); dfree(dq); dfree(nanrows);
}

static void test_attention_flash(void)
{
    static const int Ts[] = { 1, 63, 64, 65, 200, 1000 };
    w_att = 0;
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) attn_case(Ts[i], 0, 8, 2, 128, 1.f);
    attn_case(200, 0, 24, 4, 256, 1.f);  /* the 27B layer, GQA 6 */
    attn_case(130, 70, 16, 2, 256, 1.f); /* 35B-A3B heads, after a cached prefix */
    attn_case(100, 0, 4, 4, 64, 1.f);    /* no GQA */
    attn_case(77, 300, 8, 1, 64, 1.f);   /* GQA 8, long prefix */
    attn_case(90, 5, 6, 3, 96, 1.f);     /* head_dim 96 (padded to 128) */
    attn_case(70, 50, 12, 4, 256, 1.f);
    attn_case(256, 0, 8, 2, 128, 4.f);   /* peaky softmax (scores up to ~16*sqrt(D)/sqrt(D)) */
    attn_case(128, 0, 8, 2, 128, 0.05f); /* flat softmax, small operands */
    attn_case(1000, 0, 8, 2, 256, 1.f);  /* long (8 heads keep the scalar oracle at a few seconds) */
    fprintf(stderr, "  attention new vs CPU: worst rel %.3g\n", w_att);
}

/* decode-after-prefill == prefill: N tokens at once (new kernel) vs the
 * first N-1 at once then token N through the decode kernel */
static void test_attention_split(void)
{
    int N = 200, Hq = 24, Hkv = 4, D = 256, ctx = 256;
    size_t row = (size_t)Hkv * D;
    float *k = hrand((size_t)N * row, 1.f), *v = hrand((size_t)N * row, 1.f), *q = hrand((size_t)N * Hq * D, 1.f);
    float *dk = dpoison((size_t)ctx * row), *dv = dpoison((size_t)ctx * row);
    float *dkn = dcopy(k, (size_t)N * row), *dvn = dcopy(v, (size_t)N * row), *dq = dcopy(q, (size_t)N * Hq * D);
    sn_kv_view gv = { dk, dv, ctx, Hkv, D };
    float *full = dpoison((size_t)N * Hq * D), *step = dpoison((size_t)N * Hq * D);
    set_mode(1);
    CHECK_OK(G->ops->kv_write(G, &gv, dkn, dvn, N, 0));
    CHECK_OK(G->ops->attention(G, dq, &gv, N, 0, Hq, 0.0625f, full));
    CHECK_OK(G->ops->attention(G, dq, &gv, N - 1, 0, Hq, 0.0625f, step));
    CHECK_OK(G->ops->attention(G, dq + (size_t)(N - 1) * Hq * D, &gv, 1, N - 1, Hq, 0.0625f,
                               step + (size_t)(N - 1) * Hq * D));
    float *a = tohost(full, (size_t)N * Hq * D), *b = tohost(step, (size_t)N * Hq * D);
    double e = rel_err(b, a, (size_t)N * Hq * D);
    CHECKF(e <= 2e-5, "attention prefill(%d) vs prefill(%d)+decode: %.3g", N, N - 1, e);
    free(k); free(v); free(q); free(a); free(b);
    dfree(dk); dfree(dv); dfree(dkn); dfree(dvn); dfree(dq); dfree(full); dfree(step);
}
#endif

int main(void)
{
    RUN(test_chunked_math);
    RUN(test_flash_emulated);
#ifdef SN_HAVE_CUDA
    sn_status st = sn_backend_cuda_new(0, &G);
    if (st != SN_OK) {
        fprintf(stderr, "SKIP test_cuda_prefill (GPU part): %s\n", sn_errmsg());
        return TEST_END();
    }
    if (sn_backend_cpu_new_isa(1, SN_ISA_SCALAR, &C) != SN_OK) {
        fprintf(stderr, "cpu oracle: %s\n", sn_errmsg());
        return 1;
    }
    RUN(test_gdn_chunked);
    RUN(test_gdn_split);
    RUN(test_attention_flash);
    RUN(test_attention_split);
    if (G->ops->sync(G) != SN_OK) {
        fprintf(stderr, "final sync: %s\n", sn_errmsg());
        t_failed++;
    }
    set_mode(1);
    sn_backend_free(G);
    sn_backend_free(C);
#else
    fprintf(stderr, "SKIP test_cuda_prefill (GPU part): built without CUDA (SN_CUDA=0 or no nvcc)\n");
#endif
    return TEST_END();
}
