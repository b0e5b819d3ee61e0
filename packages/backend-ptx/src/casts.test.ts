// The cast kernels (ptx/casts.ts) run on the PTX simulator against @tp/tensor convert.ts, the rules
// the cpu backend's tp_cpu_cast is tested against bit for bit: every fp8, f16 and bf16 code widened
// to f32 (bits compared, so NaN signs and payloads count), f32 patterns narrowed (every fp8 rounding
// midpoint and its neighbours, overflow edges, subnormals, ±inf, NaNs with payloads, random bits),
// narrow-to-narrow casts as the composition of two convert.ts conversions, and a strided input view.
// Skips, saying why, where the simulator cannot start.
import { describe, expect, test } from "bun:test";
import {
  bf16BitsToF32Bits,
  type DTypeName,
  f8e4m3fnBitsToF32Bits,
  f8e5m2BitsToF32Bits,
  f16BitsToF32Bits,
  f32BitsToBf16Bits,
  f32BitsToF8e4m3fnBits,
  f32BitsToF8e5m2Bits,
  f32BitsToF16Bits,
} from "@tp/tensor";
import { startSimulator } from "./testing/simulator.ts";

const sim = startSimulator();

type Narrow = "f16" | "bf16" | "f8_e4m3fn" | "f8_e5m2";
const WIDEN: Record<Narrow, (c: number) => number> = {
  f16: f16BitsToF32Bits,
  bf16: bf16BitsToF32Bits,
  f8_e4m3fn: f8e4m3fnBitsToF32Bits,
  f8_e5m2: f8e5m2BitsToF32Bits,
};
const NARROW: Record<Narrow, (u: number, saturate: boolean) => number> = {
  f16: (u) => f32BitsToF16Bits(u),
  bf16: (u) => f32BitsToBf16Bits(u),
  f8_e4m3fn: f32BitsToF8e4m3fnBits,
  f8_e5m2: f32BitsToF8e5m2Bits,
};
const codes = (d: Narrow) => (d === "f16" || d === "bf16" ? 65536 : 256);
const typed = (d: Narrow, v: number[]) => (codes(d) === 256 ? Uint8Array.from(v) : Uint16Array.from(v));

/** f32 bit patterns: specials, every fp8 rounding midpoint ± 1 ulp, f16 edges, random bits. */
function f32Patterns(): Uint32Array {
  const bits: number[] = [
    0, 0x80000000, 1, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000,
    0xffc00000, 0x7f800001, 0xff812345, 0x7fbfffff, 0x7fd55555,
  ];
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  const add = (v: number) => {
    f[0] = v;
    const b = u[0] as number;
    bits.push(b, (b + 1) >>> 0, (b - 1) >>> 0, (b ^ 0x80000000) >>> 0);
  };
  for (const d of ["f8_e4m3fn", "f8_e5m2"] as const) {
    const vals: number[] = [];
    for (let c = 0; c < 128; c++) {
      f.set([0]);
      u[0] = WIDEN[d](c);
      if (Number.isFinite(f[0] as number)) vals.push(f[0] as number);
    }
    for (let i = 0; i < vals.length; i++) {
      add(vals[i] as number);
      if (i + 1 < vals.length) add(((vals[i] as number) + (vals[i + 1] as number)) / 2);
    }
    // past the largest finite: the last midpoint and beyond (e4m3fn: 464, 480; e5m2: 61440, 65536)
    const max = vals[vals.length - 1] as number;
    const step = max - (vals[vals.length - 2] as number);
    for (const k of [0.5, 1, 1.5, 4]) add(max + step * k);
    add(max / 2 ** 20);
  }
  for (const v of [65504, 65519, 65520, 65536, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 1e-30, 3.4e38, 0.1]) add(v);
  let s = 0x12345678;
  for (let i = 0; i < 4096; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    bits.push(s);
  }
  return Uint32Array.from(bits);
}

/** Indices where two code arrays differ, as "i: got vs want" (at most 5). */
function diff(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  what: (i: number) => string = String,
): string[] {
  const out: string[] = [];
  for (let i = 0; i < want.length && out.length < 5; i++)
    if (got[i] !== want[i]) out.push(`${what(i)}: ${got[i]} vs ${want[i]}`);
  return out;
}

