/* Prompt lookup decoding: drafting, the environment knobs, the controller,
 * and generations byte-identical with PLD on or off on every architecture
 * (greedy, seeded sampling, penalties, stop strings, max_tokens and context
 * limits, with the prompt cache), while drafts really are made, accepted and
 * rejected (so both rollback paths run); the same with the draws made by a
 * backend's sample op (sample_ref.h's, installed on the CPU backends), whose
 * ids at temperature 0 with penalties are the host sampler's. Models:
 * pcache_fixtures.h. */
#include "models/model_impl.h"
#include "pcache_fixtures.h"
#include "sample_ref.h"
#include "sanctum/pld.h"
#include "step_ref.h"

#define FOR_MODELS for (int mi = 0; mi < pf_n; mi++)
#define PM (&pf_models[mi])

static void test_draft(void)
{
    int32_t out[8];
    int mn;
    /* latest occurrence of the 3-gram 1 2 3 wins: followed by 7 8 */
    int32_t h1[] = { 1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3 };
    int k = sn_pld_draft(h1, 14, 3, 5, out, &mn);
    CHECK(k == 5 && mn == 3 && out[0] == 7 && out[1] == 8 && out[2] == 9 && out[3] == 1 && out[4] == 2);
    /* max bounds the draft */
    k = sn_pld_draft(h1, 14, 3, 2, out, &mn);
    CHECK(k == 2 && out[0] == 7 && out[1] == 8);
    /* cascade: no earlier 3-gram "9 5 6" nor "5 6", but "6" occurred */
    int32_t h2[] = { 6, 40, 41, 9, 5, 6 };
    k = sn_pld_draft(h2, 6, 3, 4, out, &mn);
    CHECK(k == 4 && mn == 1 && out[0] == 40 && out[1] == 41 && out[2] == 9 && out[3] == 5);
    /* nothing matches */
    int32_t h3[] = { 1, 2, 3, 4 };
    CHECK(sn_pld_draft(h3, 4, 3, 5, out, &mn) == 0 && mn == 0);
    /* a run overlapping its own suffix: a a a a -> a */
    int32_t h4[] = { 5, 5, 5, 5 };
    k = sn_pld_draft(h4, 4, 3, 5, out, &mn);
    CHECK(k == 1 && mn == 3 && out[0] == 5);
    /* too short, zero max */
    CHECK(sn_pld_draft(h4, 1, 3, 5, out, &mn) == 0);
    CHECK(sn_pld_draft(h1, 14, 3, 0, out, &mn) == 0);
    /* ngram 1 only */
    k = sn_pld_draft(h1, 14, 1, 1, out, &mn);
    CHECK(k == 1 && mn == 1 && out[0] == 7);
}

static void test_env(void)
{
    sn_pld_opts o;
    unsetenv("SANCTUM_MLX_PLD_MAX_LOOKUP");
    unsetenv("SANCTUM_MLX_PLD_NGRAM_SIZE");
    CHECK_OK(sn_pld_opts_from_env(&o));
    CHECK(o.max_lookup == 5 && o.ngram == 3 && o.adaptive);
    setenv("SANCTUM_MLX_PLD_MAX_LOOKUP", "8", 1);
    setenv("SANCTUM_MLX_PLD_NGRAM_SIZE", "2", 1);
    CHECK_OK(sn_pld_opts_from_env(&o));
    CHECK(o.max_lookup == 8 && o.ngram == 2);
    setenv("SANCTUM_MLX_PLD_MAX_LOOKUP", "5x", 1);
    CHECK(sn_pld_opts_from_env(&o) == SN_E_INVALID && strstr(sn_errmsg(), "SANCTUM_MLX_PLD_MAX_LOOKUP"));
    setenv("SANCTUM_MLX_PLD_MAX_LOOKUP", "0", 1);
    CHECK(sn_pld_opts_from_env(&o) == SN_E_INVALID);
    setenv("SANCTUM_MLX_PLD_MAX_LOOKUP", "5", 1);
    setenv("SANCTUM_MLX_PLD_NGRAM_SIZE", "99", 1);
    CHECK(sn_pld_opts_from_env(&o) == SN_E_INVALID && strstr(sn_errmsg(), "SANCTUM_MLX_PLD_NGRAM_SIZE"));
    unsetenv("SANCTUM_MLX_PLD_MAX_LOOKUP");
    unsetenv("SANCTUM_MLX_PLD_NGRAM_SIZE");
    o = (sn_pld_opts){ .max_lookup = 33, .ngram = 3 };
    CHECK(sn_pld_opts_check(&o) == SN_E_INVALID);
}

