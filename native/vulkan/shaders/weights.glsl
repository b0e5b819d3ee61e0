// Weight decoders of matmul and embedding: element k of the weight row starting at byte `rb` of the
// weight buffer (binding 2, read as 32-bit words, any byte alignment), for the format FORMAT
// (specialization constant 1), decoded in-kernel — weights stay in their checkpoint format on the
// device. GGUF block types follow @tp/quant ggml-dequant.ts (ggml `dequantize_row_*`, llm.md §2.1–2.4)
// term by term; fp8 and f16 decode exactly (minifloat.glsl, common.glsl).
//   0 f32   1 f16   2 bf16   3 f8_e4m3fn   4 f8_e5m2
//   5 q8_0  6 q4_0  7 q4_1   8 q5_0   9 q5_1   10 q2_k   11 q3_k   12 q4_k   13 q5_k   14 q6_k
//   15 iq4_nl  16 iq4_xs
// Needs common.glsl and minifloat.glsl first.

// With TP_STORAGE16 (the .s16.spv variants, for devices with storageBuffer16BitAccess) the same
// binding is also declared as 16-bit words, and 2-aligned 16-bit reads — every f16 / bf16 weight, the
// f16 scales of the GGUF blocks — are one 16-bit load instead of a 32-bit load, a shift and a mask.
// The values are the same bits either way.

layout(constant_id = 1) const uint FORMAT = 0;

layout(std430, binding = 2) readonly buffer W { uint wq[]; };
#ifdef TP_STORAGE16
#extension GL_EXT_shader_16bit_storage : require
layout(std430, binding = 2) readonly buffer W16 { uint16_t wh[]; };
#endif

uint wb(uint b) { return (wq[b >> 2] >> ((b & 3u) << 3)) & 0xffu; }
uint wu16(uint b) {
#ifdef TP_STORAGE16
  if ((b & 1u) == 0u) return uint(wh[b >> 1]);
#else
  if ((b & 1u) == 0u) return (wq[b >> 2] >> ((b & 2u) << 3)) & 0xffffu;  // one word when 2-aligned
#endif
  return wb(b) | (wb(b + 1u) << 8);
}
uint wu32(uint b) { return wu16(b) | (wu16(b + 2u) << 16); }
int wi8(uint b) { return int(wb(b) << 24) >> 24; }
float wf16(uint b) { return f16_to_f32(wu16(b)); }

// Low nibble for elements 0..15 of a 32-element block, high nibble for 16..31.
uint nib32(uint qs, uint e) { return e < 16u ? wb(qs + e) & 15u : wb(qs + e - 16u) >> 4; }

// Scale and min of sub-block k of Q4_K / Q5_K (ggml get_scale_min_k4).
uvec2 scale_min_k4(uint s, uint k) {
  if (k < 4u) return uvec2(wb(s + k) & 63u, wb(s + k + 4u) & 63u);
  return uvec2((wb(s + k + 4u) & 15u) | ((wb(s + k - 4u) >> 6) << 4), (wb(s + k + 4u) >> 4) | ((wb(s + k) >> 6) << 4));
}

// ggml kvalues_iq4nl: the IQ4_NL / IQ4_XS non-linear 4-bit grid (llm.md §2.4).
const float KVALUES_IQ4NL[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0,
                                          38.0, 53.0, 69.0, 89.0, 113.0);

