/**
 * The llama.cpp side of `bun run bench llm`, run in a child process (a native crash cannot take the
 * harness down, and the harness measures this process's own peak RSS as it exits:
 * scripts/bench-child.ts): load FILE with node-llama-cpp 3.21.1 (prebuilt CPU binaries, `build:
 * "never"`, no download), then either
 *
 *   pp N: evaluate N prompt tokens in one batch (no token generated) and time it;
 *   tg N: evaluate one token, then time N single-token decode forwards (what llama-bench's tg does:
 *         no sampling; node-llama-cpp's `evaluate` generator adds per-token overhead of its own);
 *
 * each timed run preceded by one untimed warm-up run of the same test and a cleared sequence, as
 * llama-bench does (its `--warmup`, on by default): first-touch costs of fresh memory — the KV cache,
 * the compute buffers — fall outside the timed run for both engines (ours-worker.ts does the same);
 *
 * and print one JSON line `{ok, tokens_per_second, seconds}`.
 *
 * usage: bun packages/llm/bench/llama-cpp-worker.ts FILE pp|tg N THREADS CTX
 */
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { benchPromptIds, workerArgs } from "./prompt.ts";

const { path, mode, n, threads, ctx } = workerArgs("llama-cpp-worker.ts");
try {
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    progressLogs: false,
    maxThreads: threads,
  });
  const model = await llama.loadModel({ modelPath: path, useMmap: true });
  const context = await model.createContext({
    contextSize: ctx,
    batchSize: Math.max(n, 1),
    threads: { ideal: threads, min: threads },
  });
  const seq = context.getSequence();
  let seconds = 0;
  for (const warmup of [true, false]) {
    if (mode === "pp") {
      const t0 = performance.now();
      await seq.evaluateWithoutGeneratingNewTokens(benchPromptIds(n) as never);
      seconds = (performance.now() - t0) / 1000;
    } else {
      const ids = benchPromptIds(n + 1);
      await seq.evaluateWithoutGeneratingNewTokens([ids[0]] as never);
      const t0 = performance.now();
      for (let i = 1; i <= n; i++) await seq.evaluateWithoutGeneratingNewTokens([ids[i]] as never);
      seconds = (performance.now() - t0) / 1000;
    }
    if (warmup) await seq.clearHistory();
  }
  console.log(
    JSON.stringify({
      ok: true,
      tokens_per_second: n / seconds,
      seconds,
    }),
  );
  await context.dispose();
  await model.dispose();
  await llama.dispose();
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: e instanceof Error ? e.message : String(e) }));
}
