/**
 * Bit-exact number formats for the PTX simulator: f32 ↔ bits, f16 / bf16 / fp8 (e4m3, e5m2) encode
 * (round to nearest even, with PTX's overflow and NaN rules) and decode, and integer rounding modes.
 *
 * Source: NVIDIA PTX ISA 8.x §9.7.9.21 (cvt: rounding modifiers, saturation, `.satfinite`, the
 * canonical NaN 0x7fff of f16 / bf16 results), IEEE 754-2008 binary16; OCP 8-bit floating point
 * (OFP8) 1.0 for e4m3 (no infinities, max 448, NaN S.1111.111) and e5m2 (IEEE-like, max 57344).
 */

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const f64 = new Float64Array(1);
const u64 = new BigUint64Array(f64.buffer);

/** The bits of an f32 value. */
export function floatBits(x: number): number {
  f32[0] = x;
  return u32[0] as number;
}

/** The f32 value of 32 bits. */
export function bitsFloat(b: number): number {
  u32[0] = b >>> 0;
  return f32[0] as number;
}

/** The bits of an f64 value (bigint). */
export function doubleBits(x: number): bigint {
  f64[0] = x;
  return u64[0] as bigint;
}

/** The f64 value of 64 bits. */
export function bitsDouble(b: bigint | number): number {
  u64[0] = BigInt.asUintN(64, BigInt(b));
  return f64[0] as number;
}

/** Round half to even to an integer (x finite). */
export function roundEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** Round an integer value (an exact integer in f64) to `bits` of mantissa relative to 2^e, half even. */
function encodeMinifloat(
  x: number,
  expBits: number,
  manBits: number,
  bias: number,
  maxFinite: number,
  overflow: number,
  nan: number,
): number {
  const signBit = 1 << (expBits + manBits);
  if (Number.isNaN(x)) return nan;
  const sign = x < 0 || Object.is(x, -0) ? signBit : 0;
  const a = Math.abs(x);
  const minNormalExp = 1 - bias;
  // Quantum at a's binade (subnormals share the smallest normal binade's quantum).
  let e = a === 0 ? minNormalExp : Math.max(minNormalExp, Math.floor(Math.log2(a)));
  if (a !== 0 && 2 ** e > a) e--; // guard log2 rounding
  if (a !== 0 && 2 ** (e + 1) <= a) e++;
  e = Math.max(minNormalExp, e);
  const quantum = 2 ** (e - manBits);
  const q = roundEven(a / quantum) * quantum;
  if (q > maxFinite) return sign | overflow;
  if (q === 0) return sign;
  let qe = Math.floor(Math.log2(q));
  if (2 ** qe > q) qe--;
  if (2 ** (qe + 1) <= q) qe++;
  if (qe < minNormalExp) return sign | Math.round(q / 2 ** (minNormalExp - manBits)); // subnormal
  const mant = Math.round((q / 2 ** qe - 1) * 2 ** manBits);
  return sign | ((qe + bias) << manBits) | mant;
}

/** f32/f64 value → f16 bits, round to nearest even; overflow → ±inf; NaN → 0x7fff (PTX's canonical). */
export function toHalf(x: number): number {
  if (x === Number.POSITIVE_INFINITY) return 0x7c00;
  if (x === Number.NEGATIVE_INFINITY) return 0xfc00;
  return encodeMinifloat(x, 5, 10, 15, 65504, 0x7c00, 0x7fff);
}

/** f16 bits → value. */
export function fromHalf(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m === 0 ? s * Number.POSITIVE_INFINITY : Number.NaN;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** f32 value → bf16 bits, round to nearest even; NaN → 0x7fff. */
export function toBfloat(x: number): number {
  if (Number.isNaN(x)) return 0x7fff;
  const b = floatBits(Math.fround(x));
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bf16 bits → value. */
export function fromBfloat(h: number): number {
  return bitsFloat((h & 0xffff) << 16);
}

/**
 * f32 value → e4m3 (OCP E4M3FN) bits, round to nearest even. PTX only has `.satfinite` for fp8
 * results: beyond ±448 → ±448, NaN → 0x7f.
 */
export function toE4m3(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const c = Math.max(-448, Math.min(448, x));
  return encodeMinifloat(c, 4, 3, 7, 448, 0x7e, 0x7f);
}

/** e4m3 bits → value (S.1111.111 is NaN). */
export function fromE4m3(b: number): number {
  const s = b & 0x80 ? -1 : 1;
  const e = (b >> 3) & 0xf;
  const m = b & 7;
  if (e === 15 && m === 7) return Number.NaN;
  if (e === 0) return s * m * 2 ** -9;
  return s * (1 + m / 8) * 2 ** (e - 7);
}

/** f32 value → e5m2 bits with `.satfinite`: beyond ±57344 → ±57344, NaN → 0x7f. */
export function toE5m2(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const c = Math.max(-57344, Math.min(57344, x));
  return encodeMinifloat(c, 5, 2, 15, 57344, 0x7b, 0x7f);
}

/** e5m2 bits → value. */
export function fromE5m2(b: number): number {
  return fromHalf((b & 0xff) << 8);
}

/** x rounded to an integral value by a PTX integer rounding modifier: .rni nearest-even, .rzi toward 0, .rmi down, .rpi up. */
function roundByMode(x: number, mode: "rni" | "rzi" | "rmi" | "rpi"): number {
  return mode === "rni"
    ? roundEven(x)
    : mode === "rzi"
      ? Math.trunc(x)
      : mode === "rmi"
        ? Math.floor(x)
        : Math.ceil(x);
}

/** PTX float → integer conversion: round by `mode`, saturate to [lo, hi], NaN → 0. */
export function floatToInt(x: number, mode: "rni" | "rzi" | "rmi" | "rpi", lo: number, hi: number): number {
  if (Number.isNaN(x)) return 0;
  const r = roundByMode(x, mode);
  return Math.max(lo, Math.min(hi, r));
}

/** Round a float to an integral float value by `mode` (cvt.rni.f32.f32 and friends). */
export function roundIntegral(x: number, mode: "rni" | "rzi" | "rmi" | "rpi"): number {
  if (!Number.isFinite(x)) return x;
  const r = roundByMode(x, mode);
  return r === 0 && (x < 0 || Object.is(x, -0)) ? -0 : r;
}

/** Flush an f32 subnormal to a zero of the same sign (`.ftz`). */
export function flushSubnormal(x: number): number {
  return x !== 0 && Math.abs(x) < 2 ** -126 ? (x < 0 ? -0 : 0) : x;
}

/** PTX min.f32: NaN only when both are NaN (else the other operand); −0 below +0. */
export function fmin(a: number, b: number): number {
  if (Number.isNaN(a)) return b;
  if (Number.isNaN(b)) return a;
  if (a === b) return a === 0 && (Object.is(a, -0) || Object.is(b, -0)) ? -0 : a;
  return Math.min(a, b);
}

/** PTX max.f32: NaN only when both are NaN; +0 above −0. */
export function fmax(a: number, b: number): number {
  if (Number.isNaN(a)) return b;
  if (Number.isNaN(b)) return a;
  if (a === b) return a === 0 && (Object.is(a, 0) || Object.is(b, 0)) ? 0 : a;
  return Math.max(a, b);
}
