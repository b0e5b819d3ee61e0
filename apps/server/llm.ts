/**
 * The LLM side of the server: one model's weights shared by `parallel` slots, each a KV cache of its
 * own with a {@link GenerationSession} over it, and a bounded FIFO queue in front of them. A request
 * takes the idle slot whose cached tokens share the longest prefix with its prompt (so a follow-up turn
 * or a shared system prompt prefills only the rest: the session truncates the cache to the common
 * prefix), streams its text through the stop strings and the `<think>` split, and gives the slot back.
 * Slots run concurrently by turns: each generation loop yields to the event loop between tokens, so N
 * slots decode round-robin, one token forward each (no batched forward across slots yet).
 *
 * Sources: llama.cpp `tools/server/server.cpp` (slots, `--parallel`, slot selection by the longest
 * common prefix `get_available_slot`, `n_probs`, the `timings` object, stop strings) and the OpenAI
 * API reference (logprobs: `{token, logprob, bytes, top_logprobs}`).
 */
import {
  type CausalLM,
  type ChatTemplate,
  chatPromptIds,
  chatTemplateFor,
  commonPrefixLength,
  GenerationSession,
  LanguageModel,
  type LoadedModel,
} from "@tp/llm";
import type { Backend } from "@tp/tensor";
import type { Tokenizer } from "@tp/tokenizer";
import { DecodeBatcher } from "./batch.ts";
import type { Constraint } from "./constrain.ts";
import { ApiError, badRequest } from "./errors.ts";
import type { ChatRequest, CompletionRequest, GenerationRequest } from "./requests.ts";
import { StopMatcher, ThinkSplitter } from "./text.ts";

/** Options of an {@link LlmEngine}. */
export interface LlmEngineOptions {
  /** The name clients pass as `model`. */
  name: string;
  /** Slots (concurrent sequences), ≥ 1. */
  parallel: number;
  /** Requests that may wait for a slot; one more is answered 503. */
  queueLimit: number;
  /** Tokens per slot (prompt + answer), ≤ the model's trained context. */
  ctx: number;
  /** max_tokens when a request gives none. */
  defaultMaxTokens: number;
  /** "deepseek": `<think>` blocks go to `reasoning_content`; "none": left in the content. */
  reasoningFormat: "deepseek" | "none";
  /** Batch the slots' decode steps into one forward (./batch.ts) where the architecture allows. Default true. */
  batch?: boolean;
}

/** One chosen token's log-probability and the most likely alternatives (OpenAI's logprobs entry). */
export interface TokenLogprob {
  id: number;
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { id: number; token: string; logprob: number; bytes: number[] }[];
}

/** A piece of an answer as it streams. */
export interface AnswerDelta {
  content: string;
  reasoning: string;
  logprobs: TokenLogprob[];
}

/** Why an answer ended, in OpenAI's words. */
export type FinishReason = "stop" | "length" | "tool_calls";

/** A finished answer. */
export interface Answer {
  content: string;
  reasoning: string;
  finishReason: FinishReason;
  /** The client went away (or the server stopped it); nothing is sent. */
  aborted: boolean;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  logprobs: TokenLogprob[];
  promptMs: number;
  predictedMs: number;
  slot: number;
}

/** A slot: a KV cache and its session. */
export interface Slot {
  readonly index: number;
  readonly model: CausalLM;
  readonly session: GenerationSession;
  busy: boolean;
  /** When it last finished, for choosing among equal prefixes. */
  lastUsed: number;
}

/** Counters for /metrics. */
export interface LlmCounters {
  requests: number;
  promptTokens: number;
  cachedTokens: number;
  generatedTokens: number;
  promptSeconds: number;
  generationSeconds: number;
  errors: number;
  rejected: number;
}

interface Waiter {
  prompt: readonly number[];
  resolve: (s: Slot) => void;
  reject: (e: unknown) => void;
}

const utf8 = new TextDecoder("utf-8", { fatal: false });

