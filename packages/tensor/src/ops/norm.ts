/**
 * The front-end of the normalisations: rms_norm, layer_norm, group_norm. Checks (E_STATE, E_UNSUPPORTED
 * dtype, E_SHAPE naming x and the affine tensor, E_ARG naming eps / groups / unitOffset), then the
 * kernel on a new output of x's shape. Semantics and sources: `Backend` in ../backend.ts.
 */

import type { OpName } from "../backend.ts";
import type { KernelEntry } from "../kernels.ts";
import { booleanOption, epsOption, integerOption, opError } from "../op-args.ts";
import { formatShape } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { checkInput, kernel, type OpHost, run, shown } from "./common.ts";

/** t is null or [n]; else E_SHAPE naming t and x. */
function affine(host: OpHost, op: string, x: Tensor, n: number, t: Tensor | null, name: string, of: string) {
  if (t !== null && (t.rank !== 1 || t.shape[0] !== n)) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${shown(t, name)} must be [${n}], the ${of} of x ${formatShape(x.shape)}`,
    );
  }
}

/** x, weight and bias (each checked when not null) as inputs of the entry. */
function checkInputs(
  host: OpHost,
  op: OpName,
  k: KernelEntry<unknown>,
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
): void {
  checkInput(host, op, k, x, "x");
  checkInput(host, op, k, weight, "weight");
  checkInput(host, op, k, bias, "bias");
}

/** The last dimension D of x (rank ≥ 1, else E_SHAPE). */
function lastDim(host: OpHost, op: string, x: Tensor): number {
  if (x.rank < 1)
    throw opError("E_SHAPE", host.name, op, `x ${formatShape(x.shape)} needs at least one dimension`);
  return x.shape[x.rank - 1] as number;
}

/**
 * RMSNorm over the last dimension (Backend.rmsNorm). x: [..., D]; weight: [D] or null.
 * @throws TpError E_UNSUPPORTED (no kernel, or a dtype it lacks); E_STATE; E_SHAPE naming x and weight;
 *   E_ARG for a bad eps or a unitOffset that is not a boolean
 */
export function rmsNorm(
  host: OpHost,
  x: Tensor,
  w: Tensor | null,
  options: { eps: number; unitOffset?: boolean },
): Tensor {
  const op = "rms_norm";
  const k = kernel(host, op);
  const weight = w ?? null;
  checkInput(host, op, k, x, "x");
  checkInput(host, op, k, weight, "weight");
  affine(host, op, x, lastDim(host, op, x), weight, "weight", "last dimension");
  const eps = epsOption(host.name, op, options?.eps);
  const unitOffset = booleanOption(host.name, op, "unitOffset", options?.unitOffset, false);
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, weight, eps, unitOffset);
}

/**
 * LayerNorm over the last dimension (Backend.layerNorm). x: [..., D]; weight, bias: [D] or null.
 * @throws TpError E_UNSUPPORTED; E_STATE; E_SHAPE naming the shapes; E_ARG for a bad eps
 */
export function layerNorm(
  host: OpHost,
  x: Tensor,
  w: Tensor | null,
  b: Tensor | null,
  options: { eps: number },
): Tensor {
  const op = "layer_norm";
  const k = kernel(host, op);
  const weight = w ?? null;
  const bias = b ?? null;
  checkInputs(host, op, k, x, weight, bias);
  const d = lastDim(host, op, x);
  affine(host, op, x, d, weight, "weight", "last dimension");
  affine(host, op, x, d, bias, "bias", "last dimension");
  const eps = epsOption(host.name, op, options?.eps);
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, weight, bias, eps);
}

/**
 * GroupNorm (Backend.groupNorm). x: [batch, channels, ...spatial]; weight, bias: [channels] or null.
 * @throws TpError E_UNSUPPORTED; E_STATE; E_SHAPE when x has fewer than 2 dimensions, groups does not
 *   divide channels, or an affine tensor is not [channels]; E_ARG for bad groups or eps
 */
export function groupNorm(
  host: OpHost,
  x: Tensor,
  groups: number,
  w: Tensor | null,
  b: Tensor | null,
  options: { eps: number },
): Tensor {
  const op = "group_norm";
  const k = kernel(host, op);
  const weight = w ?? null;
  const bias = b ?? null;
  checkInputs(host, op, k, x, weight, bias);
  if (x.rank < 2) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `x ${formatShape(x.shape)} must be [batch, channels, ...spatial]`,
    );
  }
  const channels = x.shape[1] as number;
  const g = integerOption(host.name, op, "groups", groups, 1);
  if (channels % g !== 0) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${channels} channels of x ${formatShape(x.shape)} do not split into ${g} groups`,
    );
  }
  affine(host, op, x, channels, weight, "weight", "channels");
  affine(host, op, x, channels, bias, "bias", "channels");
  const eps = epsOption(host.name, op, options?.eps);
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, g, weight, bias, eps);
}
