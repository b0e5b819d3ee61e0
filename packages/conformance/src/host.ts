/**
 * Host-side tensors for references: a shape and a row-major array. Index helpers walk them; nothing
 * here is fast, on purpose.
 */
import type { HostArray } from "@tp/tensor";

/** A row-major host tensor. */
export interface HostTensor<A extends ArrayLike<number> | HostArray = ArrayLike<number>> {
  readonly shape: readonly number[];
  readonly data: A;
}

/** Number of elements of a shape. */
export function numelOf(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Row-major strides (elements). */
export function stridesOf(shape: readonly number[]): number[] {
  const s = new Array<number>(shape.length);
  let acc = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    s[i] = acc;
    acc *= shape[i] as number;
  }
  return s;
}

/** The multi-index of flat index `i` in `shape`. */
export function unravel(i: number, shape: readonly number[]): number[] {
  const idx = new Array<number>(shape.length).fill(0);
  let r = i;
  for (let d = shape.length - 1; d >= 0; d--) {
    const n = shape[d] as number;
    idx[d] = r % n;
    r = Math.floor(r / n);
  }
  return idx;
}

/** Flat row-major index of a multi-index. */
export function ravel(idx: readonly number[], shape: readonly number[]): number {
  let f = 0;
  for (let d = 0; d < shape.length; d++) f = f * (shape[d] as number) + (idx[d] as number);
  return f;
}

/**
 * Flat index into a tensor of shape `from` for the multi-index `idx` of the broadcast shape `to`
 * (NumPy rules: right-aligned, size-1 dimensions repeat).
 */
export function broadcastIndex(
  idx: readonly number[],
  from: readonly number[],
  to: readonly number[],
): number {
  const lead = to.length - from.length;
  let f = 0;
  for (let d = 0; d < from.length; d++) {
    const n = from[d] as number;
    f = f * n + (n === 1 ? 0 : (idx[d + lead] as number));
  }
  return f;
}

/** The broadcast shape of two shapes (NumPy rules); throws if they do not broadcast. */
export function broadcastShape(a: readonly number[], b: readonly number[]): number[] {
  const r = Math.max(a.length, b.length);
  const out: number[] = [];
  for (let k = r; k >= 1; k--) {
    const x = a.length - k >= 0 ? (a[a.length - k] as number) : 1;
    const y = b.length - k >= 0 ? (b[b.length - k] as number) : 1;
    if (x !== y && x !== 1 && y !== 1) throw new Error(`shapes [${a}] and [${b}] do not broadcast`);
    out.push(x === 1 ? y : x);
  }
  return out;
}
