/* OpenAI chat-completions request parsing and response JSON (api.h). */
#include "server/api.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void srv_err_set(srv_err *e, int http_status, const char *type, const char *code, const char *param,
                 const char *fmt, ...)
{
    e->http_status = http_status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

#define BAD(param, ...) (srv_err_set(err, 400, "invalid_request_error", NULL, (param), __VA_ARGS__), SN_E_INVALID)

/* Offset of the first invalid UTF-8 byte (overlongs, surrogates and code
 * points above U+10FFFF are invalid), or len when the text is valid. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t n;
        unsigned cp, min;
        if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
        else return i;
        if (i + n > len) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}

/* Copy with invalid sequences replaced by U+FFFD, so json_stringn (which
 * refuses invalid UTF-8) always accepts model output. */
static char *utf8_clean(const char *s, size_t len, size_t *out_len)
{
    char *o = malloc(len * 3 + 1);
    if (!o) return NULL;
    size_t n = 0, i = 0;
    while (i < len) {
        size_t bad = utf8_invalid_at((const unsigned char *)s + i, len - i);
        memcpy(o + n, s + i, bad);
        n += bad;
        i += bad;
        if (i < len) {
            memcpy(o + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    o[n] = 0;
    *out_len = n;
    return o;
}

static json_t *jstr(const char *s, size_t len)
{
    size_t n;
    char *c = utf8_clean(s, len, &n);
    if (!c) return NULL;
    json_t *j = json_stringn(c, n);
    free(c);
    return j;
}

/* ---- request ---- */

/* JSON null counts as absent for every optional field (clients send it). */
static json_t *opt(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

static sn_status get_number(json_t *root, const char *key, double lo, double hi, float *dst, srv_err *err)
{
    json_t *v = opt(root, key);
    if (!v) return SN_OK;
    if (!json_is_number(v)) return BAD(key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return BAD(key, "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *dst = (float)d;
    return SN_OK;
}

static sn_status parse_content(json_t *c, size_t i, char **out, srv_err *err)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(c)) {
        *out = strndup(json_string_value(c), json_string_length(c));
        if (!*out) return BAD(param, "out of memory");
        if (strlen(*out) != json_string_length(c)) return BAD(param, "'%s' must not contain NUL characters", param);
        return SN_OK;
    }
    if (!json_is_array(c)) return BAD(param, "'%s' must be a string or an array of content parts", param);
    size_t total = 0, np = json_array_size(c);
    for (size_t k = 0; k < np; k++) {
        json_t *part = json_array_get(c, k);
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!json_is_object(part)) return BAD(param, "'%s' must be an object", param);
        json_t *type = json_object_get(part, "type");
        if (!json_is_string(type)) return BAD(param, "'%s.type' must be a string", param);
        const char *t = json_string_value(type);
        if (strcmp(t, "text") != 0) {
            if (strcmp(t, "image_url") == 0 || strcmp(t, "image") == 0 || strcmp(t, "input_image") == 0)
                return BAD(param, "image content is not supported by this model ('%s' has type '%s')", param, t);
            return BAD(param, "unsupported content part type '%.40s' in '%s'", t, param);
        }
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text)) return BAD(param, "'%s.text' must be a string", param);
        if (strlen(json_string_value(text)) != json_string_length(text))
            return BAD(param, "'%s.text' must not contain NUL characters", param);
        total += json_string_length(text);
    }
    char *buf = malloc(total + 1);
    if (!buf) return BAD(param, "out of memory");
    size_t n = 0;
    for (size_t k = 0; k < np; k++) {
        json_t *text = json_object_get(json_array_get(c, k), "text");
        memcpy(buf + n, json_string_value(text), json_string_length(text));
        n += json_string_length(text);
    }
    buf[n] = 0;
    *out = buf;
    return SN_OK;
}

static sn_status parse_messages(json_t *root, srv_chat_req *r, srv_err *err)
{
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!json_is_array(msgs)) return BAD("messages", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return BAD("messages", "'messages' must not be empty");
    if (n > SRV_MAX_MESSAGES) return BAD("messages", "'messages' has %zu entries, at most %d allowed", n, SRV_MAX_MESSAGES);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return BAD("messages", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return BAD(param, "'%s' must be an object", param);
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role)) return BAD(param, "'%s' must be a string", param);
        const char *rs = json_string_value(role);
        const char *canon = NULL;
        if (strcmp(rs, "system") == 0 || strcmp(rs, "developer") == 0) canon = "system";
        else if (strcmp(rs, "user") == 0) canon = "user";
        else if (strcmp(rs, "assistant") == 0) canon = "assistant";
        else return BAD(param, "'%s' must be one of system, user, assistant; got '%.40s'", param, rs);
        r->msgs[i].role = strdup(canon);
        r->n_msgs = i + 1;
        if (!r->msgs[i].role) return BAD(param, "out of memory");
        json_t *c = json_object_get(m, "content");
        if ((!c || json_is_null(c)) && strcmp(canon, "assistant") == 0) {
            r->msgs[i].content = strdup("");   /* an assistant turn that only called tools */
            if (!r->msgs[i].content) return BAD(param, "out of memory");
            continue;
        }
        if (!c) {
            snprintf(param, sizeof param, "messages[%zu].content", i);
            return BAD(param, "'%s' is required", param);
        }
        SN_TRY(parse_content(c, i, &r->msgs[i].content, err));
    }
    return SN_OK;
}

