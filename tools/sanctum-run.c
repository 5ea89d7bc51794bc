/* sanctum-run: the engine from the command line. One prompt in, tokens out.
 *
 *   sanctum-run [--model DIR] --prompt TEXT [--raw]      chat template + tokenizer
 *   sanctum-run [--model DIR] --ids 1,2,3 [--print-ids]  token ids, no tokenizer needed
 *   sanctum-run --tokenizer FILE --encode < text         print the ids of stdin
 *
 * Generated text goes to stdout (or the generated ids with --print-ids);
 * prefill and decode speeds go to stderr. Errors are one line on stderr and
 * a non-zero exit. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sanctum/chat.h"
#include "sanctum/model.h"
#include "sanctum/sample.h"
#include "sanctum/tokenizer.h"

typedef struct {
    const char *model, *prompt, *ids, *tokenizer;
    bool raw, print_ids, encode, has_seed;
    int max_tokens, threads, gpu, quantize, ctx;
    float temperature, top_p, rep_penalty;
    unsigned long long seed;
    sn_backend_kind backend;
    sn_weights_mode weights;
    sn_precision precision;
} args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sanctum-run [--model DIR] (--prompt TEXT [--raw] | --ids 1,2,3) [options]\n"
            "       sanctum-run --tokenizer FILE --encode < text\n"
            "options:\n"
            "  --model DIR        model directory (default models/default)\n"
            "  --prompt TEXT      user message, rendered with the model's chat template\n"
            "  --raw              encode --prompt as is, without the chat template\n"
            "  --ids LIST         prompt as comma-separated token ids\n"
            "  --print-ids        print the generated ids (space-separated) instead of text\n"
            "  --max-tokens N     tokens to generate (default 128)\n"
            "  --temperature T    0 = greedy (default 0)\n"
            "  --top-p P          nucleus sampling, in (0, 1] (default 1: off)\n"
            "  --repetition-penalty R  over the last 20 tokens (default 0: off)\n"
            "  --seed S           sampling seed\n"
            "  --threads N        CPU threads (default: one per core)\n"
            "  --backend cpu|cuda compute backend (default cpu)\n"
            "  --gpu N            CUDA device (default 0)\n"
            "  --quantize 4|8     quantize a raw (unquantized) checkpoint at load\n"
            "  --weights auto|mmap|copy  weights read from the file mappings, or copied into\n"
            "                     memory in huge pages (default auto: copy on the CPU backend\n"
            "                     when they fit in available memory with 2 GB to spare)\n"
            "  --precision exact|fast  activations of quantized products: exact (default,\n"
            "                     fp32-class) or fast (CPU: 8-bit; CUDA: prefill GEMMs on fp16 x)\n"
            "  --ctx N            context length (default: prompt + max tokens)\n");
}

static int parse_int(const char *s, const char *what, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "sanctum-run: %s: bad value '%s' (expected an integer in [%ld, %ld])\n", what, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){ .model = "models/default", .max_tokens = 128, .top_p = 1.0f, .backend = SN_BACKEND_CPU };
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) { fprintf(stderr, "sanctum-run: %s needs a value\n", k); return -1; } i++; } while (0)
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) { usage(stdout); exit(0); }
        else if (!strcmp(k, "--raw")) a->raw = true;
        else if (!strcmp(k, "--print-ids")) a->print_ids = true;
        else if (!strcmp(k, "--encode")) a->encode = true;
        else if (!strcmp(k, "--model")) { NEEDV(); a->model = v; }
        else if (!strcmp(k, "--prompt")) { NEEDV(); a->prompt = v; }
        else if (!strcmp(k, "--ids")) { NEEDV(); a->ids = v; }
        else if (!strcmp(k, "--tokenizer")) { NEEDV(); a->tokenizer = v; }
        else if (!strcmp(k, "--max-tokens")) { NEEDV(); if (parse_int(v, k, 0, 1 << 24, &a->max_tokens)) return -1; }
        else if (!strcmp(k, "--threads")) { NEEDV(); if (parse_int(v, k, 0, 1024, &a->threads)) return -1; }
        else if (!strcmp(k, "--gpu")) { NEEDV(); if (parse_int(v, k, 0, 64, &a->gpu)) return -1; }
        else if (!strcmp(k, "--ctx")) { NEEDV(); if (parse_int(v, k, 1, 1 << 24, &a->ctx)) return -1; }
        else if (!strcmp(k, "--quantize")) {
            NEEDV();
            if (parse_int(v, k, 4, 8, &a->quantize) || (a->quantize != 4 && a->quantize != 8)) {
                fprintf(stderr, "sanctum-run: --quantize: expected 4 or 8, got '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(k, "--temperature")) {
            NEEDV();
            char *end;
            a->temperature = strtof(v, &end);
            if (end == v || *end || !(a->temperature >= 0) || a->temperature > 100) {
                fprintf(stderr, "sanctum-run: --temperature: bad value '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(k, "--top-p") || !strcmp(k, "--repetition-penalty")) {
            NEEDV();
            char *end;
            float f = strtof(v, &end);
            if (end == v || *end || !isfinite(f)) {
                fprintf(stderr, "sanctum-run: %s: bad value '%s'\n", k, v);
                return -1;
            }
            *(!strcmp(k, "--top-p") ? &a->top_p : &a->rep_penalty) = f; /* ranges: sn_sample_params_check */
        } else if (!strcmp(k, "--seed")) {
            NEEDV();
            char *end;
            errno = 0;
            a->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end) { fprintf(stderr, "sanctum-run: --seed: bad value '%s'\n", v); return -1; }
            a->has_seed = true;
        } else if (!strcmp(k, "--weights")) {
            NEEDV();
            if (!sn_weights_mode_parse(v, &a->weights)) {
                fprintf(stderr, "sanctum-run: --weights: expected auto, mmap or copy, got '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(k, "--precision")) {
            NEEDV();
            if (!sn_precision_parse(v, &a->precision)) {
                fprintf(stderr, "sanctum-run: --precision: expected exact or fast, got '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(k, "--backend")) {
            NEEDV();
            if (!strcmp(v, "cpu")) a->backend = SN_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) a->backend = SN_BACKEND_CUDA;
            else { fprintf(stderr, "sanctum-run: --backend: expected cpu or cuda, got '%s'\n", v); return -1; }
        } else {
            fprintf(stderr, "sanctum-run: unknown option '%s' (see --help)\n", k);
            return -1;
        }
#undef NEEDV
    }
    if (a->encode) {
        if (!a->tokenizer) { fprintf(stderr, "sanctum-run: --encode needs --tokenizer FILE\n"); return -1; }
        return 0;
    }
    if (!!a->prompt == !!a->ids) { fprintf(stderr, "sanctum-run: give exactly one of --prompt or --ids\n"); return -1; }
    return 0;
}

static int parse_ids(const char *s, sn_ids *out)
{
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "sanctum-run: --ids: bad id list at '%s'\n", p);
            return -1;
        }
        if (sn_ids_push(out, (int32_t)v) != SN_OK) { fprintf(stderr, "sanctum-run: out of memory\n"); return -1; }
        p = *end ? end + 1 : end;
    }
    if (!out->n) { fprintf(stderr, "sanctum-run: --ids: empty list\n"); return -1; }
    return 0;
}

