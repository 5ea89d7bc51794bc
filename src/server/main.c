/* sanctum-mlx: the OpenAI-compatible inference server.
 *
 * Startup order: parse flags -> verify the signed manifest (before any
 * weight is mapped) -> load the model, tokenizer and one sequence (checked
 * against --memory-limit-mb) -> bind (loopback must succeed) -> serve until
 * SIGTERM/SIGINT -> drain -> exit 0. The model side of the server (chat
 * template, tokenizer, generation loop) is bound here as the srv_engine. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "sanctum/chat.h"
#include "sanctum/clock.h"
#include "sanctum/generate.h"
#include "sanctum/manifest.h"
#include "sanctum/model.h"
#include "sanctum/pld.h"
#include "sanctum/prompt_cache.h"
#include "sanctum/tokenizer.h"
#include "server/auth.h"
#include "server/server.h"
#include "server/tls.h"

#define SANCTUM_VERSION "0.1.0"
#define MAX_HOSTS 16

typedef struct {
    const char *model_dir;
    const char *hosts[MAX_HOSTS];
    size_t n_hosts;
    const char *tls_hosts[MAX_HOSTS];
    size_t n_tls_hosts;
    int port, tls_port;
    int max_queue, flush_tokens, default_max_tokens, ctx, threads, gpu;
    long long max_body, memory_limit_mb;
    long long prompt_cache_mb;      /* 0: no prompt cache */
    const char *prewarm_file;
    bool pld;
    double grace;
    double request_timeout;
    sn_backend_kind backend;
    sn_weights_mode weights;
    sn_precision precision;
    const char *manifest, *manifest_sig, *manifest_pubkey;
    bool require_signed, no_plain;
    const char *tls_cert, *tls_key, *tls_ca, *tls_crl;
    const char *auth_token_file;
} cli;

typedef struct {
    sn_model *model;
    sn_tokenizer *tok;
    sn_seq *seq;
    sn_chat_format fmt;
    const sn_model_info *info;
    sn_pcache *pcache;          /* NULL with --prompt-cache-mb 0 */
    bool pld;                   /* --pld / --no-pld */
    sn_pld_opts pld_opts;       /* SANCTUM_MLX_PLD_* */
    sn_pld_ctl pld_ctl;         /* draft-length estimates, kept across requests (one worker thread) */
    int32_t msg_marker;         /* token that opens a chat message (<|im_start|>, [INST]); -1: none */
    srv_metrics *metrics;       /* for the pool gauges */
} engine;

/* Message boundaries of a prompt for the prompt cache: the position of
 * every token that opens a message, so a later prompt sharing the system
 * prompt (or the earlier turns) resumes exactly there. */
#define MAX_MSG_BOUNDS 64
static int msg_bounds(const engine *e, const int32_t *ids, size_t n, int *out)
{
    int k = 0;
    for (size_t i = 1; i < n && e->msg_marker >= 0; i++)
        if (ids[i] == e->msg_marker) {
            if (k == MAX_MSG_BOUNDS) memmove(out, out + 1, (MAX_MSG_BOUNDS - 1) * sizeof *out), k--;
            out[k++] = (int)i;
        }
    return k;
}

typedef struct {
    sn_auth *auth;
    sn_tls *tls;
    const cli *c;
} hooks;

/* ---- engine: runs on the worker thread ---- */

static sn_status emit_cb(void *ud, const char *text, size_t len, int n_tokens)
{
    return srv_job_emit(ud, text, len, n_tokens);
}

static int cancel_cb(void *ud) { return srv_job_cancelled(ud); }

