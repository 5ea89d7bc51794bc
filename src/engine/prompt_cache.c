/* Prompt-cache pool and recurrent-state rewind (prompt_cache.h).
 *
 * This file reads the sequence state directly (models/model_impl.h) rather
 * than through sn_seq_snapshot: a snapshot copies every KV row below the
 * position, so one per checkpoint would cost O(checkpoints x length). Here
 * every KV row is kept once (in the segment of the request that computed
 * it, shared by the entries that extend it) plus the recurrent state per
 * checkpoint, and a restore copies the KV prefix up to the chosen
 * checkpoint plus that checkpoint's recurrent state.
 *
 * Pool state lives in pc_buf buffers: backend buffers where the backend
 * has device memory (a restore is then device-to-device copies queued on
 * the backend's stream: no PCIe, no host wait), host memory on the CPU or
 * when the backend cannot allocate (prompt_cache.h, "store"). */
#include "sanctum/prompt_cache.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/model_impl.h"
#include "sanctum/clock.h"

#define PC_DEFAULT_BUDGET ((size_t)512 << 20)
#define PC_DEFAULT_EVERY 256

/* ---- recurrent state helpers ------------------------------------------- */

/* Backend memory is touched under the model lock, as sn_forward_batch and
 * the seq functions do: a backend (CUDA replaying a decode step) serves one
 * caller at a time. The helpers below expect the caller to hold it. */
#define MLOCK(m) pthread_mutex_lock(&(m)->lock)
#define MUNLOCK(m) pthread_mutex_unlock(&(m)->lock)

static int n_gdn_layers(const sn_seq *s)
{
    int n = 0;
    for (int l = 0; l < s->m->n_layers; l++)
        if (s->gdn[l].S) n++;
    return n;
}

static size_t gdn_layer_bytes(const sn_seq *s) { return (s->conv_floats + s->S_floats) * sizeof(float); }

static size_t gdn_state_bytes(const sn_seq *s) { return (size_t)n_gdn_layers(s) * gdn_layer_bytes(s); }

/* ---- pool buffers -------------------------------------------------------
 *
 * dev: a backend buffer (buf_alloc); moving bytes between it and the
 * sequence's state is a backend copy (device to device on CUDA, queued on
 * the stream like the forwards, so ordered with them and free of host
 * waits). Else host memory (malloc) and to_host / from_host. Every helper
 * below expects the model lock held. */
typedef struct {
    unsigned char *p;
    bool dev;
} pc_buf;

/* want_dev: try the backend first; host memory when it cannot (counted in
 * *fallbacks, atomically: the caller holds the model lock, not the pool's). */
static sn_status pcb_alloc(sn_model *m, bool want_dev, size_t bytes, pc_buf *b, uint64_t *fallbacks)
{
    b->p = NULL;
    b->dev = false;
    if (!bytes) bytes = 1;
    if (want_dev) {
        void *p = NULL;
        if (m->be->ops->buf_alloc(m->be, bytes, &p) == SN_OK && p) {
            b->p = p;
            b->dev = true;
            return SN_OK;
        }
        __atomic_fetch_add(fallbacks, 1, __ATOMIC_RELAXED);
    }
    b->p = malloc(bytes);
    if (!b->p) return SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory for %zu bytes", bytes);
    return SN_OK;
}

static void pcb_free(sn_model *m, pc_buf *b)
{
    if (!b->p) return;
    if (b->dev) m->be->ops->buf_free(m->be, b->p);
    else free(b->p);
    b->p = NULL;
}

/* sequence state (backend memory) -> b at off */
static sn_status pcb_put(sn_backend *be, const pc_buf *b, size_t off, const void *src, size_t n)
{
    return b->dev ? be->ops->copy(be, b->p + off, src, n) : be->ops->to_host(be, b->p + off, src, n);
}

/* b at off -> sequence state */
static sn_status pcb_get(sn_backend *be, void *dst, const pc_buf *b, size_t off, size_t n)
{
    return b->dev ? be->ops->copy(be, dst, b->p + off, n) : be->ops->from_host(be, dst, b->p + off, n);
}

/* Recurrent state of every GDN layer -> b (gdn_state_bytes). */
static sn_status gdn_save(const sn_seq *s, const pc_buf *b)
{
    sn_backend *be = s->m->be;
    size_t cb = s->conv_floats * sizeof(float), sb = s->S_floats * sizeof(float), off = 0;
    for (int l = 0; l < s->m->n_layers; l++) {
        if (!s->gdn[l].S) continue;
        if (cb) SN_TRY(pcb_put(be, b, off, s->gdn[l].conv, cb));
        off += cb;
        SN_TRY(pcb_put(be, b, off, s->gdn[l].S, sb));
        off += sb;
    }
    return SN_OK;
}

static sn_status gdn_load(sn_seq *s, const pc_buf *b)
{
    sn_backend *be = s->m->be;
    size_t cb = s->conv_floats * sizeof(float), sb = s->S_floats * sizeof(float), off = 0;
    for (int l = 0; l < s->m->n_layers; l++) {
        if (!s->gdn[l].S) continue;
        if (cb) SN_TRY(pcb_get(be, s->gdn[l].conv, b, off, cb));
        off += cb;
        SN_TRY(pcb_get(be, s->gdn[l].S, b, off, sb));
        off += sb;
    }
    return SN_OK;
}

static int n_attn_layers(const sn_seq *s)
{
    int n = 0;
    for (int l = 0; l < s->m->n_layers; l++)
        if (s->kv[l].k) n++;
    return n;
}

/* ---- batch invariance and the canonical schedule (prompt_cache.h) ------- */

/* SANCTUM_INVARIANT_ROWS: *rows 0 when unset, INT_MAX for max */
static sn_status env_invariant_rows(int *rows)
{
    *rows = 0;
    const char *e = getenv("SANCTUM_INVARIANT_ROWS");
    if (!e || !*e) return SN_OK;
    if (!strcmp(e, "max")) { *rows = INT_MAX; return SN_OK; }
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (errno || *end || v < 1 || v > (1 << 20))
        return SN_FAIL(SN_E_INVALID, "SANCTUM_INVARIANT_ROWS=%s: want an integer from 1 to 1048576, or max", e);
    *rows = (int)v;
    return SN_OK;
}

