/* CPU backend, Q4 paths of kernels_avx2.c and kernels_avx512_vnni.c: the
 * exact integer kernel (x as three int8 digit planes per group) against the double reference and
 * the scalar backend, its limits (zero, tiny, huge and spiky groups, NaN),
 * batch invariance over T and threads, and the opt-in 8-bit activation
 * path (SANCTUM_CPU_Q4=q8) within its derived bound; the SANCTUM_CPU_Q4
 * knob itself. Split from test_backend_cpu.c (shared helpers in
 * cpu_test_util.h). An ISA the CPU lacks is SKIPped. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sanctum/backend.h"
#include "sanctum/cpu.h"
#include "cpu_test_util.h"

/* x of the integer Q4 tests (kernels_avx2.c turns each group of x into
 * integers scaled by a power of two relative to the group's max): */
enum { XK_UNIFORM, XK_ZERO, XK_TINY, XK_HUGE, XK_SPIKE, XK_MIXED, XK_COUNT };
static const char *const xk_name[XK_COUNT] = { "uniform", "zero", "tiny", "huge", "spike", "mixed" };
static void fill_xk(float *x, int64_t cols, int T, int group, int kind)
{
    fill(x, (size_t)T * cols, -1, 1);
    for (int64_t i = 0; i < T * cols; i++) {
        int64_t g = i / group;
        switch (kind) {
        case XK_ZERO: x[i] = 0.0f; break;
        case XK_TINY: x[i] *= 1e-20f; break;              /* 2^-66: still 22 bits per group */
        case XK_HUGE: x[i] *= 1e30f; break;
        case XK_SPIKE: x[i] = i % group == 5 ? 3e4f * x[i] : 1e-3f * x[i]; break; /* one large value per group */
        case XK_MIXED: /* groups from 2^-60 to 2^60, every fourth one zero, exact +-1 and +-2^k values */
            x[i] = g % 4 == 3 ? 0.0f : (float)ldexp(i % 7 == 0 ? (i % 2 ? 1 : -1) : x[i], (int)(g * 37 % 121) - 60);
            break;
        default: break;
        }
    }
}

/* Bound for the tests below where no group holds values far below its max:
 * there x keeps ~22 significant bits in the integer path, and every kernel
 * measured <= 1.2e-7 against double; a wrong plane weight in the integer
 * path (255 for 256) shows as ~1e-5. With a spike per group (values 2^25
 * below it are rounded to the group's integer grid) REL_MM applies. */
#define REL_Q4X 1e-6

/* The AVX2 table's exact integer Q4 path (groups 32, 64, 128) against the
 * double reference and the scalar oracle (same bounds as every matmul):
 * odd row counts (GEMV tile tails), group counts that are and are not
 * multiples of the 8-group scale blocks, all scale dtypes (negative scales
 * and biases included: tw_make draws them from both signs), and x that is
 * zero, tiny, huge, one spike per group, or of wildly different magnitude
 * from group to group. Every ISA runs it (the scalar table takes its float
 * kernel, the AVX-512 one kernels_avx512_vnni.c's on a CPU with VNNI and
 * its float kernel without). */
