/**
 * The front-end of the sampling helpers: argmax and top_k along the last dimension (order: larger
 * first, NaN above every number, ties to the lower index — the kernels' contract), and the
 * count of non-finite elements that the pipelines' stage checks read.
 */
import { integerOption, opError } from "../op-args.ts";
import { formatShape } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { checkInput, discard, INDEX_DTYPE, kernel, type OpHost, run } from "./common.ts";

/** The last dimension n of x; E_SHAPE for a scalar, for rows of 0 values (when there are rows) and past i32. */
function rowLength(host: OpHost, op: string, x: Tensor, needValues: boolean): number {
  if (x.rank < 1)
    throw opError("E_SHAPE", host.name, op, `x ${formatShape(x.shape)} needs at least one dimension`);
  const n = x.shape[x.rank - 1] as number;
  if (!needValues) return n;
  if (n === 0 && x.shape.slice(0, -1).every((d) => d > 0)) {
    throw opError("E_SHAPE", host.name, op, `x ${formatShape(x.shape)}: rows of 0 values have no maximum`);
  }
  if (n > 2 ** 31 - 1)
    throw opError("E_SHAPE", host.name, op, `x ${formatShape(x.shape)}: rows longer than i32 indices`);
  return n;
}

/**
 * Index of the largest value along the last dimension → i32 [...leading].
 * @throws TpError E_SHAPE for a scalar or empty rows; E_STATE; E_UNSUPPORTED
 */
export function argmax(host: OpHost, x: Tensor): Tensor {
  const op = "argmax";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  rowLength(host, op, x, true);
  return run(host, host.alloc(x.shape.slice(0, -1), INDEX_DTYPE, x.name), k.run, x);
}

/**
 * The k largest values along the last dimension, descending, and their i32 indices ([..., k] each).
 * @throws TpError E_ARG for k outside [0, n]; E_SHAPE for a scalar (or, k > 0, empty rows); E_STATE;
 *   E_UNSUPPORTED
 */
export function topK(host: OpHost, x: Tensor, k: number): { values: Tensor; indices: Tensor } {
  const op = "top_k";
  const entry = kernel(host, op);
  checkInput(host, op, entry, x, "x");
  const n = rowLength(host, op, x, false);
  const kk = integerOption(host.name, op, "k", k, 0, n);
  if (kk > 0) rowLength(host, op, x, true);
  const shape = x.shape.slice();
  shape[shape.length - 1] = kk;
  const values = host.alloc(shape, x.dtype, x.name);
  let indices: Tensor;
  try {
    indices = host.alloc(shape, INDEX_DTYPE, x.name);
  } catch (e) {
    discard(host, values, e);
  }
  try {
    entry.run(values, indices, x, kk);
  } catch (e) {
    host.free(indices);
    discard(host, values, e);
  }
  return { values, indices };
}

/**
 * The number of NaN / ±∞ elements of x (any shape, any view) → i32 [] (saturating at 2^31 − 1).
 * @throws TpError E_STATE; E_UNSUPPORTED for a dtype the entry lacks
 */
export function countNonFinite(host: OpHost, x: Tensor): Tensor {
  const op = "count_nonfinite";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  return run(host, host.alloc([], INDEX_DTYPE, x.name), k.run, x);
}
