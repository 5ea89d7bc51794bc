/* Sampling: penalties -> top-p -> temperature -> draw (see sample.h).
 *
 * The order matches mlx-lm (architecture.md §7.1): top-p is decided on the
 * untempered distribution, temperature only reshapes the draw among the
 * survivors. Everything is scratch owned by the sampler: nothing allocates
 * per token. */
#include "sanctum/sample.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

struct sn_sampler {
    sn_sample_params p;
    int vocab;
    sn_rng rng;
    int32_t window[SN_SAMPLE_MAX_WINDOW]; /* ring of recent ids */
    int win_n, win_head;
    int32_t *counts;    /* [vocab] scratch, all zero between calls */
    float *probs;       /* [vocab] untempered probabilities */
    int32_t *cand;      /* [vocab] candidate ids for top-p */
    int32_t *vwin;      /* [window + 64] a draw's window for the device rows */
    uint32_t *rscratch; /* [3 * vocab] the radix rank's keys and ids, made at first need */
    bool penalties;
    sn_logit_bias bias[SN_SAMPLE_MAX_BIAS];
    int n_bias;
};

/* ---- PRNG: splitmix64 to expand the seed, xoshiro256** to draw ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void sn_rng_seed(sn_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

sn_status sn_rng_seed_random(sn_rng *r)
{
    uint64_t seed;
    size_t got = 0;
    while (got < sizeof seed) {
        ssize_t k = getrandom((char *)&seed + got, sizeof seed - got, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return SN_FAIL(SN_E_IO, "getrandom failed: %s", strerror(errno));
        }
        got += (size_t)k;
    }
    sn_rng_seed(r, seed);
    return SN_OK;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sn_rng_next(sn_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double sn_rng_uniform(sn_rng *r) { return (double)(sn_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- params ---- */

void sn_sample_params_default(sn_sample_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 0.0f;
    p->repetition_window = 20;
}

sn_status sn_sample_params_check(const sn_sample_params *p)
{
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return SN_FAIL(SN_E_INVALID, "temperature must be in [0, 100], got %g", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return SN_FAIL(SN_E_INVALID, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->repetition_penalty >= 0.0f && p->repetition_penalty <= 100.0f))
        return SN_FAIL(SN_E_INVALID, "repetition_penalty must be in [0, 100], got %g", p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return SN_FAIL(SN_E_INVALID, "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return SN_FAIL(SN_E_INVALID, "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (p->repetition_window < 1 || p->repetition_window > SN_SAMPLE_MAX_WINDOW)
        return SN_FAIL(SN_E_INVALID, "repetition window must be in [1, %d], got %d",
                       SN_SAMPLE_MAX_WINDOW, p->repetition_window);
    if (p->n_bias < 0 || p->n_bias > SN_SAMPLE_MAX_BIAS || (p->n_bias > 0 && !p->bias))
        return SN_FAIL(SN_E_INVALID, "logit_bias must have at most %d entries, got %d", SN_SAMPLE_MAX_BIAS, p->n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias[i].id < 0)
            return SN_FAIL(SN_E_INVALID, "logit_bias: token id %d is negative", (int)p->bias[i].id);
        if (!(p->bias[i].bias >= -100.0f && p->bias[i].bias <= 100.0f))
            return SN_FAIL(SN_E_INVALID, "logit_bias: bias of token %d must be in [-100, 100], got %g",
                           (int)p->bias[i].id, p->bias[i].bias);
    }
    return SN_OK;
}

/* ---- sampler ---- */

sn_status sn_sampler_new(const sn_sample_params *p, int vocab, sn_sampler **out)
{
    *out = NULL;
    SN_TRY(sn_sample_params_check(p));
    if (vocab <= 0) return SN_FAIL(SN_E_INVALID, "sampler: vocab must be positive, got %d", vocab);
    sn_status st = SN_OK;
    sn_sampler *s = calloc(1, sizeof *s);
    if (!s) return SN_FAIL(SN_E_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->vocab = vocab;
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias[i].id >= vocab) {
            free(s);
            return SN_FAIL(SN_E_INVALID, "logit_bias: token id %d is outside the vocabulary (%d tokens)",
                           (int)p->bias[i].id, vocab);
        }
        s->bias[i] = p->bias[i];
    }
    s->n_bias = p->n_bias;
    s->p.bias = NULL;   /* the caller's array need not outlive us */
    s->penalties = (p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f) ||
                   p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->vwin = malloc((size_t)(p->repetition_window + 64) * sizeof *s->vwin);
    if (!s->counts || !s->probs || !s->cand || !s->vwin) {
        st = SN_FAIL(SN_E_NOMEM, "sampler: out of memory for vocab %d", vocab);
        goto out;
    }
    if (p->has_seed) sn_rng_seed(&s->rng, p->seed);
    else if ((st = sn_rng_seed_random(&s->rng)) != SN_OK) goto out;
    *out = s;
    return SN_OK;
out:
    sn_sampler_free(s);
    return st;
}

