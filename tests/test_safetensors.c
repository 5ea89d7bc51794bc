/* Safetensors reader/writer: round trips, streaming fill, every kind of
 * corrupt header, sharded checkpoints with an index. */
#include <stdint.h>
#include <stdlib.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "synth_configs.h"
#include "sanctum/config.h"
#include "sanctum/quant.h"
#include "sanctum/safetensors.h"

static char g_dir[64];
static char g_synth[512];   /* build/sanctum-synth, next to build/tests/ */

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
    mkpath(p, sizeof p, "sharded", "adapters.safetensors");   /* not a weight file: ignored */
    write_one(p, "b", 4.0f);
    CHECK_OK(sn_st_open(d, &st));
    CHECK(st && sn_st_count(st) == 2 && ((const float *)sn_st_find(st, "b")->data)[0] == 2.0f);
    sn_st_close(st);
    st = NULL;
    mkpath(p, sizeof p, "sharded", "model-extra.safetensors");
    write_one(p, "b", 3.0f);
    CHECK(sn_st_open(d, &st) == SN_E_FORMAT && strstr(sn_errmsg(), "\"b\"") && strstr(sn_errmsg(), "twice"));
    CHECK(st == NULL);
}


/* ---- sanctum-synth output: names, shapes, quantization, determinism ----- */

static const char *TINY_QWEN2 =
    "{\"model_type\":\"qwen2\",\"hidden_size\":128,\"num_hidden_layers\":2,\"intermediate_size\":160,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":300,\"rope_theta\":1000000.0,"
    "\"tie_word_embeddings\":true,\"eos_token_id\":5}";

static const char *TINY_MISTRAL =
    "{\"model_type\":\"mistral\",\"hidden_size\":96,\"num_hidden_layers\":2,\"intermediate_size\":160,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":256,"
    "\"rope_theta\":1000000000.0,\"tie_word_embeddings\":false,\"eos_token_id\":2}";

static int run_synth(const char *cfg_json, const char *name, const char *extra)
{
    char cfg[256], out[256], cmd[2048];
    snprintf(cfg, sizeof cfg, "%s/%s.json", g_dir, name);
    write_file(cfg, cfg_json, strlen(cfg_json));
    snprintf(out, sizeof out, "%s/%s", g_dir, name);
    snprintf(cmd, sizeof cmd, "%s --config %s --out %s %s 2>%s/%s.log", g_synth, cfg, out, extra, g_dir, name);
    return system(cmd);
}

static int has(const sn_st *st, const char *name, sn_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    const sn_st_tensor *t = sn_st_find(st, name);
    int64_t want[3] = {d0, d1, d2};
    int ok = t && t->dtype == dt && t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) fprintf(stderr, "  tensor %s: %s\n", name, t ? "wrong dtype/shape" : "absent");
    return ok;
}

/* Dequantize a quantized module and check the values are finite, centred
 * and of roughly the intended spread. */
static int sane_module(const sn_st *st, const char *path, int bits, int group, double lo, double hi)
{
    char n[256];
    snprintf(n, sizeof n, "%s.weight", path);
    const sn_st_tensor *w = sn_st_find(st, n);
    snprintf(n, sizeof n, "%s.scales", path);
    const sn_st_tensor *s = sn_st_find(st, n);
    snprintf(n, sizeof n, "%s.biases", path);
    const sn_st_tensor *b = sn_st_find(st, n);
    if (!w || !s || !b) return 0;
    int nd = w->ndim;
    sn_weight W = {.dtype = bits == 4 ? SN_DT_Q4 : SN_DT_Q8, .rows = w->shape[nd - 2],
                   .cols = w->shape[nd - 1] * 32 / bits, .n_experts = nd == 3 ? w->shape[0] : 0, .group = group,
                   .data = w->data, .scales = s->data, .qbiases = b->data, .sdtype = SN_DT_BF16};
    float *out = malloc(sizeof(float) * (size_t)(W.rows * W.cols));
    double sum = 0, sq = 0;
    int ok = sn_weight_to_f32(&W, 0, out) == SN_OK;
    for (int64_t i = 0; ok && i < W.rows * W.cols; i++) {
        ok = isfinite(out[i]);
        sum += out[i];
        sq += (double)out[i] * out[i];
    }
    double n_ = (double)(W.rows * W.cols), mean = sum / n_, sd = sqrt(sq / n_ - mean * mean);
    free(out);
    if (!ok || fabs(mean) > 0.2 * sd || sd < lo || sd > hi) {
        fprintf(stderr, "  %s: mean %g sd %g (want sd in [%g, %g])\n", path, mean, sd, lo, hi);
        return 0;
    }
    return 1;
}

