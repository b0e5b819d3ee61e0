/**
 * Krea 2's denoiser, ComfyUI's `SingleStreamDiT`: text fusion of 12 tapped Qwen3-VL layers
 * (layer-wise blocks → a 12 → 1 projector → refiner blocks → `txtmlp`), a timestep MLP with AdaLN-single
 * modulation, and single-stream blocks over `concat(text, image)` with GQA, per-head QK-norm, 3-axis
 * RoPE, a sigmoid output gate and SwiGLU MLPs. Written once against the `Backend` interface: this file
 * never reads tensor data on the host (inputs come up with `upload`, results go back with `read`).
 *
 * Sources: ../shared/spec/krea2.md §1.3 (tensor map), §1.4 (per-tensor formats), §3 (forward pass);
 * comfyanonymous/ComfyUI `comfy/ldm/krea2/model.py` (commit 08381b1a), `comfy/ldm/flux/layers.py`
 * (`timestep_embedding`, `EmbedND`), `comfy/ldm/flux/math.py` (`rope`, `apply_rope`),
 * `comfy/ldm/common_dit.py` (`pad_to_patch_size`, circular).
 */

import {
  checkTensorSet,
  type DetectedLayout,
  identifyCheckpoint,
  krea2DitTensorSet,
  loadWeight,
  openCheckpoint,
  type TensorSource,
} from "@tp/formats";
import { convRotFromWeight, dequantizeConvRot, dequantizeFp8 } from "@tp/quant";
import {
  type Backend,
  decodeToF32,
  isTpError,
  type RopeOptions,
  type Tensor,
  TpError,
  Weight,
} from "@tp/tensor";

// ---------------------------------------------------------------------------------------------------
// Config

/**
 * Hyper-parameters of a Krea 2 DiT, in the spelling of ComfyUI's `SingleStreamDiT.__init__`, all read
 * from tensor shapes (never assumed: the tiny test checkpoint has features 256, 2 blocks, …).
 */
export interface Krea2Config {
  /** Hidden width F (`first.weight` rows): 6144 in Krea 2. */
  readonly features: number;
  /** Sinusoidal timestep embedding width (`tmlp.0.weight` columns): 256. */
  readonly tdim: number;
  /** Width of one tapped text-encoder layer (`txtmlp.0.scale`): 2560. */
  readonly txtdim: number;
  /** Number of tapped layers (`txtfusion.projector.weight` columns): 12. */
  readonly txtlayers: number;
  /** Query heads of the image blocks (`wq` rows / head_dim; ComfyUI infers rows / 128): 48. */
  readonly heads: number;
  /** Key/value heads (`wk` rows / head_dim): 12. */
  readonly kvheads: number;
  /** Per-head width of the image blocks (`qknorm.qnorm.scale` length): 128. */
  readonly head_dim: number;
  /** SwiGLU inner width of the image blocks (`mlp.gate.weight` rows): 16384. */
  readonly mlp_hidden: number;
  /** Number of single-stream blocks: 28. */
  readonly layers: number;
  /** Patch size: 2 (ComfyUI's constant; not stored in the file). */
  readonly patch: number;
  /** Latent channels (`first.weight` columns / patch²): 16. */
  readonly channels: number;
  /** RoPE base: 1000 (ComfyUI's constant, `int(theta)`). */
  readonly theta: number;
  /** RoPE axis widths in elements, `[hd − 12·(hd/16), 6·(hd/16), 6·(hd/16)]` = [32, 48, 48]. */
  readonly axes_dim: readonly [number, number, number];
  /** Text-fusion query heads (txtdim / text head_dim): 20. */
  readonly txtheads: number;
  /** Text-fusion key/value heads: 20. */
  readonly txtkvheads: number;
  /** Text-fusion per-head width (its `qknorm.qnorm.scale` length): 128 (4 in the tiny file). */
  readonly txt_head_dim: number;
  /** Text-fusion SwiGLU inner width: 6912. */
  readonly txt_mlp_hidden: number;
  /** RMSNorm epsilon of every norm (weights `1 + scale`): 1e-5. */
  readonly eps: number;
}

/** ComfyUI's constants of the architecture that the file does not store (krea2.md §3.1). */
const PATCH = 2;
const THETA = 1000;
const RMS_EPS = 1e-5;
/** Flux `timestep_embedding`: max_period 10000, time_factor 1000 (krea2.md §3.4). */
const MAX_PERIOD = 10000;
const TIME_FACTOR = 1000;

/** The tensor-name prefix of ComfyUI-native files (krea2.md §1.3). */
export const KREA2_COMFY_PREFIX = "model.diffusion_model.";

/**
 * RoPE axis widths for a head width, as ComfyUI computes them (`SingleStreamDiT.__init__`):
 * `[hd − 12·⌊hd/16⌋, 6·⌊hd/16⌋, 6·⌊hd/16⌋]`, e.g. 128 → [32, 48, 48].
 * @throws TpError E_FORMAT when the widths are not positive and even
 */
export function krea2AxesDim(headDim: number): [number, number, number] {
  const u = Math.floor(headDim / 16);
  const axes: [number, number, number] = [headDim - 12 * u, 6 * u, 6 * u];
  if (axes.some((a) => a <= 0 || a % 2 !== 0)) {
    throw new TpError(
      "E_FORMAT",
      `Krea 2 head_dim ${headDim} gives RoPE axes [${axes}], not even and positive`,
    );
  }
  return axes;
}

/**
 * Read a Krea 2 DiT's hyper-parameters from its tensor shapes (ComfyUI infers them the same way).
 * @param src    an opened checkpoint
 * @param prefix "" (bare names) or {@link KREA2_COMFY_PREFIX}
 * @throws TpError E_FORMAT naming the tensor when one is missing or shapes disagree
 * Source: krea2.md §1.3, §3.1; ComfyUI comfy/ldm/krea2/model.py `SingleStreamDiT.__init__`.
 */
