/**
 * What the op front-end (./*.ts, called by BackendBase's op methods) shares: the view of a backend it
 * needs ({@link OpHost}), the lookup of a kernel entry (E_UNSUPPORTED naming backend and op when the
 * table has none), the check of an input (E_STATE for a freed or foreign tensor, E_UNSUPPORTED naming
 * op, backend, dtype and what the entry takes) and the run of an entry on a new output, freed again
 * when the entry throws. Messages read `op NAME on backend B: ...` (op-args.ts).
 */
import type { OpName } from "../backend.ts";
import type { DTypeName, WeightFormat } from "../dtype.ts";
import { TpError } from "../errors.ts";
import type { KernelEntry, KernelSignatures, KernelTable } from "../kernels.ts";
import { formatShape, type Shape } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { Weight } from "../weight.ts";

/** The parts of a backend (BackendBase) the front-end uses. */
export interface OpHost {
  /** Registry name, for messages. */
  readonly name: string;
  /** The kernels this backend has. */
  readonly kernelTable: KernelTable;
  /** A new contiguous tensor (accounted). @throws E_OOM, E_STATE */
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor;
  /** Free a tensor's storage. @throws E_STATE */
  free(t: Tensor): void;
  /** @throws TpError E_STATE when `t` is not a live tensor of this backend. */
  assertOwned(t: Tensor): void;
}

/** The index dtype every op contract fixes (positions, ids, argmax / top_k indices). */
export const INDEX_DTYPE: DTypeName = "i32";

/**
 * The entry of `op` in the host's table.
 * @throws TpError E_UNSUPPORTED `op NAME is not implemented on backend B` when the table has none
 */
export function kernel<Op extends OpName>(host: OpHost, op: Op): KernelEntry<KernelSignatures[Op]> {
  const entry = host.kernelTable[op];
  if (entry === undefined) {
    throw new TpError("E_UNSUPPORTED", `op ${op} is not implemented on backend ${host.name}`);
  }
  return entry as KernelEntry<KernelSignatures[Op]>;
}

/**
 * Check that `t` is a live tensor of the host (E_STATE) whose dtype is one of `dtypes` (by default the
 * entry's) and whose elements fit the entry's `maxBytes`. A null `t` (an absent optional input) passes.
 * @param what the input's name in messages ("x", "weight", "positions")
 * @throws TpError E_STATE; E_UNSUPPORTED `op NAME on backend B does not support dtype D (what [shape]);
 *   supported: ...`, or naming the bytes past `maxBytes`
 */
export function checkInput(
  host: OpHost,
  op: OpName,
  entry: KernelEntry<unknown>,
  t: Tensor | null,
  what: string,
  dtypes: readonly DTypeName[] = entry.dtypes,
): void {
  if (t === null) return;
  host.assertOwned(t);
  if (!dtypes.includes(t.dtype)) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend ${host.name} does not support dtype ${t.dtype} (${what} ${formatShape(t.shape)}); supported: ${dtypes.join(", ")}`,
    );
  }
  if (entry.maxBytes !== undefined)
    checkBytes(host, op, entry.maxBytes, t.byteLength, `${what} ${formatShape(t.shape)}`);
}

/** The dtypes of an index tensor (the op contract: i32). */
const INDEX_DTYPES: readonly DTypeName[] = [INDEX_DTYPE];

/** As {@link checkInput} for an index tensor: i32 only, within the entry's maxBytes. */
export function checkIndex(
  host: OpHost,
  op: OpName,
  entry: KernelEntry<unknown>,
  t: Tensor,
  what: string,
): void {
  checkInput(host, op, entry, t, what, INDEX_DTYPES);
}

/**
 * @throws TpError E_UNSUPPORTED when `bytes` (of the tensor `what`) exceed a kernel's `maxBytes`,
 *   before anything is allocated
 */
export function checkBytes(host: OpHost, op: OpName, maxBytes: number, bytes: number, what: string): void {
  if (bytes > maxBytes) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend ${host.name}: ${what} holds ${bytes} bytes; the kernel takes at most ${maxBytes} per tensor`,
    );
  }
}

/** "x f32 [2, 3]": a tensor in messages (its name, else `fallback`). */
export function shown(t: Tensor, fallback: string): string {
  return `${t.name ?? fallback} ${t.dtype} ${formatShape(t.shape)}`;
}

/** "weight blk.0.ffn_up.weight q4_k [N, K]" in messages. */
export function shownWeight(w: Weight): string {
  return `weight ${w.name} ${w.format} ${formatShape(w.shape)}`;
}

/**
 * Check that `w` is a {@link Weight} whose format the entry lists.
 * @throws TpError E_ARG when it is not a Weight (its constructor is what checks bytes against shape);
 *   E_UNSUPPORTED `op NAME on backend B does not support weight format F (weight ...); supported: ...`
 */
export function checkWeight(
  host: OpHost,
  op: "matmul" | "matmul_id" | "embedding",
  formats: readonly WeightFormat[] | undefined,
  w: Weight,
): void {
  const value: unknown = w;
  if (!(value instanceof Weight)) {
    const given =
      value === null || typeof value !== "object"
        ? String(value)
        : `an object of class ${(value as { constructor?: { name?: string } }).constructor?.name ?? "(none)"}`;
    throw new TpError(
      "E_ARG",
      `op ${op} on backend ${host.name}: the weight must be a Weight of @tp/tensor (new Weight({ ... }) checks its bytes against its shape), got ${given}`,
    );
  }
  if (formats === undefined || !formats.includes(w.format)) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend ${host.name} does not support weight format ${w.format} (${shownWeight(w)}); supported: ${(formats ?? []).join(", ") || "none"}`,
    );
  }
}

/**
 * Run a kernel on its new output: `f(out, a, b, ...)`, returning `out`, or freeing it and rethrowing
 * when `f` throws. Fixed parameters rather than a rest array, so that the op path allocates nothing
 * here; a kernel of fewer parameters ignores the undefined ones.
 */
export function run<
  A,
  B = undefined,
  C = undefined,
  D = undefined,
  E = undefined,
  F = undefined,
  G = undefined,
>(
  host: OpHost,
  out: Tensor,
  f: (out: Tensor, a: A, b: B, c: C, d: D, e: E, f: F, g: G) => void,
  a: A,
  b?: B,
  c?: C,
  d?: D,
  e?: E,
  ff?: F,
  g?: G,
): Tensor {
  try {
    f(out, a, b as B, c as C, d as D, e as E, ff as F, g as G);
  } catch (err) {
    discard(host, out, err);
  }
  return out;
}

/** Free `out` after its kernel threw, and rethrow. */
export function discard(host: OpHost, out: Tensor, e: unknown): never {
  if (!out.storage.freed) host.free(out);
  throw e;
}
