/**
 * Deterministic random-weight checkpoints in the exact Krea 2 tensor layouts — a tiny SingleStreamDiT
 * and a tiny Wan 2.1 VAE — written with @tp/formats' safetensors writer. They exercise every code path
 * of the pipeline without a download (`bun run demo`, CLI tests); their images are coloured noise,
 * since the weights are random.
 *
 * Layouts: krea2.md §1.3 (DiT tensor map; ComfyUI comfy/ldm/krea2/model.py) and §5.3 (VAE; ComfyUI
 * comfy/ldm/wan/vae.py `Decoder3d`, `ResidualBlock`, `AttentionBlock`, `Resample`), the same names and
 * shapes as ../shared/testdata/krea2-tiny/checkpoints (checked by the tests when that folder exists).
 */
import { type TensorEntry, type TensorSource, writeSafetensors } from "@tp/formats";
import {
  type ProgressReporter,
  type QuantizeReport,
  quantizeCheckpoint,
  referenceQuantizer,
  type WeightQuantizer,
} from "@tp/quant";
import { encodeFromF32, TpError } from "@tp/tensor";
import { randn } from "../noise.ts";
import { uniform } from "./uniform.ts";

/** Sizes of a Krea 2 DiT to write (names as {@link Krea2Config}). */
export interface RandomKrea2Config {
  readonly features: number;
  readonly heads: number;
  readonly kvheads: number;
  readonly head_dim: number;
  readonly layers: number;
  readonly mlp_hidden: number;
  readonly tdim: number;
  readonly channels: number;
  readonly txtdim: number;
  readonly txtlayers: number;
  readonly txt_head_dim: number;
  readonly txt_mlp_hidden: number;
}

/**
 * The krea2-tiny test model's sizes (../shared/testdata/krea2-tiny README): features 256, 2 heads / 1
 * KV head of 128, 2 blocks, SwiGLU 768, text 12 taps × 80 with 20 heads of 4, text SwiGLU 256.
 */
export const TINY_KREA2_CONFIG: RandomKrea2Config = {
  features: 256,
  heads: 2,
  kvheads: 1,
  head_dim: 128,
  layers: 2,
  mlp_hidden: 768,
  tdim: 256,
  channels: 16,
  txtdim: 80,
  txtlayers: 12,
  txt_head_dim: 4,
  txt_mlp_hidden: 256,
};

/**
 * The real Krea 2 DiT's sizes (krea2.md §1.3, §3.1): features 6144, 48 heads / 12 KV heads of 128,
 * 28 blocks, SwiGLU 16384 (`round_up(int(2·6144/3)·4, 128)`), timestep embedding 256, 16 latent
 * channels, text 12 taps × 2560 with 20 heads of 128, text SwiGLU 6912. About 12.8 B parameters.
 */
export const KREA2_CONFIG: RandomKrea2Config = {
  features: 6144,
  heads: 48,
  kvheads: 12,
  head_dim: 128,
  layers: 28,
  mlp_hidden: 16384,
  tdim: 256,
  channels: 16,
  txtdim: 2560,
  txtlayers: 12,
  txt_head_dim: 128,
  txt_mlp_hidden: 6912,
};

/** Sizes of a Wan 2.1 VAE to write (ComfyUI `WanVAE` arguments). */
export interface RandomWanVaeConfig {
  /** Base width (96 in the real VAE). */
  readonly dim: number;
  readonly z_dim: number;
  readonly dim_mult: readonly number[];
  readonly num_res_blocks: number;
}

/** The krea2-tiny VAE's sizes: base width 4, z_dim 16, dim_mult [1, 2, 4, 4], 2 residual blocks. */
export const TINY_WAN_VAE_CONFIG: RandomWanVaeConfig = {
  dim: 4,
  z_dim: 16,
  dim_mult: [1, 2, 4, 4],
  num_res_blocks: 2,
};

