/* Model tests against the reference fixtures (tests/fixtures/<arch>/),
 * shared by test_model_<arch>.c: each defines FIXTURE_ARCH and includes this.
 *
 * Fixture: mlx/ and hf/ checkpoints of one tiny random model (the HF weights
 * are the dequantized MLX weights, so both are the same function) and
 * reference.safetensors with, per prompt i, prompt_i I32[L], logits_i
 * F32[L,V] (transformers, fp32), greedy_i I32[16], margin_i F32[16].
 *
 * Tolerances (stated here, checked below):
 *  - logits vs transformers: max |diff| <= 2e-3 * max(1, max |ref|) over every
 *    position of every prompt (fp32 on both sides; what remains is summation
 *    order and the chunked-vs-recurrent GatedDeltaNet forms);
 *  - greedy continuations: identical (the generator keeps every margin >= 0.05);
 *  - MLX layout vs HF layout: max |diff| <= 5e-4 * max(1, max |logit|): the
 *    same function, but quantized and dense matmuls round differently and
 *    these random models amplify fp32 rounding (the generator measured
 *    fp32 vs fp64 transformers at ~1.2e-4 of the logit scale for qwen3_5);
 *  - prefill L == prefill L-1 + one decode, batched == alone, chunked ==
 *    whole, snapshot/restore: bitwise (the CPU ops are batch invariant). */
#ifndef TEST_MODEL_COMMON_H
#define TEST_MODEL_COMMON_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "logit_cmp.h"
#include "models/model_impl.h"
#include "sanctum/model.h"
#include "sanctum/quant.h"
#include "sanctum/safetensors.h"

#define FX_DIR "tests/fixtures/" FIXTURE_ARCH
#define FX_MAX_PROMPTS 16
#define FX_GREEDY 16
#define TOL_REF 2e-3f
#define TOL_LAYOUT 5e-4f

typedef struct {
    int n;
    const int32_t *prompt[FX_MAX_PROMPTS];
    int len[FX_MAX_PROMPTS];
    const float *logits[FX_MAX_PROMPTS];
    const int32_t *greedy[FX_MAX_PROMPTS];
    const float *margin[FX_MAX_PROMPTS];
    const float *cont[FX_MAX_PROMPTS];   /* optional: logits at each greedy step [16, V] */
} fx_ref;

static sn_st *g_ref_st;
/* SANCTUM_TEST_CUDA=1 (make test-cuda) runs the models on the CUDA backend.
 * The CPU ops are batch invariant, so there "same" means bitwise; CUDA
 * kernels may reduce in another order per shape, so there it means within
 * 1e-4 of the logit scale. */
static bool g_cuda;
static char g_run[512];   /* <build>/sanctum-run next to <build>/tests/ */
static fx_ref g_ref;
static sn_model *g_mlx, *g_hf;
static int g_V;
static bool g_have;

static bool fx_load(void)
{
    if (access(FX_DIR "/reference.safetensors", R_OK) != 0) return false;
    const char *cu = getenv("SANCTUM_TEST_CUDA");
    g_cuda = cu && !strcmp(cu, "1");
    sn_load_opts o = { .n_threads = 2, .backend = g_cuda ? SN_BACKEND_CUDA : SN_BACKEND_CPU };
    if (sn_st_open(FX_DIR "/reference.safetensors", &g_ref_st) != SN_OK) {
        fprintf(stderr, "reference: %s\n", sn_errmsg());
        return false;
    }
    for (int i = 0; i < FX_MAX_PROMPTS; i++) {
        char n[64];
        snprintf(n, sizeof n, "prompt_%d", i);
        const sn_st_tensor *p = sn_st_find(g_ref_st, n);
        if (!p) break;
        snprintf(n, sizeof n, "logits_%d", i);
        const sn_st_tensor *l = sn_st_find(g_ref_st, n);
        snprintf(n, sizeof n, "greedy_%d", i);
        const sn_st_tensor *g = sn_st_find(g_ref_st, n);
        snprintf(n, sizeof n, "margin_%d", i);
        const sn_st_tensor *mg = sn_st_find(g_ref_st, n);
        snprintf(n, sizeof n, "cont_logits_%d", i);
        const sn_st_tensor *c = sn_st_find(g_ref_st, n);
        if (!l || !g || p->dtype != SN_DT_I32 || l->dtype != SN_DT_F32 || g->dtype != SN_DT_I32 ||
            l->ndim != 2 || l->shape[0] != p->shape[0] || g->shape[0] != FX_GREEDY) {
            fprintf(stderr, "reference: prompt %d malformed\n", i);
            return false;
        }
        g_ref.prompt[i] = p->data;
        g_ref.len[i] = (int)p->shape[0];
        g_ref.logits[i] = l->data;
        g_ref.greedy[i] = g->data;
        g_ref.margin[i] = mg ? mg->data : NULL;
        g_ref.cont[i] = c && c->dtype == SN_DT_F32 && c->ndim == 2 && c->shape[0] == FX_GREEDY ? c->data : NULL;
        g_V = (int)l->shape[1];
        g_ref.n = i + 1;
    }
    if (!g_ref.n) return false;
    if (sn_model_load(FX_DIR "/mlx", &o, &g_mlx) != SN_OK) {
        fprintf(stderr, "loading %s/mlx: %s\n", FX_DIR, sn_errmsg());
        return false;
    }
    if (sn_model_load(FX_DIR "/hf", &o, &g_hf) != SN_OK) {
        fprintf(stderr, "loading %s/hf: %s\n", FX_DIR, sn_errmsg());
        return false;
    }
    return sn_model_get_info(g_mlx)->vocab_size == g_V && sn_model_get_info(g_hf)->vocab_size == g_V;
}

