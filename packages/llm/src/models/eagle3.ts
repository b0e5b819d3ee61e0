/**
 * The EAGLE-3 draft head (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language
 * Models via Training-Time Test", 2025; ../shared/spec/llm.md §7.4): one decoder layer that reads the
 * target's own hidden states and proposes the next tokens. Tensors by the AngelSlim names:
 *
 *   fc.weight                                   [H, 3·H_target]  the three taps fused
 *   midlayer.input_layernorm.weight             [H]              on the token embedding
 *   midlayer.hidden_norm.weight                 [H]              on the feature
 *   midlayer.self_attn.{q,k,v}_proj.weight      [heads·head_dim, 2H]
 *   midlayer.self_attn.o_proj.weight            [H, heads·head_dim]
 *   midlayer.post_attention_layernorm.weight    [H]
 *   midlayer.mlp.{gate,up}_proj.weight          [F, H];  down_proj [H, F]
 *   norm.weight                                 [H]
 *   lm_head.weight                              [draft_vocab_size, H]
 *   d2t                                         i64 [draft_vocab_size]: target id = draft id + d2t[draft id]
 *   embed_tokens.weight (optional)              [vocab_size, H]; absent: the target's token embedding
 *
 * Per pair (feat, token) at RoPE position p (feat: fc([h_a ; h_b ; h_c]) of the target's row p − 1, or
 * the head's own output when rolling out; token: the id at position p):
 *   x = [RMSNorm(embed(token), input_layernorm) ; RMSNorm(feat, hidden_norm)]     [n, 2H]
 *   h = feat + o_proj(Attention(RoPE(q_proj x), RoPE(k_proj x), v_proj x))        own KV cache, causal
 *   out = h + down_proj(silu(gate_proj m) ⊙ up_proj m),  m = RMSNorm(h, post_attention_layernorm)
 *   logits = lm_head(RMSNorm(out, norm))                                          [n, draft_vocab_size]
 * `out` is the next rollout step's feat. RoPE is the HF rotate-half layout (the checkpoint is HF's).
 *
 * Hyper-parameters come from the tensor shapes; head_dim, rms_norm_eps and rope_theta from a
 * config.json beside the file when it is an EAGLE config (it has `draft_vocab_size`, or an
 * `architectures` entry naming Eagle) — head_dim as q_proj rows / num_attention_heads first, since
 * the shapes are what the weights are — else from the target's config (AngelSlim heads copy the
 * target's: Qwen3-4B head_dim 128, ε 1e-6, θ 1e6); the taps from its
 * `eagle_config.eagle_aux_hidden_state_layer_ids` when present. Safetensors or a GGUF file with the same tensor names.
 */
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { openCheckpoint, readTextFile, type TensorEntry, type TensorSource } from "@tp/formats";
import {
  type Backend,
  type RopeOptions,
  type Tensor,
  TpError,
  transfer,
  Weight,
  weightBytes,
} from "@tp/tensor";
import type { KvCache } from "../kv-cache.ts";
import type { CausalLM, LlmConfig } from "../model.ts";
import { type CheckpointReader, tensorEntry, WeightReader } from "./checkpoint.ts";
import { freeTensors, LanguageModel } from "./language-model.ts";
import { attend, ForwardPass, type SwiGluWeights, swiglu } from "./layers.ts";

/** Hyper-parameters of an EAGLE-3 head. */
export interface Eagle3Config {
  /** The head's width H (fc rows; the target's hidden_size in every released head). */
  readonly hidden_size: number;
  /** The target's width (fc takes 3 of them). */
  readonly target_hidden_size: number;
  readonly num_attention_heads: number;
  readonly num_key_value_heads: number;
  readonly head_dim: number;
  readonly intermediate_size: number;
  readonly rms_norm_eps: number;
  readonly rope_theta: number;
  /** Rows of lm_head and d2t. */
  readonly draft_vocab_size: number;
  /** The target's vocabulary (d2t maps into it). */
  readonly vocab_size: number;
  /**
   * The target's hidden_states indices feeding fc when the config names them
   * (`eagle_config.eagle_aux_hidden_state_layer_ids` + 1: the outputs of those layers); else the
   * drafter's default, {@link eagle3Taps}.
   */
  readonly taps?: readonly number[];
}

