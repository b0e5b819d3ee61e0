/**
 * Tests of libtp_cpu.so through ffi.ts: every conversion of tp_cpu_cast at every ISA level this CPU
 * has (scalar, AVX2, AVX-512), with 1 and 2 threads, bit for bit against references that do not
 * share code with the C library or with @tp/tensor's convert.ts:
 *   f16:  Bun's Float16Array and Math.f16round (IEEE 754 binary16, round to nearest even)
 *   bf16: the nearest of the two neighbouring bf16 values, computed in f64, ties to an even mantissa
 *   fp8:  a value table written from the OCP OFP8 formulas, and a brute-force nearest-value search
 *   NaNs: the rules written in native/include/tp.h (tp_cpu_cast)
 * plus argument checks, context lifetime, alloc, and the build script's missing-compiler error.
 *
 * Needs the library: run `bun run build` in packages/backend-cpu first.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { TpError, type TpErrorCode } from "@tp/tensor";
import {
  CAST_DTYPE_BYTES,
  CAST_SATURATE,
  type CastDtype,
  CPU_FEATURES,
  CPU_ISA,
  type CpuIsa,
  check,
  cpuFeatureNames,
  loadCpuLibrary,
  type NativeContext,
  type NativeWeight,
  type NativeWeightFormat,
} from "./ffi.ts";
import { repackBytes } from "./ops/native.ts";

// ---- setup ---------------------------------------------------------------------------------------

function loadOrExplain() {
  try {
    return loadCpuLibrary();
  } catch (e) {
    throw new Error(
      `native.test.ts needs libtp_cpu.so: run 'bun run build' in packages/backend-cpu first. ${(e as Error).message}`,
    );
  }
}
const lib = loadOrExplain();

const ISAS: CpuIsa[] = ["scalar", "avx2", "avx512"];
const THREADS = [1, 2];
/** The best level this CPU supports: a context asked for the highest gets it. */
const BEST_ISA: CpuIsa = (() => {
  const ctx = lib.createContext(1, "avx512");
  const isa = ctx.isa;
  ctx.destroy();
  return isa;
})();
const AVAILABLE_ISAS = ISAS.filter((isa) => CPU_ISA[isa] <= CPU_ISA[BEST_ISA]);
const REQUIRED_FEATURES: Record<CpuIsa, string> = {
  scalar: "nothing",
  avx2: "avx2 + fma + f16c",
  avx512: "avx512f + avx512bw + avx512vl + f16c",
};

const contexts = new Map<string, NativeContext>();
/** A context per (isa, threads), created on first use and destroyed after all tests. */
function ctxFor(isa: CpuIsa, threads: number): NativeContext {
  const key = `${isa}/${threads}`;
  let ctx = contexts.get(key);
  if (!ctx) {
    ctx = lib.createContext(threads, isa);
    contexts.set(key, ctx);
  }
  return ctx;
}
afterAll(() => {
  for (const ctx of contexts.values()) ctx.destroy();
});

// ---- bit helpers ---------------------------------------------------------------------------------

type Bits = Uint8Array | Uint16Array | Uint32Array;

const scratch = new ArrayBuffer(4);
const scratchF32 = new Float32Array(scratch);
const scratchU32 = new Uint32Array(scratch);
/** f32 value of bits u (NaN payloads are lost: use only for non-NaN). */
function f32Value(u: number): number {
  scratchU32[0] = u;
  return scratchF32[0] as number;
}
/** f32 bits of x, which must be an f32 value (not NaN). */
function f32Bits(x: number): number {
  scratchF32[0] = x;
  return scratchU32[0] as number;
}
function isNanF32(u: number): boolean {
  return (u & 0x7fffffff) >>> 0 > 0x7f800000;
}
const hex = (v: number) => v.toString(16).padStart(2, "0");

/** Array of n elements holding the bits of dtype. */
function bitsArray(dtype: CastDtype, n: number): Bits {
  const bytes = CAST_DTYPE_BYTES[dtype];
  return bytes === 4 ? new Uint32Array(n) : bytes === 2 ? new Uint16Array(n) : new Uint8Array(n);
}

/** Convert all of src with ctx; returns the destination bits. */
function convert(ctx: NativeContext, src: Bits, from: CastDtype, to: CastDtype, flags = 0): Bits {
  const n = src.byteLength / CAST_DTYPE_BYTES[from];
  const dst = bitsArray(to, n);
  ctx.cast(src, from, dst, to, n, flags);
  return dst;
}

/** null when actual equals expected; else a description of the first difference, for expect(). */
function mismatch(label: string, input: ArrayLike<number>, actual: Bits, expected: ArrayLike<number>) {
  if (actual.length !== expected.length)
    return `${label}: ${actual.length} elements, expected ${expected.length}`;
  let first = -1;
  let count = 0;
  for (let i = 0; i < actual.length; i++) {
    if (actual[i] !== expected[i]) {
      if (first < 0) first = i;
      count++;
    }
  }
  if (first < 0) return null;
  return (
    `${label}: ${count} of ${actual.length} differ; first at ${first}: input 0x${hex(input[first] as number)} ` +
    `gave 0x${hex(actual[first] as number)}, expected 0x${hex(expected[first] as number)}`
  );
}

function sameBytes(a: Bits, b: Bits): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(b.buffer, b.byteOffset, b.byteLength),
  );
}

/** mulberry32: a small seeded PRNG (public domain, Tommy Ettinger), uint32 per call. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

// ---- inputs ------------------------------------------------------------------------------------

/** Every 16-bit pattern, every 8-bit pattern. */
const ALL_U16 = Uint16Array.from({ length: 65536 }, (_, i) => i);
const ALL_U8 = Uint8Array.from({ length: 256 }, (_, i) => i);

/** NaN patterns of f32: each single payload bit, both signs, plus a few classics. */
const F32_NANS: number[] = [
  0x7fc00000, 0xffc00000, 0x7fffffff, 0xffffffff, 0x7fbfffff, 0x7f800001, 0x7fc00001,
];
for (let k = 0; k < 23; k++) F32_NANS.push((0x7f800000 | (1 << k)) >>> 0, (0xff800000 | (1 << k)) >>> 0);

const RANDOM_N = 1 << 20;
/**
 * RANDOM_N f32 bit patterns (seed 1): the NaN list first, then alternately raw random bits (most
 * of them far out of f16/fp8 range) and random values with exponents 2^-31..2^23, where f16, bf16
 * and fp8 all round, overflow and go subnormal.
 */
