/* Prometheus metrics of sanctum-mlx.
 *
 * One process-wide registry guarded by a mutex: the HTTP thread records
 * request outcomes, the inference worker records generation figures, and
 * GET /metrics renders the text exposition format (version 0.0.4). The
 * series are fixed (see the issue): nothing here is generic on purpose. */
#ifndef SANCTUM_SERVER_METRICS_H
#define SANCTUM_SERVER_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "sanctum/status.h"

typedef struct srv_metrics srv_metrics;

sn_status srv_metrics_new(srv_metrics **out);
void srv_metrics_free(srv_metrics *m);

/* route: one of the served paths or "other"; method: "GET", "POST", ... */
void srv_metrics_http(srv_metrics *m, const char *route, const char *method, int status, double seconds);
void srv_metrics_inflight(srv_metrics *m, int delta);

/* One finished generation. stop_reason: "stop", "length", "cancelled", "error". */
typedef struct {
    const char *stop_reason;
    int prompt_tokens, completion_tokens;
    double queue_wait_s;    /* accepted -> worker picked it up */
    double ttft_s;          /* accepted -> first completion token; < 0 when none */
    double duration_s;      /* worker picked it up -> done */
    double decode_s;        /* first token -> done (for tokens/s) */
    bool pcache_used;       /* prompt cache consulted: a hit when cached_tokens > 0, else a miss */
    int cached_tokens;      /* prompt tokens restored from the prompt cache */
    int pld_drafted, pld_accepted;  /* prompt lookup decoding draft tokens verified / accepted */
} srv_infer_sample;
void srv_metrics_inference(srv_metrics *m, const srv_infer_sample *s);

void srv_metrics_startup(srv_metrics *m, const char *phase, double seconds);
void srv_metrics_model_loaded(srv_metrics *m, int loaded);
/* Prompt-cache pool size after a request (gauges). */
void srv_metrics_prompt_cache(srv_metrics *m, unsigned long long entries, unsigned long long bytes);
/* mTLS handshake counters, read at render time from the TLS layer (which
 * keeps them as atomics): sanctum_mlx_tls_handshakes_total{result}. */
typedef void (*srv_metrics_tls_fn)(void *ud, unsigned long long *accepted, unsigned long long *rejected);
void srv_metrics_tls_source(srv_metrics *m, srv_metrics_tls_fn fn, void *ud);
/* Queue depth right now (gauge, sampled at render time by the caller). */
void srv_metrics_queue_depth(srv_metrics *m, int depth);

/* Renders the exposition text (malloc'd, NUL-terminated). */
sn_status srv_metrics_render(srv_metrics *m, char **out, size_t *len);

#endif
