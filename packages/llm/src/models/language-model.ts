/**
 * How an architecture file plugs in, and the one {@link CausalLM} around every architecture.
 *
 * An architecture file (models/llama.ts, models/qwen3.ts) exports an {@link Architecture}: its
 * arguments (config from GGUF metadata or config.json), its weights by checkpoint names, and a
 * {@link DecoderModel} whose `forward` runs token ids through embedding → blocks → norm → head.
 * {@link LanguageModel} adds what is not architecture: token ids checked once at the entry point, the
 * KV cache (reserve, positions, commit), the context window, hidden states without a cache
 * (`forward(ids, { collect })`), and freeing. Every temporary of a forward lives in a
 * `backend.scope`, so model code carries no lifetime bookkeeping.
 *
 * Sources: ../shared/spec/llm.md §7.1 (model interface and the loop), §7.3 (context window);
 * transformers `output_hidden_states` (`Qwen3Model.forward`).
 */
import type { GgufMetadata } from "@tp/formats";
import { type Backend, Tensor, TpError } from "@tp/tensor";
import { KV_RING_BATCH, KvCache } from "../kv-cache.ts";
import type { CausalLM, LlmConfig, StepOptions } from "../model.ts";
import { PlacedBackend } from "../placement.ts";
import { DEFAULT_STATE_SNAPSHOTS, RecurrentState, type RecurrentStateShape } from "../recurrent-state.ts";
import type { CheckpointReader } from "./checkpoint.ts";
import { ForwardPass } from "./layers.ts";

/** What an architecture file builds: its weights and its forward. */
export interface DecoderModel {
  readonly backend: Backend;
  readonly config: LlmConfig;
  /**
   * The weights by HF names, as plain objects and arrays; the Tensors among them (norm scales
   * uploaded at load) are freed by {@link LanguageModel.dispose}.
   */
  readonly weights: object;
  /**
   * input_ids i32 [n] → f32 logits [rows, vocab_size] for `pass.head` "last" (rows = 1) or "all"
   * (rows = n); with `pass.head` null, the hidden state after `pass.blocks` blocks [n, hidden_size]
   * (no final norm). Calls `pass.next(k, h, out)` after each block k. Runs inside the caller's scope.
   */
  forward(inputIds: Tensor, pass: ForwardPass): Tensor;
  /**
   * Layers that keep keys and values, when fewer than num_hidden_layers (a hybrid model's attention
   * layers; the model passes its own slot index to `attend`). Default: every layer.
   */
  readonly kvLayers?: number;
  /** The recurrent state of a hybrid model's linear-attention layers (recurrent-state.ts), or none. */
  readonly recurrent?: RecurrentStateShape;
}

/** An architecture: one row of the registry (models/registry.ts). */
export interface Architecture {
  /** GGUF `general.architecture` and HF `model_type`. */
  readonly name: string;
  /** For listings ("Llama (Llama 2/3, …)"). */
  readonly description: string;
  /** LlmConfig from GGUF metadata. @throws TpError E_FORMAT, E_UNSUPPORTED */
  configFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig;
  /** LlmConfig from config.json. @throws TpError E_FORMAT, E_UNSUPPORTED */
  configFromHf(json: Readonly<Record<string, unknown>>, r: CheckpointReader, file: string): LlmConfig;
  /**
   * Read the weights (freeing what was uploaded when one fails) and build the forward.
   * @throws TpError E_FORMAT naming file and tensor; E_UNSUPPORTED for a format the backend cannot run
   */
  create(backend: Backend, config: LlmConfig, r: CheckpointReader): DecoderModel;
}

/** Options of a {@link LanguageModel}. */
export interface LanguageModelOptions {
  /** Context window (KV rows at most); default and ceiling: min(max_position_embeddings, 131072) (llm.md §7.3). */
  readonly maxContext?: number;
  /** KV rows committed at first use at least (llm.md §7.3: 4096); tests use fewer to exercise growth. */
  readonly kvInitialRows?: number;
  /**
   * Sliding-window layers keep `sliding_window + kvRingBatch` rows, and a step runs at most this many
   * rows per forward (longer prompts are split); default 512. Tests use fewer to make the ring wrap.
   */
  readonly kvRingBatch?: number;
  /** Called by dispose after the tensors are freed (the loader closes the checkpoint's mappings). */
  readonly onDispose?: () => void;
  /** The checkpoint file, for messages ({@link CausalLM.file}); the loader sets it. */
  readonly file?: string;
  /** Snapshots of the recurrent state kept (hybrid models; recurrent-state.ts); default 3. */
  readonly stateSnapshots?: number;
}

