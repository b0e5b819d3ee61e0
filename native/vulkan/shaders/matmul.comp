#version 450
#extension GL_GOOGLE_include_directive : require
// matmul: y[m, n] = Σ_k x[m, k] · w[n, k] · w_scale (+ bias[n]), x [M, K] f32 contiguous, w [N, K] in
// its own format (weights.glsl, decoded while the tile is loaded), f32 accumulation.
// Tiled: a workgroup of 64 invocations computes a 32 × 32 tile of y from 32 × 32 tiles of x and w
// staged in shared memory, each invocation a 4 × 4 block of it (specialization 0 must be 64).
// The weight may be a window of rows [n_base, n_base + N) of a larger matrix (split at
// maxStorageBufferRange): y's row stride is n_total and its column n_base + n.
// K is summed over [k_lo, k_hi): the host splits a long K into chunks, one dispatch each, the later
// ones adding to y (`accumulate`), so an invocation never loops more than llvmpipe's 65535 iterations
// (one pass over K broke between K = 40,000 and 65,536; backend-vulkan README "llvmpipe's loop limit").
// Bindings: 0 y, 1 x, 2 w (words), 3 bias. Groups: (ceil(N / 32), ceil(M / 32)).
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
  uint w_off;        // bytes
  uint w_row_bytes;
  float w_scale;
  uint n_total;
  uint n_base;
  uint k_lo;
  uint k_hi;
  uint accumulate;  // 1: y += this chunk's sum (bias was added by the first chunk)
} pc;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };

const uint TM = 32u;
const uint TN = 32u;
const uint TK = 32u;
shared float xs[TM * TK];
shared float ws[TN * TK];

void main() {
  // 64 invocations as 8 × 8; invocation (tx, ty) owns rows ty + 8i and columns tx + 8j (i, j < 4).
  uint lid = gl_LocalInvocationID.x;
  uint tx = lid % 8u;
  uint ty = lid / 8u;
  uint n0 = gl_WorkGroupID.x * TN;
  uint m0 = gl_WorkGroupID.y * TM;
  vec4 acc[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));  // acc[i][j]
  for (uint k0 = pc.k_lo; k0 < pc.k_hi; k0 += TK) {
    for (uint t = lid; t < TM * TK; t += 64u) {
      uint r = t / TK;
      uint k = k0 + t % TK;
      xs[t] = (m0 + r < pc.M && k < pc.k_hi) ? x[pc.x_off + (m0 + r) * pc.K + k] : 0.0;
      ws[t] = (n0 + r < pc.N && k < pc.k_hi) ? w_at(pc.w_off + (n0 + r) * pc.w_row_bytes, k) : 0.0;
    }
    barrier();
    for (uint kk = 0u; kk < TK; kk++) {
      vec4 a = vec4(xs[ty * TK + kk], xs[(ty + 8u) * TK + kk], xs[(ty + 16u) * TK + kk], xs[(ty + 24u) * TK + kk]);
      vec4 b = vec4(ws[tx * TK + kk], ws[(tx + 8u) * TK + kk], ws[(tx + 16u) * TK + kk], ws[(tx + 24u) * TK + kk]);
      acc[0] += a.x * b;
      acc[1] += a.y * b;
      acc[2] += a.z * b;
      acc[3] += a.w * b;
    }
    barrier();
  }
  for (uint i = 0u; i < 4u; i++) {
    uint m = m0 + ty + 8u * i;
    if (m >= pc.M) continue;
    for (uint j = 0u; j < 4u; j++) {
      uint n = n0 + tx + 8u * j;
      if (n >= pc.N) continue;
      float v = acc[i][j] * pc.w_scale;
      if (pc.has_bias != 0u) v += bias[pc.b_off + pc.n_base + n];
      uint o = m * pc.n_total + pc.n_base + n;
      y[o] = pc.accumulate != 0u ? y[o] + v : v;
    }
  }
}
