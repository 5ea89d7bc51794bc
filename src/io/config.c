/* config.json parsing for qwen3_5, qwen3_5_moe, qwen2 and mistral (+ mistral3
 * and ministral3 wrappers). Field semantics and fallbacks follow
 * architecture.md §1. Where a key is absent and the checkpoints we serve
 * always carry it, we use the Hugging Face config-class default (the oracle
 * we test against), never mlx-lm's, which differ (gotcha 8). Fields whose
 * HF default is an artefact of a different model size (qwen3_5 head_dim,
 * GDN dims, MoE sizes) are required instead: guessing them silently would
 * produce a model of the wrong shape. */
#include "sanctum/config.h"
#include "sanctum/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sanctum/quant.h"

#define CFG_MAX_FILE (16u << 20)   /* no real config.json comes near this */

typedef struct {
    const char *label;   /* file name, for errors */
    json_t *obj;         /* object fields are read from */
    const char *prefix;  /* "text_config." or "" */
} fields;

const char *sn_arch_name(sn_arch a)
{
    switch (a) {
    case SN_ARCH_QWEN3_5: return "qwen3_5";
    case SN_ARCH_QWEN3_5_MOE: return "qwen3_5_moe";
    case SN_ARCH_QWEN2: return "qwen2";
    case SN_ARCH_MISTRAL: return "mistral";
    }
    return "?";
}

