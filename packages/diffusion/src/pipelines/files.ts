/**
 * The files a Krea 2 run can save and resume from, as safetensors (written atomically by @tp/formats):
 * - conditioning (`--cond-out` / `--cond-in`, `bun apps/cli encode`): tensor `positive`
 *   `[1, seq, taps·dim]` f32 and, when a text negative was encoded, `negative` of the same width —
 *   what ComfyUI's text-encode node hands the sampler (krea2.md §2.5);
 * - latent (`--latent-out`, `bun apps/cli decode`): tensor `latent` `[1, 16, 1, h, w]` f32 in VAE space
 *   (x·std + mean, what the VAE decodes; krea2.md §5.2).
 * Both carry string metadata (`__metadata__`): `format` names the kind, and the prompt / settings ride
 * along so a later step can write them into the PNG.
 */
import { existsSync } from "node:fs";
import { identifyCheckpoint, openSafetensors, type SafetensorsFile, writeSafetensors } from "@tp/formats";
import { checkFiniteHost, isTpError, TpError } from "@tp/tensor";
import type { HostConditioning } from "../conditioning.ts";
import { checkKrea2Latent } from "./krea2.ts";

/** `__metadata__.format` of a conditioning file. */
export const CONDITIONING_FORMAT = "tensorpencil.krea2.conditioning";
/** `__metadata__.format` of a latent file. */
export const LATENT_FORMAT = "tensorpencil.krea2.latent";

