/**
 * Elementwise ops of the cpu backend on f32: silu, gelu (erf / tanh), sigmoid, swiglu, scale
 * (contiguous kernels; strided inputs are copied first) and add / sub / mul / modulate, whose
 * kernels read strided and broadcast inputs directly. Semantics: @tp/tensor `Backend`.
 */
import { broadcastShapes, formatShape, type Shape, sameShape, type Tensor, TpError } from "@tp/tensor";
import { argError, type CpuOpHost, checkTensors, produce, scoped, shapeError, shown } from "./common.ts";
import { binaryF32, modulateF32, scaleF32, swigluF32, type UnaryKernel, unary } from "./native.ts";

const F32 = ["f32"] as const;

function unaryOp(host: CpuOpHost, op: string, kernel: UnaryKernel, x: Tensor): Tensor {
  checkTensors(host, op, F32, { x });
  return scoped(host, op, (s) => {
    const src = s.contiguous(x);
    return produce(host, op, x.shape, "f32", x.name, (out) => unary(host.ctx, kernel, src, out, x.numel));
  });
}

/** x · σ(x). @throws TpError E_STATE, E_UNSUPPORTED (not f32) */
export function silu(host: CpuOpHost, x: Tensor): Tensor {
  return unaryOp(host, "silu", "silu", x);
}

/** 1 / (1 + e^−x). @throws TpError E_STATE, E_UNSUPPORTED (not f32) */
export function sigmoid(host: CpuOpHost, x: Tensor): Tensor {
  return unaryOp(host, "sigmoid", "sigmoid", x);
}

/**
 * GELU: "none" x·Φ(x) with erf, "tanh" the tanh approximation (`options` null or undefined: "none").
 * @throws TpError E_ARG for another `approximate`; E_STATE, E_UNSUPPORTED (not f32)
 */
export function gelu(host: CpuOpHost, x: Tensor, options?: { approximate?: "none" | "tanh" } | null): Tensor {
  const approximate = options?.approximate ?? "none";
  if (approximate !== "none" && approximate !== "tanh") {
    throw argError("gelu", `approximate must be "none" or "tanh", got ${JSON.stringify(approximate)}`);
  }
  return unaryOp(host, "gelu", approximate === "tanh" ? "gelu_tanh" : "gelu_erf", x);
}

/** silu(gate) · up, same shapes. @throws TpError E_SHAPE naming both shapes; E_STATE, E_UNSUPPORTED */
export function swiglu(host: CpuOpHost, gate: Tensor, up: Tensor): Tensor {
  const op = "swiglu";
  checkTensors(host, op, F32, { gate, up });
  if (!sameShape(gate.shape, up.shape)) {
    throw shapeError(
      op,
      `gate ${formatShape(gate.shape)} and up ${formatShape(up.shape)} must have the same shape`,
    );
  }
  return scoped(host, op, (s) => {
    const g = s.contiguous(gate);
    const u = s.contiguous(up);
    return produce(host, op, gate.shape, "f32", gate.name, (out) =>
      swigluF32(host.ctx, g, u, out, gate.numel),
    );
  });
}

/** x · s for a host number s (rounded to f32). @throws TpError E_ARG for a non-number; E_STATE, E_UNSUPPORTED */
export function scale(host: CpuOpHost, x: Tensor, s: number): Tensor {
  const op = "scale";
  if (typeof s !== "number") throw argError(op, `the scale must be a number, got ${typeof s}`);
  checkTensors(host, op, F32, { x });
  return scoped(host, op, (sc) => {
    const src = sc.contiguous(x);
    return produce(host, op, x.shape, "f32", x.name, (out) => scaleF32(host.ctx, src, out, x.numel, s));
  });
}

/** The broadcast shape of a and b, or E_SHAPE naming op and both shapes. */
function broadcast(op: string, a: Tensor, b: Tensor): number[] {
  try {
    return broadcastShapes(a.shape, b.shape);
  } catch (e) {
    if (e instanceof TpError) throw shapeError(op, `${shown(a, "a")} and ${shown(b, "b")}: ${e.message}`);
    throw e;
  }
}

/** Strides of `t` broadcast to `shape`, or E_SHAPE naming op and shapes. */
function stridesTo(op: string, t: Tensor, shape: Shape, what: string): readonly number[] {
  try {
    return t.broadcastTo(shape).strides;
  } catch (e) {
    if (e instanceof TpError) {
      throw shapeError(op, `${what} ${formatShape(t.shape)} does not broadcast to ${formatShape(shape)}`);
    }
    throw e;
  }
}

/**
 * a ∘ b with NumPy broadcasting; inputs may be any views (read with their strides).
 * @throws TpError E_SHAPE naming both shapes; E_STATE, E_UNSUPPORTED (not f32)
 */
export function binary(host: CpuOpHost, op: "add" | "sub" | "mul", a: Tensor, b: Tensor): Tensor {
  checkTensors(host, op, F32, { a, b });
  const shape = broadcast(op, a, b);
  const sa = stridesTo(op, a, shape, "a");
  const sb = stridesTo(op, b, shape, "b");
  return produce(host, op, shape, "f32", a.name, (out) =>
    binaryF32(
      host.ctx,
      op,
      { region: host.viewRegion(a), strides: sa },
      { region: host.viewRegion(b), strides: sb },
      out,
      shape,
    ),
  );
}

/**
 * x · (1 + scale) + shift, scale and shift broadcast to x's shape (adaLN modulation).
 * @throws TpError E_SHAPE when scale or shift does not broadcast to x; E_STATE, E_UNSUPPORTED
 */
export function modulate(host: CpuOpHost, x: Tensor, scaleT: Tensor, shift: Tensor): Tensor {
  const op = "modulate";
  checkTensors(host, op, F32, { x, scale: scaleT, shift });
  const shape = x.shape;
  const operand = (t: Tensor, what: string) => ({
    region: host.viewRegion(t),
    strides: stridesTo(op, t, shape, what),
  });
  const ox = operand(x, "x");
  const os = operand(scaleT, "scale");
  const oh = operand(shift, "shift");
  return produce(host, op, shape, "f32", x.name, (out) => modulateF32(host.ctx, ox, os, oh, out, shape));
}
