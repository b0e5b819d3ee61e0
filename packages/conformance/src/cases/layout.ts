/**
 * Cases of the data-movement ops — copy (every element size, permuted / strided / broadcast views),
 * slice, concat (views among the inputs), cast (@tp/tensor's bit-exact conversions as the
 * reference) — of the sampling helpers argmax (ties: the first) and topK, and of count_nonfinite.
 */
import { type DTypeName, decodeToF32, encodeFromF32, type HostArray, type Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec, logicalData } from "../case.ts";
import { gaussian, integers, uniformF32 } from "../data.ts";
import { numelOf } from "../host.ts";
import { argmaxRef, concatRef, countNonFiniteRef, sliceRef, topKRef } from "../reference/index.ts";
import { EXACT } from "../tolerances.ts";

/** Host data of `dtype` with n elements, from a seed (integers, or f32 values encoded as `dtype`). */
function hostData(dtype: DTypeName, n: number, seed: number): HostArray {
  switch (dtype) {
    case "f32":
      return gaussian(seed, n);
    case "f64":
      return Float64Array.from(gaussian(seed, n), (v) => v / 3);
    case "f16":
    case "bf16":
      return new Uint16Array(encodeFromF32(gaussian(seed, n), dtype).buffer);
    case "i32":
      return integers(seed, n, -1000, 1000);
    case "i64":
      return BigInt64Array.from(integers(seed, n, -1000, 1000), (v) => BigInt(v) * 1000003n);
    case "i16":
      return Int16Array.from(integers(seed, n, -30000, 30000));
    case "u8":
    case "bool":
      return Uint8Array.from(integers(seed, n, 0, 255));
    default:
      throw new Error(`no test data for ${dtype}`);
  }
}

function viewName(v?: InputSpec["view"]): string {
  if (v === undefined || v.kind === "contiguous") return "";
  if (v.kind === "permute") return ` (permuted view [${v.perm}])`;
  if (v.kind === "stride2") return " (every other element)";
  return ` (broadcast from [${v.from}])`;
}

function copyCases(): ConformanceCase[] {
  const cases: { dtype: DTypeName; shape: number[]; view: InputSpec["view"] }[] = [
    { dtype: "f32", shape: [3, 4, 5], view: { kind: "permute", perm: [2, 0, 1] } },
    { dtype: "f32", shape: [2, 3, 64, 8], view: { kind: "permute", perm: [0, 2, 1, 3] } },
    { dtype: "i32", shape: [4, 9], view: { kind: "stride2" } },
    { dtype: "u8", shape: [7, 6], view: { kind: "permute", perm: [1, 0] } },
    { dtype: "bf16", shape: [3, 4], view: { kind: "broadcast", from: [1, 4] } },
    { dtype: "f16", shape: [2, 5, 3], view: { kind: "permute", perm: [1, 2, 0] } },
    { dtype: "f64", shape: [5, 3], view: { kind: "permute", perm: [1, 0] } },
    { dtype: "i64", shape: [3, 5], view: { kind: "stride2" } },
    { dtype: "f32", shape: [100, 700], view: { kind: "permute", perm: [1, 0] } },
    { dtype: "i16", shape: [6], view: { kind: "contiguous" } },
  ];
  return cases.map(({ dtype, shape, view }, i) => {
    const stored = view?.kind === "broadcast" ? numelOf(view.from) : numelOf(shape);
    const spec: InputSpec = { name: "x", dtype, shape, data: hostData(dtype, stored, 1500 + i), view };
    return defineCase({
      op: "copy",
      name: `copy ${dtype} [${shape}]${viewName(view)}`,
      formats: [dtype],
      tolerance: EXACT,
      inputs: [spec],
      call: (b, [x]) => b.copy(x as Tensor),
      reference: () => [{ shape, dtype, data: toNumbers(logicalData(spec)) }],
    });
  });
}

function toNumbers(a: HostArray): ArrayLike<number> {
  return a instanceof BigInt64Array || a instanceof BigUint64Array
    ? Array.from(a, Number)
    : (a as ArrayLike<number>);
}

