/* Chat template tests: byte-exact against transformers' renderings of the
 * real jinja templates (tests/fixtures/chat/<format>.json, made by
 * tools/python/make_chat_refs.py), plus hand-checked cases and the errors
 * the templates raise. */
#include <jansson.h>
#include <stdlib.h>

#include "harness.h"
#include "sanctum/chat.h"

static char *render(sn_chat_format f, const sn_chat_msg *m, size_t n, bool gen, bool think)
{
    sn_chat_opts o = { .add_generation_prompt = gen, .enable_thinking = think, .today = "2026-01-01" };
    char *s = NULL;
    sn_status st = sn_chat_render(f, m, n, &o, &s);
    if (st != SN_OK) fprintf(stderr, "  render failed: %s\n", sn_errmsg());
    return s;
}

#define EXPECT_RENDER(f, msgs, gen, think, want) do { \
    char *_s = render((f), (msgs), sizeof(msgs) / sizeof *(msgs), (gen), (think)); \
    CHECKF(_s && strcmp(_s, (want)) == 0, "got \"%s\"", _s ? _s : "(null)"); \
    free(_s); } while (0)

static void report_diff(const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    fprintf(stderr, "    first difference at byte %zu\n    want: \"%.80s\"\n    got:  \"%.80s\"\n", i, want + i, got + i);
}

static void check_fixture(const char *name, sn_chat_format f)
{
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/chat/%s.json", name);
    json_error_t e;
    json_t *cases = json_load_file(path, 0, &e);
    if (!cases) SKIP("reference renderings not there (tools/python/make_chat_refs.py makes them)");
    size_t i, n_ok = 0, n_skip = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *jm = json_object_get(c, "messages");
        size_t n = json_array_size(jm);
        sn_chat_msg *msgs = calloc(n ? n : 1, sizeof *msgs);
        bool usable = json_is_array(jm);
        for (size_t k = 0; k < n; k++) {
            json_t *m = json_array_get(jm, k);
            json_t *content = json_object_get(m, "content");
            if (json_object_get(m, "tool_calls") || (content && !json_is_string(content) && !json_is_null(content)))
                usable = false;   /* tool calls and multi-part content are outside sn_chat_msg */
            msgs[k].role = json_string_value(json_object_get(m, "role"));
            msgs[k].content = json_string_value(content);
            msgs[k].reasoning = json_string_value(json_object_get(m, "reasoning_content"));
        }
        if (!usable) { n_skip++; free(msgs); continue; }
        json_t *think = json_object_get(c, "enable_thinking");
        sn_chat_opts o = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            /* null = not passed: the template then takes the thinking branch */
            .enable_thinking = !json_is_false(think),
            .today = json_string_value(json_object_get(c, "today")),
        };
        const char *want = json_string_value(json_object_get(c, "text"));
        char *got = NULL;
        sn_status st = sn_chat_render(f, msgs, n, &o, &got);
        CHECKF(st == SN_OK, "%s case %zu: %s", name, i, sn_errmsg());
        if (st == SN_OK && want) {
            bool same = strcmp(got, want) == 0;
            CHECKF(same, "%s case %zu differs", name, i);
            if (!same) report_diff(want, got);
            n_ok += same;
        }
        free(got);
        free(msgs);
    }
    fprintf(stderr, "  %s: %zu of %zu reference renderings identical (%zu skipped: tool calls / multi-part content)\n",
            name, n_ok, json_array_size(cases), n_skip);
    CHECK(n_ok >= 10);
    json_decref(cases);
}

static void test_fixture_qwen3_5(void) { check_fixture("qwen3_5", SN_CHAT_QWEN3_5); }
static void test_fixture_qwen2(void) { check_fixture("qwen2", SN_CHAT_QWEN2); }
static void test_fixture_mistral(void) { check_fixture("mistral", SN_CHAT_MISTRAL); }

/* Tools and tool calls (tests/fixtures/tokenizer/chat_tools.json, made by
 * tools/python/make_chat_tool_refs.py with the same jinja environment as
 * transformers). Arguments are handed over as compact JSON text, so the
 * Python-style re-serialization (", ", ": ", float repr) is what is tested. */