const RANDOM_F32 = (() => {
  const next = mulberry32(1);
  const out = new Uint32Array(RANDOM_N);
  out.set(F32_NANS);
  for (let i = F32_NANS.length; i < RANDOM_N; i++) {
    const r = next();
    out[i] = i & 1 ? r : ((r & 0x807fffff) | ((96 + (next() % 55)) << 23)) >>> 0;
  }
  return out;
})();

// ---- references: f16 ---------------------------------------------------------------------------

/** f16 bits -> f32 bits: Float16Array -> Float32Array; NaN: payload << 13 with the quiet bit (tp.h). */
function f16ToF32Ref(h: Uint16Array): Uint32Array {
  const out = new Uint32Array(new Float32Array(new Float16Array(h.buffer, h.byteOffset, h.length)).buffer);
  for (let i = 0; i < h.length; i++) {
    const v = h[i] as number;
    if ((v & 0x7c00) === 0x7c00 && (v & 0x3ff) !== 0)
      out[i] = (((v & 0x8000) << 16) | 0x7fc00000 | ((v & 0x3ff) << 13)) >>> 0;
  }
  return out;
}

/** f32 bits -> f16 bits with Math.f16round; NaN: sign | 0x7E00 | mantissa >> 13 (tp.h). */
function f32ToF16Ref(u: Uint32Array): Uint16Array {
  const x = new Float32Array(u.buffer, u.byteOffset, u.length);
  const h = new Float16Array(u.length);
  for (let i = 0; i < u.length; i++) h[i] = Math.f16round(x[i] as number); // exact: already an f16 value
  const out = new Uint16Array(h.buffer);
  for (let i = 0; i < u.length; i++) {
    const v = u[i] as number;
    if (isNanF32(v)) out[i] = ((v >>> 16) & 0x8000) | 0x7e00 | ((v & 0x7fffff) >>> 13);
  }
  return out;
}

/** Value of f16 bits h (not NaN). */
function f16Value(h: number): number {
  return new Float16Array(Uint16Array.of(h).buffer)[0] as number;
}

/**
 * Every midpoint between adjacent positive finite f16 values (and between 65504 and 65536, where
 * an unbounded exponent would put the next value), with the f32 just below and just above it, and
 * the negatives of all: [input f32 bits, expected f16 bits]. Ties go to the even pattern.
 */
const F16_MIDPOINTS = (() => {
  const input: number[] = [];
  const expected: number[] = [];
  for (let h = 0; h <= 0x7bff; h++) {
    const lo = f16Value(h);
    const hi = h === 0x7bff ? 65536 : f16Value(h + 1);
    const mid = f32Bits((lo + hi) / 2); // exact: 12 significant bits
    const even = h % 2 === 0 ? h : h + 1; // h + 1 = 0x7C00 (inf) for h = 0x7BFF
    for (const sign of [0, 0x80000000]) {
      const hs = sign ? 0x8000 : 0;
      input.push((mid | sign) >>> 0, ((mid - 1) | sign) >>> 0, ((mid + 1) | sign) >>> 0);
      expected.push(even | hs, h | hs, (h + 1) | hs);
    }
  }
  return { input: Uint32Array.from(input), expected: Uint16Array.from(expected) };
})();

/** Hand-picked f32 -> f16 cases: [value, f16 bits]. */
const F16_SPECIALS: [number, number][] = [
  [0, 0x0000],
  [-0, 0x8000],
  [1, 0x3c00],
  [65504, 0x7bff], // max finite
  [65519.99609375, 0x7bff], // the f32 just below the overflow threshold
  [65520, 0x7c00], // halfway to 2^16: ties to even overflows to inf
  [-65520, 0xfc00],
  [1e10, 0x7c00],
  [3.4028234663852886e38, 0x7c00], // f32 max
  [Infinity, 0x7c00],
  [-Infinity, 0xfc00],
  [2 ** -14, 0x0400], // min normal
  [2 ** -14 - 2 ** -25, 0x0400], // halfway between max subnormal 0x03FF and min normal: even is 0x0400
  [2 ** -24, 0x0001], // min subnormal
  [2 ** -25, 0x0000], // half of it: ties to even (zero)
  [-(2 ** -25), 0x8000],
  [3 * 2 ** -25, 0x0002], // 1.5 units: ties to even (2)
  [5 * 2 ** -25, 0x0002], // 2.5 units: ties to even (2)
  [1e-45, 0x0000], // f32 subnormal
  [-1e-45, 0x8000],
];

// ---- references: bf16 --------------------------------------------------------------------------

/**
 * f32 bits -> bf16 bits by brute force: the nearest of the two bf16 values around x, distances in
 * f64, ties to the even pattern; past the largest finite bf16 the upper neighbour is 2^128 (inf).
 * NaN: sign | upper payload | 0x0040 (tp.h).
 */
function f32ToBf16Ref(u: number): number {
  if (isNanF32(u)) return (u >>> 16) | 0x0040;
  const sign = (u >>> 16) & 0x8000;
  const a = (u & 0x7fffffff) >>> 0;
  const lo = a >>> 16;
  if ((a & 0xffff) === 0) return sign | lo; // exact, inf included
  const hi = lo + 1;
  const x = f32Value(a);
  const loValue = f32Value(lo << 16);
  const hiValue = hi === 0x7f80 ? 2 ** 128 : f32Value(hi << 16);
  const dLo = x - loValue;
  const dHi = hiValue - x;
  const pick = dLo < dHi ? lo : dHi < dLo ? hi : lo % 2 === 0 ? lo : hi;
  return sign | pick;
}

/** Every bf16 tie (x halfway between two finite bf16 values) and the f32 either side, both signs. */
const BF16_TIES = (() => {
  const out: number[] = [];
  for (let b = 0; b < 0x7f80; b++) {
    const tie = ((b << 16) | 0x8000) >>> 0;
    for (const sign of [0, 0x80000000])
      out.push((tie | sign) >>> 0, ((tie - 1) | sign) >>> 0, ((tie + 1) | sign) >>> 0);
  }
  return Uint32Array.from(out);
})();

// ---- references: fp8 (OCP OFP8 spec) -----------------------------------------------------------

