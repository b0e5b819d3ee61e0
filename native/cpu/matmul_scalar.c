/*
 * Reference dot products of every weight format, one weight row against one prepared activation row,
 * and the family kernels of the scalar ISA level built on them (y[i, j] for i < m, j in [n0, n1)).
 *
 * GGUF: the integer sums of ggml's generic kernels (ggml/src/ggml-cpu/quants.c ggml_vec_dot_*_generic;
 * llm.md §2.6), exact in int32, combined per block in f32:
 *   Q4_0 / Q5_0 / Q8_0 · Q8_0:  Σ_b (d_w·d_a) · Σ q_w·q_a            (q_w signed: n − 8, n − 16, q)
 *   Q4_1 / Q5_1 · Q8_1:         Σ_b (d_w·d_a) · Σ n·q_a + m_w · s_a   (s_a = the f16 sum of the Q8_1 block)
 *   Q2_K / Q4_K / Q5_K · Q8_K:  Σ_B (d_w·d_a) · Σ_sub sc · Σ n·q_a − (dmin_w·d_a) · Σ_sub mn · Σ q_a
 *   Q3_K / Q6_K · Q8_K:         Σ_B (d_w·d_a) · Σ_16 s · Σ q·q_a       (q: −4..3, −32..31)
 *   IQ4_NL · Q8_0:              Σ_b (d_w·d_a) · Σ K[n]·q_a            (ggml_vec_dot_iq4_nl_q8_0)
 *   IQ4_XS · Q8_K:              Σ_B (d_w·d_a) · Σ_32 (ls − 32) · Σ K[n]·q_a   (ggml_vec_dot_iq4_xs_q8_K)
 * ConvRot: the exact int32 Σ q_w·q_x (rescaled by tp_convrot_out). bf16 / fp8: Σ bf16(x)·w in f32
 * (each product exact); f32 / f16: Σ x·w in f32.
 */
#include "matmul.h"

static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

static inline int nib32(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

/* ---- GGUF, 32-element blocks -------------------------------------------------------------- */

/* Signed 32 codes of one weight block (Q4_0, Q5_0, Q8_0) or unsigned (Q4_1, Q5_1), and its d, m. */
static void unpack32(int32_t fmt, const uint8_t *b, int32_t *q, float *d, float *m) {
  *d = tp_f16p(b);
  *m = 0.0f;
  switch (fmt) {
    case TP_W_Q4_0:
      for (int e = 0; e < 32; e++) q[e] = nib32(b + 2, e) - 8;
      break;
    case TP_W_Q4_1:
      *m = tp_f16p(b + 2);
      for (int e = 0; e < 32; e++) q[e] = nib32(b + 4, e);
      break;
    case TP_W_Q5_0: {
      const uint32_t qh = tp_rd32(b + 2);
      for (int e = 0; e < 32; e++) q[e] = (nib32(b + 6, e) | (int)(((qh >> e) & 1) << 4)) - 16;
      break;
    }
    case TP_W_Q5_1: {
      *m = tp_f16p(b + 2);
      const uint32_t qh = tp_rd32(b + 4);
      for (int e = 0; e < 32; e++) q[e] = nib32(b + 8, e) | (int)(((qh >> e) & 1) << 4);
      break;
    }
    case TP_W_IQ4_NL:
      for (int e = 0; e < 32; e++) q[e] = tp_kvalues_iq4nl[nib32(b + 2, e)];
      break;
    default: /* Q8_0 */
      for (int e = 0; e < 32; e++) q[e] = (int8_t)b[2 + e];
  }
}

static float dot32(int32_t fmt, const uint8_t *w, const uint8_t *a, int64_t nb) {
  const size_t wb = (size_t)tp_wformats[fmt].block_bytes;
  const int q81 = fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1;
  const size_t ab = q81 ? 36 : 34;
  float sumf = 0.0f;
  int32_t q[32];
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *wblk = w + (size_t)b * wb, *ablk = a + (size_t)b * ab;
    float d, m;
    unpack32(fmt, wblk, q, &d, &m);
    const int8_t *qa = (const int8_t *)(ablk + ab - 32);
    int32_t sumi = 0;
    for (int e = 0; e < 32; e++) sumi += q[e] * qa[e];
    sumf += (d * tp_f16p(ablk)) * (float)sumi;
    if (q81) sumf += m * tp_f16p(ablk + 2);
  }
  return sumf;
}

