/**
 * The sampling helpers of the vulkan backend: argmax and top_k along the last dimension
 * (shaders/argmax.comp, shaders/top_k.comp), one workgroup per row; ties go to the lower index.
 */
import { formatShape, type Tensor } from "@tp/tensor";
import {
  checkTensors,
  dispatchGroups,
  integer,
  Push,
  produce,
  scoped,
  shapeError,
  type VkOpHost,
} from "./common.ts";
import { contiguous } from "./layout.ts";

/** Index of the largest value along the last dimension (the first on ties): x [..., n] f32 → i32 [...]. */
export function argmax(host: VkOpHost, x: Tensor): Tensor {
  const op = "argmax";
  checkTensors(host, op, ["f32"], { x });
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs a last dimension`);
  const n = x.shape[x.rank - 1] as number;
  if (n === 0 && x.numel === 0 && x.shape.slice(0, -1).some((d) => d > 0)) {
    throw shapeError(op, `x ${formatShape(x.shape)}: no values to choose from`);
  }
  return scoped(host, op, (s) =>
    produce(host, x.shape.slice(0, -1), "i32", undefined, (out) => {
      if (out.numel === 0) return;
      const a = host.bind(contiguous(host, s, x), op);
      const y = host.bind(out, op);
      const push = new Push(12).u32(out.numel).u32(n).u32(a.offset);
      dispatchGroups(host, op, "argmax", [host.workgroup], [y.binding, a.binding], push, out.numel);
    }),
  );
}

/**
 * The k largest values along the last dimension, descending (ties: lower index first), and their i32
 * indices: x [..., n] f32 → values [..., k] f32, indices [..., k] i32.
 * @throws TpError E_ARG when k is not an integer in [0, n]
 */
export function topK(host: VkOpHost, x: Tensor, k: number): { values: Tensor; indices: Tensor } {
  const op = "top_k";
  checkTensors(host, op, ["f32"], { x });
  if (x.rank < 1) throw shapeError(op, `x ${formatShape(x.shape)} needs a last dimension`);
  const n = x.shape[x.rank - 1] as number;
  integer(op, "k", k, 0, n);
  const shape = [...x.shape.slice(0, -1), k];
  return scoped(host, op, (s) => {
    const values = host.alloc(shape, "f32");
    try {
      const indices = produce(host, shape, "i32", undefined, (idx) => {
        if (idx.numel === 0) return;
        const rows = idx.numel / k;
        const a = host.bind(contiguous(host, s, x), op);
        const v = host.bind(values, op);
        const i = host.bind(idx, op);
        const push = new Push(16).u32(rows).u32(n).u32(k).u32(a.offset);
        dispatchGroups(host, op, "top_k", [host.workgroup], [v.binding, i.binding, a.binding], push, rows);
      });
      return { values, indices };
    } catch (e) {
      host.free(values);
      throw e;
    }
  });
}
