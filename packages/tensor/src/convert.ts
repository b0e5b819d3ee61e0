/**
 * Bit-exact conversions between f32 and the narrow float types: IEEE binary16 (f16), bfloat16 (bf16),
 * and the OCP 8-bit floats E4M3 ("fn": finite, no infinities) and E5M2.
 *
 * Functions named `...Bits` take and return bit patterns as unsigned integers (f32 as a u32 number), so
 * NaN payloads survive; the plain ones take and return JS numbers (f32 values). Rounding is to nearest,
 * ties to even, everywhere. The C kernels in native/cpu (tp_cpu_cast) implement the same rules and are
 * tested against these functions bit for bit.
 *
 * NaN rules (they follow x86 hardware where there is any):
 * - f16 → f32: payload kept, quiet bit set (VCVTPH2PS).       f32 → f16: sign | 0x7E00 | mant >> 13 (VCVTPS2PH).
 * - bf16 → f32: `bits << 16` exactly.                        f32 → bf16: sign | upper payload | 0x0040.
 * - f32 → fp8: S.1111.111 (e4m3fn) / S.11111.11 (e5m2).
 *
 * fp8 overflow: by default as torch (`x.to(torch.float8_e4m3fn)`: |x| past the last rounding boundary
 * becomes NaN; e5m2 becomes ±inf; c10/util/Float8_e4m3fn.h, Float8_e5m2.h). With `saturate` as CUDA's
 * `__NV_SATFINITE` (cuda_fp8.h) and ComfyUI's clamp-then-cast: ±max finite, also for ±inf.
 *
 * Sources: IEEE 754-2019 §3.6 (binary16); OCP 8-bit Floating Point Specification (OFP8) rev 1.0, §5
 * (E4M3/E5M2 encodings); bfloat16: Google's TPU definition as used by torch `c10/util/BFloat16.h`.
 */

import type { DTypeName } from "./dtype.ts";
import { TpError } from "./errors.ts";

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

/** The f32 bit pattern (u32) of a number, after rounding it to f32. */
export function f32ToBits(x: number): number {
  scratchF32[0] = x;
  return scratchU32[0] as number;
}

/** The f32 value of a bit pattern (u32). NaN payloads are not preserved by JS numbers. */
export function bitsToF32(bits: number): number {
  scratchU32[0] = bits;
  return scratchF32[0] as number;
}

/** Layout of a small float: exponent bits, mantissa bits, bias, and its special values. */
interface MiniFloat {
  readonly expBits: number;
  readonly mantBits: number;
  readonly bias: number;
  /** True when the all-ones exponent encodes inf/NaN (IEEE style); false for e4m3fn. */
  readonly ieeeSpecials: boolean;
  /** Magnitude code of the largest finite value. */
  readonly maxFinite: number;
  /** Magnitude code written for NaN (quiet). */
  readonly nan: number;
  /** Magnitude code of infinity, or -1 when the format has none. */
  readonly inf: number;
}

const F16: MiniFloat = {
  expBits: 5,
  mantBits: 10,
  bias: 15,
  ieeeSpecials: true,
  maxFinite: 0x7bff,
  nan: 0x7e00,
  inf: 0x7c00,
};
const E4M3FN: MiniFloat = {
  expBits: 4,
  mantBits: 3,
  bias: 7,
  ieeeSpecials: false,
  maxFinite: 0x7e,
  nan: 0x7f,
  inf: -1,
};
const E5M2: MiniFloat = {
  expBits: 5,
  mantBits: 2,
  bias: 15,
  ieeeSpecials: true,
  maxFinite: 0x7b,
  nan: 0x7f,
  inf: 0x7c,
};

/**
 * Decode a small float's bit pattern to the f32 bit pattern of the same value (every f16, e4m3 and
 * e5m2 value is exact in f32). NaNs map to sign | quiet NaN | payload shifted into place.
 */