static void test_controller(void)
{
    sn_pld_ctl c;
    sn_pld_ctl_init(&c, true);
    /* nothing measured yet: no draft */
    CHECK(sn_pld_ctl_choose(&c, 3, 5) == 0);
    /* GPU-like: extra rows nearly free, long matches accepted -> draft all */
    for (int i = 0; i < 10; i++) sn_pld_ctl_observe(&c, 1, 0.010, 0, 0, 0);
    for (int i = 0; i < 10; i++) sn_pld_ctl_observe(&c, 6, 0.0105, 3, 5, 5);
    CHECK(sn_pld_ctl_choose(&c, 3, 5) == 5);
    /* CPU-like: each extra row costs a full row and nothing is accepted ->
     * no draft, except a periodic one-token probe */
    sn_pld_ctl_init(&c, true);
    for (int i = 0; i < 10; i++) sn_pld_ctl_observe(&c, 1, 0.010, 0, 0, 0);
    for (int i = 0; i < 20; i++) sn_pld_ctl_observe(&c, 2, 0.020, 1, 1, 0);
    int drafted = 0;
    for (int i = 0; i < 48; i++) drafted += sn_pld_ctl_choose(&c, 1, 5);
    CHECK(drafted == 2);
    /* graph backend: the first forward of each row count also captures its
     * graph (50x a step here); that sample must not stop drafting */
    sn_pld_ctl_init(&c, true);
    sn_pld_ctl_observe(&c, 1, 0.500, 0, 0, 0);
    for (int i = 0; i < 10; i++) sn_pld_ctl_observe(&c, 1, 0.010, 0, 0, 0);
    sn_pld_ctl_observe(&c, 6, 0.500, 3, 5, 5);
    for (int i = 0; i < 10; i++) sn_pld_ctl_observe(&c, 6, 0.0105, 3, 5, 5);
    sn_pld_ctl_observe(&c, 6, 0.400, 3, 5, 5); /* a re-capture later */
    CHECKF(sn_pld_ctl_choose(&c, 3, 5) == 5, "row1 %.4f extra %.4f", c.row1_s, c.extra_s);
    /* not adaptive: always everything available */
    sn_pld_ctl_init(&c, false);
    CHECK(sn_pld_ctl_choose(&c, 1, 4) == 4 && sn_pld_ctl_choose(&c, 0, 4) == 0);
}

/* A prompt that invites copying: a random block, then the block again with
 * one change (the "rewrite with one change" task), then its start again. */
static int copy_prompt(int32_t *p, uint64_t seed, int V)
{
    int n = 0;
    int32_t block[120];
    pf_tokens(block, 120, seed, 0, V);
    memcpy(p + n, block, sizeof block);
    n += 120;
    memcpy(p + n, block, sizeof block);
    p[n + 60] = (p[n + 60] + 1) % V;
    n += 120;
    memcpy(p + n, block, 30 * sizeof(int32_t));
    return n + 30;
}

static void pld_params(sn_gen_params *p, int max_tokens, bool on, bool adaptive)
{
    pf_params(p, max_tokens);
    p->pld = on;
    p->pld_opts = (sn_pld_opts){ .max_lookup = 5, .ngram = 3, .adaptive = adaptive };
}

