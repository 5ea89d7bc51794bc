/* Byte-identity where the backend is not batch invariant (CUDA): the
 * engine's canonical prefill schedule and its PLD row cap
 * (prompt_cache.h). Shared by tests/test_cuda_pcache.c (every model on the
 * GPU, the backend's own invariant-row count) and tests/test_prompt_cache.c
 * (the CPU with SANCTUM_INVARIANT_ROWS=4, so the same engine path runs in
 * the CPU suite; there the CPU's invariance makes identity a given and the
 * checks that matter are the resume positions and the draft cap).
 *
 * Needs pcache_fixtures.h (models loaded on pf_backend) and FOR_MODELS/PM. */
#ifndef PCACHE_CANON_H
#define PCACHE_CANON_H

#include <limits.h>

#include "sanctum/chat.h"
#include "sanctum/pld.h"

#define CANON_CHUNK 64

/* Rows per forward that give the bits of one-row forwards, measured: from
 * one saved state, forwards of T = 1..8 rows against the same tokens fed
 * one by one. Also that a forward repeated on the same state repeats its
 * bits (everything below rests on that). The engine's claim
 * (sn_engine_invariant_rows, up to 8) must hold; the measured count is
 * printed for the backend's owner. */
static void canon_invariant_rows(void)
{
    FOR_MODELS {
        int V = PM->vocab, P = 100, claim = sn_engine_invariant_rows(PM->m);
        int32_t ids[120];
        pf_tokens(ids, 120, 901 + (uint64_t)mi, 0, V < 500 ? V : 500);
        float *one = malloc(sizeof(float) * 8 * (size_t)V), *many = malloc(sizeof(float) * 8 * (size_t)V);
        float *a = malloc(sizeof(float) * (size_t)P * V), *b = malloc(sizeof(float) * (size_t)P * V);
        sn_seq *s = NULL;
        sn_rewind *rw = NULL;
        CHECK_OK(sn_seq_new(PM->m, 256, &s));
        CHECK_OK(sn_rewind_new(s, &rw));
        /* determinism: the same 100-token forward twice */
        CHECK_OK(sn_forward(PM->m, s, ids, P, a, true));
        sn_seq_reset(s);
        CHECK_OK(sn_forward(PM->m, s, ids, P, b, true));
        CHECKF(!memcmp(a, b, sizeof(float) * (size_t)P * V), "%s: a forward repeated on the same state differs",
               PM->name);
        CHECK_OK(sn_rewind_save(rw, s));
        for (int t = 0; t < 8; t++) CHECK_OK(sn_forward(PM->m, s, ids + P + t, 1, one + (size_t)t * V, false));
        int measured = 0;
        for (int T = 1; T <= 8; T++) {
            CHECK_OK(sn_rewind_restore(rw, s, P));
            CHECK_OK(sn_forward(PM->m, s, ids + P, T, many, true));
            int bad = -1;
            for (int t = 0; t < T && bad < 0; t++)
                if (memcmp(one + (size_t)t * V, many + (size_t)t * V, sizeof(float) * (size_t)V)) bad = t;
            if (bad < 0 && measured == T - 1) measured = T;
            if (bad >= 0) {
                float worst = 0;
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < V; j++) {
                        float d = fabsf(one[(size_t)t * V + j] - many[(size_t)t * V + j]);
                        if (d > worst) worst = d;
                    }
                fprintf(stderr, "  %s: a forward of %d rows differs from one-row forwards at row %d (max |diff| %g)\n",
                        PM->name, T, bad, worst);
            }
            CHECKF(bad < 0 || T > claim, "%s: %d rows are claimed invariant but row %d of %d differs", PM->name,
                   claim > 8 ? 8 : claim, bad, T);
        }
        fprintf(stderr, "  %s: rows 1..%d give the bits of one-row forwards (engine counts %s%d)\n", PM->name, measured,
                claim == INT_MAX ? "all, checked to " : "", claim == INT_MAX ? 8 : claim);
        sn_rewind_free(rw);
        sn_seq_free(s);
        free(one);
        free(many);
        free(a);
        free(b);
    }
}

static void canon_params(sn_gen_params *p, sn_pcache *pc, int max_tokens)
{
    pf_params(p, max_tokens);
    p->pcache = pc;
    p->prefill_chunk = CANON_CHUNK;
}

