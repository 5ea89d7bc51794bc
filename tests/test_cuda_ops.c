/* Every CUDA backend op against the scalar CPU backend (the oracle), on
 * random inputs of odd and real sizes. Outputs are poisoned (NaN) before
 * each run so an unwritten element fails.
 *
 * Error measure: rel = ||gpu - cpu||_2 / ||cpu||_2 over the whole output.
 * Bounds (stated here, checked below):
 *  - fp32 paths (GEMV T<8, norms, elementwise, RoPE, attention, GDN, MoE,
 *    embed): rel <= 2e-5 (summation order only; GDN state and conv state
 *    too). RoPE at positions ~1e5: 2e-5 as well (both sides use accurate
 *    fp32 sin/cos of the same fp32 angle).
 *  - GEMM T>=8, default split-fp16x3 form (fp32-class): rel <= 2e-4 (the
 *    tensor cores' fp32 accumulation is not round-to-nearest: a 17408-long
 *    dot product measured 7.7e-5 on the H200; cuBLAS ~1e-5);
 *    the single-pass fp16 form (gemm_fast): rel <= 2e-3.
 *  - argmax: exact (first index on ties).
 *  - graph replay of a step: bitwise equal to the same ops run eagerly
 *    (also with the q/k norm + RoPE + KV write fused: fuse_attn_prep, and
 *    a GDN layer's gated RMSNorm folded into the integer GEMV after it and
 *    the attention's output gate into its combine: fuse_gate).
 *  - the one- and two-kernel GDN decode steps (tune gdn_step=1 / 2, T <= 8): outputs,
 *    state, conv state and history bitwise equal to the three kernels;
 *    the prefill conv one warp per (head, 8 tokens) (tune gdn_conv=1, T > 8)
 *    bitwise equal to the block-per-token kernel (gdn_conv=0).
 *  - a GDN layer's projections and step in a graph, its conv folded into
 *    the qkv projection's epilogue (fuse_conv=1, default) or not: bitwise
 *    equal to eager over three steps, and one graph node fewer folded.
 *  - every SANCTUM_CUDA_* knob refuses a malformed value by name when the
 *    backend is created.
 * On a machine without a GPU (or a build without CUDA) the test says SKIP
 * and reports 0 passed, 0 failed. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sanctum/backend.h"
#include "sanctum/cpu.h"
#include "sanctum/tensor.h"

#ifdef SN_HAVE_CUDA
#include "backend/cuda/sn_cuda.h"
#include "cuda_test_util.h"

static sn_backend *C;

static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- matmul ---- */

static int g_fast; /* the GEMM mode under test */
static int g_xoff; /* floats by which mm_case moves x and y off 16-byte alignment */

static void mm_case(sn_dtype dt, int64_t rows, int64_t cols, int group, sn_dtype sdt, int T, int64_t E, int bias)
{
    tw t;
    tw_make(&t, dt, rows, cols, group, sdt, E, bias);
    int e = E > 0 ? (int)(E - 1) : 0;
    float *x = hrand((size_t)T * cols, 1.0f);
    /* a few large activations: the GEMM's per-row scaling must keep them */
    if (T >= 8) x[3] = 3000.0f;
    float *ref = malloc(sizeof(float) * T * rows);
    CHECK_OK(C->ops->matmul(C, &t.w, e, x, T, ref));
    /* g_xoff floats in: x and y off 16-byte alignment (the kernels' scalar loads) */
    float *xo = calloc((size_t)T * cols + g_xoff, sizeof(float));
    memcpy(xo + g_xoff, x, sizeof(float) * T * cols);
    float *dx = dcopy(xo, (size_t)T * cols + g_xoff), *dy = dpoison((size_t)T * rows + g_xoff);
    free(xo);
    CHECK_OK(G->ops->matmul(G, &t.wg, e, dx + g_xoff, T, dy + g_xoff));
    float *y = tohost(dy + g_xoff, (size_t)T * rows);
    double err = rel_err(y, ref, (size_t)T * rows);
    double tol = T < 8 ? 2e-5 : g_fast ? 2e-3 : 2e-4;
    CHECKF(err <= tol, "%s rows=%lld cols=%lld g=%d sdt=%s T=%d E=%lld bias=%d xoff=%d: rel %.3g > %.3g",
           sn_dtype_name(dt), (long long)rows, (long long)cols, group, sn_dtype_name(sdt), T, (long long)E, bias, g_xoff,
           err, tol);
    free(x); free(ref); free(y);
    dfree(dx); dfree(dy);
    tw_free(&t);
}

static void test_matmul_q4(void)
{
    int Ts[] = { 1, 2, 3, 4, 5, 7, 8, 19, 130 };
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        mm_case(SN_DT_Q4, 37, 64, 64, SN_DT_BF16, Ts[i], 0, 0);
        mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, Ts[i], 0, 1);
        mm_case(SN_DT_Q4, 130, 96, 32, SN_DT_F16, Ts[i], 0, 0);
        mm_case(SN_DT_Q4, 33, 384, 128, SN_DT_F32, Ts[i], 3, 0);
    }
    mm_case(SN_DT_Q4, 1000, 5120, 64, SN_DT_BF16, 1, 0, 0);
    mm_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 3, 0, 0);
    mm_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 200, 0, 0);
    /* the long-T path both ways: cuBLAS (when it loaded) and our own GEMM */
    char name[128];
    sn_cuda_info(G, name, sizeof name, NULL, NULL, NULL);
    fprintf(stderr, "  gemm for T>=64: %s\n", strstr(name, "cuBLAS") ? "cuBLAS (own GEMM also tested)" : "own");
    CHECK_OK(sn_cuda_tune(G, "cublas_min_t", 0));
    mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 130, 0, 1);
    mm_case(SN_DT_Q8, 300, 2048, 64, SN_DT_BF16, 100, 2, 0);
    if (strstr(name, "cuBLAS")) CHECK_OK(sn_cuda_tune(G, "cublas_min_t", 64));
    mm_case(SN_DT_Q8, 300, 2048, 64, SN_DT_BF16, 100, 2, 0);
    /* the single-pass fp16 GEMM, both implementations */
    CHECK_OK(sn_cuda_tune(G, "gemm_fast", 1));
    g_fast = 1;
    mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 130, 0, 1);
    mm_case(SN_DT_Q4, 130, 96, 32, SN_DT_F16, 19, 0, 0);
    CHECK_OK(sn_cuda_tune(G, "cublas_min_t", 0));
    mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 130, 0, 1);
    if (strstr(name, "cuBLAS")) CHECK_OK(sn_cuda_tune(G, "cublas_min_t", 64));
    CHECK_OK(sn_cuda_tune(G, "gemm_fast", 0));
    g_fast = 0;
}

/* The integer tensor-core GEMV (repacked Q4: groups 32/64/128, bf16/f16
 * scales, cols % 64 == 0) against the oracle, incl. large activations, in
 * both forms (stream-K, the default, and the ring form with 1 and 2 row
 * tiles per block), and the fp32 GEMV on the same shapes. The shapes give
 * the stream-K split row tiles cut between warps, mid-group cuts (group
 * 128) and warps with no units (17 x 64 is one unit). */
static void test_matmul_q4_gemv_i8(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", 0)); /* the integer GEMV for every size */
    for (int form = 0; form < 3; form++) {
        CHECK_OK(sn_cuda_tune(G, "gemv_sk", form == 0));
        CHECK_OK(sn_cuda_tune(G, "gemv_mb", form == 2 ? 2 : 1));
        int Ts[] = { 1, 2, 3, 5, 6, 8 };
        for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
            mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, Ts[i], 0, 1);
            mm_case(SN_DT_Q4, 48, 5120, 32, SN_DT_F16, Ts[i], 0, 0);
            mm_case(SN_DT_Q4, 300, 2048, 128, SN_DT_BF16, Ts[i], 0, 0);
            mm_case(SN_DT_Q4, 17, 64, 64, SN_DT_BF16, Ts[i], 0, 1);
            /* fewer units (16 x 64 columns) than the split's 8 warps, in one row tile */
            mm_case(SN_DT_Q4, 16, 256, 64, SN_DT_BF16, Ts[i], 0, 0);
            mm_case(SN_DT_Q4, 3, 320, 64, SN_DT_BF16, Ts[i], 0, 1);
            mm_case(SN_DT_Q4, 40, 128, 64, SN_DT_BF16, Ts[i], 0, 0);
        }
        mm_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 1, 0, 0);
        mm_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 7, 0, 0);
        mm_case(SN_DT_Q4, 6000, 384, 128, SN_DT_BF16, 1, 0, 1);
        mm_case(SN_DT_Q4, 4100, 2048, 64, SN_DT_BF16, 2, 0, 0);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_sk", 1));
    CHECK_OK(sn_cuda_tune(G, "gemv_mb", 0));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 0));
    mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1, 0, 1);
    mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 6, 0, 1);
    /* the SIMT GEMV with fp32 FMAs (gemv_dp=0) as well as its dp4a form */
    CHECK_OK(sn_cuda_tune(G, "gemv_dp", 0));
    mm_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1, 0, 1);
    mm_case(SN_DT_Q4, 48, 5120, 32, SN_DT_F16, 3, 0, 0);
    mm_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 8, 0, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_dp", 1));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 1));
}

static void q8_cases(void)
{
    int Ts[] = { 1, 2, 5, 8, 33 };
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        mm_case(SN_DT_Q8, 41, 64, 64, SN_DT_BF16, Ts[i], 0, 1);
        mm_case(SN_DT_Q8, 300, 2048, 64, SN_DT_BF16, Ts[i], 0, 0);
        mm_case(SN_DT_Q8, 17, 96, 32, SN_DT_F16, Ts[i], 4, 0);
        mm_case(SN_DT_Q8, 65, 256, 128, SN_DT_F32, Ts[i], 0, 0);
        /* the MoE router's widths: 257 x 2048, fewer rows than a block's warps, f32 pairs */
        mm_case(SN_DT_Q8, 257, 2048, 64, SN_DT_BF16, Ts[i], 3, 1);
        mm_case(SN_DT_Q8, 5, 1024, 32, SN_DT_F16, Ts[i], 0, 0);
        mm_case(SN_DT_Q8, 300, 1536, 128, SN_DT_F32, Ts[i], 0, 1);
        if (Ts[i] <= 8) mm_case(SN_DT_Q8, 9000, 2048, 64, SN_DT_BF16, Ts[i], 0, 0);
        /* just under and at gemv_q8s_rows=1024; 8192 columns: a thread two chunks */
        mm_case(SN_DT_Q8, 1023, 512, 64, SN_DT_BF16, Ts[i], 0, 1);
        mm_case(SN_DT_Q8, 1024, 512, 64, SN_DT_BF16, Ts[i], 0, 0);
        mm_case(SN_DT_Q8, 20, 8192, 64, SN_DT_BF16, Ts[i], 0, 0);
    }
}

static void test_matmul_q8(void)
{
    /* every launch through k_gemv (gemv_q8s_rows=0), then the matrices under
     * 1024 rows through k_gemv_q8s (the default); each also with x and y one
     * float off alignment */
    for (int q8s = 0; q8s < 2; q8s++) {
        CHECK_OK(sn_cuda_tune(G, "gemv_q8s_rows", q8s ? 1024 : 0));
        q8_cases();
        g_xoff = 1;
        mm_case(SN_DT_Q8, 257, 2048, 64, SN_DT_BF16, 1, 0, 1);
        mm_case(SN_DT_Q8, 257, 2048, 64, SN_DT_BF16, 5, 0, 0);
        mm_case(SN_DT_Q8, 20, 8192, 64, SN_DT_F32, 3, 0, 1);
        g_xoff = 0;
    }
    CHECK(sn_cuda_tune(G, "gemv_q8s_rows", -1) == SN_E_INVALID);
}

/* The decode GEMV handles up to 8 tokens in one pass over the weights: a
 * token's row must be bitwise what it is alone (prompt-lookup verification
 * and prompt-cache resumes rely on it), passes split by shared memory
 * included (17408 columns). */
static void gemv_invariance_case(sn_dtype dt, int64_t rows, int64_t cols, int group, sn_dtype sdt, int bias)
{
    tw w;
    tw_make(&w, dt, rows, cols, group, sdt, 0, bias);
    enum { TMAX = 8 };
    float *x = hrand((size_t)TMAX * cols, 1.0f);
    float *dx = dcopy(x, (size_t)TMAX * cols), *dy1 = dpoison((size_t)TMAX * rows), *dyT = dpoison((size_t)TMAX * rows);
    for (int t = 0; t < TMAX; t++)
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx + (size_t)t * cols, 1, dy1 + (size_t)t * rows));
    float *one = tohost(dy1, (size_t)TMAX * rows);
    for (int T = 2; T <= TMAX; T++) {
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, T, dyT));
        float *many = tohost(dyT, (size_t)T * rows);
        CHECKF(memcmp(one, many, sizeof(float) * T * rows) == 0, "%s %lldx%lld T=%d: rows differ from T=1",
               sn_dtype_name(dt), (long long)rows, (long long)cols, T);
        free(many);
    }
    free(x); free(one);
    dfree(dx); dfree(dy1); dfree(dyT);
    tw_free(&w);
}

