/**
 * Qwen 3.5 / 3.6 dense (GGUF `qwen35`; HF `Qwen3_5ForConditionalGeneration`, text side): a hybrid stack
 * of Gated DeltaNet linear-attention layers and gated full-attention layers (layer N is full attention
 * when (N + 1) mod full_attention_interval = 0, unless `attention.recurrent_layers` says otherwise),
 * each followed by a SwiGLU FFN.
 *
 * Forward (llm.md §3.4; transformers `models/qwen3_5/modeling_qwen3_5.py`; llama.cpp `src/models/qwen35.cpp`):
 *   h = embed_tokens(input_ids)
 *   per block:  a = RMSNorm(h, input_layernorm)
 *               h = h + (full attention layer ? GatedAttention(a) : GatedDeltaNet(a))
 *               h = h + down_proj(silu(gate_proj(m)) ⊙ up_proj(m)),  m = RMSNorm(h, post_attention_layernorm)
 *   logits = lm_head(RMSNorm(h, norm))
 *
 *   GatedAttention(a):  [q | gate] = q_proj(a) per head (head_dim query values, then head_dim gate values)
 *                       q, k = RMSNorm_head(q, q_norm), RMSNorm_head(k_proj(a), k_norm);  v = v_proj(a)
 *                       q, k = RoPE_neox on the first rotary_dim dims (text M-RoPE = plain RoPE)
 *                       o_proj(Attention(q, K, V, scale 1/√hd, causal, GQA) ⊙ σ(gate))
 *   GatedDeltaNet(a):   u = silu(ssm_conv([conv state; in_proj_qkv(a)], conv1d))  → q | k | v per head
 *                       q, k = L2-normalised per head;  β = σ(in_proj_b(a));  g = A · softplus(in_proj_a(a) + dt_bias)
 *                       o = gated_delta_net(q / √d, k, v, g, β; state)     (value head j ↔ key head j mod n_k)
 *                       out_proj(RMSNorm_head(o, norm) ⊙ silu(in_proj_z(a)))
 *
 * GGUF files hold the norms with their +1 already and `ssm_a` = −exp(A_log) (read as A), and order the
 * value heads for the tiled head map (llm.md §3.4 "Head mapping"). The conv and delta-rule states are
 * per-sequence state beside the KV cache (recurrent-state.ts; the LanguageModel owns it and passes it
 * in the ForwardPass); only the full-attention layers have KV rows. MTP (`nextn_predict_layers`)
 * blocks after the trunk are not run. Only GGUF is read: the HF checkpoint (nested `text_config`, its
 * own head order, norms without the +1) is E_UNSUPPORTED for now.
 */
import type { GgufMetadata } from "@tp/formats";
import { type Backend, type RopeOptions, type Tensor, TpError, type Weight } from "@tp/tensor";
import type { LlmConfig } from "../model.ts";
import type { RecurrentStateShape } from "../recurrent-state.ts";
import { ggufArgs } from "./args.ts";
import { type CheckpointReader, readVector, tensorEntry, WeightReader } from "./checkpoint.ts";
import type { Architecture, DecoderModel } from "./language-model.ts";
import { attend, type ForwardPass, ropeOptions, type SwiGluWeights, swiglu } from "./layers.ts";

// ---------------------------------------------------------------------------------------------------
// Arguments: the llama-family keys, plus the hybrid layout and the linear-attention sizes

/** The two kinds of layer (HF `layer_types`). */
export type Qwen35LayerType = "linear_attention" | "full_attention";

/** Hyper-parameters of a Qwen 3.5 text model, with HF `Qwen3_5TextConfig` spellings. */
export interface Qwen35Config extends LlmConfig {
  /** Per trunk layer (GGUF `full_attention_interval` or `attention.recurrent_layers`). */
  readonly layer_types: readonly Qwen35LayerType[];
  /** GGUF `ssm.group_count`: key (and query) heads of the linear attention. */
  readonly linear_num_key_heads: number;
  /** GGUF `ssm.time_step_rank`: value heads, a multiple of the key heads. */
  readonly linear_num_value_heads: number;
  /** GGUF `ssm.state_size`: the key head width. */
  readonly linear_key_head_dim: number;
  /** GGUF `ssm.inner_size` / `ssm.time_step_rank`: the value head width. */
  readonly linear_value_head_dim: number;
  /** GGUF `ssm.conv_kernel`: causal conv taps. */
  readonly linear_conv_kernel_dim: number;
  /** GGUF `rope.dimension_sections` (M-RoPE; text positions make it plain RoPE). */
  readonly mrope_section: readonly number[];
}

