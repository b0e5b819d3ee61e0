// Conversions against independent references: Bun's Float16Array / Math.f16round for binary16, a
// brute-force nearest-value search in f64 for bf16 and fp8, and value tables written from the OCP 8-bit
// float spec (OFP8 rev 1.0 §5) for fp8. Tolerance: none — every comparison is bit for bit.
import { describe, expect, test } from "bun:test";
import {
  bf16BitsToF32Bits,
  bitsToF32,
  decodeToF32,
  encodeFromF32,
  f8e4m3fnBitsToF32Bits,
  f8e5m2BitsToF32Bits,
  f16BitsToF32Bits,
  f32BitsToBf16Bits,
  f32BitsToF8e4m3fnBits,
  f32BitsToF8e5m2Bits,
  f32BitsToF16Bits,
  f32ToBits,
  f32ToF8e4m3fn,
} from "./convert.ts";

const isNaNBits = (u: number) => (u & 0x7fffffff) > 0x7f800000;

/** Seeded xorshift32, so failures reproduce. */
function rng(seed: number) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}

describe("f16", () => {
  test("decode: all 65,536 patterns equal Float16Array, NaNs quiet with payload", () => {
    const h = new Uint16Array(65536).map((_, i) => i);
    const ref = new Float32Array(new Float16Array(h.buffer));
    const refBits = new Uint32Array(ref.buffer);
    let mismatches = 0;
    for (let i = 0; i < 65536; i++) {
      const got = f16BitsToF32Bits(i);
      const e = (i >> 10) & 0x1f;
      const m = i & 0x3ff;
      if (e === 0x1f && m !== 0) {
        const want = (((i & 0x8000) << 16) | 0x7fc00000 | (m << 13)) >>> 0;
        if (got !== want) mismatches++;
      } else if (got !== refBits[i]) mismatches++;
    }
    expect(mismatches).toBe(0);
  });

  test("encode: every f16 value round-trips; every midpoint rounds to the even neighbour", () => {
    let bad = 0;
    for (let i = 0; i < 65536; i++) {
      const e = (i >> 10) & 0x1f;
      if (e === 0x1f && (i & 0x3ff) !== 0) continue;
      if (f32BitsToF16Bits(f16BitsToF32Bits(i)) !== i) bad++;
    }
    expect(bad).toBe(0);
    // Midpoints between consecutive positive finite f16 values a < b: (a+b)/2 is exact in f32.
    for (let i = 0; i < 0x7bff; i++) {
      const a = bitsToF32(f16BitsToF32Bits(i));
      const b = bitsToF32(f16BitsToF32Bits(i + 1));
      const mid = f32ToBits((a + b) / 2);
      const want = i % 2 === 0 ? i : i + 1;
      if (f32BitsToF16Bits(mid) !== want || f32BitsToF16Bits((mid | 0x80000000) >>> 0) !== (want | 0x8000))
        bad++;
    }
    expect(bad).toBe(0);
  });

  test("encode: 300,000 random f32 patterns equal Math.f16round", () => {
    const next = rng(12345);
    const probe = new Float16Array(1);
    const probeBits = new Uint16Array(probe.buffer);
    let bad = 0;
    for (let n = 0; n < 300_000; n++) {
      // Bias exponents towards the f16 range so subnormals, normals and overflow all occur.
      let u = next();
      if (n % 2 === 0) u = (u & 0x807fffff) | (((next() % 48) + 95) << 23);
      if (isNaNBits(u)) continue;
      probe[0] = bitsToF32(u); // Float16Array stores with round-to-nearest-even
      if (f32BitsToF16Bits(u) !== probeBits[0]) bad++;
      if (Math.f16round(bitsToF32(u)) !== bitsToF32(f16BitsToF32Bits(f32BitsToF16Bits(u)))) bad++;
    }
    expect(bad).toBe(0);
  });

  test("encode: overflow, inf and NaN", () => {
    expect(f32BitsToF16Bits(f32ToBits(65504))).toBe(0x7bff);
    expect(f32BitsToF16Bits(f32ToBits(65519.99))).toBe(0x7bff);
    expect(f32BitsToF16Bits(f32ToBits(65520))).toBe(0x7c00); // tie: 65504 is odd, so up to inf
    expect(f32BitsToF16Bits(f32ToBits(-1e10))).toBe(0xfc00);
    expect(f32BitsToF16Bits(0x7f800000)).toBe(0x7c00);
    expect(f32BitsToF16Bits(0x7fc00000)).toBe(0x7e00);
    expect(f32BitsToF16Bits(0xff812345)).toBe(0xfe00 | (0x12345 >>> 13));
    expect(f32BitsToF16Bits(f32ToBits(2 ** -24))).toBe(1); // smallest subnormal
    expect(f32BitsToF16Bits(f32ToBits(2 ** -25))).toBe(0); // tie with 0 → even (0)
    expect(f32BitsToF16Bits(f32ToBits(2 ** -25 * 1.0001))).toBe(1);
  });
});

