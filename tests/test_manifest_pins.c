/* The manifest gate's pins wired through the loader: sn_model_load with
 * sn_load_opts.pins opens config.json, generation_config.json, the
 * safetensors index and every shard through them, so a file swapped,
 * written to, removed or added between the gate and the load is refused
 * (naming it), and an untouched directory loads the same model as a plain
 * load. The model is the qwen2 MLX fixture, re-written here as two shards
 * plus an index so every file kind the loader opens is exercised. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "sanctum/config.h"
#include "sanctum/manifest.h"
#include "sanctum/model.h"
#include "sanctum/safetensors.h"

#define FX "tests/fixtures/qwen2/mlx"
#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
#define INDEX "model.safetensors.index.json"

typedef struct {
    char root[64];
    char model[128];      /* root/m: the model dir */
    char manifest[128];   /* root/m.manifest */
    sn_manifest_pins *pins;
} fixture;

static int write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static int copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    if (!f) return -1;
    char *buf = malloc(1 << 22);
    size_t n = buf ? fread(buf, 1, 1 << 22, f) : 0;
    fclose(f);
    int rc = buf && n > 0 && n < (1 << 22) ? write_file(to, buf, n) : -1;
    free(buf);
    return rc;
}

/* XOR one byte at off in place (same inode). */
static int flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    unsigned char c;
    int rc = pread(fd, &c, 1, off) == 1 ? 0 : -1;
    c ^= 0x01;
    if (rc == 0 && pwrite(fd, &c, 1, off) != 1) rc = -1;
    close(fd);
    return rc;
}

static void path_in(char *out, size_t cap, const fixture *f, const char *name)
{
    snprintf(out, cap, "%s/%s", f->model, name);
}

/* Split the fixture's tensors over two shards (alternating, by name) and write the index. */
static int write_sharded(const char *dir)
{
    sn_st *src = NULL;
    sn_st_writer *w[2] = { NULL, NULL };
    char path[256];
    int rc = -1;
    size_t cap = 1 << 20, len = 0;
    char *idx = malloc(cap);
    if (!idx || sn_st_open(FX "/model.safetensors", &src) != SN_OK) goto out;
    if (sn_st_writer_new(&w[0]) != SN_OK || sn_st_writer_new(&w[1]) != SN_OK) goto out;
    len += (size_t)snprintf(idx + len, cap - len, "{\"metadata\": {}, \"weight_map\": {");
    for (size_t i = 0; i < sn_st_count(src); i++) {
        const sn_st_tensor *t = sn_st_at(src, i);
        if (sn_st_writer_add(w[i % 2], t->name, t->dtype, t->ndim, t->shape, t->data) != SN_OK) goto out;
        len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\": \"%s\"", i ? ", " : "", t->name,
                                i % 2 ? SHARD2 : SHARD1);
        if (len >= cap - 256) goto out;
    }
    len += (size_t)snprintf(idx + len, cap - len, "}}\n");
    snprintf(path, sizeof path, "%s/" SHARD1, dir);
    if (sn_st_writer_write(w[0], path, NULL, NULL) != SN_OK) goto out;
    snprintf(path, sizeof path, "%s/" SHARD2, dir);
    if (sn_st_writer_write(w[1], path, NULL, NULL) != SN_OK) goto out;
    snprintf(path, sizeof path, "%s/" INDEX, dir);
    rc = write_file(path, idx, len);
out:
    sn_st_writer_free(w[0]);
    sn_st_writer_free(w[1]);
    sn_st_close(src);
    free(idx);
    return rc;
}

/* A fresh model dir (sharded, or the fixture's single file), its manifest,
 * and the pins of a passing gate. */
