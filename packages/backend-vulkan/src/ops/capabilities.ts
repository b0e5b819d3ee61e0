/**
 * What the vulkan backend runs: the tensor dtypes of each op and the weight formats of matmul /
 * embedding. `VulkanBackend.supports` and `capabilities` answer from these tables only, so they list
 * exactly what has a kernel here and passes the conformance suite; anything else is E_UNSUPPORTED.
 */
import { DTYPE_NAMES, type DTypeName, type OpName, type WeightFormat } from "@tp/tensor";
import { CAST_DTYPES } from "./layout.ts";
import { CONVROT_FORMATS, WEIGHT_FORMAT_CODES } from "./matmul.ts";

/** f32 activations only. */
const F32: readonly DTypeName[] = ["f32"];

/**
 * Tensor dtypes per op (an op missing here has no kernel on this backend): activations are f32; rope
 * also takes i32 positions, embedding i32 ids; the layout ops move any dtype; cast converts between
 * f32 and the narrow floats.
 */
export const VK_OP_DTYPES: Readonly<Partial<Record<OpName, readonly DTypeName[]>>> = {
  silu: F32,
  sigmoid: F32,
  gelu: F32,
  scale: F32,
  add: F32,
  sub: F32,
  mul: F32,
  swiglu: F32,
  modulate: F32,
  copy: DTYPE_NAMES,
  set: DTYPE_NAMES,
  slice: DTYPE_NAMES,
  concat: DTYPE_NAMES,
  upsample_nearest2d: F32,
  cast: CAST_DTYPES,
  softmax: F32,
  rms_norm: F32,
  layer_norm: F32,
  group_norm: F32,
  rope: ["f32", "i32"],
  matmul: F32,
  embedding: ["i32"],
  attention: F32,
  conv2d: F32,
  argmax: F32,
  top_k: F32,
};

/** Weight formats of embedding: those the kernels decode (shaders/weights.glsl). */
const EMBEDDING_FORMATS: readonly WeightFormat[] = Object.keys(WEIGHT_FORMAT_CODES) as WeightFormat[];

/** Weight formats of matmul: the decoded ones and INT8 / INT4 ConvRot. */
const MATMUL_FORMATS: readonly WeightFormat[] = [...EMBEDDING_FORMATS, ...CONVROT_FORMATS];

/** Every weight format some op takes here. */
export const VK_WEIGHT_FORMATS: readonly WeightFormat[] = MATMUL_FORMATS;

/** Weight formats of the weight ops. */
const WEIGHT_OP_FORMATS: Readonly<Partial<Record<OpName, readonly WeightFormat[]>>> = {
  matmul: MATMUL_FORMATS,
  embedding: EMBEDDING_FORMATS,
};

/** True when `op` has a kernel here taking every one of `formats` (dtypes and weight formats). */
export function supportsOp(op: OpName, formats: readonly (WeightFormat | DTypeName)[] = []): boolean {
  const dtypes = VK_OP_DTYPES[op];
  if (dtypes === undefined) return false;
  const weights = WEIGHT_OP_FORMATS[op] ?? [];
  return formats.every(
    (f) => (dtypes as readonly string[]).includes(f) || (weights as readonly string[]).includes(f),
  );
}
