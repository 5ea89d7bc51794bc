/* Prompt cache: time to first token for a request that shares a long
 * prefix with a cached one, against the same request cold.
 *
 * Cold: a fresh pool; prompt = prefix (--prefix tokens) + a tail (--tail
 * tokens); the pool stores it (checkpoints every 256 tokens and at the
 * end). Warm: --reps requests with the same prefix and a different tail
 * each, so each one resumes from the checkpoint at the end of the shared
 * prefix and computes only its tail. Every request runs through
 * sn_generate (max_tokens 1), i.e. the server's path.
 *
 * Estimate printed with the figures: the tail's share of a cold prefill
 * (tail x cold seconds per token) + copying the restored state (KV rows of
 * the prefix + one recurrent checkpoint) at the measured memcpy rate (on
 * CUDA with the pool in device memory that copy is device to device and
 * left out of the estimate, so it is the tail alone). Not a strict bound: a cold run also carries the per-chunk overheads. The
 * issue's goal is <= 30 ms warm for a 2k prefix on an H200; the CPU figure
 * is for comparison with cold on the same machine.
 *
 * Then one more warm request runs through the pool API step by step (what
 * sn_generate does) and a second line gives its breakdown: sn_pcache_begin
 * (lookup + restore; on CUDA with the pool in device memory the restore
 * copies are only queued there and run ahead of the first forward, so
 * their device time shows in the tail prefill), the tail prefill, the
 * checkpoint taken at the prompt end, the first token (argmax of the last
 * logits) and the commit that follows it; plus the pool's own timers
 * averaged over the warm reps. Where the pool lives follows
 * sn_pcache_opts.store (SANCTUM_PCACHE_STORE=host|backend to compare).
 *
 * Usage: bench_pcache --model DIR --tokenizer FILE [--prefix 2048] [--tail 32]
 *        [--reps 3] [--threads N] [--backend cpu|cuda] [--log bench/results.log]
 * (bench/bench_pcache.sh makes a ~1B model with sanctum-synth and runs it.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "sanctum/generate.h"
#include "sanctum/model.h"
#include "sanctum/prompt_cache.h"
#include "sanctum/tokenizer.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static int32_t rand_id(int hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int32_t)(rng % (uint64_t)hi);
}

static double memcpy_gbs(void)
{
    size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        double t = bench_now();
        memcpy(b, a, n);
        t = bench_now() - t;
        if (t < best) best = t;
    }
    volatile char sink = b[n / 2];
    (void)sink;
    free(a);
    free(b);
    return n / best / 1e9;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *tok_path = NULL, *log_path = "bench/results.log";
    int prefix = 2048, tail = 32, reps = 3, threads = 0;
    sn_backend_kind backend = SN_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_pcache: %s needs a value\n", k); return 2; }
        i++;
        if (!strcmp(k, "--model")) model_dir = v;
        else if (!strcmp(k, "--tokenizer")) tok_path = v;
        else if (!strcmp(k, "--prefix")) prefix = atoi(v);
        else if (!strcmp(k, "--tail")) tail = atoi(v);
        else if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else if (!strcmp(k, "--log")) log_path = v;
        else if (!strcmp(k, "--backend")) backend = !strcmp(v, "cuda") ? SN_BACKEND_CUDA : SN_BACKEND_CPU;
        else { fprintf(stderr, "bench_pcache: unknown option %s\n", k); return 2; }
    }
    if (!model_dir || !tok_path || prefix < 16 || tail < 1 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_pcache --model DIR --tokenizer FILE [--prefix N>=16] [--tail N>=1] [--reps 1..64] "
                        "[--threads N] [--backend cpu|cuda] [--log FILE]\n");
        return 2;
    }
    sn_model *m = NULL;
    sn_tokenizer *tok = NULL;
    sn_seq *seq = NULL;
    sn_pcache *pc = NULL;
    float *logits = NULL;
    int rc = 1;
    sn_load_opts lo = { .backend = backend, .n_threads = threads };
    if (sn_model_load(model_dir, &lo, &m) != SN_OK || sn_tok_load(tok_path, NULL, &tok) != SN_OK) {
        fprintf(stderr, "bench_pcache: %s\n", sn_errmsg());
        goto out;
    }
    const sn_model_info *info = sn_model_get_info(m);
    int vocab = info->vocab_size < sn_tok_vocab_size(tok) ? info->vocab_size : sn_tok_vocab_size(tok);
    int n = prefix + tail;
    if (sn_seq_new(m, n + 8, &seq) != SN_OK) { fprintf(stderr, "bench_pcache: %s\n", sn_errmsg()); goto out; }
    sn_pcache_opts po;
    sn_pcache_opts_default(&po);
    po.budget_bytes = (size_t)4 << 30;
    if (sn_pcache_new(m, &po, &pc) != SN_OK) { fprintf(stderr, "bench_pcache: %s\n", sn_errmsg()); goto out; }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    double *warm = calloc((size_t)reps, sizeof *warm);
    if (!ids || !warm) { free(ids); free(warm); goto out; }
    for (int i = 0; i < n; i++) ids[i] = rand_id(vocab);
    sn_gen_params gp;
    memset(&gp, 0, sizeof gp);
    sn_sample_params_default(&gp.sample);
    gp.max_tokens = 1;
    gp.flush_tokens = 1;
    gp.pcache = pc;
    sn_gen_result r;

    fprintf(stderr, "bench_pcache: %s (%s, %d layers), prefix %d + tail %d tokens, %d warm reps\n", info->name,
            info->model_type, info->n_layers, prefix, tail, reps);
    if (sn_generate(m, tok, seq, ids, n, &gp, NULL, &r) != SN_OK) { fprintf(stderr, "bench_pcache: %s\n", sn_errmsg()); goto done; }
    double cold = r.first_token_s;
    fprintf(stderr, "  cold: TTFT %.1f ms (%d tokens computed, %.1f tok/s)\n", cold * 1e3, r.prompt_tokens,
            r.prompt_tokens / cold);
    sn_pcache_stats st, st0;
    sn_pcache_get_stats(pc, &st0);
    int cached = 0;
    for (int k = 0; k < reps; k++) {
        for (int i = prefix; i < n; i++) ids[i] = rand_id(vocab);
        sn_seq_reset(seq);
        if (sn_generate(m, tok, seq, ids, n, &gp, NULL, &r) != SN_OK) { fprintf(stderr, "bench_pcache: %s\n", sn_errmsg()); goto done; }
        warm[k] = r.first_token_s;
        cached = r.cached_tokens;
        fprintf(stderr, "  warm %d: TTFT %.1f ms (%d cached, %d computed)\n", k, warm[k] * 1e3, r.cached_tokens,
                r.prompt_tokens - r.cached_tokens);
    }
    sn_pcache_get_stats(pc, &st);
    /* the pool's timers per warm request */
    double avg_lookup = (st.lookup_s - st0.lookup_s) / reps, avg_restore = (st.restore_s - st0.restore_s) / reps;
    double avg_capture = (st.capture_s - st0.capture_s) / reps, avg_commit = (st.commit_s - st0.commit_s) / reps;
    qsort(warm, (size_t)reps, sizeof *warm, bench_cmp_double);
    double med = warm[reps / 2];
    /* estimate: the tail at the cold per-token rate + copying the restored
     * state (KV rows + one recurrent checkpoint; measured at the end of the
     * last warm prompt, so a few tail rows too many) */
    size_t state_bytes = sn_seq_state_bytes(seq);
    double gbs = memcpy_gbs();
    bool d2d = backend == SN_BACKEND_CUDA && st.backend_bytes > 0;
    double bound = (double)(n - cached) * cold / n + (gbs > 0 && !d2d ? state_bytes / (gbs * 1e9) : 0);
    char line[1024];
    snprintf(line, sizeof line,
             "bench_pcache %s (%s, %d layers, %s, %d threads): prefix %d + tail %d: TTFT cold %.1f ms, warm median "
             "%.1f ms (%.1fx, %d cached) vs estimate %.1f ms (tail at the cold rate + %.1f MB state %s %.1f GB/s memcpy); "
             "pool %llu entries %.1f MB (store %s, %.1f MB in backend memory, %llu host fallbacks)",
             info->name, info->model_type, info->n_layers, backend == SN_BACKEND_CUDA ? "cuda" : "cpu", threads, prefix,
             tail, cold * 1e3, med * 1e3, cold / med, cached, bound * 1e3, state_bytes / 1e6,
             d2d ? "device to device, not counted; host" : "at", gbs,
             (unsigned long long)st.entries, st.bytes / 1e6, st.backend_bytes ? "backend" : "host",
             st.backend_bytes / 1e6, (unsigned long long)st.host_fallbacks);
    printf("%s\n", line);
    bench_log_line(log_path, line, argc, argv);

    /* breakdown: one more warm request, sn_generate's steps timed one by one */
    logits = malloc(sizeof(float) * (size_t)info->vocab_size);
    if (!logits) goto done;
    for (int i = prefix; i < n; i++) ids[i] = rand_id(vocab);
    sn_seq_reset(seq);
    sn_pcache_req *req = NULL;
    int bcached = 0, n_fwd = 0;
    double t_fwd = 0, t_cap = 0;
    sn_pcache_stats sb0, sb1;
    sn_pcache_get_stats(pc, &sb0);
    double t0 = bench_now();
    if (sn_pcache_begin_ex(pc, seq, ids, n, NULL, 0, 0, &req, &bcached) != SN_OK) {
        fprintf(stderr, "bench_pcache: %s\n", sn_errmsg());
        goto done;
    }
    double t_begin = bench_now() - t0;
    int chunk = sn_prefill_chunk(m, 0);
    for (int i = bcached; i < n;) {
        int end = sn_pcache_next_stop(req, i, n - i < chunk ? n : i + chunk);
        double a = bench_now();
        if (sn_forward(m, seq, ids + i, end - i, end == n ? logits : NULL, false) != SN_OK) {
            fprintf(stderr, "bench_pcache: %s\n", sn_errmsg());
            sn_pcache_req_free(req);
            goto done;
        }
        double b = bench_now();
        if (sn_pcache_capture(req, seq) != SN_OK) {
            fprintf(stderr, "bench_pcache: %s\n", sn_errmsg());
            sn_pcache_req_free(req);
            goto done;
        }
        t_fwd += b - a;
        t_cap += bench_now() - b;
        n_fwd++;
        i = end;
    }
    double a = bench_now();
    int32_t first = 0;
    for (int v = 1; v < info->vocab_size; v++)
        if (logits[v] > logits[first]) first = v;
    double t_tok = bench_now() - a;
    double t_ttft = bench_now() - t0;
    a = bench_now();
    sn_status cst = sn_pcache_commit(req, seq, ids, n);
    double t_commit = bench_now() - a;
    sn_pcache_req_free(req);
    if (cst != SN_OK) { fprintf(stderr, "bench_pcache: %s\n", sn_errmsg()); goto done; }
    sn_pcache_get_stats(pc, &sb1);
    snprintf(line, sizeof line,
             "bench_pcache_breakdown %s (%s): one warm request (%d cached, %d computed in %d forwards, first token %d): "
             "begin %.2f ms (lookup %.3f, restore %.2f queued), tail prefill %.2f ms, checkpoints %.2f ms, first token "
             "%.2f ms, sum %.2f ms; commit %.2f ms after it; pool timers per warm rep: lookup %.3f restore %.2f "
             "capture %.2f commit %.2f ms",
             info->name, backend == SN_BACKEND_CUDA ? "cuda" : "cpu", bcached, n - bcached, n_fwd, (int)first,
             t_begin * 1e3, (sb1.lookup_s - sb0.lookup_s) * 1e3, (sb1.restore_s - sb0.restore_s) * 1e3, t_fwd * 1e3,
             t_cap * 1e3, t_tok * 1e3, t_ttft * 1e3, t_commit * 1e3, avg_lookup * 1e3, avg_restore * 1e3,
             avg_capture * 1e3, avg_commit * 1e3);
    printf("%s\n", line);
    bench_log_line(log_path, line, argc, argv);
    rc = 0;
done:
    free(logits);
    free(ids);
    free(warm);
out:
    sn_pcache_free(pc);
    sn_seq_free(seq);
    sn_tok_free(tok);
    sn_model_free(m);
    return rc;
}
