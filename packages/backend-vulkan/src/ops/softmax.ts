/**
 * softmax of the vulkan backend (shaders/softmax.comp): along any dimension, max-subtracted, one
 * workgroup per row; a strided input is copied to a contiguous scratch tensor first. Kernel-table
 * entry: arguments arrive checked (@tp/tensor's op front-end).
 */
import { numel, type Tensor } from "@tp/tensor";
import { dispatchGroups, Push, type VkOpHost } from "./common.ts";
import { contiguous } from "./layout.ts";

/** softmax of x (any f32 view) along `dim` (in [0, rank), 0 for a scalar) into out (contiguous f32). */
export function softmax(host: VkOpHost, out: Tensor, x: Tensor, dim: number): void {
  const op = "softmax";
  if (x.numel === 0) return;
  const size = x.rank === 0 ? 1 : (x.shape[dim] as number);
  const inner = numel(x.shape.slice(dim + 1));
  const rows = x.numel / size;
  host.scope(() => {
    const a = host.bind(contiguous(host, op, x), op);
    const y = host.bind(out, op);
    const push = new Push(16).u32(rows).u32(size).u32(inner).u32(a.offset);
    dispatchGroups(host, op, "softmax", [host.workgroup], [y.binding, a.binding], push, rows);
  });
}
