/* AVX2 + FMA + F16C kernels; compiled with those flags and only reached
 * through cpu_kernels_avx2 once the CPU check passed. Bodies are in
 * kernels_simd.h, except the exact integer Q4 path and the opt-in 8-bit
 * activation Q4 path below. The AVX-512 table has both only with VNNI
 * (kernels_avx512_vnni.c: the integer path on the x records prepared here,
 * the 8-bit one with its own); without it, its float Q4 kernel. */
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_internal.h"

static inline float avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define V __m256
#define VW 8
#define V_ZERO() _mm256_setzero_ps()
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps((p), (v))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_SET1(s) _mm256_set1_ps(s)
#define V_REDUCE(v) avx2_hsum(v)
/* 8 bytes -> 16 nibbles: low nibbles are the even columns. */
#define Q4_DECODE(p, lo, hi) do { \
        __m256i v_ = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p))); \
        lo = _mm256_cvtepi32_ps(_mm256_and_si256(v_, _mm256_set1_epi32(0xF))); \
        hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v_, 4)); \
    } while (0)
#define Q8_DECODE(p, lo, hi) do { \
        __m128i b_ = _mm_loadu_si128((const __m128i *)(p)); \
        lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b_)); \
        hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b_, 8))); \
    } while (0)
#define BF16_LOAD(p) _mm256_castsi256_ps(_mm256_slli_epi32( \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define F16_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KNAME(x) avx2_##x
#define TB_MAX 2
#ifndef RB_GEMV /* overridable for tuning runs */
#define RB_GEMV 2
#endif

#include "backend/cpu/kernels_simd.h"

/* ---- Exact integer Q4 path (groups 32, 64, 128) ----
 *
 * On 128-bit-datapath cores (this project's AVX2-only KVM guest) the float
 * Q4 kernel is bound by its int->float conversions: 8 vcvtdq2ps per 64
 * weights. Here x is made integer instead, so the weights are multiplied as
 * bytes (vpmaddubsw) and only the per-group integer dot is converted: one
 * vcvtdq2ps per group and row, whatever the group. Q8 stays on the float
 * kernel (its u8 * s8 pairs, 2*255*128, would saturate vpmaddubsw), and so
 * do Q4 groups other than 32/64/128 (cpu_mm_plan_for).
 *
 * x preparation (q4i_prep), per token and group of G columns: with
 * frexpf(max |x|) = m * 2^e2, e = min(22 - e2, 100) (a zero max gives
 * e = 0; a lower clamp would never bind: e2 <= 128), X = rne(x * 2^e),
 * |X| < 2^22, the product by a power of two being exact. X is split into
 * balanced signed bytes
 *   d2 = ((X + 128) & 255) - 128, X1 = (X - d2) >> 8,
 *   d1 = ((X1 + 128) & 255) - 128, d0 = (X1 - d1) >> 8   (|d0| <= 64),
 * so X = 65536*d0 + 256*d1 + d2 (the decomposition of the CUDA integer
 * GEMV, cuda_matmul.cu k_x_digits). A token's record takes the place of
 * its cols floats in xp (4*cols bytes):
 *   bytes [3G*g, 3G*g + 3G): group g's planes d0, d1, d2 (G bytes each);
 *   then, from byte 3*cols, float es[ng] = 2^-e, float xb[ng] =
 *   (float)sum(X) * es and int32 sum[ng] (the exact group sum of X);
 *   3*cols + 12*ng <= 4*cols as G >= 32.
 * In each plane, chunks of min(G, 64) columns hold the even columns then
 * the odd ones: the order of the low and high nibbles of the MLX bytes
 * (byte b of a chunk holds columns 2b and 2b+1), so nothing is shuffled
 * per weight. For G = 32, groups 2k and 2k+1 are laid out together as one
 * group of 64 would be (bytes [192k, 192k + 192), each group with its own
 * e): the kernel then takes them as one unit (q4i_pair), which halves the
 * per-group widening work; a last odd group keeps a 32-column layout. A group with a non-finite x gets zero digits and
 * es = xb = NaN: its outputs become NaN (the float kernels' NaN or inf).
 *
 * Arithmetic per output y[t, r] (the same for every row/token blocking, so
 * GEMV == GEMM bitwise): per group g, with q the unsigned nibbles,
 *   per plane p: s16_p = sum over the group's 32-byte vectors k of
 *                maddubs(q_k, d_p,k)  (i16 lanes: |pair| <= 2*15*128,
 *                at most 4 vectors -> <= 15360: no saturation)
 *   I = 65536*W(s16_0) + 256*W(s16_1) + W(s16_2)  (i32 lanes, W = sum of
 *       the lane's two i16 halves; exact: |I| < 16 * 15 * 2^22 < 2^31)
 *   acc = fma(cvt_f32(I), c_g, acc)   (8 float lanes; c_g = s_g * es_g;
 *       for G = 32 two groups share one I, lanes 0-3 and 4-7, and one FMA
 *       by [c_g x4, c_g+1 x4], see q4i_pair)
 * The bias terms b_g * xb_g go to 8 lanes by group: for each block of 8
 * groups, bv = fma(b[8], xb[8], bv) (and c[8] = s[8] * es[8], a vector
 * product); the last ng % 8 groups, scalar: bt = bt + b_g * xb_g in group
 * order. y = hsum(acc + bv) + bt (hsum as avx2_hsum). So the roundings are
 * those of an fp32 kernel: each lane's i32->f32 conversion, the FMAs, the
 * bias terms; x keeps ~23 significant bits relative to its group's max. */

