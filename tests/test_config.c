/* config.json parsing: each architecture, text_config nesting, fallbacks,
 * quantization overrides, and the errors for bad or unsupported configs. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "sanctum/config.h"

static const char *QWEN2 =
    "{\"model_type\":\"qwen2\",\"hidden_size\":1024,\"num_hidden_layers\":4,\"intermediate_size\":2816,"
    "\"num_attention_heads\":16,\"num_key_value_heads\":4,\"head_dim\":128,\"vocab_size\":151936,"
    "\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,"
    "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768},"
    "\"tie_word_embeddings\":true,\"use_sliding_window\":false,\"bos_token_id\":151643,\"eos_token_id\":151645}";

static const char *MISTRAL =
    "{\"model_type\":\"mistral\",\"hidden_size\":5120,\"num_hidden_layers\":40,\"intermediate_size\":32768,"
    "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":128,\"vocab_size\":131072,"
    "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,\"rope_theta\":1000000000.0,"
    "\"sliding_window\":null,\"tie_word_embeddings\":false,\"bos_token_id\":1,\"eos_token_id\":2}";

static const char *MINISTRAL3 =
    "{\"model_type\":\"mistral3\",\"text_config\":{\"model_type\":\"ministral3\",\"hidden_size\":5120,"
    "\"num_hidden_layers\":4,\"intermediate_size\":32768,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
    "\"head_dim\":128,\"vocab_size\":131072,\"max_position_embeddings\":393216,\"rms_norm_eps\":1e-5,"
    "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":100000000.0,\"factor\":48.0,"
    "\"original_max_position_embeddings\":8192,\"beta_fast\":32.0,\"beta_slow\":1.0,\"mscale\":1.0,"
    "\"mscale_all_dim\":1.0,\"llama_4_scaling_beta\":0.1}},\"vision_config\":{}}";

/* Parse base with one field replaced (value_json) or removed (NULL).
 * path: "key" at the root or "text_config.key". */
static sn_status parse_with(const char *base, const char *path, const char *value_json, sn_config **out)
{
    json_t *root = json_loads(base, 0, NULL);
    SN_ASSERT(root);
    json_t *obj = root;
    const char *key = path;
    if (path && strncmp(path, "text_config.", 12) == 0) {
        obj = json_object_get(root, "text_config");
        key = path + 12;
    }
    if (path) {
        if (value_json) {
            json_t *v = json_loads(value_json, JSON_DECODE_ANY, NULL);
            SN_ASSERT(v);
            json_object_set_new(obj, key, v);
        } else {
            json_object_del(obj, key);
        }
    }
    char *s = json_dumps(root, 0);
    json_decref(root);
    sn_status rc = sn_config_parse(s, strlen(s), "config.json", NULL, 0, out);
    free(s);
    return rc;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 16);
    size_t n = fread(b, 1, (1 << 16) - 1, f);
    fclose(f);
    b[n] = 0;
    return b;
}

static void test_qwen3_5_27b(void)
{
    sn_config *c = NULL;
    CHECK_OK(sn_config_load("bench/configs/qwen3_5_27b.json", &c));
    if (!c) return;
    CHECK(c->arch == SN_ARCH_QWEN3_5 && strcmp(c->model_type, "qwen3_5") == 0 && c->has_text_config);
    CHECK(c->hidden_size == 5120 && c->n_layers == 64 && c->intermediate_size == 17408);
    CHECK(c->n_heads == 24 && c->n_kv_heads == 4 && c->head_dim == 256);
    CHECK(c->linear_num_key_heads == 16 && c->linear_num_value_heads == 48 && c->linear_key_head_dim == 128 &&
          c->linear_value_head_dim == 128 && c->linear_conv_kernel_dim == 4);
    CHECK(c->vocab_size == 248320 && c->max_position_embeddings == 262144 && c->rms_norm_eps == 1e-6);
    CHECK(c->rope_theta == 1e7 && c->partial_rotary_factor == 0.25 && c->rotary_dim == 64);
    CHECK(c->rope.kind == SN_ROPE_DEFAULT && c->rope.factor == 1.0);
    CHECK(!c->tie_word_embeddings && !c->attention_bias && !c->quantized);
    CHECK(c->full_attention_interval == 4);
    int full = 0;
    for (int i = 0; i < c->n_layers; i++) {
        CHECK(c->layer_kind[i] == ((i + 1) % 4 == 0 ? SN_LAYER_FULL : SN_LAYER_LINEAR));
        full += c->layer_kind[i] == SN_LAYER_FULL;
    }
    CHECK(full == 16);
    /* no generation_config next to it: root eos then text eos */
    CHECK(c->n_eos == 2 && c->eos_ids[0] == 248046 && c->eos_ids[1] == 248044);
    CHECK(c->pad_token_id == 248044 && c->bos_token_id == -1);
    int bits = -1, group = -1;
    CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.0.mlp.gate_proj", &bits, &group));
    CHECK(bits == 0 && group == 0);
    CHECK(strcmp(sn_arch_name(c->arch), "qwen3_5") == 0);
    sn_config_free(c);
    sn_config_free(NULL);
}