/* Absent and null both mean "not given" (HF writes null for unset fields). */
static json_t *get(const fields *f, const char *key)
{
    json_t *v = f->obj ? json_object_get(f->obj, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

static sn_status get_int(const fields *f, const char *key, bool required, int64_t def, int64_t lo, int64_t hi,
                         int64_t *out)
{
    json_t *v = get(f, key);
    if (!v) {
        if (required) return SN_FAIL(SN_E_MISSING, "%s: required field \"%s%s\" is missing", f->label, f->prefix, key);
        *out = def;
        return SN_OK;
    }
    if (!json_is_integer(v))
        return SN_FAIL(SN_E_FORMAT, "%s: field \"%s%s\" must be an integer", f->label, f->prefix, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return SN_FAIL(SN_E_RANGE, "%s: field \"%s%s\" = %lld is out of range [%lld, %lld]", f->label, f->prefix,
                       key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return SN_OK;
}

static sn_status get_i(const fields *f, const char *key, bool required, int def, int lo, int hi, int *out)
{
    int64_t v;
    SN_TRY(get_int(f, key, required, def, lo, hi, &v));
    *out = (int)v;
    return SN_OK;
}

/* lo_open: the lower bound itself is not allowed (eps > 0, factor > 0). */
static sn_status get_num(const fields *f, const char *key, double def, double lo, bool lo_open, double hi,
                         double *out)
{
    json_t *v = get(f, key);
    if (!v) { *out = def; return SN_OK; }
    if (!json_is_number(v))
        return SN_FAIL(SN_E_FORMAT, "%s: field \"%s%s\" must be a number", f->label, f->prefix, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return SN_FAIL(SN_E_RANGE, "%s: field \"%s%s\" = %g is out of range %s%g, %g]", f->label, f->prefix, key,
                       x, lo_open ? "(" : "[", lo, hi);
    *out = x;
    return SN_OK;
}

static sn_status get_bool(const fields *f, const char *key, bool *found, bool *out)
{
    json_t *v = get(f, key);
    *found = v != NULL;
    if (!v) return SN_OK;
    if (!json_is_boolean(v))
        return SN_FAIL(SN_E_FORMAT, "%s: field \"%s%s\" must be true or false", f->label, f->prefix, key);
    *out = json_is_true(v);
    return SN_OK;
}

static sn_status get_str(const fields *f, const char *key, const char **out)
{
    json_t *v = get(f, key);
    *out = NULL;
    if (!v) return SN_OK;
    if (!json_is_string(v))
        return SN_FAIL(SN_E_FORMAT, "%s: field \"%s%s\" must be a string", f->label, f->prefix, key);
    *out = json_string_value(v);
    return SN_OK;
}

static sn_status unsupported_type(const char *label, const char *field, const char *mt)
{
    return SN_FAIL(SN_E_UNSUPPORTED, "%s: unsupported %s \"%s\": sanctum loads qwen3_5, qwen3_5_moe, qwen2, mistral",
                   label, field, mt);
}

/* Root model_type -> arch; mistral3 looks inside text_config. */
static sn_status dispatch(sn_config *c, const char *label, json_t *root, json_t *tc)
{
    fields rf = {label, root, ""};
    const char *mt;
    SN_TRY(get_str(&rf, "model_type", &mt));
    if (!mt && tc) {
        fields tf = {label, tc, "text_config."};
        SN_TRY(get_str(&tf, "model_type", &mt));
    }
    if (!mt) return SN_FAIL(SN_E_MISSING, "%s: required field \"model_type\" is missing", label);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_text")) c->arch = SN_ARCH_QWEN3_5;
    else if (!strcmp(mt, "qwen3_5_moe") || !strcmp(mt, "qwen3_5_moe_text")) c->arch = SN_ARCH_QWEN3_5_MOE;
    else if (!strcmp(mt, "qwen2")) c->arch = SN_ARCH_QWEN2;
    else if (!strcmp(mt, "mistral")) c->arch = SN_ARCH_MISTRAL;
    else if (!strcmp(mt, "ministral3")) { c->arch = SN_ARCH_MISTRAL; c->ministral3 = true; }
    else if (!strcmp(mt, "mistral3")) {
        if (!tc) return SN_FAIL(SN_E_MISSING, "%s: model_type \"mistral3\" needs a \"text_config\" object", label);
        fields tf = {label, tc, "text_config."};
        const char *tmt;
        SN_TRY(get_str(&tf, "model_type", &tmt));
        c->arch = SN_ARCH_MISTRAL;
        if (tmt && !strcmp(tmt, "ministral3")) c->ministral3 = true;
        else if (tmt && strcmp(tmt, "mistral") && strcmp(tmt, "llama"))
            return unsupported_type(label, "text_config.model_type", tmt);
    } else {
        return SN_FAIL(SN_E_UNSUPPORTED, "unsupported model_type \"%s\": sanctum loads qwen3_5, qwen3_5_moe, qwen2, mistral",
                       mt);
    }
    return SN_OK;
}

static sn_status add_eos(sn_config *c, const char *label, const char *field, json_t *v)
{
    if (!v || json_is_null(v)) return SN_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->vocab_size)
            return SN_FAIL(SN_E_FORMAT, "%s: \"%s\" must be a token id in [0, %lld) or a list of them", label, field,
                           (long long)c->vocab_size);
        int32_t id = (int32_t)json_integer_value(e);
        bool dup = false;
        for (int j = 0; j < c->n_eos; j++) dup |= c->eos_ids[j] == id;
        if (dup) continue;
        if (c->n_eos == SN_CFG_MAX_EOS)
            return SN_FAIL(SN_E_RANGE, "%s: more than %d distinct eos ids", label, SN_CFG_MAX_EOS);
        c->eos_ids[c->n_eos++] = id;
    }
    return SN_OK;
}

static sn_status token_id(sn_config *c, const fields *tf, const fields *rf, const char *key, int32_t *out)
{
    int64_t v;
    const fields *f = get(tf, key) ? tf : rf;
    SN_TRY(get_int(f, key, false, -1, 0, c->vocab_size - 1, &v));
    *out = (int32_t)v;
    return SN_OK;
}

static sn_status parse_layers(sn_config *c, const fields *tf)
{
    json_t *lt = get(tf, "layer_types");
    bool qwen35 = c->arch == SN_ARCH_QWEN3_5 || c->arch == SN_ARCH_QWEN3_5_MOE;
    if (qwen35) {
        /* HF default interval 4; layer_types wins when both are given (gotcha 5). */
        SN_TRY(get_i(tf, "full_attention_interval", false, 4, 1, SN_CFG_MAX_LAYERS, &c->full_attention_interval));
    }
    if (c->arch == SN_ARCH_MISTRAL) {
        SN_TRY(get_i(tf, "sliding_window", false, 0, 1, 1 << 30, &c->sliding_window));
    }
    if (lt && c->arch == SN_ARCH_QWEN2) {
        /* qwen2 runs full attention everywhere; HF's only other layer type
         * for it, sliding_attention, takes effect just when
         * use_sliding_window is true (HF drops sliding_window otherwise).
         * A malformed list is refused as HF's validation refuses it. */
        bool found = false, use_sw = false;
        SN_TRY(get_bool(tf, "use_sliding_window", &found, &use_sw));
        json_t *sw = get(tf, "sliding_window");
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layers)
            return SN_FAIL(SN_E_FORMAT, "%s: \"%slayer_types\" must be a list of %d strings", tf->label, tf->prefix,
                           c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            bool full = s && !strcmp(s, "full_attention"), sliding = s && !strcmp(s, "sliding_attention");
            if (!full && !sliding)
                return SN_FAIL(SN_E_FORMAT, "%s: \"%slayer_types[%d]\" = %s is not a layer type of qwen2", tf->label,
                               tf->prefix, i, s ? s : "(not a string)");
            if (sliding && use_sw && sw)
                return SN_FAIL(SN_E_UNSUPPORTED, "%s: layer %d is sliding_attention with use_sliding_window: "
                               "windowed attention is not implemented for qwen2", tf->label, i);
            c->layer_kind[i] = SN_LAYER_FULL;
        }
        return SN_OK;
    }
    if (lt) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layers)
            return SN_FAIL(SN_E_FORMAT, "%s: \"%slayer_types\" must be a list of %d strings", tf->label, tf->prefix,
                           c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && !strcmp(s, "full_attention")) c->layer_kind[i] = SN_LAYER_FULL;
            else if (s && qwen35 && !strcmp(s, "linear_attention")) c->layer_kind[i] = SN_LAYER_LINEAR;
            else if (s && !qwen35 && !strcmp(s, "sliding_attention")) c->layer_kind[i] = SN_LAYER_SLIDING;
            else
                return SN_FAIL(SN_E_FORMAT, "%s: \"%slayer_types[%d]\" = %s is not a layer type of %s", tf->label,
                               tf->prefix, i, s ? s : "(not a string)", sn_arch_name(c->arch));
            if (c->layer_kind[i] == SN_LAYER_SLIDING && c->sliding_window <= 0)
                return SN_FAIL(SN_E_MISSING, "%s: layer %d is sliding_attention but \"%ssliding_window\" is not set",
                               tf->label, i, tf->prefix);
        }
        return SN_OK;
    }
    for (int i = 0; i < c->n_layers; i++)
        c->layer_kind[i] = !qwen35 || (i + 1) % c->full_attention_interval == 0 ? SN_LAYER_FULL : SN_LAYER_LINEAR;
    return SN_OK;
}

