/* The integer tensor-core prefill GEMM of src/backend/cuda/cuda_gemm_i8.cu
 * (repacked Q4 weights, x as 3 or 2 byte digits per (token, quant group)).
 *
 * Part 1 runs everywhere (plain C, no GPU): the two kernels emulated on the
 * host with their exact index math: the repacked weight layout
 * (cu_weight.qr / sr as documented in cuda_internal.h / cuda_matmul.cu),
 * the staging kernel (exponents, digit planes, column constants), the
 * GEMM's shared-memory stage layout, ldmatrix (PTX: a matrix's row r comes
 * from the address of lane 8i + r, lane l receives 32-bit word l % 4 of row
 * l / 4) and mma.sync.m16n8k32 .u8 x .s8/.u8 from the PTX fragment layout
 * (A: a_i at row g for i in [0,4) u [8,12) else g+8, column 4t + (i & 3)
 * (+16 for i >= 8); B: b_i at row 4t + (i & 3) (+16 for i >= 4), column g;
 * C: c_i at row g (+8 for i >= 2), column 2t + (i & 1)), and the per-group
 * float flush in the kernel's operation order. Checked against an fp64
 * reference of sum_k (s q + b) x: 3 digits rel <= 1e-6, 2 digits rel <=
 * 3e-4 (measured values are printed; the 2-digit worst case is a token whose
 * every group holds a 3000x outlier: 16 bits of 3000 for the rest), on rows not a multiple of 16, groups
 * 32/64/128, bf16 and f16 scales, T = 9..130, a linear bias, an outlier
 * (one x 3000x the rest), and the extreme case (every q = 15, |x| just
 * below a power of two, one sign per group) that puts the int32 partials
 * at the bound the magic-number conversion needs (|P| < 2^22). The fp16
 * hi/lo form (gemm_i8 = 4) the same way: its staging (per-token power of
 * two, hi/lo split, 16 columns as evens then odds), the ldmatrix reads of
 * its stage and mma.sync.m16n8k16 f16 from the PTX fragment layout, with
 * the weights' nibbles read as fp16 subnormals; each MMA's products summed
 * exactly and rounded once (a model: the tensor cores' fp32 accumulation is
 * not IEEE), rel <= 1e-6 against fp64.
 *
 * Part 2 (GPU): the backend's matmul with sn_cuda_tune(gemm_i8 = 3 / 2)
 * against the scalar CPU backend (3 digits rel <= 2e-5, 2 digits <= 3e-4)
 * and bitwise against the part 1 emulation (which also checks the weight
 * repack done at upload against the PTX fragment layout), T = 9, 64, 130,
 * 1000 (the hi/lo form: against the CPU at 2e-5 and its emulation at 2e-6,
 * not bitwise); row invariance: token rows of a T = 130 run bitwise equal to the
 * same tokens run as T = 9; and determinism (two runs bitwise equal).
 * Staging reuse: a matmul right after one of the same x (the backend skips
 * the digit staging) gives the bits of a freshly staged call, and x
 * changed by an op in between, by the previous matmul writing over it,
 * another group size or another T each make it stage again.
 * A token holding inf or NaN gives NaN in all its outputs and leaves the
 * other tokens' bits alone, in both forms.
 * Without a GPU part 2 says SKIP. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "sanctum/backend.h"
#include "sanctum/cpu.h"
#include "sanctum/tensor.h"

#ifdef SN_HAVE_CUDA
#include "backend/cuda/sn_cuda.h"
#endif

#define TU_SEED 0x5851f42d4c957f2dull
#include "cuda_test_util.h"

static double rel_err(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isinf(a[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------------ */
/* A Q4 weight in MLX layout                                            */
/* ------------------------------------------------------------------ */

typedef struct {
    int64_t rows, cols;
    int group, f16; /* scale dtype: bf16 (0) or f16 (1) */
    uint32_t *q;    /* [rows][cols / 8], value k of a row at bits 4 * (k % 8) of word k / 8 */
    uint16_t *sc, *bi;
    float *bias;    /* optional */
} hq4;

static float h2f(const hq4 *w, uint16_t h) { return w->f16 ? sn_f16_to_f32(h) : sn_bf16_to_f32(h); }
static int qval(const hq4 *w, int64_t r, int64_t k) { return (int)((w->q[r * (w->cols / 8) + k / 8] >> (4 * (k % 8))) & 15u); }

/* kind 0: random; 1: every q = 15 (the partial-sum bound) */
static void hq4_make(hq4 *w, int64_t rows, int64_t cols, int group, int f16, int bias, int kind)
{
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->group = group;
    w->f16 = f16;
    size_t words = (size_t)rows * cols / 8, ng = (size_t)rows * (cols / group);
    w->q = malloc(4 * words);
    for (size_t i = 0; i < words; i++) w->q[i] = kind == 1 ? 0xffffffffu : rnd_u32() ^ (rnd_u32() << 16);
    w->sc = malloc(2 * ng);
    w->bi = malloc(2 * ng);
    for (size_t i = 0; i < ng; i++) {
        float s = rnd_f(0.02f), b = rnd_f(0.1f);
        w->sc[i] = f16 ? sn_f32_to_f16(s) : sn_f32_to_bf16(s);
        w->bi[i] = f16 ? sn_f32_to_f16(b) : sn_f32_to_bf16(b);
    }
    if (bias) {
        w->bias = malloc(sizeof(float) * rows);
        for (int64_t r = 0; r < rows; r++) w->bias[r] = rnd_f(0.5f);
    }
}

static void hq4_free(hq4 *w)
{
    free(w->q);
    free(w->sc);
    free(w->bi);
    free(w->bias);
}

/* y[t][r] = bias[r] + sum_k (s q + b) x[t][k] in double */
static double *ref_gemm(const hq4 *w, const float *x, int T)
{
    double *y = malloc(sizeof(double) * (size_t)T * w->rows);
    const int64_t ng = w->cols / w->group;
    for (int64_t r = 0; r < w->rows; r++)
        for (int t = 0; t < T; t++) {
            double acc = w->bias ? w->bias[r] : 0.0;
            for (int64_t g = 0; g < ng; g++) {
                double s = h2f(w, w->sc[r * ng + g]), b = h2f(w, w->bi[r * ng + g]);
                for (int64_t k = g * w->group; k < (g + 1) * w->group; k++)
                    acc += (s * qval(w, r, k) + b) * (double)x[(size_t)t * w->cols + k];
            }
            y[(size_t)t * w->rows + r] = acc;
        }
    return y;
}

/* ------------------------------------------------------------------ */
/* Part 1: the kernels on the host                                      */
/* ------------------------------------------------------------------ */

/* the repacked copy, from its documentation (cuda_internal.h, cuda_matmul.cu):
 * qr[(mt*KB + kb)*32 + lane] = {W0(kt 0), W1(kt 0), W0(kt 1), W1(kt 1)}, g = lane/4, t = lane%4,
 * k0 = 64 kb + 32 kt: W0 byte j = q[16mt+g][k0+4t+j] | q[16mt+g+8][k0+4t+j] << 4, W1 the same at k0+16;
 * sr[(mt*groups + grp)*16 + r] = (scale | bias << 16) of row 16mt+r, 0 past the last row */
