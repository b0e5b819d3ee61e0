/**
 * Qwen3 dense (GGUF `qwen3`; HF `Qwen3ForCausalLM`): Llama's block plus QK-norm — a per-head RMSNorm
 * of q and k (one [head_dim] scale shared by all heads) before RoPE — with head_dim from the
 * metadata (`qwen3.attention.key_length`, config.json `head_dim`; 128 in every Qwen3, ≠ hidden /
 * heads for the 0.6B and 4B), NeoX rotate-half RoPE in GGUF and HF alike (llama.cpp
 * `LLAMA_ROPE_TYPE_NEOX`), no biases, and usually a tied head.
 *
 * Forward of one block (llm.md §3.1; transformers `models/qwen3/modeling_qwen3.py`
 * `Qwen3Attention`; llama.cpp `src/models/qwen3.cpp`):
 *   h = RMSNorm(x, input_layernorm)
 *   q, k, v = q_proj(h), k_proj(h), v_proj(h)                  # [n, heads, hd]
 *   q, k = RMSNorm_head(q, q_norm), RMSNorm_head(k, k_norm)     # QK-norm BEFORE rope
 *   q, k = RoPE_neox(q), RoPE_neox(k)
 *   x = x + o_proj(Attention(q, K, V, scale 1/√hd, causal, GQA))
 *   x = x + down_proj(silu(gate_proj(f)) ⊙ up_proj(f)),  f = RMSNorm(x, post_attention_layernorm)
 */
import type { GgufMetadata } from "@tp/formats";
import type { Backend, Tensor } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import {
  type Architecture,
  type CheckpointReader,
  createDecoder,
  DecoderLM,
  type DecoderOptions,
  type DecoderWeights,
  ggufDecoderConfig,
  hfDecoderConfig,
  type Scratch,
  type StepState,
} from "./decoder.ts";

/** Qwen3 with its KV cache (see the module comment for the forward). */
export class Qwen3ForCausalLM extends DecoderLM {
  /** Build from weights already read (`readDecoderWeights` in decoder.ts); usually via the architecture's `create`. */
  constructor(backend: Backend, config: LlmConfig, weights: DecoderWeights, options?: DecoderOptions) {
    super(backend, config, weights, options);
  }

  /** One block, x [n, H] → [n, H]; the order is the module comment's. */
  protected block(layer: number, x: Tensor, at: StepState, s: Scratch): Tensor {
    const b = this.backend;
    const w = this.weights.layers[layer] as DecoderWeights["layers"][number];
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = this.config;
    const { n } = at;
    const h = s.keep(this.norm(x, w.input_layernorm)); // [n, H]
    const q = s.keep(b.matmul(h, w.q_proj)).reshape(1, n, nh, hd); // [1, n, n_head, hd]
    const k = s.keep(b.matmul(h, w.k_proj)).reshape(1, n, kvh, hd); // [1, n, n_kv, hd]
    const v = s.keep(b.matmul(h, w.v_proj)).reshape(1, n, kvh, hd); // [1, n, n_kv, hd]
    const qr = s.keep(this.rope(s.keep(this.norm(q, w.q_norm as Tensor)), at)); // QK-norm, then RoPE
    const kr = s.keep(this.rope(s.keep(this.norm(k, w.k_norm as Tensor)), at));
    const r = s.keep(b.add(x, s.keep(this.selfAttention(layer, qr, kr, v, at, s)))); // [n, H]
    const f = s.keep(this.norm(r, w.post_attention_layernorm));
    return b.add(r, s.keep(this.mlp(layer, f, s))); // [n, H]
  }
}

/** The `qwen3` architecture: NeoX RoPE, QK-norm, head_dim from the metadata. */
export const qwen3: Architecture = {
  name: "qwen3",
  description: "Qwen 3 dense (QK-norm, head_dim from metadata, tied or untied head)",
  configFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig {
    return ggufDecoderConfig(meta, r, { architecture: "qwen3", rope_mode: "neox" });
  },
  configFromHf(json, r, file): LlmConfig {
    return hfDecoderConfig(json, r, { architecture: "qwen3", rope_mode: "neox" }, file);
  },
  create(backend, config, r, options) {
    return createDecoder(
      backend,
      config,
      r,
      { qkNorm: true },
      (w) => new Qwen3ForCausalLM(backend, config, w, options),
    );
  },
};
