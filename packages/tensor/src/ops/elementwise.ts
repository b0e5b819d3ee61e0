/**
 * The front-end of the elementwise ops: silu, gelu, sigmoid, swiglu, softmax, add / sub / mul (NumPy
 * broadcasting), scale and modulate. Checks, then the kernel on a new output; binary operands reach
 * the kernel as views broadcast to the output's shape. Semantics and sources: `Backend` in ../backend.ts.
 */
import type { OpName } from "../backend.ts";
import { TpError } from "../errors.ts";
import { opError } from "../op-args.ts";
import { broadcastShapes, formatShape, normalizeDim, type Shape, sameShape } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { checkInput, kernel, type OpHost, run, shown } from "./common.ts";

type UnaryOp = "silu" | "sigmoid" | "softplus";

/** silu / sigmoid / softplus: x → a new tensor of x's shape. */
export function unary(host: OpHost, op: UnaryOp, x: Tensor): Tensor {
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x);
}

/**
 * GELU, "none" (erf, the default; `options` null or undefined: the default) or "tanh".
 * @throws TpError E_ARG for another `approximate`; E_STATE; E_UNSUPPORTED
 */
export function gelu(host: OpHost, x: Tensor, options?: { approximate?: "none" | "tanh" } | null): Tensor {
  const op = "gelu";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  const approximate = options?.approximate ?? "none";
  if (approximate !== "none" && approximate !== "tanh") {
    throw opError(
      "E_ARG",
      host.name,
      op,
      `approximate must be "none" or "tanh", got ${JSON.stringify(approximate)}`,
    );
  }
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, approximate);
}

/** silu(gate) · up. @throws TpError E_SHAPE naming both shapes; E_STATE; E_UNSUPPORTED */
export function swiglu(host: OpHost, gate: Tensor, up: Tensor): Tensor {
  const op = "swiglu";
  const k = kernel(host, op);
  checkInput(host, op, k, gate, "gate");
  checkInput(host, op, k, up, "up");
  if (!sameShape(gate.shape, up.shape)) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `gate ${formatShape(gate.shape)} and up ${formatShape(up.shape)} must have the same shape`,
    );
  }
  return run(host, host.alloc(gate.shape, gate.dtype, gate.name), k.run, gate, up);
}

/** Softmax along `dim` (default −1). @throws TpError E_SHAPE for a dim outside the rank; E_STATE; E_UNSUPPORTED */
export function softmax(host: OpHost, x: Tensor, options?: { dim?: number } | null): Tensor {
  const op = "softmax";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  let d: number;
  try {
    d = normalizeDim(options?.dim ?? -1, x.rank);
  } catch (e) {
    if (e instanceof TpError) throw opError("E_SHAPE", host.name, op, e.message);
    throw e;
  }
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, d);
}

/** x · s for a host number s (±inf and NaN included). @throws TpError E_ARG for a non-number; E_STATE; E_UNSUPPORTED */
export function scale(host: OpHost, x: Tensor, s: number): Tensor {
  const op = "scale";
  const k = kernel(host, op);
  if (typeof s !== "number")
    throw opError("E_ARG", host.name, op, `the scale must be a number, got ${typeof s}`);
  checkInput(host, op, k, x, "x");
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, s);
}

/** `t` as a view of `shape` (itself when it has that shape), or E_SHAPE naming op and shapes. */
function broadcastView(host: OpHost, op: OpName, t: Tensor, shape: Shape, what: string): Tensor {
  if (sameShape(t.shape, shape)) return t;
  try {
    return t.broadcastTo(shape);
  } catch (e) {
    if (e instanceof TpError) {
      throw opError(
        "E_SHAPE",
        host.name,
        op,
        `${what} ${formatShape(t.shape)} does not broadcast to ${formatShape(shape)}`,
      );
    }
    throw e;
  }
}

/**
 * a ∘ b with NumPy broadcasting (∘ one of +, −, ×), any views.
 * @throws TpError E_SHAPE naming both shapes; E_STATE; E_UNSUPPORTED
 */
export function binary(host: OpHost, op: "add" | "sub" | "mul", a: Tensor, b: Tensor): Tensor {
  const k = kernel(host, op);
  checkInput(host, op, k, a, "a");
  checkInput(host, op, k, b, "b");
  let shape: Shape = a.shape;
  if (!sameShape(a.shape, b.shape)) {
    try {
      shape = broadcastShapes(a.shape, b.shape);
    } catch (e) {
      if (e instanceof TpError)
        throw opError("E_SHAPE", host.name, op, `${shown(a, "a")} and ${shown(b, "b")}: ${e.message}`);
      throw e;
    }
  }
  const av = broadcastView(host, op, a, shape, "a");
  const bv = broadcastView(host, op, b, shape, "b");
  return run(host, host.alloc(shape, a.dtype, a.name), k.run, av, bv);
}

/**
 * x · (1 + scale) + shift, scale and shift broadcast to x's shape (adaLN modulation).
 * @throws TpError E_SHAPE when scale or shift does not broadcast to x; E_STATE; E_UNSUPPORTED
 */
export function modulate(host: OpHost, x: Tensor, scaleT: Tensor, shift: Tensor): Tensor {
  const op = "modulate";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  checkInput(host, op, k, scaleT, "scale");
  checkInput(host, op, k, shift, "shift");
  const sv = broadcastView(host, op, scaleT, x.shape, "scale");
  const hv = broadcastView(host, op, shift, x.shape, "shift");
  return run(host, host.alloc(x.shape, x.dtype, x.name), k.run, x, sv, hv);
}
