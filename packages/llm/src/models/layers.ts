/**
 * The small pieces every decoder architecture file uses: {@link ForwardPass} (what one forward is
 * asked: its rows, positions, the KV cache or none, how many blocks, which rows reach the head, which
 * hidden states to collect), {@link attend} (the KV-cache write and causal GQA attention, heads
 * merged) and {@link swiglu} (the gated MLP). The architecture itself — which projections, norms and
 * residuals in which order — stays in its own file (models/llama.ts, models/qwen3.ts).
 *
 * Sources: ../shared/spec/llm.md §3.0 (building blocks), §7.1–7.3 (the stepper, the KV cache);
 * Vaswani et al. 2017 eq. 1 (attention); Ainslie et al. 2023 (GQA); Shazeer 2020 (SwiGLU).
 */
import { type Backend, type RopeOptions, type Tensor, transfer, type Weight } from "@tp/tensor";
import type { KvCache } from "../kv-cache.ts";
import type { LlmConfig } from "../model.ts";
import { PlacedBackend } from "../placement.ts";
import type { RecurrentState } from "../recurrent-state.ts";

/**
 * One forward's state. Hidden-state indices follow transformers' `output_hidden_states`:
 * hidden_states[k] is the residual stream entering block k — [0] the token embeddings,
 * [num_hidden_layers] the last block's output, before the final norm.
 */
export class ForwardPass {
  readonly backend: Backend;
  /** New rows (tokens) in this forward. */
  readonly n: number;
  /** Rows already in the KV cache: the first new row's position. 0 without a cache. */
  readonly offset: number;
  /** i32 [n]: positions offset … offset + n − 1, on the backend of the block running now. */
  get positions(): Tensor {
    return this.#positions.get(this.#placed?.layerBackend(this.#block) ?? this.backend) as Tensor;
  }
  /** The KV cache to append to and attend over, or null: attention over this forward's own keys and values. */
  readonly cache: KvCache | null;
  /**
   * Batched decode of several sequences (`LanguageModel.stepBatch`): row i is one new token of
   * sequence i, appended to `segments[i].cache` at `segments[i].offset` and attending over that cache
   * only; `cache` is null then. Null for a single sequence.
   */
  readonly segments: readonly DecodeSegment[] | null;
  /**
   * The recurrent state of a hybrid model's linear-attention layers (recurrent-state.ts), updated in
   * place (zeros of this forward only when there is no cache); null for a pure transformer.
   */
  readonly state: RecurrentState | null;
  /** Blocks to run: num_hidden_layers, or fewer when only hidden states up to a layer are asked for. */
  readonly blocks: number;
  /** Rows that go through the final norm and the head: the last one, all, or none (return the hidden state). */
  readonly head: "last" | "all" | null;
  readonly #collect: ReadonlySet<number> | null;
  /** The placed model's backend (placement.ts), or null on one backend. */
  readonly #placed: PlacedBackend | null;
  /** The positions on each backend that runs a block. */
  readonly #positions = new Map<Backend, Tensor>();
  /** The block running now (set by {@link ForwardPass.next}). */
  #block = 0;
  /** hidden_states[k] kept by {@link ForwardPass.next}; null when none is asked for. */
  readonly collected: Map<number, Tensor> | null;