export function readKrea2Config(src: TensorSource, prefix: string): Krea2Config {
  const shape = (name: string): readonly number[] => src.tensor(prefix + name).shape;
  const dim = (name: string, i: number): number => {
    const d = shape(name)[i];
    if (d === undefined) throw bad(src, prefix + name, `has shape [${shape(name)}], expected rank > ${i}`);
    return d;
  };
  const features = dim("first.weight", 0);
  const patchIn = dim("first.weight", 1);
  if (patchIn % (PATCH * PATCH) !== 0) {
    throw bad(src, `${prefix}first.weight`, `has ${patchIn} inputs, not channels × ${PATCH}²`);
  }
  const channels = patchIn / (PATCH * PATCH);
  let layers = 0;
  while (src.has(`${prefix}blocks.${layers}.mod.lin`)) layers++;
  if (layers === 0) throw bad(src, `${prefix}blocks.0.mod.lin`, "is missing: no single-stream blocks");
  const head_dim = dim("blocks.0.attn.qknorm.qnorm.scale", 0);
  const heads = dim("blocks.0.attn.wq.weight", 0) / head_dim;
  const kvheads = dim("blocks.0.attn.wk.weight", 0) / head_dim;
  const txtdim = dim("txtmlp.0.scale", 0);
  const txt_head_dim = dim("txtfusion.layerwise_blocks.0.attn.qknorm.qnorm.scale", 0);
  const txtheads = dim("txtfusion.layerwise_blocks.0.attn.wq.weight", 0) / txt_head_dim;
  const txtkvheads = dim("txtfusion.layerwise_blocks.0.attn.wk.weight", 0) / txt_head_dim;
  const cfg: Krea2Config = {
    features,
    tdim: dim("tmlp.0.weight", 1),
    txtdim,
    txtlayers: dim("txtfusion.projector.weight", 1),
    heads,
    kvheads,
    head_dim,
    mlp_hidden: dim("blocks.0.mlp.gate.weight", 0),
    layers,
    patch: PATCH,
    channels,
    theta: THETA,
    axes_dim: krea2AxesDim(head_dim),
    txtheads,
    txtkvheads,
    txt_head_dim,
    txt_mlp_hidden: dim("txtfusion.layerwise_blocks.0.mlp.gate.weight", 0),
    eps: RMS_EPS,
  };
  for (const [what, v] of [
    ["heads", heads],
    ["kvheads", kvheads],
    ["txtheads", txtheads],
    ["txtkvheads", txtkvheads],
  ] as const) {
    if (!Number.isInteger(v) || v < 1) {
      throw bad(src, `${prefix}blocks.0.attn`, `${what} = ${v} is not a whole number of heads`);
    }
  }
  if (heads % kvheads !== 0 || txtheads % txtkvheads !== 0) {
    throw bad(src, `${prefix}blocks.0.attn.wk.weight`, `query heads are not a multiple of KV heads`);
  }
  if (heads * head_dim !== features || txtheads * txt_head_dim !== txtdim) {
    throw bad(src, `${prefix}blocks.0.attn.wq.weight`, "query width differs from the hidden width");
  }
  if (dim("last.linear.weight", 0) !== patchIn) {
    throw bad(
      src,
      `${prefix}last.linear.weight`,
      `has ${dim("last.linear.weight", 0)} rows, expected ${patchIn}`,
    );
  }
  return cfg;
}

function bad(src: TensorSource, tensor: string, what: string): TpError {
  return new TpError("E_FORMAT", `Krea 2 DiT tensor ${tensor} ${what}`, { file: src.path, tensor });
}

// ---------------------------------------------------------------------------------------------------
// Loading

/**
 * How linears are computed (krea2-tiny README, "DiT outputs"):
 * - `native`: every weight in its file format; the backend's matmul decides the arithmetic (on
 *   @tp/backend-cpu: bf16 / fp8 weights with x rounded to bf16, f32 sums; INT8 / INT4 ConvRot
 *   activation-quantized, W8A8 / W4A4). No weight is copied. The mode for real checkpoints.
 * - `upcast`: float weights (bf16, f16, fp8 raw or scaled) decoded to f32 at load, f32 compute;
 *   ConvRot weights stay integer and run activation-quantized (W8A8 / W4A4). This is ComfyUI on the
 *   CPU in fp32: goldens `bf16ref`, `fp8_e4m3fn_manualcast`, `fp8_scaled_dequant`,
 *   `int8_convrot_w8a8`, `int4_convrot_w4a4`.
 * - `dequant`: every linear, ConvRot included, dequantized to f32 at load (weight-only): goldens
 *   `int8_convrot_dequant`, `int4_convrot_dequant` (and the float ones, like `upcast`).
 * `upcast` and `dequant` hold f32 copies of the weights they expand in host memory (4 bytes per
 * parameter): meant for reference runs and tests, not for 12 GiB checkpoints.
 */
export type Krea2Mode = "native" | "upcast" | "dequant";

/** The modes of {@link Krea2Mode}, for messages. */
export const KREA2_MODES: readonly Krea2Mode[] = ["native", "upcast", "dequant"];

/** Options of {@link loadKrea2}. */
export interface LoadKrea2Options {
  /** The backend the model runs on. */
  readonly backend: Backend;
  /** Weight handling; default `native`. */
  readonly mode?: Krea2Mode;
}

/** A linear layer: weight [N, K] and optional f32 bias [N] on the backend. */
interface Linear {
  readonly weight: Weight;
  readonly bias?: Tensor;
}

/** Weights of the gated GQA attention (ComfyUI `Attention`). */
interface AttentionParams {
  readonly wq: Weight;
  readonly wk: Weight;
  readonly wv: Weight;
  readonly gate: Weight;
  readonly wo: Weight;
  /** Zero-centred RMSNorm scales [head_dim] of q and k. */
  readonly qnorm: Tensor;
  readonly knorm: Tensor;
  readonly heads: number;
  readonly kvheads: number;
  readonly headDim: number;
}

