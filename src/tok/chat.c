/* Chat templates in C. Each renderer follows its jinja template
 * (tools/python/templates/) statement by statement, so the output is
 * byte-exact with transformers' apply_chat_template; the comments name the
 * template rule each branch implements. */
#include "sanctum/chat.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tok/tok_text.h"

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
    sn_tok_range *ranges;   /* where message contents landed (special tokens stay text there) */
    size_t n_ranges, cap_ranges;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (!b->oom && !tok_text_append(&b->p, &b->n, &b->cap, s, n, 256)) b->oom = true;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

typedef struct { const char *p; size_t n; } span;

static span sp_of(const char *s) { return (span){ s ? s : "", s ? strlen(s) : 0 }; }

/* Caller-supplied text (message contents, the date): recorded as a plain range. */
static void sb_content(sbuf *b, span s)
{
    if (b->oom || s.n == 0) return;
    if (b->n_ranges == b->cap_ranges) {
        size_t c = b->cap_ranges ? b->cap_ranges * 2 : 16;
        sn_tok_range *r = realloc(b->ranges, c * sizeof *r);
        if (!r) { b->oom = true; return; }
        b->ranges = r;
        b->cap_ranges = c;
    }
    b->ranges[b->n_ranges++] = (sn_tok_range){ b->n, s.n };
    sb_add(b, s.p, s.n);
}

/* Python str.isspace() (what jinja's trim strips): Unicode White_Space plus
 * the separators U+001C..U+001F. */
static size_t space_len(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    unsigned c = s[0];
    if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20)) return 1;
    if (c < 0x80) return 0;
    uint32_t cp;
    size_t k;
    if (c >= 0xc2 && c < 0xe0 && n >= 2) { cp = (c & 0x1f) << 6 | (s[1] & 0x3f); k = 2; }
    else if (c >= 0xe0 && c < 0xf0 && n >= 3) { cp = (c & 0x0f) << 12 | (s[1] & 0x3f) << 6 | (s[2] & 0x3f); k = 3; }
    else return 0;
    bool ws = cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
              cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
    return ws ? k : 0;
}

/* Length of the whitespace character ending at s[n) (0 if none). */
static size_t space_len_back(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (space_len(s + n - k, k) == k) return k;
    return 0;
}

static span trim(span s)
{
    size_t k;
    while ((k = space_len((const unsigned char *)s.p, s.n))) { s.p += k; s.n -= k; }
    while ((k = space_len_back((const unsigned char *)s.p, s.n))) s.n -= k;
    return s;
}

static span lstrip_nl(span s)
{
    while (s.n && s.p[0] == '\n') { s.p++; s.n--; }
    return s;
}

static span rstrip_nl(span s)
{
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* First / last occurrence of needle in s, or NULL. */
static const char *find_first(span s, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= s.n; i++)
        if (memcmp(s.p + i, needle, m) == 0) return s.p + i;
    return NULL;
}

static const char *find_last(span s, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + m <= s.n && memcmp(s.p + i, needle, m) == 0) return s.p + i;
    return NULL;
}

static bool starts_with(span s, const char *p) { size_t m = strlen(p); return s.n >= m && !memcmp(s.p, p, m); }
static bool ends_with(span s, const char *p) { size_t m = strlen(p); return s.n >= m && !memcmp(s.p + s.n - m, p, m); }

static bool role_is(const sn_chat_msg *m, const char *r) { return m->role && strcmp(m->role, r) == 0; }

static sn_status check_roles(const sn_chat_msg *msgs, size_t n, bool allow_tool, const char *fmt)
{
    if (!msgs || n == 0) return SN_FAIL(SN_E_INVALID, "chat (%s): no messages", fmt);
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !(strcmp(r, "system") == 0 || strcmp(r, "user") == 0 || strcmp(r, "assistant") == 0 ||
                    (allow_tool && strcmp(r, "tool") == 0)))
            return SN_FAIL(SN_E_INVALID, "chat (%s): message %zu has unsupported role \"%s\"", fmt, i, r ? r : "(null)");
    }
    return SN_OK;
}

/* ---- JSON as the templates print it: transformers' tojson is Python's
 * json.dumps(x, ensure_ascii=False) (", " and ": " separators, keys in
 * their order), and "x|string" is Python's str(). */

/* Python repr(float): the shortest digits that read back to x, fixed
 * notation for decimal exponents -4..15, else d.ddde+XX. */
