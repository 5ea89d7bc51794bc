/* sanctum-mlx HTTP server: routes, SSE, the queue and the worker (server.h).
 *
 * Job lifetime: a job is created on the loop thread, queued, run by the
 * worker, and freed by the loop thread once it has seen worker_done (read
 * under the mutex). After setting worker_done the worker never touches the
 * job again, so that is the one safe point to free it.
 *
 * Request lifetime (libevent 2.1): if the client goes away before we finish
 * the reply, evhttp detaches the request from the dying connection (evcon
 * becomes NULL) and the request stays ours until evhttp_send_reply_end /
 * evhttp_send_reply frees it. If instead the connection is freed with the
 * request still attached, evhttp frees the request too; the close callback
 * tells the two apart and forgets the request in the second case. */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>

#include <fcntl.h>

#include "sanctum/clock.h"

#define SRV_MAX_HTTP 8
#define SRV_MAX_BOUND 32
/* libevent's evhttp listens with a backlog of 128: a burst of more new
 * connections than that (a test opens 300 slowloris sockets, then probes
 * /health) lets the kernel drop the next SYN while the loop catches up, and
 * the client retries only after a second. The kernel caps this at
 * net.core.somaxconn. */
#define SRV_BACKLOG 4096
#define NONSTREAM_FLUSH_TOKENS 32
/* A stream whose client stopped reading is dropped once this much is queued
 * for it: generation is cancelled rather than buffered without bound. */
#define STREAM_MAX_BACKLOG (8u << 20)

typedef enum { R_CHAT, R_MODELS, R_HEALTH, R_METRICS, R_OTHER } route_id;
static const char *const k_route_names[] = {"/v1/chat/completions", "/v1/models", "/health", "/metrics", "other"};

struct srv_job {
    srv *s;
    char id[48];
    route_id route;
    char method[8];
    char client[80];          /* peer address:port */
    char cn[128];             /* mTLS client CN, "" on plain HTTP */
    srv_chat_req creq;
    int max_tokens;
    int flush_tokens;
    double t_accept, t_start, t_first, t_done;

    /* loop thread only */
    struct evhttp_request *req;   /* NULL once answered or freed by evhttp */
    struct evhttp_connection *evcon;
    bool headers_sent;
    bool client_gone;
    bool collect_failed;          /* non-stream text could not be kept (out of memory) */
    char *full;                   /* non-stream: accumulated text */
    size_t full_len, full_cap;
    srv_job *live_prev, *live_next;

    /* shared, under s->mu */
    bool started;
    int prompt_tokens, completion_tokens;
    char *out;                    /* text not yet taken by the loop thread */
    size_t out_len, out_cap;
    bool worker_done;
    sn_status result;
    srv_err err;
    srv_gen_out gen;
    bool notified;
    srv_job *dirty_next, *q_next;

    atomic_int cancel;
};

struct srv {
    srv_opts o;
    struct event_base *base;
    struct evhttp *https[SRV_MAX_HTTP];
    int n_http;
    struct evhttp_bound_socket *bound[SRV_MAX_BOUND];
    struct evhttp *bound_http[SRV_MAX_BOUND];
    int n_bound;
    struct event *notify_ev, *sigterm_ev, *sigint_ev, *tick_ev;
    char *models_body;
    char *model_body;             /* GET /v1/models/{id} */
    long long started_at;

    pthread_t worker;
    bool worker_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job *q_head, *q_tail;     /* FIFO of waiting jobs */
    atomic_int q_len;
    atomic_int busy;              /* the worker is running a job */
    bool worker_stop;
    srv_job *dirty;               /* jobs with news for the loop thread */

    /* loop thread only */
    srv_job *live;                /* every job not yet freed */
    int n_live;
    bool draining;
    double drain_deadline;
    bool grace_expired;
    int flushing;                 /* final replies handed to evhttp, not yet written out */
    double flush_deadline;        /* drain: how long to wait for them */
    unsigned long long n_req;
    uint64_t id_salt;
    /* Out of descriptors: one held back so a pending connection can still
     * be accepted and told 503 (else the listener stays readable and the
     * loop spins on EMFILE); listeners paused until paused_until. */
    int reserve_fd;
    bool accept_paused;
    double paused_until;
    double accept_warned_at;
    unsigned long long accept_shed;
    /* Plain connections (their bufferevents, one extra reference each) and
     * when each last finished a request: see conn_sweep. */
    struct conn_ent *conns;
    size_t conns_cap, n_conns;
    double conn_warned_at;
    unsigned long long conn_reaped;
};

static void conn_touch(srv *s, struct evhttp_connection *evcon);
static struct bufferevent *conn_bevcb(struct event_base *base, void *arg);

static const char *method_name(enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_TRACE: return "TRACE";
    case EVHTTP_REQ_CONNECT: return "CONNECT";
    case EVHTTP_REQ_PATCH: return "PATCH";
    }
    return "OTHER";
}

static void peer_of(struct evhttp_request *req, char *dst, size_t cap)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    char *addr = NULL;
    ev_uint16_t port = 0;
    if (evcon) evhttp_connection_get_peer(evcon, &addr, &port);
    snprintf(dst, cap, "%s:%u", addr ? addr : "?", (unsigned)port);
}

/* ---- replies ---- */

static void add_common_headers(srv *s, struct evhttp_request *req, const char *ctype)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", ctype);
    evhttp_add_header(h, "Server", "sanctum-mlx");
    if (s->draining) evhttp_add_header(h, "Connection", "close");
}

static void reply_body(srv *s, struct evhttp_request *req, int status, const char *ctype, const char *body, size_t len)
{
    add_common_headers(s, req, ctype);
    struct evbuffer *b = NULL;
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        /* evhttp 2.1 would write a body after a HEAD response's headers
         * (the next response on a kept-alive connection would start with
         * it): send the length only. */
        char cl[32];
        snprintf(cl, sizeof cl, "%zu", len);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Length", cl);
    } else if ((b = evbuffer_new())) {
        evbuffer_add(b, body, len);
    }
    const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request" : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed" : status == 413 ? "Payload Too Large"
                       : status == 503 ? "Service Unavailable" : status == 500 ? "Internal Server Error" : NULL;
    evhttp_send_reply(req, status, reason, b);
    if (b) evbuffer_free(b);
}

