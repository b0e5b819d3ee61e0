/*
 * Row dequantization with AVX-512 for the common formats, bit-exact with dequant_scalar.c (the same
 * f32 operations per element: the products and differences are single IEEE operations, so 16 lanes
 * round exactly as the scalar code does). Q2_K, Q3_K, IQ4_NL, IQ4_XS and ConvRot rows use the scalar code.
 */
#include <immintrin.h>

#include "matmul.h"

/* Elements 16h .. 16h + 15 of a 32-element block's nibbles (low nibbles first) as int32. */
static inline __m512i nibi16(const uint8_t *qs, int high) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
  return high ? _mm512_srli_epi32(b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(15));
}
static inline __m512 nib16(const uint8_t *qs, int high) { return _mm512_cvtepi32_ps(nibi16(qs, high)); }

/* (qh >> (e0 + lane)) & 1, × 16, as int32 lanes. */
static inline __m512i qh16(uint32_t qh, int e0) {
  const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                       _mm512_set1_epi32(e0));
  return _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int32_t)qh), idx), _mm512_set1_epi32(1)), 4);
}

static void row32(int32_t fmt, const uint8_t *b, float *o) {
  const __m512 d = _mm512_set1_ps(tp_f16p(b));
  switch (fmt) {
    case TP_W_Q8_0:
      for (int h = 0; h < 2; h++) {
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + 16 * h))));
        _mm512_storeu_ps(o + 16 * h, _mm512_mul_ps(q, d));
      }
      break;
    case TP_W_Q4_0:
      for (int h = 0; h < 2; h++)
        _mm512_storeu_ps(o + 16 * h, _mm512_mul_ps(_mm512_sub_ps(nib16(b + 2, h), _mm512_set1_ps(8)), d));
      break;
    case TP_W_Q4_1: {
      const __m512 m = _mm512_set1_ps(tp_f16p(b + 2));
      for (int h = 0; h < 2; h++) _mm512_storeu_ps(o + 16 * h, _mm512_add_ps(_mm512_mul_ps(nib16(b + 4, h), d), m));
      break;
    }
    case TP_W_Q5_0: {
      const uint32_t qh = tp_rd32(b + 2);
      for (int h = 0; h < 2; h++) {
        const __m512i n = _mm512_add_epi32(nibi16(b + 6, h), qh16(qh, 16 * h));
        _mm512_storeu_ps(o + 16 * h, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(n, _mm512_set1_epi32(16))), d));
      }
      break;
    }
    default: { /* Q5_1 */
      const __m512 m = _mm512_set1_ps(tp_f16p(b + 2));
      const uint32_t qh = tp_rd32(b + 4);
      for (int h = 0; h < 2; h++) {
        const __m512i n = _mm512_add_epi32(nibi16(b + 8, h), qh16(qh, 16 * h));
        _mm512_storeu_ps(o + 16 * h, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(n), d), m));
      }
    }
  }
}

static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Q4_K / Q5_K: f32(f32(d·sc) · n) − f32(dmin·mn) per sub-block of 32. */
static void row_k45(int five, const uint8_t *b, float *o) {
  const float d = tp_f16p(b), dmin = tp_f16p(b + 2);
  const uint8_t *qs = b + (five ? 48 : 16);
  for (int sb = 0; sb < 8; sb++) {
    int sc, mn;
    scale_min_k4(b + 4, sb, &sc, &mn);
    const __m512 dsc = _mm512_set1_ps(d * (float)sc), dm = _mm512_set1_ps(dmin * (float)mn);
    const uint8_t *q = qs + 32 * (sb >> 1);
    for (int h = 0; h < 2; h++) {
      __m512i n = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * h)));
      n = (sb & 1) ? _mm512_srli_epi32(n, 4) : _mm512_and_si512(n, _mm512_set1_epi32(15));
      if (five) {
        const __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 16 + 16 * h)));
        n = _mm512_add_epi32(n, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, sb), _mm512_set1_epi32(1)), 4));
      }
      _mm512_storeu_ps(o + 32 * sb + 16 * h, _mm512_sub_ps(_mm512_mul_ps(dsc, _mm512_cvtepi32_ps(n)), dm));
    }
  }
}