static void test_gemv_batch_invariant(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", 0));
    CHECK_OK(sn_cuda_tune(G, "gemv_q8s_rows", 0)); /* the 8-bit matrices through k_gemv first */
    gemv_invariance_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q4, 130, 96, 32, SN_DT_F16, 0);
    gemv_invariance_case(SN_DT_Q8, 300, 2048, 64, SN_DT_BF16, 0);
    gemv_invariance_case(SN_DT_Q8, 257, 2048, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q8, 5, 1024, 32, SN_DT_F16, 0);
    gemv_invariance_case(SN_DT_Q8, 9000, 1536, 128, SN_DT_F32, 1);
    /* the small 8-bit matrices through k_gemv_q8s (the default) */
    CHECK_OK(sn_cuda_tune(G, "gemv_q8s_rows", 1024));
    gemv_invariance_case(SN_DT_Q8, 257, 2048, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q8, 5, 1024, 32, SN_DT_F16, 0);
    gemv_invariance_case(SN_DT_Q8, 20, 8192, 64, SN_DT_BF16, 0);
    gemv_invariance_case(SN_DT_Q4, 1000, 5120, 64, SN_DT_BF16, 0);
    gemv_invariance_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 0);
    gemv_invariance_case(SN_DT_Q4, 48, 5120, 32, SN_DT_F16, 1);
    gemv_invariance_case(SN_DT_Q4, 300, 2048, 128, SN_DT_BF16, 0);
    gemv_invariance_case(SN_DT_Q4, 6000, 384, 128, SN_DT_BF16, 1);
    /* the ring form of the integer GEMV */
    CHECK_OK(sn_cuda_tune(G, "gemv_sk", 0));
    gemv_invariance_case(SN_DT_Q4, 300, 2048, 128, SN_DT_BF16, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_mb", 2));
    gemv_invariance_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_mb", 0));
    /* row tiles per block (chosen by shape) leave a row's bits alone */
    {
        tw w;
        tw_make(&w, SN_DT_Q4, 300, 5120, 64, SN_DT_BF16, 0, 1);
        float *x = hrand((size_t)3 * 5120, 1.0f), *dx = dcopy(x, (size_t)3 * 5120);
        float *d1 = dpoison((size_t)3 * 300), *d2 = dpoison((size_t)3 * 300);
        CHECK_OK(sn_cuda_tune(G, "gemv_mb", 1));
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 3, d1));
        CHECK_OK(sn_cuda_tune(G, "gemv_mb", 2));
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 3, d2));
        CHECK_OK(sn_cuda_tune(G, "gemv_mb", 0));
        CHECK_OK(sn_cuda_tune(G, "gemv_sk", 1));
        float *a = tohost(d1, (size_t)3 * 300), *b = tohost(d2, (size_t)3 * 300);
        CHECK(memcmp(a, b, sizeof(float) * 3 * 300) == 0);
        free(x); free(a); free(b);
        dfree(dx); dfree(d1); dfree(d2);
        tw_free(&w);
    }
    /* the fp32 GEMV (for weights the integer kernel does not take) */
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 0));
    gemv_invariance_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q4, 517, 17408, 64, SN_DT_BF16, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw", 4));
    gemv_invariance_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1);
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw", 1));
    gemv_invariance_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q8, 300, 2048, 64, SN_DT_BF16, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw", 0));
    /* the fp32 FMA form of it, and one row a warp below 4096 rows at T <= 2 */
    CHECK_OK(sn_cuda_tune(G, "gemv_dp", 0));
    gemv_invariance_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1);
    gemv_invariance_case(SN_DT_Q4, 48, 5120, 32, SN_DT_F16, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_dp", 1));
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw1_rows", 4096));
    gemv_invariance_case(SN_DT_Q4, 1000, 5120, 64, SN_DT_BF16, 0);
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw1_rows", 0));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 1));
}

/* The SIMT GEMV with none, some or all of its first ring chunks issued
 * before x is read (gemv_pre; the rest go out once x's loads have): only
 * the order of the copies changes, so every form gives the same bits. */
static void ring_forms_case(sn_dtype dt, int64_t rows, int64_t cols, int group, sn_dtype sdt, int bias, int T)
{
    tw w;
    tw_make(&w, dt, rows, cols, group, sdt, 0, bias);
    float *x = hrand((size_t)T * cols, 1.0f), *dx = dcopy(x, (size_t)T * cols);
    static const int pre[4] = { 1, 8, 0, 2 }; /* the default first */
    float *ref = NULL;
    for (int f = 0; f < 4; f++) {
        CHECK_OK(sn_cuda_tune(G, "gemv_pre", pre[f]));
        float *dy = dpoison((size_t)T * rows);
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, T, dy));
        float *y = tohost(dy, (size_t)T * rows);
        dfree(dy);
        if (!ref) {
            ref = y;
            continue;
        }
        CHECKF(memcmp(ref, y, sizeof(float) * T * rows) == 0, "%s %lldx%lld g=%d T=%d: gemv_pre=%d differs",
               sn_dtype_name(dt), (long long)rows, (long long)cols, group, T, pre[f]);
        free(y);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_pre", 1));
    free(x); free(ref);
    dfree(dx);
    tw_free(&w);
}

static void test_gemv_ring_forms(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 0)); /* the SIMT GEMV for every matrix */
    int Ts[] = { 1, 3, 8 };
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        ring_forms_case(SN_DT_Q4, 1000, 5120, 64, SN_DT_BF16, 0, Ts[i]);
        ring_forms_case(SN_DT_Q4, 300, 2048, 128, SN_DT_BF16, 0, Ts[i]);
        ring_forms_case(SN_DT_Q4, 1000, 2304, 64, SN_DT_BF16, 1, Ts[i]);
        ring_forms_case(SN_DT_Q4, 48, 5120, 32, SN_DT_F16, 1, Ts[i]);
        ring_forms_case(SN_DT_Q8, 300, 2048, 64, SN_DT_BF16, 0, Ts[i]);
        ring_forms_case(SN_DT_Q4, 259, 1088, 64, SN_DT_BF16, 1, Ts[i]);
        /* more row groups than resident warps (some warps take one more) */
        ring_forms_case(SN_DT_Q4, 10000, 1024, 64, SN_DT_BF16, 0, Ts[i]);
        ring_forms_case(SN_DT_Q4, 33, 384, 128, SN_DT_F32, 0, Ts[i]);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_dp", 0)); /* and the fp32 FMA form */
    ring_forms_case(SN_DT_Q4, 1000, 5120, 64, SN_DT_BF16, 0, 1);
    ring_forms_case(SN_DT_Q4, 1000, 2304, 64, SN_DT_BF16, 1, 3);
    CHECK_OK(sn_cuda_tune(G, "gemv_dp", 1));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 1));
    mm_case(SN_DT_Q4, 1000, 2304, 64, SN_DT_BF16, 1, 0, 1);
    mm_case(SN_DT_Q4, 1000, 2304, 64, SN_DT_BF16, 5, 0, 1);
}

/* The pool form of the one-token SIMT GEMV (tune gemv_dyn; gv_pool_form):
 * each row group is still one warp's, so every form gives the dealt form's
 * bits, launch after launch (a counter left non-zero would skip groups,
 * whose rows keep dpoison's NaN), the launches count as pooled, and the
 * device counters are zero after them. The shapes: the 27B's gate/up
 * (5 ring chunks a group, 4 groups or more a warp) and a 1024-column
 * matrix whose groups are one chunk each (the issue side then runs up to
 * S - 1 groups ahead of the compute side: the queue between them). Each
 * also with gemv_dyn_lean (no take a plain load shows spent, a done count
 * a block). */
static void pool_case(int64_t rows, int64_t cols)
{
    tw w;
    tw_make(&w, SN_DT_Q4, rows, cols, 64, SN_DT_BF16, 0, 0);
    float *x = hrand((size_t)cols, 1.0f), *dx = dcopy(x, (size_t)cols);
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn", 0));
    float *dy = dpoison((size_t)rows);
    long n0[2] = { 0, 0 }, n1[2] = { 0, 0 };
    int cnt[4];
    CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
    CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
    CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
    CHECKF(n1[0] == n0[0], "%lldx%lld: gemv_dyn=0 launched the pool form", (long long)rows, (long long)cols);
    float *ref = tohost(dy, (size_t)rows);
    dfree(dy);
    static const int dyn[3] = { 50, 25, 90 };
    for (int f = 0; f < 6; f++) {
        const int d = f % 3, lean = f / 3; /* and with gemv_dyn_lean */
        CHECK_OK(sn_cuda_tune(G, "gemv_dyn", dyn[d]));
        CHECK_OK(sn_cuda_tune(G, "gemv_dyn_lean", lean));
        CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
        for (int rep = 0; rep < 3; rep++) {
            dy = dpoison((size_t)rows);
            CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
            float *y = tohost(dy, (size_t)rows);
            dfree(dy);
            CHECKF(memcmp(ref, y, sizeof(float) * rows) == 0, "%lldx%lld gemv_dyn=%d lean=%d launch %d: bits differ",
                   (long long)rows, (long long)cols, dyn[d], lean, rep);
            free(y);
        }
        CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
        CHECKF(n1[0] == n0[0] + 3, "%lldx%lld gemv_dyn=%d: %ld of 3 launches pooled", (long long)rows,
               (long long)cols, dyn[d], n1[0] - n0[0]);
        CHECKF(cnt[0] == 0 && cnt[1] == 0, "gemv_dyn=%d lean=%d: pool counters %d %d after the launches", dyn[d],
               lean, cnt[0], cnt[1]);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn_lean", 0));
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn", 50)); /* the default */
    free(x); free(ref);
    dfree(dx);
    tw_free(&w);
}

static void test_gemv_pool(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 0)); /* the SIMT GEMV */
    pool_case(34816, 5120);
    pool_case(180000, 1024); /* gemv_dyn=25 deals 5 groups a warp here: more than S - 1 chunks */
    /* under gemv_dyn_min groups a warp: the dealt form */
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn", 50));
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn_min", 1000));
    long n0[2] = { 0, 0 }, n1[2] = { 0, 0 };
    int cnt[4];
    tw w;
    tw_make(&w, SN_DT_Q4, 34816, 5120, 64, SN_DT_BF16, 0, 0);
    float *x = hrand(5120, 1.0f), *dx = dcopy(x, 5120), *dy = dpoison(34816);
    CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
    CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
    CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
    CHECKF(n1[0] == n0[0], "gemv_dyn_min=1000: %ld launches pooled", n1[0] - n0[0]);
    CHECK(sn_cuda_tune(G, "gemv_dyn", 100) == SN_E_INVALID);
    CHECK(sn_cuda_tune(G, "gemv_dyn_min", 0) == SN_E_INVALID);
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn_min", 2));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 1));
    free(x);
    dfree(dx); dfree(dy);
    tw_free(&w);
}

/* The stream-K GEMV's pool form (gemv_sk_vw > 1, gemv_sk_dv=1): the bits
 * of the same split walked in a fixed order (gemv_sk_dv=0), launch after
 * launch, the launches counted as pooled and the counters zero after them;
 * against the oracle too. The shapes: the 27B's down and out projections
 * and its lm_head's column count on fewer rows (17408 and 6144 columns: a
 * row tile of 272 and 96 units cut between virtual warps), groups of 32
 * and 128 (f16 scales), and a matrix whose virtual warps are a stage or two
 * (a take falls due in the prologue). Each has more virtual warps than
 * resident ones (units * vw / 16 > 2112 on 132 SMs) from vw_from on. */
