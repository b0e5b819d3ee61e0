/**
 * matmul cases tighter or larger than those of ./matmul.ts, added with the Vulkan end-to-end checks
 * (issue 6):
 * - GGUF weights with the activations quantized exactly as ggml's `vec_dot_type` (Q8_0 / Q8_1 / Q8_K):
 *   the reference rounds x that way, so a backend that multiplies f32 x (closer to the exact product,
 *   but ~4e-3 relative away from llama.cpp, enough to flip greedy tokens of a Q4_0 model) fails the
 *   tight NMSE here while passing the suite's general 5e-4.
 * - A long K (69,632 = 272 blocks of 256): llvmpipe ends an invocation's loops after 65,535
 *   iterations, which cut the tiled kernels (M > 8, and every ConvRot matmul), which walk all of K in
 *   one invocation, short somewhere between K = 40,000 and 65,536 (NMSE 0.3–0.6 here on the old
 *   code; backend-vulkan README, "llvmpipe's loop limit"). The few-row kernel (M = 2) passed before
 *   (it was right up to K = 196,608 at M = 8).
 */
import type { Tensor, Weight, WeightFormat } from "@tp/tensor";
import { type ConformanceCase, defineCase } from "../case.ts";
import { gaussian } from "../data.ts";
import { matmulRef } from "../reference/index.ts";
import type { Tolerance } from "../tolerances.ts";
import { EXACT, MATMUL } from "../tolerances.ts";
import { makeWeight } from "./matmul.ts";

/**
 * GGUF matmul against the reference with ggml-quantized x: the same integer block products, summed in
 * f32 (blocks, tiles, threads) instead of f64 — measured ≤ 1e-13 on cpu and vulkan; f32 x instead of
 * quantized x gives ~1e-5. Q8_1 weights (q4_1, q5_1) get more room: the cpu backend uses Q8_1's
 * stored f16(Σq · d) for the min term, the reference f16(d) · Σq (relative 2^-11 of that term;
 * measured 1.5e-7 on cpu).
 */
const GGML_ACTIVATIONS: Tolerance = {
  kind: "nmse",
  max: 1e-9,
  why: "ggml's quantized activations and exact block products; only f32 summation order differs",
};
const GGML_ACTIVATIONS_Q8_1: Tolerance = {
  kind: "nmse",
  max: 1e-6,
  why: "as GGML_ACTIVATIONS, plus Q8_1's f16-rounded block sum in the min term (cpu)",
};

const GGUF: readonly WeightFormat[] = [
  "q8_0",
  "q4_0",
  "q4_1",
  "q5_0",
  "q5_1",
  "q2_k",
  "q3_k",
  "q4_k",
  "q5_k",
  "q6_k",
  "iq4_nl",
  "iq4_xs",
];

function ggmlActivationCases(): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  GGUF.forEach((format, f) => {
    for (const [m, k, n] of [
      [1, 512, 19],
      [12, 768, 40],
    ] as const) {
      const weight = makeWeight({ format }, n, k, 3100 + 10 * f + m, `w_${format}`);
      const x = gaussian(3200 + 10 * f + m, m * k);
      out.push(
        defineCase({
          op: "matmul",
          name: `matmul ${format} x [${m}, ${k}] · w [${n}, ${k}]ᵀ with ggml-quantized activations`,
          formats: [format],
          tolerance: format === "q4_1" || format === "q5_1" ? GGML_ACTIVATIONS_Q8_1 : GGML_ACTIVATIONS,
          inputs: [{ name: "x", dtype: "f32", shape: [m, k], data: x }],
          weights: [weight],
          call: (b, [xt], [w]) => b.matmul(xt as Tensor, w as Weight),
          reference: ([xt]) => [
            { shape: [m, n], dtype: "f32", data: matmulRef(xt?.data as Float32Array, weight, null) },
          ],
        }),
      );
    }
  });
  return out;
}

