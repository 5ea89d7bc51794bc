/* Tokenizer core: the id table, hash maps, loading dispatch and the encode
 * pipeline shared by tokenizer.json and tekken.json:
 *
 *   raw text -> added/special tokens matched first (longest, leftmost)
 *            -> normalizer (NFC ...) on the text between them
 *            -> added tokens flagged "normalized" matched on that
 *            -> Split pre-tokenizer stages (PCRE2)
 *            -> byte-level BPE per word (bpe.c)
 *
 * This follows the Hugging Face tokenizers pipeline (AddedVocabulary, then
 * normalizer, then pre-tokenizer, then model) so ids match it exactly. */
#include "tok/tok_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
#include <unistd.h>

/* ---------------------------------------------------------------- ids */

void sn_ids_free(sn_ids *v)
{
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

sn_status sn_ids_push(sn_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return SN_FAIL(SN_E_NOMEM, "token id buffer: out of memory (%zu ids)", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return SN_OK;
}

/* ---------------------------------------------------------- hashing */

uint64_t tok_hash(const void *p, size_t n)
{
    /* FNV-1a over 8-byte words with a final avalanche: fast on the short
     * strings (tokens, words) this table sees. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *s++) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static uint32_t pow2_at_least(size_t n)
{
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---------------------------------------------------------- id table */

sn_status tok_alloc_ids(sn_tokenizer *t, int32_t n_ids)
{
    t->n_ids = n_ids;
    t->off = calloc((size_t)n_ids, sizeof *t->off);
    t->len = calloc((size_t)n_ids, sizeof *t->len);
    t->flags = calloc((size_t)n_ids, 1);
    if (!t->off || !t->len || !t->flags)
        return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for %d ids", n_ids);
    return SN_OK;
}

sn_status tok_set_piece(sn_tokenizer *t, int32_t id, const void *bytes, size_t len, uint8_t flags)
{
    SN_ASSERT(id >= 0 && id < t->n_ids && !(t->flags[id] & TF_PRESENT));
    if (len > UINT32_MAX / 2 || t->blob_len + len > UINT32_MAX)
        return SN_FAIL(SN_E_RANGE, "tokenizer: token %d too long (%zu bytes)", id, len);
    if (t->blob_len + len > t->blob_cap) {
        size_t cap = t->blob_cap ? t->blob_cap : 1 << 20;
        while (cap < t->blob_len + len) cap *= 2;
        char *p = realloc(t->blob, cap);
        if (!p) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for token text");
        t->blob = p;
        t->blob_cap = cap;
    }
    if (len) memcpy(t->blob + t->blob_len, bytes, len);
    t->off[id] = (uint32_t)t->blob_len;
    t->len[id] = (uint32_t)len;
    t->blob_len += len;
    t->flags[id] = flags | TF_PRESENT;
    return SN_OK;
}

static inline bool piece_eq(const sn_tokenizer *t, int32_t id, const void *b, size_t n)
{
    return t->len[id] == n && memcmp(t->blob + t->off[id], b, n) == 0;
}

/* Builds a map over every present id whose flags contain need_flags and
 * none of skip_flags. A later duplicate piece keeps the first (lowest) id. */
sn_status tok_strmap_build(sn_tokenizer *t, tok_strmap *m, uint8_t need_flags, uint8_t skip_flags)
{
    m->mask = pow2_at_least((size_t)t->n_ids * 2) - 1;
    m->count = 0;
    m->slots = malloc(((size_t)m->mask + 1) * sizeof *m->slots);
    if (!m->slots) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for the vocabulary index");
    memset(m->slots, 0xff, ((size_t)m->mask + 1) * sizeof *m->slots);
    for (int32_t id = 0; id < t->n_ids; id++) {
        uint8_t f = t->flags[id];
        if (!(f & TF_PRESENT) || (f & need_flags) != need_flags || (f & skip_flags)) continue;
        const char *b = t->blob + t->off[id];
        uint32_t i = (uint32_t)tok_hash(b, t->len[id]) & m->mask;
        for (;; i = (i + 1) & m->mask) {
            int32_t s = m->slots[i];
            if (s < 0) { m->slots[i] = id; m->count++; break; }
            if (piece_eq(t, s, b, t->len[id])) break;
        }
    }
    return SN_OK;
}

int32_t tok_strmap_get(const sn_tokenizer *t, const tok_strmap *m, const void *bytes, size_t len)
{
    if (!m->slots) return -1;
    uint32_t i = (uint32_t)tok_hash(bytes, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        int32_t s = m->slots[i];
        if (s < 0) return -1;
        if (piece_eq(t, s, bytes, len)) return s;
    }
}

sn_status tok_pairmap_init(tok_pairmap *m, size_t expected)
{
    m->mask = pow2_at_least(expected * 2 + 16) - 1;
    m->count = 0;
    m->slots = malloc(((size_t)m->mask + 1) * sizeof *m->slots);
    if (!m->slots) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for the merge table");
    for (size_t i = 0; i <= m->mask; i++) m->slots[i].key = UINT64_MAX;
    return SN_OK;
}

static inline uint32_t pair_slot(uint64_t key, uint32_t mask)
{
    key ^= key >> 31;
    key *= 0x9e3779b97f4a7c15ull;
    return (uint32_t)(key >> 32) & mask;
}

void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    SN_ASSERT(m->count < m->mask);   /* sized by the caller for every pair */
    for (uint32_t i = pair_slot(key, m->mask);; i = (i + 1) & m->mask) {
        tok_pair *p = &m->slots[i];
        if (p->key == UINT64_MAX) {
            p->key = key; p->rank = rank; p->id = id;
            m->count++;
            return;
        }
        if (p->key == key) {
            if (rank < p->rank) { p->rank = rank; p->id = id; }
            return;
        }
    }
}

const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = pair_slot(key, m->mask);; i = (i + 1) & m->mask) {
        const tok_pair *p = &m->slots[i];
        if (p->key == key) return p;
        if (p->key == UINT64_MAX) return NULL;
    }
}

