/**
 * The rotary position embedding kernel of the cpu backend: x [batch, seq_len, num_heads, head_dim] f32,
 * positions i32 [seq_len] (or [axes, seq_len] with sections). NeoX halves or interleaved pairs,
 * partial rotation (ropeDims), multi-axis sections (each section a frequency table of its own,
 * theta^(−k/n) for pair k of n — the per-axis tables of Flux, Krea 2 and Qwen-Image), linear position
 * scaling. Arguments are checked by @tp/tensor's front-end; kernel: native/cpu/rope.c (angles in f64,
 * rounded to f32). Source: RoFormer (arXiv:2104.09864) §3.4; krea2.md §3.5; llm.md §3.0.
 */
import type { KernelSignatures, KernelTable } from "@tp/tensor";
import { type CpuOpHost, onDense, region, strided } from "./common.ts";
import { ropeF32 } from "./native.ts";

/** The kernel-table entry of rope (f32 x; positions are i32 by the op contract). */
export function ropeKernels(host: CpuOpHost): Pick<KernelTable, "rope"> {
  const rope: KernelSignatures["rope"] = (out, x, positions, mode, theta, ropeDims, freqScale, sections) => {
    const op = "rope";
    if (strided(x, positions)) {
      onDense(host, op, x, positions, null, (x, p) =>
        rope(out, x, p, mode, theta, ropeDims, freqScale, sections),
      );
      return;
    }
    const [batch, seq, heads, headDim] = x.shape as [number, number, number, number];
    ropeF32(host.ctx, region(host, x, op), region(host, positions, op), region(host, out, op), {
      batch,
      seq,
      heads,
      headDim,
      sections,
      ropeDims,
      mode: mode === "neox" ? 0 : 1,
      theta,
      freqScale,
    });
  };
  return { rope: { dtypes: ["f32"], run: rope } };
}
