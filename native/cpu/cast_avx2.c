/*
 * f16 <-> f32 and bf16 <-> f32 with AVX2 + F16C (compiled with -mavx2 -mfma -mf16c; cpu.c calls
 * these only when the ctx's ISA level is TP_ISA_AVX2 or higher). Results equal cast_scalar.c bit
 * for bit, NaNs included (packages/backend-cpu/src/native.test.ts checks every f16 pattern):
 *   - VCVTPH2PS converts f16 exactly (subnormals too) and turns a NaN into payload << 13 with the
 *     quiet bit set, which is tp.h's rule, so no fix-up is needed.
 *   - VCVTPS2PH with immediate 0 (_MM_FROUND_TO_NEAREST_INT) rounds to nearest even regardless of
 *     MXCSR.RC, and returns sign | 0x7E00 | mantissa >> 13 for a NaN: also tp.h's rule.
 *   - bf16 rounding is done on the integer bits, (u + 0x7FFF + ((u >> 16) & 1)) >> 16, with NaNs
 *     blended to (u >> 16) | 0x0040. VCVTNEPS2BF16 is not used: it flushes subnormals to zero.
 * Tails (n % 8 or n % 16 elements) go to the scalar kernels.
 */
#include <immintrin.h>
#include <stdint.h>

#include "internal.h"

void tp_cast_f16_to_f32_avx2(const void *src, void *dst, size_t n, uint32_t flags) {
  const uint16_t *s = src;
  float *d = dst;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(s + i)); /* 8 x f16 */
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  tp_cast_f16_to_f32_scalar(s + i, d + i, n - i, flags);
}

void tp_cast_f32_to_f16_avx2(const void *src, void *dst, size_t n, uint32_t flags) {
  const float *s = src;
  uint16_t *d = dst;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(s + i);
    _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  tp_cast_f32_to_f16_scalar(s + i, d + i, n - i, flags);
}

void tp_cast_bf16_to_f32_avx2(const void *src, void *dst, size_t n, uint32_t flags) {
  const uint16_t *s = src;
  uint32_t *d = dst;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
    _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(h, 16)); /* bits << 16 */
  }
  tp_cast_bf16_to_f32_scalar(s + i, d + i, n - i, flags);
}

/* 8 x f32 bits -> 8 x bf16 in the low half of each 32-bit lane (see cast_scalar.c f32_to_bf16). */
static __m256i round_bf16(__m256i u) {
  const __m256i upper = _mm256_srli_epi32(u, 16);
  const __m256i odd = _mm256_and_si256(upper, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  /* NaN: |u| > 0x7F800000 (a signed compare is right: |u| <= 0x7FFFFFFF) */
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(upper, _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

void tp_cast_f32_to_bf16_avx2(const void *src, void *dst, size_t n, uint32_t flags) {
  const uint32_t *s = src;
  uint16_t *d = dst;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = round_bf16(_mm256_loadu_si256((const __m256i *)(s + i)));
    const __m256i hi = round_bf16(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
    /*
     * Every lane holds a value <= 0xFFFF, so the unsigned-saturating pack is exact. It packs per
     * 128-bit lane, giving [lo0-3 hi0-3 | lo4-7 hi4-7]; the 64-bit permute (0, 2, 1, 3) restores
     * element order.
     */
    const __m256i packed = _mm256_packus_epi32(lo, hi);
    _mm256_storeu_si256((__m256i *)(d + i), _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
  }
  tp_cast_f32_to_bf16_scalar(s + i, d + i, n - i, flags);
}
