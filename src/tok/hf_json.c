/* Loader for Hugging Face tokenizer.json files with a byte-level BPE model
 * (Qwen2/2.5/3/3.5, Mistral HF exports, GPT-2 style files).
 *
 * Vocabulary strings are stored in the GPT-2 "bytes to unicode" form (a
 * space is "Ġ"); we convert every token back to raw bytes once at load time
 * so that BPE, lookups and decoding all work on bytes. */
#include "tok/tok_internal.h"

#include <string.h>
#include <utf8proc.h>

#define MAX_IDS (1 << 21)   /* 2M ids: real vocabularies stay under 300k; bounds what a hostile file can make us allocate */

/* The tekken pre-tokenizer pattern, which transformers' fix_mistral_regex
 * puts in place of the (wrong) Split regex shipped in Mistral tokenizer.json
 * files (architecture.md §5.3). */
static const char MISTRAL_PATTERN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ByteLevel's own regex, used when the ByteLevel pre-tokenizer has use_regex. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* GPT-2 bytes_to_unicode, inverted: code point -> byte, or -1. Printable
 * Latin-1 bytes map to themselves; the other 68 bytes map to 256.. in byte
 * order. */
static void byte_level_inverse(int16_t inv[324])
{
    for (int i = 0; i < 324; i++) inv[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        inv[self ? b : 256 + extra++] = (int16_t)b;
    }
}

/* Byte-level string -> raw bytes in buf (capacity >= strlen(s)). A string
 * with code points outside the map (never produced by byte-level BPE) keeps
 * its UTF-8 form, so such a token still decodes to its text. */
static size_t byte_level_decode(const int16_t inv[324], const char *s, size_t n, char *buf)
{
    size_t o = 0, i = 0;
    while (i < n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (k <= 0 || c < 0 || c >= 324 || inv[c] < 0) {
            memcpy(buf, s, n);
            return n;
        }
        buf[o++] = (char)inv[c];
        i += (size_t)k;
    }
    return o;
}

static bool get_bool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static sn_status add_normalizer(sn_tokenizer *t, json_t *n, const char *file)
{
    if (!n || json_is_null(n)) return SN_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return SN_FAIL(SN_E_FORMAT, "%s: normalizer without a \"type\"", file);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return SN_FAIL(SN_E_FORMAT, "%s: normalizer Sequence without \"normalizers\"", file);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) SN_TRY(add_normalizer(t, v, file));
        return SN_OK;
    }
    int k = !strcmp(type, "NFC") ? NORM_NFC : !strcmp(type, "NFD") ? NORM_NFD : !strcmp(type, "NFKC") ? NORM_NFKC
          : !strcmp(type, "NFKD") ? NORM_NFKD : 0;
    if (!k) return SN_FAIL(SN_E_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported (NFC/NFD/NFKC/NFKD/Sequence)", file, type);
    if (t->n_norm == TOK_MAX_NORM) return SN_FAIL(SN_E_UNSUPPORTED, "%s: more than %d normalizers", file, TOK_MAX_NORM);
    t->norm[t->n_norm++] = k;
    return SN_OK;
}

static sn_status add_split(sn_tokenizer *t, const char *pattern, size_t len, bool literal, int behavior,
                           const char *file)
{
    if (t->n_split == TOK_MAX_SPLIT) return SN_FAIL(SN_E_UNSUPPORTED, "%s: more than %d Split pre-tokenizers", file, TOK_MAX_SPLIT);
    char what[512];
    snprintf(what, sizeof what, "%s: pre_tokenizer Split pattern", file);
    pcre2_code *re = NULL;
    if (literal) {
        int err;
        PCRE2_SIZE off;
        re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_LITERAL | PCRE2_UTF, &err, &off, NULL);
        if (!re) return SN_FAIL(SN_E_FORMAT, "%s: cannot compile the literal", what);
    } else {
        SN_TRY(tok_compile_regex(pattern, len, what, &re));
    }
    t->split_re[t->n_split] = re;
    t->split_behavior[t->n_split++] = behavior;
    return SN_OK;
}

/* *byte_level is set once a ByteLevel stage has been seen; nothing may
 * follow it (later stages would see byte-mapped text). */
