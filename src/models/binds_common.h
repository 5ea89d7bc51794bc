/* What the binding tables of every architecture share (llama_binds.h,
 * qwen3_5_binds.h): the offset shorthands and the rows each decoder starts
 * with, in this order. Canonical names, see loader.c. */
#ifndef SN_BINDS_COMMON_H
#define SN_BINDS_COMMON_H

#include <stddef.h>

#include "models/model_impl.h"

#define LY(f) offsetof(sn_layer, f)
#define MD(f) offsetof(sn_model, f)

/* Embedding, final norm, lm_head (optional: tied embeddings) and each
 * layer's two RMSNorms. */
#define DECODER_FRAME_BINDS                                                                            \
    { "model.embed_tokens", BIND_EMBED, ON_GLOBAL, MD(embed), DIM_V, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.norm", BIND_NORM, ON_GLOBAL, MD(final_norm), DIM_H, DIM_1, false, false, LAYOUT_ANY },    \
    { "lm_head", BIND_LINEAR, ON_GLOBAL, MD(lm_head), DIM_V, DIM_H, true, false, LAYOUT_ANY },         \
    { "model.layers.%d.input_layernorm", BIND_NORM, ON_ALL, LY(in_norm), DIM_H, DIM_1, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.post_attention_layernorm", BIND_NORM, ON_ALL, LY(post_norm), DIM_H, DIM_1, false, false, LAYOUT_ANY }

#endif
