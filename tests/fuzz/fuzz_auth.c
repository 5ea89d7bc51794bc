/* libFuzzer target: Authorization header handling (untrusted request bytes).
 *
 * Build with `make fuzz`, run from the repository root:
 *   build/fuzz/fuzz_auth -max_total_time=60 -max_len=8192
 *
 * Properties: the strict parser returns a token inside the input that is
 * token68; the full decision for a non-loopback peer allows only the exact
 * configured token (and nothing else, whatever the bytes). */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "server/auth.h"

static const char TOKEN[] = "fuzz-Token_0123456789~+/=";
static sn_auth *g_auth;

static void require(int cond)
{
    if (!cond)
        abort();
}

static void setup(void)
{
    char path[] = "/tmp/sn_fuzz_auth_XXXXXX";
    int fd = mkstemp(path);
    require(fd >= 0);
    require(write(fd, TOKEN, sizeof TOKEN - 1) == (ssize_t)(sizeof TOKEN - 1));
    require(write(fd, "\n", 1) == 1);
    fchmod(fd, 0600);
    close(fd);
    unsetenv("SANCTUM_MLX_DISABLE_AUTH");
    require(sn_auth_new(path, &g_auth) == SN_OK);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_auth)
        setup();
    const char *tok = NULL;
    size_t n = 0;
    if (sn_auth_parse_bearer((const char *)data, size, &tok, &n) == SN_OK) {
        require(tok >= (const char *)data && tok + n == (const char *)data + size);
        require(n > 0 && n <= SN_AUTH_TOKEN_MAX);
        require(size > 7 && strncasecmp((const char *)data, "Bearer ", 7) == 0);
        for (size_t i = 0; i < n; i++)
            require(tok[i] != ' ' && tok[i] != '\t' && tok[i] != 0 && tok[i] != ',');
    }
    /* The header as evhttp would hand it over: NUL-terminated. */
    char *hdr = malloc(size + 1);
    require(hdr != NULL);
    memcpy(hdr, data, size);
    hdr[size] = 0;
    struct sockaddr_in far = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0xC0000202) };
    sn_auth_result r = sn_auth_check(g_auth, "/v1/chat/completions", (struct sockaddr *)&far, hdr, 0);
    if (r == SN_AUTH_ALLOW) {
        size_t hl = strlen(hdr);
        require(hl == 7 + sizeof TOKEN - 1 && strncasecmp(hdr, "Bearer ", 7) == 0 &&
                memcmp(hdr + 7, TOKEN, sizeof TOKEN - 1) == 0);
    }
    require(sn_auth_check(g_auth, "/health", (struct sockaddr *)&far, hdr, 0) == SN_AUTH_ALLOW);
    free(hdr);
    return 0;
}