/** An integer array of GGUF metadata, or undefined. @throws TpError E_FORMAT for a non-integer entry */
function intArray(meta: GgufMetadata, key: string, file: string): number[] | undefined {
  const a = meta.getArray(key);
  if (a === undefined) return undefined;
  const out: number[] = [];
  for (let i = 0; i < a.length; i++) {
    const v = a.get(i);
    const n = typeof v === "bigint" ? Number(v) : typeof v === "boolean" ? (v ? 1 : 0) : v;
    if (typeof n !== "number" || !Number.isSafeInteger(n)) {
      throw new TpError("E_FORMAT", `'${key}' must hold integers, got ${String(v)} at ${i}`, { file });
    }
    out.push(n);
  }
  return out;
}

/**
 * Qwen35Config of a GGUF `qwen35` / `qwen35moe` file (llm.md §1.1.1, §3.4.x: defaults as llama.cpp —
 * full_attention_interval 4; required: the five `ssm.*` keys and `rope.dimension_sections`).
 * @throws TpError E_FORMAT for a missing or inconsistent key; E_UNSUPPORTED as {@link ggufArgs}
 */
export function qwen35ArgsFromGguf(
  meta: GgufMetadata,
  r: CheckpointReader,
  architecture = "qwen35",
): Qwen35Config {
  const file = r.source.path;
  const a = architecture;
  const base = ggufArgs(meta, r, { architecture: a, rope_mode: "neox" });
  const need = (k: string): number => {
    const v = meta.getInt(`${a}.${k}`);
    if (v === undefined) throw new TpError("E_FORMAT", `missing metadata key '${a}.${k}'`, { file });
    if (!Number.isSafeInteger(v) || v < 1)
      throw new TpError("E_FORMAT", `'${a}.${k}' must be a positive integer, got ${v}`, { file });
    return v;
  };
  const taps = need("ssm.conv_kernel");
  const dk = need("ssm.state_size");
  const nk = need("ssm.group_count");
  const nv = need("ssm.time_step_rank");
  const inner = need("ssm.inner_size");
  if (nv % nk !== 0 || inner % nv !== 0) {
    throw new TpError(
      "E_FORMAT",
      `'${a}.ssm.time_step_rank' ${nv} must be a multiple of ssm.group_count ${nk}, and ssm.inner_size ${inner} a multiple of it`,
      { file },
    );
  }
  const sections = intArray(meta, `${a}.rope.dimension_sections`, file);
  if (sections === undefined)
    throw new TpError("E_FORMAT", `missing metadata key '${a}.rope.dimension_sections'`, { file });
  const nextn = meta.getInt(`${a}.nextn_predict_layers`) ?? 0;
  const layers = base.num_hidden_layers - nextn;
  if (!Number.isSafeInteger(nextn) || nextn < 0 || layers < 1) {
    throw new TpError(
      "E_FORMAT",
      `'${a}.nextn_predict_layers' ${nextn} leaves no trunk layers of block_count ${base.num_hidden_layers}`,
      { file },
    );
  }
  const flags = intArray(meta, `${a}.attention.recurrent_layers`, file);
  const interval = meta.getInt(`${a}.full_attention_interval`) ?? 4;
  if (flags === undefined && (!Number.isSafeInteger(interval) || interval < 1)) {
    throw new TpError(
      "E_FORMAT",
      `'${a}.full_attention_interval' must be a positive integer, got ${interval}`,
      {
        file,
      },
    );
  }
  if (flags !== undefined && flags.length < layers) {
    throw new TpError(
      "E_FORMAT",
      `'${a}.attention.recurrent_layers' has ${flags.length} entries for ${layers} layers`,
      { file },
    );
  }
  const layer_types: Qwen35LayerType[] = [];
  for (let i = 0; i < layers; i++) {
    const recurrent = flags === undefined ? (i + 1) % interval !== 0 : flags[i] !== 0;
    layer_types.push(recurrent ? "linear_attention" : "full_attention");
  }
  return {
    ...base,
    num_hidden_layers: layers,
    layer_types,
    linear_num_key_heads: nk,
    linear_num_value_heads: nv,
    linear_key_head_dim: dk,
    linear_value_head_dim: inner / nv,
    linear_conv_kernel_dim: taps,
    mrope_section: sections,
  };
}

