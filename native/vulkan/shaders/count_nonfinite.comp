#version 450
#extension GL_GOOGLE_include_directive : require
// count_nonfinite: the number of NaN / ±∞ values (exponent bits all ones) of x[x_off, x_off + n) →
// one i32, saturating at 2^31 − 1. One workgroup: each invocation counts a strided share of the
// elements, then a tree over shared memory adds the counts (exact: integers).
// Bindings: 0 the count (i32), 1 x (contiguous f32, read as its bits).
#include "common.glsl"

layout(push_constant) uniform Push {
  uint n;
  uint x_off;
} pc;

layout(std430, binding = 0) writeonly buffer O { int count[]; };
layout(std430, binding = 1) readonly buffer X { uint x[]; };

shared uint part[gl_WorkGroupSize.x];

void main() {
  uint lid = gl_LocalInvocationID.x;
  uint c = 0u;
  for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) {
    if ((x[pc.x_off + i] & 0x7f800000u) == 0x7f800000u) c++;
  }
  part[lid] = c;
  barrier();
  for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1) {
    if (lid < s) part[lid] += part[lid + s];
    barrier();
  }
  if (lid == 0u) count[0] = int(min(part[0], 0x7fffffffu));
}