/**
 * K = 69,632, past llvmpipe's per-invocation loop limit for the tiled kernels (M = 9; ConvRot is tiled
 * at any M), and the few-row kernel (M = 2) at the same K.
 */
function longKCases(): ConformanceCase[] {
  const k = 69632;
  const out: ConformanceCase[] = [];
  const formats: WeightFormat[] = ["f32", "q8_0", "int8_convrot", "int4_convrot"];
  formats.forEach((format, f) => {
    for (const m of [9, 2]) {
      const n = 5;
      const weight = makeWeight({ format }, n, k, 3400 + 10 * f + m, `w_${format}`);
      const x = gaussian(3500 + 10 * f + m, m * k);
      const bias = gaussian(3600 + 10 * f + m, n);
      out.push(
        defineCase({
          op: "matmul",
          name: `matmul ${format} long K: x [${m}, ${k}] · w [${n}, ${k}]ᵀ + bias`,
          formats: [format],
          tolerance: MATMUL,
          inputs: [
            { name: "x", dtype: "f32", shape: [m, k], data: x },
            { name: "bias", dtype: "f32", shape: [n], data: bias },
          ],
          weights: [weight],
          call: (b, [xt, bt], [w]) => b.matmul(xt as Tensor, w as Weight, { bias: bt as Tensor }),
          reference: ([xt]) => [
            { shape: [m, n], dtype: "f32", data: matmulRef(xt?.data as Float32Array, weight, bias) },
          ],
        }),
      );
    }
  });
  return out;
}

/**
 * NaN and ±inf activations: which outputs come out non-finite, exactly as the reference says (the
 * call multiplies y by 0 on the backend: 0 where an output is finite, NaN where it is NaN or ±inf).
 * Rows: clean, a NaN, a +inf, a −inf. The reference's semantics (@tp/quant): a plain product
 * propagates them; ggml's Q8_0 / Q8_1 activation block holding NaN gets d = NaN and one holding ±inf
 * d = +inf with codes 0, so the whole row is NaN (0 · inf); ConvRot rotates the non-finite value
 * into its whole group, so the row is NaN. The k-quants' Q8_K keeps ggml's search, whose outcome on
 * NaN is an arbitrary finite code, so they are left out.
 */
function nonFiniteCases(): ConformanceCase[] {
  const formats: WeightFormat[] = [
    "f32",
    "f16",
    "bf16",
    "f8_e4m3fn",
    "f8_e5m2",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "int8_convrot",
    "int4_convrot",
  ];
  const [m, k, n] = [4, 256, 7];
  return formats.map((format, f) => {
    const weight = makeWeight({ format }, n, k, 3700 + f, `w_${format}`);
    const x = gaussian(3800 + f, m * k);
    x[k + 17] = Number.NaN;
    x[2 * k + 100] = Number.POSITIVE_INFINITY;
    x[3 * k + 255] = Number.NEGATIVE_INFINITY;
    return defineCase({
      op: "matmul",
      name: `matmul ${format} with NaN / ±inf activations: the non-finite outputs where the reference has them`,
      formats: [format],
      tolerance: EXACT,
      inputs: [
        { name: "x", dtype: "f32", shape: [m, k], data: x },
        { name: "zero", dtype: "f32", shape: [1], data: new Float32Array(1) },
      ],
      weights: [weight],
      call: (b, [xt, zt], [w]) => {
        const y = b.matmul(xt as Tensor, w as Weight);
        const mask = b.mul(y, zt as Tensor);
        b.free(y);
        return mask;
      },
      reference: ([xt]) => [
        {
          shape: [m, n],
          dtype: "f32",
          data: matmulRef(xt?.data as Float32Array, weight, null).map((v) =>
            Number.isFinite(v) ? 0 : Number.NaN,
          ),
        },
      ],
    });
  });
}

/** The cases of this file. */
export function exactMatmulCases(): ConformanceCase[] {
  return [...ggmlActivationCases(), ...longKCases(), ...nonFiniteCases()];
}
