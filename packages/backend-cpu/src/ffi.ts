/**
 * The one bun:ffi file of @tp/backend-cpu: it opens libtp_cpu.so with the symbol table of
 * `./symbols.ts` (native/include/tp.h, checked against the header by `symbols.test.ts`), turns a
 * native status into a {@link TpError} with {@link check}, and holds the checks every wrapper makes
 * before a pointer crosses bun:ffi (counts, int32 ranges, typed views). The wrappers are thin: the
 * methods of {@link CpuLibrary} and {@link NativeContext} here, the op kernels in `./ops/native.ts`,
 * the weight quantizer in `./quantize.ts`; the C side checks pointers and sizes again.
 *
 * The library is loaded lazily by {@link loadCpuLibrary}, so importing this package never fails,
 * even where the library is not built.
 *
 * Ownership (tp.h): JavaScript owns every buffer it passes; native code keeps no pointer after a
 * call returns. Memory from {@link CpuLibrary.alloc} is owned by the caller until {@link CpuLibrary.free}.
 *
 * Source: native/include/tp.h; ../shared/STYLE.md §4; tinygrad `tinygrad/runtime/ops_cuda.py` (`check`).
 */
import { dlopen, type FFIFunction, type Library, type Pointer, ptr } from "bun:ffi";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { checkLibraryFile, TpError, type TpErrorCode, type TpErrorContext } from "@tp/tensor";
import {
  ACT_BLOCKS,
  CAST_DTYPES,
  CPU_FEATURES,
  CPU_ISA,
  NATIVE_WEIGHT_FORMATS,
  TP_ABI_VERSION,
  TP_STATUS,
  TP_SYMBOLS,
} from "./symbols.ts";

export type { Pointer } from "bun:ffi";
export * from "./symbols.ts";
export { checkLibraryFile };

/** A dtype name of {@link CAST_DTYPES}. */
export type CastDtype = keyof typeof CAST_DTYPES;

/** Bytes per element of each {@link CastDtype}. */
export const CAST_DTYPE_BYTES: Readonly<Record<CastDtype, number>> = {
  f32: 4,
  f16: 2,
  bf16: 2,
  f8_e4m3fn: 1,
  f8_e5m2: 1,
};

/** A weight format name of {@link NATIVE_WEIGHT_FORMATS}. */
export type NativeWeightFormat = keyof typeof NATIVE_WEIGHT_FORMATS;

/** An activation block type of {@link ACT_BLOCKS}. */
export type ActBlockType = keyof typeof ACT_BLOCKS;

/**
 * A weight [n, k] as the native kernels take it: row-major bytes in `format` (any alignment) and the
 * scales of its format. JavaScript keeps owning `data` and `scale`; native code reads them during a
 * call only.
 */
export interface NativeWeight {
  /** Storage format. */
  readonly format: NativeWeightFormat;
  /** Rows (output features). */
  readonly n: number;
  /** Columns (input features). */
  readonly k: number;
  /** n rows of {@link CpuLibrary.weightRowBytes}(format, k) bytes. */
  readonly data: Uint8Array;
  /** ConvRot: n row scales; fp8: one tensor scale, or null for raw fp8; other formats: null. */
  readonly scale: Float32Array | null;
  /** ConvRot rotation group (a power of 4 dividing k); 0 for other formats. */
  readonly group: number;
}

/** An ISA level name of {@link CPU_ISA}. */
export type CpuIsa = keyof typeof CPU_ISA;

/** A feature name of {@link CPU_FEATURES}. */
export type CpuFeature = keyof typeof CPU_FEATURES;

/**
 * Names of the feature bits set in `bits`, in {@link CPU_FEATURES} order (unknown bits are ignored).
 * @param bits a `tp_cpu_features()` value, e.g. from {@link CpuLibrary.features}
 * @example cpuFeatureNames(0b111) // ["avx2", "fma", "f16c"]
 */
