/*
 * Attention micro-kernels (ops.h, tp_attn_kernels) with AVX-512 F: register tiles of 4 rows × 64
 * columns (16 accumulators of 16 lanes). `scores` broadcasts one q value per row and multiplies a
 * row of the transposed key block; `pv` broadcasts one probability per row and multiplies a row of
 * the value block. See attention.c for the layouts and padding that make every tile full.
 */
#include <immintrin.h>

#include "ops.h"

static void scores(const float *q, const float *kt, float *s, size_t rows, size_t d) {
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const float *q0 = q + r0 * d;
    for (size_t t = 0; t < d; t++) {
      const float *kr = kt + t * TP_ATTN_BK;
      const __m512 k0 = _mm512_loadu_ps(kr), k1 = _mm512_loadu_ps(kr + 16);
      const __m512 k2 = _mm512_loadu_ps(kr + 32), k3 = _mm512_loadu_ps(kr + 48);
      for (int r = 0; r < 4; r++) {
        const __m512 qb = _mm512_set1_ps(q0[(size_t)r * d + t]);
        acc[r][0] = _mm512_fmadd_ps(qb, k0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(qb, k1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(qb, k2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(qb, k3, acc[r][3]);
      }
    }
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 4; c++) _mm512_storeu_ps(s + (r0 + (size_t)r) * TP_ATTN_BK + 16 * c, acc[r][c]);
  }
}

/* One key per step: 16-lane partial dots for up to 4 rows (the tail of d masked), each summed at the end. */
static void scores_rows(const float *q, const float *k, size_t ks, float *s, size_t rows, size_t nk, size_t d) {
  const size_t d16 = d & ~(size_t)15;
  const __mmask16 tail = (__mmask16)((1u << (d - d16)) - 1u);
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    const size_t nr = rows - r0 < 4 ? rows - r0 : 4;
    const float *q0 = q + r0 * d;
    for (size_t c = 0; c < nk; c++) {
      const float *kr = k + c * ks;
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (size_t t = 0; t < d16; t += 16) {
        const __m512 kv = _mm512_loadu_ps(kr + t);
        for (size_t r = 0; r < nr; r++) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + r * d + t), kv, acc[r]);
      }
      if (tail) {
        const __m512 kv = _mm512_maskz_loadu_ps(tail, kr + d16);
        for (size_t r = 0; r < nr; r++)
          acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q0 + r * d + d16), kv, acc[r]);
      }
      for (size_t r = 0; r < nr; r++) s[(r0 + r) * TP_ATTN_BK + c] = _mm512_reduce_add_ps(acc[r]);
    }
  }
}

static void pv(const float *p, const float *v, size_t vs, float *o, size_t rows, size_t nk, size_t dvp) {
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    for (size_t c0 = 0; c0 < dvp; c0 += 64) {
      __m512 acc[4][4];
      for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_loadu_ps(o + (r0 + (size_t)r) * dvp + c0 + 16 * c);
      for (size_t j = 0; j < nk; j++) {
        const float *vr = v + j * vs + c0;
        const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
        const __m512 v2 = _mm512_loadu_ps(vr + 32), v3 = _mm512_loadu_ps(vr + 48);
        for (int r = 0; r < 4; r++) {
          const __m512 pb = _mm512_set1_ps(p[(r0 + (size_t)r) * TP_ATTN_BK + j]);
          acc[r][0] = _mm512_fmadd_ps(pb, v0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(pb, v1, acc[r][1]);
          acc[r][2] = _mm512_fmadd_ps(pb, v2, acc[r][2]);
          acc[r][3] = _mm512_fmadd_ps(pb, v3, acc[r][3]);
        }
      }
      for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + (r0 + (size_t)r) * dvp + c0 + 16 * c, acc[r][c]);
    }
  }
}

const tp_attn_kernels tp_attn_avx512 = {.scores = scores, .scores_rows = scores_rows, .pv = pv};