/* 2 or 4 vectors of 8 int32 (values in int8 range) -> 16 or 32 bytes in order */
AI __m128i q4i_pack16(__m256i a, __m256i b)
{
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}
AI __m256i q4i_pack32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The balanced digits of X (int32 lanes): X = 65536*d[0] + 256*d[1] + d[2] */
AI void q4i_digits(__m256i X, __m256i d[3])
{
    const __m256i h = _mm256_set1_epi32(128), m = _mm256_set1_epi32(255);
    d[2] = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(X, h), m), h);
    __m256i X1 = _mm256_srai_epi32(_mm256_sub_epi32(X, d[2]), 8);
    d[1] = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(X1, h), m), h);
    d[0] = _mm256_srai_epi32(_mm256_sub_epi32(X1, d[1]), 8);
}

AI void q4i_prep(const float *x, int64_t cols, float *xp, const int G)
{
    const int C = G < 64 ? G : 64; /* columns of one de-interleaved chunk */
    const int64_t ng = cols / G;
    int8_t *planes = (int8_t *)xp;
    uint8_t *meta = (uint8_t *)xp + 3 * cols;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), fmax = _mm256_set1_ps(FLT_MAX);
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        int8_t *rec = planes + 3 * G * g;
        __m256 mx = _mm256_setzero_ps(), fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (int i = 0; i < G; i += 8) {
            __m256 v = _mm256_and_ps(_mm256_loadu_ps(xg + i), absm);
            mx = _mm256_max_ps(mx, v);
            fin = _mm256_and_ps(fin, _mm256_cmp_ps(v, fmax, _CMP_LE_OQ)); /* false for inf, NaN */
        }
        const int bad = _mm256_movemask_ps(fin) != 0xFF;
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float mxs = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        int e = 0;
        if (mxs > 0.0f && !bad) {
            int e2;
            frexpf(mxs, &e2); /* mx < 2^e2 */
            e = 22 - e2 < 100 ? 22 - e2 : 100;
        }
        const __m256 p = _mm256_set1_ps(ldexpf(1.0f, e));
        const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(bad ? 0 : -1)); /* bad: X = 0 */
        __m256i sum = _mm256_setzero_si256();
        for (int c0 = 0; c0 < G; c0 += C) {
            /* per parity (even, odd columns of the chunk): C/16 vectors of X */
            __m256i d[2][4][3];
            for (int k = 0; k < C / 16; k++) {
                __m256 a = _mm256_and_ps(_mm256_loadu_ps(xg + c0 + 16 * k), keep);
                __m256 b = _mm256_and_ps(_mm256_loadu_ps(xg + c0 + 16 * k + 8), keep);
                /* [a0 a2 a4 a6 b0 b2 b4 b6] and the odd ones */
                __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
                __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
                /* rounds to nearest even (the default MXCSR mode) */
                __m256i Xe = _mm256_cvtps_epi32(_mm256_mul_ps(ev, p)), Xo = _mm256_cvtps_epi32(_mm256_mul_ps(od, p));
                sum = _mm256_add_epi32(sum, _mm256_add_epi32(Xe, Xo));
                q4i_digits(Xe, d[0][k]);
                q4i_digits(Xo, d[1][k]);
            }
            for (int par = 0; par < 2; par++)
                for (int pl = 0; pl < 3; pl++) {
                    int8_t *dst = rec + pl * G + c0 + par * (C / 2);
                    if (G == 32) {
                        /* groups 2k and 2k+1 share one 64-column unit laid out as
                         * a group of 64 (each with its own e); a last odd group
                         * has a unit of its own */
                        const int U = (g & 1) || g + 1 < ng ? 64 : 32;
                        dst = planes + 96 * (g & ~(int64_t)1) + pl * U + par * (U / 2) + (g & 1) * 16;
                    }
                    if (C == 64)
                        _mm256_storeu_si256((__m256i *)dst, q4i_pack32(d[par][0][pl], d[par][1][pl], d[par][2][pl],
                                                                         d[par][3][pl]));
                    else
                        _mm_storeu_si128((__m128i *)dst, q4i_pack16(d[par][0][pl], d[par][1][pl]));
                }
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        const int32_t isum = _mm_cvtsi128_si32(s4);
        float es = bad ? NAN : ldexpf(1.0f, -e), xb = bad ? NAN : (float)isum * es;
        memcpy(meta + 4 * g, &es, 4);
        memcpy(meta + 4 * (ng + g), &xb, 4);
        memcpy(meta + 4 * (2 * ng + g), &isum, 4);
    }
}

