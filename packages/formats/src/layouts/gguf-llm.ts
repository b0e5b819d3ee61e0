/**
 * GGUF language models: the architectures TensorPencil knows (by `general.architecture`) and the
 * GGUF → Hugging Face tensor names the model code uses.
 *
 * Sources: ggml-org/llama.cpp `src/llama-arch.cpp` (`LLM_TENSOR_NAMES`: `token_embd`, `blk.%d.attn_q`,
 * …) and `gguf-py/gguf/tensor_mapping.py` (`TensorNameMap`: which HF name each GGUF name comes from),
 * read in the llama.cpp tree that node-llama-cpp 3.21.1 ships; ../shared/spec/llm.md §1.1 and §3
 * (architectures, tied heads). The names were checked against the GGUF files in ../shared/models.
 */
import type { NameRow, NameTable } from "./names.ts";

/** `general.architecture` values with a model in TensorPencil (llm.md §1.1.1), and what they are. */
export const GGUF_LLM_ARCHITECTURES: Readonly<Record<string, string>> = {
  llama: "Llama (Llama 2/3, TinyLlama, llama2.c conversions)",
  qwen3: "Qwen 3 dense",
  qwen3moe: "Qwen 3 mixture of experts",
  qwen3vl: "Qwen3-VL (text side)",
  qwen35: "Qwen 3.5 / 3.6 dense (hybrid Gated-DeltaNet)",
  qwen35moe: "Qwen 3.5 / 3.6 mixture of experts",
  gemma3: "Gemma 3",
};

const COMMON: NameRow[] = [
  { from: "token_embd.weight", to: "model.embed_tokens.weight" },
  { from: "output_norm.weight", to: "model.norm.weight" },
  { from: "output.weight", to: "lm_head.weight" },
  { from: "blk.{N}.attn_norm.weight", to: "model.layers.{N}.input_layernorm.weight" },
  { from: "blk.{N}.attn_q.weight", to: "model.layers.{N}.self_attn.q_proj.weight" },
  { from: "blk.{N}.attn_k.weight", to: "model.layers.{N}.self_attn.k_proj.weight" },
  { from: "blk.{N}.attn_v.weight", to: "model.layers.{N}.self_attn.v_proj.weight" },
  { from: "blk.{N}.attn_q.bias", to: "model.layers.{N}.self_attn.q_proj.bias" },
  { from: "blk.{N}.attn_k.bias", to: "model.layers.{N}.self_attn.k_proj.bias" },
  { from: "blk.{N}.attn_v.bias", to: "model.layers.{N}.self_attn.v_proj.bias" },
  { from: "blk.{N}.attn_output.weight", to: "model.layers.{N}.self_attn.o_proj.weight" },
  { from: "blk.{N}.attn_q_norm.weight", to: "model.layers.{N}.self_attn.q_norm.weight" },
  { from: "blk.{N}.attn_k_norm.weight", to: "model.layers.{N}.self_attn.k_norm.weight" },
  { from: "blk.{N}.ffn_gate.weight", to: "model.layers.{N}.mlp.gate_proj.weight" },
  { from: "blk.{N}.ffn_up.weight", to: "model.layers.{N}.mlp.up_proj.weight" },
  { from: "blk.{N}.ffn_down.weight", to: "model.layers.{N}.mlp.down_proj.weight" },
  // llama.cpp computes RoPE factors itself from these (Llama 3 rope scaling); not an HF tensor.
  { from: "rope_freqs.weight", to: null },
];

/** llama, qwen3, qwen3vl: `ffn_norm` is HF `post_attention_layernorm` (the pre-MLP norm). */
const LLAMA_LIKE: NameRow[] = [
  ...COMMON,
  { from: "blk.{N}.ffn_norm.weight", to: "model.layers.{N}.post_attention_layernorm.weight" },
];

/** qwen3moe: router `ffn_gate_inp` and experts stacked on a leading dimension (`ffn_*_exps`, [E, …]). */
const QWEN3MOE: NameRow[] = [
  ...LLAMA_LIKE,
  { from: "blk.{N}.ffn_gate_inp.weight", to: "model.layers.{N}.mlp.gate.weight" },
  { from: "blk.{N}.ffn_gate_exps.weight", to: "model.layers.{N}.mlp.experts.gate_proj.weight" },
  { from: "blk.{N}.ffn_up_exps.weight", to: "model.layers.{N}.mlp.experts.up_proj.weight" },
  { from: "blk.{N}.ffn_down_exps.weight", to: "model.layers.{N}.mlp.experts.down_proj.weight" },
];

