/* Forged bad checkpoints in MLX layout, end to end through sn_model_load.
 *
 * A small sharded qwen3_5_moe checkpoint is written by sanctum-synth, then
 * each case copies it and breaks one thing: a shard missing or truncated,
 * the index pointing at the wrong shard, a header with overlapping offsets,
 * a dtype we do not read, a tensor defined twice, scales of the wrong
 * shape or missing, quantization in config.json disagreeing with the packed
 * weights. Every case must fail with the right code and a message that
 * names the file or tensor at fault, never crash and never return a model. */
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "synth_configs.h"
#include "sanctum/model.h"

static char g_root[128];
static char g_base[192];
static char g_synth[512];

#define LP "language_model.model.layers."

static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* A fresh copy of the good checkpoint at g_root/name. */
static const char *copy_base(const char *name, char *dir, size_t n)
{
    snprintf(dir, n, "%s/%s", g_root, name);
    SN_ASSERT(sh("rm -rf %s && cp -r %s %s", dir, g_base, dir) == 0);
    return dir;
}

/* The shard file (full path) that the index lists tensor in. */
static void shard_of(const char *dir, const char *tensor, char *out, size_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    SN_ASSERT(idx);
    const char *f = json_string_value(json_object_get(json_object_get(idx, "weight_map"), tensor));
    SN_ASSERT(f);
    snprintf(out, n, "%s/%s", dir, f);
    json_decref(idx);
}

