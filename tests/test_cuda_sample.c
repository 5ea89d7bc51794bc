/* Draws on the GPU (sn_backend_ops.sample, src/backend/cuda/cuda_sample.cu)
 * against sample_ref.h, the plain host form of the same draw:
 *  - vocabularies of 5003, 151669 and 248320 ids; temperature 0 (with
 *    penalties and logit bias: the host sampler's argmax, exactly), and
 *    sampled settings with and without top-p; logits with a few spikes,
 *    -inf and NaN; rows made by sn_sampler_device_rows (a verify pass's
 *    windows, repetition / presence / frequency penalties, a repeated bias
 *    id) and banned ids (a spike among them);
 *  - each sampled draw is the reference's, or else u * total sits within
 *    1e-6 of the boundary between the two picks (the kernel's sums round
 *    in another order) or the pick is at the top-p threshold; at most 1 %
 *    of draws may be such boundary cases;
 *  - 4096 draws of one 64-id row at stratified u: the same rule, which
 *    pins the whole cumulative distribution, top-p on and off;
 *  - deterministic (the same inputs twice: the same ids), banned ids never
 *    drawn, an all-NaN row SN_E_RANGE, a +inf logit drawn;
 *  - and the time of one draw at 248320 ids (printed).
 * No GPU: a visible SKIP and "0 passed, 0 failed". */
#include "harness.h"

#define TU_SEED 0x5eed5a3b1e00ull
#include "cuda_test_util.h"
#include "sample_ref.h"
#include "sanctum/sample.h"

#include <time.h>

#ifdef SN_HAVE_CUDA /* a CPU-only build (no nvcc) compiles main alone: the SKIP */
static int g_draws, g_boundary;

/* rows of x [nr, V] on the GPU against the reference; exact: no boundary cases allowed */
static void check_rows(const char *what, const float *x, int nr, int V, const sn_sample_row *rows, bool exact)
{
    float *d = dcopy(x, (size_t)nr * V);
    int32_t *got = malloc(sizeof(int32_t) * nr), *again = malloc(sizeof(int32_t) * nr);
    CHECK_OK(G->ops->sample(G, d, nr, V, rows, got));
    G->ops->from_host(G, d, x, sizeof(float) * (size_t)nr * V);
    CHECK_OK(G->ops->sample(G, d, nr, V, rows, again));
    CHECKF(memcmp(got, again, sizeof(int32_t) * nr) == 0, "%s: two runs drew different ids", what);
    float *h = malloc(sizeof(float) * V);
    double *lo = malloc(sizeof(double) * V), *hi = malloc(sizeof(double) * V);
    for (int k = 0; k < nr; k++) {
        memcpy(h, x + (size_t)rows[k].row * V, sizeof(float) * V);
        ref_draw rd = { .cum_lo = lo, .cum_hi = hi };
        CHECK_OK(ref_draw_row(h, V, &rows[k], &rd));
        const int g = got[k];
        g_draws++;
        for (int b = 0; b < rows[k].n_banned; b++) CHECKF(g != rows[k].banned[b], "%s row %d: drew banned id %d", what, k, g);
        if (g == rd.id) continue;
        CHECKF(!exact && g >= 0 && g < V, "%s row %d (T %g): drew %d, the reference %d", what, k, rows[k].temperature, g,
               rd.id);
        if (exact || g < 0 || g >= V) continue;
        bool near_u = lo[g] >= 0.0 && rows[k].u >= lo[g] - 1e-6 && rows[k].u <= hi[g] + 1e-6;
        /* not a survivor of the reference: its p must be the top-p cut's */
        bool near_cut = false;
        if (lo[g] < 0.0 && rd.q_last > 0.0f) {
            float mx = -INFINITY;
            for (int i = 0; i < V; i++)
                if (h[i] > mx) mx = h[i];
            double sum = 0.0;
            for (int i = 0; i < V; i++) sum += isnan(h[i]) ? 0.0 : expf(h[i] - mx);
            double qg = expf(h[g] - mx) / sum;
            near_cut = fabs(qg - rd.q_last) <= 1e-5 * rd.q_last;
        }
        CHECKF(near_u || near_cut, "%s row %d (T %g, top_p %g, u %.9f): drew %d [%.9f, %.9f), the reference %d [%.9f, %.9f)",
               what, k, rows[k].temperature, rows[k].top_p, rows[k].u, g, lo[g], hi[g], rd.id, lo[rd.id], hi[rd.id]);
        g_boundary++;
    }
    free(h);
    free(lo);
    free(hi);
    free(got);
    free(again);
    G->ops->buf_free(G, d);
}