/** HF Qwen 3.5 checkpoints are not read yet. @throws TpError E_UNSUPPORTED always */
export function qwen35ArgsFromHf(
  _json: Readonly<Record<string, unknown>>,
  _r: CheckpointReader,
  file: string,
): never {
  throw new TpError(
    "E_UNSUPPORTED",
    "Qwen 3.5 / 3.6 safetensors checkpoints are not implemented (nested text_config, HF value-head order, norms without the +1); convert to GGUF",
    { file },
  );
}

// ---------------------------------------------------------------------------------------------------
// Weights, by HF names (`model.layers.{i}.linear_attn.in_proj_qkv.weight`, …)

/** `model.layers.{i}.self_attn.*` of a full-attention layer. */
export interface Qwen35AttentionWeights {
  /** [num_attention_heads·2·head_dim, hidden_size]: per head, the query rows then the gate rows */
  readonly q_proj: Weight;
  /** [num_key_value_heads·head_dim, hidden_size] */
  readonly k_proj: Weight;
  /** [num_key_value_heads·head_dim, hidden_size] */
  readonly v_proj: Weight;
  /** [hidden_size, num_attention_heads·head_dim] */
  readonly o_proj: Weight;
  /** f32 [head_dim] */
  readonly q_norm: Tensor;
  /** f32 [head_dim] */
  readonly k_norm: Tensor;
}

/** `model.layers.{i}.linear_attn.*` of a Gated DeltaNet layer (C = 2·n_k·d_k + n_v·d_v conv channels). */
export interface Qwen35LinearAttentionWeights {
  /** [C, hidden_size]: q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v) */
  readonly in_proj_qkv: Weight;
  /** [n_v·d_v, hidden_size]: the output gate z */
  readonly in_proj_z: Weight;
  /** [n_v, hidden_size]: β before its sigmoid */
  readonly in_proj_b: Weight;
  /** [n_v, hidden_size]: α, the decay's input */
  readonly in_proj_a: Weight;
  /** f32 [C, K]: the depthwise causal conv, tap 0 the oldest */
  readonly conv1d: Tensor;
  /** f32 [n_v] */
  readonly dt_bias: Tensor;
  /** f32 [n_v]: A = −exp(A_log), as GGUF `ssm_a` stores it */
  readonly A: Tensor;
  /** f32 [d_v]: the gated RMSNorm's scale (plain, no +1 anywhere) */
  readonly norm: Tensor;
  /** [hidden_size, n_v·d_v] */
  readonly out_proj: Weight;
}

/** `model.layers.{i}.*` */
export interface Qwen35LayerWeights<F = SwiGluWeights> {
  /** f32 [hidden_size] */
  readonly input_layernorm: Tensor;
  /** The full-attention layer's, or null. */
  readonly self_attn: Qwen35AttentionWeights | null;
  /** The linear-attention layer's, or null. */
  readonly linear_attn: Qwen35LinearAttentionWeights | null;
  /** f32 [hidden_size]: the pre-FFN norm. */
  readonly post_attention_layernorm: Tensor;
  readonly mlp: F;
}

/** All weights of a Qwen 3.5 model (F: the FFN's weights; dense SwiGLU or the MoE's). */
export interface Qwen35Weights<F = SwiGluWeights> {
  /** [vocab_size, hidden_size] */
  readonly embed_tokens: Weight;
  readonly layers: readonly Qwen35LayerWeights<F>[];
  /** f32 [hidden_size] */
  readonly norm: Tensor;
  /** [vocab_size, hidden_size]; the embedding when tied. */
  readonly lm_head: Weight;
}

/**
 * A 2-D float tensor [rows, cols] by HF name uploaded as f32 (the conv kernel; f16 / bf16 cast).
 * @throws TpError E_FORMAT naming file and tensor when missing, of another shape, or not a float type
 */
