/* Safetensors reader (mmap, every header byte untrusted) and streaming writer.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {..}},
 * then the data buffer; offsets are relative to the start of the buffer. */
#include "sanctum/safetensors.h"
#include "sanctum/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A dimension larger than this is a corrupt header, not a tensor. */
#define ST_MAX_DIM ((int64_t)1 << 40)
/* model.safetensors.index.json of the largest checkpoints is a few MB. */
#define ST_MAX_INDEX (64u << 20)

typedef struct {
    char *path;
    void *map;       /* mmap of the whole file; NULL for an in-memory image or a copied file */
    size_t size;
    void *mem;       /* sn_st_copy_to_memory: the file's bytes in anonymous memory (mem_len
                      * bytes, 2 MB aligned); else NULL */
    size_t mem_len;
    int fd;          /* kept open: for sn_st_recheck_pins (pinned opens) and sn_st_copy_to_memory;
                      * -1 for an in-memory image */
    char *rel;       /* pinned open: name relative to the model dir; else NULL */
} st_file;

typedef struct {
    char *key, *value;
} st_meta;

struct sn_st {
    st_file *files;
    int n_files;
    sn_st_tensor *t;   /* sorted by name once loading is done */
    size_t n, cap;
    st_meta *meta;     /* __metadata__ of the first file that has one */
    size_t n_meta;
    size_t data_bytes;
    /* During sn_st_open_pinned only: every file is opened through the pins. */
    const sn_manifest_pins *pins;
    const char *pin_dir;
};

/* ---- small helpers ------------------------------------------------------ */

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const sn_st_tensor *)a)->name, ((const sn_st_tensor *)b)->name);
}

static bool parse_dtype(const char *s, sn_dtype *dt)
{
    static const struct { const char *name; sn_dtype dt; } map[] = {
        {"F32", SN_DT_F32}, {"F16", SN_DT_F16}, {"BF16", SN_DT_BF16}, {"U32", SN_DT_U32},
        {"I32", SN_DT_I32}, {"U8", SN_DT_U8},   {"I8", SN_DT_I8},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i].name) == 0) { *dt = map[i].dt; return true; }
    return false;
}

int64_t sn_st_numel(const sn_st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static sn_status push_tensor(sn_st *st, const sn_st_tensor *t)
{
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 256;
        sn_st_tensor *nt = realloc(st->t, cap * sizeof *nt);
        if (!nt) return SN_FAIL(SN_E_NOMEM, "safetensors: out of memory for %zu tensors", cap);
        st->t = nt;
        st->cap = cap;
    }
    st->t[st->n++] = *t;
    return SN_OK;
}

typedef struct { uint64_t begin, end; const char *name; } span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

/* One header entry -> tensor. label names the file in errors. */
static sn_status parse_entry(const char *label, const char *name, json_t *v, const uint8_t *data,
                             uint64_t data_len, sn_st_tensor *t, span *sp)
{
    memset(t, 0, sizeof *t);
    if (!json_is_object(v))
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": header entry is not an object", label, name);
    json_t *jdt = json_object_get(v, "dtype"), *jsh = json_object_get(v, "shape"),
           *joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt))
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": missing or non-string \"dtype\"", label, name);
    if (!parse_dtype(json_string_value(jdt), &t->dtype))
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: tensor \"%s\": dtype \"%s\" is not supported "
                       "(F32, F16, BF16, U32, I32, U8, I8)", label, name, json_string_value(jdt));
    if (!json_is_array(jsh))
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": missing or non-array \"shape\"", label, name);
    size_t nd = json_array_size(jsh);
    if (nd > SN_ST_MAX_DIMS)
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": rank %zu exceeds the maximum of %d", label, name,
                       nd, SN_ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(jsh, i);
        if (!json_is_integer(d))
            return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": shape[%zu] is not an integer", label, name, i);
        json_int_t dv = json_integer_value(d);
        if (dv < 0 || dv > ST_MAX_DIM)
            return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": shape[%zu] = %lld is out of range", label, name,
                           i, (long long)dv);
        t->shape[i] = dv;
        if (__builtin_mul_overflow(numel, (uint64_t)dv, &numel) || numel > ((uint64_t)1 << 62))
            return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": element count overflows", label, name);
    }
    if (!json_is_array(joff) || json_array_size(joff) != 2 || !json_is_integer(json_array_get(joff, 0)) ||
        !json_is_integer(json_array_get(joff, 1)))
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] integers",
                       label, name);
    json_int_t b = json_integer_value(json_array_get(joff, 0)), e = json_integer_value(json_array_get(joff, 1));
    if (b < 0 || e < b)
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": bad data_offsets [%lld, %lld]", label, name,
                       (long long)b, (long long)e);
    if ((uint64_t)e > data_len)
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": data_offsets end %lld is past the data (%llu bytes; "
                       "file truncated?)", label, name, (long long)e, (unsigned long long)data_len);
    uint64_t want = numel * sn_dtype_size(t->dtype);
    if ((uint64_t)(e - b) != want)
        return SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\": %lld bytes in data_offsets but shape x %s needs %llu",
                       label, name, (long long)(e - b), sn_dtype_name(t->dtype), (unsigned long long)want);
    t->nbytes = (size_t)want;
    t->data = want ? data + b : NULL;
    sp->begin = (uint64_t)b;
    sp->end = (uint64_t)e;
    sp->name = name;
    return SN_OK;
}

