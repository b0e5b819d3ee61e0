/**
 * The normalisation kernels of the cpu backend on f32: rms_norm (with the `1 + weight` convention),
 * layer_norm (affine parts optional) and group_norm. Strided inputs are copied first. Arguments are
 * checked by @tp/tensor's front-end; kernels: native/cpu/norm.c.
 */
import type { DTypeName, KernelTable, Tensor } from "@tp/tensor";
import { type CpuOpHost, dense, denseOrNull, optionalRegion, region, strided } from "./common.ts";
import { groupNormF32, layerNormF32, rmsNormF32 } from "./native.ts";

const F32: readonly DTypeName[] = ["f32"];

/** Rows of D values in x [..., D] (0 when D is 0). */
function rowsOf(x: Tensor, d: number): number {
  return d === 0 ? 0 : x.numel / d;
}

function rmsNorm(
  host: CpuOpHost,
  out: Tensor,
  x: Tensor,
  weight: Tensor | null,
  eps: number,
  unitOffset: boolean,
): void {
  const op = "rms_norm";
  if (strided(x, weight)) {
    host.scope(() => rmsNorm(host, out, dense(host, x, op), denseOrNull(host, weight, op), eps, unitOffset));
    return;
  }
  const d = x.shape[x.rank - 1] as number;
  rmsNormF32(
    host.ctx,
    region(host, x, op),
    optionalRegion(host, weight, op),
    region(host, out, op),
    rowsOf(x, d),
    d,
    eps,
    unitOffset,
  );
}

function layerNorm(
  host: CpuOpHost,
  out: Tensor,
  x: Tensor,
  weight: Tensor | null,
  bias: Tensor | null,
  eps: number,
): void {
  const op = "layer_norm";
  if (strided(x, weight, bias)) {
    host.scope(() =>
      layerNorm(
        host,
        out,
        dense(host, x, op),
        denseOrNull(host, weight, op),
        denseOrNull(host, bias, op),
        eps,
      ),
    );
    return;
  }
  const d = x.shape[x.rank - 1] as number;
  layerNormF32(
    host.ctx,
    region(host, x, op),
    optionalRegion(host, weight, op),
    optionalRegion(host, bias, op),
    region(host, out, op),
    rowsOf(x, d),
    d,
    eps,
  );
}

function groupNorm(
  host: CpuOpHost,
  out: Tensor,
  x: Tensor,
  groups: number,
  weight: Tensor | null,
  bias: Tensor | null,
  eps: number,
): void {
  const op = "group_norm";
  if (strided(x, weight, bias)) {
    host.scope(() =>
      groupNorm(
        host,
        out,
        dense(host, x, op),
        groups,
        denseOrNull(host, weight, op),
        denseOrNull(host, bias, op),
        eps,
      ),
    );
    return;
  }
  const [batch, channels] = x.shape as [number, number];
  let spatial = 1;
  for (let i = 2; i < x.rank; i++) spatial *= x.shape[i] as number;
  groupNormF32(
    host.ctx,
    region(host, x, op),
    optionalRegion(host, weight, op),
    optionalRegion(host, bias, op),
    region(host, out, op),
    { batch, channels, spatial, groups },
    eps,
  );
}

/** The kernel-table entries of the normalisations (f32). */
export function normKernels(host: CpuOpHost): Pick<KernelTable, "rms_norm" | "layer_norm" | "group_norm"> {
  return {
    rms_norm: { dtypes: F32, run: (out, x, w, eps, unitOffset) => rmsNorm(host, out, x, w, eps, unitOffset) },
    layer_norm: { dtypes: F32, run: (out, x, w, b, eps) => layerNorm(host, out, x, w, b, eps) },
    group_norm: { dtypes: F32, run: (out, x, g, w, b, eps) => groupNorm(host, out, x, g, w, b, eps) },
  };
}
