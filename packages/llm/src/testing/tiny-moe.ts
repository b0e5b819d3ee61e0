/**
 * Test helpers for Qwen3-MoE (not exported from the package): a tiny random `qwen3moe` checkpoint
 * (Qwen3 attention; a router and stacked experts in every layer) written as a GGUF with our own
 * writer, and its float64 reference forward, written from the equations of llm.md §3.2
 * (transformers `Qwen3MoeSparseMoeBlock`): softmax over all experts, top-k (ties to the lower index),
 * renormalised weights, the weighted sum of the chosen experts' SwiGLU outputs. The attention and the
 * rest of the block are testing/tiny-models.ts's Qwen3 reference.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  GGUF_HF_NAMES,
  type GgufTensorInput,
  ggufKv,
  unmapName,
  writeGguf,
  writeSafetensors,
} from "@tp/formats";
import {
  matvec,
  referenceLogits,
  rng,
  type TinyConfig,
  type TinyWeights,
  tinyWeights,
} from "./tiny-models.ts";

/** A tiny Qwen3-MoE: a Qwen3 TinyConfig and the MoE arguments (transformers `Qwen3MoeConfig` names). */
export interface TinyMoeConfig extends Omit<TinyConfig, "model_type"> {
  readonly model_type: "qwen3moe";
  readonly num_experts: number;
  readonly num_experts_per_tok: number;
  readonly moe_intermediate_size: number;
}

/** The Qwen3 config of the same attention (for tiny-models.ts). */
function asQwen3(c: TinyMoeConfig): TinyConfig {
  return { ...c, model_type: "qwen3" };
}

/**
 * Random weights: Qwen3's attention and norms (tiny-models.ts), and per layer a router
 * `mlp.gate.weight` [E, H] and the expert stacks `mlp.experts.{gate,up}_proj.weight` [E, F, H],
 * `mlp.experts.down_proj.weight` [E, H, F] (the GGUF layout: expert-major). The router is scaled up
 * (U(−3, 3)/√H) so that the routing differs from token to token.
 */
