/*
 * matmul kernels for AVX-512 F/BW/VL + VNNI (+ AVX512_BF16 for the bf16 / fp8 ones; matmul.c only
 * calls those when the CPU has it): ConvRot int8 / int4 (vpdpbusd), bf16 and fp8 (vdpbf16ps), f32 and
 * f16 (vfmadd). Two regimes, chosen by the number of activation rows m:
 *
 *   m < TP_GEMM_MIN_M  GEMV: weight rows are streamed once per group of up to 4 activation rows, two
 *                      rows half the column range apart (gemv_pairs; fp8 without AVX512_VBMI: four
 *                      adjacent rows), dot products along k with 16-lane partial sums reduced at the
 *                      end of the row. Bound by memory bandwidth at m = 1.
 *   otherwise          GEMM, blocked as BLIS / GotoBLAS: for each block of NC output columns and KC
 *                      inputs, the weights are packed once (per task) into 64-column strips in the
 *                      layout the micro-kernel loads (4 int8 / 2 bf16 / 1 f32 of k per 32-bit lane),
 *                      then a 6 × 64 register tile (24 zmm accumulators) runs over KC for every group
 *                      of 6 activation rows, the activations broadcast 32 bits at a time from their
 *                      natural row-major layout. Partial sums between KC blocks (int32 or f32) live
 *                      in the task's own buffer of m × NC (tp_mm_part_bytes), the last block adds
 *                      them, applies the rescale / scale / bias and writes y (past
 *                      TP_MM_PART_TOTAL_MAX for all tasks: in y itself), because in y each block
 *                      touches a 1 KiB stretch of each 24 KiB row: a page per row on 4 KiB pages.
 *
 * Exactness: ConvRot accumulates exact int32 products (weights biased to unsigned: int8 q + 128, int4
 * q + 8, the bias removed with the activation row sums) and rescales with the same f32 operations as
 * tp_convrot_out, so it equals @tp/quant convRotLinear bit for bit. Float formats sum in a different
 * order than the scalar code (f32 rounding differences only).
 *
 * Source: Goto & van de Geijn, "Anatomy of high-performance matrix multiplication" (TOMS 2008); BLIS
 * micro-kernel design (Van Zee & van de Geijn, TOMS 2015); Intel SDM vol. 2 (VPDPBUSD, VDPBF16PS).
 */
#include <immintrin.h>
#include "matmul.h"

/* Software prefetch distance of the 4-row GEMV's weight streams, in bytes ahead of the loads. */
#ifndef PF_DIST
#define PF_DIST 512
#endif

/* From this many activation rows on, the packed GEMM runs; below, the GEMV kernels. */
#define TP_GEMM_MIN_M 16
/* Register tile: MR activation rows × NR output columns (4 zmm). */
#define MR 6
#define NR 64
/* Columns per packed weight block (a multiple of NR; the row stride of the partial-sum buffer). */
#define NC TP_MM_NC

/* ------------------------------------------------------------------------------------------ */
/* fp8 → bf16, 32 values (exact: every fp8 e4m3fn / e5m2 value is a bf16 value)                */
/* ------------------------------------------------------------------------------------------ */

/* e4m3fn bytes → bf16 bits: normal s.eeee.mmm → s | (eeee + 120) << 7 | mmm << 4; subnormal m · 2^-9 by table; 0x7F NaN. */
static inline __m512i e4m3_bf16(__m256i bytes) {
  const __m512i b = _mm512_cvtepu8_epi16(bytes);
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi16(0x7F));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x80)), 8);
  __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
  /* subnormals: m · 2^-9 for m = 0..7 as bf16 bits */
  const __m512i sub = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0x3C60, 0x3C40, 0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0);
  v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), mag, sub);
  v = _mm512_mask_mov_epi16(v, _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F)), _mm512_set1_epi16(0x7FC0));
  return _mm512_or_si512(v, sign);
}

/* e5m2 bytes → bf16 bits: normal → s | (e + 112) << 7 | m << 5; subnormal m · 2^-16; e = 31 inf / NaN. */
static inline __m512i e5m2_bf16(__m256i bytes) {
  const __m512i b = _mm512_cvtepu8_epi16(bytes);
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi16(0x7F));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x80)), 8);
  __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 5), _mm512_set1_epi16(112 << 7));
  const __m512i sub = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0, 0, 0, 0, 0x3840, 0x3800, 0x3780, 0);
  v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(4)), mag, sub);
  /* inf (m = 0) and NaN (m != 0: payload kept, quiet bit set) */
  const __m512i m2 = _mm512_and_si512(mag, _mm512_set1_epi16(3));
  __m512i special = _mm512_or_si512(_mm512_set1_epi16(0x7F80), _mm512_slli_epi16(m2, 5));
  special = _mm512_mask_mov_epi16(special, _mm512_test_epi16_mask(m2, m2),
                                  _mm512_or_si512(special, _mm512_set1_epi16(0x40)));
  v = _mm512_mask_mov_epi16(v, _mm512_cmpge_epu16_mask(mag, _mm512_set1_epi16(0x7C)), special);
  return _mm512_or_si512(v, sign);
}

/* 32 weights of a bf16 / fp8 row from element t (count ≤ 32 valid, the rest zero) as bf16 pairs. */
static inline __m512i load_bf16w(int32_t fmt, const uint8_t *row, int64_t t, int count) {
  if (fmt == TP_W_BF16) {
    const __mmask32 m = count >= 32 ? 0xFFFFFFFFu : ((1u << count) - 1u);
    return _mm512_maskz_loadu_epi16(m, row + 2 * t);
  }
  const __mmask32 m = count >= 32 ? 0xFFFFFFFFu : ((1u << count) - 1u);
  const __m256i bytes = _mm256_maskz_loadu_epi8(m, row + t);
  const __m512i v = fmt == TP_W_F8_E4M3FN ? e4m3_bf16(bytes) : e5m2_bf16(bytes);
  return _mm512_maskz_mov_epi16(m, v); /* zero the padding (fp8 0 → bf16 0 anyway; keeps it explicit) */
}

/* ------------------------------------------------------------------------------------------ */
/* GEMV kernels                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Output value (row i, column j) of a float-format product from its sum. */
static inline float float_out(const tp_mm *mm, float s, int64_t j) {
  if (mm->has_scale) s = s * mm->scale;
  if (mm->bias) s = s + mm->bias[j];
  return s;
}

/*
 * The GEMV kernels below share one shape: R activation rows (1..4, a compile-time constant after
 * inlining) × 4 weight rows, 16 named accumulators (an array would live in memory: GCC keeps
 * arrays of vectors indexed in loops on the stack), one pass along k, then a horizontal sum per
 * (row, column). C(r, c) names accumulator r·4 + c.
 */
#define ACC16(T, Z)                                                                              \
  T c00 = Z, c01 = Z, c02 = Z, c03 = Z, c10 = Z, c11 = Z, c12 = Z, c13 = Z, c20 = Z, c21 = Z, c22 = Z, \
    c23 = Z, c30 = Z, c31 = Z, c32 = Z, c33 = Z;
/* Call ST(r, c, acc) for each of the R × C outputs. */
#define STORE16(ST)                                                              \
  do {                                                                          \
    ST(0, 0, c00) ST(0, 1, c01) ST(0, 2, c02) ST(0, 3, c03) ST(1, 0, c10)       \
    ST(1, 1, c11) ST(1, 2, c12) ST(1, 3, c13) ST(2, 0, c20) ST(2, 1, c21)       \
    ST(2, 2, c22) ST(2, 3, c23) ST(3, 0, c30) ST(3, 1, c31) ST(3, 2, c32)       \
    ST(3, 3, c33)                                                               \
  } while (0)

/* Weight rows j0 .. j0 + 3 (clamped to the last valid one: duplicates are computed, not stored). */
#define WROWS(mm, j0, c)                                                                          \
  const uint8_t *w0 = mm->w + (size_t)(j0)*mm->w_row, *w1 = mm->w + (size_t)((j0) + (c > 1)) * mm->w_row, \
                *w2 = mm->w + (size_t)((j0) + (c > 2 ? 2 : c - 1)) * mm->w_row,                          \
                *w3 = mm->w + (size_t)((j0) + (c > 3 ? 3 : c - 1)) * mm->w_row

/* bf16 / fp8 weights, bf16 activations: vdpbf16ps over 32 k at a time. */
static inline __attribute__((always_inline)) void gemv_bf16_rows(const tp_mm *mm, int R, int64_t i0, int64_t n0,
                                                                  int64_t n1) {
  const int64_t k = mm->k;
  const uint16_t *x0 = (const uint16_t *)(mm->xq + (size_t)i0 * mm->xq_row);
  const uint16_t *x1 = (const uint16_t *)((const uint8_t *)x0 + (R > 1) * mm->xq_row);
  const uint16_t *x2 = (const uint16_t *)((const uint8_t *)x0 + (R > 2 ? 2 : 0) * mm->xq_row);
  const uint16_t *x3 = (const uint16_t *)((const uint8_t *)x0 + (R > 3 ? 3 : 0) * mm->xq_row);
  const int32_t fmt = mm->fmt;
  for (int64_t j0 = n0; j0 < n1; j0 += 4) {
    const int c = n1 - j0 < 4 ? (int)(n1 - j0) : 4;
    WROWS(mm, j0, c);
    ACC16(__m512, _mm512_setzero_ps())
    for (int64_t t = 0; t < k; t += 32) {
      const int cnt = k - t < 32 ? (int)(k - t) : 32;
      const __mmask32 mk = cnt >= 32 ? 0xFFFFFFFFu : ((1u << cnt) - 1u);
      __m512i v0, v1, v2, v3;
      if (fmt == TP_W_BF16) {
        _mm_prefetch((const char *)(w0 + 2 * t + PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + 2 * t + PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(w2 + 2 * t + PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(w3 + 2 * t + PF_DIST), _MM_HINT_T0);
        v0 = _mm512_maskz_loadu_epi16(mk, w0 + 2 * t);
        v1 = _mm512_maskz_loadu_epi16(mk, w1 + 2 * t);
        v2 = _mm512_maskz_loadu_epi16(mk, w2 + 2 * t);
        v3 = _mm512_maskz_loadu_epi16(mk, w3 + 2 * t);
      } else {
        v0 = load_bf16w(fmt, w0, t, cnt);
        v1 = load_bf16w(fmt, w1, t, cnt);
        v2 = load_bf16w(fmt, w2, t, cnt);
        v3 = load_bf16w(fmt, w3, t, cnt);
      }
#define ROW(r)                                                                  \
  if (R > r) {                                                                  \
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, x##r + t);       \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, xv, (__m512bh)v0);                     \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, xv, (__m512bh)v1);                     \
    c##r##2 = _mm512_dpbf16_ps(c##r##2, xv, (__m512bh)v2);                     \
    c##r##3 = _mm512_dpbf16_ps(c##r##3, xv, (__m512bh)v3);                     \
  }
      ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
    }
#define ST(r, cc, acc)                                                                                    \
  if (R > r && c > cc)                                                                                    \
    mm->y[(size_t)(i0 + r) * (size_t)mm->n + (size_t)(j0 + cc)] = float_out(mm, _mm512_reduce_add_ps(acc), j0 + cc);
    STORE16(ST);
#undef ST
  }
}

/* 16 f32 weights of an f32 / f16 row from element t (count ≤ 16 valid, the rest zero). */
static inline __m512 load_f32w(int32_t fmt, const uint8_t *row, int64_t t, __mmask16 m) {
  if (fmt == TP_W_F32) return _mm512_maskz_loadu_ps(m, row + 4 * t);
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * t));
}

