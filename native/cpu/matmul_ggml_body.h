/*
 * GGUF block dot products on 256-bit vectors, included by matmul_ggml_avx2.c (maddubs) and
 * matmul_ggml_avx512vnni.c (vpdpbusd; there for Q2_K, Q3_K and the blocks left over by its 512-bit
 * kernels), which define
 *
 *   GGML_FN          the name of the family kernel (GGML_FN_STORAGE: `static` to keep it internal)
 *   dot_u8s8(u, s)   __m256i of 8 int32: lane i = Σ_{b<4} u[4i+b]·s[4i+b], u unsigned, s signed bytes
 *
 * and include this file once. Every weight block is unpacked to 32 unsigned codes (the sign trick for
 * Q4_0 / Q5_0 / Q8_0 / IQ4_NL / IQ4_XS: |q_w| against sign(q_w)·q_a), so a dot of 32 products is one dot_u8s8 — whose
 * products stay in int16 range for AVX2's saturating maddubs: |u| ≤ 128, |s| ≤ 127. Sub-block scales
 * multiply the int32 lanes (each lane covers 4 elements of one sub-block), offsets use the Q8_K block
 * sums, so a super-block is summed exactly in int32 and scaled once in f32 (llm.md §2.6; ggml
 * ggml-cpu/arch/x86/quants.c uses the same identities).
 *
 * Up to 4 activation rows share each unpacked weight block: y[i0 .. i0 + r) × one weight row.
 */
#include <immintrin.h>

#include "matmul.h"

/* Sum of the 8 int32 / f32 lanes. */
static inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float f16v(const uint8_t *p) { return _cvtsh_ss(tp_rd16(p)); }

/* 16 bytes → 32 unsigned nibbles: low nibbles first (elements 0..15), then the high ones (16..31). */
static inline __m256i nibbles32(const uint8_t *qs) {
  const __m128i b = _mm_loadu_si128((const __m128i *)qs);
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* ggml kvalues_iq4nl in both 128-bit lanes (the table of _mm256_shuffle_epi8). */
static inline __m256i kvalues_iq4nl(void) {
  const __m128i t = _mm_loadu_si128((const __m128i *)tp_kvalues_iq4nl);
  return _mm256_set_m128i(t, t);
}

/* Bit e of the 32-bit qh → 0x10 in byte e (Q5_0 / Q5_1 high bits). */
static inline __m256i bits32_to_0x10(uint32_t qh) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)qh), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* Q8_K block fields. */
#define Q8K_D(a) tp_rdf32(a)
#define Q8K_QS(a) ((a) + 4)
static inline int32_t q8k_bsum(const uint8_t *a, int g) {
  int16_t s;
  memcpy(&s, a + 260 + 2 * g, 2);
  return s;
}

/* ---- 32-element blocks ---------------------------------------------------------------------- */

/*
 * y rows r < R: Σ over blocks. Signed formats (Q4_0, Q5_0, Q8_0, IQ4_NL): u = |q_w|, s = sign(q_a, q_w).
 * Q4_1 / Q5_1: u = n (0..31), s = q_a, plus m_w · s_a per block.
 */
static inline __attribute__((always_inline)) void dot32_rows(int32_t fmt, int R, const uint8_t *w, int64_t nb,
                                                             const uint8_t *const *a, float *out) {
  const int q81 = fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1;
  const size_t ab = q81 ? 36 : 34, wb = (size_t)tp_wformats[fmt].block_bytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  float mterm[4] = {0, 0, 0, 0};
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *blk = w + (size_t)b * wb;
    __m256i q; /* signed codes (signed formats) or unsigned codes */
    float dw, mw = 0.0f;
    switch (fmt) {
      case TP_W_Q4_0:
        dw = f16v(blk);
        q = _mm256_sub_epi8(nibbles32(blk + 2), _mm256_set1_epi8(8));
        break;
      case TP_W_Q5_0:
        dw = f16v(blk);
        q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(blk + 6), bits32_to_0x10(tp_rd32(blk + 2))), _mm256_set1_epi8(16));
        break;
      case TP_W_Q8_0:
        dw = f16v(blk);
        q = _mm256_loadu_si256((const __m256i *)(blk + 2));
        break;
      case TP_W_IQ4_NL: /* the nibbles index the grid: one byte shuffle per 16 */
        dw = f16v(blk);
        q = _mm256_shuffle_epi8(kvalues_iq4nl(), nibbles32(blk + 2));
        break;
      case TP_W_Q4_1:
        dw = f16v(blk);
        mw = f16v(blk + 2);
        q = nibbles32(blk + 4);
        break;
      default: /* Q5_1 */
        dw = f16v(blk);
        mw = f16v(blk + 2);
        q = _mm256_or_si256(nibbles32(blk + 8), bits32_to_0x10(tp_rd32(blk + 4)));
    }
    const __m256i u = q81 ? q : _mm256_sign_epi8(q, q); /* |q_w|; abs(−128) = 128 as unsigned */