static void avx2_prep_q4i_32(const float *x, int64_t cols, float *xp) { q4i_prep(x, cols, xp, 32); }
static void avx2_prep_q4i_64(const float *x, int64_t cols, float *xp) { q4i_prep(x, cols, xp, 64); }
static void avx2_prep_q4i_128(const float *x, int64_t cols, float *xp) { q4i_prep(x, cols, xp, 128); }

/* ---- Opt-in Q4 path with 8-bit activations (SANCTUM_CPU_Q4=q8) ----
 *
 * The Q8_0-style approximation of llama.cpp's CPU backend, for speed where
 * the exact path's three vpmaddubsw per 32 weights bind: x is quantized per
 * token and weight group to one signed byte plane, and the same tile code
 * as above (q4i_tile with P = 1) takes one vpmaddubsw per 32 weights and
 * one vpmaddwd, conversion and FMA per group (per two groups for G = 32
 * and 64, see q4i_pair). Only the s_g * sum(q * x) part is approximated;
 * the bias part b_g * sum(x) uses the group's float sum of x.
 *
 * x preparation (q4x8_prep), per token and group g of G columns: with
 * m = max |x| over the group, d = m / 127 and X = rne(x * (127 / m)),
 * |X| <= 127 (a zero m gives X = 0, d = 0). Groups with m < 2^-64 are
 * first multiplied by 2^64 (exact) so 127 / m stays finite; d is then
 * (m * 2^64 / 127) * 2^-64, a subnormal (rounded) below m ~ 2^-119. The
 * per element error is |x - X*d| <= d/2 (1 + 2^-20), so
 *   |y - y_exact| <= sum_g |s_g| * d_g / 2 * sum_{i in g} q_i * (1 + 2^-20)
 * plus the fp32 rounding of the other paths (tests/test_backend_cpu.c
 * checks exactly that bound). Record of a token (4*cols bytes at xp):
 *   bytes [G*g, G*g + G): the plane of group g, in the exact path's column
 *   order (chunks of min(G, 64): even columns, then odd; for G = 32 the
 *   groups 2k, 2k+1 interleaved as one chunk of 64; for G = 64 the groups
 *   2k, 2k+1 as one unit of 128 bytes with g in the low 16 bytes of each
 *   32 and g+1 in the high ones (q4x8_unpack_pair64), one vpmaddwd,
 *   conversion and FMA per pair as for G = 32; a last odd group alone);
 *   then, from byte cols, float d[ng] and float xs[ng] = the group's sum
 *   of x (8 lanes summed in column order, then avx2_hsum; a float sum, as
 *   the float kernel's gsum, not the exact path's integer one).
 * A group with a non-finite x gets X = 0 and d = xs = NaN, so that token's
 * outputs are NaN, as on the exact path. */
