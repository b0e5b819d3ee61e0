/*
 * The ConvRot weight-row quantizer, written once and compiled per ISA level (quantize_w.c: scalar,
 * quantize_w_avx2.c, quantize_w_avx512.c define QW_SUFFIX and include this file). Plain C loops that
 * the compiler vectorizes; no reassociation, no contraction (-std=c11 sets -ffp-contract=off; clang:
 * the pragma of matmul.h), so every level computes the same IEEE operations in the same order and
 * the bytes agree bit for bit with each other and with @tp/quant:
 *
 *   rotate   w_rot[g] = w[g] · H_g: the butterfly of hadamardTransform on f64 — per pass of stride s,
 *            a+b+c−d, a+b−c+d, a−b+c+d, −a+b+c+d left to right, one f64 rounding per operation —
 *            then × 2^-m (exact), then one rounding to f32 (convrot.ts quantizeConvRot);
 *   int8     s = max(f32(max|w_rot| / 127), f32(1e-30));   int4  s = f32(max(max|w_rot|, f32(1e-10)) / 7);
 *   codes    q = clamp(round_half_even(f32(w_rot / s)), −128 | −7, 127 | 7) (convrot.ts quantizeRowsSymmetric).
 *
 * NaN policy (the reference's, which reads inputs through typed arrays): a NaN anywhere in the row
 * makes max|w_rot| NaN, so the scale is the canonical quiet NaN (0x7FC00000) and every code 0;
 * infinities rotate to ±inf or NaN (inf − inf) and follow the same rules (a NaN code is 0, an
 * infinite scale makes every code 0 or NaN → 0).
 *
 * Source: Comfy-Org/comfy-kitchen quantize_int8_convrot_weight, quantize_convrot_w4a4_weight;
 * ../shared/spec/krea2.md §1.6–1.8; packages/quant/src/convrot.ts, hadamard.ts.
 */
#ifndef QW_SUFFIX
#error "define QW_SUFFIX (scalar, avx2, avx512) before including quantize_w_body.h"
#endif

#include <string.h>

#include "matmul.h"
#include "quantize_w.h"

#define QW_CAT2(a, b) a##_##b
#define QW_CAT(a, b) QW_CAT2(a, b)
#define QW_FN(name) QW_CAT(name, QW_SUFFIX)

/* f32 bits with any NaN replaced by the canonical quiet NaN (what a JavaScript typed-array read gives). */
static inline uint32_t QW_FN(qw_canon)(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : u; }

/* k source values → f64 (exact: every f16 / bf16 / f32 value is a double). */
static void QW_FN(qw_load)(const uint8_t *src, int32_t dtype, int64_t k, double *row) {
  if (dtype == TP_BF16) {
    for (int64_t i = 0; i < k; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      row[i] = (double)tp_bits_f32(QW_FN(qw_canon)((uint32_t)h << 16));
    }
  } else if (dtype == TP_F16) {
    for (int64_t i = 0; i < k; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      row[i] = (double)tp_bits_f32(QW_FN(qw_canon)(tp_f32_bits(tp_f16_f32(h))));
    }
  } else {
    for (int64_t i = 0; i < k; i++) {
      uint32_t u;
      memcpy(&u, src + 4 * i, 4);
      row[i] = (double)tp_bits_f32(QW_FN(qw_canon)(u));
    }
  }
}

/*
 * The first pass (stride 1) of one group: quads of consecutive values. Written over four quads at a
 * time with the quads' elements gathered into locals, which the compiler turns into shuffles.
 */
static inline void QW_FN(qw_pass1)(double *v, int32_t g) {
  for (int32_t p = 0; p < g; p += 4) {
    const double a = v[p], b = v[p + 1], c = v[p + 2], d = v[p + 3];
    v[p] = ((a + b) + c) - d;
    v[p + 1] = ((a + b) - c) + d;
    v[p + 2] = ((a - b) + c) + d;
    v[p + 3] = ((b - a) + c) + d;
  }
}

