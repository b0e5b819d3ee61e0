/**
 * softmax of the vulkan backend (shaders/softmax.comp): along any dimension, max-subtracted, one
 * workgroup per row; a strided input is copied to a contiguous scratch tensor first.
 */
import { normalizeDim, numel, type Tensor } from "@tp/tensor";
import { checkTensors, dispatchGroups, Push, produce, scoped, type VkOpHost } from "./common.ts";
import { contiguous } from "./layout.ts";

/** Softmax of x (any f32 view) along `dim` (default −1) → contiguous f32 of x's shape. */
export function softmax(host: VkOpHost, x: Tensor, options: { dim?: number } = {}): Tensor {
  const op = "softmax";
  checkTensors(host, op, ["f32"], { x });
  const d = normalizeDim(options?.dim ?? -1, Math.max(x.rank, 1), "softmax dim");
  return scoped(host, op, (s) =>
    produce(host, x.shape, "f32", x.name, (out) => {
      if (x.numel === 0) return;
      const src = contiguous(host, s, x);
      const size = x.rank === 0 ? 1 : (x.shape[d] as number);
      const inner = numel(x.shape.slice(d + 1));
      const rows = x.numel / size;
      const a = host.bind(src, op);
      const y = host.bind(out, op);
      const push = new Push(16).u32(rows).u32(size).u32(inner).u32(a.offset);
      dispatchGroups(host, op, "softmax", [host.workgroup], [y.binding, a.binding], push, rows);
    }),
  );
}
