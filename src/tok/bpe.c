/* Byte-level BPE over one pre-tokenized word, and the word -> ids cache.
 *
 * Both tokenizer.json (merges ranked by their line in model.merges) and
 * tekken (tiktoken: a pair merges into the token equal to its concatenated
 * bytes, ranked by that token's rank) reduce to one table (left id, right
 * id) -> (rank, merged id), built by the loaders. The loop repeatedly
 * merges the lowest-ranked adjacent pair, leftmost first on ties, which is
 * the order of both the tokenizers heap (rank, position) and tiktoken's
 * scan. Symbols live in a doubly linked array; candidate pairs in a binary
 * min-heap, validated when popped (a stale entry names ids that changed). */
#include "tok/tok_internal.h"

#include <string.h>

#define CACHE_SLOTS (1u << 17)
#define CACHE_MAX_ENTS (CACHE_SLOTS / 2)
#define CACHE_MAX_WORD 64         /* longer words are rare; caching them wastes memory */
#define CACHE_MAX_BYTES (16u << 20)

sn_status tok_cache_init(tok_cache *c)
{
    memset(c, 0, sizeof *c);
    if (pthread_rwlock_init(&c->lock, NULL) != 0) return SN_FAIL(SN_E_NOMEM, "tokenizer: cannot create the cache lock");
    c->mask = CACHE_SLOTS - 1;
    c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
    c->cap_ents = 4096;
    c->ents = malloc(c->cap_ents * sizeof *c->ents);
    c->words_cap = 1 << 16;
    c->words = malloc(c->words_cap);
    c->ids_cap = 1 << 14;
    c->ids = malloc(c->ids_cap * sizeof *c->ids);
    if (!c->slots || !c->ents || !c->words || !c->ids) {
        tok_cache_free(c);
        return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for the word cache");
    }
    return SN_OK;
}

void tok_cache_free(tok_cache *c)
{
    if (!c->slots && !c->ents && !c->words && !c->ids) return;
    free(c->slots);
    free(c->ents);
    free(c->words);
    free(c->ids);
    pthread_rwlock_destroy(&c->lock);
    memset(c, 0, sizeof *c);
}

/* Returns true and appends the cached ids when w is cached. */
static bool cache_get(tok_cache *c, uint64_t h, const char *w, size_t n, sn_ids *out, sn_status *st)
{
    bool hit = false;
    *st = SN_OK;
    pthread_rwlock_rdlock(&c->lock);
    for (uint32_t i = (uint32_t)h & c->mask; c->slots[i]; i = (i + 1) & c->mask) {
        const struct tok_cache_ent *e = &c->ents[c->slots[i] - 1];
        if (e->hash == h && e->word_len == n && memcmp(c->words + e->word_off, w, n) == 0) {
            for (uint32_t k = 0; k < e->n_ids && *st == SN_OK; k++) *st = sn_ids_push(out, c->ids[e->ids_off + k]);
            hit = true;
            break;
        }
    }
    pthread_rwlock_unlock(&c->lock);
    return hit;
}

static void cache_put(tok_cache *c, uint64_t h, const char *w, size_t n, const int32_t *ids, size_t n_ids)
{
    pthread_rwlock_wrlock(&c->lock);
    if (c->full) goto out;
    if (c->n_ents >= CACHE_MAX_ENTS || c->words_len + n > CACHE_MAX_BYTES) { c->full = true; goto out; }
    uint32_t i = (uint32_t)h & c->mask;
    for (; c->slots[i]; i = (i + 1) & c->mask) {
        const struct tok_cache_ent *e = &c->ents[c->slots[i] - 1];
        if (e->hash == h && e->word_len == n && memcmp(c->words + e->word_off, w, n) == 0) goto out;
    }
    /* Growth failures only mean the word is not cached. */
    if (c->n_ents == c->cap_ents) {
        void *p = realloc(c->ents, c->cap_ents * 2 * sizeof *c->ents);
        if (!p) goto out;
        c->ents = p;
        c->cap_ents *= 2;
    }
    while (c->words_len + n > c->words_cap) {
        void *p = realloc(c->words, c->words_cap * 2);
        if (!p) goto out;
        c->words = p;
        c->words_cap *= 2;
    }
    while (c->ids_len + n_ids > c->ids_cap) {
        void *p = realloc(c->ids, c->ids_cap * 2 * sizeof *c->ids);
        if (!p) goto out;
        c->ids = p;
        c->ids_cap *= 2;
    }
    struct tok_cache_ent *e = &c->ents[c->n_ents];
    e->hash = h;
    e->word_off = (uint32_t)c->words_len;
    e->word_len = (uint32_t)n;
    e->ids_off = (uint32_t)c->ids_len;
    e->n_ids = (uint32_t)n_ids;
    memcpy(c->words + c->words_len, w, n);
    c->words_len += n;
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof *ids);
    c->ids_len += n_ids;
    c->slots[i] = ++c->n_ents;
