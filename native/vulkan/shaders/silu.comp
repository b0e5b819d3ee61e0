#version 450
#extension GL_GOOGLE_include_directive : require
// silu: y = x · σ(x) = x / (1 + e^(−x)) (Elfwing et al. 2018).
#include "elementwise.glsl"
#include "math.glsl"

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  float x = a[offsets(i).x];
  y[i] = x * tp_sigmoid(x);
}
