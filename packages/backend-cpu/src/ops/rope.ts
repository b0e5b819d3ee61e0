/**
 * The rotary position embedding kernel of the cpu backend: x [batch, seq_len, num_heads, head_dim] f32,
 * positions i32 [seq_len] (or [axes, seq_len] with sections). NeoX halves or interleaved pairs,
 * partial rotation (ropeDims), multi-axis sections (each section a frequency table of its own,
 * theta^(−k/n) for pair k of n — the per-axis tables of Flux, Krea 2 and Qwen-Image), linear position
 * scaling. Arguments are checked by @tp/tensor's front-end; kernel: native/cpu/rope.c (angles in f64,
 * rounded to f32). Source: RoFormer (arXiv:2104.09864) §3.4; krea2.md §3.5; llm.md §3.0.
 */
import type { KernelTable, Tensor } from "@tp/tensor";
import { type CpuOpHost, dense, region, strided } from "./common.ts";
import { ropeF32 } from "./native.ts";

function rope(
  host: CpuOpHost,
  out: Tensor,
  x: Tensor,
  positions: Tensor,
  mode: "neox" | "interleaved",
  theta: number,
  ropeDims: number,
  freqScale: number,
  sections: readonly number[],
): void {
  const op = "rope";
  if (strided(x, positions)) {
    host.scope(() =>
      rope(
        host,
        out,
        dense(host, x, op),
        dense(host, positions, op),
        mode,
        theta,
        ropeDims,
        freqScale,
        sections,
      ),
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
}

/** The kernel-table entry of rope (f32 x; positions are i32 by the op contract). */
export function ropeKernels(host: CpuOpHost): Pick<KernelTable, "rope"> {
  return {
    rope: {
      dtypes: ["f32"],
      run: (out, x, positions, mode, theta, ropeDims, freqScale, sections) =>
        rope(host, out, x, positions, mode, theta, ropeDims, freqScale, sections),
    },
  };
}
