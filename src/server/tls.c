/* mTLS for evhttp (contract in tls.h).
 *
 * The security property is "no HTTP byte from an unauthenticated client is
 * ever parsed": OpenSSL finishes (or aborts) the handshake inside the
 * bufferevent_openssl layer, and evhttp only sees decrypted bytes after it.
 * Everything here therefore fails closed: a connection we cannot wrap in TLS
 * is dropped, never served in the clear. */
#include "server/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

struct sn_tls {
    /* The live context. sn_tls_reload builds a whole new one and swaps it
     * under mu; every SSL holds its own reference to the context it was
     * made from, so connections in flight are unaffected. */
    pthread_mutex_t mu;
    SSL_CTX *ctx;
    char *cert_path, *key_path, *ca_path, *crl_path;   /* kept for sn_tls_reload */
    pthread_t hup_tid;                                 /* sn_tls_reload_on_sighup */
    int hup_started;
    _Atomic uint64_t accepted;
    _Atomic uint64_t rejected;
};

/* Per-connection state hung on the SSL object, freed with it. */
typedef struct conn_state {
    char reason[256];   /* first verify failure, for the audit line */
    char cn[72];        /* sanitised CN once verified */
    int have_cn;
    int logged;         /* one audit line per connection */
} conn_state;

static int g_conn_idx = -1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void conn_state_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    free(ptr);
}

static void init_indices(void)
{
    g_conn_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, conn_state_free);
}

static conn_state *conn_get(SSL *ssl)
{
    if (g_conn_idx < 0)
        return NULL;
    conn_state *c = SSL_get_ex_data(ssl, g_conn_idx);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c && !SSL_set_ex_data(ssl, g_conn_idx, c)) {
            free(c);
            c = NULL;
        }
    }
    return c;
}

static const char *ossl_err(char *buf, size_t cap)
{
    unsigned long e = ERR_get_error();
    if (!e)
        snprintf(buf, cap, "unknown OpenSSL error");
    else
        ERR_error_string_n(e, buf, cap);
    ERR_clear_error();
    return buf;
}

/* "addr:port" of the socket under ssl, for audit lines. */
static void peer_str(SSL *ssl, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = SSL_get_fd(ssl);
    snprintf(out, cap, "?");
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    char a[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
        port = ntohs(s4->sin_port);
        snprintf(out, cap, "%s:%u", a, port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
        port = ntohs(s6->sin6_port);
        snprintf(out, cap, "[%s]:%u", a, port);
    }
}

/* The CN goes into log lines and metrics: keep it to a safe alphabet so a
 * certificate cannot inject fields or newlines. */
static void sanitise(const unsigned char *in, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        unsigned char c = in[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                 c == '-' || c == '_' || c == '@';
        out[o++] = ok ? (char)c : '_';
    }
    out[o] = 0;
}

static int cert_cn(X509 *cert, char *out, size_t cap)
{
    X509_NAME *name = X509_get_subject_name(cert);
    int i = name ? X509_NAME_get_index_by_NID(name, NID_commonName, -1) : -1;
    if (i < 0)
        return 0;
    ASN1_STRING *s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    unsigned char *utf8 = NULL;
    int n = s ? ASN1_STRING_to_UTF8(&utf8, s) : -1;
    if (n <= 0) {
        OPENSSL_free(utf8);
        return 0;
    }
    sanitise(utf8, (size_t)n, out, cap);
    OPENSSL_free(utf8);
    return out[0] != 0;
}

static int verify_cb(int ok, X509_STORE_CTX *x)
{
    if (ok)
        return 1;
    SSL *ssl = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx());
    conn_state *c = ssl ? conn_get(ssl) : NULL;
    if (c && !c->reason[0]) {
        char subj[160] = "?";
        X509 *cur = X509_STORE_CTX_get_current_cert(x);
        if (cur)
            X509_NAME_oneline(X509_get_subject_name(cur), subj, sizeof subj);
        snprintf(c->reason, sizeof c->reason, "%s subject=%s",
                 X509_verify_cert_error_string(X509_STORE_CTX_get_error(x)), subj);
    }
    return 0;   /* fail the handshake: never accept an unverified client */
}

