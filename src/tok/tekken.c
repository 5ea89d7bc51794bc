/* Loader for Mistral tekken.json (tiktoken-style byte BPE, as read by
 * mistral-common's Tekkenizer).
 *
 * Ids 0 .. num_special-1 are control tokens (from "special_tokens", or the
 * historical fixed list for files without it, padded with <SPECIAL_n>);
 * a normal token's id is its rank + num_special, and only the first
 * default_vocab_size - num_special ranks are used. There is no merges
 * list: a pair merges into the token equal to its concatenated bytes, with
 * that token's rank as the merge priority. */
#include "tok/tok_internal.h"

#include <string.h>

#define MAX_VOCAB (1 << 22)

static const char *const LEGACY_SPECIALS[] = {
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
};

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with optional '=' padding; returns the length or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    long o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return o;
}

static sn_status add_control(sn_tokenizer *t, int32_t id, const char *text, size_t len)
{
    tok_added *a = &t->added[t->n_added++];
    a->text = malloc(len + 1);
    if (!a->text) return SN_FAIL(SN_E_NOMEM, "tekken: out of memory");
    memcpy(a->text, text, len);
    a->text[len] = 0;
    a->len = len;
    a->id = id;
    a->special = true;
    return tok_set_piece(t, id, text, len, TF_SPECIAL | TF_ADDED);
}

