/**
 * The Krea 2 text-to-image pipeline (../shared/spec/krea2.md §6.1): conditioning → noise from the seed →
 * the Euler/CFG loop over the DiT → latent de-normalization → Wan 2.1 VAE decode → 8-bit RGB, as
 * ComfyUI's KSampler + VAEDecode + SaveImage compute it. The text encoder is a pluggable step
 * ({@link PromptEncoder}): {@link generateKrea2} takes conditioning (device tensors from an encoder, or
 * a saved `--cond-in` file's host values), not text. The registry row that runs it from files is
 * krea2-pipeline.ts.
 *
 * Sources: krea2.md §2.6 (negative conditioning), §4 (schedule, sampler, noise), §5.2 and §5.5 (VAE
 * space, 8 bits), §6.2–6.3 (sizes, defaults); ComfyUI nodes.py `KSampler`, `EmptyLatentImage`,
 * `ConditioningZeroOut`, `VAEDecode`, `SaveImage`.
 */
import { explainNonFiniteWeights } from "@tp/formats";
import {
  type Backend,
  checkFinite,
  checkFiniteHost,
  type ResidencyPlan,
  type Tensor,
  TpError,
  type VramBudget,
} from "@tp/tensor";
import { Conditioning, type HostConditioning, type PromptEncoder } from "../conditioning.ts";
import type { Krea2Config, Krea2Dit } from "../models/krea2.ts";
import { KREA2_MAX_TEXT_TOKENS } from "../models/krea2-text.ts";
import { toRgb8, type WanVaeDecodeOptions, type WanVaeDecoder, wan21ProcessOut } from "../models/wan-vae.ts";
import { randnTensor, type TorchCpuCapability } from "../noise.ts";
import { placeWeights } from "../residency.ts";
import { type CondKind, flowDenoiser, noiseScaling, type StepInfo, sampleEuler } from "../sampler.ts";
import { AURAFLOW_MAX_SHIFT, FLUX_MAX_SHIFT, KREA2_SHIFT, krea2Sigmas } from "../schedule.ts";

/** Sigma schedule of a run: "simple" over Krea 2's own flux-shift table, or over the AuraFlow table. */
export type Krea2Schedule = "simple" | "auraflow";

/** The schedules of {@link Krea2Schedule}, for messages and flag checks. */
export const KREA2_SCHEDULES: readonly Krea2Schedule[] = ["simple", "auraflow"];

/**
 * Defaults of a Krea 2 run (krea2.md §6.3, the Krea 2 Turbo guidance and TensorPencil's CLI): 8 Euler
 * steps on the "simple" schedule with flux shift μ = 1.15, cfg 1 (no negative pass), seed 0, 1024².
 */
export const KREA2_DEFAULTS = {
  width: 1024,
  height: 1024,
  steps: 8,
  cfg: 1,
  seed: 0,
  shift: KREA2_SHIFT,
  schedule: "simple" as Krea2Schedule,
} as const;

/** Smallest and largest image side in pixels (ComfyUI's `EmptyLatentImage` allows 16 … 16384). */
export const KREA2_MIN_SIZE = 16;
export const KREA2_MAX_SIZE = 16384;
/** Pixels per latent cell of the Wan 2.1 VAE. */
const VAE_SCALE = 8;
/**
 * Most Euler steps of a run (TensorPencil's bound; ComfyUI allows 10000). The AuraFlow table has 1000
 * entries, so more steps would only repeat sigmas; Krea 2 Turbo takes 8.
 */
export const KREA2_MAX_STEPS = 1000;
/**
 * The largest shift a schedule takes before its float32 table overflows (see schedule.ts): "simple"
 * (flux μ, used as e^μ) ln(f32 max) ≈ 88.72; "auraflow" the f32 max ≈ 3.4e38.
 */
export function krea2MaxShift(schedule: Krea2Schedule): number {
  return schedule === "auraflow" ? AURAFLOW_MAX_SHIFT : FLUX_MAX_SHIFT;
}