/** Weights of a SwiGLU MLP: down(silu(gate(x)) ⊙ up(x)). */
interface MlpParams {
  readonly gate: Weight;
  readonly up: Weight;
  readonly down: Weight;
}

/** A text-fusion block (ComfyUI `TextFusionBlock`), also the body of a single-stream block. */
interface TextBlockParams {
  readonly prenorm: Tensor;
  readonly postnorm: Tensor;
  readonly attn: AttentionParams;
  readonly mlp: MlpParams;
}

/** A single-stream block: a text block plus its learned modulation offset `mod.lin` [6F]. */
interface BlockParams extends TextBlockParams {
  readonly mod: Tensor;
}

/** Everything the forward pass uses. */
interface Krea2Params {
  readonly first: Linear;
  readonly tmlp0: Linear;
  readonly tmlp2: Linear;
  readonly tproj1: Linear;
  readonly layerwise: readonly TextBlockParams[];
  readonly projector: Weight;
  readonly refiner: readonly TextBlockParams[];
  readonly txtmlpNorm: Tensor;
  readonly txtmlp1: Linear;
  readonly txtmlp3: Linear;
  readonly blocks: readonly BlockParams[];
  readonly lastNorm: Tensor;
  /** `last.modulation.lin` [2, F]: row 0 scale offset, row 1 shift offset. */
  readonly lastModulation: Tensor;
  readonly last: Linear;
}

/** f32 values of a weight of any format (weight-only dequantization, krea2.md §1.5–1.8). */
function dequantizeToF32(w: Weight): Float32Array {
  switch (w.format) {
    case "f32": {
      const copy = w.data.slice(); // the mapping need not be 4-aligned
      return new Float32Array(copy.buffer, 0, copy.byteLength / 4);
    }
    case "f16":
    case "bf16":
      if (w.scale !== undefined) break;
      return decodeToF32(w.data, w.format);
    case "f8_e4m3fn":
    case "f8_e5m2":
      if (w.scale !== undefined && w.scale.kind !== "tensor") break;
      return dequantizeFp8(w.data, w.format, w.scale?.value);
    case "int8_convrot":
    case "int4_convrot":
      return dequantizeConvRot(convRotFromWeight(w), w.name);
    default:
      break;
  }
  throw new TpError(
    "E_UNSUPPORTED",
    `Krea 2 cannot dequantize weight format ${w.format}${w.scale ? ` with a ${w.scale.kind} scale` : ""}`,
    { tensor: w.name, ...(w.source ? { file: w.source.file } : {}) },
  );
}

/** A host f32 weight [N, K] (the `upcast` / `dequant` modes). */
function f32Weight(w: Weight, values: Float32Array): Weight {
  return new Weight({
    name: w.name,
    format: "f32",
    shape: [w.n, w.k],
    data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength),
  });
}

/** Builds the parameter tree from a checkpoint, tracking uploaded tensors for `dispose`. */
class ParamLoader {
  readonly uploaded: Tensor[] = [];

  constructor(
    readonly src: TensorSource,
    readonly prefix: string,
    readonly backend: Backend,
    readonly mode: Krea2Mode,
  ) {}

  /** A matmul weight, prepared for the mode. `expectedK` tells packed INT4 [N, K/2] from INT8. */
  weight(name: string, expectedK: number): Weight {
    const w = loadWeight(this.src, this.prefix + name, expectedK);
    if (w.k !== expectedK) {
      throw bad(this.src, this.prefix + name, `has ${w.k} input features, expected ${expectedK}`);
    }
    const convrot = w.format === "int8_convrot" || w.format === "int4_convrot";
    if (this.mode === "native" || (this.mode === "upcast" && (convrot || w.format === "f32"))) return w;
    return f32Weight(w, dequantizeToF32(w));
  }

  /** A non-matmul parameter (norm scale, bias, modulation offset) as an f32 tensor of `shape`. */
  vector(name: string, shape: readonly number[]): Tensor {
    const full = this.prefix + name;
    const stored = this.src.tensor(full).shape;
    const count = shape.reduce((a, b) => a * b, 1);
    if (stored.reduce((a, b) => a * b, 1) !== count) {
      throw bad(this.src, full, `has shape [${stored}], expected [${shape}]`);
    }
    const values = dequantizeToF32(loadWeight(this.src, full));
    const t = this.backend.upload(values, shape, "f32", full);
    this.uploaded.push(t);
    return t;
  }

  linear(name: string, k: number, n: number, bias: boolean): Linear {
    const weight = this.weight(`${name}.weight`, k);
    if (weight.n !== n)
      throw bad(this.src, `${this.prefix}${name}.weight`, `has ${weight.n} rows, expected ${n}`);
    return bias ? { weight, bias: this.vector(`${name}.bias`, [n]) } : { weight };
  }

  attention(p: string, dim: number, heads: number, kvheads: number, headDim: number): AttentionParams {
    return {
      wq: this.linear(`${p}.wq`, dim, heads * headDim, false).weight,
      wk: this.linear(`${p}.wk`, dim, kvheads * headDim, false).weight,
      wv: this.linear(`${p}.wv`, dim, kvheads * headDim, false).weight,
      gate: this.linear(`${p}.gate`, dim, heads * headDim, false).weight,
      wo: this.linear(`${p}.wo`, heads * headDim, dim, false).weight,
      qnorm: this.vector(`${p}.qknorm.qnorm.scale`, [headDim]),
      knorm: this.vector(`${p}.qknorm.knorm.scale`, [headDim]),
      heads,
      kvheads,
      headDim,
    };
  }

