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
 * `v` as a boolean, or `fallback` when undefined.
 * @throws TpError E_ARG naming backend, op and option `name`
 */
export function booleanOption(
  backend: string,
  op: string,
  name: string,
  v: unknown,
  fallback: boolean,
): boolean {
  if (v === undefined) return fallback;
  if (typeof v !== "boolean") {
    const shownV =
      typeof v === "string" ? JSON.stringify(v) : v === null || typeof v !== "object" ? String(v) : typeof v;
    throw opError("E_ARG", backend, op, `${name} must be a boolean, got ${shownV}`);
  }
  return v;
}

/**
 * `v` as a normalisation epsilon: a finite number ≥ 0.
 * @throws TpError E_ARG naming backend, op and `eps`
 */
export function epsOption(backend: string, op: string, v: unknown): number {
  const e = finiteOption(backend, op, "eps", v);
  if (e < 0) throw opError("E_ARG", backend, op, `eps must be >= 0, got ${e}`);
  return e;
}

/**
 * The scalar options of `attention` as an f32 kernel receives them: `scale` (default 1/√headDim, 1
 * when headDim is 0) finite once rounded to f32; `softcap` absent (0 to the kernel: none) or, when
 * given, finite and positive once rounded to f32 — 1e-50 would reach the kernel as 0 and silently mean
 * "none", 1e300 as +inf.
 * @throws TpError E_ARG naming backend, op and the option
 */
export function attentionScalars(
  backend: string,
  op: string,
  options: { readonly scale?: number; readonly softcap?: number },
  headDim: number,
): { scale: number; softcap: number } {
  const f32 = (name: string, v: unknown): number => {
    const x = finiteOption(backend, op, name, v);
    if (!Number.isFinite(Math.fround(x))) {
      throw opError(
        "E_ARG",
        backend,
        op,
        `${name} must be finite in f32 (|${name}| < 3.4028235e38), got ${x}`,
      );
    }
    return x;
  };
  const scale =
    options.scale === undefined ? (headDim > 0 ? 1 / Math.sqrt(headDim) : 1) : f32("scale", options.scale);
  const softcap = options.softcap === undefined ? 0 : f32("softcap", options.softcap);
  if (options.softcap !== undefined && !(Math.fround(softcap) > 0)) {
    const why = softcap > 0 ? " (it rounds to 0 in f32, which the kernel reads as no softcap)" : "";
    throw opError("E_ARG", backend, op, `softcap must be positive, got ${softcap}${why}`);
  }
  return { scale, softcap };
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

/** Views of at most this many elements whose strides do not prove them one-to-one are checked exactly. */
const EXACT_OVERLAP_CHECK = 2 ** 16;

/**
 * Whether two elements of the view `t` share an address: "no", "yes", or "maybe" for a large view
 * the test cannot decide. Sufficient test first (the dimensions of size > 1 sorted by stride, each
 * stride beyond the span of the smaller ones, as native/cpu/attention.c checks an output); a view that
 * fails it is enumerated when it has at most {@link EXACT_OVERLAP_CHECK} elements. Views made by
 * reshape / permute / slice / transpose always pass the first test.
 */
function overlapping(t: Tensor): "no" | "yes" | "maybe" {
  if (t.numel <= 1) return "no";
  const dims: [number, number][] = [];
  for (let i = 0; i < t.rank; i++) {
    const n = t.shape[i] as number;
    if (n > 1) dims.push([t.strides[i] as number, n]);
  }
  dims.sort((a, b) => a[0] - b[0]);
  let span = 0; // the farthest offset the smaller strides reach
  let proven = true;
  for (const [s, n] of dims) {
    if (s <= span) {
      proven = false;
      break;
    }
    span += (n - 1) * s;
  }
  if (proven) return "no";
  if (t.numel > EXACT_OVERLAP_CHECK) return "maybe";
  let offsets = [0];
  for (const [s, n] of dims) {
    const next: number[] = [];
    for (let j = 0; j < n; j++) for (const o of offsets) next.push(o + j * s);
    offsets = next;
  }
  return new Set(offsets).size !== offsets.length ? "yes" : "no";
}

/**
 * The checks of the `set` op (Backend.set): same shape and dtype, a dst that is not a broadcast view
 * and whose elements do not overlap (shape [4, 4], strides [1, 1]: which write would win?), and no
 * storage shared between dst and src.
 * @throws TpError E_SHAPE when shapes differ; E_ARG for different dtypes, a broadcast dst, a dst whose
 *   elements overlap (or, past 2^16 elements, whose strides do not show that they do not), or shared
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
  const overlap = overlapping(dst);
  if (overlap !== "no") {
    const what =
      overlap === "yes" ? "has elements that share an address" : "may have elements that share an address";
    throw opError(
      "E_ARG",
      backend,
      op,
      `dst ${dst.describe()} ${what} (strides [${dst.strides.join(", ")}]); it cannot be written`,
    );
  }
  if (dst.storage === src.storage && dst.numel > 0) {
    throw opError("E_ARG", backend, op, `dst and src share storage (${dst.describe()}); copy src first`);
  }
}
