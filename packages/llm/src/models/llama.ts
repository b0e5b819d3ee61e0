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
 * Forward of one block (transformers `modeling_llama.py` `LlamaDecoderLayer`; llama.cpp
 * `src/models/llama.cpp`):
 *   h = RMSNorm(x, input_layernorm)
 *   q, k, v = q_proj(h), k_proj(h), v_proj(h);  q, k = RoPE(q), RoPE(k)
 *   x = x + o_proj(Attention(q, K, V, causal, GQA))
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

/** Llama with its KV cache (see the module comment for the forward). */
export class LlamaForCausalLM extends DecoderLM {
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
    const q = s.keep(this.rope(s.keep(b.matmul(h, w.q_proj)).reshape(1, n, nh, hd), at)); // [1, n, n_head, hd]
    const k = s.keep(this.rope(s.keep(b.matmul(h, w.k_proj)).reshape(1, n, kvh, hd), at)); // [1, n, n_kv, hd]
    const v = s.keep(b.matmul(h, w.v_proj)).reshape(1, n, kvh, hd); // [1, n, n_kv, hd]
    const r = s.keep(b.add(x, s.keep(this.selfAttention(layer, q, k, v, at, s)))); // [n, H]
    const f = s.keep(this.norm(r, w.post_attention_layernorm));
    return b.add(r, s.keep(this.mlp(layer, f, s))); // [n, H]
  }
}

/** The `llama` architecture: GGUF → interleaved RoPE on the stored rows, HF → NeoX (see module comment). */
export const llama: Architecture = {
  name: "llama",
  description: "Llama (Llama 2, TinyLlama, llama2.c conversions; GQA, tied or untied head)",
  configFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig {
    return ggufDecoderConfig(meta, r, { architecture: "llama", rope_mode: "interleaved" });
  },
  configFromHf(json, r, file): LlmConfig {
    return hfDecoderConfig(json, r, { architecture: "llama", rope_mode: "neox" }, file);
  },
  create(backend, config, r, options) {
    return createDecoder(
      backend,
      config,
      r,
      { qkNorm: false },
      (w) => new LlamaForCausalLM(backend, config, w, options),
    );
  },
};
