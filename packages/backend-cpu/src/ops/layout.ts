/**
 * Layout ops of the cpu backend: copy (materialise any view, any dtype), slice (a contiguous copy of a
 * range along one dimension), concat (any dtype; inputs may be views) and upsampleNearest2d (f32).
 * copy / slice / concat run the strided copy kernel (native/cpu/layout.c).
 */
import { checkSetArgs, dtypeBytes, formatShape, normalizeDim, type Tensor, TpError } from "@tp/tensor";
import {
  argError,
  type CpuOpHost,
  checkTensors,
  copyInto,
  integer,
  produce,
  scoped,
  shapeError,
} from "./common.ts";
import { upsampleNearest2dF32 } from "./native.ts";

/** Element sizes the copy kernel moves (every dtype of @tp/tensor). */
function checkCopyable(host: CpuOpHost, op: string, t: Tensor): void {
  host.viewRegion(t);
  const size = dtypeBytes(t.dtype);
  if (size !== 1 && size !== 2 && size !== 4 && size !== 8) {
    throw new TpError("E_UNSUPPORTED", `op ${op} on backend cpu does not support dtype ${t.dtype}`);
  }
}

/**
 * A contiguous copy of any view (permute, transpose, slice, broadcast), any dtype.
 * @throws TpError E_ARG for a rank above 16; E_STATE
 */
export function copy(host: CpuOpHost, x: Tensor): Tensor {
  return copyAs(host, "copy", x);
}

/** {@link copy} on behalf of `op` (named in errors). */
function copyAs(host: CpuOpHost, op: string, x: Tensor): Tensor {
  checkCopyable(host, op, x);
  const out = host.alloc(x.shape, x.dtype, x.name);
  try {
    copyInto(host, x, out, op);
  } catch (e) {
    host.free(out);
    throw e;
  }
  return out;
}

/**
 * Backend.set: write `src` into the view `dst` in place (same shape and dtype, any dtype) with the
 * strided copy kernel.
 * @throws TpError E_SHAPE, E_ARG (see @tp/tensor checkSetArgs: dtypes, a broadcast dst or one whose
 *   elements overlap, shared storage); E_STATE
 */
export function set(host: CpuOpHost, dst: Tensor, src: Tensor): void {
  const op = "set";
  checkCopyable(host, op, dst);
  checkCopyable(host, op, src);
  checkSetArgs("cpu", dst, src);
  if (src.numel > 0) copyInto(host, src, dst, op);
}

/**
 * A contiguous copy of elements [start, end) along `dim`, with the rules of Tensor.slice (negative
 * indices count from the end, both are clamped to the size).
 * @throws TpError E_SHAPE for a bad dim; E_ARG for non-integer bounds; E_STATE
 */
export function slice(host: CpuOpHost, x: Tensor, dim: number, start: number, end: number): Tensor {
  const op = "slice";
  checkCopyable(host, op, x);
  if (!Number.isInteger(start) || !Number.isInteger(end)) {
    throw argError(op, `start and end must be integers, got ${start} and ${end}`);
  }
  let view: Tensor;
  try {
    view = x.slice(normalizeDim(dim, x.rank), start, end);
  } catch (e) {
    if (e instanceof TpError) throw shapeError(op, `x ${formatShape(x.shape)}: ${e.message}`);
    throw e;
  }
  return copyAs(host, op, view);
}

/**
 * Join tensors along `dim` (negative counts from the end); all share dtype, rank and the other sizes.
 * @throws TpError E_ARG for an empty list or mixed dtypes; E_SHAPE naming the shapes that differ; E_STATE
 */
export function concat(host: CpuOpHost, tensors: readonly Tensor[], dim: number): Tensor {
  const op = "concat";
  if (!Array.isArray(tensors as unknown) || tensors.length === 0)
    throw argError(op, "needs at least one tensor");
  const first = tensors[0] as Tensor;
  for (const t of tensors) checkCopyable(host, op, t);
  const shapes = tensors.map((t) => formatShape(t.shape)).join(", ");
  if (tensors.some((t) => t.dtype !== first.dtype)) {
    throw argError(op, `all tensors must share a dtype, got ${tensors.map((t) => t.dtype).join(", ")}`);
  }
  let d: number;
  try {
    d = normalizeDim(dim, first.rank);
  } catch (e) {
    if (e instanceof TpError) throw shapeError(op, `${shapes}: ${e.message}`);
    throw e;
  }
  for (const t of tensors) {
    if (t.rank !== first.rank || t.shape.some((n, i) => i !== d && n !== first.shape[i])) {
      throw shapeError(op, `${shapes}: sizes must match except along dim ${d}`);
    }
  }
  const shape = [...first.shape];
  shape[d] = tensors.reduce((a, t) => a + (t.shape[d] as number), 0);
  const out = host.alloc(shape, first.dtype, first.name);
  try {
    let at = 0;
    for (const t of tensors) {
      const size = t.shape[d] as number;
      if (t.numel > 0) copyInto(host, t, out.slice(d, at, at + size), op);
      at += size;
    }
  } catch (e) {
    host.free(out);
    throw e;
  }
  return out;
}

/**
 * Nearest-neighbour upsampling by an integer factor on the last two dimensions of an f32 tensor.
 * @throws TpError E_SHAPE for rank < 2; E_ARG for a bad factor; E_STATE, E_UNSUPPORTED (not f32)
 */
export function upsampleNearest2d(host: CpuOpHost, x: Tensor, factor: number): Tensor {
  const op = "upsample_nearest2d";
  checkTensors(host, op, ["f32"], { x });
  if (x.rank < 2) throw shapeError(op, `x ${formatShape(x.shape)} needs at least two dimensions`);
  const f = integer(op, "factor", factor, 1, 2 ** 16);
  const h = x.shape[x.rank - 2] as number;
  const w = x.shape[x.rank - 1] as number;
  const planes = x.numel === 0 ? 0 : x.numel / (h * w);
  const shape = [...x.shape.slice(0, -2), h * f, w * f];
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    return produce(host, op, shape, "f32", x.name, (out) =>
      upsampleNearest2dF32(host.ctx, xr, out, planes, h, w, f),
    );
  });
}