void sn_sampler_free(sn_sampler *s)
{
    if (!s) return;
    free(s->counts);
    free(s->probs);
    free(s->cand);
    free(s->vwin);
    free(s->rscratch);
    free(s);
}

bool sn_sampler_is_greedy(const sn_sampler *s)
{
    return s->p.temperature == 0.0f && !s->penalties && s->n_bias == 0;
}

void sn_sampler_accept(sn_sampler *s, int32_t id)
{
    int w = s->p.repetition_window;
    if (s->win_n < w) {
        s->window[(s->win_head + s->win_n) % w] = id;
        s->win_n++;
    } else {
        s->window[s->win_head] = id;
        s->win_head = (s->win_head + 1) % w;
    }
}

/* Sign-aware repetition penalty (a positive logit shrinks, a negative one
 * grows more negative) plus OpenAI presence/frequency, each applied once per
 * distinct token in the window. counts[] is left all zero again. */
static void apply_penalties(sn_sampler *s, float *logits)
{
    int w = s->p.repetition_window;
    for (int i = 0; i < s->win_n; i++) {
        int32_t id = s->window[(s->win_head + i) % w];
        if (id >= 0 && id < s->vocab) s->counts[id]++;
    }
    float rp = s->p.repetition_penalty;
    bool use_rp = rp != 0.0f && rp != 1.0f;
    for (int i = 0; i < s->win_n; i++) {
        int32_t id = s->window[(s->win_head + i) % w];
        if (id < 0 || id >= s->vocab || s->counts[id] == 0) continue;
        float l = logits[id];
        if (use_rp) l = l < 0.0f ? l * rp : l / rp;
        l -= s->p.presence_penalty;
        l -= s->p.frequency_penalty * (float)s->counts[id];
        logits[id] = l;
        s->counts[id] = 0;
    }
}

static int argmax(const float *x, int n)
{
    int best = -1;
    float bv = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (best < 0 || x[i] > bv) { bv = x[i]; best = i; }
    }
    return best;
}

/* Rank order for top-p: higher probability first, ties by lower id, so the
 * kept set and the draw are reproducible. */
static inline bool ranks_before(const float *pr, int32_t a, int32_t b)
{
    return pr[a] > pr[b] || (pr[a] == pr[b] && a < b);
}

static void sift_down(int32_t *h, int n, int i, const float *pr)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_before(pr, h[l], h[m])) m = l;
        if (r < n && ranks_before(pr, h[r], h[m])) m = r;
        if (m == i) return;
        int32_t t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

/* Moves the top-ranked tokens of cand[0,nc) to the front, in rank order,
 * until their mass reaches p (mlx-lm keeps a token when the mass strictly
 * above it is below p); returns how many. A heap costs O(nc + k log nc)
 * where a full sort costs O(nc log nc): with a peaked distribution k is a
 * handful while nc can be tens of thousands. */
