/**
 * @tp/formats — safetensors and GGUF readers and writers (memory-mapped per region), checkpoint
 * layout detection with name-mapping tables, and the data behind `bun apps/cli inspect`.
 * See README.md. This file only re-exports.
 */
export * from "./errors.ts";
export * from "./file.ts";
export * from "./gguf/array.ts";
export * from "./gguf/file.ts";
export * from "./gguf/header.ts";
export * from "./gguf/types.ts";
export * from "./gguf/write.ts";
export * from "./hub.ts";
export * from "./inspect.ts";
export * from "./layouts/detect.ts";
export * from "./layouts/diffusion.ts";
export * from "./layouts/gguf-llm.ts";
export * from "./layouts/names.ts";
export * from "./layouts/quantizable.ts";
export * from "./layouts/tensor-format.ts";
export * from "./layouts/tensor-set.ts";
export * from "./layouts/text-encoder.ts";
export * from "./layouts/types.ts";
export * from "./layouts/vae.ts";
export * from "./mmap.ts";
export * from "./nonfinite.ts";
export * from "./safetensors/dtypes.ts";
export * from "./safetensors/file.ts";
export * from "./safetensors/header.ts";
export * from "./safetensors/sharded.ts";
export * from "./safetensors/write.ts";
export * from "./tensors.ts";
export * from "./write-file.ts";