  textBlock(
    p: string,
    dim: number,
    hidden: number,
    heads: number,
    kvheads: number,
    hd: number,
  ): TextBlockParams {
    return {
      prenorm: this.vector(`${p}.prenorm.scale`, [dim]),
      postnorm: this.vector(`${p}.postnorm.scale`, [dim]),
      attn: this.attention(`${p}.attn`, dim, heads, kvheads, hd),
      mlp: {
        gate: this.linear(`${p}.mlp.gate`, dim, hidden, false).weight,
        up: this.linear(`${p}.mlp.up`, dim, hidden, false).weight,
        down: this.linear(`${p}.mlp.down`, hidden, dim, false).weight,
      },
    };
  }

  params(c: Krea2Config): Krea2Params {
    const F = c.features;
    const txtBlock = (p: string) =>
      this.textBlock(p, c.txtdim, c.txt_mlp_hidden, c.txtheads, c.txtkvheads, c.txt_head_dim);
    return {
      first: this.linear("first", c.channels * c.patch * c.patch, F, true),
      tmlp0: this.linear("tmlp.0", c.tdim, F, true),
      tmlp2: this.linear("tmlp.2", F, F, true),
      tproj1: this.linear("tproj.1", F, 6 * F, true),
      layerwise: [0, 1].map((i) => txtBlock(`txtfusion.layerwise_blocks.${i}`)),
      projector: this.linear("txtfusion.projector", c.txtlayers, 1, false).weight,
      refiner: [0, 1].map((i) => txtBlock(`txtfusion.refiner_blocks.${i}`)),
      txtmlpNorm: this.vector("txtmlp.0.scale", [c.txtdim]),
      txtmlp1: this.linear("txtmlp.1", c.txtdim, F, true),
      txtmlp3: this.linear("txtmlp.3", F, F, true),
      blocks: Array.from({ length: c.layers }, (_, i) => ({
        ...this.textBlock(`blocks.${i}`, F, c.mlp_hidden, c.heads, c.kvheads, c.head_dim),
        mod: this.vector(`blocks.${i}.mod.lin`, [6 * F]),
      })),
      lastNorm: this.vector("last.norm.scale", [F]),
      lastModulation: this.vector("last.modulation.lin", [2, F]),
      last: this.linear("last.linear", F, c.patch * c.patch * c.channels, true),
    };
  }
}

/**
 * The layout of a Krea 2 DiT file and the tensors it holds that the model does not read, after
 * checking its complete tensor set (@tp/formats krea2DitTensorSet) — or E_FORMAT saying what the file
 * is instead, or which tensor is missing.
 */
function identifyKrea2(
  src: TensorSource,
  path: string,
): { layout: DetectedLayout; unexpected: readonly string[] } {
  let layout: DetectedLayout;
  try {
    layout = identifyCheckpoint(src);
  } catch (e) {
    if (isTpError(e)) {
      throw new TpError("E_FORMAT", `${path} is not a Krea 2 DiT: ${e.message}`, { file: path, cause: e });
    }
    throw e;
  }
  if (layout.kind !== "krea2-dit") {
    throw new TpError(
      "E_FORMAT",
      `${path} is not a Krea 2 DiT (no blocks.0.mod.lin + txtfusion.projector.weight): it looks like a ${layout.description} (${layout.kind}); pass it where that component goes`,
      { file: path },
    );
  }
  const { unexpected } = checkTensorSet(src, krea2DitTensorSet(src, layout.prefix ?? ""));
  return { layout, unexpected };
}

/**
 * A Krea 2 DiT file's hyper-parameters from its tensor shapes alone (headers only, no weights read) —
 * e.g. to check a text encoder's conditioning width against `txtlayers × txtdim` before encoding.
 * @throws TpError E_IO for a missing or unreadable file; E_FORMAT as {@link loadKrea2}
 */
export function readKrea2DitConfig(path: string): Krea2Config {
  const src = openCheckpoint(path);
  try {
    return readKrea2Config(src, identifyKrea2(src, path).layout.prefix ?? "");
  } finally {
    src.close();
  }
}

/**
 * Open a Krea 2 DiT checkpoint (bare names or `model.diffusion_model.`-prefixed; bf16, fp8 raw, fp8
 * scaled, INT8 / INT4 ConvRot with any per-layer rotation group, decided per tensor by @tp/formats) and
 * bind it to a backend. Matmul weights stay views on the memory mapping in `native` mode; norms, biases
 * and modulation offsets (a few per block) are uploaded as f32.
 * @param path a `.safetensors` file (or a sharded index)
 * @param options backend, and {@link Krea2Mode} (default `native`)
 * @returns the model; call `dispose()` to free its tensors and close the file
 * @throws TpError E_IO for a missing or unreadable file; E_FORMAT when the file is not a Krea 2 DiT
 *   (saying what it looks like, e.g. a VAE or a text encoder), a tensor is missing or shapes disagree;
 *   E_UNSUPPORTED for a weight format the mode cannot handle; E_ARG for an unknown mode
 * Source: krea2.md §1.1–1.4; ComfyUI comfy/ldm/krea2/model.py.
 */
export function loadKrea2(path: string, options: LoadKrea2Options): Krea2Dit {
  const mode = options.mode ?? "native";
  if (!KREA2_MODES.includes(mode)) {
    throw new TpError("E_ARG", `unknown Krea 2 mode '${mode}'; expected one of: ${KREA2_MODES.join(", ")}`);
  }
  const src = openCheckpoint(path);
  try {
    const { layout, unexpected } = identifyKrea2(src, path);
    const prefix = layout.prefix ?? "";
    const config = readKrea2Config(src, prefix);
    const loader = new ParamLoader(src, prefix, options.backend, mode);
    // A throw while loading frees every upload made so far; what loads is the model's until dispose.
    const params = options.backend.scope(() => loader.params(config));
    options.backend.persist(loader.uploaded);
    return new Krea2Dit(options.backend, config, params, mode, layout, src, loader.uploaded, unexpected);
  } catch (e) {
    src.close();
    throw e;
  }
}

// ---------------------------------------------------------------------------------------------------
// Small helpers: host-side inputs

