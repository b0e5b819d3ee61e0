/*
 * GGUF block dot products with AVX-512 BW + VNNI on 512-bit vectors: several weight blocks per
 * instruction, against activations that each task first lays out for these kernels (from the ggml
 * Q8_0 / Q8_1 / Q8_K blocks matmul.c prepared; same integer codes, so the sums are the same exact
 * integers as the scalar kernels'). Q2_K, Q3_K, IQ4_NL, IQ4_XS and the blocks left over at the end of
 * a row use the 256-bit body (matmul_ggml_body.h) with vpdpbusd.
 *
 * 32-element formats, 4 blocks per step (Q8_0: 2): two loads cover the blocks, one vpermt2w gathers
 * their codes (and one their f16 scales) into place; the nibbles of Q4_x / Q5_x are the unsigned
 * operand of vpdpbusd (n, or n + 16·high bit), with the offsets (−8, −16; Q8_0: the codes + 128) taken
 * off through the activation block sums; int32 lanes 4b..4b+3 hold block b, scaled in f32 by
 * d_w·d_a per lane. Q4_1 / Q5_1 add m_w · s_a (the f16 sum of the Q8_1 block) per block.
 *
 * k-quants, one super-block per step: the unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) times
 * the activations with vpmaddubsw (int16 pairs, at most 2·63·127 — no saturation), then vpdpwssd with
 * the sub-block scales as int16 lanes: the super-block's integer sum in int32, scaled once by
 * d_w·d_a. Mins (Q4_K, Q5_K) use the per-32 activation sums; Q6_K's −32 offset the per-16 sums.
 *
 * Source: llm.md §2.6 (the identities); ggml-cpu/arch/x86/quants.c (the same identities with AVX2).
 */
#include <immintrin.h>

#include "matmul.h"

static inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

#define GGML_FN ggml_ymm
#define GGML_FN_STORAGE static
#include "matmul_ggml_body.h"

/* Keep v in a register from here on: gcc otherwise folds the load that made it into each use (one load per use). */
#define TP_IN_REG(v) __asm__("" : "+v"(v))

/* binary16 → f32 with F16C (exact, as tp_f16p). */
static inline float f16h(const uint8_t *p) { return _cvtsh_ss(tp_rd16(p)); }

/* Software prefetch distance of the Q4_x / Q5_x weight stream in the GEMV, in bytes ahead of the loads
 * (that loop falls well behind without it; Q8_0 and the k-quants gain nothing from one and have none). */
#ifndef GGML_PF_DIST
#define GGML_PF_DIST 2048
#endif

/* Activation rows prepared per chunk of rows (bounded scratch: tp_mm_task_scratch). */
#define XA_ROWS 16

/* ---- prepared activations ------------------------------------------------------------------ */

/*
 * 32-element formats, per group of 4 blocks (GS bytes):
 *   [0, 128)    codes: nibble formats [e 0..15 of blocks 0..3 | e 16..31 of blocks 0..3]; Q8_0 natural
 *   [128, 256)  d_a per int32 lane: nibble formats 16 f32 (lanes 4b..4b+3 = block b) at 128;
 *               Q8_0 two vectors (lanes 8b'.. of each pair) at 128 and 192
 *   [256, 384)  int32 offsets to add: nibble formats one vector at 256 (lane 4b: −B·Σq_a(b));
 *               Q8_0 two at 256, 320 (lane 8b': −128·Σq_a)
 *   [384, 448)  Q8_1 s_a per lane (lane 4b: s_a(b), else 0)
 * k-quants Q4_K / Q5_K, per super-block (KS bytes): codes in the order of the nibbles [sb0, sb2, sb1,
 * sb3, sb4, sb6, sb5, sb7] (256), Σq_a per 32 as 8 int16 (16), d_a f32 (4).
 */
#define GS 448
#define KS 320

static void prep32(const tp_mm *mm, const uint8_t *a, int64_t nb, uint8_t *out) {
  const int32_t fmt = mm->fmt;
  const int q81 = fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1;
  const size_t ab = q81 ? 36 : 34;
  const int32_t off = fmt == TP_W_Q4_0 ? 8 : fmt == TP_W_Q5_0 ? 16 : fmt == TP_W_Q8_0 ? 128 : 0;
  for (int64_t g = 0; g < nb / 4; g++) {
    uint8_t *o = out + (size_t)g * GS;
    float *dv = (float *)(o + 128), *sv = (float *)(o + 384);
    int32_t *cv = (int32_t *)(o + 256);
    memset(o + 128, 0, GS - 128);
    for (int b = 0; b < 4; b++) {
      const uint8_t *blk = a + (size_t)(4 * g + b) * ab;
      const int8_t *q = (const int8_t *)(blk + ab - 32);
      const float d = tp_f16p(blk);
      int32_t sum = 0;
      for (int e = 0; e < 32; e++) sum += q[e];
      if (fmt == TP_W_Q8_0) {
        memcpy(o + 32 * b, q, 32);
        /* pair b >> 1, lanes 8 (b & 1) .. + 7 */
        for (int l = 0; l < 8; l++) dv[16 * (b >> 1) + 8 * (b & 1) + l] = d;
        cv[16 * (b >> 1) + 8 * (b & 1)] = -off * sum;
      } else {
        memcpy(o + 16 * b, q, 16);
        memcpy(o + 64 + 16 * b, q + 16, 16);
        for (int l = 0; l < 4; l++) dv[4 * b + l] = d;
        cv[4 * b] = -off * sum;
        if (q81) sv[4 * b] = tp_f16p(blk + 2);
      }
    }
  }
}

static void prepk45(const uint8_t *a, int64_t nb, uint8_t *out) {
  static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t s = 0; s < nb; s++) {
    const uint8_t *ab = a + (size_t)s * 292;
    uint8_t *o = out + (size_t)s * KS;
    for (int c = 0; c < 8; c++) memcpy(o + 32 * c, ab + 4 + 32 * order[c], 32);
    int16_t bs[8];
    for (int t = 0; t < 8; t++) bs[t] = (int16_t)(q8k_bsum(ab, 2 * t) + q8k_bsum(ab, 2 * t + 1));
    memcpy(o + 256, bs, 16);
    memcpy(o + 272, ab, 4); /* d_a */
  }
}

/* Bytes of one prepared row (0: the kernel reads the ggml blocks as they are). */
static size_t xa_row_bytes(int32_t fmt, int64_t k) {
  if (fmt == TP_W_Q4_K || fmt == TP_W_Q5_K) return (size_t)(k / 256) * KS;
  if (tp_wformats[fmt].block == 32) return (size_t)(k / 128) * GS;
  return 0;
}