/* rope_theta, partial rotary and scaling (§1.2: root keys first, then
 * rope_parameters, since transformers v5 writes only the latter). */
static sn_status parse_rope(sn_config *c, const fields *tf)
{
    json_t *rp = get(tf, "rope_parameters");
    if (rp && !json_is_object(rp))
        return SN_FAIL(SN_E_FORMAT, "%s: \"%srope_parameters\" must be an object", tf->label, tf->prefix);
    /* Some transformers releases serialise the same dict as rope_scaling
     * (with rope_theta inside); read theta/partial from it in that case. */
    json_t *rs0 = get(tf, "rope_scaling");
    const bool from_scaling = !rp && json_is_object(rs0);
    char rprefix[64];
    snprintf(rprefix, sizeof rprefix, "%s%s.", tf->prefix, from_scaling ? "rope_scaling" : "rope_parameters");
    fields pf = {tf->label, from_scaling ? rs0 : rp, rprefix};
    if (c->ministral3 && !pf.obj)
        return SN_FAIL(SN_E_MISSING, "%s: ministral3 needs \"%srope_parameters\"", tf->label, tf->prefix);

    const fields *tsrc = get(tf, "rope_theta") ? tf : &pf;
    SN_TRY(get_num(tsrc, "rope_theta", 10000.0, 1.0, false, 1e12, &c->rope_theta));
    double prf_def = c->arch == SN_ARCH_QWEN3_5 || c->arch == SN_ARCH_QWEN3_5_MOE ? 0.25 : 1.0;
    const fields *psrc = get(tf, "partial_rotary_factor") ? tf : &pf;
    SN_TRY(get_num(psrc, "partial_rotary_factor", prf_def, 0.0, true, 1.0, &c->partial_rotary_factor));
    c->rotary_dim = (int)(c->head_dim * c->partial_rotary_factor);
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return SN_FAIL(SN_E_RANGE, "%s: rotary dim %d (head_dim %d x partial_rotary_factor %g) must be even and >= 2",
                       tf->label, c->rotary_dim, c->head_dim, c->partial_rotary_factor);

    /* scaling dict: rope_scaling, else rope_parameters unless it says default */
    json_t *rs = get(tf, "rope_scaling");
    char sprefix[64];
    snprintf(sprefix, sizeof sprefix, "%srope_scaling.", tf->prefix);
    fields sf = {tf->label, rs, sprefix};
    if (rs && !json_is_object(rs))
        return SN_FAIL(SN_E_FORMAT, "%s: \"%srope_scaling\" must be an object or null", tf->label, tf->prefix);
    if (!rs) sf = pf;
    const char *type = NULL;
    SN_TRY(get_str(&sf, "rope_type", &type));
    if (!type) SN_TRY(get_str(&sf, "type", &type));
    c->rope = (sn_rope_scaling){.kind = SN_ROPE_DEFAULT, .factor = 1.0, .beta_fast = 32.0, .beta_slow = 1.0,
                                .mscale = 1.0};
    if (c->ministral3) SN_TRY(get_num(&pf, "llama_4_scaling_beta", 0.0, 0.0, false, 100.0, &c->rope.llama4_beta));
    if (!sf.obj || !type || !strcmp(type, "default")) return SN_OK;
    if (!strcmp(type, "linear")) {
        c->rope.kind = SN_ROPE_LINEAR;
        json_t *fv = get(&sf, "factor");
        if (!fv) return SN_FAIL(SN_E_MISSING, "%s: \"%sfactor\" is required for linear rope", tf->label, sf.prefix);
        return get_num(&sf, "factor", 1.0, 0.0, true, 1e6, &c->rope.factor);
    }
    if (strcmp(type, "yarn") != 0)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: rope type \"%s\" is not supported (default, linear, yarn)", tf->label,
                       type);
    c->rope.kind = SN_ROPE_YARN;
    if (!get(&sf, "factor")) return SN_FAIL(SN_E_MISSING, "%s: \"%sfactor\" is required for yarn", tf->label, sf.prefix);
    SN_TRY(get_num(&sf, "factor", 1.0, 0.0, true, 1e6, &c->rope.factor));
    /* HF falls back to max_position_embeddings for the original length. */
    SN_TRY(get_int(&sf, "original_max_position_embeddings", false, c->max_position_embeddings, 1, (int64_t)1 << 40,
                   &c->rope.original_max_position));
    SN_TRY(get_num(&sf, "beta_fast", 32.0, 0.0, true, 1e6, &c->rope.beta_fast));
    SN_TRY(get_num(&sf, "beta_slow", 1.0, 0.0, true, 1e6, &c->rope.beta_slow));
    SN_TRY(get_num(&sf, "mscale", 1.0, 0.0, false, 1e6, &c->rope.mscale));
    SN_TRY(get_num(&sf, "mscale_all_dim", 0.0, 0.0, false, 1e6, &c->rope.mscale_all_dim));
    return SN_OK;
}

