/**
 * Test helpers (not exported from the package): tiny random llama / qwen3 checkpoints written with our
 * own safetensors and GGUF writers, and a plain float64 reference forward of both architectures,
 * written from the equations (llm.md §3.0–3.1; transformers `modeling_llama.py`, `modeling_qwen3.py`)
 * without any backend, to check the models against independently computed logits.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  GGUF_HF_NAMES,
  GgufArray,
  type GgufKvInput,
  type GgufTensorInput,
  ggufKv,
  unmapName,
  writeGguf,
  writeSafetensors,
} from "@tp/formats";
import { decodeToF32, encodeFromF32 } from "@tp/tensor";

/** Hyper-parameters of a tiny model (config.json spelling). */
export interface TinyConfig {
  readonly model_type: "llama" | "qwen3" | "gemma3";
  readonly vocab_size: number;
  readonly hidden_size: number;
  readonly num_hidden_layers: number;
  readonly num_attention_heads: number;
  readonly num_key_value_heads: number;
  readonly head_dim: number;
  readonly intermediate_size: number;
  readonly rms_norm_eps: number;
  readonly rope_theta: number;
  readonly max_position_embeddings: number;
  readonly tie_word_embeddings: boolean;
  /** gemma3: the window of the sliding layers (every 6th layer, 5 mod 6, is global). */
  readonly sliding_window?: number;
  /** gemma3: RoPE θ of the sliding layers (GGUF `rope.freq_base_swa`). */
  readonly rope_local_base_freq?: number;
  /** gemma3: linear RoPE scaling of the global layers (positions / factor). */
  readonly rope_scaling_factor?: number;
  /** gemma3: logits ← c·tanh(logits / c). */
  readonly final_logit_softcapping?: number;
}

/** gemma3 norm weights (HF `…layernorm.weight`, `norm.weight`, `q_norm`, `k_norm`): stored zero-centred in safetensors. */
export function isGemmaNorm(name: string): boolean {
  return /(layernorm|norm)\.weight$/.test(name);
}

/** Weights by HF name, f32 values in HF (NeoX) row order, torch shapes. */
export type TinyWeights = Map<string, { shape: number[]; values: Float32Array }>;

/** Deterministic uniform numbers in [0, 1) (mulberry32). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Random weights of a tiny model: matrices U(−a, a) with a = 1/√K · 1.7, norm scales 1 + U(−0.2, 0.2). */
export function tinyWeights(c: TinyConfig, seed = 7): TinyWeights {
  const r = rng(seed);
  const w: TinyWeights = new Map();
  const mat = (name: string, n: number, k: number) => {
    const a = 1.7 / Math.sqrt(k);
    w.set(name, { shape: [n, k], values: Float32Array.from({ length: n * k }, () => (2 * r() - 1) * a) });
  };
  const vec = (name: string, n: number) =>
    w.set(name, { shape: [n], values: Float32Array.from({ length: n }, () => 1 + 0.4 * (r() - 0.5)) });
  const { hidden_size: H, head_dim: hd, intermediate_size: F } = c;
  const q = c.num_attention_heads * hd;
  const kv = c.num_key_value_heads * hd;
  w.set("model.embed_tokens.weight", {
    shape: [c.vocab_size, H],
    values: Float32Array.from({ length: c.vocab_size * H }, () => 2 * r() - 1),
  });
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    vec(`${p}input_layernorm.weight`, H);
    mat(`${p}self_attn.q_proj.weight`, q, H);
    mat(`${p}self_attn.k_proj.weight`, kv, H);
    mat(`${p}self_attn.v_proj.weight`, kv, H);
    mat(`${p}self_attn.o_proj.weight`, H, q);
    if (c.model_type !== "llama") {
      vec(`${p}self_attn.q_norm.weight`, hd);
      vec(`${p}self_attn.k_norm.weight`, hd);
    }
    vec(`${p}post_attention_layernorm.weight`, H);
    if (c.model_type === "gemma3") {
      vec(`${p}pre_feedforward_layernorm.weight`, H);
      vec(`${p}post_feedforward_layernorm.weight`, H);
    }
    mat(`${p}mlp.gate_proj.weight`, F, H);
    mat(`${p}mlp.up_proj.weight`, F, H);
    mat(`${p}mlp.down_proj.weight`, H, F);
  }
  vec("model.norm.weight", H);
  if (!c.tie_word_embeddings) mat("lm_head.weight", c.vocab_size, H);
  return w;
}

