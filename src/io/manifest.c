/* SHA-256 weight manifests with detached ed25519 signatures (contract in
 * include/sanctum/manifest.h).
 *
 * The gate is the first thing that touches a model directory: a tampered or
 * substituted weight must be refused before the loader maps a single byte of
 * it, and the signature is checked before any hashing so that an attacker
 * cannot make us spend minutes hashing an untrusted list. */
#include "sanctum/manifest.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "sanctum/clock.h"

#define HASH_BUF_BYTES (1u << 20)   /* per-thread streaming buffer */
#define MAX_PATH_BYTES 4096
#define MAX_DIR_DEPTH 8
#define MAX_THREADS 64

/* The OpenSSL error queue as one line (drained), or `fallback` when empty:
 * callers put it in messages so an operator sees the library's own reason. */
static const char *ossl_reason(char *buf, size_t cap, const char *fallback)
{
    unsigned long e = ERR_get_error();
    if (!e) {
        snprintf(buf, cap, "%s", fallback);
        return buf;
    }
    ERR_error_string_n(e, buf, cap);
    ERR_clear_error();
    return buf;
}

/* ------------------------------------------------------------------ files */

sn_status sn_manifest_read_file(const char *path, size_t max_bytes, unsigned char **out, size_t *len)
{
    sn_status st = SN_OK;
    unsigned char *buf = NULL;
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return SN_FAIL(errno == ENOENT ? SN_E_MISSING : SN_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = SN_FAIL(SN_E_IO, "%s: stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = SN_FAIL(SN_E_INVALID, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        st = SN_FAIL(SN_E_RANGE, "%s: %lld bytes, more than the %zu allowed", path, (long long)sb.st_size,
                     max_bytes);
        goto out;
    }
    size_t want = (size_t)sb.st_size, have = 0;
    buf = malloc(want + 1);
    if (!buf) {
        st = SN_FAIL(SN_E_NOMEM, "%s: cannot allocate %zu bytes", path, want + 1);
        goto out;
    }
    /* Read to EOF rather than trusting st_size: the file may change under us,
     * and a file that grew past the cap is refused rather than truncated. */
    for (;;) {
        if (have == want) {
            unsigned char extra;
            ssize_t r = read(fd, &extra, 1);
            if (r == 0)
                break;
            if (r < 0 && errno == EINTR)
                continue;
            st = r < 0 ? SN_FAIL(SN_E_IO, "%s: read: %s", path, strerror(errno))
                       : SN_FAIL(SN_E_IO, "%s: file grew while being read", path);
            goto out;
        }
        ssize_t r = read(fd, buf + have, want - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = SN_FAIL(SN_E_IO, "%s: read: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        have += (size_t)r;
    }
    buf[have] = 0;
    *out = buf;
    *len = have;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return st;
}

static sn_status sha256_fd(int fd, const char *path, unsigned char *buf, size_t cap,
                           const atomic_int *stop, _Atomic uint64_t *progress,
                           unsigned char out[32], uint64_t *bytes)
{
    sn_status st = SN_OK;
    char why[256];
    uint64_t total = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return SN_FAIL(SN_E_NOMEM, "%s: EVP_MD_CTX_new failed", path);
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = SN_FAIL(SN_E_BACKEND, "%s: SHA-256 init: %s", path, ossl_reason(why, sizeof why, "unknown"));
        goto out;
    }
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    for (;;) {
        if (stop && atomic_load_explicit(stop, memory_order_relaxed)) {
            st = SN_E_CANCELLED;
            goto out;
        }
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = SN_FAIL(SN_E_IO, "%s: read at byte %llu: %s", path, (unsigned long long)total, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)r) != 1) {
            st = SN_FAIL(SN_E_BACKEND, "%s: SHA-256 update: %s", path, ossl_reason(why, sizeof why, "unknown"));
            goto out;
        }
        total += (uint64_t)r;
        if (progress)
            atomic_fetch_add_explicit(progress, (uint64_t)r, memory_order_relaxed);
    }
    if (EVP_DigestFinal_ex(ctx, out, NULL) != 1) {
        st = SN_FAIL(SN_E_BACKEND, "%s: SHA-256 final: %s", path, ossl_reason(why, sizeof why, "unknown"));
        goto out;
    }
    if (bytes)
        *bytes = total;
out:
    EVP_MD_CTX_free(ctx);
    return st;
}

static sn_status open_regular(const char *path, int *fd_out, struct stat *sb_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return SN_FAIL(SN_E_MISSING, "%s: listed in the manifest but missing", path);
        return SN_FAIL(SN_E_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return SN_FAIL(SN_E_INVALID, "%s: not a regular file", path);
    }
    *fd_out = fd;
    if (sb_out)
        *sb_out = sb;
    return SN_OK;
}

/* Same file, same content generation: inode identity plus size and both
 * timestamps (ctime cannot be set back by an unprivileged writer). */