static void test_identical_greedy(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        int n = copy_prompt(P, 3 + (uint64_t)mi, V);
        sn_gen_params off, on;
        pld_params(&off, 64, false, false);
        pld_params(&on, 64, true, false);
        pf_out a = { 0 }, b = { 0 };
        pf_gen(PM->m, 1024, P, n, &off, &a);
        pf_gen(PM->m, 1024, P, n, &on, &b);
        CHECKF(pf_same(&a, &b), "%s: greedy output differs with PLD", PM->name);
        CHECKF(b.res.pld_drafted > 0, "%s: nothing drafted", PM->name);
        fprintf(stderr, "  %s: %d tokens, %d drafted, %d accepted, %d forwards (off: %d)\n", PM->name,
                b.res.completion_tokens, b.res.pld_drafted, b.res.pld_accepted, b.res.forward_calls,
                a.res.forward_calls);
        /* without PLD: one forward per token after the first */
        CHECK(a.res.pld_drafted == 0 && a.res.forward_calls == a.res.completion_tokens - 1);
        /* adaptive PLD: the same bytes too */
        pld_params(&on, 64, true, true);
        pf_gen(PM->m, 1024, P, n, &on, &b);
        CHECKF(pf_same(&a, &b), "%s: adaptive PLD differs", PM->name);
        pf_out_free(&a);
        pf_out_free(&b);
    }
}

/* Drafts made of the prompt's own text are accepted when the model copies;
 * a model that copies is forced here by a prompt of one repeated token
 * pattern, which random models continue. Both paths (all accepted, some
 * rejected) must have run over the whole suite. */
static void test_accept_and_reject_paths(void)
{
    int total_acc = 0, total_rej = 0;
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        for (int i = 0; i < 240; i++) P[i] = (int32_t)((i % 6) * 7 % V);
        for (int len = 60; len <= 240; len += 90) {
            sn_gen_params off, on;
            pld_params(&off, 40, false, false);
            pld_params(&on, 40, true, false);
            pf_out a = { 0 }, b = { 0 };
            pf_gen(PM->m, 1024, P, len, &off, &a);
            pf_gen(PM->m, 1024, P, len, &on, &b);
            CHECKF(pf_same(&a, &b), "%s: repeated-pattern prompt differs (len %d)", PM->name, len);
            total_acc += b.res.pld_accepted;
            total_rej += b.res.pld_drafted - b.res.pld_accepted;
            pf_out_free(&a);
            pf_out_free(&b);
        }
    }
    fprintf(stderr, "  accepted %d, rejected %d over all models\n", total_acc, total_rej);
    CHECK(total_acc > 0 && total_rej > 0);
}

static void test_identical_sampling(void)
{
    static const char *stops[] = { "e", "th" };
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        int n = copy_prompt(P, 13 + (uint64_t)mi, V);
        for (int variant = 0; variant < 4; variant++) {
            sn_gen_params off, on;
            pld_params(&off, 48, false, false);
            pld_params(&on, 48, true, false);
            sn_sample_params *sp[2] = { &off.sample, &on.sample };
            for (int k = 0; k < 2; k++) {
                if (variant >= 1) {
                    sp[k]->temperature = 0.8f;
                    sp[k]->top_p = 0.9f;
                    sp[k]->has_seed = true;
                    sp[k]->seed = 99 + (uint64_t)mi;
                }
                if (variant >= 2) {
                    sp[k]->repetition_penalty = 1.3f;
                    sp[k]->presence_penalty = 0.2f;
                    sp[k]->frequency_penalty = 0.1f;
                    sp[k]->repetition_window = 16;
                }
            }
            if (variant == 3) {
                off.stops = on.stops = stops;
                off.n_stops = on.n_stops = 2;
            }
            pf_out a = { 0 }, b = { 0 }, c = { 0 };
            pf_gen(PM->m, 1024, P, n, &off, &a);
            pf_gen(PM->m, 1024, P, n, &on, &b);
            pf_gen(PM->m, 1024, P, n, &on, &c);
            CHECKF(pf_same(&b, &c), "%s: variant %d: same seed, different bytes", PM->name, variant);
            CHECKF(pf_same(&a, &b), "%s: variant %d: PLD changed the output", PM->name, variant);
            pf_out_free(&a);
            pf_out_free(&b);
            pf_out_free(&c);
        }
    }
}

