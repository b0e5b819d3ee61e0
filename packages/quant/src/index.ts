/**
 * @tp/quant — reference implementations (TypeScript, clear and slow) of every weight format
 * TensorPencil reads: fp8, the ConvRot Hadamard rotation, INT8 / INT4 ConvRot, and GGUF block types.
 * See README.md.
 */
export * from "./convrot.ts";
export * from "./convrot-linear.ts";
export * from "./detect.ts";
export * from "./fp8.ts";
export * from "./ggml-dequant.ts";
export * from "./ggml-quantize.ts";
export * from "./hadamard.ts";
export * from "./input.ts";
export * from "./rounding.ts";
