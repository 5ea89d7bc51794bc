/* Internal contract between the CPU backend driver (cpu_backend.c) and its
 * kernels: the scalar oracle (ops_ref.c) and the SIMD files, which are
 * compiled with their own -m flags (kernels_avx2.c, kernels_avx512.c) and so
 * must only be reached through the table that matches the running CPU. */
#ifndef SANCTUM_CPU_INTERNAL_H
#define SANCTUM_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "sanctum/backend.h"
#include "sanctum/cpu.h"
#include "sanctum/tensor.h"

/* One matrix of a (possibly stacked) weight, resolved and validated. */
typedef struct {
    sn_dtype dtype;          /* F32/F16/BF16 dense, or Q4/Q8 */
    int bits;                /* 4 or 8 when quantized, else 0 */
    int64_t rows, cols;
    int group;               /* quant group (0 when dense) */
    int64_t n_groups;        /* cols / group per row */
    const uint8_t *data;     /* row r starts at data + r*row_bytes */
    size_t row_bytes;
    const uint8_t *scales;   /* row r: scales + r*n_groups*s_size (quantized) */
    const uint8_t *qbiases;
    sn_dtype sdtype;         /* BF16/F16/F32 */
    size_t s_size;           /* bytes per scale */
} cpu_mat;

/* Arguments of a matmul kernel: y[t, r] for all t < T and r in the range it
 * is given. x is [T, cols]. For quantized weights the driver also provides
 * xp (x rearranged by the table's prep_q4/ prep_q8, [T, cols]; NULL when the
 * table has none) and gsum[t, g] = sum of x[t] over group g (NULL when the
 * table does not ask for it), so a kernel can apply the affine bias once per
 * group: sum_i (s*q_i + b)*x_i = s*sum_i q_i*x_i + b*gsum. */
typedef struct {
    const cpu_mat *m;
    const float *x;
    const float *xp;
    const float *gsum;
    int T;
    float *y;                /* [T, rows] */
    int64_t pf_off;          /* software prefetch distance in bytes (0: none), see cpu_backend.c */
    int64_t row_tile;        /* T > 1: rows whose weights stay in L2 while all of x streams past */
} cpu_mm_args;

typedef void (*cpu_mm_fn)(const cpu_mm_args *a, int64_t r0, int64_t r1);

/* The blocking the SIMD quantized kernels share; TILE(a, r, t0, RB, TB,
 * ...) computes y for rows [r, r+RB) and tokens [t0, t0+TB). Decode
 * (T == 1) takes RB rows a tile to keep enough independent chains in
 * flight, except for rows of up to CPU_MM_RB1_COLS columns, which go one a
 * tile: the rows are contiguous, so that is one sequential weight stream,
 * where RB rows of 1 KB are RB interleaved ones (on the Zen 4 VM of
 * 2026-12-07, 2 threads from DRAM: 8192 x 2048 0.34-0.37 against
 * 0.51-0.54 ms on VNNI, 1B decode 35.5 against 27.2 tok/s; longer rows, whose
 * RB rows share each x load, kept their tiles: 2048 x 8192 0.39 against
 * 0.48; docs/PERFORMANCE.md, "This VM since 2026-12-07 (evening)"). Prefill tiles rows by a->row_tile, so that a tile's weights stay
 * in L2 while every token block of x streams past them (x is re-read once
 * a tile: bigger tiles, less x traffic), in token blocks of TB, then 2,
 * then 1; a block of TB tokens takes PRB rows a tile, so each x load
 * serves PRB rows (a row's x records, 4 bytes a column a token, outgrow
 * L1 at TB = 4: on the Zen 4 VM a 64-token 5120 x 5120 VNNI GEMM took
 * 34-36 ms at one row a tile, 20-23 at four). RB, PRB and TB must fold to constants so each tile shape is compiled
 * on its own; the kernels give every output the same arithmetic whatever
 * its tile, so the blocking never changes a bit. */
