/**
 * The `ptx` backend: tensors in CUDA device memory (a caching sub-allocator over cuMemAlloc), uploads
 * through pinned staging buffers, and ops as PTX kernels generated in TypeScript (./ptx), JIT-loaded by
 * the driver for the device's compute capability and queued on one stream; `read` and `synchronize`
 * wait. `loadBackend("ptx")` in @tp/tensor imports this package and calls {@link createBackend}.
 *
 * Environment: TP_CUDA_DEVICE (device ordinal, default 0), TP_CUDA_LIB_DIR (folders of libcuda.so.1,
 * ':'-separated, before the loader path).
 *
 * Source: ./driver (CUDA driver API), @tp/tensor backend.ts (op contracts), kernels.ts (the table).
 */
import {
  BackendBase,
  type BackendOptions,
  dtypeBytes,
  formatBytes,
  type KernelTable,
  type Tensor,
  TpError,
  type Weight,
} from "@tp/tensor";
import { CachingAllocator, type DeviceBlock, PinnedStaging } from "./driver/allocator.ts";
import {
  type CudaDeviceInfo,
  type CudaDriverApi,
  type CudaFunction,
  type KernelArg,
  loadCudaDriver,
} from "./driver/cuda.ts";
import { type LaunchArg, type PtxOpHost, ptxKernelTable } from "./ops.ts";
import { type KernelSource, MIN_SM, ptxModule } from "./ptx/emit.ts";
import { parseSimTarget, SimCudaDriver } from "./sim/driver.ts";

/** A tensor's storage: a device block, or none for 0 bytes. */
interface DeviceStorage {
  readonly block: DeviceBlock | null;
}

/**
 * The arguments of a launch in the order of the kernel's `.param` list, from arguments by name
 * (tensors become their device addresses), and the grid checked against CUDA's limits.
 * @throws TpError E_INTERNAL for a missing, extra or mistyped argument (a bug of the op code);
 *   E_UNSUPPORTED for a grid past 2^31 − 1 × 65535 × 65535
 */
export function packLaunch(
  kernel: KernelSource,
  grid: readonly [number, number, number],
  args: Record<string, LaunchArg>,
  address: (t: Tensor) => bigint,
): KernelArg[] {
  const given = new Set(Object.keys(args));
  const packed: KernelArg[] = kernel.params.map((p) => {
    const v = args[p.name];
    if (v === undefined)
      throw new TpError("E_INTERNAL", `kernel ${kernel.name}: no argument for parameter ${p.name}`);
    given.delete(p.name);
    if (p.type === "u64")
      return typeof v === "number" || typeof v === "bigint" ? { u64: v } : { u64: address(v) };
    if (typeof v !== "number")
      throw new TpError("E_INTERNAL", `kernel ${kernel.name}: parameter ${p.name} takes a number`);
    return p.type === "f32" ? { f32: v } : p.type === "s32" ? { i32: v } : { u32: v };
  });
  if (given.size > 0)
    throw new TpError("E_INTERNAL", `kernel ${kernel.name}: no parameter ${[...given].join(", ")}`);
  for (const [i, g] of grid.entries()) {
    if (!Number.isInteger(g) || g < 1 || g > (i === 0 ? 2 ** 31 - 1 : 65535)) {
      throw new TpError(
        "E_UNSUPPORTED",
        `kernel ${kernel.name}: grid ${grid.join("×")} is past the device's limits`,
      );
    }
  }
  return packed;
}

/**
 * A weight's scales as f32 [N]: ConvRot's per-row scales, or fp8's tensor scale repeated per row.
 * @throws TpError E_FORMAT naming the weight when it has no scale
 */
export function scaleValues(w: Weight): Float32Array {
  if (w.scale?.kind === "row") return w.scale.values;
  if (w.scale?.kind === "tensor") return new Float32Array(w.shape[0]).fill(w.scale.value);
  throw new TpError("E_FORMAT", `${w.name}: format ${w.format} needs scales and the weight has none`);
}

