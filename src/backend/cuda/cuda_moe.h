/* The two-launch MoE decode of cuda_moe.cu (issue 6). Included at the end
 * of cuda_internal.h (needs cu_weight, sn_status, cudaStream_t). */
#ifndef SANCTUM_CUDA_MOE_H
#define SANCTUM_CUDA_MOE_H

/* MoE decode in two launches (cuda_moe.cu): routing folded into the
 * gate/up kernel, the weighted sum over the k experts into the down kernel,
 * which can also apply the graph fuser's epilogue: out = v + sigmoid(sg[t])
 * * sh[t, :] (when sh) and add_to[t, :] += out (when add_to), with the float
 * operations of k_add_gated / k_add. cu_moe uses it below the grouped-GEMM
 * threshold when cu_moe_dec_ok. Scratch: cu_moe_dec_scratch_bytes (at most
 * cu_moe_scratch_bytes). cu_moe_dec_mode: 0 off (the route/gate_up/down/sum
 * kernels), 1 on (default), 2 on with the chosen down matrices prefetched
 * into L2 from the gate/up kernel (tune key "moe_dec"; the prefetch lost
 * 1-4 % of the 35B-A3B decode in the H200 runs of 2026-12-01 17:58Z and
 * 18:07Z, three interleaved rounds each, so it is off). */
typedef struct {
    const float *sh; /* [T, H] or NULL */
    const float *sg; /* [T] gate logits (with sh) */
    float *add_to;   /* [T, H] or NULL */
} cu_moe_epi;
/* The shared expert as one more slot of both launches (moe_shared): its
 * gate/up rows beside the chosen experts', h = sigmoid(sg[t]) * silu(g) * u,
 * and its down matrix in the same dot product as theirs. It must have the
 * stacks' shape and format (cu_moe_dec_sh_ok). */
typedef struct cu_moe_sh {
    const cu_weight *gate, *up, *down;
    const float *sg; /* [T] gate logits */
} cu_moe_sh;
extern int cu_moe_dec_mode;
/* warps per block of the gate/up kernel: 4 (default: with the shared slot
 * the 35B-A3B's 9 x 32 blocks of 8 warps took two waves at two blocks per
 * SM) or 8 (tune "moe_gu_warps"); the bits are the same */
extern int cu_moe_gu_warps;
/* the routing inside the gate/up kernel: 1 (default) the other warps find
 * the top k of parts of the experts while warp 0 forms the softmax's max
 * and sum, then warp 0 merges (for (warps - 1) * k <= 64, else warp 0
 * alone); 0 by warp 0 alone (tune "moe_route"); the same experts, weights
 * and bits either way */
extern int cu_moe_route;
/* when the decode kernels' activations are loaded (tune "moe_pre", bits):
 * 1 the down kernel's h beside the expert ids, before its weights; 2 the
 * gate/up kernel's x before the routing; a clear bit: after the weights'
 * first loads, where they queued behind them. Default 3. The same bits
 * either way. */
extern int cu_moe_pre;
/* output rows per warp of the down kernel: 0 (default) 1 for one token,
 * 2 for more; 1 (twice the blocks, each staging all of h, at fewer
 * registers) or 2 for every T (tune "moe_dn_rpw"); the same bits */
extern int cu_moe_dn_rpw;
/* the down kernel starts before the gate/up kernel ends (tune
 * "moe_dn_early", default 1): with cu_pdl 2 it is launched with the PDL
 * edge and loads its weights once the gate/up kernel's blocks have
 * published the experts (cuda_moe.cu, md_publish); 0: after the gate/up
 * kernel, the ids read after pdl_wait. The same bits either way. */
extern int cu_moe_dn_early;
/* the gate/up kernel on the PDL edge when the launch before it (the
 * router) had none, so its blocks become resident while the router runs
 * (tune "moe_gu_edge"): 1 (default) for one token, 2 for every T, 0
 * never (launched after the router). The same bits. */
extern int cu_moe_gu_edge;
/* the gate/up kernel's dot products on x's int8 digits with dp4a, as the
 * SIMT GEMV's default form (tune "moe_dp", default 1; Q4 in groups of
 * 32/64/128, 4-warp blocks, else the fp32 form): fewer instructions per
 * weight, exact int32 partials per chunk, fp32-class; its bits differ from
 * the fp32 form's by rounding (each form the same for graph and eager, any
 * T). s31r1 (H100, 35B-A3B): 1-2.6 % shorter steps at one row, 3-4 % at
 * six. */
extern int cu_moe_dp;
/* chunk steps of weights the Q4 down kernel loads ahead per lane at one
 * row a warp (tune "moe_dn_u": 4, 5 (default) or 6): the 35B-A3B's
 * concatenated row (9 x 512 columns) is 4.5 steps of 32 lanes, so at 4
 * its last step's loads leave after h has come and four steps are done
 * (s31r1: 5 was 0.2-1.4 % faster than 4, 6 no faster). The same bits. */
extern int cu_moe_dn_u;
/* unsigned ints of the zeroed buffer cu_moe_dec's early start keeps per
 * stream: a count, then a flag per (token, slot) */
#define CU_MOE_SYNC 4096
bool cu_moe_dec_ok(const cu_weight *gate, const cu_weight *up, const cu_weight *down, int T, int top_k);
bool cu_moe_dec_sh_ok(const cu_weight *gate, const cu_weight *up, const cu_weight *down, const cu_moe_sh *sh, int T,
                      int top_k);
/* top_k: the slots (k + 1 with a shared expert) */
size_t cu_moe_dec_scratch_bytes(const cu_weight *gate, int T, int top_k);
sn_status cu_moe_dec(cudaStream_t s, const cu_weight *gate, const cu_weight *up, const cu_weight *down,
                     const float *logits, int top_k, int norm_topk, const float *x, int T, float *out, void *scratch,
                     const cu_moe_sh *sh, const cu_moe_epi *epi, unsigned *sync);

#endif
