#version 450
#extension GL_GOOGLE_include_directive : require
// softplus: y = log(1 + e^x), and x itself above 20 (ggml_softplus).
#include "elementwise.glsl"

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  float v = a[offsets(i).x];
  if (v > 20.0) {
    y[i] = v;
    return;
  }
  // log1p(u), u = e^v, accurate for small u (Goldberg 1991, Theorem 4): u · log(w) / (w − 1), w = 1 + u
  float u = exp(v);
  float w = 1.0 + u;
  y[i] = w == 1.0 ? u : u * log(w) / (w - 1.0);
}
