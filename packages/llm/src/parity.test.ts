// Parity with llama.cpp (the prebuilt CPU llama.cpp of node-llama-cpp 3.21.1, a pinned devDependency;
// no download or build) on every llama / qwen3 GGUF of ../shared/models that it loads: the same prompt
// token ids (text → ids by both tokenizers, and BOS), next-token probabilities of every prompt row and
// of each of 32 greedy steps within a stated tolerance, and the 32-token greedy continuation identical
// (F32 / F16), or identical up to a step where llama.cpp's top-2 log-probability gap is within the
// stated tolerance (Q8_0 / Q4_0). llama.cpp runs in a child process (scripts/llama-cpp-oracle.ts, f32
// KV cache like ours) so a native crash cannot take the runner down.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { chatPromptIds, chatTemplateFor } from "./chat.ts";
import { loadModel } from "./load.ts";

const MODELS = resolve(import.meta.dir, "../../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));

function llamaBinary(): string | null {
  try {
    const dir = resolve(
      createRequire(import.meta.url).resolve("@node-llama-cpp/linux-x64/package.json"),
      "..",
    );
    return existsSync(join(dir, "bins")) ? dir : null;
  } catch {
    return null;
  }
}
const BIN = process.platform === "linux" && process.arch === "x64" ? llamaBinary() : null;
const SKIP = !HAVE_MODELS
  ? `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`
  : BIN === null
    ? "skipped: no prebuilt linux-x64 llama.cpp binary of node-llama-cpp 3.21.1"
    : "";
const ORACLE = resolve(import.meta.dir, "../scripts/llama-cpp-oracle.ts");

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
const N_GREEDY = 32;
const TOP = 16;
const PROMPT = "Once upon a time";

type WeightType = keyof typeof PROB_TOL;
/** A file, its weight type, and whether the prompt goes through the file's chat template (`chat`). */
const CASES: { file: string; type: WeightType; chat?: boolean }[] = [
  { file: "real/stories260K-f32-v3.gguf", type: "F32" },
  { file: "real/llama-2-tiny-random.gguf", type: "F16" },
  ...(["F32", "F16", "Q8_0", "Q4_0"] as const).flatMap((type) => [
    { file: `synthetic/llama-tiny-${type}.gguf`, type },
    { file: `synthetic/qwen3-tiny-${type}.gguf`, type },
  ]),
  { file: "synthetic/qwen3-fullvocab-Q4_0.gguf", type: "Q4_0" },
  // Qwen3 MoE: the raw prompt and the same prompt as one user turn of the file's chat template
  ...(["F32", "F16", "Q8_0", "Q4_0"] as const).flatMap((type) => [
    { file: `synthetic/qwen3moe-tiny-${type}.gguf`, type },
    { file: `synthetic/qwen3moe-tiny-${type}.gguf`, type, chat: true },
  ]),
];

/** A case's name and the key of its prompt ids and oracle run. */
const caseKey = (c: { file: string; chat?: boolean }) => (c.chat ? `${c.file} (chat template)` : c.file);

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

async function runOracle(path: string, ids: number[]): Promise<Oracle> {
  const spec = JSON.stringify({ text: PROMPT, ids, n: N_GREEDY, top: TOP, threads: 2 });
  const p = Bun.spawn([process.execPath, ORACLE, path, spec], { stdout: "pipe", stderr: "pipe" });
  const timer = setTimeout(() => p.kill(), 120_000);
  const out = await new Response(p.stdout).text();
  await p.exited;
  clearTimeout(timer);
  return JSON.parse(out.trim().split("\n").pop() || '{"ok":false,"error":"no output"}');
}

function softmax(l: Float32Array, offset: number, V: number): Float64Array {
  let m = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < V; i++) m = Math.max(m, l[offset + i] as number);
  const p = new Float64Array(V);
  let s = 0;
  for (let i = 0; i < V; i++) {
    p[i] = Math.exp((l[offset + i] as number) - m);
    s += p[i] as number;
  }
  for (let i = 0; i < V; i++) p[i] = (p[i] as number) / s;
  return p;
}