/**
 * Flux's sinusoidal timestep embedding of `sigmas` in f32 on the host: `s = 1000·σ`,
 * `f_i = exp(−ln(10000)·i / (dim/2))`, `e = [cos(s·f), sin(s·f)]` (cosines first).
 * @param sigmas one σ ∈ [0, 1] per batch row (ComfyUI passes σ as the "timestep")
 * @param dim    embedding width (`tdim`, 256), even
 * @returns Float32Array [sigmas.length, dim]
 * Source: krea2.md §3.4; ComfyUI comfy/ldm/flux/layers.py `timestep_embedding`.
 */
export function krea2TimestepEmbedding(sigmas: readonly number[], dim: number): Float32Array {
  const half = dim / 2;
  const out = new Float32Array(sigmas.length * dim);
  const negLog = Math.fround(-Math.log(MAX_PERIOD));
  for (let b = 0; b < sigmas.length; b++) {
    const s = Math.fround(Math.fround(sigmas[b] as number) * TIME_FACTOR);
    for (let i = 0; i < half; i++) {
      const f = Math.fround(Math.exp(Math.fround(Math.fround(negLog * i) / half)));
      const arg = Math.fround(s * f);
      out[b * dim + i] = Math.cos(arg);
      out[b * dim + half + i] = Math.sin(arg);
    }
  }
  return out;
}

/**
 * 3-axis RoPE positions of the joint sequence: `txtLen` text tokens at (0, 0, 0), then the image
 * tokens (r, c) of an h × w patch grid, row-major, at (0, r, c).
 * @returns Int32Array [3, txtLen + h·w] (axis-major, as `Backend.rope` takes multi-axis positions)
 * Source: krea2.md §3.2 step 7; ComfyUI `SingleStreamDiT._forward` (`txtpos`, `imgids`).
 */
export function krea2Positions(txtLen: number, h: number, w: number): Int32Array {
  const L = txtLen + h * w;
  const pos = new Int32Array(3 * L);
  for (let r = 0; r < h; r++) {
    for (let c = 0; c < w; c++) {
      const i = txtLen + r * w + c;
      pos[L + i] = r;
      pos[2 * L + i] = c;
    }
  }
  return pos;
}

/**
 * The `Backend.rope` options of Krea 2's 3-axis RoPE: interleaved pairs (2p, 2p+1), theta 1000,
 * sections of [16, 24, 24] pairs for head_dim 128, each axis with its own table
 * `θ = pos · theta^(−2k/axis_dim)`.
 * Source: krea2.md §3.5; ComfyUI comfy/ldm/flux/math.py `rope`, `apply_rope`.
 */
export function krea2RopeOptions(config: Pick<Krea2Config, "axes_dim" | "theta" | "head_dim">): RopeOptions {
  return {
    mode: "interleaved",
    theta: config.theta,
    ropeDims: config.head_dim,
    sections: config.axes_dim.map((d) => d / 2),
  };
}

// ---------------------------------------------------------------------------------------------------
// The network, top to bottom (krea2.md §3.2–3.6)

/** Copies of module outputs made inside a scope, for {@link Krea2ForwardOptions.capture}. */
type Captured = [Krea2Intermediate, Tensor][];

interface Rope {
  /** i32 [3, L]. */
  readonly positions: Tensor;
  readonly options: RopeOptions;
}

/** y = x·Wᵀ + b. */
function linear(b: Backend, x: Tensor, l: Linear): Tensor {
  return b.matmul(x, l.weight, l.bias ? { bias: l.bias } : {});
}

/**
 * Gated GQA attention (ComfyUI `Attention.forward`; krea2.md §3.3 "Attn"). x: [B, L, D] → [B, L, D].
 */
function attention(b: Backend, x: Tensor, p: AttentionParams, eps: number, rope?: Rope): Tensor {
  const [B, L] = x.shape as [number, number, number];
  return b.scope(() => {
    const norm = { eps, unitOffset: true };
    // [B, L, heads, head_dim]; per-head RMSNorm (1 + scale), then RoPE on q and k
    let q = b.rmsNorm(b.matmul(x, p.wq).reshape(B, L, p.heads, p.headDim), p.qnorm, norm);
    let k = b.rmsNorm(b.matmul(x, p.wk).reshape(B, L, p.kvheads, p.headDim), p.knorm, norm);
    const v = b.matmul(x, p.wv).reshape(B, L, p.kvheads, p.headDim);
    const gate = b.matmul(x, p.gate); // [B, L, heads·head_dim]
    if (rope) {
      q = b.rope(q, rope.positions, rope.options);
      k = b.rope(k, rope.positions, rope.options);
    }
    // [B, heads, L, head_dim]; query head h uses KV head ⌊h / (heads / kvheads)⌋ (repeat_interleave)
    const o = b.attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3));
    // heads concatenated head-major: [B, L, heads·head_dim]
    const merged = b.copy(o.permute(0, 2, 1, 3)).reshape(B, L, p.heads * p.headDim);
    const gated = b.mul(merged, b.sigmoid(gate));
    return b.matmul(gated, p.wo);
  });
}

/** SwiGLU: down(silu(gate(x)) ⊙ up(x)) (ComfyUI `SwiGLU`). x: [..., D] → [..., D]. */
function mlp(b: Backend, x: Tensor, p: MlpParams): Tensor {
  return b.scope(() => b.matmul(b.swiglu(b.matmul(x, p.gate), b.matmul(x, p.up)), p.down));
}

/**
 * Text-fusion block (ComfyUI `TextFusionBlock`; krea2.md §3.6): no RoPE, no mask.
 * x += Attn(rmsnorm(x)·(1+prenorm)); x += MLP(rmsnorm(x)·(1+postnorm)). x: [B, L, D] → [B, L, D].
 */
function textBlock(b: Backend, x: Tensor, p: TextBlockParams, eps: number): Tensor {
  return b.scope(() => {
    const norm = { eps, unitOffset: true };
    const h = b.add(x, attention(b, b.rmsNorm(x, p.prenorm, norm), p.attn, eps));
    return b.add(h, mlp(b, b.rmsNorm(h, p.postnorm, norm), p.mlp));
  });
}

