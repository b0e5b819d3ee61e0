/**
 * @tp/quant — reference implementations (TypeScript, clear and slow) of every weight format
 * TensorPencil reads: fp8, the ConvRot Hadamard rotation, INT8 / INT4 ConvRot, and GGUF block types;
 * quantizing whole checkpoints (ComfyUI-loadable) and quantize-on-load caches. See README.md.
 */
export * from "./cache.ts";
export * from "./checkpoint.ts";
export * from "./convrot.ts";
export * from "./convrot-linear.ts";
export * from "./fp8.ts";
export * from "./ggml-dequant.ts";
export * from "./ggml-quantize.ts";
export * from "./hadamard.ts";
export * from "./input.ts";
export * from "./progress.ts";
export * from "./rounding.ts";