/* Parse one file image; its tensors are appended to st (names still owned
 * by the json until copied here). */
static sn_status parse_image(sn_st *st, const uint8_t *img, size_t len, const char *label)
{
    sn_status rc = SN_OK;
    json_t *root = NULL;
    span *spans = NULL;
    if (len < 8)
        return SN_FAIL(SN_E_FORMAT, "%s: %zu bytes is too short for a safetensors header length", label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | img[i];
    if (hlen < 2 || hlen > SN_ST_MAX_HEADER)
        return SN_FAIL(SN_E_FORMAT, "%s: header length %llu is out of range (2..%u)", label,
                       (unsigned long long)hlen, SN_ST_MAX_HEADER);
    if (hlen > len - 8)
        return SN_FAIL(SN_E_FORMAT, "%s: header length %llu exceeds the file size %zu (truncated?)", label,
                       (unsigned long long)hlen, len);
    json_error_t jerr;
    root = json_loadb((const char *)img + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = SN_FAIL(SN_E_FORMAT, "%s: header JSON invalid at line %d column %d: %s", label, jerr.line,
                     jerr.column, jerr.text);
        goto out;
    }
    if (!json_is_object(root)) {
        rc = SN_FAIL(SN_E_FORMAT, "%s: header is not a JSON object", label);
        goto out;
    }
    const uint8_t *data = img + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    size_t n_entries = json_object_size(root);
    spans = calloc(n_entries ? n_entries : 1, sizeof *spans);
    if (!spans) { rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", label); goto out; }
    size_t ns = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v) && !json_is_null(v)) {
                rc = SN_FAIL(SN_E_FORMAT, "%s: __metadata__ is not an object", label);
                goto out;
            }
            if (st->meta || !json_is_object(v)) continue;
            size_t nm = json_object_size(v);
            st->meta = calloc(nm ? nm : 1, sizeof *st->meta);
            if (!st->meta) { rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", label); goto out; }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = SN_FAIL(SN_E_FORMAT, "%s: __metadata__ value of \"%s\" is not a string", label, mk);
                    goto out;
                }
                st_meta *m = &st->meta[st->n_meta];
                m->key = strdup(mk);
                m->value = strdup(json_string_value(mv));
                if (!m->key || !m->value) {
                    free(m->key); free(m->value);
                    rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", label);
                    goto out;
                }
                st->n_meta++;
            }
            continue;
        }
        if (key[0] == 0) { rc = SN_FAIL(SN_E_FORMAT, "%s: tensor with an empty name", label); goto out; }
        sn_st_tensor t;
        if ((rc = parse_entry(label, key, v, data, data_len, &t, &spans[ns])) != SN_OK) goto out;
        if (t.nbytes) ns++;
        t.file = st->files[st->n_files - 1].path;
        t.name = strdup(key);
        if (!t.name) { rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", label); goto out; }
        if ((rc = push_tensor(st, &t)) != SN_OK) { free((char *)t.name); goto out; }
        st->data_bytes += t.nbytes;
    }
    /* Two tensors sharing bytes would let a writer of one corrupt the other
     * and signals a forged file; zero-sized tensors own no bytes. */
    qsort(spans, ns, sizeof *spans, cmp_span);
    for (size_t i = 1; i < ns; i++)
        if (spans[i].begin < spans[i - 1].end) {
            rc = SN_FAIL(SN_E_FORMAT, "%s: tensors \"%s\" [%llu, %llu) and \"%s\" [%llu, %llu) overlap", label,
                         spans[i - 1].name, (unsigned long long)spans[i - 1].begin,
                         (unsigned long long)spans[i - 1].end, spans[i].name,
                         (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end);
            goto out;
        }
out:
    free(spans);
    json_decref(root);
    return rc;
}