/* R-specialized instances (the accumulators of unused rows are dropped by the compiler). */
static void gemv_bf16_1(const tp_mm *mm, int64_t i0, int64_t n0, int64_t n1) { gemv_bf16_rows(mm, 1, i0, n0, n1); }
static void gemv_bf16_2(const tp_mm *mm, int64_t i0, int64_t n0, int64_t n1) { gemv_bf16_rows(mm, 2, i0, n0, n1); }
static void gemv_bf16_3(const tp_mm *mm, int64_t i0, int64_t n0, int64_t n1) { gemv_bf16_rows(mm, 3, i0, n0, n1); }
static void gemv_bf16_4(const tp_mm *mm, int64_t i0, int64_t n0, int64_t n1) { gemv_bf16_rows(mm, 4, i0, n0, n1); }
typedef void (*gemv_fn)(const tp_mm *mm, int64_t i0, int64_t n0, int64_t n1);
static const gemv_fn gemv_bf16s[4] = {gemv_bf16_1, gemv_bf16_2, gemv_bf16_3, gemv_bf16_4};

/*
 * The two-row kernels' start (bf16, ConvRot): 16 accumulators of type T, a{r}{h} / b{r}{h} for activation row
 * r and weight row w / v (two halves h each), and the R activation rows x0 .. x3 (element type E, stride xs;
 * unused ones alias x0).
 */
#define PAIR_START(T, ZERO, E)                                                                              \
  const T z = ZERO;                                                                                         \
  T a00 = z, a01 = z, b00 = z, b01 = z, a10 = z, a11 = z, b10 = z, b11 = z;                                 \
  T a20 = z, a21 = z, b20 = z, b21 = z, a30 = z, a31 = z, b30 = z, b31 = z;                                 \
  const E *x0 = x, *x1 = x + (R > 1 ? xs : 0), *x2 = x + (R > 2 ? 2 * xs : 0), *x3 = x + (R > 3 ? 3 * xs : 0);
/* The sums of activation row r of a two-row step, each row's two accumulators added first (bf16, ConvRot). */
#define PAIR_OUT(r, REDUCE, ADD)                   \
  if (R > r) {                                     \
    out[r][0] = REDUCE(ADD(a##r##0, a##r##1));     \
    out[r][1] = REDUCE(ADD(b##r##0, b##r##1));     \
  }

/*
 * bf16 weights at m < 16: weight rows w and v against R ≤ 4 activation rows x + r·xs (k bf16 each), 64 k
 * per step in two accumulators per (activation row, weight row), sums into out[r][0] / out[r][1] (v = w
 * for a single row). Each row is summed the same way whatever R is, so a batch of rows gives each row
 * the bits it gets alone. pf: prefetch BF16_PF_DIST bytes ahead in both weight rows — at M = 1 the loop
 * is faster without, at M ≥ 2, where every weight byte costs more arithmetic, the hardware prefetcher
 * falls behind at large K.
 */
#define BF16_PF_DIST 2048
static inline __attribute__((always_inline)) void dot_bf16_2rows(int R, int pf, const uint16_t *x, size_t xs,
                                                                 const uint16_t *w, const uint16_t *v, int64_t k,
                                                                 float out[4][2]) {
  PAIR_START(__m512, _mm512_setzero_ps(), uint16_t)
  int64_t q = 0;
  for (; q + 64 <= k; q += 64) {
    if (pf) {
      _mm_prefetch((const char *)(w + q) + BF16_PF_DIST, _MM_HINT_T0);
      _mm_prefetch((const char *)(w + q) + BF16_PF_DIST + 64, _MM_HINT_T0);
      _mm_prefetch((const char *)(v + q) + BF16_PF_DIST, _MM_HINT_T0);
      _mm_prefetch((const char *)(v + q) + BF16_PF_DIST + 64, _MM_HINT_T0);
    }
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + q), v0 = (__m512bh)_mm512_loadu_si512(v + q),
                   w1 = (__m512bh)_mm512_loadu_si512(w + q + 32), v1 = (__m512bh)_mm512_loadu_si512(v + q + 32);
#define ROW(r)                                                                                                   \
  if (R > r) {                                                                                                   \
    const __m512bh xa = (__m512bh)_mm512_loadu_si512(x##r + q), xb = (__m512bh)_mm512_loadu_si512(x##r + q + 32); \
    a##r##0 = _mm512_dpbf16_ps(a##r##0, xa, w0);                                                                 \
    b##r##0 = _mm512_dpbf16_ps(b##r##0, xa, v0);                                                                 \
    a##r##1 = _mm512_dpbf16_ps(a##r##1, xb, w1);                                                                 \
    b##r##1 = _mm512_dpbf16_ps(b##r##1, xb, v1);                                                                 \
  }
    ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
  }
  for (; q < k; q += 32) {
    const int cnt = k - q < 32 ? (int)(k - q) : 32;
    const __mmask32 mk = cnt >= 32 ? 0xFFFFFFFFu : ((1u << cnt) - 1u);
    const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + q), v0 = (__m512bh)_mm512_maskz_loadu_epi16(mk, v + q);
#define ROW(r)                                                                  \
  if (R > r) {                                                                  \
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, x##r + q);       \
    a##r##0 = _mm512_dpbf16_ps(a##r##0, xv, w0);                                \
    b##r##0 = _mm512_dpbf16_ps(b##r##0, xv, v0);                                \
  }
    ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
  }
  PAIR_OUT(0, _mm512_reduce_add_ps, _mm512_add_ps) PAIR_OUT(1, _mm512_reduce_add_ps, _mm512_add_ps)
  PAIR_OUT(2, _mm512_reduce_add_ps, _mm512_add_ps) PAIR_OUT(3, _mm512_reduce_add_ps, _mm512_add_ps)
}

/* The bf16 GEMV at m < 16 (gemv_pairs, below the ConvRot kernels it shares with): m = 1, and m = 2 .. 15. */
static void gemv_bf16_m1(const tp_mm *mm, int64_t n0, int64_t n1);
static void gemv_bf16_many(const tp_mm *mm, int64_t n0, int64_t n1);


/*
 * fp8 weights at m < 16 (decoding an fp8 checkpoint; short prompts): weight rows j and j + h together,
 * two sequential weight streams with a software prefetch FP8_PF_DIST bytes ahead, as the f32 / f16
 * GEMV, 64 codes per step and weight row, each decoded once for up to 4 activation rows. A code's bf16
 * value is looked up, not computed: its 7 bits without the sign index two 128-byte tables (the high and the low bytes of the bf16 of every magnitude, built per call
 * with e4m3_bf16 / e5m2_bf16, so NaN, inf and subnormals are theirs) with one vpermt2b each, the sign
 * bit is or-ed into the high byte, and vpunpck{l,h}bw interleaves the bytes into 2 × 32 bf16 — in the
 * order of the 128-bit lanes (elements 0..7, 16..23, 32..39, 48..55, then 8..15, …), so x is laid out
 * once per call in that order (xp). Then vdpbf16ps, as the other fp8 kernels: the same products (exact
 * in f32) and the same pairs of adjacent elements, summed in another order.
 * Needs AVX512_VBMI (vpermt2b; TP_CPU_AVX512VBMI), else the 4-row kernel runs. A lookup, because going
 * through binary16 (e5m2 is a binary16's top byte; e4m3 as S.0EEEE.MMM0000000 is its value / 256) is
 * bound by vcvtph2ps, well below memory speed (docs/performance.md, "GEMV").
 */
#define FP8_PF_DIST 2048
#define TP_VBMI __attribute__((target("avx512vbmi")))

/* Bytes of the bf16 of every fp8 magnitude 0..127: hi / lo [0] for 0..63, [1] for 64..127. */
typedef struct fp8_tables {
  __m512i hi0, hi1, lo0, lo1;
} fp8_tables;

static inline __attribute__((always_inline)) fp8_tables fp8_tables_for(int32_t fmt) {
  __m512i wd[4]; /* the bf16 of magnitudes 32 q .. 32 q + 31 */
  for (int q = 0; q < 4; q++) {
    const __m256i m = _mm256_add_epi8(_mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                                       19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31),
                                      _mm256_set1_epi8((char)(32 * q)));
    wd[q] = fmt == TP_W_F8_E4M3FN ? e4m3_bf16(m) : e5m2_bf16(m);
  }
#define HI(a, b) \
  _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8))), _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8)), 1)
#define LO(a, b) _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)), _mm512_cvtepi16_epi8(b), 1)
  const fp8_tables t = {.hi0 = HI(wd[0], wd[1]), .hi1 = HI(wd[2], wd[3]), .lo0 = LO(wd[0], wd[1]), .lo1 = LO(wd[2], wd[3])};
#undef HI
#undef LO
  return t;
}

/*
 * Weight rows w and v (v = w for a single row) against R activation rows xp, xp + xs, … (x in step
 * order, zero past k): out[2 r] (w), out[2 r + 1] (v). Each (activation row, weight row) is summed in
 * the same order whatever R is, so M = 1 and the rows of M > 1 give the same floats.
 */
#define FP8_ACC(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, b##r##0 = a##r##0, b##r##1 = a##r##0;
#define FP8_ROW(r)                                                                         \
  if (R > r) {                                                                             \
    const __m512bh x0 = (__m512bh)_mm512_load_si512(xp + (size_t)(r)*xs + t);             \
    const __m512bh x1 = (__m512bh)_mm512_load_si512(xp + (size_t)(r)*xs + t + 32);        \
    a##r##0 = _mm512_dpbf16_ps(a##r##0, x0, lw0);                                          \
    b##r##0 = _mm512_dpbf16_ps(b##r##0, x0, lv0);                                          \
    a##r##1 = _mm512_dpbf16_ps(a##r##1, x1, lw1);                                          \
    b##r##1 = _mm512_dpbf16_ps(b##r##1, x1, lv1);                                          \
  }
