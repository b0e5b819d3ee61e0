// The elementwise kernels (silu, sigmoid, gelu, scale, add, sub, mul, swiglu, modulate): the output is
// contiguous with `n` elements of shape `shape` (rank ≤ 6 after merging dimensions), and each input
// is any strided view of that shape — broadcasting is a stride of 0 — read at
// `off + Σ index_k · stride_k` (elements). Bindings: 0 the output, 1..3 the inputs (f32).
// The push constants are the same for all of them (ops/elementwise.ts packs them), 120 bytes.
#include "common.glsl"

layout(push_constant) uniform Push {
  uint n;
  uint rank;
  uint shape[6];
  uint a_off;
  uint a_strides[6];
  uint b_off;
  uint b_strides[6];
  uint c_off;
  uint c_strides[6];
  float param;  // scale: the factor; gelu: 0 erf, 1 tanh
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };

// Element offsets of the multi-index of output element i in inputs a, b and c.
uvec3 offsets(uint i) {
  uvec3 o = uvec3(pc.a_off, pc.b_off, pc.c_off);
  for (int k = int(pc.rank) - 1; k >= 0; k--) {
    uint d = pc.shape[k];
    uint idx = i % d;
    i /= d;
    o += idx * uvec3(pc.a_strides[k], pc.b_strides[k], pc.c_strides[k]);
  }
  return o;
}