/** Options of {@link LanguageModel.forward}. */
export interface ForwardOptions {
  /**
   * hidden_states[k] to return, k in [0, num_hidden_layers], distinct, any order: the residual stream
   * entering block k (0: the token embeddings; num_hidden_layers: the last block's output, before the
   * final norm), as transformers' `output_hidden_states`. Only blocks 0 … max(k) − 1 run; the KV cache
   * is neither read nor written.
   */
  readonly collect: readonly number[];
}

/**
 * Architectures whose forward touches the KV cache only through `attend` (models/layers.ts), so that
 * {@link LanguageModel.stepBatch} can give each row its own cache. Add one after checking that.
 */
export const BATCHED_DECODE_ARCHITECTURES: ReadonlySet<string> = new Set([
  "llama",
  "qwen3",
  "qwen3moe",
  "gemma3",
]);

/** Default ceiling of the context window (llm.md §7.3: the trained context capped at 128k). */
export const MAX_DEFAULT_CONTEXT = 131072;

/**
 * The context window of a model: `maxContext`, or min(max_position_embeddings, 131072).
 * @throws TpError E_ARG naming `maxContext` when it is not an integer from 1 to max_position_embeddings
 */
export function contextWindow(config: LlmConfig, maxContext: number | undefined): number {
  const ceiling = config.max_position_embeddings;
  const m = maxContext ?? Math.min(ceiling, MAX_DEFAULT_CONTEXT);
  if (!Number.isSafeInteger(m) || m < 1 || m > ceiling) {
    throw new TpError(
      "E_ARG",
      `maxContext must be an integer from 1 to ${ceiling} (the model's trained context), got ${m}`,
    );
  }
  return m;
}

/**
 * Token ids checked against the vocabulary, as i32: the one check of a model's input.
 * @param where the entry point, for messages ("step", "forward")
 * @throws TpError E_ARG when `ids` is not an array, is empty, or holds an id outside [0, vocab_size)
 *   (naming the id, its index and the vocabulary size)
 */
export function tokenIds(ids: Int32Array | readonly number[], vocabSize: number, where: string): Int32Array {
  if (!Array.isArray(ids) && !(ArrayBuffer.isView(ids) && !(ids instanceof DataView))) {
    throw new TpError(
      "E_ARG",
      `${where}: ids must be an array of token ids, got ${ids === null ? "null" : typeof ids}`,
    );
  }
  const n = ids.length;
  if (n === 0) throw new TpError("E_ARG", `${where}: no token ids`);
  const list = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    const id = ids[i] as number;
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw new TpError(
        "E_ARG",
        `${where}: token id ${id} (at index ${i}) is outside the vocabulary [0, ${vocabSize})`,
      );
    }
    list[i] = id;
  }
  return list;
}

/**
 * Build an architecture's model from an opened checkpoint and wrap it with its KV cache. `maxContext`
 * is checked before any weight is read.
 * @throws TpError E_ARG for a bad maxContext; the architecture's load errors (nothing stays allocated)
 */
export function createLanguageModel(
  arch: Architecture,
  backend: Backend,
  config: LlmConfig,
  r: CheckpointReader,
  options: LanguageModelOptions = {},
): LanguageModel {
  contextWindow(config, options.maxContext);
  try {
    return new LanguageModel(arch.create(backend, config, r), options);
  } catch (e) {
    if (backend instanceof PlacedBackend) backend.releaseWeights(); // the device copies made so far
    throw e;
  }
}

/**
 * A decoder-only LM with its KV cache: the {@link CausalLM} of every architecture.
 *
 * `step(ids)` runs all new rows in one forward (batched prefill; causal attention with
 * qOffset = cached), writes their keys and values at rows [cached, cached + n) of every layer, and
 * returns logits of the last row (or of every row). `forward(ids, { collect })` returns hidden states
 * over a whole sequence without touching the cache.
 */