AI void q4x8_prep(const float *x, int64_t cols, float *xp, const int G)
{
    const int C = G < 64 ? G : 64;
    const int64_t ng = cols / G;
    int8_t *plane = (int8_t *)xp;
    uint8_t *meta = (uint8_t *)xp + cols;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), fmax = _mm256_set1_ps(FLT_MAX);
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        __m256 mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps(), fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (int i = 0; i < G; i += 8) {
            __m256 v = _mm256_loadu_ps(xg + i);
            sum = _mm256_add_ps(sum, v);
            v = _mm256_and_ps(v, absm);
            mx = _mm256_max_ps(mx, v);
            fin = _mm256_and_ps(fin, _mm256_cmp_ps(v, fmax, _CMP_LE_OQ)); /* false for inf, NaN */
        }
        const int bad = _mm256_movemask_ps(fin) != 0xFF;
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        float pre = 1.0f, inv = 0.0f, d = 0.0f;
        if (m > 0.0f && !bad) {
            if (m < 0x1p-64f) {
                pre = 0x1p64f;
                m *= pre;
            }
            inv = 127.0f / m;
            d = (m / 127.0f) / pre;
        }
        const __m256 vpre = _mm256_set1_ps(pre), vinv = _mm256_set1_ps(inv);
        const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(bad ? 0 : -1));
        for (int c0 = 0; c0 < G; c0 += C) {
            __m256i X[2][4];
            for (int k = 0; k < C / 16; k++) {
                __m256 a = _mm256_and_ps(_mm256_loadu_ps(xg + c0 + 16 * k), keep);
                __m256 b = _mm256_and_ps(_mm256_loadu_ps(xg + c0 + 16 * k + 8), keep);
                __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
                __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
                X[0][k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(ev, vpre), vinv)); /* rne */
                X[1][k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(od, vpre), vinv));
            }
            for (int par = 0; par < 2; par++) {
                int8_t *dst = plane + G * g + c0 + par * (C / 2);
                if (G == 32) {
                    const int U = (g & 1) || g + 1 < ng ? 64 : 32;
                    dst = plane + 32 * (g & ~(int64_t)1) + par * (U / 2) + (g & 1) * 16;
                }
                if (G == 64 && ((g & 1) || g + 1 < ng)) { /* pairs of groups of 64, see q4x8_unpack_pair64 */
                    __m256i v = q4i_pack32(X[par][0], X[par][1], X[par][2], X[par][3]);
                    int8_t *u = plane + 64 * (g & ~(int64_t)1) + par * 32 + (g & 1) * 16;
                    _mm_storeu_si128((__m128i *)u, _mm256_castsi256_si128(v));
                    _mm_storeu_si128((__m128i *)(u + 64), _mm256_extracti128_si256(v, 1));
                    continue;
                }
                if (C == 64)
                    _mm256_storeu_si256((__m256i *)dst, q4i_pack32(X[par][0], X[par][1], X[par][2], X[par][3]));
                else
                    _mm_storeu_si128((__m128i *)dst, q4i_pack16(X[par][0], X[par][1]));
            }
        }
        float xs = bad ? NAN : avx2_hsum(sum);
        if (bad)
            d = NAN;
        memcpy(meta + 4 * g, &d, 4);
        memcpy(meta + 4 * (ng + g), &xs, 4);
    }
}

static void avx2_prep_q4x8_32(const float *x, int64_t cols, float *xp) { q4x8_prep(x, cols, xp, 32); }
static void avx2_prep_q4x8_64(const float *x, int64_t cols, float *xp) { q4x8_prep(x, cols, xp, 64); }
static void avx2_prep_q4x8_128(const float *x, int64_t cols, float *xp) { q4x8_prep(x, cols, xp, 128); }

/* The G/32 vectors of unsigned nibbles of one row's group, in the records'
 * column order: G = 32 is [low nibbles | high nibbles] of 16 bytes; else
 * per 32 bytes (64 columns) the low nibbles, then the high ones. */
AI void q4i_unpack(const uint8_t *w, __m256i *q, const int G)
{
    const __m256i nib = _mm256_set1_epi8(0x0F);
    if (G == 32) {
        __m128i b = _mm_loadu_si128((const __m128i *)w);
        q[0] = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1), nib);
        return;
    }
    for (int k = 0; k < G / 64; k++) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(w + 32 * k));
        q[2 * k] = _mm256_and_si256(b, nib);
        q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), nib);
    }
}