static void fx_free(void)
{
    sn_model_free(g_mlx);
    sn_model_free(g_hf);
    sn_st_close(g_ref_st);
}

#define NEED_FIXTURE() do { if (!g_have) SKIP("fixture " FX_DIR " not present or not loadable"); } while (0)

/* Bitwise on the CPU, within 1e-4 of the scale on CUDA (see g_cuda). */
static bool same(const float *a, const float *b, size_t n)
{
    if (!g_cuda) return memcmp(a, b, n * sizeof(float)) == 0;
    return max_diff(a, b, n) <= 1e-4f * fmaxf(1.0f, max_abs(b, n));
}

/* Prefill tokens, all logits. */
static float *run_all(sn_model *m, const int32_t *ids, int n)
{
    sn_seq *s = NULL;
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)g_V);
    if (sn_seq_new(m, n + FX_GREEDY + 1, &s) != SN_OK || sn_forward(m, s, ids, n, lg, true) != SN_OK) {
        fprintf(stderr, "  forward: %s\n", sn_errmsg());
        free(lg);
        lg = NULL;
    }
    sn_seq_free(s);
    return lg;
}

/* Greedy continuation of FX_GREEDY tokens from the sequence's state and
 * the logits of its last token; step logits optionally kept. */
static bool greedy(sn_model *m, sn_seq *s, float *lg, int32_t *out, float *steps)
{
    for (int t = 0; t < FX_GREEDY; t++) {
        if (steps) memcpy(steps + (size_t)t * g_V, lg, sizeof(float) * g_V);
        out[t] = argmax(lg, g_V);
        if (t + 1 < FX_GREEDY && sn_forward(m, s, &out[t], 1, lg, false) != SN_OK) {
            fprintf(stderr, "  decode: %s\n", sn_errmsg());
            return false;
        }
    }
    return true;
}

static void check_logits_vs_ref(sn_model *m, const char *what)
{
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        float *lg = run_all(m, g_ref.prompt[i], L);
        CHECK(lg != NULL);
        if (!lg) continue;
        size_t n = (size_t)L * g_V;
        float scale = fmaxf(1.0f, max_abs(g_ref.logits[i], n)), d = max_diff(lg, g_ref.logits[i], n);
        fprintf(stderr, "  %s prompt %d (L=%d): max |logit diff| %.3g (scale %.3g, rel %.3g)\n", what, i, L, d, scale,
                d / scale);
        CHECKF(d <= TOL_REF * scale, "%s prompt %d: max diff %g > %g", what, i, d, TOL_REF * scale);
        free(lg);
    }
}

static void check_greedy_vs_ref(sn_model *m, const char *what)
{
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        sn_seq *s = NULL;
        float *lg = malloc(sizeof(float) * g_V), *steps = malloc(sizeof(float) * g_V * FX_GREEDY);
        int32_t out[FX_GREEDY];
        CHECK_OK(sn_seq_new(m, L + FX_GREEDY + 1, &s));
        CHECK_OK(sn_forward(m, s, g_ref.prompt[i], L, lg, false));
        CHECK(greedy(m, s, lg, out, steps));
        int first_bad = -1;
        for (int t = 0; t < FX_GREEDY && first_bad < 0; t++)
            if (out[t] != g_ref.greedy[i][t]) first_bad = t;
        CHECKF(first_bad < 0, "%s prompt %d: greedy differs at step %d (got %d, want %d, ref margin %g)", what, i,
               first_bad, first_bad >= 0 ? out[first_bad] : 0, first_bad >= 0 ? g_ref.greedy[i][first_bad] : 0,
               first_bad >= 0 && g_ref.margin[i] ? g_ref.margin[i][first_bad] : -1.0);
        if (g_ref.cont[i] && first_bad < 0) {
            size_t n = (size_t)FX_GREEDY * g_V;
            float scale = fmaxf(1.0f, max_abs(g_ref.cont[i], n)), d = max_diff(steps, g_ref.cont[i], n);
            CHECKF(d <= TOL_REF * scale, "%s prompt %d: decode-step logits max diff %g > %g", what, i, d,
                   TOL_REF * scale);
        }
        free(lg);
        free(steps);
        sn_seq_free(s);
    }
}