interface Fp8Format {
  dtype: "f8_e4m3fn" | "f8_e5m2";
  ebits: number;
  mbits: number;
  bias: number;
  /** Largest finite magnitude code. */
  maxCode: number;
  /** What overflow gives without TP_CAST_SATURATE (tp.h): NaN for e4m3fn, inf for e5m2. */
  overflowCode: number;
}
const E4M3FN: Fp8Format = {
  dtype: "f8_e4m3fn",
  ebits: 4,
  mbits: 3,
  bias: 7,
  maxCode: 0x7e,
  overflowCode: 0x7f,
};
const E5M2: Fp8Format = { dtype: "f8_e5m2", ebits: 5, mbits: 2, bias: 15, maxCode: 0x7b, overflowCode: 0x7c };
const FP8_FORMATS = [E4M3FN, E5M2];

/**
 * Value of an fp8 code from the OCP OFP8 spec (rev 1.0, §5.1): normal (-1)^S 2^(E-bias) (1 + M/2^m),
 * subnormal (-1)^S 2^(1-bias) (M/2^m); e4m3fn has no infinities and only S.1111.111 is NaN;
 * e5m2 is IEEE-like (E = 31: inf if M = 0, else NaN).
 */
function ocpValue(f: Fp8Format, code: number): number {
  const s = code & 0x80 ? -1 : 1;
  const e = (code >> f.mbits) & ((1 << f.ebits) - 1);
  const m = code & ((1 << f.mbits) - 1);
  const eMax = (1 << f.ebits) - 1;
  if (f === E4M3FN && e === eMax && m === (1 << f.mbits) - 1) return Number.NaN;
  if (f === E5M2 && e === eMax) return m === 0 ? s * Infinity : Number.NaN;
  if (e === 0) return s * 2 ** (1 - f.bias) * (m / 2 ** f.mbits);
  return s * 2 ** (e - f.bias) * (1 + m / 2 ** f.mbits);
}

/**
 * fp8 code -> expected f32 bits: the OCP value. NaN (tp.h): e5m2 keeps its payload with the quiet bit
 * set; e4m3fn's only NaN S.1111.111 becomes sign | 0x7FC00000.
 */
function fp8ToF32Ref(f: Fp8Format, code: number): number {
  const v = ocpValue(f, code);
  if (!Number.isNaN(v)) return f32Bits(v);
  const payload = f === E5M2 ? (code & 0x3) << 21 : 0;
  return (((code & 0x80) << 24) | 0x7fc00000 | payload) >>> 0;
}

/** Positive finite values by code 0..maxCode, then the value one ulp past the max (where overflow rounds). */
function fp8Ladder(f: Fp8Format): number[] {
  const values = Array.from({ length: f.maxCode + 1 }, (_, c) => ocpValue(f, c));
  const max = values[f.maxCode] as number;
  const maxExp = (f.maxCode >> f.mbits) - f.bias;
  values.push(max + 2 ** (maxExp - f.mbits)); // e4m3fn 480, e5m2 65536
  return values;
}
const LADDERS = new Map(FP8_FORMATS.map((f) => [f, fp8Ladder(f)]));

/**
 * f32 bits -> fp8 code by brute force: scan every finite magnitude and the one-past-max value,
 * take the nearest (ties to the even code); landing on one-past-max, or beyond it, or inf, is
 * overflow: max finite with saturate, else NaN (e4m3fn) / inf (e5m2). NaN -> S.1111111.
 */
function f32ToFp8Ref(f: Fp8Format, u: number, saturate: boolean): number {
  const sign = (u >>> 24) & 0x80;
  if (isNanF32(u)) return sign | 0x7f;
  const ladder = LADDERS.get(f) as number[];
  const past = f.maxCode + 1;
  const a = Math.abs(f32Value(u));
  let best = past;
  if (a <= (ladder[past] as number)) {
    let bestDistance = Infinity;
    for (let c = 0; c <= past; c++) {
      const d = Math.abs(a - (ladder[c] as number));
      if (d < bestDistance || (d === bestDistance && c % 2 === 0)) {
        best = c;
        bestDistance = d;
      }
    }
  }
  if (best === past) return sign | (saturate ? f.maxCode : f.overflowCode);
  return sign | best;
}

/** Boundary inputs: every fp8 value, every midpoint and the f32 either side, big and tiny values, both signs. */
function fp8Boundaries(f: Fp8Format): Uint32Array {
  const ladder = LADDERS.get(f) as number[];
  const bits: number[] = [];
  for (let c = 0; c <= f.maxCode; c++) {
    const mid = f32Bits(((ladder[c] as number) + (ladder[c + 1] as number)) / 2); // exact in f32
    bits.push(f32Bits(ladder[c] as number), mid, mid - 1, mid + 1);
  }
  const extra = [464, 465, 480, 57344, 61439, 61440, 61441, 65536, 1e6, 3.4028234663852886e38, Infinity];
  for (const x of extra) bits.push(f32Bits(x));
  bits.push(1, 0x00800000, 0x7f7fffff); // f32 min subnormal, min normal, max
  return Uint32Array.from([...bits, ...bits.map((b) => (b | 0x80000000) >>> 0)]);
}

/** Inputs for f32 -> fp8: the boundaries of both formats and the first 2^17 random patterns. */
const FP8_INPUTS = Uint32Array.from([
  ...fp8Boundaries(E4M3FN),
  ...fp8Boundaries(E5M2),
  ...RANDOM_F32.subarray(0, 1 << 17),
]);

// ---- references, computed once -------------------------------------------------------------------

const REF = {
  f16ToF32: f16ToF32Ref(ALL_U16),
  randomToF16: f32ToF16Ref(RANDOM_F32),
  randomToBf16: Uint16Array.from(RANDOM_F32, (u) => f32ToBf16Ref(u)),
  tiesToBf16: Uint16Array.from(BF16_TIES, (u) => f32ToBf16Ref(u)),
  fp8ToF32: new Map(FP8_FORMATS.map((f) => [f, Uint32Array.from(ALL_U8, (c) => fp8ToF32Ref(f, c))])),
  f32ToFp8: new Map(
    FP8_FORMATS.map((f) => [
      f,
      {
        plain: Uint8Array.from(FP8_INPUTS, (u) => f32ToFp8Ref(f, u, false)),
        saturate: Uint8Array.from(FP8_INPUTS, (u) => f32ToFp8Ref(f, u, true)),
      },
    ]),
  ),
};