export function tinyMoeWeights(c: TinyMoeConfig, seed = 13): TinyWeights {
  const w = tinyWeights(asQwen3(c), seed);
  const r = rng(seed + 1000);
  const { hidden_size: H, moe_intermediate_size: F, num_experts: E } = c;
  const u = (n: number, a: number) => Float32Array.from({ length: n }, () => (2 * r() - 1) * a);
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.mlp.`;
    for (const m of ["gate_proj", "up_proj", "down_proj"]) w.delete(`${p}${m}.weight`);
    w.set(`${p}gate.weight`, { shape: [E, H], values: u(E * H, 3 / Math.sqrt(H)) });
    w.set(`${p}experts.gate_proj.weight`, { shape: [E, F, H], values: u(E * F * H, 1.7 / Math.sqrt(H)) });
    w.set(`${p}experts.up_proj.weight`, { shape: [E, F, H], values: u(E * F * H, 1.7 / Math.sqrt(H)) });
    w.set(`${p}experts.down_proj.weight`, { shape: [E, H, F], values: u(E * H * F, 1.7 / Math.sqrt(F)) });
  }
  return w;
}

function f32Bytes(v: Float32Array): Uint8Array {
  return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
}

/**
 * Write the model as a GGUF `qwen3moe` (F32, llama.cpp names and metadata: `qwen3moe.expert_count`,
 * `expert_used_count`, `expert_feed_forward_length`). `tensor` may rewrite a tensor as written.
 */
export function writeTinyMoeGguf(
  path: string,
  c: TinyMoeConfig,
  w: TinyWeights,
  options: {
    kv?: readonly ReturnType<typeof ggufKv>[];
    tensor?: (t: GgufTensorInput) => GgufTensorInput;
  } = {},
): void {
  const a = "qwen3moe";
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
    ggufKv(`${a}.expert_count`, "u32", c.num_experts),
    ggufKv(`${a}.expert_used_count`, "u32", c.num_experts_per_tok),
    ggufKv(`${a}.expert_feed_forward_length`, "u32", c.moe_intermediate_size),
  ];
  for (const e of options.kv ?? []) {
    const at = kv.findIndex((x) => x.key === e.key);
    if (at >= 0) kv.splice(at, 1);
    kv.push(e);
  }
  const tensors = [...w].map(([name, { shape, values }]) => {
    const gname = unmapName(table, name);
    if (gname === null) throw new Error(`no GGUF name for ${name}`);
    const t: GgufTensorInput = { name: gname, type: "F32", shape, data: f32Bytes(values) };
    return options.tensor === undefined ? t : options.tensor(t);
  });
  writeGguf(path, kv, tensors);
}

/**
 * Write the model as a Hugging Face checkpoint (F32 `model.safetensors` and a `qwen3_moe` config.json,
 * transformers `Qwen3MoeConfig` names, `norm_topk_prob: true` as the Qwen3-MoE releases): every expert
 * of a stack as its own tensors, `mlp.experts.{e}.{gate,up,down}_proj.weight` [F, H] / [H, F], as
 * transformers stores them. `drop` leaves tensors out (to make incomplete checkpoints); `config`
 * adds or replaces config.json fields.
 */
export function writeTinyMoeSafetensors(
  dir: string,
  c: TinyMoeConfig,
  w: TinyWeights,
  options: { drop?: (name: string) => boolean; config?: Record<string, unknown> } = {},
): void {
  mkdirSync(dir, { recursive: true });
  const tensors: { name: string; dtype: string; shape: number[]; data: Uint8Array }[] = [];
  for (const [name, t] of w) {
    const stack = /^(.*\.experts)\.([a-z_]+\.weight)$/.exec(name);
    const parts =
      stack === null
        ? [{ name, t }]
        : Array.from({ length: c.num_experts }, (_, e) => ({
            name: `${stack[1]}.${e}.${stack[2]}`,
            t: expert(t, e),
          }));
    for (const p of parts) {
      if (options.drop?.(p.name) === true) continue;
      tensors.push({ name: p.name, dtype: "F32", shape: [...p.t.shape], data: f32Bytes(p.t.values) });
    }
  }
  writeSafetensors(join(dir, "model.safetensors"), tensors);
  const { model_type: _, ...fields } = c;
  writeFileSync(
    join(dir, "config.json"),
    JSON.stringify({
      architectures: ["Qwen3MoeForCausalLM"],
      model_type: "qwen3_moe",
      ...fields,
      norm_topk_prob: true,
      ...options.config,
    }),
  );
}

/** Expert e's [rows, k] matrix of a stack [E, rows, k]. */
function expert(
  t: { shape: number[]; values: Float32Array },
  e: number,
): { shape: number[]; values: Float32Array } {
  const [, rows, k] = t.shape as [number, number, number];
  return { shape: [rows, k], values: t.values.subarray(e * rows * k, (e + 1) * rows * k) };
}

/** The routing of one row f in float64: the chosen experts (descending p, ties to the lower index) and their renormalised weights. */
export function referenceRoute(
  c: TinyMoeConfig,
  w: TinyWeights,
  layer: number,
  f: Float64Array,
): { ids: number[]; weights: number[] } {
  const router = w.get(`model.layers.${layer}.mlp.gate.weight`);
  if (!router) throw new Error("reference: no router");
  const logits = matvec(router, f);
  const m = Math.max(...logits);
  const e = Array.from(logits, (v) => Math.exp(v - m));
  const z = e.reduce((a, b) => a + b, 0);
  const p = e.map((v) => v / z); // softmax over all experts
  const order = p.map((_, i) => i).sort((a, b) => (p[b] as number) - (p[a] as number) || a - b);
  const ids = order.slice(0, c.num_experts_per_tok);
  const s = ids.reduce((a, i) => a + (p[i] as number), 0);
  return { ids, weights: ids.map((i) => (p[i] as number) / s) };
}

/** The MoE MLP of one row in float64 (llm.md §3.2). */
function referenceMoe(c: TinyMoeConfig, w: TinyWeights, layer: number, f: Float64Array): Float64Array {
  const get = (n: string) => {
    const t = w.get(`model.layers.${layer}.mlp.${n}`);
    if (!t) throw new Error(`reference: no ${n}`);
    return t;
  };
  const { ids, weights } = referenceRoute(c, w, layer, f);
  const y = new Float64Array(c.hidden_size);
  ids.forEach((e, j) => {
    const gate = matvec(expert(get("experts.gate_proj.weight"), e), f);
    const up = matvec(expert(get("experts.up_proj.weight"), e), f);
    const act = Float64Array.from(gate, (g, i) => (g / (1 + Math.exp(-g))) * (up[i] as number));
    const down = matvec(expert(get("experts.down_proj.weight"), e), act);
    for (let i = 0; i < y.length; i++) y[i] = (y[i] as number) + (weights[j] as number) * (down[i] as number);
  });
  return y;
}

/** Logits of every position of `ids` (a fresh sequence), in float64: Qwen3 attention, the MoE MLP. */
export function referenceMoeLogits(c: TinyMoeConfig, w: TinyWeights, ids: readonly number[]): Float64Array[] {
  return referenceLogits(asQwen3(c), w, ids, (l, f) => referenceMoe(c, w, l, f));
}