/* Q6_K: f32(f32(d·scale) · (q − 32)) per group of 16. */
static void row_q6k(const uint8_t *b, float *o) {
  const float d = tp_f16p(b + 208);
  for (int e0 = 0; e0 < 256; e0 += 16) {
    const int half = e0 >> 7, j = (e0 & 127) >> 5, l0 = e0 & 31;
    const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 64 * half + l0 + 32 * (j & 1))));
    const __m512i lo4 = j < 2 ? _mm512_and_si512(lo, _mm512_set1_epi32(15)) : _mm512_srli_epi32(lo, 4);
    const __m512i qh = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 128 + 32 * half + l0)));
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(qh, 2 * j), _mm512_set1_epi32(3));
    const __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
    const __m512 ds = _mm512_set1_ps(d * (float)(int8_t)b[192 + (e0 >> 4)]);
    _mm512_storeu_ps(o + e0, _mm512_mul_ps(ds, _mm512_cvtepi32_ps(q)));
  }
}

void tp_dequant_rows_avx512(int32_t fmt, const uint8_t *w, size_t w_row, int64_t rows, int64_t k,
                            const float *scale, int32_t group, const int64_t *row_ids, float *out, int32_t *tmp) {
  switch (fmt) {
    case TP_W_Q2_K:
    case TP_W_Q3_K:
    case TP_W_IQ4_NL:
    case TP_W_IQ4_XS:
    case TP_W_INT8_CONVROT:
    case TP_W_INT4_CONVROT:
    case TP_W_F32:
      tp_dequant_rows_scalar(fmt, w, w_row, rows, k, scale, group, row_ids, out, tmp);
      return;
    default: break;
  }
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *src = w + (size_t)(row_ids ? row_ids[r] : r) * w_row;
    float *o = out + (size_t)r * (size_t)k;
    switch (fmt) {
      case TP_W_F16:
      case TP_W_BF16:
      case TP_W_F8_E4M3FN:
      case TP_W_F8_E5M2: {
        int64_t i = 0;
        for (; i + 16 <= k; i += 16) {
          __m512 v;
          if (fmt == TP_W_F16) v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 2 * i)));
          else if (fmt == TP_W_BF16)
            v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 2 * i))), 16));
          else if (fmt == TP_W_F8_E5M2)
            v = _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(src + i))), 8));
          else {
            const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
            const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
            v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)), _mm512_set1_ps(0x1p120f));
            v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)),
                                   _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
            v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24)));
          }
          if (scale) v = _mm512_mul_ps(v, _mm512_set1_ps(scale[0]));
          _mm512_storeu_ps(o + i, v);
        }
        if (i < k) {
          const int64_t one = row_ids ? row_ids[r] : r;
          float tail[16];
          /* the remaining < 16 elements of this row through the scalar code */
          tp_dequant_rows_scalar(fmt, w + (size_t)one * w_row + (size_t)i * (size_t)tp_wformats[fmt].block_bytes, 0, 1,
                                 k - i, scale, group, NULL, tail, tmp);
          memcpy(o + i, tail, (size_t)(k - i) * sizeof(float));
        }
        break;
      }
      case TP_W_Q4_K:
      case TP_W_Q5_K:
        for (int64_t bl = 0; bl < k / 256; bl++) row_k45(fmt == TP_W_Q5_K, src + (size_t)bl * (size_t)tp_wformats[fmt].block_bytes, o + 256 * bl);
        break;
      case TP_W_Q6_K:
        for (int64_t bl = 0; bl < k / 256; bl++) row_q6k(src + (size_t)bl * 210, o + 256 * bl);
        break;
      default: /* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 */
        for (int64_t bl = 0; bl < k / 32; bl++) row32(fmt, src + (size_t)bl * (size_t)tp_wformats[fmt].block_bytes, o + 32 * bl);
    }
  }
}
