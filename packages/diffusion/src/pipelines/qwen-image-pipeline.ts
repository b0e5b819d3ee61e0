/**
 * Qwen-Image-2.1's row of the pipeline registry ({@link DiffusionPipeline}): checkpoint files → RGBA
 * image, one network resident at a time (encoder → transformer → VAE). The transformer is quantized on
 * load by default (`q8`: INT8 ConvRot, the ComfyUI `_int8_convrot` file used as it is, a float file
 * quantized once into a cache beside it by @tp/quant's `openQuantCache`; `q4`: INT4 ConvRot; `f32`:
 * float weights and compute). The text encoder has its own mode (`textEncoderMode`, default `q8`
 * too: its projections through a cache beside its own file, see models/qwen-image-text.ts). Both
 * checkpoint layouts reach it through {@link qwenImageModelFiles}.
 *
 * Sources: ../shared/spec/qwen-image.md §1 (pipeline), §2.3 (layouts), §7.3 (CFG), §10.3 (modes,
 * caches).
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, statSync } from "node:fs";
import { basename, dirname, extname, join } from "node:path";
import {
  type DetectedLayout,
  detectLayout,
  HubClient,
  type HubOptions,
  type HubRepoInfo,
  openSafetensors,
} from "@tp/formats";
import { openQuantCache, type WeightQuantizer } from "@tp/quant";
import { type Backend, TpError } from "@tp/tensor";
import { Conditioning, type HostConditioning } from "../conditioning.ts";
import { loadQwenImage, type QwenImageDit, readQwenImageDitConfig } from "../models/qwen-image.ts";
import {
  loadQwenImageTextEncoder,
  QWEN_IMAGE_TEXT_MODES,
  type QwenImageTextEncoder,
  type QwenImageTextMode,
} from "../models/qwen-image-text.ts";
import { loadQwenImageVae, type QwenImageVaeDecoder } from "../models/qwen-image-vae.ts";
import type {
  DiffusionPipeline,
  GeneratedImage,
  GenerateEvent,
  GenerateOptions,
  ImageRequest,
  LoadedPipeline,
  LoadOptions,
  PipelineFiles,
  ProgressCallback,
} from "../pipeline.ts";
import { readConditioning } from "./files.ts";
import {
  decodeQwenImageLatent,
  generateQwenImage,
  QWEN_IMAGE_DEFAULTS,
  QWEN_IMAGE_MAX_SIZE,
  QWEN_IMAGE_MAX_STEPS,
  QWEN_IMAGE_MIN_SIZE,
  QWEN_IMAGE_SCHEDULES,
  QWEN_IMAGE_SIZE_MULTIPLE,
  type QwenImageSchedule,
  qwenImageSize,
  readQwenImageScheduler,
  rgbOf,
} from "./qwen-image.ts";

/** Transformer modes: quantize on load to INT8 (default) / INT4 ConvRot, or float. */
export type QwenImageDitMode = "q8" | "q4" | "f32";
export const QWEN_IMAGE_DIT_MODES: readonly QwenImageDitMode[] = ["q8", "q4", "f32"];

const stem = (p: string): string => basename(p, extname(p));

function oneOf<T extends string>(
  what: string,
  value: string | undefined,
  fallback: T,
  known: readonly T[],
): T {
  const v = (value ?? fallback) as T;
  if (!known.includes(v))
    throw new TpError("E_ARG", `unknown ${what} '${value}'; expected one of: ${known.join(", ")}`);
  return v;
}

/** The files of a Qwen-Image-2.1 checkpoint folder, and what was found. */
export interface QwenImageModelFiles extends PipelineFiles {
  readonly textEncoder: string;
  /** `processor/tokenizer.json`. */
  readonly tokenizer: string;
  /** `vae/config.json` (latent statistics). */
  readonly vaeConfig: string;
  /** `scheduler/scheduler_config.json` (diffusers layout only). */
  readonly scheduler?: string;
  readonly layout: DetectedLayout;
}

