/**
 * Cases of conv2d (3×3 with padding, 1×1, strides, asymmetric stride / padding, channel counts that
 * are not multiples of a register tile, more output positions than one task, K past one block, a
 * permuted input) and upsample_nearest2d.
 */
import type { Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian } from "../data.ts";
import { numelOf } from "../host.ts";
import { conv2dRef, upsampleNearest2dRef } from "../reference/index.ts";
import { CONV2D, EXACT } from "../tolerances.ts";

interface ConvCase {
  x: [number, number, number, number];
  cout: number;
  k: [number, number];
  stride: number | [number, number];
  padding: number | [number, number];
  bias: boolean;
  view?: InputSpec["view"];
}

const pair = (v: number | [number, number]): [number, number] => (typeof v === "number" ? [v, v] : v);

function convCases(): ConformanceCase[] {
  const cases: ConvCase[] = [
    { x: [1, 3, 9, 11], cout: 5, k: [3, 3], stride: 1, padding: 1, bias: true },
    { x: [2, 7, 6, 5], cout: 4, k: [1, 1], stride: 1, padding: 0, bias: false },
    { x: [1, 4, 10, 9], cout: 6, k: [3, 3], stride: 2, padding: 1, bias: true },
    { x: [1, 2, 7, 8], cout: 3, k: [3, 3], stride: [2, 1], padding: [0, 2], bias: true },
    { x: [1, 16, 20, 20], cout: 9, k: [3, 3], stride: 1, padding: 1, bias: true },
    { x: [1, 40, 6, 6], cout: 10, k: [3, 3], stride: 1, padding: 1, bias: false },
    { x: [1, 16, 8, 8], cout: 16, k: [1, 1], stride: 1, padding: 0, bias: true },
    {
      x: [1, 5, 4, 7],
      cout: 3,
      k: [3, 3],
      stride: 1,
      padding: 1,
      bias: true,
      view: { kind: "permute", perm: [0, 1, 3, 2] },
    },
  ];
  return cases.map(({ x, cout, k, stride, padding, bias, view }, i) => {
    const w = [cout, x[1], k[0], k[1]];
    const inputs: InputSpec[] = [
      { name: "x", dtype: "f32", shape: x, data: gaussian(1300 + i, numelOf(x)), ...(view ? { view } : {}) },
      { name: "weight", dtype: "f32", shape: w, data: gaussian(1310 + i, numelOf(w), 0.2) },
    ];
    if (bias) inputs.push({ name: "bias", dtype: "f32", shape: [cout], data: gaussian(1320 + i, cout) });
    const s = pair(stride);
    const p = pair(padding);
    return defineCase({
      op: "conv2d",
      name: `conv2d x [${x}] weight [${w}] stride [${s}] padding [${p}]${bias ? " bias" : ""}${view ? " (permuted view)" : ""}`,
      tolerance: CONV2D,
      inputs,
      call: (b, [xt, wt, bt]) => b.conv2d(xt as Tensor, wt as Tensor, bt ?? null, { stride, padding }),
      reference: ([xt, wt, bt]) => {
        const r = conv2dRef(xt as never, wt as never, bt ? (bt.data as Float32Array) : null, s, p);
        return [{ shape: r.shape, dtype: "f32", data: r.data }];
      },
    });
  });
}

function upsampleCases(): ConformanceCase[] {
  const cases: { shape: number[]; f: number; view?: InputSpec["view"] }[] = [
    { shape: [1, 2, 3, 4], f: 2 },
    { shape: [3, 5], f: 3 },
    { shape: [1, 16, 9, 7], f: 2 },
    { shape: [2, 4, 6], f: 2, view: { kind: "permute", perm: [0, 2, 1] } },
  ];
  return cases.map(({ shape, f, view }, i) => {
    const out = [
      ...shape.slice(0, -2),
      (shape[shape.length - 2] as number) * f,
      (shape[shape.length - 1] as number) * f,
    ];
    return defineCase({
      op: "upsample_nearest2d",
      name: `upsample_nearest2d [${shape}] × ${f}${view ? " (permuted view)" : ""}`,
      tolerance: EXACT,
      inputs: [
        {
          name: "x",
          dtype: "f32",
          shape,
          data: gaussian(1400 + i, numelOf(shape)),
          ...(view ? { view } : {}),
        },
      ],
      call: (b, [x]) => b.upsampleNearest2d(x as Tensor, f),
      reference: ([x]) => [{ shape: out, dtype: "f32", data: upsampleNearest2dRef(x as never, f) }],
    });
  });
}

/** Every conv2d and upsample case. */
export function convCases2d(): ConformanceCase[] {
  return [...convCases(), ...upsampleCases()];
}
