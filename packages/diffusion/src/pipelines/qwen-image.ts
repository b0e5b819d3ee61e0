/**
 * Qwen-Image-2.1 text-to-image (../shared/spec/qwen-image.md §1, §6–8): conditioning → torch-exact
 * noise `[1, 64, h, w]` from the seed → Euler over the transformer (true CFG with a negative) on the
 * diffusers schedule (dynamic shift, terminal 0.02; default) or ComfyUI's (fixed μ 0.69, "simple") →
 * per-channel de-normalization → the RGBA VAE → 8-bit RGBA as ComfyUI's SaveImage. Each prompt's text
 * side runs through the transformer once ({@link QwenImageDit.encodeText}); the steps reuse its K/V.
 *
 * Sources: qwen-image.md §6 (noise, sizes), §7 (schedules, CFG), §8.3 (pixels); diffusers
 * FlowMatchEulerDiscreteScheduler (`time_shift` exponential, `stretch_shift_to_terminal`) and
 * pipeline_qwenimage21.py (`calculate_shift`, sigmas linspace(1, 1/N, N)); ComfyUI samplers.py.
 */
import { existsSync, readFileSync } from "node:fs";
import { explainNonFiniteWeights } from "@tp/formats";
import { type Backend, checkFinite, type Tensor, TpError } from "@tp/tensor";
import { Conditioning, type HostConditioning } from "../conditioning.ts";
import type { QwenImageDit, QwenImageTextKv } from "../models/qwen-image.ts";
import { type QwenImageVaeDecoder, toRgba8 } from "../models/qwen-image-vae.ts";
import { randnTensor, type TorchCpuCapability } from "../noise.ts";
import { flowDenoiser, noiseScaling, sampleEuler } from "../sampler.ts";
import { fluxSigmaTable, simpleSchedule } from "../schedule.ts";

/** "diffusers" (dynamic shift + terminal stretch; default) or "comfy" (fixed μ 0.69, "simple"). */
export type QwenImageSchedule = "diffusers" | "comfy";
export const QWEN_IMAGE_SCHEDULES: readonly QwenImageSchedule[] = ["diffusers", "comfy"];

/** ComfyUI's fixed flux shift for Qwen-Image-2.1 (qwen-image.md §7.2). */
export const QWEN_IMAGE_COMFY_SHIFT = 0.69;

/** Defaults (qwen-image.md §1, §15): 256² is the product's, 20 steps, cfg 1 (no guidance), seed 1. */
export const QWEN_IMAGE_DEFAULTS = {
  width: 256,
  height: 256,
  steps: 20,
  cfg: 1,
  seed: 1,
  schedule: "diffusers" as QwenImageSchedule,
} as const;

/** Pixel sides are floored to this (qwen-image.md §1: 16× VAE, even latent sides). */
export const QWEN_IMAGE_SIZE_MULTIPLE = 32;
export const QWEN_IMAGE_MIN_SIZE = 32;
/** TensorPencil's bound: 4096² is 65 536 image tokens. */
export const QWEN_IMAGE_MAX_SIZE = 4096;
export const QWEN_IMAGE_MAX_STEPS = 1000;

/** `scheduler/scheduler_config.json` fields the schedule uses (qwen-image.md §2.1). */
export interface QwenImageSchedulerConfig {
  readonly base_image_seq_len: number;
  readonly max_image_seq_len: number;
  readonly base_shift: number;
  readonly max_shift: number;
  readonly shift_terminal: number;
}

/** The published scheduler_config.json (qwen-image.md §2.1). */
export const QWEN_IMAGE_SCHEDULER: QwenImageSchedulerConfig = {
  base_image_seq_len: 256,
  max_image_seq_len: 8192,
  base_shift: 0.5,
  max_shift: 0.9,
  shift_terminal: 0.02,
};

/**
 * Read scheduler_config.json (absent fields: the published values).
 * @throws TpError E_FORMAT for unreadable JSON or non-numeric fields; E_UNSUPPORTED for a
 *   time_shift_type other than "exponential" or dynamic shifting turned off
 */
export function readQwenImageScheduler(path: string | undefined): QwenImageSchedulerConfig {
  if (path === undefined || !existsSync(path)) return QWEN_IMAGE_SCHEDULER;
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new TpError("E_FORMAT", `${path} is not readable JSON: ${(e as Error).message}`, { file: path });
  }
  if ((j.time_shift_type ?? "exponential") !== "exponential" || j.use_dynamic_shifting === false) {
    throw new TpError(
      "E_UNSUPPORTED",
      `${path}: only the exponential dynamic shift (Qwen-Image-2.1's) is implemented`,
      { file: path },
    );
  }
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(QWEN_IMAGE_SCHEDULER)) {
    const x = j[k] ?? v;
    if (typeof x !== "number" || !Number.isFinite(x)) {
      throw new TpError("E_FORMAT", `${path}: ${k} must be a number`, { file: path });
    }
    out[k] = x;
  }
  return out as unknown as QwenImageSchedulerConfig;
}

