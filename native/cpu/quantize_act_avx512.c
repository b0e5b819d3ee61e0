/*
 * ConvRot activation rotation + quantization with AVX-512, bit-exact with the scalar reference in
 * quantize_act.c (and @tp/quant quantizeActivationsConvRot): the same f32 additions in the same
 * order, the same division and round-half-even.
 *
 * The butterfly pass of stride s combines v[p], v[p+s], v[p+2s], v[p+3s] (a, b, c, d) into
 *   ((a+b)+c)−d, ((a+b)−c)+d, ((a−b)+c)+d, ((b−a)+c)+d.
 * For s = 1 and 4 the four inputs lie in one 16-lane vector: each lane gathers its quad's a, b, c, d
 * with a permute and flips signs by lane position (x − y = x + (−y) exactly, so the rounding is the
 * scalar one). For s ≥ 16 the inputs are whole vectors. Passes run in the reference order 1, 4, 16, …
 */
#include <immintrin.h>

#include "matmul.h"

/* Sign-bit masks (0x80000000 where the operand is negated) of one in-vector pass of stride s. */
typedef struct pass_consts {
  __m512i ia, ib, ic, id;     /* lane → index of its quad's a, b, c, d */
  __m512i na, nb, nc, nd;     /* negate a / b / c / d in this lane */
} pass_consts;

static pass_consts make_pass(int s) {
  int32_t ia[16], ib[16], ic[16], id[16], na[16], nb[16], nc[16], nd[16];
  for (int lane = 0; lane < 16; lane++) {
    const int pos = (lane / s) % 4;
    const int first = lane - pos * s;
    ia[lane] = first;
    ib[lane] = first + s;
    ic[lane] = first + 2 * s;
    id[lane] = first + 3 * s;
    const int32_t neg = (int32_t)0x80000000u;
    na[lane] = pos == 3 ? neg : 0;           /* b − a = (−a) + b */
    nb[lane] = pos == 2 ? neg : 0;           /* a − b */
    nc[lane] = pos == 1 ? neg : 0;           /* (a+b) − c */
    nd[lane] = pos == 0 ? neg : 0;           /* … − d */
  }
  pass_consts p;
  p.ia = _mm512_loadu_si512(ia);
  p.ib = _mm512_loadu_si512(ib);
  p.ic = _mm512_loadu_si512(ic);
  p.id = _mm512_loadu_si512(id);
  p.na = _mm512_loadu_si512(na);
  p.nb = _mm512_loadu_si512(nb);
  p.nc = _mm512_loadu_si512(nc);
  p.nd = _mm512_loadu_si512(nd);
  return p;
}

static inline __m512 flip(__m512 v, __m512i sign) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign)); }

static inline __m512 in_vector_pass(__m512 v, const pass_consts *p) {
  const __m512 a = flip(_mm512_permutexvar_ps(p->ia, v), p->na);
  const __m512 b = flip(_mm512_permutexvar_ps(p->ib, v), p->nb);
  const __m512 c = flip(_mm512_permutexvar_ps(p->ic, v), p->nc);
  const __m512 d = flip(_mm512_permutexvar_ps(p->id, v), p->nd);
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), c), d);
}

