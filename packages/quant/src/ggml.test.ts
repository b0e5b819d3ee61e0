// GGUF block types: the llm.md §2.5 probe vectors (bit for bit), a second decoder that follows ggml's
// loop structure (bit for bit on 200 random blocks per type), the quantizers' scale conventions, and
// llama.cpp tests/test-quantize-fns.cpp style limits: round-trip error (their metric sqrt(Σd²)/n) below
// 0.002 (0.004 for 3-bit, 0.0075 for 2-bit) and dot-product error below 0.02,
// plus true-RMSE limits per bit width measured on the same data.
import { describe, expect, test } from "bun:test";
import { decodeTable, f32ToF16, type TpError, type WeightFormat, weightFormatInfo } from "@tp/tensor";
import { dequantizeGgml, GGML_DEQUANT_FORMATS, KVALUES_IQ4NL } from "./ggml-dequant.ts";
import { ACTIVATION_TYPE, dotGgml, quantizeActivationsGgml, quantizeGgml } from "./ggml-quantize.ts";
import { gaussian, thrown, uniform } from "./testing/fixtures.ts";
import { dequantizeLoops } from "./testing/ggml-loops.ts";

const f16le = (v: number): [number, number] => {
  const h = f32ToF16(v);
  return [h & 255, h >> 8];
};

/** llm.md §2.5: b[i] = (73·i + 41) mod 256, then d = 0.5, dmin = 0.25, m = −1 at each type's offsets. */
function probeBlock(format: WeightFormat): Uint8Array {
  const info = weightFormatInfo(format);
  const b = new Uint8Array(info.blockBytes).map((_, i) => (73 * i + 41) % 256);
  const fields: Record<string, [d: number, dmin?: number, m?: number]> = {
    q4_0: [0],
    q4_1: [0, undefined, 2],
    q5_0: [0],
    q5_1: [0, undefined, 2],
    q8_0: [0],
    iq4_nl: [0],
    q2_k: [80, 82],
    q3_k: [108],
    q4_k: [0, 2],
    q5_k: [0, 2],
    q6_k: [208],
    iq4_xs: [0],
  };
  const [d, dmin, m] = fields[format] as [number, number?, number?];
  b.set(f16le(0.5), d);
  if (dmin !== undefined) b.set(f16le(0.25), dmin);
  if (m !== undefined) b.set(f16le(-1), m);
  return b;
}

// llm.md §2.5 table: index:value pairs and the sum of all elements.
const PROBES: Record<string, [Record<number, number>, number]> = {
  q4_0: [{ 0: 1.5, 1: -2, 2: 2.5, 15: -3, 16: 1.5, 17: -4, 31: -4 }, -16.5],
  q4_1: [{ 0: 5.5, 1: 2, 2: 6.5, 15: 1, 16: 1, 17: 3.5, 31: 3.5 }, 80.5],
  q5_0: [{ 0: 7.5, 1: 4, 2: -7.5, 15: -5, 16: 6.5, 17: -7, 31: 1 }, -22.5],
  q5_1: [{ 0: 7.5, 1: 4, 2: 8.5, 15: 11, 16: 10.5, 17: 12.5, 31: 4.5 }, 218.5],
  q8_0: [{ 0: -34.5, 1: 2, 2: 38.5, 15: 1, 16: 37.5, 17: -54, 31: -55 }, -24],
  iq4_nl: [{ 0: 19, 1: -24.5, 2: 34.5, 15: -41.5, 16: 19, 17: -63.5, 31: -63.5 }, -240.5],
  q2_k: [
    { 0: 4, 1: 8.5, 15: -0.5, 16: -0.75, 32: 8.25, 64: 18.5, 100: 19.25, 128: -1.25, 200: 2.75, 255: -1.75 },
    1021.5,
  ],
  q3_k: [{ 0: -3.5, 1: 7, 15: 14, 16: 1, 32: -27, 63: 56, 100: -8.5, 127: -48, 128: 12, 255: -12 }, 117],
  q4_k: [
    { 0: 46.25, 1: 0.75, 15: -12.25, 32: 106.5, 64: 138.75, 100: 297, 128: 88.25, 200: 27, 255: -5.75 },
    26676,
  ],
  q5_k: [
    { 0: 150.25, 1: 0.75, 15: -12.25, 32: 128.5, 64: 138.75, 100: 337, 128: 256.25, 200: 27, 255: -5.75 },
    55036,
  ],
  q6_k: [
    { 0: 80.5, 1: -23, 2: -310.5, 15: 368, 16: -175, 31: -800, 32: 553.5, 100: -1067, 128: -171.5, 255: 144 },
    -7422,
  ],
  iq4_xs: [{ 0: -1508, 1: 362.5, 16: -145, 17: 551, 32: -208, 64: -1144, 128: 884, 255: -375 }, -3225],
};

