/* Prompt lookup decoding: drafting and the draft-length controller (pld.h).
 * The verify / accept / rollback steps live in the generation loop, where
 * the sampler and the stop matcher are. */
#include "sanctum/pld.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static sn_status env_int(const char *name, int lo, int hi, int *v)
{
    const char *e = getenv(name);
    if (!e || !*e) return SN_OK;
    char *end;
    errno = 0;
    long x = strtol(e, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return SN_FAIL(SN_E_INVALID, "%s must be an integer in [%d, %d], got '%s'", name, lo, hi, e);
    *v = (int)x;
    return SN_OK;
}

sn_status sn_pld_opts_from_env(sn_pld_opts *o)
{
    o->max_lookup = 5;
    o->ngram = 3;
    o->adaptive = true;
    SN_TRY(env_int("SANCTUM_MLX_PLD_MAX_LOOKUP", 1, SN_PLD_MAX_LOOKUP, &o->max_lookup));
    SN_TRY(env_int("SANCTUM_MLX_PLD_NGRAM_SIZE", 1, SN_PLD_MAX_NGRAM, &o->ngram));
    int ad = 1;
    SN_TRY(env_int("SANCTUM_PLD_ADAPTIVE", 0, 1, &ad));
    o->adaptive = ad != 0;
    return SN_OK;
}

sn_status sn_pld_opts_check(const sn_pld_opts *o)
{
    if (o->max_lookup < 1 || o->max_lookup > SN_PLD_MAX_LOOKUP)
        return SN_FAIL(SN_E_INVALID, "pld: max_lookup must be in [1, %d], got %d", SN_PLD_MAX_LOOKUP, o->max_lookup);
    if (o->ngram < 1 || o->ngram > SN_PLD_MAX_NGRAM)
        return SN_FAIL(SN_E_INVALID, "pld: ngram must be in [1, %d], got %d", SN_PLD_MAX_NGRAM, o->ngram);
    return SN_OK;
}

int sn_pld_draft(const int32_t *hist, int n, int ngram, int max, int32_t *out, int *match_n)
{
    *match_n = 0;
    if (max < 1 || n < 2) return 0;
    for (int g = ngram < n - 1 ? ngram : n - 1; g >= 1; g--) {
        const int32_t *pat = hist + n - g;
        /* latest start i whose n-gram ends before the last token, so at
         * least one token follows it; overlapping the suffix is fine */
        for (int i = n - g - 1; i >= 0; i--) {
            if (hist[i] != pat[0] || memcmp(hist + i, pat, (size_t)g * sizeof *pat) != 0) continue;
            int from = i + g, k = n - from < max ? n - from : max;
            memcpy(out, hist + from, (size_t)k * sizeof *out);
            *match_n = g;
            return k;
        }
    }
    return 0;
}

/* Priors before anything is measured: a long match is usually a copy. */
static const double acc_prior[SN_PLD_MAX_NGRAM + 1] = { 0, 0.3, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7 };
#define EMA 0.2
#define PROBE_EVERY 24

void sn_pld_ctl_init(sn_pld_ctl *c, bool adaptive)
{
    memset(c, 0, sizeof *c);
    c->extra_s = -1;
    c->adaptive = adaptive;
    memcpy(c->acc, acc_prior, sizeof c->acc);
}

static double cost(const sn_pld_ctl *c, int rows)
{
    /* unknown extra-row cost: assume a quarter of a row until measured */
    double extra = c->extra_s >= 0 ? c->extra_s : 0.25 * c->row1_s;
    return c->row1_s + extra * (rows - 1);
}

int sn_pld_ctl_choose(sn_pld_ctl *c, int match_n, int avail)
{
    if (avail <= 0 || match_n <= 0) return 0;
    if (!c->adaptive) return avail;
    if (c->row1_s <= 0) return 0;  /* measure a plain step first */
    double a = c->acc[match_n < SN_PLD_MAX_NGRAM ? match_n : SN_PLD_MAX_NGRAM];
    /* expected emitted tokens with d drafts: 1 + a + a^2 + ... + a^d */
    double best_rate = 1.0 / cost(c, 1), e = 1, ai = 1;
    int best = 0;
    for (int d = 1; d <= avail; d++) {
        ai *= a;
        e += ai;
        double r = e / cost(c, 1 + d);
        if (r > best_rate * 1.02) {
            best_rate = r;
            best = d;
        }
    }
    if (best == 0 && ++c->idle >= PROBE_EVERY) {
        /* a one-token probe keeps the acceptance estimate from freezing */
        c->idle = 0;
        return 1;
    }
    if (best) c->idle = 0;
    return best;
}

void sn_pld_ctl_observe(sn_pld_ctl *c, int rows, double seconds, int match_n, int drafted, int accepted)
{
    /* The first forward of each row count is not timed: on a graph backend
     * it includes capturing that step's graph (milliseconds), which would
     * make drafting look costly for the rest of the request. A later sample
     * far above the estimate (a re-capture) is skipped for the same reason. */
    bool timed = true;
    if (rows >= 1 && rows < 32 && !(c->seen_rows & (1u << rows))) {
        c->seen_rows |= 1u << rows;
        timed = false;
    } else if (c->row1_s > 0 && seconds > 4.0 * cost(c, rows)) {
        timed = false;
    }
    if (timed && rows == 1) {
        c->row1_s = c->row1_s > 0 ? (1 - EMA) * c->row1_s + EMA * seconds : seconds;
    } else if (timed && rows > 1 && c->row1_s > 0) {
        double x = (seconds - c->row1_s) / (rows - 1);
        if (x < 0) x = 0;
        c->extra_s = c->extra_s >= 0 ? (1 - EMA) * c->extra_s + EMA * x : x;
    }
    if (drafted > 0 && match_n > 0) {
        int k = match_n < SN_PLD_MAX_NGRAM ? match_n : SN_PLD_MAX_NGRAM;
        /* each accepted token is a success, the first rejection a failure;
         * tokens after it were never judged */
        int trials = accepted < drafted ? accepted + 1 : accepted;
        for (int i = 0; i < trials; i++) c->acc[k] = (1 - EMA) * c->acc[k] + EMA * (i < accepted ? 1.0 : 0.0);
    }
}
