/*
 * The vector primitives (ops.h, tp_vec_kernels) with AVX2 + FMA (compiled with -mavx2 -mfma -mf16c;
 * chosen when the context's ISA level is TP_ISA_AVX2). 8 lanes; a tail of fewer than 8 elements is
 * copied into a small buffer, computed as one full vector and copied back, so no load or store
 * touches memory past n and the tail gets the same maths as the body.
 *
 * The approximations are those of vec_avx512.c (Cephes expf / tanhf polynomials, Eigen's rational
 * erf); 2^n is built in the exponent bits, so inputs are clamped to [-87.34, 88.38] first and
 * results outside that range are set to 0 / +inf explicitly.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops.h"

#define BLOCK 1024 /* elements summed in f32 lanes before the partial sum goes to f64 */

static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365478515625f), hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  /* x second: MAXPS / MINPS return the second operand when one is NaN, so NaN propagates */
  __m256 c = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  /* 2^n for n in [-126, 128]: (n + 127) << 23 (128 gives the +inf pattern) */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 out = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  out = _mm256_andnot_ps(under, out);                              /* e^x underflows to 0 */
  return _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY), over); /* and overflows to +inf */
}

static inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

static inline __m256 tanh8(__m256 x) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 ax = _mm256_andnot_ps(sign_bit, x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_add_ps(ax, ax));
  __m256 large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  large = _mm256_or_ps(large, _mm256_and_ps(sign_bit, x));
  return _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

static inline __m256 erf8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(4.0f), _mm256_max_ps(_mm256_set1_ps(-4.0f), x));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-2.72614225801306e-10f);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.77068142495902e-08f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-2.10102402082508e-06f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-5.69250639462346e-05f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-7.34990630326855e-04f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-2.95459980854025e-03f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.60960333262415e-02f));
  p = _mm256_mul_ps(p, x);
  __m256 q = _mm256_set1_ps(-1.45660718464996e-05f);
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-2.13374055278905e-04f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-1.68282697438203e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-7.37332916720468e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-1.42647390514189e-02f));
  return _mm256_div_ps(p, q);
}

static inline __m256 silu8(__m256 x) { return _mm256_mul_ps(x, sigmoid8(x)); }

static inline __m256 gelu_erf8(__m256 x) {
  const __m256 e = erf8(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752440f)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 gelu_tanh8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 inner =
      _mm256_mul_ps(_mm256_set1_ps(0.79788456080286535588f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(inner)));
}

/* Load the k < 8 floats at p into a zero-padded vector (through a stack buffer: no read past p + k). */
static inline __m256 load_tail(const float *p, size_t k) {
  float buf[8] = {0};
  memcpy(buf, p, k * sizeof(float));
  return _mm256_loadu_ps(buf);
}

static inline void store_tail(float *p, __m256 v, size_t k) {
  float buf[8];
  _mm256_storeu_ps(buf, v);
  memcpy(p, buf, k * sizeof(float));
}

#define UNARY(name, f)                                                            \
  static void name(const float *x, float *y, size_t n) {                          \
    size_t i = 0;                                                                 \
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i))); \
    if (i < n) store_tail(y + i, f(load_tail(x + i, n - i)), n - i);              \
  }

UNARY(silu, silu8)
UNARY(sigmoid, sigmoid8)
UNARY(gelu_erf, gelu_erf8)
UNARY(gelu_tanh, gelu_tanh8)
UNARY(vtanh, tanh8)

static void swiglu(const float *gate, const float *up, float *y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) store_tail(y + i, _mm256_mul_ps(silu8(load_tail(gate + i, n - i)), load_tail(up + i, n - i)), n - i);
}

static void scale(const float *x, float *y, size_t n, float s) {
  const __m256 v = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), v));
  for (; i < n; i++) y[i] = x[i] * s;
}

static inline __m256 apply_bin(int op, __m256 a, __m256 b) {
  return op == TP_BIN_ADD ? _mm256_add_ps(a, b) : op == TP_BIN_SUB ? _mm256_sub_ps(a, b) : _mm256_mul_ps(a, b);
}

static inline __m256 load_s(const float *p, ptrdiff_t s) { return s == 0 ? _mm256_set1_ps(*p) : _mm256_loadu_ps(p); }

static void binary(int op, const float *a, ptrdiff_t sa, const float *b, ptrdiff_t sb, float *y, size_t n) {
  if ((sa != 0 && sa != 1) || (sb != 0 && sb != 1)) {
    tp_vec_scalar.binary(op, a, sa, b, sb, y, n);
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, apply_bin(op, load_s(a + (ptrdiff_t)i * sa, sa), load_s(b + (ptrdiff_t)i * sb, sb)));
  if (i < n) tp_vec_scalar.binary(op, a + (ptrdiff_t)i * sa, sa, b + (ptrdiff_t)i * sb, sb, y + i, n - i);
}

