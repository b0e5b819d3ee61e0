/**
 * The one bun:ffi file of @tp/backend-vulkan: the symbol table of libtp_vulkan.so
 * (native/vulkan/tp_vk.h), grouped by area, and thin typed wrappers that check sizes, offsets and
 * counts in TypeScript before any pointer crosses into C, and turn native status codes into
 * {@link TpError}s with the context's message. No other logic lives here.
 *
 * The library is loaded lazily by {@link loadVulkanLibrary}, so importing this package never fails,
 * even where nothing was built.
 *
 * Ownership (tp_vk.h): JavaScript owns every host buffer it passes; native code keeps no pointer to it
 * after a call. Buffers and pipelines belong to their context and die with it.
 *
 * Source: native/vulkan/tp_vk.h; ../shared/STYLE.md §4.
 */
import { dlopen, type Library, type Pointer } from "bun:ffi";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { checkLibraryFile, TpError, type TpErrorCode } from "@tp/tensor";

export type { Pointer } from "bun:ffi";
export { checkLibraryFile };

/** tp_vk.h TP_VK_ABI_VERSION this file was written for; libraries of another version are refused. */
export const TP_VK_ABI_VERSION = 4;

/** Status codes of tp_vk.h (`tp_vk_status`). */
export const TP_VK_STATUS = { OK: 0, ERR_ARG: 1, ERR_OOM: 2, ERR_UNSUPPORTED: 3, ERR_INTERNAL: 4 } as const;

const STATUS_ERROR: Record<number, TpErrorCode> = {
  [TP_VK_STATUS.ERR_ARG]: "E_ARG",
  [TP_VK_STATUS.ERR_OOM]: "E_OOM",
  [TP_VK_STATUS.ERR_UNSUPPORTED]: "E_UNSUPPORTED",
  [TP_VK_STATUS.ERR_INTERNAL]: "E_INTERNAL",
};

/** Flags of {@link VulkanLibrary.createContext} (tp_vk.h `TP_VK_*`). */
export const TP_VK_FLAGS = { verbose: 1, validation: 2, forceStaging: 4 } as const;

/** Feature bits of {@link VulkanDeviceInfo.features} (tp_vk.h `TP_VK_FEATURE_*`). */
export const TP_VK_FEATURES = {
  float16: 1,
  int8: 2,
  storage16: 4,
  storage8: 8,
  float64: 16,
  int64: 32,
  timestamps: 64,
  subgroup: 128,
} as const;

/** A feature name of {@link TP_VK_FEATURES}. */
export type VulkanFeature = keyof typeof TP_VK_FEATURES;

const DEVICE_TYPES = ["other", "integrated GPU", "discrete GPU", "virtual GPU", "CPU"] as const;

/** What tp_vk_info reports about a context's device (sizes in bytes). */
export interface VulkanDeviceInfo {
  readonly index: number;
  readonly count: number;
  readonly type: (typeof DEVICE_TYPES)[number];
  /** "1.3.230". */
  readonly apiVersion: string;
  readonly vendorId: number;
  readonly deviceId: number;
  readonly maxStorageBufferRange: number;
  readonly maxMemoryAllocationSize: number;
  readonly minStorageBufferOffsetAlignment: number;
  readonly maxComputeSharedMemory: number;
  readonly maxWorkgroupInvocations: number;
  readonly maxWorkgroupSize: readonly [number, number, number];
  readonly maxWorkgroupCount: readonly [number, number, number];
  readonly maxPushConstants: number;
  readonly subgroupSize: number;
  readonly deviceLocalBytes: number;
  /** Buffers are mapped directly (no staging copies). */
  readonly unifiedMemory: boolean;
  readonly features: readonly VulkanFeature[];
  /** Nanoseconds per timestamp tick, 0 without timestamps. */
  readonly timestampPeriodNs: number;
  readonly name: string;
  readonly driver: string;
}

/** Bytes of tp_vk_device_info: 25 uint64_t fields and two char[256]. */
const INFO_BYTES = 25 * 8 + 512;

