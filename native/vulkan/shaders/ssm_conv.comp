#version 450
#extension GL_GOOGLE_include_directive : require
// ssm_conv (ggml_ssm_conv): the depthwise causal conv over time of Mamba / Gated DeltaNet layers.
// x [t_out + K − 1, C] contiguous (the K − 1 previous inputs, then the new ones), w [C, K] (tap 0 the
// oldest) → y [t_out, C], y[t][c] = Σ_j w[c][j] · x[t + j][c]. One invocation per output element.
// Bindings: 0 y, 1 x, 2 w.
#include "common.glsl"

layout(push_constant) uniform Push {
  uint n;  // elements of y
  uint channels;
  uint taps;
  uint x_off;
  uint w_off;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  uint c = i % pc.channels;
  uint t = i / pc.channels;
  float s = 0.0;
  for (uint j = 0u; j < pc.taps; j++) s += w[pc.w_off + c * pc.taps + j] * x[pc.x_off + (t + j) * pc.channels + c];
  y[i] = s;
}
