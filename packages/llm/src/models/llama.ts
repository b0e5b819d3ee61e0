/**
 * Llama (GGUF `llama`; HF `LlamaForCausalLM`): pre-norm decoder blocks with grouped-query attention,
 * RoPE and a SwiGLU MLP; untied (`output.weight` / `lm_head.weight`) or tied output head.
 *
 * RoPE layout is the file's: Hugging Face stores q/k rows for NeoX "rotate-half" RoPE; llama.cpp's
 * converter (`convert_hf_to_gguf.py` `LlamaModel.permute`: rows of each head reshaped
 * `(2, hd/2) → (hd/2, 2)`) reorders them into Meta's original interleaved-pair layout, and
 * llama.cpp runs the `llama` architecture with `LLAMA_ROPE_TYPE_NORM` (pairs (2i, 2i+1)); llama2.c
 * conversions (`tensor_data_layout = "Meta AI original pth"`) are in that layout already. So a GGUF
 * file uses `rope_mode: "interleaved"` on its rows as stored, and an HF checkpoint `"neox"` — both
 * compute the same function (llm.md §3.0; llama.cpp `src/llama-model.cpp` `llama_model_rope_type`).
 *
 * Forward (transformers `models/llama/modeling_llama.py`; llama.cpp `src/models/llama.cpp`):
 *   h = embed_tokens(input_ids)
 *   per block:  a = RMSNorm(h, input_layernorm)
 *               q, k, v = q_proj(a), k_proj(a), v_proj(a);  q, k = RoPE(q), RoPE(k)
 *               h = h + o_proj(Attention(q, K, V, scale 1/√hd, causal, GQA))
 *               h = h + down_proj(silu(gate_proj(m)) ⊙ up_proj(m)),  m = RMSNorm(h, post_attention_layernorm)
 *   logits = lm_head(RMSNorm(h, norm))
 *
 * The layout of this file — arguments, weights by checkpoint names, then attention, MLP, block and
 * model — follows ml-explore/mlx-lm `mlx_lm/models/llama.py`.
 */
import type { GgufMetadata } from "@tp/formats";
import type { Backend, RopeOptions, Tensor, Weight } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import { ggufArgs, hfArgs } from "./args.ts";
import { type CheckpointReader, WeightReader } from "./checkpoint.ts";
import type { Architecture, DecoderModel } from "./language-model.ts";
import { attend, type ForwardPass, ropeOptions, type SwiGluWeights, swiglu } from "./layers.ts";

// ---------------------------------------------------------------------------------------------------
// Arguments: the llama-family keys of models/args.ts; RoPE layout by container (see the module comment)

/** LlmConfig of a GGUF `llama` file. @throws TpError E_FORMAT, E_UNSUPPORTED (RoPE scaling) */
export function llamaArgsFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig {
  return ggufArgs(meta, r, { architecture: "llama", rope_mode: "interleaved" });
}

/** LlmConfig of an HF `llama` config.json. @throws TpError E_FORMAT, E_UNSUPPORTED (rope_scaling, biases) */
export function llamaArgsFromHf(json: Readonly<Record<string, unknown>>, r: CheckpointReader, file: string) {
  return hfArgs(json, r, { architecture: "llama", rope_mode: "neox" }, file);
}

// ---------------------------------------------------------------------------------------------------
// Weights, by checkpoint names (`model.layers.{i}.self_attn.q_proj.weight`, …)

/** `model.layers.{i}.self_attn.*` */
export interface LlamaAttentionWeights {
  /** [num_attention_heads·head_dim, hidden_size] */
  readonly q_proj: Weight;
  /** [num_key_value_heads·head_dim, hidden_size] */
  readonly k_proj: Weight;
  /** [num_key_value_heads·head_dim, hidden_size] */
  readonly v_proj: Weight;
  /** [hidden_size, num_attention_heads·head_dim] */
  readonly o_proj: Weight;
}

