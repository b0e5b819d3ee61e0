/**
 * The Wan 2.1-family VAE decoder (16 latent channels, 8× spatial) that Krea 2 decodes with — ComfyUI
 * ships it as the Qwen-Image VAE — for single images, written on the Backend interface only.
 *
 * With one frame every causal 3-D convolution meets real data only in its last temporal kernel slice
 * (the causal padding is zeros and there is no cached history on the first chunk), so it is a 2-D
 * convolution with W[:, :, kt − 1] and zero padding kh/2; `upsample3d`'s `time_conv` is skipped on the
 * first chunk. The network is then: conv2 (1×1, post-quant) → decoder.conv1 → middle (Res, Attn, Res)
 * → upsamples.* (Res / Attn / Resample, in checkpoint order) → head (RMS norm, SiLU, conv).
 *
 * Config comes from tensor shapes (base width, channel multipliers, number of stages and blocks), never
 * from the real model's sizes. Tensor names are the checkpoint's (ComfyUI comfy/ldm/wan/vae.py).
 *
 * Sources: ComfyUI comfy/ldm/wan/vae.py (`Decoder3d`, `ResidualBlock`, `AttentionBlock`, `Resample`,
 * `RMS_norm`, `CausalConv3d`, `WanVAE.decode`), comfy/latent_formats.py (`Wan21`), comfy/sd.py
 * (`VAE.process_output`), nodes.py (`SaveImage`); ../shared/spec/krea2.md §0, §1.10, §5.
 */
import { checkTensorSet, openSafetensors, type TensorSource, wan21VaeTensorSet } from "@tp/formats";
import { type Backend, dtypeFromSafetensors, type Tensor, TpError } from "@tp/tensor";

// ------------------------------------------------------------------------------- latent format

/** `Wan21` latent format per-channel mean (comfy/latent_formats.py; krea2.md §5.2). */
export const WAN21_LATENT_MEAN: readonly number[] = [
  -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517, -0.3632,
  -0.1922, -0.9497, 0.2503, -0.2921,
];
/** `Wan21` latent format per-channel standard deviation (comfy/latent_formats.py; krea2.md §5.2). */
export const WAN21_LATENT_STD: readonly number[] = [
  2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579, 1.6382,
  1.1253, 2.8251, 1.916,
];

function channelTensor(backend: Backend, x: Tensor, values: readonly number[], name: string): Tensor {
  const c = x.shape[1];
  if (x.rank < 2 || c !== values.length) {
    throw new TpError(
      "E_SHAPE",
      `${name}: latent [${x.shape.join(", ")}] must be [batch, ${values.length}, ...] (Wan 2.1 latent channels)`,
    );
  }
  const shape = [1, c, ...x.shape.slice(2).map(() => 1)];
  return backend.upload(Float32Array.from(values), shape, "f32", name);
}

/**
 * Sampler (model) space → VAE space, `Wan21.process_out`: z = x·std_c + mean_c in f32 (two roundings, as
 * torch). x: [batch, 16, ...] f32 → new tensor of the same shape.
 * @throws TpError E_SHAPE when dim 1 is not 16
 * Source: comfy/latent_formats.py `Wan21.process_out` (scale factor 1); krea2.md §4.3, §5.2.
 */
export function wan21ProcessOut(backend: Backend, x: Tensor): Tensor {
  return backend.scope(() => {
    const std = channelTensor(backend, x, WAN21_LATENT_STD, "wan21 latent std");
    const mean = channelTensor(backend, x, WAN21_LATENT_MEAN, "wan21 latent mean");
    return backend.add(backend.mul(x, std), mean);
  });
}

/**
 * VAE space → sampler space, `Wan21.process_in`: x = (z − mean_c) / std_c, computed as
 * (z − mean_c)·f32(1/std_c) (the Backend has no division; ≤ 1 ulp from torch). Shapes as
 * {@link wan21ProcessOut}. Used for img2img, not for text-to-image (empty latents are not normalized).
 * @throws TpError E_SHAPE when dim 1 is not 16
 * Source: comfy/latent_formats.py `Wan21.process_in`.
 */
