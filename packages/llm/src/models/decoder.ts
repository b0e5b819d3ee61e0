/**
 * What the decoder-only architectures (models/llama.ts, models/qwen3.ts) share: the hyper-parameters
 * read from GGUF metadata or config.json, the per-layer weights read by Hugging Face names, and
 * {@link DecoderLM}, the {@link CausalLM} around a stack of pre-norm blocks — token embedding, the
 * layers, the final RMSNorm and the LM head, a KV cache, and the attention and SwiGLU MLP pieces every
 * block uses. An architecture file holds its config rules and its block's forward, in the paper's order.
 *
 * Everything runs as ops on a {@link Backend}; no tensor data is read on the host. Weights are the
 * checkpoint's own bytes (`Weight` views on the memory mapping, any format the backend's matmul takes);
 * only the 1-D norm scales are uploaded (as f32).
 *
 * Sources: ../shared/spec/llm.md §1.1.1 (GGUF keys), §3.0 (building blocks), §3.1 (the Qwen3 forward,
 * the same as Llama's without QK-norm), §7.1 (the stepper), §7.2–7.3 (KV cache); huggingface/transformers
 * `models/llama/modeling_llama.py`; ggml-org/llama.cpp `src/models/llama.cpp`, `src/llama-model.cpp`
 * (hparams defaults: rope.freq_base 10000, n_rot = head_dim).
 */
import type { GgufMetadata, TensorEntry, TensorSource } from "@tp/formats";
import { loadWeight } from "@tp/formats";
import {
  type Backend,
  type DTypeName,
  type RopeOptions,
  type Tensor,
  TpError,
  type Weight,
} from "@tp/tensor";
import { KvCache } from "../kv-cache.ts";
import type { CausalLM, LlmConfig, StepOptions } from "../model.ts";

// ---------------------------------------------------------------------------------------------------
// Reading a checkpoint by Hugging Face names

/**
 * A checkpoint seen through Hugging Face tensor names (`model.layers.0.self_attn.q_proj.weight`):
 * `name(hf)` gives the name in the file (GGUF `blk.0.attn_q.weight`, or the HF name with a prefix).
 */
export interface CheckpointReader {
  /** The opened checkpoint. */
  readonly source: TensorSource;
  /** The file's name of an HF tensor name. */
  name(hf: string): string;
}

/** True when the checkpoint has the tensor of this HF name. */
export function hasTensor(r: CheckpointReader, hf: string): boolean {
  return r.source.has(r.name(hf));
}

function entryOf(r: CheckpointReader, hf: string): TensorEntry {
  const name = r.name(hf);
  if (!r.source.has(name)) {
    throw new TpError(
      "E_FORMAT",
      `missing tensor '${name}'${name === hf ? "" : ` (HF ${hf})`}: the checkpoint is incomplete or not this architecture`,
      { file: r.source.path, tensor: name },
    );
  }
  return r.source.tensor(name);
}

/**
 * A matmul weight [N, K] (`y = x · Wᵀ`) by HF name, in its stored format (f32, f16, bf16, fp8 with its
 * scale, GGUF blocks, …; format detection by @tp/formats `loadWeight`), checked against the shape the
 * config implies.
 * @throws TpError E_FORMAT naming file and tensor when it is missing or its shape differs
 */
export function readWeight(r: CheckpointReader, hf: string, shape: readonly [number, number]): Weight {
  const e = entryOf(r, hf);
  const w = loadWeight(r.source, e.name, shape[1]);
  if (e.shape.length !== 2 || w.shape[0] !== shape[0] || w.shape[1] !== shape[1]) {
    throw new TpError(
      "E_FORMAT",
      `tensor shape [${e.shape.join(", ")}] (as [N, K]: [${w.shape.join(", ")}]) differs from [${shape.join(", ")}] that the config implies`,
      { file: e.file, tensor: e.name },
    );
  }
  return w;
}

const VECTOR_DTYPES: Readonly<Record<string, DTypeName>> = { f32: "f32", f16: "f16", bf16: "bf16" };

/**
 * A 1-D float tensor of `length` (a norm scale) by HF name, uploaded to the backend as f32 [length]
 * (f16 / bf16 are converted with backend.cast).
 * @throws TpError E_FORMAT naming file and tensor when missing, of another length, or not a float type
 */
