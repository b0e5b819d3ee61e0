/**
 * `bun run bench quant`: quantize-on-load and dequantization throughput of @tp/quant's TypeScript
 * reference code. The native quantizers and dequantizers of @tp/backend-cpu are measured against this
 * reference (as the peer) by `bun run bench quant-native` (packages/conformance/bench/quant-native.bench.ts):
 * this package may not import a backend, not even in a bench (layer rule, tests/workspace.test.ts).
 *
 * Cases:
 * - quantize + write cache: a 1 GiB synthetic BF16 tensor set (32 × [4096, 4096], seeded, written
 *   to a temporary folder and deleted afterwards) through `openQuantCache` with no cache present —
 *   plan, INT8 ConvRot quantization (single-threaded TypeScript), streaming write, checksum, rename.
 * - open + verify cache: the same call when the cache is valid (parse, key check, xxHash3 over the
 *   512 MiB cache, map).
 * - dequantize, per format: [1024, 4096] weights (ConvRot and fp8 quantized from seeded BF16 values;
 *   GGUF types from seeded random blocks) to f32, in M elements/s: one thread (the main thread), and
 *   the rows split over `navigator.hardwareConcurrency` Bun Workers writing into a shared output (the
 *   same function per block of rows; the time includes posting the jobs). Each side is called 8
 *   times first, so that JavaScriptCore's optimizing tiers have compiled the loops.
 * No peer: no JavaScript library in this process decodes ComfyUI ConvRot, and the GGUF readers on npm
 * (@huggingface/gguf) parse headers but do not dequantize; llama.cpp's C dequantizers would be the
 * fair peer for the native paths, not for this TypeScript reference.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SafetensorsWriter } from "@tp/formats";
import { GGML_DEQUANT_FORMATS, openQuantCache, quantizeConvRot, quantizeFp8Scaled } from "@tp/quant";
import { f32ToBf16, type WeightFormat, weightFormatInfo } from "@tp/tensor";
import { dequantizeRows, type Job } from "./dequant-worker.ts";

const dir = mkdtempSync(join(tmpdir(), "tp-bench-quant-"));
const SET_TENSORS = 32;
const [SN, SK] = [4096, 4096];
const [N, K] = [1024, 4096];
const THREADS = Math.max(2, navigator.hardwareConcurrency ?? 2);
const WARMUP_CALLS = 8;

/** xorshift32 BF16 values ~ N(0, 0.05)-ish (sum of uniforms), deterministic per seed. */
function bf16Values(n: number, seed: number): Uint8Array {
  const out = new Uint16Array(n);
  let s = seed >>> 0 || 1;
  const next = () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
  for (let i = 0; i < n; i++) out[i] = f32ToBf16((next() + next() + next() - 1.5) * 0.06);
  return new Uint8Array(out.buffer);
}

function writeSet(path: string): void {
  const w = new SafetensorsWriter(
    path,
    Array.from({ length: SET_TENSORS }, (_, i) => ({
      name: `layers.${i}.weight`,
      dtype: "BF16",
      shape: [SN, SK],
    })),
  );
  try {
    for (let i = 0; i < SET_TENSORS; i++) w.write(`layers.${i}.weight`, bf16Values(SN * SK, i + 1));
    w.commit();
  } catch (e) {
    w.abort();
    throw e;
  }
}

function shared(bytes: Uint8Array): SharedArrayBuffer {
  const sab = new SharedArrayBuffer(bytes.byteLength);
  new Uint8Array(sab).set(bytes);
  return sab;
}

/** Stored bytes and scales of a [N, K] weight in `format`. */
function weightOf(format: WeightFormat): Omit<Job, "r0" | "r1" | "k"> {
  const src = bf16Values(N * K, 7);
  const out = new SharedArrayBuffer(N * K * 4);
  if (format === "int8_convrot" || format === "int4_convrot") {
    const q = quantizeConvRot({ bytes: src, dtype: "bf16" }, [N, K], { format });
    return {
      format,
      data: shared(q.data),
      scale: shared(new Uint8Array(q.scale.buffer)),
      groupSize: 256,
      out,
    };
  }
  if (format === "f8_e4m3fn") {
    const q = quantizeFp8Scaled({ bytes: src, dtype: "bf16" }, N * K);
    return {
      format,
      data: shared(q.data),
      scale: shared(new Uint8Array(new Float32Array([q.scale]).buffer)),
      groupSize: 0,
      out,
    };
  }
  const info = weightFormatInfo(format);
  const bytes = new Uint8Array((N * K * info.blockBytes) / info.blockElems);
  let s = 12345;
  for (let i = 0; i < bytes.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    bytes[i] = s >>> 24;
  }
  return { format, data: shared(bytes), scale: new SharedArrayBuffer(4), groupSize: 0, out };
}