static void reply_error(srv *s, struct evhttp_request *req, const srv_err *e)
{
    char *body = srv_err_json(e);
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    if (body) reply_body(s, req, e->http_status, "application/json", body, strlen(body));
    else reply_body(s, req, 500, "application/json", fallback, sizeof fallback - 1);
    free(body);
}

static void log_line(srv *s, const srv_job *j, const char *route, const char *method, const char *client, const char *cn,
                     int status, double total_s)
{
    (void)s;
    if (j) {
        fprintf(stderr,
                "req id=%s route=%s method=%s status=%d client=%s%s%s prompt_tokens=%d completion_tokens=%d "
                "finish=%s queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f cached_tokens=%d pld_drafted=%d "
                "pld_accepted=%d pld_accept_rate=%.2f\n",
                j->id, route, method, status, client, cn && cn[0] ? " cn=" : "", cn && cn[0] ? cn : "",
                j->prompt_tokens, j->completion_tokens, j->gen.finish ? j->gen.finish : "-",
                j->t_start > 0 ? (j->t_start - j->t_accept) * 1e3 : -1.0,
                j->t_first > 0 ? (j->t_first - j->t_accept) * 1e3 : -1.0, total_s * 1e3, j->gen.cached_tokens,
                j->gen.pld_drafted, j->gen.pld_accepted,
                j->gen.pld_drafted ? (double)j->gen.pld_accepted / j->gen.pld_drafted : 0.0);
    } else {
        fprintf(stderr, "req route=%s method=%s status=%d client=%s%s%s total_ms=%.1f\n", route, method, status,
                client, cn && cn[0] ? " cn=" : "", cn && cn[0] ? cn : "", total_s * 1e3);
    }
}

/* A request answered on the loop thread right away. */
static void finish_sync(srv *s, struct evhttp_request *req, route_id r, double t0, int status)
{
    const char *method = method_name(evhttp_request_get_command(req));
    char client[80];
    peer_of(req, client, sizeof client);
    const char *cn = s->o.client_id ? s->o.client_id(s->o.hook_ud, req) : NULL;
    double dt = sn_now_s() - t0;
    srv_metrics_http(s->o.metrics, k_route_names[r], method, status, dt);
    log_line(s, NULL, k_route_names[r], method, client, cn, status, dt);
}

static void sync_error(srv *s, struct evhttp_request *req, route_id r, double t0, int status, const char *type,
                       const char *code, const char *param, const char *msg)
{
    srv_err e;
    srv_err_set(&e, status, type, code, param, "%s", msg);
    reply_error(s, req, &e);
    finish_sync(s, req, r, t0, status);
}

/* ---- job bookkeeping (loop thread) ---- */

static void job_free(srv_job *j)
{
    if (!j) return;
    srv_chat_req_free(&j->creq);
    free(j->full);
    free(j->out);
    free(j);
}

static void live_remove(srv *s, srv_job *j)
{
    if (j->live_prev) j->live_prev->live_next = j->live_next;
    else s->live = j->live_next;
    if (j->live_next) j->live_next->live_prev = j->live_prev;
    s->n_live--;
}

/* Called under s->mu: queue the job for the loop thread and wake it. */
static void notify_locked(srv *s, srv_job *j)
{
    if (j->notified) return;
    j->notified = true;
    j->dirty_next = s->dirty;
    s->dirty = j;
    event_active(s->notify_ev, EV_READ, 0);
}

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    srv_job *j = arg;
    (void)evcon;
    j->client_gone = true;
    atomic_store(&j->cancel, 1);
    /* Still attached: evhttp frees the request with the connection. */
    if (j->req && evhttp_request_get_connection(j->req) != NULL) j->req = NULL;
    j->evcon = NULL;
}

/* Did the peer close its end? POLLRDHUP reports the FIN even when unread
 * bytes sit in front of it (a TLS close_notify, a pipelined request), which
 * a zero-byte MSG_PEEK would miss. Runs after every flush and every tick,
 * because evhttp stops reading a connection once its request is in. */