export function wan21ProcessIn(backend: Backend, z: Tensor): Tensor {
  return backend.scope(() => {
    const inv = channelTensor(
      backend,
      z,
      WAN21_LATENT_STD.map((s) => 1 / Math.fround(s)),
      "wan21 latent 1/std",
    );
    const mean = channelTensor(backend, z, WAN21_LATENT_MEAN, "wan21 latent mean");
    return backend.mul(backend.sub(z, mean), inv);
  });
}

// ---------------------------------------------------------------------------------- weights

/** A residual block `P.residual.{0,2,3,6}` (+ `P.shortcut` when C_in ≠ C_out). */
interface ResBlock {
  readonly kind: "res";
  readonly name: string;
  readonly norm0: Tensor; // residual.0.gamma [C_in]
  readonly conv2: Conv; // residual.2 [C_out, C_in, 3, 3]
  readonly norm3: Tensor; // residual.3.gamma [C_out]
  readonly conv6: Conv; // residual.6 [C_out, C_out, 3, 3]
  readonly shortcut: Conv | null; // shortcut [C_out, C_in, 1, 1]
}

/** Single-head self-attention over all positions, `P.norm`, `P.to_qkv`, `P.proj`. */
interface AttnBlock {
  readonly kind: "attn";
  readonly name: string;
  readonly norm: Tensor; // norm.gamma [C]
  readonly toQkv: Conv; // [3C, C, 1, 1]
  readonly proj: Conv; // [C, C, 1, 1]
}

/** Nearest 2× upsampling then `P.resample.1` (3×3, C → C/2 in Wan 2.1). */
interface UpBlock {
  readonly kind: "up";
  readonly name: string;
  readonly conv: Conv;
}

type Block = ResBlock | AttnBlock | UpBlock;

/** A 2-D convolution: weight [C_out, C_in, kh, kw] f32, bias [C_out] or null, zero padding kh/2. */
interface Conv {
  readonly weight: Tensor;
  readonly bias: Tensor | null;
  readonly padding: number;
}

/** Sizes read from the checkpoint's tensor shapes. */
export interface WanVaeConfig {
  /** Latent channels (conv2.weight rows): 16. */
  readonly z_dim: number;
  /** Base width (decoder.head.0.gamma length): 96 in the real VAE. */
  readonly dim: number;
  /** Channels after decoder.conv1 (dim · dim_mult[-1]). */
  readonly top_dim: number;
  /** Number of 2× upsampling stages (3 → 8× spatial). */
  readonly upsamples: number;
  /** Modules under decoder.upsamples, in order ("res", "attn", "up"). */
  readonly blocks: readonly ("res" | "attn" | "up")[];
  /** Spatial factor from latent to pixels (2^upsamples). */
  readonly scale: number;
}

/** Options of {@link WanVaeDecoder.decode}. */
export interface WanVaeDecodeOptions {
  /**
   * Tiled decoding for images too large to decode at once (krea2.md §5.6): latent tiles of `size`
   * (default 128) overlapping by `overlap` (default 16), blended with linear ramps over the overlap
   * on edges facing another tile. Changes pixels near seams (mid-block attention becomes tile-local);
   * off by default, as in ComfyUI, which decodes whole images when memory allows.
   */
  readonly tiled?: boolean | { readonly size?: number; readonly overlap?: number };
}

const WAN22_KEY = "decoder.upsamples.0.upsamples.0.residual.2.weight";

/**
 * The Wan 2.1 VAE decoder bound to a backend, with its weights uploaded (f32; BF16/F16 checkpoints are
 * cast on the backend). Create with {@link loadWanVae}.
 */
export class WanVaeDecoder implements Disposable {
  readonly backend: Backend;
  readonly config: WanVaeConfig;
  /** The checkpoint the weights came from (for the reason of a non-finite decode). */
  readonly file: string;
  /** Decoder tensors of the file the decoder does not read (for a warning). */
  readonly unexpected: readonly string[] = [];
  readonly #postQuant: Conv;
  readonly #convIn: Conv;
  readonly #middle: readonly Block[];
  readonly #upsamples: readonly Block[];
  readonly #headNorm: Tensor;
  readonly #headConv: Conv;
  /** Every uploaded weight, freed by {@link dispose}. */
  readonly #weights: Tensor[] = [];

