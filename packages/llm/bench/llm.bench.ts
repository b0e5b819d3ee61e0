/**
 * `bun run bench llm`: prompt processing (512 tokens) and generation (128 tokens) of a random-weight
 * model with Qwen3-0.6B's shapes in Q8_0 and Q4_0 (./model.ts), one with Gemma 3 1B's shapes in
 * Q4_0 (./gemma3-model.ts), one with Qwen3.5-0.8B's shapes in Q4_0 (./qwen35-model.ts: 18 Gated DeltaNet
 * + 6 gated-attention layers) and one with Qwen3-30B-A3B's shapes truncated to 4 of its 48 layers in Q4_0
 * (./moe-model.ts: 128 experts, 8 per token), on 2 CPU threads, against llama.cpp
 * (node-llama-cpp 3.21.1, prebuilt CPU binaries) on the same files in the same run, plus peak RSS; and
 * the same shapes as a scaled-fp8 safetensors folder (./fp8-model.ts), ours only.
 * Each measurement runs in a fresh child process (./ours-worker.ts, ./llama-cpp-worker.ts) started
 * through the harness's `runChild`, so a native crash cannot take the harness down and peak RSS is
 * that process's own (its VmHWM as it exits, measured the same way for every engine).
 *
 * Targets (issue #5): generation ≥ 1.0× llama.cpp, prompt processing ≥ 0.8×, our peak RSS ≤ file +
 * KV cache + 200 MB (the "rss over file+kv" row; the KV cache is ours: f32, CTX rows).
 *
 * `--baseline DIR`: every case of ours also runs DIR's packages/llm/bench/ours-worker.ts (another
 * commit's checkout, installed and built) on the same files, interleaved with this tree's.
 *
 * Environment: TP_BENCH_DIR (where the models are cached; default the OS temp dir), TP_BENCH_THREADS
 * (default 2). Skips (no cases, with the reason on stderr) when the tokenizer source file
 * ../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf is absent.
 */
import { existsSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { TpError } from "@tp/tensor";
import { fp8BenchModel } from "./fp8-model.ts";
import { gemma3BenchKvBytes, gemma3BenchModel } from "./gemma3-model.ts";
import { type BenchQuant, benchKvBytes, benchModel, TOKENIZER_SOURCE } from "./model.ts";
import { benchMoeKvBytes, benchMoeModel, MOE_BENCH_LAYERS } from "./moe-model.ts";
import { qwen35BenchModel, qwen35BenchStateBytes } from "./qwen35-model.ts";

const THREADS = Number(process.env.TP_BENCH_THREADS ?? 2);
/** Context window of both engines: the 512-token prompt plus room; our f32 KV is CTX rows. */
const CTX = 1024;
const PP = 512;
const TG = 128;
const MB = 1e6;
/** Where a checkout keeps our worker (this tree's and a --baseline DIR's). */
const OURS_WORKER = "packages/llm/bench/ours-worker.ts";

/** The fields of scripts/bench-harness.ts's BenchContext this suite uses (packages import no file outside them). */
interface Context {
  baseline: { dir: string; rev: string; name: string } | null;
  runChild(
    script: string,
    args: string[],
    options?: { cwd?: string },
  ): {
    result: Record<string, unknown> | null;
    peakRssBytes: number | null;
    exitCode: number | null;
    stderr: string;
  };
}

interface WorkerResult {
  tokens_per_second: number;
  peak_rss_bytes: number;
  ms_per_token_engine?: number;
}

/** One engine: a worker script, the directory it runs in, and its label in progress lines. */
interface Engine {
  label: string;
  script: string;
  cwd?: string;
}

/**
 * One run of `engine`'s worker on `file` (`pp` or `tg`, `n` tokens) in a fresh process: its tok/s, its
 * own peak RSS in bytes and, for ours, its ms per token outside model.step.
 * @throws TpError E_INTERNAL when the worker prints no result, reports a failure or lacks a field
 */
function worker(context: Context, engine: Engine, file: string, mode: "pp" | "tg", n: number): WorkerResult {
  const args = [file, mode, String(n), String(THREADS), String(CTX)];
  const p = context.runChild(engine.script, args, engine.cwd === undefined ? {} : { cwd: engine.cwd });
  const r = p.result;
  const where = `${engine.label} ${mode} on ${file}`;
  if (r === null) {
    throw new TpError("E_INTERNAL", `${where} printed no result (exit ${p.exitCode}): ${p.stderr}`);
  }
  if (r.ok !== true) throw new TpError("E_INTERNAL", `${where}: ${String(r.error)}`);
  if (typeof r.tokens_per_second !== "number" || p.peakRssBytes === null) {
    throw new TpError("E_INTERNAL", `${where}: no tokens_per_second or peak RSS (exit ${p.exitCode})`);
  }
  const out: WorkerResult = { tokens_per_second: r.tokens_per_second, peak_rss_bytes: p.peakRssBytes };
  if (typeof r.ms_per_token_engine === "number") out.ms_per_token_engine = r.ms_per_token_engine;
  // progress on stderr: one run takes seconds to minutes (the harness records the load average)
  process.stderr.write(
    `  ${engine.label} ${mode}${n} ${file.split("-").pop()}: ${out.tokens_per_second.toFixed(2)} tok/s, ` +
      `peak RSS ${(out.peak_rss_bytes / MB).toFixed(0)} MB` +
      (out.ms_per_token_engine !== undefined && mode === "tg"
        ? `, engine ${out.ms_per_token_engine.toFixed(2)} ms/token`
        : "") +
      "\n",
  );
  return out;
}

export default {
  description:
    `random Qwen3-0.6B-, Gemma-3-1B-, Qwen3.5-0.8B- and Qwen3-30B-A3B-shaped (${MOE_BENCH_LAYERS} layers) models, pp${PP} / tg${TG} tok/s at ${THREADS} threads and peak RSS, ` +
    "vs llama.cpp (node-llama-cpp 3.21.1, CPU) on the same GGUF; ratio > 1 = we are better",
  usage: [
    "  --baseline DIR    supported: DIR's packages/llm/bench/ours-worker.ts runs beside ours on every",
    "                    case of ours (tok/s, peak RSS, engine overhead), each in a fresh process",
    "  TP_BENCH_THREADS  threads of both engines (default 2)",
    "  TP_BENCH_DIR      where the random models are cached (default the OS temp dir)",
  ].join("\n"),
  cases(context: Context) {
    const ours: Engine = { label: "ours", script: resolve(import.meta.dir, "ours-worker.ts") };
    const llamaCpp: Engine = { label: "llama.cpp", script: resolve(import.meta.dir, "llama-cpp-worker.ts") };
    let baseline: Engine | null = null;
    if (context.baseline !== null) {
      const script = join(context.baseline.dir, OURS_WORKER);
      if (!existsSync(script)) {
        throw new TpError("E_ARG", `--baseline ${context.baseline.dir} has no ${OURS_WORKER}`);
      }
      baseline = { label: context.baseline.name, script, cwd: context.baseline.dir };
    }
    const models: { name: string; path: string; kvBytes: number }[] = [];
    for (const q of ["Q8_0", "Q4_0"] as const satisfies readonly BenchQuant[]) {
      const p = benchModel(q);
      if (p === null) {
        console.error(
          `skipped: ${TOKENIZER_SOURCE} is absent (the shared models folder is not beside this checkout)`,
        );
        return [];
      }
      models.push({ name: `qwen3-0.6b-shapes ${q}`, path: p, kvBytes: benchKvBytes(CTX, 4) });
    }
    const gemma = gemma3BenchModel(); // its local layers hold a ring of window + 512 rows
    if (gemma !== null)
      models.push({ name: "gemma3-1b-shapes Q4_0", path: gemma, kvBytes: gemma3BenchKvBytes(CTX) });
    const qwen35 = qwen35BenchModel(); // "kv" = the 6 attention layers' KV + the 18 GDN layers' state
    if (qwen35 !== null)
      models.push({ name: "qwen35-0.8b-shapes Q4_0", path: qwen35, kvBytes: qwen35BenchStateBytes(CTX) });
    const moe = benchMoeModel(); // 4 of Qwen3-30B-A3B's 48 layers: 1.76 GB
    if (moe !== null)
      models.push({
        name: `qwen3-30b-a3b-shapes ${MOE_BENCH_LAYERS}-layer Q4_0`,
        path: moe,
        kvBytes: benchMoeKvBytes(CTX, 4),
      });
    const ggufCases = models.flatMap(({ name, path, kvBytes }) => {
      /** Peak RSS and engine ms/token over every run of each side. */
      const seen = {
        ours: { peak: 0, engine: [] as number[] },
        baseline: { peak: 0, engine: [] as number[] },
        peer: { peak: 0, engine: [] as number[] },
      };
      const run = (e: Engine, side: keyof typeof seen, mode: "pp" | "tg", n: number) => () => {
        const r = worker(context, e, path, mode, n);
        seen[side].peak = Math.max(seen[side].peak, r.peak_rss_bytes);
        if (r.ms_per_token_engine !== undefined && mode === "tg")
          seen[side].engine.push(r.ms_per_token_engine);
        return r.tokens_per_second;
      };
      /** The tok/s case of `mode` over `n` tokens: ours, llama.cpp and the baseline, each in its own processes. */
      const speed = (mode: "pp" | "tg", n: number, metric: string) => ({
        case: `${name} ${mode}${n}`,
        metric,
        unit: "tok/s",
        better: "higher" as const,
        runs: 3,
        ours: run(ours, "ours", mode, n),
        peer: { name: "llama.cpp", run: run(llamaCpp, "peer", mode, n) },
        ...(baseline === null ? {} : { baseline: run(baseline, "baseline", mode, n) }),
      });
      const fileBytes = statSync(path).size;
      const overRss = (side: "ours" | "baseline") => () => (seen[side].peak - fileBytes - kvBytes) / MB;
      const engineMs = (side: "ours" | "baseline") => () => {
        const e = seen[side].engine;
        return e.length === 0 ? 0 : e.reduce((a, b) => a + b, 0) / e.length;
      };
      return [
        speed("pp", PP, "prompt processing"),
        speed("tg", TG, "generation"),
        {
          case: `${name} peak rss`,
          metric: "peak RSS over the runs above (each process's own VmHWM)",
          unit: "MB",
          better: "lower" as const,
          timed: false,
          ours: () => seen.ours.peak / MB,
          peer: { name: "llama.cpp", run: () => seen.peer.peak / MB },
          ...(baseline === null ? {} : { baseline: () => seen.baseline.peak / MB }),
        },
        {
          case: `${name} rss over file+kv`,
          metric: `peak RSS − file (${(fileBytes / MB).toFixed(0)} MB) − f32 KV (${(kvBytes / MB).toFixed(0)} MB); target ≤ 200`,
          unit: "MB",
          better: "lower" as const,
          timed: false,
          ours: overRss("ours"),
          ...(baseline === null ? {} : { baseline: overRss("baseline") }),
        },
        {
          case: `${name} engine overhead`,
          metric: "ms per generated token outside model.step (logits read, argmax, detokenize)",
          unit: "ms",
          better: "lower" as const,
          timed: false,
          ours: engineMs("ours"),
          ...(baseline === null ? {} : { baseline: engineMs("baseline") }),
        },
      ];
    });
    // the same shapes as a scaled-fp8 safetensors checkpoint (./fp8-model.ts): ours only, llama.cpp reads no fp8
    const fp8 = fp8BenchModel();
    const fp8Cases =
      fp8 === null
        ? []
        : (["pp", "tg"] as const).map((mode) => {
            const n = mode === "pp" ? PP : TG;
            const tps = (e: Engine) => () => worker(context, e, fp8, mode, n).tokens_per_second;
            return {
              case: `qwen3-0.6b-shapes fp8 safetensors ${mode}${n}`,
              metric: `${mode === "pp" ? "prompt processing" : "generation"} (no peer: llama.cpp reads no fp8)`,
              unit: "tok/s",
              better: "higher" as const,
              runs: 3,
              ours: tps(ours),
              ...(baseline === null ? {} : { baseline: tps(baseline) }),
            };
          });
    return [...ggufCases, ...fp8Cases];
  },
};