#define FP8_OUT(r)                                                   \
  if (R > r) {                                                       \
    out[2 * (r)] = _mm512_reduce_add_ps(_mm512_add_ps(a##r##0, a##r##1));     \
    out[2 * (r) + 1] = _mm512_reduce_add_ps(_mm512_add_ps(b##r##0, b##r##1)); \
  }
static inline __attribute__((always_inline)) TP_VBMI void dot_fp8_2rows(int R, const fp8_tables *tb, const uint16_t *xp,
                                                                        size_t xs, const uint8_t *w, const uint8_t *v,
                                                                        int64_t k, float *out) {
  const __m512i sign = _mm512_set1_epi8((char)0x80);
  FP8_ACC(0) FP8_ACC(1) FP8_ACC(2) FP8_ACC(3)
  for (int64_t t = 0; t < k; t += 64) {
    const int64_t left = k - t;
    const __mmask64 mk = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
    _mm_prefetch((const char *)(w + t + FP8_PF_DIST), _MM_HINT_T0);
    _mm_prefetch((const char *)(v + t + FP8_PF_DIST), _MM_HINT_T0);
    const __m512i zw = _mm512_maskz_loadu_epi8(mk, w + t), zv = _mm512_maskz_loadu_epi8(mk, v + t);
    /* high bytes: the table's, with the code's sign (A | (B & C)); low bytes: the table's */
    const __m512i hw = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(tb->hi0, zw, tb->hi1), zw, sign, 0xF8);
    const __m512i hv = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(tb->hi0, zv, tb->hi1), zv, sign, 0xF8);
    const __m512i lw = _mm512_permutex2var_epi8(tb->lo0, zw, tb->lo1), lv = _mm512_permutex2var_epi8(tb->lo0, zv, tb->lo1);
    const __m512bh lw0 = (__m512bh)_mm512_unpacklo_epi8(lw, hw), lw1 = (__m512bh)_mm512_unpackhi_epi8(lw, hw);
    const __m512bh lv0 = (__m512bh)_mm512_unpacklo_epi8(lv, hv), lv1 = (__m512bh)_mm512_unpackhi_epi8(lv, hv);
    FP8_ROW(0) FP8_ROW(1) FP8_ROW(2) FP8_ROW(3)
  }
  FP8_OUT(0) FP8_OUT(1) FP8_OUT(2) FP8_OUT(3)
}
#undef FP8_ACC
#undef FP8_ROW
#undef FP8_OUT

/* x row q (bf16, k values) laid out in step order at xp: per 64 elements, [0..7, 16..23, 32..39, 48..55] then the rest, zero past k. */
static inline __attribute__((always_inline)) void fp8_x_layout(const uint16_t *xb, int64_t k, uint16_t *xp) {
  const __m512i i0 = _mm512_set_epi16(55, 54, 53, 52, 51, 50, 49, 48, 39, 38, 37, 36, 35, 34, 33, 32, 23, 22, 21, 20, 19,
                                      18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(8));
  for (int64_t t = 0; t < k; t += 64) {
    const int64_t left = k - t;
    const __mmask32 m0 = left >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
    const __mmask32 m1 = left >= 64 ? 0xFFFFFFFFu : left <= 32 ? 0u : (__mmask32)((1u << (left - 32)) - 1u);
    const __m512i lo = _mm512_maskz_loadu_epi16(m0, xb + t), hi = _mm512_maskz_loadu_epi16(m1, xb + t + 32);
    _mm512_store_si512(xp + t, _mm512_permutex2var_epi16(lo, i0, hi));
    _mm512_store_si512(xp + t + 32, _mm512_permutex2var_epi16(lo, i1, hi));
  }
}

/*
 * Rows [n0, n1) for activation rows i0 .. i0 + R − 1 (R ≤ 4; xp: their step-order layouts, xs apart):
 * weight rows j and j + h together, as the bf16 / GGUF GEMVs at M = 1.
 */
static inline __attribute__((always_inline)) TP_VBMI void gemv_fp8_rows(const tp_mm *mm, const fp8_tables *tb, int R,
                                                                        int64_t i0, int64_t n0, int64_t n1,
                                                                        const uint16_t *xp, size_t xs) {
  const int64_t k = mm->k, n = mm->n;
  const int64_t h = (n1 - n0) / 2;
  float out[8];
  for (int64_t j = n0; j < n0 + h; j++) {
    const uint8_t *w = mm->w + (size_t)j * mm->w_row;
    dot_fp8_2rows(R, tb, xp, xs, w, w + (size_t)h * mm->w_row, k, out);
    for (int r = 0; r < R; r++) {
      mm->y[(size_t)(i0 + r) * (size_t)n + (size_t)j] = float_out(mm, out[2 * r], j);
      mm->y[(size_t)(i0 + r) * (size_t)n + (size_t)(j + h)] = float_out(mm, out[2 * r + 1], j + h);
    }
  }
  if ((n1 - n0) % 2) { /* the odd row left over */
    const uint8_t *w = mm->w + (size_t)(n1 - 1) * mm->w_row;
    dot_fp8_2rows(R, tb, xp, xs, w, w, k, out);
    for (int r = 0; r < R; r++) mm->y[(size_t)(i0 + r) * (size_t)n + (size_t)(n1 - 1)] = float_out(mm, out[2 * r], n1 - 1);
  }
}

/*
 * fp8 at m < 16 (AVX512_VBMI): every activation row laid out once in the task's scratch (m rows of k
 * rounded up to 64 bf16, 64-byte aligned), then groups of up to 4 rows stream the weights.
 */
static inline __attribute__((always_inline)) TP_VBMI void gemv_fp8(const tp_mm *mm, int32_t fmt, int64_t n0, int64_t n1,
                                                                   uint16_t *xp) {
  const fp8_tables tb = fp8_tables_for(fmt);
  const size_t xs = (size_t)(mm->k + 63) / 64 * 64;
  for (int64_t i = 0; i < mm->m; i++) fp8_x_layout((const uint16_t *)(mm->xq + (size_t)i * mm->xq_row), mm->k, xp + (size_t)i * xs);
  for (int64_t i0 = 0; i0 < mm->m; i0 += 4) {
    const uint16_t *x = xp + (size_t)i0 * xs;
    switch (mm->m - i0 < 4 ? mm->m - i0 : 4) {
      case 1: gemv_fp8_rows(mm, &tb, 1, i0, n0, n1, x, xs); break;
      case 2: gemv_fp8_rows(mm, &tb, 2, i0, n0, n1, x, xs); break;
      case 3: gemv_fp8_rows(mm, &tb, 3, i0, n0, n1, x, xs); break;
      default: gemv_fp8_rows(mm, &tb, 4, i0, n0, n1, x, xs); break;
    }
  }
}

static __attribute__((noinline)) TP_VBMI void gemv_fp8_e4m3(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  gemv_fp8(mm, TP_W_F8_E4M3FN, n0, n1, (uint16_t *)scratch);
}
static __attribute__((noinline)) TP_VBMI void gemv_fp8_e5m2(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  gemv_fp8(mm, TP_W_F8_E5M2, n0, n1, (uint16_t *)scratch);
}

static void gemv_bf16(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  if (mm->fmt == TP_W_BF16) {
    (mm->m == 1 ? gemv_bf16_m1 : gemv_bf16_many)(mm, n0, n1);
    return;
  }
  if ((mm->features & TP_CPU_AVX512VBMI) && mm->fmt != TP_W_BF16) { /* fp8 (gemv_fp8) */
    if (mm->fmt == TP_W_F8_E4M3FN) gemv_fp8_e4m3(mm, n0, n1, scratch);
    else gemv_fp8_e5m2(mm, n0, n1, scratch);
    return;
  }
  for (int64_t i0 = 0; i0 < mm->m; i0 += 4) gemv_bf16s[(mm->m - i0 < 4 ? mm->m - i0 : 4) - 1](mm, i0, n0, n1);
}

/*
 * f32 / f16 weights at m < 16 (gemv_pairs): rows w and v (j and j + h, h = half the range) against R ≤ 4
 * activation rows x + r·xs, two sequential weight streams as in the GGUF and bf16 GEMVs, each row summed
 * exactly as the 4-row kernel summed it (one accumulator per output, 16 k at a time, masked tail), so the
 * outputs are the same floats. The software prefetch F32_M1_PF_DIST bytes ahead is what makes it fast:
 * the hardware prefetcher does not keep up with this loop alone. (The bf16 loop, reading two lines per
 * row and step, is slower with it.)
 */
#define F32_M1_PF_DIST 2048
static inline __attribute__((always_inline)) void dot_f32_2rows(int32_t fmt, int R, int pf, const float *x, size_t xs,
                                                                const uint8_t *w, const uint8_t *v, int64_t k,
                                                                float out[4][2]) {
  const __m512 z = _mm512_setzero_ps();
  __m512 a0 = z, b0 = z, a1 = z, b1 = z, a2 = z, b2 = z, a3 = z, b3 = z;
  const float *x0 = x, *x1 = x + (R > 1 ? xs : 0), *x2 = x + (R > 2 ? 2 * xs : 0), *x3 = x + (R > 3 ? 3 * xs : 0);
  for (int64_t t = 0; t < k; t += 16) {
    const int cnt = k - t < 16 ? (int)(k - t) : 16;
    const __mmask16 mk = cnt >= 16 ? 0xFFFF : (__mmask16)((1u << cnt) - 1u);
    if (pf && (fmt == TP_W_F32 || (t & 31) == 0)) { /* a cache line per row and step (f16: every other step) */
      _mm_prefetch((const char *)(w + (fmt == TP_W_F32 ? 4 : 2) * t + F32_M1_PF_DIST), _MM_HINT_T0);
      _mm_prefetch((const char *)(v + (fmt == TP_W_F32 ? 4 : 2) * t + F32_M1_PF_DIST), _MM_HINT_T0);
    }
    const __m512 wv = load_f32w(fmt, w, t, mk), vv = load_f32w(fmt, v, t, mk);
#define ROW(r)                                               \
  if (R > r) {                                               \
    const __m512 xv = _mm512_maskz_loadu_ps(mk, x##r + t);   \
    a##r = _mm512_fmadd_ps(xv, wv, a##r);                    \
    b##r = _mm512_fmadd_ps(xv, vv, b##r);                    \
  }
    ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
  }
#define OUT(r)                                   \
  if (R > r) {                                   \
    out[r][0] = _mm512_reduce_add_ps(a##r);      \
    out[r][1] = _mm512_reduce_add_ps(b##r);      \
  }
  OUT(0) OUT(1) OUT(2) OUT(3)
#undef OUT
}

/* The f32 / f16 GEMVs at m < 16 (gemv_pairs): m = 1, and m = 2 .. 15. */
static void gemv_f32_m1_f32(const tp_mm *mm, int64_t n0, int64_t n1);
static void gemv_f32_m1_f16(const tp_mm *mm, int64_t n0, int64_t n1);
static void gemv_f32_many_f32(const tp_mm *mm, int64_t n0, int64_t n1);
static void gemv_f32_many_f16(const tp_mm *mm, int64_t n0, int64_t n1);

static void gemv_f32(const tp_mm *mm, int64_t n0, int64_t n1) {
  if (mm->fmt == TP_W_F32) (mm->m == 1 ? gemv_f32_m1_f32 : gemv_f32_many_f32)(mm, n0, n1);
  else (mm->m == 1 ? gemv_f32_m1_f16 : gemv_f32_many_f16)(mm, n0, n1);
}


/*
 * ConvRot GEMV. int8: u = q_w ^ 0x80 (= q_w + 128, unsigned) · q_x (signed) per byte; the sum is
 * Σ q_w q_x + 128 Σ q_x. int4: the 64 bytes at k/2 hold 128 codes, element 2i in the low nibble: the
 * low nibbles (n ^ 8 = q + 8) pair with the even activations, the high ones with the odd, so each
 * activation row is first rearranged per 128 elements into [evens, odds] (xp, zero padded); the sum
 * is Σ q_w q_x + 8 Σ q_x.
 *
 * dot_cr_2rows (m < TP_GEMM_MIN_M): rows w and v (v = w for a single row) against R ≤ 4 activation
 * rows x + r·xs (int8: the codes themselves; int4: xp), exact int32 sums Σ u_w q_x (u_w = q_w + 128 /
 * + 8) into out[r][0] / out[r][1] — the same integers in any order, so the outputs are those of
 * @tp/quant convRotLinear bit for bit (tp_convrot_out). pf: prefetch (the first pass over the rows).
 * Two weight streams half the range apart with a software prefetch CR_PF_DIST bytes ahead (as the GGUF /
 * bf16 / f32 / fp8 GEMVs; four adjacent rows, as the 4-row kernel streamed them, is what the hardware
 * prefetcher does not follow here), two accumulators per row and stream; each weight vector loaded
 * serves every activation row of the group. M = 2 .. 15: see gemv_pairs.
 */
#define CR_PF_DIST 2048
static inline __attribute__((always_inline)) void dot_cr_2rows(int int8, int R, int pf, const int8_t *x, size_t xs,
                                                               const uint8_t *w, const uint8_t *v, int64_t k,
                                                               int32_t out[4][2]) {
  PAIR_START(__m512i, _mm512_setzero_si512(), int8_t)
  /* activation row r: 128 codes at x_r + OFF against the weight vectors WA / VA (first 64) and WB / VB */
#define CR_ROW(r, OFF, WA, VA, WB, VB)                                                               \
  if (R > r) {                                                                                       \
    const __m512i xa = _mm512_loadu_si512(x##r + (OFF)), xb = _mm512_loadu_si512(x##r + (OFF) + 64); \
    a##r##0 = _mm512_dpbusd_epi32(a##r##0, WA, xa);                                                  \
    b##r##0 = _mm512_dpbusd_epi32(b##r##0, VA, xa);                                                  \
    a##r##1 = _mm512_dpbusd_epi32(a##r##1, WB, xb);                                                  \
    b##r##1 = _mm512_dpbusd_epi32(b##r##1, VB, xb);                                                  \
  }
  if (int8) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    int64_t t = 0;
    for (; t + 128 <= k; t += 128) {
      if (pf) {
        _mm_prefetch((const char *)(w + t + CR_PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + t + CR_PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + t + 64 + CR_PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + t + 64 + CR_PF_DIST), _MM_HINT_T0);
      }
      const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(w + t), flip),
                    v0 = _mm512_xor_si512(_mm512_loadu_si512(v + t), flip),
                    w1 = _mm512_xor_si512(_mm512_loadu_si512(w + t + 64), flip),
                    v1 = _mm512_xor_si512(_mm512_loadu_si512(v + t + 64), flip);
      CR_ROW(0, t, w0, v0, w1, v1) CR_ROW(1, t, w0, v0, w1, v1) CR_ROW(2, t, w0, v0, w1, v1) CR_ROW(3, t, w0, v0, w1, v1)
    }
    for (; t < k; t += 64) { /* masked: a weight byte past k reads 0x80 (= 0 + 128) against an x of 0 */
      const int cnt = k - t < 64 ? (int)(k - t) : 64;
      const __mmask64 mk = cnt >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << cnt) - 1);
      const __m512i w0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + t), flip),
                    v0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, v + t), flip);
#define ROW(r)                                                    \
  if (R > r) {                                                    \
    const __m512i xv = _mm512_maskz_loadu_epi8(mk, x##r + t);     \
    a##r##0 = _mm512_dpbusd_epi32(a##r##0, w0, xv);               \
    b##r##0 = _mm512_dpbusd_epi32(b##r##0, v0, xv);               \
  }
      ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
    }
  } else {
    const __m512i flip = _mm512_set1_epi8((char)0x88), lo4 = _mm512_set1_epi8(0x0F);
    const int64_t kb = k / 2; /* bytes per weight row; xp holds whole blocks of 128, zero padded */
    for (int64_t t = 0; t < kb; t += 64) {
      const int cnt = kb - t < 64 ? (int)(kb - t) : 64;
      const __mmask64 mk = cnt >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << cnt) - 1);
      if (pf) {
        _mm_prefetch((const char *)(w + t + CR_PF_DIST), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + t + CR_PF_DIST), _MM_HINT_T0);
      }
      const __m512i bw = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + t), flip);
      const __m512i bv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, v + t), flip);
      const __m512i wl = _mm512_and_si512(bw, lo4), wh = _mm512_and_si512(_mm512_srli_epi16(bw, 4), lo4);
      const __m512i vl = _mm512_and_si512(bv, lo4), vh = _mm512_and_si512(_mm512_srli_epi16(bv, 4), lo4);
      /* the low nibbles pair with the even activations (xp's first 64 bytes per 128), the high with the odd */
      CR_ROW(0, 2 * t, wl, vl, wh, vh) CR_ROW(1, 2 * t, wl, vl, wh, vh) CR_ROW(2, 2 * t, wl, vl, wh, vh)
      CR_ROW(3, 2 * t, wl, vl, wh, vh)
    }
  }
