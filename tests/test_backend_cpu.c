/* CPU backend: thread pool, feature detection, and every op on every ISA.
 *
 * Two kinds of oracle:
 *  - a plain double-precision reference written here (dequantize per the
 *    MLX spec, LSB-first; the op math from architecture.md), checked with a
 *    stated bound: |y - ref| <= REL * sum_i |a_i*b_i| (+ a tiny absolute
 *    floor), i.e. relative to the magnitude of the terms summed, which is
 *    what fp32 accumulation error scales with;
 *  - the scalar backend, which every SIMD backend must match to a tighter
 *    bound (only the summation order differs).
 * Each ISA is forced through SANCTUM_CPU; one the CPU lacks is SKIPped.
 * The Q4 integer and 8-bit activation paths are in test_cpu_q4.c; the
 * helpers both use are in cpu_test_util.h. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "sanctum/backend.h"
#include "sanctum/cpu.h"
#include "sanctum/threadpool.h"

#include "cpu_test_util.h"

/* ---------- cpu features and pool ---------- */

static void test_cpu_features(void)
{
    const sn_cpu_features *f = sn_cpu_features_get();
    CHECK(f->n_cores >= 1);
    CHECK(sn_cpu_isa_supported(SN_ISA_SCALAR));
    CHECK(sn_cpu_isa_supported(sn_cpu_best_isa()));
    if (sn_cpu_isa_supported(SN_ISA_AVX512))
        CHECK(sn_cpu_isa_supported(SN_ISA_AVX2));
    sn_isa isa;
    CHECK_OK(sn_isa_parse("avx2", &isa));
    CHECK(isa == SN_ISA_AVX2);
    CHECK(sn_isa_parse("sse9", &isa) == SN_E_INVALID);
    setenv("SANCTUM_CPU", "bogus", 1);
    CHECK(sn_cpu_select_isa(&isa) == SN_E_INVALID);
    CHECK(strstr(sn_errmsg(), "SANCTUM_CPU") != NULL);
    sn_backend *be = NULL;
    CHECK(sn_backend_cpu_new(1, &be) == SN_E_INVALID && be == NULL);
    setenv("SANCTUM_CPU", "scalar", 1);
    CHECK_OK(sn_cpu_select_isa(&isa));
    CHECK(isa == SN_ISA_SCALAR);
    unsetenv("SANCTUM_CPU");
    CHECK_OK(sn_cpu_select_isa(&isa));
    CHECK(isa == sn_cpu_best_isa());
    fprintf(stderr, "  cpu: %d cores, best %s (avx2 %d fma %d f16c %d avx512f %d bw %d vl %d dq %d vnni %d)\n",
            f->n_cores, sn_isa_name(sn_cpu_best_isa()), f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw,
            f->avx512vl, f->avx512dq, f->avx512vnni);
}

typedef struct {
    int *hits;
    int64_t n;
    sn_pool *pool;
    int bad_tid, nthreads;
    long long nested_sum;
} pool_ctx;

static void hit_body(void *ctx, int64_t b, int64_t e, int tid)
{
    pool_ctx *c = ctx;
    if (tid < 0 || tid >= c->nthreads)
        __atomic_fetch_add(&c->bad_tid, 1, __ATOMIC_RELAXED);
    for (int64_t i = b; i < e; i++)
        __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
}

static void nested_inner(void *ctx, int64_t b, int64_t e, int tid)
{
    pool_ctx *c = ctx;
    __atomic_fetch_add(&c->nested_sum, (long long)(e - b), __ATOMIC_RELAXED);
}

static void nested_outer(void *ctx, int64_t b, int64_t e, int tid)
{
    pool_ctx *c = ctx;
    for (int64_t i = b; i < e; i++)
        sn_pool_for(c->pool, 10, 1, nested_inner, c); /* runs inline */
}

static void test_threadpool(void)
{
    const int threads[] = { 1, 2, 3, 5 };
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        sn_pool *p = NULL;
        CHECK_OK(sn_pool_new(threads[ti], &p));
        if (!p)
            continue;
        CHECK(sn_pool_size(p) == threads[ti]);
        pool_ctx c = { .pool = p, .nthreads = threads[ti] };
        const int64_t ns[] = { 1, 2, 7, 100, 1001, 100000 };
        const int64_t grains[] = { 0, 1, 3, 64, 5000 };
        for (size_t a = 0; a < 6; a++)
            for (size_t g = 0; g < 5; g++) {
                c.n = ns[a];
                c.hits = calloc((size_t)c.n, sizeof(int));
                sn_pool_for(p, c.n, grains[g], hit_body, &c);
                int ok = 1;
                for (int64_t i = 0; i < c.n; i++)
                    ok &= c.hits[i] == 1;
                CHECKF(ok, "threads=%d n=%lld grain=%lld: some index not visited exactly once", threads[ti],
                       (long long)c.n, (long long)grains[g]);
                free(c.hits);
            }
        CHECK(c.bad_tid == 0);
        /* Many tiny calls, as decode makes: all complete, none lost. */
        c.n = 64;
        c.hits = calloc(64, sizeof(int));
        for (int it = 0; it < 20000; it++)
            sn_pool_for(p, 64, 1, hit_body, &c);
        int ok = 1;
        for (int i = 0; i < 64; i++)
            ok &= c.hits[i] == 20000;
        CHECK(ok);
        free(c.hits);
        c.nested_sum = 0;
        sn_pool_for(p, 50, 1, nested_outer, &c);
        CHECK(c.nested_sum == 500);
        sn_pool_for(p, 0, 1, hit_body, &c); /* empty range: nothing runs */
        sn_pool_free(p);
    }
    sn_pool_free(NULL);
    sn_pool *p = NULL;
    CHECK(sn_pool_new(100000, &p) == SN_E_INVALID && p == NULL);
}

/* ---------- matmul ---------- */

static void test_matmul_quant(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 2);
    const mm_shape shapes[] = { { 1, 1, 1 }, { 7, 3, 2 }, { 33, 2, 3 }, { 13, 5, 7 }, { 5, 2, 64 }, { 9, 1, 65 },
                                { 17, 4, 1 } };
    const sn_dtype sdts[] = { SN_DT_BF16, SN_DT_F16, SN_DT_F32 };
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = ii == 0 ? ref : backend_for(isas[ii], 2);
        if (!be)
            continue;
        int k = 0;
        for (int bits = 4; bits <= 8; bits += 4)
            for (int group = 32; group <= 128; group *= 2)
                for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++, k++) {
                    tw t;
                    tw_make(&t, bits == 4 ? SN_DT_Q4 : SN_DT_Q8, shapes[s].rows, shapes[s].cmul * group, group,
                            sdts[k % 3], 0);
                    check_mm_case(be, ref, &t, 0, shapes[s].T, bits == 4 ? "Q4" : "Q8");
                    tw_free(&t);
                }
        if (be != ref)
            sn_backend_free(be);
    }
    sn_backend_free(ref);
}