// ---------------------------------------------------------------------------------------------------
// Conditioning

/**
 * What a run is conditioned on: device {@link Conditioning} (a text encoder's output, used in place)
 * or {@link HostConditioning} (a saved file's, uploaded once). `negative` is used only when cfg ≠ 1:
 * an encoded negative prompt (`""` included) or `"zero"`, ComfyUI's `ConditioningZeroOut(positive)`
 * (zeros of the positive's shape — the official Krea 2 workflow's negative; the default). The caller
 * keeps ownership of device conditioning.
 */
export interface Krea2ConditioningInput {
  readonly positive: Conditioning | HostConditioning;
  readonly negative?: Conditioning | HostConditioning | "zero";
}

/**
 * Run a text encoder for a positive prompt and, when given, a negative prompt text (krea2.md §6.1 step
 * 1–2). Without `negative` the negative slot is `"zero"` (ComfyUI's ConditioningZeroOut).
 * @param encoder  see {@link PromptEncoder}
 * @param prompts  `prompt`, and `negative` (a text, `""` included) or undefined
 * @returns device conditioning for {@link generateKrea2}, owned by the caller
 */
export async function encodeKrea2Prompts(
  encoder: PromptEncoder,
  prompts: { readonly prompt: string; readonly negative?: string },
): Promise<{ readonly positive: Conditioning; readonly negative: Conditioning | "zero" }> {
  const positive = await encoder.encode(prompts.prompt);
  if (prompts.negative === undefined) return { positive, negative: "zero" };
  try {
    return { positive, negative: await encoder.encode(prompts.negative) };
  } catch (e) {
    positive.dispose();
    throw e;
  }
}

/**
 * Check that a conditioning (device or host) fits a DiT: `[1, seq, txtlayers·txtdim]` with 1 ≤ seq ≤
 * {@link KREA2_MAX_TEXT_TOKENS} and, on the host, matching data length.
 * @param dit   a loaded DiT, or just its config ({@link readKrea2DitConfig}: check before loading)
 * @param what  which one, for the message ("the positive", "the negative")
 * @throws TpError E_SHAPE saying what the DiT takes
 */
export function checkKrea2Conditioning(
  c: { readonly shape: readonly number[]; readonly data?: Float32Array },
  dit: { readonly config: Pick<Krea2Config, "txtlayers" | "txtdim"> },
  what = "the",
): void {
  const width = dit.config.txtlayers * dit.config.txtdim;
  const [b, s, f] = c.shape as readonly [number, number, number];
  if (c.shape.length !== 3 || b !== 1 || !(s >= 1) || f !== width) {
    throw new TpError(
      "E_SHAPE",
      `${what} conditioning is [${c.shape.join(", ")}]; this DiT takes [1, seq ≥ 1, ${dit.config.txtlayers}×${dit.config.txtdim} = ${width}] (${dit.config.txtlayers} tapped text-encoder layers of width ${dit.config.txtdim})`,
    );
  }
  if (s > KREA2_MAX_TEXT_TOKENS) {
    throw new TpError(
      "E_SHAPE",
      `${what} conditioning has ${s} tokens; Krea 2 runs take at most ${KREA2_MAX_TEXT_TOKENS}`,
    );
  }
  if (c.data !== undefined && c.data.length !== b * s * f) {
    throw new TpError("E_SHAPE", `${what} conditioning holds ${c.data.length} values, not 1 × ${s} × ${f}`);
  }
}

// ---------------------------------------------------------------------------------------------------
// Sizes

/** An image size after {@link krea2Size}: pixels, latent cells, and the notice when it was rounded. */
export interface Krea2Size {
  readonly width: number;
  readonly height: number;
  /** Latent width and height (pixels / 8). */
  readonly latentWidth: number;
  readonly latentHeight: number;
  /** Set when the requested size was rounded down: one line for the user. */
  readonly notice?: string;
}