export function readVector(backend: Backend, r: CheckpointReader, hf: string, length: number): Tensor {
  const e = entryOf(r, hf);
  const numel = e.shape.reduce((a, b) => a * b, 1);
  const dtype = e.format === null ? undefined : VECTOR_DTYPES[e.format];
  if (dtype === undefined || numel !== length || e.shape.filter((d) => d !== 1).length > 1) {
    throw new TpError(
      "E_FORMAT",
      `expected a float vector of ${length} (f32, f16 or bf16), got ${e.dtype} [${e.shape.join(", ")}]`,
      { file: e.file, tensor: e.name },
    );
  }
  const up = backend.upload(r.source.data(e.name), [length], dtype, hf);
  if (dtype === "f32") return up;
  try {
    return backend.cast(up, "f32");
  } finally {
    backend.free(up);
  }
}

// ---------------------------------------------------------------------------------------------------
// Hyper-parameters

/**
 * Rules an architecture adds to the common GGUF / config.json reading.
 */
export interface ConfigRules {
  /** GGUF `general.architecture` / LlmConfig.architecture. */
  readonly architecture: string;
  /** RoPE layout of the file's q/k rows. */
  readonly rope_mode: LlmConfig["rope_mode"];
}

function need(v: number | undefined, key: string, file: string): number {
  if (v === undefined) throw new TpError("E_FORMAT", `missing metadata key '${key}'`, { file });
  if (!Number.isFinite(v))
    throw new TpError("E_FORMAT", `'${key}' must be a finite number, got ${v}`, { file });
  return v;
}

/** An RMSNorm epsilon: finite and ≥ 0 (the norm divides by √(mean(x²) + ε)). */
function epsilon(v: number, key: string, file: string): number {
  if (!Number.isFinite(v) || v < 0)
    throw new TpError("E_FORMAT", `'${key}' must be a finite number ≥ 0, got ${v}`, { file });
  return v;
}

/** A RoPE base frequency: finite and > 0 (angles are position · θ^(−2i/d)). */
function ropeBase(v: number, key: string, file: string): number {
  if (!Number.isFinite(v) || v <= 0)
    throw new TpError("E_FORMAT", `'${key}' must be a finite number > 0, got ${v}`, { file });
  return v;
}

function positive(v: number, key: string, file: string): number {
  if (!Number.isSafeInteger(v) || v < 1) {
    throw new TpError("E_FORMAT", `'${key}' must be a positive integer, got ${v}`, { file });
  }
  return v;
}

/** Rows of the token embedding (the vocabulary the weights have; llm.md §1.1.1 "prefer the embedding's row count"). */
function embeddingRows(r: CheckpointReader, hidden: number): number {
  const e = entryOf(r, "model.embed_tokens.weight");
  const rows = e.shape[0];
  if (e.shape.length !== 2 || rows === undefined || e.shape[1] !== hidden) {
    throw new TpError("E_FORMAT", `token embedding [${e.shape.join(", ")}] is not [vocab, ${hidden}]`, {
      file: e.file,
      tensor: e.name,
    });
  }
  return rows;
}

function checkHeads(c: LlmConfig, file: string): LlmConfig {
  if (c.num_attention_heads % c.num_key_value_heads !== 0) {
    throw new TpError(
      "E_FORMAT",
      `${c.num_attention_heads} attention heads are not a multiple of ${c.num_key_value_heads} KV heads`,
      { file },
    );
  }
  return c;
}

/**
 * LlmConfig of a GGUF llama-family file from `{arch}.*` metadata (llm.md §1.1.1). Defaults as llama.cpp
 * `llama-model.cpp`: head_count_kv = head_count, key_length = embedding_length / head_count,
 * rope.freq_base = 10000, rope.dimension_count = head_dim. The vocabulary is the embedding's row count.
 * @throws TpError E_FORMAT for a missing required key or inconsistent sizes; E_UNSUPPORTED for RoPE
 *   scaling (`rope.scaling.type` other than none, or a `rope_freqs.weight` tensor) and value_length ≠ key_length
 */
