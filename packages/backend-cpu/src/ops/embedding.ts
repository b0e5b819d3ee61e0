/**
 * embedding (ggml get_rows) of the cpu backend: the rows of a table {@link Weight} [V, D] at i32 ids,
 * dequantized to f32 — only the rows asked for — with the native row decoders (tp.h tp_cpu_get_rows),
 * which equal @tp/quant's dequantizers bit for bit in every format of CPU_WEIGHT_FORMATS.
 */
import { toArrayBuffer } from "bun:ffi";
import { formatShape, type Tensor, TpError, type Weight } from "@tp/tensor";
import { type CpuOpHost, checkTensors, produce, scoped } from "./common.ts";
import { f32View, nativeWeight, shownWeight } from "./matmul.ts";

/**
 * Rows of `table` at `ids`. table: [V, D] in any supported weight format; ids: i32 [...] (any view)
 * → [..., D] f32.
 * @throws TpError E_ARG when table is not a Weight, or naming the first id outside [0, V) and V
 *   (checked before native code runs);
 *   E_UNSUPPORTED naming op, backend and format (or a non-i32 ids tensor); E_STATE; E_OOM
 */
export function embedding(host: CpuOpHost, table: Weight, ids: Tensor): Tensor {
  const op = "embedding";
  checkTensors(host, op, ["i32"], { ids });
  const nw = nativeWeight(op, table);
  const [v, d] = table.shape;
  const count = ids.numel;
  return scoped(host, op, (s) => {
    const ir = s.contiguous(ids);
    const idv =
      count === 0 || ir.ptr === null
        ? new Int32Array(0)
        : new Int32Array(toArrayBuffer(ir.ptr, 0, count * 4));
    for (let i = 0; i < count; i++) {
      const id = idv[i] as number;
      if (id < 0 || id >= v) {
        throw new TpError(
          "E_ARG",
          `op embedding on backend cpu: id ${id} (at index ${i} of ids ${formatShape(ids.shape)}) is outside [0, V) for V = ${v} rows of ${shownWeight(table)}`,
        );
      }
    }
    return produce(host, op, [...ids.shape, d], "f32", undefined, (out) =>
      host.ctx.getRows(nw, idv, count, f32View(out, count * d)),
    );
  });
}