static void sk_pool_case(int64_t rows, int64_t cols, int group, sn_dtype sdt, int vw_from)
{
    tw w;
    tw_make(&w, SN_DT_Q4, rows, cols, group, sdt, 0, 0);
    float *x = hrand((size_t)cols, 1.0f), *dx = dcopy(x, (size_t)cols);
    float *ref = malloc(sizeof(float) * rows);
    CHECK_OK(C->ops->matmul(C, &w.w, 0, x, 1, ref));
    long n0[2], n1[2];
    int cnt[4];
    for (int vw = vw_from; vw <= 4; vw++) {
        CHECK_OK(sn_cuda_tune(G, "gemv_sk_vw", vw));
        CHECK_OK(sn_cuda_tune(G, "gemv_sk_dv", 0));
        float *dy = dpoison((size_t)rows);
        CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
        CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
        CHECKF(n1[1] == n0[1], "%lldx%lld vw=%d: the fixed walk launched the pool form", (long long)rows,
               (long long)cols, vw);
        float *fixed = tohost(dy, (size_t)rows);
        dfree(dy);
        double err = rel_err(fixed, ref, (size_t)rows);
        CHECKF(err <= 2e-5, "%lldx%lld g=%d vw=%d: rel %.3g against the oracle", (long long)rows, (long long)cols,
               group, vw, err);
        CHECK_OK(sn_cuda_tune(G, "gemv_sk_dv", 1));
        CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
        for (int rep = 0; rep < 3; rep++) {
            dy = dpoison((size_t)rows);
            CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
            float *y = tohost(dy, (size_t)rows);
            dfree(dy);
            CHECKF(memcmp(fixed, y, sizeof(float) * rows) == 0, "%lldx%lld g=%d vw=%d launch %d: pool bits differ",
                   (long long)rows, (long long)cols, group, vw, rep);
            free(y);
        }
        CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
        CHECKF(n1[1] == n0[1] + 3, "%lldx%lld vw=%d: %ld of 3 launches pooled", (long long)rows, (long long)cols, vw,
               n1[1] - n0[1]);
        CHECKF(cnt[2] == 0 && cnt[3] == 0, "vw=%d: stream-K pool counters %d %d after the launches", vw, cnt[2],
               cnt[3]);
        free(fixed);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_sk_vw", 1));
    free(x); free(ref);
    dfree(dx);
    tw_free(&w);
}

static void test_gemv_sk_pool(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", 0)); /* the integer GEMV for every size */
    sk_pool_case(5120, 17408, 64, SN_DT_BF16, 2);
    sk_pool_case(5120, 6144, 64, SN_DT_BF16, 2);
    sk_pool_case(20000, 5120, 64, SN_DT_BF16, 2);
    sk_pool_case(12000, 4096, 32, SN_DT_BF16, 2);
    sk_pool_case(12000, 4096, 128, SN_DT_F16, 2);
    sk_pool_case(9000, 1024, 64, SN_DT_BF16, 4); /* virtual warps of 4 units, one stage: takes due before pdl_wait */
    /* virtual warps of 16 units or more at every vw (gemv_sk_minu): the
     * down shape still has more of them than resident warps */
    CHECK_OK(sn_cuda_tune(G, "gemv_sk_minu", 16));
    sk_pool_case(5120, 17408, 64, SN_DT_BF16, 2);
    CHECK(sn_cuda_tune(G, "gemv_sk_minu", -1) == SN_E_INVALID);
    CHECK_OK(sn_cuda_tune(G, "gemv_sk_minu", 0));
    /* a small matrix (fewer virtual warps than resident ones at any vw)
     * stays on the fixed form */
    CHECK_OK(sn_cuda_tune(G, "gemv_sk_vw", 4));
    tw w;
    tw_make(&w, SN_DT_Q4, 64, 1024, 64, SN_DT_BF16, 0, 0);
    float *x = hrand(1024, 1.0f), *dx = dcopy(x, 1024), *dy = dpoison(64);
    long n0[2], n1[2];
    int cnt[4];
    CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
    CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
    CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
    CHECKF(n1[1] == n0[1], "64x1024 at vw=4: %ld launches pooled", n1[1] - n0[1]);
    CHECK(sn_cuda_tune(G, "gemv_sk_vw", 5) == SN_E_INVALID);
    CHECK_OK(sn_cuda_tune(G, "gemv_sk_vw", 1));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", 0)); /* as the tests around this one run */
    free(x);
    dfree(dx); dfree(dy);
    tw_free(&w);
}

/* The stamped one-token k_gemv (sn_cuda_gemv_stamps, a measurement hook):
 * the plain kernel's bits, one record per block of the launch with its
 * times in order; off again, a launch records nothing. */
static void test_gemv_stamps(void)
{
    enum { R = 9000, C = 1024, CAP = 4096 };
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 0)); /* the SIMT GEMV */
    tw w;
    tw_make(&w, SN_DT_Q4, R, C, 64, SN_DT_BF16, 0, 0);
    float *x = hrand(C, 1.0f), *dx = dcopy(x, C), *dy = dpoison(R);
    CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
    float *ref = tohost(dy, R);
    CHECK(sn_cuda_gemv_stamps(G, -1) == SN_E_INVALID);
    CHECK_OK(sn_cuda_gemv_stamps(G, CAP));
    CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
    float *y = tohost(dy, R);
    sn_gemv_stamp *r = malloc(sizeof *r * CAP);
    int n = 0;
    CHECK_OK(sn_cuda_gemv_stamps_read(G, r, CAP, &n));
    CHECK_OK(sn_cuda_gemv_stamps(G, 0));
    CHECKF(memcmp(ref, y, sizeof(float) * R) == 0, "the stamped k_gemv's bits differ");
    CHECKF(n >= 1 && n <= CAP && n == r[0].grid, "%d records for a grid of %d", n, n > 0 ? r[0].grid : 0);
    char seen[CAP] = { 0 };
    for (int i = 0; i < n && i < CAP; i++) {
        CHECKF(r[i].rows == R && r[i].grid == r[0].grid && r[i].block >= 0 && r[i].block < r[i].grid &&
                   !seen[r[i].block],
               "record %d: rows %lld, block %d of %d", i, (long long)r[i].rows, r[i].block, r[i].grid);
        if (r[i].block >= 0 && r[i].block < CAP)
            seen[r[i].block] = 1;
        CHECKF(r[i].t[0] > 0 && r[i].t[0] <= r[i].t[1] && r[i].t[1] <= r[i].t[2] && r[i].t[2] <= r[i].t[3] &&
                   r[i].t[3] <= r[i].t[4],
               "record %d: times out of order", i);
    }
    CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
    CHECK_OK(sn_cuda_gemv_stamps_read(G, r, CAP, &n));
    CHECKF(n == 0, "%d records with the stamps off", n);
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 1));
    free(r); free(y); free(ref); free(x);
    dfree(dx); dfree(dy);
    tw_free(&w);
}

static void test_matmul_dense(void)
{
    int Ts[] = { 1, 3, 8, 21 };
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        mm_case(SN_DT_F32, 45, 33, 0, SN_DT_F32, Ts[i], 0, 1);
        mm_case(SN_DT_BF16, 130, 256, 0, SN_DT_F32, Ts[i], 0, 0);
        mm_case(SN_DT_F16, 64, 100, 0, SN_DT_F32, Ts[i], 2, 0);
    }
}

static void test_matmul_errors(void)
{
    tw t;
    tw_make(&t, SN_DT_Q4, 8, 64, 64, SN_DT_BF16, 0, 0);
    float *dx = dpoison(64), *dy = dpoison(8);
    sn_weight notup = t.w;
    CHECK(G->ops->matmul(G, &notup, 0, dx, 1, dy) == SN_E_INVALID);
    CHECK(G->ops->matmul(G, &t.wg, 1, dx, 1, dy) == SN_E_RANGE);
    sn_weight bad = t.w;
    bad.group = 48;
    CHECK(G->ops->upload_weight(G, &bad) == SN_E_UNSUPPORTED);
    dfree(dx); dfree(dy);
    tw_free(&t);
}

/* ---- embed ---- */

static void test_embed(void)
{
    sn_dtype dts[] = { SN_DT_Q4, SN_DT_Q8, SN_DT_BF16, SN_DT_F32 };
    for (int k = 0; k < 4; k++) {
        tw t;
        int64_t rows = 301, cols = dts[k] == SN_DT_F32 ? 70 : 192;
        tw_make(&t, dts[k], rows, cols, 64, SN_DT_BF16, 0, 0);
        int32_t ids[9] = { 0, 300, 5, 5, 17, 299, 1, 150, 42 };
        float *ref = malloc(sizeof(float) * 9 * cols);
        CHECK_OK(C->ops->embed(C, &t.w, ids, 9, ref));
        float *dy = dpoison(9 * cols);
        CHECK_OK(G->ops->embed(G, &t.wg, ids, 9, dy));
        float *y = tohost(dy, 9 * cols);
        CHECKF(rel_err(y, ref, 9 * cols) <= 1e-6, "embed %s", sn_dtype_name(dts[k]));
        int32_t bad = 301;
        CHECK(G->ops->embed(G, &t.wg, &bad, 1, dy) == SN_E_RANGE);
        free(ref); free(y); dfree(dy);
        tw_free(&t);
    }
}

/* ---- norms and elementwise ---- */

static void test_norms(void)
{
    int shapes[][2] = { { 1, 5120 }, { 7, 256 }, { 33, 100 }, { 3, 3 }, { 2, 17408 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], n = shapes[s][1];
        size_t N = (size_t)rows * n;
        float *x = hrand(N, 3.0f), *z = hrand(N, 4.0f), *w = hrand((size_t)n, 1.5f);
        float *ref = malloc(sizeof(float) * N), *ref2 = malloc(sizeof(float) * N);
        CHECK_OK(C->ops->rmsnorm(C, x, w, rows, n, 1e-6f, ref));
        CHECK_OK(C->ops->gated_rmsnorm(C, x, z, w, rows, n, 1e-6f, ref2));
        float *dx = dcopy(x, N), *dz = dcopy(z, N), *dw = dcopy(w, n), *dy = dpoison(N), *dy2 = dpoison(N);
        CHECK_OK(G->ops->rmsnorm(G, dx, dw, rows, n, 1e-6f, dy));
        CHECK_OK(G->ops->gated_rmsnorm(G, dx, dz, dw, rows, n, 1e-6f, dy2));
        float *y = tohost(dy, N), *y2 = tohost(dy2, N);
        CHECKF(rel_err(y, ref, N) <= 2e-5, "rmsnorm %dx%d: %.3g", rows, n, rel_err(y, ref, N));
        CHECKF(rel_err(y2, ref2, N) <= 2e-5, "gated_rmsnorm %dx%d: %.3g", rows, n, rel_err(y2, ref2, N));
        /* in place (y == x) is how the model uses it */
        CHECK_OK(G->ops->rmsnorm(G, dx, dw, rows, n, 1e-6f, dx));
        float *yi = tohost(dx, N);
        CHECK(rel_err(yi, ref, N) <= 2e-5);
        free(x); free(z); free(w); free(ref); free(ref2); free(y); free(y2); free(yi);
        dfree(dx); dfree(dz); dfree(dw); dfree(dy); dfree(dy2);
    }
}

static void test_elementwise(void)
{
    size_t sizes[] = { 1, 31, 1000, 1 << 20 | 7 };
    for (size_t s = 0; s < 4; s++) {
        size_t n = sizes[s];
        float *a = hrand(n, 8.0f), *b = hrand(n, 8.0f);
        float *r_add = malloc(sizeof(float) * n), *r_sw = malloc(sizeof(float) * n), *r_ms = malloc(sizeof(float) * n);
        memcpy(r_add, a, sizeof(float) * n);
        CHECK_OK(C->ops->add(C, r_add, b, n));
        CHECK_OK(C->ops->swiglu(C, a, b, n, r_sw));
        memcpy(r_ms, a, sizeof(float) * n);
        CHECK_OK(C->ops->mul_sigmoid(C, r_ms, b, n));
        float *da = dcopy(a, n), *db = dcopy(b, n), *dsw = dpoison(n), *dms = dcopy(a, n);
        CHECK_OK(G->ops->add(G, da, db, n));
        CHECK_OK(G->ops->swiglu(G, db, db, 0, dsw)); /* n = 0 is a no-op */
        float *d_a = dcopy(a, n);
        CHECK_OK(G->ops->swiglu(G, d_a, db, n, dsw));
        CHECK_OK(G->ops->mul_sigmoid(G, dms, db, n));
        float *y1 = tohost(da, n), *y2 = tohost(dsw, n), *y3 = tohost(dms, n);
        CHECKF(rel_err(y1, r_add, n) <= 1e-7, "add n=%zu", n);
        CHECKF(rel_err(y2, r_sw, n) <= 2e-5, "swiglu n=%zu", n);
        CHECKF(rel_err(y3, r_ms, n) <= 2e-5, "mul_sigmoid n=%zu", n);
        free(a); free(b); free(r_add); free(r_sw); free(r_ms); free(y1); free(y2); free(y3);
        dfree(da); dfree(db); dfree(dsw); dfree(dms); dfree(d_a);
    }
}

/* copy_n: one launch for aligned copies, one by one otherwise (an odd
 * offset or size), both exactly the bytes asked for */
static void test_copy_n(void)
{
    enum { N = 5 };
    size_t sz[N] = { 16, 4096, 65536 + 48, 12, 999 * 16 };
    float *h[N], *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        h[i] = hrand(sz[i] / 4 + 8, 1.f);
        src[i] = dcopy(h[i], sz[i] / 4 + 8);
        dst[i] = dpoison(sz[i] / 4 + 8);
    }
    void *d[N];
    const void *s[N];
    for (int i = 0; i < N; i++) { d[i] = dst[i]; s[i] = src[i]; }
    CHECK_OK(G->ops->copy_n(G, N, d, s, sz));            /* 12 bytes: not whole words */
    CHECK_OK(G->ops->copy_n(G, 2, d, s, sz));            /* aligned: one launch */
    d[0] = (char *)dst[0] + 4;                            /* odd offset: one by one */
    CHECK_OK(G->ops->copy_n(G, 1, d, s, sz));
    for (int i = 0; i < N; i++) {
        float *g = tohost(dst[i], sz[i] / 4 + 8);
        const float *want = h[i];
        size_t off = i == 0 ? 1 : 0;
        CHECKF(memcmp(g + off, want, sz[i]) == 0, "copy_n: copy %d differs", i);
        free(g); free(h[i]);
        dfree(src[i]); dfree(dst[i]);
    }
    CHECK(G->ops->copy_n(G, -1, NULL, NULL, NULL) == SN_E_INVALID);
}