static sn_status engine_run(void *ctx, srv_job *job, const srv_chat_req *req, srv_gen_out *out)
{
    engine *e = ctx;
    sn_status st = SN_OK;
    sn_ids ids = {0};
    sn_chat_msg *msgs = calloc(req->n_msgs, sizeof *msgs);
    if (!msgs) return SN_FAIL(SN_E_NOMEM, "out of memory for %zu messages", req->n_msgs);
    for (size_t i = 0; i < req->n_msgs; i++) {
        msgs[i].role = req->msgs[i].role;
        msgs[i].content = req->msgs[i].content;
    }
    sn_chat_opts co = {.add_generation_prompt = true, .enable_thinking = req->enable_thinking};
    /* sn_chat_encode keeps special tokens a user typed (<|im_end|>, [INST]) as
     * plain text: only the template's own markers become control tokens. */
    if ((st = sn_chat_encode(e->tok, e->fmt, msgs, req->n_msgs, &co, &ids)) != SN_OK) goto out;
    int max_ctx = sn_seq_max_ctx(e->seq);
    if (ids.n == 0) { st = SN_FAIL(SN_E_INVALID, "the rendered prompt is empty"); goto out; }
    if (ids.n + 1 > (size_t)max_ctx) {
        st = SN_FAIL(SN_E_RANGE, "the prompt is %zu tokens but the context holds %d (with room for at least one "
                                 "generated token)", ids.n, max_ctx);
        goto out;
    }
    srv_job_started(job, (int)ids.n);
    sn_seq_reset(e->seq);
    sn_gen_params gp = {
        .sample = req->sample,
        .max_tokens = srv_job_max_tokens(job),
        .stops = (const char *const *)req->stops,
        .n_stops = req->n_stops,
        .flush_tokens = srv_job_flush_tokens(job),
        .cancelled = cancel_cb,
        .ud = job,
        .pcache = e->pcache,
        .pld = e->pld && !req->no_pld,
        .pld_opts = e->pld_opts,
        .pld_ctl = &e->pld_ctl,
    };
    int bounds[MAX_MSG_BOUNDS];
    gp.n_msg_bounds = msg_bounds(e, ids.ids, ids.n, bounds);
    gp.msg_bounds = bounds;
    sn_gen_result r;
    st = sn_generate(e->model, e->tok, e->seq, ids.ids, (int)ids.n, &gp, emit_cb, &r);
    out->pcache_used = e->pcache != NULL;
    if (e->pcache && e->metrics) {
        sn_pcache_stats ps;
        sn_pcache_get_stats(e->pcache, &ps);
        srv_metrics_prompt_cache(e->metrics, (unsigned long long)ps.entries, (unsigned long long)ps.bytes);
    }
    out->cached_tokens = r.cached_tokens;
    out->pld_drafted = r.pld_drafted;
    out->pld_accepted = r.pld_accepted;
    out->prompt_tokens = r.prompt_tokens;
    out->completion_tokens = r.completion_tokens;
    out->finish = sn_finish_name(r.finish);
    out->decode_s = r.decode_s;
out:
    free(msgs);
    sn_ids_free(&ids);
    return st;
}

/* ---- hooks: auth and mTLS ---- */

static int admit_hook(void *ud, struct evhttp_request *req)
{
    hooks *h = ud;
    return sn_auth_http(h->auth, req);
}

static const char *client_id_hook(void *ud, struct evhttp_request *req)
{
    hooks *h = ud;
    return h->tls ? sn_tls_client_cn(req) : NULL;
}

static sn_status add_tls_listeners(void *ud, srv *s)
{
    hooks *h = ud;
    if (!h->tls) return SN_OK;
    struct evhttp *https;
    SN_TRY(srv_http_new(s, &https));
    sn_tls_attach(h->tls, https);
    for (size_t i = 0; i < h->c->n_tls_hosts; i++) {
        bool bound;
        SN_TRY(srv_http_bind(s, https, h->c->tls_hosts[i], h->c->tls_port, &bound));
    }
    return SN_OK;
}

