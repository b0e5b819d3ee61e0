/**
 * Shapes, strides and strided views. Shapes are in torch order (row-major: the last dimension is
 * contiguous); strides and offsets are counted in elements, not bytes. A {@link Layout} describes how a
 * view walks a flat storage, so reshape, permute, transpose, slice and broadcast make new layouts over
 * the same storage without copying.
 *
 * Broadcasting follows NumPy's rules (numpy.org/doc/stable/user/basics.broadcasting.html), which torch
 * also uses: align shapes on the right; two sizes agree when equal or when one of them is 1.
 */

import { TpError } from "./errors.ts";

/** A shape: non-negative integer sizes, outermost first. `[]` is a scalar. */
export type Shape = readonly number[];

/** How a view walks storage: element (i0, i1, …) lives at `offset + Σ ik · strides[k]`. */
export interface Layout {
  readonly shape: Shape;
  /** Element strides, one per dimension; 0 for broadcast dimensions. */
  readonly strides: readonly number[];
  /** Element offset of the first element. */
  readonly offset: number;
}

/** `"[2, 3, 4]"`: how messages print a shape. */
export function formatShape(shape: Shape): string {
  return `[${shape.join(", ")}]`;
}

/**
 * Check that every dimension is a non-negative safe integer and the element count is a safe integer.
 * @throws TpError E_SHAPE naming the shape (and `what`, e.g. a tensor name).
 */
export function checkShape(shape: Shape, what = "shape"): void {
  if (!Array.isArray(shape))
    throw new TpError("E_SHAPE", `${what} must be an array of sizes, got ${String(shape)}`);
  let n = 1;
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 0) {
      throw new TpError("E_SHAPE", `${what} ${formatShape(shape)} has a bad dimension ${d}`);
    }
    n *= d;
  }
  if (!Number.isSafeInteger(n))
    throw new TpError("E_SHAPE", `${what} ${formatShape(shape)} has too many elements`);
}

/** Number of elements (1 for a scalar). @throws TpError E_SHAPE for a bad shape. */
export function numel(shape: Shape): number {
  checkShape(shape);
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Row-major strides in elements: `[d1·d2·…, …, d_{n-1}, 1]`. @throws TpError E_SHAPE for a bad shape. */
export function contiguousStrides(shape: Shape): number[] {
  checkShape(shape);
  const strides = new Array<number>(shape.length);
  let s = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i] as number;
  }
  return strides;
}

/** The contiguous layout of a shape at offset 0. */
export function contiguousLayout(shape: Shape): Layout {
  return { shape: shape.slice(), strides: contiguousStrides(shape), offset: 0 };
}

/** True when two shapes are equal. */
export function sameShape(a: Shape, b: Shape): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * True when the layout is row-major contiguous (size-1 dimensions may have any stride), so its
 * elements occupy `[offset, offset + numel)` in order.
 */
export function isContiguous(layout: Layout): boolean {
  if (hasZero(layout.shape)) return true; // no elements: any layout will do
  let expected = 1;
  for (let i = layout.shape.length - 1; i >= 0; i--) {
    const d = layout.shape[i] as number;
    if (d !== 1 && layout.strides[i] !== expected) return false;
    expected *= d;
  }
  return true;
}

/** True when some dimension is 0 (the view has no elements). */
function hasZero(shape: Shape): boolean {
  for (let i = 0; i < shape.length; i++) if (shape[i] === 0) return true;
  return false;
}

/**
 * The broadcast shape of several shapes (NumPy rules).
 * @throws TpError E_SHAPE naming all shapes and the first dimension that disagrees.
 */
export function broadcastShapes(...shapes: Shape[]): number[] {
  let rank = 0;
  for (const s of shapes) {
    checkShape(s);
    if (s.length > rank) rank = s.length;
  }
  const out = new Array<number>(rank).fill(1);
  for (let k = 1; k <= rank; k++) {
    let size = 1;
    for (const s of shapes) {
      const d = s.length - k >= 0 ? (s[s.length - k] as number) : 1;
      if (d === 1) continue;
      if (size !== 1 && d !== size) {
        throw new TpError(
          "E_SHAPE",
          `cannot broadcast shapes ${shapes.map(formatShape).join(" and ")}: dimension -${k} is ${size} vs ${d}`,
        );
      }
      size = d;
    }
    out[rank - k] = size;
  }
  return out;
}

/**
 * A view of `layout` broadcast to `target` (stride 0 along the added and size-1 dimensions).
 * @throws TpError E_SHAPE when `layout.shape` does not broadcast to `target`.
 */
