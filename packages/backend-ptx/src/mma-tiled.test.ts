// The shared-memory tiled mma kernels (./ptx/mma-tiled.ts) run on the PTX simulator (./sim), no GPU:
// - f16, bf16, INT8 ConvRot (W8A8) and INT4 ConvRot (W4A4) on sm_86: rows 0..47 of a 130-row prefill
//   (tiled kernel: M, N, K ragged against its 64 × 128 × 64-byte tile) equal, bit for bit, the
//   48-row matmul of the same rows (the direct mma kernels of matmul.ts, which keep the same numerics:
//   same rounding of x, same accumulation, same k order); and the whole output is within a tight
//   bound of an f64 product of the same rounded operands (f16 / bf16), computed here;
// - fp8 W8A8 (TP_PTX_FP8_MMA) on sm_89: against a host model of the same contract (x per row to e4m3,
//   exact products, f32 sums, × s_x × s_w), and its NMSE against the f32-activation reference (x ·
//   dequant(W)ᵀ), which is the number this opt-in path trades for speed.
import { afterAll, describe, expect, test } from "bun:test";
import { decodeToF32, encodeFromF32, f32BitsToF8e4m3fnBits, type Tensor, Weight } from "@tp/tensor";
import { PtxBackend } from "./backend.ts";

/** Seeded normal samples (Box–Muller over a 32-bit LCG), f32. */
function gaussian(seed: number, n: number, sigma = 1): Float32Array {
  let s = seed >>> 0;
  const u = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s + 0.5) / 2 ** 32;
  };
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = sigma * Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
  return out;
}

const backends: PtxBackend[] = [];
afterAll(() => {
  for (const b of backends) b.dispose();
});
function sim(sm: string, options: { w4a4?: boolean; fp8Mma?: boolean } = {}): PtxBackend {
  const b = new PtxBackend({ simulate: sm, env: {}, ...options });
  backends.push(b);
  return b;
}

async function run(
  b: PtxBackend,
  x: Float32Array,
  m: number,
  k: number,
  w: Weight,
  bias: Float32Array | null,
) {
  const xt = b.upload(x.subarray(0, m * k), [m, k], "f32");
  const bt = bias === null ? null : b.upload(bias, [bias.length], "f32");
  const y: Tensor = b.matmul(xt, w, bt === null ? {} : { bias: bt });
  return new Float32Array((await b.read(y)) as Float32Array);
}

function nmse(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < want.length; i++) {
    num += ((got[i] as number) - (want[i] as number)) ** 2;
    den += (want[i] as number) ** 2;
  }
  return num / den;
}

/** y = x̂ · Ŵᵀ + bias in f64, x̂ and Ŵ given as f32 values. */
function product(
  x: Float32Array,
  w: Float32Array,
  m: number,
  n: number,
  k: number,
  bias: Float32Array | null,
) {
  const y = new Float64Array(m * n);
  for (let i = 0; i < m; i++)
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let t = 0; t < k; t++) s += (x[i * k + t] as number) * (w[j * k + t] as number);
      y[i * n + j] = s + (bias === null ? 0 : (bias[j] as number));
    }
  return y;
}

describe("tiled mma kernels on the simulator (sm_86)", () => {
  const M = 130;
  const N = 200;
  for (const [format, K] of [
    ["f16", 112], // 3½ k steps of 32
    ["bf16", 96],
  ] as const) {
    test(`${format}: the 130-row tiled product's first 48 rows equal the direct mma kernel's bit for bit; all rows match the f64 product of the rounded operands`, async () => {
      const b = sim("sm_86");
      const x = gaussian(1, M * K);
      const wf = gaussian(2, N * K, 0.5);
      const bias = gaussian(3, N);
      const w = new Weight({ name: `w.${format}`, format, shape: [N, K], data: encodeFromF32(wf, format) });
      const tiled = await run(b, x, M, K, w, bias);
      const direct = await run(b, x, 48, K, w, bias);
      expect(Array.from(tiled.subarray(0, 48 * N))).toEqual(Array.from(direct));
      const want = product(
        decodeToF32(encodeFromF32(x, format), format, M * K),
        decodeToF32(w.data, format, N * K),
        M,
        N,
        K,
        bias,
      );
      let worst = 0;
      for (let i = 0; i < want.length; i++)
        worst = Math.max(worst, Math.abs((tiled[i] as number) - (want[i] as number)));
      // f32 sums of ≤ 112 products of magnitude ≲ 10: a few 1e-6
      expect(worst).toBeLessThan(2e-5);
    }, 120_000);
  }
});

/** A ConvRot weight [n, k] of random codes (int8 in [−127, 127], int4 in [−7, 7] packed low nibble first). */
function convrotWeight(bits: 8 | 4, n: number, k: number, group: number): Weight {
  const codes = gaussian(7 + bits, n * k, bits === 8 ? 40 : 2.5).map((v) =>
    Math.max(-127, Math.min(127, Math.round(v))),
  );
  const clampQ = (v: number) => (bits === 8 ? v : Math.max(-7, Math.min(7, v)));
  let data: Uint8Array;
  if (bits === 8) data = Uint8Array.from(codes, (v) => v & 0xff);
  else {
    data = new Uint8Array((n * k) / 2);
    for (let i = 0; i < data.length; i++)
      data[i] = (clampQ(codes[2 * i] as number) & 15) | ((clampQ(codes[2 * i + 1] as number) & 15) << 4);
  }
  const values = gaussian(11, n).map((v) => 0.01 + 0.002 * Math.abs(v));
  return new Weight({
    name: `w.int${bits}`,
    format: bits === 8 ? "int8_convrot" : "int4_convrot",
    shape: [n, k],
    data,
    scale: { kind: "row", values },
    rotationGroup: group,
  });
}