static void emu_repack(const hq4 *w, uint32_t **qr_out, uint32_t **sr_out, int64_t *mt_out)
{
    const int64_t MT = (w->rows + 15) / 16, KB = w->cols / 64, ng = w->cols / w->group;
    uint32_t *qr = calloc((size_t)MT * KB * 32 * 4, 4), *sr = calloc((size_t)MT * ng * 16, 4);
    for (int64_t mt = 0; mt < MT; mt++)
        for (int64_t kb = 0; kb < KB; kb++)
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, t = lane & 3;
                for (int kt = 0; kt < 2; kt++)
                    for (int h = 0; h < 2; h++) {
                        uint32_t v = 0;
                        for (int j = 0; j < 4; j++) {
                            const int64_t k = 64 * kb + 32 * kt + 16 * h + 4 * t + j, r0 = 16 * mt + g, r1 = r0 + 8;
                            uint32_t n0 = r0 < w->rows ? (uint32_t)qval(w, r0, k) : 0u;
                            uint32_t n1 = r1 < w->rows ? (uint32_t)qval(w, r1, k) : 0u;
                            v |= (n0 | n1 << 4) << (8 * j);
                        }
                        qr[((mt * KB + kb) * 32 + lane) * 4 + 2 * kt + h] = v;
                    }
            }
    for (int64_t mt = 0; mt < MT; mt++)
        for (int64_t g = 0; g < ng; g++)
            for (int r = 0; r < 16; r++) {
                const int64_t row = 16 * mt + r;
                if (row < w->rows)
                    sr[(mt * ng + g) * 16 + r] = (uint32_t)w->sc[row * ng + g] | (uint32_t)w->bi[row * ng + g] << 16;
            }
    *qr_out = qr;
    *sr_out = sr;
    *mt_out = MT;
}

/* The staging kernels' power of two for n values v: e2 with max |v| 2^e2 < 2^top (at most 2^100; 0 for
 * all zeros), and whether a value is inf or NaN (then e2 is 0) */
static int emu_scale_exp(const float *v, int64_t n, int top, int *bad)
{
    float mx = 0.f;
    *bad = 0;
    for (int64_t j = 0; j < n; j++) {
        mx = fmaxf(mx, fabsf(v[j]));
        *bad |= !isfinite(v[j]);
    }
    if (mx == 0.f || *bad) return 0;
    int e;
    frexpf(mx, &e);
    return top - e < 100 ? top - e : 100;
}

/* k_i8_stage: planes [D][T][cols] (bytes of X, top byte first), gc [groups][T][4] = {2^-e, K, 2^-e sum X, 0} */
static void emu_stage(int D, int G, const float *x, int T, int64_t cols, int8_t *planes, float *gc)
{
    const int XBITS = D == 3 ? 23 : 15, XMAX = (1 << XBITS) - 1;
    const float KM = (float)(12582912.0 * (D == 3 ? 65793.0 : 257.0));
    for (int t = 0; t < T; t++)
        for (int64_t g0 = 0; g0 < cols; g0 += G) {
            const float *v = x + (size_t)t * cols + g0;
            int bad;
            const int e2 = emu_scale_exp(v, G, XBITS, &bad);
            const float sc = ldexpf(1.f, e2), es = ldexpf(1.f, -e2);
            int sum = 0;
            for (int j = 0; j < G; j++) {
                int X = bad ? 0 : (int)lrintf(v[j] * sc);
                if (X > XMAX) X = XMAX;
                sum += X;
                for (int d = 0; d < D; d++)
                    planes[((size_t)d * T + t) * cols + g0 + j] = (int8_t)(uint8_t)((X >> (8 * (D - 1 - d))) & 255);
            }
            float *o = gc + ((size_t)(g0 / G) * T + t) * 4;
            o[0] = es;
            o[1] = bad ? NAN : -KM * es;
            o[2] = (float)sum * es;
            o[3] = 0.f;
        }
}

/* the GEMM's constants (cuda_gemm_i8.cu) */
enum { E_WM = 4, E_WN = 2, E_MTW = 4, E_BMT = 16, E_BROW = 80, E_GT = 8 };
#define E_MAGIC 0x4B400000u

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* a row's (scale, bias) pair as the repack stores it: bf16 halves (scale low) or f16 halves (i8_sb) */
static void emu_sb(uint32_t pr, int f16, float *s, float *b)
{
    if (!f16) {
        *s = u2f(pr << 16);
        *b = u2f(pr & 0xffff0000u);
    } else {
        *s = sn_f16_to_f32((uint16_t)(pr & 0xffff));
        *b = sn_f16_to_f32((uint16_t)(pr >> 16));
    }
}
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* mma.sync.aligned.m16n8k32.row.col.s32.u8.{s8,u8}.s32 over a warp, from the PTX fragment layout */
static void emu_mma(int32_t (*d)[4], const uint32_t (*a)[4], const uint32_t *b0, const uint32_t *b1, int sgn)
{
    int A[16][32], B[32][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 16; i++) {
            const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
            const int col = 4 * t + (i & 3) + (i >= 8 ? 16 : 0);
            A[row][col] = (int)((a[lane][i / 4] >> (8 * (i % 4))) & 255u);
        }
        for (int i = 0; i < 8; i++) {
            const int k = 4 * t + (i & 3) + (i >= 4 ? 16 : 0);
            const uint32_t v = ((i < 4 ? b0[lane] : b1[lane]) >> (8 * (i % 4))) & 255u;
            B[k][g] = sgn ? (int)(int8_t)(uint8_t)v : (int)v;
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            int64_t s = 0;
            for (int k = 0; k < 32; k++) s += (int64_t)A[row][k] * B[k][col];
            d[lane][i] = (int32_t)((uint32_t)d[lane][i] + (uint32_t)s);
        }
    }
}

/* one warp's registers across the K loop */
typedef struct {
    int32_t acc_i[32][E_MTW][6][4];
    float acc[32][E_MTW][3][4];
} emu_warp;

