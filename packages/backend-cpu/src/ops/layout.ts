/**
 * The layout kernels of the cpu backend: copy (materialise any view, any dtype), slice, concat and set
 * (the strided copy kernel, native/cpu/layout.c), cast (tp_cpu_cast) and upsample_nearest2d (f32).
 * Arguments are checked by @tp/tensor's front-end.
 */
import { DTYPE_NAMES, type DTypeName, type KernelTable, type Tensor, TpError } from "@tp/tensor";
import { CAST_DTYPES, CAST_SATURATE, type CastDtype } from "../ffi.ts";
import { type CpuOpHost, copyInto, dense, region } from "./common.ts";
import { upsampleNearest2dF32 } from "./native.ts";

const isCastDtype = (d: DTypeName): d is CastDtype => Object.hasOwn(CAST_DTYPES, d);

/** The parts of CpuBackend cast uses besides those of every kernel. */
export interface CpuCastHost extends CpuOpHost {
  /**
   * The bytes of a contiguous tensor's elements (a view on native memory).
   * @throws TpError E_UNSUPPORTED for a strided view, E_STATE
   */
  elementBytes(t: Tensor, op: string): Uint8Array;
}

/**
 * Elementwise dtype conversion (tp_cpu_cast): f32 ⇄ f16 / bf16 / f8_e4m3fn / f8_e5m2, or a copy to the
 * same dtype; rounding and NaN rules of @tp/tensor convert.ts, bit for bit.
 * @throws TpError E_UNSUPPORTED for another pair of dtypes, or a strided x (copy it first)
 */
function cast(host: CpuCastHost, out: Tensor, x: Tensor, saturate: boolean): void {
  const from = x.dtype;
  const to = out.dtype;
  if (!(from === to || (isCastDtype(from) && isCastDtype(to) && (from === "f32" || to === "f32")))) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op cast on backend cpu: no conversion ${from} → ${to} (f32 ⇄ f16, bf16, f8_e4m3fn, f8_e5m2)`,
    );
  }
  const src = host.elementBytes(x, "cast");
  if (x.numel === 0) return;
  const dst = host.elementBytes(out, "cast");
  if (from === to) dst.set(src);
  else host.ctx.cast(src, from as CastDtype, dst, to as CastDtype, x.numel, saturate ? CAST_SATURATE : 0);
}

function concat(host: CpuOpHost, out: Tensor, inputs: readonly Tensor[], dim: number): void {
  let at = 0;
  for (const t of inputs) {
    const size = t.shape[dim] as number;
    if (t.numel > 0) copyInto(host, t, out.slice(dim, at, at + size), "concat");
    at += size;
  }
}

function upsampleNearest2d(host: CpuOpHost, out: Tensor, x: Tensor, factor: number): void {
  const op = "upsample_nearest2d";
  if (!x.isContiguous) {
    host.scope(() => upsampleNearest2d(host, out, dense(host, x, op), factor));
    return;
  }
  const h = x.shape[x.rank - 2] as number;
  const w = x.shape[x.rank - 1] as number;
  const planes = x.numel === 0 ? 0 : x.numel / (h * w);
  upsampleNearest2dF32(host.ctx, region(host, x, op), region(host, out, op), planes, h, w, factor);
}

/** The kernel-table entries of the layout ops: copy / slice / concat / set move every dtype. */
export function layoutKernels(
  host: CpuCastHost,
): Pick<KernelTable, "copy" | "slice" | "concat" | "set" | "cast" | "upsample_nearest2d"> {
  return {
    copy: { dtypes: DTYPE_NAMES, run: (out, x) => copyInto(host, x, out, "copy") },
    slice: { dtypes: DTYPE_NAMES, run: (out, view) => copyInto(host, view, out, "slice") },
    concat: { dtypes: DTYPE_NAMES, run: (out, inputs, dim) => concat(host, out, inputs, dim) },
    set: { dtypes: DTYPE_NAMES, run: (dst, src) => copyInto(host, src, dst, "set") },
    // one JS view over native memory spans at most 4 GiB (bun:ffi toArrayBuffer)
    cast: { dtypes: DTYPE_NAMES, maxBytes: 2 ** 32, run: (out, x, saturate) => cast(host, out, x, saturate) },
    upsample_nearest2d: { dtypes: ["f32"], run: (out, x, f) => upsampleNearest2d(host, out, x, f) },
  };
}
