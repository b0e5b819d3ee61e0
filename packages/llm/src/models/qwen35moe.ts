/**
 * Qwen 3.5 / 3.6 mixture of experts (GGUF `qwen35moe`; HF `Qwen3_5MoeForConditionalGeneration`, text
 * side): the hybrid stack of qwen35.ts — Gated DeltaNet and gated full-attention layers — with every FFN
 * a routed MoE (Qwen3-MoE's, models/moe.ts) plus a shared expert scaled by a sigmoid gate.
 *
 * FFN (llm.md §3.4 "qwen35moe FFN"; transformers `Qwen3_5MoeSparseMoeBlock`; llama.cpp
 * `src/models/qwen35moe.cpp`):
 *   p = softmax(gate · f);  E = top-k(p);  w = p_E / Σ p_E
 *   y = Σ_{e∈E} w_e · down_e(silu(gate_e(f)) ⊙ up_e(f))
 *     + σ(shared_expert_gate · f) · down_s(silu(gate_s(f)) ⊙ up_s(f))
 *
 * This file holds what differs from qwen35.ts — the MoE arguments and weights and the FFN — and takes
 * the layers, the block and the model loop from it.
 */
import { type GgufMetadata, loadWeight } from "@tp/formats";
import { type Tensor, TpError, type Weight } from "@tp/tensor";
import { type CheckpointReader, tensorEntry, WeightReader } from "./checkpoint.ts";
import type { Architecture } from "./language-model.ts";
import { type SwiGluWeights, swiglu } from "./layers.ts";
import { type MoeArgs, type MoeWeights, readMoe, sparseMoe } from "./moe.ts";
import {
  type Qwen35Config,
  type Qwen35LayerWeights,
  Qwen35Model,
  qwen35ArgsFromGguf,
  qwen35ArgsFromHf,
  readQwen35Weights,
} from "./qwen35.ts";

// ---------------------------------------------------------------------------------------------------
// Arguments: qwen35's, plus the experts

/** Hyper-parameters of a Qwen 3.5 MoE text model (transformers `Qwen3_5MoeTextConfig` names). */
export interface Qwen35MoeConfig extends Qwen35Config, MoeArgs {
  /** GGUF `expert_shared_feed_forward_length` (default feed_forward_length, as llama.cpp). */
  readonly shared_expert_intermediate_size: number;
}

/**
 * Qwen35MoeConfig of a GGUF `qwen35moe` file: qwen35's keys and `expert_count`, `expert_used_count`,
 * `expert_feed_forward_length` (default feed_forward_length / expert_used_count) and
 * `expert_shared_feed_forward_length` (default feed_forward_length), the defaults of llm.md §3.4.x.
 * @throws TpError E_FORMAT for a missing or inconsistent key
 */
export function qwen35moeArgsFromGguf(meta: GgufMetadata, r: CheckpointReader): Qwen35MoeConfig {
  const file = r.source.path;
  const a = "qwen35moe";
  const base = qwen35ArgsFromGguf(meta, r, a);
  const key = (k: string, fallback?: number): number => {
    const v = meta.getInt(`${a}.${k}`) ?? fallback;
    if (v === undefined) throw new TpError("E_FORMAT", `missing metadata key '${a}.${k}'`, { file });
    if (!Number.isSafeInteger(v) || v < 1)
      throw new TpError("E_FORMAT", `'${a}.${k}' must be a positive integer, got ${v}`, { file });
    return v;
  };
  const experts = key("expert_count");
  const used = key("expert_used_count");
  if (used > experts) {
    throw new TpError(
      "E_FORMAT",
      `'${a}.expert_used_count' ${used} is more than '${a}.expert_count' ${experts}`,
      {
        file,
      },
    );
  }
  return {
    ...base,
    num_experts: experts,
    num_experts_per_tok: used,
    moe_intermediate_size: key("expert_feed_forward_length", Math.floor(base.intermediate_size / used)),
    shared_expert_intermediate_size: key("expert_shared_feed_forward_length", base.intermediate_size),
    norm_topk_prob: true,
  };
}

