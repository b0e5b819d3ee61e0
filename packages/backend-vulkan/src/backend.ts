/**
 * The `vulkan` backend: tensors live in Vulkan storage buffers (one buffer per tensor; mapped directly
 * where the device's memory is host-visible, copied through a staging buffer elsewhere), and ops are
 * compute kernels (native/vulkan/shaders/<op>.comp, SPIR-V built with the package) recorded into
 * command batches: many dispatches are recorded, submitted once, and `read` / `synchronize` wait.
 * `loadBackend("vulkan")` in @tp/tensor imports this package and calls {@link createBackend}.
 *
 * The backend is its memory (buffers, upload, read, budget, resident weights) and its kernel table
 * (./ops/table.ts); @tp/tensor's op front-end checks every op's arguments, allocates the output and
 * calls the table. An op, dtype or weight format this build lacks is TpError E_UNSUPPORTED naming op,
 * backend and format — never a fallback to another backend. `supports()` and `capabilities()` are
 * derived from the table, so they list exactly what runs here.
 *
 * Environment: TP_VULKAN_DEVICE (an index, or part of a device name), TP_VULKAN_LOADER (the loader's
 * path), TP_VULKAN_VALIDATION=1 (Khronos validation layer), TP_VULKAN_STAGING=1 (copy through staging
 * even where memory is host-visible), TP_VULKAN_SUBGROUPS / TP_VULKAN_STORAGE16 (0: the fallback kernels,
 * 1: require the feature, unset: use it where the device has it), TP_VULKAN_LIB / TP_VULKAN_SHADERS
 * (prebuilt files).
 *
 * Source: native/vulkan/tp_vk.h; @tp/tensor backend.ts for the op contracts, kernels.ts for the table.
 */

import { existsSync, readdirSync } from "node:fs";
import {
  BackendBase,
  type BackendOptions,
  type DeviceMemoryInfo,
  type DeviceMemoryReport,
  dtypeBytes,
  type KernelTable,
  type Storage,
  type StreamStats,
  storageSpan,
  type Tensor,
  TpError,
  type Weight,
  type WeightStreaming,
} from "@tp/tensor";
import {
  type ContextOptions,
  defaultShaderDir,
  loadVulkanLibrary,
  roundUp,
  type VulkanBuffer,
  type VulkanContext,
  type VulkanDeviceInfo,
} from "./ffi.ts";
import { KernelCache, type KernelFeatures } from "./kernels.ts";
import type { BoundTensor, VkOpHost } from "./ops/common.ts";
import { type ResidentWeight, uploadWeight } from "./ops/matmul.ts";
import { vulkanKernelTable } from "./ops/table.ts";

/** One slot of the stream ring: weight data (u8), ConvRot row scales (f32), host staging where unmapped. */
interface RingSlot {
  readonly data: Tensor;
  scale: Tensor | null;
  stage: { data: VulkanBuffer; scale: VulkanBuffer | null } | null;
}

/** A tensor's storage: a device buffer, or none for 0 bytes. */
interface DeviceStorage {
  readonly buffer: VulkanBuffer | null;
}

