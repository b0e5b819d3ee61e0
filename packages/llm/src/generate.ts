/**
 * The generation engine: a {@link GenerationSession} owns a {@link CausalLM} (with its KV cache) and
 * knows which token ids the cache holds, so that each call prefills only the part of a prompt that is
 * not cached yet, samples token after token, streams complete UTF-8 text, and stops on an
 * end-of-generation token, the token budget, an abort signal or a full context window.
 *
 * Source: ../shared/spec/llm.md §7.1 (the loop of Z-llm `engine.zig`: prefill the uncached suffix →
 * sample → repeat { cancel? sample; stop token ⇒ break, not appended; append; stream through the UTF-8
 * holdback; budget spent ⇒ break, skipping the forward nobody reads; context full ⇒ stop; step }),
 * §5.3 step 3 (longest common prefix with the cache, rewind by truncation), §6.1 (per-turn seeds from
 * splitmix64 over a base seed).
 */
import { explainNonFiniteWeights } from "@tp/formats";
import { nonFiniteError, type Tensor, TpError } from "@tp/tensor";
import type { StreamDecoder, Tokenizer } from "@tp/tokenizer";
import type { CausalLM } from "./model.ts";
import { argmax, Sampler, type SamplerOptions, splitmix64 } from "./sampling.ts";
import {
  checkSpeculativeModel,
  type Drafter,
  type SpeculativeOptions,
  type SpeculativeStats,
  speculativeDecode,
  type VerifyRows,
} from "./speculative.ts";

/** Why a {@link GenerationSession.generate} call ended. */
export type StopReason =
  /** An end-of-generation token (eos/eot or one of `stopIds`) was sampled; it is not in `ids`. */
  | "eos"
  /** `maxNewTokens` tokens were generated. */
  | "length"
  /** The abort signal fired (Ctrl-C); `ids`/`text` hold what was generated before. */
  | "abort"
  /** The context window (`model.maxContext`, `--ctx`) filled up while generating. */
  | "context";

/** Options of {@link GenerationSession.generate}. */
export interface GenerateOptions {
  /**
   * A ready {@link Sampler} (used as is, its random stream continues), or sampler options. With
   * options and no `seed`, the turn's seed is the next value of the session's seed sequence
   * (splitmix64 over the session's base seed, llm.md §6.1), so a fixed base seed reproduces a whole
   * session while two turns never share a stream. Default: greedy (temperature 0).
   */
  sampling?: Sampler | SamplerOptions;
  /** Most new tokens to generate (≥ 1). Default 256. */
  maxNewTokens?: number;
  /** Ids that end the answer (not appended). Default: the tokenizer's end-of-generation set (eos, eot, …). */
  stopIds?: Iterable<number>;
  /** Stops the current answer (stopReason "abort"); checked before each forward and between prefill chunks. */
  signal?: AbortSignal;
  /** Receives the answer's text as it becomes complete UTF-8 (never half a multi-byte character). */
  onText?: (text: string) => void;
  /** Receives each generated id, before its text. */
  onToken?: (id: number) => void;
  /** Prefill at most this many rows per forward (bounds activation memory). Default 512. */
  prefillChunk?: number;
  /**
   * Sees (and may change) the full f32 logits row [vocab] of each position before the sampler draws
   * from it: set entries to −∞ to forbid tokens (constrained decoding), or read it for log-probs.
   * `context` is the prompt plus the ids generated so far. With it set the whole row is always read
   * back (no device argmax / top-k shortcut). A row left with nothing above −∞ is E_ARG from the sampler.
   */
  logitsProcessor?: (logits: Float32Array, context: readonly number[]) => void;
  /**
   * Decode speculatively with this drafter (speculative.ts, llm.md §7.4): the same tokens as without
   * it at temperature 0, the same distribution when sampling. Not with `logitsProcessor` (E_UNSUPPORTED).
   */
  speculative?: SpeculativeOptions;
  /**
   * Runs each one-token forward (a decode step at the end of the cache) instead of
   * `model.step([id])`, e.g. batched with other sequences' steps (`LanguageModel.stepBatch`). It must
   * append the token to this session's model's cache as `step` does and resolve to f32 logits
   * [1, vocab], which the session frees.
   */
  decodeStep?: (id: number) => Promise<Tensor>;
}