/**
 * A Qwen-Image-2.1 folder in either layout (qwen-image.md §2.3) → its component files: diffusers
 * (`transformer/` shards through their index, `text_encoder/`, `vae/`, `processor/tokenizer.json`,
 * `scheduler/`) or ComfyUI (`diffusion_models/` preferring `*_int8_convrot`, then `*_bf16`,
 * `text_encoders/`, `vae/`, with `processor/tokenizer.json` and `vae/config.json` from the Qwen repo).
 * @throws TpError E_IO for a missing path; E_FORMAT, one line naming every missing piece, for a partial
 *   or foreign folder
 */
export function qwenImageModelFiles(dir: string): QwenImageModelFiles {
  // a file given as the folder (model_index.json, one shard) would be read as a safetensors header
  if (existsSync(dir) && !statSync(dir).isDirectory())
    throw new TpError(
      "E_FORMAT",
      `${dir} is a file, not a Qwen-Image-2.1 folder (diffusers or ComfyUI layout); give its folder, or the files with --dit / --vae / --text-encoder`,
      { file: dir },
    );
  const layout = detectLayout(dir);
  const c = layout.components ?? {};
  const isComfy = layout.kind === "comfyui";
  if (
    !(layout.kind === "qwen-image-2.1-diffusers" || (isComfy && layout.details.model === "Qwen-Image-2.1"))
  ) {
    throw new TpError(
      "E_FORMAT",
      `${dir} is not a Qwen-Image-2.1 folder (diffusers or ComfyUI layout): it is a ${layout.description}`,
      { file: dir },
    );
  }
  const dit = (isComfy ? c.diffusion_model : c.transformer)?.path as string;
  const te = c.text_encoder?.path as string;
  const vae = c.vae?.path as string;
  const tokenizer = join(dir, "processor", "tokenizer.json");
  const vaeConfig = join(dir, "vae", "config.json");
  const missing = [tokenizer, vaeConfig].filter((p) => !existsSync(p)).map((p) => p.slice(dir.length + 1));
  const wrong = [
    [c.text_encoder, "qwen3vl-text-encoder", isComfy ? "text_encoders/" : "text_encoder/"],
    [c.vae, "qwen-image-2.1-vae", "vae/"],
  ]
    .filter(([l, kind]) => (l as DetectedLayout | undefined)?.kind !== kind)
    .map(
      ([l, kind, where]) =>
        `${where} holds a ${(l as DetectedLayout | undefined)?.kind ?? "nothing"}, not a ${kind}`,
    );
  if (missing.length > 0 || wrong.length > 0) {
    throw new TpError(
      "E_FORMAT",
      `${dir}: Qwen-Image-2.1 ${isComfy ? "ComfyUI" : "diffusers"} layout ${[
        ...(missing.length
          ? [`is missing: ${missing.join(", ")}${isComfy ? " (take them from Qwen/Qwen-Image-2.1)" : ""}`]
          : []),
        ...wrong,
      ].join("; ")}`,
      { file: dir },
    );
  }
  const scheduler = join(dir, "scheduler", "scheduler_config.json");
  return {
    dit,
    vae,
    textEncoder: te,
    tokenizer,
    vaeConfig,
    ...(existsSync(scheduler) ? { scheduler } : {}),
    layout,
  };
}

/** The two known repositories (qwen-image.md §2.1–2.2). */
export const QWEN_IMAGE_REPOS = {
  diffusers: "Qwen/Qwen-Image-2.1",
  comfy: "Comfy-Org/Qwen-Image-2.1",
} as const;

/** The preferred file of a ComfyUI folder among a repository's files: `*_int8_convrot`, else `*_bf16`, else the first. */
function comfyPick(info: HubRepoInfo, folder: string): string | undefined {
  const st = info.files
    .map((f) => f.path)
    .filter((p) => p.startsWith(`${folder}/`) && p.endsWith(".safetensors"));
  return st.find((p) => p.includes("_int8_convrot")) ?? st.find((p) => p.includes("_bf16")) ?? st[0];
}

