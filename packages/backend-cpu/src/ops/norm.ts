/**
 * The normalisation kernels of the cpu backend on f32: rms_norm (with the `1 + weight` convention),
 * layer_norm (affine parts optional) and group_norm. Strided inputs are copied first. Arguments are
 * checked by @tp/tensor's front-end; kernels: native/cpu/norm.c.
 */
import type { DTypeName, KernelSignatures, KernelTable, Tensor } from "@tp/tensor";
import { type CpuOpHost, onDense, optionalRegion, region, strided } from "./common.ts";
import { groupNormF32, layerNormF32, rmsNormF32 } from "./native.ts";

const F32: readonly DTypeName[] = ["f32"];

/** Rows of D values in x [..., D] (0 when D is 0). */
function rowsOf(x: Tensor, d: number): number {
  return d === 0 ? 0 : x.numel / d;
}

/** The kernel-table entries of the normalisations (f32). */
export function normKernels(host: CpuOpHost): Pick<KernelTable, "rms_norm" | "layer_norm" | "group_norm"> {
  const rmsNorm: KernelSignatures["rms_norm"] = (out, x, weight, eps, unitOffset) => {
    const op = "rms_norm";
    if (strided(x, weight)) {
      onDense(host, op, x, weight, null, (x, weight) => rmsNorm(out, x, weight, eps, unitOffset));
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
  };

  const layerNorm: KernelSignatures["layer_norm"] = (out, x, weight, bias, eps) => {
    const op = "layer_norm";
    if (strided(x, weight, bias)) {
      onDense(host, op, x, weight, bias, (x, weight, bias) => layerNorm(out, x, weight, bias, eps));
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
  };

  const groupNorm: KernelSignatures["group_norm"] = (out, x, groups, weight, bias, eps) => {
    const op = "group_norm";
    if (strided(x, weight, bias)) {
      onDense(host, op, x, weight, bias, (x, weight, bias) => groupNorm(out, x, groups, weight, bias, eps));
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
  };

  return {
    rms_norm: { dtypes: F32, run: rmsNorm },
    layer_norm: { dtypes: F32, run: layerNorm },
    group_norm: { dtypes: F32, run: groupNorm },
  };
}
