/*
 * The scalar vector primitives (ops.h, tp_vec_kernels): the reference every ISA level is tested
 * against, and the code every x86-64 (and any other architecture) can run. Transcendentals come from
 * libm (expf, tanhf, erff); reductions accumulate in f64.
 *
 * Formulas: SiLU x·σ(x) (Elfwing et al. 2018); GELU x·Φ(x) = ½x(1 + erf(x/√2)) and its tanh form
 * ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (Hendrycks & Gimpel 2016, as torch.nn.functional.gelu).
 */
#include <math.h>

#include "ops.h"

#define SQRT1_2 0.70710678118654752440f
#define SQRT_2_OVER_PI 0.79788456080286535588f
#define GELU_TANH_C 0.044715f

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static void silu(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] * sigmoidf(x[i]);
}

static void sigmoid(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = sigmoidf(x[i]);
}

static void gelu_erf(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT1_2));
}

static void gelu_tanh(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + GELU_TANH_C * v * v * v)));
  }
}

static void vtanh(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
}

static void swiglu(const float *gate, const float *up, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

static void scale(const float *x, float *y, size_t n, float s) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] * s;
}

static void binary(int op, const float *a, ptrdiff_t sa, const float *b, ptrdiff_t sb, float *y, size_t n) {
  switch (op) {
    case TP_BIN_ADD:
      for (size_t i = 0; i < n; i++) y[i] = a[(ptrdiff_t)i * sa] + b[(ptrdiff_t)i * sb];
      break;
    case TP_BIN_SUB:
      for (size_t i = 0; i < n; i++) y[i] = a[(ptrdiff_t)i * sa] - b[(ptrdiff_t)i * sb];
      break;
    default:
      for (size_t i = 0; i < n; i++) y[i] = a[(ptrdiff_t)i * sa] * b[(ptrdiff_t)i * sb];
      break;
  }
}

static void modulate(const float *x, ptrdiff_t sx, const float *s, ptrdiff_t ss, const float *h, ptrdiff_t sh,
                     float *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const ptrdiff_t k = (ptrdiff_t)i;
    y[i] = x[k * sx] * (1.0f + s[k * ss]) + h[k * sh];
  }
}

static float vmax(const float *x, size_t n) {
  float m = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    if (x[i] != x[i]) return x[i]; /* NaN */
    if (x[i] > m) m = x[i];
  }
  return m;
}

static double sum(const float *x, size_t n, float c) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i] - c;
  return s;
}

static double sum_sq_dev(const float *x, size_t n, float c_hi, float c_lo) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    const float d = (x[i] - c_hi) - c_lo;
    s += (double)d * d;
  }
  return s;
}

static double exp_sum(const float *x, float *y, size_t n, float m) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    y[i] = expf(x[i] - m);
    s += y[i];
  }
  return s;
}

static void norm_apply(const float *x, float *y, size_t n, float c_hi, float c_lo, float r, const float *w,
                       float w_offset, const float *b) {
  for (size_t i = 0; i < n; i++) {
    float v = ((x[i] - c_hi) - c_lo) * r;
    if (w != NULL) v *= w[i] + w_offset;
    if (b != NULL) v += b[i];
    y[i] = v;
  }
}

static void shift_scale(const float *x, float *y, size_t n, float c_hi, float c_lo, float a, float b) {
  for (size_t i = 0; i < n; i++) y[i] = ((x[i] - c_hi) - c_lo) * a + b;
}

const tp_vec_kernels tp_vec_scalar = {
    .name = "scalar",
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