function argmax(p: Float64Array): number {
  let best = 0;
  for (let i = 1; i < p.length; i++) if ((p[i] as number) > (p[best] as number)) best = i;
  return best;
}

/** Largest |p_ours − p_llama| over llama.cpp's top entries. */
function topDiff(ours: Float64Array, theirs: [number, number][]): number {
  let m = 0;
  for (const [t, q] of theirs) m = Math.max(m, Math.abs((ours[t] as number) - q));
  return m;
}

describe.skipIf(SKIP !== "")(
  `parity with llama.cpp (node-llama-cpp 3.21.1)${SKIP ? ` — ${SKIP}` : ""}`,
  () => {
    const backend = createBackend({ threads: 2 });
    const oracles = new Map<string, Promise<Oracle>>();
    const promptIds = new Map<string, number[]>();
    afterAll(() => backend.dispose());

    beforeAll(() => {
      // our prompt ids for each file (text → ids with the vocabulary's BOS), then llama.cpp on 4 at a time
      for (const c of CASES) {
        const { model, tokenizer } = loadModel(join(MODELS, c.file), { backend, maxContext: 64 });
        const ids = c.chat
          ? chatPromptIds(tokenizer, chatTemplateFor(tokenizer), [{ role: "user", content: PROMPT }])
          : tokenizer.encode(PROMPT, { addSpecial: true });
        promptIds.set(caseKey(c), ids);
        model.dispose();
      }
      let chain: Promise<unknown>[] = [
        Promise.resolve(),
        Promise.resolve(),
        Promise.resolve(),
        Promise.resolve(),
      ];
      CASES.forEach((c, i) => {
        const slot = i % chain.length;
        const run = (chain[slot] as Promise<unknown>).then(() =>
          runOracle(join(MODELS, c.file), promptIds.get(caseKey(c)) as number[]),
        );
        chain = chain.map((x, j) => (j === slot ? run : x));
        oracles.set(caseKey(c), run);
      });
    });

    for (const c of CASES) {
      const { file, type } = c;
      test(`${caseKey(c)}: prompt ids, probabilities within ${PROB_TOL[type]}, ${N_GREEDY} greedy tokens`, async () => {
        const o = await (oracles.get(caseKey(c)) as Promise<Oracle>);
        expect(o.error).toBeUndefined();
        expect(o.ok).toBe(true);
        const { model, tokenizer, config } = loadModel(join(MODELS, file), { backend, maxContext: 64 });
        try {
          const V = config.vocab_size;
          const ids = promptIds.get(caseKey(c)) as number[];
          // the same prompt token ids: text → ids (no BOS) by both tokenizers, and the BOS rule
          expect(tokenizer.encode(PROMPT)).toEqual(o.tokenized);
          expect(o.addBos).toBe(tokenizer.addBos);
          if (o.addBos && !c.chat) expect(ids).toEqual([o.bos as number, ...o.tokenized]);

          // every prompt row in one batched forward; the full distribution after the prompt
          const all = model.step(ids, { allLogits: true });
          const rows = (await backend.read(all)) as Float32Array;
          backend.free(all);
          for (let r = 0; r < ids.length; r++) {
            expect(topDiff(softmax(rows, r * V, V), o.promptRows[r] ?? [])).toBeLessThan(PROB_TOL[type]);
          }
          let p = softmax(rows, (ids.length - 1) * V, V);
          let full = 0;
          for (let t = 0; t < V; t++) full = Math.max(full, Math.abs((p[t] as number) - (o.first[t] ?? 0)));
          expect(full).toBeLessThan(PROB_TOL[type]);

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
                nearTie: quant && gap <= QUANT_GAP_NATS,
              }).toMatchObject({
                nearTie: true,
              });
              break; // the sequences diverge at a near tie; nothing after it is comparable
            }
            expect(topDiff(p, theirs)).toBeLessThan(PROB_TOL[type]);
            if (i + 1 === N_GREEDY) break;
            const l = model.step([next]);
            p = softmax((await backend.read(l)) as Float32Array, 0, V);
            backend.free(l);
          }
          if (type === "F32" || type === "F16") expect(ours).toEqual(o.greedy);

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
      }, 180_000);
    }
  },
);
