/* OpenAI chat-completions wire format: strict request parsing and the JSON
 * of responses, stream chunks and errors. No sockets, no model: pure
 * functions over jansson, so the fuzz corpus and unit tests drive them
 * directly. */
#ifndef SANCTUM_SERVER_API_H
#define SANCTUM_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/sample.h"
#include "sanctum/status.h"
#include "sanctum/stop.h"

#define SRV_MAX_MESSAGES 4096
#define SRV_MAX_TOKENS_ABSURD (1 << 20)   /* max_tokens above this is refused outright */

typedef struct {
    char *role;       /* "system", "user", "assistant" ("developer" maps to "system") */
    char *content;    /* UTF-8, text parts joined */
} srv_msg;

typedef struct {
    srv_msg *msgs;
    size_t n_msgs;
    char *model;                 /* NULL when the request named none */
    int max_tokens;              /* 0: not given (server default applies) */
    sn_sample_params sample;     /* sample.bias points at bias[] below */
    sn_logit_bias bias[SN_SAMPLE_MAX_BIAS];
    char *stops[SN_STOP_MAX];
    size_t n_stops;
    bool stream;
    bool include_usage;
    bool enable_thinking;
    bool no_pld;                 /* "pld": false turns prompt lookup decoding off for this request */
} srv_chat_req;

/* A request error: HTTP status plus the OpenAI error fields. */
typedef struct {
    int http_status;             /* 400, 404, 413, ... */
    const char *type;            /* "invalid_request_error", ... */
    const char *code;            /* e.g. "model_not_found"; NULL -> null */
    char param[64];              /* offending field path; "" -> null */
    char message[512];
} srv_err;

void srv_err_set(srv_err *e, int http_status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Parses a request body. On failure returns SN_E_INVALID with *err filled
 * (400 unless a field says otherwise). Unknown fields are ignored (clients
 * send many); known fields must have the right type and range. */
sn_status srv_chat_parse(const char *body, size_t len, srv_chat_req *out, srv_err *err);
void srv_chat_req_free(srv_chat_req *r);

/* {"error":{"message","type","param","code"}}: malloc'd JSON text. */
char *srv_err_json(const srv_err *e);

typedef struct {
    const char *id;              /* "chatcmpl-..." */
    long long created;
    const char *model;
    const char *fingerprint;
} srv_resp_meta;

/* Non-streaming response. finish: "stop" / "length". */
char *srv_resp_json(const srv_resp_meta *m, const char *text, size_t len, const char *finish,
                    int prompt_tokens, int completion_tokens);

/* One SSE event: "data: {chunk}\n\n". role != NULL: the role chunk;
 * text != NULL: a content delta; finish != NULL: the final chunk.
 * usage_chunk: the stream_options.include_usage chunk (choices []).
 * Returned text is malloc'd and NUL-terminated. */
char *srv_chunk_sse(const srv_resp_meta *m, const char *role, const char *text, size_t len,
                    const char *finish);
char *srv_usage_sse(const srv_resp_meta *m, int prompt_tokens, int completion_tokens);
/* The same two with usage.prompt_tokens_details.cached_tokens (tokens of
 * prompt_tokens restored from the prompt cache); the plain ones report 0. */
char *srv_resp_json_cached(const srv_resp_meta *m, const char *text, size_t len, const char *finish,
                           int prompt_tokens, int completion_tokens, int cached_tokens);
char *srv_usage_sse_cached(const srv_resp_meta *m, int prompt_tokens, int completion_tokens, int cached_tokens);

/* GET /v1/models body, and GET /v1/models/{id}. */
char *srv_models_json(const char *model_id, long long created);
char *srv_model_json(const char *model_id, long long created);

#endif
