// Mean and inverse standard deviation of n values for layer_norm and group_norm, two passes with a
// shift: sums of (v − k) where k is the first value, so that a large common offset (a mean of 1000
// with a spread of 1) cancels exactly before it is squared (Chan, Golub & LeVeque 1983, "shifted
// data"). Returns (shifted mean, 1 / sqrt(var + eps)); normalise v as ((v − k) − mean) · inv.
// Needs `float load(uint i)` for i < n, declared by the kernel before including this file.
#include "reduce.glsl"

vec2 mean_inv_std(uint n, float k, float eps) {
  uint lid = gl_LocalInvocationID.x;
  float s = 0.0;
  for (uint i = lid; i < n; i += gl_WorkGroupSize.x) s += load(i) - k;
  float mean = wg_sum(s) / float(n);
  float q = 0.0;
  for (uint i = lid; i < n; i += gl_WorkGroupSize.x) {
    float dv = (load(i) - k) - mean;
    q += dv * dv;
  }
  float var = wg_sum(q) / float(n);
  return vec2(mean, 1.0 / sqrt(var + eps));
}
