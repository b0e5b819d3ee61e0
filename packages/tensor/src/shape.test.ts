// Shapes and views against hand-derived cases (strides of a [2,3,4] tensor, torch.view rules).
import { describe, expect, test } from "bun:test";
import { isTpError } from "./errors.ts";
import {
  broadcastShapes,
  broadcastTo,
  contiguousLayout,
  contiguousStrides,
  elementOffsets,
  isContiguous,
  numel,
  permute,
  reshape,
  slice,
  storageSpan,
  transpose,
} from "./shape.ts";

function shapeError(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(isTpError(e, "E_SHAPE")).toBe(true);
    return (e as Error).message;
  }
  throw new Error("expected an E_SHAPE error");
}

describe("shapes", () => {
  test("numel and contiguous strides", () => {
    expect(numel([])).toBe(1);
    expect(numel([2, 3, 4])).toBe(24);
    expect(numel([5, 0, 7])).toBe(0);
    expect(contiguousStrides([2, 3, 4])).toEqual([12, 4, 1]);
    expect(contiguousStrides([])).toEqual([]);
    expect(shapeError(() => numel([2, -1]))).toContain("[2, -1]");
    expect(shapeError(() => numel([2, 1.5]))).toContain("bad dimension 1.5");
    expect(shapeError(() => numel([2 ** 30, 2 ** 30, 2 ** 30]))).toContain("too many elements");
  });

  test("broadcasting follows NumPy and names the shapes on error", () => {
    expect(broadcastShapes([8, 1, 6, 1], [7, 1, 5])).toEqual([8, 7, 6, 5]);
    expect(broadcastShapes([5, 4], [1])).toEqual([5, 4]);
    expect(broadcastShapes([], [3])).toEqual([3]);
    expect(broadcastShapes([15, 3, 5], [15, 1, 5], [3, 1])).toEqual([15, 3, 5]);
    const msg = shapeError(() => broadcastShapes([2, 1], [8, 4, 3]));
    expect(msg).toContain("[2, 1] and [8, 4, 3]");
    const b = broadcastTo(contiguousLayout([3, 1]), [2, 3, 4]);
    expect(b.strides).toEqual([0, 1, 0]);
    expect([...elementOffsets(b)].slice(0, 6)).toEqual([0, 0, 0, 0, 1, 1]);
    expect(shapeError(() => broadcastTo(contiguousLayout([3]), [4]))).toContain("[3] to [4]");
  });

  test("reshape: contiguous, -1, and non-contiguous views that torch.view allows or refuses", () => {
    const x = contiguousLayout([2, 3, 4]);
    expect(reshape(x, [6, -1]).shape).toEqual([6, 4]);
    expect(reshape(x, [-1]).strides).toEqual([1]);
    expect(shapeError(() => reshape(x, [5, 5]))).toContain("counts differ");
    expect(shapeError(() => reshape(x, [-1, -1]))).toContain("more than one -1");
    expect(shapeError(() => reshape(x, [5, -1]))).toContain("cannot infer");
    // Permuted [4, 2, 3] (strides [1, 12, 4]): merging the last two dims is a view (12 = 4·3), merging
    // the first two is not.
    const p = permute(x, [2, 0, 1]);
    expect(isContiguous(p)).toBe(false);
    const merged = reshape(p, [4, 6]);
    expect(merged.strides).toEqual([1, 4]);
    expect([...elementOffsets(merged)]).toEqual([...elementOffsets(p)]);
    expect(shapeError(() => reshape(p, [8, 3]))).toContain("needs a copy");
    // Splitting a strided dimension and inserting size-1 dimensions stays a view.
    const split = reshape(p, [2, 2, 1, 2, 3]);
    expect([...elementOffsets(split)]).toEqual([...elementOffsets(p)]);
  });

  test("permute, transpose and slice walk the expected elements", () => {
    const x = contiguousLayout([2, 3]);
    const t = transpose(x, 0, 1);
    expect(t.shape).toEqual([3, 2]);
    expect([...elementOffsets(t)]).toEqual([0, 3, 1, 4, 2, 5]);
    expect(shapeError(() => permute(x, [0, 0]))).toContain("not a permutation");
    expect(shapeError(() => transpose(x, 0, 2))).toContain("out of range");
    const s = slice(contiguousLayout([4, 5]), 1, 1, -1, 2); // columns 1 and 3
    expect(s.shape).toEqual([4, 2]);
    expect([...elementOffsets(s)].slice(0, 4)).toEqual([1, 3, 6, 8]);
    expect(storageSpan(s)).toEqual({ lo: 1, hi: 19 });
    const empty = slice(contiguousLayout([4, 5]), 0, 3, 1);
    expect(empty.shape).toEqual([0, 5]);
    expect(shapeError(() => slice(x, 0, 0, 1, 0))).toContain("step 0");
  });
});
