/**
 * The sampling helpers of the vulkan backend: argmax and top_k along the last dimension
 * (shaders/argmax.comp, shaders/top_k.comp), one workgroup per row; ties go to the lower index. And
 * count_nonfinite (shaders/count_nonfinite.comp), one workgroup over the whole tensor.
 * Kernel-table entries: arguments arrive checked (@tp/tensor's op front-end).
 */
import type { Tensor } from "@tp/tensor";
import { dispatchGroups, Push, type VkOpHost } from "./common.ts";
import { contiguous } from "./layout.ts";

/** argmax: out i32 [...] = index of the largest value of each row of x [..., n] f32 (the first on ties). */
export function argmax(host: VkOpHost, out: Tensor, x: Tensor): void {
  const op = "argmax";
  if (out.numel === 0) return;
  const n = x.shape[x.rank - 1] as number;
  host.scope(() => {
    const a = host.bind(contiguous(host, op, x), op);
    const y = host.bind(out, op);
    const push = new Push(12).u32(out.numel).u32(n).u32(a.offset);
    dispatchGroups(host, op, "argmax", [host.workgroup], [y.binding, a.binding], push, out.numel);
  });
}

/**
 * top_k: the k largest values of each row of x [..., n] f32, descending (ties: lower index first),
 * into values [..., k] f32 and their indices [..., k] i32.
 */
export function topK(host: VkOpHost, values: Tensor, indices: Tensor, x: Tensor, k: number): void {
  const op = "top_k";
  if (indices.numel === 0) return;
  const n = x.shape[x.rank - 1] as number;
  const rows = indices.numel / k;
  host.scope(() => {
    const a = host.bind(contiguous(host, op, x), op);
    const v = host.bind(values, op);
    const i = host.bind(indices, op);
    const push = new Push(16).u32(rows).u32(n).u32(k).u32(a.offset);
    dispatchGroups(host, op, "top_k", [host.workgroup], [v.binding, i.binding, a.binding], push, rows);
  });
}

/** count_nonfinite: out i32 [] = the number of NaN / ±∞ elements of x (any view, f32). */
export function countNonFinite(host: VkOpHost, out: Tensor, x: Tensor): void {
  const op = "count_nonfinite";
  host.scope(() => {
    const y = host.bind(out, op);
    // An empty x still writes its count of 0; the kernel then reads nothing of its binding 1.
    const a = x.numel === 0 ? y : host.bind(contiguous(host, op, x), op);
    const push = new Push(8).u32(x.numel).u32(x.numel === 0 ? 0 : a.offset);
    dispatchGroups(host, op, "count_nonfinite", [host.workgroup], [y.binding, a.binding], push, 1);
  });
}