/** f32 bytes of a Float32Array (a view, no copy). */
function bytesOf(a: Float32Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** A copy of an F32 tensor's bytes as a Float32Array (the mapping need not be 4-aligned). */
function readF32(src: SafetensorsFile, name: string): Float32Array {
  const copy = src.data(name).slice();
  return new Float32Array(copy.buffer, 0, copy.byteLength / 4);
}

/** What the file looks like, for messages: the detected checkpoint kind, or a few tensor names. */
function describe(src: SafetensorsFile): string {
  try {
    const layout = identifyCheckpoint(src);
    return `a ${layout.description}`;
  } catch (e) {
    if (!isTpError(e)) throw e;
  }
  const names = src.tensors.slice(0, 4).map((t) => t.name);
  return names.length === 0 ? "an empty file" : `a file with tensors ${names.join(", ")}`;
}

/** Open a safetensors file we are about to read, with E_IO naming the flag's file when missing. */
function open(path: string, what: string): SafetensorsFile {
  if (!existsSync(path))
    throw new TpError("E_IO", `cannot open the ${what} ${path}: no such file`, { file: path });
  return openSafetensors(path);
}

/** One F32 tensor of rank `rank`, or E_FORMAT saying what the file is instead. */
function f32Tensor(
  src: SafetensorsFile,
  name: string,
  rank: number,
  what: string,
): { data: Float32Array; shape: number[] } {
  if (!src.has(name)) {
    throw new TpError(
      "E_FORMAT",
      `${src.path} is not a ${what} file: no tensor '${name}'; it looks like ${describe(src)}`,
      { file: src.path },
    );
  }
  const t = src.tensor(name);
  if (t.dtype !== "F32" || t.shape.length !== rank) {
    throw new TpError(
      "E_FORMAT",
      `${what} tensor '${name}' is ${t.dtype} [${t.shape.join(", ")}]; expected F32 of rank ${rank}`,
      { file: src.path, tensor: name },
    );
  }
  const data = readF32(src, name);
  checkFiniteHost(data, { stage: `the saved ${what}`, file: src.path, tensor: name });
  return { data, shape: [...t.shape] };
}

/** Conditioning as stored: positive, optional negative, and the file's metadata. */
export interface ConditioningFile {
  readonly positive: HostConditioning;
  readonly negative?: HostConditioning;
  /** `__metadata__` (e.g. `prompt`, `negative_prompt`). */
  readonly metadata: Readonly<Record<string, string>>;
}

/**
 * Write conditioning to a safetensors file (temporary name, then rename).
 * @param path     output `.safetensors`
 * @param cond     `positive` and optionally `negative`, each `[1, seq, taps·dim]` f32
 * @param metadata extra `__metadata__` strings (the prompt texts, the encoder file)
 * @throws TpError E_SHAPE for a conditioning whose data does not fill its shape or whose widths differ;
 *   E_IO when the file cannot be written
 */
export function writeConditioning(
  path: string,
  cond: { readonly positive: HostConditioning; readonly negative?: HostConditioning },
  metadata: Readonly<Record<string, string>> = {},
): void {
  const tensors: [string, HostConditioning][] = [["positive", cond.positive]];
  if (cond.negative) tensors.push(["negative", cond.negative]);
  for (const [name, c] of tensors) {
    if (c.shape.length !== 3 || c.data.length !== c.shape[0] * c.shape[1] * c.shape[2]) {
      throw new TpError("E_SHAPE", `${name} conditioning: ${c.data.length} values for shape [${c.shape}]`);
    }
    checkFiniteHost(c.data, { stage: `the ${name} conditioning to write`, file: path });
  }
  if (cond.negative && cond.negative.shape[2] !== cond.positive.shape[2]) {
    throw new TpError(
      "E_SHAPE",
      `negative conditioning width ${cond.negative.shape[2]} differs from the positive's ${cond.positive.shape[2]}`,
    );
  }
  writeSafetensors(
    path,
    tensors.map(([name, c]) => ({ name, dtype: "F32", shape: [...c.shape], data: bytesOf(c.data) })),
    { metadata: { format: CONDITIONING_FORMAT, ...metadata } },
  );
}

/**
 * Read a conditioning file ({@link writeConditioning}, or any safetensors with an F32 `positive`
 * `[1, seq, width]` and optionally `negative`).
 * @throws TpError E_IO for a missing file; E_FORMAT when it has no `positive` tensor (saying what the
 *   file looks like, e.g. a VAE) or a tensor is not F32 rank 3; E_SHAPE when the widths differ
 */
export function readConditioning(path: string): ConditioningFile {
  const src = open(path, "conditioning file");
  try {
    const pos = f32Tensor(src, "positive", 3, "conditioning");
    const neg = src.has("negative") ? f32Tensor(src, "negative", 3, "conditioning") : undefined;
    if (neg && neg.shape[2] !== pos.shape[2]) {
      throw new TpError(
        "E_SHAPE",
        `negative conditioning width ${neg.shape[2]} differs from the positive's ${pos.shape[2]}`,
        { file: path },
      );
    }
    const asCond = (t: { data: Float32Array; shape: number[] }): HostConditioning => ({
      data: t.data,
      shape: t.shape as [number, number, number],
    });
    return {
      positive: asCond(pos),
      ...(neg ? { negative: asCond(neg) } : {}),
      metadata: Object.fromEntries(src.metadata ?? []),
    };
  } finally {
    src.close();
  }
}

/** A latent as stored. */
export interface LatentFile {
  /** f32 in VAE space. */
  readonly data: Float32Array;
  /** `[1, channels, 1, h, w]`. */
  readonly shape: readonly number[];
  /** `__metadata__` (the run's prompt and settings, when written by the CLI). */
  readonly metadata: Readonly<Record<string, string>>;
}

/**
 * Write a latent (VAE space) to a safetensors file (temporary name, then rename).
 * @param shape `[1, channels, 1, h, w]`
 * @throws TpError E_SHAPE when data does not fill the shape; E_IO when the file cannot be written
 */
export function writeLatent(
  path: string,
  latent: { readonly data: Float32Array; readonly shape: readonly number[] },
  metadata: Readonly<Record<string, string>> = {},
): void {
  const n = latent.shape.reduce((a, b) => a * b, 1);
  if (latent.shape.length !== 5 || latent.data.length !== n) {
    throw new TpError("E_SHAPE", `latent: ${latent.data.length} values for shape [${latent.shape}] (rank 5)`);
  }
  checkFiniteHost(latent.data, { stage: "the latent to write", file: path });
  writeSafetensors(
    path,
    [{ name: "latent", dtype: "F32", shape: [...latent.shape], data: bytesOf(latent.data) }],
    {
      metadata: { format: LATENT_FORMAT, ...metadata },
    },
  );
}

/**
 * Read a latent file ({@link writeLatent}: an F32 `latent` `[1, 16, 1, h, w]` in VAE space), its shape
 * checked before its data is read.
 * @throws TpError E_IO for a missing file; E_FORMAT when there is no F32 rank-5 `latent` tensor
 *   (saying what the file looks like); E_SHAPE naming the file and tensor when the shape is not
 *   `[1, 16, 1, h, w]` with 8h and 8w within Krea 2's 16 … 16384 pixels ({@link checkKrea2Latent})
 */
export function readLatent(path: string): LatentFile {
  const src = open(path, "latent file");
  try {
    if (src.has("latent")) {
      const info = src.tensor("latent");
      if (info.dtype === "F32" && info.shape.length === 5) {
        checkKrea2Latent(info.shape, undefined, { file: path, tensor: "latent" });
      }
    }
    const t = f32Tensor(src, "latent", 5, "latent");
    return { data: t.data, shape: t.shape, metadata: Object.fromEntries(src.metadata ?? []) };
  } finally {
    src.close();
  }
}
