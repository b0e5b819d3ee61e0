#version 450
#extension GL_GOOGLE_include_directive : require
// matmul of INT8 / INT4 ConvRot weights (ComfyUI W8A8 / W4A4; @tp/quant convrot-linear.ts): exact
// integer dot products of the activation codes (convrot_quantize.comp) with the weight codes, the
// rescale of convrot.glsl, then + bias. Tiled as matmul.comp (32 × 32 tiles, 64 invocations, integer
// accumulators).
// Bindings: 0 y, 1 codes (i32 [M, K]), 2 w (words), 3 bias, 4 s_x (f32 [M]), 5 s_w (f32 [N]),
// 6 partial sums (i32 [M, N]; any buffer when K is one chunk).
// Groups: (ceil(N / 32), ceil(M / 32)).
#include "common.glsl"

layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint K;
  uint b_off;
  uint has_bias;
  uint w_off;  // bytes
  uint bits;   // 8 or 4
  uint sw_off;
  uint k_lo;  // K is summed over [k_lo, k_hi): a long K is split into chunks, one dispatch each,
  uint k_hi;  // that add exact i32 partial sums in binding 6 (llvmpipe's loop limit; see matmul.comp)
  uint first; // 1: this chunk starts the sum (else it adds the partial sum)
  uint last;  // 1: this chunk finishes it and writes y (else it writes the partial sum)
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer C { int codes[]; };
layout(std430, binding = 2) readonly buffer W { uint wq[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer SX { float sx[]; };
layout(std430, binding = 5) readonly buffer SW { float sw[]; };
layout(std430, binding = 6) buffer P { int part[]; };  // i32 [M, N] between chunks

uint wb(uint b) { return (wq[b >> 2] >> ((b & 3u) << 3)) & 0xffu; }

#include "convrot.glsl"

int w_code(uint n, uint k) { return convrot_w_code(pc.w_off + n * (pc.bits == 8u ? pc.K : pc.K / 2u), k, pc.bits); }

const uint TM = 32u;
const uint TN = 32u;
const uint TK = 32u;
shared int xs[TM * TK];
shared int ws[TN * TK];

void main() {
  // 64 invocations as 8 × 8, each a 4 × 4 block of the tile (as matmul.comp).
  uint lid = gl_LocalInvocationID.x;
  uint tx = lid % 8u;
  uint ty = lid / 8u;
  uint n0 = gl_WorkGroupID.x * TN;
  uint m0 = gl_WorkGroupID.y * TM;
  ivec4 acc[4] = ivec4[4](ivec4(0), ivec4(0), ivec4(0), ivec4(0));
  for (uint k0 = pc.k_lo; k0 < pc.k_hi; k0 += TK) {
    for (uint t = lid; t < TM * TK; t += 64u) {
      uint r = t / TK;
      uint k = k0 + t % TK;
      xs[t] = (m0 + r < pc.M && k < pc.k_hi) ? codes[(m0 + r) * pc.K + k] : 0;
      ws[t] = (n0 + r < pc.N && k < pc.k_hi) ? w_code(n0 + r, k) : 0;
    }
    barrier();
    for (uint kk = 0u; kk < TK; kk++) {
      ivec4 a = ivec4(xs[ty * TK + kk], xs[(ty + 8u) * TK + kk], xs[(ty + 16u) * TK + kk], xs[(ty + 24u) * TK + kk]);
      ivec4 b = ivec4(ws[tx * TK + kk], ws[(tx + 8u) * TK + kk], ws[(tx + 16u) * TK + kk], ws[(tx + 24u) * TK + kk]);
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
      int sum = acc[i][j];
      if (pc.first == 0u) sum += part[m * pc.N + n];
      if (pc.last == 0u) {
        part[m * pc.N + n] = sum;
        continue;
      }
      float v = convrot_rescale(sum, sx[m], sw[pc.sw_off + n], pc.bits);
      if (pc.has_bias != 0u) v += bias[pc.b_off + n];
      y[m * pc.N + n] = v;
    }
  }
}