static void py_float(sbuf *b, double x)
{
    char tmp[48], out[64];
    if (x == 0) { sb_str(b, signbit(x) ? "-0.0" : "0.0"); return; }
    if (!isfinite(x)) { sb_str(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity"); return; }
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg) q++;
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    int e10 = atoi(q + 1), decpt = e10 + 1;
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = dig[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[o++] = dig[i];
            for (int i = nd; i < decpt; i++) out[o++] = '0';
            out[o++] = '.';
            out[o++] = '0';
        } else {
            for (int i = 0; i < nd; i++) {
                if (i == decpt) out[o++] = '.';
                out[o++] = dig[i];
            }
        }
        out[o] = 0;
    } else {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = dig[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", e10 < 0 ? '-' : '+', abs(e10));
    }
    sb_str(b, out);
}

static void py_json_string(sbuf *b, const char *s, size_t n)
{
    sb_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        }
        if (!esc) continue;
        sb_add(b, s + run, i - run);
        sb_str(b, esc);
        run = i + 1;
    }
    sb_add(b, s + run, n - run);
    sb_add(b, "\"", 1);
}

static void py_dumps(sbuf *b, const json_t *v)
{
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        sb_add(b, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) sb_add(b, ", ", 2);
            first = false;
            py_json_string(b, k, strlen(k));
            sb_add(b, ": ", 2);
            py_dumps(b, x);
        }
        sb_add(b, "}", 1);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *x;
        sb_add(b, "[", 1);
        json_array_foreach(v, i, x) {
            if (i) sb_add(b, ", ", 2);
            py_dumps(b, x);
        }
        sb_add(b, "]", 1);
        break;
    }
    case JSON_STRING: py_json_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        sb_str(b, num);
        break;
    case JSON_REAL: py_float(b, json_real_value(v)); break;
    case JSON_TRUE: sb_str(b, "true"); break;
    case JSON_FALSE: sb_str(b, "false"); break;
    case JSON_NULL: sb_str(b, "null"); break;
    }
}

/* Caller-derived JSON goes in as a plain range (no special tokens inside). */
static void sb_json(sbuf *b, const json_t *v)
{
    sbuf t = {0};
    py_dumps(&t, v);
    if (t.oom) b->oom = true;
    else sb_content(b, (span){ t.p, t.n });
    free(t.p);
}

/* Python str(value) for a tool argument: strings as they are, True/False/None. */
static void sb_pystr(sbuf *b, const json_t *v)
{
    sbuf t = {0};
    switch (json_typeof(v)) {
    case JSON_STRING: sb_add(&t, json_string_value(v), json_string_length(v)); break;
    case JSON_TRUE: sb_str(&t, "True"); break;
    case JSON_FALSE: sb_str(&t, "False"); break;
    case JSON_NULL: sb_str(&t, "None"); break;
    default: py_dumps(&t, v);   /* numbers print the same in both */
    }
    if (t.oom) b->oom = true;
    else sb_content(b, (span){ t.p, t.n });
    free(t.p);
}

/* Parses the arguments of call k of message i (NULL arguments -> *out NULL). */
static sn_status parse_args(const sn_chat_tool_call *c, size_t i, size_t k, const char *fmt, json_t **out)
{
    *out = NULL;
    if (!c->arguments) return SN_OK;
    json_error_t e;
    *out = json_loads(c->arguments, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!*out)
        return SN_FAIL(SN_E_INVALID, "chat (%s): message %zu, tool call %zu: arguments are not valid JSON: %s (column %d)",
                       fmt, i, k, e.text, e.column);
    return SN_OK;
}

/* The templates that render a call as name + arguments (qwen2, mistral) need
 * the arguments; the same check and message for both. */
static sn_status parse_required_args(const sn_chat_tool_call *c, size_t i, size_t k, const char *fmt, json_t **out)
{
    SN_TRY(parse_args(c, i, k, fmt, out));
    if (!*out) return SN_FAIL(SN_E_INVALID, "chat (%s): message %zu, tool call %zu has no arguments", fmt, i, k);
    return SN_OK;
}