static void test_synth_checkpoints(void)
{
    if (access(g_synth, X_OK) != 0) SKIP("build/sanctum-synth not built");
    char d[256];
    sn_st *st = NULL;
    sn_config *c = NULL;

    /* qwen3_5_moe, forced into shards */
    CHECK(run_synth(TINY_MOE, "moe", "--seed 3 --shard-size 300K") == 0);
    snprintf(d, sizeof d, "%s/moe/model.safetensors.index.json", g_dir);
    CHECK(access(d, F_OK) == 0);
    snprintf(d, sizeof d, "%s/moe", g_dir);
    CHECK_OK(sn_st_open(d, &st));
    CHECK_OK(sn_config_load(d, &c));
    if (st && c) {
        const char *L0 = "language_model.model.layers.0.", *L3 = "language_model.model.layers.3.";
        char n[256];
#define HAS(pfx, suffix, dt, nd, a, b, cc) (snprintf(n, sizeof n, "%s%s", pfx, suffix), has(st, n, dt, nd, a, b, cc))
        CHECK(HAS("", "language_model.model.embed_tokens.weight", SN_DT_U32, 2, 512, 16, 0));
        CHECK(HAS("", "language_model.model.embed_tokens.scales", SN_DT_BF16, 2, 512, 2, 0));
        CHECK(HAS("", "language_model.lm_head.weight", SN_DT_U32, 2, 512, 16, 0));
        CHECK(HAS("", "language_model.model.norm.weight", SN_DT_BF16, 1, 128, 0, 0));
        CHECK(HAS(L0, "linear_attn.in_proj_qkv.weight", SN_DT_U32, 2, 256, 16, 0));
        CHECK(HAS(L0, "linear_attn.in_proj_z.weight", SN_DT_U32, 2, 128, 16, 0));
        CHECK(HAS(L0, "linear_attn.in_proj_b.weight", SN_DT_U32, 2, 4, 16, 0));
        CHECK(HAS(L0, "linear_attn.conv1d.weight", SN_DT_BF16, 3, 256, 4, 1));
        CHECK(HAS(L0, "linear_attn.A_log", SN_DT_F32, 1, 4, 0, 0));
        CHECK(HAS(L0, "linear_attn.dt_bias", SN_DT_BF16, 1, 4, 0, 0));
        CHECK(HAS(L0, "linear_attn.norm.weight", SN_DT_BF16, 1, 32, 0, 0));
        CHECK(HAS(L0, "linear_attn.out_proj.weight", SN_DT_U32, 2, 128, 16, 0));
        CHECK(HAS(L0, "mlp.gate.weight", SN_DT_U32, 2, 8, 32, 0));            /* router: 8-bit */
        CHECK(HAS(L0, "mlp.shared_expert_gate.weight", SN_DT_U32, 2, 1, 32, 0));
        CHECK(HAS(L0, "mlp.switch_mlp.gate_proj.weight", SN_DT_U32, 3, 8, 64, 16));
        CHECK(HAS(L0, "mlp.switch_mlp.down_proj.weight", SN_DT_U32, 3, 8, 128, 8));
        CHECK(HAS(L0, "mlp.switch_mlp.down_proj.scales", SN_DT_BF16, 3, 8, 128, 1));
        CHECK(HAS(L0, "mlp.shared_expert.down_proj.weight", SN_DT_U32, 2, 128, 8, 0));
        CHECK(HAS(L3, "self_attn.q_proj.weight", SN_DT_U32, 2, 256, 16, 0));   /* [q | gate] per head */
        CHECK(HAS(L3, "self_attn.k_proj.weight", SN_DT_U32, 2, 64, 16, 0));
        CHECK(HAS(L3, "self_attn.q_norm.weight", SN_DT_BF16, 1, 64, 0, 0));
        CHECK(sn_st_find(st, "language_model.model.layers.3.linear_attn.A_log") == NULL);
        CHECK(sn_st_find(st, "language_model.model.layers.0.self_attn.q_proj.weight") == NULL);
#undef HAS
        int bits, group;
        CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.2.mlp.gate", &bits, &group));
        CHECK(bits == 8 && group == 64);
        CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.2.mlp.switch_mlp.up_proj", &bits, &group));
        CHECK(bits == 4 && group == 64);
        CHECK(c->arch == SN_ARCH_QWEN3_5_MOE && c->quantized && c->n_eos == 1);
        CHECK(sane_module(st, "language_model.model.layers.0.linear_attn.in_proj_qkv", 4, 64, 0.06, 0.13));
        CHECK(sane_module(st, "language_model.model.layers.0.mlp.gate", 8, 64, 0.06, 0.13));
        CHECK(sane_module(st, "language_model.model.layers.1.mlp.switch_mlp.down_proj", 4, 64, 0.02, 0.09));
        const sn_st_tensor *nw = sn_st_find(st, "language_model.model.norm.weight");
        float n0 = nw ? sn_load_f32(nw->data, SN_DT_BF16, 0) : 0;
        CHECK(n0 > 0.9f && n0 < 1.1f);   /* stored as 1+w */
        const sn_st_tensor *al = sn_st_find(st, "language_model.model.layers.0.linear_attn.A_log");
        float a0 = al ? ((const float *)al->data)[0] : -1;
        CHECK(a0 >= 0.0f && a0 <= logf(16.0f));
    }
    sn_st_close(st);
    sn_config_free(c);
    st = NULL;
    c = NULL;

    /* same seed -> same bytes; another seed -> other bytes */
    CHECK(run_synth(TINY_QWEN2, "q2a", "--seed 9") == 0);
    CHECK(run_synth(TINY_QWEN2, "q2b", "--seed 9") == 0);
    CHECK(run_synth(TINY_QWEN2, "q2c", "--seed 10") == 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cmp -s %s/q2a/model.safetensors %s/q2b/model.safetensors", g_dir, g_dir);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s/q2a/model.safetensors %s/q2c/model.safetensors", g_dir, g_dir);
    CHECK(system(cmd) != 0);
    snprintf(d, sizeof d, "%s/q2a", g_dir);
    CHECK_OK(sn_st_open(d, &st));
    if (st) {
        /* qwen2: model.* names, q/k/v biases, tied embeddings (no lm_head), o_proj without bias */
        CHECK(has(st, "model.embed_tokens.weight", SN_DT_U32, 2, 300, 16, 0));
        CHECK(has(st, "model.layers.1.self_attn.q_proj.bias", SN_DT_BF16, 1, 128, 0, 0));
        CHECK(has(st, "model.layers.1.self_attn.k_proj.bias", SN_DT_BF16, 1, 64, 0, 0));
        CHECK(has(st, "model.layers.1.self_attn.q_proj.biases", SN_DT_BF16, 2, 128, 2, 0));
        CHECK(has(st, "model.layers.1.mlp.down_proj.weight", SN_DT_BF16, 2, 128, 160, 0));  /* 160 % 64 != 0: dense */
        CHECK(sn_st_find(st, "model.layers.1.self_attn.o_proj.bias") == NULL);
        CHECK(sn_st_find(st, "lm_head.weight") == NULL);
        CHECK(strcmp(sn_st_metadata(st, "format"), "mlx") == 0);
        sn_st_close(st);
        st = NULL;
    }

    /* mistral at 8 bits, group 32 */
    CHECK(run_synth(TINY_MISTRAL, "mis", "--bits 8 --group 32") == 0);
    snprintf(d, sizeof d, "%s/mis", g_dir);
    CHECK_OK(sn_st_open(d, &st));
    CHECK_OK(sn_config_load(d, &c));
    if (st && c) {
        CHECK(has(st, "model.layers.0.self_attn.q_proj.weight", SN_DT_U32, 2, 128, 24, 0));
        CHECK(has(st, "model.layers.0.self_attn.o_proj.scales", SN_DT_BF16, 2, 96, 4, 0));
        CHECK(has(st, "lm_head.weight", SN_DT_U32, 2, 256, 24, 0));
        CHECK(sn_st_find(st, "model.layers.0.self_attn.q_proj.bias") == NULL);
        CHECK(c->q_bits == 8 && c->q_group == 32 && c->n_q_overrides == 0);
        CHECK(sane_module(st, "model.layers.0.mlp.up_proj", 8, 32, 0.07, 0.14));
    }
    sn_st_close(st);
    sn_config_free(c);

    /* bad input is reported, not written */
    CHECK(run_synth("{\"model_type\":\"llama\"}", "bad", "") != 0);
    CHECK(run_synth(TINY_QWEN2, "badbits", "--bits 3") != 0);
    snprintf(d, sizeof d, "%s/bad.log", g_dir);
    FILE *f = fopen(d, "r");
    char line[512] = "";
    if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
    CHECKF(strstr(line, "unsupported model_type \"llama\""), "log: %s", line);
}