/** The symbol table of libtp_vulkan.so, one group per area of tp_vk.h. */
const SYMBOLS = {
  // version, context
  tp_vk_abi_version: { args: [], returns: "i32" },
  tp_vk_create: { args: ["cstring", "i32", "cstring", "u32", "ptr", "ptr", "u64"], returns: "i32" },
  tp_vk_destroy: { args: ["ptr"], returns: "void" },
  tp_vk_error: { args: ["ptr"], returns: "cstring" },
  tp_vk_info: { args: ["ptr", "ptr", "u64"], returns: "i32" },
  // buffers
  tp_vk_buffer_create: { args: ["ptr", "u64", "ptr"], returns: "i32" },
  tp_vk_buffer_create_host: { args: ["ptr", "u64", "ptr"], returns: "i32" },
  tp_vk_buffer_destroy: { args: ["ptr", "ptr"], returns: "i32" },
  tp_vk_buffer_write: { args: ["ptr", "ptr", "u64", "ptr", "u64"], returns: "i32" },
  tp_vk_buffer_read: { args: ["ptr", "ptr", "u64", "ptr", "u64"], returns: "i32" },
  tp_vk_buffer_copy: { args: ["ptr", "ptr", "u64", "ptr", "u64", "u64"], returns: "i32" },
  tp_vk_buffer_fill: { args: ["ptr", "ptr", "u64", "u64", "u32"], returns: "i32" },
  // pipelines and work
  tp_vk_pipeline_create: { args: ["ptr", "ptr", "u64", "u32", "u32", "ptr", "u32", "ptr"], returns: "i32" },
  tp_vk_dispatch: { args: ["ptr", "ptr", "ptr", "u32", "ptr", "u32", "u32", "u32", "u32"], returns: "i32" },
  tp_vk_submit: { args: ["ptr"], returns: "i32" },
  tp_vk_wait: { args: ["ptr"], returns: "i32" },
  tp_vk_stats: { args: ["ptr", "ptr", "u32"], returns: "i32" },
  tp_vk_profile: { args: ["ptr", "i32"], returns: "i32" },
  tp_vk_pipeline_stats: { args: ["ptr", "ptr", "ptr", "u32"], returns: "i32" },
  // memory
  tp_vk_memory_budget: { args: ["ptr", "ptr", "u32"], returns: "i32" },
} as const;

/** The raw, unchecked bun:ffi functions of libtp_vulkan.so (tp_vk.h signatures). */
export type VulkanSymbols = Library<typeof SYMBOLS>["symbols"];

/** `$TP_VULKAN_LIB`, else `../build/libtp_vulkan.so` next to this file (what `bun run build` writes). */
export function defaultVulkanLibraryPath(): string {
  const fromEnv = process.env.TP_VULKAN_LIB;
  return fromEnv ? resolve(fromEnv) : resolve(import.meta.dir, "../build/libtp_vulkan.so");
}

/** Folder of the compiled kernels: `$TP_VULKAN_SHADERS`, else `../build/shaders`. */
export function defaultShaderDir(): string {
  const fromEnv = process.env.TP_VULKAN_SHADERS;
  return fromEnv ? resolve(fromEnv) : resolve(import.meta.dir, "../build/shaders");
}

/** Why the last build could not build the backend (build/unavailable.txt), or null. */
export function buildUnavailableReason(): string | null {
  const path = resolve(import.meta.dir, "../build/unavailable.txt");
  return existsSync(path) ? readFileSync(path, "utf8").trim() : null;
}

const loaded = new Map<string, VulkanLibrary>();

/**
 * Load libtp_vulkan.so (once per path).
 * @throws TpError E_UNSUPPORTED when it was not built (naming why, from the build), E_IO when the file
 *   is damaged or cannot be loaded on this platform, E_UNSUPPORTED for another ABI version
 */