static float *spiky_rows(int nr, int V)
{
    float *x = hrand((size_t)nr * V, 4.0f);
    for (int r = 0; r < nr; r++) {
        float *xr = x + (size_t)r * V;
        for (int s = 0; s < 6; s++) xr[(s * 7919 + r * 131) % V] = 12.0f - 0.7f * s; /* a peaked top */
        xr[(r * 17 + 3) % V] = -INFINITY;
        xr[(r * 29 + 11) % V] = NAN;
    }
    return x;
}

static void test_against_reference(void)
{
    static const int vocab[3] = { 5003, 151669, 248320 };
    static const float set[][2] = { { 0.0f, 1.0f }, { 0.7f, 0.9f }, { 1.0f, 1.0f }, { 1.5f, 0.5f },
                                    { 0.8f, 0.999f }, { 1.0f, 0.95f }, { 0.3f, 1.0f }, { 2.0f, 0.97f } };
    static const sn_logit_bias bias[3] = { { 42, 3.0f }, { 4919, -2.5f }, { 42, 0.5f } }; /* ids < every V */
    enum { NR = 6 };
    for (int vi = 0; vi < 3; vi++) {
        const int V = vocab[vi];
        float *x = spiky_rows(NR, V);
        int32_t ban[3] = { 0, 7919 * 2 % V, V - 1 }; /* spike 2 of row 0 among them */
        for (size_t si = 0; si < sizeof set / sizeof set[0]; si++) {
            sn_sample_params p;
            sn_sample_params_default(&p);
            p.temperature = set[si][0];
            p.top_p = set[si][1];
            p.repetition_penalty = 1.2f;
            p.presence_penalty = 0.3f;
            p.frequency_penalty = 0.1f;
            p.repetition_window = 12;
            p.bias = bias;
            p.n_bias = 3;
            p.has_seed = true;
            p.seed = 100 + si;
            sn_sampler *s = NULL;
            CHECK_OK(sn_sampler_new(&p, V, &s));
            if (!s) continue;
            for (int i = 0; i < 10; i++) sn_sampler_accept(s, (int32_t)((i * 7919) % V)); /* the spikes, penalised */
            const int ec = sn_sampler_edit_cap(s), pc = sn_sampler_phase_cap(s);
            sn_logit_edit *ed = malloc(sizeof *ed * (size_t)(NR * ec));
            int32_t *pe = malloc(sizeof *pe * (size_t)(NR * pc));
            sn_sample_row rows[NR];
            int32_t extra[NR] = { 7919 % V, 42, 5, 6, 7919 * 3 % V, 9 };
            for (int rep = 0; rep < 8; rep++) { /* eight u per row */
                CHECK_OK(sn_sampler_device_rows(s, extra, NR, 0, ban, 3, ed, pe, rows));
                char what[96];
                snprintf(what, sizeof what, "V %d T %g top_p %g", V, set[si][0], set[si][1]);
                check_rows(what, x, NR, V, rows, p.temperature == 0.0f);
                for (int k = 0; k < NR; k++) sn_sampler_took_draw(s);
                if (p.temperature == 0.0f) break;
            }
            free(ed);
            free(pe);
            sn_sampler_free(s);
        }
        free(x);
    }
    fprintf(stderr, "  %d draws, %d at a boundary\n", g_draws, g_boundary);
    CHECKF(g_boundary * 100 <= g_draws, "%d of %d draws at a boundary (1 %% allowed)", g_boundary, g_draws);
}

