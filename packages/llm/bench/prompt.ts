// What the two workers of `bun run bench llm` (ours-worker.ts, llama-cpp-worker.ts) share: their
// command line and the prompt.

/** A worker's command line (llm.bench.ts passes it). */
export interface WorkerArgs {
  path: string;
  mode: "pp" | "tg";
  n: number;
  threads: number;
  ctx: number;
}

/** This worker's `FILE pp|tg N THREADS CTX`; the usage line and exit status 2 when it is not that. */
export function workerArgs(script: string): WorkerArgs {
  const [path, mode, nText, threadsText, ctxText] = process.argv.slice(2);
  if (path === undefined || (mode !== "pp" && mode !== "tg")) {
    console.error(`usage: ${script} FILE pp|tg N THREADS CTX`);
    process.exit(2);
  }
  return { path, mode, n: Number(nText), threads: Number(threadsText), ctx: Number(ctxText) };
}

/**
 * The benchmark's prompt: `n` token ids drawn from the ordinary part of Qwen3's vocabulary
 * ([0, 151643), below the special tokens) with a fixed LCG, the same for us and for llama.cpp.
 */
export function benchPromptIds(n: number): number[] {
  const out: number[] = [];
  let x = 12345;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    out.push(x % 151643);
  }
  return out;
}