/** Options of the vulkan backend: those of every backend, plus the loader and debugging switches. */
export interface VulkanBackendOptions extends BackendOptions {
  /**
   * Device: an index ("0", "1"), or part of a device name ("RTX", "llvmpipe"); default
   * TP_VULKAN_DEVICE, else the best device (discrete GPU, integrated, virtual, CPU).
   */
  device?: string;
  /** Path of the Vulkan loader; default TP_VULKAN_LOADER, else "libvulkan.so.1". */
  loader?: string;
  /** Enable the Khronos validation layer; default TP_VULKAN_VALIDATION=1. */
  validation?: boolean;
  /** Copy through a staging buffer even where device memory is mapped; default TP_VULKAN_STAGING=1. */
  forceStaging?: boolean;
  /**
   * Kernels with subgroup operations (the reductions of softmax, the norms, argmax / top_k,
   * convrot_quantize, matmul_vec's sums): unset uses them where the device has them; false the
   * shared-memory fallbacks; true requires them (E_UNSUPPORTED naming the device where missing).
   * Default from TP_VULKAN_SUBGROUPS (0 / 1 / unset).
   */
  subgroups?: boolean;
  /**
   * Kernels that read f16 / bf16 weights (and GGUF f16 scales) through 16-bit storage
   * (storageBuffer16BitAccess): unset where the device has it, false the 32-bit-word fallback, true
   * required. Default from TP_VULKAN_STORAGE16 (0 / 1 / unset).
   */
  storage16?: boolean;
  /**
   * Time every dispatch with GPU timestamps from the start ({@link VulkanBackend.profile}); the
   * report by kernel is printed on stderr at dispose. Default TP_VULKAN_PROFILE=1.
   */
  profile?: boolean;
}

/** GPU time of one kernel (pipeline: file and specialization constants) while profiling. */
export interface KernelTime {
  /** "<spv file>:<specialization constants>", e.g. "matmul_vec.subgroup.s16:128,1,1". */
  readonly kernel: string;
  readonly dispatches: number;
  readonly ms: number;
}

/** One optional device feature the kernels can use, as {@link kernelFeatures} checks it. */
const OPTIONAL_FEATURES = {
  subgroup: {
    option: "subgroups",
    env: "TP_VULKAN_SUBGROUPS",
    what: "subgroup arithmetic and shuffles in compute shaders (VkPhysicalDeviceSubgroupProperties, subgroup size ≥ 4)",
    has: (info: VulkanDeviceInfo) => info.features.includes("subgroup") && info.subgroupSize >= 4,
  },
  s16: {
    option: "storage16",
    env: "TP_VULKAN_STORAGE16",
    what: "16-bit storage buffers (VK_KHR_16bit_storage storageBuffer16BitAccess)",
    has: (info: VulkanDeviceInfo) => info.features.includes("storage16"),
  },
} as const;

/**
 * The kernel variants a backend uses on a device: each optional feature the device has, unless its
 * option (or environment variable) is false / "0"; an option true / "1" requires the feature.
 * @throws TpError E_UNSUPPORTED when a required feature is missing, naming the device and the feature;
 *   E_ARG for an environment value other than 0 / 1
 */
export function kernelFeatures(
  info: VulkanDeviceInfo,
  options: Pick<VulkanBackendOptions, "subgroups" | "storage16"> = {},
  env: Record<string, string | undefined> = process.env,
): KernelFeatures {
  const choose = (key: keyof typeof OPTIONAL_FEATURES): boolean => {
    const f = OPTIONAL_FEATURES[key];
    let want: boolean | undefined = options[f.option];
    let from = `${f.option}: ${want}`;
    if (want === undefined) {
      const raw = env[f.env]?.trim();
      if (raw !== undefined && raw !== "") {
        if (raw !== "0" && raw !== "1")
          throw new TpError(
            "E_ARG",
            `${f.env} must be 0 (fallback kernels) or 1 (require the feature), got '${raw}'`,
          );
        want = raw === "1";
        from = `${f.env}=${raw}`;
      }
    }
    const has = f.has(info);
    if (want === true && !has) {
      throw new TpError(
        "E_UNSUPPORTED",
        `backend vulkan: ${from} needs ${f.what}, which Vulkan device ${info.index} (${info.name}) lacks; ` +
          `unset it to use the fallback kernels`,
      );
    }
    return want !== false && has;
  };
  return { subgroup: choose("subgroup"), s16: choose("s16") };
}

/**
 * Parse a device selector (TP_VULKAN_DEVICE or `options.device`): digits are an index, anything
 * else part of a device name.
 * @throws TpError E_ARG for an empty selector
 */