/**
 * A Qwen-Image-2.1 folder from the Hugging Face Hub (qwen-image.md §13), in the Hub cache: the
 * repository pinned to one commit, small files first (configs, tokenizer, shard indexes), then the
 * weights each index names; for the ComfyUI repository its three preferred files plus
 * `processor/tokenizer.json` and `vae/config.json` from {@link QWEN_IMAGE_REPOS}.diffusers. Each file
 * resumes where an earlier run stopped; a completed snapshot is used without any request.
 * @param repo `Qwen/Qwen-Image-2.1`, `Comfy-Org/Qwen-Image-2.1` or another repository in either layout
 * @returns the snapshot folder, for {@link qwenImageModelFiles}
 * @throws TpError E_IO (network, refusals, gated repositories: what to do); E_FORMAT for a repository
 *   in neither layout or a shard index that is not JSON
 */
export async function qwenImageFromHub(
  repo: string,
  options: HubOptions & { readonly revision?: string } = {},
): Promise<string> {
  const hub = new HubClient(options);
  const revision = options.revision ?? "main";
  const cached = hub.cachedSnapshot(repo, revision);
  if (cached !== null) return cached;
  const info = await hub.repoInfo(repo, revision);
  const has = new Set(info.files.map((f) => f.path));
  if (has.has("model_index.json")) {
    const small = [
      "model_index.json",
      "processor/tokenizer.json",
      "scheduler/scheduler_config.json",
      "transformer/config.json",
      "text_encoder/config.json",
      "vae/config.json",
      ...[...has].filter((p) => /^(transformer|text_encoder)\/[^/]+\.safetensors\.index\.json$/.test(p)),
    ].filter((p) => has.has(p));
    const { dir } = await hub.ensureFiles(repo, info, small);
    const large: string[] = [];
    for (const folder of ["transformer", "text_encoder"]) {
      const index = small.find((p) => p.startsWith(`${folder}/`) && p.endsWith(".index.json"));
      if (index === undefined) {
        const single = [...has].find((p) => p.startsWith(`${folder}/`) && p.endsWith(".safetensors"));
        if (single) large.push(single);
        continue;
      }
      let map: Record<string, string>;
      try {
        map = (JSON.parse(readFileSync(join(dir, index), "utf8")) as { weight_map: Record<string, string> })
          .weight_map;
      } catch (e) {
        throw new TpError("E_FORMAT", `${repo}: ${index} is not a shard index: ${(e as Error).message}`);
      }
      for (const shard of new Set(Object.values(map))) large.push(`${folder}/${shard}`);
    }
    large.push("vae/diffusion_pytorch_model.safetensors");
    await hub.ensureFiles(repo, info, large);
    hub.markComplete(repo, revision, info.sha, [...small, ...large]);
    return dir;
  }
  const picks = ["diffusion_models", "text_encoders", "vae"].map((f) => comfyPick(info, f));
  if (picks.some((p) => p === undefined)) {
    throw new TpError(
      "E_FORMAT",
      `${repo} is neither a diffusers (model_index.json) nor a ComfyUI (diffusion_models/, text_encoders/, vae/) Qwen-Image-2.1 repository`,
    );
  }
  // The ComfyUI repository ships no tokenizer and no VAE config: the Qwen repository's (§2.2).
  const qwen = await hub.repoInfo(QWEN_IMAGE_REPOS.diffusers);
  const { dir: qdir } = await hub.ensureFiles(QWEN_IMAGE_REPOS.diffusers, qwen, [
    "processor/tokenizer.json",
    "vae/config.json",
  ]);
  const { dir } = await hub.ensureFiles(repo, info, picks as string[]);
  for (const f of ["processor/tokenizer.json", "vae/config.json"]) {
    mkdirSync(dirname(join(dir, f)), { recursive: true });
    copyFileSync(join(qdir, f), join(dir, f));
  }
  hub.markComplete(repo, revision, info.sha, [
    ...(picks as string[]),
    "processor/tokenizer.json",
    "vae/config.json",
  ]);
  return dir;
}

/** Files beside a component that the pipeline reads when no folder was given. */
function besideFiles(files: PipelineFiles): { tokenizer?: string; vaeConfig?: string; scheduler?: string } {
  const up = (p: string, ...rest: string[]) => join(dirname(p), "..", ...rest);
  const found = (p: string) => (existsSync(p) ? p : undefined);
  const te = files.textEncoder;
  const tok = te === undefined ? undefined : found(up(te, "processor", "tokenizer.json"));
  const vc = found(join(dirname(files.vae), "config.json"));
  const sc = found(up(files.dit, "scheduler", "scheduler_config.json"));
  return {
    ...(tok ? { tokenizer: tok } : {}),
    ...(vc ? { vaeConfig: vc } : {}),
    ...(sc ? { scheduler: sc } : {}),
  };
}