static void test_matmul_q4_int(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 2);
    const sn_dtype sdts[] = { SN_DT_BF16, SN_DT_F16, SN_DT_F32 };
    const int64_t rowss[] = { 1, 3, 37, 8 };
    /* 131 groups: rows over CPU_MM_RB1_COLS, which decode several a tile
     * (shorter ones one a tile) */
    const int64_t ngs[] = { 1, 3, 9, 16, 17, 131 };
    const int Ts[] = { 1, 2, 5 };
    const sn_cpu_features *f = sn_cpu_features_get();
    if (sn_cpu_isa_supported(SN_ISA_AVX512) && !f->avx512vnni)
        fprintf(stderr, "  note: no AVX512_VNNI on this CPU: the AVX-512 table runs its float Q4 kernel here, "
                        "kernels_avx512_vnni.c is not exercised\n");
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = ii == 0 ? ref : backend_for(isas[ii], 2);
        if (!be)
            continue;
        int k = 0;
        for (int group = 32; group <= 128; group *= 2)
            for (int kind = 0; kind < XK_COUNT; kind++)
                for (int rep = 0; rep < 3; rep++, k++) {
                    int64_t rows = rowss[k % 4], cols = group * ngs[k % 6];
                    int T = Ts[k % 3];
                    tw t;
                    tw_make(&t, SN_DT_Q4, rows, cols, group, sdts[k % 3], 0);
                    float *x = malloc(sizeof(float) * (size_t)T * cols);
                    fill_xk(x, cols, T, group, kind);
                    char what[64];
                    snprintf(what, sizeof what, "Q4 int x %s", xk_name[kind]);
                    check_mm_x(be, ref, &t, 0, x, T, kind == XK_SPIKE ? REL_MM : REL_Q4X, what);
                    free(x);
                    tw_free(&t);
                }
        if (be != ref)
            sn_backend_free(be);
    }
    sn_backend_free(ref);
}

/* A NaN or inf in token 1 (its second group) of a 3-token batch over t, a
 * [5, 3 * group] Q4 weight (x: room for 3 tokens), makes every output of
 * that token non-finite (want_nan: NaN), leaves tokens 0 and 2 finite, and
 * those equal their GEMV bitwise. */
static void check_nonfinite_isolated(sn_backend *be, const tw *t, float *x, int want_nan, const char *what)
{
    const int group = t->w.group;
    const int64_t cols = t->w.cols;
    enum { T = 3 };
    float y[T * 5], y1[5];
    for (int bad = 0; bad < 2; bad++) {
        fill(x, (size_t)T * cols, -1, 1);
        x[cols + group + 7] = bad ? INFINITY : NAN;
        CHECK_OK(be->ops->matmul(be, &t->w, 0, x, T, y));
        int ok = 1;
        for (int r = 0; r < 5; r++)
            ok &= (want_nan ? isnan(y[5 + r]) : !isfinite(y[5 + r])) && isfinite(y[r]) && isfinite(y[10 + r]);
        CHECKF(ok, "%s group %d: a %s in token 1 must make exactly its outputs %s", what, group, bad ? "inf" : "NaN",
               want_nan ? "NaN" : "non-finite");
        for (int tok = 0; tok < T; tok += 2) {
            CHECK_OK(be->ops->matmul(be, &t->w, 0, x + (size_t)tok * cols, 1, y1));
            CHECK(memcmp(y1, y + tok * 5, sizeof y1) == 0);
        }
    }
}

/* Limits of the integer Q4 path, on every ISA: (a) a group whose max |x|
 * is below 2^-78 is scaled by 2^100 at most (the scale 2^-100 * s must stay
 * a normal float), so its x is rounded to multiples of 2^-100: the error is
 * then absolute, <= 2^-101 per column and |w| < 1 here; (b) a NaN or inf in
 * x makes every output of that token non-finite (NaN for the integer path,
 * NaN or inf for the float ones) and leaves the other tokens of the batch
 * alone, finite and bitwise equal to their GEMV. */
static void test_matmul_q4_int_limits(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 1);
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        for (int group = 32; group <= 128; group *= 2) {
            const int64_t rows = 5, cols = 3 * group;
            enum { T = 3 };
            tw t;
            tw_make(&t, SN_DT_Q4, rows, cols, group, SN_DT_BF16, 0);
            float *x = malloc(sizeof(float) * T * (size_t)cols);
            float y[T * 5];
            double yr[T * 5], mag[T * 5];
            fill(x, (size_t)T * cols, -1e-30f, 1e-30f);
            CHECK_OK(be->ops->matmul(be, &t.w, 0, x, T, y));
            mm_ref(&t.w, 0, x, T, yr, mag);
            for (int i = 0; i < T * 5; i++)
                CHECKF(fabs(y[i] - yr[i]) <= ldexp(1, -101) * (double)cols + 1e-5 * mag[i],
                       "%s group %d tiny x: y[%d] %g vs %g", be->ops->name, group, i, (double)y[i], yr[i]);
            check_nonfinite_isolated(be, &t, x, 0, be->ops->name);
            free(x);
            tw_free(&t);
        }
        sn_backend_free(be);
    }
    sn_backend_free(ref);
}