/** gemma3: four norms per block; `ffn_norm` is HF `pre_feedforward_layernorm` (tensor_mapping FFN_PRE_NORM). */
const GEMMA3: NameRow[] = [
  ...COMMON,
  { from: "blk.{N}.post_attention_norm.weight", to: "model.layers.{N}.post_attention_layernorm.weight" },
  { from: "blk.{N}.ffn_norm.weight", to: "model.layers.{N}.pre_feedforward_layernorm.weight" },
  { from: "blk.{N}.post_ffw_norm.weight", to: "model.layers.{N}.post_feedforward_layernorm.weight" },
];

/**
 * qwen35 (Qwen 3.5 / 3.6 dense): gated full-attention layers (COMMON's attention rows, `attn_q` holding
 * per head the query rows then the output-gate rows) and Gated DeltaNet layers (`linear_attn.*`), a
 * post-attention norm before the FFN. GGUF stores `ssm_a` = −exp(A_log) (read as such) and the value
 * heads in tiled order (llm.md §3.4, "Head mapping").
 */
const QWEN35: NameRow[] = [
  ...COMMON,
  { from: "blk.{N}.post_attention_norm.weight", to: "model.layers.{N}.post_attention_layernorm.weight" },
  { from: "blk.{N}.attn_qkv.weight", to: "model.layers.{N}.linear_attn.in_proj_qkv.weight" },
  { from: "blk.{N}.attn_gate.weight", to: "model.layers.{N}.linear_attn.in_proj_z.weight" },
  { from: "blk.{N}.ssm_beta.weight", to: "model.layers.{N}.linear_attn.in_proj_b.weight" },
  { from: "blk.{N}.ssm_alpha.weight", to: "model.layers.{N}.linear_attn.in_proj_a.weight" },
  { from: "blk.{N}.ssm_conv1d.weight", to: "model.layers.{N}.linear_attn.conv1d.weight" },
  { from: "blk.{N}.ssm_dt.bias", to: "model.layers.{N}.linear_attn.dt_bias" },
  { from: "blk.{N}.ssm_a", to: "model.layers.{N}.linear_attn.A_log" },
  { from: "blk.{N}.ssm_norm.weight", to: "model.layers.{N}.linear_attn.norm.weight" },
  { from: "blk.{N}.ssm_out.weight", to: "model.layers.{N}.linear_attn.out_proj.weight" },
];

/** qwen35moe: qwen35's layers with qwen3moe's routed experts and a gated shared expert (`*_shexp`). */
const QWEN35MOE: NameRow[] = [
  ...QWEN35,
  { from: "blk.{N}.ffn_gate_inp.weight", to: "model.layers.{N}.mlp.gate.weight" },
  { from: "blk.{N}.ffn_gate_exps.weight", to: "model.layers.{N}.mlp.experts.gate_proj.weight" },
  { from: "blk.{N}.ffn_up_exps.weight", to: "model.layers.{N}.mlp.experts.up_proj.weight" },
  { from: "blk.{N}.ffn_down_exps.weight", to: "model.layers.{N}.mlp.experts.down_proj.weight" },
  { from: "blk.{N}.ffn_gate_inp_shexp.weight", to: "model.layers.{N}.mlp.shared_expert_gate.weight" },
  { from: "blk.{N}.ffn_gate_shexp.weight", to: "model.layers.{N}.mlp.shared_expert.gate_proj.weight" },
  { from: "blk.{N}.ffn_up_shexp.weight", to: "model.layers.{N}.mlp.shared_expert.up_proj.weight" },
  { from: "blk.{N}.ffn_down_shexp.weight", to: "model.layers.{N}.mlp.shared_expert.down_proj.weight" },
];

const SOURCE =
  "ggml-org/llama.cpp src/llama-arch.cpp (LLM_TENSOR_NAMES) and gguf-py/gguf/tensor_mapping.py (TensorNameMap)";

/** GGUF → HF name tables by architecture. */
export const GGUF_HF_NAMES: Readonly<Record<string, NameTable>> = {
  llama: { source: SOURCE, rows: LLAMA_LIKE },
  qwen3: { source: SOURCE, rows: LLAMA_LIKE },
  qwen3vl: { source: SOURCE, rows: LLAMA_LIKE },
  qwen3moe: { source: SOURCE, rows: QWEN3MOE },
  gemma3: { source: SOURCE, rows: GEMMA3 },
  qwen35: { source: SOURCE, rows: QWEN35 },
  qwen35moe: { source: SOURCE, rows: QWEN35MOE },
};