/** `model.layers.{i}.*`; M: the MLP's weights (a mixture of experts in qwen3moe.ts). */
export interface LlamaLayerWeights<
  A extends LlamaAttentionWeights = LlamaAttentionWeights,
  M = SwiGluWeights,
> {
  /** f32 [hidden_size] */
  readonly input_layernorm: Tensor;
  readonly self_attn: A;
  /** f32 [hidden_size]: the pre-MLP norm (GGUF `ffn_norm`). */
  readonly post_attention_layernorm: Tensor;
  readonly mlp: M;
}

/** All weights of a Llama-family model. */
export interface LlamaWeights<A extends LlamaAttentionWeights = LlamaAttentionWeights, M = SwiGluWeights> {
  /** [vocab_size, hidden_size] */
  readonly embed_tokens: Weight;
  readonly layers: readonly LlamaLayerWeights<A, M>[];
  /** f32 [hidden_size]: the final norm. */
  readonly norm: Tensor;
  /** [vocab_size, hidden_size]; the embedding itself when tied (llm.md §3.0 "LM head"). */
  readonly lm_head: Weight;
}

/** Block i's projections `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` (biases refused). */
export function readLlamaAttention(w: WeightReader, c: LlmConfig, i: number): LlamaAttentionWeights {
  const p = `model.layers.${i}.self_attn.`;
  const H = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  for (const m of ["q_proj", "k_proj", "v_proj", "o_proj"]) w.noBias(`${p}${m}`, c.architecture);
  return {
    q_proj: w.linear(`${p}q_proj.weight`, [q, H]),
    k_proj: w.linear(`${p}k_proj.weight`, [kv, H]),
    v_proj: w.linear(`${p}v_proj.weight`, [kv, H]),
    o_proj: w.linear(`${p}o_proj.weight`, [H, q]),
  };
}

/** Block i's SwiGLU MLP `model.layers.{i}.mlp.{gate,up,down}_proj.weight` ([intermediate_size, hidden_size]). */
export function readLlamaMlp(w: WeightReader, c: LlmConfig, i: number): SwiGluWeights {
  const { hidden_size: H, intermediate_size: F } = c;
  const p = `model.layers.${i}.mlp.`;
  return {
    gate_proj: w.linear(`${p}gate_proj.weight`, [F, H]),
    up_proj: w.linear(`${p}up_proj.weight`, [F, H]),
    down_proj: w.linear(`${p}down_proj.weight`, [H, F]),
  };
}

/**
 * Every weight of a Llama-family model, with `attention(i)` reading block i's `self_attn` (Llama's
 * own, or an architecture's that adds to it) and `mlp(i)` its MLP (Llama's SwiGLU by default). The
 * head is the embedding when tied (sanitize: the file has no `lm_head.weight`).
 * @throws TpError E_FORMAT naming file and tensor; E_UNSUPPORTED for biases or a format the backend cannot run
 */
export function readLlamaFamilyWeights<A extends LlamaAttentionWeights, M = SwiGluWeights>(
  w: WeightReader,
  c: LlmConfig,
  attention: (i: number) => A,
  mlp: (i: number) => M = (i) => readLlamaMlp(w, c, i) as M,
): LlamaWeights<A, M> {
  const { hidden_size: H, vocab_size: V } = c;
  const layers: LlamaLayerWeights<A, M>[] = [];
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    layers.push({
      input_layernorm: w.norm(`${p}input_layernorm.weight`, H),
      self_attn: attention(i),
      post_attention_layernorm: w.norm(`${p}post_attention_layernorm.weight`, H),
      mlp: mlp(i),
    });
  }
  const embed_tokens = w.embedding("model.embed_tokens.weight", [V, H], c.tie_word_embeddings);
  return {
    embed_tokens,
    layers,
    norm: w.norm("model.norm.weight", H),
    lm_head: c.tie_word_embeddings ? embed_tokens : w.linear("lm_head.weight", [V, H]),
  };
}

// ---------------------------------------------------------------------------------------------------
// Forward