#define CPU_MM_RB1_COLS 4096
/* rows [rs, re) of tokens [t, t + TB): N rows a tile, then the last ones one a tile */
#define CPU_MM_ROWS_(a, rs, re, t, N, TB, TILE, ...) do { \
        int64_t r_ = (rs); \
        for (; r_ + (N) <= (re); r_ += (N)) \
            TILE((a), r_, (t), (N), (TB), __VA_ARGS__); \
        for (; r_ < (re); r_++) \
            TILE((a), r_, (t), 1, (TB), __VA_ARGS__); \
    } while (0)
#define CPU_MM_BLOCKED(a, r0, r1, RB, PRB, TB, TILE, ...) do { \
        if ((a)->T == 1) { \
            if ((a)->m->cols > CPU_MM_RB1_COLS) \
                CPU_MM_ROWS_(a, r0, r1, 0, RB, 1, TILE, __VA_ARGS__); \
            else \
                CPU_MM_ROWS_(a, r0, r1, 0, 1, 1, TILE, __VA_ARGS__); \
        } else { \
            for (int64_t rt_ = (r0); rt_ < (r1); rt_ += (a)->row_tile) { \
                const int64_t re_ = rt_ + (a)->row_tile < (r1) ? rt_ + (a)->row_tile : (r1); \
                int t_ = 0; \
                for (; t_ + (TB) <= (a)->T; t_ += (TB)) \
                    CPU_MM_ROWS_(a, rt_, re_, t_, PRB, TB, TILE, __VA_ARGS__); \
                if ((TB) > 2) \
                    for (; t_ + 2 <= (a)->T; t_ += 2) \
                        CPU_MM_ROWS_(a, rt_, re_, t_, 1, 2, TILE, __VA_ARGS__); \
                for (; t_ < (a)->T; t_++) \
                    CPU_MM_ROWS_(a, rt_, re_, t_, 1, 1, TILE, __VA_ARGS__); \
            } \
        } \
    } while (0)

typedef struct {
    sn_isa isa;
    /* Rearrange one token row of x (cols floats) for the Q4/Q8 kernels;
     * NULL means the kernel reads x as is. */
    void (*prep_q4)(const float *x, int64_t cols, float *xp);
    void (*prep_q8)(const float *x, int64_t cols, float *xp);
    int wants_gsum;          /* quantized kernels need gsum */
    int min_group;           /* SIMD quant kernels need group % min_group == 0; else ref is used */
    cpu_mm_fn mm_q4, mm_q8, mm_dense;
    /* Optional exact integer Q4 path (NULL where absent), used instead of
     * mm_q4 for groups 32, 64 and 128: prep_q4i[i] serves group 32 << i and
     * writes one x record of 4*group bytes per group (xp keeps the size of
     * [T, cols] floats; no gsum), see kernels_avx2.c. One prep function per
     * group, so plans with different groups never compare equal. */
    void (*prep_q4i[3])(const float *x, int64_t cols, float *xp);
    cpu_mm_fn mm_q4i;
    /* Optional opt-in approximate Q4 path (SANCTUM_CPU_Q4=q8; NULL where
     * absent): x quantized per token and group to 8 bits, one record of
     * 4*cols bytes per token in xp as prep_q4i's (layout: kernels_avx2.c). */
    void (*prep_q4x8[3])(const float *x, int64_t cols, float *xp);
    cpu_mm_fn mm_q4x8;
    /* Vector primitives for the ops built on them (attention, GDN, norms). */
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n);   /* y += a*x */
    void (*scale)(float *y, float a, int64_t n);                  /* y *= a */
} cpu_kernels;

/* Q4 kernel choice where the table offers more than its float kernel:
 * INT the exact integer path (mm_q4i), FP32 the float kernel (mm_q4), Q8
 * the 8-bit activation path (mm_q4x8). A table without the chosen path
 * falls back to the next one it has (q8 -> int -> fp32). */
enum { CPU_Q4_INT = 0, CPU_Q4_FP32 = 1, CPU_Q4_Q8 = 2 };

