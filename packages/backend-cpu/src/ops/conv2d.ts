/**
 * The 2-D convolution kernel of the cpu backend (cross-correlation with zero padding, as
 * torch.nn.functional.conv2d) on f32: x [batch, C_in, H, W], weight [C_out, C_in, kh, kw], bias
 * [C_out] or null → [batch, C_out, H', W']. Strided inputs are copied first. Arguments are checked by
 * @tp/tensor's front-end; kernel: native/cpu/conv2d.c (im2col in blocks + a blocked f32 GEMM).
 *
 * An empty x with a non-empty output (C_in = 0, or H or W = 0 with enough padding for the kernel)
 * sums no terms, or only the zeros of the padding: every output element is its channel's bias (0
 * without one), as the kernel's own C_in = 0 case computes it. That output is written here by the copy
 * kernel (bias broadcast), since the convolution kernel takes no empty x.
 */
import { ptr } from "bun:ffi";
import type { KernelSignatures, KernelTable } from "@tp/tensor";
import type { Pointer } from "../ffi.ts";
import { type CpuOpHost, onDense, optionalRegion, region, strided } from "./common.ts";
import { conv2dF32, copyStrided } from "./native.ts";

/** One f32 zero: the source of the output of an empty x without a bias (read-only). */
const ZERO = new Float32Array(1);

/** The kernel-table entry of conv2d (f32). */
export function conv2dKernels(host: CpuOpHost): Pick<KernelTable, "conv2d"> {
  const conv2d: KernelSignatures["conv2d"] = (out, x, weight, bias, stride, padding) => {
    const op = "conv2d";
    if (x.numel === 0) {
      if (out.numel === 0) return;
      // no input terms: y[b, co, i, j] = bias[co] (or 0), a broadcast copy
      const src =
        bias === null
          ? { region: { ptr: ptr(ZERO) as Pointer, bytes: 4 }, strides: [0, 0, 0, 0] }
          : { region: host.viewRegion(bias), strides: [0, bias.strides[0] as number, 0, 0] };
      copyStrided(host.ctx, src.region, src.strides, region(host, out, op), out.strides, out.shape, 4, op);
      return;
    }
    if (strided(x, weight, bias)) {
      onDense(host, op, x, weight, bias, (x, weight, bias) => conv2d(out, x, weight, bias, stride, padding));
      return;
    }
    const [batch, cIn, h, w] = x.shape as [number, number, number, number];
    const [cOut, , kh, kw] = weight.shape as [number, number, number, number];
    conv2dF32(
      host.ctx,
      region(host, x, op),
      region(host, weight, op),
      optionalRegion(host, bias, op),
      region(host, out, op),
      {
        batch,
        cIn,
        h,
        w,
        cOut,
        kh,
        kw,
        stride,
        padding,
      },
    );
  };
  return { conv2d: { dtypes: ["f32"], run: conv2d } };
}
