/**
 * `bun run bench gpu`: the GPU backends (`ptx`, and `cuda` = ptx + cuBLASLt) side by side against
 * PyTorch on the same machine, in one run (issues 24 and 25, "Bench"):
 *
 * - Krea 2 at 1024² (64×64 patch grid = 4096 image tokens + 64 text tokens): one single-stream block
 *   at the real sizes (features 6144, 48 / 12 heads of 128, SwiGLU 16384; krea2.md §3.3) with random
 *   weights built in memory (no checkpoint) in bf16, fp8 e4m3 with a tensor scale, INT8 ConvRot (W8A8)
 *   and INT4 ConvRot (W4A4), run through the model's own block (`krea2SingleStreamBlock`) with every
 *   weight resident; s/step = 28 × one block — extrapolated, like the peer: the patch embedding,
 *   timestep MLP, text side and final layer (a few ms) are outside both. fp8 also runs on the W8A8
 *   opt-ins (`ptx` fp8Mma, `cuda` fp8Activations) as its own rows. Peer: the same block in PyTorch
 *   bf16 on CUDA (./krea2-torch-peer.py with `device: "cuda"`, sdpa, timed between
 *   torch.cuda.synchronize calls) — a PyTorch re-statement of ComfyUI's `SingleStreamBlock`, not
 *   ComfyUI itself. Ratio = peer s/step / ours (> 1: ours is faster).
 * - LLM decode: the weight-streaming work of one token of a Qwen3-8B-shaped (36 layers, hidden 4096,
 *   intermediate 12288, 32 / 8 heads of 128, vocab 151936) and a Qwen3-0.6B-shaped model (28 layers,
 *   hidden 1024, intermediate 3072, 16 / 8 heads of 128) in Q8_0 and Q4_0: every layer's q / k / v / o /
 *   gate / up / down matmul at M = 1 (its own resident weights) plus attention over a 1024-token f32
 *   KV cache, and the LM head; no norms, RoPE or sampling; and the same without the attention (the
 *   matmuls alone: what the HBM fraction of the GEMV kernels is). tok/s, and the fraction of the device's HBM
 *   bandwidth that the weight bytes read per token reach (peak from the device name: H200 4.8 TB/s;
 *   the KV cache reads are not counted). Peer (the floor to beat): PyTorch eager doing the same
 *   matmuls in bf16 (cuBLAS) with sdpa over a bf16 KV cache (./decode-torch-peer.py).
 *
 * A backend that does not start (no libcuda.so.1, no cuBLASLt) gives its rows as "not run: <reason>";
 * a torch without CUDA gives the peer column's reason. Nothing is installed.
 *
 * `TP_BENCH_GPU_TINY=1` (or {@link gpuSuite}`({ tiny: true })`): the same code paths at toy shapes on
 * the PTX simulator (sm_89; cuda's cuBLASLt there is a float64 model) and the torch peers on the CPU when
 * torch is there — for checking the
 * plumbing without a GPU (scripts/bench-gpu.test.ts); the figures then say nothing about speed.
 */
import { availableParallelism } from "node:os";
import { join } from "node:path";
import {
  type Backend,
  type BackendOptions,
  loadBackend,
  type Tensor,
  Weight,
  type WeightFormat,
  weightBytes,
} from "@tp/tensor";
import {
  type Krea2BlockParams,
  type Krea2Rope,
  krea2AxesDim,
  krea2Positions,
  krea2RopeOptions,
  krea2SingleStreamBlock,
} from "../src/models/krea2.ts";
import { KREA2_CONFIG } from "../src/testing/random-checkpoints.ts";

// ---------------------------------------------------------------------------------------------- shapes

/** One Krea 2 single-stream block's sizes and its sequence. */
export interface BlockShape {
  features: number;
  heads: number;
  kvheads: number;
  head_dim: number;
  mlp_hidden: number;
  /** Text tokens before the image tokens. */
  txt: number;
  /** Patch grid side (image tokens = grid²; 1024² pixels → 128² latent → 64² patches). */
  grid: number;
  /** ConvRot rotation group (columns; a power of 4 dividing every K). */
  group: number;
  /** Blocks of the model (s/step = blocks × one block). */
  blocks: number;
}

/** The real block at 1024² (krea2.md §1.3, §3.1; KREA2_CONFIG) with 64 text tokens (a short prompt). */
export const KREA2_1024_BLOCK: BlockShape = {
  features: KREA2_CONFIG.features,
  heads: KREA2_CONFIG.heads,
  kvheads: KREA2_CONFIG.kvheads,
  head_dim: KREA2_CONFIG.head_dim,
  mlp_hidden: KREA2_CONFIG.mlp_hidden,
  txt: 64,
  grid: 64,
  group: 256,
  blocks: KREA2_CONFIG.layers,
};

