/**
 * Data movement on the vulkan backend, all through one strided copy kernel (shaders/copy.comp):
 * copy (any view → contiguous), slice (a view in), concat (views of the output out),
 * upsample_nearest2d (a broadcast view in), and contiguous copies of strided inputs for the kernels
 * that take contiguous rows. Plus cast (shaders/cast.comp), with @tp/tensor's rounding rules.
 */
import {
  checkSetArgs,
  DTYPE_NAMES,
  type DTypeName,
  dtypeBytes,
  formatShape,
  normalizeDim,
  type Tensor,
  TpError,
} from "@tp/tensor";
import {
  checkTensors,
  dispatch1d,
  integer,
  mergeDims,
  type OpScope,
  Push,
  produce,
  scoped,
  shapeError,
  splitForBindings,
  unsupported,
  type VkOpHost,
} from "./common.ts";

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

/** `t` when contiguous, else a contiguous scratch copy kept by `scope`. */
export function contiguous(host: VkOpHost, scope: OpScope, t: Tensor): Tensor {
  if (t.isContiguous) return t;
  const c = scope.keep(
    host.alloc(t.shape, t.dtype, `${t.name ?? "tensor"} (contiguous copy for ${scope.op})`),
  );
  copyInto(host, scope.op, t, c);
  return c;
}

/** A contiguous copy of any view. */
export function copy(host: VkOpHost, x: Tensor): Tensor {
  host.check(x);
  return produce(host, x.shape, x.dtype, x.name, (out) => copyInto(host, "copy", x, out));
}

/**
 * Backend.set: write `src` into the view `dst` in place (same shape and dtype, any dtype), recorded on
 * the device like any op. @throws TpError E_SHAPE, E_ARG (see checkSetArgs), E_STATE
 */
export function set(host: VkOpHost, dst: Tensor, src: Tensor): void {
  checkTensors(host, "set", DTYPE_NAMES, { dst, src });
  checkSetArgs("vulkan", dst, src);
  copyInto(host, "set", src, dst);
}

/** A contiguous copy of elements [start, end) along `dim` (Tensor.slice rules). */
export function slice(host: VkOpHost, x: Tensor, dim: number, start: number, end: number): Tensor {
  host.check(x);
  const view = x.slice(dim, start, end);
  return produce(host, view.shape, x.dtype, x.name, (out) => copyInto(host, "slice", view, out));
}

/** Join tensors along `dim`. @throws TpError E_SHAPE when ranks, dtypes or other dimensions differ */
export function concat(host: VkOpHost, tensors: readonly Tensor[], dim: number): Tensor {
  const op = "concat";
  const list: readonly Tensor[] = tensors;
  if (!(list?.length > 0)) throw shapeError(op, "needs at least one tensor");
  const first = list[0] as Tensor;
  for (const t of list) host.check(t);
  const d = normalizeDim(dim, first.rank, "concat dim");
  const shape = [...first.shape];
  shape[d] = 0;
  for (const t of list) {
    if (t.dtype !== first.dtype) throw shapeError(op, `dtypes differ: ${first.dtype} and ${t.dtype}`);
    const same = t.rank === first.rank && t.shape.every((s, i) => i === d || s === first.shape[i]);
    if (!same) {
      throw shapeError(
        op,
        `${formatShape(t.shape)} does not match ${formatShape(first.shape)} outside dim ${d}`,
      );
    }
    shape[d] = (shape[d] as number) + (t.shape[d] as number);
  }
  return produce(host, shape, first.dtype, undefined, (out) => {
    let at = 0;
    for (const t of list) {
      const size = t.shape[d] as number;
      if (size > 0) copyInto(host, op, t, out.slice(d, at, at + size));
      at += size;
    }
  });
}

/** Nearest-neighbour upsampling by an integer factor on the last two dimensions. */
export function upsampleNearest2d(host: VkOpHost, x: Tensor, factor: number): Tensor {
  const op = "upsample_nearest2d";
  checkTensors(host, op, ["f32"], { x });
  integer(op, "factor", factor, 1, 1 << 16);
  if (x.rank < 2) throw shapeError(op, `x ${formatShape(x.shape)} needs at least 2 dimensions`);
  const lead = x.shape.slice(0, -2);
  const [h, w] = x.shape.slice(-2) as [number, number];
  const [sh, sw] = x.strides.slice(-2) as [number, number];
  // out[..., i·f + a, j·f + b] = x[..., i, j]: a view [..., H, f, W, f] with strides 0 on a and b.
  const src = x.view({
    shape: [...lead, h, factor, w, factor],
    strides: [...x.strides.slice(0, -2), sh, 0, sw, 0],
    offset: x.layout.offset,
  });
  return produce(host, [...lead, h * factor, w * factor], "f32", x.name, (out) =>
    copyInto(host, op, src, out.reshape(...lead, h, factor, w, factor)),
  );
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
 * Elementwise dtype conversion: f32 ⇄ f16 / bf16 / f8_e4m3fn / f8_e5m2, or a copy to the same dtype,
 * bit for bit as @tp/tensor convert.ts.
 * @throws TpError E_UNSUPPORTED for another pair, naming both dtypes
 */
export function cast(
  host: VkOpHost,
  x: Tensor,
  dtype: DTypeName,
  options: { saturate?: boolean } = {},
): Tensor {
  const op = "cast";
  host.check(x);
  if (x.dtype === dtype) return copy(host, x);
  const mode = CAST_MODES[`${x.dtype}→${dtype}`];
  if (mode === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op cast on backend vulkan: no conversion ${x.dtype} → ${dtype} (f32 ⇄ f16, bf16, f8_e4m3fn, f8_e5m2)`,
    );
  }
  return scoped(host, op, (s) => {
    const src = contiguous(host, s, x);
    return produce(host, x.shape, dtype, x.name, (out) => {
      const n = x.numel;
      if (n === 0) return;
      const a = host.bind(src, op);
      const y = host.bind(out, op);
      const push = new Push(12)
        .u32(n)
        .u32(options.saturate ? 1 : 0)
        .u32(a.offset);
      const perWord = mode < 2 ? 2 : mode < 4 ? 4 : 1;
      dispatch1d(host, op, "cast", [mode], [y.binding, a.binding], push, Math.ceil(n / perWord));
    });
  });
}
