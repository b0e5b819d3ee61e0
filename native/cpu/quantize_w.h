/*
 * Internal declarations of the weight quantizers (tp.h tp_cpu_quantize_weight): bf16 / f16 / f32
 * rows → INT8 / INT4 ConvRot, fp8 e4m3fn scaled, GGUF Q8_0 / Q4_0 / Q4_K / Q6_K, bit for bit as the
 * TypeScript references of @tp/quant (convrot.ts, fp8.ts, ggml-quantize.ts) compute them.
 *
 *   quantize_w.c         entry point (checks, the split over the pool, dispatch), fp8, GGUF (scalar)
 *   quantize_w_body.h    the ConvRot row kernel: load + f64 Hadamard butterfly + per-row quantization,
 *                        compiled once per ISA level (plain C the compiler vectorizes; every f64 / f32
 *                        operation is one IEEE operation, so the levels agree bit for bit)
 *   quantize_w_avx2.c    that body with -mavx2 -mfma -mf16c (no FMA contraction: -std=c11)
 *   quantize_w_avx512.c  that body with -mavx512f -mavx512bw -mavx512vl
 *
 * Nothing here is exported; the entry point is declared in tp.h.
 */
#ifndef TP_CPU_QUANTIZE_W_H
#define TP_CPU_QUANTIZE_W_H

#include <stdint.h>

#include "internal.h"

/*
 * One ConvRot row: load k source values (`dtype` TP_F32 / TP_F16 / TP_BF16, any alignment; NaN
 * read as the canonical quiet NaN, as JavaScript reads it from a typed array), rotate each group
 * of g = 4^m columns with the f64 butterfly of @tp/quant hadamardTransform (then × 2^-m), round to
 * f32, and quantize the row symmetrically (bits 8: int8 codes −128..127; bits 4: −7..7 packed two
 * per byte, element 2i in the low nibble). `row` is scratch of k doubles, `rot` of k floats.
 * Writes k (int8) or k / 2 (int4) bytes to `out` and the row scale to `*scale`.
 */
typedef void (*tp_qw_convrot_row_fn)(const uint8_t *src, int32_t dtype, int64_t k, int32_t g, int32_t bits,
                                     double *row, float *rot, uint8_t *out, float *scale);

void tp_qw_convrot_row_scalar(const uint8_t *src, int32_t dtype, int64_t k, int32_t g, int32_t bits, double *row,
                              float *rot, uint8_t *out, float *scale);
void tp_qw_convrot_row_avx2(const uint8_t *src, int32_t dtype, int64_t k, int32_t g, int32_t bits, double *row,
                            float *rot, uint8_t *out, float *scale);
void tp_qw_convrot_row_avx512(const uint8_t *src, int32_t dtype, int64_t k, int32_t g, int32_t bits, double *row,
                              float *rot, uint8_t *out, float *scale);

#endif /* TP_CPU_QUANTIZE_W_H */
