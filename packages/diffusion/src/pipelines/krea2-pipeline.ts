/**
 * Krea 2's row of the pipeline registry ({@link DiffusionPipeline}): checkpoint files → image. The
 * order keeps one network resident at a time, as ComfyUI's model management does: the text encoder
 * (or a saved `--cond-in` file) gives the conditioning, which stays on the backend; the encoder is
 * freed; the DiT and the Wan 2.1 VAE are loaded; {@link generateKrea2} samples and decodes. Every input
 * is checked from file headers before the first weight is read.
 *
 * Sources: krea2.md §6.1 (the pipeline), §2.6 (negative conditioning), §6.5 (PNG parameters).
 */
import { basename, extname } from "node:path";
import { explainNonFiniteWeights } from "@tp/formats";
import { type Backend, checkFinite, describeResidencyPlan, TpError } from "@tp/tensor";
import { Conditioning, type HostConditioning } from "../conditioning.ts";
import {
  KREA2_MODES,
  type Krea2Config,
  type Krea2Dit,
  type Krea2Mode,
  loadKrea2,
  readKrea2DitConfig,
} from "../models/krea2.ts";
import {
  KREA2_TEXT_MODES,
  type Krea2QwenTextEncoder,
  type Krea2TextMode,
  loadKrea2TextEncoder,
  readKrea2TextEncoderWidth,
} from "../models/krea2-text.ts";
import { loadWanVae, type WanVaeDecoder } from "../models/wan-vae.ts";
import type { TorchCpuCapability } from "../noise.ts";
import type {
  ConditioningOutput,
  DiffusionPipeline,
  GeneratedImage,
  GenerateOptions,
  ImageRequest,
  LoadedPipeline,
  LoadOptions,
  PipelineFiles,
  ProgressCallback,
} from "../pipeline.ts";
import { readConditioning, readLatent } from "./files.ts";
import {
  checkKrea2Conditioning,
  decodeKrea2Latent,
  generateKrea2,
  KREA2_DEFAULTS,
  KREA2_MAX_SIZE,
  KREA2_MAX_STEPS,
  KREA2_MIN_SIZE,
  KREA2_SCHEDULES,
  type Krea2Schedule,
  krea2MaxShift,
  krea2Parameters,
  krea2Size,
} from "./krea2.ts";

/** File name without folder and extension, for metadata. */
const stem = (p: string): string => basename(p, extname(p));

/** A mode from a list, or E_ARG naming the option. */
function oneOf<T extends string>(
  what: string,
  value: string | undefined,
  fallback: T,
  known: readonly T[],
): T {
  const v = (value ?? fallback) as T;
  if (!known.includes(v)) {
    throw new TpError("E_ARG", `unknown ${what} '${value}'; expected one of: ${known.join(", ")}`);
  }
  return v;
}

/**
 * Open the text encoder after checking, from the tensor shapes of both files, that its conditioning
 * width (taps × hidden) is the DiT's (txtlayers × txtdim) — before the encoder is loaded or run.
 * @throws TpError E_SHAPE naming both files; as loadKrea2TextEncoder
 */
function openTextEncoder(
  tePath: string,
  ditPath: string,
  dit: { txtlayers: number; txtdim: number },
  options: { backend: GenerateOptions["backend"]; mode: Krea2TextMode },
): Krea2QwenTextEncoder {
  const te = readKrea2TextEncoderWidth(tePath);
  const want = dit.txtlayers * dit.txtdim;
  if (te.width !== want) {
    throw new TpError(
      "E_SHAPE",
      `the text encoder ${tePath} gives conditioning ${te.taps}×${te.hidden} = ${te.width} wide; the DiT ${ditPath} takes ${dit.txtlayers}×${dit.txtdim} = ${want}: pass the text encoder that belongs to this DiT`,
    );
  }
  return loadKrea2TextEncoder(tePath, options);
}

/**
 * Krea 2 from files (see the module comment): `generate` with Krea 2's defaults (1024², 8 steps, cfg 1,
 * seed 0, shift 1.15, "simple"), `encode` (Qwen3-VL text encoder → conditioning), `decode` (Wan 2.1).
 */
