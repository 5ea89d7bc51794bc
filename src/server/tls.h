/* mTLS listener support for evhttp (libevent 2.1 + OpenSSL 3).
 *
 * One sn_tls holds the server SSL_CTX: TLS 1.2+ only, AEAD ciphers (ECDHE
 * with AES-GCM / ChaCha20-Poly1305; TLS 1.3 suites are all AEAD), the server
 * certificate + key, the client CA, and optionally a CRL. Clients must
 * present a certificate chaining to the CA (SSL_VERIFY_PEER |
 * SSL_VERIFY_FAIL_IF_NO_PEER_CERT); expired, not-yet-valid and (with a CRL)
 * revoked certificates fail the handshake, so no HTTP byte of such a client
 * is ever parsed.
 *
 * Wiring (the server's main):
 *
 *     sn_tls *tls; sn_tls_opts o = { cert, key, ca, crl };
 *     if (sn_tls_new(&o, &tls) != SN_OK) { print sn_errmsg(); exit 1; }
 *     struct evhttp *https = evhttp_new(base);      // a separate evhttp:
 *     sn_tls_attach(tls, https);                     // bevcb is per evhttp
 *     for each --tls-host: evhttp_bind_socket_with_handle(https, host, port);
 *     ... same request callbacks as the plain evhttp ...
 *     in a request: const char *cn = sn_tls_client_cn(req); // NULL on plain
 *     at exit: evhttp_free(https); sn_tls_free(tls);  // tls outlives https
 *
 * Audit: each verified handshake writes one line to stderr
 *   "audit tls accept cn=<CN> peer=<addr>:<port> proto=TLSv1.3 cipher=<name>"
 * and each failed one (fatal alert sent or received) one line
 *   "audit tls reject peer=<addr>:<port> reason=<X509 verify error> subject=<DN> alert=<desc>(sent)"
 * (no client certificate at all shows as reason=no client certificate). The CN
 * is sanitised to [A-Za-z0-9._@-] (other bytes become '_') before it is
 * logged or returned. */
#ifndef SANCTUM_SERVER_TLS_H
#define SANCTUM_SERVER_TLS_H

#include <stdint.h>

#include <openssl/ssl.h>

#include "sanctum/status.h"

struct evhttp;
struct evhttp_request;

typedef struct sn_tls_opts {
    const char *cert;   /* --tls-cert: PEM server certificate (chain allowed) */
    const char *key;    /* --tls-key:  PEM private key matching cert */
    const char *ca;     /* --tls-ca:   PEM CA bundle that client certs must chain to */
    const char *crl;    /* --tls-crl:  PEM CRL(s) of that CA; NULL disables revocation checks */
} sn_tls_opts;

typedef struct sn_tls sn_tls;

/* Build the SSL_CTX; every failure names the file and OpenSSL's reason
 * (SN_E_IO unreadable, SN_E_FORMAT unparsable, SN_E_VERIFY key/cert mismatch
 * or a server certificate that is itself expired). cert, key, ca required. */
sn_status sn_tls_new(const sn_tls_opts *opts, sn_tls **out);
void sn_tls_free(sn_tls *tls);

/* SN_OK when the server certificate's SANs cover `host` (an IP address or a
 * DNS name, as given to --tls-host), else SN_E_INVALID naming both: clients
 * that verify the server would then refuse it. Wildcard binds (0.0.0.0,
 * ::) cannot be checked and return SN_OK. Meant for a startup warning. */
sn_status sn_tls_cert_covers(const sn_tls *tls, const char *host);

/* Re-read all four files (--tls-cert, --tls-key, --tls-ca, --tls-crl: e.g.
 * on SIGHUP after `mtls-gen-certs.sh --revoke NAME` or a certificate
 * rotation), build a new context with the same policy and use it for every
 * handshake that starts afterwards; established connections keep going.
 * Safe to call from any thread. On failure (the message names the file) the
 * old context stays in force. */
sn_status sn_tls_reload(sn_tls *tls);

/* Reload (as above) whenever the process gets SIGHUP, on a thread of its
 * own that sigwait()s for it; one audit line per reload says whether it
 * worked. SIGHUP is blocked in the calling thread, so call this before any
 * other thread is started (every later thread inherits the mask; an earlier
 * one could still take the signal's default action, termination). The
 * thread stops in sn_tls_free. */
sn_status sn_tls_reload_on_sighup(sn_tls *tls);

/* The live context, e.g. for tests. Owned by tls; valid until the next
 * sn_tls_reload. */
SSL_CTX *sn_tls_ctx(sn_tls *tls);

/* Make every connection accepted by `http` a TLS server connection
 * (evhttp_set_bevcb + bufferevent_openssl_socket_new(BUFFEREVENT_SSL_ACCEPTING)). */
void sn_tls_attach(sn_tls *tls, struct evhttp *http);

/* Client certificate CN of the connection carrying `req`, or NULL when the
 * request came over plain HTTP (or the certificate has no CN). The string
 * lives as long as the connection; copy it to keep it. */
const char *sn_tls_client_cn(struct evhttp_request *req);

/* 1 when the request came over a TLS connection whose client certificate
 * verified (whether or not it carries a CN); 0 for plain HTTP. */
int sn_tls_request_verified(struct evhttp_request *req);

/* Handshake counters since sn_tls_new (for /metrics). Either pointer may be NULL. */
void sn_tls_stats(const sn_tls *tls, uint64_t *accepted, uint64_t *rejected);

#endif
