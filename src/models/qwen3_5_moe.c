/* Qwen3.5 MoE: qwen3_5 with the FFN swapped for a routed mixture of experts
 * plus a sigmoid-gated shared expert (architecture.md §2.3).
 *
 *   p = softmax(x Wg^T) in fp32; top-k; w /= sum(w) (norm_topk_prob, on by default)
 *   y = sum_j w_j * down_e(silu(gate_e x) * up_e x) + sigmoid(x . Wsg) * shared(x)
 *
 * With a backend moe op (CUDA) routing and experts run there. Otherwise
 * routing is decided on the host (the router logits are [T, E], small);
 * every expert runs only on the rows routed to it, all of those rows in one
 * matmul per expert (so prefill is grouped by expert), in expert order with
 * the per-row scale-and-accumulate order of transformers. Experts are
 * stacks: MLX switch_mlp [E, out, in], or raw HF fused gate_up_proj
 * [E, 2*Im, H] (split at load) and down_proj [E, H, Im]. */
#include "models/qwen3_5_binds.h"

#include <math.h>
#include <string.h>

#include "models/model_impl.h"

#define OPS (m->be->ops)
#define BE (m->be)

static const sn_bind qwen3_5_moe_binds[] = {
    QWEN3_5_COMMON_BINDS,
    { "model.layers.%d.mlp.gate", BIND_LINEAR, ON_ALL, LY(router), DIM_E, DIM_H, false, false, LAYOUT_ANY },
    { "model.layers.%d.mlp.switch_mlp.gate_proj", BIND_EXPERTS, ON_ALL, LY(egate), DIM_IM, DIM_H, false, false, LAYOUT_MLX },
    { "model.layers.%d.mlp.switch_mlp.up_proj", BIND_EXPERTS, ON_ALL, LY(eup), DIM_IM, DIM_H, false, false, LAYOUT_MLX },
    { "model.layers.%d.mlp.switch_mlp.down_proj", BIND_EXPERTS, ON_ALL, LY(edown), DIM_H, DIM_IM, false, false, LAYOUT_MLX },
    { "model.layers.%d.mlp.experts.gate_up_proj", BIND_FUSED_GU, ON_ALL, LY(egate), DIM_IM2, DIM_H, false, false, LAYOUT_HF },
    { "model.layers.%d.mlp.experts.down_proj", BIND_FUSED_DOWN, ON_ALL, LY(edown), DIM_H, DIM_IM, false, false, LAYOUT_HF },
    { "model.layers.%d.mlp.shared_expert.gate_proj", BIND_LINEAR, ON_ALL, LY(sgate), DIM_IS, DIM_H, false, false, LAYOUT_ANY },
    { "model.layers.%d.mlp.shared_expert.up_proj", BIND_LINEAR, ON_ALL, LY(sup), DIM_IS, DIM_H, false, false, LAYOUT_ANY },
    { "model.layers.%d.mlp.shared_expert.down_proj", BIND_LINEAR, ON_ALL, LY(sdown), DIM_H, DIM_IS, false, false, LAYOUT_ANY },
    { "model.layers.%d.mlp.shared_expert_gate", BIND_LINEAR, ON_ALL, LY(sgate_w), DIM_1, DIM_H, false, false, LAYOUT_ANY },
};

/* Top-k of the fp32 softmax of each row of logits, grouped by expert:
 * h_count[e]..h_count[e+1] index the (token, weight) pairs of expert e, in
 * token order. */
static void route(sn_model *m, int T)
{
    sn_workspace *ws = &m->ws;
    const int E = (int)m->dims[DIM_E], k = m->cfg->n_experts_per_tok;
    int32_t sel_e[64];
    float sel_w[64];
    memset(ws->h_count, 0, (size_t)(E + 1) * sizeof(int32_t));
    /* first pass: counts; the choice is recomputed in the second pass
     * rather than stored, it is cheap next to the expert matmuls */
    for (int pass = 0; pass < 2; pass++) {
        int32_t *fill = NULL;
        if (pass == 1) {
            /* h_count -> start offsets; reuse h_count[e] as the fill cursor */
            int32_t acc = 0;
            for (int e = 0; e < E; e++) {
                int32_t c = ws->h_count[e];
                ws->h_count[e] = acc;
                acc += c;
            }
            ws->h_count[E] = acc;
            fill = ws->h_count;
        }
        for (int t = 0; t < T; t++) {
            const float *lg = ws->h_router + (size_t)t * E;
            float mx = lg[0];
            for (int e = 1; e < E; e++) mx = fmaxf(mx, lg[e]);
            float sum = 0;
            for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
            /* top-k by probability (ties: lower index first, as torch.topk on CPU) */
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int e = 0; e < E; e++) {
                    bool taken = false;
                    for (int i = 0; i < j; i++) taken = taken || sel_e[i] == e;
                    if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
                }
                sel_e[j] = best;
                sel_w[j] = expf(lg[best] - mx) / sum;
            }
            float tot = 0;
            for (int j = 0; j < k; j++) tot += sel_w[j];
            for (int j = 0; j < k; j++) {
                int e = sel_e[j];
                if (pass == 0) {
                    ws->h_count[e]++;
                } else {
                    int32_t at = fill[e]++;
                    ws->h_sel[at] = t;
                    ws->h_selw[at] = m->cfg->norm_topk_prob ? sel_w[j] / tot : sel_w[j];
                }
            }
        }
    }
    /* the fill cursors ended at each group's end == the next group's start */
    for (int e = E; e > 0; e--) ws->h_count[e] = ws->h_count[e - 1];
    ws->h_count[0] = 0;
}

