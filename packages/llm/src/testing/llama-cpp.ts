/**
 * The llama.cpp oracle of the parity tests: node-llama-cpp 3.21.1's prebuilt CPU llama.cpp run in a
 * child process (scripts/llama-cpp-oracle.ts, so a native crash cannot take the runner down), and the
 * small float64 helpers the tests compare its answers with.
 */
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import type { Backend, Tensor } from "@tp/tensor";

const ORACLE = resolve(import.meta.dir, "../../scripts/llama-cpp-oracle.ts");

/** The folder of node-llama-cpp's prebuilt linux-x64 binaries, or null where there is none. */
export function llamaCppBinary(): string | null {
  if (process.platform !== "linux" || process.arch !== "x64") return null;
  try {
    const dir = resolve(
      createRequire(import.meta.url).resolve("@node-llama-cpp/linux-x64/package.json"),
      "..",
    );
    return existsSync(join(dir, "bins")) ? dir : null;
  } catch {
    return null;
  }
}

/**
 * Run the oracle on GGUF `path` with `spec` (JSON: ids, n, top, threads, text, texts, … as
 * scripts/llama-cpp-oracle.ts reads them); its last stdout line, or `{ok: false, error}` when it
 * printed nothing (killed after 300 s: the full-vocabulary files take a while on a busy machine).
 */
export async function runLlamaCppOracle<T>(path: string, spec: object): Promise<T> {
  const p = Bun.spawn([process.execPath, ORACLE, path, JSON.stringify(spec)], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const timer = setTimeout(() => p.kill(), 300_000);
  const out = await new Response(p.stdout).text();
  await p.exited;
  clearTimeout(timer);
  return JSON.parse(out.trim().split("\n").pop() || '{"ok":false,"error":"no output"}') as T;
}

/**
 * Make a Gemma 3 model's MLP gate use llama.cpp's CPU GELU: an f16 table (ggml-cpu vec.h
 * `GGML_GELU_FP16`: gelu_f32 of the input rounded to f16, the result stored as f16), emulated by
 * rounding the gate and the GELU through f16. A test-only override of `Gemma3Model.gelu`, for
 * comparisons where that rounding would otherwise dominate.
 */
export function emulateLlamaCppGelu(model: { gelu: (x: Tensor) => Tensor }, backend: Backend): void {
  const f16 = (t: Tensor) => backend.cast(backend.cast(t, "f16"), "f32");
  model.gelu = (x) => f16(backend.gelu(f16(x), { approximate: "tanh" }));
}

/** softmax of logits `l[offset, offset + v)` in float64. */
export function softmax(l: Float32Array, offset: number, v: number): Float64Array {
  let m = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < v; i++) m = Math.max(m, l[offset + i] as number);
  const p = new Float64Array(v);
  let s = 0;
  for (let i = 0; i < v; i++) {
    p[i] = Math.exp((l[offset + i] as number) - m);
    s += p[i] as number;
  }
  for (let i = 0; i < v; i++) p[i] = (p[i] as number) / s;
  return p;
}

/** Index of the largest entry (the first of ties). */
export function argmax(p: Float64Array): number {
  let best = 0;
  for (let i = 1; i < p.length; i++) if ((p[i] as number) > (p[best] as number)) best = i;
  return best;
}

/** Largest |p_ours − p_llama| over llama.cpp's top entries `[token, probability]`. */
export function topDiff(ours: Float64Array, theirs: [number, number][]): number {
  let m = 0;
  for (const [t, q] of theirs) m = Math.max(m, Math.abs((ours[t] as number) - q));
  return m;
}