static float *emu_gemm(int D, const hq4 *w, const float *x, int T)
{
    const int G = w->group, GS = G / 32, HI16 = GS <= 2, SUB = GS == 1 ? 2 : 1;
    const int TTW = D == 3 ? 2 : 3, NT = D * TTW, BT = E_WN * TTW * 8;
    const int A_BYTES = E_BMT * 512, B_BYTES = D * BT * E_BROW, S_BYTES = 2 * E_BMT * 16 * 4, C_BYTES = 2 * BT * 16;
    const int STAGE = A_BYTES + B_BYTES + S_BYTES + C_BYTES;
    const int64_t cols = w->cols, rows = w->rows, groups = cols / G, KB = cols / 64;
    uint32_t *qr, *sr;
    int64_t MT;
    emu_repack(w, &qr, &sr, &MT);
    int8_t *planes = malloc((size_t)D * T * cols);
    float *gc = malloc(sizeof(float) * 4 * (size_t)groups * T);
    emu_stage(D, G, x, T, cols, planes, gc);
    float *y = malloc(sizeof(float) * (size_t)T * rows);
    for (size_t i = 0; i < (size_t)T * rows; i++) y[i] = NAN;
    uint8_t *st = malloc((size_t)STAGE);
    emu_warp *wr = malloc(sizeof(emu_warp) * 8);
    const int64_t nrb = (MT + E_BMT - 1) / E_BMT, ntb = (T + BT - 1) / BT;
    char *seen = calloc((size_t)(nrb * ntb), 1);
    for (int64_t bid = 0; bid < nrb * ntb; bid++) {
        {
            /* the kernel's grouped raster: block bid -> (row block rb, token block tb) */
            const int64_t grp = bid / (nrb * E_GT), loc = bid - grp * nrb * E_GT;
            const int64_t gsz = ntb - grp * E_GT < E_GT ? ntb - grp * E_GT : E_GT;
            const int64_t tb = grp * E_GT + loc % gsz, rb = loc / gsz;
            if (rb >= nrb || tb >= ntb || seen[rb * ntb + tb]++) {
                fprintf(stderr, "  raster: block %lld -> (%lld, %lld) out of range or twice\n", (long long)bid,
                        (long long)rb, (long long)tb);
                t_cur_failed++;
                continue;
            }
            const int64_t mt0 = rb * E_BMT;
            const int t0 = (int)(tb * BT);
            for (int wi = 0; wi < 8; wi++)
                for (int l = 0; l < 32; l++) {
                    for (int m = 0; m < E_MTW; m++)
                        for (int j = 0; j < 6; j++)
                            for (int i = 0; i < 4; i++) wr[wi].acc_i[l][m][j][i] = (int32_t)E_MAGIC;
                    for (int m = 0; m < E_MTW; m++)
                        for (int tt = 0; tt < 3; tt++)
                            for (int i = 0; i < 4; i++) wr[wi].acc[l][m][tt][i] = 0.f;
                }
            for (int kb = 0; kb < KB; kb++) {
                /* the stage as load_w / load_x fill it (16-byte chunks, zeros where src-size is 0) */
                memset(st, 0xA5, (size_t)STAGE); /* bytes no load writes: must never be read */
                for (int i = 0; i < E_BMT * 32; i++) {
                    const int64_t mt = mt0 + (i >> 5);
                    if (mt < MT) memcpy(st + i * 16, qr + ((mt * KB + kb) * 32 + (i & 31)) * 4, 16);
                    else memset(st + i * 16, 0, 16);
                }
                if (GS < 4 || (kb & 1))
                    for (int tid = 0; tid < SUB * E_BMT * 4; tid++) {
                        const int sub = tid / (E_BMT * 4), m = (tid / 4) % E_BMT, c = tid & 3;
                        const int64_t mt = mt0 + m, grp = (kb * 2 + sub) / GS;
                        uint8_t *dst = st + A_BYTES + B_BYTES + tid * 16;
                        if (mt < MT) memcpy(dst, sr + (mt * groups + grp) * 16 + 4 * c, 16);
                        else memset(dst, 0, 16);
                    }
                for (int i = 0; i < D * BT * 4; i++) {
                    const int row = i >> 2, c = i & 3, d = row / BT, t = t0 + row % BT;
                    uint8_t *dst = st + A_BYTES + row * E_BROW + c * 16;
                    if (t < T) memcpy(dst, planes + ((size_t)d * T + t) * cols + (size_t)kb * 64 + c * 16, 16);
                    else memset(dst, 0, 16);
                }
                if (GS < 4 || (kb & 1))
                    for (int i = 0; i < SUB * BT; i++) {
                        const int sub = i / BT, t = t0 + i % BT;
                        const int64_t grp = (kb * 2 + sub) / GS;
                        uint8_t *dst = st + A_BYTES + B_BYTES + S_BYTES + i * 16;
                        if (t < T) memcpy(dst, gc + ((size_t)grp * T + t) * 4, 16);
                        else memset(dst, 0, 16);
                    }
                for (int warp = 0; warp < 8; warp++) {
                    emu_warp *W = &wr[warp];
                    const int wm = warp / E_WN, wn = warp % E_WN;
                    uint32_t wa[32][E_MTW][4];
                    for (int l = 0; l < 32; l++)
                        for (int m = 0; m < E_MTW; m++)
                            memcpy(wa[l][m], st + ((wm * E_MTW + m) * 32 + l) * 16, 16);
                    for (int kt = 0; kt < 2; kt++) {
                        uint32_t a[E_MTW][32][4];
                        for (int l = 0; l < 32; l++)
                            for (int m = 0; m < E_MTW; m++) {
                                const uint32_t W0 = wa[l][m][kt ? 2 : 0], W1 = wa[l][m][kt ? 3 : 1];
                                a[m][l][0] = W0 & 0x0F0F0F0Fu;
                                a[m][l][1] = HI16 ? (W0 & 0xF0F0F0F0u) : ((W0 >> 4) & 0x0F0F0F0Fu);
                                a[m][l][2] = W1 & 0x0F0F0F0Fu;
                                a[m][l][3] = HI16 ? (W1 & 0xF0F0F0F0u) : ((W1 >> 4) & 0x0F0F0F0Fu);
                            }
                        for (int p = 0; p < NT / 2; p++) {
                            uint32_t addr[32], b[4][32];
                            for (int l = 0; l < 32; l++) {
                                const int mi = l >> 3, j = 2 * p + (mi >> 1), d = j / TTW, tt = j % TTW;
                                addr[l] = (uint32_t)(A_BYTES + (d * BT + (wn * TTW + tt) * 8 + (l & 7)) * E_BROW +
                                                     (mi & 1) * 16 + kt * 32);
                            }
                            for (int i = 0; i < 4; i++) /* ldmatrix.x4 */
                                for (int l = 0; l < 32; l++) b[i][l] = rd32(st + addr[8 * i + l / 4] + 4 * (l % 4));
                            for (int m = 0; m < E_MTW; m++) {
                                int32_t d0[32][4], d1[32][4];
                                for (int l = 0; l < 32; l++)
                                    for (int i = 0; i < 4; i++) {
                                        d0[l][i] = W->acc_i[l][m][2 * p][i];
                                        d1[l][i] = W->acc_i[l][m][2 * p + 1][i];
                                    }
                                emu_mma(d0, (const uint32_t (*)[4])a[m], b[0], b[1], (2 * p) / TTW == 0);
                                emu_mma(d1, (const uint32_t (*)[4])a[m], b[2], b[3], (2 * p + 1) / TTW == 0);
                                for (int l = 0; l < 32; l++)
                                    for (int i = 0; i < 4; i++) {
                                        W->acc_i[l][m][2 * p][i] = d0[l][i];
                                        W->acc_i[l][m][2 * p + 1][i] = d1[l][i];
                                    }
                            }
                        }
                        int sub = -1;
                        if (GS == 1) sub = kt;
                        else if (GS == 2 ? kt == 1 : (kt == 1 && (kb & 1))) sub = 0;
                        if (sub < 0) continue;
                        /* flush */
                        for (int l = 0; l < 32; l++) {
                            const int gq = l >> 2, tq = l & 3;
                            const uint8_t *Sb = st + A_BYTES + B_BYTES + (size_t)(sub * E_BMT + wm * E_MTW) * 64;
                            const uint8_t *Cb = st + A_BYTES + B_BYTES + S_BYTES + (size_t)(sub * BT + wn * TTW * 8 + 2 * tq) * 16;
                            for (int m = 0; m < E_MTW; m++)
                                for (int h = 0; h < 2; h++) {
                                    const uint32_t pr = rd32(Sb + (m * 16 + gq + 8 * h) * 4);
                                    float s, bb;
                                    emu_sb(pr, w->f16, &s, &bb);
                                    if (HI16 && h) s = s * 0.0625f;
                                    for (int tt = 0; tt < TTW; tt++)
                                        for (int c = 0; c < 2; c++) {
                                            const int i = 2 * h + c;
                                            float cv[4];
                                            memcpy(cv, Cb + (tt * 8 + c) * 16, 16);
                                            const float e = cv[0];
                                            const float c0 = e * (D == 3 ? 65536.f : 256.f);
                                            float u = fmaf(u2f((uint32_t)W->acc_i[l][m][tt][i]), c0, cv[1]);
                                            if (D == 3) {
                                                u = fmaf(u2f((uint32_t)W->acc_i[l][m][TTW + tt][i]), e * 256.f, u);
                                                u = fmaf(u2f((uint32_t)W->acc_i[l][m][2 * TTW + tt][i]), e, u);
                                            } else {
                                                u = fmaf(u2f((uint32_t)W->acc_i[l][m][TTW + tt][i]), e, u);
                                            }
                                            float *ac = &W->acc[l][m][tt][i];
                                            *ac = fmaf(s, u, *ac);
                                            *ac = fmaf(bb, cv[2], *ac);
                                        }
                                }
                            for (int m = 0; m < E_MTW; m++)
                                for (int j = 0; j < NT; j++)
                                    for (int i = 0; i < 4; i++) W->acc_i[l][m][j][i] = (int32_t)E_MAGIC;
                        }
                    }
                }
            }
            /* epilogue */
            for (int warp = 0; warp < 8; warp++) {
                const int wm = warp / E_WN, wn = warp % E_WN;
                for (int l = 0; l < 32; l++) {
                    const int gq = l >> 2, tq = l & 3;
                    for (int m = 0; m < E_MTW; m++)
                        for (int h = 0; h < 2; h++) {
                            const int64_t r = (mt0 + wm * E_MTW + m) * 16 + gq + 8 * h;
                            if (r >= rows) continue;
                            for (int tt = 0; tt < TTW; tt++)
                                for (int c = 0; c < 2; c++) {
                                    const int t = t0 + (wn * TTW + tt) * 8 + 2 * tq + c;
                                    if (t >= T) continue;
                                    const float v = wr[warp].acc[l][m][tt][2 * h + c];
                                    y[(size_t)t * rows + r] = w->bias ? v + w->bias[r] : v;
                                }
                        }
                }
            }
        }
    }
    free(seen);
    free(st);
    free(wr);
    free(qr);
    free(sr);
    free(planes);
    free(gc);
    return y;
}

