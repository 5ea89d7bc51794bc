/* Bearer-token auth: token file rules, strict header parsing, the decision
 * table, and the evhttp glue on a real listener bound to a non-loopback
 * address of this machine (so the loopback bypass does not hide a hole). */
#include "harness.h"
#include "evhttp_test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/thread.h>
#include <jansson.h>

#include "server/auth.h"

static char g_dir[64];

static const char *token_file(const char *content, size_t len, int mode)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/token", g_dir);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, content, len) != (ssize_t)len)
        fprintf(stderr, "  cannot write %s\n", path);
    if (fd >= 0) {
        fchmod(fd, mode);
        close(fd);
    }
    return path;
}

static sn_auth *auth_with(const char *content)
{
    sn_auth *a = NULL;
    if (sn_auth_new(token_file(content, strlen(content), 0600), &a) != SN_OK)
        fprintf(stderr, "  sn_auth_new: %s\n", sn_errmsg());
    return a;
}

static void test_token_file_rules(void)
{
    sn_auth *a = NULL;
    CHECK(sn_auth_new(token_file("s3cret\n", 7, 0644), &a) == SN_E_INVALID && a == NULL);
    CHECKF(strstr(sn_errmsg(), "group/others") && strstr(sn_errmsg(), "token"), "%s", sn_errmsg());
    CHECK(sn_auth_new(token_file("s3cret\n", 7, 0640), &a) == SN_E_INVALID);
    CHECK(sn_auth_new(token_file("s3cret\n", 7, 0602), &a) == SN_E_INVALID);
    CHECK(sn_auth_new(token_file("", 0, 0600), &a) == SN_E_INVALID);
    CHECKF(strstr(sn_errmsg(), "empty") != NULL, "%s", sn_errmsg());
    CHECK(sn_auth_new(token_file("\n", 1, 0600), &a) == SN_E_INVALID);
    CHECK(sn_auth_new(token_file("\r\n", 2, 0600), &a) == SN_E_INVALID);
    CHECK(sn_auth_new(token_file("two words\n", 10, 0600), &a) == SN_E_INVALID);
    CHECK(sn_auth_new(token_file("a\nb\n", 4, 0600), &a) == SN_E_INVALID);
    CHECK(sn_auth_new(token_file("tok\n\n", 5, 0600), &a) == SN_E_INVALID);   /* only one newline is trimmed */
    char big[SN_AUTH_TOKEN_MAX + 2];
    memset(big, 'a', sizeof big);
    CHECK(sn_auth_new(token_file(big, sizeof big, 0600), &a) == SN_E_RANGE);
    char path[128];
    snprintf(path, sizeof path, "%s/nope", g_dir);
    CHECK(sn_auth_new(path, &a) == SN_E_MISSING);
    CHECK(sn_auth_new(g_dir, &a) != SN_OK);   /* a directory */
    CHECK(a == NULL);
    /* Good files: trailing LF or CRLF trimmed; 0400 is fine. */
    CHECK_OK(sn_auth_new(token_file("s3cret\n", 7, 0400), &a));
    CHECK(a != NULL);
    struct sockaddr_in far = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0xC0000202) };
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&far, "Bearer s3cret", 0) == SN_AUTH_ALLOW);
    sn_auth_free(a);
    a = auth_with("Zm9vYmFy+/_.~-==\r\n");
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&far, "Bearer Zm9vYmFy+/_.~-==", 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&far, "Bearer Zm9vYmFy+/_.~-=", 0) ==
          SN_AUTH_DENY_WRONG);
    sn_auth_free(a);
    sn_auth_free(NULL);
}

static int parses(const char *h)
{
    const char *t;
    size_t n;
    return sn_auth_parse_bearer(h, strlen(h), &t, &n) == SN_OK;
}