/* Cold (no cache), a miss and hits: a repeat, a prefix ending inside what
 * was cached, two continuations of one prefix, a follow-up turn, seeded
 * sampling. Resume points are those of the canonical schedule (forwards of
 * 64 tokens from 0, checkpoints every 64 up to 256 then at 384, 512, ...). */
static void canon_cold_warm(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        bool rec = PM->recurrent;
        int32_t P[400], A[480], B[480];
        pf_tokens(P, 400, 941 + (uint64_t)mi, 0, V);
        memcpy(A, P, 300 * sizeof(int32_t));
        memcpy(B, P, 300 * sizeof(int32_t));
        pf_tokens(A + 300, 180, 951 + (uint64_t)mi, 0, V);
        pf_tokens(B + 300, 180, 961 + (uint64_t)mi, 0, V);
        A[300] = (P[300] + 1) % V;   /* the common prefixes are exactly 300 */
        B[300] = (P[300] + 2) % V;
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 64;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        sn_gen_params pcold, pwarm;
        canon_params(&pcold, NULL, 24);
        canon_params(&pwarm, pc, 24);
        pf_out c = { 0 }, w = { 0 }, ca = { 0 }, cb = { 0 };

        pf_gen(PM->m, 1024, P, 400, &pcold, &c);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: cache miss differs from the cache off", PM->name);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: repeat differs from cold", PM->name);
        CHECKF(w.res.cached_tokens == 384, "%s: repeat resumed at %d (expected 384)", PM->name, w.res.cached_tokens);

        pf_gen(PM->m, 1024, P, 231, &pcold, &c);
        pf_gen(PM->m, 1024, P, 231, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: prefix ending inside the cached prompt differs", PM->name);
        CHECKF(w.res.cached_tokens == 192, "%s: inside resumed at %d (expected 192)", PM->name, w.res.cached_tokens);

        pf_gen(PM->m, 1024, A, 480, &pcold, &ca);
        pf_gen(PM->m, 1024, B, 480, &pcold, &cb);
        pf_gen(PM->m, 1024, A, 480, &pwarm, &w);
        CHECKF(pf_same(&ca, &w), "%s: continuation A differs", PM->name);
        CHECKF(w.res.cached_tokens == 256, "%s: A resumed at %d (expected 256)", PM->name, w.res.cached_tokens);
        pf_gen(PM->m, 1024, B, 480, &pwarm, &w);
        CHECKF(pf_same(&cb, &w), "%s: continuation B differs", PM->name);
        CHECKF(w.res.cached_tokens == 256, "%s: B resumed at %d (expected 256)", PM->name, w.res.cached_tokens);
        pf_gen(PM->m, 1024, A, 480, &pwarm, &w);
        CHECKF(pf_same(&ca, &w), "%s: continuation A again differs", PM->name);
        CHECKF(w.res.cached_tokens == (rec ? 384 : 448), "%s: A again resumed at %d", PM->name, w.res.cached_tokens);

        /* follow-up turn: A + its output + more; the generated rows are
         * never reused (they came from decode steps), the prompt's are */
        int32_t F[600];
        memcpy(F, A, 480 * sizeof(int32_t));
        int ng = 0;
        for (int i = 0; i + 1 < ca.n_ids && ng < 20; i++) F[480 + ng++] = ca.ids[i];
        pf_tokens(F + 480 + ng, 40, 971, 0, V);
        int nF = 480 + ng + 40;
        pf_gen(PM->m, 1024, F, nF, &pcold, &c);
        pf_gen(PM->m, 1024, F, nF, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: follow-up turn differs", PM->name);
        CHECKF(w.res.cached_tokens == (rec ? 384 : 448), "%s: follow-up resumed at %d", PM->name, w.res.cached_tokens);

        pcold.sample.temperature = pwarm.sample.temperature = 0.9f;
        pcold.sample.has_seed = pwarm.sample.has_seed = true;
        pcold.sample.seed = pwarm.sample.seed = 4321;
        pf_gen(PM->m, 1024, P, 400, &pcold, &c);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: seeded warm differs", PM->name);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: seeded warm twice differs", PM->name);
        pf_out_free(&c);
        pf_out_free(&w);
        pf_out_free(&ca);
        pf_out_free(&cb);
        sn_pcache_free(pc);
    }
}

/* PLD on or off, greedy and seeded (with penalties), alone and with the
 * cache; drafts are made (when more than one row is invariant) and each
 * verify stays within the invariant rows. */