// ---- the references themselves -------------------------------------------------------------------

describe("references (checked before they judge the library)", () => {
  test("f16 midpoint table agrees with Math.f16round", () => {
    const viaF16round = f32ToF16Ref(F16_MIDPOINTS.input);
    expect(mismatch("midpoints", F16_MIDPOINTS.input, viaF16round, F16_MIDPOINTS.expected)).toBeNull();
  });

  test("f16 special cases agree with Math.f16round", () => {
    const input = Uint32Array.from(F16_SPECIALS, ([x]) => f32Bits(x));
    expect(
      mismatch(
        "specials",
        input,
        f32ToF16Ref(input),
        F16_SPECIALS.map(([, h]) => h),
      ),
    ).toBeNull();
  });

  test("OCP tables: hand-checked constants", () => {
    expect(ocpValue(E4M3FN, 0x7e)).toBe(448);
    expect(ocpValue(E4M3FN, 0x08)).toBe(2 ** -6);
    expect(ocpValue(E4M3FN, 0x01)).toBe(2 ** -9);
    expect(ocpValue(E4M3FN, 0x7f)).toBeNaN();
    expect(ocpValue(E4M3FN, 0xff)).toBeNaN();
    expect(ocpValue(E4M3FN, 0x78)).toBe(256); // 1.000 x 2^8: no infinity at E = 15
    expect(ocpValue(E5M2, 0x7b)).toBe(57344);
    expect(ocpValue(E5M2, 0x7c)).toBe(Infinity);
    expect(ocpValue(E5M2, 0xfc)).toBe(-Infinity);
    expect(ocpValue(E5M2, 0x01)).toBe(2 ** -16);
    expect(ocpValue(E5M2, 0x7d)).toBeNaN();
    expect(fp8Ladder(E4M3FN).at(-1)).toBe(480);
    expect(fp8Ladder(E5M2).at(-1)).toBe(65536);
  });

  test("brute-force fp8 encoder: hand-checked boundaries", () => {
    const enc = (f: Fp8Format, x: number, sat = false) => f32ToFp8Ref(f, f32Bits(x), sat);
    expect(enc(E4M3FN, 448)).toBe(0x7e);
    expect(enc(E4M3FN, 464)).toBe(0x7e); // tie between 448 (0x7E, even) and 480: stays finite
    expect(enc(E4M3FN, 465)).toBe(0x7f); // overflow -> NaN
    expect(enc(E4M3FN, 465, true)).toBe(0x7e);
    expect(enc(E4M3FN, 480)).toBe(0x7f);
    expect(enc(E4M3FN, -Infinity)).toBe(0xff);
    expect(enc(E4M3FN, -Infinity, true)).toBe(0xfe);
    expect(enc(E4M3FN, 2 ** -10)).toBe(0x00); // half the smallest subnormal: tie to zero
    expect(enc(E4M3FN, 3 * 2 ** -10)).toBe(0x02); // 1.5 units: tie to 2
    expect(enc(E5M2, 57344)).toBe(0x7b);
    expect(enc(E5M2, 61439)).toBe(0x7b);
    expect(enc(E5M2, 61440)).toBe(0x7c); // tie between 57344 (0x7B, odd) and 65536: overflows to inf
    expect(enc(E5M2, 61440, true)).toBe(0x7b);
    expect(enc(E5M2, Infinity)).toBe(0x7c);
    expect(enc(E5M2, Infinity, true)).toBe(0x7b);
    expect(enc(E5M2, 2 ** -17)).toBe(0x00);
    expect(enc(E5M2, 3 * 2 ** -17)).toBe(0x02);
    expect(enc(E5M2, -0)).toBe(0x80);
  });

  test("brute-force bf16 encoder: hand-checked cases", () => {
    expect(f32ToBf16Ref(0x3f808000)).toBe(0x3f80); // tie, even stays
    expect(f32ToBf16Ref(0x3f818000)).toBe(0x3f82); // tie, odd rounds up
    expect(f32ToBf16Ref(0x7f7fffff)).toBe(0x7f80); // f32 max rounds to inf
    expect(f32ToBf16Ref(0x00008000)).toBe(0x0000); // subnormal tie to even
    expect(f32ToBf16Ref(0xff800001)).toBe(0xffc0); // NaN with low payload only
  });
});

// ---- every ISA level x thread count ------------------------------------------------------------

