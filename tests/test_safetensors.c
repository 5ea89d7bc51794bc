/* Safetensors reader/writer: round trips, streaming fill, every kind of
 * corrupt header, sharded checkpoints with an index. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "sanctum/safetensors.h"

static char g_dir[64];

static void mkpath(char *out, size_t n, const char *sub, const char *name)
{
    snprintf(out, n, "%s/%s%s%s", g_dir, sub, sub[0] ? "/" : "", name);
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    SN_ASSERT(f);
    SN_ASSERT(fwrite(buf, 1, len, f) == len);
    fclose(f);
}

/* A file image: 8-byte length, the header text, data_len zero bytes. */
static uint8_t *image(const char *hdr, size_t data_len, size_t *len)
{
    size_t hl = strlen(hdr);
    *len = 8 + hl + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    return b;
}

/* Open the image from memory; expect failure with code and a message that
 * contains every one of the given fragments. */
static int rejects(const char *hdr, size_t data_len, sn_status want, const char *frag1, const char *frag2)
{
    size_t len;
    uint8_t *b = image(hdr, data_len, &len);
    sn_st *st = NULL;
    sn_status rc = sn_st_open_mem(b, len, "bad.safetensors", &st);
    int ok = rc == want && st == NULL && strstr(sn_errmsg(), "bad.safetensors") &&
             (!frag1 || strstr(sn_errmsg(), frag1)) && (!frag2 || strstr(sn_errmsg(), frag2));
    if (!ok) fprintf(stderr, "  header %s -> %s: %s\n", hdr, sn_status_name(rc), sn_errmsg());
    sn_st_close(st);
    free(b);
    return ok;
}

static void test_round_trip(void)
{
    float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
    uint16_t bf[3] = {sn_f32_to_bf16(1.0f), sn_f32_to_bf16(-0.5f), sn_f32_to_bf16(2.0f)};
    uint32_t u32[4] = {0xdeadbeefu, 1, 2, 0xffffffffu};
    int8_t i8[5] = {-128, -1, 0, 1, 127};
    int32_t scalar = -42;
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s22[2] = {2, 2}, s5[1] = {5}, s0[2] = {4, 0};
    sn_st_writer *w = NULL;
    CHECK_OK(sn_st_writer_new(&w));
    CHECK_OK(sn_st_writer_add(w, "z.int8", SN_DT_I8, 1, s5, i8));  /* 1-byte first: layout must reorder */
    CHECK_OK(sn_st_writer_add(w, "a.f32", SN_DT_F32, 2, s23, f32));
    CHECK_OK(sn_st_writer_add(w, "b.bf16", SN_DT_BF16, 1, s3, bf));
    CHECK_OK(sn_st_writer_add(w, "c.u32", SN_DT_U32, 2, s22, u32));
    CHECK_OK(sn_st_writer_add(w, "d.scalar", SN_DT_I32, 0, NULL, &scalar));
    CHECK_OK(sn_st_writer_add(w, "e.empty", SN_DT_F16, 2, s0, NULL));
    CHECK(sn_st_writer_add(w, "a.f32", SN_DT_F32, 2, s23, f32) == SN_E_INVALID);  /* duplicate */
    CHECK(sn_st_writer_add(w, "q", SN_DT_Q4, 1, s3, f32) == SN_E_INVALID);        /* not storable */
    CHECK(sn_st_writer_count(w) == 6);
    CHECK(sn_st_writer_data_bytes(w) == 24 + 6 + 16 + 5 + 4);
    char path[128];
    mkpath(path, sizeof path, "", "rt.safetensors");
    CHECK_OK(sn_st_writer_write(w, path, NULL, NULL));
    sn_st_writer_free(w);

    sn_st *st = NULL;
    CHECK_OK(sn_st_open(path, &st));
    if (!st) return;
    CHECK(sn_st_count(st) == 6);
    CHECK(sn_st_data_bytes(st) == 55);
    CHECK(sn_st_metadata(st, "format") && strcmp(sn_st_metadata(st, "format"), "mlx") == 0);
    CHECK(sn_st_metadata(st, "nope") == NULL);
    const sn_st_tensor *t = sn_st_find(st, "a.f32");
    CHECK(t && t->dtype == SN_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
          t->nbytes == 24 && memcmp(t->data, f32, 24) == 0 && strcmp(t->file, path) == 0);
    CHECK(t && ((uintptr_t)t->data & 3) == 0);
    t = sn_st_find(st, "b.bf16");
    CHECK(t && t->dtype == SN_DT_BF16 && sn_load_f32(t->data, SN_DT_BF16, 1) == -0.5f);
    CHECK(t && ((uintptr_t)t->data & 1) == 0);
    t = sn_st_find(st, "c.u32");
    CHECK(t && t->dtype == SN_DT_U32 && memcmp(t->data, u32, 16) == 0 && ((uintptr_t)t->data & 3) == 0);
    t = sn_st_find(st, "z.int8");
    CHECK(t && t->dtype == SN_DT_I8 && memcmp(t->data, i8, 5) == 0);
    t = sn_st_find(st, "d.scalar");
    CHECK(t && t->ndim == 0 && sn_st_numel(t) == 1 && t->nbytes == 4 && memcmp(t->data, &scalar, 4) == 0);
    t = sn_st_find(st, "e.empty");
    CHECK(t && t->nbytes == 0 && t->data == NULL && sn_st_numel(t) == 0);
    CHECK(sn_st_find(st, "missing") == NULL);
    /* iteration is sorted by name */
    for (size_t i = 1; i < sn_st_count(st); i++) CHECK(strcmp(sn_st_at(st, i - 1)->name, sn_st_at(st, i)->name) < 0);
    sn_st_close(st);
    sn_st_close(NULL);
    sn_st_writer_free(NULL);
}

