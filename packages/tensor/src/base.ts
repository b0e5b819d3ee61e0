/**
 * `BackendBase`: everything a backend shares — memory accounting, storage ids, scopes, argument checks
 * for alloc / upload / free, `read` of any view — and the op methods of `Backend`, written once: each
 * checks its arguments, allocates its output and calls the backend's kernel table (./ops/*.ts, the
 * front-end; ./kernels.ts, the table). `supports` answers from the table, and an op without an entry
 * is E_UNSUPPORTED naming backend and op, never a silent fallback. A backend subclasses it, implements
 * four storage primitives and assigns `kernelTable`.
 *
 * Source: ggml `ggml-backend-impl.h` (buffer interface: alloc / free / set_tensor / get_tensor).
 */

import type {
  AttentionOptions,
  Backend,
  BackendCapabilities,
  Conv2dOptions,
  HostArray,
  OpName,
  RopeOptions,
} from "./backend.ts";
import type { WeightFormat } from "./dtype.ts";
import { type DTypeName, dtypeBytes, dtypeInfo } from "./dtype.ts";
import { TpError } from "./errors.ts";
import { EMPTY_KERNEL_TABLE, type KernelTable, tableCapabilities, tableSupports } from "./kernels.ts";
import { MemoryAccount } from "./memory.ts";
import * as elementwise from "./ops/elementwise.ts";
import * as layout from "./ops/layout.ts";
import * as linear from "./ops/linear.ts";
import * as norm from "./ops/norm.ts";
import * as sample from "./ops/sample.ts";
import * as ssm from "./ops/ssm.ts";
import { contiguousLayout, elementOffsets, formatShape, numel, type Shape, storageSpan } from "./shape.ts";
import { type Storage, Tensor } from "./tensor.ts";
import type { Weight } from "./weight.ts";

/**
 * A host array of `dtype` over `bytes` (which must be aligned to the element size; a copy is made when
 * it is not). f16 and bf16 come back as Uint16Array bit patterns, fp8 and bool as Uint8Array.
 */
export function hostArrayFor(dtype: DTypeName, bytes: Uint8Array): HostArray {
  const size = dtypeBytes(dtype);
  const b = bytes.byteOffset % size === 0 ? bytes : bytes.slice();
  const n = b.byteLength / size;
  switch (dtype) {
    case "f64":
      return new Float64Array(b.buffer, b.byteOffset, n);
    case "f32":
      return new Float32Array(b.buffer, b.byteOffset, n);
    case "f16":
    case "bf16":
    case "u16":
      return new Uint16Array(b.buffer, b.byteOffset, n);
    case "i16":
      return new Int16Array(b.buffer, b.byteOffset, n);
    case "i32":
      return new Int32Array(b.buffer, b.byteOffset, n);
    case "u32":
      return new Uint32Array(b.buffer, b.byteOffset, n);
    case "i64":
      return new BigInt64Array(b.buffer, b.byteOffset, n);
    case "u64":
      return new BigUint64Array(b.buffer, b.byteOffset, n);
    case "i8":
      return new Int8Array(b.buffer, b.byteOffset, n);
    default:
      return new Uint8Array(b.buffer, b.byteOffset, n);
  }
}

/** The bytes of a host array (a view, no copy). */
export function bytesOf(a: HostArray): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** The host array class `upload` takes for each dtype (raw bytes as Uint8Array are accepted too). */
const HOST_ARRAY_CLASS: Record<DTypeName, string> = {
  f64: "Float64Array",
  f32: "Float32Array",
  f16: "Uint16Array",
  bf16: "Uint16Array",
  u16: "Uint16Array",
  i16: "Int16Array",
  i32: "Int32Array",
  u32: "Uint32Array",
  i64: "BigInt64Array",
  u64: "BigUint64Array",
  i8: "Int8Array",
  u8: "Uint8Array",
  f8_e4m3fn: "Uint8Array",
  f8_e5m2: "Uint8Array",
  bool: "Uint8Array",
};

/** "Float32Array(3)", "null", "object": for messages. */
function describeValue(v: unknown): string {
  if (ArrayBuffer.isView(v)) return `${v.constructor.name}(${v.byteLength} bytes)`;
  return v === null ? "null" : typeof v === "object" ? (v.constructor?.name ?? "object") : typeof v;
}

/**
 * Check that `data` is the host array of `dtype` (or raw bytes as a Uint8Array) over a live buffer.
 * @throws TpError E_ARG naming what was expected and what arrived.
 */
