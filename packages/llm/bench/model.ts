/**
 * The benchmark model: random weights with Qwen3-0.6B's shapes (hidden 1024, 28 layers, 16 query / 8
 * key-value heads of head_dim 128, ffn 3072, vocab 151,936, tied output, rope_theta 1e6, rms eps 1e-6;
 * Qwen/Qwen3-0.6B config.json) as a GGUF in Q8_0 or Q4_0, written with @tp/formats' GGUF writer and
 * llama.cpp's tensor names (llm.md §3.1). The tokenizer metadata is copied from
 * ../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf (the real Qwen3 vocabulary and template).
 *
 * The blocks are random bytes with valid f16 scales (Q8_0: d ≈ 2.7e-4 so weights have std ≈ 0.02;
 * Q4_0: d ≈ 4.3e-3, same std): the weights are random anyway, and writing blocks directly takes seconds
 * where quantizing 600 M floats would take minutes. Block layouts: llm.md §2.2 (Q8_0: f16 d + 32 × i8;
 * Q4_0: f16 d + 16 bytes of nibbles, value = d · (q − 8)). Files are cached by name under
 * `$TMPDIR/tensorpencil-bench/` and built once.
 */
import { existsSync, mkdirSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { type GgufKvInput, type GgufTensorInput, ggufKv, openGguf, writeGguf } from "@tp/formats";

/** Qwen3-0.6B's hyper-parameters (Qwen/Qwen3-0.6B config.json). */
export const QWEN3_0_6B = {
  hidden_size: 1024,
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  intermediate_size: 3072,
  vocab_size: 151936,
  rope_theta: 1e6,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 40960,
} as const;

/** The file the tokenizer metadata is copied from. */
export const TOKENIZER_SOURCE = resolve(
  import.meta.dir,
  "../../../../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf",
);

/** Where the benchmark models are cached. */
export const BENCH_DIR = join(process.env.TP_BENCH_DIR ?? tmpdir(), "tensorpencil-bench");

/** Block formats of the benchmark model. */
export type BenchQuant = "Q8_0" | "Q4_0";

export const BLOCK = { Q8_0: { bytes: 34, std: 73.3 }, Q4_0: { bytes: 18, std: 4.61 } } as const;
/** ggml `general.file_type` (LLAMA_FTYPE_MOSTLY_Q8_0 = 7, _Q4_0 = 2). */
export const FILE_TYPE = { Q8_0: 7, Q4_0: 2 } as const;

/** xorshift32 filling `out` (byteOffset and byteLength multiples of 4) with random bytes (fast, seeded; quality is irrelevant here). */
export function randomBytes(out: Uint8Array, seed: number): void {
  const words = new Uint32Array(out.buffer, out.byteOffset, out.byteLength >>> 2);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x >>> 0;
  }
}

/** A [rows, cols] block-quantized matrix of random blocks whose weights have std ≈ 0.02. */
export function randomMatrix(quant: BenchQuant, rows: number, cols: number, seed: number): Uint8Array {
  const { bytes, std } = BLOCK[quant];
  const nBlocks = (rows * cols) / 32;
  const data = new Uint8Array(Math.ceil((nBlocks * bytes) / 4) * 4);
  randomBytes(data, seed);
  // f16 scales: a few values around 0.02 / std(q), so blocks differ
  const scales = new Uint16Array(
    new Float16Array([0.75, 0.9, 1.0, 1.1, 1.25].map((f) => (f * 0.02) / std)).buffer,
  );
  for (let b = 0; b < nBlocks; b++) {
    const s = scales[b % scales.length] as number;
    data[b * bytes] = s & 0xff;
    data[b * bytes + 1] = s >>> 8;
  }
  return data.subarray(0, nBlocks * bytes);
}

/** An f32 vector of ones (RMSNorm gains). */
export function ones(n: number): Uint8Array {
  return new Uint8Array(new Float32Array(n).fill(1).buffer);
}