/* A backend for isa with SANCTUM_CPU_Q4=mode (NULL mode: the default). */
static sn_backend *backend_for_q4(sn_isa isa, int threads, const char *mode)
{
    if (mode)
        setenv("SANCTUM_CPU_Q4", mode, 1);
    sn_backend *be = backend_for(isa, threads);
    unsetenv("SANCTUM_CPU_Q4");
    return be;
}

/* Batch invariance of the Q4 kernels per group (32/64/128, and 96 for the
 * generic float one), at batch sizes around the token tiles and on 1, 2, 3
 * threads: each token of a batch equals its GEMV bitwise. For the default
 * kernels and for SANCTUM_CPU_Q4=q8 (the 8-bit activation path of the AVX2
 * table, and of the AVX-512 one with VNNI; the scalar table keeps its
 * default there). */
static void test_matmul_q4_batch_sizes(void)
{
    const int groups[] = { 32, 64, 128, 96 };
    const int Ts[] = { 2, 3, 4, 5, 9 };
    const char *const modes[] = { NULL, "q8" };
    for (size_t ii = 0; ii < 6; ii++) {
        const char *mode = modes[ii / 3];
        sn_backend *bes[3] = { NULL, NULL, NULL };
        bes[0] = backend_for_q4(isas[ii % 3], 1, mode);
        if (!bes[0])
            continue;
        bes[1] = backend_for_q4(isas[ii % 3], 2, mode);
        bes[2] = backend_for_q4(isas[ii % 3], 3, mode);
        for (size_t gi = 0; gi < 8; gi++) {
            /* 9 groups, then 131 (rows over CPU_MM_RB1_COLS: several a decode tile) */
            const int group = groups[gi % 4];
            const int64_t rows = 23, cols = (gi < 4 ? 9 : 131) * (int64_t)group;
            tw t;
            tw_make(&t, SN_DT_Q4, rows, cols, group, gi % 2 ? SN_DT_F16 : SN_DT_BF16, 0);
            float *x = malloc(sizeof(float) * 9 * (size_t)cols), y1[9][23], yb[9 * 23];
            fill_xk(x, cols, 9, group, gi == 1 ? XK_MIXED : XK_UNIFORM);
            for (int tok = 0; tok < 9; tok++)
                CHECK_OK(bes[0]->ops->matmul(bes[0], &t.w, 0, x + (size_t)tok * cols, 1, y1[tok]));
            int same = 1;
            for (int th = 0; th < 3; th++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                    int T = Ts[ti], t0 = 9 - T; /* the batch's last tokens: other positions */
                    CHECK_OK(bes[th]->ops->matmul(bes[th], &t.w, 0, x + (size_t)t0 * cols, T, yb));
                    for (int tok = 0; tok < T; tok++)
                        same &= memcmp(yb + tok * 23, y1[t0 + tok], sizeof y1[0]) == 0;
                }
            CHECKF(same, "%s Q4 (%s) group %d: a token's output depends on its batch or thread count",
                   bes[0]->ops->name, mode ? mode : "default", group);
            free(x);
            tw_free(&t);
        }
        for (int th = 0; th < 3; th++)
            sn_backend_free(bes[th]);
    }
}

/* Error bound of the 8-bit activation Q4 path (SANCTUM_CPU_Q4=q8,
 * kernels_avx2.c q4x8_prep), derived from its definition: per token and
 * group, d = max|x|/127 and each x is replaced by X*d with |x - X*d| <=
 * d/2 (1 + 2^-20: the fp32 roundings of 127/max and x*(127/max) can move
 * X across a half only by that much), and only s_g * sum(q x) sees it, so
 *   |y - y_exact| <= sum_g |s_g| * d_g/2 * sum_{i in g} q_i * (1 + 2^-20);
 * the rest is fp32 rounding as in every kernel (REL_MM * mag). bnd[t, r]
 * gets the first term. */