/**
 * Llama: input_ids → logits (or hidden states), see the module comment. An architecture that only
 * changes the attention (Qwen3's QK-norm) subclasses it and overrides {@link LlamaModel.attention}.
 */
export class LlamaModel<A extends LlamaAttentionWeights = LlamaAttentionWeights, M = SwiGluWeights>
  implements DecoderModel
{
  readonly backend: Backend;
  readonly config: LlmConfig;
  readonly weights: LlamaWeights<A, M>;
  /** Built once per model: these run several times per block per step. */
  protected readonly rope: RopeOptions;
  protected readonly norm: { readonly eps: number };
  /** 1/√head_dim */
  protected readonly scale: number;

  constructor(backend: Backend, config: LlmConfig, weights: LlamaWeights<A, M>) {
    this.backend = backend;
    this.config = config;
    this.weights = weights;
    this.rope = ropeOptions(config);
    this.norm = { eps: config.rms_norm_eps };
    this.scale = 1 / Math.sqrt(config.head_dim);
  }

  /** Attention of block i: x [n, H] (normed) → [n, H]. */
  attention(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = (this.weights.layers[i] as LlamaLayerWeights<A, M>).self_attn;
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = this.config;
    const q = b.rope(b.matmul(x, w.q_proj).reshape(1, f.n, nh, hd), f.positions, this.rope); // [1, n, n_head, hd]
    const k = b.rope(b.matmul(x, w.k_proj).reshape(1, f.n, kvh, hd), f.positions, this.rope); // [1, n, n_kv, hd]
    const v = b.matmul(x, w.v_proj).reshape(1, f.n, kvh, hd); // [1, n, n_kv, hd]
    return b.matmul(attend(b, f, i, q, k, v, this.scale), w.o_proj); // [n, n_head·hd] → [n, H]
  }

  /**
   * MLP of block i: x [n, H] (normed) → [n, H]; SwiGLU. A model whose M is not {@link SwiGluWeights}
   * (qwen3moe.ts: a mixture of experts) overrides it.
   */
  mlp(i: number, x: Tensor): Tensor {
    const w = this.weights.layers[i] as LlamaLayerWeights<A, M>;
    return swiglu(this.backend, w.mlp as SwiGluWeights, x);
  }

  /** Block i: x [n, H] → [n, H], two pre-norm residuals. */
  block(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = this.weights.layers[i] as LlamaLayerWeights<A, M>;
    const h = b.add(x, this.attention(i, b.rmsNorm(x, w.input_layernorm, this.norm), f));
    return b.add(h, this.mlp(i, b.rmsNorm(h, w.post_attention_layernorm, this.norm)));
  }

  /** input_ids i32 [n] → logits [rows, vocab] (see {@link DecoderModel.forward}). */
  forward(inputIds: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = this.weights;
    let h = b.embedding(w.embed_tokens, inputIds); // [n, H]
    for (let i = 0; i < f.blocks; i++) {
      const out = b.scope(() => this.block(i, h, f)); // [n, H]; the block's temporaries are freed
      h = f.next(i, h, out); // h (hidden_states[i]) kept when collected, else freed
    }
    if (f.head === null) return h;
    return b.matmul(b.rmsNorm(f.headRows(h), w.norm, this.norm), w.lm_head); // [rows, vocab]
  }
}

/** The `llama` architecture: GGUF → interleaved RoPE on the stored rows, HF → NeoX (see module comment). */
export const llama: Architecture = {
  name: "llama",
  description: "Llama (Llama 2, TinyLlama, llama2.c conversions; GQA, tied or untied head)",
  configFromGguf: llamaArgsFromGguf,
  configFromHf: llamaArgsFromHf,
  create(backend, config, r) {
    const w = new WeightReader(backend, r);
    const weights = backend.persist(
      backend.scope(() => readLlamaFamilyWeights(w, config, (i) => readLlamaAttention(w, config, i))),
    );
    return new LlamaModel(backend, config, weights);
  },
};