/* The CPU backend object (cpu_backend.c), shared with moe.c. */
struct sn_pool;
typedef struct {
    sn_backend base;
    struct sn_pool *pool;
    const cpu_kernels *k;
    float *scratch;
    size_t scratch_cap; /* floats */
    int pf_rows;        /* GEMV software prefetch distance in rows (0: off) */
    int q4_mode;        /* SANCTUM_CPU_Q4: CPU_Q4_INT (default), CPU_Q4_FP32 or CPU_Q4_Q8 */
    void *moe_seg;      /* moe.c's per-expert segment table, grown on demand */
    size_t moe_seg_cap; /* bytes */
} cpu_be;

/* The one scratch buffer, grown to n_floats (64-byte aligned); valid until
 * the next call. */
sn_status cpu_scratch_get(cpu_be *be, size_t n_floats, float **out);
/* Validate w and resolve expert e into m (SN_E_SHAPE / _RANGE / ... with a message). */
sn_status cpu_mat_resolve(const sn_weight *w, int expert, cpu_mat *m);

/* How one matrix is multiplied: kernel, x preparation, blocking. */
typedef struct {
    cpu_mm_fn fn;
    void (*prep)(const float *x, int64_t cols, float *xp); /* NULL: x used as is */
    int gsum;                                             /* kernel reads group sums */
    int64_t pf_off, row_tile;
} cpu_mm_plan;
void cpu_mm_plan_for(const cpu_be *be, const cpu_mat *m, cpu_mm_plan *p);
/* Floats of xp + gsum for T rows of x (0 when the kernel reads x as is). */
size_t cpu_mm_prep_floats(const cpu_mm_plan *p, const cpu_mat *m, int64_t T);
/* Prepare rows [t0, t1) of x into xp [T, cols] and gsum [T, n_groups]. */
void cpu_mm_prep_rows(const cpu_mm_plan *p, const cpu_mat *m, const float *x, int64_t t0, int64_t t1, float *xp,
                      float *gsum);
/* Output rows [r0, r1) of a->y, plus the linear bias when given. */
void cpu_mm_run_rows(const cpu_mm_plan *p, const cpu_mm_args *a, const float *bias, int64_t r0, int64_t r1);
/* Row grain of a parallel matmul. */
int64_t cpu_mm_grain(const cpu_be *be, const cpu_mat *m, int64_t T);

/* Optional MoE ops (moe.c). */
sn_status cpu_moe(sn_backend *b, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                  const float *logits, int top_k, bool norm_topk, const float *x, int T, float *out);
sn_status cpu_add_gated(sn_backend *b, float *y, const float *x, const float *g, int T, int n);

extern const cpu_kernels cpu_kernels_ref;
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;
/* The AVX-512 table with the integer Q4 paths on VNNI, exact and 8-bit
 * (kernels_avx512_vnni.c); only for a CPU with AVX512_VNNI. */
const cpu_kernels *cpu_kernels_avx512_vnni_get(void);