function readMatrixF32(
  b: Backend,
  r: CheckpointReader,
  hf: string,
  shape: readonly [number, number],
): Tensor {
  const e = tensorEntry(r, hf);
  const dtype = ({ f32: "f32", f16: "f16", bf16: "bf16" } as const)[e.format as "f32"];
  const dims = e.shape.filter((d) => d !== 1);
  if (dtype === undefined || dims.length !== 2 || dims[0] !== shape[0] || dims[1] !== shape[1]) {
    throw new TpError(
      "E_FORMAT",
      `expected a float tensor [${shape.join(", ")}] (f32, f16 or bf16), got ${e.dtype} [${e.shape.join(", ")}]`,
      { file: e.file, tensor: e.name },
    );
  }
  const up = b.upload(r.source.data(e.name), shape, dtype, hf);
  if (dtype === "f32") return up;
  using _stored = up;
  return b.cast(up, "f32");
}

/** Conv channels of the linear attention: 2·n_k·d_k + n_v·d_v. */
function convChannels(c: Qwen35Config): number {
  return (
    2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
  );
}

/** Layer i's `self_attn` (full attention with the output gate folded into q_proj). */
export function readQwen35Attention(w: WeightReader, c: Qwen35Config, i: number): Qwen35AttentionWeights {
  const p = `model.layers.${i}.self_attn.`;
  const H = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  for (const m of ["q_proj", "k_proj", "v_proj", "o_proj"]) w.noBias(`${p}${m}`, c.architecture);
  return {
    q_proj: w.linear(`${p}q_proj.weight`, [2 * q, H]),
    k_proj: w.linear(`${p}k_proj.weight`, [kv, H]),
    v_proj: w.linear(`${p}v_proj.weight`, [kv, H]),
    o_proj: w.linear(`${p}o_proj.weight`, [H, q]),
    q_norm: w.norm(`${p}q_norm.weight`, c.head_dim),
    k_norm: w.norm(`${p}k_norm.weight`, c.head_dim),
  };
}

/** Layer i's `linear_attn` (Gated DeltaNet). */
export function readQwen35LinearAttention(
  w: WeightReader,
  c: Qwen35Config,
  i: number,
): Qwen35LinearAttentionWeights {
  const p = `model.layers.${i}.linear_attn.`;
  const H = c.hidden_size;
  const nv = c.linear_num_value_heads;
  const vdim = nv * c.linear_value_head_dim;
  const C = convChannels(c);
  const r = w.checkpoint;
  return {
    in_proj_qkv: w.linear(`${p}in_proj_qkv.weight`, [C, H]),
    in_proj_z: w.linear(`${p}in_proj_z.weight`, [vdim, H]),
    in_proj_b: w.linear(`${p}in_proj_b.weight`, [nv, H]),
    in_proj_a: w.linear(`${p}in_proj_a.weight`, [nv, H]),
    conv1d: readMatrixF32(w.backend, r, `${p}conv1d.weight`, [C, c.linear_conv_kernel_dim]),
    dt_bias: readVector(w.backend, r, `${p}dt_bias`, nv),
    A: readVector(w.backend, r, `${p}A_log`, nv),
    norm: w.norm(`${p}norm.weight`, c.linear_value_head_dim),
    out_proj: w.linear(`${p}out_proj.weight`, [H, vdim]),
  };
}

/**
 * Every weight of a Qwen 3.5 model, with `mlp(i)` reading layer i's FFN (dense SwiGLU, or the MoE's).
 * @throws TpError E_FORMAT naming file and tensor; E_UNSUPPORTED for biases or a format the backend cannot run
 */
export function readQwen35Weights<F>(
  w: WeightReader,
  c: Qwen35Config,
  mlp: (i: number) => F,
): Qwen35Weights<F> {
  const { hidden_size: H, vocab_size: V } = c;
  const layers: Qwen35LayerWeights<F>[] = [];
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    const full = c.layer_types[i] === "full_attention";
    layers.push({
      input_layernorm: w.norm(`${p}input_layernorm.weight`, H),
      self_attn: full ? readQwen35Attention(w, c, i) : null,
      linear_attn: full ? null : readQwen35LinearAttention(w, c, i),
      post_attention_layernorm: w.norm(`${p}post_attention_layernorm.weight`, H),
      mlp: mlp(i),
    });
  }
  const embed_tokens = w.embedding("model.embed_tokens.weight", [V, H], c.tie_word_embeddings);
  return {
    embed_tokens,
    layers,
    norm: w.norm("model.norm.weight", H),
    lm_head: c.tie_word_embeddings ? embed_tokens : w.linear("lm_head.weight", [V, H]),
  };
}