static int fx_setup(fixture *f, int sharded)
{
    char p[256];
    char *text = NULL;
    size_t len = 0;
    memset(f, 0, sizeof *f);
    snprintf(f->root, sizeof f->root, "/tmp/sn_test_pins_XXXXXX");
    if (!mkdtemp(f->root)) return -1;
    snprintf(f->model, sizeof f->model, "%s/m", f->root);
    snprintf(f->manifest, sizeof f->manifest, "%s/m.manifest", f->root);
    if (mkdir(f->model, 0755) != 0) return -1;
    path_in(p, sizeof p, f, "config.json");
    if (copy_file(FX "/config.json", p) != 0) return -1;
    path_in(p, sizeof p, f, "generation_config.json");
    if (write_file(p, "{\"eos_token_id\": 1}\n", 20) != 0) return -1;
    if (sharded) {
        if (write_sharded(f->model) != 0) return -1;
    } else {
        path_in(p, sizeof p, f, "model.safetensors");
        if (copy_file(FX "/model.safetensors", p) != 0) return -1;
    }
    if (sn_manifest_create(f->model, 1, &text, &len) != SN_OK) return -1;
    int rc = write_file(f->manifest, text, len);
    free(text);
    if (rc != 0) return -1;
    sn_manifest_opts o = { .manifest_path = f->manifest, .n_threads = 1, .quiet = 1 };
    if (sn_manifest_gate_pinned(f->model, &o, NULL, &f->pins) != SN_OK) return -1;
    /* File timestamps tick coarsely: make any later write land in a later tick. */
    usleep(20 * 1000);
    return 0;
}

static void fx_teardown(fixture *f)
{
    char cmd[160];
    sn_manifest_pins_free(f->pins);
    f->pins = NULL;
    if (f->root[0] && strncmp(f->root, "/tmp/sn_test_pins_", 18) == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->root);
        if (system(cmd) != 0) fprintf(stderr, "  (could not remove %s)\n", f->root);
    }
}

/* A fixture that cannot be built fails the test, which stops there (like
 * SKIP, it returns from the test function). */
#define FX_SETUP_OR_RETURN(f, sharded)                                                                 \
    do {                                                                                               \
        if (fx_setup(f, sharded) != 0) {                                                               \
            CHECK(!"fixture setup");                                                                   \
            fx_teardown(f);                                                                            \
            return;                                                                                    \
        }                                                                                              \
    } while (0)

static sn_status load(const fixture *f, const sn_manifest_pins *pins, sn_model **m)
{
    sn_load_opts lo = { .backend = SN_BACKEND_CPU, .n_threads = 1, .pins = pins };
    return sn_model_load(f->model, &lo, m);
}

/* Loads (with pins) must be refused with SN_E_VERIFY and a message naming rel. */
static void expect_refused(const fixture *f, const char *rel, const char *why)
{
    sn_model *m = NULL;
    char want[256];
    snprintf(want, sizeof want, "model file %s changed after the manifest was verified", rel);
    sn_status s = load(f, f->pins, &m);
    CHECKF(s == SN_E_VERIFY, "%s: got %s: %s", why, sn_status_name(s), sn_errmsg());
    CHECKF(strstr(sn_errmsg(), want) != NULL, "%s: %s", why, sn_errmsg());
    CHECK(m == NULL);
    sn_model_free(m);
}

/* Replace model/rel by renaming another file over it (a new inode). */
static int rename_over(const fixture *f, const char *rel, const void *bytes, size_t n)
{
    char p[256], q[256];
    path_in(p, sizeof p, f, rel);
    snprintf(q, sizeof q, "%s/replacement", f->root);
    if (write_file(q, bytes, n) != 0) return -1;
    return rename(q, p);
}

static int read_all(const char *path, char **buf, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    *buf = malloc(1 << 22);
    *n = *buf ? fread(*buf, 1, 1 << 22, fp) : 0;
    fclose(fp);
    return *buf && *n > 0 ? 0 : -1;
}

/* Untouched: loads with pins, and the model is the one a plain load gives
 * (same logits bit for bit). */
