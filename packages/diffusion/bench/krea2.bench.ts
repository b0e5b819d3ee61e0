/**
 * `bun run bench krea2`: seconds per sampling step of the Krea 2 DiT on the CPU backend at the real
 * sizes (issue 8, "Bench"), against the same block in PyTorch's CPU bf16, in one session.
 *
 * - Model: random weights in the real Krea 2 layout (features 6144, 48 / 12 heads of 128, 28 blocks,
 *   SwiGLU 16384, text fusion 12 taps × 2560; krea2.md §1.3, §3.1), written once by the project itself
 *   (`writeRandomKrea2DitQuantized`, @tp/quant's checkpoint writer with @tp/backend-cpu's native quantizer)
 *   as fp8 e4m3fn with per-tensor scales and as INT8 ConvRot (the 8 linears of every block; the rest
 *   BF16), ≈ 12 GiB each, cached under $TMPDIR/tensorpencil-bench/krea2 (bench/checkpoints.ts).
 * - Ours: `loadKrea2(file, { mode: "native" })` (every weight a view on the mapping, no f32 copies) and one
 *   whole `Krea2Dit.forward` per step — all 28 blocks, patch embedding, timestep MLP, final layer and
 *   unpatchify, measured, not extrapolated — on a 256×256 (32×32 latent → 256 image tokens) and a
 *   512×512 (64×64 → 1024) image with 64 text tokens (`txt` from `encodeText` once per prompt, as the
 *   sampler does). The first forward after loading pages the file in and is not timed; each case's
 *   warm-up run is the profiled one (every backend op timed; breakdown printed).
 * - Peer: one single-stream block of the same shapes in PyTorch bf16 on the CPU with the same threads
 *   (bench/krea2-torch-peer.py; Debian's python3-torch + libopenblas0-pthread, installed with apt-get
 *   when missing), × 28 blocks. The peer leaves out what is outside the blocks (a few ms here), so the
 *   comparison is slightly in torch's favour.
 * - Memory: the process's peak RSS (VmHWM, reset per case through /proc/self/clear_refs) against the
 *   checkpoint size + the backend's peak tensor bytes (activations) + the RSS before loading: a ratio
 *   near 1 says nothing but the mapped weights and activations is resident — no f32 copies (those would
 *   be 51 GB). The profiled run also samples the anonymous RSS (RssAnon) after every op.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { type CpuBackend, createBackend } from "@tp/backend-cpu";
import type { Backend, Tensor, Weight } from "@tp/tensor";
import { type Krea2Dit, loadKrea2 } from "../src/models/krea2.ts";
import { randn } from "../src/noise.ts";
import { KREA2_CONFIG, randomConditioning } from "../src/testing/random-checkpoints.ts";
import { ensureCheckpoint } from "./checkpoints.ts";

type Format = "fp8_scaled" | "int8_convrot";
const FORMATS: readonly Format[] = ["int8_convrot", "fp8_scaled"];
const FORMAT_NAME: Record<Format, string> = { fp8_scaled: "fp8 scaled", int8_convrot: "INT8 ConvRot" };
/** Image sides in pixels; the latent is side/8, the patch grid side/16. */
const SIZES = [256, 512] as const;
/** Text tokens of the conditioning (a short prompt after the template prefix is stripped). */
const TEXT_TOKENS = 64;
/**
 * Timed runs per size (medians; after the harness's warm-up, which is the profiled run here): a 512²
 * step takes a minute or more on 2 shared cores. `bun run bench krea2 --runs N` overrides.
 */
const RUNS: Record<number, number> = { 256: 3, 512: 1 };
const SIGMA = 0.5;
const PROFILE_OUT = resolve(import.meta.dir, "../../..", "bench-results", "krea2-profile.json");

const GiB = 2 ** 30;

// ---------------------------------------------------------------------------------------------- process

