/**
 * The kernel table: what a backend implements, one entry per op of {@link OP_NAMES}. The op methods of
 * `Backend` are written once, in @tp/tensor (BackendBase and ./ops): they check ownership, dtypes,
 * shapes and options, infer the output shape, allocate the output (freed again if the kernel throws)
 * and only then call the entry — so an entry computes and nothing else. `supports(op, formats)` and
 * `capabilities()` are derived from the table: a missing entry is an op the backend lacks (E_UNSUPPORTED
 * naming backend, op and format), never a fallback.
 *
 * What every entry receives:
 * - the output tensor(s) first: new, contiguous, allocated on this backend with the inferred shape and
 *   dtype (`set` receives its destination view instead; `top_k` its values and indices);
 * - then the inputs, live tensors of this backend whose dtypes the entry declares, in any layout
 *   (strided, permuted, broadcast views: an entry that needs contiguous data copies them itself, into
 *   scratch made inside `backend.scope`); binary ops get their operands as views broadcast to the
 *   output's shape, `slice` the view x.slice(dim, start, end);
 * - then the options, checked and normalised (defaults filled in, dims non-negative, pairs expanded).
 * Outputs may be empty (numel 0); an entry must then write nothing and may return at once.
 * An entry may queue its work (a GPU command buffer) and return before it has run.
 *
 * Source: ggml `ggml-backend-impl.h` (`graph_compute` sees nodes already built: shapes inferred and
 * outputs allocated by ggml.c) and `ggml_backend_supports_op` (capability from what is implemented).
 */

import { OP_NAMES, type OpName } from "./backend.ts";
import type { DTypeName, WeightFormat } from "./dtype.ts";
import type { Tensor } from "./tensor.ts";
import type { Weight } from "./weight.ts";

/** The checked parameters of `attention` (shapes of q [batch, heads, sq, headDim], k / v [batch, kvHeads, skv, headDim / headDimV]). */
export interface AttentionParams {
  readonly batch: number;
  /** num_attention_heads of q. */
  readonly heads: number;
  /** num_key_value_heads of k and v; heads is a multiple of it. */
  readonly kvHeads: number;
  /** Query rows. */
  readonly sq: number;
  /** Key / value rows. */
  readonly skv: number;
  /** head_dim of q and k (≥ 1). */
  readonly headDim: number;
  /** head_dim of v and of the output. */
  readonly headDimV: number;
  /** Multiplier of q·k, finite in f32. */
  readonly scale: number;
  readonly causal: boolean;
  /** Position of the first query among the keys. */
  readonly qOffset: number;
  /** Sliding window (≥ 1), or 0 for none; only with causal. */
  readonly window: number;
  /** Keys [0, fullPrefix) visible to every query; 0 for none. */
  readonly fullPrefix: number;
  /** tanh soft-capping of the scores (positive, finite in f32), or 0 for none. */
  readonly softcap: number;
}

/**
 * The signature of every kernel entry, by op name: output(s) first, then inputs, then the normalised
 * options. Semantics of each op: `Backend` in ./backend.ts.
 */