static sn_status moe_ffn(sn_model *m, int l, const float *xn, int T, float *y)
{
    const sn_layer *ly = &m->layers[l];
    sn_workspace *ws = &m->ws;
    const int64_t H = m->H, E = m->dims[DIM_E], im = m->dims[DIM_IM];
    float *g = ws->s[0], *u = ws->s[1], *act = ws->s[2], *eo = ws->s[3], *xe = ws->s[4], *sh = ws->s[5];

    SN_TRY(OPS->matmul(BE, &ly->router, 0, xn, T, eo));
    if (OPS->moe && OPS->add_gated) {
        /* The backend routes and runs the experts itself (CUDA): nothing
         * crosses to the host, so a decode step can stay one graph. The
         * order lets a graph backend group the projections of xn (router
         * with the shared-expert gate logit, shared gate with shared up)
         * and fold add_gated and the caller's residual add into the MoE;
         * the ops are independent, so each result is the same in any order. */
        SN_TRY(OPS->matmul(BE, &ly->sgate_w, 0, xn, T, xe));
        if (OPS->moe_shared) {
            /* the shared expert inside the MoE's own launches where the
             * backend can (CUDA decode: three launches fewer per layer) */
            const sn_moe_shared sh = { &ly->sgate, &ly->sup, &ly->sdown, xe };
            sn_status st = OPS->moe_shared(BE, &ly->egate, &ly->eup, &ly->edown, eo, m->cfg->n_experts_per_tok,
                                           m->cfg->norm_topk_prob, &sh, xn, T, y);
            if (st != SN_E_UNSUPPORTED) return st;
        }
        SN_TRY(OPS->matmul(BE, &ly->sgate, 0, xn, T, g));
        SN_TRY(OPS->matmul(BE, &ly->sup, 0, xn, T, u));
        SN_TRY(OPS->swiglu(BE, g, u, (size_t)T * (size_t)ly->sgate.rows, act));
        SN_TRY(OPS->matmul(BE, &ly->sdown, 0, act, T, sh));
        SN_TRY(OPS->moe(BE, &ly->egate, &ly->eup, &ly->edown, eo, m->cfg->n_experts_per_tok, m->cfg->norm_topk_prob,
                        xn, T, y));
        return OPS->add_gated(BE, y, sh, xe, T, (int)H);
    }
    SN_TRY(OPS->to_host(BE, ws->h_router, eo, (size_t)(T * E) * sizeof(float)));
    SN_TRY(OPS->matmul(BE, &ly->sgate_w, 0, xn, T, eo));
    SN_TRY(OPS->to_host(BE, ws->h_sgate, eo, (size_t)T * sizeof(float)));
    route(m, T);

    SN_TRY(OPS->memset0(BE, y, (size_t)(T * H) * sizeof(float)));
    for (int e = 0; e < E; e++) {
        int32_t a = ws->h_count[e], n = ws->h_count[e + 1] - a;
        if (!n) continue;
        for (int j = 0; j < n; j++)
            SN_TRY(OPS->copy(BE, xe + j * H, xn + (int64_t)ws->h_sel[a + j] * H, (size_t)H * sizeof(float)));
        SN_TRY(OPS->matmul(BE, &ly->egate, e, xe, n, g));
        SN_TRY(OPS->matmul(BE, &ly->eup, e, xe, n, u));
        SN_TRY(OPS->swiglu(BE, g, u, (size_t)(n * im), act));
        SN_TRY(OPS->matmul(BE, &ly->edown, e, act, n, eo));
        for (int j = 0; j < n; j++) {
            SN_TRY(sn_scale_row(m, eo + j * H, H, ws->h_selw[a + j]));
            SN_TRY(OPS->add(BE, y + (int64_t)ws->h_sel[a + j] * H, eo + j * H, (size_t)H));
        }
    }
    /* shared expert, scaled per token by sigmoid of its gate logit */
    SN_TRY(OPS->matmul(BE, &ly->sgate, 0, xn, T, g));
    SN_TRY(OPS->matmul(BE, &ly->sup, 0, xn, T, u));
    SN_TRY(OPS->swiglu(BE, g, u, (size_t)T * (size_t)ly->sgate.rows, act));
    SN_TRY(OPS->matmul(BE, &ly->sdown, 0, act, T, sh));
    for (int t = 0; t < T; t++) SN_TRY(sn_scale_row(m, sh + t * H, H, 1.0f / (1.0f + expf(-ws->h_sgate[t]))));
    return OPS->add(BE, y, sh, (size_t)(T * H));
}

static sn_status check(const sn_config *c)
{
    SN_TRY(sn_qwen3_5_check(c));
    if (c->n_experts < 1 || c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts ||
        c->n_experts_per_tok > 64 || c->moe_intermediate_size <= 0 || c->shared_expert_intermediate_size <= 0)
        return SN_FAIL(SN_E_FORMAT, "config: MoE dims (num_experts %d, num_experts_per_tok %d, moe_intermediate_size "
                       "%lld, shared_expert_intermediate_size %lld) invalid (top-k at most 64)",
                       c->n_experts, c->n_experts_per_tok, (long long)c->moe_intermediate_size,
                       (long long)c->shared_expert_intermediate_size);
    if (c->hidden_size % 2) return SN_FAIL(SN_E_FORMAT, "config: hidden_size %lld must be even", (long long)c->hidden_size);
    return SN_OK;
}

const sn_arch_impl sn_arch_qwen3_5_moe = {
    .arch = SN_ARCH_QWEN3_5_MOE,
    .name = "qwen3_5_moe",
    .binds = qwen3_5_moe_binds,
    .n_binds = sizeof qwen3_5_moe_binds / sizeof *qwen3_5_moe_binds,
    .zero_centred_norms = true,
    .gated_attention = true,
    .gdn = true,
    .ffn = moe_ffn,
    .check = check,
};