/* Limits cut a verify pass short: max_tokens 1..9 and a context that ends
 * a few tokens after the prompt give the same output as without PLD. */
/* Recording ahead (forward.c) on step_ref.h's step ops over the CPU
 * backend: generations with each decode step recorded while the one before
 * "runs" (parked, launched with the real token) are the ones recorded in
 * turn and the plain CPU backend's (greedy with and without PLD, sampled
 * with draws on the backend); parked records are really launched; a second
 * sequence between two steps, or a buffer freed, makes the next step record
 * anew with the same ids; drawn and greedy steps by turns never take each
 * other's parked record; and where a forward would read the host inside a
 * step (the MoE layer routed on the host), nothing is parked and nothing
 * changes. Fails if a stale or wrongly keyed record is launched, or if the
 * stand-in token is not replaced. */
static void test_record_ahead(void)
{
    FOR_MODELS {
        sn_backend *be = PM->m->be;
        const sn_backend_ops *orig = be->ops;
        sn_backend_ops with_draws = *orig;
        with_draws.sample = ref_sample_op;
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        int n = copy_prompt(P, 41 + (uint64_t)mi, V);
        for (int variant = 0; variant < 3; variant++) {
            /* 0 greedy, 1 greedy with PLD, 2 sampled with the draws on the backend */
            sn_gen_params gp;
            pld_params(&gp, 40, variant == 1, false);
            if (variant == 2) {
                gp.sample.temperature = 0.8f;
                gp.sample.top_p = 0.9f;
                gp.sample.has_seed = true;
                gp.sample.seed = 9;
            }
            const sn_backend_ops *base = variant == 2 ? &with_draws : orig;
            pf_out plain = { 0 }, turn = { 0 }, ahead = { 0 };
            be->ops = base;
            pf_gen(PM->m, 1024, P, n, &gp, &plain);
            be->ops = sr_install(base);
            setenv("SANCTUM_RECORD_AHEAD", "0", 1);
            long l0 = g_sr.n_launched;
            pf_gen(PM->m, 1024, P, n, &gp, &turn);
            CHECKF(g_sr.n_launched == l0, "%s: variant %d: parked steps launched with SANCTUM_RECORD_AHEAD=0",
                   PM->name, variant);
            unsetenv("SANCTUM_RECORD_AHEAD");
            pf_gen(PM->m, 1024, P, n, &gp, &ahead);
            long launched = g_sr.n_launched - l0;
            be->ops = orig;
            CHECKF(pf_same(&plain, &turn), "%s: variant %d: steps recorded in turn differ from the plain backend",
                   PM->name, variant);
            CHECKF(pf_same(&plain, &ahead), "%s: variant %d: steps recorded ahead differ from the plain backend",
                   PM->name, variant);
            /* without PLD every plain step after the first comes from the park (with PLD most steps
             * are verify passes, which are never parked: only the equality above is asked there) */
            if (variant != 1)
                CHECKF(launched >= ahead.res.completion_tokens - 3, "%s: variant %d: %ld parked steps launched for %d "
                       "tokens", PM->name, variant, launched, ahead.res.completion_tokens);
            pf_out_free(&plain);
            pf_out_free(&turn);
            pf_out_free(&ahead);
        }

        /* two sequences stepped by turns, then one with a buffer freed between steps */
        enum { STEPS = 12 };
        int32_t ref[STEPS], two[2][STEPS], churn[STEPS];
        for (int form = 0; form < 3; form++) {
            be->ops = form ? sr_install(orig) : orig;
            int ns = form == 1 ? 2 : 1;
            sn_seq *q[2] = { NULL, NULL };
            int32_t id[2];
            for (int k = 0; k < ns; k++) {
                CHECK_OK(sn_seq_new(PM->m, n + STEPS + 2, &q[k]));
                CHECK_OK(sn_forward_greedy(PM->m, q[k], P, n, &id[k]));
            }
            long l0 = g_sr.n_launched;
            for (int t = 0; t < STEPS; t++) {
                for (int k = 0; k < ns; k++) {
                    (form == 0 ? ref : form == 1 ? two[k] : churn)[t] = id[k];
                    int32_t in = id[k];
                    CHECK_OK(sn_forward_greedy(PM->m, q[k], &in, 1, &id[k]));
                }
                if (form == 2 && t == STEPS / 2) {
                    sn_seq *x = NULL;
                    CHECK_OK(sn_seq_new(PM->m, 8, &x));
                    sn_seq_free(x);
                }
            }
            if (form == 1)
                CHECKF(g_sr.n_launched == l0, "%s: a record parked for one sequence launched for the other", PM->name);
            if (form == 2)
                CHECKF(g_sr.n_launched - l0 >= STEPS - 3, "%s: %ld parked steps launched of %d", PM->name,
                       g_sr.n_launched - l0, STEPS);
            for (int k = 0; k < ns; k++) sn_seq_free(q[k]);
            be->ops = orig;
        }
        CHECKF(!memcmp(ref, two[0], sizeof ref) && !memcmp(ref, two[1], sizeof ref),
               "%s: two sequences by turns differ from one", PM->name);
        CHECKF(!memcmp(ref, churn, sizeof ref), "%s: a freed buffer between steps changed the ids", PM->name);

        /* drawn and greedy steps by turns on one sequence: a record parked for the one head must not
         * serve the other (the greedy step would read ids no argmax wrote) */
        int32_t alt[2][STEPS];
        for (int form = 0; form < 2; form++) {
            be->ops = sr_install(&with_draws);
            setenv("SANCTUM_RECORD_AHEAD", form ? "1" : "0", 1);
            sn_seq *q = NULL;
            CHECK_OK(sn_seq_new(PM->m, n + STEPS + 2, &q));
            int32_t id = -1;
            for (int t = 0; t < STEPS; t++) {
                int32_t in = id;
                sn_sample_row r = { .row = t ? 0 : n - 1, .temperature = 0.8f, .top_p = 0.95f,
                                    .u = fmod(0.137 + 0.618 * t, 1.0) };
                sn_batch_item bi = { .seq = q, .tokens = t ? &in : P, .n = t ? 1 : n, .next_id = &id };
                if (t % 2 == 0) {
                    bi.sample = &r;
                    bi.n_sample = 1;
                }
                CHECK_OK(sn_forward_batch(PM->m, &bi, 1));
                alt[form][t] = id;
            }
            sn_seq_free(q);
            unsetenv("SANCTUM_RECORD_AHEAD");
            be->ops = orig;
        }
        CHECKF(!memcmp(alt[0], alt[1], sizeof alt[0]), "%s: drawn and greedy by turns: ahead differs from in turn",
               PM->name);

        /* the MoE layer routed on the host (no moe op): a step recorded ahead would read the host, so
         * it is refused and nothing is parked; the ids stay the plain backend's */
        if (orig->moe) {
            sn_backend_ops no_moe = *orig;
            no_moe.moe = NULL;
            sn_gen_params gp;
            pld_params(&gp, 24, false, false);
            pf_out plain = { 0 }, ahead = { 0 };
            be->ops = &no_moe;
            pf_gen(PM->m, 1024, P, n, &gp, &plain);
            be->ops = sr_install(&no_moe);
            long p0 = g_sr.n_parked;
            pf_gen(PM->m, 1024, P, n, &gp, &ahead);
            be->ops = orig;
            CHECKF(pf_same(&plain, &ahead), "%s: host-routed MoE: ahead differs from the plain backend", PM->name);
            if (PM->m->cfg->arch == SN_ARCH_QWEN3_5_MOE)
                CHECKF(g_sr.n_parked == p0, "%s: host-routed MoE: %ld steps parked, want none", PM->name,
                       g_sr.n_parked - p0);
            pf_out_free(&plain);
            pf_out_free(&ahead);
        }
    }
}

