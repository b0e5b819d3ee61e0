// fp8 weights (krea2.md §1.4–1.5): decoding every code against the OCP formulas, the per-tensor scale,
// and the fp8-scaled quantizer's convention (comfy-kitchen `quantize_per_tensor_fp8`). Exact.
import { describe, expect, test } from "bun:test";
import type { TpError } from "@tp/tensor";
import { dequantizeFp8, quantizeFp8Scaled } from "./fp8.ts";
import { gaussian, thrown } from "./testing/fixtures.ts";

/** OCP E4M3FN from the formula (krea2.md §1.5), independent of @tp/tensor's tables. */
function e4m3(b: number): number {
  const s = b & 0x80 ? -1 : 1;
  const e = (b >> 3) & 15;
  const m = b & 7;
  if (e === 15 && m === 7) return Number.NaN;
  return e === 0 ? s * (m / 8) * 2 ** -6 : s * (1 + m / 8) * 2 ** (e - 7);
}
/** OCP E5M2 from the formula (IEEE-like, bias 15). */
function e5m2(b: number): number {
  const s = b & 0x80 ? -1 : 1;
  const e = (b >> 2) & 31;
  const m = b & 3;
  if (e === 31) return m === 0 ? s * Infinity : Number.NaN;
  return e === 0 ? s * (m / 4) * 2 ** -14 : s * (1 + m / 4) * 2 ** (e - 15);
}

describe("decode", () => {
  const all = new Uint8Array(256).map((_, i) => i);
  test("raw e4m3fn and e5m2: all 256 codes equal the OCP formulas (NaN where NaN)", () => {
    const a = dequantizeFp8(all, "f8_e4m3fn");
    const b = dequantizeFp8(all, "f8_e5m2");
    for (let i = 0; i < 256; i++) {
      expect(Object.is(a[i], Math.fround(e4m3(i))) || (Number.isNaN(a[i]) && Number.isNaN(e4m3(i)))).toBe(
        true,
      );
      expect(Object.is(b[i], Math.fround(e5m2(i))) || (Number.isNaN(b[i]) && Number.isNaN(e5m2(i)))).toBe(
        true,
      );
    }
    expect(a[0x7e]).toBe(448);
    expect(b[0x7b]).toBe(57344);
  });

  test("scaled: w = f32(f32(fp8) · scale), one rounding", () => {
    const s = Math.fround(0.0123);
    const a = dequantizeFp8(all, "f8_e4m3fn", s);
    for (let i = 0; i < 256; i++) {
      if (Number.isNaN(e4m3(i))) expect(Number.isNaN(a[i])).toBe(true);
      else expect(a[i]).toBe(Math.fround(e4m3(i) * s));
    }
  });
});

describe("quantize to fp8-scaled (ComfyUI convention)", () => {
  const w = gaussian(21, 4096, 0.03);

  test("scale = f32(max|w|) / 448; codes = e4m3fn(clamp(f32(w · f32(1/scale)), ±448)), round to nearest even", () => {
    const { data, scale } = quantizeFp8Scaled(w, w.length);
    const amax = Math.max(...w.map(Math.abs));
    expect(scale).toBe(Math.fround(amax / 448));
    const inv = Math.fround(1 / scale);
    const table = new Float32Array(256).map((_, i) => e4m3(i));
    for (let i = 0; i < w.length; i++) {
      // Nearest e4m3 value to the scaled input by brute force (ties: even code).
      const v = Math.fround((w[i] as number) * inv);
      let best = -1;
      for (let c = 0; c < 256; c++) {
        if (Number.isNaN(table[c])) continue;
        const d = Math.abs((table[c] as number) - v);
        const bd = best < 0 ? Infinity : Math.abs((table[best] as number) - v);
        if (d < bd || (d === bd && (c & 1) === 0 && Math.sign(table[c] as number) === Math.sign(v))) best = c;
      }
      expect(table[data[i] as number]).toBe(table[best]);
    }
    // The largest magnitude maps to ±448 exactly.
    expect(Math.max(...dequantizeFp8(data, "f8_e4m3fn").map(Math.abs))).toBe(448);
  });

  test("round trip: relative RMSE < 3% (3 mantissa bits) and max error ≤ half an fp8 step", () => {
    const { data, scale } = quantizeFp8Scaled(w, w.length);
    const back = dequantizeFp8(data, "f8_e4m3fn", scale);
    let e = 0;
    let r = 0;
    for (let i = 0; i < w.length; i++) {
      const d = (back[i] as number) - (w[i] as number);
      e += d * d;
      r += (w[i] as number) ** 2;
      // spacing of e4m3 near |v| is 2^(floor(log2|v|) − 3) (normals) or 2^-9 (subnormals), times the scale
      const v = Math.abs(w[i] as number) / scale;
      const step = (v < 2 ** -6 ? 2 ** -9 : 2 ** (Math.floor(Math.log2(v)) - 3)) * scale;
      expect(Math.abs(d)).toBeLessThanOrEqual(step / 2 + 1e-12);
    }
    expect(Math.sqrt(e / r)).toBeLessThan(0.03);
  });

  test("e5m2: scale = max|w| / 57344", () => {
    const { scale } = quantizeFp8Scaled(w, w.length, { dtype: "f8_e5m2" });
    expect(scale).toBe(Math.fround(Math.max(...w.map(Math.abs)) / 57344));
  });

  test("all zeros: scale 1, codes 0; bf16 bytes are accepted; wrong length is E_SHAPE naming the tensor", () => {
    expect(quantizeFp8Scaled(new Float32Array(8), 8)).toEqual({ data: new Uint8Array(8), scale: 1 });
    const bf = new Uint8Array([0x80, 0x3f, 0x00, 0xc0]); // 1.0, −2.0
    const q = quantizeFp8Scaled({ bytes: bf, dtype: "bf16" }, 2);
    expect(Array.from(dequantizeFp8(q.data, "f8_e4m3fn", q.scale))).toEqual([1, -2]);
    const e = thrown(() => quantizeFp8Scaled(new Float32Array(3), 4, { name: "x.weight" })) as TpError;
    expect(e.code).toBe("E_SHAPE");
    expect(e.tensor).toBe("x.weight");
  });
});