#undef CR_ROW
  PAIR_OUT(0, _mm512_reduce_add_epi32, _mm512_add_epi32) PAIR_OUT(1, _mm512_reduce_add_epi32, _mm512_add_epi32)
  PAIR_OUT(2, _mm512_reduce_add_epi32, _mm512_add_epi32) PAIR_OUT(3, _mm512_reduce_add_epi32, _mm512_add_epi32)
}


/* Row pairs per block of gemv_pairs: their weights stay in L1 / L2 while the activation rows pass in
 * groups of 4. */
#define GEMV_BLOCK 16

/* The GEMVs of gemv_pairs. */
enum { GP_BF16, GP_INT8, GP_INT4, GP_F32, GP_F16 };

/* Rows w and v against R activation rows from x (row stride xs bytes) with the kernel of `kind`. */
static inline __attribute__((always_inline)) void pair_dot(int kind, int R, int pf, const uint8_t *x, size_t xs,
                                                           const uint8_t *w, const uint8_t *v, int64_t k,
                                                           float fo[4][2], int32_t io[4][2]) {
  if (kind == GP_BF16) {
    dot_bf16_2rows(R, pf, (const uint16_t *)x, xs / 2, (const uint16_t *)w, (const uint16_t *)v, k, fo);
  } else if (kind == GP_F32 || kind == GP_F16) {
    dot_f32_2rows(kind == GP_F32 ? TP_W_F32 : TP_W_F16, R, pf, (const float *)x, xs / 4, w, v, k, fo);
  } else {
    dot_cr_2rows(kind == GP_INT8, R, pf, (const int8_t *)x, xs, w, v, k, io);
  }
}

/* Output (row i, column j) from its sum: float_out (bf16, f32, f16) or tp_convrot_out (ConvRot). */
static inline __attribute__((always_inline)) float pair_out(const tp_mm *mm, int kind, int64_t i, int64_t j, float fs,
                                                            int32_t is) {
  if (kind == GP_BF16 || kind == GP_F32 || kind == GP_F16) return float_out(mm, fs, j);
  const int int8 = kind == GP_INT8;
  return tp_convrot_out(int8, is - (int8 ? 128 : 8) * mm->xsum[i], mm->xs[i], mm->w_scale[j], mm->bias, j);
}

/*
 * gemv_pairs, bf16 at m < 16: rows j and j + h together (h = half the range), two sequential weight
 * streams, as the GGUF GEMV reads them (the hardware prefetcher does not follow four adjacent rows, as
 * gemv_bf16_rows streams them; fp8 without AVX512_VBMI still takes that kernel), GEMV_BLOCK pairs at a
 * time, each block read from memory by the first group of up to 4 activation rows and from cache by the
 * others.
 */
/*
 * gemv_pairs, ConvRot at m < 16 (x: the activation codes, row stride xs): rows n0 + t and n0 + h + t
 * together (h = half the range), GEMV_BLOCK pairs at a time, each
 * block read from memory once (with the prefetch) by the first group of up to 4 activation rows and
 * from cache by the others. For m = 2 .. 15 it replaces the 4-row kernel (four adjacent weight rows
 * per step, all weights read again for every 4 activation rows, no prefetch for int4). Past M = 2 the
 * arithmetic, not memory, sets the pace.
 */
static inline __attribute__((always_inline)) void gemv_pairs(const tp_mm *mm, int kind, int one, int64_t n0, int64_t n1,
                                                             const uint8_t *x, size_t xs) {
  const int64_t m = one ? 1 : mm->m, h = (n1 - n0) / 2, n = mm->n; /* one: m = 1, a constant */
  const int64_t pairs = h + (n1 - n0) % 2;                           /* an odd last row pairs with itself */
  float fo[4][2];
  int32_t io[4][2];
  for (int64_t pb = 0; pb < pairs; pb += GEMV_BLOCK) {
    const int64_t pe = pb + GEMV_BLOCK < pairs ? pb + GEMV_BLOCK : pairs;
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int R = m - i0 < 4 ? (int)(m - i0) : 4;
      /* prefetch on the first pass over the block (bf16: only when there is more than one row) */
      const int pf = i0 == 0 && (kind != GP_BF16 || m > 1);
      const uint8_t *xi = x + (size_t)i0 * xs;
      for (int64_t p = pb; p < pe; p++) {
        const int64_t j = p < h ? n0 + p : n1 - 1, jv = p < h ? j + h : j;
        const uint8_t *w = mm->w + (size_t)j * mm->w_row, *v = mm->w + (size_t)jv * mm->w_row;
        const int pfp = pf && p < h;
        switch (R) {
          case 1: pair_dot(kind, 1, pfp, xi, xs, w, v, mm->k, fo, io); break;
          case 2: pair_dot(kind, 2, pfp, xi, xs, w, v, mm->k, fo, io); break;
          case 3: pair_dot(kind, 3, pfp, xi, xs, w, v, mm->k, fo, io); break;
          default: pair_dot(kind, 4, pfp, xi, xs, w, v, mm->k, fo, io); break;
        }
        for (int r = 0; r < R; r++) {
          const int64_t i = i0 + r;
          float *y = mm->y + (size_t)i * (size_t)n;
          y[j] = pair_out(mm, kind, i, j, fo[r][0], io[r][0]);
          if (jv != j) y[jv] = pair_out(mm, kind, i, jv, fo[r][1], io[r][1]);
        }
      }
    }
  }
}

/* Instances: bf16, int8 / int4 ConvRot, f32 / f16, each for m = 1 (decoding; the row-group loop compiled away)
 * and m > 1. */
#define GP_FN(NAME, KIND, ONE, X, XS)                                                 \
  static __attribute__((noinline)) void NAME(const tp_mm *mm, int64_t n0, int64_t n1) { \
    gemv_pairs(mm, KIND, ONE, n0, n1, X, XS);                                         \
  }
GP_FN(gemv_bf16_m1, GP_BF16, 1, mm->xq, mm->xq_row)
GP_FN(gemv_bf16_many, GP_BF16, 0, mm->xq, mm->xq_row)
GP_FN(gemv_convrot_int8_m1, GP_INT8, 1, mm->xq, mm->xq_row)
GP_FN(gemv_convrot_int8, GP_INT8, 0, mm->xq, mm->xq_row)
GP_FN(gemv_f32_m1_f32, GP_F32, 1, (const uint8_t *)mm->x, (size_t)mm->k * 4)
GP_FN(gemv_f32_many_f32, GP_F32, 0, (const uint8_t *)mm->x, (size_t)mm->k * 4)
GP_FN(gemv_f32_m1_f16, GP_F16, 1, (const uint8_t *)mm->x, (size_t)mm->k * 4)
GP_FN(gemv_f32_many_f16, GP_F16, 0, (const uint8_t *)mm->x, (size_t)mm->k * 4)
#undef GP_FN
/* int4 reads the activations rearranged (xp, rows of kp bytes) */
static __attribute__((noinline)) void gemv_convrot_int4_m1(const tp_mm *mm, int64_t n0, int64_t n1, const int8_t *xp,
                                                           size_t kp) {
  gemv_pairs(mm, GP_INT4, 1, n0, n1, (const uint8_t *)xp, kp);
}
static __attribute__((noinline)) void gemv_convrot_int4(const tp_mm *mm, int64_t n0, int64_t n1, const int8_t *xp,
                                                        size_t kp) {
  gemv_pairs(mm, GP_INT4, 0, n0, n1, (const uint8_t *)xp, kp);
}