/* Rewrite a shard's header through edit(); the data bytes stay as they were. */
static void patch_header(const char *path, void (*edit)(json_t *hdr, void *ctx), void *ctx)
{
    FILE *f = fopen(path, "rb");
    SN_ASSERT(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len);
    SN_ASSERT(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    json_t *hdr = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    SN_ASSERT(hdr);
    edit(hdr, ctx);
    char *hs = json_dumps(hdr, JSON_COMPACT);
    size_t nl = strlen(hs);
    f = fopen(path, "wb");
    SN_ASSERT(f);
    uint8_t l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (uint8_t)((uint64_t)nl >> (8 * i));
    SN_ASSERT(fwrite(l8, 1, 8, f) == 8 && fwrite(hs, 1, nl, f) == nl &&
              fwrite(b + 8 + hl, 1, (size_t)len - 8 - hl, f) == (size_t)len - 8 - hl);
    fclose(f);
    free(hs);
    json_decref(hdr);
    free(b);
}

static void edit_index(const char *dir, const char *tensor, const char *new_file /* NULL: remove */)
{
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    if (new_file) json_object_set_new(wm, tensor, json_string(new_file));
    else json_object_del(wm, tensor);
    SN_ASSERT(json_dump_file(idx, p, JSON_INDENT(1)) == 0);
    json_decref(idx);
}

static void edit_config_quant(const char *dir, int bits, int group)
{
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *c = json_load_file(p, 0, NULL);
    const char *keys[2] = {"quantization", "quantization_config"};
    for (int k = 0; k < 2; k++) {
        json_t *q = json_object_get(c, keys[k]);
        json_object_set_new(q, "bits", json_integer(bits));
        json_object_set_new(q, "group_size", json_integer(group));
    }
    SN_ASSERT(json_dump_file(c, p, JSON_INDENT(1)) == 0);
    json_decref(c);
}

/* Load dir; expect code and a message holding both needles. */
static void expect_fail(const char *dir, sn_status code, const char *needle1, const char *needle2)
{
    sn_model *m = NULL;
    sn_load_opts o = {.n_threads = 1};
    sn_status s = sn_model_load(dir, &o, &m);
    CHECKF(s == code, "got %s (%s), expected %s", sn_status_name(s), sn_errmsg(), sn_status_name(code));
    CHECKF(strstr(sn_errmsg(), needle1) && (!needle2 || strstr(sn_errmsg(), needle2)),
           "message '%s' lacks '%s'%s%s", sn_errmsg(), needle1, needle2 ? " / " : "", needle2 ? needle2 : "");
    CHECK(m == NULL);
    sn_model_free(m);
}

static void test_good_loads(void)
{
    sn_model *m = NULL;
    sn_load_opts o = {.n_threads = 1};
    CHECK_OK(sn_model_load(g_base, &o, &m));
    if (!m) return;
    const sn_model_info *in = sn_model_get_info(m);
    CHECK(in->mlx_layout && in->n_layers == 4 && in->vocab_size == 512 && strcmp(in->model_type, "qwen3_5_moe") == 0);
    sn_seq *s = NULL;
    CHECK_OK(sn_seq_new(m, 16, &s));
    int32_t ids[4] = {1, 100, 200, 511};
    float *lg = malloc(sizeof(float) * 512);
    CHECK_OK(sn_forward(m, s, ids, 4, lg, false));
    int finite = 1;
    float lo = lg[0], hi = lg[0];
    for (int i = 0; i < 512; i++) {
        finite &= isfinite(lg[i]);
        lo = fminf(lo, lg[i]);
        hi = fmaxf(hi, lg[i]);
    }
    CHECK(finite && hi > lo);   /* random weights give varied, finite logits */
    free(lg);
    sn_seq_free(s);
    sn_model_free(m);
}

static void test_missing_shard(void)
{
    char d[256], sh2[512];
    copy_base("noshard", d, sizeof d);
    shard_of(d, LP "1.mlp.switch_mlp.up_proj.weight", sh2, sizeof sh2);
    CHECK(unlink(sh2) == 0);
    const char *base = strrchr(sh2, '/') + 1;
    expect_fail(d, SN_E_IO, base, NULL);
}

/* Regression: a FIFO in place of config.json, generation_config.json, the
 * index or a shard blocked the load forever in open(); a device as a shard
 * was already refused, /dev/zero as config.json was read up to 16 MB. Each
 * is now "not a regular file", naming it. */
static void test_not_regular_files(void)
{
    const char *names[] = { "config.json", "generation_config.json", "model.safetensors.index.json", NULL };
    char d[256], p[600];
    for (int i = 0; i < 4; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "fifo%d", i);
        copy_base(sub, d, sizeof d);
        if (names[i]) snprintf(p, sizeof p, "%s/%s", d, names[i]);
        else shard_of(d, LP "1.mlp.switch_mlp.up_proj.weight", p, sizeof p);
        unlink(p);
        CHECK(mkfifo(p, 0600) == 0);
        /* the load runs in a child so that a regression fails the test instead of hanging it */
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20);
            sn_model *m = NULL;
            sn_load_opts o = {.n_threads = 1};
            sn_status s = sn_model_load(d, &o, &m);
            const char *base = strrchr(p, '/') + 1;
            _exit(s == SN_E_IO && strstr(sn_errmsg(), "not a regular file") && strstr(sn_errmsg(), base) ? 0 : 1);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "FIFO as %s: not refused (status %d)",
               names[i] ? names[i] : "a shard", status);
    }
    copy_base("devzero", d, sizeof d);
    snprintf(p, sizeof p, "%s/config.json", d);
    unlink(p);
    CHECK(symlink("/dev/zero", p) == 0);
    expect_fail(d, SN_E_IO, "config.json", "not a regular file");
}

static void test_truncated_shard(void)
{
    char d[256], p[512];
    copy_base("trunc", d, sizeof d);
    shard_of(d, LP "2.mlp.switch_mlp.down_proj.weight", p, sizeof p);
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && truncate(p, sb.st_size - 100) == 0);
    expect_fail(d, SN_E_FORMAT, strrchr(p, '/') + 1, "truncated");
}

