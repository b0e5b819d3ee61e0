#version 450
#extension GL_GOOGLE_include_directive : require
// add: y = a + b with broadcasting (strides of 0); one f32 operation, exact as the reference.
#include "elementwise.glsl"

layout(std430, binding = 2) readonly buffer B { float b[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  uvec3 o = offsets(i);
  y[i] = a[o.x] + b[o.y];
}