  /** @internal use {@link loadWanVae} */
  constructor(backend: Backend, src: TensorSource) {
    this.backend = backend;
    this.file = src.path;
    try {
      checkWan21(src);
      this.unexpected = checkTensorSet(src, wan21VaeTensorSet(src)).unexpected;
      checkWanShapes(src);
      this.#postQuant = this.#conv(src, "conv2");
      this.#convIn = this.#conv(src, "decoder.conv1");
      this.#middle = [0, 1, 2].map((i) => this.#block(src, `decoder.middle.${i}`));
      const ups: Block[] = [];
      for (let i = 0; ; i++) {
        const p = `decoder.upsamples.${i}`;
        if (!src.tensors.some((t) => t.name.startsWith(`${p}.`))) break;
        ups.push(this.#block(src, p));
      }
      this.#upsamples = ups;
      this.#headNorm = this.#gamma(src, "decoder.head.0.gamma");
      this.#headConv = this.#conv(src, "decoder.head.2");
      const upCount = ups.filter((b) => b.kind === "up").length;
      this.config = {
        z_dim: this.#postQuant.weight.shape[0] as number,
        dim: this.#headNorm.shape[0] as number,
        top_dim: this.#convIn.weight.shape[0] as number,
        upsamples: upCount,
        blocks: ups.map((b) => b.kind),
        scale: 2 ** upCount,
      };
      if ((this.#headConv.weight.shape[0] as number) !== 3) {
        throw new TpError(
          "E_FORMAT",
          `decoder.head.2.weight has ${this.#headConv.weight.shape[0]} output channels; a Wan 2.1 VAE decodes to 3 (RGB)`,
          { file: src.path, tensor: "decoder.head.2.weight" },
        );
      }
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  // ---- loading ------------------------------------------------------------------------------

  /** Upload a tensor as f32 (casting BF16/F16 on the backend), owned by the caller. */
  #upload(src: TensorSource, name: string): Tensor {
    const e = src.tensor(name);
    const dtype = dtypeFromSafetensors(e.dtype);
    if (dtype !== "f32" && dtype !== "bf16" && dtype !== "f16") {
      throw new TpError("E_FORMAT", `VAE tensor has dtype ${e.dtype}; expected F32, BF16 or F16`, {
        file: src.path,
        tensor: name,
      });
    }
    const raw = this.backend.upload(src.data(name), e.shape, dtype, name);
    if (dtype === "f32") return raw;
    using half = raw;
    return this.backend.cast(half, "f32");
  }

  /** A weight this decoder owns until {@link dispose}. */
  #keep(t: Tensor): Tensor {
    this.#weights.push(this.backend.persist(t)); // freed by dispose, not by a caller's scope
    return t;
  }

  /** {@link #upload}, kept. */
  #tensor(src: TensorSource, name: string): Tensor {
    return this.#keep(this.#upload(src, name));
  }

  /** RMS-norm gamma [C, 1, 1(, 1)] → [C]. */
  #gamma(src: TensorSource, name: string): Tensor {
    const g = this.#tensor(src, name);
    return g.reshape(g.shape[0] as number);
  }