static void test_logits_mlx(void) { NEED_FIXTURE(); check_logits_vs_ref(g_mlx, "mlx"); }
static void test_logits_hf(void) { NEED_FIXTURE(); check_logits_vs_ref(g_hf, "hf"); }
static void test_greedy_mlx(void) { NEED_FIXTURE(); check_greedy_vs_ref(g_mlx, "mlx"); }
static void test_greedy_hf(void) { NEED_FIXTURE(); check_greedy_vs_ref(g_hf, "hf"); }

static void test_layouts_agree(void)
{
    NEED_FIXTURE();
    CHECK(sn_model_get_info(g_mlx)->mlx_layout);
    CHECK(!sn_model_get_info(g_hf)->mlx_layout);
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        float *a = run_all(g_mlx, g_ref.prompt[i], L), *b = run_all(g_hf, g_ref.prompt[i], L);
        CHECK(a && b);
        if (a && b) {
            size_t n = (size_t)L * g_V;
            float scale = fmaxf(1.0f, max_abs(b, n)), d = max_diff(a, b, n);
            fprintf(stderr, "  prompt %d: mlx vs hf max diff %.3g (scale %.3g)\n", i, d, scale);
            CHECKF(d <= TOL_LAYOUT * scale, "prompt %d: mlx vs hf max diff %g > %g", i, d, TOL_LAYOUT * scale);
        }
        free(a);
        free(b);
    }
}

static int longest_prompt(void)
{
    int b = 0;
    for (int i = 1; i < g_ref.n; i++)
        if (g_ref.len[i] > g_ref.len[b]) b = i;
    return b;
}

/* Greedy through next_id (argmax on the backend where it has the op, no
 * logits to the host) gives the reference continuations; with logits
 * requested too, the id is the argmax of those logits. */
static void greedy_ids_pass(const char *what)
{
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        sn_seq *s = NULL;
        int32_t out[FX_GREEDY];
        CHECK_OK(sn_seq_new(g_mlx, L + FX_GREEDY + 1, &s));
        CHECK_OK(sn_forward_greedy(g_mlx, s, g_ref.prompt[i], L, &out[0]));
        for (int t = 1; t < FX_GREEDY; t++) CHECK_OK(sn_forward_greedy(g_mlx, s, &out[t - 1], 1, &out[t]));
        CHECKF(memcmp(out, g_ref.greedy[i], sizeof out) == 0, "%s, prompt %d: next_id greedy differs from reference",
               what, i);
        sn_seq_reset(s);
        float *lg = malloc(sizeof(float) * (size_t)L * g_V);
        int32_t id = -1;
        sn_batch_item b = { .seq = s, .tokens = g_ref.prompt[i], .n = L, .logits = lg, .all_logits = true, .next_id = &id };
        CHECK_OK(sn_forward_batch(g_mlx, &b, 1));
        CHECKF(id == argmax(lg + (size_t)(L - 1) * g_V, g_V) && id == out[0], "%s, prompt %d: next_id != argmax", what, i);
        free(lg);
        sn_seq_free(s);
    }
}

static void test_greedy_ids(void)
{
    NEED_FIXTURE();
    greedy_ids_pass("backend argmax");
    /* the host fallback: the backend table without its argmax op */
    const sn_backend_ops *orig = g_mlx->be->ops;
    sn_backend_ops noarg = *orig;
    noarg.argmax = NULL;
    g_mlx->be->ops = &noarg;
    greedy_ids_pass("host argmax");
    g_mlx->be->ops = orig;
}

/* Compares the per-layer states of two sequences at the same position
 * (copied to the host, so it works on any backend). */
static bool state_same(const sn_model *m, const float *a, const float *b, size_t n)
{
    float *ha = malloc(n * sizeof(float) + 1), *hb = malloc(n * sizeof(float) + 1);
    bool ok = m->be->ops->to_host(m->be, ha, a, n * sizeof(float)) == SN_OK &&
              m->be->ops->to_host(m->be, hb, b, n * sizeof(float)) == SN_OK && same(ha, hb, n);
    free(ha);
    free(hb);
    return ok;
}

