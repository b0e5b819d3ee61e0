/**
 * Qwen3 dense (GGUF `qwen3`; HF `Qwen3ForCausalLM`): Llama's block plus QK-norm — a per-head RMSNorm
 * of q and k (one [head_dim] scale shared by all heads) before RoPE — with head_dim from the
 * metadata (`qwen3.attention.key_length`, config.json `head_dim`; 128 in every Qwen3, ≠ hidden /
 * heads for the 0.6B and 4B), NeoX rotate-half RoPE in GGUF and HF alike (llama.cpp
 * `LLAMA_ROPE_TYPE_NEOX`), no biases, and usually a tied head.
 *
 * Forward (llm.md §3.1; transformers `models/qwen3/modeling_qwen3.py`; llama.cpp `src/models/qwen3.cpp`):
 *   h = embed_tokens(input_ids)
 *   per block:  a = RMSNorm(h, input_layernorm)
 *               q, k, v = q_proj(a), k_proj(a), v_proj(a)                  # [n, heads, hd]
 *               q, k = RMSNorm_head(q, q_norm), RMSNorm_head(k, k_norm)     # QK-norm BEFORE rope
 *               q, k = RoPE_neox(q), RoPE_neox(k)
 *               h = h + o_proj(Attention(q, K, V, scale 1/√hd, causal, GQA))
 *               h = h + down_proj(silu(gate_proj(m)) ⊙ up_proj(m)),  m = RMSNorm(h, post_attention_layernorm)
 *   logits = lm_head(RMSNorm(h, norm))
 *
 * This file holds what differs from Llama (models/llama.ts) — RoPE layout, `self_attn.q_norm` /
 * `k_norm`, the attention with QK-norm — and takes the arguments' keys, the other weight names, the
 * block and the model loop from it, as transformers' `modular_qwen3.py` derives Qwen3 from Llama.
 */
import type { GgufMetadata } from "@tp/formats";
import type { Tensor } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import { ggufArgs, hfArgs } from "./args.ts";
import { type CheckpointReader, WeightReader } from "./checkpoint.ts";
import type { Architecture } from "./language-model.ts";
import { attend, type ForwardPass, type SwiGluWeights } from "./layers.ts";
import {
  type LlamaAttentionWeights,
  type LlamaLayerWeights,
  LlamaModel,
  type LlamaWeights,
  readLlamaAttention,
  readLlamaFamilyWeights,
} from "./llama.ts";

// ---------------------------------------------------------------------------------------------------
// Arguments: the llama-family keys of models/args.ts, NeoX RoPE in every container

/** LlmConfig of a GGUF `qwen3` file. @throws TpError E_FORMAT, E_UNSUPPORTED (RoPE scaling) */
export function qwen3ArgsFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig {
  return ggufArgs(meta, r, { architecture: "qwen3", rope_mode: "neox" });
}

/** LlmConfig of an HF `qwen3` config.json. @throws TpError E_FORMAT, E_UNSUPPORTED (rope_scaling, biases) */
export function qwen3ArgsFromHf(json: Readonly<Record<string, unknown>>, r: CheckpointReader, file: string) {
  return hfArgs(json, r, { architecture: "qwen3", rope_mode: "neox" }, file);
}

// ---------------------------------------------------------------------------------------------------
// Weights: Llama's, plus QK-norm

/** `model.layers.{i}.self_attn.*`: Llama's projections and the QK-norm scales. */
export interface Qwen3AttentionWeights extends LlamaAttentionWeights {
  /** f32 [head_dim], shared by all query heads */
  readonly q_norm: Tensor;
  /** f32 [head_dim], shared by all KV heads */
  readonly k_norm: Tensor;
}

/** All weights of a Qwen3 model. */
export type Qwen3Weights = LlamaWeights<Qwen3AttentionWeights>;

/** Block i's `self_attn`: Llama's projections and the QK-norm scales. */
export function readQwen3Attention(w: WeightReader, c: LlmConfig, i: number): Qwen3AttentionWeights {
  return {
    ...readLlamaAttention(w, c, i),
    q_norm: w.norm(`model.layers.${i}.self_attn.q_norm.weight`, c.head_dim),
    k_norm: w.norm(`model.layers.${i}.self_attn.k_norm.weight`, c.head_dim),
  };
}

/**
 * Every weight of a Qwen3 model by HF names (through `w`'s checkpoint reader).
 * @throws TpError E_FORMAT naming file and tensor; E_UNSUPPORTED for biases or a format the backend cannot run
 */
export function readQwen3Weights(w: WeightReader, c: LlmConfig): Qwen3Weights {
  return readLlamaFamilyWeights(w, c, (i) => readQwen3Attention(w, c, i));
}

// ---------------------------------------------------------------------------------------------------
// Forward

/**
 * Qwen3: input_ids → logits (or hidden states), see the module comment. Block and model are Llama's
 * ({@link LlamaModel.block}, {@link LlamaModel.forward}); the attention adds QK-norm.
 */
export class Qwen3Model<M = SwiGluWeights> extends LlamaModel<Qwen3AttentionWeights, M> {
  /** Attention of block i: x [n, H] (normed) → [n, H]; QK-norm over head_dim, then RoPE. */
  override attention(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = (this.weights.layers[i] as LlamaLayerWeights<Qwen3AttentionWeights, M>).self_attn;
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = this.config;
    const q = b.matmul(x, w.q_proj).reshape(1, f.n, nh, hd); // [1, n, n_head, hd]
    const k = b.matmul(x, w.k_proj).reshape(1, f.n, kvh, hd); // [1, n, n_kv, hd]
    const v = b.matmul(x, w.v_proj).reshape(1, f.n, kvh, hd); // [1, n, n_kv, hd]
    const qr = b.rope(b.rmsNorm(q, w.q_norm, this.norm), f.positions, this.rope); // QK-norm, then RoPE
    const kr = b.rope(b.rmsNorm(k, w.k_norm, this.norm), f.positions, this.rope);
    return b.matmul(attend(b, f, i, qr, kr, v, this.scale), w.o_proj); // [n, n_head·hd] → [n, H]
  }
}

/** The `qwen3` architecture: NeoX RoPE, QK-norm, head_dim from the metadata. */
export const qwen3: Architecture = {
  name: "qwen3",
  description: "Qwen 3 dense (QK-norm, head_dim from metadata, tied or untied head)",
  configFromGguf: qwen3ArgsFromGguf,
  configFromHf: qwen3ArgsFromHf,
  create(backend, config, r) {
    const weights = backend.persist(
      backend.scope(() => readQwen3Weights(new WeightReader(backend, r), config)),
    );
    return new Qwen3Model(backend, config, weights);
  },
};
