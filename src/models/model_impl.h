/* Internal shape of a loaded model, shared by the loader (src/models/), the
 * architecture files and the forward pass / sequence state (src/engine/).
 *
 * All four architectures are decoder stacks of the same form
 *   h = x + mixer(norm_in(x));  out = h + ffn(norm_post(h))
 * so one layer struct holds the union of their weights (fields an arch does
 * not use stay zeroed) and one forward loop (src/engine/forward.c) runs
 * them. What differs per architecture lives in its file under src/models/:
 * the config checks, the table that binds checkpoint names to fields, and
 * the flags below (gated attention, q/k norm, MoE FFN). */
#ifndef SN_MODEL_IMPL_H
#define SN_MODEL_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/backend.h"
#include "sanctum/config.h"
#include "sanctum/model.h"
#include "sanctum/safetensors.h"

/* Rows of one forward step (all sequences of a batch together). Prefill
 * longer than this is cut into chunks; it bounds the workspace. */
#define SN_STEP_TOKENS 512
/* Sequences in one batch step. */
#define SN_MAX_BATCH 64
/* Rows of the lm_head per call when many logits are wanted; equal to the
 * batch limit so a decode step of any batch is one head call (one graph). */
#define SN_LOGIT_ROWS SN_MAX_BATCH

typedef struct {
    sn_layer_kind kind;      /* LINEAR (GatedDeltaNet) or FULL/SLIDING attention */
    float *in_norm;          /* [H] fp32, multiplier as used (1+w already added for HF qwen3_5) */
    float *post_norm;        /* [H] fp32 */

    /* attention layers */
    sn_weight wq;            /* [Hq*D, H]; qwen3_5: the query rows of q_proj (per-head [q|gate] split at load) */
    sn_weight wgate;         /* [Hq*D, H]; qwen3_5 only: the gate rows of q_proj */
    sn_weight wk, wv;        /* [Hkv*D, H] (+ fp32 bias [Hkv*D] for qwen2) */
    sn_weight wo;            /* [H, Hq*D] */
    float *q_norm, *k_norm;  /* [D] fp32, qwen3_5 only */

    /* GatedDeltaNet layers (qwen3_5*) */
    sn_weight in_qkv;        /* [2*Kd+Vd, H]  output channels [q | k | v] */
    sn_weight in_z;          /* [Vd, H] */
    sn_weight in_b, in_a;    /* [Hv, H] */
    float *conv_w;           /* [conv_dim, K] fp32 (HF [C,1,K] and MLX [C,K,1] flatten alike) */
    float *A_log, *dt_bias;  /* [Hv] fp32 */
    float *gnorm;            /* [Dv] fp32 gated-norm weight (never shifted) */
    sn_weight out_proj;      /* [H, Vd] */

    /* dense SwiGLU FFN */
    sn_weight gate, up;      /* [I, H] */
    sn_weight down;          /* [H, I] */

    /* MoE FFN (qwen3_5_moe) */
    sn_weight router;        /* [E, H] */
    sn_weight egate, eup;    /* expert stacks [E][Im, H] */
    sn_weight edown;         /* expert stack [E][H, Im] */
    sn_weight sgate, sup;    /* shared expert [Is, H] */
    sn_weight sdown;         /* shared expert [H, Is] */
    sn_weight sgate_w;       /* [1, H] shared_expert_gate */
} sn_layer;

/* Symbolic dimensions the binding tables use for expected shapes. */
enum {
    DIM_1, DIM_H, DIM_V, DIM_I,
    DIM_QD, DIM_QGD, DIM_KVD, DIM_D,           /* Hq*D, 2*Hq*D, Hkv*D, D */
    DIM_CONV, DIM_VD, DIM_HV, DIM_DV, DIM_K,   /* 2Kd+Vd, Hv*Dv, Hv, Dv, conv taps */
    DIM_E, DIM_IM, DIM_IM2, DIM_IS,            /* experts, moe I, 2*moe I, shared I */
    DIM_COUNT
};