/* Passes of stride s ≥ 4 of one group: contiguous runs of s, vectorized along o. */
static inline void QW_FN(qw_pass)(double *restrict v, int32_t g, int32_t s) {
  for (int32_t base = 0; base < g; base += 4 * s) {
    double *restrict pa = v + base;
    double *restrict pb = pa + s;
    double *restrict pc = pb + s;
    double *restrict pd = pc + s;
    for (int32_t o = 0; o < s; o++) {
      const double a = pa[o], b = pb[o], c = pc[o], d = pd[o];
      pa[o] = ((a + b) + c) - d;
      pb[o] = ((a + b) - c) + d;
      pc[o] = ((a - b) + c) + d;
      pd[o] = ((b - a) + c) + d;
    }
  }
}

void QW_FN(tp_qw_convrot_row)(const uint8_t *src, int32_t dtype, int64_t k, int32_t g, int32_t bits, double *row,
                              float *rot, uint8_t *out, float *scale) {
  QW_FN(qw_load)(src, dtype, k, row);
  const double norm = 1.0 / (double)((int64_t)1 << tp_log4(g)); /* 2^-m, exact */
  for (int64_t off = 0; off < k; off += g) {
    double *v = row + off;
    QW_FN(qw_pass1)(v, g);
    for (int32_t s = 4; s < g; s *= 4) QW_FN(qw_pass)(v, g, s);
  }
  /* × 2^-m, one rounding to f32, and max |w_rot| (NaN-propagating, as Math.max) */
  float amax = 0.0f;
  int nan = 0;
  for (int64_t i = 0; i < k; i++) {
    const float r = (float)(row[i] * norm);
    rot[i] = r;
    const float a = r < 0.0f ? -r : r;
    amax = a > amax ? a : amax;
    nan |= r != r;
  }
  float s;
  int32_t lo, hi;
  if (bits == 8) {
    s = amax / 127.0f;
    if (!(s >= 1e-30f)) s = 1e-30f; /* Math.max(s, f32(1e-30)); s is not NaN here */
    lo = -128;
    hi = 127;
  } else {
    s = (amax > 1e-10f ? amax : 1e-10f) / 7.0f;
    lo = -7;
    hi = 7;
  }
  if (nan) {
    *scale = tp_bits_f32(0x7FC00000u);
    memset(out, 0, (size_t)(bits == 8 ? k : k / 2));
    return;
  }
  *scale = s;
  /*
   * q = round_half_even(f32(w_rot / s)): |w_rot / s| ≤ 127.00002 (or NaN / 0 when s = inf), so adding
   * and subtracting 1.5 · 2^23 rounds to an integer with ties to even; a NaN code is 0.
   */
  if (bits == 8) {
    int8_t *q = (int8_t *)out;
    for (int64_t i = 0; i < k; i++) {
      const float t = (rot[i] / s + 12582912.0f) - 12582912.0f;
      const float c = t < (float)lo ? (float)lo : t > (float)hi ? (float)hi : t;
      q[i] = (int8_t)(c == c ? (int32_t)c : 0);
    }
  } else {
    for (int64_t i = 0; i < k; i += 2) {
      const float t0 = (rot[i] / s + 12582912.0f) - 12582912.0f;
      const float t1 = (rot[i + 1] / s + 12582912.0f) - 12582912.0f;
      const float c0 = t0 < (float)lo ? (float)lo : t0 > (float)hi ? (float)hi : t0;
      const float c1 = t1 < (float)lo ? (float)lo : t1 > (float)hi ? (float)hi : t1;
      const int32_t q0 = c0 == c0 ? (int32_t)c0 : 0, q1 = c1 == c1 ? (int32_t)c1 : 0;
      out[i / 2] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
    }
  }
}

#undef QW_FN
#undef QW_CAT
#undef QW_CAT2
