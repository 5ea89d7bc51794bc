/* Prompt cache: batch invariance (the proof min_fresh = 1 rests on), the
 * rewind and restore paths at every layer kind, at chunk boundaries (63-65,
 * 511-513) and at
 * prompt lengths 1, 2, 63, 64, 65, and byte-identical generations with the
 * cache cold or warm (repeat, a prefix that ends inside a message, two
 * continuations of one prefix, prewarm, min_fresh 2), LRU eviction under
 * the byte budget, and concurrent use; the same with the pool in backend
 * buffers (the CUDA storage path, here on CPU buffers) and with backend
 * allocations failing (host fallback). Models: pcache_fixtures.h. */
#include <pthread.h>

#include "models/model_impl.h"
#include "pcache_fixtures.h"
#include "sanctum/chat.h"
#include "server/api.h"
#include "server/metrics.h"

#define FOR_MODELS for (int mi = 0; mi < pf_n; mi++)
#define PM (&pf_models[mi])

#include "pcache_canon.h"

/* prompt lengths around the GDN chunk (64) and the forward step (512) */
static const int lens[] = { 1, 2, 63, 64, 65, 130, 511, 512, 513, 600 };

/* Logits of a prefix as one run, as pieces (7 at a time, and cut at 64),
 * and token by token: bitwise equal on every model and every position. */
static void test_batch_invariance(void)
{
    FOR_MODELS {
        int V = PM->vocab, n = 600;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
        float *a = malloc(sizeof(float) * (size_t)n * (size_t)V), *b = malloc(sizeof(float) * (size_t)n * (size_t)V);
        pf_tokens(ids, n, 11 + (uint64_t)mi, 0, V);
        sn_seq *s = NULL;
        CHECK_OK(sn_seq_new(PM->m, 1024, &s));
        CHECK_OK(sn_forward(PM->m, s, ids, n, a, true));
        static const int pieces[] = { 1, 7, 64, 65 };
        for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
            /* token by token up to 130 (600 rows one at a time is slow), then
             * the rest in one piece: still every row compared */
            int step = pieces[k];
            sn_seq_reset(s);
            for (int i = 0; i < n;) {
                int t = step == 1 && i >= 130 ? n - i : (n - i < step ? n - i : step);
                CHECK_OK(sn_forward(PM->m, s, ids + i, t, b + (size_t)i * V, true));
                i += t;
            }
            int bad = -1;
            for (int i = 0; i < n && bad < 0; i++)
                if (memcmp(a + (size_t)i * V, b + (size_t)i * V, sizeof(float) * (size_t)V) != 0) bad = i;
            CHECKF(bad < 0, "%s: pieces of %d: row %d differs from the one-run logits", PM->name, step, bad);
        }
        sn_seq_free(s);
        free(ids);
        free(a);
        free(b);
    }
}

/* Rewind at every prompt length of interest: run L tokens, save, run 5
 * more, go back, run the same 5: the logits are bitwise those of the first
 * time. Without recurrent layers, also cut back to a middle position. */
static void test_rewind(void)
{
    FOR_MODELS {
        int V = PM->vocab;
        int32_t ids[700];
        pf_tokens(ids, 700, 23 + (uint64_t)mi, 0, V);
        float *a = malloc(sizeof(float) * 5 * (size_t)V), *b = malloc(sizeof(float) * 5 * (size_t)V);
        sn_seq *s = NULL;
        sn_rewind *rw = NULL;
        CHECK_OK(sn_seq_new(PM->m, 1024, &s));
        CHECK_OK(sn_rewind_new(s, &rw));
        CHECK(sn_rewind_has_state(rw) == (PM->recurrent ? 1 : 0));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int L = lens[li];
            sn_seq_reset(s);
            CHECK_OK(sn_forward(PM->m, s, ids, L, NULL, false));
            CHECK_OK(sn_rewind_save(rw, s));
            CHECK_OK(sn_forward(PM->m, s, ids + L, 5, a, true));
            CHECK(sn_seq_pos(s) == L + 5);
            /* dirty the state past the saved point with other tokens */
            CHECK_OK(sn_rewind_restore(rw, s, L));
            CHECK_OK(sn_forward(PM->m, s, ids + 100, 3, NULL, false));
            CHECK_OK(sn_rewind_restore(rw, s, L));
            CHECK(sn_seq_pos(s) == L);
            CHECK_OK(sn_forward(PM->m, s, ids + L, 5, b, true));
            CHECKF(!memcmp(a, b, sizeof(float) * 5 * (size_t)V), "%s: rewind at %d changed the logits", PM->name, L);
            if (!PM->recurrent) {
                /* KV-only: cut at L + 2 and run tokens 2..4 again */
                CHECK_OK(sn_rewind_restore(rw, s, L + 2));
                CHECK_OK(sn_forward(PM->m, s, ids + L + 2, 3, b, true));
                CHECKF(!memcmp(a + 2 * (size_t)V, b, sizeof(float) * 3 * (size_t)V), "%s: KV cut at %d", PM->name, L + 2);
            } else {
                sn_status st = sn_rewind_restore(rw, s, L + 1);
                CHECK(st == SN_E_INVALID);   /* no state there */
            }
        }
        /* a position beyond the sequence is refused */
        CHECK(sn_rewind_restore(rw, s, sn_seq_pos(s) + 1) == SN_E_INVALID);
        sn_rewind_free(rw);
        sn_seq_free(s);
        free(a);
        free(b);
    }
}

/* Tracked rewind (what PLD verification uses): at every prompt length,
 * track, run 6 tokens, go back to each position inside them from the
 * state the pass recorded, and run the rest again: bitwise the same
 * logits. Going back before the pass, a second restore, and a restore
 * with no forward since the tracking are refused. */
