#version 450
#extension GL_GOOGLE_include_directive : require
// attention: scaled dot-product attention with grouped-query heads and the masks of @tp/tensor
// AttentionOptions, with the online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al.
// 2022), so scores never take O(Sq · Skv) memory.
// q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], each read through its batch / head / seq
// strides (the last dimension contiguous: KV-cache views are read in place); query head h reads kv
// head h / (H / Hkv). Query i sits at position p = q_offset + i; key j is visible when
// j < full_prefix, or without causal, or when j ≤ p and (no window, or j > p − window). Scores
// s = scale · q·k, then softcap · tanh(s / softcap) when softcap > 0. A query that sees no key gets
// zeros.
//
// The keys are split into ranges of `chunk` keys (split-KV, "flash decoding") so that no invocation
// runs more than a bounded number of loop iterations whatever Skv is: Mesa's llvmpipe silently ends
// every loop of an invocation once their iterations together pass 65535 (gallivm's
// LP_MAX_TGSI_LOOP_ITERATIONS), which cut the old one-pass kernel short from Skv · (D + Dv) ≈ 64k.
// - nsplit = 0: one range [0, Skv) (the host only does this when Skv ≤ chunk); the normalized output
//   [B, H, Sq, Dv] is written to binding 0.
// - nsplit > 0: the workgroup of range split0 + s (s < nsplit) writes its partial (m, l, acc[Dv]:
//   running maximum, sum of exp(s − m), unnormalized output) to slot 1 + s of binding 0, a scratch
//   [1 + nsplit, ntile · WG, 2 + Dv] (row (tile − tile0) · WG + query in the tile);
//   attention_merge.comp folds the slots into slot 0 or the output.
// A tile is (batch, head, block of WG queries); one workgroup per (tile, range), one invocation per
// query (the same for nsplit = 0 with one range); keys and values go through shared memory in blocks
// of kb keys. Specialization: 0 WG, 1 shared floats
// (kb · (D + Dv)), 2 D, 3 Dv. Bindings: 0 out or scratch, 1 q, 2 k, 3 v.
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
  uint o_off;
  uint q_off;
  uint q_sb;         // element strides of q's batch, head and seq dimensions
  uint q_sh;
  uint q_ss;
  uint k_off;
  uint k_sb;
  uint k_sh;
  uint k_ss;
  uint v_off;
  uint v_sb;
  uint v_sh;
  uint v_ss;
  uint kb;           // keys per block in shared memory
  uint chunk;        // keys per range (a multiple of kb)
  uint split0;       // first range of this dispatch
  uint nsplit;       // ranges in this dispatch; 0: one range, normalized output
  uint tile0;        // first tile (batch, head, block of WG queries) of this dispatch
  uint ntile;        // tiles of this dispatch (the scratch holds ntile · WG rows)
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
  uint splits = max(pc.nsplit, 1u);
  uint g = group_index();
  if (g >= pc.ntile * splits) return;
  uint sl = g % splits;
  uint tile = pc.tile0 + g / splits;
  uint qb = tile % blocks;
  uint bh = tile / blocks;  // b · H + h
  uint h = bh % pc.H;
  uint b = bh / pc.H;
  uint hk = h / (pc.H / pc.Hkv);
  uint lid = gl_LocalInvocationID.x;
  uint i = qb * wg + lid;
  bool live = i < pc.Sq;
  int p = pc.q_offset + int(i);

  float qv[HD];
  float acc[HDV];
  uint qbase = pc.q_off + b * pc.q_sb + h * pc.q_sh + (live ? i : 0u) * pc.q_ss;
  for (uint t = 0u; t < HD; t++) qv[t] = live ? q[qbase + t] : 0.0;
  for (uint t = 0u; t < HDV; t++) acc[t] = 0.0;
  float m = -uintBitsToFloat(0x7f800000u);
  float l = 0.0;

  uint kbeg = 0u;
  uint kend = pc.Skv;
  if (pc.nsplit > 0u) {
    kbeg = min((pc.split0 + sl) * pc.chunk, pc.Skv);
    kend = min(kbeg + pc.chunk, pc.Skv);
  }
  // Keys past the last query of the block are invisible under causal (except the prefix); so are keys
  // in [full_prefix, first position − window] under a window.
  uint skip_lo = 0u;
  uint skip_hi = 0u;
  if (pc.causal != 0u) {
    int plast = pc.q_offset + int(min(pc.Sq, (qb + 1u) * wg)) - 1;
    kend = min(kend, uint(clamp(max(int(pc.full_prefix), plast + 1), 0, int(pc.Skv))));
    if (pc.window != 0u) {
      skip_lo = pc.full_prefix;
      skip_hi = uint(clamp(pc.q_offset + int(qb * wg) - int(pc.window) + 1, 0, int(pc.Skv)));
    }
  }
  uint kbase = pc.k_off + b * pc.k_sb + hk * pc.k_sh;
  uint vbase = pc.v_off + b * pc.v_sb + hk * pc.v_sh;
  for (uint j0 = kbeg; j0 < kend; j0 += pc.kb) {
    uint nk = min(pc.kb, kend - j0);
    if (j0 >= skip_lo && j0 + nk <= skip_hi) continue;  // the same in the whole workgroup
    barrier();
    for (uint t = lid; t < nk * HD; t += wg) kv[t] = k[kbase + (j0 + t / HD) * pc.k_ss + t % HD];
    for (uint t = lid; t < nk * HDV; t += wg) kv[pc.kb * HD + t] = v[vbase + (j0 + t / HDV) * pc.v_ss + t % HDV];
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
  if (pc.nsplit == 0u) {
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    uint obase = pc.o_off + (bh * pc.Sq + i) * HDV;
    for (uint t = 0u; t < HDV; t++) o[obase + t] = acc[t] * inv;
  } else {
    uint rows = pc.ntile * wg;
    uint obase = pc.o_off + ((1u + sl) * rows + (g / splits) * wg + lid) * (2u + HDV);
    o[obase] = m;
    o[obase + 1u] = l;
    for (uint t = 0u; t < HDV; t++) o[obase + 2u + t] = acc[t];
  }
}
