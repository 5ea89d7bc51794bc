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
 * mistral fixture. */
static void test_mistral3_nesting(void)
{
    NEED_FIXTURE();
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
    for (int i = 0; i < g_ref.n; i++) {
        float *a = run_all(m3, g_ref.prompt[i], g_ref.len[i]), *b = run_all(g_mlx, g_ref.prompt[i], g_ref.len[i]);
        CHECKF(a && b && same(a, b, (size_t)g_ref.len[i] * g_V), "prompt %d: mistral3-wrapped logits differ", i);
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

static void mistral_extra(void) { RUN(test_mistral3_nesting); }

int main(int argc, char **argv) { return fixture_main(argc, argv); }
