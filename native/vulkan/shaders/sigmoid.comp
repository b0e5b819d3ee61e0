#version 450
#extension GL_GOOGLE_include_directive : require
// sigmoid: y = 1 / (1 + e^(−x)).
#include "elementwise.glsl"
#include "math.glsl"

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  y[i] = tp_sigmoid(a[offsets(i).x]);
}