#define ROW32(r, accr)                                                                         \
  if (R > r) {                                                                                 \
    const uint8_t *ablk = a[r] + (size_t)b * ab;                                               \
    __m256i s = _mm256_loadu_si256((const __m256i *)(ablk + ab - 32));                        \
    if (!q81) s = _mm256_sign_epi8(s, q);                                                      \
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(u, s));                                      \
    accr = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * f16v(ablk)), accr);                          \
    if (q81) mterm[r] += mw * f16v(ablk + 2);                                                  \
  }
    ROW32(0, acc0) ROW32(1, acc1) ROW32(2, acc2) ROW32(3, acc3)
#undef ROW32
  }
  if (R > 0) out[0] = hsum_ps(acc0) + mterm[0];
  if (R > 1) out[1] = hsum_ps(acc1) + mterm[1];
  if (R > 2) out[2] = hsum_ps(acc2) + mterm[2];
  if (R > 3) out[3] = hsum_ps(acc3) + mterm[3];
}

/* ---- k-quants ------------------------------------------------------------------------------- */

/* The 6-bit scales (sc[0..8)) and mins (mn[0..8)) of Q4_K / Q5_K (ggml get_scale_min_k4). */
static inline void k4_scales(const uint8_t *s, int32_t *sc, int32_t *mn) {
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      sc[j] = s[j] & 63;
      mn[j] = s[j + 4] & 63;
    } else {
      sc[j] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
      mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  }
}

/* The 16 signed scales of Q3_K (llm.md §2.3 S3). */
static inline void q3k_scales(const uint8_t *s, int32_t *out) {
  for (int t = 0; t < 16; t++) out[t] = tp_q3k_scale(s, t);
}

/* Lanes 0..3 ← s0, lanes 4..7 ← s1 (the two 16-element groups of a 32-element chunk). */
static inline __m256i scale2(int32_t s0, int32_t s1) { return _mm256_set_epi32(s1, s1, s1, s1, s0, s0, s0, s0); }

/*
 * One super-block's 8 chunks of 32 unsigned codes u (0..63) and the int32 lane scale of each chunk,
 * for the formats whose value is scale · (u − offset) (offset: Q3_K 4, Q6_K 32, else 0).
 */
typedef struct kblock {
  __m256i u[8];
  __m256i sc[8];
  float d, dmin;       /* f16 super-block scale and min scale (dmin 0 where absent) */
  int32_t mins[8];     /* Q4_K / Q5_K: per 32; Q2_K: see min16 */
  int32_t min16[16];   /* Q2_K: per 16 */
  int32_t s16[16];     /* Q3_K / Q6_K: the per-16 scales (for the offset correction) */
} kblock;

