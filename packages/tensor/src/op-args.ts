/**
 * Checks of op options shared by every backend (`eps`, `scale`, group counts, …), so that each backend
 * reports a bad option with the same words: `op NAME on backend B: …`.
 */
import { TpError } from "./errors.ts";
import type { Tensor } from "./tensor.ts";

/** A TpError with `code` for op `op` on backend `backend`. */
export function opError(
  code: "E_SHAPE" | "E_ARG" | "E_UNSUPPORTED",
  backend: string,
  op: string,
  message: string,
): TpError {
  return new TpError(code, `op ${op} on backend ${backend}: ${message}`);
}

/**
 * `v` as a finite number.
 * @throws TpError E_ARG naming backend, op and option `name`
 */
export function finiteOption(backend: string, op: string, name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw opError("E_ARG", backend, op, `${name} must be a finite number, got ${String(v)}`);
  }
  return v;
}

/**
 * `v` as a safe integer in [lo, hi].
 * @throws TpError E_ARG naming backend, op, option `name` and the range
 */
export function integerOption(
  backend: string,
  op: string,
  name: string,
  v: unknown,
  lo: number,
  hi = Number.MAX_SAFE_INTEGER,
): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < lo || v > hi) {
    const range = hi === Number.MAX_SAFE_INTEGER ? `>= ${lo}` : `in [${lo}, ${hi}]`;
    throw opError("E_ARG", backend, op, `${name} must be an integer ${range}, got ${String(v)}`);
  }
  return v;
}

/**
 * The checks of the `set` op (Backend.set): same shape and dtype, a dst that is not a broadcast view,
 * and no storage shared between dst and src.
 * @throws TpError E_SHAPE when shapes differ; E_ARG for different dtypes, a broadcast dst or shared
 *   storage — each naming backend and op
 */
export function checkSetArgs(backend: string, dst: Tensor, src: Tensor): void {
  const op = "set";
  if (dst.shape.length !== src.shape.length || dst.shape.some((n, i) => n !== src.shape[i])) {
    throw opError("E_SHAPE", backend, op, `dst ${dst.describe()} and src ${src.describe()} differ in shape`);
  }
  if (dst.dtype !== src.dtype) {
    throw opError("E_ARG", backend, op, `dst is ${dst.dtype} but src is ${src.dtype}; cast src first`);
  }
  if (dst.shape.some((n, i) => n > 1 && dst.strides[i] === 0)) {
    throw opError("E_ARG", backend, op, `dst ${dst.describe()} is a broadcast view; it cannot be written`);
  }
  if (dst.storage === src.storage && dst.numel > 0) {
    throw opError("E_ARG", backend, op, `dst and src share storage (${dst.describe()}); copy src first`);
  }
}