static void info_cb(const SSL *cssl, int where, int ret)
{
    SSL *ssl = (SSL *)cssl;
    sn_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    conn_state *c = conn_get(ssl);
    if (!t || !c || c->logged)
        return;
    char peer[80];
    if (where & SSL_CB_HANDSHAKE_DONE) {
        X509 *cert = SSL_get0_peer_certificate(ssl);
        if (!cert || SSL_get_verify_result(ssl) != X509_V_OK)
            return;   /* cannot happen with FAIL_IF_NO_PEER_CERT; never log it as accepted */
        c->have_cn = cert_cn(cert, c->cn, sizeof c->cn);
        c->logged = 1;
        atomic_fetch_add(&t->accepted, 1);
        peer_str(ssl, peer, sizeof peer);
        fprintf(stderr, "audit tls accept cn=%s peer=%s proto=%s cipher=%s\n", c->have_cn ? c->cn : "-", peer,
                SSL_get_version(ssl), SSL_get_cipher_name(ssl));
        return;
    }
    if ((where & SSL_CB_ALERT) && (ret >> 8) == SSL3_AL_FATAL) {
        c->logged = 1;
        atomic_fetch_add(&t->rejected, 1);
        peer_str(ssl, peer, sizeof peer);
        const char *why = c->reason[0] ? c->reason
                        : (where & SSL_CB_WRITE) && !SSL_get0_peer_certificate(ssl) ? "no client certificate"
                                                                                     : "handshake failed";
        fprintf(stderr, "audit tls reject peer=%s reason=%s alert=%s(%s)\n", peer, why,
                SSL_alert_desc_string_long(ret), (where & SSL_CB_WRITE) ? "sent" : "received");
    }
}

static const char *const TLS12_CIPHERS =
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256";
static const char *const TLS13_SUITES = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256";

/* Build a complete server context from the saved paths. Used by
 * sn_tls_new and sn_tls_reload, so a reload applies exactly the same
 * policy as startup. */
static sn_status build_ctx(sn_tls *t, SSL_CTX **out)
{
    sn_status st = SN_OK;
    char why[256];
    STACK_OF(X509_NAME) *names = NULL;
    *out = NULL;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return SN_FAIL(SN_E_BACKEND, "SSL_CTX_new: %s", ossl_err(why, sizeof why));
    SSL_CTX_set_app_data(ctx, t);
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 || SSL_CTX_set_cipher_list(ctx, TLS12_CIPHERS) != 1 ||
        SSL_CTX_set_ciphersuites(ctx, TLS13_SUITES) != 1) {
        st = SN_FAIL(SN_E_BACKEND, "TLS protocol/cipher setup: %s", ossl_err(why, sizeof why));
        goto out;
    }
    /* No compression (CRIME), no renegotiation, and no resumption: a resumed
     * session would skip the certificate and CRL checks, so a client revoked
     * after its first connection could keep coming back. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_TICKET);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);

    if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_path) != 1) {
        st = SN_FAIL(SN_E_FORMAT, "%s: cannot load the server certificate: %s", t->cert_path,
                     ossl_err(why, sizeof why));
        goto out;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, t->key_path, SSL_FILETYPE_PEM) != 1) {
        st = SN_FAIL(SN_E_FORMAT, "%s: cannot load the server key: %s", t->key_path, ossl_err(why, sizeof why));
        goto out;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        st = SN_FAIL(SN_E_VERIFY, "%s does not match %s: %s", t->key_path, t->cert_path, ossl_err(why, sizeof why));
        goto out;
    }
    X509 *srv = SSL_CTX_get0_certificate(ctx);
    if (srv && X509_cmp_current_time(X509_get0_notAfter(srv)) <= 0) {
        st = SN_FAIL(SN_E_VERIFY, "%s: the server certificate has expired", t->cert_path);
        goto out;
    }
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    if (X509_STORE_load_file(store, t->ca_path) != 1) {
        st = SN_FAIL(SN_E_FORMAT, "%s: cannot load the client CA: %s", t->ca_path, ossl_err(why, sizeof why));
        goto out;
    }
    names = SSL_load_client_CA_file(t->ca_path);
    if (!names) {
        st = SN_FAIL(SN_E_FORMAT, "%s: no CA certificate names: %s", t->ca_path, ossl_err(why, sizeof why));
        goto out;
    }
    SSL_CTX_set_client_CA_list(ctx, names);   /* takes ownership */
    if (t->crl_path) {
        X509_LOOKUP *lk = X509_STORE_add_lookup(store, X509_LOOKUP_file());
        int n = lk ? X509_load_crl_file(lk, t->crl_path, X509_FILETYPE_PEM) : 0;
        if (n <= 0) {
            st = SN_FAIL(SN_E_FORMAT, "%s: no CRL loaded: %s", t->crl_path, ossl_err(why, sizeof why));
            goto out;
        }
        /* Leaf check: our CA issues client certs directly. A CRL past its
         * nextUpdate fails every handshake: stale revocation data is not
         * trusted, so refresh it (deploy/mtls-gen-certs.sh). */
        X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT | SSL_VERIFY_CLIENT_ONCE, verify_cb);
    SSL_CTX_set_verify_depth(ctx, 4);
    SSL_CTX_set_info_callback(ctx, info_cb);
    *out = ctx;
    ctx = NULL;
