/* Host emulation of k_pf_attn (src/backend/cuda/cuda_prefill.cu) for
 * tests/test_cuda_prefill.c: the kernel's per-lane index math transcribed
 * line for line (shared-memory layouts, fragment loads, the P fragments
 * built from the S accumulators, masking, online softmax, hi/lo splits in
 * _Float16), with mma.sync m16n8k16 emulated from the PTX ISA fragment
 * layout (A rows g / g+8, columns 2t / 2t+8; B k = 2t / 2t+8, n = g;
 * C rows g / g+8, columns 2t). It checks here, without a GPU, that the
 * kernel's indexing computes causal GQA attention; the products are exact
 * (double) so it says nothing about the tensor cores' own rounding. KEEP
 * IN STEP WITH k_pf_attn when that changes. */
#ifndef SANCTUM_CUDA_PREFILL_EMU_H
#define SANCTUM_CUDA_PREFILL_EMU_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef _Float16 h16;
static h16 f2h(float x) { return (h16)x; }
static float h2f(h16 x) { return (float)x; }
static uint32_t pack2(h16 lo, h16 hi)
{
    uint16_t a, b;
    memcpy(&a, &lo, 2);
    memcpy(&b, &hi, 2);
    return (uint32_t)a | ((uint32_t)b << 16);
}
static void unpack2(uint32_t r, float *lo, float *hi)
{
    uint16_t a = r & 0xffff, b = r >> 16;
    h16 x, y;
    memcpy(&x, &a, 2);
    memcpy(&y, &b, 2);
    *lo = h2f(x);
    *hi = h2f(y);
}
static uint32_t ld32(const h16 *p)
{
    uint32_t r;
    memcpy(&r, p, 4);
    return r;
}

/* warp-wide mma m16n8k16: d[lane][4] += A(a[lane][4]) * B(b0[lane], b1[lane]) */
static void mma(float d[32][4], uint32_t a[32][4], uint32_t b0[32], uint32_t b1[32])
{
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        int g = lane >> 2, t = lane & 3;
        float x, y;
        unpack2(a[lane][0], &x, &y); A[g][2 * t] = x; A[g][2 * t + 1] = y;
        unpack2(a[lane][1], &x, &y); A[g + 8][2 * t] = x; A[g + 8][2 * t + 1] = y;
        unpack2(a[lane][2], &x, &y); A[g][2 * t + 8] = x; A[g][2 * t + 9] = y;
        unpack2(a[lane][3], &x, &y); A[g + 8][2 * t + 8] = x; A[g + 8][2 * t + 9] = y;
        unpack2(b0[lane], &x, &y); B[2 * t][g] = x; B[2 * t + 1][g] = y;
        unpack2(b1[lane], &x, &y); B[2 * t + 8][g] = x; B[2 * t + 9][g] = y;
    }
    for (int lane = 0; lane < 32; lane++) {
        int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++) {
            int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double s = d[lane][i];
            for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
            d[lane][i] = (float)s;
        }
    }
}

