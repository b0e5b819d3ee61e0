/**
 * `Weight`: a view on a memory-mapped checkpoint — format, logical shape [N, K] (output features ×
 * input features, `y = x · Wᵀ`), the byte range in its file, and the scales its format needs. A weight
 * is not copied into the JS heap; a backend reads `data` (or maps `source` itself) when it uploads or
 * streams it.
 *
 * Sources: ../shared/ARCHITECTURE.md "Weights and memory"; krea2.md §1.4 (scale tensors), §1.7–1.8.
 */

import { isWeightFormat, type WeightFormat, weightBytes, weightFormatInfo } from "./dtype.ts";
import { TpError } from "./errors.ts";
import { formatShape } from "./shape.ts";

/**
 * Scales of a quantized weight:
 * - `tensor`: one f32 for the whole tensor (fp8 scaled: `w = f32(fp8) · value`);
 * - `row`: one f32 per output row, N values (INT8 / INT4 ConvRot, of the rotated weight).
 * GGUF block types carry their scales inside the blocks and have none here.
 */
export type WeightScale =
  | { readonly kind: "tensor"; readonly value: number }
  | { readonly kind: "row"; readonly values: Float32Array };

/** Where a weight's bytes live in a file. */
export interface WeightSource {
  /** Path of the checkpoint file. */
  readonly file: string;
  /** Absolute byte offset of the first byte in the file. */
  readonly byteOffset: number;
  /** Byte length (equals `weightBytes(format, shape)`). */
  readonly byteLength: number;
}

/** Arguments of the {@link Weight} constructor. */
export interface WeightInit {
  /** Tensor name in the checkpoint (`blocks.0.attn.wq.weight`). */
  readonly name: string;
  /** Storage format. */
  readonly format: WeightFormat;
  /** Logical shape [N, K] in elements (K = input features, the contiguous dimension). */
  readonly shape: readonly [number, number];
  /** The raw bytes (a view on the mapping, or any Uint8Array), exactly `weightBytes(format, shape)` long. */
  readonly data: Uint8Array;
  /** Where the bytes come from, when they come from a file. */
  readonly source?: WeightSource;
  /** Scales required by fp8-scaled and ConvRot formats. */
  readonly scale?: WeightScale;
  /**
   * ConvRot only: columns per Hadamard rotation group (`convrot_groupsize` of the `.comfy_quant`
   * marker), a power of 4; default 256 (krea2.md §1.6). Ignored for other formats.
   */
  readonly rotationGroup?: number;
}

/** True for 4, 16, 64, 256, … (the Hadamard block is 4 × 4, krea2.md §1.6). */
function isPowerOf4(g: number): boolean {
  if (!Number.isSafeInteger(g) || g < 4) return false;
  let x = g;
  while (x % 4 === 0) x /= 4;
  return x === 1;
}

/**
 * A checkpoint weight of shape [N, K] in any {@link WeightFormat}.
 * @throws TpError E_FORMAT when the byte length, shape or scales do not fit the format, naming the
 *   tensor and file.
 */
export class Weight {
  readonly name: string;
  readonly format: WeightFormat;
  readonly shape: readonly [number, number];
  readonly data: Uint8Array;
  readonly source: WeightSource | undefined;
  readonly scale: WeightScale | undefined;
  /** ConvRot rotation group (columns), or undefined for other formats. */
  readonly rotationGroup: number | undefined;

