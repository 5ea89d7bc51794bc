/* Prompt lookup decoding: effective decode tokens/s with PLD against
 * without, on a copy-heavy task and on a task with nothing to copy.
 *
 *   --task copy    chat prompts "Repeat exactly: <text>" (the default
 *                  model's copy task; --words N words from its training word
 *                  list), or with --paragraph a paragraph to rewrite with one
 *                  change: the answer is mostly a copy of the prompt.
 *   --task random  random prompt ids, greedy continuation of a random or
 *                  trained model: nothing in the prompt to copy.
 *
 * Each prompt runs with PLD off, PLD on (adaptive draft length, the
 * default) and PLD on with the full draft every step; the three token
 * streams must be identical (checked: the run fails otherwise). The figure
 * is completion tokens after the first over decode seconds, summed over
 * the prompts, best of --reps rounds (the machine is shared); the ratios
 * are the median over rounds of each round's ratio (modes interleave
 * prompt by prompt, so a busy spell hits all three alike). Bound: with
 * acceptance a per draft token and d drafts a step emits 1 + a + ... + a^d
 * tokens for one forward of 1 + d rows; printed next to the measured ratio
 * as the forward-count ratio (forwards without / with PLD), which is the
 * speedup when a verify pass costs what a one-token step does (GPU-like).
 *
 * Usage: bench_pld --model DIR [--tokenizer PATH] --task copy|random [--n 8]
 *        [--words 8] [--prompt-len 256 (random task)] [--max-tokens 64] [--reps 3] [--threads N]
 *        [--backend cpu|cuda] [--log bench/results.log] [--cost-curve R: only print the forward cost of
 *        1..R rows] [--temperature T --top-p P --rep-penalty R: sampled at seed 1 instead of greedy; the
 *        modes' streams must still be identical] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "sanctum/chat.h"
#include "sanctum/generate.h"
#include "sanctum/model.h"
#include "sanctum/tokenizer.h"

static const char *WORDS[] = {
    "apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "orange", "peach", "pear", "plum", "berry",
    "red", "green", "blue", "yellow", "black", "white", "purple", "brown", "pink", "gray", "cat", "dog", "bird",
    "fish", "horse", "cow", "sheep", "goat", "mouse", "lion", "tiger", "bear", "wolf", "fox", "frog", "duck", "owl",
    "house", "tree", "river", "lake", "mountain", "forest", "city", "road", "bridge", "garden", "school", "window",
    "door", "table", "chair", "book", "pen", "paper", "letter", "music", "song", "story", "game", "ball", "card",
    "box", "cup", "glass", "plate", "spoon", "sun", "moon", "star", "cloud", "rain", "snow", "wind", "fire", "water",
    "stone", "sand", "happy", "small", "large", "quick", "slow", "bright", "dark", "warm", "cold", "soft", "loud",
    "quiet", "run", "walk", "jump", "read", "write", "sing", "play", "open", "close", "build", "find", "keep", "make",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct {
    int32_t ids[4096];
    int n;
} stream;

static void on_tok(void *ud, int32_t id)
{
    stream *s = ud;
    if (s->n < 4096) s->ids[s->n++] = id;
}

typedef struct {
    double decode_s;
    double cpu_s;      /* process CPU seconds of the whole call (prefill included) */
    long tokens, forwards, drafted, accepted;
} tally;

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Seconds of one forward of rows tokens at position ~n (best of 9): what a
 * verify pass costs against a one-token step on this machine. */
static double fwd_cost(sn_model *m, const int32_t *p, int n, int rows)
{
    sn_seq *seq = NULL;
    double best = 0;
    int vocab = sn_model_get_info(m)->vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)rows * (size_t)vocab);
    sn_snapshot *snap = NULL;
    if (!lg || sn_seq_new(m, n + rows + 8, &seq) != SN_OK || sn_forward(m, seq, p, n, NULL, false) != SN_OK ||
        sn_seq_snapshot(seq, &snap) != SN_OK)
        goto out;
    for (int r = 0; r < 9; r++) {
        if (sn_seq_restore(seq, snap) != SN_OK) goto out;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (sn_forward(m, seq, p, rows, lg, rows > 1) != SN_OK) goto out;
        clock_gettime(CLOCK_MONOTONIC, &b);
        double t = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        if (!best || t < best) best = t;
    }