static void canon_pld(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500, inv = sn_engine_invariant_rows(PM->m);
        int32_t P[300], block[120];
        pf_tokens(block, 120, 981 + (uint64_t)mi, 0, V);
        memcpy(P, block, sizeof block);
        memcpy(P + 120, block, sizeof block);
        P[180] = (P[180] + 1) % V;
        memcpy(P + 240, block, 30 * sizeof(int32_t));
        int n = 270;
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 64;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        for (int variant = 0; variant < 3; variant++) {
            sn_gen_params off, on;
            canon_params(&off, NULL, 48);
            canon_params(&on, NULL, 48);
            on.pld = true;
            on.pld_opts = (sn_pld_opts){ .max_lookup = 7, .ngram = 3, .adaptive = false };
            sn_sample_params *sp[2] = { &off.sample, &on.sample };
            for (int k = 0; k < 2 && variant; k++) {
                sp[k]->temperature = 0.8f;
                sp[k]->top_p = 0.9f;
                sp[k]->has_seed = true;
                sp[k]->seed = 77 + (uint64_t)mi;
                if (variant == 2) {
                    sp[k]->repetition_penalty = 1.2f;
                    sp[k]->repetition_window = 16;
                }
            }
            pf_out a = { 0 }, b = { 0 }, c = { 0 };
            pf_gen(PM->m, 1024, P, n, &off, &a);
            pf_gen(PM->m, 1024, P, n, &on, &b);
            CHECKF(pf_same(&a, &b), "%s: variant %d: PLD changed the output", PM->name, variant);
            if (variant == 0) {
                fprintf(stderr, "  %s: %d tokens, %d drafted, %d accepted, %d forwards (off: %d)\n", PM->name,
                        b.res.completion_tokens, b.res.pld_drafted, b.res.pld_accepted, b.res.forward_calls,
                        a.res.forward_calls);
                CHECKF(inv < 2 || b.res.pld_drafted > 0, "%s: nothing drafted", PM->name);
                CHECKF(inv >= 2 || b.res.pld_drafted == 0, "%s: drafted with one invariant row", PM->name);
                /* each verify feeds at most inv rows: at most inv - 1 drafts per forward */
                if (inv != INT_MAX)
                    CHECKF(b.res.pld_drafted <= (inv - 1) * b.res.forward_calls, "%s: %d drafts in %d forwards",
                           PM->name, b.res.pld_drafted, b.res.forward_calls);
            }
            /* with the cache, twice (miss, then hit on the PLD run's entry) */
            on.pcache = pc;
            pf_gen(PM->m, 1024, P, n, &on, &c);
            CHECKF(pf_same(&a, &c), "%s: variant %d: PLD + cache (miss) differs", PM->name, variant);
            pf_gen(PM->m, 1024, P, n, &on, &c);
            CHECKF(pf_same(&a, &c), "%s: variant %d: PLD + cache (hit) differs", PM->name, variant);
            CHECK(c.res.cached_tokens == 256);
            pf_out_free(&a);
            pf_out_free(&b);
            pf_out_free(&c);
        }
        sn_pcache_free(pc);
    }
}

static int canon_chat(const sn_tokenizer *t, const char *user, const char *a1, const char *u2, int32_t *out, int cap,
                      int *bounds, int *nb)
{
    sn_chat_msg m[4];
    memset(m, 0, sizeof m);
    m[0].role = "system";
    m[0].content = "You are a concise assistant. Answer with only what is asked, in lower case, and never add a "
                   "greeting or an explanation to the answer you give.";
    m[1].role = "user";
    m[1].content = user;
    int n = 2;
    if (a1) {
        m[2].role = "assistant";
        m[2].content = a1;
        m[3].role = "user";
        m[3].content = u2;
        n = 4;
    }
    sn_chat_opts co = { .add_generation_prompt = true };
    sn_ids ids = { 0 };
    sn_chat_format f;
    if (sn_chat_format_for("qwen3_5", &f) != SN_OK || sn_chat_encode(t, f, m, (size_t)n, &co, &ids) != SN_OK ||
        (int)ids.n > cap) {
        sn_ids_free(&ids);
        return -1;
    }
    int32_t start = sn_tok_find(t, "<|im_start|>");
    *nb = 0;
    for (size_t i = 1; i < ids.n; i++)
        if (ids.ids[i] == start && *nb < 16) bounds[(*nb)++] = (int)i;
    memcpy(out, ids.ids, ids.n * sizeof(int32_t));
    int len = (int)ids.n;
    sn_ids_free(&ids);
    return len;
}

