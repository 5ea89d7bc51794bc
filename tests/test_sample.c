/* Sampler: argmax fast path, penalties (sign-aware, windowed), top-p on the
 * untempered distribution, temperature, and seeded reproducibility; the
 * rows of a draw on the backend (sn_sampler_device_rows): their edits give
 * the host sampler's logits bit for bit, their u its RNG stream. */
#include "harness.h"
#include "sample_ref.h"
#include "sanctum/sample.h"

#include <stdlib.h>

static sn_sampler *mk(float temp, float top_p, float rep, float pres, float freq, int window, bool seeded, uint64_t seed, int vocab)
{
    sn_sample_params p;
    sn_sample_params_default(&p);
    p.temperature = temp;
    p.top_p = top_p;
    p.repetition_penalty = rep;
    p.presence_penalty = pres;
    p.frequency_penalty = freq;
    if (window) p.repetition_window = window;
    p.has_seed = seeded;
    p.seed = seed;
    sn_sampler *s = NULL;
    if (sn_sampler_new(&p, vocab, &s) != SN_OK) return NULL;
    return s;
}

static void test_rng_reproducible(void)
{
    sn_rng a, b, c;
    sn_rng_seed(&a, 42);
    sn_rng_seed(&b, 42);
    sn_rng_seed(&c, 43);
    int same_c = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = sn_rng_next(&a), y = sn_rng_next(&b), z = sn_rng_next(&c);
        CHECK(x == y);
        same_c += x == z;
    }
    CHECK(same_c == 0);
    double lo = 1, hi = 0, mean = 0;
    for (int i = 0; i < 10000; i++) {
        double u = sn_rng_uniform(&a);
        CHECK(u >= 0.0 && u < 1.0);
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        mean += u;
    }
    mean /= 10000;
    CHECK(lo < 0.01 && hi > 0.99);
    CHECKF(fabs(mean - 0.5) < 0.02, "mean %f", mean);
}

static void test_greedy(void)
{
    sn_sampler *s = mk(0, 1, 0, 0, 0, 0, true, 1, 5);
    CHECK(s && sn_sampler_is_greedy(s));
    float l[5] = {0.1f, 3.0f, NAN, 2.9f, -1.0f};
    int32_t id = -1;
    CHECK_OK(sn_sampler_sample(s, l, &id));
    CHECK(id == 1);
    float nan5[5] = {NAN, NAN, NAN, NAN, NAN};
    CHECK(sn_sampler_sample(s, nan5, &id) == SN_E_RANGE);
    sn_sampler_free(s);
}

static void test_repetition_penalty_sign_aware(void)
{
    sn_sampler *s = mk(0, 1, 2.0f, 0, 0, 0, true, 1, 4);
    CHECK(s && !sn_sampler_is_greedy(s));
    sn_sampler_accept(s, 0);
    sn_sampler_accept(s, 2);
    sn_sampler_accept(s, 0);  /* repeated: penalised once, not twice */
    float l[4] = {4.0f, 3.0f, -1.0f, 1.0f};
    int32_t id;
    CHECK_OK(sn_sampler_sample(s, l, &id));
    CHECK(l[0] == 2.0f);   /* positive: divided */
    CHECK(l[2] == -2.0f);  /* negative: multiplied */
    CHECK(l[1] == 3.0f && l[3] == 1.0f);
    CHECK(id == 1);
    sn_sampler_free(s);
}

static void test_window_bounded(void)
{
    /* Window 2: token 0 falls out once two newer tokens arrive. */
    sn_sampler *s = mk(0, 1, 2.0f, 0, 0, 2, true, 1, 4);
    sn_sampler_accept(s, 0);
    sn_sampler_accept(s, 1);
    sn_sampler_accept(s, 2);
    float l[4] = {4.0f, 4.0f, 4.0f, 1.0f};
    int32_t id;
    CHECK_OK(sn_sampler_sample(s, l, &id));
    CHECK(l[0] == 4.0f && l[1] == 2.0f && l[2] == 2.0f);
    CHECK(id == 0);
    sn_sampler_free(s);
}

