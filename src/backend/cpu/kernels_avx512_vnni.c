/* The exact integer Q4 path on AVX-512 VNNI (compiled with the AVX-512 and
 * VNNI flags; reached only through cpu_kernels_avx512_vnni_get once the CPU
 * has AVX512_VNNI). It takes the x records of kernels_avx2.c's q4i_prep
 * (three signed int8 digit planes per token and group, X = 65536*d0 +
 * 256*d1 + d2 = rne(x * 2^e), the layout described there) and multiplies
 * the weights' nibbles by them with vpdpbusd: 64 u8 x s8 products summed
 * by fours into int32 lanes per instruction, where AVX2 needs vpmaddubsw
 * and vpmaddwd per 32. On the Intel Xeon (AVX-512, VNNI) of 2026-12-07 the
 * AVX-512 table's float Q4 kernel ran at 12.3 GB/s a core with the weights
 * in L2 and the AVX2 integer kernel at 15.3-16.0 (docs/PERFORMANCE.md).
 * The same tile code runs the opt-in 8-bit activations (SANCTUM_CPU_Q4=q8)
 * on one plane, with its own x preparation (vq8_prep, below).
 *
 * Per output y[t, r] (the same for every row/token blocking and thread
 * split, so GEMV == GEMM bitwise), per group g in order:
 *   A = dpbusd(0, q, d0) << 8; A = dpbusd(A, q, d1) << 8; A = dpbusd(A, q, d2)
 *     (16 int32 lanes, each the sum over its 4 columns (8 for G = 128) of
 *     q * (65536*d0 + 256*d1 + d2): exact, |A| <= 8 * 15 * 2^22 < 2^31)
 *   acc = fma(cvt_f32(A), c_g, acc)   (16 float lanes; c_g = s_g * es_g;
 *     for G = 32 two groups share one unit: lanes 0-3 and 8-11 are group
 *     g's, 4-7 and 12-15 group g+1's, and c is [c_g x4, c_g+1 x4] twice)
 * The bias terms b_g * xb_g go to 16 lanes by group: for each block of 16
 * groups bv = fma(b[16], xb[16], bv) (and c[16] = s[16] * es[16]); the last
 * ng % 16 groups scalar, bt = bt + b_g * xb_g in group order. y =
 * reduce(acc + bv) + bt (_mm512_reduce_add_ps). A group with a non-finite
 * x has zero digits and es = xb = NaN, so its outputs are NaN, as on the
 * float kernels. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/kernels_avx512_cvt.h"

#define AI static inline __attribute__((always_inline))
#define VQ_RMAX 4 /* rows a decode tile */
#ifndef VQ_TMAX   /* tokens a prefill tile; overridable for tuning runs */
#define VQ_TMAX 4
#endif
#ifndef VQ_PRB    /* rows a prefill tile: 4 x 4 beat 4 x 2, 4 x 3, 3 x 4 and 2 x 6 (Zen 4, 2026-12-07) */
#define VQ_PRB 4
#endif
#ifndef VQ_RB     /* overridable for tuning runs */
#define VQ_RB 4
#endif

/* 16 consecutive scales (or biases) from index i, as floats */
AI __m512 vq_load16(const uint8_t *p, sn_dtype dt, int64_t i)
{
    switch (dt) {
    case SN_DT_BF16: return BF16_LOAD((const uint16_t *)p + i);
    case SN_DT_F16: return F16_LOAD((const uint16_t *)p + i);
    default: return _mm512_loadu_ps((const float *)p + i);
    }
}

/* 32 weight bytes (64 columns: byte b holds columns 2b and 2b+1) -> 64
 * nibble bytes [low nibbles | high nibbles], the records' [even | odd]
 * column order: one broadcast load, a shift of the upper half, a mask. */
AI __m512i vq_unpack64(const uint8_t *w)
{
    const __m512i sh = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)w));
    return _mm512_and_si512(_mm512_srlv_epi64(b, sh), _mm512_set1_epi8(0x0F));
}

/* the same for 16 bytes (the last odd group of 32): [low | high] in 256 bits */
AI __m256i vq_unpack32(const uint8_t *w)
{
    const __m256i sh = _mm256_set_epi64x(4, 4, 0, 0);
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w));
    return _mm256_and_si256(_mm256_srlv_epi64(b, sh), _mm256_set1_epi8(0x0F));
}

