#version 450
#extension GL_GOOGLE_include_directive : require
// embedding (ggml get_rows): y[i, k] = w_scale · decode(table[ids[i], k]) for a table [vocab, D] in any
// format of weights.glsl. An id outside [0, vocab) gives NaN in its row (ids stay on the device, so
// they are not checked on the host). One invocation per output element. A table past
// maxStorageBufferRange is bound in windows of rows [row0, row0 + rows), one dispatch each; a
// dispatch writes the rows of the ids in its window only.
// Bindings: 0 y, 1 ids (i32), 2 table (words, the window).
#include "common.glsl"
#include "minifloat.glsl"
#include "weights.glsl"

layout(push_constant) uniform Push {
  uint n;  // ids · D
  uint D;
  uint vocab;
  uint ids_off;
  uint w_off;  // bytes
  uint w_row_bytes;
  float w_scale;
  uint row0;
  uint rows;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n) return;
  int id = ids[pc.ids_off + i / pc.D];
  if (id < 0 || uint(id) >= pc.vocab) {
    if (pc.row0 == 0u) y[i] = uintBitsToFloat(0x7fc00000u);
    return;
  }
  uint r = uint(id);
  if (r < pc.row0 || r >= pc.row0 + pc.rows) return;  // another window's row
  y[i] = w_at(pc.w_off + (r - pc.row0) * pc.w_row_bytes, i % pc.D) * pc.w_scale;
}
