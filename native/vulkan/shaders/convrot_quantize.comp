#version 450
#extension GL_GOOGLE_include_directive : require
// The activation side of a ConvRot matmul (@tp/quant convrot-linear.ts, ComfyUI's W8A8 / W4A4):
// 1. rotate each group of g = 4^m columns of a row with the f32 Hadamard butterfly of @tp/quant
//    hadamardTransform — the same additions in the same order, then × 2^−m — so the result matches
//    it bit for bit;
// 2. s = max(f32(amax / 127), 1e-30) (bits 8) or f32(max(amax, 1e-10) / 7) (bits 4) per row;
// 3. codes = clamp(round_half_even(f32(x_rot / s)), −128 | −7, 127 | 7).
// A rotated row holding NaN gets s = NaN, one holding ±inf (no NaN) s = +inf, and codes 0 either way,
// as the reference's Math.max / division give them (and the cpu backend's tp_convrot_nonfinite_row):
// the row's outputs are then 0 · s = NaN. GLSL's max() may drop a NaN, so NaN is tracked apart.
// One workgroup per row; a group goes through shared memory (g ≤ specialization constant 1).
// Bindings: 0 codes (i32 [M, K]), 1 scales (f32 [M]), 2 x (contiguous f32), 3 x_rot scratch (f32 [M, K]).
#include "common.glsl"
#include "reduce.glsl"

layout(constant_id = 1) const uint MAX_GROUP = 256;

layout(push_constant) uniform Push {
  uint rows;
  uint K;
  uint group;   // g = 4^m
  uint digits;  // m
  uint bits;    // 8 or 4
  uint x_off;
} pc;

layout(std430, binding = 0) writeonly buffer Codes { int codes[]; };
layout(std430, binding = 1) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) coherent buffer R { float xr[]; };

shared float grp[MAX_GROUP];

void main() {
  uint r = group_index();
  if (r >= pc.rows) return;
  uint lid = gl_LocalInvocationID.x;
  uint wg = gl_WorkGroupSize.x;
  uint g = pc.group;
  float norm = exp2(-float(pc.digits));
  float amax = 0.0;
  float nan_seen = 0.0;  // 1.0 once this invocation saw a NaN
  for (uint g0 = 0u; g0 < pc.K; g0 += g) {
    for (uint t = lid; t < g; t += wg) grp[t] = x[pc.x_off + r * pc.K + g0 + t];
    barrier();
    for (uint s = 1u; s < g; s *= 4u) {
      for (uint t = lid; t < g / 4u; t += wg) {
        uint p = (t / s) * 4u * s + t % s;
        precise float a = grp[p];
        precise float b = grp[p + s];
        precise float c = grp[p + 2u * s];
        precise float d = grp[p + 3u * s];
        precise float ab = a + b;
        precise float r0 = (ab + c) - d;
        precise float r1 = (ab - c) + d;
        precise float r2 = ((a - b) + c) + d;
        precise float r3 = ((b - a) + c) + d;
        grp[p] = r0;
        grp[p + s] = r1;
        grp[p + 2u * s] = r2;
        grp[p + 3u * s] = r3;
      }
      barrier();
    }
    for (uint t = lid; t < g; t += wg) {
      float v = grp[t] * norm;
      xr[r * pc.K + g0 + t] = v;
      amax = max(amax, abs(v));
      if (isnan(v)) nan_seen = 1.0;
    }
    barrier();
  }
  amax = wg_max(amax);
  bool nan_row = wg_max(nan_seen) > 0.0;
  memoryBarrierBuffer();
  barrier();
  if (nan_row || isinf(amax)) {
    if (lid == 0u) scales[r] = nan_row ? uintBitsToFloat(0x7fc00000u) : uintBitsToFloat(0x7f800000u);
    for (uint k = lid; k < pc.K; k += wg) codes[r * pc.K + k] = 0;
    return;
  }
  float s = pc.bits == 8u ? max(amax / 127.0, 1e-30) : max(amax, 1e-10) / 7.0;
  float lo = pc.bits == 8u ? -128.0 : -7.0;
  float hi = pc.bits == 8u ? 127.0 : 7.0;
  if (lid == 0u) scales[r] = s;
  for (uint k = lid; k < pc.K; k += wg) codes[r * pc.K + k] = int(clamp(roundEven(xr[r * pc.K + k] / s), lo, hi));
}
