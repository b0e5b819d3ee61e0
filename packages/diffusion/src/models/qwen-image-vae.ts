/**
 * The Qwen-Image-2.1 VAE decoder (diffusers `AutoencoderKLQwenImage21`, a Wan 2.2-style residual
 * decoder; ComfyUI comfy/ldm/wan/vae2_2.py) for single images: 64 latent channels, 16× spatial, four
 * output channels (R, G, B, alpha). For one frame every causal 3-D convolution is a 2-D one over its
 * last time slice, `time_conv` never runs, and each upsampling stage's parameter-free `DupUp` shortcut
 * keeps only its last time slot.
 *
 * Names: diffusers (`decoder.up_blocks.*`, 4-D convs) or ComfyUI/Wan (`decoder.upsamples.*.upsamples.*`,
 * 5-D convs), mapped through @tp/formats' `QWEN_IMAGE_21_VAE_NAMES`. Widths, stages and shortcuts come
 * from tensor shapes; the temporal flags and latent statistics from `vae/config.json` (both layouts
 * take it from the Qwen repository), with the published values as the fallback.
 *
 * Sources: ../shared/spec/qwen-image.md §2.1 (tensors), §2.2 (name map), §8 (structure, statistics,
 * pixels); ComfyUI comfy/ldm/wan/vae2_2.py (`Decoder3d`, `Up_ResidualBlock`, `DupUp3D`), nodes.py
 * (`SaveImage`).
 */
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import {
  identifyCheckpoint,
  openCheckpoint,
  QWEN_IMAGE_21_VAE_NAMES,
  type TensorSource,
  unmapName,
} from "@tp/formats";
import { type Backend, dtypeFromSafetensors, isTpError, type Tensor, TpError } from "@tp/tensor";

/** Latent means of vae/config.json (qwen-image.md §8.1; identical in ComfyUI's latent format). */
export const QWEN_IMAGE_LATENT_MEAN: readonly number[] = [
  0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, 1.8873, -1.7177, -0.651, 0.2732, 0.7562,
  -0.6163, -1.0277, 3.8363, 2.021, 0.0472, 0.932, 2.0087, 2.4954, -0.1391, -1.4249, 1.8464, -0.5236, 1.2826,
  3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, -0.0342, -1.0265, -0.7636, 3.0555, 0.0746, -3.0751,
  -0.1076, 1.7376, -1.0914, -1.9435, -0.2784, -1.368, 0.4809, -0.4433, 0.3764, 0.5729, -2.0595, 1.096, -1.326,
  -2.0211, -5.0179, 0.5275, 4.0162, 1.8505, 0.3026, 1.9373, 1.4937, 0.2632, 0.5547, -1.7121, -0.1562, 0.0304,
];
/** Latent standard deviations of vae/config.json (qwen-image.md §8.1). */
export const QWEN_IMAGE_LATENT_STD: readonly number[] = [
  3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.791, 3.0785, 3.65, 3.9308, 3.0904, 2.8778, 3.7675,
  3.732, 5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489, 3.4896, 3.8513, 3.9323,
  3.4719, 3.7498, 4.283, 3.5694, 4.2467, 3.9037, 3.2947, 5.077, 3.5075, 3.27, 3.4767, 2.8063, 5.1125, 3.5327,
  4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875, 3.9624, 4.0168, 3.5643, 4.055, 5.5614, 4.2963,
  4.408, 3.4959, 3.8747, 3.7608, 3.5735, 3.149, 3.7662, 3.6746, 3.4563, 3.8161,
];

/** What `vae/config.json` says that tensors cannot. */
export interface QwenImageVaeSettings {
  readonly latents_mean: readonly number[];
  readonly latents_std: readonly number[];
  /** Encoder order, e.g. [false, true, true, true]; the decoder reads it reversed. */
  readonly temperal_downsample: readonly boolean[];
}

/**
 * The VAE settings from a `config.json` (diffusers spelling), else the published values.
 * @throws TpError E_FORMAT for unreadable JSON or statistics that are not 64 numbers
 */