/**
 * Single-stream block (ComfyUI `SingleStreamBlock`; krea2.md §3.3). x: [B, L, F]; tvec: [B, 1, 6F].
 * m = tvec + mod.lin → prescale, preshift, pregate, postscale, postshift, postgate;
 * x += pregate ⊙ Attn((1+prescale)·norm(x) + preshift); x += postgate ⊙ MLP((1+postscale)·norm(x) + postshift).
 */
function singleStreamBlock(
  b: Backend,
  x: Tensor,
  tvec: Tensor,
  p: BlockParams,
  eps: number,
  rope: Rope,
): Tensor {
  const F = x.shape[2] as number;
  return b.scope(() => {
    const norm = { eps, unitOffset: true };
    const m = b.add(tvec, p.mod); // [B, 1, 6F]
    const [prescale, preshift, pregate, postscale, postshift, postgate] = [0, 1, 2, 3, 4, 5].map((i) =>
      m.slice(2, i * F, (i + 1) * F),
    ) as [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor];
    const a = b.modulate(b.rmsNorm(x, p.prenorm, norm), prescale, preshift);
    const h = b.add(x, b.mul(pregate, attention(b, a, p.attn, eps, rope)));
    const c = b.modulate(b.rmsNorm(h, p.postnorm, norm), postscale, postshift);
    return b.add(h, b.mul(postgate, mlp(b, c, p.mlp)));
  });
}

/** The parameters of one single-stream block (attention, SwiGLU MLP, norms, `mod.lin`), for {@link krea2SingleStreamBlock}. */
export type Krea2BlockParams = BlockParams;

/** The 3-axis RoPE of a joint sequence: i32 positions [3, L] ({@link krea2Positions}) and {@link krea2RopeOptions}. */
export type Krea2Rope = Rope;

/**
 * One Krea 2 single-stream block on its own (ComfyUI `SingleStreamBlock`; krea2.md §3.3), the block
 * {@link Krea2Dit.forward} runs 28 times — for measuring a block with weights built in memory (the
 * GPU bench) without a 12 GiB checkpoint.
 * @param x    f32 [B, L, F] joint sequence (text rows first)
 * @param tvec f32 [B, 1, 6F] the AdaLN-single vector (`tproj` output)
 * @param p    the block's weights: matmul weights in any format the backend supports, f32 vectors
 * @param eps  RMSNorm epsilon (1e-5)
 * @param rope positions [3, L] and options
 * @returns f32 [B, L, F], owned by the caller
 */
export function krea2SingleStreamBlock(
  b: Backend,
  x: Tensor,
  tvec: Tensor,
  p: Krea2BlockParams,
  eps: number,
  rope: Krea2Rope,
): Tensor {
  return singleStreamBlock(b, x, tvec, p, eps, rope);
}

/** Module outputs {@link Krea2Dit.forward} can hand out (the names of the krea2-tiny intermediates). */
export type Krea2Intermediate =
  | "first"
  | "tmlp"
  | "tproj"
  | "txtfusion"
  | "txtmlp"
  | `block${number}`
  | "last";

/** Options of {@link Krea2Dit.forward}. */
export interface Krea2ForwardOptions {
  /**
   * Called with a copy of each module's output, which the callee owns (and must free): `first`
   * [B, h·w, F], `tmlp` [B, 1, F], `tproj` [B, 1, 6F], `txtfusion` [B, S, txtdim], `txtmlp` [B, S, F],
   * `block<i>` [B, S + h·w, F], `last` [B, h·w, patch²·channels] (image rows only).
   * `txtfusion` and `txtmlp` come only when `forward` runs the text side (no `txt` given).
   */
  readonly capture?: (name: Krea2Intermediate, t: Tensor) => void;
  /** Text conditioning already through {@link Krea2Dit.encodeText} ([B, S, F]); `context` is then ignored. */
  readonly txt?: Tensor;
}

/**
 * A loaded Krea 2 DiT bound to a backend (see {@link loadKrea2}).
 */
export class Krea2Dit implements Disposable {
  /** @internal use {@link loadKrea2}. */
  constructor(
    /** The backend every tensor lives on. */
    readonly backend: Backend,
    /** Hyper-parameters read from the file. */
    readonly config: Krea2Config,
    private readonly params: Krea2Params,
    /** How linears are computed. */
    readonly mode: Krea2Mode,
    /** What the file is (variant, prefix, description). */
    readonly layout: DetectedLayout,
    private readonly src: TensorSource,
    private readonly uploaded: readonly Tensor[],
    /** Tensors of the file the model does not read (for a warning; see @tp/formats checkTensorSet). */
    readonly unexpected: readonly string[] = [],
  ) {}

  #disposed = false;

  /** The checkpoint the weights came from (for the reason of a non-finite step). */
  get file(): string {
    return this.src.path;
  }

  /**
   * The matmul weight the model uses for a checkpoint linear (bare name, e.g.
   * `blocks.0.mlp.down.weight`), as prepared for the mode.
   * @throws TpError E_ARG for a name that is not a linear of this model
   */
  weight(name: string): Weight {
    const all = this.linears();
    const w = all.get(name);
    if (w === undefined) {
      throw new TpError(
        "E_ARG",
        `Krea 2 has no linear '${name}'; e.g. ${[...all.keys()].slice(0, 4).join(", ")}`,
      );
    }
    return w;
  }

  /**
   * The matmul weights of one {@link forward} with precomputed `txt` (a sampling step), in order of use:
   * `first`, `tmlp.*`, `tproj.1`, the blocks, `last.linear` (the text side runs once per prompt).
   */
  samplingWeights(): { readonly name: string; readonly weight: Weight }[] {
    return [...this.linears()]
      .filter(([name]) => !name.startsWith("txtfusion.") && !name.startsWith("txtmlp."))
      .map(([name, weight]) => ({ name, weight }));
  }