/** Options that pass through to the transformer's loader. */
export interface QwenImageLoadExtras {
  /** The quantizer for a cache that must be built (the CLI passes @tp/backend-cpu's native one). */
  readonly quantizer?: WeightQuantizer;
}

/**
 * Load the transformer in a mode: `f32`; `q8` on an INT8 ConvRot file as it is; otherwise a float
 * file's blocks through a quantize-on-load cache beside it (built once, mapped later).
 * @returns the model and one line saying what happened (for a notice)
 * @throws TpError E_UNSUPPORTED for `q4` on an INT8 file (quantize the bf16 file); as loadQwenImage,
 *   openQuantCache
 */
export function loadQwenImageDit(
  path: string,
  backend: Backend,
  mode: QwenImageDitMode,
  extras: QwenImageLoadExtras = {},
): { dit: QwenImageDit; note?: string; ms: number } {
  const t = performance.now();
  if (mode === "f32")
    return { dit: loadQwenImage(path, { backend, mode: "f32" }), ms: performance.now() - t };
  const probe = loadQwenImage(path, { backend, mode: "native" }); // headers + norm scales: cheap
  const variant = probe.layout.variant ?? "";
  if (variant === "int8_convrot" || variant === "int4_convrot") {
    if ((mode === "q8") !== (variant === "int8_convrot")) {
      probe.dispose();
      throw new TpError(
        "E_UNSUPPORTED",
        `${path} is already ${variant}; ${mode === "q4" ? "--q4" : "the int8 default"} needs the bf16 file (or use the mode it holds)`,
        { file: path },
      );
    }
    return {
      dit: probe,
      note: `transformer ${basename(path)} used as stored (${variant})`,
      ms: performance.now() - t,
    };
  }
  probe.dispose();
  const cache = openQuantCache(path, {
    format: mode === "q4" ? "int4_convrot" : "int8_convrot",
    ...(mode === "q4" ? { groupSize: 64 } : {}),
    ...(extras.quantizer ? { quantizer: extras.quantizer } : {}),
  });
  const dit = loadQwenImage(path, { backend, mode: "native", source: cache.source });
  return {
    dit,
    note: `transformer ${mode === "q4" ? "int4" : "int8"} ConvRot cache ${cache.status}: ${cache.path}`,
    ms: performance.now() - t,
  };
}

