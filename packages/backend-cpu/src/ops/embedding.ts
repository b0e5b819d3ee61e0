/**
 * The embedding kernel (ggml get_rows) of the cpu backend: the rows of a table {@link Weight} [V, D] at
 * i32 ids, dequantized to f32 — only the rows asked for — with the native row decoders (tp.h
 * tp_cpu_get_rows), which equal @tp/quant's dequantizers bit for bit in every format of
 * CPU_WEIGHT_FORMATS. The front-end of @tp/tensor has checked the table and the ids' dtype; the ids'
 * range is checked here, where they are read, before native code runs.
 */
import { toArrayBuffer } from "bun:ffi";
import { formatShape, type KernelTable, type Tensor, TpError, type Weight } from "@tp/tensor";
import { type CpuOpHost, dense, region } from "./common.ts";
import { CPU_WEIGHT_FORMATS, f32View, nativeWeight, shownWeight } from "./matmul.ts";

/**
 * out [..., D] f32 = rows of `table` at `ids`.
 * @throws TpError E_ARG naming the first id outside [0, V) and V; E_UNSUPPORTED for scales the row
 *   decoders do not take
 */
function embedding(host: CpuOpHost, out: Tensor, table: Weight, ids: Tensor): void {
  const op = "embedding";
  if (!ids.isContiguous) {
    host.scope(() => embedding(host, out, table, dense(host, ids, op)));
    return;
  }
  const nw = nativeWeight(op, table);
  const [v, d] = table.shape;
  const count = ids.numel;
  const ir = region(host, ids, op);
  const idv =
    count === 0 || ir.ptr === null ? new Int32Array(0) : new Int32Array(toArrayBuffer(ir.ptr, 0, count * 4));
  for (let i = 0; i < count; i++) {
    const id = idv[i] as number;
    if (id < 0 || id >= v) {
      throw new TpError(
        "E_ARG",
        `op embedding on backend cpu: id ${id} (at index ${i} of ids ${formatShape(ids.shape)}) is outside [0, V) for V = ${v} rows of ${shownWeight(table)}`,
      );
    }
  }
  host.ctx.getRows(nw, idv, count, f32View(region(host, out, op), count * d));
}

/** The kernel-table entry of embedding: every weight format of CPU_WEIGHT_FORMATS, f32 rows out. */
export function embeddingKernels(host: CpuOpHost): Pick<KernelTable, "embedding"> {
  return {
    embedding: {
      dtypes: ["f32"],
      weightFormats: CPU_WEIGHT_FORMATS,
      run: (out, table, ids) => embedding(host, out, table, ids),
    },
  };
}