void tp_convrot_quantize_row_avx512(const float *x, int64_t k, int32_t g, int32_t bits, float *tmp, int8_t *codes,
                                    float *scale, int32_t *sum) {
  if (g < 16 || k % 16 != 0) {
    tp_convrot_quantize_row_scalar(x, k, g, bits, tmp, codes, scale, sum);
    return;
  }
  const pass_consts p1 = make_pass(1), p4 = make_pass(4);
  const __m512 norm = _mm512_set1_ps(1.0f / (float)(1 << tp_log4(g)));
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0; /* lanes that met a NaN (max_ps does not keep one) */
  for (int64_t off = 0; off < k; off += g) {
    float *v = tmp + off;
    /* strides 1 and 4, inside each vector */
    for (int32_t i = 0; i < g; i += 16) {
      __m512 t = _mm512_loadu_ps(x + off + i);
      t = in_vector_pass(t, &p1);
      t = in_vector_pass(t, &p4);
      _mm512_store_ps(v + i, t);
    }
    /* strides 16, 64, …: whole vectors */
    for (int32_t s = 16; s < g; s *= 4) {
      for (int32_t base = 0; base < g; base += 4 * s) {
        for (int32_t o = 0; o < s; o += 16) {
          float *q = v + base + o;
          const __m512 a = _mm512_load_ps(q), b = _mm512_load_ps(q + s), c = _mm512_load_ps(q + 2 * s),
                       d = _mm512_load_ps(q + 3 * s);
          const __m512 ab = _mm512_add_ps(a, b);
          _mm512_store_ps(q, _mm512_sub_ps(_mm512_add_ps(ab, c), d));
          _mm512_store_ps(q + s, _mm512_add_ps(_mm512_sub_ps(ab, c), d));
          _mm512_store_ps(q + 2 * s, _mm512_add_ps(_mm512_add_ps(_mm512_sub_ps(a, b), c), d));
          _mm512_store_ps(q + 3 * s, _mm512_add_ps(_mm512_add_ps(_mm512_sub_ps(b, a), c), d));
        }
      }
    }
    for (int32_t i = 0; i < g; i += 16) {
      const __m512 t = _mm512_mul_ps(_mm512_load_ps(v + i), norm);
      _mm512_store_ps(v + i, t);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(t));
      nan |= _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q);
    }
  }
  const float a = _mm512_reduce_max_ps(amax);
  if (nan || a == INFINITY) { /* as quantize_act.c */
    tp_convrot_nonfinite_row(k, codes, scale, sum, nan != 0);
    return;
  }
  float s;
  int32_t lo, hi;
  if (bits == 8) {
    s = a / 127.0f;
    if (!(s >= 1e-30f)) s = 1e-30f;
    lo = -128;
    hi = 127;
  } else {
    s = (a > 1e-10f ? a : 1e-10f) / 7.0f;
    lo = -7;
    hi = 7;
  }
  const __m512 sv = _mm512_set1_ps(s);
  const __m512i lov = _mm512_set1_epi32(lo), hiv = _mm512_set1_epi32(hi);
  __m512i total = _mm512_setzero_si512();
  for (int64_t i = 0; i < k; i += 16) {
    const __m512 t = _mm512_div_ps(_mm512_load_ps(tmp + i), sv);
    __m512i q = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_epi32(_mm512_max_epi32(q, lov), hiv);
    total = _mm512_add_epi32(total, q);
    _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(q));
  }
  *scale = s;
  *sum = _mm512_reduce_add_epi32(total);
}

/* ---- ggml activation blocks (Q8_0 / Q8_1 / Q8_K), bit-exact with quantize_act.c ------------- */

/* C roundf (ties away from zero) of 16 lanes, exactly: truncate, then step by the exact fraction. */
static inline __m512i round_away16(__m512 t) {
  const __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_sub_ps(t, r); /* exact */
  __m512i q = _mm512_cvttps_epi32(r);
  q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ), q, _mm512_set1_epi32(1));
  q = _mm512_mask_sub_epi32(q, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), q, _mm512_set1_epi32(1));
  return q;
}

static void q8_0_blocks_avx512(const float *x, int64_t k, uint8_t *out, int with_sum) {
  const size_t bb = with_sum ? 36 : 34;
  for (int64_t b = 0; b < k / 32; b++) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    uint8_t *o = out + (size_t)b * bb;
    const __mmask16 nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
    if (nan || amax == INFINITY) { /* as quantize_act.c */
      tp_q8_nonfinite_block(o, bb, nan != 0);
      continue;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = tp_f32_f16(d);
    memcpy(o, &dh, 2);
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = round_away16(_mm512_mul_ps(v0, idv)), q1 = round_away16(_mm512_mul_ps(v1, idv));
    _mm_storeu_si128((__m128i *)(o + bb - 32), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(o + bb - 16), _mm512_cvtepi32_epi8(q1));
    if (with_sum) {
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      const uint16_t sh = tp_f32_f16((float)sum * d);
      memcpy(o + 2, &sh, 2);
    }
  }
}

void tp_quantize_q8_0_row_avx512(const float *x, int64_t k, uint8_t *out) { q8_0_blocks_avx512(x, k, out, 0); }
void tp_quantize_q8_1_row_avx512(const float *x, int64_t k, uint8_t *out) { q8_0_blocks_avx512(x, k, out, 1); }

void tp_quantize_q8_k_row_avx512(const float *x, int64_t k, uint8_t *out) {
  for (int64_t b = 0; b < k / 256; b++) {
    const float *v = x + 256 * b;
    uint8_t *o = out + (size_t)b * 292;
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < 256; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(v + i)));
    const float amax = _mm512_reduce_max_ps(m);
    memset(o, 0, 292);
    if (amax == 0.0f) continue; /* d = 0, codes and sums 0 */
    /* the signed value of the first element of largest magnitude (the scalar loop's `>`) */
    float max = 0.0f;
    for (int i = 0; i < 256; i += 16) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(v + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        max = v[i + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 is = _mm512_set1_ps(iscale);
    int16_t bs[16];
    for (int g = 0; g < 16; g++) {
      __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(v + 16 * g)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
      _mm_storeu_si128((__m128i *)(o + 4 + 16 * g), _mm512_cvtepi32_epi8(q));
      bs[g] = (int16_t)_mm512_reduce_add_epi32(q);
    }
    memcpy(o + 260, bs, 32);
    const float d = 1.0f / iscale;
    memcpy(o, &d, 4);
  }
}
