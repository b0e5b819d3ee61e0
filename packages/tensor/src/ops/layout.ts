/**
 * The front-end of the layout ops: copy, slice, concat, set (in place), cast and upsample_nearest2d.
 * Checks, output shape and dtype, then the kernel (for set: the destination view itself). Semantics:
 * `Backend` in ../backend.ts.
 */
import { DTYPE_NAMES, type DTypeName, dtypeBytes } from "../dtype.ts";
import { TpError } from "../errors.ts";
import { booleanOption, checkSetArgs, integerOption, opError } from "../op-args.ts";
import { formatShape, normalizeDim } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { checkBytes, checkInput, kernel, type OpHost, run } from "./common.ts";

/** A contiguous copy of any view (permute, transpose, slice, broadcast). @throws TpError E_STATE; E_UNSUPPORTED */
export function copy(host: OpHost, x: Tensor): Tensor {
  const op = "copy";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x);
}

/**
 * A contiguous copy of elements [start, end) along `dim`, with the rules of Tensor.slice (negative
 * indices count from the end; both are clamped to the size).
 * @throws TpError E_SHAPE for a bad dim; E_ARG for non-integer bounds; E_STATE; E_UNSUPPORTED
 */
export function slice(host: OpHost, x: Tensor, dim: number, start: number, end: number): Tensor {
  const op = "slice";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  if (!Number.isInteger(start) || !Number.isInteger(end)) {
    throw opError("E_ARG", host.name, op, `start and end must be integers, got ${start} and ${end}`);
  }
  let view: Tensor;
  try {
    view = x.slice(normalizeDim(dim, x.rank), start, end);
  } catch (e) {
    if (e instanceof TpError)
      throw opError("E_SHAPE", host.name, op, `x ${formatShape(x.shape)}: ${e.message}`);
    throw e;
  }
  return run(host, host.alloc(view.shape, x.dtype, x.name), k.run, view);
}

/**
 * Join tensors along `dim` (negative counts from the end); all share dtype, rank and the other sizes.
 * @throws TpError E_ARG for an empty list or mixed dtypes; E_SHAPE naming the shapes that differ;
 *   E_STATE; E_UNSUPPORTED
 */
export function concat(host: OpHost, tensors: readonly Tensor[], dim: number): Tensor {
  const op = "concat";
  const k = kernel(host, op);
  if (!Array.isArray(tensors as unknown) || tensors.length === 0) {
    throw opError("E_ARG", host.name, op, "needs at least one tensor");
  }
  const first = tensors[0] as Tensor;
  for (let i = 0; i < tensors.length; i++) checkInput(host, op, k, tensors[i] as Tensor, `tensors[${i}]`);
  const shapes = () => tensors.map((t) => formatShape(t.shape)).join(", ");
  for (const t of tensors) {
    if (t.dtype !== first.dtype) {
      throw opError(
        "E_ARG",
        host.name,
        op,
        `all tensors must share a dtype, got ${tensors.map((u) => u.dtype).join(", ")}`,
      );
    }
  }
  let d: number;
  try {
    d = normalizeDim(dim, first.rank);
  } catch (e) {
    if (e instanceof TpError) throw opError("E_SHAPE", host.name, op, `${shapes()}: ${e.message}`);
    throw e;
  }
  let size = 0;
  for (const t of tensors) {
    if (t.rank !== first.rank || t.shape.some((n, i) => i !== d && n !== first.shape[i])) {
      throw opError("E_SHAPE", host.name, op, `${shapes()}: sizes must match except along dim ${d}`);
    }
    size += t.shape[d] as number;
  }
  const shape = first.shape.slice();
  shape[d] = size;
  return run(host, host.alloc(shape, first.dtype, first.name), k.run, tensors, d);
}

/**
 * In-place write of `src` into the view `dst` (Backend.set); nothing runs for an empty src.
 * @throws TpError E_SHAPE, E_ARG (checkSetArgs: dtypes, a broadcast or overlapping dst, shared
 *   storage); E_STATE; E_UNSUPPORTED
 */
export function set(host: OpHost, dst: Tensor, src: Tensor): void {
  const op = "set";
  const k = kernel(host, op);
  checkInput(host, op, k, dst, "dst");
  checkInput(host, op, k, src, "src");
  checkSetArgs(host.name, dst, src);
  if (src.numel > 0) k.run(dst, src);
}

/**
 * Elementwise dtype conversion (Backend.cast) with the rounding rules of convert.ts.
 * @param options.saturate f32 → fp8: clamp overflow to ±max finite (a boolean, default false)
 * @throws TpError E_ARG for a dtype that is not one of DTYPE_NAMES or a saturate that is not a
 *   boolean; E_UNSUPPORTED `op cast on backend B: no conversion A → C` for dtypes the kernel does not
 *   list (and, from the kernel, for a pair it lacks); E_STATE
 */
export function cast(
  host: OpHost,
  x: Tensor,
  dtype: DTypeName,
  options?: { saturate?: boolean } | null,
): Tensor {
  const op = "cast";
  const k = kernel(host, op);
  host.assertOwned(x);
  if (typeof dtype !== "string" || !(DTYPE_NAMES as readonly string[]).includes(dtype)) {
    const given = typeof dtype === "string" ? JSON.stringify(dtype) : String(dtype);
    throw opError(
      "E_ARG",
      host.name,
      op,
      `unknown dtype ${given}; expected one of: ${DTYPE_NAMES.join(", ")}`,
    );
  }
  const saturate = booleanOption(host.name, op, "saturate", options?.saturate, false);
  if (!k.dtypes.includes(x.dtype) || !k.dtypes.includes(dtype)) {
    throw opError(
      "E_UNSUPPORTED",
      host.name,
      op,
      `no conversion ${x.dtype} → ${dtype} (it converts between ${k.dtypes.join(", ")})`,
    );
  }
  if (k.maxBytes !== undefined) {
    checkBytes(host, op, k.maxBytes, x.byteLength, `x ${formatShape(x.shape)}`);
    checkBytes(host, op, k.maxBytes, x.numel * dtypeBytes(dtype), `the ${dtype} output`);
  }
  return run(host, host.alloc(x.shape, dtype, x.name), k.run, x, saturate);
}

/**
 * Nearest-neighbour upsampling by an integer factor in [1, 2^16] on the last two dimensions.
 * @throws TpError E_SHAPE for rank < 2; E_ARG for a bad factor; E_STATE; E_UNSUPPORTED
 */
export function upsampleNearest2d(host: OpHost, x: Tensor, factor: number): Tensor {
  const op = "upsample_nearest2d";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  if (x.rank < 2)
    throw opError("E_SHAPE", host.name, op, `x ${formatShape(x.shape)} needs at least two dimensions`);
  const f = integerOption(host.name, op, "factor", factor, 1, 2 ** 16);
  const shape = x.shape.slice();
  shape[x.rank - 2] = (shape[x.rank - 2] as number) * f;
  shape[x.rank - 1] = (shape[x.rank - 1] as number) * f;
  return run(host, host.alloc(shape, x.dtype, x.name), k.run, x, f);
}