/* P = 3: A = 65536*D0 + 256*D1 + D2 per lane, D_p the lane's sums over n
 * chunks of 64 columns (plane p of chunk k at d + p*pstride + 64*k);
 * P = 1 (8-bit activations): A = D0 */
AI __m512i vq_dot(const __m512i *q, const int8_t *d, const int n, const int pstride, const int P)
{
    __m512i A = _mm512_setzero_si512();
    for (int p = 0; p < P; p++) {
        if (p)
            A = _mm512_slli_epi32(A, 8);
        for (int k = 0; k < n; k++)
            A = _mm512_dpbusd_epi32(A, q[k], _mm512_loadu_si512((const void *)(d + p * pstride + 64 * k)));
    }
    return A;
}

/* RB consecutive rows from r, TB consecutive tokens from t0, group G, P
 * planes per x record (3: exact, 1: 8-bit activations). */
AI void vq_tile(const cpu_mm_args *a, int64_t r, int t0, const int RB, const int TB, const int G, const int P)
{
    const cpu_mat *m = a->m;
    const int64_t cols = m->cols, ng = m->n_groups, rows = m->rows;
    const size_t gbytes = (size_t)G / 2, rb = m->row_bytes;
    const size_t sstride = (size_t)ng * m->s_size;
    const sn_dtype sdt = m->sdtype;
    const int64_t pf = a->pf_off;
    __m512 acc[VQ_RMAX][VQ_TMAX], bv[VQ_RMAX][VQ_TMAX];
    float bt[VQ_RMAX][VQ_TMAX];
    const uint8_t *w0 = m->data + (size_t)r * rb;
    const uint8_t *s0 = m->scales + (size_t)r * sstride, *b0 = m->qbiases + (size_t)r * sstride;
    const int8_t *xr = (const int8_t *)(a->xp + (size_t)t0 * cols);
    const size_t xstride = (size_t)cols * 4; /* bytes per token record */
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            acc[i][t] = bv[i][t] = _mm512_setzero_ps();
            bt[i][t] = 0.0f;
        }
    for (int64_t g16 = 0; g16 < ng; g16 += 16) {
        const int n = ng - g16 < 16 ? (int)(ng - g16) : 16;
        /* c[i][t][j] = s * es of group g16 + j */
        float c[VQ_RMAX][VQ_TMAX][16] __attribute__((aligned(64)));
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            const float *es = (const float *)(xr + t * xstride + P * cols), *xb = es + ng;
            if (n == 16) {
                const __m512 e16 = _mm512_loadu_ps(es + g16), x16 = _mm512_loadu_ps(xb + g16);
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++) {
                    _mm512_store_ps(c[i][t], _mm512_mul_ps(vq_load16(s0 + i * sstride, sdt, g16), e16));
                    bv[i][t] = _mm512_fmadd_ps(vq_load16(b0 + i * sstride, sdt, g16), x16, bv[i][t]);
                }
            } else {
                for (int j = 0; j < n; j++)
#pragma GCC unroll 8
                    for (int i = 0; i < RB; i++) {
                        c[i][t][j] = cpu_load_scale(s0 + i * sstride, sdt, g16 + j) * es[g16 + j];
                        bt[i][t] += cpu_load_scale(b0 + i * sstride, sdt, g16 + j) * xb[g16 + j];
                    }
            }
        }
        for (int j = 0; j < n;) {
            const int64_t g = g16 + j;
            const uint8_t *wg = w0 + (size_t)g * gbytes;
            if (pf && ((g * gbytes) & 63) == 0)
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++)
                    _mm_prefetch((const char *)wg + i * rb + pf, _MM_HINT_T0);
            if (G == 32 && j + 1 < n) {
                /* groups g, g+1 as one unit of 64 columns (q4i_prep's layout) */
                const int8_t *rec = xr + (size_t)g * 32 * P;
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++) {
                    const __m512i q = vq_unpack64(wg + i * rb);
#pragma GCC unroll 8
                    for (int t = 0; t < TB; t++) {
                        const __m512i A = vq_dot(&q, rec + t * xstride, 1, 64, P);
                        const __m512 cv = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(c[i][t][j]),
                                                               _mm512_set1_ps(c[i][t][j + 1]));
                        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A), cv, acc[i][t]);
                    }
                }
                j += 2;
                continue;
            }
            if (G == 32) {
                /* the last odd group of 32, a unit of its own: 8 lanes */
                const int8_t *rec = xr + (size_t)g * 32 * P;
#pragma GCC unroll 8
                for (int i = 0; i < RB; i++) {
                    const __m256i q = vq_unpack32(wg + i * rb);
#pragma GCC unroll 8
                    for (int t = 0; t < TB; t++) {
                        const int8_t *d = rec + t * xstride;
                        __m256i A = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, _mm256_loadu_si256((const __m256i *)d));
                        for (int p = 1; p < P; p++)
                            A = _mm256_dpbusd_epi32(_mm256_slli_epi32(A, 8), q,
                                                    _mm256_loadu_si256((const __m256i *)(d + 32 * p)));
                        /* lanes 8-15 keep acc (mask3: unset lanes come from the addend) */
                        acc[i][t] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(A)),
                                                          _mm512_set1_ps(c[i][t][j]), acc[i][t], 0x00FF);
                    }
                }
                j++;
                continue;
            }
            const int8_t *rec = xr + (size_t)g * P * G;