for (const isa of ISAS) {
  const available = AVAILABLE_ISAS.includes(isa);
  const reason = available
    ? ""
    : ` [skipped: this CPU lacks ${REQUIRED_FEATURES[isa]}; it has ${cpuFeatureNames(lib.features()).join(", ") || "none of the tracked features"}]`;
  const suite = available ? describe : describe.skip;

  for (const threads of THREADS) {
    suite(`cast at ISA ${isa}, ${threads} thread${threads > 1 ? "s" : ""}${reason}`, () => {
      const ctx = () => ctxFor(isa, threads);

      test("the context runs at the requested level", () => {
        expect(ctx().isa).toBe(isa);
        expect(ctx().threads).toBe(threads);
      });

      test("f16 -> f32: all 65,536 patterns (Float16Array; NaN payload kept, quiet bit set)", () => {
        const out = convert(ctx(), ALL_U16, "f16", "f32");
        expect(mismatch("f16->f32", ALL_U16, out, REF.f16ToF32)).toBeNull();
      });

      test("f32 -> f16: every finite f16 round-trips", () => {
        const finite = ALL_U16.filter((h) => (h & 0x7c00) !== 0x7c00 || (h & 0x3ff) === 0); // inf too
        const asF32 = new Uint32Array(new Float32Array(new Float16Array(finite.buffer)).buffer);
        expect(mismatch("round trip", asF32, convert(ctx(), asF32, "f32", "f16"), finite)).toBeNull();
      });

      test("f32 -> f16: every midpoint ties to even; one f32 ulp either side rounds to the nearer", () => {
        const out = convert(ctx(), F16_MIDPOINTS.input, "f32", "f16");
        expect(mismatch("midpoints", F16_MIDPOINTS.input, out, F16_MIDPOINTS.expected)).toBeNull();
      });

      test("f32 -> f16: overflow to inf, infinities, subnormals, signed zeros", () => {
        const input = Uint32Array.from(F16_SPECIALS, ([x]) => f32Bits(x));
        const out = convert(ctx(), input, "f32", "f16");
        expect(
          mismatch(
            "specials",
            input,
            out,
            F16_SPECIALS.map(([, h]) => h),
          ),
        ).toBeNull();
      });

      test(`f32 -> f16: ${RANDOM_N} random patterns vs Math.f16round (NaN: sign | 0x7E00 | m >> 13)`, () => {
        const out = convert(ctx(), RANDOM_F32, "f32", "f16");
        expect(mismatch("random f32->f16", RANDOM_F32, out, REF.randomToF16)).toBeNull();
      });

      test("bf16 -> f32: all 65,536 patterns are bits << 16", () => {
        const out = convert(ctx(), ALL_U16, "bf16", "f32");
        expect(
          mismatch(
            "bf16->f32",
            ALL_U16,
            out,
            Uint32Array.from(ALL_U16, (b) => b * 65536),
          ),
        ).toBeNull();
      });

      test(`f32 -> bf16: ${RANDOM_N} random patterns and every tie vs brute force`, () => {
        const random = convert(ctx(), RANDOM_F32, "f32", "bf16");
        expect(mismatch("random f32->bf16", RANDOM_F32, random, REF.randomToBf16)).toBeNull();
        const ties = convert(ctx(), BF16_TIES, "f32", "bf16");
        expect(mismatch("ties f32->bf16", BF16_TIES, ties, REF.tiesToBf16)).toBeNull();
      });

      for (const f of FP8_FORMATS) {
        test(`${f.dtype} -> f32: all 256 patterns vs the OCP table`, () => {
          const out = convert(ctx(), ALL_U8, f.dtype, "f32");
          expect(mismatch(`${f.dtype}->f32`, ALL_U8, out, REF.fp8ToF32.get(f) as Uint32Array)).toBeNull();
        });

        test(`f32 -> ${f.dtype}: boundaries and random inputs vs brute force, with and without saturate`, () => {
          const ref = REF.f32ToFp8.get(f) as { plain: Uint8Array; saturate: Uint8Array };
          const plain = convert(ctx(), FP8_INPUTS, "f32", f.dtype);
          expect(mismatch(`f32->${f.dtype}`, FP8_INPUTS, plain, ref.plain)).toBeNull();
          const saturated = convert(ctx(), FP8_INPUTS, "f32", f.dtype, CAST_SATURATE);
          expect(mismatch(`f32->${f.dtype} saturate`, FP8_INPUTS, saturated, ref.saturate)).toBeNull();
        });
      }

      test("tails and offsets: n = 1, 7, 65549, 200003 at element offsets 0 and 1; bytes past n untouched", () => {
        const cases: [CastDtype, CastDtype, Bits, ArrayLike<number>][] = [
          ["f32", "f16", RANDOM_F32, REF.randomToF16],
          ["f32", "bf16", RANDOM_F32, REF.randomToBf16],
          ["f16", "f32", ALL_U16, REF.f16ToF32],
          ["bf16", "f32", ALL_U16, Uint32Array.from(ALL_U16, (b) => b * 65536)],
          ["f32", "f8_e4m3fn", FP8_INPUTS, REF.f32ToFp8.get(E4M3FN)?.plain as Uint8Array],
        ];
        const SENTINEL = 0xa5;
        for (const [from, to, source, expectedAll] of cases) {
          for (const n of [1, 7, 65536 + 13, 200003]) {
            for (const offset of [0, 1]) {
              // wrap the 16-bit inputs so that n can exceed 65,536
              const src = bitsArray(from, n) as Bits;
              const expected = bitsArray(to, n) as Bits;
              for (let i = 0; i < n; i++) {
                const j = (i + offset) % source.length;
                src[i] = source[j] as number;
                expected[i] = expectedAll[j] as number;
              }
              const dst = bitsArray(to, n + 2 + 32);
              new Uint8Array(dst.buffer).fill(SENTINEL);
              const window = dst.subarray(offset, offset + n) as Bits;
              ctx().cast(src.subarray(0, n), from, window, to, n);
              expect(mismatch(`${from}->${to} n=${n} offset=${offset}`, src, window, expected)).toBeNull();
              const bytes = new Uint8Array(dst.buffer);
              const size = CAST_DTYPE_BYTES[to];
              const outside = [...bytes.subarray(0, offset * size), ...bytes.subarray((offset + n) * size)];
              expect(outside.every((b) => b === SENTINEL)).toBe(true);
            }
          }
        }
      });

      test("same-dtype casts copy bytes exactly (NaN payloads included)", () => {
        const bytes = new Uint8Array(RANDOM_F32.buffer);
        for (const dtype of Object.keys(CAST_DTYPE_BYTES) as CastDtype[]) {
          const n = bytes.byteLength / CAST_DTYPE_BYTES[dtype];
          const out = new Uint8Array(bytes.byteLength);
          ctx().cast(bytes, dtype, out, dtype, n);
          expect(sameBytes(out, bytes)).toBe(true);
        }
      });
    });
  }
}

// ---- all levels agree ----------------------------------------------------------------------------

describe("every ISA level and thread count gives identical bytes", () => {
  const conversions: [string, Bits, CastDtype, CastDtype, number][] = [
    ["f16 -> f32, all patterns", ALL_U16, "f16", "f32", 0],
    ["f32 -> f16, random + NaNs", RANDOM_F32, "f32", "f16", 0],
    ["bf16 -> f32, all patterns", ALL_U16, "bf16", "f32", 0],
    ["f32 -> bf16, random + NaNs", RANDOM_F32, "f32", "bf16", 0],
    ["f8_e4m3fn -> f32", ALL_U8, "f8_e4m3fn", "f32", 0],
    ["f8_e5m2 -> f32", ALL_U8, "f8_e5m2", "f32", 0],
    ["f32 -> f8_e4m3fn", FP8_INPUTS, "f32", "f8_e4m3fn", 0],
    ["f32 -> f8_e4m3fn, saturate", FP8_INPUTS, "f32", "f8_e4m3fn", CAST_SATURATE],
    ["f32 -> f8_e5m2", FP8_INPUTS, "f32", "f8_e5m2", 0],
    ["f32 -> f8_e5m2, saturate", FP8_INPUTS, "f32", "f8_e5m2", CAST_SATURATE],
  ];
  for (const [label, input, from, to, flags] of conversions) {
    test(`${label} (levels: ${AVAILABLE_ISAS.join(", ")})`, () => {
      const reference = convert(ctxFor("scalar", 1), input, from, to, flags);
      for (const isa of AVAILABLE_ISAS) {
        for (const threads of THREADS) {
          const out = convert(ctxFor(isa, threads), input, from, to, flags);
          expect(mismatch(`${label} at ${isa}/${threads}`, input, out, reference)).toBeNull();
        }
      }
    });
  }
});