export function parseDeviceSelector(
  selector: string | undefined,
): Pick<ContextOptions, "deviceIndex" | "deviceName"> {
  if (selector === undefined) return {};
  const s = String(selector).trim();
  if (s === "")
    throw new TpError(
      "E_ARG",
      "TP_VULKAN_DEVICE / --device is empty; give an index or part of a device name",
    );
  if (/^\d{1,4}$/.test(s)) return { deviceIndex: Number(s) };
  return { deviceName: s };
}

/**
 * The Vulkan backend. Create it with {@link createBackend} or `loadBackend("vulkan", options)`.
 * @see BackendBase for memory semantics; Backend (in @tp/tensor) for the op contracts.
 */
export class VulkanBackend extends BackendBase implements VkOpHost, WeightStreaming, DeviceMemoryReport {
  readonly name = "vulkan";
  readonly device: string;
  /** The native context: device, buffers, pipelines, batches. */
  readonly ctx: VulkanContext;
  /** The device report. */
  readonly info: VulkanDeviceInfo;
  /** Pipelines by kernel. */
  readonly kernels: KernelCache;
  /** Invocations per workgroup of the 1-D kernels. */
  readonly workgroup: number;
  /** Kernels use subgroup operations (see {@link VulkanBackendOptions.subgroups}). */
  readonly subgroups: boolean;
  /** Kernels read 16-bit weights through 16-bit storage (see {@link VulkanBackendOptions.storage16}). */
  readonly storage16: boolean;
  readonly #resident = new Map<Weight, ResidentWeight>();
  /**
   * The stream ring's slots ({@link setStreamRing}), used in turn: device tensors, and where the
   * device's memory is not mapped, host staging buffers the uploads go through.
   */
  #ring: RingSlot[] = [];
  #ringNext = 0;
  #streamUploads = 0;
  #streamBytes = 0;
  #reportAtDispose = false;
  /** The ops of this backend: ./ops/*.ts, recorded into the context's command batches. */
  override readonly kernelTable: KernelTable = vulkanKernelTable(this);

  /**
   * @throws TpError E_UNSUPPORTED when the backend was not built (naming what the build lacked), or
   *   there is no Vulkan loader, no device, no device matching the selector; E_IO for damaged files
   */
  constructor(options: VulkanBackendOptions = {}) {
    super("vulkan", options);
    const env = process.env;
    const shaders = defaultShaderDir();
    try {
      const lib = loadVulkanLibrary();
      if (!existsSync(shaders) || !readdirSync(shaders).some((f) => f.endsWith(".spv"))) {
        throw new TpError("E_UNSUPPORTED", `no compiled kernels in ${shaders}; run 'bun run build'`);
      }
      this.ctx = lib.createContext({
        ...parseDeviceSelector(options.device ?? env.TP_VULKAN_DEVICE),
        ...((options.loader ?? env.TP_VULKAN_LOADER)
          ? { loader: options.loader ?? env.TP_VULKAN_LOADER }
          : {}),
        verbose: options.verbose === true,
        validation: options.validation ?? env.TP_VULKAN_VALIDATION === "1",
        forceStaging: options.forceStaging ?? env.TP_VULKAN_STAGING === "1",
      });
    } catch (e) {
      // One form for every reason, "backend vulkan …: why", keeping the code (E_UNSUPPORTED, E_IO, E_ARG).
      if (!(e instanceof TpError) || e.message.startsWith("backend vulkan")) throw e;
      throw new TpError(e.code, `backend vulkan cannot start: ${e.message}`, {
        ...(e.file === undefined ? {} : { file: e.file }),
        cause: e,
      });
    }
    this.info = this.ctx.info;
    let features: KernelFeatures;
    try {
      // matmul_vec's subgroup kernel keeps one slot per subgroup for up to 32 subgroups of a 128-wide
      // workgroup, hence subgroup size ≥ 4.
      features = kernelFeatures(this.info, options, env);
    } catch (e) {
      this.ctx.destroy();
      throw e;
    }
    this.kernels = new KernelCache(this.ctx, shaders, features);
    this.subgroups = features.subgroup;
    this.storage16 = features.s16;
    // A power of two (the tree reductions halve it); Vulkan guarantees at least 128.
    this.workgroup =
      2 **
      Math.floor(Math.log2(Math.min(256, this.info.maxWorkgroupInvocations, this.info.maxWorkgroupSize[0])));
    this.device = `${this.info.name} (${this.info.type}, Vulkan ${this.info.apiVersion})`;
    if (options.profile ?? env.TP_VULKAN_PROFILE === "1") {
      try {
        this.profile(true);
      } catch (e) {
        this.ctx.destroy();
        throw e;
      }
      this.#reportAtDispose = true;
    }
    if (options.verbose === true) {
      // The shim printed the device and its limits; this says which kernels run on it.
      const on = (b: boolean, what: string) => `${what} ${b ? "on" : "off (fallback)"}`;
      process.stderr.write(
        `vulkan:   kernels: ${on(this.subgroups, "subgroup reductions")}, ${on(this.storage16, "16-bit weight reads")}, ` +
          `workgroup ${this.workgroup}; GPU timestamps ${this.info.features.includes("timestamps") ? "available (profile())" : "unavailable"}\n`,
      );
    }
  }

