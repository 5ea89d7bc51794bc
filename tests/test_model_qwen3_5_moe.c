/* qwen3_5_moe against tests/fixtures/qwen3_5_moe: see test_model_common.h
 * for what is compared and the tolerances. */
#define FIXTURE_ARCH "qwen3_5_moe"
#define FIXTURE_EXTRA moe_extra
static void moe_extra(void);
#include "test_model_common.h"

/* The MoE block has two paths: the backend's moe + add_gated ops when it
 * has them, else routing on the host with one matmul per selected expert.
 * Run the fixture through both (the backend table copied with those ops
 * cleared) and against the reference. */
static void test_moe_host_routing(void)
{
    NEED_FIXTURE();
    sn_backend *be = g_mlx->be;
    const sn_backend_ops *orig = be->ops;
    sn_backend_ops host = *orig;
    host.moe = NULL;
    host.add_gated = NULL;
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        float *a = run_all(g_mlx, g_ref.prompt[i], L);
        be->ops = &host;
        float *b = run_all(g_mlx, g_ref.prompt[i], L);
        be->ops = orig;
        CHECK(a && b);
        if (a && b) {
            size_t n = (size_t)L * g_V;
            float scale = fmaxf(1.0f, max_abs(g_ref.logits[i], n));
            float dh = max_diff(b, g_ref.logits[i], n), dab = max_diff(a, b, n);
            fprintf(stderr, "  prompt %d: host routing vs reference %.3g, vs backend moe %.3g%s\n", i, dh, dab,
                    orig->moe ? "" : " (backend has no moe op: same path)");
            CHECKF(dh <= TOL_REF * scale, "prompt %d: host-routed MoE max diff %g > %g", i, dh, TOL_REF * scale);
            CHECKF(dab <= TOL_LAYOUT * scale, "prompt %d: host vs backend MoE max diff %g", i, dab);
        }
        free(a);
        free(b);
    }
}

static void moe_extra(void) { RUN(test_moe_host_routing); }

int main(int argc, char **argv) { return fixture_main(argc, argv); }
