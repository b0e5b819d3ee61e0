/**
 * Speculative decoding: a drafter proposes a few tokens, the target model checks them all in one
 * forward over `[pending, d_1 … d_m]` (m + 1 logit rows), the accepted prefix is kept and the rejected
 * tail is rolled back by truncating the KV cache. Lossless: with greedy sampling the output is the
 * vanilla output token for token; with sampling every token is distributed as the vanilla sampler's.
 *
 * The rule (../shared/spec/llm.md §7.4, the "lossless verification" paragraph; Leviathan, Kalman &
 * Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023, with a deterministic
 * drafter, q = δ(d_i)): left to right, with P_i the fully processed sampling distribution of row i
 * (penalties over the context up to that row, temperature, top-k, top-p, min-p — the {@link Sampler}'s
 * own `distribution`), accept d_i with probability P_i(d_i); on the first rejection draw the
 * replacement from P_i with d_i removed and renormalised (max(P − q, 0) normalised, for q = δ(d_i)),
 * truncate the cache past the accepted prefix and stop; when all m are accepted the last row gives a
 * bonus token. At temperature ≤ 0, accept iff d_i is the sampler's greedy choice (its argmax after
 * penalties). So P(token) = P_i(d)·[token = d] + (1 − P_i(d))·P_i(token)/(1 − P_i(d))·[token ≠ d]
 * = P_i(token): the same law as vanilla.
 *
 * Draft length per round: at most min(max_draft = 16, budget − 1, room in the context window − 1)
 * (llm.md §7.4's caps), chosen by the adaptive rule of ./draft-policy.ts (ours): k follows acceptance,
 * and a cost model (moving averages of the wall time of a plain decode step, of the drafter per token
 * and of a verify row, with the running acceptance) drafts only when the expected speed-up pays, else
 * pauses drafting and probes again later — a draft model as slow as the target, or a verify forward
 * of m + 1 rows as dear as m + 1 decode steps, falls back to vanilla decoding. Timing changes how
 * many tokens are drafted, never which are accepted: greedy output is vanilla's whatever the clock;
 * with sampling the law is vanilla's, but which sample a seed gives may vary from run to run (the
 * acceptance draws follow the drafts) unless `adaptive` is false.
 *
 * Drafters: prompt lookup ({@link NgramDrafter}), a draft model ({@link DraftModelDrafter}) and an
 * EAGLE-3 head ({@link Eagle3Drafter}), which reads the target's hidden states: a drafter with `taps`
 * makes the host run every target forward through `stepCollect` and hand it the rows.
 *
 * Rollback: the target's state must be append-only KV rows that `truncate` cuts. Architectures whose
 * state cannot be cut (recurrent/conv state, ring buffers) without a rollback interface are refused
 * (E_UNSUPPORTED, see {@link checkSpeculativeModel}).
 */
import { type Tensor, TpError } from "@tp/tensor";
import type { Tokenizer } from "@tp/tokenizer";
import { DraftPolicy } from "./draft-policy.ts";
import { KvCache } from "./kv-cache.ts";
import type { CausalLM } from "./model.ts";
import { type Eagle3Head, eagle3Taps } from "./models/eagle3.ts";
import { argmax, type Sampler, splitmix64, Xoshiro128 } from "./sampling.ts";

/** Hard cap on drafts per verify step (llm.md §7.4 `max_draft`). */
export const MAX_DRAFT = 16;

/**
 * Proposes tokens that may follow a context. Deterministic given the context (the acceptance rule
 * treats the proposal as having probability 1).
 */
