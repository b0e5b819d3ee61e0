/**
 * The llama.cpp side of the parity tests (src/parity.test.ts): load a GGUF with the prebuilt CPU
 * llama.cpp of node-llama-cpp 3.21.1 (no download, no build; f32 KV cache so that it holds what ours
 * holds), evaluate the given prompt ids, decode greedily, and print one JSON line. Run in a child
 * process so that a native crash cannot take the test runner down.
 *
 * Probabilities are llama.cpp's softmax of the raw logits (node-llama-cpp `controlledEvaluate` with
 * `generateNext.probabilities` and temperature 0, i.e. the greedy sampler, which leaves logits alone;
 * llama/addon/AddonContext.cpp `AddonContextSampleTokenWorker`).
 *
 * usage: bun packages/llm/scripts/llama-cpp-oracle.ts FILE.gguf '{"text": "...", "ids": [..], "n": 32, "top": 16, "threads": 2}'
 *   optional: "special": true (tokenize `text` parsing special tokens, as for a rendered chat template),
 *   "texts": [...] (more texts to tokenize, no BOS, no special parsing: tokenizer vectors)
 * output: {ok, bos, addBos, tokenized (llama.cpp's ids of `text`, no BOS, special parsing as asked),
 *   texts (the ids of each of `texts`),
 *   greedy: n ids, steps: per generated position the `top` most likely [id, p] pairs (the first is the
 *   prediction after the prompt), promptRows: the same for every prompt row, first: the full
 *   distribution after the prompt (indexed by id)}
 */
import { getLlama, LlamaLogLevel, type Token } from "node-llama-cpp";

const [path, spec] = process.argv.slice(2);
if (path === undefined || spec === undefined) {
  console.error("usage: llama-cpp-oracle.ts FILE.gguf JSON");
  process.exit(2);
}
const args = JSON.parse(spec) as {
  text?: string;
  special?: boolean;
  texts?: string[];
  ids: number[];
  n: number;
  top?: number;
  threads?: number;
};
const topN = args.top ?? 16;

function top(p: Map<Token, number> | undefined): [number, number][] {
  // the map is sorted by probability, highest first (node-llama-cpp types.d.ts)
  return [...(p ?? new Map()).entries()].slice(0, topN).map(([t, v]) => [Number(t), v]);
}

try {
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    progressLogs: false,
  });
  const model = await llama.loadModel({ modelPath: path });
  const context = await model.createContext({
    contextSize: Math.max(64, args.ids.length + args.n + 8),
    flashAttention: false,
    ...(args.threads === undefined ? {} : { threads: args.threads }),
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
  });
  const seq = context.getSequence();
  const next = { probabilities: true, token: true, options: { temperature: 0 } } as const;
  const res = await seq.controlledEvaluate(args.ids.map((t) => [t as Token, { generateNext: next }]));
  const promptRows = res.map((r) => top(r?.next.probabilities));
  const last = res[res.length - 1]?.next;
  const first: number[] = [];
  for (const [t, p] of last?.probabilities ?? new Map()) first[Number(t)] = p;
  const greedy: number[] = [];
  const steps: [number, number][][] = [];
  let cur = last;
  for (let i = 0; i < args.n; i++) {
    const tok = cur?.token;
    if (tok === undefined || tok === null) throw new Error(`no token at step ${i}`);
    greedy.push(Number(tok));
    steps.push(top(cur?.probabilities));
    if (i + 1 === args.n) break;
    const r = await seq.controlledEvaluate([[tok, { generateNext: next }]]);
    cur = r[0]?.next;
  }
  console.log(
    JSON.stringify({
      ok: true,
      bos: model.tokens.bos,
      addBos: model.tokens.shouldPrependBosToken,
      tokenized:
        args.text === undefined ? null : model.tokenize(args.text, args.special === true).map(Number),
      texts: (args.texts ?? []).map((t) => model.tokenize(t).map(Number)),
      greedy,
      steps,
      promptRows,
      first,
    }),
  );
  await context.dispose();
  await model.dispose();
  await llama.dispose();
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: e instanceof Error ? e.message : String(e) }));
}
