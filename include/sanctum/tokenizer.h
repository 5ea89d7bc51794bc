/* Tokenizers: Hugging Face tokenizer.json byte-level BPE (Qwen, Mistral HF
 * files) and Mistral tekken.json. Encoding matches the Hugging Face
 * tokenizers library (tokenizer.json) and tiktoken / mistral-common (tekken).
 *
 * A loaded sn_tokenizer is immutable apart from an internal, locked
 * word cache: encode/decode may be called from several threads at once. */
#ifndef SANCTUM_TOKENIZER_H
#define SANCTUM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/status.h"

typedef struct sn_tokenizer sn_tokenizer;

typedef struct {
    int32_t *ids;
    size_t n, cap;
} sn_ids;

void sn_ids_free(sn_ids *v);
sn_status sn_ids_push(sn_ids *v, int32_t id);

/* path: a tokenizer.json or tekken.json file, or a model directory (then
 * tekken.json is preferred, else tokenizer.json). model_type (may be NULL)
 * lets mistral-family tokenizer.json files (mistral, mistral3, ministral3)
 * get the corrected pre-tokenizer pattern. */
sn_status sn_tok_load(const char *path, const char *model_type, sn_tokenizer **out);
void sn_tok_free(sn_tokenizer *t);

/* Encode UTF-8 text, appending ids to *out (out->n is not reset). Special
 * tokens written in the text are matched when parse_special is true
 * (prompts built by the chat template), and treated as plain text otherwise
 * (user content). As in Hugging Face tokenizers, added tokens that are not
 * marked special (Qwen's <think>, <tool_call>) are matched either way.
 * Invalid UTF-8 -> SN_E_INVALID. */
sn_status sn_tok_encode(const sn_tokenizer *t, const char *text, size_t len, bool parse_special, sn_ids *out);

/* A byte range of an input text. */
typedef struct {
    size_t off, len;
} sn_tok_range;

/* Like sn_tok_encode with parse_special = true, except that special tokens
 * overlapping any of the plain ranges stay text there. For a rendered chat
 * prompt whose message contents are the plain ranges (sn_chat_encode does
 * this) the ids equal Hugging Face's encoding of the prompt whenever the
 * contents hold no special-token text, and a user cannot forge
 * <|im_end|> / [INST] otherwise. Ranges outside the text -> SN_E_INVALID. */
sn_status sn_tok_encode_guarded(const sn_tokenizer *t, const char *text, size_t len, const sn_tok_range *plain,
                                size_t n_plain, sn_ids *out);

/* Decode ids to UTF-8 (malloc'd, NUL-terminated; invalid byte sequences
 * become U+FFFD as in Hugging Face decode). skip_special drops special and
 * control tokens. Out-of-range id -> SN_E_RANGE. */
sn_status sn_tok_decode(const sn_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        char **out, size_t *out_len);

/* Raw bytes of one token (ByteLevel-decoded; a special token's text); NULL
 * for an out-of-range id or an unused id (a hole in the vocabulary). */
const char *sn_tok_piece(const sn_tokenizer *t, int32_t id, size_t *len);
/* One past the largest id (holes included). */
int32_t sn_tok_vocab_size(const sn_tokenizer *t);
/* Id of an exact token given as raw text (" the", "<|im_end|>", "[INST]";
 * not the byte-level "Ġthe" form), special tokens first, or -1. */
int32_t sn_tok_find(const sn_tokenizer *t, const char *token);
bool sn_tok_is_special(const sn_tokenizer *t, int32_t id);
/* "tokenizer.json" or "tekken.json": which loader produced t. */
const char *sn_tok_kind(const sn_tokenizer *t);

/* Streaming detokenizer: feed ids, get back only complete UTF-8 characters.
 * The concatenation of everything pushed and flushed equals sn_tok_decode
 * of the same ids. */
typedef struct {
    char pending[8];     /* an incomplete but so far valid UTF-8 prefix (<= 3 bytes) */
    size_t n_pending;
} sn_detok;
void sn_detok_init(sn_detok *d);
/* Appends the newly completed text of id to *out (grown with realloc; kept
 * NUL-terminated). Special tokens decode to their text when show_special,
 * to nothing otherwise. Out-of-range id -> SN_E_RANGE. */
sn_status sn_detok_push(sn_detok *d, const sn_tokenizer *t, int32_t id, bool show_special, char **out, size_t *out_len, size_t *out_cap);
/* Flush leftover bytes at the end of generation (an incomplete tail -> U+FFFD). */
sn_status sn_detok_flush(sn_detok *d, char **out, size_t *out_len, size_t *out_cap);

#endif