static int top_p_select(int32_t *cand, int nc, const float *pr, float p)
{
    for (int i = nc / 2 - 1; i >= 0; i--) sift_down(cand, nc, i, pr);
    int n = nc, keep = 0;
    double above = 0.0;
    while (n > 0 && above < p) {
        int32_t top = cand[0];
        cand[0] = cand[n - 1];
        cand[n - 1] = top;      /* popped tokens collect at the tail, best last */
        n--;
        sift_down(cand, n, 0, pr);
        above += pr[top];
        keep++;
    }
    for (int i = 0; i < keep / 2; i++) {   /* tail -> rank order */
        int32_t t = cand[nc - 1 - i]; cand[nc - 1 - i] = cand[nc - keep + i]; cand[nc - keep + i] = t;
    }
    memmove(cand, cand + nc - keep, (size_t)keep * sizeof *cand);
    return keep;
}

/* top_p_select by a stable radix sort of the candidates on their
 * probability's bits, descending: the same tokens in the same rank order
 * (cand[] arrives in ascending id order, which the stable passes keep
 * among equal probabilities, as ranks_before orders them), so the same
 * sums in the same order. A flat distribution keeps most of the vocabulary,
 * and popping 136k of 151669 ids from the heap took ~25 ms a token
 * (bench_pld 1b sampled on the host, s14r3); the passes are O(nc). */
enum { TOP_P_RADIX_MIN = 4096 };

static int top_p_select_radix(int32_t *cand, int nc, const float *pr, float p, uint32_t *scratch)
{
    uint32_t *ks = scratch, *kd = scratch + nc;
    int32_t *is = cand, *id = (int32_t *)(scratch + 2 * (size_t)nc);
    for (int k = 0; k < nc; k++) {
        uint32_t u;
        memcpy(&u, &pr[cand[k]], sizeof u);
        ks[k] = ~u; /* positive floats order as their bits: ascending ~bits is descending p */
    }
    for (int shift = 0; shift < 32; shift += 11) {
        int cnt[2048] = { 0 };
        for (int k = 0; k < nc; k++) cnt[(ks[k] >> shift) & 2047u]++;
        bool one = false; /* every key has this digit: the pass moves nothing */
        for (int d = 0, run = 0; d < 2048; d++) {
            one |= cnt[d] == nc;
            int c = cnt[d];
            cnt[d] = run;
            run += c;
        }
        if (one) continue;
        for (int k = 0; k < nc; k++) {
            int at = cnt[(ks[k] >> shift) & 2047u]++;
            kd[at] = ks[k];
            id[at] = is[k];
        }
        uint32_t *tk = ks; ks = kd; kd = tk;
        int32_t *ti = is; is = id; id = ti;
    }
    if (is != cand) memcpy(cand, is, (size_t)nc * sizeof *cand);
    int keep = 0;
    double above = 0.0;
    while (keep < nc && above < p) above += pr[cand[keep++]];
    return keep;
}

/* The float exponent of a probability in (0, 1]: a bucket of one octave. */
static inline int octave(float q)
{
    uint32_t u;
    memcpy(&u, &q, sizeof u);
    return (int)((u >> 23) & 255u);
}

/* Drops the candidates top-p cuts for certain, before the heap: those in an
 * octave below which the octaves above hold p (plus a margin far above the
 * rounding of summing the same values in another order). They rank after
 * every kept token (a lower octave is a lower probability), and the
 * selection stops before them, so top_p_select keeps the same tokens in the
 * same order; its heap then holds a handful instead of thousands. */
static int top_p_prune(int32_t *cand, int nc, const float *pr, float p)
{
    double mass[256] = { 0 };
    for (int k = 0; k < nc; k++) mass[octave(pr[cand[k]])] += pr[cand[k]];
    const double need = (double)p + 1e-6;
    double above = 0.0;
    int cut = -1; /* octaves <= cut go */
    for (int b = 255; b >= 0; b--) {
        if (above >= need) { cut = b; break; }
        above += mass[b];
    }
    if (cut < 0) return nc;
    int m = 0;
    for (int k = 0; k < nc; k++)
        if (octave(pr[cand[k]]) > cut) cand[m++] = cand[k];
    return m;
}

