/**
 * The `cpu` backend: tensors live in 64-byte-aligned host memory from libtp_cpu.so (`tp_alloc`), and
 * ops run as C kernels on a native context (a thread pool and an ISA level chosen at run time).
 * `loadBackend("cpu")` in @tp/tensor imports this package and calls {@link createBackend}.
 *
 * A backend here is its memory (64-byte-aligned native blocks, upload, read, budget, a cache of freed
 * blocks) and its kernel table (./ops, @tp/tensor KernelTable); the op methods — argument checks,
 * output allocation — are @tp/tensor's front-end, and `supports` / `capabilities` come from the table.
 *
 * Source: native/include/tp.h; @tp/tensor backend.ts for the op semantics.
 */

import { type Pointer, toArrayBuffer } from "bun:ffi";
import { readFileSync } from "node:fs";
import {
  BackendBase,
  type BackendOptions,
  dtypeBytes,
  type KernelTable,
  type Tensor,
  TpError,
} from "@tp/tensor";
import { type CpuIsa, type CpuLibrary, loadCpuLibrary, type NativeContext } from "./ffi.ts";
import * as ops from "./ops/index.ts";

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
    if (options.verbose) process.stderr.write(`cpu backend: ${this.device}\n`);
  }

  /** The kernels (./ops); built once, they read `ctx` when they run. */
  override readonly kernelTable: KernelTable = ops.cpuKernels(this);

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
    return this.readStorageSync(handle, offset, length);
  }

  protected override readStorageSync(handle: unknown, offset: number, length: number): Uint8Array {
    return blockBytes(handle as HostBlock, offset, length, "read").slice();
  }

  /**
   * The bytes of a tensor's elements, a view on native memory valid until the tensor is freed. For the
   * kernels in ./ops: checks that the tensor is live, belongs to this backend and is
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
