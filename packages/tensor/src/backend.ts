/**
 * The `Backend` interface: memory (alloc / free / upload / read), capabilities (`supports`), and the op
 * set every model is written against. Model files call these ops only, so the same file runs on CPU,
 * Vulkan, PTX and the CUDA libraries (../shared/ARCHITECTURE.md, "One model definition, every
 * backend"). Op names follow ggml's `enum ggml_op` and candle's `op.rs` (../shared/STYLE.md §3).
 *
 * The op methods are implemented once, in BackendBase and ./ops (the front-end: checks, output shape,
 * output allocation); a backend provides their kernels in a table (./kernels.ts).
 *
 * Conventions for every op:
 * - Inputs are tensors of this backend (else E_STATE); outputs are new contiguous tensors.
 * - Activations are f32 unless an op says otherwise; `supports(op, dtypes)` tells what else works.
 * - A backend may queue ops and run them later; `read` and `synchronize` wait.
 * - Missing capability: TpError E_UNSUPPORTED naming backend, op and format — never a silent fallback.
 */

import type { DTypeName, WeightFormat } from "./dtype.ts";
import { TpError } from "./errors.ts";
import type { MemoryAccount } from "./memory.ts";
import type { Shape } from "./shape.ts";
import type { Tensor } from "./tensor.ts";
import type { Weight } from "./weight.ts";

/** Op names, one per kernel family (one op name gives one kernel name on every backend). */
export const OP_NAMES = [
  "matmul",
  "matmul_id",
  "attention",
  "rms_norm",
  "layer_norm",
  "group_norm",
  "rope",
  "silu",
  "gelu",
  "sigmoid",
  "softplus",
  "swiglu",
  "softmax",
  "add",
  "sub",
  "mul",
  "scale",
  "modulate",
  "embedding",
  "conv2d",
  "upsample_nearest2d",
  "concat",
  "slice",
  "copy",
  "set",
  "cast",
  "argmax",
  "top_k",
  "count_nonfinite",
  "ssm_conv",
  "gated_delta_net",
] as const;

/** One of {@link OP_NAMES}. */
export type OpName = (typeof OP_NAMES)[number];

/** Host arrays that `upload` takes and `read` returns, by dtype. */
export type HostArray =
  | Float64Array
  | Float32Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Int16Array
  | Int8Array
  | Uint8Array
  | BigInt64Array
  | BigUint64Array;

/** Options of {@link Backend.attention}. */
export interface AttentionOptions {
  /** Multiplier of q·k before softmax; default 1/sqrt(head_dim). */
  scale?: number;
  /** Causal: query i (absolute position `qOffset + i`) sees key j only when j ≤ qOffset + i. */
  causal?: boolean;
  /** Position of the first query among the keys (tokens already in the KV cache); default Skv − Sq. */
  qOffset?: number;
  /** Sliding window: with causal, query at position p sees keys j with p − window < j ≤ p. */
  window?: number;
  /**
   * Keys [0, fullPrefix) are visible to every query, and queries inside the prefix see the whole prefix
   * (bidirectional prefix + causal rest, e.g. an image block attended fully after causal text).
   */
  fullPrefix?: number;
  /** Logit soft-capping: scores ← softcap · tanh(scores / softcap) (Gemma 2/3). */
  softcap?: number;
}

/** Options of {@link Backend.rope}. */
export interface RopeOptions {
  /** "neox": rotate halves (x[i], x[i + d/2]) — HF Llama/Qwen; "interleaved": pairs (x[2i], x[2i+1]). */
  mode: "neox" | "interleaved";
  /** Base of the frequencies, rope_theta: freq_i = theta^(−2i/d). */
  theta: number;
  /** Rotated dimensions per head (partial rotary); default head_dim. */
  ropeDims?: number;
  /**
   * Multi-axis RoPE: the rotated pairs are split into consecutive sections, section a uses positions
   * row a of `positions` ([axes, seq_len]). Sizes in pairs (ropeDims/2 total), e.g. Krea 2's 3 axes.
   * Each section is an axis with its own frequency table: pair k of a section of n pairs turns by
   * pos · theta^(−k/n) (Flux / Krea 2 / Qwen-Image per-axis tables; krea2.md §3.5).
   */
  sections?: readonly number[];
  /** Linear position scaling (positions × freqScale); default 1. */
  freqScale?: number;
}

