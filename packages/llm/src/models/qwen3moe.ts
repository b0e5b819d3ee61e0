/**
 * Qwen3 MoE (GGUF `qwen3moe`; HF `Qwen3MoeForCausalLM`): Qwen3's attention block (QK-norm, NeoX RoPE,
 * head_dim from the metadata) with every layer's MLP a routed mixture of experts — no dense layers
 * and no shared expert (llm.md §3.2).
 *
 * Forward (llm.md §3.1–3.2; transformers `models/qwen3_moe/modeling_qwen3_moe.py`; llama.cpp
 * `src/models/qwen3moe.cpp`):
 *   h = embed_tokens(input_ids)
 *   per block:  h = h + Qwen3Attention(RMSNorm(h, input_layernorm))             # as qwen3.ts
 *               f = RMSNorm(h, post_attention_layernorm)
 *               p = softmax(mlp.gate · f);  E = top-k(p);  w_e = p_e / Σ_E p     # k = num_experts_per_tok
 *               h = h + Σ_{e∈E} w_e · down_e(silu(gate_e(f)) ⊙ up_e(f))          # models/moe.ts
 *   logits = lm_head(RMSNorm(h, norm))
 *
 * The experts are GGUF's stacked 3-D tensors (`blk.N.ffn_{gate,up,down}_exps`, [n_expert, F, H] /
 * [n_expert, H, F]) read in place by `backend.matmulId`; a safetensors checkpoint keeps each expert as its
 * own tensors (`mlp.experts.{e}.gate_proj.weight`), copied once at load into the same stacks
 * (checkpoint.ts `WeightReader.experts`). This file holds only what differs from
 * Qwen3 (qwen3.ts): the MoE arguments, the MoE weights, and the MLP of the block.
 */
import type { GgufMetadata } from "@tp/formats";
import { type Tensor, TpError } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import { ggufArgs, hfArgs } from "./args.ts";
import { type CheckpointReader, WeightReader } from "./checkpoint.ts";
import type { Architecture } from "./language-model.ts";
import { type LlamaWeights, readLlamaFamilyWeights } from "./llama.ts";
import { type MoeArgs, type MoeWeights, readMoe, sparseMoe } from "./moe.ts";
import { type Qwen3AttentionWeights, Qwen3Model, readQwen3Attention } from "./qwen3.ts";

// ---------------------------------------------------------------------------------------------------
// Arguments: Qwen3's, plus the experts

/** The configuration of a Qwen3-MoE model: Qwen3's and the MoE arguments (transformers `Qwen3MoeConfig` names). */
export type Qwen3MoeConfig = LlmConfig & MoeArgs;

/** A positive integer key of the GGUF metadata. @throws TpError E_FORMAT naming the key */
function positiveKey(meta: GgufMetadata, key: string, file: string): number {
  const v = meta.getInt(key);
  if (v === undefined) throw new TpError("E_FORMAT", `missing metadata key '${key}'`, { file });
  if (!Number.isSafeInteger(v) || v < 1)
    throw new TpError("E_FORMAT", `'${key}' must be a positive integer, got ${v}`, { file });
  return v;
}

/**
 * Qwen3MoeConfig of a GGUF `qwen3moe` file: the llama-family keys (models/args.ts) with NeoX RoPE, and
 * `qwen3moe.expert_count`, `expert_used_count` (≤ expert_count) and `expert_feed_forward_length`;
 * norm_topk_prob is true (llama.cpp hard-codes the renormalisation for this architecture).
 * @throws TpError E_FORMAT for a missing or bad key; E_UNSUPPORTED (RoPE scaling)
 */
export function qwen3moeArgsFromGguf(meta: GgufMetadata, r: CheckpointReader): Qwen3MoeConfig {
  const file = r.source.path;
  const base = ggufArgs(meta, r, { architecture: "qwen3moe", rope_mode: "neox" });
  const experts = positiveKey(meta, "qwen3moe.expert_count", file);
  const used = positiveKey(meta, "qwen3moe.expert_used_count", file);
  if (used > experts) {
    throw new TpError(
      "E_FORMAT",
      `'qwen3moe.expert_used_count' ${used} is more than 'qwen3moe.expert_count' ${experts}`,
      { file },
    );
  }
  return {
    ...base,
    num_experts: experts,
    num_experts_per_tok: used,
    moe_intermediate_size: positiveKey(meta, "qwen3moe.expert_feed_forward_length", file),
    norm_topk_prob: true,
  };
}

/** A positive integer of config.json. @throws TpError E_FORMAT naming the field */
function positiveField(json: Readonly<Record<string, unknown>>, key: string, file: string): number {
  const v = json[key];
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1)
    throw new TpError(
      "E_FORMAT",
      `config.json '${key}' must be a positive integer, got ${JSON.stringify(v)}`,
      {
        file,
      },
    );
  return v;
}

/**
 * Qwen3MoeConfig of a Hugging Face config.json (transformers `Qwen3MoeConfig`): Qwen3's fields
 * (models/args.ts hfArgs) and `num_experts`, `num_experts_per_tok` (≤ num_experts),
 * `moe_intermediate_size`, `norm_topk_prob` (transformers' default: false). The experts are read from
 * their own tensors (`mlp.experts.{e}.{gate,up,down}_proj.weight`) into stacks at load
 * (checkpoint.ts WeightReader.experts).
 * @throws TpError E_FORMAT for a missing or bad field; E_UNSUPPORTED for dense layers among the MoE ones
 *   (`decoder_sparse_step` ≠ 1 or `mlp_only_layers`) and what hfArgs refuses
 */