/* Constant index / shift / shuffle vectors (generated; see the kernels for their meaning). */
static const int8_t SEL_02[64] __attribute__((aligned(64))) = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5};
static const int8_t SEL_13[64] __attribute__((aligned(64))) = {2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7};
static const int8_t SEL_46[64] __attribute__((aligned(64))) = {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13};
static const int8_t SEL_57[64] __attribute__((aligned(64))) = {10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15};
static const int8_t SEL_0123[64] __attribute__((aligned(64))) = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7};
static const int8_t SEL_4567[64] __attribute__((aligned(64))) = {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15};
static const int16_t SH_02[32] __attribute__((aligned(64))) = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
static const int16_t SH_13[32] __attribute__((aligned(64))) = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
static const int16_t SH_46[32] __attribute__((aligned(64))) = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6};
static const int16_t SH_57[32] __attribute__((aligned(64))) = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
#define CV(t) _mm512_load_si512(t)

/* ---- 32-element formats --------------------------------------------------------------------- */

/* Word indices (16-bit lanes) for vpermt2w over two loads Z0 = bytes [0, 64), Z1 = [64, 128) of a group. */
typedef struct perm32 {
  __m512i qs;   /* the 4 × 16 code bytes of the group */
  __m512i d;    /* positions 0..15: d of block p / 4 */
  __m512i m;    /* the same for m (Q4_1 / Q5_1) */
  __m512i qh;   /* 128-bit lane b: [qh_b low word, qh_b high word] (Q5_x) */
} perm32;

static inline __m512i words(int b0, int b1, int b2, int b3, int len, int step_inside) {
  int16_t w[32];
  for (int i = 0; i < 32; i++) w[i] = 0;
  const int base[4] = {b0, b1, b2, b3};
  for (int b = 0; b < 4; b++)
    for (int i = 0; i < len && b * len + i < 32; i++) w[b * len + i] = (int16_t)(base[b] + i * step_inside);
  return _mm512_loadu_si512(w);
}

static perm32 perm_for(int32_t fmt) {
  perm32 p;
  const int bw = tp_wformats[fmt].block_bytes / 2; /* words per block */
  int qs = 0, d = 0, m = 1, qh = 0;
  switch (fmt) {
    case TP_W_Q4_0: qs = 1; break;
    case TP_W_Q4_1: qs = 2; break;
    case TP_W_Q5_0: qs = 3; qh = 1; break;
    default: qs = 4; qh = 2; /* Q5_1 */
  }
  p.qs = words(qs, qs + bw, qs + 2 * bw, qs + 3 * bw, 8, 1);
  p.d = words(d, d + bw, d + 2 * bw, d + 3 * bw, 4, 0);
  p.m = words(m, m + bw, m + 2 * bw, m + 3 * bw, 4, 0);
  {
    int16_t w[32];
    for (int i = 0; i < 32; i++) w[i] = 0;
    for (int b = 0; b < 4; b++) {
      w[8 * b] = (int16_t)(qh + b * bw);
      w[8 * b + 1] = (int16_t)(qh + b * bw + 1);
    }
    p.qh = _mm512_loadu_si512(w);
  }
  return p;
}

/* Constants of the 32-element kernels (Q4_0, Q4_1, Q5_0, Q5_1). */
typedef struct g32_consts {
  __m512i lo4, sel_lo, sel_hi, bits, sixteen;
} g32_consts;

static inline __attribute__((always_inline)) g32_consts g32_init(void) {
  /* Q5: byte e of block lane b tests bit e (low word → elements 0..15) */
  return (g32_consts){.lo4 = _mm512_set1_epi8(0x0F),
                      .sel_lo = _mm512_set4_epi32(0x01010101, 0x01010101, 0x00000000, 0x00000000),
                      .sel_hi = _mm512_set4_epi32(0x03030303, 0x03030303, 0x02020202, 0x02020202),
                      .bits = _mm512_set1_epi64((long long)0x8040201008040201ULL),
                      .sixteen = _mm512_set1_epi8(16)};
}

/* One group of 4 blocks decoded: unsigned codes of elements 0..15 / 16..31 per block lane, d_w, m_w per lane. */
typedef struct g32_grp {
  __m512i lo, hi;
  __m512 dw, mw;
} g32_grp;

/*
 * The group's bytes past the first 64 (8 / 16 / 24 / 32 for Q4_0 / Q4_1 / Q5_0 / Q5_1) at the start of a
 * vector, read with loads no wider than they are (never past the group: nothing beyond the weight is
 * read). A masked 64-byte load there costs the GEMV from DRAM on Zen 5 as if it read the next cache
 * line too. The lanes above are not read by the permutes (perm32 indexes the group's words only).
 */
static inline __attribute__((always_inline)) __m512i g32_tail(const uint8_t *t, int five, int q81) {
  if (five && q81) return _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)t));
  const __m128i a = q81 ? _mm_loadu_si128((const __m128i *)t) : _mm_loadl_epi64((const __m128i *)t);
  if (!five) return _mm512_castsi128_si512(a);
  /* Q5_0: bytes 64..79, then 80..87 at 16..23 */
  return _mm512_castsi256_si512(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)t)),
                              _mm_loadl_epi64((const __m128i *)(t + 16)), 1));
}

static inline __attribute__((always_inline)) g32_grp g32_decode(const g32_consts *c, const perm32 *p, const uint8_t *gp,
                                                                int five, int q81) {
  g32_grp g;
  /* the group's codes, d (and m, qh) gathered with one vpermt2w each from two loads */
  __m512i z0 = _mm512_loadu_si512(gp);
  const __m512i z1 = g32_tail(gp + 64, five, q81);
  TP_IN_REG(z0); /* one load: vpermt2w overwrites an operand, and gcc would reload z0 for the second one */
  const __m512i q = _mm512_permutex2var_epi16(z0, p->qs, z1);
  g.lo = _mm512_and_si512(q, c->lo4);
  g.hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), c->lo4);
  if (five) {
    const __m512i h = _mm512_permutex2var_epi16(z0, p->qh, z1);
    g.lo = _mm512_mask_add_epi8(g.lo, _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, c->sel_lo), c->bits), g.lo, c->sixteen);
    g.hi = _mm512_mask_add_epi8(g.hi, _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, c->sel_hi), c->bits), g.hi, c->sixteen);
  }
  g.dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, p->d, z1)));
  g.mw = q81 ? _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, p->m, z1))) : _mm512_setzero_ps();
  return g;
}