  private linears(): Map<string, Weight> {
    const p = this.params;
    const m = new Map<string, Weight>();
    const add = (name: string, w: Weight): void => {
      m.set(`${name}.weight`, w);
    };
    const block = (name: string, q: TextBlockParams): void => {
      for (const k of ["wq", "wk", "wv", "gate", "wo"] as const) add(`${name}.attn.${k}`, q.attn[k]);
      for (const k of ["gate", "up", "down"] as const) add(`${name}.mlp.${k}`, q.mlp[k]);
    };
    add("first", p.first.weight);
    add("tmlp.0", p.tmlp0.weight);
    add("tmlp.2", p.tmlp2.weight);
    add("tproj.1", p.tproj1.weight);
    for (const [i, q] of p.layerwise.entries()) block(`txtfusion.layerwise_blocks.${i}`, q);
    add("txtfusion.projector", p.projector);
    for (const [i, q] of p.refiner.entries()) block(`txtfusion.refiner_blocks.${i}`, q);
    add("txtmlp.1", p.txtmlp1.weight);
    add("txtmlp.3", p.txtmlp3.weight);
    for (const [i, q] of p.blocks.entries()) block(`blocks.${i}`, q);
    add("last.linear", p.last.weight);
    return m;
  }

  private live(): void {
    if (this.#disposed) throw new TpError("E_STATE", "this Krea 2 model was disposed");
  }

  /**
   * Timestep conditioning: `t = tmlp.2(gelu_tanh(tmlp.0(temb(σ))))`, `tvec = tproj.1(gelu_tanh(t))`.
   * Depends on σ only: compute once per step (or once per schedule) and pass to the blocks.
   * @param sigmas σ per batch row (a number for batch 1), in [0, 1]; ×1000 inside the embedding
   * @returns t [B, 1, F] and tvec [B, 1, 6F], f32, owned by the caller
   * Source: krea2.md §3.2 step 4, §3.4.
   */
  embedTimestep(sigmas: number | readonly number[]): { t: Tensor; tvec: Tensor } {
    this.live();
    const b = this.backend;
    const p = this.params;
    const list = typeof sigmas === "number" ? [sigmas] : sigmas;
    if (list.length === 0 || list.some((s) => !Number.isFinite(s))) {
      throw new TpError("E_ARG", `Krea 2 sigmas must be finite numbers, got [${list.join(", ")}]`);
    }
    const B = list.length;
    return b.scope(() => {
      const e = b.upload(krea2TimestepEmbedding(list, this.config.tdim), [B, 1, this.config.tdim], "f32");
      const t = linear(b, b.gelu(linear(b, e, p.tmlp0), { approximate: "tanh" }), p.tmlp2);
      const tvec = linear(b, b.gelu(t, { approximate: "tanh" }), p.tproj1);
      return { t, tvec };
    });
  }

  /**
   * Text side: `txtfusion` (2 layer-wise blocks over the taps of each token, the taps → 1 projector,
   * 2 refiner blocks over the tokens) then `txtmlp` (RMSNorm, Linear, gelu_tanh, Linear). Depends on
   * the prompt only: compute once per prompt and pass as `txt` to {@link forward}.
   * @param context f32 [B, S, txtlayers·txtdim], tap-major per token (ComfyUI's packing)
   * @param capture optional, receives copies of `txtfusion` [B, S, txtdim] and `txtmlp` outputs
   * @returns f32 [B, S, F], owned by the caller
   * @throws TpError E_SHAPE when the feature width is not txtlayers × txtdim (e.g. a text encoder other
   *   than Krea 2's 12-layer Qwen3-VL tap)
   * Source: krea2.md §3.2 step 5, §3.6; ComfyUI `TextFusionTransformer.forward`.
   */
  encodeText(context: Tensor, capture?: Krea2ForwardOptions["capture"]): Tensor {
    this.live();
    this.#checkContext(context);
    const captured: Captured = [];
    const txt = this.#textSide(context, capture ? captured : null);
    for (const [name, t] of captured) capture?.(name, t);
    return txt;
  }

  /** @throws TpError E_SHAPE unless `context` is [B, S, txtlayers·txtdim] */
  #checkContext(context: Tensor): void {
    const { txtlayers: n, txtdim: d } = this.config;
    if (context.rank !== 3 || context.shape[2] !== n * d) {
      throw new TpError(
        "E_SHAPE",
        `Krea 2 expects conditioning [batch, seq, ${n}×${d} = ${n * d}] (a ${n}-layer Qwen3-VL stack), got [${context.shape}]`,
      );
    }
  }

