/**
 * @tp/backend-cudalibs: the NVIDIA libraries backend, registered as `cuda` (`--backend cuda`): the ptx
 * backend (@tp/backend-ptx: driver, allocator, PTX kernels) with matmul through cuBLASLt (./cublaslt.ts)
 * where it has the format, and cuDNN loaded for the ops that will use it (./cudnn.ts). Where libcuda,
 * a device or cuBLASLt is missing, {@link createBackend} throws one E_UNSUPPORTED line
 * (`backend cuda cannot start: …`), never a silent fallback to another backend.
 */
export {
  CudaBackend,
  type CudaBackendOptions,
  type CudaOpHost,
  createBackend,
  cublasLtMatmul,
  cublasLtRoute,
  cudaKernelTable,
} from "./backend.ts";
export * from "./cublaslt.ts";
export * from "./cudnn.ts";
export * from "./kernels.ts";
export * from "./libraries.ts";
export * from "./nvidia-h.ts";
