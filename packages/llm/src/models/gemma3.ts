/**
 * Gemma 3 (GGUF `gemma3`; HF `Gemma3ForCausalLM`, model_type `gemma3_text`, and the text side of
 * `Gemma3ForConditionalGeneration`, model_type `gemma3` with a `text_config`): Qwen3's attention with
 * QK-norm, sandwich norms around both sub-layers, a GeGLU MLP (gelu-tanh gate), the embeddings scaled
 * by √hidden_size, and five sliding-window layers to one global layer, each kind with its own RoPE.
 *
 * Forward (llm.md §3.5; transformers `models/gemma3/modeling_gemma3.py`; llama.cpp `src/models/gemma3.cpp`):
 *   h = embed_tokens(input_ids) · √H                                   # f32 √H, as llama.cpp
 *   per block i:  a = RMSNorm(h, input_layernorm)
 *                 q, k, v = q_proj(a), k_proj(a), v_proj(a)            # [n, heads, hd]
 *                 q, k = RMSNorm_head(q, q_norm), RMSNorm_head(k, k_norm)
 *                 q, k = RoPE_neox(q, k; θ, s)    global: θ = rope_theta, s = 1/rope_scaling.factor
 *                                                 local:  θ = rope_local_base_freq (10000), s = 1
 *                 o = Attention(q, K, V, scale query_pre_attn_scalar^−½, causal,
 *                               window = sliding_window on local layers)
 *                 h = h + RMSNorm(o_proj(o), post_attention_layernorm)
 *                 m = RMSNorm(h, pre_feedforward_layernorm)
 *                 h = h + RMSNorm(down_proj(gelu_tanh(gate_proj(m)) ⊙ up_proj(m)), post_feedforward_layernorm)
 *   logits = lm_head(RMSNorm(h, norm))         (tied to embed_tokens; with final_logit_softcapping c:
 *                                               c · tanh(logits / c))
 *
 * Layer kinds: HF `layer_types`, else layer i is global when (i + 1) mod sliding_window_pattern = 0
 * (pattern 6; llama.cpp `set_swa_pattern`). GGUF files carry no `query_pre_attn_scalar`: llama.cpp
 * uses head_dim, except for the 62-layer 27B (hidden / heads = 168), which matches HF's configs.
 * Norms: Gemma's RMSNorm multiplies by (1 + w); GGUF converters store w + 1, safetensors store w, so
 * HF norm scales get the 1 added at load (llm.md §3.0 "Zero-centred norms") and the forward is one.
 * The local layers keep a ring of `sliding_window + batch` KV rows (kv-cache.ts).
 */
import type { GgufMetadata } from "@tp/formats";
import { type Backend, type RopeOptions, type Tensor, TpError, type Weight } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import { ggufArgs, hfArgs } from "./args.ts";
import { type CheckpointReader, hasTensor, WeightReader } from "./checkpoint.ts";
import { type Architecture, type DecoderModel, slidingWindows } from "./language-model.ts";
import { attend, type ForwardPass, type SwiGluWeights } from "./layers.ts";
import { type LlamaAttentionWeights, readLlamaAttention } from "./llama.ts";

// ---------------------------------------------------------------------------------------------------
// Arguments

/** Gemma 3's hyper-parameters beyond the llama family's (config.json spellings). */
export interface Gemma3Config extends LlmConfig {
  readonly sliding_window: number;
  readonly layer_types: readonly ("full_attention" | "sliding_attention")[];
  /** RoPE θ of the sliding-window layers (GGUF `rope.freq_base_swa`; default 10000). */
  readonly rope_local_base_freq: number;
  /** Linear RoPE scaling of the global layers: positions × 1/factor (1 when none; 8 for 4B–27B). */
  readonly rope_scaling_factor: number;
  /** Attention scale = query_pre_attn_scalar^−½. */
  readonly query_pre_attn_scalar: number;
  /** logits ← c · tanh(logits / c), or null (every released Gemma 3). */
  readonly final_logit_softcapping: number | null;
  /** The file stores Gemma's zero-centred norm scales w (safetensors): 1 is added at load. */
  readonly norm_plus_one: boolean;
}

/** HF `layer_types` from a window pattern: every `pattern`-th layer is global (llama.cpp `set_swa_pattern`). */
function patternLayers(layers: number, window: number, pattern: number): Gemma3Config["layer_types"] {
  return Array.from({ length: layers }, (_, i) =>
    window > 0 && (pattern === 0 || i % pattern < pattern - 1) ? "sliding_attention" : "full_attention",
  );
}

