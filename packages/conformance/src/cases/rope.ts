/**
 * Cases of rope: NeoX and interleaved pairs, partial rotation, multi-axis sections (Krea 2's 3-axis
 * layout, negative positions as Qwen-Image's centred grid), linear position scaling, large
 * positions, odd sequence lengths, a permuted input.
 */
import type { RopeOptions, Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian, integers, range } from "../data.ts";
import { numelOf } from "../host.ts";
import { ropeRef } from "../reference/index.ts";
import { ROPE } from "../tolerances.ts";

interface RopeCase {
  shape: [number, number, number, number];
  options: RopeOptions;
  positions: Int32Array;
  view?: InputSpec["view"];
  note: string;
}

/** Every rope case. */
export function ropeCases(): ConformanceCase[] {
  const cases: RopeCase[] = [
    { shape: [1, 5, 3, 16], options: { mode: "neox", theta: 1e4 }, positions: range(5), note: "neox" },
    {
      shape: [2, 4, 2, 8],
      options: { mode: "interleaved", theta: 1e4 },
      positions: range(4, 3),
      note: "interleaved",
    },
    {
      shape: [1, 7, 2, 12],
      options: { mode: "neox", theta: 1e6, ropeDims: 8 },
      positions: range(7, 100),
      note: "neox, 8 of 12 dims",
    },
    {
      shape: [1, 6, 2, 20],
      options: { mode: "interleaved", theta: 1e4, ropeDims: 16 },
      positions: range(6),
      note: "interleaved, 16 of 20 dims",
    },
    {
      shape: [1, 9, 3, 32],
      options: { mode: "interleaved", theta: 1000, sections: [4, 6, 6] },
      positions: Int32Array.from([
        ...new Array(9).fill(0),
        ...integers(1100, 9, 0, 20),
        ...integers(1101, 9, 0, 30),
      ]),
      note: "interleaved, 3 axes [4, 6, 6] (Krea 2 layout)",
    },
    {
      shape: [1, 5, 2, 16],
      options: { mode: "interleaved", theta: 1e4, sections: [2, 3, 3] },
      positions: integers(1102, 15, -40, 40),
      note: "interleaved, 3 axes, negative positions",
    },
    {
      shape: [1, 4, 2, 16],
      options: { mode: "neox", theta: 1e6, freqScale: 0.125 },
      positions: range(4, 4000),
      note: "neox, freqScale 1/8",
    },
    {
      shape: [1, 3, 1, 128],
      options: { mode: "neox", theta: 5e6 },
      positions: Int32Array.from([0, 40000, 131071]),
      note: "neox, head_dim 128, large positions",
    },
    {
      shape: [2, 5, 3, 8],
      options: { mode: "neox", theta: 1e4 },
      positions: range(5),
      view: { kind: "permute", perm: [0, 2, 1, 3] },
      note: "neox (permuted view)",
    },
  ];
  return cases.map(({ shape, options, positions, view, note }, i) => {
    const axes = options.sections?.length ?? 0;
    const posShape = axes > 0 ? [axes, shape[1]] : [shape[1]];
    return defineCase({
      op: "rope",
      name: `rope [${shape}] ${note}`,
      formats: ["f32", "i32"],
      tolerance: ROPE,
      inputs: [
        {
          name: "x",
          dtype: "f32",
          shape,
          data: gaussian(1000 + i, numelOf(shape)),
          ...(view ? { view } : {}),
        },
        { name: "positions", dtype: "i32", shape: posShape, data: positions },
      ],
      call: (b, [x, p]) => b.rope(x as Tensor, p as Tensor, options),
      reference: ([x, p]) => [
        { shape, dtype: "f32", data: ropeRef(x as never, p?.data as Int32Array, options) },
      ],
    });
  });
}