out:
    pthread_rwlock_unlock(&c->lock);
}

typedef struct { int32_t rank; int32_t pos; int32_t left, right; } cand;

static inline bool cand_less(const cand *a, const cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) { m = l; best = &h[l]; }
        if (r < *n && cand_less(&h[r], best)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const sn_tokenizer *t, const int32_t *id, int32_t a, int32_t b, cand *h, size_t *nh)
{
    const tok_pair *p = tok_pairmap_get(&t->merges, id[a], id[b]);
    if (p) heap_push(h, nh, (cand){ p->rank, a, id[a], id[b] });
}

/* The merge loop on n symbols (n >= 2) in id[]; writes the result ids to
 * res and returns how many. Work arrays come from the caller. */
static size_t bpe_merge(const sn_tokenizer *t, int32_t *id, int32_t *prev, int32_t *next, cand *h, size_t n,
                        int32_t *res)
{
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, id, (int32_t)i, (int32_t)i + 1, h, &nh);
    while (nh) {
        cand c = heap_pop(h, &nh);
        int32_t a = c.pos, b = next[a];
        /* A dead symbol has id -1; a stale candidate names ids that changed. */
        if (id[a] != c.left || b < 0 || id[b] != c.right) continue;
        const tok_pair *p = tok_pairmap_get(&t->merges, c.left, c.right);
        id[a] = p->id;
        id[b] = -1;
        next[a] = next[b];
        if (next[b] >= 0) prev[next[b]] = a;
        if (prev[a] >= 0) try_pair(t, id, prev[a], a, h, &nh);
        if (next[a] >= 0) try_pair(t, id, a, next[a], h, &nh);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) res[k++] = id[i];
    return k;
}

sn_status tok_bpe_word(const sn_tokenizer *t, const char *w, size_t n, sn_ids *out)
{
    if (n == 0) return SN_OK;
    if (n == 1) return sn_ids_push(out, t->byte_id[(unsigned char)w[0]]);
    if (t->ignore_merges) {
        int32_t whole = tok_strmap_get(t, &t->vocab, w, n);
        if (whole >= 0) return sn_ids_push(out, whole);
    }
    tok_cache *cache = (tok_cache *)&t->cache;   /* the cache is the one mutable part; it locks */
    uint64_t h = 0;
    sn_status st;
    if (n <= CACHE_MAX_WORD) {
        h = tok_hash(w, n);
        if (cache_get(cache, h, w, n, out, &st)) return st;
    }
    /* Stack buffers for ordinary words; long runs (a megabyte without a
     * split point) go to the heap. */
    enum { SMALL = 128 };
    int32_t s_id[SMALL], s_prev[SMALL], s_next[SMALL], s_res[SMALL];
    cand s_heap[SMALL * 3];
    int32_t *id = s_id, *prev = s_prev, *next = s_next, *res = s_res;
    cand *heap = s_heap;
    void *big = NULL;
    if (n > SMALL) {
        /* Each merge pushes at most 2 candidates: n - 1 initial + 2(n - 1). */
        big = malloc(n * 4 * sizeof(int32_t) + 3 * n * sizeof(cand));
        if (!big) return SN_FAIL(SN_E_NOMEM, "tokenizer: out of memory for a %zu-byte word", n);
        heap = big;
        id = (int32_t *)(heap + 3 * n);
        prev = id + n;
        next = prev + n;
        res = next + n;
    }
    for (size_t i = 0; i < n; i++) id[i] = t->byte_id[(unsigned char)w[i]];
    size_t k = bpe_merge(t, id, prev, next, heap, n, res);
    st = SN_OK;
    for (size_t i = 0; i < k && st == SN_OK; i++) st = sn_ids_push(out, res[i]);
    if (st == SN_OK && n <= CACHE_MAX_WORD) cache_put(cache, h, w, n, res, k);
    free(big);
    return st;
}
