// Order of argmax / top_k: larger value first, ties to the lower index (the reference's `before`).
// wg_best reduces (value, index) pairs over the workgroup; an index of 0xffffffff is "none". Every
// invocation gets the workgroup's best pair; all must call it together (uniform control flow).
// - Fallback: a tree over shared memory.
// - TP_SUBGROUP (.subgroup.spv variants): a butterfly of subgroupShuffleXor within each subgroup, then
//   every invocation scans the subgroups' winners. `before` is a total order on distinct indices, so
//   both pick the same pair.
#ifdef TP_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

shared float sel_v[gl_WorkGroupSize.x];
shared uint sel_i[gl_WorkGroupSize.x];

bool before(float a, uint ia, float b, uint ib) {
  if (ia == 0xffffffffu) return false;
  if (ib == 0xffffffffu) return true;
  return a > b || (a == b && ia < ib);
}

#ifdef TP_SUBGROUP
void wg_best(inout float v, inout uint i) {
  for (uint o = gl_SubgroupSize / 2u; o > 0u; o >>= 1) {
    float ov = subgroupShuffleXor(v, o);
    uint oi = subgroupShuffleXor(i, o);
    if (before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  if (subgroupElect()) {
    sel_v[gl_SubgroupID] = v;
    sel_i[gl_SubgroupID] = i;
  }
  barrier();
  v = sel_v[0];
  i = sel_i[0];
  for (uint g = 1u; g < gl_NumSubgroups; g++) {
    if (before(sel_v[g], sel_i[g], v, i)) {
      v = sel_v[g];
      i = sel_i[g];
    }
  }
  barrier();
}
#else
void wg_best(inout float v, inout uint i) {
  uint lid = gl_LocalInvocationID.x;
  sel_v[lid] = v;
  sel_i[lid] = i;
  barrier();
  for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1) {
    if (lid < s && before(sel_v[lid + s], sel_i[lid + s], sel_v[lid], sel_i[lid])) {
      sel_v[lid] = sel_v[lid + s];
      sel_i[lid] = sel_i[lid + s];
    }
    barrier();
  }
  v = sel_v[0];
  i = sel_i[0];
  barrier();
}
#endif
