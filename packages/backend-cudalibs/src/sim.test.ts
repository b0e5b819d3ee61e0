// The cuda backend on the PTX simulator: its own PTX kernels (absMax, the per-tensor e4m3 quantizer, the
// int32 dequant) executed, cuBLASLt's GEMM by the float64 model (./fake-cublaslt.ts), against a host
// model of the same W8A8 arithmetic written here from the kernels' documented contract:
// s_x = max(max|x| / 448, 1e-30); q = e4m3(x / s_x) (nearest even, saturating); y = Σ f32(q)·f32(w) ·
// s_x · s_w (+ bias). The conformance suite runs the other paths ("cuda (simulated sm_89, cuBLASLt model)").
import { describe, expect, test } from "bun:test";
import {
  bitsToF32,
  encodeFromF32,
  f8e4m3fnBitsToF32Bits,
  f32BitsToF8e4m3fnBits,
  f32ToBits,
  Weight,
} from "@tp/tensor";
import { createBackend } from "./backend.ts";

function gaussian(seed: number, n: number, scale = 1): Float32Array {
  let s = seed >>> 0;
  const next = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s + 0.5) / 2 ** 32;
  };
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++)
    out[i] = Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next()) * scale;
  return out;
}

const e4m3 = (x: number) => bitsToF32(f8e4m3fnBitsToF32Bits(f32BitsToF8e4m3fnBits(f32ToBits(x), true)));

describe("cuda on the PTX simulator", () => {
  test("fp8 W8A8 (opt-in): x quantized per tensor to e4m3, the cuBLASLt fp8 GEMM with both scales, bias", async () => {
    const b = createBackend({ simulate: "sm_89", fp8Activations: true });
    try {
      expect(b.device).toMatch(/PTX simulator \(sm_89.*cuBLASLt model/);
      const [M, K, N] = [32, 64, 48];
      const wf = gaussian(7, N * K, 0.5);
      const sw = 0.75;
      const data = encodeFromF32(
        wf.map((v) => v / sw),
        "f8_e4m3fn",
        { saturate: true },
      );
      const w = new Weight({
        name: "w",
        format: "f8_e4m3fn",
        shape: [N, K],
        data,
        scale: { kind: "tensor", value: sw },
      });
      const x = gaussian(8, M * K);
      const bias = gaussian(9, N);
      const y = (await b.read(
        b.matmul(b.upload(x, [M, K], "f32", "x"), w, { bias: b.upload(bias, [N], "f32", "bias") }),
      )) as Float32Array;
      // host model
      let amax = 0;
      for (const v of x) amax = Math.max(amax, Math.abs(v));
      const sx = Math.max(Math.fround(amax / 448), Math.fround(1e-30));
      const wq = Array.from(data, (q) => bitsToF32(f8e4m3fnBitsToF32Bits(q)));
      let worst = 0;
      let num = 0;
      let den = 0;
      for (let m = 0; m < M; m++)
        for (let n = 0; n < N; n++) {
          let acc = 0;
          let exact = 0;
          for (let k = 0; k < K; k++) {
            acc += e4m3(Math.fround((x[m * K + k] as number) / sx)) * (wq[n * K + k] as number);
            exact += (x[m * K + k] as number) * (wq[n * K + k] as number) * sw;
          }
          const want = acc * sx * sw + (bias[n] as number);
          const got = y[m * N + n] as number;
          worst = Math.max(worst, Math.abs(got - want) / Math.max(1, Math.abs(want)));
          num += (got - exact - (bias[n] as number)) ** 2;
          den += exact ** 2;
        }
      // the model computes in f64 and the epilogue rounds to f32: a few ulps
      expect(worst).toBeLessThan(1e-5);
      // and it is W8A8: e4m3 activations part from the f32-x product by ~1e-3 (why it is opt-in)
      const nmse = num / den;
      expect(nmse).toBeGreaterThan(1e-5);
      expect(nmse).toBeLessThan(5e-3);
    } finally {
      b.dispose();
    }
  });
});
