// ConvRot weights (ComfyUI W8A8 / W4A4; @tp/quant convrot-linear.ts), shared by matmul_convrot.comp
// and matmul_id.comp: the integer code of a weight element, and the rescale of an exact integer dot
// product of activation codes (convrot_quantize.comp) with weight codes into y (before the bias):
//   int8: y = f32(f32(acc) · f32(s_x · s_w)),   int4: y = f32(f32(f32(acc) · s_x) · s_w).
// Weight codes: int8 one byte per element (a row is K bytes); int4 two's-complement nibbles, element
// 2k in bits 0..3 of byte k (a row is K / 2 bytes; krea2.md §1.8).
// Needs `uint wb(uint byte)` (a byte of the weight binding) from the includer.

// Code k of the ConvRot weight row that starts at byte `rb`, for `bits` 8 or 4.
int convrot_w_code(uint rb, uint k, uint bits) {
  if (bits == 8u) return int(wb(rb + k) << 24) >> 24;
  uint byte_ = wb(rb + k / 2u);
  uint nib = (k & 1u) == 0u ? byte_ & 15u : byte_ >> 4;
  return int(nib ^ 8u) - 8;
}

// y of an exact integer sum `acc` with activation row scale s_x and weight row scale s_w.
float convrot_rescale(int acc, float s_x, float s_w, uint bits) {
  float a = float(acc);
  return bits == 8u ? a * (s_x * s_w) : (a * s_x) * s_w;
}
