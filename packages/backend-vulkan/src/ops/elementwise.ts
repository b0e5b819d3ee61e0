/**
 * The elementwise ops of the vulkan backend — silu, sigmoid, gelu (erf, tanh), scale, add / sub / mul
 * with broadcasting, swiglu, modulate — one kernel each (shaders/<op>.comp) over a contiguous output,
 * reading every input through its strides (a broadcast is a stride of 0), so permuted, sliced and
 * broadcast views need no copies. Push constants: shaders/elementwise.glsl.
 */
import { broadcastShapes, broadcastTo, formatShape, type Tensor } from "@tp/tensor";
import type { KernelName } from "../kernels.ts";
import {
  argError,
  checkTensors,
  contiguousStrides,
  dispatch1d,
  finite,
  mergeDims,
  Push,
  produce,
  shapeError,
  splitForBindings,
  unsupported,
  type VkOpHost,
} from "./common.ts";

/** Dimensions the elementwise kernels walk (their push constants hold 6). */
const RANK = 6;

/**
 * Run an elementwise kernel: output [shape] f32, inputs broadcast to `shape`.
 * @param param the kernel's scalar (scale factor, gelu form)
 */
function run(
  host: VkOpHost,
  op: string,
  kernel: KernelName,
  shape: readonly number[],
  inputs: Tensor[],
  param = 0,
): Tensor {
  return produce(host, shape, "f32", inputs[0]?.name, (out) => {
    const n = out.numel;
    if (n === 0) return;
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
  });
}

/** x · σ(x). x: any f32 view → contiguous f32 of its shape. */
export function silu(host: VkOpHost, x: Tensor): Tensor {
  checkTensors(host, "silu", ["f32"], { x });
  return run(host, "silu", "silu", x.shape, [x]);
}

/** 1 / (1 + e^(−x)). */
export function sigmoid(host: VkOpHost, x: Tensor): Tensor {
  checkTensors(host, "sigmoid", ["f32"], { x });
  return run(host, "sigmoid", "sigmoid", x.shape, [x]);
}

/** GELU, erf form ("none", default) or the tanh approximation. */
export function gelu(host: VkOpHost, x: Tensor, options: { approximate?: "none" | "tanh" } = {}): Tensor {
  checkTensors(host, "gelu", ["f32"], { x });
  const a = options?.approximate ?? "none";
  if (a !== "none" && a !== "tanh") {
    throw argError("gelu", `approximate must be "none" or "tanh", got ${JSON.stringify(a)}`);
  }
  return run(host, "gelu", "gelu", x.shape, [x], a === "tanh" ? 1 : 0);
}

/** x · s for a host scalar s (rounded to f32). */
export function scale(host: VkOpHost, x: Tensor, s: number): Tensor {
  checkTensors(host, "scale", ["f32"], { x });
  return run(host, "scale", "scale", x.shape, [x], finite("scale", "s", s));
}

/** a ∘ b with broadcasting, ∘ one of +, −, ×. @throws TpError E_SHAPE when the shapes do not broadcast */
export function binary(host: VkOpHost, op: "add" | "sub" | "mul", a: Tensor, b: Tensor): Tensor {
  checkTensors(host, op, ["f32"], { a, b });
  return run(host, op, op, broadcastShapes(a.shape, b.shape), [a, b]);
}

/** silu(gate) · up, same shapes. @throws TpError E_SHAPE when they differ */
export function swiglu(host: VkOpHost, gate: Tensor, up: Tensor): Tensor {
  checkTensors(host, "swiglu", ["f32"], { gate, up });
  if (gate.rank !== up.rank || gate.shape.some((d, i) => d !== up.shape[i])) {
    throw shapeError("swiglu", `gate ${formatShape(gate.shape)} and up ${formatShape(up.shape)} differ`);
  }
  return run(host, "swiglu", "swiglu", gate.shape, [gate, up]);
}

/** x · (1 + scale) + shift, scale and shift broadcast to x. @throws TpError E_SHAPE when they do not */
export function modulate(host: VkOpHost, x: Tensor, scaleT: Tensor, shift: Tensor): Tensor {
  checkTensors(host, "modulate", ["f32"], { x, scale: scaleT, shift });
  const shape = broadcastShapes(x.shape, scaleT.shape, shift.shape);
  if (shape.length !== x.rank || shape.some((d, i) => d !== x.shape[i])) {
    throw shapeError(
      "modulate",
      `scale ${formatShape(scaleT.shape)} and shift ${formatShape(shift.shape)} must broadcast to x ${formatShape(x.shape)}`,
    );
  }
  return run(host, "modulate", "modulate", x.shape, [x, scaleT, shift]);
}
