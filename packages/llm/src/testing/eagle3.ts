/**
 * Test helper (not exported from the package): a random-weight EAGLE-3 head for a tiny target, written
 * with our safetensors writer under the AngelSlim tensor names (models/eagle3.ts), with a d2t map over
 * a draft vocabulary smaller than the target's.
 *
 * `mimic` makes the head copy the target's own next-token choice: fc selects one tap (the target's last
 * hidden state when a tap is hidden_states[num_hidden_layers]), the attention and MLP outputs are scaled
 * down to ~1e-3, and norm / lm_head are the target's final norm and head rows at the draft ids — so the
 * head's draft at position q is ≈ the target's argmax at q (the pending token again). A target that
 * repeats tokens then accepts such drafts: multi-token acceptance paths get exercised.
 */
import { ggufKv, writeGguf, writeSafetensors } from "@tp/formats";
import { rng } from "./tiny-models.ts";

/** A tensor by name, f32 values, torch shape. */
export type HeadTensors = Map<string, { shape: number[]; values: Float32Array }>;

/** What the target looks like to the head. */
export interface Eagle3Target {
  readonly hidden_size: number;
  readonly vocab_size: number;
  /** The head's head_dim by default (released heads copy the target's config). */
  readonly head_dim: number;
}

/** Options of {@link tinyEagle3}. */
export interface TinyEagle3Options {
  readonly seed?: number;
  /** Draft vocabulary size (< vocab_size); default vocab_size / 2. */
  readonly draftVocab?: number;
  readonly numAttentionHeads?: number;
  readonly numKeyValueHeads?: number;
  /** Default: the target's head_dim. */
  readonly headDim?: number;
  readonly intermediateSize?: number;
  /** Target ids the draft vocabulary must hold (the rest drawn at random). */
  readonly include?: readonly number[];
  /** Also write `embed_tokens.weight` (random) instead of using the target's. */
  readonly ownEmbedding?: boolean;
  /**
   * Copy the target's choice (see the module comment): `tap` the fc input block (0 … 2) passed through,
   * `norm` the target's final norm [H], `head` its output head [vocab_size, H] (row-major).
   */
  readonly mimic?: { readonly tap: number; readonly norm: Float32Array; readonly head: Float32Array };
}

/** A head: its tensors (f32) and d2t (i64 deltas), and the target id of each draft id. */
export interface TinyEagle3 {
  readonly tensors: HeadTensors;
  readonly d2t: BigInt64Array;
  readonly draftToTarget: Int32Array;
}

/**
 * Random head weights: matrices U(−a, a), a = 1.7/√K (as tiny-models.ts), norm scales 1 + U(−0.2, 0.2);
 * the draft vocabulary a sorted random subset of the target's.
 */
