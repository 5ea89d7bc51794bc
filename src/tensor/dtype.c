/* Dtype sizes and names, half-precision conversions, sn_weight sizes. */
#include "sanctum/tensor.h"

#include <string.h>

size_t sn_dtype_size(sn_dtype dt)
{
    switch (dt) {
    case SN_DT_F32: case SN_DT_U32: case SN_DT_I32: return 4;
    case SN_DT_F16: case SN_DT_BF16: return 2;
    case SN_DT_U8: case SN_DT_I8: return 1;
    case SN_DT_Q4: case SN_DT_Q8: case SN_DT_COUNT: return 0;
    }
    return 0;
}

const char *sn_dtype_name(sn_dtype dt)
{
    switch (dt) {
    case SN_DT_F32: return "F32";
    case SN_DT_F16: return "F16";
    case SN_DT_BF16: return "BF16";
    case SN_DT_U32: return "U32";
    case SN_DT_I32: return "I32";
    case SN_DT_U8: return "U8";
    case SN_DT_I8: return "I8";
    case SN_DT_Q4: return "Q4";
    case SN_DT_Q8: return "Q8";
    case SN_DT_COUNT: break;
    }
    return "?";
}

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t sn_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    /* NaN: keep it a NaN (set a mantissa bit, since truncation could leave
     * an all-zero mantissa, i.e. infinity). */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float sn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));   /* inf / NaN */
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t sn_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN stays NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal (or zero): value / 2^-24 rounded half to even;
         * the float arithmetic below is exact up to the final rint-like step. */
        float v = bits_f32(a) * 0x1p24f;        /* exact: scaling by a power of two */
        uint32_t m = (uint32_t)v;
        float frac = v - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);             /* m == 0x400 carries into the exponent correctly */
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits half to even */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
}

float sn_load_f32(const void *p, sn_dtype dt, size_t i)
{
    switch (dt) {
    case SN_DT_F32: { float v; memcpy(&v, (const char *)p + 4 * i, 4); return v; }
    case SN_DT_BF16: { uint16_t h; memcpy(&h, (const char *)p + 2 * i, 2); return sn_bf16_to_f32(h); }
    case SN_DT_F16: { uint16_t h; memcpy(&h, (const char *)p + 2 * i, 2); return sn_f16_to_f32(h); }
    default: break;
    }
    SN_ASSERT(!"sn_load_f32: not a float dtype");
    return 0.0f;
}

/* For a stacked expert weight this is one expert's share (rows x cols);
 * callers multiply by n_experts for the whole tensor. */
size_t sn_weight_bytes(const sn_weight *w)
{
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    if (w->dtype == SN_DT_Q4 || w->dtype == SN_DT_Q8) {
        size_t bits = w->dtype == SN_DT_Q4 ? 4 : 8;
        size_t groups = w->group > 0 ? cols / (size_t)w->group : 0;
        return rows * cols * bits / 8 + 2 * rows * groups * sn_dtype_size(w->sdtype);
    }
    return rows * cols * sn_dtype_size(w->dtype);
}
