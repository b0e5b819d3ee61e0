/**
 * @tp/backend-cpu: the CPU backend, registered as `cpu` (`--backend cpu`). This file only re-exports
 * what other packages use:
 * - the backend: {@link createBackend} (what `loadBackend("cpu")` calls), `CpuBackend`, and
 *   `resolveThreads` (the `--threads` / `TP_THREADS` rule of the CLI);
 * - the native library, for conformance tests and benchmarks: `loadCpuLibrary`, its contexts and the
 *   weight formats, ISA levels and CPU feature bits of native/include/tp.h;
 * - the native weight quantizers (`createNativeQuantizer`, `quantizeRows`) of `quantize` and the
 *   quantization caches;
 * - the apps' native SIGINT / SIGTERM handler (`nativeInterruptHandler`, for @tp/formats'
 *   `installInterruptCleanup`).
 *
 * Everything else (the symbol table, `check`, the op wrappers) is internal: import it from the source
 * file inside this package.
 */

export { CpuBackend, type CpuBackendOptions, createBackend, resolveThreads } from "./backend.ts";
export {
  CPU_FEATURES,
  CPU_ISA,
  type CpuIsa,
  type CpuLibrary,
  loadCpuLibrary,
  NATIVE_WEIGHT_FORMATS,
  type NativeContext,
  type NativeWeight,
  type NativeWeightFormat,
} from "./ffi.ts";
export { type NativeInterruptCleanup, nativeInterruptHandler } from "./interrupt.ts";
export {
  createNativeQuantizer,
  type NativeQuantizeFormat,
  type NativeQuantizerOptions,
  type NativeWeightQuantizer,
  type QuantizedRows,
  type QuantizeRowsOptions,
  type QuantizeSource,
  type QuantizeSourceBytes,
  quantizeRows,
} from "./quantize.ts";