static void test_qwen3_5_moe(void)
{
    char *base = slurp("bench/configs/qwen3_5_35b_a3b.json");
    CHECK(base != NULL);
    if (!base) return;
    sn_config *c = NULL;
    CHECK_OK(parse_with(base, NULL, NULL, &c));
    if (c) {
        CHECK(c->arch == SN_ARCH_QWEN3_5_MOE && c->hidden_size == 2048 && c->n_layers == 40);
        CHECK(c->n_experts == 256 && c->n_experts_per_tok == 8 && c->moe_intermediate_size == 512 &&
              c->shared_expert_intermediate_size == 512 && c->norm_topk_prob);
        CHECK(c->intermediate_size == 0 && c->linear_num_value_heads == 32 && c->n_kv_heads == 2);
        sn_config_free(c);
    }
    CHECK_OK(parse_with(base, "text_config.norm_topk_prob", "false", &c));
    CHECK(c && !c->norm_topk_prob);
    sn_config_free(c);
    c = NULL;
    /* MoE sizes are required, not guessed */
    CHECK(parse_with(base, "text_config.moe_intermediate_size", NULL, &c) == SN_E_MISSING &&
          strstr(sn_errmsg(), "text_config.moe_intermediate_size"));
    CHECK(parse_with(base, "text_config.num_experts_per_tok", "300", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "num_experts_per_tok"));
    CHECK(c == NULL);
    /* Regression: dims past the kernels' limits loaded and then failed
     * every forward ("gdn: ... conv_k=64 (max 16)"); now config errors. */
    CHECK(parse_with(base, "text_config.num_experts_per_tok", "65", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "[1, 64]"));
    CHECK(parse_with(base, "text_config.linear_conv_kernel_dim", "64", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "linear_conv_kernel_dim"));
    CHECK(parse_with(base, "text_config.linear_value_head_dim", "1024", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "linear_value_head_dim"));
    CHECK(parse_with(base, "text_config.linear_key_head_dim", "512", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "linear_key_head_dim"));
    CHECK(c == NULL);
    CHECK(parse_with(base, "text_config.linear_conv_kernel_dim", "1", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "[2, 16]"));
    CHECK_OK(parse_with(base, "text_config.linear_conv_kernel_dim", "16", &c));
    sn_config_free(c);
    c = NULL;
    free(base);
}

