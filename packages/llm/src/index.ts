/**
 * @tp/llm — language models on any backend: architectures (models/llama.ts, models/qwen3.ts), loading
 * from GGUF and safetensors, the KV cache, chat templates and samplers. See README.md. This file only
 * re-exports.
 */
export * from "./chat.ts";
export * from "./chat-session.ts";
export * from "./generate.ts";
export * from "./kv-cache.ts";
export * from "./load.ts";
export * from "./model.ts";
export * from "./models/args.ts";
export * from "./models/checkpoint.ts";
export * from "./models/eagle3.ts";
export * from "./models/gemma3.ts";
export * from "./models/language-model.ts";
export * from "./models/layers.ts";
export * from "./models/llama.ts";
export * from "./models/qwen3.ts";
export * from "./models/qwen3-vl-text.ts";
export * from "./models/registry.ts";
export * from "./placement.ts";
export * from "./sampling.ts";
export * from "./speculative.ts";