/** The head's weights by AngelSlim names. */
export interface Eagle3Weights {
  /** [H, 3·H_target] */
  readonly fc: Weight;
  readonly midlayer: {
    readonly input_layernorm: Tensor;
    readonly hidden_norm: Tensor;
    readonly post_attention_layernorm: Tensor;
    readonly self_attn: {
      readonly q_proj: Weight;
      readonly k_proj: Weight;
      readonly v_proj: Weight;
      readonly o_proj: Weight;
    };
    readonly mlp: SwiGluWeights;
  };
  /** f32 [H] */
  readonly norm: Tensor;
  /** [draft_vocab_size, H] */
  readonly lm_head: Weight;
  /** [vocab_size, H]: the head's own `embed_tokens.weight` or the target's token embedding. */
  readonly embed_tokens: Weight;
  /** [draft_vocab_size, H]: the rows of embed_tokens at each draft id's target id (rollout tokens are draft ids). */
  readonly draft_embed_tokens: Weight;
}

/** Options of {@link loadEagle3Head}. */
export interface Eagle3LoadOptions {
  /** The target's token embedding [vocab_size, H], used when the head has no `embed_tokens.weight`. */
  readonly targetEmbedding?: Weight;
}

/**
 * An EAGLE-3 head on a backend: weights, config, the d2t map on the host, and its forward.
 * Model code only: no host reads.
 */
export class Eagle3Head {
  readonly backend: Backend;
  readonly config: Eagle3Config;
  readonly weights: Eagle3Weights;
  /** i32 [draft_vocab_size]: the target id of each draft id (draft + d2t[draft]). */
  readonly draftToTarget: Int32Array;
  /** The file the head came from. */
  readonly file: string;
  readonly #rope: RopeOptions;
  readonly #norm: { readonly eps: number };
  readonly #onDispose: (() => void) | undefined;
  #disposed = false;

  constructor(
    backend: Backend,
    config: Eagle3Config,
    weights: Eagle3Weights,
    draftToTarget: Int32Array,
    file: string,
    onDispose?: () => void,
  ) {
    this.backend = backend;
    this.config = config;
    this.weights = weights;
    this.draftToTarget = draftToTarget;
    this.file = file;
    this.#rope = { mode: "neox", theta: config.rope_theta };
    this.#norm = { eps: config.rms_norm_eps };
    this.#onDispose = onDispose;
  }

  /**
   * The fused feature of target hidden states: fc([h_a ; h_b ; h_c]), taps f32 [n, H_target] each → [n, H].
   * A target placed over two backends (placement.ts) leaves each tap on the backend of the block that
   * read it: the taps on another backend than the head's are moved to it first (the explicit crossing,
   * as ForwardPass.next; the copies live in the caller's scope).
   */
  fuse(taps: readonly Tensor[]): Tensor {
    const b = this.backend;
    const here = taps.map((t) => (t.backend === b ? t : transfer(t, b)));
    return b.matmul(here.length === 1 ? (here[0] as Tensor) : b.concat(here, 1), this.weights.fc);
  }