  /** {@link encodeText} after its checks; copies of module outputs go to `captured` (when given). */
  #textSide(context: Tensor, captured: Captured | null): Tensor {
    const b = this.backend;
    const p = this.params;
    const { txtlayers: n, txtdim: d, eps } = this.config;
    const [B, S] = context.shape as [number, number, number];
    return b.scope(() => {
      // [B·S, taps, txtdim]: each token's taps form one sequence
      let x = b.copy(context).reshape(B * S, n, d);
      for (const blk of p.layerwise) x = textBlock(b, x, blk, eps);
      // projector over the tap axis: [B·S, txtdim, taps] · [1, taps]ᵀ → [B, S, txtdim]
      let u = b.matmul(x.permute(0, 2, 1), p.projector).reshape(B, S, d);
      for (const blk of p.refiner) u = textBlock(b, u, blk, eps);
      captured?.push(["txtfusion", b.copy(u)]);
      const h = linear(b, b.rmsNorm(u, p.txtmlpNorm, { eps, unitOffset: true }), p.txtmlp1);
      const txt = linear(b, b.gelu(h, { approximate: "tanh" }), p.txtmlp3);
      captured?.push(["txtmlp", b.copy(txt)]);
      return { txt, captured }; // the copies outlive the scope with the result
    }).txt;
  }

  /**
   * The velocity prediction v ≈ noise − x0 for a latent at noise level σ (rectified flow; ComfyUI's
   * denoised estimate is x − σ·v).
   * @param x       f32 latent [B, channels, H, W] or [B, channels, 1, H, W] (normalised latent space);
   *                odd H or W are padded circularly to even and cropped back
   * @param sigmas  σ per batch row (a number when B = 1); the model multiplies by 1000 internally
   * @param context f32 [B, S, txtlayers·txtdim] conditioning (ignored when `options.txt` is given)
   * @param options `txt` (precomputed {@link encodeText}), `capture` (module outputs)
   * @returns f32 velocity of x's shape, owned by the caller
   * @throws TpError E_SHAPE for a latent or conditioning of the wrong shape, E_ARG for σ count ≠ B
   * Source: krea2.md §3.2; ComfyUI `SingleStreamDiT._forward`.
   */
  forward(
    x: Tensor,
    sigmas: number | readonly number[],
    context: Tensor | null,
    options: Krea2ForwardOptions = {},
  ): Tensor {
    this.live();
    const b = this.backend;
    const p = this.params;
    const c = this.config;
    const capture = options.capture;
    const temporal = x.rank === 5;
    if ((x.rank !== 4 && !temporal) || x.shape[1] !== c.channels || (temporal && x.shape[2] !== 1)) {
      throw new TpError(
        "E_SHAPE",
        `Krea 2 latent must be [batch, ${c.channels}, H, W] or [batch, ${c.channels}, 1, H, W], got [${x.shape}]`,
      );
    }
    const B = x.shape[0] as number;
    const sigmaList = typeof sigmas === "number" ? Array<number>(B).fill(sigmas) : sigmas;
    if (sigmaList.length !== B) {
      throw new TpError("E_ARG", `Krea 2 forward got ${sigmaList.length} sigmas for a batch of ${B}`);
    }
    const H = x.shape[x.rank - 2] as number;
    const W = x.shape[x.rank - 1] as number;
    const P = c.patch;
    // Copies of module outputs are made inside the scope and handed to `capture` once it closes.
    const captured: Captured = [];
    const keep = capture ? captured : null;
    const v = b.scope(() => {
      // 1. circular padding of odd sizes (pad_to_patch_size): row H = row 0, column W = column 0
      let img = temporal ? x.reshape(B, c.channels, H, W) : x;
      if (H % P !== 0) img = b.concat([img, img.slice(2, 0, P - (H % P))], 2);
      if (W % P !== 0) img = b.concat([img, img.slice(3, 0, P - (W % P))], 3);
      const h = Math.ceil(H / P);
      const w = Math.ceil(W / P);
      // 2. patchify "b c (h ph) (w pw) -> b (h w) (c ph pw)": [B, h·w, channels·P²]
      const patches = b
        .copy(img.reshape(B, c.channels, h, P, w, P).permute(0, 2, 4, 1, 3, 5))
        .reshape(B, h * w, c.channels * P * P);
      // 3. patch embedding [B, h·w, F]
      const first = linear(b, patches, p.first);
      keep?.push(["first", b.copy(first)]);
      // 4. timestep [B, 1, F] and the AdaLN-single vector [B, 1, 6F]
      const { t, tvec } = this.embedTimestep(sigmaList);
      keep?.push(["tmlp", b.copy(t)], ["tproj", b.copy(tvec)]);
      // 5. text [B, S, F]
      let txt = options.txt;
      if (txt === undefined) {
        if (context === null) throw new TpError("E_ARG", "Krea 2 forward needs a context or options.txt");
        this.#checkContext(context);
        txt = this.#textSide(context, keep);
      } else if (txt.rank !== 3 || txt.shape[0] !== B || txt.shape[2] !== c.features) {
        throw new TpError("E_SHAPE", `Krea 2 txt must be [${B}, seq, ${c.features}], got [${txt.shape}]`);
      }
      const S = txt.shape[1] as number;
      // 6–7. joint sequence, text first, and its 3-axis positions
      let X = b.concat([txt, first], 1); // [B, S + h·w, F]
      const rope: Rope = {
        positions: b.upload(krea2Positions(S, h, w), [3, S + h * w], "i32"),
        options: krea2RopeOptions(c),
      };
      // 8. the single-stream blocks
      p.blocks.forEach((blk, i) => {
        X = singleStreamBlock(b, X, tvec, blk, c.eps, rope);
        keep?.push([`block${i}`, b.copy(X)]);
      });
      // 9. final layer on the image rows: scale = t + lin[0], shift = t + lin[1] (t, not tvec)
      const scale = b.add(t, p.lastModulation.slice(0, 0, 1));
      const shift = b.add(t, p.lastModulation.slice(0, 1, 2));
      const normed = b.rmsNorm(X.slice(1, S, S + h * w), p.lastNorm, { eps: c.eps, unitOffset: true });
      const out = linear(b, b.modulate(normed, scale, shift), p.last); // [B, h·w, P²·channels]
      keep?.push(["last", b.copy(out)]);
      // 10. unpatchify "b (h w) (c ph pw) -> b c (h ph) (w pw)" and crop the padding
      const full = b
        .copy(out.reshape(B, h, w, c.channels, P, P).permute(0, 3, 1, 4, 2, 5))
        .reshape(B, c.channels, h * P, w * P);
      const cropped = h * P === H && w * P === W ? full : b.copy(full.slice(2, 0, H).slice(3, 0, W));
      return { v: temporal ? cropped.reshape(B, c.channels, 1, H, W) : cropped, captured };
    }).v;
    for (const [name, t] of captured) capture?.(name, t);
    return v;
  }

  /** {@link dispose}, for `using`. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Free the uploaded parameters and close the checkpoint; the model is unusable afterwards. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const t of this.uploaded) t[Symbol.dispose]();
    this.src.close();
  }
}