/** Options of {@link Backend.conv2d}. */
export interface Conv2dOptions {
  /** Stride [sh, sw] or one number; default 1. */
  stride?: number | readonly [number, number];
  /** Zero padding [ph, pw] or one number; default 0. */
  padding?: number | readonly [number, number];
}

/** What a backend can do: ops, weight formats for matmul/embedding, and tensor dtypes. */
export interface BackendCapabilities {
  readonly ops: readonly OpName[];
  readonly weightFormats: readonly WeightFormat[];
  readonly dtypes: readonly DTypeName[];
}

/**
 * A compute backend. Memory methods are synchronous except `read`, which waits for queued work.
 *
 * Shapes below use the names of the field: `[batch, seq_len, hidden]`, `[batch, num_heads, seq_len,
 * head_dim]`, `[batch, channels, height, width]`; `...` stands for any leading dimensions.
 */
export interface Backend {
  /** Registry name: "cpu", "vulkan", "ptx", "cuda". */
  readonly name: string;
  /** Human description of the device (CPU model and ISA level, GPU name). */
  readonly device: string;
  /** Current and peak bytes held by this backend, and its budget. */
  readonly memory: MemoryAccount;

  /** What this backend implements. */
  capabilities(): BackendCapabilities;
  /**
   * True when `op` runs here with all of `formats` (weight formats and/or tensor dtypes); with no
   * formats, whether the op exists at all.
   */
  supports(op: OpName, formats?: readonly (WeightFormat | DTypeName)[]): boolean;

  // ------------------------------------------------------------------ memory
  /** Uninitialised contiguous tensor. @throws E_OOM over budget, E_SHAPE for a bad shape. */
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor;
  /** Free a tensor's storage (all views of it die). @throws E_STATE on a double free or foreign tensor. */
  free(t: Tensor): void;
  /**
   * Copy host data into a new tensor. `data` is the dtype's host array (f16/bf16 as Uint16Array bits,
   * fp8 as Uint8Array) or raw little-endian bytes as Uint8Array, exactly numel × element size bytes.
   * @throws E_SHAPE when the length does not match, E_OOM over budget.
   */
  upload(data: HostArray, shape: Shape, dtype: DTypeName, name?: string): Tensor;
  /**
   * Wait for queued work and copy a tensor (any layout) to the host in row-major order, as the dtype's
   * host array (f32 → Float32Array, f16/bf16 → Uint16Array of bits, fp8/u8/bool → Uint8Array, ...).
   */
  read(t: Tensor): Promise<HostArray>;
  /**
   * Run `fn` and free every tensor allocated inside it (by `alloc`, `upload` or any op) except the
   * tensors its result holds: a Tensor, or arrays and plain objects of them (searched to any depth).
   * What survives belongs to the enclosing scope, if any. A throw frees everything allocated inside.
   * Scopes nest; `fn` must be synchronous (a Promise result is an E_ARG: await outside the scope).
   * Source: ../shared/STYLE.md §8 (mlx-lm's blocks carry no lifetime code; this gives the same page).
   * @throws TpError E_ARG when `fn` returns a Promise; whatever `fn` throws
   */
  scope<T>(fn: () => T): T;
  /**
   * Take the tensors `value` holds (a Tensor, or arrays / plain objects / Maps / Sets of them, as
   * {@link scope} searches a result) out of every open scope: they live until `free` or `dispose`,
   * whatever scope they were made in (model weights, a KV cache that grows during a step, resident
   * copies). Returns `value`.
   */
  persist<T>(value: T): T;
  /** Wait for all queued work. */
  synchronize(): Promise<void>;
  /** Free everything this backend holds; the backend is unusable afterwards. */
  dispose(): void;