export function broadcastTo(layout: Layout, target: Shape): Layout {
  checkShape(target);
  const { shape, strides } = layout;
  if (shape.length > target.length) {
    throw new TpError(
      "E_SHAPE",
      `cannot broadcast ${formatShape(shape)} to the smaller rank ${formatShape(target)}`,
    );
  }
  const lead = target.length - shape.length;
  const outStrides = new Array<number>(target.length);
  for (let i = 0; i < target.length; i++) {
    const d = i < lead ? 1 : (shape[i - lead] as number);
    if (i >= lead && d === target[i]) outStrides[i] = strides[i - lead] as number;
    else if (d === 1) outStrides[i] = 0;
    else throw new TpError("E_SHAPE", `cannot broadcast ${formatShape(shape)} to ${formatShape(target)}`);
  }
  return { shape: target.slice(), strides: outStrides, offset: layout.offset };
}

/**
 * Resolve a reshape target: at most one `-1`, inferred so that the element count is unchanged.
 * @throws TpError E_SHAPE when the counts differ or the `-1` cannot be inferred.
 */
export function resolveReshape(from: Shape, to: Shape): number[] {
  const n = numel(from);
  let minusOnes = 0;
  let knownCount = 1;
  let bad = false;
  for (const d of to) {
    if (d === -1) minusOnes++;
    else if (Number.isSafeInteger(d) && d >= 0) knownCount *= d;
    else bad = true;
  }
  if (minusOnes > 1)
    throw new TpError("E_SHAPE", `reshape ${formatShape(from)} → ${formatShape(to)}: more than one -1`);
  // a bad size, or too many elements: checkShape throws, naming them
  if (bad || !Number.isSafeInteger(knownCount))
    checkShape(
      to.filter((e) => e !== -1),
      "reshape target",
    );
  const out = to.slice();
  if (minusOnes === 1) {
    if (knownCount === 0 || n % knownCount !== 0) {
      throw new TpError(
        "E_SHAPE",
        `reshape ${formatShape(from)} (${n} elements) → ${formatShape(to)}: cannot infer -1`,
      );
    }
    out[out.indexOf(-1)] = n / knownCount;
  } else if (knownCount !== n) {
    throw new TpError(
      "E_SHAPE",
      `reshape ${formatShape(from)} (${n} elements) → ${formatShape(to)} (${knownCount} elements): counts differ`,
    );
  }
  return out;
}

/**
 * Reshape a view without copying. Works when the layout is contiguous, and more generally whenever each
 * run of new dimensions maps onto a run of old dimensions that are contiguous among themselves (the rule
 * of torch.Tensor.view; torch `aten/src/ATen/TensorUtils.cpp` `computeStride`).
 * @throws TpError E_SHAPE when the counts differ, or when the view would need a copy (then copy first);
 *   the message names both shapes.
 */
export function reshape(layout: Layout, to: Shape): Layout {
  const target = resolveReshape(layout.shape, to);
  if (isContiguous(layout))
    return { shape: target, strides: contiguousStrides(target), offset: layout.offset };
  const { shape, strides } = layout;
  const out = new Array<number>(target.length).fill(0);
  // Walk old dimensions from the innermost; a "chunk" is a run that is contiguous within itself.
  let viewD = target.length - 1;
  let chunkBaseStride = strides[strides.length - 1] as number;
  let tensorNumel = 1;
  let viewNumel = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    tensorNumel *= shape[d] as number;
    const chunkEnds = d === 0 || (shape[d - 1] !== 1 && strides[d - 1] !== tensorNumel * chunkBaseStride);
    if (!chunkEnds) continue;
    while (viewD >= 0 && (viewNumel < tensorNumel || target[viewD] === 1)) {
      out[viewD] = viewNumel * chunkBaseStride;
      viewNumel *= target[viewD] as number;
      viewD--;
    }
    if (viewNumel !== tensorNumel) {
      throw new TpError(
        "E_SHAPE",
        `reshape ${formatShape(shape)} → ${formatShape(target)} needs a copy: the view is not contiguous there`,
      );
    }
    if (d > 0) {
      chunkBaseStride = strides[d - 1] as number;
      tensorNumel = 1;
      viewNumel = 1;
    }
  }
  while (viewD >= 0) out[viewD--] = 1; // leading size-1 dimensions
  return { shape: target, strides: out, offset: layout.offset };
}

/**
 * Reorder dimensions: output dimension i is input dimension `dims[i]` (torch.permute).
 * @throws TpError E_SHAPE when `dims` is not a permutation of 0..rank-1.
 */
export function permute(layout: Layout, dims: readonly number[]): Layout {
  const rank = layout.shape.length;
  let ok = dims.length === rank;
  for (let i = 0; ok && i < rank; i++) {
    const d = dims[i] as number;
    ok = Number.isInteger(d) && d >= 0 && d < rank;
    for (let j = 0; ok && j < i; j++) ok = dims[j] !== d; // each dimension once
  }
  if (!ok) {
    throw new TpError(
      "E_SHAPE",
      `permute of ${formatShape(layout.shape)}: [${dims.join(", ")}] is not a permutation of 0..${rank - 1}`,
    );
  }
  const shape = new Array<number>(rank);
  const strides = new Array<number>(rank);
  for (let i = 0; i < rank; i++) {
    shape[i] = layout.shape[dims[i] as number] as number;
    strides[i] = layout.strides[dims[i] as number] as number;
  }
  return { shape, strides, offset: layout.offset };
}

