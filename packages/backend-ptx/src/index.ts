/**
 * @tp/backend-ptx: the PTX backend, registered as `ptx` (`--backend ptx`): kernels emitted as PTX text
 * from TypeScript (./ptx), loaded and launched through the CUDA driver API (`libcuda.so.1`) with
 * bun:ffi (./driver, also exported as `@tp/backend-ptx/driver` for the cuBLASLt / cuDNN backend).
 * Where the driver or a device is missing, {@link createBackend} throws one E_UNSUPPORTED line
 * (`backend ptx cannot start: …`), never a silent fallback to another backend.
 */
export {
  createBackend,
  PtxBackend,
  type PtxBackendOptions,
  packLaunch,
  parseDeviceOrdinal,
} from "./backend.ts";
export * as driver from "./driver/index.ts";
export { type LaunchArg, type PtxOpHost, ptxKernelTable } from "./ops.ts";
export * as ptx from "./ptx/index.ts";
export { parseSimTarget, SimCudaDriver, type SimDriverOptions } from "./sim/driver.ts";