static void gemv_convrot(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  const int64_t k = mm->k;
  const int int8 = mm->fmt == TP_W_INT8_CONVROT;
  const int64_t kp = (k + 127) / 128 * 128;
  int8_t *xp = NULL;
  if (!int8) {
    xp = (int8_t *)scratch; /* m < 16 rows of kp: tp_mm_task_scratch */
    for (int64_t i = 0; i < mm->m; i++) {
      const int8_t *q = (const int8_t *)(mm->xq + (size_t)i * mm->xq_row);
      int8_t *p = xp + (size_t)i * (size_t)kp;
      memset(p, 0, (size_t)kp);
      for (int64_t t = 0; t < k; t += 2) {
        const int64_t c = t / 128 * 128, e = (t - c) / 2;
        p[c + e] = q[t];
        p[c + 64 + e] = q[t + 1];
      }
    }
  }
  if (int8) (mm->m == 1 ? gemv_convrot_int8_m1 : gemv_convrot_int8)(mm, n0, n1);
  else (mm->m == 1 ? gemv_convrot_int4_m1 : gemv_convrot_int4)(mm, n0, n1, xp, (size_t)kp);
}

/* ------------------------------------------------------------------------------------------ */
/* packed GEMM                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* The three element kinds of the GEMM: int8 codes (4 per lane), bf16 (2 per lane), f32 (1 per lane). */
enum { G_I8 = 0, G_BF16 = 1, G_F32 = 2 };

/* k per 32-bit lane, bytes per activation element, KC (a multiple of 4: B strip NR × KC fits in L1). */
static const int g_kstep[3] = {4, 2, 1};
static const int g_abytes[3] = {1, 2, 4};
static const int g_kc[3] = {512, 256, 128};

/* One packed lane: step q of the block [k0, k0 + kc) of a weight row (zero past the block). */
static inline uint32_t pack_one(const tp_mm *mm, int g, const uint8_t *row, int64_t k0, int64_t kc, int64_t q) {
  if (g == G_I8) {
    if (mm->fmt == TP_W_INT8_CONVROT) return tp_rd32(row + k0 + 4 * q) ^ 0x80808080u;
    /* int4: 4 codes from 2 bytes, each nibble n → n ^ 8 (= q + 8) */
    const uint16_t b2 = tp_rd16(row + (k0 + 4 * q) / 2) ^ 0x8888u;
    return (uint32_t)(b2 & 15) | (uint32_t)((b2 >> 4) & 15) << 8 | (uint32_t)((b2 >> 8) & 15) << 16 |
           (uint32_t)(b2 >> 12) << 24;
  }
  if (g == G_BF16) {
    uint16_t v[2] = {0, 0};
    for (int e = 0; e < 2; e++) {
      const int64_t t = k0 + 2 * q + e;
      if (t >= k0 + kc) break;
      if (mm->fmt == TP_W_BF16) v[e] = tp_rd16(row + 2 * t);
      else v[e] = (uint16_t)(tp_f32_bits(mm->fmt == TP_W_F8_E4M3FN ? tp_e4m3_f32(row[t]) : tp_e5m2_f32(row[t])) >> 16);
    }
    return (uint32_t)v[0] | (uint32_t)v[1] << 16;
  }
  const int64_t t = k0 + q;
  return tp_f32_bits(mm->fmt == TP_W_F32 ? tp_rdf32(row + 4 * t) : tp_f16p(row + 2 * t));
}

/*
 * Transpose 16 × 16 dwords in place: r[i] lane j ↔ r[j] lane i (unpack 32, unpack 64, then 128-bit
 * shuffles in two stages; 64 shuffles for 16 vectors, a few times cheaper than 16 gathers here).
 */
static inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  /* r[4b + c] now holds, per 128-bit lane L, dword c of rows 4b..4b+3 at the row block of lane L */
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

/*
 * Steps [0, 2·pairs) of 16 whole columns (row pointers at w + (j + c)·w_row) with gathers: each 32-bit
 * gather reads 4 bytes of every row at the same offset. Writes out[q · NR + c] for c < 16. Returns the
 * number of steps done (the caller packs the rest with pack_one).
 */
static int64_t pack16(const tp_mm *mm, int g, int64_t j, int64_t k0, int64_t kc, uint32_t *out) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int32_t)mm->w_row));
  const uint8_t *base = mm->w + (size_t)j * mm->w_row;
  /* evens / odds of the dword pairs (c, c') of unpacked 128-bit lanes: see the int4 / fp8 cases */
  const __m512i even = _mm512_set_epi32(30, 28, 14, 12, 26, 24, 10, 8, 22, 20, 6, 4, 18, 16, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  int64_t q = 0;
  if (mm->w_row > (size_t)INT32_MAX / 16) return 0; /* gather offsets are 32-bit */
  if (g == G_BF16 && mm->fmt != TP_W_BF16) {
    /* fp8: 32 bytes (16 steps of 2) of each of the 16 rows, widened to bf16 exactly, transposed */
    const int e4 = mm->fmt == TP_W_F8_E4M3FN;
    const int64_t steps = kc / 2;
    for (; q + 16 <= steps; q += 16) {
      __m512i r[16];
      for (int c = 0; c < 16; c++) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(base + (size_t)c * mm->w_row + (size_t)(k0 + 2 * q)));
        r[c] = e4 ? e4m3_bf16(b) : e5m2_bf16(b);
      }
      transpose16(r);
      for (int i = 0; i < 16; i++) _mm512_store_si512(out + (q + i) * NR, r[i]);
    }
  }
  if ((g == G_I8 && mm->fmt == TP_W_INT8_CONVROT) || (g == G_BF16 && mm->fmt == TP_W_BF16)) {
    /* 16 steps at a time: 64 bytes of each of the 16 rows, transposed */
    const int64_t bytes = g == G_I8 ? 1 : 2; /* per k */
    const int64_t steps = g == G_I8 ? kc / 4 : kc / 2;
    const __m512i flip = g == G_I8 ? _mm512_set1_epi32((int32_t)0x80808080u) : _mm512_setzero_si512();
    for (; q + 16 <= steps; q += 16) {
      __m512i r[16];
      for (int c = 0; c < 16; c++) r[c] = _mm512_loadu_si512(base + (size_t)c * mm->w_row + (size_t)(bytes * (k0 + 4 / bytes * q)));
      transpose16(r);
      for (int i = 0; i < 16; i++) _mm512_store_si512(out + (q + i) * NR, _mm512_xor_si512(r[i], flip));
    }
  }
  if (g == G_I8 && mm->fmt == TP_W_INT8_CONVROT) {
    const int64_t steps = kc / 4;
    for (; q < steps; q++) {
      const __m512i v = _mm512_i32gather_epi32(rows, base + k0 + 4 * q, 1);
      _mm512_store_si512(out + q * NR, _mm512_xor_si512(v, _mm512_set1_epi32((int32_t)0x80808080u)));
    }
  } else if (g == G_I8) {
    /* int4: 4 bytes = 8 codes = steps q, q + 1 */
    const int64_t pairs = kc / 8;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    for (int64_t p = 0; p < pairs; p++, q += 2) {
      const __m512i v = _mm512_xor_si512(_mm512_i32gather_epi32(rows, base + (k0 + 8 * p) / 2, 1),
                                         _mm512_set1_epi32((int32_t)0x88888888u));
      const __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
      /* per 128-bit lane of columns c0..c3: L = [c0 q, c0 q', c1 q, c1 q'], H = [c2 q, c2 q', c3 q, c3 q'] */
      const __m512i L = _mm512_unpacklo_epi8(lo, hi), H = _mm512_unpackhi_epi8(lo, hi);
      _mm512_store_si512(out + q * NR, _mm512_permutex2var_epi32(L, even, H));
      _mm512_store_si512(out + (q + 1) * NR, _mm512_permutex2var_epi32(L, odd, H));
    }
  } else if (g == G_BF16 && mm->fmt == TP_W_BF16) {
    const int64_t steps = kc / 2; /* whole pairs; an odd tail reads past the row: pack_one */
    for (; q < steps; q++) _mm512_store_si512(out + q * NR, _mm512_i32gather_epi32(rows, base + 2 * (k0 + 2 * q), 1));
  } else if (g == G_BF16) {
    /* fp8: 4 bytes = 4 values = steps q, q + 1 (after the transposed blocks above: q is a multiple of 16) */
    const int64_t pairs = kc / 4;
    const int e4 = mm->fmt == TP_W_F8_E4M3FN;
    for (int64_t p = q / 2; p < pairs; p++, q += 2) {
      const __m512i v = _mm512_i32gather_epi32(rows, base + k0 + 4 * p, 1);
      const __m256i v0 = _mm512_castsi512_si256(v), v1 = _mm512_extracti64x4_epi64(v, 1);
      /* A: columns 0..7, dwords (c q, c q'); B: columns 8..15 */
      const __m512i A = e4 ? e4m3_bf16(v0) : e5m2_bf16(v0), B = e4 ? e4m3_bf16(v1) : e5m2_bf16(v1);
      const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
      _mm512_store_si512(out + q * NR, _mm512_permutex2var_epi32(A, ev, B));
      _mm512_store_si512(out + (q + 1) * NR, _mm512_permutex2var_epi32(A, _mm512_add_epi32(ev, _mm512_set1_epi32(1)), B));
    }
  } else if (mm->fmt == TP_W_F32) {
    for (; q < kc; q++) _mm512_store_si512(out + q * NR, _mm512_i32gather_epi32(rows, base + 4 * (k0 + q), 1));
  } else {
    /* f16: 4 bytes = steps q, q + 1 */
    const int64_t pairs = kc / 2;
    for (int64_t p = 0; p < pairs; p++, q += 2) {
      const __m512i v = _mm512_i32gather_epi32(rows, base + 2 * (k0 + 2 * p), 1);
      _mm512_store_ps((float *)(out + q * NR), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
      _mm512_store_ps((float *)(out + (q + 1) * NR), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
    }
  }
  return q;
}

/*
 * Pack weight rows [j0, j0 + nc) × inputs [k0, k0 + kc) into nc/NR strips; strip s holds, for each
 * step q (kstep inputs), NR lanes of 32 bits: lane c = inputs k0 + q·kstep .. of column j0 + s·NR + c.
 * Columns past nc and inputs past the block are zero.
 */
static void pack_b(const tp_mm *mm, int g, int64_t j0, int64_t nc, int64_t k0, int64_t kc, uint8_t *dst) {
  const int64_t steps = (kc + g_kstep[g] - 1) / g_kstep[g];
  const int64_t strips = (nc + NR - 1) / NR;
  for (int64_t s = 0; s < strips; s++) {
    uint32_t *out = (uint32_t *)(dst + (size_t)s * (size_t)steps * NR * 4);
    for (int64_t v = 0; v < NR / 16; v++) {
      const int64_t c0 = s * NR + 16 * v;
      const int64_t done = c0 + 16 <= nc ? pack16(mm, g, j0 + c0, k0, kc, out + 16 * v) : 0;
      for (int64_t c = c0; c < c0 + 16; c++) {
        if (c >= nc) {
          for (int64_t q = 0; q < steps; q++) out[q * NR + (c - s * NR)] = 0;
          continue;
        }
        const uint8_t *row = mm->w + (size_t)(j0 + c) * mm->w_row;
        for (int64_t q = done; q < steps; q++) out[q * NR + (c - s * NR)] = pack_one(mm, g, row, k0, kc, q);
      }
    }
  }
}

/* Lanes of column vector v (0..3) of a tile with `ncols` valid columns. */
static inline __mmask16 col_mask(int ncols, int v) {
  const int left = ncols - 16 * v;
  return left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/*
 * Epilogue of one 16-column vector of a tile: row i, columns j + 16v .. (`ncols` valid from j). The
 * partial sums live at part + 16v (row i's stretch of the partial-sum buffer), or in y when part is
 * NULL. first: the tile started from zero (else add the partial sum); last: write the final value to y
 * (else the partial sum, int32 for G_I8).
 */
static inline __attribute__((always_inline)) void tile_store(const tp_mm *mm, int g, __m512i s, int64_t i, int64_t j,
                                                             int v, int ncols, int first, int last, float *part) {
  const __mmask16 cm = col_mask(ncols, v);
  if (cm == 0) return;
  float *yv = mm->y + (size_t)i * (size_t)mm->n + (size_t)(j + 16 * v);
  float *pv = part != NULL ? part + 16 * v : yv;
  if (!first) {
    const __m512i old = _mm512_maskz_loadu_epi32(cm, pv);
    s = g == G_I8 ? _mm512_add_epi32(s, old)
                  : _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(s), _mm512_castsi512_ps(old)));
  }
  if (!last) {
    _mm512_mask_storeu_epi32(pv, cm, s);
    return;
  }
  __m512 out;
  if (g == G_I8) {
    const int int8 = mm->fmt == TP_W_INT8_CONVROT;
    const __m512i exact = _mm512_sub_epi32(s, _mm512_set1_epi32((int8 ? 128 : 8) * mm->xsum[i]));
    const __m512 f = _mm512_cvtepi32_ps(exact);
    const __m512 sw = _mm512_maskz_loadu_ps(cm, mm->w_scale + j + 16 * v);
    const __m512 sx = _mm512_set1_ps(mm->xs[i]);
    out = int8 ? _mm512_mul_ps(f, _mm512_mul_ps(sx, sw)) : _mm512_mul_ps(_mm512_mul_ps(f, sx), sw);
  } else {
    out = _mm512_castsi512_ps(s);
    if (mm->has_scale) out = _mm512_mul_ps(out, _mm512_set1_ps(mm->scale));
  }
  if (mm->bias) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(cm, mm->bias + j + 16 * v));
  _mm512_mask_storeu_ps(yv, cm, out);
}