static void q8_bound(const sn_weight *w, const float *x, int T, double *bnd)
{
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < w->rows; r++) {
            double b = 0;
            for (int64_t g = 0; g < w->cols / w->group; g++) {
                double mx = 0, qs = 0;
                for (int64_t c = g * w->group; c < (g + 1) * w->group; c++) {
                    mx = fmax(mx, fabs((double)x[(size_t)t * w->cols + c]));
                    uint32_t word = ((const uint32_t *)w->data)[(size_t)r * (size_t)(w->cols / 8) + (size_t)(c / 8)];
                    qs += (word >> (4 * (c % 8))) & 15u;
                }
                double s = load_d(w->scales, w->sdtype, (size_t)r * (size_t)(w->cols / w->group) + (size_t)g);
                b += fabs(s) * (mx / 127) / 2 * qs * (1 + 0x1p-20);
            }
            bnd[(size_t)t * w->rows + r] = b;
        }
}

/* The opt-in 8-bit activation Q4 path of a table (q4_q8_check: AVX2, and
 * AVX-512, VNNI's kernel where the CPU has it) against the double
 * reference and the scalar oracle within q8_bound (+ REL_MM * mag, twice
 * that against the scalar oracle, which has its own fp32 rounding), on the
 * shapes of test_matmul_q4_int (odd rows, group counts around the 8-group
 * blocks, all scale dtypes, every x kind, and x ~1e-30 whose groups take
 * the 2^64 pre-scale); and NOT bitwise the exact path's output wherever x
 * is not zero, so the knob really switched. Also: a NaN or inf makes
 * exactly its token's outputs NaN, the others stay equal to their GEMV.
 * The observed worst error relative to the bound and to mag is printed. */
static void q4_q8_check(sn_isa isa)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 2);
    sn_backend *be = backend_for_q4(isa, 2, "q8"), *ex = backend_for_q4(isa, 2, NULL);
    if (!be || !ex) {
        sn_backend_free(be);
        sn_backend_free(ex);
        sn_backend_free(ref);
        return;
    }
    const sn_dtype sdts[] = { SN_DT_BF16, SN_DT_F16, SN_DT_F32 };
    const int64_t rowss[] = { 1, 3, 37, 8, 5 };
    const int64_t ngs[] = { 1, 3, 9, 16, 17 };
    const int Ts[] = { 1, 2, 5 };
    double worst_b = 0, worst_m = 0;
    int k = 0;
    for (int group = 32; group <= 128; group *= 2)
        for (int kind = 0; kind <= XK_COUNT; kind++) /* XK_COUNT: x * 1e-30 */
            for (int rep = 0; rep < 3; rep++, k++) {
                int64_t rows = rowss[k % 5], cols = group * ngs[(k / 5) % 5];
                int T = Ts[k % 3];
                tw t;
                tw_make(&t, SN_DT_Q4, rows, cols, group, sdts[k % 3], 0);
                size_t ny = (size_t)T * rows;
                float *x = malloc(sizeof(float) * (size_t)T * cols), *y = malloc(ny * 4), *ys = malloc(ny * 4),
                      *ye = malloc(ny * 4);
                double *yr = malloc(ny * 8), *mag = malloc(ny * 8), *bnd = malloc(ny * 8);
                fill_xk(x, cols, T, group, kind == XK_COUNT ? XK_UNIFORM : kind);
                if (kind == XK_COUNT)
                    for (int64_t i = 0; i < T * cols; i++)
                        x[i] *= 1e-30f;
                CHECK_OK(be->ops->matmul(be, &t.w, 0, x, T, y));
                CHECK_OK(ref->ops->matmul(ref, &t.w, 0, x, T, ys));
                CHECK_OK(ex->ops->matmul(ex, &t.w, 0, x, T, ye));
                mm_ref(&t.w, 0, x, T, yr, mag);
                mm_mag_q(&t.w, 0, x, T, mag);
                q8_bound(&t.w, x, T, bnd);
                int ok_r = 1, ok_s = 1;
                for (size_t i = 0; i < ny; i++) {
                    double e = fabs(y[i] - yr[i]), es = fabs((double)y[i] - ys[i]);
                    ok_r &= e <= bnd[i] + REL_MM * mag[i];
                    ok_s &= es <= bnd[i] + 2 * REL_MM * mag[i];
                    if (bnd[i] > 0)
                        worst_b = fmax(worst_b, e / bnd[i]);
                    if (mag[i] > 0)
                        worst_m = fmax(worst_m, e / mag[i]);
                }
                CHECKF(ok_r && ok_s, "%s q8 x %s: [%lld x %lld] T=%d group=%d: outside the derived bound (vs double %d, "
                       "vs scalar %d)", sn_isa_name(isa), kind == XK_COUNT ? "1e-30" : xk_name[kind], (long long)rows,
                       (long long)cols, T, group, ok_r, ok_s);
                if (kind != XK_ZERO)
                    CHECKF(memcmp(y, ye, ny * 4) != 0, "%s q8 x %s group %d: bitwise equal to the exact path",
                           sn_isa_name(isa), kind == XK_COUNT ? "1e-30" : xk_name[kind], group);
                free(x); free(y); free(ys); free(ye); free(yr); free(mag); free(bnd);
                tw_free(&t);
            }
    fprintf(stderr, "  %s q8 worst |err| / derived bound %.3g, / sum|terms| %.3g\n", sn_isa_name(isa), worst_b,
            worst_m);
    for (int group = 32; group <= 128; group *= 2) {
        tw t;
        tw_make(&t, SN_DT_Q4, 5, 3 * group, group, SN_DT_BF16, 0);
        float *x = malloc(sizeof(float) * 3 * 3 * (size_t)group);
        check_nonfinite_isolated(be, &t, x, 1, "q8");
        free(x);
        tw_free(&t);
    }
    sn_backend_free(be);
    sn_backend_free(ex);
    sn_backend_free(ref);
}