/* ---------------------------------------------------------- regex */

sn_status tok_compile_regex(const char *pattern, size_t len, const char *what, pcre2_code **out)
{
    /* UTF + UCP give \s, \p{L}, \p{N} their Unicode meaning, as in
     * Oniguruma (tokenizers) and fancy-regex (tiktoken); with UCP, PCRE2's
     * \s already includes U+0085 like theirs (checked by the NEL strings in
     * tests/fixtures/tokenizer/strings.json). */
    int err = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return SN_FAIL(SN_E_FORMAT, "%s: bad regex near offset %zu: %s", what, (size_t)erroff, (char *)msg);
    }
    /* JIT is an accelerator only: without it (no JIT support) matching still works. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return SN_OK;
}

/* ---------------------------------------------------------- finish/free */

static int added_cmp(const void *a, const void *b)
{
    const tok_added *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t trie_node(sn_tokenizer *t)
{
    if (t->n_trie == t->cap_trie) {
        size_t c = t->cap_trie ? t->cap_trie * 2 : 256;
        struct tok_trie *p = realloc(t->trie, c * sizeof *p);
        if (!p) return -1;
        t->trie = p;
        t->cap_trie = c;
    }
    t->trie[t->n_trie] = (struct tok_trie){ -1, -1, -1, 0 };
    return (int32_t)t->n_trie++;
}

/* Adds added[k] under root cls; a duplicate text keeps the lower id. */
static sn_status trie_insert(sn_tokenizer *t, int cls, size_t k)
{
    const tok_added *a = &t->added[k];
    int32_t node = cls;
    for (size_t i = 0; i < a->len; i++) {
        uint8_t c = (uint8_t)a->text[i];
        int32_t ch = t->trie[node].child;
        while (ch >= 0 && t->trie[ch].byte != c) ch = t->trie[ch].sibling;
        if (ch < 0) {
            if ((ch = trie_node(t)) < 0) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for added tokens");
            t->trie[ch].byte = c;
            t->trie[ch].sibling = t->trie[node].child;
            t->trie[node].child = ch;
        }
        node = ch;
    }
    if (t->trie[node].added < 0) t->trie[node].added = (int32_t)k;
    return SN_OK;
}

sn_status tok_finish(sn_tokenizer *t, const char *what)
{
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_strmap_get(t, &t->vocab, &c, 1);
        if (t->byte_id[b] < 0)
            return SN_FAIL(SN_E_FORMAT, "%s: vocabulary has no token for byte 0x%02x (byte-level BPE needs all 256)", what, b);
    }
    if (t->n_added) qsort(t->added, t->n_added, sizeof *t->added, added_cmp);
    if (trie_node(t) != 0 || trie_node(t) != 1) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->normalized) {
            /* tokenizers matches these on normalized text, so it normalizes them too */
            char *norm;
            const char *p;
            size_t pn;
            SN_TRY(tok_normalize(t, a->text, a->len, &norm, &p, &pn));
            if (norm) {
                free(a->text);
                a->text = norm;
                a->len = pn;
            }
        }
        if (!a->len) continue;
        t->first_byte[a->normalized][(unsigned char)a->text[0]] = true;
        SN_TRY(trie_insert(t, t->added[i].normalized, i));
    }
    return tok_cache_init(&t->cache);
}