static void test_add_gated(void)
{
    int T = 5, n = 2049;
    float *y = hrand((size_t)T * n, 2.f), *x = hrand((size_t)T * n, 2.f), *g = hrand((size_t)T, 6.f);
    float *ref = malloc(sizeof(float) * T * n);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            ref[(size_t)t * n + i] = y[(size_t)t * n + i] + x[(size_t)t * n + i] / (1.f + expf(-g[t]));
    float *dy = dcopy(y, (size_t)T * n), *dx = dcopy(x, (size_t)T * n), *dg = dcopy(g, T);
    CHECK(G->ops->add_gated != NULL);
    CHECK_OK(G->ops->add_gated(G, dy, dx, dg, T, n));
    float *out = tohost(dy, (size_t)T * n);
    CHECKF(rel_err(out, ref, (size_t)T * n) <= 2e-6, "add_gated: %.3g", rel_err(out, ref, (size_t)T * n));
    free(y); free(x); free(g); free(ref); free(out);
    dfree(dy); dfree(dx); dfree(dg);
}

static void test_rope(void)
{
    struct { int T, H, D, R, pos0; float ms; } cs[] = {
        { 1, 16, 256, 64, 0, 1.0f }, { 5, 3, 128, 128, 4095, 1.0f }, { 17, 2, 64, 32, 100000, 1.1f },
        { 2, 7, 80, 80, 12, 0.9f },
    };
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        size_t N = (size_t)cs[c].T * cs[c].H * cs[c].D;
        float *x = hrand(N, 2.0f), *inv = malloc(sizeof(float) * cs[c].R / 2);
        for (int i = 0; i < cs[c].R / 2; i++) inv[i] = powf(1e6f, -2.0f * i / cs[c].R);
        float *ref = malloc(sizeof(float) * N);
        memcpy(ref, x, sizeof(float) * N);
        CHECK_OK(C->ops->rope(C, ref, cs[c].T, cs[c].H, cs[c].D, cs[c].R, cs[c].pos0, inv, cs[c].ms));
        float *dx = dcopy(x, N), *dinv = dcopy(inv, cs[c].R / 2);
        CHECK_OK(G->ops->rope(G, dx, cs[c].T, cs[c].H, cs[c].D, cs[c].R, cs[c].pos0, dinv, cs[c].ms));
        float *y = tohost(dx, N);
        CHECKF(rel_err(y, ref, N) <= 2e-5, "rope case %zu: %.3g", c, rel_err(y, ref, N));
        free(x); free(inv); free(ref); free(y);
        dfree(dx); dfree(dinv);
    }
}

/* ---- attention ---- */

/* Cache [ctx, Hkv, D] holding random keys for positions < pos0, then T new
 * rows written with kv_write; attention of T queries. */
static void attn_case(int T, int pos0, int Hq, int Hkv, int D, int ctx)
{
    size_t row = (size_t)Hkv * D;
    float *kc = hrand((size_t)ctx * row, 1.0f), *vc = hrand((size_t)ctx * row, 1.0f);
    float *kn = hrand((size_t)T * row, 1.0f), *vn = hrand((size_t)T * row, 1.0f);
    float *q = hrand((size_t)T * Hq * D, 1.0f);
    float scale = 1.0f / sqrtf((float)D);
    sn_kv_view hv = { kc, vc, ctx, Hkv, D };
    CHECK_OK(C->ops->kv_write(C, &hv, kn, vn, T, pos0));
    float *ref = malloc(sizeof(float) * T * Hq * D);
    CHECK_OK(C->ops->attention(C, q, &hv, T, pos0, Hq, scale, ref));
    /* device cache starts from the same old rows (kv_write already put the new ones in kc/vc) */
    float *dk = dcopy(kc, (size_t)ctx * row), *dv = dcopy(vc, (size_t)ctx * row);
    /* overwrite the new rows with NaN on the device, then write them through kv_write */
    float *nanrows = dpoison((size_t)T * row);
    CHECK_OK(G->ops->copy(G, dk + (size_t)pos0 * row, nanrows, sizeof(float) * T * row));
    CHECK_OK(G->ops->copy(G, dv + (size_t)pos0 * row, nanrows, sizeof(float) * T * row));
    float *dkn = dcopy(kn, (size_t)T * row), *dvn = dcopy(vn, (size_t)T * row), *dq = dcopy(q, (size_t)T * Hq * D);
    sn_kv_view gv = { dk, dv, ctx, Hkv, D };
    CHECK_OK(G->ops->kv_write(G, &gv, dkn, dvn, T, pos0));
    float *dout = dpoison((size_t)T * Hq * D);
    CHECK_OK(G->ops->attention(G, dq, &gv, T, pos0, Hq, scale, dout));
    float *out = tohost(dout, (size_t)T * Hq * D);
    double err = rel_err(out, ref, (size_t)T * Hq * D);
    CHECKF(err <= 2e-5, "attention T=%d pos0=%d Hq=%d Hkv=%d D=%d: rel %.3g", T, pos0, Hq, Hkv, D, err);
    float *kback = tohost(dk, (size_t)ctx * row);
    CHECK(rel_err(kback, kc, (size_t)ctx * row) == 0.0);
    free(kc); free(vc); free(kn); free(vn); free(q); free(ref); free(out); free(kback);
    dfree(dk); dfree(dv); dfree(nanrows); dfree(dkn); dfree(dvn); dfree(dq); dfree(dout);
}

static void test_attention(void)
{
    attn_case(1, 0, 4, 4, 64, 16);
    attn_case(1, 77, 24, 4, 256, 128);
    attn_case(1, 1000, 16, 2, 256, 1024);
    attn_case(2, 500, 8, 1, 128, 600);
    attn_case(3, 40, 8, 2, 128, 64);
    attn_case(4, 5, 6, 3, 80, 12);
    attn_case(37, 0, 8, 2, 128, 64);
    attn_case(70, 50, 12, 4, 256, 128);
    attn_case(9, 3, 2, 1, 32, 16);
    attn_case(33, 0, 4, 4, 96, 40);
    /* few keys (most splits empty), and GQA groups of 6 and 4 at head dims
     * 128 and 64 */
    attn_case(1, 3, 16, 2, 256, 8);
    attn_case(5, 130, 12, 2, 128, 200);
    attn_case(3, 200, 8, 2, 64, 256);
    attn_case(2, 61, 12, 3, 128, 70);
    CHECK(G->ops->attention(G, (float *)8, &(sn_kv_view){ (float *)8, (float *)8, 4, 2, 64 }, 2, 3, 4, 1.f,
                            (float *)8) == SN_E_RANGE);
}

/* decode-after-prefill == full prefill at the op level: N tokens at once,
 * then the same N one by one through the decode kernel. */
static void test_attention_prefill_vs_decode(void)
{
    int N = 45, Hq = 8, Hkv = 2, D = 128, ctx = 64;
    size_t row = (size_t)Hkv * D;
    float *k = hrand((size_t)N * row, 1.f), *v = hrand((size_t)N * row, 1.f), *q = hrand((size_t)N * Hq * D, 1.f);
    float *dk = dpoison((size_t)ctx * row), *dv = dpoison((size_t)ctx * row);
    float *dkn = dcopy(k, (size_t)N * row), *dvn = dcopy(v, (size_t)N * row), *dq = dcopy(q, (size_t)N * Hq * D);
    sn_kv_view gv = { dk, dv, ctx, Hkv, D };
    float *full = dpoison((size_t)N * Hq * D), *step = dpoison((size_t)N * Hq * D);
    CHECK_OK(G->ops->kv_write(G, &gv, dkn, dvn, N, 0));
    CHECK_OK(G->ops->attention(G, dq, &gv, N, 0, Hq, 0.088f, full));
    for (int t = 0; t < N; t++)
        CHECK_OK(G->ops->attention(G, dq + (size_t)t * Hq * D, &gv, 1, t, Hq, 0.088f, step + (size_t)t * Hq * D));
    float *a = tohost(full, (size_t)N * Hq * D), *b = tohost(step, (size_t)N * Hq * D);
    CHECKF(rel_err(b, a, (size_t)N * Hq * D) <= 2e-5, "prefill vs decode: %.3g", rel_err(b, a, (size_t)N * Hq * D));
    free(k); free(v); free(q); free(a); free(b);
    dfree(dk); dfree(dv); dfree(dkn); dfree(dvn); dfree(dq); dfree(full); dfree(step);
}

/* Decode attention of up to 8 new tokens in one call: each token's output
 * is bitwise what a one-token call at its position gives (GQA groups of 6,
 * 8 and 8 query heads over 4, 2 and 1 kv heads). */
static void attn_batch_case(int Hq, int Hkv)
{
    int P = 37, N = 8, D = 256, ctx = 64;
    size_t row = (size_t)Hkv * D;
    float *k = hrand((size_t)(P + N) * row, 1.f), *v = hrand((size_t)(P + N) * row, 1.f);
    float *q = hrand((size_t)N * Hq * D, 1.f);
    float *dk = dpoison((size_t)ctx * row), *dv = dpoison((size_t)ctx * row);
    float *dkn = dcopy(k, (size_t)(P + N) * row), *dvn = dcopy(v, (size_t)(P + N) * row);
    float *dq = dcopy(q, (size_t)N * Hq * D);
    sn_kv_view gv = { dk, dv, ctx, Hkv, D };
    CHECK_OK(G->ops->kv_write(G, &gv, dkn, dvn, P + N, 0));
    float *many = dpoison((size_t)N * Hq * D), *one = dpoison((size_t)N * Hq * D);
    for (int t = 0; t < N; t++)
        CHECK_OK(G->ops->attention(G, dq + (size_t)t * Hq * D, &gv, 1, P + t, Hq, 0.0625f, one + (size_t)t * Hq * D));
    float *a = tohost(one, (size_t)N * Hq * D);
    for (int T = 2; T <= N; T++) {
        CHECK_OK(G->ops->attention(G, dq, &gv, T, P, Hq, 0.0625f, many));
        float *b = tohost(many, (size_t)T * Hq * D);
        CHECKF(memcmp(a, b, sizeof(float) * T * Hq * D) == 0, "attention decode Hq=%d Hkv=%d T=%d differs from T=1",
               Hq, Hkv, T);
        free(b);
    }
    free(k); free(v); free(q); free(a);
    dfree(dk); dfree(dv); dfree(dkn); dfree(dvn); dfree(dq); dfree(many); dfree(one);
}

static void test_attention_decode_batch_invariant(void)
{
    attn_batch_case(24, 4);
    attn_batch_case(16, 2);
    attn_batch_case(8, 1);
    /* the GQA kernel's block forms forced (by shape it takes 8 warps for
     * 1-2 kv heads, 4 above) and 128 splits, against the CPU and across T */
    const int forms[3][2] = { { 8, 64 }, { 4, 64 }, { 0, 128 } };
    for (int f = 0; f < 3; f++) {
        CHECK_OK(sn_cuda_tune(G, "attn_warps", forms[f][0]));
        CHECK_OK(sn_cuda_tune(G, "attn_splits", forms[f][1]));
        attn_case(1, 1000, 16, 2, 256, 1024);
        attn_case(2, 77, 24, 4, 256, 128);
        attn_case(3, 200, 8, 2, 64, 256);
        attn_batch_case(24, 4);
        attn_batch_case(16, 2);
    }
    CHECK_OK(sn_cuda_tune(G, "attn_warps", 0));
    CHECK_OK(sn_cuda_tune(G, "attn_splits", 64));
    CHECK(sn_cuda_tune(G, "attn_warps", 6) == SN_E_INVALID);
    CHECK(sn_cuda_tune(G, "attn_splits", 96) == SN_E_INVALID);
    CHECK(sn_cuda_tune(G, "gemv_rpw1_rows", -1) == SN_E_INVALID);
    CHECK(sn_cuda_tune(G, "pdl", 3) == SN_E_INVALID);
}

/* ---- GatedDeltaNet ---- */

/* One GPU gdn from the given start state (nh history slots), everything it
 * writes back on the host: out [T, Hv*Dv] | S | conv state | history. */