static int same_file_state(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

sn_status sn_sha256_file(const char *path, unsigned char out[32], uint64_t *bytes)
{
    int fd = -1;
    SN_TRY(open_regular(path, &fd, NULL));
    unsigned char *buf = malloc(HASH_BUF_BYTES);
    if (!buf) {
        close(fd);
        return SN_FAIL(SN_E_NOMEM, "%s: cannot allocate the hash buffer", path);
    }
    sn_status st = sha256_fd(fd, path, buf, HASH_BUF_BYTES, NULL, NULL, out, bytes);
    free(buf);
    close(fd);
    return st;
}

/* ------------------------------------------------------------------ parse */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Check one relative path and write its normal form (leading "./" dropped)
 * to out. Returns NULL when fine, else the reason. The rules close every way
 * a manifest line could name a file outside the model directory. */
static const char *check_rel_path(const char *p, size_t n, char *out)
{
    if (n == 0)
        return "empty path";
    if (n >= MAX_PATH_BYTES)
        return "path too long";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f)
            return "control character in path";
        if (c == '\\')
            return "backslash in path";
    }
    if (p[0] == '/')
        return "absolute path";
    while (n >= 2 && p[0] == '.' && p[1] == '/') {
        p += 2;
        n -= 2;
        while (n && p[0] == '/') {   /* ".//x" */
            p++;
            n--;
        }
    }
    if (n == 0)
        return "path names the model directory itself";
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '/')
            continue;
        size_t clen = i - start;
        if (clen == 0)
            return "empty path component";
        if (clen == 1 && p[start] == '.')
            return "'.' path component";
        if (clen == 2 && p[start] == '.' && p[start + 1] == '.')
            return "'..' path component";
        start = i + 1;
    }
    memcpy(out, p, n);
    out[n] = 0;
    return NULL;
}

static int cmp_entry_path(const void *a, const void *b)
{
    const sn_manifest_entry *x = a, *y = b;
    return strcmp(x->path, y->path);
}

void sn_manifest_free(sn_manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        free(m->entries[i].path);
    free(m->entries);
    free(m);
}

sn_status sn_manifest_parse(const char *buf, size_t len, const char *name, sn_manifest **out)
{
    sn_status st = SN_OK;
    sn_manifest *m = NULL;
    sn_manifest_entry *sorted = NULL;
    char *norm = NULL;
    size_t cap = 0;
    *out = NULL;
    if (!name)
        name = "manifest";
    if (len > SN_MANIFEST_MAX_BYTES)
        return SN_FAIL(SN_E_RANGE, "%s: %zu bytes, more than the %u allowed", name, len, SN_MANIFEST_MAX_BYTES);
    m = calloc(1, sizeof *m);
    norm = malloc(MAX_PATH_BYTES);
    if (!m || !norm) {
        st = SN_FAIL(SN_E_NOMEM, "%s: out of memory", name);
        goto out;
    }
    size_t pos = 0;
    int line = 0;
    while (pos < len) {
        line++;
        const char *l = buf + pos;
        const char *nl = memchr(l, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - l) : len - pos;
        pos += n + (nl ? 1 : 0);
        if (n && l[n - 1] == '\r')   /* a manifest that went through a CRLF editor */
            n--;
        if (memchr(l, 0, n)) {
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: NUL byte", name, line);
            goto out;
        }
        if (n == 0) {
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: blank line", name, line);
            goto out;
        }
        if (l[0] == '\\') {
            /* sha256sum's escaped form for names holding '\n' or '\\': such
             * names are refused anyway, so say so precisely. */
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: escaped file name (backslash or newline in a path) is not allowed",
                         name, line);
            goto out;
        }
        if (n < 66) {
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: expected '<64 hex digits>  <path>'", name, line);
            goto out;
        }
        unsigned char digest[32];
        for (int i = 0; i < 32; i++) {
            int hi = hexval((unsigned char)l[2 * i]), lo = hexval((unsigned char)l[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                st = SN_FAIL(SN_E_FORMAT, "%s:%d: column %d: SHA-256 must be 64 hex digits", name, line,
                             2 * i + (hi < 0 ? 1 : 2));
                goto out;
            }
            digest[i] = (unsigned char)(hi << 4 | lo);
        }
        if (l[64] != ' ' || (l[65] != ' ' && l[65] != '*')) {
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: column 65: expected two spaces or ' *' after the 64-digit hash",
                         name, line);
            goto out;
        }
        const char *why = check_rel_path(l + 66, n - 66, norm);
        if (why) {
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: %s: '%.*s'", name, line, why, (int)(n - 66 > 200 ? 200 : n - 66),
                         l + 66);
            goto out;
        }
        if (m->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            sn_manifest_entry *ne = realloc(m->entries, nc * sizeof *ne);
            if (!ne) {
                st = SN_FAIL(SN_E_NOMEM, "%s: out of memory", name);
                goto out;
            }
            m->entries = ne;
            cap = nc;
        }
        sn_manifest_entry *e = &m->entries[m->n];
        e->path = strdup(norm);
        if (!e->path) {
            st = SN_FAIL(SN_E_NOMEM, "%s: out of memory", name);
            goto out;
        }
        memcpy(e->sha256, digest, 32);
        e->line = line;
        m->n++;
    }
    if (m->n == 0) {
        st = SN_FAIL(SN_E_FORMAT, "%s: no entries", name);
        goto out;
    }
    /* Duplicates: two lines for one file could carry two different hashes,
     * and which one "wins" must never be a question. */
    sorted = malloc(m->n * sizeof *sorted);
    if (!sorted) {
        st = SN_FAIL(SN_E_NOMEM, "%s: out of memory", name);
        goto out;
    }
    memcpy(sorted, m->entries, m->n * sizeof *sorted);
    qsort(sorted, m->n, sizeof *sorted, cmp_entry_path);
    for (size_t i = 1; i < m->n; i++) {
        if (strcmp(sorted[i - 1].path, sorted[i].path) == 0) {
            int a = sorted[i - 1].line, b = sorted[i].line;
            st = SN_FAIL(SN_E_FORMAT, "%s:%d: duplicate entry for '%s' (also line %d)", name, a > b ? a : b,
                         sorted[i].path, a > b ? b : a);
            goto out;
        }
    }
    *out = m;
    m = NULL;
