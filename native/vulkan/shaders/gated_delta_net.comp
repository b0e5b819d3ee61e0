#version 450
#extension GL_GOOGLE_include_directive : require
// gated_delta_net: the gated delta rule (Yang et al. 2024, "Gated Delta Networks" eq. 10) over n
// tokens, token by token. q, k [n, hk, dk], v, y [n, hv, dv], g, beta [n, hv] contiguous; state
// [hv, dk, dv] updated in place. Value head h uses key head h mod hk. Per token:
//   S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  y = scale · Sᵀq.
// Column c of S (S[·][c]) depends only on itself and on the shared q, k: one workgroup per value head,
// each invocation owns columns c ≡ lid (mod workgroup size) and runs every token on them, keeping
// the column in the state buffer (no barrier is needed). f32 throughout.
// Bindings: 0 y, 1 q, 2 k, 3 v, 4 g, 5 beta, 6 state.
#include "common.glsl"

layout(push_constant) uniform Push {
  uint n;
  uint hk;
  uint hv;
  uint dk;
  uint dv;
  float scale;
  uint q_off;
  uint k_off;
  uint v_off;
  uint g_off;
  uint b_off;
  uint s_off;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer K { float k[]; };
layout(std430, binding = 3) readonly buffer V { float v[]; };
layout(std430, binding = 4) readonly buffer G { float g[]; };
layout(std430, binding = 5) readonly buffer B { float beta[]; };
layout(std430, binding = 6) buffer S { float state[]; };

void main() {
  uint h = group_index();
  if (h >= pc.hv) return;
  uint i = h % pc.hk;
  uint base = pc.s_off + h * pc.dk * pc.dv;
  for (uint c = gl_LocalInvocationID.x; c < pc.dv; c += gl_WorkGroupSize.x) {
    for (uint t = 0u; t < pc.n; t++) {
      uint qk = (t * pc.hk + i) * pc.dk;
      float decay = exp(g[pc.g_off + t * pc.hv + h]);
      float b = beta[pc.b_off + t * pc.hv + h];
      float m = 0.0;
      for (uint a = 0u; a < pc.dk; a++) m += state[base + a * pc.dv + c] * k[pc.k_off + qk + a];
      float delta = b * (v[pc.v_off + (t * pc.hv + h) * pc.dv + c] - decay * m);
      float o = 0.0;
      for (uint a = 0u; a < pc.dk; a++) {
        uint e = base + a * pc.dv + c;
        float s = decay * state[e] + k[pc.k_off + qk + a] * delta;
        state[e] = s;
        o += s * q[pc.q_off + qk + a];
      }
      y[(t * pc.hv + h) * pc.dv + c] = pc.scale * o;
    }
  }
}
