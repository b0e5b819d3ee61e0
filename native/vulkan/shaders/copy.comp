#version 450
#extension GL_GOOGLE_include_directive : require
// copy: dst view ← src view, elementwise, for elements of ELEM bytes (1, 2, 4 or 8; specialization
// constant 1). Both sides are strided views of one shape (rank ≤ 8 after merging dimensions; a stride
// of 0 repeats an element). The layout ops are copies: copy, slice (a view in), concat (views out),
// upsample_nearest2d (a broadcast view in). 1- and 2-byte elements are packed in 32-bit words, so
// they are written with atomicAnd / atomicOr on their own bits: neighbours written by other
// invocations (or outside the view) are never disturbed, without 8- or 16-bit storage.
// Bindings: 0 dst, 1 src (32-bit words). Offsets and strides in elements.
#include "common.glsl"

layout(constant_id = 1) const uint ELEM = 4;

layout(push_constant) uniform Push {
  uint n;
  uint rank;
  uint shape[8];
  uint src_off;
  uint src_strides[8];
  uint dst_off;
  uint dst_strides[8];
} pc;

layout(std430, binding = 0) buffer Dst { uint dst[]; };
layout(std430, binding = 1) readonly buffer Src { uint src[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  uint s = pc.src_off;
  uint d = pc.dst_off;
  for (int k = int(pc.rank) - 1; k >= 0; k--) {
    uint size = pc.shape[k];
    uint idx = i % size;
    i /= size;
    s += idx * pc.src_strides[k];
    d += idx * pc.dst_strides[k];
  }
  if (ELEM == 4u) {
    dst[d] = src[s];
  } else if (ELEM == 8u) {
    dst[2u * d] = src[2u * s];
    dst[2u * d + 1u] = src[2u * s + 1u];
  } else {
    uint per = 4u / ELEM;              // elements per word
    uint bits = 8u * ELEM;
    uint mask = (1u << bits) - 1u;
    uint v = (src[s / per] >> ((s % per) * bits)) & mask;
    uint shift = (d % per) * bits;
    atomicAnd(dst[d / per], ~(mask << shift));
    atomicOr(dst[d / per], v << shift);
  }
}