/* q4_q8_check on the AVX2 kernel, and on an AVX-512 host (which without
 * VNNI runs the AVX2 kernel for q8 too) on the AVX-512 table's */
static void test_matmul_q4_q8(void)
{
    q4_q8_check(SN_ISA_AVX2);
    if (sn_cpu_isa_supported(SN_ISA_AVX512))
        q4_q8_check(SN_ISA_AVX512);
}

/* SANCTUM_CPU_Q4=fp32 keeps Q4 on the float kernel (an A/B knob); it meets
 * the same bound; a bad value is refused with a message naming int, fp32
 * and q8 (q8 itself: test_matmul_q4_q8). */
static void test_matmul_q4_knob(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 1), *be = NULL;
    setenv("SANCTUM_CPU_Q4", "fp32", 1);
    CHECK_OK(sn_backend_cpu_new(2, &be));
    setenv("SANCTUM_CPU_Q4", "fast", 1);
    sn_backend *bad = NULL;
    CHECK(sn_backend_cpu_new(2, &bad) == SN_E_INVALID && bad == NULL);
    CHECK(strstr(sn_errmsg(), "SANCTUM_CPU_Q4") != NULL);
    CHECKF(strstr(sn_errmsg(), "int") && strstr(sn_errmsg(), "fp32") && strstr(sn_errmsg(), "q8"),
           "the message must name every value: %s", sn_errmsg());
    unsetenv("SANCTUM_CPU_Q4");
    if (be) {
        tw t;
        tw_make(&t, SN_DT_Q4, 9, 192, 64, SN_DT_BF16, 0);
        check_mm_case(be, ref, &t, 0, 3, "Q4 SANCTUM_CPU_Q4=fp32");
        tw_free(&t);
        sn_backend_free(be);
    }
    sn_backend_free(ref);
}

int main(void)
{
    RUN(test_matmul_q4_int);
    RUN(test_matmul_q4_int_limits);
    RUN(test_matmul_q4_batch_sizes);
    RUN(test_matmul_q4_q8);
    RUN(test_matmul_q4_knob);
    return TEST_END();
}
