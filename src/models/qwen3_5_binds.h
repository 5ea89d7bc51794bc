/* The qwen3_5 bindings shared by qwen3_5.c and qwen3_5_moe.c: everything
 * but the FFN (canonical names, see loader.c). */
#ifndef SN_QWEN3_5_BINDS_H
#define SN_QWEN3_5_BINDS_H

#include "models/binds_common.h"

#define QWEN3_5_COMMON_BINDS                                                                           \
    DECODER_FRAME_BINDS,                                                                               \
    { "model.layers.%d.linear_attn.in_proj_qkv", BIND_LINEAR, ON_LINEAR, LY(in_qkv), DIM_CONV, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.in_proj_z", BIND_LINEAR, ON_LINEAR, LY(in_z), DIM_VD, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.in_proj_b", BIND_LINEAR, ON_LINEAR, LY(in_b), DIM_HV, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.in_proj_a", BIND_LINEAR, ON_LINEAR, LY(in_a), DIM_HV, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.conv1d", BIND_CONV, ON_LINEAR, LY(conv_w), DIM_CONV, DIM_K, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.A_log", BIND_VEC, ON_LINEAR, LY(A_log), DIM_HV, DIM_1, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.dt_bias", BIND_VEC, ON_LINEAR, LY(dt_bias), DIM_HV, DIM_1, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.norm", BIND_GNORM, ON_LINEAR, LY(gnorm), DIM_DV, DIM_1, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.linear_attn.out_proj", BIND_LINEAR, ON_LINEAR, LY(out_proj), DIM_H, DIM_VD, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.q_proj", BIND_LINEAR_QG, ON_ATTN, LY(wq), DIM_QGD, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.k_proj", BIND_LINEAR, ON_ATTN, LY(wk), DIM_KVD, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.v_proj", BIND_LINEAR, ON_ATTN, LY(wv), DIM_KVD, DIM_H, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.o_proj", BIND_LINEAR, ON_ATTN, LY(wo), DIM_H, DIM_QD, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.q_norm", BIND_NORM, ON_ATTN, LY(q_norm), DIM_D, DIM_1, false, false, LAYOUT_ANY }, \
    { "model.layers.%d.self_attn.k_norm", BIND_NORM, ON_ATTN, LY(k_norm), DIM_D, DIM_1, false, false, LAYOUT_ANY }

#endif