out:
    SSL_CTX_free(ctx);
    return st;
}

/* The live context with a reference the caller must SSL_CTX_free. */
static SSL_CTX *ctx_get(const sn_tls *ct)
{
    sn_tls *t = (sn_tls *)ct;
    pthread_mutex_lock(&t->mu);
    SSL_CTX *c = t->ctx;
    SSL_CTX_up_ref(c);
    pthread_mutex_unlock(&t->mu);
    return c;
}

sn_status sn_tls_cert_covers(const sn_tls *t, const char *host)
{
    if (!t || !host)
        return SN_FAIL(SN_E_INVALID, "sn_tls_cert_covers: NULL argument");
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0)
        return SN_OK;
    SSL_CTX *ctx = ctx_get(t);
    X509 *cert = SSL_CTX_get0_certificate(ctx);
    unsigned char bin[16];
    int is_ip = inet_pton(AF_INET, host, bin) == 1 || inet_pton(AF_INET6, host, bin) == 1;
    int ok = cert && (is_ip ? X509_check_ip_asc(cert, host, 0) == 1 : X509_check_host(cert, host, 0, 0, NULL) == 1);
    char subj[160] = "?";
    if (cert)
        X509_NAME_oneline(X509_get_subject_name(cert), subj, sizeof subj);
    SSL_CTX_free(ctx);
    if (ok)
        return SN_OK;
    return SN_FAIL(SN_E_INVALID, "the server certificate (%s) has no subjectAltName for %s %s; clients that check it "
                                 "will refuse the connection (deploy/mtls-gen-certs.sh --host %s)",
                   subj, is_ip ? "IP" : "DNS", host, host);
}

sn_status sn_tls_reload(sn_tls *t)
{
    if (!t)
        return SN_FAIL(SN_E_INVALID, "sn_tls_reload: NULL");
    SSL_CTX *nctx = NULL;
    SN_TRY(build_ctx(t, &nctx));
    pthread_mutex_lock(&t->mu);
    SSL_CTX *old = t->ctx;
    t->ctx = nctx;
    pthread_mutex_unlock(&t->mu);
    SSL_CTX_free(old);   /* live connections keep their own references */
    return SN_OK;
}

static void *hup_main(void *arg)
{
    sn_tls *t = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0 || sig != SIGHUP)   /* sigwait is where sn_tls_free cancels us */
            continue;
        /* Not mid-reload: a cancel there would leak a half-built context. */
        int old;
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
        if (sn_tls_reload(t) == SN_OK)
            fprintf(stderr, "audit tls reload ok: certificate, key, CA and CRL re-read (SIGHUP)\n");
        else
            fprintf(stderr, "audit tls reload FAILED, previous configuration stays: %s\n", sn_errmsg());
        pthread_setcancelstate(old, NULL);
    }
    return NULL;
}

sn_status sn_tls_reload_on_sighup(sn_tls *t)
{
    if (!t)
        return SN_FAIL(SN_E_INVALID, "sn_tls_reload_on_sighup: NULL");
    if (t->hup_started)
        return SN_OK;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    /* Block it here so that threads created from now on inherit the mask
     * and the signal is only ever taken by sigwait below. */
    int e = pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (e != 0)
        return SN_FAIL(SN_E_BACKEND, "pthread_sigmask: %s", strerror(e));
    e = pthread_create(&t->hup_tid, NULL, hup_main, t);
    if (e != 0)
        return SN_FAIL(SN_E_BACKEND, "cannot start the SIGHUP thread: %s", strerror(e));
    t->hup_started = 1;
    return SN_OK;
}

sn_status sn_tls_new(const sn_tls_opts *o, sn_tls **out)
{
    sn_status st = SN_OK;
    sn_tls *t = NULL;
    *out = NULL;
    if (!o || !o->cert || !o->key || !o->ca)
        return SN_FAIL(SN_E_INVALID, "mTLS needs --tls-cert, --tls-key and --tls-ca");
    pthread_once(&g_once, init_indices);
    if (g_conn_idx < 0)
        return SN_FAIL(SN_E_BACKEND, "SSL_get_ex_new_index failed");
    t = calloc(1, sizeof *t);
    if (!t)
        return SN_FAIL(SN_E_NOMEM, "out of memory");
    pthread_mutex_init(&t->mu, NULL);
    t->cert_path = strdup(o->cert);
    t->key_path = strdup(o->key);
    t->ca_path = strdup(o->ca);
    t->crl_path = o->crl ? strdup(o->crl) : NULL;
    if (!t->cert_path || !t->key_path || !t->ca_path || (o->crl && !t->crl_path)) {
        st = SN_FAIL(SN_E_NOMEM, "out of memory");
        goto out;
    }
    st = build_ctx(t, &t->ctx);
    if (st != SN_OK)
        goto out;
    *out = t;
    t = NULL;
out:
    sn_tls_free(t);
    return st;
}