out:
    free(sorted);
    free(norm);
    sn_manifest_free(m);
    return st;
}

/* ------------------------------------------------------- weight file rule */

int sn_manifest_is_weight_file(const char *rel)
{
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    static const char *const exact[] = {
        "config.json",          "tokenizer.json",        "tokenizer_config.json", "generation_config.json",
        "special_tokens_map.json", "chat_template.jinja", "chat_template.json",    "tekken.json",
        "params.json",
    };
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strcmp(base, exact[i]) == 0)
            return 1;
    static const char *const suffix[] = { ".safetensors", ".safetensors.index.json" };
    size_t bl = strlen(base);
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        size_t sl = strlen(suffix[i]);
        if (bl >= sl && strcmp(base + bl - sl, suffix[i]) == 0)
            return 1;
    }
    return 0;
}

/* Collect the relative paths of weight files under dir (recursively, not
 * following directory symlinks so that a link loop cannot hang startup). */
typedef struct path_list {
    char **v;
    size_t n, cap;
} path_list;

static void path_list_free(path_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static sn_status path_list_push(path_list *l, const char *s)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        char **nv = realloc(l->v, nc * sizeof *nv);
        if (!nv)
            return SN_FAIL(SN_E_NOMEM, "out of memory listing the model directory");
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n] = strdup(s);
    if (!l->v[l->n])
        return SN_FAIL(SN_E_NOMEM, "out of memory listing the model directory");
    l->n++;
    return SN_OK;
}

static sn_status walk_weights(const char *root, const char *rel, int depth, path_list *out)
{
    sn_status st = SN_OK;
    char full[MAX_PATH_BYTES], child[MAX_PATH_BYTES];
    if ((size_t)snprintf(full, sizeof full, "%s%s%s", root, *rel ? "/" : "", rel) >= sizeof full)
        return SN_FAIL(SN_E_RANGE, "%s/%s: path too long", root, rel);
    DIR *d = opendir(full);
    if (!d)
        return SN_FAIL(errno == ENOENT ? SN_E_MISSING : SN_E_IO, "%s: cannot open directory: %s", full,
                       strerror(errno));
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if ((size_t)snprintf(child, sizeof child, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >= sizeof child) {
            st = SN_FAIL(SN_E_RANGE, "%s/%s: path too long", full, de->d_name);
            goto out;
        }
        struct stat lsb, sb;
        char cfull[MAX_PATH_BYTES];
        if ((size_t)snprintf(cfull, sizeof cfull, "%s/%s", root, child) >= sizeof cfull) {
            st = SN_FAIL(SN_E_RANGE, "%s/%s: path too long", root, child);
            goto out;
        }
        if (lstat(cfull, &lsb) != 0)
            continue;   /* vanished between readdir and lstat */
        if (S_ISDIR(lsb.st_mode)) {
            if (depth + 1 > MAX_DIR_DEPTH) {
                st = SN_FAIL(SN_E_RANGE, "%s: directories nested deeper than %d", cfull, MAX_DIR_DEPTH);
                goto out;
            }
            st = walk_weights(root, child, depth + 1, out);
            if (st != SN_OK)
                goto out;
            continue;
        }
        if (!sn_manifest_is_weight_file(child))
            continue;
        /* A symlinked weight (the Hugging Face cache layout) counts; the
         * hash covers what it points to. A dangling one is still a weight
         * name the loader might try, so it must be listed too. */
        if (S_ISLNK(lsb.st_mode) && stat(cfull, &sb) == 0 && S_ISDIR(sb.st_mode))
            continue;
        st = path_list_push(out, child);
        if (st != SN_OK)
            goto out;
    }
out:
    closedir(d);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ------------------------------------------------------- parallel hashing */

typedef struct hash_job {
    const char *rel;          /* path relative to root */
    const unsigned char *want; /* expected digest or NULL (create) */
    unsigned char got[32];
    uint64_t size_hint;       /* for scheduling: biggest first */
    uint64_t bytes;
    struct stat sb;           /* state of the file that was hashed */
    sn_status st;
    char msg[512];
} hash_job;

typedef struct hash_pool {
    const char *root;
    hash_job **order;         /* jobs sorted by size, descending */
    size_t n;
    atomic_size_t next;
    atomic_size_t done;
    atomic_int stop;
    _Atomic uint64_t progress;
} hash_pool;

static void *hash_worker(void *arg)
{
    hash_pool *p = arg;
    unsigned char *buf = malloc(HASH_BUF_BYTES);
    char full[MAX_PATH_BYTES];
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            break;
        hash_job *j = p->order[i];
        if (!buf) {
            j->st = SN_FAIL(SN_E_NOMEM, "cannot allocate the hash buffer");
        } else if (atomic_load(&p->stop)) {
            j->st = SN_E_CANCELLED;
        } else if ((size_t)snprintf(full, sizeof full, "%s/%s", p->root, j->rel) >= sizeof full) {
            j->st = SN_FAIL(SN_E_RANGE, "%s/%s: path too long", p->root, j->rel);
        } else {
            int fd = -1;
            j->st = open_regular(full, &fd, &j->sb);
            if (j->st == SN_OK) {
                j->st = sha256_fd(fd, full, buf, HASH_BUF_BYTES, &p->stop, &p->progress, j->got, &j->bytes);
                /* A file written to while we read it has no single digest. */
                struct stat after;
                if (j->st == SN_OK && (fstat(fd, &after) != 0 || !same_file_state(&j->sb, &after) ||
                                       (uint64_t)after.st_size != j->bytes))
                    j->st = SN_FAIL(SN_E_VERIFY, "%s: changed while it was being hashed", full);
                close(fd);
            }
            if (j->st == SN_OK && j->want && memcmp(j->got, j->want, 32) != 0)
                j->st = SN_FAIL(SN_E_VERIFY, "%s: SHA-256 mismatch (file differs from the manifest)", full);
        }
        if (j->st != SN_OK && j->st != SN_E_CANCELLED) {
            snprintf(j->msg, sizeof j->msg, "%s", sn_errmsg());
            atomic_store(&p->stop, 1);   /* fail fast: no point hashing on */
        }
        atomic_fetch_add(&p->done, 1);
    }
    free(buf);
    return NULL;
}