export const KREA2_PIPELINE: DiffusionPipeline = {
  id: "krea2",
  name: "Krea 2",
  dit: {
    layout: "krea2-dit",
    what: "Krea 2 DiT",
    signature: "blocks.0.mod.lin + txtfusion.projector.weight",
  },
  vae: { layout: "wan21-vae", what: "the Wan 2.1 / Qwen-Image VAE", signature: "conv2.weight [16,16,1,1,1]" },
  textEncoder: {
    layout: "qwen3vl-text-encoder",
    what: "the Qwen3-VL text encoder",
    signature: "model.language_model.embed_tokens.weight",
  },
  defaults: {
    ...KREA2_DEFAULTS,
    ditMode: "native",
    textEncoderMode: "native",
  },
  limits: {
    minSize: KREA2_MIN_SIZE,
    maxSize: KREA2_MAX_SIZE,
    sizeMultiple: 8,
    maxSteps: KREA2_MAX_STEPS,
    schedules: KREA2_SCHEDULES,
    maxShift: (schedule) => krea2MaxShift(schedule as Krea2Schedule),
    ditModes: KREA2_MODES,
    textEncoderModes: KREA2_TEXT_MODES,
    noiseKernels: ["avx2", "default"],
  },

  generate(o: GenerateOptions, progress?: ProgressCallback): Promise<GeneratedImage> {
    const teMode = oneOf<Krea2TextMode>("text-encoder mode", o.textEncoderMode, "native", KREA2_TEXT_MODES);
    const mode = oneOf<Krea2Mode>("DiT mode", o.ditMode, "native", KREA2_MODES);
    const { backend, files } = o;
    const ditConfig = readKrea2DitConfig(files.dit);
    // One network resident at a time: the encoder is opened for the conditioning and freed, then
    // the DiT and VAE are loaded.
    return runKrea2(o, progress ?? (() => {}), {
      backend,
      files,
      ditMode: mode,
      teMode,
      ditConfig,
      encoder: async (fn) => {
        using te = openTextEncoder(files.textEncoder as string, files.dit, ditConfig, {
          backend,
          mode: teMode,
        });
        return await fn(te); // awaited: `using` frees the encoder when this returns
      },
      models: () => {
        const dit = loadKrea2(files.dit, { backend, mode });
        try {
          return { dit, vae: loadWanVae(backend, files.vae), owned: true };
        } catch (e) {
          dit.dispose();
          throw e;
        }
      },
    });
  },

  load(o: LoadOptions): LoadedPipeline {
    const teMode = oneOf<Krea2TextMode>("text-encoder mode", o.textEncoderMode, "native", KREA2_TEXT_MODES);
    const mode = oneOf<Krea2Mode>("DiT mode", o.ditMode, "native", KREA2_MODES);
    const { backend, files } = o;
    const ditConfig = readKrea2DitConfig(files.dit);
    using stack = new DisposableStack();
    const te =
      files.textEncoder === undefined
        ? undefined
        : stack.use(openTextEncoder(files.textEncoder, files.dit, ditConfig, { backend, mode: teMode }));
    const dit = stack.use(loadKrea2(files.dit, { backend, mode }));
    const vae = stack.use(loadWanVae(backend, files.vae));
    const resident = stack.move();
    return {
      pipeline: KREA2_PIPELINE,
      generate: (request, progress) =>
        runKrea2(request, progress ?? (() => {}), {
          backend,
          files: { ...files, ...(request.condIn !== undefined ? { condIn: request.condIn } : {}) },
          ditMode: mode,
          teMode,
          ditConfig,
          encoder: (fn) => fn(te as Krea2QwenTextEncoder),
          models: () => ({ dit, vae, owned: false }),
        }),
      dispose: () => resident.dispose(),
      [Symbol.dispose]: () => resident.dispose(),
    };
  },

  async encode(o) {
    const teMode = oneOf<Krea2TextMode>("text-encoder mode", o.textEncoderMode, "native", KREA2_TEXT_MODES);
    using encoder = loadKrea2TextEncoder(o.textEncoder, { backend: o.backend, mode: teMode });
    using positive = await encoder.encode(o.prompt);
    using negative =
      o.negative === undefined ? null : await encoder.encode(o.negative, "the negative prompt");
    const explain = () => explainNonFiniteWeights([{ what: "text encoder", path: o.textEncoder }]);
    await checkFinite(o.backend, positive.tensor, { stage: "conditioning (positive)", explain });
    if (negative)
      await checkFinite(o.backend, negative.tensor, { stage: "conditioning (negative)", explain });
    return {
      positive: await positive.read(),
      ...(negative ? { negative: await negative.read() } : {}),
      metadata: {
        prompt: o.prompt,
        ...(o.negative !== undefined ? { negative_prompt: o.negative } : {}),
        text_encoder: basename(o.textEncoder),
        text_encoder_mode: teMode,
      },
    };
  },

  async decode(o) {
    using vae = loadWanVae(o.backend, o.vae);
    return await decodeKrea2Latent(vae, o.latent, o.vaeTiled ? { tiled: true } : {});
  },

  readLatent: readLatent,
};

