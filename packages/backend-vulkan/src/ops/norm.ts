/**
 * The normalisations of the vulkan backend — rms_norm, layer_norm, group_norm (shaders/<op>.comp) —
 * one workgroup per row (or per group), f32 statistics with tree sums; layer_norm and group_norm take
 * the mean of values shifted by the row's first value (shaders/norm.glsl), so a large common offset
 * does not cost precision. Strided inputs are copied to contiguous scratch first. Kernel-table
 * entries: arguments arrive checked (@tp/tensor's op front-end).
 */
import { type KernelSignatures, numel, type Tensor } from "@tp/tensor";
import type { Binding } from "../ffi.ts";
import { dispatchGroups, Push, type VkKernel, type VkOpHost } from "./common.ts";
import { contiguous } from "./layout.ts";

/** A parameter vector (weight or bias, contiguous): its binding and offset, or `fallback` with has = 0. */
function param(host: VkOpHost, op: string, t: Tensor | null, fallback: Binding) {
  if (t === null) return { binding: fallback, offset: 0, has: 0 };
  return { ...host.bind(contiguous(host, op, t), op), has: 1 };
}

/**
 * The bindings of a norm kernel: x (a contiguous copy in the current scope when strided), weight and
 * bias (x's binding with has = 0 where absent) and out; `bindings` in the shaders' order.
 */
function operands(
  host: VkOpHost,
  op: string,
  out: Tensor,
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
) {
  const a = host.bind(contiguous(host, op, x), op);
  const w = param(host, op, weight, a.binding);
  const b = param(host, op, bias, a.binding);
  const y = host.bind(out, op);
  return { a, w, b, bindings: [y.binding, a.binding, w.binding, b.binding] };
}

/**
 * The rest of a layer_norm or group_norm kernel once `push` holds the shape fields that open its block:
 * x, weight and bias bound in a scope, the fields every such block ends with (x, weight and bias
 * offsets, eps, has_weight, has_bias: shaders/layer_norm.comp, group_norm.comp), one workgroup per row.
 */
function affineNorm(
  host: VkOpHost,
  op: "layer_norm" | "group_norm",
  push: Push,
  out: Tensor,
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
  eps: number,
  rows: number,
): void {
  host.scope(() => {
    const { a, w, b, bindings } = operands(host, op, out, x, weight, bias);
    push.u32(a.offset).u32(w.offset).u32(b.offset).f32(eps).u32(w.has).u32(b.has);
    dispatchGroups(host, op, op, [host.workgroup], bindings, push, rows);
  });
}

/**
 * rms_norm over the last dimension ({@link KernelSignatures.rms_norm}): x / sqrt(mean(x²) + eps) · g,
 * g = weight, 1 + weight (`unitOffset`), or 1 (null weight). Source: Zhang & Sennrich 2019.
 */
export const rmsNorm: VkKernel<"rms_norm"> = (host, out, x, weight, eps, unitOffset) => {
  const op = "rms_norm";
  if (x.numel === 0) return;
  const d = x.shape[x.rank - 1] as number;
  const rows = x.numel / d;
  host.scope(() => {
    const { a, w, bindings } = operands(host, op, out, x, weight, null);
    const push = new Push(28)
      .u32(rows)
      .u32(d)
      .u32(a.offset)
      .u32(w.offset)
      .f32(eps)
      .u32(w.has)
      .u32(unitOffset ? 1 : 0);
    dispatchGroups(host, op, "rms_norm", [host.workgroup], bindings.slice(0, 3), push, rows);
  });
};

/**
 * layer_norm over the last dimension, biased variance ({@link KernelSignatures.layer_norm}).
 * Source: Ba et al. 2016.
 */
export const layerNorm: VkKernel<"layer_norm"> = (host, out, x, weight, bias, eps) => {
  if (x.numel === 0) return;
  const d = x.shape[x.rank - 1] as number;
  const rows = x.numel / d;
  affineNorm(host, "layer_norm", new Push(32).u32(rows).u32(d), out, x, weight, bias, eps, rows);
};

/** group_norm of x [batch, channels, ...spatial] ({@link KernelSignatures.group_norm}). Source: Wu & He 2018. */
export const groupNorm: VkKernel<"group_norm"> = (host, out, x, groups, weight, bias, eps) => {
  if (x.numel === 0) return;
  const [batch, channels] = x.shape as [number, number];
  const spatial = numel(x.shape.slice(2));
  const cpg = channels / groups;
  const rows = batch * groups;
  const push = new Push(44)
    .u32(rows)
    .u32(cpg * spatial)
    .u32(spatial)
    .u32(cpg)
    .u32(groups);
  affineNorm(host, "group_norm", push, out, x, weight, bias, eps, rows);
};