static void test_parse_bearer(void)
{
    const char *t = NULL;
    size_t n = 0;
    CHECK_OK(sn_auth_parse_bearer("Bearer abc.DEF-1", 16, &t, &n));
    CHECK(n == 9 && memcmp(t, "abc.DEF-1", 9) == 0);
    CHECK(parses("bearer abc"));
    CHECK(parses("BEARER abc=="));
    CHECK(!parses("Bearer"));
    CHECK(!parses("Bearer "));
    CHECK(!parses("Bearer  abc"));
    CHECK(!parses(" Bearer abc"));
    CHECK(!parses("Bearer abc "));
    CHECK(!parses("Bearer\tabc"));
    CHECK(!parses("Bearer abc def"));
    CHECK(!parses("Bearer =abc"));
    CHECK(!parses("Bearer ab=c"));
    CHECK(!parses("Bearer a,b"));
    CHECK(!parses("Basic YWxhZGRpbjpvcGVuc2VzYW1l"));
    CHECK(!parses("Bearerabc"));
    CHECK(!parses("Bearer: abc"));
    CHECK(!parses(""));
    /* An embedded NUL must not end the token early. */
    CHECK(sn_auth_parse_bearer("Bearer ab\0cd", 12, &t, &n) != SN_OK);
    /* Length is bounded. */
    size_t L = 7 + SN_AUTH_TOKEN_MAX + 1;
    char *big = malloc(L + 1);
    if (big) {
        memcpy(big, "Bearer ", 7);
        memset(big + 7, 'a', L - 7);
        big[L] = 0;
        CHECK(!parses(big));
        big[L - 1] = 0;
        CHECK(parses(big));
        free(big);
    }
}

static void test_decision_table(void)
{
    sn_auth *a = auth_with("tok123\n");
    if (!a) {
        CHECK(!"auth");
        return;
    }
    struct sockaddr_in far = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0xC0000202) };
    struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7F000001) };
    struct sockaddr_in lo2 = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7F0000FE) };
    struct sockaddr_in6 lo6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    struct sockaddr_in6 map_lo = { .sin6_family = AF_INET6 }, map_far = { .sin6_family = AF_INET6 },
                        far6 = { .sin6_family = AF_INET6 };
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &map_lo.sin6_addr);
    inet_pton(AF_INET6, "::ffff:10.0.0.1", &map_far.sin6_addr);
    inet_pton(AF_INET6, "fd00::2", &far6.sin6_addr);
    const struct sockaddr *F = (struct sockaddr *)&far;
    const char *routes[] = { "/v1/chat/completions", "/v1/completions", "/chat/completions", "/v1/models",
                             "/metrics", "/", "/health/", "/healthz", "/v1/health", "/HEALTH", "/nonexistent" };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        CHECKF(sn_auth_check(a, routes[i], F, NULL, 0) == SN_AUTH_DENY_MISSING, "%s", routes[i]);
        CHECKF(sn_auth_check(a, routes[i], F, "Bearer tok12", 0) == SN_AUTH_DENY_WRONG, "%s", routes[i]);
        CHECKF(sn_auth_check(a, routes[i], F, "Bearer tok1234", 0) == SN_AUTH_DENY_WRONG, "%s", routes[i]);
        CHECKF(sn_auth_check(a, routes[i], F, "Bearer tok123 ", 0) == SN_AUTH_DENY_MALFORMED, "%s", routes[i]);
        CHECKF(sn_auth_check(a, routes[i], F, "Basic tok123", 0) == SN_AUTH_DENY_MALFORMED, "%s", routes[i]);
        CHECKF(sn_auth_check(a, routes[i], F, "Bearer tok123", 0) == SN_AUTH_ALLOW, "%s", routes[i]);
        CHECKF(sn_auth_check(a, routes[i], (struct sockaddr *)&lo, NULL, 0) == SN_AUTH_ALLOW, "%s", routes[i]);
    }
    CHECK(sn_auth_check(a, NULL, F, NULL, 0) == SN_AUTH_DENY_MISSING);
    CHECK(sn_auth_check(a, "/health", F, NULL, 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/health", F, "Bearer wrong", 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/v1/models", NULL, NULL, 0) == SN_AUTH_DENY_MISSING);   /* unknown peer */
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&lo2, NULL, 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&lo6, NULL, 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&map_lo, NULL, 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&map_far, NULL, 0) == SN_AUTH_DENY_MISSING);
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&far6, NULL, 0) == SN_AUTH_DENY_MISSING);
    CHECK(sn_auth_check(a, "/v1/models", F, NULL, 1) == SN_AUTH_ALLOW);   /* mTLS-authenticated */
    sn_auth_free(a);

    /* No token configured: only loopback, mTLS and the allow-list. */
    a = NULL;
    CHECK_OK(sn_auth_new(NULL, &a));
    CHECK(sn_auth_check(a, "/v1/models", F, "Bearer anything", 0) == SN_AUTH_DENY_NO_TOKEN);
    CHECK(sn_auth_check(a, "/v1/models", (struct sockaddr *)&lo, NULL, 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(a, "/health", F, NULL, 0) == SN_AUTH_ALLOW);
    CHECK(sn_auth_check(NULL, "/v1/models", F, NULL, 0) == SN_AUTH_DENY_NO_TOKEN);
    CHECK(!sn_auth_disabled(a));
    sn_auth_free(a);

    /* Opt-out. Only "1" counts. */
    setenv("SANCTUM_MLX_DISABLE_AUTH", "true", 1);
    CHECK_OK(sn_auth_new(NULL, &a));
    CHECK(!sn_auth_disabled(a));
    CHECK(sn_auth_check(a, "/v1/models", F, NULL, 0) == SN_AUTH_DENY_NO_TOKEN);
    sn_auth_free(a);
    setenv("SANCTUM_MLX_DISABLE_AUTH", "1", 1);
    CHECK_OK(sn_auth_new(NULL, &a));
    CHECK(sn_auth_disabled(a));
    CHECK(sn_auth_check(a, "/v1/models", F, NULL, 0) == SN_AUTH_ALLOW);
    CHECK_OK(sn_auth_check_bind(a, "0.0.0.0"));
    sn_auth_free(a);
    unsetenv("SANCTUM_MLX_DISABLE_AUTH");

    for (int r = SN_AUTH_DENY_MISSING; r <= SN_AUTH_DENY_NO_TOKEN; r++) {
        json_error_t je;
        json_t *j = json_loads(sn_auth_error_body((sn_auth_result)r), 0, &je);
        CHECKF(j != NULL, "body %d: %s", r, je.text);
        json_t *e = j ? json_object_get(j, "error") : NULL;
        CHECK(e && json_is_string(json_object_get(e, "message")));
        CHECK(e && strcmp(json_string_value(json_object_get(e, "code")), "invalid_api_key") == 0);
        CHECK(e && strcmp(json_string_value(json_object_get(e, "type")), "invalid_request_error") == 0);
        json_decref(j);
    }
}