static int cmp_override(const void *a, const void *b)
{
    return strcmp(((const sn_quant_override *)a)->module, ((const sn_quant_override *)b)->module);
}

static sn_status check_bits_group(const char *label, const char *where, int bits, int group)
{
    if (bits != 4 && bits != 8)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: %s: %d-bit quantization is not supported (4 or 8)", label, where, bits);
    if (group != 32 && group != 64 && group != 128)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: %s: group_size %d is not supported (32, 64 or 128)", label, where,
                       group);
    return SN_OK;
}

static sn_status check_mode(const char *label, const char *where, json_t *q)
{
    json_t *m = json_object_get(q, "mode");
    if (!m || json_is_null(m)) return SN_OK;
    if (!json_is_string(m) || strcmp(json_string_value(m), "affine") != 0)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: %s: quantization mode %s is not supported (affine only)", label, where,
                       json_is_string(m) ? json_string_value(m) : "(not a string)");
    return SN_OK;
}

/* quantization / quantization_config at the root, else in text_config. */
static sn_status parse_quant(sn_config *c, const char *label, json_t *root, json_t *tc)
{
    static const char *keys[] = {"quantization", "quantization_config"};
    json_t *q = NULL;
    const char *qname = NULL;
    for (int pass = 0; pass < 2 && !q; pass++) {
        json_t *o = pass ? tc : root;
        for (int k = 0; o && k < 2 && !q; k++) {
            json_t *v = json_object_get(o, keys[k]);
            if (v && !json_is_null(v)) { q = v; qname = keys[k]; }
        }
    }
    if (!q) return SN_OK;
    if (!json_is_object(q)) return SN_FAIL(SN_E_FORMAT, "%s: \"%s\" must be an object", label, qname);
    json_t *qm = json_object_get(q, "quant_method");
    if (qm && json_is_string(qm) && strcmp(json_string_value(qm), "mlx") != 0)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: %s.quant_method \"%s\" is not supported (MLX affine only)", label,
                       qname, json_string_value(qm));
    fields qf = {label, q, ""};
    char where[48];
    snprintf(where, sizeof where, "%s.", qname);
    qf.prefix = where;
    SN_TRY(check_mode(label, qname, q));
    SN_TRY(get_i(&qf, "bits", true, 0, 1, 64, &c->q_bits));
    SN_TRY(get_i(&qf, "group_size", true, 0, 1, 1 << 20, &c->q_group));
    SN_TRY(check_bits_group(label, qname, c->q_bits, c->q_group));
    c->quantized = true;

    size_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) n += json_is_object(v) || json_is_boolean(v);
    c->q_overrides = calloc(n ? n : 1, sizeof *c->q_overrides);
    if (!c->q_overrides) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", label);
    json_object_foreach(q, key, v) {
        if (!json_is_object(v) && !json_is_boolean(v)) continue;  /* scalar settings (bits, mode, ...) */
        sn_quant_override *o = &c->q_overrides[c->n_q_overrides];
        if (!(o->module = strdup(key))) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", label);
        c->n_q_overrides++;
        if (json_is_boolean(v)) {   /* mlx-lm: false leaves the module unquantized */
            o->bits = json_is_true(v) ? c->q_bits : 0;
            o->group = json_is_true(v) ? c->q_group : 0;
            continue;
        }
        char ow[320];
        snprintf(ow, sizeof ow, "%s[\"%.256s\"]", qname, key);
        char op[336];
        snprintf(op, sizeof op, "%s.", ow);
        fields of = {label, v, op};
        SN_TRY(check_mode(label, ow, v));
        SN_TRY(get_i(&of, "bits", false, c->q_bits, 1, 64, &o->bits));
        SN_TRY(get_i(&of, "group_size", false, c->q_group, 1, 1 << 20, &o->group));
        SN_TRY(check_bits_group(label, ow, o->bits, o->group));
    }
    qsort(c->q_overrides, (size_t)c->n_q_overrides, sizeof *c->q_overrides, cmp_override);
    return SN_OK;
}