/**
 * The image size ComfyUI would make for a requested one (krea2.md §6.2): each side floored to a
 * multiple of 8 (`EmptyLatentImage` makes a latent of ⌊W/8⌋ × ⌊H/8⌋); odd latent sides are fine (the
 * DiT pads them circularly). Returns a notice when the size changed.
 * @param width,height requested pixels, integers
 * @throws TpError E_ARG for non-integers; E_UNSUPPORTED for a side outside 16 … 16384 pixels
 */
export function krea2Size(width: number, height: number): Krea2Size {
  for (const [name, v] of [
    ["width", width],
    ["height", height],
  ] as const) {
    if (!Number.isSafeInteger(v)) {
      throw new TpError("E_ARG", `${name} must be a whole number of pixels, got ${v}`);
    }
    if (v < KREA2_MIN_SIZE || v > KREA2_MAX_SIZE) {
      throw new TpError(
        "E_UNSUPPORTED",
        `${name} ${v} is outside the sizes Krea 2 runs at (${KREA2_MIN_SIZE} to ${KREA2_MAX_SIZE} pixels per side)`,
      );
    }
  }
  const w = width - (width % VAE_SCALE);
  const h = height - (height % VAE_SCALE);
  const size = { width: w, height: h, latentWidth: w / VAE_SCALE, latentHeight: h / VAE_SCALE };
  if (w === width && h === height) return size;
  return {
    ...size,
    notice: `size ${width}x${height} is not a multiple of 8: generating ${w}x${h} (latent ${w / VAE_SCALE}x${h / VAE_SCALE}), as ComfyUI does`,
  };
}

// ---------------------------------------------------------------------------------------------------
// Generation

/** What {@link generateKrea2}'s progress callback gets after each step. */
export interface Krea2StepInfo extends StepInfo {
  /** Milliseconds this step took (its one or two DiT forwards and the Euler update). */
  readonly stepMs: number;
  /** Milliseconds since sampling began. */
  readonly elapsedMs: number;
}

/** Options of {@link generateKrea2}. Every number has the default of {@link KREA2_DEFAULTS}. */
export interface Krea2GenerateOptions {
  /** The DiT (see `loadKrea2`); its backend is the one everything runs on. */
  readonly dit: Krea2Dit;
  /** The Wan 2.1 VAE decoder (see `loadWanVae`), on the same backend. */
  readonly vae: WanVaeDecoder;
  /** Positive and (for cfg ≠ 1) negative conditioning. */
  readonly conditioning: Krea2ConditioningInput;
  /** Pixels; floored to multiples of 8 (see {@link krea2Size}). */
  readonly width?: number;
  readonly height?: number;
  /** Euler steps ≥ 1. */
  readonly steps?: number;
  /** Guidance scale; exactly 1 skips the negative pass. */
  readonly cfg?: number;
  /** Noise seed, an integer in [0, 2^64) (torch uses the low 32 bits). */
  readonly seed?: number | bigint;
  /** Shift: μ of the flux table ("simple") or the AuraFlow shift ("auraflow"). */
  readonly shift?: number;
  /** See {@link Krea2Schedule}. */
  readonly schedule?: Krea2Schedule;
  /**
   * Which torch CPU kernel the noise reproduces (see noise.ts): "avx2" (default; ComfyUI on an x86 PC)
   * or "default" (torch without AVX2, e.g. Arm Macs).
   */
  readonly noiseKernel?: TorchCpuCapability;
  /** VAE decode options (tiling); default a whole-image decode, as ComfyUI. */
  readonly vaeDecode?: WanVaeDecodeOptions;
  /** Called after every step, awaited. */
  readonly onStep?: (info: Krea2StepInfo) => void | Promise<void>;
  /**
   * The text encoder's file, when it made the conditioning: scanned for the NaN / ∞ weight that
   * explains a non-finite conditioning (the DiT's and VAE's files come from the models).
   */
  readonly textEncoderFile?: string;
  /**
   * Device memory budget for everything the backend allocates from the first sampling step on (bytes,
   * or `"min"`: every DiT weight streamed): a dry run of one step counts the working peak, the
   * residency planner keeps what fits resident, the rest is copied from the mapping per use. Default:
   * no planning (the backend's own budget, weights streamed as the backend does by default).
   * @see placeWeights in ../residency.ts
   */
  readonly vramBudget?: VramBudget;
  /** Called with the residency plan (vramBudget only), before the first step. */
  readonly onResidencyPlan?: (plan: ResidencyPlan) => void;
}

