/**
 * Element types of tensors and storage formats of weights.
 *
 * Two families:
 * - {@link DTypeName}: element types a `Tensor` can hold, one value per element (f32, f16, bf16,
 *   fp8, integers, bool).
 * - {@link WeightFormat}: how a `Weight` is stored in a checkpoint. Every plain float dtype is a weight
 *   format; so are the GGUF block-quantized types (by their ggml type ids) and the INT8 / INT4 ConvRot
 *   formats of ComfyUI.
 *
 * Sources: safetensors dtype strings — huggingface/safetensors `safetensors/src/tensor.rs` (`Dtype`);
 * ggml type ids, block sizes and block bytes — ggml `ggml/src/ggml.c` `type_traits` and
 * ../shared/spec/llm.md §1.1 and §2; ConvRot — ../shared/spec/krea2.md §1.6–1.8.
 */

import { TpError } from "./errors.ts";

/** Element types of tensors. */
export type DTypeName =
  | "f64"
  | "f32"
  | "f16"
  | "bf16"
  | "f8_e4m3fn"
  | "f8_e5m2"
  | "i64"
  | "u64"
  | "i32"
  | "u32"
  | "i16"
  | "u16"
  | "i8"
  | "u8"
  | "bool";

/** Facts about one element type. */
export interface DTypeInfo {
  /** Our name. */
  readonly name: DTypeName;
  /** Bytes per element. */
  readonly bytes: number;
  /** Numeric family. */
  readonly kind: "float" | "int" | "uint" | "bool";
  /** The safetensors header string (`"F32"`, `"F8_E4M3"`, ...). */
  readonly safetensors: string;
  /** ggml type id in GGUF files, or null where GGUF has no such type. */
  readonly ggmlType: number | null;
  /** GGUF / ggml type name (`"F32"`, `"BF16"`, ...), or null. */
  readonly ggufName: string | null;
}

const DTYPE_LIST: readonly DTypeInfo[] = [
  { name: "f64", bytes: 8, kind: "float", safetensors: "F64", ggmlType: 28, ggufName: "F64" },
  { name: "f32", bytes: 4, kind: "float", safetensors: "F32", ggmlType: 0, ggufName: "F32" },
  { name: "f16", bytes: 2, kind: "float", safetensors: "F16", ggmlType: 1, ggufName: "F16" },
  { name: "bf16", bytes: 2, kind: "float", safetensors: "BF16", ggmlType: 30, ggufName: "BF16" },
  { name: "f8_e4m3fn", bytes: 1, kind: "float", safetensors: "F8_E4M3", ggmlType: null, ggufName: null },
  { name: "f8_e5m2", bytes: 1, kind: "float", safetensors: "F8_E5M2", ggmlType: null, ggufName: null },
  { name: "i64", bytes: 8, kind: "int", safetensors: "I64", ggmlType: 27, ggufName: "I64" },
  { name: "u64", bytes: 8, kind: "uint", safetensors: "U64", ggmlType: null, ggufName: null },
  { name: "i32", bytes: 4, kind: "int", safetensors: "I32", ggmlType: 26, ggufName: "I32" },
  { name: "u32", bytes: 4, kind: "uint", safetensors: "U32", ggmlType: null, ggufName: null },
  { name: "i16", bytes: 2, kind: "int", safetensors: "I16", ggmlType: 25, ggufName: "I16" },
  { name: "u16", bytes: 2, kind: "uint", safetensors: "U16", ggmlType: null, ggufName: null },
  { name: "i8", bytes: 1, kind: "int", safetensors: "I8", ggmlType: 24, ggufName: "I8" },
  { name: "u8", bytes: 1, kind: "uint", safetensors: "U8", ggmlType: null, ggufName: null },
  { name: "bool", bytes: 1, kind: "bool", safetensors: "BOOL", ggmlType: null, ggufName: null },
];

/** Every element type, by name. */
export const DTYPES: Readonly<Record<DTypeName, DTypeInfo>> = Object.fromEntries(
  DTYPE_LIST.map((d) => [d.name, d]),
) as Record<DTypeName, DTypeInfo>;

/** All dtype names, in the order of {@link DTYPES}. */
export const DTYPE_NAMES: readonly DTypeName[] = DTYPE_LIST.map((d) => d.name);

/** True when `s` names a dtype. */
export function isDType(s: string): s is DTypeName {
  return Object.hasOwn(DTYPES, s);
}

/**
 * Facts about a dtype.
 * @throws TpError E_ARG when `name` is not a dtype; the message lists the valid names.
 */
export function dtypeInfo(name: string): DTypeInfo {
  if (!isDType(name)) {
    throw new TpError("E_ARG", `unknown dtype '${name}'; expected one of: ${DTYPE_NAMES.join(", ")}`);
  }
  return DTYPES[name];
}

/** Bytes per element of a dtype. @throws TpError E_ARG for an unknown name. */
export function dtypeBytes(name: DTypeName): number {
  return dtypeInfo(name).bytes;
}

