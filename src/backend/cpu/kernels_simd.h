/* SIMD kernel bodies shared by kernels_avx2.c and kernels_avx512.c. The
 * including file defines the vector type and operations (V, VW, V_*),
 * the decoders (Q4_DECODE, Q8_DECODE, BF16_LOAD, F16_LOAD), KNAME(x) to
 * name its symbols, and TB_MAX / RB_GEMV (register budget), then includes
 * this file once.
 *
 * Canonical arithmetic (batch invariance, see backend.h): for every output
 * y[t, r] the kernels perform the same operations in the same order,
 * whatever the row or token blocking around it, so a token gives bitwise
 * the same result alone (GEMV) or inside a prefill batch (GEMM), and on
 * any thread count. For quantized rows, per group g:
 *   dlo = sum over steps of q_lo*x_lo, dhi = sum of q_hi*x_hi   (vector FMAs)
 *   acc = fma(dlo + dhi, scale_g, acc);  bacc += bias_g * gsum[t, g]
 * and y = reduce(acc) + bacc. A step covers 2*VW columns: for Q4, VW bytes
 * whose low nibbles are the even columns and high nibbles the odd ones (x
 * is pre-permuted to match by prep_q4, so nothing is shuffled per weight);
 * for Q8, the first and second VW columns. */

#define AI static inline __attribute__((always_inline))

/* Register tiles are declared with these fixed sizes, never [RB][TB]:
 * with RB/TB as (inlined constant) parameters such arrays are VLAs, which
 * GCC places on an alloca'd stack block even after full unrolling, so
 * every FMA went through memory. Fixed-size arrays indexed by unrolled
 * constants are split into registers. */
#define K_RMAX 8
#define K_TMAX 4
_Static_assert(RB_GEMV <= K_RMAX && TB_MAX <= K_TMAX, "tile larger than K_RMAX x K_TMAX");

