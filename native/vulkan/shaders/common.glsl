// Shared by every kernel: GLSL 4.50 for Vulkan 1.1 (SPIR-V 1.3), the workgroup size as
// specialization constant 0 (set by @tp/backend-vulkan), and the linear index of an invocation in a
// grid that may be two-dimensional (group counts past maxComputeWorkGroupCount[0] wrap into y).

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;

// Linear index of this workgroup in a (x, y) grid of groups.
uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// Linear index of this invocation: group_index() * local size + local index.
uint global_index() { return group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; }

// f16 bits (low 16 bits of h) → f32, exactly (subnormals included; NaN payload kept, quiet bit set),
// with integer operations only, so no driver conversion mode is involved (@tp/tensor convert.ts).
float f16_to_f32(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint e = (h >> 10) & 0x1fu;
  uint m = h & 0x3ffu;
  if (e == 0x1fu) return uintBitsToFloat(m == 0u ? sign | 0x7f800000u : sign | 0x7fc00000u | (m << 13));
  if (e == 0u) {
    float v = float(m) * 5.9604644775390625e-8;  // m · 2^-24: exact, and a normal f32
    return sign != 0u ? -v : v;
  }
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// bf16 bits → f32: the upper half of the f32 pattern.
float bf16_to_f32(uint h) { return uintBitsToFloat((h & 0xffffu) << 16); }