describe("bf16", () => {
  test("decode: all 65,536 patterns are the upper half of the f32", () => {
    let bad = 0;
    for (let i = 0; i < 65536; i++) {
      const got = bf16BitsToF32Bits(i);
      if (got !== (i * 65536) >>> 0) bad++;
    }
    expect(bad).toBe(0);
  });

  /** Independent reference: the nearer of the two bf16 neighbours in f64, ties to even, overflow to inf. */
  function bf16Reference(u: number): number {
    const x = bitsToF32(u);
    const lo = u >>> 16; // truncation: the neighbour towards zero
    const hi = lo + 1;
    const vlo = bitsToF32(lo * 65536);
    const vhi = (lo & 0x7fff) === 0x7f7f ? Math.sign(x) * 2 ** 128 : bitsToF32((hi * 65536) >>> 0);
    const dlo = Math.abs(x - vlo);
    const dhi = Math.abs(vhi - x);
    if (dlo < dhi) return lo;
    if (dhi < dlo) return hi & 0xffff;
    return (lo & 1) === 0 ? lo : hi & 0xffff;
  }

  test("encode: random patterns and every tie equal the brute-force reference", () => {
    const next = rng(7);
    let bad = 0;
    for (let n = 0; n < 300_000; n++) {
      const u = next();
      if (isNaNBits(u) || (u & 0x7fffffff) === 0x7f800000) continue;
      if (f32BitsToBf16Bits(u) !== bf16Reference(u)) bad++;
    }
    for (let h = 0; h < 65536; h++) {
      const u = ((h << 16) | 0x8000) >>> 0; // exactly halfway above pattern h
      if (isNaNBits(u) || (h & 0x7fff) >= 0x7f80) continue;
      if (f32BitsToBf16Bits(u) !== bf16Reference(u)) bad++;
    }
    expect(bad).toBe(0);
    expect(f32BitsToBf16Bits(0x7fc00001)).toBe(0x7fc0);
    expect(f32BitsToBf16Bits(0xff800001)).toBe(0xffc0);
    expect(f32BitsToBf16Bits(0x7f7fffff)).toBe(0x7f80); // rounds past max finite → inf
  });
});

// ---- fp8: value tables written from the OCP spec, independent of convert.ts -----------------------

/** OFP8 §5: E4M3 — bias 7, no infinities, S.1111.111 NaN. E5M2 — bias 15, IEEE specials. */
function ocpValue(code: number, expBits: number, mantBits: number, bias: number, ieee: boolean): number {
  const s = code >> (expBits + mantBits) ? -1 : 1;
  const e = (code >> mantBits) & ((1 << expBits) - 1);
  const m = code & ((1 << mantBits) - 1);
  const eMax = (1 << expBits) - 1;
  if (ieee && e === eMax) return m === 0 ? s * Number.POSITIVE_INFINITY : Number.NaN;
  if (!ieee && e === eMax && m === (1 << mantBits) - 1) return Number.NaN;
  if (e === 0) return s * (m / 2 ** mantBits) * 2 ** (1 - bias);
  return s * (1 + m / 2 ** mantBits) * 2 ** (e - bias);
}
const E4M3_TABLE = Array.from({ length: 256 }, (_, c) => ocpValue(c, 4, 3, 7, false));
const E5M2_TABLE = Array.from({ length: 256 }, (_, c) => ocpValue(c, 5, 2, 15, true));

/** Brute force: nearest finite code (f64 distance), ties to the even code, then the overflow rule. */
function fp8Reference(
  x: number,
  table: number[],
  maxFinite: number,
  ieee: boolean,
  saturate: boolean,
): number {
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  if (Number.isNaN(x)) return sign | 0x7f;
  const a = Math.abs(x);
  const max = table[maxFinite] as number;
  const overflowCode = saturate ? maxFinite : ieee ? 0x7c : 0x7f;
  if (a === Number.POSITIVE_INFINITY) return sign | overflowCode;
  // The rounding boundary above max is max + half an ulp of the top binade; past it → overflow.
  const ulp = max - (table[maxFinite - 1] as number);
  if (a > max + ulp / 2 || (a === max + ulp / 2 && (maxFinite & 1) === 1)) return sign | overflowCode;
  let best = 0;
  for (let c = 1; c <= maxFinite; c++) {
    const d = Math.abs(a - (table[c] as number));
    const db = Math.abs(a - (table[best] as number));
    if (d < db || (d === db && (c & 1) === 0 && (best & 1) === 1)) best = c;
  }
  return sign | best;
}