/* ---- GGUF k-quants (256-element super-blocks, Q8_K activations) ---------------------------- */

/* Q8_K block: d f32 at 0, qs[256] at 4, bsums[16] i16 at 260. */
static inline int16_t bsum(const uint8_t *a, int g) {
  int16_t s;
  memcpy(&s, a + 260 + 2 * g, 2);
  return s;
}

static float dot_k(int32_t fmt, const uint8_t *w, const uint8_t *a, int64_t nb) {
  const size_t wb = (size_t)tp_wformats[fmt].block_bytes;
  float sumf = 0.0f;
  for (int64_t blk = 0; blk < nb; blk++) {
    const uint8_t *b = w + (size_t)blk * wb, *ab = a + (size_t)blk * 292;
    const float da = tp_rdf32(ab);
    const int8_t *qa = (const int8_t *)(ab + 4);
    int32_t isum = 0, msum = 0; /* Σ scale·Σ q·q_a ; Σ min·Σ q_a */
    float d, dmin = 0.0f;
    switch (fmt) {
      case TP_W_Q2_K: {
        d = tp_f16p(b + 80);
        dmin = tp_f16p(b + 82);
        for (int e16 = 0; e16 < 16; e16++) msum += bsum(ab, e16) * (b[e16] >> 4);
        for (int e = 0; e < 256; e += 16) {
          int32_t s = 0;
          for (int i = e; i < e + 16; i++) {
            const int half = i >> 7, j = (i & 127) >> 5;
            s += ((b[16 + 32 * half + (i & 31)] >> (2 * j)) & 3) * qa[i];
          }
          isum += (b[e >> 4] & 15) * s;
        }
        break;
      }
      case TP_W_Q3_K: {
        d = tp_f16p(b + 108);
        for (int e = 0; e < 256; e += 16) {
          int32_t s = 0;
          for (int i = e; i < e + 16; i++) {
            const int half = i >> 7, j = (i & 127) >> 5, l = i & 31;
            const int q = (b[32 + 32 * half + l] >> (2 * j)) & 3;
            const int hb = (b[l] >> (i >> 5)) & 1;
            s += (q - (hb ? 0 : 4)) * qa[i];
          }
          isum += tp_q3k_scale(b + 96, e >> 4) * s;
        }
        break;
      }
      case TP_W_Q4_K:
      case TP_W_Q5_K: {
        d = tp_f16p(b);
        dmin = tp_f16p(b + 2);
        const int five = fmt == TP_W_Q5_K;
        const uint8_t *qs = b + (five ? 48 : 16);
        for (int sb = 0; sb < 8; sb++) {
          int sc, mn;
          scale_min_k4(b + 4, sb, &sc, &mn);
          int32_t s = 0;
          for (int i = 32 * sb; i < 32 * sb + 32; i++) {
            const int byte = qs[32 * (i >> 6) + (i & 31)];
            int n = (i & 63) < 32 ? byte & 15 : byte >> 4;
            if (five) n += 16 * ((b[16 + (i & 31)] >> (i >> 5)) & 1);
            s += n * qa[i];
          }
          isum += sc * s;
          msum += mn * (bsum(ab, 2 * sb) + bsum(ab, 2 * sb + 1));
        }
        break;
      }
      case TP_W_IQ4_XS: {
        d = tp_f16p(b);
        for (int ib = 0; ib < 8; ib++) {
          int32_t s = 0;
          for (int e = 0; e < 32; e++) s += tp_kvalues_iq4nl[nib32(b + 8 + 16 * ib, e)] * qa[32 * ib + e];
          isum += (tp_iq4xs_scale(b, ib) - 32) * s;
        }
        break;
      }
      default: { /* Q6_K */
        d = tp_f16p(b + 208);
        for (int e = 0; e < 256; e += 16) {
          int32_t s = 0;
          for (int i = e; i < e + 16; i++) {
            const int half = i >> 7, j = (i & 127) >> 5, l = i & 31;
            const int lo = b[64 * half + l + 32 * (j & 1)];
            const int lo4 = j < 2 ? lo & 15 : lo >> 4;
            const int hi = (b[128 + 32 * half + l] >> (2 * j)) & 3;
            s += ((lo4 | (hi << 4)) - 32) * qa[i];
          }
          isum += (int8_t)b[192 + (e >> 4)] * s;
        }
      }
    }
    sumf += (d * da) * (float)isum - (dmin * da) * (float)msum;
  }
  return sumf;
}