static void test_limits(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        for (int i = 0; i < 200; i++) P[i] = (int32_t)((i % 5) * 11 % V);
        for (int mt = 1; mt <= 9; mt++) {
            sn_gen_params off, on;
            pld_params(&off, mt, false, false);
            pld_params(&on, mt, true, false);
            pf_out a = { 0 }, b = { 0 };
            pf_gen(PM->m, 1024, P, 200, &off, &a);
            pf_gen(PM->m, 1024, P, 200, &on, &b);
            CHECKF(pf_same(&a, &b), "%s: max_tokens %d differs", PM->name, mt);
            pf_out_free(&a);
            pf_out_free(&b);
        }
        for (int ctx = 201; ctx <= 209; ctx += 4) {
            sn_gen_params off, on;
            pld_params(&off, 100, false, false);
            pld_params(&on, 100, true, false);
            pf_out a = { 0 }, b = { 0 };
            pf_gen(PM->m, ctx, P, 200, &off, &a);
            pf_gen(PM->m, ctx, P, 200, &on, &b);
            CHECKF(pf_same(&a, &b), "%s: context %d differs", PM->name, ctx);
            CHECK(a.res.finish == SN_FINISH_LENGTH || a.res.finish == SN_FINISH_STOP);
            pf_out_free(&a);
            pf_out_free(&b);
        }
    }
}