float w_at(uint rb, uint k) {
  if (FORMAT == 0u) return uintBitsToFloat(wq[(rb >> 2) + k]);
  if (FORMAT == 1u) return f16_to_f32(wu16(rb + 2u * k));
  if (FORMAT == 2u) return bf16_to_f32(wu16(rb + 2u * k));
  if (FORMAT == 3u) return uintBitsToFloat(mini_to_f32(wb(rb + k), E4M3FN));
  if (FORMAT == 4u) return uintBitsToFloat(mini_to_f32(wb(rb + k), E5M2));
  uint e = k & 31u;
  if (FORMAT == 5u) {  // Q8_0 (34 B): d · qs[32] i8
    uint o = rb + (k >> 5) * 34u;
    return float(wi8(o + 2u + e)) * wf16(o);
  }
  if (FORMAT == 6u) {  // Q4_0 (18 B): d · qs[16]
    uint o = rb + (k >> 5) * 18u;
    return float(int(nib32(o + 2u, e)) - 8) * wf16(o);
  }
  if (FORMAT == 7u) {  // Q4_1 (20 B): d · m · qs[16]
    uint o = rb + (k >> 5) * 20u;
    return float(nib32(o + 4u, e)) * wf16(o) + wf16(o + 2u);
  }
  if (FORMAT == 8u) {  // Q5_0 (22 B): d · qh u32 · qs[16]
    uint o = rb + (k >> 5) * 22u;
    uint n = nib32(o + 6u, e) | (((wu32(o + 2u) >> e) & 1u) << 4);
    return float(int(n) - 16) * wf16(o);
  }
  if (FORMAT == 9u) {  // Q5_1 (24 B): d · m · qh u32 · qs[16]
    uint o = rb + (k >> 5) * 24u;
    uint n = nib32(o + 8u, e) | (((wu32(o + 4u) >> e) & 1u) << 4);
    return float(n) * wf16(o) + wf16(o + 2u);
  }
  if (FORMAT == 15u) {  // IQ4_NL (18 B): d · qs[16]; value d · K[n]
    uint o = rb + (k >> 5) * 18u;
    return wf16(o) * KVALUES_IQ4NL[nib32(o + 2u, e)];
  }
  uint f = k & 255u;  // element in a 256-element super-block
  uint half_ = f >> 7;
  uint j = (f & 127u) >> 5;
  uint l = f & 31u;
  if (FORMAT == 10u) {  // Q2_K (84 B): scales[16] · qs[64] · d · dmin
    uint o = rb + (k >> 8) * 84u;
    uint q = (wb(o + 16u + 32u * half_ + l) >> (2u * j)) & 3u;
    uint s = wb(o + (f >> 4));
    return (wf16(o + 80u) * float(s & 15u)) * float(q) - wf16(o + 82u) * float(s >> 4);
  }
  if (FORMAT == 11u) {  // Q3_K (110 B): hmask[32] · qs[64] · scales[12] · d
    uint o = rb + (k >> 8) * 110u;
    uint q = (wb(o + 32u + 32u * half_ + l) >> (2u * j)) & 3u;
    uint hb = (wb(o + l) >> (f >> 5)) & 1u;
    uint t = f >> 4;
    uint low = t < 8u ? wb(o + 96u + t) & 15u : wb(o + 96u + t - 8u) >> 4;
    uint high = (wb(o + 104u + (t & 3u)) >> (2u * (t >> 2))) & 3u;
    int sc = int(low | (high << 4)) - 32;
    return (wf16(o + 108u) * float(sc)) * float(int(q) - (hb != 0u ? 0 : 4));
  }
  if (FORMAT == 12u || FORMAT == 13u) {  // Q4_K (144 B) / Q5_K (176 B): d · dmin · scales[12] · (qh[32]) · qs[128]
    bool q5 = FORMAT == 13u;
    uint o = rb + (k >> 8) * (q5 ? 176u : 144u);
    uint byte_ = wb(o + (q5 ? 48u : 16u) + 32u * (f >> 6) + l);
    uint n = (f & 63u) < 32u ? byte_ & 15u : byte_ >> 4;
    if (q5) n += 16u * ((wb(o + 16u + l) >> (f >> 5)) & 1u);
    uvec2 sm = scale_min_k4(o + 4u, f >> 5);
    return (wf16(o) * float(sm.x)) * float(n) - wf16(o + 2u) * float(sm.y);
  }
  if (FORMAT == 16u) {  // IQ4_XS (136 B): d · scales_h u16 · scales_l[4] · qs[128]; d · (ls − 32) · K[n]
    uint o = rb + (k >> 8) * 136u;
    uint ib = f >> 5;
    uint ls = ((wb(o + 4u + (ib >> 1)) >> (4u * (ib & 1u))) & 15u) | (((wu16(o + 2u) >> (2u * ib)) & 3u) << 4);
    return (wf16(o) * float(int(ls) - 32)) * KVALUES_IQ4NL[nib32(o + 8u + 16u * ib, f & 31u)];
  }
  // FORMAT 14: Q6_K (210 B): ql[128] · qh[64] · scales[16] i8 · d
  uint o = rb + (k >> 8) * 210u;
  uint lo = wb(o + 64u * half_ + l + 32u * (j & 1u));
  uint lo4 = j < 2u ? lo & 15u : lo >> 4;
  uint hi = (wb(o + 128u + 32u * half_ + l) >> (2u * j)) & 3u;
  return (wf16(o + 208u) * float(wi8(o + 192u + (f >> 4)))) * float(int(lo4 | (hi << 4)) - 32);
}