typedef enum {
    BIND_LINEAR,     /* "<path>.weight" dense or quantized [d0, d1] (+ optional .bias [d0]) */
    BIND_LINEAR_QG,  /* qwen3_5 q_proj [2*Hq*D, H]: split per head into wq and wgate */
    BIND_EMBED,      /* like LINEAR, the token embedding [V, H] */
    BIND_NORM,       /* "<path>.weight" [d0] fp32; +1 when the checkpoint is zero-centred */
    BIND_GNORM,      /* "<path>.weight" [d0] fp32, never shifted */
    BIND_VEC,        /* "<path>" [d0] fp32 (A_log, dt_bias) */
    BIND_CONV,       /* "<path>.weight" [C,1,K] (HF) or [C,K,1] (MLX) -> fp32 [C,K] */
    BIND_EXPERTS,    /* MLX switch_mlp stack "<path>.weight" [E, d0, d1] */
    BIND_FUSED_GU,   /* raw HF fused experts "<path>.gate_up_proj" [E, 2*Im, H] -> egate + eup */
    BIND_FUSED_DOWN, /* raw HF fused experts "<path>.down_proj" [E, H, Im] -> edown */
} sn_bind_kind;

/* Which layers a binding applies to. */
enum { ON_GLOBAL = 0, ON_LINEAR = 1, ON_ATTN = 2, ON_ALL = 3 };

typedef struct {
    const char *path;    /* canonical module path; "%d" stands for the layer index */
    sn_bind_kind kind;
    int on;              /* ON_* */
    size_t off;          /* offsetof(sn_layer, field), or offsetof(sn_model, field) when ON_GLOBAL */
    int d0, d1;          /* DIM_* (d1 unused for vectors) */
    bool optional;       /* absent is fine (lm_head when tied, biases) */
    bool bias;           /* qwen2 q/k/v: also bind "<path>.bias" [d0] */
    int layout;          /* LAYOUT_ANY, or only for MLX / only for raw HF checkpoints */
} sn_bind;

enum { LAYOUT_ANY = 0, LAYOUT_MLX = 1, LAYOUT_HF = 2 };

/* One model architecture. */
typedef struct sn_arch_impl {
    sn_arch arch;
    const char *name;
    const sn_bind *binds;
    size_t n_binds;
    bool zero_centred_norms;  /* raw HF checkpoints store norm weights w, used as 1+w */
    bool gated_attention;     /* qwen3_5: q_proj carries per-head sigmoid gates, q/k RMSNorm */
    /* FFN when it is not the dense SwiGLU (qwen3_5_moe): y[T,H] from xn[T,H]. */
    sn_status (*ffn)(sn_model *m, int layer, const float *xn, int T, float *y);
    bool gdn;                 /* has GatedDeltaNet layers */
    /* Arch-specific config checks beyond what sn_config validates. */
    sn_status (*check)(const sn_config *c);
} sn_arch_impl;

const sn_arch_impl *sn_arch_find(sn_arch a);
/* Hybrid-stack config checks shared by qwen3_5 and qwen3_5_moe. */
sn_status sn_qwen3_5_check(const sn_config *c);
extern const sn_arch_impl sn_arch_qwen3_5;
extern const sn_arch_impl sn_arch_qwen3_5_moe;
extern const sn_arch_impl sn_arch_qwen2;
extern const sn_arch_impl sn_arch_mistral;

/* Per-step scratch in backend memory: each slot holds SN_STEP_TOKENS rows
 * of its width (the widest use over the layer kinds). Allocated at load. */
typedef struct {
    float *x, *xn, *y;       /* [T, H] residual, normed input, block output */
    float *s[6];             /* [T, w_s[i]] */
    int64_t w[6];
    float *lg_x;             /* [SN_LOGIT_ROWS, H] rows gathered for the lm_head */
    float *lg;               /* [SN_LOGIT_ROWS, V] logits */
    float *h_lg;             /* [V] host logits for next_id without a backend argmax */
    /* MoE routing on the host */
    float *h_router;         /* [T, E] host copy of router logits */
    float *h_sgate;          /* [T] host copy of shared-expert gate logits */
    int32_t *h_sel;          /* [T*k] token of each (expert, slot), grouped by expert */
    float *h_selw;           /* [T*k] its routing weight */
    int32_t *h_count;        /* [E+1] start of each expert's group in h_sel */
    float *zero_freq;        /* [max(H, Hq*D)/2] zeros in backend memory, for sn_scale_row */
    int32_t *h_ids;          /* [T] host copy of the step's token ids */
    /* the argmax ids of a step's head rows: here, not on a caller's stack,
     * because a record parked ahead (forward.c) names where its ids go */
    int32_t head_ids[SN_LOGIT_ROWS];
} sn_workspace;

struct sn_model {
    sn_model_info info;
    const sn_arch_impl *impl;
    sn_config *cfg;
    sn_st *st;
    sn_backend *be;
    bool own_be;
    char name[128];
    char model_type[32];