/** Sizes of /proc/self/status in bytes (VmRSS, VmHWM, RssAnon, RssFile; 0 when absent). */
function procStatus(): { VmRSS: number; VmHWM: number; RssAnon: number; RssFile: number } {
  const out: Record<string, number> = { VmRSS: 0, VmHWM: 0, RssAnon: 0, RssFile: 0 };
  for (const line of readFileSync("/proc/self/status", "utf8").split("\n")) {
    const m = /^(\w+):\s+(\d+) kB/.exec(line);
    if (m) out[m[1] as string] = Number(m[2]) * 1024;
  }
  return out as { VmRSS: number; VmHWM: number; RssAnon: number; RssFile: number };
}

/** Reset VmHWM (Linux ≥ 4.0: `echo 5 > /proc/PID/clear_refs`); false when not allowed. */
function resetPeakRss(): boolean {
  try {
    writeFileSync("/proc/self/clear_refs", "5");
    return true;
  } catch {
    return false;
  }
}

function loadAverage(): string {
  try {
    return readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");
  } catch {
    return "?";
  }
}

// ---------------------------------------------------------------------------------------------- torch

/** scripts/bench-harness.ts's TorchPeer: what the peer's info request answered; one request's seconds. */
interface TorchPeer {
  info: { torch: string; threads: number; sdpa: boolean; blas: string };
  ask(req: Record<string, unknown>): Promise<number>;
  close(): void;
}

/** The field of scripts/bench-harness.ts's BenchContext this suite uses (packages import no file outside them). */
interface Context {
  /** The PyTorch peer `python3 SCRIPT THREADS` (installed with apt-get when missing), or why there is none. */
  startTorch(script: string, threads: number): Promise<TorchPeer | string>;
}

// ---------------------------------------------------------------------------------------------- profiling

interface OpStat {
  calls: number;
  seconds: number;
  flop: number;
}

/**
 * The backend behind a Proxy that, while `on`, times every op call (the CPU backend computes
 * synchronously, so the wall time of a call is the op's time) and samples RssAnon after each.
 * Matmuls are keyed by weight format and layer (`matmul int8_convrot mlp.up [16384×6144]`).
 */
function profiled(backend: Backend) {
  const stats = new Map<string, OpStat>();
  const state = { on: false, maxAnon: 0 };
  const proxy = new Proxy(backend, {
    get(target, prop) {
      const value = Reflect.get(target, prop); // getters see the backend itself (private fields)
      if (typeof value !== "function" || typeof prop !== "string") return value;
      return (...args: unknown[]) => {
        // scope / persist are not ops: timing them would count the ops inside them twice
        if (!state.on || prop === "scope" || prop === "persist") return value.apply(target, args);
        const t0 = performance.now();
        const r = value.apply(target, args);
        const s = (performance.now() - t0) / 1000;
        let key = prop;
        let flop = 0;
        if (prop === "matmul") {
          const x = args[0] as Tensor;
          const w = args[1] as Weight;
          const m = (x.shape as number[]).slice(0, -1).reduce((a, b) => a * b, 1);
          const layer = w.name
            .replace(/^(model\.diffusion_model\.)?(blocks|txtfusion\.\w+)\.\d+\./, "")
            .replace(/\.weight$/, "");
          key = `matmul ${w.format} ${layer} [${w.n}×${w.k}]`;
          flop = 2 * m * w.n * w.k;
        } else if (prop === "attention") {
          const q = args[0] as Tensor;
          const k = args[1] as Tensor;
          const [b, h, l, d] = q.shape as number[];
          flop = 4 * (b as number) * (h as number) * (l as number) * (k.shape[2] as number) * (d as number);
        }
        const st = stats.get(key) ?? { calls: 0, seconds: 0, flop: 0 };
        st.calls++;
        st.seconds += s;
        st.flop += flop;
        stats.set(key, st);
        state.maxAnon = Math.max(state.maxAnon, procStatus().RssAnon);
        return r;
      };
    },
  });
  return { proxy, stats, state };
}

/**
 * Seconds of the activation rotate + int8 quantize step (tp_cpu_convrot_quantize, what the INT8 ConvRot
 * matmul does to x before its integer GEMM) for the int8 matmuls of a profile, timed on its own on the
 * same shapes ([M, K], group 256) — the matmul op does it inside, so the profile cannot split it.
 */