describe("ptx casts on the simulator, bit for bit with convert.ts", () => {
  if (typeof sim === "string") {
    test.skip(`skipped: the PTX simulator cannot start (${sim})`, () => {});
    return;
  }
  const b = sim;
  for (const d of ["f8_e4m3fn", "f8_e5m2", "f16", "bf16"] as const) {
    test(`every ${d} code → f32`, async () => {
      const n = codes(d);
      const x = b.upload(
        new Uint8Array(
          typed(
            d,
            Array.from({ length: n }, (_, i) => i),
          ).buffer,
        ),
        [n],
        d,
      );
      const got = new Uint32Array(((await b.read(b.cast(x, "f32"))) as Float32Array).buffer);
      const want = Uint32Array.from({ length: n }, (_, i) => WIDEN[d](i));
      expect(diff(got, want, (i) => `code 0x${i.toString(16)}`)).toEqual([]);
    });
  }
  const pats = f32Patterns();
  const xs = new Float32Array(pats.buffer);
  for (const d of ["f16", "bf16", "f8_e4m3fn", "f8_e5m2"] as const) {
    // saturate changes fp8 outputs only (tp_cpu_cast's TP_CAST_SATURATE): f16 / bf16 overflow to ±inf
    for (const saturate of [false, true]) {
      test(`f32 → ${d}${saturate ? " saturating" : ""}: ${pats.length} patterns`, async () => {
        const x = b.upload(new Uint8Array(pats.buffer.slice(0)), [pats.length], "f32");
        const got = Array.from((await b.read(b.cast(x, d, { saturate }))) as Uint8Array | Uint16Array);
        const want = Array.from(pats, (p) => NARROW[d](p, saturate && d.startsWith("f8")));
        expect(diff(got, want, (i) => `0x${(pats[i] as number).toString(16)} (${xs[i]})`)).toEqual([]);
      });
    }
  }
  const pairs: [Narrow, Narrow, boolean][] = [
    ["f16", "f8_e4m3fn", false],
    ["f16", "f8_e5m2", true],
    ["bf16", "f8_e4m3fn", true],
    ["bf16", "f16", false],
    ["f16", "bf16", false],
    ["f8_e4m3fn", "f16", false],
    ["f8_e5m2", "bf16", false],
    ["f8_e5m2", "f8_e4m3fn", false],
    ["f8_e4m3fn", "f8_e5m2", true],
  ];
  for (const [from, to, saturate] of pairs) {
    test(`every ${from} code → ${to}${saturate ? " saturating" : ""}: convert.ts's ${to}(f32(x))`, async () => {
      const n = codes(from);
      const x = b.upload(
        new Uint8Array(
          typed(
            from,
            Array.from({ length: n }, (_, i) => i),
          ).buffer,
        ),
        [n],
        from,
      );
      const got = Array.from((await b.read(b.cast(x, to, { saturate }))) as Uint8Array | Uint16Array);
      const want = Array.from({ length: n }, (_, i) => NARROW[to](WIDEN[from](i), saturate));
      expect(diff(got, want, (i) => `code 0x${i.toString(16)}`)).toEqual([]);
    });
  }
  test("a transposed view casts as its contiguous copy; a dtype to itself keeps the bits", async () => {
    const v = Float32Array.from({ length: 6 * 70 }, (_, i) => Math.sin(i) * 300);
    const x = b.upload(v, [6, 70], "f32");
    const viaView = (await b.read(b.cast(x.transpose(0, 1), "f8_e4m3fn", { saturate: true }))) as Uint8Array;
    const viaCopy = (await b.read(
      b.cast(b.copy(x.transpose(0, 1)), "f8_e4m3fn", { saturate: true }),
    )) as Uint8Array;
    expect(Array.from(viaView)).toEqual(Array.from(viaCopy));
    const t = new Uint32Array(new Float32Array([Number.NaN, 1]).buffer);
    t[0] = 0x7fa12345; // a signalling NaN's payload must survive a same-dtype cast
    const same = (await b.read(
      b.cast(b.upload(new Float32Array(t.buffer), [2], "f32"), "f32"),
    )) as Float32Array;
    expect(Array.from(new Uint32Array(same.buffer))).toEqual([0x7fa12345, 0x3f800000]);
    for (const dt of ["i32", "u8", "i64"] as DTypeName[]) expect(b.cast(b.alloc([3], dt), dt).dtype).toBe(dt);
  });
});