export function cpuFeatureNames(bits: number): CpuFeature[] {
  return (Object.keys(CPU_FEATURES) as CpuFeature[]).filter((name) => (bits & CPU_FEATURES[name]) !== 0);
}

/** The raw, unchecked bun:ffi functions of libtp_cpu.so (tp.h signatures). */
export type CpuSymbols = Library<typeof TP_SYMBOLS>["symbols"];

/**
 * Where the library is looked for: `$TP_CPU_LIB` when set, else `../build/libtp_cpu.so` relative
 * to this file (what `bun run build` in packages/backend-cpu writes).
 */
export function defaultCpuLibraryPath(): string {
  const fromEnv = process.env.TP_CPU_LIB;
  return fromEnv ? resolve(fromEnv) : resolve(import.meta.dir, "../build/libtp_cpu.so");
}

const loaded = new Map<string, CpuLibrary>();

/**
 * dlopen `path` with a symbol table.
 * @throws TpError E_IO naming the platform when the file cannot be loaded or lacks a symbol
 */
function openLibrary<S extends Record<string, FFIFunction>>(path: string, symbols: S): Library<S> {
  try {
    return dlopen(path, symbols);
  } catch (cause) {
    const why = cause instanceof Error ? cause.message : String(cause);
    throw new TpError(
      "E_IO",
      `cannot load the CPU library on ${process.platform}-${process.arch}: ${why}; rebuild it with 'bun run build'`,
      { file: path, cause },
    );
  }
}

/**
 * Load libtp_cpu.so (once per path; later calls return the same object).
 * @param path the library file; default {@link defaultCpuLibraryPath}
 * @throws TpError E_IO if the file is missing ("run 'bun run build'") or cannot be loaded on this
 *   platform; E_UNSUPPORTED if its ABI version is not {@link TP_ABI_VERSION}
 */
export function loadCpuLibrary(path: string = defaultCpuLibraryPath()): CpuLibrary {
  const cached = loaded.get(path);
  if (cached) return cached;
  if (!existsSync(path)) {
    const fromEnv = Boolean(process.env.TP_CPU_LIB) && path === defaultCpuLibraryPath();
    throw new TpError(
      "E_IO",
      fromEnv
        ? `TP_CPU_LIB points at ${path}, which does not exist; unset it to use the library 'bun run build' makes`
        : `CPU library not built: ${path} is missing; run 'bun run build' in packages/backend-cpu ` +
            "(or point TP_CPU_LIB at a built libtp_cpu.so)",
      { file: path },
    );
  }
  checkLibraryFile(path);
  // First the version alone, so that a library of another ABI (whose symbols may differ) is
  // reported as such rather than as a missing symbol.
  const probe = openLibrary(path, { tp_abi_version: TP_SYMBOLS.tp_abi_version });
  const version = probe.symbols.tp_abi_version();
  probe.close();
  if (version !== TP_ABI_VERSION) {
    throw new TpError(
      "E_UNSUPPORTED",
      `CPU library has ABI version ${version}, this package expects ${TP_ABI_VERSION}; rebuild it with 'bun run build'`,
      { file: path },
    );
  }
  const library = openLibrary(path, TP_SYMBOLS);
  const lib = new CpuLibrary(path, library.symbols);
  loaded.set(path, lib);
  return lib;
}

// ---- status and argument checks: the only logic of the wrappers --------------------------------

/** The {@link TpError} code of each non-OK native status; an unknown status maps to E_INTERNAL. */
const STATUS_ERROR: Readonly<Record<number, TpErrorCode>> = {
  [TP_STATUS.ERR_ARG]: "E_ARG",
  [TP_STATUS.ERR_OOM]: "E_OOM",
  [TP_STATUS.ERR_UNSUPPORTED]: "E_UNSUPPORTED",
  [TP_STATUS.ERR_INTERNAL]: "E_INTERNAL",
};

