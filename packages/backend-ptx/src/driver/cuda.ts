/**
 * The CUDA driver API (`libcuda.so.1`, driver API only, no runtime library) through bun:ffi: the
 * symbol table, the constants it relies on (checked against cuda.h by ./cuda-h.test.ts), and
 * {@link CudaDriver}, thin typed wrappers that turn every `CUresult` into a {@link TpError} naming the
 * call and the error (`cuGetErrorName` / `cuGetErrorString`). Shared by @tp/backend-ptx and the
 * cuBLASLt / cuDNN backend (@tp/backend-cudalibs): import it as `@tp/backend-ptx/driver`.
 *
 * The library is loaded lazily by {@link loadCudaDriver}, so importing this file never fails where no
 * NVIDIA driver is installed.
 *
 * Source: CUDA Driver API reference (cuda.h of CUDA 13.0: the `_v2` entry points its macros name,
 * enum values, `CUresult` codes).
 */
import { dlopen, type FFIFunction, type Pointer, ptr, toArrayBuffer } from "bun:ffi";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { checkLibraryFile, TpError, type TpErrorCode } from "@tp/tensor";

/** The soname of the driver library. */
export const CUDA_LIBRARY = "libcuda.so.1";

/**
 * The exported names used here, as cuda.h's macros map the API names (cuMemAlloc → cuMemAlloc_v2, …;
 * the default-stream forms, not `_ptsz`). ./cuda-h.test.ts checks every mapping against cuda.h.
 */
export const CUDA_SYMBOL_NAMES = {
  cuInit: "cuInit",
  cuDriverGetVersion: "cuDriverGetVersion",
  cuGetErrorName: "cuGetErrorName",
  cuGetErrorString: "cuGetErrorString",
  cuDeviceGetCount: "cuDeviceGetCount",
  cuDeviceGet: "cuDeviceGet",
  cuDeviceGetName: "cuDeviceGetName",
  cuDeviceTotalMem: "cuDeviceTotalMem_v2",
  cuDeviceGetAttribute: "cuDeviceGetAttribute",
  cuDevicePrimaryCtxRetain: "cuDevicePrimaryCtxRetain",
  cuDevicePrimaryCtxRelease: "cuDevicePrimaryCtxRelease_v2",
  cuCtxSetCurrent: "cuCtxSetCurrent",
  cuCtxSynchronize: "cuCtxSynchronize",
  cuMemGetInfo: "cuMemGetInfo_v2",
  cuMemAlloc: "cuMemAlloc_v2",
  cuMemFree: "cuMemFree_v2",
  cuMemAllocHost: "cuMemAllocHost_v2",
  cuMemFreeHost: "cuMemFreeHost",
  cuMemcpyHtoDAsync: "cuMemcpyHtoDAsync_v2",
  cuMemcpyDtoHAsync: "cuMemcpyDtoHAsync_v2",
  cuMemcpyDtoDAsync: "cuMemcpyDtoDAsync_v2",
  cuMemsetD8Async: "cuMemsetD8Async",
  cuStreamCreate: "cuStreamCreate",
  cuStreamDestroy: "cuStreamDestroy_v2",
  cuStreamSynchronize: "cuStreamSynchronize",
  cuEventCreate: "cuEventCreate",
  cuEventDestroy: "cuEventDestroy_v2",
  cuEventRecord: "cuEventRecord",
  cuEventSynchronize: "cuEventSynchronize",
  cuEventElapsedTime: "cuEventElapsedTime_v2",
  cuModuleLoadDataEx: "cuModuleLoadDataEx",
  cuModuleGetFunction: "cuModuleGetFunction",
  cuModuleUnload: "cuModuleUnload",
  cuFuncSetAttribute: "cuFuncSetAttribute",
  cuLaunchKernel: "cuLaunchKernel",
} as const;