/**
 * The diffusers sigmas (qwen-image.md §7.1), in f64 then rounded to f32 as diffusers does:
 * μ linear in seq (not clamped), t_i = linspace(1, 1/N, N), s = e^μ/(e^μ + 1/t − 1), stretched so the
 * last is `shift_terminal`, then 0.
 * @param steps N ≥ 2 (N = 1 is 0/0 in the stretch)
 * @param seq   image tokens h·w
 * @returns Float32Array [N + 1]
 * @throws TpError E_ARG for N < 2 or a bad seq
 */
export function qwenImageSigmas(
  steps: number,
  seq: number,
  c: QwenImageSchedulerConfig = QWEN_IMAGE_SCHEDULER,
): Float32Array {
  if (!Number.isSafeInteger(steps) || steps < 2 || steps > QWEN_IMAGE_MAX_STEPS) {
    throw new TpError(
      "E_ARG",
      `the diffusers schedule takes 2 to ${QWEN_IMAGE_MAX_STEPS} steps (1 step divides 0 by 0 in its terminal stretch), got ${steps}; use --schedule comfy for 1`,
    );
  }
  if (!Number.isSafeInteger(seq) || seq < 1)
    throw new TpError("E_ARG", `seq must be a positive integer, got ${seq}`);
  const m = (c.max_shift - c.base_shift) / (c.max_image_seq_len - c.base_image_seq_len);
  const mu = c.base_shift + m * (seq - c.base_image_seq_len);
  const e = Math.exp(mu);
  const s: number[] = [];
  for (let i = 0; i < steps; i++) {
    const t = 1 + (i * (1 / steps - 1)) / (steps - 1);
    s.push(e / (e + (1 / t - 1)));
  }
  const k = (1 - (s[steps - 1] as number)) / (1 - c.shift_terminal);
  const out = new Float32Array(steps + 1);
  for (let i = 0; i < steps; i++) out[i] = 1 - (1 - (s[i] as number)) / k;
  out[steps] = 0;
  return out;
}

/** ComfyUI's sigmas (qwen-image.md §7.2): "simple" over the flux table with μ = 0.69. */
export function qwenImageComfySigmas(steps: number): Float32Array {
  return simpleSchedule(fluxSigmaTable(QWEN_IMAGE_COMFY_SHIFT, 10000), steps);
}

/** A size after flooring to multiples of 32, with the notice when it changed. */
export interface QwenImageSize {
  readonly width: number;
  readonly height: number;
  readonly latentWidth: number;
  readonly latentHeight: number;
  readonly notice?: string;
}

/**
 * Floor each side to a multiple of 32 (qwen-image.md §6).
 * @throws TpError E_ARG for non-integers; E_UNSUPPORTED outside 32 … 4096 pixels
 */
export function qwenImageSize(width: number, height: number): QwenImageSize {
  for (const [name, v] of [
    ["width", width],
    ["height", height],
  ] as const) {
    if (!Number.isSafeInteger(v))
      throw new TpError("E_ARG", `${name} must be a whole number of pixels, got ${v}`);
    if (v < QWEN_IMAGE_MIN_SIZE || v > QWEN_IMAGE_MAX_SIZE) {
      throw new TpError(
        "E_UNSUPPORTED",
        `${name} ${v} is outside the sizes Qwen-Image-2.1 runs at (${QWEN_IMAGE_MIN_SIZE} to ${QWEN_IMAGE_MAX_SIZE} pixels per side)`,
      );
    }
  }
  const m = QWEN_IMAGE_SIZE_MULTIPLE;
  const w = width - (width % m);
  const h = height - (height % m);
  const size = { width: w, height: h, latentWidth: w / 16, latentHeight: h / 16 };
  if (w === width && h === height) return size;
  return { ...size, notice: `size ${width}x${height} is not a multiple of 32: generating ${w}x${h}` };
}

/** What the step callback gets. */
export interface QwenImageStepInfo {
  readonly step: number;
  readonly steps: number;
  readonly sigma: number;
  /** The state after the step (valid during the callback). */
  readonly x: Tensor;
  /** This step's x0 estimate, [1, 64, h, w] (valid during the callback). */
  readonly denoised: Tensor;
  readonly stepMs: number;
  readonly elapsedMs: number;
}