/* The fill callback writes a deterministic pattern spanning several chunks. */
static sn_status fill_pattern(void *ctx, size_t index, const char *name, size_t offset, void *buf, size_t len)
{
    int *calls = ctx;
    (*calls)++;
    uint8_t *b = buf;
    for (size_t i = 0; i < len; i++) b[i] = (uint8_t)((offset + i) * 7 + index);
    return SN_OK;
}

static void test_streaming_fill(void)
{
    sn_st_writer *w = NULL;
    CHECK_OK(sn_st_writer_new(&w));
    CHECK_OK(sn_st_writer_set_meta(w, "note", "streamed"));
    int64_t big[2] = {3, (int64_t)3 << 20};   /* 9M U8 = 3 chunks of 4 MB */
    int64_t small[1] = {10};
    CHECK_OK(sn_st_writer_add(w, "big", SN_DT_U8, 2, big, NULL));
    CHECK_OK(sn_st_writer_add(w, "small", SN_DT_U32, 1, small, NULL));
    char path[128];
    mkpath(path, sizeof path, "", "fill.safetensors");
    CHECK(sn_st_writer_write(w, path, NULL, NULL) == SN_E_INVALID);   /* no data, no callback */
    CHECK(access(path, F_OK) != 0);
    int calls = 0;
    CHECK_OK(sn_st_writer_write(w, path, fill_pattern, &calls));
    CHECK(calls == 4);
    sn_st_writer_free(w);
    sn_st *st = NULL;
    CHECK_OK(sn_st_open(path, &st));
    if (!st) return;
    CHECK(strcmp(sn_st_metadata(st, "note"), "streamed") == 0 && strcmp(sn_st_metadata(st, "format"), "mlx") == 0);
    const sn_st_tensor *t = sn_st_find(st, "big");
    int good = t && t->nbytes == (size_t)9 << 20;
    for (size_t i = 0; good && i < t->nbytes; i += 4093)
        good = ((const uint8_t *)t->data)[i] == (uint8_t)(i * 7 + 0);
    CHECK(good);
    t = sn_st_find(st, "small");
    CHECK(t && ((const uint8_t *)t->data)[5] == (uint8_t)(5 * 7 + 1));
    sn_st_close(st);
    unlink(path);
}