/** CUresult values this package names itself (cuda.h `cudaError_enum`). */
export const CU_RESULT = {
  CUDA_SUCCESS: 0,
  CUDA_ERROR_INVALID_VALUE: 1,
  CUDA_ERROR_OUT_OF_MEMORY: 2,
  CUDA_ERROR_NOT_INITIALIZED: 3,
  CUDA_ERROR_NO_DEVICE: 100,
  CUDA_ERROR_INVALID_DEVICE: 101,
  CUDA_ERROR_STUB_LIBRARY: 34,
  CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: 803,
  CUDA_ERROR_NO_BINARY_FOR_GPU: 209,
  CUDA_ERROR_INVALID_PTX: 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION: 222,
  CUDA_ERROR_ILLEGAL_ADDRESS: 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: 701,
  CUDA_ERROR_NOT_SUPPORTED: 801,
} as const;

/** CUdevice_attribute values used here (cuda.h `CUdevice_attribute_enum`). */
export const CU_DEVICE_ATTRIBUTE = {
  MAX_THREADS_PER_BLOCK: 1,
  MAX_SHARED_MEMORY_PER_BLOCK: 8,
  WARP_SIZE: 10,
  MULTIPROCESSOR_COUNT: 16,
  COMPUTE_CAPABILITY_MAJOR: 75,
  COMPUTE_CAPABILITY_MINOR: 76,
  MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 97,
} as const;

/** Other enum values passed to the driver (cuda.h). */
export const CU_ENUM = {
  /** CUjit_option CU_JIT_INFO_LOG_BUFFER. */
  CU_JIT_INFO_LOG_BUFFER: 3,
  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: 4,
  CU_JIT_ERROR_LOG_BUFFER: 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: 6,
  /** CUstream_flags CU_STREAM_NON_BLOCKING. */
  CU_STREAM_NON_BLOCKING: 1,
  /** CUevent_flags CU_EVENT_DEFAULT. */
  CU_EVENT_DEFAULT: 0,
  /** CUevent_flags CU_EVENT_DISABLE_TIMING. */
  CU_EVENT_DISABLE_TIMING: 2,
  /** CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES. */
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: 8,
} as const;

/** Sizes in bytes of the C types the declarations below assume (checked against cuda.h). */
export const CU_SIZES = { CUresult: 4, CUdevice: 4, CUdeviceptr: 8, handle: 8, CUjit_option: 4 } as const;

/** The bun:ffi declaration of every symbol, by API name (sizes as {@link CU_SIZES}). */
const SIGNATURES = {
  cuInit: { args: ["u32"], returns: "i32" },
  cuDriverGetVersion: { args: ["ptr"], returns: "i32" },
  cuGetErrorName: { args: ["i32", "ptr"], returns: "i32" },
  cuGetErrorString: { args: ["i32", "ptr"], returns: "i32" },
  cuDeviceGetCount: { args: ["ptr"], returns: "i32" },
  cuDeviceGet: { args: ["ptr", "i32"], returns: "i32" },
  cuDeviceGetName: { args: ["ptr", "i32", "i32"], returns: "i32" },
  cuDeviceTotalMem: { args: ["ptr", "i32"], returns: "i32" },
  cuDeviceGetAttribute: { args: ["ptr", "i32", "i32"], returns: "i32" },
  cuDevicePrimaryCtxRetain: { args: ["ptr", "i32"], returns: "i32" },
  cuDevicePrimaryCtxRelease: { args: ["i32"], returns: "i32" },
  cuCtxSetCurrent: { args: ["ptr"], returns: "i32" },
  cuCtxSynchronize: { args: [], returns: "i32" },
  cuMemGetInfo: { args: ["ptr", "ptr"], returns: "i32" },
  cuMemAlloc: { args: ["ptr", "u64"], returns: "i32" },
  cuMemFree: { args: ["u64"], returns: "i32" },
  cuMemAllocHost: { args: ["ptr", "u64"], returns: "i32" },
  cuMemFreeHost: { args: ["ptr"], returns: "i32" },
  cuMemcpyHtoDAsync: { args: ["u64", "ptr", "u64", "ptr"], returns: "i32" },
  cuMemcpyDtoHAsync: { args: ["ptr", "u64", "u64", "ptr"], returns: "i32" },
  cuMemcpyDtoDAsync: { args: ["u64", "u64", "u64", "ptr"], returns: "i32" },
  cuMemsetD8Async: { args: ["u64", "u8", "u64", "ptr"], returns: "i32" },
  cuStreamCreate: { args: ["ptr", "u32"], returns: "i32" },
  cuStreamDestroy: { args: ["ptr"], returns: "i32" },
  cuStreamSynchronize: { args: ["ptr"], returns: "i32" },
  cuEventCreate: { args: ["ptr", "u32"], returns: "i32" },
  cuEventDestroy: { args: ["ptr"], returns: "i32" },
  cuEventRecord: { args: ["ptr", "ptr"], returns: "i32" },
  cuEventSynchronize: { args: ["ptr"], returns: "i32" },
  cuEventElapsedTime: { args: ["ptr", "ptr", "ptr"], returns: "i32" },
  cuModuleLoadDataEx: { args: ["ptr", "ptr", "u32", "ptr", "ptr"], returns: "i32" },
  cuModuleGetFunction: { args: ["ptr", "ptr", "ptr"], returns: "i32" },
  cuModuleUnload: { args: ["ptr"], returns: "i32" },
  cuFuncSetAttribute: { args: ["ptr", "i32", "i32"], returns: "i32" },
  cuLaunchKernel: {
    args: ["ptr", "u32", "u32", "u32", "u32", "u32", "u32", "u32", "ptr", "ptr", "ptr"],
    returns: "i32",
  },
} as const satisfies Record<keyof typeof CUDA_SYMBOL_NAMES, FFIFunction>;