sn_status sn_sampler_sample(sn_sampler *s, float *logits, int32_t *out_id)
{
    for (int i = 0; i < s->n_bias; i++) logits[s->bias[i].id] += s->bias[i].bias;
    if (s->penalties) apply_penalties(s, logits);
    if (s->p.temperature == 0.0f) {
        int id = argmax(logits, s->vocab);
        if (id < 0) return SN_FAIL(SN_E_RANGE, "sampler: every logit is NaN");
        *out_id = id;
        return SN_OK;
    }
    int n = s->vocab;
    int top = argmax(logits, n);
    if (top < 0) return SN_FAIL(SN_E_RANGE, "sampler: every logit is NaN");
    float mx = logits[top];
    if (isinf(mx)) { /* +inf dominates everything: the draw is decided */
        *out_id = top;
        return SN_OK;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        float e = isnan(logits[i]) ? 0.0f : expf(logits[i] - mx);
        s->probs[i] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);

    /* Candidates. With top-p, a token whose probability is below (1-p)/n is
     * always cut (all such tokens together weigh less than 1-p, so they sit
     * in the discarded ascending tail); skipping them before the sort keeps
     * the selection small without changing the result. A probability is
     * e * inv, formed where it is looked at (the same multiply, so the same
     * bits as normalising every entry first); only the candidates' are
     * stored, so without top-p probs keeps e, which T = 1 reuses below. */
    float p = s->p.top_p;
    int nc = 0;
    if (p < 1.0f) {
        float floor_p = (1.0f - p) / (float)n;
        for (int i = 0; i < n; i++) {
            float q = s->probs[i] * inv;
            if (q >= floor_p && q > 0.0f) {
                s->probs[i] = q;
                s->cand[nc++] = i;
            }
        }
        if (nc > 0) nc = top_p_prune(s->cand, nc, s->probs, p);
        if (nc >= TOP_P_RADIX_MIN && !s->rscratch) s->rscratch = malloc(3 * (size_t)s->vocab * sizeof *s->rscratch);
        if (nc >= TOP_P_RADIX_MIN && s->rscratch) nc = top_p_select_radix(s->cand, nc, s->probs, p, s->rscratch);
        else if (nc > 0) nc = top_p_select(s->cand, nc, s->probs, p); /* (or without the scratch: the heap) */
    } else {
        for (int i = 0; i < n; i++)
            if (s->probs[i] * inv > 0.0f) s->cand[nc++] = i;
    }
    if (nc == 0) { *out_id = top; return SN_OK; }

    /* Temperature: categorical(logprobs / T) over the survivors. Weights are
     * exp((l - mx) / T), so the max survivor weighs 1 and nothing overflows.
     * At T = 1 without top-p that is e itself ((l - mx) * 1 is l - mx): no
     * second exp over the vocabulary. */
    float invT = 1.0f / s->p.temperature;
    const bool reuse = invT == 1.0f && p >= 1.0f;
    double total = 0.0;
    for (int k = 0; k < nc; k++) {
        int i = s->cand[k];
        float w = reuse ? s->probs[i] : expf((logits[i] - mx) * invT);
        s->probs[i] = w;   /* probs is scratch now: reuse it for the weights */
        total += w;
    }
    if (!(total > 0.0)) { *out_id = top; return SN_OK; }
    double u = sn_rng_uniform(&s->rng) * total, acc = 0.0;
    int32_t pick = s->cand[nc - 1];
    for (int k = 0; k < nc; k++) {
        acc += s->probs[s->cand[k]];
        if (u < acc) { pick = s->cand[k]; break; }
    }
    *out_id = pick;
    return SN_OK;
}

/* ---- draws on the backend ---- */

int sn_sampler_edit_cap(const sn_sampler *s) { return s->n_bias + s->p.repetition_window; }
int sn_sampler_phase_cap(const sn_sampler *s) { return s->n_bias + 1; }

/* The edits of one draw: the logit bias in phases (the k-th entry of an id
 * in phase k, so a repeated id adds in list order), then one penalty per
 * distinct id of the window w[0..wn) with apply_penalties' operands.
 * Returns the phases used. */
