/**
 * Dequantization of GGUF tensor data (ggml block types) to f32, element by element from the layouts of
 * ../shared/spec/llm.md §2.1–2.4, with ggml's float order of operations so the results equal ggml's
 * `dequantize_row_*` bit for bit (ggml/src/ggml-quants.c, built without FMA contraction as on x86-64):
 * - 32-element blocks: Q4_0 / Q5_0 / Q8_0 / Q8_1 `f32(q · d)`; Q4_1 / Q5_1 `f32(f32(n · d) + m)`;
 *   IQ4_NL `f32(d · K4[n])`;
 * - k-quants: Q2_K / Q4_K / Q5_K `f32(f32(f32(d · sc) · q) − f32(dmin · mn))`; Q3_K `f32(f32(d · S3) · q)`;
 *   Q6_K `f32(f32(d · scale) · q)`; Q8_K `f32(d · q)` with an f32 `d`; IQ4_XS `f32(f32(d · (ls − 32)) · K4[n])`.
 * `d`, `dmin`, `m` are binary16 unless stated; multi-byte fields are little-endian.
 *
 * Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
 * IQ4_NL, IQ4_XS. Every other type is an `E_UNSUPPORTED` TpError naming it.
 */

import { decodeTable, TpError, type WeightFormat, weightFormatInfo } from "@tp/tensor";
import { ctx } from "./input.ts";