/* ---- the fp16 hi/lo form (gemm_i8 = 4) on the host ---- */

enum { H_BT = 64, H_BROW = 144, H_XTOP = 14 };

/* k_hl_stage: planes [2][T][cols] fp16 bits, each 16 columns as their 8 even columns then the 8 odd ones;
 * xs [groups][T] = 2^-24 sum x 2^e (the kernel's tree: 4 columns a lane, then lanes pairwise); ts [T] = 2^(24-e) */
static void emu_stage_hl(int G, const float *x, int T, int64_t cols, uint16_t *planes, float *xs, float *ts)
{
    for (int t = 0; t < T; t++) {
        const float *v = x + (size_t)t * cols;
        int bad;
        int e2 = emu_scale_exp(v, cols, H_XTOP, &bad);
        if (e2 < -100) e2 = -100; /* the hi/lo form clamps both ways */
        ts[t] = ldexpf(1.f, 24 - e2);
        const int L = G / 4;
        float lane_sum[32];
        for (int64_t g0 = 0; g0 < cols; g0 += G) {
            for (int j = 0; j < G; j++) {
                const int64_t k = g0 + j, pos = (k & ~(int64_t)15) + (k & 1) * 8 + (k & 15) / 2;
                const float s = ldexpf(v[k], e2);
                const uint16_t h = sn_f32_to_f16(s);
                planes[(size_t)t * cols + pos] = h;
                planes[((size_t)T + t) * cols + pos] = sn_f32_to_f16(s - sn_f16_to_f32(h));
            }
            for (int l = 0; l < L; l++) {
                float s = 0.f;
                for (int j = 0; j < 4; j++) s += ldexpf(v[g0 + 4 * l + j], e2);
                lane_sum[l] = s;
            }
            for (int o = 1; o < L; o <<= 1) /* lane 0's xor butterfly */
                for (int l = 0; l < L; l += 2 * o) lane_sum[l] = lane_sum[l] + lane_sum[l + o];
            xs[(size_t)(g0 / G) * T + t] = bad ? NAN : lane_sum[0] * 0x1p-24f;
        }
    }
}

/* mma.sync.m16n8k16.row.col.f32.f16.f16.f32 from the PTX fragment layout (A: a0 (g, 2t..2t+1), a1 (g+8, 2t..),
 * a2 (g, 2t+8..), a3 (g+8, 2t+8..); B: b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); D: d0 (g, 2t), d1 (g, 2t+1),
 * d2 (g+8, 2t), d3 (g+8, 2t+1)); the 16 products summed exactly, one rounding into the accumulator (the
 * hardware's own accumulation is not IEEE: this is a model, used for the index math) */
static void emu_hmma(float (*d)[4], const uint32_t (*a)[4], const uint32_t *b0, const uint32_t *b1, int zero)
{
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++)
            for (int hf = 0; hf < 2; hf++) {
                const int row = g + (i & 1) * 8, k = 2 * t + hf + (i >> 1) * 8;
                A[row][k] = sn_f16_to_f32((uint16_t)(a[lane][i] >> (16 * hf)));
            }
        for (int hf = 0; hf < 2; hf++) {
            B[2 * t + hf][g] = sn_f16_to_f32((uint16_t)(b0[lane] >> (16 * hf)));
            B[2 * t + 8 + hf][g] = sn_f16_to_f32((uint16_t)(b1[lane] >> (16 * hf)));
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double s = zero ? 0.0 : d[lane][i];
            for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
            d[lane][i] = (float)s;
        }
    }
}

/* two nibbles (mask 0x000F000F or 0x00F000F0) as the kernel's fp16 pair: their bits as subnormals (sub), or
 * 1024 + q less 1024 (exact in fp16 either way) */
static uint32_t emu_nib(uint32_t v, uint32_t mask, int sub)
{
    if (sub) return v & mask;
    const uint32_t h = (v & mask) | 0x64006400u;
    const uint32_t lo = sn_f32_to_f16(sn_f16_to_f32((uint16_t)(h & 0xffff)) - 1024.f);
    const uint32_t hi = sn_f32_to_f16(sn_f16_to_f32((uint16_t)(h >> 16)) - 1024.f);
    return lo | hi << 16;
}

