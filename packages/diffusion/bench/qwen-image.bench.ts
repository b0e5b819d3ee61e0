/**
 * `bun run bench qwen-image`: seconds per sampling step of the Qwen-Image-2.1 transformer on the CPU
 * backend at the real sizes (issue 23, "Bench"), int8 and int4 ConvRot, with the text rows' K/V computed
 * once per prompt (reuse) and recomputed every step, against the same block in PyTorch bf16 in one
 * session; and the first-run quantize time and the second-run (cached) load time.
 *
 * - Model: random weights in the diffusers layout (width 4096, 32 heads of 128, SwiGLU 12288, context
 *   4096; qwen-image.md §2.1) written once as BF16 by the project (src/testing/random-qwen-image.ts) under
 *   $TMPDIR/tensorpencil-bench/qwen-image; `QWEN_BENCH_BLOCKS=N` writes and runs N blocks instead of 32
 *   (a smaller file on a small machine: the per-step figures are then for N blocks, and the case names
 *   say so).
 * - Quantization: `loadQwenImageDit(file, q8 | q4)`, i.e. @tp/quant's `openQuantCache` with the native
 *   quantizer; its caches are deleted at the start so the first load is the first-run quantize, the
 *   second load maps the cache.
 * - Ours: one whole `QwenImageDit.forward` per step (all blocks, embeddings, final layer) on a 256² (16×16
 *   latent → 256 image tokens) and a 512² (1024 tokens) image with 18 text tokens (the default prompt's
 *   kept tokens), with the text K/V from `encodeText` (reuse) or the conditioning (recomputed).
 * - Peer: one block of the same shapes in PyTorch bf16 on the CPU with the same threads, image rows with
 *   the text K/V precomputed (bench/qwen-image-torch-peer.py; Debian's python3-torch), × the blocks.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend, createNativeQuantizer } from "@tp/backend-cpu";
import type { Tensor } from "@tp/tensor";
import type { QwenImageDit } from "../src/models/qwen-image.ts";
import { randn } from "../src/noise.ts";
import { loadQwenImageDit } from "../src/pipelines/qwen-image-pipeline.ts";
import { QWEN_IMAGE_CONFIG, writeRandomQwenImageDit } from "../src/testing/random-qwen-image.ts";

const BLOCKS = Number(process.env.QWEN_BENCH_BLOCKS ?? QWEN_IMAGE_CONFIG.num_layers);
const CONFIG = { ...QWEN_IMAGE_CONFIG, num_layers: BLOCKS };
const SIZES = [256, 512] as const;
const TEXT_TOKENS = 18;
const RUNS: Record<number, number> = { 256: 3, 512: 1 };
const SIGMA = 0.5;
const GiB = 2 ** 30;
type Mode = "q8" | "q4";
const MODES: readonly Mode[] = ["q8", "q4"];
const NAME: Record<Mode, string> = { q8: "INT8 ConvRot", q4: "INT4 ConvRot" };

interface TorchPeer {
  info: { torch: string; threads: number; sdpa: boolean; blas: string };
  ask(req: Record<string, unknown>): Promise<number>;
  close(): void;
}
interface Context {
  startTorch(script: string, threads: number): Promise<TorchPeer | string>;
}
interface BenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  runs?: number;
  timed?: boolean;
  ours: () => number | Promise<number>;
  peer?: { name: string; run: () => number | Promise<number> };
}

function loadAverage(): string {
  try {
    return readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");
  } catch {
    return "?";
  }
}

/** The random checkpoint, written when missing. */
function checkpoint(): { path: string; bytes: number; writeSeconds: number } {
  const dir = join(process.env.TMPDIR || tmpdir(), "tensorpencil-bench", "qwen-image");
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `qwen-image-random-v1-seed0-${BLOCKS}blocks-bf16.safetensors`);
  if (existsSync(path)) return { path, bytes: statSync(path).size, writeSeconds: 0 };
  const t0 = performance.now();
  console.log(`  writing ${path} (${BLOCKS} blocks, BF16) …`);
  writeRandomQwenImageDit(path, CONFIG, 0);
  return { path, bytes: statSync(path).size, writeSeconds: (performance.now() - t0) / 1000 };
}

const cleanups: (() => void)[] = [];
let summary = "";