/** A resident weight: its bytes and, for ConvRot, its row scales. */
interface ResidentWeight {
  readonly data: Tensor;
  readonly scale: Tensor | null;
}

/** Options of the ptx backend. */
export interface PtxBackendOptions extends BackendOptions {
  /** Device ordinal ("0", "1"); default TP_CUDA_DEVICE, else 0. */
  device?: string;
  /**
   * INT4 ConvRot as W4A4 (rotated activations quantized per row to int4; `mma.sync.m16n8k64.s4` from
   * 16 rows), as ComfyUI and the cpu backend run it and the conformance reference computes it; false
   * for the weight-only product (closer to the f32 product, krea2.md §1.8, but not ComfyUI's
   * pixels). Default: true unless TP_PTX_W4A4=0.
   */
  w4a4?: boolean;
  /**
   * f8_e4m3fn weights as fp8 W8A8 on sm_89+: x quantised per row to e4m3 and multiplied on the fp8
   * tensor cores (`mma.sync.m16n8k32.f32.e4m3.e4m3.f32`), a noisier contract than the default fp8
   * path that keeps x in f32 (as @tp/backend-cudalibs's TP_CUDA_FP8_ACTIVATIONS); default
   * TP_PTX_FP8_MMA=1, else off. Older devices keep the default path.
   */
  fp8Mma?: boolean;
  /**
   * Run on the PTX simulator (./sim) as this compute capability ("sm_86", "sm_89", "sm_90") instead
   * of a GPU: every kernel executed in JavaScript, memory accesses checked; for checking what the
   * kernels compute without a GPU, never for speed. Default TP_PTX_SIMULATE; never chosen otherwise.
   */
  simulate?: string;
  /** Environment to read TP_CUDA_LIB_DIR / TP_CUDA_DEVICE / TP_PTX_W4A4 / TP_PTX_SIMULATE / TP_PTX_FP8_MMA from (tests); default process.env. */
  env?: Record<string, string | undefined>;
}

/** Parse the device ordinal. @throws TpError E_ARG for anything but a small non-negative integer */
export function parseDeviceOrdinal(selector: string | undefined): number {
  if (selector === undefined || selector.trim() === "") return 0;
  const s = selector.trim();
  if (!/^\d{1,3}$/.test(s))
    throw new TpError("E_ARG", `TP_CUDA_DEVICE / --device must be a device ordinal (0, 1, …), got '${s}'`);
  return Number(s);
}

/** The ptx backend. Create it with {@link createBackend} or `loadBackend("ptx", options)`. */
export class PtxBackend extends BackendBase implements PtxOpHost {
  /** "ptx", or the name of a backend built on this one ("cuda"). */
  readonly name: string;
  /** Device, compute capability, memory, driver (a subclass appends its libraries). */
  device: string;
  readonly driver: CudaDriverApi;
  readonly info: CudaDeviceInfo;
  /** Compute capability as an sm number. */
  readonly sm: number;
  readonly stream: number;
  readonly w4a4: boolean;
  readonly fp8Mma: boolean;
  readonly allocator: CachingAllocator;
  readonly #staging: PinnedStaging;
  readonly #functions = new Map<string, CudaFunction>();
  readonly #sources = new Map<string, KernelSource>();
  readonly #resident = new Map<Weight, ResidentWeight>();
  #closed = false;
  override readonly kernelTable: KernelTable = ptxKernelTable(this);

