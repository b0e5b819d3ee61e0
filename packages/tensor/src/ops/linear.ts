/**
 * The front-end of the ops with a weight or a contraction: matmul, matmul_id, embedding, attention, conv2d, and
 * rope. Checks (E_STATE, E_UNSUPPORTED for a dtype or weight format the kernel lacks, E_SHAPE naming
 * the shapes, E_ARG naming the option), output shape, then the kernel on the new output. Semantics
 * and sources: `Backend` in ../backend.ts.
 */
import type { AttentionOptions, Conv2dOptions, RopeOptions } from "../backend.ts";
import type { AttentionParams } from "../kernels.ts";
import { attentionScalars, finiteOption, integerOption, opError } from "../op-args.ts";
import { formatShape } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import type { Weight } from "../weight.ts";
import {
  checkIndex,
  checkInput,
  checkWeight,
  kernel,
  type OpHost,
  run,
  shown,
  shownWeight,
} from "./common.ts";

/**
 * y = x · Wᵀ (+ bias). x: [..., K]; w: a Weight [N, K]; bias: [N] → [..., N] of x's dtype.
 * @throws TpError E_ARG when w is not a Weight; E_SHAPE when x does not end in K or the bias is not
 *   [N]; E_UNSUPPORTED for a weight format or dtype the kernel lacks; E_STATE; E_OOM
 */
export function matmul(host: OpHost, x: Tensor, w: Weight, options?: { bias?: Tensor } | null): Tensor {
  const op = "matmul";
  const k = kernel(host, op);
  const bias = options?.bias ?? null;
  checkInput(host, op, k, x, "x");
  checkInput(host, op, k, bias, "bias");
  checkWeight(host, op, k.weightFormats, w);
  const [n, kk] = w.shape;
  if (x.rank < 1 || x.shape[x.rank - 1] !== kk) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `x ${formatShape(x.shape)} does not end in K = ${kk} of ${shownWeight(w)}`,
    );
  }
  if (bias !== null && (bias.rank !== 1 || bias.shape[0] !== n)) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `bias ${formatShape(bias.shape)} is not [N] = [${n}] of ${shownWeight(w)}`,
    );
  }
  const shape = x.shape.slice();
  shape[shape.length - 1] = n;
  return run(host, host.alloc(shape, x.dtype), k.run, x, w, bias);
}

/**
 * Mixture-of-experts matmul (Backend.matmulId; ggml mul_mat_id): out[t, s] = x[t, s or 0] · W_eᵀ with
 * e = ids[t, s]. x: [T, S, K] or [T, 1, K]; w: a Weight [experts·N, K], the experts stacked
 * expert-major; ids: i32 [T, S] → [T, S, N] of x's dtype. An empty output is returned without running
 * the kernel.
 * @throws TpError E_ARG when w is not a Weight or `experts` is not a positive integer dividing w's rows;
 *   E_SHAPE naming x, ids and w when they do not fit; E_UNSUPPORTED for a weight format or dtype the
 *   kernel lacks; E_STATE; E_OOM
 */