/** Normalise a possibly negative dimension index. @throws TpError E_SHAPE when out of range. */
export function normalizeDim(dim: number, rank: number, what = "dim"): number {
  const d = dim < 0 ? dim + rank : dim;
  if (!Number.isInteger(d) || d < 0 || d >= rank) {
    throw new TpError("E_SHAPE", `${what} ${dim} is out of range for rank ${rank}`);
  }
  return d;
}

/** Swap two dimensions (torch.transpose). @throws TpError E_SHAPE for a bad dimension. */
export function transpose(layout: Layout, dim0: number, dim1: number): Layout {
  const rank = layout.shape.length;
  const a = normalizeDim(dim0, rank);
  const b = normalizeDim(dim1, rank);
  const dims = [...Array(rank).keys()];
  dims[a] = b;
  dims[b] = a;
  return permute(layout, dims);
}

/**
 * Elements `start, start+step, … < end` along `dim` (Python slice semantics, negative start/end count
 * from the end and are clamped; step ≥ 1).
 * @throws TpError E_SHAPE for a bad dimension or step, or a start/end that is not an integer.
 */
export function slice(
  layout: Layout,
  dim: number,
  start: number,
  end: number = Number.MAX_SAFE_INTEGER,
  step = 1,
): Layout {
  const d = normalizeDim(dim, layout.shape.length);
  if (!Number.isInteger(step) || step < 1)
    throw new TpError("E_SHAPE", `slice step ${step} must be a positive integer`);
  if (!Number.isInteger(start)) throw new TpError("E_SHAPE", `slice start ${start} must be an integer`);
  if (!Number.isInteger(end)) throw new TpError("E_SHAPE", `slice end ${end} must be an integer`);
  const size = layout.shape[d] as number;
  const s = Math.min(Math.max(start < 0 ? start + size : start, 0), size);
  const e = Math.max(Math.min(Math.max(end < 0 ? end + size : end, 0), size), s);
  const count = Math.ceil((e - s) / step);
  const shape = layout.shape.slice();
  const strides = layout.strides.slice();
  shape[d] = count;
  strides[d] = (layout.strides[d] as number) * step;
  return { shape, strides, offset: layout.offset + (count > 0 ? s * (layout.strides[d] as number) : 0) };
}

/**
 * Element offsets of every element of a view, in row-major order of its shape. For tests and
 * reference code (O(numel)); kernels walk strides themselves.
 */
export function elementOffsets(layout: Layout): Int32Array | Float64Array {
  const n = numel(layout.shape);
  const out = n < 2 ** 31 ? new Int32Array(n) : new Float64Array(n);
  const rank = layout.shape.length;
  const idx = new Array<number>(rank).fill(0);
  let off = layout.offset;
  for (let i = 0; i < n; i++) {
    out[i] = off;
    for (let k = rank - 1; k >= 0; k--) {
      idx[k] = (idx[k] as number) + 1;
      off += layout.strides[k] as number;
      if ((idx[k] as number) < (layout.shape[k] as number)) break;
      off -= (layout.strides[k] as number) * (layout.shape[k] as number);
      idx[k] = 0;
    }
  }
  return out;
}

/**
 * Check that a layout is well formed: a valid shape, one stride per dimension, every stride and the
 * offset non-negative safe integers.
 * @throws TpError E_SHAPE naming `what` and the layout.
 */
export function checkLayout(layout: Layout, what = "view"): void {
  checkShape(layout?.shape, what);
  const { shape, strides, offset } = layout;
  let ok =
    Array.isArray(strides) && strides.length === shape.length && Number.isSafeInteger(offset) && offset >= 0;
  for (let i = 0; ok && i < strides.length; i++)
    ok = Number.isSafeInteger(strides[i]) && (strides[i] as number) >= 0;
  if (!ok) {
    throw new TpError(
      "E_SHAPE",
      `${what} ${formatShape(shape)} has a bad layout (strides [${Array.isArray(strides) ? strides.join(", ") : strides}], ` +
        `offset ${offset}): strides and offset must be non-negative integers, one stride per dimension`,
    );
  }
}

/**
 * The span of storage elements `[lo, hi)` a view can touch (for bounds checks before native calls).
 * Negative strides are not produced by this module, so lo is the offset.
 */
export function storageSpan(layout: Layout): { lo: number; hi: number } {
  if (hasZero(layout.shape)) return { lo: layout.offset, hi: layout.offset };
  let hi = layout.offset;
  for (let i = 0; i < layout.shape.length; i++)
    hi += ((layout.shape[i] as number) - 1) * (layout.strides[i] as number);
  return { lo: layout.offset, hi: hi + 1 };
}