static int cmp_job_size_desc(const void *a, const void *b)
{
    const hash_job *x = *(hash_job *const *)a, *y = *(hash_job *const *)b;
    return x->size_hint < y->size_hint ? 1 : x->size_hint > y->size_hint ? -1 : 0;
}

static int default_threads(int want, size_t n_jobs)
{
    long t = want > 0 ? want : sysconf(_SC_NPROCESSORS_ONLN);
    if (t < 1)
        t = 1;
    if (t > MAX_THREADS)
        t = MAX_THREADS;
    if ((size_t)t > n_jobs)
        t = (long)(n_jobs ? n_jobs : 1);
    return (int)t;
}

/* Hash all jobs; on failure returns the failure of the first job in the
 * caller's order (deterministic message whatever the thread timing). */
static sn_status hash_jobs(const char *root, hash_job *jobs, size_t n, int n_threads, int show_progress,
                           uint64_t *bytes_total)
{
    sn_status st = SN_OK;
    hash_pool p = { .root = root, .n = n };
    pthread_t tid[MAX_THREADS];
    int started = 0;
    atomic_init(&p.next, 0);
    atomic_init(&p.done, 0);
    atomic_init(&p.stop, 0);
    atomic_init(&p.progress, 0);
    p.order = malloc((n ? n : 1) * sizeof *p.order);
    if (!p.order)
        return SN_FAIL(SN_E_NOMEM, "out of memory");
    uint64_t total_hint = 0;
    char full[MAX_PATH_BYTES];
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        jobs[i].st = SN_OK;
        jobs[i].msg[0] = 0;
        jobs[i].bytes = 0;
        snprintf(full, sizeof full, "%s/%s", root, jobs[i].rel);
        jobs[i].size_hint = stat(full, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        total_hint += jobs[i].size_hint;
        p.order[i] = &jobs[i];
    }
    /* Largest first so one big shard does not start last and serialise the tail. */
    qsort(p.order, n, sizeof *p.order, cmp_job_size_desc);
    int nt = default_threads(n_threads, n);
    for (int t = 0; t < nt; t++) {
        if (pthread_create(&tid[t], NULL, hash_worker, &p) != 0)
            break;
        started++;
    }
    if (started == 0)
        hash_worker(&p);   /* no thread could start: hash on this one */
    /* Progress: a live line on a terminal (1), a log line every ~10 s
     * otherwise (2), so a long verify of a big model is never silent. */
    if (show_progress) {
        int ticks = 0;
        while (atomic_load(&p.done) < n) {
            struct timespec ts = { 0, 200 * 1000 * 1000 };
            nanosleep(&ts, NULL);
            uint64_t b = atomic_load(&p.progress);
            ticks++;
            if (show_progress == 1)
                fprintf(stderr, "\rmanifest: hashed %.2f / %.2f GB (%zu/%zu files)", (double)b / 1e9,
                        (double)total_hint / 1e9, atomic_load(&p.done), n);
            else if (ticks % 50 == 0)
                fprintf(stderr, "manifest: hashed %.2f / %.2f GB (%zu/%zu files)\n", (double)b / 1e9,
                        (double)total_hint / 1e9, atomic_load(&p.done), n);
        }
        if (show_progress == 1)
            fputc('\n', stderr);
    }
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += jobs[i].bytes;
        if (jobs[i].st != SN_OK && jobs[i].st != SN_E_CANCELLED && st == SN_OK)
            st = sn_fail_at(jobs[i].st, __FILE__, __LINE__, "%s", jobs[i].msg);
    }
    if (bytes_total)
        *bytes_total = total;
    free(p.order);
    return st;
}

/* ----------------------------------------------------------------- create */

