/**
 * @tp/diffusion — image models, samplers and pipelines; see README.md. This file only re-exports.
 */
export * from "./models/krea2.ts";
export * from "./models/wan-vae.ts";
export * from "./noise.ts";
export * from "./sampler.ts";
export * from "./schedule.ts";