export function readQwenImageVaeSettings(configPath: string | undefined): QwenImageVaeSettings {
  const fallback: QwenImageVaeSettings = {
    latents_mean: QWEN_IMAGE_LATENT_MEAN,
    latents_std: QWEN_IMAGE_LATENT_STD,
    temperal_downsample: [false, true, true, true],
  };
  if (configPath === undefined || !existsSync(configPath)) return fallback;
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(readFileSync(configPath, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new TpError("E_FORMAT", `${configPath} is not readable JSON: ${(e as Error).message}`, {
      file: configPath,
    });
  }
  const nums = (k: string): number[] | undefined => {
    const v = j[k];
    if (v === undefined) return undefined;
    if (!Array.isArray(v) || v.some((x) => typeof x !== "number" || !Number.isFinite(x))) {
      throw new TpError("E_FORMAT", `${configPath}: ${k} must be a list of numbers`, { file: configPath });
    }
    return v as number[];
  };
  const td = j.temperal_downsample;
  return {
    latents_mean: nums("latents_mean") ?? fallback.latents_mean,
    latents_std: nums("latents_std") ?? fallback.latents_std,
    temperal_downsample: Array.isArray(td) ? td.map(Boolean) : fallback.temperal_downsample,
  };
}

interface Conv {
  readonly weight: Tensor;
  readonly bias: Tensor | null;
  readonly padding: number;
}

interface Res {
  readonly norm1: Tensor;
  readonly conv1: Conv;
  readonly norm2: Tensor;
  readonly conv2: Conv;
  readonly shortcut: Conv | null;
}

interface Stage {
  readonly resnets: readonly Res[];
  /** The 3×3 conv after nearest 2× upsampling, when the stage upsamples. */
  readonly upsampler: Conv | null;
  /** Temporal flag f_t of the DupUp shortcut (2 where the encoder downsampled time, else 1). */
  readonly temporal: number;
  readonly inChannels: number;
  readonly outChannels: number;
}

/** Sizes read from the tensors (and config). */
export interface QwenImageVaeConfig {
  readonly z_dim: number;
  /** Channels after conv_in. */
  readonly top_dim: number;
  /** Output width of each stage. */
  readonly stage_dims: readonly number[];
  /** Channels of the decoded image: 4 (RGBA). */
  readonly out_channels: number;
  /** Pixels per latent cell. */
  readonly scale: number;
}

/** The Qwen-Image-2.1 VAE decoder bound to a backend (weights as f32). Create with {@link loadQwenImageVae}. */
export class QwenImageVaeDecoder implements Disposable {
  readonly config: QwenImageVaeConfig;
  readonly settings: QwenImageVaeSettings;
  readonly #weights: Tensor[] = [];
  readonly #postQuant: Conv;
  readonly #convIn: Conv;
  readonly #mid0: Res;
  readonly #attn: { norm: Tensor; toQkv: Conv; proj: Conv };
  readonly #mid1: Res;
  readonly #stages: readonly Stage[];
  readonly #normOut: Tensor;
  readonly #convOut: Conv;

  /** @internal use {@link loadQwenImageVae} */
  constructor(
    readonly backend: Backend,
    src: TensorSource,
    settings: QwenImageVaeSettings,
    /** The checkpoint file (for messages). */
    readonly file: string = src.path,
  ) {
    this.settings = settings;
    const comfy = src.has("decoder.conv1.weight");
    const name = (d: string): string => (comfy ? (unmapName(QWEN_IMAGE_21_VAE_NAMES, d) ?? d) : d);
    try {
      const has = (d: string) => src.has(name(d));
      const tensor = (d: string): Tensor => {
        const n = name(d);
        if (!src.has(n)) {
          throw new TpError("E_FORMAT", `Qwen-Image-2.1 VAE tensor ${n} is missing: the file is incomplete`, {
            file: src.path,
            tensor: n,
          });
        }
        return this.#upload(src, n);
      };
      const gamma = (d: string): Tensor => {
        const g = tensor(d);
        return g.reshape(g.numel);
      };
      const conv = (d: string): Conv => {
        let w = tensor(`${d}.weight`);
        if (w.rank === 5) {
          const kt = w.shape[2] as number;
          const [o, i, , kh, kw] = w.shape as [number, number, number, number, number];
          w = this.#keep(this.backend.copy(w.slice(2, kt - 1, kt).reshape(o, i, kh, kw)));
        }
        if (w.rank !== 4) {
          throw new TpError(
            "E_FORMAT",
            `VAE conv ${name(`${d}.weight`)} has rank ${w.rank}, expected 4 or 5`,
            {
              file: src.path,
              tensor: name(`${d}.weight`),
            },
          );
        }
        return {
          weight: w,
          bias: has(`${d}.bias`) ? tensor(`${d}.bias`) : null,
          padding: Math.floor((w.shape[2] as number) / 2),
        };
      };
      const res = (p: string): Res => ({
        norm1: gamma(`${p}.norm1.gamma`),
        conv1: conv(`${p}.conv1`),
        norm2: gamma(`${p}.norm2.gamma`),
        conv2: conv(`${p}.conv2`),
        shortcut: has(`${p}.conv_shortcut.weight`) ? conv(`${p}.conv_shortcut`) : null,
      });
      this.#postQuant = conv("post_quant_conv");
      this.#convIn = conv("decoder.conv_in");
      this.#mid0 = res("decoder.mid_block.resnets.0");
      this.#attn = {
        norm: gamma("decoder.mid_block.attentions.0.norm.gamma"),
        toQkv: conv("decoder.mid_block.attentions.0.to_qkv"),
        proj: conv("decoder.mid_block.attentions.0.proj"),
      };
      this.#mid1 = res("decoder.mid_block.resnets.1");
      const flags = [...settings.temperal_downsample].reverse();
      const stages: Stage[] = [];
      for (let s = 0; has(`decoder.up_blocks.${s}.resnets.0.conv1.weight`); s++) {
        const resnets: Res[] = [];
        for (let j = 0; has(`decoder.up_blocks.${s}.resnets.${j}.conv1.weight`); j++) {
          resnets.push(res(`decoder.up_blocks.${s}.resnets.${j}`));
        }
        const up = has(`decoder.up_blocks.${s}.upsampler.resample.1.weight`);
        const first = resnets[0] as Res;
        stages.push({
          resnets,
          upsampler: up ? conv(`decoder.up_blocks.${s}.upsampler.resample.1`) : null,
          temporal: flags[s] ? 2 : 1,
          inChannels: first.conv1.weight.shape[1] as number,
          outChannels: first.conv1.weight.shape[0] as number,
        });
      }
      this.#stages = stages;
      this.#normOut = gamma("decoder.norm_out.gamma");
      this.#convOut = conv("decoder.conv_out");
      const z = this.#postQuant.weight.shape[0] as number;
      if (settings.latents_mean.length !== z || settings.latents_std.length !== z) {
        throw new TpError(
          "E_FORMAT",
          `the VAE has ${z} latent channels but its config gives ${settings.latents_mean.length} means and ${settings.latents_std.length} deviations`,
          { file: src.path },
        );
      }
      this.config = {
        z_dim: z,
        top_dim: this.#convIn.weight.shape[0] as number,
        stage_dims: stages.map((s) => s.outChannels),
        out_channels: this.#convOut.weight.shape[0] as number,
        scale: 2 ** stages.filter((s) => s.upsampler).length,
      };
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  #keep(t: Tensor): Tensor {
    this.#weights.push(this.backend.persist(t));
    return t;
  }

  /** A tensor as f32 (BF16 / F16 cast on the backend), kept until dispose. */
  #upload(src: TensorSource, name: string): Tensor {
    const e = src.tensor(name);
    const dtype = dtypeFromSafetensors(e.dtype);
    if (dtype !== "f32" && dtype !== "bf16" && dtype !== "f16") {
      throw new TpError("E_FORMAT", `VAE tensor has dtype ${e.dtype}; expected F32, BF16 or F16`, {
        file: src.path,
        tensor: name,
      });
    }
    const b = this.backend;
    return this.#keep(
      b.scope(() => {
        const raw = b.upload(src.data(name), e.shape, dtype, name);
        return dtype === "f32" ? raw : b.cast(raw, "f32");
      }),
    );
  }

  #conv(x: Tensor, c: Conv): Tensor {
    return this.backend.conv2d(x, c.weight, c.bias, { padding: c.padding });
  }

  /** RMS_norm over channels: x / max(‖x‖, 1e-12)·√C·γ, as rmsNorm of the channels-last view (eps 1e-24/C). */
  #norm(x: Tensor, gamma: Tensor): Tensor {
    const b = this.backend;
    const c = x.shape[1] as number;
    return b.copy(b.rmsNorm(x.permute(0, 2, 3, 1), gamma, { eps: 1e-24 / c }).permute(0, 3, 1, 2));
  }

  #res(x: Tensor, r: Res): Tensor {
    const b = this.backend;
    return b.scope(() => {
      const h = this.#conv(b.silu(this.#norm(x, r.norm1)), r.conv1);
      const y = this.#conv(b.silu(this.#norm(h, r.norm2)), r.conv2);
      return b.add(y, r.shortcut ? this.#conv(x, r.shortcut) : x);
    });
  }

  /** Single-head attention over all pixels with scale 1/√C, x + proj(·) (qwen-image.md §8.2). */
  #attention(x: Tensor): Tensor {
    const b = this.backend;
    const [n, c, h, w] = x.shape as [number, number, number, number];
    return b.scope(() => {
      const qkv = this.#conv(this.#norm(x, this.#attn.norm), this.#attn.toQkv);
      const [q, k, v] = [0, 1, 2].map((i) =>
        qkv
          .slice(1, i * c, (i + 1) * c)
          .reshape(n, 1, c, h * w)
          .permute(0, 1, 3, 2),
      ) as [Tensor, Tensor, Tensor];
      const o = b.attention(b.copy(q), b.copy(k), b.copy(v), { scale: 1 / Math.sqrt(c) });
      const oc = b.copy(o.permute(0, 1, 3, 2)).reshape(n, c, h, w);
      return b.add(x, this.#conv(oc, this.#attn.proj));
    });
  }

  /**
   * DupUp shortcut of a stage's input [1, C_in, h, w] → [1, C_out, 2h, 2w]: each input channel repeated
   * `repeats = C_out·f_t·4 / C_in` times, read as (o, t, dy, dx), the last time slot kept, the 2×2
   * sub-pixels moved into space (qwen-image.md §8.2).
   */
  #dupUp(x: Tensor, s: Stage): Tensor {
    const b = this.backend;
    const [n, cin, h, w] = x.shape as [number, number, number, number];
    const ft = s.temporal;
    const repeats = (s.outChannels * ft * 4) / cin;
    if (!Number.isInteger(repeats) || repeats < 1) {
      throw new TpError("E_FORMAT", `VAE stage ${cin} → ${s.outChannels} channels has no whole DupUp repeat`);
    }
    return b.scope(() => {
      const rep = b.copy(x.reshape(n, cin, 1, h * w).broadcastTo([n, cin, repeats, h * w]));
      const slot = rep.reshape(n, s.outChannels, ft, 2, 2, h, w).slice(2, ft - 1, ft); // [n, o, 1, 2, 2, h, w]
      const moved = slot.reshape(n, s.outChannels, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3); // [n, o, h, dy, w, dx]
      return b.copy(moved).reshape(n, s.outChannels, 2 * h, 2 * w);
    });
  }

  /**
   * Model (sampler) space → VAE space: z·std[c] + mean[c] per channel (f32).
   * @param x [1, z_dim, h, w]
   */
  processOut(x: Tensor): Tensor {
    const b = this.backend;
    const z = this.config.z_dim;
    if (x.rank !== 4 || x.shape[1] !== z) {
      throw new TpError("E_SHAPE", `Qwen-Image-2.1 latent must be [1, ${z}, h, w], got [${x.shape}]`);
    }
    return b.scope(() => {
      const std = b.upload(Float32Array.from(this.settings.latents_std), [1, z, 1, 1], "f32");
      const mean = b.upload(Float32Array.from(this.settings.latents_mean), [1, z, 1, 1], "f32");
      return b.add(b.mul(x, std), mean);
    });
  }

  /**
   * Decode a VAE-space latent to raw RGBA, nominally in [−1, 1] (not clamped).
   * @param z [1, z_dim, h, w] or [1, z_dim, 1, h, w] f32
   * @returns [1, 4, h·16, w·16] f32, owned by the caller
   * @throws TpError E_SHAPE for another shape
   */
  decode(z: Tensor): Tensor {
    const b = this.backend;
    const c = this.config;
    let x4 = z;
    if (z.rank === 5 && z.shape[2] === 1)
      x4 = z.reshape(z.shape[0] as number, c.z_dim, z.shape[3] as number, z.shape[4] as number);
    if (x4.rank !== 4 || x4.shape[0] !== 1 || x4.shape[1] !== c.z_dim) {
      throw new TpError(
        "E_SHAPE",
        `VAE decode: latent [${z.shape}] must be [1, ${c.z_dim}, h, w] (one image)`,
      );
    }
    // Stage by stage, each intermediate freed when the next exists (activations dominate memory).
    let x = b.scope(() => this.#mid(this.#conv(this.#conv(x4, this.#postQuant), this.#convIn)));
    for (const s of this.#stages) {
      const next = b.scope(() => {
        let y = x;
        for (const r of s.resnets) y = this.#res(y, r);
        if (!s.upsampler) return y;
        y = this.#conv(b.upsampleNearest2d(y, 2), s.upsampler);
        return b.add(y, this.#dupUp(x, s));
      });
      x[Symbol.dispose]();
      x = next;
    }
    const out = b.scope(() => this.#conv(b.silu(this.#norm(x, this.#normOut)), this.#convOut));
    x[Symbol.dispose]();
    return out;
  }

  #mid(x: Tensor): Tensor {
    return this.#res(this.#attention(this.#res(x, this.#mid0)), this.#mid1);
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Free every weight; the decoder is unusable afterwards. */
  dispose(): void {
    for (const t of this.#weights.splice(0)) t[Symbol.dispose]();
  }
}

/**
 * Open a Qwen-Image-2.1 VAE (diffusers or ComfyUI names) and upload its decoder.
 * @param path   the VAE `.safetensors`
 * @param config its `config.json` (default: beside the file; absent → the published statistics)
 * @throws TpError E_IO for a missing file; E_FORMAT when it is not this VAE (saying what it is), a
 *   tensor is missing, or the config does not fit
 */
export function loadQwenImageVae(backend: Backend, path: string, config?: string): QwenImageVaeDecoder {
  const src = openCheckpoint(path);
  try {
    let kind: string;
    let description: string;
    try {
      const l = identifyCheckpoint(src);
      kind = l.kind;
      description = l.description;
    } catch (e) {
      if (!isTpError(e)) throw e;
      throw new TpError("E_FORMAT", `${path} is not a Qwen-Image-2.1 VAE: ${e.message}`, {
        file: path,
        cause: e,
      });
    }
    if (kind !== "qwen-image-2.1-vae") {
      throw new TpError(
        "E_FORMAT",
        `${path} is not a Qwen-Image-2.1 VAE (64-channel post_quant_conv / conv2): it looks like a ${description} (${kind}); pass it where that component goes`,
        { file: path },
      );
    }
    return new QwenImageVaeDecoder(
      backend,
      src,
      readQwenImageVaeSettings(config ?? join(dirname(path), "config.json")),
    );
  } finally {
    src.close();
  }
}

/**
 * Raw decoder output → 8-bit interleaved RGBA as ComfyUI's SaveImage: p = clamp((x + 1)/2, 0, 1),
 * byte = trunc(f32(255·p)) (qwen-image.md §8.3). NaN → 0.
 * @param raw planar [4, H, W] f32
 * @returns Uint8Array [H, W, 4]
 * @throws TpError E_SHAPE when raw.length ≠ 4·H·W
 */
export function toRgba8(raw: Float32Array, height: number, width: number): Uint8Array {
  const plane = height * width;
  if (raw.length !== 4 * plane)
    throw new TpError("E_SHAPE", `toRgba8: ${raw.length} values is not 4 × ${height} × ${width}`);
  const out = new Uint8Array(4 * plane);
  for (let c = 0; c < 4; c++) {
    for (let i = 0; i < plane; i++) {
      const p = Math.min(Math.max(Math.fround(Math.fround((raw[c * plane + i] as number) + 1) / 2), 0), 1);
      const v = Math.fround(255 * p);
      out[i * 4 + c] = v > 0 ? Math.trunc(v) : 0;
    }
  }
  return out;
}