export class LanguageModel<M extends DecoderModel = DecoderModel> implements CausalLM {
  readonly model: M;
  readonly config: LlmConfig;
  readonly backend: Backend;
  readonly maxContext: number;
  readonly kv: KvCache;
  /** The recurrent state of a hybrid model (null for a pure transformer). */
  readonly state: RecurrentState | null;
  readonly file: string | undefined;
  readonly #onDispose: (() => void) | undefined;
  /** Rows per forward at most of a placed model (kvRingBatch). */
  readonly #microBatch: number;
  #disposed = false;

  /** @throws TpError E_ARG naming `maxContext` (see {@link contextWindow}) */
  constructor(model: M, options: LanguageModelOptions = {}) {
    this.model = model;
    this.config = model.config;
    this.backend = model.backend;
    this.maxContext = contextWindow(model.config, options.maxContext);
    this.kv = new KvCache(this.backend, {
      layers: model.kvLayers ?? this.config.num_hidden_layers,
      numKvHeads: this.config.num_key_value_heads,
      headDim: this.config.head_dim,
      maxContext: this.maxContext,
      ...(options.kvInitialRows !== undefined ? { minRows: options.kvInitialRows } : {}),
      ...(options.kvRingBatch !== undefined ? { ringBatch: options.kvRingBatch } : {}),
      slidingWindow: slidingWindows(this.config),
    });
    this.state =
      model.recurrent === undefined
        ? null
        : new RecurrentState(
            this.backend,
            model.recurrent,
            options.stateSnapshots ?? DEFAULT_STATE_SNAPSHOTS,
          );
    this.#onDispose = options.onDispose;
    this.file = options.file;
    this.#microBatch = options.kvRingBatch ?? KV_RING_BATCH;
  }

  /** Tokens in the KV cache (the next position). */
  get cached(): number {
    return this.kv.length;
  }
  /** KV rows allocated per layer now. */
  get capacity(): number {
    return this.kv.capacity;
  }
  /** Backend bytes of the KV cache (2 · Σ layer rows · kv_heads · head_dim · 4; rings hold fewer rows). */
  get kvBytes(): number {
    return this.kv.bytes;
  }
  /** The shortest length {@link LanguageModel.truncate} keeps besides 0 (see {@link KvCache.truncateFloor}). */
  get truncateFloor(): number {
    return this.kv.truncateFloor;
  }

  /**
   * Run `ids` at positions [cached, cached + n) in one forward and return f32 logits [1, vocab] of the
   * last row ([n, vocab] with `allLogits`); see {@link CausalLM.step}. The caller frees the result.
   * @throws TpError E_ARG for ids that are not an array, an empty list, an id outside [0, vocab_size),
   *   or a full context window (nothing is written); E_STATE after dispose; backend errors (E_OOM,
   *   E_UNSUPPORTED for a weight format)
   */
  step(ids: Int32Array | readonly number[], options: StepOptions = {}): Tensor {
    return this.#steps(ids, options, null).logits;
  }

  /**
   * {@link LanguageModel.step} that also returns hidden states of every new row from the same forward
   * (the KV cache written as by `step`): what a drafter reading the target's own features needs (EAGLE-3,
   * speculative.ts). `collect` as {@link ForwardOptions.collect}: hidden_states[k], k in
   * [0, num_hidden_layers], distinct.
   * @returns logits as `step` and one f32 tensor [n, hidden_size] per entry of `collect`, in that
   *   order; the caller frees them all
   * @throws TpError as {@link LanguageModel.step}; E_ARG for a `collect` entry out of range or repeated
   */
  stepCollect(
    ids: Int32Array | readonly number[],
    collect: readonly number[],
    options: StepOptions = {},
  ): { logits: Tensor; hidden: Tensor[] } {
    const wanted = collectSet(collect, this.config.num_hidden_layers, "stepCollect");
    const { logits, hidden } = this.#steps(ids, options, wanted);
    return { logits, hidden: collect.map((l) => hidden.get(l) as Tensor) };
  }

