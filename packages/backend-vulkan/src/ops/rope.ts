/**
 * rope of the vulkan backend (shaders/rope.comp). The host computes each pair's frequency in f64 —
 * f = freqScale · theta^(−k/n) for pair k of a section of n pairs (one section of ropeDims/2 pairs
 * without `sections`: theta^(−2k/ropeDims), HF `inv_freq`) — and hands the kernel f / 2π as a 64-bit
 * binary fraction of a turn, so angles of any size are reduced exactly on the device (see the shader).
 * Kernel-table entry: arguments arrive checked (@tp/tensor's op front-end).
 * Source: RoFormer (arXiv:2104.09864) §3.4; @tp/tensor RopeOptions.
 */
import type { KernelSignatures } from "@tp/tensor";
import { dispatch1d, Push, type VkKernel } from "./common.ts";
import { contiguous } from "./layout.ts";

const TWO_32 = 2 ** 32;

/**
 * The kernel's table: per pair, the low and high words of f / 2π mod 1 as a 64-bit fraction, and the
 * pair's axis (row of positions).
 */
export function ropeTable(
  half: number,
  theta: number,
  freqScale: number,
  sections: readonly number[],
): Uint32Array {
  const table = new Uint32Array(3 * half);
  let p = 0;
  sections.forEach((n, axis) => {
    for (let k = 0; k < n; k++, p++) {
      const turns = (freqScale * theta ** (-k / n)) / (2 * Math.PI);
      const frac = turns - Math.floor(turns);
      const hi = Math.floor(frac * TWO_32);
      const lo = Math.floor((frac * TWO_32 - hi) * TWO_32);
      table[3 * p] = lo;
      table[3 * p + 1] = hi;
      table[3 * p + 2] = axis;
    }
  });
  return table;
}

/**
 * Rotary position embedding ({@link KernelSignatures.rope}): the first ropeDims of each head rotate, the
 * rest are copied.
 */
export const rope: VkKernel<"rope"> = (
  host,
  out,
  x,
  positions,
  mode,
  theta,
  ropeDims,
  freqScale,
  sections,
) => {
  const op = "rope";
  if (x.numel === 0) return;
  const [, seq, heads, hd] = x.shape as [number, number, number, number];
  const half = ropeDims / 2;
  const pairs = Math.max(half, 1);
  host.scope(() => {
    const table = host.upload(
      ropeTable(pairs, theta, freqScale, sections.length > 0 ? sections : [half]),
      [3 * pairs],
      "u32",
      "rope table",
    );
    const a = host.bind(contiguous(host, op, x), op);
    const p = host.bind(contiguous(host, op, positions), op);
    const t = host.bind(table, op);
    const y = host.bind(out, op);
    const push = new Push(36)
      .u32(x.numel)
      .u32(seq)
      .u32(heads)
      .u32(hd)
      .u32(ropeDims)
      .u32(mode === "neox" ? 1 : 0)
      .u32(a.offset)
      .u32(p.offset)
      .u32(t.offset);
    dispatch1d(host, op, "rope", [], [y.binding, a.binding, p.binding, t.binding], push, x.numel);
  });
};