static int g_load_pct = -1;  /* progress shown on the terminal, -1: none */

static int fail(const char *what, sn_status s)
{
    if (g_load_pct >= 0 && g_load_pct < 100) fprintf(stderr, "\r\033[K"); /* the error replaces the bar */
    fprintf(stderr, "sanctum-run: %s: %s (%s)\n", what, sn_errmsg(), sn_status_name(s));
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run_encode(const args *a)
{
    sn_tokenizer *tok = NULL;
    sn_status s = sn_tok_load(a->tokenizer, NULL, &tok);
    if (s != SN_OK) return fail("loading tokenizer", s);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int rc = 1;
    sn_ids ids = { 0 };
    if (!buf) { fprintf(stderr, "sanctum-run: out of memory\n"); goto out; }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { fprintf(stderr, "sanctum-run: out of memory\n"); goto out; }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) break;
    }
    if ((s = sn_tok_encode(tok, buf, n, true, &ids)) != SN_OK) { rc = fail("encoding stdin", s); goto out; }
    for (size_t i = 0; i < ids.n; i++) printf("%s%d", i ? " " : "", ids.ids[i]);
    printf("\n");
    rc = 0;
out:
    sn_ids_free(&ids);
    free(buf);
    sn_tok_free(tok);
    return rc;
}