/** What a parameter is, which decides its random initialization. */
type Init = "weight" | "bias" | "scale" | "gamma" | "mod";

/** A tensor to write: name, shape, init, and the fan-in of weights. */
interface Spec {
  readonly name: string;
  readonly shape: readonly number[];
  readonly init: Init;
}

/** Tensor names and shapes of a Krea 2 DiT (bare names, krea2.md §1.3). */
export function krea2TensorSpecs(c: RandomKrea2Config): { name: string; shape: number[] }[] {
  return krea2Specs(c).map(({ name, shape }) => ({ name, shape: [...shape] }));
}

function krea2Specs(c: RandomKrea2Config): Spec[] {
  const F = c.features;
  const out: Spec[] = [];
  const w = (name: string, n: number, k: number) => out.push({ name, shape: [n, k], init: "weight" });
  const lin = (name: string, n: number, k: number) => {
    w(`${name}.weight`, n, k);
    out.push({ name: `${name}.bias`, shape: [n], init: "bias" });
  };
  const vec = (name: string, n: number, init: Init = "scale") => out.push({ name, shape: [n], init });
  const block = (p: string, dim: number, hidden: number, heads: number, kv: number, hd: number) => {
    vec(`${p}.prenorm.scale`, dim);
    vec(`${p}.postnorm.scale`, dim);
    w(`${p}.attn.wq.weight`, heads * hd, dim);
    w(`${p}.attn.wk.weight`, kv * hd, dim);
    w(`${p}.attn.wv.weight`, kv * hd, dim);
    w(`${p}.attn.gate.weight`, heads * hd, dim);
    w(`${p}.attn.wo.weight`, dim, heads * hd);
    vec(`${p}.attn.qknorm.qnorm.scale`, hd);
    vec(`${p}.attn.qknorm.knorm.scale`, hd);
    w(`${p}.mlp.gate.weight`, hidden, dim);
    w(`${p}.mlp.up.weight`, hidden, dim);
    w(`${p}.mlp.down.weight`, dim, hidden);
  };
  const txtHeads = c.txtdim / c.txt_head_dim;
  lin("first", F, c.channels * 4);
  lin("tmlp.0", F, c.tdim);
  lin("tmlp.2", F, F);
  lin("tproj.1", 6 * F, F);
  for (const kind of ["layerwise_blocks", "refiner_blocks"]) {
    for (const i of [0, 1]) {
      block(`txtfusion.${kind}.${i}`, c.txtdim, c.txt_mlp_hidden, txtHeads, txtHeads, c.txt_head_dim);
    }
  }
  w("txtfusion.projector.weight", 1, c.txtlayers);
  vec("txtmlp.0.scale", c.txtdim);
  lin("txtmlp.1", F, c.txtdim);
  lin("txtmlp.3", F, F);
  for (let i = 0; i < c.layers; i++) {
    vec(`blocks.${i}.mod.lin`, 6 * F, "mod");
    block(`blocks.${i}`, F, c.mlp_hidden, c.heads, c.kvheads, c.head_dim);
  }
  vec("last.norm.scale", F);
  out.push({ name: "last.modulation.lin", shape: [2, F], init: "mod" });
  lin("last.linear", c.channels * 4, F);
  return out;
}

/** Tensor names and shapes of a Wan 2.1 VAE's decoder half plus `conv2` (krea2.md §5.3). */
export function wanVaeTensorSpecs(c: RandomWanVaeConfig): { name: string; shape: number[] }[] {
  return wanVaeSpecs(c).map(({ name, shape }) => ({ name, shape: [...shape] }));
}

