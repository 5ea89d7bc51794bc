/* Architecture registry: config model_type (as sn_config resolved it,
 * wrappers such as mistral3 included) -> the architecture's binding table
 * and flags. */
#include "models/model_impl.h"

const sn_arch_impl *sn_arch_find(sn_arch a)
{
    static const sn_arch_impl *const all[] = {
        &sn_arch_qwen3_5, &sn_arch_qwen3_5_moe, &sn_arch_qwen2, &sn_arch_mistral,
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]->arch == a) return all[i];
    return NULL;
}