function miniToF32Bits(code: number, f: MiniFloat): number {
  const width = 1 + f.expBits + f.mantBits;
  const sign = ((code >>> (width - 1)) & 1) << 31;
  const e = (code >>> f.mantBits) & ((1 << f.expBits) - 1);
  const m = code & ((1 << f.mantBits) - 1);
  const eMax = (1 << f.expBits) - 1;
  const mantShift = 23 - f.mantBits;
  if (f.ieeeSpecials && e === eMax) {
    return (m === 0 ? sign | 0x7f800000 : sign | 0x7fc00000 | (m << mantShift)) >>> 0;
  }
  if (!f.ieeeSpecials && e === eMax && m === (1 << f.mantBits) - 1) {
    return (sign | 0x7fc00000) >>> 0; // e4m3fn: S.1111.111 is the only NaN
  }
  if (e === 0) {
    if (m === 0) return sign >>> 0;
    // Subnormal: value = m * 2^(1 - bias - mantBits); normalise so the leading 1 becomes implicit.
    let mm = m;
    let exp = 1 - f.bias; // unbiased exponent of the implicit-one position
    while ((mm & (1 << f.mantBits)) === 0) {
      mm <<= 1;
      exp -= 1;
    }
    mm &= (1 << f.mantBits) - 1;
    return (sign | ((exp + 127) << 23) | (mm << mantShift)) >>> 0;
  }
  return (sign | ((e - f.bias + 127) << 23) | (m << mantShift)) >>> 0;
}

/**
 * Round the magnitude of a finite, non-NaN f32 (bits `a`, sign already removed) to a small float's
 * magnitude code, to nearest, ties to even. The result may exceed `maxFinite` (overflow); the caller
 * decides what overflow becomes.
 */
function roundMagnitude(a: number, f: MiniFloat): number {
  const expField = a >>> 23;
  if (expField === 0) return 0; // f32 subnormals (< 2^-126) are below half the smallest target subnormal
  const ef = expField - 127; // unbiased exponent
  const sig = (a & 0x7fffff) | 0x800000; // 24-bit significand, value sig * 2^(ef - 23)
  const minNormalExp = 1 - f.bias;
  let code: number;
  let shift: number;
  if (ef >= minNormalExp) {
    // Normal in the target: keep mantBits of the 23 fraction bits.
    shift = 23 - f.mantBits;
    code = ((ef + f.bias) << f.mantBits) | ((sig & 0x7fffff) >>> shift);
  } else {
    // Subnormal in the target: count in units of the smallest subnormal 2^(minNormalExp - mantBits).
    shift = 23 - f.mantBits + (minNormalExp - ef);
    if (shift > 24) return 0; // below half the smallest subnormal
    code = sig >>> shift;
  }
  const rem = sig & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  if (rem > half || (rem === half && (code & 1) === 1)) code += 1; // carries into the exponent
  return code;
}

/** f32 bits → small-float bits with the overflow policy of the format. */
function f32BitsToMini(bits: number, f: MiniFloat, saturate: boolean): number {
  const width = 1 + f.expBits + f.mantBits;
  const sign = ((bits >>> 31) & 1) << (width - 1);
  const a = bits & 0x7fffffff;
  if (a > 0x7f800000) {
    // NaN: keep the upper payload bits that fit (all ones for fp8, as torch does).
    const payload = f === F16 ? (a & 0x7fffff) >>> 13 : 0;
    return sign | f.nan | payload;
  }
  const overflow = saturate ? f.maxFinite : f.inf >= 0 ? f.inf : f.nan;
  if (a === 0x7f800000) return sign | overflow;
  const code = roundMagnitude(a, f);
  return sign | (code > f.maxFinite ? overflow : code);
}

/** IEEE binary16 bits → f32 bits (exact). NaN: payload kept, quiet bit set. */
export function f16BitsToF32Bits(h: number): number {
  return miniToF32Bits(h & 0xffff, F16);
}

/** f32 bits → IEEE binary16 bits, round to nearest even; overflow → ±inf; NaN → sign|0x7E00|mant>>13. */
export function f32BitsToF16Bits(bits: number): number {
  return f32BitsToMini(bits >>> 0, F16, false);
}

/** bfloat16 bits → f32 bits: `h << 16` (exact, NaNs included). */
export function bf16BitsToF32Bits(h: number): number {
  return ((h & 0xffff) << 16) >>> 0;
}