static void test_untouched_loads(void)
{
    fixture f;
    sn_model *a = NULL, *b = NULL;
    sn_seq *sa = NULL, *sb = NULL;
    FX_SETUP_OR_RETURN(&f, 1);
    CHECK_OK(load(&f, f.pins, &a));
    CHECK_OK(load(&f, NULL, &b));
    if (a && b) {
        const sn_model_info *ia = sn_model_get_info(a);
        CHECK(ia->weight_bytes == sn_model_get_info(b)->weight_bytes);
        CHECK(ia->n_eos == 1 && ia->eos_ids[0] == 1);   /* generation_config.json was read */
        int V = ia->vocab_size;
        float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
        const int32_t toks[3] = { 5, 17, 300 };
        CHECK_OK(sn_seq_new(a, 16, &sa));
        CHECK_OK(sn_seq_new(b, 16, &sb));
        if (la && lb && sa && sb) {
            CHECK_OK(sn_forward(a, sa, toks, 3, la, false));
            CHECK_OK(sn_forward(b, sb, toks, 3, lb, false));
            CHECK(memcmp(la, lb, (size_t)V * sizeof *la) == 0);
        }
        free(la);
        free(lb);
    }
    /* a second load from the same pins works too: nothing was consumed */
    sn_model *c = NULL;
    CHECK_OK(load(&f, f.pins, &c));
    sn_model_free(c);
    sn_seq_free(sa);
    sn_seq_free(sb);
    sn_model_free(a);
    sn_model_free(b);
    fx_teardown(&f);
}

/* A different weight file renamed over a shard after the gate: refused
 * (while a plain load would have mapped it). */
static void test_shard_replaced(void)
{
    fixture f;
    char p[256], *buf = NULL;
    size_t n = 0;
    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, SHARD2);
    CHECK(read_all(p, &buf, &n) == 0);
    if (buf) {
        /* a valid safetensors file with one weight byte changed */
        buf[n - 3] ^= 0x10;
        CHECK(rename_over(&f, SHARD2, buf, n) == 0);
        expect_refused(&f, SHARD2, "different shard renamed over");
        sn_model *m = NULL;
        CHECK_OK(load(&f, NULL, &m));   /* the gap the pins close */
        sn_model_free(m);
    }
    free(buf);
    fx_teardown(&f);
}

/* The same bytes under a new inode are refused too: the pin is the file the
 * gate hashed, not its content at some later time. */
static void test_identical_copy_renamed_over(void)
{
    fixture f;
    char p[256], *buf = NULL;
    size_t n = 0;
    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, SHARD1);
    CHECK(read_all(p, &buf, &n) == 0);
    if (buf) {
        CHECK(rename_over(&f, SHARD1, buf, n) == 0);
        expect_refused(&f, SHARD1, "identical copy renamed over");
    }
    free(buf);
    fx_teardown(&f);
}

/* Written in place (same inode; content even restored): mtime/ctime moved. */
static void test_shard_written_in_place(void)
{
    fixture f;
    char p[256];
    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, SHARD2);
    CHECK(flip_byte(p, 100) == 0);
    CHECK(flip_byte(p, 100) == 0);
    expect_refused(&f, SHARD2, "written in place");
    fx_teardown(&f);
}

/* Written in place while the load runs (after the shard was opened and
 * mapped, from the progress callback): the loader's recheck after binding
 * and upload refuses it. */
typedef struct {
    const char *path;
    int done;
} midload;

static void write_during_load(void *ud, double frac)
{
    midload *w = ud;
    if (w->done || frac >= 1.0) return;
    usleep(20 * 1000);
    w->done = flip_byte(w->path, 64) == 0 && flip_byte(w->path, 64) == 0 ? 1 : -1;
}

