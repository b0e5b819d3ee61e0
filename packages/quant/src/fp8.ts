/**
 * fp8 weights: OCP E4M3FN ("float8_e4m3fn": no infinities, max 448, 0x7F/0xFF NaN) and E5M2, raw or
 * with one per-tensor f32 scale (`*_fp8_scaled` checkpoints: `w = f32(fp8) · weight_scale`).
 *
 * Decoding goes through `@tp/tensor`'s exact 256-entry tables (krea2.md §1.5). The quantizer follows
 * ComfyUI's convention for `*_fp8_scaled` files — comfy-kitchen eager `quantize_per_tensor_fp8`, used by
 * ComfyUI's `TensorCoreFP8Layout` with `scale="recalculate"`:
 * `s = f32(max|w|) / 448` (f32), `q = fp8(clamp(f32(w · f32(1/s)), −448, 448))` with round-to-nearest-even
 * — a multiply by the f32 reciprocal, not a division. The krea2-tiny `krea2_tiny_fp8_scaled` file is
 * reproduced bit for bit this way (a division differs in 76 of 2,077,696 values).
 */

import { decodeTable, f32ToF8e4m3fn, f32ToF8e5m2, TpError } from "@tp/tensor";
import { ctx, type FloatInput, finiteF32 } from "./input.ts";

/** The two fp8 element types. */
export type Fp8Dtype = "f8_e4m3fn" | "f8_e5m2";

/** Largest finite value: 448 (E4M3FN), 57344 (E5M2). */
export const FP8_MAX: Readonly<Record<Fp8Dtype, number>> = { f8_e4m3fn: 448, f8_e5m2: 57344 };

/**
 * Decode fp8 bytes to f32, optionally times a per-tensor scale: `w = f32(f32(fp8) · scale)`.
 * @param bytes  one byte per element
 * @param dtype  f8_e4m3fn or f8_e5m2
 * @param scale  the f32 `weight_scale` (or legacy `scale_weight`); omit for raw fp8 (no multiply)
 * @returns Float32Array of bytes.length values (NaN codes decode to NaN)
 * Source: krea2.md §1.4–1.5; ComfyUI `dequantize_per_tensor_fp8` (`x.to(f32) * scale`).
 */
export function dequantizeFp8(bytes: Uint8Array, dtype: Fp8Dtype, scale?: number): Float32Array {
  const table = decodeTable(dtype);
  const out = new Float32Array(bytes.length);
  if (scale === undefined) {
    for (let i = 0; i < bytes.length; i++) out[i] = table[bytes[i] as number] as number;
  } else {
    const s = Math.fround(scale);
    for (let i = 0; i < bytes.length; i++) out[i] = (table[bytes[i] as number] as number) * s;
  }
  return out;
}

/** An fp8-scaled weight: codes and the per-tensor f32 scale. */
export interface Fp8ScaledWeight {
  /** fp8 codes, one byte per element. */
  readonly data: Uint8Array;
  /** The f32 `weight_scale` (`w ≈ f32(fp8) · scale`). */
  readonly scale: number;
}

/**
 * Quantize a dense tensor to fp8 with one per-tensor scale, as ComfyUI writes `*_fp8_scaled` files
 * (see the module comment). An all-zero tensor gets scale 1 and zero codes (ComfyUI would divide by
 * zero).
 * @param input  f32 values, or f16 / bf16 / f32 bytes (widened exactly)
 * @param count  number of elements
 * @param options dtype (default f8_e4m3fn), name for errors
 * @returns codes and scale
 * @throws TpError E_SHAPE when the input does not hold `count` values; E_NUMERIC when it holds NaN or
 *   ±inf (naming the element); E_ARG when max |w| is so small that 1 / scale overflows f32
 */
export function quantizeFp8Scaled(
  input: FloatInput,
  count: number,
  options: { dtype?: Fp8Dtype; name?: string } = {},
): Fp8ScaledWeight {
  const dtype = options.dtype ?? "f8_e4m3fn";
  const x = finiteF32(input, count, options.name);
  let amax = 0;
  for (let i = 0; i < x.length; i++) amax = Math.max(amax, Math.abs(x[i] as number));
  const max = FP8_MAX[dtype];
  const data = new Uint8Array(x.length);
  if (amax === 0) return { data, scale: 1 };
  const scale = Math.fround(amax / max);
  const inv = Math.fround(1 / scale);
  if (!Number.isFinite(inv)) {
    throw new TpError(
      "E_ARG",
      `fp8 scale ${scale} is too small to invert in f32 (max |w| = ${amax})`,
      ctx(options.name),
    );
  }
  const enc = dtype === "f8_e4m3fn" ? f32ToF8e4m3fn : f32ToF8e5m2;
  for (let i = 0; i < x.length; i++) {
    const v = Math.fround((x[i] as number) * inv);
    data[i] = enc(Math.min(max, Math.max(-max, v)), true);
  }
  return { data, scale };
}