void tp_mm_ggml_scalar(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  (void)scratch;
  const tp_wformat_info *f = &tp_wformats[mm->fmt];
  const int64_t nb = mm->k / f->block;
  const int kq = f->block == 256;
  for (int64_t j = n0; j < n1; j++) {
    const uint8_t *w = mm->w + (size_t)j * mm->w_row;
    for (int64_t i = 0; i < mm->m; i++) {
      const uint8_t *a = mm->xq + (size_t)i * mm->xq_row;
      float v = kq ? dot_k(mm->fmt, w, a, nb) : dot32(mm->fmt, w, a, nb);
      if (mm->bias) v = v + mm->bias[j];
      mm->y[(size_t)i * (size_t)mm->n + (size_t)j] = v;
    }
  }
}

/* ---- float formats ------------------------------------------------------------------------ */

void tp_mm_float_scalar(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  (void)scratch;
  const int64_t k = mm->k;
  for (int64_t j = n0; j < n1; j++) {
    const uint8_t *w = mm->w + (size_t)j * mm->w_row;
    for (int64_t i = 0; i < mm->m; i++) {
      float s = 0.0f;
      if (mm->act == TP_ACT_BF16) {
        const uint16_t *xb = (const uint16_t *)(mm->xq + (size_t)i * mm->xq_row);
        for (int64_t t = 0; t < k; t++) {
          float wv;
          if (mm->fmt == TP_W_BF16) wv = tp_bits_f32((uint32_t)tp_rd16(w + 2 * t) << 16);
          else if (mm->fmt == TP_W_F8_E4M3FN) wv = tp_e4m3_f32(w[t]);
          else wv = tp_e5m2_f32(w[t]);
          s += tp_bits_f32((uint32_t)xb[t] << 16) * wv;
        }
      } else {
        const float *x = mm->x + (size_t)i * (size_t)k;
        for (int64_t t = 0; t < k; t++) {
          const float wv = mm->fmt == TP_W_F32 ? tp_rdf32(w + 4 * t) : tp_f16p(w + 2 * t);
          s += x[t] * wv;
        }
      }
      if (mm->has_scale) s = s * mm->scale;
      if (mm->bias) s = s + mm->bias[j];
      mm->y[(size_t)i * (size_t)mm->n + (size_t)j] = s;
    }
  }
}

/* ---- ConvRot ------------------------------------------------------------------------------ */

void tp_mm_convrot_scalar(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  (void)scratch;
  const int64_t k = mm->k;
  const int int8 = mm->fmt == TP_W_INT8_CONVROT;
  for (int64_t j = n0; j < n1; j++) {
    const uint8_t *w = mm->w + (size_t)j * mm->w_row;
    for (int64_t i = 0; i < mm->m; i++) {
      const int8_t *qx = (const int8_t *)(mm->xq + (size_t)i * mm->xq_row);
      int32_t acc = 0;
      if (int8) {
        for (int64_t t = 0; t < k; t++) acc += (int32_t)(int8_t)w[t] * qx[t];
      } else {
        for (int64_t t = 0; t < k / 2; t++) {
          acc += ((int32_t)((w[t] & 15) ^ 8) - 8) * qx[2 * t];
          acc += ((int32_t)((w[t] >> 4) ^ 8) - 8) * qx[2 * t + 1];
        }
      }
      mm->y[(size_t)i * (size_t)mm->n + (size_t)j] =
          tp_convrot_out(int8, acc, mm->xs[i], mm->w_scale[j], mm->bias, j);
    }
  }
}
