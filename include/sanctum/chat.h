/* Chat templates, rendered in C per architecture (no Jinja): byte-exact with
 * transformers' apply_chat_template for the shipped templates: Qwen3.5
 * (Qwen/Qwen3.5-4B), Qwen2.5-Instruct, and Mistral-Small-3.2-24B-Instruct-2506
 * (tekken V7 layout, including its default system prompt), tools and tool
 * calls included. The references are tests/fixtures/chat/<format>.json and
 * tests/fixtures/tokenizer/chat_tools.json (tools/python/templates/ holds
 * the jinja).
 *
 * A server turns a request into prompt ids with sn_chat_encode (special
 * tokens typed by a user stay text), and a generated reply back into
 * reasoning / content / tool calls with sn_chat_parse_reply, or
 * incrementally with sn_chat_stream for SSE. */
#ifndef SANCTUM_CHAT_H
#define SANCTUM_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "sanctum/status.h"
#include "sanctum/tokenizer.h"

typedef enum { SN_CHAT_QWEN3_5, SN_CHAT_QWEN2, SN_CHAT_MISTRAL } sn_chat_format;

/* One function call made by an assistant turn (OpenAI "tool_calls"). */
typedef struct {
    const char *id;         /* call id; Mistral requires exactly 9 characters, Qwen ignores it */
    const char *name;
    const char *arguments;  /* JSON text (an object for Qwen3.5), as the OpenAI API carries it */
} sn_chat_tool_call;

typedef struct {
    const char *role;       /* "system", "user", "assistant", "tool" */
    const char *content;    /* UTF-8; NULL reads as "" */
    const char *reasoning;  /* optional assistant reasoning_content (Qwen3.5); NULL = take it
                             * from a <think>…</think> block inside content */
    const sn_chat_tool_call *tool_calls;  /* assistant: calls made in this turn */
    size_t n_tool_calls;
    const char *tool_call_id;             /* tool: the call answered (Mistral requires it) */
} sn_chat_msg;

typedef struct {
    bool add_generation_prompt;  /* no effect on MISTRAL (the prompt always ends in [/INST]) */
    bool enable_thinking;   /* qwen3_5 only; default false in sanctum */
    const char *today;      /* MISTRAL: "YYYY-MM-DD" for the default system prompt (used when
                             * the first message is not a system message); NULL = today, UTC */
    const char *tools;      /* JSON array of tool definitions (OpenAI "tools"), NULL = none;
                             * re-serialized as Python's json.dumps, as the templates' tojson does */
} sn_chat_opts;

/* model_type from config.json: qwen3_5, qwen3_5_moe (and *_text) -> QWEN3_5;
 * qwen2 -> QWEN2; mistral, mistral3, ministral3 -> MISTRAL; else SN_E_UNSUPPORTED. */
sn_status sn_chat_format_for(const char *model_type, sn_chat_format *out);
const char *sn_chat_format_name(sn_chat_format f);
/* Renders messages to a prompt string (malloc'd, NUL-terminated) that is
 * then encoded with parse_special = true. o may be NULL (all defaults).
 * Unknown roles, or a message order the official template rejects
 * (Qwen3.5: system not first, no user turn; Mistral: roles not alternating
 * user/assistant, a call id that is not 9 characters), or invalid JSON in
 * tools / arguments -> SN_E_INVALID naming the message index. */
sn_status sn_chat_render(sn_chat_format f, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o, char **out);
/* sn_chat_render that also returns where caller-supplied text (contents,
 * reasoning, the date) landed in the prompt: *ranges is malloc'd (NULL when
 * *n_ranges is 0). */
sn_status sn_chat_render_ranges(sn_chat_format f, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o,
                                char **out, sn_tok_range **ranges, size_t *n_ranges);
/* Render + encode, the way a server should turn a request into prompt ids:
 * the template's own special tokens are matched, special-token text inside
 * message contents stays plain text (sn_tok_encode_guarded). Appends to out. */
sn_status sn_chat_encode(const sn_tokenizer *t, sn_chat_format f, const sn_chat_msg *msgs, size_t n,
                         const sn_chat_opts *o, sn_ids *out);

/* A generated assistant reply split the way the chat format writes it.
 * Strings are malloc'd and owned by the reply; free with sn_chat_reply_free. */
typedef struct {
    char *reasoning;            /* Qwen3.5 <think> text, trimmed; NULL when the reply has none */
    char *content;              /* the visible answer, trimmed; never NULL after success */
    sn_chat_tool_call *calls;   /* id: Mistral [CALL_ID] when present, else NULL; arguments:
                                 * JSON text ({"k": v, ...}) */
    size_t n_calls;
} sn_chat_reply;

/* Parses generated text (decoded with special tokens shown, so Mistral's
 * [TOOL_CALLS] survives). thinking: the prompt opened a think block
 * (Qwen3.5 with enable_thinking), so the text starts inside the reasoning.
 * Tool calls: Qwen3.5 <tool_call><function=..><parameter=..> (a value that
 * parses as JSON becomes that JSON, else a string), JSON inside
 * <tool_call> (Qwen2.5/Qwen3), Mistral [TOOL_CALLS]name[CALL_ID]id[ARGS]{..}
 * and [TOOL_CALLS][{"name","arguments"}]. A malformed or unterminated call
 * stays in content; only out-of-memory fails. */
sn_status sn_chat_parse_reply(sn_chat_format f, const char *text, size_t len, bool thinking, sn_chat_reply *out);
void sn_chat_reply_free(sn_chat_reply *r);

/* Streaming the same split (SSE reasoning_content / content deltas). Each
 * push returns the reasoning and content text that is now certain (either
 * may be empty; pointers valid until the next call). Text after a tool-call
 * marker is held; finish parses the whole reply (into *reply, which the
 * caller frees) and returns the unsent rest, so that everything streamed
 * plus the rest equals reply->reasoning and reply->content exactly. */
typedef struct sn_chat_stream sn_chat_stream;
sn_status sn_chat_stream_new(sn_chat_format f, bool thinking, sn_chat_stream **out);
sn_status sn_chat_stream_push(sn_chat_stream *s, const char *text, size_t n, const char **reasoning, size_t *rlen,
                              const char **content, size_t *clen);
sn_status sn_chat_stream_finish(sn_chat_stream *s, const char **reasoning, size_t *rlen, const char **content,
                                size_t *clen, sn_chat_reply *reply);
void sn_chat_stream_free(sn_chat_stream *s);

#endif
