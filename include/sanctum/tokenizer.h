/* Tokenizers: Hugging Face tokenizer.json byte-level BPE (Qwen) and Mistral
 * tekken.json. Encoding matches the Hugging Face tokenizers library. */
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
 * lets mistral-family tokenizer.json files get the corrected pre-tokenizer. */
sn_status sn_tok_load(const char *path, const char *model_type, sn_tokenizer **out);
void sn_tok_free(sn_tokenizer *t);

/* Encode UTF-8 text. Special/added tokens written in the text are matched
 * when parse_special is true (prompts built by the chat template), and
 * treated as plain text otherwise (user content). Invalid UTF-8 -> SN_E_INVALID. */
sn_status sn_tok_encode(const sn_tokenizer *t, const char *text, size_t len, bool parse_special, sn_ids *out);

/* Raw bytes of one token (ByteLevel-decoded); NULL for an out-of-range id. */
const char *sn_tok_piece(const sn_tokenizer *t, int32_t id, size_t *len);
int32_t sn_tok_vocab_size(const sn_tokenizer *t);
/* Id of an exact token string (special or normal), or -1. */
int32_t sn_tok_find(const sn_tokenizer *t, const char *token);
bool sn_tok_is_special(const sn_tokenizer *t, int32_t id);

/* Streaming detokenizer: feed ids, get back only complete UTF-8 characters. */
typedef struct {
    char pending[8];
    size_t n_pending;
} sn_detok;
void sn_detok_init(sn_detok *d);
/* Appends the newly completed text of id to out (grown with realloc). Special tokens decode to their text when show_special. */
sn_status sn_detok_push(sn_detok *d, const sn_tokenizer *t, int32_t id, bool show_special, char **out, size_t *out_len, size_t *out_cap);
/* Flush leftover bytes at the end of generation (invalid tail -> U+FFFD). */
sn_status sn_detok_flush(sn_detok *d, char **out, size_t *out_len, size_t *out_cap);

#endif
