/**
 * conv2d of the vulkan backend (shaders/conv2d.comp): direct cross-correlation with zero padding and
 * strides, one invocation per output element, as torch.nn.functional.conv2d.
 */
import { type Conv2dOptions, formatShape, type Tensor } from "@tp/tensor";
import {
  checkTensors,
  dispatch1d,
  integer,
  Push,
  produce,
  scoped,
  shapeError,
  type VkOpHost,
} from "./common.ts";
import { contiguous } from "./layout.ts";

function pair(
  op: string,
  name: string,
  v: number | readonly [number, number] | undefined,
  dflt: number,
  lo: number,
) {
  const p = v === undefined ? [dflt, dflt] : typeof v === "number" ? [v, v] : v;
  if (!Array.isArray(p) || p.length !== 2) throw shapeError(op, `${name} must be a number or [h, w]`);
  return [integer(op, name, p[0], lo), integer(op, name, p[1], lo)] as [number, number];
}

/**
 * 2-D convolution. x: [batch, C_in, H, W]; weight: [C_out, C_in, kh, kw]; bias: [C_out] or null →
 * [batch, C_out, H', W'] with H' = ⌊(H + 2·ph − kh) / sh⌋ + 1.
 * @throws TpError E_SHAPE for shapes that do not fit; E_ARG for a bad stride or padding
 */
export function conv2d(
  host: VkOpHost,
  x: Tensor,
  weight: Tensor,
  bias: Tensor | null,
  options: Conv2dOptions = {},
): Tensor {
  const op = "conv2d";
  checkTensors(host, op, ["f32"], { x, weight, bias });
  const [sh, sw] = pair(op, "stride", options?.stride, 1, 1);
  const [ph, pw] = pair(op, "padding", options?.padding, 0, 0);
  if (x.rank !== 4 || weight.rank !== 4) {
    throw shapeError(op, `x ${formatShape(x.shape)} and weight ${formatShape(weight.shape)} must be 4-D`);
  }
  const [n, cin, h, w] = x.shape as [number, number, number, number];
  const [cout, wcin, kh, kw] = weight.shape as [number, number, number, number];
  if (wcin !== cin)
    throw shapeError(op, `weight ${formatShape(weight.shape)} does not take ${cin} input channels`);
  if (bias !== null && (bias.rank !== 1 || bias.shape[0] !== cout)) {
    throw shapeError(op, `bias ${formatShape(bias.shape)} is not [${cout}]`);
  }
  const oh = Math.floor((h + 2 * ph - kh) / sh) + 1;
  const ow = Math.floor((w + 2 * pw - kw) / sw) + 1;
  if (oh < 0 || ow < 0 || kh === 0 || kw === 0) {
    throw shapeError(
      op,
      `kernel ${kh}×${kw} does not fit x ${formatShape(x.shape)} with padding [${ph}, ${pw}]`,
    );
  }
  return scoped(host, op, (s) =>
    produce(host, [n, cout, oh, ow], "f32", undefined, (out) => {
      if (out.numel === 0) return;
      const a = host.bind(contiguous(host, s, x), op);
      const wt = host.bind(contiguous(host, s, weight), op);
      const b = bias === null ? null : host.bind(contiguous(host, s, bias), op);
      const y = host.bind(out, op);
      const push = new Push(68)
        .u32(out.numel)
        .u32(cin)
        .u32(h)
        .u32(w)
        .u32(cout)
        .u32(kh)
        .u32(kw)
        .u32(oh)
        .u32(ow)
        .u32(sh)
        .u32(sw)
        .u32(ph)
        .u32(pw)
        .u32(a.offset)
        .u32(wt.offset)
        .u32(b?.offset ?? 0)
        .u32(b === null ? 0 : 1);
      dispatch1d(
        host,
        op,
        "conv2d",
        [],
        [y.binding, a.binding, wt.binding, (b ?? a).binding],
        push,
        out.numel,
      );
    }),
  );
}
