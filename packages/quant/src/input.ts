/**
 * Float inputs of the quantizers: an f32 array, or raw little-endian f16 / bf16 / f32 bytes with their
 * dtype. Narrow floats are widened exactly through `@tp/tensor`'s `decodeToF32` (no rounding: every
 * f16 and bf16 value is an f32 value).
 */

import { decodeToF32, TpError } from "@tp/tensor";

/** Raw bytes of a float tensor (checkpoint layout, little-endian). */
export interface FloatBytes {
  /** The tensor's bytes; any alignment. */
  readonly bytes: Uint8Array;
  /** Element type of `bytes`. */
  readonly dtype: "f32" | "f16" | "bf16";
}

/** An f32 array, or raw f16 / bf16 / f32 bytes. */
export type FloatInput = Float32Array | FloatBytes;

/**
 * Widen a {@link FloatInput} to f32 (exact). An f32 array is returned as is (not copied).
 * @param input  values, or bytes + dtype
 * @param count  expected element count
 * @param tensor tensor name for errors
 * @throws TpError E_SHAPE when the element count is not `count`.
 */
export function toF32(input: FloatInput, count: number, tensor?: string): Float32Array {
  let out: Float32Array;
  if (input instanceof Float32Array) out = input;
  else if (input.dtype === "f32") {
    if (input.bytes.byteLength % 4 !== 0) {
      throw new TpError("E_SHAPE", `f32 input of ${input.bytes.byteLength} bytes`, ctx(tensor));
    }
    const copy = input.bytes.slice(); // aligned copy for the Float32Array view
    out = new Float32Array(copy.buffer, 0, copy.byteLength / 4);
  } else out = decodeToF32(input.bytes, input.dtype);
  if (out.length !== count) {
    throw new TpError("E_SHAPE", `expected ${count} values, got ${out.length}`, ctx(tensor));
  }
  return out;
}

/**
 * As {@link toF32}, and every value must be finite: a quantizer given NaN or ±∞ would write NaN
 * scales or codes that decode to garbage (ARCHITECTURE.md §Errors: non-finite results are errors).
 * @throws TpError E_SHAPE as toF32; E_NUMERIC naming the tensor, the element and the value
 */
export function finiteF32(input: FloatInput, count: number, tensor?: string): Float32Array {
  const x = toF32(input, count, tensor);
  for (let i = 0; i < x.length; i++) {
    const v = x[i] as number;
    if (!Number.isFinite(v)) throw nonFiniteInput(i, v, tensor);
  }
  return x;
}

/** The E_NUMERIC error of a quantizer input holding `value` at element `index`. */
export function nonFiniteInput(index: number, value: number, tensor?: string): TpError {
  return new TpError(
    "E_NUMERIC",
    `cannot quantize: element ${index} is ${value} (the source checkpoint is damaged; quantizing would write NaN)`,
    ctx(tensor),
  );
}

/** `{ tensor }` when a name is known, for TpError contexts. */
export function ctx(tensor: string | undefined): { tensor?: string } {
  return tensor === undefined ? {} : { tensor };
}
