#version 450
#extension GL_GOOGLE_include_directive : require
// layer_norm over the last dimension (Ba et al. 2016; biased variance as torch):
// y = (x − mean) / sqrt(var + eps) · w + b, w and b optional. One workgroup per row of d elements.
// Bindings: 0 y, 1 x (contiguous), 2 w, 3 b (any buffer when absent).
#include "common.glsl"

layout(push_constant) uniform Push {
  uint rows;
  uint d;
  uint x_off;
  uint w_off;
  uint b_off;
  float eps;
  uint has_weight;
  uint has_bias;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
layout(std430, binding = 3) readonly buffer B { float b[]; };

uint base;
float load(uint i) { return x[pc.x_off + base + i]; }

#include "norm.glsl"

void main() {
  uint r = group_index();
  if (r >= pc.rows) return;
  base = r * pc.d;
  float k = load(0u);
  vec2 mi = mean_inv_std(pc.d, k, pc.eps);
  for (uint i = gl_LocalInvocationID.x; i < pc.d; i += gl_WorkGroupSize.x) {
    float v = ((load(i) - k) - mi.x) * mi.y;
    if (pc.has_weight != 0u) v *= w[pc.w_off + i];
    if (pc.has_bias != 0u) v += b[pc.b_off + i];
    y[base + i] = v;
  }
}
