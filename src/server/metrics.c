/* Prometheus text exposition for the fixed sanctum-mlx series (metrics.h). */
#include "server/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUCKETS 20
#define MAX_HTTP_SERIES 128

typedef struct {
    const double *le;   /* upper bounds, ascending; +Inf implied */
    int n;
    uint64_t counts[MAX_BUCKETS];  /* non-cumulative per bucket; [n] is +Inf */
    uint64_t total;
    double sum;
} histo;

static const double k_seconds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180};
static const double k_tps[] = {0.5, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96};
static const double k_tokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    char route[32];
    char method[8];
    int status;
    uint64_t requests;
    histo dur;
} http_series;

static const char *const k_stop_reasons[] = {"stop", "length", "cancelled", "error"};
#define N_STOP 4

struct srv_metrics {
    pthread_mutex_t mu;
    srv_metrics_tls_fn tls_fn;  /* NULL without an mTLS listener */
    void *tls_ud;
    http_series http[MAX_HTTP_SERIES];
    int n_http;
    uint64_t http_overflow;   /* requests whose label set did not fit (never expected) */
    int64_t inflight;
    uint64_t infer_requests[N_STOP];
    uint64_t completion_tokens, prompt_tokens;
    uint64_t pcache_hits, pcache_misses, pcache_cached_tokens, pld_drafted, pld_accepted;
    uint64_t pcache_entries, pcache_bytes;
    histo infer_dur, tps, ctoks, ttft, qwait;
    double startup_manifest, startup_model;
    bool have_manifest, have_model;
    int model_loaded;
    int queue_depth;
};

static void histo_init(histo *h, const double *le, int n)
{
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n = n;
}

static void histo_observe(histo *h, double v)
{
    if (isnan(v)) return;
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->counts[i]++;
    h->total++;
    h->sum += v;
}

sn_status srv_metrics_new(srv_metrics **out)
{
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return SN_FAIL(SN_E_NOMEM, "metrics: out of memory");
    pthread_mutex_init(&m->mu, NULL);
    histo_init(&m->infer_dur, k_seconds, NELEM(k_seconds));
    histo_init(&m->tps, k_tps, NELEM(k_tps));
    histo_init(&m->ctoks, k_tokens, NELEM(k_tokens));
    histo_init(&m->ttft, k_seconds, NELEM(k_seconds));
    histo_init(&m->qwait, k_seconds, NELEM(k_seconds));
    *out = m;
    return SN_OK;
}

