/*
 * matmul kernels for AVX2 + FMA + F16C: f32 / f16 / bf16 / fp8 weights (FMA on f32 lanes) and
 * ConvRot int8 / int4 (maddubs), for every m: weight rows are streamed once per group of up to 4
 * activation rows, 2 weight rows at a time (8 ymm accumulators: AVX2 has 16 registers), with
 * 8-lane partial sums reduced at the end of each row.
 *
 * bf16 and fp8 products use bf16 activations widened to f32 (exact products, f32 sums), as the
 * scalar and AVX-512 kernels do. ConvRot sums are exact int32: int8 by the sign trick — |q_w| (≤ 128,
 * unsigned) against q_x · sign(q_w) (|q_x| ≤ 127), so maddubs' int16 pair sums stay ≤ 32512 and never
 * saturate; int4 as unsigned q_w + 8 (0..15) against the activations rearranged per 64 elements into
 * [evens, odds] (the low nibbles hold the even elements), minus 8 Σ q_x. The rescale is
 * tp_convrot_out, so the result equals @tp/quant convRotLinear bit for bit.
 */
#include <immintrin.h>

#include "matmul.h"

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline int32_t hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/* 8 weights from element t of a row, widened exactly to f32 (count < 8: the rest zero). */
static inline __m256 load_w8(int32_t fmt, const uint8_t *row, int64_t t, int count) {
  if (count < 8) {
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int e = 0; e < count; e++) {
      const int64_t i = t + e;
      switch (fmt) {
        case TP_W_F32: tmp[e] = tp_rdf32(row + 4 * i); break;
        case TP_W_F16: tmp[e] = tp_f16p(row + 2 * i); break;
        case TP_W_BF16: tmp[e] = tp_bits_f32((uint32_t)tp_rd16(row + 2 * i) << 16); break;
        case TP_W_F8_E4M3FN: tmp[e] = tp_e4m3_f32(row[i]); break;
        default: tmp[e] = tp_e5m2_f32(row[i]);
      }
    }
    return _mm256_loadu_ps(tmp);
  }
  switch (fmt) {
    case TP_W_F32: return _mm256_loadu_ps((const float *)(row + 4 * t));
    case TP_W_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * t)));
    case TP_W_BF16:
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * t))), 16));
    case TP_W_F8_E4M3FN: {
      const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + t)));
      const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
      /* exponent and mantissa into f32 position, × 2^120 rebiases (and normalizes subnormals) */
      __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), _mm256_set1_ps(0x1p120f));
      v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                           _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F))));
      return _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24)));
    }
    default: { /* e5m2: the upper byte of a binary16 */
      const __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + t))), 8);
      return _mm256_cvtph_ps(h);
    }
  }
}

/* 8 activations from element t: f32 as is, or bf16 widened (count < 8: the rest zero). */
static inline __m256 load_x8(const tp_mm *mm, int64_t i, int64_t t, int count) {
  if (mm->act == TP_ACT_BF16) {
    const uint16_t *xb = (const uint16_t *)(mm->xq + (size_t)i * mm->xq_row) + t;
    if (count < 8) {
      float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int e = 0; e < count; e++) tmp[e] = tp_bits_f32((uint32_t)xb[e] << 16);
      return _mm256_loadu_ps(tmp);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)xb)), 16));
  }
  const float *x = mm->x + (size_t)i * (size_t)mm->k + t;
  if (count < 8) {
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int e = 0; e < count; e++) tmp[e] = x[e];
    return _mm256_loadu_ps(tmp);
  }
  return _mm256_loadu_ps(x);
}

void tp_mm_float_avx2(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  (void)scratch;
  const int64_t k = mm->k;
  for (int64_t j0 = n0; j0 < n1; j0 += 2) {
    const int c = n1 - j0 < 2 ? 1 : 2;
    const uint8_t *w0 = mm->w + (size_t)j0 * mm->w_row, *w1 = mm->w + (size_t)(j0 + c - 1) * mm->w_row;
    for (int64_t i0 = 0; i0 < mm->m; i0 += 4) {
      const int r = mm->m - i0 < 4 ? (int)(mm->m - i0) : 4;
      __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
      for (int64_t t = 0; t < k; t += 8) {
        const int cnt = k - t < 8 ? (int)(k - t) : 8;
        const __m256 v0 = load_w8(mm->fmt, w0, t, cnt), v1 = load_w8(mm->fmt, w1, t, cnt);
#define ROW(rr, A0, A1)                                     \
  if (r > rr) {                                             \
    const __m256 xv = load_x8(mm, i0 + rr, t, cnt);         \
    A0 = _mm256_fmadd_ps(xv, v0, A0);                       \
    A1 = _mm256_fmadd_ps(xv, v1, A1);                       \
  }
        ROW(0, a00, a01) ROW(1, a10, a11) ROW(2, a20, a21) ROW(3, a30, a31)
#undef ROW
      }
      const __m256 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
      for (int rr = 0; rr < r; rr++) {
        for (int cc = 0; cc < c; cc++) {
          float s = hsum8(acc[rr][cc]);
          if (mm->has_scale) s = s * mm->scale;
          if (mm->bias) s = s + mm->bias[j0 + cc];
          mm->y[(size_t)(i0 + rr) * (size_t)mm->n + (size_t)(j0 + cc)] = s;
        }
      }
    }
  }
}

