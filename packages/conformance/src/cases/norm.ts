/**
 * Cases of rms_norm (with / without weight, the 1 + weight convention, per-head shapes), layer_norm
 * (affine parts optional, a large mean) and group_norm (VAE-like shapes, one group, one channel per
 * group).
 */
import type { Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian } from "../data.ts";
import { numelOf } from "../host.ts";
import { groupNormRef, layerNormRef, rmsNormRef } from "../reference/index.ts";
import { NORM } from "../tolerances.ts";

function f32(
  name: string,
  shape: readonly number[],
  data: Float32Array,
  view?: InputSpec["view"],
): InputSpec {
  return { name, dtype: "f32", shape, data, ...(view ? { view } : {}) };
}

function rmsCases(): ConformanceCase[] {
  const cases: { shape: number[]; weight: boolean; unit?: boolean; eps: number; view?: InputSpec["view"] }[] =
    [
      { shape: [1, 64], weight: true, eps: 1e-6 },
      { shape: [5, 127], weight: false, eps: 1e-5 },
      { shape: [3, 128], weight: true, unit: true, eps: 1e-5 },
      { shape: [2, 7, 4, 16], weight: true, eps: 1e-6 }, // per-head QK-norm: [batch, seq, heads, head_dim]
      { shape: [40, 1000], weight: true, eps: 1e-6 },
      { shape: [16, 8], weight: true, eps: 1e-6, view: { kind: "permute", perm: [1, 0] } },
    ];
  return cases.map(({ shape, weight, unit, eps, view }, i) => {
    const d = shape[shape.length - 1] as number;
    const inputs = [f32("x", shape, gaussian(700 + i, numelOf(shape), 2, 0.3), view)];
    if (weight) inputs.push(f32("weight", [d], gaussian(710 + i, d, 0.5, unit ? 0 : 1)));
    return defineCase({
      op: "rms_norm",
      name: `rms_norm [${shape}]${weight ? (unit ? " weight (1 + w)" : " weight") : ""} eps ${eps}${view ? " (permuted view)" : ""}`,
      tolerance: NORM,
      inputs,
      call: (b, [x, w]) => b.rmsNorm(x as Tensor, w ?? null, { eps, unitOffset: unit === true }),
      reference: ([x, w]) => [
        { shape, dtype: "f32", data: rmsNormRef(x as never, w ? (w.data as Float32Array) : null, eps, unit) },
      ],
    });
  });
}

function layerCases(): ConformanceCase[] {
  const cases: { shape: number[]; w: boolean; b: boolean; mean?: number; view?: InputSpec["view"] }[] = [
    { shape: [4, 33], w: true, b: true },
    { shape: [2, 3, 64], w: false, b: false },
    { shape: [1, 6144], w: true, b: false },
    { shape: [3, 50], w: true, b: true, mean: 1000 },
    { shape: [9, 4], w: false, b: true, view: { kind: "stride2" } },
  ];
  return cases.map(({ shape, w, b, mean, view }, i) => {
    const d = shape[shape.length - 1] as number;
    const inputs = [f32("x", shape, gaussian(800 + i, numelOf(shape), 1.5, mean ?? 0), view)];
    if (w) inputs.push(f32("weight", [d], gaussian(810 + i, d, 0.3, 1)));
    if (b) inputs.push(f32("bias", [d], gaussian(820 + i, d, 0.3)));
    return defineCase({
      op: "layer_norm",
      name: `layer_norm [${shape}]${w ? " weight" : ""}${b ? " bias" : ""}${mean ? ` mean ${mean}` : ""}${view ? " (strided view)" : ""}`,
      tolerance: NORM,
      inputs,
      call: (bk, [x, ...rest]) =>
        bk.layerNorm(x as Tensor, w ? (rest[0] as Tensor) : null, b ? (rest[w ? 1 : 0] as Tensor) : null, {
          eps: 1e-6,
        }),
      reference: ([x, ...rest]) => [
        {
          shape,
          dtype: "f32",
          data: layerNormRef(
            x as never,
            w ? (rest[0]?.data as Float32Array) : null,
            b ? (rest[w ? 1 : 0]?.data as Float32Array) : null,
            1e-6,
          ),
        },
      ],
    });
  });
}

function groupCases(): ConformanceCase[] {
  const cases: { shape: number[]; groups: number; affine: boolean }[] = [
    { shape: [2, 8, 5, 7], groups: 4, affine: true },
    { shape: [1, 6, 33], groups: 3, affine: false },
    { shape: [1, 32, 16, 16], groups: 32, affine: true },
    { shape: [1, 4, 3], groups: 1, affine: true },
    { shape: [1, 64, 40, 40], groups: 32, affine: true },
  ];
  return cases.map(({ shape, groups, affine }, i) => {
    const c = shape[1] as number;
    const inputs = [f32("x", shape, gaussian(900 + i, numelOf(shape), 2, 0.5))];
    if (affine)
      inputs.push(f32("weight", [c], gaussian(910 + i, c, 0.3, 1)), f32("bias", [c], gaussian(920 + i, c)));
    return defineCase({
      op: "group_norm",
      name: `group_norm [${shape}] ${groups} groups${affine ? " affine" : ""}`,
      tolerance: NORM,
      inputs,
      call: (b, [x, w, bb]) => b.groupNorm(x as Tensor, groups, w ?? null, bb ?? null, { eps: 1e-6 }),
      reference: ([x, w, bb]) => [
        {
          shape,
          dtype: "f32",
          data: groupNormRef(
            x as never,
            groups,
            w ? (w.data as Float32Array) : null,
            bb ? (bb.data as Float32Array) : null,
            1e-6,
          ),
        },
      ],
    });
  });
}

/** Every normalisation case. */
export function normCases(): ConformanceCase[] {
  return [...rmsCases(), ...layerCases(), ...groupCases()];
}