describe("tiled integer mma kernels on the simulator (sm_86)", () => {
  for (const [bits, K] of [
    [8, 224], // 3½ k steps of 64
    [4, 192], // 1½ k steps of 128
  ] as const) {
    test(`INT${bits} ConvRot (W${bits}A${bits}): the 130-row tiled product's first 48 rows equal the direct mma.s${bits} kernel's bit for bit`, async () => {
      const b = sim("sm_86", { w4a4: bits === 4 });
      const x = gaussian(5, 130 * K);
      const bias = gaussian(6, 200);
      const w = convrotWeight(bits, 200, K, 16);
      const tiled = await run(b, x, 130, K, w, bias);
      const direct = await run(b, x, 48, K, w, bias);
      expect(Array.from(tiled.subarray(0, 48 * 200))).toEqual(Array.from(direct));
      expect(tiled.every(Number.isFinite)).toBe(true);
    }, 120_000);
  }
});

/** e4m3 value of the f32 `v` (round to nearest even, saturated to ±448). */
function e4m3(v: number): number {
  const b = new DataView(new ArrayBuffer(4));
  b.setFloat32(0, v);
  const code = f32BitsToF8e4m3fnBits(b.getUint32(0), true);
  return decodeToF32(Uint8Array.of(code), "f8_e4m3fn", 1)[0] as number;
}

/**
 * The fp8 W8A8 contract, on the host: s_x = max(f32(max|x_row| / 448), 1e-30), q = e4m3(f32(x / s_x)),
 * y = (Σ q_x · q_w) · s_x · s_w + bias (sums in f64: the kernel's f32 sums differ by rounding only).
 */
function fp8Model(
  x: Float32Array,
  wq: Float32Array,
  m: number,
  n: number,
  k: number,
  sw: number,
  bias: Float32Array | null,
) {
  const q = new Float32Array(m * k);
  const sx = new Float64Array(m);
  for (let i = 0; i < m; i++) {
    let amax = 0;
    for (let t = 0; t < k; t++) amax = Math.max(amax, Math.abs(x[i * k + t] as number));
    const s = Math.max(Math.fround(amax / 448), Math.fround(1e-30));
    sx[i] = s;
    for (let t = 0; t < k; t++) q[i * k + t] = e4m3(Math.fround((x[i * k + t] as number) / s));
  }
  const acc = product(q, wq, m, n, k, null);
  for (let i = 0; i < m; i++)
    for (let j = 0; j < n; j++)
      acc[i * n + j] =
        (acc[i * n + j] as number) * (sx[i] as number) * sw + (bias === null ? 0 : (bias[j] as number));
  return acc;
}

describe("fp8 W8A8 tensor cores (TP_PTX_FP8_MMA) on the simulator (sm_89)", () => {
  const M = 130;
  const N = 200;
  const K = 96;
  for (const scaled of [false, true]) {
    test(`e4m3${scaled ? " scaled" : ""}: the fp8 contract's host model to f32 rounding; NMSE against the f32-x reference reported`, async () => {
      const b = sim("sm_89", { fp8Mma: true });
      const x = gaussian(21, M * K);
      const wf = gaussian(22, N * K, scaled ? 2 : 0.5);
      const sw = scaled ? 0.25 : 1;
      const data = encodeFromF32(scaled ? wf.map((v) => v / sw) : wf, "f8_e4m3fn", { saturate: true });
      const w = new Weight({
        name: "w.e4m3",
        format: "f8_e4m3fn",
        shape: [N, K],
        data,
        ...(scaled ? { scale: { kind: "tensor" as const, value: sw } } : {}),
      });
      const bias = scaled ? null : gaussian(23, N);
      const got = await run(b, x, M, K, w, bias);
      const wq = decodeToF32(data, "f8_e4m3fn", N * K);
      const model = fp8Model(x, wq, M, N, K, sw, bias);
      expect(nmse(got, model)).toBeLessThan(1e-11);
      const reference = product(
        x,
        wq.map((v) => v * sw),
        M,
        N,
        K,
        bias,
      );
      const err = nmse(got, reference);
      console.log(
        `fp8 W8A8 (per-row e4m3 x) NMSE vs f32-x reference, x [${M}, ${K}] · w [${N}, ${K}]ᵀ${scaled ? " scaled" : ""}: ${err.toExponential(2)}`,
      );
      // e4m3 keeps 3 mantissa bits: a relative rounding error of ~2.4% rms per element of x
      expect(err).toBeGreaterThan(1e-5);
      expect(err).toBeLessThan(2e-3);
      // the default path on the same device keeps x in f32: far closer
      const plain = await run(sim("sm_89"), x, M, K, w, bias);
      expect(nmse(plain, reference)).toBeLessThan(1e-10);
    }, 120_000);
  }
});
