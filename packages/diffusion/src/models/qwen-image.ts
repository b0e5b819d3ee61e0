/**
 * The Qwen-Image-2.1 denoiser (diffusers `QwenImage21Transformer2DModel`, ComfyUI
 * `comfy/ldm/qwen_image21/model.py`): a single-stream DiT over `concat(text, image)` with one shared
 * modulation (scale, gate ×2, tanh gates, no shift) read from a timestep row at σ for the image rows
 * and at t = 0 for the text rows, LayerNorm without affine, per-head RMS QK-norm, a 3-axis RoPE
 * (16, 56, 56) with advancing text positions and a centred image grid, a block-causal mask (text
 * causal over text, image over everything) and SwiGLU MLPs. No biases anywhere.
 *
 * Because the text rows are modulated at t = 0 and never see the image, their keys and values are the
 * same at every step: {@link QwenImageDit.encodeText} runs the text rows through every block once per
 * prompt and keeps each block's text K and V ({@link QwenImageTextKv}); {@link QwenImageDit.forward}
 * then runs only the image rows, attending over `[text K/V ; image K/V]` (qwen-image.md §5.4; exact).
 *
 * Written against the `Backend` interface only: no tensor data is read on the host.
 *
 * Sources: ../shared/spec/qwen-image.md §2.1–2.2 (tensors), §5 (forward), §11 (differences from
 * Krea 2); ComfyUI comfy/ldm/qwen_image21/model.py; diffusers transformer_qwenimage21.py.
 */
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import {
  type DetectedLayout,
  identifyCheckpoint,
  loadWeight,
  openCheckpoint,
  type TensorSource,
} from "@tp/formats";
import { convRotFromWeight, dequantizeConvRot } from "@tp/quant";
import {
  type Backend,
  decodeToF32,
  isTpError,
  type RopeOptions,
  type Tensor,
  TpError,
  Weight,
} from "@tp/tensor";
import { krea2TimestepEmbedding } from "./krea2.ts";

// ---------------------------------------------------------------------------------------------------
// Config

/**
 * Hyper-parameters of a Qwen-Image-2.1 transformer in diffusers' `transformer/config.json` spelling,
 * read from tensor shapes (never assumed: the tiny test checkpoint has width 256, 2 blocks, context 8).
 */
export interface QwenImageConfig {
  /** Model width D (`img_in.weight` rows): 4096. */
  readonly hidden_size: number;
  /** Latent channels in (`img_in.weight` columns) and out (`proj_out.weight` rows): 64. */
  readonly in_channels: number;
  readonly out_channels: number;
  /** Per-head width (`norm_q.weight` length): 128. */
  readonly attention_head_dim: number;
  /** Heads = D / head_dim (ComfyUI infers them so): 32. */
  readonly num_attention_heads: number;
  /** Transformer blocks: 32. */
  readonly num_layers: number;
  /** SwiGLU inner width (`gate_up` rows / 2, or `gate_layer` rows): 12288. */
  readonly mlp_hidden: number;
  /** Text-encoder width (`txt_in.text_norm.weight` length): 4096. */
  readonly context_in_dim: number;
  /** Sinusoidal timestep width (`linear_1` columns): 256. */
  readonly timestep_dim: number;
  /** RoPE axis widths in elements, summing to head_dim: (16, 56, 56). */
  readonly axes_dims_rope: readonly [number, number, number];
  /** RoPE base: 10000. */
  readonly rope_theta: number;
  /** Epsilon of every norm: 1e-6. */
  readonly eps: number;
}

/** The architecture's constants that ComfyUI files do not store (qwen-image.md §5; config.json defaults). */
const DEFAULT_AXES: readonly [number, number, number] = [16, 56, 56];
const ROPE_THETA = 10000;
const EPS = 1e-6;

/** The prefix all-in-one ComfyUI files put on every DiT tensor (qwen-image.md §2.2). */
const COMFY_PREFIX = "model.diffusion_model.";