static int device_edits(sn_sampler *s, const int32_t *w, int wn, sn_logit_edit *ed, int32_t *pe)
{
    int ne = 0, nph = 0, maxph = -1;
    for (int i = 0; i < s->n_bias; i++) {
        int ph = s->counts[s->bias[i].id]++;
        if (ph > maxph) maxph = ph;
    }
    for (int i = 0; i < s->n_bias; i++) s->counts[s->bias[i].id] = 0;
    for (int ph = 0; ph <= maxph; ph++) {
        for (int i = 0; i < s->n_bias; i++) {
            int32_t id = s->bias[i].id;
            if (s->counts[id]++ == ph) ed[ne++] = (sn_logit_edit){ id, SN_EDIT_ADD, s->bias[i].bias, 0.0f, 0.0f };
        }
        for (int i = 0; i < s->n_bias; i++) s->counts[s->bias[i].id] = 0;
        pe[nph++] = ne;
    }
    if (!s->penalties) return nph;
    for (int i = 0; i < wn; i++)
        if (w[i] >= 0 && w[i] < s->vocab) s->counts[w[i]]++;
    float rp = s->p.repetition_penalty;
    bool use_rp = rp != 0.0f && rp != 1.0f;
    int first = ne;
    for (int i = 0; i < wn; i++) {
        int32_t id = w[i];
        if (id < 0 || id >= s->vocab || s->counts[id] == 0) continue;
        ed[ne++] = (sn_logit_edit){ id, SN_EDIT_PENALTY, use_rp ? rp : 0.0f, s->p.presence_penalty,
                                    s->p.frequency_penalty * (float)s->counts[id] };
        s->counts[id] = 0;
    }
    if (ne > first) pe[nph++] = ne;
    return nph;
}

sn_status sn_sampler_device_rows(sn_sampler *s, const int32_t *extra, int n_rows, int row0, const int32_t *banned,
                                 int n_banned, sn_logit_edit *edits, int32_t *phase_end, sn_sample_row *rows)
{
    if (n_rows < 1 || n_rows > 64) return SN_FAIL(SN_E_INVALID, "sampler: %d device rows (1..64)", n_rows);
    if (n_rows > 1 && !extra) return SN_FAIL(SN_E_INVALID, "sampler: %d device rows without their tokens", n_rows);
    const int W = s->p.repetition_window, ecap = sn_sampler_edit_cap(s), pcap = sn_sampler_phase_cap(s);
    /* the window oldest first, then the extra tokens */
    for (int i = 0; i < s->win_n; i++) s->vwin[i] = s->window[(s->win_head + i) % W];
    for (int k = 0; k < n_rows - 1; k++) s->vwin[s->win_n + k] = extra[k];
    sn_rng r = s->rng;
    for (int k = 0; k < n_rows; k++) {
        int end = s->win_n + k, wn = end < W ? end : W;
        sn_sample_row *o = &rows[k];
        sn_logit_edit *ed = edits + (size_t)k * (size_t)ecap;
        int32_t *pe = phase_end + (size_t)k * (size_t)pcap;
        *o = (sn_sample_row){ .row = row0 + k, .temperature = s->p.temperature, .top_p = s->p.top_p,
                              .edits = ed, .phase_end = pe, .banned = banned, .n_banned = n_banned };
        o->n_phases = device_edits(s, s->vwin + end - wn, wn, ed, pe);
        o->u = s->p.temperature > 0.0f ? sn_rng_uniform(&r) : 0.0;
    }
    return SN_OK;
}

sn_status sn_sample_device_allowed(bool *allowed)
{
    const char *sd = getenv("SANCTUM_SAMPLE_DEVICE");
    *allowed = !(sd && !strcmp(sd, "0"));
    if (sd && strcmp(sd, "0") && strcmp(sd, "1"))
        return SN_FAIL(SN_E_INVALID, "SANCTUM_SAMPLE_DEVICE=%s: want 1 (default: draw on the backend where it can) or 0", sd);
    return SN_OK;
}

void sn_sampler_took_draw(sn_sampler *s)
{
    if (s->p.temperature > 0.0f) (void)sn_rng_uniform(&s->rng);
}
