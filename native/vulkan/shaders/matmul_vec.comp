#version 450
#extension GL_GOOGLE_include_directive : require
// matmul for few activation rows (M ≤ 8: decoding, small batches): y[m, n] = Σ_k x[m, k] · w[n, k]
// · w_scale (+ bias[n]). The tiled kernel (matmul.comp) would leave most of a 32-row tile empty; here
// a workgroup takes 4 weight rows, its invocations split K, each keeps 8 × 4 partial sums, and the
// workgroup adds them up: with subgroup additions where the device has them (the .subgroup.spv
// variant, built with TP_SUBGROUP), else with a tree in shared memory. Specialization: 0 the workgroup
// size (128), 1 the weight format, 2 M.
// Same push constants, bindings and weight windows as matmul.comp; one workgroup per 4 rows of w.
#ifdef TP_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.glsl"
#include "minifloat.glsl"
#include "weights.glsl"

layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint K;
  uint x_off;
  uint b_off;
  uint has_bias;
  uint w_off;  // bytes
  uint w_row_bytes;
  float w_scale;
  uint n_total;
  uint n_base;
  uint k_lo;        // K is summed over [k_lo, k_hi) (a chunk: see matmul.comp)
  uint k_hi;
  uint accumulate;  // 1: y += this chunk's sum
} pc;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };

layout(constant_id = 2) const uint MR = 8u;  // activation rows (M; specialised per M ≤ 8)
const uint NR = 4u;                           // weight rows per workgroup

#ifdef TP_SUBGROUP
shared float part[32u * MR * NR];  // one slot per subgroup: at most 32 (128 invocations, ≥ 4 per subgroup)
#else
shared float part[gl_WorkGroupSize.x * MR * NR];
#endif

void main() {
  uint lid = gl_LocalInvocationID.x;
  uint wg = gl_WorkGroupSize.x;
  uint n0 = group_index() * NR;
  if (n0 >= pc.N) return;  // whole workgroups leave together
  float acc[MR * NR];
  for (uint j = 0u; j < MR * NR; j++) acc[j] = 0.0;
  for (uint k = pc.k_lo + lid; k < pc.k_hi; k += wg) {
    float xv[MR];
    for (uint m = 0u; m < MR; m++) xv[m] = x[pc.x_off + m * pc.K + k];
    for (uint r = 0u; r < NR; r++) {
      if (n0 + r >= pc.N) break;
      float w = w_at(pc.w_off + (n0 + r) * pc.w_row_bytes, k);
      for (uint m = 0u; m < MR; m++) acc[m * NR + r] += xv[m] * w;
    }
  }
#ifdef TP_SUBGROUP
  for (uint j = 0u; j < MR * NR; j++) {
    float s = subgroupAdd(acc[j]);
    if (subgroupElect()) part[gl_SubgroupID * MR * NR + j] = s;
  }
  barrier();
  if (lid < MR * NR) {
    float s = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) s += part[g * MR * NR + lid];
    acc[0] = s;
  }
#else
  for (uint j = 0u; j < MR * NR; j++) part[lid * MR * NR + j] = acc[j];
  barrier();
  for (uint s = wg / 2u; s > 0u; s >>= 1) {
    if (lid < s)
      for (uint j = 0u; j < MR * NR; j++) part[lid * MR * NR + j] += part[(lid + s) * MR * NR + j];
    barrier();
  }
  if (lid < MR * NR) acc[0] = part[lid];
#endif
  if (lid < MR * NR) {
    uint m = lid / NR;
    uint n = n0 + lid % NR;
    if (m < pc.M && n < pc.N) {
      float v = acc[0] * pc.w_scale;
      if (pc.has_bias != 0u) v += bias[pc.b_off + pc.n_base + n];
      uint o = m * pc.n_total + pc.n_base + n;
      y[o] = pc.accumulate != 0u ? y[o] + v : v;
    }
  }
}