// ---- arguments, lifetime, memory -----------------------------------------------------------------

/** The TpError thrown by fn (fails the test if fn does not throw one). */
function thrown(fn: () => unknown): TpError {
  try {
    fn();
  } catch (e) {
    if (e instanceof TpError) return e;
    throw new Error(`expected a TpError, got ${String(e)}`);
  }
  throw new Error("expected a TpError, nothing was thrown");
}
function expectTpError(fn: () => unknown, code: TpErrorCode, mentions: string | RegExp): void {
  const e = thrown(fn);
  expect(e.code).toBe(code);
  expect(e.message).toMatch(mentions);
}

describe("argument checks (TpError, never a crash)", () => {
  const ctx = () => ctxFor(BEST_ISA, 2);
  const f32 = new Float32Array(8);
  const f16 = new Uint16Array(8);

  test("n larger than src or dst", () => {
    expectTpError(() => ctx().cast(f32, "f32", f16, "f16", 9), "E_ARG", /src holds 32 bytes.*n = 9/);
    expectTpError(() => ctx().cast(f32, "f32", new Uint16Array(4), "f16", 8), "E_ARG", /dst holds 8 bytes/);
    // lengths are checked in bytes of the dtype, not elements of the view
    expectTpError(() => ctx().cast(new Uint8Array(8), "f32", f16, "f16", 4), "E_ARG", /src holds 8 bytes/);
  });

  test("empty views with n > 0; n = 0 is a no-op even with empty views", () => {
    expectTpError(() => ctx().cast(new Float32Array(0), "f32", f16, "f16", 1), "E_ARG", /src is an empty/);
    expectTpError(() => ctx().cast(f32, "f32", new Uint16Array(0), "f16", 1), "E_ARG", /dst is an empty/);
    ctx().cast(new Float32Array(0), "f32", new Uint16Array(0), "f16", 0);
  });

  test("bad n and flags", () => {
    for (const n of [-1, 1.5, Number.NaN, 2 ** 53]) {
      expectTpError(
        () => ctx().cast(f32, "f32", f16, "f16", n),
        "E_ARG",
        /n must be a non-negative safe integer/,
      );
    }
    expectTpError(() => ctx().cast(f32, "f32", f16, "f16", 1, -1), "E_ARG", /flags/);
    expectTpError(() => ctx().cast(f32, "f32", f16, "f16", 1, 2), "E_ARG", /unknown flags 0x2/); // native check
  });

  test("unknown dtype: in TypeScript and in C", () => {
    expectTpError(
      () => ctx().cast(f32, "f64" as CastDtype, f16, "f16", 1),
      "E_ARG",
      /unknown srcDtype "f64"; expected one of: f32, f16, bf16, f8_e4m3fn, f8_e5m2/,
    );
    expectTpError(() => ctx().cast(f32, "f32", f16, "int8" as CastDtype, 1), "E_ARG", /unknown dstDtype/);
    // a raw call with code 7 reaches the C check; check() turns its status into a TpError
    const status = lib.raw.tp_cpu_cast(ctx().handle, f32, 7, f16, 1, 1, 0);
    expectTpError(() => check(ctx(), status), "E_ARG", /unknown src_dtype 7/);
  });

  test("unsupported pair: f16 -> bf16 is E_UNSUPPORTED, also for n = 0", () => {
    expectTpError(
      () => ctx().cast(f16, "f16", new Uint16Array(8), "bf16", 8),
      "E_UNSUPPORTED",
      /f16 -> bf16/,
    );
    expectTpError(
      () => ctx().cast(f32, "f8_e4m3fn", f16, "f8_e5m2", 0),
      "E_UNSUPPORTED",
      /f8_e4m3fn -> f8_e5m2/,
    );
  });

  test("misaligned and overlapping views, non-views", () => {
    const bytes = new Uint8Array(64);
    expectTpError(
      () => ctx().cast(bytes.subarray(1, 33), "f32", f16, "f16", 8),
      "E_ARG",
      /src is not aligned to 4/,
    );
    const shared = new Uint32Array(16);
    expectTpError(
      () => ctx().cast(shared, "f32", new Uint16Array(shared.buffer, 8, 8), "f16", 8),
      "E_ARG",
      /src and dst overlap/,
    );
    expectTpError(
      () => ctx().cast([1, 2] as unknown as Float32Array, "f32", f16, "f16", 2),
      "E_ARG",
      /src must be/,
    );
  });

  test("check(): native status codes map to TpError codes", () => {
    const cases: [number, TpErrorCode][] = [
      [1, "E_ARG"],
      [2, "E_OOM"],
      [3, "E_UNSUPPORTED"],
      [4, "E_INTERNAL"],
      [99, "E_INTERNAL"],
    ];
    for (const [status, code] of cases) expect(thrown(() => check(ctx(), status)).code).toBe(code);
    check(ctx(), 0);
  });

  test("int32 arguments and weight rows past the kernels' limits", () => {
    // bun:ffi passes an int32_t modulo 2^32: group 2^32 + 16 would arrive as 16
    const x = new Float32Array(64);
    expectTpError(
      () => ctx().convRotQuantize(x, 1, 64, 8, 2 ** 32 + 16, new Int8Array(64), new Float32Array(1)),
      "E_ARG",
      "convRotQuantize: group must be an integer in [0, 2147483647], got 4294967312",
    );
    // k above 2^40 is refused as such, not as "not a whole number of blocks"
    expectTpError(() => lib.weightRowBytes("q4_0", 2 ** 41), "E_ARG", /k = 2199023255552 is above 2\^40/);
    expect(lib.weightRowBytes("q4_0", 2 ** 40)).toBe((2 ** 40 / 32) * 18);
    expectTpError(() => lib.weightRowBytes("q4_0", 33), "E_SHAPE", /not a whole number of q4_0 blocks/);
  });

  test("createContext arguments", () => {
    expectTpError(() => lib.createContext(-1), "E_ARG", /nThreads/);
    expectTpError(() => lib.createContext(257), "E_ARG", /nThreads/);
    expectTpError(() => lib.createContext(1, "sse" as CpuIsa), "E_ARG", /unknown maxIsa "sse"/);
    const all = lib.createContext(0, "scalar");
    expect(all.threads).toBe(lib.cpuCount());
    expect(all.isa).toBe("scalar");
    all.destroy();
  });
});

