/**
 * A stand-in for the CUDA driver that runs the PTX backend on the simulated GPU of ./machine.ts: the
 * same methods as {@link CudaDriver} (device facts, memory, pinned host buffers, copies, streams and
 * events, module load, launch), everything executed at once in call order (a valid order of one
 * stream's work). Modules are parsed and compiled by ./parse.ts and ./compile.ts, so a kernel the
 * simulator cannot execute fails at load with the line it stopped at.
 *
 * It exists to check what the kernels compute on machines without a GPU (the conformance suite runs
 * `ptx (simulated sm_86)`); it says nothing about speed, and hardware details it does not model (the
 * `.approx` functions' last bits, the tensor cores' accumulation order) are within the suite's
 * tolerances. Chosen only explicitly: PtxBackend option `simulate`, or TP_PTX_SIMULATE=sm_86.
 */
import { TpError } from "@tp/tensor";
import type { CudaDeviceInfo, CudaFunction, KernelArg } from "../driver/cuda.ts";
import { compileEntry } from "./compile.ts";
import { type LoadedKernel, SimMachine } from "./machine.ts";
import { parsePtx } from "./parse.ts";

/** Options of the simulated device. */
export interface SimDriverOptions {
  /** Compute capability as an sm number (80, 86, 89, 90). */
  readonly sm: number;
  /**
   * Device memory in bytes (default 256 MiB, at most 4 GiB). The pages of the arena that allocations
   * have touched (fresh blocks are NaN-filled) stay in the process's RSS, and the backend's caching
   * allocator keeps freed blocks, so this bounds what a simulated backend costs the host: a test
   * process with a few simulators stays within a few hundred MiB each.
   */
  readonly memoryBytes?: number;
}

/** Opt-in shared memory per block of the real chips (CUDA programming guide, compute capabilities table). */
function sharedOptin(sm: number): number {
  if (sm >= 90) return 227 * 1024;
  if (sm === 80) return 163 * 1024;
  return 99 * 1024;
}

/**
 * Parse `sm_86` / `86` / `sm86` into an sm number.
 * @throws TpError E_ARG naming the value for anything else, or below sm_80
 */
export function parseSimTarget(value: string): number {
  const m = /^(?:sm_?)?(\d{2,3})$/.exec(value.trim());
  const sm = m === null ? Number.NaN : Number(m[1]);
  if (!Number.isInteger(sm) || sm < 80)
    throw new TpError(
      "E_ARG",
      `TP_PTX_SIMULATE / simulate must name a compute capability sm_80 or newer (sm_86, sm_89, sm_90), got '${value}'`,
    );
  return sm;
}

/** The simulated driver: {@link CudaDriver}'s methods over a {@link SimMachine}. */
export class SimCudaDriver {
  readonly path: string;
  readonly machine: SimMachine;
  readonly sm: number;
  readonly #host = new Map<number, Uint8Array>();
  #nextHost = 0x1000;
  readonly #functions = new Map<number, LoadedKernel>();
  #nextHandle = 1;
  readonly #events = new Map<number, number>();
  #launches = 0;

  constructor(options: SimDriverOptions) {
    this.sm = options.sm;
    this.path = `PTX simulator (sm_${options.sm})`;
    this.machine = new SimMachine({
      memoryBytes: options.memoryBytes ?? 2 ** 28,
      maxSharedOptin: sharedOptin(options.sm),
    });
  }

  /** Kernel launches so far. */
  get launches(): number {
    return this.#launches;
  }

  describe(_result: number): { name: string; text: string } | null {
    return null;
  }

  check(call: string, result: number, detail = ""): void {
    if (result !== 0) throw new TpError("E_INTERNAL", `${call} failed (${result}) ${detail}`);
  }

  init(): void {}

  driverVersion(): number {
    return 13000;
  }

  deviceCount(): number {
    return 1;
  }

  deviceInfo(ordinal: number): CudaDeviceInfo {
    if (ordinal !== 0)
      throw new TpError("E_UNSUPPORTED", `CUDA device ${ordinal} does not exist; devices 0..0 do`);
    return {
      ordinal: 0,
      name: `PTX simulator (sm_${this.sm})`,
      totalMemory: this.machine.limits.memoryBytes,
      computeCapability: [Math.floor(this.sm / 10), this.sm % 10],
      multiprocessors: 1,
      maxThreadsPerBlock: 1024,
      maxSharedMemoryOptin: this.machine.limits.maxSharedOptin,
      driverVersion: this.driverVersion(),
    };
  }

  retainPrimaryContext(_ordinal: number): number {
    return 1;
  }

  /** The backend's last call as it is disposed: the simulated memory and pinned buffers go back to the host. */
  releasePrimaryContext(_ordinal: number): void {
    this.machine.release();
    this.#host.clear();
    this.#functions.clear();
  }

  memoryInfo(): { free: number; total: number } {
    const total = this.machine.limits.memoryBytes;
    return { free: total - this.machine.usedBytes, total };
  }

  memAlloc(bytes: number): bigint {
    return BigInt(this.machine.alloc(bytes));
  }

  memFree(dptr: bigint): void {
    this.machine.free(Number(dptr));
  }

  memAllocHost(bytes: number): { address: number; bytes: Uint8Array } {
    const address = this.#nextHost;
    this.#nextHost += Math.ceil((bytes + 1) / 4096) * 4096;
    const view = new Uint8Array(bytes);
    this.#host.set(address, view);
    return { address, bytes: view };
  }