static float *gdn_run(const sn_gdn_dims *d, const float *dqkv, const float *da, const float *db, const float *dcw,
                      const float *dAl, const float *ddt, const float *conv, const float *S, int T, int nh, size_t *n)
{
    const size_t cf = (size_t)(d->conv_k - 1) * (2 * (size_t)d->n_k_heads * d->dk + (size_t)d->n_v_heads * d->dv);
    const size_t sf = (size_t)d->n_v_heads * d->dk * d->dv, of = (size_t)T * d->n_v_heads * d->dv;
    const size_t hf = sn_gdn_hist_floats(d) * (size_t)nh;
    float *dconv = dcopy(conv, cf), *dS = dcopy(S, sf), *dout = dpoison(of), *dh = nh ? dpoison(hf) : NULL;
    sn_gdn_view v = { dconv, dS, dh, nh };
    CHECK_OK(G->ops->gdn(G, d, dqkv, da, db, dcw, dAl, ddt, &v, T, dout));
    *n = of + sf + cf + hf;
    float *h = malloc(sizeof(float) * *n);
    CHECK_OK(G->ops->to_host(G, h, dout, sizeof(float) * of));
    CHECK_OK(G->ops->to_host(G, h + of, dS, sizeof(float) * sf));
    CHECK_OK(G->ops->to_host(G, h + of + sf, dconv, sizeof(float) * cf));
    if (nh) CHECK_OK(G->ops->to_host(G, h + of + sf + cf, dh, sizeof(float) * hf));
    dfree(dconv); dfree(dS); dfree(dout);
    if (dh) dfree(dh);
    return h;
}

static void gdn_case(int Hk, int Hv, int Dk, int Dv, int K, int T)
{
    sn_gdn_dims d = { Hk, Hv, Dk, Dv, K, 1e-6f };
    size_t Cd = 2 * (size_t)Hk * Dk + (size_t)Hv * Dv;
    float *qkv = hrand((size_t)T * Cd, 2.f), *a = hrand((size_t)T * Hv, 2.f), *b = hrand((size_t)T * Hv, 2.f);
    float *cw = hrand(Cd * K, 0.7f), *Al = hrand((size_t)Hv, 1.f), *dtb = hrand((size_t)Hv, 1.f);
    float *conv = hrand((size_t)(K - 1) * Cd, 1.f), *S = hrand((size_t)Hv * Dk * Dv, 0.3f);
    float *conv_c = malloc(sizeof(float) * (K - 1) * Cd + 4), *S_c = malloc(sizeof(float) * Hv * Dk * Dv);
    memcpy(conv_c, conv, sizeof(float) * (K - 1) * Cd);
    memcpy(S_c, S, sizeof(float) * Hv * Dk * Dv);
    float *ref = malloc(sizeof(float) * T * Hv * Dv);
    sn_gdn_view hst = { conv_c, S_c, NULL, 0 };
    CHECK_OK(C->ops->gdn(C, &d, qkv, a, b, cw, Al, dtb, &hst, T, ref));
    float *dqkv = dcopy(qkv, (size_t)T * Cd), *da = dcopy(a, (size_t)T * Hv), *db = dcopy(b, (size_t)T * Hv);
    float *dcw = dcopy(cw, Cd * K), *dAl = dcopy(Al, Hv), *ddt = dcopy(dtb, Hv);
    float *dconv = dcopy(conv, (size_t)(K - 1) * Cd), *dS = dcopy(S, (size_t)Hv * Dk * Dv);
    float *dout = dpoison((size_t)T * Hv * Dv);
    sn_gdn_view gst = { dconv, dS, NULL, 0 };
    CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &gst, T, dout));
    float *out = tohost(dout, (size_t)T * Hv * Dv), *Sg = tohost(dS, (size_t)Hv * Dk * Dv);
    float *cg = tohost(dconv, (size_t)(K - 1) * Cd);
    double e1 = rel_err(out, ref, (size_t)T * Hv * Dv), e2 = rel_err(Sg, S_c, (size_t)Hv * Dk * Dv);
    double e3 = rel_err(cg, conv_c, (size_t)(K - 1) * Cd);
    CHECKF(e1 <= 2e-5 && e2 <= 2e-5 && e3 == 0.0, "gdn Hk=%d Hv=%d Dk=%d Dv=%d K=%d T=%d: out %.3g S %.3g conv %.3g", Hk,
           Hv, Dk, Dv, K, T, e1, e2, e3);
    if (T >= 2 && T <= 9) {
        /* with the per-token history (PLD rollback): the same outputs and
         * final state bitwise, and slot t = the state after token t (CPU's
         * history as the reference: conv exact, S within the tolerance) */
        size_t hf = sn_gdn_hist_floats(&d), cf = (size_t)(K - 1) * Cd;
        float *hc = malloc(sizeof(float) * hf * (T - 1));
        memcpy(conv_c, conv, sizeof(float) * cf);
        memcpy(S_c, S, sizeof(float) * Hv * Dk * Dv);
        sn_gdn_view hh = { conv_c, S_c, hc, T - 1 };
        CHECK_OK(C->ops->gdn(C, &d, qkv, a, b, cw, Al, dtb, &hh, T, ref));
        float *dconv2 = dcopy(conv, cf), *dS2 = dcopy(S, (size_t)Hv * Dk * Dv);
        float *dout2 = dpoison((size_t)T * Hv * Dv), *dh = dpoison(hf * (T - 1));
        sn_gdn_view g2 = { dconv2, dS2, dh, T - 1 };
        CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &g2, T, dout2));
        float *out2 = tohost(dout2, (size_t)T * Hv * Dv), *S2 = tohost(dS2, (size_t)Hv * Dk * Dv);
        float *hg = tohost(dh, hf * (T - 1));
        CHECKF(!memcmp(out2, out, sizeof(float) * T * Hv * Dv) && !memcmp(S2, Sg, sizeof(float) * Hv * Dk * Dv),
               "gdn T=%d: the history changed the outputs", T);
        for (int t = 0; t + 1 < T; t++) {
            double ec = cf ? rel_err(hg + t * hf, hc + t * hf, cf) : 0.0;
            double es = rel_err(hg + t * hf + cf, hc + t * hf + cf, hf - cf);
            CHECKF(ec == 0.0 && es <= 2e-5, "gdn T=%d history slot %d: conv %.3g S %.3g", T, t, ec, es);
        }
        free(hc); free(out2); free(S2); free(hg);
        dfree(dconv2); dfree(dS2); dfree(dout2); dfree(dh);
    }
    if (T <= 8) {
        /* the one-kernel decode step (gdn_step 1) and the two-kernel one (2,
         * the default) give the three kernels' bits (0): outputs, state,
         * conv state and history */
        for (int mode = 1; mode <= 2; mode++)
            for (int nh = 0; nh <= (T >= 2 ? T - 1 : 0); nh += T >= 2 ? T - 1 : 1) {
                size_t n1 = 0, n0 = 0;
                CHECK_OK(sn_cuda_tune(G, "gdn_step", mode));
                float *one = gdn_run(&d, dqkv, da, db, dcw, dAl, ddt, conv, S, T, nh, &n1);
                CHECK_OK(sn_cuda_tune(G, "gdn_step", 0));
                float *three = gdn_run(&d, dqkv, da, db, dcw, dAl, ddt, conv, S, T, nh, &n0);
                CHECKF(n1 == n0 && !memcmp(one, three, sizeof(float) * n1),
                       "gdn Hk=%d Hv=%d Dk=%d Dv=%d K=%d T=%d nh=%d: gdn_step %d differs from the three kernels", Hk,
                       Hv, Dk, Dv, K, T, nh, mode);
                free(one); free(three);
            }
        CHECK(sn_cuda_tune(G, "gdn_step", 3) == SN_E_INVALID);
        CHECK_OK(sn_cuda_tune(G, "gdn_step", 2)); /* the default again */
    }
    if (T > 8) {
        /* the prefill conv one warp per (head, 8 tokens) (gdn_conv 1, the
         * default) gives k_gdn_conv's bits (0): outputs, state, conv state */
        size_t n1 = 0, n0 = 0;
        float *w1 = gdn_run(&d, dqkv, da, db, dcw, dAl, ddt, conv, S, T, 0, &n1);
        CHECK_OK(sn_cuda_tune(G, "gdn_conv", 0));
        float *w0 = gdn_run(&d, dqkv, da, db, dcw, dAl, ddt, conv, S, T, 0, &n0);
        CHECK_OK(sn_cuda_tune(G, "gdn_conv", 1));
        CHECKF(n1 == n0 && !memcmp(w1, w0, sizeof(float) * n1),
               "gdn Hk=%d Hv=%d Dk=%d Dv=%d K=%d T=%d: gdn_conv 1 differs from k_gdn_conv", Hk, Hv, Dk, Dv, K, T);
        free(w1); free(w0);
    }
    free(qkv); free(a); free(b); free(cw); free(Al); free(dtb); free(conv); free(S); free(conv_c); free(S_c);
    free(ref); free(out); free(Sg); free(cg);
    dfree(dqkv); dfree(da); dfree(db); dfree(dcw); dfree(dAl); dfree(ddt); dfree(dconv); dfree(dS); dfree(dout);
}

static void test_gdn(void)
{
    gdn_case(2, 4, 128, 128, 4, 1);
    gdn_case(2, 4, 128, 128, 4, 2);
    gdn_case(2, 6, 128, 128, 4, 70);
    gdn_case(1, 3, 48, 40, 4, 5);
    gdn_case(3, 3, 32, 64, 2, 9);
    gdn_case(16, 48, 128, 128, 4, 1); /* the 27B layer */
    gdn_case(16, 32, 128, 128, 4, 3); /* the 35B-A3B layer, a verify pass */
    gdn_case(2, 4, 256, 64, 4, 8);    /* the largest key head and T of the one-kernel step */
    gdn_case(4, 8, 64, 96, 3, 6);     /* Dv not a multiple of 32, K = 3 */
    gdn_case(2, 4, 256, 64, 4, 40);   /* the prefill conv's 8 channels a lane, serial recurrence */
    gdn_case(1, 3, 48, 40, 4, 100);   /* odd head sizes, a partial last warp of tokens, chunked */
    gdn_case(16, 32, 128, 128, 4, 77); /* the 35B-A3B layer at a short prompt */
}

/* A GDN layer and the gated RMSNorm of its output inside a step (a CUDA
 * graph, as decode and verify run them): outputs, norm, state, conv state
 * and history must be the bits of the two ops run eagerly (Dv 40 and 96:
 * rows that are not a multiple of the recurrence's 32 columns; nh > 0
 * keeps the per-token history as a verify pass does). */
static void gdn_gnorm_case(int Hk, int Hv, int Dk, int Dv, int T, int nh)
{
    const int K = 4;
    sn_gdn_dims d = { Hk, Hv, Dk, Dv, K, 1e-6f };
    const size_t Cd = 2 * (size_t)Hk * Dk + (size_t)Hv * Dv, no = (size_t)T * Hv * Dv;
    const size_t cf = (size_t)(K - 1) * Cd, sf = (size_t)Hv * Dk * Dv, hf = sn_gdn_hist_floats(&d) * (nh ? nh : 1);
    float *qkv = hrand((size_t)T * Cd, 2.f), *a = hrand((size_t)T * Hv, 2.f), *b = hrand((size_t)T * Hv, 2.f);
    float *cw = hrand(Cd * K, 0.7f), *Al = hrand((size_t)Hv, 1.f), *dtb = hrand((size_t)Hv, 1.f);
    float *conv = hrand(cf, 1.f), *S = hrand(sf, 0.3f), *z = hrand(no, 2.f), *w = hrand((size_t)Dv, 1.f);
    float *dqkv = dcopy(qkv, (size_t)T * Cd), *da = dcopy(a, (size_t)T * Hv), *db = dcopy(b, (size_t)T * Hv);
    float *dcw = dcopy(cw, Cd * K), *dAl = dcopy(Al, Hv), *ddt = dcopy(dtb, Hv), *dz = dcopy(z, no), *dw = dcopy(w, Dv);
    float *res[2][5];
    for (int graph = 0; graph < 2; graph++) {
        float *dconv = dcopy(conv, cf), *dS = dcopy(S, sf), *dout = dpoison(no), *dy = dpoison(no);
        float *dh = nh ? dpoison(hf) : NULL;
        sn_gdn_view v = { dconv, dS, dh, nh };
        if (graph) CHECK_OK(G->ops->begin_step(G));
        CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &v, T, dout));
        CHECK_OK(G->ops->gated_rmsnorm(G, dout, dz, dw, T * Hv, Dv, 1e-6f, dy));
        if (graph) CHECK_OK(G->ops->end_step(G));
        res[graph][0] = tohost(dout, no);
        res[graph][1] = tohost(dy, no);
        res[graph][2] = tohost(dS, sf);
        res[graph][3] = tohost(dconv, cf);
        res[graph][4] = nh ? tohost(dh, hf) : NULL;
        dfree(dconv); dfree(dS); dfree(dout); dfree(dy);
        if (dh) dfree(dh);
    }
    const size_t n[5] = { no, no, sf, cf, nh ? hf : 0 };
    static const char *what[5] = { "out", "norm", "state", "conv state", "history" };
    for (int i = 0; i < 5; i++) {
        CHECKF(!n[i] || !memcmp(res[0][i], res[1][i], sizeof(float) * n[i]),
               "gdn + gated norm Hk=%d Hv=%d Dk=%d Dv=%d T=%d nh=%d: the graph's %s differs from eager", Hk, Hv, Dk,
               Dv, T, nh, what[i]);
        free(res[0][i]); free(res[1][i]);
    }
    free(qkv); free(a); free(b); free(cw); free(Al); free(dtb); free(conv); free(S); free(z); free(w);
    dfree(dqkv); dfree(da); dfree(db); dfree(dcw); dfree(dAl); dfree(ddt); dfree(dz); dfree(dw);
}