  // ---- storage --------------------------------------------------------------------------------------

  /** As BackendBase's, with the device named in a budget's E_OOM (the device's own limits name it in C). */
  protected override newStorage(bytes: number, what: string): Storage {
    try {
      return super.newStorage(bytes, what);
    } catch (e) {
      if (!(e instanceof TpError) || e.code !== "E_OOM" || e.message.includes(this.info.name)) throw e;
      throw new TpError("E_OOM", e.message.replace(/^vulkan:/, `vulkan (${this.info.name}):`), { cause: e });
    }
  }

  protected allocStorage(bytes: number): DeviceStorage {
    return { buffer: bytes === 0 ? null : this.ctx.createBuffer(bytes) };
  }

  protected freeStorage(handle: unknown): void {
    const b = (handle as DeviceStorage).buffer;
    if (b !== null && !this.ctx.destroyed) this.ctx.destroyBuffer(b);
  }

  protected writeStorage(handle: unknown, offset: number, data: Uint8Array): void {
    const b = (handle as DeviceStorage).buffer;
    if (b !== null) this.ctx.write(b, offset, data);
  }

  protected async readStorage(handle: unknown, offset: number, length: number): Promise<Uint8Array> {
    return this.readStorageSync(handle, offset, length);
  }

  /** ctx.read waits for the queued work (native/vulkan tp_vk_buffer_read), so it needs no Promise. */
  protected override readStorageSync(handle: unknown, offset: number, length: number): Uint8Array {
    const b = (handle as DeviceStorage).buffer;
    return b === null ? new Uint8Array(length) : this.ctx.read(b, offset, length);
  }

  // ---- profiling ----------------------------------------------------------------------------------

  /**
   * Turn GPU timing on (resetting it) or off: timestamps around every batch and every dispatch
   * (native/vulkan commands.c), read back when a batch is waited for; see {@link profileReport}.
   * @throws TpError E_UNSUPPORTED naming the device when it has no timestamps on its compute queue
   */
  profile(on: boolean): void {
    this.assertUsable();
    this.ctx.profile(on);
  }

  /**
   * GPU time per kernel since {@link profile} was turned on, largest first (waits for queued work so
   * every timed batch is counted). On llvmpipe these are CPU times of the kernels.
   */
  profileReport(): { totalMs: number; kernels: KernelTime[] } {
    this.assertUsable();
    this.ctx.wait();
    const kernels = this.kernels
      .entries()
      .map(([kernel, p]) => {
        const s = this.ctx.pipelineStats(p);
        return { kernel, dispatches: s.dispatches, ms: s.gpuNs / 1e6 };
      })
      .filter((k) => k.dispatches > 0)
      .sort((a, b) => b.ms - a.ms);
    return { totalMs: this.ctx.stats().gpuNs / 1e6, kernels };
  }