export interface Drafter {
  /** "ngram", "draft", "eagle3" … for summaries. */
  readonly kind: string;
  /**
   * Up to `k` ids that may follow `context` (the prompt, every generated token and the pending one).
   * Fewer or none is fine. Ids outside the target's vocabulary are dropped by the caller.
   */
  propose(context: readonly number[], k: number): number[] | Promise<number[]>;
  /**
   * hidden_states indices of the target the drafter reads (EAGLE-3: the residual stream at three
   * depths), distinct. With them the host runs every target forward (prefill and verify) through
   * {@link CausalLM.stepCollect} and hands the rows to {@link Drafter.observe}.
   */
  readonly taps?: readonly number[];
  /**
   * The tapped hidden states of one target forward: f32 [n, hidden_size] per entry of `taps`, rows for
   * the tokens `ids` at positions [start, start + n). The host frees the tensors after the call.
   */
  observe?(start: number, ids: readonly number[], hidden: readonly Tensor[]): void;
  /** Free what the drafter holds (a draft model's cache). */
  dispose?(): void;
}

/** Options of speculative decoding ({@link GenerateOptions.speculative}). */
export interface SpeculativeOptions {
  drafter: Drafter;
  /** Most drafts per verify step (llama.cpp `--draft-max`, the original's `--spec-k`); 1 … 16. Default 16. */
  draftMax?: number;
  /** A proposal shorter than this is dropped (llama.cpp `--draft-min`); 0 … draftMax. Default 0. */
  draftMin?: number;
  /**
   * Adapt the draft length, and pause drafting when acceptance falls or drafting costs more than it
   * gains (./draft-policy.ts). Default true.
   */
  adaptive?: boolean;
}

/** What speculation did during one answer. */
export interface SpeculativeStats {
  /** The drafter's kind. */
  drafter: string;
  /** Target forwards after the prefill (each verifies 0 … 16 drafts). */
  verifySteps: number;
  /** Drafts sent to verification. */
  drafted: number;
  /** Drafts accepted. */
  accepted: number;
  /** accepted / drafted (0 when nothing was drafted). */
  acceptanceRate: number;
  /** Tokens produced per target forward after the prefill: (accepted + verifySteps) / verifySteps. */
  tokensPerStep: number;
}

/** Check draftMax / draftMin; returns them filled in. @throws TpError E_ARG naming the flag */
export function speculativeLimits(o: SpeculativeOptions): { draftMax: number; draftMin: number } {
  const draftMax = o.draftMax ?? MAX_DRAFT;
  if (!Number.isInteger(draftMax) || draftMax < 1 || draftMax > MAX_DRAFT)
    throw new TpError(
      "E_ARG",
      `--draft-max (--spec-k) must be an integer in [1, ${MAX_DRAFT}], got ${draftMax}`,
    );
  const draftMin = o.draftMin ?? 0;
  if (!Number.isInteger(draftMin) || draftMin < 0 || draftMin > draftMax)
    throw new TpError(
      "E_ARG",
      `--draft-min must be an integer in [0, --draft-max = ${draftMax}], got ${draftMin}`,
    );
  return { draftMax, draftMin };
}

/**
 * Architectures whose `truncate(len)` rolls a verify step back exactly: their whole per-sequence state
 * is KV rows. Gemma 3's sliding-window ring (kv-cache.ts) moves its last W − 1 rows to the front only
 * when a reservation would run past its end, so its {@link CausalLM.truncateFloor} is at most the first
 * position a step writes: the rollback of that step (to at least its first row + 1) is always allowed.
 */
const ROLLBACK_BY_TRUNCATE: ReadonlySet<string> = new Set([
  "llama",
  "qwen3",
  "qwen3moe",
  "qwen3vl",
  "gemma3",
]);

/** Architectures with recurrent state that roll back to a `snapshot()` (see {@link speculativeDecode}). */
const ROLLBACK_BY_SNAPSHOT: ReadonlySet<string> = new Set(["qwen35", "qwen35moe"]);

/**
 * Refuse speculation on a model whose state `truncate` cannot roll back.
 * @throws TpError E_UNSUPPORTED naming the architecture and why
 */