/* Add one decoded group times the prepared activations at x (GS bytes) to the sums a and m (Q4_1 / Q5_1). */
static inline __attribute__((always_inline)) void g32_row(const g32_grp *g, const uint8_t *x, int q81, __m512 *a,
                                                          __m512 *m) {
  __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(x + 256), g->lo, _mm512_load_si512(x));
  s = _mm512_dpbusd_epi32(s, g->hi, _mm512_load_si512(x + 64));
  *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(g->dw, _mm512_load_ps((const float *)(x + 128))), *a);
  if (q81) *m = _mm512_fmadd_ps(g->mw, _mm512_load_ps((const float *)(x + 384)), *m);
}

/*
 * Rows [i0, i0 + R) × one weight row: the 4-block groups with 512-bit vectors, then the leftover
 * blocks with the 256-bit body. xa: the prepared rows (row stride xs); a: the ggml rows (stride mm->xq_row).
 */
static inline __attribute__((always_inline)) void dot32_4(const tp_mm *mm, int R, const perm32 *p,
                                                           const uint8_t *w, int64_t nb, const uint8_t *xa,
                                                           size_t xs, const uint8_t *a, float *out) {
  const int32_t fmt = mm->fmt;
  const int q81 = fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1;
  const int five = fmt == TP_W_Q5_0 || fmt == TP_W_Q5_1;
  const size_t gb = 4 * (size_t)tp_wformats[fmt].block_bytes;
  const g32_consts c = g32_init();
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, m0 = a0, m1 = a0, m2 = a0, m3 = a0;
  const int64_t ng = nb / 4;
  for (int64_t g = 0; g < ng; g++) {
    const uint8_t *gp = w + (size_t)g * gb;
    if (GGML_PF_DIST > 0) {
      _mm_prefetch((const char *)(gp + GGML_PF_DIST), _MM_HINT_T0);
      _mm_prefetch((const char *)(gp + GGML_PF_DIST + 64), _MM_HINT_T0);
    }
    const g32_grp d = g32_decode(&c, p, gp, five, q81);
    const uint8_t *x = xa + (size_t)g * GS;
    if (R > 0) g32_row(&d, x, q81, &a0, &m0);
    if (R > 1) g32_row(&d, x + xs, q81, &a1, &m1);
    if (R > 2) g32_row(&d, x + 2 * xs, q81, &a2, &m2);
    if (R > 3) g32_row(&d, x + 3 * xs, q81, &a3, &m3);
  }
  float tail[4] = {0, 0, 0, 0};
  if (nb % 4) {
    const uint8_t *ta[4];
    for (int r = 0; r < 4; r++) ta[r] = a + (size_t)(r < R ? r : 0) * mm->xq_row + (size_t)(4 * ng) * (q81 ? 36 : 34);
    dots[fmt][R - 1](w + (size_t)ng * gb, nb % 4, ta, tail);
  }
  if (R > 0) out[0] = _mm512_reduce_add_ps(a0) + _mm512_reduce_add_ps(m0) + tail[0];
  if (R > 1) out[1] = _mm512_reduce_add_ps(a1) + _mm512_reduce_add_ps(m1) + tail[1];
  if (R > 2) out[2] = _mm512_reduce_add_ps(a2) + _mm512_reduce_add_ps(m2) + tail[2];
  if (R > 3) out[3] = _mm512_reduce_add_ps(a3) + _mm512_reduce_add_ps(m3) + tail[3];
}

/*
 * Q4_0 / Q4_1 / Q5_0 / Q5_1 at one activation row, two weight rows (w and w + off) at a time (nb a
 * multiple of 4): each row's sums see the same operations in the same order as dot32_4 with R = 1.
 */
static inline __attribute__((always_inline)) void dot32_4_w2(int32_t fmt, const perm32 *p, const uint8_t *w,
                                                              size_t off, int64_t nb, const uint8_t *xa, float *out) {
  const int q81 = fmt == TP_W_Q4_1 || fmt == TP_W_Q5_1;
  const int five = fmt == TP_W_Q5_0 || fmt == TP_W_Q5_1;
  const size_t gb = 4 * (size_t)tp_wformats[fmt].block_bytes;
  const g32_consts c = g32_init();
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, m0 = a0, m1 = a0;
  for (int64_t g = 0; g < nb / 4; g++) {
    const uint8_t *gp = w + (size_t)g * gb;
    if (GGML_PF_DIST > 0) {
      _mm_prefetch((const char *)(gp + GGML_PF_DIST), _MM_HINT_T0);
      _mm_prefetch((const char *)(gp + GGML_PF_DIST + 64), _MM_HINT_T0);
      _mm_prefetch((const char *)(gp + off + GGML_PF_DIST), _MM_HINT_T0);
      _mm_prefetch((const char *)(gp + off + GGML_PF_DIST + 64), _MM_HINT_T0);
    }
    const g32_grp d0 = g32_decode(&c, p, gp, five, q81), d1 = g32_decode(&c, p, gp + off, five, q81);
    const uint8_t *x = xa + (size_t)g * GS;
    /* the activation vectors loaded once for both rows (as operands, gcc loads them once per row) */
    __m512i xl = _mm512_load_si512(x), xh = _mm512_load_si512(x + 64), xo = _mm512_load_si512(x + 256);
    __m512 xd = _mm512_load_ps((const float *)(x + 128)), xm = q81 ? _mm512_load_ps((const float *)(x + 384)) : xd;
    TP_IN_REG(xl);
    TP_IN_REG(xh);
    TP_IN_REG(xo);
    TP_IN_REG(xd);
    TP_IN_REG(xm);
    __m512i s0 = _mm512_dpbusd_epi32(xo, d0.lo, xl), s1 = _mm512_dpbusd_epi32(xo, d1.lo, xl);
    s0 = _mm512_dpbusd_epi32(s0, d0.hi, xh);
    s1 = _mm512_dpbusd_epi32(s1, d1.hi, xh);
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d0.dw, xd), a0);
    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d1.dw, xd), a1);
    if (q81) {
      m0 = _mm512_fmadd_ps(d0.mw, xm, m0);
      m1 = _mm512_fmadd_ps(d1.mw, xm, m1);
    }
  }
  out[0] = _mm512_reduce_add_ps(a0) + _mm512_reduce_add_ps(m0) + 0.0f;
  out[1] = _mm512_reduce_add_ps(a1) + _mm512_reduce_add_ps(m1) + 0.0f;
}