function wanVaeSpecs(c: RandomWanVaeConfig): Spec[] {
  const out: Spec[] = [];
  const conv = (name: string, shape: number[]) => {
    out.push({ name: `${name}.weight`, shape, init: "weight" });
    out.push({ name: `${name}.bias`, shape: [shape[0] as number], init: "bias" });
  };
  const gamma = (name: string, ch: number, rank: number) =>
    out.push({ name, shape: [ch, ...Array<number>(rank).fill(1)], init: "gamma" });
  const res = (p: string, ci: number, co: number) => {
    gamma(`${p}.residual.0.gamma`, ci, 3);
    conv(`${p}.residual.2`, [co, ci, 3, 3, 3]);
    gamma(`${p}.residual.3.gamma`, co, 3);
    conv(`${p}.residual.6`, [co, co, 3, 3, 3]);
    if (ci !== co) conv(`${p}.shortcut`, [co, ci, 1, 1, 1]);
  };
  const m = c.dim_mult;
  // Decoder3d: dims = [dim·u for u in [dim_mult[-1]] + dim_mult[::-1]]
  const dims = [m[m.length - 1] as number, ...[...m].reverse()].map((u) => c.dim * u);
  const temporalUp = [false, true, true].slice(0, m.length - 1).reverse();
  const d0 = dims[0] as number;
  conv("conv2", [c.z_dim, c.z_dim, 1, 1, 1]);
  conv("decoder.conv1", [d0, c.z_dim, 3, 3, 3]);
  res("decoder.middle.0", d0, d0);
  gamma("decoder.middle.1.norm.gamma", d0, 2);
  conv("decoder.middle.1.to_qkv", [3 * d0, d0, 1, 1]);
  conv("decoder.middle.1.proj", [d0, d0, 1, 1]);
  res("decoder.middle.2", d0, d0);
  let idx = 0;
  let outDim = d0;
  for (let i = 0; i + 1 < dims.length; i++) {
    let inDim = dims[i] as number;
    outDim = dims[i + 1] as number;
    if (i >= 1 && i <= 3) inDim = Math.floor(inDim / 2);
    for (let r = 0; r < c.num_res_blocks + 1; r++) {
      res(`decoder.upsamples.${idx++}`, inDim, outDim);
      inDim = outDim;
    }
    if (i !== m.length - 1) {
      const p = `decoder.upsamples.${idx++}`;
      if (temporalUp[i]) conv(`${p}.time_conv`, [2 * outDim, outDim, 3, 1, 1]);
      conv(`${p}.resample.1`, [outDim / 2, outDim, 3, 3]);
    }
  }
  gamma("decoder.head.0.gamma", outDim, 3);
  conv("decoder.head.2", [3, outDim, 3, 3, 3]);
  return out;
}

/**
 * Random values for one tensor, seeded by (seed, index) so the file is the same on every machine:
 * weights N(0, 1/fan_in) (fan_in = all but the first dimension), biases and modulation offsets
 * N(0, 0.02²), zero-centred norm scales 0 (weight 1), VAE RMS-norm gammas 1.
 */
function values(spec: Spec, seed: number, index: number): Float32Array {
  const n = spec.shape.reduce((a, b) => a * b, 1);
  if (spec.init === "scale") return new Float32Array(n);
  if (spec.init === "gamma") return new Float32Array(n).fill(1);
  const v = randn(BigInt(seed) * 1_000_003n + BigInt(index), [n]);
  const fanIn = spec.shape.slice(1).reduce((a, b) => a * b, 1);
  const s = spec.init === "weight" ? 1 / Math.sqrt(fanIn) : 0.02;
  for (let i = 0; i < n; i++) v[i] = (v[i] as number) * s;
  return v;
}

function write(
  path: string,
  specs: readonly Spec[],
  dtype: "f32" | "bf16",
  seed: number,
  metadata: Record<string, string>,
): void {
  if (!Number.isSafeInteger(seed) || seed < 0) {
    throw new TpError("E_ARG", `seed must be a non-negative integer, got ${seed}`);
  }
  const tensors = specs.map((s, i) => {
    const v = values(s, seed, i);
    const data = dtype === "f32" ? new Uint8Array(v.buffer) : encodeFromF32(v, "bf16");
    return { name: s.name, dtype, shape: [...s.shape], data };
  });
  writeSafetensors(path, tensors, { metadata });
}