static inline float cpu_load_scale(const uint8_t *p, sn_dtype dt, int64_t i)
{
    uint16_t h;
    float f;
    switch (dt) {
    case SN_DT_BF16: memcpy(&h, p + 2 * i, 2); return sn_bf16_to_f32(h);
    case SN_DT_F16: memcpy(&h, p + 2 * i, 2); return sn_f16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* Scalar helpers shared with the SIMD files (for their tails). */
void cpu_ref_dequant_row(const cpu_mat *m, int64_t r, float *out);   /* out[cols] */
void cpu_ref_mm(const cpu_mm_args *a, int64_t r0, int64_t r1);       /* any dtype */

#endif

/* ---- Op bodies (ops_ref.c). Each handles a slice the driver hands it;
 * vector work goes through k's primitives, so with cpu_kernels_ref they are
 * the scalar oracle and with a SIMD table the same math, vectorised. ---- */

void cpu_op_rmsnorm_rows(const cpu_kernels *k, const float *x, const float *w, int64_t r0, int64_t r1,
                         int n, float eps, float *y);
void cpu_op_gated_rmsnorm_rows(const cpu_kernels *k, const float *o, const float *z, const float *w,
                               int64_t r0, int64_t r1, int n, float eps, float *y);
void cpu_op_add(float *y, const float *x, int64_t i0, int64_t i1);
void cpu_op_swiglu(const float *g, const float *u, int64_t i0, int64_t i1, float *out);
void cpu_op_mul_sigmoid(float *y, const float *g, int64_t i0, int64_t i1);
/* Tokens [t0, t1) of x[T, n_heads, head_dim]. */
void cpu_op_rope_tokens(float *x, int64_t t0, int64_t t1, int n_heads, int head_dim, int rot_dim, int pos0,
                        const float *inv_freq, float mscale);
/* Attention works per (token, kv head) on its G = Hq/Hkv query heads
 * together, so each cached key and value is loaded once for the group, and
 * over fixed chunks of CPU_ATTN_CHUNK cache positions: a chunk gives a
 * partial (o unnormalised [G, D], running max m [G], sum l [G]); partials
 * are merged in chunk order. Chunks depend only on absolute positions, so
 * a token's arithmetic is the same whether its chunks run one after the
 * other (prefill) or in parallel across threads (decode): batch
 * invariance. */
#define CPU_ATTN_CHUNK 64
#define CPU_ATTN_MAX_GROUP 256
/* An empty partial or running sum: o [G, D] = 0, m = -inf, l = 0. */
void cpu_op_attn_init(int G, int D, float *o, float *m, float *l);
/* Partial of query heads [kvh*G, kvh*G+G) of token t over positions [j0, j1). */
void cpu_op_attn_chunk(const cpu_kernels *k, const float *q, const sn_kv_view *kv, int t, int kvh, int G,
                       int n_q_heads, int j0, int j1, float scale, float *o, float *m, float *l);
/* The same for every kv head h at once (one pass over the keys): head h's
 * partial at part + h * part_stride, laid out as o [G, D], m [G], l [G]. */
void cpu_op_attn_chunk_heads(const cpu_kernels *k, const float *q, const sn_kv_view *kv, int t, int G, int n_q_heads,
                             int j0, int j1, float scale, float *part, size_t part_stride);
/* Running (O, M, L) ⊕= partial (o, m, l); O, M, L start as 0, -inf, 0. */
void cpu_op_attn_merge(const cpu_kernels *k, int G, int D, const float *o, const float *m, const float *l, float *O,
                       float *M, float *L);
/* O[g] /= L[g]. */
void cpu_op_attn_finish(const cpu_kernels *k, int G, int D, float *O, const float *L);

/* GatedDeltaNet pieces, run in this order by the driver. */
typedef struct {
    const sn_gdn_dims *d;
    int conv_dim, key_dim, T;   /* conv_dim = 2*Hk*Dk + Hv*Dv, key_dim = Hk*Dk */
    float l2_eps;
    const float *qkv, *a, *b, *conv_w, *A_log, *dt_bias;
    sn_gdn_view *st;
    float *c;                   /* scratch [T, conv_dim]: conv+SiLU output, q/k normalised in place */
    float *out;                 /* [T, Hv*Dv] */
} cpu_gdn_job;
/* Channels [c0, c1): causal conv + SiLU for all T, then the conv state. */
void cpu_op_gdn_conv(const cpu_gdn_job *j, int64_t c0, int64_t c1);
/* Vectors [v0, v1) of the 2*T*Hk q/k head vectors: l2norm (q also * Dk^-0.5). */
void cpu_op_gdn_l2norm(const cpu_kernels *k, const cpu_gdn_job *j, int64_t v0, int64_t v1);
/* Value head hv: the delta rule over the T tokens. */
void cpu_op_gdn_head(const cpu_kernels *k, const cpu_gdn_job *j, int hv);
#define CPU_GDN_MAX_DV 1024
#define CPU_GDN_MAX_CONV_K 16