  /**
   * `P.weight` [C_out, C_in, kt, kh, kw] (CausalConv3d → its last time slice) or [C_out, C_in, kh, kw]
   * (Conv2d), and `P.bias`.
   */
  #conv(src: TensorSource, p: string): Conv {
    const entry = src.tensor(`${p}.weight`);
    const w =
      entry.shape.length === 5 ? this.#lastTimeSlice(src, `${p}.weight`) : this.#tensor(src, `${p}.weight`);
    if (w.rank !== 4) {
      throw new TpError("E_FORMAT", `conv weight [${entry.shape.join(", ")}] must have rank 4 or 5`, {
        file: src.path,
        tensor: `${p}.weight`,
      });
    }
    const kh = w.shape[2] as number;
    const bias = src.has(`${p}.bias`) ? this.#tensor(src, `${p}.bias`) : null;
    return { weight: w, bias, padding: Math.floor(kh / 2) };
  }

  /** A CausalConv3d weight's last time slice as a Conv2d weight [C_out, C_in, kh, kw] (krea2.md §5.4). */
  #lastTimeSlice(src: TensorSource, name: string): Tensor {
    const kt = src.tensor(name).shape[2] as number;
    return this.#keep(
      this.backend.scope(() => {
        const last = this.backend.slice(this.#upload(src, name), 2, kt - 1, kt); // [C_out, C_in, 1, kh, kw]
        return last.reshape(last.shape[0] as number, last.shape[1] as number, ...last.shape.slice(3));
      }),
    );
  }

  #block(src: TensorSource, p: string): Block {
    if (src.has(`${p}.residual.0.gamma`)) {
      return {
        kind: "res",
        name: p,
        norm0: this.#gamma(src, `${p}.residual.0.gamma`),
        conv2: this.#conv(src, `${p}.residual.2`),
        norm3: this.#gamma(src, `${p}.residual.3.gamma`),
        conv6: this.#conv(src, `${p}.residual.6`),
        shortcut: src.has(`${p}.shortcut.weight`) ? this.#conv(src, `${p}.shortcut`) : null,
      };
    }
    if (src.has(`${p}.to_qkv.weight`)) {
      return {
        kind: "attn",
        name: p,
        norm: this.#gamma(src, `${p}.norm.gamma`),
        toQkv: this.#conv(src, `${p}.to_qkv`),
        proj: this.#conv(src, `${p}.proj`),
      };
    }
    if (src.has(`${p}.resample.1.weight`)) {
      return { kind: "up", name: p, conv: this.#conv(src, `${p}.resample.1`) };
    }
    throw new TpError(
      "E_FORMAT",
      `${p} is neither a residual block, an attention block nor an upsampler (no residual.0.gamma, to_qkv.weight or resample.1.weight)`,
      { file: src.path, tensor: p },
    );
  }

  // ---- forward ------------------------------------------------------------------------------

  /** 2-D convolution with bias and zero padding kh/2. x: [B, C_in, H, W] → [B, C_out, H, W]. */
  #applyConv(x: Tensor, c: Conv): Tensor {
    return this.backend.conv2d(x, c.weight, c.bias, { padding: c.padding });
  }

  /**
   * `RMS_norm` over channels: F.normalize(x, dim=1)·√C·γ = x / sqrt(mean_c(x²))·γ, as rmsNorm over the
   * last dimension of the channels-last view; eps = 1e-24/C stands for F.normalize's clamp
   * max(‖x‖, 1e-12). x: [B, C, H, W] → new [B, C, H, W].
   */
  #rmsNorm(x: Tensor, gamma: Tensor): Tensor {
    const b = this.backend;
    const c = x.shape[1] as number;
    using normed = b.rmsNorm(x.permute(0, 2, 3, 1), gamma, { eps: 1e-24 / c }); // [B, H, W, C]
    return b.copy(normed.permute(0, 3, 1, 2)); // [B, C, H, W]
  }

  /** norm → SiLU. */
  #normSilu(x: Tensor, gamma: Tensor): Tensor {
    using n = this.#rmsNorm(x, gamma);
    return this.backend.silu(n);
  }

  /** Residual block: conv6(silu(norm3(conv2(silu(norm0(x)))))) + shortcut(x). Dropout is inert. */
  #res(x: Tensor, blk: ResBlock): Tensor {
    using h = sequential(x, [
      (t) => this.#normSilu(t, blk.norm0),
      (t) => this.#applyConv(t, blk.conv2),
      (t) => this.#normSilu(t, blk.norm3),
      (t) => this.#applyConv(t, blk.conv6),
    ]);
    if (!blk.shortcut) return this.backend.add(h, x);
    using skip = this.#applyConv(x, blk.shortcut);
    return this.backend.add(h, skip);
  }

  /** Attention block: x + proj(softmax(q kᵀ / √C) v), one head over all H·W positions. */
  #attn(x: Tensor, blk: AttnBlock): Tensor {
    const b = this.backend;
    const [batch, c, h, w] = x.shape as [number, number, number, number];
    return b.scope(() => {
      const qkv = this.#applyConv(this.#rmsNorm(x, blk.norm), blk.toQkv); // [B, 3C, H, W]
      // q, k, v: channels [0, C), [C, 2C), [2C, 3C) → [B, 1, H·W, C]
      const [q, k, v] = [0, 1, 2].map((i) =>
        b
          .slice(qkv, 1, i * c, (i + 1) * c)
          .reshape(batch, 1, c, h * w)
          .permute(0, 1, 3, 2),
      ) as [Tensor, Tensor, Tensor];
      const o = b.attention(q, k, v, { scale: 1 / Math.sqrt(c) }); // [B, 1, H·W, C]
      const oc = b.copy(o.permute(0, 1, 3, 2)); // [B, 1, C, H·W]
      return b.add(this.#applyConv(oc.reshape(batch, c, h, w), blk.proj), x);
    });
  }

  /** Upsampler: nearest 2× ("nearest-exact" equals nearest for factor 2), then the 3×3 conv. */
  #up(x: Tensor, blk: UpBlock): Tensor {
    using u = this.backend.upsampleNearest2d(x, 2);
    return this.#applyConv(u, blk.conv);
  }

  #apply(x: Tensor, blk: Block): Tensor {
    if (blk.kind === "res") return this.#res(x, blk);
    if (blk.kind === "attn") return this.#attn(x, blk);
    return this.#up(x, blk);
  }

  /** The whole decoder on one latent [B, z_dim, h, w] → [B, 3, h·s, w·s]. */
  #decodeWhole(z: Tensor): Tensor {
    return sequential(z, [
      (t) => this.#applyConv(t, this.#postQuant), // conv2, 1×1
      (t) => this.#applyConv(t, this.#convIn), // [B, top_dim, h, w]
      ...[...this.#middle, ...this.#upsamples].map((blk) => (t: Tensor) => this.#apply(t, blk)),
      (t) => this.#normSilu(t, this.#headNorm),
      (t) => this.#applyConv(t, this.#headConv), // [B, 3, H, W]
    ]);
  }

  /**
   * Decode a latent in VAE space (after {@link wan21ProcessOut}) to raw pixels, nominally in [−1, 1]
   * (ComfyUI `WanVAE.decode` for one frame, not clamped).
   * @param z [B, z_dim, 1, h, w] (ComfyUI's video layout, one frame) or [B, z_dim, h, w], f32
   * @returns a new tensor [B, 3, h·8, w·8] f32 (for the real VAE; the factor is config.scale)
   * @throws TpError E_SHAPE for another rank, channel count or more than one frame
   */
  decode(z: Tensor, options: WanVaeDecodeOptions = {}): Tensor {
    const z4 = this.#latent4d(z);
    const tiled = options.tiled;
    if (!tiled) return this.#decodeWhole(z4);
    const size = (typeof tiled === "object" ? tiled.size : undefined) ?? 128;
    const overlap = (typeof tiled === "object" ? tiled.overlap : undefined) ?? 16;
    return this.#decodeTiled(z4, size, overlap);
  }

  #latent4d(z: Tensor): Tensor {
    const s = z.shape;
    const zd = this.config.z_dim;
    if (s.length === 5 && s[1] === zd && s[2] === 1)
      return z.reshape(s[0] as number, zd, s[3] as number, s[4] as number);
    if (s.length === 4 && s[1] === zd) return z;
    throw new TpError(
      "E_SHAPE",
      `VAE decode: latent [${s.join(", ")}] must be [batch, ${zd}, 1, h, w] or [batch, ${zd}, h, w] (one frame)`,
    );
  }

  /**
   * Tiled decode (krea2.md §5.6): tiles of `size` latents, stride size − overlap (the last tile of an
   * axis is moved back to end at the edge), each decoded independently, weighted by the product of two
   * 1-D ramps (i + 0.5)/R over the R = overlap·scale pixels of each edge that faces another tile, summed,
   * and divided by the summed weights (computed on the host, uploaded).
   */
  #decodeTiled(z: Tensor, size: number, overlap: number): Tensor {
    const b = this.backend;
    if (!Number.isInteger(size) || !Number.isInteger(overlap) || size < 1 || overlap < 0 || overlap >= size) {
      throw new TpError(
        "E_ARG",
        `tiled decode: need integers size ≥ 1 and 0 ≤ overlap < size, got ${size}, ${overlap}`,
      );
    }
    const [batch, , h, w] = z.shape as [number, number, number, number];
    if (h <= size && w <= size) return this.#decodeWhole(z);
    const s = this.config.scale;
    const starts = (n: number): number[] => {
      if (n <= size) return [0];
      const out: number[] = [];
      for (let p = 0; ; p += size - overlap) {
        if (p + size >= n) {
          out.push(n - size);
          break;
        }
        out.push(p);
      }
      return out;
    };
    const ys = starts(h);
    const xs = starts(w);
    const H = h * s;
    const W = w * s;
    const wsum = new Float32Array(H * W);
    using acc = b.upload(new Float32Array(batch * 3 * H * W), [batch, 3, H, W], "f32", "vae tiles");
    const ramp = overlap * s;
    for (const [yi, y0] of ys.entries()) {
      for (const [xi, x0] of xs.entries()) {
        const th = Math.min(size, h);
        const tw = Math.min(size, w);
        using px = sequential(z, [
          (t) => b.slice(t, 2, y0, y0 + th),
          (t) => b.slice(t, 3, x0, x0 + tw),
          (t) => this.#decodeWhole(t), // [B, 3, th·s, tw·s]
        ]);
        const PH = th * s;
        const PW = tw * s;
        const edge = (i: number, n: number, lo: boolean, hi: boolean): number => {
          let f = 1;
          if (lo && i < ramp) f *= (i + 0.5) / ramp;
          if (hi && n - 1 - i < ramp) f *= (n - 1 - i + 0.5) / ramp;
          return f;
        };
        const mask = new Float32Array(PH * PW);
        for (let i = 0; i < PH; i++) {
          const fy = edge(i, PH, yi > 0, yi < ys.length - 1);
          for (let j = 0; j < PW; j++) {
            const m = Math.fround(fy * edge(j, PW, xi > 0, xi < xs.length - 1));
            mask[i * PW + j] = m;
            const at = (y0 * s + i) * W + x0 * s + j;
            wsum[at] = (wsum[at] as number) + m;
          }
        }
        b.scope(() => {
          const weighted = b.mul(px, b.upload(mask, [1, 1, PH, PW], "f32", "vae tile mask"));
          const region = acc.slice(2, y0 * s, y0 * s + PH).slice(3, x0 * s, x0 * s + PW);
          b.set(region, b.add(b.copy(region), weighted));
        });
      }
    }
    const inv = new Float32Array(H * W);
    for (let i = 0; i < inv.length; i++) inv[i] = 1 / (wsum[i] as number);
    using invT = b.upload(inv, [1, 1, H, W], "f32", "vae tile 1/weights");
    return b.mul(acc, invT);
  }

  /** {@link dispose}, for `using`. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Free every weight this decoder uploaded; it is unusable afterwards. */
  dispose(): void {
    for (const t of this.#weights.splice(0)) t[Symbol.dispose]();
  }
}