export function ggufDecoderConfig(meta: GgufMetadata, r: CheckpointReader, rules: ConfigRules): LlmConfig {
  const file = r.source.path;
  const a = rules.architecture;
  const int = (k: string) => meta.getInt(`${a}.${k}`);
  const hidden = positive(
    need(int("embedding_length"), `${a}.embedding_length`, file),
    "embedding_length",
    file,
  );
  const heads = positive(
    need(int("attention.head_count"), `${a}.attention.head_count`, file),
    "head_count",
    file,
  );
  const headDim = int("attention.key_length") ?? hidden / heads;
  const valueLength = int("attention.value_length") ?? headDim;
  if (valueLength !== headDim) {
    throw new TpError(
      "E_UNSUPPORTED",
      `${a}.attention.value_length ${valueLength} differs from key_length ${headDim}; no llama/qwen3 model does that`,
      { file },
    );
  }
  positive(headDim, "head_dim", file);
  const ropeDimKey = `${a}.rope.dimension_count`;
  const rotary = int("rope.dimension_count") ?? headDim;
  if (!Number.isSafeInteger(rotary) || rotary < 2 || rotary % 2 !== 0 || rotary > headDim) {
    throw new TpError(
      "E_FORMAT",
      `'${ropeDimKey}' must be an even integer from 2 to head_dim ${headDim}, got ${rotary}`,
      { file },
    );
  }
  const rows = embeddingRows(r, hidden);
  const vocabKey = `${a}.vocab_size`;
  const vocabMeta = int("vocab_size");
  if (vocabMeta !== undefined && vocabMeta !== rows) {
    throw new TpError("E_FORMAT", `'${vocabKey}' is ${vocabMeta} but the token embedding has ${rows} rows`, {
      file,
      tensor: r.name("model.embed_tokens.weight"),
    });
  }
  const epsKey = `${a}.attention.layer_norm_rms_epsilon`;
  const thetaKey = `${a}.rope.freq_base`;
  const scaling = meta.getString(`${a}.rope.scaling.type`);
  if ((scaling !== undefined && scaling !== "none") || r.source.has("rope_freqs.weight")) {
    throw new TpError(
      "E_UNSUPPORTED",
      `RoPE scaling (${scaling ?? "rope_freqs.weight"}) is not implemented for ${a}; only unscaled RoPE is`,
      { file },
    );
  }
  return checkHeads(
    {
      architecture: a,
      vocab_size: rows,
      hidden_size: hidden,
      num_hidden_layers: positive(need(int("block_count"), `${a}.block_count`, file), "block_count", file),
      num_attention_heads: heads,
      num_key_value_heads: positive(int("attention.head_count_kv") ?? heads, "head_count_kv", file),
      head_dim: positive(headDim, "head_dim", file),
      intermediate_size: positive(
        need(int("feed_forward_length"), `${a}.feed_forward_length`, file),
        "feed_forward_length",
        file,
      ),
      rms_norm_eps: epsilon(need(meta.getFloat(epsKey), epsKey, file), epsKey, file),
      rope_theta: ropeBase(meta.getFloat(thetaKey) ?? 10000, thetaKey, file),
      rope_mode: rules.rope_mode,
      rotary_dim: rotary,
      max_position_embeddings: positive(
        need(int("context_length"), `${a}.context_length`, file),
        "context_length",
        file,
      ),
      tie_word_embeddings: !hasTensor(r, "lm_head.weight"),
    },
    file,
  );
}

/** A config.json value: a number, or undefined when absent or null. */
function num(json: Readonly<Record<string, unknown>>, key: string, file: string): number | undefined {
  const v = json[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new TpError("E_FORMAT", `config.json '${key}' must be a number, got ${JSON.stringify(v)}`, {
      file,
    });
  }
  return v;
}

/**
 * LlmConfig from a Hugging Face config.json (field names as transformers `LlamaConfig` /
 * `Qwen3Config`): head_dim defaults to hidden_size / num_attention_heads, num_key_value_heads to
 * num_attention_heads, rope_theta to 10000; the vocabulary is the embedding's row count; the head is
 * tied when `lm_head.weight` is absent.
 * @param file the config.json path, for messages
 * @throws TpError E_FORMAT for a missing field, or `tie_word_embeddings: false` without lm_head.weight;
 *   E_UNSUPPORTED for `rope_scaling`, attention or MLP biases
 */