static void test_qwen3_5_fallbacks(void)
{
    char *base = slurp("bench/configs/qwen3_5_1b.json");
    CHECK(base != NULL);
    if (!base) return;
    sn_config *c = NULL;
    /* layer_types wins over full_attention_interval */
    char lt[1024] = "[";
    for (int i = 0; i < 16; i++)
        strcat(lt, i % 2 ? "\"linear_attention\"," : "\"full_attention\",");
    lt[strlen(lt) - 1] = ']';
    CHECK_OK(parse_with(base, "text_config.layer_types", lt, &c));
    CHECK(c && c->layer_kind[0] == SN_LAYER_FULL && c->layer_kind[1] == SN_LAYER_LINEAR &&
          c->layer_kind[3] == SN_LAYER_LINEAR && c->layer_kind[14] == SN_LAYER_FULL);
    sn_config_free(c);
    c = NULL;
    CHECK(parse_with(base, "text_config.layer_types", "[\"full_attention\"]", &c) == SN_E_FORMAT &&
          strstr(sn_errmsg(), "layer_types"));
    CHECK(parse_with(base, "text_config.layer_types", "[\"sliding_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\"]", &c) == SN_E_FORMAT &&
          strstr(sn_errmsg(), "layer_types[0]"));
    /* tie_word_embeddings: text_config, else root */
    CHECK_OK(parse_with(base, "text_config.tie_word_embeddings", NULL, &c));
    CHECK(c && c->tie_word_embeddings);
    sn_config_free(c);
    c = NULL;
    CHECK_OK(parse_with(base, "text_config.tie_word_embeddings", "false", &c));
    CHECK(c && !c->tie_word_embeddings);
    sn_config_free(c);
    c = NULL;
    /* rope_theta at the text root wins over rope_parameters; partial rotary likewise */
    CHECK_OK(parse_with(base, "text_config.rope_theta", "5000000", &c));
    CHECK(c && c->rope_theta == 5e6 && c->rotary_dim == 64);
    sn_config_free(c);
    c = NULL;
    CHECK_OK(parse_with(base, "text_config.partial_rotary_factor", "0.5", &c));
    CHECK(c && c->rotary_dim == 128);
    sn_config_free(c);
    c = NULL;
    /* the same dict serialised as rope_scaling (older transformers): theta and partial from it */
    json_t *rr = json_loads(base, 0, NULL);
    json_t *rtc = json_object_get(rr, "text_config");
    json_t *rpar = json_incref(json_object_get(rtc, "rope_parameters"));
    json_object_del(rtc, "rope_parameters");
    json_object_set_new(rpar, "rope_theta", json_real(2e6));
    json_object_set_new(rpar, "partial_rotary_factor", json_real(0.5));
    json_object_set_new(rtc, "rope_scaling", rpar);
    char *rs = json_dumps(rr, 0);
    json_decref(rr);
    CHECK_OK(sn_config_parse(rs, strlen(rs), "rs.json", NULL, 0, &c));
    CHECK(c && c->rope_theta == 2e6 && c->rotary_dim == 128 && c->rope.kind == SN_ROPE_DEFAULT);
    sn_config_free(c);
    c = NULL;
    free(rs);
    /* no text_config: the root is the text config */
    json_t *r = json_loads(base, 0, NULL);
    json_t *tc = json_incref(json_object_get(r, "text_config"));
    json_decref(r);
    json_object_set_new(tc, "model_type", json_string("qwen3_5"));
    char *flat = json_dumps(tc, 0);
    json_decref(tc);
    CHECK_OK(sn_config_parse(flat, strlen(flat), "flat.json", NULL, 0, &c));
    CHECK(c && !c->has_text_config && c->hidden_size == 2048 && c->n_eos == 1 && c->eos_ids[0] == 248044);
    sn_config_free(c);
    c = NULL;
    free(flat);
    /* consistency and type checks name the field */
    CHECK(parse_with(base, "text_config.linear_num_value_heads", "24", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "linear_num_value_heads 24"));
    CHECK(parse_with(base, "text_config.num_key_value_heads", "3", &c) == SN_E_RANGE &&
          strstr(sn_errmsg(), "num_key_value_heads 3"));
    CHECK(parse_with(base, "text_config.hidden_size", NULL, &c) == SN_E_MISSING &&
          strstr(sn_errmsg(), "\"text_config.hidden_size\""));
    CHECK(parse_with(base, "text_config.hidden_size", "\"2048\"", &c) == SN_E_FORMAT &&
          strstr(sn_errmsg(), "text_config.hidden_size") && strstr(sn_errmsg(), "integer"));
    CHECK(parse_with(base, "text_config.hidden_size", "-5", &c) == SN_E_RANGE);
    CHECK(parse_with(base, "text_config.head_dim", NULL, &c) == SN_E_MISSING && strstr(sn_errmsg(), "head_dim"));
    CHECK(parse_with(base, "text_config.num_hidden_layers", "100000", &c) == SN_E_RANGE);
    CHECK(parse_with(base, "text_config.rms_norm_eps", "0", &c) == SN_E_RANGE && strstr(sn_errmsg(), "rms_norm_eps"));
    CHECK(parse_with(base, "eos_token_id", "[248046, 999999]", &c) == SN_E_FORMAT && strstr(sn_errmsg(), "eos_token_id"));
    CHECK(parse_with(base, "text_config", "[]", &c) == SN_E_FORMAT && strstr(sn_errmsg(), "text_config"));
    CHECK(c == NULL);
    free(base);
}

