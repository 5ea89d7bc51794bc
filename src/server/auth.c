/* Bearer-token authentication (policy and contract in auth.h).
 *
 * Fail closed everywhere: an unparsable header, a duplicated header, a
 * missing token file or an unknown peer address all deny. The comparison
 * runs over SHA-256 digests with CRYPTO_memcmp so its time depends neither
 * on where the first wrong byte is nor on the secret token's length. */
#include "server/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "server/tls.h"

struct sn_auth {
    int has_token;
    int disabled;
    unsigned char digest[32];   /* SHA-256 of the token: the token itself is not kept */
};

static const char *const ALLOW_LIST[] = { "/health" };

static int is_token68_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
           c == '_' || c == '~' || c == '+' || c == '/';
}

/* token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" */
static int is_token68(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n && is_token68_char(p[i]))
        i++;
    if (i == 0)
        return 0;
    while (i < n && p[i] == '=')
        i++;
    return i == n;
}

static int sha256(const void *p, size_t n, unsigned char out[32])
{
    unsigned int len = 0;
    return EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) == 1 && len == 32;
}

sn_status sn_auth_new(const char *token_file, sn_auth **out)
{
    sn_status st = SN_OK;
    unsigned char buf[SN_AUTH_TOKEN_MAX + 3];
    int fd = -1;
    *out = NULL;
    sn_auth *a = calloc(1, sizeof *a);
    if (!a)
        return SN_FAIL(SN_E_NOMEM, "out of memory");
    const char *env = getenv("SANCTUM_MLX_DISABLE_AUTH");
    if (env && strcmp(env, "1") == 0) {
        a->disabled = 1;
        fprintf(stderr,
                "sanctum: WARNING: ****************************************************************\n"
                "sanctum: WARNING: SANCTUM_MLX_DISABLE_AUTH=1: bearer-token authentication is OFF.\n"
                "sanctum: WARNING: every client that can reach a plain listener can use this server.\n"
                "sanctum: WARNING: ****************************************************************\n");
    } else if (env && *env) {
        fprintf(stderr, "sanctum: SANCTUM_MLX_DISABLE_AUTH='%.16s' ignored (only 1 disables auth)\n", env);
    }
    if (!token_file) {
        *out = a;
        return SN_OK;
    }
    fd = open(token_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = SN_FAIL(errno == ENOENT ? SN_E_MISSING : SN_E_IO, "%s: cannot open the auth token file: %s",
                     token_file, strerror(errno));
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = SN_FAIL(SN_E_INVALID, "%s: the auth token file is not a regular file", token_file);
        goto out;
    }
    if (sb.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
        st = SN_FAIL(SN_E_INVALID, "%s: the auth token file is accessible by group/others (mode %03o); chmod 600 it",
                     token_file, (unsigned)(sb.st_mode & 0777));
        goto out;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = SN_FAIL(SN_E_IO, "%s: read: %s", token_file, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == sizeof buf) {
            st = SN_FAIL(SN_E_RANGE, "%s: the auth token is longer than %d bytes", token_file, SN_AUTH_TOKEN_MAX);
            goto out;
        }
    }
    /* `echo TOKEN > file` leaves one newline; strip exactly that, nothing
     * more, so a token with deliberate trailing bytes is not silently cut. */
    if (n && buf[n - 1] == '\n') {
        n--;
        if (n && buf[n - 1] == '\r')
            n--;
    }
    if (n == 0) {
        st = SN_FAIL(SN_E_INVALID, "%s: the auth token file is empty", token_file);
        goto out;
    }
    if (n > SN_AUTH_TOKEN_MAX) {
        st = SN_FAIL(SN_E_RANGE, "%s: the auth token is longer than %d bytes", token_file, SN_AUTH_TOKEN_MAX);
        goto out;
    }
    if (!is_token68(buf, n)) {
        st = SN_FAIL(SN_E_INVALID, "%s: the auth token must be one line of [A-Za-z0-9-._~+/] (then optional '='), "
                                   "as an HTTP bearer token can carry", token_file);
        goto out;
    }
    if (!sha256(buf, n, a->digest)) {
        st = SN_FAIL(SN_E_BACKEND, "SHA-256 of the auth token failed");
        goto out;
    }
    a->has_token = 1;
    *out = a;
    a = NULL;
out:
    OPENSSL_cleanse(buf, sizeof buf);
    if (fd >= 0)
        close(fd);
    sn_auth_free(a);
    return st;
}

