/* Loader tests on small synthetic qwen3_5 checkpoints written here (no
 * fixture needed): a good one loads and runs; each broken one (missing
 * tensor, wrong shape, bad dtype, unknown model_type, truncated file) fails
 * with an error naming the problem, both through the library and as a
 * one-line error + non-zero exit of sanctum-run. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"
#include "models/model_impl.h"
#include "parity_pair.h"
#include "sanctum/model.h"
#include "sanctum/quant.h"
#include "sanctum/safetensors.h"

enum { H = 64, V = 128, NL = 4, HQ = 2, HKV = 1, HD = 32, HK = 1, HV = 2, DK = 32, DV = 32, KC = 4, FF = 64 };
#define CONV (2 * HK * DK + HV * DV)

typedef enum { MUT_NONE, MUT_REQUANT8, MUT_Q_OK, MUT_Q_NOBIAS, MUT_Q_SCALES, MUT_Q_BITS, MUT_CONV, MUT_MISSING, MUT_SHAPE, MUT_DTYPE, MUT_MODEL_TYPE, MUT_TRUNCATE, MUT_BAD_JSON } mutation;

static char g_root[256];
static char g_run[512];   /* <build>/sanctum-run, next to this test's <build>/tests/ */

/* deterministic values in [-s, s) */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(float s)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return s * ((float)(g_rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
}

typedef struct {
    char name[128];
    int nd;
    int64_t shape[3];
    float *data;
} tdesc;

static tdesc g_t[128];
static int g_nt;

static void add(const char *name, int nd, int64_t a, int64_t b, int64_t c, float scale, float base)
{
    tdesc *t = &g_t[g_nt++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    int64_t n = a * (nd > 1 ? b : 1) * (nd > 2 ? c : 1);
    t->data = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) t->data[i] = base + frand(scale);
}

static void build_tensors(void)
{
    char n[128];
    g_nt = 0;
    g_rng = 0x9E3779B97F4A7C15ull; /* every checkpoint variant starts from the same weights */
    add("model.embed_tokens.weight", 2, V, H, 0, 0.5f, 0);
    add("model.norm.weight", 1, H, 0, 0, 0.1f, 0);
    add("lm_head.weight", 2, V, H, 0, 0.2f, 0);
    for (int l = 0; l < NL; l++) {
#define L(fmt, ...) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
        add(L("input_layernorm.weight"), 1, H, 0, 0, 0.1f, 0);
        add(L("post_attention_layernorm.weight"), 1, H, 0, 0, 0.1f, 0);
        add(L("mlp.gate_proj.weight"), 2, FF, H, 0, 0.2f, 0);
        add(L("mlp.up_proj.weight"), 2, FF, H, 0, 0.2f, 0);
        add(L("mlp.down_proj.weight"), 2, H, FF, 0, 0.2f, 0);
        if (l == NL - 1) {
            add(L("self_attn.q_proj.weight"), 2, 2 * HQ * HD, H, 0, 0.2f, 0);
            add(L("self_attn.k_proj.weight"), 2, HKV * HD, H, 0, 0.2f, 0);
            add(L("self_attn.v_proj.weight"), 2, HKV * HD, H, 0, 0.2f, 0);
            add(L("self_attn.o_proj.weight"), 2, H, HQ * HD, 0, 0.2f, 0);
            add(L("self_attn.q_norm.weight"), 1, HD, 0, 0, 0.1f, 0);
            add(L("self_attn.k_norm.weight"), 1, HD, 0, 0, 0.1f, 0);
        } else {
            add(L("linear_attn.in_proj_qkv.weight"), 2, CONV, H, 0, 0.2f, 0);
            add(L("linear_attn.in_proj_z.weight"), 2, HV * DV, H, 0, 0.2f, 0);
            add(L("linear_attn.in_proj_b.weight"), 2, HV, H, 0, 0.2f, 0);
            add(L("linear_attn.in_proj_a.weight"), 2, HV, H, 0, 0.2f, 0);
            add(L("linear_attn.conv1d.weight"), 3, CONV, 1, KC, 0.3f, 0);
            add(L("linear_attn.A_log"), 1, HV, 0, 0, 0.5f, 1.0f);
            add(L("linear_attn.dt_bias"), 1, HV, 0, 0, 0.5f, 0);
            add(L("linear_attn.norm.weight"), 1, DV, 0, 0, 0.1f, 1.0f);
            add(L("linear_attn.out_proj.weight"), 2, H, HV * DV, 0, 0.2f, 0);
        }
#undef L
    }
}

static void free_tensors(void)
{
    for (int i = 0; i < g_nt; i++) free(g_t[i].data);
    g_nt = 0;
}

static const char *CONFIG_FMT =
    "{\"model_type\": \"%s\", \"architectures\": [\"Qwen3_5ForCausalLM\"],\n"
    " \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,\n"
    " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,\n"
    " \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d,\n"
    " \"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": %d, \"rms_norm_eps\": 1e-6,\n"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 256, \"eos_token_id\": 1,\n"
    " \"layer_types\": [\"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"],\n"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25}}\n";

