/**
 * `@tp/diffusion/testing`: deterministic random-weight checkpoints in the exact Krea 2 / ComfyUI tensor
 * layouts (DiT, Wan 2.1 VAE, Qwen3-VL text encoder) for tests, benches and `bun run demo`. Not part of
 * the package's main entry. This file only re-exports.
 */
export * from "./random-checkpoints.ts";
export * from "./random-qwen-image.ts";
export * from "./random-text-encoder.ts";