function bad(src: TensorSource, tensor: string, what: string): TpError {
  return new TpError("E_FORMAT", `Qwen-Image-2.1 transformer tensor ${tensor} ${what}`, {
    file: src.path,
    tensor,
  });
}

/** diffusers' transformer/config.json beside the file (or its index), when present. */
function configJson(path: string): Record<string, unknown> | null {
  const file = join(dirname(path), "config.json");
  if (!existsSync(file)) return null;
  try {
    return JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new TpError("E_FORMAT", `${file} is not readable JSON: ${(e as Error).message}`, { file });
  }
}

/**
 * Read a Qwen-Image-2.1 transformer's hyper-parameters from its tensor shapes; RoPE axes and eps from
 * `config.json` beside it when there is one (diffusers), else ComfyUI's constants.
 * @param src    an opened checkpoint
 * @param prefix "" or `model.diffusion_model.`
 * @param json   transformer/config.json, if any
 * @throws TpError E_FORMAT naming the tensor when one is missing or shapes disagree
 * Source: qwen-image.md §2.1; ComfyUI comfy/model_detection.py (heads from img_in / head_dim).
 */
export function readQwenImageConfig(
  src: TensorSource,
  prefix: string,
  json: Record<string, unknown> | null = null,
): QwenImageConfig {
  const shape = (name: string): readonly number[] => {
    if (!src.has(prefix + name)) throw bad(src, prefix + name, "is missing: the file is incomplete");
    return src.tensor(prefix + name).shape;
  };
  const [D, cin] = shape("img_in.weight") as [number, number];
  const hd = shape("transformer_blocks.0.attn.norm_q.weight").reduce((a, b) => a * b, 1);
  let layers = 0;
  while (src.has(`${prefix}transformer_blocks.${layers}.attn.to_q.weight`)) layers++;
  const fused = src.has(`${prefix}transformer_blocks.0.img_mlp.gate_up.weight`);
  const mlp = fused
    ? (shape("transformer_blocks.0.img_mlp.gate_up.weight")[0] as number) / 2
    : (shape("transformer_blocks.0.img_mlp.gate_layer.weight")[0] as number);
  const axes = (
    Array.isArray(json?.axes_dims_rope) ? json.axes_dims_rope.map(Number) : [...DEFAULT_AXES]
  ) as [number, number, number];
  const cfg: QwenImageConfig = {
    hidden_size: D,
    in_channels: cin,
    out_channels: shape("proj_out.weight")[0] as number,
    attention_head_dim: hd,
    num_attention_heads: D / hd,
    num_layers: layers,
    mlp_hidden: mlp,
    context_in_dim: shape("txt_in.text_norm.weight")[0] as number,
    timestep_dim: shape("time_text_embed.timestep_embedder.linear_1.weight")[1] as number,
    axes_dims_rope: axes,
    rope_theta: ROPE_THETA,
    eps: typeof json?.eps === "number" ? json.eps : EPS,
  };
  if (!Number.isInteger(cfg.num_attention_heads) || cfg.num_attention_heads < 1) {
    throw bad(src, `${prefix}img_in.weight`, `width ${D} is not a whole number of ${hd}-wide heads`);
  }
  if (layers === 0) throw bad(src, `${prefix}transformer_blocks.0.attn.to_q.weight`, "is missing");
  if (!Number.isInteger(mlp) || mlp < 1) {
    throw bad(src, `${prefix}transformer_blocks.0.img_mlp`, "has no whole SwiGLU width");
  }
  if (axes.length !== 3 || axes.reduce((a, b) => a + b, 0) !== hd || axes.some((a) => a <= 0 || a % 2)) {
    throw bad(
      src,
      `${prefix}transformer_blocks.0.attn.norm_q.weight`,
      `head_dim ${hd} does not fit RoPE axes [${axes}]`,
    );
  }
  if (json && typeof json.num_layers === "number" && json.num_layers !== layers) {
    throw bad(
      src,
      `${prefix}transformer_blocks`,
      `has ${layers} blocks; config.json says ${json.num_layers}`,
    );
  }
  return cfg;
}

// ---------------------------------------------------------------------------------------------------
// Loading