static void test_check_bind(void)
{
    sn_auth *a = NULL;
    CHECK_OK(sn_auth_new(NULL, &a));
    CHECK_OK(sn_auth_check_bind(a, "127.0.0.1"));
    CHECK_OK(sn_auth_check_bind(a, "127.1.2.3"));
    CHECK_OK(sn_auth_check_bind(a, "::1"));
    CHECK_OK(sn_auth_check_bind(a, "localhost"));
    CHECK(sn_auth_check_bind(a, "0.0.0.0") == SN_E_INVALID);
    CHECKF(strstr(sn_errmsg(), "0.0.0.0") && strstr(sn_errmsg(), "--auth-token-file"), "%s", sn_errmsg());
    CHECK(sn_auth_check_bind(a, "::") == SN_E_INVALID);
    CHECK(sn_auth_check_bind(a, "192.0.2.2") == SN_E_INVALID);
    CHECK(sn_auth_check_bind(a, "example.com") == SN_E_INVALID);
    sn_auth_free(a);
    a = auth_with("tok\n");
    CHECK(a && sn_auth_check_bind(a, "0.0.0.0") == SN_OK);
    sn_auth_free(a);
}

/* ------------------------------------------------- evhttp on a real socket */

typedef struct server {
    struct event_base *base;
    struct evhttp *http;
    sn_auth *auth;
    pthread_t tid;
    int port;
    int served;   /* requests that got past the auth check */
} server;

static void on_request(struct evhttp_request *req, void *arg)
{
    server *s = arg;
    if (!sn_auth_http(s->auth, req))
        return;
    s->served++;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "ok\n");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static int server_start(server *s, const char *addr)
{
    memset(s, 0, sizeof *s);
    s->auth = auth_with("sekrit-Token_1\n");
    s->base = event_base_new();
    s->http = s->base ? evhttp_new(s->base) : NULL;
    if (!s->auth || !s->http)
        return -1;
    evhttp_set_gencb(s->http, on_request, s);
    evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    return test_http_listen(s->base, s->http, addr, &s->port, &s->tid);
}

static void server_stop(server *s)
{
    test_http_close(s->base, s->http, s->tid);
    sn_auth_free(s->auth);
}

/* One HTTP/1.0 exchange; returns the status code (0 on socket failure) and
 * the body in body[]. */
