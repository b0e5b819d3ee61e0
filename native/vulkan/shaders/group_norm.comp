#version 450
#extension GL_GOOGLE_include_directive : require
// group_norm (Wu & He 2018; torch.nn.functional.group_norm): x [batch, channels, spatial...], channels
// in `groups` groups of cpg; each group's cpg · spatial values (contiguous) are normalised together,
// then y = norm · w[c] + b[c] per channel c. One workgroup per (batch, group).
// Bindings: 0 y, 1 x (contiguous), 2 w, 3 b (any buffer when absent).
#include "common.glsl"

layout(push_constant) uniform Push {
  uint rows;     // batch · groups
  uint count;    // cpg · spatial
  uint spatial;
  uint cpg;
  uint groups;
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
  base = r * pc.count;
  uint g = r % pc.groups;
  float k = load(0u);
  vec2 mi = mean_inv_std(pc.count, k, pc.eps);
  for (uint i = gl_LocalInvocationID.x; i < pc.count; i += gl_WorkGroupSize.x) {
    uint c = g * pc.cpg + i / pc.spatial;
    float v = ((load(i) - k) - mi.x) * mi.y;
    if (pc.has_weight != 0u) v *= w[pc.w_off + c];
    if (pc.has_bias != 0u) v += b[pc.b_off + c];
    y[base + i] = v;
  }
}
