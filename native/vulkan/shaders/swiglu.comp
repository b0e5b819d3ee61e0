#version 450
#extension GL_GOOGLE_include_directive : require
// swiglu: y = silu(gate) · up (Shazeer 2020); a = gate, b = up.
#include "elementwise.glsl"
#include "math.glsl"

layout(std430, binding = 2) readonly buffer B { float b[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  uvec3 o = offsets(i);
  float g = a[o.x];
  y[i] = g * tp_sigmoid(g) * b[o.y];
}
