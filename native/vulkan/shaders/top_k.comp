#version 450
#extension GL_GOOGLE_include_directive : require
// top_k: the k largest values of each row of n, in descending order (ties: lower index first), and
// their indices. Round t picks the best element that comes after pick t − 1 in that order, so no
// scratch is needed: O(k · n / WG) per invocation. One workgroup per row.
// Bindings: 0 values (f32), 1 indices (i32), 2 x (contiguous f32).
#include "common.glsl"
#include "select.glsl"

layout(push_constant) uniform Push {
  uint rows;
  uint n;
  uint k;
  uint x_off;
} pc;

layout(std430, binding = 0) writeonly buffer Vals { float vals[]; };
layout(std430, binding = 1) writeonly buffer Idx { int idx[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };

void main() {
  uint r = group_index();
  if (r >= pc.rows) return;
  float last_v = 0.0;
  uint last_i = 0xffffffffu;  // none picked yet
  for (uint t = 0u; t < pc.k; t++) {
    float bv = 0.0;
    uint bi = 0xffffffffu;
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
      float v = x[pc.x_off + r * pc.n + i];
      bool after_last = last_i == 0xffffffffu || before(last_v, last_i, v, i);
      if (after_last && before(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    wg_best(bv, bi);
    if (gl_LocalInvocationID.x == 0u) {
      vals[r * pc.k + t] = bv;
      idx[r * pc.k + t] = int(bi);
    }
    last_v = bv;
    last_i = bi;
  }
}