static void test_matmul_dense(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 2);
    const int64_t colss[] = { 1, 15, 16, 17, 33, 100, 257 };
    const int64_t rowss[] = { 1, 5, 13 };
    const int Ts[] = { 1, 2, 3, 7 };
    const sn_dtype dts[] = { SN_DT_F32, SN_DT_F16, SN_DT_BF16 };
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = ii == 0 ? ref : backend_for(isas[ii], 2);
        if (!be)
            continue;
        int k = 0;
        for (size_t d = 0; d < 3; d++)
            for (size_t c = 0; c < 7; c++, k++) {
                tw t;
                tw_make(&t, dts[d], rowss[k % 3], colss[c], 0, SN_DT_F32, 0);
                check_mm_case(be, ref, &t, 0, Ts[k % 4], sn_dtype_name(dts[d]));
                tw_free(&t);
            }
        if (be != ref)
            sn_backend_free(be);
    }
    sn_backend_free(ref);
}

/* Expert e of a stack equals the same matrix given alone; the linear bias
 * is added; bad arguments are refused with a message, never a crash. */
static void test_matmul_experts_bias_errors(void)
{
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        tw t;
        tw_make(&t, SN_DT_Q4, 11, 128, 64, SN_DT_BF16, 4);
        float bias[11];
        fill(bias, 11, -3, 3);
        t.w.bias = bias;
        for (int e = 0; e < 4; e++)
            check_mm_case(be, NULL, &t, e, 3, "Q4 expert");
        /* expert 2 alone */
        sn_weight one = t.w;
        one.n_experts = 0;
        one.data = (const uint32_t *)t.w.data + 2 * 11 * 16;
        one.scales = (const uint16_t *)t.w.scales + 2 * 11 * 2;
        one.qbiases = (const uint16_t *)t.w.qbiases + 2 * 11 * 2;
        float x[128], y1[11], y2[11];
        fill(x, 128, -1, 1);
        CHECK_OK(be->ops->matmul(be, &t.w, 2, x, 1, y1));
        CHECK_OK(be->ops->matmul(be, &one, 0, x, 1, y2));
        CHECK(memcmp(y1, y2, sizeof y1) == 0);

        CHECK(be->ops->matmul(be, &t.w, 4, x, 1, y1) == SN_E_RANGE);
        CHECK(strstr(sn_errmsg(), "expert 4") != NULL);
        CHECK(be->ops->matmul(be, &t.w, -1, x, 1, y1) == SN_E_RANGE);
        sn_weight bad = one;
        bad.group = 48; /* does not divide 128 */
        CHECK(be->ops->matmul(be, &bad, 0, x, 1, y1) == SN_E_SHAPE);
        CHECK(strstr(sn_errmsg(), "group 48") != NULL);
        CHECK(be->ops->upload_weight(be, &bad) == SN_E_SHAPE);
        bad = one;
        bad.scales = NULL;
        CHECK(be->ops->matmul(be, &bad, 0, x, 1, y1) == SN_E_MISSING);
        bad = one;
        bad.dtype = SN_DT_I32;
        CHECK(be->ops->matmul(be, &bad, 0, x, 1, y1) == SN_E_UNSUPPORTED);
        bad = one;
        bad.sdtype = SN_DT_U8;
        CHECK(be->ops->matmul(be, &bad, 0, x, 1, y1) == SN_E_UNSUPPORTED);
        bad = one;
        bad.rows = 0;
        CHECK(be->ops->matmul(be, &bad, 0, x, 1, y1) == SN_E_SHAPE);
        CHECK(be->ops->matmul(be, &one, 0, x, -1, y1) == SN_E_INVALID);
        CHECK_OK(be->ops->matmul(be, &one, 0, x, 0, y1)); /* T == 0: nothing to do */
        CHECK_OK(be->ops->upload_weight(be, &t.w));
        CHECK(t.w.dev == NULL); /* the CPU uses the mmap in place */
        /* A group the SIMD kernels do not tile (8 for Q4) still works via the oracle. */
        tw odd;
        tw_make(&odd, SN_DT_Q4, 5, 48, 8, SN_DT_F32, 0);
        check_mm_case(be, NULL, &odd, 0, 2, "Q4 group 8");
        tw_free(&odd);
        tw_free(&t);
        sn_backend_free(be);
    }
}

/* The AVX2 Q4 decode loads 16 bytes one byte past each step; the matrix's
 * very last step must not read past the weights (a checkpoint mmap can end
 * right there). Weights are placed to end at a PROT_NONE page: every ISA,
 * GEMV and GEMM, experts too, must run without a fault and match. */
static void test_matmul_q4_end_of_mapping(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    const int64_t rows = 3, cols = 64, E = 2;
    size_t bytes = (size_t)(E * rows * cols / 2);
    size_t span = ((bytes + (size_t)pg - 1) / (size_t)pg + 1) * (size_t)pg;
    uint8_t *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    if (map == MAP_FAILED)
        return;
    CHECK(mprotect(map + span - (size_t)pg, (size_t)pg, PROT_NONE) == 0);
    tw t;
    tw_make(&t, SN_DT_Q4, rows, cols, 32, SN_DT_BF16, E);
    uint8_t *d = map + span - (size_t)pg - bytes;
    memcpy(d, t.data, bytes);
    sn_weight w = t.w;
    w.data = d;
    float x[3 * 64], y[3 * 3], yr[3 * 3];
    fill(x, 3 * 64, -1, 1);
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 1);
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 1);
        if (!be)
            continue;
        for (int T = 1; T <= 3; T += 2) {
            CHECK_OK(be->ops->matmul(be, &w, 1, x, T, y));
            CHECK_OK(ref->ops->matmul(ref, &t.w, 1, x, T, yr));
            for (int i = 0; i < T * 3; i++)
                CHECKF(fabsf(y[i] - yr[i]) <= 1e-4f * (1 + fabsf(yr[i])), "%s T=%d: y[%d] %g vs scalar %g",
                       be->ops->name, T, i, (double)y[i], (double)yr[i]);
        }
        sn_backend_free(be);
    }
    sn_backend_free(ref);
    tw_free(&t);
    munmap(map, span);
}

/* backend.h's batch-invariance contract: a token's output is bitwise the
 * same alone or in a batch, at any position, on any thread count. */
