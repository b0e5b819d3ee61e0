// Order of argmax / top_k: larger value first, ties to the lower index (the reference's `before`).
// wg_best reduces (value, index) pairs over the workgroup; an index of 0xffffffff is "none".
shared float sel_v[gl_WorkGroupSize.x];
shared uint sel_i[gl_WorkGroupSize.x];

bool before(float a, uint ia, float b, uint ib) {
  if (ia == 0xffffffffu) return false;
  if (ib == 0xffffffffu) return true;
  return a > b || (a == b && ia < ib);
}

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
