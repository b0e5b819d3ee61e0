/**
 * The hyper-parameters of a llama-family decoder (llama, qwen3, …) from a checkpoint, into an
 * {@link LlmConfig} with config.json spellings. One table of names, read two ways:
 *
 * | LlmConfig / config.json     | GGUF `{arch}.`…                  | default                          |
 * | --------------------------- | -------------------------------- | -------------------------------- |
 * | hidden_size                 | embedding_length                 | required                         |
 * | num_hidden_layers           | block_count                      | required                         |
 * | num_attention_heads         | attention.head_count             | required                         |
 * | num_key_value_heads         | attention.head_count_kv          | num_attention_heads              |
 * | head_dim                    | attention.key_length             | hidden_size / num_attention_heads |
 * | intermediate_size           | feed_forward_length              | required                         |
 * | rms_norm_eps                | attention.layer_norm_rms_epsilon | required                         |
 * | rope_theta                  | rope.freq_base                   | 10000                            |
 * | rotary_dim (HF: head_dim)   | rope.dimension_count             | head_dim                         |
 * | max_position_embeddings     | context_length                   | required                         |
 * | vocab_size                  | vocab_size (checked)             | the token embedding's rows       |
 * | tie_word_embeddings         | —                                | no `lm_head.weight` / `output.weight` |
 *
 * An architecture file calls {@link ggufArgs} / {@link hfArgs} with its name and RoPE layout, and reads
 * any key of its own beside them.
 *
 * Sources: ../shared/spec/llm.md §1.1.1 (GGUF keys); transformers `LlamaConfig`, `Qwen3Config`;
 * ggml-org/llama.cpp `src/llama-model.cpp` (hparams defaults: rope.freq_base 10000, n_rot = head_dim).
 */
import type { GgufMetadata } from "@tp/formats";
import { TpError } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import { type CheckpointReader, hasTensor, tensorEntry } from "./checkpoint.ts";

/**
 * Rules an architecture adds to the common GGUF / config.json reading.
 */
export interface ArgRules {
  /** GGUF `general.architecture` / LlmConfig.architecture. */
  readonly architecture: string;
  /** RoPE layout of the file's q/k rows. */
  readonly rope_mode: LlmConfig["rope_mode"];
  /**
   * Linear RoPE scaling (GGUF `rope.scaling.type` "linear", config.json `rope_scaling` of type
   * "linear") is accepted instead of refused; the architecture reads the factor itself (Gemma 3).
   */
  readonly linearRopeScaling?: boolean;
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
  const e = tensorEntry(r, "model.embed_tokens.weight");
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
export function ggufArgs(meta: GgufMetadata, r: CheckpointReader, rules: ArgRules): LlmConfig {
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
  const linear = rules.linearRopeScaling === true && scaling === "linear";
  if ((scaling !== undefined && scaling !== "none" && !linear) || r.source.has("rope_freqs.weight")) {
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
export function hfArgs(
  json: Readonly<Record<string, unknown>>,
  r: CheckpointReader,
  rules: ArgRules,
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
  const scaling = json.rope_scaling as Record<string, unknown> | null | undefined;
  const linear =
    rules.linearRopeScaling === true &&
    typeof scaling === "object" &&
    scaling !== null &&
    (scaling.rope_type ?? scaling.type) === "linear";
  if (scaling !== undefined && scaling !== null && !linear) {
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