/** The explanation of a failed stage check: the first of `files` holding a NaN / ∞ weight. */
function weightsOf(...files: { what: string; path: string | undefined }[]): () => string | undefined {
  return () => explainNonFiniteWeights(files);
}

/** Milliseconds spent in each stage of {@link generateKrea2}. */
export interface Krea2Timings {
  /** Text side of the DiT (`encodeText`: text fusion + txtmlp), once per conditioning. */
  readonly textMs: number;
  /** The whole sampling loop. */
  readonly samplingMs: number;
  /** Each step. */
  readonly stepMs: readonly number[];
  /** Latent de-normalization, VAE decode and conversion to 8 bits. */
  readonly decodeMs: number;
  /** Everything. */
  readonly totalMs: number;
}

/** The result of {@link generateKrea2}. */
export interface Krea2Result {
  /** Image size in pixels (after rounding). */
  readonly width: number;
  readonly height: number;
  /** The rounding notice of {@link krea2Size}, when the size changed. */
  readonly notice?: string;
  /** Interleaved 8-bit RGB, [height, width, 3] (ComfyUI's truncation, krea2.md §5.5). */
  readonly rgb: Uint8Array;
  /** Shape of the latents: [1, 16, 1, height/8, width/8]. */
  readonly latentShape: readonly [number, number, number, number, number];
  /** Final latent in VAE space (x·std + mean, what the VAE decodes and `--latent-out` saves). */
  readonly latent: Float32Array;
  /** Final latent in the sampler's (normalized) space. */
  readonly modelLatent: Float32Array;
  /** The sigmas the run used (steps + 1, ending in 0). */
  readonly sigmas: Float32Array;
  /** The settings after defaults, for metadata. */
  readonly settings: {
    readonly steps: number;
    readonly cfg: number;
    readonly seed: bigint;
    readonly shift: number;
    readonly schedule: Krea2Schedule;
    /** "none" (cfg = 1), "zero" (ConditioningZeroOut) or "text" (an encoded negative). */
    readonly negative: "none" | "zero" | "text";
  };
  readonly timings: Krea2Timings;
}

/** The settings of {@link Krea2GenerateOptions} with defaults applied and checked. */
function settingsOf(o: Krea2GenerateOptions): Krea2Result["settings"] {
  const steps = o.steps ?? KREA2_DEFAULTS.steps;
  if (!Number.isSafeInteger(steps) || steps < 1 || steps > KREA2_MAX_STEPS) {
    throw new TpError("E_ARG", `steps must be an integer from 1 to ${KREA2_MAX_STEPS}, got ${steps}`);
  }
  const cfg = o.cfg ?? KREA2_DEFAULTS.cfg;
  if (!Number.isFinite(cfg)) throw new TpError("E_ARG", `cfg must be a finite number, got ${cfg}`);
  const schedule = o.schedule ?? KREA2_DEFAULTS.schedule;
  if (!KREA2_SCHEDULES.includes(schedule)) {
    throw new TpError(
      "E_ARG",
      `unknown schedule '${schedule}'; expected one of: ${KREA2_SCHEDULES.join(", ")}`,
    );
  }
  const shift = o.shift ?? KREA2_DEFAULTS.shift;
  if (!Number.isFinite(shift) || shift <= 0 || shift > krea2MaxShift(schedule)) {
    throw new TpError(
      "E_ARG",
      `shift must be a positive number up to ${krea2MaxShift(schedule)} for the ${schedule} schedule, got ${shift}`,
    );
  }
  const raw = o.seed ?? KREA2_DEFAULTS.seed;
  const ok = typeof raw === "bigint" ? raw >= 0n && raw < 2n ** 64n : Number.isSafeInteger(raw) && raw >= 0;
  if (!ok) throw new TpError("E_ARG", `seed must be an integer in [0, 2^64), got ${String(raw)}`);
  const negative =
    Math.fround(cfg) === 1 ? "none" : (o.conditioning.negative ?? "zero") === "zero" ? "zero" : "text";
  return { steps, cfg, seed: BigInt(raw), shift, schedule, negative };
}

