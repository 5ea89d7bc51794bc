/* Two loads of the shipped default model (a reference and an alternative,
 * e.g. another --precision) along tests/parity-smoke.json: every prompt
 * teacher-forced on transformers' greedy tokens through both, and the
 * alternative's argmax checked against that token at every step. Used by
 * test_model_load (CPU) and test_cuda_model (CUDA). */
#ifndef SANCTUM_TEST_PARITY_PAIR_H
#define SANCTUM_TEST_PARITY_PAIR_H

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sanctum/model.h"

typedef struct {
    double worst;      /* largest |reference - alternative| logit */
    double scale;      /* largest |reference| logit */
    double min_margin; /* smallest top-2 margin of the reference */
    bool differ;       /* some alternative logits are not bitwise the reference's */
} parity_pair;

/* Called per prompt with its ids, the n positions run and the alternative's
 * logits [n, V]. */
typedef void (*parity_pair_hook)(size_t prompt, const int32_t *ids, int n, const float *alt, void *ud);

/* prompts: the battery's "prompts" array. label names the alternative in
 * failure messages. */
static void parity_pair_run(json_t *prompts, sn_model *ref, sn_model *alt, const char *label, parity_pair_hook each,
                            void *ud, parity_pair *st)
{
    const int V = sn_model_get_info(ref)->vocab_size;
    *st = (parity_pair){ .min_margin = INFINITY };
    for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
        json_t *pj = json_array_get(prompts, pi), *pid = json_object_get(pj, "prompt_ids"),
               *rid = json_object_get(pj, "ref_ids");
        const int L = (int)json_array_size(pid), R = (int)json_array_size(rid);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(L + R));
        for (int i = 0; i < L + R; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(i < L ? pid : rid, i < L ? i : i - L));
        /* logits after the prompt and after each reference token but the last */
        const int n = L + R - 1;
        float *lr = malloc(sizeof(float) * (size_t)n * V), *la = malloc(sizeof(float) * (size_t)n * V);
        sn_seq *sr = NULL, *sa = NULL;
        CHECK_OK(sn_seq_new(ref, n + 1, &sr));
        CHECK_OK(sn_seq_new(alt, n + 1, &sa));
        CHECK_OK(sn_forward(ref, sr, ids, n, lr, true));
        CHECK_OK(sn_forward(alt, sa, ids, n, la, true));
        st->differ |= memcmp(lr, la, sizeof(float) * (size_t)n * V) != 0;
        if (each)
            each(pi, ids, n, la, ud);
        for (int t = L - 1; t < n; t++) {
            const float *a = lr + (size_t)t * V, *b = la + (size_t)t * V;
            int br = 0, ba = 0;
            for (int v = 1; v < V; v++) {
                if (a[v] > a[br]) br = v;
                if (b[v] > b[ba]) ba = v;
            }
            float second = -INFINITY;
            for (int v = 0; v < V; v++) {
                if (v != br && a[v] > second) second = a[v];
                st->worst = fmax(st->worst, fabs((double)a[v] - b[v]));
                st->scale = fmax(st->scale, fabs((double)a[v]));
            }
            st->min_margin = fmin(st->min_margin, (double)a[br] - second);
            CHECKF(ba == ids[t + 1], "%s prompt %zu step %d: argmax %d, transformers' greedy token %d (reference %d)",
                   label, pi, t - (L - 1), ba, ids[t + 1], br);
        }
        sn_seq_free(sr);
        sn_seq_free(sa);
        free(lr);
        free(la);
        free(ids);
    }
}

#endif