  /** `step`, split into forwards the KV cache takes at once, collecting `wanted` (or nothing). */
  #steps(
    ids: Int32Array | readonly number[],
    options: StepOptions,
    wanted: ReadonlySet<number> | null,
  ): { logits: Tensor; hidden: Map<number, Tensor> } {
    this.#assertLive();
    const list = tokenIds(ids, this.config.vocab_size, "step");
    const n = list.length;
    const cached = this.kv.length;
    if (cached + n > this.maxContext) {
      throw new TpError(
        "E_ARG",
        `context window full: ${cached} cached + ${n} new tokens exceed the context of ${this.maxContext} (raise --ctx)`,
      );
    }
    const all = options?.allLogits === true;
    // a placed model's device budget counts one micro-batch of activations (placement.ts)
    const step =
      this.backend instanceof PlacedBackend ? Math.min(this.kv.maxStep, this.#microBatch) : this.kv.maxStep;
    if (n <= step) return this.#step(list, all ? "all" : "last", wanted);
    // a sliding-window ring (or a placed model) takes at most `step` rows per forward: split (as
    // llama.cpp's micro-batches)
    const b = this.backend;
    const parts: Tensor[] = [];
    const hidden = new Map<number, Tensor[]>();
    const freeAll = () => {
      for (const p of parts) b.free(p);
      for (const hs of hidden.values()) for (const h of hs) b.free(h);
    };
    try {
      for (let at = 0; at < n; at += step) {
        const end = Math.min(n, at + step);
        const out = this.#step(list.subarray(at, end), all ? "all" : end === n ? "last" : null, wanted);
        for (const [l, h] of out.hidden) hidden.set(l, [...(hidden.get(l) ?? []), h]);
        if (all || end === n) parts.push(out.logits);
        // head null returns hidden_states[L] itself, which may be collected
        else if (![...out.hidden.values()].includes(out.logits)) b.free(out.logits);
      }
      const join = (ts: Tensor[]) => (ts.length === 1 ? (ts[0] as Tensor) : b.concat(ts, 0));
      const logits = join(parts);
      const joined = new Map<number, Tensor>();
      for (const [l, hs] of hidden) joined.set(l, join(hs));
      if (parts.length > 1) for (const p of parts) b.free(p);
      for (const hs of hidden.values()) if (hs.length > 1) for (const h of hs) b.free(h);
      parts.length = 0; // nothing left for the finally to free
      hidden.clear();
      return { logits, hidden: joined };
    } finally {
      freeAll();
    }
  }

  /** One forward of ids at [cached, cached + n) that the KV cache takes at once, then commit. */
  #step(
    list: Int32Array,
    head: "last" | "all" | null,
    wanted: ReadonlySet<number> | null,
  ): { logits: Tensor; hidden: Map<number, Tensor> } {
    const n = list.length;
    const cached = this.kv.length;
    this.kv.reserve(cached + n);
    const b = this.backend;
    this.state?.begin();
    let out: { logits: Tensor; hidden: Map<number, Tensor> };
    try {
      out = b.scope(() => {
        const pass = new ForwardPass(b, {
          n,
          offset: cached,
          positions: b.upload(positionsFrom(cached, n), [n], "i32", "positions"),
          cache: this.kv,
          state: this.state,
          blocks: this.config.num_hidden_layers,
          head,
          collect: wanted,
        });
        const logits = this.model.forward(b.upload(list, [n], "i32", "input_ids"), pass);
        return { logits, hidden: pass.collected ?? new Map<number, Tensor>() };
      });
    } catch (e) {
      // a half-run forward changed the recurrent state: back to a snapshot (cached may drop)
      if (this.state !== null) this.kv.truncate(this.state.restore(cached));
      throw e;
    }
    this.kv.commit(n);
    this.state?.commit(n);
    return out;
  }

  /**
   * Batched decode: one new token for each of several models over the same weights (the same
   * {@link DecoderModel}, each with its own KV cache) in one forward, so that the projections and the
   * MLP run as [N, hidden_size] matrix products instead of N vector products; attention runs per
   * sequence over its own cache (`ForwardPass.segments`, `attend`). Row i of the result is what
   * `models[i].step([ids[i]])` returns, up to the summation order of the matrix products; every cache
   * grows by one row.
   * @returns f32 logits [N, vocab_size]; the caller frees them
   * @throws TpError E_ARG for no models, a length mismatch, the same model twice, an id outside the
   *   vocabulary or a full context window (nothing is written); E_UNSUPPORTED for models over different
   *   weights or an architecture not in {@link BATCHED_DECODE_ARCHITECTURES}; E_STATE after dispose
   */
  static stepBatch(models: readonly LanguageModel[], ids: readonly number[]): Tensor {
    const n = models.length;
    if (n === 0 || ids.length !== n)
      throw new TpError(
        "E_ARG",
        `stepBatch: ${n} models and ${ids.length} ids; one id per model, at least one`,
      );
    const first = models[0] as LanguageModel;
    if (!BATCHED_DECODE_ARCHITECTURES.has(first.config.architecture))
      throw new TpError(
        "E_UNSUPPORTED",
        `stepBatch: architecture '${first.config.architecture}' is not known to keep its cache use inside attend; batched decode runs ${[...BATCHED_DECODE_ARCHITECTURES].join(", ")}`,
      );
    if (new Set(models).size !== n) throw new TpError("E_ARG", "stepBatch: the same model appears twice");
    for (const m of models) {
      m.#assertLive();
      if (m.model !== first.model)
        throw new TpError(
          "E_UNSUPPORTED",
          "stepBatch: the models must share one set of weights (one DecoderModel)",
        );
      if (m.kv.length + 1 > m.maxContext)
        throw new TpError(
          "E_ARG",
          `context window full: ${m.kv.length} cached + 1 new token exceed the context of ${m.maxContext} (raise --ctx)`,
        );
    }
    const list = tokenIds(ids, first.config.vocab_size, "stepBatch");
    for (const m of models) m.kv.reserve(m.kv.length + 1);
    const b = first.backend;
    const offsets = Int32Array.from(models, (m) => m.kv.length);
    const logits = b.scope(() => {
      const pass = new ForwardPass(b, {
        n,
        offset: 0,
        positions: b.upload(offsets, [n], "i32", "positions"),
        cache: null,
        segments: models.map((m, i) => ({ cache: m.kv, offset: offsets[i] as number })),
        blocks: first.config.num_hidden_layers,
        head: "all",
        collect: null,
      });
      return first.model.forward(b.upload(list, [n], "i32", "input_ids"), pass);
    });
    for (const m of models) m.kv.commit(1);
    return logits;
  }

  /**
   * Hidden states of `ids` at positions 0 … n − 1 in one forward with causal attention and no KV
   * cache (neither read nor written; see {@link ForwardOptions.collect} for which point each index is).
   * @returns one f32 tensor [n, hidden_size] per entry of `collect`, in that order; the caller frees them
   * @throws TpError E_ARG for ids as {@link LanguageModel.step}, or a `collect` entry that is not a
   *   distinct integer in [0, num_hidden_layers], or none; E_STATE after dispose; backend errors
   */
  forward(ids: Int32Array | readonly number[], options: ForwardOptions): Tensor[] {
    this.#assertLive();
    const where = "forward";
    const layers = options.collect;
    const L = this.config.num_hidden_layers;
    const list = tokenIds(ids, this.config.vocab_size, where);
    const n = list.length;
    const wanted = collectSet(layers, L, where);
    const last = Math.max(...wanted);
    const b = this.backend;
    const shape = this.model.recurrent;
    const state = shape === undefined ? null : new RecurrentState(b, shape, 0); // zeros, for this forward only
    try {
      return b.scope(() => {
        const pass = new ForwardPass(b, {
          n,
          offset: 0,
          positions: b.upload(positionsFrom(0, n), [n], "i32", "positions"),
          cache: null,
          state,
          blocks: last,
          head: null,
          collect: wanted,
        });
        const h = this.model.forward(b.upload(list, [n], "i32", "input_ids"), pass); // hidden_states[last]
        return layers.map((l) => (l === last ? h : (pass.collected?.get(l) as Tensor)));
      });
    } finally {
      state?.dispose();
    }
  }

  /**
   * Forget cached tokens from position `len` on. A hybrid model (recurrent state) goes back to its
   * newest snapshot at or before `len`, so `cached` may end below `len`: read it afterwards.
   * @throws TpError E_ARG outside [0, cached]; E_STATE
   */
  truncate(len: number): void {
    this.#assertLive();
    if (this.state === null) {
      this.kv.truncate(len);
      return;
    }
    if (!Number.isSafeInteger(len) || len < 0 || len > this.kv.length) {
      throw new TpError("E_ARG", `truncate: length must be in [0, ${this.kv.length}], got ${len}`);
    }
    this.kv.truncate(this.state.restore(len));
  }

  /**
   * Keep the recurrent state at the current position, so that a later {@link truncate} can return
   * here (the end of a turn's prompt); nothing for a pure transformer, whose cache truncates freely.
   * @throws TpError E_STATE after dispose; E_OOM
   */
  snapshot(): void {
    this.#assertLive();
    this.state?.snapshot();
  }

  /** Backend bytes of the recurrent state and its snapshots (0 for a pure transformer). */
  get stateBytes(): number {
    return this.state?.bytes ?? 0;
  }

  /** Free the KV cache and the uploaded weights, and close the checkpoint's mappings. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.kv.dispose();
    this.state?.dispose();
    freeTensors(this.backend, this.model.weights);
    if (this.backend instanceof PlacedBackend) this.backend.releaseWeights();
    this.#onDispose?.();
  }

  #assertLive(): void {
    if (this.#disposed) throw new TpError("E_STATE", "the model was disposed");
  }
}

/**
 * Per layer with KV rows (not `linear_attention`), the sliding window of a `sliding_attention` layer or 0 (config.layer_types; all 0 when
 * absent). @throws TpError E_FORMAT for a layer_types list of another length or without a window
 */
