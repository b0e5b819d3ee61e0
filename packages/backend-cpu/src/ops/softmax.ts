/**
 * Softmax of the cpu backend along any dimension of an f32 tensor (max-subtracted). A strided input
 * is copied first; the kernel (native/cpu/softmax.c) sees [outer, dim, inner].
 */
import { normalizeDim, numel, type Tensor, TpError } from "@tp/tensor";
import { type CpuOpHost, checkTensors, produce, scoped, shapeError } from "./common.ts";
import { softmaxF32 } from "./native.ts";

/**
 * Softmax along `dim` (default −1; `options` null or undefined: the default).
 * @throws TpError E_SHAPE for a dim outside the rank (or a scalar); E_STATE, E_UNSUPPORTED (not f32)
 */
export function softmax(host: CpuOpHost, x: Tensor, options?: { dim?: number } | null): Tensor {
  const op = "softmax";
  checkTensors(host, op, ["f32"], { x });
  let d: number;
  try {
    d = normalizeDim(options?.dim ?? -1, x.rank);
  } catch (e) {
    if (e instanceof TpError) throw shapeError(op, e.message);
    throw e;
  }
  const outer = numel(x.shape.slice(0, d));
  const inner = numel(x.shape.slice(d + 1));
  const size = x.shape[d] as number;
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    return produce(host, op, x.shape, "f32", x.name, (out) =>
      softmaxF32(host.ctx, xr, out, outer, size, inner),
    );
  });
}
