/**
 * What the kernels of the cpu backend share: the view of the backend they need ({@link CpuOpHost}),
 * the native region of a tensor, and contiguous copies of strided inputs for the kernels that read
 * row-major data. The arguments were checked by the op front-end of @tp/tensor (src/ops) before any
 * kernel here runs; a kernel only computes.
 *
 * The pattern of a kernel that needs contiguous inputs: when one of them is strided it calls itself
 * again inside `host.scope` with {@link dense} copies (with {@link onDense} when it has several
 * inputs), which the scope frees when the kernel returns; the common, contiguous case runs with no
 * scope, no closure and no copy.
 */
import { type DTypeName, dtypeBytes, type Shape, type Tensor } from "@tp/tensor";
import type { NativeContext, Pointer } from "../ffi.ts";
import { copyStrided, type NativeRegion } from "./native.ts";

/** The parts of CpuBackend the kernels use. */
export interface CpuOpHost {
  /** "cpu". */
  readonly name: string;
  /** The native context kernels run on. */
  readonly ctx: NativeContext;
  /** A new contiguous tensor (accounted; freed by the innermost open scope). @throws E_OOM */
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor;
  /** Free a tensor's storage. @throws E_STATE */
  free(t: Tensor): void;
  /** Run `fn`, freeing every tensor allocated inside except what it returns (BackendBase.scope). */
  scope<T>(fn: () => T): T;
  /** Address of a contiguous tensor's first element (null when empty). @throws E_STATE, E_UNSUPPORTED */
  elementPointer(t: Tensor, op: string): Pointer | null;
  /**
   * Address of any view's first element and the bytes from there to the end of its storage.
   * @throws TpError E_STATE for a freed or foreign tensor
   */
  viewRegion(t: Tensor): NativeRegion;
}

/** The region of a contiguous tensor's elements. */
export function region(host: CpuOpHost, t: Tensor, op: string): NativeRegion {
  return { ptr: host.elementPointer(t, op), bytes: t.byteLength };
}

/** {@link region}, or null for an absent optional input. */
export function optionalRegion(host: CpuOpHost, t: Tensor | null, op: string): NativeRegion | null {
  return t === null ? null : region(host, t, op);
}

/** True when some given tensor is not contiguous (null entries count as contiguous). */
export function strided(a: Tensor | null, b: Tensor | null = null, c: Tensor | null = null): boolean {
  return (
    (a !== null && !a.isContiguous) || (b !== null && !b.isContiguous) || (c !== null && !c.isContiguous)
  );
}

/**
 * `t` when contiguous, else a contiguous copy allocated in the innermost open scope (call it inside
 * `host.scope`, which frees the copy).
 */
export function dense(host: CpuOpHost, t: Tensor, op: string): Tensor {
  if (t.isContiguous) return t;
  const c = host.alloc(t.shape, t.dtype, `${t.name ?? "tensor"} (contiguous copy for ${op})`);
  copyInto(host, t, c, op);
  return c;
}

/** {@link dense} of an optional input. */
export function denseOrNull(host: CpuOpHost, t: Tensor | null, op: string): Tensor | null {
  return t === null ? null : dense(host, t, op);
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
 * Run `kernel` on {@link dense} copies of the inputs a, b, c (b and c may be null) inside `host.scope`,
 * which frees the copies when it returns: the strided case of a kernel that reads row-major inputs,
 * called after {@link strided} said so (the contiguous case calls the native kernel directly).
 */
export function onDense<B extends Tensor | null, C extends Tensor | null>(
  host: CpuOpHost,
  op: string,
  a: Tensor,
  b: B,
  c: C,
  kernel: (a: Tensor, b: B, c: C) => void,
): void {
  host.scope(() => kernel(dense(host, a, op), denseOrNull(host, b, op) as B, denseOrNull(host, c, op) as C));
}