function convRotQuantizeSeconds(
  backend: CpuBackend,
  stats: Map<string, OpStat>,
): { seconds: number; lines: string[] } {
  let total = 0;
  const lines: string[] = [];
  for (const [key, st] of stats) {
    const m = /^matmul int8_convrot (\S+) \[(\d+)×(\d+)\]$/.exec(key);
    if (!m) continue;
    const n = Number(m[2]);
    const k = Number(m[3]);
    const rows = Math.round(st.flop / st.calls / (2 * n * k));
    const x = new Float32Array(rows * k).map((_, i) => Math.sin(i));
    const codes = new Int8Array(rows * k);
    const scales = new Float32Array(rows);
    backend.ctx.convRotQuantize(x, rows, k, 8, 256, codes, scales);
    const reps = 5;
    const t0 = performance.now();
    for (let r = 0; r < reps; r++) backend.ctx.convRotQuantize(x, rows, k, 8, 256, codes, scales);
    const per = (performance.now() - t0) / 1000 / reps;
    total += per * st.calls;
    lines.push(
      `    rotate+quantize x [${rows}×${k}] for ${m[1]}: ${(per * 1000).toFixed(2)} ms × ${st.calls} = ${(per * st.calls).toFixed(3)} s (${((100 * per * st.calls) / st.seconds).toFixed(1)} % of that matmul)`,
    );
  }
  return { seconds: total, lines };
}

/** Group the profile: per matmul format, attention, and the elementwise / norm / layout ops. */
function summarize(stats: Map<string, OpStat>, total: number): string[] {
  const rows = [...stats].sort((a, b) => b[1].seconds - a[1].seconds);
  const lines: string[] = [];
  const sum = (f: (k: string) => boolean) =>
    rows.filter(([k]) => f(k)).reduce((a, [, s]) => a + s.seconds, 0);
  const pct = (s: number) => `${((100 * s) / total).toFixed(1)} %`;
  const groups: [string, (k: string) => boolean][] = [
    ["matmul (all)", (k) => k.startsWith("matmul")],
    ["attention", (k) => k === "attention"],
    ["rope", (k) => k === "rope"],
    ["rmsNorm", (k) => k === "rmsNorm"],
    [
      "modulate / mul / add / sigmoid / swiglu / gelu",
      (k) => /^(modulate|mul|add|sigmoid|swiglu|gelu|silu)$/.test(k),
    ],
    ["copy / concat / upload / read / free", (k) => /^(copy|concat|upload|read|free|slice)$/.test(k)],
  ];
  let covered = 0;
  for (const [name, f] of groups) {
    const s = sum(f);
    covered += s;
    lines.push(`  ${name.padEnd(48)} ${s.toFixed(3).padStart(9)} s  ${pct(s)}`);
  }
  lines.push(
    `  ${"other ops".padEnd(48)} ${sum(() => true) - covered > 0 ? (sum(() => true) - covered).toFixed(3).padStart(9) : "0".padStart(9)} s`,
  );
  lines.push(
    `  ${"outside ops (JS between calls)".padEnd(48)} ${(total - sum(() => true)).toFixed(3).padStart(9)} s  ${pct(total - sum(() => true))}`,
  );
  lines.push("  top ops:");
  for (const [k, s] of rows.slice(0, 16)) {
    const rate = s.flop > 0 ? `  ${(s.flop / 1e9 / s.seconds).toFixed(0)} GFLOP/s` : "";
    lines.push(
      `    ${k.padEnd(52)} ${String(s.calls).padStart(5)}×  ${s.seconds.toFixed(3).padStart(8)} s  ${pct(s.seconds)}${rate}`,
    );
  }
  return lines;
}

// ---------------------------------------------------------------------------------------------- cases

/** scripts/bench-harness.ts's BenchCase (packages import no file outside them). */
interface BenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  runs?: number;
  /** false: a row read from the step case's runs (no warm-up, load or spread check). */
  timed?: boolean;
  ours: () => number | Promise<number>;
  peer?: { name: string; run: () => number | Promise<number> };
}

const cleanups: (() => void)[] = [];
let summary = "";