// ---------------------------------------------------------------------------------------------------
// Weights: qwen35's layers, a routed MoE and a gated shared expert for the FFN

/** `model.layers.{i}.mlp.*` of a Qwen 3.5 MoE layer. */
export interface Qwen35MoeMlpWeights extends MoeWeights {
  /** [shared_expert_intermediate_size, hidden_size] etc.: the shared expert's SwiGLU */
  readonly shared_expert: SwiGluWeights;
  /** [1, hidden_size]: the shared expert's scalar gate (GGUF `ffn_gate_inp_shexp`, stored 1-D) */
  readonly shared_expert_gate: Weight;
}

/** A one-row projection [1, H] stored 1-D ([H]) or 2-D ([1, H]). @throws TpError E_FORMAT, E_UNSUPPORTED */
function readGateRow(w: WeightReader, hf: string, hidden: number): Weight {
  const e = tensorEntry(w.checkpoint, hf);
  const numel = e.shape.reduce((x, y) => x * y, 1);
  if (numel !== hidden || e.shape[e.shape.length - 1] !== hidden) {
    throw new TpError("E_FORMAT", `expected [${hidden}] or [1, ${hidden}], got [${e.shape.join(", ")}]`, {
      file: e.file,
      tensor: e.name,
    });
  }
  const g = loadWeight(w.checkpoint.source, e.name, hidden);
  if (!w.backend.supports("matmul", [g.format])) {
    throw new TpError("E_UNSUPPORTED", `backend ${w.backend.name} cannot run matmul on ${g.format} weights`, {
      file: e.file,
      tensor: e.name,
    });
  }
  return g;
}

/** Layer i's MoE FFN. */
export function readQwen35MoeMlp(w: WeightReader, c: Qwen35MoeConfig, i: number): Qwen35MoeMlpWeights {
  const p = `model.layers.${i}.mlp.`;
  const H = c.hidden_size;
  const S = c.shared_expert_intermediate_size;
  return {
    ...readMoe(w, p, H, c),
    shared_expert: {
      gate_proj: w.linear(`${p}shared_expert.gate_proj.weight`, [S, H]),
      up_proj: w.linear(`${p}shared_expert.up_proj.weight`, [S, H]),
      down_proj: w.linear(`${p}shared_expert.down_proj.weight`, [H, S]),
    },
    shared_expert_gate: readGateRow(w, `${p}shared_expert_gate.weight`, H),
  };
}

// ---------------------------------------------------------------------------------------------------
// Forward

/** Qwen 3.5 MoE: qwen35's model with the routed + shared-expert FFN. */
export class Qwen35MoeModel extends Qwen35Model<Qwen35MoeMlpWeights> {
  declare readonly config: Qwen35MoeConfig;

  /** The FFN of layer i: m [n, H] (normed) → routed experts + σ(gate · m) · shared expert, [n, H]. */
  override ffn(i: number, m: Tensor): Tensor {
    const b = this.backend;
    const w = (this.weights.layers[i] as Qwen35LayerWeights<Qwen35MoeMlpWeights>).mlp;
    const routed = sparseMoe(b, w, m, this.config);
    const shared = b.mul(swiglu(b, w.shared_expert, m), b.sigmoid(b.matmul(m, w.shared_expert_gate))); // [n, H] · [n, 1]
    return b.add(routed, shared);
  }
}

/** The `qwen35moe` architecture (GGUF only). */
export const qwen35moe: Architecture = {
  name: "qwen35moe",
  description: "Qwen 3.5 / 3.6 mixture of experts (hybrid, routed experts + gated shared expert; GGUF)",
  configFromGguf: qwen35moeArgsFromGguf,
  configFromHf: qwen35ArgsFromHf,
  create(backend, config, r) {
    const c = config as Qwen35MoeConfig;
    const w = new WeightReader(backend, r);
    const weights = backend.persist(
      backend.scope(() => readQwen35Weights(w, c, (i) => readQwen35MoeMlp(w, c, i))),
    );
    return new Qwen35MoeModel(backend, c, weights);
  },
};