/**
 * Check every decoder tensor's shape against the channel chain the file declares, from the header
 * alone, before any weight is uploaded: conv2 [z, z, 1(, 1), 1], decoder.conv1 [C, z, …], each block's
 * convs and norms [C_out, C_in, …] with C_in the previous block's C_out (a resnet's shortcut present
 * exactly when they differ), the middle attention [3C, C] / [C, C], and the head [3, C, …] — so a
 * mismatched VAE is refused at load naming the file and tensor, not after sampling.
 * @throws TpError E_FORMAT naming the file and tensor, with the shape found and the one expected
 */
function checkWanShapes(src: TensorSource): void {
  const fail = (name: string, want: string): never => {
    throw new TpError(
      "E_FORMAT",
      `the VAE tensor ${name} has shape [${src.tensor(name).shape.join(", ")}]; the decoder's channels need ${want}`,
      { file: src.path, tensor: name },
    );
  };
  /** [out, in, k…] with rank 4 or 5 and equal odd kernel sides (or none for in < 0). */
  const conv = (p: string, out: number, inC: number, kernel?: number): void => {
    const w = src.tensor(`${p}.weight`).shape;
    const k = kernel === undefined ? "k" : String(kernel);
    const want = `[${out}, ${inC}, ${w.length === 5 ? "t, " : ""}${k}, ${k}]`;
    if ((w.length !== 4 && w.length !== 5) || w[0] !== out || w[1] !== inC) fail(`${p}.weight`, want);
    const kh = w[w.length - 2] as number;
    const kw = w[w.length - 1] as number;
    if (kh !== kw || kh % 2 !== 1 || (kernel !== undefined && kh !== kernel)) fail(`${p}.weight`, want);
    if (src.has(`${p}.bias`)) {
      const b = src.tensor(`${p}.bias`).shape;
      if (b.length !== 1 || b[0] !== out) fail(`${p}.bias`, `[${out}]`);
    }
  };
  const gamma = (name: string, c: number): void => {
    const g = src.tensor(name).shape;
    if (g[0] !== c || g.slice(1).some((d) => d !== 1)) fail(name, `[${c}, 1, …]`);
  };
  const resnet = (p: string, inC: number): number => {
    const out = src.tensor(`${p}.residual.2.weight`).shape[0] as number;
    gamma(`${p}.residual.0.gamma`, inC);
    conv(`${p}.residual.2`, out, inC);
    gamma(`${p}.residual.3.gamma`, out);
    conv(`${p}.residual.6`, out, out);
    if (src.has(`${p}.shortcut.weight`)) conv(`${p}.shortcut`, out, inC, 1);
    else if (out !== inC)
      fail(`${p}.residual.2.weight`, `[${inC}, ${inC}, …] (no ${p}.shortcut maps ${inC} → ${out} channels)`);
    return out;
  };
  const z = src.tensor("conv2.weight").shape[0] as number;
  conv("conv2", z, z, 1);
  let c = src.tensor("decoder.conv1.weight").shape[0] as number;
  conv("decoder.conv1", c, z);
  c = resnet("decoder.middle.0", c);
  gamma("decoder.middle.1.norm.gamma", c);
  conv("decoder.middle.1.to_qkv", 3 * c, c, 1);
  conv("decoder.middle.1.proj", c, c, 1);
  c = resnet("decoder.middle.2", c);
  for (let i = 0; src.tensors.some((t) => t.name.startsWith(`decoder.upsamples.${i}.`)); i++) {
    const p = `decoder.upsamples.${i}`;
    if (src.has(`${p}.residual.2.weight`)) c = resnet(p, c);
    else if (src.has(`${p}.resample.1.weight`)) {
      const out = src.tensor(`${p}.resample.1.weight`).shape[0] as number;
      conv(`${p}.resample.1`, out, c, 3);
      c = out;
    }
  }
  gamma("decoder.head.0.gamma", c);
  conv("decoder.head.2", 3, c);
}