AI float k_load_scale(const uint8_t *p, sn_dtype dt, int64_t i)
{
    uint16_t h;
    float f;
    switch (dt) {
    case SN_DT_BF16: memcpy(&h, p + 2 * i, 2); return sn_bf16_to_f32(h);
    case SN_DT_F16: memcpy(&h, p + 2 * i, 2); return _cvtsh_ss(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* x permuted per step of 2*VW columns: [even columns | odd columns]. */
static void KNAME(prep_q4)(const float *x, int64_t cols, float *xp)
{
    for (int64_t c = 0; c < cols; c += 2 * VW)
        for (int i = 0; i < VW; i++) {
            xp[c + i] = x[c + 2 * i];
            xp[c + VW + i] = x[c + 2 * i + 1];
        }
}

/* RB consecutive rows from r, TB consecutive tokens from t0. GS is the
 * number of steps per group when known at compile time (the supported
 * groups 32/64/128), so the step loop unrolls and every accumulator lives
 * in a register (a runtime step count made GCC keep dlo/dhi on the stack
 * and reload row pointers from it: half the GEMV time); GS == 0 reads it
 * from the matrix. The arithmetic is the same either way. */
AI void q_tile(const cpu_mm_args *a, int64_t r, int t0, const int RB, const int TB, const int bits, const int GS)
{
    const cpu_mat *m = a->m;
    const int64_t cols = m->cols, ng = m->n_groups, rows = m->rows;
    const int steps = GS ? GS : m->group / (2 * VW);
    const int step_bytes = bits == 4 ? VW : 2 * VW;
    const size_t gbytes = (size_t)steps * step_bytes, rb = m->row_bytes;
    const size_t sstride = (size_t)ng * m->s_size;
    const sn_dtype sdt = m->sdtype;
    const int64_t pf = a->pf_off;
    V acc[K_RMAX][K_TMAX];
    float bacc[K_RMAX][K_TMAX];
    const uint8_t *w0 = m->data + (size_t)r * rb;
    const uint8_t *s0 = m->scales + (size_t)r * sstride, *b0 = m->qbiases + (size_t)r * sstride;
    const float *xp = a->xp ? a->xp + (size_t)t0 * cols : a->x + (size_t)t0 * cols;
    const float *gs = a->gsum + (size_t)t0 * ng;
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            acc[i][t] = V_ZERO();
            bacc[i][t] = 0.0f;
        }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = w0 + (size_t)g * gbytes;
        const float *xg = xp + g * m->group;
        V dlo[K_RMAX][K_TMAX], dhi[K_RMAX][K_TMAX];
        /* Software prefetch a few rows ahead where the driver asks for it
         * (a->pf_off, see cpu_backend.c); past the matrix end it is a
         * harmless hint. One per 64-byte line, not one per group. */
        if (pf && ((g * gbytes) & 63) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < RB; i++)
                _mm_prefetch((const char *)wg + i * rb + pf, _MM_HINT_T0);
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) {
                dlo[i][t] = V_ZERO();
                dhi[i][t] = V_ZERO();
            }
#pragma GCC unroll 8
        for (int s = 0; s < steps; s++) {
            /* x of this step, loaded once for all RB rows */
            V x0[K_TMAX], x1[K_TMAX];
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) {
                x0[t] = V_LOAD(xg + (size_t)t * cols + s * 2 * VW);
                x1[t] = V_LOAD(xg + (size_t)t * cols + s * 2 * VW + VW);
            }
#pragma GCC unroll 8
            for (int i = 0; i < RB; i++) {
                V ql, qh;
                const uint8_t *wp = wg + i * rb + (size_t)s * step_bytes;
                if (bits == 4)
                    Q4_DECODE(wp, ql, qh);
                else
                    Q8_DECODE(wp, ql, qh);
#pragma GCC unroll 8
                for (int t = 0; t < TB; t++) {
                    dlo[i][t] = V_FMA(ql, x0[t], dlo[i][t]);
                    dhi[i][t] = V_FMA(qh, x1[t], dhi[i][t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++) {
            V sv = V_SET1(k_load_scale(s0 + i * sstride, sdt, g));
            float bv = k_load_scale(b0 + i * sstride, sdt, g);
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) {
                acc[i][t] = V_FMA(V_ADD(dlo[i][t], dhi[i][t]), sv, acc[i][t]);
                bacc[i][t] += bv * gs[(size_t)t * ng + g];
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++)
            a->y[(size_t)(t0 + t) * rows + r + i] = V_REDUCE(acc[i][t]) + bacc[i][t];
}

/* Decode blocks RB_GEMV rows, prefill TB_MAX tokens (CPU_MM_BLOCKED). */
AI void q_mm_gs(const cpu_mm_args *a, int64_t r0, int64_t r1, const int bits, const int GS)
{
    CPU_MM_BLOCKED(a, r0, r1, RB_GEMV, 1, TB_MAX, q_tile, bits, GS);
}

/* One instantiation per supported group (32/64/128 columns), plus a
 * generic one for any other multiple of 2*VW. */
AI void q_mm(const cpu_mm_args *a, int64_t r0, int64_t r1, const int bits)
{
    switch (a->m->group / (2 * VW)) {
    case 32 / (2 * VW): q_mm_gs(a, r0, r1, bits, 32 / (2 * VW)); break;
    case 64 / (2 * VW): q_mm_gs(a, r0, r1, bits, 64 / (2 * VW)); break;
    case 128 / (2 * VW): q_mm_gs(a, r0, r1, bits, 128 / (2 * VW)); break;
    default: q_mm_gs(a, r0, r1, bits, 0); break;
    }
}

static void KNAME(mm_q4)(const cpu_mm_args *a, int64_t r0, int64_t r1) { q_mm(a, r0, r1, 4); }
static void KNAME(mm_q8)(const cpu_mm_args *a, int64_t r0, int64_t r1) { q_mm(a, r0, r1, 8); }

/* Dense rows. Canonical order per output: acc0 takes even VW-chunks, acc1
 * odd ones, the last cols % VW columns go to a scalar tail; y = reduce(acc0
 * + acc1) + tail. */
AI V dense_load(const uint8_t *row, sn_dtype dt, int64_t c)
{
    switch (dt) {
    case SN_DT_BF16: return BF16_LOAD((const uint16_t *)row + c);
    case SN_DT_F16: return F16_LOAD((const uint16_t *)row + c);
    default: return V_LOAD((const float *)row + c);
    }
}

AI float dense_scalar(const uint8_t *row, sn_dtype dt, int64_t c) { return k_load_scale(row, dt, c); }

AI void dense_tile(const cpu_mm_args *a, int64_t r, int t0, const int RB, const int TB, const sn_dtype dt)
{
    const cpu_mat *m = a->m;
    const int64_t cols = m->cols, rows = m->rows;
    const int64_t nv = cols / VW, vend = nv * VW;
    V acc0[K_RMAX][K_TMAX], acc1[K_RMAX][K_TMAX];
    const uint8_t *w[K_RMAX];
    const float *x = a->x + (size_t)t0 * cols;
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++) {
        w[i] = m->data + (size_t)(r + i) * m->row_bytes;
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++)
            acc0[i][t] = acc1[i][t] = V_ZERO();
    }
    int64_t c = 0;
    const size_t esz = dt == SN_DT_F32 ? 4 : 2;
    for (; c + 2 * VW <= vend; c += 2 * VW) {
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++) {
            if (a->pf_off)
                _mm_prefetch((const char *)w[i] + c * esz + a->pf_off, _MM_HINT_T0);
            V w0 = dense_load(w[i], dt, c), w1 = dense_load(w[i], dt, c + VW);
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++) {
                acc0[i][t] = V_FMA(w0, V_LOAD(x + (size_t)t * cols + c), acc0[i][t]);
                acc1[i][t] = V_FMA(w1, V_LOAD(x + (size_t)t * cols + c + VW), acc1[i][t]);
            }
        }
    }
    if (c < vend) { /* one odd chunk left: it is chunk index nv-1, even */
#pragma GCC unroll 8
        for (int i = 0; i < RB; i++) {
            V w0 = dense_load(w[i], dt, c);
#pragma GCC unroll 8
            for (int t = 0; t < TB; t++)
                acc0[i][t] = V_FMA(w0, V_LOAD(x + (size_t)t * cols + c), acc0[i][t]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RB; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            float tail = 0.0f;
            for (int64_t k = vend; k < cols; k++)
                tail += dense_scalar(w[i], dt, k) * x[(size_t)t * cols + k];
            a->y[(size_t)(t0 + t) * rows + r + i] = V_REDUCE(V_ADD(acc0[i][t], acc1[i][t])) + tail;
        }
}

AI void dense_mm(const cpu_mm_args *a, int64_t r0, int64_t r1, const sn_dtype dt)
{
    if (a->T == 1) {
        int64_t r = r0;
        for (; r + RB_GEMV <= r1; r += RB_GEMV)
            dense_tile(a, r, 0, RB_GEMV, 1, dt);
        for (; r < r1; r++)
            dense_tile(a, r, 0, 1, 1, dt);
        return;
    }
    for (int64_t rt = r0; rt < r1; rt += a->row_tile) {
        int64_t re = rt + a->row_tile < r1 ? rt + a->row_tile : r1;
        int t = 0;
        for (; t + 4 <= a->T; t += 4)
            for (int64_t r = rt; r < re; r++)
                dense_tile(a, r, t, 1, 4, dt);
        for (; t < a->T; t++)
            for (int64_t r = rt; r < re; r++)
                dense_tile(a, r, t, 1, 1, dt);
    }
}

static void KNAME(mm_dense)(const cpu_mm_args *a, int64_t r0, int64_t r1)
{
    switch (a->m->dtype) {
    case SN_DT_BF16: dense_mm(a, r0, r1, SN_DT_BF16); break;
    case SN_DT_F16: dense_mm(a, r0, r1, SN_DT_F16); break;
    default: dense_mm(a, r0, r1, SN_DT_F32); break;
    }
}

/* Primitives: two accumulators, scalar tail (fixed order, deterministic). */
static float KNAME(dot)(const float *a, const float *b, int64_t n)
{
    V s0 = V_ZERO(), s1 = V_ZERO();
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        s0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), s0);
        s1 = V_FMA(V_LOAD(a + i + VW), V_LOAD(b + i + VW), s1);
    }
    if (i + VW <= n) {
        s0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), s0);
        i += VW;
    }
    float s = V_REDUCE(V_ADD(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void KNAME(axpy)(float *y, float a, const float *x, int64_t n)
{
    V av = V_SET1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        V_STORE(y + i, V_FMA(av, V_LOAD(x + i), V_LOAD(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static void KNAME(scale)(float *y, float a, int64_t n)
{
    V av = V_SET1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        V_STORE(y + i, V_MUL(av, V_LOAD(y + i)));
    for (; i < n; i++)
        y[i] *= a;
}
