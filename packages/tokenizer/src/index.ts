/**
 * @tp/tokenizer — tokenizers built from a model file itself: byte-level BPE (Qwen) and
 * SentencePiece-style BPE with byte fallback (Llama 2, Gemma 3), from GGUF metadata or a Hugging Face
 * tokenizer.json. See README.md. This file only re-exports.
 */
export * from "./bpe.ts";
export * from "./gguf.ts";
export * from "./hf.ts";
export * from "./load.ts";
export * from "./pretokenize.ts";
export * from "./special.ts";
export * from "./spm.ts";
export * from "./tokenizer.ts";
export * from "./unicode.ts";
export * from "./vocab.ts";
