/**
 * Cases of the elementwise ops: silu, sigmoid, gelu (erf, tanh), swiglu, scale, add / sub / mul
 * (broadcasting, strided and broadcast views), modulate and softmax (last and inner dimensions,
 * −inf entries). Sizes cover one element, vector tails (odd sizes), and multi-thread splits.
 */
import type { Backend, Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian, uniformF32 } from "../data.ts";
import { numelOf } from "../host.ts";
import {
  binaryRef,
  geluRef,
  modulateRef,
  scaleRef,
  sigmoidRef,
  siluRef,
  softmaxRef,
  swigluRef,
} from "../reference/index.ts";
import { EXACT, GELU, MODULATE, SIGMOID_FAMILY, SOFTMAX } from "../tolerances.ts";

/** Values that reach the clamps of a vector exp: large magnitudes, tiny ones, zeros. */
const SPECIAL = [-90, -30, -17.5, -8, -1e-3, -0, 0, 1e-7, 1e-3, 5.5, 17.5, 30, 90];

function f32(
  name: string,
  shape: readonly number[],
  data: Float32Array,
  view?: InputSpec["view"],
): InputSpec {
  return { name, dtype: "f32", shape, data, ...(view ? { view } : {}) };
}

/** n values: normal × 3 with the special values first. */
function activations(seed: number, n: number): Float32Array {
  const x = gaussian(seed, n, 3);
  x.set(SPECIAL.slice(0, Math.min(n, SPECIAL.length)));
  return x;
}

const UNARY_SHAPES: { shape: number[]; view?: InputSpec["view"] }[] = [
  { shape: [0, 5] },
  { shape: [1] },
  { shape: [13] },
  { shape: [3, 37] },
  { shape: [2, 5, 130] },
  { shape: [96, 517] },
  { shape: [17, 9], view: { kind: "permute", perm: [1, 0] } },
  { shape: [4, 33], view: { kind: "stride2" } },
];

function viewName(v?: InputSpec["view"]): string {
  if (v === undefined || v.kind === "contiguous") return "";
  if (v.kind === "permute") return ` (permuted view [${v.perm}])`;
  if (v.kind === "stride2") return " (every other element)";
  return ` (broadcast from [${v.from}])`;
}

function unaryCases(): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  const ops = [
    { op: "silu", ref: siluRef, tol: SIGMOID_FAMILY, call: (b: Backend, x: Tensor) => b.silu(x) },
    { op: "sigmoid", ref: sigmoidRef, tol: SIGMOID_FAMILY, call: (b: Backend, x: Tensor) => b.sigmoid(x) },
    {
      op: "gelu",
      ref: (x: ArrayLike<number>) => geluRef(x, "none"),
      tol: GELU,
      call: (b: Backend, x: Tensor) => b.gelu(x),
      label: " erf",
    },
    {
      op: "gelu",
      ref: (x: ArrayLike<number>) => geluRef(x, "tanh"),
      tol: GELU,
      call: (b: Backend, x: Tensor) => b.gelu(x, { approximate: "tanh" }),
      label: " tanh",
    },
  ] as const;
  ops.forEach((o, k) => {
    UNARY_SHAPES.forEach(({ shape, view }, s) => {
      const x = f32("x", shape, activations(100 + 10 * k + s, numelOf(shape)), view);
      out.push(
        defineCase({
          op: o.op,
          name: `${o.op}${"label" in o ? o.label : ""} [${shape}]${viewName(view)}`,
          tolerance: o.tol,
          inputs: [x],
          call: (b, [t]) => o.call(b, t as Tensor),
          reference: ([t]) => [{ shape, dtype: "f32", data: o.ref(t?.data as Float32Array) }],
        }),
      );
    });
  });
  return out;
}

function swigluCases(): ConformanceCase[] {
  return [
    { shape: [1, 5] },
    { shape: [4, 67] },
    { shape: [3, 1029] },
    { shape: [6, 10], view: { kind: "permute", perm: [1, 0] } as const },
  ].map(({ shape, view }, i) =>
    defineCase({
      op: "swiglu",
      name: `swiglu [${shape}]${viewName(view)}`,
      tolerance: SIGMOID_FAMILY,
      inputs: [
        f32("gate", shape, activations(200 + i, numelOf(shape)), view),
        f32("up", shape, gaussian(210 + i, numelOf(shape))),
      ],
      call: (b, [g, u]) => b.swiglu(g as Tensor, u as Tensor),
      reference: ([g, u]) => [
        { shape, dtype: "f32", data: swigluRef(g?.data as Float32Array, u?.data as Float32Array) },
      ],
    }),
  );
}

function scaleCases(): ConformanceCase[] {
  return [
    { shape: [33], s: 0.125 },
    { shape: [5, 100], s: -3.7 },
    { shape: [7, 3], s: 1e-3, view: { kind: "permute", perm: [1, 0] } as const },
  ].map(({ shape, s, view }, i) =>
    defineCase({
      op: "scale",
      name: `scale [${shape}] by ${s}${viewName(view)}`,
      tolerance: EXACT,
      inputs: [f32("x", shape, gaussian(300 + i, numelOf(shape)), view)],
      call: (b, [x]) => b.scale(x as Tensor, s),
      reference: ([x]) => [{ shape, dtype: "f32", data: scaleRef(x?.data as Float32Array, s) }],
    }),
  );
}