#define MAXD 256
static void emu(int D, int BK, int NW, const float *q, const float *kc, const float *vc, int T, int Hq, int Hkv,
                int Dr, int p0, float scale, float *out)
{
    const int BQ = 16 * NW, LDQ = D + 8, LDK = D + 8, LDV = BK + 8;
    const float LO = 2048.f, INV_LO = 1.f / 2048.f, PS = 32768.f;
    h16 *Qh = calloc((size_t)BQ * LDQ, 2), *Ql = calloc((size_t)BQ * LDQ, 2), *Kh = calloc((size_t)BK * LDK, 2),
        *Kl = calloc((size_t)BK * LDK, 2), *Vh = calloc((size_t)D * LDV, 2), *Vl = calloc((size_t)D * LDV, 2);
    int nqt = (T + BQ - 1) / BQ;
    size_t stride = (size_t)Hkv * Dr;
    static float o[8][32][MAXD / 8][4];
    static float m_lo[8][32], m_hi[8][32], l_lo[8][32], l_hi[8][32];
    for (int h = 0; h < Hq; h++)
        for (int qt = 0; qt < nqt; qt++) {
            int kvh = h / (Hq / Hkv), t0 = qt * BQ;
            const float *kb = kc + (size_t)kvh * Dr, *vb = vc + (size_t)kvh * Dr;
            for (int e = 0; e < BQ * D; e++) {
                int r = e / D, d = e % D, t = t0 + r;
                float x = (t < T && d < Dr) ? q[((size_t)t * Hq + h) * Dr + d] * scale : 0.f;
                h16 hi = f2h(x);
                Qh[r * LDQ + d] = hi;
                Ql[r * LDQ + d] = f2h((x - h2f(hi)) * LO);
            }
            int kend = p0 + (T < t0 + BQ ? T : t0 + BQ);
            for (int w = 0; w < NW; w++)
                for (int lane = 0; lane < 32; lane++) {
                    for (int nd = 0; nd < D / 8; nd++) o[w][lane][nd][0] = o[w][lane][nd][1] = o[w][lane][nd][2] = o[w][lane][nd][3] = 0;
                    m_lo[w][lane] = m_hi[w][lane] = -INFINITY;
                    l_lo[w][lane] = l_hi[w][lane] = 0;
                }
            for (int k0 = 0; k0 < kend; k0 += BK) {
                for (int e = 0; e < BK * D; e++) {
                    int r = e / D, d = e % D, j = k0 + r;
                    float x = (j < kend && d < Dr) ? kb[(size_t)j * stride + d] : 0.f;
                    h16 hi = f2h(x);
                    Kh[r * LDK + d] = hi;
                    Kl[r * LDK + d] = f2h((x - h2f(hi)) * LO);
                }
                for (int e = 0; e < (BK / 2) * D; e++) {
                    int kp = e / D, d = e % D, j = k0 + 2 * kp;
                    int in = d < Dr;
                    float x0 = (in && j < kend) ? vb[(size_t)j * stride + d] : 0.f;
                    float x1 = (in && j + 1 < kend) ? vb[(size_t)(j + 1) * stride + d] : 0.f;
                    h16 h0 = f2h(x0), h1 = f2h(x1);
                    uint32_t a = pack2(h0, h1), b = pack2(f2h(x0 - h2f(h0)), f2h(x1 - h2f(h1)));
                    memcpy(Vh + d * LDV + 2 * kp, &a, 4);
                    memcpy(Vl + d * LDV + 2 * kp, &b, 4);
                }
                for (int warp = 0; warp < NW; warp++) {
                    int wr0 = t0 + warp * 16;
                    int wact = wr0 < T;
                    int wkend = p0 + (T < wr0 + 16 ? T : wr0 + 16);
                    if (!wact || k0 >= wkend) continue;
                    static float shh[8][32][4], sx[8][32][4];
                    memset(shh, 0, sizeof shh);
                    memset(sx, 0, sizeof sx);
                    for (int ks = 0; ks < D / 16; ks++) {
                        uint32_t ah[32][4], al[32][4];
                        for (int lane = 0; lane < 32; lane++) {
                            int g = lane >> 2, tig = lane & 3;
                            const h16 *qa = Qh + (warp * 16 + g) * LDQ + ks * 16 + 2 * tig;
                            const h16 *qb = Ql + (warp * 16 + g) * LDQ + ks * 16 + 2 * tig;
                            ah[lane][0] = ld32(qa); ah[lane][1] = ld32(qa + 8 * LDQ); ah[lane][2] = ld32(qa + 8); ah[lane][3] = ld32(qa + 8 * LDQ + 8);
                            al[lane][0] = ld32(qb); al[lane][1] = ld32(qb + 8 * LDQ); al[lane][2] = ld32(qb + 8); al[lane][3] = ld32(qb + 8 * LDQ + 8);
                        }
                        for (int nt = 0; nt < BK / 8; nt++) {
                            uint32_t bh0[32], bh1[32], bl0[32], bl1[32];
                            for (int lane = 0; lane < 32; lane++) {
                                int g = lane >> 2, tig = lane & 3;
                                const h16 *ka = Kh + (nt * 8 + g) * LDK + ks * 16 + 2 * tig;
                                const h16 *kl = Kl + (nt * 8 + g) * LDK + ks * 16 + 2 * tig;
                                bh0[lane] = ld32(ka); bh1[lane] = ld32(ka + 8); bl0[lane] = ld32(kl); bl1[lane] = ld32(kl + 8);
                            }
                            float dd[32][4];
                            for (int l = 0; l < 32; l++) memcpy(dd[l], shh[nt][l], 16);
                            mma(dd, ah, bh0, bh1);
                            for (int l = 0; l < 32; l++) memcpy(shh[nt][l], dd[l], 16);
                            for (int l = 0; l < 32; l++) memcpy(dd[l], sx[nt][l], 16);
                            mma(dd, ah, bl0, bl1);
                            mma(dd, al, bh0, bh1);
                            for (int l = 0; l < 32; l++) memcpy(sx[nt][l], dd[l], 16);
                        }
                    }
                    float mx_lo[32], mx_hi[32];
                    for (int lane = 0; lane < 32; lane++) {
                        int g = lane >> 2, tig = lane & 3;
                        int r_lo = wr0 + g, r_hi = wr0 + g + 8;
                        int qp_lo = r_lo < T ? p0 + r_lo : -1, qp_hi = r_hi < T ? p0 + r_hi : -1;
                        mx_lo[lane] = m_lo[warp][lane];
                        mx_hi[lane] = m_hi[warp][lane];
                        for (int nt = 0; nt < BK / 8; nt++)
                            for (int e = 0; e < 2; e++) {
                                int j = k0 + nt * 8 + 2 * tig + e;
                                float s0 = fmaf(sx[nt][lane][e], INV_LO, shh[nt][lane][e]);
                                float s1 = fmaf(sx[nt][lane][2 + e], INV_LO, shh[nt][lane][2 + e]);
                                s0 = j <= qp_lo ? s0 : -INFINITY;
                                s1 = j <= qp_hi ? s1 : -INFINITY;
                                shh[nt][lane][e] = s0;
                                shh[nt][lane][2 + e] = s1;
                                mx_lo[lane] = fmaxf(mx_lo[lane], s0);
                                mx_hi[lane] = fmaxf(mx_hi[lane], s1);
                            }
                    }
                    for (int lane = 0; lane < 32; lane += 4) { /* quad max */
                        float a = -INFINITY, b = -INFINITY;
                        for (int i = 0; i < 4; i++) { a = fmaxf(a, mx_lo[lane + i]); b = fmaxf(b, mx_hi[lane + i]); }
                        for (int i = 0; i < 4; i++) { mx_lo[lane + i] = a; mx_hi[lane + i] = b; }
                    }
                    uint32_t ph[32][MAXD / 16 > 4 ? 4 : 4][4], pl[32][4][4];
                    for (int lane = 0; lane < 32; lane++) {
                        float c_lo = mx_lo[lane] == -INFINITY ? 1.f : expf(m_lo[warp][lane] - mx_lo[lane]);
                        float c_hi = mx_hi[lane] == -INFINITY ? 1.f : expf(m_hi[warp][lane] - mx_hi[lane]);
                        m_lo[warp][lane] = mx_lo[lane];
                        m_hi[warp][lane] = mx_hi[lane];
                        l_lo[warp][lane] *= c_lo;
                        l_hi[warp][lane] *= c_hi;
                        for (int nd = 0; nd < D / 8; nd++) {
                            o[warp][lane][nd][0] *= c_lo; o[warp][lane][nd][1] *= c_lo;
                            o[warp][lane][nd][2] *= c_hi; o[warp][lane][nd][3] *= c_hi;
                        }
                        for (int nt = 0; nt < BK / 8; nt++) {
                            float p[4];
                            for (int i = 0; i < 4; i++) {
                                float s = shh[nt][lane][i], mm = i < 2 ? m_lo[warp][lane] : m_hi[warp][lane];
                                p[i] = s == -INFINITY ? 0.f : expf(s - mm);
                            }
                            l_lo[warp][lane] += p[0] + p[1];
                            l_hi[warp][lane] += p[2] + p[3];
                            h16 hh[4], hl[4];
                            for (int i = 0; i < 4; i++) {
                                float ps = p[i] * PS;
                                hh[i] = f2h(ps);
                                hl[i] = f2h(ps - h2f(hh[i]));
                            }
                            int kk = nt >> 1, hf = nt & 1;
                            ph[lane][kk][2 * hf] = pack2(hh[0], hh[1]);
                            ph[lane][kk][2 * hf + 1] = pack2(hh[2], hh[3]);
                            pl[lane][kk][2 * hf] = pack2(hl[0], hl[1]);
                            pl[lane][kk][2 * hf + 1] = pack2(hl[2], hl[3]);
                        }
                    }
                    for (int kk = 0; kk < BK / 16; kk++)
                        for (int nd = 0; nd < D / 8; nd++) {
                            uint32_t b0[32], b1[32], c0[32], c1[32], A1[32][4], A2[32][4];
                            for (int lane = 0; lane < 32; lane++) {
                                int g = lane >> 2, tig = lane & 3;
                                const h16 *va = Vh + (nd * 8 + g) * LDV + kk * 16 + 2 * tig;
                                const h16 *vl = Vl + (nd * 8 + g) * LDV + kk * 16 + 2 * tig;
                                b0[lane] = ld32(va); b1[lane] = ld32(va + 8); c0[lane] = ld32(vl); c1[lane] = ld32(vl + 8);
                                memcpy(A1[lane], ph[lane][kk], 16);
                                memcpy(A2[lane], pl[lane][kk], 16);
                            }
                            float dd[32][4];
                            for (int l = 0; l < 32; l++) memcpy(dd[l], o[warp][l][nd], 16);
                            mma(dd, A1, b0, b1);
                            mma(dd, A1, c0, c1);
                            mma(dd, A2, b0, b1);
                            for (int l = 0; l < 32; l++) memcpy(o[warp][l][nd], dd[l], 16);
                        }
                }
            }
            for (int warp = 0; warp < NW; warp++) {
                int wr0 = t0 + warp * 16;
                if (wr0 >= T) continue;
                for (int lane = 0; lane < 32; lane++) {
                    int g = lane >> 2, tig = lane & 3, q0 = lane & ~3;
                    float L1 = 0, L2 = 0;
                    for (int i = 0; i < 4; i++) { L1 += l_lo[warp][q0 + i]; L2 += l_hi[warp][q0 + i]; }
                    float i_lo = 1.f / (L1 * PS), i_hi = 1.f / (L2 * PS);
                    int r_lo = wr0 + g, r_hi = wr0 + g + 8;
                    for (int nd = 0; nd < D / 8; nd++) {
                        int d = nd * 8 + 2 * tig;
                        if (r_lo < T) {
                            float *op = out + ((size_t)r_lo * Hq + h) * Dr;
                            if (d < Dr) op[d] = o[warp][lane][nd][0] * i_lo;
                            if (d + 1 < Dr) op[d + 1] = o[warp][lane][nd][1] * i_lo;
                        }
                        if (r_hi < T) {
                            float *op = out + ((size_t)r_hi * Hq + h) * Dr;
                            if (d < Dr) op[d] = o[warp][lane][nd][2] * i_hi;
                            if (d + 1 < Dr) op[d + 1] = o[warp][lane][nd][3] * i_hi;
                        }
                    }
                }
            }
        }
    free(Qh); free(Ql); free(Kh); free(Kl); free(Vh); free(Vl);
}