export function loadVulkanLibrary(path: string = defaultVulkanLibraryPath()): VulkanLibrary {
  const cached = loaded.get(path);
  if (cached) return cached;
  if (!existsSync(path)) {
    const why = buildUnavailableReason();
    throw new TpError(
      "E_UNSUPPORTED",
      why
        ? `backend vulkan is not built on this machine: ${why}; then run 'bun run build'`
        : `backend vulkan is not built: ${path} is missing; run 'bun run build' (needs gcc, libvulkan-dev, glslang-tools)`,
      { file: path },
    );
  }
  checkLibraryFile(path);
  let library: Library<typeof SYMBOLS>;
  try {
    const probe = dlopen(path, { tp_vk_abi_version: SYMBOLS.tp_vk_abi_version });
    const version = probe.symbols.tp_vk_abi_version();
    probe.close();
    if (version !== TP_VK_ABI_VERSION) {
      throw new TpError(
        "E_UNSUPPORTED",
        `Vulkan shim has ABI version ${version}, this package expects ${TP_VK_ABI_VERSION}; rebuild it with 'bun run build'`,
        { file: path },
      );
    }
    library = dlopen(path, SYMBOLS);
  } catch (cause) {
    if (cause instanceof TpError) throw cause;
    const why = cause instanceof Error ? cause.message : String(cause);
    throw new TpError(
      "E_IO",
      `cannot load the Vulkan shim on ${process.platform}-${process.arch}: ${why}; rebuild it with 'bun run build'`,
      { file: path, cause },
    );
  }
  const lib = new VulkanLibrary(path, library.symbols);
  loaded.set(path, lib);
  return lib;
}

/** Destroys a context that was never destroyed explicitly once its wrapper is collected. */
const contextFinalizer = new FinalizationRegistry<{ lib: VulkanLibrary; handle: Pointer }>(
  ({ lib, handle }) => lib.raw.tp_vk_destroy(handle),
);

/** A NUL-terminated C string for bun:ffi "cstring" arguments. */
function cString(s: string): Buffer {
  return Buffer.from(`${s}\0`, "utf8");
}

function checkCount(fn: string, name: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new TpError("E_ARG", `${fn}: ${name} must be a non-negative safe integer, got ${value}`);
  }
}

/** Options of {@link VulkanLibrary.createContext}. */
export interface ContextOptions {
  /** Path or soname of the Vulkan loader (default "libvulkan.so.1"). */
  loader?: string;
  /** Physical device index, or -1 to choose (default). */
  deviceIndex?: number;
  /** A substring of the device name (when deviceIndex is -1). */
  deviceName?: string;
  /** Print the device and its limits on stderr. */
  verbose?: boolean;
  /** Enable the Khronos validation layer when installed. */
  validation?: boolean;
  /** Copy through a staging buffer even where memory could be mapped (tests the discrete-GPU path). */
  forceStaging?: boolean;
}

/** A loaded libtp_vulkan.so. Get one from {@link loadVulkanLibrary}. */
export class VulkanLibrary {
  /** Absolute path of the loaded file. */
  readonly path: string;
  /** The raw bun:ffi functions. Unchecked: a wrong pointer crashes the process. Prefer the methods. */
  readonly raw: VulkanSymbols;

  /** @internal use {@link loadVulkanLibrary} */
  constructor(path: string, raw: VulkanSymbols) {
    this.path = path;
    this.raw = raw;
  }

  /**
   * Open the loader, choose a device and create a context on it (tp_vk_create).
   * @throws TpError E_UNSUPPORTED with the native message when there is no loader, no device, no
   *   device matching the index or name; E_ARG for a bad option; E_INTERNAL
   */
  createContext(options: ContextOptions = {}): VulkanContext {
    const index = options.deviceIndex ?? -1;
    if (!Number.isInteger(index) || index < -1 || index > 2 ** 31 - 1) {
      throw new TpError("E_ARG", `createContext: deviceIndex must be an integer ≥ -1, got ${index}`);
    }
    const flags =
      (options.verbose ? TP_VK_FLAGS.verbose : 0) |
      (options.validation ? TP_VK_FLAGS.validation : 0) |
      (options.forceStaging ? TP_VK_FLAGS.forceStaging : 0);
    const out = new BigUint64Array(1);
    const err = new Uint8Array(1024);
    const loader = options.loader === undefined ? null : cString(options.loader);
    const name = options.deviceName === undefined ? null : cString(options.deviceName);
    const status = this.raw.tp_vk_create(loader, index, name, flags, out, err, err.byteLength);
    if (status !== TP_VK_STATUS.OK) {
      const end = err.indexOf(0);
      const message = new TextDecoder().decode(err.subarray(0, end < 0 ? err.length : end));
      throw new TpError(
        STATUS_ERROR[status] ?? "E_INTERNAL",
        message || `tp_vk_create failed with status ${status}`,
      );
    }
    return new VulkanContext(this, Number(out[0]) as Pointer);
  }
}

/** A device buffer of a context: its native handle and size in bytes. */
export interface VulkanBuffer {
  readonly ptr: Pointer;
  readonly bytes: number;
  destroyed: boolean;
}