/* SANCTUM_PCACHE_MIN_FRESH and SANCTUM_PCACHE_STORE into o, each when its
 * value is one it takes (left as given otherwise); the first malformed one
 * is the error */
static sn_status env_pcache(sn_pcache_opts *o)
{
    sn_status st = SN_OK;
    const char *e = getenv("SANCTUM_PCACHE_MIN_FRESH");
    if (e && *e) {
        if (!strcmp(e, "1") || !strcmp(e, "2")) o->min_fresh = e[0] - '0';
        else st = SN_FAIL(SN_E_INVALID, "SANCTUM_PCACHE_MIN_FRESH=%s: want 1 (default) or 2", e);
    }
    e = getenv("SANCTUM_PCACHE_STORE");
    if (e && *e) {
        if (!strcmp(e, "auto")) o->store = SN_PCACHE_STORE_AUTO;
        else if (!strcmp(e, "host")) o->store = SN_PCACHE_STORE_HOST;
        else if (!strcmp(e, "backend")) o->store = SN_PCACHE_STORE_BACKEND;
        else if (st == SN_OK)
            st = SN_FAIL(SN_E_INVALID, "SANCTUM_PCACHE_STORE=%s: want auto (default), host or backend", e);
    }
    return st;
}

sn_status sn_engine_env_check(void)
{
    int rows;
    SN_TRY(env_invariant_rows(&rows));
    SN_TRY(sn_forward_env_check());
    sn_pcache_opts o = { 0 }; /* only parsed into */
    return env_pcache(&o);
}

int sn_engine_invariant_rows(const sn_model *m)
{
    int rows;
    if (env_invariant_rows(&rows) != SN_OK) {
        sn_clear_error();
        return 1; /* malformed: the safe count (sn_engine_env_check refuses it) */
    }
    if (rows) return rows;
    const char *name = m->be->ops->name;
    if (!strncmp(name, "cpu", 3)) return INT_MAX;   /* backend.h: every CPU op is batch invariant */
    /* CUDA: the GEMV (cuda_matmul.cu, GEMM from 9 rows) and the split-KV
     * decode attention (cuda_ops.cu DECODE_MAX_T) take up to 8 rows, each
     * with the bits of a one-row call; MoE below 32 rows and GatedDeltaNet
     * work per token */
    if (!strcmp(name, "cuda")) return 8;
    return 1;
}

int sn_prefill_chunk(const sn_model *m, int chunk)
{
    int step = sn_model_step_tokens(m);
    if (chunk <= 0) chunk = 512;
    return chunk < step ? chunk : step;
}

int sn_prefill_schedule(int n, int chunk, const int *bounds, int n_bounds, int *out)
{
    int first = 0, last = 0, k = 0;
    for (int i = 0; i < n_bounds; i++) {
        int b = bounds[i];
        if (b <= 0 || b >= n) continue;
        if (!first || b < first) first = b;
        if (b > last) last = b;
    }
    for (int p = 0; p < n;) {
        int next = (p / chunk + 1) * chunk;
        if (first > p && first < next) next = first;
        if (last > p && last < next) next = last;
        if (next > n) next = n;
        out[k++] = next;
        p = next;
    }
    return k;
}

static int sched_index(const int *s, int n, int pos)
{
    for (int i = 0; i < n && s[i] <= pos; i++)
        if (s[i] == pos) return i;
    return -1;
}

/* ---- pool ---------------------------------------------------------------
 *
 * Entries share their prefixes: an entry is a chain of segments, each
 * holding the KV rows [a, b) and the recurrent checkpoints in (a, b] of the
 * request that made it. A request that resumes at r from an entry takes
 * references to that entry's segments up to r and adds one segment of its
 * own, [r, n). So ten conversations over one long system prompt, or the
 * turns of one conversation, store the shared part once. Segments are
 * reference counted; the pool's bytes are those of the live segments. */

typedef struct {
    int refs;
    int a, b;                 /* KV rows [a, b) */
    pc_buf kv;                /* per attention layer: K rows [a, b) then V rows [a, b) */
    int n_ck;
    int *ck_pos;              /* ascending checkpoint positions in (a, b] (recurrent models only) */
    pc_buf *ck;               /* [n_ck], gdn_bytes each */
    size_t bytes;
    size_t dev_bytes;         /* the part of bytes in backend buffers */
} pc_seg;

typedef struct pc_entry {
    int32_t *tokens;          /* [n] the tokens whose state this entry holds */
    int n;
    pc_seg **segs;            /* [n_segs] contiguous: segs[0]->a == 0, segs[i]->a == ends[i-1] */
    int *ends;                /* rows of segs[i] this entry uses (<= segs[i]->b); ends[n_segs-1] == n */
    int n_segs;
    int *sched;               /* canonical schedule of its prompt (not batch invariant backends), else NULL */
    int n_sched;
    size_t own_bytes;         /* tokens and arrays (the segments are counted on their own) */
    struct pc_entry *prev, *next;  /* LRU list: head = most recently used */
} pc_entry;

struct sn_pcache {
    sn_model *m;
    sn_pcache_opts o;
    bool dev;                 /* keep entries in backend buffers (opts.store) */
    pthread_mutex_t lock;
    pc_entry *head, *tail;
    size_t bytes, dev_bytes;
    uint64_t n_entries, hits, misses, cached_tokens, evictions;
    uint64_t fallbacks;       /* atomic (counted under the model lock, read under neither) */
    double lookup_s, restore_s, capture_s, commit_s;
};

/* One request: the segments it resumed through (referenced), its plan and
 * the checkpoints it captured past the resume point. */
struct sn_pcache_req {
    sn_pcache *pc;
    size_t gdn_bytes;         /* 0: model without recurrent layers */
    int start;                /* resume position: rows below it live in segs */
    pc_seg **segs;            /* referenced segments covering [0, start) */
    int *ends;
    int n_segs;
    int *plan;                /* ascending positions to capture during prefill */
    int n_plan;
    int *ck_pos;              /* captured checkpoints (> start), ascending */
    pc_buf *ck;               /* [n_ck], gdn_bytes each */
    int n_ck, cap_ck;
    int *sched;               /* the prompt's canonical schedule when the backend is not batch invariant */
    int n_sched;
};

