#version 450
#extension GL_GOOGLE_include_directive : require
// scale: y = x · s (one f32 product, exact as the reference).
#include "elementwise.glsl"

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  y[i] = a[offsets(i).x] * pc.param;
}
