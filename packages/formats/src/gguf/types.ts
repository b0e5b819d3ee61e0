/**
 * GGUF value types and ggml tensor type names.
 *
 * Source: ggml-org/ggml `docs/gguf.md` (`enum gguf_metadata_value_type`), llama.cpp
 * `ggml/src/gguf.cpp` (`GGUF_TYPE_SIZE`, `GGUF_TYPE_NAME`), ../shared/spec/llm.md §1.1.
 */
import { TpError, WEIGHT_FORMATS, type WeightFormat, weightFormatFromGgml } from "@tp/tensor";

/** GGUF metadata value type ids (`gguf_type`). */
export const GGUF_TYPE = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** A GGUF value type id, 0..12. */
export type GgufType = (typeof GGUF_TYPE)[keyof typeof GGUF_TYPE];

/** ggml's short names of the value types (`GGUF_TYPE_NAME`), indexed by id. */
export const GGUF_TYPE_NAMES = [
  "u8",
  "i8",
  "u16",
  "i16",
  "u32",
  "i32",
  "f32",
  "bool",
  "str",
  "arr",
  "u64",
  "i64",
  "f64",
] as const;

/** A short value type name: `"u32"`, `"str"`, `"arr"`, … */
export type GgufTypeName = (typeof GGUF_TYPE_NAMES)[number];

/** Bytes of one value of a fixed-size type; 0 for `str` and `arr` (variable). */
export const GGUF_TYPE_SIZE: readonly number[] = [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8];

/** The default `general.alignment` (`GGUF_DEFAULT_ALIGNMENT`). */
export const GGUF_DEFAULT_ALIGNMENT = 32;

/** The GGUF magic, "GGUF" read as a little-endian u32. */
export const GGUF_MAGIC = 0x46554747;

/** ggml's limit on tensor name length (`GGML_MAX_NAME`, including the terminating NUL). */
export const GGML_MAX_NAME = 64;

/** ggml's limit on the number of dimensions (`GGML_MAX_DIMS`). */
export const GGML_MAX_DIMS = 4;

/** True when `t` is a GGUF value type id. */
export function isGgufType(t: number): t is GgufType {
  return Number.isInteger(t) && t >= 0 && t <= 12;
}

/**
 * The id of a type given by id or short name.
 * @throws TpError E_ARG for anything else, listing the names
 */
export function ggufTypeId(t: GgufType | GgufTypeName): GgufType {
  if (typeof t === "number" && isGgufType(t)) return t;
  const i = GGUF_TYPE_NAMES.indexOf(t as GgufTypeName);
  if (i < 0)
    throw new TpError(
      "E_ARG",
      `unknown GGUF value type '${t}'; expected one of: ${GGUF_TYPE_NAMES.join(", ")}`,
    );
  return i as GgufType;
}

/** True for the integer value types (u8 … i64). */
export function isGgufIntType(t: number): boolean {
  return t <= 5 || t === 10 || t === 11;
}

/**
 * The weight format and the GGUF/ggml type name (`"Q4_K"`, `"F32"`) of a ggml type id, or null when
 * the id is unknown or retired.
 */
export function ggmlTypeInfo(
  id: number,
): { format: WeightFormat; name: string; blockElems: number; blockBytes: number } | null {
  let format: WeightFormat;
  try {
    format = weightFormatFromGgml(id);
  } catch {
    return null;
  }
  const info = WEIGHT_FORMATS[format];
  return {
    format,
    name: info.ggufName ?? format.toUpperCase(),
    blockElems: info.blockElems,
    blockBytes: info.blockBytes,
  };
}

/**
 * The ggml type id of a weight format or GGUF type name (`"q4_k"`, `"Q4_K"`, `"bf16"`).
 * @throws TpError E_ARG when the format has no ggml type (fp8, ConvRot, unsigned ints)
 */
export function ggmlTypeOf(format: string): number {
  const lower = format.toLowerCase() as WeightFormat;
  const info = WEIGHT_FORMATS[lower];
  if (info === undefined || info.ggmlType === null) {
    throw new TpError("E_ARG", `'${format}' has no ggml type id; GGUF cannot store it`);
  }
  return info.ggmlType;
}
