/**
 * The `cpu` backend: tensors live in 64-byte-aligned host memory from libtp_cpu.so (`tp_alloc`), and
 * ops run as C kernels on a native context (a thread pool and an ISA level chosen at run time).
 * `loadBackend("cpu")` in @tp/tensor imports this package and calls {@link createBackend}.
 *
 * This build implements memory (alloc / free / upload / read of any view, with accounting and
 * budgets) and the `cast` op. Every other op of the Backend interface throws E_UNSUPPORTED naming the
 * op until its kernel lands (the CPU-backend issue).
 *
 * Source: native/include/tp.h; @tp/tensor backend.ts for the op semantics.
 */

import { type Pointer, toArrayBuffer } from "bun:ffi";
import { readFileSync } from "node:fs";
import {
  type AttentionOptions,
  BackendBase,
  type BackendCapabilities,
  type BackendOptions,
  type Conv2dOptions,
  DTYPE_NAMES,
  type DTypeName,
  dtypeBytes,
  type OpName,
  type RopeOptions,
  type Tensor,
  TpError,
  type Weight,
  type WeightFormat,
} from "@tp/tensor";
import {
  CAST_DTYPES,
  CAST_SATURATE,
  type CastDtype,
  type CpuIsa,
  type CpuLibrary,
  loadCpuLibrary,
  type NativeContext,
} from "./ffi.ts";
import { embedding } from "./ops/embedding.ts";
import * as ops from "./ops/index.ts";
import { CPU_WEIGHT_FORMATS, matmul, supportsWeightOp } from "./ops/matmul.ts";

/** A block of native memory and a JS view over it (empty for 0 bytes). */
interface HostBlock {
  readonly ptr: Pointer | null;
  readonly byteLength: number;
}

/** The most bytes one JS view over native memory may span (bun:ffi toArrayBuffer). */
const MAX_VIEW_BYTES = 2 ** 32;

/**
 * A Uint8Array over `length` bytes of a block from byte `offset` (bounds already checked by callers).
 * @throws TpError E_UNSUPPORTED past {@link MAX_VIEW_BYTES}, naming `what`
 */
function blockBytes(block: HostBlock, offset: number, length: number, what: string): Uint8Array {
  if (length === 0 || block.ptr === null) return new Uint8Array(0);
  if (length > MAX_VIEW_BYTES) {
    throw new TpError(
      "E_UNSUPPORTED",
      `${what}: ${length} bytes in one view; the cpu backend handles at most 4 GiB at once`,
    );
  }
  return new Uint8Array(toArrayBuffer(block.ptr, offset, length));
}

/**
 * Threads for a CPU backend: the option, else `TP_THREADS` (unset or empty: 0), else 0 (all CPUs).
 * @throws TpError E_ARG for a value that is not an integer in [0, 256], naming where it came from
 */
export function resolveThreads(option: number | undefined, env = process.env.TP_THREADS): number {
  const fromEnv = option === undefined || option === null;
  // digits only; an empty value (`TP_THREADS= cmd`) counts as unset
  const envValue = env === undefined || env === "" ? 0 : /^\d{1,3}$/.test(env) ? Number(env) : Number.NaN;
  const [value, source] = fromEnv ? [envValue, "TP_THREADS"] : [option, "--threads"];
  if (!Number.isInteger(value) || value < 0 || value > 256) {
    throw new TpError(
      "E_ARG",
      `${source} must be an integer from 0 (all CPUs) to 256, got '${fromEnv ? env : option}'`,
    );
  }
  return value;
}

function cpuModelName(): string {
  try {
    const line = readFileSync("/proc/cpuinfo", "utf8")
      .split("\n")
      .find((l) => l.startsWith("model name"));
    return line?.split(":")[1]?.trim() || process.arch;
  } catch {
    return process.arch;
  }
}

/** Options of the cpu backend: those of every backend, and the highest ISA level its kernels may use. */
export interface CpuBackendOptions extends BackendOptions {
  /** "scalar", "avx2" or "avx512" (default: the best this CPU has); for tests and comparisons. */
  maxIsa?: CpuIsa;
  /**
   * Bytes of freed tensor memory kept for reuse by later allocations of the same size (default
   * {@link CPU_BLOCK_CACHE_BYTES}; 0 turns the cache off). See {@link CpuBackend.cachedBytes}.
   */
  blockCacheBytes?: number;
}

/**
 * Default of {@link CpuBackendOptions.blockCacheBytes}: 256 MiB. A model step frees and allocates the
 * same sizes over and over (every decoded token, every layer of a prefill); memory returned to the OS
 * and mapped again costs a page fault per 4 KiB on the next write — measured 17–60 µs per page on this
 * project's VMs, i.e. seconds per 512-token prefill — while a kept block is ready at once.
 */
