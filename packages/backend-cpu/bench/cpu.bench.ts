/**
 * `bun run bench cpu`: the cpu backend's matmul against this machine's limits and against its peers
 * (issue 7, "Benchmarks"), all threads of the default context (TP_THREADS, else every CPU), one session:
 *
 * 1. GEMV, M = 1, K=1024 N=3072 and K=4096 N=12288, for Q8_0, Q4_0, Q4_K, Q6_K and bf16 (and fp8 e4m3,
 *    scaled, against the copy kernel only: ggml has no fp8 type). Unit: GB/s of
 *    weight bytes read. Each run walks a set of distinct copies of the weight (≥ 512 MiB in all), so
 *    every byte comes from DRAM, as in LLM decoding (one small weight would sit in cache and measure
 *    cache bandwidth). The copies live in one arena made with the copy kernel's buffers and refilled by
 *    every case, so that every row reads memory as long resident as the copy kernel's. Peers:
 *    - memory: a copy kernel (tp_cpu_cast f32 → f32, 512 MiB on all threads), counted as bytes read +
 *      written per second (STREAM's convention); the ratio is the fraction of that bandwidth reached.
 *    - llama.cpp: ggml's own kernels from the prebuilt CPU libraries of node-llama-cpp 3.21.1 (no build,
 *      no download), through bench/ggml-shim.c: the CPU backend ggml's loader picks for this CPU, the
 *      weights in llama.cpp's "CPU_REPACK" buffer when ggml supports the layout (as llama.cpp places
 *      them; Q4_0 and Q4_K are repacked 8×8 here), one graph with a mul_mat per copy, the same bytes and
 *      the same f32 x, the same threads. This is the per-matmul part of a whole-model run: it leaves out
 *      everything else a token costs (norms, attention, sampling), which the LLM issue measures.
 * 2. GEMM, M=1024 K=6144, N=6144 and N=16384, for INT8 ConvRot, INT4 ConvRot, fp8 e4m3 (scaled) and bf16,
 *    activation rotation + quantization included. Unit: GFLOP/s = 2·M·N·K / s. Peers: PyTorch CPU
 *    torch.matmul in bf16 and in f32 (Debian's python3-torch with OpenBLAS, installed here with apt-get
 *    when missing, run in a child process: bench/torch-peer.py), and this CPU's peak for the
 *    instruction the kernel is built on (bench/peak.c: measured instruction throughput × operations per
 *    instruction; int8: vpdpbusd, 128 ops; bf16 / fp8: vdpbf16ps, 64 FLOP).
 *    Also every GGUF weight type at LLM prompt-processing shapes (M = 512 tokens,
 *    Qwen3-0.6B's ffn K=1024 N=3072 and K=3072 N=1024) against llama.cpp's kernels through the same shim
 *    (repacked by CPU_REPACK where ggml has a layout for the type: Q4_0, Q4_K, Q2_K on this CPU),
 *    activation quantization included on both sides.
 * 3. Attention (the cpu backend's `attention` op), seq 1280 and 4352, 48 and 12 heads of 128, f32, full
 *    and prefix masks (keys of the first seq − 256 tokens — the image — visible to all, the 256 text
 *    tokens causal), against PyTorch (scaled_dot_product_attention where torch has it, else the same
 *    maths per head). Unit: GFLOP/s = 4·heads·seq²·128 / s (full; the prefix mask does less work but
 *    the same unit is used for both).
 */
