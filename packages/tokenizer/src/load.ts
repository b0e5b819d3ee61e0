/**
 * One entry point for "the tokenizer of this model file", whatever the format.
 */
import { tokenizerFromGguf } from "./gguf.ts";
import { loadHfTokenizer } from "./hf.ts";
import type { Tokenizer } from "./tokenizer.ts";

/**
 * The tokenizer of a model file: a `.gguf` through its `tokenizer.ggml.*` metadata; anything else (a
 * checkpoint directory, a tokenizer.json, a `.safetensors` file) through the tokenizer.json beside it.
 * @param path model file or directory
 * @throws TpError see {@link tokenizerFromGguf} and {@link loadHfTokenizer}
 */
export function loadTokenizer(path: string): Tokenizer {
  return path.endsWith(".gguf") ? tokenizerFromGguf(path) : loadHfTokenizer(path);
}