/**
 * How linears are computed:
 * - `native`: every weight in its file format (bf16 with activations rounded to bf16, INT8 / INT4
 *   ConvRot as W8A8 / W4A4 on @tp/backend-cpu) — what the quantized caches and ComfyUI int8 files run.
 * - `f32`: float weights decoded to f32 at load and ConvRot weights dequantized (weight-only), f32
 *   compute: the reference (`--f32`), 4 bytes per parameter.
 */
export type QwenImageMode = "native" | "f32";

/** The modes of {@link QwenImageMode}. */
export const QWEN_IMAGE_MODES: readonly QwenImageMode[] = ["native", "f32"];

interface BlockParams {
  readonly toQ: Weight;
  readonly toK: Weight;
  readonly toV: Weight;
  readonly toOut: Weight;
  readonly normQ: Tensor;
  readonly normK: Tensor;
  /** ComfyUI's fused [gate; up] rows, or diffusers' two halves. */
  readonly gateUp?: Weight;
  readonly gate?: Weight;
  readonly up?: Weight;
  readonly down: Weight;
}

interface Params {
  readonly imgIn: Weight;
  readonly textNorm: Tensor;
  readonly txtIn: Weight;
  readonly txtOut: Weight;
  readonly t1: Weight;
  readonly t2: Weight;
  readonly modulation: Weight;
  readonly normOut: Weight;
  readonly projOut: Weight;
  readonly blocks: readonly BlockParams[];
}

/** f32 values of a float or ConvRot weight (weight-only dequantization). */
function toF32(w: Weight): Float32Array {
  if (w.format === "f32" && w.scale === undefined) {
    const copy = w.data.slice();
    return new Float32Array(copy.buffer, 0, copy.byteLength / 4);
  }
  if ((w.format === "bf16" || w.format === "f16") && w.scale === undefined)
    return decodeToF32(w.data, w.format);
  if (w.format === "int8_convrot" || w.format === "int4_convrot")
    return dequantizeConvRot(convRotFromWeight(w), w.name);
  throw new TpError("E_UNSUPPORTED", `Qwen-Image-2.1 cannot decode weight format ${w.format} to f32`, {
    tensor: w.name,
    ...(w.source ? { file: w.source.file } : {}),
  });
}

function f32Weight(w: Weight): Weight {
  const v = toF32(w);
  return new Weight({
    name: w.name,
    format: "f32",
    shape: [w.n, w.k],
    data: new Uint8Array(v.buffer, v.byteOffset, v.byteLength),
  });
}

class Loader {
  readonly uploaded: Tensor[] = [];
  constructor(
    readonly src: TensorSource,
    readonly prefix: string,
    readonly backend: Backend,
    readonly mode: QwenImageMode,
  ) {}

  /** Matmul weight [n, k] in the mode's form; float-only tensors (not ConvRot) stay as stored in native. */
  weight(name: string, k: number, n: number): Weight {
    const full = this.prefix + name;
    if (!this.src.has(full)) throw bad(this.src, full, "is missing: the file is incomplete");
    const w = loadWeight(this.src, full, k);
    if (w.k !== k || w.n !== n) throw bad(this.src, full, `is [${w.n}, ${w.k}], expected [${n}, ${k}]`);
    return this.mode === "f32" ? f32Weight(w) : w;
  }

  /** A norm scale as an f32 tensor [n]. */
  vector(name: string, n: number): Tensor {
    const full = this.prefix + name;
    if (!this.src.has(full)) throw bad(this.src, full, "is missing: the file is incomplete");
    const count = this.src.tensor(full).shape.reduce((a, b) => a * b, 1);
    if (count !== n) throw bad(this.src, full, `has ${count} values, expected ${n}`);
    const t = this.backend.upload(toF32(loadWeight(this.src, full)), [n], "f32", full);
    this.uploaded.push(t);
    return t;
  }