describe("dequantize", () => {
  for (const [format, [values, sum]] of Object.entries(PROBES)) {
    test(`${format}: llm.md §2.5 probe vector, bit for bit`, () => {
      const info = weightFormatInfo(format);
      const got = dequantizeGgml(format as WeightFormat, probeBlock(format as WeightFormat), info.blockElems);
      for (const [i, v] of Object.entries(values)) expect(got[Number(i)]).toBe(v);
      expect(got.reduce((a, b) => a + b, 0)).toBe(sum);
    });
  }

  test("every type equals a second decoder with ggml's loop structure on 200 random blocks, bit for bit", () => {
    const rnd = uniform(2024);
    const fields: Record<string, number[]> = {
      q4_0: [0],
      q4_1: [0, 2],
      q5_0: [0],
      q5_1: [0, 2],
      q8_0: [0],
      iq4_nl: [0],
      q2_k: [80, 82],
      q3_k: [108],
      q4_k: [0, 2],
      q5_k: [0, 2],
      q6_k: [208],
      iq4_xs: [0],
    };
    for (const [format, offsets] of Object.entries(fields)) {
      const info = weightFormatInfo(format);
      const nb = 200;
      const bytes = new Uint8Array(nb * info.blockBytes).map(() => Math.floor(rnd() * 256));
      for (let blk = 0; blk < nb; blk++) {
        // Finite f16 scales of either sign, 2^-14 … 2^4 (random bytes would give NaN/inf now and then).
        for (const o of offsets)
          bytes.set(f16le((rnd() < 0.5 ? -1 : 1) * 2 ** (rnd() * 18 - 14)), blk * info.blockBytes + o);
      }
      const a = dequantizeGgml(format as WeightFormat, bytes, nb * info.blockElems);
      const b = dequantizeLoops(format, bytes, nb);
      const ua = new Uint32Array(a.buffer);
      const ub = new Uint32Array(b.buffer);
      let diff = 0;
      for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) diff++;
      expect(`${format}: ${diff} differing values`).toBe(`${format}: 0 differing values`);
    }
  });

  test("q8_k: f32 d times int8 codes; f16 / bf16 / f32 decode exactly", () => {
    const b = new Uint8Array(292);
    new DataView(b.buffer).setFloat32(0, 0.125, true);
    b[4] = 0x81; // −127
    b[5] = 3;
    const got = dequantizeGgml("q8_k", b, 256);
    expect([got[0], got[1], got[2]]).toEqual([-15.875, 0.375, 0]);
    expect(Array.from(dequantizeGgml("f16", new Uint8Array([0x00, 0x3c, 0x00, 0xc0]), 2))).toEqual([1, -2]);
    expect(Array.from(dequantizeGgml("bf16", new Uint8Array([0x80, 0x3f, 0x40, 0x40]), 2))).toEqual([1, 3]);
    expect(
      Array.from(dequantizeGgml("f32", new Uint8Array(new Float32Array([1.5, -0.25]).buffer), 2)),
    ).toEqual([1.5, -0.25]);
  });

  test("other types are E_UNSUPPORTED naming the type; bad sizes are E_SHAPE naming the tensor", () => {
    for (const format of ["q1_0", "iq2_xxs", "iq3_s", "tq1_0", "mxfp4", "nvfp4"].filter(
      (f) => f !== "q1_0",
    ) as WeightFormat[]) {
      const e = thrown(() =>
        dequantizeGgml(format, new Uint8Array(1024), 256, "blk.0.ffn_up.weight"),
      ) as TpError;
      expect(e.code).toBe("E_UNSUPPORTED");
      expect(e.message).toContain(weightFormatInfo(format).ggufName as string);
      expect(e.tensor).toBe("blk.0.ffn_up.weight");
    }
    const e = thrown(() => dequantizeGgml("q4_k", new Uint8Array(144), 100, "t")) as TpError;
    expect(e.code).toBe("E_SHAPE");
    expect(e.tensor).toBe("t");
    expect((thrown(() => dequantizeGgml("q4_k", new Uint8Array(143), 256)) as TpError).code).toBe("E_SHAPE");
    expect(GGML_DEQUANT_FORMATS.length).toBe(17);
  });
});

