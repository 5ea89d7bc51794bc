/* sanctum-synth: write a random-weight checkpoint in MLX layout for any
 * supported config, for benchmarks and loader tests.
 *
 *   sanctum-synth --config CONFIG.json --out DIR [--seed N] [--bits 4|8] [--group 64]
 *                 [--shard-size 5G] [--dry-run]
 *
 * Output: DIR/config.json (the input config plus a quantization block) and
 * DIR/model.safetensors, or model-0000i-of-0000n.safetensors plus
 * model.safetensors.index.json when the weights exceed one shard. Tensor
 * names and shapes are those of mlx-lm converted checkpoints
 * (architecture.md §3.2-3.4): qwen3_5 norms hold 1+w, conv1d is [C,K,1],
 * MoE experts are stacked switch_mlp [E,out,in], the router and
 * shared_expert_gate are 8-bit. Values are random but scaled so a forward
 * pass stays finite: a quantized Linear dequantizes to zero-mean values of
 * std ~ 1/sqrt(in) (output projections further / sqrt(2L)), norms are ~1.
 * The same seed gives byte-identical files. Data is generated in 4 MB
 * chunks while writing, so a 15 GB model needs a few MB of memory. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "sanctum/config.h"
#include "sanctum/safetensors.h"

typedef enum { K_QWEIGHT, K_QSCALES, K_QBIASES, K_DENSE, K_NORM, K_ALOG, K_DTBIAS, K_BIAS } kind;

typedef struct {
    char name[192];
    kind k;
    sn_dtype dt;
    int ndim;
    int64_t shape[4];
    float sigma;      /* target std of the dequantized / dense values */
    int bits;         /* quantized kinds */
    uint64_t seed;    /* stream seed; a biases tensor shares its scales' seed */
    size_t nbytes;
    int shard;
} spec;

typedef struct {
    spec *s;
    size_t n, cap;
    int bits, group;
    uint64_t seed;
    json_t *overrides;   /* module path -> {bits, group_size} for non-default modules */
} plan;

/* ---- deterministic random streams --------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(uint64_t seed, const char *s)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return splitmix(&h);
}

static float unif(uint64_t *st) { return (float)(splitmix(st) >> 40) * 0x1p-24f; }   /* [0,1) */

/* ---- building the tensor list -------------------------------------------- */

static sn_status push(plan *p, const char *name, kind k, sn_dtype dt, int ndim, const int64_t *shape, float sigma,
                      int bits, const char *seed_name)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 1024;
        spec *ns = realloc(p->s, cap * sizeof *ns);
        if (!ns) return SN_FAIL(SN_E_NOMEM, "out of memory");
        p->s = ns;
        p->cap = cap;
    }
    spec *s = &p->s[p->n++];
    memset(s, 0, sizeof *s);
    if (snprintf(s->name, sizeof s->name, "%s", name) >= (int)sizeof s->name)
        return SN_FAIL(SN_E_INVALID, "tensor name too long: %s", name);
    s->k = k;
    s->dt = dt;
    s->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) { s->shape[i] = shape[i]; n *= (size_t)shape[i]; }
    s->nbytes = n * sn_dtype_size(dt);
    s->sigma = sigma;
    s->bits = bits;
    s->seed = hash_name(p->seed, seed_name ? seed_name : name);
    return SN_OK;
}

/* A Linear / Embedding / SwitchLinear [E?, out, in]. Quantized as MLX does
 * unless in % group != 0 (then it stays dense bf16). bits 0: default. */
static sn_status linear(plan *p, const char *path, int64_t E, int64_t out, int64_t in, float sigma, int bits)
{
    char n[192], sc[192];
    int64_t shp[4];
    int nd = 0;
    if (E > 0) shp[nd++] = E;
    shp[nd++] = out;
    int b = bits ? bits : p->bits;
    if (in % p->group != 0) {
        shp[nd] = in;
        snprintf(n, sizeof n, "%s.weight", path);
        return push(p, n, K_DENSE, SN_DT_BF16, nd + 1, shp, sigma, 0, NULL);
    }
    if (b != p->bits) {
        json_t *o = json_pack("{s:i,s:i}", "group_size", p->group, "bits", b);
        if (!o || json_object_set_new(p->overrides, path, o) != 0) return SN_FAIL(SN_E_NOMEM, "out of memory");
    }
    snprintf(n, sizeof n, "%s.weight", path);
    shp[nd] = in * b / 32;
    SN_TRY(push(p, n, K_QWEIGHT, SN_DT_U32, nd + 1, shp, sigma, b, NULL));
    snprintf(sc, sizeof sc, "%s.scales", path);
    shp[nd] = in / p->group;
    SN_TRY(push(p, sc, K_QSCALES, SN_DT_BF16, nd + 1, shp, sigma, b, NULL));
    snprintf(n, sizeof n, "%s.biases", path);
    return push(p, n, K_QBIASES, SN_DT_BF16, nd + 1, shp, sigma, b, sc);
}