/* one 64-id row, 4096 stratified u: every part of the cumulative distribution */
static void test_stratified(void)
{
    enum { V = 64, NR = 512, CALLS = 8 };
    float *row = hrand(V, 2.0f);
    row[5] = 3.0f;
    row[6] = 3.0f; /* a tie */
    float *x = malloc(sizeof(float) * (size_t)NR * V);
    for (int r = 0; r < NR; r++) memcpy(x + (size_t)r * V, row, sizeof(float) * V);
    const float tp[2] = { 1.0f, 0.9f };
    int before = g_boundary, draws0 = g_draws;
    for (int t = 0; t < 2; t++) {
        sn_sample_row rows[NR];
        for (int c = 0; c < CALLS; c++) {
            for (int k = 0; k < NR; k++)
                rows[k] = (sn_sample_row){ .row = k, .temperature = 0.8f, .top_p = tp[t],
                                           .u = ((double)(c * NR + k) + 0.5) / (double)(NR * CALLS) };
            check_rows(t ? "stratified, top_p 0.9" : "stratified", x, NR, V, rows, false);
        }
    }
    fprintf(stderr, "  stratified: %d draws, %d at a boundary\n", g_draws - draws0, g_boundary - before);
    CHECK(g_boundary - before <= 8);
    free(row);
    free(x);
}

static void test_edges(void)
{
    enum { V = 1000 };
    float *x = hrand(2 * V, 1.0f);
    for (int i = 0; i < V; i++) x[i] = NAN;
    x[V + 321] = INFINITY;
    float *d = dcopy(x, 2 * V);
    int32_t out[2];
    sn_sample_row r[2] = { { .row = 0, .temperature = 1.0f, .top_p = 1.0f, .u = 0.5 },
                           { .row = 1, .temperature = 1.0f, .top_p = 0.9f, .u = 0.5 } };
    CHECK(G->ops->sample(G, d, 1, V, r, out) == SN_E_RANGE);
    CHECK_OK(G->ops->sample(G, d, 1, V, r + 1, out));
    CHECK(out[0] == 321);
    sn_sample_row bad = r[1];
    bad.u = 1.0;
    CHECK(G->ops->sample(G, d, 1, V, &bad, out) == SN_E_INVALID);
    bad.u = 0.5;
    bad.top_p = 0.0f;
    CHECK(G->ops->sample(G, d, 1, V, &bad, out) == SN_E_INVALID);
    G->ops->buf_free(G, d);
    free(x);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void time_draws(void)
{
    enum { V = 248320, N = 41 };
    float *x = spiky_rows(1, V);
    float *d = dcopy(x, V);
    const float set[3][2] = { { 1.0f, 1.0f }, { 0.7f, 0.9f }, { 0.0f, 1.0f } };
    for (int s = 0; s < 3; s++) {
        double t[N];
        for (int i = 0; i < N; i++) {
            sn_sample_row r = { .row = 0, .temperature = set[s][0], .top_p = set[s][1], .u = (i + 0.5) / N };
            int32_t id;
            double t0 = now_s();
            CHECK_OK(G->ops->sample(G, d, 1, V, &r, &id));
            t[i] = now_s() - t0;
        }
        qsort(t, N, sizeof t[0], cmp_d);
        fprintf(stderr, "  one draw at %d ids, T %g top_p %g: median %.1f us (call, kernel and copies)\n", V, set[s][0],
                set[s][1], t[N / 2] * 1e6);
    }
    G->ops->buf_free(G, d);
    free(x);
}
#endif

int main(void)
{
#ifdef SN_HAVE_CUDA
    if (sn_backend_cuda_new(0, &G) != SN_OK) {
        fprintf(stderr, "SKIP test_cuda_sample: %s\n", sn_errmsg());
        return TEST_END();
    }
    RUN(test_against_reference);
    RUN(test_stratified);
    RUN(test_edges);
    RUN(time_draws);
    sn_backend_free(G);
#else
    fprintf(stderr, "SKIP test_cuda_sample: built without CUDA\n");
#endif
    return TEST_END();
}