/** Options of {@link generateQwenImage}. */
export interface QwenImageGenerateOptions {
  readonly dit: QwenImageDit;
  readonly vae: QwenImageVaeDecoder;
  /** Positive conditioning [1, L, context_in_dim]; `negative` is used only when cfg ≠ 1. */
  readonly positive: Conditioning | HostConditioning;
  readonly negative?: Conditioning | HostConditioning;
  readonly width?: number;
  readonly height?: number;
  readonly steps?: number;
  readonly cfg?: number;
  readonly seed?: number | bigint;
  readonly schedule?: QwenImageSchedule;
  /** The diffusers scheduler's config (default: the published one). */
  readonly scheduler?: QwenImageSchedulerConfig;
  readonly noiseKernel?: TorchCpuCapability;
  /** Compute each prompt's text K/V once (default true); false reruns the text rows every step. */
  readonly reuseTextKv?: boolean;
  /** A starting state instead of the seed's noise ([1, 64, h, w] f32, e.g. a saved step). */
  readonly initialNoise?: Float32Array;
  readonly onStep?: (info: QwenImageStepInfo) => void | Promise<void>;
  /** The text encoder's file, when it made the conditioning (scanned to explain a NaN / ∞ conditioning). */
  readonly textEncoderFile?: string;
}

/** The explanation of a failed stage check: the first of the files holding a NaN / ∞ weight. */
function weightsOf(what: string, path: string | undefined): () => string | undefined {
  return () => explainNonFiniteWeights([{ what, path }]);
}

/** The result of {@link generateQwenImage}. */
export interface QwenImageResult {
  readonly width: number;
  readonly height: number;
  readonly notice?: string;
  /** Interleaved 8-bit RGBA [height, width, 4] (ComfyUI's truncation). */
  readonly rgba: Uint8Array;
  /** Final latent in VAE space, [1, 64, h, w]. */
  readonly latent: Float32Array;
  readonly latentShape: readonly [number, number, number, number];
  /** Final latent in the sampler's space. */
  readonly modelLatent: Float32Array;
  readonly sigmas: Float32Array;
  readonly timings: {
    readonly textMs: number;
    readonly samplingMs: number;
    readonly stepMs: readonly number[];
    readonly decodeMs: number;
  };
}

/**
 * One image (see the module comment).
 * @throws TpError E_ARG / E_UNSUPPORTED for settings out of range, E_SHAPE for conditioning that does
 *   not fit the DiT, E_ARG when cfg ≠ 1 without a negative conditioning, E_NUMERIC naming the stage (conditioning,
 *   sampling step, VAE decode) whose result holds NaN or ∞, and the weight file that explains it
 */