/* PLD and the prompt cache together: the state left in the pool after a
 * PLD run (with rollbacks) serves the next request exactly. */
static void test_with_cache(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        int n = copy_prompt(P, 23 + (uint64_t)mi, V);
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 64;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        sn_gen_params off, on;
        pld_params(&off, 32, false, false);
        pld_params(&on, 32, true, false);
        on.pcache = pc;
        pf_out a = { 0 }, b = { 0 };
        pf_gen(PM->m, 1024, P, n, &off, &a);
        for (int k = 0; k < 2; k++) {
            pf_gen(PM->m, 1024, P, n, &on, &b);
            CHECKF(pf_same(&a, &b), "%s: PLD + cache run %d differs", PM->name, k);
        }
        CHECK(b.res.cached_tokens == (PM->recurrent ? (n - 1) / 64 * 64 : n - 1));
        /* follow-up: prompt + the generated text + more, from the PLD run's entry */
        int32_t F[400];
        memcpy(F, P, (size_t)n * sizeof(int32_t));
        int ng = 0;
        for (int i = 0; i + 1 < a.n_ids && ng < 16; i++) F[n + ng++] = a.ids[i];
        pf_tokens(F + n + ng, 20, 5, 0, V);
        int nF = n + ng + 20;
        pf_gen(PM->m, 1024, F, nF, &off, &a);
        pf_gen(PM->m, 1024, F, nF, &on, &b);
        CHECKF(pf_same(&a, &b), "%s: follow-up after a PLD run differs", PM->name);
        CHECKF(b.res.cached_tokens >= n, "%s: follow-up cached %d", PM->name, b.res.cached_tokens);
        pf_out_free(&a);
        pf_out_free(&b);
        sn_pcache_free(pc);
    }
}


