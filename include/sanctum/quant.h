/* MLX affine quantization: packing, reference dequantization and the
 * reference quantizer (architecture.md §3.5).
 *
 * Layout: a row of `cols` values at `bits` bits is a little-endian stream of
 * uint32 words, element i at bit (i*bits) of the stream, LSB-first (4-bit:
 * element 0 is the low nibble of word 0). Each group of `group` consecutive
 * values in a row has one scale and one bias: w = scale*q + bias. Scales
 * may be negative. Scales/biases are stored in the model dtype (BF16, F16 or
 * F32). These are the scalar reference routines that backends are tested
 * against; they are not the fast path. */
#ifndef SANCTUM_QUANT_H
#define SANCTUM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "sanctum/status.h"
#include "sanctum/tensor.h"

/* True for the (bits, group) pairs we support: bits 4 or 8, group 32/64/128. */
int sn_q_supported(int bits, int group);

/* uint32 words per packed row of cols values (cols*bits/32); cols is a
 * multiple of the group size, so of 32/bits (see sn_q_check_shape). */
static inline int64_t sn_q_words(int64_t cols, int bits) { return cols * bits / 32; }

/* Validate a quantized matrix description: supported bits/group, cols a
 * positive multiple of group. what names it in the error. */
sn_status sn_q_check_shape(int64_t rows, int64_t cols, int bits, int group, const char *what);

/* q[0..n) <- the n values of a packed row (n % (32/bits) == 0). */
void sn_q_unpack_row(const uint32_t *packed, int bits, int64_t n, uint8_t *q);
/* packed[0..n*bits/32) <- q[0..n); values above 2^bits-1 are masked. */
void sn_q_pack_row(const uint8_t *q, int bits, int64_t n, uint32_t *packed);

/* out[0..n) <- dequantized row: packed words, scales/biases for n/group
 * groups of dtype sdtype (BF16/F16/F32). */
void sn_q_dequant_row(const uint32_t *packed, const void *scales, const void *biases,
                      sn_dtype sdtype, int bits, int group, int64_t n, float *out);

/* One row of a sn_weight (Q4/Q8 dequantized, F32/F16/BF16 converted) of
 * expert e (0 for a plain matrix) into out[cols]. */
sn_status sn_weight_row_f32(const sn_weight *w, int64_t e, int64_t row, float *out);
/* The whole [rows, cols] matrix of expert e into out[rows*cols]. */
sn_status sn_weight_to_f32(const sn_weight *w, int64_t e, float *out);

/* Reference quantizer, exactly MLX's affine_quantize per group:
 *   n = 2^bits-1; s = max((max-min)/n, 1e-7); edge = min if |min|>|max|
 *   else (s = -s, edge = max); q0 = rint(edge/s);
 *   if q0 != 0: s = edge/q0, bias = edge else bias = 0;
 *   q = clip(rint((w-bias)/s), 0, n)
 * computed in fp32 with rint = round half to even; the q codes use the fp32
 * scale/bias, then scales/biases are rounded to sdtype (BF16: round to
 * nearest even) for storage, as MLX does when it casts them to the weight
 * dtype. w is [rows, cols]; packed [rows, cols*bits/32]; scales/biases
 * [rows, cols/group] in sdtype. */
sn_status sn_q_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group,
                        sn_dtype sdtype, uint32_t *packed, void *scales, void *biases);

#endif