/* sub: tune gemm_hl_sub (the nibbles as subnormals, or by the magic number) */
static float *emu_gemm_hl(const hq4 *w, const float *x, int T, int sub)
{
    const int G = w->group, GS = G / 32;
    const int64_t cols = w->cols, rows = w->rows, groups = cols / G, KB = cols / 64;
    uint32_t *qr, *sr;
    int64_t MT;
    emu_repack(w, &qr, &sr, &MT);
    uint16_t *planes = malloc(sizeof(uint16_t) * 2 * (size_t)T * cols);
    float *xs = malloc(sizeof(float) * (size_t)groups * T), *ts = malloc(sizeof(float) * (size_t)T);
    emu_stage_hl(G, x, T, cols, planes, xs, ts);
    float *y = malloc(sizeof(float) * (size_t)T * rows);
    for (size_t i = 0; i < (size_t)T * rows; i++) y[i] = NAN;
    uint8_t *sb = malloc((size_t)2 * H_BT * H_BROW); /* one k-block's hi and lo rows as load_x stages them */
    for (int64_t t0 = 0; t0 < T; t0 += H_BT)
        for (int64_t mt = 0; mt < MT; mt++)
            for (int wn = 0; wn < E_WN; wn++)
                for (int j = 0; j < 4; j++) {
                    float u[32][4], acc[32][4];
                    memset(acc, 0, sizeof acc);
                    for (int64_t kb = 0; kb < KB; kb++) {
                        memset(sb, 0xA5, (size_t)2 * H_BT * H_BROW);
                        for (int i = 0; i < 2 * H_BT * 8; i++) {
                            const int row = i >> 3, c = i & 7, p = row / H_BT;
                            const int64_t t = t0 + row % H_BT;
                            uint8_t *dst = sb + row * H_BROW + c * 16;
                            if (t < T) memcpy(dst, planes + ((size_t)p * T + t) * cols + kb * 64 + c * 8, 16);
                            else memset(dst, 0, 16);
                        }
                        for (int kt = 0; kt < 2; kt++) {
                            uint32_t b[2][4][32]; /* plane, ldmatrix register, lane */
                            for (int p = 0; p < 2; p++)
                                for (int i = 0; i < 4; i++)
                                    for (int l = 0; l < 32; l++) {
                                        const int src = 8 * i + l / 4; /* the lane whose address names this row */
                                        const int off = (p * H_BT + wn * 32 + j * 8 + (src & 7)) * H_BROW + (src >> 3) * 16;
                                        b[p][i][l] = rd32(sb + off + kt * 64 + 4 * (l % 4));
                                    }
                            uint32_t a[2][32][4];
                            for (int l = 0; l < 32; l++)
                                for (int h = 0; h < 2; h++) {
                                    const uint32_t W = qr[((mt * KB + kb) * 32 + l) * 4 + 2 * kt + h], Wh = W >> 8;
                                    a[h][l][0] = emu_nib(W, 0x000F000Fu, sub);
                                    a[h][l][1] = emu_nib(W, 0x00F000F0u, sub);
                                    a[h][l][2] = emu_nib(Wh, 0x000F000Fu, sub);
                                    a[h][l][3] = emu_nib(Wh, 0x00F000F0u, sub);
                                }
                            const int z = GS == 1 || (GS == 2 ? kt == 0 : (kt == 0 && !(kb & 1)));
                            emu_hmma(u, (const uint32_t (*)[4])a[0], b[0][0], b[0][1], z);
                            emu_hmma(u, (const uint32_t (*)[4])a[0], b[1][0], b[1][1], 0);
                            emu_hmma(u, (const uint32_t (*)[4])a[1], b[0][2], b[0][3], 0);
                            emu_hmma(u, (const uint32_t (*)[4])a[1], b[1][2], b[1][3], 0);
                            const int flush = GS == 1 || (GS == 2 ? kt == 1 : (kt == 1 && (kb & 1)));
                            if (!flush) continue;
                            const int64_t grp = GS == 1 ? kb * 2 + kt : GS == 2 ? kb : kb / 2;
                            for (int l = 0; l < 32; l++)
                                for (int i = 0; i < 4; i++) {
                                    const int r = (l >> 2) + (i >= 2 ? 8 : 0);
                                    const int64_t t = t0 + wn * 32 + j * 8 + 2 * (l & 3) + (i & 1);
                                    const uint32_t pr = sr[(mt * groups + grp) * 16 + r];
                                    float s, bb;
                                    emu_sb(pr, w->f16, &s, &bb);
                                    if (i >= 2) s = s * 0.0625f;
                                    if (!sub) s = s * 0x1p-24f;
                                    const float xv = t < T ? xs[(size_t)grp * T + t] : 0.f;
                                    acc[l][i] = fmaf(s, u[l][i], acc[l][i]);
                                    acc[l][i] = fmaf(bb, xv, acc[l][i]);
                                }
                        }
                    }
                    for (int l = 0; l < 32; l++)
                        for (int i = 0; i < 4; i++) {
                            const int64_t r = mt * 16 + (l >> 2) + (i >= 2 ? 8 : 0);
                            const int64_t t = t0 + wn * 32 + j * 8 + 2 * (l & 3) + (i & 1);
                            if (r >= rows || t >= T) continue;
                            const float v = acc[l][i] * ts[t];
                            y[(size_t)t * rows + r] = w->bias ? v + w->bias[r] : v;
                        }
                }
    free(sb);
    free(qr);
    free(sr);
    free(planes);
    free(xs);
    free(ts);
    return y;
}

/* x kind 0: uniform in [-1, 1]; 1: the same with one element of each token 3000x (row 0: every group);
 * 2: |x| = 0.99999994 (just below 1: the largest X), one random sign per quant group */
static float *make_x(int T, int64_t cols, int group, int kind)
{
    float *x = malloc(sizeof(float) * (size_t)T * cols);
    for (int t = 0; t < T; t++)
        for (int64_t k = 0; k < cols; k++) x[(size_t)t * cols + k] = rnd_f(1.0f);
    if (kind == 1) {
        for (int t = 0; t < T; t++) x[(size_t)t * cols + rnd_u32() % cols] = 3000.0f;
        for (int64_t g = 0; g < cols; g += group) x[g + rnd_u32() % group] = -3000.0f;
    }
    if (kind == 2)
        for (int t = 0; t < T; t++)
            for (int64_t g = 0; g < cols; g += group) {
                float v = (rnd_u32() & 1) ? 0.99999994f : -0.99999994f;
                for (int j = 0; j < group; j++) x[(size_t)t * cols + g + j] = v;
            }
    return x;
}

typedef struct {
    int64_t rows, cols;
    int group, f16, bias, T, wkind, xkind;
} gcase;

static const gcase emu_cases[] = {
    { 37, 64, 64, 0, 0, 9, 0, 0 },      /* one 64-column block (fewer than the pipeline's stages) */
    { 150, 320, 32, 1, 1, 70, 0, 0 },   /* f16 scales, groups of 32 (two per block), bias */
    { 259, 1088, 64, 0, 1, 130, 0, 1 }, /* outliers */
    { 48, 512, 128, 0, 0, 100, 0, 0 },  /* groups of 128 (a group spans two blocks) */
    { 33, 384, 128, 1, 0, 9, 0, 1 },
    { 40, 256, 64, 0, 0, 20, 1, 2 },    /* partial-sum bound: q = 15, X at its extremes */
    { 40, 256, 32, 0, 0, 20, 1, 2 },
    { 40, 256, 128, 0, 0, 20, 1, 2 },
};