/* Load progress on a terminal: one line rewritten in place, cleared at the end. */
static void load_progress(void *ud, double frac)
{
    int *last = ud;
    int pct = (int)(frac * 100.0);
    if (pct < 0) pct = 0;
    if (pct == *last) return;
    *last = pct;
    if (pct >= 100) fprintf(stderr, "\r\033[K");
    else fprintf(stderr, "\rsanctum-run: loading %d%%", pct);
    fflush(stderr);
}

/* A sampled forward where the backend draws (CUDA): the sampler's row for
 * the last position goes with the tokens and only the drawn id returns,
 * as in sn_generate; otherwise the last row's logits. */
typedef struct {
    bool on;
    sn_sample_row row;
    sn_logit_edit *edits;
    int32_t *phase_end;
} dev_draw;

static sn_status sampled_forward(sn_model *m, sn_seq *seq, sn_sampler *smp, dev_draw *dd, const int32_t *t, int n,
                                 float *logits, int32_t *next)
{
    if (!dd->on) return sn_forward(m, seq, t, n, logits, false);
    SN_TRY(sn_sampler_device_rows(smp, NULL, 1, n - 1, NULL, 0, dd->edits, dd->phase_end, &dd->row));
    sn_batch_item b = { .seq = seq, .tokens = t, .n = n, .next_id = next, .sample = &dd->row, .n_sample = 1 };
    return sn_forward_batch(m, &b, 1);
}

static bool is_eos(const sn_model_info *in, int32_t id)
{
    for (int i = 0; i < in->n_eos; i++)
        if (in->eos_ids[i] == id) return true;
    return false;
}

