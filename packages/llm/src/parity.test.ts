// Parity with llama.cpp (the prebuilt CPU llama.cpp of node-llama-cpp 3.21.1, a pinned devDependency;
// no download or build) on every llama / qwen3 / qwen3moe / gemma3 GGUF of ../shared/models (gemma3:
// also a chat-template prompt, a prompt past the sliding window, and the tokenizer): the same prompt
// token ids (text → ids by both tokenizers, and BOS), next-token probabilities of every prompt row and
// of each of 32 greedy steps within a stated tolerance, and the 32-token greedy continuation identical
// (F32 / F16), or identical up to a step where llama.cpp's top-2 log-probability gap is within the
// stated tolerance (Q8_0 / Q4_0). llama.cpp runs in a child process (scripts/llama-cpp-oracle.ts, f32
// KV cache like ours) so a native crash cannot take the runner down.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import type { Backend } from "@tp/tensor";
import { tokenizerFromGguf } from "@tp/tokenizer";
import { type ChatMessage, chatPromptIds, chatTemplateFor } from "./chat.ts";
import { ChatSession } from "./chat-session.ts";
import { GenerationSession } from "./generate.ts";
import { loadModel } from "./load.ts";
import type { CausalLM } from "./model.ts";
import type { Gemma3Model } from "./models/gemma3.ts";
import {
  argmax,
  emulateLlamaCppGelu,
  llamaCppBinary,
  runLlamaCppOracle,
  softmax,
  topDiff,
} from "./testing/llama-cpp.ts";

