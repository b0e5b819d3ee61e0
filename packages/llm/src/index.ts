/**
 * @tp/llm — language models on any backend. Part A of the LLM issue: chat templates and samplers;
 * architectures, the KV cache and generation arrive in part B. See README.md. This file only
 * re-exports.
 */
export * from "./chat.ts";
export * from "./sampling.ts";
