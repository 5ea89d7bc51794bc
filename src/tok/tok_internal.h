/* Internal shape of sn_tokenizer, shared by the loaders (hf_json.c,
 * tekken.c), the encoder (tokenizer.c, bpe.c) and the decoders (detok.c).
 * Not a public header. */
#ifndef SANCTUM_TOK_INTERNAL_H
#define SANCTUM_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/status.h"
#include "sanctum/tokenizer.h"

enum { TOK_HF = 1, TOK_TEKKEN = 2 };

/* Per-id flags. */
enum { TF_PRESENT = 1, TF_SPECIAL = 2, TF_ADDED = 4, TF_VOCAB = 8 /* in the BPE model's vocabulary */ };

enum { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD };
enum { SPLIT_ISOLATED = 1, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT };

#define TOK_MAX_NORM 4
#define TOK_MAX_SPLIT 4

/* bytes -> id, open addressing; keys are the pieces of the ids themselves. */
typedef struct {
    int32_t *slots;   /* id or -1 */
    uint32_t mask;
    uint32_t count;
} tok_strmap;

/* (left id, right id) -> merge rank and result id, open addressing. */
typedef struct {
    uint64_t key;     /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t id;
} tok_pair;
typedef struct {
    tok_pair *slots;
    uint32_t mask;
    uint32_t count;
} tok_pairmap;

typedef struct {
    char *text;       /* raw content, as matched in the input */
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* Word -> ids cache: a fixed table that stops accepting entries when full
 * (as Hugging Face's does); guarded by a rwlock because encode is const and
 * may run on several threads. */
typedef struct {
    pthread_rwlock_t lock;
    uint32_t *slots;  /* 0 = empty, else 1 + entry index */
    uint32_t mask;
    struct tok_cache_ent { uint64_t hash; uint32_t word_off, word_len, ids_off, n_ids; } *ents;
    uint32_t n_ents, cap_ents;
    char *words; size_t words_len, words_cap;
    int32_t *ids; size_t ids_len, ids_cap;
    bool full;
} tok_cache;

struct sn_tokenizer {
    int kind;
    int32_t n_ids;            /* one past the largest id */
    char *blob;               /* all pieces, back to back */
    size_t blob_len, blob_cap;
    uint32_t *off, *len;      /* [n_ids] piece of each id within blob */
    uint8_t *flags;           /* [n_ids] TF_* */

    tok_strmap vocab;         /* model vocabulary (not added tokens): bytes -> id */
    tok_pairmap merges;       /* BPE merge table */
    int32_t byte_id[256];     /* id of each single byte */
    bool ignore_merges;       /* a word that is a whole token is emitted as is */

    tok_added *added;         /* sorted by id */
    size_t n_added;
    bool first_byte[2][256];  /* [normalized] a token of that class starts with this byte */
    /* Byte trie over the added tokens, roots 0 (raw) and 1 (normalized), so
     * that finding the longest token at a position costs its length, not
     * the number of tokens (tekken has 1000 control tokens). */
    struct tok_trie { int32_t child, sibling, added; uint8_t byte; } *trie;
    size_t n_trie, cap_trie;

    int norm[TOK_MAX_NORM];
    int n_norm;

    pcre2_code *split_re[TOK_MAX_SPLIT];
    int split_behavior[TOK_MAX_SPLIT];
    int n_split;
    int prefix_stage;         /* ByteLevel add_prefix_space: pieces entering this split stage
                               * (n_split = the BPE) get a leading space; -1 = off */

    tok_cache cache;
};

/* tokenizer.c: shared construction helpers */
uint64_t tok_hash(const void *p, size_t n);
sn_status tok_alloc_ids(sn_tokenizer *t, int32_t n_ids);
/* Stores the piece of id (the id must be new); flags |= TF_PRESENT. */
sn_status tok_set_piece(sn_tokenizer *t, int32_t id, const void *bytes, size_t len, uint8_t flags);
sn_status tok_strmap_build(sn_tokenizer *t, tok_strmap *m, uint8_t need_flags, uint8_t skip_flags);
int32_t tok_strmap_get(const sn_tokenizer *t, const tok_strmap *m, const void *bytes, size_t len);
sn_status tok_pairmap_init(tok_pairmap *m, size_t expected);
/* Inserts unless the pair is already there (then keeps the lower rank). */
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);
/* Compiles a tokenizer regex with UTF + UCP (+ JIT); what names the file
 * and field in errors. */
sn_status tok_compile_regex(const char *pattern, size_t len, const char *what, pcre2_code **out);
/* Applies the normalizer sequence; *norm is the malloc'd result (NULL when
 * the text is unchanged, e.g. ASCII), *out and *out_n the text to use. */
sn_status tok_normalize(const sn_tokenizer *t, const char *s, size_t n, char **norm, const char **out, size_t *out_n);
/* Finishes loading: byte ids, added-token index, cache. */
sn_status tok_finish(sn_tokenizer *t, const char *what);

/* bpe.c */
sn_status tok_cache_init(tok_cache *c);
void tok_cache_free(tok_cache *c);
/* BPE over one pre-tokenized word (raw bytes), appending ids. */
sn_status tok_bpe_word(const sn_tokenizer *t, const char *w, size_t n, sn_ids *out);

/* hf_json.c / tekken.c */
/* Both take the parsed file (owned by the caller); file names it in errors. */
sn_status tok_load_hf(json_t *root, const char *file, const char *model_type, sn_tokenizer *t);
sn_status tok_load_tekken(json_t *root, const char *file, sn_tokenizer *t);

/* detok.c: length of the longest valid-or-replaced prefix handling.
 * Appends the lossy UTF-8 decoding of b[0..n) to the growing buffer; when
 * final is false an incomplete trailing sequence is left undecoded and its
 * length returned in *held. */
sn_status tok_utf8_lossy(const char *b, size_t n, bool final, char **out, size_t *out_len,
                         size_t *out_cap, size_t *held);
/* Strict validation: offset of the first invalid byte, or n when valid. */
size_t tok_utf8_check(const char *b, size_t n);

#endif
