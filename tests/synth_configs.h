/* The tiny qwen3_5_moe config that test_safetensors (sanctum-synth output)
 * and test_badckpt (broken copies of that output) both synthesize: one
 * definition, so the checkpoint test_badckpt breaks is the one
 * test_safetensors checks. */
#ifndef SYNTH_CONFIGS_H
#define SYNTH_CONFIGS_H

static const char TINY_MOE[] =
    "{\"model_type\":\"qwen3_5_moe\",\"tie_word_embeddings\":false,\"eos_token_id\":7,\"text_config\":{"
    "\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"head_dim\":64,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,"
    "\"linear_key_head_dim\":32,\"linear_value_head_dim\":32,\"linear_conv_kernel_dim\":4,"
    "\"full_attention_interval\":4,\"rms_norm_eps\":1e-6,\"vocab_size\":512,\"num_experts\":8,"
    "\"num_experts_per_tok\":2,\"moe_intermediate_size\":64,\"shared_expert_intermediate_size\":64,"
    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,\"partial_rotary_factor\":0.25}}}";

#endif