/* On success the file (map, fd, rel) belongs to st; on failure nothing was taken. */
static sn_status add_file(sn_st *st, const char *path, void *map, size_t size, int fd, const char *rel)
{
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", path);
    st->files = nf;
    st_file *f = &st->files[st->n_files];
    f->path = strdup(path);
    f->rel = rel ? strdup(rel) : NULL;
    if (!f->path || (rel && !f->rel)) {
        free(f->path);
        free(f->rel);
        return SN_FAIL(SN_E_NOMEM, "%s: out of memory", path);
    }
    f->map = map;
    f->size = size;
    f->mem = NULL;
    f->mem_len = 0;
    f->fd = fd;
    st->n_files++;
    return SN_OK;
}

/* rel: the file's name inside the model dir, used to find its pin. */
static sn_status map_file(sn_st *st, const char *path, const char *rel)
{
    int fd;
    if (st->pins) {
        /* Checked after open, before the mmap: a file swapped in after the
         * manifest gate hashed the original is refused here. */
        SN_TRY(sn_manifest_pins_open(st->pins, st->pin_dir, rel, &fd));
    } else {
        /* O_NONBLOCK: a FIFO would block the open; it fails S_ISREG below */
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) return SN_FAIL(SN_E_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return SN_FAIL(SN_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) { close(fd); return SN_FAIL(SN_E_IO, "%s: not a regular file", path); }
    if (sb.st_size < 8) {
        close(fd);
        return SN_FAIL(SN_E_FORMAT, "%s: %lld bytes is too short for a safetensors file", path,
                       (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    /* The fd stays open: a pinned file's so that sn_st_recheck_pins can
     * prove, after the weights were used (uploaded, repacked), that nobody
     * wrote to it; every file's so that sn_st_copy_to_memory can read it
     * with pread, not through the mapping's small pages. */
    if (map == MAP_FAILED) {
        close(fd);
        return SN_FAIL(SN_E_IO, "%s: mmap failed: %s", path, strerror(e));
    }
    sn_status rc = add_file(st, path, map, (size_t)sb.st_size, fd, st->pins ? rel : NULL);
    if (rc != SN_OK) {
        munmap(map, (size_t)sb.st_size);
        close(fd);
        return rc;
    }
    return parse_image(st, map, (size_t)sb.st_size, st->files[st->n_files - 1].path);
}

/* Sort by name and refuse a name defined twice (across shards: within one
 * header jansson already rejects duplicate keys). */
static sn_status finish(sn_st *st)
{
    qsort(st->t, st->n, sizeof *st->t, cmp_name);
    for (size_t i = 1; i < st->n; i++)
        if (strcmp(st->t[i].name, st->t[i - 1].name) == 0)
            return SN_FAIL(SN_E_FORMAT, "tensor \"%s\" is defined twice (in %s and %s)", st->t[i].name,
                           st->t[i - 1].file, st->t[i].file);
    return SN_OK;
}

static sn_status st_alloc(sn_st **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? SN_OK : SN_FAIL(SN_E_NOMEM, "safetensors: out of memory");
}

sn_status sn_st_open_mem(const void *bytes, size_t len, const char *label, sn_st **out)
{
    *out = NULL;
    sn_st *st;
    SN_TRY(st_alloc(&st));
    sn_status rc = add_file(st, label ? label : "<memory>", NULL, len, -1, NULL);
    if (rc == SN_OK) rc = parse_image(st, bytes, len, st->files[0].path);
    if (rc == SN_OK) rc = finish(st);
    if (rc != SN_OK) { sn_st_close(st); return rc; }
    *out = st;
    return SN_OK;
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sharded checkpoint: open each file the weight_map names, then make sure
 * every listed tensor is really in the file the index says. */
static sn_status open_index(sn_st *st, const char *dir, const char *index_path, json_t *root)
{
    sn_status rc = SN_OK;
    const char **names = NULL;
    size_t n_names = 0;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        rc = SN_FAIL(SN_E_FORMAT, "%s: missing or empty \"weight_map\" object", index_path);
        goto out;
    }
    names = calloc(json_object_size(wm), sizeof *names);
    if (!names) { rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", index_path); goto out; }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v)) {
            rc = SN_FAIL(SN_E_FORMAT, "%s: weight_map[\"%s\"] is not a file name", index_path, key);
            goto out;
        }
        const char *fn = json_string_value(v);
        /* The index is untrusted: a shard must be a plain file in dir. */
        if (!fn[0] || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0) {
            rc = SN_FAIL(SN_E_FORMAT, "%s: weight_map[\"%s\"] = \"%s\" is not a file name in the directory",
                         index_path, key, fn);
            goto out;
        }
        names[n_names++] = fn;
    }
    qsort(names, n_names, sizeof *names, cmp_str);
    for (size_t i = 0; i < n_names; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        char *p = path_join(dir, names[i]);
        if (!p) { rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", index_path); goto out; }
        rc = map_file(st, p, names[i]);
        free(p);
        if (rc != SN_OK) goto out;
    }
    if ((rc = finish(st)) != SN_OK) goto out;
    json_object_foreach(wm, key, v) {
        const sn_st_tensor *t = sn_st_find(st, key);
        const char *fn = json_string_value(v);
        if (!t) {
            rc = SN_FAIL(SN_E_MISSING, "%s: tensor \"%s\" is listed in %s but not in any shard", index_path,
                         key, fn);
            goto out;
        }
        const char *base = strrchr(t->file, '/');
        base = base ? base + 1 : t->file;
        if (strcmp(base, fn) != 0) {
            rc = SN_FAIL(SN_E_FORMAT, "%s: tensor \"%s\" is listed in %s but stored in %s", index_path, key,
                         fn, t->file);
            goto out;
        }
    }
out:
    free(names);
    return rc;
}

/* Reads the index whole from fd (jansson's fd reader goes byte by byte):
 * a regular file of at most ST_MAX_INDEX bytes. */
static sn_status read_index_fd(int fd, const char *index_path, char **out, size_t *out_len)
{
    struct stat sb;
    char *buf = NULL;
    size_t len = 0;
    sn_status rc = SN_OK;
    *out = NULL;
    *out_len = 0;
    if (fstat(fd, &sb) != 0) rc = SN_FAIL(SN_E_IO, "%s: cannot stat: %s", index_path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) rc = SN_FAIL(SN_E_IO, "%s: not a regular file", index_path);
    else if (sb.st_size > ST_MAX_INDEX) rc = SN_FAIL(SN_E_FORMAT, "%s: %lld bytes is larger than the %u an index may take",
                                                     index_path, (long long)sb.st_size, ST_MAX_INDEX);
    else if (!(buf = malloc((size_t)sb.st_size + 1))) rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", index_path);
    while (rc == SN_OK && len < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + len, (size_t)sb.st_size - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = SN_FAIL(SN_E_IO, "%s: read: %s", index_path, strerror(errno));
        else if (r == 0) rc = SN_FAIL(SN_E_IO, "%s: shorter than its size while reading", index_path);
        else len += (size_t)r;
    }
    if (rc != SN_OK) { free(buf); return rc; }
    *out = buf;
    *out_len = len;
    return SN_OK;
}

static sn_status parse_index(const char *buf, size_t len, const char *index_path, json_t **root)
{
    json_error_t jerr;
    *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root)
        return SN_FAIL(SN_E_FORMAT, "%s: invalid JSON at line %d column %d: %s", index_path, jerr.line, jerr.column,
                       jerr.text);
    return SN_OK;
}

/* The index JSON through an fd the pins vouch for, before and after the
 * read (a write during the read would change mtime/ctime). *root is NULL
 * when the index is absent and the manifest does not list one. */
static sn_status load_index_pinned(sn_st *st, const char *index_path, json_t **root)
{
    *root = NULL;
    int fd;
    sn_status rc = sn_manifest_pins_open(st->pins, st->pin_dir, "model.safetensors.index.json", &fd);
    if (rc == SN_E_MISSING) return SN_OK;
    if (rc != SN_OK) return rc;
    char *buf = NULL;
    size_t len = 0;
    rc = read_index_fd(fd, index_path, &buf, &len);
    /* After the read: the bytes parsed are the bytes the gate hashed. */
    if (rc == SN_OK) rc = sn_manifest_pins_check_fd(st->pins, "model.safetensors.index.json", fd);
    close(fd);
    if (rc == SN_OK) rc = parse_index(buf, len, index_path, root);
    free(buf);
    return rc;
}

/* The same without pins. O_NONBLOCK: opening a FIFO for reading otherwise
 * waits for a writer forever; the regular-file check then refuses it. */
static sn_status load_index(const char *index_path, json_t **root)
{
    *root = NULL;
    int fd = open(index_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) return SN_OK;
    if (fd < 0) return SN_FAIL(SN_E_IO, "%s: cannot open: %s", index_path, strerror(errno));
    char *buf = NULL;
    size_t len = 0;
    sn_status rc = read_index_fd(fd, index_path, &buf, &len);
    close(fd);
    if (rc == SN_OK) rc = parse_index(buf, len, index_path, root);
    free(buf);
    return rc;
}

static sn_status open_dir(sn_st *st, const char *dir)
{
    char *p = path_join(dir, "model.safetensors.index.json");
    if (!p) return SN_FAIL(SN_E_NOMEM, "out of memory");
    json_t *root = NULL;
    sn_status rc = st->pins ? load_index_pinned(st, p, &root) : load_index(p, &root);
    if (rc == SN_OK && root) rc = open_index(st, dir, p, root);
    json_decref(root);
    free(p);
    if (rc != SN_OK || root) return rc;
    /* No index: every model*.safetensors in the directory, the glob mlx-lm
     * uses; other files (adapters.safetensors of a LoRA) are not weights. */
    DIR *d = opendir(dir);
    if (!d) return SN_FAIL(SN_E_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    char **files = NULL;
    size_t nf = 0, cap = 0;
    rc = SN_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strncmp(de->d_name, "model", 5) != 0 || strcmp(de->d_name + l - 12, ".safetensors") != 0)
            continue;
        if (nf == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(files, cap * sizeof *nn);
            if (!nn) { rc = SN_FAIL(SN_E_NOMEM, "out of memory"); break; }
            files = nn;
        }
        if (!(files[nf] = strdup(de->d_name))) { rc = SN_FAIL(SN_E_NOMEM, "out of memory"); break; }
        nf++;
    }
    closedir(d);
    if (rc == SN_OK && nf == 0) rc = SN_FAIL(SN_E_MISSING, "%s: no model*.safetensors files in the directory", dir);
    if (rc == SN_OK) {
        qsort(files, nf, sizeof *files, cmp_str);
        for (size_t i = 0; i < nf && rc == SN_OK; i++) {
            char *fp = path_join(dir, files[i]);
            rc = fp ? map_file(st, fp, files[i]) : SN_FAIL(SN_E_NOMEM, "out of memory");
            free(fp);
        }
    }
    if (rc == SN_OK) rc = finish(st);
    for (size_t i = 0; i < nf; i++) free(files[i]);
    free(files);
    return rc;
}

sn_status sn_st_open(const char *dir_or_file, sn_st **out)
{
    *out = NULL;
    struct stat sb;
    if (stat(dir_or_file, &sb) != 0) return SN_FAIL(SN_E_IO, "%s: %s", dir_or_file, strerror(errno));
    sn_st *st;
    SN_TRY(st_alloc(&st));
    sn_status rc;
    if (S_ISDIR(sb.st_mode)) {
        rc = open_dir(st, dir_or_file);
    } else {
        rc = map_file(st, dir_or_file, NULL);
        if (rc == SN_OK) rc = finish(st);
    }
    if (rc != SN_OK) { sn_st_close(st); return rc; }
    *out = st;
    return SN_OK;
}

sn_status sn_st_open_pinned(const char *dir, const sn_manifest_pins *pins, sn_st **out)
{
    if (!pins) return sn_st_open(dir, out);
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0) return SN_FAIL(SN_E_IO, "%s: %s", dir, strerror(errno));
    /* Pins name files relative to the model directory the gate verified. */
    if (!S_ISDIR(sb.st_mode))
        return SN_FAIL(SN_E_INVALID, "%s: a pinned open needs the model directory the manifest covers", dir);
    sn_st *st;
    SN_TRY(st_alloc(&st));
    st->pins = pins;
    st->pin_dir = dir;
    sn_status rc = open_dir(st, dir);
    st->pins = NULL;   /* not kept: the caller owns them */
    st->pin_dir = NULL;
    if (rc != SN_OK) { sn_st_close(st); return rc; }
    *out = st;
    return SN_OK;
}

/* ---- weights copied into anonymous memory -------------------------------- */

#define ST_HUGE ((size_t)2 << 20)    /* x86-64's transparent huge page */
#define ST_COPY_CHUNK ((size_t)64 << 20)

/* n bytes (rounded up to ST_HUGE) of anonymous memory at a 2 MB boundary,
 * marked for transparent huge pages; NULL with errno on failure. */
static void *alloc_huge(size_t n, size_t *len_out)
{
    if (n > SIZE_MAX - 2 * ST_HUGE) { errno = ENOMEM; return NULL; }
    size_t len = (n + ST_HUGE - 1) & ~(ST_HUGE - 1);
    uint8_t *raw = mmap(NULL, len + ST_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *al = (uint8_t *)(((uintptr_t)raw + ST_HUGE - 1) & ~(uintptr_t)(ST_HUGE - 1));
    if (al > raw) munmap(raw, (size_t)(al - raw));
    size_t tail = (size_t)((raw + len + ST_HUGE) - (al + len));
    if (tail) munmap(al + len, tail);
    /* a hint: where the kernel has no THP the copy simply stays in 4 KB pages */
    (void)madvise(al, len, MADV_HUGEPAGE);
    *len_out = len;
    return al;
}

sn_status sn_st_copy_to_memory(sn_st *st, bool drop_cache)
{
    if (!st) return SN_FAIL(SN_E_INVALID, "sn_st_copy_to_memory: NULL handle");
    for (int i = 0; i < st->n_files; i++) {
        st_file *f = &st->files[i];
        if (!f->map) continue; /* an in-memory image, or copied already */
        if (f->fd < 0) return SN_FAIL(SN_E_INVALID, "%s: no open file to copy the weights from", f->path);
        size_t len;
        uint8_t *mem = alloc_huge(f->size, &len);
        if (!mem)
            return SN_FAIL(SN_E_NOMEM, "%s: cannot allocate %zu MB to copy the weights into memory: %s", f->path,
                           f->size >> 20, strerror(errno));
        /* pread, not memcpy from the mapping: through a mapping of small
         * page-cache pages the copy ran at 0.27 GB/s on this project's VM
         * (57 s for the 27B) */
        (void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        size_t off = 0;
        while (off < f->size) {
            size_t want = f->size - off < ST_COPY_CHUNK ? f->size - off : ST_COPY_CHUNK;
            ssize_t got = pread(f->fd, mem + off, want, (off_t)off);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                int e = got < 0 ? errno : 0;
                munmap(mem, len);
                return e ? SN_FAIL(SN_E_IO, "%s: read failed while copying the weights: %s", f->path, strerror(e))
                         : SN_FAIL(SN_E_IO, "%s: the file ended at %zu of its %zu bytes while the weights were "
                                            "copied (truncated since it was opened?)", f->path, off, f->size);
            }
            if (drop_cache) (void)posix_fadvise(f->fd, (off_t)off, (off_t)got, POSIX_FADV_DONTNEED);
            off += (size_t)got;
        }
        const uint8_t *src = f->map;
        /* read-only again, as the mapping was: a stray write faults */
        if (mprotect(mem, len, PROT_READ) != 0) {
            int e = errno;
            munmap(mem, len);
            return SN_FAIL(SN_E_IO, "%s: cannot make the copied weights read-only: %s", f->path, strerror(e));
        }
        for (size_t k = 0; k < st->n; k++) {
            const uint8_t *d = st->t[k].data;
            if (d && d >= src && d < src + f->size) st->t[k].data = mem + (d - src);
        }
        munmap(f->map, f->size);
        f->map = NULL;
        f->mem = mem;
        f->mem_len = len;
    }
    return SN_OK;
}

sn_status sn_st_recheck_pins(const sn_st *st, const sn_manifest_pins *pins)
{
    if (!st || !pins) return SN_FAIL(SN_E_INVALID, "sn_st_recheck_pins: NULL argument");
    for (int i = 0; i < st->n_files; i++) {
        const st_file *f = &st->files[i];
        if (f->fd < 0 || !f->rel)
            return SN_FAIL(SN_E_INVALID, "%s: not opened with sn_st_open_pinned", f->path);
        SN_TRY(sn_manifest_pins_check_fd(pins, f->rel, f->fd));
    }
    return SN_OK;
}

void sn_st_close(sn_st *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free((char *)st->t[i].name);
    free(st->t);
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        if (st->files[i].mem) munmap(st->files[i].mem, st->files[i].mem_len);
        if (st->files[i].fd >= 0) close(st->files[i].fd);
        free(st->files[i].path);
        free(st->files[i].rel);
    }
    free(st->files);
    for (size_t i = 0; i < st->n_meta; i++) { free(st->meta[i].key); free(st->meta[i].value); }
    free(st->meta);
    free(st);
}

const sn_st_tensor *sn_st_find(const sn_st *st, const char *name)
{
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->t[mid].name);
        if (c == 0) return &st->t[mid];
        if (c < 0) hi = mid; else lo = mid + 1;
    }
    return NULL;
}