/* acc += b · broadcast(a) for the element kind g, on __m512i registers (bit casts are free). */
static inline __attribute__((always_inline)) __m512i madd(int g, __m512i acc, __m512i b, __m512i a) {
  if (g == G_I8) return _mm512_dpbusd_epi32(acc, b, a);
  if (g == G_BF16)
    return _mm512_castps_si512(_mm512_dpbf16_ps(_mm512_castsi512_ps(acc), (__m512bh)a, (__m512bh)b));
  return _mm512_castps_si512(
      _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), _mm512_castsi512_ps(acc)));
}

/*
 * One register tile: rows [i0, i0 + mr) × columns [j, j + ncols) of y over `steps` packed steps. a:
 * the activations of row i0 at the block's first input (row stride lda bytes, 4 bytes per step); b: the
 * packed strip (NR lanes of 4 bytes per step); part: the partial sums of (i0, j), row stride NC, or
 * NULL to keep them in y. Accumulators are named variables, not an array, so that they stay in
 * registers.
 */
static inline __attribute__((always_inline)) void tile(const tp_mm *mm, int g, int mr, const uint8_t *a, size_t lda,
                                                       const uint8_t *b, int64_t steps, int64_t i0, int64_t j,
                                                       int ncols, int first, int last, float *part) {
#define ACC_DECL(r) __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
  ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3) ACC_DECL(4) ACC_DECL(5)