static void test_qwen2(void)
{
    sn_config *c = NULL;
    CHECK_OK(parse_with(QWEN2, NULL, NULL, &c));
    if (c) {
        CHECK(c->arch == SN_ARCH_QWEN2 && !c->has_text_config);
        CHECK(c->head_dim == 64);   /* hidden/heads; the head_dim key is ignored */
        CHECK(c->attention_bias && c->tie_word_embeddings && c->n_kv_heads == 4);
        CHECK(c->rope_theta == 1e6 && c->rotary_dim == 64 && c->partial_rotary_factor == 1.0);
        CHECK(c->rope.kind == SN_ROPE_YARN && c->rope.factor == 4.0 && c->rope.original_max_position == 32768 &&
              c->rope.beta_fast == 32.0 && c->rope.beta_slow == 1.0 && c->rope.mscale == 1.0);
        CHECK(c->bos_token_id == 151643 && c->n_eos == 1 && c->eos_ids[0] == 151645);
        for (int i = 0; i < c->n_layers; i++) CHECK(c->layer_kind[i] == SN_LAYER_FULL);
        sn_config_free(c);
        c = NULL;
    }
    /* transformers-v5 style: theta and yarn only in rope_parameters */
    CHECK_OK(parse_with(QWEN2, "rope_theta", NULL, &c));
    CHECK(c && c->rope_theta == 10000.0);   /* HF default when nothing says otherwise */
    sn_config_free(c);
    c = NULL;
    json_t *r = json_loads(QWEN2, 0, NULL);
    json_object_del(r, "rope_theta");
    json_object_del(r, "rope_scaling");
    json_object_set_new(r, "rope_parameters", json_loads("{\"rope_type\":\"yarn\",\"rope_theta\":1000000.0,"
                                                         "\"factor\":2.0}", 0, NULL));
    char *s = json_dumps(r, 0);
    json_decref(r);
    CHECK_OK(sn_config_parse(s, strlen(s), "v5.json", NULL, 0, &c));
    CHECK(c && c->rope_theta == 1e6 && c->rope.kind == SN_ROPE_YARN && c->rope.factor == 2.0 &&
          c->rope.original_max_position == 32768);
    sn_config_free(c);
    c = NULL;
    free(s);
    /* rope_parameters of type default is no scaling */
    CHECK_OK(parse_with(QWEN2, "rope_scaling", "null", &c));
    CHECK(c && c->rope.kind == SN_ROPE_DEFAULT);
    sn_config_free(c);
    c = NULL;
    CHECK_OK(parse_with(QWEN2, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":2}", &c));
    CHECK(c && c->rope.kind == SN_ROPE_LINEAR && c->rope.factor == 2.0);
    sn_config_free(c);
    c = NULL;
    CHECK(parse_with(QWEN2, "rope_scaling", "{\"rope_type\":\"dynamic\",\"factor\":2}", &c) == SN_E_UNSUPPORTED &&
          strstr(sn_errmsg(), "\"dynamic\""));
    CHECK(parse_with(QWEN2, "rope_scaling", "{\"type\":\"yarn\"}", &c) == SN_E_MISSING &&
          strstr(sn_errmsg(), "rope_scaling.factor"));
    /* absent tie: HF default false, not mlx-lm's true */
    CHECK_OK(parse_with(QWEN2, "tie_word_embeddings", NULL, &c));
    CHECK(c && !c->tie_word_embeddings);
    sn_config_free(c);
    c = NULL;
    CHECK(parse_with(QWEN2, "num_attention_heads", "12", &c) == SN_E_RANGE);  /* 12 % 4 ok, 1024 % 12 != 0 */
    CHECK(c == NULL);
    /* Regression: 512 query heads on one kv head loaded, then every
     * forward failed in the CPU attention kernel (max group 256). */
    json_t *g = json_loads(QWEN2, 0, NULL);
    json_object_set_new(g, "num_attention_heads", json_integer(512));
    json_object_set_new(g, "num_key_value_heads", json_integer(1));
    json_object_set_new(g, "hidden_size", json_integer(1024 * 8));
    s = json_dumps(g, 0);
    json_decref(g);
    CHECK(sn_config_parse(s, strlen(s), "gqa.json", NULL, 0, &c) == SN_E_RANGE && strstr(sn_errmsg(), "512 query heads"));
    CHECK(c == NULL);
    free(s);
    /* Regression: qwen2 ignored layer_types, so a list of the wrong length
     * or with unknown entries loaded silently (HF refuses both). */
    CHECK(parse_with(QWEN2, "layer_types", "[\"full_attention\",\"full_attention\",\"full_attention\"]", &c) ==
              SN_E_FORMAT &&
          strstr(sn_errmsg(), "list of 4"));
    CHECK(parse_with(QWEN2, "layer_types",
                     "[\"full_attention\",\"linear_attention\",\"full_attention\",\"full_attention\"]", &c) ==
              SN_E_FORMAT &&
          strstr(sn_errmsg(), "layer_types[1]") && strstr(sn_errmsg(), "linear_attention"));
    CHECK(parse_with(QWEN2, "layer_types", "[\"full_attention\",1,\"full_attention\",\"full_attention\"]", &c) ==
              SN_E_FORMAT &&
          strstr(sn_errmsg(), "not a string"));
    CHECK(c == NULL);
    /* sliding_attention without use_sliding_window is full attention in HF */
    const char *sl = "[\"full_attention\",\"full_attention\",\"sliding_attention\",\"sliding_attention\"]";
    CHECK_OK(parse_with(QWEN2, "layer_types", sl, &c));
    CHECK(c && c->layer_kind[3] == SN_LAYER_FULL);
    sn_config_free(c);
    c = NULL;
    json_t *w = json_loads(QWEN2, 0, NULL);
    json_object_set_new(w, "use_sliding_window", json_true());
    json_object_set_new(w, "sliding_window", json_integer(4096));
    json_object_set_new(w, "layer_types", json_loads(sl, 0, NULL));
    s = json_dumps(w, 0);
    json_decref(w);
    CHECK(sn_config_parse(s, strlen(s), "sw.json", NULL, 0, &c) == SN_E_UNSUPPORTED &&
          strstr(sn_errmsg(), "layer 2 is sliding_attention"));
    CHECK(c == NULL);
    free(s);
}