/**
 * Generate one Krea 2 image (krea2.md §6.1 steps 3–5): seeded torch-exact noise `[1, 16, 1, h, w]`,
 * the sigma schedule, Euler with CFG over the DiT (one forward per step when cfg = 1, two otherwise;
 * the text side of the DiT runs once per conditioning), de-normalization to VAE space, the VAE decode
 * and ComfyUI's 8-bit conversion. Everything runs on the DiT's backend; the only host reads are the
 * final latent and image, and the 4-byte non-finite counts of the stage checks (the conditioning,
 * each step's latent, the decoded image: `count_nonfinite` on the device).
 * @returns image, latents, sigmas, settings and stage timings (see {@link Krea2Result})
 * @throws TpError E_ARG for a bad setting; E_UNSUPPORTED for a size out of range; E_SHAPE when the
 *   conditioning does not fit the DiT or the VAE's latent channels differ from the DiT's; E_STATE when
 *   the VAE lives on another backend; E_OOM from the backend; E_NUMERIC naming the stage (and step)
 *   whose result holds NaN or ∞, and the first weight of the text encoder, DiT or VAE file holding one
 * Source: ComfyUI `KSampler` (euler, simple | ModelSamplingAuraFlow), `ConditioningZeroOut`,
 *   `VAEDecode`, `SaveImage`.
 */
