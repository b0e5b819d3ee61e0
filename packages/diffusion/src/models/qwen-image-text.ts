/**
 * Qwen-Image-2.1's prompt encoder (../shared/spec/qwen-image.md §3–4): the prompt in the 2.1 template,
 * tokenized as one plain string with Qwen's byte-level BPE (special tokens matched whole), run through
 * the Qwen3-VL-8B language model (@tp/llm's Qwen3, `forward(ids, { collect: [layers] })`: the last
 * layer's output before the final norm), and the system turn (14 tokens) dropped. The result,
 * `[1, tokens − 14, hidden]`, is the DiT's context.
 *
 * The tokenizer: `processor/tokenizer.json` of the Qwen repository (diffusers layout: beside
 * `text_encoder/`; ComfyUI layout: the same file fetched beside `text_encoders/`), else a
 * `tokenizer.json` beside the file, else the pinned npm copy Krea 2 uses.
 *
 * The weights, as the transformer's (qwen-image.md §10.3): by default (`q8`) the seven projections of
 * every layer (`self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`) of a float file are quantized
 * once to INT8 ConvRot into a cache beside the file (@tp/quant's `openQuantCache`: keyed by the
 * file's name, size and mtime, rebuilt on change, `TP_CACHE_DIR` when the folder is read-only) and
 * memory-mapped later; `q4` INT4 ConvRot; the embedding table, the norms and `lm_head` (unused) stay
 * float. A file whose projections are already quantized (ComfyUI's fp8 scaled, INT8 ConvRot) is used
 * as stored in `q8` and `q4`. `native` runs the file's own format, `f32` decodes it to f32.
 *
 * Sources: qwen-image.md §3 (template, drop rule), §4 (encoder), §10.3 (quantize on load); ComfyUI
 * comfy/text_encoders/qwen_image21.py (`TextEncodeQwenImage21` replaces an empty prompt by " ").
 */