static void check_states_equal(const sn_seq *a, const sn_seq *b, const char *what)
{
    const sn_model *m = a->m;
    int bad_attn = 0, bad_gdn = 0, n_attn = 0, n_gdn = 0;
    size_t kvn = (size_t)a->pos * a->kv_row_floats;
    for (int l = 0; l < m->n_layers; l++) {
        if (a->gdn[l].S) {
            n_gdn++;
            if (!state_same(m, a->gdn[l].S, b->gdn[l].S, a->S_floats) ||
                !state_same(m, a->gdn[l].conv, b->gdn[l].conv, a->conv_floats))
                bad_gdn++;
        }
        if (a->kv[l].k) {
            n_attn++;
            if (!state_same(m, a->kv[l].k, b->kv[l].k, kvn) || !state_same(m, a->kv[l].v, b->kv[l].v, kvn)) bad_attn++;
        }
    }
    fprintf(stderr, "  %s: %d/%d attention and %d/%d GatedDeltaNet layer states identical\n", what,
            n_attn - bad_attn, n_attn, n_gdn - bad_gdn, n_gdn);
    CHECKF(bad_attn == 0, "%s: %d attention layers' KV differ", what, bad_attn);
    CHECKF(bad_gdn == 0, "%s: %d GatedDeltaNet layers' state differ", what, bad_gdn);
}

/* prefill L == prefill L-1 then one decode step: logits and every layer's state. */
static void test_prefill_equals_decode(void)
{
    NEED_FIXTURE();
    sn_model *m = g_mlx;
    int i = longest_prompt(), L = g_ref.len[i];
    const int32_t *p = g_ref.prompt[i];
    int lens[] = { 2, 64, 65, L };
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        int n = lens[k];
        if (n > L) continue;
        sn_seq *a = NULL, *b = NULL;
        float *la = malloc(sizeof(float) * g_V), *lb = malloc(sizeof(float) * g_V);
        CHECK_OK(sn_seq_new(m, L + 1, &a));
        CHECK_OK(sn_seq_new(m, L + 1, &b));
        CHECK_OK(sn_forward(m, a, p, n, la, false));
        CHECK_OK(sn_forward(m, b, p, n - 1, NULL, false));
        CHECK_OK(sn_forward(m, b, p + n - 1, 1, lb, false));
        CHECKF(same(la, lb, (size_t)g_V), "L=%d: prefill vs prefill+decode logits differ (max %g)", n,
               max_diff(la, lb, (size_t)g_V));
        char what[64];
        snprintf(what, sizeof what, "L=%d prefill vs L-1 + decode", n);
        check_states_equal(a, b, what);
        free(la);
        free(lb);
        sn_seq_free(a);
        sn_seq_free(b);
    }
}

/* Prefixes of the longest prompt against the reference rows (causal, so the
 * reference logits of a prefix are the first rows of the full prompt's). */
static void test_prompt_lengths(void)
{
    NEED_FIXTURE();
    int i = longest_prompt(), L = g_ref.len[i];
    int lens[] = { 1, 2, 63, 64, 65, 127, 128, 129 };
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        int n = lens[k];
        if (n > L) continue;
        float *lg = run_all(g_mlx, g_ref.prompt[i], n);
        CHECK(lg != NULL);
        if (!lg) continue;
        size_t cnt = (size_t)n * g_V;
        float scale = fmaxf(1.0f, max_abs(g_ref.logits[i], cnt)), d = max_diff(lg, g_ref.logits[i], cnt);
        CHECKF(d <= TOL_REF * scale, "prefix %d: max diff %g > %g", n, d, TOL_REF * scale);
        free(lg);
    }
}

/* Feeding the prompt in pieces (chunked prefill) == all at once, bitwise. */
static void test_chunked_prefill(void)
{
    NEED_FIXTURE();
    int i = longest_prompt(), L = g_ref.len[i];
    float *whole = run_all(g_mlx, g_ref.prompt[i], L);
    float *parts = malloc(sizeof(float) * (size_t)L * g_V);
    sn_seq *s = NULL;
    CHECK_OK(sn_seq_new(g_mlx, L, &s));
    int cuts[] = { 1, 63, 64, 7 };
    int at = 0;
    for (size_t k = 0; at < L; k++) {
        int n = k < sizeof cuts / sizeof *cuts ? cuts[k] : L - at;
        if (n > L - at) n = L - at;
        CHECK_OK(sn_forward(g_mlx, s, g_ref.prompt[i] + at, n, parts + (size_t)at * g_V, true));
        at += n;
    }
    CHECK(whole && same(parts, whole, (size_t)L * g_V));
    free(whole);
    free(parts);
    sn_seq_free(s);
}

