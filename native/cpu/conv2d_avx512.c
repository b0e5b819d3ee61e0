/*
 * conv2d GEMM micro-kernel with AVX-512 F: an 8 × 32 register tile (16 accumulators of 16 lanes;
 * per k: two panel loads, eight broadcasts of the weight, sixteen FMAs). See conv2d.c.
 */
#include <immintrin.h>

#include "ops.h"

static void tile8x32(const float *const *a_rows, const float *bp, size_t kc, float *tile) {
  __m512 acc[8][2];
  for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (size_t k = 0; k < kc; k++) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * 32), b1 = _mm512_loadu_ps(bp + k * 32 + 16);
    for (int r = 0; r < 8; r++) {
      const __m512 a = _mm512_set1_ps(a_rows[r][k]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < 8; r++) {
    _mm512_storeu_ps(tile + r * 32, acc[r][0]);
    _mm512_storeu_ps(tile + r * 32 + 16, acc[r][1]);
  }
}

const tp_conv_kernels tp_conv_avx512 = {.mr = 8, .nr = 32, .tile = tile8x32};
