/*
 * Weight quantizers (tp.h tp_cpu_quantize_weight): rows of bf16 / f16 / f32 → INT8 / INT4 ConvRot,
 * fp8 e4m3fn with one per-tensor scale, GGUF Q8_0 / Q4_0 / Q4_K / Q6_K. Bit for bit the bytes (and
 * f32 scale bits) of the TypeScript references of @tp/quant, which are the oracle of the tests
 * (packages/conformance/src/quantize-kernels.test.ts):
 *
 *   ConvRot   convrot.ts quantizeConvRot (comfy-kitchen quantize_int8_convrot_weight /
 *             quantize_convrot_w4a4_weight): quantize_w_body.h, per ISA level;
 *   fp8       fp8.ts quantizeFp8Scaled (comfy-kitchen quantize_per_tensor_fp8): s = f32(max|w|) / 448,
 *             q = e4m3fn(clamp(f32(w · f32(1/s)), ±448)), all-zero → s = 1; a NaN anywhere, or an s
 *             too small to invert, is TP_ERR_ARG (the reference throws E_ARG);
 *   GGUF      ggml-quantize.ts (ggml-org/llama.cpp ggml/src/ggml-quants.c quantize_row_q8_0_ref,
 *             quantize_row_q4_0_ref, quantize_row_q4_K_ref + make_qkx2_quants, quantize_row_q6_K_ref
 *             + make_qx_quants with rmse_type 1), each f32 operation in the C order.
 *
 * The GGUF paths follow the TypeScript line by line, JavaScript number semantics included, so that
 * inputs with NaN or ±inf give the same bytes too: Math.min / Math.max propagate NaN (js_min /
 * js_max), a NaN or infinite number stored to a Uint8Array / Int8Array or used in a bit operation is
 * 0 (js_int32), `nearestInt` is computed as in rounding.ts (f32 add of 1.5 · 2^23, then an f64
 * subtraction), and input NaNs are read as the canonical quiet NaN (a typed-array read in JavaScript).
 * For finite inputs this is exactly ggml's arithmetic.
 *
 * Work split: ConvRot by rows, GGUF by blocks, fp8 in two passes (max |w| per chunk, then the codes)
 * — each task writes only its own bytes, so the thread count never changes the result.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "quantize_w.h"

#define QW_SUFFIX scalar
#include "quantize_w_body.h"
#undef QW_SUFFIX

#if (defined(__x86_64__) || defined(__i386__)) && !defined(TP_NO_X86_KERNELS)
#define TP_QW_X86 1
#else
#define TP_QW_X86 0
#endif

/* Largest element count the entry point accepts (keeps every size product below 2^63). */
#define TP_QW_MAX ((int64_t)1 << 40)
/* Source elements per task at least (below: the calling thread alone). */
#define TP_QW_TASK_MIN 65536

/* ggml GROUP_MAX_EPS: below this max |x| a Q6_K group is all zero. */
#define QW_GROUP_MAX_EPS 1e-15f

/* ---- JavaScript number semantics (see the file comment) ------------------------------------- */

static inline double js_min(double a, double b) { return (a != a || b != b) ? (double)NAN : (a < b ? a : b); }
static inline double js_max(double a, double b) { return (a != a || b != b) ? (double)NAN : (a > b ? a : b); }

/* ECMAScript ToInt32: NaN and ±inf → 0, else the integer part modulo 2^32, as a signed value. */
static int32_t js_int32_slow(double v) {
  if (!(v == v) || v == (double)INFINITY || v == -(double)INFINITY) return 0;
  double t = fmod(trunc(v), 4294967296.0);
  if (t < 0) t += 4294967296.0;
  return (int32_t)(uint32_t)t;
}
static inline int32_t js_int32(double v) {
  if (v > -2147483649.0 && v < 2147483648.0) return (int32_t)v; /* truncates; false for NaN */
  return js_int32_slow(v);
}

/* @tp/quant rounding.ts nearestInt: fround(fround(x) + 12582912) − 12582912, the last step in f64. */
static inline double js_nearest(float x) {
  const float v = x + 12582912.0f;
  return (double)v - 12582912.0;
}