static void test_rewind_tracked(void)
{
    FOR_MODELS {
        int V = PM->vocab;
        int32_t ids[700];
        pf_tokens(ids, 700, 41 + (uint64_t)mi, 0, V);
        float *a = malloc(sizeof(float) * 6 * (size_t)V), *b = malloc(sizeof(float) * 6 * (size_t)V);
        sn_seq *s = NULL;
        sn_rewind *rw = NULL;
        CHECK_OK(sn_seq_new(PM->m, 1024, &s));
        CHECK_OK(sn_rewind_new(s, &rw));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int L = lens[li];
            for (int keep = 1; keep <= 6; keep++) {
                sn_seq_reset(s);
                CHECK_OK(sn_forward(PM->m, s, ids, L, NULL, false));
                CHECK_OK(sn_rewind_track(rw, s, 6));
                CHECK_OK(sn_forward(PM->m, s, ids + L, 6, a, true));
                CHECK_OK(sn_rewind_restore(rw, s, L + keep));
                CHECK(sn_seq_pos(s) == L + keep);
                if (keep < 6) {
                    CHECK_OK(sn_forward(PM->m, s, ids + L + keep, 6 - keep, b, true));
                    CHECKF(!memcmp(a + (size_t)keep * V, b, sizeof(float) * (size_t)(6 - keep) * V),
                           "%s: tracked rewind to %d + %d changed the logits", PM->name, L, keep);
                }
                /* the tracking ended with the restore */
                CHECK(sn_rewind_restore(rw, s, sn_seq_pos(s)) == SN_E_INVALID);
            }
            if (PM->recurrent) {
                /* before the tracked pass: no state there */
                CHECK_OK(sn_rewind_track(rw, s, 6));
                int p0 = sn_seq_pos(s);
                CHECK_OK(sn_forward(PM->m, s, ids + 200, 4, NULL, false));
                CHECK(sn_rewind_restore(rw, s, p0) == SN_E_INVALID);
                /* tracked, but no forward ran */
                CHECK_OK(sn_rewind_track(rw, s, 6));
                CHECK(sn_rewind_restore(rw, s, sn_seq_pos(s)) == SN_E_INVALID);
                /* a pass longer than the tracked rows records only rows - 1 states */
                CHECK_OK(sn_rewind_track(rw, s, 3));
                p0 = sn_seq_pos(s);
                CHECK_OK(sn_forward(PM->m, s, ids + 300, 6, NULL, false));
                CHECK(sn_rewind_restore(rw, s, p0 + 4) == SN_E_INVALID);
                CHECK_OK(sn_rewind_track(rw, s, 3));
                p0 = sn_seq_pos(s);
                CHECK_OK(sn_forward(PM->m, s, ids + 300, 6, NULL, false));
                CHECK_OK(sn_rewind_restore(rw, s, p0 + 2));
                /* armed and abandoned (a request that failed mid-verify):
                 * handing the sequence's rewind out again disarms it */
                CHECK_OK(sn_rewind_track(rw, s, 6));
                CHECK(s->hist_armed);
                sn_rewind *own = NULL;
                CHECK_OK(sn_rewind_of(s, &own));
                CHECK(!s->hist_armed && own == s->rw);
                /* a refused forward (bad token id) ends the tracking too */
                CHECK_OK(sn_rewind_track(rw, s, 6));
                int32_t bad = V;
                CHECK(sn_forward(PM->m, s, &bad, 1, NULL, false) == SN_E_RANGE);
                CHECK(!s->hist_armed);
                CHECK(sn_rewind_restore(rw, s, sn_seq_pos(s)) == SN_E_INVALID);
            }
        }
        CHECK(sn_rewind_track(rw, s, 0) == SN_E_INVALID);
        sn_rewind_free(rw);
        sn_seq_free(s);
        free(a);
        free(b);
    }
}

/* The largest regular checkpoint at or below x (prompt_cache.c's spacing:
 * every `every` up to 4 x every, then two per doubling). */
static int ck_below(int x, int every)
{
    int best = 0;
    for (int p = every; p <= x; p += every) {
        int pow2 = 1;
        while (pow2 <= p / 2) pow2 *= 2;
        int sp = pow2 / 2 > every ? pow2 / 2 : every;
        if (p <= 4 * every || p % sp == 0) best = p;
    }
    return best;
}

/* Restoring from the pool at each prompt length gives the logits of a cold
 * prefill, for a restore at a checkpoint (recurrent) or at any position. */
static void test_pool_restore_lengths(void)
{
    FOR_MODELS {
        int V = PM->vocab;
        int32_t ids[700];
        pf_tokens(ids, 700, 31 + (uint64_t)mi, 0, V);
        float *cold = malloc(sizeof(float) * (size_t)V), *warm = malloc(sizeof(float) * (size_t)V);
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 64;
        o.min_fresh = 1;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        sn_seq *s = NULL;
        CHECK_OK(sn_seq_new(PM->m, 1024, &s));
        /* one long entry holding checkpoints at 64, 128, ... */
        CHECK_OK(sn_pcache_prewarm(pc, PM->m, s, ids, 660, NULL, 0));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int L = lens[li];
            sn_seq_reset(s);
            CHECK_OK(sn_forward(PM->m, s, ids, L, cold, false));
            sn_seq_reset(s);
            sn_pcache_req *r = NULL;
            int cached = -1;
            CHECK_OK(sn_pcache_begin(pc, s, ids, L, NULL, 0, &r, &cached));
            int expect = PM->recurrent ? ck_below(L - 1, 64) : L - 1;
            CHECKF(cached == expect, "%s: L=%d cached %d, expected %d", PM->name, L, cached, expect);
            CHECK(sn_seq_pos(s) == cached);
            CHECK_OK(sn_forward(PM->m, s, ids + cached, L - cached, warm, false));
            CHECKF(!memcmp(cold, warm, sizeof(float) * (size_t)V), "%s: L=%d warm logits differ", PM->name, L);
            sn_pcache_req_free(r);
        }
        sn_seq_free(s);
        sn_pcache_free(pc);
        free(cold);
        free(warm);
    }
}

static void gen_params(sn_gen_params *p, sn_pcache *pc, int max_tokens)
{
    pf_params(p, max_tokens);
    p->pcache = pc;
}

/* Cold vs warm generation, greedy: the same ids and bytes, and the warm run
 * really skipped tokens. */
