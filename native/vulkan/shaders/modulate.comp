#version 450
#extension GL_GOOGLE_include_directive : require
// modulate: y = x · (1 + scale) + shift (adaLN, Peebles & Xie 2023); a = x, b = scale, c = shift,
// scale and shift broadcast to x.
#include "elementwise.glsl"

layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 3) readonly buffer C { float c[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  uvec3 o = offsets(i);
  y[i] = a[o.x] * (1.0 + b[o.y]) + c[o.z];
}