/** The 7 projections of each layer (what ComfyUI-style fp8 text encoders quantize). */
export function isProjection(name: string): boolean {
  return /\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$/.test(name);
}

/**
 * fp8 e4m3 with one f32 scale per tensor (`w ≈ f8 · scale`, scale = max|w| / 448): the stored bytes and
 * the values they decode to.
 */
export function toFp8Scaled(values: Float32Array): {
  bytes: Uint8Array;
  scale: number;
  decoded: Float32Array;
} {
  let amax = 0;
  for (const v of values) amax = Math.max(amax, Math.abs(v));
  const scale = Math.fround(amax / 448);
  const scaled = Float32Array.from(values, (v) => v / scale);
  const bytes = encodeFromF32(scaled, "f8_e4m3fn", { saturate: true });
  const decoded = decodeToF32(bytes, "f8_e4m3fn").map((v) => Math.fround(v * scale));
  return { bytes, scale, decoded };
}

function f32Bytes(v: Float32Array): Uint8Array {
  return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
}

/** How each tensor is stored in a written safetensors checkpoint. */
export type StoreAs = (name: string) => "F32" | "BF16" | "F16" | "F8_E4M3";

/**
 * Write a safetensors checkpoint directory: model.safetensors (HF names), config.json. Returns the
 * weights as the file holds them (rounded through bf16 / f16 / scaled fp8), for the reference.
 * gemma3: norm scales are written zero-centred (w − 1, as HF stores them; the returned map keeps the
 * multipliers), config.json is a `gemma3_text` one; with `gemmaMultimodal` the tensors go under
 * `model.language_model.` and config.json is a Gemma3ForConditionalGeneration one with `text_config`.
 */
export function writeTinySafetensors(
  dir: string,
  c: TinyConfig,
  w: TinyWeights,
  storeAs: StoreAs = () => "F32",
  gemmaMultimodal = false,
): TinyWeights {
  mkdirSync(dir, { recursive: true });
  const tensors: { name: string; dtype: string; shape: number[]; data: Uint8Array }[] = [];
  const held: TinyWeights = new Map();
  const gemma = c.model_type === "gemma3";
  for (const [hfName, t] of w) {
    const zeroCentred = gemma && isGemmaNorm(hfName);
    const shape = t.shape;
    const values = zeroCentred ? t.values.map((v) => v - 1) : t.values;
    const name = gemma && gemmaMultimodal ? hfName.replace(/^model\./, "model.language_model.") : hfName;
    const as = storeAs(hfName);
    if (as === "F32") {
      tensors.push({ name, dtype: "F32", shape, data: f32Bytes(values) });
      held.set(hfName, { shape, values: zeroCentred ? t.values : values });
    } else if (as === "F8_E4M3") {
      const q = toFp8Scaled(values);
      tensors.push({ name, dtype: "F8_E4M3", shape, data: q.bytes });
      tensors.push({
        name: name.replace(/\.weight$/, ".weight_scale"),
        dtype: "F32",
        shape: [],
        data: f32Bytes(new Float32Array([q.scale])),
      });
      held.set(hfName, { shape, values: q.decoded });
    } else {
      const dt = as === "BF16" ? "bf16" : "f16";
      tensors.push({ name, dtype: as, shape, data: encodeFromF32(values, dt) });
      const decoded = decodeToF32(encodeFromF32(values, dt), dt);
      held.set(hfName, { shape, values: zeroCentred ? decoded.map((v) => v + 1) : decoded });
    }
  }
  writeSafetensors(join(dir, "model.safetensors"), tensors);
  writeFileSync(join(dir, "config.json"), JSON.stringify(tinyConfigJson(c, gemmaMultimodal)));
  return held;
}

