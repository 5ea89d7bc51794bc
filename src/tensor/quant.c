/* MLX affine quantization: scalar reference pack/unpack, dequant, quantize.
 *
 * The reference quantizer follows mlx ops.cpp affine_quantize step by step
 * (see quant.h). Choices where MLX's dtype handling matters:
 *  - all arithmetic is fp32 (our inputs are fp32; MLX computes in the
 *    weight dtype, which for an fp32 source is the same);
 *  - the codes q are computed with the fp32 scale and bias, and only then
 *    are scale and bias rounded to the storage dtype, which is what MLX's
 *    pack_and_quantize-then-astype order does. So dequantizing with the
 *    stored bf16 scale can differ from the fp32 reconstruction by the bf16
 *    rounding of the scale (relative 2^-9), which is inherent to the format. */
#include "sanctum/quant.h"

#include <math.h>
#include <string.h>

int sn_q_supported(int bits, int group)
{
    return (bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128);
}

sn_status sn_q_check_shape(int64_t rows, int64_t cols, int bits, int group, const char *what)
{
    if (bits != 4 && bits != 8)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: %d-bit quantization is not supported (4 or 8)", what, bits);
    if (group != 32 && group != 64 && group != 128)
        return SN_FAIL(SN_E_UNSUPPORTED, "%s: group size %d is not supported (32, 64 or 128)", what, group);
    if (rows <= 0 || cols <= 0)
        return SN_FAIL(SN_E_SHAPE, "%s: empty quantized matrix [%lld, %lld]", what,
                       (long long)rows, (long long)cols);
    if (cols % group)
        return SN_FAIL(SN_E_SHAPE, "%s: %lld columns is not a multiple of group size %d", what,
                       (long long)cols, group);
    return SN_OK;
}

void sn_q_unpack_row(const uint32_t *packed, int bits, int64_t n, uint8_t *q)
{
    SN_ASSERT(bits == 4 || bits == 8);
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    SN_ASSERT(n % per == 0);
    for (int64_t w = 0; w < n / per; w++) {
        uint32_t word = packed[w];
        for (int j = 0; j < per; j++) q[w * per + j] = (uint8_t)((word >> (bits * j)) & mask);
    }
}

void sn_q_pack_row(const uint8_t *q, int bits, int64_t n, uint32_t *packed)
{
    SN_ASSERT(bits == 4 || bits == 8);
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    SN_ASSERT(n % per == 0);
    for (int64_t w = 0; w < n / per; w++) {
        uint32_t word = 0;
        for (int j = 0; j < per; j++) word |= ((uint32_t)q[w * per + j] & mask) << (bits * j);
        packed[w] = word;
    }
}

void sn_q_dequant_row(const uint32_t *packed, const void *scales, const void *biases,
                      sn_dtype sdtype, int bits, int group, int64_t n, float *out)
{
    SN_ASSERT(sn_q_supported(bits, group) && n % group == 0);
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    for (int64_t g = 0; g < n / group; g++) {
        float s = sn_load_f32(scales, sdtype, (size_t)g);
        float b = sn_load_f32(biases, sdtype, (size_t)g);
        const uint32_t *pw = packed + g * group / per;
        float *o = out + g * group;
        for (int w = 0; w < group / per; w++) {
            uint32_t word = pw[w];
            for (int j = 0; j < per; j++) o[w * per + j] = s * (float)((word >> (bits * j)) & mask) + b;
        }
    }
}

static sn_status weight_check(const sn_weight *w, int64_t e, int64_t row)
{
    if (e < 0 || e >= (w->n_experts > 0 ? w->n_experts : 1))
        return SN_FAIL(SN_E_RANGE, "expert %lld out of range", (long long)e);
    if (row < 0 || row >= w->rows) return SN_FAIL(SN_E_RANGE, "row %lld out of range", (long long)row);
    return SN_OK;
}