static void test_presence_frequency(void)
{
    sn_sampler *s = mk(0, 1, 0, 0.5f, 0.25f, 0, true, 1, 3);
    sn_sampler_accept(s, 1);
    sn_sampler_accept(s, 1);
    sn_sampler_accept(s, 1);
    sn_sampler_accept(s, 2);
    float l[3] = {0.0f, 2.0f, 1.0f};
    int32_t id;
    CHECK_OK(sn_sampler_sample(s, l, &id));
    CHECKF(fabsf(l[1] - (2.0f - 0.5f - 0.75f)) < 1e-6f, "l1=%f", l[1]);
    CHECKF(fabsf(l[2] - (1.0f - 0.5f - 0.25f)) < 1e-6f, "l2=%f", l[2]);
    CHECK(l[0] == 0.0f);
    CHECK(id == 1);
    sn_sampler_free(s);
}

/* Draw many times and count. */
static void histogram(sn_sampler *s, const float *logits, int n, int draws, int *counts)
{
    float *tmp = malloc(sizeof(float) * (size_t)n);
    memset(counts, 0, sizeof(int) * (size_t)n);
    for (int d = 0; d < draws; d++) {
        memcpy(tmp, logits, sizeof(float) * (size_t)n);
        int32_t id = -1;
        if (sn_sampler_sample(s, tmp, &id) == SN_OK && id >= 0 && id < n) counts[id]++;
    }
    free(tmp);
}

static void test_temperature_distribution(void)
{
    /* probs 0.5 / 0.3 / 0.2 at T=1 */
    float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    sn_sampler *s = mk(1.0f, 1, 0, 0, 0, 0, true, 7, 3);
    int c[3];
    histogram(s, l, 3, 20000, c);
    CHECKF(abs(c[0] - 10000) < 400 && abs(c[1] - 6000) < 400 && abs(c[2] - 4000) < 400,
           "%d %d %d", c[0], c[1], c[2]);
    sn_sampler_free(s);
    /* T=0.5 squares the odds: 25:9:4 */
    s = mk(0.5f, 1, 0, 0, 0, 0, true, 7, 3);
    histogram(s, l, 3, 20000, c);
    CHECKF(abs(c[0] - 13158) < 400 && abs(c[1] - 4737) < 400 && abs(c[2] - 2105) < 400,
           "%d %d %d", c[0], c[1], c[2]);
    sn_sampler_free(s);
}

static void test_top_p_before_temperature(void)
{
    /* probs 0.5 / 0.3 / 0.15 / 0.05. top_p 0.75: mass above token 1 is 0.5 < 0.75
     * (kept), above token 2 is 0.8 (cut). A high temperature would flatten the
     * distribution and let more tokens in if it were applied first. */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sn_sampler *s = mk(5.0f, 0.75f, 0, 0, 0, 0, true, 3, 4);
    int c[4];
    histogram(s, l, 4, 5000, c);
    CHECKF(c[2] == 0 && c[3] == 0, "%d %d %d %d", c[0], c[1], c[2], c[3]);
    CHECK(c[0] > 2000 && c[1] > 2000); /* nearly flat between the two survivors at T=5 */
    sn_sampler_free(s);
    /* top_p just above 0.8 lets token 2 in. */
    s = mk(1.0f, 0.81f, 0, 0, 0, 0, true, 3, 4);
    histogram(s, l, 4, 5000, c);
    CHECK(c[2] > 0 && c[3] == 0);
    sn_sampler_free(s);
    /* tiny top_p keeps only the top token. */
    s = mk(1.0f, 0.01f, 0, 0, 0, 0, true, 3, 4);
    histogram(s, l, 4, 500, c);
    CHECK(c[0] == 500);
    sn_sampler_free(s);
}