/* The generation loop's device-draw path (sn_backend_ops.sample: the
 * backend draws from its own logits, PLD verify rows carry their drafts in
 * the window) on the CPU backends with sample_ref.h's op installed: PLD on
 * or off gives the same tokens (sampled, with penalties and logit bias),
 * the same seed the same tokens, and at temperature 0 with penalties the
 * host sampler's exact tokens (the edits are its arithmetic). Fails if the
 * rows' windows, their u or the forward's plumbing of draws drift. */
static int g_dev_draws;
static sn_status counting_sample(sn_backend *be, float *x, int rows, int n, const sn_sample_row *rr, int32_t *out)
{
    g_dev_draws += rows;
    return ref_sample_op(be, x, rows, n, rr, out);
}

static void test_device_draws(void)
{
    static const sn_logit_bias bias[2] = { { 33, 1.5f }, { 40, -2.0f } };
    FOR_MODELS {
        sn_backend *be = PM->m->be;
        const sn_backend_ops *orig = be->ops;
        sn_backend_ops with = *orig;
        with.sample = counting_sample;
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        int n = copy_prompt(P, 21 + (uint64_t)mi, V);
        for (int variant = 0; variant < 3; variant++) {
            sn_gen_params off, on;
            pld_params(&off, 40, false, false);
            pld_params(&on, 40, true, false);
            sn_sample_params *sp[2] = { &off.sample, &on.sample };
            for (int k = 0; k < 2; k++) {
                sp[k]->temperature = variant == 0 ? 0.0f : 0.8f;
                sp[k]->top_p = variant == 2 ? 0.9f : 1.0f;
                sp[k]->has_seed = true;
                sp[k]->seed = 5 + (uint64_t)mi;
                sp[k]->repetition_penalty = 1.3f;
                sp[k]->presence_penalty = 0.2f;
                sp[k]->frequency_penalty = 0.1f;
                sp[k]->repetition_window = 16;
                sp[k]->bias = bias;
                sp[k]->n_bias = 2;
            }
            pf_out host = { 0 }, a = { 0 }, b = { 0 }, c = { 0 };
            if (variant == 0) pf_gen(PM->m, 1024, P, n, &off, &host); /* the host sampler */
            be->ops = &with;
            g_dev_draws = 0;
            pf_gen(PM->m, 1024, P, n, &off, &a);
            int draws_off = g_dev_draws;
            pf_gen(PM->m, 1024, P, n, &on, &b);
            pf_gen(PM->m, 1024, P, n, &on, &c);
            be->ops = orig;
            CHECKF(a.st == SN_OK && b.st == SN_OK && draws_off == a.res.completion_tokens,
                   "%s: variant %d: %d device draws for %d tokens", PM->name, variant, draws_off, a.res.completion_tokens);
            CHECKF(pf_same(&b, &c), "%s: variant %d: same seed, different tokens", PM->name, variant);
            CHECKF(pf_same(&a, &b), "%s: variant %d: PLD changed the device-drawn output", PM->name, variant);
            if (variant == 0) CHECKF(pf_same(&host, &a), "%s: temperature 0 with penalties: device draws differ from the host sampler", PM->name);
            if (variant == 0) CHECKF(b.res.pld_drafted > 0, "%s: nothing drafted", PM->name);
            pf_out_free(&host);
            pf_out_free(&a);
            pf_out_free(&b);
            pf_out_free(&c);
        }
    }
}

int main(void)
{
    RUN(test_draft);
    RUN(test_env);
    RUN(test_controller);
    if (!pf_setup()) {
        fprintf(stderr, "setup failed\n");
        pf_teardown();
        t_failed++;
        return TEST_END();
    }
    for (int i = 0; i < pf_n; i++) fprintf(stderr, "model %s\n", pf_models[i].name);
    RUN(test_identical_greedy);
    RUN(test_accept_and_reject_paths);
    RUN(test_identical_sampling);
    RUN(test_device_draws);
    RUN(test_record_ahead);
    RUN(test_limits);
    RUN(test_with_cache);
    pf_teardown();
    return TEST_END();
}