/** What {@link runKrea2} runs with: the backend, files and modes, and how it gets the networks. */
interface Krea2Parts {
  readonly backend: Backend;
  readonly files: PipelineFiles;
  readonly ditMode: Krea2Mode;
  readonly teMode: Krea2TextMode;
  readonly ditConfig: Krea2Config;
  /** Run `fn` with the text encoder (opened for it, or resident). */
  encoder<T>(fn: (te: Krea2QwenTextEncoder) => Promise<T>): Promise<T>;
  /** The DiT and VAE; `owned`: loaded for this run and freed after it. */
  models(): { dit: Krea2Dit; vae: WanVaeDecoder; owned: boolean };
}

/**
 * One Krea 2 run (krea2.md §6.1): settings and saved conditioning checked before any work, the
 * conditioning (saved, or encoded and kept on the backend), the networks, {@link generateKrea2}, and
 * the PNG text.
 */
async function runKrea2(o: ImageRequest, report: ProgressCallback, run: Krea2Parts): Promise<GeneratedImage> {
  const { backend, files, ditConfig, ditMode: mode, teMode } = run;
  const d = KREA2_DEFAULTS;
  const cfg = o.cfg ?? d.cfg;
  const seed = o.seed ?? BigInt(d.seed);
  const steps = o.steps ?? d.steps;
  const shift = o.shift ?? d.shift;
  const schedule = oneOf("schedule", o.schedule, d.schedule, KREA2_SCHEDULES);
  const noise: TorchCpuCapability = o.noise ?? "avx2";
  const size = krea2Size(o.width ?? d.width, o.height ?? d.height);
  const useCfg = Math.fround(cfg) !== 1;
  const { dit: ditPath, vae: vaePath, textEncoder: tePath, condIn } = files;
  if (condIn === undefined && tePath === undefined) {
    throw new TpError("E_ARG", "missing --text-encoder (the Qwen3-VL text encoder, or pass --cond-in)");
  }

  // 1. Headers only: saved conditioning against the DiT's conditioning width.
  const saved = condIn === undefined ? undefined : readConditioning(condIn);
  if (saved !== undefined) {
    checkKrea2Conditioning(saved.positive, { config: ditConfig }, "the positive");
    if (saved.negative) checkKrea2Conditioning(saved.negative, { config: ditConfig }, "the negative");
    if (useCfg && o.negative !== undefined && tePath === undefined && !saved.negative) {
      throw new TpError(
        "E_ARG",
        `--negative needs --text-encoder F (to encode it) or a 'negative' tensor in --cond-in ${condIn}; without --negative the negative is ConditioningZeroOut`,
        { file: condIn },
      );
    }
  }
  if (size.notice) report({ kind: "notice", text: size.notice });
  if (o.negative !== undefined && !useCfg) {
    report({
      kind: "notice",
      text: "--negative is ignored at cfg 1 (no negative pass); raise --cfg to use it",
    });
  }

  // 2. Conditioning on the backend: saved (uploaded), or from the text encoder (kept there).
  const tCond = performance.now();
  let prompt = o.prompt;
  let negativeText = useCfg ? o.negative : undefined;
  let teLine = "";
  let positive: Conditioning | HostConditioning;
  let negative: Conditioning | HostConditioning | "zero" = "zero";
  // The encoded conditionings live until the run ends; the encoder is freed before the DiT loads.
  using held = new DisposableStack();
  // texts with their names for messages: a too-long negative prompt is called that
  const encode = (texts: readonly (readonly [string, string])[]): Promise<Conditioning[]> =>
    run.encoder(async (encoder) => {
      teLine = `; text encoder ${stem(tePath as string)} (${encoder.description}, ${teMode})`;
      const out: Conditioning[] = [];
      for (const [t, what] of texts) out.push(held.use(await encoder.encode(t, what)));
      return out;
    });
  if (saved !== undefined) {
    prompt ??= saved.metadata.prompt ?? "";
    positive = saved.positive;
    if (useCfg && o.negative !== undefined) {
      if (tePath !== undefined) {
        // The saved positive with a negative prompt encoded now.
        negative = (await encode([[o.negative, "the negative prompt"]]))[0] as Conditioning;
        teLine = "";
      } else {
        negative = saved.negative as HostConditioning;
      }
    } else if (useCfg && saved.negative) {
      negative = saved.negative;
      negativeText = saved.metadata.negative_prompt ?? "";
    }
  } else {
    const named: [string, string] = [prompt as string, "the prompt"];
    const texts =
      negativeText === undefined ? [named] : [named, [negativeText, "the negative prompt"] as const];
    const [pos, neg] = await encode(texts);
    positive = pos as Conditioning;
    negative = neg ?? "zero";
  }
  const condMs = performance.now() - tCond;

  // 3. DiT and VAE (a file that is not the named component is E_FORMAT here, before sampling).
  const tLoad = performance.now();
  const { dit, vae, owned } = run.models();
  if (owned) {
    held.use(dit);
    held.use(vae);
  }
  const loadMs = performance.now() - tLoad;
  for (const [what, file, names] of [
    ["DiT", ditPath, dit.unexpected],
    ["VAE", vaePath, vae.unexpected],
  ] as const) {
    if (names.length === 0) continue;
    report({
      kind: "notice",
      text: `the ${what} file ${file} holds ${names.length} tensor${names.length === 1 ? "" : "s"} the model does not use (${names.slice(0, 3).join(", ")}${names.length > 3 ? ", …" : ""}); ignored`,
    });
  }
  report({
    kind: "start",
    text: `${dit.layout.description}; VAE ${stem(vaePath)}${teLine}; ${size.width}x${size.height}, ${steps} step${steps === 1 ? "" : "s"}, cfg ${cfg}, seed ${seed}, ${backend.device}`,
  });

  // 4. Sampling and decoding.
  const result = await generateKrea2({
    dit,
    vae,
    conditioning: { positive, negative },
    width: size.width,
    height: size.height,
    steps,
    cfg,
    seed,
    shift,
    schedule,
    noiseKernel: noise,
    ...(tePath !== undefined ? { textEncoderFile: tePath } : {}),
    ...(o.vaeTiled ? { vaeDecode: { tiled: true } } : {}),
    ...(o.vramBudget === undefined
      ? {}
      : {
          vramBudget: o.vramBudget,
          onResidencyPlan: (plan) =>
            report({ kind: "notice", text: describeResidencyPlan(plan, Math.fround(cfg) === 1 ? 1 : 2) }),
        }),
    onStep: async (s) => {
      await report({
        kind: "step",
        step: s.step + 1,
        steps: s.steps,
        stepMs: s.stepMs,
        elapsedMs: s.elapsedMs,
        ...(o.preview
          ? { denoised: { data: (await backend.read(s.denoised)) as Float32Array, shape: s.denoised.shape } }
          : {}),
      });
    },
  });

  // 5. What the files get: PNG text, and the conditioning on the host when it is to be saved.
  const parameters = krea2Parameters({
    prompt: prompt ?? "",
    ...(negativeText ? { negative: negativeText } : {}),
    steps,
    cfg,
    seed,
    width: result.width,
    height: result.height,
    shift,
    schedule,
    negativeMode: result.settings.negative,
    model: stem(ditPath),
    vae: stem(vaePath),
  });
  const tensorpencil = JSON.stringify({
    prompt: prompt ?? "",
    negative_prompt: negativeText ?? null,
    negative: result.settings.negative,
    width: result.width,
    height: result.height,
    steps,
    cfg,
    seed: String(seed),
    shift,
    schedule,
    sampler: "euler",
    noise,
    dit_mode: mode,
    ...(condIn === undefined ? { te_mode: teMode } : {}),
    dit: basename(ditPath),
    vae: basename(vaePath),
    conditioning: condIn === undefined ? basename(tePath as string) : basename(condIn),
  });
  let conditioning: ConditioningOutput | undefined;
  if (o.keepConditioning) {
    const host = async (c: Conditioning | HostConditioning): Promise<HostConditioning> =>
      c instanceof Conditioning ? await c.read() : c;
    conditioning = {
      positive: await host(positive),
      ...(negative !== "zero" ? { negative: await host(negative) } : {}),
      metadata: {
        prompt: prompt ?? "",
        ...(negativeText !== undefined ? { negative_prompt: negativeText } : {}),
      },
    };
  }
  const tm = result.timings;
  return {
    width: result.width,
    height: result.height,
    rgb: result.rgb,
    latent: { data: result.latent, shape: result.latentShape },
    text: { parameters, tensorpencil },
    ...(conditioning ? { conditioning } : {}),
    timings: [
      ["conditioning", condMs],
      ["load", loadMs],
      ["text", tm.textMs],
      ["sampling", tm.samplingMs],
      ["decode", tm.decodeMs],
    ],
  };
}
