/* Dtype conversions and MLX affine quantization: packing layout, the
 * reference quantizer on hand-computed groups, dequantization of whole
 * matrices and expert stacks. */
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"
#include "sanctum/quant.h"
#ifdef SN_HAVE_CUDA
#include "backend/cuda/sn_cuda.h"
#endif

static float f32_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_dtypes(void)
{
    CHECK(sn_dtype_size(SN_DT_F32) == 4 && sn_dtype_size(SN_DT_BF16) == 2 && sn_dtype_size(SN_DT_I8) == 1 &&
          sn_dtype_size(SN_DT_U32) == 4 && sn_dtype_size(SN_DT_Q4) == 0);
    CHECK(strcmp(sn_dtype_name(SN_DT_BF16), "BF16") == 0 && strcmp(sn_dtype_name(SN_DT_Q8), "Q8") == 0);
    /* bf16: round half to even */
    CHECK(sn_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(sn_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);          /* tie -> even (down) */
    CHECK(sn_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);      /* tie -> even (up) */
    CHECK(sn_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81); /* above the tie */
    CHECK(sn_f32_to_bf16(-2.5f) == 0xc020);
    CHECK(isnan(sn_bf16_to_f32(sn_f32_to_bf16(f32_of(0x7f800001u)))));  /* NaN with low payload stays NaN */
    CHECK(isinf(sn_bf16_to_f32(sn_f32_to_bf16(INFINITY))));
    CHECK(sn_bf16_to_f32(sn_f32_to_bf16(3.0e38f)) == INFINITY || sn_bf16_to_f32(sn_f32_to_bf16(3.0e38f)) > 2.9e38f);
    /* f16: every finite half survives f16 -> f32 -> f16; NaNs stay NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sn_f16_to_f32((uint16_t)h);
        if (isnan(f)) bad += !isnan(sn_f16_to_f32(sn_f32_to_f16(f)));
        else bad += sn_f32_to_f16(f) != h;
    }
    CHECK(bad == 0);
    CHECK(sn_f16_to_f32(0x3c00) == 1.0f && sn_f16_to_f32(0x0001) == 0x1p-24f && sn_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(sn_f32_to_f16(65519.0f) == 0x7bff && sn_f32_to_f16(65520.0f) == 0x7c00);  /* overflow edge */
    CHECK(sn_f32_to_f16(0x1p-25f) == 0x0000);                 /* tie with 0 -> even (0) */
    CHECK(sn_f32_to_f16(3 * 0x1p-25f) == 0x0002);             /* 1.5 ulp -> 2 (even) */
    CHECK(sn_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);          /* tie -> even */
    CHECK(sn_f32_to_f16(-0.0f) == 0x8000);
    uint16_t b3[3] = {0x3f80, 0xc000, 0x0000};
    float f3[2] = {0.25f, -8.0f};
    uint16_t h2[1] = {0xc400};
    CHECK(sn_load_f32(b3, SN_DT_BF16, 1) == -2.0f && sn_load_f32(f3, SN_DT_F32, 1) == -8.0f &&
          sn_load_f32(h2, SN_DT_F16, 0) == -4.0f);
    sn_weight w = {.dtype = SN_DT_Q4, .rows = 16, .cols = 128, .group = 64, .sdtype = SN_DT_BF16};
    CHECK(sn_weight_bytes(&w) == 16 * 128 / 2 + 2 * 16 * 2 * 2);
    sn_weight d = {.dtype = SN_DT_BF16, .rows = 3, .cols = 5};
    CHECK(sn_weight_bytes(&d) == 30);
}

static void test_pack_layout(void)
{
    uint8_t q[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t p[2];
    sn_q_pack_row(q, 4, 8, p);
    CHECK(p[0] == 0x87654321u);   /* element 0 in the low nibble */
    sn_q_pack_row(q, 8, 8, p);
    CHECK(p[0] == 0x04030201u && p[1] == 0x08070605u);
    uint8_t back[8];
    uint32_t w4 = 0xfedcba98u;
    sn_q_unpack_row(&w4, 4, 8, back);
    CHECK(back[0] == 8 && back[1] == 9 && back[7] == 15);
    /* random round trip */
    uint8_t big[256], out[256];
    uint32_t pk[64];
    srand(7);
    for (int bits = 4; bits <= 8; bits += 4) {
        for (int i = 0; i < 256; i++) big[i] = (uint8_t)(rand() & ((1 << bits) - 1));
        sn_q_pack_row(big, bits, 256, pk);
        sn_q_unpack_row(pk, bits, 256, out);
        CHECK(memcmp(big, out, 256) == 0);
    }
}

/* Quantize one group (F32 scales so the check is on the fp32 arithmetic). */
static void quant1(const float *w, int bits, int group, uint8_t *q, float *s, float *b)
{
    uint32_t pk[32];
    CHECK_OK(sn_q_quantize(w, 1, group, bits, group, SN_DT_F32, pk, s, b));
    sn_q_unpack_row(pk, bits, group, q);
}

static void test_quantize_hand(void)
{
    float w[128];
    uint8_t q[128];
    float s, b;
    /* |min| > |max|: positive scale, bias = min; integers make every step exact */
    for (int i = 0; i < 32; i++) w[i] = -15.0f + (float)(i % 16);   /* -15 .. 0 */
    w[5] = -12.5f;   /* (w - bias)/s = 2.5 -> rint half to even -> 2 */
    w[6] = -11.5f;   /* 3.5 -> 4 */
    quant1(w, 4, 32, q, &s, &b);
    CHECK(s == 1.0f && b == -15.0f);
    CHECK(q[0] == 0 && q[15] == 15 && q[3] == 3 && q[5] == 2 && q[6] == 4);

    /* |min| <= |max|: the scale is negative, bias = max, zero exact */
    for (int i = 0; i < 32; i++) w[i] = -0.5f + 2.0f * (float)i / 31.0f;   /* -0.5 .. 1.5 */
    w[7] = 0.0f;
    quant1(w, 4, 32, q, &s, &b);
    float s0 = -2.0f / 15.0f;
    float q0 = rintf(1.5f / s0);   /* -11 */
    CHECK(q0 == -11.0f);
    CHECK(s < 0 && s == 1.5f / q0 && b == 1.5f);
    CHECK(q[31] == 0);             /* w = max = bias */
    CHECK(q[0] == 15);             /* (-0.5-1.5)/s = 14.67 -> 15 */
    CHECK(q[7] == 11);             /* zero maps to -q0 exactly */
    CHECK(fabsf(s * (float)q[7] + b) < 1e-6f);
    for (int i = 0; i < 32; i++) CHECK(fabsf(s * (float)q[i] + b - w[i]) <= fabsf(s) * 0.5f + 1e-6f);

    /* all zero: scale clamps to 1e-7 (negated), q0 = 0 -> bias 0 */
    memset(w, 0, sizeof w);
    quant1(w, 8, 64, q, &s, &b);
    CHECK(s == -1e-7f && b == 0.0f && q[0] == 0 && q[63] == 0);

    /* 8-bit, group 128: |min| > |max| with a non-integer scale */
    for (int i = 0; i < 128; i++) w[i] = -1.0f + 1.5f * (float)i / 127.0f;   /* -1 .. 0.5 */
    quant1(w, 8, 128, q, &s, &b);
    float sr = 1.5f / 255.0f;
    float qq = rintf(-1.0f / sr);
    CHECK(s == -1.0f / qq && b == -1.0f && s > 0);
    CHECK(q[0] == 0 && q[127] == (uint8_t)rintf((0.5f + 1.0f) / s));
    for (int i = 0; i < 128; i++) CHECK(fabsf(s * (float)q[i] + b - w[i]) <= s * 0.5f + 1e-6f);

    /* bf16 storage: the stored scale is the bf16 rounding of the fp32 one */
    for (int i = 0; i < 32; i++) w[i] = -0.5f + 2.0f * (float)i / 31.0f;
    uint32_t pk[4];
    uint16_t sb, bb;
    CHECK_OK(sn_q_quantize(w, 1, 32, 4, 32, SN_DT_BF16, pk, &sb, &bb));
    CHECK(sb == sn_f32_to_bf16(1.5f / -11.0f) && bb == sn_f32_to_bf16(1.5f));
    /* non-finite input and bad shapes are refused */
    w[3] = NAN;
    CHECK(sn_q_quantize(w, 1, 32, 4, 32, SN_DT_F32, pk, &s, &b) == SN_E_INVALID && strstr(sn_errmsg(), "col 3"));
    CHECK(sn_q_quantize(w, 1, 32, 3, 32, SN_DT_F32, pk, &s, &b) == SN_E_UNSUPPORTED);
    CHECK(sn_q_quantize(w, 1, 48, 4, 32, SN_DT_F32, pk, &s, &b) == SN_E_SHAPE);
    CHECK(sn_q_check_shape(4, 64, 4, 48, "blk.w") == SN_E_UNSUPPORTED && strstr(sn_errmsg(), "blk.w"));
    CHECK(sn_q_check_shape(4, 64, 8, 64, "blk.w") == SN_OK);
    CHECK(sn_q_supported(4, 128) && sn_q_supported(8, 32) && !sn_q_supported(2, 64) && !sn_q_supported(4, 16));
}

/* A matrix with an odd number of groups per row, quantized then read back
 * through sn_weight (plain and as expert 1 of a stack). */
static void test_dequant_matrix(void)
{
    for (int bits = 4; bits <= 8; bits += 4) {
        const int rows = 5, group = 32, cols = 3 * group, E = 2;
        float *w = malloc(sizeof(float) * E * rows * cols), *out = malloc(sizeof(float) * rows * cols);
        uint32_t *pk = malloc(4 * (size_t)(E * rows * cols * bits / 32));
        uint16_t *sc = malloc(2 * E * rows * 3), *bi = malloc(2 * E * rows * 3);
        srand(11);
        for (int i = 0; i < E * rows * cols; i++) w[i] = ((float)rand() / RAND_MAX - 0.5f) * (1 + i % 7);
        CHECK_OK(sn_q_quantize(w, E * rows, cols, bits, group, SN_DT_BF16, pk, sc, bi));
        sn_weight W = {.dtype = bits == 4 ? SN_DT_Q4 : SN_DT_Q8, .rows = rows, .cols = cols, .n_experts = E,
                       .group = group, .data = pk, .scales = sc, .qbiases = bi, .sdtype = SN_DT_BF16};
        CHECK_OK(sn_weight_to_f32(&W, 1, out));
        double maxerr = 0;
        int exact = 1;
        uint8_t q[96];
        for (int r = 0; r < rows; r++) {
            int R = rows + r;   /* row within the stack */
            sn_q_unpack_row(pk + R * cols * bits / 32, bits, cols, q);
            for (int c = 0; c < cols; c++) {
                int g = R * 3 + c / group;
                float ref = sn_bf16_to_f32(sc[g]) * (float)q[c] + sn_bf16_to_f32(bi[g]);
                exact &= out[r * cols + c] == ref;
                float range = 0;
                for (int k = 0; k < group; k++) {
                    float a = fabsf(w[R * cols + (c / group) * group + k]);
                    range = a > range ? a : range;
                }
                double err = fabs(out[r * cols + c] - w[R * cols + c]) / (2 * range / ((1 << bits) - 1));
                maxerr = err > maxerr ? err : maxerr;
            }
        }
        CHECK(exact);
        /* half a step, plus the bf16 rounding of scale and bias, which at
         * 8 bits (255 steps) is worth about a step on its own */
        CHECKF(maxerr <= (bits == 4 ? 0.55 : 1.6), "bits %d: max error %.3f steps", bits, maxerr);
        CHECK(sn_weight_to_f32(&W, 2, out) == SN_E_RANGE);
        CHECK(sn_weight_row_f32(&W, 0, rows, out) == SN_E_RANGE);
        W.sdtype = SN_DT_U8;   /* a forged file's scales dtype must not reach sn_load_f32 */
        CHECK(sn_weight_row_f32(&W, 0, 0, out) == SN_E_UNSUPPORTED);
        W.sdtype = SN_DT_BF16;
        /* dense bf16 path */
        uint16_t dv[6] = {0x3f80, 0x4000, 0x4040, 0xbf80, 0, 0x3f00};
        sn_weight D = {.dtype = SN_DT_BF16, .rows = 2, .cols = 3, .data = dv};
        float o6[6];
        CHECK_OK(sn_weight_to_f32(&D, 0, o6));
        CHECK(o6[0] == 1.0f && o6[2] == 3.0f && o6[3] == -1.0f && o6[5] == 0.5f);
        free(w); free(out); free(pk); free(sc); free(bi);
    }
}

/* The CUDA decode GEMVs' digit form of x (sn_cuda_digits_host runs the
 * kernels' own helpers on the host): per quant group e2 = 22 - e with
 * max|x| = m * 2^e (frexp), X = round-half-even(x * 2^e2) = 65536*d0 +
 * 256*d1 + d2 exactly, |X| <= 2^22, each digit an int8. Groups of
 * every kind: mixed signs and magnitudes, ties, zeros, subnormals, a
 * group whose maximum is a power of two, one at the clamp. */
static void test_cuda_digits(void)
{
#ifndef SN_HAVE_CUDA
    SKIP("built without CUDA");
#else
    enum { G = 64, NG = 12, C = G * NG };
    static float x[C];
    static int8_t pl[3 * C];
    int e2[NG];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < C; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const float u = (float)(r >> 40) / (float)(1u << 24) * 2.f - 1.f;
        const int g = i / G;
        x[i] = g == 0 ? 0.f                                   /* all zero */
             : g == 1 ? u * 0x1p-140f                          /* subnormal */
             : g == 2 ? (i % G == 5 ? -0x1p+3f : u * 8.f)      /* max a power of two, negative */
             : g == 3 ? ldexpf(u, (int)(r % 40) - 20)          /* magnitudes over 2^40 */
             : g == 4 ? (float)((int)(r % 9) - 4) * 0.5f + 0.25f /* halves: ties after scaling */
             : g == 5 ? u * 0x1p+120f                          /* near the clamp */
             : u * (float)(g * g);
    }
    sn_cuda_digits_host(x, C, G, pl, e2);
    int bad = 0, badmax = 0;
    for (int g = 0; g < NG; g++) {
        float mx = 0.f;
        for (int i = 0; i < G; i++)
            mx = fmaxf(mx, fabsf(x[g * G + i]));
        int e = 0;
        if (mx > 0.f)
            (void)frexpf(mx, &e); /* a subnormal maximum: clamped to 100 either way (see xd_exp) */
        const int want = mx > 0.f ? (22 - e > 100 ? 100 : 22 - e < -100 ? -100 : 22 - e) : 0;
        CHECKF(e2[g] == want, "group %d: e2 %d, want %d", g, e2[g], want);
        long amax = 0;
        for (int i = g * G; i < (g + 1) * G; i++) {
            const long X = 65536L * pl[i] + 256L * pl[C + i] + pl[2 * C + i];
            const double ref = nearbyint(ldexp((double)x[i], e2[g])); /* exact product; half to even */
            bad += (double)X != ref || labs(X) > (1L << 22);
            amax = labs(X) > amax ? labs(X) : amax;
        }
        /* 23 bits of the group's maximum where it is normal and in range */
        if (mx >= 0x1p-100f && mx < 0x1p+100f)
            badmax += !(amax >= (1L << 21) && amax <= (1L << 22));
    }
    CHECKF(bad == 0, "%d values whose digits are not round(x * 2^e2)", bad);
    CHECKF(badmax == 0, "%d groups whose largest |X| is not in [2^21, 2^22]", badmax);
#endif
}

/* The stream-K GEMV's work split (sn_cuda_sk_split_check runs gk_plan and
 * checks what k_gemv_sk relies on: every warp has units, warp_of inverts
 * first, a row tile's pieces come from consecutive warps that begin inside
 * it): the decode matrices of the two benchmark models alone and grouped,
 * the lm_head, shapes smaller than a warp per 8 units (the 16 x 256 case
 * that once left a tile a piece short), odd row counts, on an H200/H100
 * (132 SMs), an H100 PCIe (114) and tiny devices, 1 and 2 blocks an SM,
 * 1 to 4 virtual warps a warp (gemv_sk_vw; where the pool form applies,
 * every resident warp has a virtual warp of its own). */
static void test_cuda_sk_split(void)
{
#ifndef SN_HAVE_CUDA
    SKIP("built without CUDA");
#else
    static const struct {
        int n;
        int64_t rows[4], cols;
    } cases[] = {
        { 1, { 5120 }, 17408 },              /* 27B down */
        { 1, { 5120 }, 6144 },               /* 27B out */
        { 1, { 248320 }, 5120 },             /* 27B lm_head */
        { 3, { 6144, 1024, 1024 }, 5120 },   /* q/k/v-like group */
        { 2, { 17408, 17408 }, 5120 },       /* gate/up */
        { 1, { 16 }, 256 },                  /* 4 units */
        { 1, { 1 }, 64 },                    /* one unit */
        { 1, { 17 }, 192 },                  /* a partial last tile */
        { 4, { 33, 1, 4095, 80 }, 1088 },    /* odd segments */
        { 2, { 2048, 7 }, 64 * 263 },        /* a prime number of 64-column blocks */
    };
    static const int sms[] = { 132, 114, 1, 2, 7 };
    char why[256];
    int checked = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t m = 0; m < sizeof sms / sizeof sms[0]; m++)
            for (int bps = 1; bps <= 2; bps++)
                for (int vw = 1; vw <= 4; vw++) {
                    why[0] = 0;
                    const int bad = sn_cuda_sk_split_check(cases[c].rows, cases[c].n, cases[c].cols, sms[m], bps, vw,
                                                           why, sizeof why);
                    CHECKF(!bad, "case %zu, %d SMs, %d blocks an SM, %d virtual warps a warp: %s", c, sms[m], bps, vw,
                           why);
                    checked += !bad;
                }
    CHECK(checked == (int)(sizeof cases / sizeof cases[0] * sizeof sms / sizeof sms[0] * 2 * 4));
#endif
}

int main(void)
{
    RUN(test_dtypes);
    RUN(test_pack_layout);
    RUN(test_quantize_hand);
    RUN(test_dequant_matrix);
    RUN(test_cuda_digits);
    RUN(test_cuda_sk_split);
    return TEST_END();
}
