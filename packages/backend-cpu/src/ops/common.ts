/**
 * What the op implementations of the cpu backend share: the view of the backend they need
 * ({@link CpuOpHost}), argument checks that raise the right TpError (E_STATE for a freed or foreign
 * tensor, E_UNSUPPORTED naming op, backend and dtype, E_SHAPE naming the shapes, E_ARG for a bad
 * option), and temporaries: inputs that are strided views are copied to contiguous scratch tensors
 * (accounted like any tensor) and freed when the op returns.
 */
import {
  type DTypeName,
  dtypeBytes,
  finiteOption,
  formatShape,
  integerOption,
  opError,
  type Shape,
  type Tensor,
  TpError,
} from "@tp/tensor";
import type { NativeContext, Pointer } from "../ffi.ts";
import { copyStrided, type NativeRegion } from "./native.ts";

/** The parts of CpuBackend the op implementations use. */
export interface CpuOpHost {
  /** "cpu". */
  readonly name: string;
  /** The native context kernels run on. */
  readonly ctx: NativeContext;
  /** A new contiguous tensor (accounted). @throws E_OOM */
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor;
  /** Free a tensor's storage. @throws E_STATE */
  free(t: Tensor): void;
  /** Address of a contiguous tensor's first element (null when empty). @throws E_STATE, E_UNSUPPORTED */
  elementPointer(t: Tensor, op: string): Pointer | null;
  /**
   * Address of any view's first element and the bytes from there to the end of its storage.
   * @throws TpError E_STATE for a freed or foreign tensor
   */
  viewRegion(t: Tensor): NativeRegion;
  /** @throws TpError E_STATE when `t` is freed or belongs to another backend. */
  checkOwned(t: Tensor): void;
}

/** A TpError E_SHAPE for op `op`. */
export function shapeError(op: string, message: string): TpError {
  return opError("E_SHAPE", "cpu", op, message);
}

/** A TpError E_ARG for op `op`. */
export function argError(op: string, message: string): TpError {
  return opError("E_ARG", "cpu", op, message);
}

/** "x f32 [2, 3]": a tensor in messages. */
export function shown(t: Tensor, fallback: string): string {
  return `${t.name ?? fallback} ${t.dtype} ${formatShape(t.shape)}`;
}

/**
 * Check that every tensor is live and belongs to `host` (E_STATE), then that its dtype is one of
 * `dtypes` (E_UNSUPPORTED naming op, backend, dtype and what is supported).
 */
export function checkTensors(
  host: CpuOpHost,
  op: string,
  dtypes: readonly DTypeName[],
  tensors: Record<string, Tensor | null | undefined>,
): void {
  // for…in, not Object.entries: this runs for every op call and should allocate nothing
  for (const name in tensors) {
    const t = tensors[name];
    if (t === null || t === undefined) continue;
    host.checkOwned(t);
    if (!dtypes.includes(t.dtype)) {
      throw new TpError(
        "E_UNSUPPORTED",
        `op ${op} on backend cpu does not support dtype ${t.dtype} (${name} ${formatShape(t.shape)}); supported: ${dtypes.join(", ")}`,
      );
    }
  }
}

/**
 * Copy any view `src` into the view `dst` of the same shape and dtype (tp_cpu_copy).
 * @param op the op named in errors (default "copy")
 * @throws TpError E_ARG naming `op` (rank above 16, ...); E_STATE for a freed or foreign tensor
 */
export function copyInto(host: CpuOpHost, src: Tensor, dst: Tensor, op = "copy"): void {
  const size = dtypeBytes(src.dtype) as 1 | 2 | 4 | 8;
  copyStrided(
    host.ctx,
    host.viewRegion(src),
    src.strides,
    host.viewRegion(dst),
    dst.strides,
    src.shape,
    size,
    op,
  );
}

/**
 * Scratch tensors of one op call: contiguous copies of strided inputs, freed by {@link release}.
 * Use as `const s = new OpScope(host, op); try { ... } finally { s.release(); }`.
 */
export class OpScope {
  readonly #host: CpuOpHost;
  readonly #op: string;
  readonly #temps: Tensor[] = [];

  constructor(host: CpuOpHost, op: string) {
    this.#host = host;
    this.#op = op;
  }

  /** The region of `t`'s elements in row-major order: `t` itself when contiguous, else a copy. */
  contiguous(t: Tensor): NativeRegion {
    const host = this.#host;
    let c = t;
    if (!t.isContiguous) {
      c = host.alloc(t.shape, t.dtype, `${t.name ?? "tensor"} (contiguous copy for ${this.#op})`);
      this.#temps.push(c);
      copyInto(host, t, c, this.#op);
    }
    return { ptr: host.elementPointer(c, this.#op), bytes: c.byteLength };
  }

  /** An optional input: null stays null. */
  optional(t: Tensor | null | undefined): NativeRegion | null {
    return t === null || t === undefined ? null : this.contiguous(t);
  }

  /** Free the scratch tensors. */
  release(): void {
    for (const t of this.#temps.splice(0)) this.#host.free(t);
  }
}

/**
 * Allocate the output, run `fill` on its region, and return it; the output is freed if `fill` throws.
 */
export function produce(
  host: CpuOpHost,
  op: string,
  shape: Shape,
  dtype: DTypeName,
  name: string | undefined,
  fill: (out: NativeRegion, t: Tensor) => void,
): Tensor {
  const out = host.alloc(shape, dtype, name);
  try {
    fill({ ptr: host.elementPointer(out, op), bytes: out.byteLength }, out);
  } catch (e) {
    host.free(out);
    throw e;
  }
  return out;
}

/** Run `body` with a scope whose scratch tensors are freed afterwards. */
export function scoped<T>(host: CpuOpHost, op: string, body: (s: OpScope) => T): T {
  const s = new OpScope(host, op);
  try {
    return body(s);
  } finally {
    s.release();
  }
}

/** `v` as a finite number, else E_ARG naming the option. */
export function finite(op: string, name: string, v: unknown): number {
  return finiteOption("cpu", op, name, v);
}

/** `v` as a boolean, or `fallback` when undefined; else E_ARG naming op and option. */
export function booleanOption(op: string, name: string, v: unknown, fallback: boolean): boolean {
  if (v === undefined) return fallback;
  if (typeof v !== "boolean") throw argError(op, `${name} must be a boolean, got ${shownValue(v)}`);
  return v;
}

/** A value in messages: strings quoted, other primitives as String() gives them, else the type. */
function shownValue(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v);
  return v === null || (typeof v !== "object" && typeof v !== "function") ? String(v) : typeof v;
}

/** An integer in [lo, hi], else E_ARG naming the option. */
export function integer(
  op: string,
  name: string,
  v: unknown,
  lo: number,
  hi = Number.MAX_SAFE_INTEGER,
): number {
  return integerOption("cpu", op, name, v, lo, hi);
}
