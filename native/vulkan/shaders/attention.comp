#version 450
#extension GL_GOOGLE_include_directive : require
// attention: scaled dot-product attention with grouped-query heads and the masks of @tp/tensor
// AttentionOptions, in one pass over the keys with the online softmax (Milakov & Gimelshein 2018;
// FlashAttention, Dao et al. 2022), so scores never take O(Sq · Skv) memory.
// q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] contiguous; query head h reads kv head
// h / (H / Hkv). Query i sits at position p = q_offset + i; key j is visible when j < full_prefix, or
// without causal, or when j ≤ p and (no window, or j > p − window). Scores s = scale · q·k, then
// softcap · tanh(s / softcap) when softcap > 0. A query that sees no key gets zeros.
// One workgroup per (batch, head, block of WG queries), one invocation per query; keys and values go
// through shared memory in blocks of kb keys. Specialization: 0 WG, 1 shared floats (kb · (D + Dv)),
// 2 D, 3 Dv. Bindings: 0 out [B, H, Sq, Dv], 1 q, 2 k, 3 v.
#include "common.glsl"
#include "math.glsl"

layout(constant_id = 1) const uint SHARED = 4096;
layout(constant_id = 2) const uint HD = 64;
layout(constant_id = 3) const uint HDV = 64;

layout(push_constant) uniform Push {
  uint B;
  uint H;
  uint Hkv;
  uint Sq;
  uint Skv;
  uint q_off;
  uint k_off;
  uint v_off;
  uint kb;           // keys per block in shared memory
  uint causal;
  int q_offset;
  uint window;       // 0: none
  uint full_prefix;
  float scale;
  float softcap;     // 0: none
} pc;

layout(std430, binding = 0) writeonly buffer O { float o[]; };
layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer K { float k[]; };
layout(std430, binding = 3) readonly buffer V { float v[]; };

shared float kv[SHARED];

bool visible(uint j, int p) {
  if (j < pc.full_prefix || pc.causal == 0u) return true;
  int jj = int(j);
  return jj <= p && (pc.window == 0u || jj > p - int(pc.window));
}

void main() {
  uint wg = gl_WorkGroupSize.x;
  uint blocks = (pc.Sq + wg - 1u) / wg;
  uint g = group_index();
  if (g >= pc.B * pc.H * blocks) return;
  uint qb = g % blocks;
  uint bh = g / blocks;  // b · H + h
  uint h = bh % pc.H;
  uint b = bh / pc.H;
  uint hk = h / (pc.H / pc.Hkv);
  uint lid = gl_LocalInvocationID.x;
  uint i = qb * wg + lid;
  bool live = i < pc.Sq;
  int p = pc.q_offset + int(i);

  float qv[HD];
  float acc[HDV];
  uint qbase = pc.q_off + (bh * pc.Sq + i) * HD;
  for (uint t = 0u; t < HD; t++) qv[t] = live ? q[qbase + t] : 0.0;
  for (uint t = 0u; t < HDV; t++) acc[t] = 0.0;
  float m = -uintBitsToFloat(0x7f800000u);
  float l = 0.0;

  // Keys past the last query of the block are invisible under causal (except the prefix).
  uint kend = pc.Skv;
  if (pc.causal != 0u) {
    int plast = pc.q_offset + int(min(pc.Sq, (qb + 1u) * wg)) - 1;
    kend = uint(clamp(max(int(pc.full_prefix), plast + 1), 0, int(pc.Skv)));
  }
  uint kvbase = (b * pc.Hkv + hk) * pc.Skv;
  for (uint j0 = 0u; j0 < kend; j0 += pc.kb) {
    uint nk = min(pc.kb, kend - j0);
    barrier();
    for (uint t = lid; t < nk * HD; t += wg) kv[t] = k[pc.k_off + (kvbase + j0) * HD + t];
    for (uint t = lid; t < nk * HDV; t += wg) kv[pc.kb * HD + t] = v[pc.v_off + (kvbase + j0) * HDV + t];
    barrier();
    if (!live) continue;
    for (uint jj = 0u; jj < nk; jj++) {
      if (!visible(j0 + jj, p)) continue;
      float s = 0.0;
      for (uint t = 0u; t < HD; t++) s += qv[t] * kv[jj * HD + t];
      s *= pc.scale;
      if (pc.softcap > 0.0) s = pc.softcap * tp_tanh(s / pc.softcap);
      uint vb = pc.kb * HD + jj * HDV;
      if (s <= m) {
        float e = tp_exp(s - m);
        l += e;
        for (uint t = 0u; t < HDV; t++) acc[t] += e * kv[vb + t];
      } else {
        float c = tp_exp(m - s);  // 0 for the first key (m = −inf)
        l = l * c + 1.0;
        for (uint t = 0u; t < HDV; t++) acc[t] = acc[t] * c + kv[vb + t];
        m = s;
      }
    }
  }
  if (!live) return;
  float inv = l > 0.0 ? 1.0 / l : 0.0;
  uint obase = (bh * pc.Sq + i) * HDV;
  for (uint t = 0u; t < HDV; t++) o[obase + t] = acc[t] * inv;
}