void sn_tls_free(sn_tls *t)
{
    if (!t)
        return;
    if (t->hup_started) {
        pthread_cancel(t->hup_tid);
        pthread_join(t->hup_tid, NULL);
    }
    SSL_CTX_free(t->ctx);
    pthread_mutex_destroy(&t->mu);
    free(t->cert_path);
    free(t->key_path);
    free(t->ca_path);
    free(t->crl_path);
    free(t);
}

SSL_CTX *sn_tls_ctx(sn_tls *t)
{
    if (!t)
        return NULL;
    pthread_mutex_lock(&t->mu);
    SSL_CTX *c = t->ctx;
    pthread_mutex_unlock(&t->mu);
    return c;
}

void sn_tls_stats(const sn_tls *t, uint64_t *accepted, uint64_t *rejected)
{
    if (accepted)
        *accepted = t ? atomic_load(&((sn_tls *)t)->accepted) : 0;
    if (rejected)
        *rejected = t ? atomic_load(&((sn_tls *)t)->rejected) : 0;
}

/* When no TLS connection can be built (out of memory), evhttp would fall
 * back to a plain bufferevent if we returned NULL: a connection served in
 * the clear on the TLS port. Instead hand it one whose input filter errors
 * on the first byte, so the connection is closed unread. */
static enum bufferevent_filter_result refuse_filter(struct evbuffer *src, struct evbuffer *dst, ev_ssize_t lim,
                                                    enum bufferevent_flush_mode mode, void *ctx)
{
    return BEV_ERROR;
}

static struct bufferevent *refusing_bev(struct event_base *base)
{
    struct bufferevent *under = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!under)
        return NULL;   /* nothing left to do: libevent itself is out of memory */
    struct bufferevent *f =
        bufferevent_filter_new(under, refuse_filter, refuse_filter, BEV_OPT_CLOSE_ON_FREE, NULL, NULL);
    if (!f)
        bufferevent_free(under);
    return f;
}

static struct bufferevent *tls_bevcb(struct event_base *base, void *arg)
{
    sn_tls *t = arg;
    SSL_CTX *ctx = ctx_get(t);
    SSL *ssl = SSL_new(ctx);   /* takes its own reference to ctx */
    SSL_CTX_free(ctx);
    if (!ssl) {
        fprintf(stderr, "tls: SSL_new failed; refusing the connection\n");
        ERR_clear_error();
        return refusing_bev(base);
    }
    /* evhttp sets the fd later (bufferevent_setfd), which installs the
     * socket BIO; the handshake starts on the first read. */
    struct bufferevent *bev =
        bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return refusing_bev(base);
    }
    /* Clients commonly close without close_notify; that is EOF, not an attack. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

void sn_tls_attach(sn_tls *t, struct evhttp *http)
{
    SN_ASSERT(t && http);
    evhttp_set_bevcb(http, tls_bevcb, t);
}

static SSL *request_ssl(struct evhttp_request *req)
{
    if (!req)
        return NULL;
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    return bev ? bufferevent_openssl_get_ssl(bev) : NULL;   /* NULL for plain bufferevents */
}

int sn_tls_request_verified(struct evhttp_request *req)
{
    SSL *ssl = request_ssl(req);
    return ssl && SSL_get0_peer_certificate(ssl) && SSL_get_verify_result(ssl) == X509_V_OK;
}

const char *sn_tls_client_cn(struct evhttp_request *req)
{
    SSL *ssl = request_ssl(req);
    if (!ssl)
        return NULL;
    conn_state *c = conn_get(ssl);
    if (!c)
        return NULL;
    if (!c->have_cn) {
        X509 *cert = SSL_get0_peer_certificate(ssl);
        if (!cert || SSL_get_verify_result(ssl) != X509_V_OK)
            return NULL;
        c->have_cn = cert_cn(cert, c->cn, sizeof c->cn);
    }
    return c->have_cn ? c->cn : NULL;
}