static bool peer_closed(srv_job *j)
{
    if (!j->req || !j->evcon) return true;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(j->evcon);
    if (!bev) return true;
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd < 0) return true;
    struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
    if (poll(&pfd, 1, 0) < 0) return false;   /* EINTR and the like: look again next time */
    return (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void mark_gone(srv_job *j)
{
    if (j->client_gone) return;
    j->client_gone = true;
    atomic_store(&j->cancel, 1);
}

/* The last bytes of a reply leave with the event loop: a drain waits for
 * them (bounded) so a stream finished during shutdown is not cut off. */
static void on_reply_written(struct evhttp_request *req, void *arg)
{
    srv *s = arg;
    (void)req;
    s->flushing--;
}

static void track_flush(srv *s, struct evhttp_request *req)
{
    s->flushing++;
    evhttp_request_set_on_complete_cb(req, on_reply_written, s);
}

static int status_for(sn_status st)
{
    return (st == SN_E_RANGE || st == SN_E_INVALID) ? 400 : 500;
}

/* Send the end of a reply (or the error), record metrics, log, free. */
static void job_complete(srv *s, srv_job *j)
{
    int status = 200;
    srv_resp_meta meta = {j->id, (long long)time(NULL), s->o.model_id, s->o.fingerprint};
    bool ok = j->result == SN_OK;
    const char *finish = j->gen.finish ? j->gen.finish : "stop";
    if (j->collect_failed) {
        ok = false;
        j->result = SN_E_NOMEM;
        finish = "stop";
        srv_err_set(&j->err, 500, "server_error", NULL, NULL, "out of memory collecting the completion");
    }
    if (j->evcon) {
        evhttp_connection_set_closecb(j->evcon, NULL, NULL);
        conn_touch(s, j->evcon);
    }
    if (!ok && j->result != SN_E_CANCELLED) status = j->err.http_status;
    bool cancelled = j->result == SN_E_CANCELLED || strcmp(finish, "cancelled") == 0;
    /* Cancelled: the client left (499, nginx's "client closed request"), or
     * the shutdown grace ran out with the client still waiting (503). */
    if (j->client_gone) status = 499;
    else if (cancelled) status = 503;

    if (j->req) {
        if (!j->client_gone) track_flush(s, j->req);
        if (!j->headers_sent) evhttp_add_header(evhttp_request_get_output_headers(j->req), "X-Request-Id", j->id);
        if (j->creq.stream && j->headers_sent) {
            struct evbuffer *b = evbuffer_new();
            if (b && !j->client_gone) {
                char *c = NULL;
                if (ok && strcmp(finish, "cancelled") != 0) {
                    c = srv_chunk_sse(&meta, NULL, NULL, 0, finish);
                    if (c) evbuffer_add(b, c, strlen(c));
                    free(c);
                    if (j->creq.include_usage) {
                        c = srv_usage_sse_cached(&meta, j->gen.prompt_tokens, j->gen.completion_tokens,
                                                 j->gen.cached_tokens);
                        if (c) evbuffer_add(b, c, strlen(c));
                        free(c);
                    }
                } else {
                    /* The status line is gone already: report in-band. A
                     * cancel with the client still here means the shutdown
                     * grace ran out. */
                    if (ok || j->result == SN_E_CANCELLED)
                        srv_err_set(&j->err, 503, "server_error", "shutting_down", NULL,
                                    "generation cancelled: the server is shutting down");
                    char *e = srv_err_json(&j->err);
                    if (e) evbuffer_add_printf(b, "data: %s\n\n", e);
                    free(e);
                }
                evbuffer_add(b, "data: [DONE]\n\n", 14);
                evhttp_send_reply_chunk(j->req, b);
            }
            if (b) evbuffer_free(b);
            evhttp_send_reply_end(j->req);
        } else if (j->client_gone) {
            /* Detached request: this frees it without writing. */
            evhttp_send_reply_end(j->req);
        } else if (!ok || cancelled) {
            if (cancelled)
                srv_err_set(&j->err, 503, "server_error", "shutting_down", NULL,
                            "the request was cancelled: the server is shutting down");
            reply_error(s, j->req, &j->err);
        } else if (j->creq.stream) {
            /* Streaming request that finished before anything was sent
             * (cannot happen after started; kept for a worker that never started it). */
            srv_err e;
            srv_err_set(&e, 500, "server_error", NULL, NULL, "generation ended before the stream started");
            reply_error(s, j->req, &e);
            status = 500;
        } else {
            char *body = srv_resp_json_cached(&meta, j->full ? j->full : "", j->full_len, finish,
                                              j->gen.prompt_tokens, j->gen.completion_tokens, j->gen.cached_tokens);
            if (body) {
                reply_body(s, j->req, 200, "application/json", body, strlen(body));
            } else {
                srv_err e;
                srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory building the response");
                reply_error(s, j->req, &e);
                status = 500;
            }
            free(body);
        }
        j->req = NULL;
    }
    j->t_done = sn_now_s();
    srv_metrics_http(s->o.metrics, k_route_names[j->route], j->method, status, j->t_done - j->t_accept);
    srv_metrics_inflight(s->o.metrics, -1);
    if (j->t_start > 0 && (ok || j->result == SN_E_CANCELLED)) {
        srv_infer_sample is = {
            .stop_reason = (j->result == SN_E_CANCELLED || strcmp(finish, "cancelled") == 0) ? "cancelled" : finish,
            .prompt_tokens = j->gen.prompt_tokens ? j->gen.prompt_tokens : j->prompt_tokens,
            .completion_tokens = j->gen.completion_tokens ? j->gen.completion_tokens : j->completion_tokens,
            .queue_wait_s = j->t_start - j->t_accept,
            .ttft_s = j->t_first > 0 ? j->t_first - j->t_accept : -1,
            .duration_s = j->t_done - j->t_start,
            .decode_s = j->gen.decode_s,
            .pcache_used = j->gen.pcache_used,
            .cached_tokens = j->gen.cached_tokens,
            .pld_drafted = j->gen.pld_drafted,
            .pld_accepted = j->gen.pld_accepted,
        };
        srv_metrics_inference(s->o.metrics, &is);
    } else if (j->t_start > 0 && status >= 500) {
        srv_infer_sample is = {.stop_reason = "error", .queue_wait_s = j->t_start - j->t_accept,
                               .ttft_s = -1, .duration_s = j->t_done - j->t_start};
        srv_metrics_inference(s->o.metrics, &is);
    }
    log_line(s, j, k_route_names[j->route], j->method, j->client, j->cn, status, j->t_done - j->t_accept);
    live_remove(s, j);
    job_free(j);
}

static sn_status buf_append(char **p, size_t *n, size_t *cap, const char *src, size_t len)
{
    if (len == 0) return SN_OK;
    if (*n + len + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        while (nc < *n + len + 1) nc *= 2;
        char *q = realloc(*p, nc);
        if (!q) return SN_FAIL(SN_E_NOMEM, "server: out of memory growing a text buffer to %zu bytes", nc);
        *p = q;
        *cap = nc;
    }
    memcpy(*p + *n, src, len);
    *n += len;
    (*p)[*n] = 0;
    return SN_OK;
}

/* Deliver what the worker produced since the last notification. */
static void job_progress(srv *s, srv_job *j)
{
    pthread_mutex_lock(&s->mu);
    j->notified = false;
    bool started = j->started, done = j->worker_done;
    char *text = j->out;
    size_t text_len = j->out_len;
    j->out = NULL;
    j->out_len = j->out_cap = 0;
    pthread_mutex_unlock(&s->mu);

    if (j->req && !j->client_gone) {
        if (j->creq.stream) {
            srv_resp_meta meta = {j->id, (long long)time(NULL), s->o.model_id, s->o.fingerprint};
            struct evbuffer *b = evbuffer_new();
            if (b && started && !j->headers_sent && (!done || j->result == SN_OK)) {
                add_common_headers(s, j->req, "text/event-stream");
                struct evkeyvalq *h = evhttp_request_get_output_headers(j->req);
                evhttp_add_header(h, "Cache-Control", "no-cache");
                evhttp_add_header(h, "X-Accel-Buffering", "no");
                evhttp_add_header(h, "X-Request-Id", j->id);
                evhttp_send_reply_start(j->req, 200, "OK");
                j->headers_sent = true;
                char *c = srv_chunk_sse(&meta, "assistant", NULL, 0, NULL);
                if (c) evbuffer_add(b, c, strlen(c));
                free(c);
            }
            if (b && j->headers_sent && text_len > 0) {
                char *c = srv_chunk_sse(&meta, NULL, text, text_len, NULL);
                if (c) evbuffer_add(b, c, strlen(c));
                free(c);
            }
            if (b && evbuffer_get_length(b) > 0) evhttp_send_reply_chunk(j->req, b);
            if (b) evbuffer_free(b);
            if (j->headers_sent && peer_closed(j)) mark_gone(j);
            struct bufferevent *bev = j->evcon ? evhttp_connection_get_bufferevent(j->evcon) : NULL;
            if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > STREAM_MAX_BACKLOG) {
                fprintf(stderr, "sanctum-mlx: %s: client stopped reading (%zu bytes queued); cancelling\n", j->id,
                        evbuffer_get_length(bufferevent_get_output(bev)));
                mark_gone(j);
            }
        } else if (text_len > 0) {
            if (buf_append(&j->full, &j->full_len, &j->full_cap, text, text_len) != SN_OK) {
                j->collect_failed = true;     /* answered 500 at the end */
                atomic_store(&j->cancel, 1);
            }
        }
    }
    free(text);
    if (done) job_complete(s, j);
}

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    srv *s = arg;
    (void)fd;
    (void)what;
    pthread_mutex_lock(&s->mu);
    srv_job *list = s->dirty;
    s->dirty = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        srv_job *next = list->dirty_next;
        job_progress(s, list);
        list = next;
    }
}