function positiveFinite(v: number, key: string, file: string): number {
  if (!Number.isFinite(v) || v <= 0)
    throw new TpError("E_FORMAT", `'${key}' must be a finite number > 0, got ${v}`, { file });
  return v;
}

function windowSize(v: number, key: string, file: string): number {
  if (!Number.isSafeInteger(v) || v < 0)
    throw new TpError("E_FORMAT", `'${key}' must be a non-negative integer, got ${v}`, { file });
  return v;
}

/**
 * Gemma3Config of a GGUF `gemma3` file: the llama-family keys plus `attention.sliding_window`,
 * `attention.sliding_window_pattern` (default 6), `rope.freq_base_swa` (default 10000),
 * `rope.scaling.factor` (linear, global layers) and `final_logit_softcapping`, read as llama.cpp's
 * `llama_model_gemma3::load_arch_hparams` does. No window key (or 0): every layer is global.
 * @throws TpError E_FORMAT for a missing or out-of-range key; E_UNSUPPORTED for non-linear RoPE scaling
 */
export function gemma3ArgsFromGguf(meta: GgufMetadata, r: CheckpointReader): Gemma3Config {
  const file = r.source.path;
  const base = ggufArgs(meta, r, { architecture: "gemma3", rope_mode: "neox", linearRopeScaling: true });
  const a = "gemma3";
  const window = windowSize(
    meta.getInt(`${a}.attention.sliding_window`) ?? 0,
    `${a}.attention.sliding_window`,
    file,
  );
  const pattern = windowSize(
    meta.getInt(`${a}.attention.sliding_window_pattern`) ?? 6,
    `${a}.attention.sliding_window_pattern`,
    file,
  );
  const factor = meta.getFloat(`${a}.rope.scaling.factor`) ?? meta.getFloat(`${a}.rope.scale_linear`) ?? 0;
  const softcap = meta.getFloat(`${a}.final_logit_softcapping`) ?? 0;
  const layers = base.num_hidden_layers;
  return {
    ...base,
    sliding_window: window,
    layer_types: patternLayers(layers, window, pattern),
    rope_local_base_freq: positiveFinite(
      meta.getFloat(`${a}.rope.freq_base_swa`) ?? 10000,
      `${a}.rope.freq_base_swa`,
      file,
    ),
    rope_scaling_factor: factor === 0 ? 1 : positiveFinite(factor, `${a}.rope.scaling.factor`, file),
    // llama.cpp gemma3.cpp: 1/√(hidden / heads) for the 27B (62 layers), 1/√head_dim otherwise
    query_pre_attn_scalar: layers === 62 ? base.hidden_size / base.num_attention_heads : base.head_dim,
    final_logit_softcapping:
      softcap === 0 ? null : positiveFinite(softcap, `${a}.final_logit_softcapping`, file),
    norm_plus_one: false,
  };
}

/** transformers `Gemma3TextConfig` defaults, for the keys released text_configs leave out. */
const HF_DEFAULTS: Readonly<Record<string, unknown>> = {
  num_attention_heads: 8,
  num_key_value_heads: 4,
  head_dim: 256,
  rms_norm_eps: 1e-6,
  rope_theta: 1_000_000,
  max_position_embeddings: 131_072,
  query_pre_attn_scalar: 256,
  sliding_window: 4096,
  sliding_window_pattern: 6,
  rope_local_base_freq: 10_000,
};

/** The text side of a config.json: `text_config` of a Gemma3ForConditionalGeneration, else the file itself. */
function textConfig(json: Readonly<Record<string, unknown>>): Readonly<Record<string, unknown>> {
  const t = json.text_config;
  const text =
    typeof t === "object" && t !== null && !Array.isArray(t) ? (t as Record<string, unknown>) : json;
  const merged: Record<string, unknown> = { ...HF_DEFAULTS };
  for (const [k, v] of Object.entries(text)) if (v !== undefined && v !== null) merged[k] = v;
  for (const k of ["rope_scaling", "final_logit_softcapping", "layer_types"]) merged[k] = text[k] ?? null;
  if (merged.tie_word_embeddings === undefined && json.tie_word_embeddings !== undefined)
    merged.tie_word_embeddings = json.tie_word_embeddings;
  return merged;
}

