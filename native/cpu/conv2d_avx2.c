/*
 * conv2d GEMM micro-kernel with AVX2 + FMA: a 6 × 16 register tile (12 accumulators of 8 lanes, plus
 * two panel loads and a broadcast: 15 of the 16 YMM registers). See conv2d.c.
 */
#include <immintrin.h>

#include "ops.h"

static void tile6x16(const float *const *a_rows, const float *bp, size_t kc, float *tile) {
  __m256 acc[6][2];
  for (int r = 0; r < 6; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (size_t k = 0; k < kc; k++) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * 16), b1 = _mm256_loadu_ps(bp + k * 16 + 8);
    for (int r = 0; r < 6; r++) {
      const __m256 a = _mm256_broadcast_ss(a_rows[r] + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < 6; r++) {
    _mm256_storeu_ps(tile + r * 16, acc[r][0]);
    _mm256_storeu_ps(tile + r * 16 + 8, acc[r][1]);
  }
}

const tp_conv_kernels tp_conv_avx2 = {.mr = 6, .nr = 16, .tile = tile6x16};