void sn_tok_free(sn_tokenizer *t)
{
    if (!t) return;
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->flags);
    free(t->vocab.slots);
    free(t->merges.slots);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].text);
    free(t->added);
    free(t->trie);
    for (int i = 0; i < t->n_split; i++) pcre2_code_free(t->split_re[i]);
    tok_cache_free(&t->cache);
    free(t);
}

/* ---------------------------------------------------------- loading */

#define TOK_MAX_FILE (256u << 20)

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

sn_status sn_tok_load(const char *path, const char *model_type, sn_tokenizer **out)
{
    if (!path || !out) return SN_FAIL(SN_E_INVALID, "sn_tok_load: NULL argument");
    *out = NULL;
    char file[4096];
    if (is_dir(path)) {
        snprintf(file, sizeof file, "%s/tekken.json", path);
        if (!is_file(file)) snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (!is_file(file))
            return SN_FAIL(SN_E_MISSING, "%s: no tekken.json or tokenizer.json in the model directory", path);
    } else {
        if (strlen(path) >= sizeof file) return SN_FAIL(SN_E_INVALID, "tokenizer path too long");
        strcpy(file, path);
    }
    /* Read whole, then parse from memory: jansson's file reader goes byte by byte.
     * Checked before the open too: opening a FIFO blocks until a writer comes. */
    if (!is_file(file) && !access(file, F_OK)) return SN_FAIL(SN_E_FORMAT, "%s: not a regular file", file);
    FILE *f = fopen(file, "rb");
    if (!f) return SN_FAIL(SN_E_IO, "%s: cannot open: %s", file, strerror(errno));
    /* A device or FIFO (/dev/zero) would be read until memory ran out, and
     * no real tokenizer file comes near TOK_MAX_FILE (tekken.json ~ 15 MB). */
    struct stat fst;
    if (fstat(fileno(f), &fst) != 0 || !S_ISREG(fst.st_mode)) {
        fclose(f);
        return SN_FAIL(SN_E_FORMAT, "%s: not a regular file", file);
    }
    if ((uint64_t)fst.st_size > TOK_MAX_FILE) {
        fclose(f);
        return SN_FAIL(SN_E_FORMAT, "%s: %lld bytes, larger than the %u MB a tokenizer file may have", file,
                       (long long)fst.st_size, TOK_MAX_FILE >> 20);
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= TOK_MAX_FILE) {   /* grew while being read */
                free(buf);
                fclose(f);
                return SN_FAIL(SN_E_FORMAT, "%s: larger than the %u MB a tokenizer file may have", file,
                               TOK_MAX_FILE >> 20);
            }
            cap = cap ? cap * 2 : 1 << 20;
            char *p = realloc(buf, cap);
            if (!p) { free(buf); fclose(f); return SN_FAIL(SN_E_NOMEM, "%s: out of memory reading the file", file); }
            buf = p;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    bool rerr = ferror(f);
    fclose(f);
    if (rerr) { free(buf); return SN_FAIL(SN_E_IO, "%s: read error", file); }
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    free(buf);
    if (!root)
        return SN_FAIL(SN_E_FORMAT, "%s: %s (line %d, column %d, byte %d)", file, jerr.text, jerr.line, jerr.column,
                       jerr.position);
    sn_status st = SN_OK;
    sn_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { st = SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory"); goto out; }
    t->prefix_stage = -1;
    if (!json_is_object(root)) { st = SN_FAIL(SN_E_FORMAT, "%s: top level is not a JSON object", file); goto out; }
    if (json_object_get(root, "model")) st = tok_load_hf(root, file, model_type, t);
    else if (json_object_get(root, "vocab") && json_object_get(root, "config")) st = tok_load_tekken(root, file, t);
    else st = SN_FAIL(SN_E_FORMAT, "%s: neither a tokenizer.json (no \"model\") nor a tekken.json (no \"vocab\"/\"config\")", file);
    if (st == SN_OK) st = tok_finish(t, file);
out:
    json_decref(root);
    if (st != SN_OK) { sn_tok_free(t); return st; }
    *out = t;
    return SN_OK;
}

/* ---------------------------------------------------------- queries */

const char *sn_tok_piece(const sn_tokenizer *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || id >= t->n_ids || !(t->flags[id] & TF_PRESENT)) return NULL;
    if (len) *len = t->len[id];
    return t->blob + t->off[id];
}