/**
 * The HF checkpoint seen with `model.*` names whatever the export's prefix: `model.layers.N…`
 * (Gemma3ForCausalLM), `model.language_model.layers.N…` (current Gemma3ForConditionalGeneration) or
 * `language_model.model.layers.N…` (older exports, head `language_model.lm_head`).
 */
export function gemma3TextReader(r: CheckpointReader): CheckpointReader {
  for (const [model, head] of [
    ["model.", "lm_head."],
    ["model.language_model.", "lm_head."],
    ["language_model.model.", "language_model.lm_head."],
  ] as const) {
    if (!r.source.has(r.name(`${model}embed_tokens.weight`))) continue;
    if (model === "model.") return r;
    return {
      source: r.source,
      name: (hf) =>
        r.name(
          hf.startsWith("model.") ? model + hf.slice(6) : hf.startsWith("lm_head.") ? head + hf.slice(8) : hf,
        ),
    };
  }
  return r; // the missing embedding is reported by name where it is read
}

/**
 * Gemma3Config from a config.json (`gemma3_text`, or `gemma3` with `text_config`), with transformers'
 * defaults for absent keys; `layer_types`, else `sliding_window_pattern`; `rope_scaling` only linear.
 * @throws TpError E_FORMAT for missing or bad fields; E_UNSUPPORTED for other RoPE scaling, biases
 */
export function gemma3ArgsFromHf(
  json: Readonly<Record<string, unknown>>,
  r: CheckpointReader,
  file: string,
): Gemma3Config {
  const text = textConfig(json);
  const base = hfArgs(
    text,
    gemma3TextReader(r),
    { architecture: "gemma3", rope_mode: "neox", linearRopeScaling: true },
    file,
  );
  const num = (k: string) => {
    const v = text[k];
    if (typeof v !== "number" || !Number.isFinite(v))
      throw new TpError("E_FORMAT", `config.json '${k}' must be a number, got ${JSON.stringify(v)}`, {
        file,
      });
    return v;
  };
  const window = windowSize(num("sliding_window"), "config.json sliding_window", file);
  const layers = base.num_hidden_layers;
  let types = patternLayers(
    layers,
    window,
    windowSize(num("sliding_window_pattern"), "sliding_window_pattern", file),
  );
  const listed = text.layer_types;
  if (Array.isArray(listed)) {
    if (listed.length !== layers || listed.some((t) => t !== "full_attention" && t !== "sliding_attention")) {
      throw new TpError(
        "E_FORMAT",
        `config.json 'layer_types' must list ${layers} of "full_attention" / "sliding_attention"`,
        { file },
      );
    }
    types = listed as Gemma3Config["layer_types"];
  }
  const scaling = text.rope_scaling as Record<string, unknown> | null;
  const factor = scaling === null ? 1 : Number(scaling.factor ?? 1);
  const softcap = text.final_logit_softcapping;
  return {
    ...base,
    sliding_window: window,
    layer_types: types,
    rope_local_base_freq: positiveFinite(
      num("rope_local_base_freq"),
      "config.json rope_local_base_freq",
      file,
    ),
    rope_scaling_factor: positiveFinite(factor, "config.json rope_scaling.factor", file),
    query_pre_attn_scalar: positiveFinite(
      num("query_pre_attn_scalar"),
      "config.json query_pre_attn_scalar",
      file,
    ),
    final_logit_softcapping:
      softcap === null ? null : positiveFinite(Number(softcap), "config.json final_logit_softcapping", file),
    norm_plus_one: true,
  };
}

// ---------------------------------------------------------------------------------------------------
// Weights

/** `model.layers.{i}.self_attn.*`: Llama's projections and the QK-norm scales. */
export interface Gemma3AttentionWeights extends LlamaAttentionWeights {
  /** f32 [head_dim] (the +1 included) */
  readonly q_norm: Tensor;
  /** f32 [head_dim] (the +1 included) */
  readonly k_norm: Tensor;
}

/** `model.layers.{i}.*`: four norm scales f32 [hidden_size] (the +1 included), attention, GeGLU MLP. */
export interface Gemma3LayerWeights {
  readonly input_layernorm: Tensor;
  readonly self_attn: Gemma3AttentionWeights;
  readonly post_attention_layernorm: Tensor;
  readonly pre_feedforward_layernorm: Tensor;
  readonly mlp: SwiGluWeights;
  readonly post_feedforward_layernorm: Tensor;
}