int main(int argc, char **argv)
{
    args a;
    if (parse_args(argc, argv, &a)) return 2;
    if (a.encode) return run_encode(&a);

    int rc = 1;
    sn_status s;
    sn_model *m = NULL;
    sn_seq *seq = NULL;
    sn_tokenizer *tok = NULL;
    sn_sampler *smp = NULL;
    sn_ids prompt = { 0 }, gen = { 0 };
    float *logits = NULL;
    dev_draw dd = { 0 };
    char *text = NULL, *dtext = NULL;
    size_t dlen = 0, dcap = 0;

    sn_load_opts lo = { .backend = a.backend, .gpu = a.gpu, .n_threads = a.threads, .quantize_bits = a.quantize,
                        .weights = a.weights, .precision = a.precision };
    if (isatty(2)) {
        lo.progress = load_progress;
        lo.progress_ud = &g_load_pct;
    }
    double t0 = now_s();
    if ((s = sn_model_load(a.model, &lo, &m)) != SN_OK) { rc = fail("loading model", s); goto out; }
    const sn_model_info *info = sn_model_get_info(m);
    fprintf(stderr, "sanctum-run: loaded %s (%s, %s layout, %d layers; weights %s, precision %s) in %.2f s\n",
            info->name, info->model_type, info->mlx_layout ? "MLX" : "HF", info->n_layers,
            info->weights_copied ? "copied into memory" : "mapped",
            sn_precision_name(info->precision), now_s() - t0);

    /* The tokenizer is optional with --ids: then only ids come out. */
    if (a.prompt || !a.print_ids) {
        if ((s = sn_tok_load(a.model, info->model_type, &tok)) != SN_OK) {
            if (a.prompt) { rc = fail("loading tokenizer", s); goto out; }
            tok = NULL;
            a.print_ids = true;
        }
    }
    /* A tokenizer from another model can encode ids past the embedding:
     * the forward pass would refuse them, but only the first one it meets
     * and without saying why; say it once, before anything runs. */
    if (tok && a.prompt && sn_tok_vocab_size(tok) > info->vocab_size) {
        fprintf(stderr, "sanctum-run: %s: the tokenizer has %d ids but the model's embedding has %d rows "
                "(tokenizer of another model?)\n", a.model, sn_tok_vocab_size(tok), info->vocab_size);
        rc = 1;
        goto out;
    }
    if (a.ids) {
        if (parse_ids(a.ids, &prompt)) { rc = 2; goto out; }
    } else {
        const char *src = a.prompt;
        if (!a.raw) {
            sn_chat_format f;
            if ((s = sn_chat_format_for(info->model_type, &f)) != SN_OK) { rc = fail("chat template", s); goto out; }
            sn_chat_msg msg = { .role = "user", .content = a.prompt };
            sn_chat_opts co = { .add_generation_prompt = true, .enable_thinking = false };
            if ((s = sn_chat_render(f, &msg, 1, &co, &text)) != SN_OK) { rc = fail("rendering chat template", s); goto out; }
            src = text;
        }
        if ((s = sn_tok_encode(tok, src, strlen(src), true, &prompt)) != SN_OK) { rc = fail("encoding prompt", s); goto out; }
        if (!prompt.n) { fprintf(stderr, "sanctum-run: the prompt encodes to no tokens\n"); rc = 2; goto out; }
    }

    /* Default context: prompt + max tokens, but no further than the model's
     * max_position_embeddings (past it RoPE positions are untrained, and a
     * huge --max-tokens would otherwise size the KV cache by itself); the
     * loop below stops when the context is full. */
    int64_t want = (int64_t)prompt.n + a.max_tokens + 1, cap = info->max_ctx > 0 ? info->max_ctx : want;
    if (cap < (int64_t)prompt.n + 1) cap = (int64_t)prompt.n + 1;
    if (want > cap) want = cap;
    if (!a.ctx && want > INT32_MAX) {
        fprintf(stderr, "sanctum-run: the prompt (%zu tokens) is too long\n", prompt.n);
        rc = 2;
        goto out;
    }
    int ctx = a.ctx ? a.ctx : (int)want;
    if ((s = sn_seq_new(m, ctx, &seq)) != SN_OK) { rc = fail("creating sequence", s); goto out; }
    sn_sample_params sp;
    sn_sample_params_default(&sp);
    sp.temperature = a.temperature;
    sp.top_p = a.top_p;
    sp.repetition_penalty = a.rep_penalty;
    sp.has_seed = a.has_seed;
    sp.seed = a.seed;
    if ((s = sn_sampler_new(&sp, info->vocab_size, &smp)) != SN_OK) { rc = fail("sampler", s); goto out; }
    logits = malloc((size_t)info->vocab_size * sizeof *logits);
    if (!logits) { fprintf(stderr, "sanctum-run: out of memory\n"); goto out; }

    /* Greedy runs ask only for the next id: on CUDA the argmax stays on the
     * device and a decode step replays as one graph. */
    bool greedy = sn_sampler_is_greedy(smp);
    /* Sampled runs draw on the backend where it can (SANCTUM_SAMPLE_DEVICE=0:
     * on the host), so no logits cross per token either. */
    bool dev_ok;
    if (sn_sample_device_allowed(&dev_ok) != SN_OK) {
        fprintf(stderr, "sanctum-run: %s\n", sn_errmsg());
        rc = 2;
        goto out;
    }
    dd.on = !greedy && sn_model_can_sample(m) && dev_ok;
    if (dd.on) {
        dd.edits = malloc((size_t)sn_sampler_edit_cap(smp) * sizeof *dd.edits);
        dd.phase_end = malloc((size_t)sn_sampler_phase_cap(smp) * sizeof *dd.phase_end);
        if (!dd.edits || !dd.phase_end) { fprintf(stderr, "sanctum-run: out of memory\n"); goto out; }
    }
    /* the penalty window starts with the last prompt token, before the
     * prefill (a draw on the backend happens inside it), as sn_generate */
    sn_sampler_accept(smp, prompt.ids[prompt.n - 1]);
    int32_t next = -1;
    double tp = now_s();
    if (greedy) s = sn_forward_greedy(m, seq, prompt.ids, (int)prompt.n, &next);
    else s = sampled_forward(m, seq, smp, &dd, prompt.ids, (int)prompt.n, logits, &next);
    if (s != SN_OK) { rc = fail("prefill", s); goto out; }
    double prefill_s = now_s() - tp;

    sn_detok dt;
    sn_detok_init(&dt);
    double td = now_s();
    int n_dec = 0;
    for (int i = 0; i < a.max_tokens; i++) {
        int32_t id = next;
        if (dd.on) sn_sampler_took_draw(smp);
        else if (!greedy && (s = sn_sampler_sample(smp, logits, &id)) != SN_OK) { rc = fail("sampling", s); goto out; }
        sn_sampler_accept(smp, id);
        if (sn_ids_push(&gen, id) != SN_OK) { fprintf(stderr, "sanctum-run: out of memory\n"); goto out; }
        bool eos = is_eos(info, id);
        /* Models pad their embedding past the tokenizer (models/default:
         * 1728 rows, 1702 ids), so sampling can pick an id the tokenizer
         * lacks; like Hugging Face's decode, it shows nothing instead of
         * ending the run with a detokenizer error. */
        size_t plen;
        bool known = tok && sn_tok_piece(tok, id, &plen) != NULL;
        if (!a.print_ids && !eos && known) {
            dlen = 0;
            if ((s = sn_detok_push(&dt, tok, id, false, &dtext, &dlen, &dcap)) != SN_OK) { rc = fail("detokenizing", s); goto out; }
            fwrite(dtext, 1, dlen, stdout);
            fflush(stdout);
        }
        if (eos || i + 1 == a.max_tokens || sn_seq_pos(seq) >= sn_seq_max_ctx(seq)) break;
        if (greedy) s = sn_forward_greedy(m, seq, &id, 1, &next);
        else s = sampled_forward(m, seq, smp, &dd, &id, 1, logits, &next);
        if (s != SN_OK) { rc = fail("decode", s); goto out; }
        n_dec++;
    }
    double decode_s = now_s() - td;
    if (a.print_ids) {
        for (size_t i = 0; i < gen.n; i++) printf("%s%d", i ? " " : "", gen.ids[i]);
        printf("\n");
    } else {
        dlen = 0;
        if ((s = sn_detok_flush(&dt, &dtext, &dlen, &dcap)) != SN_OK) { rc = fail("detokenizing", s); goto out; }
        fwrite(dtext, 1, dlen, stdout);
        printf("\n");
    }
    fprintf(stderr, "sanctum-run: prefill %zu tokens in %.3f s (%.1f tok/s); decode %d tokens in %.3f s (%.2f tok/s)\n",
            prompt.n, prefill_s, prefill_s > 0 ? (double)prompt.n / prefill_s : 0.0, n_dec, decode_s,
            decode_s > 0 ? n_dec / decode_s : 0.0);
    rc = 0;
out:
    free(dtext);
    free(text);
    free(logits);
    free(dd.edits);
    free(dd.phase_end);
    sn_ids_free(&gen);
    sn_ids_free(&prompt);
    sn_sampler_free(smp);
    sn_seq_free(seq);
    sn_tok_free(tok);
    sn_model_free(m);
    return rc;
}