describe("quantize: llama.cpp's scale conventions", () => {
  test("q8_0: d = f16(max|x|/127), q = roundf(x · (1/d)) (ties away from zero)", () => {
    const x = new Float32Array(32).map((_, i) => (i - 10) * 0.5);
    x[31] = 12.7; // max |x|
    const b = quantizeGgml("q8_0", x, 32);
    const d = Math.fround(12.7 / 127);
    expect((b[0] as number) | ((b[1] as number) << 8)).toBe(f32ToF16(d));
    const id = Math.fround(1 / d);
    const codes = Array.from(new Int8Array(b.buffer, 2, 32));
    expect(codes).toEqual(
      Array.from(x).map((v) => {
        const t = Math.fround(v * id);
        return Math.sign(t) * Math.floor(Math.abs(t) + 0.5) || 0;
      }),
    );
    expect(codes[31]).toBe(127);
  });

  test("q4_0: d = max/−8 for the signed value of largest magnitude, which decodes exactly", () => {
    for (const sign of [1, -1]) {
      const x = gaussian(31, 32);
      x[5] = sign * 4; // the largest magnitude
      const b = quantizeGgml("q4_0", x, 32);
      const back = dequantizeGgml("q4_0", b, 32);
      expect(back[5]).toBe(sign * 4);
      expect((b[0] as number) | ((b[1] as number) << 8)).toBe(f32ToF16(sign * -0.5));
    }
  });

  test("q4_k / q6_k / q8_k: scales within range, q8_k bsums = sums of 16 codes, d = 1/(−127/max)", () => {
    const x = gaussian(41, 1024);
    const k = quantizeGgml("q8_k", x, 1024);
    const dv = new DataView(k.buffer);
    for (let blk = 0; blk < 4; blk++) {
      const o = blk * 292;
      const qs = new Int8Array(k.buffer, o + 4, 256);
      for (let g = 0; g < 16; g++) {
        let s = 0;
        for (let i = 0; i < 16; i++) s += qs[16 * g + i] as number;
        expect(dv.getInt16(o + 260 + 2 * g, true)).toBe(s);
      }
      let max = 0;
      for (let i = 0; i < 256; i++)
        if (Math.abs(x[blk * 256 + i] as number) > Math.abs(max)) max = x[blk * 256 + i] as number;
      expect(dv.getFloat32(o, true)).toBe(Math.fround(1 / Math.fround(-127 / max)));
    }
    // an all-zero super-block stays zero
    expect(quantizeGgml("q6_k", new Float32Array(256), 256).every((v) => v === 0)).toBe(true);
    expect(
      Array.from(dequantizeGgml("q4_k", quantizeGgml("q4_k", new Float32Array(256), 256), 256)).every(
        (v) => v === 0,
      ),
    ).toBe(true);
  });

  test("iq4_nl / iq4_xs: values on the K4 grid come back as f16(d) · K4 (the grid is found exactly)", () => {
    const K = KVALUES_IQ4NL;
    const x = new Float32Array(256).map((_, i) => Math.fround(0.01 * (K[(i * 7) % 16] as number)));
    const f16 = (v: number) => decodeTable("f16")[f32ToF16(v)] as number;
    const nl = dequantizeGgml("iq4_nl", quantizeGgml("iq4_nl", x, 256), 256);
    const dNl = f16(0.01);
    expect(Array.from(nl)).toEqual(Array.from(x, (_, i) => Math.fround(dNl * (K[(i * 7) % 16] as number))));
    // IQ4_XS: every sub-block scale is 0.01, so d = 0.01 / −32 and ls − 32 = −32
    const xs = dequantizeGgml("iq4_xs", quantizeGgml("iq4_xs", x, 256), 256);
    const dl = Math.fround(f16(0.01 / -32) * -32);
    expect(Array.from(xs)).toEqual(Array.from(x, (_, i) => Math.fround(dl * (K[(i * 7) % 16] as number))));
  });

  test("unsupported targets are E_UNSUPPORTED naming the type; partial blocks are E_SHAPE", () => {
    const e = thrown(() => quantizeGgml("f16", new Float32Array(256), 256, "w")) as TpError;
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("F16");
    expect(e.tensor).toBe("w");
    expect((thrown(() => quantizeGgml("q4_k", new Float32Array(100), 100)) as TpError).code).toBe("E_SHAPE");
  });
});

