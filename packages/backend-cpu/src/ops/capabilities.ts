/**
 * Which tensor dtypes each op of the cpu backend takes (the ops of issue 7 part 1; `cast`, `matmul`
 * and `embedding` are described by CpuBackend itself). CpuBackend.supports(op, dtypes) answers from
 * this table for these ops, so `supports("silu", ["f16"])` is false even though f16 tensors exist.
 */
import { DTYPE_NAMES, type DTypeName, type OpName } from "@tp/tensor";

/** f32 activations only. */
const F32: readonly DTypeName[] = ["f32"];

/** Dtypes per op: activations are f32; rope also takes i32 positions; the layout ops move any dtype. */
export const CPU_OP_DTYPES: Readonly<Partial<Record<OpName, readonly DTypeName[]>>> = {
  attention: F32,
  rms_norm: F32,
  layer_norm: F32,
  group_norm: F32,
  rope: ["f32", "i32"],
  silu: F32,
  gelu: F32,
  sigmoid: F32,
  swiglu: F32,
  softmax: F32,
  add: F32,
  sub: F32,
  mul: F32,
  scale: F32,
  modulate: F32,
  conv2d: F32,
  upsample_nearest2d: F32,
  concat: DTYPE_NAMES,
  slice: DTYPE_NAMES,
  copy: DTYPE_NAMES,
  set: DTYPE_NAMES,
  argmax: F32,
  top_k: F32,
};
