/**
 * The sparse mixture-of-experts MLP of Qwen3-MoE (and the routed part of Qwen 3.5-MoE): a router
 * picks `num_experts_per_tok` of `num_experts` SwiGLU experts per token, and the token's output is
 * the routing-weighted sum of theirs. Everything runs on the device: the router logits, the top-k,
 * the weights, the experts (`backend.matmulId` over the stacked expert weights, read in place: each
 * expert's rows as one GEMM, experts no token chose not read) and the weighted sum — nothing is
 * read back to the host (unless a placed model keeps the expert stacks there: placement.ts).
 *
 * Forward, per token row f [H] (llm.md §3.2; transformers `Qwen3MoeSparseMoeBlock.forward`;
 * llama.cpp `build_moe_ffn` with softmax gating, `norm_w` for qwen3moe):
 *   r = gate · f                                  # [num_experts] router logits, f32
 *   p = softmax(r)                                # over ALL experts
 *   E = indices of the top-k of p                 # k = num_experts_per_tok; ties to the lower index
 *   w_e = p_e / Σ_{e'∈E} p_e'                     # norm_topk_prob (else w_e = p_e)
 *   y = Σ_{e∈E} w_e · down_e(silu(gate_e(f)) ⊙ up_e(f))
 *
 * With norm_topk_prob the weights are computed as softmax over the k selected logits: p_e / Σ_E p_e' =
 * exp(r_e) / Σ_E exp(r_e') exactly (the shared normaliser of the full softmax cancels), and the top-k
 * of p are the top-k of r (softmax is monotone), so the full softmax need not be formed; the two
 * differ only by f32 rounding.
 */
import { type Backend, type Tensor, transfer, type Weight } from "@tp/tensor";
import { weightBackend } from "../placement.ts";
import type { WeightReader } from "./checkpoint.ts";

/** The weights of one sparse MoE MLP, by HF names (`model.layers.{i}.mlp.*`). */
export interface MoeWeights {
  /** The router [num_experts, hidden_size] (HF `mlp.gate`, GGUF `ffn_gate_inp`; f32 in the GGUF files). */
  readonly gate: Weight;
  /** Every expert's gate_proj, stacked [num_experts·moe_intermediate_size, hidden_size] (GGUF `ffn_gate_exps`). */
  readonly gate_proj: Weight;
  /** Every expert's up_proj, stacked [num_experts·moe_intermediate_size, hidden_size] (GGUF `ffn_up_exps`). */
  readonly up_proj: Weight;
  /** Every expert's down_proj, stacked [num_experts·hidden_size, moe_intermediate_size] (GGUF `ffn_down_exps`). */
  readonly down_proj: Weight;
}

/** The hyper-parameters of a sparse MoE MLP (transformers `Qwen3MoeConfig` names). */
export interface MoeArgs {
  /** Routed experts (GGUF `{arch}.expert_count`). */
  readonly num_experts: number;
  /** Experts per token, k (GGUF `{arch}.expert_used_count`). */
  readonly num_experts_per_tok: number;
  /** Hidden width of one expert (GGUF `{arch}.expert_feed_forward_length`). */
  readonly moe_intermediate_size: number;
  /** Renormalise the k routing weights to sum to 1 (true for Qwen3-MoE; llama.cpp hard-codes it). */
  readonly norm_topk_prob: boolean;
}

/**
 * The MoE weights of block i under `prefix` (`model.layers.{i}.mlp.`): the router and the three
 * expert stacks (GGUF's 3-D `ffn_{gate,up,down}_exps`, as `experts.{gate,up,down}_proj.weight`).
 * @throws TpError E_FORMAT naming file and tensor (missing, mis-shaped); E_UNSUPPORTED for a format
 *   the backend cannot run
 */