/** Toy sizes for the simulator (L = 4 + 16 tokens; a few seconds of JavaScript kernels per format). */
export const TINY_BLOCK: BlockShape = {
  features: 64,
  heads: 2,
  kvheads: 1,
  head_dim: 32,
  mlp_hidden: 128,
  txt: 4,
  grid: 4,
  group: 64,
  blocks: 28,
};

/** A decoder's per-token matmul shapes (Qwen3: q [heads·d, hidden], k / v [kvheads·d, hidden], ...). */
export interface DecodeShape {
  name: string;
  layers: number;
  hidden: number;
  intermediate: number;
  heads: number;
  kvheads: number;
  head_dim: number;
  vocab: number;
  /** Tokens in the KV cache each decoded token attends over. */
  ctx: number;
  /** Tokens decoded per timed run (one synchronize at the end). */
  tokens: number;
}

/** Qwen3-8B (config.json: 36 layers, hidden 4096, intermediate 12288, 32 / 8 heads of 128, vocab 151936). */
export const QWEN3_8B: DecodeShape = {
  name: "Qwen3-8B",
  layers: 36,
  hidden: 4096,
  intermediate: 12288,
  heads: 32,
  kvheads: 8,
  head_dim: 128,
  vocab: 151936,
  ctx: 1024,
  tokens: 8,
};

/** Qwen3-0.6B (28 layers, hidden 1024, intermediate 3072, 16 / 8 heads of 128, tied embeddings). */
export const QWEN3_0_6B: DecodeShape = {
  name: "Qwen3-0.6B",
  layers: 28,
  hidden: 1024,
  intermediate: 3072,
  heads: 16,
  kvheads: 8,
  head_dim: 128,
  vocab: 151936,
  ctx: 1024,
  tokens: 32,
};

/** Toy decoder for the simulator. */
export const TINY_DECODE: DecodeShape = {
  name: "tiny",
  layers: 2,
  hidden: 64,
  intermediate: 128,
  heads: 2,
  kvheads: 1,
  head_dim: 32,
  vocab: 256,
  ctx: 8,
  tokens: 2,
};

/** Peak HBM bandwidth in bytes/s by a substring of the device name (vendor data sheets). */
export const HBM_BYTES_PER_S: readonly [string, number][] = [
  ["H200", 4.8e12],
  ["H100", 3.35e12],
  ["A100", 2.0e12],
  ["RTX 4090", 1.008e12],
  ["RTX 3090", 0.936e12],
];

/** The peak of {@link HBM_BYTES_PER_S} whose key the device name contains, or null. */
export function hbmPeak(device: string): { key: string; bytesPerSecond: number } | null {
  const hit = HBM_BYTES_PER_S.find(([k]) => device.includes(k));
  return hit ? { key: hit[0], bytesPerSecond: hit[1] } : null;
}

// ---------------------------------------------------------------------------------------------- weights

type BlockFormat = "bf16" | "fp8" | "int8_convrot" | "int4_convrot";
const BLOCK_FORMATS: readonly BlockFormat[] = ["int8_convrot", "int4_convrot", "bf16", "fp8"];
const BLOCK_FORMAT_NAME: Record<BlockFormat, string> = {
  bf16: "bf16",
  fp8: "fp8 e4m3 scaled",
  int8_convrot: "INT8 ConvRot W8A8",
  int4_convrot: "INT4 ConvRot W4A4",
};
type DecodeFormat = "q8_0" | "q4_0";
const DECODE_FORMATS: readonly DecodeFormat[] = ["q8_0", "q4_0"];

/** Fill `bytes` with a fixed pseudo-random sequence (a 32-bit xorshift), four bytes a step. */
function fillRandom(bytes: Uint8Array, seed: number): void {
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
  let s = (seed * 2654435761 + 1) >>> 0 || 1;
  for (let i = 0; i < words.length; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    words[i] = s >>> 0;
  }
  for (let i = words.length * 4; i < bytes.length; i++) bytes[i] = (i * 131) & 0xff;
}

