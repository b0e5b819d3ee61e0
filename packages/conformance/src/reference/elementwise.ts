/**
 * References of the elementwise ops, in f64 (rounded to f32 only where the op's result is a single
 * correctly rounded f32 operation, so backends must match exactly).
 *
 * Sources: SiLU — Elfwing et al. 2018; GELU — Hendrycks & Gimpel 2016 (erf form, and the tanh form
 * ½x(1 + tanh(√(2/π)(x + 0.044715x³))) as torch.nn.functional.gelu(approximate="tanh")); SwiGLU —
 * Shazeer 2020; adaLN modulate — Peebles & Xie 2023 (DiT).
 */
import { broadcastIndex, broadcastShape, type HostTensor, numelOf, unravel } from "../host.ts";

/** erf(x) in f64: the everywhere-positive series 2/√π·e^(−x²)·Σ 2ⁿx^(2n+1)/(1·3·…·(2n+1)) (A&S 7.1.6). */
export function erf(x: number): number {
  if (Number.isNaN(x)) return x;
  const ax = Math.abs(x);
  if (ax > 6) return Math.sign(x); // erfc(6) ≈ 2e-17: below half an ulp of 1
  let term = ax;
  let sum = ax;
  for (let n = 1; n < 500; n++) {
    term *= (2 * ax * ax) / (2 * n + 1);
    sum += term;
    if (term < sum * 1e-17) break;
  }
  return Math.sign(x) * ((2 / Math.sqrt(Math.PI)) * Math.exp(-ax * ax) * sum);
}

/** 1 / (1 + e^(−x)) in f64. */
export function sigmoidRef(x: ArrayLike<number>): Float64Array {
  return Float64Array.from(x, (v) => 1 / (1 + Math.exp(-v)));
}

/** x · σ(x) in f64. */
export function siluRef(x: ArrayLike<number>): Float64Array {
  return Float64Array.from(x, (v) => v / (1 + Math.exp(-v)));
}

/** GELU in f64: "none" x·Φ(x) = ½x(1 + erf(x/√2)); "tanh" the tanh approximation. */
export function geluRef(x: ArrayLike<number>, approximate: "none" | "tanh"): Float64Array {
  if (approximate === "tanh") {
    const c = Math.sqrt(2 / Math.PI);
    return Float64Array.from(x, (v) => 0.5 * v * (1 + Math.tanh(c * (v + 0.044715 * v * v * v))));
  }
  return Float64Array.from(x, (v) => 0.5 * v * (1 + erf(v / Math.SQRT2)));
}

/** silu(gate) · up in f64. */
export function swigluRef(gate: ArrayLike<number>, up: ArrayLike<number>): Float64Array {
  return Float64Array.from(gate, (g, i) => (g / (1 + Math.exp(-g))) * (up[i] as number));
}

/** x · f32(s): one f32 rounding of an exact product, so the result is exact. */
export function scaleRef(x: ArrayLike<number>, s: number): Float32Array {
  const sf = Math.fround(s);
  return Float32Array.from(x, (v) => v * sf);
}

/**
 * a ∘ b with NumPy broadcasting, each result one f32 rounding of the exact f64 value (exact for +, −,
 * × of f32 operands, so backends must match bit for bit).
 */
export function binaryRef(op: "add" | "sub" | "mul", a: HostTensor, b: HostTensor): HostTensor<Float32Array> {
  const shape = broadcastShape(a.shape, b.shape);
  const out = new Float32Array(numelOf(shape));
  for (let i = 0; i < out.length; i++) {
    const idx = unravel(i, shape);
    const x = a.data[broadcastIndex(idx, a.shape, shape)] as number;
    const y = b.data[broadcastIndex(idx, b.shape, shape)] as number;
    out[i] = op === "add" ? x + y : op === "sub" ? x - y : x * y;
  }
  return { shape, data: out };
}

/** x · (1 + scale) + shift in f64, scale and shift broadcast to x's shape. */
export function modulateRef(x: HostTensor, scale: HostTensor, shift: HostTensor): Float64Array {
  const out = new Float64Array(numelOf(x.shape));
  for (let i = 0; i < out.length; i++) {
    const idx = unravel(i, x.shape);
    const s = scale.data[broadcastIndex(idx, scale.shape, x.shape)] as number;
    const h = shift.data[broadcastIndex(idx, shift.shape, x.shape)] as number;
    out[i] = (x.data[i] as number) * (1 + s) + h;
  }
  return out;
}

/** Softmax along `dim` in f64 (max-subtracted; a row of −inf gives NaN, as torch). */
export function softmaxRef(x: HostTensor, dim: number): Float64Array {
  const d = dim < 0 ? dim + x.shape.length : dim;
  const size = x.shape[d] as number;
  const inner = numelOf(x.shape.slice(d + 1));
  const outer = numelOf(x.shape.slice(0, d));
  const out = new Float64Array(numelOf(x.shape));
  for (let o = 0; o < outer; o++)
    for (let c = 0; c < inner; c++) {
      const at = (i: number) => (o * size + i) * inner + c;
      let m = Number.NEGATIVE_INFINITY;
      for (let i = 0; i < size; i++) m = Math.max(m, x.data[at(i)] as number);
      let s = 0;
      for (let i = 0; i < size; i++) s += Math.exp((x.data[at(i)] as number) - m);
      for (let i = 0; i < size; i++) out[at(i)] = Math.exp((x.data[at(i)] as number) - m) / s;
    }
  return out;
}