export function readMoe(w: WeightReader, prefix: string, hidden: number, a: MoeArgs): MoeWeights {
  const { num_experts: E, moe_intermediate_size: F } = a;
  return {
    gate: w.linear(`${prefix}gate.weight`, [E, hidden]),
    gate_proj: w.experts(`${prefix}experts.gate_proj.weight`, [E, F, hidden]),
    up_proj: w.experts(`${prefix}experts.up_proj.weight`, [E, F, hidden]),
    down_proj: w.experts(`${prefix}experts.down_proj.weight`, [E, hidden, F]),
  };
}

/** The routing of n token rows: which experts, and with what weight. */
export interface MoeRoute {
  /** i32 [n, k]: the chosen experts of each row, by descending router probability. */
  readonly ids: Tensor;
  /** f32 [n, k]: their weights (summing to 1 per row with norm_topk_prob). */
  readonly weights: Tensor;
}

/**
 * The router: x [n, H] → the top-k experts of softmax(gate · x) and their weights (renormalised
 * over the k when `normTopK`), see the module comment. On the device (matmul, top_k, softmax).
 */
export function moeRoute(b: Backend, gate: Weight, x: Tensor, k: number, normTopK: boolean): MoeRoute {
  const logits = b.matmul(x, gate); // [n, E]
  if (normTopK) {
    const top = b.topK(logits, k); // top-k of the logits are those of softmax(logits)
    return { ids: top.indices, weights: b.softmax(top.values) }; // = p_e / Σ_E p_e'
  }
  const top = b.topK(b.softmax(logits), k);
  return { ids: top.indices, weights: top.values };
}

/**
 * The experts' SwiGLU and the weighted sum: x [n, H], route [n, k] → Σ_s w[t, s] · down_{e}(silu(
 * gate_{e}(x)) ⊙ up_{e}(x)) with e = ids[t, s], [n, H]. One matmul_id per projection: the gate and up
 * stacks read each token's row for all k slots, the down stack each slot's own activation. When a
 * placed model keeps these stacks on the host (placement.ts), x and the route cross there and the sum
 * comes back.
 */
export function moeExperts(
  b: Backend,
  w: MoeWeights,
  x: Tensor,
  route: MoeRoute,
  numExperts: number,
): Tensor {
  const at = weightBackend(b, w.gate_proj, x); // x's, or the host's under --cpu-moe / --n-cpu-moe
  if (at !== x.backend) {
    const there = { ids: transfer(route.ids, at), weights: transfer(route.weights, at) };
    return transfer(moeExperts(at, w, transfer(x, at), there, numExperts), x.backend); // rows there, sum back
  }
  const [n, h] = x.shape as [number, number];
  const k = route.ids.shape[1] as number;
  const opts = { experts: numExperts };
  const xs = x.reshape(n, 1, h); // one input row per token, shared by its k slots
  const act = b.swiglu(
    b.matmulId(xs, w.gate_proj, route.ids, opts),
    b.matmulId(xs, w.up_proj, route.ids, opts),
  ); // [n, k, F]
  const out = b.mul(b.matmulId(act, w.down_proj, route.ids, opts), route.weights.reshape(n, k, 1)); // [n, k, H]
  let sum = out.slice(1, 0, 1); // [n, 1, H]: Σ over the k slots
  for (let s = 1; s < k; s++) sum = b.add(sum, out.slice(1, s, s + 1));
  return (sum.isContiguous ? sum : b.copy(sum)).reshape(n, h);
}

/**
 * The sparse MoE MLP: x [n, H] (normed) → [n, H] (module comment). Source: llm.md §3.2;
 * transformers `models/qwen3_moe/modeling_qwen3_moe.py` `Qwen3MoeSparseMoeBlock`; Shazeer et al.
 * 2017 (sparsely-gated mixture of experts).
 */
export function sparseMoe(b: Backend, w: MoeWeights, x: Tensor, a: MoeArgs): Tensor {
  return moeExperts(b, w, x, moeRoute(b, w.gate, x, a.num_experts_per_tok, a.norm_topk_prob), a.num_experts);
}