export const CPU_BLOCK_CACHE_BYTES = 256 * 2 ** 20;

const isCastDtype = (d: DTypeName): d is CastDtype => Object.hasOwn(CAST_DTYPES, d);

/**
 * The CPU backend. Create it with {@link createBackend} or `loadBackend("cpu", options)`.
 * @see BackendBase for memory semantics; Backend (in @tp/tensor) for the op contracts.
 */
export class CpuBackend extends BackendBase {
  readonly name = "cpu";
  readonly device: string;
  /** The native library. */
  readonly lib: CpuLibrary;
  /** The native context (thread pool, ISA level) every op runs on. */
  readonly ctx: NativeContext;
  /** Most bytes of freed blocks kept for reuse (CpuBackendOptions.blockCacheBytes). */
  readonly blockCacheLimit: number;
  /** Freed blocks kept for reuse, by exact byte size (last freed first). */
  readonly #spare = new Map<number, Pointer[]>();
  #spareBytes = 0;

  /**
   * @param opts the options; null or undefined: the defaults
   * @throws TpError E_IO when the native library is not built; E_ARG for bad threads or budget
   */
  constructor(opts?: CpuBackendOptions | null) {
    super("cpu", opts ?? {});
    const options = opts ?? {};
    this.lib = loadCpuLibrary();
    const cache = options.blockCacheBytes ?? CPU_BLOCK_CACHE_BYTES;
    if (!Number.isSafeInteger(cache) || cache < 0) {
      throw new TpError("E_ARG", `blockCacheBytes must be a non-negative integer, got ${cache}`);
    }
    this.blockCacheLimit = cache;
    this.ctx = this.lib.createContext(resolveThreads(options.threads), options.maxIsa);
    this.device = `${cpuModelName()} (${this.ctx.isa}, ${this.ctx.threads} thread${this.ctx.threads === 1 ? "" : "s"})`;
    if (options.verbose) console.error(`cpu backend: ${this.device}`);
  }

  capabilities(): BackendCapabilities {
    const opNames = ["cast", "matmul", "embedding", ...Object.keys(ops.CPU_OP_DTYPES)] as OpName[];
    return { ops: opNames, weightFormats: CPU_WEIGHT_FORMATS, dtypes: DTYPE_NAMES };
  }

  /** Per op: the ops of ops/capabilities.ts answer from their dtype table; others as BackendBase. */
  override supports(op: OpName, formats: readonly (WeightFormat | DTypeName)[] = []): boolean {
    if (op === "matmul" || op === "embedding") return supportsWeightOp(op, formats);
    const dtypes = ops.CPU_OP_DTYPES[op];
    if (dtypes === undefined) return super.supports(op, formats);
    return formats.every((f) => (dtypes as readonly string[]).includes(f));
  }

  protected allocStorage(bytes: number): HostBlock {
    const ptr = this.#spare.get(bytes)?.pop();
    if (ptr !== undefined) {
      this.#spareBytes -= bytes;
      return { ptr, byteLength: bytes };
    }
    return { ptr: this.lib.alloc(bytes), byteLength: bytes };
  }

  protected freeStorage(handle: unknown): void {
    const { ptr, byteLength } = handle as HostBlock;
    if (ptr === null) return;
    if (this.#spareBytes + byteLength > this.blockCacheLimit) {
      this.lib.free(ptr);
      return;
    }
    const list = this.#spare.get(byteLength);
    if (list === undefined) this.#spare.set(byteLength, [ptr]);
    else list.push(ptr);
    this.#spareBytes += byteLength;
  }

  /**
   * Bytes of freed tensor memory this backend keeps for reuse (at most
   * {@link CpuBackendOptions.blockCacheBytes}). They are not in `memory` (no tensor holds them) but are
   * part of the process's resident memory; {@link releaseCachedMemory} gives them back.
   */
  get cachedBytes(): number {
    return this.#spareBytes;
  }