static void ref(const float *q, const float *kc, const float *vc, int T, int Hq, int Hkv, int D, int p0, float scale, float *out)
{
    size_t stride = (size_t)Hkv * D;
    double *s = malloc(sizeof(double) * (p0 + T));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            int kvh = h / (Hq / Hkv), n = p0 + t + 1;
            double mx = -1e300;
            for (int j = 0; j < n; j++) {
                double a = 0;
                for (int d = 0; d < D; d++) a += (double)q[((size_t)t * Hq + h) * D + d] * kc[j * stride + kvh * D + d];
                s[j] = a * scale;
                if (s[j] > mx) mx = s[j];
            }
            double l = 0;
            for (int j = 0; j < n; j++) { s[j] = exp(s[j] - mx); l += s[j]; }
            for (int d = 0; d < D; d++) {
                double a = 0;
                for (int j = 0; j < n; j++) a += s[j] * vc[j * stride + kvh * D + d];
                out[((size_t)t * Hq + h) * D + d] = (float)(a / l);
            }
        }
    free(s);
}

static double emu_worst;
static int emu_run(int T, int p0, int Hq, int Hkv, int Dr, float amp)
{
    int D = Dr <= 64 ? 64 : Dr <= 128 ? 128 : 256, BK = D == 256 ? 32 : 64, NW = D == 256 ? 8 : 4;
    int ctx = p0 + T + 3;
    size_t row = (size_t)Hkv * Dr;
    float *k = malloc(sizeof(float) * ctx * row), *v = malloc(sizeof(float) * ctx * row), *q = malloc(sizeof(float) * T * Hq * Dr);
    for (size_t i = 0; i < ctx * row; i++) { k[i] = rnd_f(amp); v[i] = rnd_f(1.f); }
    for (size_t i = (size_t)(p0 + T) * row; i < ctx * row; i++) { k[i] = NAN; v[i] = NAN; }
    for (size_t i = 0; i < (size_t)T * Hq * Dr; i++) q[i] = rnd_f(amp);
    float *o1 = malloc(sizeof(float) * T * Hq * Dr), *o2 = malloc(sizeof(float) * T * Hq * Dr);
    for (size_t i = 0; i < (size_t)T * Hq * Dr; i++) o2[i] = NAN;
    float scale = 1.f / sqrtf((float)Dr);
    ref(q, k, v, T, Hq, Hkv, Dr, p0, scale, o1);
    emu(D, BK, NW, q, k, v, T, Hq, Hkv, Dr, p0, scale, o2);
    double num = 0, den = 0;
    int bad = 0;
    for (size_t i = 0; i < (size_t)T * Hq * Dr; i++) {
        if (!isfinite(o2[i])) bad++;
        num += ((double)o2[i] - o1[i]) * ((double)o2[i] - o1[i]);
        den += (double)o1[i] * o1[i];
    }
    if (sqrt(num / den) > emu_worst) emu_worst = sqrt(num / den);
    CHECKF(bad == 0 && sqrt(num / den) < 2e-5, "emulated flash T=%d p0=%d Hq=%d Hkv=%d D=%d amp=%g: rel %.3g, non-finite %d", T, p0, Hq, Hkv, Dr, amp, sqrt(num / den), bad);
    free(k); free(v); free(q); free(o1); free(o2);
    return bad == 0 && sqrt(num / den) < 2e-5;
}


#endif