export async function generateKrea2(options: Krea2GenerateOptions): Promise<Krea2Result> {
  const t0 = performance.now();
  const { dit, vae } = options;
  const b = dit.backend;
  if (vae.backend !== b) {
    throw new TpError("E_STATE", `the VAE runs on backend '${vae.backend.name}', the DiT on '${b.name}'`);
  }
  if (vae.config.z_dim !== dit.config.channels) {
    throw new TpError(
      "E_SHAPE",
      `the VAE has ${vae.config.z_dim} latent channels, the DiT ${dit.config.channels}; Krea 2 needs the 16-channel Wan 2.1 VAE`,
    );
  }
  if (vae.config.scale !== VAE_SCALE) {
    throw new TpError(
      "E_SHAPE",
      `the VAE upsamples ${vae.config.scale}×; Krea 2 latents are 1/${VAE_SCALE} of the image (the Wan 2.1 VAE)`,
    );
  }
  const size = krea2Size(options.width ?? KREA2_DEFAULTS.width, options.height ?? KREA2_DEFAULTS.height);
  const settings = settingsOf(options);
  const cond = options.conditioning;
  checkKrea2Conditioning(cond.positive, dit, "the positive");
  if (settings.negative === "text")
    checkKrea2Conditioning(cond.negative as HostConditioning, dit, "the negative");
  const sigmas = krea2Sigmas(settings.steps, {
    sampling: settings.schedule === "auraflow" ? "auraflow" : "flux",
    shift: settings.shift,
  });
  const latentShape = [1, dit.config.channels, 1, size.latentHeight, size.latentWidth] as const;

  // Text side of the DiT, once per conditioning (krea2.md §3.6: it depends on the prompt only).
  const tText = performance.now();
  // Host conditioning is uploaded here and freed at the end; device conditioning stays the caller's.
  using posUpload = uploadIfHost(b, cond.positive, "conditioning (positive)");
  const positive = posUpload ?? (cond.positive as Conditioning);
  using posTxt = dit.encodeText(positive.tensor);
  using negUpload =
    settings.negative === "none"
      ? null
      : settings.negative === "zero"
        ? positive.zeros()
        : uploadIfHost(b, cond.negative as Conditioning | HostConditioning, "conditioning (negative, text)");
  const negative = settings.negative === "none" ? null : (negUpload ?? (cond.negative as Conditioning));
  const teWeights = weightsOf({ what: "text encoder", path: options.textEncoderFile });
  await checkFinite(b, positive.tensor, { stage: "conditioning (positive)", explain: teWeights });
  if (settings.negative === "text" && negative !== null)
    await checkFinite(b, negative.tensor, { stage: "conditioning (negative)", explain: teWeights });
  using negTxt = negative === null ? null : dit.encodeText(negative.tensor);
  const txt: Record<CondKind, Tensor | null> = { positive: posTxt, negative: negTxt };
  const textMs = performance.now() - tText;

  // Noise (krea2.md §4.3–4.4) and the Euler/CFG loop (§4.2).
  const tSample = performance.now();
  using noise = randnTensor(b, settings.seed, [...latentShape], {
    capability: options.noiseKernel ?? "avx2",
  });
  using x0 = noiseScaling(b, noise, sigmas[0] as number);
  const denoiser = flowDenoiser(b, (x, sigma, kind) =>
    dit.forward(x, sigma, null, { txt: txt[kind] as Tensor }),
  );
  const stepMs: number[] = [];
  const checkStep = (info: StepInfo) =>
    checkFinite(b, info.x, {
      stage: "sampling",
      step: info.step + 1,
      steps: info.steps,
      explain: weightsOf({ what: "DiT", path: dit.file }),
    });
  /** To VAE space (§5.2) and decode (§5): z and the image, the caller's to free (freed on failure). */
  const decode = async (latentModel: Tensor): Promise<{ z: Tensor; img: Tensor }> => {
    const z = wan21ProcessOut(b, latentModel);
    let img: Tensor | null = null;
    try {
      img = vae.decode(z, options.vaeDecode);
      await checkFinite(b, img, { stage: "VAE decode", explain: weightsOf({ what: "VAE", path: vae.file }) });
      return { z, img };
    } catch (e) {
      if (img !== null) b.free(img);
      b.free(z);
      throw e;
    }
  };
  // Under a budget: one dry step exactly as the loop runs it (same shapes, CFG, check) counts the peak,
  // and one dry decode (of the noise, with a latent-sized tensor held as the sampled latent will be)
  // the decode's.
  const placement =
    options.vramBudget === undefined
      ? null
      : await placeWeights(
          b,
          dit.samplingWeights(),
          options.vramBudget,
          async () => {
            const dry = await sampleEuler(b, x0, denoiser, {
              sigmas: [sigmas[0] as number, sigmas[1] as number],
              cfg: settings.cfg,
              onStep: checkStep,
            });
            b.free(dry);
          },
          "--vram-budget",
          async () => {
            using held = b.copy(x0);
            const dry = await decode(held);
            b.free(dry.z);
            b.free(dry.img);
          },
        );
  try {
    if (placement !== null) options.onResidencyPlan?.(placement.plan);
    let lastStep = performance.now();
    using latentModel = await sampleEuler(b, x0, denoiser, {
      sigmas,
      cfg: settings.cfg,
      onStep: async (info) => {
        await checkStep(info);
        const now = performance.now();
        stepMs.push(now - lastStep);
        if (options.onStep) {
          await options.onStep({ ...info, stepMs: now - lastStep, elapsedMs: now - tSample });
        }
        lastStep = performance.now();
      },
    });
    const samplingMs = performance.now() - tSample;
    placement?.evict(); // the VAE decodes under the same budget, without the DiT's resident weights

    // To VAE space (§5.2), decode (§5), 8 bits (§5.5).
    const tDecode = performance.now();
    const decoded = await decode(latentModel);
    using z = decoded.z;
    using img = decoded.img;
    const modelLatent = (await b.read(latentModel)) as Float32Array;
    const latent = (await b.read(z)) as Float32Array;
    const raw = (await b.read(img)) as Float32Array;
    const rgb = toRgb8(raw, size.height, size.width);
    const decodeMs = performance.now() - tDecode;

    return {
      width: size.width,
      height: size.height,
      ...(size.notice === undefined ? {} : { notice: size.notice }),
      rgb,
      latentShape,
      latent,
      modelLatent,
      sigmas,
      settings,
      timings: { textMs, samplingMs, stepMs, decodeMs, totalMs: performance.now() - t0 },
    };
  } finally {
    placement?.restore();
  }
}