  constructor(init: WeightInit) {
    if (typeof init !== "object" || init === null) throw new TpError("E_ARG", "Weight needs an init object");
    const where = {
      tensor: String(init.name),
      ...(init.source ? { file: init.source.file, offset: init.source.byteOffset } : {}),
    };
    if (!isWeightFormat(String(init.format))) {
      throw new TpError("E_FORMAT", `unknown weight format '${init.format}'`, where);
    }
    const info = weightFormatInfo(init.format);
    if (!(init.data instanceof Uint8Array)) {
      throw new TpError("E_FORMAT", "weight data must be a Uint8Array of its raw bytes", where);
    }
    const src = init.source;
    if (
      src &&
      !(Number.isSafeInteger(src.byteOffset) && src.byteOffset >= 0 && typeof src.file === "string")
    ) {
      throw new TpError("E_FORMAT", `bad source byte range (offset ${src.byteOffset})`, where);
    }
    const sc = init.scale;
    if (
      sc !== undefined &&
      !(sc?.kind === "tensor" && typeof sc.value === "number" && Number.isFinite(sc.value)) &&
      !(sc?.kind === "row" && sc.values instanceof Float32Array)
    ) {
      throw new TpError(
        "E_FORMAT",
        "scale must be {kind: 'tensor', value: finite number} or {kind: 'row', values: Float32Array}",
        where,
      );
    }
    if (!Array.isArray(init.shape)) throw new TpError("E_FORMAT", "weight shape must be [N, K]", where);
    const [n, k] = init.shape;
    if (init.shape.length !== 2 || !Number.isSafeInteger(n) || !Number.isSafeInteger(k) || n < 0 || k < 0) {
      throw new TpError("E_FORMAT", `weight shape ${formatShape(init.shape)} is not [N, K]`, where);
    }
    let expected: number;
    try {
      expected = weightBytes(init.format, init.shape);
    } catch (e) {
      throw new TpError(
        "E_FORMAT",
        `weight ${formatShape(init.shape)} cannot be stored as ${init.format}: ${(e as Error).message}`,
        where,
      );
    }
    if (init.data.byteLength !== expected) {
      throw new TpError(
        "E_FORMAT",
        `${init.format} weight ${formatShape(init.shape)} needs ${expected} bytes, got ${init.data.byteLength}`,
        where,
      );
    }
    if (init.source && init.source.byteLength !== expected) {
      throw new TpError(
        "E_FORMAT",
        `source byte range of ${init.source.byteLength} bytes, expected ${expected}`,
        where,
      );
    }
    const scale = init.scale;
    let rotationGroup: number | undefined;
    if (info.family === "convrot") {
      rotationGroup = init.rotationGroup ?? (info.rotationGroup as number);
      if (scale?.kind !== "row" || scale.values.length !== n) {
        throw new TpError(
          "E_FORMAT",
          `${init.format} weight needs ${n} per-row f32 scales (${info.scaleTensor})`,
          where,
        );
      }
      if (!isPowerOf4(rotationGroup)) {
        throw new TpError(
          "E_FORMAT",
          `${init.format} rotation group ${rotationGroup} is not a power of 4`,
          where,
        );
      }
      if (k % rotationGroup !== 0) {
        throw new TpError(
          "E_FORMAT",
          `${init.format} K = ${k} is not a multiple of the rotation group ${rotationGroup}`,
          where,
        );
      }
    } else if (scale?.kind === "row" && scale.values.length !== n) {
      throw new TpError("E_FORMAT", `row scales: ${scale.values.length} values for ${n} rows`, where);
    } else if (scale && info.family === "ggml") {
      throw new TpError(
        "E_FORMAT",
        `${init.format} blocks carry their own scales; an extra scale is not allowed`,
        where,
      );
    }
    this.name = init.name;
    this.format = init.format;
    this.shape = [n, k];
    this.data = init.data;
    this.source = init.source;
    this.scale = scale;
    this.rotationGroup = rotationGroup;
  }

  /** Output features (rows). */
  get n(): number {
    return this.shape[0];
  }
  /** Input features (columns). */
  get k(): number {
    return this.shape[1];
  }
  /** Bytes of the stored weight (without scales). */
  get byteLength(): number {
    return this.data.byteLength;
  }

  toString(): string {
    return `Weight(${this.name} ${this.format} ${formatShape(this.shape)})`;
  }
}