const MODELS = resolve(import.meta.dir, "../../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));

const BIN = llamaCppBinary();
const SKIP = !HAVE_MODELS
  ? `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`
  : BIN === null
    ? "skipped: no prebuilt linux-x64 llama.cpp binary of node-llama-cpp 3.21.1"
    : "";

/**
 * Absolute tolerance on next-token probabilities, by weight type, with the reason:
 * - F32: f32 summation order (llama.cpp's GEMM tiles and attention vs ours); measured ≤ 1.6e-5.
 * - F16: llama.cpp rounds the activations to f16 before its f16 dot products (ggml vec_dot_f16); ours
 *   keep f32 activations; measured ≤ 1.7e-3.
 * - Q8_0 / Q4_0: both quantize the activations to Q8_0 blocks and use integer block dots; only f32
 *   accumulation order differs; measured ≤ 1.4e-4.
 */
const PROB_TOL = { F32: 5e-5, F16: 5e-3, Q8_0: 5e-4, Q4_0: 5e-4 } as const;
/**
 * Quantized files: a greedy step may differ only where llama.cpp's top-2 log-probability gap is below
 * this (nats); the probability error above bounds logit errors near 1e-3 for the tokens that matter.
 * (In the runs here no step differs at all.)
 */
const QUANT_GAP_NATS = 0.02;
/**
 * The tiny Qwen3 MoE files, quantized: both sides quantize each matmul's input to Q8_0, which is
 * discontinuous, and the reductions before it (k_norm's sum of squares, the attention dots) run in
 * an order that depends on the SIMD width — ours (AVX2 / AVX-512) and llama.cpp's CPU variants
 * alike. A one-ulp change flips an int8 code and the random router and experts amplify it: measured
 * 3.0e-2 (Q4_0, the decode step at position 8: a 2.4e-7 difference in layer 0's K rows flipped a code
 * of layer 1's input) with our AVX-512 kernels, ≤ 5e-4 with AVX2 on the same machine; the greedy
 * tokens then parted at step 30 where llama.cpp's top-2 gap was 0.026 nats.
 */
const MOE_QUANT_TOL = 5e-2;
const MOE_QUANT_GAP_NATS = 0.1;
const N_GREEDY = 32;
const TOP = 16;
const PROMPT = "Once upon a time";

/**
 * Gemma 3, as our model runs (f32 GELU), by weight type, with the reason: llama.cpp's CPU GELU is an
 * f16 table lookup (ggml-cpu vec.h `GGML_GELU_FP16`: input and result rounded to f16).
 * - F32: that rounding alone; measured ≤ 8.5e-4.
 * - F16: plus llama.cpp's f16 activations; measured ≤ 2.1e-3.
 * - Q8_0 / Q4_0: both quantize each matmul's input to Q8_0, which is discontinuous: the f16 GELU flips
 *   int8 roundings of the next input, and six layers of random weights with sandwich norms amplify
 *   them; measured ≤ 8.0e-2 (Q8_0, prompt rows) and ≤ 3.4e-2 (Q4_0). The greedy rule is the quantized one.
 * The {@link GEMMA_F16_GELU_TOL} rows show that the f16 GELU is the cause.
 */
const GEMMA_PROB_TOL = { F32: 2e-3, F16: 5e-3, Q8_0: 0.15, Q4_0: 0.1 } as const;
/**
 * Gemma 3 quantized: the near-tie rule's gap, wider than {@link QUANT_GAP_NATS} because the
 * probability error above is wider; the one divergence seen is at 0.026 nats (fullvocab Q4_0, step 3).
 */
const GEMMA_QUANT_GAP_NATS = 0.05;
/**
 * Gemma 3 with llama.cpp's f16 GELU emulated on our side (the gate and the GELU rounded through f16,
 * a test-only override of `Gemma3Model.gelu`):
 * - F32: measured ≤ 5.7e-6 on prompt rows, ≤ 9.6e-5 on decode steps (the rest is not explained).
 * - Q8_0: measured ≤ 2e-5: the dense tolerance holds.
 * - Q4_0 is not listed: it stays near 2e-2 at positions ≥ 1 (position 0 agrees exactly); the cause is
 *   not found (finding in the report of this change).
 */
const GEMMA_F16_GELU_TOL = { F32: 2e-4, Q8_0: PROB_TOL.Q8_0 } as const;

type WeightType = keyof typeof PROB_TOL;
interface Case {
  file: string;
  type: WeightType;
  /** The prompt text (default {@link PROMPT}); with `chat`, the user message of a one-turn chat. */
  text?: string;
  /** Render `text` as a user turn with the file's chat template (ids compared with llama.cpp's tokenization of the render). */
  chat?: boolean;
  /** kvRingBatch: small, so the sliding-window ring of Gemma's local layers wraps within the test. */
  ring?: number;
  maxContext?: number;
  tol?: number;
  /** Emulate llama.cpp's f16-table GELU on our side (Gemma only; see {@link GEMMA_F16_GELU_TOL}). */
  f16Gelu?: boolean;
  /** The near-tie gap for a quantized file (default {@link QUANT_GAP_NATS}). */
  gap?: number;
}
/** A prompt longer than the tiny Gemma files' sliding window (8) and their ring (8 + 16 rows). */
const LONG_TEXT =
  "The old lighthouse keeper climbed the stairs every night, counting each step, and watched the ships pass the rocks while the storm rolled in from the sea.";
const CASES: Case[] = [
  { file: "real/stories260K-f32-v3.gguf", type: "F32" },
  { file: "real/llama-2-tiny-random.gguf", type: "F16" },
  ...(["F32", "F16", "Q8_0", "Q4_0"] as const).flatMap((type) => [
    { file: `synthetic/llama-tiny-${type}.gguf`, type },
    { file: `synthetic/qwen3-tiny-${type}.gguf`, type },
    {
      file: `synthetic/gemma3-tiny-${type}.gguf`,
      type,
      ring: 4,
      tol: GEMMA_PROB_TOL[type],
      gap: GEMMA_QUANT_GAP_NATS,
    },
  ]),
  { file: "synthetic/qwen3-fullvocab-Q4_0.gguf", type: "Q4_0" },
  // Qwen3 MoE: the raw prompt and the same prompt as one user turn of the file's chat template
  ...(["F32", "F16", "Q8_0", "Q4_0"] as const).flatMap((type) => {
    const tol = type === "Q8_0" || type === "Q4_0" ? { tol: MOE_QUANT_TOL, gap: MOE_QUANT_GAP_NATS } : {};
    return [
      { file: `synthetic/qwen3moe-tiny-${type}.gguf`, type, ...tol },
      { file: `synthetic/qwen3moe-tiny-${type}.gguf`, type, chat: true, ...tol },
    ];
  }),
  {
    file: "synthetic/gemma3-fullvocab-Q4_0.gguf",
    type: "Q4_0",
    ring: 4,
    tol: GEMMA_PROB_TOL.Q4_0,
    gap: GEMMA_QUANT_GAP_NATS,
  },
  {
    file: "synthetic/gemma3-fullvocab-Q4_0.gguf",
    type: "Q4_0",
    text: "Why is the sky blue?",
    chat: true,
    ring: 4,
    tol: GEMMA_PROB_TOL.Q4_0,
    gap: GEMMA_QUANT_GAP_NATS,
  },
  // long context: the prompt is prefilled in ring-sized chunks and the ring wraps several times
  // (F32: on Q8_0 the amplification above grows with the prompt, and the greedy tokens part)
  {
    file: "synthetic/gemma3-tiny-F32.gguf",
    type: "F32",
    text: LONG_TEXT,
    ring: 16,
    maxContext: 128,
    tol: GEMMA_PROB_TOL.F32,
  },
  {
    file: "synthetic/gemma3-tiny-F32.gguf",
    type: "F32",
    text: LONG_TEXT,
    ring: 16,
    maxContext: 128,
    tol: GEMMA_F16_GELU_TOL.F32,
    f16Gelu: true,
  },
  ...(["F32", "Q8_0"] as const).map((type) => ({
    file: `synthetic/gemma3-tiny-${type}.gguf`,
    type,
    ring: 4,
    tol: GEMMA_F16_GELU_TOL[type],
    f16Gelu: true,
  })),
];
const caseName = (c: Case) =>
  `${c.file}${c.chat ? " (chat template)" : c.text !== undefined ? " (prompt past the sliding window)" : ""}${c.f16Gelu ? " with llama.cpp's f16 GELU emulated" : ""}`;

interface Oracle {
  ok: boolean;
  error?: string;
  bos: number | null;
  addBos: boolean;
  tokenized: number[];
  greedy: number[];
  steps: [number, number][][];
  promptRows: [number, number][][];
  first: (number | null)[];
}

/** llama.cpp on `ids` (`n` greedy tokens); `text` tokenized too, special tokens parsed when `special`. */
function runOracle(
  path: string,
  ids: number[],
  text: string,
  special: boolean,
  n = N_GREEDY,
): Promise<Oracle> {
  return runLlamaCppOracle<Oracle>(path, { text, special, ids, n, top: TOP, threads: 2 });
}

describe.skipIf(SKIP !== "")(
  `parity with llama.cpp (node-llama-cpp 3.21.1)${SKIP ? ` — ${SKIP}` : ""}`,
  () => {
    const backend = createBackend({ threads: 2 });
    const promptIds = new Map<Case, number[]>();
    /** What llama.cpp tokenizes: the prompt text, or the rendered chat template (special tokens parsed). */
    const oracleText = new Map<Case, string>();
    afterAll(() => backend.dispose());

    beforeAll(() => {
      // our prompt ids for each case: text → ids with the vocabulary's BOS, or the chat template's
      // render tokenized as llama.cpp does
      for (const c of CASES) {
        const { model, tokenizer } = loadModel(join(MODELS, c.file), { backend, maxContext: 64 });
        const text = c.text ?? PROMPT;
        if (c.chat) {
          const template = chatTemplateFor(tokenizer);
          const messages = [{ role: "user", content: text }];
          promptIds.set(c, chatPromptIds(tokenizer, template, messages));
          oracleText.set(c, template.render(messages));
        } else {
          promptIds.set(c, tokenizer.encode(text, { addSpecial: true }));
          oracleText.set(c, text);
        }
        model.dispose();
      }
    });

    // llama.cpp runs lazily (a test filter skips the others), once per distinct file and prompt: the
    // case being checked and the next one at once
    const byPrompt = new Map<string, Promise<Oracle>>();
    const oracleFor = (c: Case): Promise<Oracle> => {
      const text = oracleText.get(c) as string;
      const key = `${c.file}\u0000${text}\u0000${c.chat === true}`;
      let o = byPrompt.get(key);
      if (o === undefined) {
        o = runOracle(join(MODELS, c.file), promptIds.get(c) as number[], text, c.chat === true);
        byPrompt.set(key, o);
      }
      return o;
    };

    for (const c of CASES) {
      const { file, type } = c;
      const tol = c.tol ?? PROB_TOL[type];
      test(`${caseName(c)}: prompt ids, probabilities within ${tol}, ${N_GREEDY} greedy tokens`, async () => {
        const at = CASES.indexOf(c);
        for (const next of CASES.slice(at + 1, at + 2)) void oracleFor(next);
        const o = await oracleFor(c);
        expect(o.error).toBeUndefined();
        expect(o.ok).toBe(true);
        const { model, tokenizer } = loadModel(join(MODELS, file), {
          backend,
          maxContext: c.maxContext ?? 64,
          ...(c.ring === undefined ? {} : { kvRingBatch: c.ring }),
        });
        try {
          if (c.f16Gelu) emulateLlamaCppGelu(model.model as Gemma3Model, backend);
          const ids = promptIds.get(c) as number[];
          expect(o.addBos).toBe(tokenizer.addBos);
          if (c.chat) {
            // the rendered template tokenized by llama.cpp (special tokens parsed, its <bos> text
            // included) is exactly our prompt
            expect(ids).toEqual(o.tokenized);
          } else {
            // the same prompt token ids: text → ids (no BOS) by both tokenizers, and the BOS rule
            expect(tokenizer.encode(oracleText.get(c) as string)).toEqual(o.tokenized);
            if (o.addBos) expect(ids).toEqual([o.bos as number, ...o.tokenized]);
          }

          const ours = await expectParity(backend, model, ids, o, type, tol, c.gap ?? QUANT_GAP_NATS);

          if (file.includes("stories260K")) {
            // a trained model: greedy TinyStories text, the same as llama.cpp's (same ids)
            const text = tokenizer.decode(ours);
            expect(
              text.startsWith(", there was a little girl named Lily. She loved to play outside in the park."),
            ).toBe(true);
            expect(text).toBe(tokenizer.decode(o.greedy));
          }
        } finally {
          model.dispose();
        }
      }, 400_000);
    }
  },
);

/**
 * Gemma's SentencePiece (llm.md §4.3) against llama.cpp's own tokenizer on the full Gemma 3 vocabulary:
 * tabs, space and newline runs (USER_DEFINED pieces in Gemma's vocab), byte fallback for characters
 * without a piece, no dummy prefix; plus every text of llama.cpp's llama-spm test set. No BOS, no
 * special-token parsing (llama_tokenize with add_special and parse_special false).
 */
const GEMMA_TEXTS = [
  "\t",
  "\t\tindented",
  "a\tb\t\tc",
  " ",
  "   three spaces",
  "trailing   ",
  "\n",
  "\n\n\n\nfour",
  "x\n\n  y \n\t z",
  "   \n\n   \t\t\n",
  "Hello world",
  " Hello world",
  "<start_of_turn>user",
  "\u0000\u0001\u007f",
  "é ü ß ǅ",
  "日本語のテキスト",
  "🦙🤖 emoji",
  "\u{10ffff}\u{e0001}",
  "def f(x):\n    return x  # comment",
];
describe.skipIf(SKIP !== "")(`Gemma 3 tokenizer = llama.cpp's${SKIP ? ` — ${SKIP}` : ""}`, () => {
  test("gemma3-fullvocab-Q4_0: whitespace runs, tabs, byte fallback, llama-spm texts", async () => {
    const file = join(MODELS, "synthetic/gemma3-fullvocab-Q4_0.gguf");
    const inp = readFileSync(join(MODELS, "tokenizer-tests/ggml-vocab-llama-spm.gguf.inp"), "utf8");
    const texts = [...GEMMA_TEXTS, ...inp.split("\n__ggml_vocab_test__\n").slice(0, -1)];
    expect(texts.length).toBe(GEMMA_TEXTS.length + 46);
    const o = await runLlamaCppOracle<Oracle & { texts: number[][] }>(file, {
      ids: [2],
      n: 1,
      top: 1,
      threads: 2,
      texts,
    });
    expect(o.error).toBeUndefined();
    const tokenizer = tokenizerFromGguf(file);
    const bad = texts
      .map((t, i) => ({ t, ours: tokenizer.encode(t), theirs: o.texts[i] ?? [] }))
      .filter((x) => x.ours.join(" ") !== x.theirs.join(" "))
      .map((x) => `${JSON.stringify(x.t)}: ours ${x.ours.join(" ")} llama.cpp ${x.theirs.join(" ")}`);
    expect(bad).toEqual([]);
  }, 400_000);
});

/**
 * Run `ids` through `model` (fresh cache) and check it against llama.cpp's run `o` of the same ids:
 * the probabilities of every prompt row and the full distribution after the prompt within
 * `tol` (default PROB_TOL[type]), then greedy decoding step by step (F32 / F16 identical; quantized:
 * identical up to a step where llama.cpp's top-2 gap is within `gapNats`, default QUANT_GAP_NATS).
 * Returns our greedy ids.
 */
async function expectParity(
  backend: Backend,
  model: CausalLM,
  ids: number[],
  o: Oracle,
  type: WeightType,
  tol: number = PROB_TOL[type],
  gapNats: number = QUANT_GAP_NATS,
): Promise<number[]> {
  const V = model.config.vocab_size;
  // every prompt row in one batched forward; the full distribution after the prompt
  const all = model.step(ids, { allLogits: true });
  const rows = (await backend.read(all)) as Float32Array;
  backend.free(all);
  for (let r = 0; r < ids.length; r++) {
    expect(topDiff(softmax(rows, r * V, V), o.promptRows[r] ?? [])).toBeLessThan(tol);
  }
  let p = softmax(rows, (ids.length - 1) * V, V);
  let full = 0;
  for (let t = 0; t < V; t++) full = Math.max(full, Math.abs((p[t] as number) - (o.first[t] ?? 0)));
  expect(full).toBeLessThan(tol);

  // greedy continuation, one decode step at a time
  const ours: number[] = [];
  for (let i = 0; i < N_GREEDY; i++) {
    const theirs = o.steps[i] ?? [];
    const next = argmax(p);
    ours.push(next);
    if (next !== o.greedy[i]) {
      // F32/F16 must match exactly; a quantized file may differ only at a near tie of llama.cpp's
      const gap = Math.log((theirs[0]?.[1] ?? 1) / (theirs[1]?.[1] ?? 1e-30));
      const quant = type === "Q8_0" || type === "Q4_0";
      expect({
        step: i,
        ours: next,
        llama: o.greedy[i],
        gap,
        nearTie: quant && gap <= gapNats,
      }).toMatchObject({
        nearTie: true,
      });
      break; // the sequences diverge at a near tie; nothing after it is comparable
    }
    expect(topDiff(p, theirs)).toBeLessThan(tol);
    if (i + 1 === N_GREEDY) break;
    const l = model.step([next]);
    p = softmax((await backend.read(l)) as Float32Array, 0, V);
    backend.free(l);
  }
  if (type === "F32" || type === "F16") expect(ours).toEqual(o.greedy);

  return ours;
}

// The hybrid Gated DeltaNet families (Qwen 3.5 / 3.6, dense and MoE), in their own block so that `-t qwen35` starts
// only their oracles: the raw prompt and the chat-template prompt of every tiny file, and a chat of
// several turns whose cache is reused, rolled back to recurrent-state snapshots and regenerated, each
// turn equal to llama.cpp run on the whole conversation from an empty cache.
const HYBRID: { file: string; type: WeightType }[] = [
  ...(["F32", "F16", "Q8_0", "Q4_0"] as const).map((type) => ({
    file: `synthetic/qwen35-tiny-${type}.gguf`,
    type,
  })),
  ...(["F32", "Q8_0", "Q4_0"] as const).map((type) => ({
    file: `synthetic/qwen35moe-tiny-${type}.gguf`,
    type,
  })),
];
/**
 * Absolute tolerance on next-token probabilities of the hybrid files, by weight type, with the reason:
 * - F32: as the dense files (f32 summation order; the chunked delta rule of our prefill runs in f64);
 *   measured ≤ 1e-5.
 * - F16: llama.cpp rounds activations to f16 before its f16 dot products, ours stay f32; these files'
 *   sharp distributions (output-norm gain 5) turn that into up to 7e-3 (measured).
 * - Q8_0 / Q4_0: both quantize activations to Q8_0 blocks, but a value on a rounding boundary may round
 *   either way after another f32 summation order (our batched prefill vs llama.cpp's), and these
 *   layers amplify one such step: ours run token by token equals llama.cpp to 1e-5, the batched prompt
 *   differs by up to 1.1e-2 (0.15 nats) from the row where it happens (measured on qwen35-tiny-Q8_0's
 *   chat prompt, row 14), and such steps add up over the greedy steps (Q4_0: up to 5.9e-2 measured);
 *   llm.md §3.4.x: "compare quantized files with llama.cpp loosely".
 */
const HYBRID_PROB_TOL = { F32: 5e-5, F16: 2e-2, Q8_0: 1e-1, Q4_0: 1e-1 } as const;
/** Quantized hybrid files: a greedy step may differ where llama.cpp's top-2 gap is within this (nats). */
const HYBRID_GAP_NATS = 0.3;
const CHAT_PROMPT: ChatMessage[] = [{ role: "user", content: PROMPT }];
const TURNS = ["Once upon a time", "Tell me more, please.", "Why?"];
const TURN_TOKENS = 24;

describe.skipIf(SKIP !== "")(
  `parity with llama.cpp (node-llama-cpp 3.21.1), hybrid Qwen 3.5${SKIP ? ` — ${SKIP}` : ""}`,
  () => {
    const backend = createBackend({ threads: 2 });
    afterAll(() => backend.dispose());

    for (const { file, type } of HYBRID) {
      for (const chat of [false, true]) {
        test(`${file}${chat ? " (chat template)" : ""}: prompt ids, probabilities within ${HYBRID_PROB_TOL[type]}, ${N_GREEDY} greedy tokens`, async () => {
          const { model, tokenizer } = loadModel(join(MODELS, file), { backend, maxContext: 128 });
          try {
            const template = chatTemplateFor(tokenizer);
            const text = chat ? template.render(CHAT_PROMPT) : PROMPT;
            const ids = chat
              ? chatPromptIds(tokenizer, template, CHAT_PROMPT)
              : tokenizer.encode(PROMPT, { addSpecial: true });
            const o = await runOracle(join(MODELS, file), ids, text, chat);
            expect(o.error).toBeUndefined();
            expect(o.ok).toBe(true);
            expect(o.addBos).toBe(tokenizer.addBos);
            expect(chat ? ids : tokenizer.encode(PROMPT)).toEqual(o.tokenized);
            await expectParity(backend, model, ids, o, type, HYBRID_PROB_TOL[type], HYBRID_GAP_NATS);
          } finally {
            model.dispose();
          }
        }, 300_000);
      }
    }

    test(`synthetic/qwen35-tiny-F32.gguf: a chat of ${TURNS.length} turns and a regenerated turn, each equal to llama.cpp on the whole conversation`, async () => {
      const file = join(MODELS, "synthetic/qwen35-tiny-F32.gguf");
      const { model, tokenizer } = loadModel(file, { backend, maxContext: 512 });
      try {
        const session = new GenerationSession(model, tokenizer, { seed: 1 });
        const chat = new ChatSession(session, chatTemplateFor(tokenizer));
        const eog = new Set(tokenizer.eog);
        const expectTurn = async (ids: number[], r: { ids: number[]; stopReason: string }) => {
          const o = await runOracle(file, ids, PROMPT, false, TURN_TOKENS);
          expect(o.error).toBeUndefined();
          expect(r.ids).toEqual(o.greedy.slice(0, r.ids.length));
          if (r.stopReason === "eos") expect(eog.has(o.greedy[r.ids.length] as number)).toBe(true);
          else expect(r.ids.length).toBe(TURN_TOKENS);
        };
        let previousPrompt = 0; // where the last snapshot is: the end of the previous turn's prompt
        let ids: number[] = [];
        for (const text of TURNS) {
          ids = chat.promptIds(text);
          const cached = session.cachedIds;
          let common = 0;
          while (common < cached.length && cached[common] === ids[common]) common++;
          const r = await chat.send(text, { maxNewTokens: TURN_TOKENS });
          // all of the cache reused, or (it held more than the common prefix) back to the last snapshot
          expect(r.reusedTokens).toBe(cached.length > common ? previousPrompt : common);
          await expectTurn(ids, r);
          previousPrompt = ids.length;
        }
        // regenerate the last answer: its prompt again, so the cache goes back before the prompt's end,
        // to the snapshot at the end of the turn before
        const before = model.state?.snapshots ?? [];
        const again = await session.generate(ids, { maxNewTokens: TURN_TOKENS });
        expect(again.reusedTokens).toBe(before[before.length - 2] as number);
        await expectTurn(ids, again);
      } finally {
        model.dispose();
      }
    }, 600_000);
  },
);