  /** Submit the recorded work and wait for it. */
  override async synchronize(): Promise<void> {
    this.assertUsable();
    this.ctx.wait();
  }

  /**
   * The device buffer of a live tensor of this backend.
   * @throws TpError E_STATE for a freed or foreign tensor; E_INTERNAL for a tensor without storage
   *   (0 bytes: ops never bind those)
   */
  bufferOf(t: Tensor, op: string): VulkanBuffer {
    this.own(t);
    const buffer = (t.storage.handle as DeviceStorage).buffer;
    if (buffer === null) {
      throw new TpError("E_INTERNAL", `op ${op} on backend vulkan: ${t.describe()} has no storage to bind`);
    }
    return buffer;
  }

  /**
   * The binding of a live tensor of this backend for a kernel: its whole buffer, or — when the buffer is
   * past maxStorageBufferRange — the aligned window the view spans, with the element offset inside it.
   * @throws TpError E_STATE for a freed or foreign tensor; E_UNSUPPORTED when the view itself spans
   *   more than maxStorageBufferRange (naming op, tensor, device and limit)
   */
  bind(t: Tensor, op: string): BoundTensor {
    const buffer = this.bufferOf(t, op);
    const size = dtypeBytes(t.dtype);
    const total = roundUp(buffer.bytes, 16);
    const info = this.info;
    if (total <= info.maxStorageBufferRange) {
      return { binding: { buffer, offset: 0, range: total }, offset: t.layout.offset };
    }
    const { lo, hi } = storageSpan(t.layout);
    const align = Math.max(info.minStorageBufferOffsetAlignment, size, 4);
    const start = Math.floor((lo * size) / align) * align;
    const end = Math.min(total, roundUp(hi * size, 4));
    if (end - start > info.maxStorageBufferRange) {
      throw new TpError(
        "E_UNSUPPORTED",
        `op ${op} on backend vulkan: ${t.describe()} spans ${end - start} bytes, past maxStorageBufferRange ` +
          `(${info.maxStorageBufferRange} bytes) of ${info.name}; split it`,
      );
    }
    return { binding: { buffer, offset: start, range: end - start }, offset: (lo * size - start) / size };
  }

  // ---- weights ------------------------------------------------------------------------------------

