/* Prompt lookup decoding (PLD): self-speculation without a draft model.
 *
 * The draft is what followed the latest earlier occurrence of the last
 * n-gram of the token stream (prompt + generated text), n = ngram down to 1.
 * The generation loop (src/engine/generate.c) feeds the newest token plus
 * the draft through one forward pass with every row's logits, samples each
 * row in order with the request's own sampler, and keeps drafts while the
 * sampled token equals the draft token. The first mismatch is the model's
 * own next token; the state is rolled back to the last accepted token
 * (KV: cut the position; GatedDeltaNet: restore the state saved before the
 * verify pass and feed the accepted tokens again with the next step).
 *
 * Why this is the standard speculative rule, and byte-identical:
 * for a deterministic draft d (q = one-hot), speculative sampling accepts d
 * with probability min(1, p(d)/q(d)) = p(d) and otherwise samples from the
 * residual norm(max(0, p - q)) = p without d. Drawing x ~ p and accepting
 * iff x == d has the same acceptance probability p(d), and on a mismatch x
 * is distributed as p conditioned on x != d, which is that residual. Since
 * the draw for each position is the same sampler call (same processed
 * distribution, same repetition window, same RNG draw) that the loop makes
 * without PLD, and the CPU backend gives every row the same bits alone or
 * in a run, the emitted tokens are identical with PLD on or off, at
 * temperature 0 and at a fixed seed alike. Drafting only changes speed.
 * On a backend that keeps one-row bits only up to sn_engine_invariant_rows
 * rows per forward (CUDA; prompt_cache.h), a verify pass feeds no more.
 *
 * How many tokens to draft is a cost decision (a CPU forward of 1 + d rows
 * costs more than one row; a GPU one barely does): sn_pld_ctl keeps the
 * measured cost of a forward per row count and the acceptance rate per
 * n-gram length, and drafts the d that maximises expected tokens per
 * second (with occasional probes so the estimates stay fresh). */
#ifndef SANCTUM_PLD_H
#define SANCTUM_PLD_H

#include <stdbool.h>
#include <stdint.h>

#include "sanctum/status.h"

#define SN_PLD_MAX_LOOKUP 32
#define SN_PLD_MAX_NGRAM 8

typedef struct {
    int max_lookup;   /* drafts per step, 1..SN_PLD_MAX_LOOKUP (SANCTUM_MLX_PLD_MAX_LOOKUP, default 5) */
    int ngram;        /* longest n-gram matched, 1..SN_PLD_MAX_NGRAM (SANCTUM_MLX_PLD_NGRAM_SIZE, default 3) */
    bool adaptive;    /* cost model picks the draft length (false: always draft max_lookup when a match exists) */
} sn_pld_opts;

/* Defaults, overridden by the environment variables above; a malformed or
 * out-of-range value is an error naming the variable. */
sn_status sn_pld_opts_from_env(sn_pld_opts *o);
sn_status sn_pld_opts_check(const sn_pld_opts *o);

/* Draft for hist[0..n): the tokens after the latest earlier occurrence of
 * the last n-gram, n from ngram down to 1, at most max of them, into out.
 * Returns the number of drafts (0 when nothing matches); *match_n gets the
 * n-gram length that matched (0 when none). */
int sn_pld_draft(const int32_t *hist, int n, int ngram, int max, int32_t *out, int *match_n);

/* Draft-length controller. */
typedef struct {
    double row1_s;                      /* EMA seconds of a 1-row forward (0: unknown) */
    double extra_s;                     /* EMA seconds per extra row (< 0: unknown) */
    double acc[SN_PLD_MAX_NGRAM + 1];   /* per match length: P(a draft token is accepted | the previous was) */
    int idle;                           /* steps since the last draft while a match existed */
    unsigned seen_rows;                 /* row counts timed once already (bit r) */
    bool adaptive;
} sn_pld_ctl;

void sn_pld_ctl_init(sn_pld_ctl *c, bool adaptive);
/* Drafts to feed (0..avail) for a match of length match_n. */
int sn_pld_ctl_choose(sn_pld_ctl *c, int match_n, int avail);
/* After a forward of rows rows that took seconds, verifying drafted drafts
 * (of a match of length match_n) of which accepted were accepted. */
void sn_pld_ctl_observe(sn_pld_ctl *c, int rows, double seconds, int match_n, int drafted, int accepted);

#endif