#pragma GCC unroll 8
            for (int i = 0; i < RB; i++) {
                __m512i q[2];
                q[0] = vq_unpack64(wg + i * rb);
                if (G == 128)
                    q[1] = vq_unpack64(wg + i * rb + 32);
#pragma GCC unroll 8
                for (int t = 0; t < TB; t++) {
                    const __m512i A = vq_dot(q, rec + t * xstride, G / 64, G, P);
                    acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A), _mm512_set1_ps(c[i][t][j]), acc[i][t]);
                }
            }
            j++;
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++)
            a->y[(size_t)(t0 + t) * rows + r + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][t], bv[i][t])) + bt[i][t];
}

/* CPU_MM_BLOCKED: decode VQ_RB rows a tile, prefill VQ_PRB rows x VQ_TMAX tokens. */
AI void vq_mm_g(const cpu_mm_args *a, int64_t r0, int64_t r1, const int G, const int P)
{
    CPU_MM_BLOCKED(a, r0, r1, VQ_RB, VQ_PRB, VQ_TMAX, vq_tile, G, P);
}

static void avx512vnni_mm_q4i(const cpu_mm_args *a, int64_t r0, int64_t r1)
{
    switch (a->m->group) {
    case 32: vq_mm_g(a, r0, r1, 32, 3); break;
    case 64: vq_mm_g(a, r0, r1, 64, 3); break;
    default: vq_mm_g(a, r0, r1, 128, 3); break; /* the plan gives only 32/64/128 */
    }
}

/* ---- Opt-in 8-bit activations (SANCTUM_CPU_Q4=q8) on VNNI ----
 *
 * The approximation of kernels_avx2.c's q4x8 path (its comment derives
 * the error bound): per token and group, m = max |x|, d = m / 127, X =
 * rne(x * (127 / m)) (m < 2^-64 first scaled by 2^64), and the bias part
 * b_g * sum(x) on the group's float sum. The record is laid out as
 * q4i_prep's with one plane, so vq_tile runs it with P = 1: group g's
 * bytes at [G*g, G*g + G), chunks of 64 columns as [32 even | 32 odd]; for
 * G = 32 groups 2k, 2k+1 as one unit of 64 ([2k even | 2k+1 even | 2k odd
 * | 2k+1 odd], 16 each; a last odd group [16 even | 16 odd]); then float
 * d[ng] from byte cols and float xs[ng]. A group with a non-finite x gets
 * X = 0 and d = xs = NaN. */