/* ---- worker ---- */

void srv_job_started(srv_job *j, int prompt_tokens)
{
    srv *s = j->s;
    pthread_mutex_lock(&s->mu);
    j->started = true;
    j->prompt_tokens = prompt_tokens;
    notify_locked(s, j);
    pthread_mutex_unlock(&s->mu);
}

sn_status srv_job_emit(srv_job *j, const char *text, size_t len, int n_tokens)
{
    srv *s = j->s;
    sn_status st = SN_OK;
    pthread_mutex_lock(&s->mu);
    if (n_tokens > 0 && j->t_first == 0) j->t_first = sn_now_s();
    j->completion_tokens = n_tokens;
    st = buf_append(&j->out, &j->out_len, &j->out_cap, text, len);
    if (len > 0 || n_tokens > 0) notify_locked(s, j);
    pthread_mutex_unlock(&s->mu);
    if (st != SN_OK) return st;
    return atomic_load(&j->cancel) ? SN_E_CANCELLED : SN_OK;
}

int srv_job_cancelled(srv_job *j) { return atomic_load(&j->cancel); }
int srv_job_flush_tokens(const srv_job *j) { return j->flush_tokens; }
int srv_job_max_tokens(const srv_job *j) { return j->max_tokens; }

static void *worker_main(void *arg)
{
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->q_head && !s->worker_stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->q_head) { pthread_mutex_unlock(&s->mu); break; }
        srv_job *j = s->q_head;
        s->q_head = j->q_next;
        if (!s->q_head) s->q_tail = NULL;
        atomic_fetch_sub(&s->q_len, 1);
        j->t_start = sn_now_s();
        atomic_store(&s->busy, 1);
        pthread_mutex_unlock(&s->mu);

        srv_gen_out out = {0};
        sn_status st;
        sn_clear_error();
        if (atomic_load(&j->cancel)) st = SN_E_CANCELLED;
        else st = s->o.engine.run(s->o.engine.ctx, j, &j->creq, &out);

        pthread_mutex_lock(&s->mu);
        j->gen = out;
        j->result = st;
        if (st != SN_OK && st != SN_E_CANCELLED) {
            /* Once the prompt is accepted (started) a range error is the
             * model's or the engine's (an id the tokenizer cannot decode, NaN
             * logits), not the client's prompt: 500, never
             * context_length_exceeded. */
            int code = (st == SN_E_RANGE && j->started) ? 500 : status_for(st);
            srv_err_set(&j->err, code, code == 400 ? "invalid_request_error" : "server_error",
                        (st == SN_E_RANGE && code == 400) ? "context_length_exceeded" : NULL,
                        (code == 400 && !j->started) ? "messages" : NULL, "%s",
                        sn_errmsg()[0] ? sn_errmsg() : sn_status_name(st));
            fprintf(stderr, "worker: request %s failed: %s (%s)\n", j->id, sn_errmsg(), sn_errloc());
        }
        j->worker_done = true;
        atomic_store(&s->busy, 0);
        notify_locked(s, j);   /* last touch of j by the worker */
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- routes ---- */