static void test_mistral(void)
{
    sn_config *c = NULL;
    CHECK_OK(parse_with(MISTRAL, NULL, NULL, &c));
    if (c) {
        CHECK(c->arch == SN_ARCH_MISTRAL && !c->ministral3 && c->head_dim == 128);  /* honoured: 5120/32 = 160 */
        CHECK(c->rope_theta == 1e9 && c->rms_norm_eps == 1e-5 && c->sliding_window == 0 && !c->attention_bias);
        CHECK(c->rotary_dim == 128 && c->n_eos == 1 && c->eos_ids[0] == 2 && c->bos_token_id == 1);
        sn_config_free(c);
        c = NULL;
    }
    CHECK_OK(parse_with(MISTRAL, "head_dim", NULL, &c));
    CHECK(c && c->head_dim == 160);
    sn_config_free(c);
    c = NULL;
    /* sliding layers only where layer_types says so */
    json_t *r = json_loads(MISTRAL, 0, NULL);
    json_object_set_new(r, "sliding_window", json_integer(4096));
    json_t *lt = json_array();
    for (int i = 0; i < 40; i++) json_array_append_new(lt, json_string(i % 2 ? "full_attention" : "sliding_attention"));
    json_object_set_new(r, "layer_types", lt);
    char *s = json_dumps(r, 0);
    CHECK_OK(sn_config_parse(s, strlen(s), "sw.json", NULL, 0, &c));
    CHECK(c && c->sliding_window == 4096 && c->layer_kind[0] == SN_LAYER_SLIDING && c->layer_kind[1] == SN_LAYER_FULL);
    sn_config_free(c);
    c = NULL;
    free(s);
    json_object_set_new(r, "sliding_window", json_null());
    s = json_dumps(r, 0);
    json_decref(r);
    CHECK(sn_config_parse(s, strlen(s), "sw.json", NULL, 0, &c) == SN_E_MISSING && strstr(sn_errmsg(), "sliding_window"));
    free(s);

    /* mistral3 wrapper around a mistral text model */
    r = json_object();
    json_object_set_new(r, "model_type", json_string("mistral3"));
    json_t *tc = json_loads(MISTRAL, 0, NULL);
    json_object_del(tc, "tie_word_embeddings");
    json_object_set_new(r, "text_config", tc);
    json_object_set_new(r, "tie_word_embeddings", json_false());
    s = json_dumps(r, 0);
    json_decref(r);
    CHECK_OK(sn_config_parse(s, strlen(s), "m3.json", NULL, 0, &c));
    CHECK(c && c->arch == SN_ARCH_MISTRAL && !c->ministral3 && c->has_text_config && !c->tie_word_embeddings &&
          strcmp(c->model_type, "mistral3") == 0);
    sn_config_free(c);
    c = NULL;
    free(s);
}