/** Qwen-Image-2.1 from files (see the module comment). */
export const QWEN_IMAGE_PIPELINE: DiffusionPipeline = {
  id: "qwen-image",
  name: "Qwen-Image-2.1",
  dit: {
    layout: "qwen-image-2.1-transformer",
    what: "Qwen-Image-2.1 transformer",
    signature: "img_in.weight + modulation.1.weight",
  },
  vae: {
    layout: "qwen-image-2.1-vae",
    what: "the Qwen-Image-2.1 VAE",
    signature: "post_quant_conv / conv2 [64, 64]",
  },
  textEncoder: {
    layout: "qwen3vl-text-encoder",
    what: "the Qwen3-VL-8B text encoder",
    signature: "model.language_model.embed_tokens.weight",
  },
  defaults: { ...QWEN_IMAGE_DEFAULTS, shift: 0, ditMode: "q8", textEncoderMode: "q8" },
  limits: {
    minSize: QWEN_IMAGE_MIN_SIZE,
    maxSize: QWEN_IMAGE_MAX_SIZE,
    sizeMultiple: QWEN_IMAGE_SIZE_MULTIPLE,
    maxSteps: QWEN_IMAGE_MAX_STEPS,
    schedules: QWEN_IMAGE_SCHEDULES,
    maxShift: () => 0,
    ditModes: QWEN_IMAGE_DIT_MODES,
    textEncoderModes: QWEN_IMAGE_TEXT_MODES,
    noiseKernels: ["avx2", "default"],
  },

  generate(o: GenerateOptions, progress?: ProgressCallback): Promise<GeneratedImage> {
    const mode = oneOf<QwenImageDitMode>("DiT mode", o.ditMode, "q8", QWEN_IMAGE_DIT_MODES);
    const teMode = oneOf<QwenImageTextMode>(
      "text-encoder mode",
      o.textEncoderMode,
      "q8",
      QWEN_IMAGE_TEXT_MODES,
    );
    const { backend, files } = o;
    readQwenImageDitConfig(files.dit); // E_FORMAT before any long work
    const extra = besideFiles(files);
    return runQwenImage(o, progress ?? (() => {}), {
      backend,
      files,
      mode,
      teMode,
      scheduler: extra.scheduler,
      encoder: async (fn) => {
        using te = loadQwenImageTextEncoder(files.textEncoder as string, {
          backend,
          mode: teMode,
          ...(o.quantizer ? { quantizer: o.quantizer } : {}),
        });
        if (te.note) await progress?.({ kind: "notice", text: te.note });
        return await fn(te);
      },
      models: (report) => {
        const { dit, note } = loadQwenImageDit(files.dit, backend, mode, { quantizer: o.quantizer });
        if (note) report({ kind: "notice", text: note });
        try {
          return { dit, vae: loadQwenImageVae(backend, files.vae, extra.vaeConfig), owned: true };
        } catch (e) {
          dit.dispose();
          throw e;
        }
      },
    });
  },

  load(o: LoadOptions): LoadedPipeline {
    const mode = oneOf<QwenImageDitMode>("DiT mode", o.ditMode, "q8", QWEN_IMAGE_DIT_MODES);
    const teMode = oneOf<QwenImageTextMode>(
      "text-encoder mode",
      o.textEncoderMode,
      "q8",
      QWEN_IMAGE_TEXT_MODES,
    );
    const { backend, files } = o;
    const extra = besideFiles(files);
    using stack = new DisposableStack();
    const te =
      files.textEncoder === undefined
        ? undefined
        : stack.use(
            loadQwenImageTextEncoder(files.textEncoder, {
              backend,
              mode: teMode,
              ...(o.quantizer ? { quantizer: o.quantizer } : {}),
            }),
          );
    const dit = stack.use(loadQwenImageDit(files.dit, backend, mode, { quantizer: o.quantizer }).dit);
    const vae = stack.use(loadQwenImageVae(backend, files.vae, extra.vaeConfig));
    const resident = stack.move();
    return {
      pipeline: QWEN_IMAGE_PIPELINE,
      generate: (request, progress) =>
        runQwenImage(request, progress ?? (() => {}), {
          backend,
          files: { ...files, ...(request.condIn !== undefined ? { condIn: request.condIn } : {}) },
          mode,
          teMode,
          scheduler: extra.scheduler,
          encoder: (fn) => {
            if (te === undefined)
              throw new TpError("E_ARG", "this pipeline was loaded without a text encoder: pass condIn");
            return fn(te);
          },
          models: () => ({ dit, vae, owned: false }),
        }),
      dispose: () => resident.dispose(),
      [Symbol.dispose]: () => resident.dispose(),
    };
  },

  async encode(o) {
    const teMode = oneOf<QwenImageTextMode>(
      "text-encoder mode",
      o.textEncoderMode,
      "q8",
      QWEN_IMAGE_TEXT_MODES,
    );
    using encoder = loadQwenImageTextEncoder(o.textEncoder, {
      backend: o.backend,
      mode: teMode,
      ...(o.quantizer ? { quantizer: o.quantizer } : {}),
    });
    using positive = await encoder.encode(o.prompt);
    using negative = o.negative === undefined ? null : await encoder.encode(o.negative);
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
    using vae = loadQwenImageVae(o.backend, o.vae);
    const r = await decodeQwenImageLatent(vae, o.latent);
    return { width: r.width, height: r.height, rgb: rgbOf(r.rgba), rgba: r.rgba };
  },

  readLatent(path: string) {
    if (!existsSync(path) || statSync(path).isDirectory()) {
      throw new TpError("E_IO", `cannot open the latent file ${path}: no such file`, { file: path });
    }
    const src = openSafetensors(path);
    try {
      const t = src.has("latent") ? src.tensor("latent") : undefined;
      const s = t?.shape ?? [];
      if (t === undefined || t.dtype !== "F32" || s.length !== 5 || s[0] !== 1 || s[1] !== 64 || s[2] !== 1) {
        throw new TpError(
          "E_SHAPE",
          `${path}: a Qwen-Image-2.1 latent is an F32 'latent' [1, 64, 1, h, w], got ${t ? `${t.dtype} [${s.join(", ")}]` : "none"}`,
          { file: path, tensor: "latent" },
        );
      }
      const bytes = src.data("latent").slice();
      return {
        data: new Float32Array(bytes.buffer, 0, bytes.byteLength / 4),
        shape: s,
        metadata: Object.fromEntries(src.metadata ?? []),
      };
    } finally {
      src.close();
    }
  },
};

