/**
 * The elementwise kernels of the cpu backend on f32: silu, gelu (erf / tanh), sigmoid, swiglu, scale
 * and softmax (contiguous kernels; strided inputs are copied first), and add / sub / mul / modulate,
 * whose kernels read strided and broadcast operands directly. Arguments are checked by @tp/tensor's
 * front-end; kernels: native/cpu/elementwise.c, softmax.c.
 */
import type { DTypeName, KernelTable, Tensor } from "@tp/tensor";
import { type CpuOpHost, dense, region } from "./common.ts";
import {
  binaryF32,
  modulateF32,
  scaleF32,
  softmaxF32,
  swigluF32,
  type UnaryKernel,
  unary,
} from "./native.ts";

const F32: readonly DTypeName[] = ["f32"];

function unaryKernel(host: CpuOpHost, op: string, kernel: UnaryKernel, out: Tensor, x: Tensor): void {
  if (!x.isContiguous) {
    host.scope(() => unaryKernel(host, op, kernel, out, dense(host, x, op)));
    return;
  }
  unary(host.ctx, kernel, region(host, x, op), region(host, out, op), x.numel);
}

function swiglu(host: CpuOpHost, out: Tensor, gate: Tensor, up: Tensor): void {
  const op = "swiglu";
  if (!gate.isContiguous || !up.isContiguous) {
    host.scope(() => swiglu(host, out, dense(host, gate, op), dense(host, up, op)));
    return;
  }
  swigluF32(host.ctx, region(host, gate, op), region(host, up, op), region(host, out, op), gate.numel);
}

function scale(host: CpuOpHost, out: Tensor, x: Tensor, s: number): void {
  const op = "scale";
  if (!x.isContiguous) {
    host.scope(() => scale(host, out, dense(host, x, op), s));
    return;
  }
  scaleF32(host.ctx, region(host, x, op), region(host, out, op), x.numel, s);
}

function softmax(host: CpuOpHost, out: Tensor, x: Tensor, dim: number): void {
  const op = "softmax";
  if (!x.isContiguous) {
    host.scope(() => softmax(host, out, dense(host, x, op), dim));
    return;
  }
  let outer = 1;
  for (let i = 0; i < dim; i++) outer *= x.shape[i] as number;
  let inner = 1;
  for (let i = dim + 1; i < x.rank; i++) inner *= x.shape[i] as number;
  softmaxF32(host.ctx, region(host, x, op), region(host, out, op), outer, x.shape[dim] as number, inner);
}

/** a, b: views broadcast to out's shape (the front-end made them). */
function binary(host: CpuOpHost, op: "add" | "sub" | "mul", out: Tensor, a: Tensor, b: Tensor): void {
  binaryF32(
    host.ctx,
    op,
    { region: host.viewRegion(a), strides: a.strides },
    { region: host.viewRegion(b), strides: b.strides },
    region(host, out, op),
    out.shape,
  );
}

/** scale, shift: views broadcast to x's shape. */
function modulate(host: CpuOpHost, out: Tensor, x: Tensor, scaleT: Tensor, shift: Tensor): void {
  modulateF32(
    host.ctx,
    { region: host.viewRegion(x), strides: x.strides },
    { region: host.viewRegion(scaleT), strides: scaleT.strides },
    { region: host.viewRegion(shift), strides: shift.strides },
    region(host, out, "modulate"),
    out.shape,
  );
}

/** The kernel-table entries of the elementwise ops (f32). */
export function elementwiseKernels(
  host: CpuOpHost,
): Pick<
  KernelTable,
  "silu" | "gelu" | "sigmoid" | "swiglu" | "softmax" | "add" | "sub" | "mul" | "scale" | "modulate"
> {
  return {
    silu: { dtypes: F32, run: (out, x) => unaryKernel(host, "silu", "silu", out, x) },
    sigmoid: { dtypes: F32, run: (out, x) => unaryKernel(host, "sigmoid", "sigmoid", out, x) },
    gelu: {
      dtypes: F32,
      run: (out, x, approximate) =>
        unaryKernel(host, "gelu", approximate === "tanh" ? "gelu_tanh" : "gelu_erf", out, x),
    },
    swiglu: { dtypes: F32, run: (out, gate, up) => swiglu(host, out, gate, up) },
    softmax: { dtypes: F32, run: (out, x, dim) => softmax(host, out, x, dim) },
    add: { dtypes: F32, run: (out, a, b) => binary(host, "add", out, a, b) },
    sub: { dtypes: F32, run: (out, a, b) => binary(host, "sub", out, a, b) },
    mul: { dtypes: F32, run: (out, a, b) => binary(host, "mul", out, a, b) },
    scale: { dtypes: F32, run: (out, x, s) => scale(host, out, x, s) },
    modulate: { dtypes: F32, run: (out, x, s, shift) => modulate(host, out, x, s, shift) },
  };
}