function sliceCases(): ConformanceCase[] {
  const cases: {
    dtype: DTypeName;
    shape: number[];
    dim: number;
    start: number;
    end: number;
    view?: InputSpec["view"];
  }[] = [
    { dtype: "f32", shape: [5, 7], dim: 1, start: 2, end: 5 },
    { dtype: "f32", shape: [6, 4], dim: 0, start: -3, end: 100 },
    { dtype: "i32", shape: [4, 6], dim: -1, start: 1, end: 1 },
    { dtype: "f16", shape: [3, 8], dim: 0, start: 1, end: 3, view: { kind: "permute", perm: [1, 0] } },
    { dtype: "f32", shape: [2, 9, 5], dim: 1, start: 0, end: 4 },
  ];
  return cases.map(({ dtype, shape, dim, start, end, view }, i) => {
    const spec: InputSpec = {
      name: "x",
      dtype,
      shape,
      data: hostData(dtype, numelOf(shape), 1600 + i),
      ...(view ? { view } : {}),
    };
    return defineCase({
      op: "slice",
      name: `slice ${dtype} [${shape}] dim ${dim} [${start}, ${end})${viewName(view)}`,
      formats: [dtype],
      tolerance: EXACT,
      inputs: [spec],
      call: (b, [x]) => b.slice(x as Tensor, dim, start, end),
      reference: ([x]) => {
        const r = sliceRef(x as never, dim, start, end);
        return [{ shape: r.shape, dtype, data: toNumbers(r.data) }];
      },
    });
  });
}

function concatCases(): ConformanceCase[] {
  const cases: {
    dtype: DTypeName;
    shapes: number[][];
    dim: number;
    views?: (InputSpec["view"] | undefined)[];
  }[] = [
    {
      dtype: "f32",
      shapes: [
        [2, 3],
        [1, 3],
      ],
      dim: 0,
    },
    {
      dtype: "f32",
      shapes: [
        [2, 3],
        [2, 5],
        [2, 1],
      ],
      dim: -1,
    },
    {
      dtype: "i32",
      shapes: [
        [3, 2, 4],
        [3, 1, 4],
      ],
      dim: 1,
    },
    {
      dtype: "bf16",
      shapes: [
        [4, 3],
        [4, 2],
      ],
      dim: 1,
      views: [{ kind: "permute", perm: [1, 0] }, undefined],
    },
    {
      dtype: "u8",
      shapes: [
        [2, 2, 2],
        [2, 2, 2],
        [2, 2, 2],
      ],
      dim: 2,
    },
    {
      dtype: "f32",
      shapes: [
        [7, 16],
        [0, 16],
        [120, 16],
      ],
      dim: 0,
      views: [undefined, undefined, { kind: "stride2" }],
    },
  ];
  return cases.map(({ dtype, shapes, dim, views }, i) => {
    const inputs = shapes.map(
      (shape, k): InputSpec => ({
        name: `x${k}`,
        dtype,
        shape,
        data: hostData(dtype, numelOf(shape), 1700 + 10 * i + k),
        ...(views?.[k] ? { view: views[k] } : {}),
      }),
    );
    return defineCase({
      op: "concat",
      name: `concat ${dtype} ${shapes.map((s, k) => `[${s}]${viewName(views?.[k])}`).join(" + ")} dim ${dim}`,
      formats: [dtype],
      tolerance: EXACT,
      inputs,
      call: (b, xs) => b.concat(xs, dim),
      reference: (xs) => {
        const r = concatRef(xs as never, dim);
        return [{ shape: r.shape, dtype, data: toNumbers(r.data) }];
      },
    });
  });
}

function castCases(): ConformanceCase[] {
  const values = gaussian(1800, 1000, 40);
  values.set([0, -0, 1e-30, -1e-30, 448, -448, 500, 6e4, 7e4, 65504, 1e-7, 3.4e38]);
  const cases: { from: DTypeName; to: DTypeName; saturate?: boolean }[] = [
    { from: "f32", to: "f16" },
    { from: "f32", to: "bf16" },
    { from: "f32", to: "f8_e4m3fn", saturate: true },
    { from: "f32", to: "f8_e4m3fn" },
    { from: "f32", to: "f8_e5m2" },
    { from: "f16", to: "f32" },
    { from: "bf16", to: "f32" },
    { from: "f8_e4m3fn", to: "f32" },
    { from: "f8_e5m2", to: "f32" },
  ];
  return cases.map(({ from, to, saturate }) => {
    let data: HostArray;
    if (from === "f32") data = values;
    else if (from === "f16" || from === "bf16") data = new Uint16Array(encodeFromF32(values, from).buffer);
    else data = Uint8Array.from({ length: 256 }, (_, i) => i); // every fp8 code
    const n = data.length;
    const shape = from === "f32" || from === "f16" || from === "bf16" ? [10, n / 10] : [16, 16];
    return defineCase({
      op: "cast",
      name: `cast ${from} → ${to}${saturate ? " saturating" : ""} [${shape}]`,
      formats: [from, to],
      tolerance: EXACT,
      inputs: [{ name: "x", dtype: from, shape, data }],
      call: (b, [x]) => b.cast(x as Tensor, to, saturate ? { saturate } : {}),
      reference: ([x]) => {
        if (to === "f32") {
          const src = (x as { data: HostArray }).data;
          const bytes = new Uint8Array(src.buffer.slice(src.byteOffset, src.byteOffset + src.byteLength));
          return [{ shape, dtype: to, data: decodeToF32(bytes, from, n) }];
        }
        const enc = encodeFromF32(x?.data as Float32Array, to, { saturate: saturate === true });
        return [
          { shape, dtype: to, data: to === "f16" || to === "bf16" ? new Uint16Array(enc.buffer) : enc },
        ];
      },
    });
  });
}