    int64_t dims[DIM_COUNT];
    int64_t H, V;
    int n_layers;
    int Hq, Hkv, D;          /* attention heads */
    sn_gdn_dims gdn;         /* GatedDeltaNet dims */
    float eps;

    sn_weight embed;         /* [V, H] */
    sn_weight lm_head;       /* [V, H]; a copy of embed's view when tied */
    float *final_norm;       /* [H] fp32 */
    sn_layer *layers;        /* [n_layers] */

    int rot_dim;             /* rotary dims per head */
    float *inv_freq;         /* [rot_dim/2] fp32, backend memory */
    float rope_mscale;       /* YaRN attention factor (1 otherwise) */
    float attn_scale;        /* D^-0.5 */

    /* memory the model owns: host blocks (converted weights) and backend buffers */
    void **host_blocks;
    size_t n_host, cap_host;
    void **be_blocks;
    size_t n_be, cap_be;

    pthread_mutex_t lock;    /* one step at a time through the workspace */
    sn_workspace ws;
    /* the decode step recorded ahead and parked on the backend (forward.c):
     * for seq at pos, with copies of what the record's pointers came from
     * (the sequence's KV and GatedDeltaNet views, the workspace) */
    struct {
        bool valid;
        const sn_seq *seq;
        int pos;
        bool draw;        /* its head: a draw after the step, or the argmax inside it */
        sn_kv_view *kv;   /* [n_layers], made on first use */
        sn_gdn_view *gdn; /* [n_layers] */
        sn_workspace ws;
    } ahead;
};

/* Per-sequence state. Attention layers have a KV cache, GatedDeltaNet layers
 * a conv + recurrent state; all in backend memory. */
struct sn_seq {
    sn_model *m;
    int pos, max_ctx;
    sn_kv_view *kv;          /* [n_layers]; k == NULL for non-attention layers */
    sn_gdn_view *gdn;        /* [n_layers]; S == NULL for non-GDN layers */
    size_t conv_floats, S_floats, kv_row_floats; /* per layer: (K-1)*conv_dim, Hv*Dk*Dv, Hkv*D */
    struct sn_rewind *rw;    /* the PLD rollback buffers, made on first use and kept (sn_rewind_of) */
    /* gdn history (sn_rewind_track): hist_armed while the next forward is to
     * record it; that forward then disarms it and notes where it started and
     * how many history slots it filled (forward.c) */
    bool hist_armed;
    int hist_from, hist_valid;
};

/* y[0..n) *= alpha on the backend (n even). The op set has no row scale,
 * but RoPE at angle 0 multiplies by its mscale exactly (cos 0 = 1,
 * sin 0 = 0), so one "head" of width n rotated with zero frequencies is an
 * exact scale on every backend. Used for MoE routing weights, the shared
 * expert gate and ministral3's query scaling. */
static inline sn_status sn_scale_row(sn_model *m, float *y, int64_t n, float alpha)
{
    return m->be->ops->rope(m->be, y, 1, 1, (int)n, (int)n, 0, m->ws.zero_freq, alpha);
}

/* sn_load_opts.weights' decision: copy the weights of data_bytes into
 * anonymous memory? avail_bytes is MemAvailable (0: unknown, then AUTO
 * keeps the mapping). */
bool sn_weights_copy_wanted(sn_weights_mode mode, sn_backend_kind backend, size_t data_bytes, size_t avail_bytes);
/* ... and drop the copied stretches from the page cache as it goes? Yes
 * when the page cache, the copy and SN_WEIGHTS_COPY_SPARE_MB do not fit in
 * avail_bytes together (and when avail_bytes is unknown). */
bool sn_weights_copy_drops_cache(size_t data_bytes, size_t avail_bytes);

/* forward.c's environment knobs (SANCTUM_GRAPH_ROWS, SANCTUM_RECORD_AHEAD),
 * checked as each forward checks them: for sn_engine_env_check. */
sn_status sn_forward_env_check(void);
/* SANCTUM_RECORD_AHEAD: unset, empty or 1 (the default) records a plain
 * decode step's successor while the backend runs the step; 0 records each
 * step in turn; anything else is SN_E_INVALID naming it. bench_cuda takes
 * its decode steps by the same reading. */
sn_status sn_record_ahead_env(bool *out);

/* Allocation helpers for the loader (memory freed with the model). */
sn_status sn_model_host_alloc(sn_model *m, size_t bytes, void **out);
sn_status sn_model_be_upload(sn_model *m, const void *host, size_t bytes, float **out);

#endif
