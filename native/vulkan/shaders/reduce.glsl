// Workgroup reductions for the row kernels (softmax, norms, convrot_quantize): every invocation passes
// its partial value, every invocation gets the total. All invocations of the workgroup must call these
// together (uniform control flow); the workgroup size must be a power of two (the backend uses 128 or
// 256).
// - Fallback (any Vulkan 1.1 device): a tree over shared memory, log2(workgroup size) steps, so f32 sums
//   of n terms carry about log2(n) roundings.
// - TP_SUBGROUP (the .subgroup.spv variants, for devices with subgroup arithmetic in compute): each
//   subgroup reduces in registers (subgroupAdd / subgroupMax), one value per subgroup goes to shared
//   memory, and every invocation adds those up in subgroup order — one barrier instead of log2(size),
//   and the same total in every invocation. Maxima are exact either way; sums differ only in rounding.
#ifdef TP_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

shared float red[gl_WorkGroupSize.x];

#ifdef TP_SUBGROUP
float wg_sum(float v) {
  float s = subgroupAdd(v);
  if (subgroupElect()) red[gl_SubgroupID] = s;
  barrier();
  float r = 0.0;
  for (uint g = 0u; g < gl_NumSubgroups; g++) r += red[g];
  barrier();
  return r;
}

float wg_max(float v) {
  float s = subgroupMax(v);
  if (subgroupElect()) red[gl_SubgroupID] = s;
  barrier();
  float r = red[0];
  for (uint g = 1u; g < gl_NumSubgroups; g++) r = max(r, red[g]);
  barrier();
  return r;
}
#else
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
#endif