static sn_status vec(plan *p, const char *name, kind k, sn_dtype dt, int64_t len)
{
    int64_t shp[1] = {len};
    return push(p, name, k, dt, 1, shp, 0.02f, 0, NULL);
}

static sn_status build_plan(plan *p, const sn_config *c)
{
    const bool qwen35 = c->arch == SN_ARCH_QWEN3_5 || c->arch == SN_ARCH_QWEN3_5_MOE;
    /* mlx-lm prefixes everything of a wrapped (text_config) model with language_model. */
    const bool wrapped = qwen35 || c->has_text_config;
    const char *mp = wrapped ? "language_model.model" : "model";
    const int64_t H = c->hidden_size, V = c->vocab_size, D = c->head_dim;
    const float sin_ = 1.0f / sqrtf((float)H);
    const float res = 1.0f / sqrtf(2.0f * (float)c->n_layers);   /* residual-branch damping */
    char b[192], l[160];

    snprintf(b, sizeof b, "%s.embed_tokens", mp);
    SN_TRY(linear(p, b, 0, V, H, 0.02f, 0));
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(l, sizeof l, "%s.layers.%d", mp, i);
        snprintf(b, sizeof b, "%s.input_layernorm.weight", l);
        SN_TRY(vec(p, b, K_NORM, SN_DT_BF16, H));
        snprintf(b, sizeof b, "%s.post_attention_layernorm.weight", l);
        SN_TRY(vec(p, b, K_NORM, SN_DT_BF16, H));
        if (c->layer_kind[i] == SN_LAYER_LINEAR) {
            const int64_t Kd = (int64_t)c->linear_num_key_heads * c->linear_key_head_dim;
            const int64_t Vd = (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
            const int64_t Hv = c->linear_num_value_heads, C = 2 * Kd + Vd, K = c->linear_conv_kernel_dim;
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_qkv", l);
            SN_TRY(linear(p, b, 0, C, H, sin_, 0));
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_z", l);
            SN_TRY(linear(p, b, 0, Vd, H, sin_, 0));
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_b", l);
            SN_TRY(linear(p, b, 0, Hv, H, sin_, 0));
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_a", l);
            SN_TRY(linear(p, b, 0, Hv, H, sin_, 0));
            int64_t cs[3] = {C, K, 1};
            snprintf(b, sizeof b, "%s.linear_attn.conv1d.weight", l);
            SN_TRY(push(p, b, K_DENSE, SN_DT_BF16, 3, cs, 1.0f / sqrtf((float)K), 0, NULL));
            snprintf(b, sizeof b, "%s.linear_attn.A_log", l);
            SN_TRY(vec(p, b, K_ALOG, SN_DT_F32, Hv));
            snprintf(b, sizeof b, "%s.linear_attn.dt_bias", l);
            SN_TRY(vec(p, b, K_DTBIAS, SN_DT_BF16, Hv));
            snprintf(b, sizeof b, "%s.linear_attn.norm.weight", l);
            SN_TRY(vec(p, b, K_NORM, SN_DT_BF16, c->linear_value_head_dim));
            snprintf(b, sizeof b, "%s.linear_attn.out_proj", l);
            SN_TRY(linear(p, b, 0, H, Vd, res / sqrtf((float)Vd), 0));
        } else {
            const int64_t Hq = c->n_heads, Hk = c->n_kv_heads;
            /* qwen3_5 q_proj carries a gate per head: [q_h | gate_h] */
            snprintf(b, sizeof b, "%s.self_attn.q_proj", l);
            SN_TRY(linear(p, b, 0, (qwen35 ? 2 : 1) * Hq * D, H, sin_, 0));
            snprintf(b, sizeof b, "%s.self_attn.k_proj", l);
            SN_TRY(linear(p, b, 0, Hk * D, H, sin_, 0));
            snprintf(b, sizeof b, "%s.self_attn.v_proj", l);
            SN_TRY(linear(p, b, 0, Hk * D, H, sin_, 0));
            snprintf(b, sizeof b, "%s.self_attn.o_proj", l);
            SN_TRY(linear(p, b, 0, H, Hq * D, res / sqrtf((float)(Hq * D)), 0));
            if (c->attention_bias) {
                const char *pr[3] = {"q_proj", "k_proj", "v_proj"};
                int64_t outs[3] = {(qwen35 ? 2 : 1) * Hq * D, Hk * D, Hk * D};
                for (int j = 0; j < 3; j++) {
                    snprintf(b, sizeof b, "%s.self_attn.%s.bias", l, pr[j]);
                    SN_TRY(vec(p, b, K_BIAS, SN_DT_BF16, outs[j]));
                }
                if (c->arch != SN_ARCH_QWEN2) {   /* qwen2's o_proj never has one */
                    snprintf(b, sizeof b, "%s.self_attn.o_proj.bias", l);
                    SN_TRY(vec(p, b, K_BIAS, SN_DT_BF16, H));
                }
            }
            if (qwen35) {
                snprintf(b, sizeof b, "%s.self_attn.q_norm.weight", l);
                SN_TRY(vec(p, b, K_NORM, SN_DT_BF16, D));
                snprintf(b, sizeof b, "%s.self_attn.k_norm.weight", l);
                SN_TRY(vec(p, b, K_NORM, SN_DT_BF16, D));
            }
        }
        if (c->arch == SN_ARCH_QWEN3_5_MOE) {
            const int64_t E = c->n_experts, I = c->moe_intermediate_size, S = c->shared_expert_intermediate_size;
            snprintf(b, sizeof b, "%s.mlp.gate", l);
            SN_TRY(linear(p, b, 0, E, H, sin_, 8));
            snprintf(b, sizeof b, "%s.mlp.switch_mlp.gate_proj", l);
            SN_TRY(linear(p, b, E, I, H, sin_, 0));
            snprintf(b, sizeof b, "%s.mlp.switch_mlp.up_proj", l);
            SN_TRY(linear(p, b, E, I, H, sin_, 0));
            snprintf(b, sizeof b, "%s.mlp.switch_mlp.down_proj", l);
            SN_TRY(linear(p, b, E, H, I, res / sqrtf((float)I), 0));
            snprintf(b, sizeof b, "%s.mlp.shared_expert.gate_proj", l);
            SN_TRY(linear(p, b, 0, S, H, sin_, 0));
            snprintf(b, sizeof b, "%s.mlp.shared_expert.up_proj", l);
            SN_TRY(linear(p, b, 0, S, H, sin_, 0));
            snprintf(b, sizeof b, "%s.mlp.shared_expert.down_proj", l);
            SN_TRY(linear(p, b, 0, H, S, res / sqrtf((float)S), 0));
            snprintf(b, sizeof b, "%s.mlp.shared_expert_gate", l);
            SN_TRY(linear(p, b, 0, 1, H, sin_, 8));
        } else {
            const int64_t I = c->intermediate_size;
            snprintf(b, sizeof b, "%s.mlp.gate_proj", l);
            SN_TRY(linear(p, b, 0, I, H, sin_, 0));
            snprintf(b, sizeof b, "%s.mlp.up_proj", l);
            SN_TRY(linear(p, b, 0, I, H, sin_, 0));
            snprintf(b, sizeof b, "%s.mlp.down_proj", l);
            SN_TRY(linear(p, b, 0, H, I, res / sqrtf((float)I), 0));
        }
    }
    snprintf(b, sizeof b, "%s.norm.weight", mp);
    SN_TRY(vec(p, b, K_NORM, SN_DT_BF16, H));
    if (!c->tie_word_embeddings) {
        snprintf(b, sizeof b, "%s", wrapped ? "language_model.lm_head" : "lm_head");
        SN_TRY(linear(p, b, 0, V, H, sin_, 0));
    }
    return SN_OK;
}

