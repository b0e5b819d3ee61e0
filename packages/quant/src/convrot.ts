/**
 * INT8 and INT4 ConvRot weights (ComfyUI `int8_tensorwise` + `convrot`, and `convrot_w4a4`): each
 * output row is rotated by the Hadamard matrix in groups of g input columns, then quantized with one
 * f32 scale per row.
 *
 * Storage (krea2.md §1.7–1.8):
 * - int8: `<layer>.weight` I8 [N, K], codes −128..127; `<layer>.weight_scale` F32 [N, 1] (or [N]).
 * - int4: `<layer>.weight` I8 (official) or U8 [N, K/2], two signed nibbles per byte — element 2k in
 *   bits 0..3, element 2k+1 in bits 4..7, nibble n ≥ 8 means n − 16; the quantizer emits −7..7 only,
 *   but −8 decodes; `<layer>.weight_scale` F32 [N] (or [N, 1]).
 *
 * Quantizer (comfy-kitchen `quantize_int8_convrot_weight` / `quantize_convrot_w4a4_weight`, eager
 * backend; krea2.md §1.7–1.8):
 * - rotate: `w_rot[g] = w[g] · Hᵀ`; here computed in f64 and rounded once to f32 (the correctly
 *   rounded f32 rotation; torch's f32 matmul differs from it by an ulp now and then, which moves a code
 *   only when the value sits on a rounding boundary);
 * - int8: `s = max(f32(max|w_rot| / 127), 1e-30)`, `q = clamp(round_half_even(f32(w_rot / s)), −128, 127)`;
 * - int4: `s = f32(max(max|w_rot|, 1e-10) / 7)`, `q = clamp(round_half_even(f32(w_rot / s)), −7, 7)`.
 *
 * Dequantizer: `w[g] = (q[g] · s) · H`. Computed exactly: the integer codes are rotated by the
 * unnormalized butterfly in integers, then each value is `f32(t · s) · 2^-m` — one rounding, the
 * correctly rounded value of the exact product. ComfyUI's own dequantization (a torch f32 matmul)
 * differs from it by rounding noise (the shared int4 fixture: ~1.6e-7 relative RMSE).
 */

import { TpError, type Weight } from "@tp/tensor";
import {
  CONVROT_GROUP_SIZE,
  checkGroups,
  hadamardDigits,
  hadamardTransform,
  hadamardTransformInt,
} from "./hadamard.ts";
import { ctx, type FloatInput, finiteF32, toF32 } from "./input.ts";
import { roundHalfEven } from "./rounding.ts";

/** The two ConvRot weight formats (names as in `@tp/tensor`'s `WeightFormat`). */
export type ConvRotFormat = "int8_convrot" | "int4_convrot";

/** A ConvRot weight in memory: the stored codes and per-row scales, plus the logical shape. */
export interface ConvRotWeight {
  /** int8_convrot or int4_convrot. */
  readonly format: ConvRotFormat;
  /** Logical shape [N, K]: output rows × input columns (int4 stores K/2 bytes per row). */
  readonly shape: readonly [number, number];
  /** Columns per rotation group (`convrot_groupsize`), a power of 4; 256 in production files. */
  readonly groupSize: number;
  /** Stored codes: int8 — N·K bytes of two's-complement i8; int4 — N·K/2 bytes of packed nibbles. */
  readonly data: Uint8Array;
  /** Per-row f32 scales [N] of the rotated weight. */
  readonly scale: Float32Array;
}

/** Largest code magnitude a row scale maps max|row| to: 127 (int8) or 7 (int4). */
export const CONVROT_QMAX: Readonly<Record<ConvRotFormat, number>> = { int8_convrot: 127, int4_convrot: 7 };

/** Bits per code. */
export function convRotBits(format: ConvRotFormat): 8 | 4 {
  return format === "int8_convrot" ? 8 : 4;
}

/**
 * Pack signed 4-bit codes two per byte: element 2k → bits 0..3, element 2k+1 → bits 4..7, two's
 * complement (krea2.md §1.8; comfy-kitchen `_pack_int4_row_major`).
 * @param codes integers in −8..7, even count
 * @returns Uint8Array of codes.length / 2 bytes
 * @throws TpError E_SHAPE for an odd count; E_ARG for a code outside −8..7.
 */
