/**
 * Checks of op options shared by every backend (`eps`, `scale`, group counts, …), so that each backend
 * reports a bad option with the same words: `op NAME on backend B: …`.
 */
import { TpError } from "./errors.ts";

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
