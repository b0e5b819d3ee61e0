/**
 * The MoE benchmark model: random weights with Qwen3-30B-A3B's shapes (hidden 2048, 32 query / 4
 * key-value heads of head_dim 128, 128 experts of which 8 per token, expert FFN 768, vocab 151,936,
 * untied output, rope_theta 1e6, rms eps 1e-6; Qwen/Qwen3-30B-A3B config.json, llm.md §3.2) truncated
 * to the first {@link MOE_BENCH_LAYERS} of its 48 layers, so that the file fits this machine's disk and
 * memory (1.76 GB in Q4_0). A GGUF `qwen3moe` in Q4_0 written with @tp/formats' GGUF writer and
 * llama.cpp's tensor names: the experts stacked 3-D (`ffn_{gate,up,down}_exps`), the router
 * `ffn_gate_inp` in F32 (as converters write it), random blocks as ./model.ts writes them, the
 * tokenizer metadata of ../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf. Cached by name under
 * `$TMPDIR/tensorpencil-bench/` and built once.
 */
import { existsSync, mkdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { type GgufKvInput, type GgufTensorInput, ggufKv, openGguf, writeGguf } from "@tp/formats";
import { BENCH_DIR, benchTensors, FILE_TYPE, randomBytes, TOKENIZER_SOURCE } from "./model.ts";

/** Layers kept of Qwen3-30B-A3B's 48. */
export const MOE_BENCH_LAYERS = 4;

/** Qwen3-30B-A3B's hyper-parameters (Qwen/Qwen3-30B-A3B config.json), num_hidden_layers truncated. */
export const QWEN3_30B_A3B = {
  hidden_size: 2048,
  num_hidden_layers: MOE_BENCH_LAYERS,
  num_attention_heads: 32,
  num_key_value_heads: 4,
  head_dim: 128,
  intermediate_size: 6144,
  num_experts: 128,
  num_experts_per_tok: 8,
  moe_intermediate_size: 768,
  vocab_size: 151936,
  rope_theta: 1e6,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 40960,
} as const;

/** f32 values U(−a, a) as bytes (the router), from the xorshift bytes of ./model.ts. */
function randomF32(n: number, a: number, seed: number): Uint8Array {
  const bits = new Uint8Array(n * 4);
  randomBytes(bits, seed);
  const u = new Uint32Array(bits.buffer);
  const f = Float32Array.from(u, (v) => ((v / 4294967296) * 2 - 1) * a);
  return new Uint8Array(f.buffer);
}

/**
 * The path of the MoE benchmark model (Q4_0), building it first when absent.
 * @returns the path, or null when the tokenizer source file is absent (the suite then skips)
 */
export function benchMoeModel(): string | null {
  const quant = "Q4_0";
  const name = `qwen3-30b-a3b-shapes-${MOE_BENCH_LAYERS}layers-random-${quant}`;
  const path = join(BENCH_DIR, `${name}.gguf`);
  if (existsSync(path) && statSync(path).size > 0) return path;
  if (!existsSync(TOKENIZER_SOURCE)) return null;
  mkdirSync(BENCH_DIR, { recursive: true });
  const c = QWEN3_30B_A3B;
  const a = "qwen3moe";
  const src = openGguf(TOKENIZER_SOURCE);
  try {
    const meta: GgufKvInput[] = [
      ggufKv("general.architecture", "str", a),
      ggufKv("general.type", "str", "model"),
      ggufKv("general.name", "str", name),
      ggufKv(
        "general.description",
        "str",
        `random weights with Qwen3-30B-A3B's shapes, ${MOE_BENCH_LAYERS} of 48 layers, for bun run bench llm`,
      ),
      ggufKv("general.file_type", "u32", FILE_TYPE[quant]),
      ggufKv("general.quantization_version", "u32", 2),
      ggufKv(`${a}.context_length`, "u32", c.max_position_embeddings),
      ggufKv(`${a}.embedding_length`, "u32", c.hidden_size),
      ggufKv(`${a}.block_count`, "u32", c.num_hidden_layers),
      ggufKv(`${a}.feed_forward_length`, "u32", c.intermediate_size),
      ggufKv(`${a}.attention.head_count`, "u32", c.num_attention_heads),
      ggufKv(`${a}.attention.head_count_kv`, "u32", c.num_key_value_heads),
      ggufKv(`${a}.rope.freq_base`, "f32", c.rope_theta),
      ggufKv(`${a}.attention.layer_norm_rms_epsilon`, "f32", c.rms_norm_eps),
      ggufKv(`${a}.attention.key_length`, "u32", c.head_dim),
      ggufKv(`${a}.attention.value_length`, "u32", c.head_dim),
      ggufKv(`${a}.expert_count`, "u32", c.num_experts),
      ggufKv(`${a}.expert_used_count`, "u32", c.num_experts_per_tok),
      ggufKv(`${a}.expert_feed_forward_length`, "u32", c.moe_intermediate_size),
      ...[...src.metadata.entries.values()].filter((kv) => kv.key.startsWith("tokenizer.")),
    ];
    const h = c.hidden_size;
    const q = c.num_attention_heads * c.head_dim;
    const kv = c.num_key_value_heads * c.head_dim;
    const E = c.num_experts;
    const F = c.moe_intermediate_size;
    const { tensor: mat, vec, nextSeed } = benchTensors(quant, 1);
    const tensors: GgufTensorInput[] = [
      mat("token_embd.weight", [c.vocab_size, h]),
      vec("output_norm.weight", h),
      mat("output.weight", [c.vocab_size, h]),
    ];
    for (let i = 0; i < c.num_hidden_layers; i++) {
      const b = `blk.${i}`;
      tensors.push(
        vec(`${b}.attn_norm.weight`, h),
        mat(`${b}.attn_q.weight`, [q, h]),
        mat(`${b}.attn_k.weight`, [kv, h]),
        mat(`${b}.attn_v.weight`, [kv, h]),
        mat(`${b}.attn_output.weight`, [h, q]),
        vec(`${b}.attn_q_norm.weight`, c.head_dim),
        vec(`${b}.attn_k_norm.weight`, c.head_dim),
        vec(`${b}.ffn_norm.weight`, h),
        {
          name: `${b}.ffn_gate_inp.weight`,
          type: "F32",
          shape: [E, h],
          data: randomF32(E * h, 0.05, nextSeed()),
        },
        mat(`${b}.ffn_gate_exps.weight`, [E, F, h]),
        mat(`${b}.ffn_up_exps.weight`, [E, F, h]),
        mat(`${b}.ffn_down_exps.weight`, [E, h, F]),
      );
    }
    writeGguf(path, meta, tensors);
  } finally {
    src.close();
  }
  return path;
}

/** KV cache bytes of the MoE benchmark model for `tokens` positions at `bytesPerElement` (f32: 4). */
export function benchMoeKvBytes(tokens: number, bytesPerElement: number): number {
  const c = QWEN3_30B_A3B;
  return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * bytesPerElement * tokens;
}
