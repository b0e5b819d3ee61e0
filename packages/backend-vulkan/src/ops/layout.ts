/**
 * Data movement on the vulkan backend, all through one strided copy kernel (shaders/copy.comp):
 * copy (any view → contiguous), set (any view into a view), slice (a view in), concat (views of the
 * output out), upsample_nearest2d (a broadcast view in), and contiguous copies of strided inputs for
 * the kernels that take contiguous rows. Plus cast (shaders/cast.comp), with @tp/tensor's rounding
 * rules. Kernel-table entries: arguments arrive checked (@tp/tensor's op front-end).
 */
import { type DTypeName, dtypeBytes, formatShape, type Tensor, TpError } from "@tp/tensor";
import { dispatch1d, mergeDims, Push, splitForBindings, unsupported, type VkOpHost } from "./common.ts";

/** Dimensions the copy kernel walks (its push constants hold 8). */
const COPY_RANK = 8;

/**
 * Copy the elements of view `src` into view `dst` (same shape and dtype), recorded on the device.
 * @throws TpError E_UNSUPPORTED for more than 8 dimensions that cannot be merged
 */
export function copyInto(host: VkOpHost, op: string, src: Tensor, dst: Tensor): void {
  const n = src.numel;
  if (n === 0) return;
  const m = mergeDims(src.shape, [src.strides, dst.strides]);
  if (m.shape.length > COPY_RANK) {
    throw unsupported(
      op,
      `a copy of ${formatShape(src.shape)} walks ${m.shape.length} dimensions, at most ${COPY_RANK}`,
    );
  }
  // Past maxStorageBufferRange the copy is split along the first (merged) dimension.
  const operands = [
    { t: src, strides: m.strides[0] as number[], offset: src.layout.offset },
    { t: dst, strides: m.strides[1] as number[], offset: dst.layout.offset },
  ];
  for (const [sv, dv] of splitForBindings(host, op, m.shape, operands)) {
    const s = host.bind(sv as Tensor, op);
    const d = host.bind(dv as Tensor, op);
    const count = (sv as Tensor).numel;
    const push = new Push(112)
      .u32(count)
      .u32(m.shape.length)
      .u32s((sv as Tensor).shape, COPY_RANK)
      .u32(s.offset)
      .u32s(m.strides[0] as number[], COPY_RANK)
      .u32(d.offset)
      .u32s(m.strides[1] as number[], COPY_RANK);
    dispatch1d(host, op, "copy", [dtypeBytes(src.dtype)], [d.binding, s.binding], push, count);
  }
}

/**
 * `t` when contiguous, else a contiguous copy allocated in the current scope (the caller runs inside
 * `host.scope`, which frees it when the kernel returns).
 */
export function contiguous(host: VkOpHost, op: string, t: Tensor): Tensor {
  if (t.isContiguous) return t;
  const c = host.alloc(t.shape, t.dtype, `${t.name ?? "tensor"} (contiguous copy for ${op})`);
  copyInto(host, op, t, c);
  return c;
}

/** copy: out ← x (any view), out contiguous of x's shape and dtype. */
export function copy(host: VkOpHost, out: Tensor, x: Tensor): void {
  copyInto(host, "copy", x, out);
}

/** set: the view dst ← src (any dtype, same shape; checked by @tp/tensor checkSetArgs), in place. */
export function set(host: VkOpHost, dst: Tensor, src: Tensor): void {
  copyInto(host, "set", src, dst);
}

/** slice: out ← view (x.slice(dim, start, end)). */
export function slice(host: VkOpHost, out: Tensor, view: Tensor): void {
  copyInto(host, "slice", view, out);
}

/** concat: each input copied into its slice of out along `dim`. */
export function concat(host: VkOpHost, out: Tensor, inputs: readonly Tensor[], dim: number): void {
  let at = 0;
  for (const t of inputs) {
    const size = t.shape[dim] as number;
    if (size > 0) copyInto(host, "concat", t, out.slice(dim, at, at + size));
    at += size;
  }
}

/** Nearest-neighbour upsampling by an integer factor on the last two dimensions: x [..., H, W] → out [..., H·f, W·f]. */
export function upsampleNearest2d(host: VkOpHost, out: Tensor, x: Tensor, factor: number): void {
  const lead = x.shape.slice(0, -2);
  const [h, w] = x.shape.slice(-2) as [number, number];
  const [sh, sw] = x.strides.slice(-2) as [number, number];
  // out[..., i·f + a, j·f + b] = x[..., i, j]: a view [..., H, f, W, f] with strides 0 on a and b.
  const src = x.view({
    shape: [...lead, h, factor, w, factor],
    strides: [...x.strides.slice(0, -2), sh, 0, sw, 0],
    offset: x.layout.offset,
  });
  copyInto(host, "upsample_nearest2d", src, out.reshape(...lead, h, factor, w, factor));
}

/** Conversions of shaders/cast.comp (its MODE), by "from→to". */
const CAST_MODES: Readonly<Record<string, number>> = {
  "f32→f16": 0,
  "f32→bf16": 1,
  "f32→f8_e4m3fn": 2,
  "f32→f8_e5m2": 3,
  "f16→f32": 4,
  "bf16→f32": 5,
  "f8_e4m3fn→f32": 6,
  "f8_e5m2→f32": 7,
};

/** The dtypes cast takes (from and to). */
export const CAST_DTYPES: readonly DTypeName[] = ["f32", "f16", "bf16", "f8_e4m3fn", "f8_e5m2"];

/**
 * Elementwise dtype conversion x → out (out's dtype): f32 ⇄ f16 / bf16 / f8_e4m3fn / f8_e5m2, or a
 * copy to the same dtype, bit for bit as @tp/tensor convert.ts.
 * @throws TpError E_UNSUPPORTED for another pair (f16 → bf16, ...), naming both dtypes
 */
export function cast(host: VkOpHost, out: Tensor, x: Tensor, saturate: boolean): void {
  const op = "cast";
  if (x.dtype === out.dtype) {
    copyInto(host, op, x, out);
    return;
  }
  const mode = CAST_MODES[`${x.dtype}→${out.dtype}`];
  if (mode === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op cast on backend vulkan: no conversion ${x.dtype} → ${out.dtype} (f32 ⇄ f16, bf16, f8_e4m3fn, f8_e5m2)`,
    );
  }
  const n = x.numel;
  if (n === 0) return;
  host.scope(() => {
    const a = host.bind(contiguous(host, op, x), op);
    const y = host.bind(out, op);
    const push = new Push(12)
      .u32(n)
      .u32(saturate ? 1 : 0)
      .u32(a.offset);
    const perWord = mode < 2 ? 2 : mode < 4 ? 4 : 1;
    dispatch1d(host, op, "cast", [mode], [y.binding, a.binding], push, Math.ceil(n / perWord));
  });
}