static void test_ministral3(void)
{
    sn_config *c = NULL;
    CHECK_OK(parse_with(MINISTRAL3, NULL, NULL, &c));
    if (c) {
        CHECK(c->arch == SN_ARCH_MISTRAL && c->ministral3 && c->rope_theta == 1e8);
        CHECK(c->rope.kind == SN_ROPE_YARN && c->rope.factor == 48.0 && c->rope.original_max_position == 8192 &&
              c->rope.mscale_all_dim == 1.0 && c->rope.llama4_beta == 0.1);
        CHECK(!c->tie_word_embeddings);
        sn_config_free(c);
        c = NULL;
    }
    CHECK(parse_with(MINISTRAL3, "text_config.rope_parameters", NULL, &c) == SN_E_MISSING &&
          strstr(sn_errmsg(), "rope_parameters"));
    CHECK(parse_with(MINISTRAL3, "text_config.model_type", "\"pixtral\"", &c) == SN_E_UNSUPPORTED &&
          strstr(sn_errmsg(), "\"pixtral\""));
    CHECK(c == NULL);
}

static void test_quantization(void)
{
    char *base = slurp("bench/configs/qwen3_5_35b_a3b.json");
    CHECK(base != NULL);
    if (!base) return;
    const char *q = "{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
                    "\"language_model.model.layers.0.mlp.gate\":{\"group_size\":64,\"bits\":8},"
                    "\"language_model.model.layers.0.mlp.shared_expert_gate\":{\"bits\":8},"
                    "\"language_model.lm_head\":{\"group_size\":128,\"bits\":8},"
                    "\"language_model.model.layers.1.linear_attn.in_proj_b\":false}";
    sn_config *c = NULL;
    CHECK_OK(parse_with(base, "quantization", q, &c));
    if (c) {
        int b, g;
        CHECK(c->quantized && c->q_bits == 4 && c->q_group == 64 && c->n_q_overrides == 4);
        CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.0.mlp.gate", &b, &g));
        CHECK(b == 8 && g == 64);
        CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.0.mlp.shared_expert_gate", &b, &g));
        CHECK(b == 8 && g == 64);   /* group inherited from the default */
        CHECK_OK(sn_config_quant_for(c, "language_model.lm_head", &b, &g));
        CHECK(b == 8 && g == 128);
        CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.1.linear_attn.in_proj_b", &b, &g));
        CHECK(b == 0 && g == 0);
        CHECK_OK(sn_config_quant_for(c, "language_model.model.layers.1.mlp.gate", &b, &g));
        CHECK(b == 4 && g == 64);
        sn_config_free(c);
        c = NULL;
    }
    /* quantization_config only inside text_config is the fallback */
    CHECK_OK(parse_with(base, "text_config.quantization_config", "{\"group_size\":32,\"bits\":8}", &c));
    CHECK(c && c->quantized && c->q_bits == 8 && c->q_group == 32);
    sn_config_free(c);
    c = NULL;
    CHECK(parse_with(base, "quantization", "{\"group_size\":64,\"bits\":3}", &c) == SN_E_UNSUPPORTED &&
          strstr(sn_errmsg(), "3-bit"));
    CHECK(parse_with(base, "quantization", "{\"group_size\":48,\"bits\":4}", &c) == SN_E_UNSUPPORTED &&
          strstr(sn_errmsg(), "group_size 48"));
    CHECK(parse_with(base, "quantization", "{\"group_size\":32,\"bits\":4,\"mode\":\"mxfp4\"}", &c) ==
              SN_E_UNSUPPORTED && strstr(sn_errmsg(), "mxfp4"));
    CHECK(parse_with(base, "quantization", "{\"group_size\":64,\"bits\":4,\"a.b\":{\"bits\":2}}", &c) ==
              SN_E_UNSUPPORTED && strstr(sn_errmsg(), "a.b") && strstr(sn_errmsg(), "2-bit"));
    CHECK(parse_with(base, "quantization", "{\"bits\":4}", &c) == SN_E_MISSING && strstr(sn_errmsg(), "group_size"));
    CHECK(parse_with(base, "quantization_config", "{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}", &c) ==
              SN_E_UNSUPPORTED && strstr(sn_errmsg(), "fp8"));
    CHECK(c == NULL);
    free(base);
}

