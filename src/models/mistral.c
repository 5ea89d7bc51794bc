/* Mistral (llama path) and the mistral3 / ministral3 text models: no biases,
 * head_dim honoured even when it is not hidden/heads, RoPE on the full head
 * (theta 1e9 for Mistral-Small-3.x), untied lm_head (architecture.md §2.5,
 * §2.6). ministral3's position-dependent query scaling is applied in the
 * attention block (forward.c) from cfg->rope.llama4_beta. The loader strips
 * the "language_model." / "model.language_model." nesting of mistral3. */
#include "models/llama_binds.h"

static const sn_bind mistral_binds[] = { LLAMA_BINDS(false) };

static sn_status check(const sn_config *c)
{
    SN_TRY(sn_llama_check(c, "mistral"));
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == SN_LAYER_SLIDING)
            return SN_FAIL(SN_E_UNSUPPORTED, "config (mistral): layer %d uses sliding-window attention, which sanctum "
                           "does not implement", l);
    return SN_OK;
}

const sn_arch_impl sn_arch_mistral = {
    .arch = SN_ARCH_MISTRAL,
    .name = "mistral",
    .binds = mistral_binds,
    .n_binds = sizeof mistral_binds / sizeof *mistral_binds,
    .check = check,
};
