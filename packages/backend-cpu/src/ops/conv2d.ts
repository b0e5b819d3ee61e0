/**
 * 2-D convolution of the cpu backend (cross-correlation with zero padding, as
 * torch.nn.functional.conv2d): x [batch, C_in, H, W], weight [C_out, C_in, kh, kw], bias [C_out] or
 * null, all f32 → [batch, C_out, H', W'] with H' = ⌊(H + 2·ph − kh) / sh⌋ + 1. Strided inputs are
 * copied first. Kernel: native/cpu/conv2d.c (im2col in blocks + a blocked f32 GEMM).
 *
 * An empty x with a non-empty output (C_in = 0, or H or W = 0 with enough padding for the kernel)
 * sums no terms, or only the zeros of the padding: every output element is its channel's bias (0
 * without one), as the kernel's own C_in = 0 case computes it. That output is written here by the copy
 * kernel (bias broadcast), since the convolution kernel takes no empty x.
 */
import { ptr } from "bun:ffi";
import { type Conv2dOptions, formatShape, type Tensor } from "@tp/tensor";
import type { Pointer } from "../ffi.ts";
import { argError, type CpuOpHost, checkTensors, produce, scoped, shapeError, shown } from "./common.ts";
import { conv2dF32, copyStrided } from "./native.ts";

/** One f32 zero: the source of the output of an empty x without a bias (read-only). */
const ZERO = new Float32Array(1);

function pair(op: string, name: string, v: unknown, fallback: number, lo: number): [number, number] {
  const p = v === undefined ? [fallback, fallback] : typeof v === "number" ? [v, v] : v;
  if (
    !Array.isArray(p) ||
    p.length !== 2 ||
    !p.every((n) => typeof n === "number" && Number.isInteger(n) && n >= lo && n < 2 ** 31)
  ) {
    throw argError(
      op,
      `${name} must be an integer in [${lo}, 2^31 − 1] or a pair of them, got ${JSON.stringify(v)}`,
    );
  }
  return [p[0] as number, p[1] as number];
}

/**
 * conv2d(x, weight) + bias with `options.stride` and `options.padding` (a number or [h, w]; default 1
 * and 0; `options` null or undefined: the defaults) → [batch, C_out, H', W'] f32. An empty x (C_in = 0,
 * or H / W = 0 inside the padding) gives the bias broadcast (zeros without one): see the module comment.
 * @throws TpError E_SHAPE naming the shapes when ranks, channels or bias do not fit or the kernel is
 *   larger than the padded input; E_ARG naming the option for a bad stride or padding (integers,
 *   stride in [1, 2^31 − 1], padding in [0, 2^31 − 1]); E_STATE, E_UNSUPPORTED (not f32)
 */
export function conv2d(
  host: CpuOpHost,
  x: Tensor,
  weight: Tensor,
  bias: Tensor | null,
  opts?: Conv2dOptions | null,
): Tensor {
  const op = "conv2d";
  const options = opts ?? {};
  checkTensors(host, op, ["f32"], { x, weight, bias });
  const all = `x ${formatShape(x.shape)}, weight ${formatShape(weight.shape)}`;
  if (x.rank !== 4 || weight.rank !== 4) {
    throw shapeError(op, `${all}: x must be [batch, C_in, H, W] and weight [C_out, C_in, kh, kw]`);
  }
  const [batch, cIn, h, w] = x.shape as [number, number, number, number];
  const [cOut, wIn, kh, kw] = weight.shape as [number, number, number, number];
  if (wIn !== cIn) throw shapeError(op, `${all}: C_in differs (${cIn} vs ${wIn})`);
  if (bias !== null && (bias.rank !== 1 || bias.shape[0] !== cOut)) {
    throw shapeError(
      op,
      `${shown(bias, "bias")} must be [${cOut}] (C_out of weight ${formatShape(weight.shape)})`,
    );
  }
  const stride = pair(op, "stride", options.stride, 1, 1);
  const padding = pair(op, "padding", options.padding, 0, 0);
  const ph = h + 2 * padding[0];
  const pw = w + 2 * padding[1];
  if (kh < 1 || kw < 1 || kh > ph || kw > pw) {
    throw shapeError(op, `${all}: a ${kh}×${kw} kernel does not fit the padded input ${ph}×${pw}`);
  }
  const oh = Math.floor((ph - kh) / stride[0]) + 1;
  const ow = Math.floor((pw - kw) / stride[1]) + 1;
  const shape = [batch, cOut, oh, ow];
  if (x.numel === 0 && batch * cOut * oh * ow > 0) {
    // no input terms: y[b, co, i, j] = bias[co] (or 0), a broadcast copy
    const src =
      bias === null
        ? { region: { ptr: ptr(ZERO) as Pointer, bytes: 4 }, strides: [0, 0, 0, 0] }
        : { region: host.viewRegion(bias), strides: [0, bias.strides[0] as number, 0, 0] };
    return produce(host, op, shape, "f32", x.name, (out, t) =>
      copyStrided(host.ctx, src.region, src.strides, out, t.strides, shape, 4, op),
    );
  }
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const wr = s.contiguous(weight);
    const br = s.optional(bias);
    return produce(host, op, shape, "f32", x.name, (out) =>
      conv2dF32(host.ctx, xr, wr, br, out, { batch, cIn, h, w, cOut, kh, kw, stride, padding }),
    );
  });
}