const workers: Worker[] = [];
let jobId = 0;
function runOn(worker: Worker, job: Job): Promise<void> {
  const id = jobId++;
  return new Promise((resolve) => {
    const onMessage = (e: MessageEvent<{ id: number }>) => {
      if (e.data.id !== id) return;
      worker.removeEventListener("message", onMessage);
      resolve();
    };
    worker.addEventListener("message", onMessage);
    worker.postMessage({ id, job });
  });
}

export default {
  description:
    "@tp/quant TypeScript reference: quantize + write an INT8 ConvRot cache for 1 GiB of BF16, open + verify it, and dequantize throughput per format on 1 thread and on Workers. No peer (see the file header).",
  async cases() {
    const set = join(dir, "set_bf16.safetensors");
    writeSet(set);
    for (let t = 0; t < THREADS; t++)
      workers.push(new Worker(new URL("./dequant-worker.ts", import.meta.url).href));
    const cache = `${set}.tp-q8.cache`;
    const open = () =>
      openQuantCache(set, { format: "int8_convrot", layers: ["*"], progress: null, cacheDir: dir });
    const cases = [
      {
        case: "quantize + write cache, int8_convrot, 1 GiB BF16 (32 × [4096, 4096])",
        metric: "time",
        unit: "s",
        better: "lower" as const,
        runs: 1,
        ours() {
          rmSync(cache, { force: true });
          const t = performance.now();
          const r = open();
          const s = (performance.now() - t) / 1000;
          if (r.status === "hit") throw new Error("expected a build");
          r.source.close();
          return s;
        },
      },
      {
        case: "open + verify cache (hit), int8_convrot, 512 MiB",
        metric: "time",
        unit: "s",
        better: "lower" as const,
        runs: 5,
        ours() {
          const t = performance.now();
          const r = open();
          const s = (performance.now() - t) / 1000;
          if (r.status !== "hit") throw new Error(`expected a hit, got ${r.status}`);
          r.source.close();
          return s;
        },
      },
    ];
    const formats: WeightFormat[] = ["int8_convrot", "int4_convrot", "f8_e4m3fn", ...GGML_DEQUANT_FORMATS];
    const dequant = [];
    for (const format of formats) {
      const w = weightOf(format);
      const job = (r0: number, r1: number): Job => ({ ...w, k: K, r0, r1 });
      const per = Math.ceil(N / THREADS);
      const onWorkers = () =>
        Promise.all(workers.map((wk, i) => runOn(wk, job(Math.min(N, i * per), Math.min(N, (i + 1) * per)))));
      // JavaScriptCore needs a few calls before its optimizing tiers take a loop (the first calls run
      // 10-40× slower); warm both sides up so that the medians compare compiled code.
      for (let i = 0; i < WARMUP_CALLS; i++) {
        dequantizeRows(job(0, N));
        await onWorkers();
      }
      const label = format === "f8_e4m3fn" ? "f8_e4m3fn scaled" : format;
      dequant.push(
        {
          case: `dequantize ${label} [${N}, ${K}], 1 thread`,
          metric: "throughput",
          unit: "Melem/s",
          better: "higher" as const,
          ours() {
            const t = performance.now();
            dequantizeRows(job(0, N));
            return (N * K) / (performance.now() - t) / 1e3;
          },
        },
        {
          case: `dequantize ${label} [${N}, ${K}], ${THREADS} Workers`,
          metric: "throughput",
          unit: "Melem/s",
          better: "higher" as const,
          async ours() {
            const t = performance.now();
            await onWorkers();
            return (N * K) / (performance.now() - t) / 1e3;
          },
        },
      );
    }
    return [...cases, ...dequant];
  },
  teardown() {
    for (const w of workers) w.terminate();
    rmSync(dir, { recursive: true, force: true });
  },
};