/** config.json of a tiny model (gemma3: a `gemma3_text`, or a multimodal one with `text_config`). */
function tinyConfigJson(c: TinyConfig, gemmaMultimodal: boolean): Record<string, unknown> {
  if (c.model_type !== "gemma3") {
    return { architectures: [c.model_type === "llama" ? "LlamaForCausalLM" : "Qwen3ForCausalLM"], ...c };
  }
  const { rope_scaling_factor, final_logit_softcapping, ...rest } = c;
  const text = {
    ...rest,
    model_type: "gemma3_text",
    query_pre_attn_scalar: c.head_dim,
    sliding_window_pattern: 6,
    rope_scaling:
      rope_scaling_factor === undefined ? null : { rope_type: "linear", factor: rope_scaling_factor },
    final_logit_softcapping: final_logit_softcapping ?? null,
    hidden_activation: "gelu_pytorch_tanh",
  };
  return gemmaMultimodal
    ? { architectures: ["Gemma3ForConditionalGeneration"], model_type: "gemma3", text_config: text }
    : { architectures: ["Gemma3ForCausalLM"], ...text };
}

/**
 * llama.cpp's q/k row permutation for the `llama` architecture (`convert_hf_to_gguf.py`
 * `LlamaModel.permute`): within each head, HF row `half · hd/2 + i` (NeoX halves) goes to GGUF row
 * `2i + half` (interleaved pairs). `inverse` maps GGUF rows back to HF.
 */
export function permuteQk(
  values: Float32Array,
  heads: number,
  hd: number,
  k: number,
  inverse = false,
): Float32Array {
  const out = new Float32Array(values.length);
  for (let h = 0; h < heads; h++) {
    for (let half = 0; half < 2; half++) {
      for (let i = 0; i < hd / 2; i++) {
        const hf = h * hd + half * (hd / 2) + i;
        const gg = h * hd + 2 * i + half;
        const [from, to] = inverse ? [gg, hf] : [hf, gg];
        out.set(values.subarray(from * k, (from + 1) * k), to * k);
      }
    }
  }
  return out;
}

/** Extras of {@link writeTinyGguf}, to make good and bad files. */
export interface TinyGgufOptions {
  /**
   * Add a SentencePiece (`llama`) tokenizer of this many tokens: `<unk>`, `<s>`, `</s>`, then
   * `▁t3`, `▁t4`, …
   */
  tokens?: number;
  /** Metadata to add, or to replace (same key); a `null` value removes the key. */
  kv?: readonly (GgufKvInput | { key: string; value: null })[];
  /** Rewrite a tensor as written (GGUF name, type, shape, bytes), e.g. to retype it. */
  tensor?: (t: GgufTensorInput) => GgufTensorInput;
}

/** The tokenizer metadata of {@link TinyGgufOptions.tokens}. */
export function tinyTokenizerKv(n: number): GgufKvInput[] {
  const texts = Array.from({ length: n }, (_, i) =>
    i === 0 ? "<unk>" : i === 1 ? "<s>" : i === 2 ? "</s>" : `\u2581t${i}`,
  );
  return [
    ggufKv("tokenizer.ggml.model", "str", "llama"),
    ggufKv("tokenizer.ggml.tokens", "arr", GgufArray.of("str", texts)),
    ggufKv(
      "tokenizer.ggml.scores",
      "arr",
      GgufArray.of(
        "f32",
        texts.map((_, i) => -i),
      ),
    ),
    ggufKv(
      "tokenizer.ggml.token_type",
      "arr",
      GgufArray.of(
        "i32",
        texts.map((_, i) => (i === 0 ? 2 : i < 3 ? 3 : 1)),
      ),
    ),
  ];
}