void sn_pcache_opts_default(sn_pcache_opts *o)
{
    o->budget_bytes = PC_DEFAULT_BUDGET;
    o->ckpt_every = PC_DEFAULT_EVERY;
    o->min_fresh = 1;
    o->prefill_chunk = 0;
    o->store = SN_PCACHE_STORE_AUTO;
    if (env_pcache(o) != SN_OK)
        sn_clear_error(); /* malformed values keep the defaults; sn_pcache_new refuses them */
}

sn_status sn_pcache_new(sn_model *m, const sn_pcache_opts *o, sn_pcache **out)
{
    *out = NULL;
    if (!m) return SN_FAIL(SN_E_INVALID, "prompt cache: NULL model");
    SN_TRY(sn_engine_env_check());
    sn_pcache_opts d;
    sn_pcache_opts_default(&d);
    if (!o) o = &d;
    if (o->ckpt_every < 16 || o->ckpt_every > (1 << 20))
        return SN_FAIL(SN_E_INVALID, "prompt cache: ckpt_every must be in [16, 1048576], got %d", o->ckpt_every);
    if (o->min_fresh < 1 || o->min_fresh > 2)
        return SN_FAIL(SN_E_INVALID, "prompt cache: min_fresh must be 1 or 2, got %d", o->min_fresh);
    if ((int)o->store < SN_PCACHE_STORE_AUTO || (int)o->store > SN_PCACHE_STORE_BACKEND)
        return SN_FAIL(SN_E_INVALID, "prompt cache: store must be auto, host or backend, got %d", (int)o->store);
    sn_pcache *pc = calloc(1, sizeof *pc);
    if (!pc) return SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory");
    pc->m = m;
    pc->o = *o;
    /* AUTO: the CPU backend's buffers are host memory already (its copy is
     * the memcpy to_host does); any other backend's are device memory */
    pc->dev = o->store == SN_PCACHE_STORE_BACKEND ||
              (o->store == SN_PCACHE_STORE_AUTO && strncmp(m->be->ops->name, "cpu", 3) != 0);
    pthread_mutex_init(&pc->lock, NULL);
    *out = pc;
    return SN_OK;
}

/* Under pc->lock; takes the model lock when backend buffers go (pool lock
 * then model lock, the order sn_pcache_begin uses). */
static void seg_unref(sn_pcache *pc, pc_seg *g)
{
    if (!g || --g->refs > 0) return;
    pc->bytes -= g->bytes;
    pc->dev_bytes -= g->dev_bytes;
    if (g->dev_bytes) MLOCK(pc->m);
    pcb_free(pc->m, &g->kv);
    for (int k = 0; k < g->n_ck; k++) pcb_free(pc->m, &g->ck[k]);
    if (g->dev_bytes) MUNLOCK(pc->m);
    free(g->ck_pos);
    free(g->ck);
    free(g);
}

static void entry_free(sn_pcache *pc, pc_entry *e)
{
    if (!e) return;
    for (int i = 0; i < e->n_segs; i++) seg_unref(pc, e->segs[i]);
    free(e->tokens);
    free(e->segs);
    free(e->ends);
    free(e->sched);
    free(e);
}