/* Reference kept set: full sort (prob desc, id asc), keep while the mass
 * strictly above is below p. */
static const float *g_ref_probs;
static int ref_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_ref_probs[x] != g_ref_probs[y]) return g_ref_probs[x] > g_ref_probs[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static void test_top_p_matches_sorted_reference(void)
{
    /* Tied and near-tied logits across a 4000-token vocab; the drawn set at
     * a high temperature must be exactly the reference kept set. */
    enum { V = 4000 };
    float *l = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V), *pr = malloc(sizeof(float) * V);
    int32_t *idx = malloc(sizeof(int32_t) * V);
    int *seen = calloc(V, sizeof(int));
    sn_rng r;
    sn_rng_seed(&r, 5);
    for (int i = 0; i < V; i++) l[i] = (float)(sn_rng_uniform(&r) * 2.0);
    for (int i = 0; i < 12; i++) l[(i * 331) % V] = 9.0f + (float)(i % 3);   /* three tied groups of 4 */
    /* The 12 peaks hold ~96% of the mass: these p values keep 1..12 tokens,
     * cutting inside the tied groups too. */
    static const float ps[] = {0.3f, 0.5f, 0.62f, 0.8f, 0.9f, 0.95f};
    for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
        float topp = ps[pi];
        double mx = -1e30, sum = 0;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < V; i++) { pr[i] = expf(l[i] - (float)mx); sum += pr[i]; }
        for (int i = 0; i < V; i++) { pr[i] = (float)(pr[i] / sum); idx[i] = i; }
        g_ref_probs = pr;
        qsort(idx, V, sizeof *idx, ref_cmp);
        double above = 0;
        int keep = 0;
        while (keep < V && above < topp) above += pr[idx[keep++]];
        CHECK(keep >= 1 && keep <= 12);
        sn_sampler *s = mk(50.0f, topp, 0, 0, 0, 0, true, 11, V);
        memset(seen, 0, sizeof(int) * V);
        for (int d = 0; d < 400 * keep; d++) {
            memcpy(tmp, l, sizeof(float) * V);
            int32_t id;
            CHECK_OK(sn_sampler_sample(s, tmp, &id));
            seen[id]++;
        }
        int n_seen = 0, missing = 0;
        for (int i = 0; i < V; i++) n_seen += seen[i] > 0;
        for (int k = 0; k < keep; k++) missing += seen[idx[k]] == 0;
        CHECKF(n_seen == keep && missing == 0, "top_p %.2f: reference keeps %d, drew %d distinct, %d kept never drawn",
               topp, keep, n_seen, missing);
        sn_sampler_free(s);
    }
    free(l); free(tmp); free(pr); free(idx); free(seen);
}

/* The host sampler's draw, replayed step by step in the test (sorted
 * candidates, rank-order sums, the same RNG stream): a flat distribution
 * over 151669 ids (the radix rank: ~90 % of the ids survive top-p 0.9) and
 * a peaked one over 5003 (the pruned heap) give exactly these ids. */
static int32_t replay_draw(const float *l, int V, float temp, float topp, sn_rng *r, float *pr, int32_t *cand)
{
    int top = 0;
    for (int i = 1; i < V; i++) if (l[i] > l[top]) top = i;
    const float mx = l[top];
    double sum = 0.0;
    for (int i = 0; i < V; i++) { pr[i] = expf(l[i] - mx); sum += pr[i]; }
    const float inv = (float)(1.0 / sum), floor_p = (1.0f - topp) / (float)V;
    int nc = 0;
    for (int i = 0; i < V; i++) {
        float q = pr[i] * inv;
        pr[i] = q;
        if (q >= floor_p && q > 0.0f) cand[nc++] = i;
    }
    g_ref_probs = pr;
    qsort(cand, (size_t)nc, sizeof *cand, ref_cmp);
    int keep = 0;
    double above = 0.0;
    while (keep < nc && above < topp) above += pr[cand[keep++]];
    const float invT = 1.0f / temp;
    double total = 0.0;
    for (int k = 0; k < keep; k++) total += expf((l[cand[k]] - mx) * invT);
    double u = sn_rng_uniform(r) * total, acc = 0.0;
    for (int k = 0; k < keep; k++) {
        acc += expf((l[cand[k]] - mx) * invT);
        if (u < acc) return cand[k];
    }
    return cand[keep - 1];
}

