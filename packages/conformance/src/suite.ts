/**
 * The backends the suite runs on and how they are started: by name through @tp/tensor's registry,
 * never by importing a backend package, so a backend joins by adding its name here. A backend that
 * cannot start (no driver, no GPU, not built yet) is reported with the reason, and its cases skip.
 */
import { type Backend, type BackendOptions, loadBackend } from "@tp/tensor";

/** One backend configuration the suite runs. */
export interface SuiteBackend {
  /** Registry name ("cpu", "vulkan", "ptx", "cuda"). */
  readonly backend: string;
  /** Label in test names (defaults to the name). */
  readonly label: string;
  /** Options for the factory. */
  readonly options: BackendOptions;
}

/**
 * The default list: every built-in backend, plus the cpu backend at its lower ISA levels and other
 * thread counts (its kernels differ per level; `maxIsa` is a CpuBackend option the registry passes
 * through).
 */
export const SUITE_BACKENDS: readonly SuiteBackend[] = [
  { backend: "cpu", label: "cpu", options: {} },
  {
    backend: "cpu",
    label: "cpu (avx2, 1 thread)",
    options: { threads: 1, maxIsa: "avx2" } as BackendOptions,
  },
  {
    backend: "cpu",
    label: "cpu (scalar, 3 threads)",
    options: { threads: 3, maxIsa: "scalar" } as BackendOptions,
  },
  { backend: "vulkan", label: "vulkan", options: {} },
  { backend: "ptx", label: "ptx", options: {} },
  // The ptx backend's kernels executed by its PTX simulator: what they compute, checked without a GPU.
  { backend: "ptx", label: "ptx (simulated sm_86)", options: { simulate: "sm_86" } as BackendOptions },
  // The cuda backend on the simulator: its PTX kernels around cuBLASLt (casts, ConvRot quantization,
  // int32 dequant, fp8 scaling) executed, the GEMMs by a float64 model of cuBLASLt.
  {
    backend: "cuda",
    label: "cuda (simulated sm_89, cuBLASLt model)",
    options: { simulate: "sm_89" } as BackendOptions,
  },
  { backend: "cuda", label: "cuda", options: {} },
];

/** A started backend, or the reason it could not start. */
export type Started =
  | { readonly backend: Backend; readonly reason?: undefined }
  | { readonly backend?: undefined; readonly reason: string };

/** Start a backend by name; never throws (the error message becomes the skip reason). */
export async function startBackend(b: SuiteBackend): Promise<Started> {
  try {
    return { backend: await loadBackend(b.backend, b.options) };
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    return { reason: why.split("\n")[0] ?? why };
  }
}
