/* mTLS listener on loopback, in process: an evhttp server wired with
 * sn_tls_attach and real OpenSSL clients using certificates made by
 * deploy/mtls-gen-certs.sh. Every rejection must happen in the handshake:
 * the request handler counts what reached HTTP, and that count must not
 * move for a rejected client. */
#include "harness.h"
#include "evhttp_test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/thread.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "server/tls.h"

static char g_dir[64];      /* certificates of the good CA */
static char g_other[80];    /* a second, untrusted CA */
static char g_log[96];      /* captured stderr of the server thread */

static const char *P(const char *base, const char *rel)
{
    static char bufs[64][256];   /* rotating: a test holds at most ~20 at once */
    static int k;
    char *b = bufs[k++ & 63];
    snprintf(b, 256, "%s/%s", base, rel);
    return b;
}

typedef struct server {
    struct event_base *base;
    struct evhttp *http;
    sn_tls *tls;
    pthread_t tid;
    int port;
    int handled;
} server;

static void on_request(struct evhttp_request *req, void *arg)
{
    server *s = arg;
    __atomic_add_fetch(&s->handled, 1, __ATOMIC_SEQ_CST);
    const char *cn = sn_tls_client_cn(req);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "cn=%s v=%d\n", cn ? cn : "(none)", sn_tls_request_verified(req));
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static int server_start(server *s, const char *crl)
{
    memset(s, 0, sizeof *s);
    sn_tls_opts o = { P(g_dir, "server.crt"), P(g_dir, "server.key"), P(g_dir, "ca.crt"), crl };
    if (sn_tls_new(&o, &s->tls) != SN_OK) {
        fprintf(stderr, "  sn_tls_new: %s\n", sn_errmsg());
        return -1;
    }
    s->base = event_base_new();
    s->http = s->base ? evhttp_new(s->base) : NULL;
    if (!s->http)
        return -1;
    sn_tls_attach(s->tls, s->http);
    evhttp_set_gencb(s->http, on_request, s);
    evhttp_set_timeout(s->http, 2);   /* short, so the idle-handshake test is quick */
    return test_http_listen(s->base, s->http, "127.0.0.1", &s->port, &s->tid);
}

static void server_stop(server *s)
{
    test_http_close(s->base, s->http, s->tid);
    sn_tls_free(s->tls);
}

typedef struct client_opts {
    const char *cert, *key;   /* NULL: no client certificate */
    int max_version;          /* 0: any */
    const char *cipher_list;  /* TLS 1.2 ciphers to offer, NULL: default */
} client_opts;

/* Connect, handshake, GET /. Returns the HTTP status (200) or 0 when the
 * server refused us (handshake or the alert right after it, as in TLS 1.3
 * where the client finishes first). body gets the response body. */
