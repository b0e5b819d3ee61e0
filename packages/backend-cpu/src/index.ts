/**
 * @tp/backend-cpu: the CPU backend, registered as `cpu` (`--backend cpu`).
 *
 * libtp_cpu.so (native/cpu) is loaded through bun:ffi by `./ffi.ts`: CPU feature detection,
 * contexts with a thread pool and an ISA level, aligned host memory, and bit-exact dtype conversion.
 * `./backend.ts` is the `Backend`: memory with accounting and the `cast` op; the other ops arrive with
 * the CPU-backend issue and throw E_UNSUPPORTED until then.
 */

export { CpuBackend, type CpuBackendOptions, createBackend, resolveThreads } from "./backend.ts";
export {
  ACT_BLOCKS,
  type ActBlockType,
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
  NATIVE_WEIGHT_FORMATS,
  NativeContext,
  type NativeWeight,
  type NativeWeightFormat,
  type Pointer,
  TP_ABI_VERSION,
  TP_STATUS,
} from "./ffi.ts";
export { CPU_WEIGHT_FORMATS } from "./ops/matmul.ts";
export {
  createNativeQuantizer,
  NATIVE_QUANTIZE_FORMATS,
  type NativeQuantizeFormat,
  type NativeQuantizerOptions,
  type NativeWeightQuantizer,
  type QuantizedRows,
  type QuantizeRowsOptions,
  type QuantizeSource,
  type QuantizeSourceBytes,
  quantizeRows,
} from "./quantize.ts";