export function packInt4(codes: ArrayLike<number>, tensor?: string): Uint8Array {
  if (codes.length % 2 !== 0) {
    throw new TpError(
      "E_SHAPE",
      `int4 packing needs an even number of codes, got ${codes.length}`,
      ctx(tensor),
    );
  }
  const out = new Uint8Array(codes.length / 2);
  for (let i = 0; i < out.length; i++) {
    const lo = codes[2 * i] as number;
    const hi = codes[2 * i + 1] as number;
    if (lo < -8 || lo > 7 || hi < -8 || hi > 7 || !Number.isInteger(lo) || !Number.isInteger(hi)) {
      throw new TpError(
        "E_ARG",
        `int4 code out of range −8..7 at element ${2 * i}: ${lo}, ${hi}`,
        ctx(tensor),
      );
    }
    out[i] = (lo & 15) | ((hi & 15) << 4);
  }
  return out;
}

/**
 * Unpack signed 4-bit codes: byte k holds element 2k (low nibble) and 2k+1 (high nibble); a nibble
 * n ≥ 8 is n − 16 (so −8 decodes, although the quantizer never writes it).
 * @param bytes packed codes
 * @returns Int8Array of 2·bytes.length codes in −8..7
 */
export function unpackInt4(bytes: Uint8Array): Int8Array {
  const out = new Int8Array(bytes.length * 2);
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i] as number;
    out[2 * i] = ((b & 15) ^ 8) - 8; // sign-extend the nibble
    out[2 * i + 1] = ((b >> 4) ^ 8) - 8;
  }
  return out;
}

/**
 * Symmetric per-row quantization of already-rotated f32 rows, exactly as comfy-kitchen's eager
 * `quantize_int8_rowwise` (bits 8) and `quantize_signed_int4_rowwise` (bits 4) compute it in f32:
 * - 8: `s = max(f32(max|x| / 127), f32(1e-30))`, `q = clamp(round_half_even(f32(x / s)), −128, 127)`;
 * - 4: `s = f32(max(max|x|, f32(1e-10)) / 7)`, `q = clamp(round_half_even(f32(x / s)), −7, 7)`.
 * Used for weights (offline) and for activations (at run time, one scale per token row).
 * @param x     [rows, k] f32 values (not modified)
 * @param k     row length
 * @param bits  8 or 4
 * @returns codes [rows, k] as Int8Array and scales [rows] as Float32Array
 * Source: comfy-kitchen comfy_kitchen/backends/eager/quantization.py, convrot_w4a4.py; krea2.md §1.7–1.8.
 */
export function quantizeRowsSymmetric(
  x: Float32Array,
  k: number,
  bits: 8 | 4,
): { codes: Int8Array; scale: Float32Array } {
  const rows = x.length / k;
  const codes = new Int8Array(x.length);
  const scale = new Float32Array(rows);
  const [lo, hi] = bits === 8 ? [-128, 127] : [-7, 7];
  for (let r = 0; r < rows; r++) {
    let amax = 0;
    for (let i = r * k; i < (r + 1) * k; i++) amax = Math.max(amax, Math.abs(x[i] as number));
    const s =
      bits === 8
        ? Math.max(Math.fround(amax / 127), Math.fround(1e-30))
        : Math.fround(Math.max(amax, Math.fround(1e-10)) / 7);
    scale[r] = s;
    for (let i = r * k; i < (r + 1) * k; i++) {
      const q = roundHalfEven(Math.fround((x[i] as number) / s));
      codes[i] = Math.min(hi, Math.max(lo, q));
    }
  }
  return { codes, scale };
}

/** Options of {@link quantizeConvRot}. */
export interface QuantizeConvRotOptions {
  /** int8_convrot (default) or int4_convrot. */
  readonly format?: ConvRotFormat;
  /** Rotation group size, a power of 4 dividing K (default 256). */
  readonly groupSize?: number;
  /** Tensor name, for errors. */
  readonly name?: string;
}

/**
 * Quantize a dense weight to INT8 or INT4 ConvRot, as ComfyUI's converters do (see the module
 * comment for the exact arithmetic).
 * @param weight  [N, K] row-major: f32 values, or f16 / bf16 / f32 bytes (widened exactly to f32)
 * @param shape   [N, K]
 * @param options format (default int8_convrot), groupSize (default 256), name
 * @returns the {@link ConvRotWeight}: codes (int8: N·K bytes; int4: N·K/2 packed bytes), scales [N]
 * @throws TpError E_SHAPE when K is not a multiple of the group size, K is odd for int4, or the input
 *   length is not N·K; E_ARG for a group size that is not a power of 4; E_NUMERIC for a NaN or ±∞
 *   value — each naming the tensor.
 */