#undef ACC_DECL
  const uint8_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda, *a5 = a + 5 * lda;
  /*
   * Fetch what the epilogue reads and writes while the tile runs (about 1 500 cycles ahead): its lines of
   * the partial sums (read unless first, written unless last) and of y (written when last, or holding
   * the partial sums) — by then they are in L2 or further, since the partial sums of all m rows (1 MiB at
   * m = 1024), the activation panel and the weight panel do not fit L2 together.
   */
  for (int r = 0; r < mr; r++) {
    const char *pr = part != NULL ? (const char *)(part + (size_t)r * NC) : NULL;
    const char *yr = (const char *)(mm->y + (size_t)(i0 + r) * (size_t)mm->n + (size_t)j);
    if (pr != NULL && !(first && last))
      for (int v = 0; v < 4; v++) _mm_prefetch(pr + 64 * v, _MM_HINT_T0); /* within the buffer's NC columns */
    if (last || pr == NULL)
      for (int v = 0; v < 4; v++)
        if (16 * v < ncols) _mm_prefetch(yr + 64 * v, _MM_HINT_T0);
  }
  for (int64_t q = 0; q < steps; q++) {
    const __m512i *bq = (const __m512i *)(b + (size_t)q * NR * 4);
    const __m512i b0 = _mm512_load_si512(bq), b1 = _mm512_load_si512(bq + 1), b2 = _mm512_load_si512(bq + 2),
                  b3 = _mm512_load_si512(bq + 3);
#define ROW(r)                                                                     \
  if (mr > r) {                                                                    \
    const __m512i av = _mm512_set1_epi32((int32_t)tp_rd32(a##r + 4 * (size_t)q)); \
    c##r##0 = madd(g, c##r##0, b0, av);                                            \
    c##r##1 = madd(g, c##r##1, b1, av);                                            \
    c##r##2 = madd(g, c##r##2, b2, av);                                            \
    c##r##3 = madd(g, c##r##3, b3, av);                                            \
  }
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
  }
#define STORE(r)                                                               \
  if (mr > r) {                                                                \
    float *pr = part != NULL ? part + (size_t)(r) * NC : NULL;                 \
    tile_store(mm, g, c##r##0, i0 + r, j, 0, ncols, first, last, pr);         \
    tile_store(mm, g, c##r##1, i0 + r, j, 1, ncols, first, last, pr);         \
    tile_store(mm, g, c##r##2, i0 + r, j, 2, ncols, first, last, pr);         \
    tile_store(mm, g, c##r##3, i0 + r, j, 3, ncols, first, last, pr);         \
  }
  STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
#undef STORE
}

#define TILE_FN(G, R)                                                                                          \
  static void tile_##G##_##R(const tp_mm *mm, const uint8_t *a, size_t lda, const uint8_t *b, int64_t steps, \
                             int64_t i0, int64_t j, int ncols, int first, int last, float *part) {             \
    tile(mm, G, R, a, lda, b, steps, i0, j, ncols, first, last, part);                                         \
  }
#define TILE_FNS(G) TILE_FN(G, 1) TILE_FN(G, 2) TILE_FN(G, 3) TILE_FN(G, 4) TILE_FN(G, 5) TILE_FN(G, 6)
TILE_FNS(G_I8)
TILE_FNS(G_BF16)
TILE_FNS(G_F32)

typedef void (*tile_fn)(const tp_mm *mm, const uint8_t *a, size_t lda, const uint8_t *b, int64_t steps, int64_t i0,
                        int64_t j, int ncols, int first, int last, float *part);
static const tile_fn tiles[3][MR + 1] = {
    {NULL, tile_G_I8_1, tile_G_I8_2, tile_G_I8_3, tile_G_I8_4, tile_G_I8_5, tile_G_I8_6},
    {NULL, tile_G_BF16_1, tile_G_BF16_2, tile_G_BF16_3, tile_G_BF16_4, tile_G_BF16_5, tile_G_BF16_6},
    {NULL, tile_G_F32_1, tile_G_F32_2, tile_G_F32_3, tile_G_F32_4, tile_G_F32_5, tile_G_F32_6},
};

/* GEMM of output columns [n0, n1) (see the file comment for the loop order). */
static void gemm(const tp_mm *mm, int g, int64_t n0, int64_t n1, uint8_t *scratch) {
  const int64_t k = mm->k;
  const int64_t kc_max = g_kc[g];
  const int kstep = g_kstep[g];
  uint8_t *bp = scratch; /* NC × KC × 4 bytes: TP_MM_PANEL_BYTES */
  /* partial sums of rows [0, m) × the block's columns, row stride NC (matmul.h tp_mm_task_scratch) */
  float *part = k > kc_max && mm->part_bytes > 0 ? (float *)(scratch + tp_mm_part_offset()) : NULL;
  const uint8_t *abase = g == G_F32 ? (const uint8_t *)mm->x : mm->xq;
  const size_t lda = g == G_F32 ? (size_t)k * 4 : mm->xq_row;
  for (int64_t jc = n0; jc < n1; jc += NC) {
    const int64_t nc = n1 - jc < NC ? n1 - jc : NC;
    for (int64_t pc = 0; pc < k || pc == 0; pc += kc_max) {
      const int64_t kc = k - pc < kc_max ? k - pc : kc_max;
      const int64_t steps = (kc + kstep - 1) / kstep;
      pack_b(mm, g, jc, nc, pc, kc, bp);
      const int first = pc == 0, last = pc + kc >= k;
      for (int64_t i0 = 0; i0 < mm->m; i0 += MR) {
        const int mr = mm->m - i0 < MR ? (int)(mm->m - i0) : MR;
        const uint8_t *a = abase + (size_t)i0 * lda + (size_t)pc * (size_t)g_abytes[g];
        for (int64_t s = 0; s * NR < nc; s++) {
          const int ncols = nc - s * NR < NR ? (int)(nc - s * NR) : NR;
          tiles[g][mr](mm, a, lda, bp + (size_t)s * (size_t)steps * NR * 4, steps, i0, jc + s * NR, ncols, first,
                       last, part != NULL ? part + (size_t)i0 * NC + (size_t)(s * NR) : NULL);
        }
      }
      if (k == 0) break;
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* family entry points                                                                          */
/* ------------------------------------------------------------------------------------------ */

void tp_mm_convrot_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  if (mm->m < TP_GEMM_MIN_M) gemv_convrot(mm, n0, n1, scratch);
  else gemm(mm, G_I8, n0, n1, scratch);
}

void tp_mm_float_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  const int bf16 = mm->act == TP_ACT_BF16;
  if (mm->m < TP_GEMM_MIN_M) {
    if (bf16) gemv_bf16(mm, n0, n1, scratch);
    else gemv_f32(mm, n0, n1);
  } else {
    gemm(mm, bf16 ? G_BF16 : G_F32, n0, n1, scratch);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* GGUF GEMM (every GGUF type): block-scaled int8 products                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * y = x · Wᵀ for every GGUF weight type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and
 * m ≥ TP_GGML_GEMM_MIN_M activation rows (prompt processing), the same packed loop nest as the GEMM
 * above with the scales of 32-element blocks (Q2_K, Q3_K, Q6_K: 16): for each block b, a 4 × 32 register tile sums
 * the exact int32 products of the block
 *   t(i, j) = Σ_e u_w(j, e) · q_a(i, e) − off · Σ_e q_a(i, e)        (starting from −off · Σq_a)
 * with the weights as the unsigned operand of vpdpbusd (Q4_0: the nibble u = q + 8, off = 8; Q5_0:
 * nibble + 16 · high bit, off = 16; Q8_0: u = q + 128, off = 128; Q3_K: 2 bits + 4 · hmask bit, off = 4;
 * Q6_K: u = q + 32, off = 32; Q2_K: 2 bits, Q4_1, Q4_K: the nibble, Q5_1, Q5_K: nibble + 16 · high bit,
 * off = 0), then adds d_w(j, b) · d_a(i, b) · t(i, j) to an f32 accumulator, and for the formats with a
 * min subtracts m_w(j, b) · s_a(i, b): Q2_K / Q4_K / Q5_K: m_w = dmin · min_b, the sub-block minimum,
 * s_a = d_a · Σq_a; Q4_1 / Q5_1: m_w = −m
 * (x = d · u + m), s_a the f16 s = d_a · Σq_a of the Q8_1 block (d_w = d · scale_b for the k-quants).
 * These are ggml's vec_dot_*_q8_0 / q8_1 / q8_K identities (llm.md §2.6), summed over blocks in f32
 * in another order.
 *
 * The weights are packed per NC_G columns × KB_G blocks into strips of 32 columns; per block, 8 steps
 * (16-element blocks: 4) of 32 lanes × 4 bytes (lane c: inputs 4q .. 4q + 3 of column c, unsigned), then the 32
 * column scales d_w as f32, then (formats with a min) the 32 m_w. The activations are ggml Q8_0 /
 * Q8_1 / Q8_K rows (mm->xq) with per-block scales as f32 (mm->xs) and code sums (mm->xsum), m × nb
 * each, from matmul.c.
 */
#define NC_G 64
#define NR_G 32
/*
 * Block kinds: 0 = 32-element blocks (Q8_0, Q4_0, Q5_0; Q8_0 activations); 1 = 32-element sub-blocks
 * with a min term (Q4_K, Q5_K; Q8_K activations); 2 = 16-element sub-blocks (Q6_K, whose scales are
 * per 16); 3 = 32-element blocks with a min term (Q4_1, Q5_1; Q8_1 activations, whose f16
 * s = d_a · Σq_a is the min term's factor, as ggml's vec_dot_q4_1_q8_1 takes it); 4 = 16-element
 * sub-blocks with a min term (Q2_K; Q8_K activations). Q3_K is kind 2 (16-element, no min).
 */
static inline int gg_kind(int32_t fmt) {
  if (fmt == TP_W_Q6_K || fmt == TP_W_Q3_K) return 2;
  if (fmt == TP_W_Q2_K) return 4;
  if (fmt == TP_W_Q4_K || fmt == TP_W_Q5_K) return 1;
  return fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1 ? 3 : 0;
}
/* kinds whose packed blocks carry a min m_w after d_w */
static inline int gg_min(int kind) { return kind == 1 || kind == 3 || kind == 4; }
/* elements per block, vpdpbusd steps per block, bytes of one packed block (codes, d_w, then m_w) */
static inline int gg_be(int kind) { return kind == 2 || kind == 4 ? 16 : 32; }
static inline size_t gg_codes(int kind) { return (size_t)(gg_be(kind) / 4) * NR_G * 4; }
static inline size_t gg_blk(int kind) { return gg_codes(kind) + NR_G * 4 * (gg_min(kind) ? 2 : 1); }
/*
 * Blocks per panel: whole 64-input chunks and whole super-blocks (8 32-blocks, 16 16-blocks), with the
 * panel of NC_G columns (gg_kb · gg_blk · NC_G / NR_G bytes) inside the task scratch,
 * TP_MM_PANEL_BYTES (131 136): 48 · 1280 · 2 = 122 880 for the 32-blocks with a min (the most),
 * 96 · 640 · 2 = 122 880 for Q3_K / Q6_K, 80 · 768 · 2 = 122 880 for Q2_K.
 */
static inline int64_t gg_kb(int kind) { return gg_be(kind) == 32 ? 48 : gg_min(kind) ? 80 : 96; }
_Static_assert(48 * (8 + 2) * NR_G * 4 * (NC_G / NR_G) <= TP_MM_PANEL_BYTES &&
                   96 * (4 + 1) * NR_G * 4 * (NC_G / NR_G) <= TP_MM_PANEL_BYTES &&
                   80 * (4 + 2) * NR_G * 4 * (NC_G / NR_G) <= TP_MM_PANEL_BYTES,
               "a GGUF GEMM panel must fit the task scratch");

/* Unpacked unsigned codes of blocks b, b + 1 (b even) of one weight row (64 bytes; a missing b + 1: any). */
static inline __m512i ggml_codes2(int32_t fmt, const uint8_t *row, int64_t b, int two) {
  if (fmt == TP_W_Q8_0) {
    const uint8_t *p = row + (size_t)b * 34;
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(p + 2));
    const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(p + 36)) : _mm256_set1_epi8((char)0x80);
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
  }
  const __m512i nib = _mm512_set1_epi8(0x0F);
  if (fmt == TP_W_Q4_K || fmt == TP_W_Q5_K) {
    /* sub-blocks 2p, 2p + 1 of a super-block: the low, then the high nibbles of the same 32 bytes */
    const int five = fmt == TP_W_Q5_K;
    const uint8_t *sb = row + (size_t)(b / 8) * (five ? 176 : 144);
    const int p = (int)((b % 8) / 2);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(sb + (five ? 48 : 16) + 32 * p));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
    __m512i u = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), nib);
    if (five) {
      /* Q5_K: + 16 · bit j of qh[e] for sub-block j = 2p (low half), 2p + 1 (high half) */
      const __m256i h = _mm256_loadu_si256((const __m256i *)(sb + 16));
      const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
      const __m512i cnt = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * p))),
                                             _mm256_set1_epi16((short)(2 * p + 1)), 1);
      const __m512i bit = _mm512_and_si512(_mm512_srlv_epi16(hv, cnt), _mm512_set1_epi8(1));
      u = _mm512_or_si512(u, _mm512_slli_epi16(bit, 4));
    }
    return u;
  }
  if (fmt == TP_W_Q2_K || fmt == TP_W_Q3_K) {
    /*
     * 32-sub-blocks b, b + 1 (b even) = elements 32j .. 32j + 63 of half n (j = b % 4 ∈ {0, 2}): bits
     * 2j, 2j + 1 (then 2j + 2, 2j + 3) of qs[32n .. 32n + 31]; Q3_K: + 4 · bit 4n + j (+ 1) of hmask[0 .. 31]
     * (u = q + 4, ggml subtracts 4 where that bit is clear)
     */
    const int three = fmt == TP_W_Q3_K;
    const uint8_t *sb = row + (size_t)(b / 8) * (three ? 110 : 84);
    const int n = (int)((b % 8) / 4), j = (int)(b % 4);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(sb + (three ? 32 : 16) + 32 * n));
    const __m512i qv = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
    const __m512i cnt = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * j))),
                                           _mm256_set1_epi16((short)(2 * j + 2)), 1);
    __m512i u = _mm512_and_si512(_mm512_srlv_epi16(qv, cnt), _mm512_set1_epi8(3));
    if (three) {
      const __m256i h = _mm256_loadu_si256((const __m256i *)sb);
      const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
      const __m512i hc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(4 * n + j))),
                                            _mm256_set1_epi16((short)(4 * n + j + 1)), 1);
      u = _mm512_or_si512(u, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hv, hc), _mm512_set1_epi8(1)), 2));
    }
    return u;
  }
  if (fmt == TP_W_Q6_K) {
    /* 32-sub-blocks b, b + 1 (b even) = quarter t, t + 1 of half hh: ql nibbles | 2 bits of qh << 4 */
    const uint8_t *sb = row + (size_t)(b / 8) * 210;
    const int hh = (int)((b % 8) / 4), t = (int)(b % 4);
    const __m512i ql = _mm512_loadu_si512(sb + 64 * hh);
    const __m512i lo = t < 2 ? _mm512_and_si512(ql, nib) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), nib);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * hh));
    const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
    const __m512i cnt = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * t))),
                                           _mm256_set1_epi16((short)(2 * t + 2)), 1);
    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(hv, cnt), _mm512_set1_epi8(3));
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
  }
  /*
   * Q4_0, Q4_1, Q5_0, Q5_1: 128-bit lanes [qs_b & 15, qs_b >> 4, qs_b1 & 15, qs_b1 >> 4] = elements
   * 0..31 of b, then of b + 1; Q5: + 16 where bit e of the block's qh is set (lane order = bit order)
   */
  const size_t bb = (size_t)tp_wformats[fmt].block_bytes;
  const int five = fmt == TP_W_Q5_0 || fmt == TP_W_Q5_1;
  /* codes after d (Q4_0), d m (Q4_1), d qh (Q5_0), d m qh (Q5_1) */
  const size_t qs = fmt == TP_W_Q4_0 ? 2 : fmt == TP_W_Q4_1 ? 4 : fmt == TP_W_Q5_0 ? 6 : 8;
  const uint8_t *p = row + (size_t)b * bb;
  const __m128i q0 = _mm_loadu_si128((const __m128i *)(p + qs));
  const __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(p + bb + qs)) : _mm_setzero_si128();
  __m512i v = _mm512_castsi128_si512(q0);
  v = _mm512_inserti32x4(v, q0, 1);
  v = _mm512_inserti32x4(v, q1, 2);
  v = _mm512_inserti32x4(v, q1, 3);
  __m512i u = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), nib);
  if (five) {
    const size_t qh = qs - 4;
    const uint64_t bits = (uint64_t)tp_rd32(p + qh) | (two ? (uint64_t)tp_rd32(p + bb + qh) << 32 : 0);
    u = _mm512_mask_add_epi8(u, (__mmask64)bits, u, _mm512_set1_epi8(16));
  }
  return u;
}