/** The IQ4_NL / IQ4_XS non-linear 4-bit codebook `K4` (ggml `kvalues_iq4nl`; llm.md §2.2). */
export const KVALUES_IQ4NL: readonly number[] = [
  -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/** Formats {@link dequantizeGgml} decodes. */
export const GGML_DEQUANT_FORMATS: readonly WeightFormat[] = [
  "f32",
  "f16",
  "bf16",
  "q4_0",
  "q4_1",
  "q5_0",
  "q5_1",
  "q8_0",
  "q8_1",
  "q2_k",
  "q3_k",
  "q4_k",
  "q5_k",
  "q6_k",
  "q8_k",
  "iq4_nl",
  "iq4_xs",
];

const f32 = Math.fround;

/** Decoder of one block: bytes at `o` → `out[p .. p + blockElems)`. */
type BlockDecoder = (b: Uint8Array, o: number, out: Float32Array, p: number) => void;

let F16: Float32Array | undefined;
/** binary16 at byte offset o (little-endian) → f32 value (exact). */
function h(b: Uint8Array, o: number): number {
  F16 ??= decodeTable("f16");
  return F16[(b[o] as number) | ((b[o + 1] as number) << 8)] as number;
}

/** Low nibble for elements 0..15 of a 32-element block, high nibble for 16..31 (llm.md §2.2). */
function nib32(qs: Uint8Array, o: number, e: number): number {
  return e < 16 ? (qs[o + e] as number) & 15 : (qs[o + e - 16] as number) >> 4;
}

/** `K6(k)`: the 6-bit scale and min of sub-block k of Q4_K / Q5_K (ggml `get_scale_min_k4`). */
export function scaleMinK4(b: Uint8Array, s: number, k: number): [number, number] {
  const S = (i: number) => b[s + i] as number;
  if (k < 4) return [S(k) & 63, S(k + 4) & 63];
  return [(S(k + 4) & 15) | ((S(k - 4) >> 6) << 4), (S(k + 4) >> 4) | ((S(k) >> 6) << 4)];
}

/** `S3(t)`: the signed 6-bit scale t (−32..31) of Q3_K (llm.md §2.3). */
export function scaleQ3K(b: Uint8Array, s: number, t: number): number {
  const low = t < 8 ? (b[s + t] as number) & 15 : (b[s + t - 8] as number) >> 4;
  const high = ((b[s + 8 + (t & 3)] as number) >> (2 * (t >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

const DECODERS: Partial<Record<WeightFormat, BlockDecoder>> = {
  // Q4_0 (18 B): d · qs[16]
  q4_0: (b, o, out, p) => {
    const d = h(b, o);
    for (let e = 0; e < 32; e++) out[p + e] = (nib32(b, o + 2, e) - 8) * d;
  },
  // Q4_1 (20 B): d · m · qs[16]
  q4_1: (b, o, out, p) => {
    const d = h(b, o);
    const m = h(b, o + 2);
    for (let e = 0; e < 32; e++) out[p + e] = f32(nib32(b, o + 4, e) * d) + m;
  },
  // Q5_0 (22 B): d · qh u32 · qs[16]; bit e of qh is bit 4 of element e
  q5_0: (b, o, out, p) => {
    const d = h(b, o);
    const qh = u32(b, o + 2);
    for (let e = 0; e < 32; e++) out[p + e] = ((nib32(b, o + 6, e) | (((qh >>> e) & 1) << 4)) - 16) * d;
  },
  // Q5_1 (24 B): d · m · qh u32 · qs[16]
  q5_1: (b, o, out, p) => {
    const d = h(b, o);
    const m = h(b, o + 2);
    const qh = u32(b, o + 4);
    for (let e = 0; e < 32; e++) out[p + e] = f32((nib32(b, o + 8, e) | (((qh >>> e) & 1) << 4)) * d) + m;
  },
  // Q8_0 (34 B): d · qs[32] i8
  q8_0: (b, o, out, p) => {
    const d = h(b, o);
    for (let e = 0; e < 32; e++) out[p + e] = i8(b, o + 2 + e) * d;
  },
  // Q8_1 (36 B): d · s · qs[32] i8 (s = d·Σq is for dot products only)
  q8_1: (b, o, out, p) => {
    const d = h(b, o);
    for (let e = 0; e < 32; e++) out[p + e] = i8(b, o + 4 + e) * d;
  },
  // IQ4_NL (18 B): d · qs[16]; value d · K4[n]
  iq4_nl: (b, o, out, p) => {
    const d = h(b, o);
    for (let e = 0; e < 32; e++) out[p + e] = d * (KVALUES_IQ4NL[nib32(b, o + 2, e)] as number);
  },
  // Q2_K (84 B): scales[16] · qs[64] · d · dmin
  q2_k: (b, o, out, p) => {
    const d = h(b, o + 80);
    const dmin = h(b, o + 82);
    for (let e = 0; e < 256; e++) {
      const half = e >> 7;
      const j = (e & 127) >> 5;
      const q = ((b[o + 16 + 32 * half + (e & 31)] as number) >> (2 * j)) & 3;
      const s = b[o + (e >> 4)] as number;
      out[p + e] = f32(f32(d * (s & 15)) * q) - f32(dmin * (s >> 4));
    }
  },
  // Q3_K (110 B): hmask[32] · qs[64] · scales[12] · d
  q3_k: (b, o, out, p) => {
    const d = h(b, o + 108);
    for (let e = 0; e < 256; e++) {
      const half = e >> 7;
      const j = (e & 127) >> 5;
      const l = e & 31;
      const q = ((b[o + 32 + 32 * half + l] as number) >> (2 * j)) & 3;
      const hb = ((b[o + l] as number) >> (e >> 5)) & 1;
      out[p + e] = f32(d * scaleQ3K(b, o + 96, e >> 4)) * (q - (hb ? 0 : 4));
    }
  },
  // Q4_K (144 B): d · dmin · scales[12] · qs[128]
  q4_k: (b, o, out, p) => {
    const d = h(b, o);
    const dmin = h(b, o + 2);
    for (let e = 0; e < 256; e++) {
      const c = e >> 6;
      const byte = b[o + 16 + 32 * c + (e & 31)] as number;
      const n = (e & 63) < 32 ? byte & 15 : byte >> 4;
      const [sc, mn] = scaleMinK4(b, o + 4, e >> 5);
      out[p + e] = f32(f32(d * sc) * n) - f32(dmin * mn);
    }
  },
  // Q5_K (176 B): d · dmin · scales[12] · qh[32] · qs[128]
  q5_k: (b, o, out, p) => {
    const d = h(b, o);
    const dmin = h(b, o + 2);
    for (let e = 0; e < 256; e++) {
      const c = e >> 6;
      const byte = b[o + 48 + 32 * c + (e & 31)] as number;
      const n =
        ((e & 63) < 32 ? byte & 15 : byte >> 4) + 16 * (((b[o + 16 + (e & 31)] as number) >> (e >> 5)) & 1);
      const [sc, mn] = scaleMinK4(b, o + 4, e >> 5);
      out[p + e] = f32(f32(d * sc) * n) - f32(dmin * mn);
    }
  },
  // Q6_K (210 B): ql[128] · qh[64] · scales[16] i8 · d
  q6_k: (b, o, out, p) => {
    const d = h(b, o + 208);
    for (let e = 0; e < 256; e++) {
      const half = e >> 7;
      const j = (e & 127) >> 5;
      const l = e & 31;
      const lo = b[o + 64 * half + l + 32 * (j & 1)] as number;
      const lo4 = j < 2 ? lo & 15 : lo >> 4;
      const hi = ((b[o + 128 + 32 * half + l] as number) >> (2 * j)) & 3;
      out[p + e] = f32(d * i8(b, o + 192 + (e >> 4))) * ((lo4 | (hi << 4)) - 32);
    }
  },
  // Q8_K (292 B): d f32 · qs[256] i8 · bsums[16] i16
  q8_k: (b, o, out, p) => {
    const d = new DataView(b.buffer, b.byteOffset + o, 4).getFloat32(0, true);
    for (let e = 0; e < 256; e++) out[p + e] = d * i8(b, o + 4 + e);
  },
  // IQ4_XS (136 B): d · scales_h u16 · scales_l[4] · qs[128]
  iq4_xs: (b, o, out, p) => {
    const d = h(b, o);
    const scalesH = (b[o + 2] as number) | ((b[o + 3] as number) << 8);
    for (let ib = 0; ib < 8; ib++) {
      const ls =
        (((b[o + 4 + (ib >> 1)] as number) >> (4 * (ib & 1))) & 15) | (((scalesH >> (2 * ib)) & 3) << 4);
      const dl = f32(d * (ls - 32));
      for (let t = 0; t < 32; t++) {
        const byte = b[o + 8 + 16 * ib + (t & 15)] as number;
        out[p + 32 * ib + t] = dl * (KVALUES_IQ4NL[t < 16 ? byte & 15 : byte >> 4] as number);
      }
    }
  },
};

function u32(b: Uint8Array, o: number): number {
  return (
    ((b[o] as number) |
      ((b[o + 1] as number) << 8) |
      ((b[o + 2] as number) << 16) |
      ((b[o + 3] as number) << 24)) >>>
    0
  );
}
function i8(b: Uint8Array, o: number): number {
  return ((b[o] as number) << 24) >> 24;
}

/**
 * Dequantize `count` elements of GGUF tensor data to f32.
 * @param format a weight format name (`q4_k`, `f16`, ...) — see {@link GGML_DEQUANT_FORMATS}
 * @param bytes  the tensor data: whole blocks, `count / blockElems · blockBytes` bytes at least
 * @param count  number of elements (a multiple of the block size: 32 or 256)
 * @param name   tensor name, for errors
 * @returns Float32Array [count]
 * @throws TpError E_UNSUPPORTED for another type (naming it); E_SHAPE when `count` is not whole
 *   blocks or `bytes` is too short — naming the tensor.
 * Source: ggml/src/ggml-quants.c `dequantize_row_*`; llm.md §2.1–2.4.
 */
export function dequantizeGgml(
  format: WeightFormat,
  bytes: Uint8Array,
  count: number,
  name?: string,
): Float32Array {
  if (!GGML_DEQUANT_FORMATS.includes(format)) {
    const gguf = weightFormatInfo(format).ggufName ?? format;
    throw new TpError(
      "E_UNSUPPORTED",
      `dequantizing ${gguf} is not supported; supported: ${GGML_DEQUANT_FORMATS.map((f) => weightFormatInfo(f).ggufName).join(", ")}`,
      ctx(name),
    );
  }
  const info = weightFormatInfo(format);
  if (!Number.isSafeInteger(count) || count < 0 || count % info.blockElems !== 0) {
    throw new TpError(
      "E_SHAPE",
      `${count} elements are not whole ${info.ggufName} blocks of ${info.blockElems}`,
      ctx(name),
    );
  }
  const need = (count / info.blockElems) * info.blockBytes;
  if (bytes.byteLength < need) {
    throw new TpError(
      "E_SHAPE",
      `${count} ${info.ggufName} elements need ${need} bytes, got ${bytes.byteLength}`,
      ctx(name),
    );
  }
  const out = new Float32Array(count);
  if (format === "f32") {
    new Uint8Array(out.buffer).set(bytes.subarray(0, need));
    return out;
  }
  if (format === "f16" || format === "bf16") {
    const table = decodeTable(format);
    for (let i = 0; i < count; i++)
      out[i] = table[(bytes[2 * i] as number) | ((bytes[2 * i + 1] as number) << 8)] as number;
    return out;
  }
  const decode = DECODERS[format] as BlockDecoder;
  for (let o = 0, p = 0; p < count; o += info.blockBytes, p += info.blockElems) decode(bytes, o, out, p);
  return out;
}
