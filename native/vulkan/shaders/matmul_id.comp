#version 450
#extension GL_GOOGLE_include_directive : require
// matmul_id (ggml mul_mat_id): y[r, n] = Σ_k x[t, j or 0, k] · w_e[n, k] · w_scale for row r = t·S + j,
// e = ids[r], where the weight binding holds the experts stacked expert-major (expert e's rows start
// at byte w_off + e·N·w_row_bytes; read in place, in their checkpoint format: weights.glsl). The ids
// stay on the device: each workgroup reads its row's id. A workgroup takes 4 weight rows of one
// activation row, its invocations split K and add their partial sums in shared memory (as the
// fallback of matmul_vec.comp). An id outside [0, experts) gives a row of NaN (a kernel cannot throw).
// ConvRot (FORMAT 17 int8_convrot, 18 int4_convrot): binding 1 holds the activation codes (i32, from
// convrot_quantize.comp) instead of x, the sums are exact i32 ones and the rescale is convrot.glsl's
// with s_x (binding 4, one per input row) and s_w (binding 5, one per row of the stack); a K split
// into chunks carries exact i32 partial sums in binding 6 (as matmul_convrot.comp). Bindings 4-6 are
// unused (any buffer) for the other formats.
// Specialization: 0 the workgroup size (128), 1 the weight format.
#include "common.glsl"
#include "minifloat.glsl"
#include "weights.glsl"
#include "convrot.glsl"

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
  uint accumulate;  // 1: y += this chunk's sum (ConvRot: add the i32 partial sum of binding 6)
  uint last;        // ConvRot: 1 when this chunk finishes the sum and writes y (else binding 6)
  uint sx_off;      // ConvRot: element offsets of s_x and s_w
  uint sw_off;
} pc;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer XC { int xc[]; };  // ConvRot: activation codes
layout(std430, binding = 3) readonly buffer Ids { int ids[]; };
layout(std430, binding = 4) readonly buffer SXs { float sx[]; };
layout(std430, binding = 5) readonly buffer SWs { float sw[]; };
layout(std430, binding = 6) buffer P { int ipart[]; };  // ConvRot: i32 [R, N] between chunks

const uint NR = 4u;  // weight rows per workgroup
const bool CONVROT = FORMAT == 17u || FORMAT == 18u;
const uint BITS = FORMAT == 17u ? 8u : 4u;

shared float part[gl_WorkGroupSize.x * NR];
shared int spart[gl_WorkGroupSize.x * NR];

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
  uint row = t * pc.SX + (pc.SX == 1u ? 0u : r % pc.S);  // input row
  uint xr = pc.x_off + row * pc.K;
  uint e_row = (bad ? 0u : uint(e)) * pc.N;  // first row of expert e in the stack
  uint wbase = pc.w_off + e_row * pc.w_row_bytes;
  if (CONVROT) {
    int acc[NR];
    for (uint j = 0u; j < NR; j++) acc[j] = 0;
    if (!bad) {
      for (uint k = pc.k_lo + lid; k < pc.k_hi; k += wg) {
        int xv = xc[xr + k];
        for (uint j = 0u; j < NR; j++) {
          if (n0 + j >= pc.N) break;
          acc[j] += xv * convrot_w_code(wbase + (n0 + j) * pc.w_row_bytes, k, BITS);
        }
      }
    }
    for (uint j = 0u; j < NR; j++) spart[lid * NR + j] = acc[j];
    barrier();
    for (uint s = wg / 2u; s > 0u; s >>= 1) {
      if (lid < s)
        for (uint j = 0u; j < NR; j++) spart[lid * NR + j] += spart[(lid + s) * NR + j];
      barrier();
    }
    if (lid < NR && n0 + lid < pc.N) {
      uint o = r * pc.N + n0 + lid;
      int sum = spart[lid];
      if (pc.accumulate != 0u) sum += ipart[o];
      if (pc.last == 0u) {
        ipart[o] = sum;
        return;
      }
      float s_w = sw[pc.sw_off + e_row + n0 + lid];
      y[o] = bad ? uintBitsToFloat(0x7fc00000u) : convrot_rescale(sum, sx[pc.sx_off + row], s_w, BITS);
    }
    return;
  }
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