/* sum_k maddubs(q_k, d_k) over one plane of a group record: i16 lanes */
AI __m256i q4i_plane(const __m256i *q, const int8_t *d, const int G)
{
    __m256i s = _mm256_maddubs_epi16(q[0], _mm256_loadu_si256((const __m256i *)d));
#pragma GCC unroll 4
    for (int k = 1; k < G / 32; k++)
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(d + 32 * k))));
    return s;
}

/* I = 65536*W(t) + 256*W(m) + W(l) in i32 lanes, W(v) = vpmaddwd(v, 1)
 * (the sum of a lane's two i16 halves). Widening the top and middle
 * planes by AND/shift instead (no multiply) measured slower here. */
AI __m256i q4i_combine(__m256i t, __m256i m, __m256i l)
{
    const __m256i one = _mm256_set1_epi16(1);
    __m256i T = _mm256_slli_epi32(_mm256_madd_epi16(t, one), 16);
    __m256i M = _mm256_madd_epi16(m, _mm256_set1_epi16(256));
    return _mm256_add_epi32(_mm256_add_epi32(T, M), _mm256_madd_epi16(l, one));
}

/* The i32 lanes of one row's group dot with a token's record (G columns
 * here: one group, or a pair of groups of 32 or 64): P = 3 digit planes
 * (the exact path, q4i_combine) or P = 1 int8 plane (the 8-bit activation
 * path below: an i16 lane of q4i_plane is <= G/32 * 2*15*127 <= 15240 for
 * G <= 128, so its sum cannot saturate, and |X| <= 127 keeps each
 * vpmaddubsw pair below 2^15 too). */
AI __m256i q4i_dot(const __m256i *q, const int8_t *rec, const int G, const int P)
{
    if (P == 3)
        return q4i_combine(q4i_plane(q, rec, G), q4i_plane(q, rec + G, G), q4i_plane(q, rec + 2 * G, G));
    return _mm256_madd_epi16(q4i_plane(q, rec, G), _mm256_set1_epi16(1));
}

/* 8 consecutive scales (or biases) from index i, as floats */
AI __m256 q4i_load8(const uint8_t *p, sn_dtype dt, int64_t i)
{
    switch (dt) {
    case SN_DT_BF16: return BF16_LOAD((const uint16_t *)p + i);
    case SN_DT_F16: return F16_LOAD((const uint16_t *)p + i);
    default: return _mm256_loadu_ps((const float *)p + i);
    }
}

/* The 64 weight bytes of groups g, g+1 of 64 (8-bit activation path) as
 * four vectors of nibbles, group g in the low 128-bit lane and g+1 in the
 * high one: [lo | hi nibbles] of bytes 0-15, then of bytes 16-31 of each
 * group (so the record's 128-byte unit is E1 E1' O1 O1' E2 E2' O2 O2' in
 * 16-byte pieces: even/odd columns of the first/second 32 columns). */
AI void q4x8_unpack_pair64(const uint8_t *w, __m256i *q)
{
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i A = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)w)),
                                        _mm_loadu_si128((const __m128i *)(w + 32)), 1);
    __m256i B = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w + 16))),
                                        _mm_loadu_si128((const __m128i *)(w + 48)), 1);
    q[0] = _mm256_and_si256(A, nib);
    q[1] = _mm256_and_si256(_mm256_srli_epi16(A, 4), nib);
    q[2] = _mm256_and_si256(B, nib);
    q[3] = _mm256_and_si256(_mm256_srli_epi16(B, 4), nib);
}

/* Two groups of 32 (g even, g+1) as one unit of 64 columns: their 32
 * weight bytes and their records are laid out as one group of 64 (q4i_prep),
 * so the unit costs what a group of 64 does; i32 lanes 0-3 then hold group
 * g's integer dot and lanes 4-7 group g+1's, and the FMA takes
 * [c_g x4, c_g+1 x4]. j indexes c, the 8-group block's s * es. */
