/*
 * Activation quantizers, scalar: what a matmul does to x before its integer dot products.
 *
 * ggml (llm.md §2.6; ggml/src/ggml-quants.c quantize_row_q8_0_ref, q8_1_ref, q8_K_ref; @tp/quant
 * ggml-quantize.ts), bit for bit:
 *   Q8_0 / Q8_1, per 32: d = max|x| / 127, q = roundf(x · (1/d)) (ties away from zero), d stored as
 *     f16; Q8_1 also stores s = f16(f32(Σq · d)).
 *   Q8_K, per 256: the signed value of largest magnitude max; is = −127 / max; q = min(127,
 *     nearest(is · x)); d = 1 / is (f32); bsums = Σq per 16.
 * ConvRot (krea2.md §1.6–1.8; @tp/quant convrot-linear.ts quantizeActivationsConvRot), bit for bit:
 *   rotate each group of g with the f32 butterfly (every addition rounded, fixed order), × 2^-m;
 *   int8: s = max(f32(max|x| / 127), 1e-30), int4: s = f32(max(max|x|, 1e-10) / 7);
 *   q = clamp(round_half_even(f32(x / s)), −128 | −7, 127 | 7).
 * Non-finite input, as the reference's arithmetic gives it (JavaScript's Math.max keeps a NaN): a Q8_0 /
 * Q8_1 block, or a ConvRot row after its rotation, that holds a NaN gets d (s) = NaN, one that holds ±inf
 * and no NaN gets +inf; all its codes are 0 and Q8_1's s is NaN — so the matmul's output is NaN, as in
 * f32. Q8_K, like ggml's, skips a NaN when it looks for the largest magnitude.
 */
#include "matmul.h"

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5 · 2^23 drops the fraction (ggml nearest_int). */
static inline int32_t rint_small(float v) {
  const float r = (v + 12582912.0f) - 12582912.0f;
  return (int32_t)r;
}

/* C roundf (ties away from zero) for |v| < 2^22, without libm. */
static inline int32_t round_away(float v) {
  const int32_t t = (int32_t)v; /* truncation */
  const float frac = v - (float)t; /* exact */
  if (frac >= 0.5f) return t + 1;
  if (frac <= -0.5f) return t - 1;
  return t;
}

static void q8_0_blocks(const float *x, int64_t k, uint8_t *out, int with_sum) {
  const size_t bb = with_sum ? 36 : 34;
  for (int64_t b = 0; b < k / 32; b++) {
    const float *v = x + 32 * b;
    uint8_t *o = out + (size_t)b * bb;
    float amax = 0.0f;
    int nan = 0;
    for (int j = 0; j < 32; j++) {
      const float a = v[j] < 0 ? -v[j] : v[j];
      if (a > amax) amax = a;
      nan |= a != a;
    }
    if (nan || amax == INFINITY) {
      tp_q8_nonfinite_block(o, bb, nan);
      continue;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = tp_f32_f16(d);
    memcpy(o, &dh, 2);
    int8_t *qs = (int8_t *)(o + bb - 32);
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
      const int32_t q = round_away(v[j] * id);
      qs[j] = (int8_t)q;
      sum += q;
    }
    if (with_sum) {
      const uint16_t sh = tp_f32_f16((float)sum * d);
      memcpy(o + 2, &sh, 2);
    }
  }
}

void tp_quantize_q8_0_row(const float *x, int64_t k, uint8_t *out) { q8_0_blocks(x, k, out, 0); }
void tp_quantize_q8_1_row(const float *x, int64_t k, uint8_t *out) { q8_0_blocks(x, k, out, 1); }

void tp_quantize_q8_k_row(const float *x, int64_t k, uint8_t *out) {
  for (int64_t b = 0; b < k / 256; b++) {
    const float *v = x + 256 * b;
    uint8_t *o = out + (size_t)b * 292;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++) {
      const float a = v[j] < 0 ? -v[j] : v[j];
      if (a > amax) {
        amax = a;
        max = v[j];
      }
    }
    memset(o, 0, 292);
    if (amax == 0.0f) continue; /* d = 0, codes and sums 0 */
    const float iscale = -127.0f / max;
    int8_t *qs = (int8_t *)(o + 4);
    for (int j = 0; j < 256; j++) {
      const int32_t q = rint_small(iscale * v[j]);
      qs[j] = (int8_t)(q < 127 ? q : 127);
    }
    for (int g = 0; g < 16; g++) {
      int16_t s = 0;
      for (int i = 0; i < 16; i++) s = (int16_t)(s + qs[16 * g + i]);
      memcpy(o + 260 + 2 * g, &s, 2);
    }
    const float d = 1.0f / iscale;
    memcpy(o, &d, 4);
  }
}

int32_t tp_log4(int64_t g) {
  int32_t m = 0;
  while (g >= 4 && g % 4 == 0) {
    g /= 4;
    m++;
  }
  return g == 1 ? m : 0;
}

/* In place: v[0..g) ← v · H_g with the f32 butterfly of @tp/quant hadamardTransform. */
static void hadamard_f32(float *v, int32_t g) {
  for (int32_t s = 1; s < g; s *= 4) {
    for (int32_t base = 0; base < g; base += 4 * s) {
      for (int32_t o = 0; o < s; o++) {
        const int32_t p = base + o;
        const float a = v[p], b = v[p + s], c = v[p + 2 * s], d = v[p + 3 * s];
        v[p] = ((a + b) + c) - d;
        v[p + s] = ((a + b) - c) + d;
        v[p + 2 * s] = ((a - b) + c) + d;
        v[p + 3 * s] = ((b - a) + c) + d;
      }
    }
  }
  const float norm = 1.0f / (float)(1 << tp_log4(g));
  for (int32_t i = 0; i < g; i++) v[i] = v[i] * norm;
}

void tp_convrot_quantize_row_scalar(const float *x, int64_t k, int32_t g, int32_t bits, float *tmp, int8_t *codes,
                                    float *scale, int32_t *sum) {
  memcpy(tmp, x, (size_t)k * sizeof(float));
  for (int64_t off = 0; off < k; off += g) hadamard_f32(tmp + off, g);
  float amax = 0.0f;
  int nan = 0;
  for (int64_t i = 0; i < k; i++) {
    const float a = tmp[i] < 0 ? -tmp[i] : tmp[i];
    if (a > amax) amax = a;
    nan |= a != a;
  }
  if (nan || amax == INFINITY) {
    tp_convrot_nonfinite_row(k, codes, scale, sum, nan);
    return;
  }
  float s;
  int32_t lo, hi;
  if (bits == 8) {
    s = amax / 127.0f;
    if (!(s >= 1e-30f)) s = 1e-30f;
    lo = -128;
    hi = 127;
  } else {
    s = (amax > 1e-10f ? amax : 1e-10f) / 7.0f;
    lo = -7;
    hi = 7;
  }
  int32_t total = 0;
  for (int64_t i = 0; i < k; i++) {
    int32_t q = rint_small(tmp[i] / s);
    q = q < lo ? lo : q > hi ? hi : q;
    codes[i] = (int8_t)q;
    total += q;
  }
  *scale = s;
  *sum = total;
}