/** Write the same model as a GGUF (F32, llama.cpp names and metadata; llama q/k rows permuted). */
export function writeTinyGguf(
  path: string,
  c: TinyConfig,
  w: TinyWeights,
  options: TinyGgufOptions = {},
): void {
  const a = c.model_type;
  const table = GGUF_HF_NAMES[a];
  if (table === undefined) throw new Error(`no GGUF name table for ${a}`);
  const kv = [
    ggufKv("general.architecture", "str", a),
    ggufKv(`${a}.context_length`, "u32", c.max_position_embeddings),
    ggufKv(`${a}.embedding_length`, "u32", c.hidden_size),
    ggufKv(`${a}.block_count`, "u32", c.num_hidden_layers),
    ggufKv(`${a}.feed_forward_length`, "u32", c.intermediate_size),
    ggufKv(`${a}.attention.head_count`, "u32", c.num_attention_heads),
    ggufKv(`${a}.attention.head_count_kv`, "u32", c.num_key_value_heads),
    ggufKv(`${a}.attention.key_length`, "u32", c.head_dim),
    ggufKv(`${a}.attention.value_length`, "u32", c.head_dim),
    ggufKv(`${a}.rope.freq_base`, "f32", c.rope_theta),
    ggufKv(`${a}.attention.layer_norm_rms_epsilon`, "f32", c.rms_norm_eps),
    ...(c.sliding_window === undefined
      ? []
      : [ggufKv(`${a}.attention.sliding_window`, "u32", c.sliding_window)]),
    ...(c.rope_local_base_freq === undefined
      ? []
      : [ggufKv(`${a}.rope.freq_base_swa`, "f32", c.rope_local_base_freq)]),
    ...(c.rope_scaling_factor === undefined
      ? []
      : [
          ggufKv(`${a}.rope.scaling.type`, "str", "linear"),
          ggufKv(`${a}.rope.scaling.factor`, "f32", c.rope_scaling_factor),
        ]),
    ...(c.final_logit_softcapping === undefined
      ? []
      : [ggufKv(`${a}.final_logit_softcapping`, "f32", c.final_logit_softcapping)]),
  ];
  const tensors = [...w].map(([name, { shape, values }]) => {
    let v = values;
    if (a === "llama" && /self_attn\.q_proj\.weight$/.test(name))
      v = permuteQk(values, c.num_attention_heads, c.head_dim, c.hidden_size);
    if (a === "llama" && /self_attn\.k_proj\.weight$/.test(name))
      v = permuteQk(values, c.num_key_value_heads, c.head_dim, c.hidden_size);
    const gname = unmapName(table, name);
    if (gname === null) throw new Error(`no GGUF name for ${name}`);
    const t: GgufTensorInput = { name: gname, type: "F32", shape, data: f32Bytes(v) };
    return options.tensor === undefined ? t : options.tensor(t);
  });
  const all = [...kv, ...(options.tokens === undefined ? [] : tinyTokenizerKv(options.tokens))];
  for (const e of options.kv ?? []) {
    const at = all.findIndex((x) => x.key === e.key);
    if (at >= 0) all.splice(at, 1);
    if (e.value !== null) all.push(e as GgufKvInput);
  }
  writeGguf(path, all, tensors);
}

// ------------------------------------------------------------------------------ reference forward

/** RMSNorm of one row in float64: x / √(mean(x²) + eps) · w. */
export function rmsNorm(x: Float64Array, w: Float32Array, eps: number): Float64Array {
  let ss = 0;
  for (const v of x) ss += v * v;
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  return Float64Array.from(x, (v, i) => v * inv * (w[i] as number));
}

