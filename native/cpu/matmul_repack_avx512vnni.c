/*
 * GEMV and small-batch matmul on repacked Q8_0 / Q4_0 weights (layout: matmul.h, "repacked"), with
 * AVX-512 BW + VNNI. Per group of 16 weight rows and block of 32 columns, one 512-bit load holds 16
 * rows × 4 columns; vpdpbusd multiplies it by 4 activation codes broadcast (the weight codes are the
 * unsigned operand: Q8_0 codes + 128, Q4_0 nibbles 0..15) into 16 int32 lanes, one per row, started at
 * the block's offset term (−128·Σq_a or −8·Σq_a), so each lane ends with ggml's exact int32 block sum.
 * Then y_row += f32(sum) · (d_w · d_a) per block, as the unpacked kernels do. Up to 4 activation rows
 * share each weight load. No horizontal sums: lane r is row r.
 * Source: llm.md §2.6 (the identities); llama.cpp ggml-cpu/repack.cpp (the interleaved idea).
 */
#include <immintrin.h>

#include "matmul.h"

static inline __m512i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

static inline __attribute__((always_inline)) void group_rows(const tp_mm_rp *p, int R, int64_t g, int64_t i0) {
  const int64_t nb = p->k / 32;
  const uint8_t *w = p->w + (size_t)g * (size_t)nb * p->rec;
  const int q8 = p->fmt == TP_W_Q8_0;
  const size_t sc = q8 ? 512 : 256;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  const tp_rp_act *a[4];
  for (int r = 0; r < 4; r++) a[r] = p->act + (size_t)(i0 + (r < R ? r : 0)) * (size_t)nb;
  __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *rec = w + (size_t)b * p->rec;
    _mm_prefetch((const char *)(rec + 8 * p->rec), _MM_HINT_T0);
    _mm_prefetch((const char *)(rec + 8 * p->rec + 64), _MM_HINT_T0);
    __m512i s0 = _mm512_set1_epi32(a[0][b].corr), s1 = _mm512_set1_epi32(a[1][b].corr);
    __m512i s2 = _mm512_set1_epi32(a[2][b].corr), s3 = _mm512_set1_epi32(a[3][b].corr);
#define STEP(u, off)                                                                    \
  {                                                                                     \
    s0 = _mm512_dpbusd_epi32(s0, u, bcast4(a[0][b].q + (off)));                          \
    if (R > 1) s1 = _mm512_dpbusd_epi32(s1, u, bcast4(a[1][b].q + (off)));               \
    if (R > 2) s2 = _mm512_dpbusd_epi32(s2, u, bcast4(a[2][b].q + (off)));               \
    if (R > 3) s3 = _mm512_dpbusd_epi32(s3, u, bcast4(a[3][b].q + (off)));               \
  }
    if (q8) {
      for (int s = 0; s < 8; s++) {
        const __m512i u = _mm512_loadu_si512(rec + 64 * s);
        STEP(u, 4 * s)
      }
    } else {
      for (int j = 0; j < 4; j++) {
        const __m512i z = _mm512_loadu_si512(rec + 64 * j);
        const __m512i lo = _mm512_and_si512(z, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), lo4);
        STEP(lo, 4 * j)
        STEP(hi, 16 + 4 * j)
      }
    }
#undef STEP
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + sc)));
    y0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw, _mm512_set1_ps(a[0][b].d)), y0);
    if (R > 1) y1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw, _mm512_set1_ps(a[1][b].d)), y1);
    if (R > 2) y2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2), _mm512_mul_ps(dw, _mm512_set1_ps(a[2][b].d)), y2);
    if (R > 3) y3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s3), _mm512_mul_ps(dw, _mm512_set1_ps(a[3][b].d)), y3);
  }
  const int64_t j0 = g * TP_RP_ROWS, left = p->n - j0;
  const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
  const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(mask, p->bias + j0) : _mm512_setzero_ps();
  const __m512 ys[4] = {y0, y1, y2, y3};
  for (int r = 0; r < R; r++) {
    __m512 v = ys[r];
    if (p->bias) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(p->y + (size_t)(i0 + r) * (size_t)p->n + (size_t)j0, mask, v);
  }
}

#define GROUP_R(R) \
  static void group_rows_##R(const tp_mm_rp *p, int64_t g, int64_t i0) { group_rows(p, R, g, i0); }
GROUP_R(1)
GROUP_R(2)
GROUP_R(3)
GROUP_R(4)
#undef GROUP_R

void tp_mm_repacked_avx512vnni(const tp_mm_rp *p, int64_t g0, int64_t g1) {
  static void (*const fns[4])(const tp_mm_rp *, int64_t, int64_t) = {group_rows_1, group_rows_2, group_rows_3,
                                                                     group_rows_4};
  for (int64_t g = g0; g < g1; g++)
    for (int64_t i0 = 0; i0 < p->m; i0 += 4) fns[(p->m - i0 < 4 ? p->m - i0 : 4) - 1](p, g, i0);
}
