// The generation engine against a fake CausalLM whose logits are derived by hand from the tokens in
// its "cache" (a plain array that step appends to and truncate cuts), on the CPU backend: prefix
// reuse, stop rules, the budget, context overflow, abort, seeds, UTF-8 streaming with SentencePiece
// spaces, and the chat helper re-rendering a conversation with ChatML.
import { afterAll, describe, expect, test } from "bun:test";
import { createBackend } from "@tp/backend-cpu";
import { type Backend, type Tensor, TpError } from "@tp/tensor";
import { ByteVocab, SentencePieceEncoder, spmByteTokenIds, TOKEN_TYPE, Tokenizer } from "@tp/tokenizer";
import { CHATML_TEMPLATE, ChatTemplate } from "./chat.ts";
import { ChatSession } from "./chat-session.ts";
import { commonPrefixLength, GenerationSession, tokensPerSecond } from "./generate.ts";
import type { CausalLM, LlmConfig } from "./model.ts";
import { Sampler } from "./sampling.ts";

// ---------------------------------------------------------------------------------------------- vocab
// ids 0..2 specials, 3..258 the byte tokens <0x00>..<0xFF>, then words.
const WORDS = ["▁Once", "▁upon", "▁a", "▁time", "é", "<|im_start|>", "<|im_end|>", "user", "assistant", "\n"];
const TEXTS = [
  "<unk>",
  "<s>",
  "</s>",
  ...Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`),
  ...WORDS,
];
const V = TEXTS.length;
const id = (t: string): number => {
  const i = TEXTS.indexOf(t);
  if (i < 0) throw new Error(`no token ${t}`);
  return i;
};
const BYTE = (b: number): number => 3 + b;
const BOS = 1;
const EOS = 2;

function makeTokenizer(): Tokenizer {
  const vocab = ByteVocab.fromStrings(TEXTS);
  const types = new Uint8Array(V).fill(TOKEN_TYPE.NORMAL);
  types[0] = TOKEN_TYPE.UNKNOWN;
  types[1] = TOKEN_TYPE.CONTROL;
  types[2] = TOKEN_TYPE.CONTROL;
  for (let b = 0; b < 256; b++) types[BYTE(b)] = TOKEN_TYPE.BYTE;
  types[id("<|im_start|>")] = TOKEN_TYPE.CONTROL;
  types[id("<|im_end|>")] = TOKEN_TYPE.CONTROL;
  const scores = new Float32Array(V).map((_, i) => -i);
  const spm = new SentencePieceEncoder(vocab, scores, spmByteTokenIds(vocab), 0);
  return new Tokenizer({
    source: "test-vocab",
    model: "llama",
    vocab,
    types,
    spm,
    special: { bos: BOS, eos: EOS, unk: 0 },
    addBos: true,
    addEos: false,
    addSpacePrefix: true,
    normalization: null,
  });
}

// ---------------------------------------------------------------------------------------------- model
const backend: Backend = createBackend({ threads: 1 });
afterAll(() => backend.dispose());

/** Logits with `peak` at id `top` (10), 0 elsewhere; or given explicitly. */
function peak(top: number, second?: number): Float32Array {
  const l = new Float32Array(V);
  l[top] = 10;
  if (second !== undefined) l[second] = 9;
  return l;
}

/**
 * A causal LM whose "KV cache" is the list of ids it has seen; the logits of the last row are
 * `rule(history)` for the history up to and including that row. Records every step's ids.
 */
class FakeLM implements CausalLM {
  readonly config: LlmConfig;
  readonly backend = backend;
  readonly maxContext: number;
  readonly history: number[] = [];
  readonly steps: number[][] = [];
  disposed = false;

  constructor(
    readonly rule: (history: readonly number[]) => Float32Array,
    maxContext = 64,
  ) {
    this.maxContext = maxContext;
    this.config = {
      architecture: "fake",
      vocab_size: V,
      hidden_size: 8,
      num_hidden_layers: 1,
      num_attention_heads: 1,
      num_key_value_heads: 1,
      head_dim: 8,
      intermediate_size: 8,
      rms_norm_eps: 1e-6,
      rope_theta: 10000,
      rope_mode: "neox",
      rotary_dim: 8,
      max_position_embeddings: 128,
      tie_word_embeddings: true,
    };
  }
  get cached(): number {
    return this.history.length;
  }
  get capacity(): number {
    return this.maxContext;
  }
  get kvBytes(): number {
    return 0;
  }
  step(ids: Int32Array | readonly number[]): Tensor {
    if (ids.length === 0) throw new TpError("E_ARG", "empty");
    if (this.history.length + ids.length > this.maxContext)
      throw new TpError("E_ARG", "context window full (--ctx)");
    this.steps.push(Array.from(ids));
    this.history.push(...ids);
    return backend.upload(this.rule(this.history), [1, V], "f32");
  }
  truncate(len: number): void {
    this.history.length = len;
  }
  dispose(): void {
    this.disposed = true;
  }
}

/** A model that always predicts `script[cached - offset]` (then EOS). */
function scripted(script: readonly number[], offset: number): (h: readonly number[]) => Float32Array {
  return (h) => peak(script[h.length - offset] ?? EOS);
}

const tok = makeTokenizer();

// ---------------------------------------------------------------------------------------------- tests
describe("GenerationSession", () => {
  test("greedy: prompt prefilled in one forward, tokens fed back one by one, stop id not appended", async () => {
    // prompt [BOS, ▁Once] (2 tokens); the script answers ▁upon ▁a ▁time, then EOS.
    const prompt = [BOS, id("▁Once")];
    const m = new FakeLM(scripted([id("▁upon"), id("▁a"), id("▁time")], 2));
    const s = new GenerationSession(m, tok);
    const pieces: string[] = [];
    const r = await s.generate(prompt, { onText: (t) => pieces.push(t) });
    expect(r.ids).toEqual([id("▁upon"), id("▁a"), id("▁time")]);
    expect(r.stopReason).toBe("eos");
    // the first answer token follows ordinary text, so its SentencePiece space stays
    expect(r.text).toBe(" upon a time");
    expect(pieces.join("")).toBe(" upon a time");
    // forwards: the prompt, then each generated token (the EOS was sampled from ▁time's logits)
    expect(m.steps).toEqual([prompt, [id("▁upon")], [id("▁a")], [id("▁time")]]);
    expect(r.promptTokens).toBe(2);
    expect(r.prefillTokens).toBe(2);
    expect(r.reusedTokens).toBe(0);
    expect(s.cachedIds).toEqual([...prompt, id("▁upon"), id("▁a"), id("▁time")]);
    expect(backend.memory.current).toBe(0); // every logits tensor was freed
  });

  test("logitsProcessor sees each full row with its context and its masking decides the token", async () => {
    // the model always prefers ▁upon; the processor forbids it, so greedy takes the runner-up ▁a,
    // until the context holds two ▁a, when it leaves only EOS.
    const m = new FakeLM(() => peak(id("▁upon"), id("▁a")));
    const seen: number[][] = [];
    const r = await new GenerationSession(m, tok).generate([BOS], {
      logitsProcessor: (row, context) => {
        expect(row.length).toBe(V);
        seen.push(context.slice());
        row[id("▁upon")] = Number.NEGATIVE_INFINITY;
        if (context.filter((t) => t === id("▁a")).length === 2)
          for (let i = 0; i < row.length; i++) if (i !== EOS) row[i] = Number.NEGATIVE_INFINITY;
      },
    });
    expect(r.ids).toEqual([id("▁a"), id("▁a")]);
    expect(r.stopReason).toBe("eos");
    expect(seen).toEqual([[BOS], [BOS, id("▁a")], [BOS, id("▁a"), id("▁a")]]);
  });

  test("decodeStep runs every one-token forward in place of model.step; the answer is the same", async () => {
    const script = [id("▁upon"), id("▁a"), id("▁time")];
    const plain = await new GenerationSession(new FakeLM(scripted(script, 2)), tok).generate([
      BOS,
      id("▁Once"),
    ]);
    const m = new FakeLM(scripted(script, 2));
    const decoded: number[] = [];
    const r = await new GenerationSession(m, tok).generate([BOS, id("▁Once")], {
      decodeStep: async (t) => {
        decoded.push(t);
        return m.step([t]);
      },
    });
    expect(r.ids).toEqual(plain.ids);
    expect(decoded).toEqual(script); // the prompt (two tokens) went through step, each answer token through decodeStep
    expect(backend.memory.current).toBe(0);
  });

  test("the budget: -n tokens, and no forward for the last one", async () => {
    const m = new FakeLM(scripted([id("▁upon"), id("▁a"), id("▁time")], 1));
    const s = new GenerationSession(m, tok);
    const r = await s.generate([BOS], { maxNewTokens: 2 });
    expect(r.ids).toEqual([id("▁upon"), id("▁a")]);
    expect(r.stopReason).toBe("length");
    expect(m.steps).toEqual([[BOS], [id("▁upon")]]); // ▁a was never run
    expect(s.cachedIds).toEqual([BOS, id("▁upon")]);
  });

  test("stopIds replace the tokenizer's end-of-generation set", async () => {
    const m = new FakeLM(scripted([id("▁upon"), id("▁a"), EOS, id("▁time")], 1));
    const r = await new GenerationSession(m, tok).generate([BOS], { stopIds: [id("▁a")] });
    expect(r.ids).toEqual([id("▁upon")]);
    expect(r.stopReason).toBe("eos");
    // with the default set, EOS (2) stops after ▁a
    const m2 = new FakeLM(scripted([id("▁upon"), id("▁a"), EOS, id("▁time")], 1));
    const r2 = await new GenerationSession(m2, tok).generate([BOS]);
    expect(r2.ids).toEqual([id("▁upon"), id("▁a")]);
  });

  test("the common prefix with the cache is reused; the rest is truncated and re-run", async () => {
    // next token = ids[ (sum of the history) mod 4 ] among four words: derived from the full
    // history, so a stale cache would show up as a different answer.
    const words = [id("▁Once"), id("▁upon"), id("▁a"), id("▁time")];
    const rule = (h: readonly number[]) => peak(words[h.reduce((a, b) => a + b, 0) % 4] as number);
    const expected = (history: number[], n: number): number[] => {
      const h = history.slice();
      const out: number[] = [];
      for (let i = 0; i < n; i++) {
        const next = words[h.reduce((a, b) => a + b, 0) % 4] as number;
        out.push(next);
        h.push(next);
      }
      return out;
    };
    const m = new FakeLM(rule);
    const s = new GenerationSession(m, tok);
    const p1 = [BOS, id("▁Once"), id("▁upon")];
    const r1 = await s.generate(p1, { maxNewTokens: 3 });
    expect(r1.ids).toEqual(expected(p1, 3));
    // turn 2 extends the conversation: everything cached is reused
    const p2 = [...p1, ...r1.ids, id("▁a")];
    m.steps.length = 0;
    const r2 = await s.generate(p2, { maxNewTokens: 2 });
    // cached: p1 + the first two answer tokens (the third was never run)
    expect(r2.reusedTokens).toBe(p1.length + 2);
    expect(m.steps[0]).toEqual([r1.ids[2] as number, id("▁a")]);
    expect(r2.ids).toEqual(expected(p2, 2));
    // turn 3 diverges after 2 tokens: truncate to 2 and prefill the rest
    const p3 = [BOS, id("▁Once"), id("▁time"), id("▁a")];
    m.steps.length = 0;
    const r3 = await s.generate(p3, { maxNewTokens: 2 });
    expect(r3.reusedTokens).toBe(2);
    expect(m.steps[0]).toEqual([id("▁time"), id("▁a")]);
    expect(r3.ids).toEqual(expected(p3, 2));
    // the same prompt again: all but the last token reused (its logits are needed)
    m.steps.length = 0;
    const r4 = await s.generate(p3, { maxNewTokens: 1 });
    expect(r4.reusedTokens).toBe(3);
    expect(m.steps).toEqual([[id("▁a")]]);
    expect(r4.ids).toEqual(r3.ids.slice(0, 1));
    // reset forgets everything
    s.reset();
    expect(m.cached).toBe(0);
    m.steps.length = 0;
    const r5 = await s.generate(p3, { maxNewTokens: 1 });
    expect(r5.reusedTokens).toBe(0);
    expect(m.steps).toEqual([p3]);
  });

  test("prefill runs in chunks of prefillChunk rows", async () => {
    const m = new FakeLM(() => peak(EOS));
    const prompt = [BOS, 300, 301, 302, 303, 304, 305].map((x) => (x >= V ? id("▁a") : x));
    await new GenerationSession(m, tok).generate(prompt, { prefillChunk: 3 });
    expect(m.steps.map((s) => s.length)).toEqual([3, 3, 1]);
    expect(backend.memory.current).toBe(0);
  });

  test("a prompt that fills the context window is E_ARG naming --ctx; generation stops at the window", async () => {
    const m = new FakeLM(() => peak(id("▁a")), 4);
    const s = new GenerationSession(m, tok);
    const e = await s.generate([BOS, 5, 6, 7]).catch((x) => x);
    expect(e).toBeInstanceOf(TpError);
    expect(e.code).toBe("E_ARG");
    expect(e.message).toContain("context window full");
    expect(e.message).toContain("--ctx");
    expect(m.steps.length).toBe(0);
    // 2 prompt tokens in a window of 4: the first answer token comes from the prompt's logits, two
    // more forwards fill the window, and the third token cannot be fed back
    const r = await s.generate([BOS, 5], { maxNewTokens: 10 });
    expect(r.stopReason).toBe("context");
    expect(r.ids.length).toBe(3);
    expect(m.cached).toBe(4);
  });

  test("bad arguments are E_ARG", async () => {
    const s = new GenerationSession(new FakeLM(() => peak(EOS)), tok);
    for (const [ids, opts] of [
      [[], {}],
      [[V], {}],
      [[-1], {}],
      [[BOS], { maxNewTokens: 0 }],
      [[BOS], { prefillChunk: 0 }],
    ] as const) {
      const e = await s.generate(ids, opts).catch((x) => x);
      expect(e).toBeInstanceOf(TpError);
      expect(e.code).toBe("E_ARG");
    }
  });

  test("abort stops the current answer only; the session stays usable", async () => {
    const m = new FakeLM(() => peak(id("▁a")));
    const s = new GenerationSession(m, tok);
    const ac = new AbortController();
    const r = await s.generate([BOS], {
      maxNewTokens: 50,
      signal: ac.signal,
      onToken: (_) => {
        if (s.cachedIds.length >= 3) ac.abort();
      },
    });
    expect(r.stopReason).toBe("abort");
    expect(r.ids.length).toBe(3); // three tokens seen; the abort is noticed before the third is run
    const r2 = await s.generate([...s.cachedIds, id("▁time")], { maxNewTokens: 2 });
    expect(r2.stopReason).toBe("length");
    expect(r2.ids).toEqual([id("▁a"), id("▁a")]);
    // an already-aborted signal runs nothing
    m.steps.length = 0;
    const r3 = await s.generate([BOS, id("▁upon")], { signal: AbortSignal.abort() });
    expect(r3.stopReason).toBe("abort");
    expect(r3.ids).toEqual([]);
    expect(m.steps).toEqual([]);
  });

  test("UTF-8 holdback: a character split over byte tokens is emitted whole", async () => {
    // "é" is C3 A9, "€" is E2 82 AC; the script emits them byte by byte
    const script = [BYTE(0xc3), BYTE(0xa9), BYTE(0xe2), BYTE(0x82), BYTE(0xac), id("é")];
    const m = new FakeLM(scripted(script, 1));
    const pieces: string[] = [];
    const r = await new GenerationSession(m, tok).generate([BOS], { onText: (t) => pieces.push(t) });
    expect(pieces).toEqual(["é", "€", "é"]);
    expect(r.text).toBe("é€é");
  });

  test("SentencePiece: after a control token the first answer token's space is dropped", async () => {
    // prompt ends with <|im_end|> (CONTROL): decode(prompt + answer) drops the space prefix there
    const m = new FakeLM(scripted([id("▁upon"), id("▁a")], 2));
    const r = await new GenerationSession(m, tok).generate([BOS, id("<|im_end|>")]);
    expect(r.text).toBe("upon a");
    expect(r.text).toBe(tok.decode([BOS, id("<|im_end|>"), ...r.ids], { skipSpecial: true }));
  });

  test("sampling: a seed reproduces the draws; turn seeds follow splitmix64 over the base seed", async () => {
    // two tokens of equal logit: each draw is a coin flip
    const coin = () => peak(id("▁a"), id("▁time")).map((x) => (x === 9 ? 10 : x));
    const run = async (seed: number) => {
      const s = new GenerationSession(new FakeLM(coin), tok, { seed });
      const a = await s.generate([BOS], {
        sampling: { temperature: 1, topK: 0, topP: 1, minP: 0 },
        maxNewTokens: 40,
      });
      const b = await s.generate([BOS], {
        sampling: { temperature: 1, topK: 0, topP: 1, minP: 0 },
        maxNewTokens: 40,
      });
      return [a, b] as const;
    };
    const [a1, b1] = await run(7);
    const [a2, b2] = await run(7);
    expect(a2.ids).toEqual(a1.ids);
    expect(b2.ids).toEqual(b1.ids);
    expect(b1.ids).not.toEqual(a1.ids); // two turns never share a stream (P = 2^-40 of a false failure)
    expect(new Set(a1.ids)).toEqual(new Set([id("▁a"), id("▁time")]));
    // the draws are those of a Sampler seeded with the first turn seed
    const sampler = new Sampler({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: a1.seed });
    const direct = Array.from({ length: 40 }, () => sampler.sample(coin()));
    expect(a1.ids).toEqual(direct);
    // a Sampler object is used as is
    const s = new GenerationSession(new FakeLM(coin), tok, { seed: 1 });
    const mine = new Sampler({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 99 });
    const r = await s.generate([BOS], { sampling: mine, maxNewTokens: 10 });
    const ref = new Sampler({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 99 });
    expect(r.ids).toEqual(Array.from({ length: 10 }, () => ref.sample(coin())));
  });

  test("repetition penalty sees the prompt and the answer", async () => {
    // logits: ▁a 10, ▁time 9.5; a penalty of 2 divides the positive logit of every id in the window:
    // step 1 sees ▁a in the prompt (5 < 9.5: ▁time), step 2 sees both (5 > 4.75: ▁a)
    const rule = () => {
      const l = new Float32Array(V);
      l[id("▁a")] = 10;
      l[id("▁time")] = 9.5;
      return l;
    };
    const s = new GenerationSession(new FakeLM(rule), tok);
    const r = await s.generate([BOS, id("▁a")], {
      sampling: { temperature: 0, repeatPenalty: 2, repeatLastN: 64 },
      maxNewTokens: 2,
    });
    expect(r.ids).toEqual([id("▁time"), id("▁a")]);
    const r2 = await s.generate([BOS, id("▁upon")], {
      sampling: { temperature: 0, repeatPenalty: 2 },
      maxNewTokens: 2,
    });
    expect(r2.ids).toEqual([id("▁a"), id("▁time")]);
  });

  test("timings and tokens per second", async () => {
    const r = await new GenerationSession(new FakeLM(() => peak(id("▁a"))), tok).generate([BOS, 5, 6], {
      maxNewTokens: 4,
    });
    expect(r.promptSeconds).toBeGreaterThan(0);
    expect(r.genSeconds).toBeGreaterThan(0);
    const tps = tokensPerSecond(r);
    expect(tps.prompt).toBeCloseTo(3 / r.promptSeconds, 6);
    expect(tps.generation).toBeCloseTo(4 / r.genSeconds, 6);
  });

  test("commonPrefixLength", () => {
    expect(commonPrefixLength([1, 2, 3], [1, 2, 4, 5])).toBe(2);
    expect(commonPrefixLength([], [1])).toBe(0);
    expect(commonPrefixLength([1, 2], [1, 2])).toBe(2);
  });
});

describe("ChatSession", () => {
  test("renders the transcript with the template each turn and reuses the cache", async () => {
    const template = new ChatTemplate(CHATML_TEMPLATE, { kind: "chatml" });
    // the model answers "▁a" then <|im_end|> (a stop id: it is not in the vocabulary's EOG texts
    // list here only because this test vocabulary is tiny — pass it explicitly)
    const imEnd = id("<|im_end|>");
    let turn = 0;
    const rule = (h: readonly number[]) => {
      const last = h[h.length - 1];
      if (tok.decode(h).endsWith("<|im_start|>assistant\n")) return peak(id("▁a"));
      if (last === id("▁a")) return peak(turn === 0 ? imEnd : id("▁time"));
      return peak(imEnd);
    };
    const m = new FakeLM(rule, 256);
    const chat = new ChatSession(new GenerationSession(m, tok), template, { system: "S" });
    const r1 = await chat.send("Hi", { stopIds: [imEnd, EOS] });
    expect(r1.ids).toEqual([id("▁a")]);
    // ChatML of [system S, user Hi] + generation prompt, tokenized with the template's control tokens
    const expectIds = tok.encode(
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
      {
        addSpecial: true,
        parseSpecial: true,
      },
    );
    expect(m.steps[0]).toEqual(expectIds);
    expect(chat.messages).toEqual([
      { role: "system", content: "S" },
      { role: "user", content: "Hi" },
      { role: "assistant", content: r1.text },
    ]);
    turn = 1;
    const before = m.cached;
    m.steps.length = 0;
    const r2 = await chat.send("Again", { stopIds: [imEnd, EOS] });
    expect(r2.reusedTokens).toBeGreaterThan(expectIds.length - 1); // the first turn's prompt was reused
    expect(r2.reusedTokens).toBeLessThanOrEqual(before);
    expect(r2.ids).toEqual([id("▁a"), id("▁time")]);
    expect(chat.messages.length).toBe(5);
    chat.reset();
    expect(chat.messages).toEqual([{ role: "system", content: "S" }]);
    expect(m.cached).toBe(0);
  });
});
