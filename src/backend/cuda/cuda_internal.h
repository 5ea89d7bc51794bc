/* Internal contract of the CUDA backend: the driver (cuda_backend.cu: memory,
 * weight upload, the op table, step recording and graph replay) and the
 * kernel files (cuda_matmul.cu, cuda_ops.cu), which export plain launch
 * functions that enqueue on a stream and check the launch.
 *
 * Conventions: activations are fp32 row-major in device memory; every
 * launcher returns sn_status (SN_E_BACKEND with the CUDA error text when a
 * launch fails). Positions that change from one decode step to the next are
 * passed as (pos0, d_delta): the kernel uses pos0 + *d_delta, so a captured
 * CUDA graph can be replayed at a later position by rewriting one device int
 * (d_delta points at a constant 0 outside graphs). */
#ifndef SANCTUM_CUDA_INTERNAL_H
#define SANCTUM_CUDA_INTERNAL_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "sanctum/backend.h"
}

#define CU_CHECK_LAUNCH(what)                                                                   \
    do {                                                                                        \
        cudaError_t _e = cudaGetLastError();                                                    \
        if (_e != cudaSuccess)                                                                  \
            return SN_FAIL(SN_E_BACKEND, "%s: %s", (what), cudaGetErrorString(_e));             \
    } while (0)

#define CU_TRY(call, what)                                                                      \
    do {                                                                                        \
        cudaError_t _e = (call);                                                                \
        if (_e != cudaSuccess)                                                                  \
            return SN_FAIL(SN_E_BACKEND, "%s: %s", (what), cudaGetErrorString(_e));             \
    } while (0)

/* Programmatic dependent launch (sm_90). A kernel launched with cu_launch
 * may start while the kernel before it in the stream is still running:
 * pdl_launch() lets the next one be scheduled (first thing in a kernel that
 * prefetches weights, after pdl_wait in the others: pdl_enter), and every
 * kernel calls pdl_wait() before it touches any activation, which blocks until the
 * previous kernel has finished and its writes are visible. Only constant
 * data (weights) may be read before pdl_wait(), and nothing may be written
 * (one exception, ordered by flags instead: the MoE down kernel's early
 * start, cuda_moe.cu md_publish).
 * Without the launch attribute both are no-ops. cu_pdl says which launches
 * carry it: 0 none, 1 every kernel, 2 (default) only the kernels that
 * prefetch weights before pdl_wait (launched with cu_launch_w). With 1,
 * when every kernel still triggered its dependents first thing, 35B-A3B
 * decode ran 3.24-3.28 against 2.92-2.94 ms per step off, the 27B
 * 8.30-8.54 against 8.70-8.76 (results.log 21:43Z); with the trigger after
 * the wait in the others, three interleaved rounds at 4096 context
 * (22:13Z): 35B-A3B 2.826-2.837 ms (2), 3.014-3.027 (1), 2.864-2.869 (0);
 * 27B 8.311-8.465 (2), 8.314-8.362 (1), 8.509-8.573 (0). Set at backend
 * creation from SANCTUM_CUDA_PDL, or by the tune key pdl. */
__device__ __forceinline__ void pdl_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* For a kernel with nothing to prefetch: wait, then let the next kernel be
 * scheduled, so at most one kernel sits resident in pdl_wait behind the one
 * that runs (triggering first let a chain of small kernels all become
 * resident and spin; the trigger's place never changes what is computed,
 * pdl_wait waits for the whole previous grid either way). */
__device__ __forceinline__ void pdl_enter()
{
    pdl_wait();
    pdl_launch();
}

/* Four 8x8 b16 matrices from shared memory (saddr a shared-window address):
 * lane 8 i + r names row r of matrix i, and register i of lane 4 g + t gets
 * row g, columns 2 t and 2 t + 1 of matrix i, the mma.sync fragment layout. */
__device__ __forceinline__ void cu_ldsm_x4(uint32_t (&r)[4], uint32_t saddr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(saddr)
                 : "memory");
}

extern int cu_pdl;
/* With cu_pdl 2, an 8-bit weight kernel (a MoE router, a shared-expert
 * gate) reading fewer bytes of weights than this goes without the edge
 * (tune pdl_min_kb, default 2048; 0: every one takes it). Measured, not
 * explained: the 35B-A3B's Q8 router (0.5 MB) ran 2-3 % of a step faster
 * without its edge (run 36), while the default model, whose 4-bit GEMVs
 * are all under 2 MB, ran 18 % faster with every edge (run 37). */
