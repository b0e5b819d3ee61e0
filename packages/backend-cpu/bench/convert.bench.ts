/**
 * `bun run bench convert`: throughput of the native f16 ⇄ f32 conversion (tp_cpu_cast, all threads,
 * best ISA level) against Bun's own Float16Array conversion (JavaScriptCore, `new Float32Array(f16)` /
 * `Float16Array.set(f32)`), the same 16 Mi elements, in one process. Unit: GB/s of input read.
 */
import { loadCpuLibrary } from "@tp/backend-cpu";

const N = 16 * 1024 * 1024;

function seconds(fn: () => void): number {
  const t0 = performance.now();
  fn();
  return (performance.now() - t0) / 1000;
}

const lib = loadCpuLibrary();
const ctx = lib.createContext(0);
const f32 = new Float32Array(N).map((_, i) => Math.sin(i) * 1000);
const f16 = new Float16Array(f32);
const f16bits = new Uint16Array(f16.buffer);
const outF32 = new Float32Array(N);
const outF16 = new Uint16Array(N);
const jsOutF16 = new Float16Array(N);

/** One direction over the N elements: GB/s of input read (`bytes` per element) by ours and by Bun's Float16Array. */
function castCase(name: string, bytes: number, ours: () => void, bun: () => void) {
  const gb = (bytes * N) / 1e9;
  return {
    case: name,
    metric: "throughput",
    unit: "GB/s",
    better: "higher" as const,
    ours: () => gb / seconds(ours),
    peer: { name: "bun Float16Array", run: () => gb / seconds(bun) },
  };
}

export default {
  description: `f16 ⇄ f32 over ${N} elements: native (${ctx.isa}, ${ctx.threads} threads) vs Bun Float16Array`,
  cases: () => [
    castCase(
      "f16 -> f32",
      2,
      () => ctx.cast(f16bits, "f16", outF32, "f32", N),
      () => outF32.set(f16),
    ),
    castCase(
      "f32 -> f16",
      4,
      () => ctx.cast(f32, "f32", outF16, "f16", N),
      () => jsOutF16.set(f32),
    ),
  ],
  teardown: () => ctx.destroy(),
};
