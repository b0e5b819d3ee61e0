/**
 * What a text-to-image pipeline offers a front end (the CLI, a server): its defaults and limits,
 * `generate(options, progress)` from checkpoint files to an 8-bit image with its timings and PNG text,
 * `load` (the networks resident for many images), and the `encode` (prompt → conditioning file) and
 * `decode` (latent file → image) steps. One object
 * per model family, registered in registry.ts by the checkpoint layout its DiT file has
 * (@tp/formats `identifyCheckpoint`), as ComfyUI's `supported_models.py` maps a state dict to a model.
 *
 * Types only; Krea 2's implementation is pipelines/krea2-pipeline.ts.
 */
import type { LayoutKind } from "@tp/formats";
import type { WeightQuantizer } from "@tp/quant";
import type { Backend, VramBudget } from "@tp/tensor";
import type { HostConditioning } from "./conditioning.ts";
import type { TorchCpuCapability } from "./noise.ts";

/** One checkpoint kind a pipeline takes, for lookups and messages. */
export interface PipelineComponent {
  /** The kind @tp/formats' `identifyCheckpoint` reports for the file. */
  readonly layout: LayoutKind;
  /** What it is, for messages: "Krea 2 DiT", "the Wan 2.1 / Qwen-Image VAE". */
  readonly what: string;
  /** The tensors that identify it, for messages: "blocks.0.mod.lin + txtfusion.projector.weight". */
  readonly signature: string;
}

/** Defaults of a run (what a front end uses for an absent flag). */
export interface PipelineDefaults {
  /** Pixels. */
  readonly width: number;
  readonly height: number;
  readonly steps: number;
  /** Guidance scale; 1 is no negative pass. */
  readonly cfg: number;
  readonly seed: number;
  /** Sampler shift (the schedule's own unit: flux μ for Krea 2's "simple"). */
  readonly shift: number;
  readonly schedule: string;
  readonly ditMode: string;
  readonly textEncoderMode: string;
}

/** What a pipeline accepts; anything outside is an E_ARG / E_UNSUPPORTED before any work. */
export interface PipelineLimits {
  /** Smallest and largest image side in pixels. */
  readonly minSize: number;
  readonly maxSize: number;
  /** Sides are floored to a multiple of this (the VAE's scale × the DiT's patch, or the VAE's alone). */
  readonly sizeMultiple: number;
  readonly maxSteps: number;
  readonly schedules: readonly string[];
  /** The largest shift a schedule takes (its float32 table overflows above it). */
  maxShift(schedule: string): number;
  readonly ditModes: readonly string[];
  readonly textEncoderModes: readonly string[];
  readonly noiseKernels: readonly TorchCpuCapability[];
}

/** The files of a run. */
export interface PipelineFiles {
  /** The diffusion model (DiT) checkpoint: the file the pipeline was found by. */
  readonly dit: string;
  readonly vae: string;
  /** The text encoder; needed unless `condIn` holds the conditioning (and no negative must be encoded). */
  readonly textEncoder?: string;
  /** Saved conditioning (a file `encode` or `--cond-out` wrote). */
  readonly condIn?: string;
}

/** The settings of one image; absent numbers take {@link PipelineDefaults}. */
export interface ImageRequest {
  /** The prompt; with saved conditioning it defaults to the one saved there. */
  readonly prompt?: string;
  /** A negative prompt (used only when cfg ≠ 1). */
  readonly negative?: string;
  readonly width?: number;
  readonly height?: number;
  readonly steps?: number;
  readonly cfg?: number;
  /** An integer in [0, 2^64). */
  readonly seed?: bigint;
  readonly shift?: number;
  readonly schedule?: string;
  /** Which torch CPU randn kernel the noise reproduces (default "avx2"). */
  readonly noise?: TorchCpuCapability;
  /** Decode the image in overlapping tiles (changes pixels near seams). */
  readonly vaeTiled?: boolean;
  /** Return the conditioning on the host too (to save it: `--cond-out`). */
  readonly keepConditioning?: boolean;
  /** Read each step's x0 estimate back to the host and pass it in the "step" event (a live preview). */
  readonly preview?: boolean;
  /**
   * Device memory budget from the first sampling step on (bytes, or "min": every DiT weight streamed);
   * the residency plan is reported as a notice. Krea 2 on a device backend; elsewhere E_UNSUPPORTED.
   */
  readonly vramBudget?: VramBudget;
}

/** Options of {@link DiffusionPipeline.generate}: files, backend and modes, and the image's settings. */
export interface GenerateOptions extends ImageRequest {
  readonly files: PipelineFiles;
  /** Where everything runs. */
  readonly backend: Backend;
  readonly ditMode?: string;
  readonly textEncoderMode?: string;
  /** The quantizer for a quantize-on-load cache that must be built (Qwen-Image-2.1; default @tp/quant's). */
  readonly quantizer?: WeightQuantizer;
}

/** Options of {@link DiffusionPipeline.load}. */
export interface LoadOptions {
  /** The text encoder may be left out when every request brings saved conditioning (`condIn`). */
  readonly files: Omit<PipelineFiles, "condIn">;
  readonly backend: Backend;
  readonly ditMode?: string;
  readonly textEncoderMode?: string;
  readonly quantizer?: WeightQuantizer;
}