static void test_gdn_gnorm_graph(void)
{
    gdn_gnorm_case(16, 32, 128, 128, 1, 0); /* the 35B-A3B layer, decode */
    gdn_gnorm_case(16, 32, 128, 128, 3, 2); /* a verify pass with its history */
    gdn_gnorm_case(2, 4, 128, 128, 8, 0);
    gdn_gnorm_case(1, 3, 48, 40, 2, 0);
    gdn_gnorm_case(4, 8, 64, 96, 5, 4);
}

/* A GDN layer inside a step, as forward.c records it: the RMSNorm, the
 * qkv/z/b/a projections, the GDN, its gated RMSNorm, the out projection and
 * the residual add (the out side where Hv * Dv is a multiple of the quant
 * group). In a graph the norm folds into the projections' launch and, with
 * fuse_conv (default), the conv into the qkv projection's epilogue with the
 * norms, gates and rule in one launch after it; with fuse_gate (default)
 * the gated norm folds into the out projection where that takes the
 * integer GEMV (gn_fold: the 27B's 5120 x 6144). Three steps' outputs,
 * projections, state, conv state, history, gated norm and residual must be
 * the eager bits either way, and the fused graph must have exactly one
 * kernel fewer per fold than the unfused one, so a fold that silently stops
 * applying (or one the fuser takes that the launch does not) fails here. */
static void gdn_layer_case(int H, int Hk, int Hv, int Dk, int Dv, int T, int nh, int gn_fold)
{
    const int K = 4;
    sn_gdn_dims d = { Hk, Hv, Dk, Dv, K, 1e-6f };
    const size_t Cd = 2 * (size_t)Hk * Dk + (size_t)Hv * Dv, no = (size_t)T * Hv * Dv;
    const size_t cf = (size_t)(K - 1) * Cd, sf = (size_t)Hv * Dk * Dv, hf = sn_gdn_hist_floats(&d) * (nh ? nh : 1);
    const bool outp = (Hv * Dv) % 64 == 0; /* the out projection in groups of 64 */
    tw wq, wz, wb, wa, wo;
    if (outp) tw_make(&wo, SN_DT_Q4, H, (int64_t)Hv * Dv, 64, SN_DT_BF16, 0, 0);
    tw_make(&wq, SN_DT_Q4, (int64_t)Cd, H, 64, SN_DT_BF16, 0, 0);
    tw_make(&wz, SN_DT_Q4, (int64_t)Hv * Dv, H, 64, SN_DT_BF16, 0, 0);
    tw_make(&wb, SN_DT_Q4, Hv, H, 64, SN_DT_BF16, 0, 0);
    tw_make(&wa, SN_DT_Q4, Hv, H, 64, SN_DT_BF16, 0, 0);
    float *x = hrand((size_t)T * H, 1.f), *nw = hrand((size_t)H, 1.f), *cw = hrand(Cd * K, 0.7f);
    float *Al = hrand((size_t)Hv, 1.f), *dtb = hrand((size_t)Hv, 1.f), *conv = hrand(cf, 1.f), *S = hrand(sf, 0.3f);
    float *dx = dcopy(x, (size_t)T * H), *dnw = dcopy(nw, H), *dcw = dcopy(cw, Cd * K), *dAl = dcopy(Al, Hv);
    float *ddt = dcopy(dtb, Hv), *dxn = dpoison((size_t)T * H), *dqkv = dpoison((size_t)T * Cd);
    float *dz = dpoison(no), *db = dpoison((size_t)T * Hv), *da = dpoison((size_t)T * Hv), *dout = dpoison(no);
    float *gw = hrand((size_t)Dv, 1.f), *dgw = dcopy(gw, Dv), *dy = dpoison(no), *dpj = dpoison((size_t)T * H);
    enum { STEPS = 3, NR = 8 };
    float *res[3][STEPS + 1][NR];
    long nodes[3] = { 0, 0, 0 }, caps[3] = { 0, 0, 0 };
    for (int mode = 0; mode < 3; mode++) { /* eager, graph unfused, graph with the conv folded */
        CHECK_OK(sn_cuda_tune(G, "fuse_conv", mode == 2));
        CHECK_OK(sn_cuda_tune(G, "fuse_gate", mode == 2));
        long c0, c1;
        sn_cuda_graph_stats(G, NULL, &c0, NULL);
        float *dconv = dcopy(conv, cf), *dS = dcopy(S, sf), *dh = nh ? dpoison(hf) : NULL;
        float *dres = dcopy(x, (size_t)T * H); /* the residual stream the out projection adds into */
        sn_gdn_view v = { dconv, dS, dh, nh };
        for (int st = 0; st < STEPS; st++) {
            if (mode) CHECK_OK(G->ops->begin_step(G));
            CHECK_OK(G->ops->rmsnorm(G, dx, dnw, T, H, 1e-6f, dxn));
            CHECK_OK(G->ops->matmul(G, &wq.wg, 0, dxn, T, dqkv));
            CHECK_OK(G->ops->matmul(G, &wz.wg, 0, dxn, T, dz));
            CHECK_OK(G->ops->matmul(G, &wb.wg, 0, dxn, T, db));
            CHECK_OK(G->ops->matmul(G, &wa.wg, 0, dxn, T, da));
            CHECK_OK(G->ops->gdn(G, &d, dqkv, da, db, dcw, dAl, ddt, &v, T, dout));
            if (outp) {
                CHECK_OK(G->ops->gated_rmsnorm(G, dout, dz, dgw, T * Hv, Dv, 1e-6f, dy));
                CHECK_OK(G->ops->matmul(G, &wo.wg, 0, dy, T, dpj));
                CHECK_OK(G->ops->add(G, dres, dpj, (size_t)T * H));
            }
            if (mode) CHECK_OK(G->ops->end_step(G));
            if (mode && st == 0) {
                sn_cuda_graph_stats(G, NULL, &c1, NULL);
                nodes[mode] = sn_cuda_graph_nodes(G);
                caps[mode] = c1 - c0;
            }
            res[mode][st][0] = tohost(dout, no);
            res[mode][st][1] = tohost(dqkv, (size_t)T * Cd);
            res[mode][st][2] = tohost(dz, no);
            res[mode][st][3] = tohost(dS, sf);
            res[mode][st][4] = tohost(dconv, cf);
            res[mode][st][5] = nh ? tohost(dh, hf) : NULL;
            res[mode][st][6] = outp ? tohost(dy, no) : NULL;
            res[mode][st][7] = outp ? tohost(dres, (size_t)T * H) : NULL;
        }
        dfree(dconv); dfree(dS); dfree(dres);
        if (dh) dfree(dh);
    }
    CHECK_OK(sn_cuda_tune(G, "fuse_conv", 1));
    CHECK_OK(sn_cuda_tune(G, "fuse_gate", 1));
    const size_t n[NR] = { no, (size_t)T * Cd, no, sf, cf, nh ? hf : 0, outp ? no : 0, outp ? (size_t)T * H : 0 };
    static const char *what[NR] = { "out", "qkv", "z", "state", "conv state", "history", "gated norm", "residual" };
    for (int mode = 1; mode < 3; mode++)
        for (int st = 0; st < STEPS; st++)
            for (int i = 0; i < NR; i++)
                CHECKF(!n[i] || !memcmp(res[0][st][i], res[mode][st][i], sizeof(float) * n[i]),
                       "gdn layer H=%d Hk=%d Hv=%d Dk=%d Dv=%d T=%d nh=%d step %d: the %s graph's %s differs from eager",
                       H, Hk, Hv, Dk, Dv, T, nh, st, mode == 2 ? "folded" : "unfused", what[i]);
    const int folds = 1 + gn_fold; /* the conv; the gated norm */
    CHECKF(caps[1] == 1 && caps[2] == 1 && nodes[2] == nodes[1] - folds,
           "gdn layer H=%d Dv=%d T=%d: %ld graph nodes folded, %ld unfused, %d folds expected (captured %ld, %ld)", H,
           Dv, T, nodes[2], nodes[1], folds, caps[2], caps[1]);
    for (int mode = 0; mode < 3; mode++)
        for (int st = 0; st < STEPS; st++)
            for (int i = 0; i < NR; i++) free(res[mode][st][i]);
    free(x); free(nw); free(cw); free(Al); free(dtb); free(conv); free(S); free(gw);
    dfree(dx); dfree(dnw); dfree(dcw); dfree(dAl); dfree(ddt); dfree(dxn); dfree(dqkv); dfree(dz); dfree(db);
    dfree(da); dfree(dout); dfree(dgw); dfree(dy); dfree(dpj);
    tw_free(&wq); tw_free(&wz); tw_free(&wb); tw_free(&wa);
    if (outp) tw_free(&wo);
}

static void test_gdn_layer_graph(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", -1)); /* kernels by shape, as decode takes them */
    gdn_layer_case(2048, 16, 32, 128, 128, 1, 0, 0); /* the 35B-A3B layer, decode */
    gdn_layer_case(2048, 16, 32, 128, 128, 4, 3, 0); /* a verify pass with its history */
    gdn_layer_case(5120, 16, 48, 128, 128, 1, 0, 1); /* the 27B layer: its out projection is the integer GEMV's */
    gdn_layer_case(5120, 16, 48, 128, 128, 3, 2, 1); /* and its verify pass */
    gdn_layer_case(256, 2, 4, 128, 128, 8, 7, 0);    /* T = 8: one pass of the GEMV's widest form */
    gdn_layer_case(256, 1, 3, 48, 40, 2, 0, 0);      /* odd heads: rows that end inside a warp's group */
    gdn_layer_case(512, 4, 8, 64, 96, 5, 2, 0);      /* Dv not a multiple of 32, a partial history */
}

/* The register-load form of the one-token dp4a GEMV (tune gemv_rl: no
 * cp.async ring, the next chunk's words loaded into registers): only where
 * the weights wait changes, so it gives the ring form's bits, at every
 * rows-a-warp (1, 2, 4), dealt and pooled, with each scale format (the
 * 8-byte fp32 pairs too) and rows that end inside a warp's group; each
 * load form (1 and 2) twice. */
static void rl_case(int64_t rows, int64_t cols, int group, sn_dtype sdt, int bias, int rpw, int dyn, int pooled)
{
    tw w;
    tw_make(&w, SN_DT_Q4, rows, cols, group, sdt, 0, bias);
    float *x = hrand((size_t)cols, 1.0f), *dx = dcopy(x, (size_t)cols);
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw", rpw));
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn", dyn));
    float *ref = NULL;
    for (int f = 0; f < 5; f++) {
        CHECK_OK(sn_cuda_tune(G, "gemv_rl", (f + 1) / 2)); /* the ring form, then forms 1 and 2 twice each */
        long n0[2] = { 0, 0 }, n1[2] = { 0, 0 };
        int cnt[4];
        CHECK_OK(sn_cuda_gemv_pool(G, n0, cnt));
        float *dy = dpoison((size_t)rows);
        CHECK_OK(G->ops->matmul(G, &w.wg, 0, dx, 1, dy));
        float *y = tohost(dy, (size_t)rows);
        dfree(dy);
        CHECK_OK(sn_cuda_gemv_pool(G, n1, cnt));
        CHECKF(cnt[0] == 0 && cnt[1] == 0, "gemv_rl %lldx%lld: pool counters %d %d after the launch", (long long)rows,
               (long long)cols, cnt[0], cnt[1]);
        CHECKF(n1[0] - n0[0] == pooled, "gemv_rl %lldx%lld dyn=%d: %ld launches pooled, %d expected", (long long)rows,
               (long long)cols, dyn, n1[0] - n0[0], pooled);
        if (!ref) {
            ref = y;
            continue;
        }
        CHECKF(memcmp(ref, y, sizeof(float) * rows) == 0,
               "gemv_rl=%d %lldx%lld g=%d rpw=%d dyn=%d: bits differ from the ring form's", (f + 1) / 2,
               (long long)rows, (long long)cols, group, rpw, dyn);
        free(y);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_rl", 3));
    CHECK_OK(sn_cuda_tune(G, "gemv_dyn", 50)); /* the defaults */
    CHECK_OK(sn_cuda_tune(G, "gemv_rpw", 0));
    free(x); free(ref);
    dfree(dx);
    tw_free(&w);
}

static void test_gemv_rl(void)
{
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 0)); /* the SIMT GEMV for every matrix */
    for (int dyn = 0; dyn <= 50; dyn += 50) {
        rl_case(34816, 5120, 64, SN_DT_BF16, 0, 0, dyn, dyn > 0); /* the 27B's gate/up: pooled at dyn 50 */
        rl_case(5120, 17408, 64, SN_DT_BF16, 0, 0, dyn, 0);       /* its down projection */
        rl_case(180000, 1024, 64, SN_DT_BF16, 0, 4, dyn, dyn > 0); /* one chunk a group: loads run a group ahead */
    }
    static const int rpws[3] = { 1, 2, 4 };
    for (int i = 0; i < 3; i++) {
        rl_case(1000, 5120, 64, SN_DT_BF16, 1, rpws[i], 0, 0);
        rl_case(300, 2048, 128, SN_DT_BF16, 0, rpws[i], 0, 0);
        rl_case(48, 5120, 32, SN_DT_F16, 1, rpws[i], 0, 0);
        rl_case(259, 1088, 64, SN_DT_BF16, 1, rpws[i], 0, 0);
        rl_case(33, 384, 128, SN_DT_F32, 0, rpws[i], 0, 0);
    }
    /* the GDN layer with its conv folded into the register-load form */
    CHECK_OK(sn_cuda_tune(G, "gemv_i8", 1));
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", -1));
    for (int rl = 1; rl <= 2; rl++) {
        CHECK_OK(sn_cuda_tune(G, "gemv_rl", rl));
        gdn_layer_case(5120, 16, 48, 128, 128, 1, 0, 1);
        gdn_layer_case(256, 1, 3, 48, 40, 1, 0, 0);
    }
    CHECK_OK(sn_cuda_tune(G, "gemv_rl", 3)); /* the default: form 1 over 4096 columns, else the ring */
    CHECK(sn_cuda_tune(G, "gemv_rl", 4) == SN_E_INVALID);
}

