/*
 * Attention micro-kernels (ops.h, tp_attn_kernels) with AVX2 + FMA: register tiles of 4 rows × 16
 * columns (8 accumulators of 8 lanes, leaving room in the 16 YMM registers for the loads and the
 * broadcast), swept over the 64 columns of a key block or the padded value columns. See attention.c
 * for the layouts and padding that make every tile full.
 */
#include <immintrin.h>

#include "ops.h"

static void scores(const float *q, const float *kt, float *s, size_t rows, size_t d) {
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    const float *q0 = q + r0 * d;
    for (size_t c0 = 0; c0 < TP_ATTN_BK; c0 += 16) {
      __m256 acc[4][2];
      for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (size_t t = 0; t < d; t++) {
        const float *kr = kt + t * TP_ATTN_BK + c0;
        const __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8);
        for (int r = 0; r < 4; r++) {
          const __m256 qb = _mm256_broadcast_ss(q0 + (size_t)r * d + t);
          acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
        }
      }
      for (int r = 0; r < 4; r++) {
        _mm256_storeu_ps(s + (r0 + (size_t)r) * TP_ATTN_BK + c0, acc[r][0]);
        _mm256_storeu_ps(s + (r0 + (size_t)r) * TP_ATTN_BK + c0 + 8, acc[r][1]);
      }
    }
  }
}

/* One key per step: 8-lane partial dots for up to 4 rows (whole vectors, then a scalar tail), summed at the end. */
static void scores_rows(const float *q, const float *k, size_t ks, float *s, size_t rows, size_t nk, size_t d) {
  const size_t d8 = d & ~(size_t)7;
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    const size_t nr = rows - r0 < 4 ? rows - r0 : 4;
    const float *q0 = q + r0 * d;
    for (size_t c = 0; c < nk; c++) {
      const float *kr = k + c * ks;
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (size_t t = 0; t < d8; t += 8) {
        const __m256 kv = _mm256_loadu_ps(kr + t);
        for (size_t r = 0; r < nr; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + r * d + t), kv, acc[r]);
      }
      for (size_t r = 0; r < nr; r++) {
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
        const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
        float v = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
        for (size_t t = d8; t < d; t++) v += q0[r * d + t] * kr[t];
        s[(r0 + r) * TP_ATTN_BK + c] = v;
      }
    }
  }
}

static void pv(const float *p, const float *v, size_t vs, float *o, size_t rows, size_t nk, size_t dvp) {
  for (size_t r0 = 0; r0 < rows; r0 += 4) {
    for (size_t c0 = 0; c0 < dvp; c0 += 16) {
      __m256 acc[4][2];
      for (int r = 0; r < 4; r++) {
        acc[r][0] = _mm256_loadu_ps(o + (r0 + (size_t)r) * dvp + c0);
        acc[r][1] = _mm256_loadu_ps(o + (r0 + (size_t)r) * dvp + c0 + 8);
      }
      for (size_t j = 0; j < nk; j++) {
        const float *vr = v + j * vs + c0;
        const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
        for (int r = 0; r < 4; r++) {
          const __m256 pb = _mm256_broadcast_ss(p + (r0 + (size_t)r) * TP_ATTN_BK + j);
          acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
        }
      }
      for (int r = 0; r < 4; r++) {
        _mm256_storeu_ps(o + (r0 + (size_t)r) * dvp + c0, acc[r][0]);
        _mm256_storeu_ps(o + (r0 + (size_t)r) * dvp + c0 + 8, acc[r][1]);
      }
    }
  }
}

const tp_attn_kernels tp_attn_avx2 = {.scores = scores, .scores_rows = scores_rows, .pv = pv};