int32_t sn_tok_vocab_size(const sn_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t sn_tok_find(const sn_tokenizer *t, const char *token)
{
    if (!t || !token) return -1;
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].text, token, n) == 0) return t->added[i].id;
    return tok_strmap_get(t, &t->vocab, token, n);
}

bool sn_tok_is_special(const sn_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_ids && (t->flags[id] & TF_SPECIAL);
}

const char *sn_tok_kind(const sn_tokenizer *t)
{
    return !t ? "" : t->kind == TOK_TEKKEN ? "tekken.json" : "tokenizer.json";
}

/* ---------------------------------------------------------- encoding */

typedef struct {
    const sn_tokenizer *t;
    bool parse_special;
    const sn_tok_range *plain;   /* byte ranges of the input where special tokens stay text */
    size_t n_plain;
    pcre2_match_data *md;
    pcre2_match_context *mc;     /* explicit backtracking limits, see TOK_MATCH_BASE */
    sn_ids *out;
} enc_ctx;

/* Backtracking bounds for the pre-tokenizer regex, which comes from the
 * tokenizer file and so is untrusted. A real pattern spends a few steps
 * per byte of what remains of the piece (a run of 4 MB of spaces through
 * `\s+(?!\S)` takes ~2 per byte), so each call may spend a base plus
 * TOK_MATCH_PER_BYTE per remaining byte; a catastrophic pattern (nested
 * quantifiers, stacked a*a*a*) outgrows that on its first call and the
 * encode fails with an error instead of spinning. Depth and heap bound the
 * interpreter when JIT is unavailable. */
#define TOK_MATCH_BASE 1000000u
#define TOK_MATCH_PER_BYTE 16u
#define TOK_DEPTH_LIMIT 100000u
#define TOK_HEAP_LIMIT_KB (64u * 1024u)

/* May a special token occupying [a, b) of the original input match? */
static bool special_ok(const enc_ctx *c, size_t a, size_t b)
{
    if (!c->parse_special) return false;
    for (size_t i = 0; i < c->n_plain; i++)
        if (a < c->plain[i].off + c->plain[i].len && c->plain[i].off < b) return false;
    return true;
}

/* Unicode White_Space (Rust char::is_whitespace), for lstrip/rstrip. */
static bool is_white_space(int32_t c)
{
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

static bool is_word_char(int32_t c)
{
    if (c == '_') return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* Code point ending at s[end) (the input is valid UTF-8), its start in *start. */
static int32_t cp_before(const char *s, size_t end, size_t *start)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    utf8proc_int32_t c = -1;
    utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(end - i), &c);
    *start = i;
    return c;
}

static int32_t cp_at(const char *s, size_t pos, size_t n, size_t *next)
{
    utf8proc_int32_t c = -1;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + pos, (utf8proc_ssize_t)(n - pos), &c);
    *next = pos + (k > 0 ? (size_t)k : 1);
    return c;
}

/* Finds the next accepted added-token match of class cls (normalized or
 * not) in s[from, n): leftmost, then longest, as an Aho-Corasick
 * leftmost-longest automaton reports them. A single_word token next to a
 * word character is skipped (and its text is not rescanned). lstrip/rstrip
 * widen the match over whitespace, never before floor. Class 0 runs on the
 * original input (special tokens checked against the plain ranges by
 * offset); class 1 on a normalized segment, where seg_special says whether
 * special tokens may match at all. */