type Api = keyof typeof SIGNATURES;
// biome-ignore lint/suspicious/noExplicitAny: the bun:ffi symbol table is typed by its declarations at run time
type Symbols = Record<Api, (...args: any[]) => number>;

/** The TpError code for a CUresult: out of memory, a device or binary this build cannot use, or internal. */
export function cuResultCode(result: number): TpErrorCode {
  switch (result) {
    case CU_RESULT.CUDA_ERROR_OUT_OF_MEMORY:
      return "E_OOM";
    case CU_RESULT.CUDA_ERROR_NO_DEVICE:
    case CU_RESULT.CUDA_ERROR_INVALID_DEVICE:
    case CU_RESULT.CUDA_ERROR_STUB_LIBRARY:
    case CU_RESULT.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CU_RESULT.CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CU_RESULT.CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CU_RESULT.CUDA_ERROR_NOT_SUPPORTED:
      return "E_UNSUPPORTED";
    case CU_RESULT.CUDA_ERROR_INVALID_VALUE:
      return "E_ARG";
    default:
      return "E_INTERNAL";
  }
}

/**
 * The TpError of a failed driver call: `<call> failed: <CUDA_ERROR_NAME> (<code>): <description>`.
 * @param describe the driver's name and text for a code (cuGetErrorName / cuGetErrorString), or null
 *   when it has none
 */
export function cuResultError(
  call: string,
  result: number,
  describe: (result: number) => { name: string; text: string } | null,
  detail = "",
): TpError {
  const d = describe(result);
  const what = d === null ? `CUresult ${result}` : `${d.name} (${result}): ${d.text}`;
  return new TpError(cuResultCode(result), `${call} failed: ${what}${detail === "" ? "" : `; ${detail}`}`);
}

/**
 * The library paths {@link loadCudaDriver} tries, in order: each TP_CUDA_LIB_DIR folder's (a
 * ':'-separated list, shared with the cuda backend's libraries), then the loader path's.
 */
export function cudaLibraryCandidates(env: Record<string, string | undefined> = process.env): string[] {
  return [...libraryDirs(env).map((d) => join(d, CUDA_LIBRARY)), CUDA_LIBRARY];
}

/** The folders of TP_CUDA_LIB_DIR, in order (empty entries dropped). */
export function libraryDirs(env: Record<string, string | undefined>): string[] {
  return (env.TP_CUDA_LIB_DIR ?? "")
    .split(":")
    .map((d) => d.trim())
    .filter((d) => d !== "");
}

/**
 * Check that `path`, a file found through TP_CUDA_LIB_DIR, is a usable shared library (checkLibraryFile).
 * @param what the library named in the message, e.g. "libcuda.so.1" or "cuBLASLt library"
 * @throws TpError E_IO `<path> (TP_CUDA_LIB_DIR) is not a usable <what>: <why>` naming the file
 */
