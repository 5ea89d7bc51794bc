/* Compute backends.
 *
 * A backend is a table of ops plus a context. Ops work at the granularity a
 * model file names (a whole projection, a whole attention, a whole GDN
 * step) so a backend fuses inside an op. Activations are fp32 row-major
 * [T, n] in backend memory (host memory on the CPU, device memory on CUDA),
 * allocated with buf_alloc. Weights are sn_weight views; upload_weight gives
 * a backend the chance to copy/repack them once at load.
 *
 * The scalar CPU code is the oracle: every other kernel is tested against it.
 *
 * BATCH INVARIANCE (required of every CPU op): the value computed for token
 * row t is bitwise identical whatever T is, wherever t sits in the batch and
 * whatever the thread count (same accumulation order per output element; a
 * GEMM that blocks over tokens still reduces each dot product exactly as the
 * GEMV does). The prompt cache and prompt-lookup speculation rely on this to
 * give byte-identical outputs whether a token was processed alone or in a
 * run of many (the seed system needed a T_q >= 2 workaround without it). */
#ifndef SANCTUM_BACKEND_H
#define SANCTUM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/cpu.h"
#include "sanctum/tensor.h"

typedef struct sn_backend sn_backend;

/* Per-layer attention cache view for one sequence: K and V after RoPE,
 * [max_ctx, n_kv_heads, head_dim] fp32 each, in backend memory. */
typedef struct {
    float *k, *v;
    int max_ctx, n_kv_heads, head_dim;
} sn_kv_view;

/* Per-layer GatedDeltaNet state for one sequence, in backend memory.
 * conv: [K-1, conv_dim] fp32 (pre-conv qkv rows, oldest first).
 * S:    [Hv, Dk, Dv] fp32 (HF layout). */
typedef struct {
    float *conv;
    float *S;
    /* Optional per-token history (prompt-lookup rollback without a
     * recompute): when hist is set, the gdn op also writes the state after
     * each token t < min(T - 1, n_hist) of the call to slot t of hist, each
     * slot the conv state [K-1, conv_dim] then S [Hv, Dk, Dv] (stride
     * sn_gdn_hist_floats). The state after the last token is the live one. */
    float *hist;
    int n_hist;
} sn_gdn_view;

typedef struct {
    int n_k_heads, n_v_heads, dk, dv, conv_k; /* Hk, Hv, Dk, Dv, K */
    float norm_eps; /* l2norm epsilon for q and k (HF: 1e-6); <= 0 means 1e-6. Not the gated-norm eps. */
} sn_gdn_dims;

/* Floats of one sn_gdn_view history slot: (K-1)*conv_dim + Hv*Dk*Dv. */
static inline size_t sn_gdn_hist_floats(const sn_gdn_dims *d)
{
    size_t conv_dim = 2 * (size_t)d->n_k_heads * (size_t)d->dk + (size_t)d->n_v_heads * (size_t)d->dv;
    return (size_t)(d->conv_k > 1 ? d->conv_k - 1 : 0) * conv_dim + (size_t)d->n_v_heads * d->dk * d->dv;
}

/* An MoE layer's shared expert (moe_shared): gate/up [I, H], down [H, I]
 * plain matrices, and its per-token gate logits (device floats [T]). */
typedef struct {
    const sn_weight *gate, *up, *down;
    const float *gate_logit;
} sn_moe_shared;

/* One logit edit of a draw on the backend (the sampler's processors, with
 * their roundings, sample.c): SN_EDIT_ADD x += a (a logit bias);
 * SN_EDIT_PENALTY x = rp ? (x < 0 ? x * a : x / a) : x (rp: a != 0),
 * then x -= b, then x -= c (presence, frequency times count). Each IEEE op
 * rounds once, so a backend gives the host sampler's bits. */
enum { SN_EDIT_ADD = 0, SN_EDIT_PENALTY = 1 };
typedef struct {
    int32_t id;
    int32_t kind;
    float a, b, c;
} sn_logit_edit;

/* One row of a draw on the backend (sn_backend_ops.sample). */
typedef struct {
    int row;                     /* the row of x it reads (and edits) */
    float temperature;           /* 0: the argmax after the edits */
    float top_p;                 /* (0, 1] */
    double u;                    /* [0, 1): the sampler's uniform for this draw */
    /* edits in phases: the ids within a phase are distinct, phases apply
     * in order; phase k is edits[phase_end[k-1] .. phase_end[k]) */
    const sn_logit_edit *edits;
    const int32_t *phase_end;
    int n_phases;
    const int32_t *banned;       /* set to -inf after the edits */
    int n_banned;
} sn_sample_row;