static void test_top_p_exact_draws(void)
{
    static const struct { int V; float spread, temp, topp; } cs[] = {
        { 151669, 0.05f, 0.7f, 0.9f }, { 151669, 0.2f, 1.0f, 0.95f }, { 5003, 6.0f, 0.8f, 0.9f },
    };
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        const int V = cs[c].V;
        float *l = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V), *pr = malloc(sizeof(float) * V);
        int32_t *cand = malloc(sizeof(int32_t) * V);
        sn_rng g, r;
        sn_rng_seed(&g, 40 + c);
        for (int i = 0; i < V; i++) l[i] = (float)((sn_rng_uniform(&g) - 0.5) * cs[c].spread);
        for (int i = 0; i < 50; i++) l[(i * 7919) % V] = l[(i * 104729) % V]; /* exact ties */
        sn_sampler *s = mk(cs[c].temp, cs[c].topp, 0, 0, 0, 0, true, 77, V);
        sn_rng_seed(&r, 77);
        int same = 0, draws = c < 2 ? 12 : 200;
        for (int d = 0; d < draws; d++) {
            memcpy(tmp, l, sizeof(float) * V);
            int32_t id;
            CHECK_OK(sn_sampler_sample(s, tmp, &id));
            same += id == replay_draw(l, V, cs[c].temp, cs[c].topp, &r, pr, cand);
        }
        CHECKF(same == draws, "V %d T %g top_p %g: %d of %d draws are the replay's", V, cs[c].temp, cs[c].topp, same, draws);
        sn_sampler_free(s);
        free(l); free(tmp); free(pr); free(cand);
    }
}

/* SANCTUM_SAMPLE_DEVICE: unset or 1 lets the backend draw, 0 keeps the
 * host sampler, anything else is refused naming the value */
static void test_sample_device_env(void)
{
    bool ok = false;
    unsetenv("SANCTUM_SAMPLE_DEVICE");
    CHECK(sn_sample_device_allowed(&ok) == SN_OK && ok);
    setenv("SANCTUM_SAMPLE_DEVICE", "0", 1);
    CHECK(sn_sample_device_allowed(&ok) == SN_OK && !ok);
    setenv("SANCTUM_SAMPLE_DEVICE", "1", 1);
    CHECK(sn_sample_device_allowed(&ok) == SN_OK && ok);
    setenv("SANCTUM_SAMPLE_DEVICE", "gpu", 1);
    CHECK(sn_sample_device_allowed(&ok) == SN_E_INVALID && strstr(sn_errmsg(), "SANCTUM_SAMPLE_DEVICE=gpu"));
    unsetenv("SANCTUM_SAMPLE_DEVICE");
}

