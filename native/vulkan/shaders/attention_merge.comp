#version 450
#extension GL_GOOGLE_include_directive : require
// attention_merge: folds the partial results of attention.comp's key ranges (split-KV) together.
// Binding 1 is the scratch [1 + nsplit, rows, 2 + Dv]: slot 0 the running state of the ranges folded
// so far (when has_state), slots 1..nsplit the partials of the last dispatch, each (m, l, acc[Dv]) —
// maximum score, sum of exp(s − m), unnormalized output. With M = max m, a slot weighs exp(m − M)
// (0 for a slot that saw no key, m = −inf): L = Σ w · l, A = Σ w · acc.
// - final = 0: (M, L, A) is written back to slot 0 of binding 1 (binding 0 is the same buffer again,
//   unused): column t of every slot is read and written by one invocation only, and (m, l) of slot 0,
//   which every invocation of the row reads, are written after a barrier (one workgroup per row).
// - final = 1: A / L (0 when L = 0) is written to the output [B, H, Sq, Dv] at o_off of binding 0.
// Scratch row r is query (tile0 + r / tq) % blocks · tq + r % tq of batch-head (tile0 + r / tq) / blocks;
// rows past Sq (the last tile of a head is padded) are skipped. One workgroup per scratch row,
// invocations over the Dv columns. Specialization: 0 WG, 1 Dv.
#include "common.glsl"
#include "math.glsl"

layout(constant_id = 1) const uint HDV = 64;

layout(push_constant) uniform Push {
  uint rows;
  uint nsplit;
  uint has_state;
  uint final_out;
  uint o_off;
  uint tile0;  // the tile of scratch row 0 (attention.comp: tiles of TQ queries of one batch and head)
  uint tq;
  uint blocks; // tiles per (batch, head)
  uint Sq;
} pc;

layout(std430, binding = 0) buffer O { float o[]; };
layout(std430, binding = 1) buffer S { float st[]; };

void main() {
  uint row = group_index();
  if (row >= pc.rows) return;  // the same in the whole workgroup
  uint tile = pc.tile0 + row / pc.tq;
  uint i = (tile % pc.blocks) * pc.tq + row % pc.tq;
  if (i >= pc.Sq) return;  // padding of the last tile of a head (the same in the whole workgroup)
  uint orow = (tile / pc.blocks) * pc.Sq + i;
  uint wg = gl_WorkGroupSize.x;
  uint lid = gl_LocalInvocationID.x;
  uint stride = 2u + HDV;
  uint first = pc.has_state != 0u ? 0u : 1u;
  float NEG_INF = -uintBitsToFloat(0x7f800000u);
  float mx = NEG_INF;
  for (uint s = first; s <= pc.nsplit; s++) mx = max(mx, st[(s * pc.rows + row) * stride]);
  float sum = 0.0;
  for (uint s = first; s <= pc.nsplit; s++) {
    uint base = (s * pc.rows + row) * stride;
    float m = st[base];
    if (m != NEG_INF) sum += tp_exp(m - mx) * st[base + 1u];
  }
  float inv = sum > 0.0 ? 1.0 / sum : 0.0;
  // Column t of every slot is read and written by this invocation only.
  for (uint t = lid; t < HDV; t += wg) {
    float a = 0.0;
    for (uint s = first; s <= pc.nsplit; s++) {
      uint base = (s * pc.rows + row) * stride;
      float m = st[base];
      if (m != NEG_INF) a += tp_exp(m - mx) * st[base + 2u + t];
    }
    if (pc.final_out != 0u) {
      o[pc.o_off + orow * HDV + t] = a * inv;
    } else {
      st[row * stride + 2u + t] = a;
    }
  }
  if (pc.final_out != 0u) return;
  barrier();  // every invocation has read this row's (m, l) of slot 0 before they are overwritten
  if (lid == 0u) {
    st[row * stride] = mx;
    st[row * stride + 1u] = sum;
  }
}