export function matvec(w: { shape: number[]; values: Float32Array }, x: Float64Array): Float64Array {
  const [n, k] = w.shape as [number, number];
  const y = new Float64Array(n);
  for (let r = 0; r < n; r++) {
    let s = 0;
    for (let c = 0; c < k; c++) s += (w.values[r * k + c] as number) * (x[c] as number);
    y[r] = s;
  }
  return y;
}

/** NeoX rotate-half RoPE of one head vector at position p, positions × s (llm.md §3.0). */
export function ropeNeox(x: Float64Array, p: number, theta: number, s = 1): Float64Array {
  const d = x.length;
  const y = Float64Array.from(x);
  for (let i = 0; i < d / 2; i++) {
    const a = p * s * theta ** ((-2 * i) / d);
    const x0 = x[i] as number;
    const x1 = x[i + d / 2] as number;
    y[i] = x0 * Math.cos(a) - x1 * Math.sin(a);
    y[i + d / 2] = x1 * Math.cos(a) + x0 * Math.sin(a);
  }
  return y;
}

/**
 * Logits of every position of `ids` (a fresh sequence), in float64, from HF-layout weights: the
 * Llama / Qwen3 forward of llm.md §3.1 (QK-norm only for qwen3), NeoX RoPE, causal GQA attention.
 * `mlp(layer, f)` replaces the SwiGLU MLP of every layer (a mixture of experts: testing/tiny-moe.ts).
 */
export function referenceLogits(
  c: TinyConfig,
  w: TinyWeights,
  ids: readonly number[],
  mlp?: (layer: number, f: Float64Array) => Float64Array,
): Float64Array[] {
  const get = (n: string) => {
    const t = w.get(n);
    if (!t) throw new Error(`reference: no ${n}`);
    return t;
  };
  const { hidden_size: H, head_dim: hd, num_attention_heads: nh, num_key_value_heads: kvh } = c;
  const emb = get("model.embed_tokens.weight");
  let xs = ids.map((id) => Float64Array.from(emb.values.subarray(id * H, (id + 1) * H)));
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    const hs = xs.map((x) => rmsNorm(x, get(`${p}input_layernorm.weight`).values, c.rms_norm_eps));
    const heads = (v: Float64Array, n: number) =>
      Array.from({ length: n }, (_, h) => v.slice(h * hd, (h + 1) * hd));
    const qs = hs.map((h, t) =>
      heads(matvec(get(`${p}self_attn.q_proj.weight`), h), nh).map((q) =>
        ropeNeox(
          c.model_type === "qwen3"
            ? rmsNorm(q, get(`${p}self_attn.q_norm.weight`).values, c.rms_norm_eps)
            : q,
          t,
          c.rope_theta,
        ),
      ),
    );
    const ks = hs.map((h, t) =>
      heads(matvec(get(`${p}self_attn.k_proj.weight`), h), kvh).map((k) =>
        ropeNeox(
          c.model_type === "qwen3"
            ? rmsNorm(k, get(`${p}self_attn.k_norm.weight`).values, c.rms_norm_eps)
            : k,
          t,
          c.rope_theta,
        ),
      ),
    );
    const vs = hs.map((h) => heads(matvec(get(`${p}self_attn.v_proj.weight`), h), kvh));
    xs = xs.map((x, t) => {
      const o = new Float64Array(nh * hd);
      for (let h = 0; h < nh; h++) {
        const g = Math.floor(h / (nh / kvh));
        const q = qs[t]?.[h] as Float64Array;
        const scores = Array.from({ length: t + 1 }, (_, j) => {
          let s = 0;
          const k = ks[j]?.[g] as Float64Array;
          for (let d = 0; d < hd; d++) s += (q[d] as number) * (k[d] as number);
          return s / Math.sqrt(hd);
        });
        const m = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - m));
        const z = e.reduce((a, b) => a + b, 0);
        for (let j = 0; j <= t; j++) {
          const v = vs[j]?.[g] as Float64Array;
          for (let d = 0; d < hd; d++)
            o[h * hd + d] = (o[h * hd + d] as number) + ((e[j] as number) / z) * (v[d] as number);
        }
      }
      const attn = matvec(get(`${p}self_attn.o_proj.weight`), o);
      const r = Float64Array.from(x, (v, i) => v + (attn[i] as number));
      const f = rmsNorm(r, get(`${p}post_attention_layernorm.weight`).values, c.rms_norm_eps);
      if (mlp !== undefined) {
        const y = mlp(l, f);
        return Float64Array.from(r, (v, i) => v + (y[i] as number));
      }
      const gate = matvec(get(`${p}mlp.gate_proj.weight`), f);
      const up = matvec(get(`${p}mlp.up_proj.weight`), f);
      const act = Float64Array.from(gate, (g, i) => (g / (1 + Math.exp(-g))) * (up[i] as number));
      const down = matvec(get(`${p}mlp.down_proj.weight`), act);
      return Float64Array.from(r, (v, i) => v + (down[i] as number));
    });
  }
  const head = c.tie_word_embeddings ? emb : get("lm_head.weight");
  return xs.map((x) => matvec(head, rmsNorm(x, get("model.norm.weight").values, c.rms_norm_eps)));
}

