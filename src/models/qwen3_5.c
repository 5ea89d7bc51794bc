/* Qwen3.5 dense hybrid: GatedDeltaNet layers with a gated full-attention
 * layer every full_attention_interval (architecture.md §2.1-2.3).
 *
 * Names are canonical (loader.c strips "language_model." and
 * "model.language_model."). Raw HF checkpoints store the five RMSNorm
 * weights zero-centred (used as 1+w); MLX ones store 1+w. */
#include "models/qwen3_5_binds.h"

static const sn_bind qwen3_5_binds[] = {
    QWEN3_5_COMMON_BINDS,
    { "model.layers.%d.mlp.gate_proj", BIND_LINEAR, ON_ALL, LY(gate), DIM_I, DIM_H, false, false, LAYOUT_ANY },
    { "model.layers.%d.mlp.up_proj", BIND_LINEAR, ON_ALL, LY(up), DIM_I, DIM_H, false, false, LAYOUT_ANY },
    { "model.layers.%d.mlp.down_proj", BIND_LINEAR, ON_ALL, LY(down), DIM_H, DIM_I, false, false, LAYOUT_ANY },
};

/* Dimensions the hybrid stack needs beyond sn_config's own validation. */
sn_status sn_qwen3_5_check(const sn_config *c)
{
    if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || c->n_heads % c->n_kv_heads)
        return SN_FAIL(SN_E_FORMAT, "config: num_attention_heads %d / num_key_value_heads %d / head_dim %d invalid",
                       c->n_heads, c->n_kv_heads, c->head_dim);
    if (c->linear_num_key_heads <= 0 || c->linear_num_value_heads <= 0 || c->linear_key_head_dim <= 0 ||
        c->linear_value_head_dim <= 0 || c->linear_conv_kernel_dim < 1 ||
        c->linear_num_value_heads % c->linear_num_key_heads)
        return SN_FAIL(SN_E_FORMAT, "config: GatedDeltaNet dims (linear_num_key_heads %d, linear_num_value_heads %d, "
                       "linear_key_head_dim %d, linear_value_head_dim %d, linear_conv_kernel_dim %d) invalid",
                       c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                       c->linear_value_head_dim, c->linear_conv_kernel_dim);
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == SN_LAYER_SLIDING)
            return SN_FAIL(SN_E_UNSUPPORTED, "config: layer %d is sliding attention, which qwen3_5 does not have", l);
    return SN_OK;
}

static sn_status check(const sn_config *c)
{
    SN_TRY(sn_qwen3_5_check(c));
    if (c->intermediate_size <= 0)
        return SN_FAIL(SN_E_FORMAT, "config: intermediate_size %lld invalid", (long long)c->intermediate_size);
    return SN_OK;
}

const sn_arch_impl sn_arch_qwen3_5 = {
    .arch = SN_ARCH_QWEN3_5,
    .name = "qwen3_5",
    .binds = qwen3_5_binds,
    .n_binds = sizeof qwen3_5_binds / sizeof *qwen3_5_binds,
    .zero_centred_norms = true,
    .gated_attention = true,
    .gdn = true,
    .check = check,
};
