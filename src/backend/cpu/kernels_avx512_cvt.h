/* 16 bf16 or f16 values to 16 floats (AVX-512F; F16C for f16), for the
 * files compiled with the AVX-512 flags. */
#ifndef SANCTUM_KERNELS_AVX512_CVT_H
#define SANCTUM_KERNELS_AVX512_CVT_H
#include <immintrin.h>

#define BF16_LOAD(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define F16_LOAD(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))

#endif