size_t sn_st_count(const sn_st *st) { return st->n; }

const sn_st_tensor *sn_st_at(const sn_st *st, size_t i)
{
    SN_ASSERT(i < st->n);
    return &st->t[i];
}

const char *sn_st_metadata(const sn_st *st, const char *key)
{
    for (size_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

size_t sn_st_data_bytes(const sn_st *st) { return st->data_bytes; }

/* ---- writer ------------------------------------------------------------ */

typedef struct {
    char *name;
    sn_dtype dt;
    int ndim;
    int64_t shape[SN_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
    uint64_t begin;    /* offset in the data buffer, set at write time */
} wr_tensor;

struct sn_st_writer {
    wr_tensor *t;
    size_t n, cap;
    json_t *meta;
    json_t *names;     /* name set, to refuse duplicates in O(1) */
    size_t data_bytes;
};

sn_status sn_st_writer_new(sn_st_writer **out)
{
    sn_st_writer *w = calloc(1, sizeof *w);
    if (!w) return SN_FAIL(SN_E_NOMEM, "safetensors writer: out of memory");
    w->meta = json_object();
    w->names = json_object();
    if (!w->meta || !w->names || json_object_set_new(w->meta, "format", json_string("mlx")) != 0) {
        sn_st_writer_free(w);
        return SN_FAIL(SN_E_NOMEM, "safetensors writer: out of memory");
    }
    *out = w;
    return SN_OK;
}

void sn_st_writer_free(sn_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    json_decref(w->meta);
    json_decref(w->names);
    free(w);
}

sn_status sn_st_writer_set_meta(sn_st_writer *w, const char *key, const char *value)
{
    if (json_object_set_new(w->meta, key, json_string(value)) != 0)
        return SN_FAIL(SN_E_INVALID, "safetensors writer: bad metadata \"%s\" (not UTF-8?)", key);
    return SN_OK;
}

sn_status sn_st_writer_add(sn_st_writer *w, const char *name, sn_dtype dt, int ndim, const int64_t *shape,
                           const void *data)
{
    if (!name[0] || strcmp(name, "__metadata__") == 0)
        return SN_FAIL(SN_E_INVALID, "safetensors writer: invalid tensor name \"%s\"", name);
    if (sn_dtype_size(dt) == 0)
        return SN_FAIL(SN_E_INVALID, "safetensors writer: tensor \"%s\": dtype %s cannot be stored", name,
                       sn_dtype_name(dt));
    if (ndim < 0 || ndim > SN_ST_MAX_DIMS)
        return SN_FAIL(SN_E_INVALID, "safetensors writer: tensor \"%s\": rank %d", name, ndim);
    if (json_object_get(w->names, name))
        return SN_FAIL(SN_E_INVALID, "safetensors writer: tensor \"%s\" added twice", name);
    wr_tensor t = {.dt = dt, .ndim = ndim, .data = data};
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || shape[i] > ST_MAX_DIM)
            return SN_FAIL(SN_E_INVALID, "safetensors writer: tensor \"%s\": shape[%d] = %lld", name, i,
                           (long long)shape[i]);
        t.shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t.nbytes = n * sn_dtype_size(dt);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        wr_tensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return SN_FAIL(SN_E_NOMEM, "safetensors writer: out of memory");
        w->t = nt;
        w->cap = cap;
    }
    if (!(t.name = strdup(name)) || json_object_set_new(w->names, name, json_true()) != 0) {
        free(t.name);
        return SN_FAIL(SN_E_INVALID, "safetensors writer: cannot record tensor \"%s\" (not UTF-8?)", name);
    }
    w->t[w->n++] = t;
    w->data_bytes += t.nbytes;
    return SN_OK;
}

size_t sn_st_writer_count(const sn_st_writer *w) { return w->n; }
size_t sn_st_writer_data_bytes(const sn_st_writer *w) { return w->data_bytes; }

static sn_status write_all(int fd, const void *buf, size_t len, const char *path)
{
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return SN_FAIL(SN_E_IO, "%s: write failed: %s", path, strerror(errno));
        }
        p += k;
        len -= (size_t)k;
    }
    return SN_OK;
}