static void test_fixture_tools(void)
{
    json_error_t e;
    json_t *cases = json_load_file("tests/fixtures/tokenizer/chat_tools.json", 0, &e);
    if (!cases) SKIP("tests/fixtures/tokenizer/chat_tools.json not there");
    size_t i, n_ok = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        sn_chat_format f;
        CHECK_OK(sn_chat_format_for(json_string_value(json_object_get(c, "format")), &f));
        json_t *jm = json_object_get(c, "messages");
        size_t n = json_array_size(jm);
        sn_chat_msg *msgs = calloc(n, sizeof *msgs);
        sn_chat_tool_call *calls = calloc(64, sizeof *calls);
        char *strs[128];
        size_t n_calls = 0, n_strs = 0;
        for (size_t k = 0; k < n; k++) {
            json_t *m = json_array_get(jm, k);
            msgs[k].role = json_string_value(json_object_get(m, "role"));
            msgs[k].content = json_string_value(json_object_get(m, "content"));
            msgs[k].tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
            json_t *tc = json_object_get(m, "tool_calls");
            msgs[k].tool_calls = calls + n_calls;
            msgs[k].n_tool_calls = json_array_size(tc);
            for (size_t q = 0; q < json_array_size(tc) && n_calls < 64 && n_strs < 128; q++) {
                json_t *fn = json_object_get(json_array_get(tc, q), "function");
                calls[n_calls].id = json_string_value(json_object_get(json_array_get(tc, q), "id"));
                calls[n_calls].name = json_string_value(json_object_get(fn, "name"));
                calls[n_calls].arguments = strs[n_strs++] =
                    json_dumps(json_object_get(fn, "arguments"), JSON_COMPACT | JSON_ENCODE_ANY);
                n_calls++;
            }
        }
        json_t *jt = json_object_get(c, "tools");
        char *tools = json_is_null(jt) || !jt ? NULL : json_dumps(jt, JSON_COMPACT);
        sn_chat_opts o = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .enable_thinking = !json_is_false(json_object_get(c, "enable_thinking")),
            .today = json_string_value(json_object_get(c, "today")),
            .tools = tools,
        };
        const char *want = json_string_value(json_object_get(c, "text"));
        char *got = NULL;
        sn_status st = sn_chat_render(f, msgs, n, &o, &got);
        CHECKF(st == SN_OK, "tools case %zu: %s", i, sn_errmsg());
        if (st == SN_OK && want) {
            bool same = strcmp(got, want) == 0;
            CHECKF(same, "tools case %zu (%s) differs", i, sn_chat_format_name(f));
            if (!same) report_diff(want, got);
            n_ok += same;
        }
        free(got);
        free(tools);
        for (size_t q = 0; q < n_strs; q++) free(strs[q]);
        free(calls);
        free(msgs);
    }
    fprintf(stderr, "  %zu of %zu tool renderings identical\n", n_ok, json_array_size(cases));
    CHECK(n_ok == json_array_size(cases) && n_ok >= 10);
    json_decref(cases);
}