/* ---- MoE (host reference from CPU matmuls) ---- */

static int moe_i8 = 1; /* the backend's gemm_i8 is on (the default) */

static void moe_case(int E, int k, int H, int I, int T, int norm)
{
    tw g, u, dn;
    tw_make(&g, SN_DT_Q4, I, H, 64, SN_DT_BF16, E, 0);
    tw_make(&u, SN_DT_Q4, I, H, 64, SN_DT_BF16, E, 0);
    tw_make(&dn, SN_DT_Q4, H, I, 64, SN_DT_BF16, E, 0);
    float *x = hrand((size_t)T * H, 1.f), *lg = hrand((size_t)T * E, 3.f);
    float *ref = calloc((size_t)T * H, sizeof(float));
    float *hg = malloc(sizeof(float) * I), *hu = malloc(sizeof(float) * I), *ho = malloc(sizeof(float) * H);
    for (int t = 0; t < T; t++) {
        const float *l = lg + (size_t)t * E;
        float m = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) m = fmaxf(m, l[e]);
        for (int e = 0; e < E; e++) sum += expf(l[e] - m);
        int chosen[32];
        float p[32], tot = 0;
        for (int j = 0; j < k; j++) {
            int bi = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int jj = 0; jj < j; jj++) taken |= chosen[jj] == e;
                if (!taken && (bi < 0 || l[e] > l[bi])) bi = e;
            }
            chosen[j] = bi;
            p[j] = expf(l[bi] - m) / sum;
            tot += p[j];
        }
        for (int j = 0; j < k; j++) {
            float wj = norm ? p[j] / tot : p[j];
            C->ops->matmul(C, &g.w, chosen[j], x + (size_t)t * H, 1, hg);
            C->ops->matmul(C, &u.w, chosen[j], x + (size_t)t * H, 1, hu);
            for (int i = 0; i < I; i++) hg[i] = hg[i] / (1.f + expf(-hg[i])) * hu[i];
            C->ops->matmul(C, &dn.w, chosen[j], hg, 1, ho);
            for (int i = 0; i < H; i++) ref[(size_t)t * H + i] += wj * ho[i];
        }
    }
    float *dx = dcopy(x, (size_t)T * H), *dl = dcopy(lg, (size_t)T * E), *dout = dpoison((size_t)T * H);
    CHECK_OK(G->ops->moe(G, &g.wg, &u.wg, &dn.wg, dl, k, norm != 0, dx, T, dout));
    float *out = tohost(dout, (size_t)T * H);
    double err = rel_err(out, ref, (size_t)T * H);
    /* T >= 32 takes the expert-grouped GEMM path: the integer GEMM on the
     * repacked stacks (fp32-class) or, with gemm_i8 off, the split fp16x3 one */
    double tol = T >= 32 && !moe_i8 ? 2e-4 : 2e-5;
    CHECKF(err <= tol, "moe E=%d k=%d H=%d I=%d T=%d: rel %.3g", E, k, H, I, T, err);
    free(x); free(lg); free(ref); free(hg); free(hu); free(ho); free(out);
    dfree(dx); dfree(dl); dfree(dout);
    tw_free(&g); tw_free(&u); tw_free(&dn);
}

static void test_moe(void)
{
    moe_case(8, 2, 128, 64, 1, 1);
    moe_case(64, 8, 512, 128, 3, 1);
    moe_case(16, 4, 256, 192, 5, 0);
    moe_case(256, 8, 2048, 512, 1, 1); /* 35B-A3B shape */
    moe_case(16, 4, 256, 192, 40, 1);  /* grouped GEMM path, odd expert row counts */
    moe_case(64, 8, 512, 128, 300, 1);
    moe_case(256, 8, 2048, 512, 64, 1);
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", 0)); /* the fp16x3 GEMMs for every stack */
    moe_i8 = 0;
    moe_case(64, 8, 512, 128, 300, 1);
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", 4)); /* the default (MoE stacks take 3 digits under it) */
    moe_i8 = 1;
    CHECK_OK(sn_cuda_tune(G, "moe_gemm", 0));
    moe_case(16, 4, 256, 192, 40, 1);  /* the same through per-token GEMVs */
    CHECK_OK(sn_cuda_tune(G, "moe_gemm", 1));
}

static void test_argmax(void)
{
    int rows = 5, n = 248320;
    float *x = hrand((size_t)rows * n, 10.f);
    x[123] = 50.f;
    x[n + 7] = 60.f;
    x[n + 9] = 60.f; /* tie: the first wins */
    x[2 * (size_t)n + n - 1] = 70.f;
    x[3 * (size_t)n] = 70.f;
    x[4 * (size_t)n + 4] = NAN;
    x[4 * (size_t)n + 5] = 55.f;
    float *dx = dcopy(x, (size_t)rows * n);
    int32_t out[5] = { -1, -1, -1, -1, -1 };
    CHECK_OK(sn_cuda_argmax(G, dx, rows, n, out));
    CHECK(out[0] == 123);
    CHECK(out[1] == 7);
    CHECK(out[2] == n - 1);
    CHECK(out[3] == 0);
    CHECK(out[4] == 5);
    free(x);
    dfree(dx);
}

/* ---- decode-step graph: a small layer loop, eager vs recorded ---- */

typedef struct {
    tw emb, wq, wk, wv, wo, wg, wu, wd;
    float *norm_w, *inv_freq;
    float *h, *xn, *q, *k, *v, *att, *o, *kc, *vc, *mg, *mu, *ma;
    float *qkn_w, *qn, *kn; /* qkn: the gated attention's q/k RMSNorms before RoPE (qwen3_5) */
    int H, Hq, Hkv, D, ctx, I;
    int R; /* rows per step: 1 = a decode step, 2..8 = a prompt-lookup verify pass */
    int qkn;
    int gnorm; /* between the attention and wo, with z = the raw q: 1 a gated RMSNorm (rows of 128, as a GDN
                * layer's), 2 the gated attention's output gate (mul_sigmoid) */
    float *gn_w, *ga;
    int32_t outs[8]; /* argmax of each row: valid after the step (after end_step inside one) */
} mini;

/* R tokens tok, tok+1, ... at positions pos..pos+R-1 */
static void mini_step(mini *m, int32_t tok, int pos)
{
    sn_backend *b = G;
    const int R = m->R;
    sn_kv_view kv = { m->kc, m->vc, m->ctx, m->Hkv, m->D };
    int32_t ids[8];
    for (int r = 0; r < R; r++) ids[r] = (tok + r) % 256;
    CHECK_OK(b->ops->embed(b, &m->emb.wg, ids, R, m->h));
    for (int layer = 0; layer < 3; layer++) {
        CHECK_OK(b->ops->rmsnorm(b, m->h, m->norm_w, R, m->H, 1e-6f, m->xn));
        CHECK_OK(b->ops->matmul(b, &m->wq.wg, 0, m->xn, R, m->q));
        CHECK_OK(b->ops->matmul(b, &m->wk.wg, 0, m->xn, R, m->k));
        CHECK_OK(b->ops->matmul(b, &m->wv.wg, 0, m->xn, R, m->v));
        float *q = m->q, *k = m->k;
        if (m->qkn) {
            /* forward.c's order for qwen3_5: both norms, both RoPEs (partial), the KV write */
            CHECK_OK(b->ops->rmsnorm(b, m->q, m->qkn_w, R * m->Hq, m->D, 1e-6f, m->qn));
            CHECK_OK(b->ops->rmsnorm(b, m->k, m->qkn_w + m->D, R * m->Hkv, m->D, 1e-6f, m->kn));
            q = m->qn;
            k = m->kn;
        }
        const int rot = m->qkn ? m->D / 4 : m->D / 2;
        CHECK_OK(b->ops->rope(b, q, R, m->Hq, m->D, rot, pos, m->inv_freq, 1.f));
        CHECK_OK(b->ops->rope(b, k, R, m->Hkv, m->D, rot, pos, m->inv_freq, 1.f));
        CHECK_OK(b->ops->kv_write(b, &kv, k, m->v, R, pos));
        CHECK_OK(b->ops->attention(b, q, &kv, R, pos, m->Hq, 0.125f, m->att));
        const float *ao = m->att;
        if (m->gnorm == 1) {
            CHECK_OK(b->ops->gated_rmsnorm(b, m->att, m->q, m->gn_w, R * m->Hq * m->D / 128, 128, 1e-6f, m->ga));
            ao = m->ga;
        } else if (m->gnorm == 2) {
            CHECK_OK(b->ops->mul_sigmoid(b, m->att, m->q, (size_t)R * m->Hq * m->D));
        }
        CHECK_OK(b->ops->matmul(b, &m->wo.wg, 0, ao, R, m->o));
        CHECK_OK(b->ops->add(b, m->h, m->o, (size_t)R * m->H));
        /* the MLP: norm folded into gate/up, swiglu folded into down */
        CHECK_OK(b->ops->rmsnorm(b, m->h, m->norm_w, R, m->H, 1e-6f, m->xn));
        CHECK_OK(b->ops->matmul(b, &m->wg.wg, 0, m->xn, R, m->mg));
        CHECK_OK(b->ops->matmul(b, &m->wu.wg, 0, m->xn, R, m->mu));
        CHECK_OK(b->ops->swiglu(b, m->mg, m->mu, (size_t)R * m->I, m->ma));
        CHECK_OK(b->ops->matmul(b, &m->wd.wg, 0, m->ma, R, m->o));
        CHECK_OK(b->ops->add(b, m->h, m->o, (size_t)R * m->H));
    }
    CHECK_OK(b->ops->argmax(b, m->h, R, m->H, m->outs));
}

static sn_dtype g_mlp_dt = SN_DT_Q4;  /* gate/up's format in graph_case_g */
static sn_dtype g_rest_dt = SN_DT_Q4; /* q, k, v, o and down's */

/* H = 256 and 5120: the fused norm replays k_rmsnorm's sum with 128 and
 * 512 threads (fewer and more virtual warps than the GEMV block has).
 * R rows per step: the grouped, folded launches of a verify pass give the
 * bits of the same ops run one by one. */
