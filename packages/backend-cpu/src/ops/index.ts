/**
 * The op implementations of the cpu backend (CpuBackend delegates each op method here), the table of
 * dtypes per op, and the checked native wrappers. Re-exports only.
 */
export { attention } from "./attention.ts";
export { CPU_OP_DTYPES } from "./capabilities.ts";
export type { CpuOpHost } from "./common.ts";
export { conv2d } from "./conv2d.ts";
export { binary, gelu, modulate, scale, sigmoid, silu, swiglu } from "./elementwise.ts";
export { concat, copy, set, slice, upsampleNearest2d } from "./layout.ts";
export type { NativeRegion } from "./native.ts";
export { groupNorm, layerNorm, rmsNorm } from "./norm.ts";
export { rope } from "./rope.ts";
export { argmax, topK } from "./sample.ts";
export { softmax } from "./softmax.ts";