describe("test-quantize-fns style limits (llama.cpp tests/test-quantize-fns.cpp)", () => {
  const n = 32 * 128; // their test_size
  /** generate_data: 0.1 + 2·cos(i + offset), as f32. */
  const data = (offset: number) => new Float32Array(n).map((_, i) => 0.1 + 2 * Math.cos(i + offset));
  const x = data(0);
  const y = data(1);
  /** array_rmse: sqrt(Σ d²) / n — their metric (not a true RMSE). */
  const llamaRmse = (a: Float32Array, b: Float32Array) => {
    let s = 0;
    for (let i = 0; i < a.length; i++) s += ((a[i] as number) - (b[i] as number)) ** 2;
    return Math.sqrt(s) / a.length;
  };
  // True RMSE limits per bit width on this data (|x| ≤ 2.1), 1.25× the measured value:
  // Q8_0 / Q8_1 0.00476, Q8_K 0.00481, Q6_K 0.0167, Q5_K 0.0340, Q5_0 0.0378, Q5_1 0.0356,
  // Q4_K 0.0628, Q4_0 0.0718, Q4_1 0.0732, IQ4_NL 0.0796, IQ4_XS 0.0804, Q3_K 0.163, Q2_K 0.299.
  const TRUE_RMSE: Record<string, number> = {
    q8_0: 0.006,
    q8_1: 0.006,
    q8_k: 0.006,
    q6_k: 0.021,
    q5_k: 0.043,
    q5_0: 0.047,
    q5_1: 0.045,
    q4_k: 0.079,
    q4_0: 0.09,
    q4_1: 0.092,
    iq4_nl: 0.1,
    iq4_xs: 0.1,
    q3_k: 0.2,
    q2_k: 0.37,
  };
  // llama.cpp's limits: MAX_QUANTIZATION_TOTAL_ERROR (0.002), _3BITS (0.004), _2BITS (0.0075).
  const MAX_TOTAL_ERROR: Record<string, number> = { q3_k: 0.004, q2_k: 0.0075 };
  const MAX_DOT_ERROR = 0.02;
  const FORMATS = [
    "q8_0",
    "q8_1",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "q2_k",
    "q3_k",
    "q4_k",
    "q5_k",
    "q6_k",
    "q8_k",
  ] as const;
  const ALL = [...FORMATS, "iq4_nl", "iq4_xs"] as const;

  for (const format of ALL) {
    test(`${format}: round trip below llama.cpp's limit (its metric) and its true-RMSE limit`, () => {
      const back = dequantizeGgml(format, quantizeGgml(format, x, n), n);
      expect(llamaRmse(back, x)).toBeLessThan(MAX_TOTAL_ERROR[format] ?? 0.002);
      expect(llamaRmse(back, x) * Math.sqrt(n)).toBeLessThan(TRUE_RMSE[format] as number);
    });
  }

  for (const format of ALL.filter((f) => f !== "q8_1" && f !== "q8_k")) {
    test(`${format}: dot product with ${ACTIVATION_TYPE[format]} activations within 0.02 per element`, () => {
      const w = quantizeGgml(format, x, n);
      const a = quantizeActivationsGgml(format, y);
      expect(a.format).toBe(ACTIVATION_TYPE[format] as "q8_0" | "q8_1" | "q8_k");
      let ref = 0;
      for (let i = 0; i < n; i++) ref += Math.fround((x[i] as number) * (y[i] as number));
      const err = Math.abs(dotGgml(format, w, a, n) - ref) / n;
      expect(err).toBeLessThan(MAX_DOT_ERROR);
    });
  }
});

