#version 450
#extension GL_GOOGLE_include_directive : require
// matmul_id (ggml mul_mat_id): y[r, n] = Σ_k x[t, j or 0, k] · w_e[n, k] · w_scale for row r = t·S + j,
// e = ids[r], where the weight binding holds the experts stacked expert-major (expert e's rows start
// at byte w_off + e·N·w_row_bytes; read in place, in their checkpoint format: weights.glsl). The ids
// stay on the device: each workgroup reads its row's id. A workgroup takes 4 weight rows of one
// activation row, its invocations split K and add their partial sums in shared memory (as the
// fallback of matmul_vec.comp). An id outside [0, experts) gives a row of NaN (a kernel cannot throw).
// Specialization: 0 the workgroup size (128), 1 the weight format.
#include "common.glsl"
#include "minifloat.glsl"
#include "weights.glsl"

layout(push_constant) uniform Push {
  uint R;         // rows: tokens · slots
  uint S;         // slots per token (ids per token)
  uint SX;        // input rows per token: 1 (shared by every slot) or S
  uint N;         // output features per expert
  uint K;
  uint x_off;
  uint ids_off;
  uint w_off;     // bytes
  uint w_row_bytes;
  float w_scale;
  uint experts;
  uint k_lo;      // K is summed over [k_lo, k_hi) (a chunk: see matmul.comp)
  uint k_hi;
  uint accumulate;  // 1: y += this chunk's sum
} pc;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Ids { int ids[]; };

const uint NR = 4u;  // weight rows per workgroup

shared float part[gl_WorkGroupSize.x * NR];

void main() {
  uint lid = gl_LocalInvocationID.x;
  uint wg = gl_WorkGroupSize.x;
  uint blocks = (pc.N + NR - 1u) / NR;
  uint gi = group_index();
  uint r = gi / blocks;
  if (r >= pc.R) return;  // whole workgroups leave together
  uint n0 = (gi % blocks) * NR;
  int e = ids[pc.ids_off + r];
  bool bad = e < 0 || uint(e) >= pc.experts;
  uint t = r / pc.S;
  uint xr = pc.x_off + (t * pc.SX + (pc.SX == 1u ? 0u : r % pc.S)) * pc.K;
  uint wbase = pc.w_off + (bad ? 0u : uint(e)) * pc.N * pc.w_row_bytes;
  float acc[NR];
  for (uint j = 0u; j < NR; j++) acc[j] = 0.0;
  if (!bad) {
    for (uint k = pc.k_lo + lid; k < pc.k_hi; k += wg) {
      float xv = x[xr + k];
      for (uint j = 0u; j < NR; j++) {
        if (n0 + j >= pc.N) break;
        acc[j] += xv * w_at(wbase + (n0 + j) * pc.w_row_bytes, k);
      }
    }
  }
  for (uint j = 0u; j < NR; j++) part[lid * NR + j] = acc[j];
  barrier();
  for (uint s = wg / 2u; s > 0u; s >>= 1) {
    if (lid < s)
      for (uint j = 0u; j < NR; j++) part[lid * NR + j] += part[(lid + s) * NR + j];
    barrier();
  }
  if (lid < NR && n0 + lid < pc.N) {
    float v = bad ? uintBitsToFloat(0x7fc00000u) : part[lid] * pc.w_scale;
    uint o = r * pc.N + n0 + lid;
    y[o] = pc.accumulate != 0u ? y[o] + v : v;
  }
}
