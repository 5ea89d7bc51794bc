/* config.json (+ generation_config.json) for the four supported architectures.
 *
 * One flat struct covers qwen3_5, qwen3_5_moe, qwen2 and mistral (with the
 * mistral3 / ministral3 wrappers). The text model is read from text_config
 * when present, else from the root; fields fall back the way the reference
 * configs and transformers do (never to mlx-lm's defaults, which differ from
 * real checkpoints; see docs architecture.md §1). Everything is validated:
 * positive, consistent dimensions, a known model_type, a supported
 * quantization. Fields that do not apply to an arch are 0. */
#ifndef SANCTUM_CONFIG_H
#define SANCTUM_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "sanctum/status.h"

#define SN_CFG_MAX_LAYERS 512
#define SN_CFG_MAX_EOS 8

typedef enum {
    SN_ARCH_QWEN3_5,      /* dense hybrid: GatedDeltaNet + gated full attention */
    SN_ARCH_QWEN3_5_MOE,  /* same mixers, MoE FFN on every layer */
    SN_ARCH_QWEN2,
    SN_ARCH_MISTRAL,      /* llama path; ministral3 flag for the ministral3 text model */
} sn_arch;

typedef enum {
    SN_LAYER_LINEAR,   /* GatedDeltaNet ("linear_attention") */
    SN_LAYER_FULL,     /* full causal attention */
    SN_LAYER_SLIDING,  /* sliding-window attention (mistral layer_types) */
} sn_layer_kind;

typedef enum {
    SN_ROPE_DEFAULT,   /* no scaling */
    SN_ROPE_LINEAR,    /* positions divided by factor */
    SN_ROPE_YARN,
} sn_rope_kind;

typedef struct {
    sn_rope_kind kind;
    double factor;                    /* 1 when DEFAULT */
    int64_t original_max_position;    /* original_max_position_embeddings (0: absent) */
    double beta_fast, beta_slow;      /* yarn; defaults 32 / 1 */
    double mscale, mscale_all_dim;    /* yarn; defaults 1 / 0 */
    double llama4_beta;               /* ministral3 llama_4_scaling_beta (0: none) */
} sn_rope_scaling;

typedef struct {
    char *module;   /* module path, e.g. "language_model.model.layers.0.mlp.gate" */
    int bits;       /* 0: this module is left unquantized */
    int group;
} sn_quant_override;

typedef struct sn_config {
    sn_arch arch;
    char model_type[32];        /* root model_type as written ("qwen3_5", "mistral3", ...) */
    bool has_text_config;       /* the text model was nested under text_config */
    bool ministral3;            /* mistral arch whose text model is ministral3 (query scaling) */

    int64_t hidden_size;        /* H */
    int n_layers;               /* L */
    int64_t intermediate_size;  /* dense MLP I (0 for qwen3_5_moe without it) */
    int n_heads;                /* Hq of (full) attention layers */
    int n_kv_heads;             /* Hkv */
    int head_dim;               /* D */
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias;        /* qwen2: always true for q/k/v (o has none) */

    /* layer pattern: layer_types when given, else full_attention_interval
     * (qwen3_5*: layer i is FULL iff (i+1) % interval == 0); others all FULL
     * (or SLIDING where layer_types says so). */
    sn_layer_kind layer_kind[SN_CFG_MAX_LAYERS];
    int full_attention_interval;  /* qwen3_5* only (0 elsewhere) */
    int sliding_window;           /* 0: none */

    /* GatedDeltaNet (qwen3_5*) */
    int linear_num_key_heads;     /* Hk */
    int linear_num_value_heads;   /* Hv (Hv % Hk == 0) */
    int linear_key_head_dim;      /* Dk */
    int linear_value_head_dim;    /* Dv */
    int linear_conv_kernel_dim;   /* K */

    /* RoPE */
    double rope_theta;
    double partial_rotary_factor; /* 1 unless given (qwen3_5: 0.25) */
    int rotary_dim;               /* int(head_dim * partial_rotary_factor), even */
    sn_rope_scaling rope;

    /* MoE (qwen3_5_moe) */
    int n_experts;                /* E */
    int n_experts_per_tok;        /* top-k */
    int64_t moe_intermediate_size;
    int64_t shared_expert_intermediate_size;
    bool norm_topk_prob;          /* true when absent */

    /* tokens: eos from generation_config.json when present, else config */
    int32_t eos_ids[SN_CFG_MAX_EOS];
    int n_eos;
    int32_t bos_token_id;         /* -1 when absent */
    int32_t pad_token_id;         /* -1 when absent */

    /* quantization / quantization_config (root, else text_config's) */
    bool quantized;
    int q_bits;                   /* default bits (4 or 8); 0 when not quantized */
    int q_group;                  /* default group (32/64/128) */
    int n_q_overrides;
    sn_quant_override *q_overrides;
} sn_config;

/* dir_or_file: a model directory (reads config.json and, when present,
 * generation_config.json) or a path to a config.json. */
sn_status sn_config_load(const char *dir_or_file, sn_config **out);

/* sn_config_load of a model directory the manifest gate verified
 * (sn_manifest_gate_pinned): config.json and generation_config.json are
 * opened through sn_manifest_pins_open and checked again after the read, so
 * a file replaced, written to or removed since the gate (or present but not
 * listed) is refused with SN_E_VERIFY naming it. pins == NULL is
 * sn_config_load. */
typedef struct sn_manifest_pins sn_manifest_pins;
sn_status sn_config_load_pinned(const char *dir, const sn_manifest_pins *pins, sn_config **out);

/* Parse config JSON from memory; label names it in errors. gen_json (may be
 * NULL) is the generation_config.json text. */
sn_status sn_config_parse(const char *json, size_t len, const char *label,
                          const char *gen_json, size_t gen_len, sn_config **out);

void sn_config_free(sn_config *c);  /* accepts NULL */

/* Quantization of the module at module_path (no ".weight"): its override
 * when one exists, else the default. bits = 0 (group 0) means unquantized
 * (no quantization block, or an override of false). Whether a tensor is
 * really quantized is decided by the presence of "<path>.scales"; this
 * gives the bits/group to read it with. */
sn_status sn_config_quant_for(const sn_config *c, const char *module_path, int *bits, int *group);

const char *sn_arch_name(sn_arch a);  /* "qwen3_5", "qwen3_5_moe", "qwen2", "mistral" */

#endif