function argmaxCases(): ConformanceCase[] {
  const ties = gaussian(1900, 18);
  ties[2] = 5;
  ties[4] = 5; // row 0: first of two maxima
  ties[6] = 7;
  ties[11] = 7;
  for (let i = 12; i < 18; i++) ties[i] = -1; // row 2: all equal
  const cases: { shape: number[]; data: Float32Array; view?: InputSpec["view"]; note?: string }[] = [
    { shape: [1, 10], data: gaussian(1901, 10) },
    { shape: [4, 1000], data: gaussian(1902, 4000) },
    { shape: [3, 6], data: ties, note: " with ties" },
    { shape: [7], data: uniformF32(1903, 7, -1, 1) },
    { shape: [2, 3, 33], data: gaussian(1904, 198) },
    { shape: [5, 8], data: gaussian(1905, 40), view: { kind: "permute", perm: [1, 0] } },
  ];
  return cases.map(({ shape, data, view, note }) =>
    defineCase({
      op: "argmax",
      name: `argmax [${shape}]${note ?? ""}${viewName(view)}`,
      tolerance: EXACT,
      inputs: [{ name: "x", dtype: "f32", shape, data, ...(view ? { view } : {}) }],
      call: (b, [x]) => b.argmax(x as Tensor),
      reference: ([x]) => [{ shape: shape.slice(0, -1), dtype: "i32", data: argmaxRef(x as never) }],
    }),
  );
}

function topKCases(): ConformanceCase[] {
  const cases: { shape: number[]; k: number; view?: InputSpec["view"] }[] = [
    { shape: [1, 50], k: 5 },
    { shape: [3, 1000], k: 40 },
    { shape: [2, 9], k: 9 },
    { shape: [4, 7], k: 1 },
    { shape: [2, 5], k: 0 },
    { shape: [6, 20], k: 3, view: { kind: "permute", perm: [1, 0] } },
  ];
  return cases.map(({ shape, k, view }, i) =>
    defineCase({
      op: "top_k",
      name: `topK [${shape}] k ${k}${viewName(view)}`,
      tolerance: EXACT,
      inputs: [
        {
          name: "x",
          dtype: "f32",
          shape,
          data: gaussian(2000 + i, numelOf(shape)),
          ...(view ? { view } : {}),
        },
      ],
      call: (b, [x]) => b.topK(x as Tensor, k),
      reference: ([x]) => {
        const r = topKRef(x as never, k);
        const out = [...shape.slice(0, -1), k];
        return [
          { shape: out, dtype: "f32", data: r.values },
          { shape: out, dtype: "i32", data: r.indices },
        ];
      },
    }),
  );
}

/**
 * `set` writes src into a view of dst in place; each case returns a copy of the whole of dst, so the
 * elements outside the view are checked unchanged too. The reference writes the view's elements on the
 * host by index: element i of src goes to dst[offset + Σ index_d · stride_d].
 */
function setCases(): ConformanceCase[] {
  const cases: {
    dtype: DTypeName;
    dst: number[];
    src: number[];
    srcView?: InputSpec["view"];
    what: string;
    /** The view of dst written, and its (offset, strides) in dst's row-major elements. */
    view: (t: Tensor) => Tensor;
    offset: number;
    strides: number[];
  }[] = [
    // a KV-cache append: rows [2, 5) of [capacity 6, kv_heads 2, head_dim 4]
    {
      dtype: "f32",
      dst: [6, 2, 4],
      src: [3, 2, 4],
      what: "rows 2..5",
      view: (t) => t.slice(0, 2, 5),
      offset: 16,
      strides: [8, 4, 1],
    },
    // a transposed, sliced view of dst from a permuted src
    {
      dtype: "f16",
      dst: [4, 6],
      src: [3, 4],
      srcView: { kind: "permute", perm: [1, 0] },
      what: "transpose + slice",
      view: (t) => t.transpose(0, 1).slice(0, 1, 4),
      offset: 1,
      strides: [1, 6],
    },
    // every other element of dst from every other element of src
    {
      dtype: "i32",
      dst: [5, 8],
      src: [5, 4],
      srcView: { kind: "stride2" },
      what: "stride 2",
      view: (t) => t.slice(-1, 0, 8, 2),
      offset: 0,
      strides: [8, 2],
    },
    {
      dtype: "u8",
      dst: [7],
      src: [0],
      what: "empty",
      view: (t) => t.slice(0, 3, 3),
      offset: 3,
      strides: [1],
    },
  ];
  return cases.map((c, i) => {
    const dstSpec: InputSpec = {
      name: "dst",
      dtype: c.dtype,
      shape: c.dst,
      data: hostData(c.dtype, numelOf(c.dst), 2100 + i),
    };
    const srcSpec: InputSpec = {
      name: "src",
      dtype: c.dtype,
      shape: c.src,
      data: hostData(c.dtype, numelOf(c.src), 2200 + i),
      ...(c.srcView === undefined ? {} : { view: c.srcView }),
    };
    return defineCase({
      op: "set",
      name: `set ${c.dtype} [${c.src}] into [${c.dst}] (${c.what})${viewName(c.srcView)}`,
      formats: [c.dtype],
      tolerance: EXACT,
      inputs: [dstSpec, srcSpec],
      call: (b, [dst, src]) => {
        b.set(c.view(dst as Tensor), src as Tensor);
        return b.copy(dst as Tensor);
      },
      reference: ([dst, src]) => {
        const out = Array.from(toNumbers((dst as { data: HostArray }).data));
        const from = toNumbers((src as { data: HostArray }).data);
        for (let e = 0; e < from.length; e++) {
          let at = c.offset;
          let rest = e;
          for (let d = c.src.length - 1; d >= 0; d--) {
            const n = c.src[d] as number;
            at += (rest % n) * (c.strides[d] as number);
            rest = Math.floor(rest / n);
          }
          out[at] = from[e] as number;
        }
        return [{ shape: c.dst, dtype: c.dtype, data: out }];
      },
    });
  });
}