describe("fp8", () => {
  test("OCP spec constants", () => {
    expect(E4M3_TABLE[0x7e]).toBe(448);
    expect(E4M3_TABLE[0x08]).toBe(2 ** -6);
    expect(E4M3_TABLE[0x01]).toBe(2 ** -9);
    expect(E4M3_TABLE[0x7f]).toBeNaN();
    expect(E4M3_TABLE[0x78]).toBe(256); // S.1111.000 is a normal number in E4M3
    expect(E5M2_TABLE[0x7b]).toBe(57344);
    expect(E5M2_TABLE[0x7c]).toBe(Number.POSITIVE_INFINITY);
    expect(E5M2_TABLE[0x01]).toBe(2 ** -16);
    expect(E5M2_TABLE[0xfc]).toBe(Number.NEGATIVE_INFINITY);
  });

  test("decode: all 256 patterns of each equal the spec table (and -0 keeps its sign)", () => {
    for (let c = 0; c < 256; c++) {
      const e4 = bitsToF32(f8e4m3fnBitsToF32Bits(c));
      const e5 = bitsToF32(f8e5m2BitsToF32Bits(c));
      expect(
        Object.is(e4, E4M3_TABLE[c]) || (Number.isNaN(e4) && Number.isNaN(E4M3_TABLE[c] as number)),
      ).toBe(true);
      expect(
        Object.is(e5, E5M2_TABLE[c]) || (Number.isNaN(e5) && Number.isNaN(E5M2_TABLE[c] as number)),
      ).toBe(true);
    }
    expect(f8e4m3fnBitsToF32Bits(0x80)).toBe(0x80000000);
  });

  const cases: [string, number[], number, boolean, (u: number, s: boolean) => number][] = [
    ["e4m3fn", E4M3_TABLE, 0x7e, false, f32BitsToF8e4m3fnBits],
    ["e5m2", E5M2_TABLE, 0x7b, true, f32BitsToF8e5m2Bits],
  ];
  for (const [name, table, maxFinite, ieee, encode] of cases) {
    test(`${name} encode: random, midpoint and boundary inputs equal the brute-force reference`, () => {
      const inputs: number[] = [
        0,
        -0,
        Number.POSITIVE_INFINITY,
        Number.NEGATIVE_INFINITY,
        464,
        480,
        470,
        61440,
        61439,
        65536,
        1e9,
      ];
      for (let c = 0; c < maxFinite; c++) {
        const a = table[c] as number;
        const b = table[c + 1] as number;
        inputs.push(a, b, (a + b) / 2, -(a + b) / 2, Math.fround((a + b) / 2 + 1e-7 * b), a / 2);
      }
      const next = rng(99);
      for (let n = 0; n < 20_000; n++) {
        const u = (next() & 0x807fffff) | (((next() % 40) + 100) << 23);
        inputs.push(bitsToF32(u));
      }
      let bad = 0;
      for (const x of inputs) {
        const u = f32ToBits(x);
        const xf = bitsToF32(u);
        for (const sat of [false, true]) {
          if (encode(u, sat) !== fp8Reference(xf, table, maxFinite, ieee, sat)) bad++;
        }
      }
      expect(bad).toBe(0);
    });
  }

  test("torch's overflow rule and saturation", () => {
    expect(f32ToF8e4m3fn(464)).toBe(0x7e); // tie → even mantissa (448)
    expect(f32ToF8e4m3fn(464.1)).toBe(0x7f); // NaN, as torch float8_e4m3fn
    expect(f32ToF8e4m3fn(464.1, true)).toBe(0x7e);
    expect(f32ToF8e4m3fn(Number.NEGATIVE_INFINITY, true)).toBe(0xfe);
    expect(f32BitsToF8e5m2Bits(f32ToBits(61440))).toBe(0x7c);
    expect(f32BitsToF8e5m2Bits(f32ToBits(61440), true)).toBe(0x7b);
    expect(f32BitsToF8e5m2Bits(0xffc00000)).toBe(0xff);
  });
});

describe("array helpers", () => {
  test("decodeToF32 / encodeFromF32 agree with the scalar functions on unaligned bytes", () => {
    const raw = new Uint8Array(1 + 2 * 1000);
    const next = rng(5);
    for (let i = 0; i < raw.length; i++) raw[i] = next() & 0xff;
    const bytes = raw.subarray(1); // odd byte offset
    for (const dtype of ["f16", "bf16"] as const) {
      const dec = decodeToF32(bytes, dtype);
      const enc = encodeFromF32(dec, dtype);
      for (let i = 0; i < 1000; i++) {
        const h = (bytes[2 * i] as number) | ((bytes[2 * i + 1] as number) << 8);
        const want = dtype === "f16" ? f16BitsToF32Bits(h) : bf16BitsToF32Bits(h);
        expect(new Uint32Array(dec.buffer)[i]).toBe(want);
        const back = (enc[2 * i] as number) | ((enc[2 * i + 1] as number) << 8);
        expect(back).toBe(dtype === "f16" ? f32BitsToF16Bits(want) : f32BitsToBf16Bits(want));
      }
    }
    const e4 = decodeToF32(bytes.subarray(0, 256), "f8_e4m3fn");
    expect(e4.length).toBe(256);
    expect(() => decodeToF32(bytes, "i32")).toThrow(/no f32 conversion for dtype i32/);
    expect(() => decodeToF32(bytes.subarray(0, 3), "f16", 2)).toThrow(/need 4 bytes, got 3/);
  });
});