/* Runs longer than one internal step (512 rows) are split by
 * sn_forward_batch itself, also across the items of a batch: a 1100-token
 * sequence in one call == fed in pieces of 300, and a batch of it with a
 * 700-token sequence (the split falls inside the second) == each alone. */
static void test_long_runs(void)
{
    NEED_FIXTURE();
    enum { LA = 1100, LB = 700 };
    int32_t *ids = malloc(sizeof(int32_t) * LA);
    for (int t = 0, k = 0; t < LA; t++, k++) {
        /* the fixture prompts, concatenated and repeated: in-vocabulary ids */
        int p = (k / 150) % g_ref.n, L = g_ref.len[p];
        ids[t] = g_ref.prompt[p][k % L];
    }
    float *whole = malloc(sizeof(float) * (size_t)LA * g_V), *parts = malloc(sizeof(float) * (size_t)LA * g_V);
    float *lb = malloc(sizeof(float) * (size_t)LB * g_V), *lb1 = malloc(sizeof(float) * (size_t)LB * g_V);
    sn_seq *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(sn_seq_new(g_mlx, LA, &a));
    CHECK_OK(sn_seq_new(g_mlx, LA, &b));
    CHECK_OK(sn_seq_new(g_mlx, LB, &c));
    if (!a || !b || !c) goto out;
    CHECK_OK(sn_forward(g_mlx, a, ids, LA, whole, true));
    for (int at = 0; at < LA; at += 300) {
        int n = LA - at < 300 ? LA - at : 300;
        CHECK_OK(sn_forward(g_mlx, b, ids + at, n, parts + (size_t)at * g_V, true));
    }
    CHECK(sn_seq_pos(a) == LA && sn_seq_pos(b) == LA);
    CHECKF(same(whole, parts, (size_t)LA * g_V), "1100 tokens at once vs in pieces of 300 differ (max %g)",
           max_diff(whole, parts, (size_t)LA * g_V));
    sn_seq_reset(a);
    sn_batch_item items[2] = {
        { .seq = a, .tokens = ids, .n = LA, .logits = parts, .all_logits = true },
        { .seq = c, .tokens = ids + 50, .n = LB, .logits = lb, .all_logits = true },
    };
    CHECK_OK(sn_forward_batch(g_mlx, items, 2));
    CHECK(sn_seq_pos(a) == LA && sn_seq_pos(c) == LB);
    CHECK(same(whole, parts, (size_t)LA * g_V));
    sn_seq_reset(c);
    CHECK_OK(sn_forward(g_mlx, c, ids + 50, LB, lb1, true));
    CHECK(same(lb, lb1, (size_t)LB * g_V));
out:
    sn_seq_free(a);
    sn_seq_free(b);
    sn_seq_free(c);
    free(ids);
    free(whole);
    free(parts);
    free(lb);
    free(lb1);
}

/* Several sequences in one batched step give exactly what each gives alone. */
static void test_batch_equals_single(void)
{
    NEED_FIXTURE();
    int n = g_ref.n < 4 ? g_ref.n : 4;
    sn_seq *s[4] = { 0 };
    float *lg[4] = { 0 }, *alone[4] = { 0 };
    sn_batch_item items[4] = { 0 };
    for (int i = 0; i < n; i++) {
        CHECK_OK(sn_seq_new(g_mlx, g_ref.len[i] + 2, &s[i]));
        lg[i] = malloc(sizeof(float) * (size_t)g_ref.len[i] * g_V);
        alone[i] = run_all(g_mlx, g_ref.prompt[i], g_ref.len[i]);
        items[i] = (sn_batch_item){ .seq = s[i], .tokens = g_ref.prompt[i], .n = g_ref.len[i], .logits = lg[i], .all_logits = true };
    }
    CHECK_OK(sn_forward_batch(g_mlx, items, n));
    for (int i = 0; i < n; i++)
        CHECKF(alone[i] && same(lg[i], alone[i], (size_t)g_ref.len[i] * g_V),
               "prompt %d: batched logits differ from alone", i);
    /* a mixed step: one decode token for each, in one batch */
    int32_t next[4];
    float *dl[4];
    for (int i = 0; i < n; i++) {
        next[i] = argmax(lg[i] + (size_t)(g_ref.len[i] - 1) * g_V, g_V);
        dl[i] = malloc(sizeof(float) * g_V);
        items[i] = (sn_batch_item){ .seq = s[i], .tokens = &next[i], .n = 1, .logits = dl[i] };
    }
    CHECK_OK(sn_forward_batch(g_mlx, items, n));
    for (int i = 0; i < n; i++) {
        sn_seq *one = NULL;
        float *l1 = malloc(sizeof(float) * g_V);
        CHECK_OK(sn_seq_new(g_mlx, g_ref.len[i] + 2, &one));
        CHECK_OK(sn_forward(g_mlx, one, g_ref.prompt[i], g_ref.len[i], NULL, false));
        CHECK_OK(sn_forward(g_mlx, one, &next[i], 1, l1, false));
        CHECKF(same(dl[i], l1, (size_t)g_V), "prompt %d: batched decode differs from alone", i);
        free(l1);
        sn_seq_free(one);
        free(dl[i]);
    }
    for (int i = 0; i < n; i++) {
        free(lg[i]);
        free(alone[i]);
        sn_seq_free(s[i]);
    }
}