static bool added_next(const enc_ctx *c, const char *s, size_t n, size_t from, size_t floor, int cls,
                       bool seg_special, size_t *ms, size_t *me, int32_t *id)
{
    const sn_tokenizer *t = c->t;
    for (size_t i = from; i < n; i++) {
        if (!t->first_byte[cls][(unsigned char)s[i]]) continue;
        /* longest token of this class starting at i */
        const tok_added *hit = NULL;
        int32_t node = cls;
        for (size_t j = i; j < n; j++) {
            int32_t ch = t->trie[node].child;
            while (ch >= 0 && t->trie[ch].byte != (uint8_t)s[j]) ch = t->trie[ch].sibling;
            if (ch < 0) break;
            if (t->trie[ch].added >= 0) hit = &t->added[t->trie[ch].added];
            node = ch;
        }
        if (!hit) continue;
        /* A special token that may not match here is skipped whole, as
         * tokenizers skips it with encode_special_tokens: its text is not
         * rescanned for shorter tokens. */
        if (hit->special && !(cls ? seg_special : special_ok(c, i, i + hit->len))) {
            i += hit->len - 1;
            continue;
        }
        size_t start = i, end = i + hit->len, p;
        if (hit->single_word) {
            bool ok = true;
            if (start > 0 && is_word_char(cp_before(s, start, &p))) ok = false;
            if (end < n && is_word_char(cp_at(s, end, n, &p))) ok = false;
            if (!ok) { i = end - 1; continue; }
        }
        if (hit->lstrip)
            while (start > floor) {
                if (!is_white_space(cp_before(s, start, &p)) || p < floor) break;
                start = p;
            }
        if (hit->rstrip)
            while (end < n) {
                if (!is_white_space(cp_at(s, end, n, &p))) break;
                end = p;
            }
        *ms = start;
        *me = end;
        *id = hit->id;
        return true;
    }
    return false;
}

static sn_status pretok(const enc_ctx *c, int stage, const char *s, size_t n);

static sn_status pretok_piece(const enc_ctx *c, int stage, const char *s, size_t n)
{
    if (n == 0) return SN_OK;
    const sn_tokenizer *t = c->t;
    if (stage == t->prefix_stage && s[0] != ' ') {
        /* ByteLevel add_prefix_space: rare (GPT-2 style files), so a copy is fine. */
        char small[256];
        char *b = n + 1 <= sizeof small ? small : malloc(n + 1);
        if (!b) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory");
        b[0] = ' ';
        memcpy(b + 1, s, n);
        sn_status st = stage == t->n_split ? tok_bpe_word(t, b, n + 1, c->out) : pretok(c, stage, b, n + 1);
        if (b != small) free(b);
        return st;
    }
    if (stage == t->n_split) return tok_bpe_word(t, s, n, c->out);
    return pretok(c, stage, s, n);
}

/* One Split stage over s[0, n): the subject is the piece alone, so
 * lookarounds stop at its edges as they do in tokenizers. */
static sn_status pretok(const enc_ctx *c, int stage, const char *s, size_t n)
{
    const sn_tokenizer *t = c->t;
    const pcre2_code *re = t->split_re[stage];
    int beh = t->split_behavior[stage];
    size_t pos = 0, last = 0;
    while (pos <= n) {
        size_t lim = TOK_MATCH_BASE + TOK_MATCH_PER_BYTE * (n - pos);
        pcre2_set_match_limit(c->mc, lim > UINT32_MAX ? UINT32_MAX : (uint32_t)lim);
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
                         rc == PCRE2_ERROR_JIT_STACKLIMIT;
            return SN_FAIL(limit ? SN_E_RANGE : SN_E_INVALID,
                           "tokenizer: pre-tokenizer regex %d failed at byte %zu of a %zu-byte piece: %s%s", stage,
                           pos, n, (char *)msg,
                           limit ? " (the tokenizer file's pattern backtracks catastrophically)" : "");
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        if (b == a) {  /* an empty match splits nothing; step one character */
            if (a >= n) break;
            size_t nx;
            cp_at(s, a, n, &nx);
            pos = nx;
            continue;
        }
        switch (beh) {
        case SPLIT_ISOLATED:
            SN_TRY(pretok_piece(c, stage + 1, s + last, a - last));
            SN_TRY(pretok_piece(c, stage + 1, s + a, b - a));
            last = b;
            break;
        case SPLIT_REMOVED:
            SN_TRY(pretok_piece(c, stage + 1, s + last, a - last));
            last = b;
            break;
        case SPLIT_MERGED_PREV:
            SN_TRY(pretok_piece(c, stage + 1, s + last, b - last));
            last = b;
            break;
        case SPLIT_MERGED_NEXT:
            SN_TRY(pretok_piece(c, stage + 1, s + last, a - last));
            last = a;
            break;
        }
        pos = b;
    }
    return pretok_piece(c, stage + 1, s + last, n - last);
}

