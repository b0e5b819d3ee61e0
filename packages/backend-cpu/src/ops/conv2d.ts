/**
 * 2-D convolution of the cpu backend (cross-correlation with zero padding, as
 * torch.nn.functional.conv2d): x [batch, C_in, H, W], weight [C_out, C_in, kh, kw], bias [C_out] or
 * null, all f32 → [batch, C_out, H', W'] with H' = ⌊(H + 2·ph − kh) / sh⌋ + 1. Strided inputs are
 * copied first. Kernel: native/cpu/conv2d.c (im2col in blocks + a blocked f32 GEMM).
 */
import { type Conv2dOptions, formatShape, type Tensor } from "@tp/tensor";
import { argError, type CpuOpHost, checkTensors, produce, scoped, shapeError, shown } from "./common.ts";
import { conv2dF32 } from "./native.ts";

function pair(op: string, name: string, v: unknown, fallback: number, lo: number): [number, number] {
  const p = v === undefined ? [fallback, fallback] : typeof v === "number" ? [v, v] : v;
  if (
    !Array.isArray(p) ||
    p.length !== 2 ||
    !p.every((n) => typeof n === "number" && Number.isInteger(n) && n >= lo && n < 2 ** 31)
  ) {
    throw argError(op, `${name} must be an integer >= ${lo} or a pair of them, got ${JSON.stringify(v)}`);
  }
  return [p[0] as number, p[1] as number];
}

/**
 * conv2d(x, weight) + bias with `options.stride` and `options.padding` (a number or [h, w]; default 1
 * and 0) → [batch, C_out, H', W'] f32.
 * @throws TpError E_SHAPE naming the shapes when ranks, channels or bias do not fit or the kernel is
 *   larger than the padded input; E_ARG for a bad stride or padding; E_STATE, E_UNSUPPORTED (not f32)
 */
export function conv2d(
  host: CpuOpHost,
  x: Tensor,
  weight: Tensor,
  bias: Tensor | null,
  options: Conv2dOptions = {},
): Tensor {
  const op = "conv2d";
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
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const wr = s.contiguous(weight);
    const br = s.optional(bias);
    return produce(host, op, [batch, cOut, oh, ow], "f32", x.name, (out) =>
      conv2dF32(host.ctx, xr, wr, br, out, { batch, cIn, h, w, cOut, kh, kw, oh, ow, stride, padding }),
    );
  });
}