/* Layout order: larger element sizes first, then declaration order, so
 * that with an 8-aligned data start every tensor is aligned to its element
 * size while the buffer stays hole-free (the safetensors spec forbids holes). */
static size_t *layout_order(const sn_st_writer *w)
{
    size_t *ord = malloc((w->n ? w->n : 1) * sizeof *ord);
    if (!ord) return NULL;
    size_t k = 0;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (size_t i = 0; i < w->n; i++)
            if (sn_dtype_size(w->t[i].dt) == sz) ord[k++] = i;
    SN_ASSERT(k == w->n);
    return ord;
}

sn_status sn_st_writer_write(sn_st_writer *w, const char *path, sn_st_fill_fn fill, void *ctx)
{
    sn_status rc = SN_OK;
    json_t *hdr = NULL;
    char *hs = NULL, *tmp = NULL;
    uint8_t *buf = NULL;
    int fd = -1;
    size_t *ord = layout_order(w);
    if (!ord) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", path);
    uint64_t off = 0;
    for (size_t k = 0; k < w->n; k++) {
        wr_tensor *t = &w->t[ord[k]];
        if (!t->data && t->nbytes && !fill) {
            rc = SN_FAIL(SN_E_INVALID, "%s: tensor \"%s\" has no data and no fill callback", path, t->name);
            goto out;
        }
        t->begin = off;
        off += t->nbytes;
    }
    hdr = json_object();
    if (!hdr || json_object_set(hdr, "__metadata__", w->meta) != 0) goto nomem;
    for (size_t k = 0; k < w->n; k++) {
        wr_tensor *t = &w->t[ord[k]];
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        if (!e || !sh || !of) { json_decref(e); json_decref(sh); json_decref(of); goto nomem; }
        for (int i = 0; i < t->ndim; i++) json_array_append_new(sh, json_integer(t->shape[i]));
        json_array_append_new(of, json_integer((json_int_t)t->begin));
        json_array_append_new(of, json_integer((json_int_t)(t->begin + t->nbytes)));
        json_object_set_new(e, "dtype", json_string(sn_dtype_name(t->dt)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        if (json_object_set_new(hdr, t->name, e) != 0) goto nomem;
    }
    hs = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hs) goto nomem;
    size_t hl = strlen(hs), padded = (hl + 7) & ~(size_t)7;
    size_t tl = strlen(path) + 5;
    if (!(tmp = malloc(tl))) goto nomem;
    snprintf(tmp, tl, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { rc = SN_FAIL(SN_E_IO, "%s: cannot create: %s", tmp, strerror(errno)); goto out; }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if ((rc = write_all(fd, len8, 8, tmp)) != SN_OK) goto out;
    if ((rc = write_all(fd, hs, hl, tmp)) != SN_OK) goto out;
    if ((rc = write_all(fd, "       ", padded - hl, tmp)) != SN_OK) goto out;
    const size_t chunk = (size_t)4 << 20;
    for (size_t k = 0; k < w->n; k++) {
        wr_tensor *t = &w->t[ord[k]];
        if (t->data) {
            if ((rc = write_all(fd, t->data, t->nbytes, tmp)) != SN_OK) goto out;
            continue;
        }
        if (!buf && t->nbytes && !(buf = malloc(chunk))) goto nomem;
        for (size_t o = 0; o < t->nbytes; o += chunk) {
            size_t l = t->nbytes - o < chunk ? t->nbytes - o : chunk;
            if ((rc = fill(ctx, ord[k], t->name, o, buf, l)) != SN_OK) goto out;
            if ((rc = write_all(fd, buf, l, tmp)) != SN_OK) goto out;
        }
    }
    if (close(fd) != 0) { fd = -1; rc = SN_FAIL(SN_E_IO, "%s: close failed: %s", tmp, strerror(errno)); goto out; }
    fd = -1;
    if (rename(tmp, path) != 0) { rc = SN_FAIL(SN_E_IO, "%s: rename failed: %s", path, strerror(errno)); goto out; }
    goto out;
nomem:
    rc = SN_FAIL(SN_E_NOMEM, "%s: out of memory", path);
out:
    if (fd >= 0) close(fd);
    if (rc != SN_OK && tmp) unlink(tmp);
    free(buf);
    free(tmp);
    free(hs);
    json_decref(hdr);
    free(ord);
    return rc;
}
