#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d (cross-correlation, as torch.nn.functional.conv2d): y[n, co, oy, ox] = bias[co] +
// Σ_{ci, ky, kx} x[n, ci, oy·sh − ph + ky, ox·sw − pw + kx] · w[co, ci, ky, kx], zero padding.
// Direct: one invocation per output element, f32 sums in (ci, ky, kx) order.
// Bindings: 0 y, 1 x, 2 w, 3 bias (any buffer when absent); all contiguous f32.
#include "common.glsl"

layout(push_constant) uniform Push {
  uint n_out;
  uint cin;
  uint h;
  uint w;
  uint cout;
  uint kh;
  uint kw;
  uint oh;
  uint ow;
  uint sh;
  uint sw;
  uint ph;
  uint pw;
  uint x_off;
  uint w_off;
  uint b_off;
  uint has_bias;
} pc;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Wt { float wt[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };

void main() {
  uint i = global_index();
  if (i >= pc.n_out) return;
  uint ox = i % pc.ow;
  uint oy = (i / pc.ow) % pc.oh;
  uint co = (i / (pc.ow * pc.oh)) % pc.cout;
  uint n = i / (pc.ow * pc.oh * pc.cout);
  float s = 0.0;
  for (uint ci = 0u; ci < pc.cin; ci++) {
    uint xb = pc.x_off + (n * pc.cin + ci) * pc.h * pc.w;
    uint wb = pc.w_off + (co * pc.cin + ci) * pc.kh * pc.kw;
    for (uint ky = 0u; ky < pc.kh; ky++) {
      int iy = int(oy * pc.sh + ky) - int(pc.ph);
      if (iy < 0 || iy >= int(pc.h)) continue;
      for (uint kx = 0u; kx < pc.kw; kx++) {
        int ix = int(ox * pc.sw + kx) - int(pc.pw);
        if (ix < 0 || ix >= int(pc.w)) continue;
        s += x[xb + uint(iy) * pc.w + uint(ix)] * wt[wb + ky * pc.kw + kx];
      }
    }
  }
  if (pc.has_bias != 0u) s += bias[pc.b_off + co];
  y[i] = s;
}