sn_status sn_manifest_create(const char *model_dir, int n_threads, char **text, size_t *len)
{
    sn_status st = SN_OK;
    path_list files = { 0 };
    hash_job *jobs = NULL;
    char *buf = NULL;
    *text = NULL;
    *len = 0;
    st = walk_weights(model_dir, "", 0, &files);
    if (st != SN_OK)
        goto out;
    if (files.n == 0) {
        st = SN_FAIL(SN_E_MISSING, "%s: no weight files (*.safetensors, config.json, tokenizer.json, ...)",
                     model_dir);
        goto out;
    }
    qsort(files.v, files.n, sizeof *files.v, cmp_str);
    char norm[MAX_PATH_BYTES];
    for (size_t i = 0; i < files.n; i++) {
        /* Never write a line our own parser would refuse. */
        const char *why = check_rel_path(files.v[i], strlen(files.v[i]), norm);
        if (why) {
            st = SN_FAIL(SN_E_INVALID, "%s/%s: cannot be listed: %s", model_dir, files.v[i], why);
            goto out;
        }
    }
    jobs = calloc(files.n, sizeof *jobs);
    if (!jobs) {
        st = SN_FAIL(SN_E_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < files.n; i++)
        jobs[i].rel = files.v[i];
    st = hash_jobs(model_dir, jobs, files.n, n_threads, 0, NULL);
    if (st != SN_OK)
        goto out;
    size_t cap = 0;
    for (size_t i = 0; i < files.n; i++)
        cap += 64 + 2 + strlen(files.v[i]) + 1;
    buf = malloc(cap + 1);
    if (!buf) {
        st = SN_FAIL(SN_E_NOMEM, "out of memory");
        goto out;
    }
    size_t off = 0;
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < files.n; i++) {
        for (int k = 0; k < 32; k++) {
            buf[off++] = hx[jobs[i].got[k] >> 4];
            buf[off++] = hx[jobs[i].got[k] & 15];
        }
        buf[off++] = ' ';
        buf[off++] = ' ';
        size_t pl = strlen(files.v[i]);
        memcpy(buf + off, files.v[i], pl);
        off += pl;
        buf[off++] = '\n';
    }
    buf[off] = 0;
    *text = buf;
    *len = off;
    buf = NULL;
out:
    free(buf);
    free(jobs);
    path_list_free(&files);
    return st;
}

/* ----------------------------------------------------------------- verify */

struct sn_manifest_pins {
    sn_manifest_entry *v;     /* path + digest, sorted by path */
    struct stat *sb;          /* [n] state of each file as hashed */
    size_t n;
};

void sn_manifest_pins_free(sn_manifest_pins *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i].path);
    free(p->v);
    free(p->sb);
    free(p);
}