export function checkSpeculativeModel(
  model: Pick<CausalLM, "config" | "file" | "snapshot">,
  role = "target",
): void {
  const arch = model.config.architecture;
  if (ROLLBACK_BY_TRUNCATE.has(arch)) return;
  // recurrent + conv state (Qwen 3.5 / 3.6): a snapshot before each verify step, replay after a rejection
  if (ROLLBACK_BY_SNAPSHOT.has(arch) && typeof model.snapshot === "function") return;
  const why = ROLLBACK_BY_SNAPSHOT.has(arch)
    ? "its recurrent and conv state needs snapshot() to roll back, which this model lacks"
    : "its state is not known to roll back by truncating the KV cache";
  throw new TpError(
    "E_UNSUPPORTED",
    `speculative decoding needs a ${role} model whose rejected drafts can be rolled back; architecture '${arch}' is refused: ${why}`,
    model.file === undefined ? {} : { file: model.file },
  );
}

/**
 * Prompt lookup (n-gram) drafter, no weights: find the longest suffix of the context of length
 * `nMax` down to `nMin` (default 4 … 2; 1-grams excluded, llm.md §7.4) that occurred earlier, take its
 * most recent earlier occurrence, and propose the tokens that followed it.
 */
export class NgramDrafter implements Drafter {
  readonly kind = "ngram";
  readonly nMax: number;
  readonly nMin: number;

  /** @throws TpError E_ARG unless 1 ≤ nMin ≤ nMax ≤ 64 */
  constructor(options: { nMax?: number; nMin?: number } = {}) {
    this.nMax = options.nMax ?? 4;
    this.nMin = options.nMin ?? 2;
    if (
      !Number.isInteger(this.nMin) ||
      !Number.isInteger(this.nMax) ||
      this.nMin < 1 ||
      this.nMax < this.nMin ||
      this.nMax > 64
    )
      throw new TpError(
        "E_ARG",
        `n-gram sizes must satisfy 1 ≤ min ≤ max ≤ 64, got min ${this.nMin}, max ${this.nMax}`,
      );
  }

  /** See {@link Drafter.propose}; O(len · n) per call. */
  propose(context: readonly number[], k: number): number[] {
    const len = context.length;
    for (let n = Math.min(this.nMax, len - 1); n >= this.nMin; n--) {
      // the suffix is context[len-n, len); an earlier occurrence starts at s < len - n
      for (let s = len - n - 1; s >= 0; s--) {
        let j = 0;
        while (j < n && context[s + j] === context[len - n + j]) j++;
        if (j === n) return context.slice(s + n, Math.min(len, s + n + k)) as number[];
      }
    }
    return [];
  }
}

/** Options of a {@link DraftModelDrafter}. */
export interface DraftModelOptions {
  /**
   * Stop the rollout when the draft's probability of its own greedy token falls below this
   * (llama.cpp `--draft-p-min`); 0 … 1, 0 = never. Default 0.75 (llama.cpp's).
   */
  pMin?: number;
  /** Ids at which the rollout stops (the stop token itself is proposed). */
  stopIds?: Iterable<number>;
}

/**
 * A smaller model of the same vocabulary as drafter (llm.md §7.4): its own KV cache, truncated each
 * round to the longest common prefix with the context (one token less when everything is cached, to
 * get fresh logits), the rest prefilled, then a greedy rollout of up to k tokens.
 * Any TpError of the draft model makes the round propose nothing (vanilla decoding goes on).
 */
export class DraftModelDrafter implements Drafter {
  readonly kind = "draft";
  readonly draft: CausalLM;
  readonly pMin: number;
  readonly #stop: Set<number>;
  /** Ids in the draft's cache. */
  #ids: number[] = [];
  /** The last error swallowed (for diagnostics). */
  lastError: unknown = undefined;