/**
 * Random bytes of a [n, k] weight in `format`, finite and of magnitude about 1/√k: bf16 with exponents
 * 2⁻⁷ / 2⁻⁶; fp8 e4m3 with exponents ≤ 6 (|w| < 1, scaled by the tensor scale); ConvRot codes of any
 * value (the row scales set the size); GGUF blocks with random codes and d = 2⁻¹² (Q8_0) / 2⁻⁸ (Q4_0)
 * in every block (ggml-common.h: Q8_0 = f16 d + 32 int8, Q4_0 = f16 d + 16 bytes of nibbles).
 */
function randomWeightBytes(format: WeightFormat, n: number, k: number, seed: number): Uint8Array {
  const data = new Uint8Array(weightBytes(format, [n, k]));
  fillRandom(data, seed);
  if (format === "bf16") {
    const w = new Uint32Array(data.buffer, 0, data.byteLength >>> 2);
    for (let i = 0; i < w.length; i++) w[i] = (((w[i] as number) & 0x80ff80ff) | 0x3c003c00) >>> 0;
  } else if (format === "f8_e4m3fn") {
    const w = new Uint32Array(data.buffer, 0, data.byteLength >>> 2);
    for (let i = 0; i < w.length; i++) w[i] = ((w[i] as number) & 0xb7b7b7b7) >>> 0;
  } else if (format === "q8_0" || format === "q4_0") {
    const [block, hi] = format === "q8_0" ? [34, 0x0c] : [18, 0x1c]; // f16 2^-12 = 0x0c00, 2^-8 = 0x1c00
    for (let at = 0; at < data.length; at += block) {
      data[at] = 0x00;
      data[at + 1] = hi;
    }
  }
  return data;
}

/**
 * Builds weights, sharing the host bytes of equal (format, shape) for the whole run (each Weight is
 * still its own device copy): the next backend's models reuse them instead of filling them again.
 */
class WeightMaker {
  #bytes = new Map<string, Uint8Array>();
  #seed = 1;