export function hfDecoderConfig(
  json: Readonly<Record<string, unknown>>,
  r: CheckpointReader,
  rules: ConfigRules,
  file: string,
): LlmConfig {
  const req = (k: string) => positive(need(num(json, k, file), `config.json ${k}`, file), k, file);
  if (json.rms_norm_eps === null)
    throw new TpError("E_FORMAT", "config.json 'rms_norm_eps' must be a finite number ≥ 0, got null", {
      file,
    });
  const rows = (hidden: number) => {
    const n = embeddingRows(r, hidden);
    const declared = num(json, "vocab_size", file);
    if (declared !== undefined && declared !== n) {
      throw new TpError(
        "E_FORMAT",
        `config.json 'vocab_size' is ${declared} but the token embedding ${r.name("model.embed_tokens.weight")} has ${n} rows`,
        { file },
      );
    }
    return n;
  };
  const hidden = req("hidden_size");
  const heads = req("num_attention_heads");
  const headDim = positive(num(json, "head_dim", file) ?? hidden / heads, "head_dim", file);
  if (headDim % 2 !== 0)
    throw new TpError(
      "E_FORMAT",
      `config.json 'head_dim' must be even (RoPE rotates pairs), got ${headDim}`,
      {
        file,
      },
    );
  const scaling = json.rope_scaling;
  if (scaling !== undefined && scaling !== null) {
    throw new TpError(
      "E_UNSUPPORTED",
      `rope_scaling ${JSON.stringify(scaling)} is not implemented; only unscaled RoPE is`,
      {
        file,
      },
    );
  }
  if (json.attention_bias === true || json.mlp_bias === true) {
    throw new TpError("E_UNSUPPORTED", "attention_bias / mlp_bias are not implemented for llama / qwen3", {
      file,
    });
  }
  const tiedInConfig = json.tie_word_embeddings;
  const hasHead = hasTensor(r, "lm_head.weight");
  if (tiedInConfig === false && !hasHead) {
    throw new TpError(
      "E_FORMAT",
      "config.json says tie_word_embeddings: false but there is no lm_head.weight",
      {
        file: r.source.path,
        tensor: r.name("lm_head.weight"),
      },
    );
  }
  return checkHeads(
    {
      architecture: rules.architecture,
      vocab_size: rows(hidden),
      hidden_size: hidden,
      num_hidden_layers: req("num_hidden_layers"),
      num_attention_heads: heads,
      num_key_value_heads: positive(
        num(json, "num_key_value_heads", file) ?? heads,
        "num_key_value_heads",
        file,
      ),
      head_dim: headDim,
      intermediate_size: req("intermediate_size"),
      rms_norm_eps: epsilon(
        need(num(json, "rms_norm_eps", file), "config.json rms_norm_eps", file),
        "config.json rms_norm_eps",
        file,
      ),
      rope_theta: ropeBase(num(json, "rope_theta", file) ?? 10000, "config.json rope_theta", file),
      rope_mode: rules.rope_mode,
      rotary_dim: headDim,
      max_position_embeddings: req("max_position_embeddings"),
      tie_word_embeddings: tiedInConfig === true || !hasHead,
    },
    file,
  );
}

// ---------------------------------------------------------------------------------------------------
// Weights

/** One pre-norm block's weights, by their HF module names (llm.md §3.1 table). */
export interface DecoderLayerWeights {
  /** f32 [hidden_size] */
  readonly input_layernorm: Tensor;
  /** [n_head·hd, H] */
  readonly q_proj: Weight;
  /** [n_kv·hd, H] */
  readonly k_proj: Weight;
  /** [n_kv·hd, H] */
  readonly v_proj: Weight;
  /** [H, n_head·hd] */
  readonly o_proj: Weight;
  /** Qwen3 QK-norm: f32 [head_dim], shared by all heads; null without QK-norm. */
  readonly q_norm: Tensor | null;
  readonly k_norm: Tensor | null;
  /** f32 [hidden_size]: the pre-MLP norm (GGUF `ffn_norm`). */
  readonly post_attention_layernorm: Tensor;
  /** [FFN, H] */
  readonly gate_proj: Weight;
  /** [FFN, H] */
  readonly up_proj: Weight;
  /** [H, FFN] */
  readonly down_proj: Weight;
}