static void test_index_wrong_shard(void)
{
    char d[256], a[512], b[512];
    copy_base("wrongidx", d, sizeof d);
    const char *t = LP "0.linear_attn.in_proj_z.weight";
    shard_of(d, t, a, sizeof a);
    shard_of(d, "language_model.lm_head.weight", b, sizeof b);
    SN_ASSERT(strcmp(a, b) != 0);
    edit_index(d, t, strrchr(b, '/') + 1);
    expect_fail(d, SN_E_FORMAT, t, strrchr(b, '/') + 1);
}

static void overlap_edit(json_t *hdr, void *ctx)
{
    /* make the named tensor start where another one of the same shard does */
    const char *victim = ctx;
    json_t *v = json_object_get(hdr, victim);
    const char *k;
    json_t *e;
    json_object_foreach(hdr, k, e) {
        if (!strcmp(k, "__metadata__") || !strcmp(k, victim)) continue;
        json_t *off = json_object_get(e, "data_offsets"), *voff = json_object_get(v, "data_offsets");
        json_int_t b0 = json_integer_value(json_array_get(off, 0));
        json_int_t len = json_integer_value(json_array_get(voff, 1)) - json_integer_value(json_array_get(voff, 0));
        json_array_set_new(voff, 0, json_integer(b0));
        json_array_set_new(voff, 1, json_integer(b0 + len));
        if (json_integer_value(json_array_get(off, 1)) > b0) break;   /* a non-empty neighbour: overlap made */
    }
}

static void test_overlapping_offsets(void)
{
    char d[256], p[512];
    copy_base("overlap", d, sizeof d);
    const char *t = LP "1.linear_attn.out_proj.weight";
    shard_of(d, t, p, sizeof p);
    patch_header(p, overlap_edit, (void *)t);
    expect_fail(d, SN_E_FORMAT, strrchr(p, '/') + 1, "overlap");
}

static void dtype_edit(json_t *hdr, void *ctx)
{
    json_object_set_new(json_object_get(hdr, (const char *)ctx), "dtype", json_string("F64"));
}

static void test_unsupported_dtype(void)
{
    char d[256], p[512];
    copy_base("f64", d, sizeof d);
    const char *t = LP "0.input_layernorm.weight";
    shard_of(d, t, p, sizeof p);
    patch_header(p, dtype_edit, (void *)t);
    expect_fail(d, SN_E_UNSUPPORTED, t, "F64");
}

static void rename_edit(json_t *hdr, void *ctx)
{
    const char **names = ctx;   /* rename names[0] to names[1] */
    json_t *e = json_incref(json_object_get(hdr, names[0]));
    json_object_del(hdr, names[0]);
    json_object_set_new(hdr, names[1], e);
}

static void test_duplicate_across_shards(void)
{
    char d[256], a[512], b[512];
    copy_base("dup", d, sizeof d);
    const char *src = LP "0.input_layernorm.weight", *dst = "language_model.model.norm.weight";
    shard_of(d, src, a, sizeof a);
    shard_of(d, dst, b, sizeof b);
    SN_ASSERT(strcmp(a, b) != 0);
    const char *names[2] = {src, dst};
    patch_header(a, rename_edit, names);
    edit_index(d, src, NULL);
    expect_fail(d, SN_E_FORMAT, dst, "twice");
}

static void scales_edit(json_t *hdr, void *ctx)
{
    json_t *e = json_object_get(hdr, (const char *)ctx);
    json_t *shp = json_object_get(e, "shape"), *off = json_object_get(e, "data_offsets");
    /* [E, I, H/group] -> [E, I, H/group/2], bytes halved: a consistent header, a wrong tensor */
    json_int_t last = json_integer_value(json_array_get(shp, 2));
    json_array_set_new(shp, 2, json_integer(last / 2));
    json_int_t b = json_integer_value(json_array_get(off, 0)), en = json_integer_value(json_array_get(off, 1));
    json_array_set_new(off, 1, json_integer(b + (en - b) / 2));
}

static void test_scales_wrong_shape(void)
{
    char d[256], p[512];
    copy_base("scales", d, sizeof d);
    const char *t = LP "2.mlp.switch_mlp.up_proj.scales";
    shard_of(d, t, p, sizeof p);
    patch_header(p, scales_edit, (void *)t);
    expect_fail(d, SN_E_SHAPE, "switch_mlp.up_proj", NULL);
}

