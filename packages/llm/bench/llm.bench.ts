/**
 * `bun run bench llm`: prompt processing (512 tokens) and generation (128 tokens) of a random-weight
 * model with Qwen3-0.6B's shapes in Q8_0 and Q4_0 (./model.ts), on 2 CPU threads, against llama.cpp
 * (node-llama-cpp 3.21.1, prebuilt CPU binaries) on the same files in the same run, plus peak RSS; and
 * the same shapes as a scaled-fp8 safetensors folder (./fp8-model.ts), ours only.
 * Each measurement runs in a fresh child process (./ours-worker.ts, ./llama-cpp-worker.ts), so a
 * native crash cannot take the harness down and peak RSS is that process's own.
 *
 * Targets (issue #5): generation ≥ 1.0× llama.cpp, prompt processing ≥ 0.8×, our peak RSS ≤ file +
 * KV cache + 200 MB (the "rss over file+kv" row; the KV cache is ours: f32, CTX rows).
 *
 * Environment: TP_BENCH_DIR (where the models are cached; default the OS temp dir), TP_BENCH_THREADS
 * (default 2). Skips (no cases, with the reason on stderr) when the tokenizer source file
 * ../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf is absent.
 */
import { statSync } from "node:fs";
import { loadavg } from "node:os";
import { resolve } from "node:path";
import { TpError } from "@tp/tensor";
import { fp8BenchModel } from "./fp8-model.ts";
import { type BenchQuant, benchKvBytes, benchModel, TOKENIZER_SOURCE } from "./model.ts";

const THREADS = Number(process.env.TP_BENCH_THREADS ?? 2);
/** Context window of both engines: the 512-token prompt plus room; our f32 KV is CTX rows. */
const CTX = 1024;
const PP = 512;
const TG = 128;
const MB = 1e6;

interface WorkerResult {
  ok: boolean;
  tokens_per_second: number;
  peak_rss_bytes: number;
  ms_per_token_engine?: number;
  error?: string;
}

function worker(script: string, file: string, mode: "pp" | "tg", n: number): WorkerResult {
  const load = loadavg()[0] ?? 0; // this machine is shared: a figure means little without the load
  const p = Bun.spawnSync(
    ["bun", resolve(import.meta.dir, script), file, mode, String(n), String(THREADS), String(CTX)],
    { stdout: "pipe", stderr: "pipe" },
  );
  const line = p.stdout.toString().trim().split("\n").pop() ?? "";
  let r: WorkerResult;
  try {
    r = JSON.parse(line);
  } catch {
    throw new TpError(
      "E_INTERNAL",
      `${script} ${mode} on ${file} printed no result (exit ${p.exitCode}): ${p.stderr.toString().trim().slice(-400)}`,
    );
  }
  if (!r.ok) throw new TpError("E_INTERNAL", `${script} ${mode} on ${file}: ${r.error}`);
  // progress on stderr: one run takes seconds to minutes
  console.error(
    `  ${script.replace("-worker.ts", "")} ${mode}${n} ${file.split("-").pop()}: ${r.tokens_per_second.toFixed(2)} tok/s, ` +
      `peak RSS ${(r.peak_rss_bytes / MB).toFixed(0)} MB` +
      (r.ms_per_token_engine !== undefined && mode === "tg"
        ? `, engine ${r.ms_per_token_engine.toFixed(2)} ms/token`
        : "") +
      `, load average ${load.toFixed(1)} → ${(loadavg()[0] ?? 0).toFixed(1)}`,
  );
  return r;
}

export default {
  description:
    `random Qwen3-0.6B-shaped model, pp${PP} / tg${TG} tok/s at ${THREADS} threads and peak RSS, ` +
    "vs llama.cpp (node-llama-cpp 3.21.1, CPU) on the same GGUF; ratio > 1 = we are better",
  cases() {
    const paths: [BenchQuant, string][] = [];
    for (const q of ["Q8_0", "Q4_0"] as const) {
      const p = benchModel(q);
      if (p === null) {
        console.error(
          `skipped: ${TOKENIZER_SOURCE} is absent (the shared models folder is not beside this checkout)`,
        );
        return [];
      }
      paths.push([q, p]);
    }
    const ggufCases = paths.flatMap(([q, path]) => {
      const name = `qwen3-0.6b-shapes ${q}`;
      const peak = { ours: 0, peer: 0 };
      const engine: number[] = [];
      const ours = (mode: "pp" | "tg", n: number) => () => {
        const r = worker("ours-worker.ts", path, mode, n);
        peak.ours = Math.max(peak.ours, r.peak_rss_bytes);
        if (r.ms_per_token_engine !== undefined && mode === "tg") engine.push(r.ms_per_token_engine);
        return r.tokens_per_second;
      };
      const peer = (mode: "pp" | "tg", n: number) => () => {
        const r = worker("llama-cpp-worker.ts", path, mode, n);
        peak.peer = Math.max(peak.peer, r.peak_rss_bytes);
        return r.tokens_per_second;
      };
      const fileBytes = statSync(path).size;
      const kvBytes = benchKvBytes(CTX, 4);
      return [
        {
          case: `${name} pp${PP}`,
          metric: "prompt processing",
          unit: "tok/s",
          better: "higher" as const,
          runs: 3,
          ours: ours("pp", PP),
          peer: { name: "llama.cpp", run: peer("pp", PP) },
        },
        {
          case: `${name} tg${TG}`,
          metric: "generation",
          unit: "tok/s",
          better: "higher" as const,
          runs: 3,
          ours: ours("tg", TG),
          peer: { name: "llama.cpp", run: peer("tg", TG) },
        },
        {
          case: `${name} peak rss`,
          metric: "peak RSS over the runs above",
          unit: "MB",
          better: "lower" as const,
          runs: 1,
          ours: () => peak.ours / MB,
          peer: { name: "llama.cpp", run: () => peak.peer / MB },
        },
        {
          case: `${name} rss over file+kv`,
          metric: `peak RSS − file (${(fileBytes / MB).toFixed(0)} MB) − f32 KV (${(kvBytes / MB).toFixed(0)} MB); target ≤ 200`,
          unit: "MB",
          better: "lower" as const,
          runs: 1,
          ours: () => (peak.ours - fileBytes - kvBytes) / MB,
        },
        {
          case: `${name} engine overhead`,
          metric: "ms per generated token outside model.step (logits read, argmax, detokenize)",
          unit: "ms",
          better: "lower" as const,
          runs: 1,
          ours: () => (engine.length === 0 ? 0 : engine.reduce((a, b) => a + b, 0) / engine.length),
        },
      ];
    });
    // the same shapes as a scaled-fp8 safetensors checkpoint (./fp8-model.ts): ours only, llama.cpp reads no fp8
    const fp8 = fp8BenchModel();
    const fp8Cases =
      fp8 === null
        ? []
        : (["pp", "tg"] as const).map((mode) => ({
            case: `qwen3-0.6b-shapes fp8 safetensors ${mode}${mode === "pp" ? PP : TG}`,
            metric: `${mode === "pp" ? "prompt processing" : "generation"} (no peer: llama.cpp reads no fp8)`,
            unit: "tok/s",
            better: "higher" as const,
            runs: 3,
            ours: () => worker("ours-worker.ts", fp8, mode, mode === "pp" ? PP : TG).tokens_per_second,
          }));
    return [...ggufCases, ...fp8Cases];
  },
};