  /**
   * Upload a weight and keep it on the device (accounted in `memory`), so that matmul / embedding use
   * it without copying it again; without this they copy the weight from its mapping on every call
   * (streaming). Calling it twice is a no-op. The copy is persisted (`persist`): it outlives any
   * `backend.scope` this runs in and stays until {@link evict} or dispose.
   * @throws TpError E_UNSUPPORTED for a format this backend lacks; E_OOM over the budget
   */
  makeResident(w: Weight): void {
    this.assertUsable();
    if (this.#resident.has(w)) return;
    this.#resident.set(w, this.persist(uploadWeight(this, w, "makeResident")));
  }

  /** Free a weight uploaded by {@link makeResident} (no-op when it is not resident). */
  evict(w: Weight): void {
    const r = this.#resident.get(w);
    if (r === undefined) return;
    this.#resident.delete(w);
    for (const t of r.tensors) if (!t.storage.freed) this.free(t);
  }

  /** True when {@link makeResident} holds `w` (and its copy was not freed by hand). */
  isResident(w: Weight): boolean {
    const r = this.#resident.get(w);
    return r !== undefined && !r.data.storage.freed;
  }

  /**
   * @internal the resident copy of a weight, if any (ops/matmul.ts).
   * @throws TpError E_STATE naming the weight when its copy was freed by hand (`free` of its tensor)
   */
  residentWeight(w: Weight): ResidentWeight | undefined {
    const r = this.#resident.get(w);
    if (r?.data.storage.freed) {
      this.evict(w);
      throw new TpError(
        "E_STATE",
        `backend vulkan: the resident copy of weight ${w.name} was freed; call makeResident again or evict it`,
      );
    }
    return r;
  }

  // ---- streaming ----------------------------------------------------------------------------------

  /**
   * Reserve a ring of `slots` device buffers (accounted, persisted) that streamed weights are uploaded
   * into in turn, instead of a buffer per op: each slot holds `dataBytes` of weight data (u8) and
   * `scaleBytes` of ConvRot row scales (f32). Before an upload into a slot the work recorded so far is
   * submitted, and the upload waits only for the batch that read the slot last: with 2 slots, weight
   * i + 1 is copied from its mapping while the batch holding weight i's matmul runs (double buffering on
   * the one compute queue). Where the device's memory is not mapped (a discrete GPU), each slot has a
   * host staging buffer of its size (host memory, outside the device budget): the weight is copied
   * into it after the batch that last moved it on has finished, and the move to the slot is recorded
   * on the queue ahead of the op. `slots` 0 frees the ring.
   * @throws TpError E_ARG for a bad count; E_OOM over the budget (no ring is left then)
   */
  setStreamRing(slots: number, dataBytes: number, scaleBytes: number): void {
    this.assertUsable();
    for (const [v, what] of [
      [slots, "slots"],
      [dataBytes, "dataBytes"],
      [scaleBytes, "scaleBytes"],
    ] as const) {
      if (!Number.isSafeInteger(v) || v < 0)
        throw new TpError("E_ARG", `setStreamRing: ${what} must be a non-negative integer, got ${v}`);
    }
    if (slots > 16) throw new TpError("E_ARG", `setStreamRing: at most 16 slots, got ${slots}`);
    this.#freeRing();
    if (slots === 0) return;
    try {
      for (let i = 0; i < slots; i++) {
        const data = this.persist(
          this.alloc([Math.max(1, dataBytes)], "u8", `stream ring slot ${i} (weight)`),
        );
        const slot: RingSlot = { data, scale: null, stage: null };
        this.#ring.push(slot);
        if (scaleBytes > 0) {
          const scale = this.alloc([Math.ceil(scaleBytes / 4)], "f32", `stream ring slot ${i} (row scales)`);
          slot.scale = this.persist(scale);
        }
        if (!this.info.unifiedMemory) {
          slot.stage = { data: this.ctx.createHostBuffer(data.byteLength), scale: null };
          if (slot.scale !== null) slot.stage.scale = this.ctx.createHostBuffer(slot.scale.byteLength);
        }
      }
    } catch (e) {
      this.#freeRing();
      throw e;
    }
  }

  /** Bytes the stream ring holds (0 without one). */
  get streamRingBytes(): number {
    let n = 0;
    for (const s of this.#ring) n += s.data.byteLength + (s.scale?.byteLength ?? 0);
    return n;
  }

  /** Weights uploaded through the stream ring since the backend started, and their bytes. */
  get streamStats(): StreamStats {
    return { uploads: this.#streamUploads, bytes: this.#streamBytes };
  }

  #freeRing(): void {
    for (const s of this.#ring) {
      if (!s.data.storage.freed) this.free(s.data);
      if (s.scale !== null && !s.scale.storage.freed) this.free(s.scale);
      for (const h of [s.stage?.data, s.stage?.scale])
        if (h && !h.destroyed && !this.ctx.destroyed) this.ctx.destroyBuffer(h);
    }
    this.#ring = [];
    this.#ringNext = 0;
  }

  /**
   * @internal a streamed weight's device copy in the next ring slot (ops/matmul.ts), or undefined
   * without a ring or when `w` does not fit a slot (the op then copies it into a buffer of its own).
   */
  streamWeight(w: Weight): ResidentWeight | undefined {
    const slot = this.#ring[this.#ringNext];
    if (slot === undefined) return undefined;
    const rowScale = w.scale?.kind === "row" ? w.scale.values : null;
    if (w.data.byteLength > slot.data.byteLength) return undefined;
    if (rowScale !== null && (slot.scale === null || rowScale.byteLength > slot.scale.byteLength))
      return undefined;
    this.#ringNext = (this.#ringNext + 1) % this.#ring.length;
    // Submit what was recorded (the previous weight's op among it), so that this copy, which waits
    // for the batch that read the slot last, runs while the newer batch computes.
    this.ctx.submit();
    const upload = (to: Tensor, stage: VulkanBuffer | null | undefined, src: Uint8Array) => {
      if (src.byteLength === 0) return;
      const dst = this.bufferOf(to, "stream");
      if (stage === null || stage === undefined) {
        this.ctx.write(dst, 0, src); // mapped: a memcpy once the slot's last reader is done
        return;
      }
      this.ctx.write(stage, 0, src); // once the move recorded from it last has run
      this.ctx.copy(stage, 0, dst, 0, src.byteLength); // on the queue, ordered after the slot's readers
    };
    upload(slot.data, slot.stage?.data, w.data);
    if (rowScale !== null) {
      const scaleBytes = new Uint8Array(rowScale.buffer, rowScale.byteOffset, rowScale.byteLength);
      upload(slot.scale as Tensor, slot.stage?.scale, scaleBytes);
    }
    this.#streamUploads++;
    this.#streamBytes += w.data.byteLength + (rowScale?.byteLength ?? 0);
    // Views of the weight's own bytes (they share the slot's persisted storage; no scope frees them),
    // so a kernel that binds its weight whole binds only these bytes, as a buffer of its own would be.
    const data = slot.data.slice(0, 0, Math.max(1, w.data.byteLength));
    const scale = rowScale === null ? null : (slot.scale as Tensor).slice(0, 0, rowScale.length);
    return { data, scale, tensors: [] };
  }

  // ---- device memory ------------------------------------------------------------------------------

  /**
   * The device's free memory for this process: VK_EXT_memory_budget's heap budget less its heap usage
   * where the device has the extension, else the heap size (other processes' use unseen).
   */
  deviceMemory(): DeviceMemoryInfo {
    this.assertUsable();
    const m = this.ctx.memoryBudget();
    if (m.extension) {
      return {
        freeBytes: Math.max(0, m.budget - m.usage),
        totalBytes: m.heapBytes,
        source: "VK_EXT_memory_budget",
        reported: true,
      };
    }
    return {
      freeBytes: m.heapBytes,
      totalBytes: m.heapBytes,
      source: `heap size; ${this.info.name} has no VK_EXT_memory_budget`,
      reported: false,
    };
  }

  override dispose(): void {
    if (this.ctx.destroyed) return;
    if (this.#reportAtDispose) {
      const r = this.profileReport();
      const lines = r.kernels
        .slice(0, 20)
        .map(
          (k) =>
            `vulkan:   ${k.ms.toFixed(3).padStart(10)} ms ${String(k.dispatches).padStart(7)}×  ${k.kernel}`,
        );
      process.stderr.write(
        `vulkan: GPU time ${r.totalMs.toFixed(3)} ms in batches; by kernel (dispatch timestamps):\n${lines.join("\n")}\n`,
      );
    }
    this.#resident.clear();
    this.#ring = [];
    super.dispose();
    this.ctx.destroy();
  }
}

/**
 * Create the `vulkan` backend.
 * @param options.device device index or part of its name (default TP_VULKAN_DEVICE, else the best)
 * @param options.memoryBudget bytes the backend may hold at once (E_OOM past it)
 * @param options.verbose print the device and its limits on stderr
 * @throws TpError E_UNSUPPORTED when the backend was not built here (naming what was missing: the
 *   Vulkan headers, glslangValidator, a C compiler), or there is no Vulkan loader or device, or no
 *   device matches the selector (listing the devices); E_ARG for bad options
 */
export function createBackend(options: VulkanBackendOptions = {}): VulkanBackend {
  return new VulkanBackend(options);
}