static void test_qwen3_5_hand(void)
{
    sn_chat_msg one[] = { { .role = "user", .content = "Hi", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN3_5, one, true, false,
                  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    EXPECT_RENDER(SN_CHAT_QWEN3_5, one, true, true, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    EXPECT_RENDER(SN_CHAT_QWEN3_5, one, false, false, "<|im_start|>user\nHi<|im_end|>\n");
    /* historic assistant turn: empty reasoning dropped, content after </think> kept */
    sn_chat_msg hist[] = { { .role = "system", .content = " S \n", .reasoning = NULL }, { .role = "user", .content = "q1", .reasoning = NULL },
                           { .role = "assistant", .content = "<think>\n\n</think>\n\nA1", .reasoning = NULL }, { .role = "user", .content = "q2", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN3_5, hist, true, false,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                  "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* explicit reasoning field, after the last query: think block with it */
    sn_chat_msg rsn[] = { { .role = "user", .content = "q", .reasoning = NULL }, { .role = "assistant", .content = "ans", .reasoning = "  why \n" } };
    EXPECT_RENDER(SN_CHAT_QWEN3_5, rsn, false, false,
                  "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nans<|im_end|>\n");
    /* tool responses are grouped into one user turn; they do not count as the query */
    sn_chat_msg tools[] = { { .role = "user", .content = "weather?", .reasoning = NULL }, { .role = "assistant", .content = "calling", .reasoning = NULL },
                            { .role = "tool", .content = "sunny", .reasoning = NULL }, { .role = "tool", .content = " 20C ", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN3_5, tools, true, true,
                  "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\ncalling<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n20C\n</tool_response>"
                  "<|im_end|>\n<|im_start|>assistant\n<think>\n");
    /* Unicode whitespace is trimmed like Python's str.strip() */
    sn_chat_msg uws[] = { { .role = "user", .content = "\xe3\x80\x80x\xc2\xa0\x1f", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN3_5, uws, false, false, "<|im_start|>user\nx<|im_end|>\n");
    /* NULL content reads as "" */
    sn_chat_msg nul[] = { { .role = "user", .content = NULL, .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN3_5, nul, false, false, "<|im_start|>user\n<|im_end|>\n");
}

static void test_qwen2_hand(void)
{
    sn_chat_msg m[] = { { .role = "user", .content = " a ", .reasoning = NULL }, { .role = "assistant", .content = "b", .reasoning = NULL }, { .role = "tool", .content = "r", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN2, m, true, true,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\n a <|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    sn_chat_msg s[] = { { .role = "system", .content = "S", .reasoning = NULL }, { .role = "user", .content = "u", .reasoning = NULL }, { .role = "system", .content = "later", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_QWEN2, s, false, false,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>system\nlater<|im_end|>\n");
}

static void test_mistral_hand(void)
{
    sn_chat_msg m[] = { { .role = "system", .content = "S", .reasoning = NULL }, { .role = "user", .content = "u1", .reasoning = NULL }, { .role = "assistant", .content = "a1", .reasoning = NULL }, { .role = "user", .content = "u2", .reasoning = NULL } };
    EXPECT_RENDER(SN_CHAT_MISTRAL, m, true, false,
                  "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]u1[/INST]a1</s>[INST]u2[/INST]");
    sn_chat_msg d[] = { { .role = "user", .content = "u", .reasoning = NULL } };
    char *s = render(SN_CHAT_MISTRAL, d, 1, true, false);
    CHECK(s && strncmp(s, "<s>[SYSTEM_PROMPT]You are Mistral Small 3,", 42) == 0);
    CHECK(s && strstr(s, "The current date is 2026-01-01.\n") != NULL);
    CHECK(s && strstr(s, "[/SYSTEM_PROMPT][INST]u[/INST]") != NULL);
    free(s);
    /* without a date the current UTC date is used */
    char *t = NULL;
    sn_chat_opts o = { .add_generation_prompt = true };
    CHECK_OK(sn_chat_render(SN_CHAT_MISTRAL, d, 1, &o, &t));
    CHECK(t && strstr(t, "The current date is 20") != NULL);
    free(t);
}

static void test_errors(void)
{
    char *s = NULL;
    sn_chat_msg bad_role[] = { { .role = "user", .content = "u", .reasoning = NULL }, { .role = "wizard", .content = "x", .reasoning = NULL } };
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, bad_role, 2, NULL, &s) == SN_E_INVALID);
    CHECK(strstr(sn_errmsg(), "message 1") && strstr(sn_errmsg(), "wizard"));
    CHECK(s == NULL);
    sn_chat_msg late_sys[] = { { .role = "user", .content = "u", .reasoning = NULL }, { .role = "system", .content = "s", .reasoning = NULL } };
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, late_sys, 2, NULL, &s) == SN_E_INVALID);
    CHECK(strstr(sn_errmsg(), "beginning") != NULL);
    sn_chat_msg no_user[] = { { .role = "system", .content = "s", .reasoning = NULL }, { .role = "assistant", .content = "a", .reasoning = NULL } };
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, no_user, 2, NULL, &s) == SN_E_INVALID);
    sn_chat_msg only_tool_resp[] = { { .role = "user", .content = "<tool_response>x</tool_response>", .reasoning = NULL } };
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, only_tool_resp, 1, NULL, &s) == SN_E_INVALID);
    CHECK(sn_chat_render(SN_CHAT_QWEN2, NULL, 0, NULL, &s) == SN_E_INVALID);
    sn_chat_msg two_users[] = { { .role = "user", .content = "a", .reasoning = NULL }, { .role = "user", .content = "b", .reasoning = NULL } };
    CHECK(sn_chat_render(SN_CHAT_MISTRAL, two_users, 2, NULL, &s) == SN_E_INVALID);
    CHECK(strstr(sn_errmsg(), "alternate") != NULL);
    sn_chat_msg tool[] = { { .role = "user", .content = "a", .reasoning = NULL }, { .role = "tool", .content = "b", .reasoning = NULL } };
    CHECK(sn_chat_render(SN_CHAT_MISTRAL, tool, 2, NULL, &s) == SN_E_INVALID);
    CHECK(sn_chat_render((sn_chat_format)42, two_users, 2, NULL, &s) == SN_E_INVALID);
    CHECK(s == NULL);
    /* tools and tool calls */
    sn_chat_msg u[] = { { .role = "user", .content = "u" } };
    sn_chat_opts bad_tools = { .tools = "{\"not\": \"an array\"}" };
    CHECK(sn_chat_render(SN_CHAT_QWEN2, u, 1, &bad_tools, &s) == SN_E_INVALID && strstr(sn_errmsg(), "array"));
    bad_tools.tools = "[{";
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, u, 1, &bad_tools, &s) == SN_E_INVALID && strstr(sn_errmsg(), "JSON"));
    sn_chat_tool_call noname = { .arguments = "{}" }, list_args = { .name = "f", .arguments = "[1]" },
                      bad_json = { .name = "f", .arguments = "{\"a\": }" }, short_id = { .id = "abc", .name = "f", .arguments = "{}" };
    sn_chat_msg c1[] = { { .role = "user", .content = "u" }, { .role = "assistant", .tool_calls = &noname, .n_tool_calls = 1 } };
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, c1, 2, NULL, &s) == SN_E_INVALID && strstr(sn_errmsg(), "no name"));
    c1[1].tool_calls = &list_args;
    CHECK(sn_chat_render(SN_CHAT_QWEN3_5, c1, 2, NULL, &s) == SN_E_INVALID && strstr(sn_errmsg(), "JSON object"));
    CHECK_OK(sn_chat_render(SN_CHAT_QWEN2, c1, 2, NULL, &s));   /* Qwen2.5 prints any JSON */
    CHECK(s && strstr(s, "\"arguments\": [1]}") != NULL);
    free(s);
    s = NULL;
    c1[1].tool_calls = &bad_json;
    CHECK(sn_chat_render(SN_CHAT_QWEN2, c1, 2, NULL, &s) == SN_E_INVALID && strstr(sn_errmsg(), "message 1, tool call 0"));
    c1[1].tool_calls = &short_id;
    CHECK(sn_chat_render(SN_CHAT_MISTRAL, c1, 2, NULL, &s) == SN_E_INVALID && strstr(sn_errmsg(), "9 characters"));
    sn_chat_msg c2[] = { { .role = "user", .content = "u", .tool_calls = &short_id, .n_tool_calls = 1 } };
    CHECK(sn_chat_render(SN_CHAT_QWEN2, c2, 1, NULL, &s) == SN_E_INVALID && strstr(sn_errmsg(), "only assistant"));
    CHECK(s == NULL);
}