export function checkLibDirFile(path: string, what: string): void {
  try {
    checkLibraryFile(path);
  } catch (e) {
    const why = (e as Error).message.replace(/^.*?: /, "").replace(/; rebuild.*$/, "");
    throw new TpError("E_IO", `${path} (TP_CUDA_LIB_DIR) is not a usable ${what}: ${why}`, {
      file: path,
      cause: e,
    });
  }
}

const HOW_TO_GET =
  `${CUDA_LIBRARY} comes with the NVIDIA driver (install the driver for the GPU, e.g. the distribution's ` +
  `nvidia-driver / libnvidia-compute package), or set TP_CUDA_LIB_DIR to the folder that holds it`;

/** A C string at `p` (NUL-terminated, at most `max` bytes), "" for a null pointer. */
function cString(p: number, max = 4096): string {
  if (p === 0) return "";
  const bytes = new Uint8Array(toArrayBuffer(p as Pointer, 0, max));
  const end = bytes.indexOf(0);
  return new TextDecoder().decode(bytes.subarray(0, end < 0 ? max : end));
}

/** Facts about one CUDA device. */
export interface CudaDeviceInfo {
  readonly ordinal: number;
  readonly name: string;
  /** Device memory in bytes. */
  readonly totalMemory: number;
  /** Compute capability, e.g. [9, 0]. */
  readonly computeCapability: readonly [number, number];
  readonly multiprocessors: number;
  readonly maxThreadsPerBlock: number;
  /** Shared memory a block may opt in to (bytes). */
  readonly maxSharedMemoryOptin: number;
  /** Driver version as cuDriverGetVersion gives it (13000 = 13.0). */
  readonly driverVersion: number;
}

/** A loaded module's function and the module it came from. */
export interface CudaFunction {
  readonly module: number;
  readonly handle: number;
  readonly name: string;
}

/** One kernel parameter: a device pointer / 64-bit integer, a 32-bit integer, or a 32-bit float. */
export type KernelArg =
  | { readonly u64: bigint | number }
  | { readonly u32: number }
  | { readonly i32: number }
  | { readonly f32: number };

/**
 * The CUDA driver: every call checked, errors as TpError naming the call. One object per process and
 * library path; its methods take and return raw handles (numbers) and device pointers (bigint).
 */
export class CudaDriver {
  readonly path: string;
  readonly #s: Symbols;
  #initialised = false;

  constructor(path: string, symbols: Symbols) {
    this.path = path;
    this.#s = symbols;
  }

