/**
 * Reference scaled dot-product attention in f64, one query at a time (O(seq) memory is not the point
 * here). Masks follow @tp/tensor's AttentionOptions: query i sits at position p = qOffset + i; key j
 * is visible when j < fullPrefix, or without causal, or when j ≤ p and (no window, or j > p − window).
 * softcap: scores ← c·tanh(scores / c). A query that sees no key gets zeros.
 * Source: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al. 2023 (query head h uses kv head
 * ⌊h / (heads / kv_heads)⌋); softcap: Gemma 2.
 */
import type { HostTensor } from "../host.ts";

/** Options of {@link attentionRef} (as @tp/tensor AttentionOptions). */
export interface AttentionRefOptions {
  readonly scale?: number;
  readonly causal?: boolean;
  readonly qOffset?: number;
  readonly window?: number;
  readonly fullPrefix?: number;
  readonly softcap?: number;
}

/** q [b, h, sq, d], k [b, hkv, skv, d], v [b, hkv, skv, dv] → [b, h, sq, dv]. */
export function attentionRef(
  q: HostTensor,
  k: HostTensor,
  v: HostTensor,
  o: AttentionRefOptions = {},
): Float64Array {
  const [batch, heads, sq, d] = q.shape as [number, number, number, number];
  const [, kvHeads, skv] = k.shape as [number, number, number, number];
  const dv = v.shape[3] as number;
  const scale = o.scale ?? 1 / Math.sqrt(d);
  const qOffset = o.qOffset ?? skv - sq;
  const group = heads / kvHeads;
  const out = new Float64Array(batch * heads * sq * dv);
  const scores = new Float64Array(skv);
  for (let b = 0; b < batch; b++)
    for (let h = 0; h < heads; h++) {
      const kh = Math.floor(h / group);
      for (let i = 0; i < sq; i++) {
        const p = qOffset + i;
        const qBase = ((b * heads + h) * sq + i) * d;
        let m = Number.NEGATIVE_INFINITY;
        for (let j = 0; j < skv; j++) {
          const visible =
            j < (o.fullPrefix ?? 0) || !o.causal || (j <= p && (o.window === undefined || j > p - o.window));
          if (!visible) {
            scores[j] = Number.NEGATIVE_INFINITY;
            continue;
          }
          const kBase = ((b * kvHeads + kh) * skv + j) * d;
          let s = 0;
          for (let t = 0; t < d; t++) s += (q.data[qBase + t] as number) * (k.data[kBase + t] as number);
          s *= scale;
          if (o.softcap !== undefined) s = o.softcap * Math.tanh(s / o.softcap);
          scores[j] = s;
          m = Math.max(m, s);
        }
        const oBase = ((b * heads + h) * sq + i) * dv;
        if (m === Number.NEGATIVE_INFINITY) continue; // no visible key: zeros
        let sum = 0;
        for (let j = 0; j < skv; j++) {
          const e = Math.exp((scores[j] as number) - m);
          scores[j] = e;
          sum += e;
        }
        for (let j = 0; j < skv; j++) {
          const w = (scores[j] as number) / sum;
          if (w === 0) continue;
          const vBase = ((b * kvHeads + kh) * skv + j) * dv;
          for (let c = 0; c < dv; c++)
            out[oBase + c] = (out[oBase + c] as number) + w * (v.data[vBase + c] as number);
        }
      }
    }
  return out;
}