  params(c: QwenImageConfig): Params {
    const D = c.hidden_size;
    const H = c.mlp_hidden;
    const hd = c.attention_head_dim;
    const blocks = Array.from({ length: c.num_layers }, (_, i): BlockParams => {
      const p = `transformer_blocks.${i}`;
      const fused = this.src.has(`${this.prefix}${p}.img_mlp.gate_up.weight`);
      return {
        toQ: this.weight(`${p}.attn.to_q.weight`, D, D),
        toK: this.weight(`${p}.attn.to_k.weight`, D, D),
        toV: this.weight(`${p}.attn.to_v.weight`, D, D),
        toOut: this.weight(`${p}.attn.to_out.0.weight`, D, D),
        normQ: this.vector(`${p}.attn.norm_q.weight`, hd),
        normK: this.vector(`${p}.attn.norm_k.weight`, hd),
        ...(fused
          ? { gateUp: this.weight(`${p}.img_mlp.gate_up.weight`, D, 2 * H) }
          : {
              gate: this.weight(`${p}.img_mlp.gate_layer.weight`, D, H),
              up: this.weight(`${p}.img_mlp.proj.weight`, D, H),
            }),
        down: this.weight(`${p}.img_mlp.out.weight`, H, D),
      };
    });
    return {
      imgIn: this.weight("img_in.weight", c.in_channels, D),
      textNorm: this.vector("txt_in.text_norm.weight", c.context_in_dim),
      txtIn: this.weight("txt_in.in_layer.weight", c.context_in_dim, D),
      txtOut: this.weight("txt_in.out_layer.weight", D, D),
      t1: this.weight("time_text_embed.timestep_embedder.linear_1.weight", c.timestep_dim, D),
      t2: this.weight("time_text_embed.timestep_embedder.linear_2.weight", D, D),
      modulation: this.weight("modulation.1.weight", D, 4 * D),
      normOut: this.weight("norm_out.linear.weight", D, D),
      projOut: this.weight("proj_out.weight", D, c.out_channels),
      blocks,
    };
  }
}

// ---------------------------------------------------------------------------------------------------
// Positions, timestep

/**
 * The timestep ComfyUI feeds the embedding: `(σ·1000).to(f32) / 1000` (qwen-image.md §5.1), which can
 * differ from σ by one ulp.
 */
export function qwenImageTimestep(sigma: number): number {
  return Math.fround(Math.fround(Math.fround(sigma) * 1000) / 1000);
}

/**
 * 3-axis RoPE positions (frame, y, x), axis-major i32 [3, L + h·w]: text token k at (k, k, k), image
 * token (r, c) at (L, r − ⌈h/2⌉, c − ⌈w/2⌉).
 * Source: qwen-image.md §5.5; ComfyUI comfy/ldm/qwen_image21/model.py.
 */
export function qwenImagePositions(textLen: number, h: number, w: number): Int32Array {
  const n = textLen + h * w;
  const pos = new Int32Array(3 * n);
  for (let k = 0; k < textLen; k++) {
    pos[k] = k;
    pos[n + k] = k;
    pos[2 * n + k] = k;
  }
  const r0 = Math.ceil(h / 2);
  const c0 = Math.ceil(w / 2);
  for (let r = 0; r < h; r++) {
    for (let c = 0; c < w; c++) {
      const i = textLen + r * w + c;
      pos[i] = textLen;
      pos[n + i] = r - r0;
      pos[2 * n + i] = c - c0;
    }
  }
  return pos;
}

/** `Backend.rope` options: adjacent pairs, one frequency table per axis (qwen-image.md §5.5). */
export function qwenImageRopeOptions(
  c: Pick<QwenImageConfig, "axes_dims_rope" | "rope_theta" | "attention_head_dim">,
): RopeOptions {
  return {
    mode: "interleaved",
    theta: c.rope_theta,
    ropeDims: c.attention_head_dim,
    sections: c.axes_dims_rope.map((d) => d / 2),
  };
}

// ---------------------------------------------------------------------------------------------------
// The network