static sn_status parse_dims(sn_config *c, const fields *tf)
{
    bool qwen35 = c->arch == SN_ARCH_QWEN3_5 || c->arch == SN_ARCH_QWEN3_5_MOE;
    const int64_t BIG = (int64_t)1 << 30;
    SN_TRY(get_int(tf, "hidden_size", true, 0, 1, 1 << 20, &c->hidden_size));
    SN_TRY(get_i(tf, "num_hidden_layers", true, 0, 1, SN_CFG_MAX_LAYERS, &c->n_layers));
    SN_TRY(get_int(tf, "intermediate_size", c->arch != SN_ARCH_QWEN3_5_MOE, 0, 1, BIG, &c->intermediate_size));
    SN_TRY(get_i(tf, "num_attention_heads", true, 0, 1, 4096, &c->n_heads));
    /* HF: absent num_key_value_heads means plain multi-head attention. */
    SN_TRY(get_i(tf, "num_key_value_heads", qwen35, c->n_heads, 1, 4096, &c->n_kv_heads));
    if (c->n_heads % c->n_kv_heads)
        return SN_FAIL(SN_E_RANGE, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", tf->label,
                       c->n_heads, c->n_kv_heads);
    /* the CPU attention kernel shares one kv head among at most 256 */
    if (c->n_heads / c->n_kv_heads > 256)
        return SN_FAIL(SN_E_RANGE, "%s: %d query heads per key/value head (num_attention_heads %d / "
                       "num_key_value_heads %d); at most 256 are supported", tf->label, c->n_heads / c->n_kv_heads,
                       c->n_heads, c->n_kv_heads);
    if (c->arch == SN_ARCH_QWEN2 || (c->arch == SN_ARCH_MISTRAL && !get(tf, "head_dim"))) {
        /* qwen2 ignores any head_dim key (mlx-lm and HF both derive it). */
        if (c->hidden_size % c->n_heads)
            return SN_FAIL(SN_E_RANGE, "%s: hidden_size %lld is not a multiple of num_attention_heads %d", tf->label,
                           (long long)c->hidden_size, c->n_heads);
        c->head_dim = (int)(c->hidden_size / c->n_heads);
    } else {
        SN_TRY(get_i(tf, "head_dim", true, 0, 1, 4096, &c->head_dim));
    }
    SN_TRY(get_int(tf, "vocab_size", true, 0, 1, (int64_t)1 << 31, &c->vocab_size));
    SN_TRY(get_int(tf, "max_position_embeddings", false, c->arch == SN_ARCH_MISTRAL ? 131072 : 32768, 1,
                   (int64_t)1 << 40, &c->max_position_embeddings));
    SN_TRY(get_num(tf, "rms_norm_eps", 1e-6, 0.0, true, 1.0, &c->rms_norm_eps));
    bool found = false, b = false;
    if (c->arch == SN_ARCH_QWEN2) {
        c->attention_bias = true;   /* q/k/v always have biases in qwen2 */
    } else {
        SN_TRY(get_bool(tf, "attention_bias", &found, &b));
        c->attention_bias = found && b;
    }

    if (qwen35) {
        SN_TRY(get_i(tf, "linear_num_key_heads", true, 0, 1, 4096, &c->linear_num_key_heads));
        SN_TRY(get_i(tf, "linear_num_value_heads", true, 0, 1, 4096, &c->linear_num_value_heads));
        /* The upper bounds are the GatedDeltaNet kernels' (CUDA: key dim
         * 256, value dim 512; CPU: conv window 16): beyond them a model
         * loaded and then failed every forward pass. Real checkpoints use
         * 128/128/4. At least 2 conv taps: with one, the conv1d weight has
         * the same shape in the HF ([C,1,K]) and MLX ([C,K,1]) layouts, which
         * the loader tells apart by that shape (and the HF layout's norms
         * are zero-centred, so a wrong guess is silent garbage). */
        SN_TRY(get_i(tf, "linear_key_head_dim", true, 0, 1, 256, &c->linear_key_head_dim));
        SN_TRY(get_i(tf, "linear_value_head_dim", true, 0, 1, 512, &c->linear_value_head_dim));
        SN_TRY(get_i(tf, "linear_conv_kernel_dim", true, 0, 2, 16, &c->linear_conv_kernel_dim));
        if (c->linear_num_value_heads % c->linear_num_key_heads)
            return SN_FAIL(SN_E_RANGE, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                           tf->label, c->linear_num_value_heads, c->linear_num_key_heads);
    }
    if (c->arch == SN_ARCH_QWEN3_5_MOE) {
        SN_TRY(get_i(tf, "num_experts", true, 0, 1, 1 << 16, &c->n_experts));
        /* both backends' routers hold at most 64 picks per token */
        SN_TRY(get_i(tf, "num_experts_per_tok", true, 0, 1, c->n_experts < 64 ? c->n_experts : 64,
                     &c->n_experts_per_tok));
        SN_TRY(get_int(tf, "moe_intermediate_size", true, 0, 1, BIG, &c->moe_intermediate_size));
        SN_TRY(get_int(tf, "shared_expert_intermediate_size", true, 0, 1, BIG, &c->shared_expert_intermediate_size));
        c->norm_topk_prob = true;
        SN_TRY(get_bool(tf, "norm_topk_prob", &found, &b));
        if (found) c->norm_topk_prob = b;
    }
    return SN_OK;
}

