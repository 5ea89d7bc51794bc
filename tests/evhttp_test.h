/* A libevent HTTP server on a real loopback socket, and raw client sockets
 * to it: shared by test_auth.c and test_tls.c, which each wrap it with their
 * own request handler and middleware (auth check, TLS). */
#ifndef EVHTTP_TEST_H
#define EVHTTP_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <event2/event.h>
#include <event2/http.h>

static void *test_http_loop(void *base)
{
    event_base_dispatch(base);
    return NULL;
}

/* Binds http to addr on a port the kernel picks, stores that port in *port
 * and runs base's loop on a new thread (*tid). -1 on failure. */
static int test_http_listen(struct event_base *base, struct evhttp *http, const char *addr, int *port,
                            pthread_t *tid)
{
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(http, addr, 0);
    if (!bs)
        return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl);
    /* sin_port and sin6_port sit at the same offset */
    *port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return pthread_create(tid, NULL, test_http_loop, base) == 0 ? 0 : -1;
}

/* Stops the loop, joins its thread and frees the server; any part may be
 * absent (a start that failed half way). */
static void test_http_close(struct event_base *base, struct evhttp *http, pthread_t tid)
{
    if (base) {
        event_base_loopexit(base, NULL);
        if (tid)
            pthread_join(tid, NULL);
    }
    if (http)
        evhttp_free(http);
    if (base)
        event_base_free(base);
}

/* A TCP socket with a receive timeout of secs, and *sa set to the IPv4
 * addr:port to connect it to (the caller connects, so it decides what a
 * failure means). */
static int test_tcp_socket(const char *addr, int port, int secs, struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    *sa = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, addr, &sa->sin_addr);
    struct timeval tv = { secs, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

#endif