  /**
   * One forward over n pairs at rows [cache.length, cache.length + n) of the head's KV cache (written
   * and committed by the caller's reserve/commit around it), see the module comment.
   * @param embeds f32 [n, H]: the tokens' embeddings (from {@link Eagle3Head.embed} or {@link Eagle3Head.embedDraft})
   * @param feat f32 [n, H]: fused target features or the head's previous output
   * @param positions i32 [n]: RoPE positions
   * @returns out f32 [n, H] (the next feat) and logits f32 [n, draft_vocab_size]
   */
  forward(embeds: Tensor, feat: Tensor, positions: Tensor, cache: KvCache): { out: Tensor; logits: Tensor } {
    const b = this.backend;
    const w = this.weights.midlayer;
    const c = this.config;
    const n = embeds.shape[0] as number;
    const f = new ForwardPass(b, {
      n,
      offset: cache.length,
      positions,
      cache,
      blocks: 1,
      head: "all",
      collect: null,
    });
    const x = b.concat(
      [b.rmsNorm(embeds, w.input_layernorm, this.#norm), b.rmsNorm(feat, w.hidden_norm, this.#norm)],
      1,
    ); // [n, 2H]
    const { num_attention_heads: nh, num_key_value_heads: kvh, head_dim: hd } = c;
    const a = w.self_attn;
    const q = b.rope(b.matmul(x, a.q_proj).reshape(1, n, nh, hd), positions, this.#rope);
    const k = b.rope(b.matmul(x, a.k_proj).reshape(1, n, kvh, hd), positions, this.#rope);
    const v = b.matmul(x, a.v_proj).reshape(1, n, kvh, hd);
    const h = b.add(feat, b.matmul(attend(b, f, 0, q, k, v, 1 / Math.sqrt(hd)), a.o_proj)); // residual = feat
    const out = b.add(h, swiglu(b, w.mlp, b.rmsNorm(h, w.post_attention_layernorm, this.#norm)));
    const logits = b.matmul(b.rmsNorm(out, this.weights.norm, this.#norm), this.weights.lm_head);
    return { out, logits };
  }

  /** Embeddings of target ids (i32 [n]) → f32 [n, H]. */
  embed(ids: Tensor): Tensor {
    return this.backend.embedding(this.weights.embed_tokens, ids);
  }

  /** Embeddings of draft ids (i32 [n], e.g. an argmax of the head's logits) → f32 [n, H]. */
  embedDraft(draftIds: Tensor): Tensor {
    return this.backend.embedding(this.weights.draft_embed_tokens, draftIds);
  }

  /** Free the uploaded norms and close the file's mapping. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    freeTensors(this.backend, this.weights);
    this.#onDispose?.();
  }
}

/** config.json keys of an EAGLE head that override the defaults. */
interface HeadJson {
  head_dim?: number;
  num_attention_heads?: number;
  num_key_value_heads?: number;
  rms_norm_eps?: number;
  rope_theta?: number;
  /** `eagle_config.eagle_aux_hidden_state_layer_ids`: layers whose outputs feed fc (SpecForge's key). */
  aux_layers?: number[];
}

/** The config.json beside `file` when it describes an EAGLE head, else undefined. @throws TpError E_FORMAT */
function headJson(file: string): HeadJson | undefined {
  const path = join(dirname(file), "config.json");
  if (!existsSync(path)) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(readTextFile(path, "config.json"));
  } catch (e) {
    if (e instanceof TpError) throw e;
    throw new TpError(
      "E_FORMAT",
      `config.json beside the EAGLE-3 head is not JSON: ${(e as Error).message}`,
      {
        file: path,
      },
    );
  }
  if (typeof json !== "object" || json === null) return undefined;
  const j = json as Record<string, unknown>;
  const arch = Array.isArray(j.architectures) ? j.architectures.map(String) : [];
  if (!("draft_vocab_size" in j) && !arch.some((a) => /eagle/i.test(a))) return undefined;
  const out: Record<string, number> = {};
  for (const k of ["head_dim", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta"]) {
    const v = j[k];
    if (v === undefined || v === null) continue;
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0)
      throw new TpError("E_FORMAT", `config.json ${k} must be a positive number, got ${JSON.stringify(v)}`, {
        file: path,
      });
    out[k] = v;
  }
  const ec = j.eagle_config as Record<string, unknown> | undefined;
  const ids = typeof ec === "object" && ec !== null ? ec.eagle_aux_hidden_state_layer_ids : undefined;
  if (ids === undefined) return out;
  if (!Array.isArray(ids) || ids.length !== 3 || !ids.every((x) => Number.isInteger(x) && x >= 0))
    throw new TpError(
      "E_FORMAT",
      `config.json eagle_config.eagle_aux_hidden_state_layer_ids must be three layer indices, got ${JSON.stringify(ids)}`,
      { file: path },
    );
  return { ...out, aux_layers: ids as number[] };
}

/** A 2-D tensor's shape, or E_FORMAT naming the file and tensor. */
function shape2(e: TensorEntry, what: string): [number, number] {
  if (e.shape.length !== 2)
    throw new TpError("E_FORMAT", `EAGLE-3 ${what} must be 2-D, got [${e.shape.join(", ")}]`, {
      file: e.file,
      tensor: e.name,
    });
  return [e.shape[0] as number, e.shape[1] as number];
}

/** Read d2t (i64 or i32 [draft_vocab_size]) as target ids, each checked in [0, vocab_size). */
function readD2t(src: TensorSource, r: CheckpointReader, draftVocab: number, vocab: number): Int32Array {
  const e = tensorEntry(r, "d2t");
  const where = { file: e.file, tensor: e.name };
  const numel = e.shape.reduce((a, b) => a * b, 1);
  if (numel !== draftVocab || e.shape.filter((d) => d !== 1).length > 1)
    throw new TpError(
      "E_FORMAT",
      `d2t has shape [${e.shape.join(", ")}]; lm_head.weight has ${draftVocab} rows, so d2t must be [${draftVocab}]`,
      where,
    );
  const bytes = src.data(e.name);
  const dt = e.dtype.toUpperCase();
  const size = dt === "I64" ? 8 : dt === "I32" ? 4 : 0;
  if (size === 0 || bytes.byteLength !== numel * size)
    throw new TpError("E_FORMAT", `d2t must be I64 (or I32) deltas, got ${e.dtype}`, where);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Int32Array(draftVocab);
  for (let i = 0; i < draftVocab; i++) {
    const delta = size === 8 ? Number(view.getBigInt64(i * 8, true)) : view.getInt32(i * 4, true);
    const t = i + delta;
    if (!Number.isSafeInteger(t) || t < 0 || t >= vocab)
      throw new TpError(
        "E_FORMAT",
        `d2t[${i}] = ${delta} maps draft id ${i} to ${t}, outside the target's vocabulary [0, ${vocab})`,
        where,
      );
    out[i] = t;
  }
  return out;
}

/**
 * The rows of `table` [V, H] at `ids`, as a new host Weight [ids.length, H] in the same format (rows
 * are whole byte ranges in every format; row scales are gathered too).
 */
export function gatherRows(table: Weight, ids: Int32Array, name: string): Weight {
  const [, k] = table.shape;
  const rowBytes = weightBytes(table.format, [1, k]);
  const data = new Uint8Array(ids.length * rowBytes);
  for (let i = 0; i < ids.length; i++) {
    const r = ids[i] as number;
    data.set(table.data.subarray(r * rowBytes, (r + 1) * rowBytes), i * rowBytes);
  }
  const sc = table.scale;
  const scale =
    sc === undefined
      ? undefined
      : sc.kind === "tensor"
        ? sc
        : { kind: "row" as const, values: Float32Array.from(ids, (r) => sc.values[r] as number) };
  return new Weight({
    name,
    format: table.format,
    shape: [ids.length, k],
    data,
    ...(scale === undefined ? {} : { scale }),
    ...(table.rotationGroup === undefined ? {} : { rotationGroup: table.rotationGroup }),
  });
}

/**
 * Load an EAGLE-3 head (safetensors, or GGUF with the same names) for a target of config `target`.
 * @throws TpError E_FORMAT naming the file and tensor for a missing or misshaped tensor (fc not
 *   [H, 3·H_target], projections not 2H wide, heads not dividing, d2t outside the vocabulary, no embedding
 *   of the target's width); E_ARG when neither the head nor the options give a token embedding;
 *   E_UNSUPPORTED for a weight format the backend lacks; the readers' E_IO / E_FORMAT
 */
export function loadEagle3Head(
  file: string,
  backend: Backend,
  target: LlmConfig,
  options: Eagle3LoadOptions = {},
): Eagle3Head {
  const src = openCheckpoint(file);
  try {
    const r: CheckpointReader = { source: src, name: (hf) => hf };
    const bad = (e: TensorEntry, msg: string) =>
      new TpError("E_FORMAT", `EAGLE-3 head: ${msg}`, { file: e.file, tensor: e.name });
    const fcE = tensorEntry(r, "fc.weight");
    const [H, fcIn] = shape2(fcE, "fc.weight");
    const Ht = target.hidden_size;
    if (fcIn !== 3 * Ht)
      throw bad(
        fcE,
        `fc.weight is [${H}, ${fcIn}]; the target's hidden_size ${Ht} needs [H, ${3 * Ht}] (three taps)`,
      );
    const qE = tensorEntry(r, "midlayer.self_attn.q_proj.weight");
    const kE = tensorEntry(r, "midlayer.self_attn.k_proj.weight");
    const [qRows, qIn] = shape2(qE, "q_proj");
    const [kvRows] = shape2(kE, "k_proj");
    if (qIn !== 2 * H)
      throw bad(qE, `q_proj takes ${qIn} inputs; [embedding ; feature] is 2·${H} = ${2 * H} wide`);
    const [F] = shape2(tensorEntry(r, "midlayer.mlp.gate_proj.weight"), "gate_proj");
    const headE = tensorEntry(r, "lm_head.weight");
    const [Vd] = shape2(headE, "lm_head.weight");
    const json = headJson(file) ?? {};
    // head_dim: the first that fits the shapes of q_proj rows / num_attention_heads, head_dim (some
    // released configs state hidden_size / heads, which the shapes contradict), the target's
    const fits = (d: number) =>
      Number.isInteger(d) &&
      d >= 1 &&
      qRows % d === 0 &&
      kvRows % d === 0 &&
      (qRows / d) % (kvRows / d) === 0;
    const candidates = [
      ...(json.num_attention_heads === undefined ? [] : [qRows / json.num_attention_heads]),
      ...(json.head_dim === undefined ? [] : [json.head_dim]),
      target.head_dim,
    ];
    const hd = candidates.find(fits);
    if (hd === undefined)
      throw bad(
        qE,
        `q_proj rows ${qRows} and k_proj rows ${kvRows} are not whole heads of head_dim ${candidates.join(" or ")} (query heads a multiple of KV heads)`,
      );
    const config: Eagle3Config = {
      hidden_size: H,
      target_hidden_size: Ht,
      num_attention_heads: qRows / hd,
      num_key_value_heads: kvRows / hd,
      head_dim: hd,
      intermediate_size: F,
      rms_norm_eps: json.rms_norm_eps ?? target.rms_norm_eps,
      rope_theta: json.rope_theta ?? target.rope_theta,
      draft_vocab_size: Vd,
      vocab_size: target.vocab_size,
      ...(json.aux_layers === undefined ? {} : { taps: json.aux_layers.map((l) => l + 1) }),
    };
    const draftToTarget = readD2t(src, r, Vd, target.vocab_size);
    const w = new WeightReader(backend, r);
    const own = w.has("embed_tokens.weight");
    const embedding = own
      ? w.embedding("embed_tokens.weight", [target.vocab_size, H], false)
      : options.targetEmbedding;
    if (embedding === undefined)
      throw new TpError(
        "E_ARG",
        "the EAGLE-3 head has no embed_tokens.weight and no target embedding was given",
        {
          file,
        },
      );
    if (embedding.shape[0] !== target.vocab_size || embedding.shape[1] !== H)
      throw new TpError(
        "E_FORMAT",
        `the target's token embedding is [${embedding.shape.join(", ")}]; the head (width ${H}) needs [${target.vocab_size}, ${H}]`,
        { file, tensor: "fc.weight" },
      );
    const weights = backend.persist(
      backend.scope(
        (): Eagle3Weights => ({
          fc: w.linear("fc.weight", [H, 3 * Ht]),
          midlayer: {
            input_layernorm: w.norm("midlayer.input_layernorm.weight", H),
            hidden_norm: w.norm("midlayer.hidden_norm.weight", H),
            post_attention_layernorm: w.norm("midlayer.post_attention_layernorm.weight", H),
            self_attn: {
              q_proj: w.linear("midlayer.self_attn.q_proj.weight", [qRows, 2 * H]),
              k_proj: w.linear("midlayer.self_attn.k_proj.weight", [kvRows, 2 * H]),
              v_proj: w.linear("midlayer.self_attn.v_proj.weight", [kvRows, 2 * H]),
              o_proj: w.linear("midlayer.self_attn.o_proj.weight", [H, qRows]),
            },
            mlp: {
              gate_proj: w.linear("midlayer.mlp.gate_proj.weight", [F, H]),
              up_proj: w.linear("midlayer.mlp.up_proj.weight", [F, H]),
              down_proj: w.linear("midlayer.mlp.down_proj.weight", [H, F]),
            },
          },
          norm: w.norm("norm.weight", H),
          lm_head: w.linear("lm_head.weight", [Vd, H]),
          embed_tokens: embedding,
          draft_embed_tokens: gatherRows(embedding, draftToTarget, "draft_embed_tokens"),
        }),
      ),
    );
    return new Eagle3Head(backend, config, weights, draftToTarget, file, () => src.close());
  } catch (e) {
    src.close();
    throw e;
  }
}

/**
 * The target's hidden_states indices an EAGLE-3 head reads (llm.md §7.4): the outputs of layers 2,
 * ⌊N/2⌋ and N − 3 (0-based), i.e. hidden_states[3], [⌊N/2⌋ + 1], [N − 2] — {3, 19, 34} for the
 * 36-layer Qwen3-4B. On a target with fewer than 6 layers each layer index is clamped into [0, N − 1]
 * (so taps may repeat: 2 layers → [2, 2, 1]).
 * @throws TpError E_ARG for fewer than 1 layer
 */
export function eagle3Taps(numHiddenLayers: number): [number, number, number] {
  const n = numHiddenLayers;
  if (!Number.isInteger(n) || n < 1)
    throw new TpError("E_ARG", `EAGLE-3 taps need at least one layer, got ${n}`);
  const out = (l: number) => Math.min(n - 1, Math.max(0, l)) + 1;
  return [out(2), out(Math.floor(n / 2)), out(n - 3)];
}

/**
 * The token embedding [vocab_size, hidden_size] of a target built by {@link LanguageModel} (its
 * weights' `embed_tokens`), or undefined for another CausalLM. Gemma's √H scale is applied in its
 * forward, not stored: a head trained on Gemma sees the raw rows, as the checkpoint stores them.
 */
export function targetEmbedding(model: CausalLM): Weight | undefined {
  if (!(model instanceof LanguageModel)) return undefined;
  const e = (model.model.weights as { embed_tokens?: unknown }).embed_tokens;
  return e instanceof Weight ? e : undefined;
}