export function qwen3moeArgsFromHf(
  json: Readonly<Record<string, unknown>>,
  r: CheckpointReader,
  file: string,
): Qwen3MoeConfig {
  const step = json.decoder_sparse_step ?? 1;
  const dense = json.mlp_only_layers ?? [];
  if (step !== 1 || !Array.isArray(dense) || dense.length > 0) {
    throw new TpError(
      "E_UNSUPPORTED",
      `qwen3_moe with dense MLP layers (decoder_sparse_step ${JSON.stringify(step)}, mlp_only_layers ${JSON.stringify(dense)}) is not implemented; every layer must be a mixture of experts`,
      { file },
    );
  }
  const base = hfArgs(json, r, { architecture: "qwen3moe", rope_mode: "neox" }, file);
  const experts = positiveField(json, "num_experts", file);
  const used = positiveField(json, "num_experts_per_tok", file);
  if (used > experts) {
    throw new TpError(
      "E_FORMAT",
      `config.json 'num_experts_per_tok' ${used} is more than 'num_experts' ${experts}`,
      {
        file,
      },
    );
  }
  const norm = json.norm_topk_prob ?? false;
  if (typeof norm !== "boolean")
    throw new TpError(
      "E_FORMAT",
      `config.json 'norm_topk_prob' must be a boolean, got ${JSON.stringify(norm)}`,
      {
        file,
      },
    );
  return {
    ...base,
    num_experts: experts,
    num_experts_per_tok: used,
    moe_intermediate_size: positiveField(json, "moe_intermediate_size", file),
    norm_topk_prob: norm,
  };
}

/** True when `c` carries the MoE arguments (a config of {@link qwen3moeArgsFromGguf}). */
function isQwen3MoeConfig(c: LlmConfig): c is Qwen3MoeConfig {
  const m = c as Partial<MoeArgs>;
  return (
    Number.isSafeInteger(m.num_experts) &&
    Number.isSafeInteger(m.num_experts_per_tok) &&
    Number.isSafeInteger(m.moe_intermediate_size) &&
    typeof m.norm_topk_prob === "boolean"
  );
}

// ---------------------------------------------------------------------------------------------------
// Weights: Qwen3's attention, a mixture of experts for the MLP

/** All weights of a Qwen3-MoE model. */
export type Qwen3MoeWeights = LlamaWeights<Qwen3AttentionWeights, MoeWeights>;

/**
 * Every weight of a Qwen3-MoE model by HF names (the GGUF names through @tp/formats GGUF_HF_NAMES).
 * @throws TpError E_FORMAT naming file and tensor; E_UNSUPPORTED for biases or a format the backend cannot run
 */
export function readQwen3MoeWeights(w: WeightReader, c: Qwen3MoeConfig): Qwen3MoeWeights {
  return readLlamaFamilyWeights(
    w,
    c,
    (i) => readQwen3Attention(w, c, i),
    (i) => readMoe(w, `model.layers.${i}.mlp.`, c.hidden_size, c),
  );
}

// ---------------------------------------------------------------------------------------------------
// Forward

/** Qwen3-MoE: Qwen3's attention, block and model loop; the MLP is the sparse MoE of models/moe.ts. */
export class Qwen3MoeModel extends Qwen3Model<MoeWeights> {
  readonly moe: MoeArgs;

  constructor(backend: Qwen3Model["backend"], config: Qwen3MoeConfig, weights: Qwen3MoeWeights) {
    super(backend, config, weights);
    this.moe = {
      num_experts: config.num_experts,
      num_experts_per_tok: config.num_experts_per_tok,
      moe_intermediate_size: config.moe_intermediate_size,
      norm_topk_prob: config.norm_topk_prob,
    };
  }

  /** MLP of block i: x [n, H] (normed) → [n, H], the routed experts. */
  override mlp(i: number, x: Tensor): Tensor {
    const w = this.weights.layers[i]?.mlp as MoeWeights;
    return sparseMoe(this.backend, w, x, this.moe);
  }
}

/** The `qwen3moe` architecture: Qwen3 attention, a routed mixture of experts in every layer. */
export const qwen3moe: Architecture = {
  name: "qwen3moe",
  description: "Qwen 3 mixture of experts (Qwen3-30B-A3B, Qwen3-235B-A22B; GGUF and safetensors)",
  configFromGguf: qwen3moeArgsFromGguf,
  configFromHf: qwen3moeArgsFromHf,
  create(backend, config, r) {
    if (!isQwen3MoeConfig(config)) {
      throw new TpError(
        "E_ARG",
        "qwen3moe: the config lacks num_experts / num_experts_per_tok / moe_intermediate_size / norm_topk_prob (read it with configFromGguf or configFromHf)",
        { file: r.source.path },
      );
    }
    const weights = backend.persist(
      backend.scope(() => readQwen3MoeWeights(new WeightReader(backend, r), config)),
    );
    return new Qwen3MoeModel(backend, config, weights);
  },
};
