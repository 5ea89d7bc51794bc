/* Qwen2 / Qwen2.5: llama-shaped decoder with biases on q/k/v (not o), full
 * RoPE with optional YaRN (set up in loader.c rope_setup), standard norms,
 * usually tied embeddings (architecture.md §2.4, §3.3). HF and MLX names
 * are the same; a quantized q_proj has weight/scales/biases and the linear
 * bias. */
#include "models/llama_binds.h"

static const sn_bind qwen2_binds[] = { LLAMA_BINDS(true) };

static sn_status check(const sn_config *c) { return sn_llama_check(c, "qwen2"); }

const sn_arch_impl sn_arch_qwen2 = {
    .arch = SN_ARCH_QWEN2,
    .name = "qwen2",
    .binds = qwen2_binds,
    .n_binds = sizeof qwen2_binds / sizeof *qwen2_binds,
    .check = check,
};