/*
 * One pair of Q8_0 blocks at gp (68 bytes): the codes + 128 (bytes 2..33 and 36..67, unsigned) and, in
 * *dw, each block's d broadcast to 8 lanes.
 */
static inline __attribute__((always_inline)) __m512i q80_pair(const uint8_t *gp, __m512i flip, __m512 *dw) {
  const __m256i dh = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)tp_rd16(gp))),
                                             _mm_set1_epi16((short)tp_rd16(gp + 34)), 1);
  *dw = _mm512_cvtph_ps(dh);
  return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(gp + 2))),
                                             _mm256_loadu_si256((const __m256i *)(gp + 36)), 1),
                          flip);
}

/* Q8_0, 2 blocks per vector: codes + 128 (unsigned) against q_a, −128 Σq_a per block from the prepared offsets. */
static inline __attribute__((always_inline)) void dot_q80(int R, const uint8_t *w, int64_t nb, const uint8_t *xa,
                                                           size_t xs, float *out) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t np = nb / 2;
  for (int64_t pr = 0; pr < np; pr++) {
    __m512 dw;
    const __m512i u = q80_pair(w + (size_t)pr * 68, flip, &dw);
    const size_t go = (size_t)(pr >> 1) * GS, half = (size_t)(pr & 1);
#define ROW(r)                                                                                          \
  if (R > r) {                                                                                          \
    const uint8_t *x = xa + (size_t)(r)*xs + go;                                                        \
    const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(x + 256 + 64 * half), u, _mm512_load_si512(x + 64 * half)); \
    a##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_load_ps((const float *)(x + 128 + 64 * half))), a##r); \
  }
    ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
  }
  if (R > 0) out[0] = _mm512_reduce_add_ps(a0);
  if (R > 1) out[1] = _mm512_reduce_add_ps(a1);
  if (R > 2) out[2] = _mm512_reduce_add_ps(a2);
  if (R > 3) out[3] = _mm512_reduce_add_ps(a3);
}

/*
 * Q8_0 at one activation row, two weight rows (w and w + off) at a time (nb a multiple of 4): each
 * row's sums see the same operations in the same order as dot_q80 with R = 1 (the same floats, bit for
 * bit), with the activation loads shared and two independent chains.
 */
static inline __attribute__((always_inline)) void dot_q80_w2(const uint8_t *w, size_t off, int64_t nb,
                                                              const uint8_t *xa, float *out) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  for (int64_t pr = 0; pr < nb / 2; pr++) {
    const uint8_t *x = xa + (size_t)(pr >> 1) * GS + 64 * (size_t)(pr & 1);
    const __m512i xq = _mm512_load_si512(x), xo = _mm512_load_si512(x + 256);
    const __m512 xd = _mm512_load_ps((const float *)(x + 128));
    __m512 dw0, dw1;
    const __m512i u0 = q80_pair(w + (size_t)pr * 68, flip, &dw0), u1 = q80_pair(w + off + (size_t)pr * 68, flip, &dw1);
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(xo, u0, xq)), _mm512_mul_ps(dw0, xd), a0);
    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(xo, u1, xq)), _mm512_mul_ps(dw1, xd), a1);
  }
  out[0] = _mm512_reduce_add_ps(a0);
  out[1] = _mm512_reduce_add_ps(a1);
}

/* ---- k-quants ---------------------------------------------------------------------------------- */

/*
 * 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of Q4_K / Q5_K from the 12 packed bytes at s, ggml's
 * utmp trick on one vector (no round trip through general registers): with u0, u1, u2 the three
 * little-endian words, scales = [u0 & 0x3f3f3f3f, (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4],
 * mins = [u1 & 0x3f3f3f3f, ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4]. Reads 16 bytes
 * (the 4 after the scales are the block's first codes; their lanes are not used).
 */
static inline __m128i k4_unpack(const uint8_t *s) {
  const __m128i v = _mm_loadu_si128((const __m128i *)s);
  const __m128i a = _mm_and_si128(v, _mm_set1_epi32(0x3f3f3f3f));                                      /* u0, u1 low 6 bits */
  const __m128i hi = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(v, 6), _mm_set1_epi32(0x03030303)), 4); /* u0, u1 top bits */
  const __m128i u2 = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(u2, _mm_set_epi32(4, 4, 4, 0)), _mm_set1_epi32(0x0f0f0f0f));
  /* [u0', u2' (scales 4..7), u1', u3' (mins 4..7)] */
  return _mm_unpacklo_epi32(a, _mm_or_si128(lo, hi));
}

/* Constants of the Q4_K / Q5_K kernels. */
typedef struct k45_consts {
  __m512i lo4, one;
  __m512i i0, i1, i2, i3; /* the int16 scale of 128-bit lanes [a, a, b, b] from the 8 scales broadcast to every lane (pshufb) */
  __m512i h0, h1, h2, h3; /* Q5_K: high bit of sub-block sb = bit sb of qh[l]; shift counts per 256-bit half */
} k45_consts;

static inline __attribute__((always_inline)) k45_consts k45_init(void) {
  return (k45_consts){.lo4 = _mm512_set1_epi8(0x0F), .one = _mm512_set1_epi8(1), .i0 = CV(SEL_02), .i1 = CV(SEL_13),
                      .i2 = CV(SEL_46), .i3 = CV(SEL_57), .h0 = CV(SH_02), .h1 = CV(SH_13), .h2 = CV(SH_46),
                      .h3 = CV(SH_57)};
}

/* One Q4_K / Q5_K super-block decoded: unsigned codes per 64 elements, int16 scales per lane, mins, d, dmin. */
typedef struct k45_blk {
  __m512i u0, u1, u2, u3, s0, s1, s2, s3;
  __m128i mn;
  float d, dmin;
} k45_blk;