/**
 * The tensor makers of a bench model writer: `mat(name, rows, cols)` and `tensor(name, shape)` are
 * random `quant` matrices (rows = the product of the leading dims; each call the next seed from
 * `seed`), `vec(name, n)` an f32 vector of ones (norm gains); `nextSeed()` the next seed (as the
 * matrices take them) for the writer's other random tensors.
 */
export function benchTensors(
  quant: BenchQuant,
  seed: number,
): {
  mat: (name: string, rows: number, cols: number) => GgufTensorInput;
  tensor: (name: string, shape: number[]) => GgufTensorInput;
  vec: (name: string, n: number) => GgufTensorInput;
  nextSeed: () => number;
} {
  let next = seed;
  const nextSeed = () => next++ * 2654435761;
  const tensor = (name: string, shape: number[]): GgufTensorInput => {
    const cols = shape[shape.length - 1] as number;
    const rows = shape.slice(0, -1).reduce((x, y) => x * y, 1);
    return { name, type: quant, shape, data: randomMatrix(quant, rows, cols, nextSeed()) };
  };
  return {
    mat: (name, rows, cols) => tensor(name, [rows, cols]),
    tensor,
    vec: (name, n) => ({ name, type: "F32", shape: [n], data: ones(n) }),
    nextSeed,
  };
}

/**
 * The path of the benchmark model in `quant`, building it first when absent.
 * @returns the path, or null when the tokenizer source file is absent (the suite then skips)
 */
export function benchModel(quant: BenchQuant): string | null {
  const path = join(BENCH_DIR, `qwen3-0.6b-shapes-random-${quant}.gguf`);
  if (existsSync(path) && statSync(path).size > 0) return path;
  if (!existsSync(TOKENIZER_SOURCE)) return null;
  mkdirSync(BENCH_DIR, { recursive: true });
  const c = QWEN3_0_6B;
  const src = openGguf(TOKENIZER_SOURCE);
  try {
    const meta: GgufKvInput[] = [
      ggufKv("general.architecture", "str", "qwen3"),
      ggufKv("general.type", "str", "model"),
      ggufKv("general.name", "str", `qwen3-0.6b-shapes-random-${quant}`),
      ggufKv("general.description", "str", "random weights with Qwen3-0.6B's shapes, for bun run bench llm"),
      ggufKv("general.file_type", "u32", FILE_TYPE[quant]),
      ggufKv("general.quantization_version", "u32", 2),
      ggufKv("qwen3.context_length", "u32", c.max_position_embeddings),
      ggufKv("qwen3.embedding_length", "u32", c.hidden_size),
      ggufKv("qwen3.block_count", "u32", c.num_hidden_layers),
      ggufKv("qwen3.feed_forward_length", "u32", c.intermediate_size),
      ggufKv("qwen3.attention.head_count", "u32", c.num_attention_heads),
      ggufKv("qwen3.attention.head_count_kv", "u32", c.num_key_value_heads),
      ggufKv("qwen3.rope.freq_base", "f32", c.rope_theta),
      ggufKv("qwen3.attention.layer_norm_rms_epsilon", "f32", c.rms_norm_eps),
      ggufKv("qwen3.attention.key_length", "u32", c.head_dim),
      ggufKv("qwen3.attention.value_length", "u32", c.head_dim),
      ...[...src.metadata.entries.values()].filter((kv) => kv.key.startsWith("tokenizer.")),
    ];
    const h = c.hidden_size;
    const q = c.num_attention_heads * c.head_dim;
    const kv = c.num_key_value_heads * c.head_dim;
    const { mat, vec } = benchTensors(quant, 1);
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
        vec(`${b}.ffn_norm.weight`, h),
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

/** KV cache bytes of the benchmark model for `tokens` positions at `bytesPerElement` (f32: 4, f16: 2). */
export function benchKvBytes(tokens: number, bytesPerElement: number): number {
  const c = QWEN3_0_6B;
  return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * bytesPerElement * tokens;
}