  /**
   * @param target the verifying model (vocabulary compared), with its tokenizer when known
   * @throws TpError E_ARG when the vocabularies differ (size, or a token's text when both tokenizers
   *   are given), naming both files; E_UNSUPPORTED from {@link checkSpeculativeModel}
   */
  constructor(
    draft: CausalLM,
    target: { model: Pick<CausalLM, "config" | "file">; tokenizer?: Tokenizer },
    options: DraftModelOptions & { draftTokenizer?: Tokenizer } = {},
  ) {
    checkSpeculativeModel(draft, "draft");
    const name = (m: Pick<CausalLM, "file">, what: string) =>
      m.file === undefined ? what : `${what} ${m.file}`;
    const tv = target.model.config.vocab_size;
    const dv = draft.config.vocab_size;
    if (tv !== dv)
      throw new TpError(
        "E_ARG",
        `vocabulary mismatch: the draft model (${name(draft, "-md")}) has ${dv} tokens, the target (${name(target.model, "-m")}) ${tv}; a draft model must share the target's vocabulary`,
      );
    const a = target.tokenizer;
    const b = options.draftTokenizer;
    if (a !== undefined && b !== undefined) {
      const n = Math.min(a.vocabSize, b.vocabSize);
      if (a.vocabSize !== b.vocabSize)
        throw new TpError(
          "E_ARG",
          `vocabulary mismatch: the draft tokenizer has ${b.vocabSize} tokens, the target's ${a.vocabSize}`,
        );
      for (let i = 0; i < n; i++)
        if (a.tokenText(i) !== b.tokenText(i))
          throw new TpError(
            "E_ARG",
            `vocabulary mismatch: token ${i} is ${JSON.stringify(b.tokenText(i))} in the draft model (${name(draft, "-md")}) and ${JSON.stringify(a.tokenText(i))} in the target (${name(target.model, "-m")})`,
          );
    }
    this.draft = draft;
    this.pMin = options.pMin ?? 0.75;
    if (!(this.pMin >= 0 && this.pMin <= 1))
      throw new TpError("E_ARG", `--draft-p-min must be in [0, 1], got ${this.pMin}`);
    this.#stop = new Set(options.stopIds ?? a?.eog ?? []);
    if (draft.cached > 0) draft.truncate(0);
  }

  async propose(context: readonly number[], k: number): Promise<number[]> {
    try {
      return await this.#propose(context, k);
    } catch (e) {
      if (!(e instanceof TpError)) throw e;
      this.lastError = e;
      this.draft.truncate(0);
      this.#ids = [];
      return [];
    }
  }

