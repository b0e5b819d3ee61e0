/**
 * @tp/backend-cpu: the CPU backend, registered as `cpu` (`--backend cpu`).
 *
 * libtp_cpu.so (native/cpu) is loaded through bun:ffi by `./ffi.ts`: CPU feature detection,
 * contexts with a thread pool and an ISA level, aligned host memory, and bit-exact dtype conversion.
 * `./backend.ts` is the `Backend`: memory with accounting and the `cast` op; the other ops arrive with
 * the CPU-backend issue and throw E_UNSUPPORTED until then.
 */

export { CpuBackend, createBackend, resolveThreads } from "./backend.ts";
export {
  CAST_DTYPE_BYTES,
  CAST_DTYPES,
  CAST_SATURATE,
  type CastDtype,
  CPU_FEATURES,
  CPU_ISA,
  type CpuFeature,
  type CpuIsa,
  CpuLibrary,
  type CpuSymbols,
  check,
  cpuFeatureNames,
  defaultCpuLibraryPath,
  loadCpuLibrary,
  NativeContext,
  type Pointer,
  TP_ABI_VERSION,
  TP_STATUS,
} from "./ffi.ts";