static inline __attribute__((always_inline)) k45_blk k45_decode(const k45_consts *c, const uint8_t *b, int five) {
  k45_blk k;
  const uint8_t *qs = b + (five ? 48 : 16);
  const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
  k.u0 = _mm512_and_si512(q0, c->lo4);
  k.u1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), c->lo4);
  k.u2 = _mm512_and_si512(q1, c->lo4);
  k.u3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), c->lo4);
  if (five) {
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
    k.u0 = _mm512_or_si512(k.u0, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h0), c->one), 4));
    k.u1 = _mm512_or_si512(k.u1, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h1), c->one), 4));
    k.u2 = _mm512_or_si512(k.u2, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h2), c->one), 4));
    k.u3 = _mm512_or_si512(k.u3, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h3), c->one), 4));
  }
  const __m128i scmn = k4_unpack(b + 4);
  const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(scmn));
  k.mn = _mm_cvtepu8_epi16(_mm_srli_si128(scmn, 8));
  k.s0 = _mm512_shuffle_epi8(sc, c->i0);
  k.s1 = _mm512_shuffle_epi8(sc, c->i1);
  k.s2 = _mm512_shuffle_epi8(sc, c->i2);
  k.s3 = _mm512_shuffle_epi8(sc, c->i3);
  k.d = f16h(b);
  k.dmin = f16h(b + 2);
  return k;
}

/* Add one decoded super-block times the prepared activations at x (KS bytes) to the sums a and mins m. */
static inline __attribute__((always_inline)) void k45_row(const k45_blk *k, const uint8_t *x, __m512 *a, __m128 *m) {
  __m512i t = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(k->u0, _mm512_load_si512(x)), k->s0);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u1, _mm512_load_si512(x + 64)), k->s1);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u2, _mm512_load_si512(x + 128)), k->s2);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u3, _mm512_load_si512(x + 192)), k->s3);
  const float da = tp_rdf32(x + 272);
  *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(k->d * da), *a);
  const __m128i mm4 = _mm_madd_epi16(k->mn, _mm_load_si128((const __m128i *)(x + 256)));
  *m = _mm_fmadd_ps(_mm_cvtepi32_ps(mm4), _mm_set1_ps(k->dmin * da), *m);
}

#define HS4(v) (_mm_cvtss_f32(_mm_add_ss(_mm_add_ps(v, _mm_movehl_ps(v, v)), _mm_movehdup_ps(_mm_add_ps(v, _mm_movehl_ps(v, v))))))

static inline __attribute__((always_inline)) void dot_k45(const tp_mm *mm, int R, const uint8_t *w, int64_t nb,
                                                           const uint8_t *xa, size_t xs, float *out) {
  const int five = mm->fmt == TP_W_Q5_K;
  const size_t wb = five ? 176 : 144;
  const k45_consts c = k45_init();
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
  for (int64_t s = 0; s < nb; s++) {
    const k45_blk k = k45_decode(&c, w + (size_t)s * wb, five);
    const uint8_t *x = xa + (size_t)s * KS;
    if (R > 0) k45_row(&k, x, &a0, &m0);
    if (R > 1) k45_row(&k, x + xs, &a1, &m1);
    if (R > 2) k45_row(&k, x + 2 * xs, &a2, &m2);
    if (R > 3) k45_row(&k, x + 3 * xs, &a3, &m3);
  }
  if (R > 0) out[0] = _mm512_reduce_add_ps(a0) - HS4(m0);
  if (R > 1) out[1] = _mm512_reduce_add_ps(a1) - HS4(m1);
  if (R > 2) out[2] = _mm512_reduce_add_ps(a2) - HS4(m2);
  if (R > 3) out[3] = _mm512_reduce_add_ps(a3) - HS4(m3);
}

/* k4_unpack on two super-blocks' 12 scale bytes at once (a and b: 128-bit halves of the result). */
static inline __attribute__((always_inline)) __m256i k4_unpack2(const uint8_t *a, const uint8_t *b) {
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                            _mm_loadu_si128((const __m128i *)b), 1);
  const __m256i lo6 = _mm256_and_si256(v, _mm256_set1_epi32(0x3f3f3f3f));
  const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 6), _mm256_set1_epi32(0x03030303)), 4);
  const __m256i u2 = _mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
  const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(u2, _mm256_set_epi32(4, 4, 4, 0, 4, 4, 4, 0)),
                                      _mm256_set1_epi32(0x0f0f0f0f));
  return _mm256_unpacklo_epi32(lo6, _mm256_or_si256(lo, hi));
}

/* The int16 word index of each lane of s0..s3 (from the pshufb byte indices SEL_*: word = byte / 2). */
static inline __attribute__((always_inline)) __m512i sel_words(const int8_t *sel) {
  return _mm512_srli_epi16(_mm512_and_si512(_mm512_load_si512(sel), _mm512_set1_epi16(0x00FF)), 1);
}

/*
 * Two Q4_K / Q5_K super-blocks (rows b0 and b1, the same activation super-block x) decoded with their
 * scales: as two k45_decode, but the 6-bit scales and mins of both unpacked in one 256-bit k4_unpack,
 * widened in one vpmovzxbw (words 0..7 scales and 8..15 mins of b0, 16..31 those of b1) and spread
 * into s0..s3 with vpermw, and d, dmin of both converted and multiplied by x's d_a in one step (dd / dm:
 * the products broadcast, the same floats as k45_row's d · d_a and dmin · d_a).
 */
typedef struct k45_scaled {
  k45_blk k;
  __m512 dd;
  __m128 dm;
} k45_scaled;

static inline __attribute__((always_inline)) void k45_decode2(const k45_consts *c, const __m512i idx[4],
                                                              const uint8_t *b0, const uint8_t *b1,
                                                              const uint8_t *x, int five, k45_scaled *r0,
                                                              k45_scaled *r1) {
  const uint8_t *bs[2] = {b0, b1};
  k45_scaled *rs[2] = {r0, r1};
  const __m512i wds = _mm512_cvtepu8_epi16(k4_unpack2(b0 + 4, b1 + 4));
  /* [d0, dmin0, d1, dmin1] · d_a */
  const __m128i h = _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)tp_rd32(b0)), _mm_cvtsi32_si128((int)tp_rd32(b1)));
  const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(h), _mm_set1_ps(tp_rdf32(x + 272)));
  for (int r = 0; r < 2; r++) {
    k45_blk *k = &rs[r]->k;
    const uint8_t *qs = bs[r] + (five ? 48 : 16);
    const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
    k->u0 = _mm512_and_si512(q0, c->lo4);
    k->u1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), c->lo4);
    k->u2 = _mm512_and_si512(q1, c->lo4);
    k->u3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), c->lo4);
    if (five) {
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bs[r] + 16)));
      k->u0 = _mm512_or_si512(k->u0, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h0), c->one), 4));
      k->u1 = _mm512_or_si512(k->u1, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h1), c->one), 4));
      k->u2 = _mm512_or_si512(k->u2, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h2), c->one), 4));
      k->u3 = _mm512_or_si512(k->u3, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, c->h3), c->one), 4));
    }
    const __m512i o = _mm512_set1_epi16((short)(16 * r));
    k->s0 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx[0], o), wds);
    k->s1 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx[1], o), wds);
    k->s2 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx[2], o), wds);
    k->s3 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx[3], o), wds);
    k->mn = _mm512_extracti32x4_epi32(wds, 1 + 2 * r);
    rs[r]->dd = _mm512_broadcastss_ps(_mm_permute_ps(dd, r == 0 ? _MM_SHUFFLE(0, 0, 0, 0) : _MM_SHUFFLE(2, 2, 2, 2)));
    rs[r]->dm = _mm_permute_ps(dd, r == 0 ? _MM_SHUFFLE(1, 1, 1, 1) : _MM_SHUFFLE(3, 3, 3, 3));
  }
}