/* Parses the tools option: NULL when absent; must be an array. */
static sn_status parse_tools(const sn_chat_opts *o, const char *fmt, json_t **out)
{
    *out = NULL;
    if (!o->tools) return SN_OK;
    json_error_t e;
    *out = json_loads(o->tools, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!*out) return SN_FAIL(SN_E_INVALID, "chat (%s): tools are not valid JSON: %s (column %d)", fmt, e.text, e.column);
    if (!json_is_array(*out)) {
        json_decref(*out);
        *out = NULL;
        return SN_FAIL(SN_E_INVALID, "chat (%s): tools must be a JSON array", fmt);
    }
    return SN_OK;
}

static sn_status check_calls(const sn_chat_msg *m, size_t i, const char *fmt)
{
    if (m->n_tool_calls && !role_is(m, "assistant"))
        return SN_FAIL(SN_E_INVALID, "chat (%s): message %zu: only assistant messages carry tool calls", fmt, i);
    if (m->n_tool_calls && !m->tool_calls)
        return SN_FAIL(SN_E_INVALID, "chat (%s): message %zu: n_tool_calls without tool_calls", fmt, i);
    for (size_t k = 0; k < m->n_tool_calls; k++)
        if (!m->tool_calls[k].name)
            return SN_FAIL(SN_E_INVALID, "chat (%s): message %zu: tool call %zu has no name", fmt, i, k);
    return SN_OK;
}

#include "tok/chat_tool_text.h"

/* Qwen3.5 assistant tool calls, XML style: <tool_call>\n<function=NAME>\n
 * then <parameter=KEY>\nVALUE\n</parameter>\n per argument. */
static sn_status qwen3_5_calls(sbuf *b, const sn_chat_msg *m, size_t i, span content)
{
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        const sn_chat_tool_call *c = &m->tool_calls[k];
        if (k > 0) sb_str(b, "\n<tool_call>\n<function=");
        else sb_str(b, trim(content).n ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        sb_content(b, sp_of(c->name));
        sb_str(b, ">\n");
        json_t *args;
        SN_TRY(parse_args(c, i, k, "qwen3_5", &args));
        if (args && !json_is_object(args)) {
            json_decref(args);
            return SN_FAIL(SN_E_INVALID, "chat (qwen3_5): message %zu, tool call %zu: arguments must be a JSON object", i, k);
        }
        const char *key;
        json_t *v;
        if (args)
            json_object_foreach(args, key, v) {
                sb_str(b, "<parameter=");
                sb_content(b, sp_of(key));
                sb_str(b, ">\n");
                /* mappings and lists as JSON, everything else as Python str() */
                if (json_is_object(v) || json_is_array(v)) sb_json(b, v);
                else sb_pystr(b, v);
                sb_str(b, "\n</parameter>\n");
            }
        json_decref(args);
        sb_str(b, "</function>\n</tool_call>");
    }
    return SN_OK;
}