/** All weights of a decoder-only LM. */
export interface DecoderWeights {
  /** [vocab, H] */
  readonly embed_tokens: Weight;
  readonly layers: readonly DecoderLayerWeights[];
  /** f32 [H], the final norm. */
  readonly norm: Tensor;
  /** [vocab, H]; the embedding itself when tied (same bytes, same format; llm.md §3.0 "LM head"). */
  readonly lm_head: Weight;
}

/**
 * Read every weight of a llama-family decoder by HF names, checking each shape against the config.
 * Matmul weights stay views on the checkpoint's mapping; norm scales are uploaded as f32.
 * @param qkNorm read `self_attn.q_norm` / `k_norm` (Qwen3)
 * @throws TpError E_FORMAT naming file and tensor (missing, wrong shape or type); E_UNSUPPORTED for
 *   biases on the projections
 */
export function readDecoderWeights(
  backend: Backend,
  config: LlmConfig,
  r: CheckpointReader,
  options: { qkNorm: boolean },
): DecoderWeights {
  const { hidden_size: H, head_dim: hd, intermediate_size: F, vocab_size: V } = config;
  const qRows = config.num_attention_heads * hd;
  const kvRows = config.num_key_value_heads * hd;
  const uploaded: Tensor[] = [];
  const vec = (hf: string, n: number) => {
    const t = readVector(backend, r, hf, n);
    uploaded.push(t);
    return t;
  };
  /** A weight the backend must run `op` on, checked now rather than at the first forward. */
  const weight = (hf: string, shape: readonly [number, number], ops: readonly ("matmul" | "embedding")[]) => {
    const w = readWeight(r, hf, shape);
    for (const op of ops) {
      if (!backend.supports(op, [w.format])) {
        throw new TpError(
          "E_UNSUPPORTED",
          `backend ${backend.name} cannot run ${op} on ${w.format} weights; formats it has: ${backend.capabilities().weightFormats.join(", ")}`,
          { file: r.source.path, tensor: r.name(hf) },
        );
      }
    }
    return w;
  };
  const mm = (hf: string, shape: readonly [number, number]) => weight(hf, shape, ["matmul"]);
  try {
    const layers: DecoderLayerWeights[] = [];
    for (let i = 0; i < config.num_hidden_layers; i++) {
      const p = `model.layers.${i}.`;
      for (const b of ["q_proj", "k_proj", "v_proj", "o_proj"]) {
        if (hasTensor(r, `${p}self_attn.${b}.bias`)) {
          throw new TpError(
            "E_UNSUPPORTED",
            `${config.architecture} with attention biases is not implemented`,
            {
              file: r.source.path,
              tensor: r.name(`${p}self_attn.${b}.bias`),
            },
          );
        }
      }
      layers.push({
        input_layernorm: vec(`${p}input_layernorm.weight`, H),
        q_proj: mm(`${p}self_attn.q_proj.weight`, [qRows, H]),
        k_proj: mm(`${p}self_attn.k_proj.weight`, [kvRows, H]),
        v_proj: mm(`${p}self_attn.v_proj.weight`, [kvRows, H]),
        o_proj: mm(`${p}self_attn.o_proj.weight`, [H, qRows]),
        q_norm: options.qkNorm ? vec(`${p}self_attn.q_norm.weight`, hd) : null,
        k_norm: options.qkNorm ? vec(`${p}self_attn.k_norm.weight`, hd) : null,
        post_attention_layernorm: vec(`${p}post_attention_layernorm.weight`, H),
        gate_proj: mm(`${p}mlp.gate_proj.weight`, [F, H]),
        up_proj: mm(`${p}mlp.up_proj.weight`, [F, H]),
        down_proj: mm(`${p}mlp.down_proj.weight`, [H, F]),
      });
    }
    const tied = config.tie_word_embeddings;
    const embed_tokens = weight(
      "model.embed_tokens.weight",
      [V, H],
      tied ? ["embedding", "matmul"] : ["embedding"],
    );
    return {
      embed_tokens,
      layers,
      norm: vec("model.norm.weight", H),
      lm_head: tied ? embed_tokens : mm("lm_head.weight", [V, H]),
    };
  } catch (e) {
    for (const t of uploaded) backend.free(t);
    throw e;
  }
}

/**
 * Read the weights ({@link readDecoderWeights}) and build the model with `make`; when `make` throws
 * (a bad maxContext), the uploaded norm scales are freed before the error propagates.
 */