static inline __attribute__((always_inline)) void unpack_k(int32_t fmt, const uint8_t *b, kblock *kb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  switch (fmt) {
    case TP_W_Q4_K:
    case TP_W_Q5_K: {
      const int five = fmt == TP_W_Q5_K;
      int32_t sc[8];
      k4_scales(b + 4, sc, kb->mins);
      kb->d = f16v(b);
      kb->dmin = f16v(b + 2);
      const uint8_t *qs = b + (five ? 48 : 16);
      const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
      for (int c = 0; c < 4; c++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
        if (five) {
          const __m256i one = _mm256_set1_epi8(1);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        kb->u[2 * c] = lo;
        kb->u[2 * c + 1] = hi;
        kb->sc[2 * c] = _mm256_set1_epi32(sc[2 * c]);
        kb->sc[2 * c + 1] = _mm256_set1_epi32(sc[2 * c + 1]);
      }
      break;
    }
    case TP_W_Q6_K: {
      kb->d = f16v(b + 208);
      kb->dmin = 0.0f;
      for (int t = 0; t < 16; t++) kb->s16[t] = (int8_t)b[192 + t];
      for (int h = 0; h < 2; h++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        for (int j = 0; j < 4; j++) {
          const __m256i ql = (j & 1) ? ql1 : ql0;
          const __m256i lo = j < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), m2);
          const int c = 4 * h + j;
          kb->u[c] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
          kb->sc[c] = scale2(kb->s16[2 * c], kb->s16[2 * c + 1]);
        }
      }
      break;
    }
    case TP_W_Q2_K: {
      kb->d = f16v(b + 80);
      kb->dmin = f16v(b + 82);
      for (int t = 0; t < 16; t++) kb->min16[t] = b[t] >> 4;
      for (int h = 0; h < 2; h++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
        for (int j = 0; j < 4; j++) {
          const int c = 4 * h + j;
          kb->u[c] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
          kb->sc[c] = scale2(b[2 * c] & 15, b[2 * c + 1] & 15);
        }
      }
      break;
    }
    case TP_W_IQ4_XS: { /* u holds the signed grid values K[n] (the dot applies the sign trick) */
      kb->d = f16v(b);
      kb->dmin = 0.0f;
      for (int c = 0; c < 8; c++) {
        kb->u[c] = _mm256_shuffle_epi8(kvalues_iq4nl(), nibbles32(b + 8 + 16 * c));
        kb->sc[c] = _mm256_set1_epi32(tp_iq4xs_scale(b, c) - 32);
      }
      break;
    }
    default: { /* Q3_K: u = q + 4·hb (0..7), value u − 4 */
      kb->d = f16v(b + 108);
      kb->dmin = 0.0f;
      q3k_scales(b + 96, kb->s16);
      const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
      const __m256i one = _mm256_set1_epi8(1);
      for (int h = 0; h < 2; h++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * h));
        for (int j = 0; j < 4; j++) {
          const int c = 4 * h + j;
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
          const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, c), one);
          kb->u[c] = _mm256_or_si256(q, _mm256_slli_epi16(hb, 2));
          kb->sc[c] = scale2(kb->s16[2 * c], kb->s16[2 * c + 1]);
        }
      }
    }
  }
}

static inline __attribute__((always_inline)) void dotk_rows(int32_t fmt, int R, const uint8_t *w, int64_t nb,
                                                            const uint8_t *const *a, float *out) {
  const size_t wb = (size_t)tp_wformats[fmt].block_bytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  float macc[4] = {0, 0, 0, 0}; /* − dmin terms */
  kblock kb;
  memset(&kb, 0, sizeof kb); /* every field the format does not set stays 0 */
  const int32_t offset = fmt == TP_W_Q6_K ? 32 : fmt == TP_W_Q3_K ? 4 : 0;
  for (int64_t blk = 0; blk < nb; blk++) {
    unpack_k(fmt, w + (size_t)blk * wb, &kb);
#define ROWK(r, accr)                                                                           \
  if (R > r) {                                                                                  \
    const uint8_t *ab = a[r] + (size_t)blk * 292;                                               \
    const int8_t *qa = (const int8_t *)Q8K_QS(ab);                                              \
    __m256i isum = _mm256_setzero_si256();                                                      \
    for (int c = 0; c < 8; c++) {                                                               \
      const __m256i s = _mm256_loadu_si256((const __m256i *)(qa + 32 * c));                    \
      const __m256i d4 = fmt == TP_W_IQ4_XS                                                     \
                             ? dot_u8s8(_mm256_sign_epi8(kb.u[c], kb.u[c]), _mm256_sign_epi8(s, kb.u[c])) \
                             : dot_u8s8(kb.u[c], s);                                            \
      isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(d4, kb.sc[c]));                          \
    }                                                                                           \
    int32_t corr = 0, msum = 0;                                                                 \
    if (offset) {                                                                               \
      for (int t = 0; t < 16; t++) corr += kb.s16[t] * q8k_bsum(ab, t);                         \
      corr *= offset;                                                                           \
    } else if (fmt == TP_W_Q2_K) {                                                              \
      for (int t = 0; t < 16; t++) msum += kb.min16[t] * q8k_bsum(ab, t);                       \
    } else if (fmt != TP_W_IQ4_XS) {                                                            \
      for (int t = 0; t < 8; t++) msum += kb.mins[t] * (q8k_bsum(ab, 2 * t) + q8k_bsum(ab, 2 * t + 1)); \
    }                                                                                           \
    isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(corr, 0, 0, 0, 0, 0, 0, 0));                \
    const float da = Q8K_D(ab);                                                                 \
    accr = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(kb.d * da), accr);          \
    macc[r] += (kb.dmin * da) * (float)msum;                                                    \
  }
    ROWK(0, acc0) ROWK(1, acc1) ROWK(2, acc2) ROWK(3, acc3)
