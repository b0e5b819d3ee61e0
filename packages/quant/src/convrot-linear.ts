/**
 * The run-time side of ConvRot, as ComfyUI computes it: a reference `linear` that backends must match.
 *
 * W8A8 (comfy-kitchen eager `int8_linear`, convrot=true; krea2.md §1.7):
 * 1. rotate each activation row per group: `x_rot[g] = x[g] · H`;
 * 2. per row: `s_x = max(f32(max|x_rot| / 127), 1e-30)`, `q_x = clamp(round_half_even(f32(x_rot / s_x)), −128, 127)`;
 * 3. `acc = q_x · q_wᵀ`, exact integers;
 * 4. `y = f32(f32(acc) · f32(s_x · s_w))`, then `+ bias` in f32.
 *
 * W4A4 (comfy-kitchen eager `convrot_w4a4_linear`; krea2.md §1.8):
 * 1. rotate as above;
 * 2. per row: `s_x = f32(max(max|x_rot|, 1e-10) / 7)`, `q_x = clamp(round_half_even(f32(x_rot / s_x)), −7, 7)`;
 * 3. `acc = q_x · q_wᵀ` (torch does it in the output float dtype; exact in f32 while |acc| < 2^24);
 * 4. `y = f32(f32(f32(acc) · s_x) · s_w)` — two multiplies, in that order — then `+ bias`.
 *
 * Activation dtype here is f32 (ComfyUI on CPU, and the krea2-tiny `linear/` goldens). The rotation is
 * the f32 butterfly of {@link hadamardTransform} (each addition rounded to f32, fixed order), which a
 * native kernel can reproduce bit for bit; torch rotates with an f32 matmul whose rounding differs by
 * an ulp now and then, so an activation code on a rounding boundary can differ from ComfyUI's by one.
 *
 * The weight-only path (`activations: "float"`) is ComfyUI's fallback when int8 compute is disabled:
 * `y = x · dequant(w)ᵀ + bias`, computed here with f64 accumulation, rounded once to f32.
 */

import { TpError } from "@tp/tensor";
import {
  type ConvRotWeight,
  checkConvRotWeight,
  convRotCodes,
  dequantizeConvRot,
  quantizeRowsSymmetric,
} from "./convrot.ts";
import { rotateRows } from "./hadamard.ts";
import { ctx } from "./input.ts";

/** Activations quantized per row for a ConvRot product. */
export interface QuantizedActivations {
  /** Codes [M, K] (int8: −128..127; int4: −7..7, one per element, not packed). */
  readonly codes: Int8Array;
  /** Per-row f32 scales [M]. */
  readonly scale: Float32Array;
}

/**
 * Rotate and quantize activation rows the way ComfyUI does before an integer GEMM (steps 1–2 above).
 * @param x         [M, K] f32 activations (not modified)
 * @param k         K, a multiple of `groupSize`
 * @param bits      8 (W8A8) or 4 (W4A4)
 * @param groupSize rotation group (the weight's `convrot_groupsize`)
 * @throws TpError E_SHAPE when K is not a multiple of the group or x is not whole rows.
 */
export function quantizeActivationsConvRot(
  x: Float32Array,
  k: number,
  bits: 8 | 4,
  groupSize: number,
  name?: string,
): QuantizedActivations {
  const xRot = x.slice();
  rotateRows(xRot, k, groupSize, name);
  return quantizeRowsSymmetric(xRot, k, bits);
}

/** Options of {@link convRotLinear}. */
export interface ConvRotLinearOptions {
  /** Bias [N], added in f32 after the rescale. */
  readonly bias?: Float32Array;
  /**
   * "quantized" (default): ComfyUI's native W8A8 / W4A4 path with dynamic per-row activation
   * quantization. "float": weight-only dequantization, f32 activations.
   */
  readonly activations?: "quantized" | "float";
  /** Tensor name, for errors. */
  readonly name?: string;
}

/**
 * Reference ConvRot linear layer `y = x · Wᵀ + b` as ComfyUI computes it (see the module comment).
 * @param x      activations [M, K] f32, row-major (any leading dims flattened into M)
 * @param w      the ConvRot weight, logical [N, K]
 * @param options bias [N], activations mode, name
 * @returns y [M, N] f32
 * @throws TpError E_SHAPE when x is not whole rows of K or the bias is not N long; errors of
 *   {@link checkConvRotWeight} — naming the tensor.
 */
export function convRotLinear(
  x: Float32Array,
  w: ConvRotWeight,
  options: ConvRotLinearOptions = {},
): Float32Array {
  const name = options.name;
  checkConvRotWeight(w, name);
  const [n, k] = w.shape;
  if (x.length % k !== 0) {
    throw new TpError("E_SHAPE", `linear: ${x.length} activations are not whole rows of K = ${k}`, ctx(name));
  }
  const bias = options.bias;
  if (bias && bias.length !== n) {
    throw new TpError("E_SHAPE", `linear: bias has ${bias.length} values, expected N = ${n}`, ctx(name));
  }
  const m = x.length / k;
  const y = new Float32Array(m * n);
  if (options.activations === "float") {
    const wf = dequantizeConvRot(w, name);
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < n; j++) {
        let acc = 0;
        for (let t = 0; t < k; t++) acc += (x[i * k + t] as number) * (wf[j * k + t] as number);
        y[i * n + j] = bias ? Math.fround(Math.fround(acc) + (bias[j] as number)) : acc;
      }
    }
    return y;
  }
  const int8 = w.format === "int8_convrot";
  const a = quantizeActivationsConvRot(x, k, int8 ? 8 : 4, w.groupSize, name);
  const qw = convRotCodes(w);
  for (let i = 0; i < m; i++) {
    const sx = a.scale[i] as number;
    for (let j = 0; j < n; j++) {
      let acc = 0; // exact: |acc| ≤ 128·128·K
      for (let t = 0; t < k; t++) acc += (a.codes[i * k + t] as number) * (qw[j * k + t] as number);
      const sw = w.scale[j] as number;
      let v: number;
      if (int8) v = Math.fround(Math.fround(acc) * Math.fround(sx * sw));
      else v = Math.fround(Math.fround(Math.fround(acc) * sx) * sw);
      y[i * n + j] = bias ? Math.fround(v + (bias[j] as number)) : v;
    }
  }
  return y;
}