sn_status sn_config_parse(const char *json, size_t len, const char *label, const char *gen_json, size_t gen_len,
                          sn_config **out)
{
    sn_status rc = SN_OK;
    json_t *root = NULL, *gen = NULL;
    json_error_t jerr;
    *out = NULL;
    if (!label) label = "config.json";
    sn_config *c = calloc(1, sizeof *c);
    if (!c) return SN_FAIL(SN_E_NOMEM, "%s: out of memory", label);
    root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = SN_FAIL(SN_E_FORMAT, "%s: invalid JSON at line %d, column %d: %s", label, jerr.line, jerr.column,
                     jerr.text);
        goto out;
    }
    if (!json_is_object(root)) { rc = SN_FAIL(SN_E_FORMAT, "%s: top level is not a JSON object", label); goto out; }
    json_t *tc = json_object_get(root, "text_config");
    if (tc && !json_is_object(tc) && !json_is_null(tc)) {
        rc = SN_FAIL(SN_E_FORMAT, "%s: \"text_config\" must be an object", label);
        goto out;
    }
    if (json_is_null(tc)) tc = NULL;
    c->has_text_config = tc != NULL;
    if ((rc = dispatch(c, label, root, tc)) != SN_OK) goto out;

    fields tf = {label, tc ? tc : root, tc ? "text_config." : ""};
    fields rf = {label, root, ""};
    if ((rc = parse_dims(c, &tf)) != SN_OK) goto out;
    if ((rc = parse_layers(c, &tf)) != SN_OK) goto out;
    if ((rc = parse_rope(c, &tf)) != SN_OK) goto out;

    /* tie_word_embeddings: text_config, then root; HF default false (mlx-lm's
     * qwen2 default of true is gotcha 9). */
    bool found = false, tie = false;
    if ((rc = get_bool(&tf, "tie_word_embeddings", &found, &tie)) != SN_OK) goto out;
    if (!found && tc && (rc = get_bool(&rf, "tie_word_embeddings", &found, &tie)) != SN_OK) goto out;
    c->tie_word_embeddings = found && tie;

    if ((rc = token_id(c, &tf, &rf, "bos_token_id", &c->bos_token_id)) != SN_OK) goto out;
    if ((rc = token_id(c, &tf, &rf, "pad_token_id", &c->pad_token_id)) != SN_OK) goto out;
    /* eos: generation_config.json is what generation stops on; without it,
     * the root's ids (the wrapper's generation eos) and the text model's. */
    if (gen_json) {
        gen = json_loadb(gen_json, gen_len, 0, &jerr);
        if (!gen) {
            rc = SN_FAIL(SN_E_FORMAT, "generation_config.json: invalid JSON at line %d, column %d: %s", jerr.line,
                         jerr.column, jerr.text);
            goto out;
        }
        if (json_is_object(gen) &&
            (rc = add_eos(c, "generation_config.json", "eos_token_id", json_object_get(gen, "eos_token_id"))) != SN_OK)
            goto out;
    }
    if (c->n_eos == 0) {
        if ((rc = add_eos(c, label, "eos_token_id", json_object_get(root, "eos_token_id"))) != SN_OK) goto out;
        if (tc && (rc = add_eos(c, label, "text_config.eos_token_id", json_object_get(tc, "eos_token_id"))) != SN_OK)
            goto out;
    }
    if ((rc = parse_quant(c, label, root, tc)) != SN_OK) goto out;