static void graph_case_g(int H, int R, int qkn, int gnorm)
{
    mini m = { .H = H, .Hq = 4, .Hkv = 2, .D = 64, .ctx = 128, .I = H + 128, .R = R, .qkn = qkn, .gnorm = gnorm };
    tw_make(&m.emb, SN_DT_Q4, 256, m.H, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wq, g_rest_dt, m.Hq * m.D, m.H, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wk, g_rest_dt, m.Hkv * m.D, m.H, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wv, g_rest_dt, m.Hkv * m.D, m.H, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wo, g_rest_dt, m.H, m.Hq * m.D, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wg, g_mlp_dt, m.I, m.H, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wu, g_mlp_dt, m.I, m.H, 64, SN_DT_BF16, 0, 0);
    tw_make(&m.wd, g_rest_dt, m.H, m.I, 64, SN_DT_BF16, 0, 0);
    float *nw = hrand((size_t)m.H, 1.f), inv[32];
    for (int i = 0; i < 32; i++) inv[i] = powf(10000.f, -2.f * i / 32);
    m.norm_w = dcopy(nw, m.H);
    m.inv_freq = dcopy(inv, 32);
    float *qw = hrand((size_t)2 * m.D, 1.f);
    m.qkn_w = dcopy(qw, (size_t)2 * m.D);
    float *gw = hrand(128, 1.f);
    m.gn_w = dcopy(gw, 128);
    m.ga = dpoison((size_t)R * m.Hq * m.D);
    m.qn = dpoison((size_t)R * m.Hq * m.D);
    m.kn = dpoison((size_t)R * m.Hkv * m.D);
    m.h = dpoison((size_t)R * m.H); m.xn = dpoison((size_t)R * m.H); m.q = dpoison((size_t)R * m.Hq * m.D);
    m.k = dpoison((size_t)R * m.Hkv * m.D); m.v = dpoison((size_t)R * m.Hkv * m.D);
    m.att = dpoison((size_t)R * m.Hq * m.D); m.o = dpoison((size_t)R * m.H);
    m.kc = dpoison((size_t)m.ctx * m.Hkv * m.D); m.vc = dpoison((size_t)m.ctx * m.Hkv * m.D);
    m.mg = dpoison((size_t)R * m.I); m.mu = dpoison((size_t)R * m.I); m.ma = dpoison((size_t)R * m.I);
    /* eager run: tokens and final hidden states per step */
    enum { N = 12 };
    int32_t toks_e[N + 1], toks_g[N + 1];
    size_t hb = sizeof(float) * (size_t)R * m.H;
    float *hs_e = malloc(hb * N), *hs_g = malloc(hb * N);
    toks_e[0] = toks_g[0] = 7;
    for (int s = 0; s < N; s++) {
        mini_step(&m, toks_e[s] % 256, s * R);
        toks_e[s + 1] = m.outs[R - 1];
        CHECK_OK(G->ops->to_host(G, (char *)hs_e + hb * s, m.h, hb));
    }
    long r0, c0, e0;
    sn_cuda_graph_stats(G, &r0, &c0, &e0);
    for (int s = 0; s < N; s++) {
        CHECK_OK(G->ops->begin_step(G));
        mini_step(&m, toks_g[s] % 256, s * R);
        CHECK_OK(G->ops->end_step(G));
        toks_g[s + 1] = m.outs[R - 1];
        CHECK_OK(G->ops->to_host(G, (char *)hs_g + hb * s, m.h, hb));
    }
    long r1, c1, e1;
    sn_cuda_graph_stats(G, &r1, &c1, &e1);
    CHECKF(memcmp(toks_e, toks_g, sizeof toks_e) == 0, "graph H=%d R=%d qkn=%d gnorm=%d: tokens differ from eager",
           H, R, qkn, gnorm);
    CHECKF(memcmp(hs_e, hs_g, hb * N) == 0, "graph H=%d R=%d qkn=%d gnorm=%d: hidden states differ from eager", H, R,
           qkn, gnorm);
    CHECKF(c1 - c0 == 1 && r1 - r0 == N - 1 && e1 == e0, "graphs: captured %ld replayed %ld eager %ld", c1 - c0,
           r1 - r0, e1 - e0);
    /* a host read inside a step runs it eagerly, with the same result */
    CHECK_OK(sn_cuda_begin_step(G));
    m.outs[R - 1] = -1;
    mini_step(&m, 3, 100);
    float tmp[4];
    CHECK_OK(G->ops->to_host(G, tmp, m.h, sizeof tmp));
    CHECK_OK(sn_cuda_end_step(G));
    CHECK(m.outs[R - 1] >= 0 && m.outs[R - 1] < m.H);
    free(nw); free(qw); free(gw); free(hs_e); free(hs_g);
    dfree(m.qkn_w); dfree(m.qn); dfree(m.kn); dfree(m.gn_w); dfree(m.ga);
    tw_free(&m.emb); tw_free(&m.wq); tw_free(&m.wk); tw_free(&m.wv); tw_free(&m.wo);
    tw_free(&m.wg); tw_free(&m.wu); tw_free(&m.wd);
    dfree(m.mg); dfree(m.mu); dfree(m.ma);
    dfree(m.norm_w); dfree(m.inv_freq); dfree(m.h); dfree(m.xn); dfree(m.q); dfree(m.k); dfree(m.v);
    dfree(m.att); dfree(m.o); dfree(m.kc); dfree(m.vc);
}

static void graph_case(int H, int R, int qkn) { graph_case_g(H, R, qkn, 0); }

static void test_graph_replay(void)
{
    /* Q8 gate/up of 2048 columns (the 35B-A3B router's format and width), norm folded */
    g_mlp_dt = SN_DT_Q8;
    graph_case(2048, 1, 0);
    graph_case(2048, 4, 0);
    g_mlp_dt = SN_DT_Q4;
    /* the integer GEMV at every size (its digits pass folds the norm and the swiglu) */
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", 0));
    graph_case(256, 1, 0);
    graph_case(5120, 1, 0);
    graph_case(256, 3, 0);
    graph_case(5120, 6, 0);
    /* by shape: at H = 256 the fp32 GEMV (norm folded, swiglu run before it) */
    CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", -1));
    graph_case(256, 1, 0);
    graph_case(256, 8, 0);
    /* q/k norms before a partial RoPE, unfused and fused into one launch
     * (fuse_attn_prep=1, the default, last) */
    for (int f = 0; f <= 1; f++) {
        CHECK_OK(sn_cuda_tune(G, "fuse_attn_prep", f));
        graph_case(256, 1, 1);
        graph_case(256, 5, 1);
    }
    /* a gated norm before wo folded into its launch, an output gate into
     * the attention combine (fuse_gate, default), and each run as its own
     * kernel: both integer GEMV forms, 1 and several rows */
    for (int f = 1; f >= 0; f--) {
        CHECK_OK(sn_cuda_tune(G, "fuse_gate", f));
        CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", 0));
        graph_case_g(5120, 1, 0, 1);
        graph_case_g(256, 6, 1, 1);
        CHECK_OK(sn_cuda_tune(G, "gemv_i8_min_kb", -1));
        graph_case_g(256, 1, 1, 1);
        graph_case_g(5120, 5, 0, 1);
        graph_case_g(256, 1, 1, 2);
        graph_case_g(256, 7, 1, 2);
    }
    CHECK_OK(sn_cuda_tune(G, "fuse_gate", 1));
    /* a Q8 gate/up under 2 MB (384 x 256) goes without the PDL edge by
     * default, with it at pdl_min_kb=0 (every Q4 kernel has it either way):
     * the same bits both ways */
    g_mlp_dt = SN_DT_Q8;
    for (int kb = 0; kb <= 2048; kb += 2048) {
        CHECK_OK(sn_cuda_tune(G, "pdl_min_kb", kb));
        graph_case(256, 1, 0);
        graph_case(256, 4, 0);
    }
    /* every matrix 8-bit, the small ones through k_gemv_q8s (the default),
     * then all through k_gemv: q/k/v grouped with the norm folded, o and
     * down with the residual add folded (at H = 256 all are small; at 2048
     * only q/k/v are) */
    g_rest_dt = SN_DT_Q8;
    for (int q8s = 1024; q8s >= 0; q8s -= 1024) {
        CHECK_OK(sn_cuda_tune(G, "gemv_q8s_rows", q8s));
        graph_case(256, 1, 0);
        graph_case(256, 5, 1);
        graph_case(2048, 1, 0);
    }
    g_rest_dt = SN_DT_Q4;
    CHECK_OK(sn_cuda_tune(G, "gemv_q8s_rows", 1024));
    g_mlp_dt = SN_DT_Q4;
    CHECK(sn_cuda_tune(G, "pdl_min_kb", -1) == SN_E_INVALID);
    /* the small kernels on the edge too (pdl_small, every bit): the gated
     * norm, the decode attention and its combine, the attention prep, the
     * stream-K GEMV's x digits (H = 5120: down and o take that GEMV) */
    CHECK_OK(sn_cuda_tune(G, "pdl_small", 63));
    graph_case(256, 1, 0);
    graph_case(256, 4, 1);
    graph_case_g(256, 1, 1, 1);
    graph_case(5120, 1, 0);
    graph_case(5120, 3, 0);
    CHECK_OK(sn_cuda_tune(G, "pdl_small", 0));
    CHECK(sn_cuda_tune(G, "pdl_small", 64) == SN_E_INVALID);
}

/* every environment knob the backend reads refuses a malformed value by
 * name at creation, and SANCTUM_CUDA_GEMM takes each of its values (the
 * variables are restored after: a run may set them) */
static void test_env_knobs(void)
{
    static const struct { const char *name, *value; } bad[] = {
        { "SANCTUM_CUDA_PDL", "3" },          { "SANCTUM_CUDA_PDL_SMALL", "64" },
        { "SANCTUM_CUDA_GEMM", "fp8" },       { "SANCTUM_CUDA_GEMV", "int" },
        { "SANCTUM_CUDA_PREFILL", "chunked" }, { "SANCTUM_CUDA_PREFILL_MIN_T", "0" },
        { "SANCTUM_CUDA_PREFILL_MIN_T", "64x" }, { "SANCTUM_CUDA_GDN_TC", "on" },
        { "SANCTUM_CUDA_CUBLAS", "no" },      { "SANCTUM_CUDA_MOE_REPACK", "2" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *was = getenv(bad[i].name);
        char *keep = was ? strdup(was) : NULL;
        setenv(bad[i].name, bad[i].value, 1);
        sn_backend *b = NULL;
        const sn_status st = sn_backend_cuda_new(0, &b);
        CHECKF(st == SN_E_INVALID && !b && strstr(sn_errmsg(), bad[i].name), "%s=%s: not refused by name (%d)",
               bad[i].name, bad[i].value, (int)st);
        if (b)
            sn_backend_free(b);
        if (keep)
            setenv(bad[i].name, keep, 1);
        else
            unsetenv(bad[i].name);
        free(keep);
    }
    /* and takes every value it documents */
    static const char *gemm[] = { "i8", "i8fast", "hilo", "split", "fast" };
    const char *was = getenv("SANCTUM_CUDA_GEMM");
    char *keep = was ? strdup(was) : NULL;
    for (size_t i = 0; i < sizeof gemm / sizeof *gemm; i++) {
        setenv("SANCTUM_CUDA_GEMM", gemm[i], 1);
        sn_backend *b = NULL;
        const sn_status st = sn_backend_cuda_new(0, &b);
        CHECKF(st == SN_OK && b, "SANCTUM_CUDA_GEMM=%s: refused (%d: %s)", gemm[i], (int)st, sn_errmsg());
        if (b)
            sn_backend_free(b);
    }
    if (keep)
        setenv("SANCTUM_CUDA_GEMM", keep, 1);
    else
        unsetenv("SANCTUM_CUDA_GEMM");
    free(keep);
}

int main(void)
{
    sn_status st = sn_backend_cuda_new(0, &G);
    if (st != SN_OK) {
        fprintf(stderr, "SKIP test_cuda_ops: %s\n", sn_errmsg());
        return TEST_END();
    }
    if (sn_backend_cpu_new_isa(1, SN_ISA_SCALAR, &C) != SN_OK) {
        fprintf(stderr, "cpu oracle: %s\n", sn_errmsg());
        return 1;
    }
    char name[128];
    size_t used = 0, total = 0;
    sn_cuda_info(G, name, sizeof name, &used, &total, NULL);
    fprintf(stderr, "device: %s, %.1f / %.1f GiB in use\n", name, used / 1073741824.0, total / 1073741824.0);
    RUN(test_matmul_q4);
    RUN(test_matmul_q8);
    RUN(test_matmul_q4_gemv_i8);
    RUN(test_gemv_batch_invariant);
    RUN(test_gemv_ring_forms);
    RUN(test_gemv_pool);
    RUN(test_gemv_sk_pool);
    RUN(test_gemv_stamps);
    RUN(test_matmul_dense);
    RUN(test_matmul_errors);
    RUN(test_embed);
    RUN(test_norms);
    RUN(test_elementwise);
    RUN(test_copy_n);
    RUN(test_add_gated);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_attention_prefill_vs_decode);
    RUN(test_attention_decode_batch_invariant);
    RUN(test_gdn);
    RUN(test_gdn_gnorm_graph);
    RUN(test_gdn_layer_graph);
    RUN(test_gemv_rl);
    RUN(test_moe);
    RUN(test_argmax);
    RUN(test_graph_replay);
    RUN(test_env_knobs);
    if (G->ops->sync(G) != SN_OK) {
        fprintf(stderr, "final sync: %s\n", sn_errmsg());
        t_failed++;
    }
    sn_backend_free(G);
    sn_backend_free(C);
    return TEST_END();
}

#else

int main(void)
{
    fprintf(stderr, "SKIP test_cuda_ops: built without CUDA (SN_CUDA=0 or no nvcc)\n");
    return TEST_END();
}

#endif
