/* Chat templates, rendered in C per architecture (no Jinja): byte-exact with
 * transformers' apply_chat_template for the shipped templates. */
#ifndef SANCTUM_CHAT_H
#define SANCTUM_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "sanctum/status.h"

typedef enum { SN_CHAT_QWEN3_5, SN_CHAT_QWEN2, SN_CHAT_MISTRAL } sn_chat_format;

typedef struct {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;  /* UTF-8 */
} sn_chat_msg;

typedef struct {
    bool add_generation_prompt;
    bool enable_thinking;   /* qwen3_5 only; default false in sanctum */
} sn_chat_opts;

sn_status sn_chat_format_for(const char *model_type, sn_chat_format *out);
/* Renders messages to a prompt string (malloc'd, NUL-terminated) that is
 * then encoded with parse_special = true. Unknown roles -> SN_E_INVALID. */
sn_status sn_chat_render(sn_chat_format f, const sn_chat_msg *msgs, size_t n, const sn_chat_opts *o, char **out);

#endif
