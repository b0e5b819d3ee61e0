/*
 * The vector primitives (ops.h, tp_vec_kernels) with AVX-512 F (compiled with -mavx512f -mavx512bw
 * -mavx512vl -mf16c; chosen when the context's ISA level is TP_ISA_AVX512). 16 lanes; tails are
 * one masked step, so no load or store touches memory past n.
 *
 * Transcendentals are polynomial approximations, not libm, so results differ from vec_scalar.c by a
 * few ulp (the conformance suite's tolerances state how much is allowed):
 * - exp: Cody–Waite reduction x = n·ln2 + r, e^r by the Cephes expf polynomial (degree 7, ~1 ulp),
 *   2^n by VSCALEFPS (exact, handles overflow to +inf and underflow to 0). Source: Cephes `expf.c`.
 * - tanh: the Cephes tanhf odd polynomial for |x| < 0.625, else 1 − 2/(e^{2|x|} + 1).
 * - erf: the rational approximation x·P(x²)/Q(x²) on [−4, 4] of Eigen's `generic_fast_erf_float`
 *   (max abs error 6.5e-8 evaluated in f64).
 */
#include <immintrin.h>
#include <math.h>

#include "ops.h"

#define BLOCK 1024 /* elements summed in f32 lanes before the partial sum goes to f64 */

static inline __mmask16 tail_mask(size_t k) { return (__mmask16)((1u << k) - 1u); }

static inline __m512 exp16(__m512 x) {
  /* clamp with x second: MAXPS / MINPS return the second operand when one is NaN, so NaN propagates */
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

static inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

static inline __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp16(_mm512_add_ps(ax, ax));
  __m512 large = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  /* copy the sign of x onto the large-|x| result */
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
  large = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large), sign));
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, large, small);
}

static inline __m512 erf16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(4.0f), _mm512_max_ps(_mm512_set1_ps(-4.0f), x));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.60960333262415e-02f));
  p = _mm512_mul_ps(p, x);
  __m512 q = _mm512_set1_ps(-1.45660718464996e-05f);
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.42647390514189e-02f));
  return _mm512_div_ps(p, q);
}

static inline __m512 silu16(__m512 x) { return _mm512_mul_ps(x, sigmoid16(x)); }

static inline __m512 gelu_erf16(__m512 x) {
  const __m512 e = erf16(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752440f)));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline __m512 gelu_tanh16(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 inner =
      _mm512_mul_ps(_mm512_set1_ps(0.79788456080286535588f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
  const __m512 t = tanh16(inner);
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

/* y = f(x) over n elements, 16 lanes at a time, a masked last step */
#define UNARY(name, f)                                                 \
  static void name(const float *x, float *y, size_t n) {               \
    size_t i = 0;                                                      \
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i))); \
    if (i < n) {                                                       \
      const __mmask16 m = tail_mask(n - i);                            \
      _mm512_mask_storeu_ps(y + i, m, f(_mm512_maskz_loadu_ps(m, x + i))); \
    }                                                                  \
  }

UNARY(silu, silu16)
UNARY(sigmoid, sigmoid16)
UNARY(gelu_erf, gelu_erf16)
UNARY(gelu_tanh, gelu_tanh16)
UNARY(vtanh, tanh16)

static void swiglu(const float *gate, const float *up, float *y, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(silu16(g), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

static void scale(const float *x, float *y, size_t n, float s) {
  const __m512 v = _mm512_set1_ps(s);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), v));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), v));
  }
}

static inline __m512 apply_bin(int op, __m512 a, __m512 b) {
  return op == TP_BIN_ADD ? _mm512_add_ps(a, b) : op == TP_BIN_SUB ? _mm512_sub_ps(a, b) : _mm512_mul_ps(a, b);
}

/* a vector of 16 elements at stride s (0: broadcast, 1: contiguous) under mask m */
static inline __m512 load_s(const float *p, ptrdiff_t s, __mmask16 m) {
  return s == 0 ? _mm512_set1_ps(*p) : _mm512_maskz_loadu_ps(m, p);
}

static void binary(int op, const float *a, ptrdiff_t sa, const float *b, ptrdiff_t sb, float *y, size_t n) {
  if ((sa != 0 && sa != 1) || (sb != 0 && sb != 1)) {
    tp_vec_scalar.binary(op, a, sa, b, sb, y, n);
    return;
  }
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 va = load_s(a + (ptrdiff_t)i * sa, sa, 0xFFFF);
    const __m512 vb = load_s(b + (ptrdiff_t)i * sb, sb, 0xFFFF);
    _mm512_storeu_ps(y + i, apply_bin(op, va, vb));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 va = load_s(a + (ptrdiff_t)i * sa, sa, m);
    const __m512 vb = load_s(b + (ptrdiff_t)i * sb, sb, m);
    _mm512_mask_storeu_ps(y + i, m, apply_bin(op, va, vb));
  }
}