/** What one {@link GenerationSession.generate} call produced. */
export interface GenerateResult {
  /** Generated ids, stop token excluded. */
  ids: number[];
  /** Their text: special (CONTROL/UNKNOWN) tokens skipped, the continuation of the prompt's text. */
  text: string;
  /** Length of the prompt given. */
  promptTokens: number;
  /** Prompt tokens whose keys/values were already cached (common prefix with the previous call). */
  reusedTokens: number;
  /** Prompt tokens run through the model (`promptTokens − reusedTokens`). */
  prefillTokens: number;
  /** Wall seconds of the prefill, logits read included. */
  promptSeconds: number;
  /** Wall seconds from the end of the prefill to the end of the call (decode forwards and sampling). */
  genSeconds: number;
  stopReason: StopReason;
  /** The seed of the sampler used (u64; irrelevant at temperature 0). */
  seed: bigint;
  /** With `speculative`: drafts, acceptance and tokens per verify step. */
  speculative?: SpeculativeStats;
}

/** Options of {@link GenerationSession}. */
export interface GenerationSessionOptions {
  /** Base of the per-turn seed sequence (any integer, mod 2^64). Default: the wall clock. */
  seed?: number | bigint;
}

/** Prefill tokens per second and generated tokens per second of a result (0 when nothing was timed). */
export function tokensPerSecond(r: GenerateResult): { prompt: number; generation: number } {
  return {
    prompt: r.promptSeconds > 0 ? r.prefillTokens / r.promptSeconds : 0,
    generation: r.genSeconds > 0 ? r.ids.length / r.genSeconds : 0,
  };
}

/**
 * Check that a prompt of `promptTokens` leaves room to generate in `model`'s context window
 * (llm.md §7.1: a prompt ≥ max_context is an error).
 * @throws TpError E_ARG "context window full", naming --ctx
 */
export function checkPromptFits(model: Pick<CausalLM, "maxContext" | "config">, promptTokens: number): void {
  if (promptTokens >= model.maxContext)
    throw new TpError(
      "E_ARG",
      `context window full: the prompt has ${promptTokens} tokens and the context window holds ` +
        `${model.maxContext}; raise --ctx (up to the model's ${model.config.max_position_embeddings}) ` +
        "or shorten the prompt",
    );
}

/**
 * The error for a logits row that holds NaN or ±∞: the weights (or the computation) are broken, and
 * neither greedy nor sampling can pick a token. The reason is the model file's first NaN / ∞ tensor,
 * found by a scan of its mapped bytes made only now.
 */
function nonFiniteLogits(model: CausalLM, position: number, count: number): TpError {
  return nonFiniteError(
    {
      stage: `logits at position ${position}`,
      ...(model.file === undefined ? {} : { file: model.file }),
      explain: () => explainNonFiniteWeights([{ what: "model", path: model.file }], false),
    },
    count,
    model.config.vocab_size,
  );
}

