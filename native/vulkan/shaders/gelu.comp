#version 450
#extension GL_GOOGLE_include_directive : require
// gelu (Hendrycks & Gimpel 2016): param 0 — x·Φ(x) = ½x(1 + erf(x/√2)); param 1 — the tanh form
// ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³), computed as x·σ(2u), which equals it exactly
// (½(1 + tanh u) = σ(2u)) and does not cancel for negative x.
#include "elementwise.glsl"
#include "math.glsl"

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  float x = a[offsets(i).x];
  if (pc.param == 0.0) {
    y[i] = 0.5 * x * (1.0 + tp_erf(x * 0.70710678118654752440));
  } else {
    float u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
    y[i] = x * tp_sigmoid(2.0 * u);
  }
}
