/* Models and helpers shared by test_prompt_cache.c and test_pld.c.
 *
 * Every architecture is covered whether or not the reference fixtures have
 * landed: a tiny random checkpoint of each (qwen3_5 hybrid, qwen3_5_moe,
 * qwen2, mistral) is written with build/sanctum-synth into a temporary
 * directory; the transformers fixtures tests/fixtures/<arch>/mlx and the
 * trained default model models/default are added when present. Decoded
 * text goes through the Qwen3 tokenizer fixture (ids < 512 are byte and
 * merge tokens there), so byte-identical output is checked as text and as
 * token ids. The backend is pf_backend (CPU unless a CUDA test sets it);
 * sanctum-synth is found next to the test binary (../sanctum-synth or
 * ./sanctum-synth: a build dir or the GPU box's packed bin/), else
 * build/sanctum-synth, or where $SANCTUM_SYNTH says. */
#ifndef PCACHE_FIXTURES_H
#define PCACHE_FIXTURES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "sanctum/generate.h"
#include "sanctum/model.h"
#include "sanctum/prompt_cache.h"
#include "sanctum/tokenizer.h"

#define PF_MAX_MODELS 12

typedef struct {
    char name[64];
    sn_model *m;
    int vocab;
    bool recurrent;   /* has GatedDeltaNet layers */
} pf_model;

static pf_model pf_models[PF_MAX_MODELS];
static int pf_n;
static sn_backend_kind pf_backend = SN_BACKEND_CPU;
static sn_tokenizer *pf_tok;
static char pf_tmp[256];

static const char *pf_configs[][2] = {
    { "synth_qwen3_5",
      "{\"model_type\":\"qwen3_5\",\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],"
      "\"text_config\":{\"model_type\":\"qwen3_5_text\",\"vocab_size\":512,\"hidden_size\":64,"
      "\"intermediate_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
      "\"head_dim\":64,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":32,"
      "\"linear_value_head_dim\":32,\"linear_conv_kernel_dim\":4,\"full_attention_interval\":4,"
      "\"rms_norm_eps\":1e-6,\"max_position_embeddings\":4096,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,"
      "\"eos_token_id\":511,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,"
      "\"partial_rotary_factor\":0.25,\"mrope_section\":[2,1,1],\"mrope_interleaved\":true}},"
      "\"tie_word_embeddings\":false,\"eos_token_id\":511}" },
    { "synth_qwen3_5_moe",
      "{\"model_type\":\"qwen3_5_moe\",\"architectures\":[\"Qwen3_5MoeForConditionalGeneration\"],"
      "\"text_config\":{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":512,\"hidden_size\":64,"
      "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
      "\"head_dim\":64,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":32,"
      "\"linear_value_head_dim\":32,\"linear_conv_kernel_dim\":4,\"full_attention_interval\":4,"
      "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":64,"
      "\"shared_expert_intermediate_size\":64,"
      "\"rms_norm_eps\":1e-6,\"max_position_embeddings\":4096,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,"
      "\"eos_token_id\":511,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,"
      "\"partial_rotary_factor\":0.25,\"mrope_section\":[2,1,1],\"mrope_interleaved\":true}},"
      "\"tie_word_embeddings\":false,\"eos_token_id\":511}" },
    { "synth_qwen2",
      "{\"model_type\":\"qwen2\",\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,"
      "\"intermediate_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
      "\"rms_norm_eps\":1e-6,\"tie_word_embeddings\":true,\"max_position_embeddings\":4096,"
      "\"hidden_act\":\"silu\",\"rope_theta\":1000000.0,\"eos_token_id\":511}" },
    { "synth_mistral",
      "{\"model_type\":\"mistral\",\"architectures\":[\"MistralForCausalLM\"],\"vocab_size\":512,"
      "\"hidden_size\":128,\"intermediate_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
      "\"num_key_value_heads\":2,\"head_dim\":32,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":false,"
      "\"max_position_embeddings\":4096,\"hidden_act\":\"silu\",\"sliding_window\":null,"
      "\"rope_theta\":1000000000.0,\"eos_token_id\":511}" },
};

static bool pf_add(const char *name, const char *dir)
{
    if (pf_n >= PF_MAX_MODELS) return false;
    sn_load_opts o = { .n_threads = 2, .backend = pf_backend, .gpu = 0 };
    pf_model *pm = &pf_models[pf_n];
    if (sn_model_load(dir, &o, &pm->m) != SN_OK) {
        fprintf(stderr, "  loading %s (%s): %s\n", name, dir, sn_errmsg());
        return false;
    }
    snprintf(pm->name, sizeof pm->name, "%s", name);
    pm->vocab = sn_model_get_info(pm->m)->vocab_size;
    const char *mt = sn_model_get_info(pm->m)->model_type;
    pm->recurrent = !strncmp(mt, "qwen3_5", 7);
    pf_n++;
    return true;
}

static void pf_rmrf(void)
{
    if (!pf_tmp[0]) return;
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pf_tmp);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", pf_tmp);
}

/* The sanctum-synth binary into out (see the top). */
static bool pf_synth_path(char *out, size_t cap)
{
    const char *e = getenv("SANCTUM_SYNTH");
    if (e && *e) {
        snprintf(out, cap, "%s", e);
        return access(out, X_OK) == 0;
    }
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(out, cap, "%s/../sanctum-synth", self);
            if (access(out, X_OK) == 0) return true;
            snprintf(out, cap, "%s/sanctum-synth", self);
            if (access(out, X_OK) == 0) return true;
        }
    }
    snprintf(out, cap, "build/sanctum-synth");
    return access(out, X_OK) == 0;
}