/** The text side of a prompt for one DiT: per block the text rows' K and V, [1, heads, L, head_dim]. */
export class QwenImageTextKv implements Disposable {
  /** @internal made by {@link QwenImageDit.encodeText} */
  constructor(
    /** Text tokens L. */
    readonly length: number,
    readonly keys: readonly Tensor[],
    readonly values: readonly Tensor[],
  ) {}
  dispose(): void {
    for (const t of [...this.keys, ...this.values]) t[Symbol.dispose]();
  }
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Names of the module outputs {@link QwenImageDit.forward} can hand out (the tiny goldens' names). */
export type QwenImageIntermediate =
  | "img_in"
  | "txt_in"
  | "temb"
  | "modulation"
  | `block${number}`
  | "norm_out";

/** Options of {@link QwenImageDit.forward}. */
export interface QwenImageForwardOptions {
  /**
   * Called with copies the callee owns: `img_in` [1, h·w, D], `txt_in` [1, L, D], `temb` [2, D] (row 0
   * at σ, row 1 at t = 0), `modulation` [2, 4D], `block<i>` [1, L + h·w, D], `norm_out` [1, h·w, D].
   * Only with a context (not with precomputed text K/V).
   */
  readonly capture?: (name: QwenImageIntermediate, t: Tensor) => void;
}

/** Modulation of one timestep row: 1 + scale and tanh(gate) for both halves, [1, 1, D] each. */
interface Mod {
  readonly scale1: Tensor;
  readonly gate1: Tensor;
  readonly scale2: Tensor;
  readonly gate2: Tensor;
}

/** A loaded Qwen-Image-2.1 transformer (see {@link loadQwenImage}). */
export class QwenImageDit implements Disposable {
  #disposed = false;
  /** @internal use {@link loadQwenImage} */
  constructor(
    readonly backend: Backend,
    readonly config: QwenImageConfig,
    private readonly params: Params,
    readonly mode: QwenImageMode,
    readonly layout: DetectedLayout,
    private readonly src: TensorSource,
    private readonly uploaded: readonly Tensor[],
  ) {}

  private live(): void {
    if (this.#disposed) throw new TpError("E_STATE", "this Qwen-Image-2.1 model was disposed");
  }

  /** temb [1, 1, D] = linear_2(SiLU(linear_1(e(t)))), e = cos | sin of 1000·t·ω (qwen-image.md §5.2). */
  #temb(t: number): Tensor {
    const b = this.backend;
    const p = this.params;
    const c = this.config;
    return b.scope(() => {
      const e = b.upload(krea2TimestepEmbedding([t], c.timestep_dim), [1, 1, c.timestep_dim], "f32");
      return b.matmul(b.silu(b.matmul(e, p.t1)), p.t2);
    });
  }

  /** The modulation of a temb row: [scale1 | gate1 | scale2 | gate2] = W_mod·SiLU(temb), raw (gates before tanh). */
  #modRaw(temb: Tensor): Tensor {
    const b = this.backend;
    return b.scope(() => b.matmul(b.silu(temb), this.params.modulation));
  }

  /** 1 + scale and tanh(gate) = 2·sigmoid(2g) − 1 (the Backend has no tanh). */
  #mod(raw: Tensor): Mod {
    const b = this.backend;
    const D = this.config.hidden_size;
    const part = (i: number) => raw.slice(2, i * D, (i + 1) * D);
    const one = b.upload(Float32Array.of(1), [1], "f32", "one");
    const tanh = (g: Tensor) => b.sub(b.scale(b.sigmoid(b.scale(g, 2)), 2), one);
    return {
      scale1: b.add(part(0), one),
      gate1: tanh(part(1)),
      scale2: b.add(part(2), one),
      gate2: tanh(part(3)),
    };
  }