export function quantizeConvRot(
  weight: FloatInput,
  shape: readonly [number, number],
  options: QuantizeConvRotOptions = {},
): ConvRotWeight {
  const format = options.format ?? "int8_convrot";
  const groupSize = options.groupSize ?? CONVROT_GROUP_SIZE;
  const name = options.name;
  const [n, k] = shape;
  hadamardDigits(groupSize, name);
  if (format === "int4_convrot" && k % 2 !== 0) {
    throw new TpError("E_SHAPE", `int4 ConvRot needs an even K, got K = ${k}`, ctx(name));
  }
  checkGroups(k, groupSize, name);
  const w = finiteF32(weight, n * k, name);
  // Rotate in f64 and round once: the correctly rounded f32 value of w[g] · Hᵀ.
  const rot = new Float32Array(n * k);
  const row = new Float64Array(k);
  for (let r = 0; r < n; r++) {
    for (let i = 0; i < k; i++) row[i] = w[r * k + i] as number;
    for (let g = 0; g < k; g += groupSize) hadamardTransform(row, groupSize, g);
    for (let i = 0; i < k; i++) rot[r * k + i] = row[i] as number;
  }
  const { codes, scale } = quantizeRowsSymmetric(rot, k, convRotBits(format));
  const data = format === "int8_convrot" ? new Uint8Array(codes.buffer) : packInt4(codes, name);
  return { format, shape: [n, k], groupSize, data, scale };
}

/**
 * Check a {@link ConvRotWeight}'s sizes.
 * @throws TpError E_SHAPE (K not a multiple of the group, odd K for int4, data or scale length wrong)
 *   or E_ARG (bad group size), naming the tensor.
 */
export function checkConvRotWeight(w: ConvRotWeight, name?: string): void {
  const [n, k] = w.shape;
  hadamardDigits(w.groupSize, name);
  if (w.format === "int4_convrot" && k % 2 !== 0) {
    throw new TpError("E_SHAPE", `int4 ConvRot needs an even K, got K = ${k}`, ctx(name));
  }
  checkGroups(k, w.groupSize, name);
  const bytes = w.format === "int8_convrot" ? n * k : (n * k) / 2;
  if (w.data.byteLength !== bytes) {
    throw new TpError(
      "E_SHAPE",
      `${w.format} [${n}, ${k}] needs ${bytes} bytes of codes, got ${w.data.byteLength}`,
      ctx(name),
    );
  }
  if (w.scale.length !== n) {
    throw new TpError(
      "E_SHAPE",
      `${w.format} [${n}, ${k}] needs ${n} row scales, got ${w.scale.length}`,
      ctx(name),
    );
  }
}

/**
 * The integer codes of a ConvRot weight, one per logical element.
 * @returns Int8Array [N, K] (int8: a view on the same bytes; int4: unpacked)
 */
export function convRotCodes(w: ConvRotWeight): Int8Array {
  if (w.format === "int4_convrot") return unpackInt4(w.data);
  return new Int8Array(w.data.buffer, w.data.byteOffset, w.data.byteLength);
}

/**
 * Dequantize a ConvRot weight to f32: `w[g] = (q[g] · s_row) · H_g`, exactly (integer rotation of
 * the codes, then one rounding of `t · s_row`, then the exact 2^-m factor).
 * @param w    the weight (codes, scales [N], shape [N, K], group size)
 * @param name tensor name for errors
 * @returns Float32Array [N, K]
 * @throws TpError E_SHAPE / E_ARG from {@link checkConvRotWeight}, naming the tensor.
 * Source: comfy-kitchen `dequantize_int8_convrot_weight`, `dequantize_convrot_w4a4_weight`; krea2.md §1.6–1.8.
 */
export function dequantizeConvRot(w: ConvRotWeight, name?: string): Float32Array {
  checkConvRotWeight(w, name);
  const [n, k] = w.shape;
  const g = w.groupSize;
  const norm = 2 ** -hadamardDigits(g);
  const codes = convRotCodes(w);
  const out = new Float32Array(n * k);
  const t = new Int32Array(k);
  for (let r = 0; r < n; r++) {
    for (let i = 0; i < k; i++) t[i] = codes[r * k + i] as number;
    for (let off = 0; off < k; off += g) hadamardTransformInt(t, g, off);
    const s = w.scale[r] as number;
    for (let i = 0; i < k; i++) out[r * k + i] = Math.fround((t[i] as number) * s) * norm;
  }
  return out;
}

