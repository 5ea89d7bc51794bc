/* Parsing a generated reply back into reasoning, content and tool calls,
 * the inverse of what the chat templates (chat.c) write for an assistant
 * turn. Generated text is untrusted: anything that does not parse cleanly
 * stays in the content, so nothing the model wrote is lost. */
#include "sanctum/chat.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_text.h"

typedef struct { const char *p; size_t n; } sv;

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} growbuf;

static void gb_add(growbuf *b, const char *s, size_t n)
{
    if (!b->oom && !tok_text_append(&b->p, &b->n, &b->cap, s, n, 128)) b->oom = true;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static sv sv_trim(sv s)
{
    while (s.n && is_ws(s.p[0])) { s.p++; s.n--; }
    while (s.n && is_ws(s.p[s.n - 1])) s.n--;
    return s;
}

/* Offset of needle in s at or after from, or SIZE_MAX. */
static size_t sv_find(sv s, const char *needle, size_t from)
{
    size_t m = strlen(needle);
    for (size_t i = from; i + m <= s.n; i++)
        if (memcmp(s.p + i, needle, m) == 0) return i;
    return SIZE_MAX;
}

static bool sv_starts(sv s, const char *p) { size_t m = strlen(p); return s.n >= m && memcmp(s.p, p, m) == 0; }

static char *dupn(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

void sn_chat_reply_free(sn_chat_reply *r)
{
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (size_t i = 0; i < r->n_calls; i++) {
        free((char *)r->calls[i].id);
        free((char *)r->calls[i].name);
        free((char *)r->calls[i].arguments);
    }
    free(r->calls);
    memset(r, 0, sizeof *r);
}

/* Takes ownership of args. Returns false only when out of memory. */
static bool add_call(sn_chat_reply *r, sv id, sv name, json_t *args)
{
    sn_chat_tool_call *c = realloc(r->calls, (r->n_calls + 1) * sizeof *c);
    if (!c) { json_decref(args); return false; }
    r->calls = c;
    c = &r->calls[r->n_calls];
    c->id = id.p ? dupn(id.p, id.n) : NULL;
    c->name = dupn(name.p, name.n);
    c->arguments = json_dumps(args, JSON_ENCODE_ANY);
    json_decref(args);
    r->n_calls++;   /* counted even when partial, so sn_chat_reply_free releases it */
    return c->name && c->arguments && (!id.p || c->id);
}

/* A parameter value as the model wrote it: JSON when the whole value is
 * JSON (numbers, objects, lists, true/false/null), else a string. */
static json_t *param_value(sv v)
{
    json_error_t e;
    json_t *j = v.n ? json_loadb(v.p, v.n, JSON_DECODE_ANY, &e) : NULL;
    return j ? j : json_stringn(v.p, v.n);
}

/* {"name": ..., "arguments": ...}: arguments given as a JSON string are
 * decoded when they hold JSON. */
static json_t *call_from_object(json_t *o, sv *name)
{
    json_t *jn = json_object_get(o, "name"), *ja = json_object_get(o, "arguments");
    if (!json_is_string(jn)) return NULL;
    if (!ja) ja = json_object_get(o, "parameters");
    *name = (sv){ json_string_value(jn), json_string_length(jn) };
    if (!ja) return json_object();
    if (json_is_string(ja)) {
        json_error_t e;
        json_t *d = json_loadb(json_string_value(ja), json_string_length(ja), JSON_DECODE_ANY, &e);
        if (d) return d;
    }
    return json_incref(ja);
}

/* One <tool_call> body, XML (Qwen3.5) or JSON (Qwen2.5/Qwen3). Returns
 * 1 parsed, 0 malformed, -1 out of memory. */
static int qwen_block(sn_chat_reply *r, sv b)
{
    b = sv_trim(b);
    if (sv_starts(b, "{")) {
        json_error_t e;
        json_t *o = json_loadb(b.p, b.n, 0, &e);
        if (!json_is_object(o)) { json_decref(o); return 0; }
        sv name;
        json_t *args = call_from_object(o, &name);
        if (!args) { json_decref(o); return 0; }
        /* name points into o: copy before releasing it */
        int ok = add_call(r, (sv){ NULL, 0 }, name, args) ? 1 : -1;
        json_decref(o);
        return ok;
    }
    if (!sv_starts(b, "<function=")) return 0;
    size_t gt = sv_find(b, ">", 10), end = sv_find(b, "</function>", 0);
    if (gt == SIZE_MAX || end == SIZE_MAX || gt > end) return 0;
    sv name = sv_trim((sv){ b.p + 10, gt - 10 });
    if (!name.n) return 0;
    json_t *args = json_object();
    if (!args) return -1;
    size_t pos = gt + 1;
    for (;;) {
        size_t ps = sv_find(b, "<parameter=", pos);
        if (ps == SIZE_MAX || ps > end) break;
        size_t pk = sv_find(b, ">", ps + 11), pe = sv_find(b, "</parameter>", ps);
        if (pk == SIZE_MAX || pe == SIZE_MAX || pk > pe || pe > end) { json_decref(args); return 0; }
        char *key = dupn(b.p + ps + 11, pk - ps - 11);
        /* the template writes '\n' + value + '\n' */
        sv v = { b.p + pk + 1, pe - pk - 1 };
        if (v.n && v.p[0] == '\n') { v.p++; v.n--; }
        if (v.n && v.p[v.n - 1] == '\n') v.n--;
        json_t *jv = param_value(v);
        /* no value: the text is not UTF-8 (json_stringn refuses it); malformed */
        if (!key || !jv || json_object_set_new(args, key, jv) != 0) {
            free(key);
            json_decref(args);
            return key ? 0 : -1;
        }
        free(key);
        pos = pe + 12;
    }
    return add_call(r, (sv){ NULL, 0 }, name, args) ? 1 : -1;
}

static sn_status parse_qwen(sv rest, sn_chat_reply *r, growbuf *content)
{
    size_t pos = 0;
    for (;;) {
        size_t s = sv_find(rest, "<tool_call>", pos);
        size_t e = s == SIZE_MAX ? SIZE_MAX : sv_find(rest, "</tool_call>", s + 11);
        if (e == SIZE_MAX) break;   /* none left, or unterminated: stays content */
        int ok = qwen_block(r, (sv){ rest.p + s + 11, e - s - 11 });
        if (ok < 0) return SN_FAIL(SN_E_NOMEM, "chat reply: out of memory");
        gb_add(content, rest.p + pos, (ok ? s : e + 12) - pos);
        pos = e + 12;
    }
    gb_add(content, rest.p + pos, rest.n - pos);
    return SN_OK;
}

/* Mistral: [TOOL_CALLS] then name[CALL_ID]id[ARGS]{json} (v11+) or a JSON
 * array of {"name","arguments"} (v7), repeated. */
static sn_status parse_mistral(sv text, sn_chat_reply *r, growbuf *content)
{
    size_t p = sv_find(text, "[TOOL_CALLS]", 0);
    if (p == SIZE_MAX) { gb_add(content, text.p, text.n); return SN_OK; }
    gb_add(content, text.p, p);
    while (p < text.n && sv_starts((sv){ text.p + p, text.n - p }, "[TOOL_CALLS]")) {
        size_t start = p;
        p += 12;
        while (p < text.n && is_ws(text.p[p])) p++;
        sv after = { text.p + p, text.n - p };
        json_error_t e;
        bool ok = false;
        if (sv_starts(after, "[")) {
            json_t *arr = json_loadb(after.p, after.n, JSON_DISABLE_EOF_CHECK, &e);
            if (json_is_array(arr)) {
                size_t k;
                json_t *o;
                ok = true;
                json_array_foreach(arr, k, o) {
                    sv name;
                    json_t *args = json_is_object(o) ? call_from_object(o, &name) : NULL;
                    if (!args) { ok = false; break; }
                    if (!add_call(r, (sv){ NULL, 0 }, name, args)) { json_decref(arr); return SN_FAIL(SN_E_NOMEM, "chat reply: out of memory"); }
                }
                if (ok) p += (size_t)e.position;
            }
            json_decref(arr);
        } else {
            size_t a = sv_find(after, "[ARGS]", 0), ci = sv_find(after, "[CALL_ID]", 0);
            if (a != SIZE_MAX) {
                sv name = sv_trim((sv){ after.p, ci < a ? ci : a });
                sv id = ci < a ? sv_trim((sv){ after.p + ci + 9, a - ci - 9 }) : (sv){ NULL, 0 };
                sv js = { after.p + a + 6, after.n - a - 6 };
                json_t *args = json_loadb(js.p, js.n, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &e);
                if (args && name.n && !memchr(name.p, '[', name.n)) {
                    if (!add_call(r, id, name, args)) return SN_FAIL(SN_E_NOMEM, "chat reply: out of memory");
                    p += a + 6 + (size_t)e.position;
                    ok = true;
                } else {
                    json_decref(args);
                }
            }
        }
        if (!ok) { p = start; break; }
        while (p < text.n && is_ws(text.p[p])) p++;
    }
    gb_add(content, text.p + p, text.n - p);   /* whatever did not parse stays visible */
    return SN_OK;
}

sn_status sn_chat_parse_reply(sn_chat_format f, const char *text, size_t len, bool thinking, sn_chat_reply *out)
{
    if (!out || (!text && len)) return SN_FAIL(SN_E_INVALID, "sn_chat_parse_reply: NULL argument");
    memset(out, 0, sizeof *out);
    sv t = { text ? text : "", len };
    sv rest = t;
    sn_status st = SN_OK;
    growbuf content = {0};
    gb_add(&content, "", 0);
    /* Qwen3.5 reasoning: the text is inside a think block when the prompt
     * opened one (thinking) or the text itself starts with <think>; the
     * block runs to the first </think>, or to the end when cut off. */
    if (f == SN_CHAT_QWEN3_5 && (thinking || sv_starts(sv_trim(t), "<think>"))) {
        size_t close = sv_find(t, "</think>", 0);
        sv r = t;
        rest = (sv){ t.p + t.n, 0 };
        if (close != SIZE_MAX) {
            r = (sv){ t.p, close };
            rest = (sv){ t.p + close + 8, t.n - close - 8 };
        }
        r = sv_trim(r);
        if (sv_starts(r, "<think>")) r = sv_trim((sv){ r.p + 7, r.n - 7 });
        if (r.n && !(out->reasoning = dupn(r.p, r.n))) { st = SN_FAIL(SN_E_NOMEM, "chat reply: out of memory"); goto out; }
    }
    switch (f) {
    case SN_CHAT_QWEN3_5:
    case SN_CHAT_QWEN2: st = parse_qwen(rest, out, &content); break;
    case SN_CHAT_MISTRAL: st = parse_mistral(rest, out, &content); break;
    default: st = SN_FAIL(SN_E_INVALID, "sn_chat_parse_reply: unknown format %d", (int)f);
    }
    if (st == SN_OK && content.oom) st = SN_FAIL(SN_E_NOMEM, "chat reply: out of memory");
    if (st == SN_OK) {
        sv c = sv_trim((sv){ content.p, content.n });
        if (!(out->content = dupn(c.p, c.n))) st = SN_FAIL(SN_E_NOMEM, "chat reply: out of memory");
    }
out:
    free(content.p);
    if (st != SN_OK) sn_chat_reply_free(out);
    return st;
}

/* ---- streaming: the same split, decided as text arrives ------------------
 *
 * Text is classified left to right. Whitespace at the start of a channel is
 * dropped and whitespace inside is held until something follows it, so the
 * streamed text is always the trimmed text so far; a tail that may be the
 * start of a marker (<think>, </think>, <tool_call>, [TOOL_CALLS]) is held
 * until it is decided. After a tool-call marker nothing more is streamed:
 * sn_chat_stream_finish parses the whole reply and returns what remains. */

enum { ST_START, ST_REASON, ST_CONTENT, ST_TOOLS };

typedef struct {
    growbuf out;        /* streamed so far */
    size_t sent;        /* bytes of out already handed to the caller */
    size_t pend;        /* start of held whitespace in the input, or SIZE_MAX */
} channel;

struct sn_chat_stream {
    sn_chat_format f;
    bool thinking;
    int state;
    growbuf all;        /* every byte pushed */
    size_t i;           /* input classified up to here */
    channel reason, content;
};

sn_status sn_chat_stream_new(sn_chat_format f, bool thinking, sn_chat_stream **out)
{
    if (!out || f > SN_CHAT_MISTRAL) return SN_FAIL(SN_E_INVALID, "sn_chat_stream_new: bad argument");
    sn_chat_stream *s = calloc(1, sizeof *s);
    if (!s) return SN_FAIL(SN_E_NOMEM, "chat stream: out of memory");
    s->f = f;
    s->thinking = thinking;
    s->state = f == SN_CHAT_QWEN3_5 ? ST_START : ST_CONTENT;
    s->reason.pend = s->content.pend = SIZE_MAX;
    gb_add(&s->all, "", 0);
    gb_add(&s->reason.out, "", 0);
    gb_add(&s->content.out, "", 0);
    *out = s;
    return SN_OK;
}

void sn_chat_stream_free(sn_chat_stream *s)
{
    if (!s) return;
    free(s->all.p);
    free(s->reason.out.p);
    free(s->content.out.p);
    free(s);
}

/* 1: marker at i; 0: not; -1: the input ends inside a possible marker. */
static int marker_at(const growbuf *a, size_t i, const char *m)
{
    if (a->p[i] != m[0]) return 0;
    size_t ml = strlen(m), avail = a->n - i;
    if (memcmp(a->p + i, m, avail < ml ? avail : ml) != 0) return 0;
    return avail < ml ? -1 : 1;
}

static void chan_char(channel *c, const growbuf *a, size_t i)
{
    if (is_ws(a->p[i])) {
        if (c->out.n && c->pend == SIZE_MAX) c->pend = i;   /* leading whitespace is dropped */
        return;
    }
    if (c->pend != SIZE_MAX) {
        gb_add(&c->out, a->p + c->pend, i - c->pend);
        c->pend = SIZE_MAX;
    }
    gb_add(&c->out, a->p + i, 1);
}

static void classify(sn_chat_stream *s)
{
    const growbuf *a = &s->all;
    const char *call = s->f == SN_CHAT_MISTRAL ? "[TOOL_CALLS]" : "<tool_call>";
    while (s->i < a->n && s->state != ST_TOOLS) {
        size_t i = s->i;
        if (s->state == ST_START) {
            if (is_ws(a->p[i])) { s->i++; continue; }
            int m = marker_at(a, i, "<think>");
            if (m < 0) return;
            if (m > 0) s->i += 7;
            s->state = (m > 0 || s->thinking) ? ST_REASON : ST_CONTENT;
            continue;
        }
        if (s->state == ST_REASON) {
            int m = marker_at(a, i, "</think>");
            if (m < 0) return;
            if (m > 0) { s->i += 8; s->state = ST_CONTENT; continue; }
            chan_char(&s->reason, a, i);
        } else {
            int m = marker_at(a, i, call);
            if (m < 0) return;
            if (m > 0) { s->state = ST_TOOLS; return; }
            chan_char(&s->content, a, i);
        }
        s->i++;
    }
}

static void take(channel *c, const char **p, size_t *n)
{
    *p = c->out.p + c->sent;
    *n = c->out.n - c->sent;
    c->sent = c->out.n;
}

sn_status sn_chat_stream_push(sn_chat_stream *s, const char *text, size_t n, const char **reasoning, size_t *rlen,
                              const char **content, size_t *clen)
{
    if (!s || (!text && n) || !reasoning || !rlen || !content || !clen)
        return SN_FAIL(SN_E_INVALID, "sn_chat_stream_push: NULL argument");
    gb_add(&s->all, text, n);
    classify(s);
    if (s->all.oom || s->reason.out.oom || s->content.out.oom) return SN_FAIL(SN_E_NOMEM, "chat stream: out of memory");
    take(&s->reason, reasoning, rlen);
    take(&s->content, content, clen);
    return SN_OK;
}

/* The unsent rest of a final string whose beginning was streamed. */
static void rest_of(channel *c, const char *final, const char **p, size_t *n)
{
    if (!final) final = "";   /* no reasoning in the reply */
    size_t fl = strlen(final);
    if (fl >= c->out.n && memcmp(final, c->out.p, c->out.n) == 0) {
        *p = final + c->out.n;
        *n = fl - c->out.n;
    } else {
        *p = "";   /* cannot happen: the stream only sends prefixes of the final split */
        *n = 0;
    }
}

sn_status sn_chat_stream_finish(sn_chat_stream *s, const char **reasoning, size_t *rlen, const char **content,
                                size_t *clen, sn_chat_reply *reply)
{
    if (!s || !reasoning || !rlen || !content || !clen || !reply)
        return SN_FAIL(SN_E_INVALID, "sn_chat_stream_finish: NULL argument");
    SN_TRY(sn_chat_parse_reply(s->f, s->all.p, s->all.n, s->thinking, reply));
    rest_of(&s->reason, reply->reasoning, reasoning, rlen);
    rest_of(&s->content, reply->content, content, clen);
    return SN_OK;
}