static sn_status encode_words(const enc_ctx *c, const char *s, size_t n)
{
    return n ? pretok_piece(c, 0, s, n) : SN_OK;
}

static bool all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* Text between raw-matched added tokens: normalize, match the "normalized"
 * added tokens on the result, pre-tokenize and BPE the rest. */
sn_status tok_normalize(const sn_tokenizer *t, const char *s, size_t n, char **norm, const char **out, size_t *out_n)
{
    *norm = NULL;
    *out = s;
    *out_n = n;
    if (!t->n_norm || all_ascii(s, n)) return SN_OK;   /* ASCII is invariant under every Unicode normal form */
    for (int k = 0; k < t->n_norm; k++) {
        int opt = UTF8PROC_STABLE;
        switch (t->norm[k]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        case NORM_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *r = NULL;
        utf8proc_ssize_t rn = utf8proc_map((const utf8proc_uint8_t *)*out, (utf8proc_ssize_t)*out_n, &r, opt);
        if (rn < 0) {
            free(*norm);
            *norm = NULL;
            return SN_FAIL(SN_E_INVALID, "tokenizer: normalization failed: %s", utf8proc_errmsg(rn));
        }
        free(*norm);
        *norm = (char *)r;
        *out = *norm;
        *out_n = (size_t)rn;
    }
    return SN_OK;
}

static sn_status encode_segment(const enc_ctx *c, const char *s, size_t n, bool seg_special)
{
    char *norm = NULL;
    SN_TRY(tok_normalize(c->t, s, n, &norm, &s, &n));
    sn_status st = SN_OK;
    size_t pos = 0, ms, me;
    int32_t id;
    while (pos < n && added_next(c, s, n, pos, pos, 1, seg_special, &ms, &me, &id)) {
        if ((st = encode_words(c, s + pos, ms - pos)) != SN_OK) goto out;
        if ((st = sn_ids_push(c->out, id)) != SN_OK) goto out;
        pos = me;
    }
    st = encode_words(c, s + pos, n - pos);
out:
    free(norm);
    return st;
}

static sn_status encode(const sn_tokenizer *t, const char *text, size_t len, bool parse_special,
                        const sn_tok_range *plain, size_t n_plain, sn_ids *out)
{
    if (!t || !out || (!text && len) || (!plain && n_plain)) return SN_FAIL(SN_E_INVALID, "sn_tok_encode: NULL argument");
    size_t bad = tok_utf8_check(text, len);
    if (bad < len) return SN_FAIL(SN_E_INVALID, "tokenizer input: invalid UTF-8 at byte %zu of %zu", bad, len);
    enc_ctx c = { .t = t, .parse_special = parse_special, .plain = plain, .n_plain = n_plain, .out = out };
    c.md = pcre2_match_data_create(1, NULL);
    c.mc = pcre2_match_context_create(NULL);
    if (!c.md || !c.mc) {
        pcre2_match_data_free(c.md);
        pcre2_match_context_free(c.mc);
        return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory");
    }
    pcre2_set_depth_limit(c.mc, TOK_DEPTH_LIMIT);
    pcre2_set_heap_limit(c.mc, TOK_HEAP_LIMIT_KB);
    sn_status st = SN_OK;
    size_t pos = 0, ms, me;
    int32_t id;
    while (pos < len && added_next(&c, text, len, pos, pos, 0, false, &ms, &me, &id)) {
        if ((st = encode_segment(&c, text + pos, ms - pos, special_ok(&c, pos, ms))) != SN_OK) goto out;
        if ((st = sn_ids_push(out, id)) != SN_OK) goto out;
        pos = me;
    }
    st = encode_segment(&c, text + pos, len - pos, special_ok(&c, pos, len));
out:
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mc);
    return st;
}

sn_status sn_tok_encode(const sn_tokenizer *t, const char *text, size_t len, bool parse_special, sn_ids *out)
{
    return encode(t, text, len, parse_special, NULL, 0, out);
}

sn_status sn_tok_encode_guarded(const sn_tokenizer *t, const char *text, size_t len, const sn_tok_range *plain,
                                size_t n_plain, sn_ids *out)
{
    for (size_t i = 0; i < n_plain; i++)
        if (!plain || plain[i].off > len || plain[i].len > len - plain[i].off)
            return SN_FAIL(SN_E_INVALID, "sn_tok_encode_guarded: range %zu lies outside the %zu-byte text", i, len);
    return encode(t, text, len, true, plain, n_plain, out);
}
