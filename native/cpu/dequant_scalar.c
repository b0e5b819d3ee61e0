/*
 * Row dequantization of every weight format to f32: the reference the vector code and the matmul
 * kernels are checked against. Each decoder follows @tp/quant (packages/quant/src/ggml-dequant.ts,
 * convrot.ts, fp8.ts) and ggml's float order of operations (llm.md §2.1–2.3), so the result is the
 * same f32 value bit for bit:
 *   Q4_0 / Q5_0 / Q8_0: f32(q · d);  Q4_1 / Q5_1: f32(f32(n · d) + m);
 *   Q2_K / Q4_K / Q5_K: f32(f32(f32(d · sc) · q) − f32(dmin · mn));  Q3_K / Q6_K: f32(f32(d · s) · q);
 *   IQ4_NL: f32(d · K[n]);  IQ4_XS: f32(f32(d · (ls − 32)) · K[n])  (K = tp_kvalues_iq4nl);
 *   fp8 scaled: f32(f32(fp8) · scale);  ConvRot: f32(t · s) · 2^-m with t the integer butterfly of the codes.
 */
#include "matmul.h"

/* K6(k): the 6-bit scale and min of sub-block j of Q4_K / Q5_K (ggml get_scale_min_k4). */
static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Low nibble for elements 0..15 of a 32-element block, high nibble for 16..31. */
static inline int nib32(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

static void q4_0(const uint8_t *b, float *o) {
  const float d = tp_f16p(b);
  for (int e = 0; e < 32; e++) o[e] = (float)(nib32(b + 2, e) - 8) * d;
}
static void q4_1(const uint8_t *b, float *o) {
  const float d = tp_f16p(b), m = tp_f16p(b + 2);
  for (int e = 0; e < 32; e++) o[e] = (float)nib32(b + 4, e) * d + m;
}
static void q5_0(const uint8_t *b, float *o) {
  const float d = tp_f16p(b);
  const uint32_t qh = tp_rd32(b + 2);
  for (int e = 0; e < 32; e++) o[e] = (float)((nib32(b + 6, e) | (int)(((qh >> e) & 1) << 4)) - 16) * d;
}
static void q5_1(const uint8_t *b, float *o) {
  const float d = tp_f16p(b), m = tp_f16p(b + 2);
  const uint32_t qh = tp_rd32(b + 4);
  for (int e = 0; e < 32; e++) o[e] = (float)(nib32(b + 8, e) | (int)(((qh >> e) & 1) << 4)) * d + m;
}
static void q8_0(const uint8_t *b, float *o) {
  const float d = tp_f16p(b);
  for (int e = 0; e < 32; e++) o[e] = (float)(int8_t)b[2 + e] * d;
}
static void q2_k(const uint8_t *b, float *o) {
  const float d = tp_f16p(b + 80), dmin = tp_f16p(b + 82);
  for (int e = 0; e < 256; e++) {
    const int half = e >> 7, j = (e & 127) >> 5;
    const int q = (b[16 + 32 * half + (e & 31)] >> (2 * j)) & 3;
    const int s = b[e >> 4];
    o[e] = (d * (float)(s & 15)) * (float)q - dmin * (float)(s >> 4);
  }
}
static void q3_k(const uint8_t *b, float *o) {
  const float d = tp_f16p(b + 108);
  for (int e = 0; e < 256; e++) {
    const int half = e >> 7, j = (e & 127) >> 5, l = e & 31;
    const int q = (b[32 + 32 * half + l] >> (2 * j)) & 3;
    const int hb = (b[l] >> (e >> 5)) & 1;
    o[e] = (d * (float)tp_q3k_scale(b + 96, e >> 4)) * (float)(q - (hb ? 0 : 4));
  }
}
static void q4_k(const uint8_t *b, float *o) {
  const float d = tp_f16p(b), dmin = tp_f16p(b + 2);
  for (int e = 0; e < 256; e++) {
    const int c = e >> 6;
    const int byte = b[16 + 32 * c + (e & 31)];
    const int n = (e & 63) < 32 ? byte & 15 : byte >> 4;
    int sc, mn;
    scale_min_k4(b + 4, e >> 5, &sc, &mn);
    o[e] = (d * (float)sc) * (float)n - dmin * (float)mn;
  }
}
static void q5_k(const uint8_t *b, float *o) {
  const float d = tp_f16p(b), dmin = tp_f16p(b + 2);
  for (int e = 0; e < 256; e++) {
    const int c = e >> 6;
    const int byte = b[48 + 32 * c + (e & 31)];
    const int n = ((e & 63) < 32 ? byte & 15 : byte >> 4) + 16 * ((b[16 + (e & 31)] >> (e >> 5)) & 1);
    int sc, mn;
    scale_min_k4(b + 4, e >> 5, &sc, &mn);
    o[e] = (d * (float)sc) * (float)n - dmin * (float)mn;
  }
}
static void q6_k(const uint8_t *b, float *o) {
  const float d = tp_f16p(b + 208);
  for (int e = 0; e < 256; e++) {
    const int half = e >> 7, j = (e & 127) >> 5, l = e & 31;
    const int lo = b[64 * half + l + 32 * (j & 1)];
    const int lo4 = j < 2 ? lo & 15 : lo >> 4;
    const int hi = (b[128 + 32 * half + l] >> (2 * j)) & 3;
    o[e] = (d * (float)(int8_t)b[192 + (e >> 4)]) * (float)((lo4 | (hi << 4)) - 32);
  }
}

static void iq4_nl(const uint8_t *b, float *o) {
  const float d = tp_f16p(b);
  for (int e = 0; e < 32; e++) o[e] = d * (float)tp_kvalues_iq4nl[nib32(b + 2, e)];
}
static void iq4_xs(const uint8_t *b, float *o) {
  const float d = tp_f16p(b);
  for (int ib = 0; ib < 8; ib++) {
    const float dl = d * (float)(tp_iq4xs_scale(b, ib) - 32);
    for (int e = 0; e < 32; e++) o[32 * ib + e] = dl * (float)tp_kvalues_iq4nl[nib32(b + 8 + 16 * ib, e)];
  }
}

typedef void (*block_fn)(const uint8_t *b, float *o);

static block_fn block_decoder(int32_t fmt) {
  switch (fmt) {
    case TP_W_Q4_0: return q4_0;
    case TP_W_Q4_1: return q4_1;
    case TP_W_Q5_0: return q5_0;
    case TP_W_Q5_1: return q5_1;
    case TP_W_Q8_0: return q8_0;
    case TP_W_Q2_K: return q2_k;
    case TP_W_Q3_K: return q3_k;
    case TP_W_Q4_K: return q4_k;
    case TP_W_Q5_K: return q5_k;
    case TP_W_Q6_K: return q6_k;
    case TP_W_IQ4_NL: return iq4_nl;
    case TP_W_IQ4_XS: return iq4_xs;
    default: return NULL;
  }
}

/*
 * One ConvRot row: unpack the codes, rotate them with the unnormalized integer butterfly per group
 * (exact: |t| ≤ 128·g), then f32(t · s) · 2^-m (@tp/quant dequantizeConvRot; krea2.md §1.6–1.8).
 */
static void convrot_row(int32_t fmt, const uint8_t *src, int64_t k, int32_t g, float s, int32_t *t, float *out) {
  if (fmt == TP_W_INT8_CONVROT) {
    for (int64_t i = 0; i < k; i++) t[i] = (int8_t)src[i];
  } else {
    for (int64_t i = 0; i < k / 2; i++) {
      t[2 * i] = (int32_t)((src[i] & 15) ^ 8) - 8; /* sign-extend the nibble */
      t[2 * i + 1] = (int32_t)((src[i] >> 4) ^ 8) - 8;
    }
  }
  for (int64_t off = 0; off < k; off += g) {
    int32_t *q = t + off;
    for (int32_t st = 1; st < g; st *= 4) {
      for (int32_t base = 0; base < g; base += 4 * st) {
        for (int32_t o = 0; o < st; o++) {
          const int32_t p = base + o;
          const int32_t a = q[p], b = q[p + st], c = q[p + 2 * st], d = q[p + 3 * st];
          q[p] = a + b + c - d;
          q[p + st] = a + b - c + d;
          q[p + 2 * st] = a - b + c + d;
          q[p + 3 * st] = -a + b + c + d;
        }
      }
    }
  }
  const float norm = 1.0f / (float)(1 << tp_log4(g)); /* 2^-m, exact */
  for (int64_t i = 0; i < k; i++) out[i] = ((float)t[i] * s) * norm;
}

void tp_dequant_rows_scalar(int32_t fmt, const uint8_t *w, size_t w_row, int64_t rows, int64_t k,
                            const float *scale, int32_t group, const int64_t *row_ids, float *out, int32_t *tmp) {
  const block_fn dec = block_decoder(fmt);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t row = row_ids ? row_ids[r] : r;
    const uint8_t *src = w + (size_t)row * w_row;
    float *o = out + (size_t)r * (size_t)k;
    switch (fmt) {
      case TP_W_F32: memcpy(o, src, (size_t)k * 4); break;
      case TP_W_F16: for (int64_t i = 0; i < k; i++) o[i] = tp_f16p(src + 2 * i); break;
      case TP_W_BF16: for (int64_t i = 0; i < k; i++) o[i] = tp_bits_f32((uint32_t)tp_rd16(src + 2 * i) << 16); break;
      case TP_W_F8_E4M3FN:
      case TP_W_F8_E5M2:
        for (int64_t i = 0; i < k; i++) {
          const float v = fmt == TP_W_F8_E4M3FN ? tp_e4m3_f32(src[i]) : tp_e5m2_f32(src[i]);
          o[i] = scale ? v * scale[0] : v;
        }
        break;
      case TP_W_INT8_CONVROT:
      case TP_W_INT4_CONVROT: convrot_row(fmt, src, k, group, scale[row], tmp, o); break;
      default: {
        const tp_wformat_info *f = &tp_wformats[fmt];
        for (int64_t b = 0; b < k / f->block; b++) dec(src + (size_t)b * (size_t)f->block_bytes, o + b * f->block);
      }
    }
  }
}