/** A compute pipeline of a context, with its binding count and push-constant size. */
export interface VulkanPipeline {
  readonly ptr: Pointer;
  readonly bindings: number;
  readonly pushBytes: number;
}

/** One storage-buffer binding of a dispatch: a byte range of a buffer. */
export interface Binding {
  readonly buffer: VulkanBuffer;
  readonly offset: number;
  readonly range: number;
}

/** Counters of {@link VulkanContext.stats}. */
export interface VulkanStats {
  readonly dispatches: number;
  readonly batches: number;
  readonly waits: number;
  readonly liveBuffers: number;
  readonly liveBytes: number;
  /** Buffers freed by the caller whose memory waits for queued work. */
  readonly pendingFrees: number;
  /** GPU nanoseconds of the batches waited for since profiling was turned on. */
  readonly gpuNs: number;
}

/**
 * The device memory buffers come from, as the device reports it ({@link VulkanContext.memoryBudget},
 * tp_vk_memory_budget). Bytes.
 */
export interface VulkanMemoryBudget {
  /** VK_EXT_memory_budget is enabled: `budget` and `usage` are the device's figures. */
  readonly extension: boolean;
  /** Bytes this process may use in all on the heaps (heapBudget; 0 without the extension). */
  readonly budget: number;
  /** Bytes this process uses on the heaps now (heapUsage; 0 without the extension). */
  readonly usage: number;
  /** Size of the heaps. */
  readonly heapBytes: number;
}

/** GPU time of one pipeline since profiling was turned on ({@link VulkanContext.pipelineStats}). */
export interface VulkanPipelineStats {
  /** Dispatches timed (in batches waited for). */
  readonly dispatches: number;
  /** Their GPU nanoseconds. */
  readonly gpuNs: number;
}

/**
 * A tp_vk_ctx: a device, its buffers and pipelines, and the command batches. Every method checks its
 * arguments (sizes, offsets, counts) before calling into C. Destroy it with {@link destroy}; a context
 * that is garbage-collected first is destroyed then.
 */
export class VulkanContext {
  readonly lib: VulkanLibrary;
  #handle: Pointer | null;
  /** The device report (tp_vk_info), read once. */
  readonly info: VulkanDeviceInfo;

  /** @internal use {@link VulkanLibrary.createContext} */
  constructor(lib: VulkanLibrary, handle: Pointer) {
    this.lib = lib;
    this.#handle = handle;
    this.info = this.#readInfo();
    contextFinalizer.register(this, { lib, handle }, this);
  }

  /** The native handle. @throws TpError E_STATE after destroy */
  get handle(): Pointer {
    if (this.#handle === null) throw new TpError("E_STATE", "the Vulkan context was destroyed");
    return this.#handle;
  }

  /** True after {@link destroy}. */
  get destroyed(): boolean {
    return this.#handle === null;
  }

  /** The message of the last failed call (tp_vk_error). */
  lastError(): string {
    return this.#handle === null ? "" : String(this.lib.raw.tp_vk_error(this.#handle));
  }

  #check(status: number): void {
    if (status === TP_VK_STATUS.OK) return;
    const code = STATUS_ERROR[status] ?? "E_INTERNAL";
    throw new TpError(code, this.lastError() || `Vulkan call failed with status ${status}`);
  }