  // ------------------------------------------------------------------ linear algebra
  /**
   * y = x · Wᵀ (+ bias). x: [..., K] f32; w: [N, K] in any supported {@link WeightFormat} (quantized
   * formats consumed directly, not expanded); bias: [N] f32. → [..., N] f32.
   * @throws E_SHAPE when K differs, E_UNSUPPORTED for a weight format this backend lacks.
   */
  matmul(x: Tensor, w: Weight, options?: { bias?: Tensor }): Tensor;
  /**
   * Mixture-of-experts matmul (ggml `mul_mat_id`): y[t, s] = x[t, s or 0] · W_{ids[t, s]}ᵀ.
   * w: the experts stacked expert-major, a Weight [experts·N, K] (expert e is rows [e·N, (e+1)·N), as
   * GGUF's 3-D `ffn_*_exps` tensors are stored), any supported {@link WeightFormat}, read in place;
   * x: [T, S, K] or [T, 1, K] f32 (one input row per token for every slot); ids: i32 [T, S], each in
   * [0, experts). → [T, S, N] f32. Each expert's weight rows are read once per call for all the rows
   * routed to it (one GEMM per expert), and experts no row chose are not read.
   * Source: ggml `ggml_mul_mat_id` (ggml/src/ggml.c); Shazeer et al. 2017 (sparsely-gated MoE).
   * @throws E_SHAPE for shapes that do not fit, E_ARG for `experts` not dividing w's rows, E_UNSUPPORTED
   *   for a weight format this backend lacks; a backend may refuse ids outside [0, experts) (E_ARG) or
   *   give rows of NaN for them (a queued GPU kernel cannot throw).
   */
  matmulId(x: Tensor, w: Weight, ids: Tensor, options: { experts: number }): Tensor;
  /**
   * Scaled dot-product attention with grouped-query heads, memory O(seq_len) per head.
   * q: [batch, num_heads, Sq, head_dim]; k: [batch, num_kv_heads, Skv, head_dim];
   * v: [batch, num_kv_heads, Skv, head_dim_v]; num_heads % num_kv_heads == 0 (query head h uses KV
   * head floor(h / (num_heads / num_kv_heads))). → [batch, num_heads, Sq, head_dim_v].
   * Source: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al. 2023.
   */
  attention(q: Tensor, k: Tensor, v: Tensor, options?: AttentionOptions): Tensor;

  // ------------------------------------------------------------------ normalisation
  /**
   * RMSNorm over the last dimension: y = x / sqrt(mean(x²) + eps) · g, with g = weight, or
   * g = 1 + weight when `unitOffset` (Gemma, Krea 2's zero-centred scales), or 1 when weight is null.
   * x: [..., D]; weight: [D]. Source: Zhang & Sennrich 2019.
   */
  rmsNorm(x: Tensor, weight: Tensor | null, options: { eps: number; unitOffset?: boolean }): Tensor;
  /**
   * LayerNorm over the last dimension: y = (x − mean) / sqrt(var + eps) · weight + bias (biased
   * variance; affine parts optional). x: [..., D]. Source: Ba et al. 2016.
   */
  layerNorm(x: Tensor, weight: Tensor | null, bias: Tensor | null, options: { eps: number }): Tensor;
  /**
   * GroupNorm: channels split into `groups`, normalised over (channels of the group × spatial).
   * x: [batch, channels, ...spatial]; weight, bias: [channels] or null. Source: Wu & He 2018.
   */
  groupNorm(
    x: Tensor,
    groups: number,
    weight: Tensor | null,
    bias: Tensor | null,
    options: { eps: number },
  ): Tensor;

  // ------------------------------------------------------------------ position
  /**
   * Rotary position embedding. x: [batch, seq_len, num_heads, head_dim]; positions: i32 [seq_len], or
   * [axes, seq_len] with `sections`. Source: RoFormer (arXiv:2104.09864) §3.4.
   */
  rope(x: Tensor, positions: Tensor, options: RopeOptions): Tensor;