/* d_w and, for the types with a min, m_w of block b (16-element types: of 16-block b) of one weight row, as f32. */
static inline void ggml_scales(int32_t fmt, const uint8_t *row, int64_t b, float *dw, float *mw) {
  if (fmt == TP_W_Q8_0) {
    *dw = _cvtsh_ss(tp_rd16(row + (size_t)b * 34));
  } else if (fmt == TP_W_Q4_0 || fmt == TP_W_Q5_0) {
    *dw = _cvtsh_ss(tp_rd16(row + (size_t)b * (size_t)tp_wformats[fmt].block_bytes));
  } else if (fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1) {
    /* x = d · u + m: the tile subtracts m_w · s_a, so m_w = −m */
    const uint8_t *p = row + (size_t)b * (size_t)tp_wformats[fmt].block_bytes;
    *dw = _cvtsh_ss(tp_rd16(p));
    *mw = -_cvtsh_ss(tp_rd16(p + 2));
  } else if (fmt == TP_W_Q6_K) {
    const uint8_t *sb = row + (size_t)(b / 16) * 210;
    *dw = _cvtsh_ss(tp_rd16(sb + 208)) * (float)(int8_t)sb[192 + b % 16];
  } else if (fmt == TP_W_Q2_K) {
    /* 16-block t: 4-bit scale (low) and min (high) of scales[t]; x = d · scale · q − dmin · min */
    const uint8_t *sb = row + (size_t)(b / 16) * 84, sc = sb[b % 16];
    *dw = _cvtsh_ss(tp_rd16(sb + 80)) * (float)(sc & 0xF);
    *mw = _cvtsh_ss(tp_rd16(sb + 82)) * (float)(sc >> 4);
  } else if (fmt == TP_W_Q3_K) {
    /* 16-block t: d · the signed 6-bit scale t */
    const uint8_t *sb = row + (size_t)(b / 16) * 110;
    *dw = _cvtsh_ss(tp_rd16(sb + 108)) * (float)tp_q3k_scale(sb + 96, (int)(b % 16));
  } else {
    const uint8_t *sb = row + (size_t)(b / 8) * (fmt == TP_W_Q5_K ? 176 : 144), *sc = sb + 4;
    const int j = (int)(b % 8);
    /* 6-bit scale and min of sub-block j (ggml get_scale_min_k4) */
    const uint8_t scale = j < 4 ? (sc[j] & 63) : (uint8_t)((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
    const uint8_t min = j < 4 ? (sc[j + 4] & 63) : (uint8_t)((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
    *dw = _cvtsh_ss(tp_rd16(sb)) * (float)scale;
    *mw = _cvtsh_ss(tp_rd16(sb + 2)) * (float)min;
  }
}

/*
 * Pack columns [j0, j0 + nc) × blocks [b0, b0 + kb) (see above); columns past nc: zero scales. Codes go
 * 64 inputs at a time (16 steps: two 32-blocks or four 16-blocks), one transpose per 16 columns.
 */
static void ggml_pack(const tp_mm *mm, int64_t j0, int64_t nc, int64_t b0, int64_t kb, uint8_t *dst) {
  const int kind = gg_kind(mm->fmt);
  const size_t blk = gg_blk(kind), codes = gg_codes(kind);
  const int64_t per = 64 / gg_be(kind); /* blocks per 64 inputs */
  const int64_t steps = gg_be(kind) / 4;
  for (int64_t s = 0; s * NR_G < nc; s++) {
    uint8_t *strip = dst + (size_t)s * (size_t)kb * blk;
    for (int64_t h = 0; h < NR_G / 16; h++) {
      const int64_t c0 = s * NR_G + 16 * h;
      for (int64_t b = 0; b < kb; b += per) {
        const int64_t have = kb - b < per ? kb - b : per; /* < per only for an odd Q8_0 / Q4_0 tail */
        const int64_t b32 = (b0 + b) * gg_be(kind) / 32;  /* the first 32-block of the 64 inputs */
        __m512i r[16];
        for (int c = 0; c < 16; c++) {
          r[c] = c0 + c < nc ? ggml_codes2(mm->fmt, mm->w + (size_t)(j0 + c0 + c) * mm->w_row, b32, have * gg_be(kind) > 32)
                             : _mm512_setzero_si512();
        }
        transpose16(r); /* r[q]: dword q (inputs 4q .. 4q + 3 of the 64) of the 16 columns */
        for (int64_t i = 0; i < have; i++)
          for (int64_t q = 0; q < steps; q++)
            _mm512_store_si512(strip + (size_t)(b + i) * blk + (size_t)q * NR_G * 4 + 64 * h, r[i * steps + q]);
      }
      for (int64_t b = 0; b < kb; b++) {
        float d[16], m[16];
        for (int c = 0; c < 16; c++) {
          d[c] = m[c] = 0.0f;
          if (c0 + c < nc) ggml_scales(mm->fmt, mm->w + (size_t)(j0 + c0 + c) * mm->w_row, b0 + b, &d[c], &m[c]);
        }
        _mm512_store_ps((float *)(strip + (size_t)b * blk + codes + 64 * h), _mm512_loadu_ps(d));
        if (gg_min(kind)) _mm512_store_ps((float *)(strip + (size_t)b * blk + codes + NR_G * 4 + 64 * h), _mm512_loadu_ps(m));
      }
    }
  }
}

/* Byte offset of the codes of block b in a prepared activation row (Q8_0; Q8_1; Q8_K by 32 or by 16). */
static inline size_t act_at(int kind, int64_t b) {
  if (kind == 2 || kind == 4) return (size_t)(b / 16) * 292 + 4 + 16 * (size_t)(b % 16);
  if (kind == 3) return (size_t)b * 36 + 4;
  return kind == 1 ? (size_t)(b / 8) * 292 + 4 + 32 * (size_t)(b % 8) : (size_t)b * 34 + 2;
}

/*
 * Rows [i0, i0 + mr) × the 32 columns of one strip over blocks [b0, b0 + kb): partial f32 sums added
 * to y (first: written), then the bias (last).
 */
static inline __attribute__((always_inline)) void ggml_tile(const tp_mm *mm, int kind, int mr, int64_t i0, int64_t j,
                                                            int ncols, const uint8_t *strip, int64_t b0, int64_t kb,
                                                            int first, int last) {
  const int64_t nb = mm->k / gg_be(kind);
  const size_t blk = gg_blk(kind), codes = gg_codes(kind);
  const int kq = gg_min(kind);
  const int32_t off = mm->fmt == TP_W_Q8_0   ? 128
                      : mm->fmt == TP_W_Q4_0 ? 8
                      : mm->fmt == TP_W_Q5_0 ? 16
                      : mm->fmt == TP_W_Q6_K ? 32
                      : mm->fmt == TP_W_Q3_K ? 4
                                             : 0;
  __m512 f00 = _mm512_setzero_ps(), f01 = f00, f10 = f00, f11 = f00, f20 = f00, f21 = f00, f30 = f00, f31 = f00;
  const uint8_t *a0 = mm->xq + (size_t)i0 * mm->xq_row, *a1 = a0 + mm->xq_row, *a2 = a1 + mm->xq_row,
                *a3 = a2 + mm->xq_row;
  const float *d0 = mm->xs + (size_t)i0 * (size_t)nb, *d1 = d0 + nb, *d2 = d1 + nb, *d3 = d2 + nb;
  const int32_t *s0 = mm->xsum + (size_t)i0 * (size_t)nb, *s1 = s0 + nb, *s2 = s1 + nb, *s3 = s2 + nb;
  for (int64_t b = 0; b < kb; b++) {
    const uint8_t *pb = strip + (size_t)b * blk;
    const int64_t ab = b0 + b;
    const size_t ao = act_at(kind, ab);
    __m512i t00, t01, t10, t11, t20, t21, t30, t31;
#define INIT(r)                                                              \
  if (mr > r) {                                                              \
    t##r##0 = _mm512_set1_epi32(-off * s##r[ab]);                            \
    t##r##1 = t##r##0;                                                       \
  }
    INIT(0) INIT(1) INIT(2) INIT(3)
#undef INIT
    for (int q = 0; q < gg_be(kind) / 4; q++) {
      const __m512i w0 = _mm512_load_si512(pb + q * NR_G * 4), w1 = _mm512_load_si512(pb + q * NR_G * 4 + 64);
#define STEP(r)                                                                   \
  if (mr > r) {                                                                   \
    const __m512i av = _mm512_set1_epi32((int32_t)tp_rd32(a##r + ao + 4 * q));    \
    t##r##0 = _mm512_dpbusd_epi32(t##r##0, w0, av);                               \
    t##r##1 = _mm512_dpbusd_epi32(t##r##1, w1, av);                               \
  }
      STEP(0) STEP(1) STEP(2) STEP(3)
#undef STEP
    }
    const __m512 dw0 = _mm512_load_ps((const float *)(pb + codes)), dw1 = _mm512_load_ps((const float *)(pb + codes + 64));
    const __m512 mw0 = kq ? _mm512_load_ps((const float *)(pb + codes + 128)) : dw0,
                 mw1 = kq ? _mm512_load_ps((const float *)(pb + codes + 192)) : dw1;
#define SCALE(r)                                                                            \
  if (mr > r) {                                                                             \
    const __m512 da = _mm512_set1_ps(d##r[ab]);                                             \
    f##r##0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t##r##0), _mm512_mul_ps(dw0, da), f##r##0); \
    f##r##1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t##r##1), _mm512_mul_ps(dw1, da), f##r##1); \
    if (kq) {                                                                               \
      /* s_a: Q8_1's own f16 d·Σq (kind 3), else d_a · Σq_a */                              \
      const float sa = kind == 3 ? tp_f16p(a##r + ao - 2) : d##r[ab] * (float)s##r[ab];     \
      const __m512 ms = _mm512_set1_ps(sa);                                                 \
      f##r##0 = _mm512_fnmadd_ps(mw0, ms, f##r##0);                                         \
      f##r##1 = _mm512_fnmadd_ps(mw1, ms, f##r##1);                                         \
    }                                                                                       \
  }
    SCALE(0) SCALE(1) SCALE(2) SCALE(3)
#undef SCALE
  }
#define OUT(r, v)                                                                                 \
  if (mr > r) {                                                                                   \
    const __mmask16 cm = col_mask(ncols, v);                                                      \
    if (cm) {                                                                                     \
      float *yv = mm->y + (size_t)(i0 + r) * (size_t)mm->n + (size_t)(j + 16 * v);                \
      __m512 o = f##r##v;                                                                         \
      if (!first) o = _mm512_add_ps(_mm512_maskz_loadu_ps(cm, yv), o);                            \
      if (last && mm->bias) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(cm, mm->bias + j + 16 * v)); \
      _mm512_mask_storeu_ps(yv, cm, o);                                                           \
    }                                                                                             \
  }
  OUT(0, 0) OUT(0, 1) OUT(1, 0) OUT(1, 1) OUT(2, 0) OUT(2, 1) OUT(3, 0) OUT(3, 1)
#undef OUT
}

#define GTILE_FN(K, R)                                                                                             \
  static void ggml_tile_##K##_##R(const tp_mm *mm, int64_t i0, int64_t j, int ncols, const uint8_t *strip,         \
                                  int64_t b0, int64_t kb, int first, int last) {                                   \
    ggml_tile(mm, K, R, i0, j, ncols, strip, b0, kb, first, last);                                                 \
  }
GTILE_FN(0, 1)
GTILE_FN(0, 2)
GTILE_FN(0, 3)
GTILE_FN(0, 4)
GTILE_FN(1, 1)
GTILE_FN(1, 2)
GTILE_FN(1, 3)
GTILE_FN(1, 4)
GTILE_FN(2, 1)
GTILE_FN(2, 2)
GTILE_FN(2, 3)
GTILE_FN(2, 4)
GTILE_FN(3, 1)
GTILE_FN(3, 2)
GTILE_FN(3, 3)
GTILE_FN(3, 4)
GTILE_FN(4, 1)
GTILE_FN(4, 2)
GTILE_FN(4, 3)
GTILE_FN(4, 4)
#undef GTILE_FN
typedef void (*ggml_tile_fn)(const tp_mm *mm, int64_t i0, int64_t j, int ncols, const uint8_t *strip, int64_t b0,
                             int64_t kb, int first, int last);
static const ggml_tile_fn ggml_tiles[5][5] = {{NULL, ggml_tile_0_1, ggml_tile_0_2, ggml_tile_0_3, ggml_tile_0_4},
                                              {NULL, ggml_tile_1_1, ggml_tile_1_2, ggml_tile_1_3, ggml_tile_1_4},
                                              {NULL, ggml_tile_2_1, ggml_tile_2_2, ggml_tile_2_3, ggml_tile_2_4},
                                              {NULL, ggml_tile_3_1, ggml_tile_3_2, ggml_tile_3_3, ggml_tile_3_4},
                                              {NULL, ggml_tile_4_1, ggml_tile_4_2, ggml_tile_4_3, ggml_tile_4_4}};

void tp_mm_ggml_gemm_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  const int kind = gg_kind(mm->fmt);
  const int64_t nb = mm->k / gg_be(kind), KB_G = gg_kb(kind);
  const size_t blk = gg_blk(kind);
  for (int64_t jc = n0; jc < n1; jc += NC_G) {
    const int64_t nc = n1 - jc < NC_G ? n1 - jc : NC_G;
    for (int64_t b0 = 0; b0 < nb; b0 += KB_G) {
      const int64_t kb = nb - b0 < KB_G ? nb - b0 : KB_G;
      ggml_pack(mm, jc, nc, b0, kb, scratch);
      const int first = b0 == 0, last = b0 + kb >= nb;
      for (int64_t i0 = 0; i0 < mm->m; i0 += 4) {
        const int mr = mm->m - i0 < 4 ? (int)(mm->m - i0) : 4;
        for (int64_t s = 0; s * NR_G < nc; s++) {
          const int ncols = nc - s * NR_G < NR_G ? (int)(nc - s * NR_G) : NR_G;
          ggml_tiles[kind][mr](mm, i0, jc + s * NR_G, ncols, scratch + (size_t)s * (size_t)kb * blk, b0, kb, first, last);
        }
      }
    }
  }
}