/* Sequences of one model driven from several threads at once (the server's
 * shape): every thread's greedy continuation is the reference one. */
typedef struct {
    int prompt;
    bool ok;
} thr_arg;

static void *thr_main(void *p)
{
    thr_arg *a = p;
    int i = a->prompt, L = g_ref.len[i];
    sn_seq *s = NULL;
    int32_t out[FX_GREEDY];
    a->ok = false;
    if (sn_seq_new(g_mlx, L + FX_GREEDY + 1, &s) != SN_OK) return NULL;
    bool ok = sn_forward_greedy(g_mlx, s, g_ref.prompt[i], L, &out[0]) == SN_OK;
    for (int t = 1; ok && t < FX_GREEDY; t++) ok = sn_forward_greedy(g_mlx, s, &out[t - 1], 1, &out[t]) == SN_OK;
    sn_snapshot *snap = NULL;
    ok = ok && sn_seq_snapshot(s, &snap) == SN_OK && sn_seq_restore(s, snap) == SN_OK;
    sn_snapshot_free(snap);
    sn_seq_free(s);
    a->ok = ok && memcmp(out, g_ref.greedy[i], sizeof out) == 0;
    return NULL;
}

static void test_threads(void)
{
    NEED_FIXTURE();
    enum { NT = 4 };
    pthread_t th[NT];
    thr_arg args[NT];
    for (int t = 0; t < NT; t++) {
        args[t] = (thr_arg){ t % g_ref.n, false };
        CHECK(pthread_create(&th[t], NULL, thr_main, &args[t]) == 0);
    }
    for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        CHECKF(args[t].ok, "thread %d (prompt %d): continuation differs or a call failed", t, args[t].prompt);
    }
}

/* A decode step of many sequences at different positions (more than one
 * lm_head call's worth before, now the batch limit) == each alone. */
static void test_batch_many(void)
{
    NEED_FIXTURE();
    enum { NS = 40 };
    int pi = longest_prompt();
    sn_seq *s[NS] = { 0 };
    sn_batch_item items[NS];
    int32_t tok[NS], ids[NS];
    float *lg = malloc(sizeof(float) * (size_t)NS * g_V), *one = malloc(sizeof(float) * g_V);
    for (int i = 0; i < NS; i++) {
        int L = 1 + (i * 3) % (g_ref.len[pi] - 1);
        CHECK_OK(sn_seq_new(g_mlx, L + 2, &s[i]));
        CHECK_OK(sn_forward(g_mlx, s[i], g_ref.prompt[pi], L, NULL, false));
        tok[i] = g_ref.prompt[pi][L];
        items[i] = (sn_batch_item){ .seq = s[i], .tokens = &tok[i], .n = 1, .logits = lg + (size_t)i * g_V,
                                    .next_id = &ids[i] };
    }
    CHECK_OK(sn_forward_batch(g_mlx, items, NS));
    for (int i = 0; i < NS; i++) {
        int L = 1 + (i * 3) % (g_ref.len[pi] - 1);
        sn_seq *a = NULL;
        CHECK_OK(sn_seq_new(g_mlx, L + 2, &a));
        CHECK_OK(sn_forward(g_mlx, a, g_ref.prompt[pi], L + 1, one, false));
        CHECKF(same(lg + (size_t)i * g_V, one, (size_t)g_V), "sequence %d (L=%d): batched decode differs", i, L);
        CHECK(ids[i] == argmax(one, g_V));
        /* the batched row equals the reference row of the full prompt too */
        float scale = fmaxf(1.0f, max_abs(g_ref.logits[pi] + (size_t)L * g_V, (size_t)g_V));
        CHECK(max_diff(one, g_ref.logits[pi] + (size_t)L * g_V, (size_t)g_V) <= TOL_REF * scale);
        sn_seq_free(a);
    }
    for (int i = 0; i < NS; i++) sn_seq_free(s[i]);
    free(lg);
    free(one);
}