static sn_status add_pretok(sn_tokenizer *t, json_t *p, const char *file, bool *byte_level)
{
    if (!p || json_is_null(p)) return SN_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return SN_FAIL(SN_E_FORMAT, "%s: pre_tokenizer without a \"type\"", file);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr)) return SN_FAIL(SN_E_FORMAT, "%s: pre_tokenizer Sequence without \"pretokenizers\"", file);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) SN_TRY(add_pretok(t, v, file, byte_level));
        return SN_OK;
    }
    if (*byte_level)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: pre_tokenizer \"%s\" after ByteLevel is not supported", file, type);
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if (!json_is_string(re) && !json_is_string(lit))
            return SN_FAIL(SN_E_FORMAT, "%s: Split pre_tokenizer without pattern.Regex or pattern.String", file);
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        int b = !beh ? 0 : !strcmp(beh, "Isolated") ? SPLIT_ISOLATED : !strcmp(beh, "Removed") ? SPLIT_REMOVED
              : !strcmp(beh, "MergedWithPrevious") ? SPLIT_MERGED_PREV : !strcmp(beh, "MergedWithNext") ? SPLIT_MERGED_NEXT : 0;
        if (!b) return SN_FAIL(SN_E_UNSUPPORTED, "%s: Split behavior \"%s\" is not supported", file, beh ? beh : "(missing)");
        if (get_bool(p, "invert", false)) return SN_FAIL(SN_E_UNSUPPORTED, "%s: Split with invert=true is not supported", file);
        json_t *s = json_is_string(re) ? re : lit;
        return add_split(t, json_string_value(s), json_string_length(s), !json_is_string(re), b, file);
    }
    if (!strcmp(type, "ByteLevel")) {
        *byte_level = true;
        if (get_bool(p, "add_prefix_space", true)) t->prefix_stage = t->n_split;
        if (get_bool(p, "use_regex", true))
            SN_TRY(add_split(t, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, SPLIT_ISOLATED, file));
        return SN_OK;
    }
    return SN_FAIL(SN_E_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported (Split/ByteLevel/Sequence)", file, type);
}

static bool is_mistral_family(const char *mt)
{
    return mt && (!strcmp(mt, "mistral") || !strcmp(mt, "mistral3") || !strcmp(mt, "ministral3"));
}

static sn_status load_merges(sn_tokenizer *t, json_t *vocab, json_t *merges, const char *file)
{
    SN_TRY(tok_pairmap_init(&t->merges, json_array_size(merges)));
    char *key = NULL;
    size_t key_cap = 0;
    sn_status st = SN_OK;
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {   /* older files: "left right" */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) { st = SN_FAIL(SN_E_FORMAT, "%s: model.merges[%zu] is not \"left right\"", file, i); goto out; }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            an = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bn = json_string_length(json_array_get(m, 1));
        } else {
            st = SN_FAIL(SN_E_FORMAT, "%s: model.merges[%zu] is neither a string nor a pair of strings", file, i);
            goto out;
        }
        if (an + bn + 1 > key_cap) {
            key_cap = (an + bn + 1) * 2;
            char *p = realloc(key, key_cap);
            if (!p) { st = SN_FAIL(SN_E_NOMEM, "%s: out of memory reading merges", file); goto out; }
            key = p;
        }
        memcpy(key, a, an);
        key[an] = 0;
        json_t *ja = json_object_get(vocab, key);
        memcpy(key, b, bn);
        key[bn] = 0;
        json_t *jb = json_object_get(vocab, key);
        memcpy(key, a, an);
        memcpy(key + an, b, bn);
        key[an + bn] = 0;
        json_t *jm = json_object_get(vocab, key);
        if (!json_is_integer(ja) || !json_is_integer(jb) || !json_is_integer(jm)) {
            st = SN_FAIL(SN_E_FORMAT, "%s: model.merges[%zu] (\"%.*s\" + \"%.*s\") names a token not in model.vocab",
                         file, i, (int)an, a, (int)bn, b);
            goto out;
        }
        tok_pairmap_put(&t->merges, (int32_t)json_integer_value(ja), (int32_t)json_integer_value(jb), (int32_t)i,
                        (int32_t)json_integer_value(jm));
    }
out:
    free(key);
    return st;
}