  /**
   * @param o.collect hidden_states[k] to keep (k ≤ blocks): the input of block k, or with k = blocks
   *   the last block's output; null keeps none
   */
  constructor(backend: Backend, o: ForwardPassOptions) {
    this.backend = backend;
    this.n = o.n;
    this.offset = o.offset;
    this.#placed = backend instanceof PlacedBackend ? backend : null;
    this.#positions.set(this.#placed === null ? backend : o.positions.backend, o.positions);
    for (let k = 0; this.#placed !== null && k < o.blocks; k++) {
      const m = this.#placed.layerBackend(k); // a backend that runs a block needs them there
      if (!this.#positions.has(m)) this.#positions.set(m, transfer(o.positions, m));
    }
    this.cache = o.cache;
    this.segments = o.segments ?? null;
    this.state = o.state ?? null;
    this.blocks = o.blocks;
    this.head = o.head;
    this.#collect = o.collect;
    this.collected = o.collect === null ? null : new Map();
  }

  /**
   * After block k: `h` (hidden_states[k], the block's input) is kept when collected, else freed;
   * returns `out`, the next hidden state — on the backend of block k + 1 (or of the head) when the
   * model is placed over two backends (placement.ts: the one crossing of a boundary).
   */
  next(k: number, h: Tensor, out: Tensor): Tensor {
    if (this.#collect?.has(k)) this.collected?.set(k, h);
    else this.backend.free(h);
    // hidden_states[blocks] (the last block's output, before the final norm) is the head's input:
    // kept as it is, never freed by the forward (it lives in the caller's scope)
    if (k === this.blocks - 1 && this.#collect?.has(this.blocks)) this.collected?.set(this.blocks, out);
    this.#block = k + 1;
    const to = this.#placed?.layerBackend(k + 1) ?? out.backend;
    if (to === out.backend) return out;
    const moved = transfer(out, to);
    if (this.collected?.get(k + 1) !== out) out.backend.free(out); // a collected one stays where it was made
    return moved;
  }

  /** The rows of h [n, H] that reach the head: [1, H] (the last) or all [n, H]. A view, no copy. */
  headRows(h: Tensor): Tensor {
    return this.head === "all" ? h : h.slice(0, this.n - 1, this.n);
  }
}

/** One sequence of a batched decode: its KV cache and the position of its new token. */
export interface DecodeSegment {
  readonly cache: KvCache;
  readonly offset: number;
}

/** What a {@link ForwardPass} is built from (built by the {@link LanguageModel} entry points). */
export type ForwardPassOptions = Pick<ForwardPass, "n" | "offset" | "cache" | "blocks" | "head"> & {
  /** i32 [n]: positions offset … offset + n − 1 (on any one backend of a placed model). */
  readonly positions: Tensor;
  readonly collect: ReadonlySet<number> | null;
  readonly segments?: readonly DecodeSegment[] | null;
  readonly state?: RecurrentState | null;
};

/** RoPE options of a config, built once per model (`rope` runs twice per block per step). */
export function ropeOptions(c: LlmConfig): RopeOptions {
  return {
    mode: c.rope_mode,
    theta: c.rope_theta,
    ...(c.rotary_dim !== c.head_dim ? { ropeDims: c.rotary_dim } : {}),
  };
}

/**
 * Causal GQA attention of this forward's rows, heads merged:
 * q [1, n, n_head, hd], k, v [1, n, n_kv, hd] (q, k after RoPE) → softmax(q·Kᵀ·scale + causal)·V as
 * [n, n_head·hd], ready for o_proj. With a cache, k and v are first written at rows
 * [offset, offset + n) of `layer` and attention reads rows [0, offset + n) in place; without, it reads
 * k and v themselves (positions 0 … n − 1).
 * @param scale usually 1/√head_dim
 * @param window a sliding window (query at p sees keys p − window < j ≤ p; Gemma 3's local layers), or
 *   0 for none. A sliding-window layer of the cache holds only positions from `cache.start(layer)` on;
 *   attention reads those with the query offset shifted by the same amount.
 * Source: llm.md §3.0 "Attention", §7.2; Vaswani et al. 2017 eq. 1; Ainslie et al. 2023.
 */
export function attend(
  b: Backend,
  f: ForwardPass,
  layer: number,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  scale: number,
  window = 0,
): Tensor {
  const masks = window > 0 ? { causal: true, window } : { causal: true };
  const n = f.n;
  const nh = q.shape[2] as number;
  const kvh = k.shape[2] as number;
  const hd = q.shape[3] as number;
  let o: Tensor; // [1, n_head, n, hd]
  if (f.segments !== null) {
    // one row per sequence, each against its own cache (the projections around stay batched)
    const rows = f.segments.map((seg, i) => {
      const ki = b.copy(k.slice(1, i, i + 1)).reshape(1, kvh, hd);
      const vi = b.copy(v.slice(1, i, i + 1)).reshape(1, kvh, hd);
      seg.cache.write(layer, ki, vi);
      const len = seg.offset + 1;
      const oi = b.attention(
        q.slice(1, i, i + 1).permute(0, 2, 1, 3),
        seg.cache.keys(layer, len),
        seg.cache.values(layer, len),
        { ...masks, qOffset: seg.offset - seg.cache.start(layer), scale },
      ); // [1, n_head, 1, hd]
      return oi.reshape(1, nh * hd);
    });
    return b.concat(rows, 0); // [n, n_head·hd]
  }
  if (f.cache !== null) {
    const cache = f.cache;
    cache.write(layer, k.reshape(n, kvh, hd), v.reshape(n, kvh, hd));
    const rows = f.offset + n;
    o = b.attention(q.permute(0, 2, 1, 3), cache.keys(layer, rows), cache.values(layer, rows), {
      ...masks,
      qOffset: f.offset - cache.start(layer),
      scale,
    });
  } else {
    o = b.attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), {
      ...masks,
      qOffset: 0,
      scale,
    });
  }
  const heads = o.permute(0, 2, 1, 3); // [1, n, n_head, hd]: already row-major when n = 1 (decoding)
  return (heads.isContiguous ? heads : b.copy(heads)).reshape(n, nh * hd); // [n, n_head·hd]
}

/** The weights of a SwiGLU MLP, by HF names. */
export interface SwiGluWeights {
  /** [intermediate_size, hidden_size] */
  readonly gate_proj: Weight;
  /** [intermediate_size, hidden_size] */
  readonly up_proj: Weight;
  /** [hidden_size, intermediate_size] */
  readonly down_proj: Weight;
}

/**
 * SwiGLU MLP: down_proj(silu(gate_proj(x)) ⊙ up_proj(x)), x [n, H] → [n, H].
 * Source: llm.md §3.0 "Gated FFNs"; Shazeer 2020.
 */
export function swiglu(b: Backend, w: SwiGluWeights, x: Tensor): Tensor {
  return b.matmul(b.swiglu(b.matmul(x, w.gate_proj), b.matmul(x, w.up_proj)), w.down_proj); // [n, FFN] inside
}