/** All weights of a Gemma 3 text model. */
export interface Gemma3Weights {
  /** [vocab_size, hidden_size] */
  readonly embed_tokens: Weight;
  readonly layers: readonly Gemma3LayerWeights[];
  /** f32 [hidden_size] (the +1 included) */
  readonly norm: Tensor;
  /** [vocab_size, hidden_size]: the embedding when tied (every released Gemma 3) */
  readonly lm_head: Weight;
  /** f32 [1] holding −final_logit_softcapping, or null without softcapping */
  readonly softcap_shift: Tensor | null;
}

/** A norm scale as the forward multiplies it: the stored one, plus 1 for zero-centred (HF) storage. */
function readNorm(w: WeightReader, c: Gemma3Config, hf: string, length: number): Tensor {
  if (!c.norm_plus_one) return w.norm(hf, length);
  const b = w.backend;
  using stored = w.norm(hf, length);
  using one = b.upload(new Float32Array([1]), [1], "f32", `${hf} + 1`); // named: placed with its layer
  return b.add(stored, one);
}

/**
 * Every weight of a Gemma 3 text model by HF names (`w` reads through {@link gemma3TextReader}).
 * @throws TpError E_FORMAT naming file and tensor; E_UNSUPPORTED for biases or a format the backend cannot run
 */
export function readGemma3Weights(w: WeightReader, c: Gemma3Config): Gemma3Weights {
  const { hidden_size: H, intermediate_size: F, vocab_size: V, head_dim: hd } = c;
  const layers: Gemma3LayerWeights[] = [];
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    layers.push({
      input_layernorm: readNorm(w, c, `${p}input_layernorm.weight`, H),
      self_attn: {
        ...readLlamaAttention(w, c, i),
        q_norm: readNorm(w, c, `${p}self_attn.q_norm.weight`, hd),
        k_norm: readNorm(w, c, `${p}self_attn.k_norm.weight`, hd),
      },
      post_attention_layernorm: readNorm(w, c, `${p}post_attention_layernorm.weight`, H),
      pre_feedforward_layernorm: readNorm(w, c, `${p}pre_feedforward_layernorm.weight`, H),
      mlp: {
        gate_proj: w.linear(`${p}mlp.gate_proj.weight`, [F, H]),
        up_proj: w.linear(`${p}mlp.up_proj.weight`, [F, H]),
        down_proj: w.linear(`${p}mlp.down_proj.weight`, [H, F]),
      },
      post_feedforward_layernorm: readNorm(w, c, `${p}post_feedforward_layernorm.weight`, H),
    });
  }
  const tied = !hasTensor(w.checkpoint, "lm_head.weight");
  const embed_tokens = w.embedding("model.embed_tokens.weight", [V, H], tied);
  const cap = c.final_logit_softcapping;
  return {
    embed_tokens,
    layers,
    norm: readNorm(w, c, "model.norm.weight", H),
    lm_head: tied ? embed_tokens : w.linear("lm_head.weight", [V, H]),
    softcap_shift:
      cap === null ? null : w.backend.upload(new Float32Array([-cap]), [1], "f32", "softcap_shift"),
  };
}

// ---------------------------------------------------------------------------------------------------
// Forward

/** Gemma 3: input_ids → logits (or hidden states), see the module comment. */
export class Gemma3Model implements DecoderModel {
  readonly backend: Backend;
  readonly config: Gemma3Config;
  readonly weights: Gemma3Weights;
  /** Per layer: its sliding window, 0 for a global layer. */
  readonly windows: readonly number[];
  /** Per layer: RoPE of its kind (built once; rope runs twice per block per step). */
  readonly #rope: readonly RopeOptions[];
  readonly #norm: { readonly eps: number };
  /** query_pre_attn_scalar^−½ */
  readonly #scale: number;
  /** √hidden_size in f32 (llama.cpp `sqrtf(n_embd)`). */
  readonly #embedScale: number;

  constructor(backend: Backend, config: Gemma3Config, weights: Gemma3Weights) {
    this.backend = backend;
    this.config = config;
    this.weights = weights;
    const n = config.num_hidden_layers;
    const w = slidingWindows(config);
    this.windows = Array.from({ length: n }, (_, i) => w[i] ?? 0);
    const dims = config.rotary_dim !== config.head_dim ? { ropeDims: config.rotary_dim } : {};
    const global: RopeOptions = {
      mode: "neox",
      theta: config.rope_theta,
      ...dims,
      ...(config.rope_scaling_factor !== 1 ? { freqScale: 1 / config.rope_scaling_factor } : {}),
    };
    const local: RopeOptions = { mode: "neox", theta: config.rope_local_base_freq, ...dims };
    this.#rope = this.windows.map((win) => (win > 0 ? local : global));
    this.#norm = { eps: config.rms_norm_eps };
    this.#scale = 1 / Math.sqrt(config.query_pre_attn_scalar);
    this.#embedScale = Math.fround(Math.sqrt(config.hidden_size));
  }