/* Snapshot after the prompt; greedy; restore (same seq and a fresh one);
 * greedy again: identical continuations. */
static void test_snapshot_restore(void)
{
    NEED_FIXTURE();
    int i = longest_prompt(), L = g_ref.len[i];
    sn_seq *s = NULL, *t = NULL;
    sn_snapshot *snap = NULL;
    float *lg = malloc(sizeof(float) * g_V), *lg0 = malloc(sizeof(float) * g_V);
    int32_t a[FX_GREEDY], b[FX_GREEDY], c[FX_GREEDY];
    CHECK_OK(sn_seq_new(g_mlx, L + FX_GREEDY + 1, &s));
    CHECK_OK(sn_seq_new(g_mlx, L + FX_GREEDY + 1, &t));
    CHECK_OK(sn_forward(g_mlx, s, g_ref.prompt[i], L, lg0, false));
    CHECK_OK(sn_seq_snapshot(s, &snap));
    if (!snap) goto out;
    CHECK(sn_snapshot_pos(snap) == L);
    CHECK(sn_snapshot_bytes(snap) == sn_seq_state_bytes(s));
    memcpy(lg, lg0, sizeof(float) * g_V);
    CHECK(greedy(g_mlx, s, lg, a, NULL));
    CHECK(sn_seq_pos(s) == L + FX_GREEDY - 1);
    CHECK_OK(sn_seq_restore(s, snap));
    CHECK(sn_seq_pos(s) == L);
    memcpy(lg, lg0, sizeof(float) * g_V);
    CHECK(greedy(g_mlx, s, lg, b, NULL));
    CHECK_OK(sn_seq_restore(t, snap));
    memcpy(lg, lg0, sizeof(float) * g_V);
    CHECK(greedy(g_mlx, t, lg, c, NULL));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) == 0);
    CHECK(memcmp(a, g_ref.greedy[i], sizeof a) == 0);
    /* reset gives a clean sequence: the same prompt again gives the same logits */
    sn_seq_reset(t);
    CHECK(sn_seq_pos(t) == 0);
    CHECK_OK(sn_forward(g_mlx, t, g_ref.prompt[i], L, lg, false));
    CHECK(same(lg, lg0, (size_t)g_V));
out:
    free(lg);
    free(lg0);
    sn_snapshot_free(snap);
    sn_seq_free(s);
    sn_seq_free(t);
}

/* --quantize 4 at load on the raw HF checkpoint == the same checkpoint with
 * every matrix replaced by dequant(quant4(w)) in F32 (what the at-load
 * quantizer should compute, done here with the reference quantizer): checks
 * the at-load path end to end for this arch (embedding, q_proj split, fused
 * MoE experts, router) against the dense path on identical values. */
static void test_quantize_at_load(void)
{
    NEED_FIXTURE();
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "/tmp/sanctum-requant-%s-%d", FIXTURE_ARCH, (int)getpid());
    mkdir(dir, 0700);
    sn_st *st = NULL;
    sn_st_writer *w = NULL;
    float *bufs[1024] = { 0 };
    int nb = 0;
    sn_model *q = NULL, *d = NULL;
    CHECK_OK(sn_st_open(FX_DIR "/hf/model.safetensors", &st));
    CHECK_OK(sn_st_writer_new(&w));
    if (!st || !w) goto out;
    for (size_t i = 0; i < sn_st_count(st) && nb < 1024; i++) {
        const sn_st_tensor *t = sn_st_at(st, i);
        const void *data = t->data;
        int64_t cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : 0;
        if (t->dtype == SN_DT_F32 && t->ndim >= 2 && cols % 64 == 0) {
            int64_t rows = sn_st_numel(t) / cols;
            float *o = bufs[nb++] = malloc((size_t)(rows * cols) * sizeof(float));
            uint32_t *pk = malloc((size_t)(rows * cols / 8) * 4);
            uint16_t *sc = malloc((size_t)(rows * cols / 64) * 2), *bi = malloc((size_t)(rows * cols / 64) * 2);
            CHECK_OK(sn_q_quantize(t->data, rows, cols, 4, 64, SN_DT_BF16, pk, sc, bi));
            sn_weight qw = { .dtype = SN_DT_Q4, .rows = rows, .cols = cols, .group = 64, .data = pk, .scales = sc,
                             .qbiases = bi, .sdtype = SN_DT_BF16 };
            CHECK_OK(sn_weight_to_f32(&qw, 0, o));
            free(pk);
            free(sc);
            free(bi);
            data = o;
        }
        CHECK_OK(sn_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, data));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(sn_st_writer_write(w, path, NULL, NULL));
    snprintf(path, sizeof path, "cp " FX_DIR "/hf/config.json %s/", dir);
    CHECK(system(path) == 0);
    sn_load_opts oq = { .n_threads = 2, .quantize_bits = 4, .backend = g_cuda ? SN_BACKEND_CUDA : SN_BACKEND_CPU };
    sn_load_opts od = oq;
    od.quantize_bits = 0;
    CHECK_OK(sn_model_load(FX_DIR "/hf", &oq, &q));
    CHECK_OK(sn_model_load(dir, &od, &d));
    if (!q || !d) goto out;
    CHECK(q->embed.dtype == SN_DT_Q4 && d->embed.dtype == SN_DT_F32);
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        float *a = run_all(q, g_ref.prompt[i], L), *b = run_all(d, g_ref.prompt[i], L);
        CHECK(a && b);
        if (a && b) {
            size_t n = (size_t)L * g_V;
            float scale = fmaxf(1.0f, max_abs(b, n)), df = max_diff(a, b, n);
            CHECKF(df <= TOL_LAYOUT * scale, "prompt %d: --quantize 4 vs requantized file max diff %g > %g", i, df,
                   TOL_LAYOUT * scale);
        }
        free(a);
        free(b);
    }
