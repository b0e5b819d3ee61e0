/**
 * Test helper (not exported from the package): the LLM end to end on one device backend against the
 * cpu backend (which parity.test.ts checks against llama.cpp). The shared tiny GGUFs (../shared/models)
 * run unchanged through `loadModel(path, { backend })` on both: next-token probabilities of every
 * prompt row, the same 32-token greedy continuation, and the probabilities of each of its steps within
 * a stated tolerance. {@link describeDeviceParity} defines one test per file for a backend the caller
 * starts (vulkan.test.ts, ptx-sim.test.ts, gpu.test.ts), skipped with the reason when ../shared/models
 * is absent or the backend cannot start.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend as createCpu } from "@tp/backend-cpu";
import type { Backend } from "@tp/tensor";
import { loadModel } from "../load.ts";
import { argmax, softmax } from "./llama-cpp.ts";

const MODELS = resolve(import.meta.dir, "../../../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));

/**
 * Absolute tolerance on next-token probabilities, device backend vs cpu, for every file: both take the
 * same products — f32 and f16 weights decoded exactly, GGUF blocks against x quantized as ggml's
 * vec_dot_type (Q8_0 / Q8_K) — and sum them in f32 in another order (the device's tiles, split-K and
 * split-KV attention vs the cpu's 4 × 4 / 6 × 64 kernels).
 */
export const PROB_TOL = 5e-5;
export const N_GREEDY = 32;
const PROMPT = "Once upon a time";
/**
 * The files compared. (gemma3-fullvocab-Q4_0 is left out: its 262144-row head takes minutes on
 * llvmpipe, longer on the PTX simulator.)
 */
export const FILES = [
  "real/stories260K-f32-v3.gguf",
  ...["F32", "F16", "Q8_0", "Q4_0"].flatMap((t) => [
    `synthetic/llama-tiny-${t}.gguf`,
    `synthetic/qwen3-tiny-${t}.gguf`,
    `synthetic/qwen3moe-tiny-${t}.gguf`,
    `synthetic/gemma3-tiny-${t}.gguf`,
    `synthetic/qwen35-tiny-${t}.gguf`,
  ]),
  ...["F32", "Q8_0", "Q4_0"].map((t) => `synthetic/qwen35moe-tiny-${t}.gguf`),
];
/**
 * The quantized hybrid files (Qwen 3.5 Q8_0 / Q4_0): both backends quantize activations to Q8_0 blocks,
 * and a value on a rounding boundary may round either way after the other summation order (the cpu's
 * chunked delta rule in f64 for the prompt vs the device backends' token-by-token f32); these layers
 * amplify one such step to ~0.1 nats (parity.test.ts HYBRID_PROB_TOL: the same against llama.cpp), so
 * the probabilities are compared at this looser tolerance, and the greedy tokens may part only where the
 * cpu's top-2 gap is within HYBRID_GAP_NATS. The tiny quantized Qwen3 MoE files amplify the same way
 * (a flipped int8 code changes a random router's and experts' output): with the cpu's AVX-512 kernels
 * (other sum orders than AVX2) the greedy tokens parted at step 30 where the top-2 gap was 0.085 nats.
 */
export const HYBRID_QUANT_TOL = 1e-1;
export const HYBRID_GAP_NATS = 0.3;
const isHybridQuant = (file: string) => /(qwen35|qwen3moe).*-Q(8_0|4_0)\./.test(file);

/**
 * Gemma's quantized tiny files: both backends quantize each matmul's input to Q8_0, which is
 * discontinuous, and six layers of random weights with sandwich norms amplify the last-ulp differences
 * of the GELU and the sums into flipped int8 roundings; measured on Vulkan 1.6e-3 (Q8_0) and 2.4e-2
 * (Q4_0, the same size as its distance from llama.cpp, parity.test.ts), greedy tokens identical.
 */
export const GEMMA_QUANT_TOL: Readonly<Record<string, number>> = {
  "synthetic/gemma3-tiny-Q8_0.gguf": 5e-3,
  "synthetic/gemma3-tiny-Q4_0.gguf": 5e-2,
};
/** Gemma's sliding-window ring takes 4 rows per step here (ring 8 + 4 rows): it wraps within the run. */
const RING_BATCH = 4;
/** Per-file time limit before {@link DeviceParityOptions.timeScale} (ms): llvmpipe's, with margin. */
const BASE_TIMEOUT_MS = 60_000;

/** log(p1 / p2) of the two most likely tokens. */
function top2Gap(p: Float64Array): number {
  let a = 0;
  let b = 0;
  for (const v of p) {
    if (v > a) [a, b] = [v, a];
    else if (v > b) b = v;
  }
  return Math.log(a / b);
}

function maxDiff(a: Float64Array, b: Float64Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs((a[i] as number) - (b[i] as number));
    m = Number.isNaN(d) ? Number.POSITIVE_INFINITY : Math.max(m, d);
  }
  return m;
}

interface Run {
  promptIds: number[];
  /** Probabilities of every prompt row, then of each greedy step. */
  promptRows: Float64Array[];
  steps: Float64Array[];
  greedy: number[];
  text: string;
}