/** Layer i's dense SwiGLU FFN. */
export function readQwen35Mlp(w: WeightReader, c: LlmConfig, i: number): SwiGluWeights {
  const p = `model.layers.${i}.mlp.`;
  const { hidden_size: H, intermediate_size: F } = c;
  return {
    gate_proj: w.linear(`${p}gate_proj.weight`, [F, H]),
    up_proj: w.linear(`${p}up_proj.weight`, [F, H]),
    down_proj: w.linear(`${p}down_proj.weight`, [H, F]),
  };
}

// ---------------------------------------------------------------------------------------------------
// Forward

/** Tokens per chunk of the chunked delta rule in prefill (llama.cpp's CHUNK_SIZE). */
export const DELTA_CHUNK = 64;

/**
 * Qwen 3.5: input_ids → logits (or hidden states), see the module comment. The MoE variant
 * (qwen35moe.ts) overrides {@link Qwen35Model.ffn}.
 */
export class Qwen35Model<F = SwiGluWeights> implements DecoderModel {
  readonly backend: Backend;
  readonly config: Qwen35Config;
  readonly weights: Qwen35Weights<F>;
  readonly kvLayers: number;
  readonly recurrent: RecurrentStateShape;
  /** Layer → its KV slot (full attention) or recurrent-state slot (linear attention). */
  protected readonly slot: readonly number[];
  protected readonly rope: RopeOptions;
  protected readonly norm: { readonly eps: number };
  /** ggml's L2 norm x / max(‖x‖, ε) as an RMSNorm: x / √(Σx² + ε²) · √d (then scaled by 1/√d). */
  protected readonly l2: { readonly eps: number };
  /** 1/√head_dim */
  protected readonly scale: number;

  constructor(backend: Backend, config: Qwen35Config, weights: Qwen35Weights<F>) {
    this.backend = backend;
    this.config = config;
    this.weights = weights;
    const slot: number[] = [];
    let full = 0;
    let linear = 0;
    for (const t of config.layer_types) slot.push(t === "full_attention" ? full++ : linear++);
    this.slot = slot;
    this.kvLayers = Math.max(full, 1);
    this.recurrent = {
      layers: linear,
      convChannels: convChannels(config),
      convKernel: config.linear_conv_kernel_dim,
      valueHeads: config.linear_num_value_heads,
      keyDim: config.linear_key_head_dim,
      valueDim: config.linear_value_head_dim,
    };
    this.rope = ropeOptions(config);
    this.norm = { eps: config.rms_norm_eps };
    this.l2 = { eps: (config.rms_norm_eps * config.rms_norm_eps) / config.linear_key_head_dim };
    this.scale = 1 / Math.sqrt(config.head_dim);
  }

  /** Gated full attention of layer i: x [n, H] (normed) → [n, H]. */
  attention(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = (this.weights.layers[i] as Qwen35LayerWeights<F>).self_attn as Qwen35AttentionWeights;
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = this.config;
    const n = f.n;
    const qg = b.matmul(x, w.q_proj).reshape(n, nh, 2 * hd); // per head: query, then gate
    const q = b.rmsNorm(qg.slice(2, 0, hd), w.q_norm, this.norm).reshape(1, n, nh, hd);
    const k = b.rmsNorm(b.matmul(x, w.k_proj).reshape(1, n, kvh, hd), w.k_norm, this.norm);
    const v = b.matmul(x, w.v_proj).reshape(1, n, kvh, hd);
    const qr = b.rope(q, f.positions, this.rope);
    const kr = b.rope(k, f.positions, this.rope);
    const o = attend(b, f, this.slot[i] as number, qr, kr, v, this.scale); // [n, n_head·hd]
    const gate = b.sigmoid(qg.slice(2, hd, 2 * hd)).reshape(n, nh * hd);
    return b.matmul(b.mul(o, gate), w.o_proj); // [n, H]
  }

