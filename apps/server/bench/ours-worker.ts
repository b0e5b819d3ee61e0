/**
 * Our side of `bun run bench server`, in a child process: load FILE into an LlmEngine of N slots
 * (continuous batching on), serve it on loopback, and send N concurrent /v1/completions requests of
 * TG tokens each (`ignore_eos`, greedy) through HTTP, once untimed (warm-up) and once timed. Prints one
 * JSON line `{ok, tokens_per_second, latencies_ms}`: N·TG over the wall time of the timed round, and
 * each request's time from send to its answer.
 *
 * usage: bun apps/server/bench/ours-worker.ts FILE N TG THREADS
 */
import { loadModel } from "@tp/llm";
import { loadBackend } from "@tp/tensor";
import { LlmEngine } from "../llm.ts";
import { startServer } from "../server.ts";

const [file, nText, tgText, threadsText] = Bun.argv.slice(2);
const n = Number(nText);
const tg = Number(tgText);
try {
  const backend = await loadBackend("cpu", { threads: Number(threadsText) });
  const engine = new LlmEngine(loadModel(file as string, { backend }), {
    name: "bench",
    parallel: n,
    queueLimit: n,
    ctx: 256,
    defaultMaxTokens: tg,
    reasoningFormat: "none",
  });
  const server = startServer({ llm: engine, port: 0 });
  const ask = async (k: number, tokens: number): Promise<number> => {
    const t0 = performance.now();
    const res = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({
        prompt: `Request ${k}: once upon a time`,
        max_tokens: tokens,
        temperature: 0,
        ignore_eos: true,
      }),
    });
    const body = (await res.json()) as { usage?: { completion_tokens: number }; error?: { message: string } };
    if (!res.ok || body.usage?.completion_tokens !== tokens)
      throw new Error(body.error?.message ?? `request ${k} got ${JSON.stringify(body.usage)}`);
    return performance.now() - t0;
  };
  const round = (tokens: number) => Promise.all(Array.from({ length: n }, (_, k) => ask(k, tokens)));
  await round(4);
  const t0 = performance.now();
  const latencies = await round(tg);
  const seconds = (performance.now() - t0) / 1000;
  console.log(JSON.stringify({ ok: true, tokens_per_second: (n * tg) / seconds, latencies_ms: latencies }));
  await server.stop();
  engine.dispose();
  backend.dispose();
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: (e as Error).message }));
}
