/**
 * @tp/diffusion — image models, samplers and pipelines; see README.md. This file only re-exports.
 */
export * from "./models/krea2.ts";
export * from "./models/krea2-text.ts";
export * from "./models/wan-vae.ts";
export * from "./noise.ts";
export * from "./pipelines/files.ts";
export * from "./pipelines/krea2.ts";
export * from "./pipelines/random-checkpoints.ts";
export * from "./pipelines/random-text-encoder.ts";
export * from "./png.ts";
export * from "./sampler.ts";
export * from "./schedule.ts";