/** A pipeline with its networks resident (a server's form): many images, one load. */
export interface LoadedPipeline extends Disposable {
  readonly pipeline: DiffusionPipeline;
  /** One image; `condIn` is saved conditioning to use instead of the text encoder. */
  generate(
    request: ImageRequest & { readonly condIn?: string },
    progress?: ProgressCallback,
  ): Promise<GeneratedImage>;
  /** Free the networks. */
  dispose(): void;
}

/**
 * Receives a run's {@link GenerateEvent}s. A promise it returns for a "step" event is awaited before
 * the next step (a server yields to its event loop there); what it throws ends the run (cancel),
 * freeing what the run allocated.
 */
export type ProgressCallback = (event: GenerateEvent) => unknown;

/** What {@link DiffusionPipeline.generate} reports while it runs, in order. */
export type GenerateEvent =
  /** A setting was changed or ignored (one line for the user), before any work. */
  | { readonly kind: "notice"; readonly text: string }
  /** Everything is loaded and sampling starts: one line naming the model, files and settings. */
  | { readonly kind: "start"; readonly text: string }
  /** A sampling step finished (`step` counts from 1); milliseconds of this step and since sampling began. */
  | {
      readonly kind: "step";
      readonly step: number;
      readonly steps: number;
      readonly stepMs: number;
      readonly elapsedMs: number;
      /**
       * With `preview`: this step's x0 estimate (what ComfyUI previews) in the DiT's latent space,
       * f32 [1, channels, frames, latent_height, latent_width].
       */
      readonly denoised?: { readonly data: Float32Array; readonly shape: readonly number[] };
    };

/** Conditioning as a file stores it, with the metadata `encode` writes beside it. */
export interface ConditioningOutput {
  readonly positive: HostConditioning;
  readonly negative?: HostConditioning;
  /** `__metadata__` strings (prompt, negative_prompt, text encoder). */
  readonly metadata: Readonly<Record<string, string>>;
}

/** The result of {@link DiffusionPipeline.generate}. */
export interface GeneratedImage {
  /** Pixels, after the pipeline's rounding. */
  readonly width: number;
  readonly height: number;
  /** Interleaved 8-bit RGB, [height, width, 3]. */
  readonly rgb: Uint8Array;
  /** Interleaved 8-bit RGBA, [height, width, 4], for models that make alpha (Qwen-Image-2.1). */
  readonly rgba?: Uint8Array;
  /** The final latent in VAE space (what `decode` takes back), f32. */
  readonly latent: { readonly data: Float32Array; readonly shape: readonly number[] };
  /** PNG text chunks: `parameters` (AUTOMATIC1111's format) and `tensorpencil` (the settings as JSON). */
  readonly text: { readonly parameters: string; readonly tensorpencil: string };
  /** With `keepConditioning`: what `--cond-out` saves. */
  readonly conditioning?: ConditioningOutput;
  /** Milliseconds per stage in order (e.g. conditioning, load, text, sampling, decode). */
  readonly timings: readonly (readonly [stage: string, ms: number])[];
}

/** Options of {@link DiffusionPipeline.encode}. */
export interface EncodeOptions {
  readonly textEncoder: string;
  readonly backend: Backend;
  readonly prompt: string;
  readonly negative?: string;
  readonly textEncoderMode?: string;
  /** The quantizer for a quantize-on-load cache of the text encoder (Qwen-Image-2.1; default @tp/quant's). */
  readonly quantizer?: WeightQuantizer;
}

/** Options of {@link DiffusionPipeline.decode}. */
export interface DecodeOptions {
  readonly vae: string;
  readonly backend: Backend;
  /** A latent as `generate` returns it and `decode` files hold (VAE space). */
  readonly latent: { readonly data: Float32Array; readonly shape: readonly number[] };
  readonly vaeTiled?: boolean;
}

/**
 * A text-to-image pipeline. Its methods check every input they can from file headers before any
 * long work and throw TpError (E_ARG, E_IO, E_FORMAT, E_SHAPE, E_UNSUPPORTED, E_OOM) naming the file.
 */
export interface DiffusionPipeline {
  /** Short id: "krea2". */
  readonly id: string;
  /** For people: "Krea 2". */
  readonly name: string;
  readonly dit: PipelineComponent;
  readonly vae: PipelineComponent;
  readonly textEncoder: PipelineComponent;
  readonly defaults: PipelineDefaults;
  readonly limits: PipelineLimits;
  /**
   * Files → image in one go, one network resident at a time: conditioning (text encoder, then freed,
   * or saved), DiT and VAE loaded, sampled, decoded, freed.
   */
  generate(options: GenerateOptions, progress?: ProgressCallback): Promise<GeneratedImage>;
  /** Load the networks once for many {@link LoadedPipeline.generate} calls (checks as `generate`). */
  load(options: LoadOptions): LoadedPipeline;
  /** The text-encode step alone: prompt (and negative) → conditioning to save. */
  encode(options: EncodeOptions): Promise<ConditioningOutput>;
  /** A saved latent → 8-bit RGB through the VAE. */
  decode(
    options: DecodeOptions,
  ): Promise<{ width: number; height: number; rgb: Uint8Array; rgba?: Uint8Array }>;
  /**
   * Read a latent file and check its shape against what this pipeline decodes (before its data).
   * @throws TpError E_IO, E_FORMAT, E_SHAPE naming the file and tensor
   */
  readLatent(path: string): {
    readonly data: Float32Array;
    readonly shape: readonly number[];
    readonly metadata: Readonly<Record<string, string>>;
  };
}