static void test_written_during_load(void)
{
    fixture f;
    char p[256];
    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, SHARD1);
    midload w = { .path = p };
    sn_load_opts lo = { .backend = SN_BACKEND_CPU, .n_threads = 1, .pins = f.pins,
                        .progress = write_during_load, .progress_ud = &w };
    sn_model *m = NULL;
    sn_status s = sn_model_load(f.model, &lo, &m);
    CHECK(w.done == 1);
    CHECKF(s == SN_E_VERIFY, "got %s: %s", sn_status_name(s), sn_errmsg());
    CHECKF(strstr(sn_errmsg(), "model file " SHARD1 " changed after the manifest was verified") != NULL, "%s",
           sn_errmsg());
    CHECK(m == NULL);
    sn_model_free(m);
    fx_teardown(&f);
}

/* The JSON files the loader reads are pinned as well. */
static void test_config_and_index(void)
{
    fixture f;
    char p[256], *buf = NULL;
    size_t n = 0;
    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, "config.json");
    CHECK(read_all(p, &buf, &n) == 0);
    if (buf) {
        CHECK(rename_over(&f, "config.json", buf, n) == 0);
        expect_refused(&f, "config.json", "config.json renamed over");
    }
    free(buf);
    fx_teardown(&f);

    FX_SETUP_OR_RETURN(&f, 1);
    /* an optional file that the gate verified and that is now gone: eos would change */
    path_in(p, sizeof p, &f, "generation_config.json");
    CHECK(unlink(p) == 0);
    expect_refused(&f, "generation_config.json", "generation_config.json removed");
    fx_teardown(&f);

    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, INDEX);
    CHECK(flip_byte(p, 0) == 0);
    CHECK(flip_byte(p, 0) == 0);
    expect_refused(&f, INDEX, "index written in place");
    fx_teardown(&f);

    FX_SETUP_OR_RETURN(&f, 1);
    /* without the index the loader would glob model*.safetensors instead */
    path_in(p, sizeof p, &f, INDEX);
    CHECK(unlink(p) == 0);
    expect_refused(&f, INDEX, "index removed");
    fx_teardown(&f);
}

/* A shard added after the gate (single-file layout, where the loader globs
 * model*.safetensors): not verified, refused before it is mapped. */
static void test_shard_added(void)
{
    fixture f;
    char p[256];
    FX_SETUP_OR_RETURN(&f, 0);
    sn_model *m = NULL;
    CHECK_OK(load(&f, f.pins, &m));   /* the single-file layout loads */
    sn_model_free(m);
    m = NULL;
    path_in(p, sizeof p, &f, "model-extra.safetensors");
    CHECK(copy_file(FX "/model.safetensors", p) == 0);
    sn_status s = load(&f, f.pins, &m);
    CHECKF(s == SN_E_VERIFY, "got %s: %s", sn_status_name(s), sn_errmsg());
    CHECKF(strstr(sn_errmsg(), "model-extra.safetensors: not verified by the manifest") != NULL, "%s", sn_errmsg());
    CHECK(m == NULL);
    fx_teardown(&f);
}

/* The safetensors level: the recheck after use catches an in-place write
 * after the maps were made; misuse is refused. */
static void test_st_recheck(void)
{
    fixture f;
    char p[256];
    sn_st *st = NULL, *plain = NULL;
    FX_SETUP_OR_RETURN(&f, 1);
    CHECK_OK(sn_st_open_pinned(f.model, f.pins, &st));
    if (st) {
        CHECK(sn_st_count(st) > 0);
        CHECK_OK(sn_st_recheck_pins(st, f.pins));
        path_in(p, sizeof p, &f, SHARD1);
        CHECK(flip_byte(p, 200) == 0);
        CHECK(flip_byte(p, 200) == 0);
        CHECK(sn_st_recheck_pins(st, f.pins) == SN_E_VERIFY);
        CHECKF(strstr(sn_errmsg(), "model file " SHARD1 " changed after") != NULL, "%s", sn_errmsg());
    }
    sn_st_close(st);
    /* pins name files of a model dir: a single-file open cannot use them */
    path_in(p, sizeof p, &f, SHARD2);
    st = NULL;
    CHECK(sn_st_open_pinned(p, f.pins, &st) == SN_E_INVALID);
    CHECK(st == NULL);
    /* a plain open has nothing to recheck against */
    CHECK_OK(sn_st_open_pinned(f.model, NULL, &plain));
    if (plain) CHECK(sn_st_recheck_pins(plain, f.pins) == SN_E_INVALID);
    sn_st_close(plain);
    fx_teardown(&f);
}

