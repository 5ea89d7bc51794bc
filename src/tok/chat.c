/* Chat templates in C. Each renderer follows its jinja template
 * (tools/python/templates/) statement by statement, so the output is
 * byte-exact with transformers' apply_chat_template; the comments name the
 * template rule each branch implements. */
#include "sanctum/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
    sn_tok_range *ranges;   /* where message contents landed (special tokens stay text there) */
    size_t n_ranges, cap_ranges;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
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

/* Qwen3.5 (Qwen/Qwen3.5-4B chat_template, no tools). */
static sn_status render_qwen3_5(sbuf *b, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o)
{
    SN_TRY(check_roles(msgs, n, true, "qwen3_5"));
    /* messages[0] system: rendered before the loop, trimmed */
    if (role_is(&msgs[0], "system")) {
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

/* Qwen2.5-Instruct (no tools): no trimming; default system prompt. */
static sn_status render_qwen2(sbuf *b, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o)
{
    SN_TRY(check_roles(msgs, n, true, "qwen2"));
    if (role_is(&msgs[0], "system")) {
        sb_str(b, "<|im_start|>system\n");
        sb_content(b, sp_of(msgs[0].content));
        sb_str(b, "<|im_end|>\n");
    } else {
        sb_str(b, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        const sn_chat_msg *m = &msgs[i];
        if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool")) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_content(b, sp_of(m->content));
            sb_str(b, "\n</tool_response>");
            if (i + 1 == n || !role_is(&msgs[i + 1], "tool")) sb_str(b, "<|im_end|>\n");
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

/* Mistral-Small-3.2 (tekken V7 layout): <s>, one system prompt block (the
 * default one, dated, when messages[0] is not a system message), then
 * [INST]user[/INST] and assistant</s>; roles after the system message must
 * alternate user/assistant as the template checks. */
static sn_status render_mistral(sbuf *b, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o)
{
    SN_TRY(check_roles(msgs, n, false, "mistral"));
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
    for (size_t i = first, k = 0; i < n; i++, k++)
        if (role_is(&msgs[i], "user") != (k % 2 == 0))
            return SN_FAIL(SN_E_INVALID, "chat (mistral): message %zu: after the optional system message, roles must "
                           "alternate user/assistant/user/...", i);
    for (size_t i = first; i < n; i++) {
        const sn_chat_msg *m = &msgs[i];
        span c = sp_of(m->content);
        if (role_is(m, "system")) {
            sb_str(b, "[SYSTEM_PROMPT]");
            sb_content(b, c);
            sb_str(b, "[/SYSTEM_PROMPT]");
        } else if (role_is(m, "user")) {
            sb_str(b, "[INST]");
            sb_content(b, c);
            sb_str(b, "[/INST]");
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
    sn_status st;
    switch (f) {
    case SN_CHAT_QWEN3_5: st = render_qwen3_5(&b, msgs, n, o); break;
    case SN_CHAT_QWEN2: st = render_qwen2(&b, msgs, n, o); break;
    case SN_CHAT_MISTRAL: st = render_mistral(&b, msgs, n, o); break;
    default: st = SN_FAIL(SN_E_INVALID, "sn_chat_render: unknown format %d", (int)f);
    }
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
