/**
 * The sampling kernels of the cpu backend on f32 rows (the last dimension): argmax and top_k. Order:
 * larger first, NaN above every number (as torch), ties to the lower index. Arguments are checked by
 * @tp/tensor's front-end; kernel: native/cpu/sample.c.
 */
import type { KernelTable, Tensor } from "@tp/tensor";
import { type CpuOpHost, dense, region } from "./common.ts";
import { argmaxF32, countNonFiniteF32, topKF32 } from "./native.ts";

/** Rows of x (0 when rows are empty). */
function rowsOf(x: Tensor): number {
  const n = x.shape[x.rank - 1] as number;
  return n === 0 ? 0 : x.numel / n;
}

function argmax(host: CpuOpHost, out: Tensor, x: Tensor): void {
  const op = "argmax";
  if (!x.isContiguous) {
    host.scope(() => argmax(host, out, dense(host, x, op)));
    return;
  }
  argmaxF32(host.ctx, region(host, x, op), region(host, out, op), rowsOf(x), x.shape[x.rank - 1] as number);
}

function topK(host: CpuOpHost, values: Tensor, indices: Tensor, x: Tensor, k: number): void {
  const op = "top_k";
  if (!x.isContiguous) {
    host.scope(() => topK(host, values, indices, dense(host, x, op), k));
    return;
  }
  const rows = k === 0 ? 0 : rowsOf(x);
  topKF32(
    host.ctx,
    region(host, x, op),
    region(host, values, op),
    region(host, indices, op),
    rows,
    x.shape[x.rank - 1] as number,
    k,
  );
}

function countNonFinite(host: CpuOpHost, out: Tensor, x: Tensor): void {
  const op = "count_nonfinite";
  if (!x.isContiguous) {
    host.scope(() => countNonFinite(host, out, dense(host, x, op)));
    return;
  }
  countNonFiniteF32(host.ctx, region(host, x, op), region(host, out, op), x.numel);
}

/**
 * The kernel-table entries of argmax, top_k and count_nonfinite (f32 values; indices and the count are
 * i32 by the op contract).
 */
export function sampleKernels(host: CpuOpHost): Pick<KernelTable, "argmax" | "top_k" | "count_nonfinite"> {
  return {
    count_nonfinite: { dtypes: ["f32"], run: (out, x) => countNonFinite(host, out, x) },
    argmax: { dtypes: ["f32"], run: (out, x) => argmax(host, out, x) },
    top_k: { dtypes: ["f32"], run: (values, indices, x, k) => topK(host, values, indices, x, k) },
  };
}