static void test_emulated(void)
{
    double worst[4] = { 0, 0, 0, 0 }; /* D=3 normal, D=3 extreme, D=2 normal, D=2 extreme */
    double worst_hl = 0;
    for (size_t ci = 0; ci < sizeof emu_cases / sizeof *emu_cases; ci++) {
        const gcase *c = &emu_cases[ci];
        hq4 w;
        hq4_make(&w, c->rows, c->cols, c->group, c->f16, c->bias, c->wkind);
        float *x = make_x(c->T, c->cols, c->group, c->xkind);
        double *ref = ref_gemm(&w, x, c->T);
        for (int D = 3; D >= 2; D--) {
            float *y = emu_gemm(D, &w, x, c->T);
            double e = rel_err(y, ref, (size_t)c->T * c->rows);
            double tol = D == 3 ? 1e-6 : 3e-4;
            int slot = (D == 3 ? 0 : 2) + (c->xkind == 2);
            if (e > worst[slot]) worst[slot] = e;
            CHECKF(e <= tol, "emulated D=%d rows=%lld cols=%lld g=%d %s T=%d x%d: rel %.3g > %.3g", D,
                   (long long)c->rows, (long long)c->cols, c->group, c->f16 ? "f16" : "bf16", c->T, c->xkind, e, tol);
            free(y);
        }
        for (int sub = 1; sub >= 0; sub--) {
            float *yh = emu_gemm_hl(&w, x, c->T, sub);
            const double eh = rel_err(yh, ref, (size_t)c->T * c->rows);
            if (eh > worst_hl) worst_hl = eh;
            CHECKF(eh <= 1e-6, "emulated hi/lo (sub %d) rows=%lld cols=%lld g=%d %s T=%d x%d: rel %.3g > 1e-6", sub,
                   (long long)c->rows, (long long)c->cols, c->group, c->f16 ? "f16" : "bf16", c->T, c->xkind, eh);
            free(yh);
        }
        free(x);
        free(ref);
        hq4_free(&w);
    }
    fprintf(stderr, "  emulated vs fp64: 3 digits worst rel %.3g (extreme case %.3g), 2 digits %.3g (%.3g), hi/lo %.3g\n",
            worst[0], worst[1], worst[2], worst[3], worst_hl);
}

/* ------------------------------------------------------------------ */
/* Part 2: the kernels on the GPU                                       */
/* ------------------------------------------------------------------ */

#ifdef SN_HAVE_CUDA
static sn_backend *C;

static sn_weight host_view(const hq4 *w)
{
    sn_weight v;
    memset(&v, 0, sizeof v);
    v.dtype = SN_DT_Q4;
    v.rows = w->rows;
    v.cols = w->cols;
    v.group = w->group;
    v.data = w->q;
    v.scales = w->sc;
    v.qbiases = w->bi;
    v.sdtype = w->f16 ? SN_DT_F16 : SN_DT_BF16;
    v.bias = w->bias;
    return v;
}

/* y = W x on the GPU with gemm_i8 = D (output poisoned with NaN first) */
static float *gpu_mm(const sn_weight *wg, const float *dx, int T, int D)
{
    size_t n = (size_t)T * wg->rows;
    float *h = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *dy = dcopy(h, n);
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", D));
    CHECK_OK(G->ops->matmul(G, wg, 0, dx, T, dy));
    if (G->ops->to_host(G, h, dy, sizeof(float) * n) != SN_OK)
        for (size_t i = 0; i < n; i++) h[i] = NAN;
    G->ops->buf_free(G, dy);
    return h;
}

static size_t n_diff(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, 4) != 0;
    return d;
}

static double worst_gpu[3]; /* hi/lo, 3 digits, 2 digits */
static double worst_hl_sub;  /* hi/lo with subnormal nibbles */

static void gpu_case(const gcase *c, int with_emu)
{
    hq4 w;
    hq4_make(&w, c->rows, c->cols, c->group, c->f16, c->bias, c->wkind);
    sn_weight wc = host_view(&w), wg = wc;
    CHECK_OK(G->ops->upload_weight(G, &wg));
    float *x = make_x(c->T, c->cols, c->group, c->xkind);
    const size_t n = (size_t)c->T * c->rows;
    float *cref = malloc(sizeof(float) * n);
    CHECK_OK(C->ops->matmul(C, &wc, 0, x, c->T, cref));
    double *cd = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) cd[i] = cref[i];
    float *dx = dcopy(x, (size_t)c->T * c->cols);
    for (int D = 4; D >= 2; D--) { /* 4: the fp16 hi/lo form */
        float *y = gpu_mm(&wg, dx, c->T, D);
        double e = rel_err(y, cd, n), tol = D == 2 ? 3e-4 : 2e-5;
        if (e > worst_gpu[4 - D]) worst_gpu[4 - D] = e;
        CHECKF(e <= tol, "gpu D=%d rows=%lld cols=%lld g=%d %s T=%d x%d bias=%d vs cpu: rel %.3g > %.3g", D,
               (long long)c->rows, (long long)c->cols, c->group, c->f16 ? "f16" : "bf16", c->T, c->xkind, c->bias, e,
               tol);
        float *y2 = gpu_mm(&wg, dx, c->T, D);
        CHECKF(n_diff(y, y2, n) == 0, "gpu D=%d T=%d: two runs differ in %zu of %zu", D, c->T, n_diff(y, y2, n), n);
        free(y2);
        if (with_emu && D == 4) {
            /* the tensor cores' fp32 accumulation is not the emulation's model: close, not bitwise */
            float *ye = emu_gemm_hl(&w, x, c->T, 0); /* the default: magic-number nibbles */
            double *yd = malloc(sizeof(double) * n);
            for (size_t i = 0; i < n; i++) yd[i] = ye[i];
            const double ee = rel_err(y, yd, n);
            CHECKF(ee <= 2e-6, "gpu hi/lo rows=%lld cols=%lld g=%d T=%d vs the emulation: rel %.3g > 2e-6",
                   (long long)c->rows, (long long)c->cols, c->group, c->T, ee);
            free(yd);
            free(ye);
        } else if (with_emu) {
            float *ye = emu_gemm(D, &w, x, c->T);
            size_t nd = n_diff(y, ye, n), f = 0;
            while (nd && f < n && !memcmp(y + f, ye + f, 4)) f++;
            CHECKF(nd == 0, "gpu D=%d rows=%lld cols=%lld g=%d T=%d: %zu of %zu outputs differ from the emulation "
                   "(first: token %zu row %zu, %.9g vs %.9g)", D, (long long)c->rows, (long long)c->cols, c->group,
                   c->T, nd, n, f / (size_t)c->rows, f % (size_t)c->rows, nd ? y[f] : 0.0, nd ? ye[f] : 0.0);
            free(ye);
        }
        if (D == 4) {
            /* the subnormal nibbles: the same products, but the H100's tensor cores do not take subnormal inputs
             * exactly (s37r1), so only the CPU bound, and how many outputs differ */
            CHECK_OK(sn_cuda_tune(G, "gemm_hl_sub", 1));
            float *ym = gpu_mm(&wg, dx, c->T, 4);
            CHECK_OK(sn_cuda_tune(G, "gemm_hl_sub", 0));
            const double em = rel_err(ym, cd, n);
            if (em > worst_hl_sub) worst_hl_sub = em;
            CHECKF(em <= tol, "gpu hi/lo (subnormal nibbles) rows=%lld cols=%lld g=%d T=%d vs cpu: rel %.3g > %.3g",
                   (long long)c->rows, (long long)c->cols, c->group, c->T, em, tol);
            const size_t nd = n_diff(y, ym, n);
            if (nd) fprintf(stderr, "  hi/lo: subnormal and magic-number nibbles differ in %zu of %zu outputs "
                            "(rows=%lld T=%d)\n", nd, n, (long long)c->rows, c->T);
            free(ym);
            /* warps of 64 rows x 32 tokens: the same instruction sequence per output, so the same bits */
            CHECK_OK(sn_cuda_tune(G, "gemm_hl_rows", 64));
            float *yw = gpu_mm(&wg, dx, c->T, 4);
            CHECK_OK(sn_cuda_tune(G, "gemm_hl_rows", 32));
            CHECKF(n_diff(y, yw, n) == 0, "gpu hi/lo rows=%lld T=%d: warps of 64 rows differ from 32 in %zu of %zu "
                   "outputs", (long long)c->rows, c->T, n_diff(y, yw, n), n);
            free(yw);
        }
        /* row invariance: tokens [t0, t0 + 9) alone give the same bits */
        if (c->T >= 18) {
            const int t0 = c->T - 9 - 3;
            float *y9 = gpu_mm(&wg, dx + (size_t)t0 * c->cols, 9, D);
            size_t nd = n_diff(y9, y + (size_t)t0 * c->rows, (size_t)9 * c->rows);
            CHECKF(nd == 0, "gpu D=%d T=%d: tokens %d..%d run as T=9 differ in %zu outputs", D, c->T, t0, t0 + 8, nd);
            free(y9);
        }
        free(y);
    }
    G->ops->buf_free(G, dx);
    free(x);
    free(cref);
    free(cd);
    hq4_free(&w);
}