typedef struct sn_backend_ops {
    const char *name;
    void (*destroy)(sn_backend *);
    sn_status (*buf_alloc)(sn_backend *, size_t bytes, void **out);
    void (*buf_free)(sn_backend *, void *);
    /* dst/src in backend memory unless the name says host. */
    sn_status (*copy)(sn_backend *, void *dst, const void *src, size_t bytes);
    sn_status (*to_host)(sn_backend *, void *host_dst, const void *src, size_t bytes);
    sn_status (*from_host)(sn_backend *, void *dst, const void *host_src, size_t bytes);
    sn_status (*memset0)(sn_backend *, void *dst, size_t bytes);
    sn_status (*upload_weight)(sn_backend *, sn_weight *w);
    sn_status (*sync)(sn_backend *);

    /* y[T,rows] = x[T,cols] @ W^T (+ bias). For an expert stack, expert e. */
    sn_status (*matmul)(sn_backend *, const sn_weight *w, int expert, const float *x, int T, float *y);
    /* y[T,cols] = dequantized rows ids[t] of W (embedding lookup). ids in host memory. */
    sn_status (*embed)(sn_backend *, const sn_weight *w, const int32_t *ids, int T, float *y);
    /* y[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2)+eps) * w   for r in [0,rows). w fp32 [n] in backend memory. */
    sn_status (*rmsnorm)(sn_backend *, const float *x, const float *w, int rows, int n, float eps, float *y);
    sn_status (*add)(sn_backend *, float *y, const float *x, size_t n);              /* y += x */
    sn_status (*swiglu)(sn_backend *, const float *gate, const float *up, size_t n, float *out); /* silu(g)*u */
    /* NeoX RoPE on the first rot_dim dims of each head of x[T, n_heads, head_dim]
     * at positions pos0..pos0+T-1; inv_freq [rot_dim/2] (backend memory), angle
     * scaled by mscale on cos/sin (YaRN attention factor; 1 otherwise). */
    sn_status (*rope)(sn_backend *, float *x, int T, int n_heads, int head_dim, int rot_dim,
                      int pos0, const float *inv_freq, float mscale);
    /* Causal GQA attention of q[T,Hq,D] against kv positions [0, pos0+T) of the
     * cache (the new K/V already written at pos0..pos0+T-1). out [T,Hq,D]. */
    sn_status (*attention)(sn_backend *, const float *q, const sn_kv_view *kv, int T, int pos0,
                           int n_q_heads, float scale, float *out);
    /* Write k,v [T,Hkv,D] into the cache at pos0. */
    sn_status (*kv_write)(sn_backend *, const sn_kv_view *kv, const float *k, const float *v, int T, int pos0);
    /* GatedDeltaNet core for T tokens: causal depthwise conv (weights conv_w
     * [conv_dim, K] fp32) + SiLU over qkv [T, conv_dim] updating st->conv;
     * l2norm(q)*Dk^-0.5, l2norm(k); beta = sigmoid(b), g = -exp(A_log)*softplus(a+dt_bias);
     * delta rule updating st->S; out [T, Hv*Dv] (before the gated norm). */
    sn_status (*gdn)(sn_backend *, const sn_gdn_dims *d, const float *qkv, const float *a, const float *b,
                     const float *conv_w, const float *A_log, const float *dt_bias,
                     sn_gdn_view *st, int T, float *out);
    /* Gated RMSNorm per head: y = w * rmsnorm(o) * silu(z), o,z [rows, n], w [n]. */
    sn_status (*gated_rmsnorm)(sn_backend *, const float *o, const float *z, const float *w,
                               int rows, int n, float eps, float *y);
    /* y *= sigmoid(gate) elementwise. */
    sn_status (*mul_sigmoid)(sn_backend *, float *y, const float *gate, size_t n);

    /* ---- Optional ops: NULL where a backend lacks them (callers check). ---- */
    /* out[r] = index of the largest x[r, 0..n) (the first on ties; NaN never
     * wins) for r < rows, written to HOST memory: only token ids cross to the
     * host. Inside a step (below) out is valid once end_step returns. */
    sn_status (*argmax)(sn_backend *, const float *x, int rows, int n, int32_t *out);
    /* out[k] = a draw from row rr[k].row of x[., n) (device; edited in
     * place) for k < rows, to HOST memory, as sn_sampler_sample draws
     * (sample.h): the edits and bans; at temperature 0 the argmax (first
     * maximum, NaN never wins); else p = softmax(x), top-p on p (rank by p;
     * a token stays while the mass ranked before it is below top_p; tokens
     * under (1 - top_p) / n never stay), then categorical(exp((x - max) / T))
     * over the kept tokens at u. The order the draw walks the survivors in
     * (and that ranks equal p at the top-p cut) and the sums' rounding are
     * the backend's: the same distribution as the host sampler's, another
     * token for the same u; deterministic for the same inputs. Outside a
     * step only. An all-NaN row is SN_E_RANGE. */
    sn_status (*sample)(sn_backend *, float *x, int rows, int n, const sn_sample_row *rr, int32_t *out);
    /* The routed experts of one MoE layer for T tokens, routing on the
     * backend: p = softmax(logits[t, 0..E)) in fp32; the top_k largest
     * (ties: lower index); w_j = p_j, divided by their sum when norm_topk;
     * out[t] = sum_j w_j * down_e(silu(gate_e x_t) * up_e x_t), overwritten.
     * gate/up are [E, I, H] stacks, down [E, H, I]. The shared expert is not
     * included (see add_gated). */
    sn_status (*moe)(sn_backend *, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                     const float *logits, int top_k, bool norm_topk, const float *x, int T, float *out);
    /* moe with the shared expert in the same op, where the backend can run
     * it beside the routed ones (CUDA decode: one more expert slot of the
     * two MoE launches, weighted by its gate):
     * out[t] = moe's out[t] + sigmoid(sh->gate_logit[t]) *
     *          sh->down(silu(sh->gate x_t) * sh->up x_t).
     * Where it cannot (these shapes, this T) it returns SN_E_UNSUPPORTED
     * without touching anything or setting an error message, and the caller
     * runs moe, the shared expert's ops and add_gated instead. */
    sn_status (*moe_shared)(sn_backend *, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                            const float *logits, int top_k, bool norm_topk, const sn_moe_shared *sh,
                            const float *x, int T, float *out);
    /* y[t, :] += sigmoid(g[t]) * x[t, :] for t < T, rows of n (the shared
     * expert's per-token gate fused with the residual add). */
    sn_status (*add_gated)(sn_backend *, float *y, const float *x, const float *g, int T, int n);
    /* n device-to-device copies (dst[i] <- src[i], bytes[i]) as one
     * operation: a rollback restores two buffers per recurrent layer, and
     * on CUDA each separate copy is a launch. Same effect as n copies. */
    sn_status (*copy_n)(sn_backend *, int n, void *const *dst, const void *const *src, const size_t *bytes);
    /* Decode-step graphs (CUDA): ops between begin_step and end_step may be
     * recorded and replayed as one graph; every argument is still checked at
     * the call, and results (argmax's host output too) are valid after
     * end_step. to_host / from_host / sync inside a step are allowed: the
     * step then runs eagerly. Replay needs the same op sequence with all
     * positions moved by one common delta (a decode step at the next pos). */
    sn_status (*begin_step)(sn_backend *);
    sn_status (*end_step)(sn_backend *);
    /* Recording ahead (CUDA; all five or none): the host records step n+1
     * while the GPU runs step n, whose token it does not know yet.
     * step_launch closes the open step as end_step does but returns once the
     * step is queued; its results are valid after step_wait. begin_ahead
     * opens a step that is only recorded, never run (anything that would
     * run it, such as to_host, fails instead), and may be opened while a
     * launched step runs; step_park closes it and keeps its record (one at
     * most) under owner (the caller's key: models may share a backend).
     * step_launch_parked queues that record as step_launch would, with its
     * first n embed ids replaced by ids (ids are data to a record); with
     * none parked under owner it fails with SN_E_MISSING and changes
     * nothing. Freeing a buffer drops the parked record (it holds
     * pointers), as does step_drop. */
    sn_status (*step_launch)(sn_backend *);
    sn_status (*step_wait)(sn_backend *);
    sn_status (*begin_ahead)(sn_backend *);
    sn_status (*step_park)(sn_backend *, const void *owner);
    sn_status (*step_launch_parked)(sn_backend *, const void *owner, const int32_t *ids, int n);
    void (*step_drop)(sn_backend *);
    /* Optional: the faster, approximate activations for quantized products
     * (--precision fast), set once after creation and before any weight is
     * uploaded. CPU: Q4 weights against 8-bit activations (the
     * SANCTUM_CPU_Q4=q8 kernels, where the ISA has them; scalar stays
     * exact). CUDA: prefill GEMMs with x in one fp16 pass
     * (SANCTUM_CUDA_GEMM=fast); decode is unchanged. NULL: the backend has
     * only its exact products. */
    sn_status (*set_fast)(sn_backend *);
} sn_backend_ops;

struct sn_backend {
    const sn_backend_ops *ops;
    int n_threads;
};

typedef enum { SN_BACKEND_CPU, SN_BACKEND_CUDA } sn_backend_kind;

/* CPU: n_threads <= 0 means one per core. Kernels: SANCTUM_CPU if set
 * (scalar|avx2|avx512; an unknown or unsupported value is an error), else
 * the best this CPU supports. ops->name says which: "cpu-avx512", ... */
sn_status sn_backend_cpu_new(int n_threads, sn_backend **out);
/* The same with an explicit kernel level (SN_E_UNSUPPORTED if the CPU lacks it). */
sn_status sn_backend_cpu_new_isa(int n_threads, sn_isa isa, sn_backend **out);
sn_status sn_backend_cuda_new(int gpu, sn_backend **out);   /* SN_E_UNSUPPORTED when built without CUDA */
void sn_backend_free(sn_backend *be);

#endif