static int http_do(const char *addr, int port, const char *method, const char *path, const char *extra_headers,
                   char *body, size_t cap)
{
    struct sockaddr_in sa;
    int fd = test_tcp_socket(addr, port, 5, &sa);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return 0;
    }
    char req[1024];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n%sContent-Length: 0\r\n\r\n", method, path,
                     extra_headers ? extra_headers : "");
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return 0;
    }
    char resp[8192];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, resp + got, sizeof resp - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    resp[got] = 0;
    int code = 0;
    sscanf(resp, "HTTP/1.%*d %d", &code);
    const char *b = strstr(resp, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
    if (strstr(resp, "WWW-Authenticate: Bearer") == NULL && code == 401)
        code = -401;   /* a 401 without the challenge header is a bug */
    return code;
}

static int find_non_loopback_v4(char *out, size_t cap)
{
    struct ifaddrs *ifs = NULL, *i;
    int found = 0;
    if (getifaddrs(&ifs) != 0)
        return 0;
    for (i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || sn_auth_is_loopback(i->ifa_addr))
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)cap);
        found = 1;
    }
    freeifaddrs(ifs);
    return found;
}

static void test_http_non_loopback(void)
{
    char addr[64], body[4096];
    if (!find_non_loopback_v4(addr, sizeof addr))
        SKIP("no non-loopback IPv4 address on this machine");
    server s;
    if (server_start(&s, addr) != 0) {
        server_stop(&s);
        SKIP("cannot listen on the non-loopback address");
    }
    const char *routes[] = { "/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/",
                             "/health/", "/nonexistent" };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        for (int m = 0; m < 2; m++) {
            const char *meth = m ? "POST" : "GET";
            CHECKF(http_do(addr, s.port, meth, routes[i], NULL, body, sizeof body) == 401, "%s %s", meth,
                   routes[i]);
            CHECKF(strstr(body, "\"invalid_api_key\"") != NULL, "%s", body);
            CHECKF(http_do(addr, s.port, meth, routes[i], "Authorization: Bearer sekrit-Token_2\r\n", body,
                           sizeof body) == 401, "%s %s wrong token", meth, routes[i]);
            CHECKF(strstr(body, "Incorrect API key") != NULL, "%s", body);
            CHECKF(http_do(addr, s.port, meth, routes[i], "Authorization: Bearer sekrit-Token_1\r\n", body,
                           sizeof body) == 200, "%s %s right token", meth, routes[i]);
        }
    }
    int before = s.served;
    CHECK(http_do(addr, s.port, "GET", "/v1/models", "Authorization: Bearer  sekrit-Token_1\r\n", body,
                  sizeof body) == 401);
    CHECK(http_do(addr, s.port, "GET", "/v1/models", "Authorization: Basic c2Vrcml0\r\n", body, sizeof body) == 401);
    CHECK(http_do(addr, s.port, "GET", "/v1/models",
                  "Authorization: Bearer sekrit-Token_1\r\nAuthorization: Bearer sekrit-Token_1\r\n", body,
                  sizeof body) == 401);
    CHECK(http_do(addr, s.port, "GET", "/v1/models?x=/health", NULL, body, sizeof body) == 401);
    CHECK(s.served == before);
    CHECK(http_do(addr, s.port, "GET", "/health", NULL, body, sizeof body) == 200);
    CHECK(http_do(addr, s.port, "GET", "/health?probe=1", NULL, body, sizeof body) == 200);
    CHECK(http_do(addr, s.port, "GET", "/v1/models", "authorization: bearer sekrit-Token_1\r\n", body,
                  sizeof body) == 200);
    server_stop(&s);
}

static void test_http_loopback_bypass(void)
{
    char body[256];
    server s;
    if (server_start(&s, "127.0.0.1") != 0) {
        CHECK(!"listen on 127.0.0.1");
        server_stop(&s);
        return;
    }
    CHECK(http_do("127.0.0.1", s.port, "GET", "/v1/models", NULL, body, sizeof body) == 200);
    CHECK(http_do("127.0.0.1", s.port, "POST", "/v1/chat/completions", NULL, body, sizeof body) == 200);
    /* A wrong token from loopback still passes: loopback is trusted as a whole. */
    CHECK(http_do("127.0.0.1", s.port, "GET", "/v1/models", "Authorization: Bearer nope\r\n", body, sizeof body) ==
          200);
    server_stop(&s);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/sn_test_auth_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("SANCTUM_MLX_DISABLE_AUTH");
    evthread_use_pthreads();
    RUN(test_token_file_rules);
    RUN(test_parse_bearer);
    RUN(test_decision_table);
    RUN(test_check_bind);
    RUN(test_http_non_loopback);
    RUN(test_http_loopback_bypass);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_END();
}
