/* The generation loop (generate.h). */
#include "sanctum/generate.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sanctum/clock.h"
#include "sanctum/prompt_cache.h"
#include "sanctum/stop.h"

const char *sn_finish_name(sn_finish f)
{
    switch (f) {
    case SN_FINISH_STOP: return "stop";
    case SN_FINISH_LENGTH: return "length";
    case SN_FINISH_CANCELLED: return "cancelled";
    }
    return "stop";
}

static bool is_eos(const sn_model_info *info, int32_t id)
{
    for (int i = 0; i < info->n_eos && i < 8; i++)
        if (info->eos_ids[i] == id) return true;
    return false;
}

/* Everything the per-token step needs; one token goes through exactly the
 * same code whether it came from a plain decode step or a PLD verify pass,
 * so the sampler window, the detokenizer and the stop matcher see the same
 * stream either way. */
typedef struct {
    sn_model *m;
    const sn_tokenizer *tok;
    const sn_gen_params *p;
    const sn_model_info *info;
    sn_gen_text_cb cb;
    sn_gen_result *res;
    sn_sampler *smp;
    sn_stopper *stop;
    sn_detok dt;
    char *dtext, *otext;
    size_t dlen, dcap, olen, ocap;
    double t0, t_first;
    int since_flush;
    int ctx_left;          /* tokens that may be emitted before the context is full */
    bool stopped;
    int32_t *hist;         /* prompt + emitted tokens (the PLD search space and the cache key) */
    int n_hist, cap_hist;
    int32_t *unusable;     /* model ids the tokenizer cannot decode (padding rows, holes) */
    int n_unusable;
    bool greedy;           /* the sampler is a plain argmax: forwards return ids, not logits */
    bool dev;              /* or the backend draws (sn_model_can_sample): forwards return drawn ids */
    sn_sample_row *srows;  /* the device draws' rows, edits and phase ends (dev) */
    sn_logit_edit *edits;
    int32_t *phase_end;
} gen;

enum { EMIT_MORE = 0, EMIT_END = 1, EMIT_CANCELLED = 2 };

/* One forward of n tokens whose last nd are drafts; when want, the logits
 * of its last row (with drafts, of every row) reach the host, or, for a
 * greedy sampler, only those rows' argmax ids with the undecodable ids
 * banned (what masking them and sampling gives), or, where the backend
 * draws (g->dev), the draws of the rows that predict: one id per row
 * crosses from the backend, and a CUDA decode step moves no logits. */
static sn_status gen_forward(gen *g, sn_seq *seq, const int32_t *t, int n, bool want, int nd, float *logits,
                             int32_t *ids)
{
    sn_batch_item b = { .seq = seq, .tokens = t, .n = n };
    const bool all = nd > 0;
    if (want && g->dev) {
        /* a verify pass's needed rows are its last: the one after the fed
         * tokens, then one after each draft, whose window holds the drafts
         * before it; ids[row] gets row's draw, as all_ids puts them */
        int first = n - 1 - nd;
        SN_TRY(sn_sampler_device_rows(g->smp, t + first + 1, n - first, first, g->unusable, g->n_unusable, g->edits,
                                      g->phase_end, g->srows));
        b.next_id = all ? ids + first : ids;
        b.sample = g->srows;
        b.n_sample = n - first;
    } else if (want && g->greedy) {
        b.next_id = ids;
        b.all_ids = all;
        b.banned = g->unusable;
        b.n_banned = g->n_unusable;
    } else if (want) {
        b.logits = logits;
        b.all_logits = all;
    }
    return sn_forward_batch(g->m, &b, 1);
}

/* Samples the next token from logits (or, with logits NULL, takes *id:
 * the greedy id the forward computed, with the same masking, or its draw
 * on the backend, whose u the sampler then counts as used) and runs it
 * through the sampler window, detokenizer, stop strings, limits and flush
 * cadence. Returns EMIT_MORE when generation goes on (*id to be fed next),
 * EMIT_END or EMIT_CANCELLED when it ended (res->finish set), or an error. */