/**
 * Check that a checkpoint is a 16-channel Wan 2.1-family VAE (krea2.md §5.1).
 * @throws TpError E_FORMAT for a Wan 2.2 VAE (48 channels, nested `upsamples.N.upsamples.M` layout) or
 *   the Qwen-Image-2.1 VAE (64 channels), or when conv2 / decoder tensors are missing
 */
function checkWan21(src: TensorSource): void {
  const fail = (msg: string): never => {
    throw new TpError("E_FORMAT", msg, { file: src.path });
  };
  if (!src.has("conv2.weight") || !src.has("decoder.conv1.weight") || !src.has("decoder.head.0.gamma")) {
    fail(
      "not a Wan 2.1 VAE: conv2.weight, decoder.conv1.weight or decoder.head.0.gamma is missing (is this a DiT or a text encoder? pass the VAE file)",
    );
  }
  const z = src.tensor("conv2.weight").shape[0];
  if (src.has(WAN22_KEY)) {
    fail(
      z === 48
        ? "this is a Wan 2.2 VAE (48 latent channels, 16× spatial); Krea 2 decodes with the 16-channel Wan 2.1 / Qwen-Image VAE (qwen_image_vae.safetensors)"
        : `this VAE has the nested Wan 2.2 / Qwen-Image-2.1 layout with ${z} latent channels; Krea 2 needs the 16-channel Wan 2.1 / Qwen-Image VAE`,
    );
  }
  if (z !== 16) fail(`conv2.weight has ${z} latent channels; the Wan 2.1 VAE has 16`);
}

