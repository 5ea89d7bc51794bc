/* bench/timeline.h, the reading of bench_cuda --timeline, on the CPU: the
 * kernel names cut out of real mangled names (as nm prints this build's
 * kernels, which CUPTI reports), and the exposed times of hand-made steps
 * (a chain with launch gaps, a prologue overlapping under PDL, a kernel
 * inside the one before it), which must sum to the step's span. */
#include <stdint.h>

#include "harness.h"
#include "../bench/timeline.h"

static void name_case(const char *mangled, const char *want)
{
    char got[64];
    tl_short_name(mangled, got, sizeof got);
    CHECKF(!strcmp(got, want), "'%s' -> '%s', want '%s'", mangled, got, want);
}

static void test_short_name(void)
{
    /* the namespace hash's last digits run into the length: 8L12k_.., 3714k_.. */
    name_case("_ZN44_GLOBAL__N__92318960_11_cuda_moe_cu_24d02dc0L12k_md_gate_upILi4ELi16ELi4EEEvNS_10md_gu_argsE",
              "k_md_gate_up");
    name_case("_ZN44_GLOBAL__N__483b207b_11_cuda_ops_cu_7113f43714k_attn_combineEPKfiiPfS1_", "k_attn_combine");
    name_case("_ZN45_GLOBAL__N__e0b5810f_12_cuda_gemv_cu_2ae61158L10k_gemv_q8sILi1EEEv8gemv_segillliiPKfi",
              "k_gemv_q8s");
    name_case("_ZN44_GLOBAL__N__483b207b_11_cuda_ops_cu_7113f43716k_gdn_after_convILi32EEEvPKfiiiifS2_S2_S2_S2_"
              "PfiS3_S3_mi",
              "k_gdn_after_conv");
    name_case("_Z8k_argmaxPKfiP6float2", "k_argmax");
    name_case("_Z5k_foov", "k_foo");     /* no parameters: 'v' follows, the only length there is */
    name_case("k_plain(int, float)", "k_plain");
    name_case("void gemm_kernel<float, 128>(Params)", "void gemm_kernel");
    char small[6];
    tl_short_name("_Z11k_md_down_xPKf", small, sizeof small); /* cut to fit */
    CHECK(!strcmp(small, "k_md_"));
    tl_short_name(NULL, small, sizeof small);
    CHECK(small[0] == '\0');
}

/* exposed times and gaps against the expected ones; the exposed times
 * must sum to the span */
static void exposed_case(const uint64_t *s, const uint64_t *e, int n, const uint64_t *want, const int64_t *wgap,
                         uint64_t span)
{
    uint64_t ex[16], sum = 0;
    int64_t gap[16];
    int order[16];
    const uint64_t got = tl_exposed(s, e, n, ex, gap, order);
    CHECKF(got == span, "span %llu, want %llu", (unsigned long long)got, (unsigned long long)span);
    for (int i = 0; i < n; i++) {
        CHECKF(ex[i] == want[i], "kernel %d: exposed %llu, want %llu", i, (unsigned long long)ex[i],
               (unsigned long long)want[i]);
        CHECKF(gap[i] == wgap[i], "kernel %d: gap %lld, want %lld", i, (long long)gap[i], (long long)wgap[i]);
        sum += ex[i];
    }
    CHECKF(sum == span, "exposed times sum to %llu, span %llu", (unsigned long long)sum, (unsigned long long)span);
    for (int j = 1; j < n; j++)
        CHECK(s[order[j - 1]] <= s[order[j]]);
}

static void test_exposed(void)
{
    /* a chain with launch gaps: each gap is the next kernel's */
    const uint64_t s1[] = { 100, 130, 190 }, e1[] = { 120, 180, 200 }, w1[] = { 20, 60, 20 };
    const int64_t g1[] = { 0, 10, 10 };
    exposed_case(s1, e1, 3, w1, g1, 100);
    /* PDL: the second starts (its prologue) before the first ends; only its tail shows */
    const uint64_t s2[] = { 0, 40, 90 }, e2[] = { 50, 80, 95 }, w2[] = { 50, 30, 15 };
    const int64_t g2[] = { 0, -10, 10 };
    exposed_case(s2, e2, 3, w2, g2, 95);
    /* a kernel that ends inside the one before it adds nothing */
    const uint64_t s3[] = { 10, 20, 70 }, e3[] = { 60, 30, 90 }, w3[] = { 50, 0, 30 };
    const int64_t g3[] = { 0, -40, 10 };
    exposed_case(s3, e3, 3, w3, g3, 80);
    /* listed out of order, equal starts and ends: the first listed takes the time */
    const uint64_t s4[] = { 50, 0, 0 }, e4[] = { 70, 40, 40 }, w4[] = { 30, 40, 0 };
    const int64_t g4[] = { 10, 0, -40 };
    exposed_case(s4, e4, 3, w4, g4, 70);
    /* one kernel; none; a kernel that ends before it starts */
    const uint64_t s5[] = { 5 }, e5[] = { 9 }, w5[] = { 4 };
    const int64_t g5[] = { 0 };
    exposed_case(s5, e5, 1, w5, g5, 4);
    uint64_t ex[2];
    int order[2];
    CHECK(tl_exposed(s5, e5, 0, ex, NULL, order) == 0);
    const uint64_t s6[] = { 5, 10 }, e6[] = { 9, 8 };
    CHECK(tl_exposed(s6, e6, 2, ex, NULL, order) == 0);
}

/* three steps of three kernels (0-30, 100-140, 300-330), listed out of
 * order, the last with a kernel that starts before the one ahead ends */
static void test_last_step(void)
{
    const uint64_t s[] = { 300, 0, 108, 100, 10, 20, 310, 130, 305 };
    const uint64_t e[] = { 308, 9, 125, 105, 18, 30, 330, 140, 309 };
    int idx[9], order[9];
    int k = tl_last_step_by_gap(s, e, 9, 20, idx, order);
    CHECKF(k == 3, "last step of %d kernels, want 3", k);
    if (k == 3) CHECK(idx[0] == 0 && idx[1] == 8 && idx[2] == 6);
    /* without the ninth kernel the last step is 300-308 then 310-330: a
     * threshold under its own launch gap of 2 splits it */
    k = tl_last_step_by_gap(s, e, 8, 20, idx, order);
    CHECKF(k == 2 && idx[0] == 0 && idx[1] == 6, "8 kernels, threshold 20: %d kernels", k);
    k = tl_last_step_by_gap(s, e, 8, 1, idx, order);
    CHECKF(k == 1 && idx[0] == 6, "8 kernels, threshold 1: %d kernels", k);
    /* one kernel; none */
    CHECK(tl_last_step_by_gap(s, e, 1, 20, idx, order) == 1 && idx[0] == 0);
    CHECK(tl_last_step_by_gap(s, e, 0, 20, idx, order) == 0);
}

int main(void)
{
    RUN(test_short_name);
    RUN(test_exposed);
    RUN(test_last_step);
    return TEST_END();
}