static void test_matmul_batch_invariance(void)
{
    const sn_dtype dts[] = { SN_DT_Q4, SN_DT_Q8, SN_DT_BF16, SN_DT_F32 };
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be1 = backend_for(isas[ii], 1);
        if (!be1)
            continue;
        sn_backend *be3 = backend_for(isas[ii], 3);
        for (size_t d = 0; d < 4; d++) {
            tw t;
            int q = dts[d] == SN_DT_Q4 || dts[d] == SN_DT_Q8;
            tw_make(&t, dts[d], 37, q ? 256 : 77, q ? 64 : 0, SN_DT_BF16, 0);
            enum { T = 13 };
            float x[T * 256], yb[T * 37], y1[37], y3[T * 37];
            fill(x, sizeof x / 4, -1, 1);
            CHECK_OK(be1->ops->matmul(be1, &t.w, 0, x, T, yb));
            CHECK_OK(be3->ops->matmul(be3, &t.w, 0, x, T, y3));
            CHECKF(memcmp(yb, y3, sizeof yb) == 0, "%s %s: 1 vs 3 threads differ", be1->ops->name,
                   sn_dtype_name(dts[d]));
            int same = 1;
            for (int tok = 0; tok < T; tok++) {
                CHECK_OK(be1->ops->matmul(be1, &t.w, 0, x + (size_t)tok * t.w.cols, 1, y1));
                same &= memcmp(y1, yb + tok * 37, sizeof y1) == 0;
            }
            /* tokens 5..9 as a batch of 5 (other position, other blocking) */
            CHECK_OK(be3->ops->matmul(be3, &t.w, 0, x + 5 * t.w.cols, 5, y3));
            same &= memcmp(y3, yb + 5 * 37, 5 * 37 * sizeof(float)) == 0;
            CHECKF(same, "%s %s: a token's output depends on its batch", be1->ops->name, sn_dtype_name(dts[d]));
            tw_free(&t);
        }
        sn_backend_free(be1);
        sn_backend_free(be3);
    }
}

/* The SIMD q_tile is instantiated per supported group (32/64/128) with the
 * step loop unrolled; any other group that is a multiple of the SIMD step
 * (96, 256) takes the generic instantiation. Both must meet the bounds and
 * stay batch invariant (GEMV vs GEMM, tails of the 4-row GEMV tile). */
static void test_matmul_generic_group(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 2);
    const int groups[] = { 96, 256 };
    for (size_t ii = 1; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        for (int bits = 4; bits <= 8; bits += 4)
            for (size_t gi = 0; gi < 2; gi++) {
                int group = groups[gi];
                int64_t rows = 37, cols = group == 96 ? 3 * 96 : 2 * 256;
                tw t;
                tw_make(&t, bits == 4 ? SN_DT_Q4 : SN_DT_Q8, rows, cols, group, SN_DT_BF16, 0);
                check_mm_case(be, ref, &t, 0, 1, "generic group GEMV");
                check_mm_case(be, ref, &t, 0, 9, "generic group GEMM");
                enum { T = 9 };
                float *x = malloc(sizeof(float) * T * (size_t)cols), yb[T * 37], y1[37];
                fill(x, (size_t)T * cols, -1, 1);
                CHECK_OK(be->ops->matmul(be, &t.w, 0, x, T, yb));
                int same = 1;
                for (int tok = 0; tok < T; tok++) {
                    CHECK_OK(be->ops->matmul(be, &t.w, 0, x + (size_t)tok * cols, 1, y1));
                    same &= memcmp(y1, yb + tok * 37, sizeof y1) == 0;
                }
                CHECKF(same, "%s Q%d group %d: a token's output depends on its batch", be->ops->name, bits, group);
                free(x);
                tw_free(&t);
            }
        sn_backend_free(be);
    }
    sn_backend_free(ref);
}

/* The GEMV of a batch's last token equals the batch's last row (3 tokens). */
static void check_gemv_is_batch_row(sn_backend *be, const tw *t)
{
    const int64_t rows = t->w.rows, cols = t->w.cols;
    float *x = malloc(sizeof(float) * 3 * cols), *yb = malloc(sizeof(float) * 3 * rows),
          *y1 = malloc(sizeof(float) * rows);
    fill(x, (size_t)(3 * cols), -1, 1);
    CHECK_OK(be->ops->matmul(be, &t->w, 0, x, 3, yb));
    CHECK_OK(be->ops->matmul(be, &t->w, 0, x + 2 * cols, 1, y1));
    CHECK(memcmp(y1, yb + 2 * rows, sizeof(float) * rows) == 0);
    free(x); free(yb); free(y1);
}

/* Wide rows (the prefill row tile shrinks to its 16-row minimum) and more
 * rows than a tile: several tiles per thread chunk, partial last tile. */
static void test_matmul_wide_tiles(void)
{
    sn_backend *ref = backend_for(SN_ISA_SCALAR, 2);
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = ii == 0 ? ref : backend_for(isas[ii], 2);
        if (!be)
            continue;
        tw t;
        tw_make(&t, SN_DT_Q4, 70, 65536, 64, SN_DT_BF16, 0); /* 2 threads: chunks of 18 rows = tiles of 16 + 2 */
        check_mm_case(be, ref, &t, 0, 3, "Q4 wide");
        check_gemv_is_batch_row(be, &t);
        tw_free(&t);
        tw_make(&t, SN_DT_BF16, 37, 20000, 0, SN_DT_F32, 0);
        check_mm_case(be, ref, &t, 0, 2, "BF16 wide");
        tw_free(&t);
        /* Q8 rows over CPU_MM_RB1_COLS (cpu_internal.h): a decode tile holds
         * RB_GEMV of them; the GEMV against the double reference and the
         * batch's bits */
        tw_make(&t, SN_DT_Q8, 37, 8192, 64, SN_DT_BF16, 0);
        check_mm_case(be, ref, &t, 0, 1, "Q8 wide");
        check_gemv_is_batch_row(be, &t);
        tw_free(&t);
        if (be != ref)
            sn_backend_free(be);
    }
    sn_backend_free(ref);
}

/* ---------- the other ops, each against a double reference ---------- */

/* Elementwise / normalisation ops involve a few roundings each: */
#define REL_EW 2e-6
/* rmsnorm: the error of fp32 sum(x^2) over n terms enters through rsqrt. */
#define REL_NORM 1e-5

static double rel(double got, double want) { return fabs(got - want) / (fabs(want) + 1e-6); }

static void test_embed(void)
{
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        const sn_dtype dts[] = { SN_DT_Q4, SN_DT_Q8, SN_DT_BF16, SN_DT_F32 };
        for (size_t d = 0; d < 4; d++) {
            int q = d < 2;
            tw t;
            tw_make(&t, dts[d], 50, q ? 192 : 37, q ? 64 : 0, SN_DT_F16, 0);
            int32_t ids[5] = { 0, 49, 7, 7, 23 };
            float y[5 * 192];
            CHECK_OK(be->ops->embed(be, &t.w, ids, 5, y));
            double worst = 0;
            for (int k = 0; k < 5; k++)
                for (int64_t c = 0; c < t.w.cols; c++) {
                    double want = w_at(&t.w, 0, ids[k], c);
                    double e = fabs(y[k * t.w.cols + c] - want) / (fabs(want) + 1e-3);
                    worst = e > worst ? e : worst;
                }
            CHECKF(worst <= REL_EW, "%s embed %s: rel err %.3g", be->ops->name, sn_dtype_name(dts[d]), worst);
            ids[3] = 50;
            CHECK(be->ops->embed(be, &t.w, ids, 5, y) == SN_E_RANGE);
            CHECK(strstr(sn_errmsg(), "token id 50") != NULL);
            ids[3] = -1;
            CHECK(be->ops->embed(be, &t.w, ids, 5, y) == SN_E_RANGE);
            tw_free(&t);
        }
        sn_backend_free(be);
    }
}