  make(name: string, format: WeightFormat, n: number, k: number, group: number): Weight {
    const key = `${format} ${n}×${k}`;
    let data = this.#bytes.get(key);
    if (data === undefined) {
      data = randomWeightBytes(format, n, k, this.#seed++);
      this.#bytes.set(key, data);
    }
    const base = { name, format, shape: [n, k] as [number, number], data };
    if (format === "int8_convrot" || format === "int4_convrot") {
      // code std ≈ 74 (uniform int8) or 4.6 (uniform int4): row scale for |w| ≈ 1/√k
      const std = format === "int8_convrot" ? 74 : 4.6;
      const values = new Float32Array(n).fill(1 / (std * Math.sqrt(k)));
      return new Weight({ ...base, scale: { kind: "row", values }, rotationGroup: group });
    }
    if (format === "f8_e4m3fn")
      return new Weight({ ...base, scale: { kind: "tensor", value: 1 / Math.sqrt(k) } });
    return new Weight(base);
  }
}

const WEIGHT_FORMAT: Record<BlockFormat, WeightFormat> = {
  bf16: "bf16",
  fp8: "f8_e4m3fn",
  int8_convrot: "int8_convrot",
  int4_convrot: "int4_convrot",
};

/** A pseudo-random f32 array (xorshift, uniform in ±amplitude). */
function randomF32(count: number, amplitude: number, seed: number): Float32Array {
  const out = new Float32Array(count);
  let s = (seed * 2654435761 + 7) >>> 0 || 1;
  for (let i = 0; i < count; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = ((s >>> 0) / 2 ** 32 - 0.5) * 2 * amplitude;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------- backends

/** One backend configuration the suite runs. */
interface Variant {
  label: string;
  backend: "ptx" | "cuda";
  options: Record<string, unknown>;
  /** The block formats it runs (all when absent); decode runs on variants without `only`. */
  only?: readonly BlockFormat[];
}

const VARIANTS: readonly Variant[] = [
  { label: "ptx", backend: "ptx", options: {} },
  { label: "ptx fp8Mma (W8A8)", backend: "ptx", options: { fp8Mma: true }, only: ["fp8"] },
  { label: "cuda", backend: "cuda", options: {} },
  { label: "cuda fp8Activations (W8A8)", backend: "cuda", options: { fp8Activations: true }, only: ["fp8"] },
];

/** The backend's resident-weight methods (ptx, cuda). */
interface Residency {
  makeResident?(w: Weight): void;
  evict?(w: Weight): void;
}

/** One backend instance at a time (the previous one is disposed), with what is resident on it. */
class Backends {
  current: { variant: Variant; b: Backend; group: string; weights: Weight[]; tensors: Tensor[] } | null =
    null;

  constructor(readonly simulate: string | null) {}

  options(v: Variant): BackendOptions {
    return { ...v.options, ...(this.simulate ? { simulate: this.simulate } : {}) } as BackendOptions;
  }

  async get(v: Variant): Promise<Backend> {
    if (this.current?.variant === v) return this.current.b;
    this.close();
    const b = await loadBackend(v.backend, this.options(v));
    this.current = { variant: v, b, group: "", weights: [], tensors: [] };
    return b;
  }

  /**
   * Make `weights` (and `tensors`, already uploaded) the resident set of group `key`, freeing the
   * previous group's; the first call of a group runs `build`.
   */
  resident(key: string, build: (b: Backend) => { weights: Weight[]; tensors: Tensor[] }): boolean {
    const c = this.current;
    if (c === null) throw new Error("no backend");
    if (c.group === key) return false;
    this.release();
    const r = c.b as unknown as Residency;
    const made = build(c.b);
    for (const w of made.weights) r.makeResident?.(w);
    c.b.persist(made.tensors);
    c.group = key;
    c.weights = made.weights;
    c.tensors = made.tensors;
    return true;
  }

  release(): void {
    const c = this.current;
    if (c === null) return;
    const r = c.b as unknown as Residency;
    for (const w of c.weights) r.evict?.(w);
    for (const t of c.tensors) if (!t.storage.freed) c.b.free(t);
    c.group = "";
    c.weights = [];
    c.tensors = [];
  }

  close(): void {
    if (this.current === null) return;
    this.release();
    this.current.b.dispose();
    this.current = null;
  }
}

// ---------------------------------------------------------------------------------------------- harness types

/** scripts/bench-harness.ts's TorchPeer (packages import no file outside them). */
interface TorchPeer {
  info: { torch: string; threads: number; sdpa: boolean; blas: string; cuda?: string | null };
  ask(req: Record<string, unknown>): Promise<number>;
  close(): void;
}

/** The field of scripts/bench-harness.ts's BenchContext this suite uses. */
interface Context {
  startTorch(script: string, threads: number, options?: { install?: boolean }): Promise<TorchPeer | string>;
}

/** scripts/bench-harness.ts's BenchCase. */
export interface GpuBenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  runs?: number;
  timed?: boolean;
  ours: () => number | Promise<number>;
  peer?: { name: string; run: () => number | Promise<number> };
}

/** Options of {@link gpuSuite}. */
export interface GpuSuiteOptions {
  /** Toy shapes on the PTX simulator (sm_89) and the torch peers on the CPU: the plumbing, not speed. */
  tiny?: boolean;
  /** Timed runs per case (default 5; 1 when tiny). */
  runs?: number;
  /** Peak memory bandwidth in bytes/s for the HBM fraction (default TP_BENCH_GPU_HBM_PEAK, else by device name). */
  hbmPeak?: number;
}

/** The reason a row gives: a message up to its first "; " (the rest is in the suite's description). */
function short(why: string): string {
  return why.split("; ")[0] ?? why;
}

function message(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split("\n")[0]?.slice(0, 300) ?? "";
}

function median(xs: number[]): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/**
 * A case whose side may fail: the first failure is kept, its row's case (or peer) name says it, and
 * every later call answers NaN at once (the harness then has no spread to check).
 */
function guarded(c: GpuBenchCase, side: "ours" | "peer", f: () => Promise<number>): () => Promise<number> {
  let failed = false;
  return async () => {
    if (failed) return Number.NaN;
    try {
      const v = await f();
      // each measurement as it is taken (a run cut short by a time limit still leaves them in its log)
      process.stderr.write(
        `  ${side === "ours" ? "ours" : "peer"} ${v.toPrecision(4)} ${c.unit}: ${c.case}\n`,
      );
      return v;
    } catch (e) {
      failed = true;
      const why = message(e);
      process.stderr.write(`  ${c.case}: ${side} failed: ${why}\n`);
      if (side === "ours") c.case += ` — failed: ${why}`;
      else if (c.peer) c.peer.name += ` — failed: ${why}`;
      return Number.NaN;
    }
  };
}

// ---------------------------------------------------------------------------------------------- the suite

/**
 * The `gpu` bench suite (see the module comment). Exported as a factory for the tiny run of
 * scripts/bench-gpu.test.ts; the default export reads TP_BENCH_GPU_TINY.
 */
export function gpuSuite(options: GpuSuiteOptions = {}) {
  const tiny = options.tiny === true;
  const runs = options.runs ?? (tiny ? 1 : 5);
  const block = tiny ? TINY_BLOCK : KREA2_1024_BLOCK;
  const decodeShapes = tiny ? [TINY_DECODE] : [QWEN3_8B, QWEN3_0_6B];
  const backends = new Backends(tiny ? "sm_89" : null);
  const peers: TorchPeer[] = [];
  const lines: string[] = [];

  return {
    get description(): string {
      return (
        lines.join("; ") ||
        "Krea 2 block s/step (1024², per format) and LLM decode tok/s / HBM fraction on ptx and cuda vs PyTorch"
      );
    },
    usage: [
      "  TP_BENCH_GPU_TINY=1   toy shapes on the PTX simulator (sm_89), torch peers on the CPU: checks the",
      "                        plumbing without a GPU (slow JavaScript kernels; the figures mean nothing)",
      "  TP_CUDA_LIB_DIR       folders with libcuda.so.1 / libcublasLt.so.13 (bun run test:gpu sets it from",
      "                        PyTorch's nvidia wheels); PyTorch must be installed already (nothing is installed)",
      "  TP_BENCH_GPU_HBM_PEAK  peak memory bandwidth in bytes/s for the HBM fraction (default: by device name,",
      "                        H200 4.8e12, H100 3.35e12, A100 2.0e12, RTX 4090 1.008e12, RTX 3090 0.936e12)",
    ].join("\n"),

    async cases(harness: Context): Promise<GpuBenchCase[]> {
      // which backends start (each created once and disposed; the cases create them again)
      const started = new Map<Variant, string>(); // device, or the reason in `failed`
      const failed = new Map<Variant, string>();
      for (const v of VARIANTS) {
        try {
          const b = await backends.get(v);
          started.set(v, b.device ?? v.backend);
        } catch (e) {
          failed.set(v, message(e));
        }
        backends.close();
      }
      const device = [...started.values()][0] ?? null;
      lines.push(
        ...VARIANTS.filter((v) => v.only === undefined).map(
          (v) => `${v.label}: ${started.get(v) ?? `not run: ${failed.get(v)}`}`,
        ),
      );

      // the torch peers
      const threads = availableParallelism();
      const startPeer = async (script: string): Promise<TorchPeer | string> => {
        try {
          const p = await harness.startTorch(join(import.meta.dir, script), threads, { install: false });
          if (typeof p !== "string") peers.push(p);
          return p;
        } catch (e) {
          return message(e);
        }
      };
      const blockPeer = await startPeer("krea2-torch-peer.py");
      const decodePeer = await startPeer("decode-torch-peer.py");
      /** The torch device for a peer, or why it does not run. */
      const torchDevice = (p: TorchPeer | string): { device: string; name: string } | string => {
        if (typeof p === "string") return p;
        const cuda = p.info.cuda ?? null;
        if (cuda !== null) return { device: "cuda", name: `torch ${p.info.torch} bf16 eager on ${cuda}` };
        if (tiny) return { device: "cpu", name: `torch ${p.info.torch} bf16 eager on the CPU (tiny)` };
        return `torch ${p.info.torch} sees no CUDA device`;
      };
      const blockTorch = torchDevice(blockPeer);
      const decodeTorch = torchDevice(decodePeer);
      lines.push(`torch: ${typeof blockTorch === "string" ? `not run: ${blockTorch}` : blockTorch.name}`);
      const given = options.hbmPeak ?? Number(process.env.TP_BENCH_GPU_HBM_PEAK ?? Number.NaN);
      const peak =
        Number.isFinite(given) && given > 0
          ? { key: "given", bytesPerSecond: given }
          : device === null
            ? null
            : hbmPeak(device);
      lines.push(
        `HBM peak: ${peak === null ? `unknown for ${device ?? "no device"}` : `${(peak.bytesPerSecond / 1e12).toPrecision(3)} TB/s (${peak.key})`}`,
      );
      if (tiny) lines.push("tiny: toy shapes on the PTX simulator, not a measurement of speed");
      process.stderr.write(`# ${lines.join("\n# ")}\n`);

      const cases: GpuBenchCase[] = [];
      const notRun = (name: string, metric: string, unit: string, why: string): GpuBenchCase => ({
        case: `${name} — not run: ${short(why)}`,
        metric,
        unit,
        better: metric === "s/step" ? "lower" : "higher",
        timed: false,
        ours: () => Number.NaN,
      });

      // ------------------------------------------------------------------ Krea 2 blocks
      const tokens = block.grid * block.grid;
      const side = block.grid * 16;
      const blockReq = {
        op: "block",
        features: block.features,
        heads: block.heads,
        kvheads: block.kvheads,
        head_dim: block.head_dim,
        mlp_hidden: block.mlp_hidden,
        txt: block.txt,
        h: block.grid,
        w: block.grid,
      };
      let blockInputs: {
        v: Variant;
        format: BlockFormat;
        params: Krea2BlockParams;
        x: Tensor;
        tvec: Tensor;
        rope: Krea2Rope;
      } | null = null;
      const maker = new WeightMaker();
      const buildBlock = (b: Backend, format: BlockFormat) => {
        const F = block.features;
        const hd = block.heads * block.head_dim;
        const kvd = block.kvheads * block.head_dim;
        const M = block.mlp_hidden;
        const f = WEIGHT_FORMAT[format];
        const w = (name: string, n: number, k: number) => maker.make(`block.${name}`, f, n, k, block.group);
        const weights = {
          wq: w("attn.wq", hd, F),
          wk: w("attn.wk", kvd, F),
          wv: w("attn.wv", kvd, F),
          gate: w("attn.gate", hd, F),
          wo: w("attn.wo", F, hd),
          mlpGate: w("mlp.gate", M, F),
          up: w("mlp.up", M, F),
          down: w("mlp.down", F, M),
        };
        const L = block.txt + tokens;
        const up = (data: Float32Array, shape: number[]) => b.upload(data, shape, "f32");
        const zeros = (n: number) => up(new Float32Array(n), [n]);
        const tensors = {
          prenorm: zeros(F),
          postnorm: zeros(F),
          qnorm: zeros(block.head_dim),
          knorm: zeros(block.head_dim),
          mod: up(randomF32(6 * F, 0.02, 3), [6 * F]),
          tvec: up(randomF32(6 * F, 0.02, 4), [1, 1, 6 * F]),
          x: up(randomF32(L * F, 1, 5), [1, L, F]),
          positions: b.upload(krea2Positions(block.txt, block.grid, block.grid), [3, L], "i32"),
        };
        const params: Krea2BlockParams = {
          prenorm: tensors.prenorm,
          postnorm: tensors.postnorm,
          mod: tensors.mod,
          attn: {
            wq: weights.wq,
            wk: weights.wk,
            wv: weights.wv,
            gate: weights.gate,
            wo: weights.wo,
            qnorm: tensors.qnorm,
            knorm: tensors.knorm,
            heads: block.heads,
            kvheads: block.kvheads,
            headDim: block.head_dim,
          },
          mlp: { gate: weights.mlpGate, up: weights.up, down: weights.down },
        };
        const rope: Krea2Rope = {
          positions: tensors.positions,
          options: krea2RopeOptions({
            axes_dim: krea2AxesDim(block.head_dim),
            theta: 1000, // ComfyUI's constant (krea2.md §3.1)
            head_dim: block.head_dim,
          }),
        };
        return {
          weights: Object.values(weights),
          tensors: Object.values(tensors),
          inputs: { params, x: tensors.x, tvec: tensors.tvec, rope },
        };
      };

      for (const v of VARIANTS) {
        for (const format of BLOCK_FORMATS) {
          if (v.only !== undefined && !v.only.includes(format)) continue;
          const name = `Krea 2 ${BLOCK_FORMAT_NAME[format]} ${side}² (${tokens} img + ${block.txt} txt tokens) on ${v.label}: ${block.blocks} × one block (extrapolated)`;
          const why = failed.get(v);
          if (why !== undefined) {
            cases.push(notRun(name, "s/step", "s", why));
            continue;
          }
          const c: GpuBenchCase = {
            case: name,
            metric: "s/step",
            unit: "s",
            better: "lower",
            runs,
            ours: () => 0,
          };
          let checked = false;
          c.ours = guarded(c, "ours", async () => {
            const b = await backends.get(v);
            backends.resident(`block ${format}`, (bb) => {
              const built = buildBlock(bb, format);
              blockInputs = { v, format, ...built.inputs };
              return built;
            });
            const inp = blockInputs;
            if (inp === null) throw new Error("block inputs missing");
            await b.synchronize();
            const t0 = performance.now();
            const y = krea2SingleStreamBlock(b, inp.x, inp.tvec, inp.params, 1e-5, inp.rope);
            await b.synchronize();
            const s = (performance.now() - t0) / 1000;
            try {
              if (!checked) {
                checked = true;
                const n = b.countNonFinite(y);
                const bad = Number((await b.read(n))[0]);
                b.free(n);
                if (bad > 0) c.case += ` (output had ${bad} non-finite values)`;
              }
            } finally {
              b.free(y);
            }
            return block.blocks * s;
          });
          if (typeof blockTorch !== "string" && typeof blockPeer !== "string") {
            const p = blockPeer;
            const dev = blockTorch.device;
            c.peer = { name: `${blockTorch.name}, ${block.blocks} × one block`, run: () => 0 };
            c.peer.run = guarded(
              c,
              "peer",
              async () => block.blocks * (await p.ask({ ...blockReq, device: dev })),
            );
          } else {
            c.peer = { name: `torch — not run: ${blockTorch as string}`, run: () => Number.NaN };
          }
          cases.push(c);
        }
      }

      // ------------------------------------------------------------------ LLM decode
      const decodeVariants = VARIANTS.filter((v) => v.only === undefined);
      let decodeModel: { weights: Weight[]; m: DecodeModel; bytes: number } | null = null;
      for (const v of decodeVariants) {
        for (const shape of decodeShapes) {
          for (const format of DECODE_FORMATS) {
            for (const attend of [true, false]) {
              const work = attend
                ? `matmuls + attention over ${shape.ctx} tokens`
                : "matmuls alone (no attention)";
              const bytes = decodeWeightBytes(shape, format);
              const name = `${shape.name}-shaped ${format.toUpperCase()} decode on ${v.label}: ${shape.layers} layers of M = 1 ${work} + LM head (${(bytes / 1e9).toPrecision(3)} GB of weights / token)`;
              const fracName = `${shape.name}-shaped ${format.toUpperCase()} decode on ${v.label}, ${work}: weight bytes per token × tok/s / HBM peak${peak ? ` (${peak.key} ${(peak.bytesPerSecond / 1e12).toPrecision(3)} TB/s)` : ""}`;
              const why = failed.get(v);
              if (why !== undefined) {
                cases.push(notRun(name, "tok/s", "tok/s", why));
                cases.push(notRun(fracName, "HBM fraction", "fraction", why));
                continue;
              }
              const oursRuns: number[] = [];
              const peerRuns: number[] = [];
              const c: GpuBenchCase = {
                case: name,
                metric: "tok/s",
                unit: "tok/s",
                better: "higher",
                runs,
                ours: () => 0,
              };
              c.ours = guarded(c, "ours", async () => {
                const b = await backends.get(v);
                backends.resident(`decode ${shape.name} ${format}`, (bb) => {
                  const built = buildDecode(bb, shape, format, maker);
                  decodeModel = { weights: built.weights, m: built.model, bytes };
                  return built;
                });
                const dm = decodeModel as { m: DecodeModel } | null;
                if (dm === null) throw new Error("decode model missing");
                await b.synchronize();
                const t0 = performance.now();
                for (let t = 0; t < shape.tokens; t++) decodeToken(b, dm.m, shape, attend);
                await b.synchronize();
                const tps = shape.tokens / ((performance.now() - t0) / 1000);
                oursRuns.push(tps);
                return tps;
              });
              if (typeof decodeTorch !== "string" && typeof decodePeer !== "string") {
                const p = decodePeer;
                const dev = decodeTorch.device;
                c.peer = {
                  name: `${decodeTorch.name}: the same matmuls in bf16${attend ? ", sdpa over a bf16 KV cache" : ""}`,
                  run: () => 0,
                };
                c.peer.run = guarded(c, "peer", async () => {
                  const s = await p.ask({ op: "decode", ...shape, attention: attend, device: dev });
                  const tps = 1 / s;
                  peerRuns.push(tps);
                  return tps;
                });
              } else {
                c.peer = { name: `torch — not run: ${decodeTorch as string}`, run: () => Number.NaN };
              }
              cases.push(c);
              // the fraction row: from the tok/s case's runs (the first, the warm-up, left out)
              const frac: GpuBenchCase = {
                case: peak === null ? `${fracName} — not run: no HBM peak known for ${device}` : fracName,
                metric: "HBM fraction",
                unit: "fraction",
                better: "higher",
                timed: false,
                ours: () =>
                  peak === null ? Number.NaN : (bytes * median(oursRuns.slice(1))) / peak.bytesPerSecond,
              };
              if (peak !== null && c.peer !== undefined) {
                frac.peer = {
                  name: `${c.peer.name} (bf16 bytes: ${((decodeParams(shape) * 2) / 1e9).toPrecision(3)} GB / token)`,
                  run: () => (decodeParams(shape) * 2 * median(peerRuns.slice(1))) / peak.bytesPerSecond,
                };
              }
              cases.push(frac);
            }
          }
        }
      }
      return cases;
    },

    teardown(): void {
      backends.close();
      for (const p of peers) p.close();
    },
  };
}

// ---------------------------------------------------------------------------------------------- decode

interface DecodeLayer {
  wq: Weight;
  wk: Weight;
  wv: Weight;
  wo: Weight;
  gate: Weight;
  up: Weight;
  down: Weight;
  /** f32 [1, kvheads, ctx, head_dim]. */
  k: Tensor;
  v: Tensor;
}

interface DecodeModel {
  layers: DecodeLayer[];
  head: Weight;
  /** f32 [1, hidden]: every matmul's input of width hidden. */
  x: Tensor;
}

/** Matmul weights of one token: per layer q, k, v, o, gate, up, down; and the LM head [vocab, hidden]. */
function decodeMatrices(s: DecodeShape): [string, number, number][] {
  const q = s.heads * s.head_dim;
  const kv = s.kvheads * s.head_dim;
  return [
    ["wq", q, s.hidden],
    ["wk", kv, s.hidden],
    ["wv", kv, s.hidden],
    ["wo", s.hidden, q],
    ["gate", s.intermediate, s.hidden],
    ["up", s.intermediate, s.hidden],
    ["down", s.hidden, s.intermediate],
  ];
}

/** Parameters read per token (all layers' matmuls and the LM head). */
export function decodeParams(s: DecodeShape): number {
  const layer = decodeMatrices(s).reduce((a, [, n, k]) => a + n * k, 0);
  return s.layers * layer + s.vocab * s.hidden;
}

/** Bytes of weights read per token in `format` (GGUF blocks: Q8_0 34 bytes, Q4_0 18 bytes per 32). */
export function decodeWeightBytes(s: DecodeShape, format: "q8_0" | "q4_0"): number {
  const layer = decodeMatrices(s).reduce((a, [, n, k]) => a + weightBytes(format, [n, k]), 0);
  return s.layers * layer + weightBytes(format, [s.vocab, s.hidden]);
}

function buildDecode(b: Backend, s: DecodeShape, format: DecodeFormat, maker: WeightMaker) {
  const weights: Weight[] = [];
  const tensors: Tensor[] = [];
  const kvData = randomF32(s.kvheads * s.ctx * s.head_dim, 1, 9);
  const layers: DecodeLayer[] = [];
  for (let l = 0; l < s.layers; l++) {
    const m: Record<string, Weight> = {};
    for (const [name, n, k] of decodeMatrices(s)) {
      const w = maker.make(`layers.${l}.${name}`, format, n, k, 0);
      m[name] = w;
      weights.push(w);
    }
    const k = b.upload(kvData, [1, s.kvheads, s.ctx, s.head_dim], "f32");
    const v = b.upload(kvData, [1, s.kvheads, s.ctx, s.head_dim], "f32");
    tensors.push(k, v);
    layers.push({ ...(m as unknown as Omit<DecodeLayer, "k" | "v">), k, v });
  }
  const head = maker.make("output", format, s.vocab, s.hidden, 0);
  weights.push(head);
  const x = b.upload(randomF32(s.hidden, 1, 10), [1, s.hidden], "f32");
  tensors.push(x);
  return { weights, tensors, model: { layers, head, x } };
}

/**
 * One token's weight-streaming work (see the module comment); its tensors are freed by the scope.
 * Without `attend` the o projection multiplies q's output (same shape) instead of attention's.
 */
function decodeToken(b: Backend, m: DecodeModel, s: DecodeShape, attend: boolean): void {
  b.scope(() => {
    for (const l of m.layers) {
      const q = b.matmul(m.x, l.wq); // [1, heads·head_dim]
      b.matmul(m.x, l.wk);
      b.matmul(m.x, l.wv);
      const o = attend
        ? b // [1, heads, 1, head_dim] → [1, heads·head_dim]
            .attention(q.reshape(1, 1, s.heads, s.head_dim).permute(0, 2, 1, 3), l.k, l.v)
            .reshape(1, s.heads * s.head_dim)
        : q;
      b.matmul(o, l.wo);
      b.matmul(b.swiglu(b.matmul(m.x, l.gate), b.matmul(m.x, l.up)), l.down);
    }
    b.matmul(m.x, m.head);
  });
}

export default gpuSuite({ tiny: process.env.TP_BENCH_GPU_TINY === "1" });