  /**
   * @throws TpError E_UNSUPPORTED when libcuda.so.1 is absent, there is no device, or the device is
   *   older than sm_80; E_IO for a damaged library file; E_ARG for a bad device selector
   * @param name the registry name: "ptx", or "cuda" for @tp/backend-cudalibs built on this class
   */
  constructor(options: PtxBackendOptions = {}, name = "ptx") {
    super(name, options);
    this.name = name;
    const env = options.env ?? process.env;
    const ordinal = parseDeviceOrdinal(options.device ?? env.TP_CUDA_DEVICE);
    this.w4a4 = options.w4a4 ?? env.TP_PTX_W4A4 !== "0";
    this.fp8Mma = options.fp8Mma ?? env.TP_PTX_FP8_MMA === "1";
    const simulate = options.simulate ?? env.TP_PTX_SIMULATE;
    this.driver =
      simulate !== undefined && simulate !== ""
        ? new SimCudaDriver({ sm: parseSimTarget(simulate) })
        : loadCudaDriver(env);
    this.driver.init();
    this.info = this.driver.deviceInfo(ordinal);
    const [major, minor] = this.info.computeCapability;
    this.sm = major * 10 + minor;
    if (this.sm < MIN_SM) {
      throw new TpError(
        "E_UNSUPPORTED",
        `CUDA device ${ordinal} (${this.info.name}) is sm_${this.sm}; the PTX kernels need sm_${MIN_SM} or newer`,
      );
    }
    this.driver.retainPrimaryContext(ordinal);
    this.stream = this.driver.streamCreate();
    const driver = this.driver;
    this.allocator = new CachingAllocator({
      alloc: (b) => driver.memAlloc(b),
      free: (p) => driver.memFree(p),
    });
    this.#staging = new PinnedStaging(driver, this.stream);
    this.device =
      this.driver instanceof SimCudaDriver
        ? `PTX simulator (sm_${this.sm}, ${formatBytes(this.info.totalMemory)}; kernels executed in JavaScript, not on a GPU)`
        : `${this.info.name} (sm_${this.sm}, ${formatBytes(this.info.totalMemory)}, ${this.info.multiprocessors} SMs, CUDA driver ${Math.floor(this.info.driverVersion / 1000)}.${(this.info.driverVersion % 1000) / 10})`;
    if (options.verbose === true) process.stderr.write(`${name}: ${this.device}\n`);
  }

  // ---- storage --------------------------------------------------------------------------------------

  protected allocStorage(bytes: number): DeviceStorage {
    return { block: bytes === 0 ? null : this.allocator.alloc(bytes) };
  }

  protected freeStorage(handle: unknown): void {
    const b = (handle as DeviceStorage).block;
    if (b !== null && !this.#closed) this.allocator.free(b);
  }

  protected writeStorage(handle: unknown, offset: number, data: Uint8Array): void {
    const b = (handle as DeviceStorage).block;
    if (b !== null && data.byteLength > 0) this.#staging.upload(b.ptr + BigInt(offset), data);
  }

  protected async readStorage(handle: unknown, offset: number, length: number): Promise<Uint8Array> {
    const b = (handle as DeviceStorage).block;
    if (b === null || length === 0) return new Uint8Array(length);
    return this.#staging.download(b.ptr + BigInt(offset), length);
  }

  /** The device address of a tensor view's first element. */
  address(t: Tensor): bigint {
    this.own(t);
    const b = (t.storage.handle as DeviceStorage).block;
    if (b === null) return 0n;
    return b.ptr + BigInt(t.layout.offset * dtypeBytes(t.dtype));
  }

  // ---- kernels --------------------------------------------------------------------------------------

  kernel(name: string, make: () => KernelSource): KernelSource {
    let k = this.#sources.get(name);
    if (k === undefined) {
      k = make();
      this.#sources.set(name, k);
    }
    return k;
  }

  #function(k: KernelSource): CudaFunction {
    let f = this.#functions.get(k.name);
    if (f === undefined) {
      f = this.driver.loadPtx(ptxModule(this.sm, [k]), k.name);
      this.#functions.set(k.name, f);
    }
    return f;
  }

  launch(
    kernel: KernelSource,
    grid: readonly [number, number, number],
    args: Record<string, LaunchArg>,
  ): void {
    this.assertUsable();
    const packed = packLaunch(kernel, grid, args, (t) => this.address(t));
    this.driver.launch(
      this.#function(kernel),
      grid,
      [kernel.block[0], kernel.block[1], 1],
      0,
      this.stream,
      packed,
    );
  }

  fill(t: Tensor, value: number): void {
    if (t.byteLength > 0) this.driver.memsetAsync(this.address(t), value, t.byteLength, this.stream);
  }

