#version 450
#extension GL_GOOGLE_include_directive : require
// rope (RoFormer, arXiv:2104.09864 §3.4): x [batch, seq, heads, head_dim] contiguous, the first
// rope_dims dimensions rotated in half = rope_dims / 2 pairs — NeoX halves (p, p + half) or
// interleaved (2p, 2p + 1) — the rest copied. Pair p turns by pos · f_p where pos is row axis[p] of
// positions [axes, seq] (i32) and f_p = freqScale · theta^(−k/n) per section (@tp/tensor RopeOptions).
//
// Angles reach 1e5 rad, where f32 loses the phase; instead the host gives each frequency in turns as a
// 64-bit binary fraction F_p = f_p / 2π mod 1 (table: lo word, hi word, axis), and the angle in turns
// is pos · F_p mod 1, exact in 64-bit integer arithmetic (umulExtended), wrapped for free. cos / sin
// then come from the nearest quarter turn and a remainder |r| ≤ π/4 (Cephes sinf / cosf polynomials,
// ~1 ulp), so the result is within a few ulp at any position.
// One invocation per element. Bindings: 0 y, 1 x, 2 positions (i32), 3 table (uint).
#include "common.glsl"

layout(push_constant) uniform Push {
  uint n;       // elements of x
  uint seq;
  uint heads;
  uint head_dim;
  uint rope_dims;
  uint neox;    // 1: NeoX halves, 0: interleaved pairs
  uint x_off;
  uint p_off;
  uint t_off;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer P { int pos[]; };
layout(std430, binding = 3) readonly buffer T { uint table[]; };

// (cos, sin) of the angle hi:lo / 2^64 turns.
vec2 cos_sin_turns(uint hi, uint lo) {
  uint q = (hi + 0x20000000u) >> 30;  // nearest quarter turn (mod 4)
  int rem = int(hi - (q << 30));      // remainder in 2^-32 turns, |rem| ≤ 2^29
  float r = (float(rem) + float(lo) * 2.3283064365386963e-10) * 1.4629180792671596e-9;  // · 2π / 2^32
  float z = r * r;
  float s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
  float c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
  if (q == 0u) return vec2(c, s);
  if (q == 1u) return vec2(-s, c);
  if (q == 2u) return vec2(-c, -s);
  return vec2(s, -c);
}

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  uint e = i % pc.head_dim;
  uint row = i / pc.head_dim;
  if (e >= pc.rope_dims) {
    y[i] = x[pc.x_off + i];
    return;
  }
  uint s = (row / pc.heads) % pc.seq;
  uint half_ = pc.rope_dims / 2u;
  uint p;
  bool first;
  uint i0;
  if (pc.neox != 0u) {
    first = e < half_;
    p = first ? e : e - half_;
    i0 = row * pc.head_dim + p;
  } else {
    first = (e & 1u) == 0u;
    p = e / 2u;
    i0 = row * pc.head_dim + 2u * p;
  }
  uint i1 = pc.neox != 0u ? i0 + half_ : i0 + 1u;
  uint f_lo = table[pc.t_off + 3u * p];
  uint f_hi = table[pc.t_off + 3u * p + 1u];
  uint axis = table[pc.t_off + 3u * p + 2u];
  int position = pos[pc.p_off + axis * pc.seq + s];
  // pos · F mod 2^64, pos sign-extended to 64 bits
  uint pu = uint(position);
  uint msb, lsb;
  umulExtended(pu, f_lo, msb, lsb);
  uint hi = msb + pu * f_hi + (position < 0 ? 0xffffffffu : 0u) * f_lo;
  vec2 cs = cos_sin_turns(hi, lsb);
  float x0 = x[pc.x_off + i0];
  float x1 = x[pc.x_off + i1];
  y[i] = first ? x0 * cs.x - x1 * cs.y : x0 * cs.y + x1 * cs.x;
}