static sn_status parse_stop(json_t *root, srv_chat_req *r, srv_err *err)
{
    json_t *s = opt(root, "stop");
    if (!s) return SN_OK;
    json_t *one[1] = {NULL};
    size_t n;
    if (json_is_string(s)) { one[0] = s; n = 1; }
    else if (json_is_array(s)) n = json_array_size(s);
    else return BAD("stop", "'stop' must be a string or an array of strings");
    if (n > SN_STOP_MAX) return BAD("stop", "'stop' has %zu entries, at most %d allowed", n, SN_STOP_MAX);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_string(s) ? one[0] : json_array_get(s, i);
        char param[32];
        snprintf(param, sizeof param, "stop[%zu]", i);
        if (!json_is_string(v)) return BAD(param, "'%s' must be a string", param);
        size_t l = json_string_length(v);
        if (l == 0 || l > SN_STOP_MAX_LEN)
            return BAD(param, "'%s' must be 1..%d bytes, got %zu", param, SN_STOP_MAX_LEN, l);
        if (strlen(json_string_value(v)) != l) return BAD(param, "'%s' must not contain NUL characters", param);
        r->stops[r->n_stops] = strdup(json_string_value(v));
        if (!r->stops[r->n_stops]) return BAD(param, "out of memory");
        r->n_stops++;
    }
    return SN_OK;
}

/* logit_bias: {"token id": bias, ...}; ids are checked against the
 * vocabulary by the sampler (a 400 from the worker). */
static sn_status parse_logit_bias(json_t *root, srv_chat_req *r, srv_err *err)
{
    json_t *lb = opt(root, "logit_bias");
    if (!lb) return SN_OK;
    if (!json_is_object(lb)) return BAD("logit_bias", "'logit_bias' must be an object of token id -> bias");
    if (json_object_size(lb) > SN_SAMPLE_MAX_BIAS)
        return BAD("logit_bias", "'logit_bias' has %zu entries, at most %d allowed", json_object_size(lb), SN_SAMPLE_MAX_BIAS);
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        /* digits only: strtol alone would take " 5", "+5" and "-0" */
        if (key[0] < '0' || key[0] > '9' || *end || id < 0 || id > INT32_MAX)
            return BAD("logit_bias", "'logit_bias' key '%.40s' is not a token id", key);
        if (!json_is_number(v)) return BAD("logit_bias", "'logit_bias[%ld]' must be a number", id);
        double b = json_number_value(v);
        if (!(b >= -100 && b <= 100)) return BAD("logit_bias", "'logit_bias[%ld]' must be in [-100, 100], got %g", id, b);
        r->bias[r->sample.n_bias].id = (int32_t)id;
        r->bias[r->sample.n_bias].bias = (float)b;
        r->sample.n_bias++;
    }
    r->sample.bias = r->bias;
    return SN_OK;
}

static sn_status parse_max_tokens(json_t *root, const char *key, srv_chat_req *r, srv_err *err)
{
    json_t *v = opt(root, key);
    if (!v) return SN_OK;
    if (!json_is_integer(v)) return BAD(key, "'%s' must be an integer", key);
    json_int_t t = json_integer_value(v);
    if (t < 1) return BAD(key, "'%s' must be at least 1, got %lld", key, (long long)t);
    if (t > SRV_MAX_TOKENS_ABSURD) return BAD(key, "'%s' is absurdly large (%lld)", key, (long long)t);
    r->max_tokens = (int)t;
    return SN_OK;
}