export function createDecoder<T extends DecoderLM>(
  backend: Backend,
  config: LlmConfig,
  r: CheckpointReader,
  options: { qkNorm: boolean },
  make: (weights: DecoderWeights) => T,
): T {
  const weights = readDecoderWeights(backend, config, r, options);
  try {
    return make(weights);
  } catch (e) {
    for (const t of uploadedTensors(weights)) if (!t.storage.freed) backend.free(t);
    throw e;
  }
}

/** The f32 tensors among a model's weights (what dispose frees). */
function uploadedTensors(w: DecoderWeights): Tensor[] {
  const out: Tensor[] = [w.norm];
  for (const l of w.layers) {
    out.push(l.input_layernorm, l.post_attention_layernorm);
    if (l.q_norm) out.push(l.q_norm);
    if (l.k_norm) out.push(l.k_norm);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// The model

/** Options of a {@link DecoderLM}. */
export interface DecoderOptions {
  /** Context window (KV rows at most); default and ceiling: min(max_position_embeddings, 131072) (llm.md §7.3). */
  readonly maxContext?: number;
  /** KV rows committed at first use at least (llm.md §7.3: 4096); tests use fewer to exercise growth. */
  readonly kvInitialRows?: number;
  /** Called by dispose after the tensors are freed (the loader closes the checkpoint's mappings). */
  readonly onDispose?: () => void;
  /** The checkpoint file, for messages ({@link CausalLM.file}); the loader sets it. */
  readonly file?: string;
}

/** Default ceiling of the context window (llm.md §7.3: the trained context capped at 128k). */
export const MAX_DEFAULT_CONTEXT = 131072;

/** Per-step values a block needs: new rows, the cache length before them, and their positions. */
export interface StepState {
  /** New rows in this forward. */
  readonly n: number;
  /** Rows already in the KV cache (the first new row's position). */
  readonly cached: number;
  /** i32 [n]: positions cached … cached + n − 1. */
  readonly positions: Tensor;
}

/**
 * Tensors to free at the end of a forward. `keep(t)` registers an op's output and returns it; `free()`
 * frees each storage once (views of a freed tensor die with it).
 */
export class Scratch {
  readonly #backend: Backend;
  readonly #tensors: Tensor[] = [];
  /** @param backend the backend that owns the tensors */
  constructor(backend: Backend) {
    this.#backend = backend;
  }
  /** Register `t` (an op's output) to be freed by {@link Scratch.free}; returns it. */
  keep(t: Tensor): Tensor {
    this.#tensors.push(t);
    return t;
  }
  /** Free every registered tensor whose storage is still live. */
  free(): void {
    for (const t of this.#tensors) if (!t.storage.freed) this.#backend.free(t);
    this.#tensors.length = 0;
  }
}

/**
 * A decoder-only transformer of pre-norm blocks with a KV cache: the {@link CausalLM} of llama and
 * qwen3. Subclasses write one block's forward ({@link DecoderLM.block}) with the pieces here:
 * {@link DecoderLM.rope}, {@link DecoderLM.selfAttention}, {@link DecoderLM.mlp}.
 *
 * `step(ids)` runs all new rows in one forward (batched prefill; causal attention with
 * qOffset = cached), writes their keys and values at rows [cached, cached + n) of every layer, and
 * returns logits of the last row (or of every row).
 */
export abstract class DecoderLM implements CausalLM {
  readonly config: LlmConfig;
  readonly backend: Backend;
  readonly weights: DecoderWeights;
  readonly maxContext: number;
  readonly kv: KvCache;
  readonly file: string | undefined;
  readonly #onDispose: (() => void) | undefined;
  #disposed = false;
  /** RoPE as the config says (built once: `rope` runs twice per layer per step). */
  readonly #ropeOptions: RopeOptions;

  /**
   * @throws TpError E_ARG naming `maxContext` when it is not a positive integer or exceeds
   *   max_position_embeddings
   */
  constructor(backend: Backend, config: LlmConfig, weights: DecoderWeights, options: DecoderOptions = {}) {
    this.backend = backend;
    this.config = config;
    this.weights = weights;
    const ceiling = config.max_position_embeddings;
    const maxContext = options.maxContext ?? Math.min(ceiling, MAX_DEFAULT_CONTEXT);
    if (!Number.isSafeInteger(maxContext) || maxContext < 1 || maxContext > ceiling) {
      throw new TpError(
        "E_ARG",
        `maxContext must be an integer from 1 to ${ceiling} (the model's trained context), got ${maxContext}`,
      );
    }
    this.maxContext = maxContext;
    this.kv = new KvCache(backend, {
      layers: config.num_hidden_layers,
      numKvHeads: config.num_key_value_heads,
      headDim: config.head_dim,
      maxContext,
      ...(options.kvInitialRows !== undefined ? { minRows: options.kvInitialRows } : {}),
    });
    this.#onDispose = options.onDispose;
    this.file = options.file;
    this.#ropeOptions = {
      mode: config.rope_mode,
      theta: config.rope_theta,
      ...(config.rotary_dim !== config.head_dim ? { ropeDims: config.rotary_dim } : {}),
    };
  }

  /** Tokens in the KV cache (the next position). */
  get cached(): number {
    return this.kv.length;
  }
  /** KV rows allocated per layer now. */
  get capacity(): number {
    return this.kv.capacity;
  }
  /** Backend bytes of the KV cache (2 · layers · capacity · kv_heads · head_dim · 4). */
  get kvBytes(): number {
    return this.kv.bytes;
  }

  /**
   * One block: x [n, hidden_size] f32 → the block's output [n, hidden_size] (a new tensor; x is left
   * alone). Writes this layer's keys and values for the new rows into the cache.
   */
  protected abstract block(layer: number, x: Tensor, at: StepState, s: Scratch): Tensor;

  /**
   * RoPE on [1, n, heads, head_dim] rows at positions cached … cached + n − 1, in the file's layout
   * (llm.md §3.0: NeoX rotate-half, or GGUF llama's interleaved pairs).
   */
  protected rope(x: Tensor, at: StepState): Tensor {
    return this.backend.rope(x, at.positions, this.#ropeOptions);
  }

  /**
   * Causal GQA self-attention over the cache, then the output projection:
   * q [1, n, n_head, hd], k, v [1, n, n_kv, hd] (k after RoPE) → o_proj(softmax(q·Kᵀ/√hd + causal)·V)
   * [n, hidden_size]. Appends k, v at rows [cached, cached + n) of this layer's cache first.
   * Source: llm.md §3.0 "Attention"; Vaswani et al. 2017 eq. 1; Ainslie et al. 2023 (GQA).
   */
  protected selfAttention(layer: number, q: Tensor, k: Tensor, v: Tensor, at: StepState, s: Scratch): Tensor {
    const b = this.backend;
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = this.config;
    const { n, cached } = at;
    this.kv.write(layer, k.reshape(n, kvh, hd), v.reshape(n, kvh, hd));
    const rows = cached + n;
    const o = s.keep(
      b.attention(q.permute(0, 2, 1, 3), this.kv.keys(layer, rows), this.kv.values(layer, rows), {
        causal: true,
        qOffset: cached,
        scale: 1 / Math.sqrt(hd),
      }),
    ); // [1, n_head, n, hd]
    const heads = o.permute(0, 2, 1, 3); // [1, n, n_head, hd]: already row-major when n = 1 (decoding)
    const merged = (heads.isContiguous ? heads : s.keep(b.copy(heads))).reshape(n, nh * hd); // [n, n_head·hd]
    return b.matmul(merged, this.weights.layers[layer]?.o_proj as Weight); // [n, H]
  }

  /**
   * SwiGLU MLP: down_proj(silu(gate_proj(h)) ⊙ up_proj(h)), h [n, H] → [n, H].
   * Source: llm.md §3.0 "Gated FFNs"; Shazeer 2020.
   */
  protected mlp(layer: number, h: Tensor, s: Scratch): Tensor {
    const b = this.backend;
    const w = this.weights.layers[layer] as DecoderLayerWeights;
    const act = s.keep(b.swiglu(s.keep(b.matmul(h, w.gate_proj)), s.keep(b.matmul(h, w.up_proj)))); // [n, FFN]
    return b.matmul(act, w.down_proj);
  }

  /** RMSNorm over the last dimension with ε from the config. Source: Zhang & Sennrich 2019. */
  protected norm(x: Tensor, weight: Tensor): Tensor {
    return this.backend.rmsNorm(x, weight, { eps: this.config.rms_norm_eps });
  }

  /**
   * Run `ids` at positions [cached, cached + n) in one forward and return f32 logits [1, vocab] of the
   * last row ([n, vocab] with `allLogits`); see {@link CausalLM.step}. The caller frees the result.
   * @throws TpError E_ARG for an empty list, an id outside [0, vocab_size), or a full context window
   *   (nothing is written); E_STATE after dispose; backend errors (E_OOM, E_UNSUPPORTED for a weight format)
   */
  step(ids: Int32Array | readonly number[], options: StepOptions = {}): Tensor {
    if (this.#disposed) throw new TpError("E_STATE", "the model was disposed");
    if (
      !(ids instanceof Int32Array) &&
      !Array.isArray(ids) &&
      !(ArrayBuffer.isView(ids) && !(ids instanceof DataView))
    )
      throw new TpError(
        "E_ARG",
        `step: ids must be an array of token ids, got ${ids === null ? "null" : typeof ids}`,
      );
    const n = ids.length;
    const V = this.config.vocab_size;
    if (n === 0) throw new TpError("E_ARG", "step: no token ids");
    const list = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      const id = ids[i] as number;
      if (!Number.isInteger(id) || id < 0 || id >= V) {
        throw new TpError("E_ARG", `step: token id ${id} (at index ${i}) is outside [0, ${V})`);
      }
      list[i] = id;
    }
    const cached = this.kv.length;
    if (cached + n > this.maxContext) {
      throw new TpError(
        "E_ARG",
        `context window full: ${cached} cached + ${n} new tokens exceed the context of ${this.maxContext} (raise --ctx)`,
      );
    }
    this.kv.reserve(cached + n);
    const b = this.backend;
    const s = new Scratch(b);
    try {
      const positions = new Int32Array(n);
      for (let i = 0; i < n; i++) positions[i] = cached + i;
      const at: StepState = { n, cached, positions: s.keep(b.upload(positions, [n], "i32", "positions")) };
      const idsT = s.keep(b.upload(list, [n], "i32", "input_ids"));
      let x = s.keep(b.embedding(this.weights.embed_tokens, idsT)); // [n, H]
      for (let l = 0; l < this.config.num_hidden_layers; l++) {
        const inner = new Scratch(b);
        try {
          const y = s.keep(this.block(l, x, at, inner));
          b.free(x);
          x = y;
        } finally {
          inner.free();
        }
      }
      this.kv.commit(n);
      // Only the rows whose logits are wanted go through the final norm and the head (llm.md §3.0).
      const rows = options?.allLogits ? x : x.slice(0, n - 1, n); // [rows, H]
      const h = s.keep(this.norm(rows, this.weights.norm));
      return b.matmul(h, this.weights.lm_head); // [rows, vocab]
    } finally {
      s.free();
    }
  }

  /** Forget cached tokens from position `len` on. @throws TpError E_ARG outside [0, cached]; E_STATE */
  truncate(len: number): void {
    if (this.#disposed) throw new TpError("E_STATE", "the model was disposed");
    this.kv.truncate(len);
  }

  /** Free the KV cache and the uploaded norm scales, and close the checkpoint's mappings. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.kv.dispose();
    for (const t of uploadedTensors(this.weights)) if (!t.storage.freed) this.backend.free(t);
    this.#onDispose?.();
  }
}

// ---------------------------------------------------------------------------------------------------
// Architectures

/** How an architecture file plugs into the loader (the registry in models/registry.ts). */
export interface Architecture {
  /** GGUF `general.architecture` and HF `model_type`. */
  readonly name: string;
  /** For listings ("Llama (Llama 2/3, …)"). */
  readonly description: string;
  /** LlmConfig from GGUF metadata. @throws TpError E_FORMAT, E_UNSUPPORTED */
  configFromGguf(meta: GgufMetadata, r: CheckpointReader): LlmConfig;
  /** LlmConfig from config.json. @throws TpError E_FORMAT, E_UNSUPPORTED */
  configFromHf(json: Readonly<Record<string, unknown>>, r: CheckpointReader, file: string): LlmConfig;
  /** Read the weights and build the model. @throws TpError E_FORMAT naming file and tensor */
  create(backend: Backend, config: LlmConfig, r: CheckpointReader, options?: DecoderOptions): DecoderLM;
}
