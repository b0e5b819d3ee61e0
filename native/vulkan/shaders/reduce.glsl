// Workgroup reductions for the row kernels (softmax, norms, argmax): every invocation passes its
// partial value, every invocation gets the total. A tree over shared memory (log2(workgroup size)
// steps, so f32 sums of n terms carry about log2(n) roundings); the workgroup size must be a power of
// two (the backend uses 128 or 256). All invocations of the workgroup must call these together.

shared float red[gl_WorkGroupSize.x];

float wg_sum(float v) {
  uint lid = gl_LocalInvocationID.x;
  red[lid] = v;
  barrier();
  for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier();
  }
  float r = red[0];
  barrier();
  return r;
}

float wg_max(float v) {
  uint lid = gl_LocalInvocationID.x;
  red[lid] = v;
  barrier();
  for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1) {
    if (lid < s) red[lid] = max(red[lid], red[lid + s]);
    barrier();
  }
  float r = red[0];
  barrier();
  return r;
}