  /** The driver's name and text for a CUresult, or null when it knows none. */
  describe(result: number): { name: string; text: string } | null {
    const out = new BigUint64Array(1);
    if (this.#s.cuGetErrorName(result, out) !== 0) return null;
    const name = cString(Number(out[0]));
    const text = this.#s.cuGetErrorString(result, out) === 0 ? cString(Number(out[0])) : "";
    return { name, text };
  }

  /** Throw the TpError of `result` when it is not CUDA_SUCCESS. */
  check(call: string, result: number, detail = ""): void {
    if (result !== 0) throw cuResultError(call, result, (r) => this.describe(r), detail);
  }

  #call(api: Api, ...args: unknown[]): void {
    this.check(CUDA_SYMBOL_NAMES[api], this.#s[api](...args));
  }

  /** cuInit(0), once. */
  init(): void {
    if (this.#initialised) return;
    this.#call("cuInit", 0);
    this.#initialised = true;
  }

  driverVersion(): number {
    const v = new Int32Array(1);
    this.#call("cuDriverGetVersion", v);
    return v[0] as number;
  }

  deviceCount(): number {
    this.init();
    const n = new Int32Array(1);
    this.#call("cuDeviceGetCount", n);
    return n[0] as number;
  }

  /** Name, memory, compute capability and limits of device `ordinal`. @throws TpError E_UNSUPPORTED past the count */
  deviceInfo(ordinal: number): CudaDeviceInfo {
    const count = this.deviceCount();
    if (!Number.isInteger(ordinal) || ordinal < 0 || ordinal >= count) {
      throw new TpError(
        "E_UNSUPPORTED",
        count === 0
          ? "the CUDA driver reports no device"
          : `CUDA device ${ordinal} does not exist; devices 0..${count - 1} do`,
      );
    }
    const dev = new Int32Array(1);
    this.#call("cuDeviceGet", dev, ordinal);
    const d = dev[0] as number;
    const nameBuf = new Uint8Array(256);
    this.#call("cuDeviceGetName", nameBuf, nameBuf.byteLength, d);
    const mem = new BigUint64Array(1);
    this.#call("cuDeviceTotalMem", mem, d);
    const attr = (a: number): number => {
      const v = new Int32Array(1);
      this.#call("cuDeviceGetAttribute", v, a, d);
      return v[0] as number;
    };
    const end = nameBuf.indexOf(0);
    return {
      ordinal,
      name: new TextDecoder().decode(nameBuf.subarray(0, end < 0 ? nameBuf.length : end)),
      totalMemory: Number(mem[0]),
      computeCapability: [
        attr(CU_DEVICE_ATTRIBUTE.COMPUTE_CAPABILITY_MAJOR),
        attr(CU_DEVICE_ATTRIBUTE.COMPUTE_CAPABILITY_MINOR),
      ],
      multiprocessors: attr(CU_DEVICE_ATTRIBUTE.MULTIPROCESSOR_COUNT),
      maxThreadsPerBlock: attr(CU_DEVICE_ATTRIBUTE.MAX_THREADS_PER_BLOCK),
      maxSharedMemoryOptin: attr(CU_DEVICE_ATTRIBUTE.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
      driverVersion: this.driverVersion(),
    };
  }

  /** Retain the primary context of device `ordinal` and make it current; returns the context. */
  retainPrimaryContext(ordinal: number): number {
    const ctx = new BigUint64Array(1);
    this.#call("cuDevicePrimaryCtxRetain", ctx, ordinal);
    const c = Number(ctx[0]);
    this.#call("cuCtxSetCurrent", c);
    return c;
  }

  releasePrimaryContext(ordinal: number): void {
    this.#call("cuDevicePrimaryCtxRelease", ordinal);
  }

  /** Free and total device memory of the current context, bytes. */
  memoryInfo(): { free: number; total: number } {
    const f = new BigUint64Array(1);
    const t = new BigUint64Array(1);
    this.#call("cuMemGetInfo", f, t);
    return { free: Number(f[0]), total: Number(t[0]) };
  }

  /** cuMemAlloc: `bytes` of device memory. @throws TpError E_OOM when the device has no room */
  memAlloc(bytes: number): bigint {
    const p = new BigUint64Array(1);
    this.#call("cuMemAlloc", p, bytes);
    return p[0] as bigint;
  }

  memFree(dptr: bigint): void {
    this.#call("cuMemFree", dptr);
  }

  /** Page-locked host memory of `bytes` (for asynchronous copies): its address and a byte view. */
  memAllocHost(bytes: number): { address: number; bytes: Uint8Array } {
    const p = new BigUint64Array(1);
    this.#call("cuMemAllocHost", p, bytes);
    const address = Number(p[0]);
    return { address, bytes: new Uint8Array(toArrayBuffer(address as Pointer, 0, bytes)) };
  }

  memFreeHost(address: number): void {
    this.#call("cuMemFreeHost", address);
  }

  /** Copy `bytes` from host address `src` (pinned for overlap) to device `dst`, queued on `stream`. */
  copyHtoDAsync(dst: bigint, src: number, bytes: number, stream: number): void {
    this.#call("cuMemcpyHtoDAsync", dst, src, bytes, stream);
  }

  copyDtoHAsync(dst: number, src: bigint, bytes: number, stream: number): void {
    this.#call("cuMemcpyDtoHAsync", dst, src, bytes, stream);
  }

  copyDtoDAsync(dst: bigint, src: bigint, bytes: number, stream: number): void {
    this.#call("cuMemcpyDtoDAsync", dst, src, bytes, stream);
  }

  memsetAsync(dst: bigint, value: number, bytes: number, stream: number): void {
    this.#call("cuMemsetD8Async", dst, value, bytes, stream);
  }

  streamCreate(): number {
    const s = new BigUint64Array(1);
    this.#call("cuStreamCreate", s, CU_ENUM.CU_STREAM_NON_BLOCKING);
    return Number(s[0]);
  }

  streamDestroy(stream: number): void {
    this.#call("cuStreamDestroy", stream);
  }

  streamSynchronize(stream: number): void {
    this.#call("cuStreamSynchronize", stream);
  }

  /** An event; `timing` false makes a lighter one that cannot be timed. */
  eventCreate(timing = true): number {
    const e = new BigUint64Array(1);
    this.#call("cuEventCreate", e, timing ? CU_ENUM.CU_EVENT_DEFAULT : CU_ENUM.CU_EVENT_DISABLE_TIMING);
    return Number(e[0]);
  }

  eventDestroy(event: number): void {
    this.#call("cuEventDestroy", event);
  }

  eventRecord(event: number, stream: number): void {
    this.#call("cuEventRecord", event, stream);
  }

  eventSynchronize(event: number): void {
    this.#call("cuEventSynchronize", event);
  }

  /** Milliseconds between two recorded (and completed) events. */
  eventElapsedMs(start: number, end: number): number {
    const ms = new Float32Array(1);
    this.#call("cuEventElapsedTime", ms, start, end);
    return ms[0] as number;
  }

  /**
   * Load a module from PTX text (JIT-compiled by the driver for the current device) and get its
   * function `entry`. The JIT's error log is in the message of a failure.
   * @throws TpError naming cuModuleLoadDataEx and the kernel, with the JIT log
   */
  loadPtx(ptx: string, entry: string): CudaFunction {
    const image = new TextEncoder().encode(`${ptx}\0`);
    const log = new Uint8Array(16384);
    const options = new Int32Array([
      CU_ENUM.CU_JIT_ERROR_LOG_BUFFER,
      CU_ENUM.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ]);
    const values = new BigUint64Array([BigInt(ptr(log)), BigInt(log.byteLength)]);
    const mod = new BigUint64Array(1);
    const r = this.#s.cuModuleLoadDataEx(mod, image, 2, options, values);
    if (r !== 0) {
      const end = log.indexOf(0);
      const text = new TextDecoder().decode(log.subarray(0, end < 0 ? log.length : end)).trim();
      this.check(
        "cuModuleLoadDataEx",
        r,
        `kernel ${entry}${text === "" ? "" : `, JIT log: ${text.replace(/\s+/g, " ")}`}`,
      );
    }
    const module = Number(mod[0]);
    const fn = new BigUint64Array(1);
    const r2 = this.#s.cuModuleGetFunction(fn, module, new TextEncoder().encode(`${entry}\0`));
    if (r2 !== 0) {
      this.#s.cuModuleUnload(module);
      this.check("cuModuleGetFunction", r2, `kernel ${entry}`);
    }
    return { module, handle: Number(fn[0]), name: entry };
  }

  unloadModule(module: number): void {
    this.#call("cuModuleUnload", module);
  }

  /** Allow `fn` `bytes` of dynamic shared memory (needed past 48 KiB). */
  setMaxDynamicShared(fn: CudaFunction, bytes: number): void {
    this.check(
      "cuFuncSetAttribute",
      this.#s.cuFuncSetAttribute(fn.handle, CU_ENUM.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
      `kernel ${fn.name}`,
    );
  }

  /**
   * Queue `fn` on `stream` with a grid and block (x, y, z) and `shared` bytes of dynamic shared memory.
   * Arguments are packed by {@link packKernelArgs} in the order of the kernel's `.param` list.
   */
  launch(
    fn: CudaFunction,
    grid: readonly [number, number, number],
    block: readonly [number, number, number],
    shared: number,
    stream: number,
    args: readonly KernelArg[],
  ): void {
    const { pointers } = packKernelArgs(args);
    this.check(
      "cuLaunchKernel",
      this.#s.cuLaunchKernel(fn.handle, ...grid, ...block, shared, stream, pointers, null),
      `kernel ${fn.name}, grid ${grid.join("×")}, block ${block.join("×")}, ${shared} B shared`,
    );
  }

  ctxSynchronize(): void {
    this.#call("cuCtxSynchronize");
  }
}

/**
 * What the backends use of a driver: {@link CudaDriver}'s public methods. The PTX simulator
 * (../sim/driver.ts) is the other implementation.
 */
export type CudaDriverApi = { [K in keyof CudaDriver]: CudaDriver[K] };

/**
 * Pack kernel arguments for cuLaunchKernel: each value in an 8-byte slot of one buffer, and the array
 * of pointers to the slots (`void **kernelParams`). Both must outlive the call (they do: it copies).
 * @throws TpError E_ARG for a value that does not fit its type
 */
export function packKernelArgs(args: readonly KernelArg[]): { values: Uint8Array; pointers: BigUint64Array } {
  const values = new Uint8Array(Math.max(8, args.length * 8));
  const view = new DataView(values.buffer);
  args.forEach((a, i) => {
    const at = i * 8;
    if ("u64" in a) view.setBigUint64(at, BigInt(a.u64), true);
    else if ("u32" in a) {
      if (!Number.isInteger(a.u32) || a.u32 < 0 || a.u32 > 0xffffffff)
        throw new TpError("E_ARG", `kernel argument ${i}: ${a.u32} is not a 32-bit unsigned integer`);
      view.setUint32(at, a.u32, true);
    } else if ("i32" in a) {
      if (!Number.isInteger(a.i32) || a.i32 < -(2 ** 31) || a.i32 >= 2 ** 31)
        throw new TpError("E_ARG", `kernel argument ${i}: ${a.i32} is not a 32-bit integer`);
      view.setInt32(at, a.i32, true);
    } else view.setFloat32(at, a.f32, true);
  });
  const base = args.length === 0 ? 0 : ptr(values);
  const pointers = new BigUint64Array(Math.max(1, args.length));
  for (let i = 0; i < args.length; i++) pointers[i] = BigInt(base + i * 8);
  return { values, pointers };
}

const drivers = new Map<string, CudaDriver>();

/**
 * Load the CUDA driver library: `libcuda.so.1` in the first TP_CUDA_LIB_DIR folder (':'-separated)
 * that has it, else from the loader path (LD_LIBRARY_PATH, ld.so.cache). Memoised.
 * @throws TpError E_UNSUPPORTED naming the library, where it was looked for and how to get it, when it
 *   is absent or lacks a driver entry point; E_IO when TP_CUDA_LIB_DIR's file is not a usable library
 */
export function loadCudaDriver(env: Record<string, string | undefined> = process.env): CudaDriver {
  const tried: string[] = [];
  for (const path of cudaLibraryCandidates(env)) {
    const cached = drivers.get(path);
    if (cached !== undefined) return cached;
    const explicit = path.includes("/");
    if (explicit) {
      tried.push(path);
      if (!existsSync(path)) continue;
      checkLibDirFile(path, CUDA_LIBRARY);
    } else tried.push(`${path} on the loader path`);
    let lib: ReturnType<typeof dlopen<Record<string, FFIFunction>>>;
    try {
      const table: Record<string, FFIFunction> = {};
      for (const api of Object.keys(SIGNATURES) as Api[]) table[CUDA_SYMBOL_NAMES[api]] = SIGNATURES[api];
      lib = dlopen(path, table);
    } catch (e) {
      const why = e instanceof Error ? e.message : String(e);
      // "Failed to open library": not here, try the next place; anything else (a symbol it lacks) is final.
      if (/^Failed to open library/.test(why) && !explicit) continue;
      throw new TpError(
        "E_UNSUPPORTED",
        `${path} cannot serve as ${CUDA_LIBRARY}: ${why}; this backend needs the CUDA 12.8+ driver API (${CUDA_SYMBOL_NAMES.cuEventElapsedTime}); ${HOW_TO_GET}`,
        { file: path, cause: e },
      );
    }
    const symbols = {} as Symbols;
    for (const api of Object.keys(SIGNATURES) as Api[])
      symbols[api] = lib.symbols[CUDA_SYMBOL_NAMES[api]] as unknown as Symbols[Api];
    const driver = new CudaDriver(path, symbols);
    drivers.set(path, driver);
    return driver;
  }
  throw new TpError(
    "E_UNSUPPORTED",
    `${CUDA_LIBRARY} (the CUDA driver) was not found: tried ${tried.join(", ")}; ${HOW_TO_GET}`,
  );
}