sn_status tok_load_tekken(json_t *root, const char *file, sn_tokenizer *t)
{
    t->kind = TOK_TEKKEN;
    t->ignore_merges = true;   /* tiktoken returns a piece that is a whole token directly */
    json_t *cfg = json_object_get(root, "config"), *vocab = json_object_get(root, "vocab");
    json_t *specials = json_object_get(root, "special_tokens");
    if (!json_is_object(cfg) || !json_is_array(vocab))
        return SN_FAIL(SN_E_FORMAT, "%s: \"config\" must be an object and \"vocab\" an array", file);
    json_t *jpat = json_object_get(cfg, "pattern");
    json_t *jvs = json_object_get(cfg, "default_vocab_size");
    json_t *jns = json_object_get(cfg, "default_num_special_tokens");
    if (!json_is_string(jpat)) return SN_FAIL(SN_E_FORMAT, "%s: config.pattern missing", file);
    if (!json_is_integer(jvs)) return SN_FAIL(SN_E_FORMAT, "%s: config.default_vocab_size missing", file);
    if (specials && !json_is_null(specials) && !json_is_array(specials))
        return SN_FAIL(SN_E_FORMAT, "%s: special_tokens is not an array", file);
    size_t n_listed = json_is_array(specials) ? json_array_size(specials) : sizeof LEGACY_SPECIALS / sizeof *LEGACY_SPECIALS;
    json_int_t n_special = json_is_integer(jns) ? json_integer_value(jns) : (json_int_t)n_listed;
    json_int_t vocab_size = json_integer_value(jvs);
    if (n_special < 3 || n_special > 100000 || (size_t)n_special < n_listed)
        return SN_FAIL(SN_E_FORMAT, "%s: config.default_num_special_tokens %lld is invalid for %zu special tokens",
                       file, (long long)n_special, n_listed);
    if (vocab_size <= n_special + 256 || vocab_size > MAX_VOCAB)
        return SN_FAIL(SN_E_FORMAT, "%s: config.default_vocab_size %lld out of range", file, (long long)vocab_size);
    int32_t inner = (int32_t)(vocab_size - n_special);
    SN_TRY(tok_alloc_ids(t, (int32_t)vocab_size));

    t->added = calloc((size_t)n_special, sizeof *t->added);
    if (!t->added) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", file);
    if (json_is_array(specials)) {
        size_t i;
        json_t *s;
        json_array_foreach(specials, i, s) {
            json_t *jr = json_object_get(s, "rank"), *js = json_object_get(s, "token_str");
            if (!json_is_integer(jr) || !json_is_string(js) || json_string_length(js) == 0)
                return SN_FAIL(SN_E_FORMAT, "%s: special_tokens[%zu] needs \"rank\" and a non-empty \"token_str\"", file, i);
            json_int_t r = json_integer_value(jr);
            if (r < 0 || r >= n_special) return SN_FAIL(SN_E_RANGE, "%s: special_tokens[%zu].rank %lld out of range", file, i, (long long)r);
            if (t->flags[r] & TF_PRESENT) return SN_FAIL(SN_E_FORMAT, "%s: special_tokens[%zu].rank %lld used twice", file, i, (long long)r);
            SN_TRY(add_control(t, (int32_t)r, json_string_value(js), json_string_length(js)));
        }
    } else {
        for (size_t i = 0; i < n_listed; i++)
            SN_TRY(add_control(t, (int32_t)i, LEGACY_SPECIALS[i], strlen(LEGACY_SPECIALS[i])));
    }
    for (int32_t r = 0; r < n_special; r++)
        if (!(t->flags[r] & TF_PRESENT)) {
            char name[32];
            int len = snprintf(name, sizeof name, "<SPECIAL_%d>", r);
            SN_TRY(add_control(t, r, name, (size_t)len));
        }

    unsigned char buf[1024];
    size_t i;
    json_t *e;
    int32_t n_used = 0;
    json_array_foreach(vocab, i, e) {
        json_t *jr = json_object_get(e, "rank"), *jb = json_object_get(e, "token_bytes");
        if (!json_is_integer(jr) || !json_is_string(jb))
            return SN_FAIL(SN_E_FORMAT, "%s: vocab[%zu] needs an integer \"rank\" and a string \"token_bytes\"", file, i);
        json_int_t r = json_integer_value(jr);
        if (r < 0) return SN_FAIL(SN_E_FORMAT, "%s: vocab[%zu].rank is negative", file, i);
        if (r >= inner) continue;   /* beyond default_vocab_size: unused by mistral-common */
        size_t bl = json_string_length(jb);
        if (bl / 4 * 3 + 3 > sizeof buf) return SN_FAIL(SN_E_FORMAT, "%s: vocab[%zu].token_bytes too long", file, i);
        long n = b64_decode(json_string_value(jb), bl, buf);
        if (n <= 0) return SN_FAIL(SN_E_FORMAT, "%s: vocab[%zu].token_bytes is not base64", file, i);
        int32_t id = (int32_t)(r + n_special);
        if (t->flags[id] & TF_PRESENT) return SN_FAIL(SN_E_FORMAT, "%s: vocab[%zu].rank %lld used twice", file, i, (long long)r);
        SN_TRY(tok_set_piece(t, id, buf, (size_t)n, TF_VOCAB));
        n_used++;
    }
    if (n_used < inner)
        return SN_FAIL(SN_E_FORMAT, "%s: vocab has %d of the %d ranks below default_vocab_size", file, n_used, inner);
    SN_TRY(tok_strmap_build(t, &t->vocab, TF_VOCAB, 0));

    /* Merge table: every split of every token into two tokens. */
    size_t n_pairs = 0;
    for (int32_t id = (int32_t)n_special; id < t->n_ids; id++) n_pairs += t->len[id] > 1 ? t->len[id] - 1 : 0;
    SN_TRY(tok_pairmap_init(&t->merges, n_pairs));
    for (int32_t id = (int32_t)n_special; id < t->n_ids; id++) {
        const char *b = t->blob + t->off[id];
        uint32_t n = t->len[id];
        for (uint32_t k = 1; k < n; k++) {
            int32_t l = tok_strmap_get(t, &t->vocab, b, k);
            if (l < 0) continue;
            int32_t r = tok_strmap_get(t, &t->vocab, b + k, n - k);
            if (r >= 0) tok_pairmap_put(&t->merges, l, r, id, id);
        }
    }
    char what[512];
    snprintf(what, sizeof what, "%s: config.pattern", file);
    SN_TRY(tok_compile_regex(json_string_value(jpat), json_string_length(jpat), what, &t->split_re[0]));
    t->split_behavior[0] = SPLIT_ISOLATED;
    t->n_split = 1;
    return SN_OK;
}