  #readInfo(): VulkanDeviceInfo {
    const bytes = new Uint8Array(INFO_BYTES);
    this.#check(this.lib.raw.tp_vk_info(this.handle, bytes, INFO_BYTES));
    const v = new DataView(bytes.buffer);
    const u = (i: number) => Number(v.getBigUint64(8 * i, true));
    if (u(0) !== INFO_BYTES)
      throw new TpError("E_INTERNAL", `tp_vk_device_info is ${u(0)} bytes, expected ${INFO_BYTES}`);
    const str = (at: number) => {
      const s = bytes.subarray(at, at + 256);
      const end = s.indexOf(0);
      return new TextDecoder().decode(s.subarray(0, end < 0 ? 256 : end));
    };
    const api = u(4);
    const features = u(23);
    return {
      index: u(1),
      count: u(2),
      type: DEVICE_TYPES[u(3)] ?? "other",
      apiVersion: `${(api >>> 22) & 0x7f}.${(api >>> 12) & 0x3ff}.${api & 0xfff}`,
      vendorId: u(6),
      deviceId: u(7),
      maxStorageBufferRange: u(8),
      maxMemoryAllocationSize: u(9),
      minStorageBufferOffsetAlignment: u(10),
      maxComputeSharedMemory: u(11),
      maxWorkgroupInvocations: u(12),
      maxWorkgroupSize: [u(13), u(14), u(15)],
      maxWorkgroupCount: [u(16), u(17), u(18)],
      maxPushConstants: u(19),
      subgroupSize: u(20),
      deviceLocalBytes: u(21),
      unifiedMemory: u(22) !== 0,
      features: (Object.keys(TP_VK_FEATURES) as VulkanFeature[]).filter(
        (f) => (features & TP_VK_FEATURES[f]) !== 0,
      ),
      timestampPeriodNs: u(24) / 1e6,
      name: str(200),
      driver: str(456),
    };
  }

  /**
   * A device buffer of `bytes` (> 0). @throws TpError E_OOM past the device's limits or memory (the
   *   message names the device and the limit); E_ARG for a bad size
   */
  createBuffer(bytes: number): VulkanBuffer {
    checkCount("createBuffer", "bytes", bytes);
    if (bytes === 0) throw new TpError("E_ARG", "createBuffer: a buffer needs at least 1 byte");
    const out = new BigUint64Array(1);
    this.#check(this.lib.raw.tp_vk_buffer_create(this.handle, bytes, out));
    return { ptr: Number(out[0]) as Pointer, bytes, destroyed: false };
  }

  /**
   * A host-visible staging buffer of `bytes` (> 0), mapped (tp_vk_buffer_create_host): {@link write}
   * is a memcpy into it, {@link copy} records the move to a device buffer. Host memory on a discrete GPU.
   * @throws TpError E_OOM past the device's limits or memory; E_ARG for a bad size
   */
  createHostBuffer(bytes: number): VulkanBuffer {
    checkCount("createHostBuffer", "bytes", bytes);
    if (bytes === 0) throw new TpError("E_ARG", "createHostBuffer: a buffer needs at least 1 byte");
    const out = new BigUint64Array(1);
    this.#check(this.lib.raw.tp_vk_buffer_create_host(this.handle, bytes, out));
    return { ptr: Number(out[0]) as Pointer, bytes, destroyed: false };
  }

  /** Free a buffer (deferred while queued work uses it). @throws TpError E_STATE when already destroyed */
  destroyBuffer(b: VulkanBuffer): void {
    this.#live(b, "destroyBuffer");
    b.destroyed = true;
    this.#check(this.lib.raw.tp_vk_buffer_destroy(this.handle, b.ptr));
  }

  #live(b: VulkanBuffer, fn: string): void {
    if (b === null || typeof b !== "object" || typeof b.ptr !== "number") {
      throw new TpError("E_ARG", `${fn}: expected a VulkanBuffer`);
    }
    if (b.destroyed) throw new TpError("E_STATE", `${fn}: the buffer was destroyed`);
  }

  #range(fn: string, b: VulkanBuffer, offset: number, bytes: number): void {
    this.#live(b, fn);
    checkCount(fn, "offset", offset);
    checkCount(fn, "bytes", bytes);
    if (offset + bytes > b.bytes) {
      throw new TpError(
        "E_ARG",
        `${fn}: bytes [${offset}, ${offset + bytes}) are outside a buffer of ${b.bytes} bytes`,
      );
    }
  }

  /** Copy host bytes into a buffer at `offset` (after the queued work that uses it). @throws TpError E_ARG out of range */
  write(b: VulkanBuffer, offset: number, data: Uint8Array): void {
    if (!(data instanceof Uint8Array)) throw new TpError("E_ARG", "write: data must be a Uint8Array");
    this.#range("write", b, offset, data.byteLength);
    if (data.byteLength === 0) return;
    this.#check(this.lib.raw.tp_vk_buffer_write(this.handle, b.ptr, offset, data, data.byteLength));
  }

  /** Copy `bytes` from a buffer at `offset` into a new host array, after all queued work. @throws TpError E_ARG out of range */
  read(b: VulkanBuffer, offset: number, bytes: number): Uint8Array {
    this.#range("read", b, offset, bytes);
    const out = new Uint8Array(bytes);
    if (bytes === 0) return out;
    this.#check(this.lib.raw.tp_vk_buffer_read(this.handle, b.ptr, offset, out, bytes));
    return out;
  }

  /** Record a buffer-to-buffer copy. @throws TpError E_ARG out of range or overlapping */
  copy(src: VulkanBuffer, srcOffset: number, dst: VulkanBuffer, dstOffset: number, bytes: number): void {
    this.#range("copy (source)", src, srcOffset, bytes);
    this.#range("copy (destination)", dst, dstOffset, bytes);
    if (bytes === 0) return;
    this.#check(this.lib.raw.tp_vk_buffer_copy(this.handle, src.ptr, srcOffset, dst.ptr, dstOffset, bytes));
  }

  /** Record a fill with the 32-bit word `value` (offset and bytes multiples of 4). @throws TpError E_ARG */
  fill(b: VulkanBuffer, offset: number, bytes: number, value: number): void {
    this.#range("fill", b, offset, bytes);
    if (offset % 4 !== 0 || bytes % 4 !== 0) {
      throw new TpError("E_ARG", `fill: offset ${offset} and bytes ${bytes} must be multiples of 4`);
    }
    if (bytes === 0) return;
    this.#check(this.lib.raw.tp_vk_buffer_fill(this.handle, b.ptr, offset, bytes, value >>> 0));
  }

  /**
   * A compute pipeline from SPIR-V words with `bindings` storage buffers, `pushBytes` of push
   * constants and specialization constants 0..spec.length-1.
   * @throws TpError E_ARG for bad counts; E_UNSUPPORTED when the device rejects the module
   */
  createPipeline(
    spirv: Uint8Array,
    bindings: number,
    pushBytes: number,
    spec: readonly number[] = [],
  ): VulkanPipeline {
    if (!(spirv instanceof Uint8Array) || spirv.byteLength < 20 || spirv.byteLength % 4 !== 0) {
      throw new TpError("E_ARG", "createPipeline: spirv must be the bytes of a SPIR-V module");
    }
    checkCount("createPipeline", "bindings", bindings);
    checkCount("createPipeline", "pushBytes", pushBytes);
    if (bindings > 8) throw new TpError("E_ARG", `createPipeline: ${bindings} bindings, at most 8`);
    if (pushBytes % 4 !== 0 || pushBytes > this.info.maxPushConstants) {
      throw new TpError(
        "E_ARG",
        `createPipeline: ${pushBytes} bytes of push constants (a multiple of 4, at most ${this.info.maxPushConstants})`,
      );
    }
    if (spec.length > 16 || !spec.every((s) => Number.isInteger(s) && s >= 0 && s <= 0xffffffff)) {
      throw new TpError("E_ARG", "createPipeline: at most 16 specialization constants, each a uint32");
    }
    const words = Uint32Array.from(spec);
    const code = spirv.byteOffset % 4 === 0 ? spirv : spirv.slice();
    const out = new BigUint64Array(1);
    this.#check(
      this.lib.raw.tp_vk_pipeline_create(
        this.handle,
        code,
        code.byteLength,
        bindings,
        pushBytes,
        words.length > 0 ? words : null,
        words.length,
        out,
      ),
    );
    return { ptr: Number(out[0]) as Pointer, bindings, pushBytes };
  }

  /**
   * Record one dispatch of `groups` workgroups with `bindings` (ranges checked here against the
   * buffers, the device's offset alignment and maxStorageBufferRange) and the push constants `push`.
   * @throws TpError E_ARG for a count, range, alignment or group count the device does not take
   */
  dispatch(
    p: VulkanPipeline,
    bindings: readonly Binding[],
    push: Uint8Array | null,
    groups: readonly [number, number, number],
  ): void {
    if (bindings.length !== p.bindings) {
      throw new TpError("E_ARG", `dispatch: ${bindings.length} bindings for a pipeline of ${p.bindings}`);
    }
    const pushBytes = push === null ? 0 : push.byteLength;
    if (pushBytes !== p.pushBytes) {
      throw new TpError(
        "E_ARG",
        `dispatch: ${pushBytes} bytes of push constants for a pipeline of ${p.pushBytes}`,
      );
    }
    const info = this.info;
    const table = new BigUint64Array(3 * bindings.length);
    bindings.forEach((b, i) => {
      this.#range(`dispatch binding ${i}`, b.buffer, b.offset, 0);
      checkCount("dispatch", `binding ${i} range`, b.range);
      if (b.range === 0 || b.offset + b.range > roundUp(b.buffer.bytes, 16)) {
        throw new TpError(
          "E_ARG",
          `dispatch: binding ${i}, bytes [${b.offset}, ${b.offset + b.range}), is outside its buffer of ${b.buffer.bytes} bytes`,
        );
      }
      if (b.offset % info.minStorageBufferOffsetAlignment !== 0) {
        throw new TpError(
          "E_ARG",
          `dispatch: binding ${i} offset ${b.offset} is not a multiple of ${info.minStorageBufferOffsetAlignment} (${info.name})`,
        );
      }
      if (b.range > info.maxStorageBufferRange) {
        throw new TpError(
          "E_UNSUPPORTED",
          `dispatch: binding ${i} spans ${b.range} bytes, past maxStorageBufferRange ${info.maxStorageBufferRange} of ${info.name}`,
        );
      }
      table[3 * i] = BigInt(b.buffer.ptr);
      table[3 * i + 1] = BigInt(b.offset);
      table[3 * i + 2] = BigInt(b.range);
    });
    groups.forEach((g, i) => {
      if (!Number.isInteger(g) || g < 0 || g > (info.maxWorkgroupCount[i] as number)) {
        throw new TpError(
          "E_ARG",
          `dispatch: ${groups.join(" x ")} workgroups, past ${info.name}'s ${info.maxWorkgroupCount.join(" x ")}`,
        );
      }
    });
    this.#check(
      this.lib.raw.tp_vk_dispatch(
        this.handle,
        p.ptr,
        bindings.length > 0 ? table : null,
        bindings.length,
        push !== null && push.byteLength > 0 ? push : null,
        pushBytes,
        groups[0],
        groups[1],
        groups[2],
      ),
    );
  }

  /** Submit the recorded work without waiting. */
  submit(): void {
    this.#check(this.lib.raw.tp_vk_submit(this.handle));
  }

  /** Submit the recorded work and wait for everything. */
  wait(): void {
    this.#check(this.lib.raw.tp_vk_wait(this.handle));
  }

  /**
   * Turn GPU timing on or off — timestamps around each batch ({@link stats} gpuNs) and each dispatch
   * ({@link pipelineStats}) — resetting the totals. @throws TpError E_UNSUPPORTED without timestamps
   */
  profile(enable: boolean): void {
    this.#check(this.lib.raw.tp_vk_profile(this.handle, enable ? 1 : 0));
  }

  /** GPU time of a pipeline's dispatches since {@link profile} was turned on (batches waited for). */
  pipelineStats(p: VulkanPipeline): VulkanPipelineStats {
    const out = new BigUint64Array(2);
    this.#check(this.lib.raw.tp_vk_pipeline_stats(this.handle, p.ptr, out, 2));
    return { dispatches: Number(out[0]), gpuNs: Number(out[1]) };
  }

  /** The device's memory budget and usage (VK_EXT_memory_budget where enabled) and heap size. */
  memoryBudget(): VulkanMemoryBudget {
    const out = new BigUint64Array(4);
    this.#check(this.lib.raw.tp_vk_memory_budget(this.handle, out, 4));
    return {
      extension: out[0] === 1n,
      budget: Number(out[1]),
      usage: Number(out[2]),
      heapBytes: Number(out[3]),
    };
  }

  /** Counters of the context (tp_vk_stats). */
  stats(): VulkanStats {
    const out = new BigUint64Array(7);
    this.#check(this.lib.raw.tp_vk_stats(this.handle, out, 7));
    const n = (i: number) => Number(out[i]);
    return {
      dispatches: n(0),
      batches: n(1),
      waits: n(2),
      liveBuffers: n(3),
      liveBytes: n(4),
      pendingFrees: n(5),
      gpuNs: n(6),
    };
  }

  /** Wait for all work and free the device, its buffers and pipelines. @throws TpError E_STATE when already destroyed */
  destroy(): void {
    const handle = this.handle;
    this.#handle = null;
    contextFinalizer.unregister(this);
    this.lib.raw.tp_vk_destroy(handle);
  }
}

/** `n` rounded up to a multiple of `m`. */
export function roundUp(n: number, m: number): number {
  return Math.ceil(n / m) * m;
}
