/**
 * The safetensors dtype vocabulary, with bit widths and the enum order the reference writer sorts by.
 *
 * Source: huggingface/safetensors `safetensors/src/tensor.rs`, `enum Dtype` ("They MUST be in
 * increasing alignment order") and `Dtype::bitsize`: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2,
 * F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64.
 */
import type { DTypeName } from "@tp/tensor";

/** One safetensors dtype. */
export interface SafetensorsDtype {
  /** Header string, e.g. `"BF16"`. */
  readonly name: string;
  /** Bits per element (4 and 6 for the packed float types). */
  readonly bits: number;
  /** Position in the reference `Dtype` enum; the writer sorts by descending rank, then name. */
  readonly rank: number;
  /** The `@tp/tensor` dtype, or null where TensorPencil has none (the bytes are still readable). */
  readonly dtype: DTypeName | null;
}

const LIST: readonly (readonly [string, number, DTypeName | null])[] = [
  ["BOOL", 8, "bool"],
  ["F4", 4, null],
  ["F6_E2M3", 6, null],
  ["F6_E3M2", 6, null],
  ["U8", 8, "u8"],
  ["I8", 8, "i8"],
  ["F8_E5M2", 8, "f8_e5m2"],
  ["F8_E4M3", 8, "f8_e4m3fn"],
  ["F8_E8M0", 8, null],
  ["F8_E4M3FNUZ", 8, null],
  ["F8_E5M2FNUZ", 8, null],
  ["I16", 16, "i16"],
  ["U16", 16, "u16"],
  ["F16", 16, "f16"],
  ["BF16", 16, "bf16"],
  ["I32", 32, "i32"],
  ["U32", 32, "u32"],
  ["F32", 32, "f32"],
  ["C64", 64, null],
  ["F64", 64, "f64"],
  ["I64", 64, "i64"],
  ["U64", 64, "u64"],
];

/** Every safetensors dtype by header string. */
export const SAFETENSORS_DTYPES: ReadonlyMap<string, SafetensorsDtype> = new Map(
  LIST.map(([name, bits, dtype], rank) => [name, { name, bits, rank, dtype }]),
);

/** The header strings, in enum order. */
export const SAFETENSORS_DTYPE_NAMES: readonly string[] = LIST.map(([n]) => n);

/**
 * The safetensors header string of a `@tp/tensor` dtype (`"bf16"` → `"BF16"`), or the argument itself
 * when it already is a header string. Returns null when neither.
 */
export function safetensorsDtypeName(dtype: string): string | null {
  if (SAFETENSORS_DTYPES.has(dtype)) return dtype;
  for (const d of SAFETENSORS_DTYPES.values()) if (d.dtype === dtype) return d.name;
  return null;
}

/**
 * Bytes of `numel` elements of `dtype`, or null when they do not fill whole bytes (an odd count of
 * F4 elements) or the count is not a safe integer.
 */
export function safetensorsByteLength(dtype: SafetensorsDtype, numel: number): number | null {
  const bits = numel * dtype.bits;
  if (!Number.isSafeInteger(bits) || bits % 8 !== 0) return null;
  return bits / 8;
}