AI void q4i_pair(const cpu_mm_args *a, int64_t r, int t0, const int RB, const int TB, int64_t g,
                 float (*c)[K_TMAX][8], int j, __m256 (*acc)[K_TMAX], const int P, const int G)
{
    const cpu_mat *m = a->m;
    const size_t rb = m->row_bytes, xstride = (size_t)m->cols * 4;
    const uint8_t *wg = m->data + (size_t)r * rb + (size_t)g * (G / 2);
    const int8_t *xr = (const int8_t *)(a->xp + (size_t)t0 * m->cols) + (size_t)g * G * P;
    if (a->pf_off && ((g * (G / 2)) & 63) == 0)
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++)
            _mm_prefetch((const char *)wg + i * rb + a->pf_off, _MM_HINT_T0);
    if (P == 1) { /* row by row: 2 or 4 live nibble vectors, not 2*RB (16 ymm registers) */
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++) {
            __m256i q1[4];
            if (G == 64)
                q4x8_unpack_pair64(wg + i * rb, q1);
            else
                q4i_unpack(wg + i * rb, q1, 64);
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) {
                __m256i I = q4i_dot(q1, xr + t * xstride, 2 * G, P);
                __m256 cv = _mm256_set_m128(_mm_broadcast_ss(&c[i][t][j + 1]), _mm_broadcast_ss(&c[i][t][j]));
                acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), cv, acc[i][t]);
            }
        }
        return;
    }
    __m256i q[K_RMAX][2];
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
        q4i_unpack(wg + i * rb, q[i], 64);
#pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        const int8_t *rec = xr + t * xstride;
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++) {
            __m256i I = q4i_dot(q[i], rec, 64, P);
            __m256 cv = _mm256_set_m128(_mm_broadcast_ss(&c[i][t][j + 1]), _mm_broadcast_ss(&c[i][t][j]));
            acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), cv, acc[i][t]);
        }
    }
}

/* RB consecutive rows from r, TB consecutive tokens from t0, group G, P
 * planes per x record (3: exact, 1: 8-bit activations). A row's group is
 * unpacked once and used for every token of the tile. */
AI void q4i_tile(const cpu_mm_args *a, int64_t r, int t0, const int RB, const int TB, const int G, const int P)
{
    const cpu_mat *m = a->m;
    const int64_t cols = m->cols, ng = m->n_groups, rows = m->rows;
    const size_t gbytes = (size_t)G / 2, rb = m->row_bytes;
    const size_t sstride = (size_t)ng * m->s_size;
    const sn_dtype sdt = m->sdtype;
    const int64_t pf = a->pf_off;
    __m256 acc[K_RMAX][K_TMAX], bv[K_RMAX][K_TMAX];
    float bt[K_RMAX][K_TMAX];
    const uint8_t *w0 = m->data + (size_t)r * rb;
    const uint8_t *s0 = m->scales + (size_t)r * sstride, *b0 = m->qbiases + (size_t)r * sstride;
    const int8_t *xr = (const int8_t *)(a->xp + (size_t)t0 * cols);
    const size_t xstride = (size_t)cols * 4; /* bytes per token record */
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            acc[i][t] = bv[i][t] = _mm256_setzero_ps();
            bt[i][t] = 0.0f;
        }
    for (int64_t g8 = 0; g8 < ng; g8 += 8) {
        const int n = ng - g8 < 8 ? (int)(ng - g8) : 8;
        /* c[i][t][j] = s * es of group g8 + j */
        float c[K_RMAX][K_TMAX][8] __attribute__((aligned(32)));
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            const float *es = (const float *)(xr + t * xstride + P * cols), *xb = es + ng;
            if (n == 8) {
                __m256 e8 = _mm256_loadu_ps(es + g8), x8 = _mm256_loadu_ps(xb + g8);
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++) {
                    _mm256_store_ps(c[i][t], _mm256_mul_ps(q4i_load8(s0 + i * sstride, sdt, g8), e8));
                    bv[i][t] = _mm256_fmadd_ps(q4i_load8(b0 + i * sstride, sdt, g8), x8, bv[i][t]);
                }
            } else {
                for (int j = 0; j < n; j++)
#pragma GCC unroll 8
                    for (int i = 0; i < RB; i++) {
                        c[i][t][j] = k_load_scale(s0 + i * sstride, sdt, g8 + j) * es[g8 + j];
                        bt[i][t] += k_load_scale(b0 + i * sstride, sdt, g8 + j) * xb[g8 + j];
                    }
            }
        }
        int j = 0;
        if (G == 32 || (G == 64 && P == 1)) /* groups g, g+1 as one unit (see q4i_pair) */
            for (; j + 1 < n; j += 2)
                q4i_pair(a, r, t0, RB, TB, g8 + j, c, j, acc, P, G);
        for (; j < n; j++) {
            const int64_t g = g8 + j;
            const uint8_t *wg = w0 + (size_t)g * gbytes;
            if (pf && ((g * gbytes) & 63) == 0)
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++)
                    _mm_prefetch((const char *)wg + i * rb + pf, _MM_HINT_T0);
            if (P == 1) { /* row by row, as in q4i_pair */
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++) {
                    __m256i q1[4];
                    q4i_unpack(wg + i * rb, q1, G);
#pragma GCC unroll 8
                    for (int t = 0; t < TB; t++) {
                        __m256i I = q4i_dot(q1, xr + t * xstride + (size_t)g * G, G, P);
                        acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_broadcast_ss(&c[i][t][j]),
                                                    acc[i][t]);
                    }
                }
                continue;
            }
            __m256i q[K_RMAX][4];