static sn_status pins_from_jobs(const hash_job *jobs, size_t n, sn_manifest_pins **out)
{
    sn_manifest_pins *p = calloc(1, sizeof *p);
    if (!p)
        return SN_FAIL(SN_E_NOMEM, "out of memory");
    p->v = calloc(n ? n : 1, sizeof *p->v);
    p->sb = calloc(n ? n : 1, sizeof *p->sb);
    if (!p->v || !p->sb) {
        sn_manifest_pins_free(p);
        return SN_FAIL(SN_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++, p->n++) {
        p->v[i].path = strdup(jobs[i].rel);
        if (!p->v[i].path) {
            sn_manifest_pins_free(p);
            return SN_FAIL(SN_E_NOMEM, "out of memory");
        }
        memcpy(p->v[i].sha256, jobs[i].got, 32);
        p->v[i].line = (int)i;   /* index into sb until sorted */
    }
    qsort(p->v, p->n, sizeof *p->v, cmp_entry_path);
    /* Re-order sb to follow the sorted paths. */
    struct stat *sorted = calloc(n ? n : 1, sizeof *sorted);
    if (!sorted) {
        sn_manifest_pins_free(p);
        return SN_FAIL(SN_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < p->n; i++) {
        sorted[i] = jobs[p->v[i].line].sb;
        p->v[i].line = 0;
    }
    free(p->sb);
    p->sb = sorted;
    *out = p;
    return SN_OK;
}

/* The pin of rel (normalised into norm), or NULL with *st set: SN_E_INVALID
 * for a path the manifest could never list, SN_OK when merely not pinned. */
static const struct stat *pin_find(const sn_manifest_pins *p, const char *rel, char norm[MAX_PATH_BYTES],
                                   sn_status *st)
{
    *st = SN_OK;
    const char *why = check_rel_path(rel, strlen(rel), norm);
    if (why) {
        *st = SN_FAIL(SN_E_INVALID, "%s: %s", rel, why);
        return NULL;
    }
    sn_manifest_entry key = { .path = norm };
    const sn_manifest_entry *e = bsearch(&key, p->v, p->n, sizeof *p->v, cmp_entry_path);
    return e ? &p->sb[e - p->v] : NULL;
}

sn_status sn_manifest_pins_check_fd(const sn_manifest_pins *p, const char *rel, int fd)
{
    char norm[MAX_PATH_BYTES];
    if (!p || !rel)
        return SN_FAIL(SN_E_INVALID, "sn_manifest_pins_check_fd: NULL argument");
    sn_status st;
    const struct stat *pin = pin_find(p, rel, norm, &st);
    if (st != SN_OK)
        return st;
    if (!pin)
        return SN_FAIL(SN_E_VERIFY, "%s: not verified by the manifest", norm);
    struct stat now;
    if (fstat(fd, &now) != 0)
        return SN_FAIL(SN_E_IO, "%s: fstat: %s", norm, strerror(errno));
    if (!same_file_state(pin, &now))
        return SN_FAIL(SN_E_VERIFY,
                       "model file %s changed after the manifest was verified (not the file the gate hashed: "
                       "replaced, or written to since)", norm);
    return SN_OK;
}

sn_status sn_manifest_pins_open(const sn_manifest_pins *p, const char *model_dir, const char *rel, int *fd_out)
{
    char norm[MAX_PATH_BYTES], full[MAX_PATH_BYTES];
    if (!p || !model_dir || !rel || !fd_out)
        return SN_FAIL(SN_E_INVALID, "sn_manifest_pins_open: NULL argument");
    *fd_out = -1;
    sn_status st;
    const struct stat *pin = pin_find(p, rel, norm, &st);
    if (st != SN_OK)
        return st;
    if ((size_t)snprintf(full, sizeof full, "%s/%s", model_dir, norm) >= sizeof full)
        return SN_FAIL(SN_E_RANGE, "%s/%s: path too long", model_dir, norm);
    /* O_NONBLOCK: a FIFO put in the file's place must not hang the load
     * before fstat shows it is not the pinned regular file. */
    int fd = open(full, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if ((e == ENOENT || e == ENOTDIR) && pin)
            return SN_FAIL(SN_E_VERIFY, "model file %s changed after the manifest was verified (verified, now gone)",
                           norm);
        if (e == ENOENT || e == ENOTDIR)
            return SN_FAIL(SN_E_MISSING, "%s: no such file (and not listed in the manifest)", full);
        return SN_FAIL(SN_E_IO, "%s: cannot open: %s", full, strerror(e));
    }
    if ((st = sn_manifest_pins_check_fd(p, norm, fd)) != SN_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    return SN_OK;
}

static sn_status verify_dir(const sn_manifest *m, const char *model_dir, int n_threads, int show_progress,
                            uint64_t *bytes_hashed, sn_manifest_pins **pins)
{
    sn_status st = SN_OK;
    path_list files = { 0 };
    hash_job *jobs = NULL;
    char **listed = NULL;
    if (bytes_hashed)
        *bytes_hashed = 0;
    /* Coverage first: it is cheap, and an extra unlisted shard is exactly
     * the substitution attack the gate exists for. */
    st = walk_weights(model_dir, "", 0, &files);
    if (st != SN_OK)
        goto out;
    listed = malloc((m->n ? m->n : 1) * sizeof *listed);
    if (!listed) {
        st = SN_FAIL(SN_E_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m->n; i++)
        listed[i] = m->entries[i].path;
    qsort(listed, m->n, sizeof *listed, cmp_str);
    if (files.n)   /* qsort(NULL, 0, ...) is undefined */
        qsort(files.v, files.n, sizeof *files.v, cmp_str);
    for (size_t i = 0; i < files.n; i++) {
        if (!bsearch(&files.v[i], listed, m->n, sizeof *listed, cmp_str)) {
            st = SN_FAIL(SN_E_VERIFY, "%s/%s: weight file is not listed in the manifest", model_dir, files.v[i]);
            goto out;
        }
    }
    jobs = calloc(m->n, sizeof *jobs);
    if (!jobs) {
        st = SN_FAIL(SN_E_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m->n; i++) {
        jobs[i].rel = m->entries[i].path;
        jobs[i].want = m->entries[i].sha256;
    }
    st = hash_jobs(model_dir, jobs, m->n, n_threads, show_progress, bytes_hashed);
    if (st == SN_OK && pins)
        st = pins_from_jobs(jobs, m->n, pins);
out:
    free(listed);
    free(jobs);
    path_list_free(&files);
    return st;
}

sn_status sn_manifest_verify_dir(const sn_manifest *m, const char *model_dir, int n_threads, uint64_t *bytes_hashed)
{
    if (!m || !model_dir)
        return SN_FAIL(SN_E_INVALID, "sn_manifest_verify_dir: NULL manifest or model dir");
    return verify_dir(m, model_dir, n_threads, 0, bytes_hashed, NULL);
}

/* ---------------------------------------------------------------- ed25519 */

sn_status sn_ed25519_verify(const unsigned char *msg, size_t len, const unsigned char sig[SN_ED25519_SIG_BYTES],
                            const unsigned char pub[SN_ED25519_PUB_BYTES])
{
    sn_status st = SN_OK;
    char why[256];
    EVP_MD_CTX *ctx = NULL;
    ERR_clear_error();
    EVP_PKEY *key = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, SN_ED25519_PUB_BYTES);
    if (!key)
        return SN_FAIL(SN_E_FORMAT, "ed25519 public key rejected: %s",
                       ossl_reason(why, sizeof why, "EVP_PKEY_new_raw_public_key failed"));
    ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) != 1) {
        st = SN_FAIL(SN_E_BACKEND, "ed25519 verify init: %s",
                     ossl_reason(why, sizeof why, "EVP_DigestVerifyInit failed"));
        goto out;
    }
    int r = EVP_DigestVerify(ctx, sig, SN_ED25519_SIG_BYTES, msg ? msg : (const unsigned char *)"", len);
    if (r != 1) {
        /* OpenSSL's ed25519 returns 0 without queuing an error for a
         * well-formed but wrong signature; name the call and its result so
         * the message is still the library's verdict, not our guess. */
        st = SN_FAIL(SN_E_VERIFY, "ed25519 signature does not verify (OpenSSL: %s)",
                     ossl_reason(why, sizeof why,
                                 r == 0 ? "EVP_DigestVerify: signature verification failure"
                                        : "EVP_DigestVerify: error"));
    }
out:
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    return st;
}

sn_status sn_ed25519_sign(const unsigned char *msg, size_t len, const unsigned char seed[SN_ED25519_SEED_BYTES],
                          unsigned char sig[SN_ED25519_SIG_BYTES])
{
    sn_status st = SN_OK;
    char why[256];
    EVP_MD_CTX *ctx = NULL;
    ERR_clear_error();
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, SN_ED25519_SEED_BYTES);
    if (!key)
        return SN_FAIL(SN_E_FORMAT, "ed25519 private key rejected: %s",
                       ossl_reason(why, sizeof why, "EVP_PKEY_new_raw_private_key failed"));
    size_t sl = SN_ED25519_SIG_BYTES;
    ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) != 1 ||
        EVP_DigestSign(ctx, sig, &sl, msg ? msg : (const unsigned char *)"", len) != 1 ||
        sl != SN_ED25519_SIG_BYTES)
        st = SN_FAIL(SN_E_BACKEND, "ed25519 sign: %s", ossl_reason(why, sizeof why, "EVP_DigestSign failed"));
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    return st;
}