sn_status srv_chat_parse(const char *body, size_t len, srv_chat_req *r, srv_err *err)
{
    memset(r, 0, sizeof *r);
    sn_sample_params_default(&r->sample);
    sn_status st = SN_OK;
    json_t *root = NULL;
    if (len == 0) return BAD(NULL, "request body is empty; expected a JSON object");
    size_t bad = utf8_invalid_at((const unsigned char *)body, len);
    if (bad != len) return BAD(NULL, "request body is not valid UTF-8 (byte offset %zu)", bad);
    json_error_t je;
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return BAD(NULL, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    if (!json_is_object(root)) { st = BAD(NULL, "request body must be a JSON object"); goto out; }

    if ((st = parse_messages(root, r, err)) != SN_OK) goto out;
    json_t *v;
    if ((v = opt(root, "model"))) {
        if (!json_is_string(v)) { st = BAD("model", "'model' must be a string"); goto out; }
        r->model = strdup(json_string_value(v));
        if (!r->model) { st = BAD("model", "out of memory"); goto out; }
    }
    if ((st = parse_max_tokens(root, "max_tokens", r, err)) != SN_OK) goto out;
    if ((st = parse_max_tokens(root, "max_completion_tokens", r, err)) != SN_OK) goto out;
    if ((st = get_number(root, "temperature", 0, 2, &r->sample.temperature, err)) != SN_OK) goto out;
    float top_p = 1.0f;
    if ((st = get_number(root, "top_p", 0, 1, &top_p, err)) != SN_OK) goto out;
    r->sample.top_p = top_p > 0 ? top_p : 1e-6f;   /* 0 means "only the top token" */
    if ((st = get_number(root, "repetition_penalty", 0, 100, &r->sample.repetition_penalty, err)) != SN_OK) goto out;
    if ((st = get_number(root, "presence_penalty", -2, 2, &r->sample.presence_penalty, err)) != SN_OK) goto out;
    if ((st = get_number(root, "frequency_penalty", -2, 2, &r->sample.frequency_penalty, err)) != SN_OK) goto out;
    if ((v = opt(root, "repetition_context_size"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SN_SAMPLE_MAX_WINDOW) {
            st = BAD("repetition_context_size", "'repetition_context_size' must be an integer in [1, %d]",
                     SN_SAMPLE_MAX_WINDOW);
            goto out;
        }
        r->sample.repetition_window = (int)json_integer_value(v);
    }
    if ((v = opt(root, "seed"))) {
        if (!json_is_integer(v)) { st = BAD("seed", "'seed' must be an integer"); goto out; }
        r->sample.has_seed = true;
        r->sample.seed = (uint64_t)json_integer_value(v);
    }
    if ((st = parse_stop(root, r, err)) != SN_OK) goto out;
    if ((st = parse_logit_bias(root, r, err)) != SN_OK) goto out;
    if ((v = opt(root, "stream"))) {
        if (!json_is_boolean(v)) { st = BAD("stream", "'stream' must be a boolean"); goto out; }
        r->stream = json_is_true(v);
    }
    if ((v = opt(root, "stream_options"))) {
        if (!json_is_object(v)) { st = BAD("stream_options", "'stream_options' must be an object"); goto out; }
        json_t *iu = opt(v, "include_usage");
        if (iu && !json_is_boolean(iu)) {
            st = BAD("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
            goto out;
        }
        r->include_usage = iu && json_is_true(iu);
    }
    if ((v = opt(root, "n"))) {
        if (!json_is_integer(v)) { st = BAD("n", "'n' must be an integer"); goto out; }
        if (json_integer_value(v) != 1) { st = BAD("n", "only n=1 is supported, got %lld", (long long)json_integer_value(v)); goto out; }
    }
    if ((v = opt(root, "logprobs"))) {
        if (!json_is_boolean(v)) { st = BAD("logprobs", "'logprobs' must be a boolean"); goto out; }
        if (json_is_true(v)) { st = BAD("logprobs", "logprobs are not supported"); goto out; }
    }
    if ((v = opt(root, "tools"))) {
        if (!json_is_array(v)) { st = BAD("tools", "'tools' must be an array"); goto out; }
        if (json_array_size(v) > 0) { st = BAD("tools", "tool calling is not supported"); goto out; }
    }
    if ((v = opt(root, "response_format"))) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t)) { st = BAD("response_format", "'response_format' must be an object with a string 'type'"); goto out; }
        if (strcmp(json_string_value(t), "text") != 0) {
            st = BAD("response_format", "response_format '%.40s' is not supported (only 'text')", json_string_value(t));
            goto out;
        }
    }
    if ((v = opt(root, "chat_template_kwargs"))) {
        if (!json_is_object(v)) { st = BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object"); goto out; }
        json_t *et = opt(v, "enable_thinking");
        if (et && !json_is_boolean(et)) {
            st = BAD("chat_template_kwargs.enable_thinking", "'chat_template_kwargs.enable_thinking' must be a boolean");
            goto out;
        }
        r->enable_thinking = et && json_is_true(et);
    }
    if ((v = opt(root, "pld"))) {
        if (!json_is_boolean(v)) { st = BAD("pld", "'pld' must be a boolean"); goto out; }
        r->no_pld = json_is_false(v);
    }
    if (sn_sample_params_check(&r->sample) != SN_OK) { st = BAD(NULL, "%s", sn_errmsg()); goto out; }
out:
    json_decref(root);
    if (st != SN_OK) srv_chat_req_free(r);
    return st;
}

void srv_chat_req_free(srv_chat_req *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    free(r->model);
    for (size_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

/* ---- responses ---- */

static char *dump(json_t *j)
{
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

char *srv_err_json(const srv_err *e)
{
    json_t *inner = json_object();
    json_object_set_new(inner, "message", jstr(e->message, strlen(e->message)));
    json_object_set_new(inner, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(inner, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", inner);
    return dump(o);
}

static json_t *usage_obj(int prompt_tokens, int completion_tokens, int cached_tokens)
{
    /* prompt_tokens counts the cached ones too, as OpenAI's does */
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens", completion_tokens,
                     "total_tokens", prompt_tokens + completion_tokens, "prompt_tokens_details", "cached_tokens",
                     cached_tokens);
}

static json_t *base_obj(const srv_resp_meta *m, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", m->id, "object", object, "created", (json_int_t)m->created,
                     "model", m->model, "system_fingerprint", m->fingerprint);
}

char *srv_resp_json(const srv_resp_meta *m, const char *text, size_t len, const char *finish,
                    int prompt_tokens, int completion_tokens)
{
    return srv_resp_json_cached(m, text, len, finish, prompt_tokens, completion_tokens, 0);
}

char *srv_resp_json_cached(const srv_resp_meta *m, const char *text, size_t len, const char *finish,
                           int prompt_tokens, int completion_tokens, int cached_tokens)
{
    json_t *o = base_obj(m, "chat.completion");
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "content", jstr(text ? text : "", text ? len : 0));
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "message", msg);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", json_string(finish));
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_obj(prompt_tokens, completion_tokens, cached_tokens));
    return dump(o);
}

static char *sse(json_t *o)
{
    char *s = dump(o);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *e = malloc(n + 9);
    if (e) {
        memcpy(e, "data: ", 6);
        memcpy(e + 6, s, n);
        memcpy(e + 6 + n, "\n\n", 3);
    }
    free(s);
    return e;
}

char *srv_chunk_sse(const srv_resp_meta *m, const char *role, const char *text, size_t len, const char *finish)
{
    json_t *o = base_obj(m, "chat.completion.chunk");
    json_t *delta = json_object();
    if (role) {
        json_object_set_new(delta, "role", json_string(role));
        json_object_set_new(delta, "content", json_string(""));
    }
    if (text) json_object_set_new(delta, "content", jstr(text, len));
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "delta", delta);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return sse(o);
}

char *srv_usage_sse(const srv_resp_meta *m, int prompt_tokens, int completion_tokens)
{
    return srv_usage_sse_cached(m, prompt_tokens, completion_tokens, 0);
}

char *srv_usage_sse_cached(const srv_resp_meta *m, int prompt_tokens, int completion_tokens, int cached_tokens)
{
    json_t *o = base_obj(m, "chat.completion.chunk");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_obj(prompt_tokens, completion_tokens, cached_tokens));
    return sse(o);
}

char *srv_model_json(const char *model_id, long long created)
{
    return dump(json_pack("{s:s,s:s,s:I,s:s}", "id", model_id, "object", "model", "created", (json_int_t)created,
                          "owned_by", "sanctum"));
}

char *srv_models_json(const char *model_id, long long created)
{
    return dump(json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", model_id, "object", "model",
                          "created", (json_int_t)created, "owned_by", "sanctum"));
}
