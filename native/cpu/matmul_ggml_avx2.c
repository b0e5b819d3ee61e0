/*
 * GGUF block dot products with AVX2: the shared body (matmul_ggml_body.h) with a u8 × s8 dot built
 * from maddubs (pairs to int16; no saturation for |u| ≤ 128, |s| ≤ 127) and madd (pairs to int32).
 */
#include <immintrin.h>

#include "matmul.h"

static inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#define GGML_FN tp_mm_ggml_avx2
#include "matmul_ggml_body.h"