/**
 * Turn a native status into an error, as tinygrad's `check(status)`: returns for TP_OK (reading
 * nothing else), else throws a TpError with the native message of `ctx` (tp_ctx_error).
 * @param ctx     the context the call ran on
 * @param status  a tp_status returned by a call on ctx
 * @param context file or tensor the call concerned, appended to the message (e.g. `{ tensor: name }`)
 * @throws TpError E_ARG (TP_ERR_ARG), E_OOM (TP_ERR_OOM), E_UNSUPPORTED (TP_ERR_UNSUPPORTED),
 *   E_INTERNAL (TP_ERR_INTERNAL or an unknown status); the message is the native one, or
 *   "native CPU call failed with status N" when the library left none
 */
export function check(ctx: NativeContext, status: number, context?: TpErrorContext): void {
  if (status === TP_STATUS.OK) return;
  const code = STATUS_ERROR[status] ?? "E_INTERNAL";
  const message = ctx.lastError() || `native CPU call failed with status ${status}`;
  throw new TpError(code, message, context);
}

/**
 * Check a count that crosses bun:ffi (an element or byte count, a dimension): returns `value` when it
 * is a non-negative safe integer.
 * @param what the function, for the message
 * @param name the argument, for the message
 * @throws TpError E_ARG naming `what`, `name` and the value
 */
export function checkCount(what: string, name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new TpError("E_ARG", `${what}: ${name} must be a non-negative safe integer, got ${value}`);
  }
  return value;
}

/**
 * Check a name that selects a tp.h code (a dtype, weight format, ISA level, block type): returns it
 * when it is a key of `table`.
 * @param fn    the function, for the message
 * @param what  the argument, for the message
 * @throws TpError E_ARG naming `fn`, `what`, the value and the valid names
 */
export function checkName<T extends object>(fn: string, what: string, table: T, value: unknown): keyof T {
  if (typeof value !== "string" || !Object.hasOwn(table, value)) {
    const known = Object.keys(table).join(", ");
    throw new TpError("E_ARG", `${fn}: unknown ${what} ${JSON.stringify(value)}; expected one of: ${known}`);
  }
  return value as keyof T;
}

/** The largest value of a native `int32_t` argument. */
export const INT32_MAX = 2 ** 31 - 1;

/**
 * Check an integer that crosses bun:ffi as an `int32_t` (bun:ffi wraps larger values modulo 2^32, so
 * 2^32 + 16 would arrive as 16): returns `value` when it is an integer in [lo, hi] ⊆ [−2^31, 2^31 − 1].
 * For the checked wrappers of this package (here, ops/native.ts, quantize.ts).
 * @param what the function, for the message
 * @param name the argument, for the message
 * @throws TpError E_ARG naming `what`, `name`, the range and the value
 */
export function checkInt32(what: string, name: string, value: number, lo = 0, hi = INT32_MAX): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < lo || value > hi) {
    throw new TpError("E_ARG", `${what}: ${name} must be an integer in [${lo}, ${hi}], got ${value}`);
  }
  return value;
}

/** True for 4, 16, 64, …, 2^30: the ConvRot rotation groups (powers of 4 that fit an int32_t). */
export function isPowerOf4(g: number): boolean {
  return Number.isInteger(g) && g >= 4 && g <= 2 ** 30 && (g & (g - 1)) === 0 && Math.log2(g) % 2 === 0;
}

/** The largest k of a weight row (native/cpu/matmul.c TP_MM_MAX). */
const MAX_ROW_K = 2 ** 40;

/** A loaded libtp_cpu.so: CPU queries, contexts and aligned host memory. Get one from {@link loadCpuLibrary}. */
export class CpuLibrary {
  /** Absolute path of the loaded file. */
  readonly path: string;
  /**
   * The raw bun:ffi functions (tp.h signatures). Unchecked: a wrong pointer crashes the process.
   * For tests and for wrappers in this package; prefer the methods.
   */
  readonly raw: CpuSymbols;

  /** @internal use {@link loadCpuLibrary} */
  constructor(path: string, raw: CpuSymbols) {
    this.path = path;
    this.raw = raw;
  }