/* The assistant part of a rendered conversation whose last turn is the
 * assistant's: from after the marker to the end marker. */
static char *assistant_part(const char *text, const char *start, const char *end)
{
    const char *a = NULL, *p = text;
    while ((p = strstr(p, start))) a = p++;
    if (!a) return NULL;
    a += strlen(start);
    const char *e = strstr(a, end);
    return e ? strndup(a, (size_t)(e - a)) : strdup(a);
}

static bool args_equal(const char *got, const char *want)
{
    json_error_t e;
    json_t *g = json_loads(got, JSON_DECODE_ANY, &e), *w = json_loads(want, JSON_DECODE_ANY, &e);
    bool eq = g && w && json_equal(g, w);
    json_decref(g);
    json_decref(w);
    return eq;
}

/* render(assistant turn with calls) -> parse -> the same calls, per format */
static void test_reply_roundtrip(void)
{
    sn_chat_tool_call calls[] = {
        { .id = "abc123XYZ", .name = "get_weather", .arguments = "{\"city\":\"Paris\",\"days\":3}" },
        { .id = "Q9w8E7r6T", .name = "calc",
          .arguments = "{\"expr\":\"1+1\\nthen \\\"q\\\"\",\"nested\":{\"a\":[1,2.5,null]},\"x\":-0.25}" },
    };
    struct { sn_chat_format f; const char *start, *end; } fm[] = {
        { SN_CHAT_QWEN3_5, "<|im_start|>assistant\n", "<|im_end|>" },
        { SN_CHAT_QWEN2, "<|im_start|>assistant", "<|im_end|>" },
        { SN_CHAT_MISTRAL, "[/INST]", "</s>" },
    };
    for (size_t k = 0; k < 3; k++) {
        sn_chat_msg m[] = { { .role = "user", .content = "weather and math?" },
                            { .role = "assistant", .content = "Let me check.", .tool_calls = calls, .n_tool_calls = 2 } };
        sn_chat_opts o = { .today = "2026-01-01" };
        char *text = NULL;
        CHECK_OK(sn_chat_render(fm[k].f, m, 2, &o, &text));
        char *part = text ? assistant_part(text, fm[k].start, fm[k].end) : NULL;
        CHECK(part != NULL);
        sn_chat_reply r;
        CHECK_OK(sn_chat_parse_reply(fm[k].f, part ? part : "", part ? strlen(part) : 0, false, &r));
        CHECKF(r.n_calls == 2, "%s: %zu calls from \"%s\"", sn_chat_format_name(fm[k].f), r.n_calls, part);
        for (size_t i = 0; i < r.n_calls && i < 2; i++) {
            CHECK(strcmp(r.calls[i].name, calls[i].name) == 0);
            CHECKF(args_equal(r.calls[i].arguments, calls[i].arguments), "%s call %zu: %s",
                   sn_chat_format_name(fm[k].f), i, r.calls[i].arguments);
            if (fm[k].f == SN_CHAT_MISTRAL) CHECK(r.calls[i].id && strcmp(r.calls[i].id, calls[i].id) == 0);
            else CHECK(r.calls[i].id == NULL);
        }
        /* Mistral drops the content of a turn with calls; the Qwen formats keep it */
        CHECK(r.content && strcmp(r.content, fm[k].f == SN_CHAT_MISTRAL ? "" : "Let me check.") == 0);
        CHECK(r.reasoning == NULL);
        sn_chat_reply_free(&r);
        free(part);
        free(text);
    }
}