sn_status sn_ed25519_public(const unsigned char seed[SN_ED25519_SEED_BYTES], unsigned char pub[SN_ED25519_PUB_BYTES])
{
    char why[256];
    ERR_clear_error();
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, SN_ED25519_SEED_BYTES);
    if (!key)
        return SN_FAIL(SN_E_FORMAT, "ed25519 private key rejected: %s",
                       ossl_reason(why, sizeof why, "EVP_PKEY_new_raw_private_key failed"));
    size_t pl = SN_ED25519_PUB_BYTES;
    sn_status st = SN_OK;
    if (EVP_PKEY_get_raw_public_key(key, pub, &pl) != 1 || pl != SN_ED25519_PUB_BYTES)
        st = SN_FAIL(SN_E_BACKEND, "ed25519 public key: %s",
                     ossl_reason(why, sizeof why, "EVP_PKEY_get_raw_public_key failed"));
    EVP_PKEY_free(key);
    return st;
}

static int starts_with(const unsigned char *b, size_t n, const char *pfx)
{
    size_t pl = strlen(pfx);
    return n >= pl && memcmp(b, pfx, pl) == 0;
}

/* The PEM half of both key loaders: parse, insist on ED25519, take the raw
 * bytes (the 32-byte seed of a private key, the 32-byte public key). One
 * path for both so the type check and the OpenSSL error reporting cannot
 * drift apart. */
static sn_status pem_ed25519_raw(const char *path, const unsigned char *buf, size_t len, int is_private,
                                 unsigned char *raw, size_t raw_len)
{
    sn_status st = SN_OK;
    char why[256];
    EVP_PKEY *key = NULL;
    ERR_clear_error();
    BIO *bio = BIO_new_mem_buf(buf, (int)len);
    if (bio) key = is_private ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    if (!key) {
        st = is_private ? SN_FAIL(SN_E_FORMAT, "%s: not a PEM private key or a raw 32-byte ed25519 seed: %s", path,
                                  ossl_reason(why, sizeof why, "PEM_read_bio_PrivateKey failed"))
                        : SN_FAIL(SN_E_FORMAT, "%s: not a PEM public key: %s", path,
                                  ossl_reason(why, sizeof why, "PEM_read_bio_PUBKEY failed"));
        goto out;
    }
    if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) {
        st = SN_FAIL(SN_E_UNSUPPORTED, "%s: key type %s, expected ED25519", path, OBJ_nid2sn(EVP_PKEY_get_id(key)));
        goto out;
    }
    size_t got = raw_len;
    if (is_private) {
        if (EVP_PKEY_get_raw_private_key(key, raw, &got) != 1 || got != raw_len)
            st = SN_FAIL(SN_E_FORMAT, "%s: cannot extract the ed25519 seed: %s", path,
                         ossl_reason(why, sizeof why, "EVP_PKEY_get_raw_private_key failed"));
    } else {
        if (EVP_PKEY_get_raw_public_key(key, raw, &got) != 1 || got != raw_len)
            st = SN_FAIL(SN_E_FORMAT, "%s: cannot extract the raw public key: %s", path,
                         ossl_reason(why, sizeof why, "EVP_PKEY_get_raw_public_key failed"));
    }
out:
    EVP_PKEY_free(key);
    BIO_free(bio);
    return st;
}

sn_status sn_ed25519_load_private(const char *path, unsigned char seed[SN_ED25519_SEED_BYTES])
{
    sn_status st = SN_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return SN_FAIL(errno == ENOENT ? SN_E_MISSING : SN_E_IO, "%s: %s", path, strerror(errno));
    /* Like ssh: a signing key others can read is already compromised. */
    if (sb.st_mode & (S_IRWXG | S_IRWXO))
        return SN_FAIL(SN_E_INVALID, "%s: private key is accessible by group/others (mode %03o); chmod 600 it",
                       path, (unsigned)(sb.st_mode & 0777));
    SN_TRY(sn_manifest_read_file(path, 64 * 1024, &buf, &len));
    if (len == SN_ED25519_SEED_BYTES && !starts_with(buf, len, "-----"))
        memcpy(seed, buf, SN_ED25519_SEED_BYTES);
    else
        st = pem_ed25519_raw(path, buf, len, 1, seed, SN_ED25519_SEED_BYTES);
    if (buf) {
        OPENSSL_cleanse(buf, len);
        free(buf);
    }
    return st;
}

