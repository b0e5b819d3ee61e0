/*
 * f16 <-> f32 and bf16 <-> f32 with AVX-512 F + BW + VL and F16C (compiled with -mavx512f
 * -mavx512bw -mavx512vl -mf16c; cpu.c calls these only when the ctx's ISA level is
 * TP_ISA_AVX512). 16 elements per step; the tail is one masked step (masked loads never touch
 * memory outside [src, src + n)). Results equal cast_scalar.c bit for bit, NaNs included; see
 * cast_avx2.c for why the F16C conversions need no NaN fix-up and why VCVTNEPS2BF16 is not used.
 */
#include <immintrin.h>
#include <stdint.h>

#include "internal.h"

/* The first k of 16 lanes, k in [0, 16]. */
static __mmask16 first_lanes(size_t k) { return (__mmask16)((1u << k) - 1u); }

void tp_cast_f16_to_f32_avx512(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint16_t *s = src;
  float *d = dst;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)(s + i)); /* 16 x f16 */
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, s + i);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(h));
  }
}

void tp_cast_f32_to_f16_avx512(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const float *s = src;
  uint16_t *d = dst;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(s + i);
    _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, s + i);
    _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

void tp_cast_bf16_to_f32_avx512(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint16_t *s = src;
  uint32_t *d = dst;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(h, 16)); /* bits << 16 */
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
    _mm512_mask_storeu_epi32(d + i, m, _mm512_slli_epi32(h, 16));
  }
}

/* 16 x f32 bits -> 16 x bf16 in the low half of each 32-bit lane (see cast_scalar.c f32_to_bf16). */
static __m512i round_bf16(__m512i u) {
  const __m512i upper = _mm512_srli_epi32(u, 16);
  const __m512i odd = _mm512_and_si512(upper, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  /* NaN: |u| > 0x7F800000 (a signed compare is right: |u| <= 0x7FFFFFFF) */
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_or_epi32(rounded, nan, upper, _mm512_set1_epi32(0x0040));
}

void tp_cast_f32_to_bf16_avx512(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint32_t *s = src;
  uint16_t *d = dst;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i r = round_bf16(_mm512_loadu_si512(s + i));
    _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(r)); /* VPMOVDW: exact, r <= 0xFFFF */
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    const __m512i r = round_bf16(_mm512_maskz_loadu_epi32(m, s + i));
    _mm512_mask_cvtepi32_storeu_epi16(d + i, m, r);
  }
}
