/**
 * Sampling helpers of the cpu backend on f32 rows (the last dimension): argmax and topK. Order: larger
 * first, NaN above every number (as torch), ties to the lower index. Kernel: native/cpu/sample.c.
 */
import { formatShape, type Tensor } from "@tp/tensor";
import { type CpuOpHost, checkTensors, integer, produce, scoped, shapeError } from "./common.ts";
import { argmaxF32, topKF32 } from "./native.ts";

function rows(op: string, x: Tensor): { rows: number; n: number } {
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs at least one dimension`);
  const n = x.shape[x.rank - 1] as number;
  if (n === 0 && x.shape.slice(0, -1).every((d) => d > 0)) {
    throw shapeError(op, `x ${formatShape(x.shape)}: rows of 0 values have no maximum`);
  }
  if (n > 2 ** 31 - 1) throw shapeError(op, `x ${formatShape(x.shape)}: rows longer than i32 indices`);
  return { rows: n === 0 ? 0 : x.numel / n, n };
}

/**
 * Index of the largest value along the last dimension → i32 [...leading].
 * @throws TpError E_SHAPE for a scalar or empty rows; E_STATE, E_UNSUPPORTED (not f32)
 */
export function argmax(host: CpuOpHost, x: Tensor): Tensor {
  const op = "argmax";
  checkTensors(host, op, ["f32"], { x });
  const r = rows(op, x);
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    return produce(host, op, x.shape.slice(0, -1), "i32", x.name, (out) =>
      argmaxF32(host.ctx, xr, out, r.rows, r.n),
    );
  });
}

/**
 * The k largest values along the last dimension, descending, and their i32 indices.
 * @throws TpError E_ARG for k outside [0, n]; E_SHAPE for a scalar; E_STATE, E_UNSUPPORTED (not f32)
 */
export function topK(host: CpuOpHost, x: Tensor, k: number): { values: Tensor; indices: Tensor } {
  const op = "top_k";
  checkTensors(host, op, ["f32"], { x });
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs at least one dimension`);
  const n = x.shape[x.rank - 1] as number;
  const kk = integer(op, "k", k, 0, n);
  const r = kk === 0 ? { rows: 0, n } : rows(op, x);
  const shape = [...x.shape.slice(0, -1), kk];
  return scoped(host, op, (s) => {
    const xr = s.contiguous(x);
    const values = host.alloc(shape, "f32", x.name);
    try {
      const indices = produce(host, op, shape, "i32", x.name, (ir) =>
        topKF32(
          host.ctx,
          xr,
          { ptr: host.elementPointer(values, op), bytes: values.byteLength },
          ir,
          r.rows,
          r.n,
          kk,
        ),
      );
      return { values, indices };
    } catch (e) {
      host.free(values);
      throw e;
    }
  });
}
