/**
 * The normalisations of the vulkan backend — rms_norm, layer_norm, group_norm (shaders/<op>.comp) —
 * one workgroup per row (or per group), f32 statistics with tree sums; layer_norm and group_norm take
 * the mean of values shifted by the row's first value (shaders/norm.glsl), so a large common offset
 * does not cost precision. Strided inputs are copied to contiguous scratch first.
 */
import { formatShape, numel, type Tensor } from "@tp/tensor";
import type { Binding } from "../ffi.ts";
import {
  checkTensors,
  dispatchGroups,
  finite,
  integer,
  Push,
  produce,
  scoped,
  shapeError,
  type VkOpHost,
} from "./common.ts";
import { contiguous } from "./layout.ts";

/** A parameter vector [n] (weight or bias): its binding and offset, or `fallback` with has = 0. */
function param(host: VkOpHost, op: string, t: Tensor | null, n: number, what: string, fallback: Binding) {
  if (t === null) return { binding: fallback, offset: 0, has: 0 };
  if (t.rank !== 1 || t.shape[0] !== n) throw shapeError(op, `${what} ${formatShape(t.shape)} is not [${n}]`);
  return { ...host.bind(t, op), has: 1 };
}

/**
 * RMSNorm over the last dimension: x / sqrt(mean(x²) + eps) · g, g = weight, 1 + weight
 * (`unitOffset`), or 1 (null weight). x: [..., D] f32; weight: [D] f32.
 */
export function rmsNorm(
  host: VkOpHost,
  x: Tensor,
  weight: Tensor | null,
  options: { eps: number; unitOffset?: boolean },
): Tensor {
  const op = "rms_norm";
  checkTensors(host, op, ["f32"], { x, weight });
  const eps = finite(op, "eps", options?.eps);
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs a last dimension`);
  const d = x.shape[x.rank - 1] as number;
  return scoped(host, op, (s) =>
    produce(host, x.shape, "f32", x.name, (out) => {
      if (x.numel === 0) return;
      const w0 = weight === null ? null : contiguous(host, s, weight);
      const src = contiguous(host, s, x);
      const a = host.bind(src, op);
      const w = param(host, op, w0, d, "weight", a.binding);
      const y = host.bind(out, op);
      const rows = x.numel / d;
      const push = new Push(28)
        .u32(rows)
        .u32(d)
        .u32(a.offset)
        .u32(w.offset)
        .f32(eps)
        .u32(w.has)
        .u32(options.unitOffset ? 1 : 0);
      dispatchGroups(host, op, "rms_norm", [host.workgroup], [y.binding, a.binding, w.binding], push, rows);
    }),
  );
}

/** LayerNorm over the last dimension (biased variance), weight and bias [D] optional. */
export function layerNorm(
  host: VkOpHost,
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
  options: { eps: number },
): Tensor {
  const op = "layer_norm";
  checkTensors(host, op, ["f32"], { x, weight, bias });
  const eps = finite(op, "eps", options?.eps);
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs a last dimension`);
  const d = x.shape[x.rank - 1] as number;
  return scoped(host, op, (s) =>
    produce(host, x.shape, "f32", x.name, (out) => {
      if (x.numel === 0) return;
      const src = contiguous(host, s, x);
      const a = host.bind(src, op);
      const w = param(host, op, weight === null ? null : contiguous(host, s, weight), d, "weight", a.binding);
      const b = param(host, op, bias === null ? null : contiguous(host, s, bias), d, "bias", a.binding);
      const y = host.bind(out, op);
      const rows = x.numel / d;
      const push = new Push(32)
        .u32(rows)
        .u32(d)
        .u32(a.offset)
        .u32(w.offset)
        .u32(b.offset)
        .f32(eps)
        .u32(w.has)
        .u32(b.has);
      dispatchGroups(
        host,
        op,
        "layer_norm",
        [host.workgroup],
        [y.binding, a.binding, w.binding, b.binding],
        push,
        rows,
      );
    }),
  );
}

/**
 * GroupNorm of x [batch, channels, ...spatial] with `groups` groups; weight and bias [channels]
 * optional. @throws TpError E_SHAPE when channels is not a multiple of groups
 */
export function groupNorm(
  host: VkOpHost,
  x: Tensor,
  groups: number,
  weight: Tensor | null,
  bias: Tensor | null,
  options: { eps: number },
): Tensor {
  const op = "group_norm";
  checkTensors(host, op, ["f32"], { x, weight, bias });
  const eps = finite(op, "eps", options?.eps);
  if (x.rank < 2) throw shapeError(op, `x ${formatShape(x.shape)} is not [batch, channels, ...]`);
  const [batch, channels] = x.shape as [number, number];
  integer(op, "groups", groups, 1);
  if (channels % groups !== 0)
    throw shapeError(op, `${channels} channels do not split into ${groups} groups`);
  const spatial = numel(x.shape.slice(2));
  const cpg = channels / groups;
  return scoped(host, op, (s) =>
    produce(host, x.shape, "f32", x.name, (out) => {
      if (x.numel === 0) return;
      const src = contiguous(host, s, x);
      const a = host.bind(src, op);
      const w = param(
        host,
        op,
        weight === null ? null : contiguous(host, s, weight),
        channels,
        "weight",
        a.binding,
      );
      const b = param(
        host,
        op,
        bias === null ? null : contiguous(host, s, bias),
        channels,
        "bias",
        a.binding,
      );
      const y = host.bind(out, op);
      const rows = batch * groups;
      const push = new Push(44)
        .u32(rows)
        .u32(cpg * spatial)
        .u32(spatial)
        .u32(cpg)
        .u32(groups)
        .u32(a.offset)
        .u32(w.offset)
        .u32(b.offset)
        .f32(eps)
        .u32(w.has)
        .u32(b.has);
      dispatchGroups(
        host,
        op,
        "group_norm",
        [host.workgroup],
        [y.binding, a.binding, w.binding, b.binding],
        push,
        rows,
      );
    }),
  );
}