static void modulate(const float *x, ptrdiff_t sx, const float *s, ptrdiff_t ss, const float *h, ptrdiff_t sh,
                     float *y, size_t n) {
  if ((sx != 0 && sx != 1) || (ss != 0 && ss != 1) || (sh != 0 && sh != 1)) {
    tp_vec_scalar.modulate(x, sx, s, ss, h, sh, y, n);
    return;
  }
  const __m256 one = _mm256_set1_ps(1.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vx = load_s(x + (ptrdiff_t)i * sx, sx);
    const __m256 vs = load_s(s + (ptrdiff_t)i * ss, ss);
    const __m256 vh = load_s(h + (ptrdiff_t)i * sh, sh);
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(vx, _mm256_add_ps(one, vs)), vh));
  }
  if (i < n)
    tp_vec_scalar.modulate(x + (ptrdiff_t)i * sx, sx, s + (ptrdiff_t)i * ss, ss, h + (ptrdiff_t)i * sh, sh, y + i,
                           n - i);
}

static float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

static float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static float vmax(const float *x, size_t n) {
  __m256 acc = _mm256_set1_ps(-INFINITY);
  __m256 nan = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    acc = _mm256_max_ps(acc, v);
  }
  if (_mm256_movemask_ps(nan) != 0) return NAN;
  float m = hmax8(acc);
  for (; i < n; i++) {
    if (x[i] != x[i]) return x[i];
    if (x[i] > m) m = x[i];
  }
  return m;
}

static double sum(const float *x, size_t n, float c) {
  const __m256 vc = _mm256_set1_ps(c);
  double total = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    const size_t e = n - b < BLOCK ? n : b + BLOCK;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t i = b;
    for (; i + 16 <= e; i += 16) {
      a0 = _mm256_add_ps(a0, _mm256_sub_ps(_mm256_loadu_ps(x + i), vc));
      a1 = _mm256_add_ps(a1, _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vc));
    }
    float part = hsum8(_mm256_add_ps(a0, a1));
    for (; i < e; i++) part += x[i] - c;
    total += (double)part;
  }
  return total;
}

static double sum_sq_dev(const float *x, size_t n, float c_hi, float c_lo) {
  const __m256 vc = _mm256_set1_ps(c_hi), vl = _mm256_set1_ps(c_lo);
  double total = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    const size_t e = n - b < BLOCK ? n : b + BLOCK;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t i = b;
    for (; i + 16 <= e; i += 16) {
      const __m256 d0 = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc), vl);
      const __m256 d1 = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vc), vl);
      a0 = _mm256_fmadd_ps(d0, d0, a0);
      a1 = _mm256_fmadd_ps(d1, d1, a1);
    }
    float part = hsum8(_mm256_add_ps(a0, a1));
    for (; i < e; i++) {
      const float d = (x[i] - c_hi) - c_lo;
      part += d * d;
    }
    total += (double)part;
  }
  return total;
}

static double exp_sum(const float *x, float *y, size_t n, float mx) {
  const __m256 vm = _mm256_set1_ps(mx);
  double total = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    const size_t e = n - b < BLOCK ? n : b + BLOCK;
    __m256 acc = _mm256_setzero_ps();
    size_t i = b;
    for (; i + 8 <= e; i += 8) {
      const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
      _mm256_storeu_ps(y + i, v);
      acc = _mm256_add_ps(acc, v);
    }
    float part = hsum8(acc);
    if (i < e) {
      float buf[8];
      const size_t k = e - i;
      _mm256_storeu_ps(buf, exp8(_mm256_sub_ps(load_tail(x + i, k), vm)));
      for (size_t j = 0; j < k; j++) part += buf[j];
      memcpy(y + i, buf, k * sizeof(float));
    }
    total += (double)part;
  }
  return total;
}

static void norm_apply(const float *x, float *y, size_t n, float c_hi, float c_lo, float r, const float *w,
                       float w_offset, const float *b) {
  const __m256 vc = _mm256_set1_ps(c_hi), vl = _mm256_set1_ps(c_lo), vr = _mm256_set1_ps(r);
  const __m256 vo = _mm256_set1_ps(w_offset);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc), vl), vr);
    if (w != NULL) v = _mm256_mul_ps(v, _mm256_add_ps(_mm256_loadu_ps(w + i), vo));
    if (b != NULL) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(y + i, v);
  }
  if (i < n)
    tp_vec_scalar.norm_apply(x + i, y + i, n - i, c_hi, c_lo, r, w == NULL ? NULL : w + i, w_offset,
                             b == NULL ? NULL : b + i);
}

static void shift_scale(const float *x, float *y, size_t n, float c_hi, float c_lo, float a, float bb) {
  const __m256 vc = _mm256_set1_ps(c_hi), vl = _mm256_set1_ps(c_lo), va = _mm256_set1_ps(a), vb = _mm256_set1_ps(bb);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc), vl);
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(d, va), vb));
  }
  for (; i < n; i++) y[i] = ((x[i] - c_hi) - c_lo) * a + bb;
}

const tp_vec_kernels tp_vec_avx2 = {
    .name = "avx2",
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