/* is the page at byte off of fd's file (size bytes) in the page cache? */
static bool cached_at(int fd, size_t size, size_t off)
{
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return false;
    unsigned char vec[1] = { 0 };
    long pg = sysconf(_SC_PAGESIZE);
    size_t at = off & ~(size_t)(pg - 1);
    bool in = mincore((char *)m + at, 1, vec) == 0 && (vec[0] & 1);
    munmap(m, size);
    return in;
}

/* sn_st_copy_to_memory: the same bytes at new addresses (the same offsets
 * within a page), read-only, and a copy: a later write to the file does not
 * show. A 3 MB tensor makes a file that crosses a 2 MB page. */
static void test_copy_to_memory(void)
{
    char d[128], p[160];
    snprintf(d, sizeof d, "%s/copied", g_dir);
    mkdir(d, 0755);
    mkpath(p, sizeof p, "copied", "model-00001-of-00002.safetensors");
    write_one(p, "a", 1.0f);
    const int64_t n = 3 << 18; /* 3 MB of f32 */
    float *big = malloc((size_t)n * sizeof *big);
    SN_ASSERT(big);
    for (int64_t i = 0; i < n; i++) big[i] = (float)i * 0.5f;
    sn_st_writer *w = NULL;
    CHECK_OK(sn_st_writer_new(&w));
    CHECK_OK(sn_st_writer_add(w, "big", SN_DT_F32, 1, &n, big));
    mkpath(p, sizeof p, "copied", "model-00002-of-00002.safetensors");
    CHECK_OK(sn_st_writer_write(w, p, NULL, NULL));
    sn_st_writer_free(w);

    /* on disk, so that the page cache holds clean pages the copy can drop */
    int sfd = open(p, O_RDONLY);
    CHECK(sfd >= 0 && fsync(sfd) == 0);
    size_t big_size = (size_t)lseek(sfd, 0, SEEK_END);
    bool was_cached = false, tmpfs = false;
    struct statfs sfs;
    if (fstatfs(sfd, &sfs) == 0) tmpfs = sfs.f_type == TMPFS_MAGIC;
    const size_t probe = (size_t)2 << 20; /* a page well past the header */
    was_cached = cached_at(sfd, big_size, probe);

    sn_st *st = NULL;
    CHECK_OK(sn_st_open(d, &st));
    if (!st) { free(big); close(sfd); return; }
    const void *before[2] = { sn_st_find(st, "a")->data, sn_st_find(st, "big")->data };
    CHECK_OK(sn_st_copy_to_memory(st, true));
    /* drop_cache: the copied stretch left the page cache */
    if (was_cached && !tmpfs) CHECK(!cached_at(sfd, big_size, probe));
    else printf("  (page-cache drop not observable here: %s)\n", tmpfs ? "tmpfs" : "the file was not cached");
    close(sfd);
    const sn_st_tensor *a = sn_st_find(st, "a"), *b = sn_st_find(st, "big");
    CHECK(a->data != before[0] && b->data != before[1]);
    CHECK(((uintptr_t)a->data & 4095) == ((uintptr_t)before[0] & 4095));
    CHECK(((uintptr_t)b->data & 4095) == ((uintptr_t)before[1] & 4095));
    CHECK(((const float *)a->data)[0] == 1.0f && ((const float *)a->data)[1] == 1.0f);
    CHECK(b->nbytes == (size_t)n * 4 && memcmp(b->data, big, b->nbytes) == 0);
    CHECK_OK(sn_st_copy_to_memory(st, false)); /* again: nothing left to copy */
    CHECK(sn_st_find(st, "big")->data == b->data);
    /* the file's bytes overwritten in place (which a mapping would show):
     * the copy keeps the ones it read */
    mkpath(p, sizeof p, "copied", "model-00001-of-00002.safetensors");
    int fd = open(p, O_RDWR);
    uint64_t hl = 0;
    const float nine = 9.0f;
    CHECK(fd >= 0 && pread(fd, &hl, 8, 0) == 8 && pwrite(fd, &nine, 4, (off_t)(8 + hl)) == 4);
    if (fd >= 0) close(fd);
    CHECK(((const float *)a->data)[0] == 1.0f && ((const float *)a->data)[1] == 1.0f);
    /* read-only: a write faults (in a child, so the fault is observed, not suffered) */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        *(volatile float *)b->data = 2.0f;
        _exit(0);
    }
    int wst = 0;
    CHECK(pid > 0 && waitpid(pid, &wst, 0) == pid);
    CHECKF(WIFSIGNALED(wst) && (WTERMSIG(wst) == SIGSEGV || WTERMSIG(wst) == SIGBUS),
           "a write to the copied weights was not refused (status 0x%x)", wst);
    sn_st_close(st);

    /* an in-memory image stays where it is */
    size_t len;
    uint8_t *img = image("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    CHECK_OK(sn_st_open_mem(img, len, "mem.safetensors", &st));
    if (st) {
        const void *x = sn_st_find(st, "x")->data;
        CHECK_OK(sn_st_copy_to_memory(st, false));
        CHECK(sn_st_find(st, "x")->data == x);
        sn_st_close(st);
    }
    free(img);
    CHECK(sn_st_copy_to_memory(NULL, false) == SN_E_INVALID);
    free(big);
}

int main(int argc, char **argv)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/sn_test_st_XXXXXX");
    SN_ASSERT(mkdtemp(g_dir));
    RUN(test_round_trip);
    RUN(test_streaming_fill);
    RUN(test_corrupt_headers);
    RUN(test_truncated_file);
    RUN(test_sharded);
    RUN(test_copy_to_memory);
    const char *slash = strrchr(argv[0], '/');
    snprintf(g_synth, sizeof g_synth, "%.*s/../sanctum-synth", slash ? (int)(slash - argv[0]) : 1,
             slash ? argv[0] : ".");
    RUN(test_synth_checkpoints);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_END();
}