  // ------------------------------------------------------------------ elementwise
  /** x · sigmoid(x). Source: Elfwing et al. 2018 (SiLU). */
  silu(x: Tensor): Tensor;
  /** GELU; "none": x·Φ(x) with erf, "tanh": the tanh approximation. Source: Hendrycks & Gimpel 2016. */
  gelu(x: Tensor, options?: { approximate?: "none" | "tanh" }): Tensor;
  /** 1 / (1 + e^(−x)). */
  sigmoid(x: Tensor): Tensor;
  /** log(1 + e^x), and x itself above 20 (ggml_softplus). Source: Dugas et al. 2001. */
  softplus(x: Tensor): Tensor;
  /** silu(gate) · up, same shapes. Source: Shazeer 2020 (GLU variants). */
  swiglu(gate: Tensor, up: Tensor): Tensor;
  /** Softmax along `dim` (default −1), max-subtracted. */
  softmax(x: Tensor, options?: { dim?: number }): Tensor;
  /** a + b with broadcasting. */
  add(a: Tensor, b: Tensor): Tensor;
  /** a − b with broadcasting. */
  sub(a: Tensor, b: Tensor): Tensor;
  /** a · b with broadcasting. */
  mul(a: Tensor, b: Tensor): Tensor;
  /** x · s for a host scalar s (f32). */
  scale(x: Tensor, s: number): Tensor;
  /** x · (1 + scale) + shift, scale and shift broadcast to x (adaLN modulation; DiT, Peebles & Xie 2023). */
  modulate(x: Tensor, scale: Tensor, shift: Tensor): Tensor;

  // ------------------------------------------------------------------ gather, layout
  /** Rows of `table` ([vocab, D], any supported weight format) at `ids` (i32 [...]) → [..., D] f32 (ggml get_rows). */
  embedding(table: Weight, ids: Tensor): Tensor;
  /**
   * 2-D convolution (cross-correlation, as torch.nn.functional.conv2d). x: [batch, C_in, H, W];
   * weight: [C_out, C_in, kh, kw] f32 tensor; bias: [C_out] or null → [batch, C_out, H', W'].
   */
  conv2d(x: Tensor, weight: Tensor, bias: Tensor | null, options?: Conv2dOptions): Tensor;
  /** Nearest-neighbour upsampling by an integer factor on the last two dimensions. */
  upsampleNearest2d(x: Tensor, factor: number): Tensor;
  /** Join tensors along `dim`; other dimensions equal. */
  concat(tensors: readonly Tensor[], dim: number): Tensor;
  /** A contiguous copy of elements [start, end) along `dim` (see Tensor.slice for a view). */
  slice(x: Tensor, dim: number, start: number, end: number): Tensor;
  /** A contiguous copy of any view (materialises permute / transpose / broadcast views). */
  copy(x: Tensor): Tensor;
  /**
   * In-place write (ggml_set / ggml_cpy into a view): copy `src` element for element into `dst`, which
   * may be any non-broadcast view of a tensor of this backend (e.g. rows [len, len + n) of a KV cache).
   * The only op that writes an existing tensor; it is ordered with the other ops like any op.
   * dst, src: the same shape and dtype, any dtype; src may be any view.
   * @throws TpError E_SHAPE when shapes differ; E_ARG when dtypes differ, when dst is a broadcast view
   *   (stride 0 over a dimension longer than 1), or when dst and src share storage; E_STATE
   */
  set(dst: Tensor, src: Tensor): void;
  /** Elementwise dtype conversion with the rounding rules of @tp/tensor convert.ts. */
  cast(x: Tensor, dtype: DTypeName, options?: { saturate?: boolean }): Tensor;

  // ------------------------------------------------------------------ sampling helpers
  /** Index of the largest value along the last dimension (first one on ties) → i32 [...]. */
  argmax(x: Tensor): Tensor;
  /** The k largest values along the last dimension, descending, and their i32 indices. */
  topK(x: Tensor, k: number): { values: Tensor; indices: Tensor };