static void test_norms_elementwise(void)
{
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        const int ns[] = { 1, 7, 16, 100, 2049 };
        for (size_t k = 0; k < 5; k++) {
            int n = ns[k], rows = 3;
            float *x = malloc(sizeof(float) * rows * n), *z = malloc(sizeof(float) * rows * n);
            float *w = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * rows * n);
            fill(x, (size_t)rows * n, -2, 2);
            fill(z, (size_t)rows * n, -4, 4);
            fill(w, n, 0.5f, 1.5f);
            CHECK_OK(be->ops->rmsnorm(be, x, w, rows, n, 1e-6f, y));
            double worst = 0;
            for (int r = 0; r < rows; r++) {
                double ss = 0;
                for (int i = 0; i < n; i++)
                    ss += (double)x[r * n + i] * x[r * n + i];
                double inv = 1.0 / sqrt(ss / n + 1e-6);
                for (int i = 0; i < n; i++) {
                    double e = rel(y[r * n + i], x[r * n + i] * inv * w[i]);
                    worst = e > worst ? e : worst;
                }
            }
            CHECKF(worst <= REL_NORM, "%s rmsnorm n=%d: %.3g", be->ops->name, n, worst);

            CHECK_OK(be->ops->gated_rmsnorm(be, x, z, w, rows, n, 1e-6f, y));
            worst = 0;
            for (int r = 0; r < rows; r++) {
                double ss = 0;
                for (int i = 0; i < n; i++)
                    ss += (double)x[r * n + i] * x[r * n + i];
                double inv = 1.0 / sqrt(ss / n + 1e-6);
                for (int i = 0; i < n; i++) {
                    double zz = z[r * n + i];
                    double want = w[i] * (x[r * n + i] * inv) * (zz / (1 + exp(-zz)));
                    double e = rel(y[r * n + i], want);
                    worst = e > worst ? e : worst;
                }
            }
            CHECKF(worst <= REL_NORM, "%s gated_rmsnorm n=%d: %.3g", be->ops->name, n, worst);
            free(x); free(z); free(w); free(y);
        }
        CHECK(be->ops->rmsnorm(be, NULL, NULL, 1, 0, 1e-6f, NULL) == SN_E_INVALID);

        size_t n = 200003; /* > one parallel chunk, odd */
        float *a = malloc(n * 4), *b = malloc(n * 4), *y = malloc(n * 4), *y0 = malloc(n * 4);
        fill(a, n, -9, 9);
        fill(b, n, -3, 3);
        memcpy(y, b, n * 4);
        memcpy(y0, b, n * 4);
        CHECK_OK(be->ops->add(be, y, a, n));
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs(y[i] - ((double)y0[i] + a[i])) / (fabs(y0[i]) + fabs(a[i]) + 1e-30);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst <= REL_EW, "%s add: %.3g", be->ops->name, worst);
        CHECK_OK(be->ops->swiglu(be, a, b, n, y));
        worst = 0;
        for (size_t i = 0; i < n; i++) {
            double g = a[i], want = g / (1 + exp(-g)) * b[i];
            double e = fabs(y[i] - want) / (fabs(want) + 1e-6);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst <= REL_EW, "%s swiglu: %.3g", be->ops->name, worst);
        memcpy(y, y0, n * 4);
        CHECK_OK(be->ops->mul_sigmoid(be, y, a, n));
        worst = 0;
        for (size_t i = 0; i < n; i++) {
            double want = y0[i] / (1 + exp(-(double)a[i]));
            double e = fabs(y[i] - want) / (fabs(want) + 1e-6);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst <= REL_EW, "%s mul_sigmoid: %.3g", be->ops->name, worst);
        free(a); free(b); free(y); free(y0);
        sn_backend_free(be);
    }
}

static void test_rope(void)
{
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        const int cfg[][4] = { /* T, heads, head_dim, rot_dim */ { 1, 4, 64, 64 }, { 3, 2, 256, 64 }, { 7, 3, 10, 4 } };
        for (int c = 0; c < 3; c++) {
            int T = cfg[c][0], H = cfg[c][1], D = cfg[c][2], R = cfg[c][3], pos0 = 1000 * c + 5;
            float *x = malloc(sizeof(float) * T * H * D), *x0 = malloc(sizeof(float) * T * H * D);
            float inv[128];
            for (int i = 0; i < R / 2; i++)
                inv[i] = powf(10000.0f, -2.0f * i / R);
            fill(x, (size_t)T * H * D, -1, 1);
            memcpy(x0, x, sizeof(float) * T * H * D);
            float ms = c == 1 ? 1.2f : 1.0f;
            CHECK_OK(be->ops->rope(be, x, T, H, D, R, pos0, inv, ms));
            double worst = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    const float *a = x0 + ((size_t)t * H + h) * D;
                    const float *g = x + ((size_t)t * H + h) * D;
                    for (int i = 0; i < D; i++) {
                        double want;
                        if (i >= R) {
                            want = a[i];
                        } else {
                            int j = i % (R / 2);
                            /* angle formed in fp32 as HF does, then trig in double */
                            double ang = (float)(pos0 + t) * inv[j];
                            double cs = cos(ang) * ms, sn = sin(ang) * ms;
                            want = i < R / 2 ? a[j] * cs - a[j + R / 2] * sn : a[j + R / 2] * cs + a[j] * sn;
                        }
                        double e = fabs(g[i] - want); /* |x| <= 1, |mscale| <= 1.2 */
                        worst = e > worst ? e : worst;
                    }
                }
            /* fp32 cos/sin and two products: absolute error of a few ulps of 1 */
            CHECKF(worst <= 1e-6, "%s rope cfg %d: %.3g", be->ops->name, c, worst);
            free(x); free(x0);
        }
        float x[8];
        CHECK(be->ops->rope(be, x, 1, 1, 8, 3, 0, x, 1.0f) == SN_E_INVALID); /* odd rot_dim */
        /* Zero frequencies make rope an exact row scale (the model uses that). */
        float zf[50] = { 0 }, row[100], want[100];
        fill(row, 100, -5, 5);
        for (int i = 0; i < 100; i++)
            want[i] = row[i] * 0.37f;
        CHECK_OK(be->ops->rope(be, row, 1, 1, 100, 100, 1234, zf, 0.37f));
        CHECK(memcmp(row, want, sizeof row) == 0);
        sn_backend_free(be);
    }
}

