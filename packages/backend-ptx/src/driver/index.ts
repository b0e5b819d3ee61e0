/**
 * The CUDA driver layer shared by the CUDA backends (@tp/backend-ptx, @tp/backend-cudalibs): the
 * bun:ffi binding of libcuda.so.1 with errors as TpError naming the call, the caching device
 * allocator, and pinned staging for uploads.
 */
export * from "./allocator.ts";
export * from "./cuda.ts";