export async function generateQwenImage(o: QwenImageGenerateOptions): Promise<QwenImageResult> {
  const d = QWEN_IMAGE_DEFAULTS;
  const b: Backend = o.dit.backend;
  const size = qwenImageSize(o.width ?? d.width, o.height ?? d.height);
  const steps = o.steps ?? d.steps;
  const cfg = o.cfg ?? d.cfg;
  const schedule = o.schedule ?? d.schedule;
  const h = size.latentHeight;
  const w = size.latentWidth;
  const sigmas =
    schedule === "comfy" ? qwenImageComfySigmas(steps) : qwenImageSigmas(steps, h * w, o.scheduler);
  const useCfg = Math.fround(cfg) !== 1;
  if (useCfg && o.negative === undefined) {
    throw new TpError("E_ARG", 'cfg ≠ 1 needs negative conditioning (encode a negative prompt, "" included)');
  }
  const C = o.dit.config.in_channels;
  using stack = new DisposableStack();
  const device = (c: Conditioning | HostConditioning, what: string): Tensor => {
    const cond = c instanceof Conditioning ? c : stack.use(Conditioning.upload(b, c, `${what} conditioning`));
    const [one, L, width] = cond.shape;
    if (one !== 1 || width !== o.dit.config.context_in_dim || L < 1) {
      throw new TpError(
        "E_SHAPE",
        `the ${what} conditioning is [${cond.shape.join(", ")}]; this DiT takes [1, seq ≥ 1, ${o.dit.config.context_in_dim}]`,
      );
    }
    return cond.tensor;
  };
  const pos = device(o.positive, "positive");
  const neg = useCfg ? device(o.negative as Conditioning | HostConditioning, "negative") : null;
  const teWeights = weightsOf("text encoder", o.textEncoderFile);
  await checkFinite(b, pos, { stage: "conditioning (positive)", explain: teWeights });
  if (neg) await checkFinite(b, neg, { stage: "conditioning (negative)", explain: teWeights });

  const t0 = performance.now();
  const reuse = o.reuseTextKv ?? true;
  const kvPos = reuse ? stack.use(o.dit.encodeText(pos)) : null;
  const kvNeg = reuse && neg ? stack.use(o.dit.encodeText(neg)) : null;
  const textMs = performance.now() - t0;

  const noiseHost = o.initialNoise;
  if (noiseHost !== undefined && noiseHost.length !== C * h * w) {
    throw new TpError(
      "E_SHAPE",
      `initial noise holds ${noiseHost.length} values, not 1 × ${C} × ${h} × ${w}`,
    );
  }
  using noise = noiseHost
    ? b.upload(noiseHost, [1, C, h, w], "f32", "initial noise")
    : randnTensor(b, o.seed ?? d.seed, [1, C, h, w], { capability: o.noiseKernel ?? "avx2" });
  using x0 = noiseScaling(b, noise, sigmas[0] as number);
  const denoiser = flowDenoiser(b, (x, sigma, cond) => {
    const text: Tensor | QwenImageTextKv = cond === "positive" ? (kvPos ?? pos) : (kvNeg ?? (neg as Tensor));
    return o.dit.forward(x, sigma, text);
  });
  const stepMs: number[] = [];
  const tS = performance.now();
  let tStep = tS;
  using final = await sampleEuler(b, x0, denoiser, {
    sigmas,
    cfg,
    onStep: async (s) => {
      await checkFinite(b, s.x, {
        stage: "sampling",
        step: s.step + 1,
        steps: s.steps,
        explain: weightsOf("transformer", o.dit.layout.path),
      });
      const now = performance.now();
      const dt = now - tStep;
      stepMs.push(dt);
      tStep = now;
      await o.onStep?.({
        step: s.step,
        steps: s.steps,
        sigma: s.sigma,
        x: s.x,
        denoised: s.denoised,
        stepMs: dt,
        elapsedMs: now - tS,
      });
    },
  });
  const samplingMs = performance.now() - tS;

  const tD = performance.now();
  const modelLatent = (await b.read(final)) as Float32Array;
  using z = o.vae.processOut(final);
  const latent = (await b.read(z)) as Float32Array;
  using raw = o.vae.decode(z);
  await checkFinite(b, raw, { stage: "VAE decode", explain: weightsOf("VAE", o.vae.file) });
  const px = (await b.read(raw)) as Float32Array;
  const rgba = toRgba8(px, size.height, size.width);
  const decodeMs = performance.now() - tD;
  return {
    width: size.width,
    height: size.height,
    ...(size.notice ? { notice: size.notice } : {}),
    rgba,
    latent,
    latentShape: [1, C, h, w],
    modelLatent,
    sigmas,
    timings: { textMs, samplingMs, stepMs, decodeMs },
  };
}

/**
 * Decode a saved VAE-space latent [1, 64, h, w] to 8-bit RGBA.
 * @throws TpError E_SHAPE for another shape
 */
export async function decodeQwenImageLatent(
  vae: QwenImageVaeDecoder,
  latent: { readonly data: Float32Array; readonly shape: readonly number[] },
): Promise<{ width: number; height: number; rgba: Uint8Array }> {
  const b = vae.backend;
  const s = latent.shape;
  const z4 = s.length === 5 ? [s[0], s[1], s[3], s[4]] : [...s];
  if (z4.length !== 4 || z4[0] !== 1 || z4[1] !== vae.config.z_dim) {
    throw new TpError(
      "E_SHAPE",
      `a Qwen-Image-2.1 latent is [1, ${vae.config.z_dim}, h, w], got [${s.join(", ")}]`,
    );
  }
  using z = b.upload(latent.data, z4 as number[], "f32", "latent");
  using raw = vae.decode(z);
  const px = (await b.read(raw)) as Float32Array;
  const height = raw.shape[2] as number;
  const width = raw.shape[3] as number;
  return { width, height, rgba: toRgba8(px, height, width) };
}

/** The RGB channels of interleaved RGBA (for front ends that show RGB only). */
export function rgbOf(rgba: Uint8Array): Uint8Array {
  const n = rgba.length / 4;
  const rgb = new Uint8Array(n * 3);
  for (let i = 0; i < n; i++) {
    rgb[i * 3] = rgba[i * 4] as number;
    rgb[i * 3 + 1] = rgba[i * 4 + 1] as number;
    rgb[i * 3 + 2] = rgba[i * 4 + 2] as number;
  }
  return rgb;
}