/** Length of the longest common prefix of `a` and `b`. */
export function commonPrefixLength(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Resolve after one turn of the event loop (timers, I/O and signal handlers get to run). */
function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** What {@link GenerationSession} reads back after a forward: the argmax, the top candidates, or the row. */
interface ReadMode {
  argmax?: boolean;
  /** With `k`: read the `k` largest logits, used when they suffice for this sampler. */
  sampler?: Sampler;
  k?: number;
}

/** The largest logits of a row and their ids (a backend's topK, read back). */
interface Candidates {
  values: ArrayLike<number>;
  ids: ArrayLike<number>;
}

/** True when the options sample greedily with no penalty (the argmax of the raw logits). */
function plainGreedy(s: Sampler): boolean {
  const p = s.params;
  return (
    p.temperature <= 0 &&
    (p.repeatLastN === 0 || (p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0))
  );
}

/**
 * Forwards between two requested garbage collections. JavaScriptCore counts the memory-mapped
 * checkpoint as heap ("extra memory"), so with a 0.3–0.6 GB file it lets a decode loop's garbage
 * (≈ 1.8 MB per token of op wrappers on the CPU backend) grow by hundreds of MB before it collects,
 * while its concurrent collector thread takes ≈ 7 ms of CPU per token from the thread pool on a
 * 2-core machine. Measured with `bun run bench llm`'s worker (Qwen3-0.6B shapes, 2 threads, tg128),
 * a collection requested every 8 forwards: Q4_0 41 → 52 tok/s and peak RSS 789 → 572 MB; Q8_0 ≈ 33 →
 * 39–40 tok/s (every forward, or every 4, was slower; every 16 no better).
 */
export const GC_EVERY_STEPS = 8;

/**
 * Ask the runtime for a collection without waiting for it, where it offers one: `Bun.gc(false)` (JSC
 * runs its collector; mimalloc gives back freed pages). Elsewhere nothing. Source: Bun's `gc` reference.
 */
function collectYoungGarbage(): void {
  (globalThis as { Bun?: { gc(full: boolean): void } }).Bun?.gc(false);
}

/**
 * A model plus the token ids in its KV cache: the engine of llm.md §7.1 as a library. Not re-entrant —
 * one `generate` at a time (a second concurrent call throws E_STATE).
 *
 * @example
 * const session = new GenerationSession(model, tokenizer, { seed: 42 });
 * const r = await session.generate(tokenizer.encode("Once upon a time", { addSpecial: true }), {
 *   sampling: { temperature: 0.8, topK: 40 }, maxNewTokens: 64, onText: (t) => process.stdout.write(t),
 * });
 */
export class GenerationSession {
  readonly model: CausalLM;
  readonly tokenizer: Tokenizer;
  /** The base seed of the per-turn seed sequence (u64). */
  readonly seed: bigint;
  #seedState: bigint;
  /** Ids whose keys and values are in the cache, in order (length = model.cached). */
  #ids: number[] = [];
  /** Forwards run, for {@link GC_EVERY_STEPS}. */
  #steps = 0;
  #busy = false;
  /** The current call's `decodeStep`. */
  #decodeStep: ((id: number) => Promise<Tensor>) | undefined;
  /** The current call's drafter when it taps the target's hidden states (EAGLE-3), else undefined. */
  #tapper: Drafter | undefined;

  /**
   * @param model a causal LM; its cache must be empty (truncated to 0 here otherwise)
   * @param tokenizer the model's tokenizer (stop ids, text)
   */
  constructor(model: CausalLM, tokenizer: Tokenizer, options: GenerationSessionOptions = {}) {
    this.model = model;
    this.tokenizer = tokenizer;
    this.seed = BigInt.asUintN(64, BigInt(options.seed ?? Date.now()));
    this.#seedState = this.seed;
    if (model.cached > 0) model.truncate(0);
  }

  /** The ids whose keys and values are in the cache (a copy). */
  get cachedIds(): number[] {
    return this.#ids.slice();
  }

  /** The next seed of the per-turn sequence: splitmix64 over the base seed (llm.md §6.1). */
  nextTurnSeed(): bigint {
    const [state, out] = splitmix64(this.#seedState);
    this.#seedState = state;
    return out;
  }

  /** Forget the cache (`/reset`): truncate(0). The seed sequence continues. */
  reset(): void {
    this.model.truncate(0);
    this.#ids = [];
  }

  /**
   * Generate an answer to `promptIds`: reuse the cached common prefix (truncating the rest), prefill
   * the uncached suffix in chunks, then sample until a stop id, `maxNewTokens`, the abort signal or a
   * full context window. The cache keeps the prompt and every generated token that was fed back
   * (all but the last one), so the next call with a longer conversation prefills only what is new.
   * @param promptIds the whole prompt (BOS included where the model needs it), ids in [0, vocab)
   * @returns see {@link GenerateResult}
   * @throws TpError E_ARG for an empty prompt, ids outside the vocabulary (from `model.step`),
   *   maxNewTokens < 1, or a prompt
   *   that fills the context window ("context window full", naming --ctx); E_STATE for a concurrent call;
   *   E_NUMERIC naming the position and the model file when the model produces NaN or infinite logits
   */
  async generate(promptIds: ArrayLike<number>, options: GenerateOptions = {}): Promise<GenerateResult> {
    if (this.#busy) throw new TpError("E_STATE", "GenerationSession.generate is already running");
    this.#busy = true;
    this.#decodeStep = options.decodeStep;
    try {
      return await this.#generate(Array.from(promptIds), options);
    } finally {
      this.#busy = false;
      this.#decodeStep = undefined;
      this.#tapper = undefined;
    }
  }

  async #generate(prompt: number[], options: GenerateOptions): Promise<GenerateResult> {
    const model = this.model;
    const vocab = model.config.vocab_size;
    const maxNew = options.maxNewTokens ?? 256;
    if (!Number.isInteger(maxNew) || maxNew < 1)
      throw new TpError("E_ARG", `maxNewTokens (-n) must be a positive integer, got ${maxNew}`);
    const chunk = options.prefillChunk ?? 512;
    if (!Number.isInteger(chunk) || chunk < 1)
      throw new TpError("E_ARG", `prefillChunk must be a positive integer, got ${chunk}`);
    if (prompt.length === 0) throw new TpError("E_ARG", "the prompt is empty (no token ids)");
    // Ids are checked once, by the model's step (an id outside the vocabulary is E_ARG from there).
    checkPromptFits(model, prompt.length);
    const sampler = this.#sampler(options.sampling);
    const greedy = plainGreedy(sampler);
    const stop = new Set(options.stopIds ?? this.tokenizer.eog);
    const signal = options.signal;
    const spec = options.speculative;
    if (spec !== undefined) {
      if (options.logitsProcessor !== undefined)
        throw new TpError(
          "E_UNSUPPORTED",
          "speculative decoding with a logitsProcessor (constrained decoding) is not supported",
        );
      checkSpeculativeModel(model);
      if (spec.drafter.taps !== undefined) {
        if (typeof model.stepCollect !== "function" || spec.drafter.observe === undefined)
          throw new TpError(
            "E_UNSUPPORTED",
            `drafter ${spec.drafter.kind} reads the target's hidden states, which this model cannot return from a cached forward`,
            model.file === undefined ? {} : { file: model.file },
          );
        this.#tapper = spec.drafter;
      }
    }

    // Reuse the common prefix; at least the last prompt token is run, for its logits.
    let common = Math.min(commonPrefixLength(this.#ids, prompt), prompt.length - 1, model.cached);
    // a sliding-window ring cannot go back before its floor: start over (llm.md §5.3 step 3)
    if (common < model.cached && common < (model.truncateFloor ?? 0)) common = 0;
    if (model.cached > common) model.truncate(common);
    // a model with recurrent state may go back further, to a snapshot: what it keeps is model.cached
    const reused = model.cached;
    this.#ids.length = reused;

    const result: GenerateResult = {
      ids: [],
      text: "",
      promptTokens: prompt.length,
      reusedTokens: reused,
      prefillTokens: 0,
      promptSeconds: 0,
      genSeconds: 0,
      stopReason: "length",
      seed: sampler.seed,
    };
    // Plain greedy on a backend with argmax: only the winning id crosses to the host (llm.md §6.1,
    // "GPU path"), not the vocab-sized logits row. Sampling with top-k and no penalty on a backend
    // with top_k: only the top_k + 1 largest logits cross, unless ties with the k-th reach past them.
    const processor = options.logitsProcessor;
    const deviceArgmax = greedy && processor === undefined && model.backend.supports("argmax", ["f32"]);
    const candidates =
      greedy || processor !== undefined || !model.backend.supports("top_k", ["f32"])
        ? 0
        : sampler.candidateCount(vocab);
    const read: ReadMode = deviceArgmax ? { argmax: true } : candidates > 0 ? { sampler, k: candidates } : {};
    const t0 = performance.now();
    let logits: Float32Array | Candidates | number | null = null;
    for (let at = reused; at < prompt.length; at += chunk) {
      if (signal !== undefined && at > reused) await yieldToEventLoop();
      if (signal?.aborted) {
        result.stopReason = "abort";
        result.promptSeconds = (performance.now() - t0) / 1000;
        return result;
      }
      const part = prompt.slice(at, Math.min(prompt.length, at + chunk));
      const isLast = at + part.length >= prompt.length;
      logits = await this.#step(part, isLast, read);
      result.prefillTokens += part.length;
    }
    model.snapshot?.(); // the end of the prompt: the next turn's common prefix reaches at least here
    const t1 = performance.now();
    result.promptSeconds = (t1 - t0) / 1000;

    const decoder = this.#primedDecoder(prompt);
    const context = prompt.slice(); // prompt + generated, for the penalties
    if (spec !== undefined) {
      const first =
        typeof logits === "number"
          ? logits
          : logits instanceof Float32Array
            ? greedy
              ? argmax(logits)
              : sampler.sample(logits, context)
            : (sampler.sampleFromCandidates(
                (logits as Candidates).values,
                (logits as Candidates).ids,
              ) as number);
      // The vanilla loop's rules for one chosen token (stop id, budget, context window).
      const emit = (id: number): boolean => {
        if (stop.has(id)) {
          result.stopReason = "eos";
          return false;
        }
        result.ids.push(id);
        context.push(id);
        options.onToken?.(id);
        const text = decoder.push(id);
        if (text !== "") {
          result.text += text;
          options.onText?.(text);
        }
        if (result.ids.length >= maxNew) return false;
        if (prompt.length + result.ids.length > model.maxContext) {
          result.stopReason = "context";
          return false;
        }
        return true;
      };
      result.speculative = await speculativeDecode(
        {
          model,
          sampler,
          context,
          first,
          emit,
          remaining: () => maxNew - result.ids.length,
          forward: (ids) => this.#verify(ids, deviceArgmax),
          truncate: (len) => {
            model.truncate(len);
            this.#ids.length = model.cached;
            return model.cached;
          },
          feed: (ids) => {
            for (let at = 0; at < ids.length; at += chunk) {
              const part = ids.slice(at, at + chunk);
              using _logits = model.step(part); // not read: the state is what matters
              this.#ids.push(...part);
            }
          },
          proceed: async () => {
            if (signal !== undefined) await yieldToEventLoop();
            if (signal?.aborted) {
              result.stopReason = "abort";
              return false;
            }
            return true;
          },
        },
        spec,
      );
      // Keep the cache to what vanilla decoding would hold at most: the prompt and the emitted tokens.
      const keep = Math.min(model.cached, prompt.length + result.ids.length);
      if (model.cached > keep && keep >= (model.truncateFloor ?? 0)) {
        model.truncate(keep);
        this.#ids.length = model.cached;
      }
      const rest = decoder.flush();
      if (rest !== "") {
        result.text += rest;
        options.onText?.(rest);
      }
      result.genSeconds = (performance.now() - t1) / 1000;
      return result;
    }
    for (;;) {
      if (signal?.aborted) {
        result.stopReason = "abort";
        break;
      }
      let id: number;
      if (typeof logits === "number") id = logits;
      else if (logits instanceof Float32Array) {
        processor?.(logits, context);
        id = greedy ? argmax(logits) : sampler.sample(logits, context);
      } else {
        const c = logits as Candidates; // #step returns candidates only when they suffice
        id = sampler.sampleFromCandidates(c.values, c.ids) as number;
      }
      if (stop.has(id)) {
        result.stopReason = "eos";
        break;
      }
      result.ids.push(id);
      context.push(id);
      options.onToken?.(id);
      const text = decoder.push(id);
      if (text !== "") {
        result.text += text;
        options.onText?.(text);
      }
      if (result.ids.length >= maxNew) break; // skip the forward nobody reads
      if (model.cached + 1 > model.maxContext) {
        result.stopReason = "context";
        break;
      }
      if (signal !== undefined) {
        // Backends may answer `read` with a settled promise, which yields to microtasks only; a turn of
        // the event loop lets a SIGINT handler (Ctrl-C) run and abort between tokens.
        await yieldToEventLoop();
        if (signal.aborted) {
          result.stopReason = "abort";
          break;
        }
      }
      logits = await this.#step([id], true, read);
    }
    const rest = decoder.flush();
    if (rest !== "") {
      result.text += rest;
      options.onText?.(rest);
    }
    result.genSeconds = (performance.now() - t1) / 1000;
    return result;
  }

  /**
   * Run `ids` through the model; when `wantLogits`, read the last row's f32 logits, or only their
   * argmax (an id) with `read.argmax`, or only its `read.k` largest logits with `read.sampler` when
   * they suffice for that sampler (else the row). Frees what the model returned. Every read row is
   * checked on the backend (`count_nonfinite`, read with the answer: the same check on every backend).
   * @throws TpError E_NUMERIC naming the position and the model file (and its first NaN / ∞ tensor)
   *   when the row holds NaN or ±∞
   */
  async #step(
    ids: number[],
    wantLogits: boolean,
    read: ReadMode,
  ): Promise<Float32Array | Candidates | number | null> {
    const backend = this.model.backend;
    const vocab = this.model.config.vocab_size;
    const model = this.model;
    const decode = this.#decodeStep;
    // the logits, freed when this returns
    using t =
      ids.length === 1 && decode !== undefined && this.#tapper === undefined
        ? await decode(ids[0] as number)
        : this.#forward(ids, false);
    this.#ids.push(...ids);
    if (++this.#steps % GC_EVERY_STEPS === 0) collectYoungGarbage();
    const position = model.cached - 1; // of the row read
    if (!wantLogits) return null;
    const rowStart = t.rank === 2 ? (t.shape[0] as number) - 1 : 0;
    using bad = backend.countNonFinite(t.rank === 2 ? t.slice(0, rowStart, rowStart + 1) : t);
    const check = async (): Promise<void> => {
      const n = (await backend.read(bad))[0] as number;
      if (n !== 0) throw nonFiniteLogits(model, position, n);
    };
    if (read.sampler !== undefined && read.k !== undefined) {
      const top = backend.topK(t, read.k);
      using values = top.values;
      using indices = top.indices;
      const [v, i] = await Promise.all([backend.read(values), backend.read(indices), check()]);
      const c = { values: v.subarray(v.length - read.k), ids: i.subarray(i.length - read.k) } as Candidates;
      if (read.sampler.candidatesSuffice(c.values, c.ids)) return c;
    }
    if (read.argmax) {
      using best = backend.argmax(t);
      const [winner] = await Promise.all([backend.read(best), check()]);
      return Number(winner[winner.length - 1]);
    }
    const [data] = await Promise.all([backend.read(t), check()]);
    if (!(data instanceof Float32Array))
      throw new TpError("E_INTERNAL", `the model returned ${t.dtype} logits; f32 expected`);
    return data.length === vocab ? data : data.subarray(data.length - vocab);
  }

  /**
   * `model.step(ids)`; with a drafter that taps the target (EAGLE-3) the same forward through
   * `stepCollect`, its hidden states handed to the drafter's `observe` and freed.
   */
  #forward(ids: number[], allLogits: boolean): Tensor {
    const model = this.model;
    const tapper = this.#tapper;
    const options = allLogits ? { allLogits } : {};
    if (tapper === undefined || model.stepCollect === undefined) return model.step(ids, options);
    const start = model.cached;
    const { logits, hidden } = model.stepCollect(ids, tapper.taps as readonly number[], options);
    try {
      tapper.observe?.(start, ids, hidden);
    } catch (e) {
      model.backend.free(logits);
      throw e;
    } finally {
      for (const h of hidden) model.backend.free(h);
    }
    return logits;
  }

  /**
   * One verify forward of speculative decoding: run `ids` (the pending token and the drafts), and read
   * every row — only the per-row argmaxes with `argmaxOnly` (plain greedy on a backend with argmax),
   * else the f32 rows. Every row is checked finite on the backend.
   * @throws TpError E_NUMERIC naming the positions and the model file when a row holds NaN or ±∞
   */
  async #verify(ids: number[], argmaxOnly: boolean): Promise<VerifyRows> {
    const model = this.model;
    const backend = model.backend;
    const vocab = model.config.vocab_size;
    using t = this.#forward(ids, true);
    this.#ids.push(...ids);
    if (++this.#steps % GC_EVERY_STEPS === 0) collectYoungGarbage();
    const first = model.cached - ids.length;
    using bad = backend.countNonFinite(t);
    const check = async (): Promise<void> => {
      const n = (await backend.read(bad))[0] as number;
      if (n !== 0) throw nonFiniteLogits(model, first, n);
    };
    if (argmaxOnly) {
      using best = backend.argmax(t);
      const [winners] = await Promise.all([backend.read(best), check()]);
      return { argmax: Array.from(winners as ArrayLike<number>, Number) };
    }
    const [data] = await Promise.all([backend.read(t), check()]);
    if (!(data instanceof Float32Array))
      throw new TpError("E_INTERNAL", `the model returned ${t.dtype} logits; f32 expected`);
    return { rows: ids.map((_, i) => data.subarray(i * vocab, (i + 1) * vocab)) };
  }

  /**
   * A stream decoder that has seen the prompt (its output discarded), so the answer's text is the
   * continuation of the prompt's: SentencePiece's leading space of the first answer token is kept after
   * ordinary text and dropped after a control token, as `decode(prompt + answer)` would do.
   */
  #primedDecoder(prompt: readonly number[]): StreamDecoder {
    const d = this.tokenizer.streamDecoder({ skipSpecial: true });
    // The decoder's only state is the "at a boundary" flag and held bytes: the last few ids suffice.
    for (const id of prompt.slice(-8)) d.push(id);
    d.flush();
    return d;
  }

  #sampler(sampling: GenerateOptions["sampling"]): Sampler {
    if (sampling instanceof Sampler) return sampling;
    const options = sampling ?? { temperature: 0 };
    return new Sampler({ ...options, seed: options.seed ?? this.nextTurnSeed() });
  }
}
