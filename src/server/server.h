/* The sanctum-mlx HTTP server: libevent evhttp on one loop thread, one
 * inference worker thread, a bounded FIFO between them.
 *
 * Threading contract: evhttp objects (requests, connections) are touched only
 * on the loop thread. The worker runs the engine and hands text back through
 * the job (under the server mutex) plus one event_active() on a notify event;
 * the loop thread then writes SSE chunks or the final JSON. /health,
 * /v1/models and /metrics are answered on the loop thread without waiting
 * for the worker or the model. */
#ifndef SANCTUM_SERVER_SERVER_H
#define SANCTUM_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "sanctum/status.h"
#include "server/api.h"
#include "server/metrics.h"

struct evhttp;
struct evhttp_request;
typedef struct srv srv;
typedef struct srv_job srv_job;

/* What one generation produced (filled by the engine). */
typedef struct {
    int prompt_tokens;
    int completion_tokens;
    const char *finish;        /* "stop", "length" or "cancelled" (static string) */
    double decode_s;           /* first token -> end */
    bool pcache_used;          /* the prompt cache was consulted (hit or miss) */
    int cached_tokens;         /* prompt tokens restored from the prompt cache */
    int pld_drafted, pld_accepted;  /* prompt lookup decoding draft tokens verified / accepted */
} srv_gen_out;

/* The model side, bound by main.c. run() executes on the worker thread:
 * render and tokenize the chat, refuse a prompt that does not fit
 * (SN_E_RANGE: answered 400 with sn_errmsg()), call srv_job_started() once
 * the prompt is accepted, then generate, passing text through
 * srv_job_emit(). SN_E_INVALID is also answered 400; other failures 500. */
typedef struct {
    void *ctx;
    sn_status (*run)(void *ctx, srv_job *job, const srv_chat_req *req, srv_gen_out *out);
} srv_engine;

/* Worker-side job API (used by the engine during run()). */
void srv_job_started(srv_job *job, int prompt_tokens);
/* New text and the completion-token count so far. SN_E_CANCELLED when the
 * client went away or shutdown ran out of grace: stop generating. */
sn_status srv_job_emit(srv_job *job, const char *text, size_t len, int n_tokens);
int srv_job_cancelled(srv_job *job);
int srv_job_flush_tokens(const srv_job *job);
int srv_job_max_tokens(const srv_job *job);   /* the request's, or the server default */

typedef struct {
    const char *const *hosts;    /* plain HTTP bind addresses (none with --no-plain) */
    size_t n_hosts;
    int port;
    int max_queue;               /* waiting requests beyond the running one */
    size_t max_body_bytes;
    int stream_flush_tokens;
    int default_max_tokens;
    double shutdown_grace_s;
    /* A plain connection must deliver each complete request within this
     * many seconds of opening or of its previous answer (slow headers,
     * unfinished bodies, idle keep-alives); 0 turns the deadline off. */
    double request_timeout_s;
    const char *model_id;
    const char *fingerprint;     /* system_fingerprint */
    srv_engine engine;
    srv_metrics *metrics;
    /* Optional hooks (auth, mTLS). admit: return 0 after answering the
     * request itself (e.g. 401). client_id: mTLS client CN or NULL. */
    int (*admit)(void *ud, struct evhttp_request *req);
    const char *(*client_id)(void *ud, struct evhttp_request *req);
    /* Called once the plain listeners are bound, to add more (TLS) listeners
     * with srv_http_new / srv_http_bind. */
    sn_status (*add_listeners)(void *ud, srv *s);
    void *hook_ud;
} srv_opts;

/* An evhttp on the server's loop with the server's routes and limits. */
sn_status srv_http_new(srv *s, struct evhttp **out);
/* Binds http to host:port. A loopback address that fails is an error; any
 * other failure is logged and skipped (*bound false). */
sn_status srv_http_bind(srv *s, struct evhttp *http, const char *host, int port, bool *bound);

/* Binds, serves until SIGTERM/SIGINT and a drain (bounded by the grace), and
 * returns SN_OK on a clean shutdown. */
sn_status srv_run(const srv_opts *o);

#endif