/* ---- generating values ----------------------------------------------------- */

typedef struct {
    const plan *p;
    const size_t *idx;     /* shard-local declaration index -> plan index */
    uint64_t rng;          /* stream of the tensor being written */
    size_t next_off;       /* expected next offset (chunks arrive in order) */
    size_t cur;            /* plan index of the tensor being written */
    size_t done, total;    /* bytes, for progress */
    int tty;
    double t0, last;
    int shard, n_shards;
} gen;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void put_bf16(uint8_t *dst, float v)
{
    uint16_t h = sn_f32_to_bf16(v);
    memcpy(dst, &h, 2);
}

/* Quantization scale for a target std: uniform codes in [0, n] have std
 * ~ n/sqrt(12) steps, so s = sigma*sqrt(12)/n; each group varies +-10%. */
static float group_scale(const spec *s, uint64_t *rng)
{
    float n = (float)((1 << s->bits) - 1);
    return s->sigma * sqrtf(12.0f) / n * (0.9f + 0.2f * unif(rng));
}

static sn_status fill(void *ctx, size_t index, const char *name, size_t offset, void *buf, size_t len)
{
    gen *g = ctx;
    const spec *s = &g->p->s[g->idx[index]];
    if (offset == 0 || g->cur != g->idx[index]) {
        if (offset != 0) return SN_FAIL(SN_E_INVALID, "synth: %s: chunks out of order", name);
        g->cur = g->idx[index];
        g->rng = s->seed;
        g->next_off = 0;
    }
    if (offset != g->next_off) return SN_FAIL(SN_E_INVALID, "synth: %s: chunk at %zu, expected %zu", name, offset, g->next_off);
    g->next_off += len;
    uint8_t *o = buf;
    size_t es = sn_dtype_size(s->dt);
    for (size_t i = 0; i < len; i += es) {
        switch (s->k) {
        case K_QWEIGHT: {
            uint32_t w = (uint32_t)splitmix(&g->rng);
            memcpy(o + i, &w, 4);
            break;
        }
        case K_QSCALES: put_bf16(o + i, group_scale(s, &g->rng)); break;
        case K_QBIASES: {
            /* same stream as the scales: bias centres the codes on zero */
            float sc = sn_bf16_to_f32(sn_f32_to_bf16(group_scale(s, &g->rng)));
            put_bf16(o + i, -sc * (float)((1 << s->bits) - 1) * 0.5f);
            break;
        }
        case K_DENSE: put_bf16(o + i, (2.0f * unif(&g->rng) - 1.0f) * s->sigma * sqrtf(3.0f)); break;
        case K_NORM: put_bf16(o + i, 1.0f + 0.1f * (unif(&g->rng) - 0.5f)); break;
        case K_BIAS: put_bf16(o + i, 0.02f * (2.0f * unif(&g->rng) - 1.0f)); break;
        case K_ALOG: {
            /* as HF initialises it: A ~ U(1, 16), stored as log A */
            float a = logf(1.0f + 15.0f * unif(&g->rng));
            memcpy(o + i, &a, 4);
            break;
        }
        case K_DTBIAS: {
            /* dt ~ logU(1e-3, 1e-1); dt_bias = softplus^-1(dt) */
            float dt = expf(logf(1e-3f) + unif(&g->rng) * (logf(1e-1f) - logf(1e-3f)));
            put_bf16(o + i, dt + logf(-expm1f(-dt)));
            break;
        }
        }
    }
    g->done += len;
    double t = now_s();
    if (g->tty && (t - g->last > 0.2 || g->done == g->total)) {
        g->last = t;
        fprintf(stderr, "\rsanctum-synth: shard %d/%d  %.2f / %.2f GB  %3.0f%%  %.0f MB/s   ", g->shard, g->n_shards,
                g->done / 1e9, g->total / 1e9, 100.0 * g->done / (double)g->total,
                g->done / 1e6 / (t - g->t0 + 1e-9));
    }
    return SN_OK;
}

