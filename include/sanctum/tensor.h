/* Dtypes and weight views.
 *
 * A weight is a view into the checkpoint mmap (never a copy on the CPU
 * backend). Linear weights are [rows=out, cols=in] and are either dense
 * (F32/F16/BF16) or MLX affine-quantized (Q4/Q8: packed uint32 words,
 * LSB-first, plus per-group scales and biases, w = scale*q + bias). */
#ifndef SANCTUM_TENSOR_H
#define SANCTUM_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "sanctum/status.h"

typedef enum {
    SN_DT_F32, SN_DT_F16, SN_DT_BF16, SN_DT_U32, SN_DT_I32, SN_DT_U8, SN_DT_I8,
    SN_DT_Q4, /* affine 4-bit, packed in uint32 words */
    SN_DT_Q8, /* affine 8-bit, packed in uint32 words */
    SN_DT_COUNT
} sn_dtype;

size_t sn_dtype_size(sn_dtype dt);      /* bytes per element; 0 for Q4/Q8 */
const char *sn_dtype_name(sn_dtype dt); /* "F32", "BF16", "Q4", ... */

static inline float sn_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
uint16_t sn_f32_to_bf16(float f);   /* round to nearest even, NaN kept */
float sn_f16_to_f32(uint16_t h);
uint16_t sn_f32_to_f16(float f);

/* Load element i of a dense F32/F16/BF16 array as float. */
float sn_load_f32(const void *p, sn_dtype dt, size_t i);

typedef struct sn_weight {
    sn_dtype dtype;       /* F32/F16/BF16 dense, or Q4/Q8 */
    int64_t rows, cols;   /* logical [out, in] (for an expert stack: per expert) */
    int64_t n_experts;    /* 0 for a plain matrix; E for a stacked [E, rows, cols] */
    int group;            /* quant group size (32/64/128); 0 when dense */
    const void *data;     /* dense values, or packed uint32 [.., rows, cols*bits/32] */
    const void *scales;   /* [.., rows, cols/group] in sdtype */
    const void *qbiases;  /* [.., rows, cols/group] in sdtype (quantization offsets) */
    sn_dtype sdtype;      /* dtype of scales/qbiases (BF16/F16/F32) */
    const float *bias;    /* optional linear bias [rows] (qwen2 q/k/v), fp32, owned by the model */
    void *dev;            /* backend-private uploaded form (NULL on the CPU backend) */
} sn_weight;

/* Bytes one expert / the whole matrix occupies as stored (weights + scales + biases). */
size_t sn_weight_bytes(const sn_weight *w);

#endif