static void test_corrupt_headers(void)
{
    const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    size_t len;
    uint8_t *b = image(ok, 16, &len);
    sn_st *st = NULL;
    CHECK_OK(sn_st_open_mem(b, len, "good", &st));
    CHECK(st && sn_st_count(st) == 1);
    sn_st_close(st);
    st = NULL;
    /* too short for the length word; length past the end; absurd length */
    CHECK(sn_st_open_mem(b, 5, "bad.safetensors", &st) == SN_E_FORMAT && strstr(sn_errmsg(), "too short"));
    CHECK(sn_st_open_mem(b, 20, "bad.safetensors", &st) == SN_E_FORMAT && strstr(sn_errmsg(), "exceeds"));
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x10};
    CHECK(sn_st_open_mem(huge, 16, "bad.safetensors", &st) == SN_E_FORMAT && strstr(sn_errmsg(), "out of range"));
    free(b);

    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",", 0, SN_E_FORMAT, "line 1", "column"));
    CHECK(rejects("[1,2,3]", 0, SN_E_FORMAT, "not a JSON object", NULL));
    CHECK(rejects("{\"w\":7}", 0, SN_E_FORMAT, "\"w\"", "not an object"));
    CHECK(rejects("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SN_E_FORMAT, "\"w\"", "dtype"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, SN_E_UNSUPPORTED,
                  "\"w\"", "F64"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, SN_E_FORMAT, "\"w\"", "shape"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, SN_E_FORMAT, "\"w\"",
                  "shape[0]"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, SN_E_FORMAT, "\"w\"",
                  "shape[0]"));
    CHECK(rejects("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                  SN_E_FORMAT, "\"w\"", "rank 9"));
    CHECK(rejects("{\"w\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,1]}}", 1,
                  SN_E_FORMAT, "\"w\"", "overflows"));
    CHECK(rejects("{\"w\":{\"dtype\":\"U8\",\"shape\":[4000000000000],\"data_offsets\":[0,1]}}", 1,
                  SN_E_FORMAT, "\"w\"", "out of range"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, SN_E_FORMAT, "\"w\"",
                  "data_offsets"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, SN_E_FORMAT, "\"w\"",
                  "bad data_offsets"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, SN_E_FORMAT, "\"w\"",
                  "bad data_offsets"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12, SN_E_FORMAT, "\"w\"",
                  "past the data"));
    CHECK(rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, SN_E_FORMAT, "\"w\"",
                  "needs 12"));
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, SN_E_FORMAT, "\"a\"",
                  "overlap"));
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, SN_E_FORMAT, "duplicate",
                  "\"a\""));
    CHECK(rejects("{\"__metadata__\":{\"format\":1}}", 0, SN_E_FORMAT, "__metadata__", "format"));
    CHECK(rejects("{\"__metadata__\":[]}", 0, SN_E_FORMAT, "__metadata__", NULL));
    CHECK(rejects("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SN_E_FORMAT, "empty name",
                  NULL));
    /* zero-sized tensors own no bytes, so sharing an offset is fine */
    size_t l2;
    uint8_t *b2 = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &l2);
    CHECK_OK(sn_st_open_mem(b2, l2, "ok", &st));
    sn_st_close(st);
    free(b2);
}

static void test_truncated_file(void)
{
    float v[64] = {0};
    int64_t s[1] = {64};
    sn_st_writer *w = NULL;
    CHECK_OK(sn_st_writer_new(&w));
    CHECK_OK(sn_st_writer_add(w, "layer.weight", SN_DT_F32, 1, s, v));
    char path[128];
    mkpath(path, sizeof path, "", "trunc.safetensors");
    CHECK_OK(sn_st_writer_write(w, path, NULL, NULL));
    sn_st_writer_free(w);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(truncate(path, sb.st_size - 10) == 0);
    sn_st *st = NULL;
    sn_status rc = sn_st_open(path, &st);
    CHECKF(rc == SN_E_FORMAT && strstr(sn_errmsg(), "trunc.safetensors") && strstr(sn_errmsg(), "layer.weight") &&
           strstr(sn_errmsg(), "truncated"), "%s", sn_errmsg());
    CHECK(truncate(path, 3) == 0);
    CHECK(sn_st_open(path, &st) == SN_E_FORMAT && strstr(sn_errmsg(), "trunc.safetensors"));
    CHECK(st == NULL);
    CHECK(sn_st_open("/nonexistent/x.safetensors", &st) == SN_E_IO);
    unlink(path);
}