/**
 * Write a random-weight Krea 2 DiT (bare tensor names) that `loadKrea2` reads like a real one.
 * @param path   output `.safetensors` (written atomically)
 * @param config sizes (default {@link TINY_KREA2_CONFIG})
 * @param options `dtype` of every tensor (default bf16, like the official files), `seed` (default 0)
 * @throws TpError E_IO when the file cannot be written
 */
export function writeRandomKrea2Dit(
  path: string,
  config: RandomKrea2Config = TINY_KREA2_CONFIG,
  options: { dtype?: "f32" | "bf16"; seed?: number } = {},
): void {
  write(path, krea2Specs(config), options.dtype ?? "bf16", options.seed ?? 0, {
    description: "random weights in the Krea 2 DiT layout (TensorPencil demo); not a trained model",
    config: JSON.stringify(config),
  });
}

/**
 * Write a random-weight Wan 2.1 VAE (decoder half + conv2, f32) that `loadWanVae` reads like a real one.
 * @param path   output `.safetensors` (written atomically)
 * @param config sizes (default {@link TINY_WAN_VAE_CONFIG})
 * @param options `seed` (default 0)
 * @throws TpError E_IO when the file cannot be written
 */
export function writeRandomWanVae(
  path: string,
  config: RandomWanVaeConfig = TINY_WAN_VAE_CONFIG,
  options: { seed?: number } = {},
): void {
  write(path, wanVaeSpecs(config), "f32", options.seed ?? 0, {
    description: "random weights in the Wan 2.1 VAE layout (TensorPencil demo); not a trained model",
    config: JSON.stringify(config),
  });
}

/**
 * Fast uniform values ({@link uniform}) with the variance of {@link values}' normals: real-size
 * checkpoints hold ~13 B values, which torch-compatible `randn` would take an hour to draw. Same init
 * rules as {@link values}.
 */
function fastValues(spec: Spec, seed: number, index: number): Float32Array {
  const n = spec.shape.reduce((a, b) => a * b, 1);
  if (spec.init === "scale") return new Float32Array(n);
  if (spec.init === "gamma") return new Float32Array(n).fill(1);
  const fanIn = spec.shape.slice(1).reduce((a, b) => a * b, 1);
  return uniform(n, spec.init === "weight" ? 1 / Math.sqrt(fanIn) : 0.02, seed, index);
}

/** Formats {@link writeRandomKrea2DitQuantized} writes (@tp/quant's checkpoint formats). */
export type RandomKrea2QuantFormat = "fp8_scaled" | "int8_convrot" | "int4_convrot";

/** Options of {@link writeRandomKrea2DitQuantized}. */
export interface RandomKrea2QuantizedOptions {
  /** Format of the quantized linears. */
  readonly format: RandomKrea2QuantFormat;
  /**
   * The weight quantizer (default @tp/quant's TypeScript reference; pass `createNativeQuantizer()` of
   * @tp/backend-cpu for real sizes — the bytes are the same).
   */
  readonly quantizer?: WeightQuantizer;
  /** Seed of the values (default 0). */
  readonly seed?: number;
  /** Progress of the write (default: nothing). */
  readonly progress?: ProgressReporter;
}

/**
 * A checkpoint source whose tensors are drawn on demand ({@link fastValues}): the 8 linears of each block
 * as F32 (they are quantized next), everything else BF16 like the official files. Each `data()` call
 * draws the tensor again (deterministically); nothing is kept.
 */
