/* Token sampling: the logits processors and the draw, in mlx-lm's order.
 *
 *   logit bias  ->  repetition / presence / frequency penalty over a bounded window of recent
 *   tokens  ->  top-p on the untempered distribution  ->  temperature  ->
 *   argmax (temperature 0) or a categorical draw from a seeded PRNG.
 *
 * A sampler owns all its scratch (allocated once in sn_sampler_new), so
 * sampling allocates nothing per token. The same params (same seed) and the
 * same logits give the same token sequence on every run. */
#ifndef SANCTUM_SAMPLE_H
#define SANCTUM_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "sanctum/backend.h"
#include "sanctum/status.h"

/* xoshiro256** state: small, fast, and good enough for a categorical draw. */
typedef struct { uint64_t s[4]; } sn_rng;

void sn_rng_seed(sn_rng *r, uint64_t seed);        /* splitmix64-expanded */
sn_status sn_rng_seed_random(sn_rng *r);            /* from getrandom(2) */
uint64_t sn_rng_next(sn_rng *r);
double sn_rng_uniform(sn_rng *r);                   /* [0, 1), 53 bits */

#define SN_SAMPLE_MAX_WINDOW 4096
#define SN_SAMPLE_MAX_BIAS 300      /* logit_bias entries (OpenAI's limit) */

typedef struct {
    int32_t id;
    float bias;                 /* added to the logit, in [-100, 100] */
} sn_logit_bias;

typedef struct {
    float temperature;          /* 0: greedy (argmax) */
    float top_p;                /* in (0, 1]; 1 disables */
    float repetition_penalty;   /* 0 or 1 disables; > 0 otherwise */
    float presence_penalty;     /* subtracted once per distinct token in the window */
    float frequency_penalty;    /* subtracted per occurrence in the window */
    int repetition_window;      /* tokens of history the penalties see (1..SN_SAMPLE_MAX_WINDOW) */
    bool has_seed;              /* false: seeded from the OS */
    uint64_t seed;
    const sn_logit_bias *bias;  /* applied first (as mlx-lm's logit_bias); copied by sn_sampler_new */
    int n_bias;
} sn_sample_params;

/* mlx-lm's defaults: greedy, no penalties, window 20, no bias. */
void sn_sample_params_default(sn_sample_params *p);
/* Checks ranges; SN_E_INVALID naming the field otherwise. */
sn_status sn_sample_params_check(const sn_sample_params *p);

typedef struct sn_sampler sn_sampler;

sn_status sn_sampler_new(const sn_sample_params *p, int vocab, sn_sampler **out);
void sn_sampler_free(sn_sampler *s);
/* Record a token in the penalty window (generated tokens, and the last
 * prompt token, as mlx-lm's history holds). */
void sn_sampler_accept(sn_sampler *s, int32_t id);
/* Picks the next token from logits[vocab]. logits is modified in place
 * (penalties applied). NaN logits are never picked; all-NaN -> SN_E_RANGE. */
sn_status sn_sampler_sample(sn_sampler *s, float *logits, int32_t *out_id);
/* True when sampling is plain argmax (temperature 0, no penalties). */
bool sn_sampler_is_greedy(const sn_sampler *s);

/* Draws on the backend (sn_backend_ops.sample) with this sampler's
 * processors. Room each row needs: sn_sampler_edit_cap edits and
 * sn_sampler_phase_cap phase ends. */
int sn_sampler_edit_cap(const sn_sampler *s);
int sn_sampler_phase_cap(const sn_sampler *s);
/* Fills rows[k] (k < n_rows; rows[k].row = row0 + k) for the next n_rows
 * draws as if extra[0..k) had been accepted before draw k (a verify pass:
 * row k follows draft k-1): the temperature and top_p, the logit bias and
 * the penalties of that window as edits (edits + k * edit_cap, phase_end +
 * k * phase_cap), the banned ids, and u = the (k+1)-th next uniform of the
 * RNG, which is not advanced: sn_sampler_took_draw advances it once per
 * draw used, so the stream is the host sampler's one draw per token.
 * (Where the host draws no u, a +inf logit or no survivor, the device
 * still counts one.) SN_E_INVALID for n_rows outside [1, 64]. */
sn_status sn_sampler_device_rows(sn_sampler *s, const int32_t *extra, int n_rows, int row0, const int32_t *banned,
                                 int n_banned, sn_logit_edit *edits, int32_t *phase_end, sn_sample_row *rows);
/* One device draw of sn_sampler_device_rows was used (its token emitted). */
void sn_sampler_took_draw(sn_sampler *s);
/* Whether a sampled generation may draw on the backend where it can
 * (sn_model_can_sample): SANCTUM_SAMPLE_DEVICE unset or 1 yes, 0 no (the
 * host sampler: the same distribution, the host's rounding and survivor
 * order); another value is SN_E_INVALID naming it. */
sn_status sn_sample_device_allowed(bool *allowed);

#endif
