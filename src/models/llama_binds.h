/* Bindings of the plain (llama-shaped) decoder shared by qwen2.c and
 * mistral.c: RMSNorm, attention without q/k norm or gate, SwiGLU. BIAS is
 * true for qwen2's q/k/v biases. Canonical names (see loader.c). */
#ifndef SN_LLAMA_BINDS_H
#define SN_LLAMA_BINDS_H

#include "models/binds_common.h"

#define LLAMA_BINDS(BIAS)                                                                              \
    DECODER_FRAME_BINDS,                                                                               \
    { "model.layers.%d.self_attn.q_proj", BIND_LINEAR, ON_ATTN, LY(wq), DIM_QD, DIM_H, false, BIAS, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.k_proj", BIND_LINEAR, ON_ATTN, LY(wk), DIM_KVD, DIM_H, false, BIAS, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.v_proj", BIND_LINEAR, ON_ATTN, LY(wv), DIM_KVD, DIM_H, false, BIAS, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.o_proj", BIND_LINEAR, ON_ATTN, LY(wo), DIM_H, DIM_QD, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.mlp.gate_proj", BIND_LINEAR, ON_ALL, LY(gate), DIM_I, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.mlp.up_proj", BIND_LINEAR, ON_ALL, LY(up), DIM_I, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.mlp.down_proj", BIND_LINEAR, ON_ALL, LY(down), DIM_H, DIM_I, false, false, LAYOUT_ANY }

/* Attention + FFN dims every llama-shaped config must have. */
static inline sn_status sn_llama_check(const sn_config *c, const char *arch)
{
    if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || c->n_heads % c->n_kv_heads ||
        c->intermediate_size <= 0)
        return SN_FAIL(SN_E_FORMAT, "config (%s): num_attention_heads %d / num_key_value_heads %d / head_dim %d / "
                       "intermediate_size %lld invalid", arch, c->n_heads, c->n_kv_heads, c->head_dim,
                       (long long)c->intermediate_size);
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == SN_LAYER_LINEAR)
            return SN_FAIL(SN_E_FORMAT, "config (%s): layer %d is linear_attention, which %s does not have", arch, l, arch);
    return SN_OK;
}

#endif