export function checkHostArray(data: unknown, dtype: DTypeName, what: string): void {
  const want = HOST_ARRAY_CLASS[dtype];
  const ok =
    ArrayBuffer.isView(data) &&
    !(data instanceof DataView) &&
    (data.constructor.name === want || data.constructor.name === "Uint8Array");
  if (!ok)
    throw new TpError(
      "E_ARG",
      `${what}: expected a ${want} (or raw bytes as a Uint8Array), got ${describeValue(data)}`,
    );
  if ((data.buffer as ArrayBuffer).detached)
    throw new TpError("E_ARG", `${what}: the data's ArrayBuffer is detached`);
}

/** The most bytes one JavaScript typed array holds here (Bun / JavaScriptCore). */
export const MAX_HOST_ARRAY_BYTES = 2 ** 32;

/**
 * A host buffer of `bytes` for reading `t` (checking `check` bytes when given, without allocating).
 * @throws TpError E_UNSUPPORTED past {@link MAX_HOST_ARRAY_BYTES} (read such a tensor in slices);
 *   E_OOM naming the tensor when the host cannot hold it.
 */
function hostBuffer(bytes: number, t: Tensor, check?: number): Uint8Array {
  const need = check ?? bytes;
  if (!Number.isSafeInteger(need) || need > MAX_HOST_ARRAY_BYTES) {
    throw new TpError(
      "E_UNSUPPORTED",
      `reading ${t.describe()} needs ${need} bytes, past the 4 GiB of one JavaScript array; read it in slices`,
    );
  }
  try {
    return new Uint8Array(bytes);
  } catch (e) {
    throw new TpError("E_OOM", `reading ${t.describe()} needs ${need} bytes of host memory`, { cause: e });
  }
}

/**
 * Add to `out` the storage of every live Tensor in `v`: a Tensor, or arrays, Maps, Sets and plain
 * objects of them, to any depth (`seen` stops cycles). Other objects (class instances) are not searched.
 */
function collectStorages(v: unknown, out: Set<Storage>, seen: Set<object>): void {
  if (typeof v !== "object" || v === null || seen.has(v)) return;
  seen.add(v);
  if (v instanceof Tensor) {
    out.add(v.storage);
    return;
  }
  if (Array.isArray(v) || v instanceof Set) {
    for (const x of v) collectStorages(x, out, seen);
    return;
  }
  if (v instanceof Map) {
    for (const x of v.values()) collectStorages(x, out, seen);
    return;
  }
  const proto = Object.getPrototypeOf(v);
  if (proto === Object.prototype || proto === null) {
    for (const k in v) collectStorages((v as Record<string, unknown>)[k], out, seen);
  }
}

/** Options every backend factory accepts. */
export interface BackendOptions {
  /** Worker threads (CPU backends); default: all cores, or TP_THREADS. */
  threads?: number;
  /** Memory budget in bytes, or null for none. */
  memoryBudget?: number | null;
  /** Device selector (GPU index or name), backend-specific. */
  device?: string;
  /** Print device details on creation. */
  verbose?: boolean;
}

/**
 * Base class of backends. Subclasses implement the storage primitives and give their kernels in
 * `kernelTable`; an op without an entry throws E_UNSUPPORTED.
 */
export abstract class BackendBase implements Backend {
  abstract readonly name: string;
  abstract readonly device: string;
  readonly memory: MemoryAccount;
  #nextId = 1;
  #live = new Set<Storage>();
  /** Open scopes, innermost last: the storages allocated while each was innermost. */
  readonly #scopes: Set<Storage>[] = [];
  #disposed = false;

  /** @param owner the backend name, for the memory account. */
  constructor(owner: string, options: BackendOptions = {}) {
    this.memory = new MemoryAccount(owner, options.memoryBudget ?? null);
  }

  /** Allocate `bytes` of device memory; return the backend's handle. */
  protected abstract allocStorage(bytes: number): unknown;
  /** Release a handle from allocStorage. */
  protected abstract freeStorage(handle: unknown, bytes: number): void;
  /** Copy `data` into storage at byte `offset` (bounds already checked). */
  protected abstract writeStorage(handle: unknown, offset: number, data: Uint8Array): void;
  /** Copy `length` bytes from storage at byte `offset` to a new host array (bounds already checked). */
  protected abstract readStorage(handle: unknown, offset: number, length: number): Promise<Uint8Array>;
  /**
   * {@link readStorage} without a Promise, for {@link readSync}: a backend whose reads block until its
   * queued work is done (cpu, vulkan) overrides it; the default refuses (E_UNSUPPORTED).
   */
  protected readStorageSync(_handle: unknown, _offset: number, _length: number): Uint8Array {
    throw new TpError("E_UNSUPPORTED", `backend ${this.name} has no synchronous read (transfer)`);
  }