/* Causal GQA attention in double: query head h uses kv head h/(Hq/Hkv). */
static void attn_ref(const float *q, const float *K, const float *Vv, int T, int pos0, int Hq, int Hkv, int D,
                     double scale, double *out)
{
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            int kh = h / (Hq / Hkv), n = pos0 + t + 1;
            double *s = malloc(sizeof(double) * n), m = -INFINITY, l = 0;
            for (int j = 0; j < n; j++) {
                double d = 0;
                for (int i = 0; i < D; i++)
                    d += (double)q[((size_t)t * Hq + h) * D + i] * K[((size_t)j * Hkv + kh) * D + i];
                s[j] = d * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j < n; j++)
                l += (s[j] = exp(s[j] - m));
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int j = 0; j < n; j++)
                    o += s[j] / l * Vv[((size_t)j * Hkv + kh) * D + i];
                out[((size_t)t * Hq + h) * D + i] = o;
            }
            free(s);
        }
}

static void test_attention(void)
{
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 3);
        if (!be)
            continue;
        const int cfg[][5] = { /* T, pos0, Hq, Hkv, D */ { 1, 0, 4, 2, 64 }, { 3, 5, 8, 2, 32 }, { 7, 0, 3, 3, 17 },
                               { 1, 40, 16, 2, 256 }, { 65, 2, 2, 1, 8 },
                               /* several 64-position chunks: split (decode) and sequential (prefill) merges */
                               { 1, 300, 8, 2, 32 }, { 3, 126, 4, 1, 16 }, { 2, 200, 6, 3, 20 } };
        for (int c = 0; c < 8; c++) {
            int T = cfg[c][0], pos0 = cfg[c][1], Hq = cfg[c][2], Hkv = cfg[c][3], D = cfg[c][4];
            int ctx = pos0 + T + 3;
            sn_kv_view kv = { NULL, NULL, ctx, Hkv, D };
            CHECK_OK(be->ops->buf_alloc(be, sizeof(float) * ctx * Hkv * D, (void **)&kv.k));
            CHECK_OK(be->ops->buf_alloc(be, sizeof(float) * ctx * Hkv * D, (void **)&kv.v));
            fill(kv.k, (size_t)ctx * Hkv * D, -1, 1);
            fill(kv.v, (size_t)ctx * Hkv * D, -1, 1);
            float *kn = malloc(sizeof(float) * T * Hkv * D), *vn = malloc(sizeof(float) * T * Hkv * D);
            fill(kn, (size_t)T * Hkv * D, -1, 1);
            fill(vn, (size_t)T * Hkv * D, -1, 1);
            CHECK_OK(be->ops->kv_write(be, &kv, kn, vn, T, pos0));
            CHECK(memcmp(kv.k + (size_t)pos0 * Hkv * D, kn, sizeof(float) * T * Hkv * D) == 0);
            CHECK(memcmp(kv.v + (size_t)pos0 * Hkv * D, vn, sizeof(float) * T * Hkv * D) == 0);
            float *q = malloc(sizeof(float) * T * Hq * D), *o = malloc(sizeof(float) * T * Hq * D);
            double *ref = malloc(sizeof(double) * T * Hq * D);
            fill(q, (size_t)T * Hq * D, -2, 2);
            float scale = 1.0f / sqrtf((float)D);
            CHECK_OK(be->ops->attention(be, q, &kv, T, pos0, Hq, scale, o));
            attn_ref(q, kv.k, kv.v, T, pos0, Hq, Hkv, D, scale, ref);
            double worst = 0;
            for (size_t i = 0; i < (size_t)T * Hq * D; i++) {
                double e = fabs(o[i] - ref[i]); /* |v| <= 1: outputs are convex mixes */
                worst = e > worst ? e : worst;
            }
            /* fp32 dot products and exp: absolute error on a value in [-1, 1] */
            CHECKF(worst <= 2e-5, "%s attention cfg %d: abs err %.3g", be->ops->name, c, worst);
            /* batch invariance: the last token alone == the last row of the batch */
            if (T > 1) {
                float *o1 = malloc(sizeof(float) * Hq * D);
                CHECK_OK(be->ops->attention(be, q + (size_t)(T - 1) * Hq * D, &kv, 1, pos0 + T - 1, Hq, scale, o1));
                CHECK(memcmp(o1, o + (size_t)(T - 1) * Hq * D, sizeof(float) * Hq * D) == 0);
                free(o1);
            }
            CHECK(be->ops->kv_write(be, &kv, kn, vn, T, ctx - T + 1) == SN_E_RANGE);
            CHECK(be->ops->attention(be, q, &kv, T, ctx - T + 1, Hq, scale, o) == SN_E_RANGE);
            if (Hkv > 1)
                CHECK(be->ops->attention(be, q, &kv, T, pos0, Hkv + 1, scale, o) == SN_E_SHAPE);
            be->ops->buf_free(be, kv.k);
            be->ops->buf_free(be, kv.v);
            free(kn); free(vn); free(q); free(o); free(ref);
        }
        sn_backend_free(be);
    }
}

/* ---------- GatedDeltaNet ---------- */

typedef struct {
    sn_gdn_dims d;
    int C, Kd;
    double *conv, *S; /* reference state */
} gdn_ref_state;

static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double softplus_d(double x) { return x > 20 ? x : log1p(exp(x)); }

/* architecture.md §2.2, recurrent form, in double. */
static void gdn_ref(gdn_ref_state *rs, const float *qkv, const float *a, const float *b, const float *cw,
                    const float *A_log, const float *dtb, int T, double *out)
{
    const sn_gdn_dims *d = &rs->d;
    int C = rs->C, K = d->conv_k, Kd = rs->Kd, Hk = d->n_k_heads, Hv = d->n_v_heads, Dk = d->dk, Dv = d->dv;
    double *c = malloc(sizeof(double) * C), *kv = malloc(sizeof(double) * Dv);
    for (int t = 0; t < T; t++) {
        for (int ch = 0; ch < C; ch++) {
            double acc = 0;
            for (int j = 0; j < K; j++) { /* the state rolls one token at a time */
                double xv = j < K - 1 ? rs->conv[(size_t)j * C + ch] : qkv[(size_t)t * C + ch];
                acc += cw[(size_t)ch * K + j] * xv;
            }
            c[ch] = acc * sigm(acc);
        }
        for (int hk = 0; hk < Hk; hk++)
            for (int which = 0; which < 2; which++) {
                double *x = c + (size_t)which * Kd + (size_t)hk * Dk, ss = 0;
                for (int i = 0; i < Dk; i++)
                    ss += x[i] * x[i];
                double f = 1 / sqrt(ss + 1e-6) * (which == 0 ? 1 / sqrt((double)Dk) : 1);
                for (int i = 0; i < Dk; i++)
                    x[i] *= f;
            }
        for (int hv = 0; hv < Hv; hv++) {
            int hk = hv / (Hv / Hk);
            double *S = rs->S + (size_t)hv * Dk * Dv;
            const double *q = c + (size_t)hk * Dk, *k = c + Kd + (size_t)hk * Dk, *v = c + 2 * Kd + (size_t)hv * Dv;
            double g = -exp((double)A_log[hv]) * softplus_d((double)a[t * Hv + hv] + dtb[hv]);
            double beta = sigm(b[t * Hv + hv]);
            for (int i = 0; i < Dk * Dv; i++)
                S[i] *= exp(g);
            for (int j = 0; j < Dv; j++) {
                double m = 0;
                for (int i = 0; i < Dk; i++)
                    m += S[(size_t)i * Dv + j] * k[i];
                kv[j] = (v[j] - m) * beta;
            }
            for (int i = 0; i < Dk; i++)
                for (int j = 0; j < Dv; j++)
                    S[(size_t)i * Dv + j] += k[i] * kv[j];
            for (int j = 0; j < Dv; j++) {
                double o = 0;
                for (int i = 0; i < Dk; i++)
                    o += S[(size_t)i * Dv + j] * q[i];
                out[((size_t)t * Hv + hv) * Dv + j] = o;
            }
        }
        /* state = last K-1 rows of concat(state, qkv[t]) */
        for (int i = 0; i < K - 2; i++)
            memcpy(rs->conv + (size_t)i * C, rs->conv + (size_t)(i + 1) * C, sizeof(double) * C);
        if (K > 1)
            for (int ch = 0; ch < C; ch++)
                rs->conv[(size_t)(K - 2) * C + ch] = qkv[(size_t)t * C + ch];
    }
    free(c);
    free(kv);
}