/* Loads the tokenizer and every model; false (with a message) when the
 * synthetic ones cannot be made, which fails the suite. */
static bool pf_setup(void)
{
    snprintf(pf_tmp, sizeof pf_tmp, "/tmp/sn_pcache_XXXXXX");
    if (!mkdtemp(pf_tmp)) { pf_tmp[0] = 0; return false; }
    char cmd[2048], dir[512];
    snprintf(cmd, sizeof cmd, "gzip -dc tests/fixtures/tokenizer/qwen3/tokenizer.json.gz > %s/tokenizer.json", pf_tmp);
    if (system(cmd) != 0) { fprintf(stderr, "  cannot unpack the tokenizer fixture\n"); return false; }
    snprintf(dir, sizeof dir, "%s/tokenizer.json", pf_tmp);
    if (sn_tok_load(dir, "qwen3", &pf_tok) != SN_OK) { fprintf(stderr, "  tokenizer: %s\n", sn_errmsg()); return false; }
    char synth[600];
    if (!pf_synth_path(synth, sizeof synth)) { fprintf(stderr, "  sanctum-synth missing (make; or set SANCTUM_SYNTH)\n"); return false; }
    for (size_t i = 0; i < sizeof pf_configs / sizeof pf_configs[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s.json", pf_tmp, pf_configs[i][0]);
        FILE *f = fopen(dir, "w");
        if (!f) return false;
        fputs(pf_configs[i][1], f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "'%s' --config %s/%s.json --out %s/%s --seed %zu >/dev/null 2>&1", synth,
                 pf_tmp, pf_configs[i][0], pf_tmp, pf_configs[i][0], 7 + i);
        if (system(cmd) != 0) { fprintf(stderr, "  sanctum-synth failed for %s\n", pf_configs[i][0]); return false; }
        snprintf(dir, sizeof dir, "%s/%s", pf_tmp, pf_configs[i][0]);
        if (!pf_add(pf_configs[i][0], dir)) return false;
    }
    static const char *fx[] = { "qwen3_5", "qwen3_5_moe", "qwen2", "mistral" };
    for (size_t i = 0; i < 4; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/%s/mlx", fx[i]);
        char nm[64];
        snprintf(nm, sizeof nm, "fixture_%s", fx[i]);
        if (access(dir, R_OK) == 0) pf_add(nm, dir);
    }
    if (access("models/default/config.json", R_OK) == 0) pf_add("default", "models/default");
    return true;
}

static void pf_teardown(void)
{
    for (int i = 0; i < pf_n; i++) sn_model_free(pf_models[i].m);
    sn_tok_free(pf_tok);
    pf_rmrf();
}

/* Deterministic token ids in [lo, hi). */
static void pf_tokens(int32_t *out, int n, uint64_t seed, int lo, int hi)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[i] = lo + (int32_t)(x % (uint64_t)(hi - lo));
    }
}

/* A run of sn_generate: the text and the token ids it produced. */
typedef struct {
    char *text;
    size_t len, cap;
    int32_t ids[1024];
    int n_ids;
    sn_gen_result res;
    sn_status st;
} pf_out;

static sn_status pf_text_cb(void *ud, const char *t, size_t n, int k)
{
    (void)k;
    pf_out *o = ud;
    if (o->len + n + 1 > o->cap) {
        size_t nc = (o->len + n + 1) * 2;
        char *p = realloc(o->text, nc);
        if (!p) return SN_E_NOMEM;
        o->text = p;
        o->cap = nc;
    }
    memcpy(o->text + o->len, t, n);
    o->len += n;
    o->text[o->len] = 0;
    return SN_OK;
}

static void pf_id_cb(void *ud, int32_t id)
{
    pf_out *o = ud;
    if (o->n_ids < 1024) o->ids[o->n_ids++] = id;
}

static void pf_params(sn_gen_params *p, int max_tokens)
{
    memset(p, 0, sizeof *p);
    sn_sample_params_default(&p->sample);
    p->max_tokens = max_tokens;
    p->flush_tokens = 3;
    p->prefill_chunk = 0;
    p->on_token = pf_id_cb;
}

/* Generates from a fresh sequence (position 0) with params p; o is reset. */
static void pf_gen(sn_model *m, int max_ctx, const int32_t *prompt, int n, const sn_gen_params *p0, pf_out *o)
{
    free(o->text);
    memset(o, 0, sizeof *o);
    sn_gen_params p = *p0;
    p.ud = o;
    sn_seq *s = NULL;
    o->st = sn_seq_new(m, max_ctx, &s);
    if (o->st == SN_OK) o->st = sn_generate(m, pf_tok, s, prompt, n, &p, pf_text_cb, &o->res);
    if (o->st != SN_OK) fprintf(stderr, "  generate: %s\n", sn_errmsg());
    sn_seq_free(s);
}

static bool pf_same(const pf_out *a, const pf_out *b)
{
    if (a->st != SN_OK || b->st != SN_OK) return false;
    if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, (size_t)a->n_ids * sizeof(int32_t)) != 0) return false;
    if (a->len != b->len || (a->len && memcmp(a->text, b->text, a->len) != 0)) return false;
    return a->res.finish == b->res.finish && a->res.completion_tokens == b->res.completion_tokens;
}

static void pf_out_free(pf_out *o)
{
    free(o->text);
    o->text = NULL;
}

#endif