static void test_unknown_model_type(void)
{
    const char *types[] = {"llama", "mixtral", "gemma3"};
    for (int i = 0; i < 3; i++) {
        char json[128], want[160];
        snprintf(json, sizeof json, "{\"model_type\":\"%s\",\"hidden_size\":8}", types[i]);
        snprintf(want, sizeof want, "unsupported model_type \"%s\": sanctum loads qwen3_5, qwen3_5_moe, qwen2, mistral",
                 types[i]);
        sn_config *c = NULL;
        CHECK(sn_config_parse(json, strlen(json), "config.json", NULL, 0, &c) == SN_E_UNSUPPORTED);
        CHECKF(strcmp(sn_errmsg(), want) == 0, "got: %s", sn_errmsg());
        CHECK(c == NULL);
    }
    sn_config *c = NULL;
    CHECK(sn_config_parse("{\"hidden_size\":8}", 17, "config.json", NULL, 0, &c) == SN_E_MISSING &&
          strstr(sn_errmsg(), "model_type"));
}

static void test_bad_json_and_files(void)
{
    const char *bad = "{\n  \"model_type\": \"qwen2\",\n  \"hidden_size\": ,\n}";
    sn_config *c = NULL;
    CHECK(sn_config_parse(bad, strlen(bad), "/m/config.json", NULL, 0, &c) == SN_E_FORMAT);
    CHECKF(strstr(sn_errmsg(), "/m/config.json") && strstr(sn_errmsg(), "line 3") && strstr(sn_errmsg(), "column"),
           "%s", sn_errmsg());
    CHECK(sn_config_parse("[1]", 3, "x.json", NULL, 0, &c) == SN_E_FORMAT);
    CHECK(sn_config_load("/nonexistent/dir", &c) == SN_E_IO);

    /* a model directory: config.json plus generation_config.json whose eos wins */
    char dir[] = "/tmp/sn_test_cfg_XXXXXX";
    SN_ASSERT(mkdtemp(dir));
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(QWEN2, f);
    fclose(f);
    CHECK_OK(sn_config_load(dir, &c));
    CHECK(c && c->n_eos == 1 && c->eos_ids[0] == 151645);
    sn_config_free(c);
    c = NULL;
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    f = fopen(p, "w");
    fputs("{\"bos_token_id\":151643,\"eos_token_id\":[151645,151643],\"do_sample\":true}", f);
    fclose(f);
    CHECK_OK(sn_config_load(dir, &c));
    CHECK(c && c->n_eos == 2 && c->eos_ids[0] == 151645 && c->eos_ids[1] == 151643);
    sn_config_free(c);
    c = NULL;
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK_OK(sn_config_load(p, &c));   /* a file path also finds its generation_config.json */
    CHECK(c && c->n_eos == 2);
    sn_config_free(c);
    c = NULL;
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    f = fopen(p, "w");
    fputs("{\"eos_token_id\":", f);
    fclose(f);
    CHECK(sn_config_load(dir, &c) == SN_E_FORMAT && strstr(sn_errmsg(), "generation_config.json"));
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    CHECK(sn_config_load(dir, &c) == SN_E_MISSING && strstr(sn_errmsg(), "config.json"));
    rmdir(dir);
}

int main(void)
{
    RUN(test_qwen3_5_27b);
    RUN(test_qwen3_5_moe);
    RUN(test_qwen3_5_fallbacks);
    RUN(test_qwen2);
    RUN(test_mistral);
    RUN(test_ministral3);
    RUN(test_quantization);
    RUN(test_unknown_model_type);
    RUN(test_bad_json_and_files);
    return TEST_END();
}
