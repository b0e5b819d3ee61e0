/**
 * A benchmark model with Gemma 3 1B's shapes (google/gemma-3-1b-it config.json: hidden 1152, 26 layers,
 * 4 query / 1 key-value head of head_dim 256, ffn 6912, vocab 262,144, tied output, sliding window
 * 512 on five layers of six, rope_theta 1e6 global / 10000 local, rms eps 1e-6, context 32768) and
 * random weights, as a Q4_0 GGUF written with @tp/formats' GGUF writer and llama.cpp's tensor names
 * (llm.md §3.5). Blocks as ./model.ts writes them; norm scales 1 (GGUF stores Gemma's 1 + w). The
 * tokenizer metadata is copied from ../shared/models/synthetic/gemma3-fullvocab-Q4_0.gguf (the real
 * Gemma 3 vocabulary and template). Cached under `$TMPDIR/tensorpencil-bench/`, built once.
 */
import { existsSync, mkdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { type GgufKvInput, type GgufTensorInput, ggufKv, openGguf, writeGguf } from "@tp/formats";
import { BENCH_DIR, benchTensors } from "./model.ts";

/** Gemma 3 1B's hyper-parameters (google/gemma-3-1b-it config.json). */
export const GEMMA3_1B = {
  hidden_size: 1152,
  num_hidden_layers: 26,
  num_attention_heads: 4,
  num_key_value_heads: 1,
  head_dim: 256,
  intermediate_size: 6912,
  vocab_size: 262144,
  rope_theta: 1e6,
  sliding_window: 512,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 32768,
} as const;

/** The file the tokenizer metadata is copied from. */
export const GEMMA3_TOKENIZER_SOURCE = resolve(
  import.meta.dir,
  "../../../../shared/models/synthetic/gemma3-fullvocab-Q4_0.gguf",
);

/** The path of the Gemma-3-1B-shaped Q4_0 model, built first when absent; null without the tokenizer source. */
export function gemma3BenchModel(): string | null {
  const path = join(BENCH_DIR, "gemma3-1b-shapes-random-Q4_0.gguf");
  if (existsSync(path) && statSync(path).size > 0) return path;
  if (!existsSync(GEMMA3_TOKENIZER_SOURCE)) return null;
  mkdirSync(BENCH_DIR, { recursive: true });
  const c = GEMMA3_1B;
  const a = "gemma3";
  const src = openGguf(GEMMA3_TOKENIZER_SOURCE);
  try {
    const meta: GgufKvInput[] = [
      ggufKv("general.architecture", "str", a),
      ggufKv("general.type", "str", "model"),
      ggufKv("general.name", "str", "gemma3-1b-shapes-random-Q4_0"),
      ggufKv("general.description", "str", "random weights with Gemma 3 1B's shapes, for bun run bench llm"),
      ggufKv("general.file_type", "u32", 2),
      ggufKv("general.quantization_version", "u32", 2),
      ggufKv(`${a}.context_length`, "u32", c.max_position_embeddings),
      ggufKv(`${a}.embedding_length`, "u32", c.hidden_size),
      ggufKv(`${a}.block_count`, "u32", c.num_hidden_layers),
      ggufKv(`${a}.feed_forward_length`, "u32", c.intermediate_size),
      ggufKv(`${a}.attention.head_count`, "u32", c.num_attention_heads),
      ggufKv(`${a}.attention.head_count_kv`, "u32", c.num_key_value_heads),
      ggufKv(`${a}.attention.key_length`, "u32", c.head_dim),
      ggufKv(`${a}.attention.value_length`, "u32", c.head_dim),
      ggufKv(`${a}.attention.sliding_window`, "u32", c.sliding_window),
      ggufKv(`${a}.rope.freq_base`, "f32", c.rope_theta),
      ggufKv(`${a}.attention.layer_norm_rms_epsilon`, "f32", c.rms_norm_eps),
      ...[...src.metadata.entries.values()].filter((kv) => kv.key.startsWith("tokenizer.")),
    ];
    const h = c.hidden_size;
    const q = c.num_attention_heads * c.head_dim;
    const kv = c.num_key_value_heads * c.head_dim;
    const { mat, vec } = benchTensors("Q4_0", 7);
    const tensors: GgufTensorInput[] = [
      mat("token_embd.weight", c.vocab_size, h),
      vec("output_norm.weight", h),
    ];
    for (let i = 0; i < c.num_hidden_layers; i++) {
      const b = `blk.${i}`;
      tensors.push(
        vec(`${b}.attn_norm.weight`, h),
        mat(`${b}.attn_q.weight`, q, h),
        mat(`${b}.attn_k.weight`, kv, h),
        mat(`${b}.attn_v.weight`, kv, h),
        mat(`${b}.attn_output.weight`, h, q),
        vec(`${b}.attn_q_norm.weight`, c.head_dim),
        vec(`${b}.attn_k_norm.weight`, c.head_dim),
        vec(`${b}.post_attention_norm.weight`, h),
        vec(`${b}.ffn_norm.weight`, h),
        mat(`${b}.ffn_gate.weight`, c.intermediate_size, h),
        mat(`${b}.ffn_up.weight`, c.intermediate_size, h),
        mat(`${b}.ffn_down.weight`, h, c.intermediate_size),
        vec(`${b}.post_ffw_norm.weight`, h),
      );
    }
    writeGguf(path, meta, tensors);
  } finally {
    src.close();
  }
  return path;
}

/**
 * f32 KV bytes of the Gemma-3-1B-shaped model for `tokens` positions, as ours holds them: the 4 global
 * layers `tokens` rows each, the 22 local ones min(tokens, window + 512) rows (the ring).
 */
export function gemma3BenchKvBytes(tokens: number): number {
  const c = GEMMA3_1B;
  const global = Math.floor(c.num_hidden_layers / 6);
  const local = c.num_hidden_layers - global;
  const ring = Math.min(tokens, c.sliding_window + 512);
  return 2 * c.num_key_value_heads * c.head_dim * 4 * (global * tokens + local * ring);
}