export function tinyEagle3(t: Eagle3Target, o: TinyEagle3Options = {}): TinyEagle3 {
  const r = rng(o.seed ?? 11);
  const H = t.hidden_size;
  const V = t.vocab_size;
  const Vd = o.draftVocab ?? Math.floor(V / 2);
  const nh = o.numAttentionHeads ?? 4;
  const kvh = o.numKeyValueHeads ?? 2;
  const hd = o.headDim ?? t.head_dim;
  const F = o.intermediateSize ?? 2 * H;
  const w: HeadTensors = new Map();
  const mat = (name: string, n: number, k: number, gain = 1) => {
    const a = (gain * 1.7) / Math.sqrt(k);
    w.set(name, { shape: [n, k], values: Float32Array.from({ length: n * k }, () => (2 * r() - 1) * a) });
  };
  const vec = (name: string, n: number) =>
    w.set(name, { shape: [n], values: Float32Array.from({ length: n }, () => 1 + 0.4 * (r() - 0.5)) });
  const m = o.mimic;
  const small = m === undefined ? 1 : 1e-3;
  mat("fc.weight", H, 3 * H);
  if (m !== undefined) {
    const fc = (w.get("fc.weight") as { values: Float32Array }).values;
    fc.fill(0);
    for (let i = 0; i < H; i++) fc[i * 3 * H + m.tap * H + i] = 1;
  }
  vec("midlayer.input_layernorm.weight", H);
  vec("midlayer.hidden_norm.weight", H);
  vec("midlayer.post_attention_layernorm.weight", H);
  mat("midlayer.self_attn.q_proj.weight", nh * hd, 2 * H);
  mat("midlayer.self_attn.k_proj.weight", kvh * hd, 2 * H);
  mat("midlayer.self_attn.v_proj.weight", kvh * hd, 2 * H);
  mat("midlayer.self_attn.o_proj.weight", H, nh * hd, small);
  mat("midlayer.mlp.gate_proj.weight", F, H);
  mat("midlayer.mlp.up_proj.weight", F, H);
  mat("midlayer.mlp.down_proj.weight", H, F, small);
  vec("norm.weight", H);
  // the draft vocabulary: Vd distinct target ids, sorted (as a frequency-pruned vocabulary keeps order)
  const all = Array.from({ length: V }, (_, i) => i);
  for (let i = V - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [all[i], all[j]] = [all[j] as number, all[i] as number];
  }
  const must = [...new Set(o.include ?? [])].filter((id) => id >= 0 && id < V).slice(0, Vd);
  const chosen = new Set(must);
  for (const id of all) {
    if (chosen.size >= Vd) break;
    chosen.add(id);
  }
  const draftToTarget = Int32Array.from([...chosen].sort((a, b) => a - b));
  const d2t = BigInt64Array.from(draftToTarget, (tid, i) => BigInt(tid - i));
  mat("lm_head.weight", Vd, H);
  if (m !== undefined) {
    (w.get("norm.weight") as { values: Float32Array }).values.set(m.norm);
    const head = (w.get("lm_head.weight") as { values: Float32Array }).values;
    for (let i = 0; i < Vd; i++) {
      const tid = draftToTarget[i] as number;
      head.set(m.head.subarray(tid * H, (tid + 1) * H), i * H);
    }
  }
  if (o.ownEmbedding === true)
    w.set("embed_tokens.weight", {
      shape: [V, H],
      values: Float32Array.from({ length: V * H }, () => 2 * r() - 1),
    });
  return { tensors: w, d2t, draftToTarget };
}

/**
 * Write a head as safetensors (F32 tensors, d2t I64). `drop` leaves tensors out, `reshape` writes a
 * tensor with another shape (its values truncated or zero-padded): the bad files of the tests.
 */
export function writeTinyEagle3(
  path: string,
  h: TinyEagle3,
  bad: { drop?: readonly string[]; reshape?: Readonly<Record<string, number[]>> } = {},
): void {
  const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const tensors = [...h.tensors]
    .filter(([name]) => !(bad.drop ?? []).includes(name))
    .map(([name, { shape, values }]) => {
      const s = bad.reshape?.[name] ?? shape;
      const n = s.reduce((a, b) => a * b, 1);
      const v = new Float32Array(n);
      v.set(values.subarray(0, Math.min(n, values.length)));
      return { name, dtype: "F32", shape: s, data: bytes(v) };
    });
  if (!(bad.drop ?? []).includes("d2t")) {
    const s = bad.reshape?.d2t ?? [h.d2t.length];
    const n = s.reduce((a, b) => a * b, 1);
    const v = new BigInt64Array(n);
    v.set(h.d2t.subarray(0, Math.min(n, h.d2t.length)));
    tensors.push({ name: "d2t", dtype: "I64", shape: s, data: bytes(v) });
  }
  writeSafetensors(path, tensors);
}

/** Write a head as GGUF with the same tensor names (F32, d2t I64): the GGUF form models/eagle3.ts reads. */
export function writeTinyEagle3Gguf(path: string, h: TinyEagle3): void {
  const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const tensors = [...h.tensors].map(([name, { shape, values }]) => ({
    name,
    type: "F32",
    shape,
    data: bytes(values),
  }));
  tensors.push({ name: "d2t", type: "I64", shape: [h.d2t.length], data: bytes(h.d2t) });
  writeGguf(path, [ggufKv("general.architecture", "str", "eagle3")], tensors);
}
