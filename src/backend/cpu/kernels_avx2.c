/* AVX2 + FMA + F16C kernels; compiled with those flags and only reached
 * through cpu_kernels_avx2 once the CPU check passed. Bodies are in
 * kernels_simd.h. */
#include <immintrin.h>

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

const cpu_kernels cpu_kernels_avx2 = {
    .isa = SN_ISA_AVX2,
    .prep_q4 = avx2_prep_q4,
    .prep_q8 = NULL,
    .wants_gsum = 1,
    .min_group = 2 * VW,
    .mm_q4 = avx2_mm_q4,
    .mm_q8 = avx2_mm_q8,
    .mm_dense = avx2_mm_dense,
    .dot = avx2_dot,
    .axpy = avx2_axpy,
    .scale = avx2_scale,
};