static route_id route_of(const char *path)
{
    if (!path) return R_OTHER;
    if (strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/chat/completions") == 0) return R_CHAT;
    if (strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/models/", 11) == 0) return R_MODELS;
    if (strcmp(path, "/health") == 0) return R_HEALTH;
    if (strcmp(path, "/metrics") == 0) return R_METRICS;
    return R_OTHER;
}

static void handle_chat(srv *s, struct evhttp_request *req, double t0)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len > s->o.max_body_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is %zu bytes, the limit is %zu", len, s->o.max_body_bytes);
        sync_error(s, req, R_CHAT, t0, 413, "invalid_request_error", "request_too_large", NULL, msg);
        return;
    }
    if (s->draining) {
        sync_error(s, req, R_CHAT, t0, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return;
    }
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        sync_error(s, req, R_CHAT, t0, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    const char *body = len ? (const char *)evbuffer_pullup(in, (ev_ssize_t)len) : "";
    srv_err e;
    if (srv_chat_parse(body ? body : "", body ? len : 0, &j->creq, &e) != SN_OK) {
        free(j);
        reply_error(s, req, &e);
        finish_sync(s, req, R_CHAT, t0, e.http_status);
        return;
    }
    if (j->creq.model && strcmp(j->creq.model, s->o.model_id) != 0) {
        srv_err_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                    "the model '%.200s' does not exist; this server serves '%s'", j->creq.model, s->o.model_id);
        job_free(j);
        reply_error(s, req, &e);
        finish_sync(s, req, R_CHAT, t0, 404);
        return;
    }
    /* --max-queue counts waiting requests; with 0 a request is taken only
     * when the worker is idle. */
    int waiting = atomic_load(&s->q_len);
    if (waiting >= s->o.max_queue && (waiting > 0 || atomic_load(&s->busy))) {
        job_free(j);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        sync_error(s, req, R_CHAT, t0, 503, "server_error", "queue_full", NULL,
                   "the request queue is full; retry later");
        return;
    }
    j->s = s;
    j->req = req;
    j->evcon = evhttp_request_get_connection(req);
    j->route = R_CHAT;
    snprintf(j->method, sizeof j->method, "POST");
    peer_of(req, j->client, sizeof j->client);
    const char *cn = s->o.client_id ? s->o.client_id(s->o.hook_ud, req) : NULL;
    snprintf(j->cn, sizeof j->cn, "%s", cn ? cn : "");
    j->t_accept = t0;
    j->max_tokens = j->creq.max_tokens > 0 ? j->creq.max_tokens : s->o.default_max_tokens;
    j->flush_tokens = j->creq.stream ? s->o.stream_flush_tokens : NONSTREAM_FLUSH_TOKENS;
    s->n_req++;
    snprintf(j->id, sizeof j->id, "chatcmpl-%012llx%06llx", (unsigned long long)(s->id_salt & 0xffffffffffffull),
             (unsigned long long)s->n_req);
    atomic_init(&j->cancel, 0);
    if (j->evcon) evhttp_connection_set_closecb(j->evcon, on_conn_close, j);
    j->live_next = s->live;
    if (s->live) s->live->live_prev = j;
    s->live = j;
    s->n_live++;
    srv_metrics_inflight(s->o.metrics, 1);

    pthread_mutex_lock(&s->mu);
    if (s->q_tail) s->q_tail->q_next = j;
    else s->q_head = j;
    s->q_tail = j;
    atomic_fetch_add(&s->q_len, 1);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Two Content-Length headers that disagree: evhttp framed the body by the
 * first one, a proxy in front may have used the other, and the bytes left
 * over would be read as a second request (request smuggling). RFC 9112
 * section 6.3 makes this an unrecoverable framing error. */
static const char *bad_framing(struct evhttp_request *req)
{
    const char *first = NULL;
    int n_te = 0;
    struct evkeyvalq *h = evhttp_request_get_input_headers(req);
    for (struct evkeyval *kv = h->tqh_first; kv; kv = kv->next.tqe_next) {
        if (strcasecmp(kv->key, "Transfer-Encoding") == 0) {
            /* evhttp decodes exactly "chunked" and frames anything else
             * ("gzip, chunked", "identity") by Content-Length, where a proxy
             * may not: refuse rather than guess (RFC 9112 section 6.1). */
            if (++n_te > 1 || strcasecmp(kv->value, "chunked") != 0) return "unsupported Transfer-Encoding";
            continue;
        }
        if (strcasecmp(kv->key, "Content-Length") != 0) continue;
        if (!first) first = kv->value;
        else if (strcmp(first, kv->value) != 0) return "conflicting Content-Length headers";
    }
    return NULL;
}

static void serve(srv *s, struct evhttp_request *req, const char *path, double t0);

/* Routes match the percent-decoded path ("/v1/%6dodels" is "/v1/models",
 * and a model id with a slash arrives as %2F); a path that decodes to a NUL
 * matches nothing. */
static void on_request(struct evhttp_request *req, void *arg)
{
    srv *s = arg;
    double t0 = sn_now_s();
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *raw = uri ? evhttp_uri_get_path(uri) : NULL;
    size_t n = 0;
    char *path = raw ? evhttp_uridecode(raw, 0, &n) : NULL;
    if (path && strlen(path) != n) {
        free(path);
        path = NULL;
    }
    serve(s, req, path ? path : raw, t0);
    free(path);
}

static void serve(srv *s, struct evhttp_request *req, const char *path, double t0)
{
    conn_touch(s, evhttp_request_get_connection(req));
    route_id r = route_of(path);
    enum evhttp_cmd_type m = evhttp_request_get_command(req);

    const char *framing = bad_framing(req);
    if (framing) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        sync_error(s, req, r, t0, 400, "invalid_request_error", "bad_framing", NULL, framing);
        return;
    }
    if (s->o.admit && !s->o.admit(s->o.hook_ud, req)) {
        finish_sync(s, req, r, t0, 401);
        return;
    }
    if (r == R_OTHER) {
        char msg[300];
        snprintf(msg, sizeof msg, "unknown route '%.200s'", path ? path : "?");
        sync_error(s, req, r, t0, 404, "invalid_request_error", "not_found", NULL, msg);
        return;
    }
    bool want_post = r == R_CHAT;
    /* HEAD is GET without the body (RFC 9110 section 9.3.2). */
    if ((want_post && m != EVHTTP_REQ_POST) || (!want_post && m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", want_post ? "POST" : "GET, HEAD");
        char msg[160];
        snprintf(msg, sizeof msg, "method %s is not allowed on %s (use %s)", method_name(m), k_route_names[r],
                 want_post ? "POST" : "GET");
        sync_error(s, req, r, t0, 405, "invalid_request_error", "method_not_allowed", NULL, msg);
        return;
    }
    switch (r) {
    case R_CHAT:
        handle_chat(s, req, t0);
        return;
    case R_MODELS:
        if (strcmp(path, "/v1/models") == 0) {
            reply_body(s, req, 200, "application/json", s->models_body, strlen(s->models_body));
            finish_sync(s, req, r, t0, 200);
        } else if (strcmp(path + 11, s->o.model_id) == 0) {   /* GET /v1/models/{id} */
            reply_body(s, req, 200, "application/json", s->model_body, strlen(s->model_body));
            finish_sync(s, req, r, t0, 200);
        } else {
            char msg[300];
            snprintf(msg, sizeof msg, "the model '%.200s' does not exist; this server serves '%s'", path + 11,
                     s->o.model_id);
            sync_error(s, req, r, t0, 404, "invalid_request_error", "model_not_found", "model", msg);
        }
        return;
    case R_HEALTH: {
        char body[512];
        int status = s->draining ? 503 : 200;
        int n = snprintf(body, sizeof body,
                         "{\"status\":\"%s\",\"model\":\"%s\",\"loaded\":true,\"ready\":%s,\"queue_depth\":%d,"
                         "\"max_queue\":%d}",
                         s->draining ? "draining" : "ok", s->o.model_id, s->draining ? "false" : "true",
                         atomic_load(&s->q_len), s->o.max_queue);
        reply_body(s, req, status, "application/json", body, (size_t)n < sizeof body ? (size_t)n : sizeof body - 1);
        finish_sync(s, req, r, t0, status);
        return;
    }
    case R_METRICS: {
        char *text = NULL;
        size_t len = 0;
        srv_metrics_queue_depth(s->o.metrics, atomic_load(&s->q_len));
        if (srv_metrics_render(s->o.metrics, &text, &len) != SN_OK) {
            sync_error(s, req, r, t0, 500, "server_error", NULL, NULL, sn_errmsg());
            return;
        }
        reply_body(s, req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
        free(text);
        finish_sync(s, req, r, t0, 200);
        return;
    }
    case R_OTHER:
        break;
    }
}

/* ---- listeners ---- */

sn_status srv_http_new(srv *s, struct evhttp **out)
{
    if (s->n_http >= SRV_MAX_HTTP) return SN_FAIL(SN_E_RANGE, "server: too many HTTP front ends");
    struct evhttp *h = evhttp_new(s->base);
    if (!h) return SN_FAIL(SN_E_NOMEM, "server: evhttp_new failed");
    /* Bodies a bit over the limit still reach us so we answer a JSON 413;
     * far larger ones are cut off by evhttp itself (also 413). */
    size_t cap = s->o.max_body_bytes + (1u << 20);
    evhttp_set_max_body_size(h, (ev_ssize_t)cap);
    evhttp_set_max_headers_size(h, 64 * 1024);
    /* Idle and stalled connections go after 2 minutes (a generation in
     * progress does not count: evhttp stops reading once the request is in). */
    evhttp_set_timeout(h, 120);
    evhttp_set_allowed_methods(h, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
                                      EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(h, on_request, s);
    /* A front end with its own bufferevents (TLS) replaces this callback
     * and goes without the request deadline. */
    if (s->o.request_timeout_s > 0) evhttp_set_bevcb(h, conn_bevcb, s);
    s->https[s->n_http++] = h;
    *out = h;
    return SN_OK;
}

/* The listener's error callback gets evhttp's own argument, not ours, so
 * the one server of this process is found here (set by srv_run). */
static srv *g_accept_srv;

static const char k_shed_reply[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    "Connection: close\r\nContent-Length: 124\r\n\r\n"
    "{\"error\":{\"message\":\"the server is out of connections; retry later\",\"type\":\"server_error\",\"param\":null,"
    "\"code\":\"overloaded\"}}";

/* accept() failed for a reason other than EAGAIN/EINTR. On EMFILE/ENFILE
 * the pending connection stays in the backlog, so the listener is readable
 * again at once: give up the reserve descriptor, take the waiting
 * connections one at a time and answer each a short 503 (best effort, the
 * socket is fresh so the write fits), then pause accepting for 100 ms so a
 * flood cannot spin the loop. Any other error just pauses. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
    (void)arg;
    int err = EVUTIL_SOCKET_ERROR();
    srv *s = g_accept_srv;
    if (!s) return;
    unsigned long long shed = 0;
    if ((err == EMFILE || err == ENFILE) && s->reserve_fd >= 0) {
        evutil_socket_t lfd = evconnlistener_get_fd(lev);
        for (int i = 0; i < 64; i++) {
            close(s->reserve_fd);
            s->reserve_fd = -1;
            int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c >= 0) {
                ssize_t w = send(c, k_shed_reply, sizeof k_shed_reply - 1, MSG_NOSIGNAL);
                (void)w;
                /* Closing with the request unread would send a reset that
                 * can destroy the reply at the client: drop what came. */
                shutdown(c, SHUT_WR);
                char sink[4096];
                while (recv(c, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
                close(c);
                shed++;
            }
            s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (c < 0 || s->reserve_fd < 0) break;
        }
    }
    s->accept_shed += shed;
    double now = sn_now_s();
    if (now - s->accept_warned_at >= 5.0) {
        s->accept_warned_at = now;
        fprintf(stderr, "sanctum-mlx: accept failed: %s; %llu connection(s) refused with 503 so far; pausing accepts "
                        "100 ms\n", strerror(err), s->accept_shed);
    }
    for (int i = 0; i < s->n_bound; i++) evconnlistener_disable(evhttp_bound_socket_get_listener(s->bound[i]));
    s->accept_paused = true;
    s->paused_until = now + 0.1;
}

static void resume_accepting(srv *s)
{
    if (!s->accept_paused || sn_now_s() < s->paused_until) return;
    if (s->reserve_fd < 0) s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int i = 0; i < s->n_bound; i++) evconnlistener_enable(evhttp_bound_socket_get_listener(s->bound[i]));
    s->accept_paused = false;
}

static bool is_loopback_host(const char *host)
{
    if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0) return true;
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    struct in6_addr a6;
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        return memcmp(a6.s6_addr, v4mapped, 12) == 0 && a6.s6_addr[12] == 127;
    }
    return false;
}