out:
    json_decref(root);
    json_decref(gen);
    if (rc != SN_OK) { sn_config_free(c); return rc; }
    *out = c;
    return SN_OK;
}

void sn_config_free(sn_config *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_q_overrides; i++) free(c->q_overrides[i].module);
    free(c->q_overrides);
    free(c);
}

sn_status sn_config_quant_for(const sn_config *c, const char *module_path, int *bits, int *group)
{
    *bits = 0;
    *group = 0;
    if (!c->quantized) return SN_OK;
    sn_quant_override key = {.module = (char *)module_path};
    const sn_quant_override *o =
        bsearch(&key, c->q_overrides, (size_t)c->n_q_overrides, sizeof *c->q_overrides, cmp_override);
    *bits = o ? o->bits : c->q_bits;
    *group = o ? o->group : c->q_group;
    return SN_OK;
}

static sn_status read_text(const char *path, char **buf, size_t *len, bool optional)
{
    *buf = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO would wait for a writer forever; only a
     * regular file is read (a device would be read up to the cap). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (optional && errno == ENOENT) return SN_OK;
        return SN_FAIL(errno == ENOENT ? SN_E_MISSING : SN_E_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return SN_FAIL(SN_E_IO, "%s: not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return SN_FAIL(SN_E_NOMEM, "%s: out of memory", path);
    }
    sn_status rc = SN_OK;
    char *b = malloc(CFG_MAX_FILE + 1);
    if (!b) { fclose(f); return SN_FAIL(SN_E_NOMEM, "%s: out of memory", path); }
    size_t n = fread(b, 1, CFG_MAX_FILE + 1, f);
    if (ferror(f)) rc = SN_FAIL(SN_E_IO, "%s: read failed", path);
    else if (n > CFG_MAX_FILE) rc = SN_FAIL(SN_E_FORMAT, "%s: larger than %u bytes", path, CFG_MAX_FILE);
    fclose(f);
    if (rc != SN_OK) { free(b); return rc; }
    b[n] = 0;
    *buf = b;
    *len = n;
    return SN_OK;
}

/* rel inside dir through the manifest pins: checked after open, and again
 * after the read so the text parsed is the text the gate hashed. An absent
 * optional file the manifest does not list leaves *buf NULL. */
static sn_status read_text_pinned(const sn_manifest_pins *pins, const char *dir, const char *rel, char **buf,
                                  size_t *len, bool optional)
{
    *buf = NULL;
    *len = 0;
    int fd;
    sn_status rc = sn_manifest_pins_open(pins, dir, rel, &fd);
    if (rc == SN_E_MISSING && optional) return SN_OK;
    if (rc != SN_OK) return rc;
    char *b = malloc(CFG_MAX_FILE + 1);
    size_t n = 0;
    if (!b) rc = SN_FAIL(SN_E_NOMEM, "%s/%s: out of memory", dir, rel);
    while (rc == SN_OK && n < CFG_MAX_FILE + 1) {
        ssize_t r = read(fd, b + n, CFG_MAX_FILE + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = SN_FAIL(SN_E_IO, "%s/%s: read failed: %s", dir, rel, strerror(errno));
        else if (r == 0) break;
        else n += (size_t)r;
    }
    if (rc == SN_OK && n > CFG_MAX_FILE) rc = SN_FAIL(SN_E_FORMAT, "%s/%s: larger than %u bytes", dir, rel, CFG_MAX_FILE);
    if (rc == SN_OK) rc = sn_manifest_pins_check_fd(pins, rel, fd);
    close(fd);
    if (rc != SN_OK) { free(b); return rc; }
    b[n] = 0;
    *buf = b;
    *len = n;
    return SN_OK;
}

sn_status sn_config_load_pinned(const char *dir, const sn_manifest_pins *pins, sn_config **out)
{
    if (!pins) return sn_config_load(dir, out);
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0) return SN_FAIL(SN_E_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return SN_FAIL(SN_E_INVALID, "%s: a pinned load needs the model directory the manifest covers", dir);
    char *cj = NULL, *gj = NULL, label[4096];
    size_t cl = 0, gl = 0;
    snprintf(label, sizeof label, "%s/config.json", dir);
    sn_status rc = read_text_pinned(pins, dir, "config.json", &cj, &cl, false);
    if (rc == SN_OK) rc = read_text_pinned(pins, dir, "generation_config.json", &gj, &gl, true);
    if (rc == SN_OK) rc = sn_config_parse(cj, cl, label, gj, gl, out);
    free(cj);
    free(gj);
    return rc;
}

sn_status sn_config_load(const char *dir_or_file, sn_config **out)
{
    *out = NULL;
    struct stat sb;
    if (stat(dir_or_file, &sb) != 0) return SN_FAIL(SN_E_IO, "%s: %s", dir_or_file, strerror(errno));
    size_t dl = strlen(dir_or_file);
    char *cfg = malloc(dl + 32), *genp = malloc(dl + 32);
    char *cj = NULL, *gj = NULL;
    size_t cl = 0, gl = 0;
    sn_status rc = SN_OK;
    if (!cfg || !genp) { rc = SN_FAIL(SN_E_NOMEM, "out of memory"); goto out; }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(cfg, dl + 32, "%s/config.json", dir_or_file);
        snprintf(genp, dl + 32, "%s/generation_config.json", dir_or_file);
    } else {
        snprintf(cfg, dl + 32, "%s", dir_or_file);
        const char *slash = strrchr(dir_or_file, '/');
        if (slash) snprintf(genp, dl + 32, "%.*s/generation_config.json", (int)(slash - dir_or_file), dir_or_file);
        else snprintf(genp, dl + 32, "generation_config.json");
    }
    if ((rc = read_text(cfg, &cj, &cl, false)) != SN_OK) goto out;
    if ((rc = read_text(genp, &gj, &gl, true)) != SN_OK) goto out;
    rc = sn_config_parse(cj, cl, cfg, gj, gl, out);
out:
    free(cj);
    free(gj);
    free(cfg);
    free(genp);
    return rc;
}