extern int64_t cu_pdl_min_bytes;
/* Set after a memcpy/memset is queued: the next cu_launch then goes
 * without the attribute (a programmatic edge is a kernel-to-kernel thing). */
extern thread_local int cu_pdl_skip;
/* Whether the last kernel queued by cu_launch_pdl on this thread carried
 * the edge (0: it started only after all work before it had finished) */
extern thread_local int cu_last_edge;

template <typename... KP, typename... A>
cudaError_t cu_launch_pdl(bool edge, void (*kern)(KP...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = edge && !cu_pdl_skip ? 1 : 0;
    cu_pdl_skip = 0;
    cu_last_edge = (int)cfg.numAttrs;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<A &&>(args)...);
}

/* With cu_pdl 2, the small kernels that take the edge anyway (tune
 * pdl_small, bits; default 0): 1 the gated RMSNorm, 2 the decode attention,
 * 4 its combine, 8 the GDN step after the folded conv, 16 the attention
 * prep, 32 the stream-K GEMV's x digits (k_x_digits). Each starts with
 * pdl_enter, so the edge only lets its blocks sit resident, waiting, while
 * the kernel before it runs (where they fit). */
extern int cu_pdl_small;
enum { PDL_GATED_NORM = 1, PDL_ATTN = 2, PDL_COMBINE = 4, PDL_GDN = 8, PDL_ATTN_PREP = 16, PDL_X_DIGITS = 32 };

/* A kernel that reads only activations after pdl_wait: the edge when
 * cu_pdl is 1. */