/**
 * Open a Wan 2.1-family VAE checkpoint and upload its decoder to `backend` (encoder tensors and
 * `conv1` are not read; `time_conv` weights are not used for single images).
 * @param source a .safetensors path or an opened TensorSource (not closed here)
 * @throws TpError E_FORMAT for a Wan 2.2 / Qwen-Image-2.1 VAE or another model's file; E_IO when the
 *   file cannot be read; E_OOM over the backend's budget
 */
export function loadWanVae(backend: Backend, source: string | TensorSource): WanVaeDecoder {
  if (typeof source !== "string") return new WanVaeDecoder(backend, source);
  const src = openSafetensors(source);
  try {
    return new WanVaeDecoder(backend, src);
  } finally {
    src.close();
  }
}

/**
 * Apply `layers` in order, freeing each intermediate once the next exists (never `x`): a chain holds
 * two activations at a time, as torch's `nn.Sequential` does under `no_grad` — at 1024² one
 * [1, 96, 1024, 1024] f32 activation is 384 MiB, so a scope over the chain would be too coarse.
 */
function sequential(x: Tensor, layers: readonly ((t: Tensor) => Tensor)[]): Tensor {
  let cur = x;
  for (const layer of layers) {
    const next = layer(cur);
    if (cur !== x && next !== cur) cur[Symbol.dispose]();
    cur = next;
  }
  return cur;
}

