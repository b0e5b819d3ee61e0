/*
 * Reference conversions between f32 and the narrow float types, bit-exact as documented in
 * ../include/tp.h (tp_cpu_cast). Every ISA level uses these for fp8 and for the tails of its
 * vector loops, and the vector kernels are tested against them bit for bit.
 *
 * Everything is done on the integer bits, so results do not depend on the floating-point
 * environment (rounding mode, flush-to-zero / denormals-are-zero).
 *
 * A narrow float format here is (mbits, bias): exponent field e, mantissa field m, value
 *   e > 0 (normal):    2^(e - bias) * (1 + m / 2^mbits)
 *   e = 0 (subnormal): 2^(1 - bias) * (m / 2^mbits)
 *   f16       mbits 10, bias 15   (IEEE 754 binary16)
 *   f8_e4m3fn mbits  3, bias  7   (OCP OFP8 E4M3: no infinities, S.1111.111 is NaN, max 448)
 *   f8_e5m2   mbits  2, bias 15   (OCP OFP8 E5M2: IEEE-like infinities and NaNs, max 57344)
 * Source: IEEE 754-2019 §3.4; OCP "8-bit Floating Point Specification (OFP8)" rev 1.0, §5.
 */
#include <stdint.h>

#include "internal.h"

#define F32_SIGN 0x80000000u
#define F32_INF 0x7F800000u   /* exponent all ones, mantissa 0 */
#define F32_QUIET 0x00400000u /* the top mantissa bit: set in a quiet NaN */
#define F32_MANT 0x007FFFFFu

/* ---- decoding: narrow -> f32 ----------------------------------------------------------------- */

/*
 * f32 bits of the finite magnitude code (e << mbits | m) of a format (mbits, bias). Exact: every
 * narrow value is representable in f32.
 */
static uint32_t decode_magnitude(uint32_t code, int mbits, int bias) {
  uint32_t e = code >> mbits;
  uint32_t m = code & ((1u << mbits) - 1);
  if (e != 0) return ((e + 127 - (uint32_t)bias) << 23) | (m << (23 - mbits)); /* rebias */
  if (m == 0) return 0;
  /*
   * Subnormal: 2^(1 - bias) * 0.m. Shift m left until its leading one reaches the implicit-bit
   * position (bit mbits), lowering the exponent once per shift, then drop the leading one.
   */
  uint32_t f32_exp = (uint32_t)(1 - bias + 127);
  while ((m & (1u << mbits)) == 0) {
    m <<= 1;
    f32_exp--;
  }
  m &= (1u << mbits) - 1;
  return (f32_exp << 23) | (m << (23 - mbits));
}

/* A narrow NaN with mantissa m: payload moved to the top of the f32 mantissa, quiet bit set. */
static uint32_t decode_nan(uint32_t m, int mbits) { return F32_INF | F32_QUIET | (m << (23 - mbits)); }

static uint32_t f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t code = h & 0x7FFFu;
  if (code >= 0x7C00u) return sign | (code == 0x7C00u ? F32_INF : decode_nan(code & 0x3FFu, 10));
  return sign | decode_magnitude(code, 10, 15);
}

static uint32_t f8_e4m3fn_to_f32(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  const uint32_t code = b & 0x7Fu;
  /* S.1111.111 is the only NaN (no infinities): the canonical quiet NaN, as @tp/tensor convert.ts */
  if (code == 0x7Fu) return sign | F32_INF | F32_QUIET;
  return sign | decode_magnitude(code, 3, 7);
}

static uint32_t f8_e5m2_to_f32(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  const uint32_t code = b & 0x7Fu;
  if (code >= 0x7Cu) return sign | (code == 0x7Cu ? F32_INF : decode_nan(code & 0x3u, 2));
  return sign | decode_magnitude(code, 2, 15);
}

/* ---- encoding: f32 -> narrow ----------------------------------------------------------------- */

/*
 * Round the magnitude `a` (f32 bits, sign clear, not NaN) to the format (mbits, bias), to nearest,
 * ties to even. Returns the magnitude code e << mbits | m. A result that does not fit the format
 * comes back as a code above the largest finite one (+inf gives such a code too); the caller
 * decides what overflow means.
 */