function randomKrea2Source(config: RandomKrea2Config, seed: number): TensorSource {
  const specs = krea2Specs(config);
  const quantized =
    /^(?:blocks|txtfusion\.layerwise_blocks|txtfusion\.refiner_blocks)\.\d+\.(?:attn\.(?:wq|wk|wv|gate|wo)|mlp\.(?:gate|up|down))\.weight$/;
  const path = `(random Krea 2 DiT, seed ${seed})`;
  const entries = specs.map((s, i): TensorEntry & { index: number; spec: Spec } => {
    const f32 = quantized.test(s.name);
    const numel = s.shape.reduce((a, b) => a * b, 1);
    return {
      name: s.name,
      dtype: f32 ? "F32" : "BF16",
      format: f32 ? "f32" : "bf16",
      shape: s.shape,
      file: path,
      byteOffset: 0,
      byteLength: numel * (f32 ? 4 : 2),
      index: i,
      spec: s,
    };
  });
  const byName = new Map(entries.map((e) => [e.name, e]));
  const entry = (name: string) => {
    const e = byName.get(name);
    if (e === undefined) throw new TpError("E_FORMAT", `no tensor '${name}' in ${path}`, { tensor: name });
    return e;
  };
  return {
    kind: "safetensors",
    path,
    files: [],
    tensors: entries,
    has: (name) => byName.has(name),
    tensor: entry,
    data(name) {
      const e = entry(name);
      const v = fastValues(e.spec, seed, e.index);
      return e.dtype === "F32" ? new Uint8Array(v.buffer) : encodeFromF32(v, "bf16");
    },
    close() {},
    // read by quantizeCheckpoint and copied to the output's __metadata__
    metadata: new Map([
      ["description", "random weights in the Krea 2 DiT layout (TensorPencil bench); not a trained model"],
      ["config", JSON.stringify(config)],
      ["seed", String(seed)],
    ]),
  } as TensorSource;
}

/**
 * Write a random-weight Krea 2 DiT whose block linears are quantized like ComfyUI's files (bare names):
 * the 8 linears of every block and text-fusion block as fp8 e4m3fn with a per-tensor scale, INT8 or INT4
 * ConvRot (group 256), each with its `weight_scale` and `comfy_quant` marker; `first`, `tmlp`, `tproj`,
 * `txtmlp`, `last`, the projector, norms and `mod.lin` in BF16 (krea2.md §1.4). It is @tp/quant's
 * `quantizeCheckpoint` run over a float source drawn on the fly, so the file is what `bun apps/cli
 * quantize` would make of a float checkpoint with these values, and no float copy is ever written. With
 * {@link KREA2_CONFIG} the file is ≈ 12 GiB (fp8 / INT8); the values are uniform with the variance of
 * {@link writeRandomKrea2Dit}'s normals (fast to draw), not the same values.
 * @param path    output `.safetensors` (written to a temporary name and renamed)
 * @param config  sizes (e.g. {@link KREA2_CONFIG}); every block K must be a multiple of 256 for ConvRot
 * @param options format, quantizer, seed, progress
 * @returns @tp/quant's report (layers quantized, bytes, seconds)
 * @throws TpError E_SHAPE when a K is not a multiple of the rotation group (ConvRot); E_IO when the file
 *   cannot be written (nothing is left under `path`); E_ARG for a bad seed
 */
export function writeRandomKrea2DitQuantized(
  path: string,
  config: RandomKrea2Config,
  options: RandomKrea2QuantizedOptions,
): QuantizeReport {
  const seed = options.seed ?? 0;
  if (!Number.isSafeInteger(seed) || seed < 0) {
    throw new TpError("E_ARG", `seed must be a non-negative integer, got ${seed}`);
  }
  return quantizeCheckpoint(randomKrea2Source(config, seed), path, {
    format: options.format,
    quantizer: options.quantizer ?? referenceQuantizer,
    ...(options.progress ? { progress: options.progress } : {}),
  });
}

/**
 * Random conditioning `[1, seq, taps·dim]` f32, N(0, 1), seeded — a stand-in for a text encoder's
 * output when there is none (the demo).
 */
export function randomConditioning(
  seq: number,
  width: number,
  seed = 0,
): { data: Float32Array; shape: [number, number, number] } {
  return { data: randn(seed, [1, seq, width]), shape: [1, seq, width] };
}