static void test_gdn(void)
{
    const int cfg[][5] = { /* Hk, Hv, Dk, Dv, K */ { 2, 4, 16, 24, 4 }, { 1, 1, 128, 128, 4 }, { 2, 2, 9, 7, 2 } };
    const int Ts[] = { 1, 2, 7, 3 }; /* runs continue the same state */
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 2);
        if (!be)
            continue;
        for (int c = 0; c < 3; c++) {
            gdn_ref_state rs = { .d = { cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], 1e-6f } };
            const sn_gdn_dims *d = &rs.d;
            int K = d->conv_k, Hv = d->n_v_heads;
            rs.Kd = d->n_k_heads * d->dk;
            rs.C = 2 * rs.Kd + Hv * d->dv;
            int C = rs.C, Vd = Hv * d->dv, Tmax = 7;
            size_t nS = (size_t)Hv * d->dk * d->dv;
            rs.conv = calloc((size_t)(K - 1) * C + 1, sizeof(double));
            rs.S = calloc(nS, sizeof(double));
            sn_gdn_view st = { calloc((size_t)(K - 1) * C + 1, 4), calloc(nS, 4), NULL, 0 };
            sn_gdn_view st1 = { calloc((size_t)(K - 1) * C + 1, 4), calloc(nS, 4), NULL, 0 }; /* token-at-a-time copy */
            float *cw = malloc(sizeof(float) * C * K), A_log[8], dtb[8];
            fill(cw, (size_t)C * K, -0.6f, 0.6f);
            fill(A_log, 8, -1, 1);
            fill(dtb, 8, -1, 1);
            float *qkv = malloc(sizeof(float) * Tmax * C), *a = malloc(sizeof(float) * Tmax * Hv);
            float *b = malloc(sizeof(float) * Tmax * Hv), *o = malloc(sizeof(float) * Tmax * Vd);
            float *o1 = malloc(sizeof(float) * Vd);
            double *ref = malloc(sizeof(double) * Tmax * Vd);
            int same = 1;
            for (int run = 0; run < 4; run++) {
                int T = Ts[run];
                fill(qkv, (size_t)T * C, -2, 2);
                fill(a, (size_t)T * Hv, -3, 3);
                fill(b, (size_t)T * Hv, -3, 3);
                CHECK_OK(be->ops->gdn(be, d, qkv, a, b, cw, A_log, dtb, &st, T, o));
                gdn_ref(&rs, qkv, a, b, cw, A_log, dtb, T, ref);
                double worst = 0, mx = 0;
                for (size_t i = 0; i < (size_t)T * Vd; i++) {
                    worst = fmax(worst, fabs(o[i] - ref[i]));
                    mx = fmax(mx, fabs(ref[i]));
                }
                CHECKF(worst <= 2e-5 * (mx + 1), "%s gdn cfg %d run %d: out err %.3g (max %.3g)", be->ops->name, c,
                       run, worst, mx);
                worst = 0, mx = 0;
                for (size_t i = 0; i < nS; i++) {
                    worst = fmax(worst, fabs(st.S[i] - rs.S[i]));
                    mx = fmax(mx, fabs(rs.S[i]));
                }
                CHECKF(worst <= 2e-5 * (mx + 1), "%s gdn cfg %d run %d: state err %.3g", be->ops->name, c, run, worst);
                int conv_ok = 1;
                for (size_t i = 0; i < (size_t)(K - 1) * C; i++)
                    conv_ok &= st.conv[i] == (float)rs.conv[i];
                CHECKF(conv_ok, "%s gdn cfg %d run %d: conv state", be->ops->name, c, run);
                /* batch invariance: the same tokens one at a time, bitwise */
                for (int t = 0; t < T; t++) {
                    CHECK_OK(be->ops->gdn(be, d, qkv + (size_t)t * C, a + t * Hv, b + t * Hv, cw, A_log, dtb, &st1,
                                          1, o1));
                    same &= memcmp(o1, o + (size_t)t * Vd, sizeof(float) * Vd) == 0;
                }
                same &= memcmp(st.S, st1.S, nS * 4) == 0;
            }
            CHECKF(same, "%s gdn cfg %d: token-at-a-time differs from a batch", be->ops->name, c);
            sn_gdn_dims bad = *d;
            bad.n_v_heads = 3;
            if (d->n_k_heads == 2)
                CHECK(be->ops->gdn(be, &bad, qkv, a, b, cw, A_log, dtb, &st, 1, o) == SN_E_SHAPE);
            CHECK(be->ops->gdn(be, d, qkv, a, b, cw, A_log, dtb, NULL, 1, o) == SN_E_INVALID);
            free(rs.conv); free(rs.S); free(st.conv); free(st.S); free(st1.conv); free(st1.S);
            free(cw); free(qkv); free(a); free(b); free(o); free(o1); free(ref);
        }
        sn_backend_free(be);
    }
}

/* ---------- argmax (optional op, the engine's greedy pick) ---------- */