/* @tp/quant rounding.ts roundHalfAway (C roundf): floor(|x| + 0.5) in f64, sign restored; NaN stays NaN. */
static inline double js_round_away(float x) {
  const double a = fabs((double)x) + 0.5;
  const double r = a < 9007199254740992.0 ? (double)(int64_t)a : floor(a); /* floor of a positive value */
  return x < 0 ? (r == 0 ? 0.0 : -r) : r;
}

/* Math.trunc for the Q4_0 codes: the integer part; NaN and ±inf unchanged. */
static inline double js_trunc(double v) {
  return (v > -9007199254740992.0 && v < 9007199254740992.0) ? (double)(int64_t)v : v;
}

/* f32 → f16 bits (tp_cpu_cast rules = @tp/tensor f32ToF16), and the value the block will hold. */
static inline uint16_t qw_f16(float x, float *value) {
  const uint16_t h = tp_f32_f16(x);
  if (value) *value = tp_f16_f32(h);
  return h;
}

static inline void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* One block of source values → f32 with NaNs canonical (what the reference's toF32 + reads give). */
static void qw_load_f32(const uint8_t *src, int32_t dtype, int64_t n, float *x) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    if (dtype == TP_BF16) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      u = (uint32_t)h << 16;
    } else if (dtype == TP_F16) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      u = tp_f32_bits(tp_f16_f32(h));
    } else {
      memcpy(&u, src + 4 * i, 4);
    }
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) u = 0x7FC00000u;
    x[i] = tp_bits_f32(u);
  }
}

/* ---- GGUF: Q8_0, Q4_0 (blocks of 32) ---------------------------------------------------------- */

/* ggml-quantize.ts quantizeQ8_0 (withSum false): d = max|x| / 127, q = roundf(x · (1/d)). */
static void qw_q8_0_block(const float *x, uint8_t *o) {
  float amax = 0.0f;
  int nan = 0;
  for (int j = 0; j < 32; j++) {
    const float a = fabsf(x[j]);
    amax = a > amax ? a : amax;
    nan |= a != a;
  }
  if (nan) amax = tp_bits_f32(0x7FC00000u);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put16(o, qw_f16(d, NULL));
  for (int j = 0; j < 32; j++) o[2 + j] = (uint8_t)(js_int32(js_round_away(x[j] * id)) & 255);
}

/* ggml-quantize.ts signedAbsMax: the value of largest magnitude, the first one on ties. */
static float qw_signed_absmax(const float *x, int n, float *amax_out) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; i++) {
    if (fabsf(x[i]) > amax) {
      amax = fabsf(x[i]);
      max = x[i];
    }
  }
  if (amax_out) *amax_out = amax;
  return max;
}

/* ggml-quantize.ts quantizeQ4_0: d = max / −8, q = min(15, trunc(x · (1/d) + 8.5)). */
static void qw_q4_0_block(const float *x, uint8_t *o) {
  const float max = qw_signed_absmax(x, 32, NULL);
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put16(o, qw_f16(d, NULL));
  for (int j = 0; j < 16; j++) {
    const float x0 = x[j] * id, x1 = x[16 + j] * id;
    const int32_t q0 = js_int32(js_min(15, js_trunc((double)(x0 + 8.5f))));
    const int32_t q1 = js_int32(js_min(15, js_trunc((double)(x1 + 8.5f))));
    o[2 + j] = (uint8_t)((q0 | (int32_t)((uint32_t)q1 << 4)) & 255);
  }
}

/* ---- GGUF: Q4_K --------------------------------------------------------------------------------- */

/*
 * ggml-quantize.ts makeQkx2Quants with n = 32, nmax = 15, rmin = −1, rdelta = f32(0.1), nstep = 20,
 * useMad = false (quantize_row_q4_K_ref). L receives the codes (a Uint8Array in the reference);
 * returns the scale and, in *the_min, −min.
 */