export function slidingWindows(c: LlmConfig): number[] {
  const types = c.layer_types;
  if (types === undefined) return [];
  const w = c.sliding_window ?? 0;
  if (types.length !== c.num_hidden_layers || (w < 1 && types.includes("sliding_attention"))) {
    throw new TpError(
      "E_FORMAT",
      `layer_types has ${types.length} entries for ${c.num_hidden_layers} layers (sliding_window ${w})`,
    );
  }
  // linear-attention layers (Qwen 3.5) keep no KV rows: one entry per layer that does
  return types.filter((t) => t !== "linear_attention").map((t) => (t === "sliding_attention" ? w : 0));
}

/**
 * hidden_states indices checked: distinct integers in [0, layers], at least one.
 * @throws TpError E_ARG naming the entry point and the bad entry
 */
function collectSet(collect: readonly number[], layers: number, where: string): Set<number> {
  const wanted = new Set<number>();
  for (const l of collect) {
    if (!Number.isSafeInteger(l) || l < 0 || l > layers || wanted.has(l)) {
      throw new TpError(
        "E_ARG",
        `${where}: layer ${l} must be a distinct integer in [0, ${layers}] (the input of layer k; ${layers} = after the last block)`,
      );
    }
    wanted.add(l);
  }
  if (wanted.size === 0) throw new TpError("E_ARG", `${where}: no layers asked for`);
  return wanted;
}

/** i32 positions from, from + 1, …, from + n − 1. */
function positionsFrom(from: number, n: number): Int32Array {
  const p = new Int32Array(n);
  for (let i = 0; i < n; i++) p[i] = from + i;
  return p;
}

/** Free every live Tensor in plain objects and arrays (a model's weights). */
export function freeTensors(backend: Backend, v: unknown): void {
  if (v instanceof Tensor) {
    if (!v.storage.freed) backend.free(v);
    return;
  }
  if (Array.isArray(v)) {
    for (const x of v) freeTensors(backend, x);
    return;
  }
  if (typeof v !== "object" || v === null) return;
  const proto = Object.getPrototypeOf(v);
  if (proto !== Object.prototype && proto !== null) return;
  for (const k in v) freeTensors(backend, (v as Record<string, unknown>)[k]);
}