static sn_status load_added(sn_tokenizer *t, json_t *added, const char *file)
{
    size_t n = json_array_size(added);
    if (!n) return SN_OK;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) return SN_FAIL(SN_E_NOMEM, "%s: out of memory for added tokens", file);
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *jid = json_object_get(a, "id"), *jc = json_object_get(a, "content");
        if (!json_is_integer(jid) || !json_is_string(jc))
            return SN_FAIL(SN_E_FORMAT, "%s: added_tokens[%zu] needs an integer \"id\" and a string \"content\"", file, i);
        json_int_t id = json_integer_value(jid);
        size_t len = json_string_length(jc);
        if (id < 0 || id >= t->n_ids) return SN_FAIL(SN_E_RANGE, "%s: added_tokens[%zu] id %lld out of range", file, i, (long long)id);
        if (len == 0) return SN_FAIL(SN_E_FORMAT, "%s: added_tokens[%zu] has empty content", file, i);
        tok_added *x = &t->added[t->n_added];
        x->text = malloc(len + 1);
        if (!x->text) return SN_FAIL(SN_E_NOMEM, "%s: out of memory for added tokens", file);
        memcpy(x->text, json_string_value(jc), len + 1);
        x->len = len;
        x->id = (int32_t)id;
        x->special = get_bool(a, "special", false);
        x->lstrip = get_bool(a, "lstrip", false);
        x->rstrip = get_bool(a, "rstrip", false);
        x->single_word = get_bool(a, "single_word", false);
        x->normalized = get_bool(a, "normalized", !x->special);
        t->n_added++;
        uint8_t fl = TF_ADDED | (x->special ? TF_SPECIAL : 0);
        if (t->flags[id] & TF_PRESENT) t->flags[id] |= fl;   /* an added token that is also in model.vocab */
        else SN_TRY(tok_set_piece(t, (int32_t)id, x->text, len, fl));
    }
    return SN_OK;
}

sn_status tok_load_hf(json_t *root, const char *file, const char *model_type, sn_tokenizer *t)
{
    t->kind = TOK_HF;
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || (mtype && strcmp(mtype, "BPE")))
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: model.type \"%s\" is not supported (byte-level BPE only)", file,
                       mtype ? mtype : "?");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return SN_FAIL(SN_E_FORMAT, "%s: model.vocab must be an object and model.merges an array", file);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout))
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: BPE dropout is not supported", file);
    const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cont && *cont) || (eow && *eow))
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: continuing_subword_prefix / end_of_word_suffix are not supported", file);
    t->ignore_merges = get_bool(model, "ignore_merges", false);

    /* Pre-tokenizer first: without ByteLevel this is not a byte-level BPE. */
    bool byte_level = false;
    SN_TRY(add_normalizer(t, json_object_get(root, "normalizer"), file));
    SN_TRY(add_pretok(t, json_object_get(root, "pre_tokenizer"), file, &byte_level));
    if (!byte_level)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: no ByteLevel pre-tokenizer (only byte-level BPE is supported)", file);
    if (is_mistral_family(model_type) && t->n_split > 0) {
        /* §5.3 trap: the shipped Split regex is wrong; use tekken's. */
        pcre2_code_free(t->split_re[0]);
        t->split_re[0] = NULL;
        SN_TRY(tok_compile_regex(MISTRAL_PATTERN, sizeof MISTRAL_PATTERN - 1, "mistral pre-tokenizer pattern", &t->split_re[0]));
        t->split_behavior[0] = SPLIT_ISOLATED;
    }

    int64_t max_id = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_IDS)
            return SN_FAIL(SN_E_FORMAT, "%s: model.vocab[\"%s\"] is not an id in [0, %d)", file, k, MAX_IDS);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added)) return SN_FAIL(SN_E_FORMAT, "%s: added_tokens is not an array", file);
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *jid = json_object_get(v, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= MAX_IDS)
            return SN_FAIL(SN_E_FORMAT, "%s: added_tokens[%zu].id is not an id in [0, %d)", file, i, MAX_IDS);
        if (json_integer_value(jid) > max_id) max_id = json_integer_value(jid);
    }
    if (max_id < 0) return SN_FAIL(SN_E_FORMAT, "%s: empty vocabulary", file);
    SN_TRY(tok_alloc_ids(t, (int32_t)max_id + 1));

    int16_t inv[324];
    byte_level_inverse(inv);
    char buf[1024];
    json_object_foreach(vocab, k, v) {
        size_t n = strlen(k);
        char *b = n <= sizeof buf ? buf : malloc(n);
        if (!b) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", file);
        size_t bn = byte_level_decode(inv, k, n, b);
        int32_t id = (int32_t)json_integer_value(v);
        sn_status st = (t->flags[id] & TF_PRESENT)
                           ? SN_FAIL(SN_E_FORMAT, "%s: model.vocab id %d is used twice (\"%s\")", file, id, k)
                           : tok_set_piece(t, id, b, bn, TF_VOCAB);
        if (b != buf) free(b);
        SN_TRY(st);
    }
    SN_TRY(tok_strmap_build(t, &t->vocab, TF_VOCAB, 0));
    SN_TRY(load_merges(t, vocab, merges, file));
    return load_added(t, added, file);
}