static void modulate(const float *x, ptrdiff_t sx, const float *s, ptrdiff_t ss, const float *h, ptrdiff_t sh,
                     float *y, size_t n) {
  if ((sx != 0 && sx != 1) || (ss != 0 && ss != 1) || (sh != 0 && sh != 1)) {
    tp_vec_scalar.modulate(x, sx, s, ss, h, sh, y, n);
    return;
  }
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
    const __m512 vx = load_s(x + (ptrdiff_t)i * sx, sx, m);
    const __m512 vs = load_s(s + (ptrdiff_t)i * ss, ss, m);
    const __m512 vh = load_s(h + (ptrdiff_t)i * sh, sh, m);
    /* x·(1 + scale) rounded, then + shift: the order of torch's x * (1 + scale) + shift */
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_mul_ps(vx, _mm512_add_ps(one, vs)), vh));
  }
}

static float vmax(const float *x, size_t n) {
  __m512 acc = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    acc = _mm512_max_ps(acc, v);
  }
  if (nan) return NAN;
  return _mm512_reduce_max_ps(acc);
}

static double sum(const float *x, size_t n, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  double total = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    const size_t e = n - b < BLOCK ? n : b + BLOCK;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    size_t i = b;
    for (; i + 32 <= e; i += 32) {
      a0 = _mm512_add_ps(a0, _mm512_sub_ps(_mm512_loadu_ps(x + i), vc));
      a1 = _mm512_add_ps(a1, _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vc));
    }
    for (; i < e; i += 16) {
      const __mmask16 m = e - i >= 16 ? (__mmask16)0xFFFF : tail_mask(e - i);
      a0 = _mm512_add_ps(a0, _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), vc));
    }
    total += (double)_mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
  return total;
}

static double sum_sq_dev(const float *x, size_t n, float c_hi, float c_lo) {
  const __m512 vc = _mm512_set1_ps(c_hi), vl = _mm512_set1_ps(c_lo);
  double total = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    const size_t e = n - b < BLOCK ? n : b + BLOCK;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    size_t i = b;
    for (; i + 32 <= e; i += 32) {
      const __m512 d0 = _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vc), vl);
      const __m512 d1 = _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vc), vl);
      a0 = _mm512_fmadd_ps(d0, d0, a0);
      a1 = _mm512_fmadd_ps(d1, d1, a1);
    }
    for (; i < e; i += 16) {
      const __mmask16 m = e - i >= 16 ? (__mmask16)0xFFFF : tail_mask(e - i);
      const __m512 d = _mm512_maskz_sub_ps(m, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vc), vl);
      a0 = _mm512_fmadd_ps(d, d, a0);
    }
    total += (double)_mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
  return total;
}

static double exp_sum(const float *x, float *y, size_t n, float mx) {
  const __m512 vm = _mm512_set1_ps(mx);
  double total = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    const size_t e = n - b < BLOCK ? n : b + BLOCK;
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = b; i < e; i += 16) {
      const __mmask16 m = e - i >= 16 ? (__mmask16)0xFFFF : tail_mask(e - i);
      const __m512 v = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm)));
      _mm512_mask_storeu_ps(y + i, m, v);
      acc = _mm512_add_ps(acc, v);
    }
    total += (double)_mm512_reduce_add_ps(acc);
  }
  return total;
}

static void norm_apply(const float *x, float *y, size_t n, float c_hi, float c_lo, float r, const float *w,
                       float w_offset, const float *b) {
  const __m512 vc = _mm512_set1_ps(c_hi), vl = _mm512_set1_ps(c_lo), vr = _mm512_set1_ps(r);
  const __m512 vo = _mm512_set1_ps(w_offset);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
    __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vc), vl), vr);
    if (w != NULL) v = _mm512_mul_ps(v, _mm512_add_ps(_mm512_maskz_loadu_ps(m, w + i), vo));
    if (b != NULL) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

static void shift_scale(const float *x, float *y, size_t n, float c_hi, float c_lo, float a, float bb) {
  const __m512 vc = _mm512_set1_ps(c_hi), vl = _mm512_set1_ps(c_lo), va = _mm512_set1_ps(a), vb = _mm512_set1_ps(bb);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vc), vl);
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_mul_ps(d, va), vb));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 d = _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vc), vl);
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(d, va), vb);
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

const tp_vec_kernels tp_vec_avx512 = {
    .name = "avx512",
    .silu = silu,
    .sigmoid = sigmoid,
    .gelu_erf = gelu_erf,
    .gelu_tanh = gelu_tanh,
    .tanh = vtanh,
    .swiglu = swiglu,
    .scale = scale,
    .binary = binary,
    .modulate = modulate,
    .max = vmax,
    .sum = sum,
    .sum_sq_dev = sum_sq_dev,
    .exp_sum = exp_sum,
    .norm_apply = norm_apply,
    .shift_scale = shift_scale,
};