static void test_gpu_vs_emulation(void)
{
    for (size_t ci = 0; ci < sizeof emu_cases / sizeof *emu_cases; ci++) gpu_case(&emu_cases[ci], 1);
}

static void test_gpu_vs_cpu(void)
{
    static const gcase cases[] = {
        { 259, 1088, 64, 0, 1, 9, 0, 0 },
        { 259, 1088, 64, 0, 1, 64, 0, 1 },
        { 130, 512, 32, 1, 0, 130, 0, 1 },
        { 300, 2048, 128, 0, 0, 130, 0, 0 },
        { 517, 5120, 64, 0, 0, 1000, 0, 1 },
        { 1000, 5120, 64, 0, 0, 64, 0, 0 },
        { 100, 17408, 64, 0, 0, 130, 0, 1 },
        { 77, 1024, 32, 0, 1, 1000, 0, 0 },
        { 60, 1024, 128, 1, 0, 1000, 0, 1 },
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) gpu_case(&cases[ci], 0);
    fprintf(stderr, "  gpu vs scalar cpu: 3 digits worst rel %.3g, 2 digits %.3g, hi/lo %.3g (subnormal nibbles %.3g)\n",
            worst_gpu[1], worst_gpu[2], worst_gpu[0], worst_hl_sub);
    CHECK(sn_cuda_tune(G, "gemm_i8", 1) == SN_E_INVALID);
    sn_clear_error();
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", 4)); /* the default */
}

/* one uploaded Q4 weight of the staging test */
typedef struct {
    hq4 h;
    sn_weight wg;
} sw;

static void sw_make(sw *w, int64_t rows, int64_t cols, int group)
{
    hq4_make(&w->h, rows, cols, group, 0, 0, 0);
    w->wg = host_view(&w->h);
    CHECK_OK(G->ops->upload_weight(G, &w->wg));
}

/* the host copy of T rows of the device output y of w */
static float *out_of(const sw *w, const float *dy, int T) { return tohost(dy, (size_t)T * w->wg.rows); }

static void test_gpu_staging_reuse(void)
{
    enum { T = 64, K = 1088 };
    sw a, b, sq, g32;
    sw_make(&a, 259, K, 64);
    sw_make(&b, 130, K, 64);
    sw_make(&sq, K, K, 64); /* y over x */
    sw_make(&g32, 77, K, 32);
    float *x = make_x(T, K, 64, 1), *z = make_x(T, K, 64, 0);
    float *dx = dcopy(x, (size_t)T * K), *dz = dcopy(z, (size_t)T * K), *dx2 = dpoison((size_t)T * K);
    float *dya = dpoison((size_t)T * 259), *dyb = dpoison((size_t)T * 130), *dyg = dpoison((size_t)T * 77);
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", 3));
    /* references: each staged fresh (a tune or a from_host between calls forgets the staging) */
    float *rb = gpu_mm(&b.wg, dx, T, 3), *rg = gpu_mm(&g32.wg, dx, T, 3), *rb9 = gpu_mm(&b.wg, dx, 9, 3);
    /* b right after a on the same x: staged once */
    CHECK_OK(G->ops->matmul(G, &a.wg, 0, dx, T, dya));
    CHECK_OK(G->ops->matmul(G, &b.wg, 0, dx, T, dyb));
    float *yb = out_of(&b, dyb, T);
    CHECKF(n_diff(yb, rb, (size_t)T * 130) == 0, "staging reuse: b after a differs from b alone");
    /* another group size, then another T: staged again */
    CHECK_OK(G->ops->matmul(G, &a.wg, 0, dx, T, dya));
    CHECK_OK(G->ops->matmul(G, &g32.wg, 0, dx, T, dyg));
    CHECK_OK(G->ops->matmul(G, &b.wg, 0, dx, 9, dyb));
    float *yg = out_of(&g32, dyg, T), *yb9 = out_of(&b, dyb, 9);
    CHECKF(n_diff(yg, rg, (size_t)T * 77) == 0, "staging reuse: a group-32 weight after a group-64 one differs");
    CHECKF(n_diff(yb9, rb9, (size_t)9 * 130) == 0, "staging reuse: T = 9 after T = 64 differs");
    /* x changed by an op in between: x2 = x + z, then b must see x2 */
    CHECK_OK(G->ops->copy(G, dx2, dx, sizeof(float) * T * K));
    CHECK_OK(G->ops->matmul(G, &a.wg, 0, dx2, T, dya));
    CHECK_OK(G->ops->add(G, dx2, dz, (size_t)T * K));
    CHECK_OK(G->ops->matmul(G, &b.wg, 0, dx2, T, dyb));
    float *yb2 = out_of(&b, dyb, T), *rb2 = gpu_mm(&b.wg, dx2, T, 3);
    CHECKF(n_diff(yb2, rb2, (size_t)T * 130) == 0, "staging reuse: x changed by an add, b used the old staging");
    /* the previous matmul wrote over x (y == x): b must see the new x */
    CHECK_OK(G->ops->matmul(G, &sq.wg, 0, dx2, T, dx2));
    CHECK_OK(G->ops->matmul(G, &b.wg, 0, dx2, T, dyb));
    float *yb3 = out_of(&b, dyb, T), *rb3 = gpu_mm(&b.wg, dx2, T, 3);
    CHECKF(n_diff(yb3, rb3, (size_t)T * 130) == 0, "staging reuse: x overwritten by a matmul, b used the old staging");
    /* the hi/lo form keeps its own staging the same way */
    float *rb4 = gpu_mm(&b.wg, dx, T, 4);
    CHECK_OK(G->ops->matmul(G, &a.wg, 0, dx, T, dya));
    CHECK_OK(G->ops->matmul(G, &b.wg, 0, dx, T, dyb));
    float *yb4 = out_of(&b, dyb, T);
    CHECKF(n_diff(yb4, rb4, (size_t)T * 130) == 0, "staging reuse (hi/lo): b after a differs from b alone");
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", 4)); /* the default */
    free(rb4); free(yb4);
    free(rb); free(rg); free(rb9); free(yb); free(yg); free(yb9); free(yb2); free(rb2); free(yb3); free(rb3);
    free(x); free(z);
    dfree(dx); dfree(dz); dfree(dx2); dfree(dya); dfree(dyb); dfree(dyg);
    hq4_free(&a.h); hq4_free(&b.h); hq4_free(&sq.h); hq4_free(&g32.h);
}

