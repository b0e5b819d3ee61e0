/**
 * @tp/diffusion — image models, samplers and pipelines; see README.md. This file only re-exports.
 * The random-weight checkpoint writers for tests and the demo are not here: they are
 * `@tp/diffusion/testing` (src/testing/index.ts).
 */
export * from "./conditioning.ts";
export * from "./models/krea2.ts";
export * from "./models/krea2-text.ts";
export * from "./models/qwen-image.ts";
export * from "./models/qwen-image-text.ts";
export * from "./models/qwen-image-vae.ts";
export * from "./models/wan-vae.ts";
export * from "./noise.ts";
export * from "./pipeline.ts";
export * from "./pipelines/files.ts";
export * from "./pipelines/krea2.ts";
export * from "./pipelines/krea2-pipeline.ts";
export * from "./pipelines/qwen-image.ts";
export * from "./pipelines/qwen-image-pipeline.ts";
export * from "./png.ts";
export * from "./registry.ts";
export * from "./sampler.ts";
export * from "./schedule.ts";