/* The refusal happens at open, before the shard is mapped (not only in the
 * loader's recheck after use). */
static void test_st_open_refuses(void)
{
    fixture f;
    char p[256], *buf = NULL;
    size_t n = 0;
    sn_st *st = NULL;
    FX_SETUP_OR_RETURN(&f, 1);
    path_in(p, sizeof p, &f, SHARD2);
    CHECK(read_all(p, &buf, &n) == 0);
    if (buf) {
        CHECK(rename_over(&f, SHARD2, buf, n) == 0);
        sn_status s = sn_st_open_pinned(f.model, f.pins, &st);
        CHECKF(s == SN_E_VERIFY, "got %s: %s", sn_status_name(s), sn_errmsg());
        CHECKF(strstr(sn_errmsg(), "model file " SHARD2 " changed after") != NULL, "%s", sn_errmsg());
        CHECK(st == NULL);
        sn_st_close(st);
        /* and config.json at its own open */
        sn_config *c = NULL;
        CHECK_OK(sn_config_load_pinned(f.model, f.pins, &c));
        sn_config_free(c);
        c = NULL;
        path_in(p, sizeof p, &f, "config.json");
        CHECK(flip_byte(p, 3) == 0);
        CHECK(flip_byte(p, 3) == 0);
        CHECK(sn_config_load_pinned(f.model, f.pins, &c) == SN_E_VERIFY);
        CHECK(c == NULL);
    }
    free(buf);
    fx_teardown(&f);
}

/* sn_manifest_pins_open: how absent, listed, unlisted files answer. */
static void test_pins_open(void)
{
    fixture f;
    char p[256];
    int fd = -1;
    FX_SETUP_OR_RETURN(&f, 0);
    CHECK_OK(sn_manifest_pins_open(f.pins, f.model, "config.json", &fd));
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    fd = -1;
    /* absent and unlisted: merely missing (the caller decides if that is fine) */
    CHECK(sn_manifest_pins_open(f.pins, f.model, "tokenizer.json", &fd) == SN_E_MISSING);
    CHECK(fd == -1);
    /* present but unlisted */
    path_in(p, sizeof p, &f, "tokenizer.json");
    CHECK(write_file(p, "{}", 2) == 0);
    CHECK(sn_manifest_pins_open(f.pins, f.model, "tokenizer.json", &fd) == SN_E_VERIFY);
    CHECK(fd == -1);
    /* a FIFO in a pinned file's place: refused, without hanging in open() */
    path_in(p, sizeof p, &f, "generation_config.json");
    CHECK(unlink(p) == 0);
    CHECK(mkfifo(p, 0644) == 0);
    CHECK(sn_manifest_pins_open(f.pins, f.model, "generation_config.json", &fd) == SN_E_VERIFY);
    CHECK(fd == -1);
    CHECK(sn_manifest_pins_open(f.pins, f.model, "../x", &fd) == SN_E_INVALID);
    CHECK(sn_manifest_pins_open(NULL, f.model, "config.json", &fd) == SN_E_INVALID);
    fx_teardown(&f);
}

int main(void)
{
    RUN(test_untouched_loads);
    RUN(test_shard_replaced);
    RUN(test_identical_copy_renamed_over);
    RUN(test_shard_written_in_place);
    RUN(test_written_during_load);
    RUN(test_config_and_index);
    RUN(test_shard_added);
    RUN(test_st_recheck);
    RUN(test_st_open_refuses);
    RUN(test_pins_open);
    return TEST_END();
}
