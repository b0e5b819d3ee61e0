#version 450
#extension GL_GOOGLE_include_directive : require
// argmax: index of the largest value of each row of n (the first one on ties) → i32.
// One workgroup per row. Bindings: 0 indices (i32), 1 x (contiguous f32).
#include "common.glsl"
#include "select.glsl"

layout(push_constant) uniform Push {
  uint rows;
  uint n;
  uint x_off;
} pc;

layout(std430, binding = 0) writeonly buffer I { int idx[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };

void main() {
  uint r = group_index();
  if (r >= pc.rows) return;
  float bv = 0.0;
  uint bi = 0xffffffffu;
  for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
    float v = x[pc.x_off + r * pc.n + i];
    if (before(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  wg_best(bv, bi);
  if (gl_LocalInvocationID.x == 0u) idx[r] = int(bi == 0xffffffffu ? 0u : bi);
}