  /** Give the kept blocks ({@link cachedBytes}) back to the system; returns how many bytes that was. */
  releaseCachedMemory(): number {
    const released = this.#spareBytes;
    for (const list of this.#spare.values()) for (const p of list) this.lib.free(p);
    this.#spare.clear();
    this.#spareBytes = 0;
    return released;
  }

  protected writeStorage(handle: unknown, offset: number, data: Uint8Array): void {
    blockBytes(handle as HostBlock, offset, data.byteLength, "upload").set(data);
  }

  protected async readStorage(handle: unknown, offset: number, length: number): Promise<Uint8Array> {
    return blockBytes(handle as HostBlock, offset, length, "read").slice();
  }

  /**
   * The bytes of a tensor's elements, a view on native memory valid until the tensor is freed. For op
   * implementations in this package: checks that the tensor is live, belongs to this backend and is
   * contiguous.
   * @throws TpError E_STATE for a freed or foreign tensor; E_UNSUPPORTED for a strided view (copy it first)
   */
  elementBytes(t: Tensor, op: string): Uint8Array {
    this.#checkElements(t, op);
    const size = dtypeBytes(t.dtype);
    return blockBytes(t.storage.handle as HostBlock, t.layout.offset * size, t.numel * size, `op ${op}`);
  }

  /**
   * Address of a contiguous tensor's first element, for native calls; null for an empty tensor (no
   * pointer may be taken). The memory stays valid until the tensor's storage is freed.
   * @throws TpError E_STATE for a freed or foreign tensor; E_UNSUPPORTED for a strided view
   */
  elementPointer(t: Tensor, op: string): Pointer | null {
    this.#checkElements(t, op);
    const block = t.storage.handle as HostBlock;
    if (block.ptr === null || t.numel === 0) return null;
    return (block.ptr + t.layout.offset * dtypeBytes(t.dtype)) as Pointer;
  }

  /** @throws TpError E_STATE when `t` is freed or belongs to another backend (ops' argument check). */
  checkOwned(t: Tensor): void {
    this.own(t);
  }

  /**
   * Address of any view's first element and the bytes from there to the end of its storage, for
   * strided native calls (which check that the view's strides stay inside those bytes).
   * @throws TpError E_STATE for a freed or foreign tensor
   */
  viewRegion(t: Tensor): ops.NativeRegion {
    this.own(t);
    const block = t.storage.handle as HostBlock;
    const at = t.layout.offset * dtypeBytes(t.dtype);
    if (block.ptr === null || t.numel === 0) return { ptr: null, bytes: 0 };
    return { ptr: (block.ptr + at) as Pointer, bytes: block.byteLength - at };
  }

  #checkElements(t: Tensor, op: string): void {
    this.own(t);
    if (!t.isContiguous) {
      throw new TpError(
        "E_UNSUPPORTED",
        `op ${op} on backend cpu: ${t.describe()} is a strided view; copy it first`,
      );
    }
  }

  /**
   * Elementwise dtype conversion (tp_cpu_cast): f32 ⇄ f16 / bf16 / f8_e4m3fn / f8_e5m2, or a copy to
   * the same dtype. Rounding and NaN rules are those of @tp/tensor convert.ts, bit for bit.
   * @param options.saturate f32 → fp8: clamp overflow to ±max finite instead of NaN / inf (a boolean,
   *   default false; `options` null or undefined: the default)
   * @throws TpError E_ARG for a dtype that is not one of @tp/tensor's DTYPE_NAMES or a saturate that is
   *   not a boolean (naming op cast); E_UNSUPPORTED for another pair of known dtypes or a
   *   non-contiguous view; E_STATE for a freed or foreign tensor
   */
  override cast(x: Tensor, dtype: DTypeName, options?: { saturate?: boolean } | null): Tensor {
    if (typeof dtype !== "string" || !(DTYPE_NAMES as readonly string[]).includes(dtype)) {
      throw new TpError(
        "E_ARG",
        `op cast on backend cpu: unknown dtype ${typeof dtype === "string" ? JSON.stringify(dtype) : String(dtype)}; expected one of: ${DTYPE_NAMES.join(", ")}`,
      );
    }
    const saturate = options?.saturate ?? false;
    if (typeof saturate !== "boolean") {
      throw new TpError(
        "E_ARG",
        `op cast on backend cpu: saturate must be a boolean, got ${typeof saturate === "string" ? JSON.stringify(saturate) : String(saturate)}`,
      );
    }
    const from = x.dtype;
    const pairOk =
      from === dtype || (isCastDtype(from) && isCastDtype(dtype) && (from === "f32" || dtype === "f32"));
    if (!pairOk) {
      throw new TpError(
        "E_UNSUPPORTED",
        `op cast on backend cpu: no conversion ${from} → ${dtype} (f32 ⇄ f16, bf16, f8_e4m3fn, f8_e5m2)`,
      );
    }
    const src = this.elementBytes(x, "cast");
    const out = this.alloc(x.shape, dtype, x.name);
    if (x.numel === 0) return out;
    const dst = this.elementBytes(out, "cast");
    if (from === dtype) dst.set(src);
    else {
      const flags = saturate ? CAST_SATURATE : 0;
      this.ctx.cast(src, from as CastDtype, dst, dtype as CastDtype, x.numel, flags);
    }
    return out;
  }

