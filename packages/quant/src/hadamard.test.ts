// The ConvRot Hadamard rotation (krea2.md §1.6) against an independent closed form, the matrices the
// krea2-tiny fixtures ship (computed by torch), and the algebra (symmetric, orthogonal, self-inverse).
// Tolerances: dense-matrix facts are exact (entries ±2^-m, sums exact in f64); the f32 butterfly is
// compared with 1e-6 relative to the group's max |value| (four passes of f32 rounding).
import { describe, expect, test } from "bun:test";
import { TpError } from "@tp/tensor";
import {
  CONVROT_GROUP_SIZE,
  hadamardDigits,
  hadamardMatrix,
  hadamardTransform,
  hadamardTransformInt,
  rotateRows,
} from "./hadamard.ts";
import { gaussian, missingReason, readF32, sharedPath, skipNote, thrown } from "./testing/fixtures.ts";

const GROUPS = [4, 16, 64, 256, 1024];

/** krea2.md §1.6 closed form: (-1)^(#digit positions with i_d + j_d = 3) / 16, for g = 256. */
function closedForm(i: number, j: number): number {
  let neg = 0;
  for (let d = 0; d < 4; d++) if (((i >> (2 * d)) & 3) + ((j >> (2 * d)) & 3) === 3) neg++;
  return (neg % 2 === 0 ? 1 : -1) / 16;
}

function denseApply(h: Float64Array, g: number, v: ArrayLike<number>): Float64Array {
  const out = new Float64Array(g);
  for (let j = 0; j < g; j++) {
    let s = 0;
    for (let i = 0; i < g; i++) s += (v[i] as number) * (h[i * g + j] as number); // v · H
    out[j] = s;
  }
  return out;
}

describe("dense matrix", () => {
  test("H_256 equals the closed form of krea2.md §1.6 exactly; every row sums to 1", () => {
    const h = hadamardMatrix(256);
    let bad = 0;
    for (let i = 0; i < 256; i++) {
      let row = 0;
      for (let j = 0; j < 256; j++) {
        if (h[i * 256 + j] !== closedForm(i, j)) bad++;
        row += h[i * 256 + j] as number;
      }
      expect(row).toBe(1);
    }
    expect(bad).toBe(0);
  });

  test("symmetric and orthogonal (H·Hᵀ = H·H = I exactly) for g = 4 … 256", () => {
    for (const g of [4, 16, 64, 256]) {
      const h = hadamardMatrix(g);
      let asym = 0;
      let maxErr = 0;
      for (let i = 0; i < g; i++) {
        for (let j = 0; j < g; j++) {
          if (h[i * g + j] !== h[j * g + i]) asym++;
          let s = 0;
          for (let t = 0; t < g; t++) s += (h[i * g + t] as number) * (h[j * g + t] as number);
          maxErr = Math.max(maxErr, Math.abs(s - (i === j ? 1 : 0)));
        }
      }
      expect(asym).toBe(0);
      expect(maxErr).toBe(0);
    }
  });

  const dir = sharedPath("testdata/krea2-tiny/linear");
  const reason = missingReason(dir);
  test.skipIf(reason !== null)(
    `equals the krea2-tiny hadamard_{16,64,256}.bin (torch) bit for bit${skipNote(reason)}`,
    () => {
      for (const g of [16, 64, 256]) {
        const want = readF32(`${dir}/hadamard_${g}.bin`);
        const got = Float32Array.from(hadamardMatrix(g));
        expect(got.length).toBe(g * g);
        expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true);
      }
    },
  );
});

describe("fast transform", () => {
  test("equals the dense product: f64 to 1e-12, f32 to 1e-6 relative, for g = 4 … 1024", () => {
    for (const g of GROUPS) {
      const h = hadamardMatrix(g);
      const v = gaussian(g, g);
      const want = denseApply(h, g, v);
      const f64 = Float64Array.from(v);
      hadamardTransform(f64, g);
      const f32 = Float32Array.from(v);
      hadamardTransform(f32, g);
      const scale = Math.max(...want.map(Math.abs));
      let e64 = 0;
      let e32 = 0;
      for (let i = 0; i < g; i++) {
        e64 = Math.max(e64, Math.abs((f64[i] as number) - (want[i] as number)));
        e32 = Math.max(e32, Math.abs((f32[i] as number) - (want[i] as number)));
      }
      expect(e64 / scale).toBeLessThan(1e-12);
      expect(e32 / scale).toBeLessThan(1e-6);
    }
  });

  test("self-inverse: transforming twice returns the input to 1e-6 (f32)", () => {
    for (const g of GROUPS) {
      const v = gaussian(100 + g, g, 3);
      const w = v.slice();
      hadamardTransform(w, g);
      hadamardTransform(w, g);
      const scale = Math.max(...v.map(Math.abs));
      let err = 0;
      for (let i = 0; i < g; i++) err = Math.max(err, Math.abs((w[i] as number) - (v[i] as number)));
      expect(err / scale).toBeLessThan(1e-6);
    }
  });

  test("orthogonal: preserves the Euclidean norm to 1e-6", () => {
    const v = gaussian(7, 256);
    const w = v.slice();
    hadamardTransform(w);
    const n = (a: Float32Array) => Math.sqrt(a.reduce((s, x) => s + x * x, 0));
    expect(Math.abs(n(w) - n(v)) / n(v)).toBeLessThan(1e-6);
  });

  test("integer butterfly equals √g · H on integer codes exactly", () => {
    const g = 256;
    const h = hadamardMatrix(g);
    const q = new Int32Array(g).map((_, i) => ((i * 37) % 255) - 127);
    const want = denseApply(h, g, q).map((x) => x * 16);
    const got = q.slice();
    hadamardTransformInt(got, g);
    expect(Array.from(got)).toEqual(Array.from(want));
  });

  test("rotateRows rotates each group of each row and never mixes rows", () => {
    const k = 512;
    const x = gaussian(3, 2 * k);
    const y = x.slice();
    rotateRows(y, k, 256);
    for (const off of [0, 256, 512, 768]) {
      const g = x.slice(off, off + 256);
      hadamardTransform(g, 256);
      expect(Array.from(y.subarray(off, off + 256))).toEqual(Array.from(g));
    }
  });

  test("offset transforms only its group", () => {
    const v = gaussian(9, 768);
    const w = v.slice();
    hadamardTransform(w, 256, 256);
    expect(Array.from(w.subarray(0, 256))).toEqual(Array.from(v.subarray(0, 256)));
    expect(Array.from(w.subarray(512))).toEqual(Array.from(v.subarray(512)));
  });
});

describe("errors", () => {
  test("group sizes that are not powers of 4 are E_ARG", () => {
    for (const g of [0, 1, 2, 8, 32, 100, 128, 512]) {
      const e = thrown(() => hadamardDigits(g));
      expect(e).toBeInstanceOf(TpError);
      expect((e as TpError).code).toBe("E_ARG");
    }
    expect(hadamardDigits(CONVROT_GROUP_SIZE)).toBe(4);
  });

  test("K not a multiple of the group is E_SHAPE naming the tensor", () => {
    const e = thrown(() => rotateRows(new Float32Array(300), 300, 256, "blocks.0.attn.wq.weight"));
    expect((e as TpError).code).toBe("E_SHAPE");
    expect((e as TpError).tensor).toBe("blocks.0.attn.wq.weight");
  });
});