static void test_reply_reasoning_and_junk(void)
{
    sn_chat_reply r;
    const char *t1 = "Let me think.\nStep 2.\n</think>\n\nThe answer is 4.";
    CHECK_OK(sn_chat_parse_reply(SN_CHAT_QWEN3_5, t1, strlen(t1), true, &r));
    CHECK(r.reasoning && strcmp(r.reasoning, "Let me think.\nStep 2.") == 0);
    CHECK(strcmp(r.content, "The answer is 4.") == 0 && r.n_calls == 0);
    sn_chat_reply_free(&r);
    const char *t2 = "cut off while thinking";
    CHECK_OK(sn_chat_parse_reply(SN_CHAT_QWEN3_5, t2, strlen(t2), true, &r));
    CHECK(r.reasoning && strcmp(r.reasoning, t2) == 0 && strcmp(r.content, "") == 0);
    sn_chat_reply_free(&r);
    CHECK_OK(sn_chat_parse_reply(SN_CHAT_QWEN3_5, "  Hello!\n", 9, false, &r));
    CHECK(r.reasoning == NULL && strcmp(r.content, "Hello!") == 0);
    sn_chat_reply_free(&r);
    /* a JSON call inside <tool_call> (Qwen3 style) and a JSON-typed parameter */
    const char *t3 = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>"
                     "<tool_call>\n<function=g>\n<parameter=on>\ntrue\n</parameter>\n<parameter=s>\nplain text\n"
                     "</parameter>\n</function>\n</tool_call>";
    CHECK_OK(sn_chat_parse_reply(SN_CHAT_QWEN3_5, t3, strlen(t3), false, &r));
    CHECK(r.n_calls == 2 && strcmp(r.content, "") == 0);
    if (r.n_calls == 2) {
        CHECK(strcmp(r.calls[0].name, "f") == 0 && args_equal(r.calls[0].arguments, "{\"a\": 1}"));
        CHECK(strcmp(r.calls[1].name, "g") == 0 && args_equal(r.calls[1].arguments, "{\"on\": true, \"s\": \"plain text\"}"));
    }
    sn_chat_reply_free(&r);
    /* malformed or unterminated calls stay visible */
    const char *bad[] = { "<tool_call>\n<function=f>\n<parameter=x>\n1\n</tool_call>", "text <tool_call>{\"name\": \"f\"",
                          "<tool_call>{not json}</tool_call>" };
    for (int i = 0; i < 3; i++) {
        CHECK_OK(sn_chat_parse_reply(SN_CHAT_QWEN2, bad[i], strlen(bad[i]), false, &r));
        CHECKF(r.n_calls == 0 && strlen(r.content) > 0 && strstr(bad[i], r.content), "bad %d: %s", i, r.content);
        sn_chat_reply_free(&r);
    }
    /* Mistral v7 array form, then a broken v11 call that stays in content */
    const char *m1 = "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}, {\"name\": \"g\", \"arguments\": {}}]";
    CHECK_OK(sn_chat_parse_reply(SN_CHAT_MISTRAL, m1, strlen(m1), false, &r));
    CHECK(r.n_calls == 2 && strcmp(r.content, "Sure.") == 0);
    if (r.n_calls == 2) CHECK(args_equal(r.calls[0].arguments, "{\"a\": [1, 2]}") && strcmp(r.calls[1].name, "g") == 0);
    sn_chat_reply_free(&r);
    const char *m2 = "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{broken";
    CHECK_OK(sn_chat_parse_reply(SN_CHAT_MISTRAL, m2, strlen(m2), false, &r));
    CHECK(r.n_calls == 1 && strcmp(r.content, "[TOOL_CALLS]g[ARGS]{broken") == 0);
    sn_chat_reply_free(&r);
    CHECK(sn_chat_parse_reply(SN_CHAT_QWEN2, NULL, 3, false, &r) == SN_E_INVALID);
}