static float qw_make_qkx2(const float *x, const float *w, uint8_t *L, float *the_min) {
  enum { n = 32, nstep = 20 };
  const float nmax = 15.0f, rmin = -1.0f, rdelta = 0.1f;
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w = sum_w + w[i];
    sum_x = sum_x + w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    memset(L, 0, n);
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; i++) {
    const double l = js_max(0, js_min(nmax, js_nearest(iscale * (x[i] - min))));
    L[i] = (uint8_t)js_int32(l);
    float diff = ((scale * (float)l) + min) - x[i];
    diff = diff * diff;
    best_error = best_error + w[i] * diff;
  }
  uint8_t laux[n];
  for (int is = 0; is <= nstep; is++) {
    iscale = ((rmin + rdelta * (float)is) + nmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; i++) {
      const double l = js_max(0, js_min(nmax, js_nearest(iscale * (x[i] - min))));
      laux[i] = (uint8_t)js_int32(l);
      const float wl = w[i] * (float)l;
      sum_l = sum_l + wl;
      sum_l2 = sum_l2 + wl * (float)l;
      sum_xl = sum_xl + wl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; i++) {
        float diff = ((this_scale * (float)laux[i]) + this_min) - x[i];
        diff = diff * diff;
        cur_error = cur_error + w[i] * diff;
      }
      if (cur_error < best_error) {
        memcpy(L, laux, n);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

/* The 6-bit scale and min of sub-block k from the 12 packed bytes (ggml get_scale_min_k4). */
static inline void qw_scale_min_k4(const uint8_t *S, int k, int *sc, int *m) {
  if (k < 4) {
    *sc = S[k] & 63;
    *m = S[k + 4] & 63;
  } else {
    *sc = (S[k + 4] & 15) | ((S[k - 4] >> 6) << 4);
    *m = (S[k + 4] >> 4) | ((S[k] >> 6) << 4);
  }
}

/* ggml-quantize.ts quantizeQ4_K, one block of 256 → 144 bytes (o zeroed by the caller). */
static void qw_q4_k_block(const float *x, uint8_t *o) {
  uint8_t L[256];
  float weights[32], scales[8], mins[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; j++) {
    const float *xj = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; l++) sum_x2 = sum_x2 + xj[l] * xj[l];
    const float av_x = sqrtf(sum_x2 / 32.0f);
    for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xj[l]);
    float the_min;
    const float scale = qw_make_qkx2(xj, weights, L + 32 * j, &the_min);
    /* a Float32Array store: a NaN becomes the canonical NaN (only compared below, never stored) */
    scales[j] = scale;
    mins[j] = the_min;
    if (scale > max_scale) max_scale = scale;
    if (the_min > max_min) max_min = the_min;
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t *S = o + 4;
  for (int j = 0; j < 8; j++) {
    /* `uint8_t ls = nearest_int(...)` keeps the low 8 bits, then MIN(63, ·) */
    const int32_t ls = js_int32(js_min(63, js_int32(js_nearest(inv_scale * scales[j])) & 255));
    const int32_t lm = js_int32(js_min(63, js_int32(js_nearest(inv_min * mins[j])) & 255));
    if (j < 4) {
      S[j] = (uint8_t)ls;
      S[j + 4] = (uint8_t)lm;
    } else {
      S[j + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
      S[j - 4] = (uint8_t)(S[j - 4] | ((ls >> 4) << 6));
      S[j] = (uint8_t)(S[j] | ((lm >> 4) << 6));
    }
  }
  float d_value, dmin_value;
  put16(o, qw_f16(max_scale / 63.0f, &d_value));
  put16(o + 2, qw_f16(max_min / 63.0f, &dmin_value));
  for (int j = 0; j < 8; j++) {
    int sc, m;
    qw_scale_min_k4(S, j, &sc, &m);
    const float dj = d_value * (float)sc;
    if (dj == 0) continue;
    const float dm = dmin_value * (float)m;
    for (int ii = 0; ii < 32; ii++) {
      const double l = js_nearest((x[32 * j + ii] + dm) / dj);
      L[32 * j + ii] = (uint8_t)js_int32(js_max(0, js_min(15, l)));
    }
  }
  uint8_t *q = o + 16;
  for (int c = 0; c < 4; c++) {
    for (int l = 0; l < 32; l++) q[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

/* ---- GGUF: Q6_K --------------------------------------------------------------------------------- */

/* The sums of one candidate of qw_make_qx (ggml-quantize.ts makeQxQuants `sums`). */
static void qw_qx_sums(const float *x, float iscale, uint8_t *L, float *sumlx_out, float *suml2_out) {
  enum { n = 16 };
  const double nmax = 32;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; i++) {
    const double l = js_max(-nmax, js_min(nmax - 1, js_nearest(iscale * x[i])));
    if (L) L[i] = (uint8_t)js_int32(l + nmax);
    const float w = x[i] * x[i];
    sumlx = sumlx + (w * x[i]) * (float)l;
    suml2 = suml2 + (w * (float)l) * (float)l;
  }
  *sumlx_out = sumlx;
  *suml2_out = suml2;
}

/* ggml-quantize.ts makeQxQuants with n = 16, nmax = 32 (rmse_type 1, no importance weights). */
static float qw_make_qx(const float *x, uint8_t *L) {
  enum { n = 16 };
  const float nmax = 32.0f;
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; i++) {
    const float ax = fabsf(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < QW_GROUP_MAX_EPS) {
    memset(L, 0, n);
    return 0.0f;
  }
  float sumlx, suml2;
  qw_qx_sums(x, -nmax / max, L, &sumlx, &suml2);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (is == 0) continue;
    const float iscale = -(nmax + 0.1f * (float)is) / max;
    qw_qx_sums(x, iscale, NULL, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      qw_qx_sums(x, iscale, L, &sumlx, &suml2);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/* ggml-quantize.ts quantizeQ6_K, one block of 256 → 210 bytes (o zeroed by the caller). */
static void qw_q6_k_block(const float *x, uint8_t *o) {
  uint8_t L[256];
  float scales[16];
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  for (int ib = 0; ib < 16; ib++) {
    const float s = qw_make_qx(x + 16 * ib, L + 16 * ib);
    scales[ib] = s;
    if (fabsf(s) > max_abs_scale) {
      max_abs_scale = fabsf(s);
      max_scale = s;
    }
  }
  if (max_abs_scale < QW_GROUP_MAX_EPS) return; /* the whole block stays zero (d = 0) */
  const float iscale = -128.0f / max_scale;
  float d_value;
  put16(o + 208, qw_f16(1.0f / iscale, &d_value));
  int8_t *sc = (int8_t *)(o + 192);
  for (int ib = 0; ib < 16; ib++) sc[ib] = (int8_t)js_int32(js_min(127, js_nearest(iscale * scales[ib])));
  for (int j = 0; j < 16; j++) {
    const float dj = d_value * (float)sc[j];
    if (dj == 0) continue;
    for (int ii = 0; ii < 16; ii++) {
      const double l = js_nearest(x[16 * j + ii] / dj);
      L[16 * j + ii] = (uint8_t)js_int32(js_max(-32, js_min(31, l)) + 32);
    }
  }
  for (int half = 0; half < 2; half++) {
    uint8_t *ql = o + 64 * half;
    uint8_t *qh = o + 128 + 32 * half;
    const uint8_t *Lh = L + 128 * half;
    for (int l = 0; l < 32; l++) {
      ql[l] = (uint8_t)((Lh[l] & 15) | ((Lh[l + 64] & 15) << 4));
      ql[l + 32] = (uint8_t)((Lh[l + 32] & 15) | ((Lh[l + 96] & 15) << 4));
      qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
    }
  }
}

/* ---- entry point ---------------------------------------------------------------------------- */

static tp_status qw_error(tp_ctx *ctx, tp_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tp_status qw_error(tp_ctx *ctx, tp_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
  return status;
}

typedef struct qw_job {
  int32_t format, dtype, group;
  int64_t n, k;
  const uint8_t *src;
  size_t src_elem;       /* bytes per source element */
  uint8_t *out;
  float *scales;
  tp_qw_convrot_row_fn convrot_row;
  /* GGUF: blocks in all, elements and bytes per block */
  int64_t blocks;
  int32_t block_elems, block_bytes;
  /* fp8: element chunks, per-chunk max |w| and NaN flags (pass 1), and 1 / s (pass 2) */
  int64_t count;
  float *chunk_amax;
  uint8_t *chunk_nan;
  float inv;
  int32_t oom;           /* set by a task whose scratch allocation failed */
} qw_job;

/* [begin, end) of task t of n_tasks over `total` units. */
static inline void qw_range(int64_t total, int64_t t, int64_t n_tasks, int64_t *begin, int64_t *end) {
  *begin = t * total / n_tasks;
  *end = (t + 1) * total / n_tasks;
}

static void qw_convrot_task(void *arg, int64_t t, int64_t n_tasks) {
  qw_job *j = arg;
  int64_t r0, r1;
  qw_range(j->n, t, n_tasks, &r0, &r1);
  if (r0 == r1) return;
  double *row = malloc((size_t)j->k * sizeof(double));
  float *rot = malloc((size_t)j->k * sizeof(float));
  if (row == NULL || rot == NULL) {
    __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
  } else {
    const int32_t bits = j->format == TP_W_INT8_CONVROT ? 8 : 4;
    const size_t out_row = (size_t)(bits == 8 ? j->k : j->k / 2);
    for (int64_t r = r0; r < r1; r++) {
      j->convrot_row(j->src + (size_t)r * (size_t)j->k * j->src_elem, j->dtype, j->k, j->group, bits, row, rot,
                     j->out + (size_t)r * out_row, &j->scales[r]);
    }
  }
  free(row);
  free(rot);
}

static void qw_ggml_task(void *arg, int64_t t, int64_t n_tasks) {
  qw_job *j = arg;
  int64_t b0, b1;
  qw_range(j->blocks, t, n_tasks, &b0, &b1);
  float x[256];
  for (int64_t b = b0; b < b1; b++) {
    qw_load_f32(j->src + (size_t)b * (size_t)j->block_elems * j->src_elem, j->dtype, j->block_elems, x);
    uint8_t *o = j->out + (size_t)b * (size_t)j->block_bytes;
    memset(o, 0, (size_t)j->block_bytes);
    switch (j->format) {
      case TP_W_Q8_0: qw_q8_0_block(x, o); break;
      case TP_W_Q4_0: qw_q4_0_block(x, o); break;
      case TP_W_Q4_K: qw_q4_k_block(x, o); break;
      default: qw_q6_k_block(x, o); break;
    }
  }
}

/* Elements per fp8 chunk (a multiple of 64; the last chunk may be shorter). */
#define QW_FP8_CHUNK 65536

static void qw_fp8_amax_task(void *arg, int64_t t, int64_t n_tasks) {
  qw_job *j = arg;
  const int64_t chunks = (j->count + QW_FP8_CHUNK - 1) / QW_FP8_CHUNK;
  int64_t c0, c1;
  qw_range(chunks, t, n_tasks, &c0, &c1);
  float x[1024];
  for (int64_t c = c0; c < c1; c++) {
    const int64_t e1 = (c + 1) * QW_FP8_CHUNK < j->count ? (c + 1) * QW_FP8_CHUNK : j->count;
    float amax = 0.0f;
    int nan = 0;
    for (int64_t e = c * QW_FP8_CHUNK; e < e1; e += 1024) {
      const int64_t len = e1 - e < 1024 ? e1 - e : 1024;
      qw_load_f32(j->src + (size_t)e * j->src_elem, j->dtype, len, x);
      for (int64_t i = 0; i < len; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
        nan |= a != a;
      }
    }
    j->chunk_amax[c] = amax;
    j->chunk_nan[c] = (uint8_t)nan;
  }
}

static void qw_fp8_code_task(void *arg, int64_t t, int64_t n_tasks) {
  qw_job *j = arg;
  const int64_t chunks = (j->count + 1023) / 1024;
  int64_t c0, c1;
  qw_range(chunks, t, n_tasks, &c0, &c1);
  float x[1024];
  for (int64_t c = c0; c < c1; c++) {
    const int64_t e = c * 1024;
    const int64_t len = j->count - e < 1024 ? j->count - e : 1024;
    qw_load_f32(j->src + (size_t)e * j->src_elem, j->dtype, len, x);
    for (int64_t i = 0; i < len; i++) {
      const float v = x[i] * j->inv;
      /* Math.min(448, Math.max(−448, v)): a NaN passes and stays NaN (with its sign) */
      x[i] = v < -448.0f ? -448.0f : v > 448.0f ? 448.0f : v;
    }
    tp_cast_f32_to_f8_e4m3fn_scalar(x, j->out + e, (size_t)len, TP_CAST_SATURATE);
  }
}

static tp_qw_convrot_row_fn qw_pick_convrot(const tp_ctx *ctx) {
#if TP_QW_X86
  if (ctx->isa >= TP_ISA_AVX512) return tp_qw_convrot_row_avx512;
  if (ctx->isa >= TP_ISA_AVX2) return tp_qw_convrot_row_avx2;
#else
  (void)ctx;
#endif
  return tp_qw_convrot_row_scalar;
}

static int64_t qw_tasks(const tp_ctx *ctx, int64_t units, int64_t elems_per_unit) {
  if (ctx->n_threads <= 1 || units <= 1) return 1;
  const int64_t by_size = units * elems_per_unit / TP_QW_TASK_MIN;
  int64_t n = (int64_t)ctx->n_threads * 4;
  if (by_size < n) n = by_size;
  if (n > units) n = units;
  return n < 1 ? 1 : n;
}

static void qw_run(tp_ctx *ctx, int64_t n_tasks, tp_task_fn fn, void *arg) {
  if (n_tasks <= 1 || ctx->n_threads <= 1) {
    for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, n_tasks);
  } else {
    tp_parallel_for(&ctx->pool, n_tasks, fn, arg);
  }
}

tp_status tp_cpu_quantize_weight(tp_ctx *ctx, int32_t format, const void *src, int32_t src_dtype, uint64_t src_bytes,
                                 int64_t n, int64_t k, int32_t group, void *out, uint64_t out_bytes, float *scales,
                                 int64_t n_scales) {
  static const char *fn = "tp_cpu_quantize_weight";
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const int convrot = format == TP_W_INT8_CONVROT || format == TP_W_INT4_CONVROT;
  const int fp8 = format == TP_W_F8_E4M3FN;
  const int ggml = format == TP_W_Q8_0 || format == TP_W_Q4_0 || format == TP_W_Q4_K || format == TP_W_Q6_K;
  if (!convrot && !fp8 && !ggml) {
    return qw_error(ctx, TP_ERR_UNSUPPORTED,
                    "%s: cannot quantize to format %d; supported: int8_convrot (5), int4_convrot (6), f8_e4m3fn "
                    "scaled (3), q8_0 (11), q4_0 (7), q4_k (14), q6_k (16)",
                    fn, (int)format);
  }
  const tp_wformat_info *f = &tp_wformats[format];
  size_t elem;
  if (src_dtype == TP_F32) elem = 4;
  else if (src_dtype == TP_F16 || src_dtype == TP_BF16) elem = 2;
  else return qw_error(ctx, TP_ERR_ARG, "%s: src_dtype %d is not f32 (0), f16 (1) or bf16 (2)", fn, (int)src_dtype);
  if (n < 0 || k < 0 || n > TP_QW_MAX || k > TP_QW_MAX || (n > 0 && k > TP_QW_MAX / n)) {
    return qw_error(ctx, TP_ERR_ARG, "%s: bad shape [%lld, %lld]", fn, (long long)n, (long long)k);
  }
  const int64_t row_bytes = tp_row_bytes(format, k);
  if (row_bytes < 0) {
    return qw_error(ctx, TP_ERR_ARG, "%s: k = %lld is not a whole number of %s blocks of %d elements", fn,
                    (long long)k, f->name, (int)f->block);
  }
  const uint64_t count = (uint64_t)n * (uint64_t)k;
  if (src_bytes != count * elem) {
    return qw_error(ctx, TP_ERR_ARG, "%s: [%lld, %lld] source values need %llu bytes, got src_bytes = %llu", fn,
                    (long long)n, (long long)k, (unsigned long long)(count * elem), (unsigned long long)src_bytes);
  }
  if (out_bytes != (uint64_t)n * (uint64_t)row_bytes) {
    return qw_error(ctx, TP_ERR_ARG, "%s: %s [%lld, %lld] needs out_bytes = %llu, got %llu", fn, f->name,
                    (long long)n, (long long)k, (unsigned long long)((uint64_t)n * (uint64_t)row_bytes),
                    (unsigned long long)out_bytes);
  }
  if (convrot) {
    if (tp_log4(group) == 0 || (k > 0 && k % group != 0)) {
      return qw_error(ctx, TP_ERR_ARG, "%s: %s group %d is not a power of 4 (>= 4) dividing k = %lld", fn, f->name,
                      (int)group, (long long)k);
    }
    if (n_scales != n) {
      return qw_error(ctx, TP_ERR_ARG, "%s: %s needs n = %lld row scales, got n_scales = %lld", fn, f->name,
                      (long long)n, (long long)n_scales);
    }
  } else {
    if (group != 0) return qw_error(ctx, TP_ERR_ARG, "%s: group = %d given for %s (ConvRot only)", fn, (int)group, f->name);
    const int64_t want = fp8 ? 1 : 0;
    if (n_scales != want) {
      return qw_error(ctx, TP_ERR_ARG, "%s: %s takes %lld scale(s), got n_scales = %lld", fn, f->name,
                      (long long)want, (long long)n_scales);
    }
  }
  if ((count > 0 && (src == NULL || out == NULL)) || (n_scales > 0 && scales == NULL)) {
    return qw_error(ctx, TP_ERR_ARG, "%s: a NULL pointer (src, out or scales) for a non-empty tensor", fn);
  }
  /* Outputs must not overlap the source (or each other). */
  {
    const uintptr_t s0 = (uintptr_t)src, s1 = s0 + (uintptr_t)src_bytes;
    const uintptr_t o0 = (uintptr_t)out, o1 = o0 + (uintptr_t)out_bytes;
    const uintptr_t c0 = (uintptr_t)scales, c1 = c0 + (uintptr_t)n_scales * sizeof(float);
    if ((src_bytes && out_bytes && o0 < s1 && s0 < o1) || (src_bytes && n_scales && c0 < s1 && s0 < c1) ||
        (out_bytes && n_scales && c0 < o1 && o0 < c1)) {
      return qw_error(ctx, TP_ERR_ARG, "%s: src, out and scales must not overlap", fn);
    }
  }

  qw_job job;
  memset(&job, 0, sizeof job);
  job.format = format;
  job.dtype = src_dtype;
  job.group = group;
  job.n = n;
  job.k = k;
  job.src = src;
  job.src_elem = elem;
  job.out = out;
  job.scales = scales;
  if (fp8 && count == 0) {
    scales[0] = 1.0f;
    return TP_OK;
  }
  if (count == 0) return TP_OK;

  if (convrot) {
    job.convrot_row = qw_pick_convrot(ctx);
    qw_run(ctx, qw_tasks(ctx, n, k), qw_convrot_task, &job);
    if (job.oom) return qw_error(ctx, TP_ERR_OOM, "%s: no memory for %lld-element row scratch", fn, (long long)k);
    return TP_OK;
  }
  if (ggml) {
    job.block_elems = f->block;
    job.block_bytes = f->block_bytes;
    job.blocks = (int64_t)(count / (uint64_t)f->block);
    qw_run(ctx, qw_tasks(ctx, job.blocks, f->block), qw_ggml_task, &job);
    return TP_OK;
  }

  /* fp8 scaled: max |w| over the tensor, then the codes (fp8.ts quantizeFp8Scaled). */
  job.count = (int64_t)count;
  const int64_t chunks = (job.count + QW_FP8_CHUNK - 1) / QW_FP8_CHUNK;
  job.chunk_amax = malloc((size_t)chunks * sizeof(float));
  job.chunk_nan = malloc((size_t)chunks);
  if (job.chunk_amax == NULL || job.chunk_nan == NULL) {
    free(job.chunk_amax);
    free(job.chunk_nan);
    return qw_error(ctx, TP_ERR_OOM, "%s: no memory for %lld fp8 chunk maxima", fn, (long long)chunks);
  }
  qw_run(ctx, qw_tasks(ctx, chunks, QW_FP8_CHUNK), qw_fp8_amax_task, &job);
  float amax = 0.0f;
  int nan = 0;
  for (int64_t c = 0; c < chunks; c++) {
    amax = job.chunk_amax[c] > amax ? job.chunk_amax[c] : amax;
    nan |= job.chunk_nan[c];
  }
  free(job.chunk_amax);
  free(job.chunk_nan);
  if (nan) {
    return qw_error(ctx, TP_ERR_ARG, "%s: fp8 scale NaN is too small to invert in f32 (max |w| = NaN: the tensor holds NaN)",
                    fn);
  }
  if (isinf(amax)) {
    return qw_error(ctx, TP_ERR_ARG, "%s: the tensor holds ±inf; an fp8 scale cannot be computed", fn);
  }
  if (amax == 0.0f) {
    memset(out, 0, (size_t)count);
    scales[0] = 1.0f;
    return TP_OK;
  }
  const float scale = amax / 448.0f;
  const float inv = 1.0f / scale;
  if (!isfinite(inv)) {
    return qw_error(ctx, TP_ERR_ARG, "%s: fp8 scale %g is too small to invert in f32 (max |w| = %g)", fn,
                    (double)scale, (double)amax);
  }
  job.inv = inv;
  qw_run(ctx, qw_tasks(ctx, (job.count + 1023) / 1024, 1024), qw_fp8_code_task, &job);
  scales[0] = scale;
  return TP_OK;
}