  /** ABI version of the library (equals {@link TP_ABI_VERSION} once loaded). */
  abiVersion(): number {
    return this.raw.tp_abi_version();
  }

  /** Feature bits of this CPU ({@link CPU_FEATURES}); only features the OS saves registers for. */
  features(): number {
    return this.raw.tp_cpu_features();
  }

  /** Number of online logical CPUs, at least 1. */
  cpuCount(): number {
    return this.raw.tp_cpu_count();
  }

  /**
   * Bytes of one weight row of k elements in a native weight format (tp_weight_row_bytes).
   * @throws TpError E_ARG for an unknown format, or a k that is not an integer in [0, 2^40] (the
   *   kernels' limit); E_SHAPE when k is not a whole number of blocks
   */
  weightRowBytes(format: NativeWeightFormat, k: number): number {
    const code = weightFormatCode("weightRowBytes", format);
    checkCount("weightRowBytes", "k", k);
    if (k > MAX_ROW_K) {
      throw new TpError("E_ARG", `weightRowBytes: k = ${k} is above 2^40, the longest row the kernels take`);
    }
    const bytes = Number(this.raw.tp_weight_row_bytes(code, k));
    if (bytes < 0) {
      throw new TpError("E_SHAPE", `weightRowBytes: k = ${k} is not a whole number of ${format} blocks`);
    }
    return bytes;
  }

  /**
   * Create a context: a pool of `nThreads - 1` worker threads (the calling thread is the n-th) and
   * the ISA level min(maxIsa, best this CPU supports); read the chosen level from `.isa`.
   * Destroy it with {@link NativeContext.destroy} (a forgotten context is destroyed on GC).
   * @param nThreads threads in [1, 256], or 0 for {@link cpuCount}
   * @param maxIsa highest ISA level to use; default "avx512" (the best available)
   * @throws TpError E_ARG for a bad nThreads or maxIsa; E_INTERNAL if threads cannot be started
   */
  createContext(nThreads = 0, maxIsa: CpuIsa = "avx512"): NativeContext {
    if (!Number.isInteger(nThreads) || nThreads < 0 || nThreads > 256) {
      throw new TpError(
        "E_ARG",
        `createContext: nThreads must be an integer in [0, 256] (0: all CPUs), got ${nThreads}`,
      );
    }
    const isa = CPU_ISA[checkName("createContext", "maxIsa", CPU_ISA, maxIsa)];
    const handle = this.raw.tp_ctx_create(nThreads, isa);
    if (handle === null) {
      throw new TpError(
        "E_INTERNAL",
        `createContext: could not start ${nThreads || this.cpuCount()} threads`,
      );
    }
    return new NativeContext(this, handle as Pointer);
  }

  /**
   * Allocate 64-byte-aligned host memory (tp_alloc). The caller owns it until {@link free}.
   * @param bytes size in bytes; 0 returns null (nothing to free)
   * @returns the address, a multiple of 64; null for 0 bytes
   * @throws TpError E_ARG if bytes is not a non-negative safe integer; E_OOM if the allocation fails
   */
  alloc(bytes: number): Pointer | null {
    checkCount("alloc", "bytes", bytes);
    if (bytes === 0) return null;
    const p = this.raw.tp_alloc(bytes);
    if (p === null) throw new TpError("E_OOM", `alloc: could not allocate ${bytes} bytes of host memory`);
    return p as Pointer;
  }

  /** Release memory from {@link alloc}; null is a no-op. Freeing twice is undefined behaviour (as C's free). */
  free(p: Pointer | null): void {
    if (p !== null) this.raw.tp_free(p);
  }
}

/** Destroys contexts that were garbage-collected without destroy(). */
const contextFinalizer = new FinalizationRegistry<{ raw: CpuSymbols; handle: Pointer }>(({ raw, handle }) =>
  raw.tp_ctx_destroy(handle),
);