sn_status srv_http_bind(srv *s, struct evhttp *http, const char *host, int port, bool *bound)
{
    *bound = false;
    if (s->n_bound >= SRV_MAX_BOUND) return SN_FAIL(SN_E_RANGE, "server: too many listeners (max %d)", SRV_MAX_BOUND);
    struct evhttp_bound_socket *b = evhttp_bind_socket_with_handle(http, host, (ev_uint16_t)port);
    if (!b) {
        int err = errno;
        if (is_loopback_host(host))
            return SN_FAIL(SN_E_IO, "cannot bind loopback %s:%d: %s", host, port, strerror(err));
        fprintf(stderr, "sanctum-mlx: warning: cannot bind %s:%d (%s); skipping this address\n", host, port,
                strerror(err));
        return SN_OK;
    }
    evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(b), on_accept_error);
    if (listen(evhttp_bound_socket_get_fd(b), SRV_BACKLOG) != 0) /* already listening: this only deepens the queue */
        fprintf(stderr, "sanctum-mlx: warning: listen backlog %d on %s:%d: %s\n", SRV_BACKLOG, host, port,
                strerror(errno));
    s->bound[s->n_bound] = b;
    s->bound_http[s->n_bound] = http;
    s->n_bound++;
    *bound = true;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int actual = port;
    if (getsockname(evhttp_bound_socket_get_fd(b), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) actual = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6) actual = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    fprintf(stderr, "sanctum-mlx: listening on %s:%d\n", host, actual);
    return SN_OK;
}

