/**
 * A deterministic random-weight Qwen3-VL text encoder in the tensor layout of ComfyUI's Krea 2 text
 * encoder files (prefix `model.language_model.`; krea2.md §1.9), written with @tp/formats'
 * safetensors writer: with a hidden size that fits a random DiT's text width it lets `bun run demo` and
 * the CLI tests run the real text-encoder path (template, Qwen tokenizer, 35 layers, 12 taps,
 * stripping) without a download. Its conditioning is noise: the weights are random.
 */
import { writeSafetensors } from "@tp/formats";
import type { LlmConfig } from "@tp/llm";
import { encodeFromF32, TpError } from "@tp/tensor";
import { KREA2_TEXT_TAPS } from "../models/krea2-text.ts";
import { TINY_KREA2_CONFIG } from "./random-checkpoints.ts";
import { uniform } from "./uniform.ts";

/** Sizes of a Qwen3-VL language model to write: those of @tp/llm's `LlmConfig` (config.json names). */
export type RandomQwen3VlTextConfig = Pick<
  LlmConfig,
  | "vocab_size"
  | "hidden_size"
  | "num_hidden_layers"
  | "num_attention_heads"
  | "num_key_value_heads"
  | "head_dim"
  | "intermediate_size"
>;

/**
 * A tiny text encoder for {@link TINY_KREA2_CONFIG}'s DiT: hidden 80 (its text width, so 12 taps × 80
 * = the 960 features it takes), Qwen's real vocabulary (151,936 rows: the tokenizer's ids fit), 36
 * layers (the last tap enters layer 35), 2 query heads / 1 KV head of 32, MLP 160.
 */
export const TINY_KREA2_TEXT_CONFIG: RandomQwen3VlTextConfig = {
  vocab_size: 151_936,
  hidden_size: TINY_KREA2_CONFIG.txtdim,
  num_hidden_layers: Math.max(...KREA2_TEXT_TAPS) + 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 32,
  intermediate_size: 160,
};

/**
 * Write a random-weight Qwen3-VL text encoder that `loadKrea2TextEncoder` reads like ComfyUI's
 * `qwen3vl_4b_*.safetensors`: embeddings N-like with σ 1, projections σ 1/√fan_in, RMSNorm weights 1.
 * @param path    output `.safetensors` (written atomically)
 * @param config  sizes (default {@link TINY_KREA2_TEXT_CONFIG})
 * @param options `dtype` of every tensor (default bf16), `seed` (default 0)
 * @throws TpError E_ARG for a bad seed; E_IO when the file cannot be written
 */
export function writeRandomQwen3VlText(
  path: string,
  config: RandomQwen3VlTextConfig = TINY_KREA2_TEXT_CONFIG,
  options: { dtype?: "f32" | "bf16"; seed?: number } = {},
): void {
  const seed = options.seed ?? 0;
  if (!Number.isSafeInteger(seed) || seed < 0) {
    throw new TpError("E_ARG", `seed must be a non-negative integer, got ${seed}`);
  }
  const dtype = options.dtype ?? "bf16";
  const c = config;
  const H = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  const specs: { name: string; shape: number[]; sigma: number | "one" }[] = [
    { name: "embed_tokens.weight", shape: [c.vocab_size, H], sigma: 1 },
  ];
  const mat = (name: string, n: number, k: number) =>
    specs.push({ name, shape: [n, k], sigma: 1 / Math.sqrt(k) });
  const ones = (name: string, n: number) => specs.push({ name, shape: [n], sigma: "one" });
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `layers.${l}.`;
    ones(`${p}input_layernorm.weight`, H);
    mat(`${p}self_attn.q_proj.weight`, q, H);
    mat(`${p}self_attn.k_proj.weight`, kv, H);
    mat(`${p}self_attn.v_proj.weight`, kv, H);
    mat(`${p}self_attn.o_proj.weight`, H, q);
    ones(`${p}self_attn.q_norm.weight`, c.head_dim);
    ones(`${p}self_attn.k_norm.weight`, c.head_dim);
    ones(`${p}post_attention_layernorm.weight`, H);
    mat(`${p}mlp.gate_proj.weight`, c.intermediate_size, H);
    mat(`${p}mlp.up_proj.weight`, c.intermediate_size, H);
    mat(`${p}mlp.down_proj.weight`, H, c.intermediate_size);
  }
  ones("norm.weight", H);
  const tensors = specs.map((s, i) => {
    const n = s.shape.reduce((a, b) => a * b, 1);
    const v = s.sigma === "one" ? new Float32Array(n).fill(1) : uniform(n, s.sigma, seed, i);
    const data = dtype === "f32" ? new Uint8Array(v.buffer) : encodeFromF32(v, "bf16");
    return { name: `model.language_model.${s.name}`, dtype, shape: s.shape, data };
  });
  writeSafetensors(path, tensors, {
    metadata: {
      description:
        "random weights in the Qwen3-VL text-encoder layout (TensorPencil demo); not a trained model",
      config: JSON.stringify(config),
    },
  });
}