void sn_auth_free(sn_auth *a)
{
    if (!a)
        return;
    OPENSSL_cleanse(a, sizeof *a);
    free(a);
}

int sn_auth_disabled(const sn_auth *a) { return a && a->disabled; }

int sn_auth_is_loopback(const struct sockaddr *sa)
{
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        return (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr))
            return 1;
        return IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr) && s6->sin6_addr.s6_addr[12] == 127;
    }
    return 0;
}

sn_status sn_auth_check_bind(const sn_auth *a, const char *addr)
{
    if (!a || !addr)
        return SN_FAIL(SN_E_INVALID, "sn_auth_check_bind: NULL argument");
    if (a->disabled || a->has_token)
        return SN_OK;
    struct sockaddr_in s4 = { .sin_family = AF_INET };
    struct sockaddr_in6 s6 = { .sin6_family = AF_INET6 };
    int loop = 0;
    if (inet_pton(AF_INET, addr, &s4.sin_addr) == 1)
        loop = sn_auth_is_loopback((struct sockaddr *)&s4);
    else if (inet_pton(AF_INET6, addr, &s6.sin6_addr) == 1)
        loop = sn_auth_is_loopback((struct sockaddr *)&s6);
    else
        loop = strcasecmp(addr, "localhost") == 0;
    if (loop)
        return SN_OK;
    return SN_FAIL(SN_E_INVALID,
                   "refusing a plain HTTP listener on %s (not loopback) without --auth-token-file; use mTLS "
                   "(--tls-*), a token file, or SANCTUM_MLX_DISABLE_AUTH=1 to serve it unauthenticated",
                   addr);
}

sn_status sn_auth_parse_bearer(const char *hdr, size_t len, const char **tok, size_t *tok_len)
{
    static const char scheme[] = "Bearer";
    const size_t sl = sizeof scheme - 1;
    *tok = NULL;
    *tok_len = 0;
    if (!hdr || len <= sl + 1)
        return SN_FAIL(SN_E_INVALID, "Authorization: expected 'Bearer <token>'");
    if (strncasecmp(hdr, scheme, sl) != 0 || hdr[sl] != ' ')
        return SN_FAIL(SN_E_INVALID, "Authorization: scheme must be 'Bearer' followed by one space");
    const char *t = hdr + sl + 1;
    size_t n = len - sl - 1;
    if (n > SN_AUTH_TOKEN_MAX)
        return SN_FAIL(SN_E_INVALID, "Authorization: token longer than %d bytes", SN_AUTH_TOKEN_MAX);
    if (!is_token68((const unsigned char *)t, n))
        return SN_FAIL(SN_E_INVALID, "Authorization: token has characters outside the token68 alphabet");
    *tok = t;
    *tok_len = n;
    return SN_OK;
}

static int on_allow_list(const char *path)
{
    if (!path)
        return 0;
    for (size_t i = 0; i < sizeof ALLOW_LIST / sizeof ALLOW_LIST[0]; i++)
        if (strcmp(path, ALLOW_LIST[i]) == 0)
            return 1;
    return 0;
}

/* dup_header: more than one Authorization header arrived. */
static sn_auth_result decide(const sn_auth *a, const char *path, const struct sockaddr *peer,
                             const char *authorization, int dup_header, int via_mtls)
{
    if (on_allow_list(path))
        return SN_AUTH_ALLOW;
    if (!a)
        return SN_AUTH_DENY_NO_TOKEN;   /* misuse still fails closed */
    if (a->disabled || via_mtls || sn_auth_is_loopback(peer))
        return SN_AUTH_ALLOW;
    if (!a->has_token)
        return SN_AUTH_DENY_NO_TOKEN;
    if (!authorization)
        return SN_AUTH_DENY_MISSING;
    if (dup_header)
        return SN_AUTH_DENY_MALFORMED;
    const char *tok;
    size_t n;
    if (sn_auth_parse_bearer(authorization, strlen(authorization), &tok, &n) != SN_OK)
        return SN_AUTH_DENY_MALFORMED;
    unsigned char d[32];
    if (!sha256(tok, n, d))
        return SN_AUTH_DENY_WRONG;
    return CRYPTO_memcmp(d, a->digest, sizeof d) == 0 ? SN_AUTH_ALLOW : SN_AUTH_DENY_WRONG;
}