void tp_mm_convrot_avx2(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  (void)scratch;
  const int64_t k = mm->k;
  const int int8 = mm->fmt == TP_W_INT8_CONVROT;
  const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F);
  for (int64_t j0 = n0; j0 < n1; j0 += 2) {
    const int c = n1 - j0 < 2 ? 1 : 2;
    const uint8_t *w0 = mm->w + (size_t)j0 * mm->w_row, *w1 = mm->w + (size_t)(j0 + c - 1) * mm->w_row;
    for (int64_t i0 = 0; i0 < mm->m; i0 += 4) {
      const int r = mm->m - i0 < 4 ? (int)(mm->m - i0) : 4;
      __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
      int32_t tail[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
      if (int8) {
        int64_t t = 0;
        for (; t + 32 <= k; t += 32) {
          const __m256i q0 = _mm256_loadu_si256((const __m256i *)(w0 + t));
          const __m256i q1 = _mm256_loadu_si256((const __m256i *)(w1 + t));
          const __m256i u0 = _mm256_sign_epi8(q0, q0), u1 = _mm256_sign_epi8(q1, q1); /* |q|; −128 → 128 */
#define ROW8(rr, A0, A1)                                                                              \
  if (r > rr) {                                                                                       \
    const __m256i xv = _mm256_loadu_si256((const __m256i *)(mm->xq + (size_t)(i0 + rr) * mm->xq_row + t)); \
    A0 = _mm256_add_epi32(A0, _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(xv, q0)), ones)); \
    A1 = _mm256_add_epi32(A1, _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(xv, q1)), ones)); \
  }
          ROW8(0, a00, a01) ROW8(1, a10, a11) ROW8(2, a20, a21) ROW8(3, a30, a31)
#undef ROW8
        }
        for (; t < k; t++) {
          for (int rr = 0; rr < r; rr++) {
            const int32_t xv = (int8_t)mm->xq[(size_t)(i0 + rr) * mm->xq_row + (size_t)t];
            tail[rr][0] += (int8_t)w0[t] * xv;
            tail[rr][1] += (int8_t)w1[t] * xv;
          }
        }
      } else {
        /* 32 bytes = 64 codes: low nibbles are elements 2e, high nibbles 2e + 1 */
        const int64_t kb = k / 2;
        int64_t t = 0;
        for (; t + 32 <= kb; t += 32) {
          const __m256i b0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w0 + t)), _mm256_set1_epi8((char)0x88));
          const __m256i b1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w1 + t)), _mm256_set1_epi8((char)0x88));
          const __m256i l0 = _mm256_and_si256(b0, lo4), h0 = _mm256_and_si256(_mm256_srli_epi16(b0, 4), lo4);
          const __m256i l1 = _mm256_and_si256(b1, lo4), h1 = _mm256_and_si256(_mm256_srli_epi16(b1, 4), lo4);
          for (int rr = 0; rr < r; rr++) {
            /* deinterleave 64 activation codes into evens / odds */
            const int8_t *x = (const int8_t *)(mm->xq + (size_t)(i0 + rr) * mm->xq_row) + 2 * t;
            const __m256i xa = _mm256_loadu_si256((const __m256i *)x), xb = _mm256_loadu_si256((const __m256i *)(x + 32));
            const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                                12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
            /* per 128-bit lane: [8 evens, 8 odds]; gather the evens of all four lanes, then the odds */
            const __m256i pa = _mm256_shuffle_epi8(xa, sh), pb = _mm256_shuffle_epi8(xb, sh);
            const __m256i ev = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(pa, pb), 0xD8);
            const __m256i od = _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(pa, pb), 0xD8);
            const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(l0, ev), ones),
                                                _mm256_madd_epi16(_mm256_maddubs_epi16(h0, od), ones));
            const __m256i s1 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(l1, ev), ones),
                                                _mm256_madd_epi16(_mm256_maddubs_epi16(h1, od), ones));
            switch (rr) {
              case 0: a00 = _mm256_add_epi32(a00, s0); a01 = _mm256_add_epi32(a01, s1); break;
              case 1: a10 = _mm256_add_epi32(a10, s0); a11 = _mm256_add_epi32(a11, s1); break;
              case 2: a20 = _mm256_add_epi32(a20, s0); a21 = _mm256_add_epi32(a21, s1); break;
              default: a30 = _mm256_add_epi32(a30, s0); a31 = _mm256_add_epi32(a31, s1);
            }
          }
        }
        for (; t < kb; t++) {
          for (int rr = 0; rr < r; rr++) {
            const int8_t *x = (const int8_t *)(mm->xq + (size_t)(i0 + rr) * mm->xq_row);
            for (int cc = 0; cc < 2; cc++) {
              const uint8_t b = (cc ? w1 : w0)[t];
              tail[rr][cc] += (((b & 15) ^ 8) - 8) * x[2 * t] + (((b >> 4) ^ 8) - 8) * x[2 * t + 1];
            }
          }
        }
        /* the vector part summed (q + 8) · x over the whole 32-byte chunks: remove 8 Σ x there */
        for (int rr = 0; rr < r; rr++) {
          const int8_t *x = (const int8_t *)(mm->xq + (size_t)(i0 + rr) * mm->xq_row);
          int32_t sx = 0;
          for (int64_t e = 0; e < 2 * (kb / 32 * 32); e++) sx += x[e];
          tail[rr][0] -= 8 * sx;
          tail[rr][1] -= 8 * sx;
        }
      }
      const __m256i acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
      for (int rr = 0; rr < r; rr++) {
        const int64_t i = i0 + rr;
        for (int cc = 0; cc < c; cc++) {
          const int32_t s = hsum8i(acc[rr][cc]) + tail[rr][cc];
          mm->y[(size_t)i * (size_t)mm->n + (size_t)(j0 + cc)] =
              tp_convrot_out(int8, s, mm->xs[i], mm->w_scale[j0 + cc], mm->bias, j0 + cc);
        }
      }
    }
  }
}
