/**
 * The elementwise ops of the vulkan backend — silu, sigmoid, gelu (erf, tanh), scale, add / sub / mul
 * with broadcasting, swiglu, modulate — one kernel each (shaders/<op>.comp) over a contiguous output,
 * reading every input through its strides (a broadcast is a stride of 0), so permuted, sliced and
 * broadcast views need no copies. Push constants: shaders/elementwise.glsl. Kernel-table entries:
 * arguments arrive checked and broadcast (@tp/tensor's op front-end).
 */
import { broadcastTo, formatShape, type Tensor } from "@tp/tensor";
import type { KernelName } from "../kernels.ts";
import {
  contiguousStrides,
  dispatch1d,
  mergeDims,
  Push,
  splitForBindings,
  unsupported,
  type VkOpHost,
} from "./common.ts";

/** Dimensions the elementwise kernels walk (their push constants hold 6). */
const RANK = 6;

/**
 * Record an elementwise kernel: out (contiguous f32) from inputs broadcast to out's shape.
 * @param param the kernel's scalar (scale factor, gelu form)
 * @throws TpError E_UNSUPPORTED when the views walk more than 6 dimensions that cannot be merged, or
 *   one row spans more than maxStorageBufferRange
 */
function run(host: VkOpHost, kernel: KernelName, out: Tensor, inputs: readonly Tensor[], param = 0): void {
  const op = kernel;
  const shape = out.shape;
  if (out.numel === 0) return;
  const views = inputs.map((t) => broadcastTo(t.layout, shape));
  const m = mergeDims(shape, [contiguousStrides(shape), ...views.map((v) => v.strides)]);
  if (m.shape.length > RANK) {
    throw unsupported(
      op,
      `${formatShape(shape)} with these strides walks ${m.shape.length} dimensions, at most ${RANK}`,
    );
  }
  // Past maxStorageBufferRange the work is split along the first (merged) dimension.
  const operands = [out, ...inputs].map((t, i) => ({
    t,
    strides: m.strides[i] as number[],
    offset: i === 0 ? 0 : (views[i - 1]?.offset ?? 0),
  }));
  for (const [o, ...ins] of splitForBindings(host, op, m.shape, operands)) {
    const y = host.bind(o as Tensor, op);
    const bound = ins.map((t) => host.bind(t, op));
    const push = new Push(120)
      .u32(o?.numel ?? 0)
      .u32(m.shape.length)
      .u32s(o?.shape ?? [], RANK);
    for (let i = 0; i < 3; i++) {
      push.u32(bound[i]?.offset ?? 0).u32s(m.strides[i + 1] ?? [], RANK);
    }
    push.f32(param);
    dispatch1d(host, op, kernel, [], [y.binding, ...bound.map((b) => b.binding)], push, o?.numel ?? 0);
  }
}

/** silu: x · σ(x). */
export function silu(host: VkOpHost, out: Tensor, x: Tensor): void {
  run(host, "silu", out, [x]);
}

/** sigmoid: 1 / (1 + e^(−x)). */
export function sigmoid(host: VkOpHost, out: Tensor, x: Tensor): void {
  run(host, "sigmoid", out, [x]);
}

/** softplus: log(1 + e^x), x itself above 20. */
export function softplus(host: VkOpHost, out: Tensor, x: Tensor): void {
  run(host, "softplus", out, [x]);
}

/** gelu: erf form ("none") or the tanh approximation. */
export function gelu(host: VkOpHost, out: Tensor, x: Tensor, approximate: "none" | "tanh"): void {
  run(host, "gelu", out, [x], approximate === "tanh" ? 1 : 0);
}

/** scale: x · s (s rounded to f32 in the push constants). */
export function scale(host: VkOpHost, out: Tensor, x: Tensor, s: number): void {
  run(host, "scale", out, [x], s);
}

/** add / sub / mul: a ∘ b, both broadcast to out's shape. */
export function binary(host: VkOpHost, op: "add" | "sub" | "mul", out: Tensor, a: Tensor, b: Tensor): void {
  run(host, op, out, [a, b]);
}

/** swiglu: silu(gate) · up. */
export function swiglu(host: VkOpHost, out: Tensor, gate: Tensor, up: Tensor): void {
  run(host, "swiglu", out, [gate, up]);
}

/** modulate: x · (1 + scale) + shift, scale and shift broadcast to x. */
export function modulate(host: VkOpHost, out: Tensor, x: Tensor, scaleT: Tensor, shift: Tensor): void {
  run(host, "modulate", out, [x, scaleT, shift]);
}