  /**
   * What this backend implements, op by op (./kernels.ts): the op methods check their arguments,
   * allocate the output and call these entries; `supports` and `capabilities` answer from it. A
   * backend assigns its own table (`override readonly kernelTable = ...`); the default has no entry.
   */
  readonly kernelTable: KernelTable = EMPTY_KERNEL_TABLE;

  /** What this backend implements, derived from {@link kernelTable} (ops, weight formats, dtypes). */
  capabilities(): BackendCapabilities {
    return tableCapabilities(this.kernelTable);
  }

  /** Whether {@link kernelTable} has `op` taking every one of `formats` (ggml-backend's supports_op). */
  supports(op: OpName, formats: readonly (WeightFormat | DTypeName)[] = []): boolean {
    return tableSupports(this.kernelTable, op, formats);
  }

  /** @throws TpError E_STATE when the backend was disposed. */
  protected assertUsable(): void {
    if (this.#disposed) throw new TpError("E_STATE", `backend ${this.name} was disposed`);
  }

  /** @throws TpError E_STATE when `t` is freed or belongs to another backend. */
  protected own(t: Tensor): void {
    this.assertUsable();
    if (!(t instanceof Tensor))
      throw new TpError("E_STATE", `backend ${this.name}: expected a Tensor, got ${describeValue(t)}`);
    if (t.backend !== this) {
      throw new TpError(
        "E_STATE",
        `${t.describe()} belongs to backend ${t.backend.name}, not this ${this.name} backend`,
      );
    }
    t.assertLive();
  }

  /** A new storage of `bytes` with memory accounting. @throws TpError E_OOM */
  protected newStorage(bytes: number, what: string): Storage {
    this.assertUsable();
    this.memory.check(bytes, what); // the budget is enforced before memory is touched
    const handle = this.allocStorage(bytes); // a failure here leaves the account untouched
    this.memory.reserve(bytes, what);
    const storage: Storage = { id: this.#nextId++, byteLength: bytes, handle, freed: false };
    this.#live.add(storage);
    this.#scopes[this.#scopes.length - 1]?.add(storage);
    return storage;
  }

  persist<T>(value: T): T {
    if (this.#scopes.length === 0) return value;
    const held = new Set<Storage>();
    collectStorages(value, held, new Set());
    for (const s of held) for (const open of this.#scopes) open.delete(s);
    return value;
  }

  scope<T>(fn: () => T): T {
    this.assertUsable();
    const mine = new Set<Storage>();
    this.#scopes.push(mine);
    let result: T;
    try {
      result = fn();
    } catch (e) {
      this.#closeScope(mine, null);
      throw e;
    }
    if (result instanceof Promise) {
      this.#closeScope(mine, null);
      throw new TpError(
        "E_ARG",
        `backend ${this.name}: scope(fn) takes a synchronous fn (it returned a Promise); await outside the scope`,
      );
    }
    this.#closeScope(mine, result);
    return result;
  }

  /** Pop `mine`, free its storages except those `result` holds, and hand those to the parent scope. */
  #closeScope(mine: Set<Storage>, result: unknown): void {
    const top = this.#scopes.pop();
    if (top !== mine) throw new TpError("E_STATE", `backend ${this.name}: scopes closed out of order`);
    const kept = new Set<Storage>();
    if (result !== null && result !== undefined) collectStorages(result, kept, new Set());
    const parent = this.#scopes[this.#scopes.length - 1];
    for (const s of mine) {
      if (s.freed) continue;
      if (kept.has(s)) parent?.add(s);
      else this.#release(s);
    }
  }

  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor {
    dtypeInfo(dtype);
    const bytes = numel(shape) * dtypeBytes(dtype);
    // the label only appears in an E_OOM / E_ARG message: spelled out in full only when the budget refuses
    const what =
      Number.isSafeInteger(bytes) && this.memory.fits(bytes)
        ? (name ?? "tensor")
        : `${name ?? "tensor"} ${dtype} ${formatShape(shape)}`;
    const storage = this.newStorage(bytes, what);
    return new Tensor(this, storage, dtype, contiguousLayout(shape), name);
  }

  free(t: Tensor): void {
    this.own(t);
    const s = t.storage;
    if (!this.#live.has(s)) throw new TpError("E_STATE", `${t.describe()}: storage ${s.id} is not live here`);
    this.#release(s);
  }

  /** Give a live storage back (the scopes forget it when they close: it is marked freed). */
  #release(s: Storage): void {
    this.#scopes[this.#scopes.length - 1]?.delete(s);
    this.freeStorage(s.handle, s.byteLength);
    s.freed = true;
    this.#live.delete(s);
    this.memory.release(s.byteLength);
  }

  upload(data: HostArray, shape: Shape, dtype: DTypeName, name?: string): Tensor {
    const what = `upload of ${name ?? "tensor"} ${dtype} ${formatShape(shape)}`;
    checkHostArray(data, dtype, what);
    const bytes = bytesOf(data);
    const want = numel(shape) * dtypeBytes(dtype);
    if (bytes.byteLength !== want) {
      throw new TpError("E_SHAPE", `${what} needs ${want} bytes, got ${bytes.byteLength}`);
    }
    const t = this.alloc(shape, dtype, name);
    if (want > 0) this.writeStorage(t.storage.handle, 0, bytes);
    return t;
  }

  async read(t: Tensor): Promise<HostArray> {
    this.own(t);
    await this.synchronize();
    const size = dtypeBytes(t.dtype);
    const n = t.numel;
    if (n === 0) return hostArrayFor(t.dtype, new Uint8Array(0));
    hostBuffer(0, t, n * size); // refuse what one host array cannot hold before touching the device
    if (t.isContiguous) {
      return hostArrayFor(
        t.dtype,
        await this.readStorage(t.storage.handle, t.layout.offset * size, n * size),
      );
    }
    // Strided view: fetch the span it touches once, then gather on the host.
    const { lo, hi } = storageSpan(t.layout);
    const span = await this.readStorage(t.storage.handle, lo * size, (hi - lo) * size);
    const out = hostBuffer(n * size, t);
    const offsets = elementOffsets(t.layout);
    for (let i = 0; i < n; i++) {
      const src = ((offsets[i] as number) - lo) * size;
      out.set(span.subarray(src, src + size), i * size);
    }
    return hostArrayFor(t.dtype, out);
  }

  /**
   * As {@link read} for a contiguous tensor, without awaiting: waits for queued work and copies the
   * elements to the host. For moving a small activation between backends inside a forward
   * ({@link transfer}), where no `await` can happen.
   * @throws TpError E_STATE for a freed or foreign tensor; E_UNSUPPORTED for a strided view (copy it
   *   first) or a backend without synchronous reads
   */
  readSync(t: Tensor): HostArray {
    this.own(t);
    if (!t.isContiguous)
      throw new TpError("E_UNSUPPORTED", `readSync: ${t.describe()} is a strided view; copy it first`);
    const size = dtypeBytes(t.dtype);
    const n = t.numel;
    if (n === 0) return hostArrayFor(t.dtype, new Uint8Array(0));
    hostBuffer(0, t, n * size);
    return hostArrayFor(t.dtype, this.readStorageSync(t.storage.handle, t.layout.offset * size, n * size));
  }

  async synchronize(): Promise<void> {}

  dispose(): void {
    if (this.#disposed) return;
    for (const s of this.#live) {
      this.freeStorage(s.handle, s.byteLength);
      s.freed = true;
      this.memory.release(s.byteLength);
    }
    this.#live.clear();
    this.#disposed = true;
  }

  /**
   * @throws TpError E_STATE when `t` is not a Tensor, is freed or belongs to another backend (the
   *   front-end's ownership check, ./ops/common.ts).
   */
  assertOwned(t: Tensor): void {
    this.own(t);
  }

  // ---- ops: the front-end (./ops/*.ts) checks, allocates and calls this.kernelTable ----------------

  matmul(x: Tensor, w: Weight, options?: { bias?: Tensor } | null): Tensor {
    return linear.matmul(this, x, w, options);
  }
  matmulId(x: Tensor, w: Weight, ids: Tensor, options: { experts: number }): Tensor {
    return linear.matmulId(this, x, w, ids, options);
  }
  attention(q: Tensor, k: Tensor, v: Tensor, options?: AttentionOptions | null): Tensor {
    return linear.attention(this, q, k, v, options);
  }
  rmsNorm(x: Tensor, weight: Tensor | null, options: { eps: number; unitOffset?: boolean }): Tensor {
    return norm.rmsNorm(this, x, weight, options);
  }
  layerNorm(x: Tensor, weight: Tensor | null, bias: Tensor | null, options: { eps: number }): Tensor {
    return norm.layerNorm(this, x, weight, bias, options);
  }
  groupNorm(
    x: Tensor,
    groups: number,
    weight: Tensor | null,
    bias: Tensor | null,
    options: { eps: number },
  ): Tensor {
    return norm.groupNorm(this, x, groups, weight, bias, options);
  }
  rope(x: Tensor, positions: Tensor, options: RopeOptions): Tensor {
    return linear.rope(this, x, positions, options);
  }
  silu(x: Tensor): Tensor {
    return elementwise.unary(this, "silu", x);
  }
  gelu(x: Tensor, options?: { approximate?: "none" | "tanh" } | null): Tensor {
    return elementwise.gelu(this, x, options);
  }
  sigmoid(x: Tensor): Tensor {
    return elementwise.unary(this, "sigmoid", x);
  }
  softplus(x: Tensor): Tensor {
    return elementwise.unary(this, "softplus", x);
  }
  swiglu(gate: Tensor, up: Tensor): Tensor {
    return elementwise.swiglu(this, gate, up);
  }
  softmax(x: Tensor, options?: { dim?: number } | null): Tensor {
    return elementwise.softmax(this, x, options);
  }
  add(a: Tensor, b: Tensor): Tensor {
    return elementwise.binary(this, "add", a, b);
  }
  sub(a: Tensor, b: Tensor): Tensor {
    return elementwise.binary(this, "sub", a, b);
  }
  mul(a: Tensor, b: Tensor): Tensor {
    return elementwise.binary(this, "mul", a, b);
  }
  scale(x: Tensor, s: number): Tensor {
    return elementwise.scale(this, x, s);
  }
  modulate(x: Tensor, scale: Tensor, shift: Tensor): Tensor {
    return elementwise.modulate(this, x, scale, shift);
  }
  embedding(table: Weight, ids: Tensor): Tensor {
    return linear.embedding(this, table, ids);
  }
  conv2d(x: Tensor, weight: Tensor, bias: Tensor | null, options?: Conv2dOptions | null): Tensor {
    return linear.conv2d(this, x, weight, bias, options);
  }
  upsampleNearest2d(x: Tensor, factor: number): Tensor {
    return layout.upsampleNearest2d(this, x, factor);
  }
  concat(tensors: readonly Tensor[], dim: number): Tensor {
    return layout.concat(this, tensors, dim);
  }
  slice(x: Tensor, dim: number, start: number, end: number): Tensor {
    return layout.slice(this, x, dim, start, end);
  }
  copy(x: Tensor): Tensor {
    return layout.copy(this, x);
  }
  set(dst: Tensor, src: Tensor): void {
    layout.set(this, dst, src);
  }
  cast(x: Tensor, dtype: DTypeName, options?: { saturate?: boolean } | null): Tensor {
    return layout.cast(this, x, dtype, options);
  }
  argmax(x: Tensor): Tensor {
    return sample.argmax(this, x);
  }
  topK(x: Tensor, k: number): { values: Tensor; indices: Tensor } {
    return sample.topK(this, x, k);
  }
  countNonFinite(x: Tensor): Tensor {
    return sample.countNonFinite(this, x);
  }
  ssmConv(x: Tensor, weight: Tensor): Tensor {
    return ssm.ssmConv(this, x, weight);
  }
  gatedDeltaNet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    options?: { scale?: number; chunk?: number } | null,
  ): Tensor {
    return ssm.gatedDeltaNet(this, q, k, v, g, beta, state, options);
  }
}

/**
 * `t` on backend `to`: `t` itself when it is there already, else a new contiguous copy in `to`'s
 * memory (named as `t`), read synchronously from `t`'s backend and uploaded. The one crossing
 * between backends of a placed model (a hidden state at a layer boundary, the rows routed to experts
 * kept on the host); `t` is left to its owner.
 * @throws TpError E_UNSUPPORTED when `t`'s backend has no synchronous read; E_OOM from `to`
 */
export function transfer(t: Tensor, to: Backend): Tensor {
  const from = t.backend;
  if (from === to) return t;
  if (!(from instanceof BackendBase))
    throw new TpError("E_UNSUPPORTED", `transfer: backend ${from.name} has no synchronous read`);
  if (t.isContiguous) return to.upload(from.readSync(t), t.shape, t.dtype, t.name);
  using c = from.copy(t);
  return to.upload(from.readSync(c), t.shape, t.dtype, t.name);
}
