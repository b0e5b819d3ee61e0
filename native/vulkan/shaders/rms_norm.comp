#version 450
#extension GL_GOOGLE_include_directive : require
// rms_norm over the last dimension (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) · g, with
// g = w, 1 + w (unit_offset: Gemma, Krea 2), or 1 (no weight). One workgroup per row of d elements.
// Bindings: 0 y, 1 x (contiguous), 2 w (any buffer when has_weight is 0).
#include "common.glsl"
#include "reduce.glsl"

layout(push_constant) uniform Push {
  uint rows;
  uint d;
  uint x_off;
  uint w_off;
  float eps;
  uint has_weight;
  uint unit_offset;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };

void main() {
  uint r = group_index();
  if (r >= pc.rows) return;
  uint base = r * pc.d;
  uint lid = gl_LocalInvocationID.x;
  float ss = 0.0;
  for (uint i = lid; i < pc.d; i += gl_WorkGroupSize.x) {
    float v = x[pc.x_off + base + i];
    ss += v * v;
  }
  ss = wg_sum(ss);
  float inv = 1.0 / sqrt(ss / float(pc.d) + pc.eps);
  float g0 = pc.unit_offset != 0u ? 1.0 : 0.0;
  for (uint i = lid; i < pc.d; i += gl_WorkGroupSize.x) {
    float v = x[pc.x_off + base + i] * inv;
    if (pc.has_weight != 0u) v *= g0 + w[pc.w_off + i];
    y[base + i] = v;
  }
}
