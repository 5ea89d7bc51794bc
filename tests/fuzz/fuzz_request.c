/* libFuzzer target: the chat-completions request parser and the response
 * builders (untrusted request bytes, model output echoed back).
 *
 * Build with `make fuzz`, run from the repository root:
 *   mkdir -p build/fuzz-corpus/req
 *   build/fuzz/fuzz_request -max_total_time=60 -max_len=65536 build/fuzz-corpus/req
 *
 * Properties: a rejected body always gets a 4xx with a message and an error
 * JSON that parses; an accepted one has >= 1 message with a known role,
 * contents without NUL, sane sampling params and stop strings; the
 * response, chunk and usage builders produce valid JSON that round-trips
 * the (arbitrary) text, whatever bytes it holds. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static void require(int cond)
{
    if (!cond) abort();
}

static void check_json(const char *s, size_t skip)
{
    require(s != NULL);
    json_error_t e;
    json_t *j = json_loads(s + skip, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &e);   /* model output may hold U+0000 */
    require(j != NULL);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    srv_chat_req r;
    srv_err err;
    memset(&err, 0, sizeof err);
    sn_status st = srv_chat_parse((const char *)data, size, &r, &err);
    if (st != SN_OK) {
        require(st == SN_E_INVALID);
        require(err.http_status >= 400 && err.http_status < 500);
        require(err.message[0] != 0);
        char *e = srv_err_json(&err);
        check_json(e, 0);
        free(e);
        return 0;
    }
    require(r.n_msgs >= 1 && r.msgs);
    for (size_t i = 0; i < r.n_msgs; i++) {
        require(!strcmp(r.msgs[i].role, "system") || !strcmp(r.msgs[i].role, "user") ||
                !strcmp(r.msgs[i].role, "assistant"));
        require(r.msgs[i].content != NULL);
    }
    require(sn_sample_params_check(&r.sample) == SN_OK);
    require(r.max_tokens >= 0 && r.max_tokens <= SRV_MAX_TOKENS_ABSURD);
    require(r.n_stops <= SN_STOP_MAX);
    for (size_t i = 0; i < r.n_stops; i++) require(strlen(r.stops[i]) >= 1 && strlen(r.stops[i]) <= SN_STOP_MAX_LEN);

    /* Echo the last message through every builder, and also the raw input
     * bytes (model output is not guaranteed to be valid UTF-8). */
    const char *text = r.msgs[r.n_msgs - 1].content;
    srv_resp_meta m = {"chatcmpl-fuzz", 1, "fuzz-model", "fp_fuzz"};
    char *s = srv_resp_json(&m, text, strlen(text), "stop", 1, 2);
    check_json(s, 0);
    json_t *j = json_loads(s, 0, NULL);
    const char *back = json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                                         "message"), "content"));
    require(back && strcmp(back, text) == 0);
    json_decref(j);
    free(s);
    s = srv_chunk_sse(&m, NULL, (const char *)data, size, NULL);
    require(s && strncmp(s, "data: ", 6) == 0 && strlen(s) >= 8 && !strcmp(s + strlen(s) - 2, "\n\n"));
    require(strchr(s, '\n') == s + strlen(s) - 2);   /* one data line per event */
    check_json(s, 6);
    free(s);
    s = srv_usage_sse(&m, 3, 4);
    check_json(s, 6);
    free(s);
    srv_chat_req_free(&r);
    return 0;
}