static void write_one(const char *path, const char *name, float val)
{
    int64_t s[1] = {2};
    float v[2] = {val, val};
    sn_st_writer *w = NULL;
    CHECK_OK(sn_st_writer_new(&w));
    CHECK_OK(sn_st_writer_add(w, name, SN_DT_F32, 1, s, v));
    CHECK_OK(sn_st_writer_write(w, path, NULL, NULL));
    sn_st_writer_free(w);
}

static void test_sharded(void)
{
    char d[128], p[160];
    snprintf(d, sizeof d, "%s/sharded", g_dir);
    mkdir(d, 0755);
    mkpath(p, sizeof p, "sharded", "model-00001-of-00002.safetensors");
    write_one(p, "a", 1.0f);
    mkpath(p, sizeof p, "sharded", "model-00002-of-00002.safetensors");
    write_one(p, "b", 2.0f);
    mkpath(p, sizeof p, "sharded", "model.safetensors.index.json");
    const char *good = "{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"b\":\"model-00002-of-00002.safetensors\"}}";
    write_file(p, good, strlen(good));
    sn_st *st = NULL;
    CHECK_OK(sn_st_open(d, &st));
    if (st) {
        CHECK(sn_st_count(st) == 2);
        const sn_st_tensor *a = sn_st_find(st, "a"), *b = sn_st_find(st, "b");
        CHECK(a && ((const float *)a->data)[1] == 1.0f && strstr(a->file, "00001"));
        CHECK(b && ((const float *)b->data)[0] == 2.0f && strstr(b->file, "00002"));
        sn_st_close(st);
        st = NULL;
    }
    const char *wrong_file = "{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\","
                             "\"b\":\"model-00002-of-00002.safetensors\"}}";
    write_file(p, wrong_file, strlen(wrong_file));
    CHECK(sn_st_open(d, &st) == SN_E_MISSING && strstr(sn_errmsg(), "\"a\""));
    const char *trav = "{\"weight_map\":{\"a\":\"../rt.safetensors\"}}";
    write_file(p, trav, strlen(trav));
    CHECK(sn_st_open(d, &st) == SN_E_FORMAT && strstr(sn_errmsg(), "../rt.safetensors"));
    const char *nomap = "{\"metadata\":{}}";
    write_file(p, nomap, strlen(nomap));
    CHECK(sn_st_open(d, &st) == SN_E_FORMAT && strstr(sn_errmsg(), "weight_map"));
    const char *badjson = "{\"weight_map\":{\"a\":}";
    write_file(p, badjson, strlen(badjson));
    CHECK(sn_st_open(d, &st) == SN_E_FORMAT && strstr(sn_errmsg(), "index.json") && strstr(sn_errmsg(), "line"));
    const char *absent = "{\"weight_map\":{\"a\":\"model-00003-of-00002.safetensors\"}}";
    write_file(p, absent, strlen(absent));
    CHECK(sn_st_open(d, &st) == SN_E_IO && strstr(sn_errmsg(), "00003"));
    /* no index: every .safetensors in the directory; the same name twice is refused */
    unlink(p);
    CHECK_OK(sn_st_open(d, &st));
    CHECK(st && sn_st_count(st) == 2);
    sn_st_close(st);
    st = NULL;
    mkpath(p, sizeof p, "sharded", "model-extra.safetensors");
    write_one(p, "b", 3.0f);
    CHECK(sn_st_open(d, &st) == SN_E_FORMAT && strstr(sn_errmsg(), "\"b\"") && strstr(sn_errmsg(), "twice"));
    CHECK(st == NULL);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/sn_test_st_XXXXXX");
    SN_ASSERT(mkdtemp(g_dir));
    RUN(test_round_trip);
    RUN(test_streaming_fill);
    RUN(test_corrupt_headers);
    RUN(test_truncated_file);
    RUN(test_sharded);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_END();
}