  memFreeHost(address: number): void {
    if (!this.#host.delete(address))
      throw new TpError("E_ARG", `PTX simulator: host address ${address} is not pinned memory`);
  }

  #hostView(address: number, bytes: number): Uint8Array {
    for (const [base, view] of this.#host) {
      if (address >= base && address + bytes <= base + view.byteLength)
        return view.subarray(address - base, address - base + bytes);
    }
    throw new TpError("E_ARG", `PTX simulator: host range ${address}+${bytes} is not in pinned memory`);
  }

  copyHtoDAsync(dst: bigint, src: number, bytes: number, _stream: number): void {
    const at = this.machine.checkedOffset(Number(dst), bytes, "cuMemcpyHtoDAsync");
    this.machine.views.u8.set(this.#hostView(src, bytes), at);
  }

  copyDtoHAsync(dst: number, src: bigint, bytes: number, _stream: number): void {
    const at = this.machine.checkedOffset(Number(src), bytes, "cuMemcpyDtoHAsync");
    this.#hostView(dst, bytes).set(this.machine.views.u8.subarray(at, at + bytes));
  }

  copyDtoDAsync(dst: bigint, src: bigint, bytes: number, _stream: number): void {
    const d = this.machine.checkedOffset(Number(dst), bytes, "cuMemcpyDtoDAsync (destination)");
    const s = this.machine.checkedOffset(Number(src), bytes, "cuMemcpyDtoDAsync (source)");
    this.machine.views.u8.copyWithin(d, s, s + bytes);
  }

  memsetAsync(dst: bigint, value: number, bytes: number, _stream: number): void {
    const d = this.machine.checkedOffset(Number(dst), bytes, "cuMemsetD8Async");
    this.machine.views.u8.fill(value & 0xff, d, d + bytes);
  }

  streamCreate(): number {
    return 1;
  }

  streamDestroy(_stream: number): void {}

  streamSynchronize(_stream: number): void {}

  eventCreate(_timing = true): number {
    const e = this.#nextHandle++;
    this.#events.set(e, 0);
    return e;
  }

  eventDestroy(event: number): void {
    this.#events.delete(event);
  }

  eventRecord(event: number, _stream: number): void {
    this.#events.set(event, performance.now());
  }

  eventSynchronize(_event: number): void {}

  /** Wall-clock milliseconds of the simulation between the events (not a device time). */
  eventElapsedMs(start: number, end: number): number {
    return (this.#events.get(end) ?? 0) - (this.#events.get(start) ?? 0);
  }

  /**
   * Parse and compile the module's entry `entry`.
   * @throws TpError E_UNSUPPORTED naming the kernel and line for PTX outside the simulated subset, or
   *   a `.target` newer than the simulated device
   */
  loadPtx(ptx: string, entry: string): CudaFunction {
    const mod = parsePtx(ptx);
    if (mod.target > this.sm)
      throw new TpError(
        "E_UNSUPPORTED",
        `cuModuleLoadDataEx: kernel ${entry}: .target sm_${mod.target} is newer than the simulated sm_${this.sm}`,
      );
    const e = mod.entries.get(entry);
    if (e === undefined)
      throw new TpError("E_INTERNAL", `cuModuleGetFunction: kernel ${entry} is not in the module`);
    const handle = this.#nextHandle++;
    this.#functions.set(handle, this.machine.load(compileEntry(e)));
    return { module: handle, handle, name: entry };
  }

  unloadModule(module: number): void {
    this.#functions.delete(module);
  }

  setMaxDynamicShared(fn: CudaFunction, bytes: number): void {
    const k = this.#functions.get(fn.handle);
    if (k === undefined)
      throw new TpError("E_INTERNAL", `cuFuncSetAttribute: kernel ${fn.name} is not loaded`);
    if (bytes > this.machine.limits.maxSharedOptin)
      throw new TpError(
        "E_UNSUPPORTED",
        `cuFuncSetAttribute: kernel ${fn.name}: ${bytes} B of shared memory is past the device's ${this.machine.limits.maxSharedOptin} B`,
      );
    k.maxDynamicShared = bytes;
  }

  launch(
    fn: CudaFunction,
    grid: readonly [number, number, number],
    block: readonly [number, number, number],
    shared: number,
    _stream: number,
    args: readonly KernelArg[],
  ): void {
    const k = this.#functions.get(fn.handle);
    if (k === undefined) throw new TpError("E_INTERNAL", `cuLaunchKernel: kernel ${fn.name} is not loaded`);
    const values = args.map((a) =>
      "u64" in a ? Number(a.u64) : "u32" in a ? a.u32 >>> 0 : "i32" in a ? a.i32 | 0 : Math.fround(a.f32),
    );
    this.#launches++;
    this.machine.launch(k, { grid, block, sharedBytes: shared, args: values });
  }

  ctxSynchronize(): void {}

  /**
   * A view of simulated device memory from `address` to the end of its allocation, for a model of a
   * library that computes on device buffers (the cuda backend's cuBLASLt model under simulation).
   * @throws TpError E_ARG when the address is in no allocation
   */
  dataView(address: bigint): DataView {
    const at = this.machine.checkedOffset(Number(address), 1, "device access");
    const r = this.machine.region(at, 1);
    const end = r === null ? at + 1 : r.start + r.bytes;
    return new DataView(this.machine.memory, at, end - at);
  }
}