template <typename... KP, typename... A>
cudaError_t cu_launch(void (*kern)(KP...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args)
{
    return cu_launch_pdl(cu_pdl == 1, kern, grid, block, smem, s, static_cast<A &&>(args)...);
}

/* cu_launch, or the edge under cu_pdl 2 where cu_pdl_small has bit */
template <typename... KP, typename... A>
cudaError_t cu_launch_small(int bit, void (*kern)(KP...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                            A &&...args)
{
    return cu_launch_pdl(cu_pdl == 1 || (cu_pdl == 2 && (cu_pdl_small & bit)), kern, grid, block, smem, s,
                         static_cast<A &&>(args)...);
}

/* A kernel that streams wbytes of weights of bits bits into its pipeline
 * before pdl_wait: the edge when cu_pdl is 1, or 2 unless an 8-bit weight
 * reads fewer than cu_pdl_min_bytes. */
template <typename... KP, typename... A>
cudaError_t cu_launch_w(int bits, int64_t wbytes, void (*kern)(KP...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, A &&...args)
{
    const bool edge = cu_pdl == 1 || (cu_pdl == 2 && (bits != 8 || wbytes >= cu_pdl_min_bytes));
    return cu_launch_pdl(edge, kern, grid, block, smem, s, static_cast<A &&>(args)...);
}

/* Weight formats on the device. Quantized weights keep MLX's packed words
 * exactly as stored ([E, rows, words]); scales and quantization biases are
 * interleaved at upload into one pair per group ([E, rows, groups] of
 * (scale, bias)) so a kernel fetches both with one load, in the stored scale
 * dtype (bf16/f16 pairs are 4 bytes, f32 pairs 8). Dense weights are copied
 * as stored. */
enum { CW_Q4 = 0, CW_Q8 = 1, CW_F32 = 2, CW_F16 = 3, CW_BF16 = 4 };
enum { CS_BF16 = 0, CS_F16 = 1, CS_F32 = 2 };

typedef struct cu_weight {
    int fmt;              /* CW_* */
    int sfmt;             /* CS_* (quantized only) */
    int bits, group;      /* quantized only */
    int64_t rows, cols, n_experts; /* n_experts >= 1 here (1 for a plain matrix) */
    int64_t words;        /* uint32 words per row (quantized) */
    int64_t groups;       /* groups per row (quantized) */
    void *q;              /* packed words or dense values */
    void *sb;             /* interleaved (scale, bias) pairs */
    float *bias;          /* optional linear bias [rows] */
    /* Q4 repacked for the integer tensor-core GEMV and GEMMs (cu_repack_q4),
     * NULL when the weight does not qualify: mt tiles of 16 rows, per tile
     * and 64 columns one uint4 per lane holding that lane's mma.m16n8k32 A
     * fragments of two k-tiles; sr the (scale, bias) pairs as [mt][group][16].
     * An expert stack (rows % 16 == 0) is repacked as one [E * rows] matrix,
     * for the MoE prefill GEMM only (cu_repacked_plain tells the two apart). */
    uint4 *qr;
    void *sr;
    int64_t mt;
    size_t bytes;         /* device bytes held */
    struct cu_weight *next; /* the backend's list, freed on destroy */
} cu_weight;

/* The packed weight bytes a GEMV launch over the segments of g reads (its
 * rows[0..n) at w0's words per row): cu_launch_w's wbytes for the SIMT
 * (gemv_seg) and integer (gi_seg) GEMVs alike. */
template <typename Seg>
int64_t cu_seg_weight_bytes(const Seg &g, const cu_weight *w0)
{
    int64_t rows = 0;
    for (int i = 0; i < g.n; i++)
        rows += g.rows[i];
    return rows * w0->words * 4;
}

/* a repacked copy of a plain matrix (expert stacks may carry one too, for
 * the MoE prefill GEMM only) */
static inline bool cu_repacked_plain(const cu_weight *w) { return w->qr && w->n_experts == 1; }

/* ---- matmul family (cuda_matmul.cu) ---- */

/* Per-device limits the launchers size grids from. */
typedef struct {
    int n_sm;
    size_t smem_optin;    /* max dynamic shared memory per block */
    int gemv_rpw;         /* rows per warp of the quantized GEMV: 0 = by shape, else 1, 2 or 4 */
    int gemv_pre;         /* SIMT GEMV: ring chunks per warp issued before x's loads (0..8, 8 = all; default 1) */
    int gemv_dp;          /* Q4 SIMT GEMV on x's integer digits (dp4a) instead of fp32 FMAs (default 1) */
    int attn_splits;      /* KV splits of the decode attention: 64 (default) or 128 */
    int attn_warps;       /* warps per block of the GQA decode attention: 0 = by shape (default), 4 or 8 */
    int gemv_rpw1_rows;   /* by shape, T <= 2: a GEMV launch of fewer rows takes one row per warp */
    int gemv_q8s_rows;    /* an 8-bit matrix of fewer rows takes k_gemv_q8s, alone or grouped (0 = never) */
    void *blas;           /* cuBLAS context (cuda_blas.cu) or NULL when not loaded */
    int blas_min_t;       /* quantized GEMMs of at least this many tokens use cuBLAS; 0 = never */
    int gemm_fast;        /* 1: single fp16 pass (11-bit operands); 0: split fp16x3, fp32-class (default) */
    int moe_gemm;         /* MoE of T >= 32 tokens as grouped expert GEMMs (1, default) or per-token GEMVs */
    int gemv_i8;          /* decode GEMV on the integer tensor cores for repacked Q4 weights (1, default) */
    int gemv_mb;          /* 16-row tiles per block of that GEMV: 1, 2, or 0 = by shape (default) */
    int gemv_sk;          /* that GEMV in its stream-K form (1, default) or the per-block ring form (0) */
    int64_t gemv_i8_min;  /* 4-bit bytes below which a decode GEMV (or group) takes the fp32 kernel; < 0: by shape (default) */
    int gemv_sk_bps;      /* blocks per SM its split assumes: 1 or 2 (default) */
    int gemv_dyn;         /* SIMT GEMV pool form: percent of row groups dealt statically (1..99), the rest
                           * taken by the warps that finish first; 0 off */
    int gemv_dyn_min;     /* ... only for launches of at least this many row groups a resident warp */
    int gemv_dyn_lean;    /* ... skipping takes a plain load shows spent, one done count a block (0 default) */
    int gemv_rl;          /* one-token dp4a SIMT GEMV loads its weights into registers, no cp.async ring:
                           * 1 ld.global.cs, 2 ld.global.nc with 256-byte L2 fetches; 0 the ring; 3 (default)
                           * form 1 for rows of more than 4096 columns, the ring for shorter ones */
    int gemv_sk_vw;       /* stream-K GEMV at one token: virtual warps a resident warp (1 = off, the default; to 4) */
    int gemv_sk_dv;       /* ... taken from a pool as warps finish (1, default) or walked in a fixed order (0) */
    int gemv_sk_minu;     /* units a (virtual) warp has at least: 0 = GK_MINU / vw (default), else this */
    int gk_warps;         /* warps gk_part has room for */
    float *gk_part;       /* stream-K partial tiles and per-tile counters (cu_matmul_buffers) */
    int *gk_cnt;
    int *gv_pool;         /* k_gemv's pool counter pair (gemv_seg.pool), zero between launches */
    int gemm_i8;          /* [gemm_i8] prefill GEMM of repacked Q4: 4 x as fp16 hi + lo on the fp16 tensor cores (default;
                           * dense weights, MoE stacks take 3), on the integer ones 3 digits or 2 (fast), 0 off */
    int gemm_hl_sub;      /* ... 4: the nibbles as fp16 subnormals (1) or 1024 + q less 1024 (0, default: subnormal
                           * inputs cost the H100's tensor cores accuracy, s37r1) */
    int gemm_hl_rows;     /* ... 4: rows a warp, 32 (default: 8 x 1 warps of 32 x 64) or 64 (4 x 2 of 64 x 32) */
} cu_devinfo;

/* ---- optional cuBLAS (cuda_blas.cu), loaded with dlopen ---- */
sn_status cu_blas_open(cudaStream_t s, void **out); /* SN_E_UNSUPPORTED when not installed */
void cu_blas_close(void *h);
size_t cu_blas_scratch_bytes(const cu_weight *w, int nseg);
/* y[T, rows] = sig[t] * (xh[T, :] @ W_e'^T) + bias, xh fp16 rows of nseg segments of Kp (see k_x_to_f16) */
sn_status cu_blas_matmul(void *h, cudaStream_t s, const cu_weight *w, int64_t e, const __half *xh, int64_t Kp,
                         int nseg, const float *sig, int T, float *y, void *wscratch);

/* The repacked copy of a Q4 weight for the integer tensor-core GEMV (see
 * cu_weight.qr): done at upload when the weight qualifies (one matrix,
 * group 32/64/128, columns a multiple of 64); sets w->qr/sr/mt and adds the
 * bytes to *bytes. SN_OK without a copy when it does not qualify. */
bool cu_repack_q4_ok(const cu_weight *w);
sn_status cu_repack_q4(cudaStream_t s, cu_weight *w, size_t *bytes);

/* [gemm_i8] Prefill GEMM (T >= 9) of a repacked Q4 weight (w->qr) on the
 * integer tensor cores (cuda_gemm_i8.cu): x split per (token, quant group)
 * into `digits` 8-bit digit planes (3: 24-bit x, fp32-class; 2: 16-bit x),
 * exact int32 MMAs, per-group fp32 scaling; digits 4: x per token as fp16
 * hi + lo on the fp16 tensor cores (22 bits a value, fp32 accumulation).
 * Deterministic, and a token's row does not depend on T. scratch:
 * cu_gemm_i8_scratch_bytes(w, T, digits). */
sn_status cu_gemm_i8_init(const cu_devinfo *di); /* from cu_matmul_init: shared memory limits */
size_t cu_gemm_i8_scratch_bytes(const cu_weight *w, int T, int digits);
/* staged: scratch already holds this x's planes (the previous call's, same
 * x, T, columns and group), so the staging pass is skipped */
sn_status cu_gemm_i8(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, const float *x, int T, float *y,
                     void *scratch, int digits, bool staged);
/* The expert-grouped form for the MoE prefill: an expert stack repacked as
 * one tall matrix (rows % 16 == 0), output rows = the N token/expert pairs
 * sorted by expert (cnt[e] of them from seg_off[e]). Stage once per input
 * (N rows: gate and up share the T tokens' x, staged once, each pair row t
 * reading plane row perm[t] / k; su: stage silu(x) * su, the down input
 * from gate and up, one plane row per pair, perm NULL), then one GEMM per
 * stack over np staged rows; y[pair][rows]. blk_off: exclusive prefix of
 * ceil(cnt[e] / cu_gemm_i8_moe_block_tokens), E + 1 entries (the MoE's own
 * scan makes it). scratch: cu_gemm_i8_moe_scratch_bytes(w, rows staged,
 * digits) per staged input. */
bool cu_gemm_i8_moe_ok(const cu_devinfo *di, const cu_weight *w);
size_t cu_gemm_i8_moe_scratch_bytes(const cu_weight *w, int64_t N, int digits);
int cu_gemm_i8_moe_block_tokens(int digits); /* token rows per block: blk_off counts blocks of these */
sn_status cu_gemm_i8_moe_stage(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, const float *x,
                               const float *su, int64_t N, void *scratch);
sn_status cu_gemm_i8_moe(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, int64_t N, int64_t np,
                         const int32_t *perm, int k, const int *cnt, const int *seg_off, const int *blk_off, float *y,
                         const void *scratch);
/* [gemm_i8] end */

/* Raise the dynamic shared memory limit of every kernel that needs more
 * than 48 KB, once per process and device (not legal inside a capture). */
sn_status cu_matmul_init(const cu_devinfo *di);
/* Device buffers the matmul kernels keep across launches (the stream-K
 * GEMV's partials and zeroed tile counters), made with the first repacked
 * weight (without them that GEMV takes its ring form); freed by
 * cu_matmul_buffers_free. */
sn_status cu_matmul_buffers(cu_devinfo *di);
void cu_matmul_buffers_free(cu_devinfo *di);
/* the stream-K GEMV's pool form: launches so far (host side), and on the
 * device its slice counters' sum and its block count (sn_cuda_gemv_pool) */
long cu_gk_pool_launches(void);
sn_status cu_gk_pool_counters(const cu_devinfo *di, int out[2]);
sn_status cu_ops_init(const cu_devinfo *di);

/* y[T, rows] = x[T, cols] @ W_e^T (+ bias). scratch: device buffer of at
 * least cu_matmul_scratch_bytes(w, T) bytes (the GEMM's fp16 copy of x). */
size_t cu_matmul_scratch_bytes(const cu_devinfo *di, const cu_weight *w, int T);
/* x_staged: see cu_gemm_i8 (only for a call cu_matmul_gemm_i8 says takes it) */
sn_status cu_matmul(const cu_devinfo *di, cudaStream_t s, const cu_weight *w, int expert, const float *x, int T,
                    float *y, void *scratch, bool x_staged);
/* whether cu_matmul of T rows through expert e of w runs the integer GEMM */
bool cu_matmul_gemm_i8(const cu_devinfo *di, const cu_weight *w, int64_t e, int T);
/* Decode GEMVs (T <= CU_GROUP_T_MAX rows) of n weights that share x, in one
 * launch; add_to (may be NULL, or hold NULLs) receives a fused y[i]
 * residual add. The weights must be groupable (same quant format, group,
 * columns) and take the same kernel alone (cu_matmul_int_path), so each
 * y[i] is bitwise what cu_matmul would give. With norm, x is first
 * RMS-normalised inside the launch, bitwise as cu_rmsnorm with
 * norm->threads threads would (cu_rmsnorm_threads), and the normalised rows
 * are written to norm->xn when that is not NULL. */
#define CU_GROUP_MAX 8
#define CU_GROUP_T_MAX 8
typedef struct {
    const float *w;
    float eps;
    int threads;
    float *xn;
    /* instead of the norm (w NULL): x is silu(x) * su elementwise, as
     * cu_swiglu computes it, and that row goes to xn */
    const float *su;
    /* instead of the plain norm (gz set, w the gate norm's weight): x is
     * the gated RMSNorm of its rows of CU_GNORM_N, w * (x * inv) * silu(gz),
     * bitwise as cu_gated_rmsnorm (its one-warp-per-row kernel) forms it */
    const float *gz;
} cu_gemv_norm;
#define CU_GNORM_N 128
/* A GDN layer's causal conv (4 taps) folded into the epilogue of its qkv
 * projection (segment 0 of a SIMT GEMV launch, cu_gv_folds_conv): each
 * row (channel) is still written raw to y, and silu(conv) of it to c
 * (T x C, what k_gdn_conv_state forms before the l2 norm); the conv state
 * and the history's conv part move as k_gdn_conv_state moves them. Bitwise
 * that kernel's (cu_gdn_conv4). */
typedef struct {
    const float *w; /* C x 4 taps */
    float *state;   /* 3 x C */
    float *c;
    float *hist;    /* NULL or nh slots of hstride floats (conv part first) */
    size_t hstride;
    int nh;
} cu_gemv_conv;
#define CU_CONV_K 4
bool cu_matmul_groupable(const cu_weight *a, const cu_weight *b);
/* Whether cu_matmul of T rows of x through expert e of w takes the integer
 * tensor-core GEMV (else the fp32 GEMV, or the GEMM from GEMM_MIN_T rows). */
bool cu_matmul_int_path(const cu_devinfo *di, const cu_weight *w, int64_t e, const float *x, int T);
/* Whether the SIMT GEMV runs w as a small 8-bit matrix (k_gemv_q8s, tune
 * gemv_q8s_rows), by its shape alone: matrices grouped into one launch
 * must agree on it, as on cu_matmul_int_path. */
bool cu_gv_small(const cu_devinfo *di, const cu_weight *w);
/* Whether b (expert eb) may share a grouped launch with a (expert ea) on T
 * rows of x: groupable, and the same kernel for each alone (its bits) -
 * the one test of the capture's fuser and of cu_matmul_group. */
bool cu_matmul_same_kernel(const cu_devinfo *di, const cu_weight *a, int64_t ea, const cu_weight *b, int64_t eb,
                           const float *x, int T);
sn_status cu_matmul_group(const cu_devinfo *di, cudaStream_t s, int n, const cu_weight *const *w, const int64_t *e,
                          float *const *y, float *const *add_to, const float *x, int T, const cu_gemv_norm *norm,
                          const cu_gemv_conv *conv, void *scratch); /* scratch: cu_matmul_scratch_bytes(w[0], T) */
/* Whether cu_matmul_group of T rows through w[0] (first of n, x its input
 * row after any folded norm) can fold a GDN conv into segment 0. */
bool cu_matmul_folds_conv(const cu_devinfo *di, const cu_weight *w0, const float *x, int T);
/* Whether cu_matmul_group of T rows through w0 folds a gated RMSNorm (rows
 * of CU_GNORM_N of x with gate gz and weight nw, output row xn) instead of
 * running it first as its own launch: the capture's fuser asks this too, so
 * it only fuses what the launch really folds. */
bool cu_matmul_folds_gnorm(const cu_devinfo *di, const cu_weight *w0, const float *x, const float *gz, const float *nw,
                           const float *xn, int T);
/* y[T, cols] = dequantized rows d_ids[t] of W (ids validated by the caller). */
sn_status cu_embed(cudaStream_t s, const cu_weight *w, const int32_t *d_ids, int T, float *y);
/* MoE FFN over the experts of one layer for T tokens, routing on the GPU:
 * softmax(logits[t]) -> top_k -> (renormalised when norm_topk) weights;
 * out[t] = sum_j w_j * down_e(silu(gate_e x_t) * up_e x_t). */
size_t cu_moe_scratch_bytes(const cu_devinfo *di, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                            int T, int top_k);
/* sh (NULL: none): the shared expert too, on the decode path only (cu_moe_sh_ok);
 * moe_sync: CU_MOE_SYNC zeroed ints the caller keeps per stream (the
 * decode kernels' early start, cuda_moe.h; NULL: without it) */
struct cu_moe_sh;
bool cu_moe_sh_ok(const cu_devinfo *di, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                  const struct cu_moe_sh *sh, int T, int top_k);
sn_status cu_moe(const cu_devinfo *di, cudaStream_t s, const cu_weight *gate, const cu_weight *up,
                 const cu_weight *down, const float *logits, int top_k, int norm_topk, const float *x, int T,
                 float *out, void *scratch, const struct cu_moe_sh *sh, unsigned *moe_sync);

/* ---- elementwise, norms, attention, GDN (cuda_ops.cu) ---- */

sn_status cu_rmsnorm(cudaStream_t s, const float *x, const float *w, int rows, int n, float eps, float *y);
int cu_rmsnorm_threads(int n); /* the block size cu_rmsnorm uses for rows of n */
sn_status cu_gated_rmsnorm(cudaStream_t s, const float *o, const float *z, const float *w, int rows, int n,
                           float eps, float *y);
sn_status cu_add(cudaStream_t s, float *y, const float *x, size_t n);
/* n <= CU_COPY_N_MAX device copies in one launch; every pointer and size
 * a multiple of 16 bytes (the caller copies others one by one). */
#define CU_COPY_N_MAX 128
sn_status cu_copy_n(cudaStream_t s, int n, void *const *dst, const void *const *src, const size_t *bytes);
sn_status cu_swiglu(cudaStream_t s, const float *g, const float *u, size_t n, float *out);
/* silu as every kernel computes it (the swiglu folded into a GEMV must match k_swiglu bitwise) */
__device__ __forceinline__ float cu_silu(float x) { return x / (1.f + expf(-x)); }
/* One channel of the GDN's causal conv over its 4 inputs, oldest first,
 * then SiLU: k_gdn_conv's arithmetic (gdn_conv_ch), shared with the GEMV
 * epilogue that folds it. */
__device__ __forceinline__ float cu_gdn_conv4(const float *w, float x0, float x1, float x2, float x3)
{
    float acc = 0.f;
    acc += w[0] * x0;
    acc += w[1] * x1;
    acc += w[2] * x2;
    acc += w[3] * x3;
    return cu_silu(acc);
}
/* The gated RMSNorm's arithmetic, one warp per row with lane l holding
 * values 4l..4l+3 of each 128: k_gated_rmsnorm_w and the integer GEMV's
 * digits pass that folds it (which must match it bitwise) both use these.
 * cu_gnorm_ss4 adds a float4's squares to a lane's sum; cu_gnorm_inv sums
 * the lanes and forms 1/rms of a row of n; cu_gnorm_apply4 is
 * w * (v * inv) * silu(z) for one float4 (w: its four weights). */
__device__ __forceinline__ float cu_gnorm_ss4(float ss, float4 v)
{
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
    ss = fmaf(v.z, v.z, ss);
    return fmaf(v.w, v.w, ss);
}
/* 1/rms of a row of n from its sum of squares: k_rmsnorm's too (the SIMT
 * GEMV's gated fold, whose threads hold two lanes each, sums its own way
 * and ends here as well) */
__device__ __forceinline__ float cu_gnorm_rinv(float ss, int n, float eps) { return 1.f / sqrtf(ss / (float)n + eps); }
__device__ __forceinline__ float cu_gnorm_inv(float ss, int n, float eps)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, m);
    return cu_gnorm_rinv(ss, n, eps);
}
__device__ __forceinline__ float4 cu_gnorm_apply4(const float *w, float4 v, float4 z, float inv)
{
    return make_float4(w[0] * (v.x * inv) * cu_silu(z.x), w[1] * (v.y * inv) * cu_silu(z.y),
                       w[2] * (v.z * inv) * cu_silu(z.z), w[3] * (v.w * inv) * cu_silu(z.w));
}
sn_status cu_mul_sigmoid(cudaStream_t s, float *y, const float *g, size_t n);
sn_status cu_add_gated(cudaStream_t s, float *y, const float *x, const float *g, int T, int n);
sn_status cu_rope(cudaStream_t s, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                  const int *d_delta, const float *inv_freq, float mscale);
/* q/k RMSNorm + RoPE + KV write in one launch (the graph fuser, tune
 * fuse_attn_prep): the bits of cu_rmsnorm on q and on k, cu_rope on both,
 * then cu_kv_write of (kn, v). qn/kn get the final rows. */
typedef struct {
    const float *q, *k, *v, *qw, *kw;
    float *qn, *kn;
    float eps_q, eps_k;
    int T, Hq, Hkv, D, rot_dim, pos0;
    const float *inv_freq;
    float mscale;
    float *kc, *vc; /* the cache rows [ctx][Hkv][D] */
} cu_attn_prep_args;
extern int cu_fuse_attn_prep;
sn_status cu_attn_prep(cudaStream_t s, const cu_attn_prep_args *a, const int *d_delta);
sn_status cu_kv_write(cudaStream_t s, const sn_kv_view *kv, const float *k, const float *v, int T, int pos0,
                      const int *d_delta);
size_t cu_attention_scratch_bytes(const sn_kv_view *kv, int T, int n_q_heads);
sn_status cu_attention(const cu_devinfo *di, cudaStream_t s, const float *q, const sn_kv_view *kv, int T,
                       int pos0, const int *d_delta, int n_q_heads, float scale, float *out, void *scratch,
                       const float *gate); /* gate: then out *= sigmoid(gate), bitwise as cu_mul_sigmoid after */
size_t cu_gdn_scratch_bytes(const sn_gdn_dims *d, int T);
/* hist / n_hist: sn_gdn_view's per-token history (NULL / 0: none); with a
 * history the token-by-token recurrence runs, never the chunked form. */
/* cnt: CU_GDN_CNT zeroed ints the caller keeps per stream (k_gdn_step's
 * per-key-head arrival counters; each launch leaves them zero), or NULL
 * (three kernels instead of one). cu_gdn_step_mode (tune "gdn_step") 2
 * (default; T <= 8) takes two kernels: conv with the conv state update
 * (k_gdn_conv_state), then the recurrence (measured 0.5-1 % faster per
 * decode step than 0); 0 the three: conv, conv state, recurrence; 1 the
 * one kernel (measured slower). Same bits every way. */
#define CU_GDN_CNT 1024
extern int cu_gdn_step_mode;
/* tune "gdn_conv": 1 (default) the prefill conv (T > 8, 4 taps, heads of <= 256 channels) one warp per
 * (head, 8 tokens) with each row loaded once; 0 one block per (head, token). Same bits. */
extern int cu_gdn_conv_mode;
sn_status cu_gdn(cudaStream_t s, const sn_gdn_dims *d, const float *qkv, const float *a, const float *b,
                 const float *conv_w, const float *A_log, const float *dt_bias, float *conv_state, float *S,
                 float *hist, int n_hist, int T, float *out, void *scratch, int *cnt);
/* The rest of a GDN decode / verify step whose conv a GEMV folded
 * (cu_gemv_conv): c = silu(conv) of the T tokens' channels; the l2 norms,
 * gates and delta rule in one launch, bitwise cu_gdn's. cu_gdn_folds_conv:
 * whether these dims and T take it. */
bool cu_gdn_folds_conv(const sn_gdn_dims *d, int T);
sn_status cu_gdn_after_conv(cudaStream_t s, const sn_gdn_dims *d, const float *c, const float *a, const float *b,
                            const float *A_log, const float *dt_bias, float *S, float *hist, int n_hist, int T,
                            float *out);
/* out[r] = index of the largest x[r, :] (the first one on ties). */
size_t cu_argmax_scratch_bytes(int rows);
sn_status cu_argmax(cudaStream_t s, const float *x, int rows, int n, int32_t *d_out, void *scratch);

/* ---- prefill kernels (cuda_prefill.cu, issue 6): chunked GatedDeltaNet and
 * tensor-core flash attention. cu_gdn / cu_attention call them for
 * T >= SANCTUM_CUDA_PREFILL_MIN_T (64) unless SANCTUM_CUDA_PREFILL=old
 * (gdn / attn: only that one new); sn_cuda_prefill_mode (sn_cuda.h) switches
 * at run time. ---- */
sn_status cu_pf_init(const cu_devinfo *di); /* from cu_ops_init: raises smem limits, reads the env */
/* SANCTUM_CUDA_PREFILL, _PREFILL_MIN_T and _GDN_TC: SN_E_INVALID naming a malformed one */
sn_status cu_pf_env_check(void);
bool cu_pf_gdn_use(const sn_gdn_dims *d, int T);
size_t cu_pf_gdn_scratch_bytes(const sn_gdn_dims *d, int T); /* 0 when cu_pf_gdn_use is false */
/* The delta rule only: c, beta, decay as k_gdn_conv wrote them; S updated; out [T, Hv*Dv]. */
sn_status cu_pf_gdn(cudaStream_t s, const sn_gdn_dims *d, const float *c, const float *beta, const float *decay,
                    float *S, int T, float *out, void *scratch);
bool cu_pf_attn_use(const sn_kv_view *kv, int T, int n_q_heads);
sn_status cu_pf_attention(cudaStream_t s, const float *q, const sn_kv_view *kv, int T, int pos0, const int *d_delta,
                          int n_q_heads, float scale, float *out);
/* ---- end prefill kernels ---- */

#include "backend/cuda/cuda_moe.h" /* [moe] two-launch MoE decode (cuda_moe.cu) */

#endif