import { existsSync, statSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { openCheckpoint, quantizableWeights, type TensorSource } from "@tp/formats";
import { loadQwen3VlText, type Qwen3HiddenStates, qwen3VlTextLayout } from "@tp/llm";
import { type GroupSizeRule, openQuantCache, type WeightQuantizer } from "@tp/quant";
import { type Backend, TpError } from "@tp/tensor";
import type { Tokenizer } from "@tp/tokenizer";
import { Conditioning, type PromptEncoder } from "../conditioning.ts";
import { krea2Tokenizer } from "./krea2-text.ts";

/** The system turn every prompt is preceded by (qwen-image.md §3); its tokens are dropped. */
export const QWEN_IMAGE_SYSTEM_TURN =
  "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n";

/** Tokens of {@link QWEN_IMAGE_SYSTEM_TURN} (asserted on the tokenizer at load). */
export const QWEN_IMAGE_DROP = 14;

/** TensorPencil's bound on kept conditioning tokens (the spec sets none), as Krea 2's. */
export const QWEN_IMAGE_MAX_TEXT_TOKENS = 4096;

/**
 * The string the tokenizer sees for a prompt (qwen-image.md §3): system turn, user turn, the assistant
 * header, no `<think>` block. An empty prompt becomes " " as ComfyUI's node does.
 */
export function qwenImagePromptText(prompt: string): string {
  const p = prompt === "" ? " " : prompt;
  return `${QWEN_IMAGE_SYSTEM_TURN}<|im_start|>user\n${p}<|im_end|>\n<|im_start|>assistant\n`;
}

/**
 * Token ids of the templated prompt, in one call with special tokens matched.
 * @throws TpError E_STATE when the system turn does not tokenize to {@link QWEN_IMAGE_DROP} leading ids
 *   (a tokenizer that is not Qwen's)
 */
export function qwenImagePromptIds(tokenizer: Tokenizer, prompt: string): number[] {
  const ids = tokenizer.encode(qwenImagePromptText(prompt), { parseSpecial: true });
  const pre = tokenizer.encode(QWEN_IMAGE_SYSTEM_TURN, { parseSpecial: true });
  if (pre.length !== QWEN_IMAGE_DROP || pre.some((id, i) => ids[i] !== id)) {
    throw new TpError(
      "E_STATE",
      `the tokenizer gives ${pre.length} tokens for the Qwen-Image system turn (Qwen's gives ${QWEN_IMAGE_DROP}): use Qwen's processor/tokenizer.json`,
    );
  }
  return ids;
}

/**
 * Qwen's tokenizer for a Qwen-Image-2.1 text encoder: `../processor/tokenizer.json` from the encoder's
 * folder (both layouts), else what {@link krea2Tokenizer} finds (beside the file, or the npm copy).
 * @param checkpoint the text-encoder file or its index
 */
export function qwenImageTokenizer(checkpoint: string): Tokenizer {
  const p = resolve(checkpoint);
  const dir = existsSync(p) && statSync(p).isDirectory() ? p : dirname(p);
  const processor = join(dir, "..", "processor", "tokenizer.json");
  return krea2Tokenizer(existsSync(processor) ? processor : checkpoint);
}

/**
 * How the language model's projections are computed (the module comment): `q8` (default) INT8 /
 * `q4` INT4 ConvRot through a quantize-on-load cache (a file already quantized: as stored), `native`
 * (the file's format, e.g. bf16) or `f32` (decoded at load; ComfyUI's fp32 CPU reference).
 */
export type QwenImageTextMode = "q8" | "q4" | "native" | "f32";

/** The modes of {@link QwenImageTextMode}, the default first. */
export const QWEN_IMAGE_TEXT_MODES: readonly QwenImageTextMode[] = ["q8", "q4", "native", "f32"];

/**
 * Rotation groups of the text encoder's quantized projections: per layer the largest of these that
 * divides its K. Qwen3-VL-8B's K (4096, 12288) takes 256 (int8) and 64 (int4, as the transformer's
 * `--q4`); the narrower tiny files go down to 4, the smallest ConvRot group.
 */
export const QWEN_IMAGE_TEXT_GROUPS: Readonly<Record<"q8" | "q4", readonly number[]>> = {
  q8: [256, 64, 16, 4],
  q4: [64, 16, 4],
};

/** Formats of `layers.0.self_attn.q_proj` that are quantized on load (@tp/formats' variant names). */
const FLOAT_VARIANTS = new Set(["bf16", "f16", "f32"]);

/** One group rule per projection (its full name), from {@link QWEN_IMAGE_TEXT_GROUPS}. */
function textEncoderGroups(src: TensorSource, mode: "q8" | "q4"): GroupSizeRule[] {
  const rules: GroupSizeRule[] = [];
  for (const name of quantizableWeights(src).names) {
    const k = src.tensor(name).shape[1] as number;
    const g = QWEN_IMAGE_TEXT_GROUPS[mode].find((size) => k % size === 0);
    // none: planQuantization's E_SHAPE names the tensor and K
    if (g !== undefined) rules.push({ pattern: name, groupSize: g });
  }
  return rules;
}

/** Qwen-Image-2.1's prompt encoder: prompt → {@link Conditioning} `[1, kept, hidden]`. */
export class QwenImageTextEncoder implements PromptEncoder, Disposable {
  /** Usually through {@link loadQwenImageTextEncoder}. */
  constructor(
    readonly model: Qwen3HiddenStates,
    readonly tokenizer: Tokenizer,
    /** The file's detected layout, for people. */
    readonly description: string,
    /** What became of the weights in `q8` / `q4` (cache built / hit / rebuilt and its path, or used as stored), one line. */
    readonly note?: string,
  ) {}

  /** Conditioning width: the language model's hidden size. */
  get width(): number {
    return this.model.config.hidden_size;
  }

  /** Token ids of a prompt in the template ({@link qwenImagePromptIds}). */
  ids(prompt: string): number[] {
    return qwenImagePromptIds(this.tokenizer, prompt);
  }

  /**
   * Conditioning of templated ids: all layers over the sequence, the last one's output (no final norm),
   * rows from {@link QWEN_IMAGE_DROP} on.
   * @returns `[1, ids − 14, hidden]` f32 on the encoder's backend, owned by the caller
   * @throws TpError E_ARG for ids not longer than the system turn, or more than the token bound
   */
  async encodeIds(ids: readonly number[]): Promise<Conditioning> {
    const kept = ids.length - QWEN_IMAGE_DROP;
    if (kept < 1 || kept > QWEN_IMAGE_MAX_TEXT_TOKENS) {
      throw new TpError(
        "E_ARG",
        `the prompt is ${kept} tokens after the system turn; Qwen-Image-2.1 runs take 1 to ${QWEN_IMAGE_MAX_TEXT_TOKENS}`,
      );
    }
    const [hidden] = this.model.forward(ids, { collect: [this.model.config.num_hidden_layers] });
    const h = hidden as NonNullable<typeof hidden>;
    try {
      const b = this.model.backend;
      return new Conditioning(b.slice(h, 0, QWEN_IMAGE_DROP, ids.length).reshape(1, kept, this.width));
    } finally {
      h[Symbol.dispose]();
    }
  }

  /** The conditioning of one prompt. */
  encode(prompt: string): Promise<Conditioning> {
    return this.encodeIds(this.ids(prompt));
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Free the model and close its file. */
  dispose(): void {
    this.model.dispose();
  }
}

/** Options of {@link loadQwenImageTextEncoder}. */
export interface LoadQwenImageTextEncoderOptions {
  readonly backend: Backend;
  /** Default `q8` (the product default, as the transformer's). */
  readonly mode?: QwenImageTextMode;
  /** A tokenizer instead of {@link qwenImageTokenizer}'s choice. */
  readonly tokenizer?: Tokenizer;
  /** The quantizer for a cache that must be built (the CLI passes @tp/backend-cpu's native one). */
  readonly quantizer?: WeightQuantizer;
  /** Fallback cache folder for a read-only folder (default `$TP_CACHE_DIR`, XDG, `~/.cache`). */
  readonly cacheDir?: string;
}

/**
 * The tensors of a text-encoder file for `q8` / `q4`: a float file through its quantize-on-load
 * cache, a quantized one as it is; and one line saying which.
 * @throws TpError E_FORMAT when it is not a Qwen3-VL text encoder; as openQuantCache
 */
function quantizedSource(
  path: string,
  mode: "q8" | "q4",
  options: LoadQwenImageTextEncoderOptions,
): { source: TensorSource; note: string } {
  const src = openCheckpoint(path);
  try {
    const variant = qwen3VlTextLayout(src, path).variant ?? "unknown";
    if (!FLOAT_VARIANTS.has(variant))
      return { source: src, note: `text encoder ${basename(path)} used as stored (${variant})` };
    const cache = openQuantCache(src, {
      format: mode === "q4" ? "int4_convrot" : "int8_convrot",
      groupSizes: textEncoderGroups(src, mode),
      ...(options.quantizer ? { quantizer: options.quantizer } : {}),
      ...(options.cacheDir ? { cacheDir: options.cacheDir } : {}),
    });
    return {
      source: cache.source,
      note: `text encoder ${mode === "q4" ? "int4" : "int8"} ConvRot cache ${cache.status}: ${cache.path}`,
    };
  } catch (e) {
    src.close();
    throw e;
  }
}

/**
 * Open Qwen-Image-2.1's text encoder: a Qwen3-VL language-model file (diffusers `text_encoder/`
 * with prefix `model.language_model.`, or ComfyUI's `text_encoders/qwen3vl_8b_*.safetensors`; sizes
 * from tensor shapes), its weights in `mode` (the module comment), and Qwen's tokenizer.
 * @throws TpError E_IO for a missing file or tokenizer, or a cache that can be written nowhere;
 *   E_FORMAT when it is not a Qwen3-VL text encoder; E_ARG for an unknown mode; E_STATE for a
 *   tokenizer that is not Qwen's; E_SHAPE for a projection no ConvRot group divides
 */
export function loadQwenImageTextEncoder(
  path: string,
  options: LoadQwenImageTextEncoderOptions,
): QwenImageTextEncoder {
  const mode = options.mode ?? "q8";
  if (!QWEN_IMAGE_TEXT_MODES.includes(mode)) {
    throw new TpError(
      "E_ARG",
      `unknown text-encoder mode '${mode}'; expected one of: ${QWEN_IMAGE_TEXT_MODES.join(", ")}`,
    );
  }
  if (!existsSync(path)) {
    throw new TpError("E_IO", `cannot open the text encoder ${path}: no such file`, { file: path });
  }
  const q = mode === "q8" || mode === "q4" ? quantizedSource(path, mode, options) : undefined;
  const { model, layout } = loadQwen3VlText(path, {
    backend: options.backend,
    weights: mode === "f32" ? "f32" : "native",
    ...(q ? { source: q.source } : {}),
  });
  try {
    const tokenizer = options.tokenizer ?? qwenImageTokenizer(path);
    const enc = new QwenImageTextEncoder(model, tokenizer, layout.description, q?.note);
    enc.ids(""); // the drop-14 check, before any long work
    return enc;
  } catch (e) {
    model.dispose();
    throw e;
  }
}
