/* The generation loop shared by sanctum-mlx and sanctum-run.
 *
 * Prefill the prompt (in chunks), then sample / decode token by token until
 * an EOS id, a stop string, max_tokens, the end of the context, or the
 * caller cancels. Decoded text goes through the streaming detokenizer and the
 * stop-string matcher, and is handed to the callback every flush_tokens
 * tokens (and right after the first token, and once at the end), so a stop
 * string never leaks, the first token reaches a client at once, and a
 * disconnected client is noticed within one flush. */
#ifndef SANCTUM_GENERATE_H
#define SANCTUM_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/model.h"
#include "sanctum/pld.h"
#include "sanctum/prompt_cache.h"
#include "sanctum/sample.h"
#include "sanctum/status.h"
#include "sanctum/tokenizer.h"

typedef enum {
    SN_FINISH_STOP,       /* EOS id or stop string */
    SN_FINISH_LENGTH,     /* max_tokens or the context is full */
    SN_FINISH_CANCELLED,  /* the callback or the cancel hook asked to stop */
} sn_finish;

const char *sn_finish_name(sn_finish f);   /* "stop", "length", "cancelled" */

/* Text callback: the newly released text (may be empty at the final call),
 * and the number of completion tokens so far. Returning non-OK stops the
 * generation: SN_E_CANCELLED ends it as SN_FINISH_CANCELLED, anything else
 * is returned from sn_generate as an error. */
typedef sn_status (*sn_gen_text_cb)(void *ud, const char *text, size_t len, int n_tokens);

typedef struct {
    sn_sample_params sample;
    int max_tokens;                 /* >= 1 */
    const char *const *stops;       /* stop strings (may be NULL when n_stops is 0) */
    size_t n_stops;
    int flush_tokens;               /* callback cadence in tokens (>= 1) */
    int prefill_chunk;              /* tokens per prefill forward; <= 0: 512 */
    /* Optional: polled between prefill chunks and after every token; nonzero cancels. */
    int (*cancelled)(void *ud);
    void *ud;                       /* for cb and cancelled */
    /* Prompt cache (prompt_cache.h): when set and the sequence is at
     * position 0, the prompt resumes from the longest cached prefix and the
     * sequence is stored back at the end. NULL: no cache. */
    sn_pcache *pcache;
    const int *msg_bounds;          /* token positions of chat message boundaries (checkpoints); may be NULL */
    int n_msg_bounds;
    /* Prompt lookup decoding (pld.h): same tokens, fewer forward passes. */
    bool pld;
    sn_pld_opts pld_opts;           /* used when pld; all zero: defaults (5 lookups, 3-gram, adaptive) */
    /* Optional: a draft-length controller kept across calls, so its cost
     * and acceptance estimates carry over from request to request (one
     * caller thread at a time); NULL: a fresh one per call. */
    sn_pld_ctl *pld_ctl;
    /* Optional: every emitted token id (EOS included), for tests and logs. */
    void (*on_token)(void *ud, int32_t id);
} sn_gen_params;

typedef struct {
    int prompt_tokens;              /* prompt tokens consumed by this call, cached ones included */
    int cached_tokens;              /* of those, taken from the prompt cache instead of computed */
    int pld_drafted;                /* draft tokens verified */
    int pld_accepted;               /* of those, accepted */
    int forward_calls;              /* forward passes after the prefill */
    int completion_tokens;          /* tokens sampled (EOS included when it ended the run) */
    sn_finish finish;
    double prefill_s;               /* prefill wall time */
    double first_token_s;           /* start of call -> first token sampled; < 0 when none */
    double decode_s;                /* first token -> end */
} sn_gen_result;

/* Runs the prompt from the sequence's current position (the caller resets it
 * or restores a snapshot of a shared prefix). The prompt must fit the
 * context with room for one token: SN_E_RANGE otherwise. */
sn_status sn_generate(sn_model *m, const sn_tokenizer *tok, sn_seq *seq, const int32_t *prompt, int n_prompt,
                      const sn_gen_params *p, sn_gen_text_cb cb, sn_gen_result *res);

#endif
