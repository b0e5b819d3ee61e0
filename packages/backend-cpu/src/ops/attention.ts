/**
 * The attention kernel of the cpu backend: GQA, masks none / causal / causal with a full prefix /
 * sliding window, query offset, logit softcap, scale, on f32. Strided views are read in place through
 * their strides (a KV cache [kv_heads, capacity, head_dim] sliced to [1, kv_heads, len, head_dim], or a
 * token-major one sliced and permuted, costs no copy per token); only a view whose last dimension is
 * not unit-stride is copied first. Arguments (shapes, options) are checked by @tp/tensor's front-end.
 * Kernel: native/cpu/attention.c (tiled online softmax, O(tile) memory; decoding splits the keys over
 * threads when there are few kv heads).
 *
 * Key j is visible to query i (at position p = qOffset + i) when j < fullPrefix, or when there is no
 * causal mask, or when j ≤ p and (no window, or j > p − window). A query that sees no key returns zeros.
 * Source: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al. 2023; softcap: Gemma 2 (Team et al. 2024).
 */
import { type AttentionParams, contiguousStrides, type KernelTable, type Tensor } from "@tp/tensor";
import { type CpuOpHost, dense } from "./common.ts";
import { type AttentionView, attentionF32 } from "./native.ts";

/** True when the kernel reads `t` in place: its last dimension is unit-stride (or of size ≤ 1). */
function inPlace(t: Tensor): boolean {
  return (t.shape[3] as number) <= 1 || t.strides[3] === 1;
}

/** The strided view of `t` for the kernel (its last stride passed as 1). */
function view(host: CpuOpHost, t: Tensor): AttentionView {
  const s = t.strides;
  return { region: host.viewRegion(t), strides: [s[0] as number, s[1] as number, s[2] as number, 1] };
}

function attention(host: CpuOpHost, out: Tensor, q: Tensor, k: Tensor, v: Tensor, p: AttentionParams): void {
  const op = "attention";
  if (!inPlace(q) || !inPlace(k) || !inPlace(v)) {
    host.scope(() =>
      attention(
        host,
        out,
        inPlace(q) ? q : dense(host, q, op),
        inPlace(k) ? k : dense(host, k, op),
        inPlace(v) ? v : dense(host, v, op),
        p,
      ),
    );
    return;
  }
  const o = { region: host.viewRegion(out), strides: contiguousStrides(out.shape) };
  attentionF32(host.ctx, view(host, q), view(host, k), view(host, v), o, p);
}

/** The kernel-table entry of attention (f32). */
export function attentionKernels(host: CpuOpHost): Pick<KernelTable, "attention"> {
  return { attention: { dtypes: ["f32"], run: (out, q, k, v, p) => attention(host, out, q, k, v, p) } };
}