// ---------------------------------------------------------------------------------- to pixels

/**
 * ComfyUI `VAE.process_output` on the host: clamp((x + 1) / 2, 0, 1) per element, f32.
 * @param raw decoder output, any layout, f32
 * @returns a new Float32Array in [0, 1]
 */
export function image01(raw: Float32Array): Float32Array {
  const out = new Float32Array(raw.length);
  for (let i = 0; i < raw.length; i++) {
    const v = Math.fround(Math.fround((raw[i] as number) + 1) / 2);
    out[i] = Math.min(Math.max(v, 0), 1); // NaN stays NaN, as torch.clamp
  }
  return out;
}

/**
 * Raw decoder output → 8-bit interleaved RGB as ComfyUI `SaveImage`: p = clamp((x + 1)/2, 0, 1),
 * byte = trunc(f32(255·p)) (truncation, not rounding: krea2.md §5.5).
 * @param raw   planar [3, H, W] f32 (one image of the decoder's [B, 3, H, W] output)
 * @param height H, width W in pixels
 * @returns Uint8Array [H, W, 3]
 * @throws TpError E_SHAPE when raw.length ≠ 3·H·W
 */
export function toRgb8(raw: Float32Array, height: number, width: number): Uint8Array {
  const plane = height * width;
  if (raw.length !== 3 * plane) {
    throw new TpError("E_SHAPE", `toRgb8: ${raw.length} values is not 3 × ${height} × ${width}`);
  }
  const p = image01(raw);
  const out = new Uint8Array(3 * plane);
  for (let c = 0; c < 3; c++) {
    for (let i = 0; i < plane; i++) {
      const v = Math.fround(255 * (p[c * plane + i] as number));
      out[i * 3 + c] = v > 0 ? Math.trunc(v) : 0; // NaN → 0 (numpy's clip + astype gives 0 on x86)
    }
  }
  return out;
}