/* Streaming split == whole parse, whatever the chunking: everything
 * streamed plus the rest from finish equals the parsed reasoning/content. */
static int stream_check(sn_chat_format f, bool thinking, const char *t, size_t chunk)
{
    sn_chat_stream *s = NULL;
    if (sn_chat_stream_new(f, thinking, &s) != SN_OK) return 0;
    char rs[4096] = "", cs[4096] = "";
    size_t rn = 0, cn = 0, n = strlen(t);
    const char *r, *c;
    size_t rl, cl;
    int ok = 1;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        if (sn_chat_stream_push(s, t + i, k, &r, &rl, &c, &cl) != SN_OK) ok = 0;
        memcpy(rs + rn, r, rl); rn += rl;
        memcpy(cs + cn, c, cl); cn += cl;
    }
    sn_chat_reply rep;
    if (sn_chat_stream_finish(s, &r, &rl, &c, &cl, &rep) != SN_OK) { sn_chat_stream_free(s); return 0; }
    memcpy(rs + rn, r, rl); rn += rl; rs[rn] = 0;
    memcpy(cs + cn, c, cl); cn += cl; cs[cn] = 0;
    if (strcmp(rs, rep.reasoning ? rep.reasoning : "") != 0 || strcmp(cs, rep.content) != 0) {
        fprintf(stderr, "  stream(%s, thinking=%d, chunk=%zu) of \"%s\":\n    reasoning \"%s\" vs \"%s\"\n    content \"%s\" vs \"%s\"\n",
                sn_chat_format_name(f), thinking, chunk, t, rs, rep.reasoning ? rep.reasoning : "", cs, rep.content);
        ok = 0;
    }
    sn_chat_reply_free(&rep);
    sn_chat_stream_free(s);
    return ok;
}