static void drop_edit(json_t *hdr, void *ctx) { json_object_del(hdr, (const char *)ctx); }

static void test_scales_missing(void)
{
    char d[256], p[512];
    copy_base("noscales", d, sizeof d);
    const char *t = LP "0.linear_attn.in_proj_z.scales";
    shard_of(d, t, p, sizeof p);
    patch_header(p, drop_edit, (void *)t);
    edit_index(d, t, NULL);
    sn_model *m = NULL;
    sn_load_opts o = {.n_threads = 1};
    sn_status s = sn_model_load(d, &o, &m);
    /* a U32 weight without scales cannot be read either way */
    CHECKF(s != SN_OK && strstr(sn_errmsg(), "in_proj_z"), "got %s: %s", sn_status_name(s), sn_errmsg());
    CHECK(m == NULL);
    sn_model_free(m);
}

static void test_config_bits_disagree(void)
{
    char d[256];
    copy_base("bits8", d, sizeof d);
    edit_config_quant(d, 8, 64);   /* the weights are packed 4-bit */
    sn_model *m = NULL;
    sn_load_opts o = {.n_threads = 1};
    sn_status s = sn_model_load(d, &o, &m);
    CHECKF(s == SN_E_SHAPE && strstr(sn_errmsg(), "weight") && strstr(sn_errmsg(), "8-bit"), "got %s: %s",
           sn_status_name(s), sn_errmsg());
    CHECK(m == NULL);
    sn_model_free(m);
    copy_base("bits3", d, sizeof d);
    edit_config_quant(d, 3, 64);
    expect_fail(d, SN_E_UNSUPPORTED, "3-bit", "config.json");
}

static void test_config_dims_disagree(void)
{
    char d[256], p[512];
    copy_base("dims", d, sizeof d);
    snprintf(p, sizeof p, "%s/config.json", d);
    json_t *c = json_load_file(p, 0, NULL);
    json_object_set_new(json_object_get(c, "text_config"), "moe_intermediate_size", json_integer(128));
    SN_ASSERT(json_dump_file(c, p, 0) == 0);
    json_decref(c);
    expect_fail(d, SN_E_SHAPE, "switch_mlp", NULL);
}

int main(int argc, char **argv)
{
    const char *slash = strrchr(argv[0], '/');
    snprintf(g_synth, sizeof g_synth, "%.*s/../sanctum-synth", slash ? (int)(slash - argv[0]) : 1,
             slash ? argv[0] : ".");
    snprintf(g_root, sizeof g_root, "/tmp/sn_test_badckpt_%d", (int)getpid());
    mkdir(g_root, 0700);
    snprintf(g_base, sizeof g_base, "%s/base", g_root);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s/tiny_moe.json", g_root);
    FILE *f = fopen(cfg, "w");
    SN_ASSERT(f);
    fputs(TINY_MOE, f);
    fclose(f);
    if (access(g_synth, X_OK) != 0 ||
        sh("%s --config %s --out %s --seed 5 --shard-size 300K 2>/dev/null", g_synth, cfg, g_base) != 0) {
        fprintf(stderr, "cannot run %s to build the base checkpoint\n", g_synth);
        t_failed++;
    } else {
        RUN(test_good_loads);
        RUN(test_missing_shard);
        RUN(test_truncated_shard);
        RUN(test_not_regular_files);
        RUN(test_index_wrong_shard);
        RUN(test_overlapping_offsets);
        RUN(test_unsupported_dtype);
        RUN(test_duplicate_across_shards);
        RUN(test_scales_wrong_shape);
        RUN(test_scales_missing);
        RUN(test_config_bits_disagree);
        RUN(test_config_dims_disagree);
    }
    sh("rm -rf %s", g_root);
    return TEST_END();
}