/**
 * Logits of every position of `ids` (a fresh sequence), in float64, of a gemma3 tiny model written
 * from llm.md §3.5 (weights hold the norm multipliers, the "+1" included): √H-scaled embeddings;
 * per layer, QK-norm, NeoX RoPE with θ = rope_local_base_freq (default 10000) on sliding layers and
 * rope_theta with 1/rope_scaling_factor on global ones (layer i global when i mod 6 = 5), attention
 * scale 1/√head_dim, a window on sliding layers (p − j < W), norms after both sub-layers,
 * GeGLU with gelu-tanh; tied or untied head; optional final softcap. With `hiddenAfter`, returns the
 * hidden state after that many layers instead (rows of [hidden_size]).
 */
export function referenceGemma3Logits(
  c: TinyConfig,
  w: TinyWeights,
  ids: readonly number[],
  hiddenAfter?: number,
): Float64Array[] {
  const get = (n: string) => {
    const t = w.get(n);
    if (!t) throw new Error(`reference: no ${n}`);
    return t.values;
  };
  const mat = (n: string) => {
    const t = w.get(n);
    if (!t) throw new Error(`reference: no ${n}`);
    return t;
  };
  const { hidden_size: H, head_dim: hd, num_attention_heads: nh, num_key_value_heads: kvh } = c;
  const eps = c.rms_norm_eps;
  const scaleEmb = Math.fround(Math.sqrt(H));
  const emb = mat("model.embed_tokens.weight");
  let xs = ids.map((id) => Float64Array.from(emb.values.subarray(id * H, (id + 1) * H), (v) => v * scaleEmb));
  const layers = hiddenAfter ?? c.num_hidden_layers;
  const gelu = (z: number) => 0.5 * z * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (z + 0.044715 * z ** 3)));
  for (let l = 0; l < layers; l++) {
    const p = `model.layers.${l}.`;
    const global = c.sliding_window === undefined || l % 6 === 5;
    const theta = global ? c.rope_theta : (c.rope_local_base_freq ?? 10000);
    const s = global ? 1 / (c.rope_scaling_factor ?? 1) : 1;
    const W = global ? Number.POSITIVE_INFINITY : (c.sliding_window as number);
    const hs = xs.map((x) => rmsNorm(x, get(`${p}input_layernorm.weight`), eps));
    const heads = (v: Float64Array, n: number) =>
      Array.from({ length: n }, (_, h) => v.slice(h * hd, (h + 1) * hd));
    const qs = hs.map((h, t) =>
      heads(matvec(mat(`${p}self_attn.q_proj.weight`), h), nh).map((q) =>
        ropeNeox(rmsNorm(q, get(`${p}self_attn.q_norm.weight`), eps), t, theta, s),
      ),
    );
    const ks = hs.map((h, t) =>
      heads(matvec(mat(`${p}self_attn.k_proj.weight`), h), kvh).map((k) =>
        ropeNeox(rmsNorm(k, get(`${p}self_attn.k_norm.weight`), eps), t, theta, s),
      ),
    );
    const vs = hs.map((h) => heads(matvec(mat(`${p}self_attn.v_proj.weight`), h), kvh));
    xs = xs.map((x, t) => {
      const o = new Float64Array(nh * hd);
      const from = Math.max(0, t - W + 1);
      for (let h = 0; h < nh; h++) {
        const g = Math.floor(h / (nh / kvh));
        const q = qs[t]?.[h] as Float64Array;
        const scores: number[] = [];
        for (let j = from; j <= t; j++) {
          let dot = 0;
          const k = ks[j]?.[g] as Float64Array;
          for (let d = 0; d < hd; d++) dot += (q[d] as number) * (k[d] as number);
          scores.push(dot / Math.sqrt(hd));
        }
        const m = Math.max(...scores);
        const e = scores.map((v) => Math.exp(v - m));
        const z = e.reduce((a, b) => a + b, 0);
        for (let j = from; j <= t; j++) {
          const v = vs[j]?.[g] as Float64Array;
          for (let d = 0; d < hd; d++)
            o[h * hd + d] = (o[h * hd + d] as number) + ((e[j - from] as number) / z) * (v[d] as number);
        }
      }
      const attn = rmsNorm(
        matvec(mat(`${p}self_attn.o_proj.weight`), o),
        get(`${p}post_attention_layernorm.weight`),
        eps,
      );
      const r = Float64Array.from(x, (v, i) => v + (attn[i] as number));
      const f = rmsNorm(r, get(`${p}pre_feedforward_layernorm.weight`), eps);
      const gate = matvec(mat(`${p}mlp.gate_proj.weight`), f);
      const up = matvec(mat(`${p}mlp.up_proj.weight`), f);
      const act = Float64Array.from(gate, (gv, i) => gelu(gv) * (up[i] as number));
      const down = rmsNorm(
        matvec(mat(`${p}mlp.down_proj.weight`), act),
        get(`${p}post_feedforward_layernorm.weight`),
        eps,
      );
      return Float64Array.from(r, (v, i) => v + (down[i] as number));
    });
  }
  if (hiddenAfter !== undefined) return xs;
  const head = c.tie_word_embeddings ? emb : mat("lm_head.weight");
  const cap = c.final_logit_softcapping;
  return xs.map((x) => {
    const l = matvec(head, rmsNorm(x, get("model.norm.weight"), eps));
    return cap === undefined ? l : l.map((v) => cap * Math.tanh(v / cap));
  });
}

/**
 * The final norm and the head (lm_head, or the embedding when tied) in float64 on rows of hidden
 * states `h` [n, hidden_size] (row-major): what a model's last layer output becomes as logits [n, vocab].
 */
export function referenceHead(c: TinyConfig, w: TinyWeights, h: ArrayLike<number>): Float64Array {
  const H = c.hidden_size;
  const head = w.get(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  const norm = w.get("model.norm.weight");
  if (!head || !norm) throw new Error("reference: no head or final norm");
  const n = h.length / H;
  const out = new Float64Array(n * c.vocab_size);
  for (let r = 0; r < n; r++) {
    const row = Float64Array.from({ length: H }, (_, d) => h[r * H + d] as number);
    out.set(matvec(head, rmsNorm(row, norm.values, c.rms_norm_eps)), r * c.vocab_size);
  }
  return out;
}

/** Largest |a − b| over two equally long lists of numbers. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`lengths differ: ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs((a[i] as number) - (b[i] as number)));
  return m;
}