/* k45_row with d · d_a and dmin · d_a already broadcast (k45_decode2): the same operations on the same values. */
static inline __attribute__((always_inline)) void k45_row2(const k45_scaled *ks, const uint8_t *x, __m512 *a,
                                                           __m128 *m) {
  const k45_blk *k = &ks->k;
  __m512i t = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(k->u0, _mm512_load_si512(x)), k->s0);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u1, _mm512_load_si512(x + 64)), k->s1);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u2, _mm512_load_si512(x + 128)), k->s2);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u3, _mm512_load_si512(x + 192)), k->s3);
  *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), ks->dd, *a);
  const __m128i mm4 = _mm_madd_epi16(k->mn, _mm_load_si128((const __m128i *)(x + 256)));
  *m = _mm_fmadd_ps(_mm_cvtepi32_ps(mm4), ks->dm, *m);
}

/*
 * Q4_K / Q5_K at one activation row, two weight rows (w and w + off) at a time: each row's sums see the
 * same operations in the same order as dot_k45 with R = 1 (the same floats, bit for bit); the two
 * rows' independent chains and the shared activation loads fill the pipes that one row of a short
 * K leaves idle (K = 1024 is 4 super-blocks per row). The two rows' scales are decoded together
 * (k45_decode2): with one k45_decode per row the scale work was most of the loop's operations. From
 * DRAM the loads, not the arithmetic, set the pace.
 */
static inline __attribute__((always_inline)) void dot_k45_w2(int five, const uint8_t *w, size_t off, int64_t nb,
                                                              const uint8_t *xa, float *out) {
  const size_t wb = five ? 176 : 144;
  const k45_consts c = k45_init();
  const __m512i idx[4] = {sel_words(SEL_02), sel_words(SEL_13), sel_words(SEL_46), sel_words(SEL_57)};
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  __m128 m0 = _mm_setzero_ps(), m1 = m0;
  for (int64_t s = 0; s < nb; s++) {
    const uint8_t *x = xa + (size_t)s * KS;
    k45_scaled k0, k1;
    k45_decode2(&c, idx, w + (size_t)s * wb, w + off + (size_t)s * wb, x, five, &k0, &k1);
    k45_row2(&k0, x, &a0, &m0);
    k45_row2(&k1, x, &a1, &m1);
  }
  out[0] = _mm512_reduce_add_ps(a0) - HS4(m0);
  out[1] = _mm512_reduce_add_ps(a1) - HS4(m1);
}
#undef HS4

/* Constants of the Q6_K kernels. */
typedef struct q6k_consts {
  __m512i lo4, three, c02, c46;
  __m512i ilo, ihi; /* 128-bit lane t of u0 / u2 takes scale t of 8, of u1 / u3 scale 4 + t (pshufb of broadcast halves) */
} q6k_consts;

static inline __attribute__((always_inline)) q6k_consts q6k_init(void) {
  return (q6k_consts){.lo4 = _mm512_set1_epi8(0x0F), .three = _mm512_set1_epi8(3), .c02 = CV(SH_02), .c46 = CV(SH_46),
                      .ilo = CV(SEL_0123), .ihi = CV(SEL_4567)};
}

/* One Q6_K super-block decoded: u = q + 32 (0..63) per 64 elements, int16 scales per lane (and as 16 words), d. */
typedef struct q6k_blk {
  __m512i u0, u1, u2, u3, s0, s1, s2, s3;
  __m256i sc16;
  float d;
} q6k_blk;

static inline __attribute__((always_inline)) q6k_blk q6k_decode(const q6k_consts *c, const uint8_t *b) {
  q6k_blk k;
  const __m512i ql0 = _mm512_loadu_si512(b), ql1 = _mm512_loadu_si512(b + 64);
  const __m512i qh0 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128)));
  const __m512i qh1 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 160)));
  /* elements 0..63, 64..127 (half 0), 128..191, 192..255 (half 1) */
  k.u0 = _mm512_or_si512(_mm512_and_si512(ql0, c->lo4),
                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh0, c->c02), c->three), 4));
  k.u1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql0, 4), c->lo4),
                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh0, c->c46), c->three), 4));
  k.u2 = _mm512_or_si512(_mm512_and_si512(ql1, c->lo4),
                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh1, c->c02), c->three), 4));
  k.u3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql1, 4), c->lo4),
                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh1, c->c46), c->three), 4));
  k.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
  const __m512i b0 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(k.sc16)),
                b1 = _mm512_broadcast_i32x4(_mm256_extracti128_si256(k.sc16, 1));
  k.s0 = _mm512_shuffle_epi8(b0, c->ilo);
  k.s1 = _mm512_shuffle_epi8(b0, c->ihi);
  k.s2 = _mm512_shuffle_epi8(b1, c->ilo);
  k.s3 = _mm512_shuffle_epi8(b1, c->ihi);
  k.d = f16h(b + 208);
  return k;
}

/* Add one decoded super-block times the ggml Q8_K block at x (292 bytes) to the sums a. */
static inline __attribute__((always_inline)) void q6k_row(const q6k_blk *k, const uint8_t *x, __m512 *a) {
  __m512i t = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(k->u0, _mm512_loadu_si512(x + 4)), k->s0);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u1, _mm512_loadu_si512(x + 68)), k->s1);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u2, _mm512_loadu_si512(x + 132)), k->s2);
  t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(k->u3, _mm512_loadu_si512(x + 196)), k->s3);
  /* the +32 of u: − 32 Σ_t scale_t · Σ q_a over group t */
  const __m256i c = _mm256_madd_epi16(k->sc16, _mm256_loadu_si256((const __m256i *)(x + 260)));
  t = _mm512_sub_epi32(t, _mm512_zextsi256_si512(_mm256_slli_epi32(c, 5)));
  *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(k->d * tp_rdf32(x)), *a);
}