static const char *human(double bytes, char *buf, size_t n)
{
    if (bytes >= 1e9) snprintf(buf, n, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6) snprintf(buf, n, "%.1f MB", bytes / 1e6);
    else snprintf(buf, n, "%.0f KB", bytes / 1e3);
    return buf;
}

/* ---- output ---------------------------------------------------------------- */

static sn_status write_config(const char *cfg_path, const char *out_dir, const plan *p)
{
    json_error_t err;
    json_t *root = json_load_file(cfg_path, 0, &err);
    if (!root) return SN_FAIL(SN_E_FORMAT, "%s: line %d column %d: %s", cfg_path, err.line, err.column, err.text);
    json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", p->group, "bits", p->bits, "mode", "affine");
    sn_status rc = SN_OK;
    if (!q || json_object_update(q, p->overrides) != 0) { rc = SN_FAIL(SN_E_NOMEM, "out of memory"); goto out; }
    json_object_set(root, "quantization", q);
    json_object_set(root, "quantization_config", q);
    json_t *tc = json_object_get(root, "text_config");
    if (json_is_object(tc)) {   /* ours at the top level is the one that counts; drop stale nested ones */
        json_object_del(tc, "quantization");
        json_object_del(tc, "quantization_config");
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        rc = SN_FAIL(SN_E_IO, "%s: cannot write", path);
out:
    json_decref(q);
    json_decref(root);
    return rc;
}

static sn_status write_shards(const plan *p, const char *dir, size_t shard_max, int tty)
{
    sn_status rc = SN_OK;
    int n_shards = 0;
    size_t cur = 0, total = 0;
    for (size_t i = 0; i < p->n; i++) {
        /* greedy in declaration order: a layer's tensors stay together */
        if (n_shards == 0 || (cur > 0 && cur + p->s[i].nbytes > shard_max)) { n_shards++; cur = 0; }
        p->s[i].shard = n_shards - 1;
        cur += p->s[i].nbytes;
        total += p->s[i].nbytes;
    }
    struct statvfs vf;
    if (statvfs(dir, &vf) == 0 && (double)vf.f_bavail * vf.f_frsize < (double)total * 1.01)
        return SN_FAIL(SN_E_IO, "%s: %.2f GB free, the checkpoint needs %.2f GB", dir,
                       (double)vf.f_bavail * vf.f_frsize / 1e9, total / 1e9);
    size_t *idx = malloc(p->n * sizeof *idx);
    json_t *wm = json_object();
    if (!idx || !wm) { free(idx); json_decref(wm); return SN_FAIL(SN_E_NOMEM, "out of memory"); }
    gen g = {.p = p, .idx = idx, .total = total, .tty = tty, .t0 = now_s(), .n_shards = n_shards, .cur = (size_t)-1};
    char fname[64], path[4096];
    for (int sh = 0; sh < n_shards && rc == SN_OK; sh++) {
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        sn_st_writer *w = NULL;
        if ((rc = sn_st_writer_new(&w)) != SN_OK) break;
        size_t k = 0;
        for (size_t i = 0; i < p->n && rc == SN_OK; i++) {
            if (p->s[i].shard != sh) continue;
            idx[k++] = i;
            rc = sn_st_writer_add(w, p->s[i].name, p->s[i].dt, p->s[i].ndim, p->s[i].shape, NULL);
            if (rc == SN_OK && json_object_set_new(wm, p->s[i].name, json_string(fname)) != 0)
                rc = SN_FAIL(SN_E_NOMEM, "out of memory");
        }
        g.shard = sh + 1;
        if (rc == SN_OK) rc = sn_st_writer_write(w, path, fill, &g);
        size_t bytes = sn_st_writer_data_bytes(w);
        sn_st_writer_free(w);
        char hb[32];
        if (rc == SN_OK && !tty) fprintf(stderr, "sanctum-synth: wrote %s (%s)\n", path, human((double)bytes, hb, sizeof hb));
    }
    if (tty) fputc('\n', stderr);
    if (rc == SN_OK && n_shards > 1) {
        json_t *idxj = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!idxj || json_dump_file(idxj, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
            rc = SN_FAIL(SN_E_IO, "%s: cannot write", path);
        json_decref(idxj);
    }
    json_decref(wm);
    free(idx);
    return rc;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: sanctum-synth --config CONFIG.json --out DIR [--seed N] [--bits 4|8] [--group 32|64|128]\n"
            "                     [--shard-size N[K|M|G] (default 5G; decimal units)] [--dry-run]\n"
            "--dry-run lists every tensor (name, dtype, shape) on stdout and writes nothing.\n"
            "Writes a random-weight MLX-layout checkpoint for a qwen3_5, qwen3_5_moe, qwen2 or mistral config.\n");
}

static int parse_num(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* "5G", "300M", "64K" or plain bytes; decimal units like the 5 GB shard rule. */
static int parse_size(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v <= 0) return 0;
    long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1000LL, end++;
    else if (*end == 'M' || *end == 'm') mul = 1000000LL, end++;
    else if (*end == 'G' || *end == 'g') mul = 1000000000LL, end++;
    if (*end || v > (1LL << 50) / mul) return 0;
    *out = v * mul;
    return 1;
}

int main(int argc, char **argv)
{
    const char *cfg_path = NULL, *out = NULL;
    long long seed = 0, bits = 4, group = 64, shard = 5000000000LL;
    int dry = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (!strcmp(a, "--config") && ok) cfg_path = v;
        else if (!strcmp(a, "--out") && ok) out = v;
        else if (!strcmp(a, "--seed") && ok) ok = parse_num(v, 0, (long long)1 << 62, &seed);
        else if (!strcmp(a, "--bits") && ok) ok = parse_num(v, 4, 8, &bits) && (bits == 4 || bits == 8);
        else if (!strcmp(a, "--group") && ok) ok = parse_num(v, 32, 128, &group) && (group == 32 || group == 64 || group == 128);
        else if (!strcmp(a, "--shard-size") && ok) ok = parse_size(v, &shard);
        else if (!strcmp(a, "--dry-run")) { dry = 1; continue; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else ok = 0;
        if (!ok) {
            fprintf(stderr, "sanctum-synth: bad argument %s%s%s\n", a, v ? " " : "", v ? v : "");
            usage();
            return 2;
        }
        i++;
    }
    if (!cfg_path || !out) { usage(); return 2; }

    sn_config *c = NULL;
    plan p = {.bits = (int)bits, .group = (int)group, .seed = (uint64_t)seed, .overrides = json_object()};
    sn_status rc = sn_config_load(cfg_path, &c);
    if (rc == SN_OK && !dry && mkdir(out, 0755) != 0 && errno != EEXIST)
        rc = SN_FAIL(SN_E_IO, "%s: cannot create: %s", out, strerror(errno));
    if (rc == SN_OK && !p.overrides) rc = SN_FAIL(SN_E_NOMEM, "out of memory");
    if (rc == SN_OK) rc = build_plan(&p, c);
    if (rc == SN_OK) {
        size_t total = 0;
        for (size_t i = 0; i < p.n; i++) total += p.s[i].nbytes;
        char hb[32];
        fprintf(stderr, "sanctum-synth: %s, %d layers, %zu tensors, %s at %lld-bit g%lld -> %s\n",
                sn_arch_name(c->arch), c->n_layers, p.n, human((double)total, hb, sizeof hb), bits, group, out);
        if (dry) {
            for (size_t i = 0; i < p.n; i++) {
                printf("%s %s [", p.s[i].name, sn_dtype_name(p.s[i].dt));
                for (int d = 0; d < p.s[i].ndim; d++) printf("%s%lld", d ? ", " : "", (long long)p.s[i].shape[d]);
                printf("]\n");
            }
        } else {
            rc = write_shards(&p, out, (size_t)shard, isatty(2));
        }
    }
    if (rc == SN_OK && !dry) rc = write_config(cfg_path, out, &p);
    if (rc == SN_OK && !dry) {
        /* read it back through the real reader: the header must validate */
        sn_st *st = NULL;
        rc = sn_st_open(out, &st);
        if (rc == SN_OK && sn_st_count(st) != p.n)
            rc = SN_FAIL(SN_E_FORMAT, "%s: read back %zu tensors, wrote %zu", out, sn_st_count(st), p.n);
        sn_st_close(st);
    }
    if (rc == SN_OK && !dry) {
        sn_config *back = NULL;
        rc = sn_config_load(out, &back);
        sn_config_free(back);
    }
    sn_config_free(c);
    json_decref(p.overrides);
    free(p.s);
    if (rc != SN_OK) {
        fprintf(stderr, "sanctum-synth: %s: %s\n", sn_status_name(rc), sn_errmsg());
        return 1;
    }
    fprintf(stderr, "sanctum-synth: done\n");
    return 0;
}