/** One tensor as a checkpoint stores it (safetensors dtype string, shape, bytes). */
export interface StoredTensor {
  /** safetensors dtype string (`I8`, `U8`, `F32`, `BF16`, `F16`). */
  readonly dtype: string;
  /** Stored shape (int4: [N, K/2]). */
  readonly shape: readonly number[];
  /** The tensor's little-endian bytes. */
  readonly bytes: Uint8Array;
}

/**
 * Assemble a {@link ConvRotWeight} from a checkpoint's `<layer>.weight` and `<layer>.weight_scale`,
 * checking dtypes and shapes (krea2.md §1.4 table).
 * @param format    int8_convrot or int4_convrot (from format detection)
 * @param groupSize the marker's `convrot_groupsize` (256 when absent)
 * @param weight    I8 [N, K] (int8) or I8/U8 [N, K/2] (int4)
 * @param scale     F32 (F16/BF16 accepted, widened) [N, 1] or [N]
 * @param name      the weight's tensor name, for errors
 * @throws TpError E_FORMAT for a wrong dtype or rank, or a scale whose shape does not match the rows
 *   ("scale shape mismatch"); E_SHAPE / E_ARG from {@link checkConvRotWeight} — all naming the tensor.
 */
export function convRotFromTensors(
  format: ConvRotFormat,
  groupSize: number,
  weight: StoredTensor,
  scale: StoredTensor,
  name?: string,
): ConvRotWeight {
  const okDtypes = format === "int8_convrot" ? ["I8"] : ["I8", "U8"];
  if (!okDtypes.includes(weight.dtype) || weight.shape.length !== 2) {
    throw new TpError(
      "E_FORMAT",
      `${format} weight must be ${okDtypes.join(" or ")} with 2 dimensions, got ${weight.dtype} [${weight.shape}]`,
      ctx(name),
    );
  }
  const [n, cols] = weight.shape as [number, number];
  const k = format === "int8_convrot" ? cols : cols * 2;
  const scaleOk =
    (scale.shape.length === 1 && scale.shape[0] === n) ||
    (scale.shape.length === 2 && scale.shape[0] === n && scale.shape[1] === 1);
  if (!scaleOk) {
    throw new TpError(
      "E_FORMAT",
      `scale shape mismatch: ${format} weight [${weight.shape}] needs weight_scale [${n}, 1] or [${n}], got [${scale.shape}]`,
      ctx(name),
    );
  }
  let s: Float32Array;
  if (scale.dtype === "F32") s = toF32({ bytes: scale.bytes, dtype: "f32" }, n, name);
  else if (scale.dtype === "BF16" || scale.dtype === "F16") {
    s = toF32({ bytes: scale.bytes, dtype: scale.dtype === "BF16" ? "bf16" : "f16" }, n, name);
  } else {
    throw new TpError("E_FORMAT", `weight_scale must be a float tensor, got ${scale.dtype}`, ctx(name));
  }
  const w: ConvRotWeight = { format, shape: [n, k], groupSize, data: weight.bytes, scale: s };
  checkConvRotWeight(w, name);
  return w;
}

/**
 * The {@link ConvRotWeight} view of a `@tp/tensor` `Weight` (as `@tp/formats`' `loadWeight` returns
 * it): the same code bytes (not copied), the per-row scales, and `Weight.rotationGroup` as the group.
 * @param w an `int8_convrot` or `int4_convrot` weight [N, K] with row scales
 * @throws TpError E_FORMAT when the weight is not ConvRot or has no row scales; E_SHAPE / E_ARG from
 *   {@link checkConvRotWeight} — naming the tensor.
 */
export function convRotFromWeight(w: Weight): ConvRotWeight {
  if ((w.format !== "int8_convrot" && w.format !== "int4_convrot") || w.scale?.kind !== "row") {
    throw new TpError(
      "E_FORMAT",
      `expected an int8_convrot or int4_convrot weight with row scales, got ${w.format}`,
      ctx(w.name),
    );
  }
  const out: ConvRotWeight = {
    format: w.format,
    shape: w.shape,
    groupSize: w.rotationGroup ?? CONVROT_GROUP_SIZE,
    data: w.data,
    scale: w.scale.values,
  };
  checkConvRotWeight(out, w.name);
  return out;
}
