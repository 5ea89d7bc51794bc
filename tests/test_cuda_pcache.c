/* Issue 8 on the CUDA backend: byte-identical output with the prompt cache
 * cold or warm and with prompt lookup decoding on or off, on every
 * architecture (the four synthetic models, the transformers fixtures, the
 * default model), at temperature 0 and with a fixed seed.
 *
 * The CUDA kernels are not batch invariant (GEMV vs tensor-core GEMM vs
 * cuBLAS by row count, split-KV vs tiled attention), so these checks hold
 * through the engine's canonical prefill schedule and its PLD row cap
 * (prompt_cache.h); the tests are tests/pcache_canon.h, which the CPU suite
 * runs too (test_prompt_cache, with SANCTUM_INVARIANT_ROWS=4).
 * canon_invariant_rows also prints how many rows per forward really give
 * one-row bits on this GPU (the kernels' side of the bargain).
 * No GPU: a visible SKIP and "0 passed, 0 failed". */
#include "pcache_fixtures.h"

#define FOR_MODELS for (int mi = 0; mi < pf_n; mi++)
#define PM (&pf_models[mi])

#include "pcache_canon.h"

int main(void)
{
    sn_backend *probe = NULL;
    bool gpu_ok = sn_backend_cuda_new(0, &probe) == SN_OK;
    if (!gpu_ok) fprintf(stderr, "SKIP test_cuda_pcache: %s\n", sn_errmsg());
    sn_backend_free(probe);
    if (!gpu_ok) return TEST_END();
    pf_backend = SN_BACKEND_CUDA;
    if (!pf_setup()) {
        fprintf(stderr, "setup failed\n");
        pf_teardown();
        t_failed++;
        return TEST_END();
    }
    for (int i = 0; i < pf_n; i++)
        fprintf(stderr, "model %s (cuda, %d invariant rows)\n", pf_models[i].name,
                sn_engine_invariant_rows(pf_models[i].m));
    RUN(canon_invariant_rows);
    RUN(canon_cold_warm);
    RUN(canon_pld);
    RUN(canon_chat_default);
    pf_teardown();
    return TEST_END();
}
