/**
 * Reference RoPE in f64 (RoFormer, arXiv:2104.09864 §3.4), with the conventions of @tp/tensor's
 * RopeOptions: x [batch, seq_len, num_heads, head_dim]; the ropeDims/2 pairs are NeoX halves
 * (i, i + ropeDims/2) or interleaved (2i, 2i + 1); with `sections` the pairs form consecutive
 * sections, section a (of n pairs) on positions row a, pair k of it turning by
 * pos · freqScale · theta^(−k/n) — each axis its own frequency table, as Flux / Krea 2
 * (krea2.md §3.5) and Qwen-Image (qwen-image.md §5.5); without sections one section of all pairs
 * (theta^(−2k/ropeDims), HF `inv_freq`).
 */
import type { HostTensor } from "../host.ts";

/** Options of {@link ropeRef} (as @tp/tensor RopeOptions). */
export interface RopeRefOptions {
  readonly mode: "neox" | "interleaved";
  readonly theta: number;
  readonly ropeDims?: number;
  readonly sections?: readonly number[];
  readonly freqScale?: number;
}

/** Rotate x; positions are [seq] or [axes, seq] (row-major). */
export function ropeRef(x: HostTensor, positions: ArrayLike<number>, o: RopeRefOptions): Float64Array {
  const [batch, seq, heads, hd] = x.shape as [number, number, number, number];
  const rd = o.ropeDims ?? hd;
  const half = rd / 2;
  const sections = o.sections && o.sections.length > 0 ? o.sections : [half];
  const fs = o.freqScale ?? 1;
  // pair → (axis, angle per unit position)
  const axis: number[] = [];
  const freq: number[] = [];
  sections.forEach((n, a) => {
    for (let k = 0; k < n; k++) {
      axis.push(a);
      freq.push(o.theta ** (-k / n));
    }
  });
  const out = Float64Array.from(x.data as ArrayLike<number>);
  for (let b = 0; b < batch; b++)
    for (let s = 0; s < seq; s++)
      for (let h = 0; h < heads; h++) {
        const base = ((b * seq + s) * heads + h) * hd;
        for (let p = 0; p < half; p++) {
          const angle = (positions[(axis[p] as number) * seq + s] as number) * fs * (freq[p] as number);
          const c = Math.cos(angle);
          const sn = Math.sin(angle);
          const [i0, i1] = o.mode === "neox" ? [p, p + half] : [2 * p, 2 * p + 1];
          const x0 = x.data[base + i0] as number;
          const x1 = x.data[base + i1] as number;
          out[base + i0] = x0 * c - x1 * sn;
          out[base + i1] = x0 * sn + x1 * c;
        }
      }
  return out;
}
