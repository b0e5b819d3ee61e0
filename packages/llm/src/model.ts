/**
 * The contract between the architectures (models/llama.ts, models/qwen3.ts, …) and the generation
 * engine: a causal language model with its own KV cache that turns new token ids into logits
 * (../shared/spec/llm.md §7.1 "Model interface and the loop"). {@link CausalLM} is implemented once,
 * by `LanguageModel` (models/language-model.ts) around each architecture's forward; the engine, the
 * CLI and the benchmarks only see this interface.
 */
import type { Backend, Tensor } from "@tp/tensor";

/**
 * Hyper-parameters of a decoder-only transformer, read from the file's metadata (GGUF
 * `{arch}.*` keys, llm.md §1.1.1, or a Hugging Face config.json), never assumed.
 */
export interface LlmConfig {
  /** GGUF `general.architecture` ("llama", "qwen3") or the HF model_type. */
  readonly architecture: string;
  readonly vocab_size: number;
  readonly hidden_size: number;
  readonly num_hidden_layers: number;
  readonly num_attention_heads: number;
  readonly num_key_value_heads: number;
  /** Per-head width; Qwen3's differs from hidden_size / num_attention_heads. */
  readonly head_dim: number;
  readonly intermediate_size: number;
  readonly rms_norm_eps: number;
  readonly rope_theta: number;
  /** "neox" (rotate halves; HF Llama/Qwen layout) or "interleaved" (GGUF llama's NORM rope). */
  readonly rope_mode: "neox" | "interleaved";
  /**
   * Rotated dimensions per head (GGUF `{arch}.rope.dimension_count`; HF GPT-J's `rotary_dim`); equal
   * to head_dim for every llama / qwen3 file seen, the rest of a head passes through unrotated.
   */
  readonly rotary_dim: number;
  /** Trained context length (GGUF `{arch}.context_length`, HF max_position_embeddings). */
  readonly max_position_embeddings: number;
  /** The output projection is the token embedding (no separate lm_head / output.weight). */
  readonly tie_word_embeddings: boolean;
  /** Sliding window of the `sliding_attention` layers (Gemma 3: query at p sees keys p − W < j ≤ p). */
  readonly sliding_window?: number;
  /**
   * Per layer, as HF `layer_types`: which layers use {@link LlmConfig.sliding_window}, and which are
   * linear attention with no KV rows (Qwen 3.5's Gated DeltaNet); absent = all full.
   */
  readonly layer_types?: readonly ("full_attention" | "sliding_attention" | "linear_attention")[];
}

/** Options of {@link CausalLM.step}. */
export interface StepOptions {
  /** Return logits for every new row ([n, vocab]) instead of the last one only ([1, vocab]). */
  readonly allLogits?: boolean;
}

/**
 * A causal LM bound to a backend, with its KV cache. Positions are implicit: `step` puts its ids at
 * positions [cached, cached + n). Model code never reads tensor data on the host; the caller reads the
 * returned logits with `await backend.read(logits)` and frees them.
 */
export interface CausalLM {
  readonly config: LlmConfig;
  readonly backend: Backend;
  /** The checkpoint file the weights came from, when known (for messages). */
  readonly file?: string | undefined;
  /** Tokens whose keys and values are in the cache (the next position). */
  readonly cached: number;
  /** The most tokens the cache may ever hold (the context length asked for, ≤ max_position_embeddings). */
  readonly maxContext: number;
  /** Rows the KV cache has allocated now (grows on demand up to maxContext; llm.md §7.3). */
  readonly capacity: number;
  /** Backend bytes the KV cache holds now (already counted in `backend.memory`). */
  readonly kvBytes: number;
  /**
   * Run the model on `ids` (prefill when several, decode when one), append their keys and values to the
   * cache (growing it as needed up to maxContext) and return f32 logits [1, vocab_size] of the last
   * row, or [n, vocab_size] with `allLogits`. The caller owns (and frees) the returned tensor.
   * @throws TpError E_ARG for ids that are not an array, an empty list or an id outside
   *   [0, vocab_size); E_ARG also when cached + n would exceed maxContext ("context window full",
   *   naming --ctx; nothing is written)
   */
  step(ids: Int32Array | readonly number[], options?: StepOptions): Tensor;
  /**
   * `step`, also returning hidden states of every new row from the same forward (which writes the KV
   * cache as `step` does): hidden_states[k] for each k of `collect` (the residual stream entering block
   * k; num_hidden_layers: the last block's output before the final norm), f32 [n, hidden_size] each, in
   * the order of `collect`. The caller frees everything returned. Absent on a model that cannot tap.
   * @throws TpError as `step`; E_ARG for a `collect` entry outside [0, num_hidden_layers] or repeated
   */
  stepCollect?(
    ids: Int32Array | readonly number[],
    collect: readonly number[],
    options?: StepOptions,
  ): { logits: Tensor; hidden: Tensor[] };
  /**
   * Forget cached tokens from position `len` on (0 ≤ len ≤ cached); used to reuse a common prefix. A
   * model with recurrent state (Qwen 3.5's linear attention) can only return to a snapshot, the newest
   * at or before `len`: `cached` may end below `len`, so read it afterwards.
   */
  truncate(len: number): void;
  /**
   * The shortest length `truncate` can keep besides 0 (a sliding-window ring dropped the rows a query
   * before it would need); 0 or absent when any length works.
   */
  readonly truncateFloor?: number;
  /**
   * Mark the current position as one to return to (the end of a turn's prompt): a model with recurrent
   * state keeps a snapshot of it; others need none (absent or a no-op).
   */
  snapshot?(): void;
  /** Free the cache and every tensor the model uploaded; the model is unusable afterwards. */
  dispose(): void;
}