  async #propose(context: readonly number[], k: number): Promise<number[]> {
    const draft = this.draft;
    if (context.length === 0 || context.length + k > draft.maxContext) return [];
    let keep = 0;
    const n = Math.min(this.#ids.length, context.length - 1);
    while (keep < n && this.#ids[keep] === context[keep]) keep++;
    if (keep > 0 && keep < (draft.truncateFloor ?? 0)) keep = 0; // a sliding-window ring moved past it
    if (draft.cached > keep) draft.truncate(keep);
    // a draft with recurrent state may go back further, to a snapshot: what it keeps is draft.cached
    this.#ids.length = draft.cached;
    let feed = context.slice(draft.cached) as number[];
    const out: number[] = [];
    for (let first = true; ; first = false) {
      let row: Float32Array | undefined;
      for (let at = 0; at < feed.length; at += 512) {
        const part = feed.slice(at, at + 512);
        using t = draft.step(part);
        this.#ids.push(...part);
        if (at + 512 >= feed.length) row = await readRow(draft, t);
      }
      // the next round's common prefix reaches at least the context: a recurrent draft keeps it
      if (first) draft.snapshot?.();
      const best = argmax(row as Float32Array);
      if (this.pMin > 0 && topProbability(row as Float32Array, best) < this.pMin) break;
      out.push(best);
      if (out.length >= k || this.#stop.has(best)) break;
      feed = [best];
    }
    return out;
  }

  dispose(): void {
    this.draft.truncate(0);
    this.#ids = [];
  }
}

/** Options of an {@link Eagle3Drafter}. */
export interface Eagle3DrafterOptions {
  /**
   * The target's hidden_states indices feeding fc, three (they may repeat); default the head's
   * config (`Eagle3Config.taps`), else {@link eagle3Taps} of the target's depth (llm.md §7.4).
   */
  taps?: readonly number[];
  /** Ids at which the rollout stops (the stop token itself is proposed). */
  stopIds?: Iterable<number>;
}

/**
 * The EAGLE-3 drafter (llm.md §7.4; models/eagle3.ts): the target's own hidden states at three depths,
 * fused by the head's fc, are kept per position (every target forward runs through `stepCollect`
 * and hands its rows to {@link Eagle3Drafter.observe}); each proposal first grounds the head's KV cache
 * on the real pairs (feature of position p, token p + 1) it has not seen — after a verify step, the
 * accepted rows and the pending token — then rolls out k − 1 more steps feeding the head's own output
 * as the next feature and its draft id (mapped through d2t) as the next token. The rolled-out KV rows
 * are dropped at the next proposal. The k draft ids are read in one transfer at the end. Any TpError
 * makes the round propose nothing (vanilla decoding goes on).
 */
export class Eagle3Drafter implements Drafter {
  readonly kind = "eagle3";
  readonly head: Eagle3Head;
  /** Distinct hidden_states indices the host collects. */
  readonly taps: readonly number[];
  /** Per fc input (three), its index in {@link Eagle3Drafter.taps}. */
  readonly #order: number[];
  readonly #cache: KvCache;
  readonly #stop: Set<number>;
  readonly #maxContext: number;
  /** f32 [capacity, H]: the fused feature of each observed position. */
  #feat: Tensor | null = null;
  /** The token at each position whose fused feature is in #feat (−1: none). */
  #featIds: number[] = [];
  /** Per head KV row p: the token p + 1 it was grounded with, −1 for a rolled-out row. */
  #headIds: number[] = [];
  /** The last error swallowed (for diagnostics). */
  lastError: unknown = undefined;

  /**
   * @throws TpError E_ARG when the head's vocabulary or width does not fit the target's, or a tap is
   *   outside [0, num_hidden_layers]; E_UNSUPPORTED when the target cannot tap its hidden states
   *   (no stepCollect) or cannot roll back ({@link checkSpeculativeModel})
   */
  constructor(head: Eagle3Head, target: CausalLM, options: Eagle3DrafterOptions = {}) {
    checkSpeculativeModel(target);
    const tc = target.config;
    const where = { file: head.file };
    if (typeof target.stepCollect !== "function")
      throw new TpError(
        "E_UNSUPPORTED",
        `--spec-type eagle3: the target (architecture '${tc.architecture}') cannot return its hidden states from a cached forward`,
        where,
      );
    if (head.config.vocab_size !== tc.vocab_size || head.config.target_hidden_size !== tc.hidden_size)
      throw new TpError(
        "E_ARG",
        `the EAGLE-3 head was built for a vocabulary of ${head.config.vocab_size} and width ${head.config.target_hidden_size}; the target has ${tc.vocab_size} and ${tc.hidden_size}`,
        where,
      );
    const L = tc.num_hidden_layers;
    const taps = options.taps ?? head.config.taps ?? eagle3Taps(L);
    if (taps.length !== 3 || taps.some((t) => !Number.isInteger(t) || t < 0 || t > L))
      throw new TpError(
        "E_ARG",
        `EAGLE-3 taps must be three hidden_states indices in [0, ${L}], got [${taps.join(", ")}]`,
        where,
      );
    this.taps = [...new Set(taps)];
    this.#order = taps.map((t) => this.taps.indexOf(t));
    this.head = head;
    this.#maxContext = target.maxContext;
    this.#cache = new KvCache(head.backend, {
      layers: 1,
      numKvHeads: head.config.num_key_value_heads,
      headDim: head.config.head_dim,
      maxContext: target.maxContext,
      minRows: Math.min(target.maxContext, 1024),
    });
    this.#stop = new Set(options.stopIds ?? []);
  }

