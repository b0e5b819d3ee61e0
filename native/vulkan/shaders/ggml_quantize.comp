#version 450
#extension GL_GOOGLE_include_directive : require
// The activation side of a GGUF matmul, as ggml pairs it (its CPU `vec_dot_type`; llm.md §2.6;
// ggml-quants.c quantize_row_q8_0_ref / q8_1_ref / q8_K_ref; native/cpu/quantize_act.c; @tp/quant
// quantizeActivationsGgml): x is quantized to 8-bit blocks and the matmul kernels then read the
// dequantized values, so y = Σ decode(w) · dequant(quant(x)) — ggml's (and the cpu backend's) integer
// block dot products up to f32 summation order. Without it, f32 x gives a different (if more exact)
// product, off by ~4e-3 relative from llama.cpp's on Q4_0 / Q8_0 weights, enough to flip greedy tokens.
//   KIND 0, Q8_0 / Q8_1 (q4_0, q5_0, q8_0 / q4_1, q5_1 weights), per 32: d = max|x| / 127,
//     q = roundf(x · (1/d)) (ties away from zero), x' = f16(d) · q (exact in f32).
//     (Q8_1's stored sum s = f16(Σq · d) is not modelled: the weights' min term uses f16(d) · Σq.)
//   KIND 1, Q8_K (q2_k … q6_k weights), per 256: max = the signed value of largest magnitude,
//     is = −127 / max, q = min(127, round_half_even(is · x)), x' = (1 / is) · q.
// One invocation per block (≤ 512 loop iterations). f32 division as the cpu backend's (correctly
// rounded on llvmpipe; Vulkan allows GPUs 2.5 ulp, which can move a code at a rounding boundary).
// Bindings: 0 x' (f32 [blocks · block]), 1 x (contiguous f32, from element x_off).
#include "common.glsl"
#include "minifloat.glsl"

layout(push_constant) uniform Push {
  uint blocks;
  uint kind;   // 0: Q8_0 / Q8_1, 1: Q8_K
  uint x_off;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };

// C roundf (ties away from zero): the fraction v − trunc(v) is exact.
float round_away(float v) {
  float t = trunc(v);
  precise float f = v - t;
  if (f >= 0.5) return t + 1.0;
  if (f <= -0.5) return t - 1.0;
  return t;
}

void main() {
  uint b = global_index();
  if (b >= pc.blocks) return;
  if (pc.kind == 0u) {
    uint base = b * 32u;
    float amax = 0.0;
    for (uint j = 0u; j < 32u; j++) {
      float a = abs(x[pc.x_off + base + j]);
      if (a > amax) amax = a;  // NaN never wins, as in C
    }
    precise float d = amax / 127.0;
    precise float id = d != 0.0 ? 1.0 / d : 0.0;
    float dh = f16_to_f32(f32_to_mini(floatBitsToUint(d), F16, false));
    for (uint j = 0u; j < 32u; j++) {
      precise float v = x[pc.x_off + base + j] * id;
      y[base + j] = dh * round_away(v);
    }
  } else {
    uint base = b * 256u;
    float amax = 0.0;
    float mx = 0.0;
    for (uint j = 0u; j < 256u; j++) {
      float v = x[pc.x_off + base + j];
      float a = abs(v);
      if (a > amax) {
        amax = a;
        mx = v;
      }
    }
    if (amax == 0.0) {
      for (uint j = 0u; j < 256u; j++) y[base + j] = 0.0;
      return;
    }
    precise float is = -127.0 / mx;
    precise float d = 1.0 / is;
    for (uint j = 0u; j < 256u; j++) {
      precise float v = is * x[pc.x_off + base + j];
      y[base + j] = d * min(roundEven(v), 127.0);
    }
  }
}