/* The default model with its chat template and message bounds (as the
 * server passes them): a cached conversation, one whose prefix with it
 * ends inside the user message (resumes where the system prompt ends, a
 * forward boundary of both), the second turn, and PLD on the copy task. */
static void canon_chat_default(void)
{
    pf_model *pm = NULL;
    for (int i = 0; i < pf_n; i++)
        if (!strcmp(pf_models[i].name, "default")) pm = &pf_models[i];
    if (!pm) SKIP("models/default not present");
    sn_tokenizer *t = NULL;
    CHECK_OK(sn_tok_load("models/default", "qwen3_5", &t));
    if (!t) return;
    int32_t A[512], B[512], C[512];
    int ba[16], bb[16], bc[16], na, nb, nc;
    int la = canon_chat(t, "Repeat exactly: apple banana cherry grape lemon mango melon orange peach pear plum berry "
                           "red green blue yellow black white", NULL, NULL, A, 512, ba, &na);
    int lb = canon_chat(t, "Repeat exactly: apple banana cherry grape lemon mango melon orange dog cat bird fish", NULL,
                        NULL, B, 512, bb, &nb);
    CHECK(la > 0 && lb > 0 && na >= 2 && nb >= 2);
    if (la <= 0 || lb <= 0 || na < 2 || nb < 2) goto out;
    sn_pcache_opts o;
    sn_pcache_opts_default(&o);
    o.ckpt_every = 16;
    sn_pcache *pc = NULL;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    sn_gen_params pcold, pwarm;
    pf_out c = { 0 }, w = { 0 }, a = { 0 };
    for (int pld = 0; pld < 2; pld++) {
        canon_params(&pcold, NULL, 24);
        canon_params(&pwarm, pc, 24);
        pcold.prefill_chunk = pwarm.prefill_chunk = 512;   /* the server's chunk */
        pwarm.pld = pld;
        pwarm.pld_opts = (sn_pld_opts){ .max_lookup = 5, .ngram = 3, .adaptive = false };
        sn_pcache_clear(pc);
        pcold.msg_bounds = pwarm.msg_bounds = ba;
        pcold.n_msg_bounds = pwarm.n_msg_bounds = na;
        pf_gen(pm->m, 1024, A, la, &pwarm, &a);
        pf_gen(pm->m, 1024, A, la, &pcold, &c);
        CHECKF(pf_same(&a, &c), "pld %d: first conversation differs", pld);
        pcold.msg_bounds = pwarm.msg_bounds = bb;
        pcold.n_msg_bounds = pwarm.n_msg_bounds = nb;
        pf_gen(pm->m, 1024, B, lb, &pcold, &c);
        pf_gen(pm->m, 1024, B, lb, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "pld %d: prefix ending inside a user message: warm differs", pld);
        CHECKF(w.res.cached_tokens == bb[0], "pld %d: resumed at %d, the system prompt ends at %d", pld,
               w.res.cached_tokens, bb[0]);
        char *ans = a.text ? a.text : "";
        int lc = canon_chat(t, "Repeat exactly: apple banana cherry grape lemon mango melon orange peach pear plum "
                               "berry red green blue yellow black white", ans, "Now in uppercase.", C, 512, bc, &nc);
        CHECK(lc > la);
        if (lc > la) {
            pcold.msg_bounds = pwarm.msg_bounds = bc;
            pcold.n_msg_bounds = pwarm.n_msg_bounds = nc;
            pf_gen(pm->m, 1024, C, lc, &pcold, &c);
            pf_gen(pm->m, 1024, C, lc, &pwarm, &w);
            CHECKF(pf_same(&c, &w), "pld %d: second turn: warm differs", pld);
            CHECKF(w.res.cached_tokens >= bb[0], "pld %d: second turn resumed at %d", pld, w.res.cached_tokens);
            fprintf(stderr, "  default model, pld %d: second turn %d tokens resumed at %d; %d drafted, %d accepted\n",
                    pld, lc, w.res.cached_tokens, w.res.pld_drafted, w.res.pld_accepted);
        }
    }
    pf_out_free(&a);
    pf_out_free(&c);
    pf_out_free(&w);
    sn_pcache_free(pc);
out:
    sn_tok_free(t);
}

#endif
