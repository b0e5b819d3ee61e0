/**
 * A benchmark model with Qwen3.5-0.8B's shapes, the smallest Qwen 3.5 dense size (llm.md §3.4.x, last
 * bullet, and §3.4's hyper-parameter line: hidden 1024, 24 layers with every 4th full attention — 18
 * Gated DeltaNet + 6 gated-attention layers —, 8 query / 2 key-value heads of head_dim 256 with 64
 * rotated dims and M-RoPE sections [11, 11, 10, 0] at base 1e7, FFN 3584, linear attention 16 key / 16
 * value heads of 128 with a 4-tap causal conv, vocab 248,320, tied output, rms eps 1e-6, context
 * 262144) and random weights, as a GGUF `qwen35` in Q4_0 written with @tp/formats' GGUF writer and
 * llama.cpp's tensor names (§3.4's table). Matrices are random blocks as ./model.ts writes them
 * (`ssm_beta` / `ssm_alpha` too, as quantizers leave them); F32 as converters write them: norms 1 (GGUF
 * holds the +1), `ssm_norm` 1, `ssm_conv1d` U(−0.5, 0.5), `ssm_a` = −exp(A_log) = −1 … −16 over the
 * value heads (Mamba's A_log range), `ssm_dt.bias` 0 — so every decay exp(g) lies in (0, 1) and the
 * recurrence stays finite. The tokenizer metadata is that of
 * ../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf (Qwen3's 151,936 tokens; the shared folder has
 * no full Qwen 3.5 vocabulary) padded with `[PAD{i}]` tokens of type 5 (unused), as Qwen3's own
 * padding is, to the 248,320 embedding rows llama.cpp requires, with `tokenizer.ggml.pre` = `qwen35`.
 * Cached under `$TMPDIR/tensorpencil-bench/`, built once (deterministic: fixed seeds).
 */