/* A token holding inf or NaN gives NaN in every output of that token (the documented limit of both
 * forms), and the other tokens the bits of the same x without it */
static void test_gpu_nonfinite(void)
{
    enum { T = 20, K = 1088 };
    hq4 w;
    hq4_make(&w, 130, K, 64, 0, 0, 0);
    sn_weight wg = host_view(&w);
    CHECK_OK(G->ops->upload_weight(G, &wg));
    float *x = make_x(T, K, 64, 0), *xb = malloc(sizeof(float) * T * K);
    memcpy(xb, x, sizeof(float) * T * K);
    xb[5 * K + 17] = INFINITY;
    xb[9 * K + 300] = NAN;
    float *dx = dcopy(x, (size_t)T * K), *dxb = dcopy(xb, (size_t)T * K);
    static const int modes[] = { 3, 4 };
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        float *y = gpu_mm(&wg, dx, T, modes[mi]), *yb = gpu_mm(&wg, dxb, T, modes[mi]);
        size_t not_nan = 0, differ = 0;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < 130; r++) {
                const float v = yb[(size_t)t * 130 + r];
                if (t == 5 || t == 9) not_nan += !isnan(v);
                else differ += memcmp(&v, y + (size_t)t * 130 + r, 4) != 0;
            }
        CHECKF(not_nan == 0, "gemm_i8=%d: %zu outputs of the tokens holding inf / NaN are not NaN", modes[mi], not_nan);
        CHECKF(differ == 0, "gemm_i8=%d: %zu outputs of the other tokens differ from the run without them", modes[mi],
               differ);
        free(y);
        free(yb);
    }
    CHECK_OK(sn_cuda_tune(G, "gemm_i8", 4)); /* the default */
    G->ops->buf_free(G, dx);
    G->ops->buf_free(G, dxb);
    free(x);
    free(xb);
    hq4_free(&w);
}

/* SANCTUM_TEST_GEMM_I8_TIME=1: the GEMM alone on the 27B prefill shapes (T = 4096), 3 and 2 digits, hi/lo and
 * the split fp16x3 GEMM (gemm_i8 = 0, cuBLAS if it loaded); ms per call and nominal TFLOP/s (2 rows cols T) */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void time_gemm(void)
{
    const char *e = getenv("SANCTUM_TEST_GEMM_I8_TIME");
    if (!e || !*e || !strcmp(e, "0")) SKIP("set SANCTUM_TEST_GEMM_I8_TIME=1 to time the GEMM");
    static const int64_t shapes[][2] = { { 17408, 5120 }, { 5120, 17408 }, { 10240, 5120 }, { 5120, 6144 } };
    const int T = 4096, reps = 10;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        hq4 w;
        hq4_make(&w, shapes[si][0], shapes[si][1], 64, 0, 0, 0);
        sn_weight wg = host_view(&w);
        CHECK_OK(G->ops->upload_weight(G, &wg));
        float *x = make_x(T, w.cols, 64, 0);
        float *dx = dcopy(x, (size_t)T * w.cols), *dy = NULL;
        void *p = NULL;
        CHECK_OK(G->ops->buf_alloc(G, sizeof(float) * (size_t)T * w.rows, &p));
        dy = p;
        fprintf(stderr, "  time %5lld x %5lld, T=%d:", (long long)w.rows, (long long)w.cols, T);
        static const struct {
            const char *name;
            int gemm_i8, hl_sub, hl_rows;
        } modes[] = { { "i8", 3, 0, 64 }, { "i8fast", 2, 0, 64 }, { "hilo", 4, 0, 64 }, { "hilo-r32", 4, 0, 32 },
                      { "hilo-sub", 4, 1, 64 }, { "hilo-sub-r32", 4, 1, 32 }, { "split", 0, 0, 64 } };
        for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
            CHECK_OK(sn_cuda_tune(G, "gemm_i8", modes[mi].gemm_i8));
            CHECK_OK(sn_cuda_tune(G, "gemm_hl_sub", modes[mi].hl_sub));
            CHECK_OK(sn_cuda_tune(G, "gemm_hl_rows", modes[mi].hl_rows));
            CHECK_OK(G->ops->matmul(G, &wg, 0, dx, T, dy)); /* warm-up (scratch growth) */
            CHECK_OK(G->ops->sync(G));
            double t0 = now_s();
            for (int r = 0; r < reps; r++) CHECK_OK(G->ops->matmul(G, &wg, 0, dx, T, dy));
            CHECK_OK(G->ops->sync(G));
            double dt = (now_s() - t0) / reps;
            fprintf(stderr, "  %s %.3f ms %.0f TFLOP/s", modes[mi].name,
                    dt * 1e3, 2.0 * w.rows * w.cols * T / dt / 1e12);
        }
        fprintf(stderr, "\n");
        CHECK_OK(sn_cuda_tune(G, "gemm_i8", 4)); /* the defaults */
        CHECK_OK(sn_cuda_tune(G, "gemm_hl_rows", 32));
        G->ops->buf_free(G, dx);
        G->ops->buf_free(G, dy);
        free(x);
        hq4_free(&w);
    }
}
#endif

int main(void)
{
    RUN(test_emulated);
#ifdef SN_HAVE_CUDA
    sn_status st = sn_backend_cuda_new(0, &G);
    if (st != SN_OK) {
        fprintf(stderr, "SKIP test_cuda_gemm_i8 (GPU part): %s\n", sn_errmsg());
        return TEST_END();
    }
    if (sn_backend_cpu_new_isa(1, SN_ISA_SCALAR, &C) != SN_OK) {
        fprintf(stderr, "cpu oracle: %s\n", sn_errmsg());
        return 1;
    }
    /* SANCTUM_TEST_GEMM_I8_TIME=only: the timing alone (for a profiler) */
    const char *only = getenv("SANCTUM_TEST_GEMM_I8_TIME");
    if (!only || strcmp(only, "only")) {
        RUN(test_gpu_vs_emulation);
        RUN(test_gpu_vs_cpu);
        RUN(test_gpu_staging_reuse);
        RUN(test_gpu_nonfinite);
    }
    RUN(time_gemm);
    if (G->ops->sync(G) != SN_OK) {
        fprintf(stderr, "final sync: %s\n", sn_errmsg());
        t_failed++;
    }
    sn_backend_free(G);
    sn_backend_free(C);
#else
    fprintf(stderr, "SKIP test_cuda_gemm_i8 (GPU part): built without CUDA (SN_CUDA=0 or no nvcc)\n");
#endif
    return TEST_END();
}