interface Parts {
  readonly backend: Backend;
  readonly files: PipelineFiles;
  readonly mode: QwenImageDitMode;
  readonly teMode: QwenImageTextMode;
  readonly scheduler: string | undefined;
  encoder<T>(fn: (te: QwenImageTextEncoder) => Promise<T>): Promise<T>;
  models(report: (e: GenerateEvent) => void): { dit: QwenImageDit; vae: QwenImageVaeDecoder; owned: boolean };
}

/** AUTOMATIC1111's `quote`. */
const quote = (v: string): string => (/[,:\n"]/.test(v) ? JSON.stringify(v) : v);

/** One run: checks, conditioning, models, sampling, PNG text. */
async function runQwenImage(o: ImageRequest, report: ProgressCallback, run: Parts): Promise<GeneratedImage> {
  const { backend, files } = run;
  if (o.vramBudget !== undefined)
    throw new TpError(
      "E_UNSUPPORTED",
      "--vram-budget is not implemented for Qwen-Image-2.1 yet (Krea 2 only)",
    );
  const d = QWEN_IMAGE_DEFAULTS;
  const cfg = o.cfg ?? d.cfg;
  const seed = o.seed ?? BigInt(d.seed);
  const steps = o.steps ?? d.steps;
  const schedule = oneOf<QwenImageSchedule>("schedule", o.schedule, d.schedule, QWEN_IMAGE_SCHEDULES);
  const size = qwenImageSize(o.width ?? d.width, o.height ?? d.height);
  const scheduler = readQwenImageScheduler(run.scheduler);
  const useCfg = Math.fround(cfg) !== 1;
  const { condIn, textEncoder: tePath } = files;
  if (condIn === undefined && tePath === undefined) {
    throw new TpError("E_ARG", "missing --text-encoder (the Qwen3-VL-8B text encoder, or pass --cond-in)");
  }
  const saved = condIn === undefined ? undefined : readConditioning(condIn);
  if (size.notice) report({ kind: "notice", text: size.notice });
  if (o.negative !== undefined && !useCfg) {
    report({
      kind: "notice",
      text: "--negative is ignored at cfg 1 (no negative pass); raise --cfg to use it",
    });
  }
  // cfg > 1 without a negative: ComfyUI's behaviour (an empty negative prompt), said once.
  let negativeText = useCfg ? o.negative : undefined;
  if (useCfg && negativeText === undefined && !saved?.negative) {
    negativeText = "";
    report({
      kind: "notice",
      text: `--cfg ${cfg} without --negative: the negative is the empty prompt (as ComfyUI)`,
    });
  }

  const tCond = performance.now();
  using held = new DisposableStack();
  let prompt = o.prompt;
  let positive: Conditioning | HostConditioning;
  let negative: Conditioning | HostConditioning | undefined;
  let teLine = "";
  const encode = (texts: readonly string[]) =>
    run.encoder(async (te) => {
      teLine = `; text encoder ${stem(tePath as string)} (${te.description}, ${run.teMode})`;
      const out: Conditioning[] = [];
      for (const t of texts) out.push(held.use(await te.encode(t)));
      return out;
    });
  if (saved !== undefined) {
    prompt ??= saved.metadata.prompt ?? "";
    positive = saved.positive;
    if (useCfg) {
      if (o.negative !== undefined || !saved.negative) {
        if (tePath === undefined) {
          throw new TpError(
            "E_ARG",
            `cfg ${cfg} needs a negative: --text-encoder F to encode it, or a 'negative' tensor in --cond-in ${condIn}`,
          );
        }
        negative = (await encode([negativeText ?? ""]))[0];
      } else {
        negative = saved.negative;
        negativeText = saved.metadata.negative_prompt ?? "";
      }
    }
  } else {
    const texts = useCfg ? [prompt ?? "", negativeText ?? ""] : [prompt ?? ""];
    const [p, n] = await encode(texts);
    positive = p as Conditioning;
    negative = n;
  }
  const condMs = performance.now() - tCond;

  const tLoad = performance.now();
  const { dit, vae, owned } = run.models(report);
  if (owned) {
    held.use(dit);
    held.use(vae);
  }
  const loadMs = performance.now() - tLoad;
  report({
    kind: "start",
    text: `${dit.layout.description} (${run.mode}); VAE ${stem(files.vae)}${teLine}; ${size.width}x${size.height}, ${steps} steps (${schedule}), cfg ${cfg}, seed ${seed}, ${backend.device}`,
  });
  const result = await generateQwenImage({
    dit,
    vae,
    positive,
    ...(negative ? { negative } : {}),
    width: size.width,
    height: size.height,
    steps,
    cfg,
    seed,
    schedule,
    scheduler,
    noiseKernel: o.noise ?? "avx2",
    ...(saved === undefined && tePath !== undefined ? { textEncoderFile: tePath } : {}),
    onStep: async (s) => {
      await report({
        kind: "step",
        step: s.step + 1,
        steps: s.steps,
        stepMs: s.stepMs,
        elapsedMs: s.elapsedMs,
        // [1, 64, h, w] as the event's [1, channels, frames, h, w]
        ...(o.preview
          ? {
              denoised: {
                data: (await backend.read(s.denoised)) as Float32Array,
                shape: [
                  1,
                  s.denoised.shape[1] as number,
                  1,
                  s.denoised.shape[2] as number,
                  s.denoised.shape[3] as number,
                ],
              },
            }
          : {}),
      });
    },
  });

  const fields: [string, string][] = [
    ["Steps", String(steps)],
    ["Sampler", "Euler"],
    ["Schedule type", schedule === "comfy" ? "Simple (ComfyUI, shift 0.69)" : "Diffusers (dynamic shift)"],
    ["CFG scale", Number.isInteger(cfg) ? cfg.toFixed(1) : String(cfg)],
    ["Seed", String(seed)],
    ["Size", `${result.width}x${result.height}`],
    ["Model", stem(files.dit)],
    ["Quantization", run.mode],
    ["VAE", stem(files.vae)],
    ["Version", "TensorPencil"],
  ];
  const parameters = `${prompt ?? ""}\n${negativeText ? `Negative prompt: ${negativeText}\n` : ""}${fields.map(([k, v]) => `${k}: ${quote(v)}`).join(", ")}`;
  const tensorpencil = JSON.stringify({
    model: "qwen-image-2.1",
    prompt: prompt ?? "",
    negative_prompt: negativeText ?? null,
    width: result.width,
    height: result.height,
    steps,
    cfg,
    seed: String(seed),
    schedule,
    sampler: "euler",
    noise: o.noise ?? "avx2",
    dit_mode: run.mode,
    ...(condIn === undefined ? { te_mode: run.teMode } : {}),
    dit: basename(files.dit),
    vae: basename(files.vae),
    conditioning: condIn === undefined ? basename(tePath as string) : basename(condIn),
  });
  let conditioning: GeneratedImage["conditioning"];
  if (o.keepConditioning) {
    const host = async (c: Conditioning | HostConditioning) =>
      c instanceof Conditioning ? await c.read() : c;
    conditioning = {
      positive: await host(positive),
      ...(negative ? { negative: await host(negative) } : {}),
      metadata: {
        prompt: prompt ?? "",
        ...(negativeText !== undefined ? { negative_prompt: negativeText } : {}),
      },
    };
  }
  const [, c, h, w] = result.latentShape;
  const tm = result.timings;
  return {
    width: result.width,
    height: result.height,
    rgb: rgbOf(result.rgba),
    rgba: result.rgba,
    latent: { data: result.latent, shape: [1, c, 1, h, w] },
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