/**
 * A native context (tp_ctx): a persistent thread pool, the chosen ISA level, and the error buffer of
 * its calls. One call at a time per context. Create with {@link CpuLibrary.createContext}.
 */
export class NativeContext {
  /** The library this context belongs to. */
  readonly lib: CpuLibrary;
  /** Threads used by each call, the caller's included. */
  readonly threads: number;
  /** The ISA level its kernels run at. */
  readonly isa: CpuIsa;
  #handle: Pointer | null;

  /** @internal use {@link CpuLibrary.createContext} */
  constructor(lib: CpuLibrary, handle: Pointer) {
    this.lib = lib;
    this.#handle = handle;
    this.threads = lib.raw.tp_ctx_threads(handle);
    const isaCode = lib.raw.tp_ctx_isa(handle);
    this.isa = (Object.keys(CPU_ISA) as CpuIsa[]).find((k) => CPU_ISA[k] === isaCode) ?? "scalar";
    contextFinalizer.register(this, { raw: lib.raw, handle }, this);
  }

  /** True after {@link destroy}. */
  get destroyed(): boolean {
    return this.#handle === null;
  }

  /**
   * The native tp_ctx pointer, for raw calls.
   * @throws TpError E_STATE after {@link destroy}
   */
  get handle(): Pointer {
    if (this.#handle === null) throw new TpError("E_STATE", "native CPU context used after destroy()");
    return this.#handle;
  }

  /** Message of the last failed call on this context ("" if none). @throws TpError E_STATE after destroy */
  lastError(): string {
    return String(this.lib.raw.tp_ctx_error(this.handle) ?? "");
  }

  /**
   * Convert `n` elements from `src` (srcDtype) to `dst` (dstDtype), element i to element i,
   * bit-exact with the rules of tp.h `tp_cpu_cast` (round to nearest even; NaN and fp8 overflow rules).
   * Pairs: f32 <-> f16, bf16, f8_e4m3fn, f8_e5m2, and any dtype to itself. Large n is split over
   * the context's threads. Bytes of dst past n elements are not touched.
   * @param src       any typed array or DataView, at least n * bytes(srcDtype) bytes, aligned to its element size
   * @param srcDtype  element type of src
   * @param dst       as src, for dstDtype; must not overlap src
   * @param dstDtype  element type of dst
   * @param n         element count; 0 does nothing (empty views are allowed then)
   * @param flags     {@link CAST_SATURATE} or 0
   * @throws TpError E_STATE after destroy; E_ARG for a bad argument (named in the message: empty or
   *   short views, unknown dtype, bad n or flags, misaligned or overlapping views); E_UNSUPPORTED for
   *   a pair that is not listed above (e.g. f16 -> bf16)
   */
  cast(
    src: ArrayBufferView,
    srcDtype: CastDtype,
    dst: ArrayBufferView,
    dstDtype: CastDtype,
    n: number,
    flags = 0,
  ): void {
    const handle = this.handle;
    const srcCode = CAST_DTYPES[checkName("cast", "srcDtype", CAST_DTYPES, srcDtype)];
    const dstCode = CAST_DTYPES[checkName("cast", "dstDtype", CAST_DTYPES, dstDtype)];
    checkCount("cast", "n", n);
    if (!Number.isInteger(flags) || flags < 0 || flags > 0xffffffff) {
      throw new TpError("E_ARG", `cast: flags must be a 32-bit unsigned integer, got ${flags}`);
    }
    const srcPtr = viewPointer("src", src, srcDtype, n);
    const dstPtr = viewPointer("dst", dst, dstDtype, n);
    check(this, this.lib.raw.tp_cpu_cast(handle, srcPtr, srcCode, dstPtr, dstCode, n, flags));
  }

  /**
   * y = x · Wᵀ (+ bias) with the native kernels of the weight's format (tp.h tp_cpu_matmul: activations
   * quantized per format as llama.cpp / ComfyUI pair them; ConvRot bit-exact with @tp/quant
   * convRotLinear).
   * @param x    [m, k] f32, at least m·k values
   * @param m    rows of x
   * @param w    the weight [n, k] ({@link NativeWeight})
   * @param bias [n] f32 or null
   * @param y    [m, n] f32 output, at least m·n values; must not overlap the inputs
   * @throws TpError E_STATE after destroy; E_ARG for a bad argument (named: short or misaligned views,
   *   bad counts, weight bytes or scales that do not match its format and shape); E_OOM when scratch
   *   memory cannot be allocated
   */
  matmul(x: Float32Array, m: number, w: NativeWeight, bias: Float32Array | null, y: Float32Array): void {
    const handle = this.handle;
    const fmt = checkWeight(this.lib, "matmul", w);
    checkCount("matmul", "m", m);
    const xPtr = typedPointer("matmul", "x", x, Float32Array, m * w.k);
    const yPtr = typedPointer("matmul", "y", y, Float32Array, m * w.n);
    const bPtr = bias === null ? null : typedPointer("matmul", "bias", bias, Float32Array, w.n, true);
    check(
      this,
      this.lib.raw.tp_cpu_matmul(
        handle,
        xPtr,
        m,
        w.k,
        fmt.code,
        fmt.data,
        w.data.byteLength,
        w.n,
        fmt.scale,
        fmt.nScale,
        w.group,
        bPtr,
        yPtr,
      ),
    );
  }

  /**
   * Dequantized rows of a weight (tp.h tp_cpu_get_rows), bit-exact with @tp/quant's dequantizers:
   * out[i] = row ids[i] (or row i when ids is null).
   * @param w    the table [n, k]
   * @param ids  row indices (i32), or null for rows 0 .. nIds−1
   * @param nIds rows to produce
   * @param out  [nIds, k] f32
   * @throws TpError E_ARG for a bad argument or an id outside [0, n) (named in the message)
   */
  getRows(w: NativeWeight, ids: Int32Array | null, nIds: number, out: Float32Array): void {
    const handle = this.handle;
    const fmt = checkWeight(this.lib, "getRows", w);
    checkCount("getRows", "nIds", nIds);
    const idsPtr = ids === null ? null : typedPointer("getRows", "ids", ids, Int32Array, nIds);
    if (ids === null && nIds > w.n) {
      throw new TpError("E_ARG", `getRows: nIds = ${nIds} rows without ids, but the weight has n = ${w.n}`);
    }
    const outPtr = typedPointer("getRows", "out", out, Float32Array, nIds * w.k);
    check(
      this,
      this.lib.raw.tp_cpu_get_rows(
        handle,
        fmt.code,
        fmt.data,
        w.data.byteLength,
        w.n,
        w.k,
        fmt.scale,
        fmt.nScale,
        w.group,
        idsPtr,
        nIds,
        outPtr,
      ),
    );
  }

  /**
   * Quantize rows of activations to ggml blocks (tp.h tp_cpu_quantize_act), bit-exact with @tp/quant
   * quantizeGgml: what matmul does to x for GGUF weights.
   * @param type q8_0, q8_1 or q8_k
   * @param x    [m, k] f32
   * @param out  exactly m · k / elems · bytes of {@link ACT_BLOCKS}[type]
   * @throws TpError E_ARG for a bad argument (k not whole blocks, wrong out size, ...)
   */
  quantizeActivations(type: ActBlockType, x: Float32Array, m: number, k: number, out: Uint8Array): void {
    const handle = this.handle;
    const b = ACT_BLOCKS[checkName("quantizeActivations", "type", ACT_BLOCKS, type)];
    checkCount("quantizeActivations", "m", m);
    checkCount("quantizeActivations", "k", k);
    if (k % b.elems !== 0) {
      throw new TpError("E_ARG", `quantizeActivations: k = ${k} is not a multiple of ${b.elems} (${type})`);
    }
    const need = (m * k * b.bytes) / b.elems;
    if (!(out instanceof Uint8Array) || out.byteLength !== need) {
      throw new TpError(
        "E_ARG",
        `quantizeActivations: out must be a Uint8Array of ${need} bytes, got ${describe(out)}`,
      );
    }
    const xPtr = typedPointer("quantizeActivations", "x", x, Float32Array, m * k);
    const outPtr = need === 0 ? null : ptr(out);
    check(this, this.lib.raw.tp_cpu_quantize_act(handle, b.code, xPtr, m, k, outPtr, need));
  }

  /**
   * Rotate and quantize activation rows for a ConvRot product (tp.h tp_cpu_convrot_quantize),
   * bit-exact with @tp/quant quantizeActivationsConvRot.
   * @param x      [m, k] f32
   * @param bits   8 or 4
   * @param group  rotation group, a power of 4 dividing k (an int32_t: at most 2^30)
   * @param codes  [m, k] int8 output
   * @param scales [m] f32 output
   * @throws TpError E_STATE after destroy; E_ARG for a bad argument (named: bits, a group outside
   *   [0, 2^31 − 1], short views; the native check names a group that is not a power of 4 dividing k)
   */
  convRotQuantize(
    x: Float32Array,
    m: number,
    k: number,
    bits: 8 | 4,
    group: number,
    codes: Int8Array,
    scales: Float32Array,
  ): void {
    const handle = this.handle;
    checkCount("convRotQuantize", "m", m);
    checkCount("convRotQuantize", "k", k);
    if (bits !== 8 && bits !== 4)
      throw new TpError("E_ARG", `convRotQuantize: bits must be 8 or 4, got ${bits}`);
    checkInt32("convRotQuantize", "group", group);
    const xPtr = typedPointer("convRotQuantize", "x", x, Float32Array, m * k);
    const cPtr = typedPointer("convRotQuantize", "codes", codes, Int8Array, m * k);
    const sPtr = typedPointer("convRotQuantize", "scales", scales, Float32Array, m);
    check(this, this.lib.raw.tp_cpu_convrot_quantize(handle, xPtr, m, k, bits, group, cPtr, sPtr));
  }

  /**
   * Stop the worker threads and free the context.
   * @throws TpError E_STATE if it was already destroyed
   */
  destroy(): void {
    const handle = this.handle;
    this.#handle = null;
    contextFinalizer.unregister(this);
    this.lib.raw.tp_ctx_destroy(handle);
  }

  /** `using ctx = lib.createContext()` support: destroys the context unless already destroyed. */
  [Symbol.dispose](): void {
    if (!this.destroyed) this.destroy();
  }
}

/**
 * The tp.h `tp_wformat` code of a weight format name.
 * @param fn the function, for the message
 * @throws TpError E_ARG naming `fn`, the format and the known ones
 */
export function weightFormatCode(fn: string, format: NativeWeightFormat): number {
  return NATIVE_WEIGHT_FORMATS[checkName(fn, "weight format", NATIVE_WEIGHT_FORMATS, format)];
}

/**
 * Check a {@link NativeWeight} against its format: shape, byte count, scales, group. Returns the format
 * code and the pointers to pass (null for empty views).
 */
function checkWeight(
  lib: CpuLibrary,
  fn: string,
  w: NativeWeight,
): { code: number; data: Pointer | null; scale: Pointer | null; nScale: number } {
  const code = weightFormatCode(fn, w.format);
  checkCount(fn, "w.n", w.n);
  checkCount(fn, "w.k", w.k);
  if (!(w.data instanceof Uint8Array))
    throw new TpError("E_ARG", `${fn}: w.data must be a Uint8Array, got ${describe(w.data)}`);
  const rowBytes = lib.weightRowBytes(w.format, w.k);
  if (w.data.byteLength !== w.n * rowBytes) {
    throw new TpError(
      "E_ARG",
      `${fn}: ${w.format} weight [${w.n}, ${w.k}] needs ${w.n * rowBytes} bytes, w.data holds ${w.data.byteLength}`,
    );
  }
  const convrot = w.format === "int8_convrot" || w.format === "int4_convrot";
  const fp8 = w.format === "f8_e4m3fn" || w.format === "f8_e5m2";
  const nScale = w.scale === null ? 0 : w.scale.length;
  if (w.scale !== null && !(w.scale instanceof Float32Array)) {
    throw new TpError("E_ARG", `${fn}: w.scale must be a Float32Array or null, got ${describe(w.scale)}`);
  }
  if (convrot ? nScale !== w.n : fp8 ? nScale > 1 : nScale !== 0) {
    const want = convrot ? `${w.n} row scales` : fp8 ? "0 or 1 tensor scale" : "no scale";
    throw new TpError("E_ARG", `${fn}: a ${w.format} weight takes ${want}, got ${nScale}`);
  }
  if (convrot ? !(isPowerOf4(w.group) && w.k % w.group === 0) : w.group !== 0) {
    throw new TpError(
      "E_ARG",
      `${fn}: group = ${w.group} for ${w.format} (ConvRot: a power of 4 dividing k = ${w.k}; else 0)`,
    );
  }
  return {
    code,
    data: w.data.byteLength === 0 ? null : ptr(w.data),
    scale: nScale === 0 ? null : ptr(w.scale as Float32Array),
    nScale,
  };
}

/** Typed arrays the weight wrappers take, by constructor. */
type TypedArrayType = Float32ArrayConstructor | Int32ArrayConstructor | Int8ArrayConstructor;

/**
 * The pointer of a typed array of `type` holding at least `count` elements; null when count is 0 (or
 * when the view is empty and `allowEmpty`): bun:ffi cannot take the pointer of an empty view.
 * @throws TpError E_ARG naming `fn` and `name` for another kind of value or a short view
 */
function typedPointer(
  fn: string,
  name: string,
  view: ArrayBufferView,
  type: TypedArrayType,
  count: number,
  allowEmpty = false,
): Pointer | null {
  if (!(view instanceof type)) {
    const article = type.name.startsWith("I") ? "an" : "a";
    throw new TpError("E_ARG", `${fn}: ${name} must be ${article} ${type.name}, got ${describe(view)}`);
  }
  if (view.length < count) {
    throw new TpError("E_ARG", `${fn}: ${name} holds ${view.length} values, ${count} are needed`);
  }
  if (count === 0 || (allowEmpty && view.length === 0)) return null;
  return ptr(view);
}

/**
 * The pointer to pass for a view holding n elements of dtype; null when n is 0 (nothing is read or
 * written, and bun:ffi cannot take the pointer of an empty view).
 */
function viewPointer(name: string, view: ArrayBufferView, dtype: CastDtype, n: number): Pointer | null {
  if (!ArrayBuffer.isView(view)) {
    throw new TpError("E_ARG", `cast: ${name} must be a typed array or DataView, got ${describe(view)}`);
  }
  if (n === 0) return null;
  const size = CAST_DTYPE_BYTES[dtype];
  if (view.byteLength === 0) {
    throw new TpError("E_ARG", `cast: ${name} is an empty ${describe(view)} but n = ${n} ${dtype} elements`);
  }
  if (n * size > view.byteLength) {
    throw new TpError(
      "E_ARG",
      `cast: ${name} holds ${view.byteLength} bytes, but n = ${n} ${dtype} elements need ${n * size}`,
    );
  }
  const p = ptr(view as NodeJS.TypedArray | DataView); // ArrayBuffer.isView: one of the two
  if (p % size !== 0) {
    throw new TpError(
      "E_ARG",
      `cast: ${name} is not aligned to ${size} bytes, the size of a ${dtype} element`,
    );
  }
  return p;
}

/** A short description of a value for messages: "Float32Array(3)", "number". */
function describe(value: unknown): string {
  if (ArrayBuffer.isView(value)) {
    const length = "length" in value ? (value as { length: number }).length : value.byteLength;
    return `${value.constructor.name}(${length})`;
  }
  return value === null ? "null" : typeof value;
}