  /** Gated DeltaNet of layer i: x [n, H] (normed) → [n, H], the layer's recurrent state updated in place. */
  deltaNet(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = (this.weights.layers[i] as Qwen35LayerWeights<F>).linear_attn as Qwen35LinearAttentionWeights;
    const c = this.config;
    const state = f.state;
    if (state === null) throw new TpError("E_STATE", "qwen35: a forward without its recurrent state");
    const n = f.n;
    const nk = c.linear_num_key_heads;
    const nv = c.linear_num_value_heads;
    const dk = c.linear_key_head_dim;
    const dv = c.linear_value_head_dim;
    const K = c.linear_conv_kernel_dim;
    const l = this.slot[i] as number;
    const conv = state.conv(l); // [K − 1, C]: the previous inputs
    const xc = b.concat([conv, b.matmul(x, w.in_proj_qkv)], 0); // [K − 1 + n, C]
    b.set(conv, xc.slice(0, n, n + K - 1)); // the last K − 1 inputs stay for the next step
    const u = b.silu(b.ssmConv(xc, w.conv1d)); // [n, C]
    const qk = nk * dk;
    // L2 norm per head: RMSNorm gives √d · x/‖x‖; q's √d and the 1/√d of attention make the scale 1/d
    const q = b.rmsNorm(u.slice(1, 0, qk).reshape(n, nk, dk), null, this.l2);
    const k = b.scale(b.rmsNorm(u.slice(1, qk, 2 * qk).reshape(n, nk, dk), null, this.l2), 1 / Math.sqrt(dk));
    const v = u.slice(1, 2 * qk, 2 * qk + nv * dv).reshape(n, nv, dv);
    const beta = b.sigmoid(b.matmul(x, w.in_proj_b)); // [n, n_v]
    const g = b.mul(b.softplus(b.add(b.matmul(x, w.in_proj_a), w.dt_bias)), w.A); // log decay, [n, n_v]
    const o = b.gatedDeltaNet(q, k, v, g, beta, state.ssm(l), {
      scale: 1 / dk,
      chunk: n > 1 ? DELTA_CHUNK : 0,
    }); // [n, n_v, d_v]
    const z = b.matmul(x, w.in_proj_z).reshape(n, nv, dv);
    const gated = b.swiglu(z, b.rmsNorm(o, w.norm, this.norm)); // RMSNorm(o) ⊙ silu(z)
    return b.matmul(gated.reshape(n, nv * dv), w.out_proj); // [n, H]
  }

  /** The FFN of layer i: m [n, H] (normed) → [n, H]; dense SwiGLU here. */
  ffn(i: number, m: Tensor): Tensor {
    return swiglu(this.backend, (this.weights.layers[i] as Qwen35LayerWeights<F>).mlp as SwiGluWeights, m);
  }

  /** Block i: x [n, H] → [n, H], two pre-norm residuals. */
  block(i: number, x: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = this.weights.layers[i] as Qwen35LayerWeights<F>;
    const a = b.rmsNorm(x, w.input_layernorm, this.norm);
    const h = b.add(x, w.self_attn !== null ? this.attention(i, a, f) : this.deltaNet(i, a, f));
    return b.add(h, this.ffn(i, b.rmsNorm(h, w.post_attention_layernorm, this.norm)));
  }

  /** input_ids i32 [n] → logits [rows, vocab] (see {@link DecoderModel.forward}). */
  forward(inputIds: Tensor, f: ForwardPass): Tensor {
    const b = this.backend;
    const w = this.weights;
    let h = b.embedding(w.embed_tokens, inputIds); // [n, H]
    for (let i = 0; i < f.blocks; i++) {
      const out = b.scope(() => this.block(i, h, f));
      h = f.next(i, h, out);
    }
    if (f.head === null) return h;
    return b.matmul(b.rmsNorm(f.headRows(h), w.norm, this.norm), w.lm_head); // [rows, vocab]
  }
}

/** The `qwen35` architecture (GGUF only). */
export const qwen35: Architecture = {
  name: "qwen35",
  description: "Qwen 3.5 / 3.6 dense (Gated DeltaNet + gated attention hybrid; GGUF)",
  configFromGguf: (meta, r) => qwen35ArgsFromGguf(meta, r, "qwen35"),
  configFromHf: qwen35ArgsFromHf,
  create(backend, config, r) {
    const c = config as Qwen35Config;
    const w = new WeightReader(backend, r);
    const weights = backend.persist(
      backend.scope(() => readQwen35Weights(w, c, (i) => readQwen35Mlp(w, c, i))),
    );
    return new Qwen35Model(backend, c, weights);
  },
};