export default {
  get description(): string {
    return (
      summary ||
      "Qwen-Image-2.1 transformer s/step on the CPU backend (real sizes, random weights) vs PyTorch bf16"
    );
  },
  usage:
    "  QWEN_BENCH_BLOCKS=N   write and run N transformer blocks instead of the real 32\n  QWEN_BENCH_PEER=0     no PyTorch peer (Debian's torch with a generic BLAS takes minutes per bf16 block)",
  async cases(harness: Context): Promise<BenchCase[]> {
    const backend = createBackend();
    cleanups.push(() => backend.dispose());
    const threads = backend.ctx.threads;
    const quantizer = createNativeQuantizer();
    cleanups.push(() => quantizer.dispose());
    const torch =
      process.env.QWEN_BENCH_PEER === "0"
        ? "not started (QWEN_BENCH_PEER=0)"
        : await harness.startTorch(join(import.meta.dir, "qwen-image-torch-peer.py"), threads);
    if (typeof torch !== "string") cleanups.push(() => torch.close());
    const file = checkpoint();
    // first-run quantize: remove our earlier caches of this file
    for (const f of readdirSync(join(file.path, ".."))) {
      if (f.startsWith(`${file.path.split("/").at(-1)}.tp-q`)) rmSync(join(file.path, "..", f));
    }
    const quant: Record<Mode, { first: number; second: number }> = {
      q8: { first: 0, second: 0 },
      q4: { first: 0, second: 0 },
    };
    for (const mode of MODES) {
      const a = loadQwenImageDit(file.path, backend, mode, { quantizer });
      quant[mode].first = a.ms / 1000;
      a.dit.dispose();
      const b = loadQwenImageDit(file.path, backend, mode, { quantizer });
      quant[mode].second = b.ms / 1000;
      b.dit.dispose();
      console.log(
        `  ${mode}: first load (quantize + write the cache) ${quant[mode].first.toFixed(1)} s; second (mapped) ${quant[mode].second.toFixed(2)} s; ${a.note}`,
      );
    }
    summary = [
      `cpu: ${backend.device}`,
      typeof torch === "string"
        ? `torch: ${torch}`
        : `torch ${torch.info.torch} (${torch.info.threads} threads, BLAS ${torch.info.blas}, ${torch.info.sdpa ? "sdpa" : "softmax(q·kᵀ)·v in bf16"})`,
      `${BLOCKS} blocks, ${TEXT_TOKENS} text tokens, σ = ${SIGMA}`,
      `load average at start ${loadAverage()}`,
      `checkpoint ${(file.bytes / GiB).toFixed(2)} GiB ${file.path}${file.writeSeconds ? ` (written in ${file.writeSeconds.toFixed(0)} s)` : ""}`,
    ].join("; ");
    console.log(`# ${summary}`);

    const ctxHost = randn(7, [1, TEXT_TOKENS, CONFIG.context_in_dim]);
    let loaded: {
      mode: Mode;
      dit: QwenImageDit;
      ctx: Tensor;
      kv: ReturnType<QwenImageDit["encodeText"]>;
    } | null = null;
    const unload = () => {
      if (loaded === null) return;
      loaded.kv.dispose();
      backend.free(loaded.ctx);
      loaded.dit.dispose();
      loaded = null;
      Bun.gc(true);
    };
    cleanups.unshift(unload);
    const model = (mode: Mode) => {
      if (loaded?.mode === mode) return loaded;
      unload();
      const { dit } = loadQwenImageDit(file.path, backend, mode, { quantizer });
      const ctx = backend.upload(ctxHost, [1, TEXT_TOKENS, CONFIG.context_in_dim], "f32");
      loaded = { mode, dit, ctx, kv: dit.encodeText(ctx) };
      return loaded;
    };
    const latents = new Map<number, Tensor>();
    const latent = (side: number) => {
      let x = latents.get(side);
      if (!x) {
        const l = side / 16;
        x = backend.upload(randn(side, [1, 64, l, l]), [1, 64, l, l], "f32");
        latents.set(side, x);
        cleanups.unshift(() => x && !x.storage.freed && backend.free(x));
      }
      return x;
    };

    const cases: BenchCase[] = [];
    for (const mode of MODES) {
      cases.push({
        case: `first-run quantize of the ${BLOCKS}-block transformer to ${NAME[mode]} (native quantizer, ${threads} threads, cache written beside it)`,
        metric: "load",
        unit: "s",
        better: "lower",
        timed: false,
        ours: () => quant[mode].first,
      });
      cases.push({
        case: `second-run load of the ${BLOCKS}-block transformer, ${NAME[mode]} cache mapped`,
        metric: "load",
        unit: "s",
        better: "lower",
        timed: false,
        ours: () => quant[mode].second,
      });
      for (const side of SIZES) {
        const grid = side / 16;
        for (const reuse of [true, false]) {
          const ours = async () => {
            const m = model(mode);
            const x = latent(side);
            const t0 = performance.now();
            const v = m.dit.forward(x, SIGMA, reuse ? m.kv : m.ctx);
            await backend.read(v);
            backend.free(v);
            return (performance.now() - t0) / 1000;
          };
          cases.push({
            case: `Qwen-Image-2.1 ${NAME[mode]} ${side}×${side} (${grid * grid} img + ${TEXT_TOKENS} txt tokens), ${BLOCKS}-block forward, text K/V ${reuse ? "reused" : "recomputed"}${reuse ? `; peer = ${BLOCKS} × one block (image rows, text K/V cached)` : ""}`,
            metric: "s/step",
            unit: "s",
            better: "lower",
            runs: RUNS[side],
            ours,
            ...(typeof torch === "string" || !reuse
              ? {}
              : {
                  peer: {
                    name: `torch bf16 (${threads} threads)`,
                    run: async () =>
                      BLOCKS *
                      (await torch.ask({
                        op: "block",
                        features: CONFIG.hidden_size,
                        heads: CONFIG.hidden_size / CONFIG.attention_head_dim,
                        head_dim: CONFIG.attention_head_dim,
                        mlp_hidden: CONFIG.mlp_hidden,
                        txt: TEXT_TOKENS,
                        h: grid,
                        w: grid,
                      })),
                  },
                }),
          });
        }
      }
    }
    return cases;
  },
  teardown(): void {
    for (const c of cleanups) c();
  },
};
