#version 450
#extension GL_GOOGLE_include_directive : require
// cast: elementwise dtype conversion with the rounding rules of @tp/tensor convert.ts, bit for bit,
// in integer arithmetic (no driver rounding mode is involved). MODE (specialization constant 1):
//   0 f32 → f16, 1 f32 → bf16, 2 f32 → f8_e4m3fn, 3 f32 → f8_e5m2,
//   4 f16 → f32, 5 bf16 → f32, 6 f8_e4m3fn → f32, 7 f8_e5m2 → f32.
// Narrow outputs: one invocation per 32-bit output word (2 halves or 4 bytes); f32 outputs: one per
// element. Input and output contiguous; src_off in elements. Bindings: 0 dst, 1 src (words).
// Sources: IEEE 754-2019 §3.6; OCP 8-bit Floating Point Specification rev 1.0 §5.
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;

layout(push_constant) uniform Push {
  uint n;         // elements
  uint saturate;  // f32 → fp8: clamp overflow to ±max finite
  uint src_off;
} pc;

layout(std430, binding = 0) writeonly buffer Dst { uint dst[]; };
layout(std430, binding = 1) readonly buffer Src { uint src[]; };

#include "minifloat.glsl"

uint encode(uint bits) {
  bool sat = pc.saturate != 0u;
  if (MODE == 0u) return f32_to_mini(bits, F16, false);
  if (MODE == 1u) return f32_to_bf16(bits);
  if (MODE == 2u) return f32_to_mini(bits, E4M3FN, sat);
  return f32_to_mini(bits, E5M2, sat);
}

void main() {
  uint i = global_index();
  if (MODE < 4u) {
    uint per = MODE < 2u ? 2u : 4u;  // outputs per word
    uint bits = 32u / per;
    uint first = i * per;
    if (first >= pc.n) return;
    uint word = 0u;
    for (uint j = 0u; j < per && first + j < pc.n; j++) word |= encode(src[pc.src_off + first + j]) << (j * bits);
    dst[i] = word;
  } else {
    if (i >= pc.n) return;
    uint per = MODE < 6u ? 2u : 4u;  // inputs per word
    uint bits = 32u / per;
    uint e = pc.src_off + i;
    uint code = (src[e / per] >> ((e % per) * bits)) & ((1u << bits) - 1u);
    uint out_bits;
    if (MODE == 4u) out_bits = mini_to_f32(code, F16);
    else if (MODE == 5u) out_bits = code << 16;
    else if (MODE == 6u) out_bits = mini_to_f32(code, E4M3FN);
    else out_bits = mini_to_f32(code, E5M2);
    dst[i] = out_bits;
  }
}