describe("goldens from ggml's reference quantizers", () => {
  // SHA-256 of the bytes ggml's quantize_row_{q8_0,q4_0,q4_K,q6_K,q8_K}_ref write for goldenInput().
  // Produced once (2026) by a throwaway C harness holding those functions from ggml-org/llama.cpp
  // ggml/src/ggml-quants.c @ 01243c587feceaa5d6a6c2305535ef2f549c48b8, gcc 12.2 -O2, x86-64, with and
  // without -ffp-contract=off (same bytes). The harness is not kept in this repository (third-party
  // code); the same harness matched quantizeGgml bit for bit on 11 further data sets (Gaussian, tiny,
  // sparse, outliers, one-signed, constant, integer-valued, and real bf16 weights).
  const GOLDEN_SHA256: Record<string, string> = {
    q8_0: "2a92c53dff230c992b17fc54e1f00cb55061b1906fb443e1dac67db84f29d9c8",
    q4_0: "94c0a7ace13c20bb9c97a811978046dcc3c4bb159bb6bcff6fd15ec6c324bfa4",
    q4_k: "3608ba7dd42def6913179b4f24b27216799c147e13f95514e09e430d7b53e80d",
    q6_k: "494ec2ff4f639a950e5d1f6444eb55e2daf58e98009cd51fd674f2e7f3f0b2dd",
    q8_k: "971355c564420572500e4756b25ef69750df5c3462197f70098cf26b2acc0202",
  };
  /** 2048 values from integer-only arithmetic (platform independent): Irwin–Hall noise, zeros, outliers, a one-signed tail. */
  function goldenInput(): Float32Array {
    const u = uniform(20240601);
    const x = new Float32Array(2048);
    for (let i = 0; i < x.length; i++) {
      const v = (u() + u() + u() + u() - 2) * 0.75;
      x[i] = i % 97 === 0 ? v * 40 : i % 5 === 0 ? 0 : i >= 1792 ? Math.abs(v) : v;
    }
    return x;
  }
  for (const [format, sha] of Object.entries(GOLDEN_SHA256)) {
    test(`${format}: bytes equal ggml's (SHA-256)`, () => {
      const x = goldenInput();
      const got = new Bun.CryptoHasher("sha256")
        .update(quantizeGgml(format as WeightFormat, x, x.length))
        .digest("hex");
      expect(got).toBe(sha);
    });
  }
});