  /** Q, K, V of rows x: [1, S, D] → [1, heads, S, head_dim] each, Q and K normed and rotated. */
  #qkv(x: Tensor, blk: BlockParams, positions: Tensor): [Tensor, Tensor, Tensor] {
    const b = this.backend;
    const c = this.config;
    const S = x.shape[1] as number;
    const heads = c.num_attention_heads;
    const hd = c.attention_head_dim;
    const rope = qwenImageRopeOptions(c);
    const q = b.rope(
      b.rmsNorm(b.matmul(x, blk.toQ).reshape(1, S, heads, hd), blk.normQ, { eps: c.eps }),
      positions,
      rope,
    );
    const k = b.rope(
      b.rmsNorm(b.matmul(x, blk.toK).reshape(1, S, heads, hd), blk.normK, { eps: c.eps }),
      positions,
      rope,
    );
    const v = b.matmul(x, blk.toV).reshape(1, S, heads, hd);
    return [b.copy(q.permute(0, 2, 1, 3)), b.copy(k.permute(0, 2, 1, 3)), b.copy(v.permute(0, 2, 1, 3))];
  }

  /** SwiGLU MLP: out(SiLU(gate(x)) ⊙ proj(x)). */
  #mlp(x: Tensor, blk: BlockParams): Tensor {
    const b = this.backend;
    const H = this.config.mlp_hidden;
    if (blk.gateUp) {
      const gu = b.matmul(x, blk.gateUp);
      return b.matmul(b.swiglu(gu.slice(2, 0, H), gu.slice(2, H, 2 * H)), blk.down);
    }
    return b.matmul(b.swiglu(b.matmul(x, blk.gate as Weight), b.matmul(x, blk.up as Weight)), blk.down);
  }

  /**
   * One block for rows x [1, S, D] whose attention output is `attn(q, k, v)` (the caller decides which
   * keys they see): x += tanh(g1)·Attn(LN(x)(1+s1)) Wo; x += tanh(g2)·MLP(LN(x)(1+s2)) (qwen-image.md §5.3).
   */
  #block(
    x: Tensor,
    blk: BlockParams,
    m: Mod,
    positions: Tensor,
    attend: (q: Tensor, k: Tensor, v: Tensor) => Tensor,
  ): Tensor {
    const b = this.backend;
    const c = this.config;
    const S = x.shape[1] as number;
    return b.scope(() => {
      const n1 = b.mul(b.layerNorm(x, null, null, { eps: c.eps }), m.scale1);
      const [q, k, v] = this.#qkv(n1, blk, positions);
      const o = attend(q, k, v); // [1, heads, S, hd]
      const merged = b.copy(o.permute(0, 2, 1, 3)).reshape(1, S, c.hidden_size);
      const h = b.add(x, b.mul(m.gate1, b.matmul(merged, blk.toOut)));
      const n2 = b.mul(b.layerNorm(h, null, null, { eps: c.eps }), m.scale2);
      return b.add(h, b.mul(m.gate2, this.#mlp(n2, blk)));
    });
  }

  #checkContext(context: Tensor): void {
    const w = this.config.context_in_dim;
    if (
      context.rank !== 3 ||
      context.shape[0] !== 1 ||
      context.shape[2] !== w ||
      !((context.shape[1] as number) >= 1)
    ) {
      throw new TpError(
        "E_SHAPE",
        `Qwen-Image-2.1 expects conditioning [1, seq ≥ 1, ${w}] (the Qwen3-VL last hidden state), got [${context.shape}]`,
      );
    }
  }

  /**
   * The text side of a prompt: txt_in, then every block over the text rows alone (causal, modulated at
   * t = 0), keeping each block's text K and V — the same at every step (qwen-image.md §5.4).
   * @param context f32 [1, L, context_in_dim] (the prompt encoder's output)
   * @returns the K/V of every block, owned by the caller (persisted: it outlives scopes)
   * @throws TpError E_SHAPE for another conditioning shape
   */
  encodeText(context: Tensor): QwenImageTextKv {
    this.live();
    this.#checkContext(context);
    const kv = this.#textSide(context, null);
    return kv;
  }

  #textSide(
    context: Tensor,
    keep: [QwenImageIntermediate, Tensor][] | null,
    blockOut?: Tensor[],
  ): QwenImageTextKv {
    const b = this.backend;
    const p = this.params;
    const c = this.config;
    const L = context.shape[1] as number;
    const { keys, values } = b.scope(() => {
      const txt0 = b.matmul(
        b.gelu(b.matmul(b.rmsNorm(context, p.textNorm, { eps: c.eps, unitOffset: true }), p.txtIn), {
          approximate: "tanh",
        }),
        p.txtOut,
      );
      keep?.push(["txt_in", b.copy(txt0)]);
      const mod = this.#mod(this.#modRaw(this.#temb(0)));
      const positions = b.upload(qwenImagePositions(L, 0, 0), [3, L], "i32", "text positions");
      const keys: Tensor[] = [];
      const values: Tensor[] = [];
      let x = txt0;
      for (const blk of p.blocks) {
        x = this.#block(x, blk, mod, positions, (q, k, v) => {
          keys.push(b.persist(k)); // the block's scope would free them
          values.push(b.persist(v));
          return b.attention(q, k, v, { causal: true });
        });
        blockOut?.push(b.copy(x));
      }
      return { keys, values, outs: blockOut, keep };
    });
    return new QwenImageTextKv(L, keys, values);
  }

  /**
   * The velocity v for a latent at noise level σ (flow matching; denoised = x − σ·v).
   * @param x     f32 latent [1, in_channels, h, w] (normalised latent space)
   * @param sigma σ in (0, 1]; the embedding takes (σ·1000 in f32)/1000, as ComfyUI
   * @param text  conditioning [1, L, context_in_dim], or its precomputed {@link QwenImageTextKv}
   * @returns f32 [1, out_channels, h, w], owned by the caller
   * @throws TpError E_SHAPE for a latent or conditioning of the wrong shape; E_ARG for a non-finite σ
   * Source: qwen-image.md §5.1–5.6.
   */
  forward(
    x: Tensor,
    sigma: number,
    text: Tensor | QwenImageTextKv,
    options: QwenImageForwardOptions = {},
  ): Tensor {
    this.live();
    const b = this.backend;
    const p = this.params;
    const c = this.config;
    if (x.rank !== 4 || x.shape[0] !== 1 || x.shape[1] !== c.in_channels) {
      throw new TpError(
        "E_SHAPE",
        `Qwen-Image-2.1 latent must be [1, ${c.in_channels}, h, w], got [${x.shape}]`,
      );
    }
    if (!Number.isFinite(sigma))
      throw new TpError("E_ARG", `Qwen-Image-2.1 sigma must be finite, got ${sigma}`);
    const [, , h, w] = x.shape as [number, number, number, number];
    const keep: [QwenImageIntermediate, Tensor][] | null = options.capture ? [] : null;
    const textOuts: Tensor[] = [];
    let kv: QwenImageTextKv;
    let ownKv = false;
    if (text instanceof QwenImageTextKv) kv = text;
    else {
      this.#checkContext(text);
      kv = this.#textSide(text, keep, keep ? textOuts : undefined);
      ownKv = true;
    }
    try {
      const L = kv.length;
      const v = b.scope(() => {
        const tokens = b.copy(x.permute(0, 2, 3, 1)).reshape(1, h * w, c.in_channels);
        const img0 = b.matmul(tokens, p.imgIn);
        const tembA = this.#temb(qwenImageTimestep(sigma));
        const rawA = this.#modRaw(tembA);
        if (keep) {
          keep.push(["img_in", b.copy(img0)]);
          const tembZ = this.#temb(0);
          keep.push(["temb", b.concat([tembA, tembZ], 1).reshape(2, c.hidden_size)]);
          keep.push(["modulation", b.concat([rawA, this.#modRaw(tembZ)], 1).reshape(2, 4 * c.hidden_size)]);
        }
        const mod = this.#mod(rawA);
        const all = b.upload(qwenImagePositions(L, h, w), [3, L + h * w], "i32", "positions");
        const positions = b.copy(all.slice(1, L, L + h * w));
        let X = img0;
        p.blocks.forEach((blk, i) => {
          X = this.#block(X, blk, mod, positions, (q, k, v) =>
            b.attention(q, b.concat([kv.keys[i] as Tensor, k], 2), b.concat([kv.values[i] as Tensor, v], 2)),
          );
          if (keep) keep.push([`block${i}`, b.concat([textOuts[i] as Tensor, X], 1)]);
        });
        const outScale = b.add(b.matmul(b.silu(tembA), p.normOut), b.upload(Float32Array.of(1), [1], "f32"));
        const normed = b.mul(b.layerNorm(X, null, null, { eps: c.eps }), outScale);
        keep?.push(["norm_out", b.copy(normed)]);
        const out = b.matmul(normed, p.projOut); // [1, h·w, out_channels]
        return { v: b.copy(out.reshape(1, h, w, c.out_channels).permute(0, 3, 1, 2)), keep };
      }).v;
      if (keep) for (const [name, t] of keep) options.capture?.(name, t);
      return v;
    } finally {
      for (const t of textOuts) t[Symbol.dispose]();
      if (ownKv) kv.dispose();
    }
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Free the uploaded parameters and close the checkpoint. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const t of this.uploaded) t[Symbol.dispose]();
    this.src.close();
  }
}

/** The layout of a Qwen-Image-2.1 transformer, or E_FORMAT saying what the file is instead. */
function identify(src: TensorSource, path: string): DetectedLayout {
  let layout: DetectedLayout;
  try {
    layout = identifyCheckpoint(src);
  } catch (e) {
    if (isTpError(e)) {
      throw new TpError("E_FORMAT", `${path} is not a Qwen-Image-2.1 transformer: ${e.message}`, {
        file: path,
        cause: e,
      });
    }
    throw e;
  }
  if (layout.kind !== "qwen-image-2.1-transformer") {
    throw new TpError(
      "E_FORMAT",
      `${path} is not a Qwen-Image-2.1 transformer (no img_in.weight + modulation.1.weight): it looks like a ${layout.description} (${layout.kind}); pass it where that component goes`,
      { file: path },
    );
  }
  return layout;
}

/**
 * A transformer file's config from its headers alone (no weights read).
 * @throws TpError E_IO, E_FORMAT as {@link loadQwenImage}
 */
export function readQwenImageDitConfig(path: string): QwenImageConfig {
  const src = openCheckpoint(path);
  try {
    return readQwenImageConfig(src, identify(src, path).prefix ?? "", configJson(path));
  } finally {
    src.close();
  }
}

/** Options of {@link loadQwenImage}. */
export interface LoadQwenImageOptions {
  readonly backend: Backend;
  /** Default `native`. */
  readonly mode?: QwenImageMode;
  /** A tensor source to read instead of opening `path` (a quantized cache); closed by dispose. */
  readonly source?: TensorSource;
}

/**
 * Open a Qwen-Image-2.1 transformer (diffusers shards through their index, or a ComfyUI file with bare
 * or `model.diffusion_model.` names; bf16, f32, INT8 / INT4 ConvRot per tensor) and bind it to a backend.
 * @param path a `.safetensors` file or `*.safetensors.index.json`
 * @throws TpError E_IO for a missing file; E_FORMAT when it is not this model or a tensor is missing or
 *   mis-shaped (naming it); E_UNSUPPORTED for a weight format; E_ARG for an unknown mode
 */
export function loadQwenImage(path: string, options: LoadQwenImageOptions): QwenImageDit {
  const mode = options.mode ?? "native";
  if (!QWEN_IMAGE_MODES.includes(mode)) {
    throw new TpError(
      "E_ARG",
      `unknown Qwen-Image-2.1 mode '${mode}'; expected one of: ${QWEN_IMAGE_MODES.join(", ")}`,
    );
  }
  const src = options.source ?? openCheckpoint(path);
  try {
    const layout = identify(src, path);
    const prefix = layout.prefix ?? "";
    const config = readQwenImageConfig(src, prefix, configJson(path));
    const loader = new Loader(src, prefix, options.backend, mode);
    const params = options.backend.scope(() => loader.params(config));
    options.backend.persist(loader.uploaded);
    return new QwenImageDit(options.backend, config, params, mode, layout, src, loader.uploaded);
  } catch (e) {
    src.close();
    throw e;
  }
}

export { COMFY_PREFIX as QWEN_IMAGE_COMFY_PREFIX };