  // ---- ops (implementations in ./ops; contracts in @tp/tensor Backend) ----------------------------

  override attention(q: Tensor, k: Tensor, v: Tensor, options?: AttentionOptions | null): Tensor {
    return ops.attention(this, q, k, v, options);
  }
  override rmsNorm(x: Tensor, weight: Tensor | null, options: { eps: number; unitOffset?: boolean }): Tensor {
    return ops.rmsNorm(this, x, weight, options);
  }
  override layerNorm(
    x: Tensor,
    weight: Tensor | null,
    bias: Tensor | null,
    options: { eps: number },
  ): Tensor {
    return ops.layerNorm(this, x, weight, bias, options);
  }
  override groupNorm(
    x: Tensor,
    groups: number,
    weight: Tensor | null,
    bias: Tensor | null,
    options: { eps: number },
  ): Tensor {
    return ops.groupNorm(this, x, groups, weight, bias, options);
  }
  override rope(x: Tensor, positions: Tensor, options: RopeOptions): Tensor {
    return ops.rope(this, x, positions, options);
  }
  override silu(x: Tensor): Tensor {
    return ops.silu(this, x);
  }
  override gelu(x: Tensor, options?: { approximate?: "none" | "tanh" } | null): Tensor {
    return ops.gelu(this, x, options);
  }
  override sigmoid(x: Tensor): Tensor {
    return ops.sigmoid(this, x);
  }
  override swiglu(gate: Tensor, up: Tensor): Tensor {
    return ops.swiglu(this, gate, up);
  }
  override softmax(x: Tensor, options?: { dim?: number } | null): Tensor {
    return ops.softmax(this, x, options);
  }
  override add(a: Tensor, b: Tensor): Tensor {
    return ops.binary(this, "add", a, b);
  }
  override sub(a: Tensor, b: Tensor): Tensor {
    return ops.binary(this, "sub", a, b);
  }
  override mul(a: Tensor, b: Tensor): Tensor {
    return ops.binary(this, "mul", a, b);
  }
  override scale(x: Tensor, s: number): Tensor {
    return ops.scale(this, x, s);
  }
  override modulate(x: Tensor, scale: Tensor, shift: Tensor): Tensor {
    return ops.modulate(this, x, scale, shift);
  }
  override conv2d(x: Tensor, weight: Tensor, bias: Tensor | null, options?: Conv2dOptions | null): Tensor {
    return ops.conv2d(this, x, weight, bias, options);
  }
  override upsampleNearest2d(x: Tensor, factor: number): Tensor {
    return ops.upsampleNearest2d(this, x, factor);
  }
  override concat(tensors: readonly Tensor[], dim: number): Tensor {
    return ops.concat(this, tensors, dim);
  }
  override slice(x: Tensor, dim: number, start: number, end: number): Tensor {
    return ops.slice(this, x, dim, start, end);
  }
  override copy(x: Tensor): Tensor {
    return ops.copy(this, x);
  }
  override set(dst: Tensor, src: Tensor): void {
    ops.set(this, dst, src);
  }
  override argmax(x: Tensor): Tensor {
    return ops.argmax(this, x);
  }
  override topK(x: Tensor, k: number): { values: Tensor; indices: Tensor } {
    return ops.topK(this, x, k);
  }

  /**
   * y = x · Wᵀ (+ bias) for every weight format of CPU_WEIGHT_FORMATS (./ops/matmul.ts).
   * @throws TpError E_ARG when w is not a Weight; E_SHAPE, E_UNSUPPORTED, E_STATE, E_OOM (see there)
   */
  override matmul(x: Tensor, w: Weight, options?: { bias?: Tensor } | null): Tensor {
    return matmul(this, x, w, options);
  }
  /**
   * Rows of a weight table at i32 ids, dequantized to f32 (./ops/embedding.ts).
   * @throws TpError E_ARG when table is not a Weight or an id is outside [0, V); E_UNSUPPORTED, E_STATE
   */
  override embedding(table: Weight, ids: Tensor): Tensor {
    return embedding(this, table, ids);
  }

  override dispose(): void {
    super.dispose();
    this.releaseCachedMemory();
    if (!this.ctx.destroyed) this.ctx.destroy();
  }
}

/**
 * Create the `cpu` backend.
 * @param options.threads worker threads incl. the caller (default: TP_THREADS, else all CPUs)
 * @param options.memoryBudget bytes the backend may hold at once (E_OOM past it)
 * @throws TpError E_IO when libtp_cpu.so is not built ("run 'bun run build'"); E_ARG for bad options
 */
export function createBackend(options?: CpuBackendOptions | null): CpuBackend {
  return new CpuBackend(options);
}