static void test_argmax(void)
{
    sn_backend *be = backend_for(sn_cpu_best_isa(), 2);
    if (!be)
        return;
    CHECK(be->ops->argmax != NULL);
    enum { R = 4, N = 1001 };
    float x[R * N];
    fill(x, R * N, -1, 1);
    x[0 * N + 500] = 5; /* plain maximum */
    x[1 * N + 7] = 3;
    x[1 * N + 900] = 3; /* tie: the first wins */
    x[2 * N + 0] = NAN;
    x[2 * N + 1] = 2; /* NaN never wins */
    x[3 * N + N - 1] = INFINITY;
    int32_t id[R] = { -9, -9, -9, -9 };
    CHECK_OK(be->ops->argmax(be, x, R, N, id));
    CHECK(id[0] == 500 && id[1] == 7 && id[2] == 1 && id[3] == N - 1);
    for (int i = 0; i < N; i++)
        x[i] = NAN;
    CHECK(be->ops->argmax(be, x, 1, N, id) == SN_E_RANGE);
    CHECK(be->ops->argmax(be, x, 1, 0, id) == SN_E_INVALID);
    sn_backend_free(be);
}

/* ---------- MoE (optional ops moe + add_gated) ---------- */

/* The model's generic path (qwen3_5_moe.c without a moe op), built from
 * this backend's own ops: fp32 softmax, first-index top-k, renormalised;
 * per expert in ascending order its rows in token order; scale, then add.
 * The fused op must give exactly these bits. */
static void moe_generic(sn_backend *be, const tw *g, const tw *u, const tw *d, const float *lg, int k, bool norm,
                        const float *x, int T, float *y)
{
    int E = (int)g->w.n_experts, I = (int)g->w.rows, H = (int)g->w.cols;
    int32_t *sel = malloc(sizeof(int32_t) * T * k);
    float *sw = malloc(sizeof(float) * T * k), *xe = malloc(sizeof(float) * T * H);
    float *gg = malloc(sizeof(float) * T * I), *uu = malloc(sizeof(float) * T * I), *aa = malloc(sizeof(float) * T * I);
    float *oo = malloc(sizeof(float) * T * H);
    int *tok = malloc(sizeof(int) * T);
    float *tw_ = malloc(sizeof(float) * T);
    for (int t = 0; t < T; t++) {
        const float *l = lg + (size_t)t * E;
        float mx = l[0], sum = 0, tot = 0;
        for (int e = 1; e < E; e++)
            mx = fmaxf(mx, l[e]);
        for (int e = 0; e < E; e++)
            sum += expf(l[e] - mx);
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= sel[t * k + i] == e;
                if (!taken && (best < 0 || l[e] > l[best]))
                    best = e;
            }
            sel[t * k + j] = best;
            sw[t * k + j] = expf(l[best] - mx) / sum;
        }
        for (int j = 0; j < k; j++)
            tot += sw[t * k + j];
        if (norm)
            for (int j = 0; j < k; j++)
                sw[t * k + j] = sw[t * k + j] / tot;
    }
    memset(y, 0, sizeof(float) * T * H);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (sel[t * k + j] == e) {
                    tok[n] = t;
                    tw_[n] = sw[t * k + j];
                    memcpy(xe + (size_t)n * H, x + (size_t)t * H, sizeof(float) * H);
                    n++;
                }
        if (!n)
            continue;
        CHECK_OK(be->ops->matmul(be, &g->w, e, xe, n, gg));
        CHECK_OK(be->ops->matmul(be, &u->w, e, xe, n, uu));
        CHECK_OK(be->ops->swiglu(be, gg, uu, (size_t)n * I, aa));
        CHECK_OK(be->ops->matmul(be, &d->w, e, aa, n, oo));
        for (int r = 0; r < n; r++)
            for (int i = 0; i < H; i++) {
                float p = oo[(size_t)r * H + i] * tw_[r];
                y[(size_t)tok[r] * H + i] = y[(size_t)tok[r] * H + i] + p;
            }
    }
    free(sel); free(sw); free(xe); free(gg); free(uu); free(aa); free(oo); free(tok); free(tw_);
}