#pragma GCC unroll 8
            for (int i = 0; i < RB; i++)
                q4i_unpack(wg + i * rb, q[i], G);
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) {
                const int8_t *rec = xr + t * xstride + (size_t)g * P * G;
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++) {
                    __m256i I = q4i_dot(q[i], rec, G, P);
                    acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_broadcast_ss(&c[i][t][j]), acc[i][t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++)
            a->y[(size_t)(t0 + t) * rows + r + i] = avx2_hsum(_mm256_add_ps(acc[i][t], bv[i][t])) + bt[i][t];
}

#ifndef Q4I_RB /* overridable for tuning runs; 1 row measured the same as 2 in 1B decode */
#define Q4I_RB RB_GEMV
#endif
/* CPU_MM_BLOCKED: decode Q4I_RB rows per tile (Q4X8_RB for 8-bit x),
 * prefill row tiles with TB_MAX tokens at a time (1, 3 or 4 tokens per
 * tile measured the same: the per-token multiply work dominates) and
 * Q4I_PRB rows (2: each x load serves two rows; on the Zen 4 VM a 64-token
 * 5120 x 5120 GEMM took 31-34 ms against 38-41 at one row, and 4 rows, with
 * 16 ymm registers, was no steadier a gain). */
#ifndef Q4I_PRB
#define Q4I_PRB 2
#endif
#ifndef Q4X8_RB
#define Q4X8_RB 4
#endif
AI void q4i_mm_g(const cpu_mm_args *a, int64_t r0, int64_t r1, const int G, const int P)
{
    CPU_MM_BLOCKED(a, r0, r1, P == 1 ? Q4X8_RB : Q4I_RB, Q4I_PRB, TB_MAX, q4i_tile, G, P);
}

static void avx2_mm_q4i(const cpu_mm_args *a, int64_t r0, int64_t r1)
{
    switch (a->m->group) {
    case 32: q4i_mm_g(a, r0, r1, 32, 3); break;
    case 64: q4i_mm_g(a, r0, r1, 64, 3); break;
    default: q4i_mm_g(a, r0, r1, 128, 3); break; /* the plan gives only 32/64/128 */
    }
}

static void avx2_mm_q4x8(const cpu_mm_args *a, int64_t r0, int64_t r1)
{
    switch (a->m->group) {
    case 32: q4i_mm_g(a, r0, r1, 32, 1); break;
    case 64: q4i_mm_g(a, r0, r1, 64, 1); break;
    default: q4i_mm_g(a, r0, r1, 128, 1); break;
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .isa = SN_ISA_AVX2,
    .prep_q4 = avx2_prep_q4,
    .prep_q8 = NULL,
    .wants_gsum = 1,
    .min_group = 2 * VW,
    .mm_q4 = avx2_mm_q4,
    .mm_q8 = avx2_mm_q8,
    .mm_dense = avx2_mm_dense,
    .prep_q4i = { avx2_prep_q4i_32, avx2_prep_q4i_64, avx2_prep_q4i_128 },
    .mm_q4i = avx2_mm_q4i,
    .prep_q4x8 = { avx2_prep_q4x8_32, avx2_prep_q4x8_64, avx2_prep_q4x8_128 },
    .mm_q4x8 = avx2_mm_q4x8,
    .dot = avx2_dot,
    .axpy = avx2_axpy,
    .scale = avx2_scale,
};
