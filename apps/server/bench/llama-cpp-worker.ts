/**
 * The llama.cpp side of `bun run bench server`, in a child process: FILE in node-llama-cpp 3.21.1
 * (prebuilt CPU binaries, no download) with a context of N sequences, N concurrent sequences each
 * evaluating an 8-token prompt and then TG single-token decode steps (no sampling, as llama-bench's
 * tg); node-llama-cpp batches the sequences' concurrent evaluations into one llama_decode. Once untimed
 * (warm-up), once timed. Prints `{ok, tokens_per_second, latencies_ms}` as ./ours-worker.ts.
 *
 * usage: bun apps/server/bench/llama-cpp-worker.ts FILE N TG THREADS
 */
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const [file, nText, tgText, threadsText] = Bun.argv.slice(2);
const n = Number(nText);
const tg = Number(tgText);
const threads = Number(threadsText);
try {
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    progressLogs: false,
    maxThreads: threads,
  });
  const model = await llama.loadModel({ modelPath: file as string, useMmap: true });
  const context = await model.createContext({
    contextSize: 256 * n,
    sequences: n,
    batchSize: 512,
    threads: { ideal: threads, min: threads },
  });
  const seqs = Array.from({ length: n }, () => context.getSequence());
  const run = async (tokens: number) =>
    await Promise.all(
      seqs.map(async (seq, k) => {
        await seq.clearHistory();
        const t0 = performance.now();
        await seq.evaluateWithoutGeneratingNewTokens(
          Array.from({ length: 8 }, (_, i) => 100 + k * 8 + i) as never,
        );
        for (let i = 0; i < tokens; i++)
          await seq.evaluateWithoutGeneratingNewTokens([1000 + ((k * 31 + i * 7) % 5000)] as never);
        return performance.now() - t0;
      }),
    );
  await run(4);
  const t0 = performance.now();
  const latencies = await run(tg);
  const seconds = (performance.now() - t0) / 1000;
  console.log(JSON.stringify({ ok: true, tokens_per_second: (n * tg) / seconds, latencies_ms: latencies }));
  await context.dispose();
  await model.dispose();
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: (e as Error).message }));
}
