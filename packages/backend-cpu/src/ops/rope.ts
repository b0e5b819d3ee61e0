/**
 * Rotary position embedding of the cpu backend: x [batch, seq_len, num_heads, head_dim] f32,
 * positions i32 [seq_len] (or [axes, seq_len] with `sections`). NeoX halves or interleaved pairs,
 * partial rotation (`ropeDims`), multi-axis sections (each section a frequency table of its own,
 * theta^(−k/n) for pair k of n — the per-axis tables of Flux, Krea 2 and Qwen-Image), linear
 * position scaling. Kernel: native/cpu/rope.c (angles in f64, rounded to f32).
 * Source: RoFormer (arXiv:2104.09864) §3.4; krea2.md §3.5; llm.md §3.0.
 */
import { formatShape, type RopeOptions, type Tensor } from "@tp/tensor";
import {
  argError,
  type CpuOpHost,
  checkTensors,
  finite,
  integer,
  produce,
  scoped,
  shapeError,
  shown,
} from "./common.ts";
import { ropeF32 } from "./native.ts";

/** The section list of a one-section RoPE (shared: nothing to allocate per call). */
const NO_SECTIONS: readonly number[] = Object.freeze([]);

/**
 * Rotate x [batch, seq_len, num_heads, head_dim] (f32) by RoPE at i32 `positions` ([seq_len], or
 * [axes, seq_len] with `options.sections`) → a new tensor of x's shape.
 * @throws TpError E_SHAPE when x is not rank 4 or positions do not fit; E_ARG for a bad mode,
 *   theta, ropeDims, sections or freqScale; E_STATE; E_UNSUPPORTED (x not f32, positions not i32)
 */
export function rope(host: CpuOpHost, x: Tensor, positions: Tensor, options: RopeOptions): Tensor {
  const op = "rope";
  checkTensors(host, op, ["f32"], { x });
  checkTensors(host, op, ["i32"], { positions });
  if (x.rank !== 4)
    throw shapeError(op, `x ${formatShape(x.shape)} must be [batch, seq_len, num_heads, head_dim]`);
  const [batch, seq, heads, headDim] = x.shape as [number, number, number, number];
  const mode = options?.mode;
  if (mode !== "neox" && mode !== "interleaved") {
    throw argError(op, `mode must be "neox" or "interleaved", got ${JSON.stringify(mode)}`);
  }
  const theta = finite(op, "theta", options.theta);
  if (theta <= 0) throw argError(op, `theta must be positive, got ${theta}`);
  const freqScale = finite(op, "freqScale", options.freqScale ?? 1);
  const ropeDims = integer(op, "ropeDims", options.ropeDims ?? headDim, 0, headDim);
  if (ropeDims % 2 !== 0) throw argError(op, `ropeDims must be even, got ${ropeDims} (head_dim ${headDim})`);
  const sections: readonly number[] =
    options.sections === undefined || options.sections.length === 0 ? NO_SECTIONS : [...options.sections];
  if (sections.length > 0) {
    if (sections.length > 64) throw argError(op, `at most 64 sections, got ${sections.length}`);
    let total = 0;
    for (let i = 0; i < sections.length; i++) total += integer(op, `sections[${i}]`, sections[i], 0);
    if (total !== ropeDims / 2) {
      throw argError(
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
    throw shapeError(
      op,
      `${shown(positions, "positions")} must be ${formatShape(axes > 0 ? [axes, seq] : [seq])} for x ${formatShape(x.shape)}` +
        (axes > 0 ? ` and ${axes} sections` : ""),
    );
  }
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const pr = s.contiguous(positions);
    return produce(host, op, x.shape, "f32", x.name, (out) =>
      ropeF32(host.ctx, xr, pr, out, {
        batch,
        seq,
        heads,
        headDim,
        sections,
        ropeDims,
        mode: mode === "neox" ? 0 : 1,
        theta,
        freqScale,
      }),
    );
  });
}