out:
    sn_snapshot_free(snap);
    sn_seq_free(seq);
    free(lg);
    return best;
}

static sn_pld_ctl g_ctl[3];   /* per mode, kept across prompts as the server keeps one */
static float g_temp = 0.0f, g_top_p = 1.0f, g_rep = 0.0f; /* --temperature, --top-p, --rep-penalty */

static sn_status run(sn_model *m, const sn_tokenizer *tok, const int32_t *p, int n, int max_tokens, int mode,
                     stream *out, tally *t)
{
    sn_seq *seq = NULL;
    SN_TRY(sn_seq_new(m, n + max_tokens + 8, &seq));
    sn_gen_params gp;
    memset(&gp, 0, sizeof gp);
    sn_sample_params_default(&gp.sample);
    gp.sample.temperature = g_temp;
    gp.sample.top_p = g_top_p;
    gp.sample.repetition_penalty = g_rep;
    gp.sample.has_seed = true;
    gp.sample.seed = 1;
    gp.max_tokens = max_tokens;
    gp.flush_tokens = 8;
    gp.on_token = on_tok;
    gp.ud = out;
    gp.pld = mode > 0;
    gp.pld_opts = (sn_pld_opts){ .max_lookup = 5, .ngram = 3, .adaptive = mode == 1 };
    gp.pld_ctl = &g_ctl[mode];
    out->n = 0;
    sn_gen_result r;
    double c0 = cpu_now();
    sn_status st = sn_generate(m, tok, seq, p, n, &gp, NULL, &r);
    t->cpu_s += cpu_now() - c0;
    sn_seq_free(seq);
    if (st == SN_OK && r.completion_tokens > 1) {
        t->decode_s += r.decode_s;
        t->tokens += r.completion_tokens - 1;
        t->forwards += r.forward_calls;
        t->drafted += r.pld_drafted;
        t->accepted += r.pld_accepted;
    }
    return st;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *tok_path = NULL, *task = "copy", *log_path = "bench/results.log";
    int n_prompts = 8, words = 8, max_tokens = 64, reps = 3, threads = 0, prompt_len = 256, cost_curve = 0;
    sn_backend_kind backend = SN_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_pld: %s needs a value\n", k); return 2; }
        i++;
        if (!strcmp(k, "--model")) model_dir = v;
        else if (!strcmp(k, "--tokenizer")) tok_path = v;
        else if (!strcmp(k, "--task")) task = v;
        else if (!strcmp(k, "--n")) n_prompts = atoi(v);
        else if (!strcmp(k, "--words")) words = atoi(v);
        else if (!strcmp(k, "--max-tokens")) max_tokens = atoi(v);
        else if (!strcmp(k, "--prompt-len")) prompt_len = atoi(v);
        else if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else if (!strcmp(k, "--log")) log_path = v;
        else if (!strcmp(k, "--cost-curve")) cost_curve = atoi(v);
        else if (!strcmp(k, "--temperature")) g_temp = (float)atof(v);
        else if (!strcmp(k, "--top-p")) g_top_p = (float)atof(v);
        else if (!strcmp(k, "--rep-penalty")) g_rep = (float)atof(v);
        else if (!strcmp(k, "--backend")) backend = !strcmp(v, "cuda") ? SN_BACKEND_CUDA : SN_BACKEND_CPU;
        else { fprintf(stderr, "bench_pld: unknown option %s\n", k); return 2; }
    }
    bool copy = !strcmp(task, "copy");
    if (reps > 64) reps = 64;
    if (!model_dir || (!copy && strcmp(task, "random")) || n_prompts < 1 || n_prompts > 256 || words < 1 ||
        words > 400 || max_tokens < 2 || max_tokens > 4000 || reps < 1 || prompt_len < 1 || prompt_len > 32768) {
        fprintf(stderr, "usage: bench_pld --model DIR [--tokenizer PATH] --task copy|random [--n 1..256] [--words 1..400] "
                        "[--prompt-len N] [--max-tokens 2..4000] [--reps N] [--threads N] [--backend cpu|cuda] [--log FILE]\n");
        return 2;
    }
    sn_model *m = NULL;
    sn_tokenizer *tok = NULL;
    int rc = 1;
    sn_load_opts lo = { .backend = backend, .n_threads = threads };
    if (sn_model_load(model_dir, &lo, &m) != SN_OK || sn_tok_load(tok_path ? tok_path : model_dir, NULL, &tok) != SN_OK) {
        fprintf(stderr, "bench_pld: %s\n", sn_errmsg());
        goto out;
    }
    const sn_model_info *info = sn_model_get_info(m);
    int vocab = info->vocab_size < sn_tok_vocab_size(tok) ? info->vocab_size : sn_tok_vocab_size(tok);
    sn_chat_format fmt;
    if (copy && sn_chat_format_for(info->model_type, &fmt) != SN_OK) { fprintf(stderr, "bench_pld: %s\n", sn_errmsg()); goto out; }

    /* the prompts */
    double *ratio1 = NULL, *ratio2 = NULL;
    double cpu_rate[3][64];
    sn_ids *prompts = calloc((size_t)n_prompts, sizeof *prompts);
    stream *ref = malloc(sizeof *ref), *got = malloc(sizeof *got);
    if (!prompts || !ref || !got) goto done;
    for (int k = 0; k < n_prompts; k++) {
        if (copy) {
            char text[8192];
            size_t o = (size_t)snprintf(text, sizeof text, "Repeat exactly:");
            for (int w = 0; w < words && o < sizeof text - 32; w++)
                o += (size_t)snprintf(text + o, sizeof text - o, " %s", WORDS[next_rand() % N_WORDS]);
            sn_chat_msg msg = { .role = "user", .content = text };
            sn_chat_opts co = { .add_generation_prompt = true };
            if (sn_chat_encode(tok, fmt, &msg, 1, &co, &prompts[k]) != SN_OK) { fprintf(stderr, "bench_pld: %s\n", sn_errmsg()); goto done; }
        } else {
            for (int i = 0; i < prompt_len; i++)
                if (sn_ids_push(&prompts[k], (int32_t)(next_rand() % (uint64_t)vocab)) != SN_OK) goto done;
        }
    }
    fprintf(stderr, "bench_pld: %s (%s, %d layers), task %s, %d prompts, max_tokens %d\n", info->name,
            info->model_type, info->n_layers, task, n_prompts, max_tokens);
    for (int mode = 0; mode < 3; mode++) sn_pld_ctl_init(&g_ctl[mode], mode == 1);
    double c1 = fwd_cost(m, prompts[0].ids, (int)prompts[0].n, 1), c6 = fwd_cost(m, prompts[0].ids, (int)prompts[0].n, 6);
    fprintf(stderr, "  forward cost: 1 row %.2f ms, 6 rows %.2f ms (%.2fx)\n", c1 * 1e3, c6 * 1e3, c1 > 0 ? c6 / c1 : 0);
    if (cost_curve > 0) {
        /* what a verify pass costs by its rows (graphs on a CUDA backend), then stop */
        printf("bench_pld %s: forward cost by rows (best of 9, position %zu):", info->name, prompts[0].n);
        for (int r = 1; r <= cost_curve && r <= 64; r++)
            printf(" %d: %.3f ms%s", r, fwd_cost(m, prompts[0].ids, (int)prompts[0].n, r) * 1e3, r < cost_curve ? "," : "\n");
        rc = 0;
        goto done;
    }
    double best[3] = { 0, 0, 0 };
    ratio1 = calloc((size_t)reps, sizeof(double));
    ratio2 = calloc((size_t)reps, sizeof(double));
    tally last[3];
    if (!ratio1 || !ratio2) goto done;
    for (int rep = 0; rep < reps; rep++) {
        tally t[4];
        memset(t, 0, sizeof t);
        for (int k = 0; k < n_prompts; k++) {
            /* the same prompt with max_tokens 1: its CPU time is the prefill
             * share, subtracted below to leave decode CPU time */
            if (run(m, tok, prompts[k].ids, (int)prompts[k].n, 2, 0, got, &t[3]) != SN_OK) {
                fprintf(stderr, "bench_pld: %s\n", sn_errmsg());
                goto done;
            }
            for (int mode = 0; mode < 3; mode++) {
                stream *s = mode == 0 ? ref : got;
                if (run(m, tok, prompts[k].ids, (int)prompts[k].n, max_tokens, mode, s, &t[mode]) != SN_OK) {
                    fprintf(stderr, "bench_pld: %s\n", sn_errmsg());
                    goto done;
                }
                if (mode && (s->n != ref->n || memcmp(s->ids, ref->ids, sizeof(int32_t) * (size_t)ref->n))) {
                    fprintf(stderr, "bench_pld: prompt %d: PLD mode %d changed the tokens: refusing to time it\n", k, mode);
                    goto done;
                }
            }
        }
        for (int mode = 0; mode < 3; mode++) {
            double rate = t[mode].decode_s > 0 ? t[mode].tokens / t[mode].decode_s : 0;
            if (rate > best[mode]) best[mode] = rate;
            last[mode] = t[mode];
        }
        ratio1[rep] = (t[1].tokens / t[1].decode_s) / (t[0].tokens / t[0].decode_s);
        ratio2[rep] = (t[2].tokens / t[2].decode_s) / (t[0].tokens / t[0].decode_s);
        /* CPU-time view: immune to other processes taking the cores. The
         * max_tokens-2 runs hold the prefill plus one decode step, so one
         * token per prompt is taken off the count as well. */
        double pre = t[3].cpu_s;
        long dtok = t[0].tokens - n_prompts;
        for (int md = 0; md < 3; md++) cpu_rate[md][rep] = dtok > 0 ? dtok / (t[md].cpu_s - pre) : 0;
        fprintf(stderr, "  round %d: off %.1f tok/s, pld %.1f tok/s, pld-full %.1f tok/s\n", rep,
                t[0].tokens / t[0].decode_s, t[1].tokens / t[1].decode_s, t[2].tokens / t[2].decode_s);
    }
    qsort(ratio1, (size_t)reps, sizeof(double), bench_cmp_double);
    qsort(ratio2, (size_t)reps, sizeof(double), bench_cmp_double);
    double med1 = ratio1[reps / 2], med2 = ratio2[reps / 2];
    double cr[3];
    for (int md = 0; md < 3; md++) {
        qsort(cpu_rate[md], (size_t)reps, sizeof(double), bench_cmp_double);
        cr[md] = cpu_rate[md][reps / 2];
    }
    char line[1024], samp[160] = "";
    if (g_temp > 0.0f || g_rep != 0.0f) {
        bool dev_ok = true; /* (an invalid value already failed the runs) */
        (void)sn_sample_device_allowed(&dev_ok);
        snprintf(samp, sizeof samp, " sampled (T %g, top_p %g, repetition penalty %g, seed 1, draws %s)", g_temp,
                 g_top_p, g_rep, dev_ok ? "where the backend draws" : "on the host");
    }
    double acc1 = last[1].drafted ? (double)last[1].accepted / last[1].drafted : 0;
    double acc2 = last[2].drafted ? (double)last[2].accepted / last[2].drafted : 0;
    snprintf(line, sizeof line,
             "bench_pld %s (%s, %d layers, %s, %d threads) task=%s%s%s: decode %.1f tok/s without PLD, %.1f with "
             "(%.2fx; adaptive: %ld drafted, %.0f%% accepted), %.1f with full drafts (%.2fx; %.0f%% accepted, "
             "forwards %ld vs %ld: %.2fx bound at a flat verify cost, %.2fx at this machine's 6-row/1-row cost %.2f); per CPU-second: %.2f, %.2f (%.2fx), %.2f (%.2fx) "
             "decode tok/cpu-s; %ld tokens identical in all modes",
             info->name, info->model_type, info->n_layers, backend == SN_BACKEND_CUDA ? "cuda" : "cpu", threads, task,
             copy ? (words > 8 ? " (long copy)" : "") : "", samp, best[0], best[1], med1, last[1].drafted,
             acc1 * 100, best[2], med2, acc2 * 100, last[2].forwards, last[0].forwards,
             last[2].forwards ? (double)last[0].forwards / last[2].forwards : 0,
             last[2].forwards && c1 > 0 ? (double)last[0].forwards / last[2].forwards / (c6 / c1) : 0, c1 > 0 ? c6 / c1 : 0, cr[0], cr[1], cr[1] / cr[0], cr[2],
             cr[2] / cr[0], last[0].tokens + n_prompts);
    printf("%s\n", line);
    bench_log_line(log_path, line, argc, argv);
    rc = 0;
done:
    free(ratio1);
    free(ratio2);
    for (int k = 0; prompts && k < n_prompts; k++) sn_ids_free(&prompts[k]);
    free(prompts);
    free(ref);
    free(got);
out:
    sn_tok_free(tok);
    sn_model_free(m);
    return rc;
}