  /** Attention of block i: x [n, H] (normed) → o_proj output [n, H]; QK-norm, RoPE of the layer's kind. */
  attention(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = (this.weights.layers[i] as Gemma3LayerWeights).self_attn;
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = this.config;
    const rope = this.#rope[i] as RopeOptions;
    const q = b.matmul(x, w.q_proj).reshape(1, f.n, nh, hd); // [1, n, n_head, hd]
    const k = b.matmul(x, w.k_proj).reshape(1, f.n, kvh, hd); // [1, n, n_kv, hd]
    const v = b.matmul(x, w.v_proj).reshape(1, f.n, kvh, hd); // [1, n, n_kv, hd]
    const qr = b.rope(b.rmsNorm(q, w.q_norm, this.#norm), f.positions, rope); // QK-norm, then RoPE
    const kr = b.rope(b.rmsNorm(k, w.k_norm, this.#norm), f.positions, rope);
    const o = attend(b, f, i, qr, kr, v, this.#scale, this.windows[i] as number); // [n, n_head·hd]
    return b.matmul(o, w.o_proj); // [n, H]
  }

  /** The MLP's gate activation: gelu with the tanh approximation (HF `gelu_pytorch_tanh`), in f32. */
  gelu(x: Tensor): Tensor {
    return this.backend.gelu(x, { approximate: "tanh" });
  }

  /** Block i: x [n, H] → [n, H], both sub-layers between a pre- and a post-norm. */
  block(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = this.weights.layers[i] as Gemma3LayerWeights;
    const e = this.#norm;
    const a = this.attention(i, b.rmsNorm(x, w.input_layernorm, e), f);
    const h = b.add(x, b.rmsNorm(a, w.post_attention_layernorm, e));
    const m = b.rmsNorm(h, w.pre_feedforward_layernorm, e);
    const gelu = this.gelu(b.matmul(m, w.mlp.gate_proj)); // [n, FFN]
    const ffn = b.matmul(b.mul(gelu, b.matmul(m, w.mlp.up_proj)), w.mlp.down_proj); // GeGLU → [n, H]
    return b.add(h, b.rmsNorm(ffn, w.post_feedforward_layernorm, e));
  }

  /** input_ids i32 [n] → logits [rows, vocab] (see {@link DecoderModel.forward}). */
  forward(inputIds: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = this.weights;
    let h = b.scale(b.embedding(w.embed_tokens, inputIds), this.#embedScale); // [n, H]
    for (let i = 0; i < f.blocks; i++) {
      const out = b.scope(() => this.block(i, h, f)); // [n, H]; the block's temporaries are freed
      h = f.next(i, h, out); // h (hidden_states[i]) kept when collected, else freed
    }
    if (f.head === null) return h;
    const logits = b.matmul(b.rmsNorm(f.headRows(h), w.norm, this.#norm), w.lm_head); // [rows, vocab]
    const cap = this.config.final_logit_softcapping;
    if (cap === null || w.softcap_shift === null) return logits;
    // c · tanh(l / c) = 2c · σ(2l / c) − c (no tanh op; the same function)
    return b.add(b.scale(b.sigmoid(b.scale(logits, 2 / cap)), 2 * cap), w.softcap_shift);
  }
}

/** The `gemma3` architecture (GGUF `gemma3`; HF `gemma3_text`, and `gemma3`'s text_config). */
export const gemma3: Architecture = {
  name: "gemma3",
  description:
    "Gemma 3 text (sandwich norms, GeGLU, 5 local : 1 global layers with a sliding-window KV ring)",
  configFromGguf: gemma3ArgsFromGguf,
  configFromHf: gemma3ArgsFromHf,
  create(backend, config, r) {
    const c = config as Gemma3Config;
    const w = new WeightReader(backend, c.norm_plus_one ? gemma3TextReader(r) : r);
    const weights = backend.persist(backend.scope(() => readGemma3Weights(w, c)));
    return new Gemma3Model(backend, c, weights);
  },
};