/**
 * The dtype of a safetensors header string (`"BF16"` → `"bf16"`), or null when the string is not one
 * we know. Source: safetensors `Dtype` enum.
 */
export function dtypeFromSafetensors(s: string): DTypeName | null {
  return DTYPE_LIST.find((d) => d.safetensors === s)?.name ?? null;
}

// ---------------------------------------------------------------------------------------------
// Weight formats
// ---------------------------------------------------------------------------------------------

/** GGUF block-quantized types, lower-case ggml names. */
export type GgmlBlockFormat =
  | "q4_0"
  | "q4_1"
  | "q5_0"
  | "q5_1"
  | "q8_0"
  | "q8_1"
  | "q2_k"
  | "q3_k"
  | "q4_k"
  | "q5_k"
  | "q6_k"
  | "q8_k"
  | "iq2_xxs"
  | "iq2_xs"
  | "iq3_xxs"
  | "iq1_s"
  | "iq4_nl"
  | "iq3_s"
  | "iq2_s"
  | "iq4_xs"
  | "iq1_m"
  | "tq1_0"
  | "tq2_0"
  | "mxfp4"
  | "nvfp4"
  | "q1_0"
  | "q2_0";

/** ComfyUI ConvRot formats: Hadamard-rotated rows quantized with one f32 scale per row. */
export type ConvRotFormat = "int8_convrot" | "int4_convrot";

/** How a weight is stored: a plain dtype, a GGUF block type, or ConvRot. */
export type WeightFormat = DTypeName | GgmlBlockFormat | ConvRotFormat;

/** Facts about a weight format. */
export interface WeightFormatInfo {
  /** Our name. */
  readonly name: WeightFormat;
  /** Family: plain elements, a GGUF block type, or ConvRot. */
  readonly family: "plain" | "ggml" | "convrot";
  /** Elements per storage block (1 for plain types, 32 or 256 for GGUF, 2 for packed int4). */
  readonly blockElems: number;
  /** Bytes per storage block. */
  readonly blockBytes: number;
  /** ggml type id, or null. */
  readonly ggmlType: number | null;
  /** GGUF / ggml type name (`"Q4_K"`), or null. */
  readonly ggufName: string | null;
  /** safetensors dtype strings this format is stored as (ConvRot int4: `I8` officially, `U8` too). */
  readonly safetensors: readonly string[];
  /** ConvRot only: columns per Hadamard rotation group (krea2.md §1.6). */
  readonly rotationGroup?: number;
  /** ConvRot only: where the per-row f32 scale lives, relative to the weight name. */
  readonly scaleTensor?: string;
}

/** GGUF block types: [name, ggml id, elements per block, bytes per block]. Source: llm.md §1.1, §2. */
const GGML_BLOCK_TYPES: readonly (readonly [GgmlBlockFormat, number, number, number])[] = [
  ["q4_0", 2, 32, 18],
  ["q4_1", 3, 32, 20],
  ["q5_0", 6, 32, 22],
  ["q5_1", 7, 32, 24],
  ["q8_0", 8, 32, 34],
  ["q8_1", 9, 32, 36],
  ["q2_k", 10, 256, 84],
  ["q3_k", 11, 256, 110],
  ["q4_k", 12, 256, 144],
  ["q5_k", 13, 256, 176],
  ["q6_k", 14, 256, 210],
  ["q8_k", 15, 256, 292],
  ["iq2_xxs", 16, 256, 66],
  ["iq2_xs", 17, 256, 74],
  ["iq3_xxs", 18, 256, 98],
  ["iq1_s", 19, 256, 50],
  ["iq4_nl", 20, 32, 18],
  ["iq3_s", 21, 256, 110],
  ["iq2_s", 22, 256, 82],
  ["iq4_xs", 23, 256, 136],
  ["iq1_m", 29, 256, 56],
  ["tq1_0", 34, 256, 54],
  ["tq2_0", 35, 256, 66],
  ["mxfp4", 39, 32, 17],
  ["nvfp4", 40, 64, 36],
  // Newer ggml trees (ggml.h GGML_TYPE_Q1_0 = 41, GGML_TYPE_Q2_0 = 42; ggml-common.h block_q1_0 / block_q2_0):
  // an f16 scale plus 1 or 2 bits per element.
  ["q1_0", 41, 128, 18],
  ["q2_0", 42, 64, 18],
];

/** ggml type ids that were removed from ggml (Q4_2, Q4_3, the Q4_0_x_y / IQ4_NL_x_y repacks). */
export const GGML_RETIRED_TYPES: readonly number[] = [4, 5, 31, 32, 33, 36, 37, 38];

function ggufUpper(name: string): string {
  // ggml spells k-quants "Q4_K" and the rest upper case: "Q4_0", "IQ4_XS", "MXFP4".
  return name.toUpperCase();
}