/**
 * f32 bits → bfloat16 bits, round to nearest even on the dropped 16 bits (krea2.md §1.5); values that
 * round past the largest finite become ±inf; NaN → sign | upper payload | quiet bit 0x0040.
 */
export function f32BitsToBf16Bits(bits: number): number {
  const u = bits >>> 0;
  if ((u & 0x7fffffff) > 0x7f800000) return (u >>> 16) | 0x0040;
  return (u + 0x7fff + ((u >>> 16) & 1)) >>> 16;
}

/** OCP E4M3 ("fn": no infinities) bits → f32 bits (exact). 0x7F/0xFF → NaN. */
export function f8e4m3fnBitsToF32Bits(b: number): number {
  return miniToF32Bits(b & 0xff, E4M3FN);
}

/**
 * f32 bits → OCP E4M3FN bits, round to nearest even. Overflow (|x| > 464 after rounding, or ±inf):
 * NaN (torch's rule) unless `saturate`, then ±448. NaN → S.1111.111.
 */
export function f32BitsToF8e4m3fnBits(bits: number, saturate = false): number {
  return f32BitsToMini(bits >>> 0, E4M3FN, saturate);
}

/** OCP E5M2 bits → f32 bits (exact). */
export function f8e5m2BitsToF32Bits(b: number): number {
  return miniToF32Bits(b & 0xff, E5M2);
}

/**
 * f32 bits → OCP E5M2 bits, round to nearest even. Overflow (|x| ≥ 61440, or ±inf): ±inf unless
 * `saturate`, then ±57344. NaN → S.11111.11.
 */
export function f32BitsToF8e5m2Bits(bits: number, saturate = false): number {
  return f32BitsToMini(bits >>> 0, E5M2, saturate);
}

/** f16 bits → number. */
export function f16ToF32(h: number): number {
  return bitsToF32(f16BitsToF32Bits(h));
}
/** number (rounded to f32 first) → f16 bits. */
export function f32ToF16(x: number): number {
  return f32BitsToF16Bits(f32ToBits(x));
}
/** bf16 bits → number. */
export function bf16ToF32(h: number): number {
  return bitsToF32(bf16BitsToF32Bits(h));
}
/** number (rounded to f32 first) → bf16 bits. */
export function f32ToBf16(x: number): number {
  return f32BitsToBf16Bits(f32ToBits(x));
}
/** e4m3fn bits → number. */
export function f8e4m3fnToF32(b: number): number {
  return bitsToF32(f8e4m3fnBitsToF32Bits(b));
}
/** number (rounded to f32 first) → e4m3fn bits; see {@link f32BitsToF8e4m3fnBits}. */
export function f32ToF8e4m3fn(x: number, saturate = false): number {
  return f32BitsToF8e4m3fnBits(f32ToBits(x), saturate);
}
/** e5m2 bits → number. */
export function f8e5m2ToF32(b: number): number {
  return bitsToF32(f8e5m2BitsToF32Bits(b));
}
/** number (rounded to f32 first) → e5m2 bits; see {@link f32BitsToF8e5m2Bits}. */
export function f32ToF8e5m2(x: number, saturate = false): number {
  return f32BitsToF8e5m2Bits(f32ToBits(x), saturate);
}

/** The float dtypes these conversions cover. */
export type NarrowFloat = "f16" | "bf16" | "f8_e4m3fn" | "f8_e5m2";

const DECODE_TABLES = new Map<NarrowFloat, Float32Array>();

/**
 * A lookup table of every bit pattern of a narrow float decoded to f32 (65,536 entries for f16/bf16,
 * 256 for fp8). Built on first use and kept; exact (llm.md §2.1).
 */
export function decodeTable(dtype: NarrowFloat): Float32Array {
  narrow(dtype);
  let table = DECODE_TABLES.get(dtype);
  if (!table) {
    const n = dtype === "f16" || dtype === "bf16" ? 65536 : 256;
    const decode = BITS_TO_F32[dtype];
    const bits = new Uint32Array(n);
    for (let i = 0; i < n; i++) bits[i] = decode(i);
    table = new Float32Array(bits.buffer);
    DECODE_TABLES.set(dtype, table);
  }
  return table;
}

