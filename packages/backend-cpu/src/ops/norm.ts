/**
 * Normalisations of the cpu backend on f32: rmsNorm (with the `1 + weight` convention as an option),
 * layerNorm (affine parts optional) and groupNorm. Strided inputs are copied first. Semantics:
 * @tp/tensor `Backend`; kernels: native/cpu/norm.c.
 */
import { formatShape, type Tensor } from "@tp/tensor";
import {
  argError,
  booleanOption,
  type CpuOpHost,
  checkTensors,
  finite,
  produce,
  scoped,
  shapeError,
  shown,
} from "./common.ts";
import { groupNormF32, layerNormF32, rmsNormF32 } from "./native.ts";

const F32 = ["f32"] as const;

function eps(op: string, v: unknown): number {
  const e = finite(op, "eps", v);
  if (e < 0) throw argError(op, `eps must be >= 0, got ${e}`);
  return e;
}

/** x: [..., D] with D ≥ 1, and the affine tensors (weight, bias; null when absent) [D]. */
function lastDim(op: string, x: Tensor, weight: Tensor | null, bias: Tensor | null = null): number {
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs at least one dimension`);
  const d = x.shape[x.rank - 1] as number;
  affineDim(op, x, d, weight, "weight");
  affineDim(op, x, d, bias, "bias");
  return d;
}

function affineDim(op: string, x: Tensor, d: number, t: Tensor | null, name: string): void {
  if (t !== null && (t.rank !== 1 || t.shape[0] !== d)) {
    throw shapeError(op, `${shown(t, name)} must be [${d}], the last dimension of x ${formatShape(x.shape)}`);
  }
}

/**
 * RMSNorm over the last dimension; weight [D] or null; `unitOffset` (a boolean, default false) scales
 * by 1 + weight.
 * @throws TpError E_SHAPE naming x and weight; E_ARG naming the option for a bad eps or a unitOffset
 *   that is not a boolean; E_STATE, E_UNSUPPORTED (not f32)
 */
export function rmsNorm(
  host: CpuOpHost,
  x: Tensor,
  weight: Tensor | null,
  options: { eps: number; unitOffset?: boolean },
): Tensor {
  const op = "rms_norm";
  checkTensors(host, op, F32, { x, weight });
  const d = lastDim(op, x, weight);
  const e = eps(op, options?.eps);
  const unitOffset = booleanOption(op, "unitOffset", options.unitOffset, false);
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const wr = s.optional(weight);
    return produce(host, op, x.shape, "f32", x.name, (out) =>
      rmsNormF32(host.ctx, xr, wr, out, d === 0 ? 0 : x.numel / d, d, e, unitOffset),
    );
  });
}

/**
 * LayerNorm over the last dimension (biased variance); weight, bias [D] or null.
 * @throws TpError E_SHAPE naming the shapes; E_ARG for a bad eps; E_STATE, E_UNSUPPORTED (not f32)
 */
export function layerNorm(
  host: CpuOpHost,
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
  options: { eps: number },
): Tensor {
  const op = "layer_norm";
  checkTensors(host, op, F32, { x, weight, bias });
  const d = lastDim(op, x, weight, bias);
  const e = eps(op, options?.eps);
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const wr = s.optional(weight);
    const br = s.optional(bias);
    return produce(host, op, x.shape, "f32", x.name, (out) =>
      layerNormF32(host.ctx, xr, wr, br, out, d === 0 ? 0 : x.numel / d, d, e),
    );
  });
}

/**
 * GroupNorm of x [batch, channels, ...spatial] over (channels of a group × spatial); weight, bias
 * [channels] or null.
 * @throws TpError E_SHAPE when x has fewer than 2 dimensions, groups does not divide channels, or an
 *   affine tensor is not [channels]; E_ARG for bad groups or eps; E_STATE, E_UNSUPPORTED (not f32)
 */
export function groupNorm(
  host: CpuOpHost,
  x: Tensor,
  groups: number,
  weight: Tensor | null,
  bias: Tensor | null,
  options: { eps: number },
): Tensor {
  const op = "group_norm";
  checkTensors(host, op, F32, { x, weight, bias });
  if (x.rank < 2) throw shapeError(op, `x ${formatShape(x.shape)} must be [batch, channels, ...spatial]`);
  const [batch, channels] = x.shape as [number, number];
  if (!Number.isSafeInteger(groups) || groups < 1)
    throw argError(op, `groups must be a positive integer, got ${groups}`);
  if (channels % groups !== 0) {
    throw shapeError(
      op,
      `${channels} channels of x ${formatShape(x.shape)} do not split into ${groups} groups`,
    );
  }
  for (const [name, t] of Object.entries({ weight, bias })) {
    if (t !== null && (t.rank !== 1 || t.shape[0] !== channels)) {
      throw shapeError(
        op,
        `${shown(t, name)} must be [${channels}], the channels of x ${formatShape(x.shape)}`,
      );
    }
  }
  const e = eps(op, options?.eps);
  const spatial = x.shape.slice(2).reduce((a, b) => a * b, 1);
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const wr = s.optional(weight);
    const br = s.optional(bias);
    return produce(host, op, x.shape, "f32", x.name, (out) =>
      groupNormF32(host.ctx, xr, wr, br, out, { batch, channels, spatial, groups }, e),
    );
  });
}