/* ---- flags ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sanctum-mlx [options]\n"
            "  --model DIR                  model directory (default models/default)\n"
            "  --host ADDR                  plain HTTP bind address, repeatable (default 127.0.0.1)\n"
            "  --port N                     plain HTTP port (default 8080; 0 picks a free one)\n"
            "  --no-plain                   no plain HTTP listener (mTLS only)\n"
            "  --max-queue N                waiting requests before 503 (default 16)\n"
            "  --max-body-bytes N           request body limit (default 4194304)\n"
            "  --stream-flush-tokens N      SSE flush cadence in tokens (default 8)\n"
            "  --max-tokens N               default max_tokens of a request (default 512)\n"
            "  --ctx N                      context length (default: the model's, capped at 32768)\n"
            "  --shutdown-grace-seconds S   drain time after SIGTERM (default 30)\n"
            "  --request-timeout-seconds S  a plain connection must send each complete request within S s\n"
            "                               of opening or of its last answer (default 60; 0 = off)\n"
            "  --memory-limit-mb N          refuse a model + KV cache bigger than this\n"
            "  --backend cpu|cuda           compute backend (default cpu)\n"
            "  --gpu N                      CUDA device (default 0)\n"
            "  --threads N                  CPU threads (default: one per core)\n"
            "  --weights auto|mmap|copy     weights read from the file mappings, or copied into memory in\n"
            "                               huge pages (default auto: copy on the CPU backend when they fit\n"
            "                               in available memory with 2 GB to spare)\n"
            "  --precision exact|fast       activations of quantized products: exact (default, fp32-class)\n"
            "                               or fast (CPU: 8-bit; CUDA: prefill GEMMs on fp16 x)\n"
            "  --manifest FILE              sha256sum manifest of the model dir, verified before loading\n"
            "  --manifest-sig FILE          detached ed25519 signature (default FILE.sig)\n"
            "  --manifest-pubkey FILE       ed25519 public key that must have signed the manifest\n"
            "  --require-signed-manifest    refuse to start without a verified signature\n"
            "  --tls-cert/--tls-key/--tls-ca FILE   mTLS listener (all three required)\n"
            "  --tls-crl FILE               CRL for client certificates\n"
            "  --tls-host ADDR              mTLS bind address, repeatable (default 127.0.0.1)\n"
            "  --tls-port N                 mTLS port (default 8443)\n"
            "  --auth-token-file FILE       bearer token for non-loopback plain HTTP clients\n"
            "  --prompt-cache-mb N          prompt-cache pool size (default 512; 0 disables)\n"
            "  --prewarm-file FILE          system prompt text, or a JSON message list, prefilled into the\n"
            "                               prompt cache at start\n"
            "  --pld / --no-pld             prompt lookup decoding (default on; a request may send \"pld\": false);\n"
            "                               env SANCTUM_MLX_PLD_MAX_LOOKUP (5), SANCTUM_MLX_PLD_NGRAM_SIZE (3)\n");
}

static int parse_ll(const char *s, const char *what, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "sanctum-mlx: %s: bad value '%s' (expected an integer in [%lld, %lld])\n", what, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_i(const char *s, const char *what, int lo, int hi, int *out)
{
    long long v;
    if (parse_ll(s, what, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, cli *c)
{
    *c = (cli){.model_dir = "models/default", .port = 8080, .tls_port = 8443, .max_queue = 16, .flush_tokens = 8,
               .default_max_tokens = 512, .max_body = 4 << 20, .grace = 30, .request_timeout = 60, .backend = SN_BACKEND_CPU,
               .prompt_cache_mb = 512, .pld = true};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) { fprintf(stderr, "sanctum-mlx: %s needs a value\n", k); return -1; } i++; } while (0)
        long long ll;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) { usage(stdout); exit(0); }
        else if (!strcmp(k, "--model")) { NEEDV(); c->model_dir = v; }
        else if (!strcmp(k, "--host")) {
            NEEDV();
            if (c->n_hosts >= MAX_HOSTS) { fprintf(stderr, "sanctum-mlx: at most %d --host\n", MAX_HOSTS); return -1; }
            c->hosts[c->n_hosts++] = v;
        }
        else if (!strcmp(k, "--tls-host")) {
            NEEDV();
            if (c->n_tls_hosts >= MAX_HOSTS) { fprintf(stderr, "sanctum-mlx: at most %d --tls-host\n", MAX_HOSTS); return -1; }
            c->tls_hosts[c->n_tls_hosts++] = v;
        }
        else if (!strcmp(k, "--port")) { NEEDV(); if (parse_i(v, k, 0, 65535, &c->port)) return -1; }
        else if (!strcmp(k, "--tls-port")) { NEEDV(); if (parse_i(v, k, 0, 65535, &c->tls_port)) return -1; }
        else if (!strcmp(k, "--no-plain")) c->no_plain = true;
        else if (!strcmp(k, "--max-queue")) { NEEDV(); if (parse_i(v, k, 0, 100000, &c->max_queue)) return -1; }
        else if (!strcmp(k, "--max-body-bytes")) { NEEDV(); if (parse_ll(v, k, 1024, 1LL << 30, &c->max_body)) return -1; }
        else if (!strcmp(k, "--stream-flush-tokens")) { NEEDV(); if (parse_i(v, k, 1, 4096, &c->flush_tokens)) return -1; }
        else if (!strcmp(k, "--max-tokens")) { NEEDV(); if (parse_i(v, k, 1, SRV_MAX_TOKENS_ABSURD, &c->default_max_tokens)) return -1; }
        else if (!strcmp(k, "--ctx")) { NEEDV(); if (parse_i(v, k, 0, 1 << 22, &c->ctx)) return -1; }
        else if (!strcmp(k, "--shutdown-grace-seconds")) { NEEDV(); if (parse_ll(v, k, 0, 86400, &ll)) return -1; c->grace = (double)ll; }
        else if (!strcmp(k, "--request-timeout-seconds")) { NEEDV(); if (parse_ll(v, k, 0, 86400, &ll)) return -1; c->request_timeout = (double)ll; }
        else if (!strcmp(k, "--memory-limit-mb")) { NEEDV(); if (parse_ll(v, k, 1, 1LL << 40, &c->memory_limit_mb)) return -1; }
        else if (!strcmp(k, "--backend")) {
            NEEDV();
            if (!strcmp(v, "cpu")) c->backend = SN_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) c->backend = SN_BACKEND_CUDA;
            else { fprintf(stderr, "sanctum-mlx: --backend must be cpu or cuda, got '%s'\n", v); return -1; }
        }
        else if (!strcmp(k, "--gpu")) { NEEDV(); if (parse_i(v, k, 0, 255, &c->gpu)) return -1; }
        else if (!strcmp(k, "--threads")) { NEEDV(); if (parse_i(v, k, 0, 1024, &c->threads)) return -1; }
        else if (!strcmp(k, "--weights")) {
            NEEDV();
            if (!sn_weights_mode_parse(v, &c->weights)) {
                fprintf(stderr, "sanctum-mlx: --weights must be auto, mmap or copy, got '%s'\n", v);
                return -1;
            }
        }
        else if (!strcmp(k, "--precision")) {
            NEEDV();
            if (!sn_precision_parse(v, &c->precision)) {
                fprintf(stderr, "sanctum-mlx: --precision must be exact or fast, got '%s'\n", v);
                return -1;
            }
        }
        else if (!strcmp(k, "--manifest")) { NEEDV(); c->manifest = v; }
        else if (!strcmp(k, "--manifest-sig")) { NEEDV(); c->manifest_sig = v; }
        else if (!strcmp(k, "--manifest-pubkey")) { NEEDV(); c->manifest_pubkey = v; }
        else if (!strcmp(k, "--require-signed-manifest")) c->require_signed = true;
        else if (!strcmp(k, "--tls-cert")) { NEEDV(); c->tls_cert = v; }
        else if (!strcmp(k, "--tls-key")) { NEEDV(); c->tls_key = v; }
        else if (!strcmp(k, "--tls-ca")) { NEEDV(); c->tls_ca = v; }
        else if (!strcmp(k, "--tls-crl")) { NEEDV(); c->tls_crl = v; }
        else if (!strcmp(k, "--auth-token-file")) { NEEDV(); c->auth_token_file = v; }
        else if (!strcmp(k, "--prompt-cache-mb")) { NEEDV(); if (parse_ll(v, k, 0, 1LL << 24, &c->prompt_cache_mb)) return -1; }
        else if (!strcmp(k, "--prewarm-file")) { NEEDV(); c->prewarm_file = v; }
        else if (!strcmp(k, "--pld")) c->pld = true;
        else if (!strcmp(k, "--no-pld")) c->pld = false;
        else { fprintf(stderr, "sanctum-mlx: unknown option '%s' (see --help)\n", k); return -1; }
#undef NEEDV
    }
    if (c->n_hosts == 0 && !c->no_plain) c->hosts[c->n_hosts++] = "127.0.0.1";
    if (c->no_plain) c->n_hosts = 0;
    bool any_tls = c->tls_cert || c->tls_key || c->tls_ca || c->tls_crl || c->n_tls_hosts;
    if (any_tls && !(c->tls_cert && c->tls_key && c->tls_ca)) {
        fprintf(stderr, "sanctum-mlx: mTLS needs --tls-cert, --tls-key and --tls-ca together\n");
        return -1;
    }
    if (any_tls && c->n_tls_hosts == 0) c->tls_hosts[c->n_tls_hosts++] = "127.0.0.1";
    if (c->no_plain && !any_tls) {
        fprintf(stderr, "sanctum-mlx: --no-plain leaves no listener; add the --tls-* options\n");
        return -1;
    }
    if (c->prewarm_file && c->prompt_cache_mb == 0) {
        fprintf(stderr, "sanctum-mlx: --prewarm-file needs a prompt cache (--prompt-cache-mb > 0)\n");
        return -1;
    }
    if ((c->manifest_sig || c->manifest_pubkey || c->require_signed) && !c->manifest) {
        fprintf(stderr, "sanctum-mlx: --manifest-sig/--manifest-pubkey/--require-signed-manifest need --manifest\n");
        return -1;
    }
    return 0;
}

static const char *base_name(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    static char buf[256];
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    size_t len = n - start < sizeof buf - 1 ? n - start : sizeof buf - 1;
    memcpy(buf, dir + start, len);
    buf[len] = 0;
    return buf;
}

/* --prewarm-file: plain text is a system prompt; a file starting with '['
 * is a JSON message list [{"role", "content"}, ...]. The messages are
 * rendered followed by a placeholder user turn and cut where that turn
 * opens, so the prefilled ids are exactly the start of any request that
 * begins with these messages. */