static sn_status emit(gen *g, float *logits, int32_t *id, int *what)
{
    sn_gen_result *res = g->res;
    const sn_gen_params *p = g->p;
    *what = EMIT_END;
    if (logits) {
        /* The embedding is often padded past the tokenizer (a 1702-token
         * tokenizer on 1728 rows): such an id cannot be decoded, so it must
         * never be drawn, whatever the weights or logit_bias say. */
        for (int i = 0; i < g->n_unusable; i++) logits[g->unusable[i]] = -INFINITY;
        SN_TRY(sn_sampler_sample(g->smp, logits, id));
    } else if (g->dev) {
        sn_sampler_took_draw(g->smp);
    }
    if (p->on_token) p->on_token(p->ud, *id);
    res->completion_tokens++;
    g->since_flush++;
    if (res->completion_tokens == 1) {
        g->t_first = sn_now_s();
        res->first_token_s = g->t_first - g->t0;
    }
    if (is_eos(g->info, *id)) { res->finish = SN_FINISH_STOP; return SN_OK; }
    sn_sampler_accept(g->smp, *id);
    if (g->n_hist < g->cap_hist) g->hist[g->n_hist++] = *id;
    g->dlen = 0;
    SN_TRY(sn_detok_push(&g->dt, g->tok, *id, false, &g->dtext, &g->dlen, &g->dcap));
    SN_TRY(sn_stop_push(g->stop, g->dtext, g->dlen, &g->otext, &g->olen, &g->ocap, &g->stopped));
    if (g->stopped) { res->finish = SN_FINISH_STOP; return SN_OK; }
    if (res->completion_tokens >= p->max_tokens || res->completion_tokens >= g->ctx_left) {
        res->finish = SN_FINISH_LENGTH;
        return SN_OK;
    }
    /* The first token goes out at once (time to first token is what a
     * client feels); after that, every flush_tokens tokens. */
    if (g->since_flush >= p->flush_tokens || res->completion_tokens == 1) {
        g->since_flush = 0;
        sn_status st = g->cb ? g->cb(p->ud, g->otext ? g->otext : "", g->olen, res->completion_tokens) : SN_OK;
        g->olen = 0;
        if (st == SN_E_CANCELLED) { res->finish = SN_FINISH_CANCELLED; *what = EMIT_CANCELLED; return SN_OK; }
        if (st != SN_OK) return st;
    }
    if (p->cancelled && p->cancelled(p->ud)) { res->finish = SN_FINISH_CANCELLED; *what = EMIT_CANCELLED; return SN_OK; }
    *what = EMIT_MORE;
    return SN_OK;
}

