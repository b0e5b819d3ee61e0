/**
 * An fp8 benchmark model: random weights with Qwen3-0.6B's shapes (model.ts `QWEN3_0_6B`) as a
 * Hugging Face folder — config.json, tokenizer.json, model.safetensors — whose linear weights are
 * "scaled fp8" as ComfyUI and fp8 LLM checkpoints store them (llm.md §1: `X.weight` F8_E4M3 with an f32
 * scalar sibling `X.weight_scale`, w = f8(w) · scale), the embedding (tied to the output) bf16 and the
 * norm gains bf16 ones. Used to time decoding an fp8 checkpoint (`bun packages/llm/bench/ours-worker.ts
 * DIR tg N THREADS CTX`); llama.cpp reads no fp8, so there is no peer.
 *
 * The fp8 codes are random bytes without the NaN code (S.1111.111), with a scale giving std ≈ 0.02 (the
 * codes' std is ≈ 100, over magnitudes from 2^-9 to 448); writing bytes takes seconds where quantizing
 * 440 M floats would take minutes. The tokenizer.json is rebuilt from the real Qwen3 vocabulary of
 * ../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf (tokens, merges, control tokens as added
 * tokens; Qwen2's Split regex + ByteLevel, as Qwen ships it). Cached by name under
 * `$TMPDIR/tensorpencil-bench/` and built once.
 */
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openGguf, type SafetensorsTensorInput, writeSafetensors } from "@tp/formats";
import { HF_SPLIT_PATTERNS } from "@tp/tokenizer";
import { BENCH_DIR, QWEN3_0_6B, randomBytes, TOKENIZER_SOURCE } from "./model.ts";

/** std of a uniformly random e4m3fn code without NaN (computed over the 254 finite codes). */
function codeStd(): number {
  let s2 = 0;
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if ((b & 0x7f) === 0x7f) continue;
    const e = (b >> 3) & 15;
    const m = b & 7;
    const v = (e === 0 ? m / 8 : 1 + m / 8) * 2 ** ((e === 0 ? 1 : e) - 7);
    s2 += v * v;
    n++;
  }
  return Math.sqrt(s2 / n);
}

/** n random bytes (model.ts randomBytes over a buffer rounded up to whole words). */
function randomOf(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(Math.ceil(n / 4) * 4);
  randomBytes(out, seed);
  return out.subarray(0, n);
}

/** tokenizer.json (byte-level BPE, Qwen2 pre-tokenizer) from the GGUF's tokenizer metadata. */
function tokenizerJson(): string {
  const g = openGguf(TOKENIZER_SOURCE);
  try {
    const tokens = g.metadata.getArray("tokenizer.ggml.tokens");
    const types = g.metadata.getArray("tokenizer.ggml.token_type");
    const merges = g.metadata.getArray("tokenizer.ggml.merges");
    if (!tokens || !types || !merges) throw new Error(`${TOKENIZER_SOURCE}: no tokenizer arrays`);
    const vocab: Record<string, number> = {};
    const added: { id: number; content: string; special: boolean }[] = [];
    for (let i = 0; i < tokens.length; i++) {
      const t = tokens.get(i) as string;
      if ((types.get(i) as number) === 3) added.push({ id: i, content: t, special: true });
      else vocab[t] = i;
    }
    const pattern = Object.keys(HF_SPLIT_PATTERNS).find((p) => HF_SPLIT_PATTERNS[p] === "qwen2") as string;
    return JSON.stringify({
      version: "1.0",
      added_tokens: added,
      normalizer: { type: "NFC" },
      pre_tokenizer: {
        type: "Sequence",
        pretokenizers: [
          { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
          { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
        ],
      },
      decoder: { type: "ByteLevel" },
      model: {
        type: "BPE",
        vocab,
        merges: Array.from({ length: merges.length }, (_, i) => merges.get(i) as string),
        byte_fallback: false,
      },
    });
  } finally {
    g.close();
  }
}

/**
 * The folder of the fp8 benchmark model, building it first when absent (written under a temporary
 * name, then renamed).
 * @returns the folder, or null when the tokenizer source file is absent
 */
export function fp8BenchModel(): string | null {
  const dir = join(BENCH_DIR, "qwen3-0.6b-shapes-random-fp8");
  if (existsSync(join(dir, "model.safetensors"))) return dir;
  if (!existsSync(TOKENIZER_SOURCE)) return null;
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const c = QWEN3_0_6B;
  const h = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  const scale = Float32Array.of(0.02 / codeStd());
  let seed = 1;
  const tensors: SafetensorsTensorInput[] = [];
  const fp8 = (name: string, rows: number, cols: number) => {
    const data = randomOf(rows * cols, seed++ * 2654435761);
    for (let i = 0; i < data.length; i++) if (((data[i] as number) & 0x7f) === 0x7f) data[i] = 0x38;
    tensors.push({ name: `${name}.weight`, dtype: "F8_E4M3", shape: [rows, cols], data });
    tensors.push({
      name: `${name}.weight_scale`,
      dtype: "F32",
      shape: [],
      data: new Uint8Array(scale.buffer),
    });
  };
  const ones = (name: string, n: number) =>
    tensors.push({
      name,
      dtype: "BF16",
      shape: [n],
      data: new Uint8Array(new Uint16Array(n).fill(0x3f80).buffer),
    });
  // embedding: bf16 with |w| in [2^-7, 2^-5) (high byte 0x3c / 0xbc: exponent 120 or 121 with the low byte's top bit)
  const emb = randomOf(c.vocab_size * h * 2, seed++);
  for (let i = 1; i < emb.length; i += 2) emb[i] = ((emb[i] as number) & 0x80) | 0x3c;
  tensors.push({ name: "model.embed_tokens.weight", dtype: "BF16", shape: [c.vocab_size, h], data: emb });
  ones("model.norm.weight", h);
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}`;
    ones(`${p}.input_layernorm.weight`, h);
    ones(`${p}.post_attention_layernorm.weight`, h);
    ones(`${p}.self_attn.q_norm.weight`, c.head_dim);
    ones(`${p}.self_attn.k_norm.weight`, c.head_dim);
    fp8(`${p}.self_attn.q_proj`, q, h);
    fp8(`${p}.self_attn.k_proj`, kv, h);
    fp8(`${p}.self_attn.v_proj`, kv, h);
    fp8(`${p}.self_attn.o_proj`, h, q);
    fp8(`${p}.mlp.gate_proj`, c.intermediate_size, h);
    fp8(`${p}.mlp.up_proj`, c.intermediate_size, h);
    fp8(`${p}.mlp.down_proj`, h, c.intermediate_size);
  }
  writeSafetensors(join(tmp, "model.safetensors"), tensors);
  writeFileSync(
    join(tmp, "config.json"),
    JSON.stringify({
      architectures: ["Qwen3ForCausalLM"],
      model_type: "qwen3",
      ...c,
      tie_word_embeddings: true,
      torch_dtype: "bfloat16",
      hidden_act: "silu",
      bos_token_id: 151643,
      eos_token_id: 151645,
    }),
  );
  writeFileSync(join(tmp, "tokenizer.json"), tokenizerJson());
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
  return dir;
}

if (import.meta.main) console.log(fp8BenchModel() ?? "no tokenizer source (../shared absent)");