static uint32_t round_magnitude(uint32_t a, int mbits, int bias) {
  const int32_t f32_exp = (int32_t)(a >> 23); /* biased; 0 for zero and f32 subnormals */

  if (f32_exp - 127 >= 1 - bias) {
    /*
     * Normal in the target. Drop the low `shift` mantissa bits with round-half-to-even: adding
     * half - 1 plus the lowest kept bit carries exactly when the dropped part is above half, or
     * equal to half with an odd kept part. A carry out of the mantissa bumps the exponent, which
     * is the right result (up to the next binade, or beyond the largest finite code).
     */
    const int shift = 23 - mbits;
    const uint32_t rounded = (a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1u)) >> shift;
    return rounded - ((uint32_t)(127 - bias) << mbits); /* rebias the exponent field */
  }

  /*
   * Subnormal (or zero) in the target: count units of 2^(1 - bias - mbits). The f32 value is
   * sig * 2^(exp - 23) with sig its 24-bit significand, so the count is sig >> s with
   * s = 24 - bias - mbits - exp; here s > 23 - mbits, and s > 24 means below half a unit.
   */
  const uint32_t sig = (a & F32_MANT) | (f32_exp != 0 ? 0x00800000u : 0u);
  const int32_t exp = f32_exp != 0 ? f32_exp - 127 : -126;
  const int32_t s = 24 - bias - mbits - exp;
  if (s > 24) return 0;
  uint32_t q = sig >> s;
  const uint32_t rem = sig & ((1u << s) - 1);
  const uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (q & 1u))) q++; /* may carry into the smallest normal: right */
  return q;
}

static uint16_t f32_to_f16(uint32_t u) {
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & ~F32_SIGN;
  /* NaN: sign | 0x7E00 | top 9 payload bits (VCVTPS2PH's rule: quiet bit 0x0200 set) */
  if (a > F32_INF) return (uint16_t)(sign | 0x7E00u | ((a & F32_MANT) >> 13));
  uint32_t code = round_magnitude(a, 10, 15);
  if (code > 0x7C00u) code = 0x7C00u; /* overflow and +-inf -> +-inf (0x7C00 itself is inf) */
  return (uint16_t)(sign | code);
}

static uint8_t f32_to_f8_e4m3fn(uint32_t u, uint32_t flags) {
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & ~F32_SIGN;
  if (a > F32_INF) return (uint8_t)(sign | 0x7Fu); /* NaN -> S.1111.111 */
  uint32_t code = round_magnitude(a, 3, 7);
  /* 0x7E = 448 is the largest finite code; 0x7F and beyond (including +-inf) overflow */
  if (code > 0x7Eu) code = (flags & TP_CAST_SATURATE) ? 0x7Eu : 0x7Fu;
  return (uint8_t)(sign | code);
}

static uint8_t f32_to_f8_e5m2(uint32_t u, uint32_t flags) {
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & ~F32_SIGN;
  if (a > F32_INF) return (uint8_t)(sign | 0x7Fu); /* NaN -> S.11111.11 */
  uint32_t code = round_magnitude(a, 2, 15);
  /* 0x7B = 57344 is the largest finite code; 0x7C and beyond (including +-inf) overflow */
  if (code > 0x7Bu) code = (flags & TP_CAST_SATURATE) ? 0x7Bu : 0x7Cu;
  return (uint8_t)(sign | code);
}

/* f32 -> bf16: round the low 16 bits away, ties to even; NaN keeps its upper payload, made quiet. */
static uint16_t f32_to_bf16(uint32_t u) {
  if ((u & ~F32_SIGN) > F32_INF) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* ---- array kernels (tp_cast_fn) -------------------------------------------------------------- */

void tp_cast_f16_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint16_t *s = src;
  uint32_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f16_to_f32(s[i]);
}

void tp_cast_f32_to_f16_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint32_t *s = src;
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(s[i]);
}

void tp_cast_bf16_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint16_t *s = src;
  uint32_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16; /* bf16 is the top half of an f32 */
}

void tp_cast_f32_to_bf16_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint32_t *s = src;
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(s[i]);
}

void tp_cast_f8_e4m3fn_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint8_t *s = src;
  uint32_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f8_e4m3fn_to_f32(s[i]);
}

void tp_cast_f32_to_f8_e4m3fn_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  const uint32_t *s = src;
  uint8_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f32_to_f8_e4m3fn(s[i], flags);
}

void tp_cast_f8_e5m2_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  (void)flags;
  const uint8_t *s = src;
  uint32_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f8_e5m2_to_f32(s[i]);
}

void tp_cast_f32_to_f8_e5m2_scalar(const void *src, void *dst, size_t n, uint32_t flags) {
  const uint32_t *s = src;
  uint8_t *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = f32_to_f8_e5m2(s[i], flags);
}
