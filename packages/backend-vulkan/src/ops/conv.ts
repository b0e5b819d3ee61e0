/**
 * conv2d of the vulkan backend (shaders/conv2d.comp): direct cross-correlation with zero padding and
 * strides, one invocation per output element, as torch.nn.functional.conv2d. Kernel-table entry:
 * arguments arrive checked (@tp/tensor's op front-end).
 */
import type { KernelSignatures } from "@tp/tensor";
import { dispatch1d, Push, type VkKernel } from "./common.ts";
import { contiguous } from "./layout.ts";

/**
 * 2-D convolution ({@link KernelSignatures.conv2d}) into out [batch, C_out, H', W'],
 * H' = ⌊(H + 2·ph − kh) / sh⌋ + 1.
 */
export const conv2d: VkKernel<"conv2d"> = (host, out, x, weight, bias, stride, padding) => {
  const op = "conv2d";
  if (out.numel === 0) return;
  const [, cin, h, w] = x.shape as [number, number, number, number];
  const [cout, , kh, kw] = weight.shape as [number, number, number, number];
  const [, , oh, ow] = out.shape as [number, number, number, number];
  const [sh, sw] = stride;
  const [ph, pw] = padding;
  host.scope(() => {
    const a = host.bind(contiguous(host, op, x), op);
    const wt = host.bind(contiguous(host, op, weight), op);
    const b = bias === null ? null : host.bind(contiguous(host, op, bias), op);
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
    const bindings = [y.binding, a.binding, wt.binding, (b ?? a).binding];
    dispatch1d(host, op, "conv2d", [], bindings, push, out.numel);
  });
};