static void test_generate_cold_warm(void)
{
    FOR_MODELS {
        int V = PM->vocab;
        int32_t P[400], A[480], B[480];
        pf_tokens(P, 400, 41 + (uint64_t)mi, 0, V < 500 ? V : 500);
        /* A and B: a shared 300-token prefix, then different tails */
        memcpy(A, P, 300 * sizeof(int32_t));
        memcpy(B, P, 300 * sizeof(int32_t));
        pf_tokens(A + 300, 180, 51 + (uint64_t)mi, 0, V < 500 ? V : 500);
        pf_tokens(B + 300, 180, 61 + (uint64_t)mi, 0, V < 500 ? V : 500);
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 64;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        sn_gen_params pcold, pwarm;
        gen_params(&pcold, NULL, 24);
        gen_params(&pwarm, pc, 24);
        pf_out c = { 0 }, w = { 0 };

        /* 1. the same prompt twice: miss then hit */
        pf_gen(PM->m, 1024, P, 400, &pcold, &c);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: first (cache miss) run differs from cold", PM->name);
        CHECK(w.res.cached_tokens == 0);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: repeat differs from cold", PM->name);
        CHECKF(w.res.cached_tokens == (PM->recurrent ? 384 : 399), "%s: repeat cached %d", PM->name,
               w.res.cached_tokens);
        CHECK(w.res.prompt_tokens == 400);

        /* 2. a prompt ending inside what the first one had (inside a message):
         * P[0..231) resumes from the checkpoint at or below 230 */
        pf_gen(PM->m, 1024, P, 231, &pcold, &c);
        pf_gen(PM->m, 1024, P, 231, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: prefix-inside-message differs from cold", PM->name);
        CHECKF(w.res.cached_tokens == (PM->recurrent ? 192 : 230), "%s: inside-message cached %d", PM->name,
               w.res.cached_tokens);

        /* 3. two continuations of one prefix, each after the other */
        pf_out ca = { 0 }, cb = { 0 };
        pf_gen(PM->m, 1024, A, 480, &pcold, &ca);
        pf_gen(PM->m, 1024, B, 480, &pcold, &cb);
        pf_gen(PM->m, 1024, A, 480, &pwarm, &w);
        CHECKF(pf_same(&ca, &w), "%s: continuation A differs", PM->name);
        CHECK(w.res.cached_tokens > 0 && w.res.cached_tokens <= 300);
        pf_gen(PM->m, 1024, B, 480, &pwarm, &w);
        CHECKF(pf_same(&cb, &w), "%s: continuation B differs", PM->name);
        CHECK(w.res.cached_tokens > 0 && w.res.cached_tokens <= 300);
        pf_gen(PM->m, 1024, A, 480, &pwarm, &w);
        CHECKF(pf_same(&ca, &w), "%s: continuation A again differs", PM->name);
        CHECK(w.res.cached_tokens == (PM->recurrent ? ck_below(479, 64) : 479));

        /* 4. a follow-up turn: prompt + generated text + more resumes past the prompt */
        int32_t F[600];
        memcpy(F, A, 480 * sizeof(int32_t));
        int ng = 0;
        /* every id before the last is a fed, non-EOS token */
        for (int i = 0; i + 1 < ca.n_ids && ng < 20; i++) F[480 + ng++] = ca.ids[i];
        pf_tokens(F + 480 + ng, 40, 71, 0, 500);
        int nF = 480 + ng + 40;
        pf_gen(PM->m, 1024, F, nF, &pcold, &c);
        pf_gen(PM->m, 1024, F, nF, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: follow-up turn differs", PM->name);
        CHECKF(w.res.cached_tokens >= 480, "%s: follow-up cached only %d", PM->name, w.res.cached_tokens);

        /* 5. sampling with a fixed seed: the same bytes cold, warm and twice */
        pcold.sample.temperature = pwarm.sample.temperature = 0.9f;
        pcold.sample.has_seed = pwarm.sample.has_seed = true;
        pcold.sample.seed = pwarm.sample.seed = 1234;
        pf_gen(PM->m, 1024, P, 400, &pcold, &c);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: seeded warm differs", PM->name);
        pf_gen(PM->m, 1024, P, 400, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: seeded warm twice differs", PM->name);

        sn_pcache_stats stt;
        sn_pcache_get_stats(pc, &stt);
        CHECK(stt.hits >= 6 && stt.misses >= 1 && stt.cached_tokens > 2000 && stt.entries >= 1);
        pf_out_free(&c);
        pf_out_free(&w);
        pf_out_free(&ca);
        pf_out_free(&cb);
        sn_pcache_free(pc);
    }
}

/* Real chat prompts on the trained default model (its own tokenizer and
 * template): a cached conversation, then one whose prefix with it ends in
 * the middle of the user message, then a second turn; with the message
 * starts (<|im_start|>) as bounds, as the server passes them. */
static int chat_ids(const sn_tokenizer *t, const char *sys, const char *user, const char *a1, const char *u2,
                    int32_t *out, int cap, int *bounds, int *nb)
{
    sn_chat_msg m[4];
    memset(m, 0, sizeof m);
    m[0].role = "system";
    m[0].content = sys;
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

static void test_chat_default_model(void)
{
    pf_model *pm = NULL;
    for (int i = 0; i < pf_n; i++)
        if (!strcmp(pf_models[i].name, "default")) pm = &pf_models[i];
    if (!pm) SKIP("models/default not present");
    sn_tokenizer *t = NULL;
    CHECK_OK(sn_tok_load("models/default", "qwen3_5", &t));
    if (!t) return;
    const char *sys = "You are a concise assistant. Answer with only what is asked, in lower case, and never add "
                      "a greeting or an explanation to the answer you give.";
    const char *u1 = "Repeat exactly: apple banana cherry grape lemon mango melon orange peach pear plum berry red "
                     "green blue yellow black white";
    const char *u2 = "Repeat exactly: apple banana cherry grape lemon mango melon orange dog cat bird fish";
    int32_t A[512], B[512], C[512];
    int ba[16], bb[16], bc[16], na, nb, nc;
    int la = chat_ids(t, sys, u1, NULL, NULL, A, 512, ba, &na);
    int lb = chat_ids(t, sys, u2, NULL, NULL, B, 512, bb, &nb);
    CHECK(la > 0 && lb > 0);
    if (la <= 0 || lb <= 0) goto out;
    int common = 0;
    while (common < la && common < lb && A[common] == B[common]) common++;
    CHECKF(common > bb[0] + 4 && common < lb - 8, "the shared prefix (%d) should end inside the user message (%d..%d)",
           common, bb[0], lb);
    sn_pcache_opts o;
    sn_pcache_opts_default(&o);
    o.ckpt_every = 16;   /* so one falls inside the user message */
    sn_pcache *pc = NULL;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    sn_gen_params pcold, pwarm;
    gen_params(&pcold, NULL, 24);
    gen_params(&pwarm, pc, 24);
    pf_out c = { 0 }, w = { 0 }, a = { 0 };
    pwarm.msg_bounds = ba;
    pwarm.n_msg_bounds = na;
    pf_gen(pm->m, 1024, A, la, &pwarm, &a);
    pf_gen(pm->m, 1024, A, la, &pcold, &c);
    CHECK(pf_same(&a, &c));
    /* B shares A's prefix up to the middle of the user message */
    pwarm.msg_bounds = bb;
    pwarm.n_msg_bounds = nb;
    pf_gen(pm->m, 1024, B, lb, &pcold, &c);
    pf_gen(pm->m, 1024, B, lb, &pwarm, &w);
    CHECKF(pf_same(&c, &w), "prefix ending inside a user message: warm differs");
    CHECKF(w.res.cached_tokens > bb[0] && w.res.cached_tokens <= common, "cached %d (message starts at %d, common %d)",
           w.res.cached_tokens, bb[0], common);
    fprintf(stderr, "  default model: prompt %d tokens, shares %d with the cached one (user message from %d), "
            "resumed at %d\n", lb, common, bb[0], w.res.cached_tokens);
    /* the second turn of A's conversation, with A's answer */
    char *ans = a.text ? a.text : "";
    int lc = chat_ids(t, sys, u1, ans, "Now in uppercase.", C, 512, bc, &nc);
    CHECK(lc > la);
    if (lc > la) {
        pwarm.msg_bounds = bc;
        pwarm.n_msg_bounds = nc;
        pf_gen(pm->m, 1024, C, lc, &pcold, &c);
        pf_gen(pm->m, 1024, C, lc, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "second turn: warm differs");
        CHECKF(w.res.cached_tokens >= la - 8, "second turn cached only %d of the first turn's %d", w.res.cached_tokens, la);
        fprintf(stderr, "  default model: second turn %d tokens, resumed at %d (first turn %d + %d generated)\n", lc,
                w.res.cached_tokens, la, a.res.completion_tokens);
    }
    pf_out_free(&a);
    pf_out_free(&c);
    pf_out_free(&w);
    sn_pcache_free(pc);
out:
    sn_tok_free(t);
}

/* Message bounds become checkpoints; min_fresh 2 leaves two tokens. */
static void test_bounds_and_min_fresh(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t P[300];
        pf_tokens(P, 300, 81 + (uint64_t)mi, 0, V);
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 256;
        o.min_fresh = 2;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        sn_gen_params pcold, pwarm;
        gen_params(&pcold, NULL, 12);
        gen_params(&pwarm, pc, 12);
        int bounds[] = { 150, 37, 999, 90, -4 };   /* the first and last valid ones count */
        pwarm.msg_bounds = bounds;
        pwarm.n_msg_bounds = 5;
        pf_out c = { 0 }, w = { 0 };
        pf_gen(PM->m, 512, P, 300, &pwarm, &w);
        pf_gen(PM->m, 512, P, 300, &pcold, &c);
        CHECK(pf_same(&c, &w));
        pf_gen(PM->m, 512, P, 300, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: min_fresh 2 repeat differs", PM->name);
        CHECKF(w.res.cached_tokens == (PM->recurrent ? 256 : 298), "%s: min_fresh 2 cached %d", PM->name,
               w.res.cached_tokens);
        /* a prompt diverging at 160 resumes from the message bound at 150 */
        int32_t Q[200];
        memcpy(Q, P, sizeof Q);
        Q[160] = (Q[160] + 1) % V;
        pf_gen(PM->m, 512, Q, 200, &pcold, &c);
        pf_gen(PM->m, 512, Q, 200, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: diverging prompt differs", PM->name);
        CHECKF(w.res.cached_tokens == (PM->recurrent ? 150 : 160), "%s: diverging cached %d", PM->name,
               w.res.cached_tokens);
        /* a prompt diverging at 100 resumes from 37: the middle bound 90 is no checkpoint */
        Q[160] = P[160];
        Q[100] = (Q[100] + 1) % V;
        pf_gen(PM->m, 512, Q, 200, &pcold, &c);
        pf_gen(PM->m, 512, Q, 200, &pwarm, &w);
        CHECKF(pf_same(&c, &w), "%s: diverging prompt 2 differs", PM->name);
        CHECKF(w.res.cached_tokens == (PM->recurrent ? 37 : 100), "%s: diverging-at-100 cached %d", PM->name,
               w.res.cached_tokens);
        pf_out_free(&c);
        pf_out_free(&w);
        sn_pcache_free(pc);
    }
}

/* The pool stays under its budget, evicting the least recently used. */
static void test_lru_budget(void)
{
    pf_model *pm = &pf_models[0];
    int32_t P[200];
    sn_seq *s = NULL;
    CHECK_OK(sn_seq_new(pm->m, 512, &s));
    sn_pcache_opts o;
    sn_pcache_opts_default(&o);
    o.ckpt_every = 64;
    sn_pcache *pc = NULL;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    pf_tokens(P, 200, 5, 0, 500);
    CHECK_OK(sn_pcache_prewarm(pc, pm->m, s, P, 200, NULL, 0));
    sn_pcache_stats st;
    sn_pcache_get_stats(pc, &st);
    size_t one = st.bytes;
    CHECK(st.entries == 1 && one > 0);
    sn_pcache_free(pc);
    /* room for two and a half entries: the third evicts the oldest */
    o.budget_bytes = one * 5 / 2;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    int32_t E[3][200];
    for (int k = 0; k < 3; k++) {
        pf_tokens(E[k], 200, 100 + (uint64_t)k, 0, 500);
        CHECK_OK(sn_pcache_prewarm(pc, pm->m, s, E[k], 200, NULL, 0));
        sn_pcache_get_stats(pc, &st);
        CHECK(st.bytes <= o.budget_bytes);
    }
    CHECK(st.entries == 2 && st.evictions == 1);
    /* E[0] is gone, E[2] is there */
    sn_pcache_req *r = NULL;
    int cached = -1;
    sn_seq_reset(s);
    CHECK_OK(sn_pcache_begin(pc, s, E[0], 200, NULL, 0, &r, &cached));
    CHECK(cached == 0);
    sn_pcache_req_free(r);
    sn_seq_reset(s);
    CHECK_OK(sn_pcache_begin(pc, s, E[2], 200, NULL, 0, &r, &cached));
    CHECK(cached == 192);
    sn_pcache_req_free(r);
    /* an entry extended by a longer one is replaced, not kept twice */
    sn_pcache_clear(pc);
    CHECK_OK(sn_pcache_prewarm(pc, pm->m, s, P, 100, NULL, 0));
    CHECK_OK(sn_pcache_prewarm(pc, pm->m, s, P, 200, NULL, 0));
    sn_pcache_get_stats(pc, &st);
    CHECKF(st.entries == 1, "%llu entries after an extension", (unsigned long long)st.entries);
    /* a zero budget stores nothing */
    sn_pcache_free(pc);
    o.budget_bytes = 0;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    CHECK_OK(sn_pcache_prewarm(pc, pm->m, s, P, 100, NULL, 0));
    sn_pcache_get_stats(pc, &st);
    CHECK(st.entries == 0);
    sn_pcache_free(pc);
    sn_seq_free(s);
}

/* Entries share their common prefix: two continuations of a 512-token
 * prefix cost about one prefix, the prefix-only entry they extend goes, and
 * the accounting returns to zero when the pool is cleared. */
static void test_sharing(void)
{
    FOR_MODELS {
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t A[600], B[600];
        pf_tokens(A, 576, 201 + (uint64_t)mi, 0, V);
        memcpy(B, A, 512 * sizeof(int32_t));
        pf_tokens(B + 512, 64, 202 + (uint64_t)mi, 0, V);
        sn_seq *s = NULL;
        CHECK_OK(sn_seq_new(PM->m, 1024, &s));
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 64;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        sn_pcache_stats st;
        CHECK_OK(sn_pcache_prewarm(pc, PM->m, s, A, 512, NULL, 0));
        sn_pcache_get_stats(pc, &st);
        uint64_t prefix = st.bytes;
        CHECK_OK(sn_pcache_prewarm(pc, PM->m, s, A, 576, NULL, 0));
        CHECK_OK(sn_pcache_prewarm(pc, PM->m, s, B, 576, NULL, 0));
        sn_pcache_get_stats(pc, &st);
        CHECKF(st.entries == 2, "%s: %llu entries", PM->name, (unsigned long long)st.entries);
        CHECKF(st.bytes < prefix * 3 / 2, "%s: two continuations take %llu bytes, the prefix alone %llu", PM->name,
               (unsigned long long)st.bytes, (unsigned long long)prefix);
        CHECK(st.hits == 2 && st.cached_tokens == 1024);
        /* both continuations resume past the shared part, bit-exactly */
        sn_gen_params pcold, pwarm;
        gen_params(&pcold, NULL, 8);
        gen_params(&pwarm, pc, 8);
        pf_out c = { 0 }, w = { 0 };
        for (int k = 0; k < 2; k++) {
            int32_t *P = k ? B : A;
            pf_tokens(P + 576, 10, 203, 0, V);
            pf_gen(PM->m, 1024, P, 586, &pcold, &c);
            pf_gen(PM->m, 1024, P, 586, &pwarm, &w);
            CHECKF(pf_same(&c, &w), "%s: continuation %d differs", PM->name, k);
            CHECKF(w.res.cached_tokens == 576, "%s: continuation %d cached %d", PM->name, k, w.res.cached_tokens);
        }
        sn_pcache_clear(pc);
        sn_pcache_get_stats(pc, &st);
        CHECK(st.entries == 0 && st.bytes == 0);
        pf_out_free(&c);
        pf_out_free(&w);
        sn_pcache_free(pc);
        sn_seq_free(s);
    }
}

/* Random use of a small pool (prompts built from three shared bases with
 * random cuts and tails, a budget that forces evictions): every restore
 * gives the cold logits bit for bit, the pool never ends a commit over its
 * budget, and clearing it returns the byte count to zero (no segment leaks
 * or double frees in the reference counting). */
static void test_pool_random(void)
{
    FOR_MODELS {
        if (strncmp(PM->name, "synth_", 6) != 0) continue;   /* the four architectures once */
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t base[3][300], P[400];
        for (int b = 0; b < 3; b++) pf_tokens(base[b], 300, 301 + (uint64_t)b, 0, V);
        float *cold = malloc(sizeof(float) * (size_t)PM->vocab), *warm = malloc(sizeof(float) * (size_t)PM->vocab);
        sn_seq *s = NULL, *c = NULL;
        CHECK_OK(sn_seq_new(PM->m, 512, &s));
        CHECK_OK(sn_seq_new(PM->m, 512, &c));
        /* budget: about three 250-token entries */
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        o.ckpt_every = 32;
        sn_pcache *pc = NULL;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        CHECK_OK(sn_pcache_prewarm(pc, PM->m, s, base[0], 250, NULL, 0));
        sn_pcache_stats st;
        sn_pcache_get_stats(pc, &st);
        sn_pcache_free(pc);
        o.budget_bytes = st.bytes * 3;
        CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
        uint64_t x = 77 + (uint64_t)mi;
        int hits = 0;
        for (int it = 0; it < 40; it++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int b = (int)((x >> 33) % 3), cut = 1 + (int)((x >> 40) % 299), tail = 1 + (int)((x >> 20) % 80);
            memcpy(P, base[b], (size_t)cut * sizeof(int32_t));
            pf_tokens(P + cut, tail, x, 0, V);
            int n = cut + tail;
            sn_seq_reset(c);
            CHECK_OK(sn_forward(PM->m, c, P, n, cold, false));
            sn_seq_reset(s);
            sn_pcache_req *r = NULL;
            int cached = -1;
            CHECK_OK(sn_pcache_begin(pc, s, P, n, NULL, 0, &r, &cached));
            CHECK(cached >= 0 && cached < n);
            hits += cached > 0;
            for (int i = cached; i < n;) {
                int end = sn_pcache_next_stop(r, i, n);
                CHECK_OK(sn_forward(PM->m, s, P + i, end - i, end == n ? warm : NULL, false));
                CHECK_OK(sn_pcache_capture(r, s));
                i = end;
            }
            CHECKF(!memcmp(cold, warm, sizeof(float) * (size_t)PM->vocab), "%s: iteration %d (base %d cut %d tail %d, "
                   "cached %d) differs from cold", PM->name, it, b, cut, tail, cached);
            CHECK_OK(sn_pcache_commit(r, s, P, n));
            sn_pcache_req_free(r);
            sn_pcache_get_stats(pc, &st);
            CHECKF(st.bytes <= o.budget_bytes, "%s: %llu bytes over the budget %zu", PM->name,
                   (unsigned long long)st.bytes, o.budget_bytes);
        }
        sn_pcache_get_stats(pc, &st);
        CHECKF(hits >= 20 && st.evictions > 0, "%s: %d hits, %llu evictions", PM->name, hits,
               (unsigned long long)st.evictions);
        sn_pcache_clear(pc);
        sn_pcache_get_stats(pc, &st);
        CHECK(st.bytes == 0 && st.entries == 0);
        sn_pcache_free(pc);
        sn_seq_free(s);
        sn_seq_free(c);
        free(cold);
        free(warm);
    }
}

static void test_bad_args(void)
{
    pf_model *pm = &pf_models[0];
    sn_pcache_opts o;
    sn_pcache_opts_default(&o);
    sn_pcache *pc = NULL;
    o.ckpt_every = 3;
    CHECK(sn_pcache_new(pm->m, &o, &pc) == SN_E_INVALID && strstr(sn_errmsg(), "ckpt_every"));
    o.ckpt_every = 64;
    o.min_fresh = 0;
    CHECK(sn_pcache_new(pm->m, &o, &pc) == SN_E_INVALID && strstr(sn_errmsg(), "min_fresh"));
    o.min_fresh = 1;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    sn_seq *s = NULL, *s2 = NULL;
    CHECK_OK(sn_seq_new(pm->m, 64, &s));
    int32_t t[4] = { 1, 2, 3, 4 };
    CHECK_OK(sn_forward(pm->m, s, t, 2, NULL, false));
    sn_pcache_req *r = NULL;
    int cached;
    CHECK(sn_pcache_begin(pc, s, t, 4, NULL, 0, &r, &cached) == SN_E_INVALID && strstr(sn_errmsg(), "position"));
    CHECK(r == NULL);
    if (pf_n > 1) {
        CHECK_OK(sn_seq_new(pf_models[1].m, 64, &s2));
        CHECK(sn_pcache_begin(pc, s2, t, 4, NULL, 0, &r, &cached) == SN_E_INVALID);
    }
    /* prewarm longer than the context */
    int32_t big[80] = { 0 };
    CHECK(sn_pcache_prewarm(pc, pm->m, s, big, 80, NULL, 0) == SN_E_RANGE);
    sn_pcache_free(NULL);
    sn_pcache_req_free(NULL);
    sn_rewind_free(NULL);
    sn_seq_free(s);
    sn_seq_free(s2);
    sn_pcache_free(pc);
}

/* Four threads share one pool, each with its own sequence, on two prompts
 * that share a prefix: every output equals the cold one. */
typedef struct {
    pf_model *pm;
    sn_pcache *pc;
    const int32_t *prompt;
    int n;
    pf_out out;
} thr_arg;

static void *thr_main(void *a)
{
    thr_arg *t = a;
    sn_gen_params p;
    gen_params(&p, t->pc, 10);
    for (int k = 0; k < 3; k++) pf_gen(t->pm->m, 512, t->prompt, t->n, &p, &t->out);
    return NULL;
}

static void test_threads(void)
{
    pf_model *pm = &pf_models[0];
    int32_t A[200], B[200];
    pf_tokens(A, 200, 91, 0, 500);
    memcpy(B, A, sizeof B);
    pf_tokens(B + 120, 80, 92, 0, 500);
    sn_pcache_opts o;
    sn_pcache_opts_default(&o);
    o.ckpt_every = 32;
    sn_pcache *pc = NULL;
    CHECK_OK(sn_pcache_new(pm->m, &o, &pc));
    sn_gen_params p;
    gen_params(&p, NULL, 10);
    pf_out ca = { 0 }, cb = { 0 };
    pf_gen(pm->m, 512, A, 200, &p, &ca);
    pf_gen(pm->m, 512, B, 200, &p, &cb);
    thr_arg t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (thr_arg){ .pm = pm, .pc = pc, .prompt = i & 1 ? B : A, .n = 200 };
        pthread_create(&th[i], NULL, thr_main, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECKF(pf_same(i & 1 ? &cb : &ca, &t[i].out), "thread %d output differs", i);
        pf_out_free(&t[i].out);
    }
    sn_pcache_stats st;
    sn_pcache_get_stats(pc, &st);
    CHECK(st.hits + st.misses == 12 && st.hits >= 4);
    pf_out_free(&ca);
    pf_out_free(&cb);
    sn_pcache_free(pc);
}

/* Pool storage: where the bytes go (stats.backend_bytes), and the same
 * bits whatever the storage. The pool is forced into backend buffers (on
 * the CPU those are host memory, so the copies are memcpy as on the host
 * path, but the logic is the one CUDA runs: buf_alloc, copy, buf_free),
 * and then the backend's buf_alloc is made to fail always or every other
 * call, so segments and checkpoints fall back to host memory, alone or
 * mixed with backend ones. Each case: random prompts over shared bases
 * through a small pool with evictions, every restore bitwise the cold
 * logits, the byte counts back to zero once cleared. */
static const sn_backend_ops *st_real;
static sn_backend_ops st_fake;
static int st_fail;          /* 0: never, 1: always, 2: every other call */
static unsigned st_calls;

static sn_status st_alloc(sn_backend *be, size_t bytes, void **out)
{
    st_calls++;
    if (st_fail == 1 || (st_fail == 2 && (st_calls & 1))) {
        *out = NULL;
        return SN_FAIL(SN_E_NOMEM, "test: backend memory is full");
    }
    return st_real->buf_alloc(be, bytes, out);
}

static void test_store_paths(void)
{
    /* AUTO on the CPU keeps host memory; a bad store value is refused */
    {
        pf_model *pm = &pf_models[0];
        sn_pcache_opts o;
        sn_pcache_opts_default(&o);
        CHECK(o.store == SN_PCACHE_STORE_AUTO);
        o.store = (sn_pcache_store)7;
        sn_pcache *pc = NULL;
        CHECK(sn_pcache_new(pm->m, &o, &pc) == SN_E_INVALID && strstr(sn_errmsg(), "store"));
        setenv("SANCTUM_PCACHE_STORE", "backend", 1);
        sn_pcache_opts_default(&o);
        CHECK(o.store == SN_PCACHE_STORE_BACKEND);
        setenv("SANCTUM_PCACHE_STORE", "host", 1);
        sn_pcache_opts_default(&o);
        CHECK(o.store == SN_PCACHE_STORE_HOST);
        CHECK_OK(sn_engine_env_check());
        /* a malformed knob is refused by name, by sn_pcache_new and sn_engine_env_check */
        setenv("SANCTUM_PCACHE_STORE", "hots", 1);
        sn_pcache_opts_default(&o);
        CHECK(sn_pcache_new(pm->m, &o, &pc) == SN_E_INVALID && strstr(sn_errmsg(), "SANCTUM_PCACHE_STORE=hots"));
        unsetenv("SANCTUM_PCACHE_STORE");
        static const struct { const char *name, *value; } bad[] = {
            { "SANCTUM_PCACHE_MIN_FRESH", "3" }, { "SANCTUM_INVARIANT_ROWS", "0" },
            { "SANCTUM_INVARIANT_ROWS", "8x" },  { "SANCTUM_INVARIANT_ROWS", "MAX" },
            { "SANCTUM_GRAPH_ROWS", "9" },       { "SANCTUM_RECORD_AHEAD", "2" },
            { "SANCTUM_RECORD_AHEAD", "yes" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            setenv(bad[i].name, bad[i].value, 1);
            CHECKF(sn_engine_env_check() == SN_E_INVALID && strstr(sn_errmsg(), bad[i].name),
                   "%s=%s: not refused by name", bad[i].name, bad[i].value);
            unsetenv(bad[i].name);
        }
        setenv("SANCTUM_INVARIANT_ROWS", "max", 1);
        CHECK_OK(sn_engine_env_check());
        setenv("SANCTUM_INVARIANT_ROWS", "4", 1);
        CHECK_OK(sn_engine_env_check());
        unsetenv("SANCTUM_INVARIANT_ROWS");
    }
    FOR_MODELS {
        if (strncmp(PM->name, "synth_", 6) != 0) continue;   /* the four architectures once */
        int V = PM->vocab < 500 ? PM->vocab : 500;
        int32_t base[2][300], P[400];
        for (int b = 0; b < 2; b++) pf_tokens(base[b], 300, 401 + (uint64_t)b, 0, V);
        float *cold = malloc(sizeof(float) * (size_t)PM->vocab), *warm = malloc(sizeof(float) * (size_t)PM->vocab);
        sn_seq *s = NULL, *c = NULL;
        CHECK_OK(sn_seq_new(PM->m, 512, &s));
        CHECK_OK(sn_seq_new(PM->m, 512, &c));
        static const struct { sn_pcache_store store; int fail; } cases[] = {
            { SN_PCACHE_STORE_AUTO, 0 }, { SN_PCACHE_STORE_HOST, 0 }, { SN_PCACHE_STORE_BACKEND, 0 },
            { SN_PCACHE_STORE_BACKEND, 1 }, { SN_PCACHE_STORE_BACKEND, 2 },
        };
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            sn_pcache_opts o;
            sn_pcache_opts_default(&o);
            o.ckpt_every = 32;
            o.store = cases[ci].store;
            o.budget_bytes = 0;
            sn_pcache *pc = NULL;
            sn_pcache_stats st;
            /* budget: about three 250-token entries */
            {
                sn_pcache_opts h = o;
                h.store = SN_PCACHE_STORE_HOST;
                h.budget_bytes = (size_t)1 << 30;
                CHECK_OK(sn_pcache_new(PM->m, &h, &pc));
                CHECK_OK(sn_pcache_prewarm(pc, PM->m, s, base[0], 250, NULL, 0));
                sn_pcache_get_stats(pc, &st);
                o.budget_bytes = st.bytes * 3;
                sn_pcache_free(pc);
            }
            CHECK_OK(sn_pcache_new(PM->m, &o, &pc));
            /* only the pool allocates from here on (the sequences exist) */
            st_real = PM->m->be->ops;
            st_fake = *st_real;
            st_fake.buf_alloc = st_alloc;
            st_fail = cases[ci].fail;
            st_calls = 0;
            PM->m->be->ops = &st_fake;
            uint64_t x = 991 + (uint64_t)mi * 7 + ci;
            int hits = 0;
            bool saw_dev = false;
            for (int it = 0; it < 16; it++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                int b = (int)((x >> 33) % 2), cut = 1 + (int)((x >> 40) % 299), tail = 1 + (int)((x >> 20) % 60);
                memcpy(P, base[b], (size_t)cut * sizeof(int32_t));
                pf_tokens(P + cut, tail, x, 0, V);
                int n = cut + tail;
                sn_seq_reset(c);
                CHECK_OK(sn_forward(PM->m, c, P, n, cold, false));
                sn_seq_reset(s);
                sn_pcache_req *r = NULL;
                int cached = -1;
                CHECK_OK(sn_pcache_begin(pc, s, P, n, NULL, 0, &r, &cached));
                hits += cached > 0;
                for (int i = cached; i < n;) {
                    int end = sn_pcache_next_stop(r, i, n);
                    CHECK_OK(sn_forward(PM->m, s, P + i, end - i, end == n ? warm : NULL, false));
                    CHECK_OK(sn_pcache_capture(r, s));
                    i = end;
                }
                CHECKF(!memcmp(cold, warm, sizeof(float) * (size_t)PM->vocab),
                       "%s: store %d fail %d: iteration %d (cut %d tail %d, cached %d) differs from cold", PM->name,
                       (int)cases[ci].store, cases[ci].fail, it, cut, tail, cached);
                CHECK_OK(sn_pcache_commit(r, s, P, n));
                sn_pcache_req_free(r);
                sn_pcache_get_stats(pc, &st);
                CHECK(st.bytes <= o.budget_bytes && st.backend_bytes <= st.bytes);
                saw_dev |= st.backend_bytes > 0;
            }
            PM->m->be->ops = st_real;
            sn_pcache_get_stats(pc, &st);
            bool dev = cases[ci].store == SN_PCACHE_STORE_BACKEND;
            fprintf(stderr, "  %s: store %d, backend allocations fail %d: %d/16 hits, %llu evictions, %llu host "
                    "fallbacks\n", PM->name, (int)cases[ci].store, cases[ci].fail, hits,
                    (unsigned long long)st.evictions, (unsigned long long)st.host_fallbacks);
            CHECKF(hits >= 4 && st.evictions > 0, "%s: case %zu: %d hits, %llu evictions", PM->name, ci, hits,
                   (unsigned long long)st.evictions);
            CHECKF(saw_dev == (dev && cases[ci].fail != 1), "%s: case %zu: backend bytes seen %d", PM->name, ci, saw_dev);
            CHECKF((st.host_fallbacks > 0) == (dev && cases[ci].fail != 0), "%s: case %zu: %llu fallbacks", PM->name,
                   ci, (unsigned long long)st.host_fallbacks);
            CHECK(st.lookup_s >= 0 && st.restore_s >= 0 && st.capture_s >= 0 && st.commit_s > 0);
            sn_pcache_clear(pc);
            sn_pcache_get_stats(pc, &st);
            CHECK(st.bytes == 0 && st.backend_bytes == 0 && st.entries == 0);
            sn_pcache_free(pc);
        }
        sn_seq_free(s);
        sn_seq_free(c);
        free(cold);
        free(warm);
    }
}

/* The pool tests again with the pool in backend buffers (main). */
#define BACKEND_STORE(fn) \
    static void fn##_backend_store(void) { fn(); }
BACKEND_STORE(test_pool_restore_lengths)
BACKEND_STORE(test_generate_cold_warm)
BACKEND_STORE(test_sharing)
BACKEND_STORE(test_threads)
BACKEND_STORE(canon_cold_warm)

/* The server side: the "pld" request field, usage.prompt_tokens_details
 * and the /metrics counters. */
static void test_server_fields(void)
{
    srv_chat_req r;
    srv_err e;
    const char *b1 = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"pld\":false}";
    CHECK_OK(srv_chat_parse(b1, strlen(b1), &r, &e));
    CHECK(r.no_pld);
    srv_chat_req_free(&r);
    const char *b2 = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    CHECK_OK(srv_chat_parse(b2, strlen(b2), &r, &e));
    CHECK(!r.no_pld);
    srv_chat_req_free(&r);
    const char *b3 = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"pld\":1}";
    CHECK(srv_chat_parse(b3, strlen(b3), &r, &e) == SN_E_INVALID && !strcmp(e.param, "pld"));
    srv_resp_meta meta = { "chatcmpl-x", 1, "m", "fp" };
    char *j = srv_resp_json_cached(&meta, "ok", 2, "stop", 40, 3, 32);
    CHECK(j && strstr(j, "\"prompt_tokens\":40") && strstr(j, "\"prompt_tokens_details\":{\"cached_tokens\":32}"));
    free(j);
    j = srv_usage_sse_cached(&meta, 40, 3, 17);
    CHECK(j && strstr(j, "\"cached_tokens\":17"));
    free(j);
    j = srv_resp_json(&meta, "ok", 2, "stop", 40, 3);
    CHECK(j && strstr(j, "\"cached_tokens\":0"));
    free(j);
    srv_metrics *m = NULL;
    CHECK_OK(srv_metrics_new(&m));
    srv_infer_sample s1 = { .stop_reason = "stop", .prompt_tokens = 40, .completion_tokens = 3, .ttft_s = 0.1,
                            .pcache_used = true, .cached_tokens = 32, .pld_drafted = 10, .pld_accepted = 7 };
    srv_infer_sample s2 = { .stop_reason = "stop", .prompt_tokens = 40, .completion_tokens = 3, .ttft_s = 0.1,
                            .pcache_used = true };
    srv_infer_sample s3 = { .stop_reason = "stop", .prompt_tokens = 40, .completion_tokens = 3, .ttft_s = 0.1 };
    srv_metrics_inference(m, &s1);
    srv_metrics_inference(m, &s2);
    srv_metrics_inference(m, &s3);
    srv_metrics_prompt_cache(m, 3, 123456);
    char *t = NULL;
    size_t len = 0;
    CHECK_OK(srv_metrics_render(m, &t, &len));
    CHECK(t && strstr(t, "\nsanctum_mlx_prompt_cache_hits_total 1\n") && strstr(t, "\nsanctum_mlx_prompt_cache_misses_total 1\n") &&
          strstr(t, "\nsanctum_mlx_prompt_cache_cached_tokens_total 32\n") &&
          strstr(t, "\nsanctum_mlx_pld_drafted_tokens_total 10\n") && strstr(t, "\nsanctum_mlx_pld_accepted_tokens_total 7\n") &&
          strstr(t, "\nsanctum_mlx_prompt_cache_entries 3\n") && strstr(t, "\nsanctum_mlx_prompt_cache_bytes 123456\n"));
    free(t);
    srv_metrics_free(m);
}

int main(void)
{
    if (!pf_setup()) {
        fprintf(stderr, "setup failed\n");
        pf_teardown();
        printf("0 passed, 1 failed\n");
        return 1;
    }
    for (int i = 0; i < pf_n; i++) fprintf(stderr, "model %s\n", pf_models[i].name);
    RUN(test_batch_invariance);
    RUN(test_rewind);
    RUN(test_rewind_tracked);
    RUN(test_pool_restore_lengths);
    RUN(test_generate_cold_warm);
    RUN(test_bounds_and_min_fresh);
    RUN(test_chat_default_model);
    RUN(test_lru_budget);
    RUN(test_sharing);
    RUN(test_pool_random);
    RUN(test_bad_args);
    RUN(test_threads);
    RUN(test_store_paths);
    RUN(test_server_fields);
    /* the pool in backend buffers (the CUDA storage path) on CPU buffers */
    setenv("SANCTUM_PCACHE_STORE", "backend", 1);
    RUN(test_pool_restore_lengths_backend_store);
    RUN(test_generate_cold_warm_backend_store);
    RUN(test_sharing_backend_store);
    RUN(test_threads_backend_store);
    unsetenv("SANCTUM_PCACHE_STORE");
    /* the engine path of a backend that is not batch invariant (CUDA),
     * here on the CPU: canonical schedule, resume points, PLD row cap */
    setenv("SANCTUM_INVARIANT_ROWS", "4", 1);
    RUN(canon_invariant_rows);
    RUN(canon_cold_warm);
    RUN(canon_pld);
    RUN(canon_chat_default);
    setenv("SANCTUM_PCACHE_STORE", "backend", 1);
    RUN(canon_cold_warm_backend_store);
    unsetenv("SANCTUM_PCACHE_STORE");
    unsetenv("SANCTUM_INVARIANT_ROWS");
    pf_teardown();
    return TEST_END();
}
