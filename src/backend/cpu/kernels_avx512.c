/* AVX-512 (F/BW/VL/DQ + FMA + F16C) kernels; this file is compiled with
 * those flags and only reached through cpu_kernels_avx512 once the CPU
 * check passed. Bodies are in kernels_simd.h. */
#include <immintrin.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/kernels_avx512_cvt.h"

#define V __m512
#define VW 16
#define V_ZERO() _mm512_setzero_ps()
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_SET1(s) _mm512_set1_ps(s)
#define V_REDUCE(v) _mm512_reduce_add_ps(v)
/* 16 bytes -> 32 nibbles: low nibbles are the even columns. */
/* vpermps reads only the low 4 bits of each index, so a 16-entry table of
 * 0.0 .. 15.0 turns a low nibble into its float in one op (no mask, no
 * cvt). The high nibble is byte >> 4, already clean, and goes through cvt
 * rather than a second vpermps: that moves one op per 32 weights off the
 * shuffle unit, which vpmovzxbd and vpermps share (~3% on Zen 5 with the
 * weights in L2; both forms give exactly the same floats). */
#define Q4_DECODE(p, lo, hi) do { \
        const __m512 lut_ = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); \
        __m512i v_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p))); \
        lo = _mm512_permutexvar_ps(v_, lut_); \
        hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v_, 4)); \
    } while (0)
#define Q8_DECODE(p, lo, hi) do { \
        lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))); \
        hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p) + 1))); \
    } while (0)
#define KNAME(x) avx512_##x
#define TB_MAX 4
#ifndef RB_GEMV /* overridable for tuning runs */
#define RB_GEMV 4
#endif

#include "backend/cpu/kernels_simd.h"

const cpu_kernels cpu_kernels_avx512 = {
    .isa = SN_ISA_AVX512,
    .prep_q4 = avx512_prep_q4,
    .prep_q8 = NULL,
    .wants_gsum = 1,
    .min_group = 2 * VW,
    .mm_q4 = avx512_mm_q4,
    .mm_q8 = avx512_mm_q8,
    .mm_dense = avx512_mm_dense,
    .dot = avx512_dot,
    .axpy = avx512_axpy,
    .scale = avx512_scale,
};