/** The prompt in one batched forward (every row's logits), then N_GREEDY greedy decode steps. */
async function run(backend: Backend, file: string): Promise<Run> {
  const { model, tokenizer, config } = loadModel(join(MODELS, file), {
    backend,
    maxContext: 64,
    kvRingBatch: RING_BATCH,
  });
  try {
    const V = config.vocab_size;
    const ids = tokenizer.encode(PROMPT, { addSpecial: true });
    const all = model.step(ids, { allLogits: true });
    const rows = (await backend.read(all)) as Float32Array;
    backend.free(all);
    const promptRows = ids.map((_, r) => softmax(rows, r * V, V));
    const steps: Float64Array[] = [promptRows[ids.length - 1] as Float64Array];
    const greedy: number[] = [];
    for (let i = 0; i < N_GREEDY; i++) {
      const next = argmax(steps[i] as Float64Array);
      greedy.push(next);
      if (i + 1 === N_GREEDY) break;
      const l = model.step([next]);
      steps.push(softmax((await backend.read(l)) as Float32Array, 0, V));
      backend.free(l);
    }
    return { promptIds: ids, promptRows, steps, greedy, text: tokenizer.decode(greedy) };
  } finally {
    model.dispose();
  }
}

/** Options of {@link describeDeviceParity}. */
export interface DeviceParityOptions {
  /** Factor on each file's time limit (default 1: 60 s, llvmpipe's); the PTX simulator needs more. */
  timeScale?: number;
  /**
   * Files this backend compares as the quantized hybrid ones (HYBRID_QUANT_TOL, greedy tokens up to a
   * near tie), with the caller's measured reason: a backend whose sums differ in order may flip one
   * Q8_0 activation code that the file's random layers amplify.
   */
  activationFlipFiles?: readonly string[];
}

/**
 * Define the device-vs-cpu parity tests for one backend: a describe block "LLM on the `label` backend
 * vs the cpu backend" with one test per file of {@link FILES} — the prompt ids equal, every prompt
 * row's probabilities within the file's tolerance, the 32 greedy tokens identical (a quantized hybrid
 * file may part only at a near tie), each step's probabilities within the tolerance, the stories260K
 * story as llama.cpp tells it, and the backend's memory back to 0 after each file. When
 * ../shared/models is absent or `start` throws, the block is skipped and one skipped test names the
 * reason. The backend is disposed after the block. Call it at a test file's top level and await it.
 * @param label the backend as test names spell it ("Vulkan", "ptx (simulated sm_86)")
 * @param start creates the backend (e.g. `() => loadBackend("ptx", { simulate: "sm_86" })`); called
 *   only when ../shared/models is present
 */
export async function describeDeviceParity(
  label: string,
  start: () => Backend | Promise<Backend>,
  options: DeviceParityOptions = {},
): Promise<void> {
  const timeout = BASE_TIMEOUT_MS * (options.timeScale ?? 1);
  let started: Backend | undefined;
  let why = "";
  if (HAVE_MODELS) {
    try {
      started = await start();
    } catch (e) {
      const m = e instanceof Error ? e.message : String(e);
      why = m.split("\n")[0] ?? m;
    }
  }
  const SKIP = !HAVE_MODELS
    ? `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`
    : started === undefined
      ? `skipped: the ${label} backend cannot start (${why})`
      : "";

  describe.skipIf(SKIP !== "")(
    `LLM on the ${label} backend vs the cpu backend${SKIP ? ` — ${SKIP}` : ""}`,
    () => {
      const cpu = createCpu({ threads: 2 });
      const gpu = started as Backend;
      afterAll(() => {
        cpu.dispose();
        gpu?.dispose();
      });

      for (const file of FILES) {
        const loose = isHybridQuant(file) || (options.activationFlipFiles ?? []).includes(file);
        const tol = GEMMA_QUANT_TOL[file] ?? (loose ? HYBRID_QUANT_TOL : PROB_TOL);
        const tie = loose ? " (up to a near tie)" : "";
        test(
          `${file}: ${N_GREEDY} greedy tokens identical${tie}, probabilities within ${tol}`,
          async () => {
            const ours = await run(gpu, file);
            const ref = await run(cpu, file);
            expect(ours.promptIds).toEqual(ref.promptIds);
            ours.promptRows.forEach((p, r) => {
              expect(`prompt row ${r}: ${maxDiff(p, ref.promptRows[r] as Float64Array) <= tol}`).toBe(
                `prompt row ${r}: true`,
              );
            });
            // identical greedy tokens; a quantized hybrid file may part only where the cpu's top-2 gap
            // is within HYBRID_GAP_NATS (nothing after it is comparable)
            let same = ours.greedy.findIndex((t, i) => t !== ref.greedy[i]);
            if (same === -1) same = N_GREEDY;
            else {
              const gap = top2Gap(ref.steps[same] as Float64Array);
              expect({
                step: same,
                gap,
                nearTie: loose && gap <= HYBRID_GAP_NATS,
              }).toMatchObject({
                nearTie: true,
              });
            }
            ours.steps.slice(0, same).forEach((p, i) => {
              expect(`step ${i}: ${maxDiff(p, ref.steps[i] as Float64Array) <= tol}`).toBe(`step ${i}: true`);
            });
            if (file.includes("stories260K")) {
              // the trained model's story, as llama.cpp tells it (parity.test.ts)
              expect(
                ours.text.startsWith(
                  ", there was a little girl named Lily. She loved to play outside in the park.",
                ),
              ).toBe(true);
            }
            expect(gpu.memory.current).toBe(0); // the model, its KV cache and every temporary freed
          },
          timeout,
        );
      }
    },
  );

  if (SKIP !== "") test.skip(SKIP, () => {});
}
