/**
 * Our side of `bun run bench llm`, run in a child process (the harness measures its peak RSS as it
 * exits: scripts/bench-child.ts): load FILE with @tp/llm on the CPU backend, then either
 *
 *   pp N: prefill N prompt tokens in one forward (GenerationSession.generate, one token out) and time
 *         the prefill (logits read included);
 *   tg N: prefill one token, then generate N + 1 tokens greedily with no stop id and time the N decode
 *         forwards (each with its argmax and the streaming detokenizer, as the app runs them);
 *
 * each timed run preceded by one untimed warm-up run of the same test and a reset session, as
 * llama-bench does (llama-cpp-worker.ts does the same);
 *
 * and print one JSON line `{ok, tokens_per_second, seconds, backend_peak_bytes, ms_per_token_engine}`.
 *
 * usage: bun packages/llm/bench/ours-worker.ts FILE pp|tg N THREADS CTX
 */
import { createBackend } from "@tp/backend-cpu";
import { GenerationSession, loadModel } from "@tp/llm";
import { benchPromptIds, workerArgs } from "./prompt.ts";

const { path, mode, n, threads, ctx } = workerArgs("ours-worker.ts");
try {
  const backend = createBackend({ threads });
  const { model, tokenizer } = loadModel(path, { backend, maxContext: ctx });
  const session = new GenerationSession(model, tokenizer, { seed: 1 });
  let seconds = 0;
  let engineMs = 0;
  // time spent outside model.step (logits read, argmax, detokenizing), per token
  const step = model.step.bind(model);
  let stepMs: number[] = [];
  (model as { step: typeof step }).step = (ids, o) => {
    const t = performance.now();
    try {
      return step(ids, o);
    } finally {
      stepMs.push(performance.now() - t);
    }
  };
  // one untimed warm-up run of the same test, then the timed one (llama-cpp-worker.ts does the same)
  for (const warmup of [true, false]) {
    stepMs = [];
    if (mode === "pp") {
      const r = await session.generate(benchPromptIds(n), { maxNewTokens: 1, prefillChunk: n });
      seconds = r.promptSeconds;
    } else {
      const r = await session.generate(benchPromptIds(1), { maxNewTokens: n + 1, stopIds: [] });
      seconds = r.genSeconds;
      const decodeMs = stepMs.slice(1).reduce((a, b) => a + b, 0); // [0] is the prefill
      engineMs = (r.genSeconds * 1000 - decodeMs) / n;
    }
    if (warmup) session.reset();
  }
  console.log(
    JSON.stringify({
      ok: true,
      tokens_per_second: n / seconds,
      seconds,
      backend_peak_bytes: backend.memory.peak,
      ms_per_token_engine: engineMs,
    }),
  );
  model.dispose();
  backend.dispose();
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: e instanceof Error ? e.message : String(e) }));
}
