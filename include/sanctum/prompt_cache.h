/* Prompt-cache pool: finished (and prewarmed) sequences leave their state
 * here, keyed by the tokens they consumed, and a new request resumes from
 * the entry that shares the longest common prefix (LCP) with its prompt.
 *
 * KV caches can be cut at any position, the GatedDeltaNet conv + recurrent
 * states cannot: an entry therefore holds the KV rows of all its tokens and
 * the recurrent state at a few checkpoints (every ckpt_every tokens up to
 * 4 x ckpt_every, then two per doubling of the position, at the first and
 * the last message boundary the caller names, at the end of the prompt,
 * and at the end of the sequence). A request resumes from the
 * nearest checkpoint at or below the common prefix (any position for models
 * without GatedDeltaNet layers) and computes the rest, at least min_fresh
 * tokens so the last prompt token's logits come from a forward pass.
 * Entries share their common prefixes (reference-counted segments), so a
 * long system prompt used by many conversations is stored once.
 *
 * min_fresh = 1 relies on the backend being batch invariant (a token gives
 * the same bits alone or inside a run of many: tests/test_prompt_cache.c
 * proves it on every architecture); min_fresh = 2 is the conservative rule
 * of the seed (T_q >= 2), kept as a knob (SANCTUM_PCACHE_MIN_FRESH).
 *
 * The pool is bounded by budget_bytes with LRU eviction and is safe to use
 * from several threads (one pool mutex; copies to and from backend memory
 * run under the model lock). */
#ifndef SANCTUM_PROMPT_CACHE_H
#define SANCTUM_PROMPT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "sanctum/model.h"
#include "sanctum/status.h"

typedef struct sn_pcache sn_pcache;
typedef struct sn_pcache_req sn_pcache_req;

typedef struct {
    size_t budget_bytes;  /* pool limit (host memory); 0 disables storing */
    int ckpt_every;       /* recurrent-state checkpoint spacing in tokens, >= 16 */
    int min_fresh;        /* tokens always computed after a restore: 1 or 2 */
} sn_pcache_opts;

/* 512 MiB, a checkpoint every 256 tokens, min_fresh 1 (or the value of
 * SANCTUM_PCACHE_MIN_FRESH when it is 1 or 2). */
void sn_pcache_opts_default(sn_pcache_opts *o);

sn_status sn_pcache_new(sn_model *m, const sn_pcache_opts *o, sn_pcache **out);
void sn_pcache_free(sn_pcache *pc);
/* Drops every entry (statistics are kept). */
void sn_pcache_clear(sn_pcache *pc);

typedef struct {
    uint64_t hits;           /* requests that resumed from a cached state */
    uint64_t misses;         /* requests that started from position 0 */
    uint64_t cached_tokens;  /* prompt tokens not computed thanks to the pool */
    uint64_t evictions;
    uint64_t entries;        /* now */
    uint64_t bytes;          /* now */
} sn_pcache_stats;

void sn_pcache_get_stats(sn_pcache *pc, sn_pcache_stats *out);

/* One request's use of the pool.
 *
 *   sn_pcache_begin     seq (at position 0) gets the best cached state for
 *                       prompt; *cached is its position (0 on a miss).
 *   sn_pcache_next_stop prefill runs [pos, stop) next: stop is the first
 *                       planned checkpoint in (pos, end], else end.
 *   sn_pcache_capture   after each prefill forward: keeps the recurrent
 *                       state when the position is a planned checkpoint.
 *   sn_pcache_commit    at the end: stores the sequence (its first
 *                       sn_seq_pos(seq) tokens of tokens[]) into the pool.
 *
 * bounds: positions (token counts) where a chat message starts or ends;
 * may be NULL; the first and the last become checkpoints. The request
 * holds references to the segments it resumed through, so eviction by
 * other threads meanwhile is harmless; sn_pcache_req_free drops them. */
sn_status sn_pcache_begin(sn_pcache *pc, sn_seq *seq, const int32_t *prompt, int n_prompt, const int *bounds,
                          int n_bounds, sn_pcache_req **out, int *cached);
int sn_pcache_next_stop(const sn_pcache_req *r, int pos, int end);
sn_status sn_pcache_capture(sn_pcache_req *r, const sn_seq *seq);
sn_status sn_pcache_commit(sn_pcache_req *r, const sn_seq *seq, const int32_t *tokens, int n_tokens);
void sn_pcache_req_free(sn_pcache_req *r);

/* Prefills tokens into the pool without generating (--prewarm-file):
 * begin, prefill with checkpoints, commit. seq is reset first and left at
 * the end of the tokens. */
sn_status sn_pcache_prewarm(sn_pcache *pc, sn_model *m, sn_seq *seq, const int32_t *tokens, int n,
                            const int *bounds, int n_bounds);

/* ---- recurrent-state rewind (shared with speculative decoding) ----------
 *
 * The GatedDeltaNet conv + recurrent state of every layer, kept in backend
 * memory. Going back from position p to an earlier q needs only this: KV
 * rows below q are never rewritten by forwards from q on, and rows at and
 * above the position are never read. */
typedef struct sn_rewind sn_rewind;

sn_status sn_rewind_new(const sn_seq *seq, sn_rewind **out);
void sn_rewind_free(sn_rewind *r);
/* Remembers seq's recurrent state and position. */
sn_status sn_rewind_save(sn_rewind *r, const sn_seq *seq);
/* Puts seq back to position pos, between the saved position and its
 * current one. With recurrent layers only the saved position itself can be
 * reached (its state is restored; the caller feeds the tokens after it
 * again); without them any such pos is a plain cut of the KV cache. */
sn_status sn_rewind_restore(const sn_rewind *r, sn_seq *seq, int pos);
int sn_rewind_pos(const sn_rewind *r);
/* True when the model has recurrent layers (rewinding copies state). */
int sn_rewind_has_state(const sn_rewind *r);

#endif