/** The most likely `n` entries of a row: ids by descending value (ties by ascending id). */
function topEntries(row: Float32Array, n: number): number[] {
  const ids: number[] = [];
  for (let i = 0; i < row.length; i++) {
    const v = row[i] as number;
    if (!(v > Number.NEGATIVE_INFINITY)) continue;
    if (ids.length === n && v <= (row[ids[n - 1] as number] as number)) continue;
    let at = ids.length === n ? n - 1 : ids.length;
    while (at > 0 && (row[ids[at - 1] as number] as number) < v) at--;
    ids.splice(at, 0, i);
    if (ids.length > n) ids.pop();
  }
  return ids;
}

/** log Σ exp(row) over the finite entries, in f64. */
function logSumExp(row: Float32Array): number {
  let m = Number.NEGATIVE_INFINITY;
  for (const v of row) if (v > m) m = v;
  let s = 0;
  for (const v of row) if (v > Number.NEGATIVE_INFINITY) s += Math.exp(v - m);
  return m + Math.log(s);
}

/**
 * A model served by `parallel` slots: {@link LanguageModel}s over the loaded model's weights, each
 * with a KV cache of its own of `ctx` tokens (the loaded model's own cache is never used).
 */
export class LlmEngine {
  readonly options: LlmEngineOptions;
  readonly tokenizer: Tokenizer;
  readonly template: ChatTemplate;
  readonly hasTemplate: boolean;
  readonly backend: Backend;
  readonly slots: Slot[] = [];
  readonly counters: LlmCounters = {
    requests: 0,
    promptTokens: 0,
    cachedTokens: 0,
    generatedTokens: 0,
    promptSeconds: 0,
    generationSeconds: 0,
    errors: 0,
    rejected: 0,
  };
  readonly created = Math.floor(Date.now() / 1000);
  readonly #loaded: LoadedModel;
  readonly #queue: Waiter[] = [];
  /** Tokens per second of the last answer, for /metrics. */
  lastTokensPerSecond = 0;
  /** The decode-step batcher, or null (one slot, `batch: false`, or an architecture it cannot batch). */
  readonly batcher: DecodeBatcher | null;

  /**
   * @param loaded a loaded model; the engine owns it from here (options.ctx ≤ its trained context)
   * @throws TpError E_FORMAT when the chat template does not parse
   */
  constructor(loaded: LoadedModel, options: LlmEngineOptions) {
    this.options = options;
    this.#loaded = loaded;
    this.tokenizer = loaded.tokenizer;
    this.backend = loaded.model.backend;
    this.hasTemplate = this.tokenizer.chatTemplate !== undefined && this.tokenizer.chatTemplate.trim() !== "";
    this.template = chatTemplateFor(this.tokenizer);
    const base = loaded.model;
    this.batcher =
      options.parallel > 1 && options.batch !== false && DecodeBatcher.supports(base.config.architecture)
        ? new DecodeBatcher()
        : null;
    for (let i = 0; i < options.parallel; i++) {
      const model = new LanguageModel(base.model, {
        maxContext: options.ctx,
        ...(base.file ? { file: base.file } : {}),
      });
      this.slots.push({
        index: i,
        model,
        session: new GenerationSession(model, this.tokenizer),
        busy: false,
        lastUsed: 0,
      });
    }
  }

  /** Requests waiting for a slot. */
  get queueDepth(): number {
    return this.#queue.length;
  }

  /** Slots generating now. */
  get busySlots(): number {
    return this.slots.filter((s) => s.busy).length;
  }

  /** Tokens held in all KV caches, and their capacity (ctx per slot). */
  kvUse(): { tokens: number; capacity: number; bytes: number } {
    let tokens = 0;
    let bytes = 0;
    for (const s of this.slots) {
      tokens += s.model.cached;
      bytes += s.model.kvBytes;
    }
    return { tokens, capacity: this.slots.length * this.options.ctx, bytes };
  }