export default {
  get description(): string {
    return summary || "Krea 2 DiT s/step on the CPU backend (real sizes, random weights) vs PyTorch bf16";
  },
  async cases(harness: Context): Promise<BenchCase[]> {
    const base = createBackend();
    cleanups.push(() => base.dispose());
    const threads = base.ctx.threads; // TP_THREADS, else every CPU
    const { proxy: backend, stats, state } = profiled(base);
    const torch = await harness.startTorch(join(import.meta.dir, "krea2-torch-peer.py"), threads);
    if (typeof torch !== "string") cleanups.push(() => torch.close());

    const files = Object.fromEntries(FORMATS.map((f) => [f, ensureCheckpoint(f)])) as Record<
      Format,
      ReturnType<typeof ensureCheckpoint>
    >;
    const clearRefs = resetPeakRss();
    summary = [
      `${base.name ?? "cpu"}: ${(base as { device?: string }).device ?? ""}`,
      typeof torch === "string"
        ? `torch: ${torch}`
        : `torch ${torch.info.torch} (${torch.info.threads} threads, BLAS ${torch.info.blas}, ${torch.info.sdpa ? "sdpa" : "softmax(q·kᵀ)·v in bf16"})`,
      `${TEXT_TOKENS} text tokens, σ = ${SIGMA}`,
      `load average at start ${loadAverage()}`,
      ...FORMATS.map((f) => `${f}: ${(files[f].bytes / GiB).toFixed(2)} GiB ${files[f].path}`),
    ].join("; ");
    console.log(`# ${summary}`);

    const baselineRss = procStatus().VmRSS;
    const context = randomConditioning(TEXT_TOKENS, KREA2_CONFIG.txtlayers * KREA2_CONFIG.txtdim, 7);

    // one model at a time (each maps ≈ 12 GiB)
    let loaded: { format: Format; dit: Krea2Dit; txt: Tensor } | null = null;
    const unload = () => {
      if (loaded === null) return;
      base.free(loaded.txt);
      loaded.dit.dispose();
      loaded = null;
      Bun.gc(true);
    };
    cleanups.unshift(unload);
    const latent = (side: number) => {
      const l = side / 8;
      return backend.upload(randn(side, [1, 16, l, l]), [1, 16, l, l], "f32");
    };
    const step = async (dit: Krea2Dit, x: Tensor, txt: Tensor): Promise<number> => {
      const t0 = performance.now();
      const v = dit.forward(x, SIGMA, null, { txt });
      await base.read(v); // nothing is queued on the CPU backend; this is the 16-channel velocity
      const s = (performance.now() - t0) / 1000;
      base.free(v);
      return s;
    };
    const model = async (format: Format) => {
      if (loaded?.format === format) return loaded;
      unload();
      const t0 = performance.now();
      const dit = loadKrea2(files[format].path, { backend, mode: "native" });
      const ctx = backend.upload(context.data, context.shape, "f32");
      const t1 = performance.now();
      const txt = dit.encodeText(ctx);
      base.free(ctx);
      const t2 = performance.now();
      const x = latent(256);
      const cold = await step(dit, x, txt);
      base.free(x);
      const st = procStatus();
      console.log(
        `  ${format}: loaded in ${((t1 - t0) / 1000).toFixed(1)} s (${dit.layout.description}; ${dit.config.layers} blocks, F ${dit.config.features}, ${dit.config.heads}/${dit.config.kvheads} heads, MLP ${dit.config.mlp_hidden}), encodeText ${((t2 - t1) / 1000).toFixed(1)} s, first (cold, page-in) 256² forward ${cold.toFixed(1)} s; RSS ${(st.VmRSS / GiB).toFixed(2)} GiB (file ${(st.RssFile / GiB).toFixed(2)}, anon ${(st.RssAnon / GiB).toFixed(2)})`,
      );
      loaded = { format, dit, txt };
      return loaded;
    };

    const cases: BenchCase[] = [];
    const profiles: Record<string, unknown> = {};
    for (const format of FORMATS) {
      for (const side of SIZES) {
        const grid = side / 16;
        const tokens = grid * grid;
        const key = `${format} ${side}`;
        const mem = { hwm: 0, backendPeak: 0, anon: 0, baselineAnon: 0 };
        let x: Tensor | null = null;
        let calls = 0;
        const ours = async () => {
          const m = await model(format);
          if (x === null) {
            x = latent(side);
            cleanups.unshift(() => {
              if (x && !x.storage.freed) base.free(x);
            });
            resetPeakRss();
            base.memory.resetPeak();
          }
          let s: number;
          if (calls++ === 0) {
            // the harness's warm-up: profiled
            stats.clear();
            mem.baselineAnon = procStatus().RssAnon;
            state.maxAnon = 0;
            state.on = true;
            try {
              s = await step(m.dit, x, m.txt);
            } finally {
              state.on = false;
            }
            mem.anon = state.maxAnon;
            const lines = summarize(stats, s);
            console.log(`  profile ${key}² (warm-up run, ${s.toFixed(2)} s, per-op timing on):`);
            for (const l of lines) console.log(l);
            const aq = convRotQuantizeSeconds(base, stats);
            if (aq.lines.length > 0) {
              console.log(
                `  of the INT8 matmuls, activation rotation + quantization (timed separately on the same shapes): ${aq.seconds.toFixed(3)} s (${((100 * aq.seconds) / s).toFixed(1)} % of the step)`,
              );
              for (const l of aq.lines) console.log(l);
            }
            profiles[key] = {
              seconds: s,
              activationQuantSeconds: aq.seconds,
              ops: Object.fromEntries(stats),
            };
          } else {
            s = await step(m.dit, x, m.txt);
          }
          const st = procStatus();
          mem.hwm = Math.max(mem.hwm, st.VmHWM);
          mem.backendPeak = base.memory.peak;
          return s;
        };
        const peerBlock = async () => {
          if (typeof torch === "string") return Number.NaN;
          const c = KREA2_CONFIG;
          return torch.ask({
            op: "block",
            features: c.features,
            heads: c.heads,
            kvheads: c.kvheads,
            head_dim: c.head_dim,
            mlp_hidden: c.mlp_hidden,
            txt: TEXT_TOKENS,
            h: grid,
            w: grid,
          });
        };
        cases.push({
          case: `Krea 2 DiT ${FORMAT_NAME[format]} ${side}×${side} (${tokens} img + ${TEXT_TOKENS} txt tokens), full 28-block forward; peer = 28 × one block`,
          metric: "s/step",
          unit: "s",
          better: "lower",
          runs: RUNS[side],
          ours,
          ...(typeof torch === "string"
            ? {}
            : {
                peer: {
                  name: `torch bf16 (${threads} threads)`,
                  run: async () => KREA2_CONFIG.layers * (await peerBlock()),
                },
              }),
        });
        cases.push({
          case: `peak RSS ${FORMAT_NAME[format]} ${side}×${side} (VmHWM${clearRefs ? ", reset per case" : ", since start"}) vs file + backend peak + baseline`,
          metric: "peak RSS",
          unit: "GiB",
          better: "lower",
          timed: false,
          ours: () => mem.hwm / GiB,
          peer: {
            name: "checkpoint size + activations (backend peak) + RSS before loading",
            run: () => (files[format].bytes + mem.backendPeak + baselineRss) / GiB,
          },
        });
        cases.push({
          case: `peak anonymous RSS ${FORMAT_NAME[format]} ${side}×${side} (RssAnon sampled after every op) vs backend peak + anon before`,
          metric: "peak RssAnon",
          unit: "GiB",
          better: "lower",
          timed: false,
          ours: () => mem.anon / GiB,
          peer: {
            name: "activations (backend peak) + RssAnon before the run",
            run: () => (mem.backendPeak + mem.baselineAnon) / GiB,
          },
        });
      }
    }
    cleanups.push(() => {
      try {
        writeFileSync(
          PROFILE_OUT,
          `${JSON.stringify({ loadAverageAtEnd: loadAverage(), profiles }, null, 2)}\n`,
        );
        console.log(`# wrote ${PROFILE_OUT}; load average at end ${loadAverage()}`);
      } catch {}
    });
    return cases;
  },
  teardown(): void {
    for (const c of cleanups) c();
  },
};