void srv_metrics_free(srv_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_http(srv_metrics *m, const char *route, const char *method, int status, double seconds)
{
    pthread_mutex_lock(&m->mu);
    http_series *s = NULL;
    for (int i = 0; i < m->n_http; i++) {
        http_series *c = &m->http[i];
        if (c->status == status && strcmp(c->route, route) == 0 && strcmp(c->method, method) == 0) {
            s = c;
            break;
        }
    }
    if (!s && m->n_http < MAX_HTTP_SERIES) {
        s = &m->http[m->n_http++];
        snprintf(s->route, sizeof s->route, "%s", route);
        snprintf(s->method, sizeof s->method, "%s", method);
        s->status = status;
        histo_init(&s->dur, k_seconds, NELEM(k_seconds));
    }
    if (s) {
        s->requests++;
        histo_observe(&s->dur, seconds);
    } else {
        m->http_overflow++;
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_inflight(srv_metrics *m, int delta)
{
    pthread_mutex_lock(&m->mu);
    m->inflight += delta;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_inference(srv_metrics *m, const srv_infer_sample *s)
{
    pthread_mutex_lock(&m->mu);
    int r = N_STOP - 1;
    for (int i = 0; i < N_STOP; i++)
        if (s->stop_reason && strcmp(s->stop_reason, k_stop_reasons[i]) == 0) r = i;
    m->infer_requests[r]++;
    if (s->completion_tokens > 0) m->completion_tokens += (uint64_t)s->completion_tokens;
    if (s->prompt_tokens > 0) m->prompt_tokens += (uint64_t)s->prompt_tokens;
    if (s->pcache_used) {
        if (s->cached_tokens > 0) m->pcache_hits++;
        else m->pcache_misses++;
        if (s->cached_tokens > 0) m->pcache_cached_tokens += (uint64_t)s->cached_tokens;
    }
    if (s->pld_drafted > 0) m->pld_drafted += (uint64_t)s->pld_drafted;
    if (s->pld_accepted > 0) m->pld_accepted += (uint64_t)s->pld_accepted;
    histo_observe(&m->qwait, s->queue_wait_s);
    if (s->duration_s >= 0) histo_observe(&m->infer_dur, s->duration_s);
    if (s->completion_tokens > 0) {
        histo_observe(&m->ctoks, s->completion_tokens);
        if (s->ttft_s >= 0) histo_observe(&m->ttft, s->ttft_s);
        /* tokens after the first over the time they took: the decode rate a
         * client sees, not diluted by prefill. */
        if (s->completion_tokens > 1 && s->decode_s > 0)
            histo_observe(&m->tps, (s->completion_tokens - 1) / s->decode_s);
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_prompt_cache(srv_metrics *m, unsigned long long entries, unsigned long long bytes)
{
    pthread_mutex_lock(&m->mu);
    m->pcache_entries = entries;
    m->pcache_bytes = bytes;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tls_source(srv_metrics *m, srv_metrics_tls_fn fn, void *ud)
{
    pthread_mutex_lock(&m->mu);
    m->tls_fn = fn;
    m->tls_ud = ud;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_startup(srv_metrics *m, const char *phase, double seconds)
{
    pthread_mutex_lock(&m->mu);
    if (strcmp(phase, "manifest_verify") == 0) { m->startup_manifest = seconds; m->have_manifest = true; }
    else if (strcmp(phase, "model_load") == 0) { m->startup_model = seconds; m->have_model = true; }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_model_loaded(srv_metrics *m, int loaded)
{
    pthread_mutex_lock(&m->mu);
    m->model_loaded = loaded;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_queue_depth(srv_metrics *m, int depth)
{
    pthread_mutex_lock(&m->mu);
    m->queue_depth = depth;
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ---- */

typedef struct { char *p; size_t n, cap; bool oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = true; return; }
        if ((size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
        size_t nc = b->cap * 2 + (size_t)k + 1;
        char *q = realloc(b->p, nc);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = nc;
    }
}

/* Prometheus wants shortest round-trip floats; %.17g is exact, %g loses. */
static void fmt_num(char *dst, size_t cap, double v)
{
    if (isinf(v)) snprintf(dst, cap, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15) snprintf(dst, cap, "%.0f", v);
    else snprintf(dst, cap, "%.9g", v);
}

static void render_histo(sbuf *b, const char *name, const char *labels, const histo *h)
{
    uint64_t cum = 0;
    char num[48];
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        fmt_num(num, sizeof num, h->le[i]);
        sb_printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, sep, num, (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    sb_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    fmt_num(num, sizeof num, h->sum);
    if (labels[0]) {
        sb_printf(b, "%s_sum{%s} %s\n", name, labels, num);
        sb_printf(b, "%s_count{%s} %llu\n", name, labels, (unsigned long long)h->total);
    } else {
        sb_printf(b, "%s_sum %s\n", name, num);
        sb_printf(b, "%s_count %llu\n", name, (unsigned long long)h->total);
    }
}

sn_status srv_metrics_render(srv_metrics *m, char **out, size_t *len)
{
    sbuf b = {0};
    b.cap = 16384;
    b.p = malloc(b.cap);
    if (!b.p) return SN_FAIL(SN_E_NOMEM, "metrics: out of memory");
    b.p[0] = 0;
    char labels[160], num[48];

    pthread_mutex_lock(&m->mu);
    sb_printf(&b, "# HELP sanctum_mlx_http_requests_total HTTP requests answered, by route, method and status.\n"
                  "# TYPE sanctum_mlx_http_requests_total counter\n");
    for (int i = 0; i < m->n_http; i++) {
        const http_series *s = &m->http[i];
        sb_printf(&b, "sanctum_mlx_http_requests_total{route=\"%s\",method=\"%s\",status=\"%d\"} %llu\n",
                  s->route, s->method, s->status, (unsigned long long)s->requests);
    }
    sb_printf(&b, "# HELP sanctum_mlx_http_duration_seconds Time from request received to response completed.\n"
                  "# TYPE sanctum_mlx_http_duration_seconds histogram\n");
    for (int i = 0; i < m->n_http; i++) {
        const http_series *s = &m->http[i];
        snprintf(labels, sizeof labels, "route=\"%s\",method=\"%s\",status=\"%d\"", s->route, s->method, s->status);
        render_histo(&b, "sanctum_mlx_http_duration_seconds", labels, &s->dur);
    }
    sb_printf(&b, "# HELP sanctum_mlx_http_inflight_requests Requests accepted and not yet answered.\n"
                  "# TYPE sanctum_mlx_http_inflight_requests gauge\n"
                  "sanctum_mlx_http_inflight_requests %lld\n", (long long)m->inflight);
    sb_printf(&b, "# HELP sanctum_mlx_inference_requests_total Generations finished, by stop reason.\n"
                  "# TYPE sanctum_mlx_inference_requests_total counter\n");
    for (int i = 0; i < N_STOP; i++)
        sb_printf(&b, "sanctum_mlx_inference_requests_total{stop_reason=\"%s\"} %llu\n",
                  k_stop_reasons[i], (unsigned long long)m->infer_requests[i]);
    sb_printf(&b, "# HELP sanctum_mlx_inference_completion_tokens_total Tokens generated.\n"
                  "# TYPE sanctum_mlx_inference_completion_tokens_total counter\n"
                  "sanctum_mlx_inference_completion_tokens_total %llu\n",
              (unsigned long long)m->completion_tokens);
    sb_printf(&b, "# HELP sanctum_mlx_inference_prompt_tokens_total Prompt tokens processed.\n"
                  "# TYPE sanctum_mlx_inference_prompt_tokens_total counter\n"
                  "sanctum_mlx_inference_prompt_tokens_total %llu\n",
              (unsigned long long)m->prompt_tokens);
    sb_printf(&b, "# HELP sanctum_mlx_prompt_cache_hits_total Generations that resumed from a cached prompt prefix.\n"
                  "# TYPE sanctum_mlx_prompt_cache_hits_total counter\n"
                  "sanctum_mlx_prompt_cache_hits_total %llu\n"
                  "# HELP sanctum_mlx_prompt_cache_misses_total Generations that found no usable cached prefix.\n"
                  "# TYPE sanctum_mlx_prompt_cache_misses_total counter\n"
                  "sanctum_mlx_prompt_cache_misses_total %llu\n"
                  "# HELP sanctum_mlx_prompt_cache_cached_tokens_total Prompt tokens restored instead of computed.\n"
                  "# TYPE sanctum_mlx_prompt_cache_cached_tokens_total counter\n"
                  "sanctum_mlx_prompt_cache_cached_tokens_total %llu\n"
                  "# HELP sanctum_mlx_prompt_cache_entries Sequences held in the prompt-cache pool.\n"
                  "# TYPE sanctum_mlx_prompt_cache_entries gauge\n"
                  "sanctum_mlx_prompt_cache_entries %llu\n"
                  "# HELP sanctum_mlx_prompt_cache_bytes Host memory of the prompt-cache pool.\n"
                  "# TYPE sanctum_mlx_prompt_cache_bytes gauge\n"
                  "sanctum_mlx_prompt_cache_bytes %llu\n",
              (unsigned long long)m->pcache_hits, (unsigned long long)m->pcache_misses,
              (unsigned long long)m->pcache_cached_tokens, (unsigned long long)m->pcache_entries,
              (unsigned long long)m->pcache_bytes);
    if (m->tls_fn) {
        unsigned long long acc = 0, rej = 0;
        m->tls_fn(m->tls_ud, &acc, &rej);
        sb_printf(&b, "# HELP sanctum_mlx_tls_handshakes_total mTLS handshakes, by result (a rejected one never "
                      "reached HTTP).\n"
                      "# TYPE sanctum_mlx_tls_handshakes_total counter\n"
                      "sanctum_mlx_tls_handshakes_total{result=\"accepted\"} %llu\n"
                      "sanctum_mlx_tls_handshakes_total{result=\"rejected\"} %llu\n", acc, rej);
    }
    sb_printf(&b, "# HELP sanctum_mlx_pld_drafted_tokens_total Prompt lookup draft tokens verified.\n"
                  "# TYPE sanctum_mlx_pld_drafted_tokens_total counter\n"
                  "sanctum_mlx_pld_drafted_tokens_total %llu\n"
                  "# HELP sanctum_mlx_pld_accepted_tokens_total Prompt lookup draft tokens accepted.\n"
                  "# TYPE sanctum_mlx_pld_accepted_tokens_total counter\n"
                  "sanctum_mlx_pld_accepted_tokens_total %llu\n",
              (unsigned long long)m->pld_drafted, (unsigned long long)m->pld_accepted);
    sb_printf(&b, "# HELP sanctum_mlx_inference_duration_seconds Worker time per generation (prefill + decode).\n"
                  "# TYPE sanctum_mlx_inference_duration_seconds histogram\n");
    render_histo(&b, "sanctum_mlx_inference_duration_seconds", "", &m->infer_dur);
    sb_printf(&b, "# HELP sanctum_mlx_inference_tokens_per_sec Decode rate per generation.\n"
                  "# TYPE sanctum_mlx_inference_tokens_per_sec histogram\n");
    render_histo(&b, "sanctum_mlx_inference_tokens_per_sec", "", &m->tps);
    sb_printf(&b, "# HELP sanctum_mlx_inference_completion_tokens Completion tokens per generation.\n"
                  "# TYPE sanctum_mlx_inference_completion_tokens histogram\n");
    render_histo(&b, "sanctum_mlx_inference_completion_tokens", "", &m->ctoks);
    sb_printf(&b, "# HELP sanctum_mlx_inference_ttft_seconds Time from request accepted to first token.\n"
                  "# TYPE sanctum_mlx_inference_ttft_seconds histogram\n");
    render_histo(&b, "sanctum_mlx_inference_ttft_seconds", "", &m->ttft);
    sb_printf(&b, "# HELP sanctum_mlx_inference_queue_wait_seconds Time a request waited for the worker.\n"
                  "# TYPE sanctum_mlx_inference_queue_wait_seconds histogram\n");
    render_histo(&b, "sanctum_mlx_inference_queue_wait_seconds", "", &m->qwait);
    sb_printf(&b, "# HELP sanctum_mlx_inference_queue_depth Requests waiting for the worker.\n"
                  "# TYPE sanctum_mlx_inference_queue_depth gauge\n"
                  "sanctum_mlx_inference_queue_depth %d\n", m->queue_depth);
    sb_printf(&b, "# HELP sanctum_mlx_startup_seconds Startup phase durations.\n"
                  "# TYPE sanctum_mlx_startup_seconds gauge\n");
    fmt_num(num, sizeof num, m->startup_manifest);
    sb_printf(&b, "sanctum_mlx_startup_seconds{phase=\"manifest_verify\"} %s\n", num);
    fmt_num(num, sizeof num, m->startup_model);
    sb_printf(&b, "sanctum_mlx_startup_seconds{phase=\"model_load\"} %s\n", num);
    sb_printf(&b, "# HELP sanctum_mlx_model_loaded 1 when the model is loaded and serving.\n"
                  "# TYPE sanctum_mlx_model_loaded gauge\n"
                  "sanctum_mlx_model_loaded %d\n", m->model_loaded);
    pthread_mutex_unlock(&m->mu);

    if (b.oom) {
        free(b.p);
        return SN_FAIL(SN_E_NOMEM, "metrics: out of memory rendering");
    }
    *out = b.p;
    *len = b.n;
    return SN_OK;
}