export interface KernelSignatures {
  /** out [..., N] f32 = x [..., K] · wᵀ (+ bias [N]); w a Weight [N, K] whose format the entry lists. */
  matmul: (out: Tensor, x: Tensor, w: Weight, bias: Tensor | null) => void;
  /**
   * out [T, S, N] f32 = x [T, S or 1, K] · W_{ids[t, s]}ᵀ; w a Weight [experts·N, K] (expert-major
   * stack) whose format the entry lists; ids i32 [T, S] (an entry checks their range or gives NaN rows).
   */
  matmul_id: (out: Tensor, x: Tensor, w: Weight, ids: Tensor, experts: number) => void;
  /** out [batch, heads, sq, headDimV]; never called with an empty output. */
  attention: (out: Tensor, q: Tensor, k: Tensor, v: Tensor, p: AttentionParams) => void;
  /** x [..., D]; weight [D] or null; eps ≥ 0; unitOffset: scale by 1 + weight. */
  rms_norm: (out: Tensor, x: Tensor, weight: Tensor | null, eps: number, unitOffset: boolean) => void;
  /** x [..., D]; weight, bias [D] or null; eps ≥ 0. */
  layer_norm: (out: Tensor, x: Tensor, weight: Tensor | null, bias: Tensor | null, eps: number) => void;
  /** x [batch, channels, ...spatial]; groups divides channels; weight, bias [channels] or null. */
  group_norm: (
    out: Tensor,
    x: Tensor,
    groups: number,
    weight: Tensor | null,
    bias: Tensor | null,
    eps: number,
  ) => void;
  /**
   * x [batch, seq_len, num_heads, head_dim]; positions i32 [seq_len], or [sections.length, seq_len]
   * when `sections` is not empty (then it sums to ropeDims / 2 pairs); ropeDims even, ≤ head_dim;
   * theta > 0 and freqScale finite.
   */
  rope: (
    out: Tensor,
    x: Tensor,
    positions: Tensor,
    mode: "neox" | "interleaved",
    theta: number,
    ropeDims: number,
    freqScale: number,
    sections: readonly number[],
  ) => void;
  silu: (out: Tensor, x: Tensor) => void;
  gelu: (out: Tensor, x: Tensor, approximate: "none" | "tanh") => void;
  sigmoid: (out: Tensor, x: Tensor) => void;
  softplus: (out: Tensor, x: Tensor) => void;
  /** gate and up of out's shape. */
  swiglu: (out: Tensor, gate: Tensor, up: Tensor) => void;
  /** Along `dim`, in [0, rank). */
  softmax: (out: Tensor, x: Tensor, dim: number) => void;
  /** a and b broadcast to out's shape (stride-0 views where they were broadcast). */
  add: (out: Tensor, a: Tensor, b: Tensor) => void;
  sub: (out: Tensor, a: Tensor, b: Tensor) => void;
  mul: (out: Tensor, a: Tensor, b: Tensor) => void;
  /** s: a host number (the kernel rounds it to the dtype; ±inf and NaN are not refused). */
  scale: (out: Tensor, x: Tensor, s: number) => void;
  /** scale and shift broadcast to x's shape. */
  modulate: (out: Tensor, x: Tensor, scale: Tensor, shift: Tensor) => void;
  /** out [...ids.shape, D] f32 = rows of table [V, D] at i32 ids (an entry may check the ids' range). */
  embedding: (out: Tensor, table: Weight, ids: Tensor) => void;
  /** x [batch, C_in, H, W]; weight [C_out, C_in, kh, kw]; stride ≥ 1, padding ≥ 0 as [h, w]. */
  conv2d: (
    out: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | null,
    stride: readonly [number, number],
    padding: readonly [number, number],
  ) => void;
  /** factor ≥ 1 on the last two dimensions. */
  upsample_nearest2d: (out: Tensor, x: Tensor, factor: number) => void;
  /** inputs: one dtype and rank, equal sizes except along `dim` (in [0, rank)). */
  concat: (out: Tensor, inputs: readonly Tensor[], dim: number) => void;
  /** view: x.slice(dim, start, end), a view of x of out's shape. */
  slice: (out: Tensor, view: Tensor) => void;
  copy: (out: Tensor, x: Tensor) => void;
  /**
   * In place: dst (a non-broadcast, non-overlapping view) ← src, same shape and dtype, no shared
   * storage (checked: @tp/tensor checkSetArgs).
   */
  set: (dst: Tensor, src: Tensor) => void;
  /**
   * out has the target dtype; x's and out's dtypes are both listed by the entry. The entry throws
   * E_UNSUPPORTED (`op cast on backend B: no conversion A → C ...`) for a pair it lacks.
   */
  cast: (out: Tensor, x: Tensor, saturate: boolean) => void;
  /** out i32 [...leading]; rows of x non-empty. */
  argmax: (out: Tensor, x: Tensor) => void;
  /** values (x's dtype) and indices (i32), both [..., k], 0 ≤ k ≤ the last dimension of x. */
  top_k: (values: Tensor, indices: Tensor, x: Tensor, k: number) => void;
  /** out i32 [] ← the number of NaN / ±∞ elements of x (any shape and view; saturating at 2^31 − 1). */
  count_nonfinite: (out: Tensor, x: Tensor) => void;
  /** out [T, C]; x [T + K − 1, C]; weight [C, K], K ≥ 1. */
  ssm_conv: (out: Tensor, x: Tensor, weight: Tensor) => void;
  /**
   * out [n, Hv, Dv]; q, k [n, Hk, Dk]; v [n, Hv, Dv]; g, beta [n, Hv]; state [Hv, Dk, Dv] contiguous,
   * sharing no storage with the others, updated in place; Hv a multiple of Hk; scale finite in f32;
   * chunk in [0, 1024] (0: token by token). Never called with n = 0.
   */
  gated_delta_net: (
    out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    scale: number,
    chunk: number,
  ) => void;
}