static int tls_get(int port, const client_opts *co, char *body, size_t cap)
{
    int code = 0;
    body[0] = 0;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl = NULL;
    int fd = -1;
    if (!ctx)
        goto out;
    SSL_CTX_set_min_proto_version(ctx, TLS1_VERSION);
    SSL_CTX_set_security_level(ctx, 0);   /* let the client offer old versions: the server must refuse them */
    if (co->max_version)
        SSL_CTX_set_max_proto_version(ctx, co->max_version);
    if (co->cipher_list)
        SSL_CTX_set_cipher_list(ctx, co->cipher_list);
    SSL_CTX_load_verify_locations(ctx, P(g_dir, "ca.crt"), NULL);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (co->cert && (SSL_CTX_use_certificate_file(ctx, co->cert, SSL_FILETYPE_PEM) != 1 ||
                     SSL_CTX_use_PrivateKey_file(ctx, co->key, SSL_FILETYPE_PEM) != 1)) {
        fprintf(stderr, "  client cannot load %s\n", co->cert);
        goto out;
    }
    struct sockaddr_in sa;
    fd = test_tcp_socket("127.0.0.1", port, 5, &sa);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        goto out;
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), "127.0.0.1");   /* the server's SAN */
    if (SSL_connect(ssl) != 1)
        goto out;
    const char req[] = "GET /v1/models HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (SSL_write(ssl, req, sizeof req - 1) <= 0)
        goto out;
    char resp[4096];
    size_t got = 0;
    for (;;) {
        int r = SSL_read(ssl, resp + got, (int)(sizeof resp - 1 - got));
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    resp[got] = 0;
    sscanf(resp, "HTTP/1.%*d %d", &code);
    const char *b = strstr(resp, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
out:
    ERR_clear_error();
    SSL_free(ssl);
    if (fd >= 0)
        close(fd);
    SSL_CTX_free(ctx);
    return code;
}

/* Server stderr goes to g_log while a test runs, so audit lines can be checked. */
static int g_saved_stderr = -1;
static void capture_begin(void)
{
    fflush(stderr);
    g_saved_stderr = dup(2);
    int fd = open(g_log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
}
static char *capture_end(void)
{
    fflush(stderr);
    dup2(g_saved_stderr, 2);
    close(g_saved_stderr);
    static char buf[16384];
    FILE *f = fopen(g_log, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return buf;
}

static void test_valid_client(void)
{
    server s;
    char body[256];
    if (server_start(&s, P(g_dir, "crl.pem")) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    client_opts alice = { P(g_dir, "clients/alice.crt"), P(g_dir, "clients/alice.key"), 0, NULL };
    capture_begin();
    int c13 = tls_get(s.port, &alice, body, sizeof body);
    char body12[256];
    client_opts alice12 = alice;
    alice12.max_version = TLS1_2_VERSION;
    int c12 = tls_get(s.port, &alice12, body12, sizeof body12);
    server_stop(&s);   /* joins the server thread: its lines are written */
    char *log = capture_end();
    CHECK(c13 == 200);
    CHECKF(strcmp(body, "cn=alice v=1\n") == 0, "body '%s'", body);
    CHECK(c12 == 200);
    CHECKF(strcmp(body12, "cn=alice v=1\n") == 0, "body '%s'", body12);
    CHECKF(strstr(log, "audit tls accept cn=alice peer=127.0.0.1:") != NULL, "log: %s", log);
    CHECKF(strstr(log, "proto=TLSv1.3") && strstr(log, "proto=TLSv1.2"), "log: %s", log);
    CHECK(s.handled == 2);
}

/* Each rejected client: refused before HTTP, with a reason in the audit line. */
static void expect_reject(server *s, const client_opts *co, const char *reason)
{
    char body[256];
    int before = __atomic_load_n(&s->handled, __ATOMIC_SEQ_CST);
    capture_begin();
    int code = tls_get(s->port, co, body, sizeof body);
    usleep(100 * 1000);   /* the server logs on its own thread */
    char *log = capture_end();
    CHECKF(code == 0, "%s: got HTTP %d", reason, code);
    CHECKF(__atomic_load_n(&s->handled, __ATOMIC_SEQ_CST) == before, "%s: request reached HTTP", reason);
    CHECKF(strstr(log, "audit tls reject") && strstr(log, reason), "want '%s' in log: %s", reason, log);
}

static void test_rejected_clients(void)
{
    server s;
    if (server_start(&s, P(g_dir, "crl.pem")) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    client_opts none = { NULL, NULL, 0, NULL };
    client_opts none12 = { NULL, NULL, TLS1_2_VERSION, NULL };
    client_opts other = { P(g_other, "clients/mallory.crt"), P(g_other, "clients/mallory.key"), 0, NULL };
    client_opts bob = { P(g_dir, "clients/bob.crt"), P(g_dir, "clients/bob.key"), 0, NULL };
    client_opts old = { P(g_dir, "clients/old.crt"), P(g_dir, "clients/old.key"), 0, NULL };
    client_opts tls11 = { P(g_dir, "clients/alice.crt"), P(g_dir, "clients/alice.key"), TLS1_1_VERSION, NULL };
    client_opts cbc = { P(g_dir, "clients/alice.crt"), P(g_dir, "clients/alice.key"), TLS1_2_VERSION,
                        "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA384" };
    expect_reject(&s, &none, "no client certificate");
    expect_reject(&s, &none12, "no client certificate");
    expect_reject(&s, &other, "unable to get local issuer certificate");
    expect_reject(&s, &bob, "certificate revoked");
    expect_reject(&s, &old, "certificate has expired");
    expect_reject(&s, &tls11, "alert=");
    expect_reject(&s, &cbc, "alert=");
    uint64_t acc = 0, rej = 0;
    sn_tls_stats(s.tls, &acc, &rej);
    CHECKF(acc == 0 && rej == 7, "accepted %llu rejected %llu", (unsigned long long)acc, (unsigned long long)rej);
    server_stop(&s);
}

/* Plain HTTP to the TLS port never reaches the HTTP layer. */
static void test_plain_to_tls_port(void)
{
    server s;
    if (server_start(&s, NULL) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    struct sockaddr_in sa;
    int fd = test_tcp_socket("127.0.0.1", s.port, 5, &sa);
    char resp[512] = { 0 };
    capture_begin();
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        const char req[] = "GET /v1/models HTTP/1.0\r\n\r\n";
        if (write(fd, req, sizeof req - 1) > 0) {
            ssize_t r = read(fd, resp, sizeof resp - 1);
            (void)r;
        }
    }
    close(fd);
    usleep(100 * 1000);
    capture_end();
    CHECKF(strncmp(resp, "HTTP/", 5) != 0, "plain request answered: %s", resp);
    CHECK(s.handled == 0);
    server_stop(&s);
}

/* Revocation without a restart: revoke, sn_tls_reload, refused. A broken
 * CRL on reload keeps the old trust in force. (The reload runs here while
 * no connection is in flight; the server calls it on its loop thread.) */
static void test_crl_reload(void)
{
    server s;
    char body[256], cmd[512];
    snprintf(cmd, sizeof cmd, "deploy/mtls-gen-certs.sh --out '%s' --client carol >/dev/null", g_dir);
    CHECK(system(cmd) == 0);
    /* A copy of the CRL that the test can break and restore. */
    char crl[160];
    snprintf(crl, sizeof crl, "%s/live-crl.pem", g_dir);
    snprintf(cmd, sizeof cmd, "cp '%s/crl.pem' '%s'", g_dir, crl);
    CHECK(system(cmd) == 0);
    if (server_start(&s, crl) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    client_opts carol = { P(g_dir, "clients/carol.crt"), P(g_dir, "clients/carol.key"), 0, NULL };
    client_opts alice = { P(g_dir, "clients/alice.crt"), P(g_dir, "clients/alice.key"), 0, NULL };
    capture_begin();
    int before = tls_get(s.port, &carol, body, sizeof body);
    snprintf(cmd, sizeof cmd, "deploy/mtls-gen-certs.sh --out '%s' --revoke carol >/dev/null && cp '%s/crl.pem' '%s'",
             g_dir, g_dir, crl);
    int revoked = system(cmd);
    int stale = tls_get(s.port, &carol, body, sizeof body);   /* old CRL still loaded */
    sn_status r1 = sn_tls_reload(s.tls);
    int after = tls_get(s.port, &carol, body, sizeof body);
    FILE *f = fopen(crl, "w");
    if (f) {
        fputs("not a CRL\n", f);
        fclose(f);
    }
    sn_status r2 = sn_tls_reload(s.tls);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", sn_errmsg());
    int alice_ok = tls_get(s.port, &alice, body, sizeof body);
    int carol_still = tls_get(s.port, &carol, body, sizeof body);
    usleep(100 * 1000);
    char *log = capture_end();
    CHECK(before == 200);
    CHECK(revoked == 0);
    CHECK(stale == 200);
    CHECK(r1 == SN_OK);
    CHECK(after == 0);
    CHECK(r2 == SN_E_FORMAT);
    CHECKF(strstr(msg, "live-crl.pem") != NULL, "%s", msg);
    CHECK(alice_ok == 200);
    CHECK(carol_still == 0);
    CHECKF(strstr(log, "reason=certificate revoked subject=/CN=carol") != NULL, "log: %s", log);

    /* Server certificate rotation through the same reload: new SANs. */
    CHECK(sn_tls_cert_covers(s.tls, "10.9.8.7") == SN_E_INVALID);
    snprintf(cmd, sizeof cmd,
             "cp '%s/crl.pem' '%s' && deploy/mtls-gen-certs.sh --out '%s' --host 127.0.0.1 --host 10.9.8.7 >/dev/null",
             g_dir, crl, g_dir);
    CHECK(system(cmd) == 0);
    CHECK_OK(sn_tls_reload(s.tls));
    CHECK_OK(sn_tls_cert_covers(s.tls, "10.9.8.7"));
    capture_begin();
    int rotated = tls_get(s.port, &alice, body, sizeof body);
    capture_end();
    CHECK(rotated == 200);
    server_stop(&s);
}

/* The same through SIGHUP and sn_tls_reload_on_sighup's thread. */
static void test_sighup_reload(void)
{
    server s;
    char body[256], cmd[512], crl[160];
    snprintf(crl, sizeof crl, "%s/hup-crl.pem", g_dir);
    snprintf(cmd, sizeof cmd, "deploy/mtls-gen-certs.sh --out '%s' --client dave >/dev/null && cp '%s/crl.pem' '%s'",
             g_dir, g_dir, crl);
    CHECK(system(cmd) == 0);
    /* Block SIGHUP before the server thread exists, as main() does by
     * calling sn_tls_reload_on_sighup before starting threads. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (server_start(&s, crl) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    CHECK_OK(sn_tls_reload_on_sighup(s.tls));
    CHECK_OK(sn_tls_reload_on_sighup(s.tls));   /* idempotent */
    client_opts dave = { P(g_dir, "clients/dave.crt"), P(g_dir, "clients/dave.key"), 0, NULL };
    capture_begin();
    int before = tls_get(s.port, &dave, body, sizeof body);
    snprintf(cmd, sizeof cmd, "deploy/mtls-gen-certs.sh --out '%s' --revoke dave >/dev/null && cp '%s/crl.pem' '%s'",
             g_dir, g_dir, crl);
    int revoked = system(cmd);
    kill(getpid(), SIGHUP);
    int reloaded = 0;
    for (int i = 0; i < 50 && !reloaded; i++) {
        usleep(50 * 1000);
        FILE *f = fopen(g_log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, "audit tls reload ok"))
                reloaded = 1;
        if (f)
            fclose(f);
    }
    int after = tls_get(s.port, &dave, body, sizeof body);
    capture_end();
    CHECK(before == 200);
    CHECK(revoked == 0);
    CHECK(reloaded);
    CHECK(after == 0);
    server_stop(&s);   /* cancels and joins the SIGHUP thread */
}

/* A client that connects and never starts the handshake is dropped by the
 * evhttp timeout: a TLS port must not be a slot-holding target. */
static void test_idle_handshake_dropped(void)
{
    server s;
    if (server_start(&s, NULL) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    struct sockaddr_in sa;
    int fd = test_tcp_socket("127.0.0.1", s.port, 10, &sa);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char c;
    ssize_t r = read(fd, &c, 1);   /* EOF when the server gives up on us */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECKF(r <= 0 && dt < 8.0, "read %zd after %.1f s", r, dt);
    fprintf(stderr, "  idle connection dropped after %.1f s\n", dt);
    close(fd);
    server_stop(&s);
}

/* Without --tls-crl the revoked certificate is accepted: proves the CRL is
 * what rejects bob above, not something accidental. */
static void test_crl_is_what_rejects(void)
{
    server s;
    char body[256];
    if (server_start(&s, NULL) != 0) {
        CHECK(!"server start");
        server_stop(&s);
        return;
    }
    client_opts bob = { P(g_dir, "clients/bob.crt"), P(g_dir, "clients/bob.key"), 0, NULL };
    capture_begin();
    int code = tls_get(s.port, &bob, body, sizeof body);
    capture_end();
    CHECK(code == 200);
    CHECK(strcmp(body, "cn=bob v=1\n") == 0);
    server_stop(&s);
}

static void test_config_errors(void)
{
    sn_tls *t = NULL;
    sn_tls_opts o = { P(g_dir, "server.crt"), P(g_dir, "server.key"), P(g_dir, "ca.crt"), NULL };
    CHECK_OK(sn_tls_new(&o, &t));
    CHECK(sn_tls_ctx(t) != NULL);
    CHECK(SSL_CTX_get_min_proto_version(sn_tls_ctx(t)) == TLS1_2_VERSION);
    CHECK((SSL_CTX_get_verify_mode(sn_tls_ctx(t)) & (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT)) ==
          (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT));
    sn_tls_free(t);
    sn_tls_free(NULL);
    t = NULL;
    sn_tls_opts miss = { P(g_dir, "nope.crt"), P(g_dir, "server.key"), P(g_dir, "ca.crt"), NULL };
    CHECK(sn_tls_new(&miss, &t) == SN_E_FORMAT && t == NULL);
    CHECKF(strstr(sn_errmsg(), "nope.crt") != NULL, "%s", sn_errmsg());
    sn_tls_opts mism = { P(g_dir, "server.crt"), P(g_dir, "clients/alice.key"), P(g_dir, "ca.crt"), NULL };
    CHECK(sn_tls_new(&mism, &t) != SN_OK && t == NULL);   /* OpenSSL refuses it at load: "key values mismatch" */
    CHECKF(strstr(sn_errmsg(), "alice.key") && strstr(sn_errmsg(), "mismatch"), "%s", sn_errmsg());
    sn_tls_opts badcrl = { P(g_dir, "server.crt"), P(g_dir, "server.key"), P(g_dir, "ca.crt"), P(g_dir, "ca.key") };
    CHECK(sn_tls_new(&badcrl, &t) == SN_E_FORMAT);
    CHECKF(strstr(sn_errmsg(), "CRL") != NULL, "%s", sn_errmsg());
    sn_tls_opts noca = { P(g_dir, "server.crt"), P(g_dir, "server.key"), NULL, NULL };
    CHECK(sn_tls_new(&noca, &t) == SN_E_INVALID);
    CHECK(sn_tls_client_cn(NULL) == NULL);
    CHECK(sn_tls_request_verified(NULL) == 0);
    /* SAN coverage of the --tls-host addresses (the cert has 127.0.0.1 and localhost) */
    CHECK_OK(sn_tls_new(&o, &t));
    CHECK_OK(sn_tls_cert_covers(t, "127.0.0.1"));
    CHECK_OK(sn_tls_cert_covers(t, "localhost"));
    CHECK_OK(sn_tls_cert_covers(t, "0.0.0.0"));
    CHECK(sn_tls_cert_covers(t, "10.1.2.3") == SN_E_INVALID);
    CHECKF(strstr(sn_errmsg(), "IP 10.1.2.3") != NULL, "%s", sn_errmsg());
    CHECK(sn_tls_cert_covers(t, "::1") == SN_E_INVALID);
    CHECK(sn_tls_cert_covers(t, "example.com") == SN_E_INVALID);
    sn_tls_free(t);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/sn_test_tls_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(g_other, sizeof g_other, "%s/other", g_dir);
    snprintf(g_log, sizeof g_log, "%s/server.log", g_dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "deploy/mtls-gen-certs.sh --out '%s' --host 127.0.0.1 --host localhost --client alice --client bob "
             "--expired-client old --revoke bob >/dev/null && "
             "deploy/mtls-gen-certs.sh --out '%s' --host 127.0.0.1 --client mallory >/dev/null",
             g_dir, g_other);
    int have_certs = access("deploy/mtls-gen-certs.sh", X_OK) == 0 && system("command -v openssl >/dev/null") == 0 &&
                     system(cmd) == 0;
    evthread_use_pthreads();
    signal(SIGPIPE, SIG_IGN);   /* a refused client writes into a closed socket */
    if (!have_certs) {
        fprintf(stderr, "  SKIP: cannot make certificates with deploy/mtls-gen-certs.sh (run from the repo root)\n");
    } else {
        RUN(test_config_errors);
        RUN(test_valid_client);
        RUN(test_rejected_clients);
        RUN(test_plain_to_tls_port);
        RUN(test_crl_is_what_rejects);
        RUN(test_idle_handshake_dropped);
        RUN(test_crl_reload);
        RUN(test_sighup_reload);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_END();
}
