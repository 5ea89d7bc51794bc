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
 * of the seed (T_q >= 2), kept as a knob (SANCTUM_PCACHE_MIN_FRESH). A
 * backend that is not batch invariant (CUDA) resumes only where a canonical
 * prefill schedule allows, see "backends that are not batch invariant".
 *
 * The pool is bounded by budget_bytes with LRU eviction and is safe to use
 * from several threads (one pool mutex; copies to and from backend memory
 * run under the model lock).
 *
 * Where the pool keeps its state (sn_pcache_opts.store): on a backend with
 * device memory (CUDA) in buffers of that backend, so a restore, a
 * checkpoint and a commit are device-to-device copies queued on the
 * backend's stream, with no host transfer and no host wait; on the CPU in
 * host memory (malloc, the backend's memcpy). A buffer the backend cannot
 * allocate (device memory full) falls back to host memory, per buffer,
 * with the same results. budget_bytes bounds the pool wherever it lives
 * (one budget: on CUDA it is device memory). The pool must be freed before
 * its model. */
#ifndef SANCTUM_PROMPT_CACHE_H
#define SANCTUM_PROMPT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "sanctum/model.h"
#include "sanctum/status.h"

typedef struct sn_pcache sn_pcache;
typedef struct sn_pcache_req sn_pcache_req;

/* sn_pcache_opts.store */
typedef enum {
    SN_PCACHE_STORE_AUTO = 0,  /* backend memory unless the backend is the CPU (its buffers are host memory anyway) */
    SN_PCACHE_STORE_HOST,      /* host memory: to_host / from_host copies */
    SN_PCACHE_STORE_BACKEND,   /* backend buffers (buf_alloc) and backend copies, also on the CPU (tests) */
} sn_pcache_store;

typedef struct {
    size_t budget_bytes;  /* pool limit, wherever the pool lives (see store); 0 disables storing */
    int ckpt_every;       /* recurrent-state checkpoint spacing in tokens, >= 16 */
    int min_fresh;        /* tokens always computed after a restore: 1 or 2 */
    int prefill_chunk;    /* sn_pcache_begin / prewarm forward size on a backend that is not batch
                           * invariant (sn_prefill_schedule); <= 0: 512, as sn_generate's default */
    sn_pcache_store store; /* where entries live; AUTO (0) by default */
} sn_pcache_opts;

/* 512 MiB, a checkpoint every 256 tokens, min_fresh 1 (or the value of
 * SANCTUM_PCACHE_MIN_FRESH when it is 1 or 2), store AUTO (or
 * SANCTUM_PCACHE_STORE=auto|host|backend). */
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
    uint64_t backend_bytes;  /* now: the part of bytes held in backend buffers */
    uint64_t host_fallbacks; /* buffers put in host memory because the backend could not allocate them */
    /* host seconds spent, summed over requests: finding the entry, queueing
     * the restore copies (on CUDA the device-to-device copies then run on
     * the stream ahead of the first forward), taking checkpoints during the
     * prefill, and storing at commit (eviction included) */
    double lookup_s, restore_s, capture_s, commit_s;
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
/* The same with the prefill chunk the caller will use (sn_generate passes
 * its prefill_chunk; <= 0: 512); it matters only on a backend that is not
 * batch invariant, where the chunk fixes the schedule below. */
sn_status sn_pcache_begin_ex(sn_pcache *pc, sn_seq *seq, const int32_t *prompt, int n_prompt, const int *bounds,
                             int n_bounds, int chunk, sn_pcache_req **out, int *cached);
int sn_pcache_next_stop(const sn_pcache_req *r, int pos, int end);
sn_status sn_pcache_capture(sn_pcache_req *r, const sn_seq *seq);
sn_status sn_pcache_commit(sn_pcache_req *r, const sn_seq *seq, const int32_t *tokens, int n_tokens);
void sn_pcache_req_free(sn_pcache_req *r);

/* Prefills tokens into the pool without generating (--prewarm-file):
 * begin, prefill with checkpoints, commit. seq is reset first and left at
 * the end of the tokens. */
sn_status sn_pcache_prewarm(sn_pcache *pc, sn_model *m, sn_seq *seq, const int32_t *tokens, int n,
                            const int *bounds, int n_bounds);

/* ---- backends that are not batch invariant ------------------------------
 *
 * The CUDA kernels depend on the number of rows of a forward (a one-token
 * step takes the GEMV and split-KV decode kernels, a run of 8+ tokens the
 * tensor-core GEMM or cuBLAS and the tiled prefill attention), so there a
 * token's bits depend on how its prefill was cut. The engine then keeps
 * every prompt on one canonical schedule, the same cold, warm and with the
 * cache off: the prefill from position 0 runs as the forwards
 * [s_i, s_i+1) with s = the multiples of chunk, the first and the last of
 * the message bounds and the prompt end. A cached entry remembers its
 * schedule, and a request resumes only at a position r that ends a forward
 * in both schedules, with the same forwards below r: the rest of the
 * prompt then runs exactly the forwards a cold run makes, on bitwise the
 * same state, so it gives the same bits. Generated tokens (decode steps)
 * are never reused there, and prompt lookup decoding verifies at most
 * sn_engine_invariant_rows(m) rows per forward. */

/* The engine's environment knobs, checked: SANCTUM_INVARIANT_ROWS (below),
 * SANCTUM_PCACHE_MIN_FRESH and SANCTUM_PCACHE_STORE (sn_pcache_opts_default),
 * and the forward's SANCTUM_GRAPH_ROWS and SANCTUM_RECORD_AHEAD (which every
 * forward reads again, failing on a malformed value).
 * A value set but malformed is SN_E_INVALID naming the variable and what
 * it takes; sn_pcache_new and sn_generate check, and the server at start. */
sn_status sn_engine_env_check(void);

/* The largest number of rows one forward may have while every row's result
 * is bitwise that of a one-row forward. INT_MAX: fully batch invariant (the
 * CPU backend): any cut, any resume position. Otherwise the canonical
 * schedule above is used. The environment SANCTUM_INVARIANT_ROWS (an
 * integer >= 1, or "max") overrides it for experiments; a malformed value
 * counts as 1 here (sn_engine_env_check refuses it). The CUDA backend
 * counts 8 (its GEMV and split-KV decode attention take up to 8 rows, each
 * with one-row bits; test_cuda_pcache measures it). */
int sn_engine_invariant_rows(const sn_model *m);
/* The forward size the canonical schedule uses for a prefill chunk of
 * chunk tokens (<= 0: 512), capped at the model's step size. */
int sn_prefill_chunk(const sn_model *m, int chunk);
/* The canonical schedule of a prompt of n tokens: the ascending ends of
 * its forwards into out (room for n / chunk + 3), returns their count; the
 * last is n. chunk as returned by sn_prefill_chunk. */
int sn_prefill_schedule(int n, int chunk, const int *bounds, int n_bounds, int *out);

/* ---- recurrent-state rewind (shared with speculative decoding) ----------
 *
 * The GatedDeltaNet conv + recurrent state of every layer, kept in backend
 * memory. Going back from position p to an earlier q needs only this: KV
 * rows below q are never rewritten by forwards from q on, and rows at and
 * above the position are never read. */
typedef struct sn_rewind sn_rewind;

sn_status sn_rewind_new(const sn_seq *seq, sn_rewind **out);
void sn_rewind_free(sn_rewind *r);
/* The sequence's own rewind buffers, made on the first call and kept until
 * sn_seq_free (nothing saved yet when handed out): a request with PLD then
 * allocates nothing per request (on CUDA each free would stall the device). */
sn_status sn_rewind_of(sn_seq *seq, sn_rewind **out);
/* Two ways back.
 * sn_rewind_save copies seq's recurrent state and remembers its position;
 * sn_rewind_restore can then go back to exactly that position, any number
 * of times.
 * sn_rewind_track copies nothing: the next forward (of at most rows tokens)
 * also records the recurrent state after each of its tokens but the last
 * (the backends' gdn history, backend.h), so sn_rewind_restore can go to
 * any position inside it, tracked + 1 .. its end: a prompt-lookup verify
 * pass keeps its accepted drafts without feeding them again. Restore ends
 * the tracking (call it with the current position to keep everything). */
sn_status sn_rewind_save(sn_rewind *r, const sn_seq *seq);
sn_status sn_rewind_track(sn_rewind *r, sn_seq *seq, int rows);
/* Makes the history buffers for tracked forwards of up to rows tokens now
 * (a backend allocation can stall the device or drop its graphs; better
 * before decoding than in the middle of it). */
sn_status sn_rewind_reserve(sn_rewind *r, const sn_seq *seq, int rows);
/* Puts seq back to position pos (see above). Without recurrent layers any
 * position from the saved one to the current one is a plain cut of the KV
 * cache. */
sn_status sn_rewind_restore(sn_rewind *r, sn_seq *seq, int pos);
int sn_rewind_pos(const sn_rewind *r);
/* True when the model has recurrent layers (rewinding copies state). */
int sn_rewind_has_state(const sn_rewind *r);

#endif