/**
 * Host conditioning uploaded to `b` (the caller frees it), or null for device conditioning on `b`.
 * @throws TpError E_STATE when device conditioning lives on another backend
 */
function uploadIfHost(b: Backend, c: Conditioning | HostConditioning, name: string): Conditioning | null {
  if (!(c instanceof Conditioning)) return Conditioning.upload(b, c, name);
  if (c.backend !== b) {
    throw new TpError("E_STATE", `${name} lives on backend '${c.backend.name}', the DiT on '${b.name}'`);
  }
  return null;
}

/**
 * Check a Krea 2 latent's shape before any work: `[1, 16, 1, h, w]` (or `[1, 16, h, w]`) whose image,
 * 8h × 8w, is within {@link KREA2_MIN_SIZE} … {@link KREA2_MAX_SIZE} pixels per side, as generate makes
 * them; `values`, when given, must fill the shape.
 * @param where the file and tensor, for the message
 * @throws TpError E_SHAPE naming them
 */
export function checkKrea2Latent(
  shape: readonly number[],
  values?: number,
  where: { readonly file?: string; readonly tensor?: string } = {},
  channels = 16,
): void {
  const s = shape;
  const ok = (s.length === 5 && s[2] === 1) || s.length === 4;
  const expected = `[1, ${channels}, 1, h, w] f32 with h and w from ${KREA2_MIN_SIZE / VAE_SCALE} to ${KREA2_MAX_SIZE / VAE_SCALE} (images of ${KREA2_MIN_SIZE} to ${KREA2_MAX_SIZE} pixels per side)`;
  const h = s[s.length - 2] as number;
  const w = s[s.length - 1] as number;
  const inRange = (v: number) =>
    Number.isSafeInteger(v) && v * VAE_SCALE >= KREA2_MIN_SIZE && v * VAE_SCALE <= KREA2_MAX_SIZE;
  if (!ok || s[0] !== 1 || s[1] !== channels || !inRange(h) || !inRange(w)) {
    throw new TpError("E_SHAPE", `the latent is [${s.join(", ")}]; Krea 2 decodes ${expected}`, where);
  }
  if (values !== undefined && values !== s.reduce((a, v) => a * v, 1)) {
    throw new TpError("E_SHAPE", `the latent holds ${values} values, not [${s.join(", ")}]`, where);
  }
}

/**
 * Decode a latent in VAE space (what {@link Krea2Result.latent} holds and `--latent-out` saves) to
 * 8-bit RGB: the VAE decode and ComfyUI's truncation (krea2.md §5, §5.5).
 * @param vae    a Wan 2.1 decoder
 * @param latent f32 `[1, 16, 1, h, w]` (or `[1, 16, h, w]`) in VAE space
 * @returns interleaved RGB8 `[8h, 8w, 3]` and its size
 * @throws TpError E_SHAPE for a latent of another shape or channel count, or a size out of range
 *   ({@link checkKrea2Latent}); E_NUMERIC when the latent or the decoded image holds NaN or ∞ (the
 *   latter naming the VAE's first non-finite weight)
 */
