/* The generation loop (generate.h). */
#include "sanctum/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool is_eos(const sn_model_info *info, int32_t id)
{
    for (int i = 0; i < info->n_eos && i < 8; i++)
        if (info->eos_ids[i] == id) return true;
    return false;
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
    const sn_model_info *info = sn_model_get_info(m);
    int pos0 = sn_seq_pos(seq), max_ctx = sn_seq_max_ctx(seq);
    if (pos0 + n_prompt >= max_ctx)
        return SN_FAIL(SN_E_RANGE, "prompt is %d tokens (at position %d) but the context holds %d",
                       n_prompt, pos0, max_ctx);
    int vocab = info->vocab_size;
    sn_status st = SN_OK;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    sn_sampler *smp = NULL;
    sn_stopper *stop = NULL;
    char *dtext = NULL, *otext = NULL;
    size_t dlen = 0, dcap = 0, olen = 0, ocap = 0;
    sn_detok dt;
    sn_detok_init(&dt);
    double t_first = 0;
    int since_flush = 0;
    bool stopped = false;
    if (!logits) { st = SN_FAIL(SN_E_NOMEM, "generate: out of memory for %d logits", vocab); goto out; }
    if ((st = sn_sampler_new(&p->sample, vocab, &smp)) != SN_OK) goto out;
    if ((st = sn_stop_new(p->stops, p->n_stops, &stop)) != SN_OK) goto out;

    double t0 = now_s();
    int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 512;
    for (int i = 0; i < n_prompt; i += chunk) {
        int n = n_prompt - i < chunk ? n_prompt - i : chunk;
        bool last = i + n == n_prompt;
        if ((st = sn_forward(m, seq, prompt + i, n, last ? logits : NULL, false)) != SN_OK) goto out;
        res->prompt_tokens += n;
        if (!last && p->cancelled && p->cancelled(p->ud)) { res->finish = SN_FINISH_CANCELLED; goto done; }
    }
    res->prefill_s = now_s() - t0;
    /* mlx-lm's penalty history starts with the last prompt token. */
    sn_sampler_accept(smp, prompt[n_prompt - 1]);

    for (;;) {
        int32_t id;
        if ((st = sn_sampler_sample(smp, logits, &id)) != SN_OK) goto out;
        res->completion_tokens++;
        since_flush++;
        if (res->completion_tokens == 1) {
            t_first = now_s();
            res->first_token_s = t_first - t0;
        }
        if (is_eos(info, id)) { res->finish = SN_FINISH_STOP; break; }
        sn_sampler_accept(smp, id);
        dlen = 0;
        if ((st = sn_detok_push(&dt, tok, id, false, &dtext, &dlen, &dcap)) != SN_OK) goto out;
        if ((st = sn_stop_push(stop, dtext, dlen, &otext, &olen, &ocap, &stopped)) != SN_OK) goto out;
        if (stopped) { res->finish = SN_FINISH_STOP; break; }
        if (res->completion_tokens >= p->max_tokens || sn_seq_pos(seq) + 1 >= max_ctx) {
            res->finish = SN_FINISH_LENGTH;
            break;
        }
        /* The first token goes out at once (time to first token is what a
         * client feels); after that, every flush_tokens tokens. */
        if (since_flush >= p->flush_tokens || res->completion_tokens == 1) {
            since_flush = 0;
            st = cb ? cb(p->ud, otext ? otext : "", olen, res->completion_tokens) : SN_OK;
            olen = 0;
            if (st == SN_E_CANCELLED) { st = SN_OK; res->finish = SN_FINISH_CANCELLED; goto done; }
            if (st != SN_OK) goto out;
        }
        if (p->cancelled && p->cancelled(p->ud)) { res->finish = SN_FINISH_CANCELLED; goto done; }
        if ((st = sn_forward(m, seq, &id, 1, logits, false)) != SN_OK) goto out;
    }
    /* Natural end: release what the detokenizer and the stopper still hold. */
    if (!stopped) {
        dlen = 0;
        if ((st = sn_detok_flush(&dt, &dtext, &dlen, &dcap)) != SN_OK) goto out;
        if ((st = sn_stop_push(stop, dtext, dlen, &otext, &olen, &ocap, &stopped)) != SN_OK) goto out;
        if (!stopped && (st = sn_stop_flush(stop, &otext, &olen, &ocap)) != SN_OK) goto out;
    }
    res->decode_s = now_s() - t_first;
    if (cb) {
        st = cb(p->ud, otext ? otext : "", olen, res->completion_tokens);
        if (st == SN_E_CANCELLED) { st = SN_OK; res->finish = SN_FINISH_CANCELLED; }
    }
    goto out;
done:
    if (t_first > 0) res->decode_s = now_s() - t_first;
out:
    free(logits);
    free(dtext);
    free(otext);
    sn_sampler_free(smp);
    sn_stop_free(stop);
    return st;
}