/** One entry of a {@link KernelTable}: the kernel and what it takes. */
export interface KernelEntry<F> {
  /**
   * Dtypes of the op's data tensors (inputs, outputs, bias, norm weights) this kernel takes. The
   * index tensors fixed by the op contract ({@link OP_INDEX_DTYPES}: rope's positions, embedding's
   * ids, argmax / top_k indices) are not listed; they are always i32.
   */
  readonly dtypes: readonly DTypeName[];
  /** Weight formats of a Weight operand (matmul, embedding); other ops have none. */
  readonly weightFormats?: readonly WeightFormat[];
  /**
   * The most bytes of elements one input (and, for cast, the output) may hold; past it the front-end
   * throws E_UNSUPPORTED before it allocates anything. Absent: no limit.
   */
  readonly maxBytes?: number;
  /** The kernel (see {@link KernelSignatures}); an arrow function or bound, it is called detached. */
  readonly run: F;
}

/** What a backend implements: an entry per op it has (see the module comment for the contract). */
export type KernelTable = { readonly [Op in OpName]?: KernelEntry<KernelSignatures[Op]> };

/** The index tensors of each op, whose dtype the op contract fixes (i32 everywhere). */
export const OP_INDEX_DTYPES: Readonly<Partial<Record<OpName, readonly DTypeName[]>>> = {
  rope: ["i32"],
  matmul_id: ["i32"],
  embedding: ["i32"],
  argmax: ["i32"],
  top_k: ["i32"],
  count_nonfinite: ["i32"],
};

/** The table of a backend that implements no op (every op call is E_UNSUPPORTED). */
export const EMPTY_KERNEL_TABLE: KernelTable = Object.freeze({});

/**
 * True when `table` has an entry for `op` that takes every one of `formats` (tensor dtypes of the
 * entry or of the op's index tensors, and weight formats of the entry); with no formats, whether the
 * entry exists. Source: ggml-backend `supports_op`.
 */
export function tableSupports(
  table: KernelTable,
  op: OpName,
  formats: readonly (WeightFormat | DTypeName)[] = [],
): boolean {
  const entry = table[op] as KernelEntry<unknown> | undefined;
  if (entry === undefined) return false;
  const index = OP_INDEX_DTYPES[op];
  for (const f of formats) {
    if ((entry.dtypes as readonly string[]).includes(f)) continue;
    if (entry.weightFormats !== undefined && (entry.weightFormats as readonly string[]).includes(f)) continue;
    if (index !== undefined && (index as readonly string[]).includes(f)) continue;
    return false;
  }
  return true;
}

/**
 * The capabilities a table declares: its ops (in {@link OP_NAMES} order), the union of its weight
 * formats, and the union of its dtypes (with the index dtypes of the ops it has).
 */
export function tableCapabilities(table: KernelTable): {
  ops: OpName[];
  weightFormats: WeightFormat[];
  dtypes: DTypeName[];
} {
  const ops: OpName[] = [];
  const formats = new Set<WeightFormat>();
  const dtypes = new Set<DTypeName>();
  for (const op of OP_NAMES) {
    const entry = table[op] as KernelEntry<unknown> | undefined;
    if (entry === undefined) continue;
    ops.push(op);
    for (const d of entry.dtypes) dtypes.add(d);
    for (const d of OP_INDEX_DTYPES[op] ?? []) dtypes.add(d);
    for (const f of entry.weightFormats ?? []) formats.add(f);
  }
  return { ops, weightFormats: [...formats], dtypes: [...dtypes] };
}