/* Q6_K against the ggml Q8_K blocks as they are (natural order). */
static inline __attribute__((always_inline)) void dot_q6k(int R, const uint8_t *w, int64_t nb, const uint8_t *a,
                                                           size_t as, float *out) {
  const q6k_consts c = q6k_init();
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t s = 0; s < nb; s++) {
    const q6k_blk k = q6k_decode(&c, w + (size_t)s * 210);
    const uint8_t *x = a + (size_t)s * 292;
    if (R > 0) q6k_row(&k, x, &a0);
    if (R > 1) q6k_row(&k, x + as, &a1);
    if (R > 2) q6k_row(&k, x + 2 * as, &a2);
    if (R > 3) q6k_row(&k, x + 3 * as, &a3);
  }
  if (R > 0) out[0] = _mm512_reduce_add_ps(a0);
  if (R > 1) out[1] = _mm512_reduce_add_ps(a1);
  if (R > 2) out[2] = _mm512_reduce_add_ps(a2);
  if (R > 3) out[3] = _mm512_reduce_add_ps(a3);
}

/* Q6_K at one activation row, two weight rows (w and w + off): each row as dot_q6k with R = 1. */
static inline __attribute__((always_inline)) void dot_q6k_w2(const uint8_t *w, size_t off, int64_t nb, const uint8_t *a,
                                                              float *out) {
  const q6k_consts c = q6k_init();
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  for (int64_t s = 0; s < nb; s++) {
    const q6k_blk k0 = q6k_decode(&c, w + (size_t)s * 210), k1 = q6k_decode(&c, w + off + (size_t)s * 210);
    const uint8_t *x = a + (size_t)s * 292;
    q6k_row(&k0, x, &a0);
    q6k_row(&k1, x, &a1);
  }
  out[0] = _mm512_reduce_add_ps(a0);
  out[1] = _mm512_reduce_add_ps(a1);
}

/* ---- the family kernel ------------------------------------------------------------------------- */

typedef struct rows_ctx {
  const tp_mm *mm;
  const perm32 *p;
  const uint8_t *xa; /* prepared rows of this chunk (stride xs) */
  size_t xs;
  const uint8_t *a;  /* ggml rows of this chunk (stride mm->xq_row) */
} rows_ctx;

static inline __attribute__((always_inline)) void dot_rows(const rows_ctx *c, int R, const uint8_t *w, float *out) {
  const tp_mm *mm = c->mm;
  const int64_t nb = mm->k / tp_wformats[mm->fmt].block;
  switch (mm->fmt) {
    case TP_W_Q8_0: {
      /* whole groups of 4 blocks (2 pairs) with 512 bits, the rest with the 256-bit body */
      const int64_t ng = nb / 4;
      dot_q80(R, w, 4 * ng, c->xa, c->xs, out); /* nb multiple of 2 here */
      if (nb % 4) {
        const uint8_t *ta[4];
        float tail[4];
        for (int r = 0; r < 4; r++) ta[r] = c->a + (size_t)(r < R ? r : 0) * mm->xq_row + (size_t)(4 * ng) * 34;
        dots[TP_W_Q8_0][R - 1](w + (size_t)(4 * ng) * 34, nb % 4, ta, tail);
        for (int r = 0; r < R; r++) out[r] += tail[r];
      }
      break;
    }
    case TP_W_Q4_K:
    case TP_W_Q5_K: dot_k45(mm, R, w, nb, c->xa, c->xs, out); break;
    case TP_W_Q6_K: dot_q6k(R, w, nb, c->a, mm->xq_row, out); break;
    default: dot32_4(mm, R, c->p, w, nb, c->xa, c->xs, c->a, out);
  }
}

#define DOT_R(R) \
  static void dot_rows_##R(const rows_ctx *c, const uint8_t *w, float *out) { dot_rows(c, R, w, out); }
DOT_R(1)
DOT_R(2)
DOT_R(3)
DOT_R(4)
#undef DOT_R
typedef void (*dot_rows_fn)(const rows_ctx *c, const uint8_t *w, float *out);
static const dot_rows_fn dot_rows_r[4] = {dot_rows_1, dot_rows_2, dot_rows_3, dot_rows_4};

/* The two-row GEMV kernels by format: the Q8_0, 32-element, Q6_K, Q4_K and Q5_K ones. */
enum { W2_Q80, W2_G32, W2_Q6K, W2_Q4K, W2_Q5K };

/*
 * Two-row GEMV over rows [n0, n0 + h) and [n0 + h, n0 + 2h) of one activation row (xa: prepared, or the
 * ggml Q8_K row for Q6_K). Q4_K / Q5_K run it through their own functions (w2_range_q4k / _q5k) so that
 * the Q5 flag is a constant in the loop. Q4_0 / Q4_1 / Q5_0 / Q5_1 likewise (w2_range_Q4_0 …, `fmt` a
 * constant there), together with one load of z0 and of each activation vector per step (TP_IN_REG):
 * loads are what this loop is short of (one 512-bit load per cycle on this core). Not for Q8_0 / Q6_K:
 * holding their activation vectors in registers for both rows was slower from DRAM.
 */
static inline __attribute__((always_inline)) void w2_range(const tp_mm *mm, const perm32 *p, int kind, int32_t fmt,
                                                            int64_t n0, int64_t h, int64_t nb, const uint8_t *xa) {
  const size_t off = (size_t)h * mm->w_row;
  for (int64_t t = 0; t < h; t++) {
    float out[2];
    const uint8_t *wj = mm->w + (size_t)(n0 + t) * mm->w_row;
    switch (kind) {
      case W2_Q80: dot_q80_w2(wj, off, nb, xa, out); break;
      case W2_G32: dot32_4_w2(fmt, p, wj, off, nb, xa, out); break;
      case W2_Q6K: dot_q6k_w2(wj, off, nb, xa, out); break;
      default: dot_k45_w2(kind == W2_Q5K, wj, off, nb, xa, out); break;
    }
    mm->y[n0 + t] = mm->bias ? out[0] + mm->bias[n0 + t] : out[0];
    mm->y[n0 + h + t] = mm->bias ? out[1] + mm->bias[n0 + h + t] : out[1];
  }
}

static __attribute__((noinline)) void w2_range_q4k(const tp_mm *mm, int64_t n0, int64_t h, int64_t nb,
                                                   const uint8_t *xa) {
  w2_range(mm, NULL, W2_Q4K, mm->fmt, n0, h, nb, xa);
}