sn_auth_result sn_auth_check(const sn_auth *a, const char *path, const struct sockaddr *peer,
                             const char *authorization, int via_mtls)
{
    return decide(a, path, peer, authorization, 0, via_mtls);
}

const char *sn_auth_error_body(sn_auth_result r)
{
    switch (r) {
    case SN_AUTH_ALLOW:
        return "";
    case SN_AUTH_DENY_MISSING:
        return "{\"error\":{\"message\":\"You didn't provide an API key. You need to provide your API key in an "
               "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).\","
               "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}";
    case SN_AUTH_DENY_MALFORMED:
        return "{\"error\":{\"message\":\"Malformed Authorization header: expected exactly one header of the form "
               "'Bearer <token>'.\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}";
    case SN_AUTH_DENY_WRONG:
        return "{\"error\":{\"message\":\"Incorrect API key provided.\",\"type\":\"invalid_request_error\","
               "\"param\":null,\"code\":\"invalid_api_key\"}}";
    case SN_AUTH_DENY_NO_TOKEN:
        return "{\"error\":{\"message\":\"Authentication required: this listener serves only loopback and mTLS "
               "clients (no API key is configured).\",\"type\":\"invalid_request_error\",\"param\":null,"
               "\"code\":\"invalid_api_key\"}}";
    }
    return "{\"error\":{\"message\":\"Unauthorized.\",\"type\":\"invalid_request_error\",\"param\":null,"
           "\"code\":\"invalid_api_key\"}}";
}

static const char *result_name(sn_auth_result r)
{
    switch (r) {
    case SN_AUTH_ALLOW: return "allow";
    case SN_AUTH_DENY_MISSING: return "missing";
    case SN_AUTH_DENY_MALFORMED: return "malformed";
    case SN_AUTH_DENY_WRONG: return "wrong";
    case SN_AUTH_DENY_NO_TOKEN: return "no_token_configured";
    }
    return "?";
}

int sn_auth_http(const sn_auth *a, struct evhttp_request *req)
{
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    const struct sockaddr *peer = conn ? evhttp_connection_get_addr(conn) : NULL;
    int via_mtls = sn_tls_request_verified(req);
    /* A second Authorization header would let a proxy and us disagree on
     * which one counts: refuse the request outright. */
    const char *authz = NULL;
    int n_authz = 0;
    struct evkeyvalq *hdrs = evhttp_request_get_input_headers(req);
    struct evkeyval *kv;
    for (kv = hdrs ? hdrs->tqh_first : NULL; kv; kv = kv->next.tqe_next) {
        if (strcasecmp(kv->key, "Authorization") == 0) {
            n_authz++;
            authz = kv->value;
        }
    }
    sn_auth_result r = decide(a, path, peer, authz, n_authz > 1, via_mtls);
    if (r == SN_AUTH_ALLOW)
        return 1;
    char safe[128];
    size_t o = 0;
    for (const char *p = path ? path : "?"; *p && o + 1 < sizeof safe; p++)
        safe[o++] = (*p > 0x20 && *p < 0x7f) ? *p : '_';
    safe[o] = 0;
    const char *host = "?";
    ev_uint16_t port = 0;
    char *h = NULL;
    if (conn) {
        evhttp_connection_get_peer(conn, &h, &port);
        if (h)
            host = h;
    }
    fprintf(stderr, "audit auth deny peer=%s:%u path=%s reason=%s\n", host, (unsigned)port, safe, result_name(r));
    struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
    evhttp_add_header(oh, "Content-Type", "application/json");
    evhttp_add_header(oh, "WWW-Authenticate",
                      r == SN_AUTH_DENY_WRONG || r == SN_AUTH_DENY_MALFORMED
                          ? "Bearer realm=\"sanctum\", error=\"invalid_token\""
                          : "Bearer realm=\"sanctum\"");
    struct evbuffer *body = evbuffer_new();
    if (body)
        evbuffer_add_printf(body, "%s\n", sn_auth_error_body(r));
    evhttp_send_reply(req, 401, "Unauthorized", body);
    if (body)
        evbuffer_free(body);
    return 0;
}