const WEIGHT_FORMAT_LIST: readonly WeightFormatInfo[] = [
  ...DTYPE_LIST.map(
    (d): WeightFormatInfo => ({
      name: d.name,
      family: "plain",
      blockElems: 1,
      blockBytes: d.bytes,
      ggmlType: d.ggmlType,
      ggufName: d.ggufName,
      safetensors: [d.safetensors],
    }),
  ),
  ...GGML_BLOCK_TYPES.map(
    ([name, id, elems, bytes]): WeightFormatInfo => ({
      name,
      family: "ggml",
      blockElems: elems,
      blockBytes: bytes,
      ggmlType: id,
      ggufName: ggufUpper(name),
      safetensors: [],
    }),
  ),
  {
    name: "int8_convrot",
    family: "convrot",
    blockElems: 1,
    blockBytes: 1,
    ggmlType: null,
    ggufName: null,
    safetensors: ["I8"],
    rotationGroup: 256,
    scaleTensor: "weight_scale",
  },
  {
    // Two signed nibbles per byte: element 2k in bits 0..3, element 2k+1 in bits 4..7 (krea2.md §1.8).
    name: "int4_convrot",
    family: "convrot",
    blockElems: 2,
    blockBytes: 1,
    ggmlType: null,
    ggufName: null,
    safetensors: ["I8", "U8"],
    rotationGroup: 256,
    scaleTensor: "weight_scale",
  },
];

/** Every weight format, by name. */
export const WEIGHT_FORMATS: Readonly<Record<WeightFormat, WeightFormatInfo>> = Object.fromEntries(
  WEIGHT_FORMAT_LIST.map((f) => [f.name, f]),
) as Record<WeightFormat, WeightFormatInfo>;

/** All weight format names. */
export const WEIGHT_FORMAT_NAMES: readonly WeightFormat[] = WEIGHT_FORMAT_LIST.map((f) => f.name);

/** True when `s` names a weight format. */
export function isWeightFormat(s: string): s is WeightFormat {
  return Object.hasOwn(WEIGHT_FORMATS, s);
}

/**
 * Facts about a weight format.
 * @throws TpError E_ARG for an unknown name, listing the valid ones.
 */
export function weightFormatInfo(name: string): WeightFormatInfo {
  if (!isWeightFormat(name)) {
    throw new TpError(
      "E_ARG",
      `unknown weight format '${name}'; expected one of: ${WEIGHT_FORMAT_NAMES.join(", ")}`,
    );
  }
  return WEIGHT_FORMATS[name];
}

/**
 * The weight format of a ggml type id (GGUF tensor info), e.g. 12 → "q4_k", 0 → "f32".
 * @throws TpError E_UNSUPPORTED for a retired or unknown id, naming the id (and `tensor` if given).
 */
export function weightFormatFromGgml(id: number, tensor?: string): WeightFormat {
  if (!Number.isInteger(id) || id < 0) {
    throw new TpError(
      "E_UNSUPPORTED",
      `ggml type id ${id} is not a type id`,
      tensor === undefined ? {} : { tensor },
    );
  }
  const found = WEIGHT_FORMAT_LIST.find((f) => f.ggmlType === id);
  if (found) return found.name;
  const why = GGML_RETIRED_TYPES.includes(id) ? "a retired ggml type" : "an unknown ggml type";
  throw new TpError("E_UNSUPPORTED", `ggml type id ${id} is ${why}`, tensor === undefined ? {} : { tensor });
}

/**
 * Bytes of one row of `k` elements in `format` (a row never shares a block with the next row).
 * @throws TpError E_SHAPE when `k` is not a multiple of the format's block size.
 */
export function rowBytes(format: WeightFormat, k: number): number {
  const f = weightFormatInfo(format);
  if (!Number.isSafeInteger(k) || k < 0 || k % f.blockElems !== 0) {
    throw new TpError(
      "E_SHAPE",
      `a row of ${k} elements is not a whole number of ${format} blocks (${f.blockElems} elements each)`,
    );
  }
  return (k / f.blockElems) * f.blockBytes;
}

/**
 * Bytes of a weight of `shape` (torch order, last dimension contiguous) in `format`; block types tile
 * the last dimension only (llm.md §1.1).
 * @throws TpError E_SHAPE for a last dimension that is not a whole number of blocks, or bad dims.
 */
export function weightBytes(format: WeightFormat, shape: readonly number[]): number {
  if (!Array.isArray(shape))
    throw new TpError("E_SHAPE", `weight shape must be an array, got ${String(shape)}`);
  if (shape.length === 0) return rowBytes(format, 1); // a scalar: one element, plain formats only
  let rows = 1;
  for (let i = 0; i < shape.length - 1; i++) {
    const d = shape[i] as number;
    if (!Number.isSafeInteger(d) || d < 0) throw new TpError("E_SHAPE", `bad dimension ${d} in [${shape}]`);
    rows *= d;
  }
  const total = rows * rowBytes(format, shape[shape.length - 1] as number);
  if (!Number.isSafeInteger(total)) throw new TpError("E_SHAPE", `weight [${shape}] is too large`);
  return total;
}