sn_status sn_weight_row_f32(const sn_weight *w, int64_t e, int64_t row, float *out)
{
    SN_TRY(weight_check(w, e, row));
    int64_t r = e * w->rows + row;   /* row index within the stacked tensor */
    if (w->dtype == SN_DT_Q4 || w->dtype == SN_DT_Q8) {
        int bits = w->dtype == SN_DT_Q4 ? 4 : 8;
        SN_TRY(sn_q_check_shape(w->rows, w->cols, bits, w->group, "weight"));
        if (w->sdtype != SN_DT_BF16 && w->sdtype != SN_DT_F16 && w->sdtype != SN_DT_F32)
            return SN_FAIL(SN_E_UNSUPPORTED, "weight: scales dtype %s is not BF16/F16/F32", sn_dtype_name(w->sdtype));
        int64_t ng = w->cols / w->group;
        size_t ss = sn_dtype_size(w->sdtype);
        sn_q_dequant_row((const uint32_t *)w->data + r * sn_q_words(w->cols, bits),
                         (const char *)w->scales + (size_t)(r * ng) * ss,
                         (const char *)w->qbiases + (size_t)(r * ng) * ss,
                         w->sdtype, bits, w->group, w->cols, out);
        return SN_OK;
    }
    if (w->dtype != SN_DT_F32 && w->dtype != SN_DT_F16 && w->dtype != SN_DT_BF16)
        return SN_FAIL(SN_E_UNSUPPORTED, "weight dtype %s is not a matrix dtype", sn_dtype_name(w->dtype));
    for (int64_t c = 0; c < w->cols; c++) out[c] = sn_load_f32(w->data, w->dtype, (size_t)(r * w->cols + c));
    return SN_OK;
}

sn_status sn_weight_to_f32(const sn_weight *w, int64_t e, float *out)
{
    for (int64_t r = 0; r < w->rows; r++) SN_TRY(sn_weight_row_f32(w, e, r, out + r * w->cols));
    return SN_OK;
}

static void store_scalar(void *p, sn_dtype dt, size_t i, float v)
{
    switch (dt) {
    case SN_DT_F32: memcpy((char *)p + 4 * i, &v, 4); break;
    case SN_DT_BF16: { uint16_t h = sn_f32_to_bf16(v); memcpy((char *)p + 2 * i, &h, 2); break; }
    case SN_DT_F16: { uint16_t h = sn_f32_to_f16(v); memcpy((char *)p + 2 * i, &h, 2); break; }
    default: SN_ASSERT(!"store_scalar: not a float dtype");
    }
}

sn_status sn_q_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group,
                        sn_dtype sdtype, uint32_t *packed, void *scales, void *biases)
{
    SN_TRY(sn_q_check_shape(rows, cols, bits, group, "quantize"));
    if (sdtype != SN_DT_F32 && sdtype != SN_DT_F16 && sdtype != SN_DT_BF16)
        return SN_FAIL(SN_E_INVALID, "quantize: scales dtype %s is not F32/F16/BF16", sn_dtype_name(sdtype));
    const float n = (float)((1 << bits) - 1);
    const int64_t ng = cols / group;
    uint8_t q[128];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < ng; g++) {
            const float *x = w + r * cols + g * group;
            float mn = x[0], mx = x[0];
            for (int i = 1; i < group; i++) {
                if (!isfinite(x[i]))
                    return SN_FAIL(SN_E_INVALID, "quantize: non-finite value at row %lld col %lld",
                                   (long long)r, (long long)(g * group + i));
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
            }
            if (!isfinite(x[0]))
                return SN_FAIL(SN_E_INVALID, "quantize: non-finite value at row %lld col %lld",
                               (long long)r, (long long)(g * group));
            float s = fmaxf((mx - mn) / n, 1e-7f);
            float edge;
            if (fabsf(mn) > fabsf(mx)) {
                edge = mn;
            } else {
                s = -s;
                edge = mx;
            }
            /* rintf: round half to even in the default rounding mode, as mx.round */
            float q0 = rintf(edge / s);
            float b = 0.0f;
            if (q0 != 0.0f) {
                s = edge / q0;
                b = edge;
            }
            for (int i = 0; i < group; i++) {
                float v = rintf((x[i] - b) / s);
                v = v < 0.0f ? 0.0f : (v > n ? n : v);
                q[i] = (uint8_t)v;
            }
            sn_q_pack_row(q, bits, group, packed + r * sn_q_words(cols, bits) + g * group * bits / 32);
            store_scalar(scales, sdtype, (size_t)(r * ng + g), s);
            store_scalar(biases, sdtype, (size_t)(r * ng + g), b);
        }
    }
    return SN_OK;
}