/* Writes <g_root>/<sub>/{config.json,model.safetensors} with one mutation. */
static int write_ckpt(const char *sub, mutation mut, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s", g_root, sub);
    mkdir(dir, 0700);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    if (mut == MUT_BAD_JSON) fprintf(f, "{\"model_type\": \"qwen3_5\", \"hidden_size\": 64,,}");
    else fprintf(f, CONFIG_FMT, mut == MUT_MODEL_TYPE ? "llama_bogus" : "qwen3_5", V, H, FF, NL, HQ, HKV, HD, HK,
                 HV, DK, DV, KC);
    fclose(f);
    build_tensors();
    sn_st_writer *w = NULL;
    if (sn_st_writer_new(&w) != SN_OK) return -1;
    for (int i = 0; i < g_nt; i++) {
        tdesc *t = &g_t[i];
        sn_dtype dt = SN_DT_F32;
        const void *data = t->data;
        if (mut == MUT_MISSING && !strcmp(t->name, "model.layers.1.linear_attn.in_proj_z.weight")) continue;
        if (mut == MUT_SHAPE && !strcmp(t->name, "model.layers.3.self_attn.k_proj.weight")) t->shape[0] += 32;
        if (mut == MUT_DTYPE && !strcmp(t->name, "model.layers.0.mlp.up_proj.weight")) {
            /* same bytes reinterpreted as I32: a dtype no linear weight can have */
            dt = SN_DT_I32;
        }
        int64_t n = t->shape[0] * (t->nd > 1 ? t->shape[1] : 1) * (t->nd > 2 ? t->shape[2] : 1);
        if (mut == MUT_SHAPE && !strcmp(t->name, "model.layers.3.self_attn.k_proj.weight")) {
            free(t->data);
            t->data = calloc((size_t)n, sizeof(float));
            data = t->data;
        }
        if (mut == MUT_REQUANT8 && t->nd == 2 && t->shape[1] % 64 == 0) {
            /* what --quantize 8 does at load, done here in the file: the
             * weights become dequant(quant8(w)) stored as F32 */
            int64_t r = t->shape[0], c = t->shape[1];
            uint32_t *pk = malloc((size_t)(r * c / 4) * 4);
            uint16_t *sc = malloc((size_t)(r * c / 64) * 2), *bi = malloc((size_t)(r * c / 64) * 2);
            sn_status qs = sn_q_quantize(t->data, r, c, 8, 64, SN_DT_BF16, pk, sc, bi);
            sn_weight qw = { .dtype = SN_DT_Q8, .rows = r, .cols = c, .group = 64, .data = pk, .scales = sc,
                             .qbiases = bi, .sdtype = SN_DT_BF16 };
            if (qs == SN_OK) qs = sn_weight_to_f32(&qw, 0, t->data);
            free(pk);
            free(sc);
            free(bi);
            if (qs != SN_OK) return -1;
        }
        if (mut == MUT_CONV && !strcmp(t->name, "model.layers.2.linear_attn.conv1d.weight")) {
            t->shape[1] = 2; /* [C, 2, K]: neither the HF nor the MLX layout; the data has room */
            t->shape[2] = KC / 2;
        }
        if (mut >= MUT_Q_OK && mut <= MUT_Q_BITS && !strcmp(t->name, "model.layers.0.mlp.gate_proj.weight")) {
            /* this one matrix stored MLX-quantized (4-bit, group 64) */
            static uint32_t pk[FF * H / 8];
            static uint16_t sc[FF * 2], bi[FF * 2];
            if (sn_q_quantize(t->data, FF, H, 4, 64, SN_DT_BF16, pk, sc, bi) != SN_OK) return -1;
            int64_t wsh[2] = { FF, H / 8 }, ssh[2] = { FF, 1 };
            if (mut == MUT_Q_BITS) wsh[1] = H * 3 / 32; /* a 3-bit packing */
            if (mut == MUT_Q_SCALES) ssh[0] = FF - 1; /* (a [FF, 2] would be a valid group-32 file) */
            char n2[160];
            if (sn_st_writer_add(w, t->name, SN_DT_U32, 2, wsh, pk) != SN_OK) return -1;
            snprintf(n2, sizeof n2, "model.layers.0.mlp.gate_proj.scales");
            if (sn_st_writer_add(w, n2, SN_DT_BF16, 2, ssh, sc) != SN_OK) return -1;
            snprintf(n2, sizeof n2, "model.layers.0.mlp.gate_proj.biases");
            if (mut != MUT_Q_NOBIAS && sn_st_writer_add(w, n2, SN_DT_BF16, 2, ssh, bi) != SN_OK) return -1;
            continue;
        }
        if (sn_st_writer_add(w, t->name, dt, t->nd, t->shape, data) != SN_OK) {
            sn_st_writer_free(w);
            return -1;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sn_status s = sn_st_writer_write(w, path, NULL, NULL);
    sn_st_writer_free(w);
    free_tensors();
    if (s != SN_OK) return -1;
    if (mut == MUT_TRUNCATE) {
        struct stat sb;
        if (stat(path, &sb) || truncate(path, sb.st_size / 2)) return -1;
    }
    return 0;
}

static void test_good_checkpoint_runs(void)
{
    char dir[512];
    CHECK(write_ckpt("good", MUT_NONE, dir, sizeof dir) == 0);
    sn_model *m = NULL;
    sn_load_opts o = { .n_threads = 1 };
    CHECK_OK(sn_model_load(dir, &o, &m));
    if (!m) return;
    const sn_model_info *in = sn_model_get_info(m);
    CHECK(in->vocab_size == V && in->n_layers == NL && !in->mlx_layout);
    CHECK(strcmp(in->model_type, "qwen3_5") == 0 && strcmp(in->name, "good") == 0);
    /* zero-centred norms of a raw HF checkpoint are used as 1+w */
    CHECK(m->final_norm[0] > 0.85f && m->final_norm[0] < 1.15f);
    /* gated norm is not shifted */
    CHECK(m->layers[0].gnorm[0] > 0.85f && m->layers[0].gnorm[0] < 1.15f);
    sn_seq *s = NULL;
    CHECK_OK(sn_seq_new(m, 64, &s));
    int32_t ids[5] = { 3, 17, 99, 0, 127 };
    float *lg = malloc(sizeof(float) * V * 5);
    CHECK_OK(sn_forward(m, s, ids, 5, lg, true));
    bool finite = true;
    for (int i = 0; i < V * 5; i++) finite = finite && isfinite(lg[i]);
    CHECK(finite);
    CHECK(sn_seq_pos(s) == 5);
    /* out-of-vocabulary ids and a full context are errors, not crashes */
    int32_t bad = V;
    CHECK(sn_forward(m, s, &bad, 1, lg, false) == SN_E_RANGE);
    CHECK(strstr(sn_errmsg(), "vocabulary") != NULL);
    int32_t many[64] = { 0 };
    CHECK(sn_forward(m, s, many, 64, NULL, false) == SN_E_RANGE);
    CHECK(strstr(sn_errmsg(), "context") != NULL);
    /* a bad SANCTUM_GRAPH_ROWS is refused by name, not silently replaced */
    const char *bad_rows[] = { "9", "0", "4x", "-1" };
    for (size_t i = 0; i < sizeof bad_rows / sizeof *bad_rows; i++) {
        setenv("SANCTUM_GRAPH_ROWS", bad_rows[i], 1);
        CHECK(sn_forward(m, s, ids, 1, lg, false) == SN_E_INVALID);
        CHECK(strstr(sn_errmsg(), "SANCTUM_GRAPH_ROWS") != NULL);
    }
    setenv("SANCTUM_GRAPH_ROWS", "3", 1);
    CHECK_OK(sn_forward(m, s, ids, 1, lg, false));
    unsetenv("SANCTUM_GRAPH_ROWS");
    /* and SANCTUM_RECORD_AHEAD */
    setenv("SANCTUM_RECORD_AHEAD", "on", 1);
    CHECK(sn_forward(m, s, ids, 1, lg, false) == SN_E_INVALID);
    CHECK(strstr(sn_errmsg(), "SANCTUM_RECORD_AHEAD=on") != NULL);
    setenv("SANCTUM_RECORD_AHEAD", "0", 1);
    CHECK_OK(sn_forward(m, s, ids, 1, lg, false));
    unsetenv("SANCTUM_RECORD_AHEAD");
    free(lg);
    sn_seq_free(s);
    sn_model_free(m);
}

/* sn_load_opts.weights: the weights copied into memory give the logits of
 * the mapped ones, bit for bit; the decision and the parser by their cases;
 * a bad mode is refused by name. */
static void test_weights_copy(void)
{
    char dir[512];
    CHECK(write_ckpt("good", MUT_NONE, dir, sizeof dir) == 0);
    int32_t ids[4] = { 3, 17, 99, 127 };
    float *lg[2] = { malloc(sizeof(float) * V * 4), malloc(sizeof(float) * V * 4) };
    const sn_weights_mode modes[2] = { SN_WEIGHTS_MMAP, SN_WEIGHTS_COPY };
    for (int k = 0; k < 2; k++) {
        sn_model *m = NULL;
        sn_load_opts o = { .n_threads = 1, .weights = modes[k] };
        CHECK_OK(sn_model_load(dir, &o, &m));
        if (!m) continue;
        CHECK(sn_model_get_info(m)->weights_copied == (k == 1));
        sn_seq *s = NULL;
        CHECK_OK(sn_seq_new(m, 16, &s));
        CHECK_OK(sn_forward(m, s, ids, 4, lg[k], true));
        sn_seq_free(s);
        sn_model_free(m);
    }
    CHECK(memcmp(lg[0], lg[1], sizeof(float) * V * 4) == 0);
    free(lg[0]);
    free(lg[1]);

    sn_model *m = NULL;
    sn_load_opts bad = { .n_threads = 1, .weights = (sn_weights_mode)7 };
    CHECK(sn_model_load(dir, &bad, &m) == SN_E_INVALID && m == NULL && strstr(sn_errmsg(), "weights mode 7"));

    const size_t G = (size_t)1 << 30;
    CHECK(sn_weights_copy_wanted(SN_WEIGHTS_AUTO, SN_BACKEND_CPU, G, 10 * G));
    CHECK(sn_weights_copy_wanted(SN_WEIGHTS_AUTO, SN_BACKEND_CPU, 8 * G, 10 * G));
    CHECK(!sn_weights_copy_wanted(SN_WEIGHTS_AUTO, SN_BACKEND_CPU, 8 * G + 1, 10 * G)); /* 2 GB to spare */
    CHECK(!sn_weights_copy_wanted(SN_WEIGHTS_AUTO, SN_BACKEND_CPU, 1, G));
    CHECK(!sn_weights_copy_wanted(SN_WEIGHTS_AUTO, SN_BACKEND_CPU, 1, 0)); /* MemAvailable unknown */
    CHECK(!sn_weights_copy_wanted(SN_WEIGHTS_AUTO, SN_BACKEND_CUDA, G, 10 * G));
    CHECK(sn_weights_copy_wanted(SN_WEIGHTS_COPY, SN_BACKEND_CUDA, 20 * G, 0));
    CHECK(!sn_weights_copy_wanted(SN_WEIGHTS_MMAP, SN_BACKEND_CPU, 1, 10 * G));
    CHECK(!sn_weights_copy_drops_cache(G, 10 * G));
    CHECK(!sn_weights_copy_drops_cache(4 * G, 10 * G));     /* 4 + 4 + 2 */
    CHECK(sn_weights_copy_drops_cache(4 * G + 1, 10 * G));
    CHECK(sn_weights_copy_drops_cache(14 * G, 23 * G));     /* the 27B on a 24 GB machine */
    CHECK(sn_weights_copy_drops_cache(1, 0));               /* MemAvailable unknown */
    CHECK(sn_weights_copy_drops_cache(SIZE_MAX / 2 + 1, SIZE_MAX));
    sn_weights_mode wm = SN_WEIGHTS_MMAP;
    CHECK(sn_weights_mode_parse("auto", &wm) && wm == SN_WEIGHTS_AUTO);
    CHECK(sn_weights_mode_parse("copy", &wm) && wm == SN_WEIGHTS_COPY);
    CHECK(sn_weights_mode_parse("mmap", &wm) && wm == SN_WEIGHTS_MMAP);
    CHECK(!sn_weights_mode_parse("Copy", &wm) && !sn_weights_mode_parse("", &wm) && !sn_weights_mode_parse(NULL, &wm));
    sn_precision pr = SN_PRECISION_FAST;
    CHECK(sn_precision_parse("exact", &pr) && pr == SN_PRECISION_EXACT);
    CHECK(sn_precision_parse("fast", &pr) && pr == SN_PRECISION_FAST);
    CHECK(!sn_precision_parse("FAST", &pr) && !sn_precision_parse("", &pr) && !sn_precision_parse(NULL, &pr));
    CHECK(sn_precision_parse(sn_precision_name(SN_PRECISION_FAST), &pr) && pr == SN_PRECISION_FAST);
    CHECK(sn_precision_parse(sn_precision_name(SN_PRECISION_EXACT), &pr) && pr == SN_PRECISION_EXACT);
    sn_load_opts badp = { .n_threads = 1, .precision = (sn_precision)5 };
    CHECK(sn_model_load(dir, &badp, &m) == SN_E_INVALID && m == NULL && strstr(sn_errmsg(), "precision"));

    /* the tools refuse a bad --weights by name, and say where the weights are */
    if (access(g_run, X_OK) != 0) SKIP("sanctum-run not built");
    char cmd[2000], outf[600];
    snprintf(outf, sizeof outf, "%s/weights.err", g_root);
    snprintf(cmd, sizeof cmd, "%s --model %s --ids 3 --max-tokens 1 --weights paged 2>%s", g_run, dir, outf);
    CHECK(system(cmd) != 0);
    char line[512] = "";
    FILE *f = fopen(outf, "r");
    if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
    CHECKF(strstr(line, "--weights") && strstr(line, "'paged'"), "stderr: %s", line);
    snprintf(cmd, sizeof cmd, "%s --model %s --ids 3 --max-tokens 1 --weights copy --print-ids >/dev/null 2>%s", g_run,
             dir, outf);
    CHECK(system(cmd) == 0);
    bool said = false;
    f = fopen(outf, "r");
    while (f && fgets(line, sizeof line, f)) said = said || strstr(line, "weights copied into memory");
    if (f) fclose(f);
    CHECKF(said, "sanctum-run --weights copy did not say the weights were copied (%s)", outf);
    /* and --precision the same way */
    snprintf(cmd, sizeof cmd, "%s --model %s --ids 3 --max-tokens 1 --precision half 2>%s", g_run, dir, outf);
    CHECK(system(cmd) != 0);
    line[0] = 0;
    f = fopen(outf, "r");
    if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
    CHECKF(strstr(line, "--precision") && strstr(line, "'half'"), "stderr: %s", line);
    snprintf(cmd, sizeof cmd, "%s --model %s --ids 3 --max-tokens 1 --precision fast --print-ids >/dev/null 2>%s", g_run,
             dir, outf);
    CHECK(system(cmd) == 0);
    said = false;
    f = fopen(outf, "r");
    while (f && fgets(line, sizeof line, f)) said = said || strstr(line, "precision fast");
    if (f) fclose(f);
    CHECKF(said, "sanctum-run --precision fast did not say so (%s)", outf);
}

/* --quantize 8 at load == a checkpoint holding dequant(quant8(w)) as F32:
 * the quantized path and the dense path of the same values agree to fp32
 * rounding, which checks the at-load quantizer's layout (rows, groups,
 * the q_proj split) end to end. */
static void test_quantize_at_load(void)
{
    char dir[512], rdir[512];
    CHECK(write_ckpt("good", MUT_NONE, dir, sizeof dir) == 0);
    CHECK(write_ckpt("requant", MUT_REQUANT8, rdir, sizeof rdir) == 0);
    sn_model *m = NULL, *q = NULL;
    sn_load_opts o = { .n_threads = 1 }, oq = { .n_threads = 1, .quantize_bits = 8 };
    CHECK_OK(sn_model_load(rdir, &o, &m));
    CHECK_OK(sn_model_load(dir, &oq, &q));
    if (!m || !q) goto out;
    CHECK(q->layers[0].in_qkv.dtype == SN_DT_Q8 && q->layers[0].in_qkv.group == 64);
    CHECK(q->embed.dtype == SN_DT_Q8);
    sn_seq *a = NULL, *b = NULL;
    CHECK_OK(sn_seq_new(m, 16, &a));
    CHECK_OK(sn_seq_new(q, 16, &b));
    int32_t ids[4] = { 5, 6, 7, 8 };
    float la[V], lb[V];
    CHECK_OK(sn_forward(m, a, ids, 4, la, false));
    CHECK_OK(sn_forward(q, b, ids, 4, lb, false));
    float md = 0, mx = 0;
    for (int i = 0; i < V; i++) {
        md = fmaxf(md, fabsf(la[i] - lb[i]));
        mx = fmaxf(mx, fabsf(la[i]));
    }
    CHECKF(md <= 1e-4f * fmaxf(1.0f, mx), "quantized at load vs dequantized file: max diff %g, logit scale %g", md, mx);
    CHECK(m->layers[0].in_qkv.dtype == SN_DT_F32);
    sn_seq_free(a);
    sn_seq_free(b);
out:
    sn_model_free(m);
    sn_model_free(q);
}

/* Loads a broken checkpoint: expects `code` and a message containing `needle`,
 * then the same through sanctum-run: non-zero exit, one line on stderr. */
static void expect_bad(const char *sub, mutation mut, sn_status code, const char *needle)
{
    char dir[512];
    CHECK(write_ckpt(sub, mut, dir, sizeof dir) == 0);
    sn_model *m = NULL;
    sn_load_opts o = { .n_threads = 1 };
    sn_status s = sn_model_load(dir, &o, &m);
    CHECKF(s == code, "%s: got %s (%s), expected %s", sub, sn_status_name(s), sn_errmsg(), sn_status_name(code));
    CHECKF(strstr(sn_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", sub, sn_errmsg(), needle);
    CHECK(m == NULL);
    sn_model_free(m);

    if (access(g_run, X_OK) != 0) {
        fprintf(stderr, "  (no %s: CLI checks skipped)\n", g_run);
        return;
    }
    char cmd[2200], errf[600];
    snprintf(errf, sizeof errf, "%s/%s.err", g_root, sub);
    snprintf(cmd, sizeof cmd, "%s --model %s --ids 1,2,3 --max-tokens 2 --print-ids >/dev/null 2>%s", g_run,
             dir, errf);
    int rc = system(cmd);
    CHECKF(rc != 0, "%s: sanctum-run exited 0", sub);
    FILE *f = fopen(errf, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[2048];
    int n = 0;
    bool named = false;
    while (fgets(line, sizeof line, f)) {
        n++;
        if (strstr(line, needle)) named = true;
        fprintf(stderr, "  %s: %s", sub, line);
    }
    fclose(f);
    CHECKF(n == 1, "%s: sanctum-run wrote %d lines to stderr", sub, n);
    CHECKF(named, "%s: sanctum-run error lacks '%s'", sub, needle);
}

static void test_missing_tensor(void)
{
    expect_bad("missing", MUT_MISSING, SN_E_MISSING, "model.layers.1.linear_attn.in_proj_z.weight");
}
static void test_wrong_shape(void)
{
    expect_bad("shape", MUT_SHAPE, SN_E_SHAPE, "model.layers.3.self_attn.k_proj.weight: expected shape [32, 64]");
}
static void test_bad_dtype(void) { expect_bad("dtype", MUT_DTYPE, SN_E_SHAPE, "model.layers.0.mlp.up_proj.weight"); }
static void test_unknown_model_type(void) { expect_bad("mtype", MUT_MODEL_TYPE, SN_E_UNSUPPORTED, "llama_bogus"); }
static void test_truncated(void) { expect_bad("trunc", MUT_TRUNCATE, SN_E_FORMAT, "model.safetensors"); }
static void test_bad_json(void) { expect_bad("json", MUT_BAD_JSON, SN_E_FORMAT, "config.json"); }

/* One matrix MLX-quantized inside a raw checkpoint loads (quantization is
 * per tensor, decided by ".scales") and matches the dense model closely. */
static void test_mixed_quantized(void)
{
    char dir[512], gdir[512];
    CHECK(write_ckpt("qok", MUT_Q_OK, dir, sizeof dir) == 0);
    CHECK(write_ckpt("good", MUT_NONE, gdir, sizeof gdir) == 0);
    sn_model *m = NULL, *g = NULL;
    sn_load_opts o = { .n_threads = 1 };
    CHECK_OK(sn_model_load(dir, &o, &m));
    CHECK_OK(sn_model_load(gdir, &o, &g));
    if (m && g) {
        CHECK(m->layers[0].gate.dtype == SN_DT_Q4 && m->layers[0].up.dtype == SN_DT_F32);
        sn_seq *a = NULL, *b = NULL;
        CHECK_OK(sn_seq_new(m, 8, &a));
        CHECK_OK(sn_seq_new(g, 8, &b));
        int32_t ids[3] = { 1, 2, 3 };
        float la[V], lb[V];
        CHECK_OK(sn_forward(m, a, ids, 3, la, false));
        CHECK_OK(sn_forward(g, b, ids, 3, lb, false));
        float md = 0, mx = 0;
        for (int i = 0; i < V; i++) {
            md = fmaxf(md, fabsf(la[i] - lb[i]));
            mx = fmaxf(mx, fabsf(lb[i]));
        }
        /* one 4-bit matrix moves the logits, but not wholesale */
        CHECKF(md > 0 && md < 0.5f * fmaxf(1.0f, mx), "max diff %g, scale %g", md, mx);
        sn_seq_free(a);
        sn_seq_free(b);
    }
    sn_model_free(m);
    sn_model_free(g);
}

static void test_quant_missing_biases(void)
{
    expect_bad("qnobias", MUT_Q_NOBIAS, SN_E_MISSING, "model.layers.0.mlp.gate_proj.biases");
}
static void test_quant_bad_scales(void)
{
    expect_bad("qscales", MUT_Q_SCALES, SN_E_SHAPE, "model.layers.0.mlp.gate_proj.scales");
}
static void test_quant_bad_bits(void)
{
    expect_bad("qbits", MUT_Q_BITS, SN_E_SHAPE, "model.layers.0.mlp.gate_proj.weight");
}
static void test_conv_bad_shape(void)
{
    expect_bad("conv", MUT_CONV, SN_E_SHAPE, "model.layers.2.linear_attn.conv1d.weight: expected shape [128, 1, 4] or [128, 4, 1]");
}

/* memory_limit_mb refuses weights above it, with the sizes in the message. */
static void test_memory_limit(void)
{
    const char *dir = "tests/fixtures/qwen3_5/hf"; /* 3.2 MB of F32 weights */
    if (access(dir, R_OK) != 0) SKIP("qwen3_5 fixture not present");
    sn_model *m = NULL;
    sn_load_opts o = { .n_threads = 1, .memory_limit_mb = 1 };
    sn_status s = sn_model_load(dir, &o, &m);
    CHECK(s == SN_E_RANGE && m == NULL);
    CHECKF(strstr(sn_errmsg(), "memory limit of 1 MB") != NULL, "message: %s", sn_errmsg());
    o.memory_limit_mb = 64;
    CHECK_OK(sn_model_load(dir, &o, &m));
    sn_model_free(m);
}

/* Copies fixture dir src to <g_root>/sub with text_config.<key> (or the
 * root's) set to val; the weights are linked, not copied. */
static int fixture_with(const char *src, const char *sub, const char *key, json_int_t val, char *dir, size_t cap)
{
    char path[600], target[600];
    snprintf(dir, cap, "%s/%s", g_root, sub);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1;
    json_t *tc = json_object_get(root, "text_config");
    json_object_set_new(json_is_object(tc) ? tc : root, key, json_integer(val));
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = json_dump_file(root, path, JSON_INDENT(1));
    json_decref(root);
    if (!realpath(src, target)) return -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t tl = strlen(target);
    snprintf(target + tl, sizeof target - tl, "/model.safetensors");
    unlink(path);
    return rc || symlink(target, path) ? -1 : 0;
}

/* Regression: the workspace was sized by config dims no tensor confirms. A
 * MoE model has no dense MLP, so its intermediate_size is unchecked; 2^30
 * there asked for a 4 TB workspace (an ASan abort, NOMEM without ASan). */
static void test_unbound_dim_does_not_size_workspace(void)
{
    const char *src = "tests/fixtures/qwen3_5_moe/mlx";
    if (access(src, R_OK) != 0) SKIP("qwen3_5_moe fixture not present");
    char dir[512];
    CHECK(fixture_with(src, "moe_big_i", "intermediate_size", (json_int_t)1 << 30, dir, sizeof dir) == 0);
    sn_model *m = NULL;
    sn_load_opts o = { .n_threads = 1 };
    CHECK_OK(sn_model_load(dir, &o, &m));
    if (!m) return;
    for (int i = 0; i < 6; i++) CHECKF(m->ws.w[i] <= 4096, "workspace slot %d is %lld floats wide", i, (long long)m->ws.w[i]);
    sn_seq *s = NULL;
    CHECK_OK(sn_seq_new(m, 16, &s));
    int32_t ids[3] = { 1, 2, 3 }, next = -1;
    CHECK_OK(sn_forward_greedy(m, s, ids, 3, &next));
    CHECK(next >= 0 && next < sn_model_get_info(m)->vocab_size);
    sn_seq_free(s);
    sn_model_free(m);
}

/* The greedy ids of a forward (next_id, all_ids) with banned ids: every
 * row's id is what masking the banned ids to -inf in its logits and taking
 * the first maximum gives, whether the backend's argmax hit a banned id
 * (the host fallback) or not. */
static int masked_argmax(const float *x, int64_t n, const int32_t *ban, int nb)
{
    int best = -1;
    float bv = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        for (int k = 0; k < nb; k++)
            if (ban[k] == i) v = -INFINITY;
        if (isnan(v)) continue;
        if (best < 0 || v > bv) { bv = v; best = (int)i; }
    }
    return best;
}

static void test_greedy_ids_banned(void)
{
    const char *src = "tests/fixtures/qwen3_5/mlx";
    if (access(src, R_OK) != 0) SKIP("qwen3_5 fixture not present");
    sn_model *m = NULL;
    sn_load_opts o = { .n_threads = 1 };
    CHECK_OK(sn_model_load(src, &o, &m));
    if (!m) return;
    const int V = sn_model_get_info(m)->vocab_size, n = 5;
    int32_t toks[5] = { 3, 17, 5, 9, 2 }, ids[5], one = -1;
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    sn_seq *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(sn_seq_new(m, 32, &a));
    CHECK_OK(sn_seq_new(m, 32, &b));
    CHECK_OK(sn_seq_new(m, 32, &c));
    CHECK_OK(sn_forward(m, a, toks, n, lg, true));
    /* ban the winners of rows 1 and 3 (and an id out of range, ignored) */
    int32_t ban[3] = { (int32_t)masked_argmax(lg + (size_t)V, V, NULL, 0),
                       (int32_t)masked_argmax(lg + (size_t)3 * V, V, NULL, 0), V + 7 };
    sn_batch_item it = { .seq = b, .tokens = toks, .n = n, .next_id = ids, .all_ids = true, .banned = ban, .n_banned = 3 };
    CHECK_OK(sn_forward_batch(m, &it, 1));
    for (int r = 0; r < n; r++) {
        int want = masked_argmax(lg + (size_t)r * V, V, ban, 3);
        CHECKF(ids[r] == want, "row %d: greedy id %d, masked argmax %d", r, ids[r], want);
    }
    CHECK(ids[1] != ban[0] && ids[3] != ban[1]);
    /* the last row alone (all_ids off) */
    sn_batch_item last = { .seq = c, .tokens = toks, .n = n, .next_id = &one, .banned = ban + 1, .n_banned = 1 };
    CHECK_OK(sn_forward_batch(m, &last, 1));
    CHECK(one == masked_argmax(lg + (size_t)4 * V, V, ban + 1, 1));
    /* a count without a list is refused */
    sn_seq_reset(c);
    sn_batch_item bad = { .seq = c, .tokens = toks, .n = 1, .next_id = &one, .n_banned = 2 };
    CHECK(sn_forward_batch(m, &bad, 1) == SN_E_INVALID);
    sn_seq_free(a);
    sn_seq_free(b);
    sn_seq_free(c);
    free(lg);
    sn_model_free(m);
}

/* Regression: sanctum-run sized the context as prompt + --max-tokens with no
 * cap, so --max-tokens 16777216 made a KV cache for 16M positions and
 * generated far past max_position_embeddings (256 here). Now the default
 * context stops at the model's, and generation with it. */
static void test_cli_ctx_capped_at_model(void)
{
    if (access(g_run, X_OK) != 0) SKIP("sanctum-run not built");
    char dir[512], cmd[3000], outf[600];
    CHECK(write_ckpt("good", MUT_NONE, dir, sizeof dir) == 0);
    snprintf(outf, sizeof outf, "%s/ctxcap.out", g_root);
    /* eos 1 is removed so only the context can stop it; timeout guards the old behaviour */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"eos_token_id\": 1,//' %s/config.json && timeout 120 %s --model %s --ids 3,17 "
             "--max-tokens 16777216 --print-ids >%s 2>/dev/null", dir, g_run, dir, outf);
    CHECK(system(cmd) == 0);
    FILE *f = fopen(outf, "r");
    CHECK(f != NULL);
    if (!f) return;
    int n = 0, id;
    while (fscanf(f, "%d", &id) == 1) n++;
    fclose(f);
    CHECKF(n == 256 - 2 + 1, "generated %d ids; a context of 256 holds 254 after the prompt, plus the last one", n);
}

/* A tokenizer with more ids than the embedding has rows (qwen3's 151k-id
 * tokenizer next to this 128-row model) is refused by sanctum-run before the
 * prompt runs, saying so (before: "token id 151644 ... outside the
 * vocabulary" from the first forward). */
static void test_cli_tokenizer_bigger_than_model(void)
{
    const char *gz = "tests/fixtures/tokenizer/qwen3/tokenizer.json.gz";
    if (access(g_run, X_OK) != 0 || access(gz, R_OK) != 0) SKIP("sanctum-run or the qwen3 tokenizer fixture missing");
    char dir[512], cmd[3000], errf[600];
    CHECK(write_ckpt("bigtok", MUT_NONE, dir, sizeof dir) == 0);
    snprintf(errf, sizeof errf, "%s/bigtok.err", g_root);
    snprintf(cmd, sizeof cmd, "gzip -dc %s > %s/tokenizer.json && %s --model %s --prompt hi --max-tokens 2 >/dev/null 2>%s",
             gz, dir, g_run, dir, errf);
    CHECK(system(cmd) != 0);
    FILE *f = fopen(errf, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[1024];
    int n = 0;
    bool named = false;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "loaded ")) continue;   /* the load itself succeeds */
        n++;
        named |= strstr(line, "151") && strstr(line, "128 rows") != NULL;
    }
    fclose(f);
    CHECKF(n == 1 && named, "%d error lines; expected one naming the tokenizer size and the 128 rows", n);
}

/* A head_dim the CUDA attention cannot run (> 256) is refused at load on
 * that backend, before any device is touched, instead of every forward
 * failing; the CPU backend runs it. */
static void test_cuda_head_dim_refused_at_load(void)
{
    const char *src = "tests/fixtures/mistral/mlx";
    if (access(src, R_OK) != 0) SKIP("mistral fixture not present");
    char dir[512];
    CHECK(fixture_with(src, "hd512", "head_dim", 512, dir, sizeof dir) == 0);
    sn_model *m = NULL;
    sn_load_opts o = { .n_threads = 1, .backend = SN_BACKEND_CUDA };
    CHECK(sn_model_load(dir, &o, &m) == SN_E_UNSUPPORTED && m == NULL);
    CHECKF(strstr(sn_errmsg(), "head_dim 512") != NULL, "message: %s", sn_errmsg());
}

/* Regression: models/default has 1728 embedding rows and a 1702-id
 * tokenizer; a sampled id in the padding ended sanctum-run with
 * "detokenizing: token id 1727 is not in the vocabulary". The same seeded
 * run with --print-ids shows such an id is generated; the text run must
 * then still finish (the id shows nothing, as in HF's decode). */
static void test_cli_padded_vocab_id(void)
{
    if (access(g_run, X_OK) != 0 || access("models/default/tokenizer.json", R_OK) != 0)
        SKIP("sanctum-run or models/default missing");
    char cmd[1400], outf[600];
    snprintf(outf, sizeof outf, "%s/padded.ids", g_root);
    const char *args = "--model models/default --prompt hi --temperature 50 --seed 1 --max-tokens 300";
    snprintf(cmd, sizeof cmd, "%s %s --print-ids >%s 2>/dev/null", g_run, args, outf);
    CHECK(system(cmd) == 0);
    FILE *f = fopen(outf, "r");
    int id, padded = 0;
    while (f && fscanf(f, "%d", &id) == 1) padded += id >= 1702;
    if (f) fclose(f);
    CHECKF(padded > 0, "the seeded run sampled no padded id; pick another --seed for this test");
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>/dev/null", g_run, args);
    CHECK(system(cmd) == 0);
}

/* sanctum-run's --top-p and --repetition-penalty reach the sampler: a
 * top-p that keeps only the most likely token gives the greedy ids even at
 * temperature 50, the penalty changes a greedy run that repeats itself, a
 * seeded sampled run repeats itself, and an out-of-range
 * value is one error line naming the field. */
static int run_ids(const char *extra, int32_t *ids, int cap)
{
    char cmd[1400], outf[600];
    snprintf(outf, sizeof outf, "%s/topp.ids", g_root);
    snprintf(cmd, sizeof cmd, "%s --model models/default --prompt 'Count to five.' --max-tokens 24 --print-ids %s >%s 2>/dev/null",
             g_run, extra, outf); /* a later --prompt in extra wins */
    if (system(cmd) != 0) return -1;
    FILE *f = fopen(outf, "r");
    int n = 0, id;
    while (f && n < cap && fscanf(f, "%d", &id) == 1) ids[n++] = id;
    if (f) fclose(f);
    return n;
}

static void test_cli_top_p_and_penalty(void)
{
    if (access(g_run, X_OK) != 0 || access("models/default/config.json", R_OK) != 0)
        SKIP("sanctum-run or models/default missing");
    int32_t g[32], t[32], a[32], b[32];
    int ng = run_ids("--temperature 0", g, 32), nt = run_ids("--temperature 50 --top-p 0.000001 --seed 7", t, 32);
    CHECKF(ng > 1 && nt == ng && memcmp(g, t, sizeof(int32_t) * ng) == 0,
           "top-p 1e-6 at T 50 (%d ids) is not the greedy run (%d ids)", nt, ng);
    /* greedy with the penalty: "the the the..." goes on repeating without it */
    int32_t r[32];
    int nr = run_ids("--raw --prompt 'the the the the the' --temperature 0", r, 32);
    int np = run_ids("--raw --prompt 'the the the the the' --temperature 0 --repetition-penalty 100", t, 32);
    CHECKF(nr > 3 && np > 0 && (np != nr || memcmp(r, t, sizeof(int32_t) * nr) != 0),
           "--repetition-penalty 100 changed no greedy id (%d and %d ids)", nr, np);
    const char *s = "--temperature 1.2 --top-p 0.8 --repetition-penalty 1.5 --seed 11";
    int na = run_ids(s, a, 32), nb = run_ids(s, b, 32);
    CHECKF(na > 0 && na == nb && memcmp(a, b, sizeof(int32_t) * na) == 0, "the seeded sampled run differs from itself");
    char cmd[1400], errf[600], line[512];
    snprintf(errf, sizeof errf, "%s/topp.err", g_root);
    snprintf(cmd, sizeof cmd, "%s --model models/default --prompt hi --temperature 1 --top-p 1.5 >/dev/null 2>%s", g_run, errf);
    CHECK(system(cmd) != 0);
    FILE *f = fopen(errf, "r");
    bool named = false;
    while (f && fgets(line, sizeof line, f)) named |= strstr(line, "top_p") && strstr(line, "1.5");
    if (f) fclose(f);
    CHECKF(named, "no error line names top_p 1.5");
}

/* test_default_model_q8's check on the first prompt: the env knob's model
 * (ud) gives --precision fast's bits */
static void env_knob_same_bits(size_t prompt, const int32_t *ids, int n, const float *alt, void *ud)
{
    sn_model *me = ud;
    if (prompt != 0 || !me)
        return;
    const size_t bytes = sizeof(float) * (size_t)n * sn_model_get_info(me)->vocab_size;
    float *le = malloc(bytes);
    sn_seq *se = NULL;
    CHECK_OK(sn_seq_new(me, n + 1, &se));
    CHECK_OK(sn_forward(me, se, ids, n, le, true));
    CHECKF(memcmp(le, alt, bytes) == 0, "--precision fast differs from SANCTUM_CPU_Q4=q8");
    sn_seq_free(se);
    free(le);
}

/* --precision fast on the CPU (sn_load_opts.precision: the SANCTUM_CPU_Q4=q8
 * kernels, 8-bit activations for the Q4 matmuls, an opt-in approximation;
 * its per-matmul error bound is tested in test_backend_cpu) on the shipped
 * trained model, loaded through the option; the env knob gives the same
 * bits on the first prompt: on every prompt of tests/parity-smoke.json,
 * teacher-forced along transformers' greedy tokens, the q8 argmax is that
 * token at every step (so its greedy continuation is transformers'), and
 * its logits are not bitwise the default path's (the knob took effect).
 * This is a measured property of this committed model, not a derived one:
 * the test prints the largest q8-vs-default logit difference and the
 * smallest default top-2 margin along those paths (when written: 0.51 vs
 * 9.7, see docs/PERFORMANCE.md). The random fixture models are not used:
 * they amplify any rounding (fp32 vs fp64 already moves their logits by
 * ~1e-2) and q8 changes their greedy tokens. */
static void test_default_model_q8(void)
{
    json_error_t je;
    json_t *bat = json_load_file("tests/parity-smoke.json", 0, &je);
    if (!bat || access("models/default/model.safetensors", R_OK) != 0) {
        json_decref(bat);
        SKIP("models/default or tests/parity-smoke.json missing");
    }
    sn_load_opts o = { .n_threads = 2, .backend = SN_BACKEND_CPU };
    sn_model *mi = NULL, *mq = NULL;
    CHECK_OK(sn_model_load("models/default", &o, &mi));
    sn_load_opts of = o;
    of.precision = SN_PRECISION_FAST;
    CHECK_OK(sn_model_load("models/default", &of, &mq));
    CHECK(mq && sn_model_get_info(mq)->precision == SN_PRECISION_FAST && sn_model_get_info(mi)->precision == SN_PRECISION_EXACT);
    sn_model *me = NULL; /* the env knob's model, for the first prompt */
    setenv("SANCTUM_CPU_Q4", "q8", 1);
    CHECK_OK(sn_model_load("models/default", &o, &me));
    unsetenv("SANCTUM_CPU_Q4");
    json_t *ps = json_object_get(bat, "prompts");
    CHECK(mi && mq && json_array_size(ps) >= 10);
    if (!mi || !mq || !json_is_array(ps)) {
        sn_model_free(mi);
        sn_model_free(mq);
        sn_model_free(me);
        json_decref(bat);
        return;
    }
    parity_pair st;
    parity_pair_run(ps, mi, mq, "q8", env_knob_same_bits, me, &st);
    fprintf(stderr, "  q8 vs default on models/default: max |logit diff| %.3g (max |logit| %.3g), min default top-2 "
            "margin %.3g\n", st.worst, st.scale, st.min_margin);
    CHECK(st.differ);
    sn_model_free(mi);
    sn_model_free(mq);
    sn_model_free(me);
    json_decref(bat);
}

static void test_missing_dir(void)
{
    sn_model *m = NULL;
    sn_status s = sn_model_load("/nonexistent/sanctum-model", NULL, &m);
    CHECK(s != SN_OK && m == NULL);
    CHECK(strstr(sn_errmsg(), "/nonexistent/sanctum-model") != NULL);
}

int main(int argc, char **argv)
{
    /* argv[0] is <build>/tests/test_model_load */
    const char *self = argc > 0 ? argv[0] : "build/tests/test_model_load";
    const char *slash = strstr(self, "/tests/");
    if (slash) snprintf(g_run, sizeof g_run, "%.*s/sanctum-run", (int)(slash - self), self);
    else snprintf(g_run, sizeof g_run, "build/sanctum-run");
    snprintf(g_root, sizeof g_root, "/tmp/sanctum-test-model-load-%d", (int)getpid());
    mkdir(g_root, 0700);
    RUN(test_good_checkpoint_runs);
    RUN(test_quantize_at_load);
    RUN(test_weights_copy);
    RUN(test_missing_tensor);
    RUN(test_wrong_shape);
    RUN(test_bad_dtype);
    RUN(test_unknown_model_type);
    RUN(test_truncated);
    RUN(test_bad_json);
    RUN(test_mixed_quantized);
    RUN(test_quant_missing_biases);
    RUN(test_quant_bad_scales);
    RUN(test_quant_bad_bits);
    RUN(test_conv_bad_shape);
    RUN(test_memory_limit);
    RUN(test_missing_dir);
    RUN(test_unbound_dim_does_not_size_workspace);
    RUN(test_greedy_ids_banned);
    RUN(test_cli_ctx_capped_at_model);
    RUN(test_cli_tokenizer_bigger_than_model);
    RUN(test_cuda_head_dim_refused_at_load);
    RUN(test_cli_padded_vocab_id);
    RUN(test_cli_top_p_and_penalty);
    RUN(test_default_model_q8);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
    return TEST_END();
}