AI void vq8_prep(const float *x, int64_t cols, float *xp, const int G)
{
    const int64_t ng = cols / G;
    int8_t *plane = (int8_t *)xp;
    float *dm = (float *)((uint8_t *)xp + cols), *xsm = dm + ng;
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        __m512 mx = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
        __mmask16 fin = 0xFFFF;
        for (int i = 0; i < G; i += 16) {
            const __m512 v = _mm512_loadu_ps(xg + i);
            sum = _mm512_add_ps(sum, v);
            const __m512 av = _mm512_and_ps(v, absm);
            mx = _mm512_max_ps(mx, av);
            fin &= _mm512_cmp_ps_mask(av, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ); /* false for inf, NaN */
        }
        const int bad = fin != 0xFFFF;
        float m = _mm512_reduce_max_ps(mx), pre = 1.0f, inv = 0.0f, d = 0.0f;
        if (m > 0.0f && !bad) {
            if (m < 0x1p-64f) {
                pre = 0x1p64f;
                m *= pre;
            }
            inv = 127.0f / m;
            d = (m / 127.0f) / pre;
        }
        const __m512 vpre = _mm512_set1_ps(pre), vinv = _mm512_set1_ps(inv);
        /* a bad group's values are zeroed before the multiply (an inf or NaN
         * times its inv of 0 would be NaN), so all its X are 0 */
        const __mmask16 ka = bad ? 0 : 0xFFFF;
        for (int c0 = 0; c0 < G; c0 += 32) {
            /* 32 columns -> 16 even and 16 odd values, as int8 */
            const __m512 a = _mm512_loadu_ps(xg + c0), b = _mm512_loadu_ps(xg + c0 + 16);
            const __m512 e = _mm512_maskz_mov_ps(ka, _mm512_permutex2var_ps(a, ev, b));
            const __m512 o = _mm512_maskz_mov_ps(ka, _mm512_permutex2var_ps(a, od, b));
            const __m128i Xe = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(e, vpre), vinv)));
            const __m128i Xo = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(o, vpre), vinv)));
            int8_t *de, *dd;
            if (G == 32) {
                const int pair = (g & 1) || g + 1 < ng;
                int8_t *u = plane + 32 * (g & ~(int64_t)1);
                de = pair ? u + (g & 1) * 16 : u;
                dd = pair ? u + 32 + (g & 1) * 16 : u + 16;
            } else { /* chunk c0 / 64: [32 even | 32 odd]; this half's 16 of each */
                int8_t *ch = plane + G * g + 64 * (c0 / 64);
                de = ch + (c0 & 32) / 2;
                dd = ch + 32 + (c0 & 32) / 2;
            }
            _mm_storeu_si128((__m128i *)de, Xe);
            _mm_storeu_si128((__m128i *)dd, Xo);
        }
        dm[g] = bad ? NAN : d;
        xsm[g] = bad ? NAN : _mm512_reduce_add_ps(sum);
    }
}

static void avx512vnni_prep_q4x8_32(const float *x, int64_t cols, float *xp) { vq8_prep(x, cols, xp, 32); }
static void avx512vnni_prep_q4x8_64(const float *x, int64_t cols, float *xp) { vq8_prep(x, cols, xp, 64); }
static void avx512vnni_prep_q4x8_128(const float *x, int64_t cols, float *xp) { vq8_prep(x, cols, xp, 128); }

static void avx512vnni_mm_q4x8(const cpu_mm_args *a, int64_t r0, int64_t r1)
{
    switch (a->m->group) {
    case 32: vq_mm_g(a, r0, r1, 32, 1); break;
    case 64: vq_mm_g(a, r0, r1, 64, 1); break;
    default: vq_mm_g(a, r0, r1, 128, 1); break;
    }
}

/* The AVX-512 table with these two Q4 paths: the exact one on the AVX2
 * table's x records (its prep runs on any AVX-512 host), the 8-bit one on
 * vq8_prep's. */
static cpu_kernels vnni_table;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;

static void vnni_table_init(void)
{
    vnni_table = cpu_kernels_avx512;
    for (int i = 0; i < 3; i++)
        vnni_table.prep_q4i[i] = cpu_kernels_avx2.prep_q4i[i];
    vnni_table.mm_q4i = avx512vnni_mm_q4i;
    vnni_table.prep_q4x8[0] = avx512vnni_prep_q4x8_32;
    vnni_table.prep_q4x8[1] = avx512vnni_prep_q4x8_64;
    vnni_table.prep_q4x8[2] = avx512vnni_prep_q4x8_128;
    vnni_table.mm_q4x8 = avx512vnni_mm_q4x8;
}

const cpu_kernels *cpu_kernels_avx512_vnni_get(void)
{
    pthread_once(&vnni_once, vnni_table_init);
    return &vnni_table;
}
