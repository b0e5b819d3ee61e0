/**
 * References of the layout ops (copy, slice, concat) on host arrays of any dtype, and of the
 * sampling helpers (argmax, topK). All exact.
 */
import type { HostArray } from "@tp/tensor";
import { type HostTensor, numelOf, ravel, unravel } from "../host.ts";

/** A new host array of the same class as `like` with n elements. */
function like(a: HostArray, n: number): HostArray {
  const C = a.constructor as new (n: number) => HostArray;
  return new C(n);
}

/** Python-style slice bounds of Tensor.slice: negative counts from the end, both clamped. */
export function sliceBounds(size: number, start: number, end: number): [number, number] {
  const clamp = (i: number) => Math.min(Math.max(i < 0 ? i + size : i, 0), size);
  const s = clamp(start);
  return [s, Math.max(clamp(end), s)];
}

/** Elements [start, end) along `dim` (Tensor.slice rules). */
export function sliceRef(
  x: HostTensor<HostArray>,
  dim: number,
  start: number,
  end: number,
): HostTensor<HostArray> {
  const d = dim < 0 ? dim + x.shape.length : dim;
  const [s, e] = sliceBounds(x.shape[d] as number, start, end);
  const shape = [...x.shape];
  shape[d] = e - s;
  const out = like(x.data, numelOf(shape));
  for (let i = 0; i < out.length; i++) {
    const idx = unravel(i, shape);
    idx[d] = (idx[d] as number) + s;
    (out as unknown as unknown[])[i] = (x.data as unknown as unknown[])[ravel(idx, x.shape)];
  }
  return { shape, data: out };
}

/** Join along `dim`. */
export function concatRef(xs: readonly HostTensor<HostArray>[], dim: number): HostTensor<HostArray> {
  const first = xs[0] as HostTensor<HostArray>;
  const d = dim < 0 ? dim + first.shape.length : dim;
  const shape = [...first.shape];
  shape[d] = xs.reduce((a, x) => a + (x.shape[d] as number), 0);
  const out = like(first.data, numelOf(shape));
  let at = 0;
  for (const x of xs) {
    for (let i = 0; i < x.data.length; i++) {
      const idx = unravel(i, x.shape);
      idx[d] = (idx[d] as number) + at;
      (out as unknown as unknown[])[ravel(idx, shape)] = (x.data as unknown as unknown[])[i];
    }
    at += x.shape[d] as number;
  }
  return { shape, data: out };
}

/** The number of NaN / ±∞ values of x (count_nonfinite), as an i32 scalar. */
export function countNonFiniteRef(x: HostTensor): Int32Array {
  let n = 0;
  for (let i = 0; i < x.data.length; i++) if (!Number.isFinite(x.data[i] as number)) n++;
  return Int32Array.of(n);
}

/** (value, index) order of argmax / topK: larger first; ties to the lower index. */
function before(a: number, ia: number, b: number, ib: number): boolean {
  return a > b || (a === b && ia < ib);
}

/** Index of the largest value of each row of the last dimension (the first on ties). */
export function argmaxRef(x: HostTensor): Int32Array {
  const n = x.shape[x.shape.length - 1] as number;
  const rows = x.data.length / n;
  const out = new Int32Array(rows);
  for (let r = 0; r < rows; r++) {
    let best = 0;
    for (let i = 1; i < n; i++)
      if (before(x.data[r * n + i] as number, i, x.data[r * n + best] as number, best)) best = i;
    out[r] = best;
  }
  return out;
}

/** The k largest of each row, descending (ties: lower index first), and their indices. */
export function topKRef(x: HostTensor, k: number): { values: Float32Array; indices: Int32Array } {
  const n = x.shape[x.shape.length - 1] as number;
  const rows = n === 0 ? 0 : x.data.length / n;
  const values = new Float32Array(rows * k);
  const indices = new Int32Array(rows * k);
  for (let r = 0; r < rows; r++) {
    const order = Array.from({ length: n }, (_, i) => i);
    order.sort((a, b) => {
      const va = x.data[r * n + a] as number;
      const vb = x.data[r * n + b] as number;
      return before(va, a, vb, b) ? -1 : before(vb, b, va, a) ? 1 : 0;
    });
    for (let j = 0; j < k; j++) {
      const i = order[j] as number;
      values[r * k + j] = x.data[r * n + i] as number;
      indices[r * k + j] = i;
    }
  }
  return { values, indices };
}