  // ---- resident weights ---------------------------------------------------------------------------

  /**
   * A weight's bytes on the device: its resident copy ({@link makeResident}), else a copy uploaded
   * for this op (streamed), which the op's scope frees when it returns.
   */
  weightBytes(w: Weight): Tensor {
    return this.#residentOf(w)?.data ?? this.upload(w.data, [w.data.byteLength], "u8", w.name);
  }

  /** A weight's scales as f32 [N] on the device: resident with the weight (ConvRot rows), else per op. */
  weightScale(w: Weight): Tensor {
    const r = this.#residentOf(w)?.scale;
    if (r) return r;
    const values = scaleValues(w);
    return this.upload(values, [values.length], "f32", `${w.name}.weight_scale`);
  }

  #residentOf(w: Weight): ResidentWeight | undefined {
    const r = this.#resident.get(w);
    if (r !== undefined && (r.data.storage.freed || r.scale?.storage.freed === true)) {
      this.evict(w);
      throw new TpError(
        "E_STATE",
        `backend ptx: the resident copy of weight ${w.name} was freed; call makeResident again or evict it`,
      );
    }
    return r;
  }

  /**
   * Upload a weight once and keep it on the device (accounted in `memory`, persisted out of every
   * scope) until {@link evict} or dispose; matmul / embedding / matmul_id then use it without copying.
   * Holds the data and ConvRot's row scales (@tp/tensor residentBytesOf). Twice is a no-op.
   * @throws TpError E_OOM over the budget
   */
  makeResident(w: Weight): void {
    this.assertUsable();
    if (this.#resident.has(w)) return;
    const data = this.persist(this.upload(w.data, [w.data.byteLength], "u8", w.name));
    let scale: Tensor | null = null;
    if (w.scale?.kind === "row") {
      try {
        scale = this.persist(
          this.upload(w.scale.values, [w.scale.values.length], "f32", `${w.name}.weight_scale`),
        );
      } catch (e) {
        this.free(data);
        throw e;
      }
    }
    this.#resident.set(w, { data, scale });
  }

  /** Free a weight's resident copy (no-op when it is not resident). */
  evict(w: Weight): void {
    const r = this.#resident.get(w);
    if (r === undefined) return;
    this.#resident.delete(w);
    for (const t of [r.data, r.scale]) if (t !== null && !t.storage.freed) this.free(t);
  }

  /** True when {@link makeResident} holds `w`. */
  isResident(w: Weight): boolean {
    const r = this.#resident.get(w);
    return r !== undefined && !r.data.storage.freed;
  }

  override async synchronize(): Promise<void> {
    this.assertUsable();
    this.driver.streamSynchronize(this.stream);
  }

  /** Storage bytes held by the allocator's cache besides the live tensors. */
  allocatorStats() {
    return this.allocator.stats();
  }

  override dispose(): void {
    if (this.#closed) return;
    this.driver.streamSynchronize(this.stream);
    this.#resident.clear();
    super.dispose();
    this.#closed = true;
    this.allocator.emptyCache();
    for (const f of this.#functions.values()) this.driver.unloadModule(f.module);
    this.#functions.clear();
    this.#staging.dispose();
    this.driver.streamDestroy(this.stream);
    this.driver.releasePrimaryContext(this.info.ordinal);
  }
}

/**
 * Create the `ptx` backend.
 * @throws TpError `backend ptx cannot start: …` — E_UNSUPPORTED without libcuda.so.1 (naming it, where
 *   it was looked for and how to get it), without a device, or on a device older than sm_80; E_IO for
 *   a damaged TP_CUDA_LIB_DIR library; E_ARG for a bad device selector
 */
export function createBackend(options: PtxBackendOptions = {}): PtxBackend {
  try {
    return new PtxBackend(options);
  } catch (e) {
    if (!(e instanceof TpError)) throw e;
    throw new TpError(e.code, `backend ptx cannot start: ${e.message.replace(/\s*\n\s*/g, " ")}`, {
      ...(e.file === undefined ? {} : { file: e.file }),
      cause: e,
    });
  }
}
