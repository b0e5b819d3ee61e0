/**
 * rope of the vulkan backend (shaders/rope.comp). The host computes each pair's frequency in f64 —
 * f = freqScale · theta^(−k/n) for pair k of a section of n pairs (one section of ropeDims/2 pairs
 * without `sections`: theta^(−2k/ropeDims), HF `inv_freq`) — and hands the kernel f / 2π as a 64-bit
 * binary fraction of a turn, so angles of any size are reduced exactly on the device (see the shader).
 * Source: RoFormer (arXiv:2104.09864) §3.4; @tp/tensor RopeOptions.
 */
import { formatShape, type RopeOptions, type Tensor } from "@tp/tensor";
import {
  argError,
  checkTensors,
  dispatch1d,
  finite,
  Push,
  produce,
  scoped,
  shapeError,
  type VkOpHost,
} from "./common.ts";
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
 * Rotary position embedding. x: [batch, seq_len, num_heads, head_dim] f32 (any view); positions:
 * i32 [seq_len], or [axes, seq_len] with `sections` (sizes in pairs, summing to ropeDims / 2).
 * @throws TpError E_SHAPE for mismatched shapes, odd ropeDims or sections that do not add up; E_ARG
 *   for a bad mode, theta or freqScale
 */
export function rope(host: VkOpHost, x: Tensor, positions: Tensor, options: RopeOptions): Tensor {
  const op = "rope";
  checkTensors(host, op, ["f32"], { x });
  checkTensors(host, op, ["i32"], { positions });
  if (x.rank !== 4)
    throw shapeError(op, `x ${formatShape(x.shape)} is not [batch, seq_len, num_heads, head_dim]`);
  const [, seq, heads, hd] = x.shape as [number, number, number, number];
  const mode = options?.mode;
  if (mode !== "neox" && mode !== "interleaved") {
    throw argError(op, `mode must be "neox" or "interleaved", got ${JSON.stringify(mode)}`);
  }
  const theta = finite(op, "theta", options.theta);
  const fs = finite(op, "freqScale", options.freqScale ?? 1);
  const rd = options.ropeDims ?? hd;
  if (!Number.isInteger(rd) || rd < 0 || rd > hd || rd % 2 !== 0) {
    throw shapeError(op, `ropeDims ${rd} must be even and at most head_dim ${hd}`);
  }
  const half = rd / 2;
  const sections = options.sections && options.sections.length > 0 ? [...options.sections] : [half];
  if (sections.some((n) => !Number.isInteger(n) || n < 0) || sections.reduce((a, b) => a + b, 0) !== half) {
    throw shapeError(op, `sections [${sections}] must add up to ropeDims / 2 = ${half} pairs`);
  }
  const axes = options.sections && options.sections.length > 0 ? sections.length : 0;
  const posShape = axes > 0 ? [axes, seq] : [seq];
  if (positions.rank !== posShape.length || positions.shape.some((d, i) => d !== posShape[i])) {
    throw shapeError(op, `positions ${formatShape(positions.shape)} should be ${formatShape(posShape)}`);
  }
  return scoped(host, op, (s) =>
    produce(host, x.shape, "f32", x.name, (out) => {
      if (x.numel === 0) return;
      const src = contiguous(host, s, x);
      const pos = contiguous(host, s, positions);
      const table = s.keep(
        host.upload(
          ropeTable(Math.max(half, 1), theta, fs, sections),
          [3 * Math.max(half, 1)],
          "u32",
          "rope table",
        ),
      );
      const a = host.bind(src, op);
      const p = host.bind(pos, op);
      const t = host.bind(table, op);
      const y = host.bind(out, op);
      const push = new Push(36)
        .u32(x.numel)
        .u32(seq)
        .u32(heads)
        .u32(hd)
        .u32(rd)
        .u32(mode === "neox" ? 1 : 0)
        .u32(a.offset)
        .u32(p.offset)
        .u32(t.offset);
      dispatch1d(host, op, "rope", [], [y.binding, a.binding, p.binding, t.binding], push, x.numel);
    }),
  );
}
