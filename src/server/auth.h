/* Bearer-token authentication for plain HTTP listeners.
 *
 * Policy (fail closed):
 *   - requests whose path is on the allow-list ("/health" exactly; the query
 *     string is ignored) always pass;
 *   - requests that arrived over mTLS (sn_tls_request_verified) pass: the
 *     handshake already authenticated the client;
 *   - loopback peers (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104) pass;
 *   - SANCTUM_MLX_DISABLE_AUTH=1 in the environment at sn_auth_new time makes
 *     every request pass, with a loud warning on stderr;
 *   - otherwise the request needs `Authorization: Bearer <token>` equal to the
 *     token file's content (compared in constant time); without a token file
 *     every such request is denied.
 * A denied request gets 401 with `WWW-Authenticate: Bearer` and an
 * OpenAI-style body:
 *   {"error":{"message":"...","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}
 *
 * Wiring (the server's main):
 *     sn_auth *auth;
 *     if (sn_auth_new(token_file_or_NULL, &auth) != SN_OK) { print sn_errmsg(); exit 1; }
 *     for each plain bind address: if (sn_auth_check_bind(auth, addr) != SN_OK) refuse to start;
 *     first thing in every request callback: if (!sn_auth_http(auth, req)) return;
 *     at exit: sn_auth_free(auth); */
#ifndef SANCTUM_SERVER_AUTH_H
#define SANCTUM_SERVER_AUTH_H

#include <stddef.h>
#include <sys/socket.h>

#include "sanctum/status.h"

struct evhttp_request;

#define SN_AUTH_TOKEN_MAX 4096   /* longer token files are refused */

typedef struct sn_auth sn_auth;

typedef enum {
    SN_AUTH_ALLOW = 0,
    SN_AUTH_DENY_MISSING,     /* no Authorization header */
    SN_AUTH_DENY_MALFORMED,   /* header present but not "Bearer <token68>" */
    SN_AUTH_DENY_WRONG,       /* well-formed token that does not match */
    SN_AUTH_DENY_NO_TOKEN,    /* non-loopback request and no token configured */
} sn_auth_result;

/* token_file NULL: no token (only loopback / allow-listed / mTLS requests
 * pass). Refuses (SN_E_INVALID naming the file) a token file that is not a
 * regular file, is readable or writable by group/others, is empty after
 * trimming one trailing "\n" or "\r\n", exceeds SN_AUTH_TOKEN_MAX, or holds
 * bytes outside the RFC 6750 token68 alphabet. Reads
 * SANCTUM_MLX_DISABLE_AUTH. */
sn_status sn_auth_new(const char *token_file, sn_auth **out);
void sn_auth_free(sn_auth *a);

/* 1 when SANCTUM_MLX_DISABLE_AUTH=1 was in effect at sn_auth_new. */
int sn_auth_disabled(const sn_auth *a);

/* Refuse (SN_E_INVALID) to bind a plain listener to a non-loopback address
 * when no token is configured and auth is not disabled: that listener could
 * never serve anything but /health. addr is a numeric IPv4/IPv6 address or a
 * host name ("localhost" counts as loopback). */
sn_status sn_auth_check_bind(const sn_auth *a, const char *addr);

/* Strictly parse an Authorization header value: "Bearer" (case-insensitive
 * scheme), exactly one space, then a token68 (RFC 7235: [A-Za-z0-9-._~+/]+
 * then '='*), nothing after it. On success *tok and *tok_len point into hdr.
 * hdr need not be NUL-terminated. SN_E_INVALID otherwise. */
sn_status sn_auth_parse_bearer(const char *hdr, size_t len, const char **tok, size_t *tok_len);

/* 1 for a loopback address (see above). NULL is not loopback. */
int sn_auth_is_loopback(const struct sockaddr *sa);

/* The decision without libevent: path is the request path (no query), peer
 * the client address (NULL = unknown, not loopback), authorization the raw
 * header value or NULL, via_mtls nonzero when the connection is mTLS. */
sn_auth_result sn_auth_check(const sn_auth *a, const char *path, const struct sockaddr *peer,
                             const char *authorization, int via_mtls);

/* Body of the 401 for a result (static string, JSON). */
const char *sn_auth_error_body(sn_auth_result r);

/* evhttp glue: decide for `req`; on deny send the 401 and return 0; on allow
 * return 1 and send nothing. */
int sn_auth_http(const sn_auth *a, struct evhttp_request *req);

#endif