export async function decodeKrea2Latent(
  vae: WanVaeDecoder,
  latent: { readonly data: Float32Array; readonly shape: readonly number[] },
  options: WanVaeDecodeOptions = {},
): Promise<{ width: number; height: number; rgb: Uint8Array }> {
  const s = latent.shape;
  checkKrea2Latent(s, latent.data.length, {}, vae.config.z_dim);
  checkFiniteHost(latent.data, { stage: "the latent to decode" });
  const b = vae.backend;
  const k = vae.config.scale;
  const h = s[s.length - 2] as number;
  const w = s[s.length - 1] as number;
  using z = b.upload(latent.data, [...s], "f32", "latent");
  using img = vae.decode(z, options);
  await checkFinite(b, img, { stage: "VAE decode", explain: weightsOf({ what: "VAE", path: vae.file }) });
  const raw = (await b.read(img)) as Float32Array;
  return { width: w * k, height: h * k, rgb: toRgb8(raw, h * k, w * k) };
}

// ---------------------------------------------------------------------------------------------------
// Metadata

/** What {@link krea2Parameters} writes into the PNG's `parameters` text. */
export interface Krea2ParameterText {
  readonly prompt: string;
  /** The negative prompt text (omitted when undefined or empty). */
  readonly negative?: string;
  readonly steps: number;
  readonly cfg: number;
  readonly seed: bigint | number;
  readonly width: number;
  readonly height: number;
  readonly shift: number;
  readonly schedule: Krea2Schedule;
  /** "none", "zero" (ConditioningZeroOut) or "text". */
  readonly negativeMode?: "none" | "zero" | "text";
  /** The DiT's file name stem. */
  readonly model?: string;
  /** The VAE's file name stem. */
  readonly vae?: string;
}

/** AUTOMATIC1111's `quote`: values with `,`, `:` or a newline become JSON strings. */
function quoteA1111(v: string): string {
  return /[,:\n"]/.test(v) ? JSON.stringify(v) : v;
}

/**
 * Generation parameters in AUTOMATIC1111's `parameters` format, which image viewers and tools (A1111,
 * Forge, InvokeAI's importer, Civitai, exiftool) read:
 * `<prompt>\n[Negative prompt: <neg>\n]Steps: N, Sampler: Euler, Schedule type: Simple, CFG scale: C,
 * Seed: S, Size: WxH, Model: <stem>, …` (krea2.md §6.5; A1111 modules/processing.py
 * `create_infotext`, values quoted by `generation_parameters_copypaste.quote`).
 */
export function krea2Parameters(p: Krea2ParameterText): string {
  const fields: [string, string][] = [
    ["Steps", String(p.steps)],
    ["Sampler", "Euler"],
    ["Schedule type", p.schedule === "auraflow" ? "Simple (AuraFlow shift)" : "Simple"],
    ["CFG scale", Number.isInteger(p.cfg) ? p.cfg.toFixed(1) : String(p.cfg)],
    ["Seed", String(p.seed)],
    ["Size", `${p.width}x${p.height}`],
    ["Shift", String(p.shift)],
  ];
  if (p.negativeMode === "zero") fields.push(["Negative", "ConditioningZeroOut"]);
  if (p.model) fields.push(["Model", p.model]);
  if (p.vae) fields.push(["VAE", p.vae]);
  fields.push(["Version", "TensorPencil"]);
  const line = fields.map(([k, v]) => `${k}: ${quoteA1111(v)}`).join(", ");
  const neg = p.negative ? `Negative prompt: ${p.negative}\n` : "";
  return `${p.prompt}\n${neg}${line}`;
}