out:
    sn_model_free(q);
    sn_model_free(d);
    sn_st_writer_free(w);
    sn_st_close(st);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* sanctum-run end to end: --ids of a prompt, --print-ids greedy == the
 * reference continuation (up to an EOS id, where the tool stops). */
static void test_cli_greedy(void)
{
    NEED_FIXTURE();
    if (access(g_run, X_OK) != 0) SKIP("sanctum-run not built next to this test");
    int i = g_ref.n > 1 ? 1 : 0, L = g_ref.len[i];
    char *cmd = malloc((size_t)L * 12 + 1024);
    size_t o = (size_t)sprintf(cmd, "%s --model " FX_DIR "/mlx --max-tokens %d --print-ids --threads 2%s --ids ", g_run,
                               FX_GREEDY, g_cuda ? " --backend cuda" : "");
    for (int t = 0; t < L; t++) o += (size_t)sprintf(cmd + o, "%s%d", t ? "," : "", g_ref.prompt[i][t]);
    sprintf(cmd + o, " 2>/dev/null");
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    int n = 0, id;
    int32_t got[FX_GREEDY];
    while (f && n < FX_GREEDY && fscanf(f, "%d", &id) == 1) got[n++] = id;
    int rc = f ? pclose(f) : -1;
    CHECKF(rc == 0, "sanctum-run exit status %d", rc);
    const sn_model_info *in = sn_model_get_info(g_mlx);
    bool stopped = false;
    for (int e = 0; n > 0 && e < in->n_eos; e++) stopped = stopped || got[n - 1] == in->eos_ids[e];
    CHECKF(n == FX_GREEDY || stopped, "sanctum-run printed %d ids", n);
    CHECKF(memcmp(got, g_ref.greedy[i], (size_t)n * sizeof(int32_t)) == 0, "sanctum-run greedy ids differ from reference");
    free(cmd);
}

static int fixture_main(int argc, char **argv)
{
    const char *self = argc > 0 ? argv[0] : "build/tests/x";
    const char *slash = strstr(self, "/tests/");
    if (slash) snprintf(g_run, sizeof g_run, "%.*s/sanctum-run", (int)(slash - self), self);
    else snprintf(g_run, sizeof g_run, "build/sanctum-run");
    g_have = fx_load();
    if (!g_have) fprintf(stderr, "SKIP: %s fixture not available; model tests skipped\n", FX_DIR);
    else fprintf(stderr, "%s fixture on the %s backend\n", FX_DIR, g_cuda ? "CUDA" : "CPU");
    RUN(test_logits_mlx);
    RUN(test_logits_hf);
    RUN(test_greedy_mlx);
    RUN(test_greedy_hf);
    RUN(test_greedy_ids);
    RUN(test_layouts_agree);
    RUN(test_prefill_equals_decode);
    RUN(test_prompt_lengths);
    RUN(test_chunked_prefill);
    RUN(test_batch_equals_single);
    RUN(test_batch_many);
    RUN(test_long_runs);
    RUN(test_snapshot_restore);
    RUN(test_threads);
    RUN(test_quantize_at_load);
    RUN(test_cli_greedy);
#ifdef FIXTURE_EXTRA
    FIXTURE_EXTRA();
#endif
    fx_free();
    return TEST_END();
}

#endif