static void test_seed_same_sequence(void)
{
    enum { V = 1000, N = 200 };
    float *base = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
    sn_rng r;
    sn_rng_seed(&r, 99);
    for (int i = 0; i < V; i++) base[i] = (float)(sn_rng_uniform(&r) * 4.0);
    int32_t a[N], b[N], c[N];
    for (int run = 0; run < 3; run++) {
        sn_sampler *s = mk(0.9f, 0.95f, 1.1f, 0, 0, 0, true, run == 2 ? 1235 : 1234, V);
        int32_t *dst = run == 0 ? a : run == 1 ? b : c;
        for (int i = 0; i < N; i++) {
            memcpy(tmp, base, sizeof(float) * V);
            CHECK_OK(sn_sampler_sample(s, tmp, &dst[i]));
            sn_sampler_accept(s, dst[i]);
        }
        sn_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    free(base);
    free(tmp);
}

static void test_logit_bias(void)
{
    /* Bias comes first: it can ban the argmax or promote a token, and the
     * sampler keeps its own copy of the entries. */
    sn_logit_bias b[2] = {{1, -100.0f}, {3, 5.0f}};
    sn_sample_params p;
    sn_sample_params_default(&p);
    p.bias = b;
    p.n_bias = 2;
    p.has_seed = true;
    sn_sampler *s = NULL;
    CHECK_OK(sn_sampler_new(&p, 4, &s));
    b[0].bias = 0.0f;   /* must not affect the sampler */
    CHECK(s && !sn_sampler_is_greedy(s));
    float l[4] = {1.0f, 9.0f, 2.0f, 0.0f};
    int32_t id;
    CHECK_OK(sn_sampler_sample(s, l, &id));
    CHECK(l[1] == -91.0f && l[3] == 5.0f);
    CHECK(id == 3);
    sn_sampler_free(s);
    sn_logit_bias far = {4, 1.0f};
    p.bias = &far;
    p.n_bias = 1;
    CHECK(sn_sampler_new(&p, 4, &s) == SN_E_INVALID && strstr(sn_errmsg(), "outside the vocabulary"));
    sn_logit_bias big = {0, 101.0f};
    p.bias = &big;
    CHECK(sn_sample_params_check(&p) == SN_E_INVALID);
}

static void test_params_check(void)
{
    sn_sample_params p;
    sn_sample_params_default(&p);
    CHECK_OK(sn_sample_params_check(&p));
    p.top_p = 0.0f;
    CHECK(sn_sample_params_check(&p) == SN_E_INVALID && strstr(sn_errmsg(), "top_p"));
    sn_sample_params_default(&p);
    p.temperature = -1.0f;
    CHECK(sn_sample_params_check(&p) == SN_E_INVALID && strstr(sn_errmsg(), "temperature"));
    sn_sample_params_default(&p);
    p.temperature = NAN;
    CHECK(sn_sample_params_check(&p) == SN_E_INVALID);
    sn_sample_params_default(&p);
    p.repetition_window = 0;
    CHECK(sn_sample_params_check(&p) == SN_E_INVALID);
    sn_sample_params_default(&p);
    p.presence_penalty = 3.0f;
    CHECK(sn_sample_params_check(&p) == SN_E_INVALID && strstr(sn_errmsg(), "presence_penalty"));
    sn_sampler *s = NULL;
    sn_sample_params_default(&p);
    CHECK(sn_sampler_new(&p, 0, &s) == SN_E_INVALID && s == NULL);
    sn_sampler_free(NULL);
}


/* sn_sampler_device_rows against the host sampler: row k's edits applied
 * to a row (sample_ref.h, the op's arithmetic) give the bits that
 * sn_sampler_sample's bias and penalties give a sampler that accepted the
 * same window plus extra[0..k); a repeated bias id splits into phases; the
 * rows' u are the RNG's next uniforms, and sn_sampler_took_draw advances it
 * by one. Fails if a penalty's operands, the window or the phases drift. */
static void test_device_rows_match_host(void)
{
    enum { V = 40, NR = 4 };
    static const sn_logit_bias bias[3] = { { 5, 2.0f }, { 9, -1.5f }, { 5, 0.75f } };
    const int32_t hist[6] = { 5, 7, 7, 9, 12, 5 }, extra[NR - 1] = { 7, 30, 31 };
    sn_sample_params p;
    sn_sample_params_default(&p);
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.25f;
    p.repetition_window = 6;
    p.bias = bias;
    p.n_bias = 3;
    p.has_seed = true;
    p.seed = 3;
    sn_sampler *d = NULL;
    CHECK_OK(sn_sampler_new(&p, V, &d));
    if (!d) return;
    for (int i = 0; i < 6; i++) sn_sampler_accept(d, hist[i]);
    const int ec = sn_sampler_edit_cap(d), pc = sn_sampler_phase_cap(d);
    sn_logit_edit *ed = malloc(sizeof *ed * (size_t)(NR * ec));
    int32_t *pe = malloc(sizeof *pe * (size_t)(NR * pc));
    sn_sample_row rows[NR];
    CHECK_OK(sn_sampler_device_rows(d, extra, NR, 10, NULL, 0, ed, pe, rows));
    float L[V];
    uint64_t x = 12345;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        L[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 8.0f;
    }
    for (int k = 0; k < NR; k++) {
        CHECK(rows[k].row == 10 + k && rows[k].temperature == 0.0f && rows[k].u == 0.0);
        /* two bias phases (5 twice), then the penalties */
        CHECKF(rows[k].n_phases == 3, "row %d: %d phases", k, rows[k].n_phases);
        for (int ph = 0; ph < rows[k].n_phases; ph++) {
            int a = ph ? rows[k].phase_end[ph - 1] : 0;
            for (int i = a; i < rows[k].phase_end[ph]; i++)
                for (int j = a; j < i; j++) CHECK(rows[k].edits[i].id != rows[k].edits[j].id);
        }
        sn_sampler *h = NULL;
        CHECK_OK(sn_sampler_new(&p, V, &h));
        if (!h) break;
        for (int i = 0; i < 6; i++) sn_sampler_accept(h, hist[i]);
        for (int i = 0; i < k; i++) sn_sampler_accept(h, extra[i]);
        float hl[V], dl[V];
        memcpy(hl, L, sizeof L);
        memcpy(dl, L, sizeof L);
        int32_t id;
        CHECK_OK(sn_sampler_sample(h, hl, &id)); /* temperature 0: edits the row, then the argmax */
        ref_apply_edits(dl, V, &rows[k]);
        CHECKF(memcmp(hl, dl, sizeof hl) == 0, "row %d: device edits differ from the host sampler's", k);
        sn_sampler_free(h);
    }
    sn_sampler_free(d);
    /* u: the next uniforms, not consumed until a draw is used */
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    CHECK_OK(sn_sampler_new(&p, V, &d));
    if (d) {
        sn_rng r;
        sn_rng_seed(&r, 3);
        double u[6];
        for (int i = 0; i < 6; i++) u[i] = sn_rng_uniform(&r);
        CHECK_OK(sn_sampler_device_rows(d, extra, NR, 0, NULL, 0, ed, pe, rows));
        for (int k = 0; k < NR; k++) CHECKF(rows[k].u == u[k], "row %d: u %g, want %g", k, rows[k].u, u[k]);
        CHECK(rows[0].temperature == 0.7f && rows[0].top_p == 0.9f);
        sn_sampler_took_draw(d);
        sn_sampler_took_draw(d);
        CHECK_OK(sn_sampler_device_rows(d, NULL, 1, 0, NULL, 0, ed, pe, rows));
        CHECK(rows[0].u == u[2]);
        CHECK(sn_sampler_device_rows(d, NULL, 2, 0, NULL, 0, ed, pe, rows) == SN_E_INVALID);
        CHECK(sn_sampler_device_rows(d, extra, 65, 0, NULL, 0, ed, pe, rows) == SN_E_INVALID);
        sn_sampler_free(d);
    }
    free(ed);
    free(pe);
}

int main(void)
{
    RUN(test_rng_reproducible);
    RUN(test_greedy);
    RUN(test_repetition_penalty_sign_aware);
    RUN(test_window_bounded);
    RUN(test_presence_frequency);
    RUN(test_temperature_distribution);
    RUN(test_top_p_before_temperature);
    RUN(test_top_p_matches_sorted_reference);
    RUN(test_top_p_exact_draws);
    RUN(test_sample_device_env);
    RUN(test_seed_same_sequence);
    RUN(test_logit_bias);
    RUN(test_params_check);
    RUN(test_device_rows_match_host);
    return TEST_END();
}