import { dlopen, ptr } from "bun:ffi";
import { existsSync, mkdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import {
  createBackend,
  loadCpuLibrary,
  NATIVE_WEIGHT_FORMATS,
  type NativeWeight,
  type NativeWeightFormat,
} from "@tp/backend-cpu";
import type { Tensor } from "@tp/tensor";

const ROOT = resolve(import.meta.dir, "../../..");
const PKG = resolve(import.meta.dir, "..");
const OUT = join(PKG, "build/bench");
const LLAMA_BINS = join(ROOT, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64");

const lib = loadCpuLibrary();
const ctx = lib.createContext(0);
const THREADS = ctx.threads;

/** Seconds of one call. */
function seconds(fn: () => void): number {
  const t0 = performance.now();
  fn();
  return (performance.now() - t0) / 1000;
}

/** Deterministic uniform [0, 1). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

// ---------------------------------------------------------------------------------------------- tools

function compiler(): string | null {
  return process.env.CC?.trim() || Bun.which("cc") || Bun.which("gcc") || Bun.which("clang");
}

/** Compile `src` to `out` (libraries in `libs`, after the source) unless `out` is newer; why it failed, or null. */
function build(src: string, out: string, args: string[], libs: string[] = []): string | null {
  if (existsSync(out) && statSync(out).mtimeMs > statSync(src).mtimeMs) return null;
  const cc = compiler();
  if (cc === null) return "no C compiler";
  mkdirSync(OUT, { recursive: true });
  const r = Bun.spawnSync([cc, ...args, "-o", `${out}.tmp`, src, ...libs], { stderr: "pipe" });
  if (r.exitCode !== 0)
    return `compile failed: ${r.stderr.toString().trim().split("\n").slice(-3).join(" ")}`;
  Bun.spawnSync(["mv", `${out}.tmp`, out]);
  return null;
}

// ---------------------------------------------------------------------------------------------- peak

interface Peak {
  threads: number;
  ghz: number;
  int8_gops: number;
  bf16_gflops: number;
  f32_gflops: number;
}

function measurePeak(): Peak | string {
  const features = lib.features();
  if (!(features & (1 << 6)) || !(features & (1 << 7))) return "this CPU lacks AVX-512 VNNI / BF16";
  const bin = join(OUT, "peak");
  const err = build(join(import.meta.dir, "peak.c"), bin, ["-O2", "-pthread"]);
  if (err) return err;
  const r = Bun.spawnSync([bin, String(THREADS)], { stdout: "pipe" });
  return JSON.parse(r.stdout.toString()) as Peak;
}

// ---------------------------------------------------------------------------------------------- llama.cpp

const shimSymbols = {
  shim_init: { args: ["cstring", "i32"], returns: "i32" },
  shim_device: { args: [], returns: "cstring" },
  shim_new: { args: ["i32", "i64", "i64", "i32", "i64", "i32"], returns: "ptr" },
  shim_free: { args: ["ptr"], returns: "void" },
  shim_buft: { args: ["ptr"], returns: "cstring" },
  shim_set_weight: { args: ["ptr", "i32", "ptr", "u64"], returns: "void" },
  shim_set_x: { args: ["ptr", "ptr", "u64"], returns: "void" },
  shim_get_y: { args: ["ptr", "i32", "ptr", "u64"], returns: "void" },
  shim_compute: { args: ["ptr"], returns: "i32" },
} as const;

type Shim = ReturnType<typeof dlopen<typeof shimSymbols>>["symbols"];

function loadLlama(): Shim | string {
  if (process.platform !== "linux" || process.arch !== "x64")
    return `no prebuilt llama.cpp for ${process.platform}-${process.arch}`;
  if (!existsSync(join(LLAMA_BINS, "libggml-base.so")))
    return `node-llama-cpp binaries missing in ${LLAMA_BINS} (bun install)`;
  const so = join(OUT, "libggmlshim.so");
  const err = build(
    join(import.meta.dir, "ggml-shim.c"),
    so,
    ["-O2", "-shared", "-fPIC"],
    [`-L${LLAMA_BINS}`, "-l:libggml.v0.4.0.so", "-l:libggml-base.so", `-Wl,-rpath,${LLAMA_BINS}`],
  );
  if (err) return err;
  const g = dlopen(so, shimSymbols).symbols;
  if (g.shim_init(Buffer.from(`${LLAMA_BINS}\0`), THREADS) !== 0) return "ggml has no CPU backend here";
  return g;
}

/** The llama.cpp peer of a case (`run` measures it; NaN where ggml would not take the weight), or none. */
function ggmlPeer(llama: Shim | string, run: () => number): { name: string; run: () => number } | undefined {
  return typeof llama === "string" ? undefined : { name: "llama.cpp (ggml CPU, same threads)", run };
}

/** ggml type ids (ggml.h enum ggml_type). */
const GGML_TYPE: Partial<Record<NativeWeightFormat, number>> = {
  q4_0: 2,
  q4_1: 3,
  q5_0: 6,
  q5_1: 7,
  q8_0: 8,
  q2_k: 10,
  q3_k: 11,
  q4_k: 12,
  q5_k: 13,
  q6_k: 14,
  bf16: 30,
};

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

// ---------------------------------------------------------------------------------------------- weights

/** Random but well-formed bytes of a weight [n, k]: small f16 / bf16 / fp8 values, sane block scales. */
function weightBytes(format: NativeWeightFormat, n: number, k: number, seed: number): Uint8Array {
  const r = rng(seed);
  const rowBytes = lib.weightRowBytes(format, k);
  const out = new Uint8Array(n * rowBytes);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(r() * 256);
  // byte offsets of each block's f16 scales (d, and m / dmin where the type has one)
  const scaleAt: Partial<Record<NativeWeightFormat, number[]>> = {
    q8_0: [0],
    q4_0: [0],
    q4_1: [0, 2],
    q5_0: [0],
    q5_1: [0, 2],
    q2_k: [80, 82],
    q3_k: [108],
    q4_k: [0, 2],
    q5_k: [0, 2],
    q6_k: [208],
  };
  if (format === "bf16") {
    for (let i = 1; i < out.length; i += 2) out[i] = ((out[i] as number) & 0x80) | 0x3c; // |w| in [2^-7, 2^-5)
  } else if (format === "f8_e4m3fn") {
    for (let i = 0; i < out.length; i++) if (((out[i] as number) & 0x7f) === 0x7f) out[i] = 0x38; // no NaN
  } else if (scaleAt[format]) {
    const block = format.endsWith("_k") ? 256 : 32;
    const bb = lib.weightRowBytes(format, block);
    for (let o = 0; o < out.length; o += bb) {
      for (const f of scaleAt[format] as number[]) {
        out[o + f] = Math.floor(r() * 256);
        out[o + f + 1] = 0x1c; // f16 around 2^-8
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------- cases

/** scripts/bench-harness.ts's BenchCase (packages import no file outside them). */
interface BenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  runs?: number;
  /** false: a row with nothing to time (no warm-up, load or spread check). */
  timed?: boolean;
  ours: () => number | Promise<number>;
  peer?: { name: string; run: () => number | Promise<number> };
}

/** The GEMV formats, then fp8 e4m3 (scaled, as fp8 safetensors checkpoints): ggml has no fp8 type, so no llama.cpp row. */
const GEMV_FORMATS: NativeWeightFormat[] = ["q8_0", "q4_0", "q4_k", "q6_k", "bf16", "f8_e4m3fn"];
const GEMV_SHAPES: [number, number][] = [
  [1024, 3072],
  [4096, 12288],
];
const GEMM_FORMATS: NativeWeightFormat[] = ["int8_convrot", "int4_convrot", "f8_e4m3fn", "bf16"];
const GEMM_N = [6144, 16384];
const GEMM_M = 1024;
const GEMM_K = 6144;
const GEMV_BYTES = 512 * 2 ** 20;
/** Bytes of the GEMV arena: the most any GEMV case's copies take (at least GEMV_BYTES, at least 2 copies). */
function gemvArenaBytes(): number {
  let most = 0;
  for (const [k, n] of GEMV_SHAPES) {
    for (const format of GEMV_FORMATS) {
      const bytes = n * lib.weightRowBytes(format, k);
      most = Math.max(most, bytes * Math.max(2, Math.ceil(GEMV_BYTES / bytes)));
    }
  }
  return most;
}
/** Prompt processing (LLM prefill, 512 tokens) at Qwen3-0.6B's ffn shapes: GGUF GEMM vs llama.cpp. */
const PP_SHAPES: [number, number, number][] = [
  [512, 1024, 3072],
  [512, 3072, 1024],
];
/** Every GGUF type the cpu backend takes (q4_0 … q6_k). */
const PP_FORMATS = (Object.keys(NATIVE_WEIGHT_FORMATS) as NativeWeightFormat[]).filter((f) => /^q\d/.test(f));

/** One live state at a time (weights of hundreds of MB): made on first use, dropped when the next is made. */
let current: { key: string; drop: () => void } | null = null;
function lazy<T>(key: string, make: () => T, drop: (t: T) => void = () => {}): () => T {
  let value: T | undefined;
  return () => {
    if (current?.key !== key) {
      current?.drop();
      value = make();
      const v = value;
      current = {
        key,
        drop: () => {
          drop(v);
          value = undefined;
          Bun.gc(true);
        },
      };
    }
    return value as T;
  };
}

const cleanups: (() => void)[] = [];
let summary = "";

export default {
  get description(): string {
    return (
      summary ||
      `cpu matmul / attention vs memory, llama.cpp, PyTorch and peak (${ctx.isa}, ${THREADS} threads)`
    );
  },
  async cases(context: Context): Promise<BenchCase[]> {
    const cases: BenchCase[] = [];
    const peak = measurePeak();
    const llama = loadLlama();
    const torch = await context.startTorch(join(import.meta.dir, "torch-peer.py"), THREADS);
    if (typeof torch !== "string") cleanups.push(() => torch.close());
    const notes = [
      `${ctx.isa}, ${THREADS} threads`,
      typeof peak === "string"
        ? `peak: ${peak}`
        : `peak (measured, ${peak.ghz.toFixed(2)} GHz): int8 ${peak.int8_gops.toFixed(0)} GOPS, bf16 ${peak.bf16_gflops.toFixed(0)} GFLOP/s, f32 ${peak.f32_gflops.toFixed(0)} GFLOP/s`,
      typeof llama === "string" ? `llama.cpp: ${llama}` : `llama.cpp: ggml v0.4.0 (${llama.shim_device()})`,
      typeof torch === "string"
        ? `torch: ${torch}`
        : `torch ${torch.info.torch} (${torch.info.threads} threads, BLAS ${torch.info.blas}, sdpa ${torch.info.sdpa ? "yes" : "no: per-head maths"})`,
    ];
    summary = notes.join("; ");
    console.log(`# ${summary}`);

    // ---- memory copy bandwidth (the GEMV peer) ----
    /*
     * The memory of the GEMV section, made once, together: the copy kernel's two buffers and one arena
     * that every GEMV case refills with its weight copies (which llama.cpp reads too, or copies into its
     * repacked layout for Q4_0 / Q4_K). A
     * buffer freshly faulted in reads slowly here for a while (this VM: its first pass over 512 MB at
     * about half speed, then faster over the next seconds), so a new 512 MB per case, as before, measured
     * each format on younger memory than the copy kernel's.
     */
    let gemvMemory: { src: Float32Array; dst: Float32Array; arena: Uint8Array } | null = null;
    const memory = () => {
      gemvMemory ??= {
        src: new Float32Array(GEMV_BYTES / 4).fill(1),
        dst: new Float32Array(GEMV_BYTES / 4).fill(2),
        arena: new Uint8Array(gemvArenaBytes()).fill(3),
      };
      return gemvMemory;
    };
    cleanups.push(() => {
      gemvMemory = null;
    });
    const copyRate = () => {
      const { src, dst } = memory();
      return (2 * GEMV_BYTES) / 1e9 / seconds(() => ctx.cast(src, "f32", dst, "f32", src.length));
    };
    cases.push({
      case: `memory copy ${GEMV_BYTES / 2 ** 20} MiB (tp_cpu_cast f32→f32)`,
      metric: "bandwidth (read + write)",
      unit: "GB/s",
      better: "higher",
      ours: copyRate,
    });

    // ---- 1. GEMV ----
    for (const [k, n] of GEMV_SHAPES) {
      for (const format of GEMV_FORMATS) {
        const rowBytes = lib.weightRowBytes(format, k);
        const bytes = n * rowBytes;
        const copies = Math.max(2, Math.ceil(GEMV_BYTES / bytes));
        const key = `gemv ${format} ${k} ${n}`;
        const state = lazy(
          key,
          () => {
            const one = weightBytes(format, n, k, k + n);
            const all = memory().arena.subarray(0, bytes * copies);
            for (let c = 0; c < copies; c++) all.set(one, c * bytes);
            const ws: NativeWeight[] = [];
            const scale = format === "f8_e4m3fn" ? Float32Array.of(0.01) : null;
            for (let c = 0; c < copies; c++) {
              ws.push({ format, n, k, data: all.subarray(c * bytes, (c + 1) * bytes), scale, group: 0 });
            }
            const x = new Float32Array(k).map(rng(7));
            const y = new Float32Array(n);
            let ggml: { s: ReturnType<Shim["shim_new"]>; buft: string } | null = null;
            if (typeof llama !== "string" && GGML_TYPE[format] !== undefined) {
              const s = llama.shim_new(GGML_TYPE[format] as number, k, n, copies, 1, 1);
              if (s !== null) {
                for (let c = 0; c < copies; c++) llama.shim_set_weight(s, c, ptr(all, c * bytes), bytes);
                llama.shim_set_x(s, ptr(x), k * 4);
                ggml = { s, buft: String(llama.shim_buft(s)) };
                // same answer? (ggml quantizes x the same way for these types; bf16 rounds x to bf16 too)
                const yg = new Float32Array(n);
                ctx.matmul(x, 1, ws[0] as NativeWeight, null, y);
                llama.shim_compute(s);
                llama.shim_get_y(s, 0, ptr(yg), n * 4);
                let num = 0;
                let den = 0;
                for (let i = 0; i < n; i++) {
                  num += ((y[i] as number) - (yg[i] as number)) ** 2;
                  den += (yg[i] as number) ** 2;
                }
                console.log(
                  `  ${key}: llama.cpp buffer ${ggml.buft}, NMSE(ours, llama.cpp) = ${(num / den).toExponential(1)}`,
                );
              }
            }
            return { ws, x, y, ggml, total: bytes * copies };
          },
          (st) => {
            if (st.ggml && typeof llama !== "string") llama.shim_free(st.ggml.s);
          },
        );
        const ours = () => {
          const st = state();
          return (
            st.total /
            1e9 /
            seconds(() => {
              for (const w of st.ws) ctx.matmul(st.x, 1, w, null, st.y);
            })
          );
        };
        const name = `GEMV ${format} M=1 K=${k} N=${n}`;
        cases.push({
          case: name,
          metric: "weights read",
          unit: "GB/s",
          better: "higher",
          ours,
          peer:
            GGML_TYPE[format] === undefined
              ? undefined
              : ggmlPeer(llama, () => {
                  const st = state();
                  return st.ggml
                    ? st.total / 1e9 / seconds(() => (llama as Shim).shim_compute(st.ggml?.s ?? null))
                    : Number.NaN;
                }),
        });
        cases.push({
          case: `${name} / copy bandwidth`,
          metric: "weights read vs copy (read + write)",
          unit: "GB/s",
          better: "higher",
          ours,
          peer: { name: "memory copy (tp_cpu_cast)", run: copyRate },
        });
      }
    }

    // ---- 2. GEMM ----
    for (const n of GEMM_N) {
      for (const format of GEMM_FORMATS) {
        const key = `gemm ${format} ${n}`;
        const flop = 2 * GEMM_M * n * GEMM_K;
        const state = lazy(key, () => {
          const convrot = format.includes("convrot");
          const w: NativeWeight = {
            format,
            n,
            k: GEMM_K,
            data: weightBytes(format, n, GEMM_K, n),
            scale: convrot
              ? new Float32Array(n).fill(0.01)
              : format === "f8_e4m3fn"
                ? Float32Array.of(0.02)
                : null,
            group: convrot ? 256 : 0,
          };
          const r = rng(3);
          const x = new Float32Array(GEMM_M * GEMM_K).map(() => r() * 2 - 1);
          return { w, x, y: new Float32Array(GEMM_M * n) };
        });
        const ours = () => {
          const st = state();
          return flop / 1e9 / seconds(() => ctx.matmul(st.x, GEMM_M, st.w, null, st.y));
        };
        const name = `GEMM ${format} M=${GEMM_M} K=${GEMM_K} N=${n}`;
        const torchPeer = (dtype: "bf16" | "f32") =>
          typeof torch === "string"
            ? undefined
            : {
                name: `torch.matmul ${dtype}`,
                run: async () =>
                  flop / 1e9 / (await torch.ask({ op: "matmul", dtype, m: GEMM_M, k: GEMM_K, n })),
              };
        cases.push({
          case: name,
          metric: "throughput",
          unit: "GFLOP/s",
          better: "higher",
          runs: 5,
          ours,
          peer: torchPeer("bf16"),
        });
        cases.push({
          case: name,
          metric: "throughput",
          unit: "GFLOP/s",
          better: "higher",
          runs: 3,
          ours,
          peer: torchPeer("f32"),
        });
        if (typeof peak !== "string") {
          const int8 = format.includes("convrot");
          const value = int8 ? peak.int8_gops : peak.bf16_gflops;
          cases.push({
            case: `${name} / peak`,
            metric: "fraction of peak",
            unit: "GFLOP/s",
            better: "higher",
            runs: 3,
            ours,
            peer: { name: `peak ${int8 ? "int8 (vpdpbusd)" : "bf16 (vdpbf16ps)"}`, run: () => value },
          });
        }
      }
    }

    // ---- 2b. GEMM of GGUF weights at prompt-processing shapes, against llama.cpp's kernels ----
    for (const [m, k, n] of PP_SHAPES) {
      for (const format of PP_FORMATS) {
        const key = `pp ${format} ${m} ${k} ${n}`;
        const flop = 2 * m * n * k;
        const state = lazy(
          key,
          () => {
            const data = weightBytes(format, n, k, k + n);
            const w: NativeWeight = { format, n, k, data, scale: null, group: 0 };
            const r = rng(5);
            const x = new Float32Array(m * k).map(() => r() * 2 - 1);
            const y = new Float32Array(m * n);
            let ggml: ReturnType<Shim["shim_new"]> | null = null;
            if (typeof llama !== "string") {
              ggml = llama.shim_new(GGML_TYPE[format] as number, k, n, 1, m, 1);
              if (ggml !== null) {
                llama.shim_set_weight(ggml, 0, ptr(data), data.length);
                llama.shim_set_x(ggml, ptr(x), m * k * 4);
              }
            }
            return { w, x, y, ggml };
          },
          (st) => {
            if (st.ggml && typeof llama !== "string") llama.shim_free(st.ggml);
          },
        );
        cases.push({
          case: `GEMM ${format} M=${m} K=${k} N=${n} (prompt processing)`,
          metric: "throughput",
          unit: "GFLOP/s",
          better: "higher",
          runs: 5,
          ours: () => {
            const st = state();
            return flop / 1e9 / seconds(() => ctx.matmul(st.x, m, st.w, null, st.y));
          },
          peer: ggmlPeer(llama, () => {
            const st = state();
            return st.ggml ? flop / 1e9 / seconds(() => (llama as Shim).shim_compute(st.ggml)) : Number.NaN;
          }),
        });
      }
    }

    // ---- 3. attention ----
    const backend = createBackend({ threads: THREADS });
    cleanups.push(() => backend.dispose());
    const HEAD = 128;
    for (const seq of [1280, 4352]) {
      for (const heads of [48, 12]) {
        for (const prefix of [null, seq - 256]) {
          const mask = prefix === null ? "full" : `prefix ${prefix}`;
          const name = `attention seq=${seq} heads=${heads}×${HEAD} ${mask}`;
          if (!backend.supports("attention", ["f32"])) {
            cases.push({
              case: `${name} (missing: backend cpu has no attention op yet)`,
              metric: "throughput",
              unit: "GFLOP/s",
              better: "higher",
              timed: false,
              ours: () => 0,
            });
            continue;
          }
          const flop = 4 * heads * seq * seq * HEAD;
          const state = lazy(
            `attn ${name}`,
            () => {
              const r = rng(seq + heads);
              const make = () =>
                backend.upload(
                  new Float32Array(heads * seq * HEAD).map(() => r() - 0.5),
                  [1, heads, seq, HEAD],
                  "f32",
                );
              return { q: make(), k: make(), v: make() };
            },
            (st) => {
              backend.free(st.q);
              backend.free(st.k);
              backend.free(st.v);
            },
          );
          cases.push({
            case: name,
            metric: "throughput",
            unit: "GFLOP/s",
            better: "higher",
            runs: seq > 2000 && heads > 12 ? 3 : 5,
            ours: () => {
              const st = state();
              let out: Tensor | null = null;
              const s = seconds(() => {
                out = backend.attention(
                  st.q,
                  st.k,
                  st.v,
                  prefix === null ? {} : { causal: true, fullPrefix: prefix },
                );
              });
              if (out) backend.free(out);
              return flop / 1e9 / s;
            },
            peer:
              typeof torch === "string"
                ? undefined
                : {
                    name: torch.info.sdpa
                      ? "torch scaled_dot_product_attention"
                      : "torch softmax(q·kᵀ)·v per head",
                    run: async () =>
                      flop / 1e9 / (await torch.ask({ op: "sdpa", heads, seq, dim: HEAD, prefix })),
                  },
          });
        }
      }
    }
    return cases;
  },
  teardown(): void {
    current?.drop();
    for (const c of cleanups) c();
    ctx.destroy();
  },
};
