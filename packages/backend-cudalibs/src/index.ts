/**
 * @tp/backend-cudalibs: the NVIDIA libraries backend, registered as `cuda` (`--backend cuda`): the ptx
 * backend (@tp/backend-ptx: driver, allocator, PTX kernels) with matmul through cuBLASLt (./cublaslt.ts)
 * where it has the format, and attention and conv2d through cuDNN's graph API (./cudnn.ts) when
 * libcudnn.so.9 loads (its absence leaves them on the PTX kernels). Where libcuda,
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
  cudnnAttention,
  cudnnAttentionRoute,
  cudnnConv2d,
  librariesNote,
  openCudnn,
} from "./backend.ts";
export * from "./cublaslt.ts";
export * from "./cudnn.ts";
export * from "./kernels.ts";
export * from "./libraries.ts";
export * from "./nvidia-h.ts";