  /** See {@link Drafter.observe}: fuse the taps (fc) and keep the rows by position. */
  observe(start: number, ids: readonly number[], hidden: readonly Tensor[]): void {
    const b = this.head.backend;
    const n = ids.length;
    const feat = this.#reserve(start + n);
    b.scope(() =>
      b.set(feat.slice(0, start, start + n), this.head.fuse(this.#order.map((i) => hidden[i] as Tensor))),
    );
    if (this.#featIds.length > start) this.#featIds.length = start;
    while (this.#featIds.length < start) this.#featIds.push(-1);
    this.#featIds.push(...ids);
  }

  /** #feat with at least `rows` rows (grown ×2, the rows kept). */
  #reserve(rows: number): Tensor {
    const b = this.head.backend;
    const old = this.#feat;
    const cap = old === null ? 0 : (old.shape[0] as number);
    if (rows <= cap && old !== null) return old;
    const next = Math.min(this.#maxContext, Math.max(rows, 2 * cap, 256));
    const t = b.persist(b.alloc([next, this.head.config.hidden_size], "f32", "eagle3_features"));
    if (old !== null) {
      b.set(t.slice(0, 0, cap), old);
      b.free(old);
    }
    this.#feat = t;
    return t;
  }

  async propose(context: readonly number[], k: number): Promise<number[]> {
    try {
      return await this.#propose(context, k);
    } catch (e) {
      if (!(e instanceof TpError)) throw e;
      this.lastError = e;
      this.#cache.truncate(0);
      this.#headIds = [];
      return [];
    }
  }

  async #propose(context: readonly number[], k: number): Promise<number[]> {
    const L = context.length;
    const feat = this.#feat;
    if (L < 2 || k < 1 || feat === null) return [];
    // the target's features must cover positions 0 … L − 2, for these very tokens
    let valid = 0;
    const lim = Math.min(this.#featIds.length, L - 1);
    while (valid < lim && this.#featIds[valid] === context[valid]) valid++;
    if (valid < L - 1) return [];
    // head rows still grounded: pair p = (feature p, token p + 1) with the same tokens; the last one is
    // always recomputed (its output starts the rollout)
    let keep = 0;
    const hl = Math.min(this.#headIds.length, L - 2);
    while (keep < hl && this.#headIds[keep] === context[keep + 1]) keep++;
    if (this.#cache.length > keep) this.#cache.truncate(keep);
    this.#headIds.length = keep;
    const n = L - 1 - keep;
    const steps = Math.min(k, this.#maxContext - (L - 1) + 1);
    if (steps < 1) return [];
    const b = this.head.backend;
    const head = this.head;
    const cache = this.#cache;
    const picked = b.scope(() => {
      const ids = b.upload(Int32Array.from(context.slice(keep + 1, L)), [n], "i32", "eagle3_ids");
      const pos = b.upload(
        Int32Array.from({ length: n }, (_, i) => keep + 1 + i),
        [n],
        "i32",
        "eagle3_positions",
      );
      cache.reserve(keep + n);
      let { out, logits } = head.forward(head.embed(ids), feat.slice(0, keep, L - 1), pos, cache);
      cache.commit(n);
      let g = out.slice(0, n - 1, n); // [1, H]: the feature of the first rollout step
      let id = b.argmax(logits.slice(0, n - 1, n)); // i32 [1], a draft id
      const picks = [id];
      for (let s = 1; s < steps; s++) {
        cache.reserve(cache.length + 1);
        const p = b.upload(Int32Array.of(L - 1 + s), [1], "i32", "eagle3_positions");
        ({ out, logits } = head.forward(head.embedDraft(id), g, p, cache));
        cache.commit(1);
        g = out;
        id = b.argmax(logits);
        picks.push(id);
      }
      return picks.length === 1 ? (picks[0] as Tensor) : b.concat(picks, 0);
    });
    this.#headIds.push(...context.slice(keep + 1, L));
    for (let s = 1; s < steps; s++) this.#headIds.push(-1);
    let draft: ArrayLike<number>;
    try {
      draft = (await b.read(picked)) as Int32Array;
    } finally {
      b.free(picked);
    }
    const out: number[] = [];
    for (let i = 0; i < draft.length; i++) {
      const t = head.draftToTarget[draft[i] as number];
      if (t === undefined) break;
      out.push(t);
      if (this.#stop.has(t)) break;
    }
    return out;
  }

  /** Free the head's KV cache and the kept features (the head's weights stay: {@link Eagle3Head.dispose}). */
  dispose(): void {
    this.#cache.dispose();
    if (this.#feat !== null) this.head.backend.free(this.#feat);
    this.#feat = null;
    this.#featIds = [];
    this.#headIds = [];
  }
}

/** The f32 row of a [1, vocab] logits tensor, checked finite. */
async function readRow(model: CausalLM, t: Tensor): Promise<Float32Array> {
  const data = await model.backend.read(t);
  if (!(data instanceof Float32Array))
    throw new TpError("E_INTERNAL", `the draft model returned ${t.dtype} logits`);
  for (let i = 0; i < data.length; i++)
    if (!Number.isFinite(data[i] as number))
      throw new TpError("E_NUMERIC", "the draft model's logits are not finite");
  return data;
}

/** softmax(row)[best] in f64. */
function topProbability(row: Float32Array, best: number): number {
  const m = row[best] as number;
  let s = 0;
  for (let i = 0; i < row.length; i++) s += Math.exp((row[i] as number) - m);
  return 1 / s;
}

/** What the verify forward gives back: per-row argmaxes (plain greedy on a device) or the full rows. */
export type VerifyRows = { argmax: number[] } | { rows: Float32Array[] };

/**
 * What {@link speculativeDecode} needs from the generation session (generate.ts): the emission rules
 * of the vanilla loop and a forward that keeps the session's record of cached ids.
 */
export interface SpeculativeHost {
  model: CausalLM;
  sampler: Sampler;
  /** Prompt + generated ids; the host's `emit` appends to it. */
  context: number[];
  /** The first token, chosen from the prefill's logits by the vanilla path. */
  first: number;
  /**
   * Emit a chosen token as the vanilla loop does (stop id ⇒ not appended; append, stream; budget;
   * context window). Returns false when generation ends with it.
   */
  emit(id: number): boolean;
  /** Tokens still wanted (maxNewTokens − generated). */
  remaining(): number;
  /** Forward `ids` (appending to the cache) and read every row (checked finite). */
  forward(ids: number[]): Promise<VerifyRows>;
  /**
   * Truncate the cache (and the host's record of cached ids) to `len`; returns the length kept, which
   * a model that rolls back to snapshots (recurrent state) may leave below `len`.
   */
  truncate(len: number): number;
  /** Run `ids` through the model without reading logits (replaying tokens after a snapshot restore). */
  feed(ids: number[]): void;
  /** Before each forward: false to stop (abort). */
  proceed(): Promise<boolean>;
}

/**
 * The decode loop with speculation (see the module doc). Returns the statistics; the host's result
 * and context hold the tokens.
 */
export async function speculativeDecode(
  h: SpeculativeHost,
  options: SpeculativeOptions,
): Promise<SpeculativeStats> {
  const { draftMax, draftMin } = speculativeLimits(options);
  const adaptive = options.adaptive ?? true;
  const model = h.model;
  const vocab = model.config.vocab_size;
  const sampler = h.sampler;
  const greedy = sampler.params.temperature <= 0;
  // The acceptance draws: a stream of their own, derived from the sampler's seed.
  const rng = new Xoshiro128(splitmix64(BigInt.asUintN(64, sampler.seed ^ 0x5bec5bec5bec5becn))[1]);
  const stats: SpeculativeStats = {
    drafter: options.drafter.kind,
    verifySteps: 0,
    drafted: 0,
    accepted: 0,
    acceptanceRate: 0,
    tokensPerStep: 0,
  };
  const policy = new DraftPolicy(draftMax, adaptive);
  let pending = h.first;
  /** Tokens emitted and committed but not in the cache (a snapshot restore went back past them). */
  let replay: number[] = [];
  for (;;) {
    if (!h.emit(pending)) break;
    if (!(await h.proceed())) break;
    if (replay.length > 0) {
      h.feed(replay);
      replay = [];
    }
    const room = model.maxContext - model.cached - 1; // drafts that fit after the pending token
    const m = policy.plan(Math.min(h.remaining() - 1, room));
    let drafts: number[] = [];
    if (m > 0) {
      drafts = (await options.drafter.propose(h.context, m)).slice(0, m);
      const bad = drafts.findIndex((d) => !Number.isInteger(d) || d < 0 || d >= vocab);
      if (bad >= 0) drafts.length = bad;
      if (drafts.length < draftMin) drafts = [];
    }
    policy.proposed(drafts.length);
    const base = model.cached;
    // a model with recurrent state keeps a snapshot here, the point a rejection returns to
    if (drafts.length > 0) model.snapshot?.();
    const out = await h.forward([pending, ...drafts]);
    stats.verifySteps++;
    stats.drafted += drafts.length;
    let accepted = 0;
    let next = -1;
    let ended = false;
    for (let i = 0; i <= drafts.length; i++) {
      const d = i < drafts.length ? (drafts[i] as number) : -1;
      let choice: number;
      if ("argmax" in out) choice = out.argmax[i] as number;
      else {
        const row = out.rows[i] as Float32Array;
        if (greedy || d < 0) choice = sampler.sample(row, h.context);
        else {
          const dist = sampler.distribution(row, h.context);
          const at = dist.ids.indexOf(d);
          const p = at < 0 ? 0 : (dist.probs[at] as number);
          choice = p > 0 && rng.nextDouble() < p ? d : residualDraw(dist.ids, dist.probs, at, rng);
        }
      }
      if (d >= 0 && choice === d) {
        accepted++;
        if (!h.emit(d)) {
          ended = true;
          break;
        }
        continue;
      }
      next = choice;
      break;
    }
    stats.accepted += accepted;
    if (!ended && model.cached > base + 1 + accepted) {
      const keep = base + 1 + accepted; // the pending token and the accepted drafts
      if (keep < (model.truncateFloor ?? 0))
        throw new TpError(
          "E_INTERNAL",
          `speculative rollback to ${keep} is below the cache's truncate floor ${model.truncateFloor}`,
        );
      const kept = h.truncate(keep);
      // positions are context indices: the cache holds a prefix of the context
      if (kept < keep) replay = h.context.slice(kept, keep);
    }
    policy.verified(accepted);
    if (ended) break;
    pending = next;
  }
  stats.acceptanceRate = stats.drafted > 0 ? stats.accepted / stats.drafted : 0;
  stats.tokensPerStep = stats.verifySteps > 0 ? (stats.accepted + stats.verifySteps) / stats.verifySteps : 0;
  return stats;
}

/**
 * Draw from `probs` with entry `skip` removed and the rest renormalised (the residual of a rejected
 * draft); `skip` < 0 removes nothing.
 */
function residualDraw(ids: Int32Array, probs: Float64Array, skip: number, rng: Xoshiro128): number {
  let total = 0;
  for (let i = 0; i < probs.length; i++) if (i !== skip) total += probs[i] as number;
  if (!(total > 0)) throw new TpError("E_INTERNAL", "speculative residual draw: no probability mass left");
  const r = rng.nextDouble() * total;
  let cum = 0;
  let last = -1;
  for (let i = 0; i < probs.length; i++) {
    if (i === skip) continue;
    cum += probs[i] as number;
    last = i;
    if (r < cum) return ids[i] as number;
  }
  return ids[last] as number;
}
