#version 450
#extension GL_GOOGLE_include_directive : require
// softmax along one dimension, max-subtracted: y_i = e^(x_i − m) / Σ_j e^(x_j − m), m = max_j x_j.
// One workgroup per row; a row is `size` elements `inner` apart (the dimension's stride in a
// contiguous tensor [outer, size, inner]), row r = o · inner + c starts at o · size · inner + c.
// Bindings: 0 y, 1 x (contiguous, offset x_off).
#include "common.glsl"
#include "math.glsl"
#include "reduce.glsl"

layout(push_constant) uniform Push {
  uint rows;
  uint size;
  uint inner;
  uint x_off;
} pc;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };

void main() {
  uint r = group_index();
  if (r >= pc.rows) return;  // uniform per workgroup: whole groups leave together
  uint base = (r / pc.inner) * pc.size * pc.inner + r % pc.inner;
  uint lid = gl_LocalInvocationID.x;
  float m = -uintBitsToFloat(0x7f800000u);
  for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) m = max(m, x[pc.x_off + base + i * pc.inner]);
  m = wg_max(m);
  float s = 0.0;
  for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) {
    float e = tp_exp(x[pc.x_off + base + i * pc.inner] - m);
    y[base + i * pc.inner] = e;
    s += e;
  }
  s = wg_sum(s);
  for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) y[base + i * pc.inner] /= s;
}