/* Qwen3.5 (Qwen/Qwen3.5-4B chat_template). */
static sn_status render_qwen3_5(sbuf *b, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o, json_t *tools)
{
    SN_TRY(check_roles(msgs, n, true, "qwen3_5"));
    if (json_array_size(tools) > 0) {
        /* one system turn: the tool list, then the system message if any */
        sb_str(b, "<|im_start|>system\n");
        sb_str(b, QWEN35_TOOLS_HEAD);
        size_t k;
        json_t *tool;
        json_array_foreach(tools, k, tool) {
            sb_str(b, "\n");
            sb_json(b, tool);
        }
        sb_str(b, "\n</tools>");
        sb_str(b, QWEN35_TOOLS_TAIL);
        if (role_is(&msgs[0], "system")) {
            span c = trim(sp_of(msgs[0].content));
            if (c.n) {
                sb_str(b, "\n\n");
                sb_content(b, c);
            }
        }
        sb_str(b, "<|im_end|>\n");
    } else if (role_is(&msgs[0], "system")) {
        /* messages[0] system: rendered before the loop, trimmed */
        sb_str(b, "<|im_start|>system\n");
        sb_content(b, trim(sp_of(msgs[0].content)));
        sb_str(b, "<|im_end|>\n");
    }
    /* last_query_index: the last user turn that is not a wrapped tool response */
    size_t last_query = n - 1;
    bool found = false;
    for (size_t i = n; i-- > 0;) {
        if (!role_is(&msgs[i], "user")) continue;
        span c = trim(sp_of(msgs[i].content));
        if (!(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            found = true;
            break;
        }
    }
    if (!found) return SN_FAIL(SN_E_INVALID, "chat (qwen3_5): no user query found in the messages");
    for (size_t i = 0; i < n; i++) {
        const sn_chat_msg *m = &msgs[i];
        SN_TRY(check_calls(m, i, "qwen3_5"));
        span content = trim(sp_of(m->content));
        if (role_is(m, "system")) {
            if (i != 0) return SN_FAIL(SN_E_INVALID, "chat (qwen3_5): system message %zu must be at the beginning", i);
        } else if (role_is(m, "user")) {
            sb_str(b, "<|im_start|>user\n");
            sb_content(b, content);
            sb_str(b, "<|im_end|>\n");
        } else if (role_is(m, "assistant")) {
            span reasoning = { "", 0 };
            if (m->reasoning) {
                reasoning = sp_of(m->reasoning);
            } else if (find_first(content, "</think>")) {
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *close = find_first(content, "</think>");
                span before = rstrip_nl((span){ content.p, (size_t)(close - content.p) });
                const char *open = find_last(before, "<think>");
                if (open) before = (span){ open + 7, before.n - (size_t)(open + 7 - before.p) };
                reasoning = lstrip_nl(before);
                /* content.split('</think>')[-1].lstrip('\n') */
                const char *last = find_last(content, "</think>") + 8;
                content = lstrip_nl((span){ last, content.n - (size_t)(last - content.p) });
            }
            reasoning = trim(reasoning);
            /* the think block is kept after the last query, or when non-empty */
            if (i > last_query || reasoning.n) {
                sb_str(b, "<|im_start|>assistant\n<think>\n");
                sb_content(b, reasoning);
                sb_str(b, "\n</think>\n\n");
            } else {
                sb_str(b, "<|im_start|>assistant\n");
            }
            sb_content(b, content);
            SN_TRY(qwen3_5_calls(b, m, i, content));
            sb_str(b, "<|im_end|>\n");
        } else { /* tool */
            /* loop.previtem is undefined for the first message: no opening then */
            if (i > 0 && !role_is(&msgs[i - 1], "tool")) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_content(b, content);
            sb_str(b, "\n</tool_response>");
            if (i + 1 == n || !role_is(&msgs[i + 1], "tool")) sb_str(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt)
        sb_str(b, o->enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return SN_OK;
}

#define QWEN2_DEFAULT_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

/* Qwen2.5-Instruct: no trimming; default system prompt; JSON tool calls. */
static sn_status render_qwen2(sbuf *b, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o, json_t *tools)
{
    SN_TRY(check_roles(msgs, n, true, "qwen2"));
    if (json_array_size(tools) > 0) {
        sb_str(b, "<|im_start|>system\n");
        if (role_is(&msgs[0], "system")) sb_content(b, sp_of(msgs[0].content));
        else sb_str(b, QWEN2_DEFAULT_SYSTEM);
        sb_str(b, QWEN2_TOOLS_HEAD);
        size_t k;
        json_t *tool;
        json_array_foreach(tools, k, tool) {
            sb_str(b, "\n");
            sb_json(b, tool);
        }
        sb_str(b, QWEN2_TOOLS_TAIL);
    } else if (role_is(&msgs[0], "system")) {
        sb_str(b, "<|im_start|>system\n");
        sb_content(b, sp_of(msgs[0].content));
        sb_str(b, "<|im_end|>\n");
    } else {
        sb_str(b, "<|im_start|>system\n" QWEN2_DEFAULT_SYSTEM "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        const sn_chat_msg *m = &msgs[i];
        SN_TRY(check_calls(m, i, "qwen2"));
        if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool")) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_content(b, sp_of(m->content));
            sb_str(b, "\n</tool_response>");
            if (i + 1 == n || !role_is(&msgs[i + 1], "tool")) sb_str(b, "<|im_end|>\n");
        } else if (m->n_tool_calls) {
            /* '<|im_start|>assistant' ['\n' + content] then one JSON object per call */
            sb_str(b, "<|im_start|>assistant");
            if (m->content && *m->content) {
                sb_str(b, "\n");
                sb_content(b, sp_of(m->content));
            }
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                const sn_chat_tool_call *c = &m->tool_calls[k];
                json_t *args;
                SN_TRY(parse_required_args(c, i, k, "qwen2", &args));
                sb_str(b, "\n<tool_call>\n{\"name\": \"");
                sb_content(b, sp_of(c->name));
                sb_str(b, "\", \"arguments\": ");
                sb_json(b, args);
                sb_str(b, "}\n</tool_call>");
                json_decref(args);
            }
            sb_str(b, "<|im_end|>\n");
        } else if (!(i == 0 && role_is(m, "system"))) {
            sb_str(b, "<|im_start|>");
            sb_str(b, m->role);
            sb_str(b, "\n");
            sb_content(b, sp_of(m->content));
            sb_str(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt) sb_str(b, "<|im_start|>assistant\n");
    return SN_OK;
}

#include "tok/chat_mistral_sys.h"

static size_t utf8_chars(const char *s)
{
    size_t k = 0;
    for (; *s; s++) k += ((unsigned char)*s & 0xc0) != 0x80;
    return k;
}

static bool str_eq(const char *a, const char *b) { return (!a || !b) ? a == b : strcmp(a, b) == 0; }

/* Mistral-Small-3.2 (tekken V7 layout): <s>, one system prompt block (the
 * default one, dated, when messages[0] is not a system message), then
 * [INST]user[/INST] and assistant</s>; roles after the system message must
 * alternate user/assistant as the template checks (tool results and turns
 * with tool calls aside). Tools go in [AVAILABLE_TOOLS] before the last
 * user message (and before any earlier user message equal to it: the
 * template compares the message dicts). */
static sn_status render_mistral(sbuf *b, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o, json_t *tools)
{
    SN_TRY(check_roles(msgs, n, true, "mistral"));
    size_t first = 0;
    sb_str(b, "<s>[SYSTEM_PROMPT]");
    if (role_is(&msgs[0], "system")) {
        sb_content(b, sp_of(msgs[0].content));
        first = 1;
    } else {
        char today[16];
        if (o->today) {
            snprintf(today, sizeof today, "%s", o->today);
        } else {
            time_t now = time(NULL);
            struct tm tm;
            gmtime_r(&now, &tm);
            strftime(today, sizeof today, "%Y-%m-%d", &tm);
        }
        sb_str(b, MISTRAL_SYS_HEAD);
        sb_content(b, sp_of(today));
        sb_str(b, MISTRAL_SYS_TAIL);
    }
    sb_str(b, "[/SYSTEM_PROMPT]");
    const sn_chat_msg *last_user = NULL;
    for (size_t i = first, k = 0; i < n; i++) {
        SN_TRY(check_calls(&msgs[i], i, "mistral"));
        if (role_is(&msgs[i], "user")) last_user = &msgs[i];
        if (role_is(&msgs[i], "tool") || msgs[i].n_tool_calls) continue;
        if (role_is(&msgs[i], "user") != (k % 2 == 0))
            return SN_FAIL(SN_E_INVALID, "chat (mistral): message %zu: after the optional system message, roles must "
                           "alternate user/assistant/user/...", i);
        k++;
    }
    for (size_t i = first; i < n; i++) {
        const sn_chat_msg *m = &msgs[i];
        span c = sp_of(m->content);
        if (role_is(m, "system")) {
            sb_str(b, "[SYSTEM_PROMPT]");
            sb_content(b, c);
            sb_str(b, "[/SYSTEM_PROMPT]");
        } else if (role_is(m, "user")) {
            if (tools && str_eq(m->content, last_user->content)) {
                sb_str(b, "[AVAILABLE_TOOLS]");
                sb_json(b, tools);
                sb_str(b, "[/AVAILABLE_TOOLS]");
            }
            sb_str(b, "[INST]");
            sb_content(b, c);
            sb_str(b, "[/INST]");
        } else if (role_is(m, "tool")) {
            if (!m->tool_call_id || utf8_chars(m->tool_call_id) != 9)
                return SN_FAIL(SN_E_INVALID, "chat (mistral): message %zu: tool_call_id must be 9 characters", i);
            sb_str(b, "[TOOL_RESULTS]");
            sb_content(b, sp_of(m->tool_call_id));
            sb_str(b, "[TOOL_CONTENT]");
            sb_content(b, c);
            sb_str(b, "[/TOOL_RESULTS]");
        } else if (m->n_tool_calls) {
            /* the content of a turn with tool calls is not rendered */
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                const sn_chat_tool_call *tc = &m->tool_calls[k];
                if (!tc->id || utf8_chars(tc->id) != 9)
                    return SN_FAIL(SN_E_INVALID, "chat (mistral): message %zu, tool call %zu: the id must be 9 characters", i, k);
                json_t *args;
                SN_TRY(parse_required_args(tc, i, k, "mistral", &args));
                sb_str(b, "[TOOL_CALLS]");
                sb_content(b, sp_of(tc->name));
                sb_str(b, "[CALL_ID]");
                sb_content(b, sp_of(tc->id));
                sb_str(b, "[ARGS]");
                sb_json(b, args);
                json_decref(args);
            }
            sb_str(b, "</s>");
        } else {
            sb_content(b, c);
            sb_str(b, "</s>");
        }
    }
    return SN_OK;
}

sn_status sn_chat_format_for(const char *model_type, sn_chat_format *out)
{
    if (!model_type || !out) return SN_FAIL(SN_E_INVALID, "sn_chat_format_for: NULL argument");
    static const struct { const char *mt; sn_chat_format f; } map[] = {
        { "qwen3_5", SN_CHAT_QWEN3_5 }, { "qwen3_5_moe", SN_CHAT_QWEN3_5 }, { "qwen3_5_text", SN_CHAT_QWEN3_5 },
        { "qwen3_5_moe_text", SN_CHAT_QWEN3_5 }, { "qwen2", SN_CHAT_QWEN2 }, { "mistral", SN_CHAT_MISTRAL },
        { "mistral3", SN_CHAT_MISTRAL }, { "ministral3", SN_CHAT_MISTRAL },
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strcmp(model_type, map[i].mt) == 0) { *out = map[i].f; return SN_OK; }
    return SN_FAIL(SN_E_UNSUPPORTED, "no chat template for model_type \"%s\"", model_type);
}

const char *sn_chat_format_name(sn_chat_format f)
{
    switch (f) {
    case SN_CHAT_QWEN3_5: return "qwen3_5";
    case SN_CHAT_QWEN2: return "qwen2";
    case SN_CHAT_MISTRAL: return "mistral";
    }
    return "unknown";
}

sn_status sn_chat_render_ranges(sn_chat_format f, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o,
                                char **out, sn_tok_range **ranges, size_t *n_ranges)
{
    if (!out) return SN_FAIL(SN_E_INVALID, "sn_chat_render: NULL output");
    *out = NULL;
    if (ranges) *ranges = NULL;
    if (n_ranges) *n_ranges = 0;
    static const sn_chat_opts defaults = { .add_generation_prompt = true };
    if (!o) o = &defaults;
    sbuf b = {0};
    sb_add(&b, "", 0);
    json_t *tools = NULL;
    sn_status st = parse_tools(o, sn_chat_format_name(f), &tools);
    if (st == SN_OK) {
        switch (f) {
        case SN_CHAT_QWEN3_5: st = render_qwen3_5(&b, msgs, n, o, tools); break;
        case SN_CHAT_QWEN2: st = render_qwen2(&b, msgs, n, o, tools); break;
        case SN_CHAT_MISTRAL: st = render_mistral(&b, msgs, n, o, tools); break;
        default: st = SN_FAIL(SN_E_INVALID, "sn_chat_render: unknown format %d", (int)f);
        }
    }
    json_decref(tools);
    if (st == SN_OK && b.oom) st = SN_FAIL(SN_E_NOMEM, "chat: out of memory rendering the prompt");
    if (st != SN_OK) {
        free(b.p);
        free(b.ranges);
        return st;
    }
    *out = b.p;
    if (ranges && n_ranges) {
        *ranges = b.ranges;
        *n_ranges = b.n_ranges;
    } else {
        free(b.ranges);
    }
    return SN_OK;
}

sn_status sn_chat_render(sn_chat_format f, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o, char **out)
{
    return sn_chat_render_ranges(f, msgs, n, o, out, NULL, NULL);
}

sn_status sn_chat_encode(const sn_tokenizer *t, sn_chat_format f, const sn_chat_msg *msgs, size_t n,
                         const sn_chat_opts *o, sn_ids *out)
{
    char *text = NULL;
    sn_tok_range *ranges = NULL;
    size_t n_ranges = 0;
    SN_TRY(sn_chat_render_ranges(f, msgs, n, o, &text, &ranges, &n_ranges));
    sn_status st = sn_tok_encode_guarded(t, text, strlen(text), ranges, n_ranges, out);
    free(text);
    free(ranges);
    return st;
}