export function matmulId(
  host: OpHost,
  x: Tensor,
  w: Weight,
  ids: Tensor,
  options: { experts: number },
): Tensor {
  const op = "matmul_id";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  checkIndex(host, op, k, ids, "ids");
  checkWeight(host, op, k.weightFormats, w);
  const [rows, kk] = w.shape;
  const experts = integerOption(host.name, op, "experts", options?.experts, 1, 2 ** 31 - 1);
  if (rows % experts !== 0) {
    throw opError(
      "E_ARG",
      host.name,
      op,
      `experts = ${experts} does not divide the ${rows} rows of ${shownWeight(w)} (a stack [experts·N, K])`,
    );
  }
  const n = rows / experts;
  const all = `x ${formatShape(x.shape)}, ids ${formatShape(ids.shape)}, ${shownWeight(w)}`;
  if (ids.rank !== 2) throw opError("E_SHAPE", host.name, op, `${all}: ids must be [tokens, slots]`);
  const [t, s] = ids.shape as [number, number];
  if (x.rank !== 3 || x.shape[0] !== t || (x.shape[1] !== s && x.shape[1] !== 1) || x.shape[2] !== kk) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${all}: x must be [${t}, ${s}, ${kk}] or [${t}, 1, ${kk}] (tokens and slots of ids, K of w)`,
    );
  }
  const out = host.alloc([t, s, n], x.dtype, x.name);
  if (t * s * n === 0) return out;
  return run(host, out, k.run, x, w, ids, experts);
}

/**
 * Rows of `table` ([V, D]) at i32 `ids` ([...]) → [..., D] f32 (ggml get_rows).
 * @throws TpError E_ARG when table is not a Weight (a kernel may also reject ids outside [0, V));
 *   E_UNSUPPORTED for a format the kernel lacks or ids that are not i32; E_STATE; E_OOM
 */
export function embedding(host: OpHost, table: Weight, ids: Tensor): Tensor {
  const op = "embedding";
  const k = kernel(host, op);
  checkIndex(host, op, k, ids, "ids");
  checkWeight(host, op, k.weightFormats, table);
  const shape = ids.shape.slice();
  shape.push(table.shape[1]);
  return run(host, host.alloc(shape, "f32"), k.run, table, ids);
}

/** E_SHAPE of attention naming q, k and v. */
function qkvError(host: OpHost, q: Tensor, k: Tensor, v: Tensor, why: string) {
  const shapes = `q ${formatShape(q.shape)}, k ${formatShape(k.shape)}, v ${formatShape(v.shape)}`;
  return opError("E_SHAPE", host.name, "attention", `${shapes}: ${why}`);
}

/**
 * Scaled dot-product attention with grouped-query heads (Backend.attention). An empty output is
 * returned without running the kernel.
 * @throws TpError E_SHAPE naming q, k, v when ranks, batch, head_dim, Skv or the head grouping do not
 *   fit, or head_dim is 0 while the output is not empty; E_ARG naming the option (scale and softcap
 *   finite in f32, softcap positive; qOffset, window ≥ 1 with causal, fullPrefix ≥ 0 integers;
 *   causal a boolean); E_STATE; E_UNSUPPORTED
 */
export function attention(
  host: OpHost,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  opts?: AttentionOptions | null,
): Tensor {
  const op = "attention";
  const entry = kernel(host, op);
  const options = opts ?? {};
  checkInput(host, op, entry, q, "q");
  checkInput(host, op, entry, k, "k");
  checkInput(host, op, entry, v, "v");
  if (q.rank !== 4 || k.rank !== 4 || v.rank !== 4)
    throw qkvError(host, q, k, v, "each must be [batch, heads, seq_len, head_dim]");
  const [batch, heads, sq, d] = q.shape as [number, number, number, number];
  const [kb, kvHeads, skv, kd] = k.shape as [number, number, number, number];
  const [vb, vh, vs, dv] = v.shape as [number, number, number, number];
  if (kb !== batch || vb !== batch) throw qkvError(host, q, k, v, "batch sizes differ");
  if (kd !== d) throw qkvError(host, q, k, v, `q and k head_dim differ (${d} vs ${kd})`);
  if (vh !== kvHeads || vs !== skv) throw qkvError(host, q, k, v, "k and v differ in heads or seq_len");
  if (kvHeads === 0 ? heads !== 0 : heads % kvHeads !== 0) {
    throw qkvError(host, q, k, v, `${heads} query heads are not a multiple of ${kvHeads} kv heads`);
  }
  const { scale, softcap } = attentionScalars(host.name, op, options, d);
  const causal = options.causal ?? false;
  if (typeof causal !== "boolean") {
    throw opError("E_ARG", host.name, op, `causal must be a boolean, got ${String(causal)}`);
  }
  const qOffset = integerOption(host.name, op, "qOffset", options.qOffset ?? skv - sq, -(2 ** 52), 2 ** 52);
  const window = options.window === undefined ? 0 : integerOption(host.name, op, "window", options.window, 1);
  if (window > 0 && !causal) {
    throw opError(
      "E_ARG",
      host.name,
      op,
      "window needs causal: true (a sliding window limits a causal mask)",
    );
  }
  const fullPrefix =
    options.fullPrefix === undefined ? 0 : integerOption(host.name, op, "fullPrefix", options.fullPrefix, 0);
  const shape = [batch, heads, sq, dv];
  if (batch * heads * sq * dv === 0) return host.alloc(shape, q.dtype, q.name);
  if (d === 0) throw qkvError(host, q, k, v, "head_dim is 0, so q·kᵀ has no terms; it must be at least 1");
  const p: AttentionParams = {
    batch,
    heads,
    kvHeads,
    sq,
    skv,
    headDim: d,
    headDimV: dv,
    scale,
    causal,
    qOffset,
    window,
    fullPrefix,
    softcap,
  };
  return run(host, host.alloc(shape, q.dtype, q.name), entry.run, q, k, v, p);
}

/** A stride or padding option as [h, w]: a number or a pair of integers in [lo, 2^31 − 1]. */
function pair(host: OpHost, name: string, v: unknown, fallback: number, lo: number): [number, number] {
  const p = v === undefined ? [fallback, fallback] : typeof v === "number" ? [v, v] : v;
  if (
    !Array.isArray(p) ||
    p.length !== 2 ||
    !p.every((n) => typeof n === "number" && Number.isInteger(n) && n >= lo && n < 2 ** 31)
  ) {
    throw opError(
      "E_ARG",
      host.name,
      "conv2d",
      `${name} must be an integer in [${lo}, 2^31 − 1] or a pair of them, got ${JSON.stringify(v)}`,
    );
  }
  return [p[0] as number, p[1] as number];
}

/**
 * 2-D convolution (cross-correlation with zero padding, torch.nn.functional.conv2d): x [batch, C_in,
 * H, W], weight [C_out, C_in, kh, kw], bias [C_out] or null → [batch, C_out, H', W'] with
 * H' = ⌊(H + 2·ph − kh) / sh⌋ + 1.
 * @throws TpError E_SHAPE naming the shapes (ranks, channels, bias, a kernel larger than the padded
 *   input); E_ARG naming stride or padding; E_STATE; E_UNSUPPORTED
 */
export function conv2d(
  host: OpHost,
  x: Tensor,
  weight: Tensor,
  b: Tensor | null,
  opts?: Conv2dOptions | null,
): Tensor {
  const op = "conv2d";
  const k = kernel(host, op);
  const options = opts ?? {};
  const bias = b ?? null;
  checkInput(host, op, k, x, "x");
  checkInput(host, op, k, weight, "weight");
  checkInput(host, op, k, bias, "bias");
  const all = `x ${formatShape(x.shape)}, weight ${formatShape(weight.shape)}`;
  if (x.rank !== 4 || weight.rank !== 4) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${all}: x must be [batch, C_in, H, W] and weight [C_out, C_in, kh, kw]`,
    );
  }
  const [batch, cIn, h, w] = x.shape as [number, number, number, number];
  const [cOut, wIn, kh, kw] = weight.shape as [number, number, number, number];
  if (wIn !== cIn) throw opError("E_SHAPE", host.name, op, `${all}: C_in differs (${cIn} vs ${wIn})`);
  if (bias !== null && (bias.rank !== 1 || bias.shape[0] !== cOut)) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${shown(bias, "bias")} must be [${cOut}] (C_out of weight ${formatShape(weight.shape)})`,
    );
  }
  const stride = pair(host, "stride", options.stride, 1, 1);
  const padding = pair(host, "padding", options.padding, 0, 0);
  const ph = h + 2 * padding[0];
  const pw = w + 2 * padding[1];
  if (kh < 1 || kw < 1 || kh > ph || kw > pw) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${all}: a ${kh}×${kw} kernel does not fit the padded input ${ph}×${pw}`,
    );
  }
  const oh = Math.floor((ph - kh) / stride[0]) + 1;
  const ow = Math.floor((pw - kw) / stride[1]) + 1;
  return run(
    host,
    host.alloc([batch, cOut, oh, ow], x.dtype, x.name),
    k.run,
    x,
    weight,
    bias,
    stride,
    padding,
  );
}