static void lru_unlink(sn_pcache *pc, pc_entry *e)
{
    if (e->prev) e->prev->next = e->next;
    else pc->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else pc->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(sn_pcache *pc, pc_entry *e)
{
    e->prev = NULL;
    e->next = pc->head;
    if (pc->head) pc->head->prev = e;
    pc->head = e;
    if (!pc->tail) pc->tail = e;
}

static void entry_drop(sn_pcache *pc, pc_entry *e)
{
    lru_unlink(pc, e);
    pc->bytes -= e->own_bytes;
    pc->n_entries--;
    entry_free(pc, e);
}

void sn_pcache_clear(sn_pcache *pc)
{
    if (!pc) return;
    pthread_mutex_lock(&pc->lock);
    while (pc->head) entry_drop(pc, pc->head);
    pthread_mutex_unlock(&pc->lock);
}

void sn_pcache_free(sn_pcache *pc)
{
    if (!pc) return;
    sn_pcache_clear(pc);
    pthread_mutex_destroy(&pc->lock);
    free(pc);
}

void sn_pcache_get_stats(sn_pcache *pc, sn_pcache_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!pc) return;
    pthread_mutex_lock(&pc->lock);
    out->hits = pc->hits;
    out->misses = pc->misses;
    out->cached_tokens = pc->cached_tokens;
    out->evictions = pc->evictions;
    out->entries = pc->n_entries;
    out->bytes = pc->bytes;
    out->backend_bytes = pc->dev_bytes;
    out->lookup_s = pc->lookup_s;
    out->restore_s = pc->restore_s;
    out->capture_s = pc->capture_s;
    out->commit_s = pc->commit_s;
    pthread_mutex_unlock(&pc->lock);
    out->host_fallbacks = __atomic_load_n(&pc->fallbacks, __ATOMIC_RELAXED);
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The largest checkpoint of e at or below cap (0: none). */
static int entry_ck_below(const pc_entry *e, int cap)
{
    for (int i = e->n_segs - 1; i >= 0; i--) {
        const pc_seg *g = e->segs[i];
        int lim = e->ends[i] < cap ? e->ends[i] : cap;
        for (int k = g->n_ck - 1; k >= 0; k--)
            if (g->ck_pos[k] <= lim) return g->ck_pos[k];
    }
    return 0;
}

/* Where seq could resume from e for a prompt whose common prefix with e is
 * L and which must leave at least min_fresh tokens: 0 when unusable. With
 * a schedule (sched, n_sched: the new prompt's; not batch invariant), only
 * a position that ends a forward of both schedules, with the same forwards
 * below it, and (recurrent) where e holds a checkpoint. */
static int resume_pos(const pc_entry *e, bool recurrent, int L, int limit, const int *sched, int n_sched)
{
    int cap = L < limit ? L : limit;
    if (cap > e->n) cap = e->n;
    if (cap <= 0) return 0;
    if (!sched) return recurrent ? entry_ck_below(e, cap) : cap;
    if (!e->sched) return 0;
    for (int i = e->n_sched - 1; i >= 0; i--) {
        int r = e->sched[i];
        if (r > cap) continue;
        if (sched_index(sched, n_sched, r) != i || memcmp(sched, e->sched, (size_t)(i + 1) * sizeof *sched)) continue;
        if (!recurrent || entry_ck_below(e, r) == r) return r;
    }
    return 0;
}

/* Regular checkpoints thin out geometrically: every ckpt_every tokens up to
 * 4 x ckpt_every, then two per doubling of the position (1536, 2048, 3072,
 * 4096, ... for 256). A recurrent checkpoint of a large hybrid model is
 * ~100 MB, so a long prompt keeps O(log n) of them, not n / 256. */
static bool regular_ckpt(int p, int every)
{
    if (p <= 4 * every) return true;
    int pow2 = 1;
    while (pow2 <= p / 2) pow2 *= 2;
    int spacing = pow2 / 2 > every ? pow2 / 2 : every;
    return p % spacing == 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Copies rows [g->a, b) of every attention layer of seq from segment g:
 * two copies (K, V) per layer, only the rows below the resume point. Under
 * the model lock. */
static sn_status seg_restore(sn_seq *seq, const pc_seg *g, int b)
{
    sn_backend *be = seq->m->be;
    size_t rf = seq->kv_row_floats, row = rf * sizeof(float), gb = (size_t)(g->b - g->a) * row;
    size_t nb = (size_t)(b - g->a) * row, off = 0;
    if (!nb) return SN_OK;
    for (int l = 0; l < seq->m->n_layers; l++) {
        if (!seq->kv[l].k) continue;
        SN_TRY(pcb_get(be, seq->kv[l].k + (size_t)g->a * rf, &g->kv, off, nb));
        SN_TRY(pcb_get(be, seq->kv[l].v + (size_t)g->a * rf, &g->kv, off + gb, nb));
        off += 2 * gb;
    }
    return SN_OK;
}

static const pc_buf *seg_ck(const pc_seg *g, int pos)
{
    for (int k = 0; k < g->n_ck; k++)
        if (g->ck_pos[k] == pos) return &g->ck[k];
    return NULL;
}

sn_status sn_pcache_begin(sn_pcache *pc, sn_seq *seq, const int32_t *prompt, int n_prompt, const int *bounds,
                          int n_bounds, sn_pcache_req **out, int *cached)
{
    return sn_pcache_begin_ex(pc, seq, prompt, n_prompt, bounds, n_bounds, pc ? pc->o.prefill_chunk : 0, out, cached);
}

sn_status sn_pcache_begin_ex(sn_pcache *pc, sn_seq *seq, const int32_t *prompt, int n_prompt, const int *bounds,
                             int n_bounds, int chunk, sn_pcache_req **out, int *cached)
{
    *out = NULL;
    *cached = 0;
    if (!pc || !seq || !prompt) return SN_FAIL(SN_E_INVALID, "prompt cache: NULL argument");
    if (seq->m != pc->m) return SN_FAIL(SN_E_INVALID, "prompt cache: the sequence belongs to another model");
    if (seq->pos != 0) return SN_FAIL(SN_E_INVALID, "prompt cache: the sequence is at position %d, not 0", seq->pos);
    if (n_prompt < 1) return SN_FAIL(SN_E_INVALID, "prompt cache: empty prompt");
    if (n_bounds < 0 || (n_bounds && !bounds))
        return SN_FAIL(SN_E_INVALID, "prompt cache: %d message bounds without a list", n_bounds);
    sn_status st = SN_OK;
    sn_pcache_req *r = calloc(1, sizeof *r);
    if (!r) return SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory");
    r->pc = pc;
    r->gdn_bytes = gdn_state_bytes(seq);
    bool recurrent = r->gdn_bytes > 0;
    int limit = n_prompt - pc->o.min_fresh;
    if (sn_engine_invariant_rows(pc->m) != INT_MAX) {
        int c = sn_prefill_chunk(pc->m, chunk);
        r->sched = malloc((size_t)(n_prompt / c + 3) * sizeof *r->sched);
        if (!r->sched) { st = SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory"); goto out; }
        r->n_sched = sn_prefill_schedule(n_prompt, c, bounds, n_bounds, r->sched);
    }

    /* The plan: every ckpt_every tokens, thinning out with the position
     * (regular_ckpt; multiples of 256 are where a 512-token prefill chunk
     * or its half ends), the end of the prompt (where the prefill stops
     * anyway), and of the caller's message bounds only the first and the
     * last: every other stop splits a prefill chunk, and on a CPU each
     * split costs about one more pass over the weights. The first bound is
     * where a shared system prompt ends; the last is where the newest turn
     * starts (a repeat of this prompt resumes there). */
    if (recurrent) {
        int cap = n_prompt / pc->o.ckpt_every + 4;
        r->plan = malloc((size_t)cap * sizeof *r->plan);
        if (!r->plan) { st = SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory"); goto out; }
        for (int p = pc->o.ckpt_every; p <= n_prompt; p += pc->o.ckpt_every)
            if (regular_ckpt(p, pc->o.ckpt_every)) r->plan[r->n_plan++] = p;
        int first = 0, last = 0;
        for (int i = 0; i < n_bounds; i++) {
            int b = bounds[i];
            if (b <= 0 || b > n_prompt) continue;
            if (!first || b < first) first = b;
            if (b > last) last = b;
        }
        if (first) r->plan[r->n_plan++] = first;
        if (last && last != first) r->plan[r->n_plan++] = last;
        r->plan[r->n_plan++] = n_prompt;
        qsort(r->plan, (size_t)r->n_plan, sizeof *r->plan, cmp_int);
        int k = 0;
        for (int i = 0; i < r->n_plan; i++)
            if ((!k || r->plan[k - 1] != r->plan[i]) && (!r->sched || sched_index(r->sched, r->n_sched, r->plan[i]) >= 0))
                r->plan[k++] = r->plan[i];
        r->n_plan = k;
    }

    pthread_mutex_lock(&pc->lock);
    double t0 = sn_now_s();
    pc_entry *best = NULL;
    int best_pos = 0;
    for (pc_entry *e = pc->head; e; e = e->next) {
        int pos = resume_pos(e, recurrent, lcp(e->tokens, e->n, prompt, n_prompt), limit, r->sched, r->n_sched);
        if (pos > best_pos) {  /* ties go to the more recently used (earlier in the list) */
            best = e;
            best_pos = pos;
        }
    }
    double t1 = sn_now_s();
    pc->lookup_s += t1 - t0;
    if (best) {
        /* the segments below best_pos, the last one cut there */
        int k = 0;
        while (best->ends[k] < best_pos) k++;
        r->segs = malloc((size_t)(k + 1) * sizeof *r->segs);
        r->ends = malloc((size_t)(k + 1) * sizeof *r->ends);
        if (!r->segs || !r->ends) st = SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory");
        MLOCK(seq->m);
        for (int i = 0; st == SN_OK && i <= k; i++) {
            int end = i == k ? best_pos : best->ends[i];
            st = seg_restore(seq, best->segs[i], end);
        }
        if (st == SN_OK && recurrent) {
            const pc_buf *ck = seg_ck(best->segs[k], best_pos);
            st = ck ? gdn_load(seq, ck) : SN_FAIL(SN_E_INVALID, "prompt cache: no checkpoint at %d (internal)", best_pos);
        }
        MUNLOCK(seq->m);
        pc->restore_s += sn_now_s() - t1;
        if (st == SN_OK) {
            for (int i = 0; i <= k; i++) {
                r->segs[i] = best->segs[i];
                r->segs[i]->refs++;
                r->ends[i] = i == k ? best_pos : best->ends[i];
            }
            r->n_segs = k + 1;
            r->start = best_pos;
            seq->pos = best_pos;
            lru_unlink(pc, best);
            lru_push_front(pc, best);
            pc->hits++;
            pc->cached_tokens += (uint64_t)best_pos;
        }
    } else {
        pc->misses++;
    }
    pthread_mutex_unlock(&pc->lock);
    if (st != SN_OK) {
        /* a partial restore leaves the sequence unusable: start it afresh */
        sn_seq_reset(seq);
        goto out;
    }
    *cached = seq->pos;
    *out = r;
    r = NULL;
out:
    sn_pcache_req_free(r);
    return st;
}

int sn_pcache_next_stop(const sn_pcache_req *r, int pos, int end)
{
    if (!r) return end;
    if (r->sched) {
        /* the canonical schedule: its forwards and nothing else */
        for (int i = 0; i < r->n_sched; i++)
            if (r->sched[i] > pos) return r->sched[i] < end ? r->sched[i] : end;
        return end;
    }
    for (int i = 0; i < r->n_plan; i++)
        if (r->plan[i] > pos) return r->plan[i] < end ? r->plan[i] : end;
    return end;
}

static sn_status capture_now(sn_pcache_req *r, const sn_seq *seq)
{
    if (seq->pos <= r->start || (r->n_ck && r->ck_pos[r->n_ck - 1] >= seq->pos)) return SN_OK;
    if (r->n_ck == r->cap_ck) {
        int nc = r->cap_ck ? r->cap_ck * 2 : 8;
        int *np = realloc(r->ck_pos, (size_t)nc * sizeof *np);
        if (!np) return SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory for checkpoints");
        r->ck_pos = np;
        pc_buf *nd = realloc(r->ck, (size_t)nc * sizeof *nd);
        if (!nd) return SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory for %d checkpoints", nc);
        r->ck = nd;
        r->cap_ck = nc;
    }
    sn_pcache *pc = r->pc;
    double t0 = sn_now_s();
    pc_buf b;
    MLOCK(seq->m);
    sn_status st = pcb_alloc(seq->m, pc->dev, r->gdn_bytes, &b, &pc->fallbacks);
    if (st == SN_OK && (st = gdn_save(seq, &b)) != SN_OK) pcb_free(seq->m, &b);
    MUNLOCK(seq->m);
    if (st != SN_OK) return st;
    r->ck[r->n_ck] = b;
    r->ck_pos[r->n_ck++] = seq->pos;
    double dt = sn_now_s() - t0;
    pthread_mutex_lock(&pc->lock);
    pc->capture_s += dt;
    pthread_mutex_unlock(&pc->lock);
    return SN_OK;
}

sn_status sn_pcache_capture(sn_pcache_req *r, const sn_seq *seq)
{
    if (!r || !r->gdn_bytes) return SN_OK;
    for (int i = 0; i < r->n_plan; i++)
        if (r->plan[i] == seq->pos) return capture_now(r, seq);
    return SN_OK;
}

/* True when old adds nothing once e is in: its tokens are a prefix of e's
 * and every checkpoint it offers, e offers too. */
static bool covered_by(const pc_entry *old, const pc_entry *e, bool recurrent)
{
    if (old->n > e->n || lcp(old->tokens, old->n, e->tokens, e->n) != old->n) return false;
    if (old->sched) {
        /* every position old can resume at, e offers with the same forwards below */
        for (int i = 0; i < old->n_sched; i++) {
            int p = old->sched[i];
            if (recurrent && entry_ck_below(old, p) != p) continue;
            if (!e->sched || resume_pos(e, recurrent, p, p, old->sched, i + 1) != p) return false;
        }
        return true;
    }
    if (!recurrent) return true;
    for (int i = 0; i < old->n_segs; i++) {
        const pc_seg *g = old->segs[i];
        for (int k = 0; k < g->n_ck && g->ck_pos[k] <= old->ends[i]; k++) {
            int p = g->ck_pos[k];
            if (entry_ck_below(e, p) != p) return false;
        }
    }
    return true;
}

sn_status sn_pcache_commit(sn_pcache_req *r, const sn_seq *seq, const int32_t *tokens, int n_tokens)
{
    if (!r) return SN_OK;
    sn_pcache *pc = r->pc;
    int n = seq->pos;
    if (n < 1 || pc->o.budget_bytes == 0) return SN_OK;
    if (n > n_tokens) return SN_FAIL(SN_E_INVALID, "prompt cache: the sequence is at %d but only %d tokens were given",
                                     n, n_tokens);
    if (n < r->start) return SN_FAIL(SN_E_INVALID, "prompt cache: the sequence went back below its resume point");
    bool recurrent = r->gdn_bytes > 0;
    double t_start = sn_now_s();
    {
        /* what this request adds must fit the budget on its own */
        size_t add = (size_t)n_attn_layers(seq) * 2 * (size_t)(n - r->start) * seq->kv_row_floats * sizeof(float) +
                     (size_t)(r->n_ck + 1) * r->gdn_bytes + (size_t)n * sizeof(int32_t);
        if (add > pc->o.budget_bytes) return SN_OK;
    }
    /* the end of the generation is no forward boundary of any prompt's
     * canonical schedule: no use for a checkpoint there */
    if (recurrent && !r->sched) SN_TRY(capture_now(r, seq));
    sn_status st = SN_OK;
    pc_seg *g = NULL;
    pc_entry *e = calloc(1, sizeof *e);
    if (!e) return SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory");
    int ns = r->n_segs + (n > r->start ? 1 : 0);
    e->n = n;
    e->tokens = malloc((size_t)n * sizeof(int32_t));
    e->segs = calloc((size_t)ns, sizeof *e->segs);
    e->ends = calloc((size_t)ns, sizeof *e->ends);
    if (!e->tokens || !e->segs || !e->ends) { st = SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory"); goto out; }
    memcpy(e->tokens, tokens, (size_t)n * sizeof(int32_t));
    e->own_bytes = sizeof *e + (size_t)n * sizeof(int32_t) + (size_t)ns * (sizeof *e->segs + sizeof *e->ends);
    if (r->sched) {
        /* the forwards of the prompt that lie within what the sequence holds */
        int k = 0;
        while (k < r->n_sched && r->sched[k] <= n) k++;
        e->sched = malloc((size_t)(k ? k : 1) * sizeof *e->sched);
        if (!e->sched) { st = SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory"); goto out; }
        memcpy(e->sched, r->sched, (size_t)k * sizeof *e->sched);
        e->n_sched = k;
        e->own_bytes += (size_t)k * sizeof *e->sched;
    }
    if (n > r->start) {
        /* this request's own rows and checkpoints */
        int na = n_attn_layers(seq);
        size_t rf = seq->kv_row_floats, gb = (size_t)(n - r->start) * rf * sizeof(float);
        g = calloc(1, sizeof *g);
        if (!g) { st = SN_FAIL(SN_E_NOMEM, "prompt cache: out of memory"); goto out; }
        g->refs = 1;
        g->a = r->start;
        g->b = n;
        sn_backend *be = seq->m->be;
        size_t off = 0;
        MLOCK(seq->m);
        st = pcb_alloc(seq->m, pc->dev && na, (size_t)na * 2 * gb, &g->kv, &pc->fallbacks);
        for (int l = 0; l < seq->m->n_layers && st == SN_OK; l++) {
            if (!seq->kv[l].k) continue;
            if ((st = pcb_put(be, &g->kv, off, seq->kv[l].k + (size_t)g->a * rf, gb)) != SN_OK) break;
            st = pcb_put(be, &g->kv, off + gb, seq->kv[l].v + (size_t)g->a * rf, gb);
            off += 2 * gb;
        }
        MUNLOCK(seq->m);
        if (st != SN_OK) goto out;
        int k = 0;
        while (k < r->n_ck && r->ck_pos[k] <= n) k++;
        if (k < r->n_ck) {
            /* checkpoints past the end (none today): not kept */
            MLOCK(seq->m);
            for (int i = k; i < r->n_ck; i++) pcb_free(seq->m, &r->ck[i]);
            MUNLOCK(seq->m);
        }
        g->n_ck = k;
        g->ck_pos = r->ck_pos;
        g->ck = r->ck;
        r->ck_pos = NULL;
        r->ck = NULL;
        r->n_ck = r->cap_ck = 0;
        g->bytes = sizeof *g + (size_t)na * 2 * gb + (size_t)k * (r->gdn_bytes + sizeof(int));
        g->dev_bytes = g->kv.dev ? (size_t)na * 2 * gb : 0;
        for (int i = 0; i < k; i++) g->dev_bytes += g->ck[i].dev ? r->gdn_bytes : 0;
    }
    /* the entry takes over the request's references */
    for (int i = 0; i < r->n_segs; i++) {
        e->segs[i] = r->segs[i];
        e->ends[i] = r->ends[i];
    }
    r->n_segs = 0;
    if (g) {
        e->segs[ns - 1] = g;
        e->ends[ns - 1] = n;
    }
    e->n_segs = ns;

    pthread_mutex_lock(&pc->lock);
    if (g) {
        pc->bytes += g->bytes;
        pc->dev_bytes += g->dev_bytes;
    }
    g = NULL;
    pc->bytes += e->own_bytes;
    pc->n_entries++;
    for (pc_entry *o = pc->head, *nx; o; o = nx) {
        nx = o->next;
        if (covered_by(o, e, recurrent)) entry_drop(pc, o);
    }
    /* LRU eviction; what the new entry shares with others stays counted
     * until the last entry using it goes */
    while (pc->tail && pc->bytes > pc->o.budget_bytes) {
        entry_drop(pc, pc->tail);
        pc->evictions++;
    }
    if (pc->bytes > pc->o.budget_bytes) {
        /* alone it does not fit: keep nothing */
        pc->bytes -= e->own_bytes;
        pc->n_entries--;
        entry_free(pc, e);
    } else {
        lru_push_front(pc, e);
    }
    pc->commit_s += sn_now_s() - t_start;
    pthread_mutex_unlock(&pc->lock);
    e = NULL;
out:
    if (g) {
        /* its checkpoints are still the request's */
        MLOCK(seq->m);
        pcb_free(seq->m, &g->kv);
        MUNLOCK(seq->m);
        free(g);
    }
    if (e) {
        /* not in the pool: give back the references it took over */
        pthread_mutex_lock(&pc->lock);
        entry_free(pc, e);
        pthread_mutex_unlock(&pc->lock);
    }
    return st;
}

void sn_pcache_req_free(sn_pcache_req *r)
{
    if (!r) return;
    if (r->n_segs) {
        pthread_mutex_lock(&r->pc->lock);
        for (int i = 0; i < r->n_segs; i++) seg_unref(r->pc, r->segs[i]);
        pthread_mutex_unlock(&r->pc->lock);
    }
    if (r->n_ck) {
        /* captured, never committed */
        MLOCK(r->pc->m);
        for (int i = 0; i < r->n_ck; i++) pcb_free(r->pc->m, &r->ck[i]);
        MUNLOCK(r->pc->m);
    }
    free(r->segs);
    free(r->ends);
    free(r->plan);
    free(r->ck_pos);
    free(r->ck);
    free(r->sched);
    free(r);
}

sn_status sn_pcache_prewarm(sn_pcache *pc, sn_model *m, sn_seq *seq, const int32_t *tokens, int n,
                            const int *bounds, int n_bounds)
{
    if (!pc || !m || !seq || !tokens || n < 1) return SN_FAIL(SN_E_INVALID, "prewarm: nothing to prefill");
    if (n >= sn_seq_max_ctx(seq))
        return SN_FAIL(SN_E_RANGE, "prewarm: %d tokens do not fit the context of %d", n, sn_seq_max_ctx(seq));
    sn_seq_reset(seq);
    sn_pcache_req *r = NULL;
    int cached = 0;
    SN_TRY(sn_pcache_begin(pc, seq, tokens, n, bounds, n_bounds, &r, &cached));
    sn_status st = SN_OK;
    /* (without batch invariance next_stop follows the canonical schedule) */
    int chunk = sn_model_step_tokens(m);
    for (int i = cached; i < n;) {
        int end = sn_pcache_next_stop(r, i, i + chunk < n ? i + chunk : n);
        if ((st = sn_forward(m, seq, tokens + i, end - i, NULL, false)) != SN_OK) goto out;
        if ((st = sn_pcache_capture(r, seq)) != SN_OK) goto out;
        i = end;
    }
    st = sn_pcache_commit(r, seq, tokens, n);
out:
    sn_pcache_req_free(r);
    return st;
}

/* ---- rewind ------------------------------------------------------------- */

struct sn_rewind {
    sn_model *m;
    int pos;            /* the saved (or tracked) position; -1: none */
    bool tracking;      /* pos is a tracked one (sn_rewind_track), not a saved state */
    int n_layers;
    bool *rec;          /* [n_layers] the layer has recurrent state */
    void **conv, **S;   /* [n_layers] sn_rewind_save's copies, made by its first call (PLD tracks instead) */
    size_t cb, sb;
    void **hist;        /* [n_layers] gdn history buffers of slots * (cb + sb) bytes, made on demand */
    int slots;
    /* one batch of copies (two per recurrent layer): see batch_copy */
    void **cp_dst;
    const void **cp_src;
    size_t *cp_bytes;
    int n_cp;
};

static void batch_add(sn_rewind *r, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    r->cp_dst[r->n_cp] = dst;
    r->cp_src[r->n_cp] = src;
    r->cp_bytes[r->n_cp++] = bytes;
}

/* The batch as one backend operation where the backend has copy_n (on CUDA
 * one launch instead of two per layer), else copy by copy. */
static sn_status batch_copy(sn_rewind *r)
{
    sn_backend *be = r->m->be;
    int n = r->n_cp;
    r->n_cp = 0;
    if (be->ops->copy_n) return be->ops->copy_n(be, n, r->cp_dst, r->cp_src, r->cp_bytes);
    for (int i = 0; i < n; i++) SN_TRY(be->ops->copy(be, r->cp_dst[i], r->cp_src[i], r->cp_bytes[i]));
    return SN_OK;
}

sn_status sn_rewind_new(const sn_seq *seq, sn_rewind **out)
{
    *out = NULL;
    sn_rewind *r = calloc(1, sizeof *r);
    if (!r) return SN_FAIL(SN_E_NOMEM, "rewind: out of memory");
    r->m = seq->m;
    r->pos = -1;
    r->n_layers = seq->m->n_layers;
    r->cb = seq->conv_floats * sizeof(float);
    r->sb = seq->S_floats * sizeof(float);
    r->rec = calloc((size_t)r->n_layers, sizeof *r->rec);
    r->conv = calloc((size_t)r->n_layers, sizeof *r->conv);
    r->S = calloc((size_t)r->n_layers, sizeof *r->S);
    r->hist = calloc((size_t)r->n_layers, sizeof *r->hist);
    r->cp_dst = calloc(2 * (size_t)r->n_layers, sizeof *r->cp_dst);
    r->cp_src = calloc(2 * (size_t)r->n_layers, sizeof *r->cp_src);
    r->cp_bytes = calloc(2 * (size_t)r->n_layers, sizeof *r->cp_bytes);
    sn_status st = SN_OK;
    if (!r->rec || !r->conv || !r->S || !r->hist || !r->cp_dst || !r->cp_src || !r->cp_bytes) {
        st = SN_FAIL(SN_E_NOMEM, "rewind: out of memory");
        goto out;
    }
    for (int l = 0; l < r->n_layers; l++) r->rec[l] = seq->gdn[l].S != NULL;
    *out = r;
    r = NULL;
out:
    sn_rewind_free(r);
    return st;
}

static void untrack(sn_seq *seq);

sn_status sn_rewind_of(sn_seq *seq, sn_rewind **out)
{
    *out = NULL;
    if (!seq->rw) SN_TRY(sn_rewind_new(seq, &seq->rw));
    seq->rw->pos = -1;
    seq->rw->tracking = false;
    untrack(seq); /* whatever an earlier user armed ends with it */
    *out = seq->rw;
    return SN_OK;
}

static void hist_free_locked(sn_rewind *r)
{
    sn_backend *be = r->m->be;
    for (int l = 0; r->hist && l < r->n_layers; l++) {
        if (r->hist[l]) be->ops->buf_free(be, r->hist[l]);
        r->hist[l] = NULL;
    }
    r->slots = 0;
}

void sn_rewind_free(sn_rewind *r)
{
    if (!r) return;
    sn_backend *be = r->m->be;
    MLOCK(r->m);
    for (int l = 0; l < r->n_layers; l++) {
        if (r->conv && r->conv[l]) be->ops->buf_free(be, r->conv[l]);
        if (r->S && r->S[l]) be->ops->buf_free(be, r->S[l]);
    }
    hist_free_locked(r);
    MUNLOCK(r->m);
    free(r->rec);
    free(r->conv);
    free(r->S);
    free(r->hist);
    free(r->cp_dst);
    free(r->cp_src);
    free(r->cp_bytes);
    free(r);
}

sn_status sn_rewind_save(sn_rewind *r, const sn_seq *seq)
{
    if (seq->m != r->m) return SN_FAIL(SN_E_INVALID, "rewind: the sequence belongs to another model");
    sn_status st = SN_OK;
    sn_backend *be = r->m->be;
    MLOCK(r->m);
    for (int l = 0; l < r->n_layers && st == SN_OK; l++) {
        if (!r->rec[l]) continue;
        if (!r->conv[l] && (st = be->ops->buf_alloc(be, r->cb ? r->cb : 4, &r->conv[l])) != SN_OK) break;
        if (!r->S[l] && (st = be->ops->buf_alloc(be, r->sb, &r->S[l])) != SN_OK) break;
        batch_add(r, r->conv[l], seq->gdn[l].conv, r->cb);
        batch_add(r, r->S[l], seq->gdn[l].S, r->sb);
    }
    if (st == SN_OK) st = batch_copy(r);
    r->n_cp = 0;
    MUNLOCK(r->m);
    r->tracking = false;
    r->pos = st == SN_OK ? seq->pos : -1;
    return st;
}

/* History buffers for tracked forwards of up to rows tokens, grown (never
 * shrunk) under the model lock. */
static sn_status hist_reserve_locked(sn_rewind *r, int rows)
{
    if (r->slots >= rows - 1) return SN_OK;
    sn_backend *be = r->m->be;
    sn_status st = SN_OK;
    hist_free_locked(r);
    size_t bytes = (size_t)(rows - 1) * (r->cb + r->sb);
    for (int l = 0; l < r->n_layers && st == SN_OK; l++)
        if (r->rec[l]) st = be->ops->buf_alloc(be, bytes, &r->hist[l]);
    if (st == SN_OK) r->slots = rows - 1;
    else hist_free_locked(r);
    return st;
}

static sn_status rows_check(const sn_rewind *r, const sn_seq *seq, int rows)
{
    if (seq->m != r->m) return SN_FAIL(SN_E_INVALID, "rewind: the sequence belongs to another model");
    if (rows < 1 || rows > SN_STEP_TOKENS)
        return SN_FAIL(SN_E_INVALID, "rewind: tracking a forward of %d rows (1..%d)", rows, SN_STEP_TOKENS);
    if (sn_rewind_has_state(r) && seq->conv_floats + seq->S_floats != sn_gdn_hist_floats(&r->m->gdn))
        return SN_FAIL(SN_E_INVALID, "rewind: the sequence's gdn state is not the backend's history slot");
    return SN_OK;
}

sn_status sn_rewind_reserve(sn_rewind *r, const sn_seq *seq, int rows)
{
    SN_TRY(rows_check(r, seq, rows));
    if (!sn_rewind_has_state(r)) return SN_OK;
    MLOCK(r->m);
    sn_status st = hist_reserve_locked(r, rows);
    MUNLOCK(r->m);
    return st;
}

sn_status sn_rewind_track(sn_rewind *r, sn_seq *seq, int rows)
{
    SN_TRY(rows_check(r, seq, rows));
    r->pos = seq->pos;
    r->tracking = true;
    if (!sn_rewind_has_state(r)) return SN_OK; /* a KV cut needs no history */
    MLOCK(r->m);
    sn_status st = hist_reserve_locked(r, rows);
    if (st == SN_OK) {
        for (int l = 0; l < r->n_layers; l++) {
            if (!r->rec[l]) continue;
            seq->gdn[l].hist = r->hist[l];
            seq->gdn[l].n_hist = rows - 1;
        }
        seq->hist_armed = true;
        seq->hist_from = -1;
        seq->hist_valid = 0;
    }
    MUNLOCK(r->m);
    if (st != SN_OK) {
        r->pos = -1;
        r->tracking = false;
    }
    return st;
}

static void untrack(sn_seq *seq)
{
    for (int l = 0; l < seq->m->n_layers; l++) {
        seq->gdn[l].hist = NULL;
        seq->gdn[l].n_hist = 0;
    }
    seq->hist_armed = false;
}

sn_status sn_rewind_restore(sn_rewind *r, sn_seq *seq, int pos)
{
    if (seq->m != r->m) return SN_FAIL(SN_E_INVALID, "rewind: the sequence belongs to another model");
    if (r->pos < 0) return SN_FAIL(SN_E_INVALID, "rewind: nothing saved");
    const bool tracking = r->tracking, recurrent = sn_rewind_has_state(r);
    int from = r->pos;
    if (tracking) {
        untrack(seq); /* whatever happens next, the tracking ends here */
        r->tracking = false;
        r->pos = -1;
        if (recurrent && seq->hist_from != from)
            return SN_FAIL(SN_E_INVALID, "rewind: no forward ran from the tracked position %d", from);
    }
    if (pos < from || pos > seq->pos)
        return SN_FAIL(SN_E_INVALID, "rewind: position %d is outside [saved %d, current %d]", pos, from, seq->pos);
    if (!recurrent || pos == seq->pos) {
        seq->pos = pos;
        return SN_OK;
    }
    int slot = pos - from - 1; /* tracked: the state after token `slot` of that forward */
    if (tracking && (slot < 0 || slot >= seq->hist_valid))
        return SN_FAIL(SN_E_INVALID, "rewind: the tracked forward from %d recorded states at %d..%d, not %d", from,
                       from + 1, from + seq->hist_valid, pos);
    if (!tracking && pos != r->pos)
        return SN_FAIL(SN_E_INVALID, "rewind: recurrent state exists only at the saved position %d, not %d", r->pos, pos);
    sn_status st = SN_OK;
    MLOCK(r->m);
    for (int l = 0; l < r->n_layers; l++) {
        if (!r->rec[l]) continue;
        const char *cv = tracking ? (const char *)r->hist[l] + (size_t)slot * (r->cb + r->sb) : r->conv[l];
        const char *sv = tracking ? cv + r->cb : r->S[l];
        batch_add(r, seq->gdn[l].conv, cv, r->cb);
        batch_add(r, seq->gdn[l].S, sv, r->sb);
    }
    st = batch_copy(r);
    MUNLOCK(r->m);
    if (st == SN_OK) seq->pos = pos;
    return st;
}

int sn_rewind_pos(const sn_rewind *r) { return r->pos; }

int sn_rewind_has_state(const sn_rewind *r)
{
    for (int l = 0; l < r->n_layers; l++)
        if (r->rec[l]) return 1;
    return 0;
}
