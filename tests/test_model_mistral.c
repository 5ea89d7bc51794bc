/* mistral against tests/fixtures/mistral: see test_model_common.h for what
 * is compared and the tolerances. */
#define FIXTURE_ARCH "mistral"
#define FIXTURE_EXTRA mistral_extra
static void mistral_extra(void);
#include <jansson.h>

#include "test_model_common.h"

/* The same weights wrapped the way Mistral-Small-3.x VL checkpoints are:
 * model_type mistral3 with the text model under text_config, tensors under
 * "language_model." beside vision_tower / multi_modal_projector tensors.
 * The loader must find the same model: logits bitwise equal to the plain
 * mistral fixture. With ministral, the text model is ministral3: equal up
 * to original_max_position_embeddings, then the query scaling shows (its
 * value is not checked against transformers: no ministral3 fixture). */
static void check_wrapped(bool ministral)
{
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "/tmp/sanctum-mistral3-%d", (int)getpid());
    mkdir(dir, 0700);
    json_error_t je;
    json_t *text = json_load_file(FX_DIR "/mlx/config.json", 0, &je);
    CHECK(text != NULL);
    if (!text) return;
    json_t *root = json_object();
    json_object_set_new(root, "model_type", json_string("mistral3"));
    json_object_set(root, "quantization", json_object_get(text, "quantization"));
    json_object_set_new(root, "vision_config", json_object());
    json_object_del(text, "quantization");
    json_object_del(text, "quantization_config");
    if (ministral) {
        /* ministral3 text model: YaRN of factor 1 (plain RoPE) and the
         * position-dependent query scaling past 64 positions */
        json_object_set_new(text, "model_type", json_string("ministral3"));
        json_t *rp = json_pack("{s:s, s:f, s:f, s:i, s:f}", "rope_type", "yarn", "rope_theta", 1e9, "factor", 1.0,
                               "original_max_position_embeddings", 64, "llama_4_scaling_beta", 0.1);
        json_object_set_new(text, "rope_parameters", rp);
        json_object_del(text, "rope_scaling");
    }
    json_object_set(root, "text_config", text);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(json_dump_file(root, path, JSON_INDENT(1)) == 0);
    json_decref(text);
    json_decref(root);

    sn_st *st = NULL;
    sn_st_writer *w = NULL;
    char *names[512] = { 0 };
    int nn = 0;
    sn_model *m3 = NULL;
    CHECK_OK(sn_st_open(FX_DIR "/mlx/model.safetensors", &st));
    CHECK_OK(sn_st_writer_new(&w));
    if (!st || !w) goto out;
    for (size_t i = 0; i < sn_st_count(st) && nn < 500; i++) {
        const sn_st_tensor *t = sn_st_at(st, i);
        size_t len = strlen(t->name) + 32;
        char *n = names[nn++] = malloc(len);
        snprintf(n, len, "language_model.%s", t->name);
        CHECK_OK(sn_st_writer_add(w, n, t->dtype, t->ndim, t->shape, t->data));
    }
    static const float junk[4] = { 1, 2, 3, 4 };
    int64_t sh[1] = { 4 };
    CHECK_OK(sn_st_writer_add(w, "vision_tower.patch_conv.weight", SN_DT_F32, 1, sh, junk));
    CHECK_OK(sn_st_writer_add(w, "multi_modal_projector.linear_1.weight", SN_DT_F32, 1, sh, junk));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(sn_st_writer_write(w, path, NULL, NULL));
    sn_load_opts o = { .n_threads = 2, .backend = g_cuda ? SN_BACKEND_CUDA : SN_BACKEND_CPU };
    CHECK_OK(sn_model_load(dir, &o, &m3));
    if (!m3) goto out;
    CHECK(strcmp(sn_model_get_info(m3)->model_type, "mistral") == 0 && sn_model_get_info(m3)->mlx_layout);
    CHECK(m3->cfg->ministral3 == ministral);
    for (int i = 0; i < g_ref.n; i++) {
        int L = g_ref.len[i];
        float *a = run_all(m3, g_ref.prompt[i], L), *b = run_all(g_mlx, g_ref.prompt[i], L);
        CHECK(a && b);
        if (!a || !b) {
            free(a);
            free(b);
            continue;
        }
        int upto = ministral && L > 64 ? 64 : L;
        CHECKF(same(a, b, (size_t)upto * g_V), "prompt %d: wrapped logits differ in the first %d rows", i, upto);
        /* past original_max_position_embeddings the query scale is 1+0.1*ln 2 */
        if (upto < L)
            CHECKF(max_diff(a + (size_t)upto * g_V, b + (size_t)upto * g_V, (size_t)(L - upto) * g_V) > 1e-3f,
                   "prompt %d: ministral3 query scaling had no effect past position 64", i);
        free(a);
        free(b);
    }
out:
    sn_model_free(m3);
    sn_st_writer_free(w);
    sn_st_close(st);
    for (int i = 0; i < nn; i++) free(names[i]);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void test_mistral3_nesting(void)
{
    NEED_FIXTURE();
    check_wrapped(false);
}

static void test_ministral3_query_scaling(void)
{
    NEED_FIXTURE();
    check_wrapped(true);
}

static void mistral_extra(void)
{
    RUN(test_mistral3_nesting);
    RUN(test_ministral3_query_scaling);
}

int main(int argc, char **argv) { return fixture_main(argc, argv); }