static __attribute__((noinline)) void w2_range_q5k(const tp_mm *mm, int64_t n0, int64_t h, int64_t nb,
                                                   const uint8_t *xa) {
  w2_range(mm, NULL, W2_Q5K, mm->fmt, n0, h, nb, xa);
}

#define W2_G32_FN(F)                                                                                                \
  static __attribute__((noinline)) void w2_range_##F(const tp_mm *mm, const perm32 *p, int64_t n0, int64_t h,     \
                                                     int64_t nb, const uint8_t *xa) {                              \
    w2_range(mm, p, W2_G32, TP_W_##F, n0, h, nb, xa);                                                              \
  }
W2_G32_FN(Q4_0)
W2_G32_FN(Q4_1)
W2_G32_FN(Q5_0)
W2_G32_FN(Q5_1)
#undef W2_G32_FN

/* Weight rows per block of the loop nest: they stay in L1 / L2 while the chunk's activation rows pass. */
#define ROWS_PER_BLOCK 16

void tp_mm_ggml_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch) {
  if (mm->xsum != NULL) { /* m ≥ TP_GGML_GEMM_MIN_M: block sums prepared for the GEMM (every GGUF format) */
    tp_mm_ggml_gemm_avx512vnni(mm, n0, n1, scratch);
    return;
  }
  if (mm->fmt == TP_W_Q2_K || mm->fmt == TP_W_Q3_K || mm->fmt == TP_W_IQ4_NL || mm->fmt == TP_W_IQ4_XS) {
    ggml_ymm(mm, n0, n1, scratch);
    return;
  }
  const int64_t nb = mm->k / tp_wformats[mm->fmt].block;
  const size_t xs = (xa_row_bytes(mm->fmt, mm->k) + 63) / 64 * 64;
  const perm32 p = tp_wformats[mm->fmt].block == 32 && mm->fmt != TP_W_Q8_0 ? perm_for(mm->fmt) : perm_for(TP_W_Q4_0);
  const int q80 = mm->fmt == TP_W_Q8_0 && nb % 4 == 0;
  /*
   * Q4_x / Q5_x at every K (whole groups of 4 blocks): with its single loads (w2_range) the two-row
   * loop beats one row at a time at large K too.
   */
  const int g32 = (mm->fmt == TP_W_Q4_0 || mm->fmt == TP_W_Q4_1 || mm->fmt == TP_W_Q5_0 || mm->fmt == TP_W_Q5_1) &&
                  nb % 4 == 0;
  if (mm->m == 1 && (mm->fmt == TP_W_Q4_K || mm->fmt == TP_W_Q5_K || mm->fmt == TP_W_Q6_K || q80 || g32)) {
    /*
     * One activation row: rows n0 + t and n0 + h + t together (h = half the range), so the weights are
     * read as two long sequential streams, and each step has two rows' independent work. (Rows t and
     * t + 1 together are slower from DRAM than one row at a time: the hardware prefetcher does not
     * follow rows that interleave at that distance. Measurements: docs/performance.md, "GEMV".)
     */
    if (q80 || g32) prep32(mm, mm->xq, nb, scratch);
    else if (mm->fmt != TP_W_Q6_K) prepk45(mm->xq, nb, scratch);
    const int64_t h = (n1 - n0) / 2;
    if (mm->fmt == TP_W_Q4_K) w2_range_q4k(mm, n0, h, nb, scratch);
    else if (mm->fmt == TP_W_Q5_K) w2_range_q5k(mm, n0, h, nb, scratch);
    else if (mm->fmt == TP_W_Q6_K) w2_range(mm, &p, W2_Q6K, mm->fmt, n0, h, nb, mm->xq);
    else if (q80) w2_range(mm, &p, W2_Q80, mm->fmt, n0, h, nb, scratch);
    else if (mm->fmt == TP_W_Q4_0) w2_range_Q4_0(mm, &p, n0, h, nb, scratch);
    else if (mm->fmt == TP_W_Q4_1) w2_range_Q4_1(mm, &p, n0, h, nb, scratch);
    else if (mm->fmt == TP_W_Q5_0) w2_range_Q5_0(mm, &p, n0, h, nb, scratch);
    else w2_range_Q5_1(mm, &p, n0, h, nb, scratch);
    if ((n1 - n0) % 2) {
      const rows_ctx c = {.mm = mm, .p = &p, .xa = scratch, .xs = xs, .a = mm->xq};
      float out[4];
      dot_rows_r[0](&c, mm->w + (size_t)(n1 - 1) * mm->w_row, out);
      mm->y[n1 - 1] = mm->bias ? out[0] + mm->bias[n1 - 1] : out[0];
    }
    return;
  }
  for (int64_t c0 = 0; c0 < mm->m; c0 += XA_ROWS) {
    const int64_t rows = mm->m - c0 < XA_ROWS ? mm->m - c0 : XA_ROWS;
    const uint8_t *a = mm->xq + (size_t)c0 * mm->xq_row;
    /* lay the chunk's activation rows out for the kernels */
    for (int64_t i = 0; i < rows && xs > 0; i++) {
      const uint8_t *ai = a + (size_t)i * mm->xq_row;
      if (mm->fmt == TP_W_Q4_K || mm->fmt == TP_W_Q5_K) prepk45(ai, nb, scratch + (size_t)i * xs);
      else prep32(mm, ai, nb, scratch + (size_t)i * xs);
    }
    for (int64_t jb = n0; jb < n1; jb += ROWS_PER_BLOCK) {
      const int64_t je = jb + ROWS_PER_BLOCK < n1 ? jb + ROWS_PER_BLOCK : n1;
      for (int64_t i0 = 0; i0 < rows; i0 += 4) {
        const int r = rows - i0 < 4 ? (int)(rows - i0) : 4;
        const rows_ctx c = {.mm = mm, .p = &p, .xa = scratch + (size_t)i0 * xs, .xs = xs, .a = a + (size_t)i0 * mm->xq_row};
        int64_t j = jb;
        for (; j < je; j++) {
          float out[4];
          dot_rows_r[r - 1](&c, mm->w + (size_t)j * mm->w_row, out);
          for (int t = 0; t < r; t++) {
            float v = out[t];
            if (mm->bias) v = v + mm->bias[j];
            mm->y[(size_t)(c0 + i0 + t) * (size_t)mm->n + (size_t)j] = v;
          }
        }
      }
    }
  }
}
