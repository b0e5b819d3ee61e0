/**
 * `bun run bench server`: aggregate generation tok/s and per-request latency (p50 / p99) of the server
 * at 1, 4 and 8 concurrent sequences (`--parallel N`, continuous batching) on the random
 * Qwen3-0.6B-shaped Q4_0 file of `bun run bench llm`, against llama.cpp (node-llama-cpp 3.21.1, CPU)
 * decoding the same number of sequences in one multi-sequence context, in the same run. Ours goes
 * through HTTP (completions, greedy sampling, the server's bookkeeping); llama.cpp's side is its raw
 * batched decode, so the comparison is conservative for us.
 * Targets (issue 28): aggregate tok/s at 8 sequences ≥ 3× our single-sequence tok/s, and ≥ llama.cpp's at 8.
 *
 * Environment: TP_SERVER_BENCH_MODEL (a GGUF; default the file `bun run bench llm` caches in
 * TP_BENCH_DIR or the OS temp dir: run that suite once first), TP_BENCH_THREADS (default 2),
 * TP_SERVER_BENCH_TOKENS (tokens per request, default 32).
 */
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { TpError } from "@tp/tensor";

const THREADS = Number(process.env.TP_BENCH_THREADS ?? 2);
const TG = Number(process.env.TP_SERVER_BENCH_TOKENS ?? 32);
const FILE =
  process.env.TP_SERVER_BENCH_MODEL ??
  join(process.env.TP_BENCH_DIR ?? tmpdir(), "tensorpencil-bench", "qwen3-0.6b-shapes-random-Q4_0.gguf");

interface Context {
  runChild(
    script: string,
    args: string[],
  ): { result: Record<string, unknown> | null; exitCode: number | null; stderr: string };
}

/** The q-quantile of `xs` (nearest rank). */
function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] as number;
}

export default {
  description: `server: aggregate tok/s and p50 / p99 latency at 1, 4, 8 sequences (tg${TG}, ${THREADS} threads) vs llama.cpp's multi-sequence decode`,
  usage: [
    "  TP_SERVER_BENCH_MODEL   the GGUF (default: bun run bench llm's qwen3-0.6b-shapes-random-Q4_0.gguf)",
    "  TP_BENCH_THREADS        threads of both engines (default 2)",
    "  TP_SERVER_BENCH_TOKENS  tokens per request (default 32)",
  ].join("\n"),
  cases(context: Context) {
    if (!existsSync(FILE)) {
      console.error(
        `skipped: ${FILE} is absent (run \`bun run bench llm\` once, or set TP_SERVER_BENCH_MODEL)`,
      );
      return [];
    }
    const worker = (script: string, label: string, n: number) => {
      const p = context.runChild(resolve(import.meta.dir, script), [
        FILE,
        String(n),
        String(TG),
        String(THREADS),
      ]);
      const r = p.result;
      if (r === null || r.ok !== true)
        throw new TpError(
          "E_INTERNAL",
          `${label} at ${n} sequences: ${r === null ? `no result (exit ${p.exitCode}): ${p.stderr}` : String(r.error)}`,
        );
      process.stderr.write(`  ${label} ${n} seq: ${(r.tokens_per_second as number).toFixed(1)} tok/s\n`);
      return r as { tokens_per_second: number; latencies_ms: number[] };
    };
    const latencies = new Map<string, number[]>();
    const rates = new Map<string, number[]>();
    const record = (key: string, r: { tokens_per_second: number; latencies_ms: number[] }) => {
      latencies.set(key, [...(latencies.get(key) ?? []), ...r.latencies_ms]);
      rates.set(key, [...(rates.get(key) ?? []), r.tokens_per_second]);
      return r.tokens_per_second;
    };
    const median = (xs: readonly number[]) => quantile(xs, 0.5);
    const cases = [1, 4, 8].flatMap((n) => {
      const name = `qwen3-0.6b-shapes Q4_0, ${n} seq`;
      return [
        {
          case: name,
          metric: "aggregate tok/s",
          unit: "tok/s",
          better: "higher" as const,
          runs: 3,
          ours: () => record(`ours ${n}`, worker("ours-worker.ts", "ours", n)),
          peer: {
            name: "llama.cpp",
            run: () => record(`peer ${n}`, worker("llama-cpp-worker.ts", "llama.cpp", n)),
          },
        },
        ...(["p50", "p99"] as const).map((q) => ({
          case: name,
          metric: `${q} request latency`,
          unit: "ms",
          better: "lower" as const,
          timed: false,
          ours: () => quantile(latencies.get(`ours ${n}`) ?? [Number.NaN], q === "p50" ? 0.5 : 0.99),
          peer: {
            name: "llama.cpp",
            run: () => quantile(latencies.get(`peer ${n}`) ?? [Number.NaN], q === "p50" ? 0.5 : 0.99),
          },
        })),
      ];
    });
    cases.push({
      case: "qwen3-0.6b-shapes Q4_0",
      metric: "8 seq / 1 seq aggregate tok/s",
      unit: "×",
      better: "higher" as const,
      timed: false,
      ours: () => median(rates.get("ours 8") ?? [Number.NaN]) / median(rates.get("ours 1") ?? [Number.NaN]),
      peer: {
        name: "llama.cpp",
        run: () => median(rates.get("peer 8") ?? [Number.NaN]) / median(rates.get("peer 1") ?? [Number.NaN]),
      },
    } as never);
    return cases;
  },
};