interface BinaryShape {
  a: number[];
  b: number[];
  va?: InputSpec["view"];
  vb?: InputSpec["view"];
}

const BINARY_SHAPES: BinaryShape[] = [
  { a: [5, 7], b: [5, 7] },
  { a: [1], b: [1000] },
  { a: [2, 3, 4], b: [4] },
  { a: [4, 1, 6], b: [3, 1] },
  { a: [], b: [3] },
  { a: [64, 1], b: [1, 130] },
  { a: [2, 300, 33], b: [2, 300, 33] },
  { a: [6, 5], b: [6, 5], va: { kind: "permute", perm: [1, 0] } },
  { a: [3, 8], b: [3, 8], va: { kind: "stride2" }, vb: { kind: "broadcast", from: [8] } },
];

function binaryCases(): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  for (const op of ["add", "sub", "mul"] as const) {
    BINARY_SHAPES.forEach(({ a, b, va, vb }, i) => {
      const bData =
        vb?.kind === "broadcast" ? gaussian(410 + i, numelOf(vb.from)) : gaussian(410 + i, numelOf(b));
      out.push(
        defineCase({
          op,
          name: `${op} [${a}]${viewName(va)} and [${b}]${viewName(vb)}`,
          tolerance: EXACT,
          inputs: [f32("a", a, gaussian(400 + i, numelOf(a)), va), f32("b", b, bData, vb)],
          call: (bk, [x, y]) => bk[op](x as Tensor, y as Tensor),
          reference: ([x, y]) => {
            const r = binaryRef(op, x as never, y as never);
            return [{ shape: r.shape, dtype: "f32", data: r.data }];
          },
        }),
      );
    });
  }
  return out;
}

function modulateCases(): ConformanceCase[] {
  const shapes: { x: number[]; s: number[]; h: number[]; vx?: InputSpec["view"] }[] = [
    { x: [2, 5, 24], s: [2, 1, 24], h: [2, 1, 24] },
    { x: [3, 40], s: [40], h: [1, 40] },
    { x: [1, 1, 7], s: [7], h: [7] },
    { x: [33, 96], s: [96], h: [96] },
    { x: [4, 16], s: [16], h: [4, 1], vx: { kind: "permute", perm: [1, 0] } },
  ];
  return shapes.map(({ x, s, h, vx }, i) =>
    defineCase({
      op: "modulate",
      name: `modulate x [${x}]${viewName(vx)}, scale [${s}], shift [${h}]`,
      tolerance: MODULATE,
      inputs: [
        f32("x", x, gaussian(500 + i, numelOf(x), 2), vx),
        f32("scale", s, gaussian(510 + i, numelOf(s), 0.5)),
        f32("shift", h, gaussian(520 + i, numelOf(h))),
      ],
      call: (b, [t, sc, sh]) => b.modulate(t as Tensor, sc as Tensor, sh as Tensor),
      reference: ([t, sc, sh]) => [
        { shape: x, dtype: "f32", data: modulateRef(t as never, sc as never, sh as never) },
      ],
    }),
  );
}

function softmaxCases(): ConformanceCase[] {
  const masked = gaussian(600, 3 * 70, 4);
  for (let i = 0; i < 70; i += 3) masked[70 + i] = Number.NEGATIVE_INFINITY; // row 1 partly masked
  const cases: {
    shape: number[];
    dim?: number;
    data: Float32Array;
    view?: InputSpec["view"];
    note?: string;
  }[] = [
    { shape: [1, 10], data: gaussian(601, 10) },
    { shape: [3, 1000], data: gaussian(602, 3000, 8) },
    { shape: [3, 70], data: masked, note: " with −inf entries" },
    { shape: [7, 5], dim: 0, data: gaussian(603, 35) },
    { shape: [2, 9, 3], dim: 1, data: gaussian(604, 54, 3) },
    { shape: [2, 9, 3], dim: -3, data: gaussian(605, 54) },
    { shape: [64, 33], data: uniformF32(606, 64 * 33, -60, 60), note: " values in ±60" },
    { shape: [5, 12], data: gaussian(607, 60), view: { kind: "permute", perm: [1, 0] } },
  ];
  return cases.map(({ shape, dim, data, view, note }) =>
    defineCase({
      op: "softmax",
      name: `softmax [${shape}] dim ${dim ?? -1}${note ?? ""}${viewName(view)}`,
      tolerance: SOFTMAX,
      inputs: [f32("x", shape, data, view)],
      call: (b, [x]) => b.softmax(x as Tensor, dim === undefined ? {} : { dim }),
      reference: ([x]) => [{ shape, dtype: "f32", data: softmaxRef(x as never, dim ?? -1) }],
    }),
  );
}

/** Every elementwise case. */
export function elementwiseCases(): ConformanceCase[] {
  return [
    ...unaryCases(),
    ...swigluCases(),
    ...scaleCases(),
    ...binaryCases(),
    ...modulateCases(),
    ...softmaxCases(),
  ];
}