/* ---- lifecycle ---- */

static void stop_accepting(srv *s)
{
    for (int i = 0; i < s->n_bound; i++) evhttp_del_accept_socket(s->bound_http[i], s->bound[i]);
    s->n_bound = 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    srv *s = arg;
    (void)what;
    if (s->draining) {
        fprintf(stderr, "sanctum-mlx: signal %d again while draining; cancelling in-flight work\n", (int)sig);
        s->drain_deadline = sn_now_s();
        return;
    }
    fprintf(stderr, "sanctum-mlx: signal %d: draining (%d in flight, grace %.0fs)\n", (int)sig, s->n_live,
            s->o.shutdown_grace_s);
    s->draining = true;
    s->drain_deadline = sn_now_s() + s->o.shutdown_grace_s;
    stop_accepting(s);
}

/* ---- slow clients (slowloris) ----
 *
 * evhttp's timeout is per read, so a client trickling one header byte a
 * minute keeps its connection (and a descriptor) forever. The plain
 * front end creates each connection's bufferevent here (evhttp_set_bevcb),
 * keeps a reference to it, and every tick closes a connection that has been
 * waiting for a request (reading enabled, no job on it) for longer than
 * request_timeout_s since it opened or since its last request: that bounds
 * slow headers, slow or unfinished bodies and idle keep-alives alike.
 *
 * Why the reference is safe: bufferevents are made with BEV_OPT_CLOSE_ON_FREE,
 * so the descriptor stays open (and its number unreused) until our reference
 * goes too; evhttp_connection_free clears the callbacks, which is how a
 * sweep sees that evhttp let go. Only getcb/get_enabled/getfd and shutdown()
 * touch a tracked bufferevent; the shutdown makes evhttp see the close and
 * free the connection through its own path. */
struct conn_ent {
    struct bufferevent *bev;      /* NULL: empty slot */
    double since;                 /* opened, or last request seen / answered */
    bool reaped;
};

static size_t conn_slot(const srv *s, const struct bufferevent *bev)
{
    uint64_t h = ((uint64_t)(uintptr_t)bev >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (s->conns_cap - 1);
}

static struct conn_ent *conn_find(srv *s, const struct bufferevent *bev)
{
    if (!s->conns || !bev) return NULL;
    for (size_t i = conn_slot(s, bev);; i = (i + 1) & (s->conns_cap - 1)) {
        if (s->conns[i].bev == bev) return &s->conns[i];
        if (!s->conns[i].bev) return NULL;
    }
}

/* Rebuild at cap (a power of two), dropping entries with bev NULL. */
static sn_status conn_rehash(srv *s, size_t cap)
{
    struct conn_ent *t = calloc(cap, sizeof *t);
    if (!t) return SN_FAIL(SN_E_NOMEM, "server: out of memory tracking %zu connections", s->n_conns);
    struct conn_ent *old = s->conns;
    size_t old_cap = s->conns_cap;
    s->conns = t;
    s->conns_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].bev) continue;
        size_t k = conn_slot(s, old[i].bev);
        while (t[k].bev) k = (k + 1) & (cap - 1);
        t[k] = old[i];
    }
    free(old);
    return SN_OK;
}

static void conn_touch(srv *s, struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    struct conn_ent *e = conn_find(s, bev);
    if (e) e->since = sn_now_s();
}

static struct bufferevent *conn_bevcb(struct event_base *base, void *arg)
{
    srv *s = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) return NULL;   /* evhttp makes its own: that connection goes untracked */
    if ((s->n_conns + 1) * 2 > s->conns_cap && conn_rehash(s, s->conns_cap ? s->conns_cap * 2 : 256) != SN_OK)
        return bev;
    size_t k = conn_slot(s, bev);
    while (s->conns[k].bev) k = (k + 1) & (s->conns_cap - 1);
    bufferevent_incref(bev);
    s->conns[k] = (struct conn_ent){bev, sn_now_s(), false};
    s->n_conns++;
    return bev;
}

static bool conn_has_job(srv *s, struct bufferevent *bev)
{
    for (srv_job *j = s->live; j; j = j->live_next)
        if (j->evcon && evhttp_connection_get_bufferevent(j->evcon) == bev) return true;
    return false;
}

static void conn_sweep(srv *s, bool release_all)
{
    double now = sn_now_s();
    size_t dead = 0, reaped = 0;
    for (size_t i = 0; i < s->conns_cap; i++) {
        struct conn_ent *e = &s->conns[i];
        if (!e->bev) continue;
        bufferevent_event_cb eventcb = NULL;
        bufferevent_getcb(e->bev, NULL, NULL, &eventcb, NULL);
        if (release_all || !eventcb) {        /* evhttp let go (or we are exiting) */
            bufferevent_decref(e->bev);
            e->bev = NULL;
            dead++;
            continue;
        }
        if (e->reaped) continue;
        if (!(bufferevent_get_enabled(e->bev) & EV_READ) || conn_has_job(s, e->bev)) {
            e->since = now;                   /* answering: the clock starts after */
            continue;
        }
        if (now - e->since <= s->o.request_timeout_s) continue;
        evutil_socket_t fd = bufferevent_getfd(e->bev);
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
        e->reaped = true;
        reaped++;
    }
    s->n_conns -= dead;
    s->conn_reaped += reaped;
    if (dead && s->conns_cap) conn_rehash(s, s->conns_cap);   /* on failure the table stays as it was */
    if (reaped && now - s->conn_warned_at >= 5.0) {
        s->conn_warned_at = now;
        fprintf(stderr, "sanctum-mlx: closed %zu connection(s) with no complete request within %.0f s "
                        "(%llu so far)\n", reaped, s->o.request_timeout_s, s->conn_reaped);
    }
}