#define PREWARM_MAX_BYTES (4 << 20)
static sn_status prewarm(engine *e, const char *path)
{
    sn_status st = SN_OK;
    char *text = NULL;
    sn_chat_msg *msgs = NULL;
    json_t *root = NULL;
    sn_ids ids = {0};
    size_t n_msgs = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return SN_FAIL(SN_E_IO, "prewarm file %s: %s", path, strerror(errno));
    text = malloc(PREWARM_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, PREWARM_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!text) return SN_FAIL(SN_E_NOMEM, "prewarm file %s: out of memory", path);
    if (len > PREWARM_MAX_BYTES) { st = SN_FAIL(SN_E_RANGE, "prewarm file %s: larger than %d bytes", path, PREWARM_MAX_BYTES); goto out; }
    text[len] = 0;
    if (strlen(text) != len) { st = SN_FAIL(SN_E_INVALID, "prewarm file %s: contains a NUL byte", path); goto out; }
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    if (*p == '[') {
        json_error_t je;
        root = json_loadb(text, len, 0, &je);
        if (!root || !json_is_array(root) || json_array_size(root) == 0 || json_array_size(root) > 1024) {
            st = SN_FAIL(SN_E_INVALID, "prewarm file %s: not a JSON list of 1..1024 messages (%s at line %d)", path,
                         root ? "wrong shape" : je.text, root ? 0 : je.line);
            goto out;
        }
        n_msgs = json_array_size(root);
    } else {
        n_msgs = 1;
    }
    msgs = calloc(n_msgs + 1, sizeof *msgs);
    if (!msgs) { st = SN_FAIL(SN_E_NOMEM, "prewarm: out of memory"); goto out; }
    for (size_t i = 0; i < n_msgs; i++) {
        if (!root) {
            msgs[i].role = "system";
            msgs[i].content = text;
            continue;
        }
        json_t *m = json_array_get(root, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (!role || !content) {
            st = SN_FAIL(SN_E_INVALID, "prewarm file %s: message %zu needs string 'role' and 'content'", path, i);
            goto out;
        }
        msgs[i].role = role;
        msgs[i].content = content;
    }
    msgs[n_msgs].role = "user";
    msgs[n_msgs].content = ".";
    sn_chat_opts co = {.add_generation_prompt = false};
    if ((st = sn_chat_encode(e->tok, e->fmt, msgs, n_msgs + 1, &co, &ids)) != SN_OK) goto out;
    int bounds[MAX_MSG_BOUNDS];
    int nb = msg_bounds(e, ids.ids, ids.n, bounds);
    int n = nb > 0 ? bounds[nb - 1] : (int)ids.n;   /* cut where the placeholder turn opens */
    if (n < 1) { st = SN_FAIL(SN_E_INVALID, "prewarm file %s: renders to no tokens", path); goto out; }
    if ((st = sn_pcache_prewarm(e->pcache, e->model, e->seq, ids.ids, n, bounds, nb > 0 ? nb - 1 : 0)) != SN_OK)
        goto out;
    fprintf(stderr, "sanctum-mlx: prewarmed the prompt cache with %d tokens from %s\n", n, path);
    if (e->metrics) {
        sn_pcache_stats ps;
        sn_pcache_get_stats(e->pcache, &ps);
        srv_metrics_prompt_cache(e->metrics, (unsigned long long)ps.entries, (unsigned long long)ps.bytes);
    }
out:
    sn_seq_reset(e->seq);
    sn_ids_free(&ids);
    free(msgs);
    json_decref(root);
    free(text);
    return st;
}

/* Bytes of sequence state a full context takes: the state at position 0
 * (recurrent layers) plus one token's KV growth times the context. Measured
 * through the public API with one real token, so it holds on any backend
 * and allocator; the sequence is reset afterwards. */
static sn_status seq_full_bytes(engine *e, size_t *out)
{
    size_t b0 = sn_seq_state_bytes(e->seq);
    int32_t tok = e->info->bos_id >= 0 ? e->info->bos_id : 0;
    SN_TRY(sn_forward(e->model, e->seq, &tok, 1, NULL, false));
    size_t per_token = sn_seq_state_bytes(e->seq) - b0;
    sn_seq_reset(e->seq);
    *out = b0 + per_token * (size_t)sn_seq_max_ctx(e->seq);
    return SN_OK;
}

/* The tokenizer under the manifest pins (as sn_tok_load picks it in a
 * directory: tekken.json, else tokenizer.json): the pinned fd is checked,
 * the tokenizer reads that same open file through /proc/self/fd (a rename
 * over the path cannot redirect it), and the pin is checked again after the
 * read, so the text parsed is the text the gate hashed. */
static sn_status tok_load_pinned(const char *dir, const sn_manifest_pins *pins, const char *model_type,
                                 sn_tokenizer **out)
{
    const char *rel = "tekken.json";
    int fd = -1;
    sn_status st = sn_manifest_pins_open(pins, dir, rel, &fd);
    if (st == SN_E_MISSING) st = sn_manifest_pins_open(pins, dir, rel = "tokenizer.json", &fd);
    if (st != SN_OK) return st;
    char path[64], msg[1024];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if ((st = sn_tok_load(path, model_type, out)) != SN_OK) {
        snprintf(msg, sizeof msg, "%s", sn_errmsg());
        st = SN_FAIL(st, "%s/%s (read as %s): %s", dir, rel, path, msg);
    } else if ((st = sn_manifest_pins_check_fd(pins, rel, fd)) != SN_OK) {
        sn_tok_free(*out);
        *out = NULL;
    }
    close(fd);
    return st;
}

static void tls_counts(void *ud, unsigned long long *accepted, unsigned long long *rejected)
{
    uint64_t a = 0, r = 0;
    sn_tls_stats(ud, &a, &r);
    *accepted = a;
    *rejected = r;
}

int main(int argc, char **argv)
{
    cli c;
    if (parse_args(argc, argv, &c)) return 2;
    int rc = 1;
    /* Every client connection is a descriptor: take the hard limit. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    srv_metrics *metrics = NULL;
    engine e = {0};
    hooks h = {.c = &c};
    char model_id[256], fingerprint[320];
    sn_manifest_pins *pins = NULL;   /* from the manifest gate, held until the model and tokenizer are loaded */

    if (srv_metrics_new(&metrics) != SN_OK) { fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg()); return 1; }
    if (sn_auth_new(c.auth_token_file, &h.auth) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg());
        goto out;
    }
    for (size_t i = 0; i < c.n_hosts; i++) {
        if (sn_auth_check_bind(h.auth, c.hosts[i]) != SN_OK) {
            fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg());
            goto out;
        }
    }
    if (c.tls_cert) {
        sn_tls_opts to = {c.tls_cert, c.tls_key, c.tls_ca, c.tls_crl};
        if (sn_tls_new(&to, &h.tls) != SN_OK) { fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg()); goto out; }
        /* SIGHUP re-reads cert, key, CA and CRL (revocation without a restart); set up before any thread starts. */
        if (sn_tls_reload_on_sighup(h.tls) != SN_OK) { fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg()); goto out; }
        srv_metrics_tls_source(metrics, tls_counts, h.tls);
        /* A --tls-host outside the certificate's SANs still serves, but clients that check the name refuse it. */
        for (size_t i = 0; i < c.n_tls_hosts; i++)
            if (sn_tls_cert_covers(h.tls, c.tls_hosts[i]) != SN_OK)
                fprintf(stderr, "sanctum-mlx: WARNING: %s\n", sn_errmsg());
    }

    /* The manifest gate runs before a single weight byte is mapped; its pins
     * make the loader refuse any file that is not the one the gate hashed. */
    if (c.manifest) {
        sn_manifest_opts mo = {.manifest_path = c.manifest, .sig_path = c.manifest_sig,
                               .pubkey_path = c.manifest_pubkey, .require_signed = c.require_signed,
                               .n_threads = c.threads};
        sn_manifest_report rep;
        fprintf(stderr, "sanctum-mlx: verifying %s against %s\n", c.model_dir, c.manifest);
        if (sn_manifest_gate_pinned(c.model_dir, &mo, &rep, &pins) != SN_OK) {
            fprintf(stderr, "sanctum-mlx: manifest verification failed: %s\n", sn_errmsg());
            goto out;
        }
        srv_metrics_startup(metrics, "manifest_verify", rep.seconds);
        fprintf(stderr, "sanctum-mlx: manifest ok (%zu files, %.1f MB, signature %s) in %.2fs\n", rep.n_files,
                rep.bytes / 1e6, rep.signature_checked ? "verified" : "not checked", rep.seconds);
    } else if (c.require_signed) {
        fprintf(stderr, "sanctum-mlx: --require-signed-manifest without --manifest\n");
        goto out;
    }

    double t0 = sn_now_s();
    sn_load_opts lo = {.backend = c.backend, .gpu = c.gpu, .n_threads = c.threads,
                       .memory_limit_mb = c.memory_limit_mb, .weights = c.weights,
                       .precision = c.precision, .pins = pins};
    fprintf(stderr, "sanctum-mlx: loading %s\n", c.model_dir);
    if (sn_model_load(c.model_dir, &lo, &e.model) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: cannot load model %s: %s\n", c.model_dir, sn_errmsg());
        goto out;
    }
    e.info = sn_model_get_info(e.model);
    if ((pins ? tok_load_pinned(c.model_dir, pins, e.info->model_type, &e.tok)
              : sn_tok_load(c.model_dir, e.info->model_type, &e.tok)) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: cannot load the tokenizer of %s: %s\n", c.model_dir, sn_errmsg());
        goto out;
    }
    sn_manifest_pins_free(pins);
    pins = NULL;
    if (sn_chat_format_for(e.info->model_type, &e.fmt) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: no chat template for %s: %s\n", e.info->model_type, sn_errmsg());
        goto out;
    }
    if (sn_seq_new(e.model, c.ctx, &e.seq) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: cannot allocate a sequence of %d tokens: %s\n", c.ctx, sn_errmsg());
        goto out;
    }
    if (c.memory_limit_mb > 0) {
        size_t seq_bytes = 0;
        if (seq_full_bytes(&e, &seq_bytes) != SN_OK) {
            fprintf(stderr, "sanctum-mlx: cannot measure the sequence state: %s\n", sn_errmsg());
            goto out;
        }
        long long pc_mb = c.prompt_cache_mb > 0 ? (long long)c.prompt_cache_mb : 0;
        long long total_mb = ((e.info->weight_bytes + (long long)seq_bytes) >> 20) + pc_mb;
        if (total_mb > c.memory_limit_mb) {
            fprintf(stderr, "sanctum-mlx: model %s needs %lld MB (weights %lld MB + KV/state %zu MB for %d tokens + "
                            "prompt cache %lld MB), over --memory-limit-mb %lld; lower --ctx / --prompt-cache-mb or "
                            "raise the limit\n",
                    c.model_dir, total_mb, (long long)(e.info->weight_bytes >> 20), seq_bytes >> 20,
                    sn_seq_max_ctx(e.seq), pc_mb, c.memory_limit_mb);
            goto out;
        }
    }
    if (sn_pld_opts_from_env(&e.pld_opts) != SN_OK || sn_engine_env_check() != SN_OK) {
        fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg());
        goto out;
    }
    e.pld = c.pld;
    e.metrics = metrics;
    sn_pld_ctl_init(&e.pld_ctl, e.pld_opts.adaptive);
    e.msg_marker = sn_tok_find(e.tok, e.fmt == SN_CHAT_MISTRAL ? "[INST]" : "<|im_start|>");
    if (c.prompt_cache_mb > 0) {
        sn_pcache_opts po;
        sn_pcache_opts_default(&po);
        po.budget_bytes = (size_t)c.prompt_cache_mb << 20;
        if (sn_pcache_new(e.model, &po, &e.pcache) != SN_OK) { fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg()); goto out; }
    }
    if (c.prewarm_file && prewarm(&e, c.prewarm_file) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg());
        goto out;
    }
    double load_s = sn_now_s() - t0;
    srv_metrics_startup(metrics, "model_load", load_s);
    snprintf(model_id, sizeof model_id, "%s", e.info->name && e.info->name[0] ? e.info->name : base_name(c.model_dir));
    {
        uint64_t hsh = 0xcbf29ce484222325ull;
        /* the backend and the precision change the numbers a request gets back, so they are
         * part of what the fingerprint says stayed the same */
        const char *parts[] = {model_id, e.info->model_type, SANCTUM_VERSION, __DATE__, __TIME__,
                               c.backend == SN_BACKEND_CUDA ? "cuda" : "cpu",
                               sn_precision_name(e.info->precision)};
        for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
            for (const char *p = parts[i]; p && *p; p++) { hsh ^= (unsigned char)*p; hsh *= 0x100000001b3ull; }
        hsh ^= (uint64_t)e.info->weight_bytes;
        snprintf(fingerprint, sizeof fingerprint, "fp_%s_%s_%08llx", model_id, SANCTUM_VERSION,
                 (unsigned long long)(hsh & 0xffffffffull));
    }
    fprintf(stderr, "sanctum-mlx: loaded %s (%s, %d layers, vocab %d, ctx %d; weights %s, precision %s) in %.2fs\n",
            model_id, e.info->model_type, e.info->n_layers, e.info->vocab_size, sn_seq_max_ctx(e.seq),
            e.info->weights_copied ? "copied into memory" : "mapped",
            sn_precision_name(e.info->precision), load_s);

    srv_opts so = {
        .hosts = c.hosts, .n_hosts = c.n_hosts, .port = c.port,
        .max_queue = c.max_queue, .max_body_bytes = (size_t)c.max_body,
        .stream_flush_tokens = c.flush_tokens, .default_max_tokens = c.default_max_tokens,
        .shutdown_grace_s = c.grace, .request_timeout_s = c.request_timeout, .model_id = model_id, .fingerprint = fingerprint,
        .engine = {.ctx = &e, .run = engine_run}, .metrics = metrics,
        .admit = admit_hook, .client_id = client_id_hook, .add_listeners = add_tls_listeners, .hook_ud = &h,
    };
    if (srv_run(&so) != SN_OK) {
        fprintf(stderr, "sanctum-mlx: %s\n", sn_errmsg());
        goto out;
    }
    rc = 0;
out:
    sn_manifest_pins_free(pins);
    sn_pcache_free(e.pcache);
    sn_seq_free(e.seq);
    sn_tok_free(e.tok);
    sn_model_free(e.model);
    sn_tls_free(h.tls);
    sn_auth_free(h.auth);
    srv_metrics_free(metrics);
    return rc;
}