describe("the shared argument checks of the wrappers", () => {
  const ctx = () => ctxFor(BEST_ISA, 2);

  test("a name that selects a tp.h code is E_ARG listing the valid names", () => {
    const cases: [() => unknown, string][] = [
      [
        () => lib.createContext(1, "sse" as CpuIsa),
        'createContext: unknown maxIsa "sse"; expected one of: scalar, avx2, avx512',
      ],
      [
        () => lib.weightRowBytes("q9_z" as NativeWeightFormat, 32),
        'weightRowBytes: unknown weight format "q9_z"; expected one of: f32, f16, bf16, f8_e4m3fn, f8_e5m2, ' +
          "int8_convrot, int4_convrot, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs",
      ],
      [
        () => ctx().quantizeActivations("q8_2" as "q8_0", new Float32Array(32), 1, 32, new Uint8Array(34)),
        'quantizeActivations: unknown type "q8_2"; expected one of: q8_0, q8_1, q8_k',
      ],
      [
        () => repackBytes(ctx(), "q4_k" as "q4_0", 16, 64),
        'repack: unknown repacked weight format "q4_k"; expected one of: q8_0, q4_0',
      ],
      [
        () => ctx().cast(new Float32Array(1), "f32", new Uint16Array(1), 7 as unknown as CastDtype, 1),
        "cast: unknown dstDtype 7; expected one of: f32, f16, bf16, f8_e4m3fn, f8_e5m2",
      ],
    ];
    for (const [fn, message] of cases) {
      const e = thrown(fn);
      expect([e.code, e.message]).toEqual(["E_ARG", message]);
    }
  });

  test("typed views of the weight wrappers: the type and the element count, before any pointer", () => {
    const w: NativeWeight = {
      format: "f32",
      n: 4,
      k: 8,
      data: new Uint8Array(128),
      scale: null,
      group: 0,
    };
    const out = new Float32Array(16);
    const cases: [() => unknown, string][] = [
      [() => ctx().getRows(w, Int32Array.from([0]), 2, out), "getRows: ids holds 1 values, 2 are needed"],
      [
        () => ctx().getRows(w, Uint32Array.from([0, 1]) as unknown as Int32Array, 2, out),
        "getRows: ids must be an Int32Array, got Uint32Array(2)",
      ],
      [() => ctx().getRows(w, null, 2, new Float32Array(15)), "getRows: out holds 15 values, 16 are needed"],
      [
        () => ctx().getRows(w, null, 5, new Float32Array(40)),
        "getRows: nIds = 5 rows without ids, but the weight has n = 4",
      ],
      [
        () =>
          ctx().convRotQuantize(new Float32Array(32), 2, 16, 8, 16, new Int8Array(31), new Float32Array(2)),
        "convRotQuantize: codes holds 31 values, 32 are needed",
      ],
      [
        () =>
          ctx().convRotQuantize(
            new Float32Array(32),
            2,
            16,
            8,
            16,
            new Uint8Array(32) as unknown as Int8Array,
            new Float32Array(2),
          ),
        "convRotQuantize: codes must be an Int8Array, got Uint8Array(32)",
      ],
      [
        () => ctx().matmul(new Float32Array(8), 1, w, null, [0, 0, 0, 0] as unknown as Float32Array),
        "matmul: y must be a Float32Array, got object",
      ],
    ];
    for (const [fn, message] of cases) {
      const e = thrown(fn);
      expect([e.code, e.message]).toEqual(["E_ARG", message]);
    }
    // n = 0 rows pass no pointer: empty views are fine then
    ctx().getRows(w, new Int32Array(0), 0, new Float32Array(0));
    const rows = new Float32Array(8).fill(Number.NaN);
    ctx().getRows(w, Int32Array.from([3]), 1, rows);
    expect(Array.from(rows)).toEqual(new Array(8).fill(0));
  });
});

describe("check(status): a native status becomes a TpError with the native message", () => {
  const f32 = new Float32Array(8);
  const u16 = new Uint16Array(8);

  test("TP_OK returns before reading anything from the context (a destroyed one included)", () => {
    const gone = lib.createContext(1, "scalar");
    gone.destroy();
    expect(check(gone, 0)).toBeUndefined();
    expectTpError(() => check(gone, 1), "E_STATE", /destroy/); // a failure does read the message
  });

  test("the message is the context's tp_ctx_error text, the code follows the status", () => {
    const ctx = lib.createContext(1, "scalar");
    try {
      const arg = lib.raw.tp_cpu_cast(ctx.handle, f32, 7, u16, 1, 1, 0); // unknown src_dtype
      expect(arg).toBe(1);
      const argMessage = ctx.lastError();
      expect(argMessage).toMatch(/unknown src_dtype 7/);
      const e = thrown(() => check(ctx, arg));
      expect([e.code, e.message, e.tensor]).toEqual(["E_ARG", argMessage, undefined]);

      const unsupported = lib.raw.tp_cpu_cast(ctx.handle, u16, 1, new Uint16Array(8), 2, 8, 0); // f16 -> bf16
      expect(unsupported).toBe(3);
      const u = thrown(() => check(ctx, unsupported));
      expect([u.code, u.message]).toEqual(["E_UNSUPPORTED", ctx.lastError()]);
      expect(u.message).toMatch(/f16 -> bf16/);
    } finally {
      ctx.destroy();
    }
  });

  test("a context without a message gets one naming the status; a tensor context is appended", () => {
    const fresh = lib.createContext(1, "scalar");
    try {
      expect(fresh.lastError()).toBe("");
      const cases: [number, TpErrorCode][] = [
        [1, "E_ARG"],
        [2, "E_OOM"],
        [3, "E_UNSUPPORTED"],
        [4, "E_INTERNAL"],
        [-1, "E_INTERNAL"],
        [99, "E_INTERNAL"],
      ];
      for (const [status, code] of cases) {
        const e = thrown(() => check(fresh, status));
        expect([status, e.code, e.message]).toEqual([
          status,
          code,
          `native CPU call failed with status ${status}`,
        ]);
      }
      const named = thrown(() => check(fresh, 2, { tensor: "blocks.0.attn.wq.weight" }));
      expect([named.code, named.tensor, named.message]).toEqual([
        "E_OOM",
        "blocks.0.attn.wq.weight",
        "native CPU call failed with status 2 (tensor blocks.0.attn.wq.weight)",
      ]);
    } finally {
      fresh.destroy();
    }
  });
});