import { existsSync, mkdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { GgufArray, type GgufKvInput, type GgufTensorInput, ggufKv, openGguf, writeGguf } from "@tp/formats";
import { BENCH_DIR, benchTensors, FILE_TYPE, randomBytes, TOKENIZER_SOURCE } from "./model.ts";

/** Qwen3.5-0.8B's hyper-parameters (llm.md §3.4 / §3.4.x; HF names). */
export const QWEN35_0_8B = {
  hidden_size: 1024,
  num_hidden_layers: 24,
  full_attention_interval: 4,
  num_attention_heads: 8,
  num_key_value_heads: 2,
  head_dim: 256,
  partial_rotary_dims: 64,
  mrope_section: [11, 11, 10, 0],
  intermediate_size: 3584,
  linear_num_key_heads: 16,
  linear_num_value_heads: 16,
  linear_key_head_dim: 128,
  linear_value_head_dim: 128,
  linear_conv_kernel_dim: 4,
  vocab_size: 248320,
  rope_theta: 1e7,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 262144,
} as const;

/** f32 values U(−a, a) as bytes, from the xorshift bytes of ./model.ts. */
function randomF32(n: number, a: number, seed: number): Uint8Array {
  const bits = new Uint8Array(n * 4);
  randomBytes(bits, seed);
  const u = new Uint32Array(bits.buffer);
  const f = Float32Array.from(u, (v) => ((v / 4294967296) * 2 - 1) * a);
  return new Uint8Array(f.buffer);
}

/** f32 values as bytes. */
function f32(values: readonly number[]): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

/**
 * The path of the Qwen3.5-0.8B-shaped Q4_0 model, building it first when absent.
 * @returns the path, or null when the tokenizer source file is absent (the suite then skips the row)
 */
export function qwen35BenchModel(): string | null {
  const quant = "Q4_0";
  const name = `qwen35-0.8b-shapes-random-${quant}`;
  const path = join(BENCH_DIR, `${name}.gguf`);
  if (existsSync(path) && statSync(path).size > 0) return path;
  if (!existsSync(TOKENIZER_SOURCE)) return null;
  mkdirSync(BENCH_DIR, { recursive: true });
  const c = QWEN35_0_8B;
  const a = "qwen35";
  const src = openGguf(TOKENIZER_SOURCE);
  try {
    const tokens = src.metadata.getArray("tokenizer.ggml.tokens");
    const types = src.metadata.getArray("tokenizer.ggml.token_type");
    if (tokens === undefined || types === undefined || tokens.length > c.vocab_size) return null;
    const tokenList: string[] = [];
    const typeList: number[] = [];
    for (let i = 0; i < c.vocab_size; i++) {
      tokenList.push(i < tokens.length ? String(tokens.get(i)) : `[PAD${i}]`);
      typeList.push(i < types.length ? Number(types.get(i)) : 5);
    }
    const vi = c.linear_num_value_heads;
    const meta: GgufKvInput[] = [
      ggufKv("general.architecture", "str", a),
      ggufKv("general.type", "str", "model"),
      ggufKv("general.name", "str", name),
      ggufKv(
        "general.description",
        "str",
        "random weights with Qwen3.5-0.8B's shapes, for bun run bench llm",
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
      ggufKv(`${a}.rope.dimension_count`, "u32", c.partial_rotary_dims),
      ggufKv(`${a}.rope.dimension_sections`, "arr", GgufArray.of("i32", c.mrope_section)),
      ggufKv(`${a}.ssm.conv_kernel`, "u32", c.linear_conv_kernel_dim),
      ggufKv(`${a}.ssm.state_size`, "u32", c.linear_key_head_dim),
      ggufKv(`${a}.ssm.group_count`, "u32", c.linear_num_key_heads),
      ggufKv(`${a}.ssm.time_step_rank`, "u32", vi),
      ggufKv(`${a}.ssm.inner_size`, "u32", vi * c.linear_value_head_dim),
      ggufKv(`${a}.full_attention_interval`, "u32", c.full_attention_interval),
      ...[...src.metadata.entries.values()]
        .filter((kv) => kv.key.startsWith("tokenizer.") && kv.key !== "tokenizer.ggml.pre")
        .map((kv) =>
          kv.key === "tokenizer.ggml.tokens"
            ? ggufKv(kv.key, "arr", GgufArray.of("str", tokenList))
            : kv.key === "tokenizer.ggml.token_type"
              ? ggufKv(kv.key, "arr", GgufArray.of("i32", typeList))
              : kv,
        ),
      ggufKv("tokenizer.ggml.pre", "str", "qwen35"),
    ];
    const h = c.hidden_size;
    const q = c.num_attention_heads * c.head_dim;
    const kv = c.num_key_value_heads * c.head_dim;
    const dv = vi * c.linear_value_head_dim;
    const conv = 2 * c.linear_num_key_heads * c.linear_key_head_dim + dv;
    const { mat, vec, nextSeed } = benchTensors(quant, 11);
    const tensors: GgufTensorInput[] = [
      mat("token_embd.weight", c.vocab_size, h),
      vec("output_norm.weight", h),
    ];
    for (let i = 0; i < c.num_hidden_layers; i++) {
      const b = `blk.${i}`;
      tensors.push(vec(`${b}.attn_norm.weight`, h), vec(`${b}.post_attention_norm.weight`, h));
      if ((i + 1) % c.full_attention_interval === 0) {
        tensors.push(
          mat(`${b}.attn_q.weight`, 2 * q, h), // per head: the query rows, then the gate rows
          mat(`${b}.attn_k.weight`, kv, h),
          mat(`${b}.attn_v.weight`, kv, h),
          mat(`${b}.attn_output.weight`, h, q),
          vec(`${b}.attn_q_norm.weight`, c.head_dim),
          vec(`${b}.attn_k_norm.weight`, c.head_dim),
        );
      } else {
        tensors.push(
          mat(`${b}.attn_qkv.weight`, conv, h),
          mat(`${b}.attn_gate.weight`, dv, h),
          mat(`${b}.ssm_beta.weight`, vi, h),
          mat(`${b}.ssm_alpha.weight`, vi, h),
          {
            name: `${b}.ssm_conv1d.weight`,
            type: "F32",
            shape: [conv, c.linear_conv_kernel_dim],
            data: randomF32(conv * c.linear_conv_kernel_dim, 0.5, nextSeed()),
          },
          { name: `${b}.ssm_dt.bias`, type: "F32", shape: [vi], data: f32(new Array(vi).fill(0)) },
          {
            name: `${b}.ssm_a`,
            type: "F32",
            shape: [vi],
            data: f32(Array.from({ length: vi }, (_, j) => -(1 + (15 * j) / (vi - 1)))),
          },
          vec(`${b}.ssm_norm.weight`, c.linear_value_head_dim),
          mat(`${b}.ssm_out.weight`, h, dv),
        );
      }
      tensors.push(
        mat(`${b}.ffn_gate.weight`, c.intermediate_size, h),
        mat(`${b}.ffn_up.weight`, c.intermediate_size, h),
        mat(`${b}.ffn_down.weight`, h, c.intermediate_size),
      );
    }
    writeGguf(path, meta, tensors);
  } finally {
    src.close();
  }
  return path;
}

/**
 * f32 bytes of the per-sequence state of the Qwen3.5-0.8B-shaped model for `tokens` positions, as
 * ours holds it (llm.md §3.4 "State per sequence"): the KV cache of the 6 full-attention layers
 * (`tokens` rows each), plus the 18 GDN layers' recurrent state (n_v × d_k × d_v) and conv state
 * (C × (K − 1)), which do not grow with `tokens`.
 */
export function qwen35BenchStateBytes(tokens: number): number {
  const c = QWEN35_0_8B;
  const full = Math.floor(c.num_hidden_layers / c.full_attention_interval);
  const linear = c.num_hidden_layers - full;
  const conv =
    2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim;
  const recurrent = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  return (
    4 *
    (2 * full * c.num_key_value_heads * c.head_dim * tokens +
      linear * (recurrent + conv * (c.linear_conv_kernel_dim - 1)))
  );
}
