// Small floats (f16, OCP fp8 E4M3FN / E5M2) ⇄ f32 bit patterns with the rules of @tp/tensor
// convert.ts, bit for bit, in integer arithmetic: round to nearest even, NaN payloads as there,
// overflow to inf / NaN or (saturate) to ±max finite. Used by cast and by the fp8 weight decoders.
// Sources: IEEE 754-2019 §3.6; OCP 8-bit Floating Point Specification rev 1.0 §5.

// Small float layouts: exponent bits, mantissa bits, bias, IEEE specials, max finite, NaN, inf codes.
struct Mini {
  uint exp_bits;
  uint mant_bits;
  int bias;
  bool ieee;
  uint max_finite;
  uint nan;
  uint inf;
};
const Mini F16 = Mini(5u, 10u, 15, true, 0x7bffu, 0x7e00u, 0x7c00u);
const Mini E4M3FN = Mini(4u, 3u, 7, false, 0x7eu, 0x7fu, 0u);
const Mini E5M2 = Mini(5u, 2u, 15, true, 0x7bu, 0x7fu, 0x7cu);

// Round the magnitude bits `a` of a finite f32 to the small float's code, to nearest even (may exceed
// max_finite: the caller decides what overflow becomes). convert.ts roundMagnitude.
uint round_magnitude(uint a, Mini f) {
  uint exp_field = a >> 23;
  if (exp_field == 0u) return 0u;  // f32 subnormals are below half the smallest target subnormal
  int ef = int(exp_field) - 127;
  uint sig = (a & 0x7fffffu) | 0x800000u;
  int min_normal = 1 - f.bias;
  uint code;
  uint shift;
  if (ef >= min_normal) {
    shift = 23u - f.mant_bits;
    code = (uint(ef + f.bias) << f.mant_bits) | ((sig & 0x7fffffu) >> shift);
  } else {
    int sh = int(23u - f.mant_bits) + (min_normal - ef);
    if (sh > 24) return 0u;
    shift = uint(sh);
    code = sig >> shift;
  }
  uint rem = sig & ((1u << shift) - 1u);
  uint half_ = 1u << (shift - 1u);
  if (rem > half_ || (rem == half_ && (code & 1u) == 1u)) code += 1u;
  return code;
}

uint f32_to_mini(uint bits, Mini f, bool saturate) {
  uint width = 1u + f.exp_bits + f.mant_bits;
  uint sign = (bits >> 31) << (width - 1u);
  uint a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | f.nan | (width == 16u ? (a & 0x7fffffu) >> 13 : 0u);
  uint overflow = saturate ? f.max_finite : (f.ieee ? f.inf : f.nan);
  if (a == 0x7f800000u) return sign | overflow;
  uint code = round_magnitude(a, f);
  return sign | (code > f.max_finite ? overflow : code);
}

uint mini_to_f32(uint code, Mini f) {
  uint width = 1u + f.exp_bits + f.mant_bits;
  uint sign = ((code >> (width - 1u)) & 1u) << 31;
  uint e = (code >> f.mant_bits) & ((1u << f.exp_bits) - 1u);
  uint m = code & ((1u << f.mant_bits) - 1u);
  uint e_max = (1u << f.exp_bits) - 1u;
  uint shift = 23u - f.mant_bits;
  if (f.ieee && e == e_max) return m == 0u ? sign | 0x7f800000u : sign | 0x7fc00000u | (m << shift);
  if (!f.ieee && e == e_max && m == (1u << f.mant_bits) - 1u) return sign | 0x7fc00000u;
  if (e == 0u) {
    if (m == 0u) return sign;
    int ex = 1 - f.bias;
    while ((m & (1u << f.mant_bits)) == 0u) {
      m <<= 1;
      ex -= 1;
    }
    m &= (1u << f.mant_bits) - 1u;
    return sign | (uint(ex + 127) << 23) | (m << shift);
  }
  return sign | (uint(int(e) - f.bias + 127) << 23) | (m << shift);
}

uint f32_to_bf16(uint u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