  // ------------------------------------------------------------------ numeric checks
  /**
   * How many elements of `x` are NaN or ±∞ → i32 [] (a scalar; saturates at 2^31 − 1). A reduction on
   * the device, so a pipeline can check a stage's output by reading 4 bytes instead of the tensor
   * (ARCHITECTURE.md §Errors: non-finite results are errors). x: any shape and view, f32.
   * Source: IEEE 754 — exponent bits all ones (torch.isfinite(x).logical_not().sum()).
   * @throws TpError E_STATE; E_UNSUPPORTED for another dtype or a backend without the op
   */
  countNonFinite(x: Tensor): Tensor;
  // ------------------------------------------------------------------ state-space / linear attention
  /**
   * Depthwise causal convolution over time (ggml_ssm_conv; Mamba's and Gated DeltaNet's short conv):
   * x f32 [T + K − 1, C] (the K − 1 previous inputs, then T new ones), weight f32 [C, K] (tap 0 the
   * oldest) → [T, C], out[t][c] = Σ_j weight[c][j] · x[t + j][c]. No bias, no activation.
   * @throws E_SHAPE when x is not [T + K − 1, C] with T ≥ 0 for weight [C, K], K ≥ 1
   */
  ssmConv(x: Tensor, weight: Tensor): Tensor;
  /**
   * The gated delta rule (Yang et al. 2024, "Gated Delta Networks" eq. 10; Qwen 3.5 / Qwen3-Next linear
   * attention), over n tokens in order. q, k f32 [n, Hk, Dk]; v f32 [n, Hv, Dv]; g (log decay, usually
   * ≤ 0) and beta f32 [n, Hv]; state f32 [Hv, Dk, Dv], contiguous, **updated in place** (S_j[a][b]
   * pairs key dim a with value dim b). Value head j uses key head j mod Hk (ggml's broadcast; the GGUF
   * converter orders the value heads for it). Per token t and head j:
   *   S ← e^{g} S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  out = scale · Sᵀq.
   * → out f32 [n, Hv, Dv]. `scale` defaults to 1/√Dk; `chunk` 0 (default) runs token by token, C > 0
   * the chunked form C tokens at a time (the prefill form; the same function up to rounding).
   * q and k are used as given (the models L2-normalise them first).
   * @throws E_SHAPE for mismatched shapes or Hv not a multiple of Hk; E_ARG for a state that is not
   *   contiguous or shares storage with an input, a scale that is not finite, a chunk outside [0, 1024]
   */
  gatedDeltaNet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    options?: { scale?: number; chunk?: number },
  ): Tensor;
}

/** The names of the op methods of {@link Backend}, by op name. */
export const OP_METHODS: Readonly<Record<OpName, keyof Backend>> = {
  matmul: "matmul",
  matmul_id: "matmulId",
  attention: "attention",
  rms_norm: "rmsNorm",
  layer_norm: "layerNorm",
  group_norm: "groupNorm",
  rope: "rope",
  silu: "silu",
  gelu: "gelu",
  sigmoid: "sigmoid",
  softplus: "softplus",
  swiglu: "swiglu",
  softmax: "softmax",
  add: "add",
  sub: "sub",
  mul: "mul",
  scale: "scale",
  modulate: "modulate",
  embedding: "embedding",
  conv2d: "conv2d",
  upsample_nearest2d: "upsampleNearest2d",
  concat: "concat",
  slice: "slice",
  copy: "copy",
  set: "set",
  cast: "cast",
  argmax: "argmax",
  top_k: "topK",
  count_nonfinite: "countNonFinite",
  ssm_conv: "ssmConv",
  gated_delta_net: "gatedDeltaNet",
};

/**
 * Check a capability before using it.
 * @throws TpError E_UNSUPPORTED naming backend, op and the formats it lacks (and what it has).
 */
export function requireSupport(
  backend: Backend,
  op: OpName,
  formats: readonly (WeightFormat | DTypeName)[] = [],
): void {
  if (backend.supports(op, formats)) return;
  const caps = backend.capabilities();
  if (!caps.ops.includes(op)) {
    throw new TpError(
      "E_UNSUPPORTED",
      `backend ${backend.name} has no op ${op}; it has: ${caps.ops.join(", ") || "none"}`,
    );
  }
  throw new TpError(
    "E_UNSUPPORTED",
    `backend ${backend.name} cannot run ${op} with ${formats.join(" × ")}; formats it has: ${caps.weightFormats.join(", ")}`,
  );
}