const BITS_TO_F32: Record<NarrowFloat, (b: number) => number> = {
  f16: f16BitsToF32Bits,
  bf16: bf16BitsToF32Bits,
  f8_e4m3fn: f8e4m3fnBitsToF32Bits,
  f8_e5m2: f8e5m2BitsToF32Bits,
};

function kindOf(v: unknown): string {
  return ArrayBuffer.isView(v) ? v.constructor.name : v === null ? "null" : typeof v;
}

function narrow(dtype: DTypeName): NarrowFloat {
  if (dtype === "f16" || dtype === "bf16" || dtype === "f8_e4m3fn" || dtype === "f8_e5m2") return dtype;
  throw new TpError(
    "E_UNSUPPORTED",
    `no f32 conversion for dtype ${dtype}; expected f16, bf16, f8_e4m3fn or f8_e5m2`,
  );
}

/**
 * Decode `n` little-endian elements of a narrow float dtype from raw bytes into a new Float32Array.
 * @param bytes  at least n * bytesPerElement bytes (any alignment)
 * @param dtype  f16 | bf16 | f8_e4m3fn | f8_e5m2
 * @throws TpError E_UNSUPPORTED for another dtype; E_ARG when `bytes` is not a Uint8Array, is too short,
 *   or `n` is not a non-negative integer.
 */
export function decodeToF32(bytes: Uint8Array, dtype: DTypeName, n?: number): Float32Array {
  if (!(bytes instanceof Uint8Array)) {
    throw new TpError(
      "E_ARG",
      `decodeToF32: bytes must be a Uint8Array of raw ${dtype} data, got ${kindOf(bytes)}`,
    );
  }
  if (n !== undefined && (!Number.isSafeInteger(n) || n < 0)) {
    throw new TpError("E_ARG", `decodeToF32: n must be a non-negative integer, got ${n}`);
  }
  const d = narrow(dtype);
  const width = d === "f16" || d === "bf16" ? 2 : 1;
  const count = n ?? Math.floor(bytes.byteLength / width);
  if (count * width > bytes.byteLength) {
    throw new TpError(
      "E_ARG",
      `decodeToF32: ${count} ${dtype} elements need ${count * width} bytes, got ${bytes.byteLength}`,
    );
  }
  // Copy bit patterns (not JS numbers), so NaN payloads survive.
  const table = new Uint32Array(decodeTable(d).buffer);
  const result = new Float32Array(count);
  const out = new Uint32Array(result.buffer);
  if (width === 1) {
    for (let i = 0; i < count; i++) out[i] = table[bytes[i] as number] as number;
  } else {
    for (let i = 0; i < count; i++) {
      out[i] = table[(bytes[2 * i] as number) | ((bytes[2 * i + 1] as number) << 8)] as number;
    }
  }
  return result;
}

/**
 * Encode f32 values into a narrow float dtype as little-endian bytes.
 * @param values f32 values (Float32Array keeps NaN payloads; use its bits)
 * @param dtype  f16 | bf16 | f8_e4m3fn | f8_e5m2
 * @param options.saturate fp8 only: clamp overflow to ±max finite instead of NaN/inf
 * @throws TpError E_UNSUPPORTED for another dtype; E_ARG when `values` is not a Float32Array.
 */
export function encodeFromF32(
  values: Float32Array,
  dtype: DTypeName,
  options: { saturate?: boolean } = {},
): Uint8Array {
  if (!(values instanceof Float32Array)) {
    throw new TpError("E_ARG", `encodeFromF32: values must be a Float32Array, got ${kindOf(values)}`);
  }
  const d = narrow(dtype);
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const saturate = options?.saturate ?? false;
  if (d === "f16" || d === "bf16") {
    const out = new Uint16Array(values.length);
    const enc = d === "f16" ? f32BitsToF16Bits : f32BitsToBf16Bits;
    for (let i = 0; i < bits.length; i++) out[i] = enc(bits[i] as number);
    return new Uint8Array(out.buffer);
  }
  const out = new Uint8Array(values.length);
  const enc = d === "f8_e4m3fn" ? f32BitsToF8e4m3fnBits : f32BitsToF8e5m2Bits;
  for (let i = 0; i < bits.length; i++) out[i] = enc(bits[i] as number, saturate);
  return out;
}