static void test_reply_stream(void)
{
    static const char *texts[] = {
        "", "Hello", "  Hello  world \n", "plan a\n\nplan b\n</think>\n\nAnswer.\n",
        "<think>\nx\n</think>\n\ny", "  <think>unterminated", "<thi", "<b>bold</b> text", "a </thi",
        "Sure.\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\nafter",
        "x <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> y <tool_call>broken",
        "OK [TOOL_CALLS]f[ARGS]{\"a\": 1} tail", "[TOOL_CALLS]broken", "  \n ", "r</think>c</think>d",
        "naïve 你好 </think> 🙂 <tool_", "<tool_call", "[TOOL_CAL",
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        for (int f = 0; f < 3; f++)
            for (int th = 0; th < 2; th++)
                for (size_t chunk = 1; chunk <= 9; chunk += 4)
                    bad += !stream_check((sn_chat_format)f, th, texts[i], chunk);
    CHECKF(bad == 0, "%d stream/parse disagreements", bad);
    /* the deltas themselves: reasoning first, then content, markers never sent */
    sn_chat_stream *s;
    CHECK_OK(sn_chat_stream_new(SN_CHAT_QWEN3_5, true, &s));
    const char *r, *c;
    size_t rl, cl;
    CHECK_OK(sn_chat_stream_push(s, "Let me ", 7, &r, &rl, &c, &cl));
    CHECK(rl == 6 && memcmp(r, "Let me", 6) == 0 && cl == 0);   /* the space waits */
    CHECK_OK(sn_chat_stream_push(s, "see.</th", 8, &r, &rl, &c, &cl));
    CHECK(rl == 5 && memcmp(r, " see.", 5) == 0 && cl == 0);
    CHECK_OK(sn_chat_stream_push(s, "ink>\n\nHi", 8, &r, &rl, &c, &cl));
    CHECK(rl == 0 && cl == 2 && memcmp(c, "Hi", 2) == 0);
    const char *call = " <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    CHECK_OK(sn_chat_stream_push(s, call, strlen(call), &r, &rl, &c, &cl));
    CHECK(rl == 0 && cl == 0);
    sn_chat_reply rep;
    CHECK_OK(sn_chat_stream_finish(s, &r, &rl, &c, &cl, &rep));
    CHECK(rl == 0 && cl == 0 && rep.n_calls == 1 && strcmp(rep.content, "Hi") == 0 && strcmp(rep.reasoning, "Let me see.") == 0);
    sn_chat_reply_free(&rep);
    sn_chat_stream_free(s);
}

static void test_format_for(void)
{
    sn_chat_format f;
    CHECK(sn_chat_format_for("qwen3_5", &f) == SN_OK && f == SN_CHAT_QWEN3_5);
    CHECK(sn_chat_format_for("qwen3_5_moe", &f) == SN_OK && f == SN_CHAT_QWEN3_5);
    CHECK(sn_chat_format_for("qwen2", &f) == SN_OK && f == SN_CHAT_QWEN2);
    CHECK(sn_chat_format_for("mistral3", &f) == SN_OK && f == SN_CHAT_MISTRAL);
    CHECK(sn_chat_format_for("ministral3", &f) == SN_OK && f == SN_CHAT_MISTRAL);
    CHECK(sn_chat_format_for("llama", &f) == SN_E_UNSUPPORTED);
    CHECK(strstr(sn_errmsg(), "llama") != NULL);
    CHECK(strcmp(sn_chat_format_name(SN_CHAT_QWEN2), "qwen2") == 0);
}

int main(void)
{
    RUN(test_fixture_qwen3_5);
    RUN(test_fixture_qwen2);
    RUN(test_fixture_mistral);
    RUN(test_fixture_tools);
    RUN(test_qwen3_5_hand);
    RUN(test_qwen2_hand);
    RUN(test_mistral_hand);
    RUN(test_errors);
    RUN(test_reply_roundtrip);
    RUN(test_reply_reasoning_and_junk);
    RUN(test_reply_stream);
    RUN(test_format_for);
    return TEST_END();
}