/* Every 100 ms: notice clients that vanished while queued or mid-generation
 * and drive the drain. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    srv *s = arg;
    (void)fd;
    (void)what;
    for (srv_job *j = s->live; j; j = j->live_next)
        if (!j->client_gone && peer_closed(j)) mark_gone(j);
    if (s->n_conns) conn_sweep(s, false);
    if (!s->draining) {
        resume_accepting(s);
        return;
    }
    if (s->n_live == 0) {
        double now = sn_now_s();
        if (s->flush_deadline == 0) s->flush_deadline = now + 2.0;
        if (s->flushing <= 0 || now >= s->flush_deadline) event_base_loopexit(s->base, NULL);
        return;
    }
    if (!s->grace_expired && sn_now_s() >= s->drain_deadline) {
        s->grace_expired = true;
        fprintf(stderr, "sanctum-mlx: shutdown grace over; cancelling %d request(s)\n", s->n_live);
        for (srv_job *j = s->live; j; j = j->live_next) atomic_store(&j->cancel, 1);
    }
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 0x100000001b3ull; }
    return h;
}

sn_status srv_run(const srv_opts *o)
{
    sn_status st = SN_OK;
    srv *s = calloc(1, sizeof *s);
    if (!s) return SN_FAIL(SN_E_NOMEM, "server: out of memory");
    s->o = *o;
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    g_accept_srv = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->q_len, 0);
    atomic_init(&s->busy, 0);
    s->started_at = (long long)time(NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_salt = fnv1a(0xcbf29ce484222325ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32), o->model_id);

    if (o->max_queue < 0 || o->stream_flush_tokens < 1 || o->default_max_tokens < 1 || o->max_body_bytes < 1 ||
        !(o->request_timeout_s >= 0)) {
        st = SN_FAIL(SN_E_INVALID, "server: bad options (max_queue %d, flush %d, max_tokens %d)", o->max_queue,
                     o->stream_flush_tokens, o->default_max_tokens);
        goto out;
    }
    if (evthread_use_pthreads() != 0) { st = SN_FAIL(SN_E_IO, "server: libevent threading unavailable"); goto out; }
    s->base = event_base_new();
    if (!s->base) { st = SN_FAIL(SN_E_IO, "server: event_base_new failed"); goto out; }
    s->models_body = srv_models_json(o->model_id, s->started_at);
    s->model_body = srv_model_json(o->model_id, s->started_at);
    if (!s->models_body || !s->model_body) { st = SN_FAIL(SN_E_NOMEM, "server: out of memory"); goto out; }
    s->notify_ev = event_new(s->base, -1, 0, on_notify, s);
    s->sigterm_ev = evsignal_new(s->base, SIGTERM, on_signal, s);
    s->sigint_ev = evsignal_new(s->base, SIGINT, on_signal, s);
    s->tick_ev = event_new(s->base, -1, EV_PERSIST, on_tick, s);
    if (!s->notify_ev || !s->sigterm_ev || !s->sigint_ev || !s->tick_ev) {
        st = SN_FAIL(SN_E_NOMEM, "server: cannot create events");
        goto out;
    }
    struct timeval tick = {0, 100000};
    event_add(s->sigterm_ev, NULL);
    event_add(s->sigint_ev, NULL);
    event_add(s->tick_ev, &tick);
    signal(SIGPIPE, SIG_IGN);

    if (o->n_hosts > 0) {
        struct evhttp *plain;
        if ((st = srv_http_new(s, &plain)) != SN_OK) goto out;
        for (size_t i = 0; i < o->n_hosts; i++) {
            bool bound;
            if ((st = srv_http_bind(s, plain, o->hosts[i], o->port, &bound)) != SN_OK) goto out;
        }
    }
    if (o->add_listeners && (st = o->add_listeners(o->hook_ud, s)) != SN_OK) goto out;
    if (s->n_bound == 0) { st = SN_FAIL(SN_E_IO, "server: no listener could be bound"); goto out; }

    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        st = SN_FAIL(SN_E_IO, "server: cannot start the inference worker");
        goto out;
    }
    s->worker_running = true;
    srv_metrics_model_loaded(o->metrics, 1);
    fprintf(stderr, "sanctum-mlx: ready (model %s, queue %d, flush every %d tokens)\n", o->model_id, o->max_queue,
            o->stream_flush_tokens);
    event_base_dispatch(s->base);
    fprintf(stderr, "sanctum-mlx: drained; exiting\n");

out:
    if (s->worker_running) {
        pthread_mutex_lock(&s->mu);
        s->worker_stop = true;
        for (srv_job *j = s->q_head; j; j = j->q_next) atomic_store(&j->cancel, 1);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->worker, NULL);
    }
    if (o->metrics) srv_metrics_model_loaded(o->metrics, 0);
    /* Jobs still live here only when the loop stopped early; their requests
     * die with the evhttp objects below. */
    while (s->live) {
        srv_job *j = s->live;
        if (j->evcon) evhttp_connection_set_closecb(j->evcon, NULL, NULL);
        live_remove(s, j);
        job_free(j);
    }
    for (int i = 0; i < s->n_http; i++) evhttp_free(s->https[i]);
    conn_sweep(s, true);
    free(s->conns);
    if (s->notify_ev) event_free(s->notify_ev);
    if (s->sigterm_ev) event_free(s->sigterm_ev);
    if (s->sigint_ev) event_free(s->sigint_ev);
    if (s->tick_ev) event_free(s->tick_ev);
    if (s->base) event_base_free(s->base);
    free(s->models_body);
    free(s->model_body);
    if (s->reserve_fd >= 0) close(s->reserve_fd);
    g_accept_srv = NULL;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return st;
}
