/**
 * Find the first tensor of a checkpoint that holds NaN or ±∞, on its mapped bytes: the reason a
 * pipeline's stage check (E_NUMERIC) gives after a failure. Run once, only after a failure — it reads
 * every byte of the floating-point tensors (and the scale fields of GGUF blocks).
 *
 * What is looked at: IEEE floats (F64, F32, F16, BF16: exponent bits all ones), fp8 E4M3 (S.1111.111 is
 * its only NaN; it has no ∞) and E5M2 (exponent all ones), and in GGUF block types the f16 / f32 scale
 * fields of each block (ggml-common.h's block layouts). Integer tensors cannot hold NaN; block types
 * without a listed layout are skipped.
 */
import { isTpError } from "@tp/tensor";
import { openCheckpoint } from "./layouts/detect.ts";
import type { TensorSource } from "./tensors.ts";

/** A non-finite value found in a checkpoint. */
export interface NonFiniteWeight {
  readonly file: string;
  readonly tensor: string;
  /** Element index (for block types: the block's first element). */
  readonly index: number;
  /** The value: NaN, Infinity or -Infinity. */
  readonly value: number;
}

/** Byte offsets of the f16 scale fields of a GGUF block type, with its block bytes and elements. */
const GGUF_BLOCK_SCALES: Readonly<
  Record<string, { bytes: number; elems: number; f16: number[]; f32?: number[] }>
> = {
  Q4_0: { bytes: 18, elems: 32, f16: [0] },
  Q4_1: { bytes: 20, elems: 32, f16: [0, 2] },
  Q5_0: { bytes: 22, elems: 32, f16: [0] },
  Q5_1: { bytes: 24, elems: 32, f16: [0, 2] },
  Q8_0: { bytes: 34, elems: 32, f16: [0] },
  Q8_1: { bytes: 36, elems: 32, f16: [0, 2] },
  Q2_K: { bytes: 84, elems: 256, f16: [80, 82] },
  Q3_K: { bytes: 110, elems: 256, f16: [108] },
  Q4_K: { bytes: 144, elems: 256, f16: [0, 2] },
  Q5_K: { bytes: 176, elems: 256, f16: [0, 2] },
  Q6_K: { bytes: 210, elems: 256, f16: [208] },
  Q8_K: { bytes: 292, elems: 256, f16: [], f32: [0] },
  IQ4_NL: { bytes: 18, elems: 32, f16: [0] },
  IQ4_XS: { bytes: 136, elems: 256, f16: [0] },
};

/** f16 bits → NaN / ±∞, or null when finite. */
function f16NonFinite(h: number): number | null {
  if ((h & 0x7c00) !== 0x7c00) return null;
  return (h & 0x3ff) !== 0 ? Number.NaN : h & 0x8000 ? -Infinity : Infinity;
}

/** f32 bits → NaN / ±∞, or null when finite. */
function f32NonFinite(u: number): number | null {
  if ((u & 0x7f800000) !== 0x7f800000) return null;
  return (u & 0x7fffff) !== 0 ? Number.NaN : u >>> 31 ? -Infinity : Infinity;
}

/**
 * The first non-finite element of a tensor's bytes, or null (see the module comment for the types
 * looked at; others give null).
 * @param dtype the file's type name (`"BF16"`, `"F8_E4M3"`, `"Q4_K"`; any case)
 */
export function firstNonFinite(bytes: Uint8Array, dtype: string): { index: number; value: number } | null {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const type = dtype.toUpperCase();
  switch (type) {
    case "F32":
      for (let i = 0; i + 4 <= bytes.length; i += 4) {
        const v = f32NonFinite(dv.getUint32(i, true));
        if (v !== null) return { index: i / 4, value: v };
      }
      return null;
    case "F64":
      for (let i = 0; i + 8 <= bytes.length; i += 8) {
        const hi = dv.getUint32(i + 4, true);
        if ((hi & 0x7ff00000) === 0x7ff00000) {
          const nan = (hi & 0xfffff) !== 0 || dv.getUint32(i, true) !== 0;
          return { index: i / 8, value: nan ? Number.NaN : hi >>> 31 ? -Infinity : Infinity };
        }
      }
      return null;
    case "F16":
      for (let i = 0; i + 2 <= bytes.length; i += 2) {
        const v = f16NonFinite(dv.getUint16(i, true));
        if (v !== null) return { index: i / 2, value: v };
      }
      return null;
    case "BF16":
      for (let i = 0; i + 2 <= bytes.length; i += 2) {
        const v = f32NonFinite(dv.getUint16(i, true) << 16);
        if (v !== null) return { index: i / 2, value: v };
      }
      return null;
    case "F8_E4M3":
    case "F8_E4M3FN":
      for (let i = 0; i < bytes.length; i++)
        if (((bytes[i] as number) & 0x7f) === 0x7f) return { index: i, value: Number.NaN };
      return null;
    case "F8_E5M2":
      for (let i = 0; i < bytes.length; i++) {
        const b = bytes[i] as number;
        if ((b & 0x7c) === 0x7c)
          return { index: i, value: b & 3 ? Number.NaN : b & 0x80 ? -Infinity : Infinity };
      }
      return null;
  }
  const block = GGUF_BLOCK_SCALES[type];
  if (block === undefined) return null;
  for (let at = 0, k = 0; at + block.bytes <= bytes.length; at += block.bytes, k++) {
    for (const o of block.f16) {
      const v = f16NonFinite(dv.getUint16(at + o, true));
      if (v !== null) return { index: k * block.elems, value: v };
    }
    for (const o of block.f32 ?? []) {
      const v = f32NonFinite(dv.getUint32(at + o, true));
      if (v !== null) return { index: k * block.elems, value: v };
    }
  }
  return null;
}

/**
 * The first tensor (in file order) of `source` holding NaN or ±∞, or null when every value looked at is
 * finite (see the module comment for what is looked at). Reads the mapped bytes of every float tensor.
 * @throws TpError E_IO when a mapping fails
 */
export function findNonFiniteWeight(source: TensorSource): NonFiniteWeight | null {
  for (const t of source.tensors) {
    if (t.byteLength === 0) continue;
    let bytes: Uint8Array;
    try {
      bytes = source.data(t.name);
    } catch (e) {
      if (isTpError(e, "E_UNSUPPORTED")) continue; // over 4 GiB in one view: not scanned
      throw e;
    }
    const found = firstNonFinite(bytes, t.dtype);
    if (found !== null) return { file: t.file, tensor: t.name, ...found };
  }
  return null;
}

/**
 * Why a stage gave NaN / ∞, in one clause for an E_NUMERIC message: the first of `files` (in order)
 * holding a non-finite weight — "the DiT file F holds NaN in tensor T (element i)" — or undefined when
 * none does or none can be read (the scan's own errors are swallowed: it only explains another error).
 * @param files the checkpoints that fed the stage, most likely first ({ what: "DiT", path })
 * @param nameFile false when the error already names the (single) file: "the model file holds …"
 */
export function explainNonFiniteWeights(
  files: readonly { readonly what: string; readonly path: string | undefined }[],
  nameFile = true,
): string | undefined {
  for (const { what, path } of files) {
    if (path === undefined) continue;
    let found: NonFiniteWeight | null = null;
    try {
      const src = openCheckpoint(path);
      try {
        found = findNonFiniteWeight(src);
      } finally {
        src.close();
      }
    } catch {
      continue;
    }
    if (found !== null) {
      return `the ${what} file${nameFile ? ` ${found.file}` : ""} holds ${found.value} in tensor ${found.tensor} (element ${found.index}): the checkpoint is damaged`;
    }
  }
  return undefined;
}