/** Every layout, cast and sampling case. */
/**
 * count_nonfinite: NaN (quiet, signalling, negative), ±∞ at the first and last element, vector tails,
 * sizes that split over threads and past the Vulkan workgroup's first stride; finite extremes
 * (f32 max, subnormals, −0) that must not count; permuted, every-other and broadcast views; empty.
 */
function countNonFiniteCases(): ConformanceCase[] {
  const bits = (u: number): number => new Float32Array(new Uint32Array([u]).buffer)[0] as number;
  const seed = (n: number, s: number, bad: [number, number][]): Float32Array => {
    const d = gaussian(s, n);
    for (const [i, v] of bad) d[i] = v;
    return d;
  };
  const extremes = Float32Array.of(3.4028234663852886e38, -3.4028234663852886e38, 1e-45, -1e-45, -0, 0, 1);
  const many: [number, number][] = [];
  for (let i = 0; i < 300_001; i += 997) many.push([i, i % 3 === 0 ? Number.NaN : -Infinity]);
  const cases: { shape: number[]; data: Float32Array; view?: InputSpec["view"]; note: string }[] = [
    { shape: [1000], data: gaussian(2100, 1000), note: " all finite" },
    { shape: [7], data: extremes, note: " finite extremes" },
    {
      shape: [3, 11],
      data: seed(33, 2101, [
        [0, Number.NaN],
        [5, Infinity],
        [17, -Infinity],
        [32, bits(0x7f800001)], // signalling NaN
        [20, bits(0xffc00000)], // negative quiet NaN
      ]),
      note: " NaN and ±∞, first and last",
    },
    { shape: [300_001], data: seed(300_001, 2102, many), note: " over threads" },
    { shape: [4, 4], data: new Float32Array(16).fill(Number.NaN), note: " all NaN" },
    {
      shape: [6, 9],
      data: seed(54, 2103, [
        [3, Number.NaN],
        [40, Infinity],
      ]),
      view: { kind: "permute", perm: [1, 0] },
      note: "",
    },
    { shape: [50], data: seed(50, 2104, [[9, Number.NaN]]), view: { kind: "stride2" }, note: "" },
    {
      shape: [5, 7],
      data: seed(7, 2105, [[2, -Infinity]]),
      view: { kind: "broadcast", from: [1, 7] },
      note: " (each of 5 rows sees the −∞)",
    },
    { shape: [0, 3], data: new Float32Array(0), note: " empty" },
  ];
  return cases.map(({ shape, data, view, note }) =>
    defineCase({
      op: "count_nonfinite",
      name: `count_nonfinite [${shape}]${note}${viewName(view)}`,
      tolerance: EXACT,
      inputs: [{ name: "x", dtype: "f32", shape, data, ...(view ? { view } : {}) }],
      call: (b, [x]) => b.countNonFinite(x as Tensor),
      reference: ([x]) => [{ shape: [], dtype: "i32", data: countNonFiniteRef(x as never) }],
    }),
  );
}

export function layoutCases(): ConformanceCase[] {
  return [
    ...copyCases(),
    ...setCases(),
    ...sliceCases(),
    ...concatCases(),
    ...castCases(),
    ...argmaxCases(),
    ...topKCases(),
    ...countNonFiniteCases(),
  ];
}