/** The section list of a one-section RoPE (shared: nothing to allocate per call). */
const NO_SECTIONS: readonly number[] = Object.freeze([]);

/**
 * Rotary position embedding (Backend.rope). x: [batch, seq_len, num_heads, head_dim]; positions: i32
 * [seq_len], or [axes, seq_len] with `sections`.
 * @throws TpError E_SHAPE when x is not rank 4 or positions do not fit; E_ARG for a bad mode, theta,
 *   ropeDims (even, ≤ head_dim), sections (at most 64, summing to ropeDims / 2) or freqScale; E_STATE;
 *   E_UNSUPPORTED (a dtype of x the kernel lacks, positions not i32)
 */
export function rope(host: OpHost, x: Tensor, positions: Tensor, options: RopeOptions): Tensor {
  const op = "rope";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  checkIndex(host, op, k, positions, "positions");
  if (x.rank !== 4) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `x ${formatShape(x.shape)} must be [batch, seq_len, num_heads, head_dim]`,
    );
  }
  const seq = x.shape[1] as number;
  const headDim = x.shape[3] as number;
  const mode = options?.mode;
  if (mode !== "neox" && mode !== "interleaved") {
    throw opError(
      "E_ARG",
      host.name,
      op,
      `mode must be "neox" or "interleaved", got ${JSON.stringify(mode)}`,
    );
  }
  const theta = finiteOption(host.name, op, "theta", options.theta);
  if (theta <= 0) throw opError("E_ARG", host.name, op, `theta must be positive, got ${theta}`);
  const freqScale = finiteOption(host.name, op, "freqScale", options.freqScale ?? 1);
  const ropeDims = integerOption(host.name, op, "ropeDims", options.ropeDims ?? headDim, 0, headDim);
  if (ropeDims % 2 !== 0) {
    throw opError("E_ARG", host.name, op, `ropeDims must be even, got ${ropeDims} (head_dim ${headDim})`);
  }
  const given = options.sections;
  const sections: readonly number[] = given === undefined || given.length === 0 ? NO_SECTIONS : [...given];
  if (sections.length > 0) {
    if (sections.length > 64)
      throw opError("E_ARG", host.name, op, `at most 64 sections, got ${sections.length}`);
    let total = 0;
    for (let i = 0; i < sections.length; i++)
      total += integerOption(host.name, op, `sections[${i}]`, sections[i], 0);
    if (total !== ropeDims / 2) {
      throw opError(
        "E_ARG",
        host.name,
        op,
        `sections [${sections.join(", ")}] sum to ${total} pairs; ropeDims/2 is ${ropeDims / 2}`,
      );
    }
  }
  const axes = sections.length; // positions: [seq] for one section, else [axes, seq]
  const fits =
    axes === 0
      ? positions.rank === 1 && positions.shape[0] === seq
      : positions.rank === 2 && positions.shape[0] === axes && positions.shape[1] === seq;
  if (!fits) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `${shown(positions, "positions")} must be ${formatShape(axes > 0 ? [axes, seq] : [seq])} for x ${formatShape(x.shape)}` +
        (axes > 0 ? ` and ${axes} sections` : ""),
    );
  }
  return run(
    host,
    host.alloc(x.shape, x.dtype, x.name),
    k.run,
    x,
    positions,
    mode,
    theta,
    ropeDims,
    freqScale,
    sections,
  );
}