describe("context lifetime and memory", () => {
  test("a destroyed context: use and a second destroy are E_STATE", () => {
    const ctx = lib.createContext(2, "scalar");
    ctx.cast(new Float32Array(4), "f32", new Uint16Array(4), "f16", 4);
    ctx.destroy();
    expect(ctx.destroyed).toBe(true);
    expectTpError(
      () => ctx.cast(new Float32Array(4), "f32", new Uint16Array(4), "f16", 4),
      "E_STATE",
      /destroy/,
    );
    expectTpError(() => ctx.destroy(), "E_STATE", /destroy/);
    expectTpError(() => ctx.handle, "E_STATE", /destroy/);
    ctx[Symbol.dispose](); // disposing a destroyed context is a no-op
  });

  test("many contexts can be created and destroyed (threads are joined)", () => {
    for (let i = 0; i < 50; i++) lib.createContext(2, BEST_ISA).destroy();
  });

  test("alloc: 0 -> null, else 64-byte aligned; bad sizes are E_ARG, impossible ones E_OOM", () => {
    expect(lib.alloc(0)).toBeNull();
    lib.free(null);
    for (const bytes of [1, 63, 64, 65, 1 << 20]) {
      const p = lib.alloc(bytes);
      expect(p).not.toBeNull();
      expect((p as number) % 64).toBe(0);
      lib.free(p);
    }
    expectTpError(() => lib.alloc(-1), "E_ARG", /bytes/);
    expectTpError(() => lib.alloc(0.5), "E_ARG", /bytes/);
    expectTpError(() => lib.alloc(2 ** 50), "E_OOM", /could not allocate/); // 1 PiB: past any address space
  });

  test("features decode to names; the chosen level matches them", () => {
    const bits = lib.features();
    const names = cpuFeatureNames(bits);
    expect(cpuFeatureNames(0)).toEqual([]);
    expect(cpuFeatureNames(CPU_FEATURES.avx2 | CPU_FEATURES.f16c)).toEqual(["avx2", "f16c"]);
    const has = (...f: (keyof typeof CPU_FEATURES)[]) => f.every((x) => names.includes(x));
    const expected: CpuIsa = has("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl")
      ? "avx512"
      : has("avx2", "fma", "f16c")
        ? "avx2"
        : "scalar";
    expect(BEST_ISA).toBe(expected);
    expect(lib.cpuCount()).toBeGreaterThanOrEqual(1);
  });

  const cc = process.env.CC?.trim().split(/\s+/)[0] || Bun.which("cc") || Bun.which("gcc");
  test.skipIf(!cc)("a library of another ABI version is E_UNSUPPORTED (skipped without a C compiler)", () => {
    const dir = mkdtempSync(join(tmpdir(), "tp-abi-"));
    try {
      const src = join(dir, "abi.c");
      const so = join(dir, "libtp_cpu.so");
      writeFileSync(src, "int tp_abi_version(void) { return 999; }\n"); // and none of the other symbols
      const r = Bun.spawnSync([cc as string, "-shared", "-fPIC", "-o", so, src], { stderr: "pipe" });
      expect(r.stderr.toString()).toBe("");
      const e = thrown(() => loadCpuLibrary(so));
      expect(e.code).toBe("E_UNSUPPORTED");
      expect(e.message).toContain("ABI version 999, this package expects 1");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a missing library is E_IO naming the file", () => {
    const e = thrown(() => loadCpuLibrary("/nonexistent/libtp_cpu.so"));
    expect(e.code).toBe("E_IO");
    expect(e.file).toBe("/nonexistent/libtp_cpu.so");
    expect(e.message).toContain("run 'bun run build'");
  });
});

// ---- the build script ----------------------------------------------------------------------------

describe("scripts/build-native.ts", () => {
  const script = resolve(import.meta.dir, "../scripts/build-native.ts");
  const buildDir = resolve(import.meta.dir, "../build");

  test("without a compiler: one 'error E_IO:' line, exit 1, the library untouched", () => {
    const before = { mtime: statSync(lib.path).mtimeMs, bytes: readFileSync(lib.path) };
    const emptyBin = mkdtempSync(join(tmpdir(), "tp-no-cc-"));
    try {
      const r = Bun.spawnSync([process.execPath, script, "--force"], {
        env: { PATH: emptyBin, HOME: process.env.HOME ?? "/tmp" },
        stdout: "pipe",
        stderr: "pipe",
      });
      const lines = r.stderr
        .toString()
        .split("\n")
        .filter((l) => l.length > 0);
      expect(lines).toHaveLength(1);
      expect(lines[0]).toStartWith("error E_IO: no C compiler found (tried $CC (unset), cc, gcc, clang)");
      expect(r.exitCode).toBe(1);
    } finally {
      rmSync(emptyBin, { recursive: true, force: true });
    }
    expect(existsSync(lib.path)).toBe(true);
    expect(statSync(lib.path).mtimeMs).toBe(before.mtime);
    expect(readFileSync(lib.path).equals(before.bytes)).toBe(true);
    expect(readdirSync(buildDir).filter((f) => f.endsWith(".tmp") || f.startsWith("obj-"))).toEqual([]);
  });

  test("an explicit CC that names no program is an error, not a silent fallback", () => {
    const r = Bun.spawnSync([process.execPath, script, "--force"], {
      env: { PATH: process.env.PATH ?? "", CC: "/nonexistent/gcc", HOME: process.env.HOME ?? "/tmp" },
      stdout: "pipe",
      stderr: "pipe",
    });
    expect(r.stderr.toString()).toBe(
      "error E_IO: CC=/nonexistent/gcc names no program: install it, or unset CC to use cc, gcc or clang ('apt-get install gcc')\n",
    );
    expect(r.exitCode).toBe(1);
  });
});
