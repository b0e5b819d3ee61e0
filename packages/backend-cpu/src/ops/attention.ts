/**
 * Scaled dot-product attention of the cpu backend: GQA, masks none / causal / causal with a full
 * prefix / sliding window, query offset, logit softcap, scale. q [batch, num_heads, Sq, head_dim],
 * k [batch, num_kv_heads, Skv, head_dim], v [batch, num_kv_heads, Skv, head_dim_v], all f32. Strided
 * views are read in place through their strides (a KV cache [kv_heads, capacity, head_dim] sliced to
 * [1, kv_heads, len, head_dim], or a token-major one sliced and permuted, costs no copy per token);
 * only a view whose last dimension is not unit-stride is copied first. The output is a new contiguous [batch, num_heads, Sq, head_dim_v]
 * tensor (for Sq = 1 its permute to [batch, Sq, num_heads, head_dim_v] is contiguous too; the native
 * entry point can also write any output strides). Kernel: native/cpu/attention.c (tiled online
 * softmax, O(tile) memory; decoding splits the keys over threads when there are few kv heads).
 *
 * Key j is visible to query i (at position p = qOffset + i) when j < fullPrefix, or when there is no
 * causal mask, or when j ≤ p and (no window, or j > p − window). A query that sees no key returns
 * zeros. `window` needs `causal`.
 * Source: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al. 2023; softcap: Gemma 2 (Team et al. 2024).
 */
import {
  type AttentionOptions,
  attentionScalars,
  contiguousStrides,
  formatShape,
  type Tensor,
} from "@tp/tensor";
import { argError, type CpuOpHost, checkTensors, integer, produce, scoped, shapeError } from "./common.ts";
import { type AttentionView, attentionF32 } from "./native.ts";

/**
 * softmax(q·kᵀ·scale + mask)·v per head (see the module comment for the mask rules) →
 * [batch, num_heads, Sq, head_dim_v] f32. `options` null or undefined: the defaults.
 * @throws TpError E_SHAPE naming q, k, v when ranks, batch, head_dim, Skv or the head grouping do not
 *   fit, or head_dim is 0 while the output is not empty; E_ARG naming the option for a bad option
 *   (scale and softcap must be finite in f32; softcap, when given, positive in f32); E_STATE;
 *   E_UNSUPPORTED (not f32)
 */
export function attention(
  host: CpuOpHost,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  opts?: AttentionOptions | null,
): Tensor {
  const op = "attention";
  const options = opts ?? {};
  checkTensors(host, op, ["f32"], { q, k, v });
  // the shapes in messages, spelled out only when one is thrown
  const all = () => `q ${formatShape(q.shape)}, k ${formatShape(k.shape)}, v ${formatShape(v.shape)}`;
  if (q.rank !== 4 || k.rank !== 4 || v.rank !== 4) {
    throw shapeError(op, `${all()}: each must be [batch, heads, seq_len, head_dim]`);
  }
  const [batch, heads, sq, d] = q.shape as [number, number, number, number];
  const [kb, kvHeads, skv, kd] = k.shape as [number, number, number, number];
  const [vb, vh, vs, dv] = v.shape as [number, number, number, number];
  if (kb !== batch || vb !== batch) throw shapeError(op, `${all()}: batch sizes differ`);
  if (kd !== d) throw shapeError(op, `${all()}: q and k head_dim differ (${d} vs ${kd})`);
  if (vh !== kvHeads || vs !== skv) throw shapeError(op, `${all()}: k and v differ in heads or seq_len`);
  if (kvHeads === 0 ? heads !== 0 : heads % kvHeads !== 0) {
    throw shapeError(op, `${all()}: ${heads} query heads are not a multiple of ${kvHeads} kv heads`);
  }
  const { scale, softcap } = attentionScalars("cpu", op, options, d);
  const causal = options.causal ?? false;
  if (typeof causal !== "boolean") throw argError(op, `causal must be a boolean, got ${String(causal)}`);
  const qOffset = integer(op, "qOffset", options.qOffset ?? skv - sq, -(2 ** 52), 2 ** 52);
  const window = options.window === undefined ? 0 : integer(op, "window", options.window, 1);
  if (window > 0 && !causal)
    throw argError(op, "window needs causal: true (a sliding window limits a causal mask)");
  const fullPrefix = options.fullPrefix === undefined ? 0 : integer(op, "fullPrefix", options.fullPrefix, 0);
  if (batch * heads * sq * dv === 0) return host.alloc([batch, heads, sq, dv], "f32", q.name);
  if (d === 0) throw shapeError(op, `${all()}: head_dim is 0, so q·kᵀ has no terms; it must be at least 1`);
  return scoped(host, op, (s) => {
    // in place when the last dimension is unit-stride (or of size ≤ 1); else a contiguous copy
    const view = (t: Tensor): AttentionView =>
      (t.shape[3] as number) <= 1 || t.strides[3] === 1
        ? { region: host.viewRegion(t), strides: [...t.strides.slice(0, 3), 1] }
        : { region: s.contiguous(t), strides: contiguousStrides(t.shape) };
    const qv = view(q);
    const kv = view(k);
    const vv = view(v);
    const outStrides = contiguousStrides([batch, heads, sq, dv]);
    return produce(host, op, [batch, heads, sq, dv], "f32", q.name, (out) =>
      attentionF32(
        host.ctx,
        qv,
        kv,
        vv,
        { region: out, strides: outStrides },
        {
          batch,
          heads,
          kvHeads,
          sq,
          skv,
          headDim: d,
          headDimV: dv,
          scale,
          qOffset,
          causal,
          window,
          fullPrefix,
          softcap,
        },
      ),
    );
  });
}