  /** Prompt ids of a chat request, through the model's chat template. @throws ApiError 400 */
  chatPrompt(req: ChatRequest): number[] {
    return this.#checkPrompt(
      chatPromptIds(this.tokenizer, this.template, req.messages, {
        ...(req.enableThinking === undefined ? {} : { enableThinking: req.enableThinking }),
        ...(req.tools === undefined ? {} : { tools: req.tools }),
      }),
    );
  }

  /** Prompt ids of a completion request: the text with BOS as the vocabulary says, special tokens parsed (as llama-server). */
  completionPrompt(req: CompletionRequest): number[] {
    if (typeof req.prompt !== "string") {
      const bad = req.prompt.findIndex((id) => id < 0 || id >= this.tokenizer.vocabSize);
      if (bad >= 0)
        throw badRequest(
          `prompt[${bad}] = ${req.prompt[bad]} is not a token id of this model (0 … ${this.tokenizer.vocabSize - 1})`,
          "prompt",
        );
      return this.#checkPrompt(req.prompt.slice(), "prompt");
    }
    return this.#checkPrompt(
      this.tokenizer.encode(req.prompt, { addSpecial: true, parseSpecial: true }),
      "prompt",
    );
  }

  /** `param`: the request field the prompt came from (messages for chat, prompt for completions). */
  #checkPrompt(ids: number[], param = "messages"): number[] {
    if (ids.length === 0) throw badRequest("the prompt is empty (no tokens)", "prompt");
    if (ids.length >= this.options.ctx)
      throw badRequest(
        `the prompt has ${ids.length} tokens; this server's context is ${this.options.ctx} tokens per slot (--ctx), which must leave room for at least one answer token`,
        param,
        "context_length_exceeded",
      );
    return ids;
  }

  /**
   * A slot for `prompt`: the idle one with the longest cached prefix in common (then the least
   * recently used), or a place in the queue.
   * @throws ApiError 503 when the queue is full; the signal's reason when it aborts while waiting
   */
  acquire(prompt: readonly number[], signal?: AbortSignal): Promise<Slot> {
    const idle = this.slots.filter((s) => !s.busy);
    if (idle.length > 0) {
      let best = idle[0] as Slot;
      let bestLen = -1;
      for (const s of idle) {
        const len = commonPrefixLength(s.session.cachedIds, prompt);
        if (len > bestLen || (len === bestLen && s.lastUsed < best.lastUsed)) {
          best = s;
          bestLen = len;
        }
      }
      best.busy = true;
      return Promise.resolve(best);
    }
    if (this.#queue.length >= this.options.queueLimit) {
      this.counters.rejected++;
      return Promise.reject(
        new ApiError(
          503,
          "unavailable_error",
          `the server is busy: all ${this.slots.length} slots are generating and ${this.#queue.length} requests are queued (--queue-limit); retry later`,
          null,
          "server_busy",
        ),
      );
    }
    return new Promise((resolve, reject) => {
      const w: Waiter = { prompt, resolve, reject };
      this.#queue.push(w);
      signal?.addEventListener(
        "abort",
        () => {
          const i = this.#queue.indexOf(w);
          if (i >= 0) {
            this.#queue.splice(i, 1);
            reject(new ApiError(499, "invalid_request_error", "the client went away while queued"));
          }
        },
        { once: true },
      );
    });
  }

  /** Give a slot back: to the first queued request, else idle. */
  release(slot: Slot): void {
    slot.lastUsed = performance.now();
    const next = this.#queue.shift();
    if (next !== undefined) next.resolve(slot);
    else slot.busy = false;
  }

  /**
   * Generate an answer for `prompt` on `slot`. The answer's text passes the stop strings (the first
   * one found ends it, and is not included), then the `<think>` split; `onDelta` gets each piece with
   * the log-probs of the tokens generated since the previous piece. A model error fails this request
   * only: the slot's cache is reset and the error rethrown.
   * @param signal the client's: aborting it ends the answer (`aborted` true)
   * @param constraint masks each logits row and follows the sampled tokens (constrained decoding)
   */
  async generate(
    slot: Slot,
    prompt: number[],
    req: GenerationRequest,
    onDelta: (d: AnswerDelta) => void,
    signal: AbortSignal,
    constraint?: Constraint | null,
  ): Promise<Answer> {
    const tok = this.tokenizer;
    const stop = new StopMatcher(req.stop);
    const tail = tok.decode(prompt.slice(-4)).trimEnd();
    const split =
      this.options.reasoningFormat === "deepseek" ? new ThinkSplitter(tail.endsWith("<think>")) : null;
    const answer: Answer = {
      content: "",
      reasoning: "",
      finishReason: "length",
      aborted: false,
      promptTokens: prompt.length,
      cachedTokens: 0,
      completionTokens: 0,
      logprobs: [],
      promptMs: 0,
      predictedMs: 0,
      slot: slot.index,
    };
    let pending: TokenLogprob[] = [];
    const emit = (text: string, final = false) => {
      const piece = split === null ? { reasoning: "", content: text } : split.push(text);
      if (final && split !== null) {
        const rest = split.flush();
        piece.reasoning += rest.reasoning;
        piece.content += rest.content;
      }
      answer.content += piece.content;
      answer.reasoning += piece.reasoning;
      if (piece.content !== "" || piece.reasoning !== "" || (final && pending.length > 0)) {
        onDelta({ ...piece, logprobs: pending });
        pending = [];
      }
    };
    const stopper = new AbortController();
    const onAbort = () => stopper.abort();
    signal.addEventListener("abort", onAbort, { once: true });
    let row: Float32Array | null = null;
    let lse = 0;
    let top: number[] = [];
    const n = req.logprobs;
    const entry = (id: number, logprob: number) => {
      const bytes = tok.tokenBytes(id);
      return { id, token: utf8.decode(bytes), logprob, bytes: Array.from(bytes) };
    };
    const maxNew = Math.max(
      1,
      Math.min(req.maxTokens ?? this.options.defaultMaxTokens, this.options.ctx - prompt.length),
    );
    try {
      const r = await slot.session.generate(prompt, {
        sampling: { ...req.sampling, ...(req.seed === undefined ? {} : { seed: req.seed }) },
        maxNewTokens: maxNew,
        signal: stopper.signal,
        ...(req.ignoreEos ? { stopIds: [] } : {}),
        ...(this.batcher === null
          ? {}
          : {
              decodeStep: (id: number) =>
                (this.batcher as DecodeBatcher).decode(slot.model as LanguageModel, id),
            }),
        ...(n === undefined && (constraint === undefined || constraint === null)
          ? {}
          : {
              logitsProcessor: (logits: Float32Array, context: readonly number[]) => {
                if (n !== undefined) {
                  row = logits;
                  lse = logSumExp(logits);
                  top = topEntries(logits, n);
                }
                constraint?.processor(logits, context);
              },
            }),
        onToken: (id) => {
          answer.completionTokens++;
          constraint?.accept(id);
          if (n !== undefined && row !== null) {
            const r0 = row;
            const lp: TokenLogprob = {
              ...entry(id, (r0[id] as number) - lse),
              top_logprobs: top.map((t) => entry(t, (r0[t] as number) - lse)),
            };
            answer.logprobs.push(lp);
            pending.push(lp);
          }
        },
        onText: (t) => {
          const o = stop.push(t);
          emit(o.text);
          if (o.stopped) stopper.abort();
        },
      });
      emit(stop.flush(), true);
      answer.cachedTokens = r.reusedTokens;
      answer.promptMs = r.promptSeconds * 1000;
      answer.predictedMs = r.genSeconds * 1000;
      answer.aborted = r.stopReason === "abort" && !stop.stopped;
      answer.finishReason = stop.stopped || r.stopReason === "eos" ? "stop" : "length";
      const c = this.counters;
      c.requests++;
      c.promptTokens += r.prefillTokens;
      c.cachedTokens += r.reusedTokens;
      c.generatedTokens += r.ids.length;
      c.promptSeconds += r.promptSeconds;
      c.generationSeconds += r.genSeconds;
      if (r.genSeconds > 0) this.lastTokensPerSecond = r.ids.length / r.genSeconds;
      return answer;
    } catch (e) {
      this.counters.errors++;
      slot.session.reset();
      throw e;
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  /** Free every slot's cache and the model. */
  dispose(): void {
    for (const s of this.slots) (s.model as LanguageModel).kv.dispose();
    this.#loaded.model.dispose();
  }
}