#undef ROWK
  }
  if (R > 0) out[0] = hsum_ps(acc0) - macc[0];
  if (R > 1) out[1] = hsum_ps(acc1) - macc[1];
  if (R > 2) out[2] = hsum_ps(acc2) - macc[2];
  if (R > 3) out[3] = hsum_ps(acc3) - macc[3];
}

/* ---- the family kernel ----------------------------------------------------------------------- */

#define DOT_FN(F, R)                                                                              \
  static void dot_##F##_##R(const uint8_t *w, int64_t nb, const uint8_t *const *a, float *out) { \
    if (tp_wformats[F].block == 256) dotk_rows(F, R, w, nb, a, out);                            \
    else dot32_rows(F, R, w, nb, a, out);                                                       \
  }
#define DOT_FNS(F) DOT_FN(F, 1) DOT_FN(F, 2) DOT_FN(F, 3) DOT_FN(F, 4)
DOT_FNS(TP_W_Q4_0)
DOT_FNS(TP_W_Q4_1)
DOT_FNS(TP_W_Q5_0)
DOT_FNS(TP_W_Q5_1)
DOT_FNS(TP_W_Q8_0)
DOT_FNS(TP_W_Q2_K)
DOT_FNS(TP_W_Q3_K)
DOT_FNS(TP_W_Q4_K)
DOT_FNS(TP_W_Q5_K)
DOT_FNS(TP_W_Q6_K)
DOT_FNS(TP_W_IQ4_NL)
DOT_FNS(TP_W_IQ4_XS)

typedef void (*dot_fn)(const uint8_t *w, int64_t nb, const uint8_t *const *a, float *out);

#define DOT_ROW(F) {dot_##F##_1, dot_##F##_2, dot_##F##_3, dot_##F##_4}
static const dot_fn dots[TP_W_COUNT][4] = {
    [TP_W_Q4_0] = DOT_ROW(TP_W_Q4_0), [TP_W_Q4_1] = DOT_ROW(TP_W_Q4_1), [TP_W_Q5_0] = DOT_ROW(TP_W_Q5_0),
    [TP_W_Q5_1] = DOT_ROW(TP_W_Q5_1), [TP_W_Q8_0] = DOT_ROW(TP_W_Q8_0), [TP_W_Q2_K] = DOT_ROW(TP_W_Q2_K),
    [TP_W_Q3_K] = DOT_ROW(TP_W_Q3_K), [TP_W_Q4_K] = DOT_ROW(TP_W_Q4_K), [TP_W_Q5_K] = DOT_ROW(TP_W_Q5_K),
    [TP_W_Q6_K] = DOT_ROW(TP_W_Q6_K), [TP_W_IQ4_NL] = DOT_ROW(TP_W_IQ4_NL), [TP_W_IQ4_XS] = DOT_ROW(TP_W_IQ4_XS),
};

/* Weight rows per block of the loop nest: they stay in L1 / L2 while every activation row passes. */
#define GGML_ROWS_PER_BLOCK 16

#ifndef GGML_FN_STORAGE
#define GGML_FN_STORAGE
#endif
GGML_FN_STORAGE void GGML_FN(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  (void)scratch;
  const int64_t nb = mm->k / tp_wformats[mm->fmt].block;
  for (int64_t jb = n0; jb < n1; jb += GGML_ROWS_PER_BLOCK) {
    const int64_t je = jb + GGML_ROWS_PER_BLOCK < n1 ? jb + GGML_ROWS_PER_BLOCK : n1;
    for (int64_t i0 = 0; i0 < mm->m; i0 += 4) {
      const int r = mm->m - i0 < 4 ? (int)(mm->m - i0) : 4;
      const uint8_t *a[4];
      for (int t = 0; t < 4; t++) a[t] = mm->xq + (size_t)(i0 + (t < r ? t : 0)) * mm->xq_row;
      const dot_fn fn = dots[mm->fmt][r - 1];
      for (int64_t j = jb; j < je; j++) {
        float out[4];
        fn(mm->w + (size_t)j * mm->w_row, nb, a, out);
        for (int t = 0; t < r; t++) {
          float v = out[t];
          if (mm->bias) v = v + mm->bias[j];
          mm->y[(size_t)(i0 + t) * (size_t)mm->n + (size_t)j] = v;
        }
      }
    }
  }
}