static void test_moe(void)
{
    for (size_t ii = 0; ii < 3; ii++) {
        sn_backend *be = backend_for(isas[ii], 3);
        if (!be)
            continue;
        CHECK(be->ops->moe && be->ops->add_gated);
        const int E = 6, I = 64, H = 128;
        tw g, u, d;
        /* mixed layouts, each with its own x preparation: Q4 g64 / Q8 g32 / BF16 */
        tw_make(&g, SN_DT_Q4, I, H, 64, SN_DT_BF16, E);
        tw_make(&u, SN_DT_Q8, I, H, 32, SN_DT_BF16, E);
        tw_make(&d, SN_DT_BF16, H, I, 0, SN_DT_F32, E);
        {
            float x0[3 * 128], lg0[3 * 6], ya[3 * 128], yr0[3 * 128];
            fill(x0, sizeof x0 / 4, -1, 1);
            fill(lg0, sizeof lg0 / 4, -3, 3);
            CHECK_OK(be->ops->moe(be, &g.w, &u.w, &d.w, lg0, 2, true, x0, 3, ya));
            moe_generic(be, &g, &u, &d, lg0, 2, true, x0, 3, yr0);
            CHECKF(memcmp(ya, yr0, sizeof ya) == 0, "%s moe Q4/Q8/BF16 experts differ from the generic path",
                   be->ops->name);
        }
        tw_free(&u);
        tw_free(&d);
        tw_make(&u, SN_DT_Q4, I, H, 32, SN_DT_BF16, E); /* same kernel, other group: own group sums */
        tw_make(&d, SN_DT_Q8, H, I, 32, SN_DT_F16, E);
        enum { TM = 9 };
        float x[TM * 128], lg[TM * 6], y[TM * 128], yr[TM * 128], y1[128];
        fill(x, sizeof x / 4, -1, 1);
        fill(lg, sizeof lg / 4, -3, 3);
        lg[6 + 2] = lg[6 + 4]; /* a tie in token 1: the lower index wins */
        const int Ts[] = { 1, 3, 9 };
        for (int ti = 0; ti < 3; ti++)
            for (int k = 1; k <= 3; k += 2)
                for (int norm = 0; norm < 2; norm++) {
                    int T = Ts[ti];
                    CHECK_OK(be->ops->moe(be, &g.w, &u.w, &d.w, lg, k, norm, x, T, y));
                    moe_generic(be, &g, &u, &d, lg, k, norm, x, T, yr);
                    CHECKF(memcmp(y, yr, sizeof(float) * T * H) == 0, "%s moe T=%d k=%d norm=%d: differs from the "
                           "generic path", be->ops->name, T, k, norm);
                }
        /* batch invariance: token 5 alone == row 5 of the batch of 9 */
        CHECK_OK(be->ops->moe(be, &g.w, &u.w, &d.w, lg, 3, true, x, 9, y));
        CHECK_OK(be->ops->moe(be, &g.w, &u.w, &d.w, lg + 5 * E, 3, true, x + 5 * H, 1, y1));
        CHECK(memcmp(y1, y + 5 * H, sizeof y1) == 0);
        {
            /* more tokens than moe.c's blocks (MOE_TBLK): the tokens on either
             * side of each block edge equal the same tokens alone */
            enum { TB = 1100 };
            float *xb = malloc(sizeof(float) * TB * H), *lb = malloc(sizeof(float) * TB * E),
                  *yb = malloc(sizeof(float) * TB * H);
            fill(xb, TB * H, -1, 1);
            fill(lb, TB * E, -3, 3);
            CHECK_OK(be->ops->moe(be, &g.w, &u.w, &d.w, lb, 3, true, xb, TB, yb));
            const int probe[] = { 0, 127, 128, 255, 256, 511, 512, 1023, 1024, TB - 1 };
            bool same = true;
            for (size_t pi = 0; pi < sizeof probe / sizeof *probe; pi++) {
                const int t = probe[pi];
                CHECK_OK(be->ops->moe(be, &g.w, &u.w, &d.w, lb + (size_t)t * E, 3, true, xb + (size_t)t * H, 1, y1));
                same &= memcmp(y1, yb + (size_t)t * H, sizeof y1) == 0;
            }
            CHECKF(same, "%s moe: a token of a %d-token batch differs from the token alone", be->ops->name, TB);
            free(xb);
            free(lb);
            free(yb);
        }
        /* against double precision: routing and the expert MLPs from the MLX definition */
        double worst = 0, mx = 0;
        for (int t = 0; t < 9; t++) {
            double p[6], s = 0, m = -1e300, o[128] = { 0 };
            for (int e = 0; e < E; e++)
                m = fmax(m, lg[t * E + e]);
            for (int e = 0; e < E; e++)
                s += (p[e] = exp(lg[t * E + e] - m));
            int sel[3];
            double tot = 0;
            for (int j = 0; j < 3; j++) {
                int best = -1;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int i = 0; i < j; i++)
                        taken |= sel[i] == e;
                    if (!taken && (best < 0 || p[e] > p[best]))
                        best = e;
                }
                sel[j] = best;
                tot += p[best] / s;
            }
            for (int j = 0; j < 3; j++) {
                int e = sel[j];
                double a[64];
                for (int r = 0; r < I; r++) {
                    double gv = 0, uv = 0;
                    for (int c = 0; c < H; c++) {
                        gv += w_at(&g.w, e, r, c) * x[t * H + c];
                        uv += w_at(&u.w, e, r, c) * x[t * H + c];
                    }
                    a[r] = gv / (1 + exp(-gv)) * uv;
                }
                for (int r = 0; r < H; r++) {
                    double dv = 0;
                    for (int c = 0; c < I; c++)
                        dv += w_at(&d.w, e, r, c) * a[c];
                    o[r] += p[e] / s / tot * dv;
                }
            }
            for (int r = 0; r < H; r++) {
                worst = fmax(worst, fabs(y[t * H + r] - o[r]));
                mx = fmax(mx, fabs(o[r]));
            }
        }
        /* fp32 through two chained matmuls and a product: relative to the output scale */
        CHECKF(worst <= 1e-4 * mx, "%s moe vs double: %.3g (scale %.3g)", be->ops->name, worst, mx);

        /* add_gated: y += sigmoid(g) * x, scale then add */
        float gl[3] = { -1.5f, 0.0f, 4.0f }, ya[3 * 128], yb[3 * 128];
        fill(ya, 3 * 128, -1, 1);
        memcpy(yb, ya, sizeof ya);
        CHECK_OK(be->ops->add_gated(be, ya, x, gl, 3, 128));
        for (int t = 0; t < 3; t++) {
            float sg = 1.0f / (1.0f + expf(-gl[t]));
            for (int i = 0; i < 128; i++) {
                float p = x[t * 128 + i] * sg;
                yb[t * 128 + i] = yb[t * 128 + i] + p;
            }
        }
        CHECK(memcmp(ya, yb, sizeof ya) == 0);

        CHECK(be->ops->moe(be, &g.w, &u.w, &d.w, lg, 7, true, x, 1, y) == SN_E_INVALID); /* k > E */
        CHECK(be->ops->moe(be, &g.w, &d.w, &d.w, lg, 2, true, x, 1, y) == SN_E_SHAPE);
        CHECK(strstr(sn_errmsg(), "do not chain") != NULL);
        tw_free(&g);
        tw_free(&u);
        tw_free(&d);
        sn_backend_free(be);
    }
}

/* ---------- memory ops, constructors ---------- */

static void test_memory_and_ctor(void)
{
    sn_backend *be = NULL;
    CHECK_OK(sn_backend_cpu_new(0, &be));
    if (!be)
        return;
    CHECK(be->n_threads == sn_cpu_features_get()->n_cores);
    void *a = NULL, *b = NULL;
    CHECK_OK(be->ops->buf_alloc(be, 1000, &a));
    CHECK_OK(be->ops->buf_alloc(be, 0, &b));
    CHECK(a && ((uintptr_t)a & 63) == 0);
    char host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (char)i;
    CHECK_OK(be->ops->from_host(be, a, host, 1000));
    CHECK_OK(be->ops->to_host(be, back, a, 1000));
    CHECK(memcmp(host, back, 1000) == 0);
    CHECK_OK(be->ops->memset0(be, a, 500));
    CHECK_OK(be->ops->copy(be, back, a, 1000));
    CHECK(back[0] == 0 && back[499] == 0 && back[500] == (char)500);
    CHECK_OK(be->ops->sync(be));
    be->ops->buf_free(be, b);
    CHECK(be->ops->buf_alloc(be, SIZE_MAX - 10, &b) == SN_E_NOMEM);
    be->ops->buf_free(be, a);
    sn_backend_free(be);
    sn_backend_free(NULL);
    be = NULL;
    if (!sn_cpu_isa_supported(SN_ISA_AVX512))
        CHECK(sn_backend_cpu_new_isa(1, SN_ISA_AVX512, &be) == SN_E_UNSUPPORTED && be == NULL);
    CHECK(sn_backend_cpu_new_isa(1, SN_ISA_COUNT, &be) == SN_E_UNSUPPORTED && be == NULL);
#ifndef SN_HAVE_CUDA
    CHECK(sn_backend_cuda_new(0, &be) == SN_E_UNSUPPORTED && be == NULL);
    CHECK(strstr(sn_errmsg(), "without CUDA") != NULL);
#endif
}

int main(void)
{
    RUN(test_cpu_features);
    RUN(test_threadpool);
    RUN(test_matmul_quant);
    RUN(test_matmul_dense);
    RUN(test_matmul_experts_bias_errors);
    RUN(test_matmul_batch_invariance);
    RUN(test_matmul_q4_end_of_mapping);
    RUN(test_matmul_generic_group);
    RUN(test_matmul_wide_tiles);
    RUN(test_embed);
    RUN(test_norms_elementwise);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_gdn);
    RUN(test_argmax);
    RUN(test_moe);
    RUN(test_memory_and_ctor);
    return TEST_END();
}
