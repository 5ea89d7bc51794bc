/* libFuzzer target for the config.json parser. The input is split at the
 * first NUL byte: before it config.json, after it generation_config.json
 * (absent when there is no NUL), so both files get mutated.
 *
 * Build with `make fuzz`; run from the repository root with the bench
 * configs as seeds (tests/fuzz/README.md has the lines). */
#include <stdint.h>
#include <string.h>

#include "sanctum/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    const char *nul = memchr(p, 0, size);
    size_t clen = nul ? (size_t)(nul - p) : size;
    const char *gen = nul ? nul + 1 : NULL;
    size_t glen = nul ? size - clen - 1 : 0;
    sn_config *c = NULL;
    sn_status s = sn_config_parse(p, clen, "config.json", gen, glen, &c);
    if (s != SN_OK) {
        if (c != NULL || sn_errmsg()[0] == 0) __builtin_trap();
        return 0;
    }
    /* invariants every accepted config must hold */
    if (c->n_layers < 1 || c->n_layers > SN_CFG_MAX_LAYERS || c->hidden_size < 1 || c->n_heads < 1 ||
        c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->head_dim < 1 || c->rotary_dim < 2 ||
        c->rotary_dim > c->head_dim || c->n_eos < 0 || c->n_eos > SN_CFG_MAX_EOS)
        __builtin_trap();
    if ((c->arch == SN_ARCH_QWEN3_5 || c->arch == SN_ARCH_QWEN3_5_MOE) &&
        c->linear_num_value_heads % c->linear_num_key_heads)
        __builtin_trap();
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab_size) __builtin_trap();
    int bits, group;
    sn_config_quant_for(c, "language_model.model.layers.0.mlp.gate", &bits, &group);
    if (c->quantized && bits && !((bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128)))
        __builtin_trap();
    for (int i = 0; i < c->n_q_overrides; i++) {
        sn_config_quant_for(c, c->q_overrides[i].module, &bits, &group);
        if (bits != c->q_overrides[i].bits) __builtin_trap();
    }
    sn_config_free(c);
    return 0;
}