sn_status sn_generate(sn_model *m, const sn_tokenizer *tok, sn_seq *seq, const int32_t *prompt, int n_prompt,
                      const sn_gen_params *p, sn_gen_text_cb cb, sn_gen_result *res)
{
    memset(res, 0, sizeof *res);
    res->first_token_s = -1;
    res->finish = SN_FINISH_STOP;
    if (n_prompt < 1) return SN_FAIL(SN_E_INVALID, "generate: the prompt is empty");
    if (p->max_tokens < 1) return SN_FAIL(SN_E_INVALID, "generate: max_tokens must be >= 1, got %d", p->max_tokens);
    if (p->flush_tokens < 1) return SN_FAIL(SN_E_INVALID, "generate: flush_tokens must be >= 1, got %d", p->flush_tokens);
    sn_pld_opts po = p->pld_opts;
    if (p->pld && po.max_lookup == 0) po = (sn_pld_opts){ .max_lookup = 5, .ngram = 3, .adaptive = true };
    if (p->pld) SN_TRY(sn_pld_opts_check(&po));
    SN_TRY(sn_engine_env_check());
    const sn_model_info *info = sn_model_get_info(m);
    int pos0 = sn_seq_pos(seq), max_ctx = sn_seq_max_ctx(seq);
    if (pos0 + n_prompt >= max_ctx)
        return SN_FAIL(SN_E_RANGE, "prompt is %d tokens (at position %d) but the context holds %d",
                       n_prompt, pos0, max_ctx);
    int vocab = info->vocab_size;
    /* logits rows: a verify pass feeds at most the tokens held back by a
     * rollback (<= max_lookup + 1) or the newest token plus its drafts */
    int rows = p->pld ? po.max_lookup + 2 : 1;
    sn_status st = SN_OK;
    gen g = { .m = m, .tok = tok, .p = p, .info = info, .cb = cb, .res = res };
    sn_detok_init(&g.dt);
    float *logits = malloc((size_t)rows * (size_t)vocab * sizeof *logits);
    sn_pcache_req *pcr = NULL;
    sn_rewind *rw = NULL;
    int *sched = NULL, n_sched = 0;
    int32_t gids[2 * SN_PLD_MAX_LOOKUP + 2] = { 0 }; /* a greedy forward's ids, one per fed row (as feed[]) */
    /* Rows per forward whose results are those of one-row forwards: on a
     * backend that is not batch invariant the prefill follows the canonical
     * schedule (prompt_cache.h) and PLD verifies at most this many rows. */
    int inv_rows = sn_engine_invariant_rows(m);
    int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 512;
    if (inv_rows != INT_MAX) {
        chunk = sn_prefill_chunk(m, chunk);
        sched = malloc((size_t)(n_prompt / chunk + 3) * sizeof *sched);
        if (!sched) { st = SN_FAIL(SN_E_NOMEM, "generate: out of memory"); goto out; }
        n_sched = sn_prefill_schedule(n_prompt, chunk, p->msg_bounds, p->n_msg_bounds, sched);
    }
    g.ctx_left = max_ctx - pos0 - n_prompt;
    g.cap_hist = n_prompt + (p->max_tokens < g.ctx_left ? p->max_tokens : g.ctx_left) + 1;
    g.hist = malloc((size_t)g.cap_hist * sizeof *g.hist);
    if (!logits || !g.hist) { st = SN_FAIL(SN_E_NOMEM, "generate: out of memory for %d logits", rows * vocab); goto out; }
    memcpy(g.hist, prompt, (size_t)n_prompt * sizeof *prompt);
    g.n_hist = n_prompt;
    if ((st = sn_sampler_new(&p->sample, vocab, &g.smp)) != SN_OK) goto out;
    g.greedy = sn_sampler_is_greedy(g.smp);
    bool dev_ok;
    if ((st = sn_sample_device_allowed(&dev_ok)) != SN_OK) goto out;
    g.dev = !g.greedy && sn_model_can_sample(m) && dev_ok;
    if (g.dev) {
        size_t ec = (size_t)sn_sampler_edit_cap(g.smp), pc = (size_t)sn_sampler_phase_cap(g.smp);
        g.srows = malloc((size_t)rows * sizeof *g.srows);
        g.edits = malloc((size_t)rows * ec * sizeof *g.edits);
        g.phase_end = malloc((size_t)rows * pc * sizeof *g.phase_end);
        if (!g.srows || !g.edits || !g.phase_end) { st = SN_FAIL(SN_E_NOMEM, "generate: out of memory for draws"); goto out; }
    }
    /* mlx-lm's penalty history starts with the last prompt token (before
     * the prefill: a draw on the backend happens inside its last forward) */
    sn_sampler_accept(g.smp, prompt[n_prompt - 1]);
    for (int32_t id = 0; id < vocab; id++) {
        size_t plen;
        if (is_eos(info, id) || sn_tok_piece(tok, id, &plen)) continue;
        if (g.n_unusable % 256 == 0) {
            int32_t *u = realloc(g.unusable, (size_t)(g.n_unusable + 256) * sizeof *u);
            if (!u) { st = SN_FAIL(SN_E_NOMEM, "generate: out of memory listing undecodable ids"); goto out; }
            g.unusable = u;
        }
        g.unusable[g.n_unusable++] = id;
    }
    if (g.n_unusable == vocab) { st = SN_FAIL(SN_E_INVALID, "generate: the tokenizer decodes none of the model's %d ids", vocab); goto out; }
    if ((st = sn_stop_new(p->stops, p->n_stops, &g.stop)) != SN_OK) goto out;

    g.t0 = sn_now_s();
    int cached = 0;
    if (p->pcache && pos0 == 0) {
        if ((st = sn_pcache_begin_ex(p->pcache, seq, prompt, n_prompt, p->msg_bounds, p->n_msg_bounds, chunk, &pcr,
                                     &cached)) != SN_OK) goto out;
        res->cached_tokens = cached;
        res->prompt_tokens = cached;
    }
    for (int i = cached, k = 0; i < n_prompt;) {
        int end = n_prompt - i < chunk ? n_prompt : i + chunk;
        if (sched) {
            /* the forward of the schedule that starts at i (a resume
             * point is always one of its ends) */
            while (k < n_sched && sched[k] <= i) k++;
            end = k < n_sched ? sched[k] : n_prompt;
        }
        end = sn_pcache_next_stop(pcr, i, end);
        bool last = end == n_prompt;
        if ((st = gen_forward(&g, seq, prompt + i, end - i, last, 0, logits, gids)) != SN_OK) goto out;
        if ((st = sn_pcache_capture(pcr, seq)) != SN_OK) goto out;
        res->prompt_tokens += end - i;
        i = end;
        if (!last && p->cancelled && p->cancelled(p->ud)) { res->finish = SN_FINISH_CANCELLED; goto done; }
    }
    res->prefill_s = sn_now_s() - g.t0;

    sn_pld_ctl own, *ctl = p->pld_ctl ? p->pld_ctl : &own;
    if (!p->pld_ctl) sn_pld_ctl_init(&own, po.adaptive);
    if (p->pld && (st = sn_rewind_of(seq, &rw)) != SN_OK) goto out;
    if (rw && (st = sn_rewind_reserve(rw, seq, 1 + po.max_lookup)) != SN_OK) goto out;
    int32_t id = gids[0], draft[SN_PLD_MAX_LOOKUP];
    int what;
    if ((st = emit(&g, g.greedy || g.dev ? NULL : logits, &id, &what)) != SN_OK) goto out;
    while (what == EMIT_MORE) {
        /* Tokens emitted but not yet in the state: the newest one (a
         * rollback keeps the accepted drafts in the state). */
        int at = sn_seq_pos(seq) - pos0, nf = g.n_hist - at, nd = 0, match = 0;
        if (rw && nf == 1) {
            int avail = p->max_tokens - res->completion_tokens;
            if (avail > g.ctx_left - res->completion_tokens) avail = g.ctx_left - res->completion_tokens;
            if (avail > po.max_lookup) avail = po.max_lookup;
            if (inv_rows != INT_MAX && avail > inv_rows - 1) avail = inv_rows - 1;
            nd = sn_pld_draft(g.hist, g.n_hist, po.ngram, avail, draft, &match);
            nd = sn_pld_ctl_choose(ctl, match, nd);
        }
        int32_t feed[2 * SN_PLD_MAX_LOOKUP + 2];
        memcpy(feed, g.hist + at, (size_t)nf * sizeof *feed);
        memcpy(feed + nf, draft, (size_t)nd * sizeof *feed);
        /* the verify pass records the recurrent state after each of its
         * tokens, so a rejection costs no recompute */
        if (nd && (st = sn_rewind_track(rw, seq, nf + nd)) != SN_OK) goto out;
        double tf = sn_now_s();
        if ((st = gen_forward(&g, seq, feed, nf + nd, true, nd, logits, gids)) != SN_OK) goto out;
        res->forward_calls++;
        tf = sn_now_s() - tf;
        /* row nf-1 predicts the token after the fed ones; row nf-1+i the
         * one after draft i-1: keep going while the sample is the draft */
        int acc = 0;
        id = gids[nd ? nf - 1 : 0];
        if ((st = emit(&g, g.greedy || g.dev ? NULL : nd ? logits + (size_t)(nf - 1) * vocab : logits, &id, &what)) !=
            SN_OK)
            goto out;
        /* an EOS is never part of the stream (nor of the state to keep),
         * even when the draft guessed it */
        while (acc < nd && id == draft[acc] && !is_eos(info, id)) {
            acc++;
            if (what != EMIT_MORE) break;
            id = gids[nf - 1 + acc];
            if ((st = emit(&g, g.greedy || g.dev ? NULL : logits + (size_t)(nf - 1 + acc) * vocab, &id, &what)) != SN_OK)
                goto out;
        }
        if (nd) {
            res->pld_drafted += nd;
            res->pld_accepted += acc;
            /* rejected drafts are in the state: back to the last accepted
             * token (the KV position cut, the recurrent state from the
             * pass's history); with none rejected this only ends the tracking */
            if ((st = sn_rewind_restore(rw, seq, sn_rewind_pos(rw) + nf + acc)) != SN_OK) goto out;
        }
        if (p->pld) sn_pld_ctl_observe(ctl, nf + nd, tf, match, nd, acc);
    }
    if (what == EMIT_CANCELLED) goto done;
    /* Natural end: release what the detokenizer and the stopper still hold. */
    if (!g.stopped) {
        g.dlen = 0;
        if ((st = sn_detok_flush(&g.dt, &g.dtext, &g.dlen, &g.dcap)) != SN_OK) goto out;
        if ((st = sn_stop_push(g.stop, g.dtext, g.dlen, &g.otext, &g.olen, &g.ocap, &g.stopped)) != SN_OK) goto out;
        if (!g.stopped && (st = sn_stop_flush(g.stop, &g.otext, &g.olen, &g.ocap)) != SN_OK) goto out;
    }
    res->decode_s = sn_now_s() - g.t_first;
    if (cb) {
        st = cb(p->ud, g.otext ? g.otext : "", g.olen, res->completion_tokens);
        if (st == SN_E_CANCELLED) { st = SN_OK; res->finish = SN_FINISH_CANCELLED; }
    }
    goto store;
done:
    if (g.t_first > 0) res->decode_s = sn_now_s() - g.t_first;
store:
    /* The state covers hist[0, pos - pos0): leave it for the next request. */
    if (st == SN_OK && pcr) st = sn_pcache_commit(pcr, seq, g.hist, g.n_hist);
out:
    free(logits);
    free(sched);
    free(g.hist);
    free(g.unusable);
    free(g.srows);
    free(g.edits);
    free(g.phase_end);
    free(g.dtext);
    free(g.otext);
    sn_sampler_free(g.smp);
    sn_stop_free(g.stop);
    sn_pcache_req_free(pcr);
    return st; /* rw belongs to seq */
}