sn_status sn_ed25519_load_public(const char *path, unsigned char pub[SN_ED25519_PUB_BYTES])
{
    sn_status st = SN_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    SN_TRY(sn_manifest_read_file(path, 64 * 1024, &buf, &len));
    if (len == SN_ED25519_PUB_BYTES && !starts_with(buf, len, "-----"))
        memcpy(pub, buf, SN_ED25519_PUB_BYTES);
    else if (!starts_with(buf, len, "-----BEGIN"))
        st = SN_FAIL(SN_E_FORMAT, "%s: %zu bytes; an ed25519 public key is 32 raw bytes or PEM", path, len);
    else
        st = pem_ed25519_raw(path, buf, len, 0, pub, SN_ED25519_PUB_BYTES);
    free(buf);
    return st;
}

static sn_status gate(const char *model_dir, const sn_manifest_opts *opts, sn_manifest_report *report,
                      sn_manifest_pins **pins)
{
    sn_status st = SN_OK;
    unsigned char *text = NULL, *sigbuf = NULL;
    size_t text_len = 0, sig_len = 0;
    sn_manifest *m = NULL;
    char *sig_default = NULL;
    double t0 = sn_now_s();
    sn_manifest_report rep = { 0 };
    if (!model_dir || !opts || !opts->manifest_path)
        return SN_FAIL(SN_E_INVALID, "manifest gate: model dir and manifest path are required");
    const char *mpath = opts->manifest_path;
    if (opts->sig_path && !opts->pubkey_path)
        return SN_FAIL(SN_E_INVALID, "%s: a signature was given (--manifest-sig) without --manifest-pubkey",
                       opts->sig_path);
    st = sn_manifest_read_file(mpath, SN_MANIFEST_MAX_BYTES, &text, &text_len);
    if (st != SN_OK)
        goto out;

    if (opts->pubkey_path) {
        unsigned char pub[SN_ED25519_PUB_BYTES];
        const char *spath = opts->sig_path;
        if (!spath) {
            size_t n = strlen(mpath) + 5;
            sig_default = malloc(n);
            if (!sig_default) {
                st = SN_FAIL(SN_E_NOMEM, "out of memory");
                goto out;
            }
            snprintf(sig_default, n, "%s.sig", mpath);
            spath = sig_default;
        }
        st = sn_ed25519_load_public(opts->pubkey_path, pub);
        if (st != SN_OK)
            goto out;
        char inner[512];
        st = sn_manifest_read_file(spath, 4096, &sigbuf, &sig_len);
        if (st != SN_OK) {
            snprintf(inner, sizeof inner, "%s", sn_errmsg());   /* SN_FAIL overwrites the buffer */
            st = SN_FAIL(SN_E_VERIFY, "%s: signature of %s unreadable: %s", spath, mpath, inner);
            goto out;
        }
        if (sig_len != SN_ED25519_SIG_BYTES) {
            st = SN_FAIL(SN_E_VERIFY, "%s: %zu bytes; an ed25519 signature is exactly %d bytes", spath, sig_len,
                         SN_ED25519_SIG_BYTES);
            goto out;
        }
        st = sn_ed25519_verify(text, text_len, sigbuf, pub);
        if (st != SN_OK) {
            snprintf(inner, sizeof inner, "%s", sn_errmsg());
            st = SN_FAIL(SN_E_VERIFY, "%s: signature %s does not match this manifest and key %s: %s", mpath, spath,
                         opts->pubkey_path, inner);
            goto out;
        }
        rep.signature_checked = 1;
    } else if (opts->require_signed) {
        st = SN_FAIL(SN_E_VERIFY, "%s: unsigned manifest refused (--require-signed-manifest needs "
                                  "--manifest-pubkey and a signature)", mpath);
        goto out;
    } else if (!opts->quiet) {
        fprintf(stderr, "sanctum: WARNING: manifest %s is NOT SIGNED: the weight hashes are only as trustworthy "
                        "as the file itself (use --manifest-pubkey/--manifest-sig and --require-signed-manifest)\n",
                mpath);
    }

    st = sn_manifest_parse((const char *)text, text_len, mpath, &m);
    if (st != SN_OK)
        goto out;
    double th = sn_now_s();
    int progress = opts->quiet ? 0 : isatty(STDERR_FILENO) ? 1 : 2;
    st = verify_dir(m, model_dir, opts->n_threads, progress, &rep.bytes, pins);
    rep.hash_seconds = sn_now_s() - th;
    if (st != SN_OK)
        goto out;
    rep.n_files = m->n;
    rep.seconds = sn_now_s() - t0;
    if (!opts->quiet)
        fprintf(stderr, "manifest: %s verified: %zu files, %.2f GB in %.2f s (%.2f GB/s), signature %s\n", mpath,
                rep.n_files, (double)rep.bytes / 1e9, rep.seconds,
                rep.hash_seconds > 0 ? (double)rep.bytes / 1e9 / rep.hash_seconds : 0.0,
                rep.signature_checked ? "ok" : "absent");
    if (report)
        *report = rep;
out:
    free(sig_default);
    free(sigbuf);
    free(text);
    sn_manifest_free(m);
    return st;
}

sn_status sn_manifest_gate(const char *model_dir, const sn_manifest_opts *opts, sn_manifest_report *report)
{
    return gate(model_dir, opts, report, NULL);
}

sn_status sn_manifest_gate_pinned(const char *model_dir, const sn_manifest_opts *opts, sn_manifest_report *report,
                                  sn_manifest_pins **pins)
{
    if (!pins)
        return SN_FAIL(SN_E_INVALID, "sn_manifest_gate_pinned: NULL pins");
    *pins = NULL;
    return gate(model_dir, opts, report, pins);
}
